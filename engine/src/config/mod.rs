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
//!
//! The module is split by concern: `backend` (the `[backends.NAME]` tables
//! and their on-disk shape), `harness` (`[sandbox]`, `[guards]` and
//! `[harness]`: how a team run is played and confined), `trainer` (the
//! `[trainer]` table and its command placeholders), `validate` (the
//! semantic checks), `overrides` (`key=value` overrides and judge files)
//! and `selection` (the train and held-out tasks picked from a suite). Every
//! public item is re-exported here, so `engine::config::X` names it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::toml_error::locate_toml_error;

mod backend;
mod harness;
mod method;
mod overrides;
mod selection;
mod trainer;
mod validate;

pub use backend::{
    AdapterApi, Backend, BackendKind, OpenAiParams, ServeParams, SimConfig, StructuredOutput,
    DEFINITION_URL, SERVE_PLACEHOLDERS,
};
pub use harness::{GuardAction, GuardsConfig, HarnessConfig, HarnessKind, SandboxConfig};
pub use method::Method;
pub use overrides::backend_override;
pub use selection::TaskSelection;
pub use trainer::{
    expand_placeholders, shell_quote, TrainerArgs, TrainerConfig, TrainerKind, TRAINER_PLACEHOLDERS,
};

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
    /// What the recording driver means by the method (not part of the
    /// definition): the current one for a new run.
    #[serde(skip)]
    pub method: Method,
}

fn default_one() -> u32 {
    1
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
    /// Judge each pair a second time with A/B swapped, so rankings do not
    /// follow the order runs are shown in (every shipped example sets it;
    /// `mass report` shows each task's position bias). Off when left out:
    /// recorded runs parse their files with today's defaults, and files
    /// written before it meant off.
    pub swap_positions: bool,
    pub max_verdict_retries: u32,
    /// Held-out runs per task and model for the evaluation (bare task).
    pub eval_runs: u32,
    /// Runs per training task and model for the training-task win rate
    /// (bare task; 0 = not measured).
    pub eval_train_runs: u32,
    /// Judgments per evaluated pair by each evaluating judge (the external
    /// judges and the run's own; the articles take 6), each in a random A/B
    /// order drawn from the run's seed (alternating in runs of
    /// `mass-engine/8` and earlier).
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

// ---------------------------------------------------------------------------
// Loading and the canonical forms

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

/// Names as a comma-separated list of double-quoted strings, for messages.
fn quote_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICKSTART: &str = include_str!("../../../examples/quickstart.toml");
    const SMOKE: &str = include_str!("../../../examples/smoke.toml");

    /// The repository's examples/ folder: next to the engine crate, or (when
    /// these files are compiled from a scratch crate) the main checkout.
    pub(super) fn examples_dir() -> PathBuf {
        let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        if beside.join("tasks").is_dir() {
            beside
        } else {
            PathBuf::from("/work/main/examples")
        }
    }

    pub(super) const MINIMAL: &str = r#"
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

    pub(super) fn minimal() -> Experiment {
        match Experiment::parse(MINIMAL, "dir/exp.toml") {
            Ok(e) => e,
            Err(e) => panic!("minimal experiment should parse: {e}"),
        }
    }

    pub(super) fn err_text(text: &str) -> String {
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
    fn serve_commands_and_adapter_apis_are_checked() {
        let parse = |serve: &str| {
            let text = format!(
                "{MINIMAL}\n[backends.server]\nkind = \"openai\"\nmodel = \"m\"\nbase_url = \"http://a:1/v1\"\n[backends.server.serve]\n{serve}\n"
            );
            Experiment::parse(&text, "exp.toml").map_err(|e| e.to_string())
        };
        for (serve, says) in [
            ("command = \"serve {model}\"", "command must use {port}"),
            (
                "command = \"s {port}\"\nadapter_command = \"s {port}\"",
                "adapter_command must use {adapter}",
            ),
            (
                "command = \"s {port} {loras}\"",
                "only adapter_api = \"llama-cpp\" fills",
            ),
            (
                "command = \"s {port}\"\nadapter_api = \"llama-cpp\"",
                "must use {loras} with adapter_api = \"llama-cpp\"",
            ),
            (
                "command = \"s {port}\"\nadapter_command = \"s {port} {adapter} {loras}\"",
                "adapter_command cannot use {loras}",
            ),
            (
                "command = \"s {port}\"\nadapter_command = \"s {port} {adapter}\"\nadapter_api = \"vllm\"",
                "adapter_command is not used with adapter_api",
            ),
            (
                "command = \"s {port} {loras}\"\nadapter_api = \"llama-cpp\"\nadapter_file = \"../x.gguf\"",
                "adapter_file must be a relative path inside",
            ),
            (
                "command = \"s {port}\"\nadapter_api = \"vllm\"\nadapter_file = \"a.gguf\"",
                "adapter_file is used only with adapter_api = \"llama-cpp\"",
            ),
        ] {
            let err = parse(serve).expect_err(serve);
            assert!(err.contains(says), "{serve}: {err}");
        }
        let e = parse("command = \"s {port} {loras}\"\nadapter_api = \"llama-cpp\"").unwrap();
        let serve = match &e.backends["server"] {
            Backend::OpenAi(p) => p.serve.clone().unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(serve.adapter_api, Some(AdapterApi::LlamaCpp));
        assert_eq!(serve.adapter_file(), "adapter.gguf");
        // An external harness sends its own requests: it could select no
        // adapter of llama.cpp's, so the pairing is refused up front.
        let external = |api: &str| {
            let text = format!(
                "name = \"t\"\nseed = 7\ntasks_dir = \"tasks\"\n[backends.server]\nkind = \"openai\"\nmodel = \"m\"\nbase_url = \"http://a:1/v1\"\n[backends.server.serve]\n{api}\n[roles]\norchestrator = \"server\"\njudge = \"server\"\noptimizer = \"server\"\n[harness]\nkind = \"external\"\ncommand = \"agent {{prompt_file}}\"\n"
            );
            Experiment::parse(&text, "exp.toml").map_err(|e| e.to_string())
        };
        let err = external("command = \"s {port} {loras}\"\nadapter_api = \"llama-cpp\"")
            .expect_err("refused");
        assert!(
            err.contains("harness.kind = \"external\" cannot call the adapters"),
            "{err}"
        );
        external("command = \"s {port}\"\nadapter_command = \"s {port} {adapter}\"")
            .unwrap_or_else(|e| panic!("{e}"));
        // Absent keys stay out of the definition: older experiments keep their ids.
        let plain = parse("command = \"s {port}\"").unwrap().definition_toml();
        assert!(
            !plain.contains("adapter_file") && !plain.contains("adapter_api"),
            "{plain}"
        );
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
}
