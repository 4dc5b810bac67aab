//! Pull: bring runs from a remote into this ledger, all or nothing.
//!
//! What a run reaches is found from the remote's indexes (events list their
//! links there), then only the frames holding missing objects are fetched,
//! with byte-range reads; trees are read to find their blobs, fetched in a
//! second round. Every frame is checked against its index's BLAKE3, every
//! object against its id, every event's links against its index; only then
//! do the objects and the refs land, in one ledger commit. A ref this ledger
//! moved elsewhere (neither head contains the other) stops the pull before
//! anything is written.

use std::collections::{BTreeMap, HashMap, HashSet};

use ledger::{EventEnvelope, Id, Ledger, ObjectKind, Tree};

use crate::error::{RemoteError, Result};
use crate::pack::{self, Entry};
use crate::push::descends;
use crate::{Indexes, Progress, Remote, RunRecord};

/// How a pull changed one local ref.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefChange {
    Created {
        name: String,
        head: Id,
    },
    FastForward {
        name: String,
        from: Id,
        to: Id,
    },
    Unchanged {
        name: String,
    },
    /// This ledger's ref already holds the remote's head and more.
    LocalAhead {
        name: String,
    },
}

/// What a pull did.
#[derive(Debug, Default, Clone)]
pub struct PullReport {
    /// Whether blobs were left on the remote (a lazy pull).
    pub lazy: bool,
    pub runs: Vec<(String, Vec<RefChange>)>,
    pub objects: usize,
    /// Bytes of frames downloaded (indexes not counted).
    pub downloaded: u64,
}

struct Fetched {
    kind: ObjectKind,
    raw: Vec<u8>,
    meta: Vec<u8>,
}

/// Pulls `runs` (every run the remote holds when empty) into `ledger`.
pub fn pull(
    ledger: &Ledger,
    remote: &Remote,
    runs: &[String],
    progress: &dyn Progress,
) -> Result<PullReport> {
    pull_with(ledger, remote, runs, false, progress)
}

/// [`pull`], or with `lazy` a partial pull: every event and tree the runs
/// reach, but no blob (the ledger's reads fetch those through a
/// [`crate::Fetcher`]).
pub fn pull_with(
    ledger: &Ledger,
    remote: &Remote,
    runs: &[String],
    lazy: bool,
    progress: &dyn Progress,
) -> Result<PullReport> {
    remote.require_marker()?;
    let names = if runs.is_empty() {
        remote.runs()?
    } else {
        runs.to_vec()
    };
    let mut records = Vec::new();
    for run in &names {
        let (rec, _, _) = remote
            .read_run(run)?
            .ok_or_else(|| RemoteError::NoSuchRun {
                run: run.clone(),
                place: format!(
                    "on {} (`mass remote list`, then look at refs/ there)",
                    remote.location()
                ),
            })?;
        records.push(rec);
    }
    pull_records(ledger, remote, &records, lazy, None, progress)
}

/// What a caller of [`pull_heads`] may refuse a head for before anything
/// lands: the ref it would set and the event it names.
pub type HeadCheck<'a> = &'a dyn Fn(&str, &EventEnvelope) -> std::result::Result<(), String>;

/// Pulls the objects `heads` reach (ref name to head) and sets those refs
/// here, as a pull of a run record naming them would; `label` names them
/// in messages. Every head's event is shown to `check` first: a refusal
/// stops the pull with nothing written. How a work item's result lands in
/// the run that asked for it, and a work item's inputs in a worker.
pub fn pull_heads(
    ledger: &Ledger,
    remote: &Remote,
    label: &str,
    heads: &BTreeMap<String, Id>,
    lazy: bool,
    check: HeadCheck<'_>,
    progress: &dyn Progress,
) -> Result<PullReport> {
    remote.require_marker()?;
    let rec = RunRecord {
        format: crate::refs::RECORD_FORMAT.to_string(),
        run: label.to_string(),
        version: 0,
        heads: heads
            .iter()
            .map(|(n, id)| (n.clone(), id.to_hex()))
            .collect(),
        previous: None,
    };
    pull_records(ledger, remote, &[rec], lazy, Some(check), progress)
}

fn pull_records(
    ledger: &Ledger,
    remote: &Remote,
    records: &[RunRecord],
    lazy: bool,
    check: Option<HeadCheck<'_>>,
    progress: &dyn Progress,
) -> Result<PullReport> {
    let idx = remote.indexes(progress)?;
    let want = reachable(ledger, remote, &idx, records, lazy)?;
    progress.line(&format!(
        "{} object(s) to fetch from {}",
        want.len(),
        remote.location()
    ));
    let mut report = PullReport::default();
    let mut frames = FrameCache::new();
    let mut got = fetch(remote, &idx, &want, &mut frames, &mut report, progress)?;
    if !lazy {
        let blobs = tree_blobs(ledger, &idx, remote, &got)?;
        let more = fetch(remote, &idx, &blobs, &mut frames, &mut report, progress)?;
        got.extend(more);
    }
    check_links(&idx, &got)?;
    let heads = merged_heads(ledger, &got, records, remote)?;
    if let Some(check) = check {
        check_heads(ledger, &got, &heads, check)?;
    }
    let mut planned = Vec::new();
    for rec in records {
        planned.push((
            rec.run.clone(),
            plan_refs(ledger, &got, rec, &heads, remote)?,
        ));
    }
    let mut batch = ledger.batch();
    if lazy {
        batch.allow_absent_links();
    }
    for id in dependency_order(&got)? {
        if let Some(f) = got.remove(&id) {
            batch.put_raw(f.kind, f.raw, f.meta)?;
            report.objects += 1;
        }
    }
    for (run, changes) in planned {
        for c in &changes {
            match c {
                RefChange::Created { name, head } => batch.set_ref(name, None, *head)?,
                RefChange::FastForward { name, from, to } => {
                    batch.set_ref(name, Some(*from), *to)?
                }
                _ => {}
            }
        }
        report.runs.push((run, changes));
    }
    batch.commit()?;
    report.lazy = lazy;
    Ok(report)
}

/// Missing objects the records' heads reach, by the indexes' links.
fn reachable(
    ledger: &Ledger,
    remote: &Remote,
    idx: &Indexes,
    records: &[RunRecord],
    lazy: bool,
) -> Result<Vec<Id>> {
    let mut stack: Vec<(Id, String)> = Vec::new();
    for rec in records {
        for (name, head) in rec.head_ids() {
            stack.push((head, format!("ref {name} of run {}", rec.run)));
        }
    }
    let mut seen = HashSet::new();
    let mut want = Vec::new();
    // A full pull into a partial ledger also fills in the blobs that what
    // it already holds leaves on the remote: it walks through local objects.
    let fill = !lazy && ledger.is_partial();
    while let Some((id, what)) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        if ledger.contains(&id)? {
            if fill {
                for l in local_links(ledger, &id)? {
                    stack.push((l, format!("object {}", id.short(12))));
                }
            }
            continue;
        }
        let Some((_, p, e)) = idx.find(&id) else {
            return Err(RemoteError::MissingObject {
                what,
                id,
                location: remote.location().to_string(),
            });
        };
        if lazy && e.kind == ObjectKind::Blob {
            continue;
        }
        want.push(id);
        for l in p.links_of(e) {
            stack.push((*l, format!("event {}", id.short(12))));
        }
    }
    Ok(want)
}

/// What a stored object links to (an event's links, a tree's blobs).
fn local_links(ledger: &Ledger, id: &Id) -> Result<Vec<Id>> {
    Ok(match ledger.locate(id)?.map(|l| l.kind) {
        Some(ObjectKind::Event) => ledger.get_event(id)?.links().copied().collect(),
        Some(ObjectKind::Tree) => ledger
            .get_tree(id)?
            .entries
            .iter()
            .filter_map(ledger::TreeEntry::blob_id)
            .collect(),
        _ => Vec::new(),
    })
}

/// Frames already fetched and checked (pack key, frame number), so the
/// second round (trees' blobs) does not download them again.
pub(crate) type FrameCache = HashMap<(String, u32), std::sync::Arc<Vec<u8>>>;

/// Fetches and checks `ids`, frame by frame, pack by pack.
fn fetch(
    remote: &Remote,
    idx: &Indexes,
    ids: &[Id],
    cache: &mut FrameCache,
    report: &mut PullReport,
    progress: &dyn Progress,
) -> Result<HashMap<Id, Fetched>> {
    // pack key -> frame number -> entries wanted from it
    let mut by_pack: BTreeMap<&str, (&pack::PackIndex, BTreeMap<u32, Vec<&Entry>>)> =
        BTreeMap::new();
    for id in ids {
        if let Some((key, p, e)) = idx.find(id) {
            by_pack
                .entry(key)
                .or_insert((p, BTreeMap::new()))
                .1
                .entry(e.frame)
                .or_default()
                .push(e);
        }
    }
    let mut out = HashMap::with_capacity(ids.len());
    let packs = by_pack.len();
    for (n, (key, (p, frames))) in by_pack.into_iter().enumerate() {
        let shown = format!("{}/{key}", remote.location());
        let absent: Vec<u32> = frames
            .keys()
            .filter(|f| !cache.contains_key(&(key.to_string(), **f)))
            .copied()
            .collect();
        if !absent.is_empty() {
            fetch_frames(remote, key, &shown, p, &absent, cache, report)?;
        }
        for (f, entries) in &frames {
            let Some(raw) = cache.get(&(key.to_string(), *f)) else {
                continue;
            };
            for e in entries {
                let (raw_obj, meta) =
                    pack::extract(&shown, e, raw, !remote.unprotected.unchecked_frames)?;
                out.insert(
                    e.id,
                    Fetched {
                        kind: e.kind,
                        raw: raw_obj,
                        meta,
                    },
                );
            }
        }
        progress.line(&format!(
            "fetched {} of {} pack(s), {} bytes",
            n + 1,
            packs,
            report.downloaded
        ));
    }
    Ok(out)
}

/// Downloads frames `absent` of pack `key` (and its header, so every byte
/// of a pack that a pull reads is checked) into the cache.
pub(crate) fn fetch_frames(
    remote: &Remote,
    key: &str,
    shown: &str,
    p: &pack::PackIndex,
    absent: &[u32],
    cache: &mut FrameCache,
    report: &mut PullReport,
) -> Result<()> {
    let header_range = 0..pack::PACK_HEADER_LEN as u64;
    let mut ranges = Vec::with_capacity(absent.len() + 1);
    ranges.push(header_range);
    ranges.extend(absent.iter().map(|f| p.frames[*f as usize].range()));
    let bytes = remote.store().get_ranges(key, &ranges)?;
    let header = bytes.first().map(|b| b.as_ref()).unwrap_or_default();
    let checked = !remote.unprotected.unchecked_frames;
    if checked {
        pack::check_header(shown, p, header)?;
    }
    for (f, stored) in absent.iter().zip(bytes.iter().skip(1)) {
        report.downloaded += stored.len() as u64;
        let raw = pack::open_frame(shown, &p.frames[*f as usize], stored, checked)?;
        cache.insert((key.to_string(), *f), std::sync::Arc::new(raw));
    }
    Ok(())
}

/// Blobs the fetched trees name that neither this ledger nor the fetch has.
fn tree_blobs(
    ledger: &Ledger,
    idx: &Indexes,
    remote: &Remote,
    got: &HashMap<Id, Fetched>,
) -> Result<Vec<Id>> {
    let mut want = Vec::new();
    let mut seen = HashSet::new();
    for (id, f) in got {
        if f.kind != ObjectKind::Tree {
            continue;
        }
        for b in Tree::from_bytes(id, &f.raw)?
            .entries
            .iter()
            .filter_map(ledger::TreeEntry::blob_id)
        {
            if got.contains_key(&b) || !seen.insert(b) || ledger.contains(&b)? {
                continue;
            }
            if !idx.contains(&b) {
                return Err(RemoteError::MissingObject {
                    what: format!("tree {}", id.short(12)),
                    id: b,
                    location: remote.location().to_string(),
                });
            }
            want.push(b);
        }
    }
    Ok(want)
}

fn envelope_links(e: &EventEnvelope) -> Vec<Id> {
    e.prev
        .iter()
        .chain(e.parents.iter())
        .chain(e.refs.iter())
        .map(|b| Id(*b))
        .collect()
}

/// Every fetched event's links must be what its index said (the index is
/// what the pull trusted to find them).
fn check_links(idx: &Indexes, got: &HashMap<Id, Fetched>) -> Result<()> {
    for (id, f) in got {
        if f.kind != ObjectKind::Event {
            continue;
        }
        let env = EventEnvelope::from_bytes(id, &f.raw)?;
        if let Some((key, p, e)) = idx.find(id) {
            if p.links_of(e) != envelope_links(&env).as_slice() {
                return Err(RemoteError::Corrupt {
                    key: key.to_string(),
                    detail: format!(
                        "the index lists other links for event {id} than the event has"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Shows every head's event to `check` (fetched, or already here).
fn check_heads(
    ledger: &Ledger,
    got: &HashMap<Id, Fetched>,
    heads: &BTreeMap<String, (Id, String)>,
    check: HeadCheck<'_>,
) -> Result<()> {
    for (name, (id, by)) in heads {
        let env = match got.get(id) {
            Some(f) => EventEnvelope::from_bytes(id, &f.raw)?,
            None => {
                let ev = ledger.get_event(id)?;
                EventEnvelope {
                    kind: ev.kind,
                    version: ev.version,
                    stream: ev.stream,
                    seq: ev.seq,
                    prev: ev.prev.map(|p| p.0),
                    parents: ev.parents.iter().map(|p| p.0).collect(),
                    refs: ev.refs.iter().map(|p| p.0).collect(),
                    payload: ev.payload,
                }
            }
        };
        check(name, &env).map_err(|detail| RemoteError::Corrupt {
            key: by.clone(),
            detail: format!("ref {name} would name event {}: {detail}", id.short(12)),
        })?;
    }
    Ok(())
}

/// How each of the record's refs lands here; a ref that moved both here and
/// there is a conflict.
fn plan_refs(
    ledger: &Ledger,
    got: &HashMap<Id, Fetched>,
    rec: &RunRecord,
    heads: &BTreeMap<String, (Id, String)>,
    remote: &Remote,
) -> Result<Vec<RefChange>> {
    let mut out = Vec::new();
    for (name, _) in rec.head_ids() {
        // A ref two records name (runs `a` and `a/b`) is planned once, by
        // the first, with the head the records agree on.
        let Some((theirs, by)) = heads.get(&name).cloned() else {
            continue;
        };
        if by != rec.run {
            continue;
        }
        let change = match ledger.head(&name)? {
            None => RefChange::Created { name, head: theirs },
            Some(ours) if ours == theirs => RefChange::Unchanged { name },
            Some(ours) if chain_holds(ledger, got, theirs, ours)? => RefChange::FastForward {
                name,
                from: ours,
                to: theirs,
            },
            Some(ours) if descends(ledger, ours, theirs)? => RefChange::LocalAhead { name },
            Some(ours) => {
                return Err(RemoteError::Conflict {
                    run: rec.run.clone(),
                    detail: format!(
                        "ref {name} is at {} here and at {} on {}, and neither contains the other. Nothing was written. Keep yours under another name (`mass fork {} --name NEW`) or remove it (`mass runs rm {}`), then pull again",
                        ours.short(12),
                        theirs.short(12),
                        remote.location(),
                        ours.short(12),
                        rec.run
                    ),
                });
            }
        };
        out.push(change);
    }
    Ok(out)
}

/// Every ref the records name, with its head and the first run naming it.
/// Records may overlap (runs `a` and `a/b` both hold `a/b`): the later of
/// two heads on one chain wins, heads on different chains are a conflict.
/// Every head must be an event.
fn merged_heads(
    ledger: &Ledger,
    got: &HashMap<Id, Fetched>,
    records: &[RunRecord],
    remote: &Remote,
) -> Result<BTreeMap<String, (Id, String)>> {
    let mut heads: BTreeMap<String, (Id, String)> = BTreeMap::new();
    for rec in records {
        for (name, head) in rec.head_ids() {
            let kind = match got.get(&head) {
                Some(f) => Some(f.kind),
                None => ledger.kind_of(&head)?,
            };
            if kind != Some(ObjectKind::Event) {
                return Err(RemoteError::Corrupt {
                    key: format!(
                        "{}/{}",
                        remote.location(),
                        crate::refs::record_key(&rec.run)
                    ),
                    detail: format!("ref {name} names {head}, which is not an event"),
                });
            }
            let Some((other, by)) = heads.get(&name).cloned() else {
                heads.insert(name, (head, rec.run.clone()));
                continue;
            };
            if other == head || chain_holds(ledger, got, other, head)? {
                continue;
            }
            if !chain_holds(ledger, got, head, other)? {
                return Err(RemoteError::Conflict {
                    run: rec.run.clone(),
                    detail: format!(
                        "runs {by} and {} on {} give ref {name} heads on different chains ({} and {}); pull them one at a time",
                        rec.run,
                        remote.location(),
                        other.short(12),
                        head.short(12)
                    ),
                });
            }
            heads.insert(name, (head, by));
        }
    }
    Ok(heads)
}

/// The fetched objects, each after the fetched objects it links to (a
/// batch checks an object's links as it is added).
fn dependency_order(got: &HashMap<Id, Fetched>) -> Result<Vec<Id>> {
    let mut order = Vec::with_capacity(got.len());
    let mut done: HashSet<Id> = HashSet::with_capacity(got.len());
    // Blobs have no links and trees link only blobs: they go first.
    for kind in [ObjectKind::Blob, ObjectKind::Tree] {
        for (id, f) in got {
            if f.kind == kind {
                order.push(*id);
                done.insert(*id);
            }
        }
    }
    let mut roots: Vec<&Id> = got
        .iter()
        .filter(|(_, f)| f.kind == ObjectKind::Event)
        .map(|(id, _)| id)
        .collect();
    roots.sort();
    for root in roots {
        let mut stack = vec![(*root, false)];
        while let Some((id, expanded)) = stack.pop() {
            if expanded {
                order.push(id);
                continue;
            }
            if !done.insert(id) {
                continue;
            }
            stack.push((id, true));
            let env = EventEnvelope::from_bytes(&id, &got[&id].raw)?;
            for l in envelope_links(&env) {
                if got.get(&l).is_some_and(|f| f.kind == ObjectKind::Event) && !done.contains(&l) {
                    stack.push((l, false));
                }
            }
        }
    }
    Ok(order)
}

/// Whether the chain from `head` (fetched or local events) holds `ancestor`.
fn chain_holds(
    ledger: &Ledger,
    got: &HashMap<Id, Fetched>,
    head: Id,
    ancestor: Id,
) -> Result<bool> {
    let target = seq_and_prev(ledger, got, ancestor)?.0;
    let mut at = Some(head);
    while let Some(id) = at {
        if id == ancestor {
            return Ok(true);
        }
        let (seq, prev) = seq_and_prev(ledger, got, id)?;
        if seq <= target {
            return Ok(false);
        }
        at = prev;
    }
    Ok(false)
}

/// An event's place in its stream, fetched or stored.
fn seq_and_prev(ledger: &Ledger, got: &HashMap<Id, Fetched>, id: Id) -> Result<(u64, Option<Id>)> {
    Ok(match got.get(&id) {
        Some(f) => {
            let env = EventEnvelope::from_bytes(&id, &f.raw)?;
            (env.seq, env.prev.map(Id))
        }
        None => {
            let ev = ledger.get_event(&id)?;
            (ev.seq, ev.prev)
        }
    })
}
