//! The seven harness tools as the model calls them: [`Invocation`], one
//! validated call, and the parser that turns a raw tool call (a name and a
//! JSON argument string) into one, or into an error text the model can act
//! on (it quotes the argument shape expected).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ToolError;

/// One validated tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "tool", rename_all = "snake_case")]
pub enum Invocation {
    Bash {
        command: String,
        timeout_secs: Option<u64>,
    },
    ReadFile {
        path: String,
    },
    WriteFile {
        path: String,
        content: String,
    },
    ListFiles {
        path: Option<String>,
    },
    /// Runs the task's checks on the workspace (carried out by the harness:
    /// the checks live outside the workspace).
    RunChecks,
    Delegate {
        role: String,
        instructions: String,
        contract: String,
    },
    Finish {
        report: String,
    },
}

impl Invocation {
    /// The tool's name as the model calls it.
    pub fn tool_name(&self) -> &'static str {
        match self {
            Invocation::Bash { .. } => "bash",
            Invocation::ReadFile { .. } => "read_file",
            Invocation::WriteFile { .. } => "write_file",
            Invocation::ListFiles { .. } => "list_files",
            Invocation::RunChecks => "run_checks",
            Invocation::Delegate { .. } => "delegate",
            Invocation::Finish { .. } => "finish",
        }
    }
}

/// The argument shape of each tool, quoted in every argument error so the
/// model can correct its call without looking the schema up again.
fn signature(tool: &str) -> Option<(&'static str, &'static str)> {
    Some(match tool {
        "bash" => ("bash", r#"{"command": string, "timeout_secs"?: integer}"#),
        "read_file" => ("read_file", r#"{"path": string}"#),
        "write_file" => ("write_file", r#"{"path": string, "content": string}"#),
        "list_files" => ("list_files", r#"{"path"?: string}"#),
        "run_checks" => ("run_checks", "{}"),
        "delegate" => (
            "delegate",
            r#"{"role": string, "instructions": string, "contract": string}"#,
        ),
        "finish" => ("finish", r#"{"report": string}"#),
        _ => return None,
    })
}

/// Parses one tool call; the error is the text to hand back to the model.
pub fn parse_call(name: &str, arguments: &str) -> Result<Invocation, String> {
    parse_invocation(name, arguments).map_err(|e| e.to_string())
}

/// [`parse_call`] with the structured error. Unknown fields are ignored (models
/// often add commentary fields); empty arguments count as `{}` because some
/// backends send `""` for a call without arguments.
pub fn parse_invocation(name: &str, arguments: &str) -> Result<Invocation, ToolError> {
    let (tool, expected) = signature(name).ok_or_else(|| ToolError::UnknownTool {
        name: name.to_owned(),
    })?;
    let trimmed = arguments.trim();
    let value: Value = if trimmed.is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str(trimmed).map_err(|e| ToolError::BadJson {
            tool,
            message: e.to_string(),
            expected,
        })?
    };
    let obj = match value {
        Value::Object(obj) => obj,
        other => {
            return Err(ToolError::BadArguments {
                tool,
                field: None,
                problem: format!("arguments must be a JSON object, got {}", kind_of(&other)),
                expected,
            })
        }
    };
    let args = Args {
        tool,
        expected,
        obj: &obj,
    };
    Ok(match tool {
        "bash" => Invocation::Bash {
            command: args.required_str("command")?,
            timeout_secs: args.optional_u64("timeout_secs")?,
        },
        "read_file" => Invocation::ReadFile {
            path: args.required_str("path")?,
        },
        "write_file" => Invocation::WriteFile {
            path: args.required_str("path")?,
            content: args.required_str("content")?,
        },
        "list_files" => Invocation::ListFiles {
            path: args.optional_str("path")?,
        },
        "run_checks" => Invocation::RunChecks,
        "delegate" => Invocation::Delegate {
            role: args.required_str("role")?,
            instructions: args.required_str("instructions")?,
            contract: args.required_str("contract")?,
        },
        _ => Invocation::Finish {
            report: args.required_str("report")?,
        },
    })
}

struct Args<'a> {
    tool: &'static str,
    expected: &'static str,
    obj: &'a Map<String, Value>,
}

impl Args<'_> {
    fn bad(&self, field: &'static str, problem: String) -> ToolError {
        ToolError::BadArguments {
            tool: self.tool,
            field: Some(field),
            problem,
            expected: self.expected,
        }
    }

    fn required_str(&self, field: &'static str) -> Result<String, ToolError> {
        self.optional_str(field)?
            .ok_or_else(|| self.bad(field, format!("missing field {field:?}")))
    }

    /// `null` counts as absent: models write `"path": null` for "no path".
    fn optional_str(&self, field: &'static str) -> Result<Option<String>, ToolError> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.bad(
                field,
                format!("field {field:?} must be a string, got {}", kind_of(other)),
            )),
        }
    }

    fn optional_u64(&self, field: &'static str) -> Result<Option<u64>, ToolError> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
            Some(other) => Err(self.bad(
                field,
                format!(
                    "field {field:?} must be a non-negative integer, got {}",
                    describe(other)
                ),
            )),
        }
    }
}

/// A JSON value's kind in words ("a string"), for error messages.
pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A short description of a wrong value: small scalars verbatim (so `-3` or
/// `2.5` shows what was wrong), anything else by kind.
fn describe(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        other => kind_of(other).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_call_accepts_valid_calls() {
        assert_eq!(
            parse_call(
                "bash",
                r#"{"command": "ls", "timeout_secs": 30, "why": "look"}"#
            ),
            Ok(Invocation::Bash {
                command: "ls".into(),
                timeout_secs: Some(30)
            })
        );
        assert_eq!(
            parse_call("read_file", r#"{"path":"a.txt"}"#),
            Ok(Invocation::ReadFile {
                path: "a.txt".into()
            })
        );
        assert_eq!(
            parse_call("write_file", r#"{"path":"a","content":""}"#),
            Ok(Invocation::WriteFile {
                path: "a".into(),
                content: String::new()
            })
        );
        assert_eq!(
            parse_call("list_files", ""),
            Ok(Invocation::ListFiles { path: None })
        );
        assert_eq!(
            parse_call("list_files", r#"{"path": null}"#),
            Ok(Invocation::ListFiles { path: None })
        );
        assert_eq!(
            parse_call(
                "delegate",
                r#"{"role":"r","instructions":"i","contract":"c"}"#
            ),
            Ok(Invocation::Delegate {
                role: "r".into(),
                instructions: "i".into(),
                contract: "c".into()
            })
        );
        assert_eq!(
            parse_call("finish", r#"{"report":"done"}"#),
            Ok(Invocation::Finish {
                report: "done".into()
            })
        );
    }

    #[test]
    fn parse_call_errors_are_actionable() {
        assert_eq!(
            parse_call("write_file", r#"{"path":"a"}"#).unwrap_err(),
            r#"invalid arguments for write_file: missing field "content" (expected {"path": string, "content": string})"#
        );
        assert_eq!(
            parse_call("rm", "{}").unwrap_err(),
            r#"unknown tool "rm"; available tools: bash, read_file, write_file, list_files, run_checks, delegate, finish"#
        );
        let bad_json = parse_call("bash", "{\"a\": }").unwrap_err();
        assert!(
            bad_json.starts_with(
                "arguments for bash are not valid JSON: expected value at line 1 column 7"
            ),
            "{bad_json}"
        );
        assert_eq!(
            parse_call("read_file", r#"{"path": 3}"#).unwrap_err(),
            r#"invalid arguments for read_file: field "path" must be a string, got a number (expected {"path": string})"#
        );
        assert_eq!(
            parse_call("bash", r#"["ls"]"#).unwrap_err(),
            r#"invalid arguments for bash: arguments must be a JSON object, got an array (expected {"command": string, "timeout_secs"?: integer})"#
        );
        let neg = parse_call("bash", r#"{"command":"ls","timeout_secs":-3}"#).unwrap_err();
        assert!(
            neg.contains(r#"field "timeout_secs" must be a non-negative integer, got -3"#),
            "{neg}"
        );
        assert!(parse_call("bash", r#"{"command":"ls","timeout_secs":"9"}"#).is_err());
        assert!(parse_call("finish", "")
            .unwrap_err()
            .contains("missing field \"report\""));
        assert!(parse_call("delegate", r#"{"role":"r","instructions":"i"}"#)
            .unwrap_err()
            .contains("missing field \"contract\""));
        match parse_invocation("write_file", r#"{"path":"a","content":1}"#) {
            Err(ToolError::BadArguments { tool, field, .. }) => {
                assert_eq!((tool, field), ("write_file", Some("content")));
            }
            other => panic!("{other:?}"),
        }
    }
}
