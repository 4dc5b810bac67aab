//! The configuration types: how strongly to confine (`Level`), which
//! resource limits apply (`Limits`) and what one command may touch
//! (`Policy`). They are plain serde data so the caller can embed them in its
//! own config file.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How strongly commands are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Drop root, user/mount/net/pid/ipc/uts namespaces, rlimits, Landlock,
    /// seccomp, no_new_privs. The default.
    #[default]
    Full,
    /// Drop root, rlimits, Landlock, seccomp, no_new_privs; no namespaces
    /// (for kernels or containers without user namespaces). Daemons that
    /// leave the process group can outlive the call at this level.
    Landlock,
    /// Rlimits only. UNSAFE: the command can read, write and connect to
    /// anything the harness can.
    None,
}

impl Level {
    /// The config spelling of the level.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Full => "full",
            Level::Landlock => "landlock",
            Level::None => "none",
        }
    }
}

/// Resource limits applied with setrlimit in the child (soft = hard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// CPU seconds per process (RLIMIT_CPU); the kernel SIGKILLs at the limit.
    pub cpu_secs: u64,
    /// Virtual address space per process in MiB (RLIMIT_AS).
    pub address_space_mb: u64,
    /// Processes of the sandbox uid (RLIMIT_NPROC); under Level::Full only
    /// the sandbox's own user namespace counts.
    pub processes: u64,
    /// Largest file a process may write, in MiB (RLIMIT_FSIZE).
    pub file_size_mb: u64,
    /// Open file descriptors per process (RLIMIT_NOFILE).
    pub open_files: u64,
    /// The scheduling niceness of every process of the command (0-19): the
    /// harness (its proxy, its ledger writer) keeps its share of the CPU
    /// however many processes the commands start. There is no per-rollout
    /// CPU weight without cgroups.
    pub nice: u8,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_secs: 120,
            address_space_mb: 4096,
            processes: 128,
            file_size_mb: 256,
            open_files: 256,
            nice: 10,
        }
    }
}

/// What one command may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// How strongly the command is confined.
    #[serde(default)]
    pub level: Level,
    /// Directories the command may read, write, create and delete in (the workspace).
    #[serde(default)]
    pub writable: Vec<PathBuf>,
    /// Extra directories/files the command may only read (and execute).
    #[serde(default)]
    pub readable: Vec<PathBuf>,
    /// Whether the command may use the network (default false).
    #[serde(default)]
    pub network: bool,
    /// Resource limits.
    #[serde(default)]
    pub limits: Limits,
    /// Directories whose contents the command must not see (Level::Full):
    /// in its mount namespace each is covered by an empty, read-only tmpfs
    /// and the writable and readable paths below it are bound back at
    /// their own paths, so nothing else below it can be named (other
    /// rollouts' workspaces, homes, check copies). Ignored at lower levels.
    #[serde(default)]
    pub hide: Vec<PathBuf>,
    /// Loopback endpoints in the command's own network namespace
    /// (Level::Full, `network` false): each listens on 127.0.0.1:`port`
    /// there and relays every connection to the unix socket `socket` of the
    /// harness (which must be visible to the command: a readable path). The
    /// command may then create IP sockets, and reach only these endpoints.
    #[serde(default)]
    pub forward: Vec<Forward>,
    /// Paths the command finds somewhere else (Level::Full; ignored below,
    /// where the command sees every path where it is). Each place's `path`,
    /// a writable or readable path of the policy with the rights of that
    /// role, is bound at `at`, below a `hide` directory (its mount point is
    /// made in the tmpfs covering it), and not at its own path. What lies
    /// below `path` comes along below `at`; the command's working directory
    /// and the `forward` sockets are found the same way. Giving every run
    /// the same `at` is what keeps the host's paths (process ids, random
    /// names, a user's home) out of everything a command prints.
    /// [`Policy::seen`] says where the command finds a path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub places: Vec<Place>,
    /// TEST ONLY: layers to leave out, so the escape tests can show that
    /// each refusal they assert comes from the layer they name (with that
    /// layer off, the attack gets through or fails differently). Empty in
    /// every real policy. It cannot be set from `mass`'s configuration: no
    /// config file holds a `Policy` (the engine builds one with
    /// [`Policy::new`] from `level`, `limits` and its own paths), and the
    /// field is hidden from the docs. The launcher names the layers left
    /// out on the command's stderr, so a policy carrying them is never
    /// silent. A command that starts the launcher again from inside a
    /// sandbox cannot use it to lift a layer: every layer it already runs
    /// under is inherited.
    #[doc(hidden)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unprotected: Vec<Layer>,
}

/// TEST ONLY: one layer of the confinement that [`Policy::unprotected`] can
/// leave out. Each names one step of the launcher; nothing else changes.
/// The user namespace itself is not a switch: at `Level::Full` every other
/// namespace and mount is made inside it.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// Dropping root to uid/gid 65534: the command keeps the caller's ids
    /// (under `Level::Full`, root of its own user namespace mapped to root).
    DropRoot,
    /// The PID namespace with its relay and init, and the fresh /proc
    /// (which needs it): the command runs in the caller's PID namespace.
    PidNamespace,
    /// The network namespace (and with it the `forward` endpoints, which
    /// live in it): the command shares the caller's network.
    NetNamespace,
    /// The IPC namespace: the command shares the host's SysV IPC and
    /// POSIX message queues.
    IpcNamespace,
    /// The view of `Policy::hide` and `Policy::places`: hidden directories
    /// stay as they are and every path is seen where it is.
    View,
    /// The private /dev/shm: the command sees the host's.
    PrivateShm,
    /// Every resource limit (CPU, AS, NPROC, FSIZE, NOFILE, CORE=0); the
    /// niceness stays.
    Rlimits,
    /// Landlock's file-system rules (no file-system right is handled).
    LandlockFs,
    /// Landlock's TCP bind/connect rules.
    LandlockNet,
    /// Landlock's scopes (signals, abstract unix sockets).
    LandlockScopes,
    /// no_new_privs: Landlock and seccomp are then installed with the
    /// launcher's privilege (CAP_SYS_ADMIN, inside the user namespace or as
    /// root before dropping it) instead.
    NoNewPrivs,
    /// The seccomp deny-list (EPERM) and the clone3 program (ENOSYS).
    Seccomp,
    /// The seccomp program that kills x32 syscall numbers and other
    /// architectures.
    X32Killer,
    /// Marking inherited fds above 2 close-on-exec.
    Cloexec,
}

/// One entry of [`Policy::places`]: the command sees `path` at `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    pub path: PathBuf,
    pub at: PathBuf,
}

/// One loopback endpoint of [`Policy::forward`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forward {
    pub port: u16,
    pub socket: PathBuf,
}

impl Policy {
    /// A policy with `workspace` as the only writable directory, no extra
    /// readable paths, no network and default limits.
    pub fn new(level: Level, workspace: &Path) -> Policy {
        Policy {
            level,
            writable: vec![workspace.to_path_buf()],
            readable: Vec::new(),
            network: false,
            limits: Limits::default(),
            hide: Vec::new(),
            forward: Vec::new(),
            places: Vec::new(),
            unprotected: Vec::new(),
        }
    }

    /// Where the command finds host path `p`: below the `at` of the
    /// innermost place whose `path` holds it, when the places apply
    /// (`Level::Full` with the view); `p` itself otherwise.
    pub fn seen(&self, p: &Path) -> PathBuf {
        if self.level != Level::Full || self.off(Layer::View) {
            return p.to_path_buf();
        }
        self.places
            .iter()
            .filter_map(|pl| Some((pl, p.strip_prefix(&pl.path).ok()?)))
            .max_by_key(|(pl, _)| pl.path.components().count())
            .map_or_else(
                || p.to_path_buf(),
                |(pl, rest)| {
                    if rest.as_os_str().is_empty() {
                        pl.at.clone()
                    } else {
                        pl.at.join(rest)
                    }
                },
            )
    }

    /// Whether the test-only switch leaves `layer` out.
    pub(crate) fn off(&self, layer: Layer) -> bool {
        self.unprotected.contains(&layer)
    }
}
