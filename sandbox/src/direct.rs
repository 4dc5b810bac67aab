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
//! A step that fails in the child is named on the command's stderr and the
//! command exits with 126 (127 when the program is not found), as the
//! launcher does.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use crate::confine::{die_with_parent, rlimit_table, set_nice, set_rlimits, RlimitTable};
use crate::policy::{Layer, Policy};
use crate::sys::{cvt, note, wait_pid};

/// The child's stack while it runs in the caller's memory: its frames are
/// a few hundred bytes; the rest is margin.
const CHILD_STACK: usize = 64 * 1024;

/// What the command runs as: program, arguments, environment, directory,
/// and what the policy asks of the process.
pub(crate) struct Plan {
    pub(crate) program: OsString,
    pub(crate) args: Vec<OsString>,
    pub(crate) env: Vec<(OsString, OsString)>,
    pub(crate) cwd: Option<PathBuf>,
    pub(crate) limits: Option<RlimitTable>,
    pub(crate) nice: u8,
}

impl Plan {
    pub(crate) fn new(program: &OsStr, policy: &Policy) -> Plan {
        Plan {
            program: program.to_os_string(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            limits: (!policy.off(Layer::Rlimits)).then(|| rlimit_table(&policy.limits)),
            nice: policy.limits.nice,
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
/// strings and arrays that outlive the clone, fds, the limits.
struct ChildArgs {
    /// The program's resolved path; null when `PATH` held none.
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// Null: stay in the caller's directory.
    cwd: *const libc::c_char,
    /// stdin, stdout and stderr for the command, each above fd 2.
    stdio: [RawFd; 3],
    limits: Option<RlimitTable>,
    nice: u8,
    parent: u32,
}

/// Starts the command of `plan`; returns once it runs the program (or has
/// exited, naming the failed step on its stderr).
pub(crate) fn spawn(plan: &Plan) -> io::Result<Started> {
    let c = |s: &OsStr| {
        CString::new(s.as_bytes()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "an argument, variable or path contains a NUL byte",
            )
        })
    };
    let program = resolve(&plan.program, &plan.env, plan.cwd.as_deref())
        .map(|p| c(p.as_os_str()))
        .transpose()?;
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
    let cwd = plan.cwd.as_deref().map(|d| c(d.as_os_str())).transpose()?;
    let argv_ptrs = null_terminated(&argv);
    let envp_ptrs = null_terminated(&envp);
    let stdin = above_stdio(open_dev_null()?)?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (out_w, err_w) = (above_stdio(out_w)?, above_stdio(err_w)?);
    let args = ChildArgs {
        program: program.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()),
        argv: argv_ptrs.as_ptr(),
        envp: envp_ptrs.as_ptr(),
        cwd: cwd.as_ref().map_or(std::ptr::null(), |d| d.as_ptr()),
        stdio: [stdin.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
        limits: plan.limits,
        nice: plan.nice,
        parent: std::process::id(),
    };
    let pid = clone_vfork(&args)?;
    // The child has exec'd or exited: its ends of the pipes and stdin are
    // closed here (dropped), the strings and arrays may go.
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
    let old = set_mask(!0);
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
    set_mask(old);
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
    // SAFETY: plain system calls on prepared values.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            fail(b"sandbox: setpgid failed\n", 126);
        }
        for (target, &fd) in a.stdio.iter().enumerate() {
            // Every fd is above 2, so no dup2 here overwrites a later source.
            if libc::dup2(fd, target as libc::c_int) < 0 {
                fail(b"sandbox: setting up stdio failed\n", 126);
            }
        }
        if !a.cwd.is_null() && libc::chdir(a.cwd) != 0 {
            fail(b"sandbox: cannot enter the working directory\n", 126);
        }
    }
    die_with_parent(a.parent);
    if let Some(t) = &a.limits {
        if set_rlimits(t).is_err() {
            fail(b"", 126);
        }
    }
    if set_nice(a.nice).is_err() {
        fail(b"", 126);
    }
    if a.program.is_null() {
        fail(
            b"sandbox: cannot execute the command: No such file or directory (not in PATH)\n",
            127,
        );
    }
    set_mask(0);
    // SAFETY: NUL-terminated strings and null-terminated arrays that
    // outlive the call.
    unsafe { libc::execve(a.program, a.argv, a.envp) };
    let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
    note(b"sandbox: cannot execute the command (errno ");
    note(decimal(errno).as_slice());
    note(b")\n");
    fail(b"", if errno == libc::ENOENT { 127 } else { 126 })
}

/// Sets this thread's signal mask to `mask` (bit n-1 for signal n) with
/// the system call itself; returns the mask before.
fn set_mask(mask: u64) -> u64 {
    let mut old: u64 = 0;
    // SAFETY: rt_sigprocmask with pointers to two local 8-byte masks and
    // the kernel's sigset size.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &mask as *const u64,
            &mut old as *mut u64,
            8usize,
        )
    };
    old
}

/// Names the failed step (unless the step already did) and exits.
fn fail(msg: &[u8], code: libc::c_int) -> ! {
    if !msg.is_empty() {
        note(msg);
    }
    // SAFETY: _exit is always safe; nothing of the caller's is flushed.
    unsafe { libc::_exit(code) }
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

/// `n` in decimal, in a fixed buffer (no allocation in the child).
fn decimal(n: i32) -> DecimalBuf {
    let mut buf = [0u8; 12];
    let mut at = buf.len();
    let mut v = n.unsigned_abs();
    loop {
        at -= 1;
        buf[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if n < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    DecimalBuf { buf, at }
}

struct DecimalBuf {
    buf: [u8; 12],
    at: usize,
}

impl DecimalBuf {
    fn as_slice(&self) -> &[u8] {
        &self.buf[self.at..]
    }
}

/// The program's path: as given when it holds a '/', else the first
/// executable file of that name in the command's own `PATH` (as `execvp`
/// would search it in the launcher, from the command's directory).
fn resolve(program: &OsStr, env: &[(OsString, OsString)], cwd: Option<&Path>) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    let path = env.iter().rev().find(|(k, _)| k == "PATH").map_or_else(
        || OsString::from("/usr/local/bin:/usr/bin:/bin"),
        |(_, v)| v.clone(),
    );
    path.as_bytes()
        .split(|&b| b == b':')
        .map(|d| {
            // A relative entry (empty is ".") is relative to the command's
            // directory, where execvp would look.
            let d = Path::new(OsStr::from_bytes(if d.is_empty() { b"." } else { d }));
            match cwd {
                Some(c) if d.is_relative() => c.join(d).join(program),
                _ => d.join(program),
            }
        })
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid C string.
    let x = unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0;
    x && p.is_file()
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
    fn decimal_writes_errno_values() {
        for (n, s) in [
            (0, "0"),
            (2, "2"),
            (13, "13"),
            (-1, "-1"),
            (i32::MIN, "-2147483648"),
        ] {
            assert_eq!(decimal(n).as_slice(), s.as_bytes());
        }
    }
}
