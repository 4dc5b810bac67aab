//! The engine's async runtime: where units of work (rollouts, judgments,
//! proposals) run as tasks, not one OS thread each.
//!
//! One multi-threaded tokio runtime per process, with 4 workers per core. A
//! unit waits on a model server by awaiting, so hundreds can be in flight on
//! two cores; the per-backend concurrency limits (`max_concurrency`) decide
//! how many requests a server sees. The driver and the cycle code stay
//! synchronous and hand a stage's units to `all`, which keeps results in
//! input order, so what is recorded next never depends on which unit
//! finished first.
//!
//! Inside a unit, processes (bash, checks) and the simulated model run
//! through `blocking`, which frees the worker for other units while they
//! run. Ledger work (`ledger`) runs in place. The records of model calls
//! and file tools are submitted and their fsync awaited (`durable`): the
//! task is parked, not the worker, while another committer syncs the group.
//! Other commits (stream events, the started record of a process) still
//! wait on their worker, so the runtime keeps several workers per core.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

use crate::error::{EngineError, Result};

/// Workers per core: some ledger commits block their worker until the
/// group's fsync, so there are more workers than cores (see `ledger`).
const WORKERS_PER_CORE: usize = 4;

static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

/// The process's runtime, started on first use.
pub fn runtime() -> Result<&'static Runtime> {
    RUNTIME
        .get_or_init(|| {
            let workers = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                * WORKERS_PER_CORE;
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .thread_name("mass-unit")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| EngineError::Invalid(format!("cannot start the async runtime: {e}")))
}

/// Runs `fut` to completion from synchronous code (never from inside a
/// unit: a unit awaits instead).
pub fn block_on<F: Future>(fut: F) -> Result<F::Output> {
    Ok(runtime()?.block_on(fut))
}

/// Runs blocking `f` from inside a unit without stalling the other units on
/// this worker; outside the runtime it simply runs `f`.
pub fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Thread CPU time spent in `ledger` calls since measuring was switched on.
static LEDGER_CPU_NS: AtomicU64 = AtomicU64::new(0);

/// Whether `ledger` measures ([`measure_ledger_cpu`]).
static MEASURE_LEDGER_CPU: AtomicBool = AtomicBool::new(false);

/// Switches on (or off) counting the thread CPU time of `ledger` calls, for
/// the orchestration benchmark's ledger share. Off by default: reading a
/// thread's CPU clock is a system call, two per ledger call, which cost
/// about 3% of a recording's CPU when it was always on.
pub fn measure_ledger_cpu(on: bool) {
    MEASURE_LEDGER_CPU.store(on, Ordering::Relaxed);
}

/// Runs ledger work (stream cursors, commits, blob writes) from inside a
/// unit, in place, and, when [`measure_ledger_cpu`] is on, counts the
/// thread CPU time it took (encoding, hashing, compression, index updates
/// and the write and fsync system calls; not the time spent waiting for
/// the disk), so the orchestration benchmark can report the ledger's share
/// of the CPU.
///
/// In place, not off the worker: a blocking commit waits for its group's
/// fsync (a millisecond or so), and leaving the worker costs more than that
/// wait under load (the runtime hands its queue to another thread through
/// a shared pool whose lock was the bottleneck when measured). The runtime
/// has more workers than cores instead (`WORKERS_PER_CORE`), so units keep
/// running while some workers wait on the disk, and their commits share an
/// fsync. The frequent commits avoid the wait altogether (`durable`).
pub fn ledger<R>(f: impl FnOnce() -> R) -> R {
    if !MEASURE_LEDGER_CPU.load(Ordering::Relaxed) {
        return f();
    }
    let t0 = thread_cpu_ns();
    let r = f();
    LEDGER_CPU_NS.fetch_add(thread_cpu_ns().saturating_sub(t0), Ordering::Relaxed);
    r
}

/// Awaits a submitted commit ([`ledger::Durability`]) without holding the
/// worker while another committer writes and syncs the group; when no one
/// does, this task leads (on its worker, as a blocking commit would). The
/// CPU of each poll counts as ledger work.
pub async fn durable(d: ledger::Durability<'_>) -> std::result::Result<(), ledger::LedgerError> {
    let mut d = std::pin::pin!(d);
    std::future::poll_fn(move |cx| ledger(|| d.as_mut().poll(cx))).await
}

/// Total thread CPU time spent in `ledger` calls so far (while measuring).
pub fn ledger_cpu() -> Duration {
    Duration::from_nanos(LEDGER_CPU_NS.load(Ordering::Relaxed))
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the timespec we pass.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// Runs `unit(item)` for every item as a task, at most `limit` at a time;
/// `done` is called (on the calling thread) as each finishes. Returns the
/// results in item order, or the first error in item order once every unit
/// has ended (a unit is never abandoned halfway through a recording).
pub fn all<T, R, F, Fut>(limit: usize, items: Vec<T>, unit: F, done: impl Fn()) -> Result<Vec<R>>
where
    F: Fn(T) -> Fut,
    Fut: Future<Output = Result<R>> + Send + 'static,
    R: Send + 'static,
{
    let rt = runtime()?;
    let gate = Arc::new(tokio::sync::Semaphore::new(limit.max(1)));
    let mut set = tokio::task::JoinSet::new();
    let mut index_of = std::collections::HashMap::new();
    let n = items.len();
    for (i, item) in items.into_iter().enumerate() {
        let fut = unit(item);
        let gate = gate.clone();
        let h = set.spawn_on(
            async move {
                // The gate is never closed, so acquiring cannot fail; if it
                // did, running unlimited would still be correct.
                let _permit = gate.acquire_owned().await.ok();
                fut.await
            },
            rt.handle(),
        );
        index_of.insert(h.id(), i);
    }
    rt.block_on(async {
        let mut slots: Vec<Option<Result<R>>> = (0..n).map(|_| None).collect();
        while let Some(joined) = set.join_next_with_id().await {
            let (id, r) = match joined {
                Ok((id, r)) => (id, r),
                // A panicking unit is a bug: surface it as the panic it was.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => (
                    e.id(),
                    Err(EngineError::Invalid(format!(
                        "a unit of work was cancelled: {e}"
                    ))),
                ),
            };
            if let Some(&i) = index_of.get(&id) {
                slots[i] = Some(r);
            }
            done();
        }
        let mut out = Vec::with_capacity(n);
        for slot in slots {
            match slot {
                Some(Ok(v)) => out.push(v),
                Some(Err(e)) => return Err(e),
                None => {
                    return Err(EngineError::Invalid(
                        "a unit of work ended without a result".into(),
                    ))
                }
            }
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn keeps_order_and_reports_the_first_error_after_all_ended() {
        let v = all(
            3,
            (0..50).collect(),
            |i: u32| async move { Ok(i * 2) },
            || {},
        )
        .unwrap();
        assert_eq!(v, (0..50).map(|i| i * 2).collect::<Vec<_>>());
        let ended = Arc::new(AtomicUsize::new(0));
        let e = all(
            2,
            (0..10).collect(),
            |i: u32| {
                let ended = ended.clone();
                async move {
                    // Later units finish first: the error is still the
                    // first in item order.
                    tokio::time::sleep(Duration::from_millis(u64::from(10 - i))).await;
                    ended.fetch_add(1, Ordering::SeqCst);
                    if i % 4 == 3 {
                        Err(EngineError::Invalid(format!("unit {i}")))
                    } else {
                        Ok(i)
                    }
                }
            },
            || {},
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            EngineError::Invalid("unit 3".into()).to_string()
        );
        assert_eq!(ended.load(Ordering::SeqCst), 10);
    }

    /// Hundreds of waiting units need neither hundreds of threads nor
    /// hundreds of waits in a row: 400 units sleeping 100 ms end in well
    /// under a second, on the runtime's few workers.
    #[test]
    fn waiting_units_overlap_without_a_thread_each() {
        let peak = Arc::new(AtomicUsize::new(0));
        let now = Arc::new(AtomicUsize::new(0));
        let started = std::time::Instant::now();
        let ticks = AtomicUsize::new(0);
        all(
            1000,
            (0..400).collect(),
            |_: u32| {
                let (peak, now) = (peak.clone(), now.clone());
                async move {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                }
            },
            || {
                ticks.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(peak.load(Ordering::SeqCst) > 300);
        assert_eq!(ticks.load(Ordering::SeqCst), 400);
        let threads = std::fs::read_dir("/proc/self/task")
            .map(|d| d.count())
            .unwrap_or(0);
        assert!(threads < 64, "{threads} threads for 400 units");
    }

    #[test]
    fn the_limit_bounds_units_in_flight() {
        let peak = Arc::new(AtomicUsize::new(0));
        let now = Arc::new(AtomicUsize::new(0));
        all(
            3,
            (0..30).collect(),
            |_: u32| {
                let (peak, now) = (peak.clone(), now.clone());
                async move {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                }
            },
            || {},
        )
        .unwrap();
        assert_eq!(peak.load(Ordering::SeqCst), 3);
    }
}
