//! Claims and leases on a folder store: racing claimants (exactly one
//! wins), a lease taken over only once it has stood still for its length
//! (and the expired attempt recorded only once the takeover stands), the
//! old holder's renewal refused after a takeover, a renewal whose answer
//! was lost settled by reading the claim back, a failure after renewals
//! still releasing the item, uncounted failures (expired leases,
//! infrastructure) never giving an item up, and the final `failed` result
//! once the counted failures reach the limit.

use std::time::Duration;

use remote::Store;
use workers::lease::{self, Claimant, Take, Watch};
use workers::wire;

const JOB: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn store() -> (tempfile::TempDir, Store) {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path().join("s").to_str().unwrap()).unwrap();
    (d, s)
}

fn who(name: &str, ttl: Duration, max_attempts: u32) -> Claimant {
    Claimant {
        name: name.into(),
        nonce: format!("nonce-{name}"),
        ttl,
        max_attempts,
    }
}

fn claim(s: &Store, me: &Claimant, w: &mut Watch) -> Take {
    lease::try_claim(s, JOB, me, w).unwrap()
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
                    let me = who(&format!("w{i}"), Duration::from_secs(30), 3);
                    matches!(claim(&s, &me, &mut Watch::default()), Take::Mine(_))
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
    let (a_who, b_who) = (who("a", ttl, 3), who("b", ttl, 3));
    let Take::Mine(mut a) = claim(&s, &a_who, &mut Watch::default()) else {
        panic!("the first claim must win")
    };
    let mut wb = Watch::default();
    // Renewed in time: never expired, and no attempt is recorded.
    for _ in 0..4 {
        assert!(matches!(claim(&s, &b_who, &mut wb), Take::Busy));
        std::thread::sleep(ttl / 2);
        assert!(lease::renew(&s, &mut a).unwrap());
    }
    assert!(lease::attempts(&s, JOB).unwrap().is_empty());
    // Silent for longer than the lease: taken over, attempt 2.
    assert!(matches!(claim(&s, &b_who, &mut wb), Take::Busy));
    std::thread::sleep(ttl + ttl / 2);
    let Take::Mine(b) = claim(&s, &b_who, &mut wb) else {
        panic!("an expired lease must be taken over")
    };
    assert_eq!(b.claim.attempt, 2);
    // The old holder's renewal is refused: it must stop.
    assert!(!lease::renew(&s, &mut a).unwrap());
    let lines: Vec<String> = lease::attempts(&s, JOB)
        .unwrap()
        .iter()
        .map(lease::line)
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("attempt 1 (a) (not counted): lease expired"),
        "{lines:?}"
    );
}

/// A renewal that reached the store but whose answer was lost (here: the
/// claim swapped by the holder itself, as a retried request would find
/// it) is still the holder's.
#[test]
fn a_renewal_whose_answer_was_lost_is_settled_by_reading_back() {
    let (_d, s) = store();
    let me = who("a", Duration::from_secs(30), 3);
    let Take::Mine(mut a) = claim(&s, &me, &mut Watch::default()) else {
        panic!()
    };
    // The store already holds the next beat (the first try landed).
    let mut next = a.claim.clone();
    next.beat += 1;
    assert!(s
        .swap(
            &wire::claim_key(JOB),
            wire::to_bytes(&next),
            Some(&a.version)
        )
        .unwrap());
    assert!(lease::renew(&s, &mut a).unwrap());
    assert_eq!(a.claim.beat, 1);
    // And the lease goes on from the version read back.
    assert!(lease::renew(&s, &mut a).unwrap());
    assert_eq!(a.claim.beat, 2);
}

/// A failure after renewals releases the item (the release swaps against
/// the renewed version, not the claim's first).
#[test]
fn a_failure_after_renewals_releases_the_item() {
    let (_d, s) = store();
    let ttl = Duration::from_secs(30);
    let Take::Mine(mut a) = claim(&s, &who("a", ttl, 3), &mut Watch::default()) else {
        panic!()
    };
    for _ in 0..3 {
        assert!(lease::renew(&s, &mut a).unwrap());
    }
    lease::fail(&s, &a, "boom", true, 3).unwrap();
    let Take::Mine(b) = claim(&s, &who("b", ttl, 3), &mut Watch::default()) else {
        panic!("a released item is taken at once")
    };
    assert_eq!(b.claim.attempt, 2);
}

#[test]
fn only_counted_failures_give_an_item_up() {
    let (_d, s) = store();
    let ttl = Duration::from_secs(30);
    let mut w = Watch::default();
    // Infrastructure failures, however many, never end the item.
    for n in 1..=4u32 {
        let Take::Mine(l) = claim(&s, &who(&format!("i{n}"), ttl, 2), &mut w) else {
            panic!("a released item is taken at once (attempt {n})")
        };
        lease::fail(&s, &l, "model server down", false, 2).unwrap();
    }
    assert!(s.get(&wire::result_key(JOB)).unwrap().is_none());
    // Two counted failures do.
    for n in 1..=2u32 {
        let Take::Mine(l) = claim(&s, &who(&format!("w{n}"), ttl, 2), &mut w) else {
            panic!("a released item is taken at once")
        };
        lease::fail(&s, &l, &format!("boom {n}"), true, 2).unwrap();
    }
    let (bytes, _) = s
        .get(&wire::result_key(JOB))
        .unwrap()
        .expect("a final result");
    let r: wire::WorkResult = wire::parse("r", &bytes).unwrap();
    assert_eq!(r.outcome, "failed");
    assert_eq!(r.attempt, 2);
    assert_eq!(r.attempts.len(), 6, "{:?}", r.attempts);
    assert!(r.attempts[5].ends_with("(w2): boom 2"), "{:?}", r.attempts);
    assert!(matches!(
        claim(&s, &who("w3", ttl, 2), &mut w),
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
