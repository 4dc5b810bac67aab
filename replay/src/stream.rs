//! A [`Stream`]: one actor's cursor over its recorded history.
//!
//! Every step the driver takes on a stream — a plain event (`emit`) or an effect
//! — is first matched against the stream's own history at the current position.
//! A match is served from the ledger (and nothing runs); a mismatch is a
//! [`Divergence`]. Past the end of the history the step is performed live and
//! appended (in [`Mode::Live`]) or refused (in [`Mode::Check`]).
//!
//! Effects: a journaled effect appends `started` before it runs and its result
//! after; on resume, a `started` without a result is run again, a result is
//! never re-run.

use std::collections::HashMap;
use std::future::Future;

use ledger::{Event, EventEnvelope, Id, NewEvent, ObjectKind};
use schemas::{Effect, EffectStatus, Hash32};

use crate::effect::{EffectError, EffectOutput, EffectRequest, FailureClass, Recorded, Served};
use crate::error::{Divergence, ReplayError, Result};
use crate::session::{Mode, Session};

pub struct Stream {
    session: Session,
    rel: String,
    ref_name: String,
    history: Vec<Event>,
    pos: usize,
    head: Option<Id>,
    /// Mixed mode: the source run's same stream, in order, and the effect
    /// kinds never taken from it.
    source: Option<(Vec<Event>, std::collections::BTreeSet<String>)>,
    clock_counter: u64,
    /// The last record [`finish_unsettled`](Stream::finish_unsettled) left
    /// to be made durable by [`settle`](Stream::settle) (by default,
    /// nothing).
    unsettled: ledger::Unsettled,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.session
            .note_visit(&self.rel, self.pos as u64, self.history.len() as u64);
    }
}

/// The unhashed metadata key of a live effect result's duration in
/// microseconds, from the moment [`Stream::begin`] decided to perform it to
/// its result (`mass export tables` reads it as a call's latency).
pub const ELAPSED_META: &str = "effect.elapsed_us";

/// A live effect in progress: returned by [`Stream::begin`], closed by [`Stream::finish`].
pub struct Pending {
    req: EffectRequest,
    started: Option<Id>,
    /// When the effect began, for the result's `effect.elapsed_us`.
    began: std::time::Instant,
}

/// What [`Stream::begin`] decided.
pub enum Begin {
    /// The result is already known.
    Served(Recorded),
    /// Run the effect, then pass its result to [`Stream::finish`].
    Perform(Pending),
}

impl Stream {
    pub(crate) fn open(session: Session, rel: &str) -> Result<Stream> {
        if rel.is_empty() {
            return Err(ReplayError::Ledger(ledger::LedgerError::BadRefName {
                name: rel.into(),
                reason: "empty stream name".into(),
            }));
        }
        let ref_name = session.ref_name(rel);
        let ledger = session.ledger().clone();
        let head = ledger.head(&ref_name)?;
        let history = load_chain(&ledger, head)?;
        let source = match &session.inner.source {
            Some(src) => Some((
                load_chain(&ledger, src.head(&ledger, rel)?)?,
                src.live_kinds.clone(),
            )),
            None => None,
        };
        Ok(Stream {
            session,
            rel: rel.to_string(),
            ref_name,
            history,
            pos: 0,
            head: None,
            source,
            clock_counter: 0,
            unsettled: ledger::Unsettled::default(),
        })
    }

    pub fn name(&self) -> &str {
        &self.rel
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Records how far into its history this stream went (also done when
    /// it is dropped; see [`Session::visited`]).
    pub fn note_visit(&self) {
        self.session
            .note_visit(&self.rel, self.pos as u64, self.history.len() as u64);
    }

    /// The last event this stream has produced or replayed.
    pub fn head(&self) -> Option<Id> {
        self.head
    }

    /// Position of the next step (= number of events so far).
    pub fn position(&self) -> u64 {
        self.pos as u64
    }

    /// True while the stream is still inside its recorded history.
    pub fn replaying(&self) -> bool {
        self.pos < self.history.len()
    }

    /// The next recorded event, if still replaying.
    pub fn peek_history(&self) -> Option<&Event> {
        self.history.get(self.pos)
    }

    /// The whole recorded history of the stream (as loaded when opened).
    pub fn history(&self) -> &[Event] {
        &self.history
    }

    /// If the next recorded event is of `kind`, consumes and returns it. Drivers
    /// use this for control events written outside the driver (e.g. `run.forked`).
    pub fn take_recorded(&mut self, kind: &str) -> Option<Event> {
        let ev = self
            .history
            .get(self.pos)
            .filter(|e| e.kind == kind)?
            .clone();
        self.pos += 1;
        self.head = Some(ev.id);
        Some(ev)
    }

    /// Appends (or, when replaying, verifies) a plain event: a decision derived
    /// from earlier events. Returns its id.
    pub fn emit(&mut self, mut ev: NewEvent) -> Result<Id> {
        ev.stream = Some(self.rel.clone());
        if let Some(rec) = self.history.get(self.pos) {
            let env = EventEnvelope::build(&self.rel, self.pos as u64, self.head, &ev);
            let id = env.id()?;
            if id != rec.id {
                return Err(self.diverged_event(rec, &ev, id));
            }
            self.pos += 1;
            self.head = Some(id);
            return Ok(id);
        }
        self.ensure_live()?;
        let id = self
            .session
            .ledger()
            .append(&self.ref_name, self.head, ev)?;
        self.pos += 1;
        self.head = Some(id);
        Ok(id)
    }

    /// Emits two events in order as one durable commit (one fsync where two
    /// `emit`s take two); `then` builds the second knowing the first's id,
    /// e.g. to name it as a parent. Replays check both against the history.
    pub fn emit_two(
        &mut self,
        first: NewEvent,
        then: impl FnOnce(Id) -> NewEvent,
    ) -> Result<(Id, Id)> {
        if self.pos < self.history.len() {
            let a = self.emit(first)?;
            let b = self.emit(then(a))?;
            return Ok((a, b));
        }
        self.ensure_live()?;
        let mut first = first;
        first.stream = Some(self.rel.clone());
        let ledger = self.session.ledger().clone();
        let mut batch = ledger.batch();
        let a = batch.append(&self.ref_name, self.head, first)?;
        let mut second = then(a);
        second.stream = Some(self.rel.clone());
        let b = batch.append(&self.ref_name, Some(a), second)?;
        batch.commit()?;
        self.pos += 2;
        self.head = Some(b);
        Ok((a, b))
    }

    /// Decides how an effect is satisfied: from history, from a source run, or
    /// live (in which case a journaled request is recorded as started first).
    ///
    /// Attempts that failed transiently are stepped over when a later attempt
    /// of the same request follows them; one that ends the stream is retried
    /// live (each attempt stays recorded), except in check mode, which serves
    /// it as the run saw it.
    pub fn begin(&mut self, req: EffectRequest) -> Result<Begin> {
        let request_id = req.id();
        while let Some(rec) = self.history.get(self.pos).cloned() {
            let e = self.effect_at(&rec, &req)?;
            if e.request.0 != request_id.0 || e.effect != req.kind {
                return Err(self.diverged_effect(&rec, &e, &req));
            }
            match e.status {
                EffectStatus::Started => {
                    let Some(done) = self.history.get(self.pos + 1).cloned() else {
                        // Started but never finished (a crash): run it again.
                        self.advance(rec.id);
                        self.ensure_live()?;
                        return Ok(Begin::Perform(Pending {
                            req,
                            started: Some(rec.id),
                            began: std::time::Instant::now(),
                        }));
                    };
                    let d = self.effect_at(&done, &req)?;
                    if d.request.0 != request_id.0 || d.status == EffectStatus::Started {
                        return Err(self.diverged_effect(&done, &d, &req));
                    }
                    self.advance(rec.id);
                    match self.after_retriable(&d, &req) {
                        Retry::Skip => self.advance(done.id),
                        Retry::Live => {
                            self.advance(done.id);
                            break;
                        }
                        Retry::Serve => {
                            self.advance(done.id);
                            self.session.count(&req.kind, Served::History);
                            return Ok(Begin::Served(self.recorded(&done, &d, Served::History)?));
                        }
                    }
                }
                _ => match self.after_retriable(&e, &req) {
                    Retry::Skip => self.advance(rec.id),
                    Retry::Live => {
                        self.advance(rec.id);
                        break;
                    }
                    Retry::Serve => {
                        self.advance(rec.id);
                        self.session.count(&req.kind, Served::History);
                        return Ok(Begin::Served(self.recorded(&rec, &e, Served::History)?));
                    }
                },
            }
        }
        self.ensure_live()?;
        if let Some(begin) = self.serve_from_source(&req)? {
            return Ok(begin);
        }
        let started = if req.journaled {
            let mut b = self.session.ledger().batch();
            let links = put_parts(&mut b, &req.bytes, &req.blobs, &req.links)?;
            let rec = Effect {
                effect: req.kind.clone(),
                request: Hash32(request_id.0),
                status: EffectStatus::Started,
                output: None,
                error: String::new(),
                links,
            };
            let id = b.append(&self.ref_name, self.head, self.effect_event(&rec)?)?;
            b.commit()?;
            self.pos += 1;
            self.head = Some(id);
            Some(id)
        } else {
            None
        };
        Ok(Begin::Perform(Pending {
            req,
            started,
            began: std::time::Instant::now(),
        }))
    }

    /// Records the result of a live effect and returns it.
    pub fn finish(
        &mut self,
        p: Pending,
        result: std::result::Result<EffectOutput, EffectError>,
    ) -> Result<Recorded> {
        let (rec, durable) = self.finish_deferred(p, result)?;
        durable.wait()?;
        Ok(rec)
    }

    /// [`finish`](Stream::finish) without waiting for the record to be
    /// durable: the caller must resolve the returned
    /// [`Durability`](ledger::Durability) (wait or await it) before
    /// anything depends on the record surviving a crash. Until then only
    /// this process's commits see it (the stream may go on appending to
    /// it); a crash loses it, and the effect is performed again on resume,
    /// which is why this is for effects that are not journaled.
    pub fn finish_deferred(
        &mut self,
        p: Pending,
        result: std::result::Result<EffectOutput, EffectError>,
    ) -> Result<(Recorded, ledger::Durability<'_>)> {
        let request_id = p.req.id();
        let mut b = self.session.ledger().batch();
        let mut links = if p.started.is_some() {
            // The started record already stored and links the request parts.
            b.put_blob(&p.req.bytes)?;
            Vec::new()
        } else {
            put_parts(&mut b, &p.req.bytes, &p.req.blobs, &p.req.links)?
        };
        let (status, output, error) = match &result {
            Ok(out) => {
                let oid = b.put_blob(&out.bytes)?;
                for blob in &out.blobs {
                    links.push(Hash32(b.put_blob(blob)?.0));
                }
                links.extend(out.links.iter().map(|l| Hash32(l.0)));
                (EffectStatus::Ok, Some(Hash32(oid.0)), String::new())
            }
            Err(e) => (
                match e.class {
                    FailureClass::Transient => EffectStatus::Retriable,
                    FailureClass::Final => EffectStatus::Failed,
                },
                None,
                e.message.clone(),
            ),
        };
        links.sort();
        links.dedup();
        let rec = Effect {
            effect: p.req.kind.clone(),
            request: Hash32(request_id.0),
            status,
            output,
            error,
            links,
        };
        // How long the effect took (from `begin`, waits for a concurrency
        // slot included) is the transport's timing, not part of what was
        // decided: unhashed metadata, so replays keep their ids.
        let elapsed = p.began.elapsed().as_micros().to_string();
        let ev = self.effect_event(&rec)?.with_meta(ELAPSED_META, elapsed);
        let id = b.append(&self.ref_name, self.head, ev)?;
        let durable = b.submit()?;
        self.pos += 1;
        self.head = Some(id);
        self.session.count(&p.req.kind, Served::Live);
        let rec = Recorded {
            event: id,
            failure: result.as_ref().err().map(|e| e.class),
            output: result.map(|o| o.bytes).map_err(|e| e.message),
            source: Served::Live,
        };
        Ok((rec, durable))
    }

    /// [`finish`](Stream::finish) for an effect that is not journaled,
    /// without waiting: the record is submitted (this process's later
    /// commits build on it) and its acknowledgement is kept on the stream
    /// until [`settle`](Stream::settle). The caller settles before anything
    /// depends on the record surviving a crash: before a request built on
    /// it leaves the process, before it is read back, and before the
    /// stream's work is reported done. A crash before then loses the
    /// record (and every record after it), and resume performs the effect
    /// again, as for a crash while it ran.
    pub fn finish_unsettled(
        &mut self,
        p: Pending,
        result: std::result::Result<EffectOutput, EffectError>,
    ) -> Result<Recorded> {
        let (rec, durable) = self.finish_deferred(p, result)?;
        let u = durable.detach();
        self.unsettled = self.unsettled.and(u);
        Ok(rec)
    }

    /// Resolves once every record this stream left unsettled is durable
    /// (at once when there is none). Groups are written in order, so this
    /// also covers every commit this process submitted before them.
    pub fn settle(&mut self) -> Result<ledger::Durability<'_>> {
        let u = std::mem::take(&mut self.unsettled);
        Ok(self.session.ledger().settle(u)?)
    }

    /// Runs an effect through the recording: served if recorded, else `perform`.
    pub async fn effect<F, Fut>(&mut self, req: EffectRequest, perform: F) -> Result<Recorded>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<EffectOutput, EffectError>>,
    {
        match self.begin(req)? {
            Begin::Served(r) => Ok(r),
            Begin::Perform(p) => {
                let out = perform().await;
                self.finish(p, out)
            }
        }
    }

    /// The blocking twin of [`Stream::effect`].
    pub fn effect_blocking<F>(&mut self, req: EffectRequest, perform: F) -> Result<Recorded>
    where
        F: FnOnce() -> std::result::Result<EffectOutput, EffectError>,
    {
        match self.begin(req)? {
            Begin::Served(r) => Ok(r),
            Begin::Perform(p) => {
                let out = perform();
                self.finish(p, out)
            }
        }
    }

    /// Reads the clock through an effect, so replay sees the recorded time.
    pub fn now_ms(&mut self) -> Result<u64> {
        self.clock_counter += 1;
        let req = EffectRequest::json("clock", &serde_json::json!({ "clock": self.clock_counter }));
        let clock = self.session.inner.clock.clone();
        let r = self.effect_blocking(req, || {
            Ok(EffectOutput::new(clock().to_le_bytes().to_vec()))
        })?;
        let bytes = r
            .output
            .map_err(|e| self.bad(r.event, format!("clock effect failed: {e}")))?;
        let arr: [u8; 8] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| self.bad(r.event, "clock output is not 8 bytes".into()))?;
        Ok(u64::from_le_bytes(arr))
    }

    /// A seed for `purpose` in this stream, derived from the run's root seed.
    pub fn derive_seed(&self, purpose: &str) -> u64 {
        self.session.derive_seed(&self.rel, purpose)
    }

    /// Mixed mode: the source's records for `req` at this stream's position,
    /// copied as they were, and what to do next. Only while this stream is an
    /// exact prefix of the source's same stream: its head is the source's
    /// record at the same position (ids chain, so every earlier record, the
    /// requests and results that shaped the workspace included, is the
    /// same). From the first difference on the stream is live to its end.
    /// Attempts that failed transiently and that another attempt follows are
    /// copied but stepped over, as a replay of the run's own history does;
    /// a transient failure that ends the source is copied and retried live.
    fn serve_from_source(&mut self, req: &EffectRequest) -> Result<Option<Begin>> {
        let Some((src, live_kinds)) = &self.source else {
            return Ok(None);
        };
        let aligned = match self.pos {
            0 => self.head.is_none(),
            p => src.get(p - 1).map(|e| e.id) == self.head,
        };
        if !aligned || live_kinds.contains(&req.kind) {
            return Ok(None);
        }
        let run = source_run(src, self.pos, req)?;
        let Some(last) = run.last().cloned() else {
            return Ok(None);
        };
        let mut b = self.session.ledger().batch();
        let mut head = self.head;
        for e in &run {
            head = Some(b.append(&self.ref_name, head, self.effect_event(e)?)?);
        }
        b.commit()?;
        self.pos += run.len();
        self.head = head;
        let id = head.unwrap_or(Id([0; 32]));
        let moved_on = src.len() > self.pos;
        match last.status {
            EffectStatus::Started => Ok(Some(Begin::Perform(Pending {
                req: req.clone(),
                started: Some(id),
                began: std::time::Instant::now(),
            }))),
            // The source ended on it: retry, as a resume of the source would.
            EffectStatus::Retriable if !moved_on => Ok(None),
            _ => {
                self.session.count(&req.kind, Served::Source);
                Ok(Some(Begin::Served(self.recorded_with_id(
                    id,
                    &last,
                    Served::Source,
                )?)))
            }
        }
    }

    /// Moves the cursor past a history record.
    fn advance(&mut self, id: Id) {
        self.pos += 1;
        self.head = Some(id);
    }

    /// What to do with a recorded result `e` at the cursor (whose own record
    /// has not been consumed yet): step over a transient failure that a later
    /// attempt of the same request follows, retry one that ends the stream
    /// (live modes), serve anything else.
    fn after_retriable(&self, e: &Effect, req: &EffectRequest) -> Retry {
        if e.status != EffectStatus::Retriable {
            return Retry::Serve;
        }
        // The record after this result (pos + 1 is the result itself when
        // it was not journaled; the caller has consumed `started` already).
        match self.history.get(self.pos + 1) {
            // A mixed stream that copied this failure from its source, which
            // moved past it (its caller saw it): serve it, as the source did.
            None if self.source_moved_past(e, req) => Retry::Serve,
            None if *self.session.mode() != Mode::Check => Retry::Live,
            None => Retry::Serve,
            Some(next) => match schemas::decode_event::<Effect>(next) {
                Ok(n) if n.request == e.request && n.effect == req.kind => Retry::Skip,
                _ => Retry::Serve,
            },
        }
    }

    /// Mixed mode: whether the transient failure `e` at the cursor is the
    /// source's own record at this position (the stream is its prefix
    /// through it) and the source went on with something other than another
    /// attempt of the same request.
    fn source_moved_past(&self, e: &Effect, req: &EffectRequest) -> bool {
        let Some((src, _)) = &self.source else {
            return false;
        };
        let here = self.history.get(self.pos).map(|r| r.id);
        if here.is_none() || src.get(self.pos).map(|r| r.id) != here {
            return false;
        }
        match src.get(self.pos + 1) {
            None => false,
            Some(next) => !matches!(
                schemas::decode_event::<Effect>(next),
                Ok(n) if n.request == e.request && n.effect == req.kind
            ),
        }
    }

    fn ensure_live(&self) -> Result<()> {
        if *self.session.mode() == Mode::Check {
            return Err(ReplayError::RecordingEnded {
                stream: self.rel.clone(),
                position: self.pos as u64,
            });
        }
        Ok(())
    }

    fn effect_event(&self, e: &Effect) -> Result<NewEvent> {
        Ok(schemas::to_event(e)?.in_stream(self.rel.clone()))
    }

    fn effect_at(&self, rec: &Event, req: &EffectRequest) -> Result<Effect> {
        if rec.kind != "effect" {
            return Err(ReplayError::Divergence(Box::new(Divergence {
                stream: self.rel.clone(),
                position: self.pos as u64,
                expected: rec.id,
                actual: req.id(),
                summary: format!(
                    "the recording has a {} event here, the driver asked for a {} effect",
                    rec.kind, req.kind
                ),
                diff: describe_event(rec)
                    .map(|v| vec![format!("recorded: {v}")])
                    .unwrap_or_default(),
            })));
        }
        schemas::decode_event(rec).map_err(|e| self.bad(rec.id, e.to_string()))
    }

    fn recorded(&self, ev: &Event, e: &Effect, how: Served) -> Result<Recorded> {
        self.recorded_with_id(ev.id, e, how)
    }

    fn recorded_with_id(&self, id: Id, e: &Effect, how: Served) -> Result<Recorded> {
        let (output, failure) = match (e.status, e.output) {
            (EffectStatus::Ok, Some(o)) => (Ok(self.session.ledger().get_blob(&Id(o.0))?), None),
            (EffectStatus::Failed, _) => (Err(e.error.clone()), Some(FailureClass::Final)),
            (EffectStatus::Retriable, _) => (Err(e.error.clone()), Some(FailureClass::Transient)),
            _ => return Err(self.bad(id, "effect result without output".into())),
        };
        Ok(Recorded {
            event: id,
            output,
            failure,
            source: how,
        })
    }

    fn bad(&self, id: Id, detail: String) -> ReplayError {
        ReplayError::BadRecording {
            stream: self.rel.clone(),
            position: self.pos as u64,
            id,
            detail,
        }
    }

    fn diverged_effect(&self, rec: &Event, e: &Effect, req: &EffectRequest) -> ReplayError {
        let ledger = self.session.ledger();
        let recorded_req = ledger.get_blob(&Id(e.request.0)).ok();
        let pending: HashMap<String, Vec<u8>> = req
            .blobs
            .iter()
            .map(|b| (Id::of(ObjectKind::Blob, b).to_hex(), b.clone()))
            .collect();
        let expand = |hex: &str| -> Option<serde_json::Value> {
            let bytes = match pending.get(hex) {
                Some(b) => b.clone(),
                None => ledger.get_blob(&hex.parse().ok()?).ok()?,
            };
            serde_json::from_slice(&bytes)
                .ok()
                .or_else(|| String::from_utf8(bytes).ok().map(serde_json::Value::String))
        };
        let as_json = |b: &[u8]| {
            serde_json::from_slice(b).unwrap_or_else(|_| {
                serde_json::Value::String(String::from_utf8_lossy(b).into_owned())
            })
        };
        let mut diff = Vec::new();
        if e.effect != req.kind {
            diff.push(format!("effect kind: {:?} -> {:?}", e.effect, req.kind));
        }
        match &recorded_req {
            Some(r) => diff.extend(crate::diff::json_diff(
                &as_json(r),
                &as_json(&req.bytes),
                &expand,
                20,
            )),
            None => diff.push("(recorded request blob unreadable)".into()),
        }
        ReplayError::Divergence(Box::new(Divergence {
            stream: self.rel.clone(),
            position: self.pos as u64,
            expected: Id(e.request.0),
            actual: req.id(),
            summary: format!(
                "effect {}: the driver made a different request (recorded event {})",
                req.kind,
                rec.id.short(12)
            ),
            diff,
        }))
    }

    fn diverged_event(&self, rec: &Event, ev: &NewEvent, actual: Id) -> ReplayError {
        let recorded = describe_event(rec).unwrap_or(serde_json::Value::Null);
        let mine = describe_new(ev, &self.rel, self.pos as u64, self.head);
        let ledger = self.session.ledger();
        let expand = |hex: &str| -> Option<serde_json::Value> {
            let id: Id = hex.parse().ok()?;
            let bytes = ledger.get_blob(&id).ok()?;
            serde_json::from_slice(&bytes).ok()
        };
        ReplayError::Divergence(Box::new(Divergence {
            stream: self.rel.clone(),
            position: self.pos as u64,
            expected: rec.id,
            actual,
            summary: if rec.kind == ev.kind {
                format!("a different {} event", ev.kind)
            } else {
                format!(
                    "the recording has a {} event here, the driver produced a {} event",
                    rec.kind, ev.kind
                )
            },
            diff: crate::diff::json_diff(&recorded, &mine, &expand, 20),
        }))
    }
}

/// See [`Stream::after_retriable`].
enum Retry {
    Skip,
    Live,
    Serve,
}

fn describe_event(ev: &Event) -> Option<serde_json::Value> {
    Some(serde_json::json!({
        "kind": ev.kind,
        "version": ev.version,
        "prev": ev.prev.map(|p| p.to_hex()),
        "parents": ev.parents.iter().map(|p| p.to_hex()).collect::<Vec<_>>(),
        "payload": schemas::describe(&ev.kind, ev.version, &ev.payload).unwrap_or_else(|_| serde_json::Value::String(hex::encode(&ev.payload))),
    }))
}

fn describe_new(ev: &NewEvent, _stream: &str, _seq: u64, prev: Option<Id>) -> serde_json::Value {
    serde_json::json!({
        "kind": ev.kind,
        "version": ev.version,
        "prev": prev.map(|p| p.to_hex()),
        "parents": ev.parents.iter().map(|p| p.to_hex()).collect::<Vec<_>>(),
        "payload": schemas::describe(&ev.kind, ev.version, &ev.payload).unwrap_or_else(|_| serde_json::Value::String(hex::encode(&ev.payload))),
    })
}

/// Stores the request bytes and blobs in a batch; returns the links the effect
/// record must carry (blob ids and caller links).
fn put_parts(
    b: &mut ledger::Batch<'_>,
    bytes: &[u8],
    blobs: &[Vec<u8>],
    links: &[Id],
) -> Result<Vec<Hash32>> {
    b.put_blob(bytes)?;
    let mut out = Vec::new();
    for blob in blobs {
        out.push(Hash32(b.put_blob(blob)?.0));
    }
    out.extend(links.iter().map(|l| Hash32(l.0)));
    out.sort();
    out.dedup();
    Ok(out)
}

fn load_chain(ledger: &ledger::Ledger, head: Option<Id>) -> Result<Vec<Event>> {
    let mut v = Vec::new();
    if let Some(h) = head {
        for ev in ledger.chain(h) {
            v.push(ev?);
        }
    }
    v.reverse();
    Ok(v)
}

/// The records of `req` at position `at` of a source stream: its attempts
/// (each `started` when journaled, then its result), up to and including
/// the first that is not a transient failure another attempt follows.
/// Empty when the record there is anything else.
fn source_run(src: &[Event], at: usize, req: &EffectRequest) -> Result<Vec<Effect>> {
    let request = req.id();
    let attempt = |i: usize| -> Result<Option<Effect>> {
        let Some(ev) = src.get(i).filter(|ev| ev.kind == "effect") else {
            return Ok(None);
        };
        let e: Effect = schemas::decode_event(ev)?;
        Ok((e.request.0 == request.0 && e.effect == req.kind).then_some(e))
    };
    let mut run = Vec::new();
    let mut i = at;
    while let Some(e) = attempt(i)? {
        i += 1;
        let status = e.status;
        run.push(e);
        match status {
            EffectStatus::Started => {}
            EffectStatus::Retriable if attempt(i)?.is_some() => {}
            _ => break,
        }
    }
    Ok(run)
}
