//! `schemas`: the typed records that `mass` stores as ledger event payloads.
//!
//! Every record type has a kind name and a schema version ([`Record::KIND`],
//! [`Record::VERSION`]). A payload is the rkyv archive of the record (validated
//! with bytecheck on every decode); the event envelope around it carries the kind
//! and version, so a reader always knows which layout to expect. `SCHEMAS.md` in
//! this crate documents each type like a wire format, and the `layout_pins` test
//! fails when a type's encoding changes without its version changing.
//!
//! ```
//! use schemas::{Note, Record};
//! let note = Note { text: "hello".into() };
//! let ev = schemas::to_event(&note).unwrap();
//! assert_eq!(ev.kind, "note");
//! let back: Note = schemas::decode(&ev.kind, ev.version, &ev.payload).unwrap();
//! assert_eq!(back, note);
//! ```

mod hash;
mod mass;
mod records;
mod registry;

pub use hash::Hash32;
pub use mass::*;
pub use records::*;
pub use registry::{check, describe, known_kinds, older_versions, KindInfo};

use ledger::NewEvent;
use rkyv::rancor;

/// Why a payload could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("unknown event kind {kind:?}; known kinds: {known}")]
    UnknownKind { kind: String, known: String },

    #[error("{kind} has no schema version {version}; this build knows version(s) {known}")]
    UnknownVersion {
        kind: String,
        version: u32,
        known: String,
    },

    #[error("expected a {expected} payload, the event is a {actual}")]
    KindMismatch { expected: String, actual: String },

    #[error("{kind} v{version} payload is malformed ({len} bytes): {detail}")]
    Malformed {
        kind: String,
        version: u32,
        len: usize,
        detail: String,
    },

    #[error("cannot encode {kind}: {detail}")]
    Encode { kind: String, detail: String },
}

/// Implemented by every record type.
pub trait Record:
    rkyv::Archive
    + for<'a> rkyv::Serialize<
        rkyv::api::high::HighSerializer<
            rkyv::util::AlignedVec,
            rkyv::ser::allocator::ArenaHandle<'a>,
            rancor::Error,
        >,
    > + serde::Serialize
    + Sized
where
    Self::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + rkyv::Deserialize<Self, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    /// The event kind, e.g. `model.call`.
    const KIND: &'static str;
    /// Bumped whenever the encoding changes.
    const VERSION: u32;

    /// Ids of blobs, trees and events the record names; they become the
    /// envelope's `refs`, so the ledger checks they exist and indexes them.
    fn links(&self) -> Vec<Hash32> {
        Vec::new()
    }

    /// A fixed, fully populated value used to pin the encoding.
    fn sample() -> Self;
}

/// Encodes a record's payload bytes.
pub fn encode<T: Record>(r: &T) -> Result<Vec<u8>, SchemaError>
where
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    rkyv::to_bytes::<rancor::Error>(r)
        .map(|v| v.to_vec())
        .map_err(|e| SchemaError::Encode {
            kind: T::KIND.into(),
            detail: e.to_string(),
        })
}

/// Builds the ledger event for a record: kind, version, payload and links.
pub fn to_event<T: Record>(r: &T) -> Result<NewEvent, SchemaError>
where
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    let mut refs: Vec<ledger::Id> = r.links().into_iter().map(|h| ledger::Id(h.0)).collect();
    refs.dedup();
    Ok(NewEvent::new(T::KIND, T::VERSION, encode(r)?).with_refs(refs))
}

/// Decodes a payload of `kind`/`version` as `T`, validating it.
pub fn decode<T: Record>(kind: &str, version: u32, payload: &[u8]) -> Result<T, SchemaError>
where
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    if kind != T::KIND {
        return Err(SchemaError::KindMismatch {
            expected: T::KIND.into(),
            actual: kind.into(),
        });
    }
    if version != T::VERSION {
        return Err(SchemaError::UnknownVersion {
            kind: kind.into(),
            version,
            known: T::VERSION.to_string(),
        });
    }
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(payload.len());
    aligned.extend_from_slice(payload);
    rkyv::from_bytes::<T, rancor::Error>(&aligned).map_err(|e| SchemaError::Malformed {
        kind: kind.into(),
        version,
        len: payload.len(),
        detail: e.to_string(),
    })
}

/// A record type that can be decoded from an event (every [`Record`] type):
/// lets generic code outside this crate decode without naming rkyv.
pub trait Decodable: Sized {
    /// As [`Record::KIND`] and [`Record::VERSION`].
    const KIND: &'static str;
    const VERSION: u32;
    fn from_event(ev: &ledger::Event) -> Result<Self, SchemaError>;
}

impl<T: Record> Decodable for T
where
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    const KIND: &'static str = <T as Record>::KIND;
    const VERSION: u32 = <T as Record>::VERSION;
    fn from_event(ev: &ledger::Event) -> Result<Self, SchemaError> {
        decode_event(ev)
    }
}

/// Decodes a ledger event as `T`.
pub fn decode_event<T: Record>(ev: &ledger::Event) -> Result<T, SchemaError>
where
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    decode(&ev.kind, ev.version, &ev.payload)
}

impl Selection {
    /// Reads a `mass.selection` event of any version this build knows (v1
    /// upgraded as [`From<SelectionV1>`] says); `None` for other kinds and
    /// for versions this build does not know.
    pub fn read(ev: &ledger::Event) -> Option<Result<Selection, SchemaError>> {
        if ev.kind != <Selection as Record>::KIND {
            return None;
        }
        match ev.version {
            1 => Some(decode_event::<SelectionV1>(ev).map(Selection::from)),
            2 => Some(decode_event::<Selection>(ev)),
            _ => None,
        }
    }
}

impl Training {
    /// Reads a `mass.training` event of any version this build knows (v1
    /// and v2 upgraded as [`From<TrainingV1>`] and [`From<TrainingV2>`]
    /// say); `None` for other kinds and for versions this build does not
    /// know.
    pub fn read(ev: &ledger::Event) -> Option<Result<Training, SchemaError>> {
        if ev.kind != <Training as Record>::KIND {
            return None;
        }
        match ev.version {
            1 => Some(decode_event::<TrainingV1>(ev).map(|t| Training::from(TrainingV2::from(t)))),
            2 => Some(decode_event::<TrainingV2>(ev).map(Training::from)),
            3 => Some(decode_event::<Training>(ev)),
            _ => None,
        }
    }
}
