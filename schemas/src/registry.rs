//! The registry of known kinds: decode any payload to a JSON view (for `mass
//! show`, `mass export`) or just validate it (for `mass verify`), by kind and
//! version. Old versions of a kind stay readable: stored bytes never change,
//! so a ledger written by an older build must still verify and display.

use crate::{
    decode, Cycle, CycleV1, Dataset, DatasetV1, Effect, Evaluation, EvaluationV1, EvaluationV2,
    GuardCheck, Judgment, ModelCall, Note, Promotion, ProposalRecord, Ranking, Record, Rollout,
    RunExecution, RunForked, RunMixed, RunMixedV1, RunRemoved, RunStarted, RunStartedV1,
    SchemaError, Selection, SelectionV1, TrainStep, Training, TrainingV1, TrainingV2, WorkResult,
    WorkspaceSnapshot,
};

/// A known kind and its current version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindInfo {
    pub kind: &'static str,
    pub version: u32,
}

macro_rules! registry {
    (current: [$($t:ty),* $(,)?], older: [$($old:ty),* $(,)?] $(,)?) => {
        /// Every kind this build writes, at the version it writes.
        pub fn known_kinds() -> Vec<KindInfo> {
            vec![$(KindInfo { kind: <$t>::KIND, version: <$t>::VERSION }),*]
        }

        /// Older versions this build still reads (and writes only where a
        /// run recorded by an older driver is driven: `mass.evaluation` v2,
        /// `mass.selection` v1).
        pub fn older_versions() -> Vec<KindInfo> {
            vec![$(KindInfo { kind: <$old>::KIND, version: <$old>::VERSION }),*]
        }

        /// Decodes a payload into a JSON view.
        pub fn describe(kind: &str, version: u32, payload: &[u8]) -> Result<serde_json::Value, SchemaError> {
            $(
                if kind == <$t>::KIND && version == <$t>::VERSION {
                    let r: $t = decode(kind, version, payload)?;
                    return to_json(kind, &r);
                }
            )*
            $(
                if kind == <$old>::KIND && version == <$old>::VERSION {
                    let r: $old = decode(kind, version, payload)?;
                    return to_json(kind, &r);
                }
            )*
            let versions: Vec<String> = known_kinds()
                .into_iter()
                .chain(older_versions())
                .filter(|k| k.kind == kind)
                .map(|k| k.version.to_string())
                .collect();
            if versions.is_empty() {
                return Err(SchemaError::UnknownKind {
                    kind: kind.into(),
                    known: known_kinds().iter().map(|k| k.kind).collect::<Vec<_>>().join(", "),
                });
            }
            Err(SchemaError::UnknownVersion {
                kind: kind.into(),
                version,
                known: versions.join(", "),
            })
        }
    };
}

fn to_json<T: serde::Serialize>(kind: &str, r: &T) -> Result<serde_json::Value, SchemaError> {
    serde_json::to_value(r).map_err(|e| SchemaError::Encode {
        kind: kind.into(),
        detail: e.to_string(),
    })
}

registry!(
    current: [
        Note,
        ModelCall,
        WorkspaceSnapshot,
        Effect,
        RunStarted,
        RunExecution,
        RunForked,
        RunMixed,
        RunRemoved,
        Rollout,
        Judgment,
        ProposalRecord,
        Promotion,
        Ranking,
        Selection,
        GuardCheck,
        Dataset,
        Training,
        TrainStep,
        Evaluation,
        Cycle,
        WorkResult,
    ],
    older: [
        RunStartedV1,
        EvaluationV1,
        EvaluationV2,
        CycleV1,
        DatasetV1,
        TrainingV1,
        TrainingV2,
        RunMixedV1,
        SelectionV1
    ],
);

/// Validates a payload against its kind and version.
pub fn check(kind: &str, version: u32, payload: &[u8]) -> Result<(), SchemaError> {
    describe(kind, version, payload).map(|_| ())
}
