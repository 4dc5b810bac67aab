//! Opening a ledger, for writing or for reading without the lock.
//!
//! A writer: finishes an interrupted index swap, checks the whole log
//! against everything durable that says how much it held (index tables,
//! segment headers, the last watermark), refusing if anything is missing;
//! optionally rebuilds the index; scans the log past the index; lists new
//! damage and tails durably; and, after a tail or a damaged header in the
//! last segment, goes on in a new segment whose header records where the
//! committed data ended. No segment byte is ever changed.
//!
//! A reader: the same checks and scan into an in-memory index, writing
//! nothing, and stopping at a live writer's watermark.

use std::path::Path;
use std::sync::Arc;

use crate::error::{LedgerError, Result};
use crate::files::{self, AppendFile, FileLayer};
use crate::index::{Index, Pos};
use crate::open::{self, Watermark};
use crate::recovery::{self, Damage, DamageKind, Evidence, ScanOutcome, ScanSpec};
use crate::segment::{self, Salt, SEGMENT_HEADER_LEN};
use crate::store::{Options, RecoveryReport, SetAside, INDEX_DIR, SEGMENTS_DIR};

/// Where the log starts: the first record of segment 1.
pub(crate) fn log_start() -> Pos {
    Pos {
        seg: 1,
        off: SEGMENT_HEADER_LEN,
        ordinal: 0,
    }
}

/// A writer's view after opening.
pub(crate) struct Opened {
    pub idx: Index,
    pub salt: Salt,
    pub file: Box<dyn AppendFile>,
    /// Where the next commit goes.
    pub seg: u32,
    pub offset: u64,
    pub report: RecoveryReport,
    pub watermark: Watermark,
}

/// A file layer whose syncs do nothing: derived files written through it
/// are not durable (the test switch `no_durable_derived`).
#[derive(Debug)]
struct NoSync(Arc<dyn FileLayer>);

impl FileLayer for NoSync {
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>> {
        self.0.open_append(path)
    }
    fn write_file(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        self.0.write_file(path, bytes)
    }
    fn sync_file(&self, _: &Path) -> std::io::Result<()> {
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.0.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        self.0.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.0.remove_dir_all(path)
    }
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.0.create_dir_all(path)
    }
    fn sync_dir(&self, _: &Path) -> std::io::Result<()> {
        Ok(())
    }
}

/// The layer derived files (tables, `damaged.jsonl`, quarantine) go through.
pub(crate) fn derived_files(opts: &Options) -> Arc<dyn FileLayer> {
    if opts.unprotected.no_durable_derived {
        Arc::new(NoSync(opts.files.clone()))
    } else {
        opts.files.clone()
    }
}

fn salt_for(
    opts: &Options,
    dir: &Path,
    seg_dir: &Path,
    segs: &[u32],
    fmt: Option<Salt>,
) -> Result<Salt> {
    if opts.unprotected.unkeyed_checks {
        return Ok(Salt::unprotected());
    }
    open::resolve_salt(dir, seg_dir, segs, fmt)
}

/// Everything durable that says how far each segment was committed.
fn gather_evidence(
    opts: &Options,
    seg_dir: &Path,
    segs: &[u32],
    salt: &Salt,
    tables: &[crate::index::TableEvidence],
    watermark: Option<(u32, u64)>,
) -> Result<Evidence> {
    let mut ev = Evidence::default();
    if opts.unprotected.no_evidence {
        return Ok(ev);
    }
    ev.note_tables(tables);
    open::header_evidence(seg_dir, segs, salt, &mut ev)?;
    if let Some((s, o)) = watermark {
        ev.note(s, o, "the writer's watermark");
    }
    Ok(ev)
}

fn index_error(detail: String) -> LedgerError {
    LedgerError::Index { detail }
}

/// Opens for writing (the caller holds the lock).
pub(crate) fn writer(
    dir: &Path,
    opts: &Options,
    fmt: Option<Salt>,
    rebuild: bool,
) -> Result<Opened> {
    let files = opts.files.as_ref();
    let derived = derived_files(opts);
    let seg_dir = dir.join(SEGMENTS_DIR);
    open::finish_index_swap(dir, derived.as_ref())?;
    let segs = open::list_segments_checked(&seg_dir)?;
    let salt = salt_for(opts, dir, &seg_dir, &segs, fmt)?;
    // The last watermark is evidence (it is left as it is until this writer
    // publishes its own, so a refused open keeps it).
    let old_mark = Watermark::read(dir, &salt);
    let index_dir = dir.join(INDEX_DIR);
    let (idx, found) =
        Index::open(&index_dir, log_start(), Some(derived.clone())).map_err(index_error)?;
    let ev = gather_evidence(opts, &seg_dir, &segs, &salt, &found.evidence, old_mark)?;
    if let Some(detail) = recovery::log_behind(&seg_dir, &segs, &ev)? {
        return Err(LedgerError::LogBehindIndex { detail });
    }
    let watermark = Watermark::open(dir, salt)?;
    let mut report = RecoveryReport::default();
    // The log holds everything every table covers: damaged and unchained
    // tables are redundant derived data.
    if !found.ignored.is_empty() {
        report.index_rebuilt = Some(
            found
                .ignored
                .iter()
                .map(|(p, why)| format!("{}: {why}", p.display()))
                .collect::<Vec<_>>()
                .join("; "),
        );
    }
    for p in found.ignored.iter().map(|(p, _)| p).chain(&found.unchained) {
        let _ = derived.remove_file(p);
    }
    let idx = if rebuild {
        drop(idx);
        let r = rebuild_index(dir, opts, &segs, salt, &ev)?;
        report.reindexed_records += r.reindexed_records;
        report.damage.extend(r.damage);
        report.known_damage += r.known_damage;
        Index::open(&index_dir, log_start(), Some(derived.clone()))
            .map_err(index_error)?
            .0
    } else {
        idx
    };
    let listed = open::read_damaged(dir)?;
    let spec = ScanSpec {
        seg_dir: &seg_dir,
        segs: &segs,
        salt,
        evidence: &ev,
        listed: &listed,
        limit: None,
    };
    let out = recovery::scan_log(&spec, &idx, idx.end())?;
    report.reindexed_records += out.records;
    report.known_damage += out.known_damage;
    let last = *segs.last().unwrap_or(&1);
    let needs_new = out.tail.is_some() || out.last_header_damaged;
    list_found(dir, &seg_dir, derived.as_ref(), &listed, &out, &mut report)?;
    let end = idx.end();
    let (seg, offset) = if needs_new {
        let next = last + 1;
        create_segment(files, &seg_dir, next, &salt, end.off)?;
        idx.apply(
            &[],
            Pos {
                seg: next,
                off: SEGMENT_HEADER_LEN,
                ordinal: end.ordinal,
            },
        );
        report.new_segment = Some(next);
        (next, SEGMENT_HEADER_LEN)
    } else {
        (last, end.off)
    };
    let path = segment::segment_path(&seg_dir, seg);
    let file = files
        .open_append(&path)
        .map_err(|e| LedgerError::io(&path, e))?;
    Ok(Opened {
        idx,
        salt,
        file,
        seg,
        offset,
        report,
        watermark,
    })
}

/// Lists (durably, with quarantine copies) what the scan found that was not
/// listed before, and reports it.
fn list_found(
    dir: &Path,
    seg_dir: &Path,
    derived: &dyn FileLayer,
    listed: &[Damage],
    out: &ScanOutcome,
    report: &mut RecoveryReport,
) -> Result<()> {
    let is_listed = |d: &Damage| {
        listed
            .iter()
            .any(|l| l.segment == d.segment && l.offset == d.offset)
    };
    let mut new: Vec<Damage> = out.damage.clone();
    new.extend(out.sealed_tails.iter().cloned());
    if let Some(t) = out.tail.as_ref().filter(|t| !is_listed(t)) {
        new.push(t.clone());
    }
    if new.is_empty() {
        return Ok(());
    }
    let copies = open::list_damage(dir, seg_dir, derived, &new)?;
    for (d, file) in new.into_iter().zip(copies) {
        if d.kind == DamageKind::Tail {
            report.tails.push(SetAside {
                segment: d.segment,
                offset: d.offset,
                len: d.len,
                file,
            });
        } else {
            report.damage.push(d);
        }
    }
    Ok(())
}

/// Builds a new index from the whole log in `index.new/` and swaps it in.
fn rebuild_index(
    dir: &Path,
    opts: &Options,
    segs: &[u32],
    salt: Salt,
    ev: &Evidence,
) -> Result<RecoveryReport> {
    let derived = derived_files(opts);
    let seg_dir = dir.join(SEGMENTS_DIR);
    let new_dir = dir.join(open::INDEX_NEW_DIR);
    if new_dir.exists() {
        derived
            .remove_dir_all(&new_dir)
            .map_err(|e| LedgerError::io(&new_dir, e))?;
    }
    files::create_dir_durably(derived.as_ref(), &new_dir)
        .map_err(|e| LedgerError::io(&new_dir, e))?;
    let listed = open::read_damaged(dir)?;
    let (idx, _) =
        Index::open(&new_dir, log_start(), Some(derived.clone())).map_err(index_error)?;
    let spec = ScanSpec {
        seg_dir: &seg_dir,
        segs,
        salt,
        evidence: ev,
        listed: &listed,
        limit: None,
    };
    let out = recovery::scan_log(&spec, &idx, log_start())?;
    let mut report = RecoveryReport {
        reindexed_records: out.records,
        known_damage: out.known_damage,
        ..Default::default()
    };
    // The last segment's tail is listed by the open that follows.
    let rest = ScanOutcome {
        damage: out.damage.clone(),
        sealed_tails: out.sealed_tails.clone(),
        ..Default::default()
    };
    list_found(dir, &seg_dir, derived.as_ref(), &listed, &rest, &mut report)?;
    idx.flush().map_err(index_error)?;
    drop(idx);
    open::swap_in_new_index(dir, derived.as_ref())?;
    Ok(report)
}

/// Starts segment `seg_no` durably (temp file, fsync, rename, directory
/// fsync), its header naming the previous segment's committed end.
pub(crate) fn create_segment(
    files: &dyn FileLayer,
    seg_dir: &Path,
    seg_no: u32,
    salt: &Salt,
    prev_end: u64,
) -> Result<()> {
    let path = segment::segment_path(seg_dir, seg_no);
    // Never replace a segment: a new one's number is past every existing one.
    if path.exists() {
        return Err(LedgerError::CorruptLog {
            path,
            offset: 0,
            detail: "a new segment was to be created under this name, but the file exists; \
                     nothing was changed"
                .into(),
        });
    }
    let header = segment::SegmentHeader {
        seg_no,
        salt: *salt.bytes(),
        prev_end,
    };
    files::write_durably(files, &path, &header.encode()).map_err(|e| LedgerError::io(&path, e))
}

/// Opens without the lock, writing nothing: the committed log in memory.
pub(crate) fn reader(dir: &Path, opts: &Options) -> Result<(Index, RecoveryReport, Salt)> {
    let fmt = open::check_format(dir)?;
    let watch = !opts.unprotected.no_reader_watermark;
    let alive = watch && open::writer_alive(dir);
    let first = read_once(dir, opts, fmt, alive.then_some(None))?;
    // A writer that started (or finished recovering) while this scan ran
    // may have appended batches that were not durable yet: read again,
    // stopping at its watermark.
    if watch && open::writer_alive(dir) {
        if let Some(w) = Watermark::read(dir, &first.2) {
            let end = first.0.end();
            if (end.seg, end.off) > w {
                return read_once(dir, opts, fmt, Some(Some(w)));
            }
        }
    }
    Ok(first)
}

/// One read-only scan. `limit`: `None` reads every committed batch;
/// `Some(None)` stops at the watermark the writer publishes now (when it
/// has one); `Some(Some(w))` stops at `w`.
fn read_once(
    dir: &Path,
    opts: &Options,
    fmt: Option<Salt>,
    limit: Option<Option<(u32, u64)>>,
) -> Result<(Index, RecoveryReport, Salt)> {
    let seg_dir = dir.join(SEGMENTS_DIR);
    // Tables before segments: a table covers only durable data, so the
    // segments it names exist before it does.
    let opened = Index::open(&dir.join(INDEX_DIR), log_start(), None);
    // The watermark before the segments too: it names only durable data,
    // whose segment exists before the watermark moves there.
    let quick = if opts.unprotected.unkeyed_checks {
        Some(Salt::unprotected())
    } else {
        fmt
    };
    let early_mark = quick.and_then(|s| Watermark::read(dir, &s));
    let segs = open::list_segments_checked(&seg_dir)?;
    let salt = salt_for(opts, dir, &seg_dir, &segs, fmt)?;
    let mark = if quick == Some(salt) {
        early_mark
    } else {
        // FORMAT's salt line is damaged: read it now, and use it only if
        // its segment was listed.
        Watermark::read(dir, &salt).filter(|(s, _)| segs.contains(s))
    };
    let limit = match limit {
        None => None,
        Some(None) => mark,
        Some(Some(w)) => Some(w),
    };
    let mut report = RecoveryReport::default();
    let (idx, tables) = match opened {
        Ok((idx, found)) => {
            if !found.ignored.is_empty() {
                report.index_rebuilt =
                    Some(format!("{} index table(s) unusable", found.ignored.len()));
            }
            (idx, found.evidence)
        }
        Err(why) => {
            report.index_rebuilt = Some(why);
            (Index::in_memory(log_start()), Vec::new())
        }
    };
    let ev = gather_evidence(opts, &seg_dir, &segs, &salt, &tables, mark)?;
    let idx = match recovery::log_behind(&seg_dir, &segs, &ev)? {
        // Tables that claim more than the log holds are not used: the log
        // itself is read, and the loss is reported.
        Some(why) => {
            report.log_behind_index = Some(why);
            Index::in_memory(log_start())
        }
        None => idx,
    };
    let listed = open::read_damaged(dir)?;
    let spec = ScanSpec {
        seg_dir: &seg_dir,
        segs: &segs,
        salt,
        evidence: &ev,
        listed: &listed,
        limit,
    };
    let out = recovery::scan_log(&spec, &idx, idx.end())?;
    report.reindexed_records = out.records;
    report.known_damage = out.known_damage;
    report.damage = out.damage;
    report.damage.extend(out.sealed_tails);
    report.unread_tail = out
        .tail
        .as_ref()
        .filter(|t| {
            !listed
                .iter()
                .any(|l| l.segment == t.segment && l.offset == t.offset)
        })
        .map_or(0, |t| t.len);
    Ok((idx, report, salt))
}
