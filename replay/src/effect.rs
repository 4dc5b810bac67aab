//! What an effect is, as the replay layer sees it: canonical request bytes (whose
//! blob id is the request id compared on replay), blobs and links that go with
//! the request or output, and the recorded outcome.

use ledger::Id;

/// A request for one non-deterministic step.
#[derive(Debug, Clone)]
pub struct EffectRequest {
    /// Effect kind: `model`, `tool`, `snapshot`, `trainer`, `clock`, ...
    pub kind: String,
    /// Canonical request bytes (usually compact JSON with sorted keys). Large
    /// parts (message texts) should be separate blobs named by id in here.
    pub bytes: Vec<u8>,
    /// Blobs to store with the request (e.g. new messages), by content.
    pub blobs: Vec<Vec<u8>>,
    /// Objects already in the ledger that the request names (e.g. a prefix event).
    pub links: Vec<Id>,
    /// Journal a `started` record before running: for long or non-idempotent
    /// effects, so a crash leaves a visible "started, no result".
    pub journaled: bool,
}

impl EffectRequest {
    pub fn new(kind: impl Into<String>, bytes: Vec<u8>) -> Self {
        EffectRequest {
            kind: kind.into(),
            bytes,
            blobs: Vec::new(),
            links: Vec::new(),
            journaled: false,
        }
    }

    /// From a JSON value, serialised canonically (sorted keys, no whitespace).
    pub fn json(kind: impl Into<String>, v: &serde_json::Value) -> Self {
        Self::new(kind, canonical_json(v))
    }

    pub fn journaled(mut self) -> Self {
        self.journaled = true;
        self
    }

    pub fn with_blob(mut self, bytes: Vec<u8>) -> Self {
        self.blobs.push(bytes);
        self
    }

    pub fn with_link(mut self, id: Id) -> Self {
        self.links.push(id);
        self
    }

    /// The request id: the blob id of the canonical bytes.
    pub fn id(&self) -> Id {
        Id::of(ledger::ObjectKind::Blob, &self.bytes)
    }
}

/// What performing an effect produced.
#[derive(Debug, Clone, Default)]
pub struct EffectOutput {
    /// Canonical output bytes.
    pub bytes: Vec<u8>,
    /// Blobs to store with the output.
    pub blobs: Vec<Vec<u8>>,
    /// Objects already stored that the output names (e.g. a snapshot's tree).
    pub links: Vec<Id>,
}

impl EffectOutput {
    pub fn new(bytes: Vec<u8>) -> Self {
        EffectOutput {
            bytes,
            ..Default::default()
        }
    }

    pub fn json(v: &serde_json::Value) -> Self {
        Self::new(canonical_json(v))
    }

    pub fn with_link(mut self, id: Id) -> Self {
        self.links.push(id);
        self
    }
}

/// Why an effect failed, which decides what a resume does with the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// Outside the run's control and worth another attempt: I/O, a timeout,
    /// HTTP 429/5xx, a killed process, a trainer crash. A run stops on it;
    /// a resume retries it if it is the last record of its stream (each
    /// attempt stays recorded), and replays serve attempts as recorded.
    Transient,
    /// Part of the run's course: a tool's error the model saw, a model's own
    /// halting, an invalid answer after re-asks. Always served as recorded.
    Final,
}

/// A failed attempt: what went wrong and whether it may be retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectError {
    pub class: FailureClass,
    pub message: String,
}

impl EffectError {
    pub fn transient(message: impl Into<String>) -> Self {
        EffectError {
            class: FailureClass::Transient,
            message: message.into(),
        }
    }

    pub fn final_(message: impl Into<String>) -> Self {
        EffectError {
            class: FailureClass::Final,
            message: message.into(),
        }
    }
}

/// A plain message is a final failure: retrying must be asked for explicitly.
impl From<String> for EffectError {
    fn from(message: String) -> Self {
        EffectError::final_(message)
    }
}

impl From<&str> for EffectError {
    fn from(message: &str) -> Self {
        EffectError::final_(message)
    }
}

impl std::fmt::Display for EffectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// An effect as recorded: served from the ledger or just performed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The `effect` event holding the result.
    pub event: Id,
    /// Output bytes, or the recorded failure.
    pub output: Result<Vec<u8>, String>,
    /// For a failure: its class (`None` on success).
    pub failure: Option<FailureClass>,
    /// How this call was satisfied.
    pub source: Served,
}

impl Recorded {
    pub fn json(&self) -> Result<serde_json::Value, String> {
        match &self.output {
            Ok(b) => serde_json::from_slice(b).map_err(|e| format!("output is not JSON: {e}")),
            Err(e) => Err(e.clone()),
        }
    }
}

/// Where a result came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Served {
    /// Replayed from this run's own history (resume, replay check, fork prefix).
    History,
    /// Taken from the source run of a mixed-mode session.
    Source,
    /// Performed now.
    Live,
}

/// Canonical JSON: object keys sorted (serde_json's default map is ordered), no whitespace.
pub fn canonical_json(v: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}
