//! Removing a run: deleting its refs (the main ref `R` and every ref under
//! `R/`) by compare-and-swap, in the same batch as a `run.removed` record
//! appended to the ledger-level stream [`REMOVALS`]. No object is deleted:
//! the record names every removed ref with its old head (and links those
//! heads), so the run stays readable by id and the removal is auditable
//! with `mass log mass/runs`.

use ledger::{Id, Ledger, LedgerError};
use schemas::{Hash32, RemovedRef, RunRemoved};

use crate::error::Result;

/// The ref of the ledger-level stream that records removed runs. It is never
/// counted among a run's refs, even for a run named `mass`.
pub const REMOVALS: &str = "mass/runs";

/// The refs of run `run` and their heads, sorted by name: the main ref and
/// every ref under `run/` (except [`REMOVALS`]).
pub fn run_refs(ledger: &Ledger, run: &str) -> Result<Vec<(String, Id)>> {
    let prefix = format!("{run}/");
    Ok(ledger
        .refs()?
        .into_iter()
        .filter(|(name, _)| (name == run || name.starts_with(&prefix)) && name != REMOVALS)
        .collect())
}

/// What [`remove_run`] did.
#[derive(Debug, Clone)]
pub struct Removed {
    /// The `run.removed` event in [`REMOVALS`].
    pub event: Id,
    /// The run's main head before the removal (`None` if it had only
    /// stream refs).
    pub main_head: Option<Id>,
    /// Every ref removed, with the head it had.
    pub refs: Vec<(String, Id)>,
}

/// Deletes every ref of run `run` and records why (`reason`) in
/// [`REMOVALS`], atomically. Fails with `NoSuchRef` if the run has no refs,
/// and with `Conflict` (nothing changed) if a ref moved meanwhile.
pub fn remove_run(ledger: &Ledger, run: &str, reason: &str) -> Result<Removed> {
    ledger::check_ref_name(run)?;
    let refs = run_refs(ledger, run)?;
    if refs.is_empty() {
        return Err(LedgerError::NoSuchRef {
            name: run.to_string(),
        }
        .into());
    }
    let rec = RunRemoved {
        run: run.to_string(),
        reason: reason.to_string(),
        refs: refs
            .iter()
            .map(|(name, head)| RemovedRef {
                name: name.clone(),
                head: Hash32(head.0),
            })
            .collect(),
    };
    let mut b = ledger.batch();
    for (name, head) in &refs {
        b.delete_ref(name, *head)?;
    }
    let ev = schemas::to_event(&rec)?;
    let expected = ledger.head(REMOVALS)?;
    let event = b.append(REMOVALS, expected, ev)?;
    b.commit()?;
    Ok(Removed {
        event,
        main_head: refs.iter().find(|(n, _)| n == run).map(|(_, h)| *h),
        refs,
    })
}
