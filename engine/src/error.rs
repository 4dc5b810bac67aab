//! The engine's error type.

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Replay(#[from] replay::ReplayError),
    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),
    #[error(transparent)]
    Schema(#[from] schemas::SchemaError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Task(#[from] crate::task::TaskError),
    #[error("backend: {0}")]
    Backend(#[from] crate::backend::BackendError),
    /// The sandbox level the experiment asks for cannot be provided here.
    #[error("sandbox: {0}")]
    Sandbox(#[from] sandbox::SandboxError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("recorded {what} is unreadable: {detail}")]
    Recording { what: String, detail: String },
    #[error(transparent)]
    Proxy(#[from] proxy::ProxyError),
    #[error("{0}")]
    Invalid(String),
    /// What the user named does not exist (a file, a line, a record).
    #[error("{0}")]
    NotFound(String),
    /// An effect failed for a reason outside the run (a transient failure):
    /// the run stops, the attempt stays recorded, and `mass resume` retries it.
    #[error("{what} failed: {detail} (an infrastructure failure: the attempt is recorded; fix the cause, then `mass resume` retries it)")]
    Infrastructure { what: String, detail: String },
}

impl EngineError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        EngineError::Io {
            context: context.into(),
            source,
        }
    }
    pub fn recording(what: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        EngineError::Recording {
            what: what.into(),
            detail: detail.to_string(),
        }
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
