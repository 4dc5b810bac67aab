//! `mass export events` (a readable JSONL dump of events with their ids)
//! and `mass export tables` (a run as Parquet or CSV tables, `tables`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ledger::Ledger;

use super::{resolve, CliError};
use crate::cli::TableFormat;
use crate::output::event_json_with_meta;

pub fn events(l: &Ledger, start: Option<&str>, out: &Path) -> Result<ExitCode> {
    let ids: Vec<ledger::Id> = match start {
        // A run: every one of its streams (the main stream and each
        // `RUN/...` stream), each event once, in log order.
        Some(s) if super::audit::is_run(l, s)? => {
            let mut heads = vec![resolve(l, s)?];
            let streams = audit::run_streams(l, s).map_err(super::engine_error)?;
            heads.extend(streams.into_iter().map(|(_, h)| h));
            let mut seen = std::collections::BTreeSet::new();
            let mut v = Vec::new();
            for h in heads {
                for ev in l.chain(h) {
                    let id = ev?.id;
                    if !seen.insert(id) {
                        break; // the rest of this chain is already in
                    }
                    let ord = l.locate(&id)?.map(|loc| loc.ordinal).unwrap_or(u64::MAX);
                    v.push((ord, id));
                }
            }
            v.sort();
            v.into_iter().map(|(_, id)| id).collect()
        }
        Some(s) => {
            let head = resolve(l, s)?;
            let mut v = Vec::new();
            for ev in l.chain(head) {
                v.push(ev?.id);
            }
            v.reverse();
            v
        }
        None => {
            let mut v = l.events_newest_first(None, usize::MAX)?;
            v.reverse();
            v
        }
    };
    let f = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    // Through `Out`, so a reader that stops early (`--out /dev/stdout | head`,
    // a FIFO) ends the export quietly, as on standard output.
    let mut w = BufWriter::new(crate::output::Out(f));
    for id in &ids {
        let ev = l.get_event(id)?;
        serde_json::to_writer(&mut w, &event_json_with_meta(l, &ev))?;
        w.write_all(b"\n")?;
    }
    w.flush()
        .with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!("exported {} events to {}", ids.len(), out.display());
    Ok(ExitCode::SUCCESS)
}

/// `mass export tables RUN... --out DIR [--format parquet|csv]`.
pub fn tables(l: &Ledger, runs: &[String], out: &Path, format: TableFormat) -> Result<ExitCode> {
    let format = match format {
        TableFormat::Parquet => tables::Format::Parquet,
        TableFormat::Csv => tables::Format::Csv,
    };
    let summary = tables::export(l, runs, out, format).map_err(|e| match e {
        // Typed, so the exit code says what went wrong (see main.rs).
        tables::TablesError::NoRun(run) => anyhow::Error::from(CliError::NotFound(format!(
            "no run named {run:?} (`mass status` lists runs)"
        ))),
        tables::TablesError::Ledger(le) => anyhow::Error::from(le),
        tables::TablesError::Engine(e) => super::engine_error(e),
        other => anyhow::Error::from(other),
    })?;
    // A summary for people, on stderr; a reader that went away misses it
    // and the export still succeeded.
    let mut err = std::io::stderr().lock();
    for (path, rows) in &summary.tables {
        let unit = if *rows == 1 { "row " } else { "rows" };
        let _ = writeln!(err, "{rows:>9} {unit}  {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
