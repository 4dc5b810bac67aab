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

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response};
use serde_json::json;
use tokio::sync::mpsc;

use super::book::Answer;
use super::log::{Exchange, HttpReply, Outcome, RecordedOutcome, Stop, Timing};
use super::route::{Route, RouteMode, Upstream};
use super::scrub::{self, Needles};
use super::ProxyError;

/// Why the proxy ended a reply without its clean end (the client sees an
/// incomplete body).
#[derive(Debug, thiserror::Error)]
#[error("mass proxy aborted the reply: {0}")]
pub struct Aborted(pub String);

/// A response body: chunks passed on as they arrive, or recorded chunks;
/// either may end in an abort, which comes after what went before has been
/// flushed to the client (it gets the bytes, then the broken end).
pub struct ProxyBody {
    source: Source,
    /// An abort waiting to be sent, and whether the bytes before it had
    /// their chance to be flushed.
    abort: Option<Aborted>,
    flushed: bool,
}

enum Source {
    Live(mpsc::Receiver<Result<Bytes, Aborted>>),
    /// Recorded chunks, then (a recorded cut) an abort.
    Recorded(VecDeque<Bytes>, Option<String>),
}

impl ProxyBody {
    fn live(rx: mpsc::Receiver<Result<Bytes, Aborted>>) -> ProxyBody {
        ProxyBody {
            source: Source::Live(rx),
            abort: None,
            flushed: false,
        }
    }

    fn recorded(chunks: VecDeque<Bytes>, abort: Option<String>) -> ProxyBody {
        ProxyBody {
            source: Source::Recorded(chunks, abort),
            abort: None,
            flushed: false,
        }
    }

    fn whole(b: Bytes) -> ProxyBody {
        ProxyBody::recorded(VecDeque::from([b]), None)
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Aborted;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        let this = self.get_mut();
        if this.abort.is_none() {
            let next = match &mut this.source {
                Source::Live(rx) => match rx.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(n) => n,
                },
                Source::Recorded(q, abort) => match q.pop_front() {
                    Some(b) => Some(Ok(b)),
                    None => abort.take().map(|a| Err(Aborted(a))),
                },
            };
            match next {
                Some(Ok(b)) => return Poll::Ready(Some(Ok(Frame::data(b)))),
                None => return Poll::Ready(None),
                Some(Err(a)) => this.abort = Some(a),
            }
        }
        if !this.flushed {
            // Pending once: hyper flushes what it holds before the abort.
            this.flushed = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(this.abort.take().map(Err))
    }
}

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

fn route_of(st: &State, path: &str) -> Option<(Arc<Route>, String)> {
    if let Some(rest) = path.strip_prefix("/s/") {
        let (name, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let r = st
            .routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()?;
        return Some((
            r,
            if tail.is_empty() {
                "/".into()
            } else {
                tail.into()
            },
        ));
    }
    let r = st
        .default
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()?;
    Some((r, path.to_string()))
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
fn error_response(status: u16, kind: &str, code: &str, message: &str) -> Response<ProxyBody> {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    let mut r = Response::new(ProxyBody::whole(Bytes::from(body.to_string())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// An error of the proxy's own (type and code the same).
fn proxy_error(status: u16, kind: &str, message: &str) -> Response<ProxyBody> {
    error_response(status, kind, kind, message)
}

/// The body of the 502 the proxy answers when the upstream is unreachable
/// (recorded as such, answered again the same way on replay).
fn unreachable_response(detail: &str) -> Response<ProxyBody> {
    proxy_error(
        502,
        "upstream_unreachable",
        &format!("mass proxy: the upstream is unreachable: {detail}"),
    )
}

/// A request as received, read whole.
struct Received {
    method: String,
    /// The route's path with the client's query, as forwarded.
    path: String,
    body: Bytes,
    user_agent: Option<String>,
    headers: hyper::HeaderMap,
    /// The secrets it may carry: the route's and its credential headers'.
    known: Needles,
    t0: Instant,
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Response<ProxyBody> {
    let t0 = Instant::now();
    let path_q = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let shown = scrub::query(&path_q, &mut Needles::new()).into_owned();
    let Some((route, path)) = route_of(&st, &path_q) else {
        return proxy_error(
            404,
            "mass_proxy_no_route",
            &format!("mass proxy: no stream is served at {shown}"),
        );
    };
    if !route.admits(req.headers()) {
        return error_response(
            401,
            "invalid_request_error",
            "invalid_api_key",
            "mass proxy: this route needs its token (Authorization: Bearer <token>, api-key or x-api-key)",
        );
    }
    if escapes(&path) {
        return proxy_error(
            400,
            "mass_proxy_bad_path",
            &format!("mass proxy: {shown}: dot segments and encoded '.' or '/' are refused (they could leave the upstream's base path)"),
        );
    }
    if !route.allows(req.method().as_str(), &path) {
        return proxy_error(
            403,
            "mass_proxy_not_a_model_call",
            &format!(
                "mass proxy: {} {shown}: this route passes model calls only",
                req.method()
            ),
        );
    }
    // In flight before the closing check: a shutdown that begins now either
    // waits for this exchange or is seen here.
    let flight = st.take_off(format!("{} {shown} on {}", req.method(), route.label));
    if st.closing.load(Ordering::SeqCst) {
        return proxy_error(
            503,
            "mass_proxy_shutting_down",
            "mass proxy: shutting down, not taking requests",
        );
    }
    if let Some(f) = route.recording_failure() {
        return proxy_error(
            500,
            "mass_proxy_recording_failed",
            &format!(
                "mass proxy: recording into {} failed, so nothing more is passed through: {f}",
                route.label
            ),
        );
    }
    let received = match receive(&route, req, path, t0).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let upstream = match &route.mode {
        RouteMode::Record { upstream } => upstream.clone(),
        RouteMode::Replay { book, fallback } => {
            match from_book(&route, book, fallback.as_ref(), received, flight).await {
                Ok(resp) => return resp,
                Err((u, received, flight)) => {
                    return forward(&st, &route, &u, received, flight).await
                }
            }
        }
    };
    forward(&st, &route, &upstream, received, flight).await
}

/// Reads the request, its body up to the route's cap (HTTP 413 past it).
async fn receive(
    route: &Route,
    req: Request<Incoming>,
    path: String,
    t0: Instant,
) -> Result<Received, Response<ProxyBody>> {
    let cap = route.limits().max_request_bytes;
    let too_large = || {
        proxy_error(
            413,
            "mass_proxy_request_too_large",
            &format!("mass proxy: the request body exceeds this route's cap of {cap} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap as u64) {
        return Err(too_large());
    }
    let (parts, body) = req.into_parts();
    let body = match http_body_util::Limited::new(body, cap).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(e) => {
            return Err(proxy_error(
                400,
                "mass_proxy_bad_request",
                &format!("cannot read the request body: {e}"),
            ))
        }
    };
    let mut known = route.needles().clone();
    known.extend(&scrub::header_secrets(
        parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes())),
    ));
    Ok(Received {
        method: parts.method.as_str().to_string(),
        path,
        body,
        user_agent: parts
            .headers
            .get(hyper::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        headers: parts.headers,
        known,
        t0,
    })
}

type Fallback = (Upstream, Received, Flight);

/// Answers from the recording; a miss in mixed mode comes back as the
/// upstream to forward to.
async fn from_book(
    route: &Arc<Route>,
    book: &Mutex<super::book::Book>,
    fallback: Option<&Upstream>,
    r: Received,
    flight: Flight,
) -> Result<Response<ProxyBody>, Fallback> {
    let answer = {
        let mut b = lock(book);
        b.answer_with(&r.method, &r.path, &r.body, &r.known)
            .map(|a| match a {
                Answer::Hit(i) => Ok((b.exchange(i).clone(), b.ledger().clone())),
                Answer::Miss(m) => Err(m),
            })
    };
    match answer {
        Err(e) => Ok(proxy_error(
            500,
            "mass_proxy_recording_unreadable",
            &r.known.text(&e.to_string()),
        )),
        Ok(Ok((rec, ledger))) => Ok(serve_recorded(route, &rec, &ledger, r, flight).await),
        Ok(Err(miss)) => match fallback {
            Some(u) => Err((u.clone(), r, flight)),
            None => {
                let report = r.known.text(&miss.report);
                lock(&route.misses).push(report.clone());
                Ok(proxy_error(400, "mass_replay_miss", &report))
            }
        },
    }
}

/// The recorded chunks of a body, as they came.
fn rechunk(bytes: &[u8], chunks: &[usize]) -> VecDeque<Bytes> {
    let mut q = VecDeque::new();
    let mut at = 0;
    for &n in chunks {
        let end = (at + n).min(bytes.len());
        q.push_back(Bytes::copy_from_slice(&bytes[at..end]));
        at = end;
    }
    if at < bytes.len() {
        q.push_back(Bytes::copy_from_slice(&bytes[at..]));
    }
    q
}

async fn serve_recorded(
    route: &Arc<Route>,
    rec: &super::log::Recorded,
    ledger: &ledger::Ledger,
    r: Received,
    flight: Flight,
) -> Response<ProxyBody> {
    let served_by = format!("recording {} event {}", route.label, rec.event.to_hex());
    let bytes = match &rec.reply {
        RecordedOutcome::Http { body: Some(id), .. } => match ledger.get_blob(id) {
            Ok(b) => b,
            Err(e) => {
                return proxy_error(
                    500,
                    "mass_proxy_recording_unreadable",
                    &format!("the recorded response {} is unreadable: {e}", id.short(12)),
                )
            }
        },
        _ => Vec::new(),
    };
    let resp = match &rec.reply {
        RecordedOutcome::Unreachable(detail) => match rec.failure.as_deref() {
            Some(super::log::failure::CLIENT_CANCELLED) => proxy_error(
                499,
                "mass_client_cancelled",
                &format!("mass proxy replay: when recorded, {detail}"),
            ),
            _ => unreachable_response(detail),
        },
        RecordedOutcome::Http {
            status,
            headers,
            chunks,
            cut,
            ..
        } => {
            // A body that broke off (or was stopped) breaks off again.
            let mut resp = Response::new(ProxyBody::recorded(rechunk(&bytes, chunks), cut.clone()));
            *resp.status_mut() =
                hyper::StatusCode::from_u16(*status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
            for (k, v) in headers {
                if let (Ok(k), Ok(v)) = (
                    hyper::header::HeaderName::from_bytes(k.as_bytes()),
                    hyper::header::HeaderValue::from_str(v),
                ) {
                    resp.headers_mut().append(k, v);
                }
            }
            resp
        }
    };
    if route.records() {
        let us = r.t0.elapsed().as_micros() as u64;
        let outcome = rec.outcome(bytes);
        let timing = Timing {
            headers_us: us,
            chunks_us: Vec::new(),
            total_us: us,
        };
        let mut p = Pending::new(route, &r, served_by, flight);
        p.body = r.body;
        p.finish(outcome, timing).await;
    }
    resp
}

/// An exchange forwarded and not yet queued for the writer. Dropped
/// unfinished, it is recorded as cancelled by the client: hyper drops the
/// handler (and with it the upstream request) when the client's connection
/// closes before the upstream answered.
struct Pending {
    route: Arc<Route>,
    method: String,
    path: String,
    body: Bytes,
    user_agent: Option<String>,
    served_by: String,
    t0: Instant,
    known: Needles,
    flight: Option<Flight>,
}

impl Pending {
    fn new(route: &Arc<Route>, r: &Received, served_by: String, flight: Flight) -> Pending {
        Pending {
            route: route.clone(),
            method: r.method.clone(),
            path: r.path.clone(),
            body: r.body.clone(),
            user_agent: r.user_agent.clone(),
            served_by,
            t0: r.t0,
            known: r.known.clone(),
            flight: Some(flight),
        }
    }

    fn exchange(&mut self, outcome: Outcome, timing: Timing) -> Exchange {
        Exchange {
            method: std::mem::take(&mut self.method),
            path: std::mem::take(&mut self.path),
            body: std::mem::take(&mut self.body).to_vec(),
            user_agent: self.user_agent.take(),
            outcome,
            timing,
            served_by: std::mem::take(&mut self.served_by),
        }
    }

    fn at_once(&self) -> Timing {
        let us = self.t0.elapsed().as_micros() as u64;
        Timing {
            headers_us: us,
            chunks_us: Vec::new(),
            total_us: us,
        }
    }

    /// Queues the exchange for the writer (waiting while its queue is full).
    async fn finish(mut self, outcome: Outcome, timing: Timing) {
        let ex = self.exchange(outcome, timing);
        let known = std::mem::take(&mut self.known);
        let flight = self.flight.take();
        self.route.queue(ex, known).await;
        drop(flight);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(flight) = self.flight.take() else {
            return;
        };
        // Counted before anything else, so a `Route::finish` that follows
        // the client's going away waits for this record.
        let hold = self.route.hold();
        let timing = self.at_once();
        let ex = self.exchange(
            Outcome::Stopped {
                stop: Stop::ClientGone,
                detail: "the client closed its connection before the upstream answered".into(),
                reply: None,
            },
            timing,
        );
        let (route, known) = (self.route.clone(), std::mem::take(&mut self.known));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                route.queue(ex, known).await;
                drop(flight);
                drop(hold);
            });
        }
    }
}

/// Whether a path (before its query) has a dot segment or an encoded `.`
/// or `/`, with which a request could resolve outside the upstream's base
/// path (`/v1/../../admin`).
fn escapes(path_q: &str) -> bool {
    let path = path_q.split('?').next().unwrap_or("");
    let lower = path.to_ascii_lowercase();
    lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || path.contains('\\')
        || path.split('/').any(|seg| seg == "." || seg == "..")
}

/// Credential headers the client's request loses when the route replaces
/// them (its token must not reach the upstream).
fn is_credential_header(name: &str) -> bool {
    matches!(
        name.to_ascii_lowercase().as_str(),
        "authorization" | "proxy-authorization" | "api-key" | "x-api-key"
    )
}

async fn forward(
    st: &State,
    route: &Arc<Route>,
    upstream: &Upstream,
    r: Received,
    flight: Flight,
) -> Response<ProxyBody> {
    let url = upstream.url(&r.path);
    let m = reqwest::Method::from_bytes(r.method.as_bytes()).unwrap_or(reqwest::Method::POST);
    let mut rb = st.client.request(m, &url);
    let replace = route.replaces_credentials(upstream);
    for (k, v) in &r.headers {
        let name = k.as_str();
        if super::wire::is_hop_header(name)
            || name.eq_ignore_ascii_case("accept-encoding")
            || (replace && is_credential_header(name))
        {
            continue;
        }
        rb = rb.header(name, v.as_bytes());
    }
    let pending = Pending::new(route, &r, upstream.base().to_string(), flight);
    // Dropped here (the client went away): `pending` records it.
    let resp = match send(st, rb.body(r.body.clone()), upstream).await {
        Ok(resp) => resp,
        Err(e) => {
            let detail = r.known.text(&format!("{}: {e}", scrub::url(&url)));
            let timing = pending.at_once();
            pending
                .finish(Outcome::Unreachable(detail.clone()), timing)
                .await;
            return unreachable_response(&detail);
        }
    };
    let headers_us = r.t0.elapsed().as_micros() as u64;
    let status = resp.status().as_u16();
    let mut out = Response::builder().status(status);
    let mut kept = Vec::new();
    // What the client never had (the upstream's key, its URL's password)
    // does not reach it through an upstream that echoes it either.
    let mask = upstream.needles().clone();
    for (k, v) in resp.headers() {
        if super::wire::is_hop_header(k.as_str()) {
            continue;
        }
        out = out.header(k.as_str(), mask.masked(v.as_bytes()).as_ref());
        if super::wire::is_secret_header(k.as_str())
            || k.as_str() == "set-cookie"
            || super::wire::is_clock_header(k.as_str())
        {
            continue;
        }
        kept.push((
            k.as_str().to_string(),
            String::from_utf8_lossy(v.as_bytes()).into_owned(),
        ));
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, Aborted>>(64);
    let head = Head {
        status,
        headers: kept,
        headers_us,
        cap: route.limits().max_response_bytes,
        mask,
    };
    tokio::spawn(relay(resp, tx, pending, head));
    out.body(ProxyBody::live(rx))
        .unwrap_or_else(|e| proxy_error(502, "mass_proxy_bad_response", &e.to_string()))
}

/// Sends a request upstream; the upstream's key, if it has one, is its one
/// `Authorization` (replacing one an HTTP client derives from the URL's
/// userinfo). The error is described without the URL.
async fn send(
    st: &State,
    rb: reqwest::RequestBuilder,
    upstream: &Upstream,
) -> Result<reqwest::Response, String> {
    let mut req = rb.build().map_err(|e| describe(&e.without_url()))?;
    if let Some(key) = upstream.key() {
        use reqwest::header::{HeaderValue, AUTHORIZATION};
        let mut v = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
            .map_err(|_| "the upstream's key is not a valid header value".to_string())?;
        v.set_sensitive(true);
        req.headers_mut().insert(AUTHORIZATION, v);
    }
    st.client
        .execute(req)
        .await
        .map_err(|e| describe(&e.without_url()))
}

/// What the upstream's response head said, and the body's cap.
struct Head {
    status: u16,
    headers: Vec<(String, String)>,
    headers_us: u64,
    cap: usize,
    /// Secrets masked before a chunk is passed on, one split across chunks
    /// too (`StreamMask`).
    mask: Needles,
}

/// How a relayed body ended.
enum End {
    Done,
    Cut(String),
    TooLarge,
    ClientGone,
}

/// Passes the upstream's body on chunk by chunk, then queues the exchange
/// for the writer before the client sees the end (so the conversation's
/// next request finds this one as its prefix). A broken or oversized body
/// aborts the client's reply; a client that goes away stops the upstream's.
async fn relay(
    mut resp: reqwest::Response,
    tx: mpsc::Sender<Result<Bytes, Aborted>>,
    pending: Pending,
    head: Head,
) {
    let t0 = pending.t0;
    let (mut all, mut chunks, mut chunks_us) = (Vec::new(), Vec::new(), Vec::new());
    let mut mask = super::scrub::StreamMask::new(head.mask.clone());
    // Held while the body's end is awaited after the client left, so a
    // `Route::finish` meanwhile waits for this record.
    let mut hold = None;
    let mut end = loop {
        let next = tokio::select! {
            c = resp.chunk() => c,
            _ = tx.closed() => {
                hold = Some(pending.route.hold());
                break after_client_left(&mut resp).await;
            }
        };
        match next {
            Ok(Some(c)) => {
                if all.len() + mask.held() + c.len() > head.cap {
                    break End::TooLarge;
                }
                let c = if head.mask.is_empty() {
                    c
                } else {
                    Bytes::from(mask.push(&c))
                };
                if c.is_empty() {
                    continue;
                }
                chunks_us.push(t0.elapsed().as_micros() as u64);
                chunks.push(c.len());
                all.extend_from_slice(&c);
                if tx.send(Ok(c)).await.is_err() {
                    break End::ClientGone;
                }
            }
            Ok(None) => break End::Done,
            Err(e) => break End::Cut(describe(&e.without_url())),
        }
    };
    // What the mask held back (the start of a secret that never completed)
    // goes on and into the record like any other bytes.
    let tail = mask.finish();
    if !tail.is_empty() {
        chunks_us.push(t0.elapsed().as_micros() as u64);
        chunks.push(tail.len());
        all.extend_from_slice(&tail);
        if !matches!(end, End::ClientGone) && tx.send(Ok(Bytes::from(tail))).await.is_err() {
            end = End::ClientGone;
        }
    }
    // Cancels the upstream's request if it is still sending.
    drop(resp);
    let timing = Timing {
        headers_us: head.headers_us,
        chunks_us,
        total_us: t0.elapsed().as_micros() as u64,
    };
    let reply = HttpReply {
        status: head.status,
        headers: head.headers,
        body: all,
        chunks,
        cut: None,
    };
    let (outcome, abort) = ended(end, reply, head.cap, &pending.known);
    pending.finish(outcome, timing).await;
    drop(hold);
    if let Some(a) = abort {
        let _ = tx.send(Err(Aborted(a))).await;
    }
}

/// How long a body whose client closed its connection may take to end.
const CLIENT_GONE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// How a body ended whose client closed its connection: a client may have
/// read everything and hung up while the body's end was still on its way
/// (an SSE client stops at `data: [DONE]`, before the chunked body's last,
/// empty chunk). If the upstream's body ends within [`CLIENT_GONE_GRACE`]
/// with nothing more, the exchange is complete (a real llama.cpp session
/// was recorded as cancelled); anything else, it was cancelled.
async fn after_client_left(resp: &mut reqwest::Response) -> End {
    match tokio::time::timeout(CLIENT_GONE_GRACE, resp.chunk()).await {
        Ok(Ok(None)) => End::Done,
        _ => End::ClientGone,
    }
}

/// The outcome to record for how a body ended, and why the client's reply
/// is aborted, if it is.
fn ended(end: End, reply: HttpReply, cap: usize, known: &Needles) -> (Outcome, Option<String>) {
    match end {
        End::Done => (Outcome::Http(reply), None),
        End::Cut(c) => {
            let c = known.text(&c);
            let why = format!("the upstream's body broke off: {c}");
            (
                Outcome::Http(HttpReply {
                    cut: Some(c),
                    ..reply
                }),
                Some(why),
            )
        }
        End::TooLarge => {
            let detail = format!("the response exceeded the proxy's cap of {cap} bytes");
            let stopped = Outcome::Stopped {
                stop: Stop::TooLarge,
                detail: detail.clone(),
                reply: Some(reply),
            };
            (stopped, Some(detail))
        }
        End::ClientGone => (
            Outcome::Stopped {
                stop: Stop::ClientGone,
                detail: "the client closed its connection".into(),
                reply: Some(reply),
            },
            None,
        ),
    }
}

fn describe(e: &reqwest::Error) -> String {
    use std::error::Error;
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}
