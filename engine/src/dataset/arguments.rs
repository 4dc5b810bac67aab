//! Tool-call arguments as the formats carry them: OpenAI keeps the string
//! the model produced, TRL wants a JSON object. Here is how an arguments
//! string is classified, how it comes back from a TRL line, and the
//! warnings for what does not stop an export (arguments that are not an
//! object, numbers the normalisation may change, calls never answered).

use serde_json::{Map, Value};

use super::{Example, Format};
use crate::chat::ToolCall;

/// How a recorded arguments string can be written in the TRL format.
pub(super) enum Arguments {
    /// Parsed into a JSON object: written as the object.
    Object(Map<String, Value>),
    /// Valid JSON but not an object (`[1]`, `"x"`, `3`): kept as the string.
    NotObject,
    /// Not JSON at all: kept as the string.
    Invalid(String),
}

pub(super) fn classify_arguments(arguments: &str) -> Arguments {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Arguments::Object(map),
        Ok(_) => Arguments::NotObject,
        Err(e) => Arguments::Invalid(e.to_string()),
    }
}

/// The arguments string as it comes back from a TRL line: an object re-serialised
/// as compact JSON with sorted keys, anything else unchanged. Apply it to the
/// recorded arguments to compare them with [`parse_trl_line`]'s output.
pub fn normalise_arguments(arguments: &str) -> String {
    match classify_arguments(arguments) {
        Arguments::Object(map) => Value::Object(map).to_string(),
        Arguments::NotObject | Arguments::Invalid(_) => arguments.to_owned(),
    }
}

/// Number literals (outside strings) of a JSON text that may not survive
/// `serde_json` parsing and re-serialisation with the same value: integers that fit
/// neither i64 nor u64 (become f64), decimals with more than 15 significant digits
/// (f64 guarantees 15), and literals that `serde_json`'s default best-effort float
/// parser reads differently from the correctly rounded standard parser.
pub(super) fn lossy_numbers(json_text: &str) -> Vec<String> {
    let mut lossy = Vec::new();
    let (mut in_string, mut escaped) = (false, false);
    let mut chars = json_text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        if c == '"' {
            in_string = true;
        } else if c == '-' || c.is_ascii_digit() {
            let mut end = start + c.len_utf8();
            while let Some(&(i, d)) = chars.peek() {
                if d.is_ascii_digit() || matches!(d, '.' | 'e' | 'E' | '+' | '-') {
                    end = i + d.len_utf8();
                    chars.next();
                } else {
                    break;
                }
            }
            let literal = &json_text[start..end];
            if number_is_lossy(literal) {
                lossy.push(literal.to_owned());
            }
        }
    }
    lossy
}

fn number_is_lossy(literal: &str) -> bool {
    if !literal.contains(['.', 'e', 'E']) {
        return literal.parse::<i64>().is_err() && literal.parse::<u64>().is_err();
    }
    let mantissa = literal.split(['e', 'E']).next().unwrap_or(literal);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
    if significant > 15 {
        return true;
    }
    match (literal.parse::<f64>(), serde_json::from_str::<f64>(literal)) {
        (Ok(exact), Ok(parsed)) => exact.to_bits() != parsed.to_bits(),
        _ => false,
    }
}

/// Problems that do not stop an export, one human-readable line each, naming the
/// conversation, run, message and call:
/// * arguments that are not valid JSON (OpenAI: written verbatim; TRL: written as
///   a string instead of an object);
/// * arguments that are valid JSON but not an object (same treatment);
/// * TRL only: number literals the object normalisation may change (see module docs);
/// * tool calls never answered although the conversation went on (chat APIs
///   reject such histories; a call in the last message may legitimately be open).
pub fn warnings(conv: &Example, format: Format) -> Vec<String> {
    let mut out = Vec::new();
    let prefix = |i: usize, k: usize, call: &ToolCall| {
        format!(
            "conversation {:?} (run {:?}), message {i}, tool call {k} ({:?}, id {:?})",
            conv.id, conv.run, call.function.name, call.id
        )
    };
    let last = conv.messages.len().saturating_sub(1);
    // Open calls in issue order, so a warning names the call that issued them.
    let mut open: Vec<(usize, usize, &ToolCall)> = Vec::new();
    for (i, m) in conv.messages.iter().enumerate() {
        if let Some(id) = m.tool_call_id.as_deref() {
            open.retain(|(_, _, c)| c.id != id);
        }
        for (k, call) in m.tool_calls.iter().enumerate() {
            if i != last {
                open.push((i, k, call));
            }
            let kept = match format {
                Format::OpenAi => "written verbatim as a string",
                Format::Trl => "written as a JSON string, not an object",
            };
            match classify_arguments(&call.function.arguments) {
                Arguments::Invalid(e) => out.push(format!(
                    "{}: arguments are not valid JSON ({e}); {kept}",
                    prefix(i, k, call)
                )),
                Arguments::NotObject => out.push(format!(
                    "{}: arguments are valid JSON but not an object; {kept}",
                    prefix(i, k, call)
                )),
                Arguments::Object(_) if format == Format::Trl => {
                    let lossy = lossy_numbers(&call.function.arguments);
                    if !lossy.is_empty() {
                        out.push(format!(
                            "{}: number(s) {} may change value when the arguments are parsed into an object",
                            prefix(i, k, call),
                            lossy.join(", ")
                        ));
                    }
                }
                Arguments::Object(_) => {}
            }
        }
    }
    for (i, k, call) in open {
        out.push(format!(
            "{}: never answered by a tool message",
            prefix(i, k, call)
        ));
    }
    out
}
