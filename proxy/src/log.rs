//! A proxy stream in the ledger: every exchange the proxy passed through (or
//! answered) is one `effect` event of kind `model` on the stream, so the
//! engine's transcripts, datasets, `why` and mixed-mode replays read it like
//! one of its own model calls. The request is stored as the longest earlier
//! request of the stream that is a prefix of it (`prefix`) plus the messages
//! it adds, each message a blob: a long agent session costs linear space.
//! The response is stored as its raw bytes (one blob), the byte lengths of
//! the chunks it arrived in, its status and headers, and the message
//! reassembled from it. A request that is not a chat completion (`GET
//! /v1/models`, embeddings) is an `http` effect with its body as one blob.
//! Timings go in the event's unhashed metadata. Nothing is recorded before
//! `scrub.rs` took the credentials out. A failed exchange says why in its
//! error's `failure` class (`failure::*`). The record format is `wire`
//! version 1, documented in SCHEMAS.md.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use ledger::{Id, Ledger, ObjectKind};
use schemas::{Effect, EffectStatus, Hash32};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::scrub::{self, Needles};
use super::wire;
use super::ProxyError;

/// The wire record version written in every request (`"wire": 1`).
pub const WIRE_VERSION: u64 = 1;

/// What the upstream (or the recording) answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Http(HttpReply),
    /// No HTTP response at all (connection refused, reset, timed out); the
    /// client was answered 502 with this text.
    Unreachable(String),
    /// The proxy stopped the exchange itself (`stop` says why, `detail` in
    /// words); `reply` is what the upstream had sent by then (status,
    /// headers, the body so far), `None` if it had not answered yet. The
    /// client's reply was aborted.
    Stopped {
        stop: Stop,
        detail: String,
        reply: Option<HttpReply>,
    },
}

impl Outcome {
    /// The lengths of the pieces the reply's body arrived in, if one came.
    fn chunks(&self) -> Option<&[usize]> {
        match self {
            Outcome::Http(h) | Outcome::Stopped { reply: Some(h), .. } => Some(&h.chunks),
            _ => None,
        }
    }
}

/// The unhashed metadata key of a reply's chunk lengths (comma-separated):
/// how the transport split the body, which differs between two runs of the
/// same exchange, so it is not part of the record's id. Records written
/// before it existed hold `http.chunks` in the hashed output instead.
pub const CHUNKS_META: &str = "wire.chunks";

/// Why the proxy stopped an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The client closed its connection: the upstream request was
    /// cancelled (recorded `Failed`, failure `client_cancelled`).
    ClientGone,
    /// The response grew past the route's cap (recorded `Failed`, failure
    /// `response_too_large`).
    TooLarge,
}

impl Stop {
    /// The `failure` class recorded.
    pub fn class(self) -> &'static str {
        match self {
            Stop::ClientGone => failure::CLIENT_CANCELLED,
            Stop::TooLarge => failure::RESPONSE_TOO_LARGE,
        }
    }

    fn of_class(class: &str) -> Option<Stop> {
        match class {
            failure::CLIENT_CANCELLED => Some(Stop::ClientGone),
            failure::RESPONSE_TOO_LARGE => Some(Stop::TooLarge),
            _ => None,
        }
    }
}

/// The `failure` classes a failed exchange is recorded with (its error's
/// `failure` field; SCHEMAS.md).
pub mod failure {
    /// A non-2xx status (`Retriable` for 429 and 5xx, else `Failed`).
    pub const HTTP_STATUS: &str = "http_status";
    /// No HTTP response at all (`Retriable`).
    pub const UNREACHABLE: &str = "unreachable";
    /// The upstream's body broke off mid-way (`Retriable`).
    pub const CUT: &str = "cut";
    /// A 2xx chat reply whose body carries an error (`Retriable`).
    pub const IN_BAND_ERROR: &str = "in_band_error";
    /// A 2xx chat reply in which no choice has a finish reason (`Retriable`).
    pub const NO_FINISH_REASON: &str = "no_finish_reason";
    /// A 2xx chat reply that does not parse (`Failed`).
    pub const UNPARSABLE: &str = "unparsable";
    /// The client closed its connection (`Failed`).
    pub const CLIENT_CANCELLED: &str = "client_cancelled";
    /// The response exceeded the proxy's cap (`Failed`).
    pub const RESPONSE_TOO_LARGE: &str = "response_too_large";
}

/// An HTTP response as passed through: status, headers (hop-by-hop ones
/// left out), the body bytes and the lengths of the chunks it came in.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub chunks: Vec<usize>,
    /// The body broke off (the upstream's connection failed mid-body):
    /// why. The client got the chunks up to there; the exchange is recorded
    /// as a transient failure.
    pub cut: Option<String>,
}

impl HttpReply {
    pub fn event_stream(&self) -> bool {
        self.headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("content-type") && v.starts_with("text/event-stream")
        })
    }

    fn http_json(&self) -> Value {
        // The chunk lengths are the transport's timing, not the reply: they
        // go to the unhashed metadata (`wire.chunks`).
        let mut v = json!({
            "status": self.status,
            "headers": self.headers.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        });
        if let Some(c) = &self.cut {
            v["cut"] = json!(c);
        }
        v
    }
}

/// Microseconds from the request's arrival: response headers, each chunk,
/// the end. Never hashed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timing {
    pub headers_us: u64,
    pub chunks_us: Vec<u64>,
    pub total_us: u64,
}

/// One request and what answered it, to record.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
    pub user_agent: Option<String>,
    pub outcome: Outcome,
    pub timing: Timing,
    /// Where the answer came from: the upstream URL, or the recording.
    pub served_by: String,
}

/// The response half of a recorded exchange, enough to answer it again.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedReply {
    pub outcome: RecordedOutcome,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RecordedOutcome {
    Http {
        status: u16,
        headers: Vec<(String, String)>,
        body: Option<Id>,
        chunks: Vec<usize>,
        /// The body broke off here, and why.
        cut: Option<String>,
    },
    Unreachable(String),
}

/// A recorded exchange as the replay reads it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub event: Id,
    pub seq: u64,
    /// The wire request record (`prefix` + new `messages`, or an opaque `body`).
    pub request: Value,
    pub reply: RecordedOutcome,
    /// The effect's status (`Ok`, or a failure class).
    pub status: EffectStatus,
    /// The recorded failure class (`failure::*`), if any.
    pub failure: Option<String>,
}

impl Recorded {
    /// The outcome as it is recorded again (mixed mode): what the proxy
    /// stopped stays stopped, with its class.
    pub fn outcome(&self, body: Vec<u8>) -> Outcome {
        let stop = self.failure.as_deref().and_then(Stop::of_class);
        match (&self.reply, stop) {
            (RecordedOutcome::Unreachable(d), Some(stop)) => Outcome::Stopped {
                stop,
                detail: d.clone(),
                reply: None,
            },
            (RecordedOutcome::Unreachable(d), None) => Outcome::Unreachable(d.clone()),
            (
                RecordedOutcome::Http {
                    status,
                    headers,
                    chunks,
                    cut,
                    ..
                },
                stop,
            ) => {
                let reply = HttpReply {
                    status: *status,
                    headers: headers.clone(),
                    body,
                    chunks: chunks.clone(),
                    cut: cut.clone(),
                };
                match stop {
                    Some(stop) => Outcome::Stopped {
                        stop,
                        detail: cut.clone().unwrap_or_default(),
                        reply: Some(HttpReply { cut: None, ..reply }),
                    },
                    None => Outcome::Http(reply),
                }
            }
        }
    }
}

impl Recorded {
    pub fn prefix(&self) -> Option<Id> {
        self.request["prefix"].as_str().and_then(|h| h.parse().ok())
    }

    pub fn new_messages(&self) -> Vec<Id> {
        self.request["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m.as_str().and_then(|h| h.parse().ok()))
            .collect()
    }

    pub fn is_chat(&self) -> bool {
        self.request["messages"].is_array()
    }
}

/// Chains message ids: `h(i+1) = blake3(h(i) || id(i))`, `h(0)` all zero.
/// Equal chain hashes mean equal message lists.
pub fn chain_step(h: [u8; 32], id: &Id) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&h);
    hasher.update(&id.0);
    *hasher.finalize().as_bytes()
}

/// The writer of one proxy stream: its head and, for prefix lookup, the
/// chain hash of every recorded request's message list.
pub struct WireLog {
    ledger: Arc<Ledger>,
    ref_name: String,
    rel: String,
    head: Option<Id>,
    requests: HashMap<[u8; 32], Id>,
    /// The canonical blob id of every message this log has seen, by the
    /// BLAKE3 hash of its bytes as sent. A conversation resends its whole
    /// history on every turn: with this, only its new messages are parsed
    /// and re-encoded (parsing and re-encoding every message was a third
    /// of the recording's time, and grows with the conversation).
    seen: HashMap<[u8; 32], Id>,
    /// The `tools` field of the last request taken apart by
    /// `scrub::request_raw`.
    seen_tools: Option<scrub::SeenTools>,
    /// Test-only: every request taken apart whole, as `scrub::request` does.
    #[doc(hidden)]
    pub unremembered: bool,
}

/// Entries kept in [`WireLog::seen`] before it starts again.
const SEEN_MAX: usize = 1 << 16;

/// A request taken apart for its record.
enum Parts<'a> {
    /// Not a chat request: its (scrubbed) bytes.
    Opaque(Vec<u8>),
    /// A chat request: everything but the messages, each message's
    /// canonical blob id, and where its canonical bytes come from.
    Chat {
        head: scrub::RawChat<'a>,
        ids: Vec<Id>,
        messages: Messages,
    },
}

/// Where a chat request's messages' canonical bytes come from.
enum Messages {
    /// Made for every message (`scrub::request` took it apart whole).
    Canonical(Vec<Vec<u8>>),
    /// Made for the messages not seen before (`None`: seen; made again
    /// from the bytes as sent if it has to be stored).
    Made(Vec<Option<Vec<u8>>>),
}

impl Messages {
    /// Message `i`'s canonical bytes (`raw`: the messages as sent).
    fn canonical<'m>(&'m self, raw: &[&RawValue], i: usize) -> Option<Cow<'m, [u8]>> {
        match self {
            Messages::Canonical(blobs) => blobs.get(i).map(|b| Cow::Borrowed(b.as_slice())),
            Messages::Made(made) => match made.get(i)? {
                Some(b) => Some(Cow::Borrowed(b.as_slice())),
                None => canonical_raw(raw.get(i)?).map(Cow::Owned),
            },
        }
    }
}

/// The canonical JSON of a message as sent (`None`: serde_json does not
/// take it apart, or it nests too deep for `scrub::request_raw`).
fn canonical_raw(raw: &RawValue) -> Option<Vec<u8>> {
    if !scrub::shallow(raw) {
        return None;
    }
    let v: Value = serde_json::from_str(raw.get()).ok()?;
    Some(replay::canonical_json(&v))
}

impl WireLog {
    /// Opens stream `rel` of `run` for appending, reading what it already holds.
    pub fn open(ledger: Arc<Ledger>, run: &str, rel: &str) -> Result<WireLog, ProxyError> {
        let ref_name = replay::ref_name(run, rel);
        ledger::check_ref_name(&ref_name)?;
        let head = ledger.head(&ref_name)?;
        let mut requests = HashMap::new();
        let mut chains: HashMap<Id, [u8; 32]> = HashMap::new();
        for r in load(&ledger, run, rel)? {
            if !r.is_chat() {
                continue;
            }
            let mut h = match r.prefix() {
                Some(p) => *chains.get(&p).ok_or_else(|| ProxyError::Recording {
                    stream: ref_name.clone(),
                    detail: format!(
                        "event {} names prefix {} that is not earlier in the stream",
                        r.event.short(12),
                        p.short(12)
                    ),
                })?,
                None => [0; 32],
            };
            for m in r.new_messages() {
                h = chain_step(h, &m);
            }
            chains.insert(r.event, h);
            requests.insert(h, r.event);
        }
        Ok(WireLog {
            ledger,
            ref_name,
            rel: rel.to_string(),
            head,
            requests,
            seen: HashMap::new(),
            seen_tools: None,
            unremembered: false,
        })
    }

    pub fn head(&self) -> Option<Id> {
        self.head
    }

    pub fn ref_name(&self) -> &str {
        &self.ref_name
    }

    /// Appends one exchange and returns its event, once it is durable.
    /// Blocking (hashing, compression, the fsync): the proxy calls it from a
    /// thread of its own, never from an async worker, whose requests it
    /// would hold up (`cargo bench --bench proxy` measured that).
    pub fn record(&mut self, ex: &Exchange) -> Result<Id, ProxyError> {
        self.record_with(ex, &Needles::new())
    }

    /// [`WireLog::record`], knowing secrets that must not be recorded
    /// (`known`: the route's token, the upstream's key, the credentials the
    /// request carried in its headers). Everything is scrubbed
    /// (`scrub.rs`): the path's query, the request body, the response body,
    /// headers and error texts, the metadata.
    pub fn record_with(&mut self, ex: &Exchange, known: &Needles) -> Result<Id, ProxyError> {
        let (path, parts, needles) = self.take_apart(ex, known);
        let ledger = self.ledger.clone();
        let mut b = ledger.batch();
        let mut links: Vec<Id> = Vec::new();
        let (request, full_chain) =
            self.request_record(&mut b, &mut links, &ex.method, &path, parts)?;
        let request_id = b.put_blob(&replay::canonical_json(&request))?;
        let (status, output, error) = outcome_record(
            &mut b,
            &mut links,
            &ex.outcome,
            full_chain.is_some(),
            &needles,
        )?;
        links.sort();
        links.dedup();
        let effect = Effect {
            // Chat requests are model calls (transcripts, datasets and
            // mixed-mode replays read them so); anything else is plain HTTP.
            effect: if full_chain.is_some() {
                "model"
            } else {
                "http"
            }
            .into(),
            request: Hash32(request_id.0),
            status,
            output,
            error,
            links: links.into_iter().map(|l| Hash32(l.0)).collect(),
        };
        let mut ev = schemas::to_event(&effect)?.in_stream(self.rel.clone());
        ev = ev
            .with_meta("wire.served_by", needles.text(&scrub::url(&ex.served_by)))
            .with_meta("wire.headers_us", ex.timing.headers_us.to_string())
            .with_meta("wire.total_us", ex.timing.total_us.to_string())
            .with_meta(
                "wire.chunks_us",
                ex.timing
                    .chunks_us
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            );
        if let Some(ua) = &ex.user_agent {
            ev = ev.with_meta("wire.user_agent", needles.text(ua));
        }
        if let Some(chunks) = ex.outcome.chunks() {
            let list: Vec<String> = chunks.iter().map(|c| c.to_string()).collect();
            ev = ev.with_meta(CHUNKS_META, list.join(","));
        }
        let id = b.append(&self.ref_name, self.head, ev)?;
        let durable = b.submit()?;
        // Seen by this log at once: the next request of the conversation
        // may already be on its way.
        self.head = Some(id);
        if let Some(h) = full_chain {
            self.requests.insert(h, id);
        }
        durable.wait()?;
        Ok(id)
    }

    /// The request scrubbed and taken apart: by `scrub::request_raw` and
    /// the messages seen before when that can be done, else by
    /// `scrub::request` (both give the same record).
    fn take_apart<'a>(
        &mut self,
        ex: &'a Exchange,
        known: &Needles,
    ) -> (String, Parts<'a>, Needles) {
        if !self.unremembered {
            if let Some((path, chat, needles)) =
                scrub::request_raw(&ex.path, &ex.body, known, &mut self.seen_tools)
            {
                if let Some(parts) = self.remembered(chat) {
                    return (path, parts, needles);
                }
            }
        }
        let (path, body, needles) = scrub::request(&ex.path, &ex.body, known);
        let parts = match body {
            scrub::Body::Opaque(bytes) => Parts::Opaque(bytes),
            scrub::Body::Chat(chat) => {
                let blobs: Vec<Vec<u8>> =
                    chat.messages.iter().map(replay::canonical_json).collect();
                let head = scrub::RawChat {
                    model: chat.model,
                    tools: chat.tools.as_ref().map(replay::canonical_json),
                    params: chat.params,
                    messages: Vec::new(),
                };
                Parts::Chat {
                    head,
                    ids: blobs.iter().map(|m| Id::of(ObjectKind::Blob, m)).collect(),
                    messages: Messages::Canonical(blobs),
                }
            }
        };
        (path, parts, needles)
    }

    /// A chat request's messages by their ids, parsing only those not
    /// seen before (`None`: one of them is not taken apart here).
    fn remembered<'a>(&mut self, chat: scrub::RawChat<'a>) -> Option<Parts<'a>> {
        let n = chat.messages.len();
        let (mut ids, mut made, mut fresh) = (Vec::with_capacity(n), Vec::with_capacity(n), vec![]);
        for raw in &chat.messages {
            let h: [u8; 32] = blake3::hash(raw.get().as_bytes()).into();
            match self.seen.get(&h) {
                Some(id) => {
                    ids.push(*id);
                    made.push(None);
                }
                None => {
                    let bytes = canonical_raw(raw)?;
                    let id = Id::of(ObjectKind::Blob, &bytes);
                    fresh.push((h, id));
                    ids.push(id);
                    made.push(Some(bytes));
                }
            }
        }
        // Ids only: an entry never says its blob is stored.
        if self.seen.len() + fresh.len() > SEEN_MAX {
            self.seen.clear();
        }
        self.seen.extend(fresh);
        Some(Parts::Chat {
            head: chat,
            ids,
            messages: Messages::Made(made),
        })
    }

    /// The request record (scrubbed already) and, for a chat request, the
    /// chain hash of its whole message list.
    fn request_record(
        &self,
        b: &mut ledger::Batch<'_>,
        links: &mut Vec<Id>,
        method: &str,
        path: &str,
        parts: Parts<'_>,
    ) -> Result<(Value, Option<[u8; 32]>), ProxyError> {
        let (chat, ids, messages) = match parts {
            Parts::Chat {
                head,
                ids,
                messages,
            } => (head, ids, messages),
            Parts::Opaque(bytes) => {
                let body = put(b, links, &bytes)?;
                return Ok((
                    json!({"wire": WIRE_VERSION, "method": method, "path": path, "body": body.to_hex()}),
                    None,
                ));
            }
        };
        // The longest earlier request this one extends.
        let mut hashes = Vec::with_capacity(ids.len() + 1);
        let mut h = [0u8; 32];
        hashes.push(h);
        for id in &ids {
            h = chain_step(h, id);
            hashes.push(h);
        }
        let (covered, prefix) = (0..hashes.len())
            .rev()
            .find_map(|i| self.requests.get(&hashes[i]).map(|e| (i, Some(*e))))
            .unwrap_or((0, None));
        let mut new = Vec::new();
        for i in covered..ids.len() {
            let blob =
                messages
                    .canonical(&chat.messages, i)
                    .ok_or_else(|| ProxyError::Recording {
                        stream: self.ref_name.clone(),
                        detail: format!("message {i} of a request read before no longer parses"),
                    })?;
            new.push(put(b, links, &blob)?.to_hex());
        }
        let tools = match &chat.tools {
            Some(t) => Some(put(b, links, t)?.to_hex()),
            None => None,
        };
        if let Some(p) = prefix {
            links.push(p);
        }
        Ok((
            json!({
                "wire": WIRE_VERSION,
                "method": method,
                "path": path,
                "model": chat.model,
                "params": chat.params,
                "tools": tools,
                "prefix": prefix.map(|p| p.to_hex()),
                "messages": new,
            }),
            Some(h),
        ))
    }
}

/// Stores a blob the effect links to.
fn put(b: &mut ledger::Batch<'_>, links: &mut Vec<Id>, bytes: &[u8]) -> Result<Id, ProxyError> {
    let id = b.put_blob(bytes)?;
    links.push(id);
    Ok(id)
}

/// A reply with every known secret masked (body: same length, so the chunk
/// boundaries stay true; headers and the cut's cause: replaced).
fn masked(h: &HttpReply, needles: &Needles) -> HttpReply {
    HttpReply {
        status: h.status,
        headers: h
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), needles.text(v)))
            .collect(),
        body: needles.masked(&h.body).into_owned(),
        chunks: h.chunks.clone(),
        cut: h.cut.as_ref().map(|c| needles.text(c)),
    }
}

/// The effect's status, output and error for what answered (secrets
/// masked with `needles`).
fn outcome_record(
    b: &mut ledger::Batch<'_>,
    links: &mut Vec<Id>,
    outcome: &Outcome,
    chat: bool,
    needles: &Needles,
) -> Result<(EffectStatus, Option<Hash32>, String), ProxyError> {
    let text = |v: Value| String::from_utf8_lossy(&replay::canonical_json(&v)).into_owned();
    let h = match outcome {
        Outcome::Unreachable(msg) => {
            return Ok((
                EffectStatus::Retriable,
                None,
                text(json!({"unreachable": needles.text(msg), "failure": failure::UNREACHABLE})),
            ))
        }
        Outcome::Stopped {
            stop,
            detail,
            reply: None,
        } => {
            return Ok((
                EffectStatus::Failed,
                None,
                text(json!({"no_response": needles.text(detail), "failure": stop.class()})),
            ))
        }
        Outcome::Stopped {
            stop,
            detail,
            reply: Some(h),
        } => {
            let mut h = masked(h, needles);
            h.cut = Some(needles.text(detail));
            let err = http_failure(b, links, &h, stop.class())?;
            return Ok((EffectStatus::Failed, None, err));
        }
        Outcome::Http(h) => masked(h, needles),
    };
    if !(200..300).contains(&h.status) {
        let status = if h.status == 429 || h.status >= 500 {
            EffectStatus::Retriable
        } else {
            EffectStatus::Failed
        };
        return Ok((
            status,
            None,
            http_failure(b, links, &h, failure::HTTP_STATUS)?,
        ));
    }
    if h.cut.is_some() {
        return Ok((
            EffectStatus::Retriable,
            None,
            http_failure(b, links, &h, failure::CUT)?,
        ));
    }
    let raw = put(b, links, &h.body)?;
    let mut out = json!({"http": h.http_json(), "raw_body": raw.to_hex()});
    if chat {
        let es = h.event_stream();
        let (problem, reply) = wire::read_reply(&h.body, es);
        if let Some(wire::Problem::InBandError(_)) = problem {
            return Ok((
                EffectStatus::Retriable,
                None,
                http_failure(b, links, &h, failure::IN_BAND_ERROR)?,
            ));
        }
        let Some(reply) = reply else {
            return Ok((
                EffectStatus::Failed,
                None,
                http_failure(b, links, &h, failure::UNPARSABLE)?,
            ));
        };
        if problem == Some(wire::Problem::NoFinishReason) {
            return Ok((
                EffectStatus::Retriable,
                None,
                http_failure(b, links, &h, failure::NO_FINISH_REASON)?,
            ));
        }
        let mut v = reply.to_value();
        // The reassembled message is decoded text: a secret the upstream
        // sent with escapes (`\u0073k-...`) is whole in it, though not in
        // the raw body the needles masked.
        needles.value(&mut v);
        v["raw_body"] = out["raw_body"].take();
        v["http"] = out["http"].take();
        out = v;
    }
    let oid = b.put_blob(&replay::canonical_json(&out))?;
    Ok((EffectStatus::Ok, Some(Hash32(oid.0)), String::new()))
}

/// The error of a failed HTTP exchange: `{"http", "raw_body", "failure"}`.
fn http_failure(
    b: &mut ledger::Batch<'_>,
    links: &mut Vec<Id>,
    h: &HttpReply,
    class: &str,
) -> Result<String, ProxyError> {
    let raw = put(b, links, &h.body)?;
    let err = json!({"http": h.http_json(), "raw_body": raw.to_hex(), "failure": class});
    Ok(String::from_utf8_lossy(&replay::canonical_json(&err)).into_owned())
}

/// Every exchange recorded on stream `rel` of `run`, oldest first.
pub fn load(ledger: &Ledger, run: &str, rel: &str) -> Result<Vec<Recorded>, ProxyError> {
    let ref_name = replay::ref_name(run, rel);
    match ledger.head(&ref_name)? {
        Some(head) => load_chain(ledger, &ref_name, None, head),
        None => Ok(Vec::new()),
    }
}

/// The exchanges of a proxy stream after event `from` (exclusive; `None`:
/// from its start) up to `to`, oldest first. `label` names the stream in
/// errors.
pub fn load_chain(
    ledger: &Ledger,
    label: &str,
    from: Option<Id>,
    to: Id,
) -> Result<Vec<Recorded>, ProxyError> {
    let bad = |detail: String| ProxyError::Recording {
        stream: label.to_string(),
        detail,
    };
    let mut out = Vec::new();
    for ev in ledger.chain(to) {
        let ev = ev?;
        if Some(ev.id) == from {
            break;
        }
        if ev.kind != "effect" {
            return Err(bad(format!(
                "event {} is a {} event: this stream was not written by the proxy",
                ev.id.short(12),
                ev.kind
            )));
        }
        let e: Effect = schemas::decode_event(&ev)?;
        let request: Value = serde_json::from_slice(&ledger.get_blob(&Id(e.request.0))?)
            .map_err(|x| bad(format!("request of {}: {x}", ev.id.short(12))))?;
        if request["wire"].as_u64() != Some(WIRE_VERSION) {
            return Err(bad(format!(
                "event {} is not a wire record of version {WIRE_VERSION}: this stream was not written by the proxy",
                ev.id.short(12)
            )));
        }
        let (reply, failure) = match (&e.status, e.output) {
            (EffectStatus::Ok, Some(o)) => {
                let v: Value = serde_json::from_slice(&ledger.get_blob(&Id(o.0))?)
                    .map_err(|x| bad(format!("output of {}: {x}", ev.id.short(12))))?;
                let reply = http_outcome(&v).ok_or_else(|| {
                    bad(format!("output of {} has no http part", ev.id.short(12)))
                })?;
                (reply, None)
            }
            _ => {
                let v: Value = serde_json::from_str(&e.error)
                    .map_err(|x| bad(format!("error of {}: {x}", ev.id.short(12))))?;
                // No response at all: unreachable, or stopped before one came.
                let reply = match v["unreachable"].as_str().or(v["no_response"].as_str()) {
                    Some(m) => RecordedOutcome::Unreachable(m.to_string()),
                    None => http_outcome(&v).ok_or_else(|| {
                        bad(format!("error of {} has no http part", ev.id.short(12)))
                    })?,
                };
                (reply, v["failure"].as_str().map(str::to_string))
            }
        };
        let reply = with_recorded_chunks(ledger, ev.id, reply)?;
        out.push(Recorded {
            event: ev.id,
            seq: ev.seq,
            request,
            reply,
            status: e.status,
            failure,
        });
    }
    out.reverse();
    Ok(out)
}

/// A reply whose output held no chunk lengths gets those of the event's
/// metadata ([`CHUNKS_META`]); without either (metadata lost) the body is
/// sent again in one piece, which any client reads the same.
fn with_recorded_chunks(
    ledger: &Ledger,
    event: Id,
    mut reply: RecordedOutcome,
) -> Result<RecordedOutcome, ProxyError> {
    if let RecordedOutcome::Http { chunks, .. } = &mut reply {
        if chunks.is_empty() {
            let meta = ledger.get_meta(&event)?;
            *chunks = meta
                .extra
                .get(CHUNKS_META)
                .into_iter()
                .flat_map(|l| l.split(','))
                .filter_map(|c| c.parse().ok())
                .collect();
        }
    }
    Ok(reply)
}

fn http_outcome(v: &Value) -> Option<RecordedOutcome> {
    let h = &v["http"];
    let status = u16::try_from(h["status"].as_u64()?).ok()?;
    let headers = h["headers"]
        .as_array()?
        .iter()
        .filter_map(|p| Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string())))
        .collect();
    let chunks = h["chunks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_u64().map(|c| c as usize))
        .collect();
    let body = v["raw_body"].as_str().and_then(|s| s.parse().ok());
    Some(RecordedOutcome::Http {
        status,
        headers,
        body,
        chunks,
        cut: h["cut"].as_str().map(str::to_string),
    })
}

/// The full message list of a recorded chat request, following prefixes
/// through `by_event` (the stream's exchanges); `label` names the stream in
/// errors.
pub fn full_messages(
    label: &str,
    by_event: &HashMap<Id, &Recorded>,
    r: &Recorded,
) -> Result<Vec<Id>, ProxyError> {
    let mut parts = vec![r.new_messages()];
    let mut cur = r.prefix();
    while let Some(p) = cur {
        let prev = by_event.get(&p).ok_or_else(|| ProxyError::Recording {
            stream: label.to_string(),
            detail: format!("prefix {} is not in the stream", p.short(12)),
        })?;
        parts.push(prev.new_messages());
        cur = prev.prefix();
    }
    parts.reverse();
    Ok(parts.into_iter().flatten().collect())
}
