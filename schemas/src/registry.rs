//! The registry of known kinds: decode any payload to a JSON view (for `mass
//! show`, `mass export`) or just validate it (for `mass verify`), by kind and version.

use crate::{
    decode, Cycle, Dataset, Effect, Evaluation, Judgment, ModelCall, Note, Promotion,
    ProposalRecord, Ranking, Record, Rollout, RunForked, RunStarted, SchemaError, Selection,
    Training, WorkspaceSnapshot,
};

/// A known kind and its current version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindInfo {
    pub kind: &'static str,
    pub version: u32,
}

macro_rules! registry {
    ($($t:ty),* $(,)?) => {
        /// Every kind this build can read.
        pub fn known_kinds() -> Vec<KindInfo> {
            vec![$(KindInfo { kind: <$t>::KIND, version: <$t>::VERSION }),*]
        }

        /// Decodes a payload into a JSON view.
        pub fn describe(kind: &str, version: u32, payload: &[u8]) -> Result<serde_json::Value, SchemaError> {
            $(
                if kind == <$t>::KIND {
                    let r: $t = decode(kind, version, payload)?;
                    return serde_json::to_value(&r).map_err(|e| SchemaError::Encode {
                        kind: kind.into(),
                        detail: e.to_string(),
                    });
                }
            )*
            Err(SchemaError::UnknownKind {
                kind: kind.into(),
                known: known_kinds().iter().map(|k| k.kind).collect::<Vec<_>>().join(", "),
            })
        }
    };
}

registry!(
    Note,
    ModelCall,
    WorkspaceSnapshot,
    Effect,
    RunStarted,
    RunForked,
    Rollout,
    Judgment,
    ProposalRecord,
    Promotion,
    Ranking,
    Selection,
    Dataset,
    Training,
    Evaluation,
    Cycle,
);

/// Validates a payload against its kind and version.
pub fn check(kind: &str, version: u32, payload: &[u8]) -> Result<(), SchemaError> {
    describe(kind, version, payload).map(|_| ())
}
