//! Bradley-Terry fits checked against independently published answers
//! (choix's test data and the Wikipedia worked example). The fixtures in
//! `tests/fixtures/` were copied from the project's shared reference files and
//! keep their `_source` field.

use rank::bt::{fit, fit_named, Comparison, FitOptions, Outcome, Prior};
use serde_json::Value;

const CHOIX: &str = include_str!("fixtures/bt_choix_pairwise.json");
const WIKIPEDIA: &str = include_str!("fixtures/bt_wikipedia_4teams.json");

/// choix's own tolerance: numpy.allclose(atol=1e-4, rtol=1e-5).
fn choix_close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-4 + 1e-5 * want.abs()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).expect("fixture is valid JSON")
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// choix stores pairwise data as `[winner, loser]`.
fn winner_loser_pairs(v: &Value) -> Vec<Comparison> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|pair| {
            let p = pair.as_array().expect("pair");
            Comparison {
                a: p[0].as_u64().expect("index") as usize,
                b: p[1].as_u64().expect("index") as usize,
                outcome: Outcome::AWins,
            }
        })
        .collect()
}

fn mle() -> FitOptions {
    FitOptions {
        prior: Prior::None,
        ..FitOptions::default()
    }
}

#[test]
fn fixtures_keep_their_source() {
    assert!(json(CHOIX)["_source"]
        .as_str()
        .unwrap()
        .contains("lucasmaystre/choix"));
    assert!(json(WIKIPEDIA)["_source"]
        .as_str()
        .unwrap()
        .contains("Wikipedia"));
}

#[test]
fn choix_pairwise_ml_estimates() {
    let fx = json(CHOIX);
    let cases = fx["pairwise"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let n = case["n_items"].as_u64().unwrap() as usize;
        let data = winner_loser_pairs(&case["data"]);
        let want = floats(&case["ml_est"]);
        let got = fit(n, &data, &mle()).unwrap();
        assert!(got.converged, "{name}");
        for (r, w) in got.ratings.iter().zip(&want) {
            assert!(choix_close(r.score, *w), "{name}: {} vs {w}", r.score);
            // Far tighter than choix asks: the estimates are exact MLEs.
            assert!((r.score - w).abs() < 1e-8, "{name}: {} vs {w}", r.score);
        }
    }
}

#[test]
fn choix_pairwise_2_on_the_old_strength_scale() {
    // Older choix commits store the same case as strengths normalised to
    // mean 1: exp(ml_est) / mean(exp(ml_est)).
    let fx = json(CHOIX);
    let case = &fx["pairwise"][1];
    assert_eq!(case["name"], "testcase-pairwise-2");
    let got = fit(3, &winner_loser_pairs(&case["data"]), &mle()).unwrap();
    let strengths: Vec<f64> = got.ratings.iter().map(|r| r.score.exp()).collect();
    let mean = strengths.iter().sum::<f64>() / 3.0;
    let want = [1.43586088, 0.62035049, 0.94378863];
    for (s, w) in strengths.iter().zip(want) {
        assert!((s / mean - w).abs() < 1e-7, "{} vs {w}", s / mean);
    }
}

#[test]
fn choix_penalized_8_random() {
    let fx = json(CHOIX);
    let case = &fx["pairwise_penalized_8_random"];
    // The fixture documents the objective: penalty * sum(theta^2) + NLL, penalty 0.5.
    assert!(case["objective"]
        .as_str()
        .unwrap()
        .contains("penalty = 0.5"));
    let n = case["n_items"].as_u64().unwrap() as usize;
    let data = winner_loser_pairs(&case["data"]);
    let want = floats(&case["estimate"]);
    let opts = FitOptions {
        prior: Prior::L2(0.5),
        ..FitOptions::default()
    };
    let got = fit(n, &data, &opts).unwrap();
    assert!(got.converged);
    assert!(got.iterations < 50, "Newton took {} steps", got.iterations);
    for (r, w) in got.ratings.iter().zip(&want) {
        assert!(choix_close(r.score, *w), "{} vs {w}", r.score);
        // The fixture's values are given to 8 decimals.
        assert!((r.score - w).abs() < 1e-7, "{} vs {w}", r.score);
    }
}

fn wikipedia_games() -> (Vec<String>, Vec<Comparison>) {
    let fx = json(WIKIPEDIA);
    let names: Vec<String> = ["A", "B", "C", "D"].map(String::from).to_vec();
    let idx = |s: &str| names.iter().position(|n| n == s).unwrap();
    let mut comparisons = Vec::new();
    for g in fx["games"].as_array().unwrap() {
        let w = idx(g["winner"].as_str().unwrap());
        let l = idx(g["loser"].as_str().unwrap());
        for _ in 0..g["count"].as_u64().unwrap() {
            comparisons.push(Comparison {
                a: w,
                b: l,
                outcome: Outcome::AWins,
            });
        }
    }
    (names, comparisons)
}

#[test]
fn wikipedia_four_teams() {
    let fx = json(WIKIPEDIA);
    let (names, games) = wikipedia_games();
    let got = fit_named(&names, &games, &mle()).unwrap();
    assert!(got.converged);
    // Mean-centred log scores are log-strengths with geometric mean 1, the
    // normalisation the published values use.
    for (i, name) in names.iter().enumerate() {
        let s = got.ratings[i].score.exp();
        let published = fx["published_strengths_geometric_mean_1"][name]
            .as_f64()
            .unwrap();
        let derived = fx["derived_MLE_not_published"][name].as_f64().unwrap();
        assert!(
            (s - published).abs() <= 1e-3 * published,
            "{name}: {s} vs published {published}"
        );
        assert!(
            (s - derived).abs() <= 1e-6 * derived,
            "{name}: {s} vs derived {derived}"
        );
    }
    // D > B > C > A.
    let order: Vec<&str> = got
        .by_rank()
        .iter()
        .map(|r| names[r.item].as_str())
        .collect();
    assert_eq!(order, ["D", "B", "C", "A"]);
    let a = &got.ratings[0];
    assert_eq!((a.wins, a.losses, a.ties), (3, 7, 0));
}

#[test]
fn wikipedia_four_teams_with_default_prior_keeps_order_and_shrinks() {
    // Not a published value: the prior pulls scores towards the centre but on
    // this data must not change the order.
    let (names, games) = wikipedia_games();
    let free = fit(names.len(), &games, &mle()).unwrap();
    let prior = fit(names.len(), &games, &FitOptions::default()).unwrap();
    for (f, p) in free.ratings.iter().zip(&prior.ratings) {
        assert_eq!(f.rank, p.rank);
    }
    let spread = |fit: &rank::bt::Fit| {
        let s: Vec<f64> = fit.ratings.iter().map(|r| r.score).collect();
        s.iter().cloned().fold(f64::MIN, f64::max) - s.iter().cloned().fold(f64::MAX, f64::min)
    };
    assert!(spread(&prior) < spread(&free));
}
