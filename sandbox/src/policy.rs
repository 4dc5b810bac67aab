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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_secs: 120,
            address_space_mb: 4096,
            processes: 128,
            file_size_mb: 256,
            open_files: 256,
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
        }
    }
}
