//! `mass worker URL`: claims work items on the store, executes each exactly
//! as the coordinator's in-process executor would (the engine's
//! `InProcess`, the same harness, sandbox, checks and guards), pushes what
//! it recorded and publishes a result, then takes the next.
//!
//! Each item is recorded into a scratch ledger of its own, partial, whose
//! missing objects (the task suite, trained adapters, the workspaces a
//! judgment compares) are fetched from the store when read; it is removed
//! once the item's result is published or discarded. Event ids carry no run
//! name, so what a worker records has the ids the coordinator's own
//! recording would have. A lease the worker cannot renew (another took the
//! item, or the store is unreachable for the lease's length) stops the
//! item and discards its work.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::backend::Backends;
use engine::task::Task;
use engine::work::{Executor, InProcess};
use ledger::{Id, Ledger};
use remote::{Remote, Store};

use crate::error::{Result, WorkError};
use crate::lease::{self, Lease, Take, Watch};
use crate::wire::{self, Context, Envelope, Work, WorkResult, WorkerBeat};

/// How a worker runs.
#[derive(Clone)]
pub struct Options {
    pub url: String,
    /// Shown in claims, attempts and results.
    pub name: String,
    /// Items executed at once.
    pub slots: u32,
    /// The lease's length: renewed every third of it.
    pub lease: Duration,
    /// How often the store is looked at for new items.
    pub poll: Duration,
    /// Stop after this long with nothing to do (`None`: never).
    pub idle_exit: Option<Duration>,
}

/// What a worker did.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub done: u64,
    pub failed: u64,
    pub discarded: u64,
    pub duplicates: u64,
}

/// Backends and tasks built for one context (kept while the worker runs:
/// items of a cycle share it).
struct Prepared {
    _suite: engine::suite::SuiteCheckout,
    backends: Backends,
    tasks: Vec<Task>,
}

struct Running {
    lease: Lease,
    env: Envelope,
    item: ItemLedger,
    handle: tokio::task::JoinHandle<engine::error::Result<Id>>,
    lost: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

/// An item's scratch ledger (removed with it).
struct ItemLedger {
    _dir: tempfile::TempDir,
    ledger: Arc<Ledger>,
}

/// The run name a worker records an item under (any name gives the same
/// ids: envelopes carry stream names relative to their run).
const RUN: &str = "work";

pub struct Worker {
    opts: Options,
    remote: Remote,
    cache: tempfile::TempDir,
    prepared: HashMap<String, Arc<Prepared>>,
    watch: Watch,
    /// Items refused as damaged or foreign (not looked at again).
    refused: BTreeSet<String>,
    stats: Stats,
    beat: Option<remote::Version>,
    log: Box<dyn Fn(&str) + Send>,
}

impl Worker {
    pub fn new(opts: Options, log: Box<dyn Fn(&str) + Send>) -> Result<Worker> {
        let cache = tempfile::Builder::new()
            .prefix("mass-worker-")
            .tempdir()
            .map_err(|e| io("cannot make the worker's cache directory", e))?;
        let remote = Remote::open(&opts.url, Some(cache.path()))?;
        // The store is a remote like any (packs, indexes): marked as one by
        // whoever comes first, coordinator or worker.
        remote.ensure_marker()?;
        Ok(Worker {
            opts,
            remote,
            cache,
            prepared: HashMap::new(),
            watch: Watch::default(),
            refused: BTreeSet::new(),
            stats: Stats::default(),
            beat: None,
            log,
        })
    }

    fn store(&self) -> &Store {
        self.remote.store()
    }

    /// Claims and executes items until idle for `idle_exit` (or forever).
    pub fn run(&mut self) -> Result<Stats> {
        let mut running: Vec<Running> = Vec::new();
        let mut idle_since = Instant::now();
        let mut backoff = self.opts.poll;
        let mut last_beat = Instant::now() - Duration::from_secs(60);
        loop {
            match self.round(&mut running, &mut last_beat) {
                Ok(busy) => {
                    backoff = self.opts.poll;
                    if busy || !running.is_empty() {
                        idle_since = Instant::now();
                    }
                }
                Err(e) => {
                    (self.log)(&format!(
                        "store error (retrying in {} ms): {e}",
                        backoff.as_millis()
                    ));
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
            if let Some(limit) = self.opts.idle_exit {
                if running.is_empty() && idle_since.elapsed() >= limit {
                    return Ok(self.stats.clone());
                }
            }
            std::thread::sleep(backoff);
        }
    }

    /// One look at the store: finished items published, new ones claimed.
    fn round(&mut self, running: &mut Vec<Running>, last_beat: &mut Instant) -> Result<bool> {
        self.reap(running)?;
        if last_beat.elapsed() >= Duration::from_secs(2) {
            self.heartbeat(running)?;
            *last_beat = Instant::now();
        }
        let free = self.opts.slots as usize - running.len().min(self.opts.slots as usize);
        if free == 0 {
            return Ok(true);
        }
        let mine: BTreeSet<String> = running.iter().map(|r| r.lease.job.clone()).collect();
        let open = self.open_items(&mine)?;
        let busy = !open.is_empty();
        for job in open {
            if running.len() >= self.opts.slots as usize {
                break;
            }
            match self.take(&job) {
                Ok(Some(r)) => running.push(r),
                Ok(None) => {}
                // A damaged or foreign item is refused, once, and skipped;
                // the store failing is the round's error (retried).
                Err(WorkError::Format { key, detail }) => {
                    (self.log)(&format!("refused {key}: {detail}"));
                    self.refused.insert(job);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(busy)
    }

    /// Items without a result that this worker is not running, in an
    /// order of this worker's own (so workers start on different items).
    fn open_items(&self, mine: &BTreeSet<String>) -> Result<Vec<String>> {
        let done: BTreeSet<String> = self
            .store()
            .list("work/results")?
            .iter()
            .filter_map(|k| wire::job_of(k, "work/results"))
            .collect();
        let mut open: Vec<String> = self
            .store()
            .list("work/items")?
            .iter()
            .filter_map(|k| wire::job_of(k, "work/items"))
            .filter(|j| !done.contains(j) && !mine.contains(j) && !self.refused.contains(j))
            .collect();
        let me = self.opts.name.clone();
        open.sort_by_cached_key(|j| blake3::hash(format!("{me}/{j}").as_bytes()).to_hex());
        Ok(open)
    }

    /// Claims `job` and starts it; `None` when someone else has it.
    fn take(&mut self, job: &str) -> Result<Option<Running>> {
        let env = match self.store().get(&wire::item_key(job))? {
            Some((bytes, _)) => Envelope::decode(job, &bytes)?,
            None => return Ok(None),
        };
        let max = env.max_attempts.max(1);
        let lease = match lease::try_claim(
            self.remote.store(),
            job,
            &self.opts.name,
            self.opts.lease,
            max,
            &mut self.watch,
        )? {
            Take::Mine(l) => l,
            Take::Busy => return Ok(None),
            Take::Given(lines) => {
                (self.log)(&format!(
                    "item {} ({}) given up after {} failed attempt(s)",
                    &job[..12],
                    env.work.stream(),
                    lines.len()
                ));
                return Ok(None);
            }
        };
        (self.log)(&format!(
            "item {} ({} {}), attempt {}",
            &job[..12],
            env.work.kind(),
            env.work.stream(),
            lease.claim.attempt
        ));
        match self.start(&env) {
            Ok((item, handle)) => {
                (self.log)(&format!("item {}: started", &job[..12]));
                Ok(Some(self.watch_lease(lease, env, item, handle)))
            }
            Err(e) => {
                self.stats.failed += 1;
                lease::fail(self.store(), &lease, &e.to_string(), max)?;
                (self.log)(&format!("item {}: could not start: {e}", &job[..12]));
                Ok(None)
            }
        }
    }

    /// Starts the lease's renewals beside the running item.
    fn watch_lease(
        &self,
        lease: Lease,
        env: Envelope,
        item: ItemLedger,
        handle: tokio::task::JoinHandle<engine::error::Result<Id>>,
    ) -> Running {
        let lost = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (url, ttl) = (self.opts.url.clone(), self.opts.lease);
        let (mut held, l, s) = (lease.clone(), lost.clone(), stop.clone());
        std::thread::spawn(move || renew_loop(&url, ttl, &mut held, &l, &s));
        Running {
            lease,
            env,
            item,
            handle,
            lost,
            stop,
        }
    }

    /// Builds what `env` needs and spawns its execution.
    #[allow(clippy::type_complexity)]
    fn start(
        &mut self,
        env: &Envelope,
    ) -> Result<(
        ItemLedger,
        tokio::task::JoinHandle<engine::error::Result<Id>>,
    )> {
        test_poison(env)?;
        let prepared = self.prepare(&env.context)?;
        let item = self.item_ledger()?;
        let session = replay::Session::new(item.ledger.clone(), RUN, replay::Mode::Live)
            .map_err(engine::error::EngineError::from)?;
        let exec = InProcess::new(
            session.clone(),
            prepared.backends.clone(),
            prepared.tasks.clone(),
        );
        let rt = engine::exec::runtime()?;
        let handle = match &env.work {
            Work::Rollout(r) => {
                session.set_seed(r.seed);
                let fut = exec.rollout(r.item());
                rt.spawn(async move {
                    test_delay().await;
                    fut.await.map(|rr| rr.event)
                })
            }
            Work::Judgment(j) => {
                session.set_seed(j.seed);
                let item_job = self.judgment_item(&item.ledger, j)?;
                let fut = exec.judgment(item_job);
                rt.spawn(async move {
                    test_delay().await;
                    fut.await.map(|(id, _)| id)
                })
            }
        };
        Ok((item, handle))
    }

    /// The judgment item, with the two runs pulled (their events; the
    /// workspaces come when read).
    fn judgment_item(
        &self,
        ledger: &Ledger,
        j: &wire::JudgmentWire,
    ) -> Result<engine::work::JudgmentItem> {
        let (a, b) = (wire::id_of("item", &j.a)?, wire::id_of("item", &j.b)?);
        let heads = BTreeMap::from([("inputs/a".to_string(), a), ("inputs/b".to_string(), b)]);
        remote::pull_heads(
            ledger,
            &self.remote,
            "work item",
            &heads,
            true,
            &remote::Quiet,
        )?;
        Ok(engine::work::JudgmentItem {
            task: j.task.clone(),
            stream: j.stream.clone(),
            a: engine::work::run_ref_of(ledger, a)?,
            b: engine::work::run_ref_of(ledger, b)?,
            swapped: j.swapped,
            judge: j.judge.clone(),
            max_retries: j.max_retries,
            sampling: j.sampling.clone(),
            seed: j.seed,
            shown: j.shown,
        })
    }

    fn item_ledger(&self) -> Result<ItemLedger> {
        let dir = tempfile::Builder::new()
            .prefix("mass-work-item-")
            .tempdir()
            .map_err(|e| io("cannot make an item's scratch ledger", e))?;
        let ledger = Ledger::init(dir.path())?;
        ledger.set_promisor(Arc::new(remote::Fetcher::new(
            &self.opts.url,
            Some(self.cache.path().to_path_buf()),
        )));
        Ok(ItemLedger {
            _dir: dir,
            ledger: Arc::new(ledger),
        })
    }

    /// The backends and tasks of `ctx`, built once.
    fn prepare(&mut self, ctx: &Context) -> Result<Arc<Prepared>> {
        let key = blake3::hash(&serde_json::to_vec(ctx).unwrap_or_default())
            .to_hex()
            .to_string();
        if let Some(p) = self.prepared.get(&key) {
            return Ok(p.clone());
        }
        let scratch = self.item_ledger()?;
        let l = &scratch.ledger;
        let suite = engine::suite::checkout(l, wire::id_of("context", &ctx.suite)?, RUN)?;
        let tasks =
            engine::task::load_suite(suite.path()).map_err(engine::error::EngineError::from)?;
        let backends = Backends::build(&ctx.backends, suite.path())
            .map_err(|e| engine::error::EngineError::Invalid(e.to_string()))?;
        for a in &ctx.adapters {
            let id = wire::id_of("context", &a.id)?;
            let done = if a.form == "params" {
                backends.register_adapter(&a.backend, &a.model, &l.get_blob(&id)?)
            } else {
                let dir = engine::backend::checkout_adapter(l, &id)?;
                backends.register_adapter_dir(&a.backend, &a.model, &dir, id)
            };
            done.map_err(engine::error::EngineError::from)?;
        }
        let p = Arc::new(Prepared {
            _suite: suite,
            backends,
            tasks,
        });
        self.prepared.insert(key, p.clone());
        Ok(p)
    }

    /// Publishes finished items; discards those whose lease was lost.
    fn reap(&mut self, running: &mut Vec<Running>) -> Result<()> {
        let mut i = 0;
        while i < running.len() {
            let r = &running[i];
            if r.lost.load(Ordering::SeqCst) {
                let r = running.swap_remove(i);
                r.handle.abort();
                r.stop.store(true, Ordering::SeqCst);
                self.stats.discarded += 1;
                (self.log)(&format!(
                    "item {}: lease lost (another worker has it, or the store was unreachable for {} ms): stopped, its work discarded",
                    &r.lease.job[..12],
                    self.opts.lease.as_millis()
                ));
                continue;
            }
            if !r.handle.is_finished() {
                i += 1;
                continue;
            }
            let r = running.swap_remove(i);
            r.stop.store(true, Ordering::SeqCst);
            let out = engine::exec::block_on(r.handle)?;
            if let Err(e) = self.finish(&r.lease, &r.env, &r.item, out) {
                // Not published: the lease (no longer renewed) expires and
                // another worker executes the item.
                self.stats.discarded += 1;
                (self.log)(&format!(
                    "item {}: could not publish its result ({e}): its work is discarded and its lease left to expire",
                    &r.lease.job[..12]
                ));
            }
        }
        Ok(())
    }

    /// Pushes a finished item's records and publishes its result, or
    /// records the failed attempt.
    fn finish(
        &mut self,
        lease: &Lease,
        env: &Envelope,
        item: &ItemLedger,
        out: std::result::Result<engine::error::Result<Id>, tokio::task::JoinError>,
    ) -> Result<()> {
        let job = &lease.job;
        let event = match out {
            Ok(Ok(ev)) => ev,
            Ok(Err(e)) => return self.failed(lease, env, &e.to_string()),
            Err(e) => return self.failed(lease, env, &format!("the item's task ended: {e}")),
        };
        let heads = recorded_heads(&item.ledger)?;
        let ids: Vec<Id> = heads.values().copied().collect();
        remote::push_objects(&item.ledger, &self.remote, &ids, &remote::Quiet)?;
        let result = WorkResult {
            format: wire::RESULT_FORMAT.into(),
            worker: self.opts.name.clone(),
            attempt: lease.claim.attempt,
            outcome: "done".into(),
            heads: heads.iter().map(|(k, v)| (k.clone(), v.to_hex())).collect(),
            event: event.to_hex(),
            attempts: lease::attempts(self.store(), job)?,
        };
        if self
            .store()
            .create(&wire::result_key(job), wire::to_bytes(&result))?
        {
            self.stats.done += 1;
            (self.log)(&format!("item {}: done", &job[..12]));
        } else {
            self.stats.duplicates += 1;
            (self.log)(&format!(
                "item {}: a result was already published (executed twice: a worker thought dead finished); this execution's is discarded",
                &job[..12]
            ));
        }
        Ok(())
    }

    fn failed(&mut self, lease: &Lease, env: &Envelope, cause: &str) -> Result<()> {
        self.stats.failed += 1;
        (self.log)(&format!(
            "item {} ({}): attempt {} failed: {cause}",
            &lease.job[..12],
            env.work.stream(),
            lease.claim.attempt
        ));
        lease::fail(self.store(), lease, cause, env.max_attempts.max(1))
    }

    fn heartbeat(&mut self, running: &[Running]) -> Result<()> {
        let beat = WorkerBeat {
            format: wire::WORKER_FORMAT.into(),
            worker: self.opts.name.clone(),
            slots: self.opts.slots,
            at_ms: wire::now_ms(),
            running: running.iter().map(|r| r.lease.job.clone()).collect(),
            done: self.stats.done,
            failed: self.stats.failed,
            duplicates: self.stats.duplicates,
        };
        let key = wire::worker_key(&self.opts.name);
        if !self
            .store()
            .swap(&key, wire::to_bytes(&beat), self.beat.as_ref())?
        {
            // First beat over an earlier process's, or a lost version.
            self.beat = self.store().get(&key)?.map(|(_, v)| v);
            self.store()
                .swap(&key, wire::to_bytes(&beat), self.beat.as_ref())?;
        }
        self.beat = self.store().get(&key)?.map(|(_, v)| v);
        Ok(())
    }
}

/// Executes the item published as `job` once more, outside any claim, and
/// publishes its result (`false`: one was there already and this one is
/// discarded). What a worker thought dead does when it finishes after all;
/// tests use it to execute an item twice.
pub fn execute_unclaimed(opts: Options, job: &str) -> Result<bool> {
    let mut w = Worker::new(opts, Box::new(|_| {}))?;
    let env = match w.store().get(&wire::item_key(job))? {
        Some((bytes, _)) => Envelope::decode(job, &bytes)?,
        None => {
            return Err(WorkError::Format {
                key: wire::item_key(job),
                detail: "no such item".into(),
            })
        }
    };
    let (item, handle) = w.start(&env)?;
    let out = engine::exec::block_on(handle)?;
    let lease = Lease {
        job: job.to_string(),
        claim: wire::Claim {
            format: wire::CLAIM_FORMAT.into(),
            worker: w.opts.name.clone(),
            attempt: 0,
            beat: 0,
            ttl_ms: 0,
            released: false,
        },
        version: remote::Version::default(),
    };
    let before = w.stats.done;
    w.finish(&lease, &env, &item, out)?;
    Ok(w.stats.done > before)
}

/// Every stream the item recorded (relative name to head).
fn recorded_heads(ledger: &Ledger) -> Result<BTreeMap<String, Id>> {
    let prefix = format!("{RUN}/");
    Ok(ledger
        .refs()?
        .into_iter()
        .filter_map(|(n, id)| n.strip_prefix(&prefix).map(|r| (r.to_string(), id)))
        .collect())
}

/// Renews `lease` every third of `ttl` until `stop`; sets `lost` when it
/// cannot (moved by another worker, or no successful renewal for `ttl`).
fn renew_loop(url: &str, ttl: Duration, lease: &mut Lease, lost: &AtomicBool, stop: &AtomicBool) {
    let store = Store::open(url).ok();
    let mut last_ok = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(ttl / 6);
        if stop.load(Ordering::SeqCst) {
            return;
        }
        if last_ok.elapsed() < ttl / 3 {
            continue;
        }
        match store.as_ref().map(|s| lease::renew(s, lease)) {
            Some(Ok(true)) => last_ok = Instant::now(),
            Some(Ok(false)) => {
                lost.store(true, Ordering::SeqCst);
                return;
            }
            _ if last_ok.elapsed() >= ttl => {
                lost.store(true, Ordering::SeqCst);
                return;
            }
            _ => {}
        }
    }
}

/// Test-only: `MASS_WORKER_TEST_ITEM_DELAY_MS=N` makes every item wait N ms
/// before it starts (an item long enough for a lease to matter).
async fn test_delay() {
    let ms = std::env::var("MASS_WORKER_TEST_ITEM_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// Test-only: `MASS_WORKER_TEST_FAIL_TASK=ID` makes every item of task ID
/// fail on this worker (a poison item: one that fails wherever it runs).
fn test_poison(env: &Envelope) -> Result<()> {
    let Ok(task) = std::env::var("MASS_WORKER_TEST_FAIL_TASK") else {
        return Ok(());
    };
    let named = match &env.work {
        Work::Rollout(r) => r.task == task,
        Work::Judgment(j) => j.task == task,
    };
    if named {
        return Err(WorkError::Engine(engine::error::EngineError::Invalid(
            format!("task {task} fails on this worker (MASS_WORKER_TEST_FAIL_TASK)"),
        )));
    }
    Ok(())
}

fn io(context: &str, source: std::io::Error) -> WorkError {
    WorkError::Io {
        context: context.into(),
        source,
    }
}
