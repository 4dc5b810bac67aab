//! Properties of the Bradley-Terry fit that follow from the model itself:
//! hand-solved cases, ties as half wins, invariance under relabelling, the
//! prior's effect, error reporting, and robustness on arbitrary input.

use rank::bt::{fit, fit_named, Comparison, Fit, FitOptions, Outcome, Prior, RANK_TIE_EPSILON};
use rank::schedule::SplitMix64;
use rank::{MleObstacle, RankError};

fn win(a: usize, b: usize) -> Comparison {
    Comparison {
        a,
        b,
        outcome: Outcome::AWins,
    }
}

fn tie(a: usize, b: usize) -> Comparison {
    Comparison {
        a,
        b,
        outcome: Outcome::Tie,
    }
}

fn mle() -> FitOptions {
    FitOptions {
        prior: Prior::None,
        ..FitOptions::default()
    }
}

fn scores(f: &Fit) -> Vec<f64> {
    f.ratings.iter().map(|r| r.score).collect()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Bisection for an increasing function's root in [lo, hi]; independent of the
/// crate's MM code.
fn bisect(f: impl Fn(f64) -> f64, mut lo: f64, mut hi: f64) -> f64 {
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if f(mid) < 0.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

#[test]
fn hand_computed_two_items_mle() {
    // A beats B twice, B beats A once: the MLE has p_A / p_B = 2, so the
    // centred log-strengths are +-ln(2)/2.
    let f = fit(2, &[win(0, 1), win(0, 1), win(1, 0)], &mle()).unwrap();
    let half_ln2 = std::f64::consts::LN_2 / 2.0;
    assert!((f.ratings[0].score - half_ln2).abs() < 1e-9);
    assert!((f.ratings[1].score + half_ln2).abs() < 1e-9);
    assert_eq!(f.ratings[0].rank, 1);
    assert_eq!(f.ratings[1].rank, 2);
    assert_eq!(
        (f.ratings[0].wins, f.ratings[0].losses, f.ratings[0].ties),
        (2, 1, 0)
    );
}

#[test]
fn hand_computed_single_game_with_prior() {
    // A beats B once; prior v = 0.5 against a virtual player at 0. By symmetry
    // theta_A = x = -theta_B, and A's score equation (observed = expected
    // wins) is 1 + v = sigma(2x) + 2v * sigma(x).
    let v = 0.5;
    let x = bisect(
        |x| sigmoid(2.0 * x) + 2.0 * v * sigmoid(x) - (1.0 + v),
        0.0,
        10.0,
    );
    let f = fit(2, &[win(0, 1)], &FitOptions::default()).unwrap();
    assert!(f.converged);
    assert!(
        (f.ratings[0].score - x).abs() < 1e-9,
        "{} vs {x}",
        f.ratings[0].score
    );
    assert!((f.ratings[1].score + x).abs() < 1e-9);
    assert!(x > 0.7 && x < 0.8, "sanity: x = {x}");
}

#[test]
fn three_cycle_is_all_zero_and_ranked_by_index() {
    let data = [win(0, 1), win(1, 2), win(2, 0)];
    for opts in [mle(), FitOptions::default()] {
        let f = fit(3, &data, &opts).unwrap();
        for r in &f.ratings {
            assert!(r.score.abs() < 1e-12);
            assert_eq!(r.rank, r.item + 1, "equal scores are ordered by index");
        }
    }
}

/// The stationarity condition of the virtual-prior objective, checked
/// directly: with raw log-strengths theta = score + c for one shift c,
/// every item's observed wins (+ v) equal its expected wins against the
/// real opponents plus 2v games against a player at 0.
fn assert_virtual_prior_optimum(n: usize, data: &[Comparison], v: f64, f: &Fit) {
    let s = scores(f);
    let mut games = vec![vec![0.0; n]; n];
    let mut won = vec![0.0; n];
    for c in data {
        games[c.a][c.b] += 1.0;
        games[c.b][c.a] += 1.0;
        match c.outcome {
            Outcome::AWins => won[c.a] += 1.0,
            Outcome::BWins => won[c.b] += 1.0,
            Outcome::Tie => {
                won[c.a] += 0.5;
                won[c.b] += 0.5
            }
        }
    }
    // Summing all items' equations leaves sum_i 2v sigma(theta_i) = n v.
    let c = bisect(
        |c| s.iter().map(|x| 2.0 * v * sigmoid(x + c)).sum::<f64>() - n as f64 * v,
        -50.0,
        50.0,
    );
    for i in 0..n {
        let ti = s[i] + c;
        let expected: f64 = (0..n)
            .map(|j| games[i][j] * sigmoid(s[i] - s[j]))
            .sum::<f64>()
            + 2.0 * v * sigmoid(ti);
        assert!(
            (expected - (won[i] + v)).abs() < 1e-7,
            "item {i}: expected {expected}, observed {}",
            won[i] + v
        );
    }
}

#[test]
fn prior_makes_undefeated_and_winless_items_finite() {
    // Item 0 beats everyone, item 3 loses to everyone: no MLE exists.
    let data = [
        win(0, 1),
        win(0, 2),
        win(0, 3),
        win(1, 2),
        win(2, 1),
        win(1, 3),
        win(2, 3),
    ];
    let f = fit(4, &data, &FitOptions::default()).unwrap();
    assert!(f.converged);
    for r in &f.ratings {
        assert!(r.score.is_finite());
    }
    assert_eq!(f.ratings[0].rank, 1);
    assert_eq!(f.ratings[3].rank, 4);
    assert_virtual_prior_optimum(4, &data, 0.5, &f);

    // A stronger prior shrinks more.
    let strong = FitOptions {
        prior: Prior::Virtual(5.0),
        ..FitOptions::default()
    };
    let g = fit(4, &data, &strong).unwrap();
    assert!(g.ratings[0].score < f.ratings[0].score);
    assert!(g.ratings[3].score > f.ratings[3].score);
    assert_virtual_prior_optimum(4, &data, 5.0, &g);

    // Without the prior: a clear error naming the undefeated item.
    let err = fit(4, &data, &mle()).unwrap_err();
    assert_eq!(
        err,
        RankError::MleDoesNotExist {
            item: rank::ItemLabel::index(0),
            group_size: 1,
            obstacle: MleObstacle::NeverLost,
        }
    );
}

#[test]
fn mle_error_names_the_item_by_name() {
    let names = ["run-a", "run-b", "run-c"];
    // run-c never wins.
    let data = [win(0, 1), win(1, 0), win(0, 2), win(1, 2)];
    let err = fit_named(&names, &data, &mle()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("\"run-c\""), "{msg}");
    assert!(msg.contains("never beat"), "{msg}");
    match err {
        RankError::MleDoesNotExist { item, obstacle, .. } => {
            assert_eq!(item.index, 2);
            assert_eq!(obstacle, MleObstacle::NeverWon);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn mle_error_for_groups_and_disconnection() {
    // {0,1} beat {2,3} in every cross game, each group is internally a cycle.
    let data = [
        win(0, 1),
        win(1, 0),
        win(2, 3),
        win(3, 2),
        win(0, 2),
        win(1, 3),
    ];
    match fit(4, &data, &mle()).unwrap_err() {
        RankError::MleDoesNotExist {
            item,
            group_size,
            obstacle,
        } => {
            assert_eq!((item.index, group_size), (0, 2));
            assert_eq!(obstacle, MleObstacle::NeverLost);
        }
        other => panic!("unexpected {other:?}"),
    }
    // Two separate groups never compared.
    let data = [win(0, 1), win(1, 0), win(2, 3), win(3, 2)];
    let err = fit(4, &data, &mle()).unwrap_err();
    assert!(matches!(
        err,
        RankError::MleDoesNotExist {
            obstacle: MleObstacle::Disconnected,
            group_size: 2,
            ..
        }
    ));
    assert!(err.to_string().contains("never compared"), "{err}");
    // Ties connect in both directions: a tie alone makes the MLE exist.
    let f = fit(2, &[tie(0, 1)], &mle()).unwrap();
    assert!(f.ratings.iter().all(|r| r.score.abs() < 1e-12));
}

#[test]
fn tie_counts_as_half_a_win() {
    // One win each way is the same evidence as two ties.
    let split = [win(0, 1), win(1, 0), win(1, 2), win(1, 2), win(2, 0)];
    let ties = [tie(0, 1), tie(1, 0), win(1, 2), win(1, 2), win(2, 0)];
    for opts in [mle(), FitOptions::default()] {
        let a = fit(3, &split, &opts).unwrap();
        let b = fit(3, &ties, &opts).unwrap();
        assert_eq!(scores(&a), scores(&b));
        assert_eq!(a.iterations, b.iterations);
    }
    let b = fit(3, &ties, &FitOptions::default()).unwrap();
    assert_eq!(
        (b.ratings[0].wins, b.ratings[0].losses, b.ratings[0].ties),
        (0, 1, 2)
    );
    // A single tie between two items is a perfect balance.
    let f = fit(2, &[tie(0, 1)], &FitOptions::default()).unwrap();
    assert!(f.ratings.iter().all(|r| r.score.abs() < 1e-12));
}

fn random_comparisons(rng: &mut SplitMix64, n: usize, m: usize) -> Vec<Comparison> {
    (0..m)
        .filter_map(|_| {
            let a = rng.below(n);
            let b = rng.below(n);
            if a == b {
                return None;
            }
            // Mostly the lower index wins, so the data are not pure noise.
            let outcome = match rng.below(10) {
                0 | 1 => Outcome::Tie,
                2 | 3 => Outcome::BWins,
                _ if a < b => Outcome::AWins,
                _ => Outcome::BWins,
            };
            Some(Comparison { a, b, outcome })
        })
        .collect()
}

#[test]
fn permutation_invariance() {
    let mut rng = SplitMix64::new(2024);
    for round in 0..40 {
        let n = 2 + rng.below(9);
        let m = 5 + rng.below(60);
        let data = random_comparisons(&mut rng, n, m);
        // Relabel items, reorder comparisons, and swap sides (flipping the outcome).
        let mut perm: Vec<usize> = (0..n).collect();
        rng.shuffle(&mut perm);
        let mut moved: Vec<Comparison> = data
            .iter()
            .map(|c| {
                let (a, b) = (perm[c.a], perm[c.b]);
                if rng.coin() {
                    let outcome = match c.outcome {
                        Outcome::AWins => Outcome::BWins,
                        Outcome::BWins => Outcome::AWins,
                        Outcome::Tie => Outcome::Tie,
                    };
                    Comparison {
                        a: b,
                        b: a,
                        outcome,
                    }
                } else {
                    Comparison {
                        a,
                        b,
                        outcome: c.outcome,
                    }
                }
            })
            .collect();
        rng.shuffle(&mut moved);
        for opts in [mle(), FitOptions::default()] {
            match (fit(n, &data, &opts), fit(n, &moved, &opts)) {
                (Ok(x), Ok(y)) => {
                    assert!(x.converged && y.converged, "round {round}");
                    for (rx, &pi) in x.ratings.iter().zip(&perm) {
                        let ry = &y.ratings[pi];
                        assert!(
                            (rx.score - ry.score).abs() < 1e-8,
                            "round {round}: {} vs {}",
                            rx.score,
                            ry.score
                        );
                        assert_eq!((rx.wins, rx.losses, rx.ties), (ry.wins, ry.losses, ry.ties));
                    }
                }
                // Existence of the MLE does not depend on labels either.
                (
                    Err(RankError::MleDoesNotExist { .. }),
                    Err(RankError::MleDoesNotExist { .. }),
                )
                | (Err(RankError::NoComparisons { .. }), Err(RankError::NoComparisons { .. })) => {}
                (x, y) => panic!("round {round}: {x:?} vs {y:?}"),
            }
        }
    }
}

#[test]
fn scores_are_centred_and_ranks_follow_scores() {
    let mut rng = SplitMix64::new(99);
    for _ in 0..30 {
        let n = 1 + rng.below(12);
        let m = rng.below(80);
        let data = random_comparisons(&mut rng, n, m);
        let f = fit(n, &data, &FitOptions::default()).unwrap();
        let sum: f64 = scores(&f).iter().sum();
        assert!(sum.abs() < 1e-9);
        let mut ranks: Vec<usize> = f.ratings.iter().map(|r| r.rank).collect();
        ranks.sort_unstable();
        assert_eq!(ranks, (1..=n).collect::<Vec<_>>());
        let by_rank = f.by_rank();
        for w in by_rank.windows(2) {
            assert!(w[0].score >= w[1].score - RANK_TIE_EPSILON);
        }
        for (i, r) in f.ratings.iter().enumerate() {
            assert_eq!(r.item, i);
        }
    }
}

#[test]
fn mle_is_the_limit_of_vanishing_l2_penalty() {
    // Two independent solvers (MM and Newton) must agree.
    let data = [
        win(0, 1),
        win(0, 1),
        win(1, 2),
        win(2, 0),
        win(2, 1),
        tie(0, 2),
    ];
    let mm = fit(3, &data, &mle()).unwrap();
    let newton = fit(
        3,
        &data,
        &FitOptions {
            prior: Prior::L2(1e-12),
            ..FitOptions::default()
        },
    )
    .unwrap();
    for (a, b) in mm.ratings.iter().zip(&newton.ratings) {
        assert!(
            (a.score - b.score).abs() < 1e-8,
            "{} vs {}",
            a.score,
            b.score
        );
    }
}

#[test]
fn items_without_comparisons() {
    // With the prior an unplayed item sits at the virtual player's level; in
    // a field symmetric around it (here: one balanced pair) that is 0.
    let f = fit(3, &[tie(0, 1)], &FitOptions::default()).unwrap();
    assert!(f.ratings[2].score.abs() < 1e-12);
    let f = fit(3, &[win(0, 1), win(1, 0)], &FitOptions::default()).unwrap();
    assert!(f.ratings.iter().all(|r| r.score.abs() < 1e-12));
    // In a lopsided field it is finite and between the others.
    let f = fit(3, &[win(0, 1), win(0, 1)], &FitOptions::default()).unwrap();
    let s = scores(&f);
    assert!(s[0] > s[2] && s[2] > s[1], "{s:?}");
    // Nothing compared at all: all zero.
    let f = fit(4, &[], &FitOptions::default()).unwrap();
    assert!(f.ratings.iter().all(|r| r.score == 0.0));
    // Without a prior: an error naming the item.
    let err = fit(3, &[win(0, 1), win(1, 0)], &mle()).unwrap_err();
    assert_eq!(
        err,
        RankError::NoComparisons {
            item: rank::ItemLabel::index(2)
        }
    );
    let err = fit_named(&["x", "y", "z"], &[win(0, 1), win(1, 0)], &mle()).unwrap_err();
    assert!(err.to_string().contains("\"z\""), "{err}");
    // Zero items is an empty, converged fit.
    let f = fit(0, &[], &mle()).unwrap();
    assert!(f.ratings.is_empty() && f.converged);
}

#[test]
fn invalid_input_is_an_error() {
    let d = FitOptions::default();
    assert_eq!(
        fit(2, &[win(0, 2)], &d).unwrap_err(),
        RankError::ItemOutOfRange {
            comparison: 0,
            item: 2,
            n_items: 2
        }
    );
    assert!(matches!(
        fit(2, &[win(0, 1), win(1, 1)], &d).unwrap_err(),
        RankError::SelfComparison { comparison: 1, .. }
    ));
    for prior in [
        Prior::Virtual(0.0),
        Prior::Virtual(-1.0),
        Prior::Virtual(f64::NAN),
        Prior::Virtual(f64::INFINITY),
        Prior::L2(0.0),
        Prior::L2(f64::NAN),
    ] {
        let opts = FitOptions { prior, ..d };
        assert!(matches!(
            fit(2, &[win(0, 1)], &opts).unwrap_err(),
            RankError::InvalidOption {
                option: "prior",
                ..
            }
        ));
    }
    for tolerance in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let opts = FitOptions { tolerance, ..d };
        assert!(matches!(
            fit(2, &[win(0, 1)], &opts).unwrap_err(),
            RankError::InvalidOption {
                option: "tolerance",
                ..
            }
        ));
    }
    let opts = FitOptions {
        max_iterations: 0,
        ..d
    };
    assert!(fit(2, &[win(0, 1)], &opts).is_err());
    // Absurd sizes are refused before allocating.
    assert!(matches!(
        fit(usize::MAX, &[], &d).unwrap_err(),
        RankError::TooManyItems { .. }
    ));
    let l2 = FitOptions {
        prior: Prior::L2(1.0),
        ..d
    };
    assert!(matches!(
        fit(1_000_000, &[], &l2).unwrap_err(),
        RankError::TooManyItems { max: 2_000, .. }
    ));
}

#[test]
fn iteration_budget_is_reported() {
    let data = [win(0, 1), win(0, 1), win(1, 2), win(2, 0)];
    let opts = FitOptions {
        max_iterations: 2,
        ..mle()
    };
    let f = fit(3, &data, &opts).unwrap();
    assert_eq!(f.iterations, 2);
    assert!(!f.converged);
    assert!(f.ratings.iter().all(|r| r.score.is_finite()));
    let f = fit(3, &data, &mle()).unwrap();
    assert!(f.converged && f.iterations > 2);
}

#[test]
fn extreme_but_valid_data_stays_finite() {
    // 10_000 to 1: the MLE exists but is far out; MM must neither overflow
    // nor stop early.
    let mut data = vec![win(1, 0)];
    data.extend(std::iter::repeat_n(win(0, 1), 10_000));
    let f = fit(2, &data, &mle()).unwrap();
    let gap = f.ratings[0].score - f.ratings[1].score;
    assert!((gap - (10_000f64).ln()).abs() < 1e-6, "{gap}");
    for opts in [
        FitOptions::default(),
        FitOptions {
            prior: Prior::L2(0.5),
            ..mle()
        },
    ] {
        let f = fit(2, &data, &opts).unwrap();
        assert!(f.converged);
        assert!(f.ratings.iter().all(|r| r.score.is_finite()));
    }
}

#[test]
fn arbitrary_input_never_panics() {
    let mut rng = SplitMix64::new(7);
    for _ in 0..300 {
        let n = rng.below(6);
        let m = rng.below(12);
        let data: Vec<Comparison> = (0..m)
            .map(|_| Comparison {
                a: rng.below(n + 2),
                b: rng.below(n + 2),
                outcome: [Outcome::AWins, Outcome::BWins, Outcome::Tie][rng.below(3)],
            })
            .collect();
        for prior in [Prior::None, Prior::Virtual(0.5), Prior::L2(0.1)] {
            let opts = FitOptions {
                prior,
                ..FitOptions::default()
            };
            if let Ok(f) = fit(n, &data, &opts) {
                assert_eq!(f.ratings.len(), n);
                assert!(f.ratings.iter().all(|r| r.score.is_finite()));
            }
        }
    }
}
