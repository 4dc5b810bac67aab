//! Reading an optimizer's reply: finding the JSON object in whatever prose
//! surrounds it, checking it has the proposal's shape (every error with the
//! path where it is, written to be sent back to the optimizer verbatim),
//! and validating the design it proposes.

use serde_json::{Map, Value};

use super::{
    Agent, Contract, Hop, Proposal, ProposalError, Workflow, MAX_LIST_ITEMS, MAX_REPLY_BYTES,
    MAX_TEXT_CHARS,
};

/// How many '{' positions that do not start a JSON object are tried before
/// giving up; bounds the scan on adversarial prose.
const MAX_FAILED_STARTS: usize = 256;

/// Parses and validates an optimizer reply. Accepts the JSON object alone,
/// in a ```json fence, or surrounded by prose (the last balanced object with
/// an `improved_design` key wins). Only `improved_design` (with `agents`) is
/// required: the commentary fields default to empty, since a design without
/// a rationale is still runnable. List fields may be a string or a list of
/// strings. Unknown top-level keys are ignored (commentary); unknown keys
/// inside `improved_design` are errors, because dropping them would silently
/// run a different design than the optimizer proposed. Strings are trimmed.
pub fn parse_proposal(model_text: &str) -> Result<Proposal, ProposalError> {
    if model_text.len() > MAX_REPLY_BYTES {
        return Err(ProposalError::TooLarge {
            bytes: model_text.len(),
        });
    }
    let object = extract_object(model_text)?;
    let proposal = proposal_from_object(&object)?;
    proposal.improved_design.validate_at("improved_design.")?;
    Ok(proposal)
}

/// Index of the `}` matching the `{` at `start`, honouring JSON strings.
fn balanced_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate().skip(start) {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The outermost balanced JSON objects in `text`; prefers the last one that
/// has `improved_design`.
fn extract_object(text: &str) -> Result<Map<String, Value>, ProposalError> {
    let bytes = text.as_bytes();
    // Each parsed object with the length of its source text.
    let mut objects: Vec<(usize, Map<String, Value>)> = Vec::new();
    // The largest balanced region that failed to parse, to explain why.
    let mut best_failure: Option<(usize, String)> = None;
    let mut failed = 0usize;
    let mut i = 0usize;
    while let Some(offset) = text[i..].find('{') {
        let start = i + offset;
        if let Some(end) = balanced_end(bytes, start) {
            // '{' and '}' are ASCII, so both ends are char boundaries.
            let slice = &text[start..=end];
            match serde_json::from_str::<Value>(slice) {
                Ok(Value::Object(map)) => {
                    objects.push((slice.len(), map));
                    i = end + 1;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    if best_failure
                        .as_ref()
                        .is_none_or(|(len, _)| slice.len() > *len)
                    {
                        best_failure = Some((slice.len(), e.to_string()));
                    }
                }
            }
        }
        failed += 1;
        if failed > MAX_FAILED_STARTS {
            break;
        }
        i = start + 1;
    }
    let largest_ok = objects.iter().map(|(len, _)| *len).max().unwrap_or(0);
    if let Some(pos) = objects
        .iter()
        .rposition(|(_, m)| m.contains_key("improved_design"))
    {
        return Ok(objects.swap_remove(pos).1);
    }
    match best_failure {
        // A broken object bigger than anything that parsed is most likely
        // the intended proposal: report its syntax error.
        Some((len, message)) if len > largest_ok => Err(ProposalError::Json { message }),
        _ => match objects.into_iter().max_by_key(|(len, _)| *len) {
            Some((_, map)) => Ok(map),
            None => Err(ProposalError::NoJsonObject),
        },
    }
}

fn schema(path: &str, message: impl Into<String>) -> ProposalError {
    ProposalError::Schema {
        path: path.to_string(),
        message: message.into(),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn join_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Required string field of an object at `path`.
fn req_string(map: &Map<String, Value>, path: &str, key: &str) -> Result<String, ProposalError> {
    match map.get(key) {
        None | Some(Value::Null) => Err(schema(path, format!("is missing \"{key}\""))),
        Some(Value::String(s)) => Ok(s.trim().to_string()),
        Some(other) => Err(schema(
            &join_path(path, key),
            format!("must be a string, found {}", type_name(other)),
        )),
    }
}

/// A string, a list of strings, or absent/null (empty).
fn string_list(value: Option<&Value>, path: &str) -> Result<Vec<String>, ProposalError> {
    let list = match value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => {
            let s = s.trim();
            if s.is_empty() {
                Vec::new()
            } else {
                vec![s.to_string()]
            }
        }
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) if !s.trim().is_empty() => out.push(s.trim().to_string()),
                    Value::String(_) => {}
                    other => {
                        return Err(schema(
                            &format!("{path}[{i}]"),
                            format!("must be a string, found {}", type_name(other)),
                        ))
                    }
                }
            }
            out
        }
        Some(other) => {
            return Err(schema(
                path,
                format!(
                    "must be a string or a list of strings, found {}",
                    type_name(other)
                ),
            ))
        }
    };
    if list.len() > MAX_LIST_ITEMS {
        return Err(schema(
            path,
            format!(
                "has {} entries; at most {MAX_LIST_ITEMS} are allowed",
                list.len()
            ),
        ));
    }
    for (i, s) in list.iter().enumerate() {
        if s.chars().count() > MAX_TEXT_CHARS {
            return Err(schema(
                &format!("{path}[{i}]"),
                format!("is longer than {MAX_TEXT_CHARS} characters"),
            ));
        }
    }
    Ok(list)
}

/// A prose field: a string (a list of strings is joined with newlines).
fn prose(value: Option<&Value>, path: &str) -> Result<String, ProposalError> {
    let text = match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.trim().to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(v @ Value::Array(_)) => string_list(Some(v), path)?.join("\n"),
        Some(other) => {
            return Err(schema(
                path,
                format!("must be a string, found {}", type_name(other)),
            ))
        }
    };
    if text.chars().count() > MAX_TEXT_CHARS {
        return Err(schema(
            path,
            format!("is longer than {MAX_TEXT_CHARS} characters"),
        ));
    }
    Ok(text)
}

fn object_at<'v>(value: &'v Value, path: &str) -> Result<&'v Map<String, Value>, ProposalError> {
    match value {
        Value::Object(m) => Ok(m),
        other => Err(schema(
            path,
            format!("must be an object, found {}", type_name(other)),
        )),
    }
}

fn array_at<'v>(
    map: &'v Map<String, Value>,
    path: &str,
    key: &str,
    required: bool,
) -> Result<&'v [Value], ProposalError> {
    match map.get(key) {
        None | Some(Value::Null) if required => Err(schema(path, format!("is missing \"{key}\""))),
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(schema(
            &join_path(path, key),
            format!("must be a list, found {}", type_name(other)),
        )),
    }
}

fn deny_unknown(
    map: &Map<String, Value>,
    path: &str,
    allowed: &[&str],
) -> Result<(), ProposalError> {
    match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(schema(
            path,
            format!(
                "has unknown field \"{k}\" (expected {})",
                allowed
                    .iter()
                    .map(|a| format!("\"{a}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        None => Ok(()),
    }
}

fn workflow_from_value(value: &Value, path: &str) -> Result<Workflow, ProposalError> {
    // Some models double-encode the design as a JSON string.
    let decoded;
    let value = match value {
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => {
                decoded = v;
                &decoded
            }
            _ => return Err(schema(path, "must be an object, found a string")),
        },
        v => v,
    };
    let map = object_at(value, path)?;
    deny_unknown(map, path, &["agents", "contracts", "hops"])?;
    let mut w = Workflow::default();
    for (i, item) in array_at(map, path, "agents", true)?.iter().enumerate() {
        let p = format!("{path}.agents[{i}]");
        let m = object_at(item, &p)?;
        deny_unknown(m, &p, &["agent_id", "role", "instruction"])?;
        w.agents.push(Agent {
            agent_id: req_string(m, &p, "agent_id")?,
            role: req_string(m, &p, "role")?,
            instruction: req_string(m, &p, "instruction")?,
        });
    }
    for (i, item) in array_at(map, path, "contracts", false)?.iter().enumerate() {
        let p = format!("{path}.contracts[{i}]");
        let m = object_at(item, &p)?;
        deny_unknown(m, &p, &["agent_id", "returns", "checks"])?;
        w.contracts.push(Contract {
            agent_id: req_string(m, &p, "agent_id")?,
            returns: req_string(m, &p, "returns")?,
            checks: string_list(m.get("checks"), &format!("{p}.checks"))?,
        });
    }
    for (i, item) in array_at(map, path, "hops", false)?.iter().enumerate() {
        let p = format!("{path}.hops[{i}]");
        let m = object_at(item, &p)?;
        deny_unknown(m, &p, &["from", "to", "handoff", "send_back_when"])?;
        let send_back_when = match m.get("send_back_when") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.trim().is_empty() => None,
            Some(Value::String(s)) => Some(s.trim().to_string()),
            Some(other) => {
                return Err(schema(
                    &format!("{p}.send_back_when"),
                    format!("must be a string or null, found {}", type_name(other)),
                ))
            }
        };
        w.hops.push(Hop {
            from: req_string(m, &p, "from")?,
            to: req_string(m, &p, "to")?,
            handoff: req_string(m, &p, "handoff")?,
            send_back_when,
        });
    }
    Ok(w)
}

fn proposal_from_object(map: &Map<String, Value>) -> Result<Proposal, ProposalError> {
    let design = match map.get("improved_design") {
        None | Some(Value::Null) => return Err(schema("", "is missing \"improved_design\"")),
        Some(v) => workflow_from_value(v, "improved_design")?,
    };
    Ok(Proposal {
        improved_design: design,
        changes_from_previous: string_list(
            map.get("changes_from_previous"),
            "changes_from_previous",
        )?,
        why_it_should_improve: prose(map.get("why_it_should_improve"), "why_it_should_improve")?,
        evidence_used: string_list(map.get("evidence_used"), "evidence_used")?,
        expected_impact: prose(map.get("expected_impact"), "expected_impact")?,
        verification_checks: string_list(map.get("verification_checks"), "verification_checks")?,
    })
}
