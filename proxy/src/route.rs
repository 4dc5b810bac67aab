//! What a route of the proxy is: where it forwards (`Upstream`, with the
//! credential mass holds for it), what it records into (a `Recorder`: one
//! writer thread fed by a bounded queue), what it answers from (a `Book`),
//! who may use it (its token) and how much it lets through (`Limits`).

use std::sync::{Arc, Mutex};

use ledger::Id;
use tokio::sync::mpsc;

use super::book::Book;
use super::log::{Exchange, WireLog};
use super::scrub::{self, Needles, Secret};
use super::ProxyError;

/// How many finished exchanges may wait for a route's writer. When it is
/// behind by this many, the next exchange waits before its client's reply
/// ends (backpressure), instead of piling up in memory.
pub const QUEUE: usize = 32;

/// Size caps of one exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A longer request body is refused with HTTP 413 (nothing forwarded,
    /// nothing recorded).
    pub max_request_bytes: usize,
    /// A longer response body is cut there: the client's reply is aborted
    /// and the exchange recorded as failed (`response_too_large`).
    pub max_response_bytes: usize,
}

impl Default for Limits {
    /// 32 MiB of request (a long agent session with images stays well
    /// under), 128 MiB of response.
    fn default() -> Limits {
        Limits {
            max_request_bytes: 32 << 20,
            max_response_bytes: 128 << 20,
        }
    }
}

/// Where a route forwards: an OpenAI-compatible base URL (`.../v1`), and
/// the credential mass sends there for its clients, if any. Shown (Debug,
/// records, errors) without the URL's userinfo and with key-like query
/// parameters redacted.
#[derive(Clone)]
pub struct Upstream {
    /// The base URL as given (userinfo and all): where requests go.
    target: String,
    /// The base URL as shown and recorded.
    base: String,
    key: Option<Secret>,
    needles: Needles,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base", &self.base)
            .field("key", &self.key)
            .finish()
    }
}

impl Upstream {
    pub fn new(base: &str) -> Result<Upstream, ProxyError> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ProxyError::Config(format!(
                "upstream {:?} is not an http(s) URL (give the server's OpenAI base URL, e.g. http://127.0.0.1:8080/v1)",
                scrub::url(&base)
            )));
        }
        Ok(Upstream {
            base: scrub::url(&base),
            needles: scrub::url_secrets(&base),
            target: base,
            key: None,
        })
    }

    /// Sends `key` as `Authorization: Bearer <key>` on every request to
    /// this upstream, in place of whatever credential the client sent
    /// (which is not forwarded). The key is never recorded or shown.
    pub fn with_api_key(mut self, key: Secret) -> Upstream {
        self.needles.add(key.expose().as_bytes());
        self.key = Some(key);
        self
    }

    /// The upstream URL of a client path: clients use `http://PROXY/v1` as
    /// their base URL, so a path under `/v1` maps under the upstream's base.
    /// Carries the userinfo and the client's query as given: what is sent,
    /// never what is shown (`scrub::url`).
    pub(crate) fn url(&self, path_and_query: &str) -> String {
        if self.target.ends_with("/v1") {
            if let Some(rest) = path_and_query.strip_prefix("/v1") {
                if rest.is_empty() || rest.starts_with('/') || rest.starts_with('?') {
                    return format!("{}{rest}", self.target);
                }
            }
        }
        format!("{}{path_and_query}", self.target)
    }

    /// The base URL as it may be shown and recorded (no userinfo).
    pub fn base(&self) -> &str {
        &self.base
    }

    pub(crate) fn key(&self) -> Option<&Secret> {
        self.key.as_ref()
    }

    pub(crate) fn needles(&self) -> &Needles {
        &self.needles
    }
}

/// The writer's result: the stream's head when it ends.
type WriterResult = Result<Option<Id>, ProxyError>;

/// An exchange waiting for the writer, with the secrets it must not record.
pub(crate) struct Queued {
    pub ex: Exchange,
    pub known: Needles,
}

/// The writer of a route: a thread of its own (recording is blocking work:
/// hashing, compression, the fsync), taking exchanges in the order they
/// finished and recording each durably before the next.
pub(crate) struct Recorder {
    tx: Mutex<Option<mpsc::Sender<Queued>>>,
    done: Mutex<Option<tokio::sync::oneshot::Receiver<WriterResult>>>,
    failed: Arc<Mutex<Option<String>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Recorder {
    fn start(mut log: WireLog) -> Recorder {
        Recorder::spawn(move |q| log.record_with(&q.ex, &q.known))
    }

    /// The writer thread around `record` (one exchange, durably; its
    /// event). Its result is the last event recorded.
    fn spawn<R>(mut record: R) -> Recorder
    where
        R: FnMut(Queued) -> Result<Id, ProxyError> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::channel::<Queued>(QUEUE);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let failed = Arc::new(Mutex::new(None));
        let flag = failed.clone();
        let spawned = std::thread::Builder::new()
            .name("mass-proxy-writer".into())
            .spawn(move || {
                let mut result = Ok(None);
                while let Some(q) = rx.blocking_recv() {
                    match record(q) {
                        Ok(id) => result = Ok(Some(id)),
                        Err(e) => {
                            *lock(&flag) = Some(e.to_string());
                            result = Err(e);
                            break;
                        }
                    }
                }
                // What `record` holds (the wire log, its ledger) is
                // released before `finish` hears of the end: a caller that
                // then owns the ledger alone (to close it) must not race
                // this thread's exit.
                drop(record);
                let _ = done_tx.send(result);
            });
        if let Err(e) = spawned {
            *lock(&failed) = Some(format!("cannot start the recording thread: {e}"));
        }
        Recorder {
            tx: Mutex::new(Some(tx)),
            done: Mutex::new(Some(done_rx)),
            failed,
        }
    }

    /// Queues an exchange, waiting while the queue is full; gives it back
    /// when the writer has stopped (finished, or failed).
    async fn send(&self, q: Queued) -> Result<(), Queued> {
        let tx = lock(&self.tx).as_ref().cloned();
        match tx {
            Some(tx) => tx.send(q).await.map_err(|e| e.0),
            None => Err(q),
        }
    }

    fn failure(&self) -> Option<String> {
        lock(&self.failed).clone()
    }

    /// Waits for the queue to drain; the last exchange recorded.
    async fn finish(&self) -> Result<Option<Id>, ProxyError> {
        drop(lock(&self.tx).take());
        let done = lock(&self.done).take();
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
    pub(crate) label: String,
    pub(crate) mode: RouteMode,
    recorder: Option<Recorder>,
    /// The stream's head before this route recorded anything.
    start: Option<Id>,
    /// Requests that missed (replay mode), for the operator.
    pub(crate) misses: Mutex<Vec<String>>,
    token: Option<Secret>,
    limits: Limits,
    /// The route's own secrets: its token, its upstreams' credentials.
    needles: Needles,
    /// Exchanges that could not be queued for the writer.
    lost: Mutex<Vec<String>>,
    /// Exchanges whose client went away, being queued (see [`Route::hold`]).
    pending: Arc<Settling>,
    /// Only model calls pass (see [`Route::only_model_calls`]).
    model_calls_only: bool,
}

/// Counts a route's exchanges whose client went away and whose record is
/// being queued, so [`Route::finish`] waits for them: the record is queued
/// from a task spawned when the handler was dropped, which may run after
/// the upstream already saw the connection close. (An exchange still in
/// flight is the drain's to wait for, not this.)
#[derive(Default)]
pub(crate) struct Settling {
    n: std::sync::atomic::AtomicUsize,
    settled: tokio::sync::Notify,
}

/// One exchange not yet queued; settles when dropped.
pub(crate) struct Hold(Arc<Settling>);

impl Drop for Hold {
    fn drop(&mut self) {
        if self.0.n.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            self.0.settled.notify_waiters();
        }
    }
}

/// How long [`Route::finish`] waits for abandoned exchanges being queued
/// (a writer queue that stays full must not hang a shutdown; what could
/// not be queued is named in [`Route::unrecorded`]).
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Route {
    fn new(label: String, mode: RouteMode, log: Option<WireLog>, needles: Needles) -> Route {
        let start = log.as_ref().and_then(WireLog::head);
        Route {
            label,
            mode,
            recorder: log.map(Recorder::start),
            start,
            misses: Mutex::new(Vec::new()),
            token: None,
            limits: Limits::default(),
            needles,
            lost: Mutex::new(Vec::new()),
            pending: Arc::default(),
            model_calls_only: false,
        }
    }

    /// Lets only model calls through: `POST` to `chat/completions`,
    /// `completions`, `responses` or `embeddings`, `GET` of `models`
    /// (under `/v1` or not); anything else gets HTTP 403 and is neither
    /// forwarded nor recorded. For a route whose token a sandboxed program
    /// holds: the upstream's key must not open the rest of its API (files,
    /// batches, fine-tunes, admin) to it.
    pub fn only_model_calls(mut self) -> Route {
        self.model_calls_only = true;
        self
    }

    /// Whether a request may pass (see [`Route::only_model_calls`]).
    pub(crate) fn allows(&self, method: &str, path_q: &str) -> bool {
        if !self.model_calls_only {
            return true;
        }
        let path = path_q.split('?').next().unwrap_or("");
        let path = path.strip_prefix("/v1").unwrap_or(path);
        match method {
            "POST" => matches!(
                path,
                "/chat/completions" | "/completions" | "/responses" | "/embeddings"
            ),
            "GET" => {
                path == "/models"
                    || path
                        .strip_prefix("/models/")
                        .is_some_and(|m| !m.is_empty() && !m.contains('/'))
            }
            _ => false,
        }
    }

    /// Marks one abandoned exchange as being queued, until the returned
    /// hold is dropped (after queueing).
    pub(crate) fn hold(&self) -> Hold {
        self.pending
            .n
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Hold(self.pending.clone())
    }

    /// Waits (up to [`SETTLE_LIMIT`]) until no abandoned exchange is being
    /// queued.
    async fn settle(&self) {
        let wait = async {
            loop {
                let n = self.pending.settled.notified();
                tokio::pin!(n);
                n.as_mut().enable();
                if self.pending.n.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                    return;
                }
                n.await;
            }
        };
        let _ = tokio::time::timeout(SETTLE_LIMIT, wait).await;
    }

    /// Records into `log`, forwarding to `upstream`.
    pub fn record(log: WireLog, upstream: Upstream) -> Route {
        let needles = upstream.needles().clone();
        let label = log.ref_name().to_string();
        Route::new(label, RouteMode::Record { upstream }, Some(log), needles)
    }

    /// Answers from `book`; with `into`, records what it serves (and, with
    /// `fallback`, the misses it forwards) there.
    pub fn replay(book: Book, fallback: Option<Upstream>, into: Option<WireLog>) -> Route {
        let needles = fallback
            .as_ref()
            .map(|u| u.needles().clone())
            .unwrap_or_default();
        let label = book.label().to_string();
        let mode = RouteMode::Replay {
            book: Box::new(Mutex::new(book)),
            fallback,
        };
        Route::new(label, mode, into, needles)
    }

    /// Serves only requests that carry `token` (`Authorization: Bearer
    /// <token>`, `api-key: <token>` or `x-api-key: <token>`, compared in
    /// constant time); any other gets HTTP 401 and is neither forwarded nor
    /// recorded. The token is never forwarded (the upstream gets its own
    /// credential, `Upstream::with_api_key`, or none) and never recorded.
    pub fn require_token(mut self, token: Secret) -> Route {
        self.needles.add(token.expose().as_bytes());
        self.token = Some(token);
        self
    }

    /// Size caps for this route's exchanges (default: `Limits::default()`).
    pub fn with_limits(mut self, limits: Limits) -> Route {
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Whether the request's credential headers carry the route's token
    /// (always, for a route without one).
    pub(crate) fn admits(&self, headers: &hyper::HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let mut presented = Vec::new();
        for v in headers.get_all(hyper::header::AUTHORIZATION) {
            let b = v.as_bytes();
            if b.len() > 7 && b[..7].eq_ignore_ascii_case(b"bearer ") {
                presented.push(b[7..].trim_ascii());
            }
        }
        for name in ["api-key", "x-api-key"] {
            presented.extend(
                headers
                    .get_all(name)
                    .iter()
                    .map(|v| v.as_bytes().trim_ascii()),
            );
        }
        // Every presented value is compared, whichever matches.
        presented.iter().fold(false, |ok, p| token.matches(p) | ok)
    }

    /// Whether the client's credential headers are replaced (the route has
    /// a token, which must not reach the upstream, or the upstream a key).
    pub(crate) fn replaces_credentials(&self, upstream: &Upstream) -> bool {
        self.token.is_some() || upstream.key().is_some()
    }

    pub(crate) fn needles(&self) -> &Needles {
        &self.needles
    }

    pub(crate) fn records(&self) -> bool {
        self.recorder.is_some()
    }

    pub(crate) fn recording_failure(&self) -> Option<String> {
        self.recorder.as_ref().and_then(Recorder::failure)
    }

    /// Queues a finished exchange for the writer (waiting while the queue
    /// is full); one that cannot be queued is named in `unrecorded`.
    pub(crate) async fn queue(&self, ex: Exchange, known: Needles) {
        let Some(rc) = &self.recorder else {
            return;
        };
        if let Err(q) = rc.send(Queued { ex, known }).await {
            let why = rc
                .failure()
                .unwrap_or_else(|| "the route had finished recording".into());
            lock(&self.lost).push(format!(
                "{} {} on {}: not recorded ({why})",
                q.ex.method,
                scrub::query(&q.ex.path, &mut Needles::new()),
                self.label
            ));
        }
    }

    /// Waits until everything passed through is recorded durably; returns the
    /// stream's head (`None`: the route records nothing).
    pub async fn finish(&self) -> Result<Option<Id>, ProxyError> {
        self.settle().await;
        match &self.recorder {
            Some(r) => Ok(r.finish().await?.or(self.start)),
            None => Ok(None),
        }
    }

    /// Exchanges this route passed through but could not record (the
    /// writer had stopped), named by method, path and why.
    pub fn unrecorded(&self) -> Vec<String> {
        lock(&self.lost).clone()
    }

    /// The miss reports so far (replay mode).
    pub fn misses(&self) -> Vec<String> {
        lock(&self.misses).clone()
    }

    /// Served of recorded exchanges (replay mode).
    pub fn progress(&self) -> Option<(usize, usize)> {
        match &self.mode {
            RouteMode::Replay { book, .. } => Some(lock(book).progress()),
            RouteMode::Record { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{HttpReply, Outcome, Timing};

    #[test]
    fn a_model_calls_only_route_passes_model_calls_and_nothing_else() {
        let l =
            Arc::new(ledger::Ledger::init(&tempfile::tempdir().unwrap().path().join("l")).unwrap());
        let log = WireLog::open(l, "r", "s").unwrap();
        let up = Upstream::new("http://127.0.0.1:9/v1").unwrap();
        let r = Route::record(log, up).only_model_calls();
        for (m, p) in [
            ("POST", "/v1/chat/completions"),
            ("POST", "/chat/completions?x=1"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/responses"),
            ("POST", "/v1/embeddings"),
            ("GET", "/v1/models"),
            ("GET", "/v1/models/m"),
        ] {
            assert!(r.allows(m, p), "{m} {p}");
        }
        for (m, p) in [
            ("GET", "/v1/files"),
            ("POST", "/v1/files"),
            ("POST", "/v1/fine_tuning/jobs"),
            ("POST", "/v1/batches"),
            ("DELETE", "/v1/models/m"),
            ("GET", "/v1/chat/completions"),
            ("GET", "/v1/models/m/x"),
            ("POST", "/admin/keys"),
        ] {
            assert!(!r.allows(m, p), "{m} {p}");
        }
    }

    fn exchange(n: usize) -> Exchange {
        Exchange {
            method: "POST".into(),
            path: format!("/v1/x{n}"),
            body: Vec::new(),
            user_agent: None,
            outcome: Outcome::Http(HttpReply {
                status: 200,
                headers: Vec::new(),
                body: Vec::new(),
                chunks: Vec::new(),
                cut: None,
            }),
            timing: Timing::default(),
            served_by: String::new(),
        }
    }

    /// The bug: the writer queue was unbounded, so a writer behind (a slow
    /// disk) let finished exchanges pile up in memory without limit. Now
    /// the queue holds `QUEUE`; the next sender waits until the writer
    /// takes one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_queue_is_bounded_and_pushes_back_on_a_slow_writer() {
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let written = Arc::new(Mutex::new(0usize));
        let w = written.clone();
        let rc = Arc::new(Recorder::spawn(move |_q| {
            // The writer is stuck until the test opens the gate.
            gate_rx
                .recv()
                .map_err(|e| ProxyError::Config(e.to_string()))?;
            *lock(&w) += 1;
            Ok(Id([0; 32]))
        }));
        // One taken by the writer (blocked), QUEUE waiting: all accepted.
        for n in 0..=QUEUE {
            let sent = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                rc.send(Queued {
                    ex: exchange(n),
                    known: Needles::new(),
                }),
            )
            .await;
            assert!(matches!(sent, Ok(Ok(()))), "exchange {n} was not accepted");
        }
        // Give the writer time to take its first one off the queue.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        // The next one waits: the queue is full.
        let r2 = rc.clone();
        let blocked = tokio::spawn(async move {
            r2.send(Queued {
                ex: exchange(QUEUE + 1),
                known: Needles::new(),
            })
            .await
            .is_ok()
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!blocked.is_finished(), "a full queue took one more");
        gate_tx.send(()).unwrap();
        assert!(
            tokio::time::timeout(std::time::Duration::from_secs(5), blocked)
                .await
                .expect("the sender stayed blocked after the writer moved on")
                .unwrap()
        );
        for _ in 0..QUEUE + 1 {
            gate_tx.send(()).unwrap();
        }
        rc.finish().await.unwrap();
        assert_eq!(*lock(&written), QUEUE + 2);
    }
}
