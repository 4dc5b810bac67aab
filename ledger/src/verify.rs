//! Full-ledger integrity checks (`mass verify`) and storage statistics (`mass stats`).
//!
//! `verify` reads every segment sequentially, re-hashes every object, validates
//! every event envelope and tree, checks that every link points to an object
//! written earlier in the log (objects are only accepted once their links
//! exist, so log order is a topological order), and cross-checks the index and
//! the refs against what the log says. It reports problems with object ids and
//! keeps going; it never panics on damaged bytes.

use std::collections::{HashMap, HashSet};

use crate::error::{LedgerError, Result};
use crate::id::{Id, ObjectKind};
use crate::object::{Event, EventEnvelope, RefUpdate};
use crate::segment::{self, decode_body, At, HeaderRead, RecordType, SegmentFile};
use crate::store::Ledger;
use crate::tree::{EntryKind, Tree};

/// One thing `verify` found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The object concerned, when known.
    pub id: Option<Id>,
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.id {
            Some(id) => write!(f, "{id}: {}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    pub blobs: u64,
    pub trees: u64,
    pub events: u64,
    pub refs: u64,
    pub records: u64,
    pub bytes_scanned: u64,
    /// Damaged ranges an earlier `mass repair` set aside (listed in
    /// `quarantine/damaged.jsonl`), stepped over rather than reported again.
    /// What depended on their objects still shows up as dangling links.
    pub set_aside: u64,
    /// Objects linked to but not stored here that `VerifyOptions::absent_ok`
    /// allowed (a lazy clone's blobs, left on its remote), counted once each.
    pub absent: u64,
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
    pub fn objects(&self) -> u64 {
        self.blobs + self.trees + self.events
    }
}

/// A hook that checks an event's payload (the CLI passes the schema registry).
pub type PayloadCheck<'a> = &'a dyn Fn(&Event) -> std::result::Result<(), String>;

/// What `verify` covers besides the log itself.
#[derive(Debug, Clone, Copy)]
pub struct VerifyOptions {
    /// Cross-check every index entry against the log (one ordered pass over
    /// the index). The log is checked either way.
    pub index: bool,
    /// A partial ledger (a lazy clone): an event's ref or a tree's entry
    /// naming an object not stored here is counted in
    /// [`VerifyReport::absent`] instead of being a problem (its remote holds
    /// it). A missing prev or parent is a problem either way.
    pub absent_ok: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            index: true,
            absent_ok: false,
        }
    }
}

impl Ledger {
    /// Checks everything; `check_payload` validates event payloads by kind/version.
    pub fn verify(&self, check_payload: PayloadCheck<'_>) -> Result<VerifyReport> {
        self.verify_with(check_payload, VerifyOptions::default())
    }

    /// `verify` with options: the log alone (every record, hash, link and
    /// payload) or the log and the index.
    pub fn verify_with(
        &self,
        check_payload: PayloadCheck<'_>,
        opts: VerifyOptions,
    ) -> Result<VerifyReport> {
        // The end of the scan and the refs it is compared with are taken
        // together: a commit racing the scan (another thread of this
        // process) moves neither.
        let ((end_seg, end_off), refs) = self.committed_end_and_refs()?;
        // With the index check: every indexed object, read in one ordered pass
        // (a random lookup per object was the scan's bottleneck), keyed by a
        // 16-byte id prefix to keep 1M objects well under 100 MB. Read after
        // the end of the scan is fixed, so a commit racing the scan can only add
        // index entries beyond it, which are ignored below. Without it, the
        // table fills from the log as the scan goes.
        let seen = if opts.index {
            Seen::from_index(self)?
        } else {
            Seen::with_capacity(self.object_count()? as usize)
        };
        let mut st = Walk {
            seen,
            pending: Vec::new(),
            refs_from_log: HashMap::new(),
            absent: HashSet::new(),
            r: VerifyReport::default(),
        };
        let set_aside = crate::open::read_damaged(self.dir())?;
        let segs: Vec<u32> = segment::list_segments(self.segment_dir())?
            .into_iter()
            .filter(|&s| s <= end_seg)
            .collect();
        for &seg in &segs {
            let bound = (seg == end_seg).then_some(end_off);
            self.verify_segment(seg, bound, &set_aside, &mut st, check_payload, opts)?;
            // Records after the last commit marker of a sealed segment (its
            // marker damaged): the next segment shows the writer moved on.
            if seg != end_seg {
                st.apply_refs();
            }
        }
        let Walk {
            seen,
            refs_from_log,
            absent,
            mut r,
            ..
        } = st;
        // Absent when linked, and still absent at the end (a full pull into
        // a partial ledger stores blobs after the events naming them).
        r.absent = absent
            .iter()
            .filter(|id| seen.kind_seen(id).is_none())
            .count() as u64;
        // Index entries must point at records the scan met.
        for (k, slot) in seen.map.iter().filter(|_| seen.from_index) {
            let within = slot.seg < end_seg || (slot.seg == end_seg && slot.offset < end_off);
            if within && !slot.seen {
                r.problems.push(Problem {
                    id: None,
                    what: format!(
                        "the index places object {}... at segment {} offset {}, where the log has no readable record (if the log is intact, `mass reindex` rebuilds the index; if the record is damaged, `mass repair` sets it aside)",
                        hex::encode(k),
                        slot.seg,
                        slot.offset
                    ),
                });
            }
        }
        check_refs(&refs, &refs_from_log, &mut r);
        Ok(r)
    }

    /// Checks every record of one segment up to `bound` (its whole length
    /// when `None`), stepping over listed ranges and naming any other bad
    /// bytes.
    fn verify_segment(
        &self,
        seg: u32,
        bound: Option<u64>,
        set_aside: &[crate::recovery::Damage],
        st: &mut Walk,
        check_payload: PayloadCheck<'_>,
        opts: VerifyOptions,
    ) -> Result<()> {
        let path = segment::segment_path(self.segment_dir(), seg);
        let mut f = SegmentFile::open(&path, seg, *self.salt())?;
        let listed = |off: u64| {
            set_aside
                .iter()
                .find(|d| d.segment == seg && d.offset == off)
        };
        if let HeaderRead::Damaged(why) = f.header()? {
            match listed(0) {
                Some(_) => st.r.set_aside += 1,
                None => st.r.problems.push(Problem {
                    id: None,
                    what: format!("segment header of {}: {why}", path.display()),
                }),
            }
        }
        let bound = bound.unwrap_or(f.file_len());
        let mut at = segment::SEGMENT_HEADER_LEN;
        loop {
            // A listed range (a tail, or damage a writer or `repair` set
            // aside) is stepped over whole: a tail may hold intact records
            // that were never committed.
            if let Some(d) = listed(at).filter(|d| d.len > 0) {
                st.r.set_aside += 1;
                at = (d.offset + d.len).min(bound).max(at + 1);
                continue;
            }
            let (reason, len, claimed_id) = match f.read_at(at, bound)? {
                At::End => return Ok(()),
                At::Record(rec) => {
                    at = rec.offset + rec.header.total_len();
                    st.r.records += 1;
                    st.r.bytes_scanned += rec.header.total_len();
                    self.verify_record(rec, seg, &path, st, check_payload, opts);
                    continue;
                }
                At::Bad {
                    reason,
                    len,
                    claimed_id,
                } => (reason, len, claimed_id),
            };
            st.r.problems.push(Problem {
                id: claimed_id,
                what: format!(
                    "unreadable record in {} at byte {at}: {reason}",
                    path.display()
                ),
            });
            // Step to the next record (the same rule every scan uses); if
            // none, name what the index says lived there.
            at = match len {
                Some(l) => at + l,
                None => match f.next_header(at, bound)? {
                    Some(n) => n,
                    None => {
                        self.blame_rest(seg, at, &mut st.r)?;
                        return Ok(());
                    }
                },
            };
        }
    }

    /// One intact record: ref updates wait for their commit marker;
    /// objects are re-hashed and their links and payload checked.
    fn verify_record(
        &self,
        rec: segment::ScannedRecord,
        seg: u32,
        path: &std::path::Path,
        st: &mut Walk,
        check_payload: PayloadCheck<'_>,
        opts: VerifyOptions,
    ) {
        match rec.header.rtype {
            RecordType::Commit => st.apply_refs(),
            RecordType::RefUpdate => match RefUpdate::from_bytes(&rec.body) {
                Ok(u) => {
                    let new = u.new_head();
                    if let Some(id) = new {
                        if st.seen.kind_seen(&id) != Some(ObjectKind::Event) {
                            st.r.problems.push(Problem {
                                id: Some(id),
                                what: format!(
                                    "ref {:?} points to an event not written before it",
                                    u.name
                                ),
                            });
                        }
                    }
                    st.pending.push(PendingRef { name: u.name, new });
                }
                Err(e) => st.r.problems.push(Problem {
                    id: None,
                    what: format!(
                        "ref update at byte {} of {}: {e}",
                        rec.offset,
                        path.display()
                    ),
                }),
            },
            RecordType::Object(kind) => {
                let id = rec.header.id;
                let absent = std::cell::RefCell::new(Vec::new());
                let checks = Checks {
                    payload: check_payload,
                    absent: opts.absent_ok.then_some(&absent),
                    place: std::cell::RefCell::new(None),
                };
                if let Err(what) = self.check_object(kind, &id, &rec, seg, &st.seen, &checks) {
                    st.r.problems.push(Problem { id: Some(id), what });
                }
                if let Some((stream, seq)) = checks.place.into_inner() {
                    st.seen.note_place(&id, stream, seq);
                }
                st.absent.extend(absent.into_inner());
                match kind {
                    ObjectKind::Blob => st.r.blobs += 1,
                    ObjectKind::Tree => st.r.trees += 1,
                    ObjectKind::Event => st.r.events += 1,
                }
                if opts.index {
                    st.seen.mark(&id);
                } else {
                    st.seen.insert_seen(&id, seg, rec.offset, kind);
                }
            }
        }
    }

    fn check_object(
        &self,
        kind: ObjectKind,
        id: &Id,
        rec: &segment::ScannedRecord,
        seg: u32,
        seen: &Seen,
        checks: &Checks<'_>,
    ) -> std::result::Result<(), String> {
        let (check_payload, absent_ok) = (checks.payload, checks.absent);
        let h = &rec.header;
        let raw = match segment::dict_of(id, h.flags, &rec.body).map_err(|e| e.to_string())? {
            None => decode_body(id, h.flags, h.raw_len, &rec.body).map_err(|e| e.to_string())?,
            Some(base) => {
                if seen.kind_seen(&base) != Some(kind) {
                    return Err(format!(
                        "delta base {base} is not a {kind} stored before it"
                    ));
                }
                let (_, dict) = self
                    .raw_object(&base)
                    .map_err(|e| format!("delta base {}: {e}", base.short(12)))?;
                segment::decode_body_with_dict(id, h.raw_len, &rec.body, &dict)
                    .map_err(|e| e.to_string())?
            }
        };
        let actual = Id::of(kind, &raw);
        if actual != *id {
            return Err(format!("content hashes to {actual}"));
        }
        if seen.from_index {
            match seen.slot(id) {
                Some(slot) if slot.seg == seg && slot.offset == rec.offset => {}
                Some(slot) => {
                    return Err(format!(
                        "index places it at segment {} offset {}, log at segment {seg} offset {}",
                        slot.seg, slot.offset, rec.offset
                    ))
                }
                None => return Err("missing from the index (run `mass reindex`)".into()),
            }
        }
        let need = |l: &Id, what: &str| -> std::result::Result<(), String> {
            if seen.kind_seen(l).is_some() {
                Ok(())
            } else {
                Err(format!(
                    "{what} {l} is not stored before it (dangling reference)"
                ))
            }
        };
        // A ref or a tree entry a partial ledger leaves on its remote.
        let may_lack = |l: &Id, what: &str| -> std::result::Result<(), String> {
            match (seen.kind_seen(l), absent_ok) {
                (None, Some(n)) => {
                    n.borrow_mut().push(*l);
                    Ok(())
                }
                _ => need(l, what),
            }
        };
        match kind {
            ObjectKind::Blob => {}
            ObjectKind::Tree => {
                let t = Tree::from_bytes(id, &raw).map_err(|e| e.to_string())?;
                for e in &t.entries {
                    if e.kind != EntryKind::Dir {
                        may_lack(&Id(e.blob), &format!("entry {:?}: blob", e.path))?;
                    }
                }
            }
            ObjectKind::Event => {
                let env = EventEnvelope::from_bytes(id, &raw).map_err(|e| e.to_string())?;
                let ev = Event::from_envelope(*id, env);
                // Noted even if a check below fails: its successors are
                // still compared with the place it claims.
                checks.place.replace(Some((ev.stream.clone(), ev.seq)));
                if let Some(p) = &ev.prev {
                    need(p, "prev")?;
                    if seen.kind_seen(p) != Some(ObjectKind::Event) {
                        return Err(format!("prev {p} is not an event"));
                    }
                    seen.check_place(&ev, p)?;
                } else if ev.seq != 0 {
                    return Err(format!("seq {} without a prev event", ev.seq));
                }
                ev.parents.iter().try_for_each(|p| need(p, "parent"))?;
                ev.refs.iter().try_for_each(|x| may_lack(x, "ref"))?;
                check_payload(&ev)
                    .map_err(|e| format!("payload of {} v{}: {e}", ev.kind, ev.version))?;
            }
        }
        if h.meta_len > 0 && serde_json::from_slice::<serde::de::IgnoredAny>(&rec.meta).is_err() {
            return Err("metadata is not valid JSON".into());
        }
        Ok(())
    }

    /// After an unparseable header, every object the index places later in the
    /// same segment cannot be checked: report each one by id.
    fn blame_rest(&self, seg: u32, from: u64, r: &mut VerifyReport) -> Result<()> {
        for (id, loc) in self.locations()? {
            if loc.seg == seg && loc.offset > from {
                r.problems.push(Problem {
                    id: Some(id),
                    what: format!(
                        "not verifiable: follows damaged bytes at offset {from} of segment {seg}"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Storage statistics from the index and the objects.
    pub fn stats(&self) -> Result<Stats> {
        let mut s = Stats::default();
        let mut sizes: HashMap<Id, u64> = HashMap::new();
        let locs = self.locations()?;
        for (id, loc) in &locs {
            let k = s.by_kind.entry(loc.kind.name()).or_default();
            k.count += 1;
            k.raw_bytes += loc.raw_len as u64;
            k.stored_bytes += loc.body_len as u64;
            sizes.insert(*id, loc.raw_len as u64);
        }
        // Logical bytes: what the objects would weigh if every reference were a
        // copy (each tree's file contents, each event's referenced objects).
        let mut referenced: HashSet<Id> = HashSet::new();
        for (id, loc) in &locs {
            match loc.kind {
                ObjectKind::Tree => {
                    let t = self.get_tree(id)?;
                    s.logical_bytes += loc.raw_len as u64;
                    for e in &t.entries {
                        if let Some(b) = e.blob_id() {
                            s.logical_bytes += sizes.get(&b).copied().unwrap_or(e.size);
                            referenced.insert(b);
                        }
                    }
                }
                ObjectKind::Event => {
                    let ev = self.get_event(id)?;
                    s.logical_bytes += loc.raw_len as u64;
                    for r in &ev.refs {
                        if let Some(n) = sizes.get(r) {
                            s.logical_bytes += n;
                            referenced.insert(*r);
                        }
                    }
                }
                ObjectKind::Blob => {}
            }
        }
        for (id, loc) in &locs {
            if loc.kind == ObjectKind::Blob && !referenced.contains(id) {
                s.logical_bytes += loc.raw_len as u64;
            }
        }
        s.unique_bytes = locs.iter().map(|(_, l)| l.raw_len as u64).sum();
        s.stored_bytes = locs.iter().map(|(_, l)| l.body_len as u64).sum();
        s.segment_bytes = dir_size(self.segment_dir());
        s.index_bytes = dir_size(&self.dir().join("index"));
        s.refs = self.refs()?.len() as u64;
        Ok(s)
    }
}

struct PendingRef {
    name: String,
    /// `None`: the update deletes the ref.
    new: Option<Id>,
}

/// What a verify scan carries from record to record.
/// What `check_object` checks beyond the bytes: payloads, and (a partial
/// ledger) where to note links to objects allowed to be absent.
struct Checks<'a> {
    payload: PayloadCheck<'a>,
    absent: Option<&'a std::cell::RefCell<Vec<Id>>>,
    /// Set for an event that decodes: its stream and seq.
    place: std::cell::RefCell<Option<(String, u64)>>,
}

struct Walk {
    seen: Seen,
    /// Ref updates since the last commit marker.
    pending: Vec<PendingRef>,
    /// Every ref's head as the operation log says.
    refs_from_log: HashMap<String, Id>,
    /// Objects linked before they were stored, allowed as absent.
    absent: HashSet<Id>,
    r: VerifyReport,
}

impl Walk {
    /// A commit marker: the batch's ref updates take effect.
    fn apply_refs(&mut self) {
        for p in self.pending.drain(..) {
            match p.new {
                Some(new) => {
                    self.refs_from_log.insert(p.name, new);
                }
                // A deletion (FORMAT.md): the ref is gone.
                None => {
                    self.refs_from_log.remove(&p.name);
                }
            }
        }
    }
}

/// Refs in the index must be what the operation log says.
fn check_refs(refs: &[(String, Id)], from_log: &HashMap<String, Id>, r: &mut VerifyReport) {
    r.refs = refs.len() as u64;
    for (name, id) in refs {
        match from_log.get(name) {
            Some(l) if l == id => {}
            Some(l) => r.problems.push(Problem {
                id: Some(*id),
                what: format!("ref {name:?} is {id} in the index but {l} in the log"),
            }),
            None => r.problems.push(Problem {
                id: Some(*id),
                what: format!("ref {name:?} is in the index but not in the log"),
            }),
        }
    }
    for (name, id) in from_log {
        if !refs.iter().any(|(n, _)| n == name) {
            r.problems.push(Problem {
                id: Some(*id),
                what: format!(
                    "ref {name:?} is in the log but missing from the index (run `mass reindex`)"
                ),
            });
        }
    }
}

/// Where the index says each object is, and whether the log scan has reached it.
#[derive(Clone, Copy)]
struct Slot {
    seg: u32,
    offset: u64,
    kind: ObjectKind,
    seen: bool,
}

struct Seen {
    map: HashMap<[u8; 16], Slot>,
    /// Every event passed that decoded: its stream (an index into
    /// `streams`) and seq, for the events that name it as prev.
    places: HashMap<[u8; 16], (u32, u64)>,
    /// Stream names seen, each numbered once.
    streams: HashMap<String, u32>,
    /// Filled from the index (and so checked against it), or from the log.
    from_index: bool,
}

impl Seen {
    fn with_capacity(n: usize) -> Seen {
        Seen {
            map: HashMap::with_capacity(n),
            places: HashMap::new(),
            streams: HashMap::new(),
            from_index: false,
        }
    }

    fn insert_seen(&mut self, id: &Id, seg: u32, offset: u64, kind: ObjectKind) {
        self.map.insert(
            key16(id),
            Slot {
                seg,
                offset,
                kind,
                seen: true,
            },
        );
    }

    fn from_index(l: &Ledger) -> Result<Seen> {
        // Sized up front from the object count: growing by doubling would
        // briefly hold two tables (a third more peak memory at 1M objects).
        let mut m = HashMap::with_capacity(l.object_count()? as usize);
        let mut events = 0usize;
        l.for_each_location(|id, loc| {
            events += usize::from(loc.kind == ObjectKind::Event);
            m.insert(
                key16(&id),
                Slot {
                    seg: loc.seg,
                    offset: loc.offset,
                    kind: loc.kind,
                    seen: false,
                },
            );
        })?;
        Ok(Seen {
            map: m,
            // Sized from the index too, for the same reason.
            places: HashMap::with_capacity(events),
            streams: HashMap::new(),
            from_index: true,
        })
    }
    fn slot(&self, id: &Id) -> Option<Slot> {
        self.map.get(&key16(id)).copied()
    }
    /// Whether `ev` continues its prev `p`'s stream at `p`'s seq + 1; a
    /// prev that did not decode has no place to compare.
    fn check_place(&self, ev: &Event, p: &Id) -> std::result::Result<(), String> {
        let Some(&(s, q)) = self.places.get(&key16(p)) else {
            return Ok(());
        };
        if Some(s) != self.streams.get(&ev.stream).copied() {
            return Err(format!(
                "its stream {:?} is not its prev {p}'s stream",
                ev.stream
            ));
        }
        if q.checked_add(1) != Some(ev.seq) {
            return Err(format!("seq {} after prev {p} at seq {q}", ev.seq));
        }
        Ok(())
    }

    fn note_place(&mut self, id: &Id, stream: String, seq: u64) {
        let next = self.streams.len() as u32;
        let s = *self.streams.entry(stream).or_insert(next);
        self.places.insert(key16(id), (s, seq));
    }
    fn mark(&mut self, id: &Id) {
        if let Some(s) = self.map.get_mut(&key16(id)) {
            s.seen = true;
        }
    }
    /// The kind of an object the scan has already passed, if any.
    fn kind_seen(&self, id: &Id) -> Option<ObjectKind> {
        self.map.get(&key16(id)).filter(|s| s.seen).map(|s| s.kind)
    }
}

fn key16(id: &Id) -> [u8; 16] {
    let mut k = [0u8; 16];
    k.copy_from_slice(&id.0[..16]);
    k
}

/// Per-kind counts and sizes.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KindStats {
    pub count: u64,
    /// Canonical (uncompressed) bytes.
    pub raw_bytes: u64,
    /// Bytes as stored in segments (after compression, without record framing).
    pub stored_bytes: u64,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    pub by_kind: std::collections::BTreeMap<&'static str, KindStats>,
    /// Bytes if every reference were a private copy.
    pub logical_bytes: u64,
    /// Canonical bytes of distinct objects.
    pub unique_bytes: u64,
    /// Bytes of object bodies as stored.
    pub stored_bytes: u64,
    /// Size of the segment files on disk.
    pub segment_bytes: u64,
    /// Size of the (derived) index on disk.
    pub index_bytes: u64,
    pub refs: u64,
}

impl Stats {
    /// logical / unique: how much content addressing saved.
    pub fn dedup_ratio(&self) -> f64 {
        ratio(self.logical_bytes, self.unique_bytes)
    }
    /// unique / stored: how much compression saved.
    pub fn compression_ratio(&self) -> f64 {
        ratio(self.unique_bytes, self.stored_bytes)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

fn dir_size(p: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_size(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

impl From<Problem> for LedgerError {
    fn from(p: Problem) -> Self {
        match p.id {
            Some(id) => LedgerError::Corruption { id, detail: p.what },
            None => LedgerError::Index { detail: p.what },
        }
    }
}
