//! Re-execution: a recorded rollout's program run again against its own
//! recording, upstream-free, in a fresh checkout of its initial workspace,
//! and whether workspace and traffic repeat (the final trees compared file
//! by file).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ledger::{Id, Ledger};
use schemas::{Effect, EffectStatus};
use serde_json::Value;

use super::invoke::{fresh_dir, home_of, invocation, proxy_dir_of, serve_route};
use super::places::Places;
use super::{HarnessRequest, HarnessRun};
use crate::error::{EngineError, Result};
use crate::harness::RunRules;
use crate::tools;
use proxy::{self, Book, Normaliser, Route, Secret};

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
        let dir = crate::harness::fresh_scratch("reexecute", wire)
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
    let token =
        crate::harness::rollout_token().map_err(|e| EngineError::io("make a rollout token", e))?;
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
