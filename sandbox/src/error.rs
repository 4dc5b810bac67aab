//! The crate's single error type. Every message says what is wrong and what
//! the caller (or the person configuring it) can do about it, because these
//! errors surface in `mass` output far from the code that raised them.

use std::path::PathBuf;

/// Everything that can stop the sandbox from being set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The kernel or process lacks one or more layers the requested level needs.
    #[error("sandbox level \"{level}\" cannot be enforced here: {}", missing.join("; "))]
    Unavailable {
        /// The level that was asked for ("full", "landlock").
        level: &'static str,
        /// One sentence per missing layer, each naming the layer and how to lower the level.
        missing: Vec<String>,
    },
    /// A path in the policy is not absolute.
    #[error(
        "sandbox path {0} is not absolute: pass absolute paths (canonicalize the workspace first)"
    )]
    RelativePath(PathBuf),
    /// A path in the policy cannot be opened for the Landlock rule.
    #[error("sandbox {role} path {path} cannot be opened ({reason}): create it before running the command or remove it from the policy")]
    PathUnusable {
        /// "writable" or "readable".
        role: &'static str,
        /// The offending path.
        path: PathBuf,
        /// What the OS said.
        reason: String,
    },
    /// A directory on the way to a policy path cannot be traversed by the sandbox uid.
    #[error("{path} is not searchable by the sandbox user (uid {uid}), so the command could not reach {target}: make it traversable (chmod o+x {path}) or move the workspace under a 0755/0711 directory")]
    NotTraversable {
        /// The ancestor directory lacking the search bit for others.
        path: PathBuf,
        /// The policy path behind it.
        target: PathBuf,
        /// The unprivileged uid the command runs as.
        uid: u32,
    },
    /// A readable policy path cannot be read by the sandbox uid.
    #[error("{path} is not readable by the sandbox user (uid {uid}): make it world-readable (chmod o+rX {path}) or copy it somewhere that is")]
    NotReadable {
        /// The readable policy path.
        path: PathBuf,
        /// The unprivileged uid the command runs as.
        uid: u32,
    },
    /// A workspace file shares its inode with a file outside the workspace and is writable by anyone.
    #[error("{0} is a hard link to a file outside the workspace and is world-writable, so the sandboxed command could modify that outside file: remove the link (or copy the file) before running commands")]
    OutsideHardLink(PathBuf),
    /// Changing ownership of the workspace for the sandbox uid failed.
    #[error("cannot hand {path} to the sandbox user (uid {uid}): {source}; the harness must run as root to drop privileges, or lower the level to \"none\"")]
    Chown {
        /// The file whose ownership could not be changed.
        path: PathBuf,
        /// The unprivileged uid.
        uid: u32,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Walking the workspace failed.
    #[error("cannot walk {path} to prepare it for the sandbox: {source}; check the workspace exists and is readable by the harness")]
    Walk {
        /// The directory being walked.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The Landlock ruleset could not be built.
    #[error("building the Landlock ruleset failed: {0}; check `mass sandbox` output, or set [sandbox] level = \"none\" (unsafe) if this kernel cannot do it")]
    Landlock(#[from] landlock::RulesetError),
    /// The launcher's arguments could not be encoded.
    #[error("cannot start the sandbox launcher: {0}")]
    Launch(String),
    /// The seccomp filter could not be compiled.
    #[error("compiling the seccomp filter failed: {0}; this architecture may be unsupported: set [sandbox] level = \"none\" (unsafe) to run without it")]
    Seccomp(String),
}
