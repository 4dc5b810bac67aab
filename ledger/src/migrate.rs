//! Copying a format-1 ledger (written before record checks were keyed with a
//! salt and bound to their position) into a new format-2 ledger, so that no
//! run recorded by an older `mass` is stranded.
//!
//! The old ledger is only read. Its log is scanned twice with format 1's
//! rules: first whole, to check that every record a batch holds is intact
//! (a damaged record not listed in its `quarantine/damaged.jsonl` refuses
//! the copy, naming segment and offset, before anything is written); then
//! batch by batch, each committed batch becoming one batch of the new
//! ledger with the same objects (their canonical bytes re-hashed against
//! their ids), the same event metadata, and the same ref moves and
//! deletions in the same order. Bytes after the last commit marker (a write
//! format 1 never acknowledged) are not copied, and reported.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{LedgerError, Result};
use crate::id::{Id, ObjectKind};
use crate::object::{RefUpdate, DELETED};
use crate::store::Ledger;

const V1_FORMAT: &str = "mass-ledger 1\n";
const V1_SEGMENT_HEADER: u64 = 16;
const V1_RECORD_HEADER: usize = 52;
const V1_TRAILER: usize = 8;

/// What a migration copied and what it left.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Migrated {
    pub batches: u64,
    pub objects: u64,
    pub ref_updates: u64,
    /// Ranges listed as damaged in the old ledger, stepped over.
    pub listed_damage: u64,
    /// Bytes after the old log's last commit marker, not copied.
    pub tail_bytes: u64,
}

/// One format-1 record.
struct V1Record {
    offset: u64,
    rtype: u8,
    flags: u8,
    raw_len: u32,
    id: [u8; 32],
    body: Vec<u8>,
    meta: Vec<u8>,
}

/// A damaged range listed by a format-1 `repair`.
#[derive(serde::Deserialize)]
struct V1Listed {
    segment: u32,
    offset: u64,
    len: u64,
}

/// True if `dir` holds a format-1 ledger.
pub fn is_v1(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("FORMAT")).is_ok_and(|t| t == V1_FORMAT)
}

/// Copies every committed batch of the format-1 ledger at `src` into `dst`
/// (a format-2 ledger, normally new and empty). `src` is never written.
pub fn migrate_v1(src: &Path, dst: &Ledger) -> Result<Migrated> {
    if !is_v1(src) {
        return Err(LedgerError::UnsupportedFormat {
            path: src.join("FORMAT"),
            found: "not 1".into(),
            supported: 1,
        });
    }
    let listed = read_listed(src)?;
    let segs = crate::segment::list_segments(&src.join("segments"))?;
    let mut out = Migrated::default();
    // Pass 1: every batch intact (or listed), nothing written.
    let mut batches = 0u64;
    walk(src, &segs, &listed, &mut out, &mut |_| {
        batches += 1;
        Ok(())
    })?;
    // Pass 2: the copy.
    let mut check = Migrated::default();
    walk(src, &segs, &listed, &mut check, &mut |batch| {
        copy_batch(dst, batch)
    })?;
    out.batches = batches;
    Ok(out)
}

fn read_listed(src: &Path) -> Result<Vec<V1Listed>> {
    let path = src.join("quarantine").join("damaged.jsonl");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LedgerError::io(&path, e)),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| LedgerError::CorruptLog {
                path: path.clone(),
                offset: i as u64 + 1,
                detail: format!("line {}: {e}", i + 1),
            })
        })
        .collect()
}

/// Walks the old log batch by batch, calling `each` with every committed
/// batch's records (commit marker excluded), in log order.
fn walk(
    src: &Path,
    segs: &[u32],
    listed: &[V1Listed],
    out: &mut Migrated,
    each: &mut dyn FnMut(&[V1Record]) -> Result<()>,
) -> Result<()> {
    let last = segs.last().copied().unwrap_or(0);
    for &seg in segs {
        let path = crate::segment::segment_path(&src.join("segments"), seg);
        let f = File::open(&path).map_err(|e| LedgerError::io(&path, e))?;
        let len = f.metadata().map_err(|e| LedgerError::io(&path, e))?.len();
        check_v1_header(&f, &path, seg)?;
        let mut at = V1_SEGMENT_HEADER;
        let mut batch: Vec<V1Record> = Vec::new();
        let mut committed = at;
        while at < len {
            if let Some(l) = listed.iter().find(|l| l.segment == seg && l.offset == at) {
                out.listed_damage += 1;
                at += l.len.max(1);
                continue;
            }
            match read_v1(&f, at, len) {
                Some(rec) if rec.rtype == 5 => {
                    at = rec.offset + record_len(&rec);
                    each(&batch)?;
                    out.objects +=
                        batch.iter().filter(|r| (1..=3).contains(&r.rtype)).count() as u64;
                    out.ref_updates += batch.iter().filter(|r| r.rtype == 4).count() as u64;
                    batch.clear();
                    committed = at;
                }
                Some(rec) => {
                    at = rec.offset + record_len(&rec);
                    batch.push(rec);
                }
                // Bad bytes no complete batch follows, at the end of the
                // log: format 1's torn tail, never acknowledged.
                None if seg == last && !has_commit_after(&f, at, len) => break,
                None => return Err(damaged(&path, at)),
            }
        }
        if committed < len {
            if seg != last {
                return Err(damaged(&path, committed));
            }
            out.tail_bytes += len - committed;
        }
    }
    Ok(())
}

fn damaged(path: &Path, at: u64) -> LedgerError {
    LedgerError::CorruptLog {
        path: path.to_path_buf(),
        offset: at,
        detail: "a damaged record in the format-1 ledger; nothing was copied. Repair it with \
                 the mass build that wrote it (`mass repair`), then migrate again"
            .into(),
    }
}

fn record_len(r: &V1Record) -> u64 {
    (V1_RECORD_HEADER + r.body.len() + r.meta.len() + V1_TRAILER) as u64
}

fn check_v1_header(f: &File, path: &Path, seg: u32) -> Result<()> {
    let mut h = [0u8; V1_SEGMENT_HEADER as usize];
    f.read_exact_at(&mut h, 0)
        .map_err(|e| LedgerError::io(path, e))?;
    let ok = &h[..8] == b"MASS-SEG"
        && u32::from_le_bytes([h[8], h[9], h[10], h[11]]) == 1
        && u32::from_le_bytes([h[12], h[13], h[14], h[15]]) == seg;
    if ok {
        return Ok(());
    }
    Err(LedgerError::CorruptLog {
        path: PathBuf::from(path),
        offset: 0,
        detail: "not a format-1 segment header for this segment".into(),
    })
}

/// The format-1 record at `at`, if one with a valid checksum starts there.
fn read_v1(f: &File, at: u64, len: u64) -> Option<V1Record> {
    let mut h = [0u8; V1_RECORD_HEADER];
    if at + (V1_RECORD_HEADER + V1_TRAILER) as u64 > len {
        return None;
    }
    f.read_exact_at(&mut h, at).ok()?;
    if &h[..4] != b"MREC" || !(1..=5).contains(&h[4]) {
        return None;
    }
    let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
    let (body_len, meta_len) = (u32_at(8) as u64, u32_at(12) as u64);
    let total = V1_RECORD_HEADER as u64 + body_len + meta_len + V1_TRAILER as u64;
    if at + total > len {
        return None;
    }
    let mut rest = vec![0u8; (total - V1_RECORD_HEADER as u64) as usize];
    f.read_exact_at(&mut rest, at + V1_RECORD_HEADER as u64)
        .ok()?;
    let mut hasher = blake3::Hasher::new();
    hasher.update(&h);
    hasher.update(&rest[..rest.len() - V1_TRAILER]);
    if hasher.finalize().as_bytes()[..V1_TRAILER] != rest[rest.len() - V1_TRAILER..] {
        return None;
    }
    let mut id = [0u8; 32];
    id.copy_from_slice(&h[20..52]);
    let meta = rest[body_len as usize..(body_len + meta_len) as usize].to_vec();
    rest.truncate(body_len as usize);
    Some(V1Record {
        offset: at,
        rtype: h[4],
        flags: h[5],
        raw_len: u32_at(16),
        id,
        body: rest,
        meta,
    })
}

/// True if a valid format-1 commit marker starts anywhere in `(from, len)`.
fn has_commit_after(f: &File, from: u64, len: u64) -> bool {
    let mut buf = vec![0u8; (len - from) as usize];
    if f.read_exact_at(&mut buf, from).is_err() {
        return false;
    }
    (1..buf.len())
        .filter(|&i| buf[i..].starts_with(b"MREC\x05"))
        .any(|i| read_v1(f, from + i as u64, len).is_some())
}

/// One old batch as one new batch.
fn copy_batch(dst: &Ledger, batch: &[V1Record]) -> Result<()> {
    let mut b = dst.batch();
    // A copy as recorded: `verify` names what the old ledger got wrong.
    b.keep_chains_as_recorded();
    let mut raws: HashMap<Id, Vec<u8>> = HashMap::new();
    for r in batch.iter().filter(|r| (1..=3).contains(&r.rtype)) {
        let kind = ObjectKind::from_u8(r.rtype).unwrap_or(ObjectKind::Blob);
        let id = Id(r.id);
        let raw = decode_v1(dst, &raws, &id, r)?;
        if Id::of(kind, &raw) != id {
            return Err(LedgerError::Corruption {
                id,
                detail: format!(
                    "the format-1 record at byte {} hashes to another id",
                    r.offset
                ),
            });
        }
        b.put_raw(kind, raw.clone(), r.meta.clone())?;
        raws.insert(id, raw);
    }
    for r in batch.iter().filter(|r| r.rtype == 4) {
        let u = RefUpdate::from_bytes(&r.body).map_err(|e| LedgerError::CorruptLog {
            path: PathBuf::from("format-1 ref update"),
            offset: r.offset,
            detail: e,
        })?;
        let old = u.old.map(Id);
        if u.new == DELETED {
            if let Some(o) = old {
                b.delete_ref(&u.name, o)?;
            }
        } else {
            b.set_ref(&u.name, old, Id(u.new))?;
        }
    }
    b.commit()
}

/// A format-1 body's canonical bytes (a delta's base from this batch or the
/// new ledger).
fn decode_v1(dst: &Ledger, batch: &HashMap<Id, Vec<u8>>, id: &Id, r: &V1Record) -> Result<Vec<u8>> {
    use crate::segment::{decode_body, FLAG_DICT};
    if r.flags & FLAG_DICT == 0 {
        return decode_body(id, r.flags, r.raw_len, &r.body);
    }
    let base = Id::from_slice(r.body.get(..32).unwrap_or_default()).ok_or_else(|| {
        LedgerError::Corruption {
            id: *id,
            detail: "format-1 delta shorter than its base id".into(),
        }
    })?;
    let dict = match batch.get(&base) {
        Some(d) => d.clone(),
        None => dst.raw_object(&base)?.1,
    };
    let frame = &r.body[32..];
    let out = zstd::bulk::Decompressor::with_dictionary(&dict)
        .and_then(|mut d| d.decompress(frame, r.raw_len as usize))
        .map_err(|e| LedgerError::Corruption {
            id: *id,
            detail: format!("format-1 delta: {e}"),
        })?;
    Ok(out)
}
