//! Win rates with ties excluded, and Wilson score intervals.
//!
//! This module owns the convention used to report head-to-head results (for
//! example "cycle 2 vs base", MASS.md "Reported results"): the win rate is
//! `W / (W + L)` with ties excluded, as the paper's external judges report
//! it, and the number of ties is always carried alongside so nothing is
//! silently dropped. Uncertainty is a Wilson score interval on the decisive
//! outcomes (`W` successes in `W + L` trials), which behaves well near 0 and 1
//! and for small samples, where the Wald interval does not. Scoring a tie as
//! half a win (AlpacaEval, evalica) is available as a separate point estimate,
//! [`WinRate::rate_ties_as_half`], but gets no interval: a Wilson interval on
//! fractional successes has no exact justification.

use serde::{Deserialize, Serialize};

use crate::bt::{Comparison, Outcome};
use crate::error::RankError;

/// `qnorm(0.975)`: the two-sided 95 % normal quantile, to full precision.
pub const Z_95: f64 = 1.959_963_984_540_054;

/// A closed interval `[lower, upper]` within `[0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Lower bound.
    pub lower: f64,
    /// Upper bound.
    pub upper: f64,
}

/// Wilson score interval for `successes` out of `trials` with normal quantile
/// `z` (use [`Z_95`] for 95 %):
/// `centre = (p + z²/2n) / (1 + z²/n)`,
/// `half = z * sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n)`.
///
/// The bounds are clamped to `[0, 1]`, and are exactly 0 for `successes == 0`
/// and exactly 1 for `successes == trials` (as they are algebraically), so
/// floating-point rounding never shows as `0.9999999999999999`.
///
/// # Errors
/// [`RankError::NoTrials`] when `trials == 0`, [`RankError::InvalidCounts`]
/// when `successes > trials`, [`RankError::InvalidZ`] when `z` is negative or
/// not finite.
pub fn wilson(successes: u64, trials: u64, z: f64) -> Result<Interval, RankError> {
    if !(z.is_finite() && z >= 0.0) {
        return Err(RankError::InvalidZ { z });
    }
    if trials == 0 {
        return Err(RankError::NoTrials);
    }
    if successes > trials {
        return Err(RankError::InvalidCounts { successes, trials });
    }
    let n = trials as f64;
    let p = successes as f64 / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    // At p = 0 (p = 1) the lower (upper) bound is exactly 0 (1)
    // algebraically; set it so rounding cannot report 0.9999999999999999.
    let lower = if successes == 0 { 0.0 } else { centre - half };
    let upper = if successes == trials {
        1.0
    } else {
        centre + half
    };
    Ok(Interval {
        lower: lower.clamp(0.0, 1.0),
        upper: upper.clamp(0.0, 1.0),
    })
}

/// Head-to-head tally of one side: wins, losses and ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WinRate {
    /// Decisive outcomes won.
    pub wins: u64,
    /// Decisive outcomes lost.
    pub losses: u64,
    /// Ties (excluded from [`WinRate::rate`], reported separately).
    pub ties: u64,
}

impl WinRate {
    /// A tally from counts.
    pub fn new(wins: u64, losses: u64, ties: u64) -> Self {
        WinRate { wins, losses, ties }
    }

    /// Tally the comparisons involving `item`, from `item`'s point of view.
    /// Comparisons not involving `item` are ignored.
    pub fn for_item(comparisons: &[Comparison], item: usize) -> Self {
        let mut t = WinRate::default();
        for c in comparisons {
            let won = match (c.outcome, c.a == item, c.b == item) {
                (_, false, false) | (_, true, true) => continue,
                (Outcome::Tie, _, _) => None,
                (Outcome::AWins, is_a, _) => Some(is_a),
                (Outcome::BWins, is_a, _) => Some(!is_a),
            };
            match won {
                Some(true) => t.wins = t.wins.saturating_add(1),
                Some(false) => t.losses = t.losses.saturating_add(1),
                None => t.ties = t.ties.saturating_add(1),
            }
        }
        t
    }

    /// Number of decisive outcomes, `W + L`.
    pub fn decisive(&self) -> u64 {
        self.wins.saturating_add(self.losses)
    }

    /// All outcomes, `W + L + T`.
    pub fn total(&self) -> u64 {
        self.decisive().saturating_add(self.ties)
    }

    /// `W / (W + L)`, ties excluded; `None` when there are no decisive outcomes.
    pub fn rate(&self) -> Option<f64> {
        match self.decisive() {
            0 => None,
            d => Some(self.wins as f64 / d as f64),
        }
    }

    /// `(W + T/2) / (W + L + T)`, the tie-as-half-win convention; `None` when
    /// there are no outcomes at all.
    pub fn rate_ties_as_half(&self) -> Option<f64> {
        match self.total() {
            0 => None,
            t => Some((self.wins as f64 + 0.5 * self.ties as f64) / t as f64),
        }
    }

    /// Wilson interval on `W` successes out of `W + L` trials.
    ///
    /// # Errors
    /// As [`wilson`]; [`RankError::NoTrials`] when every outcome was a tie.
    pub fn wilson(&self, z: f64) -> Result<Interval, RankError> {
        wilson(self.wins, self.decisive(), z)
    }

    /// 95 % Wilson interval ([`Z_95`]).
    ///
    /// # Errors
    /// As [`WinRate::wilson`].
    pub fn wilson95(&self) -> Result<Interval, RankError> {
        self.wilson(Z_95)
    }

    /// Percentile-bootstrap 95 % interval of `W / (W + L)`: `resamples`
    /// samples of `W + L + T` outcomes drawn with replacement from this
    /// tally (ties included, so a resample's decisive count varies, as it
    /// would in a new experiment), the 2.5th and 97.5th percentiles of their
    /// rates (resamples without a decisive outcome are left out).
    /// Deterministic for a given `seed` ([`crate::schedule::SplitMix64`]).
    ///
    /// # Errors
    /// [`RankError::NoTrials`] when there is no decisive outcome.
    pub fn bootstrap95(&self, resamples: usize, seed: u64) -> Result<Interval, RankError> {
        let n = self.total();
        if self.decisive() == 0 {
            return Err(RankError::NoTrials);
        }
        let mut rng = crate::schedule::SplitMix64::new(seed);
        let mut rates = Vec::with_capacity(resamples);
        for _ in 0..resamples {
            let (mut w, mut l) = (0u64, 0u64);
            for _ in 0..n {
                let k = rng.below(n as usize) as u64;
                if k < self.wins {
                    w += 1;
                } else if k < self.wins + self.losses {
                    l += 1;
                }
            }
            if w + l > 0 {
                rates.push(w as f64 / (w + l) as f64);
            }
        }
        rates.sort_by(f64::total_cmp);
        let at = |q: f64| rates[((rates.len() - 1) as f64 * q).round() as usize];
        Ok(Interval {
            lower: at(0.025),
            upper: at(0.975),
        })
    }
}
