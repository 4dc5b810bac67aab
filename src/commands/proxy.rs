//! `mass proxy`: the recording proxy (the `proxy` crate) from the command line;
//! `mass harness-replay`: an external-harness rollout re-executed against
//! its recording.
//! Prints the client base URL on stdout once listening; on SIGINT or SIGTERM
//! drains the exchanges in flight (`--drain-secs`), waits for the records,
//! prints what was recorded or served, and exits 0, or 1 when a replay
//! answered a request with a miss or an exchange could not be recorded
//! (each named). Nothing printed holds a credential: URLs are shown without
//! userinfo and with key-like query parameters redacted.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use proxy::{Limits, Mode, NormaliseConfig, Normaliser, Secret, ServeOptions, Upstream};

use super::CliError;
use crate::cli::ProxyGuards;

pub struct ProxyOptions {
    pub listen: std::net::SocketAddr,
    pub upstream: Option<String>,
    pub run: String,
    pub stream: String,
    pub replay: bool,
    pub normalise: Option<PathBuf>,
    pub into: Option<String>,
    pub url_file: Option<PathBuf>,
    pub guards: ProxyGuards,
}

fn normaliser(file: Option<&PathBuf>) -> Result<Normaliser> {
    let cfg = match file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read normaliser {}", p.display()))?;
            toml::from_str::<NormaliseConfig>(&text)
                .map_err(|e| CliError::Usage(format!("normaliser {}: {e}", p.display())))?
        }
        None => NormaliseConfig::default(),
    };
    Normaliser::new(&cfg).map_err(|e| CliError::Usage(e.to_string()).into())
}

/// The secret in environment variable `var` (`what` names it in errors;
/// the value never appears in one).
fn secret_env(var: &str, what: &str) -> Result<Secret> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Ok(Secret::new(v.trim())),
        _ => Err(CliError::Usage(format!("{what}: environment variable {var} is not set")).into()),
    }
}

fn upstream(u: &str, g: &ProxyGuards) -> Result<Upstream> {
    let up = Upstream::new(u).map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(match &g.upstream_key_env {
        Some(var) => up.with_api_key(secret_env(var, "--upstream-key-env")?),
        None => up,
    })
}

fn serve_options(g: &ProxyGuards) -> Result<ServeOptions> {
    if g.max_request_bytes == 0 || g.max_response_bytes == 0 {
        return Err(CliError::Usage(
            "--max-request-bytes and --max-response-bytes must be above 0".into(),
        )
        .into());
    }
    Ok(ServeOptions {
        limits: Limits {
            max_request_bytes: g.max_request_bytes,
            max_response_bytes: g.max_response_bytes,
        },
        token: match &g.token_env {
            Some(var) => Some(secret_env(var, "--token-env")?),
            None => None,
        },
        drain: std::time::Duration::from_secs(g.drain_secs),
    })
}

pub fn run(dir: &std::path::Path, o: &ProxyOptions) -> Result<ExitCode> {
    let (mode, writes) = if o.replay {
        let mixed = match (&o.upstream, &o.into) {
            (Some(u), Some(into)) => Some((upstream(u, &o.guards)?, into.clone())),
            (None, None) => None,
            _ => {
                return Err(CliError::Usage(
                    "mixed mode needs both --upstream URL and --into RUN (where misses and hits are recorded)".into(),
                )
                .into())
            }
        };
        let writes = mixed.is_some();
        (
            Mode::Replay {
                normaliser: normaliser(o.normalise.as_ref())?,
                mixed,
            },
            writes,
        )
    } else {
        let Some(u) = &o.upstream else {
            return Err(CliError::Usage(
                "give --upstream URL to record (or --replay to answer from the recording)".into(),
            )
            .into());
        };
        if o.normalise.is_some() || o.into.is_some() {
            return Err(CliError::Usage("--normalise and --into go with --replay".into()).into());
        }
        (
            Mode::Record {
                upstream: upstream(u, &o.guards)?,
            },
            true,
        )
    };
    // A pure replay writes nothing: it reads without the lock, beside a
    // running `mass run` or on a read-only copy.
    let ledger = Arc::new(if writes {
        super::open(dir)?
    } else {
        super::open_read(dir)?
    });
    let opts = serve_options(&o.guards)?;
    let url_file = o.url_file.clone();
    let summary = proxy::serve_until_signal(
        ledger,
        o.listen,
        &o.run,
        &o.stream,
        mode,
        &opts,
        move |url| announce(url, url_file.as_deref()),
    )
    .map_err(engine::error::EngineError::from)?;
    if let Some(h) = summary.head {
        let target = o.into.as_deref().unwrap_or(&o.run);
        eprintln!(
            "recorded into {} (head {})",
            replay::ref_name(target, &o.stream),
            h.short(12)
        );
    }
    if let Some((served, total)) = summary.progress {
        eprintln!("replayed {served} of {total} recorded exchanges");
    }
    for m in &summary.misses {
        eprintln!("{m}");
    }
    for u in &summary.unrecorded {
        eprintln!("not recorded: {u}");
    }
    Ok(
        if summary.misses.is_empty() && summary.unrecorded.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        },
    )
}

pub fn harness_replay(dir: &std::path::Path, rollout: &str, json: bool) -> Result<ExitCode> {
    // The ledger is only read: the re-execution records nothing.
    let ledger = Arc::new(super::open_read(dir)?);
    let id = super::resolve(&ledger, rollout)?;
    let r = engine::harness::external::reexecute(ledger, id)?;
    let identical = r.identical();
    let code = crate::output::decide(if identical { 0 } else { 1 });
    if json {
        let v = serde_json::json!({
            "rollout": id.to_hex(),
            "identical": identical,
            "served": r.served,
            "recorded": r.recorded,
            "misses": r.misses,
            "workspace_diff": r.workspace_diff,
            "exit_code": r.exit_code,
            "recorded_exit_code": r.recorded_exit_code,
        });
        crate::output::outln!("{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        crate::output::outln!(
            "rollout {}: its harness re-executed against the recording alone",
            id.short(12)
        )?;
        crate::output::outln!(
            "  requests:  {} of {} recorded exchanges served, {} miss(es)",
            r.served,
            r.recorded,
            r.misses.len()
        )?;
        if r.workspace_diff.is_empty() {
            crate::output::outln!("  workspace: identical to the recorded final workspace")?;
        } else {
            crate::output::outln!("  workspace: {} path(s) differ", r.workspace_diff.len())?;
            for d in &r.workspace_diff {
                crate::output::outln!("    {d}")?;
            }
        }
        let code = |c: Option<i32>| c.map_or("a signal".to_string(), |c| c.to_string());
        crate::output::outln!(
            "  exit:      {} (recorded {})",
            code(r.exit_code),
            code(r.recorded_exit_code)
        )?;
        for m in &r.misses {
            crate::output::outln!("{m}")?;
        }
        if !identical && !r.stderr.trim().is_empty() {
            crate::output::outln!("harness stderr:\n{}", r.stderr.trim_end())?;
        }
        crate::output::outln!(
            "{}",
            if identical {
                "identical"
            } else {
                "NOT identical"
            }
        )?;
    }
    Ok(code)
}

/// Tells where the proxy listens: a line on standard output and, with
/// `--url-file`, that file.
fn announce(url: &str, url_file: Option<&Path>) {
    // A proxy whose printed URL nobody reads (stdout closed) keeps
    // serving: the URL is also in --url-file, and stopping a server
    // because its first line went unread would surprise whoever
    // started it. Other write errors are said, as for the file.
    // Written past `output::stdout`: a reader gone here must not
    // mark the command's output closed, which would make a broken
    // pipe elsewhere later (an upstream socket) exit quietly.
    use std::io::Write as _;
    let mut raw = std::io::stdout().lock();
    match writeln!(raw, "{url}").and_then(|()| raw.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("warning: cannot write the URL to standard output: {e}");
        }
        _ => {}
    }
    if let Some(f) = url_file {
        // Written whole, then renamed: a reader never sees half.
        let tmp = f.with_extension("tmp");
        if let Err(e) = std::fs::write(&tmp, url).and_then(|()| std::fs::rename(&tmp, f)) {
            eprintln!("warning: cannot write {}: {e}", f.display());
        }
    }
}
