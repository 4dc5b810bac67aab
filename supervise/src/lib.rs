//! `supervise`: processes that must live exactly as long as `mass`: model
//! servers and trainers now, other long-running commands later. A
//! supervised command
//! ends when its caller stops it or drops its [`Child`], when its own main
//! process exits, or when `mass` dies, however it dies; in every case its
//! whole tree goes with it, grandchildren and daemons that left its
//! process group included.
//!
//! # The mechanism
//!
//! Each command runs under a *warden* (see `warden.rs`): this same
//! executable re-entered through `/proc/self/exe` with a private first
//! argument, caught before `main` by an `.init_array` constructor. The
//! warden
//!
//! - asks for `PR_SET_PDEATHSIG(SIGTERM)`, then checks that its parent is
//!   still the `mass` that started it (no window in which `mass` can die
//!   unnoticed);
//! - becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`), so every
//!   orphan of the command's tree, a daemon that called `setsid` included,
//!   is reparented to the warden instead of to init;
//! - forks the command as the leader of a process group of its own (with
//!   `PR_SET_PDEATHSIG(SIGKILL)` tied to the single-threaded warden) and
//!   watches it by pidfd;
//! - when `mass` dies (the parent-death signal, or its parent pid changing,
//!   checked twice a second), when it is told to, or when the leader
//!   exits, kills the group and every process reparented to it with
//!   SIGKILL, again and again until `/proc` shows none of them left (each
//!   round makes the next generation orphans, which come to the warden),
//!   reaps them, and exits with the leader's status (the same exit code, or
//!   the same signal).
//!
//! The parent-death signal fires when the *thread* that forked the child
//! exits, not the process; tokio's blocking-pool threads exit after 10 s
//! idle, so a warden forked from one would be killed mid-run. Every warden
//! is therefore spawned by one dedicated thread, started on first use and
//! never ending before the process does (it parks forever if its channel
//! ever closes, and a panic while spawning is caught and returned as an
//! error): `spawn` sends it the command over a channel and gets back the
//! warden's handles and a pidfd. `mass` then talks to the warden only
//! through that pidfd (`waitid(P_PIDFD)`, `pidfd_send_signal`), so a
//! reused pid is never signalled or waited for; the warden, in turn, holds
//! its leader unreaped until the end, so the group id it kills cannot be
//! reused meanwhile.
//!
//! A PID namespace (whose processes the kernel kills when its init dies)
//! would also catch a killed warden, but needs `CAP_SYS_ADMIN` or
//! unprivileged user namespaces and shows the command pids of another
//! namespace; a cgroup's `cgroup.kill` needs a delegated cgroup. The warden
//! needs neither.
//!
//! # Limits
//!
//! - Linux 5.4 or later (pidfd_open, waitid on a pidfd) and a mounted
//!   `/proc` (without it, only the group and the leader are killed).
//! - A warden killed outright (SIGKILL by hand, the OOM killer) takes its
//!   leader with it (the leader's own parent-death signal) but not the
//!   grandchildren. A leader that executes a set-user-ID program loses
//!   that signal (a kernel rule); the warden still kills it.
//! - A process that leaves the tree altogether (handed to another service:
//!   `systemd-run`, `at`, a D-Bus activation, `ssh`) is not the warden's.
//!   One in uninterruptible sleep dies when it wakes; the warden waits 10 s
//!   for it, then names it on stderr and exits.
//! - SIGINT and SIGQUIT reach the warden through the terminal and are
//!   ignored; the command, in a group of its own, does not get them.
//!   `mass` decides, and if it dies of them its wardens kill their trees.
//! - Only the process that started the thread can use it: a forked copy of
//!   `mass` gets an error, not a child.

mod warden;

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

/// How long a stopped command has to end after SIGTERM before it is
/// killed, unless [`Command::grace`] says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// How long `mass` waits, past the grace period, for a warden to finish
/// its sweep before it kills the warden itself.
const SWEEP_MARGIN: Duration = Duration::from_secs(15);

/// The executable a warden is: this one.
const SELF_EXE: &str = "/proc/self/exe";

/// What `mass` sends its wardens (the parent-death signal, SIGTERM, and
/// SIGHUP mean "kill everything now" too).
const SIG_STOP: libc::c_int = libc::SIGUSR1;
const SIG_KILL: libc::c_int = libc::SIGUSR2;

/// Why a command could not be started, waited for or signalled.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("cannot start the supervisor thread: {0}")]
    Thread(String),
    #[error("the supervisor thread belongs to process {owner}, not to this one ({this}): a forked copy cannot start supervised commands")]
    Forked { owner: u32, this: u32 },
    #[error("the supervisor thread did not answer")]
    NoAnswer,
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot watch {program} (pid {pid}) through a pidfd (Linux 5.4 or later is needed): {source}")]
    Pidfd {
        program: String,
        pid: u32,
        source: std::io::Error,
    },
    #[error("cannot wait for {program} (pid {pid}): {source}")]
    Wait {
        program: String,
        pid: u32,
        source: std::io::Error,
    },
    #[error("cannot signal {program} (pid {pid}): {source}")]
    Signal {
        program: String,
        pid: u32,
        source: std::io::Error,
    },
}

/// A command to run supervised. Built like `std::process::Command`; the
/// environment, working directory and stdio set here are the command's
/// (the warden passes them on unchanged, and looks `program` up in that
/// environment's `PATH`).
#[derive(Debug)]
pub struct Command {
    /// The warden's command: this executable, its arguments added by `spawn`.
    inner: std::process::Command,
    program: OsString,
    args: Vec<OsString>,
    grace: Duration,
}

impl Command {
    pub fn new(program: impl AsRef<OsStr>) -> Command {
        let mut inner = std::process::Command::new(SELF_EXE);
        inner.arg0("mass-warden");
        Command {
            inner,
            program: program.as_ref().to_os_string(),
            args: Vec::new(),
            grace: DEFAULT_GRACE,
        }
    }

    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Command {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Command {
        self.inner.current_dir(dir);
        self
    }

    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Command {
        self.inner.env(key, value);
        self
    }

    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut Command {
        self.inner.env_remove(key);
        self
    }

    pub fn env_clear(&mut self) -> &mut Command {
        self.inner.env_clear();
        self
    }

    pub fn stdin(&mut self, io: impl Into<Stdio>) -> &mut Command {
        self.inner.stdin(io);
        self
    }

    pub fn stdout(&mut self, io: impl Into<Stdio>) -> &mut Command {
        self.inner.stdout(io);
        self
    }

    pub fn stderr(&mut self, io: impl Into<Stdio>) -> &mut Command {
        self.inner.stderr(io);
        self
    }

    /// How long [`Child::stop`] lets the command end after SIGTERM before
    /// its tree is killed (default [`DEFAULT_GRACE`]).
    pub fn grace(&mut self, grace: Duration) -> &mut Command {
        self.grace = grace;
        self
    }

    /// Starts the command under a warden spawned by the supervisor thread.
    pub fn spawn(mut self) -> Result<Child, SuperviseError> {
        // Keeps the warden's constructor in every binary that can spawn one.
        std::hint::black_box(&warden::WARDEN_HOOK);
        let program = self.program.to_string_lossy().into_owned();
        let supervisor = supervisor()?;
        let this = std::process::id();
        if supervisor.owner != this {
            return Err(SuperviseError::Forked {
                owner: supervisor.owner,
                this,
            });
        }
        self.inner
            .arg(warden::FLAG)
            .arg(this.to_string())
            .arg(self.grace.as_millis().to_string())
            .arg(&self.program)
            .args(&self.args);
        let (reply, answer) = mpsc::channel();
        let request = Request {
            cmd: self.inner,
            program: program.clone(),
            reply,
        };
        supervisor
            .requests
            .send(request)
            .map_err(|_| SuperviseError::NoAnswer)?;
        let (io, pidfd) = answer.recv().map_err(|_| SuperviseError::NoAnswer)??;
        Ok(Child {
            pid: io.id(),
            program,
            pidfd,
            io,
            status: None,
            grace: self.grace,
        })
    }
}

/// A request to the supervisor thread.
struct Request {
    cmd: std::process::Command,
    program: String,
    reply: mpsc::Sender<Result<(std::process::Child, OwnedFd), SuperviseError>>,
}

/// The supervisor thread's mailbox, and the process it belongs to.
struct Supervisor {
    requests: mpsc::Sender<Request>,
    owner: u32,
}

static SUPERVISOR: OnceLock<Result<Supervisor, String>> = OnceLock::new();

/// The supervisor thread, started on first use.
fn supervisor() -> Result<&'static Supervisor, SuperviseError> {
    SUPERVISOR
        .get_or_init(|| {
            let (requests, rx) = mpsc::channel();
            std::thread::Builder::new()
                .name("mass-supervise".into())
                .spawn(move || serve_requests(rx))
                .map(|_| Supervisor {
                    requests,
                    owner: std::process::id(),
                })
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| SuperviseError::Thread(e.clone()))
}

/// The supervisor thread's body. It never returns: the wardens' parent-death
/// signal is tied to this thread.
fn serve_requests(rx: mpsc::Receiver<Request>) {
    while let Ok(Request {
        cmd,
        program,
        reply,
    }) = rx.recv()
    {
        let started = std::panic::catch_unwind(AssertUnwindSafe(|| start(cmd, &program)))
            .unwrap_or_else(|_| {
                Err(SuperviseError::Spawn {
                    program,
                    source: std::io::Error::other("the spawn panicked"),
                })
            });
        let _ = reply.send(started);
    }
    // The sender lives in a static, so this is never reached; if it were,
    // ending the thread would kill every warden.
    loop {
        std::thread::park();
    }
}

/// Spawns a warden and opens its pidfd (its pid cannot be reused before
/// that: it is an unreaped child of this process).
fn start(
    mut cmd: std::process::Command,
    program: &str,
) -> Result<(std::process::Child, OwnedFd), SuperviseError> {
    let mut child = cmd.spawn().map_err(|source| SuperviseError::Spawn {
        program: program.to_string(),
        source,
    })?;
    match pidfd_open(child.id()) {
        Ok(fd) => Ok((child, fd)),
        Err(source) => {
            // The leader dies with the warden (its parent-death signal).
            let _ = child.kill();
            let _ = child.wait();
            Err(SuperviseError::Pidfd {
                program: program.to_string(),
                pid: child.id(),
                source,
            })
        }
    }
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// A supervised command (its warden). Dropping it stops the command as
/// [`Child::stop`] does, and returns once its whole tree is gone.
#[derive(Debug)]
pub struct Child {
    pid: u32,
    program: String,
    pidfd: OwnedFd,
    /// The warden's stdio handles. Never waited on: only the pidfd is.
    io: std::process::Child,
    status: Option<ExitStatus>,
    grace: Duration,
}

impl Child {
    /// The warden's pid (the command runs as its child).
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// The warden's pidfd: readable once it has exited (for `poll` or
    /// `tokio::io::unix::AsyncFd`); then [`Child::try_wait`] collects it.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// The command's stdin, stdout and stderr when they were piped.
    pub fn take_stdin(&mut self) -> Option<std::process::ChildStdin> {
        self.io.stdin.take()
    }

    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.io.stdout.take()
    }

    pub fn take_stderr(&mut self) -> Option<std::process::ChildStderr> {
        self.io.stderr.take()
    }

    /// The command's status if it has ended (its tree is gone then):
    /// its exit code, or the signal that killed it.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, SuperviseError> {
        self.collect(libc::WNOHANG)
    }

    /// Waits for the command to end on its own.
    pub fn wait(&mut self) -> Result<ExitStatus, SuperviseError> {
        loop {
            if let Some(status) = self.collect(0)? {
                return Ok(status);
            }
        }
    }

    /// Waits up to `limit` for the command to end on its own.
    pub fn wait_timeout(&mut self, limit: Duration) -> Result<Option<ExitStatus>, SuperviseError> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(Some(status));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut fds = [libc::pollfd {
                fd: self.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            let ms = left.as_millis().clamp(1, 1000) as libc::c_int;
            // SAFETY: one valid pollfd; an error (EINTR) just loops.
            unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
        }
    }

    /// Asks the command to end: SIGTERM to its group, and after the grace
    /// period SIGKILL to its whole tree. Returns at once; see [`Child::stop`].
    pub fn request_stop(&mut self) -> Result<(), SuperviseError> {
        self.signal(SIG_STOP)
    }

    /// Stops the command ([`Child::request_stop`]) and waits until its tree
    /// is gone. Should the warden not finish in time, it is killed itself
    /// (its leader dies with it).
    pub fn stop(&mut self) -> Result<ExitStatus, SuperviseError> {
        self.request_stop()?;
        self.finish(self.grace + SWEEP_MARGIN)
    }

    /// Kills the command's whole tree with SIGKILL, no grace, and waits
    /// until it is gone.
    pub fn kill(&mut self) -> Result<ExitStatus, SuperviseError> {
        self.signal(SIG_KILL)?;
        self.finish(SWEEP_MARGIN)
    }

    fn finish(&mut self, limit: Duration) -> Result<ExitStatus, SuperviseError> {
        if let Some(status) = self.wait_timeout(limit)? {
            return Ok(status);
        }
        self.signal(libc::SIGKILL)?;
        self.wait()
    }

    /// Sends `sig` to the warden through its pidfd (a no-op once it has
    /// been collected).
    fn signal(&mut self, sig: libc::c_int) -> Result<(), SuperviseError> {
        if self.status.is_some() {
            return Ok(());
        }
        let fd = self.pidfd.as_raw_fd();
        // SAFETY: pidfd_send_signal with our own pidfd and no siginfo.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        let err = std::io::Error::last_os_error();
        if r == 0 || err.raw_os_error() == Some(libc::ESRCH) {
            return Ok(());
        }
        Err(SuperviseError::Signal {
            program: self.program.clone(),
            pid: self.pid,
            source: err,
        })
    }

    /// `waitid(P_PIDFD)` with `flags` added to WEXITED.
    fn collect(&mut self, flags: libc::c_int) -> Result<Option<ExitStatus>, SuperviseError> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        // SAFETY: siginfo_t is plain data; zeroed means "nothing collected".
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: waitid on our own pidfd, writing into `info`.
            let r = unsafe {
                libc::waitid(
                    libc::P_PIDFD,
                    self.pidfd.as_raw_fd() as libc::id_t,
                    &mut info,
                    libc::WEXITED | flags,
                )
            };
            if r == 0 {
                break;
            }
            let source = std::io::Error::last_os_error();
            if source.kind() != std::io::ErrorKind::Interrupted {
                return Err(SuperviseError::Wait {
                    program: self.program.clone(),
                    pid: self.pid,
                    source,
                });
            }
        }
        // SAFETY: waitid filled `info` for a child state change, or left it zeroed.
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(None);
        }
        let raw = match info.si_code {
            libc::CLD_EXITED => (status & 0xff) << 8,
            libc::CLD_DUMPED => status | 0x80,
            _ => status,
        };
        let status = ExitStatus::from_raw(raw);
        self.status = Some(status);
        Ok(Some(status))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.stop();
        }
    }
}
