//! Recovery: reading the committed log into an index, and classifying every
//! bad byte by the evidence there is about it.
//!
//! One scan serves every caller: a writer opening the ledger (index the log
//! past the index's end), `reindex`/`repair` (the same from the start), and a
//! reader that takes no lock (from the start, into memory, never writing).
//! The scan never changes a file; what is found is returned, and the writer
//! lists it durably (`quarantine/damaged.jsonl`) and moves on.
//!
//! What proves that bytes were committed (durable, and so perhaps
//! acknowledged):
//! - a valid commit marker after them whose batch starts after them: a
//!   batch is written only after the one before it was durable;
//! - an index table covering them (tables are written, and fsynced, only for
//!   durable data), the writer's watermark (published after each `fdatasync`),
//!   or the next segment's header (which names the committed end of the
//!   segment before it). These are [`Evidence`].
//!
//! Bad bytes before such proof are *damage*: listed, stepped over, every
//! intact record around them indexed. A batch whose own marker is intact but
//! which holds bad bytes is *held* until something later proves it: a power
//! cut can keep a write's marker and lose a page before it, and a batch is
//! atomic, so without proof none of it is read. Bytes after the last batch
//! known to be whole and committed are a *tail*, and all that can be said of
//! them is that they are not known to have been acknowledged. Their records
//! are not indexed, and nothing is cut: the next writer goes on in a new
//! segment whose header records where the committed data ended.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{LedgerError, Result};
use crate::id::ObjectKind;
use crate::index::{self, Index, IndexItem, Pos};
use crate::object::{Event, EventEnvelope, RefUpdate};
use crate::segment::{
    self, decode_body, At, HeaderRead, RecordType, Salt, SegmentFile, SEGMENT_HEADER_LEN,
};

/// What kind of bad bytes a listed range is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DamageKind {
    /// Bytes that were committed, or may have been, and no longer check.
    Damage,
    /// A segment header with neither copy intact.
    Header,
    /// Bytes after the last commit marker that nothing durable shows were
    /// committed: not known to have been acknowledged.
    Tail,
}

/// A range of bad bytes in a segment, as found by a scan or listed in
/// `quarantine/damaged.jsonl`.
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
    #[serde(default = "damage_kind_default")]
    pub kind: DamageKind,
}

fn damage_kind_default() -> DamageKind {
    DamageKind::Damage
}

/// Durable statements about how far each segment was committed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Evidence {
    /// Per segment: the furthest committed end anything proves, and what.
    known: BTreeMap<u32, (u64, String)>,
}

impl Evidence {
    /// Records that `source` proves segment `seg` was committed up to `end`.
    pub fn note(&mut self, seg: u32, end: u64, source: impl Into<String>) {
        match self.known.get(&seg) {
            Some((e, _)) if *e >= end => {}
            _ => {
                self.known.insert(seg, (end, source.into()));
            }
        }
    }

    pub fn get(&self, seg: u32) -> Option<&(u64, String)> {
        self.known.get(&seg)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, u64, &str)> {
        self.known.iter().map(|(s, (e, w))| (*s, *e, w.as_str()))
    }

    /// What the index tables prove.
    pub fn note_tables(&mut self, tables: &[index::TableEvidence]) {
        for t in tables {
            let name = format!("index table {}", file_name(&t.path));
            self.note(t.end.seg, t.end.off, name.clone());
            for &(s, e) in &t.seg_ends {
                self.note(s, e, name.clone());
            }
        }
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// `Some(reason)` if the log holds less than the evidence says it did: a
/// missing first segment, a missing segment, or one shorter than something
/// durable shows it was. Acknowledged data is gone.
pub(crate) fn log_behind(seg_dir: &Path, segs: &[u32], ev: &Evidence) -> Result<Option<String>> {
    match segs.first() {
        None => {
            return Ok(Some(format!(
                "{} holds no segment files",
                seg_dir.display()
            )))
        }
        Some(&f) if f != 1 => {
            return Ok(Some(format!(
                "segment 1 is missing from {} (the log starts at segment {f})",
                seg_dir.display()
            )))
        }
        _ => {}
    }
    for (seg, end, source) in ev.iter() {
        let path = segment::segment_path(seg_dir, seg);
        if !segs.contains(&seg) {
            return Ok(Some(format!(
                "{source} shows segment {seg} held data up to byte {end}, but {} is missing",
                path.display()
            )));
        }
        let len = std::fs::metadata(&path)
            .map_err(|e| LedgerError::io(&path, e))?
            .len();
        if len < end {
            return Ok(Some(format!(
                "{} holds {len} bytes but {source} shows it held {end}: {} bytes of committed data are missing",
                path.display(),
                end - len
            )));
        }
    }
    Ok(None)
}

/// What a scan is asked to do.
pub(crate) struct ScanSpec<'a> {
    pub seg_dir: &'a Path,
    pub segs: &'a [u32],
    pub salt: Salt,
    pub evidence: &'a Evidence,
    /// Ranges listed in `quarantine/damaged.jsonl`: found again, they are
    /// counted as known rather than reported as new.
    pub listed: &'a [Damage],
    /// Read nothing at or past this position (a reader stops at the live
    /// writer's watermark: what was durable when it looked).
    pub limit: Option<(u32, u64)>,
}

/// What a scan found.
#[derive(Debug, Default)]
pub(crate) struct ScanOutcome {
    /// Records (objects and ref updates) indexed.
    pub records: u64,
    /// Bad ranges not listed before (damage and headers; tails separately).
    pub damage: Vec<Damage>,
    /// Listed ranges met again.
    pub known_damage: u64,
    /// The last scanned segment's bytes past its committed end, if any
    /// (listed or not).
    pub tail: Option<Damage>,
    /// Unlisted tails of sealed segments (a crash after the next segment
    /// was started, before the tail was listed).
    pub sealed_tails: Vec<Damage>,
    /// The last scanned segment's header has no intact copy.
    pub last_header_damaged: bool,
}

impl ScanOutcome {
    fn found(&mut self, spec: &ScanSpec<'_>, d: Damage) {
        let listed = spec
            .listed
            .iter()
            .any(|l| l.segment == d.segment && l.offset == d.offset);
        if listed {
            self.known_damage += 1;
        } else {
            self.damage.push(d);
        }
    }
}

/// A bad range met in the current batch, classified when the batch ends.
struct Bad {
    offset: u64,
    len: u64,
    reason: String,
    claimed_id: Option<String>,
}

/// A record of the batch being read, indexed once the batch is known to be
/// committed.
struct PendingItem {
    item: IndexItem,
    end: u64,
}

/// Scans `spec.segs` from `start`, adding the index entries of everything
/// committed to `idx`.
pub(crate) fn scan_log(spec: &ScanSpec<'_>, idx: &Index, start: Pos) -> Result<ScanOutcome> {
    let mut out = ScanOutcome::default();
    let mut ordinal = start.ordinal;
    let Some(&last) = spec.segs.last() else {
        return Ok(out);
    };
    for &seg in spec.segs.iter().filter(|&&s| s >= start.seg) {
        if spec.limit.is_some_and(|(ls, _)| seg > ls) {
            break;
        }
        let from = if seg == start.seg {
            start.off.max(SEGMENT_HEADER_LEN)
        } else {
            SEGMENT_HEADER_LEN
        };
        let path = segment::segment_path(spec.seg_dir, seg);
        let mut f = SegmentFile::open(&path, seg, spec.salt)?;
        let is_last = seg == last || spec.limit.is_some_and(|(ls, _)| seg == ls);
        if let HeaderRead::Damaged(why) = f.header()? {
            if is_last {
                out.last_header_damaged = true;
            }
            let len = f.file_len().min(SEGMENT_HEADER_LEN);
            out.found(
                spec,
                Damage {
                    segment: seg,
                    offset: 0,
                    len,
                    reason: format!(
                        "segment header has no intact copy ({why}); its records are read with the ledger's salt"
                    ),
                    claimed_id: None,
                    kind: DamageKind::Header,
                },
            );
        }
        let end = match spec.limit {
            Some((ls, lo)) if ls == seg => lo.min(f.file_len()),
            _ => f.file_len(),
        };
        let mut st = SegScan {
            seg,
            path: path.clone(),
            pending: Vec::new(),
            batch_records: 0,
            batch_bad: false,
            bad: Vec::new(),
            held_marker: None,
            committed_end: from,
            ordinal,
        };
        let mut at = from;
        loop {
            match f.read_at(at, end)? {
                At::End => break,
                At::Record(rec) => {
                    at = rec.offset + rec.header.total_len();
                    st.record(spec, rec, idx, &mut out)?;
                }
                At::Bad {
                    reason,
                    len,
                    claimed_id,
                } => {
                    let stop = match len {
                        Some(l) => (at + l).min(end),
                        None => f.next_header(at, end)?.unwrap_or(end),
                    };
                    st.bad.push(Bad {
                        offset: at,
                        len: stop - at,
                        reason,
                        claimed_id: claimed_id.map(|i| i.to_hex()),
                    });
                    st.batch_bad = true;
                    at = stop;
                }
            }
        }
        st.finish(spec, idx, end, &mut out)?;
        ordinal = st.ordinal;
        if let Some(t) = out.tail.take() {
            if is_last {
                out.tail = Some(t);
            } else if !spec
                .listed
                .iter()
                .any(|l| l.segment == t.segment && l.offset == t.offset)
            {
                out.sealed_tails.push(t);
            } else {
                out.known_damage += 1;
            }
        }
    }
    Ok(out)
}

/// The state of one segment's scan.
struct SegScan {
    seg: u32,
    path: PathBuf,
    /// Records not yet known to be committed (the current batch, and a held
    /// one before it).
    pending: Vec<PendingItem>,
    /// Records and bad bytes since the last commit marker.
    batch_records: u32,
    batch_bad: bool,
    /// Bad ranges not yet known to be committed.
    bad: Vec<Bad>,
    /// A batch whose marker is intact but which holds bad bytes is *held*:
    /// committed only if something later proves it (a later marker, or
    /// evidence), else a tail, none of it indexed (a power cut can keep a
    /// write's marker and lose a page before it: such a batch was never
    /// acknowledged, and its intact records must not appear without the
    /// rest). The held marker's offset.
    held_marker: Option<u64>,
    /// Everything before this is committed and indexed.
    committed_end: u64,
    /// The ordinal the next indexed object gets.
    ordinal: u64,
}

impl SegScan {
    /// One intact record: a commit marker closes the batch; anything else
    /// waits in `pending` until something proves it committed.
    fn record(
        &mut self,
        spec: &ScanSpec<'_>,
        rec: segment::ScannedRecord,
        idx: &Index,
        out: &mut ScanOutcome,
    ) -> Result<()> {
        let end = rec.offset + rec.header.total_len();
        if rec.header.rtype == RecordType::Commit {
            let (count, batch_start) = segment::parse_commit(&rec.body).unwrap_or((u32::MAX, end));
            if count != self.batch_records && !self.batch_bad {
                out.found(
                    spec,
                    Damage {
                        segment: self.seg,
                        offset: rec.offset,
                        len: rec.header.total_len(),
                        reason: format!(
                            "commit marker counts {count} records, {} precede it",
                            self.batch_records
                        ),
                        claimed_id: None,
                        kind: DamageKind::Damage,
                    },
                );
            }
            // This marker proves every byte before its batch durable: a
            // batch is written only once the one before it is.
            let at = rec.offset;
            let why = move |_: &Bad| {
                format!("committed: the intact commit marker at byte {at} closes a later batch")
            };
            self.commit_through(spec, batch_start.min(rec.offset), &why, idx, out);
            // Held only if bad bytes lie inside this marker's own batch (a
            // damaged marker of the batch before is not in it).
            if !self.bad.is_empty() {
                self.held_marker = Some(rec.offset);
            } else {
                self.held_marker = None;
                self.commit_through(spec, end, &why, idx, out);
            }
            self.batch_records = 0;
            self.batch_bad = false;
            return Ok(());
        }
        self.batch_records += 1;
        match index_item(&rec, self.seg, 0) {
            Ok(Some(item)) => self.pending.push(PendingItem { item, end }),
            Ok(None) => {}
            // The record's checks hold but its content does not decode:
            // damage done before the checks were computed, i.e. a bug, not
            // bit rot. Reported, never indexed.
            Err(e) => {
                self.bad.push(Bad {
                    offset: rec.offset,
                    len: rec.header.total_len(),
                    reason: format!("{e} (its checks hold)"),
                    claimed_id: Some(rec.header.id.to_hex()),
                });
                self.batch_bad = true;
            }
        }
        Ok(())
    }

    /// Indexes every pending record ending at or before `upto`, reports the
    /// bad ranges before it as damage (with `why` they count as
    /// committed), and moves the committed end there.
    fn commit_through(
        &mut self,
        spec: &ScanSpec<'_>,
        upto: u64,
        why: &dyn Fn(&Bad) -> String,
        idx: &Index,
        out: &mut ScanOutcome,
    ) {
        let mut items = Vec::new();
        let mut keep = Vec::new();
        for mut p in std::mem::take(&mut self.pending) {
            if p.end > upto {
                keep.push(p);
                continue;
            }
            if let IndexItem::Object { loc, .. } = &mut p.item {
                loc.ordinal = self.ordinal;
                self.ordinal += 1;
            }
            items.push(p.item);
        }
        out.records += items.len() as u64;
        self.pending = keep;
        let mut before = Vec::new();
        let mut after = Vec::new();
        for b in std::mem::take(&mut self.bad) {
            if b.offset + b.len <= upto {
                before.push(b);
            } else if b.offset >= upto {
                after.push(b);
            } else {
                // Evidence ends inside the range: the part before it is
                // committed, the rest is not known to be.
                after.push(Bad {
                    offset: upto,
                    len: b.offset + b.len - upto,
                    reason: b.reason.clone(),
                    claimed_id: None,
                });
                before.push(Bad {
                    len: upto - b.offset,
                    ..b
                });
            }
        }
        for b in before {
            let reason = format!("{} ({})", b.reason, why(&b));
            out.found(
                spec,
                Damage {
                    segment: self.seg,
                    offset: b.offset,
                    len: b.len,
                    reason,
                    claimed_id: b.claimed_id,
                    kind: DamageKind::Damage,
                },
            );
        }
        self.bad = after;
        self.committed_end = self.committed_end.max(upto);
        idx.apply(
            &items,
            Pos {
                seg: self.seg,
                off: self.committed_end,
                ordinal: self.ordinal,
            },
        );
        if idx.mem_objects() >= index::FLUSH_OBJECTS {
            // A table that cannot be written costs only a longer scan later.
            let _ = idx.flush();
        }
    }

    /// The end of the segment: evidence may prove records past the last
    /// marker committed (a damaged marker); what remains is a tail.
    fn finish(
        &mut self,
        spec: &ScanSpec<'_>,
        idx: &Index,
        end: u64,
        out: &mut ScanOutcome,
    ) -> Result<()> {
        if let Some((known, source)) = spec.evidence.get(self.seg) {
            if *known > self.committed_end {
                let upto = (*known).min(end);
                let source = source.clone();
                let why =
                    move |_: &Bad| format!("committed: {source} shows the log reached byte {upto}");
                self.commit_through(spec, upto, &why, idx, out);
            }
        }
        // An empty or header-only segment still moves the index's end.
        idx.apply(
            &[],
            Pos {
                seg: self.seg,
                off: self.committed_end,
                ordinal: self.ordinal,
            },
        );
        if self.committed_end < end {
            let len = end - self.committed_end;
            let held = match self.held_marker {
                Some(m) if m >= self.committed_end => format!(
                    " (the batch the intact commit marker at byte {m} closes holds bad bytes, and nothing else shows it was committed)"
                ),
                _ => String::new(),
            };
            out.tail = Some(Damage {
                segment: self.seg,
                offset: self.committed_end,
                len,
                reason: format!(
                    "{len} bytes after the last commit marker of {} whose batch is whole, past everything that shows what was committed{held}: not known to have been acknowledged",
                    self.path.display()
                ),
                claimed_id: None,
                kind: DamageKind::Tail,
            });
        }
        Ok(())
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
