//! The run driver: records what a run depends on when it starts — the
//! experiment definition and the task suite, by content (`suite.rs`) — so every
//! later session reads them from the ledger, never from the working directory;
//! builds the backends; and runs the cycles. The same code records, resumes,
//! runs forks and replay-checks: the replay layer decides what is served from
//! the ledger and what runs live.

use std::path::Path;
use std::sync::Arc;

use ledger::{Event, Id, Ledger};
use replay::{Mode, Session, SourceRun, MAIN};
use schemas::{Record, RunStarted};

use crate::backend::Backends;
use crate::config::{Experiment, Method};
use crate::context::{
    apply_forks, base_models, reassign_roles, step, sync_backends, Ctx, Progress,
};
use crate::cycle::{run_cycle, CycleResult};
use crate::error::{EngineError, Result};
use crate::suite;
use crate::task::load_suite;

/// The driver's name and version, recorded in `run.started`. Version 2 reads a
/// run's tasks from the ledger (version 1 read them from disk); version 3
/// runs the checks outside the workspace (the `run_checks` tool) and records
/// the tamper guards' findings (`mass.guard`) before every rollout, so a
/// version-2 run would not replay under it. Version 4 evaluates against the
/// previous cycle's model and on training tasks too, with the self-judge as
/// well as the external ones (`mass.evaluation` v2, `mass.cycle` v2).
/// Version 5 records each dataset line's provenance (`mass.dataset` v2).
/// Version 7 isolates rollouts from each other and records it, with every
/// limit in force (the sandbox note: niceness, workspace snapshot limits),
/// and runs external harnesses in a network namespace of their own.
/// Version 8 records the experiment's definition (`Experiment::
/// definition_toml`) in `run.started` and the file as given on the run's
/// `execution` stream (`run.execution`); it also drives version-7 runs,
/// whose `run.started` holds the file as given and which have no
/// `execution` stream. Version 9 follows MASS as the articles describe it
/// (`config::Method`). Version 10 records the base model's validation
/// loss (`mass.training` v3); it drives version-9 runs, writing v2 for them.
pub const DRIVER: &str = "mass-engine/10";

/// The drivers whose runs this build drives: the current one, and the
/// previous one, which differs only in where the experiment is recorded.
const DRIVES: [&str; 4] = [DRIVER, "mass-engine/9", "mass-engine/8", "mass-engine/7"];
/// The last driver without an execution stream.
const NO_EXECUTION: &str = "mass-engine/7";

/// What to run.
pub struct RunRequest<'a> {
    /// The run's name (its main stream's ref).
    pub run: String,
    /// Experiment file text and the path it was read from (a relative
    /// `tasks_dir` resolves against that path's directory; the path itself is
    /// not recorded). Needed only for a new run.
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
    /// Every stream the driver opened: (recorded events it went past,
    /// recorded events it had). See `replay::Session::visited`.
    pub visited: std::collections::BTreeMap<String, (u64, u64)>,
}

/// A run's start: the experiment text, its blob and the task suite's tree.
struct Start {
    /// The experiment as given (what the run executes).
    text: String,
    /// The blob `run.started` names: the definition (version 8 and later), or the
    /// file as given (version 7).
    config: Id,
    tasks: Id,
    /// The `run.execution` blob (the file as given), version 8 and later.
    execution: Option<Id>,
    /// The driver that recorded the run (this one for a new run).
    driver: String,
}

/// Checks that `first`, the first event of run `run`, starts a run this build
/// can drive; runs recorded by another driver are refused (they may mean
/// other things). Callers that fork a run check this first, so no fork of a
/// run that cannot continue is created.
/// The mixed-mode source a re-judge recorded on its main stream (`run.mixed`):
/// pinned by its streams' heads (v2), which must still be in the ledger; a
/// source recorded by name alone (v1) must still have its main ref. A source
/// that is gone is `NotFound`, never a silent live run.
pub fn recorded_source(ledger: &ledger::Ledger, run: &str) -> Result<Option<replay::SourceRun>> {
    let Some(head) = ledger.head(run)? else {
        return Ok(None);
    };
    for ev in ledger.chain(head) {
        let ev = ev?;
        let Some(m) = schemas::RunMixed::read(&ev) else {
            continue;
        };
        let m = m?;
        let gone = |why: String| {
            EngineError::NotFound(format!(
                "run {run} re-judges run {}, whose records {why}: nothing was run. Re-judge a run that exists (`mass rejudge SOURCE --judge ...`), or fork this one (`mass fork {run} ...`) to go on without a source",
                m.source_run
            ))
        };
        let heads = if m.heads.is_empty() {
            if ledger.head(&m.source_run)?.is_none() {
                return Err(gone(
                    "this re-judge named by ref alone (an older build), and that ref is gone"
                        .into(),
                ));
            }
            None
        } else {
            let mut map = std::collections::BTreeMap::new();
            for h in &m.heads {
                let id = ledger::Id(h.head.0);
                if !ledger.contains(&id)? {
                    return Err(gone(format!(
                        "are not in this ledger (stream {} at {})",
                        h.stream,
                        id.short(12)
                    )));
                }
                map.insert(h.stream.clone(), id);
            }
            Some(map)
        };
        return Ok(Some(replay::SourceRun {
            run: m.source_run.clone(),
            live_kinds: m.live_kinds.into_iter().collect(),
            heads,
        }));
    }
    Ok(None)
}

/// Checks fork overrides against the run's recorded experiment exactly as
/// the driver will apply them (same keys, types, ranges and messages as the
/// TOML), so a bad override is refused before anything is written instead of
/// failing at resume. `first` is the run's `run.started` event.
pub fn check_overrides(
    ledger: &ledger::Ledger,
    run: &str,
    first: &Event,
    overrides: &[(String, String)],
) -> Result<()> {
    let mut exp = recorded_experiment(ledger, run, first)?;
    for (k, _) in overrides {
        crate::context::check_fork_override(k)?;
    }
    exp.apply_override_set(overrides)?;
    Ok(())
}

/// The experiment run `run` recorded when it started (`first`: its
/// `run.started`), as given then (execution settings included), before any
/// fork's overrides.
pub fn recorded_experiment(ledger: &Ledger, run: &str, first: &Event) -> Result<Experiment> {
    let start = recorded_start(ledger, run, first)?;
    Ok(Experiment::parse(&start.text, "the recorded experiment")?)
}

/// The experiment run `run` executes: its file as given, execution
/// settings included (its `run.execution` record; the definition for runs
/// that have none).
pub fn recorded_execution(ledger: &Ledger, run: &str, first: &Event) -> Result<Experiment> {
    let start = recorded_start(ledger, run, first)?;
    Ok(Experiment::parse(&start.text, "the recorded experiment")?)
}

/// The overrides that hand judging to `judge`: the name of a backend the
/// experiment defines, or a TOML file defining one (`[backends.NAME]`), which
/// is added to the run by value. A file may not redefine a backend the
/// experiment already has under that name (other roles may play it).
pub fn judge_overrides(
    ledger: &Ledger,
    run: &str,
    first: &Event,
    judge: &str,
) -> Result<Vec<(String, String)>> {
    let path = Path::new(judge);
    if !(judge.ends_with(".toml") || path.is_file()) {
        return Ok(vec![("roles.judge".into(), judge.to_string())]);
    }
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::Io {
        context: format!("cannot read judge file {judge}"),
        source: e,
    })?;
    let (name, add) = crate::config::backend_override(&text, judge)?;
    let exp = recorded_experiment(ledger, run, first)?;
    if let Some(existing) = exp.backends.get(&name) {
        let mut with = exp.clone();
        with.apply_override(&add.0, &add.1)?;
        if with.backends.get(&name) != Some(existing) {
            return Err(EngineError::Invalid(format!(
                "{judge} defines backend {name}, which the run's experiment already defines differently \
                 (other roles may play it); give the judge's backend another name"
            )));
        }
    }
    Ok(vec![add, ("roles.judge".into(), name)])
}

pub fn check_run_start(run: &str, first: &Event) -> Result<()> {
    if first.kind != RunStarted::KIND {
        return Err(EngineError::Invalid(format!(
            "{run} is not a run: its first event is a {}",
            first.kind
        )));
    }
    if first.version != RunStarted::VERSION {
        return Err(EngineError::Invalid(format!(
            "run {run} was recorded by an older mass (run.started v{}), which did not record its tasks and read them from disk; \
             this build ({DRIVER}) replays, resumes, re-judges and forks only runs that carry their tasks (run.started v{}). \
             Use the build that recorded it, or start the experiment again as a new run (`mass run FILE --ref NEW`)",
            first.version,
            RunStarted::VERSION
        )));
    }
    let rs: RunStarted = schemas::decode_event(first)?;
    if rs
        .driver
        .starts_with(crate::rejudge_imported::IMPORT_DRIVER_PREFIX)
    {
        return Err(EngineError::Invalid(format!(
            "run {run} starts as a run imported from a run folder of the reference implementation ({}): \
             it can be read (why, report, diff, export), and the imported run's cycle re-judged \
             (`mass rejudge IMPORTED --cycle C --judge FILE`; the same command again continues an \
             interrupted re-judge), but it cannot be resumed, replayed or forked: no engine made its \
             requests, so no prefix of it can be replayed, and it holds no task suite and no experiment \
             definition this engine can drive",
            rs.driver
        )));
    }
    if !DRIVES.contains(&rs.driver.as_str()) {
        return Err(EngineError::Invalid(format!(
            "run {run} was recorded by driver {}; this build is {DRIVER} (and drives {})",
            rs.driver,
            DRIVES.join(", ")
        )));
    }
    Ok(())
}

/// The head of run `run` if the run never got past its start: its main
/// stream is a lone `run.started` (nothing after it) and it has no other
/// stream but its `execution`. That is what a start that failed after recording the definition
/// leaves (an unsupported backend, say); such a run holds no work, so
/// `mass run` may replace it with a corrected file. `None` for a run that did
/// start (it resumes), a fork, or a name that is not a run.
pub fn start_failed(ledger: &Ledger, run: &str) -> Result<Option<Id>> {
    // How it was to be executed is not work.
    let execution = replay::ref_name(run, replay::EXECUTION);
    let refs: Vec<_> = replay::run_refs(ledger, run)?
        .into_iter()
        .filter(|(name, _)| *name != execution)
        .collect();
    let [(name, head)] = refs.as_slice() else {
        return Ok(None);
    };
    if name != run {
        return Ok(None);
    }
    let ev = ledger.get_event(head)?;
    let lone_start = ev.kind == RunStarted::KIND && ev.stream == MAIN && ev.prev.is_none();
    Ok(lone_start.then_some(*head))
}

/// Reads a run's recorded start (see [`check_run_start`]): for version 8,
/// the definition from `run.started` and the file as given from the run's
/// `execution` stream, which must define the same experiment.
fn recorded_start(ledger: &Ledger, run: &str, first: &Event) -> Result<Start> {
    check_run_start(run, first)?;
    let rs: RunStarted = schemas::decode_event(first)?;
    let config = Id(rs.config.0);
    let blob_text = |id: &Id, what: &str| -> Result<String> {
        String::from_utf8(ledger.get_blob(id)?).map_err(|e| EngineError::recording(what, e))
    };
    let text = blob_text(&config, "experiment definition")?;
    let start = |text, execution| Start {
        text,
        config,
        tasks: Id(rs.tasks.0),
        execution,
        driver: rs.driver.clone(),
    };
    if rs.driver == NO_EXECUTION {
        return Ok(start(text, None));
    }
    let head = ledger
        .head(&replay::ref_name(run, replay::EXECUTION))?
        .ok_or_else(|| {
            EngineError::Invalid(format!(
                "run {run} has no execution stream ({run}/{}), which records how it is executed (its experiment file as given);                  a start cut short before writing it leaves that: `mass run FILE --ref {run}` replaces a run that never started,                  and a run that did start cannot go on without it",
                replay::EXECUTION
            ))
        })?;
    let ev = ledger.get_event(&head)?;
    if ev.kind != schemas::RunExecution::KIND || ev.parents != [first.id] || ev.prev.is_some() {
        return Err(EngineError::recording(
            "run execution",
            format!(
                "the head of {run}/{} ({}) is not the run.execution event written with this run's run.started",
                replay::EXECUTION,
                head.short(12)
            ),
        ));
    }
    let x: schemas::RunExecution = schemas::decode_event(&ev)?;
    let given = blob_text(&Id(x.config.0), "experiment as given")?;
    let label = format!("experiment recorded by run {run}");
    if Experiment::parse(&given, &label)?.definition_toml() != text {
        return Err(EngineError::recording(
            "run execution",
            format!("the execution settings of run {run} ({}) define another experiment than its run.started", head.short(12)),
        ));
    }
    Ok(start(given, Some(Id(x.config.0))))
}

/// The run's start: read from its recorded `run.started` (`first`), or,
/// for a new live run, made from the experiment file (checked on disk,
/// stored, not yet emitted).
fn read_or_make_start(
    ledger: &Ledger,
    req: &RunRequest<'_>,
    first: Option<&Event>,
) -> Result<(Start, Experiment)> {
    Ok(match first {
        Some(first) => {
            let start = recorded_start(ledger, &req.run, first)?;
            let label = format!("experiment recorded by run {}", req.run);
            let exp = Experiment::parse(&start.text, &label)?;
            (start, exp)
        }
        None => {
            let (text, origin) = req.experiment.as_ref().ok_or_else(|| {
                EngineError::Invalid(format!(
                    "run {} does not exist yet: give the experiment file to start it",
                    req.run
                ))
            })?;
            let exp = Experiment::parse(text, origin)?;
            // Only a live session may store anything.
            if req.mode != Mode::Live {
                return Err(EngineError::Invalid(format!(
                    "run {} has no recording to check",
                    req.run
                )));
            }
            // Checked on disk before anything is stored, so a broken task or
            // a misspelt task id is reported against the files the user gave.
            let on_disk = load_suite(&exp.tasks_path)?;
            exp.select_tasks(&on_disk)?;
            // A sandbox level this machine cannot provide refuses the run
            // before anything is written.
            sandbox::probe().check(exp.sandbox.level)?;
            let start = Start {
                tasks: suite::record(ledger, &on_disk)?,
                config: ledger.put_blob(exp.definition_toml().as_bytes())?,
                text: text.clone(),
                execution: Some(ledger.put_blob(text.as_bytes())?),
                driver: DRIVER.into(),
            };
            (start, exp)
        }
    })
}

/// Emits `run.started` (in its version's meaning) and, from version 8, the
/// run's `run.execution` beside it.
fn emit_start(
    session: &Session,
    main: &mut replay::Stream,
    start: &Start,
    seed: u64,
) -> Result<()> {
    let started = RunStarted {
        driver: start.driver.clone(),
        config: start.config.into(),
        tasks: start.tasks.into(),
        seed,
    };
    let started_id = main.emit(schemas::to_event(&started)?)?;
    if let Some(x) = start.execution {
        // Beside the steps, never before them: no step depends on it.
        let rec = schemas::RunExecution { config: x.into() };
        session
            .stream(replay::EXECUTION)?
            .emit(schemas::to_event(&rec)?.with_parents(vec![started_id]))?;
    }
    Ok(())
}

/// Records, resumes, continues a fork of, or checks a run.
pub fn drive(ledger: Arc<Ledger>, req: RunRequest<'_>) -> Result<RunSummary> {
    drive_with(ledger, req, None)
}

/// [`drive`], with the stages' work items run by the executor `make`
/// builds (live sessions only; a replay check always runs in process,
/// where every item is served from the ledger).
pub fn drive_with(
    ledger: Arc<Ledger>,
    req: RunRequest<'_>,
    make: Option<&dyn crate::work::MakeExecutor>,
) -> Result<RunSummary> {
    // Workspaces of a mass that died mid-run are never picked up again.
    if req.mode == Mode::Live {
        crate::harness::clean_stale_scratch();
    }
    let session = open_session(&ledger, &req)?;
    let mut main = session.stream(MAIN)?;
    let (start, mut exp) = read_or_make_start(&ledger, &req, main.peek_history())?;
    // A `mass-engine/7` run named its backends as written.
    exp.backends_as_written = start.execution.is_none();
    exp.method = Method::of_driver(&start.driver).unwrap_or_default();
    emit_start(&session, &mut main, &start, exp.seed)?;
    session.set_seed(exp.seed);

    // Every session works on its own checkout of the recorded suite (kept
    // until this function returns): the tasks as they were when the run
    // started, wherever and whenever it is resumed.
    let checkout = suite::checkout(&ledger, start.tasks, &req.run)?;
    exp.tasks_path = checkout.path().to_path_buf();
    apply_forks(&mut main, &mut exp)?;
    // Live work runs commands: the confinement the experiment asks for must
    // be available here, or nothing runs (a replay check runs no command).
    if req.mode == Mode::Live {
        sandbox::probe().check(exp.sandbox.level)?;
    }
    let backends = build_backends(&exp, checkout.path())?;
    let sel = selected_tasks(&exp, checkout.path())?;
    // The level in force (after a fork at the start changed it), on the
    // record, so an audit shows it. Recorded once the run could start: a
    // start that failed before this leaves a lone `run.started`, which a
    // corrected `mass run` may replace.
    main.emit(schemas::to_event(&schemas::Note {
        text: sandbox_note(&exp.sandbox),
    })?)?;
    // Where the stages' work items run: this process, or what `make` builds.
    let tasks: Vec<crate::task::Task> = sel.train.iter().chain(&sel.heldout).cloned().collect();
    let executor: Arc<dyn crate::work::Executor> = match make {
        Some(m) if req.mode == Mode::Live => m.make(crate::work::ExecutorParts {
            session: session.clone(),
            backends: backends.clone(),
            tasks,
            suite: start.tasks,
        })?,
        _ => Arc::new(crate::work::InProcess::new(
            session.clone(),
            backends.clone(),
            tasks,
        )),
    };
    let run = Cycles {
        session: &session,
        backends: &backends,
        train: &sel.train,
        heldout: &sel.heldout,
        progress: req.progress,
        executor: &executor,
    };
    // The name as the run started under it (a fork may rename it later).
    let experiment = exp.name.clone();
    let cycles = run.all(&mut main, &mut exp)?;
    let (head, counts) = (main.head(), session.counts());
    main.note_visit();
    Ok(RunSummary {
        run: req.run.clone(),
        experiment,
        cycles,
        head,
        counts,
        visited: session.visited(),
    })
}

/// The run's session; a re-judge records its mixed mode, so resuming it (or
/// checking it) takes results from the same source as the uninterrupted run
/// did.
fn open_session(ledger: &Arc<Ledger>, req: &RunRequest<'_>) -> Result<Session> {
    let session = Session::new(ledger.clone(), req.run.clone(), req.mode.clone())?;
    let source = match req.source.clone() {
        Some(s) => Some(s),
        None => recorded_source(ledger, &req.run)?,
    };
    Ok(match source {
        Some(src) => session.with_source(src),
        None => session,
    })
}

/// The experiment's training and held-out tasks from the checked-out suite.
fn selected_tasks(exp: &Experiment, tasks: &Path) -> Result<crate::config::TaskSelection> {
    let suite = load_suite(tasks)?;
    let sel = exp.select_tasks(&suite)?;
    for t in &sel.train {
        if sel.heldout.iter().any(|h| h.id == t.id) {
            return Err(EngineError::Invalid(format!(
                "task {} is both train and held out",
                t.id
            )));
        }
    }
    Ok(sel)
}

/// What every cycle of a run is given.
struct Cycles<'a> {
    session: &'a Session,
    backends: &'a Backends,
    train: &'a [crate::task::Task],
    heldout: &'a [crate::task::Task],
    progress: &'a dyn Progress,
    executor: &'a Arc<dyn crate::work::Executor>,
}

impl Cycles<'_> {
    fn ctx<'e>(&'e self, exp: &'e Experiment) -> Ctx<'e> {
        Ctx {
            session: self.session,
            exp,
            backends: self.backends,
            train: self.train,
            heldout: self.heldout,
            progress: self.progress,
            executor: self.executor,
        }
    }

    /// Runs the cycles. `cycles` is read again after every fork point, so a
    /// fork can extend a run (`--set cycles=N+1`), also one taken at a
    /// finished run's head: the fork's overrides are applied after the
    /// "finished" step and the cycles go on from there.
    fn all(&self, main: &mut replay::Stream, exp: &mut Experiment) -> Result<Vec<CycleResult>> {
        let mut models = base_models(&self.ctx(exp))?;
        let mut roles = exp.roles.clone();
        let mut cycle = 1;
        let mut results = Vec::new();
        // Evaluation runs, reused by later cycles (rebuilt by the replay of
        // earlier cycles when a run resumes or forks).
        let mut eval_runs = crate::stages::evaluate::EvalRuns::default();
        loop {
            apply_forks(main, exp)?;
            // A fork that changed or added a backend takes effect from here.
            sync_backends(self.backends, exp, &mut models)?;
            // A fork that hands a role to another backend
            // (`roles.judge=external`) gives that role the new backend's
            // base model from here on.
            if exp.roles != roles {
                reassign_roles(self.backends, &roles, &exp.roles, &mut models)?;
                roles = exp.roles.clone();
            }
            if cycle <= exp.cycles {
                let snapshot = exp.clone();
                let (result, next, played) = run_cycle(
                    &self.ctx(&snapshot),
                    main,
                    exp,
                    cycle,
                    &models,
                    &mut eval_runs,
                )?;
                results.push(result);
                models = next;
                // The roles `models` play: a fork inside the cycle may have
                // moved one, and the cycle's stages followed it.
                roles = played;
                cycle += 1;
                continue;
            }
            step(
                main,
                exp,
                schemas::to_event(&schemas::Note {
                    text: format!("run finished after {} cycle(s)", cycle - 1),
                })?,
            )?;
            apply_forks(main, exp)?;
            if cycle > exp.cycles {
                return Ok(results);
            }
        }
    }
}

/// Builds every backend the experiment defines; simulated models know the
/// tasks under `tasks` (the run's checkout of its recorded suite). A backend
/// this build cannot drive is a problem with the experiment file.
pub fn build_backends(exp: &Experiment, tasks: &Path) -> Result<Backends> {
    Backends::build(&exp.backends, tasks).map_err(|e| EngineError::Invalid(e.to_string()))
}

/// The main-stream note that records how the run's commands are confined:
/// the level, every limit in force, and what the level isolates.
fn sandbox_note(s: &crate::config::SandboxConfig) -> String {
    let l = &s.limits;
    let isolation = match s.level {
        sandbox::Level::Full => "each command sees no workspace, home or check copy but its own rollout's; an external harness reaches only its own proxy route (with a token of its rollout); network only for tasks that declare it",
        sandbox::Level::Landlock => "rollouts are not isolated from each other at this level; network only for tasks that declare it (external harnesses run on the host network, their proxy routes behind a token of their rollout)",
        sandbox::Level::None => "no confinement: limits only",
    };
    format!(
        "sandbox: level {}; per command: {} s CPU, {} MiB address space, {} processes, {} MiB per file, {} open files, niceness {}; per workspace snapshot: {} entries, {} MiB; {isolation}",
        s.level.as_str(),
        l.cpu_secs,
        l.address_space_mb,
        l.processes,
        l.file_size_mb,
        l.open_files,
        l.nice,
        s.workspace_entries,
        s.workspace_mb,
    )
}
