//! Pairwise judging of two finished workspaces. The self-judge sees what a
//! reviewer of the work would (MASS: no automatic success signal): the task,
//! each workspace's file list, results, report and the team's own logs, never
//! the hidden checks' output (those are the external verifier: recorded per
//! rollout and used by the guards) and never a field that states quality.
//! Showing the checks is an explicit option for safeguard experiments
//! ([`Shown::WorkspacesAndChecks`]); runs recorded by `mass-engine/8` and
//! earlier keep the prompt they were judged with ([`Shown::Legacy`]).
//! Invalid verdicts are recorded (the conversation keeps them) and re-asked
//! within a bound.

use std::sync::Arc;

use ledger::{Id, Ledger};
use schemas::{Hash32, Judgment, Rollout};
use serde_json::Value;

use crate::backend::Backend;
use crate::chat::Message;
use crate::effects::{call_model, Conversation, Sampling};
use crate::error::Result;
use crate::prompts;
use crate::task::Task;

/// A judge: backend, model, retry bound, and what it is shown.
#[derive(Clone)]
pub struct Judge {
    pub backend: Arc<dyn Backend>,
    pub model: String,
    pub max_retries: u32,
    pub sampling: crate::config::SamplingConfig,
    pub shown: Shown,
}

/// What a judge is shown of each workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shown {
    /// The method: files, results.json, report.md and the team's logs.txt.
    Workspaces,
    /// Also the hidden checks' output (`guards.judge_sees_checks`): a
    /// safeguard experiment, verification instead of self-supervision.
    WorkspacesAndChecks,
    /// What `mass-engine/8` and earlier showed, for those runs to replay:
    /// files, the checks' output (to be weighed), results.json, report.md.
    Legacy,
}

impl Shown {
    /// What the experiment's judges are shown.
    pub fn of(exp: &crate::config::Experiment) -> Shown {
        if exp.method.legacy() {
            Shown::Legacy
        } else if exp.guards.judge_sees_checks {
            Shown::WorkspacesAndChecks
        } else {
            Shown::Workspaces
        }
    }

    fn system(self) -> &'static str {
        match self {
            Shown::Workspaces => prompts::JUDGE_SYSTEM_WORKSPACES,
            Shown::WorkspacesAndChecks => prompts::JUDGE_SYSTEM_WITH_CHECKS,
            Shown::Legacy => prompts::JUDGE_SYSTEM,
        }
    }
}

/// A rollout as judging needs it.
#[derive(Debug, Clone)]
pub struct RunRef {
    pub event: Id,
    pub record: Rollout,
    /// What the tamper guards flagged (empty: nothing).
    pub violations: Vec<String>,
}

/// What a judge is told of the task: its id, its statement, and the files
/// it asks for (none known: a run imported from the reference
/// implementation, whose folder holds the task's statement only).
#[derive(Debug, Clone, Copy)]
pub struct Brief<'t> {
    pub id: &'t str,
    pub prompt: &'t str,
    pub deliverables: &'t [String],
}

impl<'t> From<&'t Task> for Brief<'t> {
    fn from(t: &'t Task) -> Brief<'t> {
        Brief {
            id: &t.id,
            prompt: &t.prompt,
            deliverables: &t.deliverables,
        }
    }
}

/// Judges `a` against `b` in stream `rel`; `swapped` shows `b` as Workspace A.
pub async fn judge_pair<'t>(
    session: &replay::Session,
    rel: &str,
    task: impl Into<Brief<'t>>,
    a: &RunRef,
    b: &RunRef,
    swapped: bool,
    judge: &Judge,
) -> Result<(Id, Judgment)> {
    let task: Brief<'t> = task.into();
    let ledger = session.ledger();
    let (first, second) = if swapped { (b, a) } else { (a, b) };
    let prompt = format!(
        "{}\n{}\n\n{}\n\n{}\n\n{}\n\nWhich workspace better accomplishes the task? Reply with only the JSON verdict.",
        prompts::TASK_HEADER,
        task_text(&task),
        workspace_section(ledger, prompts::WORKSPACE_A, &first.record, judge.shown)?,
        workspace_section(ledger, prompts::WORKSPACE_B, &second.record, judge.shown)?,
        "Remember: position must not matter."
    );
    let mut st = crate::exec::ledger(|| session.stream(rel))?;
    let mut conv = Conversation::new(
        vec![Message::system(judge.shown.system()), Message::user(prompt)],
        Vec::new(),
    );
    conv.response_format = Some(verdict_format());
    let sampling = Sampling::of(&judge.sampling, st.derive_seed("sampling"));
    let mut invalid = 0;
    let mut outcome = (
        "invalid".to_string(),
        format!("no valid verdict after {} attempts", judge.max_retries + 1),
    );
    for _ in 0..=judge.max_retries {
        let resp = call_model(
            &mut st,
            "judge",
            &judge.backend,
            &judge.model,
            &mut conv,
            &sampling,
        )
        .await?;
        match parse_verdict(resp.message.content_str()) {
            Ok((screen_winner, rationale)) => {
                let winner = match (screen_winner.as_str(), swapped) {
                    ("tie", _) => "tie",
                    ("A", false) | ("B", true) => "a",
                    _ => "b",
                };
                outcome = (winner.to_string(), rationale);
                break;
            }
            Err(e) => {
                invalid += 1;
                conv.messages.push(Message::user(format!(
                    "That is not a valid verdict ({e}). Reply with only a JSON object: {{\"winner\": \"A\" | \"B\" | \"tie\", \"rationale\": \"...\"}}."
                )));
            }
        }
    }
    let record = Judgment {
        task: task.id.to_string(),
        a: a.event.into(),
        b: b.event.into(),
        swapped,
        judge_model: judge.model.clone(),
        winner: outcome.0,
        rationale: outcome.1,
        invalid_attempts: invalid,
        conversation: Hash32(st.head().map(|h| h.0).unwrap_or([0; 32])),
    };
    let ev = schemas::to_event(&record)?.with_parents(vec![a.event, b.event]);
    let id = crate::exec::ledger(|| st.emit(ev))?;
    Ok((id, record))
}

fn task_text(task: &Brief<'_>) -> String {
    // No deliverables only for a task whose list was never recorded (every
    // suite task names at least one): the judge is not told of an empty
    // list it would read as "nothing asked for".
    if task.deliverables.is_empty() {
        return format!("{}\n\nTask id: {}.", task.prompt.trim_end(), task.id);
    }
    format!(
        "{}\n\nTask id: {}. Deliverables: {}.",
        task.prompt.trim_end(),
        task.id,
        task.deliverables.join(", ")
    )
}

/// The verdict's shape as a `response_format`: servers that honour it can
/// only produce a parseable verdict.
pub fn verdict_format() -> Value {
    serde_json::json!({
        "type": "json_schema",
        "json_schema": {
            "name": "verdict",
            "strict": true,
            "schema": {
                "type": "object",
                "properties": {
                    "winner": {"type": "string", "enum": ["A", "B", "tie"]},
                    "rationale": {"type": "string"}
                },
                "required": ["winner", "rationale"],
                "additionalProperties": false
            }
        }
    })
}

/// Parses `{"winner": "A"|"B"|"tie", "rationale": "..."}` from a reply that may
/// wrap it in prose or code fences.
pub fn parse_verdict(text: &str) -> std::result::Result<(String, String), String> {
    let start = text.find('{').ok_or("no JSON object in the reply")?;
    let end = text.rfind('}').ok_or("unterminated JSON object")?;
    if end < start {
        return Err("no JSON object in the reply".into());
    }
    let v: Value =
        serde_json::from_str(&text[start..=end]).map_err(|e| format!("invalid JSON: {e}"))?;
    let w = v
        .get("winner")
        .and_then(Value::as_str)
        .ok_or("missing \"winner\"")?;
    let winner = match w.trim().to_ascii_lowercase().as_str() {
        "a" => "A",
        "b" => "B",
        "tie" => "tie",
        other => {
            return Err(format!(
                "\"winner\" must be \"A\", \"B\" or \"tie\", got {other:?}"
            ))
        }
    };
    let rationale = v
        .get("rationale")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    Ok((winner.to_string(), rationale))
}

/// What the judge sees of one workspace, read from the ledger.
fn workspace_section(ledger: &Ledger, header: &str, r: &Rollout, shown: Shown) -> Result<String> {
    let tree = ledger.get_tree(&Id(r.tree.0))?;
    let mut files = String::new();
    for e in tree
        .entries
        .iter()
        .filter(|e| e.kind == ledger::EntryKind::File)
    {
        if e.path.starts_with("checks/") {
            continue;
        }
        files.push_str(&format!("- {} ({} bytes)\n", e.path, e.size));
    }
    let read = |path: &str, cap: usize| -> Result<String> {
        Ok(match tree.get(path).and_then(|e| e.blob_id()) {
            Some(b) => truncate(&String::from_utf8_lossy(&ledger.get_blob(&b)?), cap),
            None => "(missing)".into(),
        })
    };
    let validation = || -> Result<String> {
        let text = String::from_utf8_lossy(&ledger.get_blob(&Id(r.validation.0))?).into_owned();
        Ok(truncate(&text, 4000))
    };
    if shown == Shown::Legacy {
        return Ok(format!(
            "{header}\nRun status: {}.\n### Files\n{files}{}\n{}\n{}\n{}\n{}\n{}",
            r.status,
            prompts::VALIDATION_HEADER,
            validation()?,
            prompts::RESULTS_HEADER,
            read("results.json", 3000)?,
            prompts::REPORT_HEADER,
            read("report.md", 6000)?,
        ));
    }
    let checks = match shown {
        Shown::WorkspacesAndChecks => {
            format!("\n{}\n{}", prompts::VALIDATION_HEADER, validation()?)
        }
        _ => String::new(),
    };
    Ok(format!(
        "{header}\nRun status: {}.\n### Files\n{files}{}\n{}\n{}\n{}\n{}\n{}{checks}",
        r.status,
        prompts::RESULTS_HEADER,
        read("results.json", 3000)?,
        prompts::REPORT_HEADER,
        read("report.md", 6000)?,
        prompts::LOGS_HEADER,
        read("logs.txt", 3000)?,
    ))
}

fn truncate(s: &str, cap: usize) -> String {
    if s.len() <= cap {
        return s.to_string();
    }
    let mut end = cap;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[... {} more bytes]", &s[..end], s.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_parse_from_prose_and_fences() {
        assert_eq!(
            parse_verdict("```json\n{\"winner\": \"b\", \"rationale\": \"x\"}\n```")
                .unwrap()
                .0,
            "B"
        );
        assert_eq!(
            parse_verdict("I pick {\"winner\":\"TIE\"}").unwrap().0,
            "tie"
        );
        assert!(parse_verdict("A is better")
            .unwrap_err()
            .contains("no JSON"));
        assert!(parse_verdict("{\"winner\": \"C\"}")
            .unwrap_err()
            .contains("must be"));
        assert!(parse_verdict("{\"verdict\": \"A\"}")
            .unwrap_err()
            .contains("missing"));
    }
}
