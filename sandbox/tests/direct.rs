//! `Level::None` starts commands without the launcher (`Spawn::new`, a
//! clone of the caller that only sets the process's limits before exec).
//! The oracle is the launcher itself: everything a command can observe of
//! how it was started (its limits, priority, signal state, process group,
//! parent, stdio, environment, directory, open fds, the exit code and note
//! of a failed start) must be what `Spawn::via_launcher` gives it, and the
//! policy's values where the policy sets them.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
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

/// A fresh workspace directory (kept while the first value lives) and its
/// canonical path.
fn workspace() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    (dir, ws)
}

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
fn run(s: Spawn, ws: &Path, script: &str) -> (Option<i32>, String, String) {
    run_with_path(s, ws, script, Some("/usr/local/bin:/usr/bin:/bin"))
}

/// `run` with `PATH` set to `path` (`None`: no `PATH` at all).
fn run_with_path(
    mut s: Spawn,
    ws: &Path,
    script: &str,
    path: Option<&str>,
) -> (Option<i32>, String, String) {
    s.arg("-c")
        .arg(script)
        .current_dir(ws)
        .env("CALLER", std::process::id().to_string())
        .env("MARK", "a value");
    if let Some(p) = path {
        s.env("PATH", p);
    }
    let mut child = s.spawn().unwrap();
    // A command that outlives its limits (as one would with a limit left
    // unset) is stopped with SIGTERM after 60 s (a signal no limit sends),
    // so the test fails instead of hanging.
    let pgid = child.id() as i32;
    let (done, watch) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if watch.recv_timeout(Duration::from_secs(60)).is_err() {
            // SAFETY: a plain signal to the process group this test started.
            unsafe { libc::kill(-pgid, libc::SIGTERM) };
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
    let (_dir, ws) = workspace();
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

/// The program is looked up and run as `execvp` runs it in the launcher,
/// failures included: the same exit code, output and note, byte for byte.
#[test]
fn a_program_is_found_and_run_as_execvp_would_and_fails_the_same_way() {
    let _serial = serial();
    let (_dir, ws) = workspace();
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    let (bin, noexec) = (ws.join("bin"), ws.join("noexec"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&noexec).unwrap();
    // No `#!`: execve says ENOEXEC, and execvp runs it through /bin/sh.
    std::fs::write(bin.join("script"), "echo ran-by-sh $0\n").unwrap();
    mode(&bin.join("script"), 0o755);
    std::fs::write(noexec.join("script"), "echo not-executable\n").unwrap();
    mode(&noexec.join("script"), 0o644);
    std::fs::write(noexec.join("only"), "echo not-executable\n").unwrap();
    std::fs::write(ws.join("file"), "a plain file\n").unwrap();
    mode(&noexec.join("only"), 0o644);
    let (b, n) = (bin.display(), noexec.display());
    let p = policy(&ws);
    let ws_s = ws.to_str().unwrap();
    let cases: Vec<(&str, Option<String>, i32)> = vec![
        (
            "no-such-program-anywhere",
            Some("/usr/bin:/bin".into()),
            127,
        ),
        ("/nonexistent/prog", Some("/usr/bin:/bin".into()), 127),
        (ws_s, Some("/usr/bin:/bin".into()), 126),
        ("script", Some(format!("{b}")), 0),
        // A file that is not executable is stepped over (EACCES kept)...
        ("script", Some(format!("{n}:{b}")), 0),
        // ...and reported when nothing else runs.
        ("only", Some(format!("{n}:{b}")), 126),
        // An empty entry is the command's directory.
        ("script", Some(format!("/nonexistent::{b}")), 0),
        // Without PATH, glibc's default (/bin:/usr/bin).
        ("sh", None, 0),
        ("", Some("/usr/bin:/bin".into()), 127),
        // The last candidate's error is reported (ENOTDIR: 126), as execvp
        // reports it, not "not found".
        (
            "no-such-program-anywhere",
            Some("/bin:/etc/passwd".into()),
            126,
        ),
        ("./file/x", Some("/usr/bin:/bin".into()), 126),
        // $0 of a script run through sh is the path as glibc builds it.
        ("script", Some(format!(":{b}/")), 0),
    ];
    for (program, path, code) in cases {
        let d = run_with_path(
            Spawn::new(program, &p).unwrap(),
            &ws,
            "true",
            path.as_deref(),
        );
        let l = run_with_path(
            Spawn::via_launcher(program, &p).unwrap(),
            &ws,
            "true",
            path.as_deref(),
        );
        assert_eq!(d.0, Some(code), "direct {program:?} {path:?}: {d:?}");
        assert_eq!(
            d, l,
            "direct (left) and launcher (right) differ: {program:?} {path:?}"
        );
        if code != 0 {
            assert!(
                d.2.starts_with("sandbox: cannot execute the command: "),
                "{d:?}"
            );
        }
    }
}

#[test]
fn a_missing_working_directory_fails_the_start_either_way() {
    let _serial = serial();
    let (_dir, ws) = workspace();
    let p = policy(&ws);
    for mut s in [
        Spawn::new("sh", &p).unwrap(),
        Spawn::via_launcher("sh", &p).unwrap(),
    ] {
        s.arg("-c").arg("echo ran").current_dir(ws.join("gone"));
        let e = s
            .spawn()
            .err()
            .expect("a start in a missing directory succeeded");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }
}

/// With the test switch leaving the rlimits out, the direct start says so
/// as the launcher does, and applies none.
#[test]
fn the_rlimit_switch_is_named_and_leaves_the_limits_out_either_way() {
    let _serial = serial();
    let (_dir, ws) = workspace();
    let mut p = policy(&ws);
    p.unprotected = vec![sandbox::Layer::Rlimits];
    let script = "ulimit -n; ulimit -t";
    let d = run(Spawn::new("sh", &p).unwrap(), &ws, script);
    let l = run(Spawn::via_launcher("sh", &p).unwrap(), &ws, script);
    assert_eq!(d, l);
    assert!(d.2.contains("TEST SWITCH"), "{d:?}");
    assert!(!d.1.contains("111"), "{d:?}");
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
    let (_dir, ws) = workspace();
    let p = policy(&ws);
    let before = fds();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (p, ws) = (&p, &ws);
            s.spawn(move || {
                for i in 0..EACH {
                    let (code, out, err) = run(
                        Spawn::new("sh", p).unwrap(),
                        ws,
                        &format!("echo {t} {i} $MARK; exit {}", (t + i) % 7),
                    );
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
    let (_dir, ws) = workspace();
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
    // only while soft < hard); the watchdog would send SIGTERM.
    let code = code.and_then(|c| c.checked_sub(128));
    assert!(
        code == Some(libc::SIGKILL) || code == Some(libc::SIGXCPU),
        "signal {code:?} after {:?}: {err}",
        t.elapsed()
    );
}

const SIGRACE: &str = "MASS_TEST_DIRECT_SIGRACE";
static CALLER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
static HANDLER_RAN_IN_CHILD: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_usr1(_: libc::c_int) {
    // SAFETY: getpid is async-signal-safe.
    if unsafe { libc::getpid() } != CALLER.load(std::sync::atomic::Ordering::SeqCst) {
        // The child shares this memory until it execs: the caller sees it.
        HANDLER_RAN_IN_CHILD.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The child program of the next test: starts commands while a thread
/// signals its whole process group (the commands are in it until their
/// setpgid), with a SIGUSR1 handler of its own installed.
#[test]
fn sigrace_child_program() {
    if std::env::var(SIGRACE).is_err() {
        return;
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    // SAFETY: getpid; installing a handler that only makes async-signal-safe calls.
    unsafe {
        CALLER.store(libc::getpid(), Ordering::SeqCst);
        libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t);
    }
    let (_dir, ws) = workspace();
    let p = policy(&ws);
    let stop = AtomicBool::new(false);
    let (mut ok, mut killed) = (0, 0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                // SAFETY: a signal to this test's own process group.
                unsafe { libc::kill(0, libc::SIGUSR1) };
            }
        });
        for _ in 0..400 {
            let mut sp = Spawn::new("true", &p).unwrap();
            sp.env("PATH", "/usr/bin:/bin");
            let st = sp.spawn().unwrap().wait().unwrap();
            if st.success() {
                ok += 1;
            } else if st.signal() == Some(libc::SIGUSR1) {
                killed += 1;
            }
        }
        stop.store(true, Ordering::SeqCst);
    });
    println!(
        "ok={ok} killed={killed} handler_ran_in_child={}",
        HANDLER_RAN_IN_CHILD.load(Ordering::SeqCst)
    );
}

/// A signal that reaches a command between the clone and its exec (sent
/// to the caller's process group, the command still in it, or pending
/// when the child unblocks signals) meets the default disposition, never
/// a handler of the caller running in the child's copy of the world.
#[test]
fn no_handler_of_the_caller_runs_in_a_command_being_started() {
    let _serial = serial();
    if std::env::var(SIGRACE).is_ok() {
        return;
    }
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sigrace_child_program",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SIGRACE, "1")
        // Its own group: the flood stays inside it.
        .process_group(0)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("handler_ran_in_child=false"),
        "a handler of the caller ran in a child: {text}"
    );
}
