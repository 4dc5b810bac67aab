//! `engine`: the MASS method (see MASS.md) on the ledger.
//!
//! Everything non-deterministic the engine does — model calls, tool runs,
//! checks, snapshots, training — goes through `replay` effects, and every
//! decision (rollouts, judgments, proposals, promotions, rankings, selections,
//! datasets, training steps, evaluations) is an event, so a run can be replayed,
//! resumed, re-judged and forked.

pub mod backend;
pub mod chat;
pub mod checks;
pub mod config;
pub mod context;
pub mod cycle;
pub mod dataset;
pub mod driver;
pub mod effects;
pub mod error;
pub mod exec;
pub mod guards;
pub mod harness;
pub mod judge;
pub mod milestone;
pub mod optimizer;
pub mod places;
pub mod prompts;
pub mod rejudge_imported;
pub mod stages;
pub mod status;
pub mod suite;
pub mod task;
pub(crate) mod toml_error;
pub mod tools;
pub mod trainer;
pub mod transcript;
pub mod work;
pub mod workflow;
