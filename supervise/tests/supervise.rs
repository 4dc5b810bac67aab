//! Supervised commands (the `supervise` crate): what a caller sees of the
//! command (its own exit status, 127 for a program not found, its
//! environment, working directory and pipes passed on) and how long its
//! tree lives. Two mechanisms are under test. The kernel's parent-death
//! signal follows the *thread* that forked a child, so a command spawned
//! from a thread that has since ended must live on (every warden is forked
//! by one thread that never ends). And the warden's sweep: when the
//! command exits, is stopped, killed or dropped, every process of its tree
//! is gone, the grandchildren in its group, `setsid` daemons that left it
//! and a chain of daemons each started by the one before (orphans that
//! come to the warden one generation per round) included.
//!
//! The processes a test starts are found by a mark unique to the test and
//! to this test process (`mass-sup:PID:TEST:`), put in their `argv[0]`
//! with bash's `exec -a`; the mark reaches the scripts through the
//! environment (`$M`), so it is not in the warden's own command line. Any
//! marked process left over is SIGKILLed before a test asserts, and again
//! when it unwinds. Waits poll for up to [`PATIENCE`], so that the tests
//! hold on a loaded two-core machine.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use supervise::{Child, Command};

/// How long a test waits for something that should happen at once.
const PATIENCE: Duration = Duration::from_secs(10);

/// The processes of one test: every process whose command line holds
/// `mark`. Dropping it SIGKILLs whatever is left of them.
struct Marked {
    mark: String,
}

/// What /proc/PID/stat says of a process.
#[derive(Debug, Clone, Copy)]
struct Stat {
    state: char,
    ppid: i32,
    session: i32,
}

fn stat(pid: i32) -> Option<Stat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = s[s.rfind(')')? + 2..].split_whitespace().collect();
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
    })
}

/// A marked process: its pid and `argv[0]`.
#[derive(Debug, Clone)]
struct Proc {
    pid: i32,
    name: String,
}

impl Marked {
    fn new(test: &str) -> Marked {
        Marked {
            mark: format!("mass-sup:{}:{test}:", std::process::id()),
        }
    }

    /// `bash -c script` with the mark in `$M`.
    fn bash(&self, script: &str) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg("-c").arg(script).env("M", &self.mark);
        cmd
    }

    /// The marked processes still running (zombies have ended).
    fn procs(&self) -> Vec<Proc> {
        let me = std::process::id() as i32;
        let mut found = Vec::new();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return found;
        };
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let marked = cmdline
                .windows(self.mark.len())
                .any(|w| w == self.mark.as_bytes());
            let running = matches!(stat(pid), Some(s) if s.state != 'Z' && s.state != 'X');
            if pid != me && marked && running {
                let name = cmdline.split(|&b| b == 0).next().unwrap_or_default();
                let name = String::from_utf8_lossy(name).into_owned();
                found.push(Proc { pid, name });
            }
        }
        found
    }

    /// Waits until processes named `MARKname` (their `argv[0]`) run for
    /// every one of `names`, and returns them in that order.
    fn appear(&self, names: &[&str]) -> Vec<Proc> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let procs = self.procs();
            let found: Vec<Proc> = names
                .iter()
                .filter_map(|n| {
                    let want = format!("{}{n}", self.mark);
                    procs.iter().find(|p| p.name == want).cloned()
                })
                .collect();
            if found.len() == names.len() {
                return found;
            }
            if Instant::now() >= deadline {
                self.kill_all();
                panic!("not all of {names:?} started: found {found:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill_all(&self) {
        for p in self.procs() {
            // SAFETY: only sends a signal, to a process carrying this
            // test's unique mark.
            unsafe {
                libc::kill(p.pid, libc::SIGKILL);
            }
        }
    }

    /// Asserts that no marked process is left (killing any first).
    fn assert_none_left(&self, when: &str) {
        let left = self.procs();
        self.kill_all();
        assert!(left.is_empty(), "left running {when}: {left:?}");
    }
}

impl Drop for Marked {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Waits up to [`PATIENCE`] for `child` to end on its own.
fn ended(child: &mut Child) -> ExitStatus {
    child
        .wait_timeout(PATIENCE)
        .expect("wait")
        .expect("the command did not end")
}

/// Runs `cmd` with stdout and stderr piped: its status and both outputs.
fn output(mut cmd: Command) -> (ExitStatus, String, String) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut out = child.take_stdout().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).map(|_| s)
    });
    let mut err = String::new();
    child
        .take_stderr()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    let out = reader.join().expect("reader").expect("read stdout");
    (ended(&mut child), out, err)
}

/// Reads one line of `child`'s stdout, waiting up to [`PATIENCE`].
fn line_of(child: &mut Child) -> String {
    let out = child.take_stdout().expect("stdout piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(PATIENCE).unwrap_or_default()
}

/// A file holding `text`, executable or not.
fn write_file(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn the_status_is_the_commands_own() {
    // A signal ignored where the tests run (HUP under `nohup`) is ignored
    // by the command too: the warden passes dispositions on, as exec does.
    // The test is about the warden, so HUP is reset to the default here
    // (the same test failed under `nohup`: `HUP: exit status 0`).
    // SAFETY: `signal` with `SIG_DFL` only changes this process's
    // disposition of HUP.
    unsafe { libc::signal(libc::SIGHUP, libc::SIG_DFL) };
    let m = Marked::new("status");
    for code in [0, 1, 42, 255] {
        let mut child = m.bash(&format!("exit {code}")).spawn().expect("spawn");
        let status = ended(&mut child);
        assert_eq!(status.code(), Some(code), "{status:?}");
    }
    // The warden itself handles TERM, HUP, USR1 and USR2: it must still
    // end by the same signal as its command.
    for (name, sig) in [
        ("TERM", libc::SIGTERM),
        ("HUP", libc::SIGHUP),
        ("USR1", libc::SIGUSR1),
        ("USR2", libc::SIGUSR2),
        ("KILL", libc::SIGKILL),
    ] {
        let mut child = m.bash(&format!("kill -{name} $$")).spawn().expect("spawn");
        let status = ended(&mut child);
        assert_eq!(status.code(), None, "{name}: {status:?}");
        assert_eq!(status.signal(), Some(sig), "{name}: {status:?}");
        assert!(!status.core_dumped(), "{name}: {status:?}");
    }
    m.assert_none_left("after the commands ended");
}

#[test]
fn a_program_not_found_is_127_and_one_not_executable_126() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = format!("mass-sup-no-such-program-{}", std::process::id());
    let absent = dir.path().join("absent");
    for program in [missing.as_str(), absent.to_str().expect("utf-8")] {
        // The warden starts; its command cannot: the status says why.
        let (status, out, err) = output(Command::new(program));
        assert_eq!(status.code(), Some(127), "{program}: {status:?} {err}");
        assert!(out.is_empty(), "{out}");
        assert!(
            err.contains("cannot execute") && err.contains(program),
            "{err}"
        );
    }
    let plain = dir.path().join("plain");
    write_file(&plain, "#!/bin/sh\nexit 0\n", 0o644);
    let (status, _, err) = output(Command::new(&plain));
    assert_eq!(status.code(), Some(126), "{status:?} {err}");
}

#[test]
fn the_environment_is_passed_on() {
    // Inherited (any variable of this process), set, set then removed.
    let inherited = std::env::vars_os()
        .filter_map(|(k, v)| Some(format!("{}={}", k.to_str()?, v.to_str()?)))
        .find(|kv| !kv.starts_with("PATH=") && !kv.contains('\n'));
    let mut cmd = Command::new("/usr/bin/env");
    cmd.env("MASS_SUP_SET", "one two")
        .env("MASS_SUP_GONE", "x")
        .env_remove("MASS_SUP_GONE")
        .env_remove("PATH");
    let (status, out, err) = output(cmd);
    assert!(status.success(), "{status:?} {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"MASS_SUP_SET=one two"), "{out}");
    assert!(!out.contains("MASS_SUP_GONE"), "{out}");
    assert!(!lines.iter().any(|l| l.starts_with("PATH=")), "{out}");
    if let Some(inherited) = inherited {
        assert!(lines.contains(&inherited.as_str()), "{inherited} in {out}");
    }

    let mut cmd = Command::new("/usr/bin/env");
    cmd.env_clear().env("MASS_SUP_ONLY", "1");
    let (status, out, err) = output(cmd);
    assert!(status.success(), "{status:?} {err}");
    assert_eq!(out, "MASS_SUP_ONLY=1\n");

    // The program is looked up in the command's PATH, not this process's.
    let dir = tempfile::tempdir().expect("tempdir");
    write_file(
        &dir.path().join("mass-sup-tool"),
        "#!/bin/sh\necho \"tool $MASS_SUP_ARG $1\"\n",
        0o755,
    );
    let mut cmd = Command::new("mass-sup-tool");
    cmd.arg("arg")
        .env("PATH", format!("{}:/usr/bin:/bin", dir.path().display()))
        .env("MASS_SUP_ARG", "env");
    let (status, out, err) = output(cmd);
    assert!(status.success(), "{status:?} {err}");
    assert_eq!(out, "tool env arg\n");
}

#[test]
fn the_working_directory_is_passed_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let real = dir.path().canonicalize().expect("canonicalize");
    let mut cmd = Command::new("/usr/bin/pwd");
    cmd.arg("-P").current_dir(dir.path());
    let (status, out, err) = output(cmd);
    assert!(status.success(), "{status:?} {err}");
    assert_eq!(out.trim_end(), real.to_str().expect("utf-8"));

    // A relative program path is the command's, in its directory.
    write_file(&dir.path().join("tool"), "#!/bin/sh\necho here\n", 0o755);
    let mut cmd = Command::new("./tool");
    cmd.current_dir(dir.path());
    let (status, out, err) = output(cmd);
    assert!(status.success(), "{status:?} {err}");
    assert_eq!(out, "here\n");
}

#[test]
fn pipes_are_passed_on() {
    let m = Marked::new("pipes");
    let mut cmd = m.bash(
        "while read -r l; do echo \"out:$l\"; echo \"err:$l\" >&2; done; \
         echo eof; exit 4",
    );
    cmd.stdin(Stdio::piped());
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut stdin = child.take_stdin().expect("stdin");
    stdin.write_all(b"a\nb c\n").expect("write");
    // Closing it is the command's end of input (the warden holds no
    // writing end).
    drop(stdin);
    let mut out = String::new();
    let mut err = String::new();
    child
        .take_stdout()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read stdout");
    child
        .take_stderr()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    assert_eq!(ended(&mut child).code(), Some(4));
    assert_eq!(out, "out:a\nout:b c\neof\n");
    assert_eq!(err, "err:a\nerr:b c\n");

    // Much more than a pipe holds, through `cat`, both ways at once.
    let mut cmd = Command::new("cat");
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut stdin = child.take_stdin().expect("stdin");
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let sent = data.clone();
    let writer = std::thread::spawn(move || stdin.write_all(&sent));
    let mut back = Vec::new();
    child
        .take_stdout()
        .expect("stdout")
        .read_to_end(&mut back)
        .expect("read");
    writer.join().expect("writer").expect("write");
    assert!(ended(&mut child).success());
    assert!(back == data, "{} bytes back of {}", back.len(), data.len());
    m.assert_none_left("after the commands ended");
}

#[test]
fn a_command_outlives_the_thread_that_started_it() {
    let m = Marked::new("outlive");
    let cmd = m.bash("exec -a \"${M}cmd\" sleep 1000");
    // The thread lives until the command runs (its warden has asked for
    // its parent-death signal by then), then ends, as an idle blocking
    // thread of tokio's does: a signal tied to that thread fires now.
    let (mut child, cmd) = std::thread::scope(|s| {
        s.spawn(|| {
            let child = cmd.spawn().expect("spawn");
            (child, m.appear(&["cmd"]).remove(0))
        })
        .join()
        .expect("the spawning thread")
    });
    std::thread::sleep(Duration::from_millis(1500));
    let state = stat(cmd.pid).map(|s| s.state);
    let running = child.try_wait().expect("try_wait");
    let still = m.procs();
    if running.is_some() || still.is_empty() {
        m.kill_all();
    }
    assert_eq!(running, None, "the command ended");
    assert!(
        matches!(state, Some(s) if s != 'Z') && still.iter().any(|p| p.pid == cmd.pid),
        "{cmd:?} is gone: {state:?}"
    );
    let status = child.stop().expect("stop");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    m.assert_none_left("after stop");
}

#[test]
fn the_tree_is_gone_when_the_command_exits() {
    let m = Marked::new("exits");
    // A grandchild in the command's group and a daemon that left it; the
    // command exits once told to.
    let mut cmd = m.bash(
        "exec -a \"${M}grandchild\" sleep 1000 & \
         setsid bash -c 'exec -a \"${M}daemon\" sleep 1000' & \
         read -r go; exit 3",
    );
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let tree = m.appear(&["grandchild", "daemon"]);
    let daemon = stat(tree[1].pid).expect("daemon stat");
    assert_eq!(daemon.session, tree[1].pid, "not a daemon: {daemon:?}");
    let mut stdin = child.take_stdin().expect("stdin");
    stdin.write_all(b"go\n").expect("write");
    let status = ended(&mut child);
    // The status is collected once the warden's sweep is over.
    m.assert_none_left("once the command's status was collected");
    assert_eq!(status.code(), Some(3), "{status:?}");
}

/// A command that, once it has printed `ready`, ignores SIGTERM, as does
/// the grandchild it started.
const IGNORES_TERM: &str = "trap '' TERM; exec -a \"${M}grandchild\" sleep 1000 & \
                            echo ready; exec -a \"${M}cmd\" sleep 1000";

#[test]
fn stop_lets_a_command_end_on_sigterm() {
    let m = Marked::new("stop_clean");
    let mut cmd = m.bash(
        "trap 'exit 7' TERM; exec -a \"${M}grandchild\" sleep 1000 & \
         echo ready; wait",
    );
    cmd.stdout(Stdio::piped()).grace(Duration::from_secs(30));
    let mut child = cmd.spawn().expect("spawn");
    assert_eq!(line_of(&mut child), "ready\n");
    m.appear(&["grandchild"]);
    let start = Instant::now();
    let status = child.stop().expect("stop");
    let took = start.elapsed();
    m.assert_none_left("after stop");
    // Its own exit code, from its trap, well before the grace period.
    assert_eq!(status.code(), Some(7), "{status:?}");
    assert!(took < Duration::from_secs(10), "stop took {took:?}");
}

#[test]
fn stop_kills_a_command_that_ignores_sigterm_after_its_grace() {
    let m = Marked::new("stop_ignored");
    let grace = Duration::from_millis(300);
    let mut cmd = m.bash(IGNORES_TERM);
    cmd.stdout(Stdio::piped()).grace(grace);
    let mut child = cmd.spawn().expect("spawn");
    assert_eq!(line_of(&mut child), "ready\n");
    m.appear(&["grandchild", "cmd"]);
    let start = Instant::now();
    let status = child.stop().expect("stop");
    let took = start.elapsed();
    m.assert_none_left("after stop");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(took >= grace, "killed before its grace period: {took:?}");
    // Not by `mass` killing the warden itself, 15 s past the grace.
    assert!(took < grace + Duration::from_secs(8), "stop took {took:?}");
}

#[test]
fn kill_is_at_once_whatever_the_grace() {
    let m = Marked::new("kill");
    let grace = Duration::from_secs(10);
    let mut cmd = m.bash(IGNORES_TERM);
    cmd.stdout(Stdio::piped()).grace(grace);
    let mut child = cmd.spawn().expect("spawn");
    assert_eq!(line_of(&mut child), "ready\n");
    m.appear(&["grandchild", "cmd"]);
    let start = Instant::now();
    let status = child.kill().expect("kill");
    let took = start.elapsed();
    m.assert_none_left("after kill");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(took < Duration::from_secs(5), "kill took {took:?}");
}

/// Daemon `$1` of the chain: starts daemon `$1 + 1` in a session of its
/// own (up to 4), then becomes `${M}d$1`.
const DAEMON: &str = "n=$1; if [ \"$n\" -lt 4 ]; then \
                      setsid bash -c \"$DAEMON\" \"${M}d$((n + 1))\" $((n + 1)) & fi; \
                      exec -a \"${M}d$n\" sleep 1000";

#[test]
fn a_chain_of_setsid_daemons_is_swept_on_drop() {
    let m = Marked::new("chain");
    let mut cmd = m.bash(
        "setsid bash -c \"$DAEMON\" \"${M}d1\" 1 & \
         exec -a \"${M}cmd\" sleep 1000",
    );
    cmd.env("DAEMON", DAEMON);
    let child = cmd.spawn().expect("spawn");
    let tree = m.appear(&["cmd", "d1", "d2", "d3", "d4"]);
    let stats: Vec<Stat> = tree.iter().map(|p| stat(p.pid).expect("stat")).collect();
    for (i, (p, s)) in tree.iter().zip(&stats).enumerate().skip(1) {
        // Each a session leader, started by the one before it: when one
        // dies its successor is an orphan that comes to the warden.
        let chained = s.session == p.pid && s.ppid == tree[i - 1].pid;
        if !chained {
            m.kill_all();
        }
        assert!(chained, "{p:?} {s:?} in {tree:?}");
    }
    let start = Instant::now();
    drop(child);
    let took = start.elapsed();
    m.assert_none_left("when the drop returned");
    assert!(took < Duration::from_secs(10), "drop took {took:?}");
}
