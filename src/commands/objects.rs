//! Workspace snapshot commands: snapshot, checkout, diff.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ledger::{Change, Ledger};
use serde_json::json;

use super::resolve;

pub fn snapshot(l: &Ledger, dir: &Path) -> Result<ExitCode> {
    // The ledger's error already names the path ("cannot snapshot X: ...").
    let id = l.snapshot_dir(dir)?;
    crate::output::outln!("{id}")?;
    Ok(ExitCode::SUCCESS)
}

pub fn checkout(l: &Ledger, tree: &str, dir: &Path) -> Result<ExitCode> {
    let id = resolve(l, tree)?;
    l.checkout(&id, dir)
        .with_context(|| format!("cannot check out {} into {}", id.short(12), dir.display()))?;
    eprintln!("checked out {} into {}", id.short(12), dir.display());
    Ok(ExitCode::SUCCESS)
}

pub fn diff(l: &Ledger, a: &str, b: &str, json: bool) -> Result<ExitCode> {
    let ta = l.get_tree(&resolve(l, a)?)?;
    let tb = l.get_tree(&resolve(l, b)?)?;
    let changes = ledger::tree::diff(&ta, &tb);
    let mut out = crate::output::stdout();
    if json {
        let v: Vec<_> = changes
            .iter()
            .map(|c| {
                let (old, new) = match c {
                    Change::Added(n) => (None, Some(n)),
                    Change::Removed(o) => (Some(o), None),
                    Change::Modified { old, new } => (Some(old), Some(new)),
                };
                json!({
                    "path": c.path(),
                    "change": match c { Change::Added(_) => "added", Change::Removed(_) => "removed", Change::Modified { .. } => "modified" },
                    "old": old.and_then(|e| e.blob_id()).map(|i| i.to_hex()),
                    "new": new.and_then(|e| e.blob_id()).map(|i| i.to_hex()),
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        for c in &changes {
            writeln!(out, "{} {}", c.letter(), c.path())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
