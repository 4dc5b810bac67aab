//! An external agent harness as the team (`[harness] kind = "external"`):
//! one run of an outside program (Qwen Code, OpenHands, an in-house agent)
//! per rollout, in the rollout's workspace, inside the sandbox, its model
//! traffic sent through a recording proxy into the rollout's `wire` stream.
//! The run is one journaled `harness` effect on the orchestrator's stream
//! (the command template, the prompt, the initial tree; out: the exit
//! status, capped output, the final tree and the range of wire events it
//! produced), so replays, resumes, re-judges and forks never run the program
//! again. The wire traffic is split into conversations by content (each
//! request extends the longest earlier one: a chain per agent, whatever order
//! background subagents interleave in): the chain the first request starts is
//! the orchestrator's, the others are subagents', which is what the dataset
//! trains on. `reexecute` runs a recorded rollout's program again against its
//! recording, upstream-free, and says whether workspace and traffic repeat.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ledger::{Id, Ledger};
use replay::{Begin, EffectError, EffectOutput, EffectRequest};
use schemas::{Effect, EffectStatus};
use serde_json::{json, Value};

use super::{
    close_run, initial_snapshot, task_prompt, LiveWorkspace, Played, RunOutcome, RunRules, RunSpec,
    Team,
};
use crate::config::{expand_placeholders, shell_quote, HarnessConfig};
use crate::error::{EngineError, Result};
use crate::exec;
use crate::proxy::{self, Book, Normaliser, ProxyServer, Route, Secret, Upstream, WireLog};
use crate::tools::{self, BashOptions, BashOutput};

/// The `harness` effect's request (SCHEMAS.md, "External harness"): the
/// recorded template and settings, everything a re-execution needs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct HarnessRequest {
    harness: String,
    command: String,
    env: BTreeMap<String, String>,
    pass_env: Vec<String>,
    readable: Vec<String>,
    timeout_secs: u64,
    limits: Option<sandbox::Limits>,
    normalise: proxy::NormaliseConfig,
    sandbox: crate::config::SandboxConfig,
    output_bytes: u64,
    model: String,
    /// Blob id of the prompt.
    prompt: String,
    /// The initial workspace tree.
    tree: String,
    /// The wire stream (relative name).
    wire: String,
    /// The task declared network access (`network = true` in `task.toml`):
    /// the program ran on the host network, its proxy route on loopback
    /// TCP. Absent (false) otherwise: its own network namespace, the route
    /// reached through a forwarded port only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    network: bool,
}

impl HarnessRequest {
    fn config(&self) -> HarnessConfig {
        HarnessConfig {
            kind: crate::config::HarnessKind::External,
            command: self.command.clone(),
            env: self.env.clone(),
            pass_env: self.pass_env.clone(),
            readable: self.readable.clone(),
            timeout_secs: self.timeout_secs,
            limits: self.limits,
            normalise: self.normalise.clone(),
        }
    }
}

/// What the harness effect recorded.
#[derive(Debug, Clone)]
pub struct HarnessRun {
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub tree: Id,
    /// The wire stream's head before and after the run.
    pub wire_from: Option<Id>,
    pub wire_to: Option<Id>,
    /// Where the program was told its workspace and home are: their fixed
    /// places at `Level::Full` (the same in every run), the host's paths
    /// below it (recorded so a re-execution can run there: the recorded
    /// prompts name them).
    pub workspace: String,
    pub home: String,
}

impl HarnessRun {
    fn to_value(&self) -> Value {
        json!({
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "tree": self.tree.to_hex(),
            "wire_from": self.wire_from.map(|i| i.to_hex()),
            "wire_to": self.wire_to.map(|i| i.to_hex()),
            "workspace": self.workspace,
            "home": self.home,
        })
    }

    fn from_value(v: &Value) -> Option<HarnessRun> {
        let id = |k: &str| v[k].as_str().and_then(|s| s.parse::<Id>().ok());
        Some(HarnessRun {
            exit_code: v["exit_code"].as_i64().map(|c| c as i32),
            timed_out: v["timed_out"].as_bool().unwrap_or(false),
            stdout: v["stdout"].as_str().unwrap_or_default().to_string(),
            stderr: v["stderr"].as_str().unwrap_or_default().to_string(),
            tree: id("tree")?,
            wire_from: id("wire_from"),
            wire_to: id("wire_to"),
            workspace: v["workspace"].as_str().unwrap_or_default().to_string(),
            home: v["home"].as_str().unwrap_or_default().to_string(),
        })
    }
}

/// The `harness` effect's request for one rollout.
fn harness_request(
    spec: &RunSpec<'_>,
    team: &Team,
    rules: &RunRules,
    prompt_blob: &[u8],
    initial: Id,
    wire: &str,
) -> HarnessRequest {
    let h = &rules.harness;
    HarnessRequest {
        harness: "external".into(),
        command: h.command.clone(),
        env: h.env.clone(),
        pass_env: h.pass_env.clone(),
        readable: h.readable.clone(),
        timeout_secs: h.timeout_secs,
        limits: h.limits,
        normalise: h.normalise.clone(),
        sandbox: rules.sandbox,
        output_bytes: rules.limits.tool_output_bytes,
        model: team.orchestrator_model.clone(),
        prompt: Id::of(ledger::ObjectKind::Blob, prompt_blob).to_hex(),
        tree: initial.to_hex(),
        wire: wire.to_string(),
        network: spec.task.network,
    }
}

/// Plays one rollout with the external harness.
pub async fn run(
    session: &replay::Session,
    spec: &RunSpec<'_>,
    team: &Team,
    rules: &RunRules,
) -> Result<RunOutcome> {
    let h = &rules.harness;
    let mut orch = exec::ledger(|| session.stream(&format!("{}/orch", spec.stream)))?;
    let mut ws = LiveWorkspace::new(session, spec, rules);
    let initial = initial_snapshot(&mut orch, &mut ws, spec).await?;
    let prompt = task_prompt(
        spec,
        &crate::prompts::external_directive(&spec.task.id, &spec.task.deliverables),
    );
    let wire = format!("{}/wire", spec.stream);
    let prompt_blob = prompt.as_bytes().to_vec();
    let request = harness_request(spec, team, rules, &prompt_blob, initial, &wire);
    let request = serde_json::to_value(&request)
        .map_err(|e| EngineError::Invalid(format!("harness request: {e}")))?;
    let req = EffectRequest::json("harness", &request)
        .with_blob(prompt_blob)
        .with_link(initial)
        .journaled();
    let handle = tokio::runtime::Handle::current();
    let ledger = session.ledger().clone();
    let run_name = session.run().to_string();
    let rec = exec::blocking(|| match exec::ledger(|| orch.begin(req))? {
        Begin::Served(r) => Ok::<_, EngineError>(r),
        Begin::Perform(p) => {
            let out = perform(
                &handle,
                &ledger,
                &run_name,
                &wire,
                &mut ws,
                team,
                rules,
                &prompt,
                spec.task.network,
            );
            Ok(exec::ledger(|| orch.finish(p, out))?)
        }
    })?;
    let bytes = rec.output.map_err(|e| match rec.failure {
        Some(replay::FailureClass::Transient) => EngineError::Infrastructure {
            what: "the external harness".into(),
            detail: e,
        },
        _ => EngineError::Invalid(format!("the external harness could not run: {e}")),
    })?;
    let v: Value =
        serde_json::from_slice(&bytes).map_err(|e| EngineError::recording("harness output", e))?;
    let hr = HarnessRun::from_value(&v)
        .ok_or_else(|| EngineError::recording("harness output", "no tree"))?;
    ws.record_tree(Some(hr.tree));
    let convs = match hr.wire_to {
        Some(to) => exec::ledger(|| conversations(&ledger, hr.wire_from, to))?,
        None => Conversations::default(),
    };
    let (status, detail) = if hr.timed_out {
        (
            "halted",
            format!("harness time limit ({} s) reached", h.timeout_secs),
        )
    } else if hr.exit_code == Some(0) {
        ("finished", String::new())
    } else {
        let tail: String = {
            let t = hr.stderr.trim_end();
            let start = t.char_indices().rev().nth(299).map_or(0, |(i, _)| i);
            t[start..].to_string()
        };
        (
            "failed",
            format!(
                "the harness exited with {}: {tail}",
                hr.exit_code
                    .map_or("a signal".to_string(), |c| format!("status {c}"))
            ),
        )
    };
    let played = Played {
        status,
        detail,
        report: convs.report.clone(),
        orchestrator: convs.orchestrator,
        subagents: convs.subagents.clone(),
        turns: convs.calls,
        prompt_tokens: convs.prompt_tokens,
        completion_tokens: convs.completion_tokens,
    };
    close_run(&mut orch, &mut ws, spec, team, rules, initial, played).await
}

/// The program's command line and environment for one run, and the
/// workspace and home it was told (their fixed places at `Level::Full`).
struct Invocation {
    line: String,
    opts: BashOptions,
    workspace: String,
    home: String,
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
struct Reach {
    base_url: String,
    network: bool,
    forward: Vec<sandbox::Forward>,
    readable: Vec<PathBuf>,
}

/// The route's server, where only the program it is for can reach it.
struct Served {
    server: ProxyServer,
    reach: Reach,
}

/// Serves `route` for the program in `workspace`. At `Level::Full` without
/// network: on a unix socket in `<workspace>.proxy` (beside the workspace,
/// so hidden from every other rollout with the scratch root), which the
/// program's namespace relays 127.0.0.1:[`PROXY_PORT`] to; the program has
/// no other network. Otherwise (the task declared network, or a lower
/// level, which isolates no rollout from another) on loopback TCP. Either
/// way the route serves only the rollout's token.
fn serve_route(
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
    super::private_dir(&dir, 0o755).map_err(what)?;
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
fn proxy_dir_of(workspace: &Path) -> PathBuf {
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
fn invocation(
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
fn home_of(workspace: &Path) -> PathBuf {
    let mut name = workspace.as_os_str().to_owned();
    name.push(".home");
    PathBuf::from(name)
}

fn fresh_dir(d: &Path) -> std::io::Result<()> {
    if d.exists() {
        std::fs::remove_dir_all(d)?;
    }
    std::fs::create_dir_all(d)
}

/// Runs the program once, recording its traffic; the effect's output.
#[allow(clippy::too_many_arguments)]
fn perform(
    handle: &tokio::runtime::Handle,
    ledger: &Arc<Ledger>,
    run: &str,
    wire: &str,
    ws: &mut LiveWorkspace<'_>,
    team: &Team,
    rules: &RunRules,
    prompt: &str,
    network: bool,
) -> std::result::Result<EffectOutput, EffectError> {
    let transient =
        |what: &str, e: &dyn std::fmt::Display| EffectError::transient(format!("{what}: {e}"));
    let endpoint = handle
        .block_on(team.orchestrator.endpoint(&team.orchestrator_model))
        .map_err(|e| transient("the model endpoint", &e))?
        .ok_or_else(|| {
            EffectError::final_(
                "the orchestrator's backend has no HTTP endpoint for an external harness",
            )
        })?;
    let mut upstream =
        Upstream::new(&endpoint.base_url).map_err(|e| EffectError::final_(e.to_string()))?;
    if let Some(key) = endpoint.api_key.as_deref() {
        upstream = upstream.with_api_key(Secret::new(key));
    }
    let dir = ws.ensure().map_err(|e| transient("the workspace", &e))?;
    let home = home_of(&dir);
    fresh_dir(&home).map_err(|e| transient("the harness home", &e))?;
    let prompt_file = home.join("prompt.md");
    std::fs::write(&prompt_file, prompt).map_err(|e| transient("the prompt file", &e))?;
    let log =
        WireLog::open(ledger.clone(), run, wire).map_err(|e| transient("the wire stream", &e))?;
    let wire_from = log.head();
    let token = super::rollout_token().map_err(|e| transient("a rollout token", &e))?;
    let route = Arc::new(
        Route::record(log, upstream)
            .require_token(Secret::new(token.as_str()))
            .only_model_calls(),
    );
    let served = serve_route(handle, route.clone(), &dir, rules.sandbox.level, network)
        .map_err(|e| transient("the proxy", &e))?;
    let secrets: Vec<&str> = endpoint.api_key.as_deref().into_iter().collect();
    let inv = invocation(
        &rules.harness,
        rules,
        &dir,
        &home,
        &prompt_file,
        &served.reach,
        &token,
        &team.orchestrator_model,
        &secrets,
        false,
    )
    .map_err(EffectError::final_)?;
    let out = tools::Workspace::new(&dir)
        .map_err(|e| transient("the workspace", &e))
        .and_then(|w| {
            w.bash(&inv.line, &inv.opts)
                .map_err(|e| transient("the harness", &e))
        });
    drop(served.server);
    let wire_to = handle
        .block_on(route.finish())
        .map_err(|e| transient("recording the harness's traffic", &e))?;
    let _ = std::fs::remove_dir_all(&home);
    let _ = std::fs::remove_dir_all(proxy_dir_of(&dir));
    let out: BashOutput = out?;
    if out.exit_code != Some(0) {
        if let Some(e) = server_failure(ledger, wire, wire_from, wire_to)? {
            // The program gave up because the model server did: not the
            // team's doing. The run stops; `mass resume` runs it again.
            return Err(EffectError::transient(format!(
                "the model server failed the harness's last request ({e}); the harness exited with {}",
                out.exit_code
                    .map_or("a signal".into(), |c| format!("status {c}"))
            )));
        }
    }
    let tree = ws
        .snapshot()
        .map_err(|e| transient("the final snapshot", &e))?;
    let run = HarnessRun {
        exit_code: out.exit_code,
        timed_out: out.timed_out,
        stdout: out.stdout,
        stderr: out.stderr,
        tree,
        wire_from,
        wire_to: if wire_to == wire_from { None } else { wire_to },
        workspace: inv.workspace,
        home: inv.home,
    };
    let mut o = EffectOutput::json(&run.to_value()).with_link(tree);
    if let Some(w) = run.wire_to {
        o = o.with_link(w);
    }
    Ok(o)
}

/// The last request of this run's traffic, when the server failed it
/// transiently (HTTP 429/5xx, unreachable): what it said.
fn server_failure(
    ledger: &Ledger,
    wire: &str,
    from: Option<Id>,
    to: Option<Id>,
) -> std::result::Result<Option<String>, EffectError> {
    let Some(to) = to.filter(|t| Some(*t) != from) else {
        return Ok(None);
    };
    let calls = proxy::log::load_chain(ledger, wire, from, to)
        .map_err(|e| EffectError::transient(format!("reading the harness's traffic: {e}")))?;
    Ok(calls.last().and_then(|r| {
        (r.status == EffectStatus::Retriable).then(|| match &r.reply {
            proxy::log::RecordedOutcome::Unreachable(m) => format!("unreachable: {m}"),
            proxy::log::RecordedOutcome::Http { status, .. } => format!("HTTP {status}"),
        })
    }))
}

/// A rollout's wire traffic as conversations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversations {
    /// The orchestrator's last call (its whole conversation by prefixes).
    pub orchestrator: Option<Id>,
    /// Each subagent's last call, in the order the subagents started.
    pub subagents: Vec<Id>,
    /// Exchanges in the range (failed attempts included).
    pub calls: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// The orchestrator's last reply.
    pub report: String,
}

struct WireCall {
    id: Id,
    prefix: Option<Id>,
    ok: bool,
    chat: bool,
    output: Option<Value>,
}

/// Splits the wire events after `from` up to `to` into conversations.
pub fn conversations(ledger: &Ledger, from: Option<Id>, to: Id) -> Result<Conversations> {
    let mut calls = Vec::new();
    for ev in ledger.chain(to) {
        let ev = ev?;
        if Some(ev.id) == from {
            break;
        }
        let e: Effect = schemas::decode_event(&ev)?;
        let req: Value = serde_json::from_slice(&ledger.get_blob(&Id(e.request.0))?)
            .map_err(|x| EngineError::recording("wire request", x))?;
        let output = match e.output {
            Some(o) if e.status == EffectStatus::Ok => Some(
                serde_json::from_slice::<Value>(&ledger.get_blob(&Id(o.0))?)
                    .map_err(|x| EngineError::recording("wire output", x))?,
            ),
            _ => None,
        };
        calls.push(WireCall {
            id: ev.id,
            prefix: req["prefix"].as_str().and_then(|h| h.parse().ok()),
            ok: e.status == EffectStatus::Ok,
            chat: req["messages"].is_array(),
            output,
        });
    }
    calls.reverse();
    let mut out = Conversations {
        calls: calls.len() as u32,
        ..Default::default()
    };
    let prefix_of: HashMap<Id, Option<Id>> = calls.iter().map(|c| (c.id, c.prefix)).collect();
    let extended: HashSet<Id> = calls.iter().filter_map(|c| c.prefix).collect();
    // The first request of a chain, inside the range (a prefix from an
    // earlier attempt on the same stream ends the walk: that attempt's
    // traffic is not this run's).
    let root = |mut id: Id| {
        while let Some(Some(p)) = prefix_of.get(&id) {
            if !prefix_of.contains_key(p) {
                break;
            }
            id = *p;
        }
        id
    };
    let order: HashMap<Id, usize> = calls.iter().enumerate().map(|(i, c)| (c.id, i)).collect();
    let mut last_leaf: BTreeMap<usize, Id> = BTreeMap::new();
    for c in &calls {
        if let Some(o) = &c.output {
            out.prompt_tokens += o["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
            out.completion_tokens += o["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        }
        if c.ok && c.chat && !extended.contains(&c.id) {
            // Leaves in log order: the last of a chain wins.
            last_leaf.insert(order[&root(c.id)], c.id);
        }
    }
    let first_root = calls.iter().find(|c| c.chat).map(|c| order[&root(c.id)]);
    for (r, leaf) in last_leaf {
        if Some(r) == first_root {
            out.orchestrator = Some(leaf);
        } else {
            out.subagents.push(leaf);
        }
    }
    if let Some(o) = out.orchestrator {
        let last = calls
            .iter()
            .find(|c| c.id == o)
            .and_then(|c| c.output.clone());
        out.report = last
            .map(|v| match &v["message"]["content"] {
                Value::String(s) => s.clone(),
                _ => String::new(),
            })
            .unwrap_or_default();
    }
    Ok(out)
}

/// What re-executing a recorded rollout's harness showed.
#[derive(Debug, Clone)]
pub struct Reexecution {
    pub exit_code: Option<i32>,
    pub recorded_exit_code: Option<i32>,
    /// Recorded exchanges served, of those the rollout recorded.
    pub served: usize,
    pub recorded: usize,
    /// Requests the recording did not hold (each a readable report).
    pub misses: Vec<String>,
    /// Paths whose contents differ between the recorded final workspace and
    /// this one (`+` only here, `-` only recorded, `~` both, differing).
    pub workspace_diff: Vec<String>,
    pub stderr: String,
}

impl Reexecution {
    /// Workspace and traffic repeated exactly.
    pub fn identical(&self) -> bool {
        self.misses.is_empty()
            && self.served == self.recorded
            && self.workspace_diff.is_empty()
            && self.exit_code == self.recorded_exit_code
    }
}

/// The harness effect before `rollout` on its orchestrator stream.
fn harness_effect(ledger: &Ledger, rollout: Id) -> Result<(HarnessRequest, HarnessRun)> {
    for ev in ledger.chain(rollout) {
        let ev = ev?;
        if ev.kind != "effect" {
            continue;
        }
        let e: Effect = schemas::decode_event(&ev)?;
        if e.effect != "harness" || e.status != EffectStatus::Ok {
            continue;
        }
        let req: HarnessRequest = serde_json::from_slice(&ledger.get_blob(&Id(e.request.0))?)
            .map_err(|x| EngineError::recording("harness request", x))?;
        let out = e
            .output
            .ok_or_else(|| EngineError::recording("harness effect", "no output"))?;
        let v: Value = serde_json::from_slice(&ledger.get_blob(&Id(out.0))?)
            .map_err(|x| EngineError::recording("harness output", x))?;
        let run = HarnessRun::from_value(&v)
            .ok_or_else(|| EngineError::recording("harness output", "no tree"))?;
        return Ok((req, run));
    }
    Err(EngineError::NotFound(format!(
        "{} is not a rollout of an external harness (no harness effect on its stream)",
        rollout.short(12)
    )))
}

/// The normaliser for one side: the recorded rules plus that side's paths
/// (workspace, home, the home relative to the workspace, and the workspace
/// as a slug, `[^A-Za-z0-9]` turned into `-`, as harnesses name per-project
/// state directories).
fn side_normaliser(
    cfg: &proxy::NormaliseConfig,
    workspace: &str,
    home: &str,
) -> Result<Normaliser> {
    let slug = |p: &str| {
        p.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect::<String>()
    };
    let rel_home = Path::new(home)
        .file_name()
        .map(|n| format!("../{}", n.to_string_lossy()))
        .unwrap_or_default();
    Ok(Normaliser::new(cfg)
        .map_err(proxy::ProxyError::from)?
        // Applied in reverse order of adding: each goes first.
        .with_literal(&slug(workspace), "<WORKSPACE-SLUG>")
        .with_literal(&rel_home, "<HOME>")
        .with_literal(workspace, "<WORKSPACE>")
        .with_literal(home, "<HOME>"))
}

/// Where a re-execution runs, and the directories it takes (given back
/// when dropped). Where the program was told it ran: the recorded replies
/// name those paths (a model writes to absolute paths it was shown), and
/// served replies are the recorded bytes. A fixed place (`Level::Full`) is
/// made again from any fresh directory; a host path (below it, or recorded
/// before places existed) only by running there.
fn reexecution_dirs(recorded: &HarnessRun, wire: &str) -> Result<(PathBuf, Places)> {
    if recorded.workspace == crate::places::WORKSPACE {
        let dir = super::fresh_scratch("reexecute", wire)
            .map_err(|e| EngineError::io("create a scratch workspace", e))?;
        let made = vec![dir.clone(), home_of(&dir), proxy_dir_of(&dir)];
        return Ok((dir, Places::taken(made)));
    }
    let dir = PathBuf::from(&recorded.workspace);
    let home = PathBuf::from(&recorded.home);
    let p = Places::claim(&[&dir, &home, &proxy_dir_of(&dir)])?;
    Ok((dir, p))
}

/// Runs the program of recorded rollout `rollout` (its `mass.rollout`
/// event, or any event of its orchestrator stream after the harness ran)
/// again: in a fresh checkout of its initial workspace, with the recorded
/// command, environment and sandbox, against a proxy that answers only from
/// the recording (no model server). Needs the program installed as when it
/// was recorded (`pass_env`, `readable`).
pub fn reexecute(ledger: Arc<Ledger>, rollout: Id) -> Result<Reexecution> {
    let (req, recorded) = harness_effect(&ledger, rollout)?;
    let Some(to) = recorded.wire_to else {
        return Err(EngineError::Invalid(
            "the rollout's harness made no model call: there is nothing to replay".into(),
        ));
    };
    let h = req.config();
    let (wire, model) = (req.wire.clone(), req.model.clone());
    let id = |what: &str, hex: &str| {
        hex.parse::<Id>()
            .map_err(|e| EngineError::recording(format!("harness request {what}"), e))
    };
    let initial = id("tree", &req.tree)?;
    let prompt_id = id("prompt", &req.prompt)?;
    let prompt = String::from_utf8_lossy(&ledger.get_blob(&prompt_id)?).into_owned();

    let scratch = tempfile::Builder::new()
        .prefix("mass-reexec-")
        .tempdir()
        .map_err(|e| EngineError::io("create a scratch directory", e))?;
    let (dir, _places) = reexecution_dirs(&recorded, &wire)?;
    let home = home_of(&dir);
    ledger.checkout(&initial, &dir)?;
    fresh_dir(&home).map_err(|e| EngineError::io("create the harness home", e))?;
    let prompt_file = home.join("prompt.md");
    std::fs::write(&prompt_file, &prompt)
        .map_err(|e| EngineError::io("write the prompt file", e))?;

    let recorded_norm = side_normaliser(&h.normalise, &recorded.workspace, &recorded.home)?;
    // This run is told the recorded paths (see above).
    let here_norm = side_normaliser(&h.normalise, &recorded.workspace, &recorded.home)?;
    let book = Book::open_range(ledger.clone(), &wire, recorded_norm, recorded.wire_from, to)?
        .with_incoming(here_norm);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| EngineError::io("start the async runtime", e))?;
    let token = super::rollout_token().map_err(|e| EngineError::io("make a rollout token", e))?;
    let route =
        Arc::new(Route::replay(book, None, None).require_token(Secret::new(token.as_str())));
    let served = serve_route(
        rt.handle(),
        route.clone(),
        &dir,
        req.sandbox.level,
        req.network,
    )
    .map_err(|e| EngineError::Invalid(format!("the replaying proxy: {e}")))?;
    let r = RunRules {
        sandbox: req.sandbox,
        limits: crate::config::Limits {
            tool_output_bytes: req.output_bytes,
            ..Default::default()
        },
        harness: h.clone(),
        ..Default::default()
    };
    let inv = invocation(
        &h,
        &r,
        &dir,
        &home,
        &prompt_file,
        &served.reach,
        &token,
        &model,
        &[],
        recorded.workspace != crate::places::WORKSPACE,
    )
    .map_err(EngineError::Invalid)?;
    let out = tools::Workspace::new(&dir)
        .map_err(|e| EngineError::Invalid(e.to_string()))?
        .bash(&inv.line, &inv.opts)
        .map_err(|e| EngineError::Invalid(format!("the harness could not run: {e}")))?;
    drop(served.server);
    let (served, total) = route.progress().unwrap_or((0, 0));
    let misses = route.misses();
    // The recorded final workspace beside this one, compared file by file.
    let _ = std::fs::remove_dir_all(&home);
    let theirs = scratch.path().join("recorded");
    ledger.checkout(&recorded.tree, &theirs)?;
    let workspace_diff =
        compare_dirs(&theirs, &dir).map_err(|e| EngineError::io("compare the workspaces", e))?;
    Ok(Reexecution {
        exit_code: out.exit_code,
        recorded_exit_code: recorded.exit_code,
        served,
        recorded: total,
        misses,
        workspace_diff,
        stderr: out.stderr,
    })
}

/// Directories a re-execution takes for its run, given back when it ends:
/// each must not exist (another run may be using it), and the parents it
/// had to create go too.
struct Places {
    made: Vec<PathBuf>,
    parents: Vec<PathBuf>,
    marks: Vec<PathBuf>,
}

impl Places {
    /// Directories made fresh for this run (nothing to claim).
    fn taken(made: Vec<PathBuf>) -> Places {
        Places {
            made,
            parents: Vec::new(),
            marks: Vec::new(),
        }
    }

    fn claim(dirs: &[&Path]) -> Result<Places> {
        let mut p = Places {
            made: Vec::new(),
            parents: Vec::new(),
            marks: Vec::new(),
        };
        for d in dirs {
            if !scratch_shaped(d) {
                return Err(EngineError::recording(
                    "harness output",
                    format!(
                        "the recorded path {} is not one mass makes for a rollout (TMP/mass-work-PID/NAME): refusing to create or run anything there",
                        d.display()
                    ),
                ));
            }
            if d.exists() {
                return Err(EngineError::Invalid(format!(
                    "{} exists: the rollout ran there and re-executes there; it is in use (or left over: remove it and retry)",
                    d.display()
                )));
            }
            let mut missing = Vec::new();
            let mut a = d.parent();
            while let Some(x) = a {
                if x.exists() {
                    break;
                }
                missing.push(x.to_path_buf());
                a = x.parent();
            }
            if let Some(parent) = d.parent() {
                let create = |e| EngineError::io(format!("create {}", parent.display()), e);
                if let Some(up) = parent.parent() {
                    std::fs::create_dir_all(up).map_err(create)?;
                }
                // Made private, or accepted only if it is this user's and
                // no one else can write to it.
                super::private_dir(parent, 0o711).map_err(create)?;
                // A live run's clean-up of dead processes' scratch roots
                // leaves this one alone while the mark is there.
                let mark = parent.join(super::claim_mark());
                if !mark.exists() {
                    std::fs::write(&mark, b"")
                        .map_err(|e| EngineError::io(format!("create {}", mark.display()), e))?;
                    p.marks.push(mark);
                }
            }
            p.made.push(d.to_path_buf());
            p.parents.extend(missing);
        }
        Ok(p)
    }
}

/// Whether `p` has the shape of a path mass gives a rollout: an absolute
/// `.../mass-work-PID/NAME` where NAME is a workspace's (hex tag, `-`, a
/// number), optionally followed by `.home` or `.proxy`. A recording naming
/// anything else (a ledger from elsewhere) must not make root create files
/// or run a program there.
fn scratch_shaped(p: &Path) -> bool {
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return false;
    };
    let parent_ok = parent
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("mass-work-"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
    let name = name.to_string_lossy();
    let base = name
        .strip_suffix(".home")
        .or_else(|| name.strip_suffix(".proxy"))
        .unwrap_or(&name);
    let base_ok = base.split_once('-').is_some_and(|(tag, n)| {
        !tag.is_empty()
            && tag.bytes().all(|b| b.is_ascii_hexdigit())
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
    });
    p.is_absolute() && parent_ok && base_ok
}

impl Drop for Places {
    fn drop(&mut self) {
        for d in &self.made {
            let _ = std::fs::remove_dir_all(d);
        }
        for m in &self.marks {
            let _ = std::fs::remove_file(m);
        }
        // Parents only if nothing else came to live in them.
        for d in &self.parents {
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn files_under(root: &Path) -> std::io::Result<BTreeMap<PathBuf, Vec<u8>>> {
    // Every error names the path it is about.
    let at = |p: &Path| {
        let p = p.to_path_buf();
        move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
    };
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(at(&d))? {
            let e = e.map_err(at(&d))?;
            let p = e.path();
            let t = e.file_type().map_err(at(&p))?;
            let rel = p.strip_prefix(root).unwrap_or(&p).to_path_buf();
            if t.is_dir() {
                stack.push(p);
            } else if t.is_symlink() {
                let target = std::fs::read_link(&p).map_err(at(&p))?;
                out.insert(rel, target.into_os_string().into_encoded_bytes());
            } else {
                out.insert(rel, std::fs::read(&p).map_err(at(&p))?);
            }
        }
    }
    Ok(out)
}

/// Paths that differ between two directory trees.
fn compare_dirs(recorded: &Path, here: &Path) -> std::io::Result<Vec<String>> {
    let a = files_under(recorded)?;
    let b = files_under(here)?;
    let mut out = Vec::new();
    for (p, x) in &a {
        match b.get(p) {
            None => out.push(format!("- {}", p.display())),
            Some(y) if x != y => out.push(format!("~ {}", p.display())),
            _ => {}
        }
    }
    for p in b.keys().filter(|p| !a.contains_key(*p)) {
        out.push(format!("+ {}", p.display()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::scratch_shaped;
    use std::path::Path;

    /// Regression (#24 review): `mass harness-replay` took the workspace and
    /// home paths from the recording, so a ledger from elsewhere could make
    /// root create files and run its command anywhere.
    #[test]
    fn only_paths_mass_makes_for_rollouts_are_replayed_into() {
        for ok in [
            "/tmp/mass-work-12/0123456789abcdef01234567-0",
            "/tmp/mass-work-12/0123456789abcdef01234567-3.home",
            "/var/tmp/x/mass-work-1/ab-12.proxy",
        ] {
            assert!(scratch_shaped(Path::new(ok)), "{ok}");
        }
        for bad in [
            "/etc/systemd/system/x.service.d",
            "/tmp/mass-work-12/../../etc/cron.d",
            "/tmp/mass-work-x/0123-0",
            "/tmp/mass-work-12/0123-0/sub",
            "tmp/mass-work-12/0123-0",
            "/tmp/mass-work-12/zz-0",
            "/tmp/mass-work-12/0123-",
        ] {
            assert!(!scratch_shaped(Path::new(bad)), "{bad}");
        }
    }
}
