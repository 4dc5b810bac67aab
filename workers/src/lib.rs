//! `workers`: a run's work items executed on many machines through an
//! object store, with no scheduler of our own.
//!
//! The coordinator (`mass run FILE --workers URL`, [`coordinator`])
//! publishes each item a stage submits as one object named by the BLAKE3 of
//! its inputs, and waits for its result; any number of `mass worker URL`
//! processes ([`worker`]) claim items with leases on the store
//! ([`lease`]), execute them exactly as the in-process executor does, push
//! what they recorded and publish a result with create-if-absent (an item
//! executed twice yields one result). The coordinator pulls each result
//! into the run under the item's streams, so the run's ledger, head and
//! replay are the same whoever executed what. What lives where on the
//! store is in [`wire`]; [`status`] reads it back for `mass status`.

pub mod coordinator;
pub mod error;
pub mod execute;
pub mod lease;
pub mod status;
pub mod wire;
pub mod worker;

pub use coordinator::{Settings, Workers, WORKERS_STREAM};
pub use error::{Result, WorkError};
pub use worker::{Options, Stats, Worker};
