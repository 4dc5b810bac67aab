//! What the store says about a run's workers, for `mass status --workers
//! URL`: each worker's last heartbeat (its age by this machine's clock, so
//! only as good as the clocks agree), and the items published, claimed,
//! done and failed, with each claim's holder and attempt.

use std::collections::BTreeSet;

use remote::Store;

use crate::error::Result;
use crate::wire::{self, Claim, WorkResult, WorkerBeat};

/// A summary of the work on a store.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub workers: Vec<WorkerBeat>,
    pub items: usize,
    pub done: usize,
    pub failed: usize,
    /// Items with a claim and no result: (job, holder, attempt, released).
    pub claimed: Vec<(String, String, u32, bool)>,
    /// Failed attempts recorded (including those later retried).
    pub attempts: usize,
    /// Objects under `work/` this build cannot read (named, not fatal).
    pub unreadable: Vec<String>,
}

/// Reads the work on `store`.
pub fn read(store: &Store) -> Result<Summary> {
    let mut s = Summary::default();
    let items: BTreeSet<String> = store
        .list("work/items")?
        .iter()
        .filter_map(|k| wire::job_of(k, "work/items"))
        .collect();
    s.items = items.len();
    let mut finished = BTreeSet::new();
    for key in store.list("work/results")? {
        let Some(job) = wire::job_of(&key, "work/results") else {
            continue;
        };
        if let Some((bytes, _)) = store.get(&key)? {
            let Ok(r) = wire::parse::<WorkResult>(&key, &bytes) else {
                s.unreadable.push(key);
                continue;
            };
            if r.outcome == "done" {
                s.done += 1;
            } else {
                s.failed += 1;
            }
            finished.insert(job);
        }
    }
    for key in store.list("work/claims")? {
        let Some(job) = wire::job_of(&key, "work/claims") else {
            continue;
        };
        if finished.contains(&job) {
            continue;
        }
        if let Some((bytes, _)) = store.get(&key)? {
            match wire::parse::<Claim>(&key, &bytes) {
                Ok(c) => s.claimed.push((job, c.worker, c.attempt, c.released)),
                Err(_) => s.unreadable.push(key),
            }
        }
    }
    s.attempts = store.list("work/attempts")?.len();
    for key in store.list("work/workers")? {
        if let Some((bytes, _)) = store.get(&key)? {
            match wire::parse::<WorkerBeat>(&key, &bytes) {
                Ok(w) => s.workers.push(w),
                Err(_) => s.unreadable.push(key),
            }
        }
    }
    Ok(s)
}
