//! [`Spawn`]: a confined command as a harness runs one (stdin from
//! `/dev/null`, stdout and stderr piped, its own process group, only the
//! environment given), started the cheapest way its level allows. Above
//! `Level::None` that is the launcher (`confine::command`); at
//! `Level::None`, which has nothing to set up but the process's own limits,
//! it is a direct clone of the caller (`direct`), which saves executing
//! this whole binary once more per command.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};

use crate::confine::{check, command};
use crate::direct::{self, Plan};
use crate::error::SandboxError;
use crate::policy::{Level, Policy};

/// A command to start confined by a policy (see the module docs).
pub struct Spawn {
    how: How,
}

enum How {
    Launcher(Command),
    Direct(Plan),
}

impl Spawn {
    /// `program` (looked up in the command's own `PATH` when it holds no
    /// '/') confined as `policy` says. Fails here, in the caller, as
    /// [`command`](crate::command) does: a layer the level needs is
    /// missing, a path is relative or (above `Level::None`) absent.
    pub fn new(program: impl AsRef<OsStr>, policy: &Policy) -> Result<Spawn, SandboxError> {
        // The direct start knows the kernel's signal structures of these
        // two architectures only.
        let known = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
        if policy.level != Level::None || !known {
            return Spawn::via_launcher(program, policy);
        }
        check(policy)?;
        Ok(Spawn {
            how: How::Direct(Plan::new(program.as_ref(), policy)),
        })
    }

    /// As [`new`](Spawn::new), but through the launcher at every level:
    /// what `new` did at `Level::None` before it started commands
    /// directly, kept so the two can be compared.
    pub fn via_launcher(
        program: impl AsRef<OsStr>,
        policy: &Policy,
    ) -> Result<Spawn, SandboxError> {
        let mut cmd = command(program, policy)?;
        cmd.env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // setpgid(0, 0) in the child before exec: its pid is the pgid.
            .process_group(0);
        Ok(Spawn {
            how: How::Launcher(cmd),
        })
    }

    pub fn arg(&mut self, a: impl AsRef<OsStr>) -> &mut Spawn {
        match &mut self.how {
            How::Launcher(c) => {
                c.arg(a);
            }
            How::Direct(p) => p.args.push(a.as_ref().to_os_string()),
        }
        self
    }

    /// Sets one variable of the command's environment (which starts empty).
    pub fn env(&mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> &mut Spawn {
        match &mut self.how {
            How::Launcher(c) => {
                c.env(k, v);
            }
            How::Direct(p) => {
                p.env
                    .insert(k.as_ref().to_os_string(), v.as_ref().to_os_string());
            }
        }
        self
    }

    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Spawn {
        match &mut self.how {
            How::Launcher(c) => {
                c.current_dir(dir);
            }
            How::Direct(p) => p.cwd = Some(dir.as_ref().to_path_buf()),
        }
        self
    }

    /// Starts the command. Fails, as `Command::spawn` does, when the
    /// process cannot be made or its process group, stdio or directory
    /// cannot be set up. A step of the confinement that fails after that is
    /// named on the command's stderr, and it exits 126 (127: the program
    /// was not found), as the launcher does.
    pub fn spawn(&mut self) -> io::Result<Child> {
        match &mut self.how {
            How::Launcher(c) => {
                let mut std = c.spawn()?;
                let missing = || io::Error::other("a pipe of the command was not set up");
                let stdout = File::from(std::os::fd::OwnedFd::from(
                    std.stdout.take().ok_or_else(missing)?,
                ));
                let stderr = File::from(std::os::fd::OwnedFd::from(
                    std.stderr.take().ok_or_else(missing)?,
                ));
                Ok(Child {
                    pid: std.id(),
                    stdout: Some(stdout),
                    stderr: Some(stderr),
                    std: Some(std),
                    status: None,
                })
            }
            How::Direct(p) => {
                let s = direct::spawn(p)?;
                Ok(Child {
                    pid: s.pid,
                    stdout: Some(s.stdout),
                    stderr: Some(s.stderr),
                    std: None,
                    status: None,
                })
            }
        }
    }
}

/// A started command: its pid (which is also its process group) and its
/// output pipes. Dropping it neither waits for nor kills the command.
pub struct Child {
    pid: u32,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    std: Option<std::process::Child>,
    /// A direct child's status once reaped (its pid may be reused after).
    status: Option<ExitStatus>,
}

impl Child {
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Waits for the command to exit (again: its status).
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(c) = &mut self.std {
            return c.wait();
        }
        if let Some(s) = self.status {
            return Ok(s);
        }
        let s = direct::wait(self.pid)?;
        self.status = Some(s);
        Ok(s)
    }
}
