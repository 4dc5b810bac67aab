//! The `bash` tool: a command run with `bash -c` in the workspace, confined
//! by the `sandbox` crate at the experiment's level ([`Confinement`]), with
//! an allow-listed environment, no stdin, a timeout that kills its whole
//! process group, and stdout and stderr read to their end while only a
//! capped prefix is kept. Its rendering for the model is a pure function of
//! the outcome, so a run's ids do not depend on timings or pids.

use std::fs;
use std::io::{self, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{capped_text, ToolError, Workspace, BASH_PATH, TMP_DIR_NAME};
use crate::places;

/// How long to wait for the command's processes to die after `SIGKILL`.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// How long to keep draining stdout/stderr after the command has exited and
/// its process group has been killed. Only a process that left the group
/// (`setsid`) can keep a pipe open past that; we stop waiting for it.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

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

impl Workspace {
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
        let mut cmd = self.bash_command(command, opts, &policy, &tmp)?;
        let mut child = cmd.spawn().map_err(|source| ToolError::Bash {
            op: "start bash",
            source,
        })?;
        let pgid = i32::try_from(child.id()).unwrap_or(0);
        // From here on, any early return must kill the group first.
        let captures = match Captures::start(&mut child, opts.max_output_bytes, pgid) {
            Ok(captures) => captures,
            Err(err) => {
                let _ = child.wait();
                return Err(err);
            }
        };
        let (status, timed_out) = wait_or_kill(child, pgid, opts.timeout)?;
        // Kill what the command left running in its group. (Once the leader
        // is reaped its pid could in principle be reused as another group's
        // id, but the kernel does not hand out a pid still used as a pgid, and
        // if the group is empty this is a no-op on a pid that would have to
        // have wrapped around within microseconds.)
        sys::kill_group(pgid);
        let drained = captures.drain();
        Ok(captures.output(status, timed_out, drained, opts.timeout))
    }

    /// `bash -c command` in the workspace root, confined by `policy`, with
    /// the environment rebuilt from constants, null stdin, piped output,
    /// and its own process group (all four are what `sandbox::Spawn` does).
    fn bash_command(
        &self,
        command: &str,
        opts: &BashOptions,
        policy: &sandbox::Policy,
        tmp: &Path,
    ) -> Result<sandbox::Spawn, ToolError> {
        let mut cmd = sandbox::Spawn::new("bash", policy)?;
        cmd.arg("-c")
            .arg(command)
            .current_dir(&self.root)
            .env("PATH", BASH_PATH)
            .env("HOME", policy.seen(&self.root))
            .env("LANG", "C.UTF-8")
            .env("LC_ALL", "C.UTF-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONHASHSEED", "0")
            .env("TMPDIR", policy.seen(tmp));
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        Ok(cmd)
    }
}

/// Kills the command's process group and says which step failed: every
/// early return once the command runs goes through here.
fn kill_and_fail(pgid: i32, op: &'static str, source: io::Error) -> ToolError {
    sys::kill_group(pgid);
    ToolError::Bash { op, source }
}

/// Waits for the command up to `timeout`, killing its group when that
/// expires; returns its status (if it could be had) and whether it timed
/// out.
fn wait_or_kill(
    mut child: sandbox::Child,
    pgid: i32,
    timeout: Duration,
) -> Result<(Option<ExitStatus>, bool), ToolError> {
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
        return Err(kill_and_fail(pgid, "start the waiter", e));
    }
    Ok(match status_rx.recv_timeout(timeout) {
        Ok(status) => (status.ok(), false),
        Err(RecvTimeoutError::Timeout) => {
            sys::kill_group(pgid);
            (
                status_rx.recv_timeout(KILL_GRACE).ok().and_then(|s| s.ok()),
                true,
            )
        }
        Err(RecvTimeoutError::Disconnected) => (None, false),
    })
}

/// The command's stdout and stderr, each read to its end by its own thread.
struct Captures {
    out: Arc<Mutex<Capture>>,
    err: Arc<Mutex<Capture>>,
    /// One message from each reader when its pipe ends.
    done: mpsc::Receiver<()>,
}

impl Captures {
    /// Takes the child's pipes and starts a reader on each, keeping at
    /// most `cap` bytes of each. On failure the group `pgid` is killed.
    fn start(child: &mut sandbox::Child, cap: usize, pgid: i32) -> Result<Captures, ToolError> {
        let missing_pipe = || io::Error::other("pipe was not set up");
        let out_pipe = child.stdout.take().ok_or_else(missing_pipe);
        let err_pipe = child.stderr.take().ok_or_else(missing_pipe);
        let (out_pipe, err_pipe) = match (out_pipe, err_pipe) {
            (Ok(o), Ok(e)) => (o, e),
            (Err(e), _) | (_, Err(e)) => return Err(kill_and_fail(pgid, "capture output", e)),
        };
        let out = Arc::new(Mutex::new(Capture::default()));
        let err = Arc::new(Mutex::new(Capture::default()));
        let (done_tx, done) = mpsc::channel();
        let readers = spawn_reader("stdout", out_pipe, cap, Arc::clone(&out), done_tx.clone())
            .and_then(|()| spawn_reader("stderr", err_pipe, cap, Arc::clone(&err), done_tx));
        if let Err(e) = readers {
            return Err(kill_and_fail(pgid, "start an output reader", e));
        }
        Ok(Captures { out, err, done })
    }

    /// Waits up to [`DRAIN_GRACE`] for both readers to reach the end of
    /// their pipe; returns how many did.
    fn drain(&self) -> usize {
        let deadline = Instant::now() + DRAIN_GRACE;
        let mut drained = 0;
        while drained < 2 {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.done.recv_timeout(left) {
                Ok(()) => drained += 1,
                Err(_) => break,
            }
        }
        drained
    }

    /// The outcome as the model will see it: capped texts, and a note on
    /// stderr when a reader did not reach the end of its pipe.
    fn output(
        &self,
        status: Option<ExitStatus>,
        timed_out: bool,
        drained: usize,
        timeout: Duration,
    ) -> BashOutput {
        let (stdout, out_cut) = {
            let c = lock(&self.out);
            capped_text(&c.kept, c.total)
        };
        let (mut stderr, err_cut) = {
            let c = lock(&self.err);
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
        BashOutput {
            exit_code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            stdout,
            stderr,
            timed_out,
            truncated: out_cut || err_cut,
            timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::tests::{opts, ws};

    /// `opts` without the sandbox: the harness's own process-group kill, and
    /// host pids in `$!` (inside the sandbox's PID namespace they are not).
    fn unconfined(timeout_secs: u64, cap: usize) -> BashOptions {
        let mut o = opts(timeout_secs, cap);
        o.confinement.level = sandbox::Level::None;
        o
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
}
