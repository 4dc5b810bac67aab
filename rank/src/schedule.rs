//! Seeded pairing schedules: which runs the judge compares.
//!
//! This module owns step 2 of the outer loop (MASS.md): choose, for `n` runs
//! of a task, a set of distinct unordered pairs such that every run meets
//! exactly `k` opponents (a `k`-regular simple graph), the comparison graph is
//! connected (otherwise Bradley-Terry scores of different parts would not be
//! comparable), and each pair has a presentation order (which run the judge
//! sees as "A") that is balanced so every run is shown first about half the
//! time, which keeps a judge's position bias from favouring particular runs.
//! For 18 runs and 6 opponents this gives the paper's 54 pairs.
//!
//! The schedule is a pure function of `(n, k, seed)`: all randomness comes
//! from [`SplitMix64`], a tiny hand-written generator with a fixed, documented
//! output sequence, so a schedule recorded in the ledger can be regenerated
//! bit-for-bit on any platform and by any later version of this crate.
//!
//! Construction (`k >= 2`): a random permutation of the runs is laid on a ring
//! (a Hamiltonian cycle, which makes the graph connected by construction), and
//! the remaining `k - 2` opponents per run are drawn by random stub matching
//! that avoids repeated pairs (Steger-Wormald style), restarting when it gets
//! stuck. When more than half of all possible pairs are needed, the sparser
//! complement (the `n - 1 - k` pairs per run that are *not* played, avoiding
//! the ring) is drawn instead, because stub matching gets stuck easily on dense
//! graphs. After [`MAX_ATTEMPTS`] failed restarts (not observed for the sizes
//! tested) it falls back to a deterministic circulant graph on the same
//! random ring order (offsets `1..=k/2`, plus the diameter `n/2` when `k` is
//! odd), which always exists. The result is therefore random but not uniform
//! over all connected `k`-regular graphs; uniformity is not needed here,
//! connectivity and balance are.

use std::collections::HashSet;

use crate::error::RankError;

/// How many times random stub matching is restarted before falling back to
/// the deterministic circulant construction.
pub const MAX_ATTEMPTS: usize = 32;

/// Upper bound on `n * k / 2` (the number of pairs), so that absurd requests
/// fail with an error instead of exhausting memory.
pub const MAX_PAIRS: usize = 10_000_000;

/// SplitMix64 (Steele, Lea & Flood 2014; the reference C code by Sebastiano
/// Vigna): a 64-bit state advanced by the golden-ratio increment
/// `0x9E3779B97F4A7C15`, output through a fixed avalanche mix. Not
/// cryptographic; chosen because it is tiny, fast, passes BigCrush, and its
/// output for a given seed is fully specified (see the test vector in this
/// module's tests), which keeps schedules reproducible forever.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose first output is the mix of `seed + 0x9E3779B97F4A7C15`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..bound` without modulo bias (Lemire 2019:
    /// multiply-shift with rejection). Returns 0 when `bound` is 0 or 1.
    pub fn below(&mut self, bound: usize) -> usize {
        let bound = bound as u64;
        if bound <= 1 {
            return 0;
        }
        // Values of the low half below `threshold` would make some results
        // one more likely than others; reject them.
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(bound);
            if (m as u64) >= threshold {
                return (m >> 64) as usize;
            }
        }
    }

    /// A fair coin.
    pub fn coin(&mut self) -> bool {
        self.next_u64() >> 63 == 1
    }

    /// Fisher-Yates shuffle in place.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

/// One scheduled comparison, in presentation order: the judge sees run `a` as
/// "A" and run `b` as "B".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pairing {
    /// Run shown first (as A).
    pub a: usize,
    /// Run shown second (as B).
    pub b: usize,
}

impl Pairing {
    /// The unordered pair as `(lower, higher)` run index.
    pub fn pair(&self) -> (usize, usize) {
        if self.a < self.b {
            (self.a, self.b)
        } else {
            (self.b, self.a)
        }
    }
}

/// A connected `opponents_per_run`-regular pairing schedule on `n_runs` runs.
///
/// Returns `n_runs * opponents_per_run / 2` pairings, sorted by
/// [`Pairing::pair`], with distinct unordered pairs. Each run is shown as A in
/// exactly `k/2` of its pairs when `k` is even, and in `(k-1)/2` or `(k+1)/2`
/// when `k` is odd. The result depends only on the arguments.
///
/// # Errors
/// [`RankError::Schedule`] when no such schedule exists: `n_runs == 0`,
/// `k >= n_runs`, `n_runs * k` odd, `k == 0` or `k == 1` with more than 2 runs
/// (cannot be connected), or more than [`MAX_PAIRS`] pairs.
pub fn pairing_schedule(
    n_runs: usize,
    opponents_per_run: usize,
    seed: u64,
) -> Result<Vec<Pairing>, RankError> {
    let n = n_runs;
    let k = opponents_per_run;
    let fail = |reason: &'static str| RankError::Schedule {
        n_runs,
        opponents: opponents_per_run,
        reason,
    };
    if n == 0 {
        return Err(fail("there are no runs"));
    }
    if k >= n {
        return Err(fail(
            "each run can meet at most n_runs - 1 distinct opponents",
        ));
    }
    let stubs = n.checked_mul(k).ok_or_else(|| fail("too many pairs"))?;
    if stubs % 2 != 0 {
        return Err(fail(
            "n_runs * opponents must be even (every pair uses two slots)",
        ));
    }
    if stubs / 2 > MAX_PAIRS {
        return Err(fail("too many pairs (more than MAX_PAIRS)"));
    }
    if k == 0 {
        // Only a single run with no opponents is (trivially) connected.
        return if n == 1 {
            Ok(Vec::new())
        } else {
            Err(fail("runs with no opponents cannot be connected"))
        };
    }
    if k == 1 && n > 2 {
        return Err(fail(
            "with one opponent each, only 2 runs can form a connected schedule",
        ));
    }

    let mut rng = SplitMix64::new(seed);
    let mut ring: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut ring);

    let edges = if k == 1 {
        vec![ordered(ring[0], ring[1])]
    } else {
        let mut base: Vec<(usize, usize)> = (0..n)
            .map(|t| ordered(ring[t], ring[(t + 1) % n]))
            .collect();
        // Stub matching gets stuck easily when almost every pair is needed,
        // so for dense requests draw the (sparser) complement instead: a
        // random (n-1-k)-regular graph avoiding the ring, whose complement
        // is k-regular and still contains the ring.
        let missing = n - 1 - k;
        if missing < k - 2 {
            let omitted = (0..MAX_ATTEMPTS).find_map(|_| random_extra(n, missing, &base, &mut rng));
            match omitted {
                Some(omitted) => complement(n, &omitted),
                None => circulant(&ring, k),
            }
        } else {
            let extra = (0..MAX_ATTEMPTS).find_map(|_| random_extra(n, k - 2, &base, &mut rng));
            match extra {
                Some(extra) => {
                    base.extend(extra);
                    base
                }
                None => circulant(&ring, k),
            }
        }
    };
    let mut schedule = orient(n, &edges, &mut rng);
    schedule.sort_by_key(Pairing::pair);
    Ok(schedule)
}

fn ordered(x: usize, y: usize) -> (usize, usize) {
    if x < y {
        (x, y)
    } else {
        (y, x)
    }
}

/// Random `d`-regular simple graph on `n` vertices avoiding the pairs in
/// `existing`, by random stub matching with rejection of loops and repeats.
/// `None` when it gets stuck (the caller restarts).
fn random_extra(
    n: usize,
    d: usize,
    existing: &[(usize, usize)],
    rng: &mut SplitMix64,
) -> Option<Vec<(usize, usize)>> {
    if d == 0 {
        return Some(Vec::new());
    }
    let mut taken: HashSet<(usize, usize)> = existing.iter().copied().collect();
    let mut stubs: Vec<usize> = (0..n).flat_map(|v| std::iter::repeat_n(v, d)).collect();
    let mut out = Vec::with_capacity(n * d / 2);
    // A few blind draws are almost always enough; scan for the valid partners
    // only when they fail, so the common case is O(1) per pair.
    const BLIND_TRIES: usize = 16;
    while !stubs.is_empty() {
        let ui = rng.below(stubs.len());
        let u = stubs[ui];
        let valid =
            |v: usize, taken: &HashSet<(usize, usize)>| v != u && !taken.contains(&ordered(u, v));
        let mut chosen = None;
        for _ in 0..BLIND_TRIES {
            let vi = rng.below(stubs.len());
            if valid(stubs[vi], &taken) {
                chosen = Some(vi);
                break;
            }
        }
        if chosen.is_none() {
            let candidates: Vec<usize> = (0..stubs.len())
                .filter(|&vi| valid(stubs[vi], &taken))
                .collect();
            if candidates.is_empty() {
                return None;
            }
            chosen = Some(candidates[rng.below(candidates.len())]);
        }
        let vi = chosen?;
        let pair = ordered(u, stubs[vi]);
        taken.insert(pair);
        out.push(pair);
        // Remove the higher index first so the lower one stays valid.
        let (hi, lo) = if ui > vi { (ui, vi) } else { (vi, ui) };
        stubs.swap_remove(hi);
        stubs.swap_remove(lo);
    }
    Some(out)
}

/// All pairs of `0..n` except those in `omitted`.
fn complement(n: usize, omitted: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let omitted: HashSet<(usize, usize)> = omitted.iter().copied().collect();
    (0..n)
        .flat_map(|i| ((i + 1)..n).map(move |j| (i, j)))
        .filter(|pair| !omitted.contains(pair))
        .collect()
}

/// Deterministic fallback: circulant graph on the ring order with offsets
/// `1..=k/2`, plus offset `n/2` when `k` is odd (then `n` is even). For
/// `2 <= k < n` the offsets are distinct and below `n/2`, so the pairs are
/// distinct, every vertex has degree `k`, and offset 1 makes it connected.
fn circulant(ring: &[usize], k: usize) -> Vec<(usize, usize)> {
    let n = ring.len();
    let mut edges = Vec::with_capacity(n * k / 2);
    for offset in 1..=k / 2 {
        for t in 0..n {
            edges.push(ordered(ring[t], ring[(t + offset) % n]));
        }
    }
    if k % 2 == 1 {
        let half = n / 2;
        for t in 0..half {
            edges.push(ordered(ring[t], ring[t + half]));
        }
    }
    edges
}

/// Choose presentation orders so every run is A about half the time.
///
/// Orienting each edge along an Euler circuit gives every vertex equal in- and
/// out-degree. Degrees are `k`; when `k` is odd, a dummy perfect matching
/// (random, possibly parallel to real edges) first makes them even, and
/// dropping it afterwards leaves each run off balance by exactly one. The
/// walk's start, the order in which edges are tried, and a final global flip
/// are all seeded.
fn orient(n: usize, edges: &[(usize, usize)], rng: &mut SplitMix64) -> Vec<Pairing> {
    let mut all: Vec<(usize, usize)> = edges.to_vec();
    let real = edges.len();
    let mut degree = vec![0usize; n];
    for &(x, y) in edges {
        degree[x] += 1;
        degree[y] += 1;
    }
    let mut odd: Vec<usize> = (0..n).filter(|&v| degree[v] % 2 == 1).collect();
    rng.shuffle(&mut odd);
    for pair in odd.chunks_exact(2) {
        all.push((pair[0], pair[1]));
    }
    let mut incident: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (e, &(x, y)) in all.iter().enumerate() {
        incident[x].push(e);
        incident[y].push(e);
    }
    for list in incident.iter_mut() {
        rng.shuffle(list);
    }
    let mut used = vec![false; all.len()];
    let mut cursor = vec![0usize; n];
    let mut direction: Vec<Option<(usize, usize)>> = vec![None; all.len()];
    let mut starts: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut starts);
    for start in starts {
        // Hierholzer-style walk: every maximal walk in an even-degree graph is
        // a closed trail, so orienting edges in walk direction balances them.
        let mut stack = vec![start];
        while let Some(&v) = stack.last() {
            let mut advanced = false;
            while cursor[v] < incident[v].len() {
                let e = incident[v][cursor[v]];
                cursor[v] += 1;
                if used[e] {
                    continue;
                }
                used[e] = true;
                let (x, y) = all[e];
                let w = if x == v { y } else { x };
                direction[e] = Some((v, w));
                stack.push(w);
                advanced = true;
                break;
            }
            if !advanced {
                stack.pop();
            }
        }
    }
    let flip = rng.coin();
    (0..real)
        .map(|e| {
            let (a, b) = direction[e].unwrap_or(all[e]);
            if flip {
                Pairing { a: b, b: a }
            } else {
                Pairing { a, b }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_vector() {
        // Published test vector for seed 1234567 (e.g. Rosetta Code,
        // "Pseudo-random numbers/Splitmix64").
        let mut rng = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
        assert_eq!(
            got,
            vec![
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423,
                4_593_380_528_125_082_431,
                16_408_922_859_458_223_821,
            ]
        );
    }

    #[test]
    fn below_stays_in_range_and_handles_degenerate_bounds() {
        let mut rng = SplitMix64::new(7);
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.below(1), 0);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let x = rng.below(7);
            assert!(x < 7);
            seen[x] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn circulant_fallback_is_regular_for_all_small_cases() {
        for n in 3..30 {
            for k in 2..n {
                if n * k % 2 == 1 {
                    continue;
                }
                let ring: Vec<usize> = (0..n).rev().collect();
                let edges = circulant(&ring, k);
                let distinct: HashSet<_> = edges.iter().copied().collect();
                assert_eq!(distinct.len(), n * k / 2, "n={n} k={k}");
                let mut deg = vec![0; n];
                for (x, y) in edges {
                    assert_ne!(x, y);
                    deg[x] += 1;
                    deg[y] += 1;
                }
                assert!(deg.iter().all(|&d| d == k), "n={n} k={k}");
            }
        }
    }

    /// The deterministic circulant should be a last resort: for the sizes the
    /// outer loop uses (and denser ones, which go through the complement),
    /// random construction succeeds within the attempt budget.
    #[test]
    fn random_construction_does_not_need_the_fallback() {
        for (n, k) in [
            (18, 6),
            (18, 3),
            (18, 9),
            (18, 16),
            (10, 7),
            (6, 3),
            (40, 20),
        ] {
            for seed in 0..200u64 {
                let mut rng = SplitMix64::new(seed);
                let mut ring: Vec<usize> = (0..n).collect();
                rng.shuffle(&mut ring);
                let base: Vec<(usize, usize)> = (0..n)
                    .map(|t| ordered(ring[t], ring[(t + 1) % n]))
                    .collect();
                let d = (n - 1 - k).min(k - 2);
                let ok = (0..MAX_ATTEMPTS).any(|_| random_extra(n, d, &base, &mut rng).is_some());
                assert!(ok, "n={n} k={k} seed={seed} fell back to the circulant");
            }
        }
    }
}
