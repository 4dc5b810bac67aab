//! The recording proxy: an OpenAI-compatible reverse proxy that records every
//! exchange of any client (an external agent harness, a script) into a
//! stream of a run, byte for byte and streaming included, and that answers
//! the same client again from that recording with no upstream at all.
//! `wire.rs` reads the wire format, `log.rs` writes and reads proxy streams,
//! `normalise.rs` says when two requests are the same, `book.rs` matches
//! requests to recorded exchanges, `server.rs` is the HTTP side.
//! API keys and other credential headers pass through to the upstream and
//! are never recorded.

pub mod book;
pub mod log;
pub mod normalise;
pub mod server;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;

use ledger::{Id, Ledger};

pub use book::Book;
pub use log::WireLog;
pub use normalise::{NormaliseConfig, Normaliser};
pub use server::{ProxyServer, Route, Upstream};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),
    #[error(transparent)]
    Schema(#[from] schemas::SchemaError),
    #[error("proxy stream {stream} is unreadable: {detail}")]
    Recording { stream: String, detail: String },
    #[error("stream {stream} holds no recorded exchange to replay (check the run and stream names: `mass refs`)")]
    NothingRecorded { stream: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Normalise(#[from] normalise::NormaliseError),
}

/// What `mass proxy` serves.
pub enum Mode {
    /// Forward to `upstream`, recording into the stream.
    Record { upstream: Upstream },
    /// Answer from the stream. `mixed`: misses go to this upstream and
    /// everything served is recorded into stream `stream` of run `into`.
    Replay {
        normaliser: Normaliser,
        mixed: Option<(Upstream, String)>,
    },
}

/// How one `mass proxy` session ended.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The head of the stream recorded into, if any.
    pub head: Option<Id>,
    /// Replay: served of recorded exchanges.
    pub progress: Option<(usize, usize)>,
    /// Replay: the miss reports.
    pub misses: Vec<String>,
}

/// Runs a proxy on `listen` for stream `stream` of `run` until SIGINT or
/// SIGTERM; `ready` gets the client base URL once it listens. Everything
/// passed through is durable when this returns.
pub fn serve_until_signal(
    ledger: Arc<Ledger>,
    listen: SocketAddr,
    run: &str,
    stream: &str,
    mode: Mode,
    ready: impl FnOnce(&str),
) -> Result<Summary, ProxyError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| ProxyError::Io {
            what: "start the async runtime".into(),
            source: e,
        })?;
    rt.block_on(async move {
        let route = Arc::new(match mode {
            Mode::Record { upstream } => {
                Route::record(WireLog::open(ledger.clone(), run, stream)?, upstream)
            }
            Mode::Replay { normaliser, mixed } => {
                let book = Book::open(ledger.clone(), run, stream, normaliser)?;
                match mixed {
                    Some((upstream, into)) => Route::replay(
                        book,
                        Some(upstream),
                        Some(WireLog::open(ledger.clone(), &into, stream)?),
                    ),
                    None => Route::replay(book, None, None),
                }
            }
        });
        let server = ProxyServer::bind(listen).await?;
        // Handlers first: a signal that follows the announcement at once
        // must stop the proxy cleanly, not kill it.
        let signals = Signals::install()?;
        ready(&server.set_default(route.clone()));
        signals.wait().await;
        drop(server);
        let head = route.finish().await?;
        Ok(Summary {
            head,
            progress: route.progress(),
            misses: route.misses(),
        })
    })
}

struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals, ProxyError> {
        use tokio::signal::unix::{signal, SignalKind};
        let io = |e| ProxyError::Io {
            what: "install the signal handlers".into(),
            source: e,
        };
        Ok(Signals {
            int: signal(SignalKind::interrupt()).map_err(io)?,
            term: signal(SignalKind::terminate()).map_err(io)?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}
