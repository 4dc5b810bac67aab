//! The simulated backend behaves like a model of the mechanism: skill shows up
//! only through the work left in the workspace (validation scores), and a
//! judge with a full blind spot cannot tell good work from bad.

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

#[test]
fn skill_shows_in_the_workspace_and_a_blind_judge_cannot_see_it() {
    let d = tempfile::tempdir().unwrap();
    let s = Session::new(Arc::new(Ledger::init(d.path()).unwrap()), "sim", Mode::Live).unwrap();
    s.set_seed(11);
    let task = Task::load(&tasks_dir().join("fin-momentum-backtest")).unwrap();
    let weak = runs(&s, &task, 0.1, 8);
    let strong = runs(&s, &task, 0.95, 8);
    let (w, st) = (mean_score(&weak), mean_score(&strong));
    assert!(st > w + 0.1, "strong {st:.2} vs weak {w:.2}");
    // A careful judge prefers the strong runs; a fully blind one cannot tell.
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
    let (careful_strong, careful_weak) = judge_with(0.0);
    assert!(
        careful_strong > careful_weak,
        "careful judge: strong {careful_strong}, weak {careful_weak}"
    );
    let (blind_strong, _) = judge_with(1.0);
    assert!(
        blind_strong < careful_strong,
        "a blind judge cannot see the difference ({blind_strong} vs {careful_strong})"
    );
}
