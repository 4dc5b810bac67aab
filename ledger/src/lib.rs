//! `ledger`: a durable, content-addressed, append-only store of blobs, trees and
//! events, with refs (named heads) and forks.
//!
//! Objects are immutable and addressed by the BLAKE3 hash of their canonical
//! encoding. Events form per-stream hash chains; refs name heads and move (or
//! are deleted, leaving every object in place) only by compare-and-swap. The source of truth is a set of append-only segment files;
//! derived index tables (immutable, like git's pack `.idx`) locate objects and
//! can be rebuilt from the segments at any time. A commit returns only once it
//! is on disk (concurrent commits share one fsync), and every read re-checks
//! the hash of what it returns.
//!
//! This crate knows nothing of MASS, async runtimes, HTTP or the command line:
//! event payloads are opaque bytes that the `schemas` crate gives meaning to.
//!
//! ```
//! use ledger::{Ledger, NewEvent};
//! let dir = tempfile::tempdir().unwrap();
//! let l = Ledger::init(dir.path()).unwrap();
//! let body = l.put_blob(b"hello").unwrap();
//! let e1 = l.append("run/1", None, NewEvent::new("demo.note", 1, b"first".to_vec()).with_refs(vec![body])).unwrap();
//! let e2 = l.append("run/1", Some(e1), NewEvent::new("demo.note", 1, b"second".to_vec())).unwrap();
//! assert_eq!(l.head("run/1").unwrap(), Some(e2));
//! assert_eq!(l.get_event(&e2).unwrap().prev, Some(e1));
//! // A stale expected head is refused:
//! assert!(l.append("run/1", Some(e1), NewEvent::new("demo.note", 1, vec![])).is_err());
//! ```

mod error;
mod files;
mod id;
mod index;
mod migrate;
mod object;
mod open;
mod probe;
mod recovery;
mod segment;
/// The largest object body a ledger stores (for writers that check their
/// objects before opening one).
pub use segment::MAX_BODY_LEN;
mod startup;
mod store;
pub mod tree;
mod verify;

pub use error::{LedgerError, Result};
pub use files::{write_durably, AppendFile, FileLayer, OsFiles};
pub use id::{Id, IdPrefix, ObjectKind, ID_LEN, MIN_PREFIX_HEX};
pub use index::ObjLoc;
pub use migrate::{is_v1, migrate_v1, Migrated};
pub use object::{
    check_ref_name, Event, EventEnvelope, Meta, NewEvent, NOT_RECORDED, TREE_FROM, TREE_SCRUBBED,
    WALL_MS_FROM,
};
pub use recovery::{Damage, DamageKind};
pub use store::{
    Batch, Chain, Durability, Ledger, Options, Promisor, RecoveryReport, SetAside, Unprotected,
    Unsettled, QUARANTINE_DIR,
};
pub use tree::{Change, EntryKind, Tree, TreeEntry};
pub use verify::{KindStats, PayloadCheck, Problem, Stats, VerifyOptions, VerifyReport};

/// Re-exported so tests and tools can talk about the on-disk format.
pub mod format {
    pub use crate::segment::{
        FORMAT_VERSION, HEADER_BLOCK_LEN, MAX_DELTA_GENERATION, RECORD_HEADER_LEN, RECORD_MAGIC,
        RECORD_TRAILER_LEN, SEGMENT_HEADER_LEN, SEGMENT_MAGIC,
    };
}
