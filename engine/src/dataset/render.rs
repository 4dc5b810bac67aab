//! Rendering one conversation as one JSON line of either wire format (see
//! the parent module for both formats). Built by hand from the chat types
//! rather than through serde, so rendering has no failure path once the
//! conversation is valid.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::arguments::{classify_arguments, Arguments};
use super::validate::validate;
use super::{DatasetError, Example, Format};
use crate::chat::{Role, ToolDef};

fn role_str(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

pub(super) fn tools_value(tools: &[ToolDef]) -> Value {
    // Built by hand rather than through serde so rendering has no failure path.
    Value::Array(
        tools
            .iter()
            .map(|t| {
                json!({
                    "type": t.kind,
                    "function": {
                        "name": t.function.name,
                        "description": t.function.description,
                        "parameters": t.function.parameters,
                    }
                })
            })
            .collect(),
    )
}

fn messages_value(conv: &Example, format: Format) -> Value {
    // id -> function name of calls not yet answered, to name TRL tool messages.
    let mut open: HashMap<&str, &str> = HashMap::new();
    let mut out = Vec::with_capacity(conv.messages.len());
    for m in &conv.messages {
        let mut obj = Map::new();
        obj.insert("role".into(), role_str(m.role).into());
        // Absent content (a tool-call-only assistant turn) stays absent: both
        // formats accept that, and it parses back to `None`.
        if let Some(content) = &m.content {
            obj.insert("content".into(), content.as_str().into());
        }
        // Both formats, under the name chat templates read (Qwen3's,
        // trainers/chatml_tools.jinja); absent when the turn had none, so a
        // conversation without reasoning renders as it always did.
        if let Some(reasoning) = &m.reasoning {
            obj.insert("reasoning_content".into(), reasoning.as_str().into());
        }
        if !m.tool_calls.is_empty() {
            let calls = m
                .tool_calls
                .iter()
                .map(|call| {
                    open.insert(&call.id, &call.function.name);
                    let arguments = match format {
                        Format::OpenAi => Value::String(call.function.arguments.clone()),
                        Format::Trl => match classify_arguments(&call.function.arguments) {
                            Arguments::Object(map) => Value::Object(map),
                            Arguments::NotObject | Arguments::Invalid(_) => {
                                Value::String(call.function.arguments.clone())
                            }
                        },
                    };
                    json!({
                        "id": call.id,
                        "type": call.kind,
                        "function": {"name": call.function.name, "arguments": arguments},
                    })
                })
                .collect();
            obj.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(id) = &m.tool_call_id {
            obj.insert("tool_call_id".into(), id.as_str().into());
            if format == Format::Trl {
                if let Some(name) = open.remove(id.as_str()) {
                    obj.insert("name".into(), name.into());
                }
            }
        }
        out.push(Value::Object(obj));
    }
    Value::Array(out)
}

/// One line (no trailing newline) of an OpenAI supervised fine-tuning JSONL file.
/// Validates first (see [`validate`]).
pub fn to_openai_line(conv: &Example) -> Result<String, DatasetError> {
    validate(conv)?;
    let mut line = Map::new();
    line.insert("messages".into(), messages_value(conv, Format::OpenAi));
    if !conv.tools.is_empty() {
        line.insert("tools".into(), tools_value(&conv.tools));
        let parallel = conv.messages.iter().any(|m| m.tool_calls.len() > 1);
        line.insert("parallel_tool_calls".into(), parallel.into());
    }
    Ok(Value::Object(line).to_string())
}

/// One line (no trailing newline) of a TRL conversational JSONL file with a `tools`
/// column. Validates first. Arguments that are not a JSON object are written as
/// strings; [`warnings`] reports them.
pub fn to_trl_line(conv: &Example) -> Result<String, DatasetError> {
    validate(conv)?;
    let mut line = Map::new();
    line.insert("messages".into(), messages_value(conv, Format::Trl));
    // Always present, even empty, so every row of the dataset has the same columns.
    line.insert("tools".into(), tools_value(&conv.tools));
    Ok(Value::Object(line).to_string())
}

/// Renders one line in `format`.
pub fn to_line(conv: &Example, format: Format) -> Result<String, DatasetError> {
    match format {
        Format::OpenAi => to_openai_line(conv),
        Format::Trl => to_trl_line(conv),
    }
}
