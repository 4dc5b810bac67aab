//! `mass remote`, `push`, `pull` and `clone`: runs moved between a ledger
//! and an object store or folder (the `remote` crate does the work; this
//! module names remotes, picks runs and prints).

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use remote::{config, Progress, PullReport, PushReport, RefChange, Remote, Remotes};

use super::{open, open_read, CliError};
use crate::cli::RemoteWhat;

/// Progress on standard error: one line per step, rewritten in place on a
/// terminal, plain lines otherwise (logs, CI).
struct Lines {
    quiet: bool,
    tty: bool,
}

impl Lines {
    fn new(quiet: bool) -> Lines {
        Lines {
            quiet,
            tty: std::io::stderr().is_terminal(),
        }
    }
    fn done(&self) {
        if self.tty && !self.quiet {
            eprintln!();
        }
    }
}

impl Progress for Lines {
    fn line(&self, msg: &str) {
        if self.quiet {
        } else if self.tty {
            eprint!("\r{msg}\x1b[K");
        } else {
            eprintln!("{msg}");
        }
    }
}

pub fn manage(dir: &Path, what: RemoteWhat) -> Result<ExitCode> {
    let mut out = crate::output::stdout();
    match what {
        RemoteWhat::List { json } => {
            let r = Remotes::load(dir)?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&r.remotes)?)?;
            } else {
                for (name, url) in &r.remotes {
                    writeln!(out, "{name}\t{url}")?;
                }
            }
        }
        RemoteWhat::Add { name, url } => {
            // The writer's lock keeps two `remote add`s from losing one.
            let _l = open(dir)?;
            let mut r = Remotes::load(dir)?;
            r.add(dir, &name, &url)?;
            r.save(dir)?;
            writeln!(out, "remote {name} -> {url}")?;
        }
        RemoteWhat::Remove { name } => {
            let _l = open(dir)?;
            let mut r = Remotes::load(dir)?;
            if r.remotes.remove(&name).is_none() {
                return Err(CliError::NotFound(format!(
                    "no remote named {name:?} (`mass remote list`)"
                ))
                .into());
            }
            r.save(dir)?;
            writeln!(
                out,
                "removed remote {name} (nothing on the store was touched)"
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Splits `mass push|pull [REMOTE] [RUN...]`: a first word that names no
/// remote and is no URL or path is a run, and the default remote is used.
fn remote_and_runs(
    dir: &Path,
    first: Option<&str>,
    runs: &[String],
) -> Result<(String, Vec<String>)> {
    let conf = Remotes::load(dir)?;
    match first {
        Some(a) if conf.remotes.contains_key(a) || config::looks_like_location(a) => {
            Ok((conf.resolve(dir, Some(a))?, runs.to_vec()))
        }
        Some(run) => {
            let mut all = vec![run.to_string()];
            all.extend(runs.iter().cloned());
            Ok((conf.resolve(dir, None)?, all))
        }
        None => Ok((conf.resolve(dir, None)?, runs.to_vec())),
    }
}

pub fn push(dir: &Path, first: Option<&str>, runs: &[String], quiet: bool) -> Result<ExitCode> {
    let (url, runs) = remote_and_runs(dir, first, runs)?;
    let l = open_read(dir)?;
    let r = Remote::open(&url, Some(&config::cache_dir(dir)))?;
    let lines = Lines::new(quiet);
    let rep = remote::push(&l, &r, &runs, &lines);
    lines.done();
    let rep = rep.with_context(|| format!("push to {url} failed"))?;
    print_push(&url, &rep)?;
    Ok(ExitCode::SUCCESS)
}

fn print_push(url: &str, rep: &PushReport) -> Result<()> {
    let mut out = crate::output::stdout();
    writeln!(
        out,
        "pushed to {url}: {} object(s) in {} pack(s), {} bytes uploaded",
        rep.objects, rep.packs, rep.uploaded
    )?;
    for (run, refs, changed) in &rep.runs {
        let what = if *changed { "updated" } else { "up to date" };
        writeln!(out, "  {run}: {what} ({refs} ref(s))")?;
    }
    Ok(())
}

/// A partial ledger (a lazy clone or pull) reads the blobs it lacks from
/// the remote it was pulled from.
pub fn attach_promisor(l: &ledger::Ledger, dir: &Path) -> Result<()> {
    if let Some(url) = Remotes::load(dir)?.partial_from {
        let f = remote::Fetcher::new(&url, Some(config::cache_dir(dir)));
        l.set_promisor(std::sync::Arc::new(f));
    }
    Ok(())
}

pub fn pull(
    dir: &Path,
    first: Option<&str>,
    runs: &[String],
    lazy: bool,
    quiet: bool,
) -> Result<ExitCode> {
    let (url, runs) = remote_and_runs(dir, first, runs)?;
    let l = open(dir)?;
    let rep = pull_into(&l, dir, &url, &runs, lazy, quiet)?;
    print_pull(&url, &rep)?;
    Ok(ExitCode::SUCCESS)
}

fn pull_into(
    l: &ledger::Ledger,
    dir: &Path,
    url: &str,
    runs: &[String],
    lazy: bool,
    quiet: bool,
) -> Result<PullReport> {
    let r = Remote::open(url, Some(&config::cache_dir(dir)))?;
    if lazy {
        mark_partial(l, dir, url)?;
    }
    let lines = Lines::new(quiet);
    let rep = remote::pull_with(l, &r, runs, lazy, &lines);
    lines.done();
    rep.with_context(|| format!("pull from {url} failed"))
}

/// Marks the ledger partial before anything lands: a ledger holding links
/// to absent blobs must always know where they are.
fn mark_partial(l: &ledger::Ledger, dir: &Path, url: &str) -> Result<()> {
    let mut conf = Remotes::load(dir)?;
    match &conf.partial_from {
        Some(other) if other != url => Err(CliError::Usage(format!(
            "this ledger already leaves blobs on {other}; a lazy pull from a second remote is not supported (pull without --lazy)"
        ))
        .into()),
        Some(_) => Ok(()),
        None => {
            conf.partial_from = Some(url.to_string());
            conf.save(dir)?;
            attach_promisor(l, dir)
        }
    }
}

fn print_pull(url: &str, rep: &PullReport) -> Result<()> {
    let mut out = crate::output::stdout();
    writeln!(
        out,
        "pulled from {url}: {} object(s), {} bytes downloaded{}",
        rep.objects,
        rep.downloaded,
        if rep.lazy {
            " (lazy: blobs stay there until read)"
        } else {
            ""
        }
    )?;
    for (run, changes) in &rep.runs {
        let count = |f: fn(&RefChange) -> bool| changes.iter().filter(|c| f(c)).count();
        writeln!(
            out,
            "  {run}: {} ref(s) created, {} moved forward, {} unchanged, {} further here",
            count(|c| matches!(c, RefChange::Created { .. })),
            count(|c| matches!(c, RefChange::FastForward { .. })),
            count(|c| matches!(c, RefChange::Unchanged { .. })),
            count(|c| matches!(c, RefChange::LocalAhead { .. })),
        )?;
    }
    Ok(())
}

/// A new ledger in `dir` holding every run of `url`, which it names
/// `origin`. On failure the new directory is removed: it held nothing but
/// what this clone wrote.
pub fn clone(url: &str, dir: &Path, lazy: bool, quiet: bool) -> Result<ExitCode> {
    let fresh = match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(CliError::Usage(format!(
                    "{} exists and is not empty; clone into a new directory",
                    dir.display()
                ))
                .into());
            }
            false
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir.symlink_metadata().is_err() => {
            true
        }
        Err(e) => {
            return Err(CliError::Usage(format!(
                "cannot clone into {}: {e}; clone into a new directory",
                dir.display()
            ))
            .into())
        }
    };
    let res = clone_into(url, dir, lazy, quiet);
    if res.is_err() {
        if fresh {
            let _ = std::fs::remove_dir_all(dir);
        } else if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let _ =
                    std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()));
            }
        }
    }
    let rep = res?;
    print_pull(url, &rep)?;
    crate::output::outln!("cloned into {} (remote origin -> {url})", dir.display())?;
    Ok(ExitCode::SUCCESS)
}

fn clone_into(url: &str, dir: &Path, lazy: bool, quiet: bool) -> Result<PullReport> {
    // Check the location before creating anything.
    let r = Remote::open(url, None)?;
    r.require_marker()?;
    let l = ledger::Ledger::init(dir)
        .with_context(|| format!("cannot create a ledger in {}", dir.display()))?;
    let mut conf = Remotes::default();
    conf.add(dir, "origin", url)?;
    conf.save(dir)?;
    pull_into(&l, dir, &conf.remotes["origin"], &[], lazy, quiet)
}
