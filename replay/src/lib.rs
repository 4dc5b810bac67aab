//! `replay`: effects, deterministic replay, resume and forks over the ledger.
//!
//! A driver (the MASS engine, or a test driver) never touches the network, a
//! process, the clock or a random generator directly: it asks a [`Stream`] to
//! run an *effect* (a canonical request plus a closure that performs it) and
//! records *decisions* as plain events. The stream matches each step against
//! the run's recorded history:
//!
//! - inside the history, effects are served from the ledger (nothing runs) and
//!   every produced event must have the recorded id, else a [`Divergence`]
//!   names the stream, the position, both ids and a readable diff;
//! - past the history, effects run live and are appended (journaled effects
//!   as `started` first, so a crash leaves a visible unfinished effect that
//!   resume re-issues; a recorded result is never re-run);
//! - in [`Mode::Check`] nothing runs and nothing is appended;
//! - with a [`SourceRun`] (mixed mode), effects past the history are served
//!   from another run's same stream when their request matches, except for
//!   the kinds chosen to run live (e.g. re-judging with a new judge).
//!
//! Seeds come from the run's recorded root seed by key derivation ([`seed`]),
//! so randomness needs no effect at all. State is a pure fold over events
//! ([`projection`]).
//!
//! ```
//! use std::sync::Arc;
//! use replay::{EffectOutput, EffectRequest, Mode, Session};
//! let dir = tempfile::tempdir().unwrap();
//! let ledger = Arc::new(ledger::Ledger::init(dir.path()).unwrap());
//! let run = |mode| -> String {
//!     let s = Session::new(ledger.clone(), "exp", mode).unwrap();
//!     let mut st = s.stream("worker").unwrap();
//!     let req = EffectRequest::json("dice", &serde_json::json!({"sides": 6}));
//!     let r = st.effect_blocking(req, || Ok(EffectOutput::new(b"4".to_vec()))).unwrap();
//!     String::from_utf8(r.output.unwrap()).unwrap()
//! };
//! assert_eq!(run(Mode::Live), "4");   // performed and recorded
//! assert_eq!(run(Mode::Check), "4");  // served from the ledger, nothing runs
//! ```

pub mod diff;
mod effect;
mod error;
mod fork;
pub mod projection;
mod remove;
pub mod seed;
mod session;
mod stream;

pub use effect::{
    canonical_json, EffectError, EffectOutput, EffectRequest, FailureClass, Recorded, Served,
};
pub use error::{Divergence, ReplayError, Result};
pub use fork::fork_run;
pub use remove::{remove_run, run_refs, Removed, REMOVALS};
pub use session::{ref_name, Clock, Mode, Session, SourceRun, EXECUTION, MAIN};
pub use stream::{Begin, Pending, Stream, ELAPSED_META};
