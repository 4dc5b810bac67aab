//! The stages of a MASS cycle, by the names the MASS articles and the
//! reference implementation give them, in the order a cycle runs them
//! (`cycle.rs`): [`search`] (the inner loop), [`collect`], [`judge`],
//! [`rank`], [`select`], [`dataset`], [`train`], [`evaluate`]. Each is a
//! module with a typed output (what it recorded, as later stages read it)
//! and a `run` function taking the outputs of the stages before it. Every
//! stage appends its records to the ledger and ends with a step on the main
//! stream, so a fork can begin between any two stages (`milestone.rs`
//! names the stages and finds those steps in a recorded run).

pub mod collect;
pub mod dataset;
pub mod evaluate;
pub mod judge;
pub mod rank;
pub mod search;
pub mod select;
pub mod train;

/// The reason an exclusion by the guards carries in `mass.selection`:
/// `guard: ` and the violations (what `mass status` counts).
pub(crate) fn guard_reason(violations: &[String]) -> String {
    format!("guard: {}", violations.join("; "))
}
