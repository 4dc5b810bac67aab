//! The JSON-schema definitions of the harness tools offered to the model,
//! one function per tool, in the order of [`TOOL_NAMES`](super::TOOL_NAMES).
//! Their descriptions are what the model reads about each tool, so they
//! are part of every recorded request.

use serde_json::json;

use crate::chat::ToolDef;

/// JSON-schema definitions of the tools offered to the model. Subagents get
/// no `delegate` (`include_delegate = false`): only the orchestrator hands
/// work out, which keeps the team one level deep as in MASS.
pub fn tool_defs(include_delegate: bool) -> Vec<ToolDef> {
    let mut defs = vec![
        bash_def(),
        read_file_def(),
        write_file_def(),
        list_files_def(),
        run_checks_def(),
        delegate_def(),
        finish_def(),
    ];
    if !include_delegate {
        defs.retain(|d| d.function.name != "delegate");
    }
    defs
}

/// `bash`: a shell command in the workspace root.
fn bash_def() -> ToolDef {
    ToolDef::new(
        "bash",
        "Run a shell command with `bash -c` in the workspace root (the current directory; HOME is \
         the workspace too). The command gets no stdin and a minimal environment (PATH, HOME, \
         LANG, TMPDIR). It is killed with all its child processes when the timeout expires, and \
         background processes do not survive the call. stdout and stderr are returned \
         separately with the exit code; long output is cut with a `[... truncated: N more \
         bytes]` marker, so redirect large output to a file and inspect it with head/tail/grep.",
        json!({
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "description": "The shell command to run, e.g. `python3 analysis.py > logs.txt 2>&1; tail -n 20 logs.txt`."
                },
                "timeout_secs": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Seconds before the command is killed. Optional; defaults to, and cannot exceed, the harness's limit."
                }
            },
            "required": ["command"]
        }),
    )
}

/// `read_file`: a text file of the workspace.
fn read_file_def() -> ToolDef {
    ToolDef::new(
        "read_file",
        "Read a text file of the workspace. The path is relative to the workspace root; \
         absolute paths and paths leading outside the workspace are refused. Invalid UTF-8 is \
         replaced, and a long file is cut with a `[... truncated: N more bytes]` marker (use \
         bash with sed -n or grep to read a specific part).",
        json!({
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "File path relative to the workspace root, e.g. `results/metrics.json`."
                }
            },
            "required": ["path"]
        }),
    )
}

/// `write_file`: create or overwrite a file of the workspace.
fn write_file_def() -> ToolDef {
    ToolDef::new(
        "write_file",
        "Create or overwrite a file of the workspace with the given content, creating missing \
         parent directories. The path is relative to the workspace root; paths outside the \
         workspace and writes through symlinks are refused. Returns the number of bytes written.",
        json!({
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "File path relative to the workspace root, e.g. `src/model.py`."
                },
                "content": {
                    "type": "string",
                    "description": "The complete new content of the file."
                }
            },
            "required": ["path", "content"]
        }),
    )
}

/// `list_files`: a recursive, sorted listing.
fn list_files_def() -> ToolDef {
    ToolDef::new(
        "list_files",
        "List the files under a directory of the workspace, recursively, as paths relative to \
         the workspace root in sorted order. Directories end with `/`; symlinks are shown as \
         `path -> target` and not followed. Long listings stop with a marker.",
        json!({
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "Directory relative to the workspace root. Optional; defaults to the whole workspace."
                }
            }
        }),
    )
}

/// `run_checks`: the task's checks on the workspace as it is now.
fn run_checks_def() -> ToolDef {
    ToolDef::new(
        "run_checks",
        "Run the task's checks on the workspace as it is now. Returns PASS or FAIL per check and \
         the SCORE line, without the checks' expected values. The checks are not in the workspace \
         and cannot be read or changed.",
        json!({"type": "object", "properties": {}}),
    )
}

/// `delegate`: work handed to a subagent (the orchestrator's only).
fn delegate_def() -> ToolDef {
    ToolDef::new(
        "delegate",
        "Hand a piece of work to a subagent and wait for its report. The subagent works in the \
         same workspace with bash, read_file, write_file and list_files, but sees only what you \
         write here, not your conversation: give it everything it needs.",
        json!({
            "type": "object",
            "properties": {
                "role": {
                    "type": "string",
                    "description": "The subagent's role, e.g. `data analyst` or `reviewer`."
                },
                "instructions": {
                    "type": "string",
                    "description": "What to do: the goal, the inputs and files to use, and the constraints."
                },
                "contract": {
                    "type": "string",
                    "description": "What the subagent must return to you and which checks it must run before reporting."
                }
            },
            "required": ["role", "instructions", "contract"]
        }),
    )
}

/// `finish`: the final report.
fn finish_def() -> ToolDef {
    ToolDef::new(
        "finish",
        "End your work and hand in your final report. Call it once, when the deliverables are in \
         the workspace and checked; nothing after it is executed.",
        json!({
            "type": "object",
            "properties": {
                "report": {
                    "type": "string",
                    "description": "Your final report: what was done, where the deliverables are, what was verified and what remains uncertain."
                }
            },
            "required": ["report"]
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{parse_call, TOOL_NAMES};
    use serde_json::{Map, Value};

    #[test]
    fn tool_defs_match_the_parser() {
        let all = tool_defs(true);
        let names: Vec<&str> = all.iter().map(|d| d.function.name.as_str()).collect();
        assert_eq!(names, TOOL_NAMES);
        let sub = tool_defs(false);
        assert!(!sub.iter().any(|d| d.function.name == "delegate"));
        assert_eq!(sub.len(), 6);
        for def in &all {
            let params = &def.function.parameters;
            assert_eq!(params["type"], "object");
            assert!(!def.function.description.is_empty());
            // A call with exactly the required string fields parses.
            let mut args = Map::new();
            for field in params["required"].as_array().into_iter().flatten() {
                args.insert(field.as_str().unwrap().to_owned(), json!("x"));
            }
            let text = Value::Object(args).to_string();
            let inv = parse_call(&def.function.name, &text).unwrap();
            assert_eq!(inv.tool_name(), def.function.name);
        }
    }
}
