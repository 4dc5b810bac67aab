//! An external agent harness as the team (`[harness] kind = "external"`):
//! one run of an outside program (Qwen Code, OpenHands, an in-house agent)
//! per rollout, in the rollout's workspace, inside the sandbox, its model
//! traffic sent through a recording proxy into the rollout's `wire` stream.
//! The run is one journaled `harness` effect on the orchestrator's stream
//! (the command template, the prompt, the initial tree; out: the exit
//! status, capped output, the final tree and the range of wire events it
//! produced), so replays, resumes, re-judges and forks never run the program
//! again. The wire traffic is split into conversations by content (each
//! request extends the longest earlier one: a chain per agent, whatever order
//! background subagents interleave in): the chain the first request starts is
//! the orchestrator's, the others are subagents', which is what the dataset
//! trains on. `reexecute` runs a recorded rollout's program again against its
//! recording, upstream-free, and says whether workspace and traffic repeat.
//!
//! Where things live: the recorded request and result here; the recording
//! side in `record.rs`, how the program is started (route, command line,
//! confinement) in `invoke.rs`, the traffic split into conversations in
//! `conversations.rs`, re-execution in `reexecute.rs` and the directories
//! it takes in `places.rs`. The public items are re-exported here.

use std::collections::BTreeMap;

use ledger::Id;
use serde_json::{json, Value};

use crate::config::HarnessConfig;

mod conversations;
mod invoke;
mod places;
mod record;
mod reexecute;

pub use conversations::{conversations, Conversations};
pub use invoke::PROXY_PORT;
pub use record::run;
pub use reexecute::{reexecute, Reexecution};

/// The `harness` effect's request (SCHEMAS.md, "External harness"): the
/// recorded template and settings, everything a re-execution needs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct HarnessRequest {
    harness: String,
    command: String,
    env: BTreeMap<String, String>,
    pass_env: Vec<String>,
    readable: Vec<String>,
    timeout_secs: u64,
    limits: Option<sandbox::Limits>,
    normalise: proxy::NormaliseConfig,
    sandbox: crate::config::SandboxConfig,
    output_bytes: u64,
    model: String,
    /// Blob id of the prompt.
    prompt: String,
    /// The initial workspace tree.
    tree: String,
    /// The wire stream (relative name).
    wire: String,
    /// The task declared network access (`network = true` in `task.toml`):
    /// the program ran on the host network, its proxy route on loopback
    /// TCP. Absent (false) otherwise: its own network namespace, the route
    /// reached through a forwarded port only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    network: bool,
}

impl HarnessRequest {
    fn config(&self) -> HarnessConfig {
        HarnessConfig {
            kind: crate::config::HarnessKind::External,
            command: self.command.clone(),
            env: self.env.clone(),
            pass_env: self.pass_env.clone(),
            readable: self.readable.clone(),
            timeout_secs: self.timeout_secs,
            limits: self.limits,
            normalise: self.normalise.clone(),
        }
    }
}

/// What the harness effect recorded.
#[derive(Debug, Clone)]
pub struct HarnessRun {
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub tree: Id,
    /// The wire stream's head before and after the run.
    pub wire_from: Option<Id>,
    pub wire_to: Option<Id>,
    /// Where the program was told its workspace and home are: their fixed
    /// places at `Level::Full` (the same in every run), the host's paths
    /// below it (recorded so a re-execution can run there: the recorded
    /// prompts name them).
    pub workspace: String,
    pub home: String,
}

impl HarnessRun {
    fn to_value(&self) -> Value {
        json!({
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "tree": self.tree.to_hex(),
            "wire_from": self.wire_from.map(|i| i.to_hex()),
            "wire_to": self.wire_to.map(|i| i.to_hex()),
            "workspace": self.workspace,
            "home": self.home,
        })
    }

    fn from_value(v: &Value) -> Option<HarnessRun> {
        let id = |k: &str| v[k].as_str().and_then(|s| s.parse::<Id>().ok());
        Some(HarnessRun {
            exit_code: v["exit_code"].as_i64().map(|c| c as i32),
            timed_out: v["timed_out"].as_bool().unwrap_or(false),
            stdout: v["stdout"].as_str().unwrap_or_default().to_string(),
            stderr: v["stderr"].as_str().unwrap_or_default().to_string(),
            tree: id("tree")?,
            wire_from: id("wire_from"),
            wire_to: id("wire_to"),
            workspace: v["workspace"].as_str().unwrap_or_default().to_string(),
            home: v["home"].as_str().unwrap_or_default().to_string(),
        })
    }
}
