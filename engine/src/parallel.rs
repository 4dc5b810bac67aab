//! Bounded parallelism for independent units of work (rollouts, judgments).
//! Results come back in input order, so what the driver records next does not
//! depend on which thread finished first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Runs `f` on every item with at most `threads` threads; returns results in
/// item order, or the first error (by item order).
pub fn map<T: Send, R: Send, E: Send>(
    threads: usize,
    items: Vec<T>,
    f: impl Fn(T) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E> {
    let n = items.len();
    let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let results: Vec<Mutex<Option<Result<R, E>>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let workers = threads.clamp(1, n.max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    break;
                }
                let item = slots[i].lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(item) = item {
                    let r = f(item);
                    *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                }
            });
        }
    });
    let mut out = Vec::with_capacity(n);
    for r in results {
        match r.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(Ok(v)) => out.push(v),
            Some(Err(e)) => return Err(e),
            None => unreachable_slot(),
        }
    }
    Ok(out)
}

#[cold]
fn unreachable_slot() {
    // Every index below n is claimed by exactly one worker, which always stores a
    // result; reaching here would be a bug in this function, not bad input.
    panic!("parallel::map lost a result slot");
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_order_and_reports_the_first_error() {
        let v = super::map(3, (0..50).collect(), |i: u32| Ok::<_, String>(i * 2)).unwrap();
        assert_eq!(v, (0..50).map(|i| i * 2).collect::<Vec<_>>());
        let e = super::map(2, (0..10).collect(), |i: u32| {
            if i % 4 == 3 {
                Err(i)
            } else {
                Ok(i)
            }
        })
        .unwrap_err();
        assert_eq!(e, 3);
    }
}
