//! Segment files: the append-only log that is the ledger's source of truth.
//!
//! Every object, ref update and commit marker is one *record* in a segment file
//! (`segments/NNNNNNNN.seg`). Records are only ever appended; a batch of records
//! ends with a commit marker. This module owns the byte layout of segments and
//! records (documented in `FORMAT.md`) and reads them back: one record at a
//! position, or the next position where a record starts after damage. It knows
//! nothing of the index, of refs' meaning, or of what damage means for a batch
//! (that is `recovery`).
//!
//! Why records carry *keyed, positional* checks: a record found by
//! resynchronising after damage must not be one that was written as part of
//! another record's payload (a blob holding a copy of this or another
//! ledger's segment bytes). Each record's header and trailer checks are BLAKE3
//! keyed with the ledger's random salt and bound to the record's segment
//! number and offset, so bytes copied from anywhere else (another ledger, or
//! this ledger at another position) never check, and neither do crafted bytes
//! made without the salt.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{LedgerError, Result};
use crate::id::{Id, ObjectKind, ID_LEN};

/// Magic bytes at the start of each copy of a segment header.
pub const SEGMENT_MAGIC: &[u8; 8] = b"MASS-SEG";
/// On-disk format version, written into every segment header and `FORMAT`.
pub const FORMAT_VERSION: u32 = 2;
/// One copy of the segment header.
pub const HEADER_BLOCK_LEN: usize = 64;
/// Size of the segment file header: two identical copies of the block, so one
/// damaged copy costs nothing.
pub const SEGMENT_HEADER_LEN: u64 = 2 * HEADER_BLOCK_LEN as u64;
/// Magic bytes at the start of every record.
pub const RECORD_MAGIC: &[u8; 4] = b"MREC";
/// Size of a record header, its check included.
pub const RECORD_HEADER_LEN: usize = 60;
/// Where the header check starts within the record header.
pub const HEADER_CHECK_AT: usize = 52;
/// Size of a record trailer (the record check).
pub const RECORD_TRAILER_LEN: usize = 8;
/// A record body may not exceed this (objects larger than this are refused).
pub const MAX_BODY_LEN: u64 = 1 << 31;
/// Metadata may not exceed this (it is a small JSON object).
pub const MAX_META_LEN: u64 = 1 << 24;
/// Flag bit: the body is zstd-compressed.
pub const FLAG_ZSTD: u8 = 1;
/// Flag bit (with `FLAG_ZSTD`): the body is a delta (see [`DELTA_PREFIX_LEN`]).
pub const FLAG_DICT: u8 = 2;
/// A delta body starts with the 32-byte id of a plainly stored object of the
/// same kind (whose canonical bytes are the zstd dictionary for the rest) and
/// a u16 generation: how many deltas against that base precede this one, plus
/// one. A base serves at most [`MAX_DELTA_GENERATION`] deltas.
pub const DELTA_PREFIX_LEN: usize = 34;
/// The most deltas stored against one base; the next version is stored
/// plainly and becomes a new base, so a damaged base costs a bounded number
/// of versions.
pub const MAX_DELTA_GENERATION: u16 = 16;
/// Body of a commit marker: record count (u32) and the offset of the batch's
/// first record in this segment (u64).
pub const COMMIT_BODY_LEN: usize = 12;

/// What a record holds. The discriminants are on-disk values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordType {
    Object(ObjectKind),
    RefUpdate,
    Commit,
}

impl RecordType {
    pub fn to_u8(self) -> u8 {
        match self {
            RecordType::Object(k) => k as u8,
            RecordType::RefUpdate => 4,
            RecordType::Commit => 5,
        }
    }

    pub fn from_u8(b: u8) -> Option<Self> {
        match b {
            4 => Some(RecordType::RefUpdate),
            5 => Some(RecordType::Commit),
            other => ObjectKind::from_u8(other).map(RecordType::Object),
        }
    }
}

/// The key of a ledger's record checks: a random salt chosen at `init`,
/// written into `FORMAT` and every segment header.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Salt {
    key: [u8; 32],
    /// Test-only: checks neither keyed nor positional (the protection off),
    /// so tests can show that their forgeries then succeed.
    plain: bool,
}

impl std::fmt::Debug for Salt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Salt({}…)", hex::encode(&self.key[..4]))
    }
}

impl Salt {
    pub fn from_bytes(key: [u8; 32]) -> Salt {
        Salt { key, plain: false }
    }

    /// A fresh random salt (from the kernel's random source).
    pub fn random() -> std::io::Result<Salt> {
        let mut key = [0u8; 32];
        File::open("/dev/urandom")?.read_exact_at(&mut key, 0)?;
        Ok(Salt::from_bytes(key))
    }

    /// Test-only: the checks of format 1 (unkeyed, not bound to position).
    pub fn unprotected() -> Salt {
        Salt {
            key: [0; 32],
            plain: true,
        }
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.key
    }

    fn keyed(&self, domain: &[u8], seg: u32, off: u64, data: &[u8]) -> [u8; 8] {
        let mut h = if self.plain {
            blake3::Hasher::new()
        } else {
            let mut h = blake3::Hasher::new_keyed(&self.key);
            h.update(domain);
            h.update(&seg.to_le_bytes());
            h.update(&off.to_le_bytes());
            h
        };
        h.update(data);
        first8(h.finalize().as_bytes())
    }

    /// The check of a record header (its first 52 bytes) at `seg`/`off`.
    pub fn header_check(&self, seg: u32, off: u64, h52: &[u8]) -> [u8; 8] {
        self.keyed(b"mass.record-header", seg, off, h52)
    }

    /// The trailer of a record at `seg`/`off` whose position-free digest
    /// (BLAKE3 over header bytes 0..52, body and metadata) is `digest`.
    pub fn record_check(&self, seg: u32, off: u64, digest: &[u8; 32]) -> [u8; 8] {
        self.keyed(b"mass.record", seg, off, digest)
    }

    /// A check of small derived files (the watermark) under this salt.
    pub fn file_check(&self, what: &[u8], data: &[u8]) -> [u8; 8] {
        self.keyed(what, 0, 0, data)
    }
}

fn first8(b: &[u8; 32]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&b[..8]);
    out
}

/// The fixed-size part of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    pub rtype: RecordType,
    pub flags: u8,
    pub body_len: u32,
    pub meta_len: u32,
    pub raw_len: u32,
    pub id: Id,
}

impl RecordHeader {
    pub fn total_len(&self) -> u64 {
        RECORD_HEADER_LEN as u64
            + self.body_len as u64
            + self.meta_len as u64
            + RECORD_TRAILER_LEN as u64
    }

    /// The first 52 bytes (everything but the header check).
    fn encode52(&self) -> [u8; HEADER_CHECK_AT] {
        let mut h = [0u8; HEADER_CHECK_AT];
        h[0..4].copy_from_slice(RECORD_MAGIC);
        h[4] = self.rtype.to_u8();
        h[5] = self.flags;
        h[8..12].copy_from_slice(&self.body_len.to_le_bytes());
        h[12..16].copy_from_slice(&self.meta_len.to_le_bytes());
        h[16..20].copy_from_slice(&self.raw_len.to_le_bytes());
        h[20..52].copy_from_slice(&self.id.0);
        h
    }

    /// Parses the fields of a header (not its check); `Err` carries a
    /// human-readable reason.
    pub fn decode(h: &[u8]) -> std::result::Result<RecordHeader, String> {
        if h.len() < HEADER_CHECK_AT {
            return Err(format!("short header ({} bytes)", h.len()));
        }
        if &h[0..4] != RECORD_MAGIC {
            return Err(format!("bad record magic {:02x?}", &h[0..4]));
        }
        let rtype =
            RecordType::from_u8(h[4]).ok_or_else(|| format!("unknown record type {}", h[4]))?;
        let flags = h[5];
        if flags & !(FLAG_ZSTD | FLAG_DICT) != 0
            || (flags & FLAG_DICT != 0 && flags & FLAG_ZSTD == 0)
        {
            return Err(format!("unknown record flags {flags:#04x}"));
        }
        if h[6] != 0 || h[7] != 0 {
            return Err("reserved header bytes are not zero".into());
        }
        let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let mut id = [0u8; ID_LEN];
        id.copy_from_slice(&h[20..52]);
        let hdr = RecordHeader {
            rtype,
            flags,
            body_len: u32_at(8),
            meta_len: u32_at(12),
            raw_len: u32_at(16),
            id: Id(id),
        };
        if hdr.body_len as u64 > MAX_BODY_LEN || hdr.meta_len as u64 > MAX_META_LEN {
            return Err(format!(
                "record claims a {}-byte body and {}-byte metadata, over the format's limits",
                hdr.body_len, hdr.meta_len
            ));
        }
        Ok(hdr)
    }
}

/// A record encoded without its position: the two checks are filled in
/// once the record's segment and offset are known ([`PreRecord::place`]), so
/// everything costly (compression, hashing the body) happens before that.
#[derive(Debug, Clone)]
pub struct PreRecord {
    pub bytes: Vec<u8>,
    digest: [u8; 32],
}

impl PreRecord {
    pub fn new(header: &RecordHeader, body: &[u8], meta: &[u8]) -> PreRecord {
        debug_assert_eq!(header.body_len as usize, body.len());
        debug_assert_eq!(header.meta_len as usize, meta.len());
        let h52 = header.encode52();
        let mut bytes = Vec::with_capacity(header.total_len() as usize);
        bytes.extend_from_slice(&h52);
        bytes.extend_from_slice(&[0u8; 8]);
        bytes.extend_from_slice(body);
        bytes.extend_from_slice(meta);
        let mut d = blake3::Hasher::new();
        d.update(&h52);
        d.update(body);
        d.update(meta);
        bytes.extend_from_slice(&[0u8; RECORD_TRAILER_LEN]);
        PreRecord {
            bytes,
            digest: *d.finalize().as_bytes(),
        }
    }

    /// The record's length on disk.
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// Appends the record to `out` as it is stored at `seg`/`off`.
    pub fn place(&self, salt: &Salt, seg: u32, off: u64, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&self.bytes);
        let hc = salt.header_check(seg, off, &self.bytes[..HEADER_CHECK_AT]);
        out[at + HEADER_CHECK_AT..at + RECORD_HEADER_LEN].copy_from_slice(&hc);
        let rc = salt.record_check(seg, off, &self.digest);
        let end = out.len();
        out[end - RECORD_TRAILER_LEN..end].copy_from_slice(&rc);
    }
}

/// The commit marker closing a batch of `count` records that started at
/// byte `batch_start` of the segment.
pub fn commit_marker(count: u32, batch_start: u64) -> PreRecord {
    let mut body = [0u8; COMMIT_BODY_LEN];
    body[..4].copy_from_slice(&count.to_le_bytes());
    body[4..].copy_from_slice(&batch_start.to_le_bytes());
    let header = RecordHeader {
        rtype: RecordType::Commit,
        flags: 0,
        body_len: COMMIT_BODY_LEN as u32,
        meta_len: 0,
        raw_len: COMMIT_BODY_LEN as u32,
        id: Id([0; 32]),
    };
    PreRecord::new(&header, &body, &[])
}

/// A commit marker's body: (record count, batch start), if well formed.
pub fn parse_commit(body: &[u8]) -> Option<(u32, u64)> {
    if body.len() != COMMIT_BODY_LEN {
        return None;
    }
    let count = u32::from_le_bytes(body[..4].try_into().ok()?);
    let start = u64::from_le_bytes(body[4..].try_into().ok()?);
    Some((count, start))
}

/// One copy of a segment's header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub seg_no: u32,
    pub salt: [u8; 32],
    /// The committed end of the previous segment when this one was started
    /// (0 for segment 1): bytes of that segment past it were never
    /// acknowledged, bytes before it all were.
    pub prev_end: u64,
}

impl SegmentHeader {
    fn block(&self) -> [u8; HEADER_BLOCK_LEN] {
        let mut b = [0u8; HEADER_BLOCK_LEN];
        b[0..8].copy_from_slice(SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.seg_no.to_le_bytes());
        b[16..48].copy_from_slice(&self.salt);
        b[48..56].copy_from_slice(&self.prev_end.to_le_bytes());
        let sum = first8(blake3::hash(&b[..56]).as_bytes());
        b[56..64].copy_from_slice(&sum);
        b
    }

    /// The header as written: the block twice.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN as usize] {
        let mut out = [0u8; SEGMENT_HEADER_LEN as usize];
        let b = self.block();
        out[..HEADER_BLOCK_LEN].copy_from_slice(&b);
        out[HEADER_BLOCK_LEN..].copy_from_slice(&b);
        out
    }

    fn decode_block(b: &[u8]) -> std::result::Result<SegmentHeader, String> {
        if b.len() < HEADER_BLOCK_LEN {
            return Err("segment shorter than its header".into());
        }
        if first8(blake3::hash(&b[..56]).as_bytes()) != b[56..64] {
            return Err("header checksum mismatch".into());
        }
        if &b[0..8] != SEGMENT_MAGIC {
            return Err("not a mass segment file (bad magic)".into());
        }
        let ver = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if ver != FORMAT_VERSION {
            return Err(format!(
                "segment format version {ver}, this build reads {FORMAT_VERSION}"
            ));
        }
        let mut salt = [0u8; 32];
        salt.copy_from_slice(&b[16..48]);
        let mut pe = [0u8; 8];
        pe.copy_from_slice(&b[48..56]);
        Ok(SegmentHeader {
            seg_no: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
            salt,
            prev_end: u64::from_le_bytes(pe),
        })
    }
}

/// A segment header as read: the first intact copy, or why neither is.
#[derive(Debug, Clone)]
pub enum HeaderRead {
    Ok(SegmentHeader),
    /// Neither copy is intact (or neither names this segment and salt).
    Damaged(String),
}

/// Reads a segment's header. A copy counts only if its checksum holds and it
/// names `seg_no` and (when known) the ledger's salt.
pub fn read_header(file: &File, seg_no: u32, salt: Option<&Salt>) -> std::io::Result<HeaderRead> {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    let n = read_up_to(file, &mut h, 0)?;
    let mut why = Vec::new();
    for copy in 0..2 {
        let b = &h[copy * HEADER_BLOCK_LEN..(copy + 1) * HEADER_BLOCK_LEN];
        if n < (copy + 1) * HEADER_BLOCK_LEN {
            why.push(format!(
                "copy {}: segment shorter than its header",
                copy + 1
            ));
            continue;
        }
        match SegmentHeader::decode_block(b) {
            Ok(sh) if sh.seg_no != seg_no => why.push(format!(
                "copy {}: says segment {}, file name says {seg_no}",
                copy + 1,
                sh.seg_no
            )),
            Ok(sh) if salt.is_some_and(|s| !s.plain && s.key != sh.salt) => {
                why.push(format!("copy {}: names another ledger's salt", copy + 1))
            }
            Ok(sh) => return Ok(HeaderRead::Ok(sh)),
            Err(e) => why.push(format!("copy {}: {e}", copy + 1)),
        }
    }
    Ok(HeaderRead::Damaged(why.join("; ")))
}

/// Reads as many bytes as the file has at `off`, up to `buf.len()`.
fn read_up_to(file: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

pub fn segment_path(dir: &Path, seg_no: u32) -> PathBuf {
    dir.join(format!("{seg_no:08}.seg"))
}

/// Lists segment numbers in `dir`, ascending.
pub fn list_segments(dir: &Path) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    let rd = std::fs::read_dir(dir).map_err(|e| LedgerError::io(dir, e))?;
    for ent in rd {
        let ent = ent.map_err(|e| LedgerError::io(dir, e))?;
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(stem) = name.strip_suffix(".seg") {
            if stem.len() == 8 {
                if let Ok(n) = stem.parse::<u32>() {
                    out.push(n);
                }
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// One record read back, checks verified.
#[derive(Debug)]
pub struct ScannedRecord {
    pub offset: u64,
    pub header: RecordHeader,
    pub body: Vec<u8>,
    pub meta: Vec<u8>,
}

/// What is at a position of a segment.
#[derive(Debug)]
pub enum At {
    /// A record whose header and record checks hold there.
    Record(ScannedRecord),
    /// Not a record. `len` is the record's length when its header check
    /// holds (so the header, and the length it gives, can be trusted and
    /// only the rest is bad); `None` when the header itself is bad.
    Bad {
        reason: String,
        len: Option<u64>,
        claimed_id: Option<Id>,
    },
    /// The end of the range.
    End,
}

/// Read access to one segment file: point reads of records, and a search
/// for the next record after damage. Reads go through a window of
/// [`WINDOW`] bytes, so a sequential scan costs one read per window, and
/// nothing is allocated from a length on disk before the header check that
/// covers it holds.
pub struct SegmentFile {
    file: File,
    path: PathBuf,
    seg: u32,
    salt: Salt,
    len: u64,
    win_start: u64,
    win: Vec<u8>,
}

/// Bytes read at a time by scans.
pub const WINDOW: usize = 1 << 20;

impl SegmentFile {
    pub fn open(path: &Path, seg: u32, salt: Salt) -> Result<SegmentFile> {
        let file = File::open(path).map_err(|e| LedgerError::io(path, e))?;
        Self::from_file(file, path, seg, salt)
    }

    pub fn from_file(file: File, path: &Path, seg: u32, salt: Salt) -> Result<SegmentFile> {
        let len = file.metadata().map_err(|e| LedgerError::io(path, e))?.len();
        Ok(SegmentFile {
            file,
            path: path.to_path_buf(),
            seg,
            salt,
            len,
            win_start: 0,
            win: Vec::new(),
        })
    }

    /// The file's length when it was opened.
    pub fn file_len(&self) -> u64 {
        self.len
    }

    pub fn header(&self) -> Result<HeaderRead> {
        read_header(&self.file, self.seg, Some(&self.salt))
            .map_err(|e| LedgerError::io(&self.path, e))
    }

    /// Copies `out.len()` bytes at `off` (which the caller checked lie
    /// within the file) through the window.
    fn read(&mut self, off: u64, out: &mut [u8]) -> Result<()> {
        let end = off + out.len() as u64;
        let in_win = off >= self.win_start && end <= self.win_start + self.win.len() as u64;
        if !in_win {
            if out.len() >= WINDOW {
                self.file
                    .read_exact_at(out, off)
                    .map_err(|e| LedgerError::io(&self.path, e))?;
                return Ok(());
            }
            let want = (WINDOW as u64).min(self.len.saturating_sub(off)) as usize;
            self.win.resize(want.max(out.len()), 0);
            let n = read_up_to(&self.file, &mut self.win, off)
                .map_err(|e| LedgerError::io(&self.path, e))?;
            self.win.truncate(n);
            self.win_start = off;
            if n < out.len() {
                return Err(LedgerError::io(
                    &self.path,
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("the file shrank while it was read (at byte {off})"),
                    ),
                ));
            }
        }
        let s = (off - self.win_start) as usize;
        out.copy_from_slice(&self.win[s..s + out.len()]);
        Ok(())
    }

    /// The header at `off` if its check holds there (`Err` says why not).
    fn header_at(&mut self, off: u64, end: u64) -> Result<std::result::Result<RecordHeader, At>> {
        let bad = |reason: String| {
            Ok(Err(At::Bad {
                reason,
                len: None,
                claimed_id: None,
            }))
        };
        if end.saturating_sub(off) < (RECORD_HEADER_LEN + RECORD_TRAILER_LEN) as u64 {
            return bad(format!(
                "{} bytes before the end, shorter than a record",
                end.saturating_sub(off)
            ));
        }
        let mut h = [0u8; RECORD_HEADER_LEN];
        self.read(off, &mut h)?;
        let claimed = RecordHeader::decode(&h).ok().map(|x| x.id);
        if self.salt.header_check(self.seg, off, &h[..HEADER_CHECK_AT]) != h[HEADER_CHECK_AT..] {
            let reason = match RecordHeader::decode(&h) {
                Ok(_) => "record header check mismatch".to_string(),
                Err(r) => r,
            };
            return Ok(Err(At::Bad {
                reason,
                len: None,
                claimed_id: claimed,
            }));
        }
        match RecordHeader::decode(&h) {
            Ok(hdr) => Ok(Ok(hdr)),
            // A header whose keyed check holds but whose fields do not
            // decode was written that way: a bug, reported as damage.
            Err(r) => bad(format!("record header (its check holds): {r}")),
        }
    }

    /// What is at `off`, reading no further than `end`.
    pub fn read_at(&mut self, off: u64, end: u64) -> Result<At> {
        let end = end.min(self.len);
        if off >= end {
            return Ok(At::End);
        }
        let header = match self.header_at(off, end)? {
            Ok(h) => h,
            Err(bad) => return Ok(bad),
        };
        let total = header.total_len();
        let claimed_id = matches!(header.rtype, RecordType::Object(_)).then_some(header.id);
        if total > end - off {
            return Ok(At::Bad {
                reason: format!(
                    "record of {total} bytes is cut short: {} bytes remain",
                    end - off
                ),
                len: Some(end - off),
                claimed_id,
            });
        }
        let body_at = off + RECORD_HEADER_LEN as u64;
        let mut body = vec![0u8; header.body_len as usize];
        self.read(body_at, &mut body)?;
        let mut meta = vec![0u8; header.meta_len as usize];
        self.read(body_at + body.len() as u64, &mut meta)?;
        let mut trailer = [0u8; RECORD_TRAILER_LEN];
        self.read(off + total - RECORD_TRAILER_LEN as u64, &mut trailer)?;
        let mut d = blake3::Hasher::new();
        d.update(&header.encode52());
        d.update(&body);
        d.update(&meta);
        if self
            .salt
            .record_check(self.seg, off, d.finalize().as_bytes())
            != trailer
        {
            return Ok(At::Bad {
                reason: "record check mismatch (its header is intact)".into(),
                len: Some(total),
                claimed_id,
            });
        }
        Ok(At::Record(ScannedRecord {
            offset: off,
            header,
            body,
            meta,
        }))
    }

    /// The first offset in `(from, end)` where a record header's keyed check
    /// holds, if any: where a scan resumes after bad bytes. Only a header
    /// written by this ledger at exactly that position checks, so bytes a
    /// payload carries (a copy of any ledger's segments) are never taken for
    /// records. Reads a window at a time.
    pub fn next_header(&mut self, from: u64, end: u64) -> Result<Option<u64>> {
        let end = end.min(self.len);
        let mut at = from + 1;
        let overlap = RECORD_HEADER_LEN as u64;
        while at + overlap <= end {
            let chunk_end = (at + WINDOW as u64).min(end);
            let mut buf = vec![0u8; (chunk_end - at) as usize];
            self.read(at, &mut buf)?;
            let mut i = 0usize;
            while i + RECORD_HEADER_LEN <= buf.len() {
                let Some(p) = find(&buf[i..buf.len() - RECORD_HEADER_LEN + 4], RECORD_MAGIC) else {
                    break;
                };
                let pos = i + p;
                let h = &buf[pos..pos + RECORD_HEADER_LEN];
                let off = at + pos as u64;
                if self.salt.header_check(self.seg, off, &h[..HEADER_CHECK_AT])
                    == h[HEADER_CHECK_AT..]
                {
                    return Ok(Some(off));
                }
                i = pos + 1;
            }
            if chunk_end == end {
                break;
            }
            // Step so that a header straddling the chunk's end is seen whole.
            at = chunk_end - overlap + 1;
        }
        Ok(None)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads the record at `offset` that the index says is `total_len` bytes
/// long and checks it there: `Ok(Err(reason))` when the bytes there are not
/// that record. Point reads of metadata and dedup go through this.
pub fn read_record_at(
    file: &File,
    seg_dir: &Path,
    seg: u32,
    salt: &Salt,
    offset: u64,
    total_len: u64,
) -> Result<std::result::Result<ScannedRecord, String>> {
    if total_len < (RECORD_HEADER_LEN + RECORD_TRAILER_LEN) as u64
        || total_len > MAX_BODY_LEN + MAX_META_LEN + 128
    {
        return Ok(Err(format!(
            "an index entry gives an impossible length {total_len}"
        )));
    }
    let mut buf = vec![0u8; total_len as usize];
    if let Err(e) = file.read_exact_at(&mut buf, offset) {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            return Ok(Err(format!(
                "record at byte {offset} is cut short: the segment ends before it does"
            )));
        }
        // The path only for the error: building it for every read was
        // ~0.7% of a recording's CPU (dedup reads records back).
        return Err(LedgerError::io(segment_path(seg_dir, seg), e));
    }
    if salt.header_check(seg, offset, &buf[..HEADER_CHECK_AT])
        != buf[HEADER_CHECK_AT..RECORD_HEADER_LEN]
    {
        return Ok(Err(format!(
            "record at byte {offset}: header check mismatch"
        )));
    }
    let header = match RecordHeader::decode(&buf) {
        Ok(h) => h,
        Err(r) => return Ok(Err(r)),
    };
    if header.total_len() != total_len {
        return Ok(Err(format!(
            "record at byte {offset} is {} bytes long, the index says {total_len}",
            header.total_len()
        )));
    }
    let n = buf.len();
    let body_end = RECORD_HEADER_LEN + header.body_len as usize;
    let mut d = blake3::Hasher::new();
    d.update(&buf[..HEADER_CHECK_AT]);
    d.update(&buf[RECORD_HEADER_LEN..n - RECORD_TRAILER_LEN]);
    if salt.record_check(seg, offset, d.finalize().as_bytes()) != buf[n - RECORD_TRAILER_LEN..] {
        return Ok(Err(format!(
            "record at byte {offset}: record check mismatch"
        )));
    }
    let meta = buf[body_end..n - RECORD_TRAILER_LEN].to_vec();
    buf.truncate(body_end);
    let body = buf.split_off(RECORD_HEADER_LEN);
    Ok(Ok(ScannedRecord {
        offset,
        header,
        body,
        meta,
    }))
}

/// The base a delta body names and its generation.
pub fn delta_of(id: &Id, flags: u8, body: &[u8]) -> Result<Option<(Id, u16)>> {
    if flags & FLAG_DICT == 0 {
        return Ok(None);
    }
    let bad = || LedgerError::Corruption {
        id: *id,
        detail: "delta body shorter than its base id and generation".into(),
    };
    let base = Id::from_slice(body.get(..32).ok_or_else(bad)?).ok_or_else(bad)?;
    let g = body.get(32..34).ok_or_else(bad)?;
    Ok(Some((base, u16::from_le_bytes([g[0], g[1]]))))
}

/// The dictionary object a `FLAG_DICT` body names.
pub fn dict_of(id: &Id, flags: u8, body: &[u8]) -> Result<Option<Id>> {
    Ok(delta_of(id, flags, body)?.map(|(b, _)| b))
}

/// A delta body: base id, generation, zstd frame.
pub fn delta_body(base: &Id, generation: u16, frame: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(DELTA_PREFIX_LEN + frame.len());
    body.extend_from_slice(&base.0);
    body.extend_from_slice(&generation.to_le_bytes());
    body.extend_from_slice(frame);
    body
}

/// A decompression context kept by a thread, made on first use.
type KeptDctx = std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>>;

// One decompression context per thread and use: creating one per object
// was more than half of a verify scan's CPU time, and per delta read 1% of
// a rollout's (each creation probes the CPU, which traps to the hypervisor
// on VMs). Plain bodies and deltas have a context each, so a dictionary
// never stays loaded in the plain one.
thread_local! {
    static DCTX: KeptDctx = const { std::cell::RefCell::new(None) };
    static DICT_DCTX: KeptDctx = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with the thread's context kept in `key`.
fn with_dctx<T>(
    key: &'static std::thread::LocalKey<KeptDctx>,
    f: impl FnOnce(&mut zstd::bulk::Decompressor<'static>) -> std::io::Result<T>,
) -> std::io::Result<T> {
    key.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new()?);
        }
        match slot.as_mut() {
            Some(d) => f(d),
            None => Err(std::io::Error::other("no zstd decompressor")),
        }
    })
}

/// Decodes a body compressed against `dict` (the canonical bytes of the object
/// [`dict_of`] names).
pub fn decode_body_with_dict(id: &Id, raw_len: u32, body: &[u8], dict: &[u8]) -> Result<Vec<u8>> {
    let frame = body.get(DELTA_PREFIX_LEN..).unwrap_or_default();
    // Its dictionary replaced on every use: a loaded one is sticky.
    let out = with_dctx(&DICT_DCTX, |d| {
        d.set_dictionary(dict)?;
        d.decompress(frame, raw_len as usize)
    })
    .map_err(|e| LedgerError::Corruption {
        id: *id,
        detail: format!("zstd (delta): {e}"),
    })?;
    if out.len() != raw_len as usize {
        return Err(LedgerError::Corruption {
            id: *id,
            detail: format!("decompressed to {} bytes, expected {raw_len}", out.len()),
        });
    }
    Ok(out)
}

/// Decodes a body that is stored plainly or zstd-compressed (not a delta).
pub fn decode_body(id: &Id, flags: u8, raw_len: u32, body: &[u8]) -> Result<Vec<u8>> {
    if flags & FLAG_DICT != 0 {
        return Err(LedgerError::Corruption {
            id: *id,
            detail: "delta body read without its dictionary".into(),
        });
    }
    if flags & FLAG_ZSTD == 0 {
        if body.len() != raw_len as usize {
            return Err(LedgerError::Corruption {
                id: *id,
                detail: format!("stored length {} != recorded length {raw_len}", body.len()),
            });
        }
        return Ok(body.to_vec());
    }
    let out = with_dctx(&DCTX, |d| d.decompress(body, raw_len as usize)).map_err(|e| {
        LedgerError::Corruption {
            id: *id,
            detail: format!("zstd: {e}"),
        }
    })?;
    if out.len() != raw_len as usize {
        return Err(LedgerError::Corruption {
            id: *id,
            detail: format!("decompressed to {} bytes, expected {raw_len}", out.len()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dictionary decoder's context is kept per thread: every delta must
    /// decode against its own dictionary, whatever the thread decoded
    /// before (another dictionary, a damaged frame, a plain body).
    #[test]
    fn a_kept_dictionary_context_never_decodes_with_the_last_dictionary() {
        let dicts: Vec<Vec<u8>> = (0..3u8)
            .map(|d| {
                (0..4000u32)
                    .map(|i| ((i * 7 + d as u32 * 13) % 251) as u8)
                    .collect()
            })
            .collect();
        let delta = |d: &[u8], raw: &[u8]| {
            let frame = zstd::bulk::Compressor::with_dictionary(3, d)
                .and_then(|mut c| c.compress(raw))
                .unwrap();
            delta_body(&Id([1; 32]), 1, &frame)
        };
        let id = Id([2; 32]);
        for round in 0..3 {
            for (k, d) in dicts.iter().enumerate() {
                let mut raw = d.clone();
                raw[100 + round] ^= 0x55;
                raw.extend_from_slice(format!("round {round} dict {k}").as_bytes());
                let body = delta(d, &raw);
                let len = raw.len() as u32;
                assert_eq!(decode_body_with_dict(&id, len, &body, d).unwrap(), raw);
                // The wrong dictionary never yields the bytes.
                let other = &dicts[(k + 1) % dicts.len()];
                let wrong = decode_body_with_dict(&id, len, &body, other);
                assert!(wrong.map_or(true, |o| o != raw), "round {round}, dict {k}");
                // A damaged frame fails, and leaves the context usable.
                let mut bad = body.clone();
                let at = bad.len() / 2;
                bad[at] ^= 0xff;
                let _ = decode_body_with_dict(&id, len, &bad, d);
                assert_eq!(decode_body_with_dict(&id, len, &body, d).unwrap(), raw);
                // A plain frame on the same thread is not read with it.
                let plain = zstd::bulk::compress(&raw, 3).unwrap();
                assert_eq!(decode_body(&id, FLAG_ZSTD, len, &plain).unwrap(), raw);
            }
        }
    }

    fn placed(salt: &Salt, seg: u32, off: u64, h: &RecordHeader, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        PreRecord::new(h, body, b"").place(salt, seg, off, &mut out);
        out
    }

    #[test]
    fn header_round_trip() {
        let h = RecordHeader {
            rtype: RecordType::Object(ObjectKind::Tree),
            flags: FLAG_ZSTD,
            body_len: 7,
            meta_len: 0,
            raw_len: 99,
            id: Id([9; 32]),
        };
        let rec = placed(&Salt::from_bytes([1; 32]), 1, 128, &h, b"1234567");
        assert_eq!(rec.len() as u64, h.total_len());
        assert_eq!(RecordHeader::decode(&rec).unwrap(), h);
    }

    #[test]
    fn garbage_header_is_rejected_not_panicking() {
        for junk in [
            &b""[..],
            b"MREC",
            &[0xff; 60],
            b"MREC\x09\0\0\0aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ] {
            assert!(RecordHeader::decode(junk).is_err());
        }
    }

    #[test]
    fn checks_bind_salt_segment_and_offset() {
        let s = Salt::from_bytes([7; 32]);
        let h52 = [3u8; HEADER_CHECK_AT];
        let base = s.header_check(2, 500, &h52);
        assert_ne!(base, s.header_check(3, 500, &h52));
        assert_ne!(base, s.header_check(2, 501, &h52));
        assert_ne!(base, Salt::from_bytes([8; 32]).header_check(2, 500, &h52));
        // The test-only switch turns all three bindings off.
        let u = Salt::unprotected();
        assert_eq!(u.header_check(2, 500, &h52), u.header_check(9, 7, &h52));
    }

    #[test]
    fn segment_header_survives_one_damaged_copy() {
        let sh = SegmentHeader {
            seg_no: 4,
            salt: [5; 32],
            prev_end: 1234,
        };
        let bytes = sh.encode();
        for i in 0..bytes.len() {
            let mut b = bytes;
            b[i] ^= 0x40;
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("x");
            std::fs::write(&p, b).unwrap();
            let f = File::open(&p).unwrap();
            match read_header(&f, 4, Some(&Salt::from_bytes([5; 32]))).unwrap() {
                HeaderRead::Ok(got) => assert_eq!(got, sh, "flip at {i}"),
                HeaderRead::Damaged(why) => panic!("flip at {i}: {why}"),
            }
        }
    }
}
