//! Confines model-written shell commands with kernel features: it drops
//! root, puts the command in fresh user/mount/PID/network/IPC/UTS
//! namespaces, applies rlimits, a Landlock ruleset (file system, TCP,
//! signal and abstract-socket scopes), no_new_privs and a seccomp filter.
//! It knows processes and paths only; the caller keeps arguments, the
//! environment it allows, timeouts and killing the process group.
//!
//! Typical use, for each command:
//! `prepare(&policy)?; let mut s = Spawn::new("bash", &policy)?;` then the
//! caller's args, env and directory, and `s.spawn()` (stdin from
//! `/dev/null`, output piped, its own process group). The confinement is
//! applied by a launcher (this executable re-entered before `main`, see
//! `launch`), so spawning never forks the caller; at `Level::None`, which
//! only sets the process's limits, the command is started directly
//! (`direct`), without the launcher. `command` gives the launcher as a
//! `std::process::Command` for callers that set up stdio themselves.

mod confine;
mod direct;
mod error;
mod forward;
mod launch;
mod policy;
mod prepare;
mod probe;
mod rules;
mod spawn;
mod sys;
mod view;

pub use confine::command;
pub use error::SandboxError;
pub use policy::{Forward, Layer, Level, Limits, Place, Policy};
pub use prepare::{outside_links, prepare};
pub use probe::{probe, Availability, FULL_LEVEL_MIN_ABI, LANDLOCK_LEVEL_MIN_ABI};
pub use rules::system_read_paths;
pub use spawn::{Child, Spawn};
pub use sys::SANDBOX_ID;
