//! The recording side: one rollout's program run as one journaled
//! `harness` effect, its model traffic recorded through a proxy route into
//! the rollout's `wire` stream, and the run closed like any team's (checks,
//! guards, the `mass.rollout` event) from what the effect recorded. A
//! replay, resume, re-judge or fork is served the effect and never runs the
//! program again.

use std::sync::Arc;

use ledger::{Id, Ledger};
use replay::{Begin, EffectError, EffectOutput, EffectRequest};
use schemas::EffectStatus;
use serde_json::Value;

use super::conversations::{conversations, Conversations};
use super::invoke::{fresh_dir, home_of, invocation, proxy_dir_of, serve_route};
use super::{HarnessRequest, HarnessRun};
use crate::error::{EngineError, Result};
use crate::exec;
use crate::harness::{
    close_run, initial_snapshot, task_prompt, LiveWorkspace, Played, RunOutcome, RunRules, RunSpec,
    Team,
};
use crate::tools::{self, BashOutput};
use proxy::{self, Route, Secret, Upstream, WireLog};

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

/// Where the harness reaches the orchestrator's model. A backend that
/// cannot serve this model to a program calling it directly will not on a
/// retry either: that is final.
fn endpoint(
    handle: &tokio::runtime::Handle,
    team: &Team,
) -> std::result::Result<crate::backend::Endpoint, EffectError> {
    handle
        .block_on(team.orchestrator.endpoint(&team.orchestrator_model))
        .map_err(|e| match e {
            crate::backend::BackendError::Config { .. } => {
                EffectError::final_(format!("the model endpoint: {e}"))
            }
            e => EffectError::transient(format!("the model endpoint: {e}")),
        })?
        .ok_or_else(|| {
            EffectError::final_(
                "the orchestrator's backend has no HTTP endpoint for an external harness",
            )
        })
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
    // Held to the end of the harness's run: a server `mass` started is not
    // restarted under it.
    let endpoint = endpoint(handle, team)?;
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
    let token = crate::harness::rollout_token().map_err(|e| transient("a rollout token", &e))?;
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
