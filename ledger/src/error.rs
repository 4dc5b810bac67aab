//! The ledger's error type.
//!
//! `Corruption` (stored bytes that fail their own checks) is kept apart from
//! `Io` (the operating system refused a read or write) so callers can tell "the
//! disk said no" from "the disk returned something that is not what we wrote".
//! Every variant names the object, ref or path involved.

use std::path::PathBuf;

use crate::id::{Id, ObjectKind};

pub type Result<T, E = LedgerError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("corrupt object {id}: {detail}")]
    Corruption { id: Id, detail: String },

    /// A partial ledger's promisor (its remote) failed to hand over an
    /// absent object, or handed over wrong bytes.
    #[error(
        "object {id} is not in this partial ledger and its remote did not provide it: {detail}"
    )]
    Promisor { id: Id, detail: String },

    #[error("corrupt ledger file {path} at byte {offset}: {detail}")]
    CorruptLog {
        path: PathBuf,
        offset: u64,
        detail: String,
    },

    #[error("index error ({detail}); the index is derived data: rebuild it with `mass reindex`")]
    Index { detail: String },

    #[error("the log is shorter than the index: {detail}. Nothing was changed. Restore the segment files from a backup; `mass reindex` rebuilds the index from what the log still holds, but cannot bring back what is missing")]
    LogBehindIndex { detail: String },

    #[error("ledger {path} is open read-only (opened without the lock); writing needs the ledger to itself")]
    ReadOnly { path: PathBuf },

    #[error("ledger {path} is in use by pid {pid}; wait for it to finish or stop it")]
    Locked { path: PathBuf, pid: String },

    #[error("no ledger at {path}; create one with `mass init`")]
    NotALedger { path: PathBuf },

    #[error("a ledger already exists at {path}")]
    AlreadyExists { path: PathBuf },

    #[error("ledger format version {found} at {path} is not supported (this build reads version {supported}){}", if found == "1" { "; `mass migrate --from DIR` copies a version-1 ledger into a new one" } else { "" })]
    UnsupportedFormat {
        path: PathBuf,
        found: String,
        supported: u32,
    },

    #[error("malformed id {input:?}: {reason}")]
    MalformedId { input: String, reason: String },

    #[error("no object matches {prefix}")]
    NotFound { prefix: String },

    #[error("abbreviation {prefix} is ambiguous: it matches {}", candidates.iter().map(|c| c.short(16)).collect::<Vec<_>>().join(", "))]
    Ambiguous { prefix: String, candidates: Vec<Id> },

    #[error("{id} is {}, not {}", actual.with_article(), expected.with_article())]
    WrongKind {
        id: Id,
        expected: ObjectKind,
        actual: ObjectKind,
    },

    #[error(
        "ref {name:?} moved: expected head {}, found {}",
        fmt_head(expected),
        fmt_head(actual)
    )]
    Conflict {
        name: String,
        expected: Option<Id>,
        actual: Option<Id>,
    },

    #[error("invalid ref name {name:?}: {reason}")]
    BadRefName { name: String, reason: String },

    #[error("invalid event for ref {name:?}: {reason}")]
    BadEvent { name: String, reason: String },

    #[error("no ref named {name:?}")]
    NoSuchRef { name: String },

    #[error("{referrer} refers to {missing}, which is not in the ledger")]
    Dangling { referrer: String, missing: Id },

    #[error("event {id} does not continue its stream: {detail}. An event carries its prev's stream and prev's seq + 1 (seq 0 without a prev; ledger/FORMAT.md); nothing of this batch was written")]
    BrokenChain { id: Id, detail: String },

    #[error("invalid path {path:?} in tree: {reason}")]
    BadPath { path: String, reason: String },

    #[error("cannot snapshot {path}: {reason}")]
    Snapshot { path: PathBuf, reason: String },

    #[error("cannot check out into {path}: {reason}")]
    Checkout { path: PathBuf, reason: String },

    #[error("object too large: {len} bytes (limit {limit})")]
    TooLarge { len: u64, limit: u64 },

    /// `Ledger::settle` was handed a commit another open ledger took (or
    /// two ledgers' commits joined by `Unsettled::and`): a caller's bug.
    #[error("ledger {path}: asked to settle a commit submitted to another ledger; nothing was waited for, so that commit is not known to be durable")]
    ForeignCommit { path: PathBuf },
}

fn fmt_head(h: &Option<Id>) -> String {
    match h {
        Some(id) => id.to_hex(),
        None => "(no ref)".to_string(),
    }
}

impl LedgerError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LedgerError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn index(e: impl std::fmt::Display) -> Self {
        LedgerError::Index {
            detail: e.to_string(),
        }
    }

    /// True for errors that mean stored bytes are damaged.
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            LedgerError::Corruption { .. }
                | LedgerError::CorruptLog { .. }
                | LedgerError::LogBehindIndex { .. }
        )
    }
}
