//! Reading a run folder without following links and within caps. Every
//! file is reached from a directory descriptor of the run folder, one path
//! component at a time with `openat(O_NOFOLLOW)`, so a symbolic link
//! anywhere beneath it (a file linked to `/proc/self/environ`, a folder
//! linked outside the run) is refused by name instead of read: a run folder
//! is someone else's output, and an import must read only what lies in it.
//! Only regular files with one name are read (a FIFO would block, a device
//! is not a log, a hard link may be a file from anywhere on the file
//! system): each is looked at through an `O_PATH` descriptor, which opens
//! nothing, before it is opened.
//!
//! The caps bound what hostile input can cost: a plain file is read up to
//! [`Caps::file`] bytes, a gzip stream is decompressed up to [`Caps::log`]
//! bytes in all and [`Caps::line`] per line, checked while decompressing
//! (a gzip bomb stops at the cap, not after filling memory). A log is
//! parsed line by line as it decompresses, never held as raw lines, blank
//! lines skipped; records in the whole folder are capped at [`Caps::rows`].
//!
//! An episode's workspace folder is read whole ([`Root::snapshot`]) by the
//! ledger's own snapshot walk, started from the folder's descriptor opened
//! as above, so its tree is the one the engine makes of a workspace (links
//! recorded as links, never followed), within [`Caps::workspace`].

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use ledger::{Id, ObjectKind};

use crate::error::{ImportError, Result};

/// Resource caps of one import.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// A plain file (JSON, JSON lines, text), in bytes.
    pub file: u64,
    /// A decompressed log (`api_requests.jsonl.gz`), in bytes.
    pub log: u64,
    /// One line of a decompressed log, in bytes.
    pub line: u64,
    /// Everything read from the folder, decompressed, in bytes (an import
    /// holds the folder in memory until its one commit).
    pub total: u64,
    /// Records (non-blank JSON-lines rows, JSON list items) in the folder.
    pub rows: u64,
    /// Episode folders (each costs its records and objects even when
    /// empty of files).
    pub episodes: u64,
    /// Objects an import builds in memory before its one commit.
    pub objects: u64,
    /// Secrets learnt from the folder (each searched for in everything
    /// recorded).
    pub secrets: u64,
    /// One episode's workspace folder: entries and bytes of file content,
    /// the engine's snapshot limits by default (a workspace past them is
    /// refused, naming it: its tree would be a part of it).
    pub workspace: ledger::tree::SnapshotLimits,
}

impl Default for Caps {
    fn default() -> Caps {
        Caps {
            file: 256 << 20,
            log: 1 << 30,
            line: 64 << 20,
            total: 8 << 30,
            rows: 4_000_000,
            episodes: 100_000,
            objects: 20_000_000,
            secrets: crate::secrets::MAX_SECRETS,
            workspace: ledger::tree::SnapshotLimits::default(),
        }
    }
}

/// A file's bytes and when the reference last wrote it.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub bytes: Vec<u8>,
    /// Modification time, ms since the Unix epoch (the reference's clock
    /// for files that carry no time of their own).
    pub mtime_ms: u64,
}

/// What a directory entry is, as the directory says (never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// The run folder, held open as a directory descriptor.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    pub caps: Caps,
    /// Bytes read so far (checked against `caps.total`).
    read: std::cell::Cell<u64>,
    /// Rows counted so far (checked against `caps.rows`).
    rows: std::cell::Cell<u64>,
}

fn cstr(file: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| ImportError::io(file, "path holds a NUL byte"))
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC)`, a link refused.
fn open_at(dir: i32, name: &str, flags: i32, shown: &str) -> Result<Option<OwnedFd>> {
    let c = cstr(shown, name)?;
    // SAFETY: `c` is a valid NUL-terminated string and `dir` an open
    // directory descriptor (or AT_FDCWD); the result is checked.
    let fd = unsafe {
        libc::openat(
            dir,
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            // O_NOFOLLOW on the last component gives ELOOP; O_DIRECTORY on
            // a link to a directory gives ENOTDIR (the link is not one).
            Some(libc::ELOOP) => Err(ImportError::Symlink {
                file: shown.to_string(),
            }),
            Some(libc::ENOTDIR) if is_link(dir, name) => Err(ImportError::Symlink {
                file: shown.to_string(),
            }),
            _ => Err(ImportError::io(shown, e)),
        };
    }
    // SAFETY: `fd` was just returned by openat and is owned by nobody else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn is_link(dir: i32, name: &str) -> bool {
    let Ok(c) = CString::new(name) else {
        return false;
    };
    // SAFETY: valid string and descriptor; `st` is written by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    rc == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFLNK
}

fn fstat(fd: &OwnedFd, shown: &str) -> Result<libc::stat> {
    // SAFETY: `fd` is open; `st` is written by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(ImportError::io(shown, std::io::Error::last_os_error()));
    }
    Ok(st)
}

fn mtime_ms(st: &libc::stat) -> u64 {
    let s = u64::try_from(st.st_mtime).unwrap_or(0);
    let ns = u64::try_from(st.st_mtime_nsec).unwrap_or(0);
    s.saturating_mul(1000).saturating_add(ns / 1_000_000)
}

impl Root {
    /// Opens the run folder itself (a link there is refused as well).
    pub fn open(dir: &Path, caps: Caps) -> Result<Root> {
        let shown = dir.display().to_string();
        let s = dir
            .to_str()
            .ok_or_else(|| ImportError::io(&shown, "path is not UTF-8"))?;
        let s = s.trim_end_matches('/');
        let s = if s.is_empty() { "/" } else { s };
        match open_at(
            libc::AT_FDCWD,
            s,
            libc::O_RDONLY | libc::O_DIRECTORY,
            &shown,
        )? {
            Some(fd) => Ok(Root {
                fd,
                caps,
                read: std::cell::Cell::new(0),
                rows: std::cell::Cell::new(0),
            }),
            None => Err(ImportError::NoFolder {
                dir: dir.to_path_buf(),
            }),
        }
    }

    /// The directory `rel` (`/`-separated, relative), each component
    /// opened without following links; `None` when it does not exist.
    fn dir(&self, rel: &str) -> Result<Option<OwnedFd>> {
        let mut cur: Option<OwnedFd> = None;
        let mut walked = String::new();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            if part == ".." || part == "." {
                return Err(ImportError::io(rel, "path leaves the run folder"));
            }
            if !walked.is_empty() {
                walked.push('/');
            }
            walked.push_str(part);
            let base = cur.as_ref().map_or(self.fd.as_raw_fd(), |f| f.as_raw_fd());
            match open_at(base, part, libc::O_RDONLY | libc::O_DIRECTORY, &walked)? {
                Some(fd) => cur = Some(fd),
                None => return Ok(None),
            }
        }
        match cur {
            Some(fd) => Ok(Some(fd)),
            // SAFETY: dup of our own open descriptor; checked below.
            None => {
                let fd = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
                if fd < 0 {
                    return Err(ImportError::io(".", std::io::Error::last_os_error()));
                }
                // SAFETY: a fresh descriptor owned by nobody else.
                Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
            }
        }
    }

    /// Opens regular file `rel`; `None` when it does not exist.
    fn open_file(&self, rel: &str) -> Result<Option<(File, libc::stat)>> {
        let (parent, name) = match rel.rsplit_once('/') {
            Some((p, n)) => (p, n),
            None => ("", rel),
        };
        let Some(dir) = self.dir(parent)? else {
            return Ok(None);
        };
        // Looked at through an O_PATH descriptor first, which opens
        // nothing: a device or FIFO is refused without ever being opened
        // (an open has effects on some devices).
        let Some(path) = open_at(dir.as_raw_fd(), name, libc::O_PATH, rel)? else {
            return Ok(None);
        };
        let seen = fstat(&path, rel)?;
        match seen.st_mode & libc::S_IFMT {
            // O_PATH | O_NOFOLLOW gives the link itself, not ELOOP.
            libc::S_IFLNK => {
                return Err(ImportError::Symlink {
                    file: rel.to_string(),
                })
            }
            libc::S_IFREG => {}
            _ => return Err(ImportError::io(rel, "not a regular file")),
        }
        // A hard link is a second name of a file that may live anywhere on
        // the same file system (`prompt.txt` linked to `~/.netrc`): a run
        // folder's own files have one name.
        if seen.st_nlink > 1 {
            return Err(ImportError::io(
                rel,
                "has other hard links (it may be a file outside the run folder); replace it by a copy",
            ));
        }
        let Some(fd) = open_at(dir.as_raw_fd(), name, libc::O_RDONLY, rel)? else {
            return Ok(None);
        };
        let st = fstat(&fd, rel)?;
        if (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino) {
            return Err(ImportError::io(rel, "was replaced while being opened"));
        }
        Ok(Some((File::from(fd), st)))
    }

    /// The bytes of plain file `rel`, up to the file cap.
    pub fn read(&self, rel: &str) -> Result<Option<Loaded>> {
        let Some((f, st)) = self.open_file(rel)? else {
            return Ok(None);
        };
        let cap = self.caps.file;
        let mut bytes = Vec::new();
        f.take(cap + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ImportError::io(rel, e))?;
        if bytes.len() as u64 > cap {
            return Err(ImportError::TooLarge {
                file: rel.to_string(),
                what: "the file".into(),
                cap,
            });
        }
        self.count(rel, bytes.len() as u64)?;
        Ok(Some(Loaded {
            bytes,
            mtime_ms: mtime_ms(&st),
        }))
    }

    /// Calls `each(line number, line)` for every non-blank line of gzip
    /// file `rel` as it completes, within the log and line caps; the file's
    /// mtime, or `None` when it does not exist. Lines are never kept here:
    /// a log of blank lines costs one line buffer, not one allocation per
    /// line, and each kept line counts against the folder's row cap.
    pub fn gz_lines(
        &self,
        rel: &str,
        mut each: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<Option<u64>> {
        let Some((f, st)) = self.open_file(rel)? else {
            return Ok(None);
        };
        let mut z = flate2::read::MultiGzDecoder::new(std::io::BufReader::new(f));
        let mut cur: Vec<u8> = Vec::new();
        let (mut total, mut line) = (0u64, 0usize);
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = z.read(&mut buf).map_err(|e| ImportError::Gzip {
                file: rel.to_string(),
                reason: e.to_string(),
            })?;
            if n == 0 {
                break;
            }
            total += n as u64;
            self.count(rel, n as u64)?;
            if total > self.caps.log {
                return Err(self.too_large(rel, "the decompressed log", self.caps.log));
            }
            for piece in buf[..n].split_inclusive(|b| *b == b'\n') {
                cur.extend_from_slice(piece);
                if cur.len() as u64 > self.caps.line + 1 {
                    let what = format!("line {}", line + 1);
                    return Err(self.too_large(rel, &what, self.caps.line));
                }
                if cur.last() == Some(&b'\n') {
                    line += 1;
                    self.line(rel, line, &cur, &mut each)?;
                    cur.clear();
                }
            }
        }
        if !cur.is_empty() {
            self.line(rel, line + 1, &cur, &mut each)?;
        }
        Ok(Some(mtime_ms(&st)))
    }

    /// One line of a log: skipped when blank, else counted as a row and
    /// handed on.
    fn line(
        &self,
        rel: &str,
        n: usize,
        b: &[u8],
        each: &mut impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        if b.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        self.row(rel, n)?;
        each(n, b)
    }

    /// Counts one more record (a JSON-lines row or a JSON list item),
    /// within the folder's row cap: a row costs memory well past its bytes
    /// once parsed, so their number is bounded as well as their size.
    pub fn row(&self, rel: &str, line: usize) -> Result<()> {
        let t = self.rows.get() + 1;
        self.rows.set(t);
        if t > self.caps.rows {
            return Err(ImportError::TooMany {
                file: format!("{rel}:{line}"),
                what: "rows (JSON-lines records and list items) in the run folder".into(),
                cap: self.caps.rows,
            });
        }
        Ok(())
    }

    /// Counts `n` more bytes read (or held once parsed), within the
    /// folder's total cap.
    pub fn count(&self, rel: &str, n: u64) -> Result<()> {
        let t = self.read.get() + n;
        self.read.set(t);
        if t > self.caps.total {
            return Err(self.too_large(
                rel,
                "the run folder in all (reading this file)",
                self.caps.total,
            ));
        }
        Ok(())
    }

    fn too_large(&self, rel: &str, what: &str, cap: u64) -> ImportError {
        ImportError::TooLarge {
            file: rel.to_string(),
            what: what.to_string(),
            cap,
        }
    }

    /// The entries of directory `rel`, sorted by name; `None` when it does
    /// not exist. Links are listed as links, never followed.
    pub fn list(&self, rel: &str) -> Result<Option<Vec<(String, Kind)>>> {
        let Some(dir) = self.dir(rel)? else {
            return Ok(None);
        };
        // Our own descriptor's entry in /proc: the directory we opened
        // without following links, whatever its path now names.
        let proc = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let shown = if rel.is_empty() { "." } else { rel };
        let mut out = Vec::new();
        for e in std::fs::read_dir(&proc).map_err(|e| ImportError::io(shown, e))? {
            let e = e.map_err(|e| ImportError::io(shown, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let t = e.file_type().map_err(|e| ImportError::io(shown, e))?;
            let kind = if t.is_symlink() {
                Kind::Symlink
            } else if t.is_dir() {
                Kind::Dir
            } else if t.is_file() {
                Kind::File
            } else {
                Kind::Other
            };
            out.push((name, kind));
        }
        out.sort();
        Ok(Some(out))
    }
}

/// A workspace folder as read: its tree in the ledger's format, each
/// blob the bytes as they lie in the folder (`contents`, by blob id).
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub tree: ledger::Tree,
    pub contents: HashMap<Id, Vec<u8>>,
}

impl Root {
    /// Directory `rel` as a tree, by the walk every snapshot of the ledger
    /// takes (`ledger::tree::snapshot_with`: links recorded as links, never
    /// followed; a FIFO, socket or device refused; files read with
    /// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`), within `limits`;
    /// `None` when it does not exist. The walk starts at the directory
    /// opened here one component at a time without following links, named
    /// through this process's own descriptor, so a link on the way to it
    /// is refused by name as everywhere in the folder. A file with other
    /// hard links is refused as `read` refuses one; every byte counts
    /// against the folder's total cap; `seen` gets each file's path (from
    /// the run folder) and bytes, and may refuse them.
    pub fn snapshot(
        &self,
        rel: &str,
        limits: ledger::tree::SnapshotLimits,
        mut seen: impl FnMut(&str, &[u8]) -> Result<()>,
    ) -> Result<Option<Snapshot>> {
        let Some(dir) = self.dir(rel)? else {
            return Ok(None);
        };
        let base = format!("/proc/self/fd/{}/.", dir.as_raw_fd());
        let mut contents = HashMap::new();
        // The first refusal of ours, carried out of the ledger's walk.
        let mut refused: Option<ImportError> = None;
        let walked = ledger::tree::snapshot_with(Path::new(&base), limits, |item, content| {
            let shown = format!("{rel}/{}", item.rel);
            let ours = self
                .single_name(item, &shown)
                .and_then(|()| self.count(&shown, content.len() as u64))
                .and_then(|()| seen(&shown, &content));
            if let Err(e) = ours {
                refused = Some(e);
                return Err(ledger::LedgerError::Snapshot {
                    path: item.abs.clone(),
                    reason: "refused by the import".into(),
                });
            }
            let id = Id::of(ObjectKind::Blob, &content);
            let size = content.len() as u64;
            contents.entry(id).or_insert(content);
            Ok((id, size))
        });
        match walked {
            Ok(tree) => Ok(Some(Snapshot { tree, contents })),
            Err(e) => Err(refused.unwrap_or_else(|| walk_error(rel, &base, e))),
        }
    }

    /// Refuses a regular file with other hard links (see `open_file`).
    fn single_name(&self, item: &ledger::tree::WalkItem, shown: &str) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        if item.kind != ledger::EntryKind::File {
            return Ok(());
        }
        let md = std::fs::symlink_metadata(&item.abs).map_err(|e| ImportError::io(shown, e))?;
        if md.nlink() > 1 {
            return Err(ImportError::io(
                shown,
                "has other hard links (it may be a file outside the run folder); replace it by a copy",
            ));
        }
        Ok(())
    }
}

/// A refusal of the ledger's walk, named by its path in the run folder
/// (the walk saw it beneath this process's descriptor path `base`).
fn walk_error(rel: &str, base: &str, e: ledger::LedgerError) -> ImportError {
    match e {
        ledger::LedgerError::Snapshot { path, reason } => {
            let sub = path
                .strip_prefix(base)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let shown = if sub.is_empty() {
                rel.to_string()
            } else {
                format!("{rel}/{sub}")
            };
            ImportError::io(&shown, format!("cannot snapshot the workspace: {reason}"))
        }
        ledger::LedgerError::BadPath { path, reason } => ImportError::io(
            &format!("{rel}/{path}"),
            format!("cannot snapshot the workspace: {reason}"),
        ),
        other => ImportError::Ledger(other),
    }
}

/// The non-blank lines of plain bytes with their 1-based line numbers
/// (blank ones counted, so numbers are the file's), each within `cap`;
/// yielded one by one, so a file of many short lines costs no index.
pub fn lines<'a>(
    file: &'a str,
    bytes: &'a [u8],
    cap: u64,
) -> impl Iterator<Item = Result<(usize, &'a [u8])>> + 'a {
    bytes
        .split(|b| *b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace))
        .map(move |(i, l)| {
            if l.len() as u64 > cap {
                return Err(ImportError::TooLarge {
                    file: file.to_string(),
                    what: format!("line {}", i + 1),
                    cap,
                });
            }
            Ok((i + 1, l))
        })
}
