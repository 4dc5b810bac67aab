//! `mass`: the command-line front end. Only this crate knows clap and anyhow;
//! the libraries below it return typed errors that are mapped to exit codes here.
//!
//! Exit codes (also in `mass --help` and README.md):
//! 0 success (also when a reader closes the output early, `mass log | head`) · 1 other error · 2 usage error · 3 integrity problem (verify found
//! problems, a read hit corrupt data, a remote's pack failed its hash) · 4 not
//! found or ambiguous id/ref, or not a mass remote · 5 conflict (a ref moved,
//! here or on a remote) · 6 ledger locked by another process · 7 a run
//! stopped on an infrastructure failure (`mass resume` retries it) · 8 the
//! sandbox level the experiment asks for is unavailable on this machine.

mod alloc;
mod cli;
mod commands;
mod interrupt;
mod output;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match commands::run(cli) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::from(output::decided()),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit_code_for(&e))
        }
    }
}

/// Maps an error to the documented exit code by looking for a typed cause
/// (a ledger error also when the engine or replay layer carries it).
fn exit_code_for(e: &anyhow::Error) -> u8 {
    use engine::error::EngineError as E;
    use replay::ReplayError as R;
    for cause in e.chain() {
        if let Some(le) = cause.downcast_ref::<ledger::LedgerError>() {
            return ledger_code(le);
        }
        if let Some(c) = cause.downcast_ref::<commands::CliError>() {
            return c.exit_code();
        }
        if let Some(r) = cause.downcast_ref::<remote::RemoteError>() {
            return remote_code(r);
        }
        match cause.downcast_ref::<workers::WorkError>() {
            Some(workers::WorkError::Remote(r)) => return remote_code(r),
            Some(workers::WorkError::Ledger(le)) => return ledger_code(le),
            Some(workers::WorkError::StoreDown { .. }) => return 7,
            _ => {}
        }
        match cause.downcast_ref::<E>() {
            Some(E::Infrastructure { .. }) => return 7,
            Some(E::Sandbox(_)) => return 8,
            Some(E::Proxy(proxy::ProxyError::NothingRecorded { .. })) => return 4,
            Some(E::Proxy(proxy::ProxyError::Ledger(le))) => return ledger_code(le),
            Some(E::Ledger(le)) | Some(E::Replay(R::Ledger(le))) => return ledger_code(le),
            _ => {}
        }
        if let Some(R::Ledger(le)) = cause.downcast_ref::<R>() {
            return ledger_code(le);
        }
    }
    1
}

fn ledger_code(le: &ledger::LedgerError) -> u8 {
    use ledger::LedgerError as L;
    match le {
        L::Corruption { .. } | L::CorruptLog { .. } | L::LogBehindIndex { .. } => 3,
        L::NotFound { .. } | L::Ambiguous { .. } | L::NoSuchRef { .. } | L::NotALedger { .. } => 4,
        L::Conflict { .. } => 5,
        L::Locked { .. } => 6,
        L::MalformedId { .. } | L::BadRefName { .. } => 2,
        _ => 1,
    }
}

fn remote_code(r: &remote::RemoteError) -> u8 {
    use remote::RemoteError as R;
    match r {
        R::BadUrl { .. } | R::Config { .. } | R::Nested { .. } => 2,
        R::Corrupt { .. } | R::MissingObject { .. } => 3,
        R::NotARemote { .. } | R::NoSuchRun { .. } | R::NoSuchRemote { .. } => 4,
        R::Conflict { .. } => 5,
        R::Ledger(le) => ledger_code(le),
        R::Store { .. } | R::Io { .. } => 1,
    }
}

/// A reader that closed the command's output early (`mass log | head`,
/// `mass report RUN --json | head`) is not an error: exit 0, say nothing.
///
/// Quiet only when a write to the command's own output saw the pipe close
/// (`output::closed_by_reader`, set by the writer every command prints
/// through, and by `export --out FILE`'s), and the error that stopped the
/// command is a broken pipe. A broken pipe elsewhere (a socket to a model
/// server, a child's stdin) leaves that flag unset and stays an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    output::closed_by_reader() && e.chain().any(cause_is_broken_pipe)
}

/// Whether one link of an error chain is a broken pipe: an `io::Error`, or
/// a `serde_json::Error` from writing JSON (its `source()` skips the
/// `io::Error` it holds, so the kind is asked of it directly). Other
/// errors that wrap an `io::Error` (a `with_context` around a flush, the
/// ledger's and engine's `Io` variants) name it as their source, so the
/// chain reaches it.
fn cause_is_broken_pipe(c: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    if let Some(io) = c.downcast_ref::<std::io::Error>() {
        return io.kind() == BrokenPipe;
    }
    if let Some(j) = c.downcast_ref::<serde_json::Error>() {
        return j.io_error_kind() == Some(BrokenPipe);
    }
    false
}
