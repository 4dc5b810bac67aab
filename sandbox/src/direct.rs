//! `Level::None` without the launcher: the command is started straight
//! from the caller with `clone(CLONE_VM | CLONE_VFORK)`, as glibc's
//! `posix_spawn` starts a process, and the few steps the launcher would
//! take at that level (the parent-death signal, the rlimits, the priority)
//! run in that child between the clone and `execve`.
//!
//! Why: at `Level::None` the launcher is one more execution of this whole
//! executable per command, about 2 ms of CPU here (the dynamic loader's
//! relocations and symbol lookups, glibc's start-up), more than the rest of
//! a file tool call and a model call together; when hundreds of rollouts
//! end at once their checks arrive as one burst of them (see
//! `benches/orchestration.rs`).
//!
//! How it stays safe: the child shares the caller's memory while the
//! caller's thread is suspended (`CLONE_VFORK`) until the child execs or
//! exits. The child therefore only makes system calls on values prepared
//! beforehand (C strings, pointer arrays, fds, the rlimit table): it never
//! allocates, takes a lock or unwinds. Every signal is blocked around the
//! clone; the child resets each handled signal (and `SIGPIPE`, which the
//! Rust runtime ignores) as `posix_spawn` does before unblocking them, so
//! no handler of the caller ever runs on its behalf. The command starts as
//! `std::process::Command` would start the launcher: empty signal mask,
//! stdin from `/dev/null`, stdout and stderr on pipes, its own process
//! group, the given environment only, the given directory.
//!
//! Failures look as they do through the launcher: a step std's
//! `posix_spawn` takes (process group, stdio, directory) is `spawn`'s
//! error; a step of the launcher (limits, priority) is named on the
//! command's stderr and it exits 126; the program is looked up and run as
//! `execvp` does (its `PATH` order and errors, a file without `#!` through
//! `/bin/sh`), and when that fails the caller writes the launcher's note
//! to the command's stderr and it exits 127 (not found) or 126. The child
//! reports those errnos through the memory it shares with the caller.
//!
//! It relies on immediate binding (rustc links with `-z now`): a lazily
//! bound libc function would run the dynamic loader, which takes locks,
//! in the child. It knows the kernel's signal structures of x86-64 and
//! aarch64 only; elsewhere `Spawn` uses the launcher at every level.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::confine::{
    die_with_parent, rlimit_table, set_nice, set_rlimits, switch_note, RlimitTable,
};
use crate::launch::{exec_failure_code, exec_failure_note};
use crate::policy::{Layer, Policy};
use crate::sys::{cvt, wait_pid};

/// The child's stack while it runs in the caller's memory: its frames are
/// a few hundred bytes; the rest is margin.
const CHILD_STACK: usize = 64 * 1024;

/// What the command runs as: program, arguments, environment, directory,
/// and what the policy asks of the process.
pub(crate) struct Plan {
    pub(crate) program: OsString,
    pub(crate) args: Vec<OsString>,
    /// Sorted by name, as `std::process::Command` passes its environment.
    pub(crate) env: BTreeMap<OsString, OsString>,
    pub(crate) cwd: Option<PathBuf>,
    pub(crate) limits: Option<RlimitTable>,
    pub(crate) nice: u8,
    /// The launcher's note about layers the test switch leaves out, for
    /// the command's stderr (as the launcher writes it), if any.
    pub(crate) switch_note: Option<String>,
}

impl Plan {
    pub(crate) fn new(program: &OsStr, policy: &Policy) -> Plan {
        Plan {
            program: program.to_os_string(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            limits: (!policy.off(Layer::Rlimits)).then(|| rlimit_table(&policy.limits)),
            nice: policy.limits.nice,
            switch_note: switch_note(policy),
        }
    }
}

/// A command started by [`spawn`]: its pid (also its process group) and
/// the read ends of its output pipes. Dropping it does not wait for it.
pub(crate) struct Started {
    pub(crate) pid: u32,
    pub(crate) stdout: File,
    pub(crate) stderr: File,
}

/// Waits for a command [`spawn`] started (retrying on EINTR).
pub(crate) fn wait(pid: u32) -> io::Result<ExitStatus> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    wait_pid(pid).map(ExitStatus::from_raw)
}

/// Everything the child reads, prepared by the caller: pointers into C
/// strings and arrays that outlive the clone, fds, the limits; and the two
/// results it reports back through the memory it shares with the caller.
struct ChildArgs {
    /// The paths `execvp` would try, in its order (one when the program
    /// names a path; none when the program is empty).
    candidates: *const *const libc::c_char,
    candidates_len: usize,
    argv: *const *const libc::c_char,
    /// `[/bin/sh, <candidate>, argv[1..]..., null]`: slot 1 is written by
    /// the child before running a file without `#!` through sh, as
    /// `execvp` does (ENOEXEC).
    sh_argv: *mut *const libc::c_char,
    envp: *const *const libc::c_char,
    /// Null: stay in the caller's directory.
    cwd: *const libc::c_char,
    /// stdin, stdout and stderr for the command, each above fd 2.
    stdio: [RawFd; 3],
    limits: Option<RlimitTable>,
    nice: u8,
    parent: u32,
    /// errno of a step std's `posix_spawn` takes (setpgid, stdio, chdir):
    /// `spawn` then fails with it, as `Command::spawn` does.
    setup_errno: AtomicI32,
    /// errno of the failed exec: the caller writes the launcher's note.
    exec_errno: AtomicI32,
}

/// The C strings and pointer arrays a [`ChildArgs`] points into.
struct CStrings {
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: Option<CString>,
}

impl CStrings {
    fn of(plan: &Plan) -> io::Result<CStrings> {
        let c = |s: &OsStr| {
            CString::new(s.as_bytes()).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "an argument, variable or path contains a NUL byte",
                )
            })
        };
        let mut argv = vec![c(&plan.program)?];
        for a in &plan.args {
            argv.push(c(a)?);
        }
        let mut envp = Vec::with_capacity(plan.env.len());
        for (k, v) in &plan.env {
            let mut kv = k.clone();
            kv.push("=");
            kv.push(v);
            envp.push(c(&kv)?);
        }
        let candidates = candidates(&plan.program, &plan.env)
            .iter()
            .map(|p| c(p.as_os_str()))
            .collect::<io::Result<Vec<_>>>()?;
        let cwd = plan.cwd.as_deref().map(|d| c(d.as_os_str())).transpose()?;
        Ok(CStrings {
            candidates,
            argv,
            envp,
            cwd,
        })
    }
}

/// Starts the command of `plan`; returns once it runs the program, or
/// has exited with 126 or 127 after a step of the launcher's failed
/// (named on its stderr, as the launcher names it). A step std's spawn
/// would take failing (the process group, stdio, the directory) is this
/// function's error, as it is `Command::spawn`'s.
pub(crate) fn spawn(plan: &Plan) -> io::Result<Started> {
    let strings = CStrings::of(plan)?;
    let candidate_ptrs: Vec<*const libc::c_char> =
        strings.candidates.iter().map(|c| c.as_ptr()).collect();
    let argv_ptrs = null_terminated(&strings.argv);
    let mut sh_argv: Vec<*const libc::c_char> = vec![c"/bin/sh".as_ptr(), std::ptr::null()];
    sh_argv.extend_from_slice(&argv_ptrs[1..]);
    let envp_ptrs = null_terminated(&strings.envp);
    let stdin = above_stdio(open_dev_null()?)?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (out_w, mut err_w) = (above_stdio(out_w)?, File::from(above_stdio(err_w)?));
    if let Some(n) = &plan.switch_note {
        // Before the command writes anything, as the launcher writes it.
        err_w.write_all(n.as_bytes())?;
    }
    let args = ChildArgs {
        candidates: candidate_ptrs.as_ptr(),
        candidates_len: candidate_ptrs.len(),
        argv: argv_ptrs.as_ptr(),
        sh_argv: sh_argv.as_mut_ptr(),
        envp: envp_ptrs.as_ptr(),
        cwd: strings
            .cwd
            .as_ref()
            .map_or(std::ptr::null(), |d| d.as_ptr()),
        stdio: [stdin.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
        limits: plan.limits,
        nice: plan.nice,
        parent: std::process::id(),
        setup_errno: AtomicI32::new(0),
        exec_errno: AtomicI32::new(0),
    };
    let pid = clone_vfork(&args)?;
    // The child has exec'd or exited (CLONE_VFORK): what it reported is
    // written, and the strings and arrays may go.
    let setup = args.setup_errno.load(Ordering::SeqCst);
    if setup != 0 {
        drop(wait(pid));
        return Err(io::Error::from_raw_os_error(setup));
    }
    let exec = args.exec_errno.load(Ordering::SeqCst);
    if exec != 0 {
        // The launcher's note; the child exited with the launcher's code.
        let note = exec_failure_note(&io::Error::from_raw_os_error(exec));
        drop(err_w.write_all(note.as_bytes()));
    }
    drop((stdin, out_w, err_w));
    Ok(Started {
        pid,
        stdout: File::from(out_r),
        stderr: File::from(err_r),
    })
}

/// Clones a child that runs [`child_main`] on its own stack in this
/// process's memory, with every signal blocked around the clone; returns
/// its pid once it has exec'd or exited.
fn clone_vfork(args: &ChildArgs) -> io::Result<u32> {
    let mut stack = vec![0u8; CHILD_STACK];
    // The stack grows down from its 16-byte aligned top.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK) & !15;
    // Every signal, glibc's internal ones included (its pthread_sigmask
    // leaves those out), as glibc's posix_spawn blocks them.
    let old = set_mask(!0)?;
    // SAFETY: the child runs `child_main` on `stack`, which outlives it in
    // this memory (CLONE_VFORK suspends this thread until the child execs
    // or exits), and reads only `args`, which outlives it the same way.
    let pid = unsafe {
        libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            args as *const ChildArgs as *mut libc::c_void,
        )
    };
    let err = io::Error::last_os_error();
    // Restoring a mask read a moment ago cannot fail.
    drop(set_mask(old));
    drop(stack);
    if pid < 0 {
        return Err(err);
    }
    Ok(pid as u32)
}

/// The child, between clone and exec. System calls only: see the module
/// docs. Never returns.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` the suspended caller keeps alive.
    let a = unsafe { &*(arg as *const ChildArgs) };
    default_signals();
    let setup_failed = || {
        let e = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        a.setup_errno.store(e, Ordering::SeqCst);
        // SAFETY: _exit is always safe.
        unsafe { libc::_exit(127) }
    };
    // SAFETY: plain system calls on prepared values.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            setup_failed();
        }
        for (target, &fd) in a.stdio.iter().enumerate() {
            // Every fd is above 2, so no dup2 here overwrites a later source.
            if libc::dup2(fd, target as libc::c_int) < 0 {
                setup_failed();
            }
        }
        if !a.cwd.is_null() && libc::chdir(a.cwd) != 0 {
            setup_failed();
        }
    }
    // The launcher's steps at `Level::None`, which name their failure.
    die_with_parent(a.parent);
    if let Some(t) = &a.limits {
        if set_rlimits(t).is_err() {
            exit(126);
        }
    }
    if set_nice(a.nice).is_err() {
        exit(126);
    }
    if set_mask(0).is_err() {
        exit(126);
    }
    let errno = exec_like_execvp(a);
    a.exec_errno.store(errno, Ordering::SeqCst);
    // (An `io::Error` of an errno is a plain value: no allocation.)
    exit(exec_failure_code(&io::Error::from_raw_os_error(errno)))
}

/// Tries each candidate as glibc's `execvp` does: a file without `#!`
/// (ENOEXEC) runs through `/bin/sh`; ENOENT, ENOTDIR, ESTALE, ENODEV,
/// ETIMEDOUT and EACCES go on to the next one; any other error stops.
/// Returns only on failure: the errno to report, as `execvp` reports it
/// (EACCES if any candidate gave it, else the last candidate's; ENOENT
/// when there was none).
fn exec_like_execvp(a: &ChildArgs) -> libc::c_int {
    let mut eacces = false;
    let mut last = libc::ENOENT;
    for i in 0..a.candidates_len {
        // SAFETY: `candidates` holds `candidates_len` valid C strings;
        // `sh_argv` is the caller's array with a free slot 1 (the caller is
        // suspended and does not read it until the child is gone); execve
        // gets NUL-terminated strings and null-terminated arrays.
        let errno = unsafe {
            let path = *a.candidates.add(i);
            libc::execve(path, a.argv, a.envp);
            let mut e = errno();
            if e == libc::ENOEXEC {
                *a.sh_argv.add(1) = path;
                libc::execve(*a.sh_argv, a.sh_argv as *const _, a.envp);
                e = errno();
            }
            e
        };
        last = errno;
        match errno {
            libc::EACCES => eacces = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            other => return other,
        }
    }
    if eacces {
        libc::EACCES
    } else {
        last
    }
}

fn errno() -> libc::c_int {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn exit(code: libc::c_int) -> ! {
    // SAFETY: _exit is always safe; nothing of the caller's is flushed.
    unsafe { libc::_exit(code) }
}

/// Sets this thread's signal mask to `mask` (bit n-1 for signal n) with
/// the system call itself; returns the mask before.
fn set_mask(mask: u64) -> io::Result<u64> {
    let mut old: u64 = 0;
    // SAFETY: rt_sigprocmask with pointers to two local 8-byte masks and
    // the kernel's sigset size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &mask as *const u64,
            &mut old as *mut u64,
            8usize,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(old)
}

/// The kernel's `struct sigaction` (x86-64 and aarch64 layout), for
/// `rt_sigaction` made directly: glibc's wrapper refuses the two signals it
/// reserves for itself, which are reset here too.
#[repr(C)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// Signal dispositions as `posix_spawn` leaves them for the program:
/// every signal with a handler back to its default (the handlers are the
/// caller's code and must not run in the child); glibc's internal signals
/// (cancellation and the set*id broadcast) ignored, as glibc's spawn
/// always leaves them; and
/// `SIGPIPE` to its default, as `std::process::Command` does (the Rust
/// runtime ignores it, and an ignored signal stays ignored across exec).
fn default_signals() {
    // glibc's SIGCANCEL and SIGSETXID: the first two real-time signals.
    const INTERNAL: [libc::c_int; 2] = [32, 33];
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction with pointers to local structs of the
        // kernel's layout and the kernel's sigset size.
        unsafe {
            let mut old: KernelSigaction = std::mem::zeroed();
            let none: *const KernelSigaction = std::ptr::null();
            if libc::syscall(libc::SYS_rt_sigaction, sig, none, &mut old, 8usize) != 0 {
                continue;
            }
            let handled = old.handler != libc::SIG_DFL && old.handler != libc::SIG_IGN;
            let to = if INTERNAL.contains(&sig) {
                if old.handler == libc::SIG_IGN {
                    continue;
                }
                libc::SIG_IGN
            } else if handled || (sig == libc::SIGPIPE && old.handler == libc::SIG_IGN) {
                libc::SIG_DFL
            } else {
                continue;
            };
            let mut new: KernelSigaction = std::mem::zeroed();
            new.handler = to;
            let out: *mut KernelSigaction = std::ptr::null_mut();
            libc::syscall(libc::SYS_rt_sigaction, sig, &new, out, 8usize);
        }
    }
}

/// The paths `execvp` would try for `program`, in order: the program
/// itself when it names a path ('/' in it), else each `PATH` entry, a '/'
/// and the name, byte for byte as glibc builds them (an empty entry is the
/// bare name, in the current directory; without a `PATH`, glibc's default
/// `/bin:/usr/bin`); none for an empty name. (A script without `#!` sees
/// that path as `$0`.)
fn candidates(program: &OsStr, env: &BTreeMap<OsString, OsString>) -> Vec<PathBuf> {
    if program.is_empty() {
        return Vec::new();
    }
    if program.as_bytes().contains(&b'/') {
        return vec![PathBuf::from(program)];
    }
    let path = env
        .get(OsStr::new("PATH"))
        .map_or(b"/bin:/usr/bin".as_slice(), |v| v.as_bytes());
    // Relative entries are relative to the command's directory, where the
    // child is when it execs.
    path.split(|&b| b == b':')
        .map(|d| {
            let mut p = d.to_vec();
            if !d.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(program.as_bytes());
            PathBuf::from(OsString::from_vec(p))
        })
        .collect()
}

fn null_terminated(v: &[CString]) -> Vec<*const libc::c_char> {
    v.iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn open_dev_null() -> io::Result<OwnedFd> {
    // SAFETY: a valid C string; the fd is owned from here on.
    let fd = cvt(unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) })?;
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two ends.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: two fresh fds nobody else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `fd` moved above 2 (close-on-exec), so the child's `dup2` onto 0, 1 and
/// 2 never overwrites one of its own sources (when the caller runs with a
/// standard stream closed, a new fd may be one of them).
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: duplicates an fd we own; the copy is owned from here on.
    let n = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) })?;
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_execvp() {
        let env = |p: Option<&str>| {
            p.map(|p| (OsString::from("PATH"), OsString::from(p)))
                .into_iter()
                .collect::<BTreeMap<_, _>>()
        };
        // Compared as bytes: `Path` equality would take "b//sh" for "b/sh".
        let c = |prog: &str, p: Option<&str>| -> Vec<String> {
            candidates(OsStr::new(prog), &env(p))
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(c("sh", None), ["/bin/sh", "/usr/bin/sh"]);
        assert_eq!(c("sh", Some("/a::b/")), ["/a/sh", "sh", "b//sh"]);
        assert_eq!(c("./x", Some("/a")), ["./x"]);
        assert!(c("", Some("/a")).is_empty());
    }
}
