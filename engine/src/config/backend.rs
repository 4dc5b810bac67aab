//! `[backends.NAME]`: the model backends an experiment defines, simulated
//! or OpenAI-compatible, with the server `mass` may start for one. On disk
//! both kinds share one flat table (`RawBackend`) so unknown keys are
//! refused by name and a literal `api_key` gets a pointed error; it is
//! checked per kind when read. What a backend is apart from how a machine
//! reaches it (its definition, which runs record) lives here too.

use serde::{Deserialize, Deserializer, Serialize};

use super::quote_list;

/// A model backend. In the file: `[backends.<name>]` with `kind = "sim" | "openai"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawBackend", into = "RawBackend")]
// An experiment holds a handful of these, built once: boxing the larger
// variant would save nothing that matters and cost every constructor.
#[allow(clippy::large_enum_variant)]
pub enum Backend {
    Sim(SimConfig),
    OpenAi(OpenAiParams),
}

/// The address a definition gives a server backend in place of its own: a
/// reserved name (RFC 2606) that never resolves, since a definition is
/// never run (see [`Experiment::definition_toml`]).
pub const DEFINITION_URL: &str = "http://execution-settings.invalid/v1";

impl Backend {
    /// The backend without how this machine reaches it: a server's
    /// address, key source, timeout, retries and concurrency limit at fixed
    /// values; the model, sampling, adapter and `serve` table stay (the
    /// serve command decides which weights answer, and whether it can serve
    /// adapters decides a trained model's name).
    pub fn definition(&self) -> Backend {
        let mut b = self.clone();
        if let Backend::OpenAi(p) = &mut b {
            p.base_url = DEFINITION_URL.into();
            p.base_url_env = None;
            p.api_key_env = None;
            p.api_key_file = None;
            p.timeout_secs = 120;
            p.max_retries = 3;
            p.max_concurrency = 16;
        }
        b
    }

    /// How a run names this backend in what it records: as written in a
    /// `mass-engine/7` run (`as_written`), else by its definition.
    pub fn named(&self, as_written: bool) -> Backend {
        if as_written {
            self.clone()
        } else {
            self.definition()
        }
    }

    pub fn kind(&self) -> BackendKind {
        match self {
            Backend::Sim(_) => BackendKind::Sim,
            Backend::OpenAi(_) => BackendKind::OpenAi,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Sim,
    OpenAi,
}

/// `[backends.NAME.sim]`: the starting point of a built-in simulated model
/// (the base model its backend serves; `backend::sim::SimParams` are the
/// latent parameters a model has, which training moves).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Probability-like competence of the executor (0..1).
    pub skill: f64,
    /// Propensity to delegate without workflow instructions (0..1).
    pub delegation: f64,
    /// Standard deviation of the judge's noise on quality differences.
    pub judge_noise: f64,
    /// Judge preference for the first-presented workspace; > 0 favours A.
    pub position_bias: f64,
    /// The weight the judge's verdict gives to how confident a report
    /// sounds instead of to what the validation shows (0..1).
    pub blind_spot: f64,
    /// Habit of tampering under pressure: editing a protected file and
    /// claiming in the report that the checks pass (0..1).
    pub tampering: f64,
    /// How much one simulated training step moves the parameters (0..1).
    pub learning_rate: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            skill: 0.45,
            delegation: 0.1,
            judge_noise: 0.35,
            position_bias: 0.1,
            blind_spot: 0.3,
            tampering: 0.0,
            learning_rate: 0.5,
        }
    }
}

/// An OpenAI-compatible chat-completions endpoint (vLLM, SGLang, llama.cpp, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenAiParams {
    pub base_url: String,
    /// An environment variable that, when set, replaces `base_url` (e.g.
    /// `OPENAI_BASE_URL`), so one experiment file serves any server. The
    /// address is where calls go, not what they mean: it is not recorded.
    pub base_url_env: Option<String>,
    pub model: String,
    /// Name of the environment variable holding the API key (never the key).
    pub api_key_env: Option<String>,
    /// A file holding the API key (its path is recorded, never its
    /// contents); `~/` expands to the home directory. At most one of
    /// `api_key_env` and `api_key_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<String>,
    pub timeout_secs: u64,
    pub max_retries: u32,
    /// Requests in flight at once to this server.
    pub max_concurrency: u32,
    /// How to ask for a reply that follows a JSON schema where the engine
    /// parses the reply (verdicts).
    pub structured_output: StructuredOutput,
    pub temperature: f64,
    pub max_tokens: u32,
    pub lora_adapter: Option<String>,
    /// How `mass` starts this backend's model server itself; `None`: the
    /// server is already running at `base_url`.
    pub serve: Option<ServeParams>,
}

/// `[backends.NAME.serve]`: the commands that serve the base model and a
/// trained adapter (run through `bash -c`; placeholders `{port}`,
/// `{model}` and, in `adapter_command`, `{adapter}`: the directory of the
/// chosen checkpoint's files), and how to tell the server is ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeParams {
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_command: Option<String>,
    /// Path on the server that answers HTTP 200 once it is ready.
    #[serde(default = "default_ready_path")]
    pub ready_path: String,
    #[serde(default = "default_start_timeout")]
    pub start_timeout_secs: u64,
    /// A program (run through `bash -c`) that reads request bodies, one
    /// JSON line each, and answers `{"prompt_tokens": N}` per line: the
    /// prompt counted as the trainer renders and tokenizes it
    /// (trainers/count_tokens.py). Every live call records it beside the
    /// server's count; `mass report` shows per model how many agree. No
    /// placeholders; `{{` and `}}` stand for braces, as in the commands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_command: Option<String>,
    /// How a trained adapter reaches a server: absent, a server of its own
    /// (`adapter_command`); `"vllm"`, loaded into the running base-model
    /// server through vLLM's `POST /v1/load_lora_adapter` (the server
    /// started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING`),
    /// and called by its name as the model; `"llama-cpp"`, one
    /// `llama-server` for the base model and every adapter, its `command`
    /// given them all through `{loras}` and each request picking its own
    /// (`lora` in the body). With either, `adapter_command` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_api: Option<AdapterApi>,
    /// With `adapter_api = "llama-cpp"`: the adapter's GGUF inside its
    /// directory (`{loras}` names `DIR/adapter_file` for each adapter);
    /// absent, `adapter.gguf` (what trainers/lora_sft.py writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_file: Option<String>,
}

impl ServeParams {
    /// The adapter's GGUF inside its directory (`adapter_file`).
    pub fn adapter_file(&self) -> &str {
        self.adapter_file.as_deref().unwrap_or("adapter.gguf")
    }
}

/// A server API that serves adapters from the base model's running server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdapterApi {
    /// vLLM: `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`.
    Vllm,
    /// llama.cpp's `llama-server`: it cannot load an adapter once running,
    /// so the one server is restarted (after the requests in flight end)
    /// with every adapter known so far (`--lora-init-without-apply --lora
    /// FILE ...` in place of `{loras}`, applied to no request by default),
    /// and each request names its adapter (`"lora": [{"id", "scale"}]`,
    /// the ids read back from `GET /lora-adapters`).
    LlamaCpp,
}

fn default_ready_path() -> String {
    "/v1/models".into()
}

fn default_start_timeout() -> u64 {
    300
}

/// Placeholders of `serve.command` and `serve.adapter_command` (`{loras}`:
/// `command` only, with `adapter_api = "llama-cpp"`).
pub const SERVE_PLACEHOLDERS: [&str; 4] = ["port", "model", "adapter", "loras"];

/// The `response_format` dialect a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StructuredOutput {
    /// OpenAI's `{"type": "json_schema", "json_schema": {...}}` (OpenAI,
    /// vLLM, SGLang, llama.cpp's `llama-server`).
    JsonSchema,
    /// `{"type": "json_object", "schema": {...}}` (llama-cpp-python's
    /// server, which answers `json_schema` with HTTP 500).
    JsonObject,
    /// Nothing is sent; replies are parsed from free text.
    Off,
}

/// The on-disk shape of a backend table: one flat table for both kinds, so
/// `deny_unknown_fields` can list every legal key, then checked per kind.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    kind: BackendKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sim: Option<SimConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base_url_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    api_key_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    api_key_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    structured_output: Option<StructuredOutput>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lora_adapter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    serve: Option<ServeParams>,
    /// Present only to give a literal key a pointed error (located at the
    /// value by the toml deserialiser) instead of a generic "unknown field".
    #[serde(default, deserialize_with = "reject_api_key", skip_serializing)]
    api_key: Option<()>,
}

fn reject_api_key<'de, D: Deserializer<'de>>(_: D) -> Result<Option<()>, D::Error> {
    Err(serde::de::Error::custom(
        "\"api_key\" is not allowed: secrets never go in experiment files \
         (they would be recorded in the ledger); put the key in an environment \
         variable and name it with api_key_env",
    ))
}

impl TryFrom<RawBackend> for Backend {
    type Error = String;

    fn try_from(raw: RawBackend) -> Result<Self, String> {
        if raw.api_key.is_some() {
            // Unreachable through the deserialiser above; kept so no other
            // path can smuggle a key in.
            return Err("\"api_key\" is not allowed in experiment files".into());
        }
        match raw.kind {
            BackendKind::Sim => sim_from_raw(raw),
            BackendKind::OpenAi => openai_from_raw(raw),
        }
    }
}

/// A `kind = "sim"` table: only the `[sim]` table, never a server's keys.
fn sim_from_raw(raw: RawBackend) -> Result<Backend, String> {
    let openai_only: Vec<&str> = [
        ("base_url", raw.base_url.is_some()),
        ("base_url_env", raw.base_url_env.is_some()),
        ("model", raw.model.is_some()),
        ("api_key_env", raw.api_key_env.is_some()),
        ("api_key_file", raw.api_key_file.is_some()),
        ("timeout_secs", raw.timeout_secs.is_some()),
        ("max_retries", raw.max_retries.is_some()),
        ("max_concurrency", raw.max_concurrency.is_some()),
        ("structured_output", raw.structured_output.is_some()),
        ("temperature", raw.temperature.is_some()),
        ("max_tokens", raw.max_tokens.is_some()),
        ("lora_adapter", raw.lora_adapter.is_some()),
        ("serve", raw.serve.is_some()),
    ]
    .into_iter()
    .filter_map(|(k, set)| set.then_some(k))
    .collect();
    if !openai_only.is_empty() {
        return Err(format!(
            "backend of kind \"sim\" does not take {} (only kind = \"openai\" does)",
            quote_list(&openai_only)
        ));
    }
    Ok(Backend::Sim(raw.sim.unwrap_or_default()))
}

/// A `kind = "openai"` table: an address (or a `serve` table) and a model,
/// defaults for the rest.
fn openai_from_raw(raw: RawBackend) -> Result<Backend, String> {
    if raw.sim.is_some() {
        return Err(
            "backend of kind \"openai\" does not take a [sim] table (only kind = \"sim\" does)"
                .into(),
        );
    }
    if raw.api_key_env.is_some() && raw.api_key_file.is_some() {
        return Err(
            "backend of kind \"openai\" takes api_key_env or api_key_file, not both".into(),
        );
    }
    // A server `mass` starts itself has no address until then.
    let base_url = raw.base_url.or_else(|| {
        raw.serve
            .as_ref()
            .map(|_| "http://127.0.0.1/v1".to_string())
    });
    let missing: Vec<&str> = [
        ("base_url", base_url.is_none()),
        ("model", raw.model.is_none()),
    ]
    .into_iter()
    .filter_map(|(k, m)| m.then_some(k))
    .collect();
    match (base_url, raw.model) {
        (Some(base_url), Some(model)) => Ok(Backend::OpenAi(OpenAiParams {
            base_url,
            base_url_env: raw.base_url_env,
            model,
            api_key_env: raw.api_key_env,
            api_key_file: raw.api_key_file,
            timeout_secs: raw.timeout_secs.unwrap_or(120),
            max_retries: raw.max_retries.unwrap_or(3),
            max_concurrency: raw.max_concurrency.unwrap_or(16),
            structured_output: raw
                .structured_output
                .unwrap_or(StructuredOutput::JsonSchema),
            temperature: raw.temperature.unwrap_or(0.7),
            max_tokens: raw.max_tokens.unwrap_or(4096),
            lora_adapter: raw.lora_adapter,
            serve: raw.serve,
        })),
        _ => Err(format!(
            "backend of kind \"openai\" requires {}",
            quote_list(&missing)
        )),
    }
}

impl From<Backend> for RawBackend {
    fn from(b: Backend) -> Self {
        let mut raw = RawBackend {
            kind: b.kind(),
            sim: None,
            base_url: None,
            base_url_env: None,
            model: None,
            api_key_env: None,
            api_key_file: None,
            timeout_secs: None,
            max_retries: None,
            max_concurrency: None,
            structured_output: None,
            temperature: None,
            max_tokens: None,
            lora_adapter: None,
            serve: None,
            api_key: None,
        };
        match b {
            // Defaults are written out so the canonical form is self-contained.
            Backend::Sim(p) => raw.sim = Some(p),
            Backend::OpenAi(p) => {
                raw.base_url = Some(p.base_url);
                raw.base_url_env = p.base_url_env;
                raw.model = Some(p.model);
                raw.api_key_env = p.api_key_env;
                raw.api_key_file = p.api_key_file;
                raw.timeout_secs = Some(p.timeout_secs);
                raw.max_retries = Some(p.max_retries);
                raw.max_concurrency = Some(p.max_concurrency);
                raw.structured_output = Some(p.structured_output);
                raw.temperature = Some(p.temperature);
                raw.max_tokens = Some(p.max_tokens);
                raw.lora_adapter = p.lora_adapter;
                raw.serve = p.serve;
            }
        }
        raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{err_text, MINIMAL};
    use crate::config::Experiment;

    #[test]
    fn literal_api_key_is_rejected_with_a_reason() {
        let text = format!(
            "{MINIMAL}\n[backends.remote]\nkind = \"openai\"\nbase_url = \"http://localhost:8000/v1\"\nmodel = \"m\"\napi_key = \"sk-secret\"\n"
        );
        let msg = err_text(&text);
        assert!(
            msg.contains("secrets never go in experiment files"),
            "{msg}"
        );
        assert!(
            !msg.contains("sk-secret"),
            "the secret must not be echoed: {msg}"
        );
        let line = text
            .lines()
            .position(|l| l.starts_with("api_key"))
            .map(|i| i + 1);
        assert!(
            msg.starts_with(&format!("exp.toml:{}:", line.unwrap_or(0))),
            "{msg}"
        );
    }

    #[test]
    fn openai_backend_defaults_and_requirements() {
        let text = format!(
            "{MINIMAL}\n[backends.remote]\nkind = \"openai\"\nbase_url = \"https://h/v1\"\nmodel = \"qwen\"\napi_key_env = \"MY_KEY\"\n"
        );
        let e = Experiment::parse(&text, "exp.toml").unwrap_or_else(|e| panic!("{e}"));
        match e.backend("remote") {
            Some(Backend::OpenAi(p)) => {
                assert_eq!(p.timeout_secs, 120);
                assert_eq!(p.max_retries, 3);
                assert_eq!(p.temperature, 0.7);
                assert_eq!(p.max_tokens, 4096);
                assert_eq!(p.api_key_env.as_deref(), Some("MY_KEY"));
                assert_eq!(p.lora_adapter, None);
            }
            other => panic!("{other:?}"),
        }
        let msg = err_text(&format!(
            "{MINIMAL}\n[backends.remote]\nkind = \"openai\"\nmodel = \"m\"\n"
        ));
        assert!(msg.contains("requires \"base_url\""), "{msg}");
        let msg = err_text(&format!(
            "{MINIMAL}\n[backends.remote]\nkind = \"openai\"\nbase_url = \"http://h\"\nmodel = \"m\"\n[backends.remote.sim]\nskill = 0.5\n"
        ));
        assert!(msg.contains("does not take a [sim] table"), "{msg}");
        let msg = err_text(&MINIMAL.replace("kind = \"sim\"", "kind = \"sim\"\nmodel = \"m\""));
        assert!(msg.contains("does not take \"model\""), "{msg}");
        let msg = err_text(&format!(
            "{MINIMAL}\n[backends.remote]\nkind = \"openai\"\nbase_url = \"https://user:pw@h/v1\"\nmodel = \"m\"\napi_key_env = \"sk-123\"\n"
        ));
        assert!(msg.contains("base_url contains credentials"), "{msg}");
        assert!(msg.contains("api_key_env must be the NAME"), "{msg}");
    }
}
