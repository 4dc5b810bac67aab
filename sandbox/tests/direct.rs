//! `Level::None` starts commands without the launcher (`Spawn::new`, a
//! clone of the caller that only sets the process's limits before exec).
//! The oracle is the launcher itself: everything a command can observe of
//! how it was started (its limits, priority, signal state, process group,
//! parent, stdio, environment, directory, open fds, the exit code and note
//! of a failed start) must be what `Spawn::via_launcher` gives it, and the
//! policy's values where the policy sets them.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use sandbox::{Level, Policy, Spawn};

/// The tests of this file one at a time: one counts this process's fds.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a command saw of its own start, one fact per line, with the
/// values that differ per process (pids) replaced by what they must equal.
const PROBE: &str = r#"
for o in t v p f n c; do echo "soft $o $(ulimit -S -$o) hard $(ulimit -H -$o)"; done
read -r pid comm state ppid pgrp rest < /proc/self/stat
echo "pgrp is own pid: $([ "$pgrp" = "$pid" ] && echo yes || echo no)"
echo "parent is the caller: $([ "$ppid" = "$CALLER" ] && echo yes || echo no)"
set -- $rest
echo "nice ${14}"
grep -E '^(SigBlk|SigIgn|SigCgt|NoNewPrivs|Seccomp):' /proc/self/status
echo "stdin $(readlink /proc/self/fd/0)"
echo "fds $(ls /proc/self/fd | wc -l)"
echo "cwd $(pwd)"
env | sort
"#;

fn policy(ws: &Path) -> Policy {
    let mut p = Policy::new(Level::None, ws);
    // Values unlike the defaults, so a limit left unset shows.
    p.limits.cpu_secs = 77;
    p.limits.address_space_mb = 3333;
    p.limits.processes = 99;
    p.limits.file_size_mb = 55;
    p.limits.open_files = 111;
    p.limits.nice = 7;
    p
}

/// Runs `sh -c script` (sh, not bash: bash sets up signals of its own),
/// started by `s`; returns (exit code, stdout, stderr).
fn run(mut s: Spawn, ws: &Path, script: &str) -> (Option<i32>, String, String) {
    s.arg("-c")
        .arg(script)
        .current_dir(ws)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("CALLER", std::process::id().to_string())
        .env("MARK", "a value");
    let mut child = s.spawn().unwrap();
    // A command that outlives its limits (as one would with a limit left
    // unset) is killed after 20 s, so the test fails instead of hanging.
    let pgid = child.id() as i32;
    let (done, watch) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if watch.recv_timeout(Duration::from_secs(20)).is_err() {
            // SAFETY: a plain signal to the process group this test started.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    });
    let (mut out, mut err) = (String::new(), String::new());
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t = std::thread::spawn(move || {
        let mut e = String::new();
        se.read_to_string(&mut e).unwrap();
        e
    });
    so.read_to_string(&mut out).unwrap();
    err.push_str(&t.join().unwrap());
    let status = child.wait().unwrap();
    let _ = done.send(());
    watchdog.join().unwrap();
    // Killed by a signal: 128 + the signal, as a shell reports it.
    (status.code().or(status.signal().map(|s| 128 + s)), out, err)
}

#[test]
fn a_direct_start_gives_the_command_what_the_launcher_gives_it() {
    let _serial = serial();
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let p = policy(&ws);
    let direct = run(Spawn::new("sh", &p).unwrap(), &ws, PROBE);
    let launched = run(Spawn::via_launcher("sh", &p).unwrap(), &ws, PROBE);
    assert_eq!(direct.0, Some(0), "{direct:?}");
    assert_eq!(
        direct, launched,
        "direct start (left) and launcher (right) differ"
    );
    // And what the policy says, not only what the two agree on.
    let out = &direct.1;
    for line in [
        "soft t 77 hard 77",
        &format!("soft v {} hard {}", 3333 * 1024, 3333 * 1024),
        "soft p 99 hard 99",
        &format!("soft f {} hard {}", 55 * 1024 * 2, 55 * 1024 * 2),
        "soft n 111 hard 111",
        "soft c 0 hard 0",
        "pgrp is own pid: yes",
        "parent is the caller: yes",
        "nice 7",
        "SigBlk:\t0000000000000000",
        "stdin /dev/null",
        &format!("cwd {}", ws.display()),
        "MARK=a value",
    ] {
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    // SIGPIPE (13) is not ignored, though the Rust runtime ignores it here.
    let ign = out
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:\t"))
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or(u64::MAX);
    assert_eq!(ign & (1 << 12), 0, "SIGPIPE ignored: {out}");
    let env: Vec<&str> = out
        .lines()
        .filter(|l| l.contains('=') && !l.starts_with("soft"))
        .collect();
    // sh adds PWD (and SHLVL, _) itself; nothing of the caller's leaks.
    for l in &env {
        let k = l.split('=').next().unwrap_or("");
        assert!(
            ["PATH", "CALLER", "MARK", "PWD", "SHLVL", "_", "OLDPWD"].contains(&k),
            "unexpected variable {l:?}"
        );
    }
}

#[test]
fn a_program_that_cannot_start_exits_127_or_126_with_a_note_either_way() {
    let _serial = serial();
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let p = policy(&ws);
    for (program, code) in [
        ("no-such-program-anywhere", 127),
        ("/nonexistent/prog", 127),
        (ws.to_str().unwrap(), 126),
    ] {
        let d = run(Spawn::new(program, &p).unwrap(), &ws, "true");
        let l = run(Spawn::via_launcher(program, &p).unwrap(), &ws, "true");
        assert_eq!(d.0, Some(code), "direct {program}: {d:?}");
        assert_eq!(l.0, Some(code), "launcher {program}: {l:?}");
        assert!(
            d.2.starts_with("sandbox: cannot execute the command"),
            "direct {program}: {d:?}"
        );
    }
}

#[test]
fn a_missing_working_directory_is_named_and_nothing_runs() {
    let _serial = serial();
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let mut s = Spawn::new("sh", &policy(&ws)).unwrap();
    s.arg("-c").arg("echo ran").current_dir(ws.join("gone"));
    let mut child = s.spawn().unwrap();
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(126));
    assert_eq!(out, "");
    assert!(err.contains("working directory"), "{err}");
}

/// Open fds of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Many threads starting commands at once (each clone suspends only its
/// own thread; the others keep allocating): every command gets its own
/// arguments and output, nothing is left open or unreaped.
#[test]
fn concurrent_direct_starts_keep_their_own_arguments_and_leak_nothing() {
    let _serial = serial();
    const THREADS: usize = 8;
    const EACH: usize = 40;
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let p = policy(&ws);
    let before = fds();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (p, ws) = (&p, &ws);
            s.spawn(move || {
                for i in 0..EACH {
                    // Garbage between starts, so a child reading freed or
                    // reused memory would show.
                    let noise: Vec<String> = (0..64).map(|k| format!("{t}-{i}-{k}")).collect();
                    let (code, out, err) = run(
                        Spawn::new("sh", p).unwrap(),
                        ws,
                        &format!("echo {t} {i} $MARK; exit {}", (t + i) % 7),
                    );
                    drop(noise);
                    assert_eq!(code, Some(((t + i) % 7) as i32), "{err}");
                    assert_eq!(out, format!("{t} {i} a value\n"));
                }
            });
        }
    });
    assert_eq!(fds(), before, "fds left open");
    // Every command was reaped: no child of ours is left.
    // SAFETY: waitpid with WNOHANG on any child only reads a status.
    let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
    assert_eq!(r, -1, "an unreaped child was left");
}

/// The command's limits apply from its first instruction: a command that
/// only burns CPU is stopped by RLIMIT_CPU (soft = hard, so it cannot
/// raise it).
#[test]
fn the_cpu_limit_stops_a_command_that_cannot_raise_it() {
    let _serial = serial();
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let mut p = policy(&ws);
    p.limits.cpu_secs = 1;
    let t = std::time::Instant::now();
    let (code, _, err) = run(
        Spawn::new("sh", &p).unwrap(),
        &ws,
        "ulimit -t unlimited 2>/dev/null && echo raised >&2; while :; do :; done",
    );
    assert!(!err.contains("raised"), "{err}");
    // soft = hard: the kernel sends SIGKILL at once (SIGXCPU comes first
    // only while soft < hard); the watchdog's SIGKILL would come at 20 s.
    let code = code.and_then(|c| c.checked_sub(128));
    assert!(
        code == Some(libc::SIGKILL) || code == Some(libc::SIGXCPU),
        "signal {code:?}: {err}"
    );
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
}
