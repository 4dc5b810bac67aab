//! What can go wrong with work through a store, by class: the store (retried,
//! then an infrastructure failure), what is on it (damaged or foreign), and
//! the work itself.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum WorkError {
    #[error(transparent)]
    Remote(#[from] remote::RemoteError),
    #[error(transparent)]
    Engine(#[from] engine::error::EngineError),
    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),
    /// An object on the store is not what its name says.
    #[error("{key} on the work store is unreadable: {detail}")]
    Format { key: String, detail: String },
    /// A result the coordinator will not take.
    #[error("the result of work item {job} was refused: {detail}. It stays on the store (work/results/{job}.json); remove it there, or use a new --workers location, then `mass resume` executes the item again")]
    Refused { job: String, detail: String },
    /// An item could not be published, or a worker refused it.
    #[error("work item {job} could not be published or executed: {detail}")]
    Publish { job: String, detail: String },
    /// The store did not answer for longer than the coordinator waits.
    #[error("the work store {location} has been unreachable for {secs}s (last error: {last}); everything recorded so far is kept: `mass resume` continues once it answers")]
    StoreDown {
        location: String,
        secs: u64,
        last: String,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = WorkError> = std::result::Result<T, E>;

impl From<WorkError> for engine::error::EngineError {
    fn from(e: WorkError) -> Self {
        use engine::error::EngineError as E;
        match e {
            WorkError::Engine(e) => e,
            WorkError::Ledger(le) => E::Ledger(le),
            e @ (WorkError::StoreDown { .. }
            | WorkError::Remote(remote::RemoteError::Store { .. })) => E::Infrastructure {
                what: "waiting for work items".into(),
                detail: e.to_string(),
            },
            other => E::Invalid(other.to_string()),
        }
    }
}
