//! Finds out once per process which confinement layers the running kernel
//! and process offer (Landlock ABI, user/pid/net namespaces, mounting a
//! fresh /proc), and turns a missing layer into an error that names it and
//! says which level to fall back to. The probe forks a throwaway child that
//! tries exactly the steps `confine` will take, as the uid it will take them
//! as, because sysctls, LSMs and container runtimes can each veto one step.

use crate::error::SandboxError;
use crate::policy::Level;
use crate::sys;
use std::sync::OnceLock;

/// Landlock ABI needed by `Level::Landlock`: without namespaces, TCP
/// denial needs ABI 4 and scoping signals/abstract sockets needs ABI 6.
pub const LANDLOCK_LEVEL_MIN_ABI: i32 = 6;
/// Landlock ABI needed by `Level::Full` (namespaces already cover network,
/// signals and abstract sockets; Landlock covers the file system).
pub const FULL_LEVEL_MIN_ABI: i32 = 1;

/// What the running kernel/process offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Availability {
    /// Landlock ABI version, None if Landlock is not enabled.
    pub landlock_abi: Option<i32>,
    /// unshare(CLONE_NEWUSER) and writing the id maps works.
    pub user_namespaces: bool,
    /// A new PID namespace can be created inside the user namespace.
    pub pid_namespace: bool,
    /// A new network namespace can be created inside the user namespace.
    pub net_namespace: bool,
    /// A fresh proc can be mounted on /proc inside the namespaces.
    pub mount_proc: bool,
    /// New IPC and UTS namespaces can be created.
    pub ipc_uts_namespaces: bool,
    /// Whether the harness runs as root (then commands run as uid 65534).
    pub root: bool,
    /// Value of /proc/sys/user/max_user_namespaces, for messages.
    pub max_user_namespaces: Option<u64>,
}

/// Probes the machine once; later calls return the cached answer.
pub fn probe() -> Availability {
    static CACHE: OnceLock<Availability> = OnceLock::new();
    CACHE.get_or_init(probe_uncached).clone()
}

fn landlock_abi() -> Option<i32> {
    // landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) returns the ABI.
    // SAFETY: documented query form of the syscall; no pointers are dereferenced.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    if v > 0 {
        Some(v as i32)
    } else {
        None
    }
}

const P_USER: i32 = 1;
const P_NET: i32 = 2;
const P_PID: i32 = 4;
const P_PROC: i32 = 8;
const P_IPCUTS: i32 = 16;

fn probe_uncached() -> Availability {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let max_user_namespaces = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let bits = probe_namespaces(root).unwrap_or(0);
    Availability {
        landlock_abi: landlock_abi(),
        user_namespaces: bits & P_USER != 0,
        pid_namespace: bits & P_PID != 0,
        net_namespace: bits & P_NET != 0,
        mount_proc: bits & P_PROC != 0,
        ipc_uts_namespaces: bits & P_IPCUTS != 0,
        root,
        max_user_namespaces,
    }
}

/// Forks a child that tries each namespace step and reports a bit mask in
/// its exit code. Returns None if the probe itself could not run.
fn probe_namespaces(root: bool) -> Option<i32> {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = if root {
        (sys::SANDBOX_ID, sys::SANDBOX_ID)
    } else {
        unsafe { (libc::getuid(), libc::getgid()) }
    };
    // Built before fork: the child must not allocate.
    let uid_map = format!("{uid} {uid} 1\n").into_bytes();
    let gid_map = format!("{gid} {gid} 1\n").into_bytes();
    // SAFETY: the child only makes async-signal-safe calls and always _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return None;
    }
    if pid == 0 {
        let bits = unsafe { probe_child(root, &uid_map, &gid_map) };
        unsafe { libc::_exit(bits) };
    }
    let status = sys::wait_pid(pid).ok()?;
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else {
        None
    }
}

unsafe fn probe_child(root: bool, uid_map: &[u8], gid_map: &[u8]) -> i32 {
    if root && sys::drop_root().is_err() {
        return 0;
    }
    if libc::unshare(libc::CLONE_NEWUSER) != 0 {
        return 0;
    }
    if sys::write_file(c"/proc/self/setgroups", b"deny").is_err()
        || sys::write_file(c"/proc/self/uid_map", uid_map).is_err()
        || sys::write_file(c"/proc/self/gid_map", gid_map).is_err()
    {
        return 0;
    }
    let mut bits = P_USER;
    if libc::unshare(libc::CLONE_NEWNET) == 0 {
        bits |= P_NET;
    }
    if libc::unshare(libc::CLONE_NEWIPC | libc::CLONE_NEWUTS) == 0 {
        bits |= P_IPCUTS;
    }
    if libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWPID) != 0 {
        return bits;
    }
    let pid = libc::fork();
    if pid < 0 {
        return bits;
    }
    if pid == 0 {
        // PID 1 of the new namespace: the fork itself proves the PID namespace works.
        let ok = libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) == 0
            && libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) == 0;
        libc::_exit(if ok { 0 } else { 1 });
    }
    bits |= P_PID;
    match sys::wait_pid(pid) {
        Ok(st) if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 => bits | P_PROC,
        _ => bits,
    }
}

impl Availability {
    /// Ok if every layer `level` needs is present; otherwise an error naming
    /// each missing layer and how to lower the level.
    pub fn check(&self, level: Level) -> Result<(), SandboxError> {
        let mut missing = Vec::new();
        let to_landlock = "set [sandbox] level = \"landlock\" to run without namespaces";
        let to_none = "set [sandbox] level = \"none\" to run without confinement (unsafe)";
        let min_abi = match level {
            Level::None => return Ok(()),
            Level::Full => FULL_LEVEL_MIN_ABI,
            Level::Landlock => LANDLOCK_LEVEL_MIN_ABI,
        };
        match self.landlock_abi {
            None => missing.push(format!(
                "Landlock is not enabled in this kernel (needs Linux 5.13+ with landlock in the lsm= boot list): {to_none}"
            )),
            Some(abi) if abi < min_abi => missing.push(format!(
                "Landlock ABI {abi} is too old for level \"{}\" (needs ABI {min_abi}: {}): {}",
                level.as_str(),
                if level == Level::Landlock {
                    "TCP denial and signal/abstract-socket scoping"
                } else {
                    "file-system rules"
                },
                to_none
            )),
            Some(_) => {}
        }
        if level == Level::Full {
            if !self.user_namespaces {
                let why = match self.max_user_namespaces {
                    Some(0) => " (user.max_user_namespaces = 0)".to_string(),
                    Some(_) => " (unshare(CLONE_NEWUSER) or writing uid_map was refused, e.g. by an LSM, seccomp or a container runtime)".to_string(),
                    None => String::new(),
                };
                missing.push(format!(
                    "user namespaces are unavailable{why}: {to_landlock}"
                ));
            } else {
                if !self.pid_namespace {
                    missing.push(format!(
                        "PID namespaces are unavailable inside a user namespace: {to_landlock}"
                    ));
                }
                if !self.net_namespace {
                    missing.push(format!(
                        "network namespaces are unavailable inside a user namespace: {to_landlock}"
                    ));
                }
                if !self.ipc_uts_namespaces {
                    missing.push(format!(
                        "IPC/UTS namespaces are unavailable inside a user namespace: {to_landlock}"
                    ));
                }
                if self.pid_namespace && !self.mount_proc {
                    missing.push(format!(
                        "mounting a fresh /proc inside the namespaces is refused (a container that masks /proc prevents it): {to_landlock}"
                    ));
                }
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(SandboxError::Unavailable {
                level: level.as_str(),
                missing,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Availability {
        Availability {
            landlock_abi: Some(7),
            user_namespaces: true,
            pid_namespace: true,
            net_namespace: true,
            mount_proc: true,
            ipc_uts_namespaces: true,
            root: true,
            max_user_namespaces: Some(1000),
        }
    }

    #[test]
    fn everything_present_passes_every_level() {
        for level in [Level::Full, Level::Landlock, Level::None] {
            all().check(level).unwrap();
        }
    }

    #[test]
    fn missing_user_namespaces_names_the_sysctl_and_the_fallback() {
        let a = Availability {
            user_namespaces: false,
            max_user_namespaces: Some(0),
            ..all()
        };
        let msg = a.check(Level::Full).unwrap_err().to_string();
        assert!(
            msg.contains("user namespaces are unavailable (user.max_user_namespaces = 0)"),
            "{msg}"
        );
        assert!(msg.contains("level = \"landlock\""), "{msg}");
        a.check(Level::Landlock).unwrap();
        a.check(Level::None).unwrap();
    }

    #[test]
    fn missing_landlock_fails_both_confining_levels() {
        let a = Availability {
            landlock_abi: None,
            ..all()
        };
        for level in [Level::Full, Level::Landlock] {
            let msg = a.check(level).unwrap_err().to_string();
            assert!(msg.contains("Landlock is not enabled"), "{msg}");
            assert!(msg.contains("level = \"none\""), "{msg}");
        }
        a.check(Level::None).unwrap();
    }

    #[test]
    fn old_landlock_abi_blocks_landlock_level_only() {
        let a = Availability {
            landlock_abi: Some(3),
            ..all()
        };
        a.check(Level::Full).unwrap();
        let msg = a.check(Level::Landlock).unwrap_err().to_string();
        assert!(
            msg.contains("Landlock ABI 3 is too old for level \"landlock\""),
            "{msg}"
        );
    }

    #[test]
    fn each_missing_namespace_is_named() {
        let a = Availability {
            pid_namespace: false,
            net_namespace: false,
            ipc_uts_namespaces: false,
            mount_proc: false,
            ..all()
        };
        let msg = a.check(Level::Full).unwrap_err().to_string();
        assert!(msg.contains("PID namespaces"), "{msg}");
        assert!(msg.contains("network namespaces"), "{msg}");
        assert!(msg.contains("IPC/UTS"), "{msg}");
        let a = Availability {
            mount_proc: false,
            ..all()
        };
        let msg = a.check(Level::Full).unwrap_err().to_string();
        assert!(msg.contains("fresh /proc"), "{msg}");
    }

    #[test]
    fn this_machine_offers_full() {
        // The brief states this machine has everything; a failure here explains which layer is gone.
        probe().check(Level::Full).unwrap();
    }
}
