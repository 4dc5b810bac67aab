//! Forking a run at any of its events.
//!
//! `fork_run` creates run `new` whose streams are refs to the source run's
//! events as they stood at the fork point: every stream with an event among the
//! fork point's causal ancestors (prev and parent links) gets a ref at its
//! latest such event. The new main stream continues from the fork point with a
//! `run.forked` event carrying the overrides. A fork point inside a unit of
//! work (a tool call in a rollout) continues from the last main-stream step
//! before that unit began, with the unit's stream kept up to the fork point.
//! Nothing is copied: the fork shares every id before the fork point, and the
//! source run's refs are untouched.

use std::collections::{BTreeMap, HashSet, VecDeque};

use ledger::{Id, Ledger, ObjectKind};
use schemas::{Hash32, Override, RunForked};

use crate::error::{ReplayError, Result};
use crate::session::{ref_name, EXECUTION, MAIN};

/// Creates run `new` from run `source` at event `at`: a step of its main
/// stream, or any event of one of its streams (the fork then continues from
/// the last step before that stream began, keeping the stream up to `at`, so
/// resuming the fork replays everything causally before `at` and goes live
/// from there). Returns the id of the `run.forked` event.
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
    let main_head = ledger
        .head(source)?
        .ok_or_else(|| bad(format!("no run named {source:?}")))?;
    let step = continue_from(ledger, source, at, &ev.stream, main_head)?;
    if ledger.head(new)?.is_some() {
        return Err(ReplayError::Ledger(ledger::LedgerError::Conflict {
            name: new.to_string(),
            expected: None,
            actual: ledger.head(new)?,
        }));
    }
    let latest = latest_per_stream(ledger, source, step, at)?;
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
    let id = b.append(new, Some(step), schemas::to_event(&rec)?.in_stream(MAIN))?;
    b.commit()?;
    Ok(id)
}

/// The main-stream step the fork continues from: `at` itself (checked to
/// be on the main stream of `source`, whose head is `main_head`), or, for
/// an event inside a unit of work (a tool call in a rollout, on `stream`),
/// the last step before that unit's stream began; the unit's stream is
/// kept up to `at` and goes live from there.
fn continue_from(ledger: &Ledger, source: &str, at: Id, stream: &str, main_head: Id) -> Result<Id> {
    let bad = |reason: String| ReplayError::BadFork { at, reason };
    if stream == MAIN {
        if !ledger
            .chain(main_head)
            .any(|e| e.map(|e| e.id == at).unwrap_or(false))
        {
            return Err(bad(format!(
                "it is not on the main stream of run {source:?}"
            )));
        }
        return Ok(at);
    }
    let stream_head = ledger
        .head(&ref_name(source, stream))?
        .ok_or_else(|| bad(format!("run {source:?} has no stream {stream:?}")))?;
    let mut first = None;
    let mut on_stream = false;
    for e in ledger.chain(stream_head) {
        let e = e?;
        on_stream |= e.id == at;
        first = Some(e.id);
    }
    if !on_stream {
        return Err(bad(format!(
            "it is not on stream {stream:?} of run {source:?}"
        )));
    }
    let first = first.ok_or_else(|| bad("empty stream".into()))?;
    let began = ordinal(ledger, &first)?;
    let mut before = None;
    for e in ledger.chain(main_head) {
        let e = e?;
        if ordinal(ledger, &e.id)? < began {
            before = Some(e.id);
            break;
        }
    }
    before.ok_or_else(|| bad("its stream began before the run's first step".into()))
}

/// The latest event of every stream among the causal ancestors of `step`
/// (and of `at`, when it is inside a unit of work), as (seq, id) by
/// stream name, plus the source's execution stream whole: how the source
/// is executed is no step's ancestor.
fn latest_per_stream(
    ledger: &Ledger,
    source: &str,
    step: Id,
    at: Id,
) -> Result<BTreeMap<String, (u64, Id)>> {
    let mut latest: BTreeMap<String, (u64, Id)> = BTreeMap::new();
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([step, at]);
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
    if let Some(h) = ledger.head(&ref_name(source, EXECUTION))? {
        latest.insert(EXECUTION.to_string(), (0, h));
    }
    Ok(latest)
}

fn ordinal(ledger: &Ledger, id: &Id) -> Result<u64> {
    Ok(ledger.locate(id)?.map(|l| l.ordinal).unwrap_or(u64::MAX))
}
