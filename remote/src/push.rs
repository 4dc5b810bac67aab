//! Push: upload what a remote lacks of some runs, then move their records.
//!
//! Order matters for crash safety: every pack (and then its index, which is
//! what makes a pack visible) is written before any run record names what
//! it holds. Objects go out in dependency order (an object after everything
//! it links to), cut into packs in that order, so whatever prefix of a push
//! survives a kill is closed under links and a later push can trust "the
//! remote has X" to mean "and everything X reaches".

use std::collections::{BTreeMap, HashSet};

use bytes::Bytes;
use ledger::{Id, Ledger, ObjectKind};

use crate::error::{RemoteError, Result};
use crate::pack::PackBuilder;
use crate::refs::{self, RunRecord, RECORD_FORMAT};
use crate::{Indexes, Progress, Remote};

/// Raw bytes per pack before it is cut (packs are uploaded whole);
/// `MASS_REMOTE_PACK_BYTES` changes it (tests use small packs).
pub const PACK_TARGET: u64 = 64 << 20;

fn pack_target() -> u64 {
    std::env::var("MASS_REMOTE_PACK_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(PACK_TARGET)
}

/// What a push did.
#[derive(Debug, Default, Clone)]
pub struct PushReport {
    /// Per run: refs the remote now has, and whether its record changed.
    pub runs: Vec<(String, usize, bool)>,
    pub objects: usize,
    pub packs: usize,
    /// Bytes of packs and indexes this push wrote.
    pub uploaded: u64,
}

/// Pushes `runs` (every run when empty) of `ledger` to `remote`.
pub fn push(
    ledger: &Ledger,
    remote: &Remote,
    runs: &[String],
    progress: &dyn Progress,
) -> Result<PushReport> {
    remote.ensure_marker()?;
    let plan = plan_runs(ledger, remote, runs)?;
    let have = remote.indexes(progress)?;
    let heads: Vec<Id> = plan
        .iter()
        .flat_map(|p| p.local.iter().map(|(_, id)| *id))
        .collect();
    let order = missing_in_order(ledger, &have, &heads)?;
    progress.line(&format!(
        "{} object(s) to upload to {}",
        order.len(),
        remote.location()
    ));
    let mut report = upload(ledger, remote, &order, progress)?;
    for p in plan {
        let n = p.merged.len();
        let changed = update_record(remote, &p)?;
        report.runs.push((p.run, n, changed));
    }
    Ok(report)
}

/// Uploads what the remote lacks of everything `heads` reach, with no run
/// record: objects that another process names by id (a worker's result, a
/// work item's inputs). Same order and packs as [`push`].
pub fn push_objects(
    ledger: &Ledger,
    remote: &Remote,
    heads: &[Id],
    progress: &dyn Progress,
) -> Result<PushReport> {
    remote.ensure_marker()?;
    let have = remote.indexes(progress)?;
    let order = missing_in_order(ledger, &have, heads)?;
    upload(ledger, remote, &order, progress)
}

struct RunPlan {
    run: String,
    local: Vec<(String, Id)>,
    current: Option<(RunRecord, crate::Version, String)>,
    merged: BTreeMap<String, String>,
}

/// The refs of each run, checked against the remote's record: every ref the
/// remote has must be at or behind this ledger's.
fn plan_runs(ledger: &Ledger, remote: &Remote, runs: &[String]) -> Result<Vec<RunPlan>> {
    let all = ledger.refs()?;
    let theirs = remote.runs()?;
    let names = if runs.is_empty() {
        top_runs(&all)
    } else {
        runs.to_vec()
    };
    let mut out = Vec::new();
    for run in names {
        let local: Vec<(String, Id)> = all
            .iter()
            .filter(|(n, _)| refs::in_run(&run, n))
            .cloned()
            .collect();
        if local.is_empty() {
            return Err(RemoteError::NoSuchRun {
                run,
                place: "in this ledger (`mass refs` lists refs)".into(),
            });
        }
        // Records must not overlap: one ref, one record.
        if let Some(other) = theirs
            .iter()
            .find(|o| **o != run && (refs::in_run(o, &run) || refs::in_run(&run, o)))
        {
            return Err(RemoteError::Nested {
                run,
                other: other.clone(),
                location: remote.location().to_string(),
            });
        }
        let current = remote.read_run(&run)?;
        let mut merged: BTreeMap<String, String> = current
            .as_ref()
            .map(|c| c.0.heads.clone())
            .unwrap_or_default();
        if let Some((rec, _, _)) = &current {
            for (name, theirs) in rec.head_ids() {
                let Some(ours) = local.iter().find(|(n, _)| *n == name).map(|(_, id)| *id) else {
                    continue;
                };
                if !descends(ledger, ours, theirs)? {
                    return Err(behind(remote, &run, &name, theirs, ours));
                }
            }
        }
        for (n, id) in &local {
            merged.insert(n.clone(), id.to_hex());
        }
        out.push(RunPlan {
            run,
            local,
            current,
            merged,
        });
    }
    Ok(out)
}

fn behind(remote: &Remote, run: &str, name: &str, theirs: Id, ours: Id) -> RemoteError {
    RemoteError::Conflict {
        run: run.to_string(),
        detail: format!(
            "{} has ref {name} at {}, which this ledger's {} does not contain (someone pushed more of this run). Nothing was changed on the remote. `mass pull {} {run}` brings theirs in if yours is behind; if both moved, keep yours under another name (`mass fork {} --name NEW`) and push that",
            remote.location(),
            theirs.short(12),
            ours.short(12),
            remote.location(),
            ours.short(12),
        ),
    }
}

/// Runs named by their top refs: a ref none of whose `/`-prefixes is a ref.
pub fn top_runs(refs: &[(String, Id)]) -> Vec<String> {
    let names: HashSet<&str> = refs.iter().map(|(n, _)| n.as_str()).collect();
    let mut out: Vec<String> = refs
        .iter()
        .filter(|(n, _)| !n.match_indices('/').any(|(i, _)| names.contains(&n[..i])))
        .map(|(n, _)| n.clone())
        .collect();
    out.sort();
    out
}

/// Whether event `head`'s chain holds `ancestor` (or is it).
pub(crate) fn descends(ledger: &Ledger, head: Id, ancestor: Id) -> Result<bool> {
    if head == ancestor {
        return Ok(true);
    }
    if !ledger.contains(&ancestor)? {
        return Ok(false);
    }
    let target_seq = ledger.get_event(&ancestor)?.seq;
    for ev in ledger.chain(head) {
        let ev = ev?;
        if ev.id == ancestor {
            return Ok(true);
        }
        if ev.seq <= target_seq {
            return Ok(false);
        }
    }
    Ok(false)
}

/// The objects `heads` reach that the remote lacks, each after everything
/// it links to (iterative depth-first post-order).
fn missing_in_order(
    ledger: &Ledger,
    have: &Indexes,
    heads: &[Id],
) -> Result<Vec<(Id, ObjectKind)>> {
    let mut seen: HashSet<Id> = HashSet::new();
    let mut order = Vec::new();
    // (id, children pushed?)
    let mut stack: Vec<(Id, bool)> = heads.iter().rev().map(|h| (*h, false)).collect();
    while let Some((id, expanded)) = stack.pop() {
        if expanded {
            let kind = ledger.kind_of(&id)?.ok_or(ledger::LedgerError::NotFound {
                prefix: id.to_hex(),
            })?;
            order.push((id, kind));
            continue;
        }
        if have.contains(&id) || !seen.insert(id) {
            continue;
        }
        stack.push((id, true));
        for child in links_of(ledger, &id)?.into_iter().rev() {
            if !have.contains(&child) && !seen.contains(&child) {
                stack.push((child, false));
            }
        }
    }
    Ok(order)
}

/// What an object links to: an event's prev, parents and refs; a tree's blobs.
fn links_of(ledger: &Ledger, id: &Id) -> Result<Vec<Id>> {
    match ledger.kind_of(id)? {
        Some(ObjectKind::Event) => Ok(ledger.get_event(id)?.links().copied().collect()),
        Some(ObjectKind::Tree) => Ok(ledger
            .get_tree(id)?
            .entries
            .iter()
            .filter_map(ledger::TreeEntry::blob_id)
            .collect()),
        Some(ObjectKind::Blob) => Ok(Vec::new()),
        None => Err(ledger::LedgerError::NotFound {
            prefix: id.to_hex(),
        }
        .into()),
    }
}

/// Writes `order` as packs of about [`PACK_TARGET`] raw bytes, each pack
/// before its index.
fn upload(
    ledger: &Ledger,
    remote: &Remote,
    order: &[(Id, ObjectKind)],
    progress: &dyn Progress,
) -> Result<PushReport> {
    let mut report = PushReport::default();
    let mut b = PackBuilder::new();
    let target = pack_target();
    for (i, (id, kind)) in order.iter().enumerate() {
        let (_, raw) = ledger.raw_object(id)?;
        let (meta, links) = if *kind == ObjectKind::Event {
            let m = serde_json::to_vec(&ledger.get_meta(id)?).unwrap_or_default();
            (
                m,
                ledger.get_event(id)?.links().copied().collect::<Vec<_>>(),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        b.add(*id, *kind, &raw, &meta, &links);
        if b.raw_len() >= target || i + 1 == order.len() {
            let full = std::mem::take(&mut b);
            send_pack(remote, full, &mut report)?;
            progress.line(&format!(
                "uploaded {} of {} object(s) in {} pack(s), {} bytes",
                i + 1,
                order.len(),
                report.packs,
                report.uploaded
            ));
        }
    }
    Ok(report)
}

fn send_pack(remote: &Remote, b: PackBuilder, report: &mut PushReport) -> Result<()> {
    let built = b.finish();
    let name = hex::encode(built.id);
    let (plen, ilen) = (built.pack.len() as u64, built.idx.len() as u64);
    remote
        .store()
        .create(&format!("packs/{name}.pack"), Bytes::from(built.pack))?;
    remote
        .store()
        .create(&format!("packs/{name}.idx"), Bytes::from(built.idx))?;
    report.objects += built.objects;
    report.packs += 1;
    report.uploaded += plen + ilen;
    Ok(())
}

/// Writes the run's new record (history first), by compare-and-swap.
fn update_record(remote: &Remote, p: &RunPlan) -> Result<bool> {
    if p.current
        .as_ref()
        .is_some_and(|(rec, _, _)| rec.heads == p.merged)
    {
        return Ok(false);
    }
    let rec = RunRecord {
        format: RECORD_FORMAT.into(),
        run: p.run.clone(),
        version: p.current.as_ref().map_or(1, |(r, _, _)| r.version + 1),
        heads: p.merged.clone(),
        previous: p.current.as_ref().map(|(_, _, hash)| hash.clone()),
    };
    let bytes = rec.to_bytes();
    let hash = blake3::hash(&bytes).to_hex().to_string();
    remote.store().create(
        &refs::history_key(&p.run, &hash),
        Bytes::from(bytes.clone()),
    )?;
    let expected = p.current.as_ref().map(|(_, v, _)| v);
    if remote.unprotected.unconditional_refs {
        remote
            .store()
            .overwrite(&refs::record_key(&p.run), Bytes::from(bytes))?;
        return Ok(true);
    }
    if !remote
        .store()
        .swap(&refs::record_key(&p.run), Bytes::from(bytes), expected)?
    {
        return Err(RemoteError::Conflict {
            run: p.run.clone(),
            detail: format!(
                "another push moved it on {} while this one ran; nothing was lost (the packs this push uploaded stay there and are reused). `mass pull {} {}` brings theirs in; if both moved, keep yours under another name (`mass fork`) and push that",
                remote.location(),
                remote.location(),
                p.run
            ),
        });
    }
    Ok(true)
}
