//! Confines model-written shell commands with kernel features: it drops
//! root, puts the command in fresh user/mount/PID/network/IPC/UTS
//! namespaces, applies rlimits, a Landlock ruleset (file system, TCP,
//! signal and abstract-socket scopes), no_new_privs and a seccomp filter.
//! It knows processes and paths only; the caller keeps spawning, env,
//! stdio, timeouts and killing the process group.
//!
//! Typical use, for each command:
//! `prepare(&policy)?; let mut cmd = command("bash", &policy)?;` then the
//! caller's args, env, stdio and `cmd.spawn()`. The confinement is applied
//! by a launcher (this executable re-entered before `main`, see `launch`),
//! so spawning never forks the caller.

mod confine;
mod error;
mod forward;
mod launch;
mod policy;
mod prepare;
mod probe;
mod rules;
mod sys;
mod view;

pub use confine::command;
pub use error::SandboxError;
pub use policy::{Forward, Layer, Level, Limits, Place, Policy};
pub use prepare::{outside_links, prepare};
pub use probe::{probe, Availability, FULL_LEVEL_MIN_ABI, LANDLOCK_LEVEL_MIN_ABI};
pub use rules::system_read_paths;
pub use sys::SANDBOX_ID;
