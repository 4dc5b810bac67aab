//! `mass why` latency: medians of the evidence-chain query
//! (`audit::why`) on ledgers of growing size, against the way the
//! question was answered before (scan every judgment for the ones naming
//! the rollout) in the same run. The ledgers hold synthetic MASS cycles
//! with the real record types and links: per task, 18 rollouts (a guard
//! record, three stream events, the rollout), 54 judgments, a ranking, a
//! selection, a dataset with its provenance blob and a training step. The
//! three stream events are model calls (`effect` records whose output blob
//! holds the usage), and the run's head is a `mass.cycle` record, so the
//! same ledgers also time `mass report` (`audit::report::report`), which
//! walks every stream of the run and reads every model call's output: the
//! issue's goal is 2 s for a 1M-event run.
//!
//!     cargo bench --bench why            # 10k and 1M events
//!     cargo bench --bench why -- --quick # 10k and 100k events
//!     cargo bench --bench why -- --sizes=10000,30000
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it is a smoke
//! run at 2k and 10k events.
//!
//! The figures are also written to `target/bench/why.json` (not by the
//! smoke run): `{"queries", "rows": [{"events", "build_s", "why_median_ms",
//! "why_p90_ms", "scan_median_ms", "why_vs_scan", "report_cold_s",
//! "report_fresh_s", "report_kept_s", "kept_vs_cold"}], "flatness"}`
//! (`report_cold_s`: one report folding every stream, nothing kept;
//! `report_fresh_s`: one `mass report --fresh`, which also writes the report
//! projection; `report_kept_s`: median of three reports reading it), where
//! `flatness` is the median at the largest size over the median at the
//! smallest (1 = flat).

use std::time::Instant;

#[path = "common/report.rs"]
mod report;

use ledger::{Id, Ledger};
use schemas::{
    Cycle, Dataset, Effect, EffectStatus, GuardCheck, Hash32, Judgment, RankedRun, Ranking,
    Rollout, Selection, Training,
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

/// An event of the run's main stream.
macro_rules! main_ev {
    ($r:expr) => {
        ev!($r).in_stream("main")
    };
}

/// One task's cycle; returns the rollout ids and the number of events.
/// One task's cycle on top of the run's main stream at `main_head`;
/// returns the rollout ids, the number of events and the new main head.
fn task_block(l: &Ledger, t: usize, main_head: Option<Id>) -> (Vec<Id>, usize, Id) {
    let mut b = l.batch();
    let mut events = 0;
    let task = format!("task-{t}");
    let workflow = b
        .put_blob(format!("{{\"task\":{t},\"agents\":[]}}").as_bytes())
        .expect("blob");
    let tree = b.put_blob(format!("tree {t}").as_bytes()).expect("blob");
    let mut rollouts = Vec::new();
    for i in 0..RUNS {
        // Named as the engine names them: the ref under the run, the
        // event's stream relative to it (the report lists a run's streams so).
        let rel = format!("c1/{task}/collect/{i:02}/orch");
        let stream = format!("bench/{rel}");
        let mut prev = None;
        for k in 0..3 {
            let n = model_call(&mut b, &task, i, k).in_stream(rel.clone());
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
        .with_parents(vec![guard])
        .in_stream(rel);
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
            let rel = format!("c1/{task}/pair/{i:02}-{o}");
            judgments.push(
                b.append(&format!("bench/{rel}"), None, j.in_stream(rel))
                    .expect("append"),
            );
            events += 1;
        }
    }
    let training = decisions(&mut b, &task, tree, &rollouts, &judgments, main_head);
    events += 4;
    b.commit().expect("commit");
    (rollouts, events, training)
}

/// A task's decisions on the run's main stream at `main_head`: ranking,
/// selection, dataset and training; returns the training (the new head).
fn decisions(
    b: &mut ledger::Batch<'_>,
    task: &str,
    tree: Id,
    rollouts: &[Id],
    judgments: &[Id],
    main_head: Option<Id>,
) -> Id {
    // The decisions are on the run's main stream, every task's after the
    // one before, as a run records them.
    let main = "bench";
    let ranking = b
        .append(
            main,
            main_head,
            ev!(Ranking {
                task: task.to_string(),
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
            .with_parents(judgments.to_vec())
            .in_stream("main"),
        )
        .expect("append");
    let selection = b
        .append(
            main,
            Some(ranking),
            main_ev!(Selection {
                task: task.to_string(),
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
    dataset_and_training(b, task, tree, rollouts, selection)
}

/// The task's dataset (with its provenance blob) after `selection`, and the
/// training on it; returns the training.
fn dataset_and_training(
    b: &mut ledger::Batch<'_>,
    task: &str,
    tree: Id,
    rollouts: &[Id],
    selection: Id,
) -> Id {
    let main = "bench";
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
            main,
            Some(selection),
            main_ev!(Dataset {
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
        main,
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
        })
        .in_stream("main"),
    )
    .expect("append")
}

/// A recorded model call: its request and its output (a message and the
/// usage, as the engine records them) as blobs of their own.
fn model_call(b: &mut ledger::Batch<'_>, task: &str, run: usize, step: usize) -> ledger::NewEvent {
    // As the engine records it: the new messages as blobs, named by id.
    let message = serde_json::json!({"role": "user", "content": format!("{task} {run} {step}")});
    let message = b.put_blob(message.to_string().as_bytes()).expect("blob");
    let request = serde_json::json!({
        "model": "m",
        "params": {"temperature": 0.7},
        "tools": null,
        "prefix": null,
        "messages": [message.to_hex()],
    });
    let request = b.put_blob(request.to_string().as_bytes()).expect("blob");
    let output = serde_json::json!({
        "message": {"role": "assistant", "content": format!("{task} run {run} step {step}")},
        "usage": {"prompt_tokens": 200 + step, "completion_tokens": 24},
        "finish_reason": "stop",
    });
    let output = b.put_blob(output.to_string().as_bytes()).expect("blob");
    ev!(Effect {
        effect: "model".into(),
        request: h(request),
        status: EffectStatus::Ok,
        output: Some(h(output)),
        error: String::new(),
        links: vec![h(message)],
    })
}

/// The run's head: cycle 1's record, so the report has a cycle to fill.
fn close_run(l: &Ledger, main_head: Option<Id>) {
    let mut b = l.batch();
    b.append(
        "bench",
        main_head,
        main_ev!(Cycle {
            cycle: 1,
            model: "m".into(),
            next_model: "m+1".into(),
            inner_wins: 0,
            inner_iterations: 0,
            selected_runs: 0,
            supervised_tokens: 0,
            collected_runs: 0,
            delegating_runs: 0,
            tampered_runs: 0,
            tampered_in_training: 0,
            bare_delegation: vec![],
            agreement: vec![],
            evaluations: vec![],
        }),
    )
    .expect("append");
    b.commit().expect("commit");
}

/// Seconds of `mass report`: without the report projection (every stream
/// folded, nothing kept), with `--fresh` (folded and kept), and the median
/// of three that read the kept facts. Each is checked to have counted every
/// recorded model call of the collect stage, and the kept report must
/// equal the one folded from the ledger.
fn time_report(l: &Ledger, calls: u32) -> (f64, f64, f64) {
    use audit::report::Mode;
    let timed = |mode| {
        let t = Instant::now();
        let r = audit::report::report_with(l, "bench", mode).expect("report");
        let s = t.elapsed().as_secs_f64();
        let collect = r.cycles[0]
            .stages
            .iter()
            .find(|c| c.stage == "collect")
            .expect("collect stage");
        assert_eq!(collect.model_calls, calls, "every model call counted");
        (s, serde_json::to_value(&r).expect("json"))
    };
    let (cold, oracle) = timed(Mode::Off);
    let (fresh, _) = timed(Mode::Fresh);
    let mut kept = Vec::new();
    for _ in 0..3 {
        let (s, r) = timed(Mode::Kept);
        assert_eq!(
            r, oracle,
            "the kept facts give the report folded from the ledger"
        );
        kept.push(s);
    }
    (cold, fresh, median(kept))
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

/// The sizes asked for (`--sizes=N,M`, `--quick`, the smoke run's), and
/// whether this is the smoke run.
fn sizes() -> (Vec<usize>, bool) {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --all-targets` runs this binary without `--bench`: a smoke run.
    let smoke = !args.iter().any(|a| a == "--bench");
    let quick = args.iter().any(|a| a == "--quick");
    let given: Vec<usize> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--sizes="))
        .flat_map(|v| v.split(',').filter_map(|n| n.parse().ok()))
        .collect();
    let sizes = if !given.is_empty() {
        given
    } else if smoke {
        vec![2_000, 10_000]
    } else if quick {
        vec![10_000, 100_000]
    } else {
        vec![10_000, 1_000_000]
    };
    (sizes, smoke)
}

/// A ledger of at least `size` events, reopened read-only: the ledger,
/// every rollout, the events written and the seconds it took.
fn build(dir: &std::path::Path, size: usize) -> (Ledger, Vec<Id>, usize, f64) {
    let l = Ledger::init(&dir.join("l")).expect("init");
    let t0 = Instant::now();
    let (mut all, mut events, mut t, mut head) = (Vec::new(), 0, 0, None);
    while events < size {
        let (r, n, h) = task_block(&l, t, head);
        all.extend(r);
        events += n;
        t += 1;
        head = Some(h);
    }
    close_run(&l, head);
    drop(l);
    let l = Ledger::open_read_only(&dir.join("l")).expect("open");
    (l, all, events, t0.elapsed().as_secs_f64())
}

/// `why`'s median and p90 over the queries, and the scan's median (ms).
fn time_why(l: &Ledger, all: &[Id]) -> (f64, f64, f64) {
    let (mut why_ms, mut scan_ms) = (Vec::new(), Vec::new());
    for q in 0..QUERIES {
        let id = all[(q * 7919) % all.len()];
        let t = Instant::now();
        let w = audit::why(l, id).expect("why");
        why_ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(w.judgments.len(), 2 * OPPONENTS, "every judgment found");
        assert!(w.ranking.is_some() && w.training.is_some());
        if q < 5 {
            let t = Instant::now();
            assert_eq!(scan_judgments(l, id), 2 * OPPONENTS);
            scan_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    (median(why_ms.clone()), p90(why_ms), median(scan_ms))
}

/// Builds a ledger of `size` events, times `why` and `report` on it, prints
/// the row and returns it.
fn measure(size: usize) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let (l, all, events, build) = build(dir.path(), size);
    let (m, p, s) = time_why(&l, &all);
    let (cold, fresh, kept) = time_report(&l, (all.len() * 3) as u32);
    println!(
        "{events:>9}  {build:>9.1}  {m:>10.3}  {p:>9.3}  {s:>12.1}  {:>10.5}  {cold:>13.2}  {fresh:>8.2}  {kept:>8.3}",
        m / s
    );
    serde_json::json!({
        "events": events,
        "build_s": build,
        "why_median_ms": m,
        "why_p90_ms": p,
        "scan_median_ms": s,
        "why_vs_scan": m / s,
        "report_cold_s": cold,
        "report_fresh_s": fresh,
        "report_kept_s": kept,
        "kept_vs_cold": kept / cold,
    })
}

fn main() {
    let (sizes, smoke) = sizes();
    println!(
        "mass why: the evidence chain of one rollout, {QUERIES} queries per ledger (medians, ms); mass report of the run (s: folding every stream; --fresh, which keeps the facts; median of 3 reading them)"
    );
    println!(
        "{:>9}  {:>9}  {:>10}  {:>9}  {:>12}  {:>10}  {:>13}  {:>8}  {:>8}",
        "events",
        "build s",
        "why median",
        "why p90",
        "scan median",
        "why/scan",
        "report cold s",
        "fresh s",
        "kept s"
    );
    let (mut rows, mut flatness) = (Vec::<serde_json::Value>::new(), None);
    for &size in &sizes {
        let row = measure(size);
        let m = row["why_median_ms"].as_f64().unwrap_or(f64::NAN);
        if let Some(first) = rows.first() {
            let (e0, m0) = (
                &first["events"],
                first["why_median_ms"].as_f64().unwrap_or(f64::NAN),
            );
            flatness = Some(m / m0);
            println!(
                "median at {} events / median at {e0} events: {:.2}x (flat = 1; goal: <= 10 ms at 1M)",
                row["events"],
                m / m0
            )
        }
        rows.push(row);
    }
    if let Some(last) = rows.last() {
        println!(
            "mass report of the {}-event run: {:.2} s folding every stream, {:.3} s reading the kept facts ({:.3}x; goal: <= 2 s at 1M)",
            last["events"],
            last["report_cold_s"].as_f64().unwrap_or(f64::NAN),
            last["report_kept_s"].as_f64().unwrap_or(f64::NAN),
            last["kept_vs_cold"].as_f64().unwrap_or(f64::NAN)
        );
    }
    if !smoke {
        let doc = serde_json::json!({"queries": QUERIES, "rows": rows, "flatness": flatness});
        if let Some(p) = report::write("why", &doc) {
            println!("figures: {}", p.display());
        }
    }
}
