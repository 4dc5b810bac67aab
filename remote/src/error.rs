//! The remote layer's error type. Every variant names the store location
//! (as the user gave it, never with credentials: URLs carrying any are
//! refused) and the file or run involved, and says what to do.

use std::path::PathBuf;

pub type Result<T, E = RemoteError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{url:?} is not a remote location: {detail}")]
    BadUrl { url: String, detail: String },

    /// The store refused or could not be reached; `reason` is the root
    /// cause (object_store nests the same text several levels deep).
    #[error("{op} {location}: {reason}")]
    Store {
        op: String,
        location: String,
        reason: String,
    },

    #[error("{location} is not a mass remote: it has no MASS-REMOTE file{hint}")]
    NotARemote { location: String, hint: String },

    #[error("corrupt remote file {key}: {detail}. Nothing was written locally")]
    Corrupt { key: String, detail: String },

    #[error("{what} on {location} names {id}, which no pack there holds; the remote is incomplete (was a pack deleted?). Nothing was written locally")]
    MissingObject {
        what: String,
        id: ledger::Id,
        location: String,
    },

    #[error("conflict on run {run}: {detail}")]
    Conflict { run: String, detail: String },

    #[error("{location} holds run {other}, and run {run} is inside it or holds it: push {other} as a whole (or give the run another name with `mass fork`)")]
    Nested {
        run: String,
        other: String,
        location: String,
    },

    #[error("no run named {run:?} {place}")]
    NoSuchRun { run: String, place: String },

    #[error("remote {name:?} is not configured ({path}); `mass remote list` shows the names, `mass remote add NAME URL` adds one")]
    NoSuchRemote { name: String, path: PathBuf },

    #[error("{path}: {detail}")]
    Config { path: PathBuf, detail: String },

    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),
}

/// The innermost cause of a store error, with the store's summary when it
/// adds something (retries, HTTP status).
pub(crate) fn store_reason(e: &object_store::Error) -> String {
    let mut root: &dyn std::error::Error = e;
    while let Some(next) = root.source() {
        root = next;
    }
    let outer = e.to_string();
    let first = outer
        .split("  - ")
        .next()
        .unwrap_or(&outer)
        .trim()
        .to_string();
    let root = root.to_string();
    if first.contains(&root) {
        first
    } else {
        format!("{first}: {root}")
    }
}

impl RemoteError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> RemoteError {
        let path = path.into();
        move |source| RemoteError::Io { path, source }
    }
}
