//! Replay matching: which recorded exchange answers a request. A request is
//! matched by its normalised content, never by arrival order (a harness's
//! background subagents interleave with the orchestrator differently on
//! every run): its key hashes the method, path, model, parameters, tools and
//! message list after the normaliser ran. A received request is scrubbed
//! first exactly as the recording was (`scrub::request`), so a request that
//! carries a credential still matches, and no miss report shows one. Equal
//! keys are served in recorded order, each once. A miss is reported with
//! the stream, the position and a readable diff against the closest
//! recorded request still unserved.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ledger::{Id, Ledger};
use serde_json::{json, Map, Value};

use super::log::{self, chain_step, Recorded};
use super::normalise::Normaliser;
use super::scrub::{self, Needles};
use super::wire::ChatBody;
use super::ProxyError;

/// The recorded exchanges of one stream, indexed for matching.
pub struct Book {
    ledger: Arc<Ledger>,
    label: String,
    normaliser: Normaliser,
    /// The normaliser of received requests; the recorded side's unless set
    /// (a re-executed harness works in another directory: each side maps
    /// its own paths to the same placeholder).
    incoming: Normaliser,
    exchanges: Vec<Recorded>,
    by_key: HashMap<[u8; 32], VecDeque<usize>>,
    /// How many recorded exchanges have each key.
    recorded_times: HashMap<[u8; 32], usize>,
    served: Vec<bool>,
    /// Exchanges before the replayed range (never served, not counted).
    outside: usize,
    /// Each exchange's key.
    keys: Vec<[u8; 32]>,
    received: u64,
    /// Normalised hash of each message or tools blob (`true`: tools), by
    /// blob id.
    norm_cache: HashMap<(bool, Id), [u8; 32]>,
    /// Per exchange: the chain hash of its normalised message list.
    chains: Vec<Option<([u8; 32], usize)>>,
}

/// What a request gets.
#[derive(Debug)]
pub enum Answer {
    /// The recorded exchange at this index.
    Hit(usize),
    /// Nothing matches: why, for the client and the operator.
    Miss(Miss),
}

#[derive(Debug, Clone)]
pub struct Miss {
    /// 1-based number of the request on this stream.
    pub position: u64,
    /// The report: stream, position, closest recorded request, diff.
    pub report: String,
}

fn hash_value(v: &Value) -> [u8; 32] {
    *blake3::hash(&replay::canonical_json(v)).as_bytes()
}

impl Book {
    pub fn open(
        ledger: Arc<Ledger>,
        run: &str,
        rel: &str,
        normaliser: Normaliser,
    ) -> Result<Book, ProxyError> {
        let exchanges = log::load(&ledger, run, rel)?;
        Book::index(ledger, replay::ref_name(run, rel), normaliser, exchanges)
    }

    fn index(
        ledger: Arc<Ledger>,
        label: String,
        normaliser: Normaliser,
        exchanges: Vec<Recorded>,
    ) -> Result<Book, ProxyError> {
        if exchanges.is_empty() {
            return Err(ProxyError::NothingRecorded { stream: label });
        }
        let n = exchanges.len();
        let mut book = Book {
            ledger,
            label,
            incoming: normaliser.clone(),
            normaliser,
            exchanges,
            by_key: HashMap::new(),
            recorded_times: HashMap::new(),
            served: vec![false; n],
            outside: 0,
            keys: Vec::with_capacity(n),
            received: 0,
            norm_cache: HashMap::new(),
            chains: vec![None; n],
        };
        let index: HashMap<Id, usize> = book
            .exchanges
            .iter()
            .enumerate()
            .map(|(i, r)| (r.event, i))
            .collect();
        for i in 0..n {
            let key = book.recorded_key(i, &index)?;
            book.by_key.entry(key).or_default().push_back(i);
            book.keys.push(key);
            *book.recorded_times.entry(key).or_default() += 1;
        }
        Ok(book)
    }

    /// Received requests are normalised with `n` (recorded ones as before).
    pub fn with_incoming(mut self, n: Normaliser) -> Book {
        self.incoming = n;
        self
    }

    /// The exchanges after event `from` (exclusive) up to `to` of a proxy
    /// stream, whatever run's ref holds them: one attempt's traffic.
    pub fn open_range(
        ledger: Arc<Ledger>,
        label: &str,
        normaliser: Normaliser,
        from: Option<Id>,
        to: Id,
    ) -> Result<Book, ProxyError> {
        // The whole chain, so requests whose prefix is an earlier attempt's
        // (a resumed run's) still read whole; the earlier ones are never
        // served.
        let exchanges = log::load_chain(&ledger, label, None, to)?;
        let skip = match from {
            Some(f) => exchanges
                .iter()
                .position(|r| r.event == f)
                .map_or(0, |i| i + 1),
            None => 0,
        };
        let mut book = Book::index(ledger, label.to_string(), normaliser, exchanges)?;
        for q in book.by_key.values_mut() {
            q.retain(|i| *i >= skip);
        }
        for t in book.recorded_times.values_mut() {
            *t = 0;
        }
        for i in skip..book.exchanges.len() {
            // Recount: only this attempt's requests make a "sent once more".
            let key = book.keys[i];
            *book.recorded_times.entry(key).or_default() += 1;
        }
        for s in &mut book.served[..skip] {
            *s = true;
        }
        book.outside = skip;
        Ok(book)
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn exchange(&self, i: usize) -> &Recorded {
        &self.exchanges[i]
    }

    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// How many recorded exchanges were served so far, of how many.
    pub fn progress(&self) -> (usize, usize) {
        (
            self.served.iter().filter(|s| **s).count() - self.outside,
            self.served.len() - self.outside,
        )
    }

    /// A recorded JSON blob (a message, the tools).
    fn blob_value(&self, id: &Id) -> Result<Value, ProxyError> {
        serde_json::from_slice(&self.ledger.get_blob(id)?).map_err(|e| ProxyError::Recording {
            stream: self.label.clone(),
            detail: format!("blob {}: {e}", id.short(12)),
        })
    }

    /// The normalised hash of a recorded message (`field` "messages") or
    /// tools blob ("tools", scrubbed again: recorded before scrubbing
    /// existed, it still matches).
    fn norm_blob(&mut self, field: &str, id: &Id) -> Result<[u8; 32], ProxyError> {
        let key = (field == "tools", *id);
        if let Some(h) = self.norm_cache.get(&key) {
            return Ok(*h);
        }
        let mut v = self.blob_value(id)?;
        if field == "tools" {
            scrub::json(&mut v, &mut Needles::new());
        }
        let h = hash_value(&self.normaliser.field(field, &v));
        self.norm_cache.insert(key, h);
        Ok(h)
    }

    fn recorded_key(
        &mut self,
        i: usize,
        index: &HashMap<Id, usize>,
    ) -> Result<[u8; 32], ProxyError> {
        let r = self.exchanges[i].clone();
        if !r.is_chat() {
            let body = match r.request["body"]
                .as_str()
                .and_then(|h| h.parse::<Id>().ok())
            {
                Some(id) => self.ledger.get_blob(&id)?,
                None => Vec::new(),
            };
            return Ok(Self::opaque_key(
                &self.normaliser,
                &r.request["method"],
                &recorded_path(&r.request["path"]),
                &body,
            ));
        }
        let (mut h, mut count) = match r.prefix() {
            Some(p) => {
                let j = *index.get(&p).ok_or_else(|| ProxyError::Recording {
                    stream: self.label.clone(),
                    detail: format!("prefix {} is not in the stream", p.short(12)),
                })?;
                self.chains[j].ok_or_else(|| ProxyError::Recording {
                    stream: self.label.clone(),
                    detail: format!("prefix {} comes after its request", p.short(12)),
                })?
            }
            None => ([0; 32], 0),
        };
        for m in r.new_messages() {
            let nh = self.norm_blob("messages", &m)?;
            h = chain_step(h, &Id(nh));
            count += 1;
        }
        self.chains[i] = Some((h, count));
        let tools = match r.request["tools"]
            .as_str()
            .and_then(|t| t.parse::<Id>().ok())
        {
            Some(t) => Some(self.norm_blob("tools", &t)?),
            None => None,
        };
        let mut params = r.request["params"].as_object().cloned().unwrap_or_default();
        scrub::fields(&mut params, &mut Needles::new());
        Ok(Self::chat_key(
            &self.normaliser,
            &r.request["method"],
            &recorded_path(&r.request["path"]),
            &r.request["model"],
            Some(&params),
            tools,
            h,
            count,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn chat_key(
        n: &Normaliser,
        method: &Value,
        path: &Value,
        model: &Value,
        params: Option<&Map<String, Value>>,
        tools: Option<[u8; 32]>,
        messages: [u8; 32],
        count: usize,
    ) -> [u8; 32] {
        let params: Map<String, Value> = params
            .into_iter()
            .flatten()
            .filter(|(k, _)| !n.ignores(k))
            .map(|(k, v)| (k.clone(), n.field(k, v)))
            .collect();
        let keep = |field: &str, v: Value| if n.ignores(field) { Value::Null } else { v };
        hash_value(&json!({
            "method": method,
            "path": path,
            "model": keep("model", n.field("model", model)),
            "params": params,
            "tools": keep("tools", json!(tools.map(hex::encode))),
            "messages": keep("messages", json!(hex::encode(messages))),
            "count": keep("messages", json!(count)),
        }))
    }

    fn opaque_key(n: &Normaliser, method: &Value, path: &Value, body: &[u8]) -> [u8; 32] {
        let body = match serde_json::from_slice::<Value>(body) {
            Ok(v) => n.body(&v),
            Err(_) => Value::String(n.text("body", &String::from_utf8_lossy(body))),
        };
        hash_value(&json!({"method": method, "path": path, "body": body}))
    }

    /// The normalised message hashes of a received chat request.
    fn received_chain(&self, chat: &ChatBody) -> Vec<[u8; 32]> {
        chat.messages
            .iter()
            .map(|m| hash_value(&self.incoming.field("messages", m)))
            .collect()
    }

    /// Finds the recorded answer to a request and marks it served.
    pub fn answer(&mut self, method: &str, path: &str, body: &[u8]) -> Result<Answer, ProxyError> {
        self.answer_with(method, path, body, &Needles::new())
    }

    /// [`Book::answer`], knowing secrets the request may carry (`known`:
    /// the route's, the request's credential headers): the request is
    /// scrubbed as the recording was before it is compared.
    pub fn answer_with(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        known: &Needles,
    ) -> Result<Answer, ProxyError> {
        self.received += 1;
        let position = self.received;
        let (path, body, _) = scrub::request(path, body, known);
        let (method, path) = (json!(method), json!(path));
        let (chat, body) = match body {
            scrub::Body::Chat(c) => (Some(c), Vec::new()),
            scrub::Body::Opaque(b) => (None, b),
        };
        let body = &body[..];
        let key = match &chat {
            Some(c) => {
                let mut h = [0; 32];
                for m in self.received_chain(c) {
                    h = chain_step(h, &Id(m));
                }
                let tools = c
                    .tools
                    .as_ref()
                    .map(|t| hash_value(&self.incoming.field("tools", t)));
                let model = json!(c.model);
                Self::chat_key(
                    &self.incoming,
                    &method,
                    &path,
                    &model,
                    Some(&c.params),
                    tools,
                    h,
                    c.messages.len(),
                )
            }
            None => Self::opaque_key(&self.incoming, &method, &path, body),
        };
        if let Some(q) = self.by_key.get_mut(&key) {
            if let Some(i) = q.pop_front() {
                self.served[i] = true;
                return Ok(Answer::Hit(i));
            }
        }
        let times = self.recorded_times.get(&key).copied().unwrap_or(0);
        if times > 0 {
            let (served, total) = self.progress();
            return Ok(Answer::Miss(Miss {
                position,
                report: format!(
                    "mass proxy replay: request {position} of stream {} ({} {}) was recorded {times} time(s) and every one is already served: the client sent it once more than recorded (a retry the recording does not hold?); {served} of {total} recorded exchanges served so far.",
                    self.label,
                    method.as_str().unwrap_or(""),
                    path.as_str().unwrap_or(""),
                ),
            }));
        }
        let report = self.miss_report(position, &method, &path, chat.as_ref(), body)?;
        Ok(Answer::Miss(Miss { position, report }))
    }

    /// The full recorded request of exchange `i`, normalised, as one value;
    /// `by_event` indexes the stream's exchanges.
    fn recorded_request(
        &self,
        by_event: &HashMap<Id, &Recorded>,
        i: usize,
    ) -> Result<Value, ProxyError> {
        let r = &self.exchanges[i];
        if !r.is_chat() {
            return Ok(r.request.clone());
        }
        let messages = log::full_messages(&self.label, by_event, r)?
            .iter()
            .map(|id| self.blob_value(id))
            .collect::<Result<Vec<_>, _>>()?;
        let tools = match r.request["tools"]
            .as_str()
            .and_then(|t| t.parse::<Id>().ok())
        {
            Some(t) => {
                let mut t = self.blob_value(&t)?;
                scrub::json(&mut t, &mut Needles::new());
                Some(t)
            }
            None => None,
        };
        let mut params = r.request["params"].as_object().cloned().unwrap_or_default();
        scrub::fields(&mut params, &mut Needles::new());
        let body = ChatBody {
            model: r.request["model"].as_str().unwrap_or_default().to_string(),
            messages,
            tools,
            params,
        };
        Ok(comparable(&self.normaliser, &body))
    }

    fn miss_report(
        &mut self,
        position: u64,
        method: &Value,
        path: &Value,
        chat: Option<&ChatBody>,
        body: &[u8],
    ) -> Result<String, ProxyError> {
        let (served, total) = self.progress();
        let mut report = format!(
            "mass proxy replay: no recorded exchange of stream {} matches request {position} ({} {}); {served} of {total} recorded exchanges served so far.",
            self.label,
            method.as_str().unwrap_or(""),
            path.as_str().unwrap_or(""),
        );
        let Some(chat) = chat else {
            report.push_str(&format!(
                " The request is not a chat request ({} bytes); nothing recorded has its method, path and body.",
                body.len()
            ));
            return Ok(report);
        };
        let received = self.received_chain(chat);
        // The closest: unserved first, then the longest common message
        // prefix, then the earliest.
        let by_event: HashMap<Id, &Recorded> =
            self.exchanges.iter().map(|r| (r.event, r)).collect();
        let mut best: Option<((bool, usize, usize), Value)> = None;
        for i in self.outside..self.exchanges.len() {
            if !self.exchanges[i].is_chat() {
                continue;
            }
            let recorded = self.recorded_request(&by_event, i)?;
            let common = recorded["messages"]
                .as_array()
                .map(|ms| {
                    ms.iter()
                        .zip(&received)
                        .take_while(|(m, h)| hash_value(m) == **h)
                        .count()
                })
                .unwrap_or(0);
            let cand = (!self.served[i], common, usize::MAX - i);
            if best.as_ref().is_none_or(|(b, _)| cand > *b) {
                best = Some((cand, recorded));
            }
        }
        let Some(((unserved, common, inv), recorded)) = best else {
            report.push_str(" The stream holds no chat request to compare with.");
            return Ok(report);
        };
        let i = usize::MAX - inv;
        let r = &self.exchanges[i];
        let n_rec = recorded["messages"].as_array().map_or(0, Vec::len);
        report.push_str(&format!(
            "\nClosest recorded request: position {} of the stream (event {}, {}), {common} leading message(s) equal of {} recorded and {} received.\nDifferences after normalising (recorded -> received):\n",
            r.seq + 1,
            r.event.short(12),
            if unserved { "not yet served" } else { "already served" },
            n_rec,
            received.len(),
        ));
        let received_v = comparable(&self.incoming, chat);
        let diff = replay::diff::json_diff(&recorded, &received_v, &|_| None, 12);
        if diff.is_empty() {
            report.push_str("  (none: the recorded request was already served; the client sent it once more than recorded)\n");
        }
        for line in diff {
            report.push_str("  ");
            report.push_str(&line);
            report.push('\n');
        }
        Ok(report)
    }
}

/// A recorded path, scrubbed again (recorded before scrubbing existed, it
/// still matches).
fn recorded_path(p: &Value) -> Value {
    match p.as_str() {
        Some(s) => json!(scrub::query(s, &mut Needles::new())),
        None => p.clone(),
    }
}

/// A request as compared: normalised, ignored fields dropped.
fn comparable(n: &Normaliser, chat: &ChatBody) -> Value {
    let mut v = n.body(&chat.to_value());
    if let Value::Object(m) = &mut v {
        m.retain(|k, _| !n.ignores(k));
    }
    v
}
