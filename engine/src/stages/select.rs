//! The select stage: from one task's ranking, the best `outer.train_ranks`
//! runs for training and the next `outer.validation_ranks` for validation,
//! skipping runs that did not finish and runs the guards flagged when the
//! policy says `no_train`. Every run left out is named with its reason in
//! the `mass.selection` record (those the guards excluded before judging
//! too), which it writes on the main stream.

use ledger::Id;
use replay::Stream;
use schemas::{Hash32, Selection};

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

/// Selects from task `task_id`'s ranking; `excluded` names the runs the
/// guards kept out of judging.
pub(crate) fn run<'r>(
    main: &mut Stream,
    exp: &mut Experiment,
    cycle: u32,
    task_id: &str,
    runs: &'r [RunRef],
    ranked: &Ranked,
    mut excluded: Vec<String>,
) -> Result<Selected<'r>> {
    let mut train = Vec::new();
    let mut validation = Vec::new();
    for r in &ranked.runs {
        let run = runs
            .iter()
            .find(|x| Hash32::from(x.event) == r.rollout)
            .ok_or_else(|| EngineError::Invalid("ranked run vanished".into()))?;
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
    let sel = Selection {
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
