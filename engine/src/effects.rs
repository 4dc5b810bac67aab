//! The engine's effects, each a thin wrapper over `replay::Stream::effect`:
//! model calls (requests stored compactly: messages as shared blobs, chained to
//! the previous call of the conversation), workspace tool calls (with the
//! workspace tree after each change), checks, and snapshots.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ledger::{Id, ObjectKind};
use replay::{Begin, EffectError, EffectOutput, EffectRequest, Stream};
use serde_json::{json, Value};

use crate::backend::{Backend, ChatRequest, ChatResponse, MessagesJson, ToolsJson};
use crate::chat::{Message, ToolDef};
use crate::error::{EngineError, Result};
use crate::exec;

/// A conversation as the harness keeps it, with what the last recorded model
/// call covered so the next request only names new messages.
pub struct Conversation {
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    /// The last model effect event of this conversation.
    prefix: Option<Id>,
    /// Messages covered by `prefix` (its request and its response).
    covered: usize,
    tools_blob: Option<ToolsBlob>,
    /// Whether a call of this conversation was performed (and so stored the
    /// tools blob) in this ledger: a served one may come from a partial
    /// ledger that never held it.
    tools_stored: bool,
    /// The reply's required shape (`ChatRequest::response_format`).
    pub response_format: Option<Value>,
    /// The messages as the wire sends them, made once each.
    wire: MessagesJson,
}

/// The conversation's tools as the blob its requests name (canonical JSON),
/// made once: its id, and the same text for the wire.
struct ToolsBlob {
    bytes: Vec<u8>,
    id: Id,
    json: Option<ToolsJson>,
}

impl ToolsBlob {
    fn of(tools: &[ToolDef]) -> ToolsBlob {
        let bytes = replay::canonical_json(&serde_json::to_value(tools).unwrap_or(Value::Null));
        let id = Id::of(ObjectKind::Blob, &bytes);
        // The wire keeps the definitions' own key order (as serialising
        // them per call did), not the blob's sorted one: a chat template
        // renders the tools as sent, and the trainer's count of the prompt
        // must match the server's (`tests/real_cpu.rs`' template parity
        // failed with sorted keys).
        let json = serde_json::to_vec(tools)
            .ok()
            .and_then(|b| ToolsJson::from_json(&b));
        ToolsBlob { bytes, id, json }
    }
}

impl Conversation {
    pub fn new(messages: Vec<Message>, tools: Vec<ToolDef>) -> Self {
        let tools_blob = (!tools.is_empty()).then(|| ToolsBlob::of(&tools));
        Conversation {
            messages,
            tools,
            prefix: None,
            covered: 0,
            tools_blob,
            tools_stored: false,
            response_format: None,
            wire: MessagesJson::default(),
        }
    }
}

/// Sampling parameters of one call: a role's `SamplingConfig` and a seed.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub temperature: f64,
    pub seed: u64,
    pub max_tokens: u64,
    pub top_p: Option<f64>,
    pub stop: Vec<String>,
    pub tool_choice: Option<String>,
}

impl Sampling {
    pub fn of(c: &crate::config::SamplingConfig, seed: u64) -> Sampling {
        Sampling {
            temperature: c.temperature,
            seed,
            max_tokens: c.max_tokens,
            top_p: c.top_p,
            stop: c.stop.clone(),
            tool_choice: c.tool_choice.clone(),
        }
    }
}

/// Test-only: model requests leave without settling the stream first (the
/// protection `engine/tests/durable_sends.rs` must see fail).
static SEND_UNSETTLED: AtomicBool = AtomicBool::new(false);

/// Switches off, for tests, the wait that makes a stream's records durable
/// before a model request built on them is sent.
#[doc(hidden)]
pub fn unprotected_send_unsettled(on: bool) {
    SEND_UNSETTLED.store(on, Ordering::Relaxed);
}

/// Makes what `st` left unsettled durable before a request built on it
/// leaves the process (a model call on this stream, or a subagent's first),
/// awaited without holding the worker while another committer syncs.
pub(crate) async fn settle_before_send(st: &mut Stream) -> Result<()> {
    if SEND_UNSETTLED.load(Ordering::Relaxed) {
        return Ok(());
    }
    settle(st).await
}

/// Awaits what `st` left unsettled (`Stream::settle`) without holding the
/// worker while another committer syncs the group.
async fn settle(st: &mut Stream) -> Result<()> {
    exec::durable(exec::ledger(|| st.settle())?).await?;
    Ok(())
}

/// Calls a model through the stream; appends the response to the
/// conversation. The response's record is durable when this returns.
/// `kind` is the effect kind: `model` (team members), `judge` or `optimizer`,
/// so mixed-mode replays can run one of them live.
pub async fn call_model(
    st: &mut Stream,
    kind: &str,
    backend: &Arc<dyn Backend>,
    model: &str,
    conv: &mut Conversation,
    s: &Sampling,
) -> Result<ChatResponse> {
    let resp = call_model_unsettled(st, kind, backend, model, conv, s).await?;
    settle(st).await?;
    Ok(resp)
}

/// [`call_model`] leaving the response's record unsettled
/// (`Stream::finish_unsettled`), for a caller whose next step needs no
/// durability (a workspace file tool): the next call on the stream settles
/// it before its request leaves, as does any blocking commit after it. A
/// caller that ends its stream or reports its work otherwise settles first
/// (`Stream::settle`).
pub async fn call_model_unsettled(
    st: &mut Stream,
    kind: &str,
    backend: &Arc<dyn Backend>,
    model: &str,
    conv: &mut Conversation,
    s: &Sampling,
) -> Result<ChatResponse> {
    let new: Vec<Vec<u8>> = conv.messages[conv.covered..]
        .iter()
        .map(Message::canonical)
        .collect();
    let ids: Vec<String> = new
        .iter()
        .map(|b| Id::of(ObjectKind::Blob, b).to_hex())
        .collect();
    let tools_id = conv.tools_blob.as_ref().map(|b| b.id.to_hex());
    let mut body = json!({
        "model": model,
        "params": params(s),
        "tools": tools_id,
        "prefix": conv.prefix.map(|p| p.to_hex()),
        "messages": ids,
    });
    // Recorded only when asked for: it shapes the reply.
    if let Some(rf) = &conv.response_format {
        body["response_format"] = rf.clone();
    }
    let mut req = EffectRequest::json(kind, &body);
    for b in new {
        req = req.with_blob(b);
    }
    match (&conv.tools_blob, conv.prefix) {
        // Stored with a call this conversation performed in this ledger:
        // named, not stored (and read back) again. A call served from
        // history does not count: a partial ledger may never have held the
        // blob. The event's refs are the same either way.
        (Some(t), Some(_)) if conv.tools_stored => req = req.with_link(t.id),
        (Some(t), _) => req = req.with_blob(t.bytes.clone()),
        (None, _) => {}
    }
    if let Some(p) = conv.prefix {
        req = req.with_link(p);
    }
    // The request owns the conversation while the call is in flight (a
    // conversation is sent whole on every turn: no copy of it per call) and
    // hands it back afterwards, whatever the outcome.
    conv.wire.extend(&conv.messages);
    let chat = ChatRequest {
        model: model.to_string(),
        messages: std::mem::take(&mut conv.messages),
        tools: std::mem::take(&mut conv.tools),
        temperature: s.temperature,
        seed: s.seed,
        max_tokens: s.max_tokens,
        top_p: s.top_p,
        stop: s.stop.clone(),
        tool_choice: s.tool_choice.clone(),
        response_format: conv.response_format.clone(),
        tools_json: conv.tools_blob.as_ref().and_then(|t| t.json.clone()),
        messages_json: std::mem::take(&mut conv.wire),
    };
    let attempts = attempts(st, backend, req, &chat).await;
    conv.messages = chat.messages;
    conv.tools = chat.tools;
    conv.wire = chat.messages_json;
    let rec = attempts?;
    conv.tools_stored |= rec.source == replay::Served::Live;
    let transient = rec.failure == Some(replay::FailureClass::Transient);
    let bytes = rec.output.map_err(|e| {
        if transient {
            EngineError::Infrastructure {
                what: format!("model call to {model}"),
                detail: e,
            }
        } else {
            EngineError::Backend(crate::backend::BackendError::Rejected {
                backend: model.to_string(),
                detail: e,
            })
        }
    })?;
    let resp: ChatResponse =
        serde_json::from_slice(&bytes).map_err(|e| EngineError::recording("model response", e))?;
    conv.messages.push(resp.message.clone());
    conv.prefix = Some(rec.event);
    conv.covered = conv.messages.len();
    Ok(resp)
}

/// Each attempt is its own recorded effect: a transient failure (a server
/// error, a timeout) is retried here, with backoff, up to the backend's
/// `max_retries`; a replay steps over the failed attempts the recording
/// holds and serves the one that succeeded, without waiting.
async fn attempts(
    st: &mut Stream,
    backend: &Arc<dyn Backend>,
    req: EffectRequest,
    chat: &ChatRequest,
) -> Result<replay::Recorded> {
    let mut attempt = 0u32;
    loop {
        // The request is built on the stream's records so far (the last
        // reply, the tool results since): they are durable before it
        // leaves. Settled before `begin`, which starts the call's recorded
        // latency (`effect.elapsed_us`); a replay has nothing unsettled.
        settle_before_send(st).await?;
        let (rec, hint) = match exec::ledger(|| st.begin(req.clone()))? {
            Begin::Served(r) => (r, None),
            Begin::Perform(p) => {
                let (out, hint) = perform_model_call(backend.as_ref(), chat).await;
                // Left unsettled: the caller's next step (a workspace file
                // tool, which touches only the scratch workspace resume
                // rebuilds) need not wait for it, and whatever leaves the
                // process or ends the stream next settles it. A crash
                // before then only redoes this call: model calls are not
                // journaled.
                let rec = exec::ledger(|| st.finish_unsettled(p, out))?;
                (rec, hint)
            }
        };
        let retry = rec.failure == Some(replay::FailureClass::Transient)
            && rec.source == replay::Served::Live
            && attempt < backend.max_retries();
        if !retry {
            if rec.failure.is_some() {
                // The caller reports the failure (or halts on it): every
                // attempt is durable before anyone is told.
                settle(st).await?;
            }
            return Ok(rec);
        }
        attempt += 1;
        tokio::time::sleep(backoff(attempt, hint)).await;
    }
}

/// One attempt at a model call, as the effect output to record (the parsed
/// response, its message and the raw body as blobs) and the server's
/// `Retry-After` hint when it failed.
async fn perform_model_call(
    backend: &dyn Backend,
    chat: &ChatRequest,
) -> (
    std::result::Result<EffectOutput, EffectError>,
    Option<std::time::Duration>,
) {
    let mut resp = match backend.complete(chat).await {
        Ok(r) => r,
        Err(e) => {
            let hint = match &e {
                crate::backend::BackendError::Failed { retry_after, .. } => *retry_after,
                _ => None,
            };
            return (Err(model_error(e)), hint);
        }
    };
    let raw = resp.raw.take();
    let mut blobs = vec![resp.message.canonical()];
    let mut raw_id = None;
    if let Some(raw) = raw {
        let id = Id::of(ObjectKind::Blob, &raw);
        resp.raw_body = Some(id.to_hex());
        raw_id = Some(id);
        blobs.push(raw);
    }
    let v = match serde_json::to_value(&resp) {
        Ok(v) => v,
        Err(e) => return (Err(EffectError::final_(e.to_string())), None),
    };
    let mut out = EffectOutput::json(&v);
    out.blobs = blobs;
    if let Some(id) = raw_id {
        out = out.with_link(id);
    }
    (Ok(out), None)
}

/// The sampling parameters as recorded in a model request: optional ones
/// only when set, so requests that do not use them keep their ids.
fn params(s: &Sampling) -> Value {
    let mut p = json!({"temperature": s.temperature, "seed": s.seed, "max_tokens": s.max_tokens});
    if let Some(t) = s.top_p {
        p["top_p"] = json!(t);
    }
    if !s.stop.is_empty() {
        p["stop"] = json!(s.stop);
    }
    if let Some(tc) = &s.tool_choice {
        p["tool_choice"] = json!(tc);
    }
    p
}

/// How a backend error is recorded: worth another attempt (transient) or
/// not (final: the server rejected this request, or cannot serve the model).
fn model_error(e: crate::backend::BackendError) -> EffectError {
    use crate::backend::BackendError as B;
    match e {
        B::Failed { .. } => EffectError::transient(e.to_string()),
        B::Rejected { .. } | B::UnknownModel { .. } | B::Config { .. } => {
            EffectError::final_(e.to_string())
        }
    }
}

/// The wait before retry `attempt` (1, 2, ...): the server's `Retry-After`
/// if it sent one (capped at a minute), else exponential from 250 ms, capped
/// at 20 s, with up to 25% jitter so many rollouts do not retry in step.
pub fn backoff(attempt: u32, retry_after: Option<std::time::Duration>) -> std::time::Duration {
    use std::time::Duration;
    if let Some(d) = retry_after {
        return d.min(Duration::from_secs(60));
    }
    let base = Duration::from_millis(250)
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(10))
        .min(Duration::from_secs(20));
    // Jitter needs no reproducibility: waiting never enters an id.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    base + base.mul_f64(f64::from(nanos % 1000) / 4000.0)
}

/// The output of a recorded workspace tool call.
#[derive(Debug, Clone)]
pub struct ToolOutcome {
    pub text: String,
    /// The workspace tree after the call, when the call may have changed it.
    pub tree: Option<Id>,
}

/// A tool's outcome as the effect output to record: its text and, when
/// it changed the workspace, the new tree (linked, so it is kept).
fn tool_output(
    o: std::result::Result<ToolOutcome, String>,
) -> std::result::Result<EffectOutput, EffectError> {
    let o = o.map_err(EffectError::from)?;
    let out = EffectOutput::json(&json!({"text": o.text, "tree": o.tree.map(|t| t.to_hex())}));
    Ok(match o.tree {
        Some(t) => out.with_link(t),
        None => out,
    })
}

/// Runs a workspace tool through the stream. `perform` runs it for real and
/// returns the text and, for mutating tools, the new tree. `runs_process`:
/// the tool starts a process (`bash`, checks), so it is journaled (recorded
/// as started before it runs, durably: a crash leaves a visible trace) and
/// runs off the unit's worker, for as long as the process takes; its
/// journaled start is a commit awaited before the process runs, which also
/// makes everything the stream left unsettled durable. File tools run in
/// place (they take microseconds) and their record is left unsettled
/// (`Stream::finish_unsettled`), like the model reply before it: the next
/// model call settles both with one wait, and a crash before that redoes
/// the tool call, which changes nothing but the scratch workspace that
/// resume rebuilds.
pub async fn tool_effect(
    st: &mut Stream,
    kind: &str,
    request: Value,
    runs_process: bool,
    perform: impl FnOnce() -> std::result::Result<ToolOutcome, String>,
) -> Result<ToolOutcome> {
    let req = EffectRequest::json(kind, &request);
    let rec = if runs_process {
        exec::blocking(|| match exec::ledger(|| st.begin(req.journaled()))? {
            Begin::Served(r) => Ok::<_, EngineError>(r),
            Begin::Perform(p) => {
                let out = tool_output(perform());
                Ok(exec::ledger(|| st.finish(p, out))?)
            }
        })?
    } else {
        match exec::ledger(|| st.begin(req))? {
            Begin::Served(r) => r,
            Begin::Perform(p) => {
                let out = tool_output(perform());
                exec::ledger(|| st.finish_unsettled(p, out))?
            }
        }
    };
    match rec.output {
        Ok(bytes) => {
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|e| EngineError::recording("tool output", e))?;
            let tree = match v["tree"].as_str() {
                Some(h) => Some(
                    h.parse::<Id>()
                        .map_err(|e| EngineError::recording("tool output tree", e))?,
                ),
                None => None,
            };
            Ok(ToolOutcome {
                text: v["text"].as_str().unwrap_or_default().to_string(),
                tree,
            })
        }
        Err(e) => Ok(ToolOutcome {
            text: format!("error: {e}"),
            tree: None,
        }),
    }
}
