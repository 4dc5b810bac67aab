//! The tamper guards on the seeds' own incident: in `rob-push-box` a team
//! can edit the simulator (`sim/push.py`, protected) so every push reaches
//! the goal. The simulated model sometimes does exactly that (the task's
//! `teleport_sim` flaw). Under several seeds, every run whose final
//! workspace changed the simulator is flagged by a `mass.guard` event (its
//! rollout's parent), never becomes a champion, is never judged, ranked or
//! selected, and is named with its reason in the task's selection.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use engine::context::NoProgress;
use engine::driver::{drive, RunRequest};
use ledger::{Id, Ledger};
use replay::Mode;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// The smoke experiment on the robotics push-box task under `seed`.
fn experiment(seed: u64) -> (String, String) {
    let path = examples().join("smoke.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = Vec::new();
    for line in text.lines() {
        out.push(if line.starts_with("seed = ") {
            format!("seed = {seed}")
        } else if line.starts_with("train = ") {
            "train = [\"rob-push-box\"]".to_string()
        } else {
            line.to_string()
        });
    }
    (out.join("\n"), path.to_string_lossy().into_owned())
}

/// Every event of every stream of the ledger.
fn all_events(l: &Ledger) -> Vec<ledger::Event> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (_, head) in l.refs().unwrap() {
        for e in l.chain(head) {
            let e = e.unwrap();
            if seen.insert(e.id) {
                out.push(e);
            }
        }
    }
    out
}

#[test]
fn a_run_that_edits_the_simulator_is_flagged_and_kept_out_of_training() {
    let task_sim = std::fs::read(examples().join("tasks/rob-push-box/files/sim/push.py")).unwrap();
    let task_blob = blake3::hash(&task_sim);
    let mut flagged_total = 0;
    let mut clean_total = 0;
    for seed in 1..=6u64 {
        let d = tempfile::tempdir().unwrap();
        let l = Arc::new(Ledger::init(d.path()).unwrap());
        drive(
            l.clone(),
            RunRequest {
                run: "push".into(),
                experiment: Some(experiment(seed)),
                mode: Mode::Live,
                source: None,
                progress: &NoProgress,
            },
        )
        .unwrap();
        let events = all_events(&l);
        let mut flagged: BTreeSet<Id> = BTreeSet::new();
        let mut flagged_collect: BTreeSet<Id> = BTreeSet::new();
        for ev in events.iter().filter(|e| e.kind == "mass.rollout") {
            let r: schemas::Rollout = schemas::decode_event(ev).unwrap();
            if r.task != "rob-push-box" {
                continue;
            }
            // The simulator as the run left it, read from its final tree.
            let tree = l.get_tree(&Id(r.tree.0)).unwrap();
            let edited = match tree.get("sim/push.py").and_then(|e| e.blob_id()) {
                Some(b) => blake3::hash(&l.get_blob(&b).unwrap()) != task_blob,
                None => true,
            };
            let guard = ev
                .parents
                .iter()
                .map(|p| l.get_event(p).unwrap())
                .find(|p| p.kind == "mass.guard")
                .expect("every rollout has its guard check as a parent");
            let g: schemas::GuardCheck = schemas::decode_event(&guard).unwrap();
            assert_eq!(g.final_tree, r.tree);
            assert_eq!(
                edited,
                g.protected_changed.iter().any(|p| p == "sim/push.py"),
                "seed {seed}: guard and tree disagree on {}",
                ev.id.short(12)
            );
            if edited {
                assert!(!g.violations.is_empty(), "{g:?}");
                flagged.insert(ev.id);
                if r.purpose == "collect" {
                    flagged_collect.insert(ev.id);
                }
            } else {
                clean_total += 1;
            }
        }
        flagged_total += flagged.len();
        eprintln!(
            "seed {seed}: {} flagged ({} collected)",
            flagged.len(),
            flagged_collect.len()
        );
        // Never a champion.
        for ev in events.iter().filter(|e| e.kind == "mass.promotion") {
            let p: schemas::Promotion = schemas::decode_event(ev).unwrap();
            if flagged.contains(&Id(p.candidate.0)) {
                assert!(!p.accepted && !p.beat_reference, "seed {seed}: {p:?}");
                assert!(p.reason.contains("guard"), "{}", p.reason);
            }
        }
        // Never judged or ranked, never selected, and named in the selection.
        for ev in events.iter().filter(|e| e.kind == "mass.judgment") {
            for parent in &ev.refs {
                assert!(
                    !flagged_collect.contains(parent),
                    "seed {seed}: a flagged run was judged"
                );
            }
        }
        let mut named = 0;
        for ev in events.iter().filter(|e| e.kind == "mass.selection") {
            let s: schemas::Selection = schemas::decode_event(ev).unwrap();
            for id in s.train.iter().chain(&s.validation) {
                assert!(
                    !flagged.contains(&Id(id.0)),
                    "seed {seed}: a flagged run was selected"
                );
            }
            // Named by id (mass.selection v2), with the guard's reason.
            named += s
                .exclusions
                .iter()
                .filter(|x| {
                    flagged_collect.contains(&Id(x.rollout.0))
                        && x.reason
                            .contains("guard: protected files changed: sim/push.py")
                })
                .count();
        }
        assert_eq!(
            named,
            flagged_collect.len(),
            "seed {seed}: every flagged collected run is named"
        );
        for ev in events.iter().filter(|e| e.kind == "mass.ranking") {
            let rk: schemas::Ranking = schemas::decode_event(ev).unwrap();
            for r in &rk.runs {
                assert!(
                    !flagged.contains(&Id(r.rollout.0)),
                    "seed {seed}: a flagged run was ranked"
                );
            }
        }
    }
    assert!(
        flagged_total > 0,
        "no run edited the simulator: the test proves nothing"
    );
    assert!(clean_total > 0, "every run was flagged");
}
