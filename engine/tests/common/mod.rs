//! Helpers shared by the engine's integration tests.

pub mod served;
