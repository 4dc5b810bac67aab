//! Where confined commands find what a rollout gives them (`Level::Full`):
//! its workspace, an external program's home and proxy socket, a task's
//! checks. Each is bound at the same path below `/tmp` in every run on every
//! machine (`sandbox::Policy::places`), whatever the host calls it (a
//! process id, a random name, a user's home), so nothing a command prints
//! about where it is (`pwd`, `$TMPDIR`, a traceback, a harness's system
//! prompt) differs between two runs of the same experiment, and equal ids
//! keep proving a faithful replay. Below `Level::Full` there is no mount
//! namespace: commands see the host's paths.

/// The directory the places are made in; the command's whole `/tmp` is an
/// empty tmpfs holding them (and nothing of the host's `/tmp`).
pub const HIDDEN: &str = "/tmp";
/// The workspace (a team's, or a check copy), the command's working
/// directory; `HOME` for the built-in tools, `TMPDIR` its `.tmp`.
pub const WORKSPACE: &str = "/tmp/mass/workspace";
/// An external program's home (its `HOME` is set by the harness template).
pub const HOME: &str = "/tmp/mass/home";
/// A task's checks folder, named to the check commands as `$MASS_CHECKS`.
pub const CHECKS: &str = "/tmp/mass/checks";
/// The directory of an external program's proxy socket.
pub const PROXY: &str = "/tmp/mass/proxy";
