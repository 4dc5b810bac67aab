//! One episode of the reference as a rollout: its stream
//! (`c{C}/{task}/{purpose}/{NN}/orch`) holds a `harness` effect journaling
//! the episode (prompt, `run_status.json`, `qwen_stream.jsonl`), then one
//! `effect` per exchange of its proxy log in the shape `mass proxy`
//! records (SCHEMAS.md, "Proxy (`wire`) records"), then its `mass.rollout`.
//! The rollout's `tree` is the episode's workspace as the run folder
//! holds it at import (the reference leaves it there), marked as such in
//! the rollout's metadata (`ledger::TREE_FROM`), its files scrubbed of
//! credentials as everything recorded is, those changed named
//! (`ledger::TREE_SCRUBBED`); the zero hash when the folder holds none.
//! What the reference does not record stays absent: no checks
//! (`validation` zero, 0 of 0 checks), no usage when a response carried
//! none (`"usage": null`, and the call adds nothing to the rollout's token
//! totals).

use std::collections::{BTreeMap, HashMap, HashSet};

use ledger::{Id, ObjectKind, TREE_FROM, TREE_SCRUBBED};
use schemas::{Effect, EffectStatus, Hash32, Rollout};
use serde_json::{json, Map, Value};

use proxy::log::chain_step;

use crate::error::{ImportError, Result};
use crate::objects::{id32, iso_ms, secs_ms, Objects, When, ABSENT};
use crate::plan::{Episode, Workspace};
use crate::secrets::Scrubber;

/// `ledger::WALL_MS_FROM` of a request the proxy logged no `ts_start`
/// for: its episode's `started_at` stands in.
pub const NO_TS_START: &str = "episode start (no ts_start)";

/// What the rest of the run needs of an imported episode.
#[derive(Debug, Clone)]
pub struct Imported {
    pub rollout: Id,
    pub status: &'static str,
    pub delegations: u32,
    /// When it ended (`finished_at`, or the folder's mtime without one).
    pub finished: When,
    /// Each conversation (a leaf of the request tree): its last request's
    /// full message list plus the reply, and that exchange's event.
    pub conversations: Vec<(Vec<Value>, Id)>,
}

/// A chat exchange's request, as far as the conversation goes.
struct Chat {
    messages: Vec<Value>,
    /// `prefix[k]`: the proxy's chain hash of the first k messages, so a
    /// conversation extends another when one's hash is in the other's
    /// prefixes (a lookup, where comparing message lists was quadratic).
    prefix: Vec<[u8; 32]>,
    event: Id,
    reply: Option<Value>,
}

/// Writes episode `ep` as the rollout's stream; the rollout event.
pub fn import(
    o: &mut Objects,
    s: &Scrubber,
    ep: &Episode,
    cycle: u32,
    model: &str,
) -> Result<Imported> {
    let rel = format!("c{cycle}/{}/{}/{:02}/orch", ep.task, ep.purpose, ep.index);
    let status = ep.files.status.as_ref().map(|f| s.json(&f.value));
    let logged = |key: &str| {
        status
            .as_ref()
            .and_then(|v| v.get(key)?.as_str().and_then(iso_ms))
            .map_or(When::Mtime(ep.files.mtime_ms), When::Logged)
    };
    let (started, finished) = (logged("started_at"), logged("finished_at"));
    journal(o, s, ep, &rel, status.as_ref(), started)?;
    let mut chats: Vec<Chat> = Vec::new();
    let mut requests: HashMap<[u8; 32], Id> = HashMap::new();
    let (mut prompt_tokens, mut completion_tokens) = (0u64, 0u64);
    for row in &ep.files.exchanges {
        let rec = s.json(&row.value);
        // Without its own `ts_start`, a request is known to have happened
        // during the episode, not at its start: the start stands in, marked.
        let at = secs_ms(rec.get("ts_start"))
            .map_or_else(|| started.borrowed(NO_TS_START), When::Logged);
        let (id, chat, usage) = exchange(o, &rel, &rec, &mut requests, at)?;
        if let Some(u) = usage {
            // Counts from the file: a sum past u64 is refused, never wrapped.
            let sum = prompt_tokens
                .checked_add(u.0)
                .zip(completion_tokens.checked_add(u.1));
            let Some((p, c)) = sum else {
                return Err(ImportError::Invalid {
                    file: row.file.clone(),
                    line: row.line,
                    reason: "the episode's token counts add up past 2^64".into(),
                });
            };
            (prompt_tokens, completion_tokens) = (p, c);
        }
        if let Some(mut c) = chat {
            c.event = id;
            chats.push(c);
        }
    }
    let (st, detail) = outcome(status.as_ref());
    let conversations = leaves(&chats);
    let orchestrator = conversations.first().map(|c| c.1);
    let subagents: Vec<Id> = conversations.iter().skip(1).map(|c| c.1).collect();
    let turns = chats
        .iter()
        .filter(|c| c.reply.is_some() && c.messages.first() == chats[0].messages.first())
        .count() as u32;
    let (tree, marks) = match &ep.workspace {
        Some(w) => workspace_tree(o, s, w)?,
        None => (None, BTreeMap::new()),
    };
    let workflow = o.json(&json!({"reference_prompt": s.text(ep.files.prompt.as_deref().unwrap_or_default()), "episode": s.text(&ep.name)}));
    let record = Rollout {
        task: ep.task.clone(),
        purpose: ep.purpose.into(),
        cycle,
        index: ep.index,
        workflow: id32(workflow),
        orchestrator_model: model.into(),
        subagent_model: model.into(),
        status: st.into(),
        detail: s.text(&detail),
        tree: tree.map(id32).unwrap_or(ABSENT),
        validation: ABSENT,
        score_passed: 0,
        score_total: 0,
        orchestrator: orchestrator.map(id32).unwrap_or(ABSENT),
        subagents: subagents.iter().copied().map(id32).collect(),
        delegations: subagents.len() as u32,
        turns,
        prompt_tokens,
        completion_tokens,
        report: s.text(&final_result(ep.files.stream.as_deref())),
    };
    // No checks ran on the reference's side: 0 of 0 is a placeholder.
    let missing = ["score_passed", "score_total"];
    let rollout = o.marked(&rel, &record, subagents, finished, &missing, marks)?;
    Ok(Imported {
        rollout,
        status: st,
        delegations: record.delegations,
        finished,
        conversations,
    })
}

/// `ledger::TREE_FROM` of an imported workspace: the folder as it lies
/// in the run folder when imported, not proven to be the workspace at the
/// episode's end (nothing in the folder fixes its state then).
pub const RUN_FOLDER_AT_IMPORT: &str = "run folder at import";

/// The longest `ledger::TREE_SCRUBBED` list, in bytes of JSON: an event's
/// metadata is held whole in memory by every reader and capped by the
/// ledger (16 MiB); a real workspace names a handful of files.
const MAX_SCRUBBED_LIST: usize = 1 << 20;

/// The workspace's tree with every file's bytes scrubbed (the blobs added
/// to `o`), and the rollout's marks: where the tree came from and, when a
/// file's bytes changed, which (a scrubbed file is not the folder's).
fn workspace_tree(
    o: &mut Objects,
    s: &Scrubber,
    w: &Workspace,
) -> Result<(Option<Id>, BTreeMap<String, String>)> {
    let mut scrubbed = Vec::new();
    let mut entries = Vec::with_capacity(w.snapshot.tree.entries.len());
    for e in &w.snapshot.tree.entries {
        let mut e = e.clone();
        if let Some(read) = e.blob_id() {
            let bytes = w.snapshot.contents.get(&read).ok_or_else(|| {
                ImportError::io(&format!("{}/{}", w.dir, e.path), "read but not kept")
            })?;
            let clean = s.bytes(bytes);
            if clean != *bytes {
                scrubbed.push(e.path.clone());
            }
            e.blob = o.blob(&clean).0;
            e.size = clean.len() as u64;
        }
        entries.push(e);
    }
    let tree = o.tree(&ledger::Tree::new(entries)?)?;
    let mut marks = BTreeMap::new();
    marks.insert(TREE_FROM.to_string(), RUN_FOLDER_AT_IMPORT.to_string());
    if !scrubbed.is_empty() {
        let list = serde_json::to_string(&scrubbed).map_err(|e| ledger::LedgerError::Index {
            detail: format!("cannot encode metadata: {e}"),
        })?;
        // Every changed file is named or the import is refused: a list
        // cut short would leave files marked as the folder's that are not.
        if list.len() > MAX_SCRUBBED_LIST {
            return Err(ImportError::TooLarge {
                file: w.dir.clone(),
                what: format!(
                    "the list of its {} files recorded with a credential replaced (the rollout's metadata)",
                    scrubbed.len()
                ),
                cap: MAX_SCRUBBED_LIST as u64,
            });
        }
        marks.insert(TREE_SCRUBBED.to_string(), list);
    }
    Ok((Some(tree), marks))
}

/// The episode's journal: a `harness` effect whose request names the
/// prompt and whose output holds the run status and the qwen-code trace.
fn journal(
    o: &mut Objects,
    s: &Scrubber,
    ep: &Episode,
    rel: &str,
    status: Option<&Value>,
    at: When,
) -> Result<()> {
    let prompt = ep
        .files
        .prompt
        .as_deref()
        .map(|p| o.blob(s.text(p).as_bytes()));
    let request = json!({
        "harness": "sakana-import",
        "episode": s.text(&ep.files.dir),
        "prompt": prompt.map(|p| p.to_hex()),
    });
    let trace = ep.files.stream.as_deref().map(|t| o.blob(&s.bytes(t)));
    let run_status = status.map(|v| o.json(v));
    let output = json!({
        "exit_code": status.and_then(|v| v.get("exit_code")).cloned(),
        "run_status": run_status.map(|p| p.to_hex()),
        "stream": trace.map(|p| p.to_hex()),
        "tree": null,
    });
    let req = o.json(&request);
    let out = o.json(&output);
    let links: Vec<Hash32> = [prompt, trace, run_status]
        .into_iter()
        .flatten()
        .map(id32)
        .collect();
    let e = Effect {
        effect: "harness".into(),
        request: id32(req),
        status: EffectStatus::Ok,
        output: Some(id32(out)),
        error: String::new(),
        links,
    };
    o.record(rel, &e, Vec::new(), at)?;
    Ok(())
}

/// `finished` (exit 0 and a success result), `failed` (the runner marked
/// an infrastructure failure) or `halted` (any other end), and why.
fn outcome(status: Option<&Value>) -> (&'static str, String) {
    let Some(v) = status else {
        return (
            "failed",
            "no run_status.json: the episode did not finish".into(),
        );
    };
    let ok = v.get("exit_code").and_then(Value::as_i64) == Some(0)
        && v.get("trace_has_success_result").and_then(Value::as_bool) == Some(true);
    if ok {
        return ("finished", String::new());
    }
    let f = v.get("failure").cloned().unwrap_or(Value::Null);
    let sub = f.get("subtype").and_then(Value::as_str).unwrap_or("");
    let msg = f.get("message").and_then(Value::as_str).unwrap_or("");
    let exit = v.get("exit_code").map(Value::to_string).unwrap_or_default();
    let detail = format!("{sub}: {msg} (exit code {exit})");
    if sub == "api_error_infra" {
        ("failed", detail)
    } else {
        ("halted", detail)
    }
}

/// The text of the trace's last `result` event (qwen-code's final answer).
fn final_result(stream: Option<&[u8]>) -> String {
    let Some(b) = stream else {
        return String::new();
    };
    let mut last = String::new();
    for line in b.split(|c| *c == b'\n') {
        if let Ok(v) = serde_json::from_slice::<Value>(line) {
            if v.get("type").and_then(Value::as_str) == Some("result") {
                last = v
                    .get("result")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
            }
        }
    }
    last
}

/// Conversations: chat exchanges whose messages no later exchange extends,
/// each with its reply appended, in the order their first request came
/// (the first is the orchestrator's: qwen-code's first request is its main
/// thread; the others are its subagents'). Linear in the messages: each
/// prefix is a hash looked up, never a list compared.
fn leaves(chats: &[Chat]) -> Vec<(Vec<Value>, Id)> {
    // The first exchange whose whole message list is each hash.
    let mut first: HashMap<[u8; 32], usize> = HashMap::new();
    for (i, c) in chats.iter().enumerate() {
        if let (false, Some(h)) = (c.messages.is_empty(), c.prefix.last()) {
            first.entry(*h).or_insert(i);
        }
    }
    // Strict prefixes of the exchanges after the one being looked at.
    let mut later: HashSet<[u8; 32]> = HashSet::new();
    let mut out = Vec::new();
    for (i, c) in chats.iter().enumerate().rev() {
        let n = c.messages.len();
        let extended = c.prefix.get(n).is_some_and(|h| later.contains(h));
        later.extend(c.prefix.iter().take(n).copied());
        let Some(reply) = &c.reply else { continue };
        if extended {
            continue;
        }
        let began = c
            .prefix
            .iter()
            .skip(1)
            .filter_map(|h| first.get(h).copied())
            .min()
            .unwrap_or(i);
        let mut m = c.messages.clone();
        m.push(reply.clone());
        out.push((began, i, m, c.event));
    }
    out.sort_by_key(|x| (x.0, x.1));
    out.into_iter().map(|(_, _, m, e)| (m, e)).collect()
}

/// The chain hashes of every prefix of `msgs` (the empty one first), as
/// the proxy chains a request's messages.
fn prefixes(msgs: &[Value]) -> (Vec<Vec<u8>>, Vec<[u8; 32]>) {
    let blobs: Vec<Vec<u8>> = msgs.iter().map(replay::canonical_json).collect();
    let mut hashes = vec![[0u8; 32]];
    for b in &blobs {
        let h = chain_step(
            *hashes.last().unwrap_or(&[0; 32]),
            &Id::of(ObjectKind::Blob, b),
        );
        hashes.push(h);
    }
    (blobs, hashes)
}

type Usage = Option<(u64, u64)>;

/// One proxied exchange as a wire `effect`; for a chat exchange, its
/// conversation so far and its reply, and the usage it reported.
fn exchange(
    o: &mut Objects,
    rel: &str,
    rec: &Value,
    requests: &mut HashMap<[u8; 32], Id>,
    at: When,
) -> Result<(Id, Option<Chat>, Usage)> {
    let method = rec.get("method").and_then(Value::as_str).unwrap_or("POST");
    // The proxy's rule on a recorded path: a key-like query parameter's
    // value goes whatever its length (`?key=abc1234` is shorter than any
    // learnt secret) and however its name is encoded.
    let path = rec.get("path").and_then(Value::as_str).unwrap_or("");
    let path = &*proxy::scrub::query(path, &mut proxy::scrub::Needles::new());
    let body = rec.get("request").filter(|v| v.is_object());
    let messages = body.and_then(|b| b.get("messages")?.as_array().cloned());
    let (blobs, prefix) = messages.as_deref().map(prefixes).unwrap_or_default();
    let mut links: Vec<Id> = Vec::new();
    let (request, chain) = match (&messages, body) {
        (Some(_), Some(b))
            if path
                .split('?')
                .next()
                .unwrap_or("")
                .ends_with("/chat/completions") =>
        {
            let c = (method, path, b);
            chat_request(o, c, &blobs, &prefix, requests, &mut links)
        }
        _ => {
            let raw = match (body, rec.get("request_raw").and_then(Value::as_str)) {
                (Some(b), _) => replay::canonical_json(b),
                (None, Some(t)) => t.as_bytes().to_vec(),
                (None, None) => Vec::new(),
            };
            let b = o.blob(&raw);
            links.push(b);
            (
                json!({"wire": 1, "method": method, "path": path, "body": b.to_hex()}),
                None,
            )
        }
    };
    let (status, output, error, reply, usage) = response(o, rec, messages.is_some(), &mut links);
    let req = o.json(&request);
    let e = Effect {
        effect: if messages.is_some() { "model" } else { "http" }.into(),
        request: id32(req),
        status,
        output: output.map(id32),
        error,
        links: links.iter().copied().map(id32).collect(),
    };
    let ev = schemas::to_event(&e).map_err(|x| ledger::LedgerError::Index {
        detail: format!("cannot encode effect: {x}"),
    })?;
    let mut meta = BTreeMap::new();
    if let Some(d) = rec
        .get("duration_s")
        .and_then(Value::as_f64)
        .filter(|d| d.is_finite() && *d >= 0.0)
    {
        meta.insert("wire.total_us".to_string(), ((d * 1e6) as u64).to_string());
    }
    let id = o.event(rel, ev, at, meta)?;
    if let Some(h) = chain {
        requests.insert(h, id);
    }
    let chat = messages.map(|m| Chat {
        messages: m,
        prefix,
        event: id,
        reply,
    });
    Ok((id, chat, usage))
}

/// A chat request record: the messages after the longest earlier request
/// of the stream it extends (`prefix`), each a blob.
fn chat_request(
    o: &mut Objects,
    (method, path, body): (&str, &str, &Value),
    blobs: &[Vec<u8>],
    hashes: &[[u8; 32]],
    requests: &HashMap<[u8; 32], Id>,
    links: &mut Vec<Id>,
) -> (Value, Option<[u8; 32]>) {
    let (covered, prefix) = (0..hashes.len())
        .rev()
        .find_map(|i| requests.get(&hashes[i]).map(|e| (i, Some(*e))))
        .unwrap_or((0, None));
    let mut new = Vec::new();
    for b in &blobs[covered..] {
        let id = o.blob(b);
        links.push(id);
        new.push(Value::String(id.to_hex()));
    }
    let tools = body.get("tools").filter(|t| !t.is_null()).map(|t| {
        let id = o.json(t);
        links.push(id);
        id.to_hex()
    });
    if let Some(p) = prefix {
        links.push(p);
    }
    let mut params = Map::new();
    if let Some(m) = body.as_object() {
        for (k, v) in m {
            if !matches!(k.as_str(), "messages" | "tools" | "model") {
                params.insert(k.clone(), v.clone());
            }
        }
    }
    let request = json!({
        "wire": 1, "method": method, "path": path,
        "model": body.get("model").cloned().unwrap_or(Value::Null),
        "params": params, "tools": tools,
        "prefix": prefix.map(|p| p.to_hex()), "messages": new,
    });
    (request, hashes.last().copied())
}

type Response = (EffectStatus, Option<Id>, String, Option<Value>, Usage);

/// The status, output or error of an exchange, the reassembled reply and
/// its usage (`None` when the response reported none).
fn response(o: &mut Objects, rec: &Value, chat: bool, links: &mut Vec<Id>) -> Response {
    let text = |v: Value| String::from_utf8_lossy(&replay::canonical_json(&v)).into_owned();
    if let Some(e) = rec.get("proxy_error").and_then(Value::as_str) {
        let err = text(json!({"unreachable": e, "failure": "unreachable"}));
        return (EffectStatus::Retriable, None, err, None, None);
    }
    let code = rec.get("status").and_then(Value::as_u64).unwrap_or(0);
    let headers: Vec<Value> = rec
        .get("response_headers")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| json!([k.to_ascii_lowercase(), v]))
                .collect()
        })
        .unwrap_or_default();
    let http = json!({"status": code, "headers": headers});
    let resp = rec.get("response").cloned().unwrap_or(Value::Null);
    // A streamed body is recorded as the proxy's reassembly, never its raw
    // SSE text: a key the model echoed token by token lies there in pieces
    // no learnt secret matches, while the reassembly holds it whole, so
    // scrubbed. A plain body the proxy could not parse is one text, kept.
    let raw = match rec.get("response_raw").and_then(Value::as_str) {
        Some(t) if rec.get("sse_raw").is_none() => t.as_bytes().to_vec(),
        _ => replay::canonical_json(&resp),
    };
    let raw = o.blob(&raw);
    links.push(raw);
    let fail =
        |class: &str| text(json!({"http": http, "raw_body": raw.to_hex(), "failure": class}));
    if !(200..300).contains(&code) {
        let st = if code == 429 || code >= 500 {
            EffectStatus::Retriable
        } else {
            EffectStatus::Failed
        };
        return (st, None, fail("http_status"), None, None);
    }
    if !chat {
        let out = o.json(&json!({"raw_body": raw.to_hex(), "http": http}));
        return (EffectStatus::Ok, Some(out), String::new(), None, None);
    }
    if resp.get("error").is_some_and(|e| !e.is_null()) {
        return (
            EffectStatus::Retriable,
            None,
            fail("in_band_error"),
            None,
            None,
        );
    }
    let choice = resp
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first());
    let Some(choice) = choice else {
        return (EffectStatus::Failed, None, fail("unparsable"), None, None);
    };
    let Some(finish) = choice.get("finish_reason").and_then(Value::as_str) else {
        return (
            EffectStatus::Retriable,
            None,
            fail("no_finish_reason"),
            None,
            None,
        );
    };
    let message = clean(choice.get("message").cloned().unwrap_or(Value::Null));
    let u = resp.get("usage").filter(|u| u.is_object());
    let pair = u.and_then(|u| {
        Some((
            u.get("prompt_tokens")?.as_u64()?,
            u.get("completion_tokens")?.as_u64()?,
        ))
    });
    let usage = match pair {
        Some((p, c)) => json!({"prompt_tokens": p, "completion_tokens": c}),
        None => Value::Null,
    };
    let out = json!({"message": message, "usage": usage, "finish_reason": finish, "raw_body": raw.to_hex(), "http": http});
    let out = o.json(&out);
    (
        EffectStatus::Ok,
        Some(out),
        String::new(),
        Some(message),
        pair,
    )
}

/// The reassembled message without the proxy's empty fields (`null`
/// content parts, the chunk index of tool calls).
fn clean(v: Value) -> Value {
    let Value::Object(m) = v else {
        return v;
    };
    let mut out = Map::new();
    for (k, x) in m {
        match (k.as_str(), x) {
            (_, Value::Null) | ("reasoning_details", _) => {}
            ("tool_calls", Value::Array(calls)) => {
                let calls = calls
                    .into_iter()
                    .map(|c| match c {
                        Value::Object(mut c) => {
                            c.remove("index");
                            Value::Object(c)
                        }
                        other => other,
                    })
                    .collect();
                out.insert(k, Value::Array(calls));
            }
            (_, x) => {
                out.insert(k, x);
            }
        }
    }
    Value::Object(out)
}
