//! How the program is started, in both directions (recording it and
//! re-executing it): its proxy route served where only it can reach it,
//! its command line and environment (never a credential), and its
//! confinement. One place, so a re-execution runs the program exactly as
//! the recording did.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{expand_placeholders, shell_quote, HarnessConfig};
use crate::harness::RunRules;
use crate::tools::{self, BashOptions};
use proxy::{self, ProxyServer, Route};

/// The program's command line and environment for one run, and the
/// workspace and home it was told (their fixed places at `Level::Full`).
pub(super) struct Invocation {
    pub(super) line: String,
    pub(super) opts: BashOptions,
    pub(super) workspace: String,
    pub(super) home: String,
}

/// `$NAME/rest` with NAME taken from this process's environment.
fn expand_env_path(entry: &str) -> std::result::Result<PathBuf, String> {
    let Some(rest) = entry.strip_prefix('$') else {
        return Ok(PathBuf::from(entry));
    };
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let (name, tail) = rest.split_at(end);
    let value = std::env::var(name).map_err(|_| {
        format!("harness.readable names ${name}, which is not set in mass's environment")
    })?;
    Ok(PathBuf::from(format!("{value}{tail}")))
}

/// The port an external program reaches its own proxy route on inside its
/// own network namespace. Nothing else listens there, so any port would do;
/// a fixed one gives every rollout the same base URL.
pub const PROXY_PORT: u16 = 8080;

/// How a program reaches its own proxy route, and what its confinement
/// needs for that.
pub(super) struct Reach {
    pub(super) base_url: String,
    pub(super) network: bool,
    pub(super) forward: Vec<sandbox::Forward>,
    pub(super) readable: Vec<PathBuf>,
}

/// The route's server, where only the program it is for can reach it.
pub(super) struct Served {
    pub(super) server: ProxyServer,
    pub(super) reach: Reach,
}

/// Serves `route` for the program in `workspace`. At `Level::Full` without
/// network: on a unix socket in `<workspace>.proxy` (beside the workspace,
/// so hidden from every other rollout with the scratch root), which the
/// program's namespace relays 127.0.0.1:[`PROXY_PORT`] to; the program has
/// no other network. Otherwise (the task declared network, or a lower
/// level, which isolates no rollout from another) on loopback TCP. Either
/// way the route serves only the rollout's token.
pub(super) fn serve_route(
    handle: &tokio::runtime::Handle,
    route: Arc<Route>,
    workspace: &Path,
    level: sandbox::Level,
    network: bool,
) -> std::result::Result<Served, String> {
    if level != sandbox::Level::Full || network {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let server = handle
            .block_on(ProxyServer::bind(addr))
            .map_err(|e| format!("the proxy: {e}"))?;
        let base_url = server.set_default(route);
        let reach = Reach {
            base_url,
            network: true,
            forward: Vec::new(),
            readable: Vec::new(),
        };
        return Ok(Served { server, reach });
    }
    let dir = proxy_dir_of(workspace);
    let what = |e: std::io::Error| format!("the proxy directory {}: {e}", dir.display());
    if dir.symlink_metadata().is_ok() {
        std::fs::remove_dir_all(&dir).map_err(what)?;
    }
    crate::harness::private_dir(&dir, 0o755).map_err(what)?;
    let socket = dir.join("api.sock");
    let server = handle
        .block_on(ProxyServer::bind_unix(&socket))
        .map_err(|e| format!("the proxy: {e}"))?;
    // The relay connects as the sandbox uid when mass runs as root.
    if sandbox::probe().root {
        std::os::unix::fs::lchown(
            &socket,
            Some(sandbox::SANDBOX_ID),
            Some(sandbox::SANDBOX_ID),
        )
        .map_err(what)?;
    }
    server.set_default(route);
    let reach = Reach {
        base_url: format!("http://127.0.0.1:{PROXY_PORT}/v1"),
        network: false,
        forward: vec![sandbox::Forward {
            port: PROXY_PORT,
            socket,
        }],
        readable: vec![dir],
    };
    Ok(Served { server, reach })
}

/// The proxy socket's directory beside a workspace.
pub(super) fn proxy_dir_of(workspace: &Path) -> PathBuf {
    let mut name = workspace.as_os_str().to_owned();
    name.push(".proxy");
    PathBuf::from(name)
}

/// The program's command line and environment. Its `OPENAI_API_KEY` is the
/// rollout's token, never a key: the proxy route adds the real credential
/// upstream. A `pass_env` variable whose name says it holds a credential is
/// refused, and so is any variable holding one of `secrets`. Paths are
/// named where the program finds them (`crate::places`).
#[allow(clippy::too_many_arguments)]
pub(super) fn invocation(
    h: &HarnessConfig,
    rules: &RunRules,
    workspace: &Path,
    home: &Path,
    prompt_file: &Path,
    reach: &Reach,
    token: &str,
    model: &str,
    secrets: &[&str],
    host_paths: bool,
) -> std::result::Result<Invocation, String> {
    let mut confinement = confinement(h, rules, workspace, home, reach)?;
    confinement.host_paths = host_paths;
    let told = |p: &Path| confinement.seen(workspace, p).display().to_string();
    let (ws_told, home_told, prompt_told) = (told(workspace), told(home), told(prompt_file));
    let lookup = |name: &str| {
        Some(shell_quote(&match name {
            "prompt_file" => prompt_told.clone(),
            "workspace" => ws_told.clone(),
            "home" => home_told.clone(),
            "base_url" => reach.base_url.clone(),
            "model" => model.to_string(),
            _ => return None,
        }))
    };
    let line = expand_placeholders(&h.command, lookup)?;
    let mut env: Vec<(String, String)> = vec![
        ("OPENAI_BASE_URL".into(), reach.base_url.clone()),
        ("OPENAI_API_KEY".into(), token.into()),
        ("OPENAI_MODEL".into(), model.into()),
        ("MASS_HARNESS_HOME".into(), home_told.clone()),
    ];
    for (k, v) in &h.env {
        env.push((k.clone(), v.clone()));
    }
    for name in &h.pass_env {
        if proxy::scrub::is_secret_name(name) {
            return Err(format!(
                "harness.pass_env names {name}, which holds a credential by its name: a sandboxed program never gets one (the proxy adds the backend's key upstream); remove it from pass_env"
            ));
        }
        let v = std::env::var(name).map_err(|_| {
            format!("harness.pass_env names {name}, which is not set in mass's environment")
        })?;
        env.push((name.clone(), v));
    }
    if let Some((k, _)) = env
        .iter()
        .find(|(_, v)| secrets.iter().any(|s| !s.is_empty() && v.contains(s)))
    {
        return Err(format!(
            "the harness environment variable {k} holds the backend's API key: a sandboxed program never gets one (the proxy adds it upstream); take it out of harness.env or harness.pass_env"
        ));
    }
    let opts = BashOptions {
        timeout: Duration::from_secs(h.timeout_secs),
        max_output_bytes: rules.limits.tool_output_bytes as usize,
        env,
        confinement,
    };
    Ok(Invocation {
        line,
        opts,
        workspace: ws_told,
        home: home_told,
    })
}

/// How the program is confined: the experiment's level, the harness's
/// limits, its readable paths, its home writable, every other rollout's
/// workspace, home and proxy socket hidden, and home and proxy socket at
/// their fixed places.
fn confinement(
    h: &HarnessConfig,
    rules: &RunRules,
    workspace: &Path,
    home: &Path,
    reach: &Reach,
) -> std::result::Result<tools::Confinement, String> {
    let mut readable = Vec::new();
    for r in &h.readable {
        readable.push(expand_env_path(r)?);
    }
    readable.extend(reach.readable.iter().cloned());
    let mut places = vec![sandbox::Place {
        path: home.to_path_buf(),
        at: PathBuf::from(crate::places::HOME),
    }];
    places.extend(reach.readable.iter().map(|d| sandbox::Place {
        path: d.clone(),
        at: PathBuf::from(crate::places::PROXY),
    }));
    Ok(tools::Confinement {
        level: rules.sandbox.level,
        limits: h.limits.unwrap_or(rules.sandbox.limits),
        network: reach.network,
        readable,
        writable: vec![home.to_path_buf()],
        read_only: false,
        hide: workspace
            .parent()
            .map(Path::to_path_buf)
            .into_iter()
            .collect(),
        forward: reach.forward.clone(),
        places,
        host_paths: false,
    })
}

/// The home directory beside a workspace (never inside it: the harness's
/// state is not the team's work).
pub(super) fn home_of(workspace: &Path) -> PathBuf {
    let mut name = workspace.as_os_str().to_owned();
    name.push(".home");
    PathBuf::from(name)
}

pub(super) fn fresh_dir(d: &Path) -> std::io::Result<()> {
    if d.exists() {
        std::fs::remove_dir_all(d)?;
    }
    std::fs::create_dir_all(d)
}
