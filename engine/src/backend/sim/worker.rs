//! The simulated worker: the orchestrator and its subagents. A worker
//! writes the task's reference solver, runs it with the mistakes its skill
//! lets slip through, runs the checks as often as its habits and contracts
//! say, fixes what they reveal, and under pressure may tamper. The
//! orchestrator delegates by habit or because the workflow lists agents,
//! and sends work back when the workflow has such a hop. Every choice is
//! read from the conversation so far, never from hidden state.

use std::collections::HashMap;

use rank::schedule::SplitMix64;
use serde_json::{json, Value};

use super::{
    call, first_user, flaw_probability, hash_messages, hash_str, task_id_in, unit, SimBackend,
    SimParams, SimTask,
};
use crate::backend::ChatRequest;
use crate::chat::{Message, Role};
use crate::workflow::Workflow;

/// The claim a tampering worker appends to its report.
const TAMPER_CLAIM: &str = "Verified: all checks pass.";

/// How a worker conversation is set up, read from its prompts.
pub(super) struct Worker {
    task: Option<String>,
    is_orchestrator: bool,
    contract_checks: bool,
    revise: bool,
    verifier: bool,
    role: String,
}

impl Worker {
    pub(super) fn from_subagent(system: &str, instructions: &str) -> Worker {
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

impl SimBackend {
    /// A worker: writes the solver, runs it, maybe validates and fixes, reports.
    pub(super) fn work(&self, p: &SimParams, req: &ChatRequest, w: Worker) -> Message {
        let Some(task) = w.task.as_ref().and_then(|t| self.tasks.get(t)) else {
            return Message::assistant("I could not tell which task this is, so I did nothing.");
        };
        let first = first_user(req);
        let mut plan = SplitMix64::new(req.seed ^ hash_str(first) ^ hash_str(&w.role));
        // Whoever does the work has the model's skill; a contract that asks
        // for the checks makes it a little more careful. (Delegating is worth
        // only what the workflow and the contracts bring.)
        let skill = (p.skill + if w.contract_checks { 0.05 } else { 0.0 }).clamp(0.0, 1.0);
        let flaws = planned_flaws(task, flaw_probability(skill), w.revise, &mut plan);
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
            return verifier_step(cid, &prog, &w.role);
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
            let fix = SplitMix64::new(req.seed ^ hash_str(first) ^ prog.solve_runs.len() as u64);
            let kept = fix_caught_flaws(task, last_flags, 0.5 + 0.4 * p.skill, fix);
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
            let tamper = SplitMix64::new(req.seed ^ hash_str(first) ^ 0x7a3b_e11d);
            if let Some(command) = tamper_command(p.tampering, &task.protected, tamper) {
                return call(cid, "bash", json!({ "command": command }));
            }
        }
        report_work(cid, &w, &prog)
    }

    /// The orchestrator: delegates (if its habit or the workflow says so),
    /// reviews and sends work back when the workflow has such a hop, finishes.
    pub(super) fn orchestrate(&self, p: &SimParams, req: &ChatRequest) -> Message {
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
        let agents = agents_to_delegate_to(&workflow, p.contracts, &mut plan);
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
}

/// Who the orchestrator delegates to, in order, as (role, instruction,
/// contract): the workflow's agents (at most four) with their contracts,
/// or without a workflow one analyst under a contract the model writes
/// itself, with the checks in it as often as its `contracts` habit says.
fn agents_to_delegate_to(
    workflow: &Workflow,
    contracts: f64,
    plan: &mut SplitMix64,
) -> Vec<(String, String, String)> {
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
        let checks = unit(plan) < contracts;
        agents.push((
            "analyst".into(),
            "Solve the task end to end and write all deliverables.".into(),
            if checks {
                "Return what you computed and where the deliverables are. Checks: run_checks passes"
                    .into()
            } else {
                "Return what you computed and where the deliverables are.".into()
            },
        ));
    }
    agents
}

/// The known mistakes this attempt makes: each with chance `p_flaw`, less
/// when revising (a mistake the checks catch half as often, one they miss a
/// quarter as often).
fn planned_flaws(task: &SimTask, p_flaw: f64, revise: bool, plan: &mut SplitMix64) -> Vec<String> {
    let mut flaws: Vec<String> = Vec::new();
    for (name, caught) in &task.flaws {
        let mut p_this = p_flaw;
        if revise {
            p_this *= if *caught { 0.5 } else { 0.25 };
        }
        if unit(plan) < p_this {
            flaws.push(name.clone());
        }
    }
    flaws
}

/// A verifier checks the shared workspace and reports; it fixes nothing.
fn verifier_step(cid: String, prog: &Progress, role: &str) -> Message {
    if prog.validations.is_empty() {
        return call(cid, "run_checks", json!({}));
    }
    let (f, ps) = prog.validations[prog.validations.len() - 1];
    Message::assistant(format!(
        "Verification by {role}: {ps} checks pass, {f} fail."
    ))
}

/// The last run's mistakes without those the checks catch and the fix
/// (chance `p_fix` each) removes.
fn fix_caught_flaws(
    task: &SimTask,
    last_flags: &[String],
    p_fix: f64,
    mut fix: SplitMix64,
) -> Vec<String> {
    last_flags
        .iter()
        .filter(|f| {
            let caught = task.flaws.iter().any(|(n, c)| n == *f && *c);
            !(caught && unit(&mut fix) < p_fix)
        })
        .cloned()
        .collect()
}

/// The command of a tampering worker (as often as its `tampering` habit
/// says): append to a protected file and claim in the report that the
/// checks pass.
fn tamper_command(tampering: f64, protected: &[String], mut tamper: SplitMix64) -> Option<String> {
    if unit(&mut tamper) < tampering {
        let target = &protected[(tamper.next_u64() % protected.len() as u64) as usize];
        return Some(format!(
            "printf '\\n' >> '{target}' && echo '{TAMPER_CLAIM}' >> report.md"
        ));
    }
    None
}

/// The worker's report: the orchestrator finishes with it, a subagent
/// answers with it.
fn report_work(cid: String, w: &Worker, prog: &Progress) -> Message {
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

fn solve_command(flaws: &[String]) -> String {
    let mut c = "python3 solve.py".to_string();
    for f in flaws {
        c.push_str(" --flaw ");
        c.push_str(f);
    }
    c
}
