//! `mass export events`: a readable JSONL dump of events with their ids.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ledger::Ledger;

use super::resolve;
use crate::output::event_json_with_meta;

pub fn events(l: &Ledger, start: Option<&str>, out: &Path) -> Result<ExitCode> {
    let ids: Vec<ledger::Id> = match start {
        // A run: every one of its streams (the main stream and each
        // `RUN/...` stream), each event once, in log order.
        Some(s) if super::audit::is_run(l, s)? => {
            let prefix = format!("{s}/");
            let mut heads = vec![resolve(l, s)?];
            for (name, h) in l.refs()? {
                if name.starts_with(&prefix) {
                    heads.push(h);
                }
            }
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
    let mut w = BufWriter::new(f);
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
