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

/// Removes the rendered workflow from every message that holds it, in a
/// conversation of any agent (`mass-engine/9`): the orchestrator's first
/// prompt as [`strip_orchestrator_workflow_within`] does, then, in every
/// message that is not model output (system, user and tool messages: a
/// side request repeating the task and workflow, a tool result echoing
/// the prompt), each copy of `rendered` (the section as the team was given
/// it, with the blank line before it) and any other valid workflow
/// section. Model output is never rewritten: what is left is for the export
/// check (`leak.rs`) to refuse.
pub fn strip_workflow_everywhere(
    conv: &mut Example,
    task_prompt: &str,
    directives: &[String],
    rendered: &str,
) {
    if conv.agent == AgentKind::Orchestrator {
        strip_orchestrator_workflow_within(conv, task_prompt, directives);
    }
    if rendered.is_empty() {
        return;
    }
    let with_gap = format!("\n\n{rendered}");
    for m in conv
        .messages
        .iter_mut()
        .filter(|m| m.role != Role::Assistant)
    {
        let Some(c) = m.content.as_mut() else {
            continue;
        };
        if !c.contains(rendered) && crate::workflow::find_section(c).is_none() {
            continue;
        }
        let mut s = c.replace(&with_gap, "").replace(rendered, "");
        // Any other valid section (a harness that re-rendered it); bounded:
        // each pass removes one section.
        for _ in 0..64 {
            let next = crate::workflow::strip_from_prompt(&s);
            if next == s {
                break;
            }
            s = next;
        }
        *c = s;
    }
}
