//! Maintenance commands: verify, stats, reindex.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ledger::Ledger;
use serde_json::json;

use crate::output::bytes;

pub fn verify(
    l: &Ledger,
    opened: &ledger::RecoveryReport,
    index: bool,
    json: bool,
) -> Result<ExitCode> {
    let check = |ev: &ledger::Event| {
        schemas::check(&ev.kind, ev.version, &ev.payload).map_err(|e| e.to_string())
    };
    // A partial ledger (a lazy clone) lacks blobs by design.
    let partial = remote::Remotes::load(l.dir())?.partial_from;
    let opts = ledger::VerifyOptions {
        index,
        absent_ok: partial.is_some(),
    };
    let mut r = l.verify_with(&check, opts)?;
    if let Some(why) = &opened.log_behind_index {
        r.problems.push(ledger::Problem {
            id: None,
            what: format!("the log is shorter than the index: {why}"),
        });
    }
    let code = crate::output::decide(if r.is_clean() { 0 } else { 3 });
    let mut out = crate::output::stdout();
    if json {
        let v = json!({
            "clean": r.is_clean(),
            "blobs": r.blobs, "trees": r.trees, "events": r.events, "refs": r.refs,
            "records": r.records, "bytes_scanned": r.bytes_scanned,
            "listed_ranges_stepped_over": r.set_aside,
            "absent_links": r.absent,
            "opening": recovery_json(opened),
            "problems": r.problems.iter().map(|p| json!({"id": p.id.map(|i| i.to_hex()), "problem": p.what})).collect::<Vec<_>>(),
        });
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        for line in super::recovery_lines(opened) {
            writeln!(out, "opening: {line}")?;
        }
        if r.set_aside > 0 {
            writeln!(
                out,
                "note: stepped over {} damaged range(s) or tail(s) listed in quarantine/damaged.jsonl",
                r.set_aside
            )?;
        }
        for p in &r.problems {
            writeln!(out, "BAD {p}")?;
        }
        writeln!(
            out,
            "{}: {} objects ({} blobs, {} trees, {} events), {} refs, {} scanned",
            if r.is_clean() { "ok" } else { "FAILED" },
            r.objects(),
            r.blobs,
            r.trees,
            r.events,
            r.refs,
            bytes(r.bytes_scanned)
        )?;
        if let Some(url) = partial.as_deref().filter(|_| r.absent > 0) {
            writeln!(
                out,
                "partial ledger: {} linked object(s) are left on {url} (fetched when read; `mass pull` without --lazy brings them here)",
                r.absent
            )?;
        }
        if !r.is_clean() {
            writeln!(out, "{} problem(s) found", r.problems.len())?;
        }
    }
    Ok(code)
}

pub fn stats(l: &Ledger, json: bool) -> Result<ExitCode> {
    let s = l.stats()?;
    let mut out = crate::output::stdout();
    if json {
        let mut v = serde_json::to_value(&s)?;
        v["dedup_ratio"] = json!(s.dedup_ratio());
        v["compression_ratio"] = json!(s.compression_ratio());
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "{:<8} {:>10} {:>12} {:>12}",
        "kind", "objects", "raw", "stored"
    )?;
    for (k, ks) in &s.by_kind {
        writeln!(
            out,
            "{:<8} {:>10} {:>12} {:>12}",
            k,
            ks.count,
            bytes(ks.raw_bytes),
            bytes(ks.stored_bytes)
        )?;
    }
    writeln!(out, "refs              {}", s.refs)?;
    writeln!(
        out,
        "logical bytes     {}  (every reference counted as a copy)",
        bytes(s.logical_bytes)
    )?;
    writeln!(out, "unique bytes      {}", bytes(s.unique_bytes))?;
    writeln!(out, "stored bytes      {}", bytes(s.stored_bytes))?;
    writeln!(out, "dedup ratio       {:.2}x", s.dedup_ratio())?;
    writeln!(out, "compression ratio {:.2}x", s.compression_ratio())?;
    writeln!(
        out,
        "on disk           {} segments + {} index",
        bytes(s.segment_bytes),
        bytes(s.index_bytes)
    )?;
    Ok(ExitCode::SUCCESS)
}

pub fn reindex(dir: &Path) -> Result<ExitCode> {
    let (_l, r) =
        Ledger::reindex(dir).with_context(|| format!("cannot reindex {}", dir.display()))?;
    for line in super::recovery_lines(&r) {
        crate::output::outln!("{line}")?;
    }
    crate::output::outln!(
        "reindexed {} records from the segment files",
        r.reindexed_records
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `mass migrate --from OLD`: a format-1 ledger copied into a new ledger.
pub fn migrate(from: &Path, dir: &Path) -> Result<ExitCode> {
    if !ledger::is_v1(from) {
        return Err(super::CliError::Usage(format!(
            "{} is not a format-1 ledger (its FORMAT file must say `mass-ledger 1`)",
            from.display()
        ))
        .into());
    }
    let l = Ledger::init(dir).with_context(|| {
        format!(
            "cannot create the new ledger at {} (it must be a new or empty directory)",
            dir.display()
        )
    })?;
    let m = ledger::migrate_v1(from, &l)
        .with_context(|| format!("cannot migrate {} into {}", from.display(), dir.display()))?;
    crate::output::outln!(
        "copied {} batches ({} objects, {} ref updates) from {} into {}",
        m.batches,
        m.objects,
        m.ref_updates,
        from.display(),
        dir.display()
    )?;
    if m.listed_damage > 0 {
        crate::output::outln!(
            "stepped over {} range(s) the old ledger listed as damaged",
            m.listed_damage
        )?;
    }
    if m.tail_bytes > 0 {
        crate::output::outln!(
            "left out {} bytes after the old log's last commit marker (an interrupted write, never acknowledged)",
            m.tail_bytes
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn repair(dir: &Path, json: bool) -> Result<ExitCode> {
    let (_l, r) =
        Ledger::repair(dir).with_context(|| format!("cannot repair {}", dir.display()))?;
    let mut out = crate::output::stdout();
    if json {
        serde_json::to_writer_pretty(&mut out, &recovery_json(&r))?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    for line in super::recovery_lines(&r) {
        writeln!(out, "{line}")?;
    }
    if r.known_damage > 0 {
        writeln!(
            out,
            "stepped over {} range(s) listed before",
            r.known_damage
        )?;
    }
    writeln!(
        out,
        "kept {} intact records; listed {} new damaged range(s) (copies in {}/, list in {}/damaged.jsonl); no segment bytes were changed{}",
        r.reindexed_records,
        r.damage.len(),
        ledger::QUARANTINE_DIR,
        ledger::QUARANTINE_DIR,
        if r.damage.is_empty() { "" } else { "; run `mass verify` to see what depended on them" }
    )?;
    Ok(ExitCode::SUCCESS)
}

/// What opening or repairing did, as JSON.
fn recovery_json(r: &ledger::RecoveryReport) -> serde_json::Value {
    json!({
        "reindexed_records": r.reindexed_records,
        "index_rebuilt": r.index_rebuilt,
        "new_segment": r.new_segment,
        "tails": r.tails.iter().map(|s| json!({
            "segment": s.segment, "offset": s.offset, "len": s.len,
            "file": s.file.display().to_string(),
        })).collect::<Vec<_>>(),
        "damage": r.damage,
        "known_damage": r.known_damage,
    })
}
