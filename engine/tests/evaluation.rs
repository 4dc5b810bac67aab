//! External evaluation as the MASS articles do it: `outer.external_judgments`
//! judgments per pair, each pair's A/B orders drawn from the run's seed,
//! W/(W+L) over judgments with ties excluded as the headline. Checked
//! against an independent recount from the recorded `mass.judgment`
//! events, over many seeds; a run recorded by `mass-engine/8` keeps its
//! alternating order, 2 verdicts per pair and `mass.evaluation` v2.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use engine::context::NoProgress;
use engine::driver::{drive, RunRequest};
use ledger::{Event, Id, Ledger};
use replay::Mode;
use schemas::Record;

const N: u32 = 6;

/// The smoke experiment with `seed`, every task collected (so every seed
/// trains and evaluates) and `judgments` per evaluated pair.
fn experiment(seed: u64, judgments: u32) -> (String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root.join("examples/smoke.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let tasks = std::fs::canonicalize(root.join("examples/tasks")).unwrap();
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("seed = ") {
            out.push(format!("seed = {seed}"));
        } else if line.starts_with("tasks_dir = ") {
            out.push(format!("tasks_dir = {:?}", tasks.to_string_lossy()));
        } else if line.starts_with("external_judgments = ") {
            out.push(format!("external_judgments = {judgments}"));
        } else if line == "[outer]" {
            out.push(line.to_string());
            out.push("collect = \"every\"".into());
        } else {
            out.push(line.to_string());
        }
    }
    let text = out.join("\n") + "\n";
    assert!(
        text.contains(&format!("external_judgments = {judgments}")),
        "smoke.toml states external_judgments:\n{text}"
    );
    (text, path.to_string_lossy().into_owned())
}

fn drive_run(l: &Arc<Ledger>, run: &str, mode: Mode, exp: Option<(String, String)>) {
    drive(
        l.clone(),
        RunRequest {
            run: run.into(),
            experiment: exp,
            mode,
            source: None,
            progress: &NoProgress,
        },
    )
    .unwrap_or_else(|e| panic!("run {run}: {e}"));
}

/// The main stream, oldest first.
fn main_events(l: &Ledger, run: &str) -> Vec<Event> {
    let head = l.head(run).unwrap().unwrap();
    let mut v: Vec<Event> = l.chain(head).map(|e| e.unwrap()).collect();
    v.reverse();
    v
}

fn judgments_of(l: &Ledger, links: &[schemas::Hash32]) -> Vec<schemas::Judgment> {
    links
        .iter()
        .map(|h| schemas::decode_event(&l.get_event(&Id(h.0)).unwrap()).unwrap())
        .collect()
}

/// W, L, ties and model-first judgments, recounted from judgment records.
fn recount(js: &[schemas::Judgment]) -> (u32, u32, u32, u32) {
    let n = |w: &str| js.iter().filter(|j| j.winner == w).count() as u32;
    let first = js.iter().filter(|j| !j.swapped).count() as u32;
    (n("a"), n("b"), n("tie"), first)
}

/// A pair: seed, comparison, task and its two rollouts.
type PairKey = (u64, String, String, [u8; 32], [u8; 32]);

#[test]
fn judgments_are_counted_in_random_balanced_order_over_many_seeds() {
    let d = tempfile::tempdir().unwrap();
    // Each pair's orders once (every judge sees the same), over all seeds.
    let mut orders: BTreeMap<PairKey, Vec<bool>> = BTreeMap::new();
    let mut evaluated = 0;
    for seed in 1..=6u64 {
        let l = Arc::new(Ledger::init(&d.path().join(format!("l{seed}"))).unwrap());
        drive_run(&l, "r", Mode::Live, Some(experiment(seed, N)));
        let events = main_events(&l, "r");
        let status = engine::status::fold(&events).unwrap();
        let figures: Vec<_> = status
            .cycles
            .iter()
            .flat_map(|c| c.evaluations.clone())
            .collect();
        let recs: Vec<schemas::Evaluation> = events
            .iter()
            .filter(|e| e.kind == "mass.evaluation")
            .map(|e| {
                assert_eq!(e.version, schemas::Evaluation::VERSION, "seed {seed}");
                schemas::decode_event(e).unwrap()
            })
            .collect();
        assert_eq!(recs.len(), figures.len(), "seed {seed}");
        for (rec, fig) in recs.iter().zip(&figures) {
            evaluated += 1;
            // N judgments recorded per pair.
            assert!(rec.pairs > 0);
            assert_eq!(rec.judgments.len() as u32, rec.pairs * N, "seed {seed}");
            let js = judgments_of(&l, &rec.judgments);
            let (w, lo, t, first) = recount(&js);
            assert_eq!(
                (rec.judgment_wins, rec.judgment_losses, rec.judgment_ties),
                (w, lo, t),
                "seed {seed}: the record's judgment counts"
            );
            assert_eq!(rec.model_first, first, "seed {seed}");
            assert_eq!(rec.verdicts, w + lo + t, "seed {seed}");
            // The headline: W/(W+L), ties excluded.
            let want = (w + lo > 0).then(|| w as f64 / (w + lo) as f64);
            assert_eq!(fig.judgment_win_rate, want, "seed {seed}");
            assert_eq!(fig.headline_unit, "judgments");
            let text = fig.describe(None);
            assert!(
                text.starts_with(&format!(
                    "win rate {} of {} judgments (W/(W+L) {w}-{lo}, {t} tie",
                    want.map_or("n/a".into(), |r| format!("{:.1}%", r * 100.0)),
                    w + lo
                )) && text.contains(&format!("; pair majority {}/{} pairs", rec.wins, rec.pairs)),
                "{text}"
            );
            // The pair majority beside it, recounted per pair.
            let (mut pw, mut pl, mut pt) = (0, 0, 0);
            for pair in js.chunks(N as usize) {
                let (a, b, _, _) = recount(pair);
                match a.cmp(&b) {
                    std::cmp::Ordering::Greater => pw += 1,
                    std::cmp::Ordering::Less => pl += 1,
                    std::cmp::Ordering::Equal => pt += 1,
                }
                assert!(pair.iter().all(|j| j.a == pair[0].a && j.b == pair[0].b));
                let flags: Vec<bool> = pair.iter().map(|j| j.swapped).collect();
                let key = (
                    seed,
                    format!("{} {}", rec.split, rec.against),
                    pair[0].task.clone(),
                    pair[0].a.0,
                    pair[0].b.0,
                );
                // Every judge saw the pair in the same orders.
                let seen = orders.entry(key).or_insert_with(|| flags.clone());
                assert_eq!(*seen, flags, "seed {seed}: judges saw different orders");
            }
            assert_eq!(
                (rec.wins, rec.losses, rec.ties),
                (pw, pl, pt),
                "seed {seed}"
            );
        }
        // The run replays exactly (the orders are drawn again).
        drive_run(&l, "r", Mode::Check, None);
    }
    assert!(evaluated >= 6, "{evaluated} evaluations");
    let flags: Vec<bool> = orders.values().flatten().copied().collect();
    let n = flags.len() as f64;
    let swapped = flags.iter().filter(|&&s| s).count() as f64;
    // Fair coin flips: within 4 standard deviations of half.
    let bound = 4.0 * (n * 0.25).sqrt();
    assert!(
        n >= 200.0 && (swapped - n / 2.0).abs() <= bound,
        "{swapped} of {n} judgments showed the baseline first (bound {bound:.1})"
    );
    // Random, not alternating: some pair's orders are not F,T,F,T,...
    let alternating: Vec<bool> = (0..N).map(|k| k % 2 == 1).collect();
    let not_alternating = orders.values().filter(|o| **o != alternating).count();
    assert!(
        not_alternating > orders.len() / 2,
        "{not_alternating} of {}",
        orders.len()
    );
    // And the draws differ between pairs and seeds.
    let distinct: BTreeSet<&Vec<bool>> = orders.values().collect();
    assert!(
        distinct.len() > 8,
        "{} distinct order patterns",
        distinct.len()
    );
}

/// A run recorded by `mass-engine/8` (its `run.started` names that
/// driver): its evaluation keeps 2 verdicts per pair in alternating order
/// and writes `mass.evaluation` v2, which the status reads as pair figures.
#[test]
fn a_run_of_mass_engine_8_keeps_two_alternating_verdicts() {
    let d = tempfile::tempdir().unwrap();
    let mut legacy_evals = 0;
    for seed in 1..=2u64 {
        let l = Arc::new(Ledger::init(&d.path().join(format!("l{seed}"))).unwrap());
        let (text, origin) = experiment(seed, 2);
        let exp = engine::config::Experiment::parse(&text, &origin).unwrap();
        let suite = engine::task::load_suite(&exp.tasks_path).unwrap();
        let started = schemas::RunStarted {
            driver: "mass-engine/8".into(),
            config: l.put_blob(exp.definition_toml().as_bytes()).unwrap().into(),
            tasks: engine::suite::record(&l, &suite).unwrap().into(),
            seed: exp.seed,
        };
        let id = l
            .append(
                "old",
                None,
                schemas::to_event(&started).unwrap().in_stream("main"),
            )
            .unwrap();
        let execution = schemas::RunExecution {
            config: l.put_blob(text.as_bytes()).unwrap().into(),
        };
        l.append(
            &replay::ref_name("old", replay::EXECUTION),
            None,
            schemas::to_event(&execution)
                .unwrap()
                .with_parents(vec![id])
                .in_stream(replay::EXECUTION),
        )
        .unwrap();
        drive_run(&l, "old", Mode::Live, None);
        let events = main_events(&l, "old");
        let status = engine::status::fold(&events).unwrap();
        let figures: Vec<_> = status
            .cycles
            .iter()
            .flat_map(|c| c.evaluations.clone())
            .collect();
        let recs: Vec<schemas::EvaluationV2> = events
            .iter()
            .filter(|e| e.kind == "mass.evaluation")
            .map(|e| {
                assert_eq!(e.version, schemas::EvaluationV2::VERSION, "seed {seed}");
                schemas::decode_event(e).unwrap()
            })
            .collect();
        assert_eq!(recs.len(), figures.len());
        for (rec, fig) in recs.iter().zip(&figures) {
            legacy_evals += 1;
            assert_eq!(rec.judgments.len() as u32, rec.pairs * 2);
            let js = judgments_of(&l, &rec.judgments);
            for (k, j) in js.iter().enumerate() {
                assert_eq!(j.swapped, k % 2 == 1, "seed {seed}: judgment {k}");
            }
            assert_eq!(fig.headline_unit, "pairs");
            assert_eq!(fig.order, "alternating");
            assert_eq!(fig.judgment_win_rate, None);
            let text = fig.describe(None);
            assert!(
                text.starts_with("pair majority ") && text.contains(" pairs, "),
                "{text}"
            );
            assert_eq!(fig.order_text(), "2 verdicts per pair in alternating order");
        }
        drive_run(&l, "old", Mode::Check, None);
    }
    assert!(legacy_evals > 0);
}
