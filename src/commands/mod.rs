//! Command implementations: each opens the ledger, does one thing, prints.

mod demo;
mod export;
mod inspect;
mod maintain;
mod objects;
mod rank;
mod runs;

use std::process::ExitCode;

use anyhow::{Context, Result};
use ledger::{Id, Ledger, LedgerError};

use crate::cli::{Cli, Command, ExportWhat};

/// CLI-level failures that carry their own exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    NotFound(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::NotFound(_) => 4,
        }
    }
}

pub fn run(cli: Cli) -> Result<ExitCode> {
    let dir = cli.ledger.clone();
    match cli.command {
        Command::Init => {
            Ledger::init(&dir)
                .with_context(|| format!("cannot create a ledger in {}", dir.display()))?;
            println!("initialised empty ledger in {}", dir.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Log {
            start,
            kind,
            limit,
            json,
        } => inspect::log(&open(&dir)?, start.as_deref(), kind.as_deref(), limit, json),
        Command::Show { id, json } => inspect::show(&open(&dir)?, &id, json),
        Command::Cat { id } => inspect::cat(&open(&dir)?, &id),
        Command::Refs { json } => inspect::refs(&open(&dir)?, json),
        Command::Fork { id, name, set } => runs::fork(&open(&dir)?, &id, &name, &set),
        Command::Run {
            experiment,
            name,
            quiet,
        } => runs::run(&dir, &experiment, name.as_deref(), quiet),
        Command::Resume { run, quiet } => runs::resume(&dir, &run, quiet),
        Command::Replay { run, check } => runs::replay_check(&dir, &run, check),
        Command::Rejudge {
            run,
            name,
            set,
            quiet,
        } => runs::rejudge(&dir, &run, &name, &set, quiet),
        Command::Status { run, json } => runs::status(&open(&dir)?, run.as_deref(), json),
        Command::Export {
            what:
                ExportWhat::Dataset {
                    run,
                    cycle,
                    format,
                    out,
                },
        } => runs::export_dataset(&open(&dir)?, &run, cycle, format, &out),
        Command::Snapshot { dir: d } => objects::snapshot(&open(&dir)?, &d),
        Command::Checkout { tree, dir: d } => objects::checkout(&open(&dir)?, &tree, &d),
        Command::Diff { a, b, json } => objects::diff(&open(&dir)?, &a, &b, json),
        Command::Verify { log_only, json } => maintain::verify(&open_scan(&dir)?, !log_only, json),
        Command::Stats { json } => maintain::stats(&open_scan(&dir)?, json),
        Command::Reindex => maintain::reindex(&dir),
        Command::Export {
            what: ExportWhat::Events { start, out },
        } => export::events(&open(&dir)?, start.as_deref(), &out),
        Command::Rank { file, prior, json } => rank::run(&file, prior, json),
        Command::Demo { workspace } => demo::run(&dir, workspace.as_deref()),
    }
}

/// Opens the ledger, reporting crash recovery on stderr.
pub fn open(dir: &std::path::Path) -> Result<Ledger> {
    let (l, report) = Ledger::open_reporting(dir)
        .with_context(|| format!("cannot open ledger {}", dir.display()))?;
    if report.truncated_bytes > 0 {
        eprintln!(
            "note: recovered from an interrupted write: dropped {} bytes of unacknowledged tail",
            report.truncated_bytes
        );
    }
    if let Some(why) = &report.index_rebuilt {
        eprintln!("note: the index was damaged ({why}); rebuilt it from the segment files");
    }
    Ok(l)
}

/// Opens for a whole-ledger scan (smaller index cache; see `Options::for_scan`).
fn open_scan(dir: &std::path::Path) -> Result<Ledger> {
    Ledger::open_with(dir, ledger::Options::for_scan())
        .with_context(|| format!("cannot open ledger {}", dir.display()))
}

/// Resolves a ref name or an (abbreviated) object id.
pub fn resolve(l: &Ledger, s: &str) -> Result<Id> {
    if let Some(h) = l.head(s)? {
        return Ok(h);
    }
    match l.resolve(s) {
        Ok(id) => Ok(id),
        Err(LedgerError::MalformedId { .. }) => Err(CliError::NotFound(format!(
            "{s:?} is neither a ref nor an object id (ids are at least 8 hex digits; `mass refs` lists refs)"
        ))
        .into()),
        Err(e) => Err(e.into()),
    }
}
