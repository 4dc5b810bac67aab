//! The warden: the process between `mass` and one supervised command (see
//! the module above for why). It is this same executable, re-entered
//! through a constructor in `.init_array` that runs before `main` in every
//! binary linking this crate; when the process's first argument is
//! [`FLAG`] the constructor never returns, otherwise it returns at once.
//!
//! Argument vector (a private interface with `Command::spawn`):
//! `[exe, FLAG, parent_pid, grace_ms, program, args...]`. The environment,
//! cwd and stdio are the command's; they pass to it through `fork` and
//! `execvp`. The warden is single-threaded and writes only to stderr
//! (`mass warden: ...`).
//!
//! Signals: SIGUSR1 asks for a stop (SIGTERM to the group, the grace
//! period, then the sweep); SIGUSR2, SIGTERM (the parent-death signal) and
//! SIGHUP sweep at once; SIGINT and SIGQUIT are ignored. The sweep kills
//! the group and every child of the warden with SIGKILL until none is
//! left, then the warden exits as its leader did: the same code, or the
//! same signal (126 when the command could not be started, 127 when it
//! was not found).

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The first argument that makes a process a warden. No user-facing
/// command of any binary takes it.
pub(super) const FLAG: &str = "--mass-warden-v1";

/// How long the sweep may take before the warden gives up and exits.
const SWEEP_LIMIT: Duration = Duration::from_secs(10);

/// How often the warden checks its parent is still the one it had.
const TICK_MS: libc::c_int = 500;

type InitFn = extern "C" fn(libc::c_int, *const *const libc::c_char, *const *const libc::c_char);

/// Registered as an ELF constructor; glibc passes it `argc`, `argv` and
/// `envp`. Referenced from `Command::spawn` so that the linker keeps it
/// in every binary that can spawn a warden.
#[used]
#[link_section = ".init_array"]
pub(super) static WARDEN_HOOK: InitFn = warden_hook;

extern "C" fn warden_hook(
    argc: libc::c_int,
    argv: *const *const libc::c_char,
    _envp: *const *const libc::c_char,
) {
    if argc < 2 || argv.is_null() {
        return;
    }
    // SAFETY: glibc passes the process's argv: argc valid C strings.
    let first = unsafe { *argv.add(1) };
    if first.is_null() || unsafe { CStr::from_ptr(first) }.to_bytes() != FLAG.as_bytes() {
        return;
    }
    // SAFETY: as above, every argv[i] for i < argc is a valid C string.
    let args: Vec<CString> = (0..argc as usize)
        .map(|i| unsafe { CStr::from_ptr(*argv.add(i)) }.to_owned())
        .collect();
    let code = run(&args);
    // SAFETY: _exit is always safe; nothing of this process is to be flushed.
    unsafe { libc::_exit(code) }
}

/// Writes `parts` to stderr, best effort.
fn note(parts: &[&[u8]]) {
    for p in parts {
        let mut rest = *p;
        while !rest.is_empty() {
            // SAFETY: writes from a valid buffer of its length.
            let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
            if n <= 0 {
                return;
            }
            rest = &rest[n as usize..];
        }
    }
}

fn note_err(what: &str, e: &std::io::Error) {
    note(&[
        b"mass warden: ",
        what.as_bytes(),
        b": ",
        e.to_string().as_bytes(),
        b"\n",
    ]);
}

/// Sets up the warden, starts the command and watches it; returns only
/// an exit code (a mirrored signal does not return).
fn run(args: &[CString]) -> libc::c_int {
    let [_, _, parent, grace, program, ..] = args else {
        note(&[b"mass warden: started without a command\n"]);
        return 126;
    };
    let number = |c: &CString| c.to_str().ok().and_then(|s| s.parse::<u64>().ok());
    let (Some(parent), Some(grace_ms)) = (number(parent), number(grace)) else {
        note(&[b"mass warden: unreadable arguments\n"]);
        return 126;
    };
    // A closed stderr pipe must not kill the warden before its sweep (the
    // leader gets the default back).
    // SAFETY: changes this process's own disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let signals = match block_signals() {
        Ok(fd) => fd,
        Err(e) => {
            note_err("cannot take its signals", &e);
            return 126;
        }
    };
    // SAFETY: prctl and getppid only change or read this process's state.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0
            || libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) != 0
        {
            note_err("prctl", &std::io::Error::last_os_error());
            return 126;
        }
        // `mass` died before the parent-death signal was set: start nothing.
        if libc::getppid() as u64 != parent {
            return 126;
        }
    }
    let (leader, leader_fd) = match start_leader(program, &args[4..]) {
        Ok(l) => l,
        Err(e) => {
            note_err("cannot start the command", &e);
            return 126;
        }
    };
    let mut w = Warden {
        parent: parent as libc::pid_t,
        leader,
        leader_fd,
        signals,
        grace: Duration::from_millis(grace_ms),
    };
    w.watch();
    w.sweep();
    exit_like(w.reap_leader())
}

/// Blocks the signals the warden handles and returns a signalfd for them.
fn block_signals() -> std::io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data filled by sigemptyset/sigaddset; the
    // mask and the signalfd concern this single-threaded process only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGCHLD,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ] {
            libc::sigaddset(&mut set, s);
        }
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Forks the command as the leader of a new process group, its signal mask
/// cleared, dying with the warden; returns its pid and pidfd.
fn start_leader(program: &CString, argv: &[CString]) -> std::io::Result<(libc::pid_t, OwnedFd)> {
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: getpid only reads.
    let me = unsafe { libc::getpid() };
    // SAFETY: the warden is single-threaded, so the child may run anything;
    // it uses only system calls on data prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: as above; execvp gets NUL-terminated strings and a
        // null-terminated pointer array, and returns only on failure.
        unsafe {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != me {
                libc::_exit(126);
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::execvp(program.as_ptr(), ptrs.as_ptr());
            let err = std::io::Error::last_os_error();
            note(&[b"mass warden: cannot execute "]);
            note_err(&program.to_string_lossy(), &err);
            let code = if err.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            libc::_exit(code);
        }
    }
    // SAFETY: also from this side, so the group exists before any kill.
    unsafe { libc::setpgid(pid, pid) };
    // SAFETY: pidfd_open of our own unreaped child, whose pid is ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        // SAFETY: our own unreaped child, and its group.
        unsafe { libc::killpg(pid, libc::SIGKILL) };
        return Err(err);
    }
    // SAFETY: a new fd that nothing else owns.
    Ok((pid, unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) }))
}

/// What woke the warden.
enum Event {
    Signal(libc::c_int),
    LeaderExited,
    Tick,
}

/// How a watch ends.
enum Ending {
    /// The leader exited: sweep what it left.
    Exited,
    /// `mass` asked for a stop.
    Stop,
    /// `mass` is gone or asked for everything to die now.
    Now,
}

struct Warden {
    parent: libc::pid_t,
    /// The command's pid, which is also its group's id. Never reaped
    /// before the sweep is over, so neither id can be reused meanwhile.
    leader: libc::pid_t,
    leader_fd: OwnedFd,
    signals: OwnedFd,
    grace: Duration,
}

impl Warden {
    /// Waits for the command to end, `mass` to die, or a request.
    fn watch(&mut self) {
        let ending = self.until(None);
        if let Ending::Stop = ending {
            // SAFETY: the group of our unreaped leader.
            unsafe { libc::killpg(self.leader, libc::SIGTERM) };
            self.until(Some(Instant::now() + self.grace));
        }
    }

    /// Handles events until the leader exits, a request comes, `mass` is
    /// gone, or `deadline` passes (`Stop` then).
    fn until(&mut self, deadline: Option<Instant>) -> Ending {
        loop {
            let timeout = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ending::Stop;
                    }
                    (left.as_millis() as libc::c_int).clamp(1, TICK_MS)
                }
                None => TICK_MS,
            };
            match self.next(timeout) {
                Event::LeaderExited => return Ending::Exited,
                Event::Signal(libc::SIGUSR1) if deadline.is_none() => return Ending::Stop,
                Event::Signal(libc::SIGUSR2 | libc::SIGTERM | libc::SIGHUP) => return Ending::Now,
                Event::Signal(libc::SIGCHLD) => self.reap_orphans(),
                Event::Signal(_) | Event::Tick => {}
            }
            // SAFETY: getppid only reads.
            if unsafe { libc::getppid() } != self.parent {
                return Ending::Now;
            }
        }
    }

    /// Waits up to `timeout_ms` for a signal or the leader's exit.
    fn next(&self, timeout_ms: libc::c_int) -> Event {
        let mut fds = [
            libc::pollfd {
                fd: self.signals.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.leader_fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if n <= 0 {
            return Event::Tick;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            // SAFETY: reads one signalfd_siginfo (plain data) from the signalfd.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            let r = unsafe {
                libc::read(
                    self.signals.as_raw_fd(),
                    (&mut info as *mut libc::signalfd_siginfo).cast(),
                    size,
                )
            };
            if r as usize == size {
                return Event::Signal(info.ssi_signo as libc::c_int);
            }
        }
        if fds[1].revents & libc::POLLIN != 0 {
            return Event::LeaderExited;
        }
        Event::Tick
    }

    /// Reaps orphans that exited, never the leader.
    fn reap_orphans(&self) {
        loop {
            // SAFETY: siginfo_t is plain data; WNOWAIT only looks.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let r = unsafe {
                libc::waitid(
                    libc::P_ALL,
                    0,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            // SAFETY: filled by waitid or still zeroed.
            let pid = unsafe { info.si_pid() };
            if r != 0 || pid == 0 || pid == self.leader {
                return;
            }
            // SAFETY: reaps the exited child just seen.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        }
    }

    /// Kills the leader's group and every child of the warden (orphans of
    /// the tree come to it) with SIGKILL, reaps them, until none is left.
    fn sweep(&mut self) {
        let deadline = Instant::now() + SWEEP_LIMIT;
        loop {
            // SAFETY: our unreaped leader, and its group (the leader's pid
            // is the group's id, and cannot be reused while it is unreaped).
            unsafe {
                libc::killpg(self.leader, libc::SIGKILL);
                libc::kill(self.leader, libc::SIGKILL);
            }
            let Some(left) = self.kill_round() else {
                return;
            };
            if left.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let pids: Vec<String> = left.iter().map(|p| p.to_string()).collect();
                note(&[
                    b"mass warden: still running after SIGKILL: ",
                    pids.join(" ").as_bytes(),
                    b"\n",
                ]);
                return;
            }
            // A child's exit (SIGCHLD) or 10 ms.
            if let Event::Signal(_) = self.next(10) {}
        }
    }

    /// One round of the sweep over /proc: SIGKILL to every child but the
    /// leader, zombies reaped. Returns the processes of the tree still
    /// running, or None without /proc.
    fn kill_round(&self) -> Option<Vec<libc::pid_t>> {
        // SAFETY: getpid only reads.
        let me = unsafe { libc::getpid() };
        let mut left = Vec::new();
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            let Some((state, ppid, pgrp)) = proc_stat(pid) else {
                continue;
            };
            let dead = state == b'Z' || state == b'X';
            if pid == self.leader || (ppid != me && pgrp != self.leader) {
                if pid == self.leader && !dead {
                    left.push(pid);
                }
                continue;
            }
            if ppid == me {
                // SAFETY: our own unreaped child: its pid is still its own.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    if dead {
                        libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
                    }
                }
            }
            if !dead {
                left.push(pid);
            }
        }
        Some(left)
    }

    /// Reaps the leader (killed by the sweep if it was still running).
    fn reap_leader(&self) -> (libc::c_int, libc::c_int) {
        // SAFETY: siginfo_t is plain data filled by waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: waitid on our own pidfd, writing into `info`.
            let r = unsafe {
                libc::waitid(
                    libc::P_PIDFD,
                    self.leader_fd.as_raw_fd() as libc::id_t,
                    &mut info,
                    libc::WEXITED,
                )
            };
            if r == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
        // SAFETY: filled by waitid (zeroed if it failed: exit 0 is not
        // claimed then, see below).
        let status = unsafe { info.si_status() };
        match info.si_code {
            0 => (libc::CLD_EXITED, 126),
            code => (code, status),
        }
    }
}

/// (state, ppid, pgrp) from /proc/PID/stat.
fn proc_stat(pid: libc::pid_t) -> Option<(u8, libc::pid_t, libc::pid_t)> {
    let s = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = s.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(s.get(close + 2..)?).ok()?;
    let mut f = rest.split(' ');
    let state = *f.next()?.as_bytes().first()?;
    let ppid = f.next()?.parse().ok()?;
    let pgrp = f.next()?.parse().ok()?;
    Some((state, ppid, pgrp))
}

/// Exits as the leader did: with its code, or killed by its signal (no
/// core dump of the warden).
fn exit_like((code, status): (libc::c_int, libc::c_int)) -> libc::c_int {
    if code == libc::CLD_EXITED {
        return status;
    }
    // SAFETY: changes only this process's own limits, disposition and mask
    // before it ends.
    unsafe {
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        libc::signal(status, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, status);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(status);
    }
    128 + status
}
