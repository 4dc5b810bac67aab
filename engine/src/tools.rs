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

use crate::places;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Component, Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use thiserror::Error;

use crate::chat::ToolDef;

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

/// Symlink expansions allowed while resolving one path (the kernel's own
/// limit), so a loop `a -> b -> a` ends in an error instead of spinning.
const MAX_SYMLINKS: usize = 40;

/// How long to wait for the command's processes to die after `SIGKILL`.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// How long to keep draining stdout/stderr after the command has exited and
/// its process group has been killed. Only a process that left the group
/// (`setsid`) can keep a pipe open past that; we stop waiting for it.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

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

// ---------------------------------------------------------------------------
// Tool calls
// ---------------------------------------------------------------------------

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

/// JSON-schema definitions of the tools offered to the model. Subagents get
/// no `delegate` (`include_delegate = false`): only the orchestrator hands
/// work out, which keeps the team one level deep as in MASS.
pub fn tool_defs(include_delegate: bool) -> Vec<ToolDef> {
    let mut defs = vec![
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
        ),
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
        ),
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
        ),
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
        ),
        ToolDef::new(
            "run_checks",
            "Run the task's checks on the workspace as it is now. Returns PASS or FAIL per check and \
             the SCORE line, without the checks' expected values. The checks are not in the workspace \
             and cannot be read or changed.",
            json!({"type": "object", "properties": {}}),
        ),
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
        ),
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
        ),
    ];
    if !include_delegate {
        defs.retain(|d| d.function.name != "delegate");
    }
    defs
}

// ---------------------------------------------------------------------------
// Bash
// ---------------------------------------------------------------------------

/// Limits of one `bash` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BashOptions {
    /// Wall-clock limit; also the most a call's `timeout_secs` may ask for.
    pub timeout: Duration,
    /// Cap on the bytes kept of stdout, and separately of stderr.
    pub max_output_bytes: usize,
    /// Variables added to the allow-listed environment (e.g. `MASS_CHECKS`
    /// for a validator). Never taken from the harness's own environment.
    pub env: Vec<(String, String)>,
    /// How the command is confined.
    pub confinement: Confinement,
}

/// How a `bash` command is confined (see the `sandbox` crate): the level and
/// limits of the experiment's `[sandbox]`, the task's network declaration,
/// and what besides the workspace it may read.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Confinement {
    pub level: sandbox::Level,
    pub limits: sandbox::Limits,
    pub network: bool,
    /// Extra directories the command may read (a validator's folder).
    pub readable: Vec<PathBuf>,
    /// Extra directories the command may write besides the workspace (an
    /// external harness's own state directory).
    pub writable: Vec<PathBuf>,
    /// The workspace is read-only too (checks): only its `TMPDIR` is writable.
    pub read_only: bool,
    /// Directories whose other contents the command must not see (the
    /// scratch root holding every rollout's workspace, home and check copy;
    /// see `sandbox::Policy::hide`).
    pub hide: Vec<PathBuf>,
    /// Loopback ports relayed to unix sockets (an external program's proxy
    /// route; see `sandbox::Policy::forward`). Needs `Level::Full` and no
    /// network.
    pub forward: Vec<sandbox::Forward>,
    /// Readable or writable paths the command finds at a fixed place
    /// (`Level::Full`; see `crate::places`). The workspace always is, at
    /// `places::WORKSPACE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub places: Vec<sandbox::Place>,
    /// The command sees the host's paths even at `Level::Full`: only to
    /// re-execute an external program recorded before places existed,
    /// whose recorded replies name the host paths it ran at.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_paths: bool,
}

impl Confinement {
    /// The sandbox policy for a command in `root` with scratch dir `tmp`.
    fn policy(&self, root: &Path, tmp: &Path) -> sandbox::Policy {
        let mut p = sandbox::Policy::new(self.level, root);
        p.limits = self.limits;
        p.network = self.network;
        p.readable = self.readable.clone();
        if self.read_only {
            p.writable = vec![tmp.to_path_buf()];
            p.readable.push(root.to_path_buf());
        }
        p.writable.extend(self.writable.iter().cloned());
        p.hide = self.hide.clone();
        p.forward = self.forward.clone();
        if self.fixes_paths() {
            p.hide.push(PathBuf::from(places::HIDDEN));
            p.places.push(sandbox::Place {
                path: root.to_path_buf(),
                at: PathBuf::from(places::WORKSPACE),
            });
            p.places.extend(self.places.iter().cloned());
        }
        p
    }

    /// Whether commands find their paths at fixed places (`Level::Full`,
    /// the only level with a mount namespace).
    pub fn fixes_paths(&self) -> bool {
        self.level == sandbox::Level::Full && !self.host_paths
    }

    /// Where a command finds host path `p`, the workspace `root` or one of
    /// `places` (or below them): its fixed place at `Level::Full`, `p`
    /// itself otherwise. What a command is told (its environment, its
    /// command line) names paths this way.
    pub fn seen(&self, root: &Path, p: &Path) -> PathBuf {
        self.policy(root, &root.join(TMP_DIR_NAME)).seen(p)
    }
}

impl Default for BashOptions {
    fn default() -> Self {
        BashOptions {
            timeout: Duration::from_secs(300),
            max_output_bytes: 32 * 1024,
            env: Vec::new(),
            confinement: Confinement::default(),
        }
    }
}

/// The outcome of one `bash` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BashOutput {
    /// The exit code; `None` when the command was killed by a signal.
    pub exit_code: Option<i32>,
    /// The signal that ended the command, if one did.
    pub signal: Option<i32>,
    /// Captured stdout (lossy UTF-8), ending in a truncation marker if cut.
    pub stdout: String,
    /// Captured stderr (lossy UTF-8), ending in a truncation marker if cut.
    pub stderr: String,
    /// The timeout expired and the process group was killed.
    pub timed_out: bool,
    /// stdout or stderr was cut at the cap.
    pub truncated: bool,
    /// The timeout that applied (configured, not measured), for the message.
    pub timeout: Duration,
}

impl BashOutput {
    /// The text shown to the model. It depends only on the outcome and the
    /// configured timeout, never on durations, pids or timestamps: the tool
    /// result is content-addressed, and the same outcome must give the same id.
    pub fn render(&self) -> String {
        let mut out = if self.timed_out {
            format!(
                "timed out after {} s (the command and its child processes were killed)",
                self.timeout.as_secs_f64()
            )
        } else {
            match (self.exit_code, self.signal) {
                (Some(code), _) => format!("exit {code}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                (None, None) => "exit status unknown".to_owned(),
            }
        };
        out.push('\n');
        for (label, text) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            out.push_str("--- ");
            out.push_str(label);
            out.push_str(" ---\n");
            out.push_str(text);
            if !text.is_empty() && !text.ends_with('\n') {
                out.push('\n');
            }
        }
        if out.ends_with('\n') {
            out.pop();
        }
        out
    }
}

/// Bytes kept from one output stream, and how many were produced in all.
#[derive(Default)]
struct Capture {
    kept: Vec<u8>,
    total: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A reader thread cannot panic while holding the lock in a way that leaves
    // the capture inconsistent, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reads a pipe to its end, keeping at most `cap` bytes but counting all:
/// a command blocked on a full pipe would otherwise hang until the timeout.
fn spawn_reader<R: Read + Send + 'static>(
    name: &str,
    mut pipe: R,
    cap: usize,
    capture: Arc<Mutex<Capture>>,
    done: mpsc::Sender<()>,
) -> io::Result<()> {
    thread::Builder::new()
        .name(format!("bash-{name}"))
        .spawn(move || {
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut c = lock(&capture);
                        let room = cap.saturating_sub(c.kept.len()).min(n);
                        c.kept.extend_from_slice(&chunk[..room]);
                        c.total += n as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
            let _ = done.send(());
        })
        .map(|_| ())
}

mod sys {
    // Declared here rather than through the `libc` crate so the engine needs
    // no extra dependency: std already links the C library on Unix, and
    // `kill(2)` has this signature (pid_t is a 32-bit int) on Linux and macOS.
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }

    /// SIGKILL is 9 on every Unix (POSIX fixes it).
    const SIGKILL: i32 = 9;

    /// Kills every process in the group `pgid`. Errors (typically ESRCH: the
    /// group is already gone) are expected and ignored.
    pub(super) fn kill_group(pgid: i32) {
        // A pgid of 0 or 1 would address our own group or init's: never.
        if pgid > 1 {
            // SAFETY: kill(2) takes two plain integers and touches no memory
            // of ours; a negative pid addresses the process group.
            unsafe {
                kill(-pgid, SIGKILL);
            }
        }
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

// ---------------------------------------------------------------------------
// Workspace
// ---------------------------------------------------------------------------

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

    /// Resolves a workspace-relative path to a real path inside the root.
    /// See [`Workspace::resolve_in`] for the rules.
    pub fn resolve(&self, rel: &str) -> Result<PathBuf, ToolError> {
        self.resolve_in("resolve", rel)
    }

    /// Resolves `rel` component by component, the way the kernel would, but
    /// checking each step: absolute paths, NUL bytes, `..` above the root and
    /// symlinks whose target lies outside the root are refused. Symlinks
    /// inside the root are followed (their targets are resolved by the same
    /// rules), so the result contains no symlink and every step stayed inside
    /// the root; it never touches anything outside. Components that do not
    /// exist yet are taken as they are (they cannot be symlinks), so a path to
    /// be written resolves through its deepest existing ancestor. An empty
    /// path or `.` is the root itself.
    fn resolve_in(&self, tool: &'static str, rel: &str) -> Result<PathBuf, ToolError> {
        let invalid = |reason: &str| ToolError::InvalidPath {
            tool,
            path: rel.to_owned(),
            reason: reason.to_owned(),
        };
        let escape = |reason: String| ToolError::Escape {
            tool,
            path: rel.to_owned(),
            reason,
        };
        if rel.contains('\0') {
            return Err(invalid("contains a NUL byte"));
        }
        let path = Path::new(rel);
        if path.has_root() {
            return Err(invalid(
                "absolute paths are not allowed; use a path relative to the workspace root",
            ));
        }
        // Components still to walk, last one first so `pop` yields the next.
        let mut pending: Vec<OsString> = components_of(path);
        pending.reverse();
        let mut cur = self.root.clone();
        let mut expansions = 0usize;
        // The last symlink expanded, to explain an escape found after it.
        let mut via: Option<String> = None;
        while let Some(comp) = pending.pop() {
            if comp == "." {
                continue;
            }
            if comp == ".." {
                if cur == self.root {
                    return Err(escape(match &via {
                        Some(link) => {
                            format!("the symlink {link:?} leads above the workspace root")
                        }
                        None => "`..` leads above the workspace root".to_owned(),
                    }));
                }
                // `cur` contains no symlink, so its lexical parent is its real parent.
                cur.pop();
                continue;
            }
            let next = cur.join(&comp);
            match fs::symlink_metadata(&next) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    expansions += 1;
                    if expansions > MAX_SYMLINKS {
                        return Err(invalid("too many levels of symbolic links"));
                    }
                    let link = self.display(&next);
                    let target = fs::read_link(&next).map_err(|source| ToolError::Io {
                        tool,
                        op: "read the symlink",
                        path: link.clone(),
                        source,
                    })?;
                    let rest = if target.has_root() {
                        // An absolute target is allowed only if it names a
                        // place under the root; the remainder is walked from
                        // the root so `..` inside it is still checked.
                        match target.strip_prefix(&self.root) {
                            Ok(rest) => {
                                cur = self.root.clone();
                                rest.to_path_buf()
                            }
                            Err(_) => {
                                return Err(escape(format!(
                                    "the symlink {link:?} points to {}, outside the workspace",
                                    target.display()
                                )))
                            }
                        }
                    } else {
                        target
                    };
                    let mut parts = components_of(&rest);
                    parts.reverse();
                    pending.extend(parts);
                    via = Some(link);
                }
                Ok(_) => cur = next,
                Err(e) if e.kind() == io::ErrorKind::NotFound => cur = next,
                Err(source) => {
                    return Err(ToolError::Io {
                        tool,
                        op: "resolve",
                        path: rel.to_owned(),
                        source,
                    })
                }
            }
        }
        Ok(cur)
    }

    /// A real path under the root, as the model should write it.
    fn display(&self, real: &Path) -> String {
        match real.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => rel.to_string_lossy().into_owned(),
            Err(_) => real.to_string_lossy().into_owned(),
        }
    }

    /// Reads a regular file as lossy UTF-8, keeping at most `max_bytes`
    /// bytes and ending a cut text with `[... truncated: N more bytes]`.
    pub fn read_file(&self, path: &str, max_bytes: usize) -> Result<String, ToolError> {
        const TOOL: &str = "read_file";
        let real = self.resolve_in(TOOL, path)?;
        let io_err = |op: &'static str| {
            move |source: io::Error| ToolError::Io {
                tool: TOOL,
                op,
                path: path.to_owned(),
                source,
            }
        };
        let meta = match fs::metadata(&real) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ToolError::NotFound {
                    tool: TOOL,
                    path: path.to_owned(),
                })
            }
            Err(e) => return Err(io_err("stat")(e)),
        };
        if meta.is_dir() {
            return Err(ToolError::IsDirectory {
                tool: TOOL,
                path: path.to_owned(),
            });
        }
        // A FIFO or device would block or never end.
        if !meta.is_file() {
            return Err(ToolError::NotRegularFile {
                tool: TOOL,
                path: path.to_owned(),
            });
        }
        let file = fs::File::open(&real).map_err(io_err("open"))?;
        let mut kept = Vec::with_capacity(max_bytes.min(meta.len() as usize));
        file.take(max_bytes as u64)
            .read_to_end(&mut kept)
            .map_err(io_err("read"))?;
        // The size may have changed since stat; whatever we hold is a floor.
        let total = meta.len().max(kept.len() as u64);
        Ok(capped_text(&kept, total).0)
    }

    /// Creates or overwrites a file (creating parent directories inside the
    /// root) and returns the number of bytes written. The final component
    /// must not be a symlink: writing through one would modify its target,
    /// which the model may not have meant, even inside the root.
    pub fn write_file(&self, path: &str, content: &str) -> Result<u64, ToolError> {
        const TOOL: &str = "write_file";
        let invalid = |reason: &str| ToolError::InvalidPath {
            tool: TOOL,
            path: path.to_owned(),
            reason: reason.to_owned(),
        };
        let io_err = |op: &'static str| {
            move |source: io::Error| ToolError::Io {
                tool: TOOL,
                op,
                path: path.to_owned(),
                source,
            }
        };
        // Split off the file name as written: `Path` would silently drop a
        // trailing `/` or `.`, turning `dir/` into a write to `dir`.
        let (parent, name) = match path.rfind('/') {
            Some(i) => (&path[..i + 1], &path[i + 1..]),
            None => ("", path),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(invalid("does not name a file"));
        }
        let dir = self.resolve_in(TOOL, parent)?;
        if name.contains('\0') {
            return Err(invalid("contains a NUL byte"));
        }
        let target = dir.join(name);
        let mode = match fs::symlink_metadata(&target) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(ToolError::WriteThroughSymlink {
                    tool: TOOL,
                    path: path.to_owned(),
                })
            }
            Ok(meta) if meta.is_dir() => {
                return Err(ToolError::IsDirectory {
                    tool: TOOL,
                    path: path.to_owned(),
                })
            }
            Ok(meta) if !meta.is_file() => {
                return Err(ToolError::NotRegularFile {
                    tool: TOOL,
                    path: path.to_owned(),
                })
            }
            Ok(meta) => std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0o644,
            Err(e) => return Err(io_err("stat")(e)),
        };
        // `dir` is a real path whose missing tail contains no symlink, so
        // creating it stays inside the root.
        fs::create_dir_all(&dir).map_err(io_err("create the parent directories of"))?;
        // A new file renamed over the name, never a write into the existing
        // inode: a hard link to a file elsewhere keeps that file unchanged.
        let mut tmp = tempfile::Builder::new()
            .prefix(".mass-write-")
            .tempfile_in(&dir)
            .map_err(io_err("create a file beside"))?;
        tmp.write_all(content.as_bytes()).map_err(io_err("write"))?;
        fs::set_permissions(
            tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )
        .map_err(io_err("set the mode of"))?;
        tmp.persist(&target)
            .map_err(|e| io_err("replace")(e.error))?;
        Ok(content.len() as u64)
    }

    /// Lists a directory recursively (the whole workspace for `None`): paths
    /// relative to the root, sorted component by component (a directory's
    /// contents follow it), directories suffixed with `/`, symlinks shown as
    /// `path -> target` and never followed. At most [`LIST_CAP`] entries,
    /// then a marker line. A path naming a file lists that file.
    pub fn list_files(&self, path: Option<&str>) -> Result<Vec<String>, ToolError> {
        self.list_files_capped(path, LIST_CAP)
    }

    fn list_files_capped(&self, path: Option<&str>, cap: usize) -> Result<Vec<String>, ToolError> {
        const TOOL: &str = "list_files";
        let rel = path.unwrap_or("");
        let start = self.resolve_in(TOOL, rel)?;
        let meta = match fs::symlink_metadata(&start) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ToolError::NotFound {
                    tool: TOOL,
                    path: rel.to_owned(),
                })
            }
            Err(source) => {
                return Err(ToolError::Io {
                    tool: TOOL,
                    op: "stat",
                    path: rel.to_owned(),
                    source,
                })
            }
        };
        if !meta.is_dir() {
            return Ok(vec![self.display(&start)]);
        }
        let top = sorted_children(&start).map_err(|source| ToolError::Io {
            tool: TOOL,
            op: "read the directory",
            path: rel.to_owned(),
            source,
        })?;
        // Depth-first with an explicit stack (no recursion depth to exhaust);
        // children are pushed in reverse so they pop in sorted order.
        let mut stack: Vec<PathBuf> = top.into_iter().rev().collect();
        let mut out = Vec::new();
        while let Some(entry) = stack.pop() {
            if out.len() >= cap {
                out.push(format!(
                    "[... truncated: listing stopped at {cap} entries; list a subdirectory to see more]"
                ));
                break;
            }
            let shown = self.display(&entry);
            let Ok(meta) = fs::symlink_metadata(&entry) else {
                // Vanished between readdir and stat: nothing to show.
                continue;
            };
            let ft = meta.file_type();
            if ft.is_symlink() {
                let target = fs::read_link(&entry)
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| "?".to_owned());
                out.push(format!("{shown} -> {target}"));
            } else if ft.is_dir() {
                match sorted_children(&entry) {
                    Ok(children) => {
                        out.push(format!("{shown}/"));
                        stack.extend(children.into_iter().rev());
                    }
                    Err(e) => out.push(format!("{shown}/ [unreadable: {e}]")),
                }
            } else {
                out.push(shown);
            }
        }
        Ok(out)
    }

    /// The per-workspace TMPDIR, created on first use. A `.tmp` that is a
    /// symlink or a file is refused rather than handed to commands, since
    /// TMPDIR would then point wherever the model aimed it.
    fn tmp_dir(&self) -> Result<PathBuf, ToolError> {
        let tmp = self.root.join(TMP_DIR_NAME);
        match fs::symlink_metadata(&tmp) {
            Ok(meta) if meta.is_dir() => Ok(tmp),
            Ok(_) => Err(ToolError::InvalidPath {
                tool: "bash",
                path: TMP_DIR_NAME.to_owned(),
                reason: "exists but is not a directory; bash needs it as TMPDIR".to_owned(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => match fs::create_dir(&tmp) {
                Ok(()) => Ok(tmp),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(tmp),
                Err(source) => Err(ToolError::Io {
                    tool: "bash",
                    op: "create",
                    path: TMP_DIR_NAME.to_owned(),
                    source,
                }),
            },
            Err(source) => Err(ToolError::Io {
                tool: "bash",
                op: "stat",
                path: TMP_DIR_NAME.to_owned(),
                source,
            }),
        }
    }

    /// Runs `bash -c command` in the workspace root.
    ///
    /// The environment is cleared and rebuilt from constants so no host
    /// variable (API keys, tokens, the harness's own settings) reaches the
    /// command; stdin is null so nothing can wait for input. The command is
    /// the leader of its own process group: on timeout the whole group is
    /// killed, and after a normal exit the group is killed too, so background
    /// processes neither outlive the call nor hold the pipes open. stdout and
    /// stderr are read by threads to their end while only the first
    /// `max_output_bytes` of each are kept.
    pub fn bash(&self, command: &str, opts: &BashOptions) -> Result<BashOutput, ToolError> {
        let tmp = self.tmp_dir()?;
        let policy = opts.confinement.policy(&self.root, &tmp);
        sandbox::prepare(&policy)?;
        let mut cmd = sandbox::command("bash", &policy)?;
        cmd.arg("-c")
            .arg(command)
            .current_dir(&self.root)
            .env_clear()
            .env("PATH", BASH_PATH)
            .env("HOME", policy.seen(&self.root))
            .env("LANG", "C.UTF-8")
            .env("LC_ALL", "C.UTF-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONHASHSEED", "0")
            .env("TMPDIR", policy.seen(&tmp))
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // setpgid(0, 0) in the child before exec: its pid becomes the pgid.
            .process_group(0);
        let mut child = cmd.spawn().map_err(|source| ToolError::Bash {
            op: "start bash",
            source,
        })?;
        let pgid = i32::try_from(child.id()).unwrap_or(0);
        // From here on, any early return must kill the group first.
        let fail = |op: &'static str, source: io::Error| {
            sys::kill_group(pgid);
            ToolError::Bash { op, source }
        };
        let missing_pipe = || io::Error::other("pipe was not set up");
        let out_pipe = child.stdout.take().ok_or_else(missing_pipe);
        let err_pipe = child.stderr.take().ok_or_else(missing_pipe);
        let (out_pipe, err_pipe) = match (out_pipe, err_pipe) {
            (Ok(o), Ok(e)) => (o, e),
            (Err(e), _) | (_, Err(e)) => {
                let err = fail("capture output", e);
                let _ = child.wait();
                return Err(err);
            }
        };
        let out_cap = Arc::new(Mutex::new(Capture::default()));
        let err_cap = Arc::new(Mutex::new(Capture::default()));
        let (done_tx, done_rx) = mpsc::channel();
        let readers = spawn_reader(
            "stdout",
            out_pipe,
            opts.max_output_bytes,
            Arc::clone(&out_cap),
            done_tx.clone(),
        )
        .and_then(|()| {
            spawn_reader(
                "stderr",
                err_pipe,
                opts.max_output_bytes,
                Arc::clone(&err_cap),
                done_tx,
            )
        });
        if let Err(e) = readers {
            let err = fail("start an output reader", e);
            let _ = child.wait();
            return Err(err);
        }
        // A waiter thread owns the child so the wait can time out; the kill
        // goes through the pgid, which needs no handle.
        let (status_tx, status_rx) = mpsc::channel::<io::Result<ExitStatus>>();
        let waiter = thread::Builder::new()
            .name("bash-wait".to_owned())
            .spawn(move || {
                let _ = status_tx.send(child.wait());
            });
        if let Err(e) = waiter {
            // The child was moved into the closure and dropped with it; the
            // kill still reaches it through its group.
            return Err(fail("start the waiter", e));
        }
        let (status, timed_out) = match status_rx.recv_timeout(opts.timeout) {
            Ok(status) => (status.ok(), false),
            Err(RecvTimeoutError::Timeout) => {
                sys::kill_group(pgid);
                (
                    status_rx.recv_timeout(KILL_GRACE).ok().and_then(|s| s.ok()),
                    true,
                )
            }
            Err(RecvTimeoutError::Disconnected) => (None, false),
        };
        // Kill what the command left running in its group. (Once the leader
        // is reaped its pid could in principle be reused as another group's
        // id, but the kernel does not hand out a pid still used as a pgid, and
        // if the group is empty this is a no-op on a pid that would have to
        // have wrapped around within microseconds.)
        sys::kill_group(pgid);
        let deadline = Instant::now() + DRAIN_GRACE;
        let mut drained = 0;
        while drained < 2 {
            let left = deadline.saturating_duration_since(Instant::now());
            match done_rx.recv_timeout(left) {
                Ok(()) => drained += 1,
                Err(_) => break,
            }
        }
        let (stdout, out_cut) = {
            let c = lock(&out_cap);
            capped_text(&c.kept, c.total)
        };
        let (mut stderr, err_cut) = {
            let c = lock(&err_cap);
            capped_text(&c.kept, c.total)
        };
        if drained < 2 {
            if !stderr.is_empty() && !stderr.ends_with('\n') {
                stderr.push('\n');
            }
            stderr.push_str(
                "[output incomplete: a process that left the command's process group still holds its output open]",
            );
        }
        Ok(BashOutput {
            exit_code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            stdout,
            stderr,
            timed_out,
            truncated: out_cut || err_cut,
            timeout: opts.timeout,
        })
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

/// The components of a relative path as strings; `.`/`..` kept as such, any
/// root component dropped (callers have already refused or stripped it).
fn components_of(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::CurDir => Some(OsString::from(".")),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// A directory's entries, sorted by name (bytewise) for a deterministic listing.
fn sorted_children(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut names: Vec<OsString> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use tempfile::TempDir;

    fn ws() -> (TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        (dir, ws)
    }

    /// `opts` without the sandbox: the harness's own process-group kill, and
    /// host pids in `$!` (inside the sandbox's PID namespace they are not).
    fn unconfined(timeout_secs: u64, cap: usize) -> BashOptions {
        let mut o = opts(timeout_secs, cap);
        o.confinement.level = sandbox::Level::None;
        o
    }

    fn opts(timeout_secs: u64, cap: usize) -> BashOptions {
        BashOptions {
            timeout: Duration::from_secs(timeout_secs),
            max_output_bytes: cap,
            env: Vec::new(),
            confinement: Confinement::default(),
        }
    }

    fn assert_escape(r: Result<impl std::fmt::Debug, ToolError>) {
        match r {
            Err(ToolError::Escape { .. }) | Err(ToolError::InvalidPath { .. }) => {}
            other => panic!("expected refusal, got {other:?}"),
        }
    }

    /// Whether a process is gone (or a zombie awaiting its reaper).
    fn process_dead(pid: u32) -> bool {
        match fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
                .unwrap_or(false),
        }
    }

    fn wait_dead(pid: u32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if process_dead(pid) {
                return true;
            }
            thread::sleep(Duration::from_millis(20));
        }
        process_dead(pid)
    }

    #[test]
    fn new_requires_an_existing_directory() {
        let (dir, _) = ws();
        assert!(matches!(
            Workspace::new(&dir.path().join("missing")),
            Err(ToolError::Root { .. })
        ));
        fs::write(dir.path().join("f"), "x").unwrap();
        assert!(matches!(
            Workspace::new(&dir.path().join("f")),
            Err(ToolError::RootNotDir { .. })
        ));
        let ws = Workspace::new(dir.path()).unwrap();
        assert_eq!(ws.root(), fs::canonicalize(dir.path()).unwrap());
    }

    #[test]
    fn lexical_escapes_are_refused_everywhere() {
        let (_dir, ws) = ws();
        fs::create_dir(ws.root().join("a")).unwrap();
        for bad in ["../x", "/etc/passwd", "a/../../x", "..", "a/\0b", "./../a"] {
            assert_escape(ws.resolve(bad));
            assert_escape(ws.read_file(bad, 100));
            assert_escape(ws.write_file(&format!("{bad}/f"), "x"));
            assert_escape(ws.list_files(Some(bad)));
        }
        assert_escape(ws.write_file("../x", "x"));
        assert_escape(ws.write_file("/tmp/mass-should-not-exist", "x"));
        assert!(!Path::new("/tmp/mass-should-not-exist").exists());
        // Inside-the-root `..` is fine, including through missing directories.
        assert_eq!(ws.resolve("a/../b").unwrap(), ws.root().join("b"));
        assert_eq!(ws.resolve("new/../b").unwrap(), ws.root().join("b"));
        assert_eq!(ws.resolve("").unwrap(), ws.root());
        assert_eq!(ws.resolve(".").unwrap(), ws.root());
    }

    #[test]
    fn symlinked_directory_outside_is_refused() {
        let (_dir, ws) = ws();
        symlink("/etc", ws.root().join("link")).unwrap();
        assert_escape(ws.read_file("link/passwd", 100));
        assert_escape(ws.read_file("link", 100));
        assert_escape(ws.list_files(Some("link")));
        assert_escape(ws.list_files(Some("link/")));
        assert_escape(ws.resolve("link/passwd"));
        // Writes are tested against a scratch directory standing in for /etc,
        // so a bug cannot clobber the real /etc/passwd.
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("passwd"), "original").unwrap();
        symlink(outside.path(), ws.root().join("out")).unwrap();
        assert_escape(ws.write_file("out/passwd", "pwned"));
        assert_escape(ws.write_file("out/new/file", "pwned"));
        assert_escape(ws.read_file("out/passwd", 100));
        assert_eq!(
            fs::read_to_string(outside.path().join("passwd")).unwrap(),
            "original"
        );
        assert!(!outside.path().join("new").exists());
        // The whole-workspace listing shows the links without following them.
        let listing = ws.list_files(None).unwrap();
        assert!(listing.contains(&"link -> /etc".to_owned()), "{listing:?}");
        assert!(!listing.iter().any(|l| l.contains("passwd")), "{listing:?}");
    }

    #[test]
    fn symlinked_file_outside_is_refused() {
        let (_dir, ws) = ws();
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret.txt");
        fs::write(&secret, "secret").unwrap();
        symlink(&secret, ws.root().join("s")).unwrap();
        assert_escape(ws.read_file("s", 100));
        assert_escape(ws.list_files(Some("s")));
        assert!(ws.write_file("s", "pwned").is_err());
        assert_eq!(fs::read_to_string(&secret).unwrap(), "secret");
        // A relative link climbing out is refused too, however deep.
        fs::create_dir(ws.root().join("sub")).unwrap();
        symlink("../../../../../../etc/passwd", ws.root().join("sub/up")).unwrap();
        assert_escape(ws.read_file("sub/up", 100));
        symlink("..", ws.root().join("sub/parent")).unwrap();
        assert_escape(ws.read_file("sub/parent/../x", 100));
    }

    #[test]
    fn dangling_symlinks_are_refused() {
        let (_dir, ws) = ws();
        symlink("/nonexistent/mass/x", ws.root().join("dangling")).unwrap();
        assert_escape(ws.read_file("dangling", 100));
        assert!(ws.write_file("dangling", "x").is_err());
        assert_escape(ws.write_file("dangling/x", "x"));
        assert_escape(ws.list_files(Some("dangling")));
        // Dangling but aiming inside: reading finds nothing, writing refuses
        // to create the target through the link.
        symlink("missing.txt", ws.root().join("dl")).unwrap();
        assert!(matches!(
            ws.read_file("dl", 100),
            Err(ToolError::NotFound { .. })
        ));
        assert!(matches!(
            ws.write_file("dl", "x"),
            Err(ToolError::WriteThroughSymlink { .. })
        ));
        assert!(!ws.root().join("missing.txt").exists());
    }

    #[test]
    fn symlinks_inside_the_root_are_followed_for_reading() {
        let (_dir, ws) = ws();
        ws.write_file("sub/real.txt", "hello").unwrap();
        symlink("sub/real.txt", ws.root().join("alias")).unwrap();
        symlink("sub", ws.root().join("d")).unwrap();
        let abs = ws.root().join("sub");
        symlink(&abs, ws.root().join("abs")).unwrap();
        assert_eq!(ws.read_file("alias", 100).unwrap(), "hello");
        assert_eq!(ws.read_file("d/real.txt", 100).unwrap(), "hello");
        assert_eq!(ws.read_file("abs/real.txt", 100).unwrap(), "hello");
        // Writing into a directory reached through an in-root link is fine.
        ws.write_file("d/new.txt", "n").unwrap();
        assert_eq!(fs::read_to_string(abs.join("new.txt")).unwrap(), "n");
        // ...but not through a link as the final component.
        assert!(matches!(
            ws.write_file("alias", "x"),
            Err(ToolError::WriteThroughSymlink { .. })
        ));
        assert_eq!(ws.read_file("sub/real.txt", 100).unwrap(), "hello");
    }

    #[test]
    fn symlink_loops_end_in_an_error() {
        let (_dir, ws) = ws();
        symlink("b", ws.root().join("a")).unwrap();
        symlink("a", ws.root().join("b")).unwrap();
        assert!(matches!(
            ws.read_file("a", 100),
            Err(ToolError::InvalidPath { .. })
        ));
        symlink(".", ws.root().join("self")).unwrap();
        assert!(ws.read_file("self/self/self/x", 100).is_err());
    }

    #[test]
    fn write_creates_directories_and_overwrites() {
        let (_dir, ws) = ws();
        assert_eq!(ws.write_file("a/b/c.txt", "héllo").unwrap(), 6);
        assert_eq!(
            fs::read_to_string(ws.root().join("a/b/c.txt")).unwrap(),
            "héllo"
        );
        assert_eq!(ws.write_file("a/b/c.txt", "x").unwrap(), 1);
        assert_eq!(ws.read_file("a/b/c.txt", 100).unwrap(), "x");
        assert!(matches!(
            ws.write_file("a/b", "x"),
            Err(ToolError::IsDirectory { .. })
        ));
        for bad in ["a/", "", ".", "a/..", "a/."] {
            assert!(
                matches!(ws.write_file(bad, "x"), Err(ToolError::InvalidPath { .. })),
                "{bad:?}"
            );
        }
        // A file used as a directory is an I/O error, not a panic.
        assert!(ws.write_file("a/b/c.txt/d", "x").is_err());
    }

    #[test]
    fn read_truncates_with_a_marker() {
        let (_dir, ws) = ws();
        ws.write_file("big.txt", &"x".repeat(100)).unwrap();
        assert_eq!(
            ws.read_file("big.txt", 10).unwrap(),
            format!("{}\n[... truncated: 90 more bytes]", "x".repeat(10))
        );
        assert_eq!(ws.read_file("big.txt", 100).unwrap(), "x".repeat(100));
        // A cut inside a multi-byte character backs off to its start.
        ws.write_file("u.txt", "aé").unwrap(); // 'é' is 2 bytes
        assert_eq!(
            ws.read_file("u.txt", 2).unwrap(),
            "a\n[... truncated: 2 more bytes]"
        );
        fs::write(ws.root().join("bin"), [b'o', b'k', 0xff, b'\n']).unwrap();
        assert_eq!(ws.read_file("bin", 100).unwrap(), "ok\u{fffd}\n");
        assert!(matches!(
            ws.read_file("nope", 10),
            Err(ToolError::NotFound { .. })
        ));
        fs::create_dir(ws.root().join("dir")).unwrap();
        assert!(matches!(
            ws.read_file("dir", 10),
            Err(ToolError::IsDirectory { .. })
        ));
    }

    #[test]
    fn list_is_sorted_relative_and_marks_directories() {
        let (_dir, ws) = ws();
        for f in ["b.txt", "a/z.txt", "a/c/d.txt", "a-b.txt", "A.txt"] {
            ws.write_file(f, "x").unwrap();
        }
        fs::create_dir(ws.root().join("empty")).unwrap();
        symlink("b.txt", ws.root().join("l")).unwrap();
        assert_eq!(
            ws.list_files(None).unwrap(),
            vec![
                "A.txt",
                "a/",
                "a/c/",
                "a/c/d.txt",
                "a/z.txt",
                "a-b.txt",
                "b.txt",
                "empty/",
                "l -> b.txt",
            ]
        );
        assert_eq!(
            ws.list_files(Some("a")).unwrap(),
            vec!["a/c/", "a/c/d.txt", "a/z.txt"]
        );
        assert_eq!(ws.list_files(Some("a/z.txt")).unwrap(), vec!["a/z.txt"]);
        assert!(ws.list_files(Some("empty")).unwrap().is_empty());
        assert!(matches!(
            ws.list_files(Some("nope")),
            Err(ToolError::NotFound { .. })
        ));
        let capped = ws.list_files_capped(None, 3).unwrap();
        assert_eq!(capped.len(), 4);
        assert_eq!(&capped[..3], ["A.txt", "a/", "a/c/"]);
        assert!(capped[3].starts_with("[... truncated: listing stopped at 3 entries"));
    }

    /// At `Level::Full` the command finds its workspace at the fixed place
    /// (`places::WORKSPACE`), below it at the host's path.
    #[test]
    fn bash_runs_in_the_root_with_home_and_tmpdir_there() {
        for level in [sandbox::Level::Full, sandbox::Level::Landlock] {
            let (_dir, ws) = ws();
            let mut o = opts(10, 4096);
            o.confinement.level = level;
            let out = ws
                .bash("pwd; echo $HOME; echo $TMPDIR; touch made", &o)
                .unwrap();
            let root = match level {
                sandbox::Level::Full => places::WORKSPACE.to_string(),
                _ => ws.root().display().to_string(),
            };
            assert_eq!(
                out.stdout,
                format!("{root}\n{root}\n{root}/{TMP_DIR_NAME}\n"),
                "{level:?}: {}",
                out.stderr
            );
            assert_eq!(out.exit_code, Some(0));
            assert!(ws.root().join("made").exists());
            assert!(ws.root().join(TMP_DIR_NAME).is_dir());
        }
    }

    #[test]
    fn bash_environment_is_scrubbed() {
        let (_dir, ws) = ws();
        // Edition 2021: set_var is safe; no other test reads this variable.
        std::env::set_var("MASS_TEST_SECRET", "sk-leaked");
        let out = ws
            .bash(
                "echo ${MASS_TEST_SECRET:-unset}; env | cut -d= -f1 | sort",
                &opts(10, 4096),
            )
            .unwrap();
        let mut lines = out.stdout.lines();
        assert_eq!(lines.next(), Some("unset"));
        let allowed = [
            "PATH",
            "HOME",
            "LANG",
            "LC_ALL",
            "PYTHONDONTWRITEBYTECODE",
            "PYTHONHASHSEED",
            "TMPDIR",
            // Set by bash itself.
            "PWD",
            "SHLVL",
            "_",
            "OLDPWD",
        ];
        for name in lines {
            assert!(allowed.contains(&name), "unexpected variable {name}");
        }
        let out = ws.bash("echo $PATH; cat", &opts(10, 4096)).unwrap();
        // stdin is null: `cat` ends at once instead of waiting.
        assert_eq!(out.stdout, format!("{BASH_PATH}\n"));
    }

    #[test]
    fn bash_timeout_kills_the_process_group() {
        let (_dir, ws) = ws();
        let start = Instant::now();
        let out = ws.bash("sleep 10", &opts(1, 4096)).unwrap();
        assert!(out.timed_out);
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
        assert!(out.render().starts_with("timed out after 1 s"));

        let start = Instant::now();
        let out = ws
            .bash("sleep 30 & echo $! > bg.pid; wait", &unconfined(1, 4096))
            .unwrap();
        assert!(out.timed_out);
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
        let pid: u32 = fs::read_to_string(ws.root().join("bg.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            wait_dead(pid),
            "background child {pid} survived the timeout"
        );
    }

    #[test]
    fn bash_background_leftovers_are_killed_after_exit() {
        let (_dir, ws) = ws();
        let start = Instant::now();
        // The leftover holds stdout open; without the group kill, draining
        // would wait for it for 30 s.
        let out = ws
            .bash("sleep 30 & echo $!", &unconfined(20, 4096))
            .unwrap();
        assert!(!out.timed_out);
        assert_eq!(out.exit_code, Some(0));
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
        let pid: u32 = out.stdout.trim().parse().unwrap();
        assert!(wait_dead(pid), "background child {pid} survived the call");
    }

    #[test]
    fn bash_output_is_capped_but_drained() {
        let (_dir, ws) = ws();
        let out = ws
            .bash(
                "head -c 10000000 /dev/zero | tr '\\0' a; echo done >&2",
                &opts(60, 1000),
            )
            .unwrap();
        assert!(!out.timed_out);
        assert_eq!(out.exit_code, Some(0));
        assert!(out.truncated);
        assert_eq!(
            out.stdout,
            format!("{}\n[... truncated: 9999000 more bytes]", "a".repeat(1000))
        );
        assert_eq!(out.stderr, "done\n");
        let small = ws.bash("echo hi", &opts(10, 1000)).unwrap();
        assert!(!small.truncated);
    }

    /// Before: `write_file` wrote into the existing inode, so a hard link in
    /// the workspace to a file elsewhere let it overwrite that file.
    #[test]
    fn regression_write_file_never_writes_through_a_hard_link() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, ws) = ws();
        let outside = dir
            .path()
            .join("..")
            .join(format!("outside-{}", std::process::id()));
        fs::write(&outside, "keep").unwrap();
        fs::hard_link(&outside, ws.root().join("linked.txt")).unwrap();
        ws.write_file("linked.txt", "changed").unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "keep");
        assert_eq!(
            fs::read_to_string(ws.root().join("linked.txt")).unwrap(),
            "changed"
        );
        fs::remove_file(&outside).unwrap();
        // The mode of a rewritten file is kept.
        ws.write_file("run.sh", "#!/bin/sh").unwrap();
        fs::set_permissions(ws.root().join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        ws.write_file("run.sh", "#!/bin/sh\necho hi").unwrap();
        let mode = fs::metadata(ws.root().join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        // No temporary file is left behind.
        let names: Vec<String> = fs::read_dir(ws.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with(".mass-write-")),
            "{names:?}"
        );
    }

    #[test]
    fn render_is_deterministic() {
        let (_dir, ws) = ws();
        let cmd = "echo out; echo err >&2; exit 3";
        let a = ws.bash(cmd, &opts(10, 4096)).unwrap();
        let b = ws.bash(cmd, &opts(10, 4096)).unwrap();
        assert_eq!(a.render(), b.render());
        assert_eq!(
            a.render(),
            "exit 3\n--- stdout ---\nout\n--- stderr ---\nerr"
        );
        let killed = ws.bash("kill -9 $$", &opts(10, 4096)).unwrap();
        assert_eq!(
            killed.render(),
            "killed by signal 9\n--- stdout ---\n--- stderr ---"
        );
        let t1 = ws.bash("echo start; sleep 5", &opts(1, 4096)).unwrap();
        let t2 = ws.bash("echo start; sleep 5", &opts(1, 4096)).unwrap();
        assert_eq!(t1.render(), t2.render());
        assert!(t1.render().contains("--- stdout ---\nstart"));
    }

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
