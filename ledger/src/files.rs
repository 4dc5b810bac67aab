//! The file layer: every write the ledger relies on for durability goes
//! through it (segment appends and `fdatasync`, new files, renames, removals
//! and directory syncs), behind a trait so tests can stand in a layer that
//! models what a power cut keeps: unsynced data lost or half written, renames
//! and creations undone until their directory is synced. Two small files
//! bypass it: `LOCK` (the writer's pid) and `WATERMARK` (written in place; it
//! never exceeds what is durable, so losing it only loses evidence). Reads
//! use the OS directly: they run after the (simulated) cut, on what reached
//! the disk.
//!
//! The ledger passes segment paths only to `open_append` and, for a segment
//! that does not exist yet, to [`write_durably`]: no code path can cut or
//! replace recorded bytes.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

/// A segment file open for appending.
pub trait AppendFile: Send {
    /// Appends all of `buf` at the end of the file.
    fn append(&mut self, buf: &[u8]) -> std::io::Result<()>;
    /// Makes every appended byte durable (`fdatasync`). A commit is
    /// acknowledged only after this returns `Ok`.
    fn sync_data(&mut self) -> std::io::Result<()>;
}

/// How the ledger writes its directory.
pub trait FileLayer: Send + Sync + std::fmt::Debug {
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>>;
    /// Creates (or replaces) `path` holding `bytes`; not durable by itself.
    fn write_file(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()>;
    /// `fsync` of a file's data and metadata.
    fn sync_file(&self, path: &Path) -> std::io::Result<()>;
    /// Renames; durable once the directory (or directories) are synced.
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()>;
    fn remove_file(&self, path: &Path) -> std::io::Result<()>;
    fn remove_dir_all(&self, path: &Path) -> std::io::Result<()>;
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()>;
    /// `fsync` of a directory: makes the creations, renames and removals of
    /// its entries durable.
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()>;
}

/// The operating system's files.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsFiles;

struct OsAppend(File);

impl AppendFile for OsAppend {
    fn append(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.0.write_all(buf)
    }
    fn sync_data(&mut self) -> std::io::Result<()> {
        self.0.sync_data()
    }
}

impl FileLayer for OsFiles {
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>> {
        let f = OpenOptions::new().append(true).open(path)?;
        Ok(Box::new(OsAppend(f)))
    }
    fn write_file(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let mut f = File::create(path)?;
        f.write_all(bytes)
    }
    fn sync_file(&self, path: &Path) -> std::io::Result<()> {
        OpenOptions::new().read(true).open(path)?.sync_all()
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        std::fs::remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> std::io::Result<()> {
        std::fs::remove_dir_all(path)
    }
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(path)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// Writes a file atomically and durably: temp file, fsync, rename, fsync of
/// the directory. When this returns, the file is there whole after any
/// crash; before, it is there whole (the old content) or not at all.
pub fn write_durably(files: &dyn FileLayer, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    files.write_file(&tmp, bytes)?;
    files.sync_file(&tmp)?;
    files.rename(&tmp, path)?;
    match path.parent() {
        Some(parent) => files.sync_dir(parent),
        None => Ok(()),
    }
}

/// Creates a directory and makes its entry durable in its parent.
pub fn create_dir_durably(files: &dyn FileLayer, dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    files.create_dir_all(dir)?;
    match dir.parent() {
        Some(parent) => files.sync_dir(parent),
        None => Ok(()),
    }
}
