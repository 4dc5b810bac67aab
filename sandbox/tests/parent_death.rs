//! Regression (#25): a confined command outlived the process that started
//! it. `kill -9` of `mass` during a long command left the launcher (and at
//! `Level::Full` the whole namespace) running, parented to init, writing
//! into a workspace nobody would clean. The launcher now dies with the
//! thread that started it.
//!
//! The test binary runs itself as the child program (`CHILD`): it starts a
//! confined `bash` that leaves a background process, a `setsid` daemon and
//! itself as marked `sleep`s (`exec -a MARK`), and waits. The test
//! SIGKILLs that child program and checks, by the marks in `/proc`, that
//! within a few seconds nothing it started is left: at `Level::Full` none of
//! the three; at `Level::Landlock` and `Level::None` the command itself (no
//! PID namespace there: its background processes are documented to survive
//! a call). At `Level::None` the command is started without the launcher.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox::{command, prepare, probe, Level, Policy, Spawn};

const CHILD: &str = "MASS_TEST_PARENT_DEATH_CHILD";

/// Pids whose command line starts with `mark`.
fn marked(mark: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            if c.starts_with(mark.as_bytes()) {
                out.push(pid);
            }
        }
    }
    out
}

/// The child program: `MARK LEVEL WORKSPACE`.
#[test]
fn child_program_starts_a_confined_command_and_waits() {
    let Ok(args) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = args.splitn(3, ' ').collect();
    let (mark, level, ws) = (parts[0], parts[1], Path::new(parts[2]));
    let level = match level {
        "full" => Level::Full,
        "none" => Level::None,
        _ => Level::Landlock,
    };
    let p = Policy::new(level, ws);
    prepare(&p).unwrap();
    let script = format!(
        "(exec -a {mark}-bg sleep 1000) & setsid bash -c 'exec -a {mark}-daemon sleep 1000' & exec -a {mark}-cmd sleep 1000"
    );
    if level == Level::None {
        // Started directly, without the launcher (`Spawn`).
        let mut s = Spawn::new("bash", &p).unwrap();
        s.arg("-c")
            .arg(script)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .current_dir(ws);
        let _ = s.spawn().unwrap().wait();
        return;
    }
    let mut c = command("bash", &p)
        .unwrap()
        .arg("-c")
        .arg(script)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir(ws)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let _ = c.wait();
}

fn run(level: &str, expect: &[&str]) {
    let base = tempfile::Builder::new()
        .prefix("pdeath-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let ws = base.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let mark = format!("pdeath{}{level}", std::process::id());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_program_starts_a_confined_command_and_waits",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{mark} {level} {}", ws.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let names = |m: &str| -> Vec<String> {
        let mut v: Vec<String> = marked(m)
            .into_iter()
            .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok())
            .map(|c| {
                String::from_utf8_lossy(&c)
                    .split('\0')
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        v.sort();
        v
    };
    while names(&mark).len() < expect.len() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{level}: the command did not start: {:?}",
            names(&mark)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let t = Instant::now();
    let mut left = Vec::new();
    while t.elapsed() < Duration::from_secs(5) {
        left = names(&mark)
            .into_iter()
            .filter(|n| expect.iter().any(|e| n.ends_with(e)))
            .collect();
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Whatever the assertion says, leave nothing behind.
    for p in marked(&mark) {
        // SAFETY: a plain signal to a process this test started.
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    assert!(
        left.is_empty(),
        "{level}: left running 5 s after the parent was SIGKILLed: {left:?}"
    );
}

#[test]
fn a_killed_parent_takes_its_confined_command_with_it_at_full() {
    if std::env::var(CHILD).is_ok() || probe().check(Level::Full).is_err() {
        return;
    }
    run("full", &["-bg", "-daemon", "-cmd"]);
}

/// At `Level::None` the command is started without the launcher; it still
/// dies with the thread that started it (its background processes are
/// documented to survive, as at `Level::Landlock`).
#[test]
fn a_killed_parent_takes_its_command_with_it_at_none() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    run("none", &["-cmd"]);
}

#[test]
fn a_killed_parent_takes_its_confined_command_with_it_at_landlock() {
    if std::env::var(CHILD).is_ok() || probe().check(Level::Landlock).is_err() {
        return;
    }
    run("landlock", &["-cmd"]);
}
