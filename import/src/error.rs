//! What can go wrong in an import, each error naming the file (relative to
//! the run folder) and, for a line-oriented file, the line. Messages never
//! hold file contents beyond a short cause from the parser, and those are
//! passed through the scrubber by whoever prints them (the CLI), since a
//! JSON error may quote the bytes it stopped at.

use std::path::PathBuf;

/// An import failure. Nothing is written to the ledger when one is
/// returned: the plan is checked whole before the one commit.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The folder does not look like a run of the reference implementation.
    #[error("{dir}: not a run folder of the reference implementation: {reason}")]
    NotARun { dir: PathBuf, reason: String },
    /// The run folder itself does not exist.
    #[error("{dir}: no such run folder")]
    NoFolder { dir: PathBuf },
    /// A file could not be opened or read.
    #[error("{file}: {reason}")]
    Io { file: String, reason: String },
    /// A path beneath the run folder is a symbolic link (never followed).
    #[error("{file}: is a symbolic link; links are never followed in an import (replace it by the file it points to)")]
    Symlink { file: String },
    /// A file or line passed a resource cap.
    #[error("{file}: {what} is larger than the cap of {cap} bytes")]
    TooLarge {
        file: String,
        what: String,
        cap: u64,
    },
    /// More of something than the import's cap allows.
    #[error("{file}: more {what} than the cap of {cap}")]
    TooMany {
        file: String,
        what: String,
        cap: u64,
    },
    /// A compressed file is damaged or ends early.
    #[error("{file}: damaged or truncated gzip stream ({reason})")]
    Gzip { file: String, reason: String },
    /// A line of a JSON-lines file, or a JSON file, does not parse.
    #[error("{file}:{line}: invalid JSON ({reason})")]
    Json {
        file: String,
        line: usize,
        reason: String,
    },
    /// A record parses but lacks what the reference always writes, or
    /// contradicts another file.
    #[error("{file}:{line}: {reason}")]
    Invalid {
        file: String,
        line: usize,
        reason: String,
    },
    /// The run name is taken by a run imported from another folder.
    #[error("run {run:?} exists and is not this folder's import (its head is {head}); choose another --name")]
    NameTaken { run: String, head: String },
    /// The ledger refused a write or read.
    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),
}

impl ImportError {
    pub(crate) fn io(file: &str, e: impl std::fmt::Display) -> ImportError {
        ImportError::Io {
            file: file.to_string(),
            reason: e.to_string(),
        }
    }

    pub(crate) fn invalid(file: &str, line: usize, reason: impl Into<String>) -> ImportError {
        ImportError::Invalid {
            file: file.to_string(),
            line,
            reason: reason.into(),
        }
    }

    pub(crate) fn json(file: &str, line: usize, e: &serde_json::Error) -> ImportError {
        // serde_json's message names the column and what it expected,
        // never the bytes it read.
        ImportError::Json {
            file: file.to_string(),
            line,
            reason: e.to_string(),
        }
    }

    /// True for errors about the input (exit code 3 in the CLI), false for
    /// the ledger's own failures.
    pub fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            ImportError::Ledger(_) | ImportError::NameTaken { .. } | ImportError::NoFolder { .. }
        )
    }
}

pub type Result<T> = std::result::Result<T, ImportError>;
