//! Parsing a line of either wire format back into the chat types, so tests
//! can prove nothing is lost on the way and a dataset in OpenAI's format
//! can be converted to TRL's. Checks shape only, with where each problem
//! is; the conversation rules are `validate.rs`'s.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use super::{DatasetError, Format, Location, ParsedLine};
use crate::chat::{FunctionCall, FunctionDef, Message, Role, ToolCall, ToolDef};

fn line_err(at: Location, reason: impl Into<String>) -> DatasetError {
    DatasetError::Line {
        at,
        reason: reason.into(),
    }
}

/// Parses a line written by [`to_openai_line`] (or any OpenAI fine-tuning line with
/// string contents). Checks shape only; run [`validate`] on the result for the
/// conversation rules.
pub fn parse_openai_line(line: &str) -> Result<ParsedLine, DatasetError> {
    parse_line(line, Format::OpenAi)
}

/// Parses a TRL line written by [`to_trl_line`], or one in TRL's documented shape
/// without ids: a call without `id` gets `call_<message>_<call>` (made unique), and
/// a tool message without `tool_call_id` answers the earliest unanswered call with
/// its `name` (or the earliest unanswered call if it has no `name`). Object
/// arguments come back as compact JSON ([`normalise_arguments`]); string arguments
/// come back unchanged.
pub fn parse_trl_line(line: &str) -> Result<ParsedLine, DatasetError> {
    parse_line(line, Format::Trl)
}

fn parse_line(line: &str, format: Format) -> Result<ParsedLine, DatasetError> {
    let value: Value = serde_json::from_str(line).map_err(DatasetError::LineJson)?;
    let obj = value
        .as_object()
        .ok_or_else(|| line_err(Location::Whole, "must be a JSON object"))?;
    let raw_messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| line_err(Location::Whole, "needs a \"messages\" array"))?;
    let tools = parse_tools(obj)?;
    let parallel_tool_calls = parse_parallel_flag(obj)?;
    // Ids present in the line, so synthesised ones cannot collide with them.
    let mut taken = ids_in_line(raw_messages);
    // (id, function name) of calls not yet answered, in issue order.
    let mut pending: Vec<(String, String)> = Vec::new();
    let mut messages = Vec::with_capacity(raw_messages.len());
    for (i, raw) in raw_messages.iter().enumerate() {
        messages.push(parse_message(i, raw, format, &mut taken, &mut pending)?);
    }
    Ok(ParsedLine {
        messages,
        tools,
        parallel_tool_calls,
    })
}

/// The line's `tools` (absent or null: none).
fn parse_tools(obj: &Map<String, Value>) -> Result<Vec<ToolDef>, DatasetError> {
    match obj.get("tools") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, t)| parse_tool(i, t))
            .collect(),
        Some(_) => Err(line_err(Location::Whole, "\"tools\" must be an array")),
    }
}

/// The line's `parallel_tool_calls`, as written (absent or null: `None`).
fn parse_parallel_flag(obj: &Map<String, Value>) -> Result<Option<bool>, DatasetError> {
    match obj.get("parallel_tool_calls") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(line_err(
            Location::Whole,
            "\"parallel_tool_calls\" must be a boolean",
        )),
    }
}

/// Every tool call id the line's messages carry.
fn ids_in_line(raw_messages: &[Value]) -> BTreeSet<String> {
    let mut taken: BTreeSet<String> = BTreeSet::new();
    for m in raw_messages {
        for call in m
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                taken.insert(id.to_owned());
            }
        }
    }
    taken
}

/// `messages[i]`: its calls join `pending`, and the call it answers leaves it.
fn parse_message(
    i: usize,
    raw: &Value,
    format: Format,
    taken: &mut BTreeSet<String>,
    pending: &mut Vec<(String, String)>,
) -> Result<Message, DatasetError> {
    let at = Location::Message(i);
    let m = raw
        .as_object()
        .ok_or_else(|| line_err(at, "must be a JSON object"))?;
    let role = parse_role(m, at)?;
    let content = optional_string(m, "content", at)?;
    let tool_calls = parse_calls(m, i, format, taken, pending)?;
    let tool_call_id = answered_call(m, role, format, at, pending)?;
    // An empty string is no reasoning, as when a message is read from a
    // server's reply (`chat::reasoning_text`).
    let reasoning = optional_string(m, "reasoning_content", at)?.filter(|r| !r.is_empty());
    Ok(Message {
        role,
        content,
        tool_calls,
        tool_call_id,
        reasoning,
    })
}

fn parse_role(m: &Map<String, Value>, at: Location) -> Result<Role, DatasetError> {
    match m.get("role").and_then(Value::as_str) {
        Some("system") => Ok(Role::System),
        Some("user") => Ok(Role::User),
        Some("assistant") => Ok(Role::Assistant),
        Some("tool") => Ok(Role::Tool),
        Some(other) => Err(line_err(
            at,
            format!("unsupported role {other:?} (system, user, assistant or tool)"),
        )),
        None => Err(line_err(at, "needs a string \"role\"")),
    }
}

/// `messages[i].tool_calls`, each added to `pending` as it is issued.
fn parse_calls(
    m: &Map<String, Value>,
    i: usize,
    format: Format,
    taken: &mut BTreeSet<String>,
    pending: &mut Vec<(String, String)>,
) -> Result<Vec<ToolCall>, DatasetError> {
    let mut tool_calls = Vec::new();
    match m.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(raw_calls)) => {
            for (k, raw_call) in raw_calls.iter().enumerate() {
                let call = parse_call(
                    raw_call,
                    format,
                    Location::ToolCall {
                        message: i,
                        call: k,
                    },
                    taken,
                )?;
                pending.push((call.id.clone(), call.function.name.clone()));
                tool_calls.push(call);
            }
        }
        Some(_) => {
            return Err(line_err(
                Location::Message(i),
                "\"tool_calls\" must be an array",
            ))
        }
    }
    Ok(tool_calls)
}

/// The `tool_call_id` a message answers, taken off `pending`. A TRL tool
/// message without one answers the earliest unanswered call with its
/// `name` (or the earliest unanswered call if it has no `name`).
fn answered_call(
    m: &Map<String, Value>,
    role: Role,
    format: Format,
    at: Location,
    pending: &mut Vec<(String, String)>,
) -> Result<Option<String>, DatasetError> {
    let mut tool_call_id = optional_string(m, "tool_call_id", at)?;
    if let Some(id) = &tool_call_id {
        if let Some(p) = pending.iter().position(|(pid, _)| pid == id) {
            pending.remove(p);
        }
    } else if role == Role::Tool && format == Format::Trl {
        let name = m.get("name").and_then(Value::as_str);
        let p = match name {
            Some(name) => pending.iter().position(|(_, n)| n == name),
            None => (!pending.is_empty()).then_some(0),
        }
        .ok_or_else(|| {
            line_err(
                at,
                "tool message has no tool_call_id and answers no unanswered call",
            )
        })?;
        tool_call_id = Some(pending.remove(p).0);
    }
    Ok(tool_call_id)
}

fn optional_string(
    m: &Map<String, Value>,
    key: &str,
    at: Location,
) -> Result<Option<String>, DatasetError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(line_err(at, format!("\"{key}\" must be a string or null"))),
    }
}

fn parse_call(
    raw: &Value,
    format: Format,
    at: Location,
    taken: &mut BTreeSet<String>,
) -> Result<ToolCall, DatasetError> {
    let call = raw
        .as_object()
        .ok_or_else(|| line_err(at, "must be a JSON object"))?;
    let kind = match call.get("type") {
        None | Some(Value::Null) => "function".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(line_err(at, "\"type\" must be a string")),
    };
    let function = call
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| line_err(at, "needs a \"function\" object"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| line_err(at, "needs a string \"function.name\""))?
        .to_owned();
    let arguments = match (format, function.get("arguments")) {
        (_, Some(Value::String(s))) => s.clone(),
        // Lines we write only hold objects here; other JSON values are accepted
        // the same way, as their compact text.
        (Format::Trl, Some(other)) => other.to_string(),
        (Format::OpenAi, Some(_)) => {
            return Err(line_err(at, "\"function.arguments\" must be a JSON string"))
        }
        (_, None) => return Err(line_err(at, "needs \"function.arguments\"")),
    };
    let id = match (format, call.get("id")) {
        (_, Some(Value::String(s))) => s.clone(),
        (Format::Trl, None | Some(Value::Null)) => synthesise_id(at, taken),
        (Format::OpenAi, None | Some(Value::Null)) => {
            return Err(line_err(at, "needs a string \"id\""))
        }
        (_, Some(_)) => return Err(line_err(at, "\"id\" must be a string")),
    };
    Ok(ToolCall {
        id,
        kind,
        function: FunctionCall { name, arguments },
    })
}

fn synthesise_id(at: Location, taken: &mut BTreeSet<String>) -> String {
    let base = match at {
        Location::ToolCall { message, call } => format!("call_{message}_{call}"),
        _ => "call".to_owned(),
    };
    let mut id = base.clone();
    let mut n = 1u32;
    while taken.contains(&id) {
        id = format!("{base}_{n}");
        n += 1;
    }
    taken.insert(id.clone());
    id
}

fn parse_tool(index: usize, raw: &Value) -> Result<ToolDef, DatasetError> {
    let at = Location::Tool(index);
    let tool = raw
        .as_object()
        .ok_or_else(|| line_err(at, "must be a JSON object"))?;
    let kind = match tool.get("type") {
        None | Some(Value::Null) => "function".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(line_err(at, "\"type\" must be a string")),
    };
    let function = tool
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| line_err(at, "needs a \"function\" object"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| line_err(at, "needs a string \"function.name\""))?
        .to_owned();
    // Both optional in the OpenAI schema; `ToolDef` requires them, so use the
    // neutral values (no description, no parameters). Other keys (e.g. `strict`)
    // have no place in `ToolDef` and are dropped.
    let description = match function.get("description") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(line_err(at, "\"function.description\" must be a string")),
    };
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p) => p.clone(),
    };
    Ok(ToolDef {
        kind,
        function: FunctionDef {
            name,
            description,
            parameters,
        },
    })
}
