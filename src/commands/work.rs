//! `mass worker URL` and the coordinator's side of `--workers URL`: the
//! settings a run's executor is built with, the worker loop's front end,
//! and the store's summary for `mass status --workers URL`.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::cli::WorkersArgs;

/// The coordinator's settings, when `--workers` names a store.
pub fn settings(dir: &Path, args: &WorkersArgs) -> Result<Option<workers::Settings>> {
    let Some(url) = &args.workers else {
        return Ok(None);
    };
    if !(args.store_patience.is_finite() && args.store_patience >= 0.0) {
        bail!(crate::commands::CliError::Usage(
            "--store-patience takes a number of seconds, 0 or more".into()
        ));
    }
    // A location that cannot be a store is refused before the run records
    // anything (exit 2), as `mass remote add` refuses it.
    remote::Remote::open(url, None)?;
    Ok(Some(workers::Settings {
        url: url.clone(),
        patience: Duration::from_secs_f64(args.store_patience),
        poll: Duration::from_millis(200),
        max_attempts: args.max_attempts.max(1),
        cache: Some(remote::config::cache_dir(dir)),
        unconfined_results: false,
    }))
}

/// Runs a worker until it is stopped (or idle for `idle_exit` seconds).
pub fn worker(
    url: &str,
    slots: u32,
    name: Option<String>,
    lease_secs: f64,
    idle_exit: Option<f64>,
    poll_ms: u64,
) -> Result<ExitCode> {
    let secs_ok = |s: f64| s.is_finite() && s > 0.0;
    if slots == 0 || !secs_ok(lease_secs) || idle_exit.is_some_and(|s| !secs_ok(s)) {
        bail!(crate::commands::CliError::Usage(
            "--slots takes 1 or more; --lease-secs and --idle-exit take a positive number of seconds".into()
        ));
    }
    let name = name.unwrap_or_else(default_name);
    let opts = workers::Options {
        url: url.to_string(),
        name: name.clone(),
        slots,
        lease: Duration::from_secs_f64(lease_secs),
        poll: Duration::from_millis(poll_ms.max(10)),
        idle_exit: idle_exit.map(Duration::from_secs_f64),
        stop: Some(crate::interrupt::stop_on_signals()),
    };
    let shown = remote::store::scrub(url);
    eprintln!("worker {name}: {slots} slot(s) on {shown}");
    let log_name = name.clone();
    let mut w = workers::Worker::new(
        opts,
        Box::new(move |line| eprintln!("worker {log_name}: {line}")),
    )?;
    let s = w.run()?;
    crate::output::outln!(
        "worker {name}: {} done, {} failed, {} discarded, {} duplicate(s)",
        s.done,
        s.failed,
        s.discarded,
        s.duplicates
    )?;
    Ok(ExitCode::SUCCESS)
}

fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!("{host}/{}", std::process::id())
}

/// Prints the work on the store at `url`.
pub fn status(url: &str) -> Result<ExitCode> {
    let r = remote::Remote::open(url, None)?;
    let s = workers::status::read(r.store())?;
    let now = workers::wire::now_ms();
    crate::output::outln!(
        "\nwork on {}: {} item(s), {} done, {} failed, {} claimed, {} failed attempt(s)",
        r.location(),
        s.items,
        s.done,
        s.failed,
        s.claimed.len(),
        s.attempts
    )?;
    for w in &s.workers {
        crate::output::outln!(
            "  worker {}: {} slot(s), running {}, {} done, {} failed, {} duplicate(s), last seen {:.0}s ago",
            w.worker,
            w.slots,
            w.running.len(),
            w.done,
            w.failed,
            w.duplicates,
            now.saturating_sub(w.at_ms) as f64 / 1000.0
        )?;
    }
    for (job, holder, attempt, released) in &s.claimed {
        let state = if *released { "released" } else { "claimed" };
        // The lease's age as far as this machine can tell: the holder's
        // last heartbeat (its clock against ours).
        let seen = s
            .workers
            .iter()
            .find(|w| w.worker == *holder)
            .map(|w| {
                format!(
                    ", holder last seen {:.0}s ago",
                    now.saturating_sub(w.at_ms) as f64 / 1000.0
                )
            })
            .unwrap_or_default();
        crate::output::outln!(
            "  item {} {state} by {holder}, attempt {attempt}{seen}",
            &job[..12]
        )?;
    }
    for key in &s.unreadable {
        crate::output::outln!("  unreadable: {key}")?;
    }
    Ok(ExitCode::SUCCESS)
}
