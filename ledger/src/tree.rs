//! Trees: directory snapshots as sorted lists of (path, kind, mode, blob id).
//!
//! A tree is flat (every entry carries its full relative path) and canonical:
//! entries are sorted by path bytes, unique, and every path is relative,
//! `/`-separated, free of `.`/`..`/empty components, and never nested under a
//! file or symlink entry. Those rules are checked when a tree is built and again
//! whenever one is read, so a checkout can never be steered outside its target
//! directory. Symlinks are stored as links (their target is the blob) and are
//! never followed, neither when snapshotting nor when materialising.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rkyv::rancor;

use crate::error::{LedgerError, Result};
use crate::id::Id;

/// What a tree entry is. Discriminants are part of the format.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash,
)]
#[rkyv(derive(Debug))]
pub enum EntryKind {
    File,
    Symlink,
    Dir,
}

impl EntryKind {
    pub fn name(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Symlink => "symlink",
            EntryKind::Dir => "dir",
        }
    }
}

/// One path in a snapshot.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub path: String,
    pub kind: EntryKind,
    /// Permission bits for files and dirs (`0o777`: snapshots never record
    /// setuid, setgid or sticky bits, and checkouts mask them off); `0o777`
    /// for symlinks.
    pub mode: u32,
    /// Content length in bytes (the link target's length for symlinks, 0 for dirs).
    pub size: u64,
    /// The blob holding the content or link target; all zeros for dirs.
    pub blob: [u8; 32],
}

impl TreeEntry {
    pub fn blob_id(&self) -> Option<Id> {
        match self.kind {
            EntryKind::Dir => None,
            _ => Some(Id(self.blob)),
        }
    }
}

/// A validated, canonical snapshot.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq, Eq, Default,
)]
pub struct Tree {
    pub entries: Vec<TreeEntry>,
}

impl Tree {
    /// Builds a tree from entries in any order; fails on invalid or duplicate paths.
    pub fn new(mut entries: Vec<TreeEntry>) -> Result<Tree> {
        entries.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        let t = Tree { entries };
        t.validate()?;
        Ok(t)
    }

    /// Checks the canonical-form rules listed in the module docs.
    pub fn validate(&self) -> Result<()> {
        let mut prev: Option<&TreeEntry> = None;
        // Paths of file/symlink entries: nothing may live beneath them.
        let mut leaves: Vec<&str> = Vec::new();
        for e in &self.entries {
            check_path(&e.path)?;
            if let Some(p) = prev {
                if p.path.as_bytes() >= e.path.as_bytes() {
                    return Err(LedgerError::BadPath {
                        path: e.path.clone(),
                        reason: if p.path == e.path {
                            "duplicate entry".into()
                        } else {
                            "entries are not sorted".into()
                        },
                    });
                }
            }
            for leaf in &leaves {
                if e.path.len() > leaf.len()
                    && e.path.starts_with(leaf)
                    && e.path.as_bytes()[leaf.len()] == b'/'
                {
                    return Err(LedgerError::BadPath {
                        path: e.path.clone(),
                        reason: format!("nested under non-directory entry {leaf:?}"),
                    });
                }
            }
            if e.kind != EntryKind::Dir {
                leaves.push(&e.path);
            }
            if e.kind == EntryKind::Dir && e.blob != [0; 32] {
                return Err(LedgerError::BadPath {
                    path: e.path.clone(),
                    reason: "directory entry with a blob".into(),
                });
            }
            prev = Some(e);
        }
        Ok(())
    }

    /// The canonical bytes that are hashed and stored.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        rkyv::to_bytes::<rancor::Error>(self)
            .map(|v| v.to_vec())
            .map_err(|e| LedgerError::Index {
                detail: format!("cannot encode tree: {e}"),
            })
    }

    /// Decodes (bytecheck-validated) and re-checks the canonical-form rules.
    pub fn from_bytes(id: &Id, bytes: &[u8]) -> Result<Tree> {
        let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
        aligned.extend_from_slice(bytes);
        let t = rkyv::from_bytes::<Tree, rancor::Error>(&aligned).map_err(|e| {
            LedgerError::Corruption {
                id: *id,
                detail: format!("tree fails validation: {e}"),
            }
        })?;
        t.validate().map_err(|e| LedgerError::Corruption {
            id: *id,
            detail: format!("tree is not canonical: {e}"),
        })?;
        Ok(t)
    }

    /// Total bytes of file contents.
    pub fn content_bytes(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.kind == EntryKind::File)
            .map(|e| e.size)
            .sum()
    }

    pub fn get(&self, path: &str) -> Option<&TreeEntry> {
        self.entries
            .binary_search_by(|e| e.path.as_bytes().cmp(path.as_bytes()))
            .ok()
            .map(|i| &self.entries[i])
    }
}

/// Validates one tree path.
pub fn check_path(path: &str) -> Result<()> {
    let bad = |reason: &str| LedgerError::BadPath {
        path: path.to_string(),
        reason: reason.to_string(),
    };
    if path.is_empty() {
        return Err(bad("empty path"));
    }
    if path.starts_with('/') {
        return Err(bad("absolute path"));
    }
    if path.contains('\0') {
        return Err(bad("contains NUL"));
    }
    if path.contains('\\') {
        return Err(bad("contains a backslash"));
    }
    for c in path.split('/') {
        match c {
            "" => return Err(bad("empty component")),
            "." | ".." => return Err(bad("'.' or '..' component")),
            _ => {}
        }
    }
    Ok(())
}

/// One file found by [`walk`]: where it is and what goes into the tree.
pub struct WalkItem {
    pub rel: String,
    pub abs: PathBuf,
    pub kind: EntryKind,
    pub mode: u32,
}

/// `struct open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

/// Opens `rel` below the directory `root` without following any symlink on
/// the way and without leaving `root` (openat2 with RESOLVE_BENEATH and
/// RESOLVE_NO_SYMLINKS), non-blocking, so that a path a process swapped for
/// a symlink or a FIFO between the walk and the read is an error, never a
/// read of another file or a hang.
fn open_beneath(root: &Path, rel: &str) -> std::io::Result<fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let dir = fs::File::open(root)?;
    let c =
        std::ffi::CString::new(rel).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64,
        mode: 0,
        resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: valid fd, C string and open_how of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd owned by nobody else.
    Ok(unsafe { fs::File::from_raw_fd(fd as i32) })
}

/// How much a snapshot may hold: entries and bytes of file content. The
/// walk stops with an error as soon as either is exceeded, before any
/// content is read, so a workspace that floods its disk cannot flood the
/// harness's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLimits {
    pub max_entries: u64,
    pub max_bytes: u64,
}

impl Default for SnapshotLimits {
    /// 100,000 entries and 1 GiB.
    fn default() -> Self {
        SnapshotLimits {
            max_entries: 100_000,
            max_bytes: 1 << 30,
        }
    }
}

/// What is left of the limits during a walk.
struct Budget {
    limits: SnapshotLimits,
    entries: u64,
    bytes: u64,
}

impl Budget {
    fn take(&mut self, path: &Path, bytes: u64) -> Result<()> {
        self.entries += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        let over = if self.entries > self.limits.max_entries {
            Some(format!("more than {} entries", self.limits.max_entries))
        } else if self.bytes > self.limits.max_bytes {
            Some(format!(
                "more than {} bytes of file content",
                self.limits.max_bytes
            ))
        } else {
            None
        };
        match over {
            Some(what) => Err(LedgerError::Snapshot {
                path: path.to_path_buf(),
                reason: format!(
                    "the directory holds {what} (the snapshot limit); nothing was stored"
                ),
            }),
            None => Ok(()),
        }
    }
}

/// Lists everything under `root` (not following symlinks), sorted by path.
pub fn walk(root: &Path) -> Result<Vec<WalkItem>> {
    walk_limited(root, SnapshotLimits::default())
}

/// [`walk`] within `limits`.
pub fn walk_limited(root: &Path, limits: SnapshotLimits) -> Result<Vec<WalkItem>> {
    let meta = fs::symlink_metadata(root).map_err(|e| LedgerError::Snapshot {
        path: root.to_path_buf(),
        reason: e.to_string(),
    })?;
    if !meta.is_dir() {
        return Err(LedgerError::Snapshot {
            path: root.to_path_buf(),
            reason: "not a directory".into(),
        });
    }
    let mut out = Vec::new();
    let mut budget = Budget {
        limits,
        entries: 0,
        bytes: 0,
    };
    walk_into(root, "", &mut out, &mut budget)?;
    out.sort_by(|a, b| a.rel.as_bytes().cmp(b.rel.as_bytes()));
    Ok(out)
}

fn walk_into(dir: &Path, prefix: &str, out: &mut Vec<WalkItem>, budget: &mut Budget) -> Result<()> {
    let snap_err = |path: &Path, reason: String| LedgerError::Snapshot {
        path: path.to_path_buf(),
        reason,
    };
    let rd = fs::read_dir(dir).map_err(|e| snap_err(dir, e.to_string()))?;
    for ent in rd {
        let ent = ent.map_err(|e| snap_err(dir, e.to_string()))?;
        let abs = ent.path();
        let name = ent
            .file_name()
            .into_string()
            .map_err(|n| snap_err(&abs, format!("file name {n:?} is not UTF-8")))?;
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        check_path(&rel)?;
        let md = fs::symlink_metadata(&abs).map_err(|e| snap_err(&abs, e.to_string()))?;
        let ft = md.file_type();
        // Permission bits only: no setuid, setgid or sticky bit is ever
        // recorded (a checkout as root would recreate them).
        let mode = md.permissions().mode() & 0o777;
        budget.take(&abs, if ft.is_file() { md.len() } else { 0 })?;
        if ft.is_symlink() {
            out.push(WalkItem {
                rel,
                abs,
                kind: EntryKind::Symlink,
                mode: 0o777,
            });
        } else if ft.is_dir() {
            out.push(WalkItem {
                rel: rel.clone(),
                abs: abs.clone(),
                kind: EntryKind::Dir,
                mode,
            });
            walk_into(&abs, &rel, out, budget)?;
        } else if ft.is_file() {
            out.push(WalkItem {
                rel,
                abs,
                kind: EntryKind::File,
                mode,
            });
        } else {
            return Err(snap_err(
                &abs,
                "special file (fifo, socket or device) cannot be snapshotted".into(),
            ));
        }
    }
    Ok(())
}

/// The tree of `dir` within `limits`: the walk and the entries of every
/// snapshot (`Batch::snapshot_dir`, and `mass import sakana`'s workspaces),
/// in one place so both give the same tree for the same directory. Each
/// file's bytes or link's target is handed to `put`, which stores it and
/// returns its blob id and the length of what it stored (the entry's
/// size: a caller that records other bytes than the file's, an import
/// that scrubs a credential, records their length).
pub fn snapshot_with(
    dir: &Path,
    limits: SnapshotLimits,
    mut put: impl FnMut(&WalkItem, Vec<u8>) -> Result<(Id, u64)>,
) -> Result<Tree> {
    let mut entries = Vec::new();
    for item in walk_limited(dir, limits)? {
        let (blob, size) = match item.kind {
            EntryKind::Dir => ([0u8; 32], 0),
            _ => {
                let content = read_item_beneath(dir, &item)?;
                let (id, size) = put(&item, content)?;
                (id.0, size)
            }
        };
        entries.push(TreeEntry {
            path: item.rel,
            kind: item.kind,
            mode: item.mode,
            size,
            blob,
        });
    }
    Tree::new(entries)
}

/// Reads the content a [`WalkItem`] contributes: file bytes or the link
/// target. A file is opened below `root` without following symlinks and
/// must still be a regular file (see [`open_beneath`]).
pub fn read_item_beneath(root: &Path, item: &WalkItem) -> Result<Vec<u8>> {
    if item.kind != EntryKind::File {
        return read_item(item);
    }
    let res = open_beneath(root, &item.rel).and_then(|mut f| {
        let md = f.metadata()?;
        if !md.is_file() {
            return Err(std::io::Error::other(
                "is no longer a regular file (it changed while the directory was snapshotted)",
            ));
        }
        let mut buf = Vec::with_capacity(md.len() as usize);
        std::io::Read::read_to_end(&mut f, &mut buf)?;
        Ok(buf)
    });
    res.map_err(|e| LedgerError::Snapshot {
        path: item.abs.clone(),
        reason: e.to_string(),
    })
}

/// Reads the content a [`WalkItem`] contributes: file bytes or the link target.
pub fn read_item(item: &WalkItem) -> Result<Vec<u8>> {
    let res = match item.kind {
        EntryKind::File => fs::read(&item.abs),
        EntryKind::Symlink => {
            fs::read_link(&item.abs).map(|t| t.into_os_string().into_encoded_bytes())
        }
        EntryKind::Dir => Ok(Vec::new()),
    };
    res.map_err(|e| LedgerError::Snapshot {
        path: item.abs.clone(),
        reason: e.to_string(),
    })
}

/// Prepares `dest` for a checkout: it must be missing or an empty directory.
pub fn prepare_checkout_dir(dest: &Path) -> Result<()> {
    let err = |reason: String| LedgerError::Checkout {
        path: dest.to_path_buf(),
        reason,
    };
    match fs::symlink_metadata(dest) {
        Ok(md) if md.is_dir() => {
            let mut rd = fs::read_dir(dest).map_err(|e| err(e.to_string()))?;
            if rd.next().is_some() {
                return Err(err("directory is not empty".into()));
            }
            Ok(())
        }
        Ok(_) => Err(err("exists and is not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(dest).map_err(|e| err(e.to_string()))
        }
        Err(e) => Err(err(e.to_string())),
    }
}

/// Writes one entry below `dest` (which was prepared empty). Files are created
/// with `O_EXCL | O_NOFOLLOW`, so an unexpected existing path or link is an error
/// rather than something written through.
pub fn materialise_entry(dest: &Path, e: &TreeEntry, content: &[u8]) -> Result<()> {
    let target = dest.join(&e.path);
    let err = |reason: String| LedgerError::Checkout {
        path: target.clone(),
        reason,
    };
    match e.kind {
        EntryKind::Dir => fs::create_dir(&target).map_err(|x| err(x.to_string())),
        EntryKind::File => {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .mode(0o600)
                .open(&target)
                .map_err(|x| err(x.to_string()))?;
            f.write_all(content).map_err(|x| err(x.to_string()))?;
            // Permission bits only, whatever a stored tree says: a checkout
            // (often as root) never makes a setuid or setgid file.
            f.set_permissions(fs::Permissions::from_mode(e.mode & 0o777))
                .map_err(|x| err(x.to_string()))
        }
        EntryKind::Symlink => {
            use std::os::unix::ffi::OsStrExt;
            let t = std::ffi::OsStr::from_bytes(content);
            std::os::unix::fs::symlink(t, &target).map_err(|x| err(x.to_string()))
        }
    }
}

/// Applies directory modes after all content is written (deepest first), so a
/// read-only directory does not block writing its own children.
pub fn finish_checkout(dest: &Path, tree: &Tree) -> Result<()> {
    for e in tree
        .entries
        .iter()
        .rev()
        .filter(|e| e.kind == EntryKind::Dir)
    {
        let p = dest.join(&e.path);
        fs::set_permissions(&p, fs::Permissions::from_mode(e.mode & 0o777)).map_err(|x| {
            LedgerError::Checkout {
                path: p.clone(),
                reason: x.to_string(),
            }
        })?;
    }
    Ok(())
}

/// How a path differs between two trees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Added(TreeEntry),
    Removed(TreeEntry),
    Modified { old: TreeEntry, new: TreeEntry },
}

impl Change {
    pub fn path(&self) -> &str {
        match self {
            Change::Added(e) | Change::Removed(e) => &e.path,
            Change::Modified { new, .. } => &new.path,
        }
    }

    pub fn letter(&self) -> char {
        match self {
            Change::Added(_) => 'A',
            Change::Removed(_) => 'D',
            Change::Modified { .. } => 'M',
        }
    }
}

/// Lists added, removed and modified paths (content, kind or mode), sorted by path.
pub fn diff(a: &Tree, b: &Tree) -> Vec<Change> {
    let mut by_path: BTreeMap<&[u8], (Option<&TreeEntry>, Option<&TreeEntry>)> = BTreeMap::new();
    for e in &a.entries {
        by_path.entry(e.path.as_bytes()).or_default().0 = Some(e);
    }
    for e in &b.entries {
        by_path.entry(e.path.as_bytes()).or_default().1 = Some(e);
    }
    let mut out = Vec::new();
    for (_, pair) in by_path {
        match pair {
            (Some(o), None) => out.push(Change::Removed(o.clone())),
            (None, Some(n)) => out.push(Change::Added(n.clone())),
            (Some(o), Some(n)) if o != n => out.push(Change::Modified {
                old: o.clone(),
                new: n.clone(),
            }),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> TreeEntry {
        TreeEntry {
            path: path.into(),
            kind: EntryKind::File,
            mode: 0o644,
            size: 0,
            blob: [1; 32],
        }
    }

    #[test]
    fn rejects_escaping_paths() {
        for p in ["", "/etc/passwd", "a/../b", "..", "a//b", "./a", "a/"] {
            assert!(check_path(p).is_err(), "{p:?} accepted");
        }
        check_path("a/b.txt").unwrap();
    }

    #[test]
    fn rejects_entries_nested_under_a_link() {
        let mut link = file("a");
        link.kind = EntryKind::Symlink;
        let err = Tree::new(vec![link, file("a/passwd")]).unwrap_err();
        assert!(
            err.to_string().contains("nested under non-directory"),
            "{err}"
        );
    }

    #[test]
    fn rejects_duplicates() {
        assert!(Tree::new(vec![file("x"), file("x")]).is_err());
    }

    #[test]
    fn diff_reports_each_kind_of_change() {
        let a = Tree::new(vec![file("keep"), file("gone"), file("edit")]).unwrap();
        let mut edited = file("edit");
        edited.blob = [2; 32];
        let b = Tree::new(vec![file("keep"), edited, file("new")]).unwrap();
        let changes = diff(&a, &b);
        let d: Vec<(char, &str)> = changes.iter().map(|c| (c.letter(), c.path())).collect();
        assert_eq!(d, vec![('M', "edit"), ('D', "gone"), ('A', "new")]);
    }
}
