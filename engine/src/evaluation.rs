//! Held-out evaluation: runs of the new model and of the base model on the
//! held-out tasks (bare task, no workflow), paired and judged by the external
//! judges with alternating presentation order; W/(W+L) with ties reported.

use ledger::Id;
use schemas::{Evaluation, Hash32};

use crate::config::Experiment;
use crate::cycle::{step, Ctx, Models};
use crate::error::{EngineError, Result};
use crate::harness::{run_team, RunRules, RunSpec};
use crate::judge::{judge_pair, RunRef};
use crate::parallel;
use crate::workflow::Workflow;

/// Returns (wins, losses, ties) of `new` against `base`.
pub fn evaluate(
    ctx: &Ctx<'_>,
    main: &mut replay::Stream,
    exp: &mut Experiment,
    cycle: u32,
    new: &Models,
    base: &Models,
) -> Result<(u32, u32, u32)> {
    let bare = Workflow::bare();
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
    let runs = parallel::map(ctx.threads(), jobs, |(task, i, who, team)| {
        let r = run_team(
            ctx.session,
            &RunSpec {
                task,
                workflow: &bare,
                stream: format!("c{cycle}/eval/{}/{who}/{i:02}", task.id),
                purpose: "eval",
                cycle,
                index: i,
            },
            &team,
            &RunRules::of(ctx.exp),
        )?;
        ctx.progress.tick(&stage);
        Ok::<_, EngineError>((
            task.id.clone(),
            i,
            who,
            RunRef {
                event: r.event,
                record: r.record,
                violations: r.guard.violations,
            },
        ))
    })?;
    ctx.progress.done(&stage);
    let judges: Vec<String> = if exp.roles.external_judges.is_empty() {
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
    let verdicts = parallel::map(ctx.threads(), pair_jobs, |(jname, task, i, j, a, b)| {
        let backend = ctx.backends.get(&jname)?;
        let judge = crate::judge::Judge {
            backend: backend.clone(),
            model: backend.base_model(),
            max_retries: ctx.exp.outer.max_verdict_retries,
            sampling: ctx.exp.sampling.judge.clone(),
        };
        let (id, v) = judge_pair(
            ctx.session,
            &format!("c{cycle}/eval/{}/judge-{jname}/{i:02}-{j}", task.id),
            task,
            &a,
            &b,
            j % 2 == 1,
            &judge,
        )?;
        ctx.progress.tick(&stage);
        Ok::<_, EngineError>((id, v.winner))
    })?;
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
    Ok((w, l, t))
}
