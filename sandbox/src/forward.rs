//! Loopback endpoints in the command's own network namespace
//! (`Policy::forward`, `Level::Full` without `network`): the namespace's
//! `lo` is brought up, and for each endpoint a listening socket on
//! 127.0.0.1:port relays every connection to a unix socket of the harness
//! (a recording proxy route), as Codex's network proxy does. The command
//! reaches that and nothing else: no other interface exists in its
//! namespace, and its seccomp filter lets it create only IP sockets.
//!
//! The relay runs in a process of its own, double-forked so the namespace's
//! init (not the command) is its parent: a shell's `wait` never waits for it,
//! and it dies with the namespace when the command ends. It forks once per
//! connection and copies bytes both ways until both sides close.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;

use crate::policy::Forward;
use crate::sys::{cvt, note};

/// A prepared endpoint: the listening socket and where it relays to.
pub(crate) struct Endpoint {
    listener: libc::c_int,
    target: CString,
}

/// Brings `lo` up and opens every listener (inside the new network
/// namespace, where the launcher holds CAP_NET_ADMIN), then starts the
/// relay. Returns in the command's process.
pub(crate) fn start(forwards: &[Forward]) -> io::Result<()> {
    if forwards.is_empty() {
        return Ok(());
    }
    loopback_up().inspect_err(|_| note(b"sandbox: bringing up the loopback interface failed\n"))?;
    let mut eps = Vec::with_capacity(forwards.len());
    for f in forwards {
        eps.push(
            listen(f).inspect_err(|_| note(b"sandbox: opening a loopback endpoint failed\n"))?,
        );
    }
    // SAFETY: fork in a single-threaded process; the child never returns.
    let pid = cvt(unsafe { libc::fork() })?;
    if pid == 0 {
        // SAFETY: fork again so the relay is reparented to the namespace's init.
        match unsafe { libc::fork() } {
            0 => relay(&eps),
            // SAFETY: _exit is always safe.
            _ => unsafe { libc::_exit(0) },
        }
    }
    crate::sys::wait_pid(pid)?;
    for e in &eps {
        // SAFETY: the command does not need the listeners.
        unsafe { libc::close(e.listener) };
    }
    Ok(())
}

fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket/ioctl calls on a local ifreq; the fd is closed.
    unsafe {
        let fd = cvt(libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let mut r = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        if r == 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            r = libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        }
        let err = io::Error::last_os_error();
        libc::close(fd);
        if r != 0 {
            return Err(err);
        }
        Ok(())
    }
}

fn listen(f: &Forward) -> io::Result<Endpoint> {
    let target = CString::new(f.socket.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: plain socket calls on a local sockaddr_in.
    unsafe {
        let fd = cvt(libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_port = f.port.to_be();
        addr.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
        cvt(libc::bind(
            fd,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ))?;
        cvt(libc::listen(fd, 64))?;
        Ok(Endpoint {
            listener: fd,
            target,
        })
    }
}

/// The relay process: accepts on every listener and forks a copier per
/// connection. Never returns.
fn relay(eps: &[Endpoint]) -> ! {
    // SAFETY: only syscalls; every path ends in _exit.
    unsafe {
        // Children are reaped by the kernel.
        libc::signal(libc::SIGCHLD, libc::SIG_IGN);
        let mut keep: Vec<libc::c_int> = eps.iter().map(|e| e.listener).collect();
        keep.sort_unstable();
        crate::sys::close_all_except(&keep);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        let mut fds: Vec<libc::pollfd> = eps
            .iter()
            .map(|e| libc::pollfd {
                fd: e.listener,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        loop {
            if libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                libc::_exit(1);
            }
            for (i, p) in fds.iter_mut().enumerate() {
                if p.revents & libc::POLLIN == 0 {
                    continue;
                }
                p.revents = 0;
                let c = libc::accept4(
                    p.fd,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                );
                if c < 0 {
                    continue;
                }
                if libc::fork() == 0 {
                    copy_conn(c, &eps[i].target);
                }
                libc::close(c);
            }
        }
    }
}

/// In a per-connection child: connects to the unix socket and copies both
/// ways until both directions are closed. Never returns.
///
/// # Safety
/// Only syscalls on fds this process owns.
unsafe fn copy_conn(client: libc::c_int, target: &CString) -> ! {
    let up = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    let mut addr: libc::sockaddr_un = std::mem::zeroed();
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let path = target.as_bytes();
    if up < 0 || path.len() >= addr.sun_path.len() {
        libc::_exit(1);
    }
    for (i, b) in path.iter().enumerate() {
        addr.sun_path[i] = *b as libc::c_char;
    }
    if libc::connect(
        up,
        (&addr as *const libc::sockaddr_un).cast(),
        std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
    ) != 0
    {
        libc::_exit(1);
    }
    let mut open = [true, true];
    let mut buf = [0u8; 64 * 1024];
    while open[0] || open[1] {
        let mut p = [
            libc::pollfd {
                fd: if open[0] { client } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if open[1] { up } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if libc::poll(p.as_mut_ptr(), 2, -1) < 0 {
            if *libc::__errno_location() == libc::EINTR {
                continue;
            }
            break;
        }
        for (i, (from, to)) in [(client, up), (up, client)].into_iter().enumerate() {
            if !open[i] || p[i].revents == 0 {
                continue;
            }
            let n = libc::read(from, buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                open[i] = false;
                libc::shutdown(to, libc::SHUT_WR);
                continue;
            }
            if !write_all(to, &buf[..n as usize]) {
                libc::_exit(0);
            }
        }
    }
    libc::_exit(0)
}

/// # Safety
/// `fd` must be an open fd.
unsafe fn write_all(fd: libc::c_int, mut b: &[u8]) -> bool {
    while !b.is_empty() {
        let n = libc::write(fd, b.as_ptr().cast(), b.len());
        if n < 0 {
            if *libc::__errno_location() == libc::EINTR {
                continue;
            }
            return false;
        }
        b = &b[n as usize..];
    }
    true
}
