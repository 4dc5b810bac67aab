//! Pack files and their indexes: how objects travel to and from a store.
//!
//! A pack is a batch of objects compressed in **frames** (zstd frames of
//! about 1 MiB of concatenated canonical bytes and event metadata; blobs in
//! frames of their own), so similar objects written together compress
//! together while one object is still fetched by a range read of its frame. Its name is the BLAKE3 of its
//! bytes. The index (`.idx`) beside it lists the objects sorted by id with a
//! 256-entry fan-out, like git's `.idx`, each with its frame and place in
//! it; every frame with its offset, length and BLAKE3; and every event's
//! links (prev, parents, refs), so a pull finds what a run reaches from the
//! indexes alone, before it downloads anything. Both are immutable; the byte
//! layouts are in `ledger/FORMAT.md` ("Remotes") and pinned by
//! `tests/pack_format.rs`.
//!
//! Nothing read from a store is trusted: an index is checked against its own
//! BLAKE3 footer and for internal consistency, a frame against the hash its
//! index gives, and an object against its id, before anything is used.

use ledger::{Id, ObjectKind};

use crate::error::{RemoteError, Result};

pub const PACK_MAGIC: &[u8; 8] = b"MASSPACK";
pub const IDX_MAGIC: &[u8; 8] = b"MASSPIDX";
pub const PACK_VERSION: u32 = 1;
/// Raw bytes gathered into one frame before it is compressed.
pub const FRAME_TARGET: usize = 1 << 20;
/// Pack header: magic, version, frame count.
pub const PACK_HEADER_LEN: usize = 16;
/// Fixed part of an index before the fan-out.
const IDX_HEAD_LEN: usize = 8 + 4 + 4 + 32 + 8 + 16;
const FANOUT_LEN: usize = 256 * 4;
pub const IDX_ENTRY_LEN: usize = 60;
pub const IDX_FRAME_LEN: usize = 48;
/// The largest object a ledger stores (its record body limit) and the
/// largest metadata: an index claiming more is refused.
const MAX_OBJECT: u64 = 1 << 31;
const MAX_META: u64 = 1 << 24;
/// zstd level for frames (the ledger stores blobs at 9; frames see many
/// objects at once, so a middle level matches it at a fraction of the time).
const LEVEL: i32 = 6;

/// One object in an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: Id,
    pub kind: ObjectKind,
    pub frame: u32,
    /// Offset of the canonical bytes in the frame's raw (decompressed) bytes;
    /// the metadata follows them.
    pub offset: u32,
    pub raw_len: u32,
    pub meta_len: u32,
    links_start: u32,
    links_count: u32,
}

/// One frame of a pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub offset: u64,
    pub stored_len: u32,
    pub raw_len: u32,
    pub hash: [u8; 32],
}

impl Frame {
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.stored_len as u64
    }
}

/// A built pack: its name (BLAKE3 of `pack`), the pack and its index.
pub struct Built {
    pub id: [u8; 32],
    pub pack: Vec<u8>,
    pub idx: Vec<u8>,
    pub objects: usize,
}

/// Gathers objects into frames and writes a pack and its index. Blobs and
/// the rest (events and trees) fill frames of their own, so a lazy pull,
/// which wants no blob, downloads only the frames of events and trees.
pub struct PackBuilder {
    body: Vec<u8>,
    /// Per lane (0: events and trees, 1: blobs): raw bytes of the open
    /// frame and the entries in it (their frame number set when sealed).
    raw: [Vec<u8>; 2],
    pending: [Vec<Entry>; 2],
    entries: Vec<Entry>,
    frames: Vec<Frame>,
    links: Vec<Id>,
    raw_total: u64,
}

impl Default for PackBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl PackBuilder {
    pub fn new() -> PackBuilder {
        let mut body = Vec::with_capacity(FRAME_TARGET);
        body.extend_from_slice(PACK_MAGIC);
        body.extend_from_slice(&PACK_VERSION.to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes()); // frame count, set by finish
        PackBuilder {
            body,
            raw: [Vec::new(), Vec::new()],
            pending: [Vec::new(), Vec::new()],
            entries: Vec::new(),
            frames: Vec::new(),
            links: Vec::new(),
            raw_total: 0,
        }
    }

    /// Raw bytes added so far (canonical bytes and metadata).
    pub fn raw_len(&self) -> u64 {
        self.raw_total
    }

    pub fn len(&self) -> usize {
        self.entries.len() + self.pending[0].len() + self.pending[1].len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds one object: its canonical bytes, its metadata (events only) and
    /// its links (events only; trees' blobs are found by reading the tree).
    pub fn add(&mut self, id: Id, kind: ObjectKind, raw: &[u8], meta: &[u8], links: &[Id]) {
        let lane = usize::from(kind == ObjectKind::Blob);
        let entry = Entry {
            id,
            kind,
            frame: 0,
            offset: self.raw[lane].len() as u32,
            raw_len: raw.len() as u32,
            meta_len: meta.len() as u32,
            links_start: self.links.len() as u32,
            links_count: links.len() as u32,
        };
        self.raw[lane].extend_from_slice(raw);
        self.raw[lane].extend_from_slice(meta);
        self.links.extend_from_slice(links);
        self.pending[lane].push(entry);
        self.raw_total += (raw.len() + meta.len()) as u64;
        if self.raw[lane].len() >= FRAME_TARGET {
            self.seal_frame(lane);
        }
    }

    fn seal_frame(&mut self, lane: usize) {
        if self.raw[lane].is_empty() {
            return;
        }
        let raw = std::mem::take(&mut self.raw[lane]);
        // Compressing bytes held in memory cannot fail short of allocation.
        let stored = zstd::bulk::compress(&raw, LEVEL).unwrap_or_else(|_| raw.clone());
        let number = self.frames.len() as u32;
        self.frames.push(Frame {
            offset: self.body.len() as u64,
            stored_len: stored.len() as u32,
            raw_len: raw.len() as u32,
            hash: *blake3::hash(&stored).as_bytes(),
        });
        self.body.extend_from_slice(&stored);
        for mut e in self.pending[lane].drain(..) {
            e.frame = number;
            self.entries.push(e);
        }
    }

    /// Seals the last frames and returns the pack and its index.
    pub fn finish(mut self) -> Built {
        self.seal_frame(0);
        self.seal_frame(1);
        let count = self.frames.len() as u32;
        self.body[12..16].copy_from_slice(&count.to_le_bytes());
        let id = *blake3::hash(&self.body).as_bytes();
        let mut entries = self.entries;
        entries.sort_by_key(|e| e.id);
        entries.dedup_by(|a, b| a.id == b.id);
        let idx = write_index(
            &id,
            self.body.len() as u64,
            &entries,
            &self.frames,
            &self.links,
        );
        Built {
            id,
            objects: entries.len(),
            pack: self.body,
            idx,
        }
    }
}

fn kind_byte(kind: ObjectKind) -> u8 {
    match kind {
        ObjectKind::Blob => 1,
        ObjectKind::Tree => 2,
        ObjectKind::Event => 3,
    }
}

fn kind_of(b: u8) -> Option<ObjectKind> {
    match b {
        1 => Some(ObjectKind::Blob),
        2 => Some(ObjectKind::Tree),
        3 => Some(ObjectKind::Event),
        _ => None,
    }
}

fn write_index(
    id: &[u8; 32],
    pack_len: u64,
    entries: &[Entry],
    frames: &[Frame],
    links: &[Id],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        IDX_HEAD_LEN
            + FANOUT_LEN
            + entries.len() * IDX_ENTRY_LEN
            + frames.len() * IDX_FRAME_LEN
            + links.len() * 32
            + 32,
    );
    out.extend_from_slice(IDX_MAGIC);
    out.extend_from_slice(&PACK_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(id);
    out.extend_from_slice(&pack_len.to_le_bytes());
    for n in [entries.len(), frames.len(), links.len(), 0] {
        out.extend_from_slice(&(n as u32).to_le_bytes());
    }
    let mut fanout = [0u32; 256];
    for e in entries {
        fanout[e.id.0[0] as usize] += 1;
    }
    let mut acc = 0u32;
    for n in fanout {
        acc += n;
        out.extend_from_slice(&acc.to_le_bytes());
    }
    for e in entries {
        out.extend_from_slice(&e.id.0);
        out.extend_from_slice(&[kind_byte(e.kind), 0, 0, 0]);
        for v in [
            e.frame,
            e.offset,
            e.raw_len,
            e.meta_len,
            e.links_start,
            e.links_count,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    for f in frames {
        out.extend_from_slice(&f.offset.to_le_bytes());
        out.extend_from_slice(&f.stored_len.to_le_bytes());
        out.extend_from_slice(&f.raw_len.to_le_bytes());
        out.extend_from_slice(&f.hash);
    }
    for l in links {
        out.extend_from_slice(&l.0);
    }
    let footer = *blake3::hash(&out).as_bytes();
    out.extend_from_slice(&footer);
    out
}

/// A pack's index, checked.
#[derive(Debug, Clone)]
pub struct PackIndex {
    pub pack: [u8; 32],
    pub pack_len: u64,
    pub entries: Vec<Entry>,
    pub frames: Vec<Frame>,
    links: Vec<Id>,
}

/// Little-endian reads that fail instead of panicking on short input.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn id(&mut self) -> Option<[u8; 32]> {
        self.take(32)?.try_into().ok()
    }
}

impl PackIndex {
    /// Parses and checks an index. `name` is the pack id its file name gives;
    /// `key` names the file in errors.
    pub fn parse(key: &str, name: &[u8; 32], bytes: &[u8]) -> Result<PackIndex> {
        let bad = |detail: String| RemoteError::Corrupt {
            key: key.to_string(),
            detail,
        };
        if bytes.len() < IDX_HEAD_LEN + FANOUT_LEN + 32 {
            return Err(bad(format!(
                "{} bytes is too short for a pack index",
                bytes.len()
            )));
        }
        let (body, footer) = bytes.split_at(bytes.len() - 32);
        if blake3::hash(body).as_bytes() != footer {
            return Err(bad(
                "the index's BLAKE3 footer does not match its bytes".into()
            ));
        }
        let mut c = Cursor { b: body, at: 0 };
        let head = || bad("truncated header".into());
        if c.take(8).ok_or_else(head)? != IDX_MAGIC {
            return Err(bad("not a mass pack index (bad magic)".into()));
        }
        let version = c.u32().ok_or_else(head)?;
        if version != PACK_VERSION {
            return Err(bad(format!(
                "pack index version {version}; this build reads {PACK_VERSION}"
            )));
        }
        c.u32().ok_or_else(head)?;
        let pack = c.id().ok_or_else(head)?;
        if &pack != name {
            return Err(bad(format!(
                "the index is for pack {}, not the pack its name gives",
                hex::encode(pack)
            )));
        }
        let pack_len = c.u64().ok_or_else(head)?;
        let n_entries = c.u32().ok_or_else(head)? as usize;
        let n_frames = c.u32().ok_or_else(head)? as usize;
        let n_links = c.u32().ok_or_else(head)? as usize;
        c.u32().ok_or_else(head)?;
        let want = IDX_HEAD_LEN as u128
            + FANOUT_LEN as u128
            + n_entries as u128 * IDX_ENTRY_LEN as u128
            + n_frames as u128 * IDX_FRAME_LEN as u128
            + n_links as u128 * 32;
        if want != body.len() as u128 {
            return Err(bad(format!(
                "counts say {want} bytes, the index has {}",
                body.len()
            )));
        }
        let mut fanout = [0u32; 256];
        for f in fanout.iter_mut() {
            *f = c.u32().ok_or_else(head)?;
        }
        let entries = read_entries(&mut c, n_entries).map_err(bad)?;
        let frames = read_frames(&mut c, n_frames).ok_or_else(head)?;
        let mut links = Vec::with_capacity(n_links);
        for _ in 0..n_links {
            links.push(Id(c.id().ok_or_else(head)?));
        }
        let idx = PackIndex {
            pack,
            pack_len,
            entries,
            frames,
            links,
        };
        idx.check(&fanout).map_err(bad)?;
        Ok(idx)
    }

    fn check(&self, fanout: &[u32; 256]) -> std::result::Result<(), String> {
        let mut counts = [0u32; 256];
        for w in self.entries.windows(2) {
            if w[0].id >= w[1].id {
                return Err("object ids are not sorted and unique".into());
            }
        }
        let mut end = PACK_HEADER_LEN as u64;
        for (i, f) in self.frames.iter().enumerate() {
            if f.offset != end {
                return Err(format!(
                    "frame {i} does not start where frame {} ends",
                    i.saturating_sub(1)
                ));
            }
            end += f.stored_len as u64;
        }
        if end != self.pack_len {
            return Err(format!(
                "frames end at byte {end}, the pack is {} bytes",
                self.pack_len
            ));
        }
        self.check_tiling()?;
        for e in &self.entries {
            counts[e.id.0[0] as usize] += 1;
            let frame = self
                .frames
                .get(e.frame as usize)
                .ok_or("an object names a frame past the last")?;
            let end = e.offset as u64 + e.raw_len as u64 + e.meta_len as u64;
            if end > frame.raw_len as u64 {
                return Err(format!("object {} runs past the end of its frame", e.id));
            }
            if e.links_start as u64 + e.links_count as u64 > self.links.len() as u64 {
                return Err(format!(
                    "object {} names links past the end of the list",
                    e.id
                ));
            }
            if e.kind != ObjectKind::Event && (e.meta_len != 0 || e.links_count != 0) {
                return Err(format!(
                    "{} {} carries metadata or links",
                    e.kind.with_article(),
                    e.id
                ));
            }
        }
        let mut acc = 0u32;
        for (i, n) in counts.iter().enumerate() {
            acc += n;
            if fanout[i] != acc {
                return Err(format!(
                    "fan-out entry {i} says {}, the ids give {acc}",
                    fanout[i]
                ));
            }
        }
        Ok(())
    }

    /// Each frame's objects (canonical bytes, then metadata) cover its raw
    /// bytes exactly, and no object is larger than the ledger takes: a frame
    /// cannot claim more bytes than its objects account for.
    fn check_tiling(&self) -> std::result::Result<(), String> {
        let mut spans: Vec<(u32, u32, u64)> = Vec::with_capacity(self.entries.len());
        for e in &self.entries {
            if e.raw_len as u64 > MAX_OBJECT || e.meta_len as u64 > MAX_META {
                return Err(format!(
                    "object {} claims {} bytes and {} of metadata, more than a ledger holds",
                    e.id, e.raw_len, e.meta_len
                ));
            }
            spans.push((e.frame, e.offset, e.raw_len as u64 + e.meta_len as u64));
        }
        spans.sort_unstable();
        let mut next = (0u32, 0u64);
        for (frame, offset, len) in spans {
            if frame != next.0 {
                self.frame_filled(next)?;
                next = (frame, 0);
            }
            if offset as u64 != next.1 {
                return Err(format!(
                    "frame {frame}: objects do not follow each other at byte {offset}"
                ));
            }
            next.1 += len;
        }
        self.frame_filled(next)
    }

    fn frame_filled(&self, (frame, end): (u32, u64)) -> std::result::Result<(), String> {
        match self.frames.get(frame as usize) {
            Some(f) if f.raw_len as u64 == end => Ok(()),
            Some(f) => Err(format!(
                "frame {frame} claims {} raw bytes, its objects {end}",
                f.raw_len
            )),
            None if self.frames.is_empty() && end == 0 => Ok(()),
            None => Err(format!("an object names frame {frame}, past the last")),
        }
    }

    /// The entry of `id`, by binary search.
    pub fn find(&self, id: &Id) -> Option<&Entry> {
        self.entries
            .binary_search_by(|e| e.id.cmp(id))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// An event's links as the index lists them.
    pub fn links_of(&self, e: &Entry) -> &[Id] {
        let start = e.links_start as usize;
        &self.links[start..start + e.links_count as usize]
    }
}

fn read_entries(c: &mut Cursor<'_>, n: usize) -> std::result::Result<Vec<Entry>, String> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut one = || -> Option<Entry> {
            let id = Id(c.id()?);
            let kind = c.take(4)?[0];
            Some(Entry {
                id,
                kind: kind_of(kind)?,
                frame: c.u32()?,
                offset: c.u32()?,
                raw_len: c.u32()?,
                meta_len: c.u32()?,
                links_start: c.u32()?,
                links_count: c.u32()?,
            })
        };
        out.push(
            one().ok_or_else(|| format!("object entry {i} has an unknown kind or is cut short"))?,
        );
    }
    Ok(out)
}

fn read_frames(c: &mut Cursor<'_>, n: usize) -> Option<Vec<Frame>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(Frame {
            offset: c.u64()?,
            stored_len: c.u32()?,
            raw_len: c.u32()?,
            hash: c.id()?,
        });
    }
    Some(out)
}

/// Checks a pack's 16-byte header against its index.
pub fn check_header(key: &str, idx: &PackIndex, header: &[u8]) -> Result<()> {
    let mut want = Vec::with_capacity(PACK_HEADER_LEN);
    want.extend_from_slice(PACK_MAGIC);
    want.extend_from_slice(&PACK_VERSION.to_le_bytes());
    want.extend_from_slice(&(idx.frames.len() as u32).to_le_bytes());
    if header != want.as_slice() {
        return Err(RemoteError::Corrupt {
            key: key.to_string(),
            detail: "the pack's header is not what its index describes".into(),
        });
    }
    Ok(())
}

/// Checks a frame's stored bytes against its index and decompresses them.
/// (`checked` false only for `Unprotected::unchecked_frames`.)
pub fn open_frame(key: &str, frame: &Frame, stored: &[u8], checked: bool) -> Result<Vec<u8>> {
    let bad = |detail: String| RemoteError::Corrupt {
        key: key.to_string(),
        detail,
    };
    if checked && blake3::hash(stored).as_bytes() != &frame.hash {
        return Err(bad(format!(
            "the frame at byte {} does not match the BLAKE3 its index gives",
            frame.offset
        )));
    }
    // Streamed, so a frame claiming more than it holds allocates only what
    // it really decompresses to (plus one byte to notice the excess).
    let mut raw = Vec::new();
    {
        use std::io::Read;
        let dec = zstd::stream::read::Decoder::new(stored).map_err(|e| {
            bad(format!(
                "the frame at byte {} does not decompress: {e}",
                frame.offset
            ))
        })?;
        dec.take(frame.raw_len as u64 + 1)
            .read_to_end(&mut raw)
            .map_err(|e| {
                bad(format!(
                    "the frame at byte {} does not decompress: {e}",
                    frame.offset
                ))
            })?;
    }
    if raw.len() != frame.raw_len as usize {
        return Err(bad(format!(
            "the frame at byte {} decompresses to {} bytes, not {}",
            frame.offset,
            raw.len(),
            frame.raw_len
        )));
    }
    Ok(raw)
}

/// An object out of its checked frame: canonical bytes and metadata, the
/// bytes checked against the id.
/// (`checked` false only for `Unprotected::unchecked_frames`.)
pub fn extract(
    key: &str,
    e: &Entry,
    frame_raw: &[u8],
    checked: bool,
) -> Result<(Vec<u8>, Vec<u8>)> {
    let start = e.offset as usize;
    let mid = start + e.raw_len as usize;
    let end = mid + e.meta_len as usize;
    let (Some(raw), Some(meta)) = (frame_raw.get(start..mid), frame_raw.get(mid..end)) else {
        return Err(RemoteError::Corrupt {
            key: key.to_string(),
            detail: format!("object {} lies outside its frame", e.id),
        });
    };
    if checked && Id::of(e.kind, raw) != e.id {
        return Err(RemoteError::Corrupt {
            key: key.to_string(),
            detail: format!(
                "the bytes stored for {} {} hash to another id",
                e.kind.name(),
                e.id
            ),
        });
    }
    Ok((raw.to_vec(), meta.to_vec()))
}
