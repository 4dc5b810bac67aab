//! What the command can name (`Level::Full`): in its private mount namespace
//! every directory of `Policy::hide` is covered by an empty, read-only
//! tmpfs, and the policy's own writable and readable paths below it are
//! bound back at their own paths, or at their place (`Policy::places`), a
//! path of the caller's choosing below a hidden directory. Everything else
//! below a hidden directory (other rollouts' workspaces, homes, check
//! copies, proxy sockets) cannot be named at all, so no operation Landlock
//! does not govern (chmod, chown, utime, xattrs, inotify, listing, `..` from
//! the cwd) can reach it; and a placed path is named the same in every run,
//! wherever the host keeps it.
//!
//! The bind sources are opened (`O_PATH`) by the launcher before it drops
//! root, so a hidden directory may be closed to everyone but root (mode
//! 0700); the mounts are made after `unshare`, inside the namespace, where
//! the launcher holds the namespace's capabilities. Landlock's rules, made
//! from the host paths, follow the inodes, so a bind keeps its rights.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::policy::Policy;
use crate::sys::{cvt, note};

/// One path bound into the view: back at its own path below a hidden
/// directory, at its place, or over a read-only bind it lies in.
struct Bind {
    /// Where the command sees it.
    target: CString,
    /// Components between the hidden directory and the target, each a
    /// directory to create in the tmpfs (the last one the mount point);
    /// empty for a path inside an earlier bind, whose mount point is there.
    parents: Vec<CString>,
    /// The detached mount tree to attach there.
    tree: OwnedFd,
    is_dir: bool,
}

/// Everything the mounts need, prepared while the launcher is still root
/// (it may be the only one that can open the sources).
pub(crate) struct View {
    /// Covers and binds, in the order they are made.
    ops: Vec<Op>,
    cwd: Option<CString>,
}

/// One step of the view.
enum Op {
    /// An empty tmpfs over a hidden directory (made read-only at the end).
    Cover(CString),
    Bind(Bind),
}

fn c(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The hidden directories to cover, outer before inner: every outermost
/// one, and an inner one that a policy path holds (a readable `/tmp/build`
/// holding the scratch root `/tmp/build/mass-work-1` is bound back whole
/// below the covered `/tmp`, and would bring the inner directory's real
/// contents, every other rollout's, back with it).
fn covered(policy: &Policy) -> Vec<PathBuf> {
    let mut all = policy.hide.clone();
    all.sort();
    all.dedup();
    let held = |h: &Path| {
        policy
            .writable
            .iter()
            .chain(&policy.readable)
            .any(|p| h.starts_with(p))
    };
    let mut kept: Vec<PathBuf> = Vec::new();
    for h in all {
        let outermost = !kept.iter().any(|k| h.starts_with(k));
        if outermost || held(&h) {
            kept.push(h);
        }
    }
    kept
}

/// A path the view binds: whether writable, and whether it lies inside an
/// earlier bind (then its mount point is already there).
struct Bound {
    path: PathBuf,
    writable: bool,
    nested: bool,
}

/// What the view binds, outer before inner: every placed path, and every
/// other policy path below a hidden directory or a placed path, the
/// outermost only (a path below another comes along with it) except a
/// writable path inside a read-only one, which a read-only bind would make
/// read-only, and a path below a directory `covers` covers again inside
/// the bind. The same path both writable and readable is writable.
fn bound_paths(policy: &Policy, covers: &[PathBuf]) -> Vec<Bound> {
    let placed = |p: &Path| policy.places.iter().any(|pl| pl.path == p);
    let mut all: Vec<(PathBuf, bool)> = policy
        .writable
        .iter()
        .map(|p| (p.clone(), true))
        .chain(policy.readable.iter().map(|p| (p.clone(), false)))
        .filter(|(p, _)| {
            covers.iter().any(|h| p.starts_with(h) && p != h)
                || policy.places.iter().any(|pl| p.starts_with(&pl.path))
        })
        .collect();
    // By where the command sees them: an outer bind before what lies in it.
    all.sort_by_key(|(p, w)| (policy.seen(p), !w));
    let mut kept: Vec<Bound> = Vec::new();
    for (path, writable) in all {
        if kept.iter().any(|k| k.path == path) {
            continue;
        }
        let outer = kept
            .iter()
            .filter(|k| path.starts_with(&k.path))
            .max_by_key(|k| k.path.components().count());
        // A cover between the outer bind and the path hides it again.
        let recovered = |o: &Bound| {
            covers
                .iter()
                .any(|h| h.starts_with(&o.path) && path.starts_with(h) && path != *h)
        };
        let nested = match outer {
            _ if placed(&path) => false,
            Some(o) if recovered(o) => false,
            Some(o) if o.writable || !writable => continue,
            Some(_) => true,
            None => false,
        };
        kept.push(Bound {
            path,
            writable,
            nested,
        });
    }
    kept
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const AT_EMPTY_PATH: libc::c_uint = 0x1000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 1;

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A detached copy of the mount tree at `path` (chosen by the harness, not
/// the command): made before the namespaces exist, while the launcher is
/// still root, and attached inside the new mount namespace later (a bind
/// mount cannot take its source from another namespace, and the launcher
/// may not be able to reach the path by then). Read-only when `writable`
/// is false. Also whether it is a directory.
fn clone_tree(path: &CString, writable: bool) -> io::Result<(OwnedFd, bool)> {
    // SAFETY: valid C string; the fd is owned immediately.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint,
        ) as libc::c_int
    })?;
    // SAFETY: just opened, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if !writable {
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        // SAFETY: valid fd, empty path, and a mount_attr of the size given.
        cvt(unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                fd.as_raw_fd(),
                c"".as_ptr(),
                AT_EMPTY_PATH | AT_RECURSIVE,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            ) as libc::c_int
        })?;
    }
    // SAFETY: valid fd and out-pointer.
    let st = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        cvt(libc::fstat(fd.as_raw_fd(), &mut st))?;
        st
    };
    Ok((fd, st.st_mode & libc::S_IFMT == libc::S_IFDIR))
}

impl View {
    /// Prepares the view of `policy` (nothing to do when it hides nothing).
    pub(crate) fn plan(policy: &Policy) -> io::Result<Option<View>> {
        if policy.hide.is_empty() {
            return Ok(None);
        }
        let covers: Vec<PathBuf> = covered(policy);
        // (target, 0 bind / 1 cover: a cover goes on top of a bind there)
        let mut steps: Vec<(PathBuf, u8, Option<Bound>)> =
            covers.iter().map(|h| (policy.seen(h), 1, None)).collect();
        for b in bound_paths(policy, &covers) {
            steps.push((policy.seen(&b.path), 0, Some(b)));
        }
        steps.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        let targets: Vec<PathBuf> = steps
            .iter()
            .filter(|s| s.1 == 1)
            .map(|s| s.0.clone())
            .collect();
        let mut ops = Vec::new();
        for (target, _, bound) in steps {
            let Some(b) = bound else {
                ops.push(Op::Cover(c(&target)?));
                continue;
            };
            let (tree, is_dir) = clone_tree(&c(&b.path)?, b.writable)?;
            let parents = if b.nested {
                Vec::new()
            } else {
                mount_point_parents(&targets, &target)?
            };
            ops.push(Op::Bind(Bind {
                target: c(&target)?,
                parents,
                tree,
                is_dir,
            }));
        }
        // Re-entered where the command sees it.
        let cwd = std::env::current_dir()
            .ok()
            .map(|d| c(&policy.seen(&d)))
            .transpose()?;
        Ok(Some(View { ops, cwd }))
    }

    /// Inside the mount namespace (mounts already private): covers each
    /// hidden directory and binds the policy's paths back, then re-enters
    /// the cwd through the new mounts (the old cwd would lead `..` to the
    /// hidden directory's real contents).
    pub(crate) fn apply(&self) -> io::Result<()> {
        let fail = |what: &'static [u8]| {
            move |e: io::Error| {
                note(what);
                note(format!("  ({e})\n").as_bytes());
                e
            }
        };
        for op in &self.ops {
            match op {
                Op::Cover(h) => mount(
                    c"tmpfs",
                    h,
                    c"tmpfs",
                    libc::MS_NOSUID | libc::MS_NODEV,
                    c"mode=0755,size=64k",
                )
                .map_err(fail(b"sandbox: covering a hidden directory failed\n"))?,
                Op::Bind(b) => {
                    b.make_mount_point().map_err(fail(
                        b"sandbox: making a mount point in a hidden directory failed\n",
                    ))?;
                    b.bind().map_err(fail(
                        b"sandbox: binding a path back into a hidden directory failed\n",
                    ))?;
                }
            }
        }
        for op in &self.ops {
            if let Op::Cover(h) = op {
                let flags = libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
                mount_raw(None, h, None, flags, None).map_err(fail(
                    b"sandbox: making a hidden directory read-only failed\n",
                ))?;
            }
        }
        if let Some(d) = &self.cwd {
            // SAFETY: valid C string.
            cvt(unsafe { libc::chdir(d.as_ptr()) })
                .map_err(fail(b"sandbox: re-entering the working directory failed\n"))?;
        }
        Ok(())
    }
}

/// The directories to make for a mount point at `target`: each component
/// below the innermost covered directory holding it.
fn mount_point_parents(covers: &[PathBuf], target: &Path) -> io::Result<Vec<CString>> {
    let h = covers
        .iter()
        .filter(|h| target.starts_with(h) && target != h.as_path())
        .max_by_key(|h| h.components().count())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let rel = target
        .strip_prefix(h)
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut cur = h.clone();
    let mut parents = Vec::new();
    for comp in rel.components() {
        cur.push(comp);
        parents.push(c(&cur)?);
    }
    Ok(parents)
}

impl Bind {
    fn make_mount_point(&self) -> io::Result<()> {
        let last = self.parents.len().saturating_sub(1);
        for (i, p) in self.parents.iter().enumerate() {
            let r = if i < last || self.is_dir {
                // SAFETY: valid C string.
                unsafe { libc::mkdir(p.as_ptr(), 0o755) }
            } else {
                // SAFETY: valid C string; the fd is closed at once.
                unsafe {
                    let fd = libc::open(
                        p.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd >= 0 {
                        libc::close(fd);
                        0
                    } else {
                        -1
                    }
                }
            };
            if r != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn bind(&self) -> io::Result<()> {
        // SAFETY: valid fd and C strings.
        cvt(unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                self.tree.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                self.target.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            ) as libc::c_int
        })
        .map(|_| ())
    }
}

fn mount(
    src: &std::ffi::CStr,
    target: &CString,
    fstype: &std::ffi::CStr,
    flags: libc::c_ulong,
    data: &std::ffi::CStr,
) -> io::Result<()> {
    // SAFETY: valid C strings.
    cvt(unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    })
    .map(|_| ())
}

fn mount_raw(
    src: Option<&CString>,
    target: &CString,
    fstype: Option<&CString>,
    flags: libc::c_ulong,
    data: Option<&CString>,
) -> io::Result<()> {
    let p = |o: Option<&CString>| o.map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: valid C strings or nulls, as mount(2) documents for these flags.
    cvt(unsafe {
        libc::mount(
            p(src),
            target.as_ptr(),
            p(fstype),
            flags,
            data.map_or(std::ptr::null(), |s| s.as_ptr().cast()),
        )
    })
    .map(|_| ())
}
