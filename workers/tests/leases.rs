//! Claims and leases on a folder store: racing claimants (exactly one
//! wins), a lease taken over only once it has stood still for its length,
//! the old holder's renewal refused after a takeover, attempts recorded,
//! released claims taken at once, and the final `failed` result once every
//! attempt failed.

use std::time::Duration;

use remote::Store;
use workers::lease::{self, Take, Watch};
use workers::wire;

const JOB: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn store() -> (tempfile::TempDir, Store) {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path().join("s").to_str().unwrap()).unwrap();
    (d, s)
}

#[test]
fn racing_claimants_exactly_one_wins() {
    for round in 0..8 {
        let (d, _) = store();
        let url = d.path().join("s").to_string_lossy().into_owned();
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let url = url.clone();
                std::thread::spawn(move || {
                    let s = Store::open(&url).unwrap();
                    let mut w = Watch::default();
                    let me = format!("w{i}");
                    matches!(
                        lease::try_claim(&s, JOB, &me, Duration::from_secs(30), 3, &mut w).unwrap(),
                        Take::Mine(_)
                    )
                })
            })
            .collect();
        let wins = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|w| *w)
            .count();
        assert_eq!(wins, 1, "round {round}: {wins} claimants won");
    }
}

#[test]
fn a_lease_is_taken_over_only_after_standing_still_for_its_length() {
    let (_d, s) = store();
    let ttl = Duration::from_millis(400);
    let Take::Mine(mut a) = lease::try_claim(&s, JOB, "a", ttl, 3, &mut Watch::default()).unwrap()
    else {
        panic!("the first claim must win")
    };
    let mut wb = Watch::default();
    // Renewed in time: never expired.
    for _ in 0..4 {
        assert!(matches!(
            lease::try_claim(&s, JOB, "b", ttl, 3, &mut wb).unwrap(),
            Take::Busy
        ));
        std::thread::sleep(ttl / 2);
        assert!(lease::renew(&s, &mut a).unwrap());
    }
    // Silent for longer than the lease: taken over, attempt 2.
    assert!(matches!(
        lease::try_claim(&s, JOB, "b", ttl, 3, &mut wb).unwrap(),
        Take::Busy
    ));
    std::thread::sleep(ttl + ttl / 2);
    let Take::Mine(b) = lease::try_claim(&s, JOB, "b", ttl, 3, &mut wb).unwrap() else {
        panic!("an expired lease must be taken over")
    };
    assert_eq!(b.claim.attempt, 2);
    // The old holder's renewal is refused: it must stop.
    assert!(!lease::renew(&s, &mut a).unwrap());
    let lines = lease::attempts(&s, JOB).unwrap();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("attempt 1 (a): lease expired"),
        "{lines:?}"
    );
}

#[test]
fn failed_attempts_release_the_item_then_give_it_up() {
    let (_d, s) = store();
    let ttl = Duration::from_secs(30);
    let mut w = Watch::default();
    for n in 1..=2u32 {
        let Take::Mine(l) = lease::try_claim(&s, JOB, &format!("w{n}"), ttl, 2, &mut w).unwrap()
        else {
            panic!("a released item is taken at once (attempt {n})")
        };
        assert_eq!(l.claim.attempt, n);
        lease::fail(&s, &l, &format!("boom {n}"), 2).unwrap();
    }
    let (bytes, _) = s
        .get(&wire::result_key(JOB))
        .unwrap()
        .expect("a final result");
    let r: wire::WorkResult = wire::parse("r", &bytes).unwrap();
    assert_eq!(r.outcome, "failed");
    assert_eq!(
        r.attempts,
        vec!["attempt 1 (w1): boom 1", "attempt 2 (w2): boom 2"]
    );
    assert!(matches!(
        lease::try_claim(&s, JOB, "w3", ttl, 2, &mut w).unwrap(),
        Take::Given(_)
    ));
}

#[test]
fn job_names_are_64_hex_digits_only() {
    assert_eq!(
        wire::job_of(&wire::result_key(JOB), "work/results"),
        Some(JOB.to_string())
    );
    for bad in [
        "work/results/../x.json",
        "work/results/abc.json",
        "work/results/sub/x.json",
        "work/items/0123.json",
    ] {
        assert_eq!(wire::job_of(bad, "work/results"), None, "{bad}");
    }
}
