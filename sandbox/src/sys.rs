//! Thin, allocation-free wrappers around the raw syscalls the launcher
//! makes while confining itself, and after its forks (the relay and the
//! namespace's init only make syscalls). They take pre-built C strings and
//! byte slices and report failures as `std::io::Error` built from errno.

use std::ffi::CStr;
use std::io;

/// The unprivileged uid/gid commands run as when the harness is root
/// ("nobody" on Debian and most distributions).
pub const SANDBOX_ID: u32 = 65534;

/// Converts a -1 return into the current errno.
pub(crate) fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Writes `data` to the file at `path` (used for /proc/self/{setgroups,uid_map,gid_map},
/// which must be written in a single write call).
pub(crate) fn write_file(path: &CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: path is a valid NUL-terminated string; the fd is closed on every path.
    unsafe {
        let fd = cvt(libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC))?;
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let err = io::Error::last_os_error();
        libc::close(fd);
        if n < 0 {
            return Err(err);
        }
        if n as usize != data.len() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
    }
    Ok(())
}

/// Drops every supplementary group and switches real, effective and saved
/// ids to `SANDBOX_ID`. Groups first, then gid, then uid: once the uid is
/// gone we could no longer change the others.
pub(crate) fn drop_root() -> io::Result<()> {
    // SAFETY: plain syscalls with valid arguments.
    unsafe {
        cvt(libc::setgroups(0, std::ptr::null()))?;
        cvt(libc::setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID))?;
        cvt(libc::setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID))?;
        // Changing the euid made us non-dumpable, which makes /proc/self/*
        // root-owned and unwritable for us: uid_map could then not be
        // written after unshare. exec resets this flag anyway.
        cvt(libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0))?;
    }
    Ok(())
}

/// Writes a short diagnostic to the command's stderr, so a failure in the
/// launcher names the step.
pub(crate) fn note(msg: &[u8]) {
    // SAFETY: write(2) on fd 2 with a valid buffer; failures are ignored on purpose.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
    }
}

/// Closes every fd except those in `keep` (ascending), with close_range(2)
/// (Linux 5.9+), falling back to a loop.
pub(crate) fn close_all_except(keep: &[libc::c_int]) {
    let mut from: libc::c_uint = 0;
    // SAFETY: closing fds we own in a process that is about to only wait and exit.
    unsafe {
        for &k in keep {
            let k = k as libc::c_uint;
            if k > from {
                close_range_or_loop(from, k - 1);
            }
            from = k + 1;
        }
        close_range_or_loop(from, libc::c_uint::MAX);
    }
}

/// # Safety
/// Closes fds `first..=last`; the caller must own them.
unsafe fn close_range_or_loop(first: libc::c_uint, last: libc::c_uint) {
    if libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) != 0 {
        for fd in first..=last.min(1023) {
            libc::close(fd as libc::c_int);
        }
    }
}

/// Waits for `pid`, retrying on EINTR. Returns the raw wait status.
pub(crate) fn wait_pid(pid: libc::pid_t) -> io::Result<libc::c_int> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: status is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(status);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Ends the current process the way `status` (from waitpid) says the child
/// ended, so whoever waits for us sees the same exit code or signal.
pub(crate) fn exit_like(status: libc::c_int) -> ! {
    // SAFETY: async-signal-safe calls only; every path ends in _exit.
    unsafe {
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            // No core file from the relay itself when it re-raises e.g. SIGSEGV.
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(127);
    }
}
