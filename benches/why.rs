//! `mass why` latency: medians of the evidence-chain query
//! (`audit::why`) on ledgers of growing size, against the way the
//! question was answered before (scan every judgment for the ones naming
//! the rollout) in the same run. The ledgers hold synthetic MASS cycles
//! with the real record types and links: per task, 18 rollouts (a guard
//! record, three stream events, the rollout), 54 judgments, a ranking, a
//! selection, a dataset with its provenance blob and a training step.
//!
//!     cargo bench --bench why            # 10k and 1M events
//!     cargo bench --bench why -- --quick # 10k and 100k events
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it is a smoke
//! run at 2k and 10k events.
//!
//! The figures are also written to `target/bench/why.json` (not by the
//! smoke run): `{"queries", "rows": [{"events", "build_s", "why_median_ms",
//! "why_p90_ms", "scan_median_ms", "why_vs_scan"}], "flatness"}`, where
//! `flatness` is the median at the largest size over the median at the
//! smallest (1 = flat).

use std::time::Instant;

#[path = "common/report.rs"]
mod report;

use ledger::{Id, Ledger};
use schemas::{
    Dataset, GuardCheck, Hash32, Judgment, Note, RankedRun, Ranking, Rollout, Selection, Training,
};

const RUNS: usize = 18;
const OPPONENTS: usize = 3;
const QUERIES: usize = 41;

fn h(id: Id) -> Hash32 {
    Hash32(id.0)
}

macro_rules! ev {
    ($r:expr) => {
        schemas::to_event(&$r).expect("encode")
    };
}

/// One task's cycle; returns the rollout ids and the number of events.
fn task_block(l: &Ledger, t: usize) -> (Vec<Id>, usize) {
    let mut b = l.batch();
    let mut events = 0;
    let task = format!("task-{t}");
    let workflow = b
        .put_blob(format!("{{\"task\":{t},\"agents\":[]}}").as_bytes())
        .expect("blob");
    let tree = b.put_blob(format!("tree {t}").as_bytes()).expect("blob");
    let mut rollouts = Vec::new();
    for i in 0..RUNS {
        let stream = format!("bench/c1/{task}/collect/{i:02}/orch");
        let mut prev = None;
        for k in 0..3 {
            let n = ev!(Note {
                text: format!("{task} run {i} step {k}"),
            });
            prev = Some(b.append(&stream, prev, n).expect("append"));
            events += 1;
        }
        let head = prev.expect("stream head");
        let guard = b
            .append(
                &format!("bench/c1/{task}/collect/{i:02}/guard"),
                None,
                ev!(GuardCheck {
                    task: task.clone(),
                    initial: h(tree),
                    final_tree: h(tree),
                    protected_changed: vec![],
                    changed_files: 1,
                    changed_bytes: 10,
                    violations: vec![],
                    action: "exclude".into(),
                }),
            )
            .expect("append");
        let rollout = ev!(Rollout {
            task: task.clone(),
            purpose: "collect".into(),
            cycle: 1,
            index: i as u32,
            workflow: h(workflow),
            orchestrator_model: "m".into(),
            subagent_model: "m".into(),
            status: "finished".into(),
            detail: String::new(),
            tree: h(tree),
            validation: h(tree),
            score_passed: i as u32,
            score_total: 20,
            orchestrator: h(head),
            subagents: vec![],
            delegations: 0,
            turns: 3,
            prompt_tokens: 100,
            completion_tokens: 50,
            report: format!("run {i}"),
        })
        .with_parents(vec![guard]);
        rollouts.push(b.append(&stream, Some(head), rollout).expect("append"));
        events += 2;
    }
    let mut judgments = Vec::new();
    for i in 0..RUNS {
        for o in 1..=OPPONENTS {
            let (a, c) = (rollouts[i], rollouts[(i + o) % RUNS]);
            let j = ev!(Judgment {
                task: task.clone(),
                a: h(a),
                b: h(c),
                swapped: o % 2 == 0,
                judge_model: "m".into(),
                winner: if (i + o) % 3 == 0 { "b" } else { "a" }.into(),
                rationale: "A is better supported".into(),
                invalid_attempts: 0,
                conversation: h(tree),
            })
            .with_parents(vec![a, c]);
            judgments.push(
                b.append(&format!("bench/c1/{task}/pair/{i:02}-{o}"), None, j)
                    .expect("append"),
            );
            events += 1;
        }
    }
    let main = format!("bench/main/{task}");
    let ranking = b
        .append(
            &main,
            None,
            ev!(Ranking {
                task: task.clone(),
                cycle: 1,
                prior: 0.5,
                iterations: 40,
                converged: true,
                runs: rollouts
                    .iter()
                    .enumerate()
                    .map(|(k, r)| RankedRun {
                        rollout: h(*r),
                        score: 1.0 - k as f64 / RUNS as f64,
                        rank: k as u32 + 1,
                        wins: 2,
                        losses: 1,
                        ties: 0,
                    })
                    .collect(),
                judgments: judgments.iter().map(|j| h(*j)).collect(),
            })
            .with_parents(judgments.clone()),
        )
        .expect("append");
    let selection = b
        .append(
            &main,
            Some(ranking),
            ev!(Selection {
                task: task.clone(),
                cycle: 1,
                ranking: h(ranking),
                train: rollouts[..15].iter().map(|r| h(*r)).collect(),
                validation: vec![h(rollouts[15])],
                excluded: vec![],
                exclusions: vec![],
                wanted_train: 15,
                wanted_validation: 1,
                shortfall: String::new(),
            }),
        )
        .expect("append");
    let provenance: String = rollouts[..16]
        .iter()
        .enumerate()
        .map(|(k, r)| {
            format!(
                "{{\"file\":\"{}\",\"line\":{},\"rollout\":\"{}\",\"conversation\":\"{}#0\",\"agent\":\"orchestrator\"}}\n",
                if k < 15 { "train" } else { "validation" },
                k + 1,
                r.to_hex(),
                r.short(16)
            )
        })
        .collect();
    let prov = b.put_blob(provenance.as_bytes()).expect("blob");
    let dataset = b
        .append(
            &main,
            Some(selection),
            ev!(Dataset {
                cycle: 1,
                format: "openai".into(),
                train: h(tree),
                validation: h(tree),
                train_examples: 15,
                validation_examples: 1,
                train_supervised_tokens: 1000,
                validation_supervised_tokens: 60,
                selections: vec![h(selection)],
                provenance: h(prov),
            }),
        )
        .expect("append");
    b.append(
        &main,
        Some(dataset),
        ev!(Training {
            cycle: 1,
            dataset: h(dataset),
            base_model: "m".into(),
            new_model: format!("m+{task}"),
            command: "sim".into(),
            exit_status: 0,
            output: h(tree),
            log: h(tree),
            checkpoint: "checkpoint-3".into(),
            validation_loss: 0.9,
            base_validation_loss: Some(1.1),
            effect: h(dataset),
            hyperparameters: h(tree),
            checkpoint_reason: "lowest".into(),
            adapter: h(tree),
            trainer_version: String::new(),
            steps: 0,
        }),
    )
    .expect("append");
    events += 4;
    b.commit().expect("commit");
    (rollouts, events)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn p90(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() * 9) / 10]
}

/// The answer without the referrers index: every judgment event, decoded,
/// kept if it names the rollout.
fn scan_judgments(l: &Ledger, id: Id) -> usize {
    let mut n = 0;
    for j in l
        .events_newest_first(Some("mass.judgment"), usize::MAX)
        .expect("events")
    {
        let e = l.get_event(&j).expect("event");
        let r: Judgment = schemas::decode_event(&e).expect("judgment");
        n += (r.a.0 == id.0 || r.b.0 == id.0) as usize;
    }
    n
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --all-targets` runs this binary without `--bench`: a smoke run.
    let smoke = !args.iter().any(|a| a == "--bench");
    let quick = args.iter().any(|a| a == "--quick");
    let sizes: &[usize] = if smoke {
        &[2_000, 10_000]
    } else if quick {
        &[10_000, 100_000]
    } else {
        &[10_000, 1_000_000]
    };
    println!(
        "mass why: the evidence chain of one rollout, {QUERIES} queries per ledger (medians, ms)"
    );
    println!(
        "{:>9}  {:>9}  {:>10}  {:>9}  {:>12}  {:>10}",
        "events", "build s", "why median", "why p90", "scan median", "why/scan"
    );
    let mut first = None;
    let (mut rows, mut flatness) = (Vec::new(), None);
    for &size in sizes {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = Ledger::init(&dir.path().join("l")).expect("init");
        let t0 = Instant::now();
        let (mut all, mut events, mut t) = (Vec::new(), 0, 0);
        while events < size {
            let (r, n) = task_block(&l, t);
            all.extend(r);
            events += n;
            t += 1;
        }
        drop(l);
        let l = Ledger::open_read_only(&dir.path().join("l")).expect("open");
        let build = t0.elapsed().as_secs_f64();
        let (mut why_ms, mut scan_ms) = (Vec::new(), Vec::new());
        for q in 0..QUERIES {
            let id = all[(q * 7919) % all.len()];
            let t = Instant::now();
            let w = audit::why(&l, id).expect("why");
            why_ms.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(w.judgments.len(), 2 * OPPONENTS, "every judgment found");
            assert!(w.ranking.is_some() && w.training.is_some());
            if q < 5 {
                let t = Instant::now();
                assert_eq!(scan_judgments(&l, id), 2 * OPPONENTS);
                scan_ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        let (m, p) = (median(why_ms.clone()), p90(why_ms));
        let s = median(scan_ms);
        println!(
            "{events:>9}  {build:>9.1}  {m:>10.3}  {p:>9.3}  {s:>12.1}  {:>10.5}",
            m / s
        );
        rows.push(serde_json::json!({
            "events": events,
            "build_s": build,
            "why_median_ms": m,
            "why_p90_ms": p,
            "scan_median_ms": s,
            "why_vs_scan": m / s,
        }));
        match first {
            None => first = Some((events, m)),
            Some((e0, m0)) => {
                flatness = Some(m / m0);
                println!(
                    "median at {events} events / median at {e0} events: {:.2}x (flat = 1; goal: <= 10 ms at 1M)",
                    m / m0
                )
            }
        }
    }
    if !smoke {
        let doc = serde_json::json!({"queries": QUERIES, "rows": rows, "flatness": flatness});
        if let Some(p) = report::write("why", &doc) {
            println!("figures: {}", p.display());
        }
    }
}
