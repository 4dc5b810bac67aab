//! Recovery: reading the committed log into an index, and telling an
//! interrupted write from damage.
//!
//! One scan serves four callers: a writer opening the ledger (index the log
//! past the index's watermark), `reindex` (the same from the start), `repair`
//! (from the start, stepping over damaged bytes), and a reader that takes no
//! lock (from the start, into memory, stepping over damage, never writing).
//!
//! The rule that keeps acknowledged data safe: a batch is acknowledged only
//! after `fdatasync` made its records, its commit marker and everything
//! before them in the file durable. So bad bytes in the last segment that no
//! *complete* batch follows (a valid marker counting exactly the intact
//! records before it) can never have been acknowledged: they are a *torn
//! tail*. Bad bytes that a complete batch follows are *damage*: something
//! changed bytes that were once durable. (A damaged record inside the very
//! last batch looks like a torn write and is set aside as one; it is moved,
//! never lost.) A writer refuses to open over damage (it names segment and
//! offset); readers and `repair` step over it to the next valid record, so
//! every intact record stays readable. Nothing here deletes bytes: the caller
//! moves a torn tail into `quarantine/` before cutting it off, and `repair`
//! records damaged ranges in `quarantine/damaged.jsonl`, leaving them in place.

use std::path::{Path, PathBuf};

use crate::error::{LedgerError, Result};
use crate::id::ObjectKind;
use crate::index::{self, Index, IndexItem, Pos};
use crate::object::{Event, EventEnvelope, RefUpdate};
use crate::segment::{self, decode_body, RecordType, Scanner, SEGMENT_HEADER_LEN};

/// Who is scanning, which decides what damage does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScanMode {
    /// Opening for writing: damage is an error naming segment and offset.
    Writer,
    /// `repair`: damage is stepped over and reported.
    Repair,
    /// A lock-free reader: damage is stepped over and reported; the tail of
    /// the last segment may be a commit in progress and is simply not read.
    Reader,
}

/// A range of bad bytes that valid, committed data follows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Damage {
    pub segment: u32,
    pub offset: u64,
    pub len: u64,
    pub reason: String,
    /// The object the damaged record's header names, if the header is readable
    /// (the id itself may be what was damaged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_id: Option<String>,
}

/// Bytes at the end of the last segment that no valid commit marker follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tail {
    pub segment: u32,
    pub offset: u64,
    pub len: u64,
}

/// What a scan found.
#[derive(Debug, Default)]
pub(crate) struct ScanOutcome {
    /// The committed end of the last segment scanned and the next ordinal.
    pub end: Option<(u32, u64)>,
    pub next_ordinal: u64,
    pub records: u64,
    pub tail: Option<Tail>,
    pub damage: Vec<Damage>,
    /// Ranges skipped because an earlier `repair` set them aside.
    pub skipped_set_aside: u64,
}

/// Scans `segs` from `start` and adds the index entries of every committed
/// batch to `idx`, moving its end after each.
pub(crate) fn scan_log(
    seg_dir: &Path,
    segs: &[u32],
    idx: &Index,
    start: Pos,
    set_aside: &[Damage],
    mode: ScanMode,
) -> Result<ScanOutcome> {
    let (start_seg, start_off, mut ordinal) = (start.seg, start.off, start.ordinal);
    let mut out = ScanOutcome {
        next_ordinal: ordinal,
        ..Default::default()
    };
    let last = segs.last().copied().unwrap_or(start_seg);
    for &seg in segs.iter().filter(|&&s| s >= start_seg) {
        let path = segment::segment_path(seg_dir, seg);
        let from = if seg == start_seg {
            start_off
        } else {
            SEGMENT_HEADER_LEN
        };
        let mut sc = match Scanner::open(&path, seg, from) {
            Ok(sc) => sc,
            Err(e) if e.is_corruption() && mode != ScanMode::Writer => {
                let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                out.damage.push(Damage {
                    segment: seg,
                    offset: 0,
                    len,
                    reason: format!("unreadable segment header: {e}"),
                    claimed_id: None,
                });
                continue;
            }
            Err(e) => return Err(e),
        };
        let file_len = sc.file_len();
        let mut st = SegState {
            seg,
            path: path.clone(),
            pending: Vec::new(),
            pending_records: 0,
            committed_end: sc.offset,
            committed_ord: ordinal,
            skipped: false,
        };
        loop {
            let rec = match sc.next_record()? {
                None => break,
                Some(Ok(rec)) => rec,
                Some(Err(torn)) => {
                    if let Some(r) = set_aside
                        .iter()
                        .find(|r| r.segment == seg && r.offset == torn.offset)
                    {
                        out.skipped_set_aside += 1;
                        st.skipped = true;
                        sc = Scanner::open(&path, seg, r.offset + r.len)?;
                        continue;
                    }
                    let next = segment::find_next_record(&path, torn.offset, file_len)?;
                    let committed_after = match next {
                        Some(n) => commit_follows(&path, seg, n, file_len)? || seg != last,
                        None => seg != last,
                    };
                    if !committed_after {
                        // Nothing valid is committed after these bytes: a torn tail.
                        break;
                    }
                    let end = next.unwrap_or(file_len);
                    let damage = Damage {
                        segment: seg,
                        offset: torn.offset,
                        len: end - torn.offset,
                        reason: torn.reason.clone(),
                        claimed_id: claimed_id(&path, torn.offset),
                    };
                    if mode == ScanMode::Writer {
                        return Err(damage_error(&path, &damage, next));
                    }
                    out.damage.push(damage);
                    st.skipped = true;
                    match next {
                        Some(n) => {
                            sc = Scanner::open(&path, seg, n)?;
                            continue;
                        }
                        None => break,
                    }
                }
            };
            if rec.header.rtype == RecordType::Commit {
                let n = commit_count(&rec.body);
                if n != st.pending_records && !st.skipped {
                    let damage = Damage {
                        segment: seg,
                        offset: rec.offset,
                        len: rec.header.total_len(),
                        reason: format!(
                            "commit marker counts {n} records, {} precede it",
                            st.pending_records
                        ),
                        claimed_id: None,
                    };
                    if mode == ScanMode::Writer {
                        return Err(damage_error(&path, &damage, None));
                    }
                    out.damage.push(damage);
                }
                st.committed_end = rec.offset + rec.header.total_len();
                st.committed_ord = ordinal;
                out.records += st.pending_records as u64;
                st.apply_pending(idx)?;
            } else {
                st.pending_records += 1;
                let is_obj = matches!(rec.header.rtype, RecordType::Object(_));
                match index_item(&rec, seg, ordinal) {
                    Ok(Some(it)) => st.pending.push(it),
                    Ok(None) => {}
                    // The record's checksum holds but its content does not
                    // decode: damage that happened before the checksum was
                    // computed, i.e. a bug, not bit rot. Report, never index.
                    Err(e) if mode != ScanMode::Writer => out.damage.push(Damage {
                        segment: seg,
                        offset: rec.offset,
                        len: rec.header.total_len(),
                        reason: e.to_string(),
                        claimed_id: Some(rec.header.id.to_hex()),
                    }),
                    Err(e) => return Err(e),
                }
                if is_obj {
                    ordinal += 1;
                }
            }
        }
        // Valid records after the last commit marker of a sealed segment (or
        // whose marker was damaged) are kept by readers and repair: they are
        // intact, and a later segment proves the writer moved on.
        if !st.pending.is_empty() && seg != last && mode != ScanMode::Writer {
            st.committed_ord = ordinal;
            st.committed_end = file_len;
            out.records += st.pending_records as u64;
            st.apply_pending(idx)?;
        }
        // An empty or header-only segment still moves the index's end.
        idx.apply(
            &[],
            Pos {
                seg,
                off: st.committed_end,
                ordinal: st.committed_ord,
            },
        );
        if st.committed_end < file_len {
            if seg == last {
                out.tail = Some(Tail {
                    segment: seg,
                    offset: st.committed_end,
                    len: file_len - st.committed_end,
                });
            } else if mode == ScanMode::Writer {
                return Err(LedgerError::CorruptLog {
                    path,
                    offset: st.committed_end,
                    detail: "records after the last commit marker of a sealed segment; \
                             `mass verify --log-only` names them, `mass repair` sets them aside"
                        .into(),
                });
            }
        }
        // Positions of records in a tail are reused by the next commit.
        ordinal = st.committed_ord;
        out.end = Some((seg, st.committed_end));
    }
    out.next_ordinal = ordinal;
    Ok(out)
}

struct SegState {
    seg: u32,
    path: PathBuf,
    pending: Vec<IndexItem>,
    pending_records: u32,
    committed_end: u64,
    committed_ord: u64,
    skipped: bool,
}

impl SegState {
    /// Adds the batch that just committed to the index (writing a table
    /// when the memtable is full, for a writer's index).
    fn apply_pending(&mut self, idx: &Index) -> Result<()> {
        idx.apply(
            &self.pending,
            Pos {
                seg: self.seg,
                off: self.committed_end,
                ordinal: self.committed_ord,
            },
        );
        self.pending.clear();
        self.pending_records = 0;
        self.skipped = false;
        if idx.mem_objects() >= index::FLUSH_OBJECTS {
            idx.flush().map_err(|e| LedgerError::Index {
                detail: format!("writing an index table for {}: {e}", self.path.display()),
            })?;
        }
        Ok(())
    }
}

fn commit_count(body: &[u8]) -> u32 {
    u32::from_le_bytes(
        body.get(..4)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0xff; 4]),
    )
}

/// True if a *complete* batch appears at or after `from` in the segment: a
/// valid commit marker whose count equals the valid records before it, with
/// no bad bytes among them. A batch is acknowledged only after `fdatasync`,
/// which makes everything before it in the file durable too; so a complete
/// batch after bad bytes proves those bytes were once durable (damage). A
/// marker closing a batch with a hole in it proves nothing: after a power
/// cut, pages of the unacknowledged last write reach the disk in any order.
fn commit_follows(path: &Path, seg: u32, from: u64, end: u64) -> Result<bool> {
    let mut sc = Scanner::open_bounded(path, seg, from, Some(end))?;
    let mut seen = 0u32;
    let mut clean = true;
    loop {
        match sc.next_record()? {
            None => return Ok(false),
            Some(Ok(rec)) if rec.header.rtype == RecordType::Commit => {
                if clean && commit_count(&rec.body) == seen {
                    return Ok(true);
                }
                seen = 0;
                clean = true;
            }
            Some(Ok(_)) => seen += 1,
            Some(Err(torn)) => match segment::find_next_record(path, torn.offset, end)? {
                Some(n) => {
                    sc = Scanner::open_bounded(path, seg, n, Some(end))?;
                    seen = 0;
                    clean = false;
                }
                None => return Ok(false),
            },
        }
    }
}

/// The id a record header at `offset` claims, if the header decodes.
pub(crate) fn claimed_id(path: &Path, offset: u64) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).ok()?;
    let mut h = [0u8; segment::RECORD_HEADER_LEN];
    f.read_exact_at(&mut h, offset).ok()?;
    let hdr = segment::RecordHeader::decode(&h).ok()?;
    matches!(hdr.rtype, RecordType::Object(_)).then(|| hdr.id.to_hex())
}

fn damage_error(path: &Path, d: &Damage, next: Option<u64>) -> LedgerError {
    let follows = match next {
        Some(n) => format!("valid records follow at byte {n}"),
        None => "later segments follow".into(),
    };
    LedgerError::CorruptLog {
        path: path.to_path_buf(),
        offset: d.offset,
        detail: format!(
            "{} ({} bytes; {follows}, so this is damage to committed data, not an \
             interrupted write). Nothing was changed. `mass verify --log-only` names \
             the damaged objects; `mass repair` sets the damaged bytes aside and keeps \
             every intact record",
            d.reason, d.len
        ),
    }
}

/// Turns a scanned record into an index update.
pub(crate) fn index_item(
    rec: &segment::ScannedRecord,
    seg: u32,
    ordinal: u64,
) -> Result<Option<IndexItem>> {
    let h = &rec.header;
    match h.rtype {
        RecordType::Commit => Ok(None),
        RecordType::RefUpdate => {
            let u = RefUpdate::from_bytes(&rec.body).map_err(|r| LedgerError::CorruptLog {
                path: PathBuf::from(format!("segment {seg}")),
                offset: rec.offset,
                detail: format!("ref update: {r}"),
            })?;
            Ok(Some(IndexItem::Ref {
                new: u.new_head(),
                name: u.name,
            }))
        }
        RecordType::Object(kind) => {
            let event = if kind == ObjectKind::Event {
                let raw = decode_body(&h.id, h.flags, h.raw_len, &rec.body)?;
                let env = EventEnvelope::from_bytes(&h.id, &raw)?;
                let ev = Event::from_envelope(h.id, env);
                Some(index::EventIndex {
                    links: crate::store::referred_by_event(ev.prev, &ev.parents, &ev.refs),
                    kind: ev.kind,
                })
            } else {
                None
            };
            Ok(Some(IndexItem::Object {
                id: h.id,
                loc: index::ObjLoc {
                    kind,
                    flags: h.flags,
                    seg,
                    offset: rec.offset,
                    body_len: h.body_len,
                    raw_len: h.raw_len,
                    meta_len: h.meta_len,
                    ordinal,
                },
                event,
            }))
        }
    }
}
