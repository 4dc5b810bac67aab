//! The simulated optimizer. It reads the judge's reasons in its prompt and,
//! when they name failing checks or unsupported claims, aims its edit of
//! the champion workflow at that; skill decides how often an edit helps,
//! and an informed edit helps more often than a guess.

use serde_json::json;

use super::{unit, user_text_and_rng, SimParams};
use crate::backend::ChatRequest;
use crate::chat::Message;
use crate::prompts;
use crate::workflow::{Agent, Contract, Hop, Workflow};

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
        // A failing check score (where the judge was shown the checks) or
        // a mistake the judge saw in the work: either asks for checks.
        let failing = line.contains("shows a mistake")
            || line.split("validation ").skip(1).any(|rest| {
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
pub(super) fn optimize(p: &SimParams, req: &ChatRequest) -> Message {
    let (prompt, mut rng) = user_text_and_rng(req);
    let champion = champion_in(&prompt);
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
            helpful_edit(&mut w, op, &mut changes);
        } else {
            harmful_edit(&mut w, op, &mut changes);
        }
    }
    if changes.is_empty() {
        changes.push("reworded the solver's instruction".into());
        if let Some(a) = w.agents.first_mut() {
            a.instruction = format!("{} State assumptions explicitly.", a.instruction);
        }
    }
    let proposal = json!({
        "improved_design": w,
        "changes_from_previous": changes,
        "why_it_should_improve": why_it_should_improve(&fb),
        "evidence_used": fb.lines,
        "expected_impact": "fewer failing checks and fewer unsupported claims",
        "verification_checks": ["run_checks"],
    });
    Message::assistant(format!(
        "```json\n{}\n```",
        serde_json::to_string_pretty(&proposal).unwrap_or_default()
    ))
}

/// The champion workflow as the prompt shows it (JSON between the
/// champion markers); the bare workflow if it cannot be read.
fn champion_in(prompt: &str) -> Workflow {
    prompt
        .find(prompts::CHAMPION_BEGIN)
        .and_then(|i| {
            let rest = &prompt[i + prompts::CHAMPION_BEGIN.len()..];
            rest.find(prompts::CHAMPION_END)
                .map(|j| rest[..j].trim().to_string())
        })
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_else(Workflow::bare)
}

/// An edit that makes the work more reliable: `op` 0 adds a solver when
/// there are no agents (else does what 1 does), 1 requires the checks in a
/// contract, 2 adds a review hop that sends work back.
fn helpful_edit(w: &mut Workflow, op: u64, changes: &mut Vec<String>) {
    match op {
        0 if w.agents.is_empty() => add_solver(w, changes),
        0 | 1 => require_checks(w, changes),
        _ => add_review_hop(w, changes),
    }
}

/// A solver agent under a contract, with a hop from the orchestrator.
fn add_solver(w: &mut Workflow, changes: &mut Vec<String>) {
    w.agents.push(Agent {
        agent_id: "solver".into(),
        role: "analyst".into(),
        instruction: "Implement the analysis, write every deliverable and keep logs.txt current."
            .into(),
    });
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

/// The checks in the first contract without them; with no agents at all,
/// a solver whose contract requires them.
fn require_checks(w: &mut Workflow, changes: &mut Vec<String>) {
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
            instruction: "Implement the analysis and write every deliverable.".into(),
        });
        w.contracts.push(Contract {
            agent_id: "solver".into(),
            returns: "The key numbers.".into(),
            checks: vec!["run_checks passes".into()],
        });
        changes.push("added a solver agent whose contract requires the checks".to_string());
    }
}

/// A review hop that sends work back, unless there is one.
fn add_review_hop(w: &mut Workflow, changes: &mut Vec<String>) {
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
            send_back_when: Some("a check fails or a claim is not supported by the numbers".into()),
        });
        changes.push("added a review hop that sends work back".to_string());
    }
}

/// An edit that makes the work less reliable: `op` 0 drops a contract's
/// checks, 1 adds an agent that polishes the report, 2 removes the
/// send-backs.
fn harmful_edit(w: &mut Workflow, op: u64, changes: &mut Vec<String>) {
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

/// Why the proposal should help, from what the judge's feedback named.
fn why_it_should_improve(fb: &Feedback) -> &'static str {
    match (fb.failing_checks, fb.unsupported_claims) {
        (true, true) => "The judge saw failing checks and claims the numbers do not support; contracts that require the checks and a review that sends such work back address both.",
        (true, false) => "The judge saw failing checks; contracts that require the checks address that.",
        (false, true) => "The judge saw claims the analysis does not support; a review that sends such work back addresses that.",
        (false, false) => "No judge feedback names a problem yet; this is a guess at what makes the work more reliable.",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::tests::request;

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
