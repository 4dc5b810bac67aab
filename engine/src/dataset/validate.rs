//! The conversation rules both wire formats need, checked before anything
//! is written: a malformed line is either rejected by the trainer or, worse,
//! silently trains the model on a broken tool protocol. The first broken
//! rule is reported with where it is.

use std::collections::BTreeSet;

use super::{DatasetError, Example, Location, Problem};
use crate::chat::Role;

/// Checks everything both formats need; [`to_openai_line`] and [`to_trl_line`]
/// call it. Public so the engine can drop or report a bad conversation before
/// rendering a whole dataset.
///
/// Rules: at least one message, the first being system or user; at least one
/// assistant message; assistant messages have content or tool calls (reasoning
/// alone is not a turn); other messages have content; only assistant messages
/// carry reasoning; only assistant messages carry tool calls (type
/// `"function"`, non-empty id and name) and only tool messages carry a
/// `tool_call_id`, which must answer an unanswered call issued by an earlier
/// assistant message. An id may be reused once its call is answered (some
/// backends number calls per turn). Calls left unanswered are allowed (a run may
/// stop on a call), see [`warnings`]. Tools must be functions with OpenAI-valid names.
pub fn validate(conv: &Example) -> Result<(), DatasetError> {
    let fail = |at: Location, problem: Problem| DatasetError::Invalid {
        conversation: conv.id.clone(),
        at,
        problem,
    };
    for (i, tool) in conv.tools.iter().enumerate() {
        if tool.kind != "function" {
            return Err(fail(
                Location::Tool(i),
                Problem::NotAFunction(tool.kind.clone()),
            ));
        }
        if !valid_function_name(&tool.function.name) {
            return Err(fail(
                Location::Tool(i),
                Problem::InvalidToolName(tool.function.name.clone()),
            ));
        }
    }
    let first = conv
        .messages
        .first()
        .ok_or_else(|| fail(Location::Whole, Problem::NoMessages))?;
    if !matches!(first.role, Role::System | Role::User) {
        return Err(fail(
            Location::Message(0),
            Problem::FirstMessageRole(first.role),
        ));
    }
    let mut pending: BTreeSet<&str> = BTreeSet::new();
    let mut answered: BTreeSet<&str> = BTreeSet::new();
    let mut assistants = 0usize;
    for (i, m) in conv.messages.iter().enumerate() {
        let at = Location::Message(i);
        if m.role != Role::Assistant && !m.tool_calls.is_empty() {
            return Err(fail(at, Problem::ToolCallsOutsideAssistant(m.role)));
        }
        if m.role != Role::Tool && m.tool_call_id.is_some() {
            return Err(fail(at, Problem::ToolCallIdOutsideToolMessage(m.role)));
        }
        if m.role != Role::Assistant && m.reasoning.is_some() {
            return Err(fail(at, Problem::ReasoningOutsideAssistant(m.role)));
        }
        match m.role {
            Role::Assistant => {
                assistants += 1;
                if m.tool_calls.is_empty() && m.content_str().is_empty() {
                    return Err(fail(at, Problem::EmptyAssistantMessage));
                }
                for (k, call) in m.tool_calls.iter().enumerate() {
                    let at = Location::ToolCall {
                        message: i,
                        call: k,
                    };
                    if call.kind != "function" {
                        return Err(fail(at, Problem::NotAFunction(call.kind.clone())));
                    }
                    if call.id.is_empty() {
                        return Err(fail(at, Problem::EmptyToolCallId));
                    }
                    if call.function.name.is_empty() {
                        return Err(fail(at, Problem::EmptyFunctionName));
                    }
                    if !pending.insert(&call.id) {
                        return Err(fail(at, Problem::DuplicateToolCallId(call.id.clone())));
                    }
                    answered.remove(call.id.as_str());
                }
            }
            Role::Tool => {
                if m.content.is_none() {
                    return Err(fail(at, Problem::MissingContent(m.role)));
                }
                let id = m
                    .tool_call_id
                    .as_deref()
                    .ok_or_else(|| fail(at, Problem::ToolMessageWithoutCallId))?;
                if pending.remove(id) {
                    answered.insert(id);
                } else if answered.contains(id) {
                    return Err(fail(at, Problem::ToolCallAlreadyAnswered(id.to_owned())));
                } else {
                    return Err(fail(at, Problem::UnknownToolCallId(id.to_owned())));
                }
            }
            Role::System | Role::User => {
                if m.content.is_none() {
                    return Err(fail(at, Problem::MissingContent(m.role)));
                }
            }
        }
    }
    if assistants == 0 {
        return Err(fail(Location::Whole, Problem::NoAssistantMessage));
    }
    Ok(())
}

fn valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
