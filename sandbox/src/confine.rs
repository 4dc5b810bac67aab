//! The confinement itself: `command` (in the caller) builds the launcher's
//! command line; `confine_self` (in the launcher, see `launch`) applies
//! every layer to the launcher process, which then execs the command. The
//! launcher is a fresh, single-threaded process, so its steps may allocate
//! (Landlock rules, seccomp BPF); forks inside it (`become_pid1`) copy a
//! small process, not the caller.
//!
//! Order inside the launcher for `Level::Full` (as bubblewrap and Codex do it):
//! 1. drop root to uid/gid 65534 (so RLIMIT_NPROC applies and the command is not root);
//! 2. unshare user/mount/PID/net/IPC/UTS namespaces and write the id maps;
//! 3. fork into the new PID namespace: the first child stays as a relay that
//!    waits and mirrors the command's exit; PID 1 gets PDEATHSIG(SIGKILL) so
//!    killing the relay kills the whole namespace, and stays a minimal init
//!    (reaps, reports the command's status) while the command runs as PID 2
//!    with ordinary signal semantics;
//! 4. private mounts, a fresh /proc and a private /dev/shm;
//! 5. rlimits;
//! 6. no_new_privs, then Landlock; after the mounts, since a Landlock
//!    domain cannot mount;
//! 7. inherited fds marked close-on-exec;
//! 8. seccomp last, because it denies mount/unshare and needs no_new_privs.
//!
//! The launcher dies with the thread of the process that started it
//! (PDEATHSIG(SIGKILL), armed first and again after each credential change,
//! and checked against the parent it was started by): a `mass` killed
//! outright takes every confined command with it, the relay and with it the
//! namespace at `Level::Full`, the command itself below it.
//!
//! `Policy::unprotected` (tests only) leaves single steps out; each
//! `Layer` names the step it skips, and nothing else changes.

use crate::error::SandboxError;
use crate::launch;
use crate::policy::{Layer, Level, Limits, Policy};
use crate::probe::probe;
use crate::rules;
use crate::sys::{self, cvt, note, SANDBOX_ID};
use landlock::{RulesetCreated, RulesetCreatedAttr, RulesetStatus};
use seccompiler::BpfProgram;
use serde::{Deserialize, Serialize};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;

pub(crate) type RlimitTable = [(libc::__rlimit_resource_t, libc::rlim_t); 6];

pub(crate) fn rlimit_table(l: &Limits) -> RlimitTable {
    const MIB: u64 = 1024 * 1024;
    [
        (libc::RLIMIT_CPU, l.cpu_secs as libc::rlim_t),
        (
            libc::RLIMIT_AS,
            l.address_space_mb.saturating_mul(MIB) as libc::rlim_t,
        ),
        (libc::RLIMIT_NPROC, l.processes as libc::rlim_t),
        (
            libc::RLIMIT_FSIZE,
            l.file_size_mb.saturating_mul(MIB) as libc::rlim_t,
        ),
        (libc::RLIMIT_NOFILE, l.open_files as libc::rlim_t),
        (libc::RLIMIT_CORE, 0),
    ]
}

/// Lowers the process's priority to `nice` (inherited by every child). A
/// process may always lower its own priority.
pub(crate) fn set_nice(nice: u8) -> io::Result<()> {
    // SAFETY: plain syscall.
    cvt(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, libc::c_int::from(nice.min(19))) })
        .map(|_| ())
        .inspect_err(|_| note(b"sandbox: setpriority failed\n"))
}

pub(crate) fn set_rlimits(table: &RlimitTable) -> io::Result<()> {
    for &(res, v) in table {
        // soft = hard: the command cannot raise them back.
        let lim = libc::rlimit {
            rlim_cur: v,
            rlim_max: v,
        };
        // SAFETY: valid pointer to a local rlimit.
        if let Err(e) = cvt(unsafe { libc::setrlimit(res, &lim) }) {
            note(b"sandbox: setrlimit failed\n");
            return Err(e);
        }
    }
    Ok(())
}

/// Enforces the Landlock ruleset (none when the test switch left out every
/// part of it). With `nnp` false (test switch) Landlock does not set
/// no_new_privs itself and relies on the launcher's CAP_SYS_ADMIN.
fn restrict(rs: Option<RulesetCreated>, nnp: bool) -> io::Result<()> {
    let Some(rs) = rs else {
        return Ok(());
    };
    match rs.no_new_privs(nnp).restrict_self() {
        Ok(st) if st.ruleset == RulesetStatus::FullyEnforced => Ok(()),
        Ok(_) => {
            note(b"sandbox: Landlock not fully enforced\n");
            Err(io::Error::from_raw_os_error(libc::EPERM))
        }
        Err(_) => {
            note(b"sandbox: landlock_restrict_self failed\n");
            Err(io::Error::from_raw_os_error(libc::EPERM))
        }
    }
}

/// Sets no_new_privs: no exec (a setuid or file-capability binary) can
/// give the command more privilege than it has.
fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: plain prctl.
    cvt(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })
        .map(|_| ())
        .inspect_err(|_| note(b"sandbox: setting no_new_privs failed\n"))
}

/// Installs the seccomp programs in order. `nnp` false (test switch):
/// through the raw syscall, which then needs CAP_SYS_ADMIN instead of
/// no_new_privs (seccompiler would set no_new_privs itself).
fn apply_seccomp(progs: &[BpfProgram], nnp: bool) -> io::Result<()> {
    for p in progs {
        let ok = if nnp {
            seccompiler::apply_filter(p).is_ok()
        } else {
            #[repr(C)]
            struct Fprog {
                len: libc::c_ushort,
                filter: *const seccompiler::sock_filter,
            }
            let prog = Fprog {
                len: p.len() as libc::c_ushort,
                filter: p.as_ptr(),
            };
            // SAFETY: a valid sock_fprog pointing at `p`, which outlives the call.
            unsafe {
                libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0 as libc::c_uint,
                    &prog as *const Fprog,
                ) == 0
            }
        };
        if !ok {
            note(b"sandbox: installing the seccomp filter failed\n");
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
    }
    Ok(())
}

fn drop_root_step(drop: bool, parent: u32) -> io::Result<()> {
    if drop {
        give_std_pipes();
        sys::drop_root().inspect_err(|_| note(b"sandbox: dropping root to uid 65534 failed\n"))?;
        // Changing credentials cleared the parent-death signal: arm it again.
        die_with_parent(parent);
    }
    Ok(())
}

/// Ties this process to the thread of `parent` that started it: SIGKILL
/// when that thread (and so `mass`, however it died) goes. A parent that
/// is already gone (this process was reparented before the signal was
/// armed) ends it at once. The signal survives `execve`; credential
/// changes clear it, so it is armed again after each (`drop_root_step`,
/// the relay after the namespaces).
pub(crate) fn die_with_parent(parent: u32) {
    // SAFETY: plain prctl/getppid; _exit is always safe.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if parent != 0 && libc::getppid() as u32 != parent {
            libc::_exit(137);
        }
    }
}

/// A command that runs `program` confined as `policy` says. The caller adds
/// arguments, env, stdio, cwd and `process_group`, spawns it, and keeps the
/// timeout and killing the group.
///
/// The command is the sandbox launcher: this executable again
/// (`/proc/self/exe`, see `launch`), which confines itself and then
/// `execvp`s `program` with the caller's arguments and environment. No
/// closure runs between fork and exec in the caller, so std spawns it with
/// `posix_spawn` (a vfork): the caller's page tables are not copied and its
/// threads take no copy-on-write faults afterwards. Forking a large,
/// multi-threaded harness for every command cost more CPU than everything
/// else an agent turn does (see `benches/orchestration.rs`).
///
/// Fails here, in the caller, if a layer the level needs is missing or a
/// path is relative. A step that fails later, in the launcher, is named on
/// the command's stderr and the command exits with status 126.
pub fn command(program: impl AsRef<OsStr>, policy: &Policy) -> Result<Command, SandboxError> {
    let avail = check(policy)?;
    // Keeps the launcher's constructor in every binary that spawns one.
    std::hint::black_box(&launch::LAUNCH_HOOK);
    let spec = LaunchSpec {
        policy: policy.clone(),
        landlock_abi: avail.landlock_abi.unwrap_or(0),
        drop_root: avail.root,
        parent: std::process::id(),
    };
    let spec = serde_json::to_string(&spec).map_err(|e| SandboxError::Launch(e.to_string()))?;
    let mut cmd = Command::new(LAUNCHER);
    cmd.arg(launch::FLAG).arg(spec).arg(program);
    Ok(cmd)
}

/// What `command` (and `Spawn`) check in the caller before anything runs:
/// the platform, absolute paths, the combinations the levels allow, the
/// places, that this machine offers the level and (above `Level::None`)
/// that every policy path exists. Returns the probe's findings.
pub(crate) fn check(policy: &Policy) -> Result<crate::probe::Availability, SandboxError> {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        // The launcher's constructor needs glibc's (argc, argv, envp).
        return Err(SandboxError::Launch(
            "the sandbox launcher needs Linux with glibc".into(),
        ));
    }
    for p in policy.writable.iter().chain(&policy.readable) {
        if !p.is_absolute() {
            return Err(SandboxError::RelativePath(p.clone()));
        }
    }
    if !policy.forward.is_empty() && (policy.level != Level::Full || policy.network) {
        return Err(SandboxError::Launch(
            "loopback endpoints (forward) need Level::Full and no network".into(),
        ));
    }
    if !policy.forward.is_empty()
        && policy.off(Layer::PidNamespace)
        && !policy.off(Layer::NetNamespace)
    {
        // Test switch: without the PID namespace nothing would end the relay.
        return Err(SandboxError::Launch(
            "loopback endpoints (forward) need the PID namespace".into(),
        ));
    }
    for h in &policy.hide {
        let system = ["/usr", "/bin", "/lib", "/lib64", "/etc", "/proc", "/dev"];
        if !h.is_absolute() || system.iter().any(|s| Path::new(s).starts_with(h)) {
            return Err(SandboxError::PathUnusable {
                role: "hidden",
                path: h.clone(),
                reason: "hiding it would hide the system files every command needs".into(),
            });
        }
    }
    check_places(policy)?;
    let avail = probe();
    avail.check(policy.level)?;
    if policy.level != Level::None {
        // The launcher opens these for the Landlock rules; name a missing
        // one here, to the caller, rather than as a failed command.
        check_paths(policy)?;
    }
    Ok(avail)
}

/// Each place names a policy path and a distinct `at` strictly below a
/// hidden directory, neither inside another place's `at`: the view can then
/// make every mount point in a tmpfs of its own, and no place covers another.
fn check_places(policy: &Policy) -> Result<(), SandboxError> {
    for (i, pl) in policy.places.iter().enumerate() {
        let bad = |reason: &str| SandboxError::PathUnusable {
            role: "placed",
            path: pl.path.clone(),
            reason: format!("{reason} (at {})", pl.at.display()),
        };
        if !pl.path.is_absolute() || !pl.at.is_absolute() {
            return Err(bad("a place needs absolute paths"));
        }
        if !policy.writable.contains(&pl.path) && !policy.readable.contains(&pl.path) {
            return Err(bad(
                "a placed path must be a writable or readable path of the policy",
            ));
        }
        if !policy
            .hide
            .iter()
            .any(|h| pl.at.starts_with(h) && pl.at != *h)
        {
            return Err(bad("a place must lie below a hidden directory"));
        }
        let clash = policy.places.iter().enumerate().any(|(j, o)| {
            j != i && (pl.at.starts_with(&o.at) || o.at.starts_with(&pl.at) || pl.path == o.path)
        });
        if clash {
            return Err(bad("two places overlap"));
        }
    }
    Ok(())
}

fn check_paths(policy: &Policy) -> Result<(), SandboxError> {
    let roles = policy.writable.iter().map(|p| ("writable", p));
    for (role, path) in roles.chain(policy.readable.iter().map(|p| ("readable", p))) {
        if let Err(e) = std::fs::metadata(path) {
            return Err(SandboxError::PathUnusable {
                role,
                path: path.clone(),
                reason: e.to_string(),
            });
        }
    }
    Ok(())
}

/// The launcher's executable: always the running binary, even if its file
/// was replaced or deleted since it started.
const LAUNCHER: &str = "/proc/self/exe";

/// What the launcher needs besides the policy: the caller's probe results
/// (probing again per command would fork a test child each time).
#[derive(Serialize, Deserialize)]
pub(crate) struct LaunchSpec {
    pub(crate) policy: Policy,
    pub(crate) landlock_abi: i32,
    pub(crate) drop_root: bool,
    /// The process that starts the launcher, which dies with it.
    pub(crate) parent: u32,
}

/// What `confine_self` reads off the spec before its first step: the
/// values the steps apply and which steps the test switch leaves out.
/// Plain values on the stack; reading them makes no syscall.
struct Steps<'a> {
    policy: &'a Policy,
    /// The process that started the launcher (`die_with_parent`).
    parent: u32,
    limits: RlimitTable,
    abi: i32,
    /// Drop root to uid/gid 65534 (the caller probed that it runs as root).
    drop: bool,
    /// Set no_new_privs (left out only by the test switch).
    nnp: bool,
    /// Apply the rlimits (left out only by the test switch).
    rlimits: bool,
}

impl<'a> Steps<'a> {
    /// Reads `spec`: the rlimit table, the Landlock ABI and the switches.
    fn of(spec: &'a LaunchSpec) -> Steps<'a> {
        let policy = &spec.policy;
        let off = |l: Layer| policy.off(l);
        Steps {
            policy,
            parent: spec.parent,
            limits: rlimit_table(&policy.limits),
            abi: spec.landlock_abi,
            drop: spec.drop_root && !off(Layer::DropRoot),
            nnp: !off(Layer::NoNewPrivs),
            rlimits: !off(Layer::Rlimits),
        }
    }

    /// Whether the test switch left layer `l` out.
    fn off(&self, l: Layer) -> bool {
        self.policy.off(l)
    }

    /// The rlimits (unless left out), then the priority: every level sets
    /// both, after dropping root where it drops it.
    fn limit(&self) -> io::Result<()> {
        if self.rlimits {
            set_rlimits(&self.limits)?;
        }
        set_nice(self.policy.limits.nice)
    }

    /// RLIMIT_CORE 0 (unless the rlimits are left out) and the OOM killer's
    /// preference, both before root is dropped.
    fn early_limits(&self) {
        if self.rlimits {
            set_core_zero();
        }
        prefer_for_oom();
    }

    /// Marks inherited fds close-on-exec, unless left out.
    fn cloexec(&self) {
        if !self.off(Layer::Cloexec) {
            cloexec_inherited_fds();
        }
    }

    /// Builds the Landlock ruleset (`with_proc` as `rules::landlock_ruleset`
    /// takes it), then the seccomp programs; a failure is named on stderr.
    /// Called while still root: the rules open every allowed path.
    fn build_rules(
        &self,
        with_proc: bool,
    ) -> io::Result<(Option<RulesetCreated>, Vec<BpfProgram>)> {
        let ruleset = rules::landlock_ruleset(self.policy, self.abi, with_proc)
            .map_err(failed(b"sandbox: building the Landlock ruleset failed\n"))?;
        let progs = rules::seccomp_programs(self.policy)
            .map_err(failed(b"sandbox: building the seccomp filter failed\n"))?;
        Ok((ruleset, progs))
    }
}

/// A failure to build the rules, as the launcher's error, after naming
/// `what` on stderr.
fn failed(what: &'static [u8]) -> impl Fn(SandboxError) -> io::Error {
    move |e: SandboxError| {
        note(what);
        io::Error::other(e.to_string())
    }
}

/// What a command started under the test switch says first on its stderr
/// (the layers left out), or `None` when no layer is.
pub(crate) fn switch_note(policy: &Policy) -> Option<String> {
    (!policy.unprotected.is_empty()).then(|| {
        format!(
            "sandbox: TEST SWITCH: layers left out: {:?}\n",
            policy.unprotected
        )
    })
}

/// In the launcher: applies every layer of `spec` to this process, in the
/// order of the module docs. Returns in the process that is to exec the
/// command (under `Level::Full`, PID 2 of the new PID namespace; the relay
/// and the namespace's init never return).
pub(crate) fn confine_self(spec: &LaunchSpec) -> io::Result<()> {
    die_with_parent(spec.parent);
    let policy = &spec.policy;
    let s = Steps::of(spec);
    if let Some(n) = switch_note(policy) {
        note(n.as_bytes());
    }
    match policy.level {
        Level::None => s.limit(),
        Level::Landlock => confine_landlock(&s),
        Level::Full => confine_full(&s),
    }
}

/// `Level::Landlock`: the rules built as root, then root dropped, limits,
/// no_new_privs, Landlock, close-on-exec, and seccomp last.
fn confine_landlock(s: &Steps) -> io::Result<()> {
    let (ruleset, progs) = s.build_rules(true)?;
    s.early_limits();
    if !s.nnp {
        return confine_landlock_as_root(s, ruleset, &progs);
    }
    drop_root_step(s.drop, s.parent)?;
    s.limit()?;
    set_no_new_privs()?;
    restrict(ruleset, true)?;
    s.cloexec();
    apply_seccomp(&progs, true)
}

/// `Level::Landlock` with no_new_privs left out (test switch): without
/// no_new_privs only root may install Landlock and seccomp, so both come
/// before root is dropped.
fn confine_landlock_as_root(
    s: &Steps,
    ruleset: Option<RulesetCreated>,
    progs: &[BpfProgram],
) -> io::Result<()> {
    restrict(ruleset, false)?;
    apply_seccomp(progs, false)?;
    drop_root_step(s.drop, s.parent)?;
    s.limit()?;
    s.cloexec();
    Ok(())
}

/// `Level::Full`, steps 1 to 4 of the module docs: everything that needs
/// root is prepared, root is dropped, the namespaces are entered (the
/// process becomes the relay, then the command under the namespace's init)
/// and the mounts made; `lock_in` does the rest.
fn confine_full(s: &Steps) -> io::Result<()> {
    let (ruleset, progs) = s.build_rules(false)?;
    let (uid_map, gid_map) = id_maps(s.drop);
    // Opened while still root: a hidden directory may be closed to
    // everyone else.
    let view = if s.off(Layer::View) {
        None
    } else {
        crate::view::View::plan(s.policy)
            .inspect_err(|_| note(b"sandbox: opening the paths to bind back failed\n"))?
    };
    let ns = Namespaces::plan(s);
    s.early_limits();
    drop_root_step(s.drop, s.parent)?;
    enter_namespaces(ns.flags, &uid_map, &gid_map)?;
    // The new user namespace may have cleared the parent-death
    // signal; this process becomes the relay, which keeps it.
    die_with_parent(s.parent);
    if ns.pid {
        become_pid1()?;
    }
    mount_proc(ns.pid)?;
    if let Some(v) = &view {
        v.apply()?;
    }
    if ns.net {
        start_forward(s.policy)?;
    }
    let shm = mount_shm(ns.shm)?;
    lock_in(s, ruleset, &progs, shm)
}

/// The user namespace's id maps: an identity map of the (possibly dropped)
/// uid and gid. The command is not root inside the namespace either, so it
/// loses the namespace's capabilities at exec instead of holding
/// CAP_SYS_ADMIN there.
fn id_maps(drop: bool) -> (Vec<u8>, Vec<u8>) {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = if drop {
        (SANDBOX_ID, SANDBOX_ID)
    } else {
        unsafe { (libc::getuid(), libc::getgid()) }
    };
    let uid_map = format!("{uid} {uid} 1\n").into_bytes();
    let gid_map = format!("{gid} {gid} 1\n").into_bytes();
    (uid_map, gid_map)
}

/// The namespaces `Level::Full` enters and whether it mounts a private
/// /dev/shm.
struct Namespaces {
    /// The `unshare` flags.
    flags: libc::c_int,
    pid: bool,
    net: bool,
    shm: bool,
}

impl Namespaces {
    /// Everything the test switch leaves in; a private /dev/shm where the
    /// host has one; a network namespace unless the policy allows network.
    fn plan(s: &Steps) -> Namespaces {
        let shm = std::path::Path::new("/dev/shm").is_dir() && !s.off(Layer::PrivateShm);
        let pid = !s.off(Layer::PidNamespace);
        let net = !s.policy.network && !s.off(Layer::NetNamespace);
        let mut flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWUTS;
        if pid {
            flags |= libc::CLONE_NEWPID;
        }
        if !s.off(Layer::IpcNamespace) {
            flags |= libc::CLONE_NEWIPC;
        }
        if net {
            flags |= libc::CLONE_NEWNET;
        }
        Namespaces {
            flags,
            pid,
            net,
            shm,
        }
    }
}

/// Starts the loopback endpoints' forwarders, with the sockets as the
/// command's namespace names them.
fn start_forward(policy: &Policy) -> io::Result<()> {
    let forward: Vec<_> = policy
        .forward
        .iter()
        .map(|f| crate::policy::Forward {
            port: f.port,
            socket: policy.seen(&f.socket),
        })
        .collect();
    crate::forward::start(&forward)
}

/// `Level::Full`, steps 5 to 8 of the module docs, inside the namespaces:
/// rlimits and priority, no_new_privs, Landlock (with the fresh /proc and
/// /dev/shm, new inodes the rules built as root cannot name),
/// close-on-exec, and seccomp last.
fn lock_in(
    s: &Steps,
    ruleset: Option<RulesetCreated>,
    progs: &[BpfProgram],
    shm: bool,
) -> io::Result<()> {
    s.limit()?;
    if s.nnp {
        set_no_new_privs()?;
    }
    let rs = match ruleset {
        Some(rs) if !s.off(Layer::LandlockFs) => Some(add_mounted(rs, s.abi, shm)?),
        rs => rs,
    };
    restrict(rs, s.nnp)?;
    s.cloexec();
    apply_seccomp(progs, s.nnp)
}

/// The caller's stdio pipes were created by root with mode 0600, so after
/// dropping root the command could use fds 0-2 but not reopen them
/// (`echo x > /dev/stderr` fails with EACCES). Anonymous pipes (pipefs)
/// are handed to the sandbox uid; files and named FIFOs are left alone.
fn give_std_pipes() {
    const PIPEFS_MAGIC: libc::c_long = 0x5049_5045;
    for fd in 0..=2 {
        // SAFETY: fstat/fstatfs/fchown on fds 0-2 with valid out-pointers;
        // failures only mean the fd stays as it was.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            let mut fs: libc::statfs = std::mem::zeroed();
            if libc::fstat(fd, &mut st) == 0
                && st.st_mode & libc::S_IFMT == libc::S_IFIFO
                && st.st_uid != SANDBOX_ID
                && libc::fstatfs(fd, &mut fs) == 0
                && fs.f_type as libc::c_long == PIPEFS_MAGIC
            {
                libc::fchown(fd, SANDBOX_ID, SANDBOX_ID);
            }
        }
    }
}

/// Without cgroups nothing caps the sandbox's total memory (RLIMIT_AS is
/// per process), so make its processes the OOM killer's first choice rather
/// than the harness. Raising the score needs no privilege; best effort.
fn prefer_for_oom() {
    let _ = sys::write_file(c"/proc/self/oom_score_adj", b"1000");
}

fn set_core_zero() {
    let lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer; lowering RLIMIT_CORE cannot fail for valid args.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &lim) };
}

fn enter_namespaces(flags: libc::c_int, uid_map: &[u8], gid_map: &[u8]) -> io::Result<()> {
    // SAFETY: plain syscall.
    cvt(unsafe { libc::unshare(flags) }).inspect_err(|_| note(b"sandbox: unshare failed\n"))?;
    // setgroups must be denied before an unprivileged gid_map write.
    sys::write_file(c"/proc/self/setgroups", b"deny")
        .and_then(|_| sys::write_file(c"/proc/self/uid_map", uid_map))
        .and_then(|_| sys::write_file(c"/proc/self/gid_map", gid_map))
        .inspect_err(|_| note(b"sandbox: writing the user namespace id maps failed\n"))
}

/// Forks into the new PID namespace. Returns in the command's process only:
/// the first child becomes a relay that waits for the namespace's PID 1 and
/// exits the way the command did; PID 1 is a minimal init that reaps orphans
/// and reports the command's wait status to the relay; the command runs as
/// PID 2, so it keeps ordinary signal semantics (a PID 1 ignores signals it
/// has no handler for: `kill $$`, `alarm`, `abort` would misbehave).
fn become_pid1() -> io::Result<()> {
    // The command's raw wait status, from init to the relay.
    let mut st = [0 as libc::c_int; 2];
    // SAFETY: valid out-array.
    cvt(unsafe { libc::pipe2(st.as_mut_ptr(), libc::O_CLOEXEC) })?;
    let [st_r, st_w] = st;
    let mut fds = [0 as libc::c_int; 2];
    // The pipe lets the grandchild detect that the relay already died before
    // PDEATHSIG was armed (getppid() is 0 across a PID namespace boundary).
    // SAFETY: valid out-array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    let [r, w] = fds;
    // A harness that ignores SIGCHLD would make the kernel reap the
    // command itself and leave the relay's waitpid with ECHILD.
    // SAFETY: resetting a disposition in the single-threaded child.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    // SAFETY: fork in a single-threaded child; both branches only make syscalls.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        note(b"sandbox: fork into the PID namespace failed\n");
        return Err(io::Error::last_os_error());
    }
    if pid > 0 {
        // Relay. Close everything (the caller's stdout/stderr pipes, and
        // std's exec-status pipe when the caller forked) so the caller's
        // output EOF does not wait for us.
        let mut keep = [w, st_r];
        keep.sort_unstable();
        sys::close_all_except(&keep);
        // The relay runs as uid 65534: keep other processes of that uid
        // from reading its memory via ptrace or /proc/PID/mem (drop_root
        // made it dumpable for the uid_map write).
        // SAFETY: plain prctl.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
        let init = match sys::wait_pid(pid) {
            Ok(status) => status,
            // SAFETY: _exit is always safe.
            Err(_) => unsafe { libc::_exit(127) },
        };
        // The command's status if init reported it; init's own otherwise
        // (killed before the command ended, e.g. on timeout).
        let mut buf = [0u8; 4];
        // SAFETY: reading into a local buffer; init wrote before exiting.
        let n = unsafe { libc::read(st_r, buf.as_mut_ptr().cast(), 4) };
        let status = if n == 4 {
            libc::c_int::from_ne_bytes(buf)
        } else {
            init
        };
        sys::exit_like(status);
    }
    // Grandchild: PID 1 of the namespace.
    // SAFETY: plain syscalls on our own fds.
    unsafe {
        libc::close(w);
        cvt(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
        let mut pfd = libc::pollfd {
            fd: r,
            events: libc::POLLIN,
            revents: 0,
        };
        let n = libc::poll(&mut pfd, 1, 0);
        libc::close(r);
        if n != 0 {
            // EOF (or error): the relay is gone, nobody would kill us on timeout.
            libc::_exit(1);
        }
        libc::close(st_r);
    }
    run_init(st_w)
}

/// In PID 1: forks the command's process (PID 2) and returns in it; PID 1
/// itself closes every other fd (the caller's output pipes and the spawn
/// status pipe must see only the command), reaps every child, and when PID 2
/// ends writes its wait status to `st_w` and exits, which tears the
/// namespace down with everything left in it.
fn run_init(st_w: libc::c_int) -> io::Result<()> {
    // SAFETY: fork in a single-threaded process; the init branch only makes syscalls.
    let cmd = unsafe { libc::fork() };
    if cmd < 0 {
        note(b"sandbox: fork of the command under the namespace's init failed\n");
        return Err(io::Error::last_os_error());
    }
    if cmd == 0 {
        // SAFETY: closing our copy of the status pipe.
        unsafe { libc::close(st_w) };
        return Ok(());
    }
    sys::close_all_except(&[st_w]);
    // SAFETY: plain syscalls; every path ends in _exit.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        loop {
            let mut status: libc::c_int = 0;
            let r = libc::waitpid(-1, &mut status, 0);
            if r == cmd {
                let b = status.to_ne_bytes();
                libc::write(st_w, b.as_ptr().cast(), 4);
                libc::_exit(0);
            }
            if r < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
    }
}

/// Makes every mount private and, with a PID namespace, mounts a fresh
/// /proc (the caller's PID namespace's proc cannot be mounted from a user
/// namespace: without one the command keeps the host's /proc).
fn mount_proc(pid_ns: bool) -> io::Result<()> {
    // SAFETY: static C strings, null data pointers as documented for these flags.
    unsafe {
        cvt(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))
        .inspect_err(|_| note(b"sandbox: making mounts private failed\n"))?;
        if !pid_ns {
            return Ok(());
        }
        cvt(libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ))
        .inspect_err(|_| note(b"sandbox: mounting a fresh /proc failed\n"))?;
    }
    Ok(())
}

/// A private tmpfs on /dev/shm (POSIX semaphores and shared memory, e.g.
/// python's multiprocessing), so commands neither share it with the host
/// nor with each other. Returns whether it was mounted.
fn mount_shm(have_shm: bool) -> io::Result<bool> {
    if !have_shm {
        return Ok(false);
    }
    // SAFETY: static C strings.
    cvt(unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            c"/dev/shm".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            c"mode=1777,size=64m".as_ptr().cast(),
        )
    })
    .inspect_err(|_| note(b"sandbox: mounting a private /dev/shm failed\n"))?;
    Ok(true)
}

/// Opens a directory mounted in the child as O_PATH, for a Landlock rule.
fn open_path(path: &std::ffi::CStr) -> io::Result<OwnedFd> {
    // SAFETY: valid C string; the fd is wrapped in an OwnedFd immediately.
    let fd = cvt(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC | libc::O_DIRECTORY,
        )
    })?;
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds the fresh /proc (read) and private /dev/shm (read-write): their
/// roots are new inodes, so rules built in the parent cannot name them.
fn add_mounted(rs: RulesetCreated, abi: i32, shm: bool) -> io::Result<RulesetCreated> {
    let failed = |_| {
        note(b"sandbox: adding mounted directories to the Landlock ruleset failed\n");
        io::Error::from_raw_os_error(libc::EINVAL)
    };
    let mut rs = rules::add_mounted_dir(rs, open_path(c"/proc")?, abi, false).map_err(failed)?;
    if shm {
        rs = rules::add_mounted_dir(rs, open_path(c"/dev/shm")?, abi, true).map_err(failed)?;
    }
    Ok(rs)
}

/// Marks every fd above stderr close-on-exec: fds the harness leaked
/// without O_CLOEXEC would otherwise reach the command, and an fd opened
/// before Landlock is not checked by it. Only stdin/stdout/stderr pass.
fn cloexec_inherited_fds() {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags; on old
    // kernels it fails harmlessly (std's own fds are CLOEXEC anyway).
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
        );
    }
}
