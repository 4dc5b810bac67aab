//! The run driver: records the experiment definition when a run starts (so a
//! run resumes without the file), builds the backends, and runs the cycles.
//! The same code records, resumes, runs forks and replay-checks: the replay
//! layer decides what is served from the ledger and what runs live.

use std::sync::Arc;

use ledger::Ledger;
use replay::{Mode, Session, SourceRun, MAIN};
use schemas::RunStarted;

use crate::backend::sim::{SimBackend, SimParams};
use crate::backend::Backends;
use crate::config::{Backend as BackendCfg, Experiment};
use crate::cycle::{apply_forks, base_models, run_cycle, step, Ctx, CycleResult, Progress};
use crate::error::{EngineError, Result};
use crate::task::load_suite;

/// The driver's name and version, recorded in `run.started`.
pub const DRIVER: &str = "mass-engine/1";

/// What to run.
pub struct RunRequest<'a> {
    /// The run's name (its main stream's ref).
    pub run: String,
    /// Experiment file text and the path it was read from (relative paths in it
    /// resolve against that path's directory). Needed only for a new run.
    pub experiment: Option<(String, String)>,
    pub mode: Mode,
    /// Mixed mode: take effect results from this run, except the live kinds.
    pub source: Option<SourceRun>,
    pub progress: &'a dyn Progress,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub run: String,
    pub experiment: String,
    pub cycles: Vec<CycleResult>,
    pub head: Option<ledger::Id>,
    pub counts: std::collections::BTreeMap<(String, replay::Served), u64>,
}

/// Records, resumes, continues a fork of, or checks a run.
pub fn drive(ledger: Arc<Ledger>, req: RunRequest<'_>) -> Result<RunSummary> {
    let mut session = Session::new(ledger.clone(), req.run.clone(), req.mode.clone())?;
    if let Some(src) = req.source.clone() {
        session = session.with_source(src);
    }
    let mut main = session.stream(MAIN)?;
    let (text, origin) = match main.peek_history() {
        Some(first) => {
            if first.kind != "run.started" {
                return Err(EngineError::Invalid(format!(
                    "{} is not a run: its first event is a {}",
                    req.run, first.kind
                )));
            }
            let rs: RunStarted = schemas::decode_event(first)?;
            if rs.driver != DRIVER {
                return Err(EngineError::Invalid(format!(
                    "run {} was recorded by driver {}; this build is {DRIVER}",
                    req.run, rs.driver
                )));
            }
            let text = String::from_utf8(ledger.get_blob(&ledger::Id(rs.config.0))?)
                .map_err(|e| EngineError::recording("experiment definition", e))?;
            (text, rs.config_name)
        }
        None => req.experiment.clone().ok_or_else(|| {
            EngineError::Invalid(format!(
                "run {} does not exist yet: give the experiment file to start it",
                req.run
            ))
        })?,
    };
    let mut exp = Experiment::parse(&text, &origin)?;
    let config = ledger.put_blob(text.as_bytes())?;
    let started = RunStarted {
        driver: DRIVER.into(),
        config: config.into(),
        config_name: origin.clone(),
        seed: exp.seed,
    };
    main.emit(schemas::to_event(&started)?)?;
    session.set_seed(exp.seed);
    apply_forks(&mut main, &mut exp)?;

    let mut summary = RunSummary {
        run: req.run.clone(),
        experiment: exp.name.clone(),
        cycles: Vec::new(),
        head: None,
        counts: Default::default(),
    };
    let backends = build_backends(&exp)?;
    let suite = load_suite(&exp.tasks_path)?;
    let sel = exp.select_tasks(&suite)?;
    for t in &sel.train {
        if sel.heldout.iter().any(|h| h.id == t.id) {
            return Err(EngineError::Invalid(format!(
                "task {} is both train and held out",
                t.id
            )));
        }
    }
    let mut models = {
        let ctx = Ctx {
            session: &session,
            exp: &exp,
            backends: &backends,
            train: &sel.train,
            heldout: &sel.heldout,
            progress: req.progress,
        };
        base_models(&ctx)?
    };
    let cycles = exp.cycles;
    for cycle in 1..=cycles {
        apply_forks(&mut main, &mut exp)?;
        let snapshot = exp.clone();
        let ctx = Ctx {
            session: &session,
            exp: &snapshot,
            backends: &backends,
            train: &sel.train,
            heldout: &sel.heldout,
            progress: req.progress,
        };
        let (result, next) = run_cycle(&ctx, &mut main, &mut exp, cycle, &models)?;
        summary.cycles.push(result);
        models = next;
    }
    step(
        &mut main,
        &mut exp,
        schemas::to_event(&schemas::Note {
            text: format!("run finished after {cycles} cycle(s)"),
        })?,
    )?;
    summary.head = main.head();
    summary.counts = session.counts();
    Ok(summary)
}

/// Builds every backend the experiment defines.
pub fn build_backends(exp: &Experiment) -> Result<Backends> {
    let mut b = Backends::default();
    for (name, cfg) in &exp.backends {
        match cfg {
            BackendCfg::Sim(p) => {
                let params = SimParams::new(p.skill, p.delegation, p.judge_noise, p.position_bias, p.blind_spot);
                b.by_name.insert(name.clone(), Arc::new(SimBackend::new(name, params, &exp.tasks_path)?));
            }
            BackendCfg::OpenAi(_) => {
                return Err(EngineError::Invalid(format!(
                    "backend {name}: the OpenAI-compatible HTTP backend is not built into this version yet; use kind = \"sim\""
                )))
            }
        }
    }
    Ok(b)
}
