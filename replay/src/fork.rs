//! Forking a run at a step boundary of its main stream.
//!
//! `fork_run` creates run `new` whose streams are refs to the source run's
//! events as they stood at the fork point: every stream with an event among the
//! fork point's causal ancestors (prev and parent links) gets a ref at its
//! latest such event. The new main stream continues from the fork point with a
//! `run.forked` event carrying the overrides. Nothing is copied: the fork
//! shares every id before the fork point, and the source run's refs are untouched.

use std::collections::{BTreeMap, HashSet, VecDeque};

use ledger::{Id, Ledger, ObjectKind};
use schemas::{Hash32, Override, RunForked};

use crate::error::{ReplayError, Result};
use crate::session::{ref_name, MAIN};

/// Creates run `new` from run `source` at main-stream event `at`; returns the
/// id of the `run.forked` event.
pub fn fork_run(
    ledger: &Ledger,
    source: &str,
    at: Id,
    new: &str,
    overrides: &[(String, String)],
) -> Result<Id> {
    let bad = |reason: String| ReplayError::BadFork { at, reason };
    match ledger.kind_of(&at)? {
        Some(ObjectKind::Event) => {}
        Some(k) => return Err(bad(format!("it is a {k}, not an event"))),
        None => return Err(bad("no such object".into())),
    }
    let ev = ledger.get_event(&at)?;
    if ev.stream != MAIN {
        return Err(bad(format!(
            "it belongs to stream {:?}; runs fork at events of their main stream (step boundaries) — `mass log {source}` lists them",
            ev.stream
        )));
    }
    // The fork point must be on the source run's main stream.
    let main_head = ledger
        .head(source)?
        .ok_or_else(|| bad(format!("no run named {source:?}")))?;
    if !ledger
        .chain(main_head)
        .any(|e| e.map(|e| e.id == at).unwrap_or(false))
    {
        return Err(bad(format!(
            "it is not on the main stream of run {source:?}"
        )));
    }
    if ledger.head(new)?.is_some() {
        return Err(ReplayError::Ledger(ledger::LedgerError::Conflict {
            name: new.to_string(),
            expected: None,
            actual: ledger.head(new)?,
        }));
    }
    // Latest event of every stream among the causal ancestors of `at`.
    let mut latest: BTreeMap<String, (u64, Id)> = BTreeMap::new();
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([at]);
    while let Some(id) = queue.pop_front() {
        if !seen.insert(id) {
            continue;
        }
        let e = ledger.get_event(&id)?;
        let slot = latest.entry(e.stream.clone()).or_insert((e.seq, id));
        if e.seq > slot.0 {
            *slot = (e.seq, id);
        }
        for p in e.prev.iter().chain(e.parents.iter()) {
            if ledger.kind_of(p)? == Some(ObjectKind::Event) {
                queue.push_back(*p);
            }
        }
    }
    let mut b = ledger.batch();
    for (stream, (_, id)) in &latest {
        b.set_ref(&ref_name(new, stream), None, *id)?;
    }
    let rec = RunForked {
        source_run: source.to_string(),
        at: Hash32(at.0),
        overrides: overrides
            .iter()
            .map(|(k, v)| Override {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
    };
    let id = b.append(new, Some(at), schemas::to_event(&rec)?.in_stream(MAIN))?;
    b.commit()?;
    Ok(id)
}
