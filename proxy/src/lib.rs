//! The recording proxy: an OpenAI-compatible reverse proxy that records every
//! exchange of any client (an external agent harness, a script) into a
//! stream of a run, byte for byte and streaming included, and that answers
//! the same client again from that recording with no upstream at all.
//! `wire.rs` reads the wire format, `log.rs` writes and reads proxy streams,
//! `normalise.rs` says when two requests are the same, `book.rs` matches
//! requests to recorded exchanges, `scrub.rs` keeps credentials out of
//! everything recorded, printed or echoed, `route.rs` is what a route
//! forwards to, records into and lets through, `server/` is the HTTP side.
//! The client's credential headers pass through to the upstream (or, when
//! the route has a token or its upstream a key of its own, are replaced)
//! and are never recorded.

pub mod book;
pub mod log;
pub mod normalise;
pub mod route;
pub mod scrub;
pub mod server;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ledger::{Id, Ledger};

pub use book::Book;
pub use log::WireLog;
pub use normalise::{NormaliseConfig, Normaliser};
pub use route::{Limits, Route, Upstream};
pub use scrub::Secret;
pub use server::ProxyServer;

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
    /// Exchanges passed through (or still in flight when the drain ended)
    /// that were not recorded, named.
    pub unrecorded: Vec<String>,
}

/// How `serve_until_signal` serves and stops.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub limits: Limits,
    /// Requests must carry this token (`Route::require_token`).
    pub token: Option<Secret>,
    /// How long a stop waits for exchanges in flight.
    pub drain: Duration,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            limits: Limits::default(),
            token: None,
            drain: Duration::from_secs(10),
        }
    }
}

/// Runs a proxy on `listen` for stream `stream` of `run` until SIGINT or
/// SIGTERM; `ready` gets the client base URL once it listens. On the
/// signal it stops taking requests and waits up to `opts.drain` (a second
/// signal: no longer) for the exchanges in flight; everything recorded is
/// durable when this returns, and `Summary::unrecorded` names what was not.
pub fn serve_until_signal(
    ledger: Arc<Ledger>,
    listen: SocketAddr,
    run: &str,
    stream: &str,
    mode: Mode,
    opts: &ServeOptions,
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
        let mut route = match mode {
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
        }
        .with_limits(opts.limits);
        if let Some(t) = &opts.token {
            route = route.require_token(t.clone());
        }
        let route = Arc::new(route);
        let server = ProxyServer::bind(listen).await?;
        // Handlers first: a signal that follows the announcement at once
        // must stop the proxy cleanly, not kill it.
        let mut signals = Signals::install()?;
        ready(&server.set_default(route.clone()));
        signals.wait().await;
        let mut unrecorded = tokio::select! {
            left = server.drain(opts.drain) => left,
            _ = signals.wait() => server.drain(Duration::ZERO).await,
        };
        drop(server);
        let head = route.finish().await?;
        unrecorded.extend(route.unrecorded());
        Ok(Summary {
            head,
            progress: route.progress(),
            misses: route.misses(),
            unrecorded,
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

    async fn wait(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}
