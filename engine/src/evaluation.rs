//! Held-out evaluation: runs of the new model and of the base model on the
//! held-out tasks (bare task, no workflow), paired and judged by the external
//! judges with alternating presentation order; W/(W+L) with ties reported.

use ledger::Id;
use schemas::{Evaluation, Hash32};

use crate::config::Experiment;
use crate::cycle::{step, Ctx, Models};
use crate::error::Result;
use crate::exec;
use crate::harness::{run_team, RunRules, RunSpec};
use crate::judge::{judge_pair, RunRef};
use crate::workflow::Workflow;

/// The held-out comparison of a cycle's new model with the base model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldOut {
    /// Verdicts for the new model, for the base model, and ties.
    pub wins: u32,
    pub losses: u32,
    pub ties: u32,
    /// The backends that judged, comma-separated: the external judges, or
    /// the run's own judge when there are none.
    pub judge: String,
    /// No external judge is configured: the run's own judge backend (its
    /// base model) judged, not an independent judge.
    pub self_judged: bool,
}

/// Runs and judges the held-out comparison of `new` against `base`.
pub fn evaluate(
    ctx: &Ctx<'_>,
    main: &mut replay::Stream,
    exp: &mut Experiment,
    cycle: u32,
    new: &Models,
    base: &Models,
) -> Result<HeldOut> {
    let teams = [("new", ctx.team(new)?), ("base", ctx.team(base)?)];
    let mut jobs = Vec::new();
    for task in ctx.heldout {
        for i in 0..exp.outer.eval_runs {
            for (who, team) in &teams {
                jobs.push((task, i, *who, team.clone()));
            }
        }
    }
    let stage = format!("cycle {cycle}: held-out evaluation runs");
    ctx.progress.stage(&stage, jobs.len() as u64);
    let runs = exec::all(
        ctx.threads(),
        jobs,
        |(task, i, who, team)| {
            let (session, rules) = (ctx.session.clone(), RunRules::of(ctx.exp));
            let task = task.clone();
            async move {
                let spec = RunSpec {
                    task: &task,
                    workflow: &Workflow::bare(),
                    stream: format!("c{cycle}/eval/{}/{who}/{i:02}", task.id),
                    purpose: "eval",
                    cycle,
                    index: i,
                };
                let r = run_team(&session, &spec, &team, &rules).await?;
                Ok((
                    task.id.clone(),
                    i,
                    who,
                    RunRef {
                        event: r.event,
                        record: r.record,
                        violations: r.guard.violations,
                    },
                ))
            }
        },
        || ctx.progress.tick(&stage),
    )?;
    ctx.progress.done(&stage);
    let self_judged = exp.roles.external_judges.is_empty();
    let judges: Vec<String> = if self_judged {
        vec![exp.roles.judge.clone()]
    } else {
        exp.roles.external_judges.clone()
    };
    let mut pair_jobs = Vec::new();
    for jname in &judges {
        for task in ctx.heldout {
            for i in 0..exp.outer.eval_runs {
                let find = |w: &str| {
                    runs.iter()
                        .find(|r| r.0 == task.id && r.1 == i && r.2 == w)
                        .map(|r| r.3.clone())
                };
                let (Some(a), Some(b)) = (find("new"), find("base")) else {
                    continue;
                };
                for j in 0..exp.outer.external_judgments.max(1) {
                    pair_jobs.push((jname.clone(), task, i, j, a.clone(), b.clone()));
                }
            }
        }
    }
    let stage = format!("cycle {cycle}: held-out judging");
    ctx.progress.stage(&stage, pair_jobs.len() as u64);
    let verdicts = exec::all(
        ctx.threads(),
        pair_jobs,
        |(jname, task, i, j, a, b)| {
            let judge = ctx.backends.get(&jname).map(|backend| crate::judge::Judge {
                model: backend.base_model(),
                backend,
                max_retries: ctx.exp.outer.max_verdict_retries,
                sampling: ctx.exp.sampling.judge.clone(),
            });
            let (session, task) = (ctx.session.clone(), task.clone());
            async move {
                let judge = judge?;
                let rel = format!("c{cycle}/eval/{}/judge-{jname}/{i:02}-{j}", task.id);
                let (id, v) = judge_pair(&session, &rel, &task, &a, &b, j % 2 == 1, &judge).await?;
                Ok((id, v.winner))
            }
        },
        || ctx.progress.tick(&stage),
    )?;
    ctx.progress.done(&stage);
    let (mut w, mut l, mut t) = (0, 0, 0);
    for (_, v) in &verdicts {
        match v.as_str() {
            "a" => w += 1,
            "b" => l += 1,
            "tie" => t += 1,
            _ => {}
        }
    }
    let ids: Vec<Id> = verdicts.iter().map(|v| v.0).collect();
    let rec = Evaluation {
        cycle,
        split: "heldout".into(),
        model: new.orchestrator.clone(),
        baseline: base.orchestrator.clone(),
        judge: judges.join(","),
        wins: w,
        losses: l,
        ties: t,
        judgments: ids.iter().map(|i| Hash32(i.0)).collect(),
    };
    step(main, exp, schemas::to_event(&rec)?.with_parents(ids))?;
    Ok(HeldOut {
        wins: w,
        losses: l,
        ties: t,
        judge: judges.join(","),
        self_judged,
    })
}
