//! Bradley-Terry scores from pairwise verdicts.
//!
//! This module owns the statistical model of the outer loop's ranking step
//! (MASS.md, "Outer loop", step 3): given comparisons between items (runs),
//! it fits log-strengths `theta` such that `P(i beats j) = sigma(theta_i -
//! theta_j)`, counting a tie as half a win for each side, and turns them into
//! scores and ranks.
//!
//! Three objectives are available through [`Prior`]:
//!
//! * [`Prior::Virtual`] (the default, `0.5`, the setting MASS.md attributes
//!   to the reference code):
//!   every item additionally gets `v` virtual wins and `v` virtual losses
//!   against a virtual "average player" whose log-strength is fixed at 0. This
//!   is a proper penalised likelihood with a unique, finite maximum for every
//!   input, so an item that never wins (or never loses) still gets a finite
//!   score. Fitted with Hunter's (2004) MM iteration, treating the virtual
//!   player as one more opponent of fixed strength.
//! * [`Prior::None`]: the pure maximum-likelihood estimate, fitted with the
//!   same MM iteration. It exists only when the "beat or tied" graph is
//!   strongly connected; otherwise [`fit`] returns
//!   [`RankError::MleDoesNotExist`] naming an item of the offending group
//!   instead of iterating forever towards infinite scores.
//! * [`Prior::L2`]: `penalty * sum(theta^2)` added to the negative
//!   log-likelihood (the objective of `PairwiseFcts` in choix's `opt.py`,
//!   whose published estimate the tests reproduce). The Gaussian penalty has no MM form of Hunter's kind,
//!   so this one is solved with damped Newton steps; it is provided so results
//!   can be compared with tools that regularise this way.
//!
//! Reported scores are natural-log strengths shifted to mean 0 (so
//! `exp(score)` are strengths with geometric mean 1). With the virtual prior
//! the virtual player is fixed at log-strength 0 *during fitting*; at the
//! optimum the items' mean win probability against it is exactly 1/2, so it
//! sits at the centre of the field and the final mean shift is small, but an
//! item with no comparisons (which stays at the virtual player's level) scores
//! exactly 0 only when the field is symmetric around the virtual player.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{ItemLabel, MleObstacle, RankError};

/// The verdict of one comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Outcome {
    /// The item shown as `a` won.
    AWins,
    /// The item shown as `b` won.
    BWins,
    /// Neither won; counts as half a win for each side.
    Tie,
}

/// One pairwise comparison between items `a` and `b` (indices into the item list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Comparison {
    /// First item (shown as A).
    pub a: usize,
    /// Second item (shown as B).
    pub b: usize,
    /// The verdict.
    pub outcome: Outcome,
}

/// Which objective to maximise; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Prior {
    /// Pure maximum likelihood; errors when it does not exist.
    None,
    /// `v` virtual wins and `v` virtual losses per item against a virtual
    /// player of log-strength 0. `v` must be finite and `> 0`.
    Virtual(f64),
    /// Gaussian (ridge) penalty `penalty * sum(theta^2)` on log-strengths.
    /// `penalty` must be finite and `> 0`.
    L2(f64),
}

impl Default for Prior {
    /// The MASS reference setting: 0.5 virtual win and 0.5 virtual loss.
    fn default() -> Self {
        Prior::Virtual(0.5)
    }
}

/// Options for [`fit`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FitOptions {
    /// The objective.
    pub prior: Prior,
    /// Stop when no log-strength moved by more than this in one iteration.
    /// Must be finite and `> 0`. Default `1e-10`: far below any difference
    /// that matters for ranking, and cheap for the problem sizes here.
    pub tolerance: f64,
    /// Give up (reporting `converged: false`) after this many iterations.
    /// Must be `>= 1`. Default `100_000`: MM converges linearly and can be slow
    /// on sparse, nearly separable data, but each iteration costs only
    /// O(number of distinct pairs).
    pub max_iterations: usize,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            prior: Prior::default(),
            tolerance: 1e-10,
            max_iterations: 100_000,
        }
    }
}

/// The fitted score of one item.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rating {
    /// Item index.
    pub item: usize,
    /// Natural-log strength, shifted so that the scores of all items sum to 0.
    pub score: f64,
    /// 1 = best. Unique; scores equal to within [`RANK_TIE_EPSILON`] are
    /// ordered by item index (lower index first).
    pub rank: usize,
    /// Real comparisons won (virtual prior games are not counted).
    pub wins: u32,
    /// Real comparisons lost.
    pub losses: u32,
    /// Real comparisons tied.
    pub ties: u32,
}

/// The result of [`fit`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    /// One rating per item, indexed by item (`ratings[i].item == i`).
    pub ratings: Vec<Rating>,
    /// Iterations performed (MM sweeps, or Newton steps for [`Prior::L2`]).
    pub iterations: usize,
    /// Whether the tolerance was reached within `max_iterations`.
    pub converged: bool,
}

impl Fit {
    /// The ratings ordered by rank (best first).
    pub fn by_rank(&self) -> Vec<&Rating> {
        let mut out: Vec<&Rating> = self.ratings.iter().collect();
        out.sort_by_key(|r| r.rank);
        out
    }
}

/// Scores closer than this are treated as equal when assigning ranks, so that
/// items that are exactly symmetric in the data (and differ only by floating
/// point rounding) are ordered by index rather than by rounding noise. It is
/// well below the default fit tolerance's effect on any real difference.
pub const RANK_TIE_EPSILON: f64 = 1e-9;

/// Largest `n_items` accepted by the MM fits ([`Prior::None`],
/// [`Prior::Virtual`]); memory is O(items + distinct pairs).
pub const MAX_ITEMS: usize = 10_000_000;

/// Largest `n_items` accepted by [`Prior::L2`], whose Newton solver uses a
/// dense `n x n` Hessian (32 MB at this size) and O(n^3) time per step.
pub const MAX_L2_ITEMS: usize = 2_000;

/// Fit Bradley-Terry scores for `n_items` items.
///
/// Comparisons must refer to items `< n_items` and compare two different
/// items. Returns one [`Rating`] per item, indexed by item.
///
/// # Errors
/// [`RankError::ItemOutOfRange`], [`RankError::SelfComparison`],
/// [`RankError::InvalidOption`], [`RankError::TooManyItems`] for bad input;
/// with [`Prior::None`] also
/// [`RankError::NoComparisons`] and [`RankError::MleDoesNotExist`].
pub fn fit(
    n_items: usize,
    comparisons: &[Comparison],
    opts: &FitOptions,
) -> Result<Fit, RankError> {
    validate_options(opts)?;
    let max = match opts.prior {
        Prior::L2(_) => MAX_L2_ITEMS,
        Prior::None | Prior::Virtual(_) => MAX_ITEMS,
    };
    if n_items > max {
        return Err(RankError::TooManyItems { n_items, max });
    }
    let data = Tally::new(n_items, comparisons)?;
    if n_items == 0 {
        return Ok(Fit {
            ratings: Vec::new(),
            iterations: 0,
            converged: true,
        });
    }
    let solution = match opts.prior {
        Prior::None => {
            check_mle_exists(&data)?;
            mm(&data, None, opts)?
        }
        Prior::Virtual(v) => mm(&data, Some(v), opts)?,
        Prior::L2(penalty) => newton_l2(&data, penalty, opts)?,
    };
    Ok(finish(&data, solution))
}

/// Like [`fit`], but items are given by name (`names.len()` items) and errors
/// name the item as well as its index.
///
/// # Errors
/// As [`fit`].
pub fn fit_named<S: AsRef<str>>(
    names: &[S],
    comparisons: &[Comparison],
    opts: &FitOptions,
) -> Result<Fit, RankError> {
    fit(names.len(), comparisons, opts).map_err(|e| attach_names(e, names))
}

fn attach_names<S: AsRef<str>>(err: RankError, names: &[S]) -> RankError {
    let name = |label: ItemLabel| ItemLabel {
        name: names.get(label.index).map(|s| s.as_ref().to_string()),
        index: label.index,
    };
    match err {
        RankError::SelfComparison { comparison, item } => RankError::SelfComparison {
            comparison,
            item: name(item),
        },
        RankError::NoComparisons { item } => RankError::NoComparisons { item: name(item) },
        RankError::MleDoesNotExist {
            item,
            group_size,
            obstacle,
        } => RankError::MleDoesNotExist {
            item: name(item),
            group_size,
            obstacle,
        },
        other => other,
    }
}

fn validate_options(opts: &FitOptions) -> Result<(), RankError> {
    if !(opts.tolerance.is_finite() && opts.tolerance > 0.0) {
        return Err(RankError::InvalidOption {
            option: "tolerance",
            reason: format!("must be finite and > 0, got {}", opts.tolerance),
        });
    }
    if opts.max_iterations == 0 {
        return Err(RankError::InvalidOption {
            option: "max_iterations",
            reason: "must be at least 1".to_string(),
        });
    }
    match opts.prior {
        Prior::None => {}
        Prior::Virtual(v) if !(v.is_finite() && v > 0.0) => {
            return Err(RankError::InvalidOption {
                option: "prior",
                reason: format!(
                    "virtual games must be finite and > 0, got {v} (use Prior::None for no prior)"
                ),
            })
        }
        Prior::L2(p) if !(p.is_finite() && p > 0.0) => {
            return Err(RankError::InvalidOption {
                option: "prior",
                reason: format!(
                    "L2 penalty must be finite and > 0, got {p} (use Prior::None for no prior)"
                ),
            })
        }
        Prior::Virtual(_) | Prior::L2(_) => {}
    }
    Ok(())
}

/// The data reduced to what the fits need: per distinct unordered pair, the
/// (fractional) wins of each side; per item, total (fractional) wins and the
/// integer counts that are reported back.
struct Tally {
    n: usize,
    /// `(i, j, w_ij, w_ji)` with `i < j`; `w_ij` counts i's wins plus half its
    /// ties against j. Sorted by `(i, j)` so the arithmetic order (and hence
    /// rounding) depends only on the multiset of comparisons.
    pairs: Vec<(usize, usize, f64, f64)>,
    /// For each item, `(opponent, games)` over distinct opponents.
    neighbours: Vec<Vec<(usize, f64)>>,
    /// For each item, wins plus half ties.
    wins: Vec<f64>,
    counts: Vec<(u32, u32, u32)>,
}

impl Tally {
    fn new(n: usize, comparisons: &[Comparison]) -> Result<Self, RankError> {
        let mut by_pair: BTreeMap<(usize, usize), (f64, f64)> = BTreeMap::new();
        let mut counts = vec![(0u32, 0u32, 0u32); n];
        for (idx, c) in comparisons.iter().enumerate() {
            for item in [c.a, c.b] {
                if item >= n {
                    return Err(RankError::ItemOutOfRange {
                        comparison: idx,
                        item,
                        n_items: n,
                    });
                }
            }
            if c.a == c.b {
                return Err(RankError::SelfComparison {
                    comparison: idx,
                    item: ItemLabel::index(c.a),
                });
            }
            // Credit to (a, b) in a's and b's favour; a tie is half a win each.
            let (wa, wb) = match c.outcome {
                Outcome::AWins => {
                    bump(&mut counts, c.a, 0);
                    bump(&mut counts, c.b, 1);
                    (1.0, 0.0)
                }
                Outcome::BWins => {
                    bump(&mut counts, c.b, 0);
                    bump(&mut counts, c.a, 1);
                    (0.0, 1.0)
                }
                Outcome::Tie => {
                    bump(&mut counts, c.a, 2);
                    bump(&mut counts, c.b, 2);
                    (0.5, 0.5)
                }
            };
            let (key, wi, wj) = if c.a < c.b {
                ((c.a, c.b), wa, wb)
            } else {
                ((c.b, c.a), wb, wa)
            };
            let entry = by_pair.entry(key).or_insert((0.0, 0.0));
            entry.0 += wi;
            entry.1 += wj;
        }
        let mut neighbours = vec![Vec::new(); n];
        let mut wins = vec![0.0; n];
        let mut pairs = Vec::with_capacity(by_pair.len());
        for (&(i, j), &(wij, wji)) in &by_pair {
            let games = wij + wji;
            neighbours[i].push((j, games));
            neighbours[j].push((i, games));
            wins[i] += wij;
            wins[j] += wji;
            pairs.push((i, j, wij, wji));
        }
        Ok(Tally {
            n,
            pairs,
            neighbours,
            wins,
            counts,
        })
    }
}

fn bump(counts: &mut [(u32, u32, u32)], item: usize, which: usize) {
    if let Some(c) = counts.get_mut(item) {
        let slot = match which {
            0 => &mut c.0,
            1 => &mut c.1,
            _ => &mut c.2,
        };
        *slot = slot.saturating_add(1);
    }
}

/// Logistic function, written so that neither branch overflows.
fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `-ln(sigmoid(x)) = ln(1 + e^-x)`, without overflow for large |x|.
fn neg_log_sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        (-x).exp().ln_1p()
    } else {
        -x + x.exp().ln_1p()
    }
}

struct Solution {
    theta: Vec<f64>,
    iterations: usize,
    converged: bool,
}

/// Hunter's (2004) MM iteration, simultaneous form.
///
/// The classic update `p_i <- W_i / sum_j n_ij / (p_i + p_j)` is rewritten on
/// the log scale as `theta_i += ln(observed_i / expected_i)` where
/// `expected_i = sum_j n_ij * sigma(theta_i - theta_j)`; the two are
/// algebraically identical, but this form never forms `exp(theta)` and so
/// cannot overflow. With a virtual prior `v`, the virtual player (log-strength
/// 0) is one more opponent met `2v` times of which `i` won `v`.
///
/// Without a prior the likelihood is shift-invariant, so the iterate is
/// re-centred to mean 0 after every sweep (this does not change the MM
/// property: the objective is unchanged by the shift).
///
/// With a prior only the few virtual games pin the overall level, so MM alone
/// moves the common shift very slowly when real games dominate (10 000 real
/// games against 1 virtual one took more than 100 000 sweeps). After each
/// sweep the shift is therefore set to its exact optimum given the
/// differences (see [`recentre_on_virtual_player`]); an exact maximisation
/// along one direction can only increase the objective, so the combined
/// iteration is still monotone and has the same fixed point.
fn mm(data: &Tally, virtual_games: Option<f64>, opts: &FitOptions) -> Result<Solution, RankError> {
    let n = data.n;
    let v = virtual_games.unwrap_or(0.0);
    let mut theta = vec![0.0; n];
    let mut next = vec![0.0; n];
    let mut iterations = 0;
    let mut converged = false;
    while iterations < opts.max_iterations {
        iterations += 1;
        for i in 0..n {
            let observed = data.wins[i] + v;
            let mut expected = 2.0 * v * sigmoid(theta[i]);
            for &(j, games) in &data.neighbours[i] {
                expected += games * sigmoid(theta[i] - theta[j]);
            }
            next[i] = if observed > 0.0 && expected > 0.0 {
                theta[i] + (observed / expected).ln()
            } else {
                // Unreachable after validation (every item has games and, for
                // the MLE, at least half a win); flag it rather than emit NaN.
                f64::NAN
            };
        }
        if virtual_games.is_none() {
            centre(&mut next);
        } else {
            recentre_on_virtual_player(&mut next);
        }
        let mut delta: f64 = 0.0;
        for (new, old) in next.iter().zip(&theta) {
            if !new.is_finite() {
                return Err(RankError::Numerical {
                    iteration: iterations,
                    what: "a log-strength became non-finite".to_string(),
                });
            }
            delta = delta.max((new - old).abs());
        }
        std::mem::swap(&mut theta, &mut next);
        if delta < opts.tolerance {
            converged = true;
            break;
        }
    }
    Ok(Solution {
        theta,
        iterations,
        converged,
    })
}

/// Damped Newton's method for the L2-penalised objective
/// `f(theta) = penalty * |theta|^2 + sum_pairs [w_ij * -ln sigma(theta_i - theta_j)
///  + w_ji * -ln sigma(theta_j - theta_i)]`.
///
/// `f` is strictly convex (the penalty makes the Hessian at least
/// `2 * penalty * I`), so Newton steps with Armijo backtracking converge to the
/// unique minimum from any start. Cost is O(n^3) per step for the dense
/// Cholesky solve, negligible for the tens of items a task ranks.
fn newton_l2(data: &Tally, penalty: f64, opts: &FitOptions) -> Result<Solution, RankError> {
    let n = data.n;
    let objective = |theta: &[f64]| -> f64 {
        let mut f = penalty * theta.iter().map(|t| t * t).sum::<f64>();
        for &(i, j, wij, wji) in &data.pairs {
            let d = theta[i] - theta[j];
            f += wij * neg_log_sigmoid(d) + wji * neg_log_sigmoid(-d);
        }
        f
    };
    let mut theta = vec![0.0; n];
    let mut f_cur = objective(&theta);
    let mut iterations = 0;
    let mut converged = false;
    while iterations < opts.max_iterations {
        iterations += 1;
        let mut grad: Vec<f64> = theta.iter().map(|t| 2.0 * penalty * t).collect();
        let mut hess = vec![0.0; n * n];
        for h in hess.iter_mut().step_by(n + 1) {
            *h = 2.0 * penalty;
        }
        for &(i, j, wij, wji) in &data.pairs {
            let s = sigmoid(theta[i] - theta[j]);
            // d/d theta_i of the pair's loss: -w_ij (1 - s) + w_ji s.
            let g = -wij * (1.0 - s) + wji * s;
            grad[i] += g;
            grad[j] -= g;
            let h = (wij + wji) * s * (1.0 - s);
            hess[i * n + i] += h;
            hess[j * n + j] += h;
            hess[i * n + j] -= h;
            hess[j * n + i] -= h;
        }
        let neg_grad: Vec<f64> = grad.iter().map(|g| -g).collect();
        let step = cholesky_solve(&mut hess, n, &neg_grad).ok_or_else(|| RankError::Numerical {
            iteration: iterations,
            what: "Hessian is not positive definite".to_string(),
        })?;
        let slope: f64 = grad.iter().zip(&step).map(|(g, s)| g * s).sum();
        // Armijo backtracking; a full step is accepted near the optimum.
        let mut t = 1.0;
        let mut candidate: Vec<f64>;
        loop {
            candidate = theta.iter().zip(&step).map(|(x, s)| x + t * s).collect();
            let f_new = objective(&candidate);
            if f_new <= f_cur + 1e-4 * t * slope || t < 1e-12 {
                f_cur = f_new;
                break;
            }
            t *= 0.5;
        }
        let delta = step.iter().fold(0.0f64, |m, s| m.max((t * s).abs()));
        if !delta.is_finite() || candidate.iter().any(|x| !x.is_finite()) {
            return Err(RankError::Numerical {
                iteration: iterations,
                what: "a log-strength became non-finite".to_string(),
            });
        }
        theta = candidate;
        if delta < opts.tolerance {
            converged = true;
            break;
        }
    }
    Ok(Solution {
        theta,
        iterations,
        converged,
    })
}

/// Solve `A x = b` for symmetric positive definite `A` (row-major, n x n) by
/// Cholesky factorisation in place. Returns `None` if `A` is not positive
/// definite.
fn cholesky_solve(a: &mut [f64], n: usize, b: &[f64]) -> Option<Vec<f64>> {
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[j * n + k] * a[j * n + k];
        }
        if !(d > 0.0 && d.is_finite()) {
            return None;
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        for i in (j + 1)..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= a[i * n + k] * a[j * n + k];
            }
            a[i * n + j] = s / d;
        }
    }
    // Forward substitution L y = b, then back substitution L^T x = y.
    let mut y = b.to_vec();
    for i in 0..n {
        let mut s = y[i];
        for k in 0..i {
            s -= a[i * n + k] * y[k];
        }
        y[i] = s / a[i * n + i];
    }
    for i in (0..n).rev() {
        let mut s = y[i];
        for k in (i + 1)..n {
            s -= a[k * n + i] * y[k];
        }
        y[i] = s / a[i * n + i];
    }
    Some(y)
}

/// Shift all log-strengths by the constant that maximises the virtual-prior
/// terms `sum_i v [ln sigma(theta_i + c) + ln sigma(-theta_i - c)]` (the real
/// games do not depend on a common shift). Setting the derivative to zero
/// gives `sum_i tanh((theta_i + c) / 2) = 0`: the virtual player is placed
/// where the items' mean win probability against it is exactly 1/2. The
/// left side increases in `c` and changes sign on `[-max, -min]`, so
/// bisection finds the root.
fn recentre_on_virtual_player(theta: &mut [f64]) {
    let (min, max) = theta
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &t| {
            (lo.min(t), hi.max(t))
        });
    if !(min.is_finite() && max.is_finite()) {
        return; // the caller reports non-finite values
    }
    let g = |c: f64| theta.iter().map(|t| ((t + c) / 2.0).tanh()).sum::<f64>();
    let (mut lo, mut hi) = (-max, -min);
    // 200 halvings exhaust f64 precision for any finite bracket; stop early
    // once the bracket no longer shrinks.
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if g(mid) < 0.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let c = 0.5 * (lo + hi);
    for t in theta.iter_mut() {
        *t += c;
    }
}

fn centre(theta: &mut [f64]) {
    if theta.is_empty() {
        return;
    }
    let mean = theta.iter().sum::<f64>() / theta.len() as f64;
    for t in theta.iter_mut() {
        *t -= mean;
    }
}

/// Check the Ford/Hunter condition for the pure MLE: no item without games,
/// and the directed graph "i beat (or tied) j" strongly connected.
fn check_mle_exists(data: &Tally) -> Result<(), RankError> {
    let n = data.n;
    if let Some(item) = (0..n).find(|&i| data.neighbours[i].is_empty()) {
        return Err(RankError::NoComparisons {
            item: ItemLabel::index(item),
        });
    }
    // Undirected connectivity first: a disconnected design is a different
    // (and more useful to report) problem than a lopsided result.
    let component = undirected_component_of_zero(data);
    if let Some(item) = (0..n).find(|&i| !component[i]) {
        let group_size = component.iter().filter(|&&c| !c).count();
        return Err(RankError::MleDoesNotExist {
            item: ItemLabel::index(item),
            group_size,
            obstacle: MleObstacle::Disconnected,
        });
    }
    // beats[i] = items that i beat or tied (half a win counts).
    let mut beats: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(i, j, wij, wji) in &data.pairs {
        if wij > 0.0 {
            beats[i].push(j);
        }
        if wji > 0.0 {
            beats[j].push(i);
        }
    }
    let comp = strongly_connected_components(&beats);
    let n_comp = comp.iter().copied().max().map_or(0, |m| m + 1);
    if n_comp <= 1 {
        return Ok(());
    }
    // For each component: size, lowest item, and whether anything outside
    // beats into it (then it is not a "never lost" source) or it beats out
    // (then it is not a "never won" sink).
    let mut size = vec![0usize; n_comp];
    let mut lowest = vec![usize::MAX; n_comp];
    let mut beaten_from_outside = vec![false; n_comp];
    let mut beats_outside = vec![false; n_comp];
    for i in 0..n {
        size[comp[i]] += 1;
        lowest[comp[i]] = lowest[comp[i]].min(i);
        for &j in &beats[i] {
            if comp[i] != comp[j] {
                beats_outside[comp[i]] = true;
                beaten_from_outside[comp[j]] = true;
            }
        }
    }
    // Report the smallest offending group (a single undefeated or winless
    // item is the clearest message); ties go to "never lost", then lowest item.
    let mut best: Option<(usize, u8, usize, MleObstacle)> = None;
    for c in 0..n_comp {
        let candidates = [
            (!beaten_from_outside[c], 0u8, MleObstacle::NeverLost),
            (!beats_outside[c], 1u8, MleObstacle::NeverWon),
        ];
        for (applies, order, obstacle) in candidates {
            if !applies {
                continue;
            }
            let key = (size[c], order, lowest[c], obstacle);
            let better = match best {
                None => true,
                Some((s, o, l, _)) => (key.0, key.1, key.2) < (s, o, l),
            };
            if better {
                best = Some(key);
            }
        }
    }
    match best {
        Some((group_size, _, item, obstacle)) => Err(RankError::MleDoesNotExist {
            item: ItemLabel::index(item),
            group_size,
            obstacle,
        }),
        // A condensation with >= 2 nodes always has a source; keep a safe
        // answer anyway rather than assert.
        None => Err(RankError::MleDoesNotExist {
            item: ItemLabel::index(0),
            group_size: size.first().copied().unwrap_or(1),
            obstacle: MleObstacle::NeverLost,
        }),
    }
}

fn undirected_component_of_zero(data: &Tally) -> Vec<bool> {
    let mut seen = vec![false; data.n];
    let mut stack = vec![0usize];
    if let Some(s) = seen.first_mut() {
        *s = true;
    }
    while let Some(i) = stack.pop() {
        for &(j, _) in &data.neighbours[i] {
            if !seen[j] {
                seen[j] = true;
                stack.push(j);
            }
        }
    }
    seen
}

/// Kosaraju's algorithm with explicit stacks (no recursion, so no stack
/// overflow on large inputs). Returns a component id per node.
fn strongly_connected_components(adj: &[Vec<usize>]) -> Vec<usize> {
    let n = adj.len();
    let mut radj: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, outs) in adj.iter().enumerate() {
        for &j in outs {
            radj[j].push(i);
        }
    }
    // Pass 1: post-order on the forward graph.
    let mut visited = vec![false; n];
    let mut order = Vec::with_capacity(n);
    for start in 0..n {
        if visited[start] {
            continue;
        }
        visited[start] = true;
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        while let Some(top) = stack.last_mut() {
            let (node, edge) = *top;
            if let Some(&j) = adj[node].get(edge) {
                top.1 += 1;
                if !visited[j] {
                    visited[j] = true;
                    stack.push((j, 0));
                }
            } else {
                order.push(node);
                stack.pop();
            }
        }
    }
    // Pass 2: on the reversed graph in reverse post-order.
    let mut comp = vec![usize::MAX; n];
    let mut next_id = 0;
    for &start in order.iter().rev() {
        if comp[start] != usize::MAX {
            continue;
        }
        comp[start] = next_id;
        let mut stack = vec![start];
        while let Some(i) = stack.pop() {
            for &j in &radj[i] {
                if comp[j] == usize::MAX {
                    comp[j] = next_id;
                    stack.push(j);
                }
            }
        }
        next_id += 1;
    }
    comp
}

fn finish(data: &Tally, solution: Solution) -> Fit {
    let mut theta = solution.theta;
    centre(&mut theta);
    let mut order: Vec<usize> = (0..data.n).collect();
    // Quantise for ranking only (see RANK_TIE_EPSILON); `as` saturates, so
    // this cannot overflow even for absurd scores.
    let key = |i: usize| (theta[i] / RANK_TIE_EPSILON).round() as i64;
    order.sort_by(|&x, &y| key(y).cmp(&key(x)).then(x.cmp(&y)));
    let mut rank = vec![0usize; data.n];
    for (pos, &item) in order.iter().enumerate() {
        rank[item] = pos + 1;
    }
    let ratings = (0..data.n)
        .map(|i| {
            let (wins, losses, ties) = data.counts[i];
            Rating {
                item: i,
                score: theta[i],
                rank: rank[i],
                wins,
                losses,
                ties,
            }
        })
        .collect();
    Fit {
        ratings,
        iterations: solution.iterations,
        converged: solution.converged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmoid_is_stable_at_extremes() {
        assert_eq!(sigmoid(1000.0), 1.0);
        assert_eq!(sigmoid(-1000.0), 0.0);
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-15);
        assert!(neg_log_sigmoid(1000.0).abs() < 1e-300);
        assert!((neg_log_sigmoid(-1000.0) - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn cholesky_solves_small_system() {
        let mut a = vec![4.0, 2.0, 2.0, 3.0];
        let x = cholesky_solve(&mut a, 2, &[2.0, 1.0]).unwrap();
        // 4x + 2y = 2, 2x + 3y = 1 -> x = 0.5, y = 0
        assert!((x[0] - 0.5).abs() < 1e-12 && x[1].abs() < 1e-12);
        let mut not_pd = vec![0.0, 1.0, 1.0, 0.0];
        assert!(cholesky_solve(&mut not_pd, 2, &[1.0, 1.0]).is_none());
    }

    #[test]
    fn scc_finds_cycle_and_tail() {
        // 0 -> 1 -> 2 -> 0, 2 -> 3
        let adj = vec![vec![1], vec![2], vec![0, 3], vec![]];
        let c = strongly_connected_components(&adj);
        assert_eq!(c[0], c[1]);
        assert_eq!(c[1], c[2]);
        assert_ne!(c[2], c[3]);
    }
}
