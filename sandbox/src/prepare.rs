//! Makes the writable directories usable by the unprivileged uid commands
//! run as when the harness is root, and finds hard links that would let that
//! uid reach files outside the workspace. Landlock checks the path a file is
//! opened by, so a pre-existing hard link inside the workspace to an outside
//! inode is writable as far as Landlock is concerned: what protects the
//! outside file is that `prepare` never hands such an inode to uid 65534 and
//! refuses when its mode lets anyone write it.

use crate::error::SandboxError;
use crate::policy::{Level, Policy};
use crate::probe::probe;
use crate::sys::SANDBOX_ID;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Gives the writable directories (recursively, without following
/// symlinks) to the sandbox uid/gid and checks that every policy path is
/// reachable by it. A no-op for Level::None and for non-root harnesses.
/// Call before each spawn: the harness may have written files in between.
pub fn prepare(policy: &Policy) -> Result<(), SandboxError> {
    if policy.level == Level::None || !probe().root {
        return Ok(());
    }
    for p in policy.writable.iter().chain(&policy.readable) {
        // Under Level::Full a path below a hidden directory is bound back
        // inside the namespace (the launcher opens it while still root):
        // only the hidden directory's own ancestors must be traversable.
        let hidden = policy
            .hide
            .iter()
            .filter(|h| policy.level == Level::Full && p.starts_with(h))
            .min_by_key(|h| h.components().count());
        match hidden {
            Some(h) => check_traversable(h)?,
            None => check_traversable(p)?,
        }
    }
    for p in &policy.readable {
        check_readable(p)?;
    }
    for dir in &policy.writable {
        give_tree(dir)?;
    }
    Ok(())
}

/// Hands the tree under `dir` to the sandbox uid, race-free: every step is
/// relative to a directory fd opened with `O_NOFOLLOW`, so a process that
/// swaps a directory for a symlink meanwhile makes the walk stop with an
/// error instead of steering a root-run chown outside the tree; links are
/// changed themselves (`AT_SYMLINK_NOFOLLOW`), never their targets. An
/// inode with links outside the tree is left as it is (see
/// [`outside_links`]).
fn give_tree(dir: &Path) -> Result<(), SandboxError> {
    let mut counts: HashMap<(u64, u64), u64> = HashMap::new();
    fd_walk(dir, &mut |_, _, st| {
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR && st.st_nlink > 1 {
            *counts.entry((st.st_dev, st.st_ino)).or_default() += 1;
        }
        Ok(())
    })?;
    fd_walk(dir, &mut |parent, name, st| {
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let inside = counts.get(&(st.st_dev, st.st_ino)).copied().unwrap_or(0);
        if !is_dir && st.st_nlink > 1 && inside < st.st_nlink {
            // Changing this inode's owner would change the outside file's.
            if st.st_mode & 0o002 != 0 {
                return Err(SandboxError::OutsideHardLink(dir.join(name_path(name))));
            }
            return Ok(());
        }
        if st.st_uid == SANDBOX_ID && st.st_gid == SANDBOX_ID {
            return Ok(());
        }
        // SAFETY: valid fd and C string.
        let r = unsafe {
            libc::fchownat(
                parent,
                name.as_ptr(),
                SANDBOX_ID,
                SANDBOX_ID,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r != 0 {
            return Err(SandboxError::Chown {
                path: dir.join(name_path(name)),
                uid: SANDBOX_ID,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    })
}

fn name_path(name: &CStr) -> PathBuf {
    PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes()))
}

type Visit<'a> = dyn FnMut(libc::c_int, &CStr, &libc::stat) -> Result<(), SandboxError> + 'a;

/// Calls `f(parent_fd, name, stat)` for `root` (with its parent's fd) and
/// for everything below it, never following a symlink: directories are
/// entered with `openat(O_NOFOLLOW | O_DIRECTORY)` relative to their
/// parent's fd. An entry that disappears meanwhile is skipped.
fn fd_walk(root: &Path, f: &mut Visit<'_>) -> Result<(), SandboxError> {
    let walk_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SandboxError::Walk { path, source }
    };
    let parent = root.parent().unwrap_or(Path::new("/"));
    let name = root
        .file_name()
        .ok_or_else(|| walk_err(root)(std::io::Error::from_raw_os_error(libc::EINVAL)))?;
    let pfd = open_dir(libc::AT_FDCWD, &cstr(parent.as_os_str().as_bytes()), false)
        .map_err(walk_err(parent))?;
    let cname = cstr(name.as_bytes());
    let st = stat_at(pfd.as_raw_fd(), &cname).map_err(walk_err(root))?;
    f(pfd.as_raw_fd(), &cname, &st)?;
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let fd = open_dir(pfd.as_raw_fd(), &cname, true).map_err(walk_err(root))?;
        walk_below(fd, root, f)?;
    }
    Ok(())
}

fn walk_below(dir: OwnedFd, path: &Path, f: &mut Visit<'_>) -> Result<(), SandboxError> {
    let walk_err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| SandboxError::Walk { path: p, source }
    };
    for name in list_dir(&dir).map_err(walk_err(path))? {
        let child = path.join(name_path(&name));
        let st = match stat_at(dir.as_raw_fd(), &name) {
            Ok(st) => st,
            // Deleted while walking: nothing to hand over.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(walk_err(&child)(e)),
        };
        f(dir.as_raw_fd(), &name, &st)?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            let fd = match open_dir(dir.as_raw_fd(), &name, true) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(walk_err(&child)(e)),
            };
            walk_below(fd, &child, f)?;
        }
    }
    Ok(())
}

fn cstr(b: &[u8]) -> CString {
    CString::new(b).unwrap_or_default()
}

fn open_dir(at: libc::c_int, name: &CStr, nofollow: bool) -> std::io::Result<OwnedFd> {
    let mut flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    if nofollow {
        flags |= libc::O_NOFOLLOW;
    }
    // SAFETY: valid fd and C string; the fd is owned at once.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn stat_at(at: libc::c_int, name: &CStr) -> std::io::Result<libc::stat> {
    // SAFETY: valid fd, C string and out-pointer.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstatat(at, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(st)
    }
}

/// The entry names of an open directory (not `.` and `..`).
fn list_dir(dir: &OwnedFd) -> std::io::Result<Vec<CString>> {
    // fdopendir takes ownership of the fd it is given: give it a duplicate.
    // SAFETY: dup of a valid fd.
    let dup = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: dup is a valid directory fd we own; closedir closes it.
    let d = unsafe { libc::fdopendir(dup) };
    if d.is_null() {
        // SAFETY: closing our own dup.
        unsafe { libc::close(dup) };
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    loop {
        // SAFETY: d is a valid DIR*; the entry is read before the next call.
        let ent = unsafe { libc::readdir(d) };
        if ent.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            out.push(name.to_owned());
        }
    }
    // SAFETY: d came from fdopendir.
    unsafe { libc::closedir(d) };
    Ok(out)
}

/// Every ancestor of `target` must let "others" search it, or the dropped uid cannot reach it.
fn check_traversable(target: &Path) -> Result<(), SandboxError> {
    let mut cur = target.parent();
    while let Some(dir) = cur {
        if let Ok(meta) = std::fs::metadata(dir) {
            let mode = meta.permissions().mode();
            let ok = mode & 0o001 != 0 || (meta.uid() == SANDBOX_ID && mode & 0o100 != 0);
            if !ok {
                return Err(SandboxError::NotTraversable {
                    path: dir.to_path_buf(),
                    target: target.to_path_buf(),
                    uid: SANDBOX_ID,
                });
            }
        }
        cur = dir.parent();
    }
    Ok(())
}

/// A readable path must be readable (and, for a directory, searchable) by "others".
fn check_readable(path: &Path) -> Result<(), SandboxError> {
    let Ok(meta) = std::fs::metadata(path) else {
        // A missing path is reported by confine, with the Landlock context.
        return Ok(());
    };
    let mode = meta.permissions().mode();
    let need = if meta.is_dir() { 0o005 } else { 0o004 };
    if mode & need != need && meta.uid() != SANDBOX_ID {
        return Err(SandboxError::NotReadable {
            path: path.to_path_buf(),
            uid: SANDBOX_ID,
        });
    }
    Ok(())
}

fn walk(root: &Path) -> Result<Vec<(PathBuf, std::fs::Metadata)>, SandboxError> {
    let walk_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SandboxError::Walk { path, source }
    };
    let meta = std::fs::symlink_metadata(root).map_err(walk_err(root))?;
    let mut out = vec![(root.to_path_buf(), meta)];
    let mut i = 0;
    while i < out.len() {
        if out[i].1.is_dir() {
            let dir = out[i].0.clone();
            for entry in std::fs::read_dir(&dir).map_err(walk_err(&dir))? {
                let entry = entry.map_err(walk_err(&dir))?;
                let path = entry.path();
                match std::fs::symlink_metadata(&path) {
                    Ok(m) => out.push((path, m)),
                    // Deleted while walking: nothing to hand over.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(SandboxError::Walk { path, source: e }),
                }
            }
        }
        i += 1;
    }
    Ok(out)
}

fn outside_from(entries: &[(PathBuf, std::fs::Metadata)]) -> Vec<PathBuf> {
    let mut seen: HashMap<(u64, u64), u64> = HashMap::new();
    for (_, m) in entries.iter().filter(|(_, m)| !m.is_dir() && m.nlink() > 1) {
        *seen.entry((m.dev(), m.ino())).or_default() += 1;
    }
    entries
        .iter()
        .filter(|(_, m)| !m.is_dir() && m.nlink() > 1)
        .filter(|(_, m)| seen.get(&(m.dev(), m.ino())).copied().unwrap_or(0) < m.nlink())
        .map(|(p, _)| p.clone())
        .collect()
}

/// Files under `dir` that are hard links to an inode with links outside
/// `dir` (link count larger than the links found inside). Writing through
/// them would modify the outside file; `prepare` leaves them owned as they
/// are (so the dropped uid cannot write them unless their mode allows it, in
/// which case `prepare` refuses). Unreadable parts of the tree are skipped.
pub fn outside_links(dir: &Path) -> Vec<PathBuf> {
    match walk(dir) {
        Ok(entries) => outside_from(&entries),
        Err(_) => Vec::new(),
    }
}
