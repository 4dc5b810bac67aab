//! The search stage (MASS's inner loop): for every training task, a
//! bare-task reference run, then `inner.iterations` rounds in which the
//! optimizer proposes a workflow from the champion and its feedback, the
//! team runs it, and the judge decides in one or two duels whether it
//! becomes the champion. Reads the training tasks and the models; writes a
//! `mass.promotion` per iteration on each task's `c{cycle}/{task}/inner`
//! stream and a step on the main stream after the reference runs and after
//! each iteration.

use std::sync::Arc;

use ledger::Id;
use replay::{Session, Stream};
use schemas::{Hash32, Promotion};

use super::guard_reason;
use crate::config::{Acceptance, Experiment, GuardAction};
use crate::context::{note, step, Ctx, Models, Now};
use crate::error::Result;
use crate::exec;
use crate::harness::RunSpec;
use crate::judge::RunRef;
use crate::optimizer::{propose, Optimizer};
use crate::task::Task;
use crate::work::{Executor, JudgeSpec, TeamSpec};
use crate::workflow::Workflow;

/// What the search found: each training task's champion.
pub(crate) struct Searched {
    pub(crate) tasks: Vec<TaskSearch>,
}

impl Searched {
    /// Accepted candidates, over all tasks.
    pub(crate) fn wins(&self) -> u32 {
        self.tasks.iter().map(|t| t.wins).sum()
    }
}

/// One training task's search: its champion workflow and run, the
/// bare-task reference run, and the optimizer's feedback so far.
pub(crate) struct TaskSearch {
    pub(crate) task: Task,
    decisions: Stream,
    pub(crate) champion: Workflow,
    pub(crate) champion_run: RunRef,
    reference: RunRef,
    feedback: Vec<String>,
    pub(crate) wins: u32,
    pub(crate) beat_reference: bool,
    /// An optimizer stream this iteration left without a promotion (no valid
    /// proposal): linked from the iteration's step so forks keep it.
    unlinked: Option<Id>,
}

/// What every inner-loop unit of one cycle shares.
#[derive(Clone)]
struct Search {
    session: Session,
    executor: Arc<dyn Executor>,
    team: TeamSpec,
    judge: JudgeSpec,
    opt: Optimizer,
    cycle: u32,
    acceptance: Acceptance,
    swap: bool,
    guard_action: GuardAction,
    /// Runs of the bare task never count as beating the reference (a
    /// re-run that wins by noise would open the data gate). Off for runs
    /// recorded by `mass-engine/8` and earlier.
    bare_never_beats_reference: bool,
}

impl Search {
    /// The search's team, judge, optimizer and rules under `c`'s settings.
    fn of(c: &Ctx<'_>, m: &Models, cycle: u32) -> Result<Search> {
        let e = c.exp;
        Ok(Search {
            session: c.session.clone(),
            executor: c.executor.clone(),
            team: c.team_spec(m),
            judge: c.judge_spec(
                &e.roles.judge,
                &m.judge,
                e.outer.max_verdict_retries,
                &e.sampling.judge,
            ),
            opt: Optimizer {
                backend: c.backends.get(&e.roles.optimizer)?.clone(),
                model: m.optimizer.clone(),
                max_retries: e.inner.max_proposal_retries,
                sampling: e.sampling.optimizer.clone(),
                reject_unchanged: !e.method.legacy(),
            },
            cycle,
            acceptance: e.inner.acceptance,
            swap: e.inner.swap_positions,
            guard_action: e.guards.action,
            bare_never_beats_reference: !e.method.legacy(),
        })
    }

    /// A duel of the candidate's run against `other` in stream `{base}/{vs}`:
    /// judged once, or twice with A/B swapped (both orders at once); returns
    /// (candidate wins, candidate losses, judgment ids, last rationale).
    async fn duel(
        &self,
        base: &str,
        vs: &str,
        task: &Task,
        cand: &RunRef,
        other: &RunRef,
    ) -> Result<(u32, u32, Vec<Id>, String)> {
        let rel = format!("{base}/{vs}");
        let straight =
            self.executor
                .judgment(self.judge.item(&task.id, rel.clone(), cand, other, false));
        let verdicts = if self.swap {
            let swapped = self.executor.judgment(self.judge.item(
                &task.id,
                format!("{rel}s"),
                cand,
                other,
                true,
            ));
            let (a, b) = tokio::join!(straight, swapped);
            vec![a?, b?]
        } else {
            vec![straight.await?]
        };
        let (mut w, mut l) = (0, 0);
        let mut ids = Vec::new();
        let mut why = String::new();
        for (id, j) in verdicts {
            match j.winner.as_str() {
                "a" => w += 1,
                "b" => l += 1,
                _ => {}
            }
            why = j.rationale;
            ids.push(id);
        }
        Ok((w, l, ids, why))
    }
}

/// One inner-loop iteration `k` of one task: a proposal, a run of it, the
/// duel(s) that decide whether it becomes the champion, and the recorded
/// decision.
async fn search_step(s: &Search, t: &mut TaskSearch, k: u32) -> Result<()> {
    let cycle = s.cycle;
    let base = format!("c{cycle}/{}/inner/{k:02}", t.task.id);
    let (proposal, optimizer_head) = propose(
        &s.session,
        &format!("{base}/optimizer"),
        &t.task,
        k,
        &t.champion,
        &t.feedback,
        &s.opt,
    )
    .await?;
    let Some(candidate) = proposal else {
        t.feedback.push(format!("iteration {k}: no valid proposal"));
        t.unlinked = Some(optimizer_head);
        return Ok(());
    };
    let run = s
        .executor
        .rollout(s.team.item(&RunSpec {
            task: &t.task,
            workflow: &candidate,
            stream: format!("{base}/run"),
            purpose: "inner",
            cycle,
            index: k,
        }))
        .await?;
    let mut verdict = s.decide(&base, t, &run).await?;
    if s.bare_never_beats_reference && candidate.is_bare() && verdict.beat_reference {
        verdict.beat_reference = false;
        verdict
            .reason
            .push_str("; a run of the bare task does not count as beating the bare-task reference");
    }
    let verdict = s.guard_veto(verdict, &run);
    record(t, k, &run, &verdict, optimizer_head)?;
    if verdict.accepted {
        t.champion = candidate;
        t.champion_run = run;
        t.wins += 1;
        // From mass-engine/9 the gate follows the champion: a bare champion
        // (the task again, accepted over a workflow) yields no data.
        t.beat_reference = if s.bare_never_beats_reference && t.champion.is_bare() {
            false
        } else {
            t.beat_reference || verdict.beat_reference
        };
    }
    Ok(())
}

/// Whether a candidate's run becomes champion, and why.
struct Verdict {
    judgments: Vec<Id>,
    accepted: bool,
    beat_reference: bool,
    reason: String,
}

impl Search {
    /// The duel(s) the acceptance rule asks for.
    async fn decide(&self, base: &str, t: &TaskSearch, run: &RunRef) -> Result<Verdict> {
        match self.acceptance {
            Acceptance::Champion => {
                let (w, l, ids, why) = self
                    .duel(base, "vs-champion", &t.task, run, &t.champion_run)
                    .await?;
                Ok(Verdict {
                    judgments: ids,
                    accepted: w > l,
                    beat_reference: w > l,
                    reason: format!("{w} win(s), {l} loss(es) against the champion: {why}"),
                })
            }
            Acceptance::ReferenceThenChampion => {
                let (w, l, mut judgments, why) = self
                    .duel(base, "vs-reference", &t.task, run, &t.reference)
                    .await?;
                let beat_reference = w > l;
                if beat_reference && t.champion_run.event != t.reference.event {
                    let (w2, l2, ids2, why2) = self
                        .duel(base, "vs-champion", &t.task, run, &t.champion_run)
                        .await?;
                    judgments.extend(ids2);
                    return Ok(Verdict {
                        judgments,
                        accepted: w2 > l2,
                        beat_reference,
                        reason: format!(
                            "beat the reference {w}-{l}; against the champion {w2}-{l2}: {why2}"
                        ),
                    });
                }
                Ok(Verdict {
                    judgments,
                    accepted: beat_reference,
                    beat_reference,
                    reason: format!(
                        "{w} win(s), {l} loss(es) against the bare-task reference: {why}"
                    ),
                })
            }
        }
    }

    /// A workflow whose run the guards flagged never becomes champion
    /// (unless the policy only records flags): it would carry the
    /// tampering into collection.
    fn guard_veto(&self, v: Verdict, run: &RunRef) -> Verdict {
        if run.violations.is_empty() || self.guard_action == GuardAction::Record {
            return v;
        }
        Verdict {
            accepted: false,
            beat_reference: false,
            reason: format!(
                "{}; rejected by the {}",
                v.reason,
                guard_reason(&run.violations)
            ),
            judgments: v.judgments,
        }
    }
}

/// Records iteration `k`'s decision on the task's decision stream and
/// feeds it back to the optimizer.
fn record(t: &mut TaskSearch, k: u32, run: &RunRef, v: &Verdict, optimizer_head: Id) -> Result<()> {
    let rec = Promotion {
        task: t.task.id.clone(),
        iteration: k,
        candidate: run.event.into(),
        champion: t.champion_run.event.into(),
        accepted: v.accepted,
        beat_reference: v.beat_reference,
        reason: v.reason.clone(),
        judgments: v.judgments.iter().map(|j| Hash32(j.0)).collect(),
    };
    // The optimizer's stream is a causal parent of the decision, so a
    // fork after this point keeps (and serves) its calls.
    let mut parents = v.judgments.clone();
    parents.push(optimizer_head);
    let ev = schemas::to_event(&rec)?.with_parents(parents);
    exec::ledger(|| t.decisions.emit(ev))?;
    t.feedback.push(format!(
        "iteration {k}: candidate {} — {}",
        if v.accepted { "accepted" } else { "rejected" },
        v.reason
    ));
    Ok(())
}

/// The inner loop for all training tasks, iteration by iteration; within an
/// iteration every task's step runs at once.
pub(crate) fn run(
    ctx: &Ctx<'_>,
    main: &mut Stream,
    exp: &mut Experiment,
    cycle: u32,
    m: &Models,
) -> Result<Searched> {
    let team = ctx.team_spec(m);
    let stage = format!("cycle {cycle}: reference runs");
    ctx.progress.stage(&stage, ctx.train.len() as u64);
    let items: Vec<_> = ctx
        .train
        .iter()
        .map(|task| {
            team.item(&RunSpec {
                task,
                workflow: &Workflow::bare(),
                stream: format!("c{cycle}/{}/reference", task.id),
                purpose: "reference",
                cycle,
                index: 0,
            })
        })
        .collect();
    let refs = exec::all(
        ctx.threads(),
        items,
        |item| ctx.executor.rollout(item),
        || ctx.progress.tick(&stage),
    )?;
    ctx.progress.done(&stage);
    let mut tasks = Vec::new();
    for (task, r) in ctx.train.iter().zip(refs) {
        tasks.push(TaskSearch {
            task: task.clone(),
            decisions: ctx.session.stream(&format!("c{cycle}/{}/inner", task.id))?,
            champion: Workflow::bare(),
            champion_run: r.clone(),
            reference: r,
            feedback: Vec::new(),
            wins: 0,
            beat_reference: false,
            unlinked: None,
        });
    }
    step(
        main,
        exp,
        note(format!("cycle {cycle}: reference runs done"))?
            .with_parents(tasks.iter().map(|t| t.reference.event).collect()),
    )?;
    let iterations = exp.inner.iterations;
    let stage = format!("cycle {cycle}: inner loop");
    ctx.progress
        .stage(&stage, (iterations as usize * tasks.len()) as u64);
    for k in 1..=iterations {
        // Read each iteration: a fork at the previous step may change them.
        let now = Now::of(ctx, exp, m)?;
        let c = ctx.at(&now.exp);
        let search = Search::of(&c, &now.models, cycle)?;
        tasks = exec::all(
            c.threads(),
            std::mem::take(&mut tasks),
            |mut t| {
                let search = search.clone();
                async move {
                    search_step(&search, &mut t, k).await?;
                    Ok(t)
                }
            },
            || ctx.progress.tick(&stage),
        )?;
        let mut heads: Vec<Id> = tasks.iter().filter_map(|t| t.decisions.head()).collect();
        heads.extend(tasks.iter_mut().filter_map(|t| t.unlinked.take()));
        step(
            main,
            exp,
            note(format!("cycle {cycle}: inner iteration {k} done"))?.with_parents(heads),
        )?;
    }
    ctx.progress.done(&stage);
    Ok(Searched { tasks })
}
