//! `mass worker URL`: claims work items on the store, executes each exactly
//! as the coordinator's in-process executor would ([`crate::execute`]),
//! pushes what it recorded and publishes a result, then takes the next.
//!
//! A lease the worker cannot renew (another took the item, or the store was
//! unreachable for the lease's length) stops the item and discards its
//! work. An item's own failure is an attempt that counts; a failure of this
//! machine or of a server it needs (an infrastructure failure) is recorded,
//! does not count, and makes the worker pause before it claims again, with
//! a growing pause. A worker told to stop (SIGINT, SIGTERM) stops its items
//! and releases them at once, without counting.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::error::EngineError;
use ledger::Id;
use remote::{Remote, Store};

use crate::error::{Result, WorkError};
use crate::execute::{self, Handle, ItemLedger, Scratch};
use crate::lease::{self, Claimant, Lease, Take, Watch};
use crate::wire::{self, Envelope, Refusal, WorkResult, WorkerBeat};

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
    /// Set (by a signal handler) to stop: running items are released.
    pub stop: Option<&'static AtomicBool>,
}

/// What a worker did.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub done: u64,
    pub failed: u64,
    pub discarded: u64,
    pub duplicates: u64,
}

struct Running {
    lease: Arc<Mutex<Lease>>,
    job: String,
    env: Envelope,
    item: ItemLedger,
    handle: Handle,
    lost: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Running {
    fn lease(&self) -> Lease {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The longest pause after infrastructure failures.
const MAX_PAUSE: Duration = Duration::from_secs(60);

pub struct Worker {
    opts: Options,
    me: Claimant,
    remote: Remote,
    scratch: Scratch,
    watch: Watch,
    /// Items refused as damaged or foreign (not looked at again).
    refused: BTreeSet<String>,
    stats: Stats,
    beat: Option<remote::Version>,
    /// No claims before this (after an infrastructure failure), and the
    /// next pause.
    paused_until: Option<Instant>,
    pause: Duration,
    log: Box<dyn Fn(&str) + Send>,
}

impl Worker {
    pub fn new(opts: Options, log: Box<dyn Fn(&str) + Send>) -> Result<Worker> {
        let scratch = Scratch::new()?;
        let remote = Remote::open(&opts.url, Some(&scratch.index_cache()))?;
        // The store is a remote like any (packs, indexes): marked as one by
        // whoever comes first, coordinator or worker.
        remote.ensure_marker()?;
        let me = Claimant {
            name: opts.name.clone(),
            nonce: nonce(),
            ttl: opts.lease,
            max_attempts: 1,
        };
        Ok(Worker {
            opts,
            me,
            remote,
            scratch,
            watch: Watch::default(),
            refused: BTreeSet::new(),
            stats: Stats::default(),
            beat: None,
            paused_until: None,
            pause: Duration::from_secs(1),
            log,
        })
    }

    fn store(&self) -> &Store {
        self.remote.store()
    }

    fn paused(&self) -> bool {
        self.paused_until.is_some_and(|t| Instant::now() < t)
    }

    fn stopping(&self) -> bool {
        self.opts.stop.is_some_and(|s| s.load(Ordering::SeqCst))
    }

    /// Claims and executes items until idle for `idle_exit`, or stopped.
    pub fn run(&mut self) -> Result<Stats> {
        let mut running: Vec<Running> = Vec::new();
        let mut idle_since = Instant::now();
        let mut backoff = self.opts.poll;
        let mut last_beat = Instant::now() - Duration::from_secs(60);
        loop {
            if self.stopping() {
                self.release_all(running);
                return Ok(self.stats.clone());
            }
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

    /// Stops every running item and lets it go to another worker.
    fn release_all(&mut self, running: Vec<Running>) {
        for r in running {
            r.handle.abort();
            r.stop.store(true, Ordering::SeqCst);
            let l = r.lease();
            let cause = "the worker was stopped (SIGINT or SIGTERM)";
            let _ = lease::fail(self.store(), &l, cause, false, 1);
            (self.log)(&format!("item {}: stopped and released", short(&r.job)));
        }
    }

    /// One look at the store: finished items published, new ones claimed.
    fn round(&mut self, running: &mut Vec<Running>, last_beat: &mut Instant) -> Result<bool> {
        self.reap(running)?;
        if last_beat.elapsed() >= Duration::from_secs(2) {
            self.heartbeat(running)?;
            *last_beat = Instant::now();
        }
        let slots = self.opts.slots as usize;
        if running.len() >= slots || self.paused() {
            return Ok(true);
        }
        let mine: BTreeSet<String> = running.iter().map(|r| r.job.clone()).collect();
        let open = self.open_items(&mine)?;
        let busy = !open.is_empty();
        for job in open {
            if running.len() >= slots || self.paused() {
                break;
            }
            match self.take(&job) {
                Ok(Some(r)) => running.push(r),
                Ok(None) => {}
                // A damaged or foreign item is refused, once, and skipped;
                // the store failing is the round's error (retried).
                Err(WorkError::Format { key, detail }) => self.refuse(&job, &key, &detail)?,
                Err(e) => return Err(e),
            }
        }
        Ok(busy)
    }

    /// Says on the store why this worker cannot read item `job` (the
    /// coordinator stops on it and says what to do).
    fn refuse(&mut self, job: &str, key: &str, detail: &str) -> Result<()> {
        (self.log)(&format!("refused {key}: {detail}"));
        let r = Refusal {
            format: wire::REFUSAL_FORMAT.into(),
            worker: self.opts.name.clone(),
            reason: format!("{key}: {detail}"),
        };
        self.store()
            .create(&wire::refusal_key(job, &self.opts.name), wire::to_bytes(&r))?;
        self.refused.insert(job.to_string());
        Ok(())
    }

    /// Items without a result that this worker is not running, in an
    /// order of this worker's own (so workers start on different items).
    fn open_items(&mut self, mine: &BTreeSet<String>) -> Result<Vec<String>> {
        let done: BTreeSet<String> = self
            .store()
            .list("work/results")?
            .iter()
            .filter_map(|k| wire::job_of(k, "work/results"))
            .collect();
        self.watch.retain(|j| !done.contains(j));
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
        let me = Claimant {
            max_attempts: env.max_attempts.max(1),
            ..self.me.clone()
        };
        let lease = match lease::try_claim(self.remote.store(), job, &me, &mut self.watch)? {
            Take::Mine(l) => l,
            Take::Busy => return Ok(None),
            Take::Given(lines) => {
                (self.log)(&format!(
                    "item {} ({}) given up: {}",
                    short(job),
                    env.work.stream(),
                    lines.join("; ")
                ));
                return Ok(None);
            }
        };
        (self.log)(&format!(
            "item {} ({} {}), attempt {}",
            short(job),
            env.work.kind(),
            env.work.stream(),
            lease.claim.attempt
        ));
        match self.scratch.start(&self.remote, &self.opts.url, &env) {
            Ok((item, handle)) => {
                (self.log)(&format!("item {}: started", short(job)));
                Ok(Some(self.watch_lease(lease, env, item, handle)))
            }
            Err(e) => {
                // This machine could not set the item up: not the item's fault.
                let cause = format!("could not start on this worker: {e}");
                self.infrastructure(&lease, &cause)?;
                Ok(None)
            }
        }
    }

    /// Records a failure that is not the item's, releases the item and
    /// pauses this worker.
    fn infrastructure(&mut self, lease: &Lease, cause: &str) -> Result<()> {
        self.stats.failed += 1;
        (self.log)(&format!(
            "item {}: {cause}; released, not counted; pausing {} s before claiming again",
            short(&lease.job),
            self.pause.as_secs()
        ));
        self.paused_until = Some(Instant::now() + self.pause);
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        lease::fail(self.store(), lease, cause, false, 1)
    }

    /// Starts the lease's renewals beside the running item.
    fn watch_lease(
        &self,
        lease: Lease,
        env: Envelope,
        item: ItemLedger,
        handle: Handle,
    ) -> Running {
        let lost = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let job = lease.job.clone();
        let lease = Arc::new(Mutex::new(lease));
        let (url, ttl) = (self.opts.url.clone(), self.opts.lease);
        let (held, l, s) = (lease.clone(), lost.clone(), stop.clone());
        std::thread::spawn(move || renew_loop(&url, ttl, &held, &l, &s));
        Running {
            lease,
            job,
            env,
            item,
            handle,
            lost,
            stop,
        }
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
                    short(&r.job),
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
            let lease = r.lease.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Err(e) = self.finish(&lease, &r.env, &r.item, out) {
                // Not published: the lease (no longer renewed) expires and
                // another worker executes the item.
                self.stats.discarded += 1;
                (self.log)(&format!(
                    "item {}: could not publish its result ({e}): its work is discarded and its lease left to expire",
                    short(&r.job)
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
        let event = match out {
            Ok(Ok(ev)) => ev,
            Ok(Err(e @ EngineError::Infrastructure { .. })) => {
                return self.infrastructure(lease, &e.to_string())
            }
            Ok(Err(e)) => return self.failed(lease, env, &e.to_string()),
            Err(e) => return self.failed(lease, env, &format!("the item's task ended: {e}")),
        };
        let heads = execute::recorded_heads(&item.ledger)?;
        let ids: Vec<Id> = heads.values().copied().collect();
        remote::push_objects(&item.ledger, &self.remote, &ids, &remote::Quiet)?;
        let result = WorkResult {
            format: wire::RESULT_FORMAT.into(),
            worker: self.opts.name.clone(),
            attempt: lease.claim.attempt,
            outcome: "done".into(),
            heads: heads.iter().map(|(k, v)| (k.clone(), v.to_hex())).collect(),
            event: event.to_hex(),
            attempts: lease::attempts(self.store(), &lease.job)?
                .iter()
                .map(lease::line)
                .collect(),
        };
        self.publish(&lease.job, &result)
    }

    fn publish(&mut self, job: &str, result: &WorkResult) -> Result<()> {
        if self
            .store()
            .create(&wire::result_key(job), wire::to_bytes(result))?
        {
            self.stats.done += 1;
            self.pause = Duration::from_secs(1);
            (self.log)(&format!("item {}: done", short(job)));
        } else {
            self.stats.duplicates += 1;
            (self.log)(&format!(
                "item {}: a result was already published (executed twice: a worker thought dead finished); this execution's is discarded",
                short(job)
            ));
        }
        Ok(())
    }

    fn failed(&mut self, lease: &Lease, env: &Envelope, cause: &str) -> Result<()> {
        self.stats.failed += 1;
        (self.log)(&format!(
            "item {} ({}): attempt {} failed: {cause}",
            short(&lease.job),
            env.work.stream(),
            lease.claim.attempt
        ));
        lease::fail(self.store(), lease, cause, true, env.max_attempts.max(1))
    }

    fn heartbeat(&mut self, running: &[Running]) -> Result<()> {
        let beat = WorkerBeat {
            format: wire::WORKER_FORMAT.into(),
            worker: self.opts.name.clone(),
            slots: self.opts.slots,
            at_ms: wire::now_ms(),
            running: running.iter().map(|r| r.job.clone()).collect(),
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
    if wire::job_of(&wire::result_key(job), "work/results").is_none() {
        return Err(WorkError::Format {
            key: job.to_string(),
            detail: "not an item's name (64 hex digits)".into(),
        });
    }
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
    let (item, handle) = w.scratch.start(&w.remote, &w.opts.url, &env)?;
    let out = engine::exec::block_on(handle)?;
    let lease = Lease {
        job: job.to_string(),
        claim: wire::Claim {
            format: wire::CLAIM_FORMAT.into(),
            worker: w.opts.name.clone(),
            nonce: w.me.nonce.clone(),
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

/// Renews the lease every third of `ttl` until `stop`; sets `lost` when it
/// cannot (moved by another worker, or no successful renewal for `ttl`).
fn renew_loop(
    url: &str,
    ttl: Duration,
    lease: &Mutex<Lease>,
    lost: &AtomicBool,
    stop: &AtomicBool,
) {
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
        let mut held = lease.lock().unwrap_or_else(|p| p.into_inner());
        match store.as_ref().map(|s| lease::renew(s, &mut held)) {
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

/// A process-unique nonce for claims.
fn nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{:016x}", h.finish())
}

fn short(job: &str) -> &str {
    job.get(..12).unwrap_or(job)
}
