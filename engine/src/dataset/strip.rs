//! Step 5 of the outer loop: removing the workflow from an orchestrator's
//! first prompt, so the model learns to organise the team without being
//! told how. The engine computes the bare prompt; this only puts it in
//! place of the right span of the right message.

use super::{AgentKind, Example};
use crate::chat::Role;

/// Replaces the content of an orchestrator's first user message (task + workflow +
/// directive) by `bare_task_prompt`, which the engine computes. Every other message
/// is untouched, and subagent conversations keep their instructions (MASS.md step 5).
/// Returns whether a message was replaced: `false` for a subagent or for an
/// orchestrator without a user message (which the caller should treat as broken).
pub fn strip_orchestrator_workflow(conv: &mut Example, bare_task_prompt: &str) -> bool {
    if conv.agent != AgentKind::Orchestrator {
        return false;
    }
    match conv.messages.iter_mut().find(|m| m.role == Role::User) {
        Some(first_user) => {
            first_user.content = Some(bare_task_prompt.to_owned());
            true
        }
        None => false,
    }
}

/// [`strip_orchestrator_workflow`] for a first user message that holds the
/// team's prompt (`task_prompt`, the workflow, a closing directive) inside
/// other text, as an external harness sends it (its environment context,
/// then the task): only that span becomes the bare task prompt, with the
/// directive it closed with. `directives`: the closings a harness may use,
/// the built-in one first (the fallback's). Falls back to replacing the whole
/// message when no span is there.
pub fn strip_orchestrator_workflow_within(
    conv: &mut Example,
    task_prompt: &str,
    directives: &[String],
) -> bool {
    if conv.agent != AgentKind::Orchestrator {
        return false;
    }
    if let Some(first_user) = conv.messages.iter_mut().find(|m| m.role == Role::User) {
        let c = first_user.content_str();
        if let Some(start) = c.find(task_prompt) {
            for directive in directives {
                let Some(end) = c[start..]
                    .rfind(directive.as_str())
                    .map(|j| start + j + directive.len())
                else {
                    continue;
                };
                let mut s = c[..start].to_string();
                s.push_str(task_prompt);
                s.push_str(directive);
                s.push_str(&c[end..]);
                first_user.content = Some(s);
                return true;
            }
        }
    }
    let bare = format!(
        "{task_prompt}{}",
        directives.first().map(String::as_str).unwrap_or("")
    );
    strip_orchestrator_workflow(conv, &bare)
}
