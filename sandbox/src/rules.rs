//! Builds, in the parent, everything the child will only have to switch on:
//! the Landlock ruleset (file system, TCP, scopes) with every PathFd already
//! opened and added, and the seccomp BPF programs. Doing this before fork
//! keeps allocation and path resolution out of the fork-exec window.

use crate::error::SandboxError;
use crate::policy::{Layer, Policy};
use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// Directories and files every command may read and execute: what bash,
/// coreutils and python3 need to start (binaries, shared libraries, the
/// dynamic linker's cache, time zone) plus /proc. /etc/passwd and
/// /etc/group are deliberately absent (tools only lose the user name).
/// Debian's python site config (/etc/python3*) is added at run time.
/// OpenSSL's configuration file is here, not in the network list: node
/// (Qwen Code) opens it at start-up and exits 13 when it exists but cannot
/// be read, network or not. It holds no secret (keys live in
/// /etc/ssl/private, which stays out).
const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/ssl/openssl.cnf",
    "/proc",
];

/// Read-only additions when the policy allows network: name resolution and
/// TLS trust stores, useless (and a needless disclosure) without network.
const NETWORK_READ: &[&str] = &[
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
];

/// Character devices the command may read and write.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"];

/// The read-only entries in force for `network`, existing on this machine.
fn system_entries(network: bool) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
    // Debian's sitecustomize lives in /etc/python3.X; python warns on stderr without it.
    if let Ok(dir) = std::fs::read_dir("/etc") {
        let mut py: Vec<PathBuf> = dir
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        py.sort();
        out.extend(py);
    }
    if network {
        out.extend(NETWORK_READ.iter().map(PathBuf::from));
    }
    out.retain(|p| p.exists());
    out
}

/// The read-only system allow-list in force (without network): the
/// read+execute entries that exist on this machine, then the devices
/// (read+write). Policies with `network = true` also get resolver and TLS
/// configuration under /etc. Level::Full additionally gives each command a
/// private, writable tmpfs on /dev/shm.
pub fn system_read_paths() -> Vec<PathBuf> {
    let mut out = system_entries(false);
    out.extend(DEVICES.iter().map(PathBuf::from).filter(|p| p.exists()));
    out
}

fn abi_of(abi: i32) -> ABI {
    // Never claim more than the kernel reports: HardRequirement then fails
    // only for real breakage, not for rights this kernel cannot know.
    ABI::from(abi)
}

/// Read+execute rights, narrowed to what applies to a non-directory.
fn read_rights(abi: ABI, is_dir: bool) -> BitFlags<AccessFs> {
    let r = AccessFs::from_read(abi);
    if is_dir {
        r
    } else {
        r & AccessFs::from_file(abi)
    }
}

fn all_rights(abi: ABI, is_dir: bool) -> BitFlags<AccessFs> {
    if is_dir {
        AccessFs::from_all(abi)
    } else {
        AccessFs::from_file(abi)
    }
}

fn add_path(
    rs: RulesetCreated,
    path: &Path,
    role: &'static str,
    rights: impl Fn(bool) -> BitFlags<AccessFs>,
) -> Result<RulesetCreated, SandboxError> {
    let unusable = |reason: String| SandboxError::PathUnusable {
        role,
        path: path.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| unusable(e.to_string()))?;
    let fd = PathFd::new(path).map_err(|e| unusable(e.to_string()))?;
    Ok(rs.add_rule(PathBeneath::new(fd, rights(meta.is_dir())))?)
}

/// The Landlock ruleset for `policy` on a kernel with Landlock ABI `abi`.
/// Every file-system right the ABI knows is handled (so anything not
/// granted below is denied); TCP bind/connect are handled with no port
/// rules unless the policy allows network; signals and abstract unix
/// sockets are scoped to the sandbox's own domain. `None` when the test
/// switch (`Policy::unprotected`) leaves out all three parts.
///
/// `with_proc`: add /proc now (Level::Landlock). Level::Full mounts a new
/// proc in the child, whose root is a different inode, so the child adds
/// that rule itself after mounting.
pub(crate) fn landlock_ruleset(
    policy: &Policy,
    abi: i32,
    with_proc: bool,
) -> Result<Option<RulesetCreated>, SandboxError> {
    let v = abi_of(abi);
    let fs = !policy.off(Layer::LandlockFs);
    let tcp = !policy.network && abi >= 4 && !policy.off(Layer::LandlockNet);
    let scopes = abi >= 6 && !policy.off(Layer::LandlockScopes);
    if !(fs || tcp || scopes) {
        return Ok(None);
    }
    let mut rs = Ruleset::default().set_compatibility(CompatLevel::HardRequirement);
    if fs {
        rs = rs.handle_access(AccessFs::from_all(v))?;
    }
    if tcp {
        rs = rs.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?;
    }
    if scopes {
        rs = rs.scope(Scope::AbstractUnixSocket | Scope::Signal)?;
    }
    let mut rs = rs.create()?;
    if tcp {
        // Only the loopback endpoints (in the command's own namespace).
        for f in &policy.forward {
            rs = rs.add_rule(NetPort::new(f.port, AccessNet::ConnectTcp))?;
        }
    }
    if !fs {
        return Ok(Some(rs));
    }
    for p in &policy.writable {
        rs = add_path(rs, p, "writable", |d| all_rights(v, d))?;
    }
    for p in &policy.readable {
        rs = add_path(rs, p, "readable", |d| read_rights(v, d))?;
    }
    for p in system_entries(policy.network) {
        if p == Path::new("/proc") && !with_proc {
            continue;
        }
        rs = add_path(rs, &p, "system", |d| read_rights(v, d))?;
    }
    let dev =
        (AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev) & AccessFs::from_file(v);
    for p in DEVICES {
        let p = Path::new(p);
        if p.exists() {
            rs = add_path(rs, p, "system", |_| dev)?;
        }
    }
    Ok(Some(rs))
}

/// Adds a directory mounted in the child (fresh /proc read-only, private
/// /dev/shm read-write) to the ruleset; no allocation.
pub(crate) fn add_mounted_dir(
    rs: RulesetCreated,
    fd: impl AsFd,
    abi: i32,
    writable: bool,
) -> Result<RulesetCreated, landlock::RulesetError> {
    let v = abi_of(abi);
    let rights = if writable {
        all_rights(v, true)
    } else {
        read_rights(v, true)
    };
    rs.add_rule(PathBeneath::new(fd, rights))
}

/// Seccomp programs, applied in this order in the child:
/// 0. On x86_64, kill the process on an x32 syscall number (see
///    [`x32_killer`]) or another architecture's.
/// 1. EPERM for syscalls a command never needs and that widen the attack
///    surface or could undo the confinement (ptrace, process_vm_*, bpf,
///    keyrings, perf, mounts, unshare/setns, io_uring, namespace-creating
///    clone flags, changing the parent-death signal) and, without network, socket() of any family
///    (Landlock has no UDP rule and no rule for connecting to a unix socket by path; socketpair() stays).
/// 2. ENOSYS for clone3, whose flags live in memory where seccomp cannot
///    look; libc falls back to clone(2), which program 1 checks.
///
/// The test switch (`Policy::unprotected`) leaves out program 0
/// (`Layer::X32Killer`) or programs 1 and 2 (`Layer::Seccomp`).
pub(crate) fn seccomp_programs(policy: &Policy) -> Result<Vec<BpfProgram>, SandboxError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in DENIED {
        deny.insert(*nr, Vec::new());
    }
    deny.insert(libc::SYS_clone, clone_rules()?);
    deny.insert(libc::SYS_prctl, vec![pdeathsig_rule()?]);
    if let Some(rules) = socket_rules(policy.network, !policy.forward.is_empty())? {
        deny.insert(libc::SYS_socket, rules);
    }
    let eperm = SeccompFilter::new(
        deny,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(backend)?;
    let mut nosys = BTreeMap::new();
    nosys.insert(libc::SYS_clone3, Vec::new());
    let enosys = SeccompFilter::new(
        nosys,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(backend)?;
    let mut progs = Vec::new();
    if !policy.off(Layer::X32Killer) {
        progs.extend(x32_killer());
    }
    if !policy.off(Layer::Seccomp) {
        progs.push(eperm.try_into().map_err(backend)?);
        progs.push(enosys.try_into().map_err(backend)?);
    }
    Ok(progs)
}

/// Syscalls program 1 denies whatever their arguments.
const DENIED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_bpf,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_perf_event_open,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_userfaultfd,
    libc::SYS_kexec_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
];

/// A seccompiler error as the sandbox's.
fn backend(e: seccompiler::BackendError) -> SandboxError {
    SandboxError::Seccomp(e.to_string())
}

/// clone(2) with any namespace-creating flag: one rule per flag.
fn clone_rules() -> Result<Vec<SeccompRule>, SandboxError> {
    let ns_flags = [
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWNS,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWCGROUP,
    ];
    let mut clone_rules = Vec::new();
    for f in ns_flags {
        let f = f as u64;
        let cond = SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(f), f)
            .map_err(backend)?;
        clone_rules.push(SeccompRule::new(vec![cond]).map_err(backend)?);
    }
    Ok(clone_rules)
}

/// prctl(PR_SET_PDEATHSIG) with any signal but SIGKILL.
///
/// Written when the command was PID 1 of its namespace and died with the
/// relay only through PR_SET_PDEATHSIG(SIGKILL). The command now runs as
/// PID 2 under a minimal init that holds that signal itself (prctl acts
/// on the caller only), so this rule no longer protects anything: the
/// namespace dies with init whatever the command sets. Setting SIGKILL
/// stays allowed.
fn pdeathsig_rule() -> Result<SeccompRule, SandboxError> {
    let pdeath = vec![
        SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::PR_SET_PDEATHSIG as u64,
        )
        .map_err(backend)?,
        SeccompCondition::new(
            1,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::Ne,
            libc::SIGKILL as u64,
        )
        .map_err(backend)?,
    ];
    SeccompRule::new(pdeath).map_err(backend)
}

/// The rules for socket(2), `None` where it stays allowed (network).
fn socket_rules(network: bool, loopback: bool) -> Result<Option<Vec<SeccompRule>>, SandboxError> {
    if !network && !loopback {
        // No socket() at all: Landlock (ABI 7) does not cover connecting to
        // a unix socket by path, so a world-writable one of the host (an X
        // server in /tmp/.X11-unix, say) was reachable (tested).
        // socketpair() stays: it reaches nothing outside.
        Ok(Some(Vec::new()))
    } else if !network {
        // Loopback endpoints only: IP sockets (the namespace has nothing
        // but `lo`), never a unix socket by path or another family.
        let ne = |v: libc::c_int| {
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, v as u64)
                .map_err(backend)
        };
        Ok(Some(vec![SeccompRule::new(vec![
            ne(libc::AF_INET)?,
            ne(libc::AF_INET6)?,
        ])
        .map_err(backend)?]))
    } else {
        Ok(None)
    }
}

/// On x86_64, a syscall number with the x32 bit (`0x40000000`) set is the
/// x32 ABI's entry to the same syscall: a deny-list keyed by x86_64 numbers
/// would let `unshare | 0x40000000` through on a kernel that enables x32.
/// This program, applied first, kills the process on any such number (and
/// on any architecture but x86_64: no other ABI's numbers are expected).
fn x32_killer() -> Option<BpfProgram> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    let ins = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
    Some(vec![
        ins(LD_W_ABS, 0, 0, 4),              // seccomp_data.arch
        ins(JEQ_K, 1, 0, AUDIT_ARCH_X86_64), // x86_64: go on
        ins(RET_K, 0, 0, RET_KILL_PROCESS),  // another arch: kill
        ins(LD_W_ABS, 0, 0, 0),              // seccomp_data.nr
        ins(JGE_K, 0, 1, X32_SYSCALL_BIT),   // x32 bit set?
        ins(RET_K, 0, 0, RET_KILL_PROCESS),  //   kill
        ins(RET_K, 0, 0, RET_ALLOW),         // else on to the next program
    ])
}
