//! The proxy's HTTP side: a hyper HTTP/1 server (on TCP or a unix socket)
//! whose routes each record into, or answer from, one proxy stream.
//! Requests are forwarded as received (method, path, query, body bytes,
//! headers but hop-by-hop ones and `accept-encoding`, so bodies come back
//! readable; the client's credentials are replaced when the route has a
//! token or its upstream a key), and responses come back chunk by chunk as
//! the upstream sends them: the client's bytes are never held for the
//! recording, which happens after the last chunk is passed on, in order, by
//! one writer thread per route.
//!
//! An exchange that does not end cleanly does not look clean to the
//! client: a body the upstream breaks off, or one past the route's cap,
//! aborts the client's reply (no terminating chunk). A client that goes
//! away cancels the upstream request (its future is dropped). Each is
//! recorded with its failure class.
//!
//! A route is chosen by path: `/s/<name>/...` is route `<name>` (one per
//! rollout), anything else the default route (`mass proxy`).
//!
//! Where things live: the server, its routes and the exchanges in flight
//! here; the response body in `body.rs`; the hyper service (routing,
//! refusals, reading the request) in `service.rs`; forwarding upstream in
//! `forward.rs`; replay answering in `replay.rs`; the exchange on its way
//! to the writer in `pending.rs`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::route::Route;
use crate::ProxyError;

mod body;
mod forward;
mod pending;
mod replay;
mod service;

pub use body::{Aborted, ProxyBody};
use service::handle;

/// Exchanges in flight (from arrival until queued for the writer), so a
/// shutdown can wait for them and name those it could not.
#[derive(Default)]
struct Flights {
    next: AtomicU64,
    live: Mutex<HashMap<u64, (String, Instant)>>,
    idle: tokio::sync::Notify,
}

/// One exchange in flight; ends when dropped.
pub(crate) struct Flight {
    flights: Arc<Flights>,
    id: u64,
}

impl Drop for Flight {
    fn drop(&mut self) {
        let mut live = lock(&self.flights.live);
        live.remove(&self.id);
        if live.is_empty() {
            self.flights.idle.notify_waiters();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct State {
    client: reqwest::Client,
    routes: RwLock<HashMap<String, Arc<Route>>>,
    default: RwLock<Option<Arc<Route>>>,
    closing: AtomicBool,
    flights: Arc<Flights>,
}

impl State {
    fn take_off(&self, what: String) -> Flight {
        let id = self.flights.next.fetch_add(1, Ordering::SeqCst);
        lock(&self.flights.live).insert(id, (what, Instant::now()));
        Flight {
            flights: self.flights.clone(),
            id,
        }
    }
}

/// Where a server listens.
enum Local {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// A running proxy. Dropping it stops accepting connections (and removes
/// its unix socket).
pub struct ProxyServer {
    local: Local,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for ProxyServer {
    fn drop(&mut self) {
        self.accept.abort();
        if let Local::Unix(p) = &self.local {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn new_state() -> Result<Arc<State>, ProxyError> {
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .no_proxy()
        .build()
        .map_err(|e| ProxyError::Config(format!("cannot build the HTTP client: {e}")))?;
    Ok(Arc::new(State {
        client,
        routes: RwLock::new(HashMap::new()),
        default: RwLock::new(None),
        closing: AtomicBool::new(false),
        flights: Arc::new(Flights::default()),
    }))
}

/// Serves one connection (HTTP/1) until it closes.
fn serve<IO>(st: Arc<State>, io: IO)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let svc = hyper::service::service_fn(move |req| {
            let st = st.clone();
            async move { Ok::<_, Infallible>(handle(st, req).await) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(io), svc)
            .await;
    });
}

impl ProxyServer {
    /// Binds `addr` (port 0: any free port) and starts serving. Must be
    /// called inside a tokio runtime.
    pub async fn bind(addr: SocketAddr) -> Result<ProxyServer, ProxyError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| ProxyError::Io {
                what: format!("listen on {addr}"),
                source: e,
            })?;
        let addr = listener.local_addr().map_err(|e| ProxyError::Io {
            what: "read the bound address".into(),
            source: e,
        })?;
        let state = new_state()?;
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    continue;
                };
                let _ = sock.set_nodelay(true);
                serve(st.clone(), sock);
            }
        });
        Ok(ProxyServer {
            local: Local::Tcp(addr),
            state,
            accept,
        })
    }

    /// Binds a unix socket at `path` (which must not exist; made mode 0600,
    /// so only this user can connect until the caller grants more) and
    /// serves the same routes over HTTP/1 on it. Removed when the server is
    /// dropped. Must be called inside a tokio runtime.
    pub async fn bind_unix(path: &Path) -> Result<ProxyServer, ProxyError> {
        use std::os::unix::fs::PermissionsExt;
        let io = |what: &str| {
            let what = format!("{what} {}", path.display());
            move |e| ProxyError::Io { what, source: e }
        };
        let listener = tokio::net::UnixListener::bind(path).map_err(io("listen on"))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(io("restrict"))?;
        let state = new_state()?;
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    continue;
                };
                serve(st.clone(), sock);
            }
        });
        Ok(ProxyServer {
            local: Local::Unix(path.to_path_buf()),
            state,
            accept,
        })
    }

    /// The TCP address (`None` on a unix socket).
    pub fn addr(&self) -> Option<SocketAddr> {
        match &self.local {
            Local::Tcp(a) => Some(*a),
            Local::Unix(_) => None,
        }
    }

    /// The unix socket's path (`None` on TCP).
    pub fn unix_path(&self) -> Option<&Path> {
        match &self.local {
            Local::Unix(p) => Some(p),
            Local::Tcp(_) => None,
        }
    }

    /// `http://ADDR`; on a unix socket `http://localhost` (whatever relays
    /// to the socket decides the real host).
    fn origin(&self) -> String {
        match &self.local {
            Local::Tcp(a) => format!("http://{a}"),
            Local::Unix(_) => "http://localhost".into(),
        }
    }

    /// Serves `route` for every path not under `/s/<name>/`; returns the
    /// base URL clients use (`http://ADDR/v1`).
    pub fn set_default(&self, route: Arc<Route>) -> String {
        *self
            .state
            .default
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(route);
        format!("{}/v1", self.origin())
    }

    /// Serves `route` under `/s/<name>/`; returns its client base URL.
    pub fn add(&self, name: &str, route: Arc<Route>) -> String {
        self.state
            .routes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), route);
        format!("{}/s/{name}/v1", self.origin())
    }

    /// Stops serving route `name` (requests to it get 404 from now on).
    pub fn remove(&self, name: &str) -> Option<Arc<Route>> {
        self.state
            .routes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)
    }

    /// Stops taking requests (new ones get HTTP 503) and waits up to
    /// `grace` for the exchanges in flight to be queued for their routes'
    /// writers (then `Route::finish` records them). Returns those still in
    /// flight at the deadline, named (method, path, route, age): they will
    /// not be recorded.
    pub async fn drain(&self, grace: Duration) -> Vec<String> {
        self.state.closing.store(true, Ordering::SeqCst);
        self.accept.abort();
        let flights = &self.state.flights;
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let idle = flights.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if lock(&flights.live).is_empty() {
                return Vec::new();
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                let mut left: Vec<(String, Instant)> =
                    lock(&flights.live).values().cloned().collect();
                left.sort_by_key(|(_, t)| *t);
                return left
                    .into_iter()
                    .map(|(w, t)| format!("{w}, in flight for {:.1?}", t.elapsed()))
                    .collect();
            }
        }
    }
}
