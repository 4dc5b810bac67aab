//! `mass sandbox`: runs one command exactly as a rollout's `bash` tool would
//! (same confinement, environment, timeout and output caps), so users can
//! check their setup; `--probe` reports which confinement layers this machine
//! offers and which levels it can run.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use engine::config::SandboxConfig;
use engine::tools::{BashOptions, Confinement, Workspace};

use super::CliError;

/// What to run (`mass sandbox`).
pub struct SandboxOptions<'a> {
    pub workspace: Option<&'a Path>,
    pub limits: Option<&'a Path>,
    pub level: Option<sandbox::Level>,
    pub network: bool,
    pub timeout_secs: u64,
    pub probe: bool,
    pub command: &'a [String],
}

pub fn run(opts: &SandboxOptions<'_>) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if opts.probe {
        print_probe(&mut out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(ws), false) = (opts.workspace, opts.command.is_empty()) else {
        return Err(CliError::Usage(
            "give --workspace DIR and a command after `--` (or --probe)".into(),
        )
        .into());
    };
    let mut cfg = match opts.limits {
        Some(p) => read_config(p)?,
        None => SandboxConfig::default(),
    };
    if let Some(l) = opts.level {
        cfg.level = l;
    }
    let root = std::fs::canonicalize(ws)
        .with_context(|| format!("workspace {} does not exist", ws.display()))?;
    let w = Workspace::new(&root).map_err(|e| CliError::Usage(e.to_string()))?;
    let bash = BashOptions {
        timeout: Duration::from_secs(opts.timeout_secs.max(1)),
        confinement: Confinement {
            level: cfg.level,
            limits: cfg.limits,
            network: opts.network,
            // As a rollout sees its scratch root: the workspace's siblings
            // cannot be named.
            hide: root.parent().map(Path::to_path_buf).into_iter().collect(),
            forward: Vec::new(),
            ..Default::default()
        },
        ..Default::default()
    };
    // Arguments are joined as the model's command string is: one bash line.
    let line = opts.command.join(" ");
    let r = w.bash(&line, &bash).map_err(|e| match e {
        engine::tools::ToolError::Sandbox(s) => {
            anyhow::Error::new(engine::error::EngineError::Sandbox(s))
        }
        other => anyhow::Error::new(other),
    })?;
    out.write_all(r.stdout.as_bytes())?;
    std::io::stderr().write_all(r.stderr.as_bytes())?;
    let level = cfg.level.as_str();
    let code = match (r.exit_code, r.signal) {
        (Some(c), _) => {
            eprintln!(
                "[sandbox level {level}: exit {c}{}]",
                if r.timed_out { ", timed out" } else { "" }
            );
            c
        }
        (None, Some(s)) => {
            eprintln!(
                "[sandbox level {level}: killed by signal {s}{}]",
                if r.timed_out { " (timed out)" } else { "" }
            );
            128 + s
        }
        (None, None) => 1,
    };
    Ok(ExitCode::from(
        u8::try_from(code.clamp(0, 255)).unwrap_or(1),
    ))
}

/// A `[sandbox]` table from an experiment file, or a file holding just its
/// keys (`level`, `[limits]`).
fn read_config(p: &Path) -> Result<SandboxConfig> {
    let text =
        std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
    let mut doc: toml::Table = text
        .parse()
        .map_err(|e| CliError::Usage(format!("{}: {e}", p.display())))?;
    let table = match doc.remove("sandbox") {
        Some(toml::Value::Table(t)) => t,
        Some(_) => {
            return Err(
                CliError::Usage(format!("{}: `sandbox` is not a table", p.display())).into(),
            )
        }
        None => doc,
    };
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| {
            CliError::Usage(format!("{}: {}", p.display(), e.message())).into()
        })
}

fn print_probe(out: &mut impl Write) -> Result<()> {
    let a = sandbox::probe();
    let yes = |b: bool| if b { "yes" } else { "no" };
    writeln!(
        out,
        "landlock ABI        {}",
        a.landlock_abi
            .map_or("unavailable".into(), |v| v.to_string())
    )?;
    writeln!(out, "user namespaces     {}", yes(a.user_namespaces))?;
    writeln!(out, "PID namespace       {}", yes(a.pid_namespace))?;
    writeln!(out, "network namespace   {}", yes(a.net_namespace))?;
    writeln!(out, "fresh /proc         {}", yes(a.mount_proc))?;
    writeln!(out, "IPC/UTS namespaces  {}", yes(a.ipc_uts_namespaces))?;
    writeln!(
        out,
        "running as root     {} (commands run as uid {} if so)",
        yes(a.root),
        sandbox::SANDBOX_ID
    )?;
    for level in [
        sandbox::Level::Full,
        sandbox::Level::Landlock,
        sandbox::Level::None,
    ] {
        match a.check(level) {
            Ok(()) => writeln!(out, "level {:<9} available", level.as_str())?,
            Err(e) => writeln!(out, "level {:<9} unavailable: {e}", level.as_str())?,
        }
    }
    Ok(())
}
