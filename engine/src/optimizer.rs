//! The optimizer step of the inner loop: ask the model for a revised workflow,
//! parse and validate its JSON proposal, and re-ask (within a bound) with the
//! error when the proposal is malformed. Every attempt is recorded.

use std::sync::Arc;

use ledger::{Id, Ledger};
use schemas::{Hash32, ProposalRecord};

use crate::backend::Backend;
use crate::chat::Message;
use crate::effects::{call_model, Conversation, Sampling};
use crate::error::{EngineError, Result};
use crate::prompts;
use crate::task::Task;
use crate::workflow::{parse_proposal, Proposal, Workflow};

#[derive(Clone)]
pub struct Optimizer {
    pub backend: Arc<dyn Backend>,
    pub model: String,
    pub max_retries: u32,
    pub sampling: crate::config::SamplingConfig,
    /// A valid proposal that renders the same team section as the champion
    /// (it changes nothing the team would see) is a failed attempt, re-asked
    /// like a malformed one. Off only for runs recorded before it
    /// (`mass-engine/8`), which judged such candidates.
    pub reject_unchanged: bool,
}

/// Why a proposal that parses is still not a candidate: it changes nothing
/// the team would see (its rendered section equals the champion's).
pub fn unchanged_error(champion: &Workflow) -> String {
    if champion.is_bare() {
        "the proposed design gives the team no instructions, so it is the bare task again, which is already the champion; propose a design with agents, contracts or hops".into()
    } else {
        "the proposed design is the champion workflow unchanged; propose a revision that changes agents, contracts or hops".into()
    }
}

/// A proposal's shape as a `response_format` (see `workflow::parse_proposal`,
/// which still checks what a schema cannot: ids unique, contracts and hops
/// naming agents that exist).
pub fn proposal_format() -> serde_json::Value {
    let s = serde_json::json!({"type": "string"});
    let list = serde_json::json!({"type": "array", "items": {"type": "string"}});
    let object = |props: serde_json::Value, required: &[&str]| serde_json::json!({"type": "object", "properties": props, "required": required, "additionalProperties": false});
    let agent = object(
        serde_json::json!({"agent_id": s, "role": s, "instruction": s}),
        &["agent_id", "role", "instruction"],
    );
    let contract = object(
        serde_json::json!({"agent_id": s, "returns": s, "checks": list}),
        &["agent_id", "returns", "checks"],
    );
    let hop = object(
        serde_json::json!({"from": s, "to": s, "handoff": s}),
        &["from", "to", "handoff"],
    );
    let design = object(
        serde_json::json!({
            "agents": {"type": "array", "items": agent, "maxItems": 4},
            "contracts": {"type": "array", "items": contract, "maxItems": 4},
            "hops": {"type": "array", "items": hop, "maxItems": 6}
        }),
        &["agents", "contracts", "hops"],
    );
    let schema = object(
        serde_json::json!({
            "improved_design": design,
            "changes_from_previous": list,
            "why_it_should_improve": s,
            "evidence_used": list,
            "expected_impact": s,
            "verification_checks": list
        }),
        &[
            "improved_design",
            "changes_from_previous",
            "why_it_should_improve",
            "evidence_used",
            "expected_impact",
            "verification_checks",
        ],
    );
    serde_json::json!({"type": "json_schema", "json_schema": {"name": "proposal", "strict": true, "schema": schema}})
}

/// Asks for a proposal; returns the proposed workflow (None when every attempt
/// was malformed) and the stream head.
pub async fn propose(
    session: &replay::Session,
    rel: &str,
    task: &Task,
    iteration: u32,
    champion: &Workflow,
    feedback: &[String],
    opt: &Optimizer,
) -> Result<(Option<Workflow>, Id)> {
    let ledger = session.ledger().clone();
    let prompt = optimizer_prompt(task, champion, feedback);
    let mut st = crate::exec::ledger(|| session.stream(rel))?;
    let mut conv = Conversation::new(
        vec![
            Message::system(prompts::OPTIMIZER_SYSTEM),
            Message::user(prompt),
        ],
        Vec::new(),
    );
    conv.response_format = Some(proposal_format());
    let sampling = Sampling::of(&opt.sampling, st.derive_seed("sampling"));
    for attempt in 0..=opt.max_retries {
        let resp = call_model(
            &mut st,
            "optimizer",
            &opt.backend,
            &opt.model,
            &mut conv,
            &sampling,
        )
        .await?;
        let text = resp.message.content_str().to_string();
        let attempted = ProposalRecord {
            task: task.id.clone(),
            iteration,
            attempt,
            valid: false,
            error: String::new(),
            body: Hash32([0; 32]),
            workflow: Hash32([0; 32]),
            conversation: Hash32(st.head().map(|h| h.0).unwrap_or([0; 32])),
        };
        let parsed = parse_proposal(&text).map_err(|e| e.to_string());
        let parsed = match parsed {
            Ok(p) if opt.reject_unchanged && p.improved_design.render() == champion.render() => {
                Err(unchanged_error(champion))
            }
            other => other,
        };
        let (record, workflow) = match parsed {
            Ok(p) => (
                valid_record(&ledger, &p, attempted)?,
                Some(p.improved_design),
            ),
            Err(e) => {
                let body_id = crate::exec::ledger(|| ledger.put_blob(text.as_bytes()))?;
                conv.messages.push(Message::user(format!(
                    "Your proposal could not be used: {e}. Reply again with only the JSON object."
                )));
                let record = ProposalRecord {
                    error: e.clone(),
                    body: body_id.into(),
                    ..attempted
                };
                (record, None)
            }
        };
        let ev = schemas::to_event(&record)?;
        crate::exec::ledger(|| st.emit(ev))?;
        if let Some(w) = workflow {
            return Ok((Some(w), st.head().unwrap_or(Id([0; 32]))));
        }
    }
    Ok((None, st.head().unwrap_or(Id([0; 32]))))
}

/// The optimizer's first prompt: the task, the champion workflow as JSON
/// between its markers, and the feedback from the comparisons so far.
fn optimizer_prompt(task: &Task, champion: &Workflow, feedback: &[String]) -> String {
    let champion_json = serde_json::to_string_pretty(champion).unwrap_or_default();
    let feedback_text = if feedback.is_empty() {
        "(no comparisons yet: the champion is the bare task)".to_string()
    } else {
        feedback
            .iter()
            .map(|f| format!("- {f}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "## Task\n{}\n\nTask id: {}.\n\n## Current champion workflow\n{}\n{}\n{}\n\n{}\n{}\n\nPropose an improved workflow.",
        task.prompt.trim_end(),
        task.id,
        prompts::CHAMPION_BEGIN,
        champion_json,
        prompts::CHAMPION_END,
        prompts::FEEDBACK_HEADER,
        feedback_text
    )
}

/// Stores a valid proposal (its JSON body and its workflow, as blobs in one
/// batch) and completes the attempt's record with them.
fn valid_record(
    ledger: &Ledger,
    p: &Proposal,
    attempted: ProposalRecord,
) -> Result<ProposalRecord> {
    let body = serde_json::to_vec(&serde_json::json!({
        "improved_design": p.improved_design,
        "changes_from_previous": p.changes_from_previous,
        "why_it_should_improve": p.why_it_should_improve,
        "evidence_used": p.evidence_used,
        "expected_impact": p.expected_impact,
        "verification_checks": p.verification_checks,
    }))
    .unwrap_or_default();
    let wf = serde_json::to_vec(&p.improved_design).unwrap_or_default();
    let (body_id, wf_id) = crate::exec::ledger(|| {
        let mut b = ledger.batch();
        let body_id = b.put_blob(&body)?;
        let wf_id = b.put_blob(&wf)?;
        b.commit()?;
        Ok::<_, EngineError>((body_id, wf_id))
    })?;
    Ok(ProposalRecord {
        valid: true,
        body: body_id.into(),
        workflow: wf_id.into(),
        ..attempted
    })
}
