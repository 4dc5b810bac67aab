//! Read commands: log, show, cat, refs, fork.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Result};
use ledger::{Ledger, ObjectKind};
use serde_json::json;

use super::resolve;
use crate::output::{bytes, event_json_with_meta, event_line, iso_time};

pub fn log(
    l: &Ledger,
    start: Option<&str>,
    kind: Option<&str>,
    limit: Option<usize>,
    json: bool,
) -> Result<ExitCode> {
    let limit = limit.unwrap_or(usize::MAX);
    let mut events = Vec::new();
    match start {
        Some(s) => {
            let head = resolve(l, s)?;
            if l.kind_of(&head)? != Some(ObjectKind::Event) {
                bail!("{s} is not an event or a ref; `mass log` follows event streams");
            }
            for ev in l.chain(head) {
                let ev = ev?;
                if kind.is_some_and(|k| k != ev.kind) {
                    continue;
                }
                events.push(ev);
                if events.len() >= limit {
                    break;
                }
            }
        }
        None => {
            for id in l.events_newest_first(kind, limit)? {
                events.push(l.get_event(&id)?);
            }
        }
    }
    let mut out = crate::output::stdout();
    if json {
        let v: Vec<_> = events.iter().map(|e| event_json_with_meta(l, e)).collect();
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        for ev in &events {
            writeln!(out, "{}", event_line(ev))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Parents or refs listed one by one before `mass show` summarises the rest.
const LINKS_SHOWN: usize = 8;

/// One line per link, labelled; past `LINKS_SHOWN` (and one more, which
/// the summary line would not save) the rest is summarised.
fn links(out: &mut impl Write, label: &str, items: &[String], id: &ledger::Id) -> Result<()> {
    let shown = if items.len() > LINKS_SHOWN + 1 {
        LINKS_SHOWN
    } else {
        items.len()
    };
    for item in &items[..shown] {
        writeln!(out, "{label:<7} {item}")?;
    }
    if shown < items.len() {
        writeln!(
            out,
            "{label:<7} ... and {} more (`mass show {} --json` lists all)",
            items.len() - shown,
            id.short(12)
        )?;
    }
    Ok(())
}

/// `mass show`: the object `s` names, as JSON or for people.
pub fn show(l: &Ledger, s: &str, json: bool) -> Result<ExitCode> {
    let id = resolve(l, s)?;
    let loc = l.require(&id)?;
    let mut out = crate::output::stdout();
    match loc.kind {
        ObjectKind::Event => show_event(l, &id, json, &mut out)?,
        ObjectKind::Tree => show_tree(l, &id, json, &mut out)?,
        ObjectKind::Blob => show_blob(l, &id, &loc, json, &mut out)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// An event: its JSON with metadata, or, for people, the payload first
/// (what the event says), then where it sits and what it links; long link
/// lists are summarised.
fn show_event(l: &Ledger, id: &ledger::Id, json: bool, out: &mut impl Write) -> Result<()> {
    let ev = l.get_event(id)?;
    let v = event_json_with_meta(l, &ev);
    if json {
        serde_json::to_writer_pretty(&mut *out, &v)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "event   {} ({} v{})", ev.id, ev.kind, ev.version)?;
    match v.get("payload_error") {
        Some(e) => writeln!(
            out,
            "payload cannot be decoded: {}",
            e.as_str().unwrap_or("")
        )?,
        None => writeln!(out, "{}", serde_json::to_string_pretty(&v["payload"])?)?,
    }
    writeln!(out, "kind    {} v{}", ev.kind, ev.version)?;
    writeln!(out, "stream  {} #{}", ev.stream, ev.seq)?;
    if let Some(p) = ev.prev {
        writeln!(out, "prev    {p}")?;
    }
    let mut parents = Vec::new();
    for p in &ev.parents {
        parents.push(p.to_string());
    }
    links(out, "parent", &parents, &ev.id)?;
    let mut refs = Vec::new();
    for r in &ev.refs {
        let k = l.kind_of(r)?.map(|k| k.name()).unwrap_or("missing");
        refs.push(format!("{r} ({k})"));
    }
    links(out, "ref", &refs, &ev.id)?;
    if let Some(ms) = v["meta"]["wall_ms"].as_u64() {
        // A stand-in (`ledger::WALL_MS_FROM`, an import's file mtime) is
        // said to be one on the line itself.
        let stand_in = v["meta"]["extra"][ledger::WALL_MS_FROM]
            .as_str()
            .map(|from| format!("; a stand-in ({from}), not when the step happened"))
            .unwrap_or_default();
        writeln!(
            out,
            "time    {} (host {}, pid {}{stand_in})",
            iso_time(ms),
            v["meta"]["host"].as_str().unwrap_or(""),
            v["meta"]["pid"]
        )?;
    }
    // A stand-in final workspace (`ledger::TREE_FROM`, an import's run
    // folder) is said to be one on its own line, as a stand-in time is.
    if let Some(from) = v["meta"]["extra"][ledger::TREE_FROM].as_str() {
        writeln!(
            out,
            "tree    {} from the {from}, not proven to be the workspace at the episode's end",
            v["payload"]["tree"].as_str().unwrap_or("(the payload's)")
        )?;
    }
    if let Some(extra) = v["meta"]["extra"].as_object() {
        for (k, val) in extra {
            writeln!(out, "meta    {k}={}", val.as_str().unwrap_or(""))?;
        }
    }
    Ok(())
}

/// A tree: its entries as JSON, or a line per entry for people.
fn show_tree(l: &Ledger, id: &ledger::Id, json: bool, out: &mut impl Write) -> Result<()> {
    let t = l.get_tree(id)?;
    if json {
        let entries: Vec<_> = t
            .entries
            .iter()
            .map(|e| json!({"path": e.path, "kind": e.kind.name(), "mode": format!("{:o}", e.mode), "size": e.size, "blob": e.blob_id().map(|b| b.to_hex())}))
            .collect();
        serde_json::to_writer_pretty(
            &mut *out,
            &json!({"id": id.to_hex(), "kind": "tree", "entries": entries}),
        )?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "tree {id}: {} entries, {} of content",
        t.entries.len(),
        bytes(t.content_bytes())
    )?;
    for e in &t.entries {
        let blob = e
            .blob_id()
            .map(|b| b.short(12))
            .unwrap_or_else(|| "-".repeat(12));
        writeln!(
            out,
            "{:06o} {:<7} {:>10} {blob}  {}",
            e.mode,
            e.kind.name(),
            e.size,
            e.path
        )?;
    }
    Ok(())
}

/// A blob: its size, storage and whether it is text as JSON, or, for
/// people, how it is stored and its first 20 lines when it is text.
fn show_blob(
    l: &Ledger,
    id: &ledger::Id,
    loc: &ledger::ObjLoc,
    json: bool,
    out: &mut impl Write,
) -> Result<()> {
    let data = l.get_blob(id)?;
    let text = std::str::from_utf8(&data).ok();
    if json {
        serde_json::to_writer_pretty(
            &mut *out,
            &json!({"id": id.to_hex(), "kind": "blob", "size": data.len(), "stored_size": loc.body_len, "compressed": loc.flags & 1 == 1, "utf8": text.is_some()}),
        )?;
        writeln!(out)?;
        return Ok(());
    }
    let stored = if loc.seg == u32::MAX {
        "not stored here: fetched from the remote this partial ledger was cloned from".to_string()
    } else {
        format!(
            "{} stored{}",
            bytes(loc.body_len as u64),
            if loc.flags & 1 == 1 { ", zstd" } else { "" }
        )
    };
    writeln!(out, "blob {id}: {} ({stored})", bytes(data.len() as u64))?;
    match text {
        Some(t) => {
            for line in t.lines().take(20) {
                writeln!(out, "  {line}")?;
            }
            if t.lines().count() > 20 {
                writeln!(out, "  ... (`mass cat {}` for all of it)", id.short(12))?;
            }
        }
        None => writeln!(
            out,
            "  (binary; `mass cat {}` writes the bytes)",
            id.short(12)
        )?,
    }
    Ok(())
}

pub fn cat(l: &Ledger, s: &str) -> Result<ExitCode> {
    let id = resolve(l, s)?;
    let data = l.get_blob(&id)?;
    let mut out = crate::output::stdout();
    out.write_all(&data)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn refs(l: &Ledger, json: bool) -> Result<ExitCode> {
    let refs = l.refs()?;
    let mut out = crate::output::stdout();
    if json {
        let v: Vec<_> = refs
            .iter()
            .map(|(n, id)| json!({"name": n, "head": id.to_hex()}))
            .collect();
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        for (n, id) in refs {
            writeln!(out, "{}  {n}", id.short(12))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
