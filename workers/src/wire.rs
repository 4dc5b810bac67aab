//! What goes on the store: a work item's envelope (the item and everything a
//! process elsewhere needs to execute it exactly as the coordinator would),
//! claims, attempts and results, and where each lives.
//!
//! An item is one object, `work/items/<KEY>.json`, where KEY is the BLAKE3
//! of its bytes: content-addressed by its inputs (the item's own inputs,
//! the backends as built with the adapters trained so far, the task suite's
//! tree and the root seed), so publishing the same work twice is one
//! object, and a worker refuses an item whose bytes do not hash to its key.
//! Nothing in an envelope is secret: backends name the environment
//! variables that hold keys, never the keys.

use std::collections::BTreeMap;

use engine::config::{GuardsConfig, HarnessConfig, Limits, SamplingConfig, SandboxConfig};
use engine::judge::Shown;
use engine::work::{JudgmentItem, Role, RolloutItem};
use engine::workflow::Workflow;
use ledger::Id;
use serde::{Deserialize, Serialize};

use crate::error::{Result, WorkError};

pub const ITEM_FORMAT: &str = "mass-work-item 1";
pub const CLAIM_FORMAT: &str = "mass-work-claim 1";
pub const ATTEMPT_FORMAT: &str = "mass-work-attempt 1";
pub const REFUSAL_FORMAT: &str = "mass-work-refusal 1";
pub const RESULT_FORMAT: &str = "mass-work-result 1";
pub const WORKER_FORMAT: &str = "mass-worker 1";

pub fn item_key(job: &str) -> String {
    format!("work/items/{job}.json")
}
pub fn claim_key(job: &str) -> String {
    format!("work/claims/{job}.json")
}
pub fn attempt_key(job: &str, n: u32) -> String {
    format!("work/attempts/{job}/{n:04}.json")
}
pub fn result_key(job: &str) -> String {
    format!("work/results/{job}.json")
}
/// A worker's refusal of an item it cannot read (changed on the store, or
/// written by another build).
pub fn refusal_key(job: &str, worker: &str) -> String {
    format!(
        "work/refused/{job}/{}.json",
        remote::refs::encode_name(worker)
    )
}
pub fn worker_key(name: &str) -> String {
    format!("work/workers/{}.json", remote::refs::encode_name(name))
}

/// The job name in a key under `dir` (`work/items/<job>.json` → job).
pub fn job_of(key: &str, dir: &str) -> Option<String> {
    let rest = key.strip_prefix(dir)?.strip_prefix('/')?;
    let job = rest.strip_suffix(".json")?;
    (job.len() == 64 && job.bytes().all(|b| b.is_ascii_hexdigit())).then(|| job.to_string())
}

/// A rollout item as it travels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutWire {
    pub task: String,
    pub workflow: Workflow,
    pub stream: String,
    pub purpose: String,
    pub cycle: u32,
    pub index: u32,
    pub orchestrator: Role,
    pub subagent: Role,
    pub sampling: SamplingConfig,
    pub limits: Limits,
    pub guards: GuardsConfig,
    pub sandbox: SandboxConfig,
    pub harness: HarnessConfig,
    pub method: u32,
    pub seed: u64,
}

impl RolloutWire {
    pub fn of(i: &RolloutItem) -> RolloutWire {
        RolloutWire {
            task: i.task.clone(),
            workflow: i.workflow.clone(),
            stream: i.stream.clone(),
            purpose: i.purpose.clone(),
            cycle: i.cycle,
            index: i.index,
            orchestrator: i.orchestrator.clone(),
            subagent: i.subagent.clone(),
            sampling: i.sampling.clone(),
            limits: i.rules.limits.clone(),
            guards: i.rules.guards.clone(),
            sandbox: i.rules.sandbox,
            harness: i.rules.harness.clone(),
            method: i.rules.method.version,
            seed: i.seed,
        }
    }

    pub fn item(&self) -> RolloutItem {
        RolloutItem {
            task: self.task.clone(),
            workflow: self.workflow.clone(),
            stream: self.stream.clone(),
            purpose: self.purpose.clone(),
            cycle: self.cycle,
            index: self.index,
            orchestrator: self.orchestrator.clone(),
            subagent: self.subagent.clone(),
            sampling: self.sampling.clone(),
            rules: engine::harness::RunRules {
                limits: self.limits.clone(),
                guards: self.guards.clone(),
                sandbox: self.sandbox,
                harness: self.harness.clone(),
                method: engine::config::Method {
                    version: self.method,
                },
            },
            seed: self.seed,
        }
    }
}

/// A judgment item as it travels: the two runs by their rollout events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgmentWire {
    pub task: String,
    pub stream: String,
    pub a: String,
    pub b: String,
    pub swapped: bool,
    pub judge: Role,
    pub max_retries: u32,
    pub sampling: SamplingConfig,
    pub seed: u64,
    pub shown: Shown,
}

impl JudgmentWire {
    pub fn of(i: &JudgmentItem) -> JudgmentWire {
        JudgmentWire {
            task: i.task.clone(),
            stream: i.stream.clone(),
            a: i.a.event.to_hex(),
            b: i.b.event.to_hex(),
            swapped: i.swapped,
            judge: i.judge.clone(),
            max_retries: i.max_retries,
            sampling: i.sampling.clone(),
            seed: i.seed,
            shown: i.shown,
        }
    }
}

/// One of the two kinds of item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Work {
    Rollout(Box<RolloutWire>),
    Judgment(Box<JudgmentWire>),
}

impl Work {
    pub fn stream(&self) -> &str {
        match self {
            Work::Rollout(r) => &r.stream,
            Work::Judgment(j) => &j.stream,
        }
    }
    pub fn kind(&self) -> &'static str {
        match self {
            Work::Rollout(_) => "rollout",
            Work::Judgment(_) => "judgment",
        }
    }
}

/// A trained adapter a backend serves, by its ledger object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdapterWire {
    pub backend: String,
    pub model: String,
    /// `params` (a blob the built-in simulation loads) or `dir` (a tree of
    /// adapter files a server loads).
    pub form: String,
    pub id: String,
}

/// What every item of a run at one point shares: how to build the same
/// backends and tasks elsewhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    /// The run's recorded task suite (a tree).
    pub suite: String,
    pub backends: BTreeMap<String, engine::config::Backend>,
    pub adapters: Vec<AdapterWire>,
}

/// A published work item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub format: String,
    pub work: Work,
    pub context: Context,
    /// How many attempts before the item is given up as failed.
    pub max_attempts: u32,
}

impl Envelope {
    /// The envelope's bytes and its key (their BLAKE3).
    pub fn encode(&self) -> Result<(Vec<u8>, String)> {
        let bytes = serde_json::to_vec(self).map_err(|e| WorkError::Format {
            key: "work item".into(),
            detail: e.to_string(),
        })?;
        let job = blake3::hash(&bytes).to_hex().to_string();
        Ok((bytes, job))
    }

    /// Reads the item published under `job`, refusing bytes that do not
    /// hash to it.
    pub fn decode(job: &str, bytes: &[u8]) -> Result<Envelope> {
        let key = item_key(job);
        if blake3::hash(bytes).to_hex().as_str() != job {
            return Err(WorkError::Format {
                key,
                detail: "its bytes do not hash to its name (changed or damaged on the store)"
                    .into(),
            });
        }
        let e: Envelope = parse(&key, bytes)?;
        if e.format != ITEM_FORMAT {
            return Err(WorkError::Format {
                key,
                detail: format!("format {:?}, this build reads {ITEM_FORMAT:?}", e.format),
            });
        }
        Ok(e)
    }
}

/// A claim on an item: who holds it, on which attempt, and a counter its
/// holder moves on every renewal (others see a lease expire when the
/// counter stands still for `ttl_ms` by their own clock: no clocks are
/// compared across machines).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    pub format: String,
    pub worker: String,
    /// Unique per worker process: which claim is whose, whatever the names.
    pub nonce: String,
    pub attempt: u32,
    pub beat: u64,
    pub ttl_ms: u64,
    /// The holder gave the item up after a failed attempt: the next worker
    /// takes it at once.
    pub released: bool,
}

/// One failed attempt, with its cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attempt {
    pub format: String,
    pub attempt: u32,
    pub worker: String,
    pub cause: String,
    /// Whether it counts towards the item's failures (the item's own
    /// failure does; an expired lease or an infrastructure failure does not).
    pub counts: bool,
}

/// An item's result: the streams it recorded (relative name to head) and
/// its record, or the failure that ended it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkResult {
    pub format: String,
    pub worker: String,
    pub attempt: u32,
    /// `done` or `failed`.
    pub outcome: String,
    pub heads: BTreeMap<String, String>,
    /// The `mass.rollout` or `mass.judgment` event (empty when failed).
    pub event: String,
    /// Every failed attempt's line (`attempt N (WORKER): CAUSE`).
    pub attempts: Vec<String>,
}

/// Why a worker refused an item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    pub format: String,
    pub worker: String,
    pub reason: String,
}

/// A worker's heartbeat, for `mass status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerBeat {
    pub format: String,
    pub worker: String,
    pub slots: u32,
    /// Wall-clock milliseconds of this beat, by the worker's clock.
    pub at_ms: u64,
    pub running: Vec<String>,
    pub done: u64,
    pub failed: u64,
    pub duplicates: u64,
}

pub fn parse<T: for<'de> Deserialize<'de>>(key: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| WorkError::Format {
        key: key.to_string(),
        detail: e.to_string(),
    })
}

pub fn to_bytes<T: Serialize>(v: &T) -> bytes::Bytes {
    // Plain structs of strings and numbers always serialise.
    bytes::Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

/// A hex id from a record on the store.
pub fn id_of(key: &str, hex_id: &str) -> Result<Id> {
    remote::refs::parse_id(hex_id).ok_or_else(|| WorkError::Format {
        key: key.to_string(),
        detail: format!("{hex_id:?} is not an object id"),
    })
}

/// Wall-clock milliseconds (for heartbeats shown to people, never for
/// deciding a lease).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
