//! Command implementations: each opens the ledger, does one thing, prints.

mod audit;
mod dataset;
mod demo;
mod export;
mod import;
mod inspect;
mod leak;
mod maintain;
mod objects;
mod proxy;
mod rank;
mod rejudge;
mod remote;
mod run_file;
mod runs;
mod sandbox;
mod status;
mod summary;
mod work;

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ledger::{Id, Ledger, LedgerError};

use crate::cli::{Cli, Command, ExportWhat, ImportWhat, RunsWhat};

/// CLI-level failures that carry their own exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Conflict(String),
    /// Input refused: damaged, invalid or not what the command reads.
    #[error("{0}")]
    BadInput(String),
    /// An infrastructure failure stopped the command, said with what
    /// continues it where that is not `mass resume`.
    #[error("{0}")]
    Stopped(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::NotFound(_) => 4,
            CliError::Usage(_) => 2,
            CliError::Conflict(_) => 5,
            CliError::BadInput(_) => 3,
            CliError::Stopped(_) => 7,
        }
    }
}

/// Runs the command `cli` names: each family of commands has a dispatcher
/// of its own below.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let dir = cli.ledger.clone();
    match cli.command {
        c @ (Command::Init
        | Command::Log { .. }
        | Command::Show { .. }
        | Command::Cat { .. }
        | Command::Refs { .. }
        | Command::Snapshot { .. }
        | Command::Checkout { .. }
        | Command::Diff { .. }) => objects_command(&dir, c),
        c @ (Command::Fork { .. }
        | Command::Runs { .. }
        | Command::Run { .. }
        | Command::Resume { .. }
        | Command::Worker { .. }
        | Command::Replay { .. }
        | Command::Rejudge { .. }) => runs_command(&dir, c),
        c @ (Command::Why { .. }
        | Command::Report { .. }
        | Command::Status { .. }
        | Command::Export { .. }) => read_command(&dir, c),
        c @ (Command::Verify { .. }
        | Command::Stats { .. }
        | Command::Reindex
        | Command::Repair { .. }
        | Command::Migrate { .. }) => maintain_command(&dir, c),
        c @ (Command::Remote { .. }
        | Command::Push { .. }
        | Command::Pull { .. }
        | Command::Clone { .. }
        | Command::Import { .. }) => transfer_command(&dir, c),
        c @ (Command::Rank { .. }
        | Command::Demo { .. }
        | Command::HarnessReplay { .. }
        | Command::Proxy { .. }
        | Command::Sandbox { .. }) => tool_command(&dir, c),
    }
}

/// The ledger's objects: init, log, show, cat, refs, snapshot, checkout,
/// diff (of two objects, or of two runs).
fn objects_command(dir: &Path, command: Command) -> Result<ExitCode> {
    match command {
        Command::Init => {
            Ledger::init(dir)
                .with_context(|| format!("cannot create a ledger in {}", dir.display()))?;
            crate::output::outln!("initialised empty ledger in {}", dir.display())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Log {
            start,
            kind,
            limit,
            json,
        } => inspect::log(
            &open_read(dir)?,
            start.as_deref(),
            kind.as_deref(),
            limit,
            json,
        ),
        Command::Show { id, json } => inspect::show(&open_read(dir)?, &id, json),
        Command::Cat { id } => inspect::cat(&open_read(dir)?, &id),
        Command::Refs { json } => inspect::refs(&open_read(dir)?, json),
        Command::Snapshot { dir: d } => objects::snapshot(&open(dir)?, &d),
        Command::Checkout { tree, dir: d } => objects::checkout(&open_read(dir)?, &tree, &d),
        Command::Diff { a, b, json } => {
            let l = open_read(dir)?;
            if audit::is_run(&l, &a)? && audit::is_run(&l, &b)? {
                audit::diff_runs(&l, &a, &b, json)
            } else {
                objects::diff(&l, &a, &b, json)
            }
        }
        _ => unreachable!("`run` sends only object commands here"),
    }
}

/// Runs: fork, runs (list or remove), run, resume, worker, replay,
/// rejudge.
fn runs_command(dir: &Path, command: Command) -> Result<ExitCode> {
    match command {
        Command::Fork {
            id,
            name,
            set,
            stage: Some(stage),
            cycle: Some(cycle),
            ..
        } => runs::fork_at_stage(&open(dir)?, &id, cycle, &stage, &name, &set),
        Command::Fork {
            id,
            name,
            set,
            from,
            ..
        } => runs::fork(&open(dir)?, &id, &name, &set, from.as_deref()),
        Command::Runs {
            what: Some(RunsWhat::Rm { run }),
            ..
        } => runs::remove(&open(dir)?, &run),
        Command::Runs {
            what: None,
            run,
            cycle,
            task,
            json,
        } => {
            let Some(run) = run else {
                anyhow::bail!(CliError::Usage(
                    "`mass runs RUN` lists a run's rollouts; `mass runs rm RUN` removes a run; `mass status` lists runs".into()
                ));
            };
            let l = open_read(dir)?;
            note_quarantine(dir);
            audit::runs(&l, &run, cycle, task.as_deref(), json)
        }
        Command::Run {
            experiment,
            name,
            set,
            quiet,
            workers,
        } => runs::run(
            dir,
            &runs::RunOptions {
                experiment: &experiment,
                name: name.as_deref(),
                set: &set,
                quiet,
                workers: &workers,
            },
        ),
        Command::Resume {
            run,
            quiet,
            workers,
        } => runs::resume(dir, &run, quiet, &workers),
        Command::Worker {
            url,
            slots,
            name,
            lease_secs,
            idle_exit,
            poll_ms,
        } => work::worker(&url, slots, name, lease_secs, idle_exit, poll_ms),
        Command::Replay { run, check } => runs::replay_check(dir, &run, check),
        Command::Rejudge {
            run,
            name,
            cycle,
            judge,
            through_training,
            set,
            quiet,
        } => runs::rejudge(
            dir,
            &run,
            &name,
            &runs::RejudgeOptions {
                cycle,
                judge,
                through_training,
                set,
            },
            quiet,
        ),
        _ => unreachable!("`run` sends only run commands here"),
    }
}

/// Reading runs: why, report, status, export (dataset, tables, events).
fn read_command(dir: &Path, command: Command) -> Result<ExitCode> {
    match command {
        Command::Why { id, json, run } => {
            let l = open_read(dir)?;
            note_quarantine(dir);
            audit::why(&l, &id, json, run.as_deref())
        }
        Command::Report {
            run,
            json,
            html,
            fresh,
        } => {
            let l = open_read(dir)?;
            note_quarantine(dir);
            audit::report(&l, &run, json, html.as_deref(), fresh)
        }
        Command::Status { run, json, workers } => {
            let l = open_read(dir)?;
            note_quarantine(dir);
            let code = status::status(&l, run.as_deref(), json)?;
            if let Some(url) = workers {
                work::status(&url)?;
            }
            Ok(code)
        }
        Command::Export {
            what:
                ExportWhat::Dataset {
                    run,
                    cycle,
                    format,
                    out,
                },
        } => dataset::export_dataset(&open_read(dir)?, &run, cycle, format, &out),
        Command::Export {
            what: ExportWhat::Tables { runs, out, format },
        } => export::tables(&open_read(dir)?, &runs, &out, format),
        Command::Export {
            what: ExportWhat::Events { start, out },
        } => export::events(&open_read(dir)?, start.as_deref(), &out),
        _ => unreachable!("`run` sends only read commands here"),
    }
}

/// Looking after the ledger: verify, stats, reindex, repair, migrate.
fn maintain_command(dir: &Path, command: Command) -> Result<ExitCode> {
    match command {
        Command::Verify { log_only, json } => {
            // The index check needs the persistent index, which only the
            // lock holder may open; the log alone can be checked any time.
            let (l, report) = if log_only {
                let l = open_read(dir)?;
                let r = l.recovery().clone();
                (l, r)
            } else {
                let (l, r) = Ledger::open_reporting(dir)
                    .with_context(|| format!("cannot open ledger {}", dir.display()))?;
                (l, r)
            };
            maintain::verify(&l, &report, !log_only, json)
        }
        Command::Stats { json } => maintain::stats(&open_read(dir)?, json),
        Command::Reindex => maintain::reindex(dir),
        Command::Repair { json } => maintain::repair(dir, json),
        Command::Migrate { from } => maintain::migrate(&from, dir),
        _ => unreachable!("`run` sends only maintenance commands here"),
    }
}

/// Moving runs between ledgers: remote, push, pull, clone, import.
fn transfer_command(dir: &Path, command: Command) -> Result<ExitCode> {
    match command {
        Command::Remote { what } => remote::manage(dir, what),
        Command::Push {
            remote: r,
            runs,
            quiet,
        } => remote::push(dir, r.as_deref(), &runs, quiet),
        Command::Pull {
            remote: r,
            runs,
            lazy,
            quiet,
        } => remote::pull(dir, r.as_deref(), &runs, lazy, quiet),
        Command::Clone {
            url,
            dir: d,
            lazy,
            quiet,
        } => remote::clone(&url, &d, lazy, quiet),
        Command::Import {
            what: ImportWhat::Sakana { run_dir, name },
        } => import::sakana(dir, &run_dir, name.as_deref()),
        _ => unreachable!("`run` sends only transfer commands here"),
    }
}

/// Tools beside the ledger: rank, demo, harness-replay, proxy, sandbox.
fn tool_command(dir: &Path, command: Command) -> Result<ExitCode> {
    match command {
        Command::Rank { file, prior, json } => rank::run(&file, prior, json),
        Command::Demo { workspace } => demo::run(dir, workspace.as_deref()),
        Command::HarnessReplay { rollout, json } => proxy::harness_replay(dir, &rollout, json),
        Command::Proxy {
            listen,
            upstream,
            run,
            stream,
            replay,
            normalise,
            into,
            url_file,
            guards,
        } => proxy::run(
            dir,
            &proxy::ProxyOptions {
                listen,
                upstream,
                run,
                stream,
                replay,
                normalise,
                into,
                url_file,
                guards,
            },
        ),
        Command::Sandbox {
            workspace,
            limits,
            level,
            network,
            timeout_secs,
            probe,
            command,
        } => sandbox::run(&sandbox::SandboxOptions {
            workspace: workspace.as_deref(),
            limits: limits.as_deref(),
            level,
            network,
            timeout_secs,
            probe,
            command: &command,
        }),
        _ => unreachable!("`run` sends only tool commands here"),
    }
}

/// Opens the ledger for writing (taking its lock), reporting on stderr
/// whatever recovery did.
pub fn open(dir: &std::path::Path) -> Result<Ledger> {
    let (l, report) = Ledger::open_reporting(dir)
        .with_context(|| format!("cannot open ledger {}", dir.display()))?;
    for line in recovery_lines(&report) {
        eprintln!("note: {line}");
    }
    remote::attach_promisor(&l, dir)?;
    Ok(l)
}

/// Opens the ledger for reading only: no lock, nothing changed, so it works
/// while `mass run` writes and on a read-only copy. Damage the scan stepped
/// over is reported on stderr.
pub fn open_read(dir: &std::path::Path) -> Result<Ledger> {
    let l = Ledger::open_read_only(dir)
        .with_context(|| format!("cannot open ledger {}", dir.display()))?;
    remote::attach_promisor(&l, dir)?;
    if let Some(why) = &l.recovery().log_behind_index {
        eprintln!(
            "warning: the log is shorter than the index: {why}; showing what the log holds \
             (`mass verify` reports it; restore the segment files from a backup)"
        );
    }
    if let Some(why) = &l.recovery().index_rebuilt {
        eprintln!("note: index tables not used ({why}); read the log instead");
    }
    for d in &l.recovery().damage {
        eprintln!(
            "warning: damaged bytes in segment {} at byte {} ({} bytes: {}) were skipped; \
             `mass verify --log-only` names what they held, `mass repair` lists them",
            d.segment, d.offset, d.len, d.reason
        );
    }
    if l.recovery().unread_tail > 0 {
        eprintln!(
            "note: {} bytes after the last commit marker were not read (a write in progress, \
             or an interrupted one the next writer will list)",
            l.recovery().unread_tail
        );
    }
    Ok(l)
}

/// One line per thing opening did, for people.
pub fn recovery_lines(r: &ledger::RecoveryReport) -> Vec<String> {
    let mut out = Vec::new();
    for s in &r.tails {
        out.push(format!(
            "{} bytes after the last commit marker of segment {} (from byte {}) are not known to \
             have been acknowledged (an interrupted write): left in place, listed in \
             {}/damaged.jsonl and copied to {}",
            s.len,
            s.segment,
            s.offset,
            ledger::QUARANTINE_DIR,
            s.file.display()
        ));
    }
    if let Some(n) = r.new_segment {
        out.push(format!("writing continues in segment {n}"));
    }
    if let Some(why) = &r.index_rebuilt {
        out.push(format!(
            "the index was damaged ({why}); rebuilt it from the segment files"
        ));
    }
    for d in &r.damage {
        out.push(format!(
            "damaged bytes in segment {} at byte {} ({} bytes: {}){}; listed and stepped over",
            d.segment,
            d.offset,
            d.len,
            d.reason,
            d.claimed_id
                .as_ref()
                .map(|i| format!(", claimed object {i}"))
                .unwrap_or_default()
        ));
    }
    out
}

/// Says on stderr if anything was ever set aside into quarantine/.
fn note_quarantine(dir: &std::path::Path) {
    let q = dir.join(ledger::QUARANTINE_DIR);
    let n = std::fs::read_dir(&q).map(|rd| rd.count()).unwrap_or(0);
    if n > 0 {
        eprintln!(
            "note: {} holds {n} file(s) that recovery or repair set aside (never deleted); \
             `mass verify` reports what is missing",
            q.display()
        );
    }
}

/// Resolves a ref name or an (abbreviated) object id.
pub fn resolve(l: &Ledger, s: &str) -> Result<Id> {
    if let Some(h) = l.head(s)? {
        return Ok(h);
    }
    match l.resolve(s) {
        Ok(id) => Ok(id),
        // Hex digits only, but too few: meant as an id, malformed (2).
        Err(LedgerError::MalformedId { .. })
            if !s.is_empty() && s.len() < 8 && s.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            Err(CliError::Usage(format!(
                "{s:?} is too short to be an id: ids are at least 8 hex digits (`mass log` shows them)"
            ))
            .into())
        }
        Err(LedgerError::MalformedId { .. }) => Err(CliError::NotFound(format!(
            "{s:?} is neither a ref nor an object id (ids are at least 8 hex digits; `mass refs` lists refs)"
        ))
        .into()),
        Err(e) => Err(e.into()),
    }
}

/// An engine error for the CLI, displayed once: flattened to its message
/// (its sources are already in it), except an infrastructure failure and a
/// ledger error, kept typed so `main` exits with their own codes.
pub(crate) fn engine_error(e: engine::error::EngineError) -> anyhow::Error {
    use engine::error::EngineError as E;
    match e {
        // Typed, so they map to their exit codes (7; 3, 4, 5, 6 for the
        // ledger's), and displayed once.
        E::Infrastructure { .. } => anyhow::Error::new(e),
        E::Ledger(le) | E::Replay(replay::ReplayError::Ledger(le)) => anyhow::Error::new(le),
        E::NotFound(what) => anyhow::Error::new(CliError::NotFound(what)),
        other => anyhow::anyhow!("{other}"),
    }
}
