//! The file tools (`read_file`, `write_file`, `list_files`) and the path
//! resolution under them: every path is resolved component by component
//! without ever following a symlink out of the workspace root, and writes
//! never go through a symlink or into an existing inode.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use super::{capped_text, ToolError, Workspace, LIST_CAP};

/// Symlink expansions allowed while resolving one path (the kernel's own
/// limit), so a loop `a -> b -> a` ends in an error instead of spinning.
const MAX_SYMLINKS: usize = 40;

impl Workspace {
    /// Resolves a workspace-relative path to a real path inside the root.
    /// See [`Workspace::resolve_in`] for the rules.
    pub fn resolve(&self, rel: &str) -> Result<PathBuf, ToolError> {
        self.resolve_in("resolve", rel)
    }

    /// Resolves `rel` component by component, the way the kernel would, but
    /// checking each step: absolute paths, NUL bytes, `..` above the root and
    /// symlinks whose target lies outside the root are refused. Symlinks
    /// inside the root are followed (their targets are resolved by the same
    /// rules), so the result contains no symlink and every step stayed inside
    /// the root; it never touches anything outside. Components that do not
    /// exist yet are taken as they are (they cannot be symlinks), so a path to
    /// be written resolves through its deepest existing ancestor. An empty
    /// path or `.` is the root itself.
    fn resolve_in(&self, tool: &'static str, rel: &str) -> Result<PathBuf, ToolError> {
        let invalid = |reason: &str| ToolError::InvalidPath {
            tool,
            path: rel.to_owned(),
            reason: reason.to_owned(),
        };
        let escape = |reason: String| ToolError::Escape {
            tool,
            path: rel.to_owned(),
            reason,
        };
        if rel.contains('\0') {
            return Err(invalid("contains a NUL byte"));
        }
        let path = Path::new(rel);
        if path.has_root() {
            return Err(invalid(
                "absolute paths are not allowed; use a path relative to the workspace root",
            ));
        }
        // Components still to walk, last one first so `pop` yields the next.
        let mut pending: Vec<OsString> = components_of(path);
        pending.reverse();
        let mut cur = self.root.clone();
        let mut expansions = 0usize;
        // The last symlink expanded, to explain an escape found after it.
        let mut via: Option<String> = None;
        while let Some(comp) = pending.pop() {
            if comp == "." {
                continue;
            }
            if comp == ".." {
                if cur == self.root {
                    return Err(escape(match &via {
                        Some(link) => {
                            format!("the symlink {link:?} leads above the workspace root")
                        }
                        None => "`..` leads above the workspace root".to_owned(),
                    }));
                }
                // `cur` contains no symlink, so its lexical parent is its real parent.
                cur.pop();
                continue;
            }
            let next = cur.join(&comp);
            match fs::symlink_metadata(&next) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    expansions += 1;
                    if expansions > MAX_SYMLINKS {
                        return Err(invalid("too many levels of symbolic links"));
                    }
                    let link = self.display(&next);
                    let target = fs::read_link(&next).map_err(|source| ToolError::Io {
                        tool,
                        op: "read the symlink",
                        path: link.clone(),
                        source,
                    })?;
                    let rest = if target.has_root() {
                        // An absolute target is allowed only if it names a
                        // place under the root; the remainder is walked from
                        // the root so `..` inside it is still checked.
                        match target.strip_prefix(&self.root) {
                            Ok(rest) => {
                                cur = self.root.clone();
                                rest.to_path_buf()
                            }
                            Err(_) => {
                                return Err(escape(format!(
                                    "the symlink {link:?} points to {}, outside the workspace",
                                    target.display()
                                )))
                            }
                        }
                    } else {
                        target
                    };
                    let mut parts = components_of(&rest);
                    parts.reverse();
                    pending.extend(parts);
                    via = Some(link);
                }
                Ok(_) => cur = next,
                Err(e) if e.kind() == io::ErrorKind::NotFound => cur = next,
                Err(source) => {
                    return Err(ToolError::Io {
                        tool,
                        op: "resolve",
                        path: rel.to_owned(),
                        source,
                    })
                }
            }
        }
        Ok(cur)
    }

    /// A real path under the root, as the model should write it.
    fn display(&self, real: &Path) -> String {
        match real.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => rel.to_string_lossy().into_owned(),
            Err(_) => real.to_string_lossy().into_owned(),
        }
    }

    /// Reads a regular file as lossy UTF-8, keeping at most `max_bytes`
    /// bytes and ending a cut text with `[... truncated: N more bytes]`.
    pub fn read_file(&self, path: &str, max_bytes: usize) -> Result<String, ToolError> {
        const TOOL: &str = "read_file";
        let real = self.resolve_in(TOOL, path)?;
        let io_err = |op: &'static str| {
            move |source: io::Error| ToolError::Io {
                tool: TOOL,
                op,
                path: path.to_owned(),
                source,
            }
        };
        let meta = match fs::metadata(&real) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ToolError::NotFound {
                    tool: TOOL,
                    path: path.to_owned(),
                })
            }
            Err(e) => return Err(io_err("stat")(e)),
        };
        if meta.is_dir() {
            return Err(ToolError::IsDirectory {
                tool: TOOL,
                path: path.to_owned(),
            });
        }
        // A FIFO or device would block or never end.
        if !meta.is_file() {
            return Err(ToolError::NotRegularFile {
                tool: TOOL,
                path: path.to_owned(),
            });
        }
        let file = fs::File::open(&real).map_err(io_err("open"))?;
        let mut kept = Vec::with_capacity(max_bytes.min(meta.len() as usize));
        file.take(max_bytes as u64)
            .read_to_end(&mut kept)
            .map_err(io_err("read"))?;
        // The size may have changed since stat; whatever we hold is a floor.
        let total = meta.len().max(kept.len() as u64);
        Ok(capped_text(&kept, total).0)
    }

    /// Creates or overwrites a file (creating parent directories inside the
    /// root) and returns the number of bytes written. The final component
    /// must not be a symlink: writing through one would modify its target,
    /// which the model may not have meant, even inside the root.
    pub fn write_file(&self, path: &str, content: &str) -> Result<u64, ToolError> {
        const TOOL: &str = "write_file";
        let invalid = |reason: &str| ToolError::InvalidPath {
            tool: TOOL,
            path: path.to_owned(),
            reason: reason.to_owned(),
        };
        let io_err = |op: &'static str| {
            move |source: io::Error| ToolError::Io {
                tool: TOOL,
                op,
                path: path.to_owned(),
                source,
            }
        };
        // Split off the file name as written: `Path` would silently drop a
        // trailing `/` or `.`, turning `dir/` into a write to `dir`.
        let (parent, name) = match path.rfind('/') {
            Some(i) => (&path[..i + 1], &path[i + 1..]),
            None => ("", path),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(invalid("does not name a file"));
        }
        let dir = self.resolve_in(TOOL, parent)?;
        if name.contains('\0') {
            return Err(invalid("contains a NUL byte"));
        }
        let target = dir.join(name);
        let mode = match fs::symlink_metadata(&target) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(ToolError::WriteThroughSymlink {
                    tool: TOOL,
                    path: path.to_owned(),
                })
            }
            Ok(meta) if meta.is_dir() => {
                return Err(ToolError::IsDirectory {
                    tool: TOOL,
                    path: path.to_owned(),
                })
            }
            Ok(meta) if !meta.is_file() => {
                return Err(ToolError::NotRegularFile {
                    tool: TOOL,
                    path: path.to_owned(),
                })
            }
            Ok(meta) => std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0o644,
            Err(e) => return Err(io_err("stat")(e)),
        };
        // `dir` is a real path whose missing tail contains no symlink, so
        // creating it stays inside the root.
        fs::create_dir_all(&dir).map_err(io_err("create the parent directories of"))?;
        if let Some(written) = write_in_place(&target, content).map_err(io_err("write"))? {
            return Ok(written);
        }
        // A new file renamed over the name, never a write into the existing
        // inode: a hard link to a file elsewhere keeps that file unchanged.
        let mut tmp = tempfile::Builder::new()
            .prefix(".mass-write-")
            .tempfile_in(&dir)
            .map_err(io_err("create a file beside"))?;
        tmp.write_all(content.as_bytes()).map_err(io_err("write"))?;
        fs::set_permissions(
            tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )
        .map_err(io_err("set the mode of"))?;
        tmp.persist(&target)
            .map_err(|e| io_err("replace")(e.error))?;
        Ok(content.len() as u64)
    }

    /// Lists a directory recursively (the whole workspace for `None`): paths
    /// relative to the root, sorted component by component (a directory's
    /// contents follow it), directories suffixed with `/`, symlinks shown as
    /// `path -> target` and never followed. At most [`LIST_CAP`] entries,
    /// then a marker line. A path naming a file lists that file.
    pub fn list_files(&self, path: Option<&str>) -> Result<Vec<String>, ToolError> {
        self.list_files_capped(path, LIST_CAP)
    }

    fn list_files_capped(&self, path: Option<&str>, cap: usize) -> Result<Vec<String>, ToolError> {
        const TOOL: &str = "list_files";
        let rel = path.unwrap_or("");
        let start = self.resolve_in(TOOL, rel)?;
        let meta = match fs::symlink_metadata(&start) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ToolError::NotFound {
                    tool: TOOL,
                    path: rel.to_owned(),
                })
            }
            Err(source) => {
                return Err(ToolError::Io {
                    tool: TOOL,
                    op: "stat",
                    path: rel.to_owned(),
                    source,
                })
            }
        };
        if !meta.is_dir() {
            return Ok(vec![self.display(&start)]);
        }
        let top = sorted_children(&start).map_err(|source| ToolError::Io {
            tool: TOOL,
            op: "read the directory",
            path: rel.to_owned(),
            source,
        })?;
        // Depth-first with an explicit stack (no recursion depth to exhaust);
        // children are pushed in reverse so they pop in sorted order.
        let mut stack: Vec<PathBuf> = top.into_iter().rev().collect();
        let mut out = Vec::new();
        while let Some(entry) = stack.pop() {
            if out.len() >= cap {
                out.push(format!(
                    "[... truncated: listing stopped at {cap} entries; list a subdirectory to see more]"
                ));
                break;
            }
            let shown = self.display(&entry);
            let Ok(meta) = fs::symlink_metadata(&entry) else {
                // Vanished between readdir and stat: nothing to show.
                continue;
            };
            let ft = meta.file_type();
            if ft.is_symlink() {
                let target = fs::read_link(&entry)
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| "?".to_owned());
                out.push(format!("{shown} -> {target}"));
            } else if ft.is_dir() {
                match sorted_children(&entry) {
                    Ok(children) => {
                        out.push(format!("{shown}/"));
                        stack.extend(children.into_iter().rev());
                    }
                    Err(e) => out.push(format!("{shown}/ [unreadable: {e}]")),
                }
            } else {
                out.push(shown);
            }
        }
        Ok(out)
    }
}

/// The components of a relative path as strings; `.`/`..` kept as such, any
/// root component dropped (callers have already refused or stripped it).
fn components_of(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::CurDir => Some(OsString::from(".")),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// A directory's entries, sorted by name (bytewise) for a deterministic listing.
fn sorted_children(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut names: Vec<OsString> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

/// Writes `content` into the file at `target` when that needs no new inode
/// and reaches nothing but the name: a regular file with one link (opened
/// without following a symlink, checked on the open descriptor, so a swap
/// after the caller's checks changes nothing), or a name that is free (made
/// with `O_EXCL`, mode 0644 exactly). `None` when neither holds (a hard
/// link, a name taken meanwhile): the caller renames a new file over it.
///
/// Why not always a new file renamed over the name: every rename frees an
/// inode and takes another, and on an ext4 without a journal allocating
/// scans past every recently freed one; a rollout rewriting its files paid
/// that on every `write_file`.
fn write_in_place(target: &Path, content: &str) -> io::Result<Option<u64>> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let flags = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    let mut file = match fs::OpenOptions::new()
        .write(true)
        .custom_flags(flags)
        .open(target)
    {
        Ok(f) => {
            let meta = f.metadata()?;
            if !meta.is_file() || meta.nlink() != 1 {
                return Ok(None);
            }
            return rewrite(&f, meta.mode(), content);
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .custom_flags(flags)
                .open(target)
            {
                Ok(f) => {
                    f.set_permissions(fs::Permissions::from_mode(0o644))?;
                    f
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        // A symlink swapped in after the caller's check (ELOOP), a FIFO
        // without a reader (ENXIO), ...: the rename path decides.
        Err(_) => return Ok(None),
    };
    if let Err(e) = file.write_all(content.as_bytes()) {
        // The name was free and this file is ours: no part of it stays.
        let _ = fs::remove_file(target);
        return Err(e);
    }
    Ok(Some(content.len() as u64))
}

/// Overwrites a lone file with `content`. The space is reserved first
/// (`fallocate`), so a full disk, a quota or a file size limit fails before
/// any old byte changes; a file system that cannot reserve takes the rename
/// path (`None`). Unlike a rename, a program reading the file meanwhile may
/// see old and new bytes mixed. The mode keeps its permission bits only, as
/// the rename path's new file does (no set-id bit survives a rewrite).
fn rewrite(f: &fs::File, mode: u32, content: &str) -> io::Result<Option<u64>> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileExt, PermissionsExt};
    let len = content.len() as libc::off_t;
    if len > 0 {
        // SAFETY: fallocate on an fd this function borrows, no pointers.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) } != 0 {
            let e = io::Error::last_os_error();
            // Cannot reserve here (unsupported, filtered, interrupted):
            // nothing changed yet, so the rename path takes over.
            return match e.raw_os_error() {
                Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINTR | libc::EINVAL) => Ok(None),
                _ => Err(e),
            };
        }
    }
    f.write_all_at(content.as_bytes(), 0)?;
    f.set_len(content.len() as u64)?;
    if mode & 0o7777 != mode & 0o777 {
        f.set_permissions(fs::Permissions::from_mode(mode & 0o777))?;
    }
    Ok(Some(content.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::tests::ws;
    use std::os::unix::fs::{symlink, OpenOptionsExt};

    fn assert_escape(r: Result<impl std::fmt::Debug, ToolError>) {
        match r {
            Err(ToolError::Escape { .. }) | Err(ToolError::InvalidPath { .. }) => {}
            other => panic!("expected refusal, got {other:?}"),
        }
    }

    #[test]
    fn new_requires_an_existing_directory() {
        let (dir, _) = ws();
        assert!(matches!(
            Workspace::new(&dir.path().join("missing")),
            Err(ToolError::Root { .. })
        ));
        fs::write(dir.path().join("f"), "x").unwrap();
        assert!(matches!(
            Workspace::new(&dir.path().join("f")),
            Err(ToolError::RootNotDir { .. })
        ));
        let ws = Workspace::new(dir.path()).unwrap();
        assert_eq!(ws.root(), fs::canonicalize(dir.path()).unwrap());
    }

    #[test]
    fn lexical_escapes_are_refused_everywhere() {
        let (_dir, ws) = ws();
        fs::create_dir(ws.root().join("a")).unwrap();
        for bad in ["../x", "/etc/passwd", "a/../../x", "..", "a/\0b", "./../a"] {
            assert_escape(ws.resolve(bad));
            assert_escape(ws.read_file(bad, 100));
            assert_escape(ws.write_file(&format!("{bad}/f"), "x"));
            assert_escape(ws.list_files(Some(bad)));
        }
        assert_escape(ws.write_file("../x", "x"));
        assert_escape(ws.write_file("/tmp/mass-should-not-exist", "x"));
        assert!(!Path::new("/tmp/mass-should-not-exist").exists());
        // Inside-the-root `..` is fine, including through missing directories.
        assert_eq!(ws.resolve("a/../b").unwrap(), ws.root().join("b"));
        assert_eq!(ws.resolve("new/../b").unwrap(), ws.root().join("b"));
        assert_eq!(ws.resolve("").unwrap(), ws.root());
        assert_eq!(ws.resolve(".").unwrap(), ws.root());
    }

    #[test]
    fn symlinked_directory_outside_is_refused() {
        let (_dir, ws) = ws();
        symlink("/etc", ws.root().join("link")).unwrap();
        assert_escape(ws.read_file("link/passwd", 100));
        assert_escape(ws.read_file("link", 100));
        assert_escape(ws.list_files(Some("link")));
        assert_escape(ws.list_files(Some("link/")));
        assert_escape(ws.resolve("link/passwd"));
        // Writes are tested against a scratch directory standing in for /etc,
        // so a bug cannot clobber the real /etc/passwd.
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("passwd"), "original").unwrap();
        symlink(outside.path(), ws.root().join("out")).unwrap();
        assert_escape(ws.write_file("out/passwd", "pwned"));
        assert_escape(ws.write_file("out/new/file", "pwned"));
        assert_escape(ws.read_file("out/passwd", 100));
        assert_eq!(
            fs::read_to_string(outside.path().join("passwd")).unwrap(),
            "original"
        );
        assert!(!outside.path().join("new").exists());
        // The whole-workspace listing shows the links without following them.
        let listing = ws.list_files(None).unwrap();
        assert!(listing.contains(&"link -> /etc".to_owned()), "{listing:?}");
        assert!(!listing.iter().any(|l| l.contains("passwd")), "{listing:?}");
    }

    #[test]
    fn symlinked_file_outside_is_refused() {
        let (_dir, ws) = ws();
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret.txt");
        fs::write(&secret, "secret").unwrap();
        symlink(&secret, ws.root().join("s")).unwrap();
        assert_escape(ws.read_file("s", 100));
        assert_escape(ws.list_files(Some("s")));
        assert!(ws.write_file("s", "pwned").is_err());
        assert_eq!(fs::read_to_string(&secret).unwrap(), "secret");
        // A relative link climbing out is refused too, however deep.
        fs::create_dir(ws.root().join("sub")).unwrap();
        symlink("../../../../../../etc/passwd", ws.root().join("sub/up")).unwrap();
        assert_escape(ws.read_file("sub/up", 100));
        symlink("..", ws.root().join("sub/parent")).unwrap();
        assert_escape(ws.read_file("sub/parent/../x", 100));
    }

    #[test]
    fn dangling_symlinks_are_refused() {
        let (_dir, ws) = ws();
        symlink("/nonexistent/mass/x", ws.root().join("dangling")).unwrap();
        assert_escape(ws.read_file("dangling", 100));
        assert!(ws.write_file("dangling", "x").is_err());
        assert_escape(ws.write_file("dangling/x", "x"));
        assert_escape(ws.list_files(Some("dangling")));
        // Dangling but aiming inside: reading finds nothing, writing refuses
        // to create the target through the link.
        symlink("missing.txt", ws.root().join("dl")).unwrap();
        assert!(matches!(
            ws.read_file("dl", 100),
            Err(ToolError::NotFound { .. })
        ));
        assert!(matches!(
            ws.write_file("dl", "x"),
            Err(ToolError::WriteThroughSymlink { .. })
        ));
        assert!(!ws.root().join("missing.txt").exists());
    }

    #[test]
    fn symlinks_inside_the_root_are_followed_for_reading() {
        let (_dir, ws) = ws();
        ws.write_file("sub/real.txt", "hello").unwrap();
        symlink("sub/real.txt", ws.root().join("alias")).unwrap();
        symlink("sub", ws.root().join("d")).unwrap();
        let abs = ws.root().join("sub");
        symlink(&abs, ws.root().join("abs")).unwrap();
        assert_eq!(ws.read_file("alias", 100).unwrap(), "hello");
        assert_eq!(ws.read_file("d/real.txt", 100).unwrap(), "hello");
        assert_eq!(ws.read_file("abs/real.txt", 100).unwrap(), "hello");
        // Writing into a directory reached through an in-root link is fine.
        ws.write_file("d/new.txt", "n").unwrap();
        assert_eq!(fs::read_to_string(abs.join("new.txt")).unwrap(), "n");
        // ...but not through a link as the final component.
        assert!(matches!(
            ws.write_file("alias", "x"),
            Err(ToolError::WriteThroughSymlink { .. })
        ));
        assert_eq!(ws.read_file("sub/real.txt", 100).unwrap(), "hello");
    }

    #[test]
    fn symlink_loops_end_in_an_error() {
        let (_dir, ws) = ws();
        symlink("b", ws.root().join("a")).unwrap();
        symlink("a", ws.root().join("b")).unwrap();
        assert!(matches!(
            ws.read_file("a", 100),
            Err(ToolError::InvalidPath { .. })
        ));
        symlink(".", ws.root().join("self")).unwrap();
        assert!(ws.read_file("self/self/self/x", 100).is_err());
    }

    #[test]
    fn write_creates_directories_and_overwrites() {
        let (_dir, ws) = ws();
        assert_eq!(ws.write_file("a/b/c.txt", "héllo").unwrap(), 6);
        assert_eq!(
            fs::read_to_string(ws.root().join("a/b/c.txt")).unwrap(),
            "héllo"
        );
        assert_eq!(ws.write_file("a/b/c.txt", "x").unwrap(), 1);
        assert_eq!(ws.read_file("a/b/c.txt", 100).unwrap(), "x");
        assert!(matches!(
            ws.write_file("a/b", "x"),
            Err(ToolError::IsDirectory { .. })
        ));
        for bad in ["a/", "", ".", "a/..", "a/."] {
            assert!(
                matches!(ws.write_file(bad, "x"), Err(ToolError::InvalidPath { .. })),
                "{bad:?}"
            );
        }
        // A file used as a directory is an I/O error, not a panic.
        assert!(ws.write_file("a/b/c.txt/d", "x").is_err());
    }

    #[test]
    fn read_truncates_with_a_marker() {
        let (_dir, ws) = ws();
        ws.write_file("big.txt", &"x".repeat(100)).unwrap();
        assert_eq!(
            ws.read_file("big.txt", 10).unwrap(),
            format!("{}\n[... truncated: 90 more bytes]", "x".repeat(10))
        );
        assert_eq!(ws.read_file("big.txt", 100).unwrap(), "x".repeat(100));
        // A cut inside a multi-byte character backs off to its start.
        ws.write_file("u.txt", "aé").unwrap(); // 'é' is 2 bytes
        assert_eq!(
            ws.read_file("u.txt", 2).unwrap(),
            "a\n[... truncated: 2 more bytes]"
        );
        fs::write(ws.root().join("bin"), [b'o', b'k', 0xff, b'\n']).unwrap();
        assert_eq!(ws.read_file("bin", 100).unwrap(), "ok\u{fffd}\n");
        assert!(matches!(
            ws.read_file("nope", 10),
            Err(ToolError::NotFound { .. })
        ));
        fs::create_dir(ws.root().join("dir")).unwrap();
        assert!(matches!(
            ws.read_file("dir", 10),
            Err(ToolError::IsDirectory { .. })
        ));
    }

    #[test]
    fn list_is_sorted_relative_and_marks_directories() {
        let (_dir, ws) = ws();
        for f in ["b.txt", "a/z.txt", "a/c/d.txt", "a-b.txt", "A.txt"] {
            ws.write_file(f, "x").unwrap();
        }
        fs::create_dir(ws.root().join("empty")).unwrap();
        symlink("b.txt", ws.root().join("l")).unwrap();
        assert_eq!(
            ws.list_files(None).unwrap(),
            vec![
                "A.txt",
                "a/",
                "a/c/",
                "a/c/d.txt",
                "a/z.txt",
                "a-b.txt",
                "b.txt",
                "empty/",
                "l -> b.txt",
            ]
        );
        assert_eq!(
            ws.list_files(Some("a")).unwrap(),
            vec!["a/c/", "a/c/d.txt", "a/z.txt"]
        );
        assert_eq!(ws.list_files(Some("a/z.txt")).unwrap(), vec!["a/z.txt"]);
        assert!(ws.list_files(Some("empty")).unwrap().is_empty());
        assert!(matches!(
            ws.list_files(Some("nope")),
            Err(ToolError::NotFound { .. })
        ));
        let capped = ws.list_files_capped(None, 3).unwrap();
        assert_eq!(capped.len(), 4);
        assert_eq!(&capped[..3], ["A.txt", "a/", "a/c/"]);
        assert!(capped[3].starts_with("[... truncated: listing stopped at 3 entries"));
    }

    /// A rewrite keeps the file's inode when nothing else links to it (no
    /// inode freed and another taken per write), and a new file gets mode
    /// 0644 whatever the umask.
    #[test]
    fn write_file_rewrites_a_lone_file_in_place() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let (_dir, ws) = ws();
        ws.write_file("a/notes.txt", "a longer first version")
            .unwrap();
        let path = ws.root().join("a/notes.txt");
        let first = fs::metadata(&path).unwrap();
        assert_eq!(first.permissions().mode() & 0o777, 0o644);
        ws.write_file("a/notes.txt", "short").unwrap();
        let second = fs::metadata(&path).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "short");
        assert_eq!(first.ino(), second.ino());
        // With a second link the name gets a new inode and the other name
        // keeps the old bytes.
        fs::hard_link(&path, ws.root().join("other.txt")).unwrap();
        ws.write_file("a/notes.txt", "third").unwrap();
        assert_ne!(fs::metadata(&path).unwrap().ino(), first.ino());
        assert_eq!(
            fs::read_to_string(ws.root().join("other.txt")).unwrap(),
            "short"
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "third");
    }

    /// Found by attacker reviews of the in-place rewrite: it truncated
    /// first, so a write that failed (full disk, quota, size limit) left
    /// the file cut; and a new file that failed was left half written. Run
    /// in a child process: the size limit is per process.
    #[test]
    fn regression_a_failed_rewrite_keeps_the_old_bytes() {
        const CHILD: &str = "MASS_TEST_FSIZE_CHILD";
        if std::env::var_os(CHILD).is_some() {
            let (_dir, ws) = ws();
            ws.write_file("f.txt", "old content").unwrap();
            // SAFETY: plain libc calls on this (child) process.
            unsafe {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let lim = libc::rlimit {
                    rlim_cur: 4096,
                    rlim_max: libc::RLIM_INFINITY,
                };
                assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
            }
            let r = ws.write_file("f.txt", &"x".repeat(10_000));
            assert!(r.is_err(), "{r:?}");
            assert_eq!(fs::read(ws.root().join("f.txt")).unwrap(), b"old content");
            // A new file that cannot be written whole is not left cut.
            let r = ws.write_file("new.txt", &"y".repeat(10_000));
            assert!(r.is_err(), "{r:?}");
            assert!(!ws.root().join("new.txt").exists());
            return;
        }
        let name = "tools::files::tests::regression_a_failed_rewrite_keeps_the_old_bytes";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads=1", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }

    /// A rewrite keeps permission bits only: a set-id bit does not survive
    /// (as with the rename path's new file).
    #[test]
    fn a_rewrite_drops_set_id_bits() {
        use std::os::unix::fs::PermissionsExt;
        let (_dir, ws) = ws();
        ws.write_file("run.sh", "#!/bin/sh").unwrap();
        let path = ws.root().join("run.sh");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o4755)).unwrap();
        ws.write_file("run.sh", "#!/bin/sh\necho hi").unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o755);
    }

    /// What only a race brings to the in-place path (the caller's checks
    /// refuse it before): a symlink or a FIFO at the name. Neither is
    /// written through or waited on; the rename path decides.
    #[test]
    fn write_in_place_leaves_symlinks_and_fifos_to_the_rename_path() {
        let (dir, ws) = ws();
        let outside = dir.path().join("outside.txt");
        fs::write(&outside, "keep").unwrap();
        let link = ws.root().join("link.txt");
        symlink(&outside, &link).unwrap();
        assert!(write_in_place(&link, "changed").unwrap().is_none());
        assert_eq!(fs::read_to_string(&outside).unwrap(), "keep");
        let fifo = ws.root().join("pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        // No reader: the open fails at once instead of blocking.
        assert!(write_in_place(&fifo, "x").unwrap().is_none());
        // With a reader: opened, then refused as not a regular file.
        let _reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        assert!(write_in_place(&fifo, "x").unwrap().is_none());
    }

    /// Before: `write_file` wrote into the existing inode, so a hard link in
    /// the workspace to a file elsewhere let it overwrite that file.
    #[test]
    fn regression_write_file_never_writes_through_a_hard_link() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, ws) = ws();
        let outside = dir
            .path()
            .join("..")
            .join(format!("outside-{}", std::process::id()));
        fs::write(&outside, "keep").unwrap();
        fs::hard_link(&outside, ws.root().join("linked.txt")).unwrap();
        ws.write_file("linked.txt", "changed").unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "keep");
        assert_eq!(
            fs::read_to_string(ws.root().join("linked.txt")).unwrap(),
            "changed"
        );
        fs::remove_file(&outside).unwrap();
        // The mode of a rewritten file is kept.
        ws.write_file("run.sh", "#!/bin/sh").unwrap();
        fs::set_permissions(ws.root().join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        ws.write_file("run.sh", "#!/bin/sh\necho hi").unwrap();
        let mode = fs::metadata(ws.root().join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        // No temporary file is left behind.
        let names: Vec<String> = fs::read_dir(ws.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with(".mass-write-")),
            "{names:?}"
        );
    }
}
