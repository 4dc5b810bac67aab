//! The simulated backend behaves like a model of the mechanism: skill shows up
//! only through the work left in the workspace (validation scores, reports),
//! and a judge whose blind spot rewards confident reports sees less of it.

use std::path::PathBuf;
use std::sync::Arc;

use engine::backend::sim::{SimBackend, SimParams};
use engine::backend::Backend;
use engine::config::Limits;
use engine::harness::{run_team, RunRules, RunSpec, Team};
use engine::judge::{judge_pair, Judge, RunRef};
use engine::task::Task;
use engine::workflow::Workflow;
use ledger::Ledger;
use replay::{Mode, Session};

/// Awaits engine work from synchronous test code.
fn wait<F: std::future::Future>(f: F) -> F::Output {
    engine::exec::block_on(f).expect("the engine's runtime starts")
}

fn tasks_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/tasks")
}

fn runs(s: &Session, task: &Task, skill: f64, n: u32) -> Vec<RunRef> {
    let b: Arc<dyn Backend> = Arc::new(
        SimBackend::new(
            "sim",
            SimParams::new(skill, 0.1, 0.2, 0.0, 0.0),
            &tasks_dir(),
        )
        .unwrap(),
    );
    let team = Team {
        orchestrator: b.clone(),
        orchestrator_model: "sim/base".into(),
        subagent: b,
        subagent_model: "sim/base".into(),
        sampling: engine::config::SamplingConfig::with(0.7, 4096),
    };
    let limits = Limits {
        max_tokens: 400_000,
        ..Limits::default()
    };
    (0..n)
        .map(|i| {
            let o = wait(run_team(
                s,
                &RunSpec {
                    task,
                    workflow: &Workflow::bare(),
                    stream: format!("skill{skill}/{i}"),
                    purpose: "test",
                    cycle: 1,
                    index: i,
                },
                &team,
                &RunRules {
                    limits: limits.clone(),
                    ..Default::default()
                },
            ))
            .unwrap();
            RunRef {
                event: o.event,
                record: o.record,
                violations: o.guard.violations,
            }
        })
        .collect()
}

fn mean_score(r: &[RunRef]) -> f64 {
    r.iter()
        .map(|x| x.record.score_passed as f64 / x.record.score_total.max(1) as f64)
        .sum::<f64>()
        / r.len() as f64
}

/// Over 8 seeds: skill shows in the validation scores; a careful judge
/// prefers the strong runs; a judge whose blind spot weighs how confident
/// reports sound prefers the weak ones (their misleading claims sound
/// confident).
#[test]
fn skill_shows_in_the_workspace_and_a_blind_judge_prefers_confident_mistakes() {
    let task = Task::load(&tasks_dir().join("fin-momentum-backtest")).unwrap();
    let (mut careful, mut blind) = ((0, 0), (0, 0));
    for seed in 1..=8u64 {
        let d = tempfile::tempdir().unwrap();
        let s = Session::new(Arc::new(Ledger::init(d.path()).unwrap()), "sim", Mode::Live).unwrap();
        s.set_seed(seed);
        let weak = runs(&s, &task, 0.1, 4);
        let strong = runs(&s, &task, 0.95, 4);
        let (w, st) = (mean_score(&weak), mean_score(&strong));
        assert!(st > w, "seed {seed}: strong {st:.2} vs weak {w:.2}");
        let judge_with = |blind: f64| -> (u32, u32) {
            let b: Arc<dyn Backend> = Arc::new(
                SimBackend::new(
                    "j",
                    SimParams::new(0.6, 0.1, 0.05, 0.0, blind),
                    &tasks_dir(),
                )
                .unwrap(),
            );
            let j = Judge {
                backend: b,
                model: "j/base".into(),
                max_retries: 2,
                sampling: engine::config::SamplingConfig::with(0.2, 1024),
                shown: engine::judge::Shown::Workspaces,
            };
            let (mut sw, mut ww) = (0, 0);
            for (i, (a, bb)) in strong.iter().zip(&weak).enumerate() {
                let (_, v) = wait(judge_pair(
                    &s,
                    &format!("judge{blind}/{i}"),
                    &task,
                    a,
                    bb,
                    i % 2 == 1,
                    &j,
                ))
                .unwrap();
                match v.winner.as_str() {
                    "a" => sw += 1,
                    "b" => ww += 1,
                    _ => {}
                }
            }
            (sw, ww)
        };
        let c = judge_with(0.0);
        let b = judge_with(1.0);
        careful = (careful.0 + c.0, careful.1 + c.1);
        blind = (blind.0 + b.0, blind.1 + b.1);
    }
    assert!(
        careful.0 > 2 * careful.1,
        "careful judge: strong {}, weak {}",
        careful.0,
        careful.1
    );
    // The blind spot does harm, not just noise: the weak runs' confident,
    // misleading conclusions win (before, a blind judge was indifferent).
    assert!(
        blind.1 > blind.0 && blind.0 < careful.0,
        "blind judge: strong {}, weak {} (careful: strong {})",
        blind.0,
        blind.1,
        careful.0
    );
}
