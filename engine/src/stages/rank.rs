//! The rank stage: a Bradley-Terry fit of one task's runs from its verdicts
//! (ties count half a win; `outer.prior` virtual games against an average
//! player, or the pure maximum-likelihood fit when it is 0). Reads the
//! task's collected runs and its verdicts; writes one `mass.ranking` on the
//! main stream, whose parents are the judgments it read.

use ledger::Id;
use replay::Stream;
use schemas::{Hash32, RankedRun, Ranking};

use super::judge::{Judged, Verdict};
use crate::config::Experiment;
use crate::context::step;
use crate::error::{EngineError, Result};
use crate::judge::RunRef;

/// One task's ranking: its event and the runs from best to worst.
pub(crate) struct Ranked {
    pub(crate) id: Id,
    pub(crate) runs: Vec<RankedRun>,
}

/// Ranks task `task_id`'s `runs` in cycle `cycle`.
pub(crate) fn run(
    main: &mut Stream,
    exp: &mut Experiment,
    cycle: u32,
    task_id: &str,
    runs: &[RunRef],
    judged: &Judged,
) -> Result<Ranked> {
    let mine: Vec<&Verdict> = judged.of_task(task_id).collect();
    let fit = fit(exp.outer.prior, runs.len(), &mine)
        .map_err(|e| EngineError::Invalid(format!("Bradley-Terry for {task_id}: {e}")))?;
    let ranked = ranked_runs(&fit, runs);
    let ranking = Ranking {
        task: task_id.to_string(),
        cycle,
        prior: exp.outer.prior,
        iterations: fit.iterations as u32,
        converged: fit.converged,
        runs: ranked.clone(),
        judgments: mine.iter().map(|v| Hash32(v.judgment.0)).collect(),
    };
    let id = step(
        main,
        exp,
        schemas::to_event(&ranking)?.with_parents(mine.iter().map(|v| v.judgment).collect()),
    )?;
    Ok(Ranked { id, runs: ranked })
}

/// The fit of `n` runs from these verdicts; a verdict that names no winner
/// (the judge failed) is left out.
fn fit(
    prior: f64,
    n: usize,
    verdicts: &[&Verdict],
) -> std::result::Result<rank::bt::Fit, rank::RankError> {
    let comparisons: Vec<rank::bt::Comparison> = verdicts
        .iter()
        .filter_map(|v| comparison(v.a, v.b, &v.winner))
        .collect();
    let prior = if prior > 0.0 {
        rank::bt::Prior::Virtual(prior)
    } else {
        rank::bt::Prior::None
    };
    let opts = rank::bt::FitOptions {
        prior,
        ..Default::default()
    };
    rank::bt::fit(n, &comparisons, &opts)
}

/// Runs `a` and `b`'s comparison for the fit, from a judgment's winner;
/// `None` when it names none (the judge failed): left out of the fit.
pub(crate) fn comparison(a: usize, b: usize, winner: &str) -> Option<rank::bt::Comparison> {
    let outcome = match winner {
        "a" => rank::bt::Outcome::AWins,
        "b" => rank::bt::Outcome::BWins,
        "tie" => rank::bt::Outcome::Tie,
        _ => return None,
    };
    Some(rank::bt::Comparison { a, b, outcome })
}

/// The fitted `runs`, best first, as a `mass.ranking` lists them.
pub(crate) fn ranked_runs(fit: &rank::bt::Fit, runs: &[RunRef]) -> Vec<RankedRun> {
    fit.by_rank()
        .iter()
        .map(|r| RankedRun {
            rollout: runs[r.item].event.into(),
            score: r.score,
            rank: r.rank as u32,
            wins: r.wins,
            losses: r.losses,
            ties: r.ties,
        })
        .collect()
}
