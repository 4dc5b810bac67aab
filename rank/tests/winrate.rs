//! Win rates and Wilson intervals, checked against R's `binom` package
//! (via statsmodels' stored results) and the documented conventions.

use rank::bt::{Comparison, Outcome};
use rank::winrate::{wilson, WinRate, Z_95};
use rank::RankError;
use serde_json::Value;

const R_BINOM: &str = include_str!("fixtures/winrate_wilson_R_binom.csv");
const CONVENTIONS: &str = include_str!("fixtures/winrate_conventions_wilson.json");

#[test]
fn z95_matches_the_documented_constant() {
    let c: Value = serde_json::from_str(CONVENTIONS).unwrap();
    assert!(c["_source"].as_str().unwrap().contains("FastChat"));
    assert_eq!(c["wilson_interval"]["z_95"].as_f64().unwrap(), Z_95);
}

#[test]
fn wilson_matches_r_binom() {
    assert!(R_BINOM.starts_with("# SOURCE: github.com/statsmodels/statsmodels"));
    let mut rows = 0;
    for line in R_BINOM.lines() {
        if line.starts_with('#') || line.starts_with("count,") || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f[2], "wilson");
        let count: u64 = f[0].parse().unwrap();
        let nobs: u64 = f[1].parse().unwrap();
        let lower: f64 = f[3].parse().unwrap();
        let upper: f64 = f[4].parse().unwrap();
        // The n = 30 rows are stored with ~7 significant digits (see the
        // fixture header); the others to full precision.
        let tol = if nobs == 30 { 1e-6 } else { 1e-12 };
        let ci = wilson(count, nobs, Z_95).unwrap();
        assert!(
            (ci.lower - lower).abs() < tol && (ci.upper - upper).abs() < tol,
            "{count}/{nobs}: got [{}, {}], R [{lower}, {upper}]",
            ci.lower,
            ci.upper
        );
        // Same numbers through the tally type (wins out of wins + losses).
        let t = WinRate::new(count, nobs - count, 7);
        assert_eq!(t.wilson95().unwrap(), ci);
        rows += 1;
    }
    assert_eq!(rows, 8);
}

#[test]
fn wilson_properties() {
    // Endpoints stay inside [0, 1] and are exact at the extremes.
    let ci = wilson(0, 30, Z_95).unwrap();
    assert_eq!(ci.lower, 0.0);
    let ci = wilson(30, 30, Z_95).unwrap();
    assert_eq!(ci.upper, 1.0);
    // z = 0 collapses to the point estimate.
    let ci = wilson(7, 20, 0.0).unwrap();
    assert!((ci.lower - 0.35).abs() < 1e-15 && (ci.upper - 0.35).abs() < 1e-15);
    // Wider for larger z, and always containing the point estimate.
    let narrow = wilson(12, 40, 1.0).unwrap();
    let z99 = 2.575_829_303_548_901; // qnorm(0.995)
    let wide = wilson(12, 40, z99).unwrap();
    assert!(wide.lower < narrow.lower && narrow.upper < wide.upper);
    assert!(narrow.lower < 0.3 && 0.3 < narrow.upper);
    // Symmetric under swapping successes and failures.
    let a = wilson(3, 11, Z_95).unwrap();
    let b = wilson(8, 11, Z_95).unwrap();
    assert!((a.lower - (1.0 - b.upper)).abs() < 1e-15);
    assert!((a.upper - (1.0 - b.lower)).abs() < 1e-15);
}

#[test]
fn wilson_errors() {
    assert_eq!(wilson(0, 0, Z_95).unwrap_err(), RankError::NoTrials);
    assert_eq!(
        wilson(5, 4, Z_95).unwrap_err(),
        RankError::InvalidCounts {
            successes: 5,
            trials: 4
        }
    );
    for z in [-1.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            wilson(1, 2, z).unwrap_err(),
            RankError::InvalidZ { .. }
        ));
    }
    // Huge counts do not overflow or panic.
    let ci = wilson(u64::MAX / 2, u64::MAX, Z_95).unwrap();
    assert!(ci.lower <= 0.5 && 0.5 <= ci.upper);
}

#[test]
fn ties_are_excluded_and_reported() {
    let t = WinRate::new(6, 2, 4);
    assert_eq!(t.rate(), Some(0.75));
    assert_eq!(t.decisive(), 8);
    assert_eq!(t.total(), 12);
    assert_eq!(t.ties, 4);
    assert_eq!(t.rate_ties_as_half(), Some(8.0 / 12.0));
    // Ties do not change the interval: it is on W out of W + L.
    assert_eq!(t.wilson95().unwrap(), wilson(6, 8, Z_95).unwrap());
    // Only ties: no rate, and no interval.
    let only_ties = WinRate::new(0, 0, 3);
    assert_eq!(only_ties.rate(), None);
    assert_eq!(only_ties.rate_ties_as_half(), Some(0.5));
    assert_eq!(only_ties.wilson95().unwrap_err(), RankError::NoTrials);
    assert_eq!(WinRate::default().rate_ties_as_half(), None);
}

#[test]
fn tally_from_comparisons() {
    let c = |a, b, outcome| Comparison { a, b, outcome };
    let data = [
        c(0, 1, Outcome::AWins), // 0 wins as A
        c(1, 0, Outcome::AWins), // 0 loses as B
        c(1, 0, Outcome::BWins), // 0 wins as B
        c(0, 2, Outcome::Tie),   // tie
        c(1, 2, Outcome::AWins), // not involving 0
        c(0, 0, Outcome::AWins), // self-comparison: ignored
    ];
    assert_eq!(WinRate::for_item(&data, 0), WinRate::new(2, 1, 1));
    assert_eq!(WinRate::for_item(&data, 1), WinRate::new(2, 2, 0));
    assert_eq!(WinRate::for_item(&data, 2), WinRate::new(0, 1, 1));
    assert_eq!(WinRate::for_item(&data, 9), WinRate::default());
}
