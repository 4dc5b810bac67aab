//! `[sandbox]`, `[guards]` and `[harness]`: how a team run is confined, what
//! is checked on its final workspace against tampering, and who plays it
//! (the built-in orchestrator or an external agent program). They sit
//! together because they decide how a run is carried out, not what the
//! MASS method does with it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    /// Show the hidden checks' output to the self-judge as well (a safeguard
    /// experiment: verification instead of MASS's self-supervision). Off by
    /// default, and then left out of the definition.
    #[serde(skip_serializing_if = "is_false")]
    pub judge_sees_checks: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Default for GuardsConfig {
    fn default() -> Self {
        GuardsConfig {
            action: GuardAction::Exclude,
            max_changed_files: 200,
            max_changed_bytes: 16 << 20,
            judge_sees_checks: false,
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
    /// recorded through the proxy (`harness/external/`).
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
    pub normalise: proxy::NormaliseConfig,
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
            normalise: proxy::NormaliseConfig::default(),
        }
    }
}

impl HarnessConfig {
    pub fn is_builtin(&self) -> bool {
        *self == HarnessConfig::default()
    }
}
