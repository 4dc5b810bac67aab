//! The experiment file: one TOML document that fixes everything a MASS run
//! depends on (tasks, backends per role, inner- and outer-loop settings,
//! limits, trainer).
//!
//! Loading is strict on purpose. Every table denies unknown fields, so a typo
//! such as `iteratons = 3` is an error instead of a silently ignored setting
//! that would make a recorded experiment mean something other than what its
//! author thought. Syntax and schema errors name the file, line and column;
//! semantic errors ([`Experiment::validate`]) name the offending keys.
//!
//! Secrets never go into an experiment file (DESIGN.md invariant 5): an
//! OpenAI-compatible backend names the *environment variable* that holds its
//! key (`api_key_env`); a literal `api_key` field is rejected, and so is a
//! `base_url` with embedded credentials. That keeps [`Experiment::canonical_toml`],
//! which is what the ledger records, free of secrets by construction.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

use crate::task::{Split, Task};

/// Placeholders a `[trainer] command` may use.
pub const TRAINER_PLACEHOLDERS: [&str; 6] = [
    "train",
    "validation",
    "base_model",
    "output_dir",
    "hyperparameters",
    "base_adapter",
];

// ---------------------------------------------------------------------------
// Errors

/// One semantic problem found by [`Experiment::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The dotted key the problem is about (e.g. `outer.train_ranks`).
    pub key: String,
    /// A complete sentence naming the key(s) and what is expected.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read experiment file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// TOML syntax or schema error (unknown field, wrong type, missing field).
    #[error("{origin}:{line}:{column}: {message}")]
    Syntax {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// Semantic problems; all of them are reported at once so a user can fix
    /// a file in one pass.
    #[error("{}", render_problems(origin, problems))]
    Invalid {
        origin: String,
        problems: Vec<Problem>,
    },
    /// A `key=value` override could not be applied. The value is deliberately
    /// not echoed: an override may be someone's attempt to pass a secret.
    #[error("override {key}: {message}")]
    Override { key: String, message: String },
}

fn render_problems(origin: &str, problems: &[Problem]) -> String {
    match problems {
        [one] => format!("{origin}: {}", one.message),
        many => {
            let mut s = format!("{origin}: {} problems:", many.len());
            for p in many {
                s.push_str("\n  - ");
                s.push_str(&p.message);
            }
            s
        }
    }
}

/// 1-based line and column (in characters) of a byte offset in `text`.
/// Offsets past the end or inside a multi-byte character are clamped, so a
/// slightly-off span from a parser can never cause a panic.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// serde quotes names with backticks (`` `iteratons` ``); users read double quotes.
pub(crate) fn clean_serde_message(message: &str) -> String {
    message.trim().replace('`', "\"")
}

/// Turns a toml deserialisation error into (line, column, message).
pub(crate) fn locate_toml_error(text: &str, err: &toml::de::Error) -> (usize, usize, String) {
    let (line, column) = err
        .span()
        .map_or((1, 1), |span| line_column(text, span.start));
    (line, column, clean_serde_message(err.message()))
}

// ---------------------------------------------------------------------------
// Schema

/// A whole experiment file. Field order here is the order of
/// [`Experiment::canonical_toml`]; plain values come before tables as TOML needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub name: String,
    pub seed: u64,
    /// As written in the file (relative paths are kept relative so the
    /// canonical form does not depend on where the file lives).
    pub tasks_dir: String,
    /// Explicit train task ids; `None` = every task whose `task.toml` says `split = "train"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<Vec<String>>,
    /// Explicit held-out task ids; `None` = every `split = "heldout"` task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heldout: Option<Vec<String>>,
    #[serde(default = "default_one")]
    pub cycles: u32,
    /// Units of work (rollouts, judgments, inner-loop steps) in flight at
    /// once within a stage. Each is an async task, not a thread; a server's
    /// own limit is its backend's `max_concurrency`.
    #[serde(default = "default_one")]
    pub concurrency: u32,
    pub backends: BTreeMap<String, Backend>,
    pub roles: Roles,
    #[serde(default)]
    pub sampling: SamplingRoles,
    #[serde(default)]
    pub inner: InnerConfig,
    #[serde(default)]
    pub outer: OuterConfig,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub guards: GuardsConfig,
    #[serde(default)]
    pub sandbox: SandboxConfig,
    #[serde(default)]
    pub trainer: TrainerConfig,
    /// `[harness]`: who plays a team run. Left out of the canonical form
    /// when built in, so experiments written before it keep their ids.
    #[serde(default, skip_serializing_if = "HarnessConfig::is_builtin")]
    pub harness: HarnessConfig,
    /// Where the experiment came from (file path or label), for error messages.
    #[serde(skip)]
    pub origin: String,
    /// `tasks_dir` resolved against the directory of the experiment file.
    #[serde(skip)]
    pub tasks_path: PathBuf,
    /// The run names backends as written, execution settings and all (a
    /// `mass-engine/7` run: its recorded trainer requests do), not by
    /// [`Backend::definition`].
    #[serde(skip)]
    pub backends_as_written: bool,
}

fn default_one() -> u32 {
    1
}

/// A model backend. In the file: `[backends.<name>]` with `kind = "sim" | "openai"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawBackend", into = "RawBackend")]
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
}

fn default_ready_path() -> String {
    "/v1/models".into()
}

fn default_start_timeout() -> u64 {
    300
}

/// Placeholders of `serve.command` and `serve.adapter_command`.
pub const SERVE_PLACEHOLDERS: [&str; 3] = ["port", "model", "adapter"];

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
            BackendKind::Sim => {
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
            BackendKind::OpenAi => {
                if raw.sim.is_some() {
                    return Err(
                        "backend of kind \"openai\" does not take a [sim] table (only kind = \"sim\" does)"
                            .into(),
                    );
                }
                if raw.api_key_env.is_some() && raw.api_key_file.is_some() {
                    return Err(
                        "backend of kind \"openai\" takes api_key_env or api_key_file, not both"
                            .into(),
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
        }
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

fn quote_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which backend plays each MASS role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Roles {
    pub orchestrator: String,
    /// `None` = same backend as the orchestrator (kept unresolved so that an
    /// override of `roles.orchestrator` also moves the subagents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subagent: Option<String>,
    pub judge: String,
    pub optimizer: String,
    #[serde(default)]
    pub external_judges: Vec<String>,
}

impl Roles {
    /// The backend subagents use.
    pub fn subagent_backend(&self) -> &str {
        self.subagent.as_deref().unwrap_or(&self.orchestrator)
    }
}

/// `[sampling.team]`, `[sampling.judge]`, `[sampling.optimizer]`: how each
/// role samples. The defaults are what earlier versions hard-coded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingRoles {
    /// The orchestrator and its subagents.
    pub team: SamplingConfig,
    pub judge: SamplingConfig,
    pub optimizer: SamplingConfig,
}

impl Default for SamplingRoles {
    fn default() -> Self {
        SamplingRoles {
            team: SamplingConfig::with(0.7, 4096),
            judge: SamplingConfig::with(0.2, 1024),
            optimizer: SamplingConfig::with(0.8, 4096),
        }
    }
}

/// Sampling parameters of one role, sent with every request it makes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingConfig {
    pub temperature: f64,
    pub max_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Which tool the model must call, for calls that offer tools (team
    /// members): `auto` (the server's default), `none`, `required` (some
    /// tool), or a tool's name (exactly that tool; servers enforce it with a
    /// grammar). Small models choose tools badly; forcing one proves the
    /// wire protocol. The simulated model ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<String>,
}

impl SamplingConfig {
    pub fn with(temperature: f64, max_tokens: u64) -> SamplingConfig {
        SamplingConfig {
            temperature,
            max_tokens,
            top_p: None,
            stop: Vec::new(),
            tool_choice: None,
        }
    }
}

/// How the inner loop decides whether a candidate workflow replaces the champion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Acceptance {
    /// The paper's Algorithm 1: candidate vs the retained champion.
    Champion,
    /// The public code: vs a fixed bare-task reference, then arbitrate against the champion.
    ReferenceThenChampion,
}

/// Inner loop: workflow search with frozen weights.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InnerConfig {
    pub iterations: u32,
    pub acceptance: Acceptance,
    /// Judge each comparison a second time with A/B swapped.
    pub swap_positions: bool,
    pub max_proposal_retries: u32,
}

impl Default for InnerConfig {
    fn default() -> Self {
        InnerConfig {
            iterations: 11,
            acceptance: Acceptance::Champion,
            swap_positions: true,
            max_proposal_retries: 3,
        }
    }
}

/// Outer loop: collect, judge, rank, select, evaluate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OuterConfig {
    pub runs_per_task: u32,
    pub opponents_per_run: u32,
    /// Bradley-Terry prior (virtual wins and losses against an average player); 0 = pure MLE.
    pub prior: f64,
    pub train_ranks: u32,
    pub validation_ranks: u32,
    pub swap_positions: bool,
    pub max_verdict_retries: u32,
    /// Held-out runs per task and model for the evaluation (bare task).
    pub eval_runs: u32,
    /// Runs per training task and model for the training-task win rate
    /// (bare task; 0 = not measured).
    pub eval_train_runs: u32,
    /// Verdicts per evaluated pair by each evaluating judge (the external
    /// judges and the run's own), presentation order alternating A/B.
    pub external_judgments: u32,
    /// Train on the selected runs (and evaluate the trained model). `false`
    /// records the dataset and stops there: the model is unchanged (what
    /// `mass rejudge --cycle C` does unless given `--through-training`).
    pub train: bool,
    /// Which training tasks the outer loop collects runs of.
    #[serde(skip_serializing_if = "Collect::is_improved")]
    pub collect: Collect,
}

/// Which training tasks reach collection, ranking and the dataset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collect {
    /// Only tasks whose search found a workflow that beat the bare-task
    /// reference (the MASS articles: no improvement, no data).
    #[default]
    Improved,
    /// Every training task, with its champion (the bare workflow where the
    /// search found nothing better): for models too weak to win a duel, and
    /// to study what self-training on unimproved runs does.
    Every,
}

impl Collect {
    fn is_improved(&self) -> bool {
        *self == Collect::Improved
    }
}

impl Default for OuterConfig {
    fn default() -> Self {
        OuterConfig {
            runs_per_task: 18,
            opponents_per_run: 6,
            prior: 0.5,
            train_ranks: 15,
            validation_ranks: 1,
            swap_positions: false,
            max_verdict_retries: 3,
            eval_runs: 6,
            eval_train_runs: 2,
            external_judgments: 2,
            train: true,
            collect: Collect::Improved,
        }
    }
}

/// Per-run resource limits of the harness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Orchestrator turns; each subagent gets the same budget.
    pub max_turns: u32,
    /// Token budget per run.
    pub max_tokens: u64,
    pub tool_timeout_secs: u64,
    pub tool_output_bytes: u64,
    pub max_delegations: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_turns: 24,
            max_tokens: 60_000,
            tool_timeout_secs: 60,
            tool_output_bytes: 16_384,
            max_delegations: 8,
        }
    }
}

/// `[sandbox]`: how every tool command and check of a run is confined (the
/// `sandbox` crate). A level this machine cannot provide refuses the run's
/// start; lowering it is an explicit, recorded choice of the experiment.
/// Network access is the task's to declare (`network` in `task.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    pub level: sandbox::Level,
    pub limits: sandbox::Limits,
    /// Most entries (files, directories, links) a workspace snapshot may
    /// hold; a workspace over it fails its run's step before anything is
    /// read into memory.
    pub workspace_entries: u64,
    /// Most bytes of file content a workspace snapshot may hold, in MiB.
    pub workspace_mb: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        let d = ledger::tree::SnapshotLimits::default();
        SandboxConfig {
            level: sandbox::Level::default(),
            limits: sandbox::Limits::default(),
            workspace_entries: d.max_entries,
            workspace_mb: d.max_bytes >> 20,
        }
    }
}

impl SandboxConfig {
    /// The snapshot limits in force.
    pub fn snapshot_limits(&self) -> ledger::tree::SnapshotLimits {
        ledger::tree::SnapshotLimits {
            max_entries: self.workspace_entries,
            max_bytes: self.workspace_mb.saturating_mul(1 << 20),
        }
    }
}

/// `[guards]`: what is checked on every run's final workspace against
/// tampering (see `guards.rs`), and what happens to a flagged run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuardsConfig {
    pub action: GuardAction,
    /// Most files a run may add, modify or remove outside the deliverables.
    pub max_changed_files: u32,
    /// Most bytes of added or modified files outside the deliverables.
    pub max_changed_bytes: u64,
}

impl Default for GuardsConfig {
    fn default() -> Self {
        GuardsConfig {
            action: GuardAction::Exclude,
            max_changed_files: 200,
            max_changed_bytes: 16 << 20,
        }
    }
}

/// What happens to a run a guard flagged. Nothing is dropped silently:
/// every flag is a `mass.guard` event and every exclusion a reason in the
/// task's `mass.selection`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GuardAction {
    /// Kept out of judging, ranking and training.
    #[serde(rename = "exclude")]
    Exclude,
    /// Judged and ranked, never selected for training or validation.
    #[serde(rename = "no-train")]
    NoTrain,
    /// Flagged only.
    #[serde(rename = "record")]
    Record,
}

impl GuardAction {
    pub fn as_str(self) -> &'static str {
        match self {
            GuardAction::Exclude => "exclude",
            GuardAction::NoTrain => "no-train",
            GuardAction::Record => "record",
        }
    }
}

/// Which harness plays a team run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HarnessKind {
    /// The engine's own orchestrator and subagents (`harness.rs`).
    #[default]
    Builtin,
    /// An external agent program run once per rollout, its model traffic
    /// recorded through the proxy (`harness/external.rs`).
    External,
}

/// `[harness]`: an external agent harness (Qwen Code, OpenHands, an
/// in-house agent) as the team. `command` is one bash line run in the
/// rollout's workspace, inside the sandbox, with `OPENAI_BASE_URL`,
/// `OPENAI_API_KEY` and `OPENAI_MODEL` set to a proxy stream of the rollout;
/// placeholders: `{prompt_file}` (the task prompt with the workflow, as a
/// file), `{workspace}`, `{home}` (a scratch directory outside the workspace
/// for the harness's own state), `{base_url}`, `{model}`. The ledger records
/// this template and `env`, never the values of `pass_env`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HarnessConfig {
    pub kind: HarnessKind,
    pub command: String,
    /// Variables set for the command (recorded).
    pub env: BTreeMap<String, String>,
    /// Variables copied from `mass`'s own environment (names recorded,
    /// values not): e.g. where the harness is installed.
    pub pass_env: Vec<String>,
    /// Paths the command may read besides the system and the workspace;
    /// `$NAME` at the start of an entry is taken from `mass`'s environment.
    pub readable: Vec<String>,
    /// Wall-clock limit of one rollout; past it the harness's process
    /// group is killed and the rollout ends `halted`.
    pub timeout_secs: u64,
    /// Resource limits for the harness's processes (default: `[sandbox.limits]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<sandbox::Limits>,
    /// How requests are matched when a rollout is re-executed against its
    /// recording (`mass harness-replay`): the workspace and home paths are
    /// always replaced; these rules add to that (dates, ids).
    pub normalise: crate::proxy::NormaliseConfig,
}

impl Default for HarnessConfig {
    fn default() -> Self {
        HarnessConfig {
            kind: HarnessKind::Builtin,
            command: String::new(),
            env: BTreeMap::new(),
            pass_env: Vec::new(),
            readable: Vec::new(),
            timeout_secs: 900,
            limits: None,
            normalise: crate::proxy::NormaliseConfig::default(),
        }
    }
}

impl HarnessConfig {
    pub fn is_builtin(&self) -> bool {
        *self == HarnessConfig::default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainerKind {
    Sim,
    Command,
}

/// The training step: built-in simulated trainer or an external command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerConfig {
    pub kind: TrainerKind,
    /// Shell command with `{train}`, `{validation}`, `{base_model}`, `{output_dir}`
    /// placeholders; `{{` and `}}` stand for literal braces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Metrics written by the trainer, relative to the output directory.
    pub metrics_file: String,
    /// Wall-clock limit of one trainer attempt; past it the trainer's
    /// process group is killed and the attempt recorded as an
    /// infrastructure failure (`mass resume` runs it again).
    pub timeout_secs: u64,
    /// Handed to the trainer as a JSON file (the `{hyperparameters}`
    /// placeholder names it) and recorded with the training step.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub hyperparameters: BTreeMap<String, serde_json::Value>,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            kind: TrainerKind::Sim,
            command: None,
            metrics_file: "metrics.jsonl".into(),
            timeout_secs: 6 * 3600,
            hyperparameters: BTreeMap::new(),
        }
    }
}

/// Values substituted into a trainer command.
#[derive(Debug, Clone, Copy)]
pub struct TrainerArgs<'a> {
    pub train: &'a Path,
    pub validation: &'a Path,
    pub base_model: &'a str,
    pub output_dir: &'a Path,
    pub hyperparameters: &'a Path,
    /// The adapter files of the model being trained when it is itself a
    /// trained adapter (to continue from), or empty for a base model.
    pub base_adapter: Option<&'a Path>,
}

impl TrainerConfig {
    /// The command with placeholders replaced by shell-quoted values (the
    /// command runs through `sh -c`, and paths may contain spaces).
    /// `None` for the simulated trainer.
    pub fn expand_command(&self, args: &TrainerArgs<'_>) -> Option<Result<String, String>> {
        let template = self.command.as_deref()?;
        Some(expand_placeholders(template, |name| {
            let value = match name {
                "train" => args.train.to_string_lossy().into_owned(),
                "validation" => args.validation.to_string_lossy().into_owned(),
                "base_model" => args.base_model.to_string(),
                "output_dir" => args.output_dir.to_string_lossy().into_owned(),
                "hyperparameters" => args.hyperparameters.to_string_lossy().into_owned(),
                "base_adapter" => args
                    .base_adapter
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                _ => return None,
            };
            Some(shell_quote(&value))
        }))
    }
}

/// Replaces `{name}` using `lookup`; `{{` / `}}` are literal braces. Errors
/// name the unknown placeholder or the unbalanced brace.
pub fn expand_placeholders(
    template: &str,
    mut lookup: impl FnMut(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("{{") {
            out.push('{');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            out.push('}');
            rest = after;
        } else if tail.starts_with('}') {
            return Err("unmatched \"}\" (write \"}}\" for a literal brace)".into());
        } else {
            let Some(close) = tail.find('}') else {
                return Err("unclosed \"{\" (write \"{{\" for a literal brace)".into());
            };
            let name = &tail[1..close];
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => return Err(format!("unknown placeholder \"{{{name}}}\"")),
            }
            rest = &tail[close + 1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// POSIX single-quoting, only when needed so simple commands stay readable.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The tasks an experiment trains on and holds out, resolved against a suite.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSelection {
    pub train: Vec<Task>,
    pub heldout: Vec<Task>,
}

// ---------------------------------------------------------------------------
// Loading, validation, overrides

impl Experiment {
    /// Reads, parses and validates an experiment file. Errors carry the path as given.
    pub fn load(path: &Path) -> Result<Experiment, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Experiment::parse(&text, &path.to_string_lossy())
    }

    /// Parses and validates experiment text. `origin` is the file path (or a
    /// label) used in error messages; a relative `tasks_dir` resolves against
    /// its parent directory (the current directory for a bare label).
    pub fn parse(text: &str, origin: &str) -> Result<Experiment, ConfigError> {
        let mut exp: Experiment = toml::from_str(text).map_err(|e| {
            let (line, column, message) = locate_toml_error(text, &e);
            ConfigError::Syntax {
                origin: origin.to_string(),
                line,
                column,
                message,
            }
        })?;
        exp.origin = origin.to_string();
        exp.tasks_path = resolve_tasks_dir(origin, &exp.tasks_dir);
        exp.validate()?;
        Ok(exp)
    }

    /// All problems as a list (empty = valid). [`Experiment::validate`] wraps this.
    pub fn problems(&self) -> Vec<Problem> {
        let mut v = Validator::default();
        self.check(&mut v);
        v.problems
    }

    /// Semantic checks that serde cannot express; every problem names its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                origin: self.origin.clone(),
                problems,
            })
        }
    }

    fn check(&self, v: &mut Validator) {
        for (role, c) in [
            ("team", &self.sampling.team),
            ("judge", &self.sampling.judge),
            ("optimizer", &self.sampling.optimizer),
        ] {
            if !(0.0..=2.0).contains(&c.temperature) {
                v.add(
                    format!("sampling.{role}.temperature"),
                    format!("sampling.{role}.temperature must be between 0 and 2"),
                );
            }
            if c.max_tokens == 0 {
                v.add(
                    format!("sampling.{role}.max_tokens"),
                    format!("sampling.{role}.max_tokens must be at least 1"),
                );
            }
            if c.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
                v.add(
                    format!("sampling.{role}.top_p"),
                    format!("sampling.{role}.top_p must be in (0, 1]"),
                );
            }
            if let Some(tc) = &c.tool_choice {
                let known = ["auto", "none", "required"].contains(&tc.as_str())
                    || crate::tools::tool_defs(true)
                        .iter()
                        .any(|t| t.function.name == *tc);
                if !known {
                    v.add(
                        format!("sampling.{role}.tool_choice"),
                        format!(
                            "sampling.{role}.tool_choice must be auto, none, required or a tool name ({})",
                            crate::tools::tool_defs(true)
                                .iter()
                                .map(|t| t.function.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                }
            }
        }
        if self.name.trim().is_empty() {
            v.add("name", "name must not be empty");
        } else if self.name.chars().any(char::is_control) {
            v.add("name", "name must not contain control characters");
        }
        // TOML integers are signed 64-bit: a larger seed could not be written
        // back by canonical_toml.
        if self.seed > i64::MAX as u64 {
            v.add(
                "seed",
                format!("seed ({}) must be at most {}", self.seed, i64::MAX),
            );
        }
        if self.tasks_dir.trim().is_empty() {
            v.add("tasks_dir", "tasks_dir must not be empty");
        }
        if self.cycles == 0 {
            v.add("cycles", "cycles must be at least 1");
        }
        if self.concurrency == 0 {
            v.add("concurrency", "concurrency must be at least 1");
        }
        self.check_task_lists(v);
        self.check_backends(v);
        self.check_roles(v);
        self.check_outer(v);
        self.check_limits(v);
        self.check_trainer(v);
        self.check_harness(v);
    }

    fn check_harness(&self, v: &mut Validator) {
        let h = &self.harness;
        match h.kind {
            HarnessKind::Builtin => {
                if !h.is_builtin() {
                    v.add(
                        "harness.kind",
                        "[harness] settings only apply to harness.kind = \"external\"",
                    );
                }
            }
            HarnessKind::External => {
                if h.command.trim().is_empty() {
                    v.add(
                        "harness.command",
                        "harness.command is required when harness.kind = \"external\"",
                    );
                } else if let Err(e) = expand_placeholders(&h.command, |name| {
                    ["prompt_file", "workspace", "home", "base_url", "model"]
                        .contains(&name)
                        .then(String::new)
                }) {
                    v.add("harness.command", format!("harness.command: {e}"));
                }
                if h.timeout_secs == 0 {
                    v.add(
                        "harness.timeout_secs",
                        "harness.timeout_secs must be at least 1",
                    );
                }
                // Refused here, before the run records anything: a value in
                // harness.env is part of the recorded experiment and of every
                // harness request, and would reach the sandboxed program.
                for name in h.env.keys().chain(h.pass_env.iter()) {
                    if crate::proxy::scrub::is_secret_name(name) {
                        v.add(
                            "harness.env",
                            format!("harness: {name} is named like a credential: a sandboxed program never gets one (the proxy adds the backend's key upstream); remove it from harness.env / harness.pass_env"),
                        );
                    }
                }
                if let Err(e) = crate::proxy::Normaliser::new(&h.normalise) {
                    v.add("harness.normalise", format!("harness.normalise: {e}"));
                }
                if matches!(
                    self.backends.get(&self.roles.orchestrator),
                    Some(Backend::Sim(_))
                ) {
                    v.add(
                        "roles.orchestrator",
                        "roles.orchestrator: an external harness needs an OpenAI-compatible backend (kind = \"openai\"), not the simulation",
                    );
                }
            }
        }
    }

    fn check_task_lists(&self, v: &mut Validator) {
        for (key, list) in [("train", &self.train), ("heldout", &self.heldout)] {
            let Some(list) = list else { continue };
            let mut seen = BTreeSet::new();
            for id in list {
                if id.trim().is_empty() {
                    v.add(key, format!("{key} contains an empty task id"));
                } else if !seen.insert(id) {
                    v.add(key, format!("{key} lists task \"{id}\" twice"));
                }
            }
        }
        if let (Some(train), Some(heldout)) = (&self.train, &self.heldout) {
            let train: BTreeSet<&String> = train.iter().collect();
            let both: Vec<&str> = heldout
                .iter()
                .filter(|id| train.contains(id))
                .map(String::as_str)
                .collect();
            if !both.is_empty() {
                v.add(
                    "heldout",
                    format!(
                        "train and heldout overlap ({}): held-out tasks must never reach training",
                        quote_list(&both)
                    ),
                );
            }
        }
        if self.train.as_ref().is_some_and(Vec::is_empty) {
            v.add("train", "train is empty: at least one train task is needed");
        }
    }

    fn check_backends(&self, v: &mut Validator) {
        if self.backends.is_empty() {
            v.add(
                "backends",
                "at least one backend must be defined under [backends]",
            );
        }
        for (name, backend) in &self.backends {
            let key = format!("backends.{name}");
            // Overrides address backends with dotted keys, so a name must be
            // a single key segment.
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                v.add(
                    &key,
                    format!("backend name \"{name}\" must use only letters, digits, '_' and '-'"),
                );
            }
            match backend {
                Backend::Sim(p) => {
                    let unit = [
                        ("skill", p.skill),
                        ("delegation", p.delegation),
                        ("blind_spot", p.blind_spot),
                        ("tampering", p.tampering),
                        ("learning_rate", p.learning_rate),
                    ];
                    for (field, x) in unit {
                        if !(0.0..=1.0).contains(&x) {
                            v.add(
                                format!("{key}.sim.{field}"),
                                format!("{key}.sim.{field} ({x}) must be between 0 and 1"),
                            );
                        }
                    }
                    if !(p.judge_noise.is_finite() && p.judge_noise >= 0.0) {
                        v.add(
                            format!("{key}.sim.judge_noise"),
                            format!(
                                "{key}.sim.judge_noise ({}) must be a finite number >= 0",
                                p.judge_noise
                            ),
                        );
                    }
                    if !(-1.0..=1.0).contains(&p.position_bias) {
                        v.add(
                            format!("{key}.sim.position_bias"),
                            format!(
                                "{key}.sim.position_bias ({}) must be between -1 and 1",
                                p.position_bias
                            ),
                        );
                    }
                }
                Backend::OpenAi(p) => check_openai(&key, p, v),
            }
        }
    }

    fn check_roles(&self, v: &mut Validator) {
        let r = &self.roles;
        let mut named: Vec<(String, &str)> = vec![
            ("roles.orchestrator".into(), r.orchestrator.as_str()),
            ("roles.judge".into(), r.judge.as_str()),
            ("roles.optimizer".into(), r.optimizer.as_str()),
        ];
        if let Some(s) = &r.subagent {
            named.push(("roles.subagent".into(), s.as_str()));
        }
        for (i, e) in r.external_judges.iter().enumerate() {
            named.push((format!("roles.external_judges[{i}]"), e.as_str()));
        }
        for (key, backend) in named {
            if !self.backends.contains_key(backend) {
                let known: Vec<&str> = self.backends.keys().map(String::as_str).collect();
                v.add(
                    &key,
                    format!(
                        "{key} names backend \"{backend}\", which is not defined under [backends] (defined: {})",
                        if known.is_empty() { "none".to_string() } else { quote_list(&known) }
                    ),
                );
            }
        }
        let mut seen = BTreeSet::new();
        for e in &r.external_judges {
            if !seen.insert(e) {
                v.add(
                    "roles.external_judges",
                    format!("roles.external_judges lists \"{e}\" twice"),
                );
            }
        }
    }

    fn check_outer(&self, v: &mut Validator) {
        let o = &self.outer;
        if o.runs_per_task < 2 {
            v.add(
                "outer.runs_per_task",
                format!(
                    "outer.runs_per_task ({}) must be at least 2 to compare runs",
                    o.runs_per_task
                ),
            );
        }
        // A k-regular pairing schedule on n runs exists iff 1 <= k < n and n*k is even.
        let product = u64::from(o.runs_per_task) * u64::from(o.opponents_per_run);
        if o.opponents_per_run == 0 || o.opponents_per_run >= o.runs_per_task || product % 2 != 0 {
            v.add(
                "outer.opponents_per_run",
                format!(
                    "outer.opponents_per_run ({}) must be >= 1 and < runs_per_task ({}), \
                     and runs_per_task * opponents_per_run ({product}) must be even",
                    o.opponents_per_run, o.runs_per_task
                ),
            );
        }
        if !(o.prior.is_finite() && o.prior >= 0.0) {
            v.add(
                "outer.prior",
                format!(
                    "outer.prior ({}) must be a finite number >= 0 (0 = pure MLE)",
                    o.prior
                ),
            );
        }
        if o.train_ranks == 0 {
            v.add("outer.train_ranks", "outer.train_ranks must be at least 1");
        }
        let used = u64::from(o.train_ranks) + u64::from(o.validation_ranks);
        if used > u64::from(o.runs_per_task) {
            v.add(
                "outer.train_ranks",
                format!(
                    "outer.train_ranks + outer.validation_ranks ({used}) exceeds outer.runs_per_task ({})",
                    o.runs_per_task
                ),
            );
        }
        if o.eval_runs == 0 {
            v.add("outer.eval_runs", "outer.eval_runs must be at least 1");
        }
        if o.external_judgments == 0 && !self.roles.external_judges.is_empty() {
            v.add(
                "outer.external_judgments",
                "outer.external_judgments must be at least 1 when roles.external_judges is not empty",
            );
        }
    }

    fn check_limits(&self, v: &mut Validator) {
        let l = &self.limits;
        for (key, value) in [
            ("limits.max_turns", u64::from(l.max_turns)),
            ("limits.max_tokens", l.max_tokens),
            ("limits.tool_timeout_secs", l.tool_timeout_secs),
            ("limits.tool_output_bytes", l.tool_output_bytes),
        ] {
            if value == 0 {
                v.add(key, format!("{key} must be at least 1"));
            }
        }
    }

    fn check_trainer(&self, v: &mut Validator) {
        let t = &self.trainer;
        if t.timeout_secs == 0 {
            v.add(
                "trainer.timeout_secs",
                "trainer.timeout_secs must be at least 1",
            );
        }
        match (t.kind, &t.command) {
            (TrainerKind::Command, None) => v.add(
                "trainer.command",
                "trainer.command is required when trainer.kind = \"command\"",
            ),
            (TrainerKind::Sim, Some(_)) => v.add(
                "trainer.command",
                "trainer.command only applies to trainer.kind = \"command\"",
            ),
            (TrainerKind::Command, Some(cmd)) => {
                if cmd.trim().is_empty() {
                    v.add("trainer.command", "trainer.command must not be empty");
                } else if let Err(e) = expand_placeholders(cmd, |name| {
                    TRAINER_PLACEHOLDERS.contains(&name).then(String::new)
                }) {
                    v.add(
                        "trainer.command",
                        format!(
                            "trainer.command: {e}, expected one of {}",
                            TRAINER_PLACEHOLDERS
                                .iter()
                                .map(|p| format!("\"{{{p}}}\""))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                }
            }
            (TrainerKind::Sim, None) => {}
        }
        let m = Path::new(&t.metrics_file);
        if t.metrics_file.is_empty()
            || m.is_absolute()
            || m.components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            v.add(
                "trainer.metrics_file",
                format!(
                    "trainer.metrics_file (\"{}\") must be a relative path inside the output directory",
                    t.metrics_file
                ),
            );
        }
    }

    /// Applies one `key=value` override (see [`Experiment::apply_override_set`]).
    pub fn apply_override(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        self.apply_override_set(&[(key.to_string(), value.to_string())])
    }

    /// Applies dotted-key overrides (`inner.iterations=3`, `roles.judge=external`,
    /// `backends.sim.sim.skill=0.6`). The value is parsed as a TOML value; if it
    /// is not valid TOML it is taken as a bare string, so `roles.judge=external`
    /// works without quotes. The result is re-validated; on error `self` is unchanged.
    ///
    /// All of `overrides` are set first and the experiment is validated
    /// once, so their order does not matter (a role may name a backend
    /// another override of the same set adds). A key given twice is refused:
    /// which value would win is not something to leave to the order.
    pub fn apply_override_set(
        &mut self,
        overrides: &[(String, String)],
    ) -> Result<(), ConfigError> {
        let mut seen = BTreeSet::new();
        for (k, _) in overrides {
            if !seen.insert(k.trim()) {
                return Err(ConfigError::Override {
                    key: k.trim().to_string(),
                    message: "given twice: give each key once".into(),
                });
            }
        }
        let label = overrides
            .iter()
            .map(|(k, _)| k.trim())
            .collect::<Vec<_>>()
            .join(", ");
        let mut root = toml::Table::try_from(&*self).map_err(|e| ConfigError::Override {
            key: label.clone(),
            message: format!("cannot serialise the current experiment: {e}"),
        })?;
        for (k, v) in overrides {
            insert_override(&mut root, k.trim(), v.trim())?;
        }
        let fail = |message: String| ConfigError::Override {
            key: label.clone(),
            message,
        };
        let mut updated: Experiment = toml::Value::Table(root)
            .try_into()
            .map_err(|e: toml::de::Error| fail(clean_serde_message(e.message())))?;
        updated.origin = self.origin.clone();
        updated.backends_as_written = self.backends_as_written;
        // The resolved tasks folder is kept unless the override is of
        // tasks_dir itself: a driver points it at the run's recorded suite,
        // which an unrelated override must not send back to the disk.
        updated.tasks_path = if updated.tasks_dir == self.tasks_dir {
            self.tasks_path.clone()
        } else {
            resolve_tasks_dir(&self.origin, &updated.tasks_dir)
        };
        updated.validate()?;
        *self = updated;
        Ok(())
    }

    /// Applies `key=value` strings as one set (as given on a command line;
    /// see [`Experiment::apply_override_set`]).
    pub fn apply_overrides<'a>(
        &mut self,
        overrides: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ConfigError> {
        let mut set = Vec::new();
        for item in overrides {
            let Some((key, value)) = item.split_once('=') else {
                return Err(ConfigError::Override {
                    key: item.to_string(),
                    message: "expected key=value".into(),
                });
            };
            set.push((key.trim().to_string(), value.trim().to_string()));
        }
        self.apply_override_set(&set)
    }

    /// The experiment re-serialised with every default written out, in a fixed
    /// order: two experiments that mean the same thing have the same text.
    pub fn canonical_toml(&self) -> String {
        // Serialisation can only fail for a seed above i64::MAX, which
        // validate() rejects; the fallback keeps this total without a panic.
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot serialise experiment: {e}\n"))
    }

    /// What the experiment is, without how this machine runs it: the
    /// canonical form (comments and layout gone) with `concurrency` at 1 and
    /// every backend's [`Backend::definition`] (`serve` stays). `run.started` records this,
    /// so the same experiment gives the same ids on any machine, at any
    /// concurrency, however its file is written; the file as given goes to
    /// the run's `execution` stream, outside every hashed step.
    pub fn definition_toml(&self) -> String {
        let mut d = self.clone();
        d.concurrency = 1;
        for b in d.backends.values_mut() {
            *b = b.definition();
        }
        d.canonical_toml()
    }

    pub fn backend(&self, name: &str) -> Option<&Backend> {
        self.backends.get(name)
    }

    /// Resolves the train and held-out task lists against a loaded suite:
    /// defaults come from each task's `split`; every id must exist; a task
    /// whose `task.toml` says `split = "heldout"` may never be trained on
    /// (DESIGN.md invariant 4), and the two lists may not overlap.
    pub fn select_tasks(&self, suite: &[Task]) -> Result<TaskSelection, ConfigError> {
        let mut v = Validator::default();
        let by_id: BTreeMap<&str, &Task> = suite.iter().map(|t| (t.id.as_str(), t)).collect();
        let pick = |key: &str, list: &Option<Vec<String>>, split: Split, v: &mut Validator| {
            match list {
                None => suite
                    .iter()
                    .filter(|t| t.split == split)
                    .cloned()
                    .collect::<Vec<_>>(),
                Some(ids) => ids
                    .iter()
                    .filter_map(|id| match by_id.get(id.as_str()) {
                        Some(t) => Some((*t).clone()),
                        None => {
                            v.add(
                                key,
                                // tasks_dir as written, not the resolved
                                // path: a run's sessions read a temporary
                                // checkout of its recorded suite.
                                format!(
                                    "{key} names task \"{id}\", which is not in the task suite (tasks_dir \"{}\"; known: {})",
                                    self.tasks_dir,
                                    quote_list(&by_id.keys().copied().collect::<Vec<_>>())
                                ),
                            );
                            None
                        }
                    })
                    .collect(),
            }
        };
        let train = pick("train", &self.train, Split::Train, &mut v);
        let heldout = pick("heldout", &self.heldout, Split::Heldout, &mut v);
        for t in &train {
            if t.split == Split::Heldout {
                v.add(
                    "train",
                    format!(
                        "train names task \"{}\", whose task.toml says split = \"heldout\": held-out tasks never enter training",
                        t.id
                    ),
                );
            }
        }
        let train_ids: BTreeSet<&str> = train.iter().map(|t| t.id.as_str()).collect();
        let both: Vec<&str> = heldout
            .iter()
            .map(|t| t.id.as_str())
            .filter(|id| train_ids.contains(id))
            .collect();
        if !both.is_empty() {
            v.add(
                "heldout",
                format!(
                    "train and heldout overlap ({}): held-out tasks must never reach training",
                    quote_list(&both)
                ),
            );
        }
        if train.is_empty() && v.problems.is_empty() {
            v.add("train", "no train tasks selected");
        }
        if v.problems.is_empty() {
            Ok(TaskSelection { train, heldout })
        } else {
            Err(ConfigError::Invalid {
                origin: self.origin.clone(),
                problems: v.problems,
            })
        }
    }
}

fn check_openai(key: &str, p: &OpenAiParams, v: &mut Validator) {
    let url = p.base_url.trim();
    let scheme_rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match scheme_rest {
        None => v.add(
            format!("{key}.base_url"),
            format!("{key}.base_url must start with http:// or https://"),
        ),
        Some(rest) => {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            if authority.is_empty() {
                v.add(
                    format!("{key}.base_url"),
                    format!("{key}.base_url has no host"),
                );
            }
            if authority.contains('@') {
                v.add(
                    format!("{key}.base_url"),
                    format!(
                        "{key}.base_url contains credentials: secrets never go in experiment files; use api_key_env"
                    ),
                );
            }
        }
    }
    if p.model.trim().is_empty() {
        v.add(
            format!("{key}.model"),
            format!("{key}.model must not be empty"),
        );
    }
    if let Some(env) = &p.api_key_env {
        let valid = env
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            v.add(
                format!("{key}.api_key_env"),
                format!(
                    "{key}.api_key_env must be the NAME of an environment variable (letters, digits, '_'), not the key itself"
                ),
            );
        }
    }
    if p.timeout_secs == 0 {
        v.add(
            format!("{key}.timeout_secs"),
            format!("{key}.timeout_secs must be at least 1"),
        );
    }
    if !(0.0..=2.0).contains(&p.temperature) {
        v.add(
            format!("{key}.temperature"),
            format!(
                "{key}.temperature ({}) must be between 0 and 2",
                p.temperature
            ),
        );
    }
    if p.max_tokens == 0 {
        v.add(
            format!("{key}.max_tokens"),
            format!("{key}.max_tokens must be at least 1"),
        );
    }
    if p.lora_adapter
        .as_deref()
        .is_some_and(|s| s.trim().is_empty())
    {
        v.add(
            format!("{key}.lora_adapter"),
            format!("{key}.lora_adapter must not be empty when given"),
        );
    }
    if let Some(serve) = &p.serve {
        let commands = [
            ("command", Some(&serve.command)),
            ("adapter_command", serve.adapter_command.as_ref()),
        ];
        for (name, cmd) in commands {
            let Some(cmd) = cmd else { continue };
            let mut used = Vec::new();
            let checked = expand_placeholders(cmd, |n| {
                used.push(n.to_string());
                SERVE_PLACEHOLDERS.contains(&n).then(String::new)
            });
            let field = format!("{key}.serve.{name}");
            if cmd.trim().is_empty() {
                v.add(field, format!("{key}.serve.{name} must not be empty"));
            } else if let Err(e) = checked {
                v.add(
                    field,
                    format!(
                        "{key}.serve.{name}: {e}; the placeholders are {}",
                        quote_list(
                            &SERVE_PLACEHOLDERS
                                .map(|p| format!("{{{p}}}"))
                                .iter()
                                .map(String::as_str)
                                .collect::<Vec<_>>()
                        )
                    ),
                );
            } else if !used.iter().any(|u| u == "port") {
                v.add(
                    field,
                    format!("{key}.serve.{name} must use {{port}}: mass picks the port"),
                );
            } else if name == "adapter_command" && !used.iter().any(|u| u == "adapter") {
                v.add(field, format!("{key}.serve.adapter_command must use {{adapter}}, the directory of the adapter files"));
            }
        }
        if serve.start_timeout_secs == 0 {
            v.add(
                format!("{key}.serve.start_timeout_secs"),
                format!("{key}.serve.start_timeout_secs must be at least 1"),
            );
        }
        if !serve.ready_path.starts_with('/') {
            v.add(
                format!("{key}.serve.ready_path"),
                format!("{key}.serve.ready_path must start with '/'"),
            );
        }
    }
}

/// `tasks_dir` relative to the directory of `origin`.
fn resolve_tasks_dir(origin: &str, tasks_dir: &str) -> PathBuf {
    let dir = Path::new(tasks_dir);
    if dir.is_absolute() {
        return dir.to_path_buf();
    }
    match Path::new(origin).parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.join(dir),
        _ => dir.to_path_buf(),
    }
}

/// A TOML value if `value` parses as one, else the raw text as a string.
/// A backend defined on its own in a TOML file (`mass rejudge --judge
/// FILE.toml`): the file holds one `[backends.NAME]` table and nothing else,
/// written as in an experiment file. Returns NAME and the override that adds
/// it (`backends.NAME = { ... }` as an inline table), so the definition is
/// recorded in the fork by value, never as a path.
pub fn backend_override(
    text: &str,
    origin: &str,
) -> Result<(String, (String, String)), ConfigError> {
    let syntax = |line: usize, column: usize, message: String| ConfigError::Syntax {
        origin: origin.to_string(),
        line,
        column,
        message,
    };
    let mut doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let (line, column, message) = locate_toml_error(text, &e);
        syntax(line, column, message)
    })?;
    let shape = || {
        syntax(
            1,
            1,
            "a judge file defines exactly one backend, as a [backends.NAME] table, and nothing else".into(),
        )
    };
    let Some(toml::Value::Table(backends)) = doc.remove("backends") else {
        return Err(shape());
    };
    if !doc.is_empty() || backends.len() != 1 {
        return Err(shape());
    }
    let Some((name, def)) = backends.into_iter().next() else {
        return Err(shape());
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(syntax(
            1,
            1,
            format!("backend name {name:?}: use letters, digits, '_' and '-' only"),
        ));
    }
    // Checked as a backend now, so a mistake is reported against this file.
    let _: Backend = def.clone().try_into().map_err(|e: toml::de::Error| {
        syntax(
            1,
            1,
            format!("[backends.{name}]: {}", clean_serde_message(e.message())),
        )
    })?;
    let value = def.to_string();
    Ok((name.clone(), (format!("backends.{name}"), value)))
}

fn parse_override_value(value: &str) -> toml::Value {
    // Parsing `v = <value>` as a document, and insisting on exactly one key,
    // stops a value like "1\nother = 2" from injecting extra keys.
    if let Ok(mut doc) = format!("v = {value}").parse::<toml::Table>() {
        if doc.len() == 1 {
            if let Some(v) = doc.remove("v") {
                return v;
            }
        }
    }
    toml::Value::String(value.to_string())
}

#[derive(Default)]
struct Validator {
    problems: Vec<Problem>,
}

impl Validator {
    fn add(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            key: key.into(),
            message: message.into(),
        });
    }
}

/// Sets `key` (dotted) to `value` in the experiment's TOML table, creating
/// missing tables (so optional tables, e.g. a new backend's `[sim]`, can be
/// set; deserialisation afterwards rejects anything the schema does not
/// know).
fn insert_override(root: &mut toml::Table, key: &str, value: &str) -> Result<(), ConfigError> {
    let fail = |message: String| ConfigError::Override {
        key: key.to_string(),
        message,
    };
    let segments: Vec<&str> = key.split('.').map(str::trim).collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(fail("the key has an empty segment".into()));
    }
    let Some((last, parents)) = segments.split_last() else {
        return Err(fail("the key is empty".into()));
    };
    let mut table = root;
    for (depth, seg) in parents.iter().enumerate() {
        let entry = table
            .entry(seg.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            other => {
                return Err(fail(format!(
                    "{} is a {}, not a table",
                    segments[..=depth].join("."),
                    other.type_str()
                )))
            }
        };
    }
    table.insert(last.to_string(), parse_override_value(value));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICKSTART: &str = include_str!("../../examples/quickstart.toml");
    const SMOKE: &str = include_str!("../../examples/smoke.toml");

    /// The repository's examples/ folder: next to the engine crate, or (when
    /// these files are compiled from a scratch crate) the main checkout.
    fn examples_dir() -> PathBuf {
        let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        if beside.join("tasks").is_dir() {
            beside
        } else {
            PathBuf::from("/work/main/examples")
        }
    }

    const MINIMAL: &str = r#"
name = "t"
seed = 7
tasks_dir = "tasks"

[backends.sim]
kind = "sim"

[roles]
orchestrator = "sim"
judge = "sim"
optimizer = "sim"
"#;

    fn minimal() -> Experiment {
        match Experiment::parse(MINIMAL, "dir/exp.toml") {
            Ok(e) => e,
            Err(e) => panic!("minimal experiment should parse: {e}"),
        }
    }

    fn err_text(text: &str) -> String {
        match Experiment::parse(text, "exp.toml") {
            Ok(_) => panic!("expected an error for:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn example_files_load() {
        let q = Experiment::parse(QUICKSTART, "/x/examples/quickstart.toml")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q.name, "quickstart");
        assert_eq!(q.seed, 42);
        assert_eq!(q.cycles, 2);
        assert_eq!(q.concurrency, 2);
        assert_eq!(q.inner.iterations, 4);
        assert_eq!(q.outer.runs_per_task, 18);
        assert_eq!(q.outer.train_ranks, 15);
        assert_eq!(q.roles.external_judges, vec!["external".to_string()]);
        assert_eq!(q.tasks_path, PathBuf::from("/x/examples/tasks"));
        match q.backend("external") {
            Some(Backend::Sim(p)) => {
                assert_eq!(p.skill, 0.6);
                assert_eq!(p.judge_noise, 0.15);
                assert_eq!(p.blind_spot, 0.05);
                assert_eq!(p.position_bias, 0.0);
            }
            other => panic!("external backend: {other:?}"),
        }
        assert_eq!(q.trainer.kind, TrainerKind::Sim);

        let s =
            Experiment::parse(SMOKE, "/x/examples/smoke.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.cycles, 1);
        assert_eq!(s.heldout, Some(vec!["fin-bond-duration".to_string()]));
        assert_eq!(s.train.as_ref().map(Vec::len), Some(2));
        assert_eq!(s.outer.runs_per_task, 6);
        assert_eq!(s.outer.opponents_per_run, 2);
        assert_eq!(s.outer.eval_runs, 2);
    }

    #[test]
    fn example_files_load_from_disk_and_select_tasks() {
        let dir = examples_dir();
        let suite = crate::task::load_suite(&dir.join("tasks")).unwrap_or_else(|e| panic!("{e}"));
        let q = Experiment::load(&dir.join("quickstart.toml")).unwrap_or_else(|e| panic!("{e}"));
        let sel = q.select_tasks(&suite).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sel.train.len(), 9);
        assert_eq!(sel.heldout.len(), 3);
        let s = Experiment::load(&dir.join("smoke.toml")).unwrap_or_else(|e| panic!("{e}"));
        let sel = s.select_tasks(&suite).unwrap_or_else(|e| panic!("{e}"));
        let ids: Vec<&str> = sel.train.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["fin-momentum-backtest", "pha-hill-fit"]);
        assert_eq!(sel.heldout.len(), 1);
    }

    #[test]
    fn defaults_are_applied() {
        let e = minimal();
        assert_eq!(e.cycles, 1);
        assert_eq!(e.concurrency, 1);
        assert_eq!(e.inner, InnerConfig::default());
        assert_eq!(e.inner.iterations, 11);
        assert_eq!(e.inner.acceptance, Acceptance::Champion);
        assert!(e.inner.swap_positions);
        assert_eq!(e.outer, OuterConfig::default());
        assert_eq!(e.outer.prior, 0.5);
        assert_eq!(e.limits, Limits::default());
        assert_eq!(e.limits.max_tokens, 60_000);
        assert_eq!(e.trainer, TrainerConfig::default());
        assert_eq!(e.roles.subagent_backend(), "sim");
        assert_eq!(e.backend("sim"), Some(&Backend::Sim(SimConfig::default())));
        assert_eq!(e.tasks_path, PathBuf::from("dir/tasks"));
    }

    #[test]
    fn unknown_field_names_file_line_column_and_expected() {
        let text = format!("{MINIMAL}\n[inner]\niteratons = 3\n");
        let msg = err_text(&text);
        let line = text
            .lines()
            .position(|l| l.starts_with("iteratons"))
            .map(|i| i + 1)
            .unwrap_or(0);
        assert!(
            msg.starts_with(&format!(
                "exp.toml:{line}:1: unknown field \"iteratons\", expected one of \"iterations\""
            )),
            "{msg}"
        );
        assert!(msg.contains("\"acceptance\""), "{msg}");
    }

    #[test]
    fn syntax_and_type_errors_are_located() {
        let msg = err_text("name = \"x\"\nseed = \n");
        assert!(msg.starts_with("exp.toml:2:"), "{msg}");
        let msg = err_text(&MINIMAL.replace("seed = 7", "seed = -1"));
        assert!(msg.starts_with("exp.toml:3:8:"), "{msg}");
        let msg = err_text(&format!("{MINIMAL}[inner]\nacceptance = \"best\"\n"));
        assert!(msg.contains("reference-then-champion"), "{msg}");
        let msg = err_text(&MINIMAL.replace("name = \"t\"", ""));
        assert!(msg.contains("missing field \"name\""), "{msg}");
    }

    #[test]
    fn line_column_handles_unicode_and_bad_offsets() {
        let text = "ab\nçé x";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 3), (2, 1));
        // 'x' is after two 2-byte characters and a space: byte 8, column 4.
        assert_eq!(line_column(text, 8), (2, 4));
        // Inside 'ç' and past the end: clamped, no panic.
        assert_eq!(line_column(text, 4), (2, 1));
        assert_eq!(line_column(text, 1000), (2, 5));
    }

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

    #[test]
    fn semantic_errors_name_keys() {
        let text = format!(
            "{MINIMAL}\n[outer]\nruns_per_task = 12\ntrain_ranks = 15\nvalidation_ranks = 1\nopponents_per_run = 6\n"
        );
        let msg = err_text(&text);
        assert!(
            msg.contains(
                "outer.train_ranks + outer.validation_ranks (16) exceeds outer.runs_per_task (12)"
            ),
            "{msg}"
        );
        let msg = err_text(&format!(
            "{MINIMAL}\n[outer]\nruns_per_task = 7\nopponents_per_run = 3\ntrain_ranks = 5\n"
        ));
        assert!(
            msg.contains("outer.opponents_per_run (3) must be >= 1 and < runs_per_task (7)"),
            "{msg}"
        );
        assert!(msg.contains("must be even"), "{msg}");
        let msg = err_text(&MINIMAL.replace("judge = \"sim\"", "judge = \"foo\""));
        assert!(
            msg.contains(
                "roles.judge names backend \"foo\", which is not defined under [backends]"
            ),
            "{msg}"
        );
        let msg = err_text(&MINIMAL.replace(
            "tasks_dir = \"tasks\"",
            "tasks_dir = \"tasks\"\ntrain = [\"a\", \"b\"]\nheldout = [\"b\"]",
        ));
        assert!(msg.contains("train and heldout overlap (\"b\")"), "{msg}");
        let msg =
            err_text(&MINIMAL.replace("[roles]", "[backends.sim.sim]\nskill = 1.5\n\n[roles]"));
        assert!(
            msg.contains("backends.sim.sim.skill (1.5) must be between 0 and 1"),
            "{msg}"
        );
    }

    #[test]
    fn several_problems_are_reported_together() {
        let text = MINIMAL
            .replace("judge = \"sim\"", "judge = \"foo\"")
            .replace("seed = 7", "seed = 7\ncycles = 0");
        match Experiment::parse(&text, "exp.toml") {
            Err(ConfigError::Invalid { problems, .. }) => {
                let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
                assert_eq!(keys, ["cycles", "roles.judge"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn trainer_command_placeholders() {
        let base = format!("{MINIMAL}\n[trainer]\nkind = \"command\"\n");
        let msg = err_text(&base);
        assert!(msg.contains("trainer.command is required"), "{msg}");
        let msg = err_text(&format!("{base}command = \"train --data {{dataset}}\"\n"));
        assert!(msg.contains("unknown placeholder \"{dataset}\""), "{msg}");
        let msg = err_text(&format!("{base}command = \"train {{train\"\n"));
        assert!(msg.contains("unclosed"), "{msg}");
        let e = Experiment::parse(
            &format!(
                "{base}command = \"awk '{{{{print}}}}' {{train}} && lora --val {{validation}} --base {{base_model}} --out {{output_dir}} --config {{hyperparameters}}\"\n"
            ),
            "exp.toml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let args = TrainerArgs {
            train: Path::new("/d/train.jsonl"),
            validation: Path::new("/d/my val.jsonl"),
            base_model: "Qwen/Qwen3",
            output_dir: Path::new("/o"),
            hyperparameters: Path::new("/d/hp.json"),
            base_adapter: None,
        };
        let cmd = e.trainer.expand_command(&args);
        assert_eq!(
            cmd,
            Some(Ok(
                "awk '{print}' /d/train.jsonl && lora --val '/d/my val.jsonl' --base Qwen/Qwen3 --out /o --config /d/hp.json"
                    .to_string()
            ))
        );
        assert_eq!(minimal().trainer.expand_command(&args), None);
        let msg = err_text(&MINIMAL.replace("[roles]", "[trainer]\ncommand = \"x\"\n\n[roles]"));
        assert!(
            msg.contains("only applies to trainer.kind = \"command\""),
            "{msg}"
        );
    }

    #[test]
    fn overrides_apply_and_revalidate() {
        let mut e = minimal();
        e.backends
            .insert("external".into(), Backend::Sim(SimConfig::default()));
        e.apply_override("inner.iterations", "3")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.inner.iterations, 3);
        e.apply_override("roles.judge", "external")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.roles.judge, "external");
        e.apply_override("backends.sim.sim.skill", "0.6")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            e.backend("sim"),
            Some(&Backend::Sim(SimConfig {
                skill: 0.6,
                ..SimConfig::default()
            }))
        );
        e.apply_override("outer.prior", "0")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.outer.prior, 0.0);
        e.apply_override("inner.acceptance", "reference-then-champion")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.inner.acceptance, Acceptance::ReferenceThenChampion);
        e.apply_override("train", "[\"a\", \"b\"]")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.train, Some(vec!["a".to_string(), "b".to_string()]));
        // A tasks folder set by the driver (a recorded suite's checkout)
        // survives other overrides.
        e.tasks_path = PathBuf::from("/checkout");
        e.apply_override("outer.prior", "0.5")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.tasks_path, PathBuf::from("/checkout"));
        e.apply_override("tasks_dir", "other")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.tasks_path, PathBuf::from("dir/other"));
        e.apply_overrides(["roles.subagent=external", "cycles = 3"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.roles.subagent_backend(), "external");
        assert_eq!(e.cycles, 3);
    }

    #[test]
    fn bad_overrides_are_clear_and_leave_the_experiment_unchanged() {
        let mut e = minimal();
        let before = e.clone();
        let msg = |r: Result<(), ConfigError>| match r {
            Ok(()) => panic!("expected an error"),
            Err(e) => e.to_string(),
        };
        let m = msg(e.apply_override("inner.iteratons", "3"));
        assert!(
            m.starts_with("override inner.iteratons: unknown field \"iteratons\""),
            "{m}"
        );
        let m = msg(e.apply_override("bogus", "1"));
        assert!(m.contains("unknown field \"bogus\""), "{m}");
        let m = msg(e.apply_override("inner.iterations.x", "1"));
        assert!(
            m.contains("inner.iterations is a integer, not a table"),
            "{m}"
        );
        let m = msg(e.apply_override("inner.iterations", "many"));
        assert!(m.contains("invalid type"), "{m}");
        let m = msg(e.apply_override("roles.judge", "nope"));
        assert!(m.contains("roles.judge names backend \"nope\""), "{m}");
        let m = msg(e.apply_override("backends.sim.api_key", "sk-live-123"));
        assert!(m.contains("secrets never go in experiment files"), "{m}");
        assert!(!m.contains("sk-live-123"), "{m}");
        let m = msg(e.apply_override("inner..x", "1"));
        assert!(m.contains("empty segment"), "{m}");
        let m = msg(e.apply_overrides(["cycles"]));
        assert!(m.contains("expected key=value"), "{m}");
        // Injection of a second key through the value is taken as a string.
        let m = msg(e.apply_override("cycles", "1\nseed = 9"));
        assert!(m.contains("invalid type"), "{m}");
        assert_eq!(e, before);
    }

    #[test]
    fn canonical_toml_round_trips_and_is_deterministic() {
        for (text, origin) in [
            (QUICKSTART, "/x/quickstart.toml"),
            (SMOKE, "/x/smoke.toml"),
            (MINIMAL, "exp.toml"),
        ] {
            let e = Experiment::parse(text, origin).unwrap_or_else(|e| panic!("{e}"));
            let canon = e.canonical_toml();
            let again =
                Experiment::parse(&canon, origin).unwrap_or_else(|e| panic!("{e}\n{canon}"));
            assert_eq!(again, e);
            assert_eq!(again.canonical_toml(), canon);
            assert!(
                canon.contains("[inner]") && canon.contains("[limits]"),
                "{canon}"
            );
        }
        // Formatting and comments do not change the canonical form.
        let reformatted = format!("# comment\n{}", MINIMAL.replace(" = ", "="));
        let a = Experiment::parse(&reformatted, "exp.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.canonical_toml(), minimal().canonical_toml());
    }

    /// The definition leaves out how a machine runs the experiment and
    /// keeps what decides results: a `serve` table (its command picks the
    /// weights; an adapter command decides a trained model's name; attacker
    /// review: it was left out, and two experiments that train different
    /// models shared a definition). The definition parses (status reads it).
    #[test]
    fn the_definition_keeps_what_decides_results_and_drops_execution_settings() {
        let server = |extra: &str| {
            let text = format!(
                "{MINIMAL}\n[backends.server]\nkind = \"openai\"\nmodel = \"m\"\n{extra}\n"
            );
            let e = Experiment::parse(&text, "exp.toml").unwrap_or_else(|e| panic!("{e}"));
            e.definition_toml()
        };
        let base = server("base_url = \"http://a:1/v1\"");
        let executed_otherwise = server(
            "base_url = \"http://b:2/v1\"\nbase_url_env = \"U\"\napi_key_env = \"K\"\ntimeout_secs = 9\nmax_retries = 1\nmax_concurrency = 2",
        );
        assert_eq!(base, executed_otherwise);
        let mut concurrent = Experiment::parse(
            &format!("{MINIMAL}\n[backends.server]\nkind = \"openai\"\nmodel = \"m\"\nbase_url = \"http://a:1/v1\"\n"),
            "exp.toml",
        )
        .unwrap();
        concurrent.concurrency = 8;
        assert_eq!(concurrent.definition_toml(), base);
        for differs in [
            "base_url = \"http://a:1/v1\"\ntemperature = 0.1",
            "base_url = \"http://a:1/v1\"\n[backends.server.serve]\ncommand = \"serve {model} {port}\"",
            "base_url = \"http://a:1/v1\"\n[backends.server.serve]\ncommand = \"serve {model} {port}\"\nadapter_command = \"serve {adapter} {port}\"",
        ] {
            assert_ne!(server(differs), base, "{differs}");
        }
        Experiment::parse(&base, "definition").unwrap_or_else(|e| panic!("{e}\n{base}"));
        // A mass-engine/7 run names its backends as written.
        let e = Experiment::parse(
            &format!("{MINIMAL}\n[backends.server]\nkind = \"openai\"\nmodel = \"m\"\nbase_url = \"http://a:1/v1\"\n"),
            "exp.toml",
        )
        .unwrap();
        let b = &e.backends["server"];
        assert_eq!(&b.named(true), b);
        assert_eq!(b.named(false), b.definition());
        assert_ne!(b.named(false), *b);
    }

    #[test]
    fn sampling_is_per_role_with_the_old_defaults_and_checked() {
        let e = minimal();
        assert_eq!(e.sampling.team, SamplingConfig::with(0.7, 4096));
        assert_eq!(e.sampling.judge, SamplingConfig::with(0.2, 1024));
        assert_eq!(e.sampling.optimizer, SamplingConfig::with(0.8, 4096));
        let text = format!(
            "{MINIMAL}\n[sampling.judge]\ntemperature = 3.0\nmax_tokens = 0\ntop_p = 1.5\n"
        );
        let err = Experiment::parse(&text, "exp.toml")
            .map(|_| ())
            .unwrap_err()
            .to_string();
        for key in [
            "sampling.judge.temperature",
            "sampling.judge.max_tokens",
            "sampling.judge.top_p",
        ] {
            assert!(err.contains(key), "{err}");
        }
        let mut e = minimal();
        e.apply_override("sampling.team.top_p", "0.9")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.sampling.team.top_p, Some(0.9));
        e.apply_override("sampling.team.tool_choice", "write_file")
            .unwrap();
        assert_eq!(e.sampling.team.tool_choice.as_deref(), Some("write_file"));
        let err = e
            .apply_override("sampling.team.tool_choice", "rm_rf")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("must be auto, none, required or a tool name"),
            "{err}"
        );
        e.apply_override("outer.collect", "every").unwrap();
        assert_eq!(e.outer.collect, Collect::Every);
        assert!(e.apply_override("outer.collect", "some").is_err());
    }

    #[test]
    fn select_tasks_guards_heldout() {
        let dir = examples_dir().join("tasks");
        let suite = crate::task::load_suite(&dir).unwrap_or_else(|e| panic!("{e}"));
        let mut e = minimal();
        e.tasks_path = dir.clone();
        e.train = Some(vec!["fin-bond-duration".into()]);
        e.heldout = Some(vec![]);
        let m = e.select_tasks(&suite).map(|_| ()).unwrap_err().to_string();
        assert!(m.contains("split = \"heldout\""), "{m}");
        e.train = Some(vec!["no-such-task".into()]);
        let m = e.select_tasks(&suite).map(|_| ()).unwrap_err().to_string();
        assert!(m.contains("train names task \"no-such-task\""), "{m}");
        // Default train list + an explicit heldout naming a train task overlaps.
        e.train = None;
        e.heldout = Some(vec!["pha-hill-fit".into()]);
        let m = e.select_tasks(&suite).map(|_| ()).unwrap_err().to_string();
        assert!(m.contains("overlap"), "{m}");
    }
}
