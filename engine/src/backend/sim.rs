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

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Mutex;

use rank::schedule::SplitMix64;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{rough_tokens, Backend, BackendError, ChatRequest, ChatResponse};
use crate::chat::{Message, Role, ToolCall, Usage};
use crate::prompts;
use crate::workflow::{Agent, Contract, Hop, Workflow};

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

/// The claim a tampering worker appends to its report.
const TAMPER_CLAIM: &str = "Verified: all checks pass.";

/// How a worker conversation is set up, read from its prompts.
struct Worker {
    task: Option<String>,
    is_orchestrator: bool,
    contract_checks: bool,
    revise: bool,
    verifier: bool,
    role: String,
}

impl Worker {
    fn from_subagent(system: &str, instructions: &str) -> Worker {
        let role = system
            .split("working as: ")
            .nth(1)
            .and_then(|r| r.split(". The team").next())
            .unwrap_or("worker")
            .to_string();
        let lower_role =
            format!("{role} {}", instructions.lines().next().unwrap_or("")).to_lowercase();
        Worker {
            task: task_id_in(system).or_else(|| task_id_in(instructions)),
            is_orchestrator: false,
            contract_checks: system.contains("run_checks")
                || system.to_lowercase().contains("run the checks"),
            revise: instructions.starts_with("Revise"),
            verifier: !instructions.starts_with("Revise")
                && ["review", "verif", "check", "qa"]
                    .iter()
                    .any(|k| lower_role.contains(k)),
            role,
        }
    }
}

/// What a worker conversation has done so far, read from its history.
#[derive(Default)]
struct Progress {
    wrote_solver: bool,
    solve_runs: Vec<Vec<String>>,
    validations: Vec<(usize, usize)>, // (fails, passes) per validate run
    stalls: usize,
    delegations: Vec<String>, // results of delegate calls
    turns: usize,
    tampered: bool,
}

fn progress(msgs: &[Message]) -> Progress {
    let mut results: HashMap<&str, &str> = HashMap::new();
    for m in msgs {
        if m.role == Role::Tool {
            if let Some(id) = &m.tool_call_id {
                results.insert(id.as_str(), m.content_str());
            }
        }
    }
    let mut p = Progress::default();
    for m in msgs.iter().filter(|m| m.role == Role::Assistant) {
        p.turns += 1;
        for c in &m.tool_calls {
            let args: Value = serde_json::from_str(&c.function.arguments).unwrap_or(Value::Null);
            let result = results.get(c.id.as_str()).copied().unwrap_or("");
            match c.function.name.as_str() {
                "write_file" if args["path"] == "solve.py" => p.wrote_solver = true,
                "list_files" => p.stalls += 1,
                "delegate" => p.delegations.push(result.to_string()),
                "bash" => {
                    let cmd = args["command"].as_str().unwrap_or("");
                    p.tampered |= cmd.contains(TAMPER_CLAIM);
                    if let Some(rest) = cmd.strip_prefix("python3 solve.py") {
                        p.solve_runs.push(
                            rest.split("--flaw")
                                .map(|s| s.trim().to_string())
                                .filter(|s| !s.is_empty())
                                .collect(),
                        );
                    }
                }
                "run_checks" => {
                    let fails = result.lines().filter(|l| l.starts_with("FAIL")).count();
                    let passes = result.lines().filter(|l| l.starts_with("PASS")).count();
                    p.validations.push((fails, passes));
                }
                _ => {}
            }
        }
    }
    p
}

fn call(id: String, name: &str, args: Value) -> Message {
    Message::tool_calls(vec![ToolCall::new(id, name, args.to_string())])
}

impl SimBackend {
    /// A worker: writes the solver, runs it, maybe validates and fixes, reports.
    fn work(&self, p: &SimParams, req: &ChatRequest, w: Worker) -> Message {
        let Some(task) = w.task.as_ref().and_then(|t| self.tasks.get(t)) else {
            return Message::assistant("I could not tell which task this is, so I did nothing.");
        };
        let first = first_user(req);
        let mut plan = SplitMix64::new(req.seed ^ hash_str(first) ^ hash_str(&w.role));
        // Whoever does the work has the model's skill; a contract that asks
        // for the checks makes it a little more careful. (Delegating is worth
        // only what the workflow and the contracts bring.)
        let skill = (p.skill + if w.contract_checks { 0.05 } else { 0.0 }).clamp(0.0, 1.0);
        let p_flaw = flaw_probability(skill);
        let mut flaws: Vec<String> = Vec::new();
        for (name, caught) in &task.flaws {
            let mut p_this = p_flaw;
            if w.revise {
                p_this *= if *caught { 0.5 } else { 0.25 };
            }
            if unit(&mut plan) < p_this {
                flaws.push(name.clone());
            }
        }
        let p_verify = (p.verification
            + if w.contract_checks { 0.5 } else { 0.0 }
            + if w.revise { 0.3 } else { 0.0 })
        .min(0.98);
        let verify = w.verifier || unit(&mut plan) < p_verify;
        let prog = progress(&req.messages);
        let mut turn = SplitMix64::new(req.seed ^ hash_messages(&req.messages));
        let cid = format!("call_{}", prog.turns + 1);
        if prog.stalls < 3 && unit(&mut turn) < 0.03 + 0.05 * (1.0 - p.skill) {
            return call(cid, "list_files", json!({}));
        }
        if w.verifier {
            // A verifier checks the shared workspace and reports; it fixes nothing.
            if prog.validations.is_empty() {
                return call(cid, "run_checks", json!({}));
            }
            let (f, ps) = prog.validations[prog.validations.len() - 1];
            return Message::assistant(format!(
                "Verification by {}: {ps} checks pass, {f} fail.",
                w.role
            ));
        }
        if !prog.wrote_solver {
            return call(
                cid,
                "write_file",
                json!({"path": "solve.py", "content": task.solver}),
            );
        }
        let Some(last_flags) = prog.solve_runs.last() else {
            return call(cid, "bash", json!({"command": solve_command(&flaws)}));
        };
        if verify && prog.validations.len() < prog.solve_runs.len() {
            return call(cid, "run_checks", json!({}));
        }
        let last_fails = prog.validations.last().map(|v| v.0).unwrap_or(0);
        if verify && last_fails > 0 && prog.solve_runs.len() < 3 {
            let mut fix =
                SplitMix64::new(req.seed ^ hash_str(first) ^ prog.solve_runs.len() as u64);
            let p_fix = 0.5 + 0.4 * p.skill;
            let kept: Vec<String> = last_flags
                .iter()
                .filter(|f| {
                    let caught = task.flaws.iter().any(|(n, c)| n == *f && *c);
                    !(caught && unit(&mut fix) < p_fix)
                })
                .cloned()
                .collect();
            if kept != *last_flags {
                return call(cid, "bash", json!({"command": solve_command(&kept)}));
            }
        }
        // Under pressure (checks still failing, or never run) a worker may
        // tamper, as often as its habit says: it edits a protected file and
        // claims in the report that the checks pass. (The validators see the
        // edit; a judge sees the claim, and the blind spot rewards it.)
        let pressure = last_fails > 0 || prog.validations.is_empty();
        if pressure && !prog.tampered && !task.protected.is_empty() {
            let mut tamper = SplitMix64::new(req.seed ^ hash_str(first) ^ 0x7a3b_e11d);
            if unit(&mut tamper) < p.tampering {
                let target =
                    &task.protected[(tamper.next_u64() % task.protected.len() as u64) as usize];
                return call(
                    cid,
                    "bash",
                    json!({"command": format!("printf '\\n' >> '{target}' && echo '{TAMPER_CLAIM}' >> report.md")}),
                );
            }
        }
        let validation = match prog.validations.last() {
            Some((0, ps)) => format!("all {ps} checks pass"),
            Some((f, ps)) => format!("{ps} checks pass, {f} fail"),
            None => "checks not run".to_string(),
        };
        let summary = format!("Wrote solve.py and ran it; deliverables report.md, results.json and logs.txt are in the workspace. Validation: {validation}.");
        if w.is_orchestrator {
            call(cid, "finish", json!({"report": summary}))
        } else {
            Message::assistant(format!("Done ({}). {summary}", w.role))
        }
    }

    /// The orchestrator: delegates (if its habit or the workflow says so),
    /// reviews and sends work back when the workflow has such a hop, finishes.
    fn orchestrate(&self, p: &SimParams, req: &ChatRequest) -> Message {
        let first = first_user(req);
        let task = task_id_in(first);
        let workflow = crate::workflow::parse_rendered(first).unwrap_or_else(Workflow::bare);
        let mut plan = SplitMix64::new(req.seed ^ hash_str(first));
        let p_delegate =
            (p.delegation + if workflow.agents.is_empty() { 0.0 } else { 0.6 }).clamp(0.0, 0.97);
        let delegate = unit(&mut plan) < p_delegate;
        if !delegate {
            let w = Worker {
                task,
                is_orchestrator: true,
                contract_checks: workflow.contracts.iter().any(|c| !c.checks.is_empty()),
                revise: false,
                verifier: false,
                role: "orchestrator".into(),
            };
            return self.work(p, req, w);
        }
        let task_id = task.unwrap_or_default();
        let prog = progress(&req.messages);
        let cid = format!("call_{}", prog.turns + 1);
        let mut agents: Vec<(String, String, String)> = workflow
            .agents
            .iter()
            .take(4)
            .map(|a| {
                let contract = workflow
                    .contracts
                    .iter()
                    .find(|c| c.agent_id == a.agent_id)
                    .map(|c| format!("{} Checks: {}", c.returns, c.checks.join("; ")))
                    .unwrap_or_else(|| "Return a summary of what you did.".into());
                (a.role.clone(), a.instruction.clone(), contract)
            })
            .collect();
        if agents.is_empty() {
            // No workflow: the model writes its own contract, with the checks
            // in it as often as its habit says.
            let checks = unit(&mut plan) < p.contracts;
            agents.push((
                "analyst".into(),
                "Solve the task end to end and write all deliverables.".into(),
                if checks {
                    "Return what you computed and where the deliverables are. Checks: run_checks passes".into()
                } else {
                    "Return what you computed and where the deliverables are.".into()
                },
            ));
        }
        let revised = prog.delegations.len() > agents.len();
        if prog.delegations.len() < agents.len() {
            let (role, instruction, contract) = &agents[prog.delegations.len()];
            return call(
                cid,
                "delegate",
                json!({"role": role, "instructions": format!("{instruction}\nTask id: {task_id}."), "contract": contract}),
            );
        }
        let sends_back = workflow.hops.iter().any(|h| h.send_back_when.is_some());
        if sends_back && !revised {
            let reported_fail = prog
                .delegations
                .iter()
                .any(|r| r.contains(" fail") && !r.contains(", 0 fail"));
            let mut review = SplitMix64::new(req.seed ^ hash_str(first) ^ 0x5e7d_bac4);
            let notices = unit(&mut review) < 0.25 + 0.5 * p.skill;
            if reported_fail || notices {
                let (role, _, contract) = &agents[0];
                return call(
                    cid,
                    "delegate",
                    json!({"role": role, "instructions": format!("Revise the work: fix failing checks and remove any claim the numbers do not support.\nTask id: {task_id}."), "contract": contract}),
                );
            }
        }
        call(
            cid,
            "finish",
            json!({"report": format!("The team finished after {} delegation(s). {}", prog.delegations.len(), prog.delegations.last().cloned().unwrap_or_default())}),
        )
    }

    /// The judge: reads each workspace as its prompt shows it (run status,
    /// validation output, results.json, report.md) and nothing else. A
    /// careful reading weighs the validation score and the problems it
    /// notices: a report claim that the task's experts know to be
    /// misleading (`evidence`), and a report claiming checks pass that the
    /// validation output shows failing. Each visible problem is noticed
    /// with a chance equal to the model's skill, so a weak judge misses
    /// what a strong one sees. The blind spot is a bias: with weight
    /// `blind_spot` the verdict follows how confident and finished a report
    /// sounds instead, so over-claiming can win. Plus noise and a position
    /// bias. Nothing is computed from the task's solver.
    fn judge(&self, p: &SimParams, req: &ChatRequest) -> Message {
        let (prompt, mut rng) = user_text_and_rng(req);
        if unit(&mut rng) < 0.02 + 0.05 * p.judge_noise {
            return Message::assistant(
                "Workspace A seems more thorough overall, but both have merits.",
            );
        }
        let task = task_id_in(&prompt).unwrap_or_default();
        let evidence: &[String] = self
            .tasks
            .get(&task)
            .map(|t| t.evidence.as_slice())
            .unwrap_or(&[]);
        let (a, b) = match (
            prompt.find(prompts::WORKSPACE_A),
            prompt.find(prompts::WORKSPACE_B),
        ) {
            (Some(i), Some(j)) if i < j => (&prompt[i..j], &prompt[j..]),
            _ => return Message::assistant("{\"winner\": \"tie\"}"),
        };
        let notice = p.skill.clamp(0.0, 1.0);
        let (qa, why_a) = perceive(a, evidence, notice, p.blind_spot, &mut rng);
        let (qb, why_b) = perceive(b, evidence, notice, p.blind_spot, &mut rng);
        let diff = qa - qb + p.position_bias + 0.3 * p.judge_noise * gaussian(&mut rng);
        let winner = if diff.abs() < 0.02 {
            "tie"
        } else if diff > 0.0 {
            "A"
        } else {
            "B"
        };
        Message::assistant(
            json!({"winner": winner, "rationale": format!("A: {why_a}. B: {why_b}.")}).to_string(),
        )
    }
}

/// How good one workspace section of a judge prompt looks to a judge that
/// notices each visible problem with chance `notice` and whose verdict
/// follows report confidence with weight `blind`; and the judge's reason.
fn perceive(
    section: &str,
    evidence: &[String],
    notice: f64,
    blind: f64,
    rng: &mut SplitMix64,
) -> (f64, String) {
    let (k, n) = score_in(section);
    let report = section_text(section, prompts::REPORT_HEADER);
    let present = !report.trim().is_empty() && report.trim() != "(missing)";
    let frac = if n > 0 { k as f64 / n as f64 } else { 0.0 };
    let mut found: Vec<&str> = Vec::new();
    for e in evidence {
        if report.contains(e.as_str()) && unit(rng) < notice {
            found.push("the report makes a claim its analysis does not support");
        }
    }
    if claims_checks_pass(&report) && k < n && unit(rng) < notice {
        found.push("the report says the checks pass but the validation shows failures");
    }
    let soundness = if present {
        (1.0 - 0.5 * found.len() as f64).max(0.0)
    } else {
        0.0
    };
    let careful = 0.6 * frac + 0.4 * soundness;
    let confidence = if present { confidence_of(&report) } else { 0.0 };
    let quality = (1.0 - blind) * careful + blind * confidence;
    let mut why = format!("validation {k}/{n}");
    if found.is_empty() {
        why.push_str(", no problem noticed in the report");
    } else {
        why.push_str(&format!(", {}", found.join("; ")));
    }
    if blind >= 0.5 && confidence >= 0.6 {
        why.push_str(", and the report is confident and complete");
    }
    (quality, why)
}

/// The report states that the checks or validation pass.
fn claims_checks_pass(report: &str) -> bool {
    let r = report.to_lowercase();
    [
        "all checks pass",
        "checks pass",
        "validation passes",
        "verified",
    ]
    .iter()
    .any(|c| r.contains(c))
}

/// How confident and finished a report sounds, in [0, 1]: assertive words
/// raise it, hedges (limitations, caveats, intervals, what does not hold)
/// lower it. What a judge with a blind spot rewards.
fn confidence_of(report: &str) -> f64 {
    let r = report.to_lowercase();
    const ASSERTIVE: [&str; 9] = [
        "clearly",
        "robust",
        "accurate",
        "ready",
        "verified",
        "all checks pass",
        "directly",
        "is supported",
        "without correction",
    ];
    const HEDGES: [&str; 9] = [
        "limitation",
        "caveat",
        "uncertain",
        "interval",
        "does not",
        "do not",
        "not ",
        "only",
        "however",
    ];
    let count = |words: &[&str]| words.iter().filter(|w| r.contains(*w)).count() as f64;
    (0.5 + 0.15 * count(&ASSERTIVE) - 0.1 * count(&HEDGES)).clamp(0.0, 1.0)
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

fn solve_command(flaws: &[String]) -> String {
    let mut c = "python3 solve.py".to_string();
    for f in flaws {
        c.push_str(" --flaw ");
        c.push_str(f);
    }
    c
}

fn score_in(section: &str) -> (u64, u64) {
    for line in section.lines().rev() {
        if let Some(rest) = line.trim().strip_prefix("SCORE ") {
            let mut it = rest.split('/');
            if let (Some(k), Some(n)) = (it.next(), it.next()) {
                if let (Ok(k), Ok(n)) = (k.trim().parse(), n.trim().parse()) {
                    return (k, n);
                }
            }
        }
    }
    (0, 0)
}

fn section_text(section: &str, header: &str) -> String {
    match section.find(header) {
        Some(i) => {
            let rest = &section[i + header.len()..];
            let end = rest.find("\n### ").unwrap_or(rest.len());
            rest[..end].to_string()
        }
        None => String::new(),
    }
}

/// What the judge feedback in an optimizer prompt points at.
struct Feedback {
    /// A workspace in a recent comparison failed checks.
    failing_checks: bool,
    /// The judge noticed claims the analysis does not support.
    unsupported_claims: bool,
    /// The feedback lines that named a problem.
    lines: Vec<String>,
}

fn read_feedback(prompt: &str) -> Feedback {
    let section = prompt
        .find(prompts::FEEDBACK_HEADER)
        .map(|i| &prompt[i..])
        .unwrap_or("");
    let mut fb = Feedback {
        failing_checks: false,
        unsupported_claims: false,
        lines: Vec::new(),
    };
    for line in section.lines().filter(|l| l.starts_with("- ")) {
        let failing = line.split("validation ").skip(1).any(|rest| {
            let score: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '/')
                .collect();
            let mut it = score.split('/');
            match (it.next(), it.next()) {
                (Some(k), Some(n)) => match (k.parse::<u64>(), n.parse::<u64>()) {
                    (Ok(k), Ok(n)) => k < n,
                    _ => false,
                },
                _ => false,
            }
        });
        let unsupported =
            line.contains("does not support") || line.contains("says the checks pass");
        if failing || unsupported {
            fb.lines.push(line[2..].to_string());
        }
        fb.failing_checks |= failing;
        fb.unsupported_claims |= unsupported;
    }
    fb
}

/// The optimizer: edits the champion workflow from the judge's feedback;
/// skill decides how often an edit helps, and feedback that names a
/// problem points the edit at it.
fn optimize(p: &SimParams, req: &ChatRequest) -> Message {
    let (prompt, mut rng) = user_text_and_rng(req);
    let champion: Workflow = prompt
        .find(prompts::CHAMPION_BEGIN)
        .and_then(|i| {
            let rest = &prompt[i + prompts::CHAMPION_BEGIN.len()..];
            rest.find(prompts::CHAMPION_END)
                .map(|j| rest[..j].trim().to_string())
        })
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_else(Workflow::bare);
    if unit(&mut rng) < 0.06 {
        return Message::assistant("Proposal: {\"improved_design\": {\"agents\": [{\"agent_id\": \"solver\", \"role\": \"analyst\"");
    }
    let fb = read_feedback(&prompt);
    let informed = fb.failing_checks || fb.unsupported_claims;
    let mut w = champion.clone();
    let mut changes = Vec::new();
    let edits = 1 + (rng.next_u64() % 2) as usize;
    for _ in 0..edits {
        // Feedback that names a problem lets the optimizer aim its edit at
        // it; without it (no comparisons yet, or verdicts without reasons)
        // it guesses, and guesses help less often.
        let p_help = if informed {
            0.45 + 0.4 * p.skill
        } else {
            0.3 + 0.3 * p.skill
        };
        let helpful = unit(&mut rng) < p_help;
        let guess = rng.next_u64() % 3;
        let op = match (helpful, fb.failing_checks, fb.unsupported_claims) {
            (true, true, false) => 1,
            (true, false, true) => 2,
            (true, true, true) => 1 + guess % 2,
            _ => guess,
        };
        if helpful {
            match op {
                0 if w.agents.is_empty() => {
                    w.agents.push(Agent { agent_id: "solver".into(), role: "analyst".into(), instruction: "Implement the analysis, write every deliverable and keep logs.txt current.".into() });
                    w.contracts.push(Contract {
                        agent_id: "solver".into(),
                        returns: "The key numbers and the paths of the deliverables.".into(),
                        checks: vec![],
                    });
                    w.hops.push(Hop {
                        from: "orchestrator".into(),
                        to: "solver".into(),
                        handoff: "the task and data description".into(),
                        send_back_when: None,
                    });
                    changes.push("added a solver agent with a contract".to_string());
                }
                0 | 1 => {
                    if let Some(c) = w.contracts.iter_mut().find(|c| c.checks.is_empty()) {
                        c.checks.push("run_checks passes".into());
                        changes.push(format!(
                            "contract of {} now requires run_checks to pass",
                            c.agent_id
                        ));
                    } else if w.agents.is_empty() {
                        w.agents.push(Agent {
                            agent_id: "solver".into(),
                            role: "analyst".into(),
                            instruction: "Implement the analysis and write every deliverable."
                                .into(),
                        });
                        w.contracts.push(Contract {
                            agent_id: "solver".into(),
                            returns: "The key numbers.".into(),
                            checks: vec!["run_checks passes".into()],
                        });
                        changes.push(
                            "added a solver agent whose contract requires the checks".to_string(),
                        );
                    }
                }
                _ => {
                    if !w.hops.iter().any(|h| h.send_back_when.is_some()) {
                        let to = w
                            .agents
                            .first()
                            .map(|a| a.agent_id.clone())
                            .unwrap_or_else(|| "orchestrator".into());
                        w.hops.push(Hop {
                            from: "orchestrator".into(),
                            to,
                            handoff: "the draft deliverables for review".into(),
                            send_back_when: Some(
                                "a check fails or a claim is not supported by the numbers".into(),
                            ),
                        });
                        changes.push("added a review hop that sends work back".to_string());
                    }
                }
            }
        } else {
            match op {
                0 => {
                    if let Some(c) = w.contracts.iter_mut().find(|c| !c.checks.is_empty()) {
                        c.checks.clear();
                        changes.push(format!(
                            "dropped the checks from {}'s contract to save turns",
                            c.agent_id
                        ));
                    }
                }
                1 => {
                    let id = format!("writer{}", w.agents.len());
                    w.agents.push(Agent {
                        agent_id: id.clone(),
                        role: "report writer".into(),
                        instruction: "Polish the wording of report.md.".into(),
                    });
                    changes.push(format!("added {id} to polish the report"));
                }
                _ => {
                    for h in w.hops.iter_mut() {
                        h.send_back_when = None;
                    }
                    changes.push("removed send-backs to finish faster".to_string());
                }
            }
        }
    }
    if changes.is_empty() {
        changes.push("reworded the solver's instruction".into());
        if let Some(a) = w.agents.first_mut() {
            a.instruction = format!("{} State assumptions explicitly.", a.instruction);
        }
    }
    let why = match (fb.failing_checks, fb.unsupported_claims) {
        (true, true) => "The judge saw failing checks and claims the numbers do not support; contracts that require the checks and a review that sends such work back address both.",
        (true, false) => "The judge saw failing checks; contracts that require the checks address that.",
        (false, true) => "The judge saw claims the analysis does not support; a review that sends such work back addresses that.",
        (false, false) => "No judge feedback names a problem yet; this is a guess at what makes the work more reliable.",
    };
    let proposal = json!({
        "improved_design": w,
        "changes_from_previous": changes,
        "why_it_should_improve": why,
        "evidence_used": fb.lines,
        "expected_impact": "fewer failing checks and fewer unsupported claims",
        "verification_checks": ["run_checks"],
    });
    Message::assistant(format!(
        "```json\n{}\n```",
        serde_json::to_string_pretty(&proposal).unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MISLEADING: &str = "the strategy is ready for live deployment";

    /// A request with one system and one user message.
    fn request(model: &str, system: &str, user: &str, temperature: f64, seed: u64) -> ChatRequest {
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
        }
    }

    /// One workspace section as the judge prompt renders it.
    fn section(header: &str, passed: u32, total: u32, report: &str) -> String {
        format!(
            "{header}\nRun status: finished.\n### Files\n- report.md (1 bytes)\n{}\nPASS x\nSCORE {passed}/{total}\n### results.json\n{{}}\n{}\n{report}\n",
            prompts::VALIDATION_HEADER,
            prompts::REPORT_HEADER
        )
    }

    const SOUND: &str = "## Conclusion\nThe filter lowers drawdowns in this sample only; the \
        difference in Sharpe ratio is within its bootstrap interval.\nLimitations: one \
        asset, no transaction costs.";
    const OVERCLAIM: &str = "## Conclusion\nThe trend filter clearly outperforms buy-and-hold \
        and the edge is robust; the strategy is ready for live deployment. All checks pass.";

    /// A judge notices a misleading claim in the report as often as its
    /// skill says, measured over many draws, never always and never never.
    #[test]
    fn a_judge_notices_a_misleading_claim_about_as_often_as_its_skill() {
        let s = section(prompts::WORKSPACE_A, 5, 5, OVERCLAIM);
        let evidence = vec![MISLEADING.to_string()];
        for notice in [0.1, 0.5, 0.9] {
            let n = 2000;
            let seen = (0..n)
                .filter(|&seed| {
                    let mut rng = SplitMix64::new(seed);
                    perceive(&s, &evidence, notice, 0.0, &mut rng)
                        .1
                        .contains("does not support")
                })
                .count() as f64
                / n as f64;
            assert!((seen - notice).abs() < 0.04, "notice {notice}: seen {seen}");
        }
    }

    /// The blind spot is a bias, not indifference: a judge that weighs
    /// confidence prefers the over-claiming report with failing checks to
    /// a hedged one whose checks pass; a careful judge prefers the latter.
    #[test]
    fn a_blind_judge_prefers_the_confident_over_claiming_report() {
        let good = section(prompts::WORKSPACE_A, 5, 5, SOUND);
        let bad = section(prompts::WORKSPACE_B, 3, 5, OVERCLAIM);
        let evidence = vec![MISLEADING.to_string()];
        let prefers_good = |blind: f64| {
            (0..500u64)
                .filter(|&seed| {
                    let mut rng = SplitMix64::new(seed);
                    let (qg, _) = perceive(&good, &evidence, 0.7, blind, &mut rng);
                    let (qb, _) = perceive(&bad, &evidence, 0.7, blind, &mut rng);
                    qg > qb
                })
                .count()
        };
        assert_eq!(prefers_good(0.0), 500);
        assert_eq!(prefers_good(0.9), 0);
    }

    /// A report that says the checks pass while the validation output shows
    /// failures is a visible contradiction a careful judge can catch.
    #[test]
    fn claiming_failing_checks_pass_is_noticed() {
        let s = section(prompts::WORKSPACE_A, 3, 5, "Done. All checks pass.");
        let mut rng = SplitMix64::new(1);
        let (_, why) = perceive(&s, &[], 1.0, 0.0, &mut rng);
        assert!(why.contains("says the checks pass"), "{why}");
        let honest = section(prompts::WORKSPACE_A, 5, 5, "Done. All checks pass.");
        let (_, why) = perceive(&honest, &[], 1.0, 0.0, &mut rng);
        assert!(!why.contains("says the checks pass"), "{why}");
    }

    /// Regression: the judge ran each task's reference solver and scored
    /// reports against its output, an oracle no real judge has. Now a
    /// solver that would leave a trace when run is never run by judging.
    #[test]
    fn the_judge_never_runs_the_task_solver() {
        let tmp = tempfile::tempdir().unwrap();
        let tasks = tmp.path().join("tasks");
        let task = tasks.join("t");
        std::fs::create_dir_all(task.join("solution")).unwrap();
        let marker = tmp.path().join("solver-ran");
        std::fs::write(
            task.join("task.toml"),
            format!("id = \"t\"\n[[flaws]]\nname = \"f\"\ndescription = \"d\"\ncaught_by_checks = false\nevidence = \"{MISLEADING}\"\n"),
        )
        .unwrap();
        std::fs::write(
            task.join("solution/solve.py"),
            format!("open({:?}, 'w').write('ran')\n", marker.to_string_lossy()),
        )
        .unwrap();
        let b = SimBackend::new("j", SimParams::new(0.8, 0.1, 0.1, 0.0, 0.0), &tasks).unwrap();
        let prompt = format!(
            "{}\nDo it.\n\nTask id: t. Deliverables: report.md.\n\n{}\n\n{}",
            prompts::TASK_HEADER,
            section(prompts::WORKSPACE_A, 5, 5, SOUND),
            section(prompts::WORKSPACE_B, 5, 5, OVERCLAIM)
        );
        let (mut a_wins, mut b_wins) = (0, 0);
        for seed in 0..32 {
            let req = request("j/base", prompts::JUDGE_SYSTEM, &prompt, 0.2, seed);
            let reply = b.reply(&req).unwrap();
            let text = reply.message.content_str().replace(' ', "");
            a_wins += text.contains("\"winner\":\"A\"") as u32;
            b_wins += text.contains("\"winner\":\"B\"") as u32;
        }
        assert!(!marker.exists(), "judging ran the task's solver");
        // Both pass every check; the misleading claim in B is what a judge
        // of skill 0.8 notices, most of the time.
        assert!(a_wins > 2 * b_wins, "A won {a_wins}, B {b_wins} of 32");
    }

    /// The optimizer reads the judge's reasons: failing checks and
    /// unsupported claims are what it aims at; positions and passing
    /// scores are not problems.
    #[test]
    fn the_optimizer_reads_what_the_judge_found() {
        let prompt = |lines: &str| {
            format!(
                "## Task\nx\n\n{}\n{lines}\n\nPropose.",
                prompts::FEEDBACK_HEADER
            )
        };
        let fb = read_feedback(&prompt("- iteration 1: candidate rejected — 0 win(s), 1 loss(es) against the champion: A: validation 3/5, no problem noticed in the report. B: validation 5/5, no problem noticed in the report."));
        assert!(fb.failing_checks && !fb.unsupported_claims);
        let fb = read_feedback(&prompt("- iteration 2: candidate accepted — A: validation 5/5, the report makes a claim its analysis does not support. B: validation 5/5, no problem noticed in the report."));
        assert!(!fb.failing_checks && fb.unsupported_claims);
        assert_eq!(fb.lines.len(), 1);
        let fb = read_feedback(&prompt(
            "(no comparisons yet: the champion is the bare task)",
        ));
        assert!(!fb.failing_checks && !fb.unsupported_claims && fb.lines.is_empty());
        // A score outside the feedback section is not feedback.
        let fb = read_feedback("validation 1/5\n- validation 1/5");
        assert!(!fb.failing_checks);
    }

    /// Over many proposals, informed feedback makes helpful edits more
    /// often than none: the share of proposals that add verification
    /// (checks in a contract or a review hop) is higher.
    #[test]
    fn feedback_that_names_a_problem_makes_edits_better() {
        let helpful_share = |feedback: &str| {
            let n = 400u64;
            let mut helped = 0;
            for seed in 0..n {
                let text = format!(
                    "## Task\nx\n\nTask id: t.\n\n## Current champion workflow\n{}\n{{\"agents\":[],\"contracts\":[],\"hops\":[]}}\n{}\n\n{}\n{feedback}\n\nPropose an improved workflow.",
                    prompts::CHAMPION_BEGIN,
                    prompts::CHAMPION_END,
                    prompts::FEEDBACK_HEADER
                );
                let req = request("m", prompts::OPTIMIZER_SYSTEM, &text, 0.7, seed);
                let p = SimParams::new(0.5, 0.1, 0.1, 0.0, 0.0);
                let out = optimize(&p, &req).content_str().to_string();
                helped += (out.contains("requires run_checks")
                    || out.contains("requires the checks")
                    || out.contains("review hop")) as u32;
            }
            helped as f64 / n as f64
        };
        let informed =
            helpful_share("- iteration 1: A: validation 2/5, no problem noticed in the report.");
        let blind = helpful_share("(no comparisons yet: the champion is the bare task)");
        assert!(
            informed > blind + 0.1,
            "informed {informed:.2} vs uninformed {blind:.2}"
        );
    }
}
