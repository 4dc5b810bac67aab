//! Work items and the executor that runs them. The units inside the stages
//! — a rollout (a team run of a task under a workflow) and a judgment (one
//! verdict on two finished runs) — are plain values naming everything that
//! makes their result what it is: the task, the workflow, the backends and
//! models of each role with their sampling, the run's rules (limits,
//! guards, sandbox, harness), the stream the result is recorded in and the
//! run's root seed (every seed inside derives from it and the stream). Each
//! item's [`inputs`](RolloutItem::inputs) are JSON and its id hashes them,
//! so equal ids mean equal work. Stages submit items to an [`Executor`] and
//! read the results back; the results themselves are ledger records (the
//! rollout's and judgment's events), so replay, resume and forks serve them
//! from the ledger whoever executed them.
//!
//! [`InProcess`] executes items on this process's runtime, resolving the
//! names an item carries against the run's backends and tasks. Executing a
//! rollout needs the harness, tools, sandbox, checks and guards, never the
//! loops.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ledger::Id;
use replay::Session;
use schemas::Judgment;
use serde_json::{json, Value};

use crate::backend::Backends;
use crate::config::SamplingConfig;
use crate::error::{EngineError, Result};
use crate::harness::{run_team, RunOutcome, RunRules, RunSpec, Team};
use crate::judge::{judge_pair, Judge, RunRef, Shown};
use crate::task::Task;
use crate::workflow::Workflow;

/// A backend and the model it plays a role with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Role {
    pub backend: String,
    pub model: String,
}

/// One team run to execute.
#[derive(Debug, Clone)]
pub struct RolloutItem {
    /// The task's id (its files are the run's recorded task suite).
    pub task: String,
    pub workflow: Workflow,
    /// Stream name prefix, e.g. `c1/fin-x/collect/07`.
    pub stream: String,
    /// `reference`, `inner`, `collect` or `eval-…`.
    pub purpose: String,
    pub cycle: u32,
    pub index: u32,
    pub orchestrator: Role,
    pub subagent: Role,
    pub sampling: SamplingConfig,
    pub rules: RunRules,
    /// The run's root seed.
    pub seed: u64,
}

/// One verdict to ask for: `a` against `b` on task `task`, shown swapped
/// (`b` as Workspace A) when `swapped`.
#[derive(Debug, Clone)]
pub struct JudgmentItem {
    pub task: String,
    /// The judgment's stream, e.g. `c1/fin-x/pair/003s`.
    pub stream: String,
    pub a: RunRef,
    pub b: RunRef,
    pub swapped: bool,
    pub judge: Role,
    pub max_retries: u32,
    pub sampling: SamplingConfig,
    /// The run's root seed.
    pub seed: u64,
    /// What the judge is shown of each workspace.
    pub shown: Shown,
}

/// Who runs a rollout and under which rules: what every rollout item of a
/// stage shares.
#[derive(Debug, Clone)]
pub struct TeamSpec {
    pub orchestrator: Role,
    pub subagent: Role,
    pub sampling: SamplingConfig,
    pub rules: RunRules,
    pub seed: u64,
}

impl TeamSpec {
    /// The rollout `spec` describes, run by this team.
    pub fn item(&self, spec: &RunSpec<'_>) -> RolloutItem {
        RolloutItem {
            task: spec.task.id.clone(),
            workflow: spec.workflow.clone(),
            stream: spec.stream.clone(),
            purpose: spec.purpose.to_string(),
            cycle: spec.cycle,
            index: spec.index,
            orchestrator: self.orchestrator.clone(),
            subagent: self.subagent.clone(),
            sampling: self.sampling.clone(),
            rules: self.rules.clone(),
            seed: self.seed,
        }
    }
}

/// Who judges and how: what every judgment item of a stage shares.
#[derive(Debug, Clone)]
pub struct JudgeSpec {
    pub judge: Role,
    pub max_retries: u32,
    pub sampling: SamplingConfig,
    pub seed: u64,
    /// What the judge is shown of each workspace.
    pub shown: Shown,
}

impl JudgeSpec {
    /// A verdict on `a` against `b` in stream `stream`.
    pub fn item(
        &self,
        task: &str,
        stream: String,
        a: &RunRef,
        b: &RunRef,
        swapped: bool,
    ) -> JudgmentItem {
        JudgmentItem {
            task: task.to_string(),
            stream,
            a: a.clone(),
            b: b.clone(),
            swapped,
            judge: self.judge.clone(),
            max_retries: self.max_retries,
            sampling: self.sampling.clone(),
            seed: self.seed,
            shown: self.shown,
        }
    }
}

/// Hashes an item's inputs, under a tag per kind of item.
fn id_of(kind: &str, inputs: &Value) -> Id {
    let mut h = blake3::Hasher::new();
    h.update(b"mass.work/");
    h.update(kind.as_bytes());
    h.update(b"\0");
    h.update(&replay::canonical_json(inputs));
    Id(*h.finalize().as_bytes())
}

fn role_json(r: &Role) -> Value {
    json!({"backend": r.backend, "model": r.model})
}

impl RolloutItem {
    /// Everything that makes the rollout what it is, as JSON.
    pub fn inputs(&self) -> Value {
        let r = &self.rules;
        json!({
            "task": self.task,
            "workflow": self.workflow,
            "stream": self.stream,
            "purpose": self.purpose,
            "cycle": self.cycle,
            "index": self.index,
            "orchestrator": role_json(&self.orchestrator),
            "subagent": role_json(&self.subagent),
            "sampling": self.sampling,
            "rules": {"limits": r.limits, "guards": r.guards, "sandbox": r.sandbox, "harness": r.harness, "method": r.method.version},
            "seed": self.seed,
        })
    }

    /// The item's content address.
    pub fn id(&self) -> Id {
        id_of("rollout", &self.inputs())
    }
}

impl JudgmentItem {
    /// Everything that makes the verdict what it is, as JSON: the two runs
    /// by their rollout events (which name their workspaces and records).
    pub fn inputs(&self) -> Value {
        json!({
            "task": self.task,
            "stream": self.stream,
            "a": self.a.event.to_hex(),
            "b": self.b.event.to_hex(),
            "swapped": self.swapped,
            "judge": role_json(&self.judge),
            "max_retries": self.max_retries,
            "sampling": self.sampling,
            "seed": self.seed,
            "shown": self.shown,
        })
    }

    /// The item's content address.
    pub fn id(&self) -> Id {
        id_of("judgment", &self.inputs())
    }
}

/// A unit of work in flight: owns everything it needs, so it can run on
/// any thread of the runtime.
pub type Work<T> = Pin<Box<dyn Future<Output = Result<T>> + Send>>;

/// Executes work items. Results come back as the ledger records the work
/// appended (a rollout's event and record, a judgment's event and verdict).
pub trait Executor: Send + Sync {
    fn rollout(&self, item: RolloutItem) -> Work<RunRef>;
    fn judgment(&self, item: JudgmentItem) -> Work<(Id, Judgment)>;
}

/// The first executor: items run as tasks on this process's runtime,
/// recording into the run's session.
pub struct InProcess {
    session: Session,
    backends: Backends,
    tasks: Arc<Vec<Task>>,
}

impl InProcess {
    /// Executes items of `session`'s run with `backends`, finding tasks by
    /// id among `tasks`.
    pub fn new(session: Session, backends: Backends, tasks: Vec<Task>) -> InProcess {
        InProcess {
            session,
            backends,
            tasks: Arc::new(tasks),
        }
    }

    fn task(&self, id: &str) -> Result<Task> {
        self.tasks
            .iter()
            .find(|t| t.id == id)
            .cloned()
            .ok_or_else(|| {
                EngineError::Invalid(format!(
                    "a work item names task {id}, which this run does not have"
                ))
            })
    }

    /// A handle on the same session, backends and tasks (for work that
    /// outlives `&self`).
    fn clone_parts(&self) -> InProcess {
        InProcess {
            session: self.session.clone(),
            backends: self.backends.clone(),
            tasks: self.tasks.clone(),
        }
    }

    fn seed_matches(&self, seed: u64, what: &str) -> Result<()> {
        if seed != self.session.seed() {
            return Err(EngineError::Invalid(format!(
                "{what} was made for root seed {seed}, and this run's is {}",
                self.session.seed()
            )));
        }
        Ok(())
    }

    fn team(&self, item: &RolloutItem) -> Result<Team> {
        Ok(Team {
            orchestrator: self.backends.get(&item.orchestrator.backend)?,
            orchestrator_model: item.orchestrator.model.clone(),
            subagent: self.backends.get(&item.subagent.backend)?,
            subagent_model: item.subagent.model.clone(),
            sampling: item.sampling.clone(),
        })
    }
}

impl InProcess {
    /// Records `item` as a rollout that failed without being played, with
    /// `detail` (an executor elsewhere failed on every attempt): the run
    /// goes on as for any failed rollout.
    pub fn fail_rollout(&self, item: RolloutItem, detail: String) -> Work<RunRef> {
        let ready = self
            .task(&item.task)
            .and_then(|t| Ok((t, self.team(&item)?)));
        let (task, team) = match ready {
            Ok(v) => v,
            Err(e) => return failed(e),
        };
        let session = self.session.clone();
        Box::pin(async move {
            let spec = RunSpec {
                task: &task,
                workflow: &item.workflow,
                stream: item.stream.clone(),
                purpose: &item.purpose,
                cycle: item.cycle,
                index: item.index,
            };
            let o = crate::harness::record_unrun(&session, &spec, &team, &item.rules, detail);
            Ok(run_ref(o.await?))
        })
    }

    /// Records `item`'s verdict as invalid, with `detail` as its reason (an
    /// executor elsewhere failed on every attempt).
    pub fn fail_judgment(&self, item: &JudgmentItem, detail: String) -> Result<(Id, Judgment)> {
        let task = self.task(&item.task)?;
        let mut st = crate::exec::ledger(|| self.session.stream(&item.stream))?;
        // The judgment's "conversation": a note saying why there was none.
        let note = schemas::to_event(&schemas::Note {
            text: format!("{}{detail}", crate::harness::NOT_EXECUTED),
        })?;
        let why = crate::exec::ledger(|| st.emit(note))?;
        let record = Judgment {
            task: task.id,
            a: item.a.event.into(),
            b: item.b.event.into(),
            swapped: item.swapped,
            judge_model: item.judge.model.clone(),
            winner: "invalid".into(),
            rationale: format!("{}{detail}", crate::harness::NOT_EXECUTED),
            invalid_attempts: 0,
            conversation: why.into(),
        };
        let ev = schemas::to_event(&record)?.with_parents(vec![item.a.event, item.b.event]);
        let id = crate::exec::ledger(|| st.emit(ev))?;
        Ok((id, record))
    }
}

/// Why the item recorded on stream `rel` was never executed, when its
/// recording says so (its first event is the `not executed` note).
fn recorded_not_executed(session: &Session, rel: &str) -> Result<Option<String>> {
    let st = crate::exec::ledger(|| session.stream(rel))?;
    if let Some(first) = st.peek_history() {
        return Ok(crate::harness::not_executed(first));
    }
    // A re-judge: its source run may have recorded the item as never
    // executed (the re-judge takes the same course).
    let Some(src) = session.source() else {
        return Ok(None);
    };
    let Some(head) = src.head(session.ledger(), rel)? else {
        return Ok(None);
    };
    let first = session.ledger().chain(head).last().transpose()?;
    Ok(first.as_ref().and_then(crate::harness::not_executed))
}

/// A work item that cannot start: its error, as work.
fn failed<T: 'static>(e: EngineError) -> Work<T> {
    Box::pin(async move { Err(e) })
}

/// A finished rollout as the judging and ranking read it.
pub fn run_ref(o: RunOutcome) -> RunRef {
    RunRef {
        event: o.event,
        record: o.record,
        violations: o.guard.violations,
    }
}

/// A finished rollout read back from the ledger: its `mass.rollout` event
/// `event` and the tamper guard's findings (the `mass.guard` event the
/// rollout names as a parent). What an executor that did not play the
/// rollout here (a worker did) hands back to the stages.
pub fn run_ref_of(ledger: &ledger::Ledger, event: Id) -> Result<RunRef> {
    let ev = ledger.get_event(&event)?;
    let record: schemas::Rollout = schemas::decode_event(&ev)?;
    let mut violations = Vec::new();
    for p in &ev.parents {
        if ledger.kind_of(p)? != Some(ledger::ObjectKind::Event) {
            continue;
        }
        let parent = ledger.get_event(p)?;
        if parent.kind == <schemas::GuardCheck as schemas::Record>::KIND {
            let g: schemas::GuardCheck = schemas::decode_event(&parent)?;
            violations = g.violations;
        }
    }
    Ok(RunRef {
        event,
        record,
        violations,
    })
}

/// A judgment read back from the ledger: its `mass.judgment` event.
pub fn judgment_of(ledger: &ledger::Ledger, event: Id) -> Result<(Id, Judgment)> {
    let ev = ledger.get_event(&event)?;
    Ok((event, schemas::decode_event(&ev)?))
}

/// What an executor other than [`InProcess`] is built from: the run's
/// session, its backends as built, the tasks its items may name, and the
/// tree of its recorded task suite (what a process elsewhere checks out).
pub struct ExecutorParts {
    pub session: Session,
    pub backends: Backends,
    pub tasks: Vec<Task>,
    pub suite: Id,
}

/// Builds the executor a run's stages submit to (`mass run --workers`).
pub trait MakeExecutor {
    fn make(&self, parts: ExecutorParts) -> Result<Arc<dyn Executor>>;
}

impl Executor for InProcess {
    fn rollout(&self, item: RolloutItem) -> Work<RunRef> {
        let ready = self
            .seed_matches(item.seed, &format!("rollout {}", item.stream))
            .and_then(|()| Ok((self.task(&item.task)?, self.team(&item)?)));
        let (task, team) = match ready {
            Ok(v) => v,
            Err(e) => return failed(e),
        };
        let session = self.session.clone();
        Box::pin(async move {
            let spec = RunSpec {
                task: &task,
                workflow: &item.workflow,
                stream: item.stream.clone(),
                purpose: &item.purpose,
                cycle: item.cycle,
                index: item.index,
            };
            // A rollout recorded as never executed replays as such.
            let orch = format!("{}/orch", item.stream);
            if let Some(why) = recorded_not_executed(&session, &orch)? {
                let o = crate::harness::record_unrun(&session, &spec, &team, &item.rules, why);
                return Ok(run_ref(o.await?));
            }
            Ok(run_ref(
                run_team(&session, &spec, &team, &item.rules).await?,
            ))
        })
    }

    fn judgment(&self, item: JudgmentItem) -> Work<(Id, Judgment)> {
        let ready = self
            .seed_matches(item.seed, &format!("judgment {}", item.stream))
            .and_then(|()| {
                Ok((
                    self.task(&item.task)?,
                    Judge {
                        backend: self.backends.get(&item.judge.backend)?,
                        model: item.judge.model.clone(),
                        max_retries: item.max_retries,
                        sampling: item.sampling.clone(),
                        shown: item.shown,
                    },
                ))
            });
        let (task, judge) = match ready {
            Ok(v) => v,
            Err(e) => return failed(e),
        };
        let session = self.session.clone();
        let me = self.clone_parts();
        Box::pin(async move {
            if let Some(why) = recorded_not_executed(&session, &item.stream)? {
                return me.fail_judgment(&item, why);
            }
            judge_pair(
                &session,
                &item.stream,
                &task,
                &item.a,
                &item.b,
                item.swapped,
                &judge,
            )
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use schemas::{Hash32, Rollout};

    fn rollout_item() -> RolloutItem {
        RolloutItem {
            task: "fin-momentum-backtest".into(),
            workflow: Workflow::bare(),
            stream: "c1/fin-momentum-backtest/collect/00".into(),
            purpose: "collect".into(),
            cycle: 1,
            index: 0,
            orchestrator: Role {
                backend: "sim".into(),
                model: "sim/base".into(),
            },
            subagent: Role {
                backend: "sim".into(),
                model: "sim/base".into(),
            },
            sampling: SamplingConfig::with(0.7, 4096),
            rules: RunRules::default(),
            seed: 8,
        }
    }

    fn run(tag: u8) -> RunRef {
        let h = Hash32([tag; 32]);
        RunRef {
            event: Id([tag; 32]),
            record: Rollout {
                task: "t".into(),
                purpose: "collect".into(),
                cycle: 1,
                index: 0,
                workflow: h,
                orchestrator_model: "m".into(),
                subagent_model: "m".into(),
                status: "finished".into(),
                detail: String::new(),
                tree: h,
                validation: h,
                score_passed: 0,
                score_total: 0,
                orchestrator: h,
                subagents: Vec::new(),
                delegations: 0,
                turns: 0,
                prompt_tokens: 0,
                completion_tokens: 0,
                report: String::new(),
            },
            violations: Vec::new(),
        }
    }

    /// The id of a work item is its inputs' hash: pinned, so a change to
    /// what an item names (or to how it is hashed) is seen. (Moved when
    /// the rules came to name the method's version, `mass-engine/9`, and
    /// again with `mass-engine/10`.)
    #[test]
    fn a_rollout_items_id_is_pinned() {
        assert_eq!(
            rollout_item().id().to_hex(),
            "c683533a97e1b4ceab9ba6b948a047913e9f2ce7a7121f2a8bb15261dcf4678d"
        );
    }

    /// Every input changes the id: two items that differ anywhere are never
    /// taken for the same work.
    #[test]
    fn every_input_of_a_rollout_changes_its_id() {
        let base = rollout_item();
        let mut changed: Vec<RolloutItem> = Vec::new();
        let mut each = |f: &dyn Fn(&mut RolloutItem)| {
            let mut v = base.clone();
            f(&mut v);
            changed.push(v);
        };
        each(&|v| v.task = "pha-hill-fit".into());
        each(&|v| {
            v.workflow.hops.push(crate::workflow::Hop {
                from: "orchestrator".into(),
                to: "a".into(),
                handoff: "notes".into(),
                send_back_when: None,
            })
        });
        each(&|v| v.stream.push('x'));
        each(&|v| v.purpose = "inner".into());
        each(&|v| v.cycle = 2);
        each(&|v| v.index = 1);
        each(&|v| v.orchestrator.backend = "other".into());
        each(&|v| v.orchestrator.model = "sim/c1".into());
        each(&|v| v.subagent.backend = "other".into());
        each(&|v| v.subagent.model = "sim/c1".into());
        each(&|v| v.sampling.temperature = 0.1);
        each(&|v| v.rules.limits.max_turns += 1);
        each(&|v| v.rules.guards.action = crate::config::GuardAction::Record);
        each(&|v| v.rules.sandbox.level = sandbox::Level::None);
        each(&|v| v.rules.harness.kind = crate::config::HarnessKind::External);
        each(&|v| v.rules.method.version = 8);
        each(&|v| v.seed = 9);
        let mut ids: Vec<Id> = changed.iter().map(RolloutItem::id).collect();
        ids.push(base.id());
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "two different rollout items share an id");
    }

    #[test]
    fn every_input_of_a_judgment_changes_its_id() {
        let spec = JudgeSpec {
            judge: Role {
                backend: "sim".into(),
                model: "sim/base".into(),
            },
            max_retries: 2,
            sampling: SamplingConfig::with(0.2, 1024),
            seed: 8,
            shown: Shown::Workspaces,
        };
        let base = spec.item("t", "c1/t/pair/000".into(), &run(1), &run(2), false);
        let mut other = spec.clone();
        other.max_retries = 3;
        let mut judged_by = spec.clone();
        judged_by.judge.model = "sim/c1".into();
        let mut shown_checks = spec.clone();
        shown_checks.shown = Shown::WorkspacesAndChecks;
        let variants = [
            spec.item("u", "c1/t/pair/000".into(), &run(1), &run(2), false),
            spec.item("t", "c1/t/pair/001".into(), &run(1), &run(2), false),
            spec.item("t", "c1/t/pair/000".into(), &run(3), &run(2), false),
            spec.item("t", "c1/t/pair/000".into(), &run(1), &run(3), false),
            spec.item("t", "c1/t/pair/000".into(), &run(2), &run(1), false),
            spec.item("t", "c1/t/pair/000".into(), &run(1), &run(2), true),
            other.item("t", "c1/t/pair/000".into(), &run(1), &run(2), false),
            judged_by.item("t", "c1/t/pair/000".into(), &run(1), &run(2), false),
            shown_checks.item("t", "c1/t/pair/000".into(), &run(1), &run(2), false),
        ];
        let mut ids: Vec<Id> = variants.iter().map(JudgmentItem::id).collect();
        ids.push(base.id());
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "two different judgment items share an id");
        // A rollout and a judgment never share an id space.
        assert_ne!(id_of("rollout", &base.inputs()), base.id());
    }
}
