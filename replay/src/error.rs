//! Replay errors. A [`Divergence`] is the important one: the driver asked for
//! something other than what the recording holds at that point.

use ledger::Id;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),

    #[error(transparent)]
    Schema(#[from] schemas::SchemaError),

    #[error("{0}")]
    Divergence(Box<Divergence>),

    #[error("stream {stream:?}: the recording ends at position {position}, but the driver went on (a replay check never runs anything live)")]
    RecordingEnded { stream: String, position: u64 },

    #[error("stream {stream:?} position {position}: recorded event {id} is not what this build can read: {detail}")]
    BadRecording {
        stream: String,
        position: u64,
        id: Id,
        detail: String,
    },

    #[error("cannot fork at {at}: {reason}")]
    BadFork { at: Id, reason: String },
}

/// Where and how a replayed driver left the recorded path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    pub stream: String,
    pub position: u64,
    /// What the recording holds there: an effect request id or an event id.
    pub expected: Id,
    /// What the driver produced instead.
    pub actual: Id,
    /// One-line summary, e.g. "effect model: different request".
    pub summary: String,
    /// Readable differences, one per line (`$.messages[2].content: "a" -> "b"`).
    pub diff: Vec<String>,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "replay diverged in stream {:?} at position {}: {}",
            self.stream, self.position, self.summary
        )?;
        writeln!(f, "  expected (recorded): {}", self.expected)?;
        write!(f, "  actual (this run):   {}", self.actual)?;
        for d in &self.diff {
            write!(f, "\n  {d}")?;
        }
        Ok(())
    }
}

pub type Result<T, E = ReplayError> = std::result::Result<T, E>;
