//! The select stage: from one task's ranking, the best `outer.train_ranks`
//! runs for training and the next `outer.validation_ranks` for validation.
//! Every run left out is named by id with its reason in the
//! `mass.selection` record (v2), which it writes on the main stream: those
//! kept out of judging at collection (halted, failed, or excluded by the
//! guards) and those the guards flagged under `no-train` (ranked, never
//! trained on; the next rank takes the place, as that policy means). Only
//! finished runs are ranked, so a task with too few of them selects fewer
//! runs than wanted and says so (`shortfall`); a halted run never fills in.
//!
//! Runs recorded by `mass-engine/8` and earlier keep their flow: halted and
//! failed runs were ranked and skipped here, the next ranks filling in,
//! each exclusion a line of text in a `mass.selection` v1.

use ledger::Id;
use replay::Stream;
use schemas::{Exclusion, Hash32, Selection, SelectionV1};

use super::guard_reason;
use super::rank::Ranked;
use crate::config::{Experiment, GuardAction};
use crate::context::step;
use crate::error::{EngineError, Result};
use crate::judge::RunRef;

/// One task's selection: its event, the ranking it read, and the runs
/// chosen for each split, best first.
pub(crate) struct Selected<'r> {
    pub(crate) id: Id,
    pub(crate) ranking: Id,
    pub(crate) train: Vec<&'r RunRef>,
    pub(crate) validation: Vec<&'r RunRef>,
}

/// Selects from task `task_id`'s ranking of `runs`; `excluded` names the
/// runs kept out of judging (event and reason).
pub(crate) fn run<'r>(
    main: &mut Stream,
    exp: &mut Experiment,
    cycle: u32,
    task_id: &str,
    runs: &'r [RunRef],
    ranked: &Ranked,
    excluded: &[(Id, String)],
) -> Result<Selected<'r>> {
    if exp.method.legacy() {
        return run_legacy(main, exp, cycle, task_id, runs, ranked, excluded);
    }
    let (wanted_train, wanted_validation) = (exp.outer.train_ranks, exp.outer.validation_ranks);
    let mut exclusions: Vec<Exclusion> = excluded
        .iter()
        .map(|(id, reason)| Exclusion {
            rollout: (*id).into(),
            reason: reason.clone(),
        })
        .collect();
    let mut train = Vec::new();
    let mut validation = Vec::new();
    for r in &ranked.runs {
        let run = ranked_run(runs, r.rollout)?;
        if let Some(reason) = not_trained(exp, run) {
            exclusions.push(Exclusion {
                rollout: r.rollout,
                reason,
            });
            continue;
        }
        if (train.len() as u32) < wanted_train {
            train.push(run);
        } else if (validation.len() as u32) < wanted_validation {
            validation.push(run);
        }
    }
    let shortfall = if (train.len() as u32) < wanted_train
        || (validation.len() as u32) < wanted_validation
    {
        format!(
            "{} run(s) ranked of {} collected, {} left out: {} training run(s) of {wanted_train} wanted, {} validation run(s) of {wanted_validation} wanted (no run left out fills in)",
            runs.len(),
            runs.len() + excluded.len(),
            exclusions.len(),
            train.len(),
            validation.len(),
        )
    } else {
        String::new()
    };
    let sel = Selection {
        task: task_id.to_string(),
        cycle,
        ranking: ranked.id.into(),
        train: train.iter().map(|r| r.event.into()).collect(),
        validation: validation.iter().map(|r| r.event.into()).collect(),
        excluded: Vec::new(),
        exclusions,
        wanted_train,
        wanted_validation,
        shortfall,
    };
    let id = step(main, exp, schemas::to_event(&sel)?)?;
    Ok(Selected {
        id,
        ranking: ranked.id,
        train,
        validation,
    })
}

/// The collected run a ranking names.
fn ranked_run(runs: &[RunRef], rollout: Hash32) -> Result<&RunRef> {
    runs.iter()
        .find(|x| Hash32::from(x.event) == rollout)
        .ok_or_else(|| EngineError::Invalid("ranked run vanished".into()))
}

/// Why a ranked run never becomes data: flagged under `no-train`, or (a
/// backstop: collection keeps them out of ranking) it did not finish.
fn not_trained(exp: &Experiment, run: &RunRef) -> Option<String> {
    if !run.violations.is_empty() && exp.guards.action == GuardAction::NoTrain {
        return Some(format!(
            "{} (ranked, not trained on)",
            guard_reason(&run.violations)
        ));
    }
    if run.record.status != "finished" {
        return Some(format!(
            "{}: {} (ranked, not trained on)",
            run.record.status, run.record.detail
        ));
    }
    None
}

/// The selection as `mass-engine/8` and earlier made and recorded it
/// (`mass.selection` v1, byte for byte): halted and failed runs were
/// ranked, skipped here, and the next ranks filled in.
fn run_legacy<'r>(
    main: &mut Stream,
    exp: &mut Experiment,
    cycle: u32,
    task_id: &str,
    runs: &'r [RunRef],
    ranked: &Ranked,
    excluded: &[(Id, String)],
) -> Result<Selected<'r>> {
    let mut excluded: Vec<String> = excluded
        .iter()
        .map(|(id, reason)| format!("run {}: {reason}", id.short(12)))
        .collect();
    let mut train = Vec::new();
    let mut validation = Vec::new();
    for r in &ranked.runs {
        let run = ranked_run(runs, r.rollout)?;
        if !run.violations.is_empty() && exp.guards.action == GuardAction::NoTrain {
            excluded.push(format!(
                "rank {}: {} (ranked, not trained on)",
                r.rank,
                guard_reason(&run.violations)
            ));
            continue;
        }
        if run.record.status != "finished" {
            excluded.push(format!(
                "rank {}: {} ({})",
                r.rank, run.record.status, run.record.detail
            ));
            continue;
        }
        if (train.len() as u32) < exp.outer.train_ranks {
            train.push(run);
        } else if (validation.len() as u32) < exp.outer.validation_ranks {
            validation.push(run);
        }
    }
    let sel = SelectionV1 {
        task: task_id.to_string(),
        cycle,
        ranking: ranked.id.into(),
        train: train.iter().map(|r| r.event.into()).collect(),
        validation: validation.iter().map(|r| r.event.into()).collect(),
        excluded,
    };
    let id = step(main, exp, schemas::to_event(&sel)?)?;
    Ok(Selected {
        id,
        ranking: ranked.id,
        train,
        validation,
    })
}
