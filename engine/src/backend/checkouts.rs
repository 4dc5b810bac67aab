//! Trained adapters checked out of the ledger for the servers that load
//! them. Each set of backends keeps its checkouts in a directory of its own,
//! `$TMPDIR/mass-adapters-PID-XXXXXX`, made on the first checkout and
//! removed with the backends (when the run, re-judge or worker context that
//! built them ends). A process killed outright cannot remove its own: the
//! next set of backends to check anything out removes the directories of
//! processes that are gone. Nothing of value is lost either way: the files
//! are a copy of a tree the ledger holds (`mass checkout` makes it again).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ledger::Id;

use crate::error::{EngineError, Result};

const PREFIX: &str = "mass-adapters-";

/// The checkout directory of one set of backends.
#[derive(Default)]
pub struct Checkouts {
    root: OnceLock<tempfile::TempDir>,
}

impl Checkouts {
    /// The adapter files of tree `id` (checked out once per content: the
    /// directory is named by the tree id). A checkout goes to a fresh
    /// directory renamed into place, so a crash mid-checkout never leaves a
    /// half directory under the final name.
    pub fn checkout(&self, l: &ledger::Ledger, id: &Id) -> Result<PathBuf> {
        let root = self.root()?;
        let dir = root.join(id.to_hex());
        if dir.is_dir() {
            return Ok(dir);
        }
        let io = |e: std::io::Error| {
            EngineError::io(format!("adapter checkout under {}", root.display()), e)
        };
        // A directory of this checkout's own: two checkouts of one id at
        // once never share (or remove) each other's half-written files.
        let partial = tempfile::Builder::new()
            .prefix(&format!(".{}-", id.short(16)))
            .tempdir_in(root)
            .map_err(io)?;
        let files = partial.path().join("files");
        l.checkout(id, &files)?;
        match std::fs::rename(&files, &dir) {
            Ok(()) => Ok(dir),
            // The other checkout of the same content finished first.
            Err(_) if dir.is_dir() => Ok(dir),
            Err(e) => Err(io(e)),
        }
    }

    /// Where this set's checkouts go (none made yet: `None`).
    pub fn root_if_made(&self) -> Option<&Path> {
        self.root.get().map(|t| t.path())
    }

    fn root(&self) -> Result<&Path> {
        if let Some(t) = self.root.get() {
            return Ok(t.path());
        }
        let tmp = std::env::temp_dir();
        remove_dead(&tmp, PREFIX);
        let made = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir_in(&tmp)
            .map_err(|e| {
                EngineError::io(format!("adapter checkouts under {}", tmp.display()), e)
            })?;
        // Two threads racing here: one directory wins, the other is dropped
        // (and removed) at once.
        Ok(self.root.get_or_init(|| made).path())
    }
}

/// Removes the directories under `tmp` named `PREFIX<pid>-...` whose
/// process is gone (adapter checkouts here, a worker's scratch roots in
/// the workers crate). Without a /proc to ask (not mounted), nothing is
/// removed: a live process's directory must never be taken for a dead one's.
pub fn remove_dead(tmp: &Path, prefix: &str) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(rd) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
