//! The proxy's HTTP side: a hyper HTTP/1 server whose routes each record
//! into, or answer from, one proxy stream. Requests are forwarded as
//! received (method, path, query, body bytes, headers but hop-by-hop ones
//! and `accept-encoding`, so bodies come back readable), and responses come
//! back chunk by chunk as the upstream sends them: the client's bytes are
//! never held for the recording, which happens after the last chunk is
//! passed on, in order, by one writer thread per route.
//!
//! A route is chosen by path: `/s/<token>/...` is route `<token>` (the
//! harness executor gives every rollout one), anything else the default
//! route (`mass proxy`).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response};
use ledger::Id;
use serde_json::json;
use tokio::sync::mpsc;

use super::book::{Answer, Book};
use super::log::{Exchange, HttpReply, Outcome, RecordedOutcome, Timing, WireLog};
use super::ProxyError;

/// A response body: chunks passed on as they arrive, or recorded chunks.
pub enum ProxyBody {
    Live(mpsc::Receiver<Bytes>),
    Recorded(VecDeque<Bytes>),
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ProxyBody::Live(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
            ProxyBody::Recorded(q) => Poll::Ready(q.pop_front().map(|b| Ok(Frame::data(b)))),
        }
    }
}

/// Where a route forwards: an OpenAI-compatible base URL (`.../v1`).
#[derive(Debug, Clone)]
pub struct Upstream {
    base: String,
}

impl Upstream {
    pub fn new(base: &str) -> Result<Upstream, ProxyError> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ProxyError::Config(format!(
                "upstream {base:?} is not an http(s) URL (give the server's OpenAI base URL, e.g. http://127.0.0.1:8080/v1)"
            )));
        }
        Ok(Upstream { base })
    }

    /// The upstream URL of a client path: clients use `http://PROXY/v1` as
    /// their base URL, so a path under `/v1` maps under the upstream's base.
    pub fn url(&self, path_and_query: &str) -> String {
        if self.base.ends_with("/v1") {
            if let Some(rest) = path_and_query.strip_prefix("/v1") {
                if rest.is_empty() || rest.starts_with('/') || rest.starts_with('?') {
                    return format!("{}{rest}", self.base);
                }
            }
        }
        format!("{}{path_and_query}", self.base)
    }

    pub fn base(&self) -> &str {
        &self.base
    }
}

/// The writer's result: the stream's head when it ends.
type WriterResult = Result<Option<Id>, ProxyError>;

/// The writer of a route: a thread of its own (recording is blocking work:
/// hashing, compression, the fsync), taking exchanges in the order they
/// finished and recording each durably before the next.
struct Recorder {
    tx: Mutex<Option<mpsc::UnboundedSender<Exchange>>>,
    done: Mutex<Option<tokio::sync::oneshot::Receiver<WriterResult>>>,
    failed: Arc<Mutex<Option<String>>>,
}

impl Recorder {
    fn start(mut log: WireLog) -> Recorder {
        let (tx, mut rx) = mpsc::unbounded_channel::<Exchange>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let failed = Arc::new(Mutex::new(None));
        let flag = failed.clone();
        let spawned = std::thread::Builder::new()
            .name("mass-proxy-writer".into())
            .spawn(move || {
                let mut result = Ok(());
                while let Some(ex) = rx.blocking_recv() {
                    if let Err(e) = log.record(&ex) {
                        *flag.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                        result = Err(e);
                        break;
                    }
                }
                let _ = done_tx.send(result.map(|()| log.head()));
            });
        if let Err(e) = spawned {
            *failed.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(format!("cannot start the recording thread: {e}"));
        }
        Recorder {
            tx: Mutex::new(Some(tx)),
            done: Mutex::new(Some(done_rx)),
            failed,
        }
    }

    fn send(&self, ex: Exchange) {
        if let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = tx.send(ex);
        }
    }

    fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn finish(&self) -> Result<Option<Id>, ProxyError> {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner()).take();
        match done {
            Some(rx) => rx.await.unwrap_or_else(|_| {
                Err(ProxyError::Config(self.failure().unwrap_or_else(|| {
                    "the recording thread ended without a result".into()
                })))
            }),
            None => Err(ProxyError::Config("the route was already finished".into())),
        }
    }
}

/// How a route answers.
pub enum RouteMode {
    /// Forward everything to the upstream; record every exchange.
    Record { upstream: Upstream },
    /// Answer from a recording; a miss fails closed, or (mixed mode) goes
    /// to `fallback` and is recorded.
    Replay {
        book: Box<Mutex<Book>>,
        fallback: Option<Upstream>,
    },
}

/// One route: a stream recorded into and/or answered from.
pub struct Route {
    label: String,
    mode: RouteMode,
    recorder: Option<Recorder>,
    /// Requests that missed (replay mode), for the operator.
    misses: Mutex<Vec<String>>,
}

impl Route {
    /// Records into `log`, forwarding to `upstream`.
    pub fn record(log: WireLog, upstream: Upstream) -> Route {
        Route {
            label: log.ref_name().to_string(),
            mode: RouteMode::Record { upstream },
            recorder: Some(Recorder::start(log)),
            misses: Mutex::new(Vec::new()),
        }
    }

    /// Answers from `book`; with `into`, records what it serves (and, with
    /// `fallback`, the misses it forwards) there.
    pub fn replay(book: Book, fallback: Option<Upstream>, into: Option<WireLog>) -> Route {
        Route {
            label: book.label().to_string(),
            mode: RouteMode::Replay {
                book: Box::new(Mutex::new(book)),
                fallback,
            },
            recorder: into.map(Recorder::start),
            misses: Mutex::new(Vec::new()),
        }
    }

    /// Waits until everything passed through is recorded durably; returns the
    /// stream's head (`None`: the route records nothing).
    pub async fn finish(&self) -> Result<Option<Id>, ProxyError> {
        match &self.recorder {
            Some(r) => r.finish().await,
            None => Ok(None),
        }
    }

    /// The miss reports so far (replay mode).
    pub fn misses(&self) -> Vec<String> {
        self.misses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Served of recorded exchanges (replay mode).
    pub fn progress(&self) -> Option<(usize, usize)> {
        match &self.mode {
            RouteMode::Replay { book, .. } => {
                Some(book.lock().unwrap_or_else(|p| p.into_inner()).progress())
            }
            RouteMode::Record { .. } => None,
        }
    }
}

struct State {
    client: reqwest::Client,
    routes: RwLock<HashMap<String, Arc<Route>>>,
    default: RwLock<Option<Arc<Route>>>,
}

/// A running proxy. Dropping it stops accepting connections.
pub struct ProxyServer {
    addr: SocketAddr,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for ProxyServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
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
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .no_proxy()
            .build()
            .map_err(|e| ProxyError::Config(format!("cannot build the HTTP client: {e}")))?;
        let state = Arc::new(State {
            client,
            routes: RwLock::new(HashMap::new()),
            default: RwLock::new(None),
        });
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    continue;
                };
                let _ = sock.set_nodelay(true);
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(handle(st, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                        .await;
                });
            }
        });
        Ok(ProxyServer {
            addr,
            state,
            accept,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `route` for every path not under `/s/<token>/`; returns the
    /// base URL clients use (`http://ADDR/v1`).
    pub fn set_default(&self, route: Arc<Route>) -> String {
        *self
            .state
            .default
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(route);
        format!("http://{}/v1", self.addr)
    }

    /// Serves `route` under `/s/<token>/`; returns its client base URL.
    pub fn add(&self, token: &str, route: Arc<Route>) -> String {
        self.state
            .routes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.to_string(), route);
        format!("http://{}/s/{token}/v1", self.addr)
    }

    /// Stops serving route `token` (requests to it get 404 from now on).
    pub fn remove(&self, token: &str) -> Option<Arc<Route>> {
        self.state
            .routes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(token)
    }
}

fn route_of(st: &State, path: &str) -> Option<(Arc<Route>, String)> {
    if let Some(rest) = path.strip_prefix("/s/") {
        let (token, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let r = st
            .routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
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

fn error_response(status: u16, kind: &str, message: &str) -> Response<ProxyBody> {
    let body = json!({"error": {"message": message, "type": kind, "code": kind}});
    let mut r = Response::new(ProxyBody::Recorded(VecDeque::from([Bytes::from(
        body.to_string(),
    )])));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// The body of the 502 the proxy answers when the upstream is unreachable
/// (recorded as such, answered again the same way on replay).
fn unreachable_response(detail: &str) -> Response<ProxyBody> {
    error_response(
        502,
        "upstream_unreachable",
        &format!("mass proxy: the upstream is unreachable: {detail}"),
    )
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Response<ProxyBody> {
    let t0 = Instant::now();
    let path_q = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let Some((route, path)) = route_of(&st, &path_q) else {
        return error_response(
            404,
            "mass_proxy_no_route",
            &format!("mass proxy: no stream is served at {path_q}"),
        );
    };
    if let Some(f) = route.recorder.as_ref().and_then(Recorder::failure) {
        return error_response(
            500,
            "mass_proxy_recording_failed",
            &format!(
                "mass proxy: recording into {} failed, so nothing more is passed through: {f}",
                route.label
            ),
        );
    }
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error_response(
                400,
                "mass_proxy_bad_request",
                &format!("cannot read the request body: {e}"),
            )
        }
    };
    let method = parts.method.as_str().to_string();
    let user_agent = parts
        .headers
        .get(hyper::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let upstream = match &route.mode {
        RouteMode::Record { upstream } => upstream.clone(),
        RouteMode::Replay { book, fallback } => {
            let answer = {
                let mut b = book.lock().unwrap_or_else(|p| p.into_inner());
                b.answer(&method, &path, &body).map(|a| match a {
                    Answer::Hit(i) => Ok((b.exchange(i).clone(), b.ledger().clone())),
                    Answer::Miss(m) => Err(m),
                })
            };
            match answer {
                Err(e) => {
                    return error_response(500, "mass_proxy_recording_unreadable", &e.to_string())
                }
                Ok(Ok((rec, ledger))) => {
                    return serve_recorded(
                        &route, &rec, &ledger, method, path, body, user_agent, t0,
                    )
                }
                Ok(Err(miss)) => match fallback {
                    Some(u) => u.clone(),
                    None => {
                        route
                            .misses
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(miss.report.clone());
                        return error_response(400, "mass_replay_miss", &miss.report);
                    }
                },
            }
        }
    };
    forward(
        &st, &route, &upstream, parts, method, path, body, user_agent, t0,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
fn serve_recorded(
    route: &Arc<Route>,
    rec: &super::log::Recorded,
    ledger: &ledger::Ledger,
    method: String,
    path: String,
    body: Bytes,
    user_agent: Option<String>,
    t0: Instant,
) -> Response<ProxyBody> {
    let served_by = format!("recording {} event {}", route.label, rec.event.to_hex());
    let (resp, outcome) = match &rec.reply {
        RecordedOutcome::Unreachable(detail) => (
            unreachable_response(detail),
            Outcome::Unreachable(detail.clone()),
        ),
        RecordedOutcome::Http {
            status,
            headers,
            body: raw,
            chunks,
            cut,
        } => {
            let bytes = match raw {
                Some(id) => match ledger.get_blob(id) {
                    Ok(b) => b,
                    Err(e) => {
                        return error_response(
                            500,
                            "mass_proxy_recording_unreadable",
                            &format!("the recorded response {} is unreadable: {e}", id.short(12)),
                        )
                    }
                },
                None => Vec::new(),
            };
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
            let mut r = Response::new(ProxyBody::Recorded(q));
            *r.status_mut() =
                hyper::StatusCode::from_u16(*status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
            for (k, v) in headers {
                if let (Ok(k), Ok(v)) = (
                    hyper::header::HeaderName::from_bytes(k.as_bytes()),
                    hyper::header::HeaderValue::from_str(v),
                ) {
                    r.headers_mut().append(k, v);
                }
            }
            let reply = HttpReply {
                status: *status,
                headers: headers.clone(),
                body: bytes,
                chunks: chunks.clone(),
                cut: cut.clone(),
            };
            (r, Outcome::Http(reply))
        }
    };
    if let Some(rc) = &route.recorder {
        let us = t0.elapsed().as_micros() as u64;
        rc.send(Exchange {
            method,
            path,
            body: body.to_vec(),
            user_agent,
            outcome,
            timing: Timing {
                headers_us: us,
                chunks_us: Vec::new(),
                total_us: us,
            },
            served_by,
        });
    }
    resp
}

#[allow(clippy::too_many_arguments)]
async fn forward(
    st: &State,
    route: &Arc<Route>,
    upstream: &Upstream,
    parts: hyper::http::request::Parts,
    method: String,
    path: String,
    body: Bytes,
    user_agent: Option<String>,
    t0: Instant,
) -> Response<ProxyBody> {
    let url = upstream.url(&path);
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::POST);
    let mut rb = st.client.request(m, &url);
    for (k, v) in &parts.headers {
        let name = k.as_str();
        if super::wire::is_hop_header(name) || name.eq_ignore_ascii_case("accept-encoding") {
            continue;
        }
        rb = rb.header(name, v.as_bytes());
    }
    let record = |outcome: Outcome, timing: Timing| {
        if let Some(rc) = &route.recorder {
            rc.send(Exchange {
                method: method.clone(),
                path: path.clone(),
                body: body.to_vec(),
                user_agent: user_agent.clone(),
                outcome,
                timing,
                served_by: upstream.base().to_string(),
            });
        }
    };
    let mut resp = match rb.body(body.clone()).send().await {
        Ok(r) => r,
        Err(e) => {
            let detail = format!("{url}: {}", describe(&e));
            let us = t0.elapsed().as_micros() as u64;
            record(
                Outcome::Unreachable(detail.clone()),
                Timing {
                    headers_us: us,
                    chunks_us: Vec::new(),
                    total_us: us,
                },
            );
            return unreachable_response(&detail);
        }
    };
    let headers_us = t0.elapsed().as_micros() as u64;
    let status = resp.status().as_u16();
    let mut out = Response::builder().status(status);
    let mut kept = Vec::new();
    for (k, v) in resp.headers() {
        if super::wire::is_hop_header(k.as_str()) {
            continue;
        }
        out = out.header(k.as_str(), v.as_bytes());
        if super::wire::is_secret_header(k.as_str()) || k.as_str() == "set-cookie" {
            continue;
        }
        kept.push((
            k.as_str().to_string(),
            String::from_utf8_lossy(v.as_bytes()).into_owned(),
        ));
    }
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let recorder_route = route.clone();
    let (method2, path2, body2, ua2, served_by) = (
        method.clone(),
        path.clone(),
        body.to_vec(),
        user_agent.clone(),
        upstream.base().to_string(),
    );
    tokio::spawn(async move {
        let mut all = Vec::new();
        let mut chunks = Vec::new();
        let mut chunks_us = Vec::new();
        let mut client_gone = false;
        let mut cut = None;
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    chunks_us.push(t0.elapsed().as_micros() as u64);
                    chunks.push(c.len());
                    all.extend_from_slice(&c);
                    // A client that went away does not stop the recording:
                    // the upstream produced this answer.
                    if !client_gone && tx.send(c).await.is_err() {
                        client_gone = true;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // A cut body is passed on (and recorded) as far as it
                    // came, with why it broke off.
                    cut = Some(describe(&e));
                    break;
                }
            }
        }
        let total_us = t0.elapsed().as_micros() as u64;
        // Queued for the writer before the client sees the end, so the
        // conversation's next request finds this one as its prefix.
        if let Some(rc) = &recorder_route.recorder {
            rc.send(Exchange {
                method: method2,
                path: path2,
                body: body2,
                user_agent: ua2,
                outcome: Outcome::Http(HttpReply {
                    status,
                    headers: kept,
                    body: all,
                    chunks,
                    cut,
                }),
                timing: Timing {
                    headers_us,
                    chunks_us,
                    total_us,
                },
                served_by,
            });
        }
        drop(tx);
    });
    out.body(ProxyBody::Live(rx))
        .unwrap_or_else(|e| error_response(502, "mass_proxy_bad_response", &e.to_string()))
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
