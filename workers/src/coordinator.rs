//! The coordinator's executor (`mass run FILE --workers URL`): each work
//! item a stage submits is published to the store, and its result, once a
//! worker publishes one, is pulled into the run's ledger under the item's
//! streams, checked, and handed back to the stage as the in-process
//! executor would hand it.
//!
//! One thread (the pump) talks to the store: it uploads what the items
//! will read (everything the run's refs reach that the store lacks: the
//! task suite, trained adapters, the runs a judgment compares), publishes
//! items, lists results, pulls them, and retries a store that does not
//! answer with backoff, up to `patience`; then every waiting item fails
//! as an infrastructure failure (exit 7) and `mass resume` continues.
//!
//! Items whose streams this ledger already holds (a resumed run, a fork)
//! run in process, where they are served from the ledger. Which result was
//! used for each item is appended to the run's `workers` stream as a
//! `mass.work` record, beside the steps: the run's head does not depend on
//! who executed what.

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::backend::{Adapter, Backends};
use engine::error::{EngineError, Result as EResult};
use engine::work::{
    Executor, ExecutorParts, InProcess, JudgmentItem, MakeExecutor, RolloutItem, Work,
};
use ledger::{Id, Ledger, ObjectKind};
use replay::Session;
use schemas::{Hash32, Judgment};

use crate::error::{Result, WorkError};
use crate::wire::{self, AdapterWire, Context, Envelope, WorkResult};

/// The relative name of a run's stream of `mass.work` records.
pub const WORKERS_STREAM: &str = "workers";

/// How the coordinator uses the store.
#[derive(Debug, Clone)]
pub struct Settings {
    pub url: String,
    /// How long the store may be unreachable before the run stops (exit 7).
    pub patience: Duration,
    /// How often results are looked for.
    pub poll: Duration,
    /// Attempts per item before it is given up as failed.
    pub max_attempts: u32,
    /// The index cache's directory (the ledger's `remote-cache`).
    pub cache: Option<std::path::PathBuf>,
    /// Test-only: results may name streams outside their item's (the
    /// protection the tests switch off to show it matters).
    #[doc(hidden)]
    pub unconfined_results: bool,
}

impl MakeExecutor for Settings {
    fn make(&self, parts: ExecutorParts) -> EResult<Arc<dyn Executor>> {
        if let Some(src) = parts.session.source() {
            // A re-judge takes its rollouts from its source run, effect by
            // effect; a worker has no source run to take them from.
            return Err(EngineError::Invalid(format!(
                "run {} re-judges run {}: it takes its rollouts from that run, in this process; continue it without --workers",
                parts.session.run(),
                src.run
            )));
        }
        Ok(Arc::new(Workers::start(self.clone(), parts)?))
    }
}

/// A request to the pump: publish this item and answer with its result.
struct Ask {
    job: String,
    bytes: Vec<u8>,
    /// Objects the item reads that the store must hold first.
    needs: Vec<Id>,
    /// Where its result's streams go in this ledger, checked: only under
    /// the item's stream.
    stream: String,
    kind: &'static str,
    /// What the item's record must say.
    expect: Expect,
    reply: tokio::sync::oneshot::Sender<Result<WorkResult>>,
}

/// What a result's record must say to be the item's: a rollout's task,
/// purpose, cycle and index; a judgment's task, runs, order and judge.
#[derive(Debug, Clone)]
pub enum Expect {
    Rollout {
        task: String,
        purpose: String,
        cycle: u32,
        index: u32,
    },
    Judgment {
        task: String,
        a: Id,
        b: Id,
        swapped: bool,
        judge_model: String,
    },
}

impl Expect {
    fn of(work: &wire::Work) -> Result<Expect> {
        Ok(match work {
            wire::Work::Rollout(r) => Expect::Rollout {
                task: r.task.clone(),
                purpose: r.purpose.clone(),
                cycle: r.cycle,
                index: r.index,
            },
            wire::Work::Judgment(j) => Expect::Judgment {
                task: j.task.clone(),
                a: wire::id_of("item", &j.a)?,
                b: wire::id_of("item", &j.b)?,
                swapped: j.swapped,
                judge_model: j.judge.model.clone(),
            },
        })
    }

    /// Whether `env`, the record a result names, is this item's.
    fn check(&self, env: &ledger::EventEnvelope) -> std::result::Result<(), String> {
        let same = match self {
            Expect::Rollout {
                task,
                purpose,
                cycle,
                index,
            } => {
                let r: schemas::Rollout = schemas::decode(&env.kind, env.version, &env.payload)
                    .map_err(|e| e.to_string())?;
                r.task == *task && r.purpose == *purpose && r.cycle == *cycle && r.index == *index
            }
            Expect::Judgment {
                task,
                a,
                b,
                swapped,
                judge_model,
            } => {
                let j: Judgment = schemas::decode(&env.kind, env.version, &env.payload)
                    .map_err(|e| e.to_string())?;
                j.task == *task
                    && j.a.0 == a.0
                    && j.b.0 == b.0
                    && j.swapped == *swapped
                    && j.judge_model == *judge_model
            }
        };
        if same {
            Ok(())
        } else {
            Err(format!("its record is not this item's (expected {self:?})"))
        }
    }
}

/// Work items executed by workers through the store.
pub struct Workers {
    inproc: Arc<InProcess>,
    session: Session,
    backends: Backends,
    suite: Id,
    max_attempts: u32,
    pump: Mutex<mpsc::Sender<Ask>>,
    record: Arc<Mutex<()>>,
}

impl Workers {
    pub fn start(s: Settings, parts: ExecutorParts) -> Result<Workers> {
        let remote = remote::Remote::open(&s.url, s.cache.as_deref())?;
        remote.ensure_marker()?;
        let (tx, rx) = mpsc::channel();
        let (ledger, run) = (
            parts.session.ledger().clone(),
            parts.session.run().to_string(),
        );
        let settings = s.clone();
        std::thread::Builder::new()
            .name("mass-work-pump".into())
            .spawn(move || Pump::new(remote, ledger, run, settings).run(rx))
            .map_err(|e| WorkError::Io {
                context: "cannot start the work pump".into(),
                source: e,
            })?;
        Ok(Workers {
            inproc: Arc::new(InProcess::new(
                parts.session.clone(),
                parts.backends.clone(),
                parts.tasks,
            )),
            session: parts.session,
            backends: parts.backends,
            suite: parts.suite,
            max_attempts: s.max_attempts.max(1),
            pump: Mutex::new(tx),
            record: Arc::new(Mutex::new(())),
        })
    }

    /// Whether this ledger already holds any stream of the item (then it
    /// runs in process: replayed from the ledger, or continued).
    fn has_local(&self, stream: &str) -> EResult<bool> {
        let name = self.session.ref_name(stream);
        let under = format!("{name}/");
        Ok(self
            .session
            .ledger()
            .refs()?
            .iter()
            .any(|(n, _)| *n == name || n.starts_with(&under)))
    }

    fn context(&self) -> Context {
        let adapters = self
            .backends
            .adapters()
            .into_iter()
            .map(|(backend, model, a)| match a {
                Adapter::Params(bytes) => AdapterWire {
                    backend,
                    model,
                    form: "params".into(),
                    id: Id::of(ObjectKind::Blob, &bytes).to_hex(),
                },
                Adapter::Dir { tree, .. } => AdapterWire {
                    backend,
                    model,
                    form: "dir".into(),
                    id: tree.to_hex(),
                },
            })
            .collect();
        Context {
            suite: self.suite.to_hex(),
            backends: self.backends.config(),
            adapters,
        }
    }

    /// Publishes `work` and waits for its result (already pulled in).
    fn ask(
        &self,
        work: wire::Work,
        needs: Vec<Id>,
    ) -> Result<(String, tokio::sync::oneshot::Receiver<Result<WorkResult>>)> {
        let ctx = self.context();
        let mut needs = needs;
        needs.push(self.suite);
        for a in &ctx.adapters {
            needs.push(wire::id_of("adapter", &a.id)?);
        }
        let stream = work.stream().to_string();
        let kind = work.kind();
        let expect = Expect::of(&work)?;
        let env = Envelope {
            format: wire::ITEM_FORMAT.into(),
            work,
            context: ctx,
            max_attempts: self.max_attempts,
        };
        let (bytes, job) = env.encode()?;
        let (reply, rx) = tokio::sync::oneshot::channel();
        let ask = Ask {
            job: job.clone(),
            bytes,
            needs,
            stream,
            kind,
            expect,
            reply,
        };
        let sent = self
            .pump
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(ask);
        if sent.is_err() {
            return Err(WorkError::Engine(EngineError::Infrastructure {
                what: "the work pump".into(),
                detail: "it has stopped (the store was unreachable for too long)".into(),
            }));
        }
        Ok((job, rx))
    }
}

/// Appends the `mass.work` record of `job` to the run's `workers` stream.
fn record_work(
    session: &Session,
    lock: &Mutex<()>,
    job: &str,
    kind: &str,
    stream: &str,
    r: &WorkResult,
    result: Id,
) -> EResult<()> {
    let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
    let rec = schemas::WorkResult {
        item: Hash32(wire::id_of("result", job).map(|i| i.0).unwrap_or([0; 32])),
        kind: kind.into(),
        stream: stream.into(),
        worker: r.worker.clone(),
        attempt: r.attempt,
        outcome: r.outcome.clone(),
        attempts: r.attempts.clone(),
        result: Hash32(result.0),
    };
    let l = session.ledger();
    let name = session.ref_name(WORKERS_STREAM);
    engine::exec::ledger(|| {
        let prev = l.head(&name)?;
        l.append(
            &name,
            prev,
            schemas::to_event(&rec)?.in_stream(WORKERS_STREAM),
        )?;
        Ok::<_, EngineError>(())
    })
}

async fn wait(rx: tokio::sync::oneshot::Receiver<Result<WorkResult>>) -> EResult<WorkResult> {
    match rx.await {
        Ok(r) => Ok(r?),
        Err(_) => Err(EngineError::Infrastructure {
            what: "waiting for a work item".into(),
            detail: "the work pump stopped".into(),
        }),
    }
}

/// Why the item was never executed, as recorded in the run (and hashed
/// into it): the number of failed attempts only; which worker failed how
/// is in the `mass.work` record, beside the steps.
fn failure(r: &WorkResult) -> String {
    format!(
        "failed on every attempt ({}); the causes are in the run's `workers` stream",
        r.attempt
    )
}

impl Executor for Workers {
    fn rollout(&self, item: RolloutItem) -> Work<engine::judge::RunRef> {
        match self.has_local(&item.stream) {
            Ok(true) => return self.inproc.rollout(item),
            Ok(false) => {}
            Err(e) => return Box::pin(async move { Err(e) }),
        }
        let asked = self.ask(
            wire::Work::Rollout(Box::new(wire::RolloutWire::of(&item))),
            Vec::new(),
        );
        let (session, inproc, lock) = (
            self.session.clone(),
            self.inproc.clone(),
            self.record.clone(),
        );
        Box::pin(async move {
            let (job, rx) = asked?;
            let r = wait(rx).await?;
            let rr = if r.outcome == "done" {
                let ev = wire::id_of(&wire::result_key(&job), &r.event)?;
                engine::work::run_ref_of(session.ledger(), ev)?
            } else {
                inproc.fail_rollout(item.clone(), failure(&r)).await?
            };
            record_work(&session, &lock, &job, "rollout", &item.stream, &r, rr.event)?;
            Ok(rr)
        })
    }

    fn judgment(&self, item: JudgmentItem) -> Work<(Id, Judgment)> {
        match self.has_local(&item.stream) {
            Ok(true) => return self.inproc.judgment(item),
            Ok(false) => {}
            Err(e) => return Box::pin(async move { Err(e) }),
        }
        let needs = vec![item.a.event, item.b.event];
        let asked = self.ask(
            wire::Work::Judgment(Box::new(wire::JudgmentWire::of(&item))),
            needs,
        );
        let (session, inproc, lock) = (
            self.session.clone(),
            self.inproc.clone(),
            self.record.clone(),
        );
        Box::pin(async move {
            let (job, rx) = asked?;
            let r = wait(rx).await?;
            let out = if r.outcome == "done" {
                let ev = wire::id_of(&wire::result_key(&job), &r.event)?;
                engine::work::judgment_of(session.ledger(), ev)?
            } else {
                inproc.fail_judgment(&item, failure(&r))?
            };
            record_work(&session, &lock, &job, "judgment", &item.stream, &r, out.0)?;
            Ok(out)
        })
    }
}

/// The thread that talks to the store for the coordinator.
struct Pump {
    remote: remote::Remote,
    ledger: Arc<Ledger>,
    run: String,
    s: Settings,
    waiting: HashMap<String, Vec<Ask>>,
    down_since: Option<(Instant, String)>,
    /// When `work/refused` was last listed.
    refusals_seen: Instant,
}

impl Pump {
    fn new(remote: remote::Remote, ledger: Arc<Ledger>, run: String, s: Settings) -> Pump {
        Pump {
            remote,
            ledger,
            run,
            s,
            waiting: HashMap::new(),
            down_since: None,
            refusals_seen: Instant::now() - Duration::from_secs(60),
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Ask>) {
        let mut backoff = self.s.poll;
        let mut fresh: Vec<Ask> = Vec::new();
        loop {
            match rx.recv_timeout(backoff) {
                Ok(a) => fresh.push(a),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) if self.waiting.is_empty() => return,
                Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(backoff),
            }
            fresh.extend(rx.try_iter());
            let step = self.publish(&mut fresh).and_then(|()| self.collect());
            match step {
                Ok(()) => {
                    self.down_since = None;
                    backoff = self.s.poll;
                }
                Err(e) if is_store_error(&e) => {
                    let since = self
                        .down_since
                        .get_or_insert_with(|| (Instant::now(), String::new()));
                    since.1 = e.to_string();
                    if since.0.elapsed() >= self.s.patience {
                        self.give_up(fresh, rx);
                        return;
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => self.fail_all_fresh(&mut fresh, &e),
            }
        }
    }

    /// Uploads what new items read, then publishes them.
    fn publish(&mut self, fresh: &mut Vec<Ask>) -> Result<()> {
        if fresh.is_empty() {
            return Ok(());
        }
        let mut heads: Vec<Id> = self
            .ledger
            .refs()?
            .into_iter()
            .filter(|(n, _)| remote::refs::in_run(&self.run, n))
            .map(|(_, id)| id)
            .collect();
        for a in fresh.iter() {
            heads.extend(a.needs.iter().copied());
        }
        heads.sort();
        heads.dedup();
        remote::push_objects(&self.ledger, &self.remote, &heads, &remote::Quiet)?;
        for a in fresh.iter() {
            let key = wire::item_key(&a.job);
            let store = self.remote.store();
            if store.create(&key, bytes::Bytes::from(a.bytes.clone()))? {
                continue;
            }
            // Published before (a resumed run): it must still be ours.
            let held = store.get(&key)?.map(|(b, _)| b);
            if held.as_deref() != Some(a.bytes.as_slice()) {
                return Err(WorkError::Publish {
                    job: a.job.clone(),
                    detail: format!(
                        "{key} on the store holds other bytes than this item (changed or damaged there); remove it, then `mass resume`"
                    ),
                });
            }
        }
        for a in fresh.drain(..) {
            self.waiting.entry(a.job.clone()).or_default().push(a);
        }
        Ok(())
    }

    /// Takes in every published result an item waits for.
    fn collect(&mut self) -> Result<()> {
        if self.waiting.is_empty() {
            return Ok(());
        }
        // Refusals are rare (another build, a damaged item): looked for
        // every 2 s, not on every poll.
        if self.refusals_seen.elapsed() >= Duration::from_secs(2) {
            self.refusals()?;
            self.refusals_seen = Instant::now();
        }
        let store = self.remote.store();
        let ready: Vec<String> = store
            .list("work/results")?
            .iter()
            .filter_map(|k| wire::job_of(k, "work/results"))
            .filter(|j| self.waiting.contains_key(j))
            .collect();
        for job in ready {
            let key = wire::result_key(&job);
            let Some((bytes, _)) = store.get(&key)? else {
                continue;
            };
            let asks = self.waiting.remove(&job).unwrap_or_default();
            let Some(first) = asks.first() else { continue };
            let landed =
                wire::parse::<WorkResult>(&key, &bytes).and_then(|r| self.land(&key, first, r));
            match landed {
                Err(e) if is_store_error(&e) => {
                    self.waiting.insert(job, asks);
                    return Err(e);
                }
                other => answer(asks, other),
            }
        }
        Ok(())
    }

    /// Waiting items a worker refused (it could not read them: changed on
    /// the store, or a build that reads another format) end with the
    /// worker's reason: the run stops rather than waiting for ever.
    fn refusals(&mut self) -> Result<()> {
        let keys = self.remote.store().list("work/refused")?;
        for key in keys {
            let Some(job) = key
                .strip_prefix("work/refused/")
                .and_then(|r| r.split('/').next())
                .map(str::to_string)
            else {
                continue;
            };
            if !self.waiting.contains_key(&job) {
                continue;
            }
            let Some((bytes, _)) = self.remote.store().get(&key)? else {
                continue;
            };
            let reason = wire::parse::<wire::Refusal>(&key, &bytes)
                .map(|r| format!("worker {} refused it: {}", r.worker, r.reason))
                .unwrap_or_else(|e| e.to_string());
            for a in self.waiting.remove(&job).unwrap_or_default() {
                let _ = a.reply.send(Err(WorkError::Publish {
                    job: job.clone(),
                    detail: format!(
                        "{reason}. Workers must run the same mass build as the coordinator; once fixed, remove {key} from the store and `mass resume`"
                    ),
                }));
            }
        }
        Ok(())
    }

    /// Checks a result and pulls its streams into the run: only under the
    /// item's stream, each head an event of the stream it is named for,
    /// the record the item's own.
    fn land(&self, key: &str, ask: &Ask, r: WorkResult) -> Result<WorkResult> {
        let (stream, kind) = (ask.stream.as_str(), ask.kind);
        if r.format != wire::RESULT_FORMAT || (r.outcome != "done" && r.outcome != "failed") {
            return Err(bad(
                key,
                format!("format {:?}, outcome {:?}", r.format, r.outcome),
            ));
        }
        if r.outcome == "failed" {
            return Ok(r);
        }
        let event = wire::id_of(key, &r.event)?;
        let record_stream = if kind == "rollout" {
            format!("{stream}/orch")
        } else {
            stream.to_string()
        };
        let mut heads = BTreeMap::new();
        for (rel, hex_id) in &r.heads {
            let inside = rel == stream || rel.starts_with(&format!("{stream}/"));
            if !inside && !self.s.unconfined_results {
                return Err(bad(
                    key,
                    format!("it names stream {rel}, outside the item's {stream}"),
                ));
            }
            heads.insert(replay::ref_name(&self.run, rel), wire::id_of(key, hex_id)?);
        }
        let record_ref = replay::ref_name(&self.run, &record_stream);
        if heads.get(&record_ref) != Some(&event) {
            return Err(bad(
                key,
                format!(
                    "its record {} is not the head of stream {record_stream}",
                    event.short(12)
                ),
            ));
        }
        let prefix = format!("{}/", self.run);
        let unconfined = self.s.unconfined_results;
        let check = |name: &str, env: &ledger::EventEnvelope| {
            let rel = name.strip_prefix(&prefix).unwrap_or(name);
            if env.stream != rel && !unconfined {
                return Err(format!("that event belongs to stream {}", env.stream));
            }
            if name == record_ref && !unconfined {
                ask.expect.check(env)?;
            }
            Ok(())
        };
        remote::pull_heads(
            &self.ledger,
            &self.remote,
            key,
            &heads,
            false,
            &check,
            &remote::Quiet,
        )?;
        Ok(r)
    }

    fn fail_all_fresh(&mut self, fresh: &mut Vec<Ask>, e: &WorkError) {
        for a in fresh.drain(..) {
            let _ = a.reply.send(Err(WorkError::Publish {
                job: a.job.clone(),
                detail: e.to_string(),
            }));
        }
    }

    fn give_up(mut self, fresh: Vec<Ask>, rx: mpsc::Receiver<Ask>) {
        let (since, last) = self
            .down_since
            .take()
            .unwrap_or((Instant::now(), String::new()));
        let location = self.remote.location().to_string();
        let down = || WorkError::StoreDown {
            location: location.clone(),
            secs: since.elapsed().as_secs(),
            last: last.clone(),
        };
        let all = fresh
            .into_iter()
            .chain(self.waiting.drain().flat_map(|(_, v)| v))
            .chain(rx.try_iter());
        for a in all {
            let _ = a.reply.send(Err(down()));
        }
    }
}

fn answer(asks: Vec<Ask>, landed: Result<WorkResult>) {
    match landed {
        Ok(r) => {
            for a in asks {
                let _ = a.reply.send(Ok(r.clone()));
            }
        }
        Err(e) => {
            let detail = e.to_string();
            for a in asks {
                let _ = a.reply.send(Err(WorkError::Refused {
                    job: a.job.clone(),
                    detail: detail.clone(),
                }));
            }
        }
    }
}

fn bad(key: &str, detail: String) -> WorkError {
    WorkError::Format {
        key: key.to_string(),
        detail,
    }
}

/// A failure of the store itself (retried), not of what it holds.
fn is_store_error(e: &WorkError) -> bool {
    matches!(
        e,
        WorkError::Remote(remote::RemoteError::Store { .. } | remote::RemoteError::Io { .. })
    )
}
