//! The percentile bootstrap of a win rate: deterministic per seed, close to
//! the Wilson interval where both are valid, and always around the estimate.

use rank::winrate::WinRate;

#[test]
fn the_bootstrap_is_deterministic_and_agrees_with_wilson_on_large_samples() {
    let t = WinRate::new(60, 40, 0);
    let a = t.bootstrap95(2000, 7).unwrap();
    assert_eq!(a, t.bootstrap95(2000, 7).unwrap());
    let w = t.wilson95().unwrap();
    assert!((a.lower - w.lower).abs() < 0.03, "{a:?} vs {w:?}");
    assert!((a.upper - w.upper).abs() < 0.03, "{a:?} vs {w:?}");
}

#[test]
fn the_bootstrap_brackets_the_estimate_for_many_tallies() {
    for wins in [1u64, 5, 17, 40] {
        for losses in [0u64, 3, 20] {
            for ties in [0u64, 4] {
                let t = WinRate::new(wins, losses, ties);
                let r = t.rate().unwrap();
                let b = t.bootstrap95(1000, wins * 31 + losses).unwrap();
                assert!(b.lower <= r && r <= b.upper, "{t:?}: {b:?} around {r}");
                assert!(0.0 <= b.lower && b.upper <= 1.0);
            }
        }
    }
    assert!(WinRate::new(0, 0, 5).bootstrap95(100, 1).is_err());
}
