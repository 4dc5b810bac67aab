//! The index: derived data that makes lookups fast, in files anyone can read.
//!
//! Everything here is rebuilt from the segment files on demand (`mass
//! reindex`), so the index is never the only copy of anything. It has two
//! parts, like git's pack `.idx` files plus an in-memory tail:
//!
//! - **Tables** (`index/*.idx`): immutable files, each covering one contiguous
//!   range of the log, written whole (temp file, rename) and never changed.
//!   Objects sorted by id under a 256-entry fan-out (binary search through
//!   an mmap), events in log order and by kind, links sorted by target
//!   (every event's prev, parents and refs: the referrers index), the ref heads at the end of the range, and a BLAKE3 footer over
//!   the file. A table that fails its checksum is ignored (and deleted by a
//!   writer): the log past the last good table is simply scanned again.
//! - **The memtable**: the same information for the log past the last table,
//!   in memory. The writer adds each commit to it; it becomes a table every
//!   [`FLUSH_OBJECTS`] objects and when the ledger closes. Readers build one
//!   by scanning the tail, which is at most that many objects.
//!
//! Tables are merged as they accumulate (a newer table absorbs the one before
//! it while that one is no more than twice its size), so a ledger has
//! O(log n) tables. Lookups go newest first; the first hit wins (an object
//! stored again after its record was damaged has a newer location).
//! Nothing needs a lock to read: readers map the same files the writer
//! wrote, so commands work while `mass run` writes and on read-only copies.
//! The table layout is documented in `FORMAT.md`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::files::{self, FileLayer};
use crate::id::{Id, ObjectKind};

/// The memtable becomes a table at this many objects.
pub const FLUSH_OBJECTS: usize = 100_000;
/// Version 3 (ledger format 2): adds the ends of the segments a table's
/// range completes. Tables of other versions are ignored like damaged ones
/// and their range scanned again.
const TABLE_MAGIC: &[u8; 8] = b"MASSIDX3";
const HEADER_LEN: usize = 72;
const FANOUT_LEN: usize = 256 * 4;
const OBJ_ENTRY: usize = 32 + ObjLoc::LEN;
const EVENT_ENTRY: usize = 8;
const CHILD_ENTRY: usize = 36;
const SEG_END_ENTRY: usize = 12;

/// Where an object's record is, plus what is needed to read it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjLoc {
    pub kind: ObjectKind,
    pub flags: u8,
    pub seg: u32,
    /// Offset of the record header in the segment.
    pub offset: u64,
    pub body_len: u32,
    pub raw_len: u32,
    pub meta_len: u32,
    /// Position of the object in the log (0-based over all objects).
    pub ordinal: u64,
}

impl ObjLoc {
    pub const LEN: usize = 34;

    /// The location reported for an object a partial ledger's promisor
    /// provided: in no segment (`seg` is `u32::MAX`), read from memory.
    pub(crate) fn promised(kind: ObjectKind, raw_len: usize) -> ObjLoc {
        ObjLoc {
            kind,
            flags: 0,
            seg: u32::MAX,
            offset: 0,
            body_len: raw_len as u32,
            raw_len: raw_len as u32,
            meta_len: 0,
            ordinal: u64::MAX,
        }
    }

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = self.kind as u8;
        b[1] = self.flags;
        b[2..6].copy_from_slice(&self.seg.to_le_bytes());
        b[6..14].copy_from_slice(&self.offset.to_le_bytes());
        b[14..18].copy_from_slice(&self.body_len.to_le_bytes());
        b[18..22].copy_from_slice(&self.raw_len.to_le_bytes());
        b[22..26].copy_from_slice(&self.meta_len.to_le_bytes());
        b[26..34].copy_from_slice(&self.ordinal.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<ObjLoc> {
        if b.len() != Self::LEN {
            return None;
        }
        Some(ObjLoc {
            kind: ObjectKind::from_u8(b[0])?,
            flags: b[1],
            seg: u32_at(b, 2),
            offset: u64_at(b, 6),
            body_len: u32_at(b, 14),
            raw_len: u32_at(b, 18),
            meta_len: u32_at(b, 22),
            ordinal: u64_at(b, 26),
        })
    }
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(x)
}

fn id_at(b: &[u8], o: usize) -> Id {
    let mut x = [0u8; 32];
    x.copy_from_slice(&b[o..o + 32]);
    Id(x)
}

/// A position in the log: segment, byte offset, and the ordinal the next
/// object there gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    pub seg: u32,
    pub off: u64,
    pub ordinal: u64,
}

/// An index update derived from one record (a commit, recovery or a scan).
pub(crate) enum IndexItem {
    Object {
        id: Id,
        loc: ObjLoc,
        event: Option<EventIndex>,
    },
    /// A ref moved to `new`, or deleted (`None`).
    Ref { name: String, new: Option<Id> },
}

/// What the index keeps about an event besides its location.
#[derive(Clone)]
pub(crate) struct EventIndex {
    pub kind: String,
    /// Everything the event links to (prev, parents and refs), each once:
    /// the referrers index.
    pub links: Vec<Id>,
}

/// The index of one contiguous log range, in memory and in log order.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemTable {
    start: Pos,
    end: Pos,
    objs: Vec<(Id, ObjLoc)>,
    by_id: HashMap<Id, usize>,
    /// (object index, kind number), log order.
    events: Vec<(usize, u32)>,
    kinds: Vec<String>,
    kind_no: HashMap<String, u32>,
    /// (parent, child object index), log order.
    children: Vec<(Id, usize)>,
    by_parent: HashMap<Id, Vec<usize>>,
    /// Every ref's head at `end`.
    refs: BTreeMap<String, Id>,
    /// The latest trees stored (delta bases that survive processes).
    trees: LatestTrees,
    /// (segment, committed end) of every segment the range completes: the
    /// length each sealed segment must still have.
    seg_ends: Vec<(u32, u64)>,
}

/// The latest tree stored plainly (the base for the next tree's delta) and
/// the latest tree of any storage (the parent whose same-path blobs are the
/// bases for the next snapshot's blob deltas).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LatestTrees {
    pub plain: Option<Id>,
    pub any: Option<Id>,
}

impl MemTable {
    fn new(start: Pos, refs: BTreeMap<String, Id>, trees: LatestTrees) -> MemTable {
        MemTable {
            start,
            end: start,
            refs,
            trees,
            ..Default::default()
        }
    }

    fn add(&mut self, it: &IndexItem) {
        match it {
            IndexItem::Object { id, loc, event } => {
                let i = self.objs.len();
                self.objs.push((*id, *loc));
                self.by_id.insert(*id, i);
                if loc.kind == ObjectKind::Tree {
                    self.trees.any = Some(*id);
                    if loc.flags & crate::segment::FLAG_DICT == 0 {
                        self.trees.plain = Some(*id);
                    }
                }
                if let Some(ev) = event {
                    let k = self.kind_number(&ev.kind);
                    self.events.push((i, k));
                    for p in &ev.links {
                        self.children.push((*p, i));
                        self.by_parent.entry(*p).or_default().push(i);
                    }
                }
            }
            IndexItem::Ref { name, new } => match new {
                Some(id) => {
                    self.refs.insert(name.clone(), *id);
                }
                None => {
                    self.refs.remove(name);
                }
            },
        }
    }

    fn kind_number(&mut self, kind: &str) -> u32 {
        if let Some(k) = self.kind_no.get(kind) {
            return *k;
        }
        let k = self.kinds.len() as u32;
        self.kinds.push(kind.to_string());
        self.kind_no.insert(kind.to_string(), k);
        k
    }

    fn get(&self, id: &Id) -> Option<ObjLoc> {
        self.by_id.get(id).map(|&i| self.objs[i].1)
    }

    /// Appends `later`, which starts where this ends.
    fn extend(&mut self, later: &MemTable) {
        let base = self.objs.len();
        for (id, loc) in &later.objs {
            self.by_id.insert(*id, self.objs.len());
            self.objs.push((*id, *loc));
        }
        for (i, k) in &later.events {
            let k = self.kind_number(&later.kinds[*k as usize]);
            self.events.push((base + i, k));
        }
        for (p, c) in &later.children {
            self.children.push((*p, base + c));
            self.by_parent.entry(*p).or_default().push(base + c);
        }
        self.refs = later.refs.clone();
        self.seg_ends.extend_from_slice(&later.seg_ends);
        if later.trees.plain.is_some() {
            self.trees.plain = later.trees.plain;
        }
        if later.trees.any.is_some() {
            self.trees.any = later.trees.any;
        }
        self.end = later.end;
    }

    /// The table file's bytes: header, fan-out, objects, events, events by
    /// kind, links, kinds, refs, segment ends, latest trees, then the
    /// BLAKE3 footer (the layout of `FORMAT.md`).
    fn encode(&self) -> Vec<u8> {
        let order = self.objects_by_id();
        let mut pos_of: HashMap<Id, u32> = HashMap::with_capacity(order.len());
        for (p, &i) in order.iter().enumerate() {
            pos_of.insert(self.objs[i].0, p as u32);
        }
        let pos = |i: usize| pos_of[&self.objs[i].0];
        let fanout = self.fanout(&order);
        let (by_kind, kind_ranges) = self.events_by_kind();
        let mut children: Vec<(Id, u64, u32)> = self
            .children
            .iter()
            .map(|(p, c)| (*p, self.objs[*c].1.ordinal, pos(*c)))
            .collect();
        children.sort();

        let mut out = Vec::with_capacity(
            HEADER_LEN
                + FANOUT_LEN
                + order.len() * OBJ_ENTRY
                + self.events.len() * (EVENT_ENTRY + 4)
                + children.len() * CHILD_ENTRY
                + 4096,
        );
        self.put_header(&mut out, order.len(), children.len());
        for f in fanout {
            out.extend_from_slice(&f.to_le_bytes());
        }
        for &i in &order {
            out.extend_from_slice(&self.objs[i].0 .0);
            out.extend_from_slice(&self.objs[i].1.encode());
        }
        for (i, k) in &self.events {
            out.extend_from_slice(&pos(*i).to_le_bytes());
            out.extend_from_slice(&k.to_le_bytes());
        }
        for e in &by_kind {
            out.extend_from_slice(&e.to_le_bytes());
        }
        for (p, _, c) in &children {
            out.extend_from_slice(&p.0);
            out.extend_from_slice(&c.to_le_bytes());
        }
        self.put_names(&mut out, &kind_ranges);
        let sum = blake3::hash(&out);
        out.extend_from_slice(sum.as_bytes());
        out
    }

    /// Indices into `objs` sorted by id; a duplicate id keeps its newest
    /// location.
    fn objects_by_id(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.objs.len())
            .filter(|&i| self.by_id.get(&self.objs[i].0) == Some(&i))
            .collect();
        order.sort_by(|a, b| self.objs[*a].0.cmp(&self.objs[*b].0));
        order
    }

    /// The fan-out: for each first byte of an id, how many of the objects
    /// in `order` have an id whose first byte is at most that.
    fn fanout(&self, order: &[usize]) -> [u32; 256] {
        let mut fanout = [0u32; 256];
        for &i in order {
            fanout[self.objs[i].0 .0[0] as usize] += 1;
        }
        let mut acc = 0;
        for f in fanout.iter_mut() {
            acc += *f;
            *f = acc;
        }
        fanout
    }

    /// Events by kind: indices into the events array, by (kind, log
    /// order), and each kind's (first index, count) in that array.
    fn events_by_kind(&self) -> (Vec<u32>, Vec<(u32, u32)>) {
        let mut by_kind: Vec<u32> = (0..self.events.len() as u32).collect();
        by_kind.sort_by_key(|&e| (self.events[e as usize].1, e));
        let mut kind_ranges = vec![(0u32, 0u32); self.kinds.len()];
        for (n, &e) in by_kind.iter().enumerate() {
            let k = self.events[e as usize].1 as usize;
            if kind_ranges[k].1 == 0 {
                kind_ranges[k].0 = n as u32;
            }
            kind_ranges[k].1 += 1;
        }
        (by_kind, kind_ranges)
    }

    /// The header: magic, the range's start and end, and the counts of
    /// every section (`HEADER_LEN` bytes).
    fn put_header(&self, out: &mut Vec<u8>, objects: usize, children: usize) {
        out.extend_from_slice(TABLE_MAGIC);
        for v in [self.start.seg, self.end.seg] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.start.off,
            self.end.off,
            self.start.ordinal,
            self.end.ordinal,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            objects as u32,
            self.events.len() as u32,
            children as u32,
            self.kinds.len() as u32,
            self.refs.len() as u32,
            self.seg_ends.len() as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        debug_assert_eq!(out.len(), HEADER_LEN);
    }

    /// The sections after the links: kinds with their ranges in the
    /// by-kind array, ref heads, segment ends, and the latest trees.
    fn put_names(&self, out: &mut Vec<u8>, kind_ranges: &[(u32, u32)]) {
        for (name, (first, count)) in self.kinds.iter().zip(kind_ranges) {
            put_str(out, name);
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
        }
        for (name, id) in &self.refs {
            put_str(out, name);
            out.extend_from_slice(&id.0);
        }
        for (seg, end) in &self.seg_ends {
            out.extend_from_slice(&seg.to_le_bytes());
            out.extend_from_slice(&end.to_le_bytes());
        }
        for t in [self.trees.plain, self.trees.any] {
            match t {
                Some(t) => {
                    out.push(1);
                    out.extend_from_slice(&t.0);
                }
                None => {
                    out.push(0);
                    out.extend_from_slice(&[0; 32]);
                }
            }
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// One immutable table file, memory-mapped.
pub(crate) struct Table {
    path: PathBuf,
    map: memmap2::Mmap,
    start: Pos,
    end: Pos,
    n_objs: usize,
    n_events: usize,
    n_children: usize,
    kinds: Vec<(String, u32, u32)>,
    refs: BTreeMap<String, Id>,
    trees: LatestTrees,
    seg_ends: Vec<(u32, u64)>,
}

impl Table {
    fn objs_at(&self) -> usize {
        HEADER_LEN + FANOUT_LEN
    }
    fn events_at(&self) -> usize {
        self.objs_at() + self.n_objs * OBJ_ENTRY
    }
    fn by_kind_at(&self) -> usize {
        self.events_at() + self.n_events * EVENT_ENTRY
    }
    fn children_at(&self) -> usize {
        self.by_kind_at() + self.n_events * 4
    }

    /// Maps and checks a table file; `Err` says why it cannot be used. The
    /// checksum proves the file is what some writer wrote; the contents are
    /// then checked for consistency too (every position in range, ids
    /// sorted, counts that add up), so no table, however it was made, can
    /// make a lookup panic or point outside itself.
    fn open(path: &Path) -> Result<Table, String> {
        let f = fs::File::open(path).map_err(|e| e.to_string())?;
        // SAFETY: tables are never modified after they are renamed into
        // place (a merge writes a new file and renames it), so the mapped
        // bytes cannot change under us; a truncated file fails the checks.
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| e.to_string())?;
        let b = &map[..];
        if b.len() < HEADER_LEN + FANOUT_LEN + 66 + 32 || &b[..8] != TABLE_MAGIC {
            return Err("not an index table of this format".into());
        }
        let (body, sum) = b.split_at(b.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err("checksum mismatch".into());
        }
        let body_len = body.len();
        let start = Pos {
            seg: u32_at(b, 8),
            off: u64_at(b, 16),
            ordinal: u64_at(b, 32),
        };
        let end = Pos {
            seg: u32_at(b, 12),
            off: u64_at(b, 24),
            ordinal: u64_at(b, 40),
        };
        if end < start || end.ordinal < start.ordinal {
            return Err("the range ends before it starts".into());
        }
        let counts: Vec<usize> = (0..6).map(|i| u32_at(b, 48 + 4 * i) as usize).collect();
        let (n_objs, n_events, n_children, n_kinds, n_refs, n_seg_ends) = (
            counts[0], counts[1], counts[2], counts[3], counts[4], counts[5],
        );
        let mut t = Table {
            path: path.to_path_buf(),
            start,
            end,
            n_objs,
            n_events,
            n_children,
            kinds: Vec::new(),
            refs: BTreeMap::new(),
            trees: LatestTrees::default(),
            seg_ends: Vec::new(),
            map,
        };
        let fixed = n_objs
            .checked_mul(OBJ_ENTRY)
            .and_then(|x| x.checked_add(n_events.checked_mul(EVENT_ENTRY + 4)?))
            .and_then(|x| x.checked_add(n_children.checked_mul(CHILD_ENTRY)?))
            .and_then(|x| x.checked_add(HEADER_LEN + FANOUT_LEN));
        let mut at = match fixed {
            Some(a) if a <= body_len => a,
            _ => return Err("section sizes exceed the file".into()),
        };
        let (kinds, refs) = t.read_names(&mut at, body_len, n_kinds, n_refs)?;
        let seg_ends_len = n_seg_ends
            .checked_mul(SEG_END_ENTRY)
            .filter(|l| at + l + 66 == body_len)
            .ok_or("section sizes do not add up")?;
        for i in 0..n_seg_ends {
            let o = at + i * SEG_END_ENTRY;
            t.seg_ends.push((u32_at(&t.map, o), u64_at(&t.map, o + 4)));
        }
        at += seg_ends_len;
        let tree_at = |at: usize| (t.map[at] == 1).then(|| id_at(&t.map, at + 1));
        t.trees = LatestTrees {
            plain: tree_at(at),
            any: tree_at(at + 33),
        };
        t.kinds = kinds;
        t.refs = refs;
        t.check_contents()?;
        Ok(t)
    }

    /// The kind and ref sections, read with every length checked.
    #[allow(clippy::type_complexity)]
    fn read_names(
        &self,
        at: &mut usize,
        body_len: usize,
        n_kinds: usize,
        n_refs: usize,
    ) -> Result<(Vec<(String, u32, u32)>, BTreeMap<String, Id>), String> {
        let b = &self.map[..body_len];
        let take_str = |at: &mut usize| -> Result<String, String> {
            if *at + 4 > b.len() {
                return Err("truncated string".into());
            }
            let n = u32_at(b, *at) as usize;
            *at += 4;
            let s = b.get(*at..at.saturating_add(n)).ok_or("truncated string")?;
            *at += n;
            String::from_utf8(s.to_vec()).map_err(|e| e.to_string())
        };
        let mut kinds = Vec::with_capacity(n_kinds.min(1 << 16));
        for _ in 0..n_kinds {
            let name = take_str(at)?;
            if *at + 8 > body_len {
                return Err("truncated kind table".into());
            }
            kinds.push((name, u32_at(b, *at), u32_at(b, *at + 4)));
            *at += 8;
        }
        let mut refs = BTreeMap::new();
        for _ in 0..n_refs {
            let name = take_str(at)?;
            if *at + 32 > body_len {
                return Err("truncated ref table".into());
            }
            refs.insert(name, id_at(b, *at));
            *at += 32;
        }
        Ok((kinds, refs))
    }

    /// Every position a lookup follows lies inside the table, and the
    /// sections are in the order lookups assume.
    fn check_contents(&self) -> Result<(), String> {
        let fan = |i: usize| u32_at(&self.map, HEADER_LEN + 4 * i) as usize;
        if (1..256).any(|i| fan(i) < fan(i - 1)) || fan(255) != self.n_objs {
            return Err("fan-out is not a running count of the objects".into());
        }
        for p in 0..self.n_objs {
            let (id, loc) = self.obj(p);
            let loc = loc.ok_or_else(|| format!("object {p}: location does not decode"))?;
            if p > 0 && self.obj_id(p - 1) >= &id.0[..] {
                return Err(format!("object {p}: ids not sorted"));
            }
            let first = id.0[0] as usize;
            if p >= fan(first) || (first > 0 && p < fan(first - 1)) {
                return Err(format!("object {p}: outside its fan-out bucket"));
            }
            if loc.ordinal < self.start.ordinal || loc.ordinal >= self.end.ordinal {
                return Err(format!("object {p}: ordinal outside the table's range"));
            }
        }
        for e in 0..self.n_events {
            let (p, k) = self.event(e);
            if p >= self.n_objs || k as usize >= self.kinds.len() {
                return Err(format!("event {e}: position out of range"));
            }
            let bk = u32_at(&self.map, self.by_kind_at() + 4 * e) as usize;
            if bk >= self.n_events {
                return Err(format!("by-kind entry {e} out of range"));
            }
        }
        for (name, first, count) in &self.kinds {
            if (*first as usize).saturating_add(*count as usize) > self.n_events {
                return Err(format!("kind {name:?}: range out of bounds"));
            }
        }
        let base = self.children_at();
        for i in 0..self.n_children {
            let at = base + i * CHILD_ENTRY;
            if u32_at(&self.map, at + 32) as usize >= self.n_objs {
                return Err(format!("link {i}: position out of range"));
            }
            if i > 0 && self.map[at - CHILD_ENTRY..at - 4] > self.map[at..at + 32] {
                return Err(format!("link {i}: not sorted"));
            }
        }
        Ok(())
    }

    fn obj(&self, p: usize) -> (Id, Option<ObjLoc>) {
        let at = self.objs_at() + p * OBJ_ENTRY;
        (
            id_at(&self.map, at),
            ObjLoc::decode(&self.map[at + 32..at + OBJ_ENTRY]),
        )
    }

    fn obj_id(&self, p: usize) -> &[u8] {
        let at = self.objs_at() + p * OBJ_ENTRY;
        &self.map[at..at + 32]
    }

    fn bucket(&self, first: u8) -> (usize, usize) {
        let f = |i: usize| u32_at(&self.map, HEADER_LEN + 4 * i) as usize;
        let hi = f(first as usize).min(self.n_objs);
        let lo = if first == 0 { 0 } else { f(first as usize - 1) };
        (lo.min(hi), hi)
    }

    /// First object position in `[lo, hi)` (a fan-out bucket) whose id is
    /// not below `key` (compared on `key.len()` bytes).
    fn lower_bound(&self, key: &[u8], lo: usize, hi: usize) -> usize {
        crate::probe::lower_bound(key, 1, lo, hi, |p| self.obj_id(p))
    }

    fn get(&self, id: &Id) -> Option<ObjLoc> {
        let (lo, hi) = self.bucket(id.0[0]);
        let p = self.lower_bound(&id.0, lo, hi);
        (p < hi && self.obj_id(p) == id.0)
            .then(|| self.obj(p).1)
            .flatten()
    }

    fn with_prefix(&self, prefix: &[u8], out: &mut Vec<Id>, limit: usize) {
        let Some(&first) = prefix.first() else { return };
        let (lo, hi) = self.bucket(first);
        let mut p = self.lower_bound(prefix, lo, hi);
        while p < hi && self.obj_id(p).starts_with(prefix) && out.len() < limit {
            out.push(self.obj(p).0);
            p += 1;
        }
    }

    fn event(&self, e: usize) -> (usize, u32) {
        let at = self.events_at() + e * EVENT_ENTRY;
        (u32_at(&self.map, at) as usize, u32_at(&self.map, at + 4))
    }

    fn children(&self, parent: &Id, out: &mut Vec<(u64, Id)>) {
        let base = self.children_at();
        let key = |i: usize| &self.map[base + i * CHILD_ENTRY..base + i * CHILD_ENTRY + 32];
        let mut lo = crate::probe::lower_bound(&parent.0, 0, 0, self.n_children, key);
        while lo < self.n_children && key(lo) == parent.0 {
            let c = u32_at(&self.map, base + lo * CHILD_ENTRY + 32) as usize;
            let (id, loc) = self.obj(c);
            out.push((loc.map_or(u64::MAX, |l| l.ordinal), id));
            lo += 1;
        }
    }

    /// Rebuilds the memtable this table was written from (for merges).
    fn to_mem(&self) -> MemTable {
        let mut m = MemTable::new(self.start, self.refs.clone(), self.trees);
        m.end = self.end;
        m.seg_ends = self.seg_ends.clone();
        let mut objs: Vec<(u64, usize)> = (0..self.n_objs)
            .filter_map(|p| self.obj(p).1.map(|l| (l.ordinal, p)))
            .collect();
        objs.sort();
        let mut log_index = vec![0usize; self.n_objs];
        for (i, (_, p)) in objs.iter().enumerate() {
            let (id, loc) = self.obj(*p);
            if let Some(loc) = loc {
                m.by_id.insert(id, i);
                m.objs.push((id, loc));
            }
            log_index[*p] = i;
        }
        m.kinds = self.kinds.iter().map(|k| k.0.clone()).collect();
        for (n, k) in m.kinds.iter().enumerate() {
            m.kind_no.insert(k.clone(), n as u32);
        }
        for e in 0..self.n_events {
            let (p, k) = self.event(e);
            m.events.push((log_index[p], k));
        }
        let base = self.children_at();
        for i in 0..self.n_children {
            let at = base + i * CHILD_ENTRY;
            let parent = id_at(&self.map, at);
            let c = log_index[u32_at(&self.map, at + 32) as usize];
            m.children.push((parent, c));
            m.by_parent.entry(parent).or_default().push(c);
        }
        m
    }
}

fn table_name(start: Pos, end: Pos) -> String {
    format!(
        "{:08}.{:012}-{:08}.{:012}.idx",
        start.seg, start.off, end.seg, end.off
    )
}

/// The whole index: tables (oldest first) and the memtable after them.
pub(crate) struct Index {
    /// Where tables live and how they are written; `None` for an index that
    /// never writes (readers).
    dir: Option<(PathBuf, Arc<dyn FileLayer>)>,
    tables: RwLock<Vec<Arc<Table>>>,
    mem: RwLock<MemTable>,
}

/// What a table proves about the log: that it was durable up to `end`, and
/// that each segment in `seg_ends` was durable up to its given end. Tables
/// are written only for durable data and fsynced before anything relies on
/// them, so this is evidence of what was acknowledged.
#[derive(Debug, Clone)]
pub(crate) struct TableEvidence {
    pub path: PathBuf,
    pub end: Pos,
    pub seg_ends: Vec<(u32, u64)>,
}

/// What opening the index found.
#[derive(Debug, Default)]
pub(crate) struct IndexOpen {
    /// Table files that could not be used, with the reason. Nothing is
    /// deleted here: the caller decides once it has checked the log.
    pub ignored: Vec<(PathBuf, String)>,
    /// Valid tables that are not part of the chain (redundant when the log
    /// holds what they cover; evidence of loss when it does not).
    pub unchained: Vec<PathBuf>,
    /// What every valid table, chained or not, says the log holds.
    pub evidence: Vec<TableEvidence>,
}

impl Index {
    /// An empty index starting at `start`, kept in memory only.
    pub fn in_memory(start: Pos) -> Index {
        Index {
            dir: None,
            tables: RwLock::new(Vec::new()),
            mem: RwLock::new(MemTable::new(
                start,
                BTreeMap::new(),
                LatestTrees::default(),
            )),
        }
    }

    /// Loads the chain of tables in `dir` that covers the log from `start`
    /// without gaps. With `files` the index writes tables there (a writer);
    /// without, it only reads. Opening never deletes anything.
    pub fn open(
        dir: &Path,
        start: Pos,
        files: Option<Arc<dyn FileLayer>>,
    ) -> Result<(Index, IndexOpen), String> {
        let mut report = IndexOpen::default();
        let mut found: Vec<Table> = Vec::new();
        match fs::read_dir(dir) {
            Ok(rd) => {
                for e in rd {
                    let p = e.map_err(|e| e.to_string())?.path();
                    if p.extension().is_none_or(|x| x != "idx") {
                        continue;
                    }
                    match Table::open(&p) {
                        Ok(t) => found.push(t),
                        // Removed by a merge between listing and opening:
                        // its range is in the merged table.
                        Err(why) if !p.exists() => drop(why),
                        Err(why) => report.ignored.push((p, why)),
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
        }
        found.sort_by_key(|t| (t.start, std::cmp::Reverse(t.end)));
        let mut chain: Vec<Arc<Table>> = Vec::new();
        let mut cur = start;
        for t in found {
            report.evidence.push(TableEvidence {
                path: t.path.clone(),
                end: t.end,
                seg_ends: t.seg_ends.clone(),
            });
            if t.start == cur && t.end > cur {
                cur = t.end;
                chain.push(Arc::new(t));
            } else {
                report.unchained.push(t.path.clone());
            }
        }
        let (refs, lpt) = chain
            .last()
            .map(|t| (t.refs.clone(), t.trees))
            .unwrap_or_default();
        Ok((
            Index {
                dir: files.map(|f| (dir.to_path_buf(), f)),
                tables: RwLock::new(chain),
                mem: RwLock::new(MemTable::new(cur, refs, lpt)),
            },
            report,
        ))
    }

    fn mem(&self) -> std::sync::RwLockReadGuard<'_, MemTable> {
        self.mem.read().unwrap_or_else(|e| e.into_inner())
    }

    fn tables(&self) -> Vec<Arc<Table>> {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The log position the index covers up to (the watermark).
    pub fn end(&self) -> Pos {
        self.mem().end
    }

    /// Adds one committed batch ending at `end`. Moving into a later
    /// segment records where the earlier one's committed data ends.
    pub fn apply(&self, items: &[IndexItem], end: Pos) {
        let mut m = self.mem.write().unwrap_or_else(|e| e.into_inner());
        for it in items {
            m.add(it);
        }
        if end.seg > m.end.seg {
            let prev = (m.end.seg, m.end.off);
            m.seg_ends.push(prev);
        }
        m.end = end;
    }

    /// Objects in the memtable (for the flush threshold).
    pub fn mem_objects(&self) -> usize {
        self.mem().objs.len()
    }

    pub fn get(&self, id: &Id) -> Option<ObjLoc> {
        if let Some(l) = self.mem().get(id) {
            return Some(l);
        }
        // No clone of the table list: this is on every commit's link check.
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rev()
            .find_map(|t| t.get(id))
    }

    /// Ids starting with the bytes `prefix`, at most `limit`.
    pub fn with_prefix(&self, prefix: &[u8], limit: usize) -> Vec<Id> {
        let mut out: Vec<Id> = self
            .mem()
            .objs
            .iter()
            .filter(|(id, _)| id.0.starts_with(prefix))
            .map(|(id, _)| *id)
            .take(limit)
            .collect();
        for t in self.tables().iter().rev() {
            t.with_prefix(prefix, &mut out, limit);
        }
        out.sort();
        out.dedup();
        out
    }

    /// Events that link to `id` as prev, parent or ref (any order).
    /// The events linking `id`, each with its ordinal (where it is in the
    /// log; `u64::MAX` when its table holds no location for it).
    pub fn referrers(&self, id: &Id) -> Vec<(u64, Id)> {
        let mut out = Vec::new();
        for t in self.tables().iter() {
            t.children(id, &mut out);
        }
        let m = self.mem();
        if let Some(v) = m.by_parent.get(id) {
            out.extend(v.iter().map(|&i| (m.objs[i].1.ordinal, m.objs[i].0)));
        }
        out
    }

    /// Event ids newest first, optionally of one kind.
    pub fn events_newest_first(&self, kind: Option<&str>, limit: usize) -> Vec<Id> {
        let mut out = Vec::new();
        {
            let m = self.mem();
            let want = kind.map(|k| m.kind_no.get(k).copied());
            for (i, k) in m.events.iter().rev() {
                if out.len() >= limit {
                    return out;
                }
                match want {
                    Some(None) => break,
                    Some(Some(w)) if *k != w => continue,
                    _ => out.push(m.objs[*i].0),
                }
            }
        }
        for t in self.tables().iter().rev() {
            match kind {
                None => {
                    for e in (0..t.n_events).rev() {
                        if out.len() >= limit {
                            return out;
                        }
                        out.push(t.obj(t.event(e).0).0);
                    }
                }
                Some(k) => {
                    let Some((_, first, count)) = t.kinds.iter().find(|x| x.0 == k) else {
                        continue;
                    };
                    for n in (*first..first + count).rev() {
                        if out.len() >= limit {
                            return out;
                        }
                        let e = u32_at(&t.map, t.by_kind_at() + 4 * n as usize) as usize;
                        out.push(t.obj(t.event(e).0).0);
                    }
                }
            }
        }
        out
    }

    /// Every indexed object, oldest table first (a later entry for the same
    /// id supersedes an earlier one).
    pub fn for_each(&self, mut f: impl FnMut(Id, ObjLoc)) {
        for t in self.tables().iter() {
            for p in 0..t.n_objs {
                if let (id, Some(loc)) = t.obj(p) {
                    f(id, loc);
                }
            }
        }
        for (id, loc) in &self.mem().objs {
            f(*id, *loc);
        }
    }

    pub fn refs(&self) -> BTreeMap<String, Id> {
        self.mem().refs.clone()
    }

    pub fn latest_trees(&self) -> LatestTrees {
        self.mem().trees
    }

    /// Writes the memtable as a table (if it holds anything) and merges
    /// tables that have become small next to their successor. Every table is
    /// durable (temp file, fsync, rename, directory fsync) before anything
    /// relies on it: a merge removes the tables it absorbed only once the
    /// merged one is durable.
    pub fn flush(&self) -> Result<(), String> {
        let Some((dir, files)) = &self.dir else {
            return Ok(());
        };
        let mut m = self.mem.write().unwrap_or_else(|e| e.into_inner());
        if m.objs.is_empty() && m.end == m.start {
            return Ok(());
        }
        files::create_dir_durably(files.as_ref(), dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut tables = self.tables.write().unwrap_or_else(|e| e.into_inner());
        let t = write_table(files.as_ref(), dir, &m)?;
        tables.push(Arc::new(t));
        *m = MemTable::new(m.end, m.refs.clone(), m.trees);
        // Merge while the older of the last two is at most twice the newer.
        while tables.len() >= 2 {
            let n = tables.len();
            let (a, b) = (&tables[n - 2], &tables[n - 1]);
            if a.n_objs > 2 * b.n_objs.max(1) {
                break;
            }
            let mut merged = a.to_mem();
            merged.extend(&b.to_mem());
            let t = write_table(files.as_ref(), dir, &merged)?;
            let old = [a.path.clone(), b.path.clone()];
            tables.truncate(n - 2);
            tables.push(Arc::new(t));
            for p in old {
                // A table left behind is redundant (the merged one covers
                // it) and removed at the next open.
                let _ = files.remove_file(&p);
            }
        }
        Ok(())
    }
}

fn write_table(files: &dyn FileLayer, dir: &Path, m: &MemTable) -> Result<Table, String> {
    let bytes = m.encode();
    let path = dir.join(table_name(m.start, m.end));
    files::write_durably(files, &path, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Table::open(&path).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objloc_round_trip() {
        let l = ObjLoc {
            kind: ObjectKind::Event,
            flags: 1,
            seg: 3,
            offset: 1 << 40,
            body_len: 77,
            raw_len: 99,
            meta_len: 5,
            ordinal: 123456,
        };
        assert_eq!(ObjLoc::decode(&l.encode()), Some(l));
        assert_eq!(ObjLoc::decode(&[0; 3]), None);
    }

    fn item(n: u8, ordinal: u64, kind: Option<&str>, links: Vec<Id>) -> IndexItem {
        IndexItem::Object {
            id: Id([n; 32]),
            loc: ObjLoc {
                kind: if kind.is_some() {
                    ObjectKind::Event
                } else {
                    ObjectKind::Blob
                },
                flags: 0,
                seg: 1,
                offset: 16 + ordinal * 100,
                body_len: 10,
                raw_len: 10,
                meta_len: 0,
                ordinal,
            },
            event: kind.map(|k| EventIndex {
                kind: k.into(),
                links,
            }),
        }
    }

    #[test]
    fn tables_answer_like_the_memtable_and_merge() {
        let dir = tempfile::tempdir().unwrap();
        let start = Pos {
            seg: 1,
            off: 16,
            ordinal: 0,
        };
        let idx = Index::open(dir.path(), start, Some(Arc::new(crate::files::OsFiles)))
            .unwrap()
            .0;
        // Three flushes: [1,2,3], [4,5], [6]; 4 and 6 are children of 3.
        let batches: Vec<Vec<IndexItem>> = vec![
            vec![
                item(1, 0, None, vec![]),
                item(2, 1, Some("a"), vec![]),
                item(3, 2, Some("b"), vec![Id([2; 32])]),
            ],
            vec![
                item(4, 3, Some("a"), vec![Id([3; 32])]),
                item(5, 4, None, vec![]),
            ],
            vec![
                item(6, 5, Some("b"), vec![Id([3; 32])]),
                IndexItem::Ref {
                    name: "r".into(),
                    new: Some(Id([6; 32])),
                },
            ],
        ];
        let mut ord = 0;
        let mut answers = Vec::new();
        for b in &batches {
            ord += b
                .iter()
                .filter(|i| matches!(i, IndexItem::Object { .. }))
                .count() as u64;
            idx.apply(
                b,
                Pos {
                    seg: 1,
                    off: 16 + ord * 100,
                    ordinal: ord,
                },
            );
            let ask = |idx: &Index| {
                (
                    (1..=7u8).map(|n| idx.get(&Id([n; 32]))).collect::<Vec<_>>(),
                    idx.events_newest_first(None, 10),
                    idx.events_newest_first(Some("a"), 10),
                    {
                        let mut c = idx.referrers(&Id([3; 32]));
                        c.sort();
                        c
                    },
                    idx.refs(),
                    idx.with_prefix(&[4, 4], 10),
                )
            };
            let before = ask(&idx);
            idx.flush().unwrap();
            assert_eq!(ask(&idx), before, "a flush changes no answer");
            answers.push(before);
        }
        let last = answers.last().unwrap();
        assert_eq!(
            last.1,
            vec![Id([6; 32]), Id([4; 32]), Id([3; 32]), Id([2; 32])]
        );
        assert_eq!(last.2, vec![Id([4; 32]), Id([2; 32])]);
        // Each referrer with its ordinal, from the memtable and from tables alike.
        assert_eq!(last.3, vec![(3, Id([4; 32])), (5, Id([6; 32]))]);
        assert!(idx.tables().len() <= 2, "tables merge");
        // Reopened from disk (as a reader), the answers are the same.
        let end = idx.end();
        drop(idx);
        let (ro, rep) = Index::open(dir.path(), start, None).unwrap();
        assert!(rep.ignored.is_empty(), "{rep:?}");
        assert_eq!(ro.end(), end);
        assert_eq!(ro.get(&Id([5; 32])).unwrap().ordinal, 4);
        assert_eq!(ro.refs().get("r"), Some(&Id([6; 32])));
    }

    #[test]
    fn a_damaged_table_is_ignored_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let start = Pos {
            seg: 1,
            off: 16,
            ordinal: 0,
        };
        let idx = Index::open(dir.path(), start, Some(Arc::new(crate::files::OsFiles)))
            .unwrap()
            .0;
        idx.apply(
            &[item(1, 0, None, vec![])],
            Pos {
                seg: 1,
                off: 116,
                ordinal: 1,
            },
        );
        idx.flush().unwrap();
        drop(idx);
        let p = fs::read_dir(dir.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut b = fs::read(&p).unwrap();
        b[HEADER_LEN + FANOUT_LEN + 3] ^= 1;
        fs::write(&p, b).unwrap();
        let (idx, rep) = Index::open(dir.path(), start, None).unwrap();
        assert_eq!(rep.ignored.len(), 1);
        assert_eq!(idx.end(), start, "the log is scanned again from the start");
        assert!(idx.get(&Id([1; 32])).is_none());
    }
}
