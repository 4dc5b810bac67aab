//! `mass import sakana RUN_DIR [--name RUN]`: a run folder of the reference
//! implementation (SakanaAI/mass) becomes a run of the ledger (the `import`
//! crate does the work). The folder is read and checked whole before the
//! ledger is opened, so a refused folder leaves no ledger behind, let alone
//! half a run. Exit codes: 2 a run name that cannot be one, 3 a folder that
//! is not a reference run or holds damaged, invalid or refused input (a
//! link, a truncated gzip, a line past its cap), 4 no such folder, 5 the
//! name is taken by another run; the second import of the same folder
//! writes nothing and exits 0.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use import::{ImportError, Options, Outcome};
use ledger::Ledger;

use super::CliError;
use crate::output::outln;

/// An import error as the CLI reports it: its text with every secret of the
/// folder taken out, and its exit code.
fn report(run_dir: &Path, e: ImportError) -> anyhow::Error {
    let text = import::scrub_message(run_dir, &e.to_string());
    match e {
        ImportError::Ledger(le) => anyhow::Error::new(le).context(text),
        ImportError::NoFolder { .. } => CliError::NotFound(text).into(),
        ImportError::NameTaken { .. } => CliError::Conflict(text).into(),
        _ => CliError::BadInput(text).into(),
    }
}

pub fn sakana(ledger_dir: &Path, run_dir: &Path, name: Option<&str>) -> Result<ExitCode> {
    let run = name
        .map(str::to_string)
        .unwrap_or_else(|| import::default_name(run_dir));
    if run.contains('/') {
        return Err(CliError::Usage(format!(
            "run name {run:?} may not hold '/' (names under RUN/ are its streams)"
        ))
        .into());
    }
    ledger::check_ref_name(&run).map_err(|e| CliError::Usage(e.to_string()))?;
    let prepared = import::prepare(run_dir, &Options::default()).map_err(|e| report(run_dir, e))?;
    // A run name whose streams would pass the ledger's length limit is the
    // caller's to change: refused (exit 2) before any ledger is made.
    prepared
        .check_name(&run)
        .map_err(|e| CliError::Usage(format!("run name {run:?}: {e}")))?;
    let l = if ledger_dir.join("FORMAT").exists() {
        super::open(ledger_dir)?
    } else {
        Ledger::init(ledger_dir)?
    };
    let unmarked = match prepared.write(&l, &run).map_err(|e| report(run_dir, e))? {
        Outcome::Imported {
            head,
            episodes,
            objects,
            unmarked,
        } => {
            outln!(
                "imported {} as run {run}: {episodes} episode(s), {objects} object(s), head {}",
                run_dir.display(),
                head.to_hex()
            )?;
            super::runs::keep_report_facts(&l, &run);
            unmarked
        }
        Outcome::AlreadyImported { head, unmarked } => {
            outln!(
                "run {run} already holds this import (head {}); nothing written",
                head.to_hex()
            )?;
            unmarked
        }
    };
    if unmarked > 0 {
        eprintln!(
            "warning: {unmarked} event(s) of run {run} were written by an older mass, without the marks \
             this one gives a stand-in time (`wall_ms_from`) or a field the reference does not record \
             (`not_recorded`): report, why and export tables show those as measured. A ledger keeps an \
             event's first metadata, so no import into this ledger can mark them: import the folder \
             into a new ledger (`mass --ledger NEW import sakana ...`)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether the run whose main head is `head` was imported (its
/// `run.started` names the import's driver).
pub fn is_imported(l: &Ledger, head: ledger::Id) -> Result<bool> {
    for ev in l.chain(head) {
        let ev = ev?;
        if ev.kind == "run.started" {
            return Ok(ev.version == 2
                && schemas::decode_event::<schemas::RunStarted>(&ev)?
                    .driver
                    .starts_with("sakana-import/"));
        }
    }
    Ok(false)
}
