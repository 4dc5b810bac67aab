//! Claims with leases on the store. A claim is a conditional create of
//! `work/claims/<job>.json`; its holder renews it by a compare-and-swap that
//! moves a counter; another worker takes it over, with a swap against the
//! version it read, once the counter has stood still for the lease's
//! length by that worker's own clock (no clocks are compared across
//! machines). A claim whose holder gave up (a failed attempt, or a worker
//! stopping) is released and taken at once.
//!
//! Every ended attempt is recorded (`work/attempts/`) with its cause and
//! whether it counts: only the item's own failure counts towards
//! `max_attempts` (then the item gets a final `failed` result); a lease
//! that expired (a worker killed or cut off) and a failure of the worker's
//! machine or of a server (an infrastructure failure) are recorded but do
//! not count, so they never turn an item into a failed one.
//!
//! A conditional write whose answer was lost (the request succeeded, the
//! reply did not arrive, a retry was refused) is settled by reading the
//! claim back: every claim carries its writer's nonce.

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

/// Who is claiming: the worker's name, its nonce (unique per process), the
/// lease's length and how many counted failures end an item.
#[derive(Debug, Clone)]
pub struct Claimant {
    pub name: String,
    pub nonce: String,
    pub ttl: Duration,
    pub max_attempts: u32,
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

    /// Keeps only the jobs `keep` says are still open.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.seen.retain(|j, _| keep(j));
    }
}

fn fresh(me: &Claimant, attempt: u32) -> Claim {
    Claim {
        format: wire::CLAIM_FORMAT.into(),
        worker: me.name.clone(),
        nonce: me.nonce.clone(),
        attempt,
        beat: 0,
        ttl_ms: me.ttl.as_millis() as u64,
        released: false,
    }
}

/// Tries to claim `job` for `me`.
pub fn try_claim(store: &Store, job: &str, me: &Claimant, watch: &mut Watch) -> Result<Take> {
    let key = wire::claim_key(job);
    let Some((bytes, version)) = store.get(&key)? else {
        let claim = fresh(me, 1);
        // Refused or not, the claim on the store says who has it (a
        // create whose reply was lost is ours all the same).
        let _ = store.create(&key, wire::to_bytes(&claim));
        return mine(store, job, claim);
    };
    let held: Claim = wire::parse(&key, &bytes)?;
    if !held.released && !watch.expired(job, &held, &version) {
        return Ok(Take::Busy);
    }
    if counted_failures(store, job)? >= me.max_attempts {
        return give_up(store, job).map(Take::Given);
    }
    let claim = fresh(me, held.attempt + 1);
    let _ = store.swap(&key, wire::to_bytes(&claim), Some(&version));
    let took = mine(store, job, claim)?;
    if matches!(took, Take::Mine(_)) {
        watch.forget(job);
        if !held.released {
            // Its holder went silent: that attempt ended, and says so
            // (written once the takeover stands, so a holder that renewed
            // in between is never called expired).
            record_attempt(store, job, &held, &expired_cause(&held), false)?;
        }
    }
    Ok(took)
}

fn expired_cause(held: &Claim) -> String {
    format!(
        "lease expired: no renewal for {} ms (the worker was killed, hung or cut off from the store)",
        held.ttl_ms
    )
}

/// The claim on the store, if it is `claim` (by its nonce and beat), with
/// its version.
fn mine(store: &Store, job: &str, claim: Claim) -> Result<Take> {
    let key = wire::claim_key(job);
    match store.get(&key)? {
        Some((bytes, version))
            if wire::parse::<Claim>(&key, &bytes).ok().as_ref() == Some(&claim) =>
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

/// Renews `lease`; false when another worker holds the item now. A swap
/// whose answer was lost is settled by reading the claim back.
pub fn renew(store: &Store, lease: &mut Lease) -> Result<bool> {
    let mut next = lease.claim.clone();
    next.beat += 1;
    let key = wire::claim_key(&lease.job);
    let swapped = store.swap(&key, wire::to_bytes(&next), Some(&lease.version));
    match (swapped, mine(store, &lease.job, next.clone())?) {
        (_, Take::Mine(now)) => {
            *lease = now;
            Ok(true)
        }
        (Err(e), _) => Err(e.into()),
        _ => Ok(false),
    }
}

/// Ends `lease`'s attempt: recorded with `cause`, counted towards the
/// item's failures when `counts`, and the item released to the next worker
/// (or given up once the counted failures reach the limit).
pub fn fail(
    store: &Store,
    lease: &Lease,
    cause: &str,
    counts: bool,
    max_attempts: u32,
) -> Result<()> {
    record_attempt(store, &lease.job, &lease.claim, cause, counts)?;
    if counts && counted_failures(store, &lease.job)? >= max_attempts {
        give_up(store, &lease.job)?;
    }
    release(store, lease)
}

/// Lets the item go to the next worker at once.
pub fn release(store: &Store, lease: &Lease) -> Result<()> {
    let mut next = lease.claim.clone();
    next.released = true;
    let key = wire::claim_key(&lease.job);
    let _ = store.swap(&key, wire::to_bytes(&next), Some(&lease.version));
    // Released, or someone took it over meanwhile: either way not ours.
    Ok(())
}

fn record_attempt(
    store: &Store,
    job: &str,
    claim: &Claim,
    cause: &str,
    counts: bool,
) -> Result<()> {
    let a = Attempt {
        format: wire::ATTEMPT_FORMAT.into(),
        attempt: claim.attempt,
        worker: claim.worker.clone(),
        cause: cause.into(),
        counts,
    };
    // Create-if-absent: one line per attempt.
    store.create(&wire::attempt_key(job, claim.attempt), wire::to_bytes(&a))?;
    Ok(())
}

/// Every recorded attempt of `job`.
pub fn attempts(store: &Store, job: &str) -> Result<Vec<Attempt>> {
    let mut out = Vec::new();
    for key in store.list(&format!("work/attempts/{job}"))? {
        if let Some((bytes, _)) = store.get(&key)? {
            out.push(wire::parse(&key, &bytes)?);
        }
    }
    Ok(out)
}

/// An attempt as one line.
pub fn line(a: &Attempt) -> String {
    let counted = if a.counts { "" } else { " (not counted)" };
    format!("attempt {} ({}){counted}: {}", a.attempt, a.worker, a.cause)
}

fn counted_failures(store: &Store, job: &str) -> Result<u32> {
    Ok(attempts(store, job)?.iter().filter(|a| a.counts).count() as u32)
}

/// Publishes `job`'s final `failed` result (create-if-absent: one stays).
fn give_up(store: &Store, job: &str) -> Result<Vec<String>> {
    let all = attempts(store, job)?;
    let lines: Vec<String> = all.iter().map(line).collect();
    let r = WorkResult {
        format: wire::RESULT_FORMAT.into(),
        worker: String::new(),
        attempt: all.iter().filter(|a| a.counts).count() as u32,
        outcome: "failed".into(),
        heads: Default::default(),
        event: String::new(),
        attempts: lines.clone(),
    };
    store.create(&wire::result_key(job), wire::to_bytes(&r))?;
    Ok(lines)
}
