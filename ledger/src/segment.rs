//! Segment files: the append-only log that is the ledger's source of truth.
//!
//! Every object, ref update and commit marker is one *record* in a segment file
//! (`segments/NNNNNNNN.seg`). Records are only ever appended; a batch of records
//! ends with a commit marker and becomes visible only once the marker is durable.
//! This module owns the byte layout of segments and records (documented in
//! `FORMAT.md`) and the scanner used by recovery, `verify` and `reindex`. It knows
//! nothing of the index or of refs' meaning.

use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{LedgerError, Result};
use crate::id::{Id, ObjectKind, ID_LEN};

/// Magic bytes at the start of every segment file.
pub const SEGMENT_MAGIC: &[u8; 8] = b"MASS-SEG";
/// On-disk format version, written into every segment header.
pub const FORMAT_VERSION: u32 = 1;
/// Size of the segment file header.
pub const SEGMENT_HEADER_LEN: u64 = 16;
/// Magic bytes at the start of every record.
pub const RECORD_MAGIC: &[u8; 4] = b"MREC";
/// Size of a record header.
pub const RECORD_HEADER_LEN: usize = 52;
/// Size of a record trailer (checksum).
pub const RECORD_TRAILER_LEN: usize = 8;
/// A record body may not exceed this (objects larger than this are refused).
pub const MAX_BODY_LEN: u64 = 1 << 31;
/// Flag bit: the body is zstd-compressed.
pub const FLAG_ZSTD: u8 = 1;
/// Flag bit (with `FLAG_ZSTD`): the body starts with the 32-byte id of a plainly
/// compressed object of the same kind whose canonical bytes are the zstd
/// dictionary for the rest (a delta against a similar earlier object).
pub const FLAG_DICT: u8 = 2;

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

    fn encode(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut h = [0u8; RECORD_HEADER_LEN];
        h[0..4].copy_from_slice(RECORD_MAGIC);
        h[4] = self.rtype.to_u8();
        h[5] = self.flags;
        h[8..12].copy_from_slice(&self.body_len.to_le_bytes());
        h[12..16].copy_from_slice(&self.meta_len.to_le_bytes());
        h[16..20].copy_from_slice(&self.raw_len.to_le_bytes());
        h[20..52].copy_from_slice(&self.id.0);
        h
    }

    /// Parses a header; `Err` carries a human-readable reason.
    pub fn decode(h: &[u8]) -> std::result::Result<RecordHeader, String> {
        if h.len() < RECORD_HEADER_LEN {
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
        Ok(RecordHeader {
            rtype,
            flags,
            body_len: u32_at(8),
            meta_len: u32_at(12),
            raw_len: u32_at(16),
            id: Id(id),
        })
    }
}

/// Encodes one complete record: header, body, metadata, checksum trailer.
pub fn encode_record(header: &RecordHeader, body: &[u8], meta: &[u8]) -> Vec<u8> {
    debug_assert_eq!(header.body_len as usize, body.len());
    debug_assert_eq!(header.meta_len as usize, meta.len());
    let mut out = Vec::with_capacity(header.total_len() as usize);
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(body);
    out.extend_from_slice(meta);
    let sum = checksum(&out);
    out.extend_from_slice(&sum);
    out
}

/// The trailer: the first 8 bytes of BLAKE3 over header, body and metadata.
/// It detects torn writes of the tail; object ids protect the content itself.
pub fn checksum(bytes: &[u8]) -> [u8; RECORD_TRAILER_LEN] {
    let h = blake3::hash(bytes);
    let mut out = [0u8; RECORD_TRAILER_LEN];
    out.copy_from_slice(&h.as_bytes()[..RECORD_TRAILER_LEN]);
    out
}

/// The segment file header.
pub fn segment_header(seg_no: u32) -> [u8; SEGMENT_HEADER_LEN as usize] {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    h[0..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&seg_no.to_le_bytes());
    h
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
            if let Ok(n) = stem.parse::<u32>() {
                out.push(n);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Checks a segment's file header.
pub fn check_segment_header(path: &Path, file: &File, seg_no: u32) -> Result<()> {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    file.read_exact_at(&mut h, 0).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            LedgerError::CorruptLog {
                path: path.to_path_buf(),
                offset: 0,
                detail: "segment shorter than its header".into(),
            }
        } else {
            LedgerError::io(path, e)
        }
    })?;
    let bad = |detail: String| LedgerError::CorruptLog {
        path: path.to_path_buf(),
        offset: 0,
        detail,
    };
    if &h[0..8] != SEGMENT_MAGIC {
        return Err(bad("not a mass segment file (bad magic)".into()));
    }
    let ver = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if ver != FORMAT_VERSION {
        return Err(LedgerError::UnsupportedFormat {
            path: path.to_path_buf(),
            found: ver.to_string(),
            supported: FORMAT_VERSION,
        });
    }
    let no = u32::from_le_bytes([h[12], h[13], h[14], h[15]]);
    if no != seg_no {
        return Err(bad(format!(
            "segment header says number {no}, file name says {seg_no}"
        )));
    }
    Ok(())
}

/// One record read back by the scanner.
#[derive(Debug)]
pub struct ScannedRecord {
    pub offset: u64,
    pub header: RecordHeader,
    pub body: Vec<u8>,
    pub meta: Vec<u8>,
}

/// What the scanner found at a position it could not read as a whole record.
#[derive(Debug)]
pub struct TornTail {
    pub offset: u64,
    pub reason: String,
}

/// Sequential reader over the records of one segment, starting at `start`.
pub struct Scanner {
    reader: BufReader<File>,
    pub offset: u64,
    end: u64,
    path: PathBuf,
}

impl Scanner {
    pub fn open(path: &Path, seg_no: u32, start: u64) -> Result<Scanner> {
        Self::open_bounded(path, seg_no, start, None)
    }

    /// Like `open`, but never reads past `end` (when given).
    pub fn open_bounded(path: &Path, seg_no: u32, start: u64, end: Option<u64>) -> Result<Scanner> {
        let file = File::open(path).map_err(|e| LedgerError::io(path, e))?;
        check_segment_header(path, &file, seg_no)?;
        let len = file.metadata().map_err(|e| LedgerError::io(path, e))?.len();
        let end = end.map_or(len, |e| e.min(len));
        let start = start.max(SEGMENT_HEADER_LEN);
        let mut f = file;
        std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(start))
            .map_err(|e| LedgerError::io(path, e))?;
        Ok(Scanner {
            reader: BufReader::with_capacity(1 << 20, f),
            offset: start,
            end,
            path: path.to_path_buf(),
        })
    }

    pub fn file_len(&self) -> u64 {
        self.end
    }

    /// Reads the next record. `Ok(None)` at a clean end of file; `Ok(Some(Err(torn)))`
    /// where the bytes from `offset` on do not form a valid record (a torn write when
    /// it is the tail of the last segment, corruption anywhere else).
    pub fn next_record(&mut self) -> Result<Option<std::result::Result<ScannedRecord, TornTail>>> {
        if self.offset >= self.end {
            return Ok(None);
        }
        let at = self.offset;
        let torn = |reason: String| Ok(Some(Err(TornTail { offset: at, reason })));
        let remaining = self.end - at;
        if remaining < (RECORD_HEADER_LEN + RECORD_TRAILER_LEN) as u64 {
            return torn(format!("{remaining} trailing bytes, shorter than a record"));
        }
        let mut hbuf = [0u8; RECORD_HEADER_LEN];
        self.read_exact(&mut hbuf)?;
        let header = match RecordHeader::decode(&hbuf) {
            Ok(h) => h,
            Err(reason) => return torn(reason),
        };
        if header.body_len as u64 > MAX_BODY_LEN || header.total_len() > remaining {
            return torn(format!(
                "record claims {} bytes, {} remain in the file",
                header.total_len(),
                remaining
            ));
        }
        let mut body = vec![0u8; header.body_len as usize];
        self.read_exact(&mut body)?;
        let mut meta = vec![0u8; header.meta_len as usize];
        self.read_exact(&mut meta)?;
        let mut trailer = [0u8; RECORD_TRAILER_LEN];
        self.read_exact(&mut trailer)?;
        let mut h = blake3::Hasher::new();
        h.update(&hbuf);
        h.update(&body);
        h.update(&meta);
        if h.finalize().as_bytes()[..RECORD_TRAILER_LEN] != trailer {
            return torn("record checksum mismatch".into());
        }
        self.offset = at + header.total_len();
        Ok(Some(Ok(ScannedRecord {
            offset: at,
            header,
            body,
            meta,
        })))
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        self.reader
            .read_exact(buf)
            .map_err(|e| LedgerError::io(&self.path, e))
    }
}

/// Finds the first offset after `from` (exclusive) and before `end` where a
/// complete record with a valid checksum starts, if any. Used to tell a torn
/// tail (nothing valid follows the bad bytes) from corruption in the middle of
/// the log (valid records follow), and to step over damaged ranges. A match
/// needs the record magic, a decodable header and an 8-byte checksum over the
/// whole record, so random bytes pass with probability ~2^-64.
pub fn find_next_record(path: &Path, from: u64, end: u64) -> Result<Option<u64>> {
    let file = File::open(path).map_err(|e| LedgerError::io(path, e))?;
    let start = from + 1;
    if start >= end {
        return Ok(None);
    }
    // Damage is rare: read the rest of the segment (at most one segment) once.
    let mut buf = vec![0u8; (end - start) as usize];
    file.read_exact_at(&mut buf, start)
        .map_err(|e| LedgerError::io(path, e))?;
    let mut i = 0usize;
    while i + RECORD_HEADER_LEN + RECORD_TRAILER_LEN <= buf.len() {
        let Some(pos) = buf[i..]
            .windows(RECORD_MAGIC.len())
            .position(|w| w == RECORD_MAGIC)
        else {
            return Ok(None);
        };
        let at = i + pos;
        if record_is_valid(&buf[at..]) {
            return Ok(Some(start + at as u64));
        }
        i = at + 1;
    }
    Ok(None)
}

/// True if `bytes` starts with one complete record whose checksum holds.
fn record_is_valid(bytes: &[u8]) -> bool {
    let Ok(h) = RecordHeader::decode(bytes) else {
        return false;
    };
    let total = h.total_len();
    if total > bytes.len() as u64 {
        return false;
    }
    let total = total as usize;
    let (rec, trailer) = bytes[..total].split_at(total - RECORD_TRAILER_LEN);
    checksum(rec) == trailer
}

/// Reads the whole record at `offset` (header, body, metadata, trailer) and
/// checks its checksum: `Ok(Err(reason))` when the bytes there are not the
/// record they should be. Point reads of metadata go through this, so a
/// damaged timestamp is reported, never shown.
pub fn read_record_at(
    file: &File,
    path: &Path,
    offset: u64,
    total_len: u64,
) -> Result<std::result::Result<ScannedRecord, String>> {
    let mut buf = vec![0u8; total_len as usize];
    if let Err(e) = file.read_exact_at(&mut buf, offset) {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            return Ok(Err(format!(
                "record at byte {offset} is cut short: the segment ends before it does"
            )));
        }
        return Err(LedgerError::io(path, e));
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
    if checksum(&buf[..n - RECORD_TRAILER_LEN]) != buf[n - RECORD_TRAILER_LEN..] {
        return Ok(Err(format!("record at byte {offset}: checksum mismatch")));
    }
    let body_end = RECORD_HEADER_LEN + header.body_len as usize;
    let meta = buf[body_end..n - RECORD_TRAILER_LEN].to_vec();
    let body = buf[RECORD_HEADER_LEN..body_end].to_vec();
    Ok(Ok(ScannedRecord {
        offset,
        header,
        body,
        meta,
    }))
}

/// Decompresses a body if its record says so; `raw_len` is checked.
/// The dictionary object a `FLAG_DICT` body names.
pub fn dict_of(id: &Id, flags: u8, body: &[u8]) -> Result<Option<Id>> {
    if flags & FLAG_DICT == 0 {
        return Ok(None);
    }
    Id::from_slice(body.get(..32).unwrap_or_default())
        .map(Some)
        .ok_or_else(|| LedgerError::Corruption {
            id: *id,
            detail: "delta body shorter than its dictionary id".into(),
        })
}

/// Decodes a body compressed against `dict` (the canonical bytes of the object
/// [`dict_of`] names).
pub fn decode_body_with_dict(id: &Id, raw_len: u32, body: &[u8], dict: &[u8]) -> Result<Vec<u8>> {
    let frame = body.get(32..).unwrap_or_default();
    let out = zstd::bulk::Decompressor::with_dictionary(dict)
        .and_then(|mut d| d.decompress(frame, raw_len as usize))
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
    // One decompression context per thread: creating one per object was more
    // than half of a verify scan's CPU time.
    thread_local! {
        static DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let out = DCTX
        .with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                *slot = Some(zstd::bulk::Decompressor::new()?);
            }
            match slot.as_mut() {
                Some(d) => d.decompress(body, raw_len as usize),
                None => Err(std::io::Error::other("no zstd decompressor")),
            }
        })
        .map_err(|e| LedgerError::Corruption {
            id: *id,
            detail: format!("zstd: {e}"),
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

    #[test]
    fn header_round_trip() {
        let h = RecordHeader {
            rtype: RecordType::Object(ObjectKind::Tree),
            flags: FLAG_ZSTD,
            body_len: 7,
            meta_len: 3,
            raw_len: 99,
            id: Id([9; 32]),
        };
        let rec = encode_record(&h, b"1234567", b"abc");
        assert_eq!(rec.len() as u64, h.total_len());
        assert_eq!(RecordHeader::decode(&rec).unwrap(), h);
    }

    #[test]
    fn garbage_header_is_rejected_not_panicking() {
        for junk in [
            &b""[..],
            b"MREC",
            &[0xff; 52],
            b"MREC\x09\0\0\0aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ] {
            assert!(RecordHeader::decode(junk).is_err());
        }
    }
}
