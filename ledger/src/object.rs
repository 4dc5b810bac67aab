//! The typed objects the ledger stores: event envelopes, ref updates and the
//! unhashed metadata kept beside each object.
//!
//! An event's canonical bytes are the rkyv archive of [`EventEnvelope`]; its id is
//! `BLAKE3("mass.event\0" || archive)`. The envelope carries the payload (itself
//! the rkyv archive of a record type from the `schemas` crate) as opaque bytes,
//! so the ledger validates structure and links but never needs to know what a
//! payload means.

use std::collections::BTreeMap;

use rkyv::rancor;
use serde::{Deserialize, Serialize};

use crate::error::{LedgerError, Result};
use crate::id::Id;

/// The hashed form of an event. Field order and types are part of the format:
/// changing them re-addresses every event (the golden test in `tests/golden.rs`
/// catches that).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct EventEnvelope {
    /// Record type name, e.g. `mass.model_call` (see the `schemas` crate).
    pub kind: String,
    /// Schema version of the payload.
    pub version: u32,
    /// The actor stream this event belongs to (inherited from `prev`).
    pub stream: String,
    /// Position in the stream: 0 for the first event, `prev.seq + 1` otherwise.
    pub seq: u64,
    /// The previous event of the stream (the hash chain).
    pub prev: Option<[u8; 32]>,
    /// Other causal parents, e.g. the final head of a child stream.
    pub parents: Vec<[u8; 32]>,
    /// Blobs and trees the event refers to.
    pub refs: Vec<[u8; 32]>,
    /// The rkyv archive of the typed record.
    pub payload: Vec<u8>,
}

impl EventEnvelope {
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        rkyv::to_bytes::<rancor::Error>(self)
            .map(|v| v.to_vec())
            .map_err(|e| LedgerError::Index {
                detail: format!("cannot encode event: {e}"),
            })
    }

    /// Decodes and validates (bytecheck) an envelope read for `id`.
    pub fn from_bytes(id: &Id, bytes: &[u8]) -> Result<EventEnvelope> {
        // rkyv needs the archive aligned; bytes from disk carry no alignment promise.
        let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
        aligned.extend_from_slice(bytes);
        rkyv::from_bytes::<EventEnvelope, rancor::Error>(&aligned).map_err(|e| {
            LedgerError::Corruption {
                id: *id,
                detail: format!("event envelope fails validation: {e}"),
            }
        })
    }
}

/// An event as returned by reads, with ids typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: Id,
    pub kind: String,
    pub version: u32,
    pub stream: String,
    pub seq: u64,
    pub prev: Option<Id>,
    pub parents: Vec<Id>,
    pub refs: Vec<Id>,
    pub payload: Vec<u8>,
}

impl Event {
    pub(crate) fn from_envelope(id: Id, e: EventEnvelope) -> Event {
        Event {
            id,
            kind: e.kind,
            version: e.version,
            stream: e.stream,
            seq: e.seq,
            prev: e.prev.map(Id),
            parents: e.parents.into_iter().map(Id).collect(),
            refs: e.refs.into_iter().map(Id).collect(),
            payload: e.payload,
        }
    }

    /// Every id this event links to: prev, parents and refs.
    pub fn links(&self) -> impl Iterator<Item = &Id> {
        self.prev
            .iter()
            .chain(self.parents.iter())
            .chain(self.refs.iter())
    }
}

impl EventEnvelope {
    /// The envelope an event gets at position `seq` of `stream` after `prev`.
    pub fn build(stream: &str, seq: u64, prev: Option<Id>, ev: &NewEvent) -> EventEnvelope {
        EventEnvelope {
            kind: ev.kind.clone(),
            version: ev.version,
            stream: stream.to_string(),
            seq,
            prev: prev.map(|i| i.0),
            parents: ev.parents.iter().map(|i| i.0).collect(),
            refs: ev.refs.iter().map(|i| i.0).collect(),
            payload: ev.payload.clone(),
        }
    }

    /// The id this envelope has (or would have) in a ledger.
    pub fn id(&self) -> Result<Id> {
        Ok(Id::of(crate::id::ObjectKind::Event, &self.to_bytes()?))
    }
}

/// What a caller supplies to append an event; the ledger fills in stream,
/// seq and prev from the ref being appended to.
#[derive(Debug, Clone, Default)]
pub struct NewEvent {
    /// Stream name for the first event of a stream (default: the ref name).
    /// Later events inherit the stream of `prev`; naming another one is an error.
    pub stream: Option<String>,
    pub kind: String,
    pub version: u32,
    pub parents: Vec<Id>,
    pub refs: Vec<Id>,
    pub payload: Vec<u8>,
    /// Extra unhashed metadata (latency, model host, ...). Never put secrets here.
    pub meta: BTreeMap<String, String>,
}

impl NewEvent {
    pub fn new(kind: impl Into<String>, version: u32, payload: Vec<u8>) -> NewEvent {
        NewEvent {
            kind: kind.into(),
            version,
            payload,
            ..NewEvent::default()
        }
    }

    pub fn with_refs(mut self, refs: Vec<Id>) -> Self {
        self.refs = refs;
        self
    }

    pub fn with_parents(mut self, parents: Vec<Id>) -> Self {
        self.parents = parents;
        self
    }

    pub fn in_stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = Some(stream.into());
        self
    }

    pub fn with_meta(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.meta.insert(key.into(), value.into());
        self
    }
}

/// Unhashed facts about when and where an object was written. Replaying the same
/// decisions later yields the same ids precisely because these live outside the hash.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Wall-clock time of the write, milliseconds since the Unix epoch; for
    /// an event taken whole from elsewhere (an import), the time its source
    /// gives, and then `extra[WALL_MS_FROM]` says when that is a guess.
    pub wall_ms: u64,
    pub host: String,
    pub pid: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, String>,
}

/// The `extra` key an event's metadata carries when `wall_ms` is not when
/// the step happened but a stand-in, with where it came from (`mass import
/// sakana` gives `file mtime` to steps the reference logged no time for: a
/// file's mtime changes on every copy). Readers treat such a time as
/// unknown: `mass report` shows no duration that ends or starts there.
pub const WALL_MS_FROM: &str = "wall_ms_from";

/// The `extra` key naming, comma-separated, the fields of an event's record
/// that its source did not record (`mass import sakana`: the reference has
/// no root seed, no guards, no tokenizer), whose values in the record are
/// placeholders the schema forces. Readers show them as not recorded
/// (`null`), never as the placeholder.
pub const NOT_RECORDED: &str = "not_recorded";

/// The `extra` key a rollout event's metadata carries when its `tree` is
/// not the workspace as the run left it but a stand-in, with where it came
/// from (`mass import sakana` gives `run folder at import`: the reference
/// leaves each episode's workspace in its run folder, where anything may
/// have changed it after the episode ended). Readers say so wherever they
/// show the final workspace.
pub const TREE_FROM: &str = "tree_from";

/// The `extra` key naming, as a JSON list, the paths of a rollout's `tree`
/// whose recorded bytes are not the source's: a credential in them was
/// replaced by `REDACTED` (`mass import sakana` scrubs workspace files as
/// it scrubs everything it records). Absent when no file was changed.
pub const TREE_SCRUBBED: &str = "tree_scrubbed";

impl Meta {
    /// Where a stand-in `tree` came from (`TREE_FROM`); `None` for a tree
    /// the run recorded itself.
    pub fn tree_from(&self) -> Option<&str> {
        self.extra.get(TREE_FROM).map(String::as_str)
    }

    /// The tree's paths whose bytes were scrubbed (`TREE_SCRUBBED`); a
    /// value that is no JSON list of strings is given back whole, as one.
    pub fn tree_scrubbed(&self) -> Vec<String> {
        let Some(v) = self.extra.get(TREE_SCRUBBED) else {
            return Vec::new();
        };
        serde_json::from_str(v).unwrap_or_else(|_| vec![v.clone()])
    }

    /// Whether `extra` lists `field` as not recorded (`NOT_RECORDED`).
    pub fn not_recorded(&self, field: &str) -> bool {
        self.extra
            .get(NOT_RECORDED)
            .is_some_and(|v| v.split(',').any(|f| f == field))
    }

    /// `wall_ms`, unless `extra` marks it as a stand-in (`WALL_MS_FROM`).
    pub fn known_wall_ms(&self) -> Option<u64> {
        (!self.extra.contains_key(WALL_MS_FROM)).then_some(self.wall_ms)
    }

    pub(crate) fn now(extra: BTreeMap<String, String>) -> Meta {
        let wall_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Meta {
            wall_ms,
            host: hostname(),
            pid: pid(),
            extra,
        }
    }
}

/// Read once per process (`getpid` is a system call per event otherwise).
fn pid() -> u32 {
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// Read once per process: it was 30% of a batched append's CPU time.
fn hostname() -> String {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_default()
    })
    .clone()
}

/// A ref update record: the operation log from which refs are rebuilt. A
/// `new` of all zeros ([`DELETED`]) removes the ref (see FORMAT.md).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    pub name: String,
    pub old: Option<[u8; 32]>,
    pub new: [u8; 32],
}

/// The `new` of a ref update that deletes the ref. No object has this id
/// (it would need a BLAKE3 output of all zeros).
pub const DELETED: [u8; 32] = [0; 32];

impl RefUpdate {
    /// The ref's head after this update; `None` when the update deletes it.
    pub(crate) fn new_head(&self) -> Option<Id> {
        (self.new != DELETED).then_some(Id(self.new))
    }

    pub(crate) fn to_bytes(&self) -> Result<Vec<u8>> {
        rkyv::to_bytes::<rancor::Error>(self)
            .map(|v| v.to_vec())
            .map_err(|e| LedgerError::Index {
                detail: format!("cannot encode ref update: {e}"),
            })
    }

    pub(crate) fn from_bytes(bytes: &[u8]) -> std::result::Result<RefUpdate, String> {
        let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
        aligned.extend_from_slice(bytes);
        rkyv::from_bytes::<RefUpdate, rancor::Error>(&aligned).map_err(|e| e.to_string())
    }
}

/// Checks a ref name: non-empty, printable, slash-separated components that are
/// not `.`/`..`, at most 255 bytes. Names stay usable as file names and CLI words.
pub fn check_ref_name(name: &str) -> Result<()> {
    let bad = |reason: &str| LedgerError::BadRefName {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() > 255 {
        return Err(bad("longer than 255 bytes"));
    }
    if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad("contains whitespace or control characters"));
    }
    if name
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad("has an empty, '.' or '..' component"));
    }
    Ok(())
}
