//! What a cycle's stages share: the context they run in ([`Ctx`]: the
//! session, the experiment as the cycle began, the backends, the tasks and a
//! progress sink), the models playing each role ([`Models`]), the settings
//! and models as they stand after a fork ([`Now`]), and the main stream's
//! steps, after each of which a fork's overrides apply ([`step`]). It sits
//! below the driver, the cycle and the stages, so none of them needs another
//! to reach these.

use ledger::Id;
use replay::{EffectOutput, EffectRequest, Session, Stream};
use schemas::Note;

use crate::backend::Backends;
use crate::config::Experiment;
use crate::error::{EngineError, Result};
use crate::task::{Split, Task};
use crate::work::{Executor, JudgeSpec, Role, TeamSpec};

/// Progress reporting, implemented by the CLI (progress bars) or ignored.
pub trait Progress: Send + Sync {
    fn stage(&self, _name: &str, _total: u64) {}
    fn tick(&self, _name: &str) {}
    fn done(&self, _name: &str) {}
}

pub struct NoProgress;
impl Progress for NoProgress {}

/// Model names per role for one cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Models {
    pub orchestrator: String,
    pub subagent: String,
    pub judge: String,
    pub optimizer: String,
}

/// Everything a cycle needs.
pub struct Ctx<'a> {
    pub session: &'a Session,
    pub exp: &'a Experiment,
    pub backends: &'a Backends,
    pub train: &'a [Task],
    pub heldout: &'a [Task],
    pub progress: &'a dyn Progress,
    /// Where the stages' work items run.
    pub executor: &'a std::sync::Arc<dyn Executor>,
}

/// The cycle's settings and models as they stand now. A fork taken at any
/// main-stream step of the cycle applies its overrides right after that
/// step (`step`), so every stage reads the experiment afresh: `exp` as it
/// stands, with the models the cycle started with (`m`, played by the roles
/// of `ctx.exp`, the experiment at the cycle's start) carried over where a
/// role kept its backend, rebuilt where the fork changed that backend, and
/// the new backend's base model where it handed the role to another one.
pub(crate) struct Now {
    pub exp: Experiment,
    pub models: Models,
}

impl Now {
    pub(crate) fn of(ctx: &Ctx<'_>, exp: &Experiment, m: &Models) -> Result<Now> {
        let mut models = m.clone();
        sync_backends(ctx.backends, exp, &mut models)?;
        reassign_roles(ctx.backends, &ctx.exp.roles, &exp.roles, &mut models)?;
        Ok(Now {
            exp: exp.clone(),
            models,
        })
    }
}

impl<'a> Ctx<'a> {
    /// This context reading `exp` instead: the experiment as it stands at a
    /// later step of the cycle (see [`Now`]).
    pub(crate) fn at<'b>(&self, exp: &'b Experiment) -> Ctx<'b>
    where
        'a: 'b,
    {
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
}

impl Ctx<'_> {
    pub(crate) fn threads(&self) -> usize {
        self.exp.concurrency.max(1) as usize
    }

    /// The team of models `m` under the experiment's roles, sampling and
    /// rules, as rollout items name it.
    pub(crate) fn team_spec(&self, m: &Models) -> TeamSpec {
        let r = &self.exp.roles;
        TeamSpec {
            orchestrator: Role {
                backend: r.orchestrator.clone(),
                model: m.orchestrator.clone(),
            },
            subagent: Role {
                backend: r.subagent_backend().to_string(),
                model: m.subagent.clone(),
            },
            sampling: self.exp.sampling.team.clone(),
            rules: crate::harness::RunRules::of(self.exp),
            seed: self.session.seed(),
        }
    }

    /// A judge as judgment items name it.
    pub(crate) fn judge_spec(
        &self,
        backend: &str,
        model: &str,
        retries: u32,
        sampling: &crate::config::SamplingConfig,
    ) -> JudgeSpec {
        JudgeSpec {
            judge: Role {
                backend: backend.to_string(),
                model: model.to_string(),
            },
            max_retries: retries,
            sampling: sampling.clone(),
            seed: self.session.seed(),
            shown: crate::judge::Shown::of(self.exp),
        }
    }

    /// Held-out tasks never reach training data, validation or checkpoint
    /// selection: every path that feeds those calls this first.
    pub(crate) fn assert_trainable(&self, task: &Task, what: &str) -> Result<()> {
        if task.split == Split::Heldout || self.heldout.iter().any(|h| h.id == task.id) {
            return Err(EngineError::Invalid(format!(
                "held-out task {} must never reach {what}",
                task.id
            )));
        }
        Ok(())
    }
}

pub(crate) fn note(text: String) -> Result<ledger::NewEvent> {
    Ok(schemas::to_event(&Note { text })?)
}

/// Emits a step on the main stream, applying the fork overrides recorded
/// before and right after it.
pub fn step(main: &mut Stream, exp: &mut Experiment, ev: ledger::NewEvent) -> Result<Id> {
    apply_forks(main, exp)?;
    let id = main.emit(ev)?;
    // A fork taken at this step applies from right after it, before the
    // work that follows (e.g. the judging after a collection step).
    apply_forks(main, exp)?;
    Ok(id)
}

/// Consumes `run.forked` events at the cursor and applies their overrides.
pub fn apply_forks(main: &mut Stream, exp: &mut Experiment) -> Result<()> {
    // A re-judge's mixed-mode record follows its fork event; the session was
    // set up from it before the run began (see `driver::recorded_source`).
    while main.take_recorded("run.mixed").is_some() {}
    while let Some(f) = main.take_recorded("run.forked") {
        let rf: schemas::RunForked = schemas::decode_event(&f)?;
        // A key a fork recorded twice (older builds allowed it) keeps the
        // value given last, as it did then.
        let mut set: Vec<(String, String)> = Vec::new();
        for o in &rf.overrides {
            set.retain(|(k, _)| k.trim() != o.key.trim());
            set.push((o.key.clone(), o.value.clone()));
        }
        for (k, _) in &set {
            check_fork_override(k)?;
        }
        // One set, validated once: the order they were given in does not
        // matter.
        exp.apply_override_set(&set)?;
        // Seeds derive from the root seed: from here on, the new one.
        if set.iter().any(|(k, _)| k.trim() == "seed") {
            main.session().set_seed(exp.seed);
        }
        while main.take_recorded("run.mixed").is_some() {}
    }
    Ok(())
}

/// Refuses overrides a fork cannot honour. `tasks_dir`: a run's tasks are
/// recorded when it starts and every fork shares them (a fork may still pick
/// other recorded tasks with `train`/`heldout`); reading a folder from disk
/// instead would make the fork depend on the working directory again.
pub fn check_fork_override(key: &str) -> Result<()> {
    if key.trim() == "tasks_dir" {
        return Err(EngineError::Invalid(
            "tasks_dir cannot be overridden in a fork: a run's tasks are recorded when it starts and its forks use that recording; to run other tasks, start a new run with `mass run FILE --ref NEW`".into(),
        ));
    }
    Ok(())
}

/// The base model of each role.
pub fn base_models(ctx: &Ctx<'_>) -> Result<Models> {
    let r = &ctx.exp.roles;
    Ok(Models {
        orchestrator: ctx.backends.get(&r.orchestrator)?.base_model(),
        subagent: ctx.backends.get(r.subagent_backend())?.base_model(),
        judge: ctx.backends.get(&r.judge)?.base_model(),
        optimizer: ctx.backends.get(&r.optimizer)?.base_model(),
    })
}

/// Gives each role whose backend changed the new backend's base model.
pub(crate) fn reassign_roles(
    backends: &Backends,
    old: &crate::config::Roles,
    new: &crate::config::Roles,
    models: &mut Models,
) -> Result<()> {
    if old.orchestrator != new.orchestrator {
        models.orchestrator = backends.get(&new.orchestrator)?.base_model();
    }
    if old.subagent_backend() != new.subagent_backend() {
        models.subagent = backends.get(new.subagent_backend())?.base_model();
    }
    if old.judge != new.judge {
        models.judge = backends.get(&new.judge)?.base_model();
    }
    if old.optimizer != new.optimizer {
        models.optimizer = backends.get(&new.optimizer)?.base_model();
    }
    Ok(())
}

/// Rebuilds the backends a fork changed or added (see `Backends::sync`); a
/// role that played a rebuilt backend's base model plays its new base model.
/// Idempotent: the judging phase calls it mid-cycle, the driver between cycles.
pub(crate) fn sync_backends(
    backends: &Backends,
    exp: &Experiment,
    models: &mut Models,
) -> Result<()> {
    backends
        .sync(&exp.backends)
        .map_err(|e| EngineError::Invalid(e.to_string()))?;
    let r = &exp.roles;
    for (backend, model) in [
        (r.orchestrator.as_str(), &mut models.orchestrator),
        (r.subagent_backend(), &mut models.subagent),
        (r.judge.as_str(), &mut models.judge),
        (r.optimizer.as_str(), &mut models.optimizer),
    ] {
        *model = backends.current_model(backend, model);
    }
    Ok(())
}

/// Helper for effects whose output is JSON.
pub fn json_effect(
    st: &mut Stream,
    kind: &str,
    request: serde_json::Value,
    perform: impl FnOnce() -> std::result::Result<serde_json::Value, replay::EffectError>,
) -> Result<serde_json::Value> {
    let rec = st.effect_blocking(EffectRequest::json(kind, &request).journaled(), || {
        perform().map(|v| EffectOutput::json(&v))
    })?;
    let transient = rec.failure == Some(replay::FailureClass::Transient);
    let bytes = rec.output.map_err(|e| {
        if transient {
            EngineError::Infrastructure {
                what: kind.to_string(),
                detail: e,
            }
        } else {
            EngineError::Invalid(format!("{kind} failed: {e}"))
        }
    })?;
    serde_json::from_slice(&bytes).map_err(|e| EngineError::recording(kind, e))
}
