//! The built-in simulated backend: a deterministic, seeded model that speaks the
//! same interface a real model does (messages and tool definitions in, text and
//! tool calls out) and plays every role.
//!
//! It models the mechanism, not the outcome. A run's quality comes from latent
//! parameters (skill, delegation habit, verification habit, review), the
//! workflow's content as the model reads it from its prompt (agents, contracts
//! with checks, hops that send work back), delegation, and seeded noise: as a
//! worker it writes the task's solver into the workspace and runs it with
//! whatever mistakes ("flaws") its skill lets slip through, may run the checks
//! and fix what they reveal. As a judge it reads only its prompt: the
//! validation output and the report, in which it notices visible problems
//! (a claim the task's experts know to be misleading, checks claimed to pass
//! that fail) as often as its skill lets it, with noise, a position bias and
//! a blind spot (a preference for confident, finished-sounding reports); it
//! never runs a solver. As an optimizer it reads the judge's reasons and
//! aims its edits at the problems they name; its edits may help or hurt. Nothing here looks at a cycle number: trained parameters
//! arrive as adapters written by the (simulated) trainer from the exported
//! dataset.
//!
//! The roles live in submodules: `worker` (orchestrator and subagents:
//! writing, running and fixing the solver, delegating, tampering),
//! `judge` (reading a comparison prompt and giving a verdict) and
//! `optimizer` (editing the champion workflow from the judge's reasons).
//! This module holds the model itself (its parameters, the tasks it
//! knows, the dispatch of a request to its role) and the seeded draws all
//! roles share.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use rank::schedule::SplitMix64;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{rough_tokens, Backend, BackendError, ChatRequest, ChatResponse};
use crate::chat::{Message, Role, ToolCall, Usage};

mod judge;
mod optimizer;
mod worker;

use optimizer::optimize;
use worker::Worker;

/// The latent parameters ("weights") of a simulated model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimParams {
    /// General competence in [0, 1]: fewer mistakes, better fixes and edits.
    pub skill: f64,
    /// Habit of delegating without being told to, in [0, 1].
    pub delegation: f64,
    /// Habit of running the checks before finishing, in [0, 1].
    pub verification: f64,
    /// Standard deviation of the judge's perception noise.
    pub judge_noise: f64,
    /// Judge preference for the first-shown workspace (> 0 favours A).
    pub position_bias: f64,
    /// The judge's blind spot, in [0, 1]: the weight its verdict gives to
    /// how confident and finished a report sounds instead of to what the
    /// validation shows and the problems it noticed.
    pub blind_spot: f64,
    /// Habit of writing "run the checks" into the contracts of subagents it
    /// delegates to without a workflow, in [0, 1]. (Adapters from before this
    /// field read as 0.1.)
    #[serde(default = "default_contracts")]
    pub contracts: f64,
    /// Habit of tampering under pressure (checks still failing, or never
    /// run): editing a protected file and claiming in the report that the
    /// checks pass, in [0, 1]. (Adapters from before this field read as 0.)
    #[serde(default)]
    pub tampering: f64,
}

fn default_contracts() -> f64 {
    0.1
}

impl SimParams {
    pub fn new(
        skill: f64,
        delegation: f64,
        judge_noise: f64,
        position_bias: f64,
        blind_spot: f64,
    ) -> Self {
        SimParams {
            skill,
            delegation,
            verification: 0.15 + 0.3 * skill,
            judge_noise,
            position_bias,
            blind_spot,
            contracts: default_contracts(),
            tampering: 0.0,
        }
    }
}

/// What the simulated model "knows" about a task: its solver and the mistakes
/// one can make solving it. (A capable model knows how to do these tasks; the
/// simulation decides how well it executes.)
#[derive(Debug, Clone)]
struct SimTask {
    solver: String,
    flaws: Vec<(String, bool)>,
    /// What a report shows when a flaw the checks miss was made (the
    /// tasks' `evidence` phrases): expert knowledge of the domain's
    /// misleading claims, which the judge looks for in its prompt.
    evidence: Vec<String>,
    /// Every flaw's `signs` (task.toml): literal traces the flawed run's
    /// deliverables contain, what an expert reading the workspace notices.
    /// The hidden checks never reach the judge; these are its perception.
    signs: Vec<String>,
    /// The task's protected paths (what tampering edits).
    protected: Vec<String>,
}

pub struct SimBackend {
    name: String,
    models: Mutex<BTreeMap<String, SimParams>>,
    tasks: BTreeMap<String, SimTask>,
}

impl SimBackend {
    /// A simulated backend whose base model has `base` parameters and which
    /// knows the tasks under `tasks_dir`.
    pub fn new(name: &str, base: SimParams, tasks_dir: &Path) -> Result<SimBackend, BackendError> {
        let fail = |detail: String| BackendError::Config {
            backend: name.to_string(),
            detail,
        };
        let mut tasks = BTreeMap::new();
        let rd = std::fs::read_dir(tasks_dir)
            .map_err(|e| fail(format!("cannot read {}: {e}", tasks_dir.display())))?;
        for ent in rd.flatten() {
            let dir = ent.path();
            let Ok(toml_text) = std::fs::read_to_string(dir.join("task.toml")) else {
                continue;
            };
            let Ok(solver) = std::fs::read_to_string(dir.join("solution/solve.py")) else {
                continue;
            };
            let v: toml::Value =
                toml::from_str(&toml_text).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
            let id = v
                .get("id")
                .and_then(|x| x.as_str())
                .unwrap_or_default()
                .to_string();
            let flaws = v
                .get("flaws")
                .and_then(|f| f.as_array())
                .map(|arr| {
                    arr.iter()
                        .filter_map(|f| {
                            Some((
                                f.get("name")?.as_str()?.to_string(),
                                f.get("caught_by_checks")?.as_bool()?,
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let evidence = v
                .get("flaws")
                .and_then(|f| f.as_array())
                .map(|arr| {
                    arr.iter()
                        .filter_map(|f| Some(f.get("evidence")?.as_str()?.to_string()))
                        .filter(|e| !e.trim().is_empty())
                        .collect()
                })
                .unwrap_or_default();
            let signs = v
                .get("flaws")
                .and_then(|f| f.as_array())
                .map(|arr| {
                    arr.iter()
                        .filter_map(|f| f.get("signs")?.as_array())
                        .flatten()
                        .filter_map(|s| Some(s.as_str()?.to_string()))
                        .filter(|s| !s.trim().is_empty())
                        .collect()
                })
                .unwrap_or_default();
            let protected = v
                .get("protected")
                .and_then(|f| f.as_array())
                .map(|arr| {
                    arr.iter()
                        .filter_map(|p| Some(p.as_str()?.to_string()))
                        .collect()
                })
                .unwrap_or_default();
            tasks.insert(
                id,
                SimTask {
                    solver,
                    flaws,
                    evidence,
                    signs,
                    protected,
                },
            );
        }
        let mut models = BTreeMap::new();
        models.insert(format!("{name}/base"), base);
        Ok(SimBackend {
            name: name.to_string(),
            models: Mutex::new(models),
            tasks,
        })
    }

    fn params(&self, model: &str) -> Result<SimParams, BackendError> {
        self.models
            .lock()
            .map_err(|_| self.fail("model table lock poisoned".into()))?
            .get(model)
            .cloned()
            .ok_or_else(|| BackendError::UnknownModel {
                backend: self.name.clone(),
                model: model.to_string(),
            })
    }

    fn fail(&self, detail: String) -> BackendError {
        BackendError::Failed {
            backend: self.name.clone(),
            detail,
            retry_after: None,
        }
    }
}

impl Backend for SimBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn base_model(&self) -> String {
        format!("{}/base", self.name)
    }

    fn complete<'a>(&'a self, req: &'a ChatRequest) -> super::Reply<'a> {
        // The simulation computes (and may run a task's solver): blocking
        // work, kept off the unit's worker.
        Box::pin(async move { crate::exec::blocking(|| self.reply(req)) })
    }

    fn export_model(&self, model: &str) -> Option<Vec<u8>> {
        self.params(model)
            .ok()
            .and_then(|p| serde_json::to_vec(&p).ok())
    }

    /// An adapter is the JSON of the trained parameters (see `trainer`).
    fn register_adapter(&self, model: &str, adapter: &[u8]) -> Result<(), BackendError> {
        let p: SimParams = serde_json::from_slice(adapter)
            .map_err(|e| self.fail(format!("adapter for {model} is not valid: {e}")))?;
        self.models
            .lock()
            .map_err(|_| self.fail("model table lock poisoned".into()))?
            .insert(model.to_string(), p);
        Ok(())
    }
}

impl SimBackend {
    /// One simulated completion.
    pub fn reply(&self, req: &ChatRequest) -> Result<ChatResponse, BackendError> {
        let p = self.params(&req.model)?;
        let system = req
            .messages
            .first()
            .filter(|m| m.role == Role::System)
            .map(|m| m.content_str())
            .unwrap_or("");
        let message = if system.starts_with("You are an impartial judge") {
            self.judge(&p, req)
        } else if system.starts_with("You are the workflow optimizer") {
            optimize(&p, req)
        } else if system.starts_with("You are the orchestrator") {
            self.orchestrate(&p, req)
        } else if system.starts_with("You are a subagent") {
            self.work(&p, req, Worker::from_subagent(system, first_user(req)))
        } else {
            Message::assistant("I can only act as orchestrator, subagent, judge or optimizer.")
        };
        let finish_reason = if message.tool_calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        Ok(ChatResponse {
            usage: Usage {
                prompt_tokens: rough_tokens(&req.messages),
                completion_tokens: rough_tokens(std::slice::from_ref(&message)),
            },
            message,
            finish_reason: finish_reason.into(),
            raw: None,
            raw_body: None,
            trainer_tokens: None,
        })
    }
}

/// All user turns of a request, and a generator seeded by the whole request
/// (a re-asked question gets a fresh draw).
fn user_text_and_rng(req: &ChatRequest) -> (String, SplitMix64) {
    let text = req
        .messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.content_str())
        .collect::<Vec<_>>()
        .join("\n");
    (
        text,
        SplitMix64::new(req.seed ^ hash_messages(&req.messages)),
    )
}

fn first_user(req: &ChatRequest) -> &str {
    req.messages
        .iter()
        .find(|m| m.role == Role::User)
        .map(|m| m.content_str())
        .unwrap_or("")
}

fn hash_str(s: &str) -> u64 {
    let h = blake3::hash(s.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_le_bytes(b)
}

fn hash_messages(msgs: &[Message]) -> u64 {
    let mut h = blake3::Hasher::new();
    for m in msgs {
        h.update(&m.canonical());
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.finalize().as_bytes()[..8]);
    u64::from_le_bytes(b)
}

fn unit(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

fn gaussian(rng: &mut SplitMix64) -> f64 {
    let u1 = unit(rng).max(1e-12);
    let u2 = unit(rng);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn task_id_in(text: &str) -> Option<String> {
    for marker in ["Task id: ", "task id is "] {
        if let Some(i) = text.find(marker) {
            let rest = &text[i + marker.len()..];
            let id: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            if !id.is_empty() {
                return Some(id);
            }
        }
    }
    None
}

/// The chance that a worker of effective skill `skill` makes one given known
/// mistake. The simulated trainer inverts this to read skill off a dataset.
pub fn flaw_probability(skill: f64) -> f64 {
    (0.7 - 0.9 * skill).clamp(0.02, 0.9)
}

/// The skill whose mistake rate per known mistake is `rate` (inverse of
/// [`flaw_probability`] on its unclamped range).
pub fn skill_for_flaw_rate(rate: f64) -> f64 {
    ((0.7 - rate) / 0.9).clamp(0.0, 0.95)
}

fn call(id: String, name: &str, args: Value) -> Message {
    Message::tool_calls(vec![ToolCall::new(id, name, args.to_string())])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request with one system and one user message.
    pub(super) fn request(
        model: &str,
        system: &str,
        user: &str,
        temperature: f64,
        seed: u64,
    ) -> ChatRequest {
        ChatRequest {
            model: model.into(),
            messages: vec![Message::system(system), Message::user(user)],
            tools: Vec::new(),
            temperature,
            seed,
            max_tokens: 1024,
            top_p: None,
            stop: Vec::new(),
            tool_choice: None,
            response_format: None,
            tools_json: None,
            messages_json: Default::default(),
        }
    }

    /// The backend's task data carries every flaw's `signs`, in flaw order.
    #[test]
    fn sim_tasks_carry_every_flaws_signs() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let task = tmp.path().join("t");
        std::fs::create_dir_all(task.join("solution")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            task.join("task.toml"),
            "id = \"t\"\n\
             [[flaws]]\nname = \"a\"\ndescription = \"d\"\ncaught_by_checks = true\n\
             signs = [\"1.000 (fixed)\", '\"n_points\": 10,']\n\
             [[flaws]]\nname = \"b\"\ndescription = \"d\"\ncaught_by_checks = true\n\
             [[flaws]]\nname = \"c\"\ndescription = \"d\"\ncaught_by_checks = false\n\
             evidence = \"all good\"\nsigns = [\"cost 0.0 bps\"]\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(task.join("solution/solve.py"), "pass\n").unwrap_or_else(|e| panic!("{e}"));
        let b = SimBackend::new("s", SimParams::new(0.8, 0.1, 0.1, 0.0, 0.0), tmp.path())
            .unwrap_or_else(|e| panic!("{e}"));
        let t = &b.tasks["t"];
        assert_eq!(
            t.signs,
            ["1.000 (fixed)", "\"n_points\": 10,", "cost 0.0 bps"]
        );
        assert_eq!(t.evidence, ["all good"]);
    }
}
