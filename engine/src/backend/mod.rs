//! Model backends behind one trait. A backend turns a chat request (messages,
//! tools, sampling parameters) into an assistant message; the engine never
//! calls one directly, only through a `model` effect, so every call is
//! recorded and replayable.

pub mod checkouts;
pub mod openai;
pub mod parity;
pub mod serve;
pub mod sim;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use crate::chat::{Message, ToolDef, Usage};
use crate::config::Backend as BackendCfg;
use ledger::Id;

/// What is sent to a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    pub temperature: f64,
    pub seed: u64,
    pub max_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// `auto`, `none`, `required` or a tool name to force (see
    /// `SamplingConfig::tool_choice`); sent only with tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<String>,
    /// A JSON schema the reply must follow (`response_format` of type
    /// `json_schema`), for replies the engine parses: verdicts. Servers that
    /// honour it constrain decoding; the text is parsed either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<serde_json::Value>,
    /// `tools` as JSON text, made once for a conversation
    /// (`effects::Conversation`) so a backend that sends tools as JSON can
    /// copy it instead of serialising every definition on every turn. Not
    /// part of the request's value: never recorded, never compared.
    #[serde(skip)]
    pub tools_json: Option<ToolsJson>,
    /// `messages` as JSON text, cached by the conversation
    /// ([`MessagesJson`]); empty when the caller has none.
    #[serde(skip)]
    pub messages_json: MessagesJson,
}

/// Tool definitions already serialised (a JSON array equal in value to the
/// request's `tools`). Equal to any other: it only caches `tools`.
#[derive(Debug, Clone)]
pub struct ToolsJson(pub std::sync::Arc<serde_json::value::RawValue>);

impl ToolsJson {
    /// From the tools' canonical JSON (the blob a model request names);
    /// `None` if it is not UTF-8 JSON, when a backend serialises the
    /// definitions instead.
    pub fn from_json(bytes: &[u8]) -> Option<ToolsJson> {
        let text = String::from_utf8(bytes.to_vec()).ok()?;
        let raw = serde_json::value::RawValue::from_string(text).ok()?;
        Some(ToolsJson(std::sync::Arc::from(raw)))
    }
}

impl PartialEq for ToolsJson {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// A message in the OpenAI chat wire shape: role, content, tool_calls and tool_call_id
/// when present. An assistant turn that only calls tools is sent with empty
/// content, not null: OpenAI and vLLM accept both, but servers that render
/// the conversation through the model's chat template fail on null
/// (measured: llama-cpp-python 0.3.36 answers HTTP 500). What is recorded is
/// the message as the model sent it.
///
/// An earlier turn's reasoning (`Message::reasoning`) is never sent back,
/// deliberately: the chat templates of the reasoning models these servers
/// run (Qwen3, DeepSeek-R1 and their distills) drop the reasoning of earlier
/// turns anyway; DeepSeek's API answers HTTP 400 to a request whose
/// messages carry `reasoning_content`; vLLM reads `reasoning` and newer
/// releases ignore `reasoning_content`, so no one name would do; and every
/// request stays byte for byte what the driver sent before reasoning was
/// kept, so recorded runs replay and a server that returns reasoning sees
/// the conversation it saw before. The recorded conversation keeps it (the
/// message blobs), for transcripts and training. Models that want their
/// reasoning back between tool calls (interleaved thinking) get none.
pub struct WireMessage<'a>(pub &'a Message);

impl Serialize for WireMessage<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let m = self.0;
        let mut map = ser.serialize_map(None)?;
        map.serialize_entry("role", &m.role)?;
        match (&m.content, m.tool_calls.is_empty()) {
            (None, false) => map.serialize_entry("content", "")?,
            (c, _) => map.serialize_entry("content", c)?,
        }
        if !m.tool_calls.is_empty() {
            map.serialize_entry("tool_calls", &m.tool_calls)?;
        }
        if let Some(id) = &m.tool_call_id {
            map.serialize_entry("tool_call_id", id)?;
        }
        map.end()
    }
}

/// A conversation's messages as [`WireMessage`] JSON text, one per
/// message, made once for a conversation (`effects::Conversation`) and
/// extended as it grows: a backend that sends messages as JSON copies them
/// instead of serialising the whole conversation again on every turn
/// (`serde_json`'s string escaping was 7% of the engine's CPU in
/// `benches/orchestration.rs`). Each entry keeps the message it was made
/// from and stands in only for an equal message at its position (a
/// comparison of bytes, far cheaper than escaping them again), so a
/// request whose messages are not the ones it was made from (edited,
/// replaced, reordered) is serialised from its messages. Not part of the
/// request's value: never recorded, never compared.
#[derive(Debug, Clone, Default)]
pub struct MessagesJson(Vec<(Message, Box<serde_json::value::RawValue>)>);

impl MessagesJson {
    /// Covers every message of `messages`: those past the entries made so
    /// far are serialised now. From the first entry that no longer equals
    /// its message (a conversation that was not only appended to), the
    /// cache starts again.
    pub fn extend(&mut self, messages: &[Message]) {
        let kept = self
            .0
            .iter()
            .zip(messages)
            .take_while(|((made_from, _), m)| made_from == *m)
            .count();
        self.0.truncate(kept);
        for m in &messages[kept..] {
            match serde_json::value::to_raw_value(&WireMessage(m)) {
                Ok(raw) => self.0.push((m.clone(), raw)),
                Err(_) => break,
            }
        }
    }

    /// The JSON text of message `i`, if the cache holds one made from a
    /// message equal to `m`.
    pub fn get(&self, i: usize, m: &Message) -> Option<&serde_json::value::RawValue> {
        self.0
            .get(i)
            .filter(|(made_from, _)| made_from == m)
            .map(|(_, raw)| raw.as_ref())
    }
}

impl PartialEq for MessagesJson {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// What a model returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    pub message: Message,
    pub usage: Usage,
    pub finish_reason: String,
    /// The response body exactly as received from a server (not recorded
    /// inline: the model effect stores it as a blob and names it in
    /// `raw_body`).
    #[serde(skip)]
    pub raw: Option<Vec<u8>>,
    /// The blob id of the raw response body, for servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_body: Option<String>,
    /// The trainer's count of this call's prompt, beside the server's in
    /// `usage.prompt_tokens` (template parity, `backend::parity`); only
    /// for live calls to a backend with a `prompt_tokens_command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer_tokens: Option<parity::TrainerTokens>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Worth another attempt: a connection error, a timeout, HTTP 429 or
    /// 5xx, a cut or unparseable body. `retry_after`: the server's hint.
    #[error("backend {backend}: {detail}")]
    Failed {
        backend: String,
        detail: String,
        retry_after: Option<std::time::Duration>,
    },
    /// The server refused this request and will refuse it again (HTTP 4xx:
    /// context length exceeded, a malformed request).
    #[error("backend {backend} rejected the request: {detail}")]
    Rejected { backend: String, detail: String },
    /// The backend cannot be built as configured (a missing API key variable).
    #[error("backend {backend}: {detail}")]
    Config { backend: String, detail: String },
    #[error("backend {backend} does not know model {model:?}")]
    UnknownModel { backend: String, model: String },
}

/// A chat completion in flight.
pub type Reply<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<ChatResponse, BackendError>> + Send + 'a>,
>;

/// Where a client outside `mass` reaches a model: an OpenAI base URL
/// (`.../v1`) and the API key to send, if any.
#[derive(Clone)]
pub struct Endpoint {
    pub base_url: String,
    pub api_key: Option<String>,
    /// While held, a server `mass` started for it is not restarted (for
    /// another adapter); hold the endpoint as long as its URL is used.
    pub hold: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Endpoint")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// An endpoint being looked up (a server `mass` starts may be starting).
pub type EndpointLookup<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<Endpoint>, BackendError>> + Send + 'a>,
>;

/// A model server (or the built-in simulation).
pub trait Backend: Send + Sync {
    /// The configured backend name (as in the experiment file).
    fn name(&self) -> &str;
    /// The model name to send for the base (untrained) model.
    fn base_model(&self) -> String;
    /// One chat completion: one attempt (the model effect retries). Awaited
    /// by a unit of work (see `exec`): a server call waits without holding
    /// a thread.
    fn complete<'a>(&'a self, req: &'a ChatRequest) -> Reply<'a>;
    /// The HTTP endpoint serving `model`, for an external harness whose
    /// traffic the proxy forwards there; `None`: the backend has none (the
    /// simulation).
    fn endpoint<'a>(&'a self, _model: &'a str) -> EndpointLookup<'a> {
        Box::pin(async { Ok(None) })
    }
    /// How often the model effect retries a transient failure in-process
    /// before the run stops as an infrastructure failure.
    fn max_retries(&self) -> u32 {
        0
    }
    /// Makes a trained adapter available under `model` (its bytes are what the
    /// trainer produced). Backends that load adapters server-side ignore this.
    fn register_adapter(&self, _model: &str, _adapter: &[u8]) -> Result<(), BackendError> {
        Ok(())
    }
    /// Whether trained adapter files (a checkpoint directory) can be served
    /// under a model name of their own (`[backends.NAME.serve]` with an
    /// `adapter_command`).
    fn serves_adapters(&self) -> bool {
        false
    }
    /// Makes the adapter files in `dir` servable under `model`.
    fn register_adapter_dir(&self, model: &str, _dir: &Path) -> Result<(), BackendError> {
        Err(BackendError::Config {
            backend: self.name().to_string(),
            detail: format!(
                "cannot serve adapter files (model {model}): set serve.adapter_command"
            ),
        })
    }
    /// The trainable state of `model` as the built-in trainer reads it (the
    /// simulated backend's parameters); `None` for servers, whose weights live
    /// with an external trainer.
    fn export_model(&self, _model: &str) -> Option<Vec<u8>> {
        None
    }
}

/// The backends of an experiment, by name, built from its `[backends.*]`
/// tables, and the adapters trained so far.
///
/// A fork may change a backend's parameters or add a backend after a run has
/// started (`--set backends.policy.skill=0.5`, `mass rejudge --judge
/// FILE.toml`); `sync` rebuilds exactly the backends whose definition changed
/// and registers on them again every adapter trained on them, so the change is
/// honoured from the fork point and trained models stay available.
/// A trained adapter as a backend takes it: the parameters the built-in
/// simulation loads, or a directory of adapter files a server loads.
#[derive(Clone, Debug)]
pub enum Adapter {
    Params(Arc<[u8]>),
    /// Adapter files checked out at `dir`, from ledger tree `tree`.
    Dir {
        dir: PathBuf,
        tree: Id,
    },
}

#[derive(Clone)]
pub struct Backends {
    inner: Arc<RwLock<Built>>,
}

struct Built {
    config: BTreeMap<String, BackendCfg>,
    by_name: BTreeMap<String, Arc<dyn Backend>>,
    /// (backend, model name, adapter), in the order trained.
    adapters: Vec<(String, String, Adapter)>,
    /// Per backend, the base models it had before a rebuild changed them.
    former_bases: BTreeMap<String, Vec<String>>,
    tasks: PathBuf,
    /// Adapter files checked out for the servers; removed with the last
    /// clone of these backends.
    checkouts: Arc<checkouts::Checkouts>,
}

impl Backends {
    /// Builds every backend `config` defines; simulated models know the tasks
    /// under `tasks` (a run's checkout of its recorded suite).
    pub fn build(
        config: &BTreeMap<String, BackendCfg>,
        tasks: &Path,
    ) -> Result<Backends, BackendError> {
        let mut by_name = BTreeMap::new();
        for (name, cfg) in config {
            by_name.insert(name.clone(), build_at(name, cfg, tasks)?);
        }
        Ok(Backends {
            inner: Arc::new(RwLock::new(Built {
                config: config.clone(),
                by_name,
                adapters: Vec::new(),
                former_bases: BTreeMap::new(),
                tasks: tasks.to_path_buf(),
                checkouts: Arc::default(),
            })),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Built> {
        // A panic while holding the lock leaves plain data behind; the map
        // itself is always whole, so a poisoned lock is still readable.
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Built> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, name: &str) -> Result<Arc<dyn Backend>, BackendError> {
        self.read()
            .by_name
            .get(name)
            .cloned()
            .ok_or_else(|| BackendError::Config {
                backend: name.to_string(),
                detail: "not configured".into(),
            })
    }

    /// Registers a trained adapter on backend `backend` and remembers it, so
    /// a rebuilt backend gets it again.
    pub fn register_adapter(
        &self,
        backend: &str,
        model: &str,
        adapter: &[u8],
    ) -> Result<(), BackendError> {
        self.get(backend)?.register_adapter(model, adapter)?;
        self.write().adapters.push((
            backend.to_string(),
            model.to_string(),
            Adapter::Params(Arc::from(adapter)),
        ));
        Ok(())
    }

    /// Registers trained adapter files (directory `dir`, checked out of
    /// ledger tree `tree`) on backend `backend` under `model`, and remembers
    /// them for a rebuilt backend.
    pub fn register_adapter_dir(
        &self,
        backend: &str,
        model: &str,
        dir: &Path,
        tree: Id,
    ) -> Result<(), BackendError> {
        self.get(backend)?.register_adapter_dir(model, dir)?;
        self.write().adapters.push((
            backend.to_string(),
            model.to_string(),
            Adapter::Dir {
                dir: dir.to_path_buf(),
                tree,
            },
        ));
        Ok(())
    }

    /// The adapter files of ledger tree `id`, checked out for these
    /// backends' servers (`backend::checkouts`: removed when the last clone
    /// of these backends is dropped).
    pub fn checkout_adapter(
        &self,
        l: &ledger::Ledger,
        id: &Id,
    ) -> crate::error::Result<std::path::PathBuf> {
        // Not under the lock: a checkout may take a while.
        let c = self.read().checkouts.clone();
        c.checkout(l, id)
    }

    /// Where these backends' adapter checkouts are, once one was made.
    pub fn checkouts_dir(&self) -> Option<PathBuf> {
        self.read().checkouts.root_if_made().map(Path::to_path_buf)
    }

    /// The backends' definitions as built now (after any `sync`).
    pub fn config(&self) -> BTreeMap<String, BackendCfg> {
        self.read().config.clone()
    }

    /// Every trained adapter registered so far, in the order trained:
    /// (backend, model, adapter). What another process needs to serve the
    /// same models (a worker).
    pub fn adapters(&self) -> Vec<(String, String, Adapter)> {
        self.read().adapters.clone()
    }

    /// The directory of trained model `model`'s adapter files on backend
    /// `backend`, if it is one registered with `register_adapter_dir`.
    pub fn adapter_dir(&self, backend: &str, model: &str) -> Option<PathBuf> {
        self.read()
            .adapters
            .iter()
            .rev()
            .find_map(|(on, m, a)| match a {
                Adapter::Dir { dir, .. } if on == backend && m == model => Some(dir.clone()),
                _ => None,
            })
    }

    /// Brings the built backends in line with `config`: every backend whose
    /// definition is new or changed is built again, with the adapters trained
    /// on it registered again. Returns whether anything was rebuilt.
    pub fn sync(&self, config: &BTreeMap<String, BackendCfg>) -> Result<bool, BackendError> {
        if self.read().config == *config {
            return Ok(false);
        }
        let mut b = self.write();
        for (name, cfg) in config {
            if b.config.get(name) == Some(cfg) {
                continue;
            }
            let fresh = build_at(name, cfg, &b.tasks)?;
            for (_, model, adapter) in b.adapters.iter().filter(|(on, _, _)| on == name) {
                match adapter {
                    Adapter::Params(bytes) => fresh.register_adapter(model, bytes)?,
                    Adapter::Dir { dir, .. } => fresh.register_adapter_dir(model, dir)?,
                }
            }
            if let Some(old) = b.by_name.insert(name.clone(), fresh) {
                let old_base = old.base_model();
                b.former_bases
                    .entry(name.clone())
                    .or_default()
                    .push(old_base);
            }
        }
        b.config = config.clone();
        Ok(true)
    }

    /// The model a role on `backend` plays now, given the one it played: a
    /// former base model of a rebuilt backend becomes its current base model
    /// (a trained adapter's name stays as it is).
    pub fn current_model(&self, backend: &str, model: &str) -> String {
        let b = self.read();
        let former = b
            .former_bases
            .get(backend)
            .is_some_and(|f| f.iter().any(|m| m == model));
        match (former, b.by_name.get(backend)) {
            (true, Some(now)) => now.base_model(),
            _ => model.to_string(),
        }
    }
}

/// Builds one backend; simulated models know the tasks under `tasks`.
fn build_at(name: &str, cfg: &BackendCfg, tasks: &Path) -> Result<Arc<dyn Backend>, BackendError> {
    Ok(match cfg {
        BackendCfg::Sim(p) => {
            let params = sim::SimParams {
                tampering: p.tampering,
                ..sim::SimParams::new(
                    p.skill,
                    p.delegation,
                    p.judge_noise,
                    p.position_bias,
                    p.blind_spot,
                )
            };
            Arc::new(sim::SimBackend::new(name, params, tasks)?)
        }
        BackendCfg::OpenAi(p) => Arc::new(openai::OpenAiBackend::new(name, p)?),
    })
}

/// A rough token count for the simulated backend's usage figures (4 bytes a token).
pub fn rough_tokens(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| {
            let args: usize = m
                .tool_calls
                .iter()
                .map(|c| c.function.arguments.len() + c.function.name.len())
                .sum();
            ((m.content_str().len() + args) as u64).div_ceil(4) + 4
        })
        .sum()
}
