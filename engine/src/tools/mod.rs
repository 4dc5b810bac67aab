//! The harness's workspace tools: what an executor agent (orchestrator or
//! subagent) can do to the directory its team works in, and how the model's raw
//! tool calls are turned into those actions.
//!
//! This module owns three things. [`Workspace`] confines the file tools
//! (`read_file`, `write_file`, `list_files`) to one directory: every path is
//! resolved component by component without ever following a symlink out of the
//! root, and writes never go through a symlink. [`Workspace::bash`] runs a
//! command in that directory confined by the `sandbox` crate at the
//! experiment's level ([`Confinement`]: Landlock, namespaces, seccomp and
//! rlimits; see ARCHITECTURE.md for what each level blocks), with an
//! allow-listed environment (no API keys or other host variables), no stdin,
//! a timeout that kills the command's whole process group (and with it the
//! sandbox's PID namespace), and capped, fully drained output; its rendering
//! for the model ([`BashOutput::render`]) is a pure function of the outcome so
//! that the content-addressed ids of a run do not depend on timings or pids.
//! [`parse_call`] validates the JSON arguments the model produced for the
//! seven harness tools and answers with an error text the model can act on,
//! and [`tool_defs`] gives the schemas offered to the model.
//!
//! What it does not own: `run_checks`, `delegate` and `finish` are parsed here
//! but carried out by the harness (`run_checks` through `checks.rs`).
//!
//! The module is split by concern: `calls` (the validated [`Invocation`]
//! and the parser of the model's raw calls), `defs` (the schemas offered
//! to the model), `files` (path resolution and the file tools) and `bash`
//! (the confined command and its captured output). [`Workspace`] itself,
//! what every tool works on, and [`Workspace::run`], which carries out a
//! call, live here; everything public is re-exported, so
//! `engine::tools::X` names it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

mod bash;
mod calls;
mod defs;
mod files;

pub use bash::{BashOptions, BashOutput, Confinement};
pub(crate) use calls::kind_of;
pub use calls::{parse_call, parse_invocation, Invocation};
pub use defs::tool_defs;

/// The seven tools of the harness, in the order they are offered and listed.
pub const TOOL_NAMES: [&str; 7] = [
    "bash",
    "read_file",
    "write_file",
    "list_files",
    "run_checks",
    "delegate",
    "finish",
];

/// Most entries `list_files` returns before it stops with a marker: a listing
/// of a `node_modules` or a dataset must not flood the model's context.
pub const LIST_CAP: usize = 2000;

/// The only `PATH` a command sees: the system directories, never the
/// harness's own (which may point at toolchains or credential helpers).
pub const BASH_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Name of the per-workspace temporary directory handed to commands as
/// `TMPDIR`, so scratch files stay inside the judged workspace rather than in
/// a shared /tmp where runs could see each other's files.
pub const TMP_DIR_NAME: &str = ".tmp";

/// Why a workspace tool could not do what was asked. Every variant names the
/// tool and the path (as the model wrote it) or the argument field involved,
/// because its text is shown to the model as the tool result.
#[derive(Debug, Error)]
pub enum ToolError {
    #[error("workspace root {}: {source}", path.display())]
    Root { path: PathBuf, source: io::Error },
    #[error("workspace root {} is not a directory", path.display())]
    RootNotDir { path: PathBuf },
    #[error("{tool}: invalid path {path:?}: {reason}")]
    InvalidPath {
        tool: &'static str,
        path: String,
        reason: String,
    },
    #[error("{tool}: path {path:?} is outside the workspace: {reason}")]
    Escape {
        tool: &'static str,
        path: String,
        reason: String,
    },
    #[error("{tool}: {path:?} does not exist")]
    NotFound { tool: &'static str, path: String },
    #[error("{tool}: {path:?} is a directory")]
    IsDirectory { tool: &'static str, path: String },
    #[error("{tool}: {path:?} is not a regular file")]
    NotRegularFile { tool: &'static str, path: String },
    #[error("{tool}: refusing to write through the symlink {path:?}; write to its target instead")]
    WriteThroughSymlink { tool: &'static str, path: String },
    #[error("{tool}: cannot {op} {path:?}: {source}")]
    Io {
        tool: &'static str,
        op: &'static str,
        path: String,
        source: io::Error,
    },
    #[error("bash: cannot {op}: {source}")]
    Bash { op: &'static str, source: io::Error },
    /// The command could not be confined as the experiment asks; it was not run.
    #[error("bash: the sandbox could not be set up, so the command was not run: {0}")]
    Sandbox(#[from] sandbox::SandboxError),
    #[error("unknown tool {name:?}; available tools: {}", TOOL_NAMES.join(", "))]
    UnknownTool { name: String },
    #[error("arguments for {tool} are not valid JSON: {message} (expected {expected})")]
    BadJson {
        tool: &'static str,
        message: String,
        expected: &'static str,
    },
    #[error("invalid arguments for {tool}: {problem} (expected {expected})")]
    BadArguments {
        tool: &'static str,
        /// The offending field; `None` when the arguments as a whole are wrong.
        field: Option<&'static str>,
        problem: String,
        expected: &'static str,
    },
}

/// The directory a team works in. All file tool paths are relative to it and
/// stay inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// Opens an existing directory as a workspace. The root is canonicalised
    /// so that containment checks compare real paths.
    pub fn new(root: &Path) -> Result<Self, ToolError> {
        let canon = fs::canonicalize(root).map_err(|source| ToolError::Root {
            path: root.to_path_buf(),
            source,
        })?;
        if !canon.is_dir() {
            return Err(ToolError::RootNotDir { path: canon });
        }
        Ok(Workspace { root: canon })
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Executes a workspace tool and returns the text for the model. Failures
    /// come back as `error: ...` text, never as a panic or an `Err`, because
    /// the model is expected to read them and correct itself. A call's
    /// `timeout_secs` may shorten the bash timeout but not exceed `opts.timeout`.
    pub fn run(&self, inv: &Invocation, opts: &BashOptions, read_cap: usize) -> String {
        let result = match inv {
            Invocation::Bash {
                command,
                timeout_secs,
            } => {
                let mut effective = opts.clone();
                if let Some(secs) = timeout_secs {
                    effective.timeout = Duration::from_secs((*secs).max(1)).min(opts.timeout);
                }
                self.bash(command, &effective).map(|out| out.render())
            }
            Invocation::ReadFile { path } => self.read_file(path, read_cap).map(|text| {
                if text.is_empty() {
                    "(empty file)".to_owned()
                } else {
                    text
                }
            }),
            Invocation::WriteFile { path, content } => self
                .write_file(path, content)
                .map(|n| format!("wrote {n} bytes to {path}")),
            Invocation::ListFiles { path } => self.list_files(path.as_deref()).map(|entries| {
                if entries.is_empty() {
                    "(empty directory)".to_owned()
                } else {
                    entries.join("\n")
                }
            }),
            Invocation::RunChecks | Invocation::Delegate { .. } | Invocation::Finish { .. } => {
                return format!(
                    "error: {} is handled by the harness, not by the workspace",
                    inv.tool_name()
                )
            }
        };
        result.unwrap_or_else(|e| format!("error: {e}"))
    }
}

/// Cuts `bytes` before a multi-byte UTF-8 character that was split at the
/// end, so a truncated text ends cleanly instead of in a replacement char.
fn complete_prefix_len(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=n.min(4) {
        let b = bytes[n - back];
        if b & 0xC0 != 0x80 {
            // `b` starts the last character; how long should it be?
            let need = match b {
                0xF0..=0xFF => 4,
                0xE0..=0xEF => 3,
                0xC0..=0xDF => 2,
                _ => 1,
            };
            return if back < need { n - back } else { n };
        }
    }
    n
}

/// Lossy text of a capped stream plus, if it was cut, the marker line.
/// Returns the text and whether anything was cut.
fn capped_text(kept: &[u8], total: u64) -> (String, bool) {
    let cut = if total > kept.len() as u64 {
        complete_prefix_len(kept)
    } else {
        kept.len()
    };
    let mut text = String::from_utf8_lossy(&kept[..cut]).into_owned();
    let more = total.saturating_sub(cut as u64);
    if more > 0 {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("[... truncated: {more} more bytes]"));
    }
    (text, more > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tempfile::TempDir;

    pub(super) fn ws() -> (TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        (dir, ws)
    }

    pub(super) fn opts(timeout_secs: u64, cap: usize) -> BashOptions {
        BashOptions {
            timeout: Duration::from_secs(timeout_secs),
            max_output_bytes: cap,
            env: Vec::new(),
            confinement: Confinement::default(),
        }
    }

    #[test]
    fn run_renders_results_and_errors_as_text() {
        let (_dir, ws) = ws();
        let o = opts(10, 4096);
        let w = ws.run(
            &Invocation::WriteFile {
                path: "d/f.txt".into(),
                content: "abc".into(),
            },
            &o,
            100,
        );
        assert_eq!(w, "wrote 3 bytes to d/f.txt");
        let r = ws.run(
            &Invocation::ReadFile {
                path: "d/f.txt".into(),
            },
            &o,
            100,
        );
        assert_eq!(r, "abc");
        let l = ws.run(&Invocation::ListFiles { path: None }, &o, 100);
        assert_eq!(l, "d/\nd/f.txt");
        let e = ws.run(
            &Invocation::ReadFile {
                path: "../x".into(),
            },
            &o,
            100,
        );
        assert!(
            e.starts_with("error: read_file: path \"../x\" is outside the workspace"),
            "{e}"
        );
        let b = ws.run(
            &Invocation::Bash {
                command: "echo hi".into(),
                timeout_secs: None,
            },
            &o,
            100,
        );
        assert_eq!(b, "exit 0\n--- stdout ---\nhi\n--- stderr ---");
        // A call may shorten the timeout but not lengthen it past the limit.
        let t = ws.run(
            &Invocation::Bash {
                command: "sleep 5".into(),
                timeout_secs: Some(1000),
            },
            &opts(1, 100),
            100,
        );
        assert!(t.starts_with("timed out after 1 s"), "{t}");
        let f = ws.run(&Invocation::Finish { report: "r".into() }, &o, 100);
        assert!(f.starts_with("error: finish is handled by the harness"));
    }
}
