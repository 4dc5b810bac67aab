//! Replay throughput: events per second when `Mode::Check` re-runs a driver over
//! a recorded history (every effect served, every event id recomputed and
//! compared), against the ledger's own full verify scan of the same ledger, at
//! several sizes. Prints medians of repeated runs and the ratio.
//!
//!     cargo bench --bench replay            # 10k and 100k events
//!     cargo bench --bench replay -- --full  # also 1M events
//!     cargo bench --bench replay -- --quick # 10k only, 1 repetition
//!
//! The figures are also written to `target/bench/replay.json` (not by the
//! smoke run under `cargo test`): `{"reps", "rows": [{"events",
//! "replay_events_per_s", "verify_events_per_s", "replay_vs_verify",
//! "replay_us_per_event"}], "linearity"}`, `linearity` being the throughput
//! at the largest size over that at the smallest (1 = linear time).

use std::sync::Arc;
use std::time::Instant;

#[path = "common/report.rs"]
mod report;

use ledger::{Ledger, NewEvent};
use replay::{EffectRequest, Mode, Session};
use schemas::{Effect, EffectStatus, Hash32, Note};

const STREAMS: usize = 100;

fn request(s: usize, i: usize) -> Vec<u8> {
    format!("{{\"step\":{i},\"stream\":{s},\"task\":\"compute\"}}").into_bytes()
}

fn output(s: usize, i: usize) -> Vec<u8> {
    format!("{{\"value\":{}}}", (s * 7919 + i * 104729) % 1000003).into_bytes()
}

fn note(s: usize, i: usize) -> NewEvent {
    schemas::to_event(&Note {
        text: format!("stream {s} decided {i}"),
    })
    .expect("encode")
}

/// Writes exactly what a live session of `drive` would, in large batches
/// (a live recording fsyncs per effect, which is not what is measured here).
fn build(l: &Ledger, events: usize) {
    let per = events / STREAMS;
    for s in 0..STREAMS {
        let rel = format!("w{s}");
        let name = replay::ref_name("bench", &rel);
        let mut head = None;
        let mut b = l.batch();
        for i in 0..per {
            let ev = if i % 2 == 0 {
                let rid = b.put_blob(&request(s, i)).expect("blob");
                let oid = b.put_blob(&output(s, i)).expect("blob");
                let rec = Effect {
                    effect: "compute".into(),
                    request: Hash32(rid.0),
                    status: EffectStatus::Ok,
                    output: Some(Hash32(oid.0)),
                    error: String::new(),
                    links: vec![],
                };
                schemas::to_event(&rec).expect("encode")
            } else {
                note(s, i)
            };
            head = Some(
                b.append(&name, head, ev.in_stream(rel.clone()))
                    .expect("append"),
            );
            if b.len() >= 4000 {
                b.commit().expect("commit");
                b = l.batch();
            }
        }
        b.commit().expect("commit");
    }
}

/// The driver, in check mode: everything is served and compared.
fn drive(l: &Arc<Ledger>, events: usize) -> usize {
    let s = Session::new(l.clone(), "bench", Mode::Check).expect("session");
    let per = events / STREAMS;
    let mut n = 0;
    for st_no in 0..STREAMS {
        let mut st = s.stream(&format!("w{st_no}")).expect("stream");
        for i in 0..per {
            if i % 2 == 0 {
                let r = st
                    .effect_blocking(EffectRequest::new("compute", request(st_no, i)), || {
                        Err("a check runs nothing".into())
                    })
                    .expect("served");
                assert_eq!(r.output.expect("ok"), output(st_no, i));
            } else {
                st.emit(note(st_no, i)).expect("same id");
            }
            n += 1;
        }
    }
    n
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --all-targets` runs this binary without `--bench`: a smoke run.
    let smoke = !args.iter().any(|a| a == "--bench");
    let quick = args.iter().any(|a| a == "--quick");
    let full = args.iter().any(|a| a == "--full");
    let sizes: Vec<usize> = if smoke {
        vec![2_000]
    } else if quick {
        vec![10_000]
    } else if full {
        vec![10_000, 100_000, 1_000_000]
    } else {
        vec![10_000, 100_000]
    };
    let reps = if quick || smoke { 1 } else { 3 };
    println!(
        "{:>9}  {:>14}  {:>14}  {:>7}  {:>14}",
        "events", "replay ev/s", "verify ev/s", "ratio", "replay us/ev"
    );
    let mut rows = Vec::new();
    for &n in &sizes {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = Arc::new(Ledger::init(dir.path()).expect("ledger"));
        build(&l, n);
        let (mut rep, mut ver) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let t = Instant::now();
            let done = drive(&l, n);
            rep.push(done as f64 / t.elapsed().as_secs_f64());
            let t = Instant::now();
            let r = l.verify(&|_| Ok(())).expect("verify");
            assert!(r.is_clean());
            ver.push(r.events as f64 / t.elapsed().as_secs_f64());
        }
        let (r, v) = (median(rep), median(ver));
        println!(
            "{n:>9}  {r:>14.0}  {v:>14.0}  {:>6.2}x  {:>14.2}",
            r / v,
            1e6 / r
        );
        rows.push((n, r, v));
    }
    let mut linearity = None;
    if rows.len() > 1 {
        let (n0, r0, _) = rows[0];
        let (n1, r1, _) = rows[rows.len() - 1];
        linearity = Some(r1 / r0);
        println!("linearity: {}x more events, throughput {:.2}x of the smallest size (1.00 = perfectly linear time)", n1 / n0, r1 / r0);
    }
    println!("goal: replay >= 0.5x verify throughput, and linear");
    if !smoke {
        let rows: Vec<_> = rows
            .iter()
            .map(|&(n, r, v)| {
                serde_json::json!({
                    "events": n,
                    "replay_events_per_s": r,
                    "verify_events_per_s": v,
                    "replay_vs_verify": r / v,
                    "replay_us_per_event": 1e6 / r,
                })
            })
            .collect();
        let doc = serde_json::json!({"reps": reps, "rows": rows, "linearity": linearity});
        if let Some(p) = report::write("replay", &doc) {
            println!("figures: {}", p.display());
        }
    }
}
