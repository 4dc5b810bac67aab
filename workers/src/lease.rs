//! Claims with leases on the store. A claim is a conditional create of
//! `work/claims/<job>.json`; its holder renews it by a compare-and-swap that
//! moves a counter; another worker takes it over, with a swap against the
//! version it read, once the counter has stood still for the lease's
//! length by that worker's own clock (no clocks are compared across
//! machines). A claim whose holder gave up after a failure is released and
//! taken at once. Every ended attempt is recorded (`work/attempts/`), and
//! once `max_attempts` have failed the item gets a final `failed` result.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use remote::{Store, Version};

use crate::error::Result;
use crate::wire::{self, Attempt, Claim, WorkResult};

/// A claim this worker holds.
#[derive(Debug, Clone)]
pub struct Lease {
    pub job: String,
    pub claim: Claim,
    pub version: Version,
}

/// What trying to claim an item came to.
pub enum Take {
    Mine(Lease),
    /// Someone holds it (or just took it).
    Busy,
    /// Every attempt failed: its final result is published (by this call
    /// or another worker).
    Given(Vec<String>),
}

/// What this worker has seen of other workers' claims: the version it read
/// and when it first read it. A version unchanged for a lease's length is
/// an expired lease.
#[derive(Default)]
pub struct Watch {
    seen: HashMap<String, (String, u64, Instant)>,
}

impl Watch {
    /// Whether `claim` (at `version`) has stood still for its lease.
    fn expired(&mut self, job: &str, claim: &Claim, version: &Version) -> bool {
        let tag = version.tag();
        let now = Instant::now();
        let e = self
            .seen
            .entry(job.to_string())
            .or_insert((tag.clone(), claim.beat, now));
        if e.0 != tag || e.1 != claim.beat {
            *e = (tag, claim.beat, now);
            return false;
        }
        now.duration_since(e.2) >= Duration::from_millis(claim.ttl_ms)
    }

    pub fn forget(&mut self, job: &str) {
        self.seen.remove(job);
    }
}

fn fresh(me: &str, attempt: u32, ttl: Duration) -> Claim {
    Claim {
        format: wire::CLAIM_FORMAT.into(),
        worker: me.into(),
        attempt,
        beat: 0,
        ttl_ms: ttl.as_millis() as u64,
        released: false,
    }
}

/// Tries to claim `job` for worker `me`.
pub fn try_claim(
    store: &Store,
    job: &str,
    me: &str,
    ttl: Duration,
    max_attempts: u32,
    watch: &mut Watch,
) -> Result<Take> {
    let key = wire::claim_key(job);
    let Some((bytes, version)) = store.get(&key)? else {
        let claim = fresh(me, 1, ttl);
        if !store.create(&key, wire::to_bytes(&claim))? {
            return Ok(Take::Busy);
        }
        return mine(store, job, claim);
    };
    let held: Claim = wire::parse(&key, &bytes)?;
    if !held.released && !watch.expired(job, &held, &version) {
        return Ok(Take::Busy);
    }
    if !held.released {
        // Its holder went silent: that attempt ended, and says so.
        record_attempt(
            store,
            job,
            held.attempt,
            &held.worker,
            &format!(
                "lease expired: no renewal for {} ms (the worker was killed, hung or cut off from the store)",
                held.ttl_ms
            ),
        )?;
    }
    if held.attempt >= max_attempts {
        return give_up(store, job).map(Take::Given);
    }
    let claim = fresh(me, held.attempt + 1, ttl);
    if !store.swap(&key, wire::to_bytes(&claim), Some(&version))? {
        return Ok(Take::Busy);
    }
    watch.forget(job);
    mine(store, job, claim)
}

/// The claim just written, with its version.
fn mine(store: &Store, job: &str, claim: Claim) -> Result<Take> {
    match store.get(&wire::claim_key(job))? {
        Some((bytes, version))
            if wire::parse::<Claim>(job, &bytes).ok().as_ref() == Some(&claim) =>
        {
            Ok(Take::Mine(Lease {
                job: job.to_string(),
                claim,
                version,
            }))
        }
        _ => Ok(Take::Busy),
    }
}

/// Renews `lease`; false when another worker holds the item now.
pub fn renew(store: &Store, lease: &mut Lease) -> Result<bool> {
    let mut next = lease.claim.clone();
    next.beat += 1;
    let key = wire::claim_key(&lease.job);
    if !store.swap(&key, wire::to_bytes(&next), Some(&lease.version))? {
        return Ok(false);
    }
    match store.get(&key)? {
        Some((bytes, version))
            if wire::parse::<Claim>(&key, &bytes).ok().as_ref() == Some(&next) =>
        {
            lease.claim = next;
            lease.version = version;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Records a failed attempt of `lease` and lets the item go to the next
/// worker, or gives it up when it was the last attempt allowed.
pub fn fail(store: &Store, lease: &Lease, cause: &str, max_attempts: u32) -> Result<()> {
    record_attempt(
        store,
        &lease.job,
        lease.claim.attempt,
        &lease.claim.worker,
        cause,
    )?;
    if lease.claim.attempt >= max_attempts {
        give_up(store, &lease.job)?;
    }
    let mut next = lease.claim.clone();
    next.released = true;
    store.swap(
        &wire::claim_key(&lease.job),
        wire::to_bytes(&next),
        Some(&lease.version),
    )?;
    Ok(())
}

fn record_attempt(store: &Store, job: &str, n: u32, worker: &str, cause: &str) -> Result<()> {
    let a = Attempt {
        format: wire::ATTEMPT_FORMAT.into(),
        attempt: n,
        worker: worker.into(),
        cause: cause.into(),
    };
    // Create-if-absent: when two workers see the same lease expire, one
    // line stays.
    store.create(&wire::attempt_key(job, n), wire::to_bytes(&a))?;
    Ok(())
}

/// Every recorded failed attempt of `job`, as lines.
pub fn attempts(store: &Store, job: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for key in store.list(&format!("work/attempts/{job}"))? {
        if let Some((bytes, _)) = store.get(&key)? {
            let a: Attempt = wire::parse(&key, &bytes)?;
            out.push(format!("attempt {} ({}): {}", a.attempt, a.worker, a.cause));
        }
    }
    Ok(out)
}

/// Publishes `job`'s final `failed` result (create-if-absent: one stays).
fn give_up(store: &Store, job: &str) -> Result<Vec<String>> {
    let lines = attempts(store, job)?;
    let r = WorkResult {
        format: wire::RESULT_FORMAT.into(),
        worker: String::new(),
        attempt: lines.len() as u32,
        outcome: "failed".into(),
        heads: Default::default(),
        event: String::new(),
        attempts: lines.clone(),
    };
    store.create(&wire::result_key(job), wire::to_bytes(&r))?;
    Ok(lines)
}
