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
use std::collections::{HashMap, HashSet};
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
        check_traversable(p)?;
    }
    for p in &policy.readable {
        check_readable(p)?;
    }
    for dir in &policy.writable {
        let entries = walk(dir)?;
        let outside: HashSet<PathBuf> = outside_from(&entries).into_iter().collect();
        for (path, meta) in &entries {
            if outside.contains(path) {
                // Changing this inode's owner would change the outside file's.
                if meta.mode() & 0o002 != 0 {
                    return Err(SandboxError::OutsideHardLink(path.clone()));
                }
                continue;
            }
            if meta.uid() != SANDBOX_ID || meta.gid() != SANDBOX_ID {
                std::os::unix::fs::lchown(path, Some(SANDBOX_ID), Some(SANDBOX_ID)).map_err(
                    |source| SandboxError::Chown {
                        path: path.clone(),
                        uid: SANDBOX_ID,
                        source,
                    },
                )?;
            }
        }
    }
    Ok(())
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
