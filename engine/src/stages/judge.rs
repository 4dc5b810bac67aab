//! The judge stage: pairwise judging of each task's collected runs on a
//! seeded connected k-regular schedule (`outer.opponents_per_run`
//! opponents per run; both orders when `outer.swap_positions`). Reads the
//! collected runs; writes one `mass.judgment` per comparison (each on its
//! `c{cycle}/{task}/pair/{p}` stream) and a main-stream step naming them all.
//! The judge is read from the experiment as it stands after collection: a
//! fork taken at the collection step (`mass rejudge --cycle C --judge NAME`)
//! hands judging to another backend from here on, which plays it with its
//! base model; a backend the fork changed or added is built now.

use ledger::Id;
use replay::Stream;

use super::collect::Collected;
use crate::config::Experiment;
use crate::context::{note, step, Ctx, Models, Now};
use crate::error::{EngineError, Result};
use crate::exec;

/// One comparison's verdict: task, the two runs (indexes into the task's
/// collected runs, as shown first and second when not swapped), the
/// judgment's event and the winner (`a`, `b`, `tie`, or what the judge
/// failed with).
pub(crate) struct Verdict {
    pub(crate) task: String,
    pub(crate) a: usize,
    pub(crate) b: usize,
    pub(crate) judgment: Id,
    pub(crate) winner: String,
}

/// Every verdict of the cycle, in schedule order.
pub(crate) struct Judged {
    pub(crate) verdicts: Vec<Verdict>,
}

impl Judged {
    /// The verdicts on task `task`.
    pub(crate) fn of_task<'a>(&'a self, task: &'a str) -> impl Iterator<Item = &'a Verdict> + 'a {
        self.verdicts.iter().filter(move |v| v.task == task)
    }
}

/// A comparison to judge: task, pair number, the two runs, swapped.
type PairJob = (String, usize, usize, usize, bool);

/// Runs the judge stage of cycle `cycle`.
pub(crate) fn run(
    ctx: &Ctx<'_>,
    main: &mut Stream,
    exp: &mut Experiment,
    cycle: u32,
    m: &Models,
    collected: &Collected,
) -> Result<Judged> {
    let now = Now::of(ctx, exp, m)?;
    let c = ctx.at(&now.exp);
    let judge = c.judge_spec(
        &now.exp.roles.judge,
        &now.models.judge,
        now.exp.outer.max_verdict_retries,
        &now.exp.sampling.judge,
    );
    let pair_jobs = schedule(main, exp, cycle, collected)?;
    let stage = format!("cycle {cycle}: judging");
    ctx.progress.stage(&stage, pair_jobs.len() as u64);
    let mut items = Vec::new();
    for (task_id, p, a, b, swapped) in &pair_jobs {
        let pair = collected
            .by_task
            .get(task_id)
            .and_then(|runs| Some((runs.get(*a)?, runs.get(*b)?)));
        let Some((ra, rb)) = pair else {
            return Err(EngineError::Invalid(format!(
                "no runs {a} and {b} of task {task_id} to judge"
            )));
        };
        let rel = format!(
            "c{cycle}/{task_id}/pair/{p:03}{}",
            if *swapped { "s" } else { "" }
        );
        items.push(judge.item(task_id, rel, ra, rb, *swapped));
    }
    let judged = exec::all(
        c.threads(),
        items,
        |item| ctx.executor.judgment(item),
        || ctx.progress.tick(&stage),
    )?;
    let verdicts: Vec<Verdict> = pair_jobs
        .into_iter()
        .zip(judged)
        .map(|((task, _, a, b, _), (judgment, j))| Verdict {
            task,
            a,
            b,
            judgment,
            winner: j.winner,
        })
        .collect();
    ctx.progress.done(&stage);
    // A barrier: every comparison of every task is a causal parent of the
    // steps that follow, so a fork at any of them keeps all the judging.
    step(
        main,
        exp,
        note(format!(
            "cycle {cycle}: {} comparison(s) judged",
            verdicts.len()
        ))?
        .with_parents(verdicts.iter().map(|v| v.judgment).collect()),
    )?;
    Ok(Judged { verdicts })
}

/// Each task's comparisons on its seeded connected schedule.
fn schedule(
    main: &Stream,
    exp: &Experiment,
    cycle: u32,
    collected: &Collected,
) -> Result<Vec<PairJob>> {
    let mut pair_jobs = Vec::new();
    for (task_id, runs) in &collected.by_task {
        let seed = main.derive_seed(&format!("pairing/{cycle}/{task_id}"));
        if runs.is_empty() {
            continue;
        }
        let mut k = exp
            .outer
            .opponents_per_run
            .min(runs.len().saturating_sub(1) as u32);
        // Guards may leave an odd number of runs; a regular schedule needs
        // an even number of slots.
        if (runs.len() as u32 * k) % 2 == 1 {
            k -= 1;
        }
        let schedule = rank::schedule::pairing_schedule(runs.len(), k as usize, seed)
            .map_err(|e| EngineError::Invalid(format!("pairing schedule for {task_id}: {e}")))?;
        for (p, pair) in schedule.iter().enumerate() {
            pair_jobs.push((task_id.clone(), p, pair.a, pair.b, false));
            if exp.outer.swap_positions {
                pair_jobs.push((task_id.clone(), p, pair.a, pair.b, true));
            }
        }
    }
    Ok(pair_jobs)
}
