//! How a confined command is started: through the launcher (or, at
//! `Level::None`, directly), without forking the caller.

use sandbox::{command, probe, Level, Policy, Spawn};
use std::os::unix::process::CommandExt;
use std::process::Stdio;

/// Minor page faults taken by the calling thread so far.
fn minor_faults() -> i64 {
    // SAFETY: getrusage writes only into the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
    u.ru_minflt
}

/// 64 MiB of 4 KiB pages.
const PAGES: usize = 16 * 1024;

/// Writes one byte of every page of `mem`.
fn touch(mem: &mut [u8], v: u8) {
    for p in 0..PAGES {
        mem[p * 4096] = v;
    }
}

/// Minor faults this thread takes running `start` (which starts and waits
/// for a command) and then writing every page of `mem` once more.
fn faults_after(mem: &mut [u8], start: impl FnOnce()) -> i64 {
    let before = minor_faults();
    start();
    touch(mem, 2);
    minor_faults() - before
}

/// Regression (the orchestration benchmark at 256 rollouts spent a quarter
/// of its CPU in fork): a fork write-protects every page of the caller, so
/// each page it writes afterwards takes a copy-on-write fault. Spawning
/// through the launcher (posix_spawn, a vfork) must not: writing 64 MiB
/// after a confined command ran takes no more faults than before any
/// command ran.
#[test]
fn spawning_a_confined_command_does_not_fork_the_caller() {
    let mut mem = vec![0u8; PAGES * 4096];
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    // The probe forks a throwaway child once per process: before the baseline.
    let avail = probe();
    touch(&mut mem, 1);
    let mut levels = vec![Level::None];
    if avail.check(Level::Landlock).is_ok() {
        levels.push(Level::Landlock);
    }
    if avail.check(Level::Full).is_ok() {
        levels.push(Level::Full);
    }
    for level in levels {
        let policy = Policy::new(level, &ws);
        let mut cmd = command("true", &policy).unwrap();
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .current_dir(&ws)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let faults = faults_after(&mut mem, || {
            let status = cmd.status().unwrap();
            assert!(status.success(), "{level:?}: {status}");
        });
        assert!(
            faults < (PAGES / 8) as i64,
            "{level:?}: {faults} page faults writing {PAGES} pages after a spawn: the caller was forked"
        );
    }
}

/// The same for a command started without the launcher (`Spawn::new` at
/// `Level::None`): the clone shares the caller's memory, copying none of it.
#[test]
fn starting_a_command_directly_does_not_fork_the_caller() {
    let mut mem = vec![0u8; PAGES * 4096];
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let _ = probe();
    touch(&mut mem, 1);
    let mut s = Spawn::new("true", &Policy::new(Level::None, &ws)).unwrap();
    s.env("PATH", "/usr/bin:/bin").current_dir(&ws);
    let faults = faults_after(&mut mem, || {
        let status = s.spawn().unwrap().wait().unwrap();
        assert!(status.success(), "{status}");
    });
    assert!(
        faults < (PAGES / 8) as i64,
        "{faults} page faults writing {PAGES} pages after a direct start: the caller was forked"
    );
}
