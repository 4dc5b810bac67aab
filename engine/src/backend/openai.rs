//! The OpenAI-compatible chat-completions backend (vLLM, SGLang, llama.cpp,
//! Ollama, hosted APIs): one HTTP attempt per [`Backend::complete`] call,
//! awaited on the engine's runtime (`exec`), under a per-backend concurrency
//! limit.
//!
//! One concern per layer: this module sends a request, bounds it with a
//! timeout, and classifies what came back; the retry policy (how often, how
//! long to wait, honouring `Retry-After`) lives with the model effect
//! (`effects::call_model`), so every attempt is recorded in the ledger with
//! its failure class. Responses are parsed from untyped JSON (servers add
//! fields), and the raw body is handed back as received so it can be stored
//! beside the parsed message: fields our types do not know
//! (`reasoning_content`, vLLM's `reasoning`, logprobs) are never lost.
//!
//! The API key is read from the environment variable the experiment names
//! (`api_key_env`) when the backend is built; it is sent in the
//! `Authorization` header only and never appears in an error, a log line or a
//! `Debug` rendering of the backend.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{Backend, BackendError, ChatRequest, ChatResponse};
use crate::chat::{Message, Role, ToolCall, Usage};
use crate::config::{OpenAiParams, StructuredOutput};

/// Most bytes of an error body quoted in a message: enough to read an error
/// page's gist, never a whole HTML document.
const QUOTE_CAP: usize = 300;

/// An OpenAI-compatible server.
pub struct OpenAiBackend {
    name: String,
    params: OpenAiParams,
    api_key: Option<String>,
    url: String,
    /// `url` parsed once (`None` if it does not parse: `attempt` then hands
    /// reqwest the text, which reports it): parsing it per request was 1.5%
    /// of a recording's CPU (`benches/orchestration.rs`).
    parsed: Option<reqwest::Url>,
    client: reqwest::Client,
    /// Requests in flight at once.
    limit: Arc<tokio::sync::Semaphore>,
    /// The servers `mass` starts itself (`[backends.NAME.serve]`).
    pool: Option<Arc<super::serve::ServerPool>>,
    /// Counts each live call's prompt the trainer's way
    /// (`serve.prompt_tokens_command`).
    counter: Option<Arc<super::parity::Counter>>,
}

impl fmt::Debug for OpenAiBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("OpenAiBackend")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("model", &self.params.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl OpenAiBackend {
    /// Builds the client; reads the API key from the environment variable
    /// `params.api_key_env` names (a missing variable is an error that names
    /// the variable, never a value).
    pub fn new(name: &str, params: &OpenAiParams) -> Result<OpenAiBackend, BackendError> {
        let fail = |detail: String| BackendError::Failed {
            backend: name.to_string(),
            detail,
            retry_after: None,
        };
        let api_key = read_key(name, params)?;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(params.timeout_secs.max(1)))
            .connect_timeout(Duration::from_secs(params.timeout_secs.clamp(1, 30)))
            .build()
            .map_err(|e| fail(format!("cannot build the HTTP client: {e}")))?;
        let base = params
            .base_url_env
            .as_ref()
            .and_then(|var| std::env::var(var).ok())
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| params.base_url.clone());
        let url = format!("{}/chat/completions", base.trim().trim_end_matches('/'));
        let pool = params.serve.as_ref().map(|s| {
            Arc::new(super::serve::ServerPool::new(
                name,
                s,
                &params.model,
                api_key.clone(),
            ))
        });
        Ok(OpenAiBackend {
            name: name.to_string(),
            params: params.clone(),
            api_key,
            parsed: reqwest::Url::parse(&url).ok(),
            url,
            client,
            limit: Arc::new(tokio::sync::Semaphore::new(
                params.max_concurrency.max(1) as usize
            )),
            pool,
            counter: params
                .serve
                .as_ref()
                .and_then(|s| s.prompt_tokens_command.as_deref())
                .map(|line| {
                    // `{{`/`}}` are braces, as in the serve commands (the
                    // experiment's validation refuses placeholders).
                    let line = crate::config::expand_placeholders(line, |_| None)
                        .unwrap_or_else(|_| line.to_string());
                    let limit = Duration::from_secs(params.timeout_secs.max(1));
                    Arc::new(super::parity::Counter::new(&line, name, limit))
                }),
        })
    }

    /// The request body sent for `req`, as JSON (what `attempt` sends, as
    /// bytes).
    pub fn body(&self, req: &ChatRequest) -> Value {
        serde_json::to_value(self.wire(req)).unwrap_or(Value::Null)
    }

    /// The request body's bytes for `req`, as `attempt` writes them to a
    /// server it did not start (a started one's route may add its adapter).
    pub fn body_bytes(&self, req: &ChatRequest) -> Result<Vec<u8>, BackendError> {
        self.encode(req, &self.wire(req))
    }

    /// `wire` (made from `req`) as the body's bytes, in one allocation.
    fn encode(&self, req: &ChatRequest, wire: &WireRequest<'_>) -> Result<Vec<u8>, BackendError> {
        let mut body = Vec::with_capacity(body_estimate(req));
        serde_json::to_writer(&mut body, wire)
            .map_err(|e| self.failed(format!("cannot encode the request: {e}"), None))?;
        Ok(body)
    }

    /// The request in wire shape, borrowing from `req`: serialised straight
    /// to bytes, with no JSON tree built per call (a conversation is sent
    /// whole on every turn).
    fn wire<'a>(&self, req: &'a ChatRequest) -> WireRequest<'a> {
        let with_tools = !req.tools.is_empty();
        let tool_choice = with_tools.then(|| match req.tool_choice.as_deref() {
            None => json!("auto"),
            Some(c @ ("auto" | "none" | "required")) => json!(c),
            Some(name) => json!({"type": "function", "function": {"name": name}}),
        });
        let response_format = req.response_format.as_ref().and_then(|rf| {
            match self.params.structured_output {
                StructuredOutput::JsonSchema => Some(rf.clone()),
                StructuredOutput::JsonObject => Some(
                    json!({"type": "json_object", "schema": rf["json_schema"]["schema"].clone()}),
                ),
                StructuredOutput::Off => None,
            }
        });
        WireRequest {
            model: &req.model,
            messages: WireMessages(&req.messages, &req.messages_json),
            tools: with_tools.then(|| match &req.tools_json {
                Some(j) => WireTools::Json(&j.0),
                None => WireTools::Defs(req.tools.as_slice()),
            }),
            tool_choice,
            temperature: req.temperature,
            seed: req.seed,
            max_tokens: req.max_tokens,
            top_p: req.top_p,
            stop: (!req.stop.is_empty()).then_some(req.stop.as_slice()),
            response_format,
            lora: None,
        }
    }

    /// Sends `req` once. The route (a server `mass` started) is held
    /// until the answer is read, so that server is not restarted under it.
    async fn attempt(
        &self,
        req: &ChatRequest,
    ) -> Result<(reqwest::StatusCode, Option<Duration>, Vec<u8>), BackendError> {
        let _permit = self
            .limit
            .acquire()
            .await
            .map_err(|_| self.failed("the request limiter was closed".into(), None))?;
        let mut wire = self.wire(req);
        let (url, _route) = match &self.pool {
            Some(pool) => {
                let route = pool.route(&req.model).await?;
                wire.lora = route.lora.clone();
                (
                    Some(format!("{}/chat/completions", route.base_url)),
                    Some(route),
                )
            }
            None => (None, None),
        };
        let body = self.encode(req, &wire)?;
        let rb = match (url, &self.parsed) {
            (Some(u), _) => self.client.post(u),
            (None, Some(u)) => self.client.post(u.clone()),
            (None, None) => self.client.post(&self.url),
        };
        let mut rb = rb
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(k) = &self.api_key {
            rb = rb.bearer_auth(k);
        }
        let resp = rb
            .send()
            .await
            .map_err(|e| self.failed(describe_reqwest(&e), None))?;
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let bytes = resp.bytes().await.map_err(|e| {
            self.failed(
                format!("the response body was cut short: {}", describe_reqwest(&e)),
                None,
            )
        })?;
        Ok((status, retry_after, bytes.to_vec()))
    }

    fn failed(&self, detail: String, retry_after: Option<Duration>) -> BackendError {
        BackendError::Failed {
            backend: self.name.clone(),
            detail,
            retry_after,
        }
    }
}

impl Backend for OpenAiBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn base_model(&self) -> String {
        self.params.model.clone()
    }

    fn max_retries(&self) -> u32 {
        self.params.max_retries
    }

    fn endpoint<'a>(&'a self, model: &'a str) -> super::EndpointLookup<'a> {
        Box::pin(async move {
            let (base_url, hold) = match &self.pool {
                Some(pool) => {
                    let route = pool.external(model).await?;
                    let url = route.base_url.clone();
                    let hold: Arc<dyn std::any::Any + Send + Sync> = Arc::new(route);
                    (url, Some(hold))
                }
                None => (
                    self.url
                        .strip_suffix("/chat/completions")
                        .unwrap_or(&self.url)
                        .to_string(),
                    None,
                ),
            };
            Ok(Some(super::Endpoint {
                base_url,
                api_key: self.api_key.clone(),
                hold,
            }))
        })
    }

    fn serves_adapters(&self) -> bool {
        self.params
            .serve
            .as_ref()
            .is_some_and(|s| s.adapter_command.is_some() || s.adapter_api.is_some())
    }

    fn register_adapter_dir(&self, model: &str, dir: &std::path::Path) -> Result<(), BackendError> {
        match (&self.pool, self.serves_adapters()) {
            (Some(pool), true) => {
                pool.register(model, dir);
                Ok(())
            }
            _ => Err(BackendError::Config {
                backend: self.name.clone(),
                detail: format!(
                    "cannot serve the trained adapter {model}: set [backends.{}.serve] with an adapter_command or an adapter_api",
                    self.name
                ),
            }),
        }
    }

    fn complete<'a>(&'a self, req: &'a ChatRequest) -> super::Reply<'a> {
        Box::pin(async move {
            // What the trainer would see: the request as recorded, without
            // the routing fields `attempt` adds.
            let counted = match &self.counter {
                Some(c) => Some((
                    c.clone(),
                    serde_json::to_vec(&self.wire(req)).map_err(|e| {
                        self.failed(format!("cannot encode the request: {e}"), None)
                    })?,
                )),
                None => None,
            };
            let (status, retry_after, raw) = self.attempt(req).await?;
            let mut reply = classify(&self.name, status.as_u16(), retry_after, raw)?;
            if let Some((counter, body)) = counted {
                let model = req.model.clone();
                let m = model.clone();
                // The server's answer stands whatever the count does.
                reply.trainer_tokens = Some(
                    tokio::task::spawn_blocking(move || counter.count(&m, &body))
                        .await
                        .unwrap_or_else(|e| super::parity::TrainerTokens {
                            model,
                            prompt_tokens: None,
                            error: Some(format!("the prompt counter panicked: {e}")),
                        }),
                );
            }
            Ok(reply)
        })
    }
}

/// The API key, from the variable `api_key_env` names or the file
/// `api_key_file` names. Errors name the variable or the path, never a value.
fn read_key(name: &str, params: &OpenAiParams) -> Result<Option<String>, BackendError> {
    let config = |detail: String| BackendError::Config {
        backend: name.to_string(),
        detail,
    };
    if let Some(var) = &params.api_key_env {
        return match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => Ok(Some(v.trim().to_string())),
            _ => Err(config(format!(
                "api_key_env names {var}, which is not set in the environment; export it (the key is never written to the ledger)"
            ))),
        };
    }
    let Some(file) = &params.api_key_file else {
        return Ok(None);
    };
    let path = match (file.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => std::path::Path::new(&home).join(rest),
        _ => std::path::PathBuf::from(file),
    };
    let text = std::fs::read_to_string(&path).map_err(|e| {
        config(format!(
            "api_key_file {}: cannot read it ({}); create it with the key on one line (the key is never written to the ledger)",
            path.display(),
            e.kind()
        ))
    })?;
    match text.trim() {
        "" => Err(config(format!("api_key_file {} is empty", path.display()))),
        key => Ok(Some(key.to_string())),
    }
}

/// What a response means: a parsed message, a failure worth retrying (429,
/// 5xx, a body that is not the JSON we expect from a 200), or a rejection the
/// same request will meet again (other 4xx: context length, bad request).
pub fn classify(
    backend: &str,
    status: u16,
    retry_after: Option<Duration>,
    raw: Vec<u8>,
) -> Result<ChatResponse, BackendError> {
    let quote = || quote_body(&raw);
    if status == 429 || status == 408 || (500..600).contains(&status) {
        return Err(BackendError::Failed {
            backend: backend.into(),
            detail: format!("HTTP {status}: {}", quote()),
            retry_after,
        });
    }
    if !(200..300).contains(&status) {
        return Err(BackendError::Rejected {
            backend: backend.into(),
            detail: format!("HTTP {status}: {}", quote()),
        });
    }
    let bad = |what: String| BackendError::Failed {
        backend: backend.into(),
        detail: format!("HTTP {status} with an unusable body ({what}): {}", quote()),
        retry_after: None,
    };
    let v: Value = serde_json::from_slice(&raw).map_err(|e| bad(format!("not JSON: {e}")))?;
    let mut resp = parse_response(&v).map_err(bad)?;
    resp.raw = Some(raw);
    Ok(resp)
}

/// Parses a chat-completions response body.
pub fn parse_response(v: &Value) -> Result<ChatResponse, String> {
    if let Some(err) = v.get("error") {
        return Err(format!("the server reported an error: {}", compact(err)));
    }
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or("no choices")?;
    let m = choice
        .get("message")
        .ok_or("the first choice has no message")?;
    let content = match m.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        // Some servers send content parts; keep their text.
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
        ),
        Some(other) => {
            return Err(format!(
                "message content is {}",
                crate::tools::kind_of(other)
            ))
        }
    };
    let mut tool_calls = Vec::new();
    for (i, c) in m
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let f = c
            .get("function")
            .ok_or(format!("tool call {i} has no function"))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or(format!("tool call {i} has no function name"))?;
        // Arguments are a JSON string by the spec; some servers send an
        // object. Invalid JSON is kept as written: the harness answers the
        // model with a readable error.
        let arguments = match f.get("arguments") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        let id = c
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("call_{i}"));
        tool_calls.push(ToolCall::new(id, name, arguments));
    }
    let usage = v.get("usage").map_or(Usage::default(), |u| Usage {
        prompt_tokens: u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
        completion_tokens: u
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
    });
    Ok(ChatResponse {
        message: Message {
            role: Role::Assistant,
            content,
            tool_calls,
            tool_call_id: None,
            // DeepSeek's and llama.cpp's name, then vLLM's newer one (a
            // server that sends both sends the same text twice).
            reasoning: crate::chat::reasoning_text(m.get("reasoning_content"))
                .or_else(|| crate::chat::reasoning_text(m.get("reasoning"))),
        },
        usage,
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        raw: None,
        raw_body: None,
        trainer_tokens: None,
    })
}

/// The request's messages on the wire (see [`super::WireMessage`]): the
/// conversation's cached JSON text for each message it covers, the rest
/// serialised now.
struct WireMessages<'a>(&'a [Message], &'a super::MessagesJson);

impl serde::Serialize for WireMessages<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = ser.serialize_seq(Some(self.0.len()))?;
        for (i, m) in self.0.iter().enumerate() {
            match self.1.get(i, m) {
                Some(raw) => seq.serialize_element(raw)?,
                None => seq.serialize_element(&super::WireMessage(m))?,
            }
        }
        seq.end()
    }
}

/// A request body's size, from the strings it will carry, so the body is
/// written into one allocation: grown by doubling from empty, a long
/// conversation's body was copied about as many times as it has doublings
/// (`memmove` and `realloc` were ~5% of the engine's CPU in
/// `benches/orchestration.rs`). Escapes and small fields are covered by
/// the slack; a longer body still grows as before.
fn body_estimate(req: &ChatRequest) -> usize {
    let message = |m: &Message| {
        let calls: usize = m
            .tool_calls
            .iter()
            .map(|c| c.id.len() + c.function.name.len() + c.function.arguments.len() + 80)
            .sum();
        m.content.as_ref().map_or(0, String::len)
            + m.tool_call_id.as_ref().map_or(0, String::len)
            + calls
            + 48
    };
    let messages: usize = req.messages.iter().map(message).sum();
    let tools = req
        .tools_json
        .as_ref()
        .map_or(req.tools.len() * 512, |j| j.0.get().len());
    (messages + tools) / 8 * 9 + 512
}

/// The request's tools: the conversation's JSON text when it has one (made
/// once, not per turn), else the definitions.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum WireTools<'a> {
    Json(&'a serde_json::value::RawValue),
    Defs(&'a [crate::chat::ToolDef]),
}

/// A chat-completions request body. Optional fields are left out when unset.
#[derive(serde::Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    messages: WireMessages<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<WireTools<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    temperature: f64,
    seed: u64,
    max_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Value>,
    /// llama.cpp's per-request adapter scales (`serve.adapter_api =
    /// "llama-cpp"`): set where the request is routed, never recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    lora: Option<Value>,
}

fn quote_body(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.is_empty() {
        return "(empty body)".into();
    }
    match one_line.char_indices().nth(QUOTE_CAP) {
        Some((i, _)) => format!("{}... ({} bytes)", &one_line[..i], raw.len()),
        None => one_line,
    }
}

fn compact(v: &Value) -> String {
    quote_body(v.to_string().as_bytes())
}

/// A transport error in words, without the URL's query or any header.
fn describe_reqwest(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "the body could not be read"
    } else {
        "the request failed"
    };
    let mut detail = e.to_string();
    // reqwest names the URL; keep it (it holds no secret: the key travels in
    // a header), but drop a query string should a user put one there.
    if let Some(i) = detail.find('?') {
        detail.truncate(i);
    }
    format!("{what}: {detail}")
}
