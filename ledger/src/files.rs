//! The file layer under the writer: the few operations whose durability the
//! crash guarantee rests on (append, `fdatasync`, creating a segment), behind a
//! trait so tests can stand in a layer that loses unsynced writes at a
//! simulated power cut. Reads, recovery and maintenance use the OS directly:
//! they run after the (simulated) cut, on what reached the disk.

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
    /// Cuts the file back to `len` (only used to drop a write that failed,
    /// which was never acknowledged).
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
}

/// How the writer opens and creates segment files.
pub trait FileLayer: Send + Sync + std::fmt::Debug {
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>>;
    /// Creates a file holding `bytes`, durably: temp file, fsync, rename,
    /// fsync of the directory.
    fn create_durably(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()>;
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
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
}

impl FileLayer for OsFiles {
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>> {
        let f = OpenOptions::new().read(true).append(true).open(path)?;
        Ok(Box::new(OsAppend(f)))
    }

    fn create_durably(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        write_durably(path, bytes)
    }
}

/// Writes a small file atomically: temp file, fsync, rename, fsync directory.
pub(crate) fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}
