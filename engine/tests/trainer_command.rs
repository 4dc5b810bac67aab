//! An external trainer command: placeholders filled, command line, exit status,
//! log, metrics and output directory recorded, lowest-validation-loss
//! checkpoint chosen, and the trained adapter served to the next stage.

use std::sync::Arc;

use engine::context::NoProgress;
use engine::driver::{drive, RunRequest};
use ledger::{Id, Ledger};
use replay::Mode;

const TRAINER: &str = r#"
import argparse, json, os
p = argparse.ArgumentParser()
p.add_argument("--train"); p.add_argument("--val"); p.add_argument("--base"); p.add_argument("--out"); p.add_argument("--hp")
a = p.parse_args()
hp = json.load(open(a.hp))
n = sum(1 for l in open(a.train) if l.strip())
print(f"training {a.base} on {n} examples with {hp}")
losses = [0.91, 0.62, 0.75]
with open(os.path.join(a.out, "metrics.jsonl"), "w") as m:
    for i, loss in enumerate(losses, 1):
        m.write(json.dumps({"step": 2 * i - 1, "train_loss": 2.0 - 0.1 * i, "learning_rate": hp["learning_rate"], "tokens": 100 * i}) + "\n")
        d = os.path.join(a.out, f"ckpt-{i}")
        os.makedirs(d)
        params = {"skill": 0.5 + 0.05 * i, "delegation": 0.3, "verification": 0.4, "judge_noise": 0.3, "position_bias": 0.1, "blind_spot": 0.3}
        json.dump(params, open(os.path.join(d, "adapter.json"), "w"))
        m.write(json.dumps({"step": 2 * i, "checkpoint": f"ckpt-{i}", "validation_loss": loss}) + "\n")
    m.write("not a metrics line\n")
json.dump({"name": "toy", "version": 3, "script_sha256": "abc"}, open(os.path.join(a.out, "trainer.json"), "w"))
"#;

/// The smoke experiment with `seed` and an external trainer running `script`.
fn experiment(script: &std::path::Path, seed: u64) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let smoke = std::fs::read_to_string(root.join("examples/smoke.toml")).unwrap();
    let tasks = std::fs::canonicalize(root.join("examples/tasks")).unwrap();
    let text = smoke
        .replace("tasks_dir = \"tasks\"", &format!("tasks_dir = {:?}", tasks.to_string_lossy()))
        .replace("[trainer]\nkind = \"sim\"", &format!("[trainer]\nkind = \"command\"\ncommand = \"python3 {} --train {{train}} --val {{validation}} --base {{base_model}} --out {{output_dir}} --hp {{hyperparameters}}\"\ntimeout_secs = 60\nhyperparameters = {{ learning_rate = 0.0002, rank = 16 }}", script.display()));
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("seed = "))
        .expect("smoke.toml sets a seed");
    lines[at] = format!("seed = {seed}");
    let text = lines.join("\n");
    assert!(
        text.contains("kind = \"command\""),
        "the smoke file's trainer section changed shape:\n{text}"
    );
    text
}

/// Runs (or resumes, or checks) run `name` on `l`.
fn run(
    l: &Arc<Ledger>,
    name: &str,
    mode: Mode,
    experiment: Option<(String, String)>,
) -> engine::error::Result<engine::driver::RunSummary> {
    drive(
        l.clone(),
        RunRequest {
            run: name.to_string(),
            experiment,
            mode,
            source: None,
            progress: &NoProgress,
        },
    )
}

/// Seeds tried: a run whose inner loop finds no workflow that beats the
/// reference collects no data and trains nothing (a normal outcome); the
/// tests hold for every seed and need some seed to train.
const SEEDS: std::ops::RangeInclusive<u64> = 1..=8;

#[test]
fn an_external_trainer_is_recorded_and_its_best_checkpoint_used() {
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("train.py");
    std::fs::write(&script, TRAINER).unwrap();
    let l = Arc::new(Ledger::init(&d.path().join("l")).unwrap());
    let mut trained = 0;
    for seed in SEEDS {
        let text = experiment(&script, seed);
        let exp_path = d.path().join(format!("exp-{seed}.toml"));
        std::fs::write(&exp_path, &text).unwrap();
        let s = run(
            &l,
            &format!("ext-{seed}"),
            Mode::Live,
            Some((text, exp_path.to_string_lossy().into_owned())),
        )
        .unwrap();
        let head = s.head.unwrap();
        let Some(tr) = l
            .chain(head)
            .map(|e| e.unwrap())
            .find(|e| e.kind == "mass.training")
        else {
            assert_eq!(
                s.cycles[0].tasks_with_data, 0,
                "seed {seed}: data but no training"
            );
            continue;
        };
        trained += 1;
        let t: schemas::Training = schemas::decode_event(&tr).unwrap();
        assert_eq!(t.exit_status, 0);
        // The recorded command is the template: the expanded line names a
        // temporary directory (with a pid), which must not enter an id.
        assert!(
            t.command.starts_with("python3 ") && t.command.contains("{train}"),
            "{}",
            t.command
        );
        assert!(!t.command.contains("mass-train-"), "{}", t.command);
        assert_eq!(t.checkpoint, "ckpt-2", "lowest validation loss");
        assert!((t.validation_loss - 0.62).abs() < 1e-12);
        let log = String::from_utf8(l.get_blob(&Id(t.log.0)).unwrap()).unwrap();
        assert!(log.contains("training sim/base on"), "{log}");
        let out = l.get_tree(&Id(t.output.0)).unwrap();
        assert!(out.get("metrics.jsonl").is_some() && out.get("ckpt-2/adapter.json").is_some());
        // What the trainer was given and said, recorded with the step.
        let hp: serde_json::Value =
            serde_json::from_slice(&l.get_blob(&Id(t.hyperparameters.0)).unwrap()).unwrap();
        assert_eq!(hp, serde_json::json!({"learning_rate": 0.0002, "rank": 16}));
        assert!(log.contains("'rank': 16"), "the trainer read them: {log}");
        assert_eq!(t.trainer_version, "toy 3 sha256:abc");
        assert!(
            t.checkpoint_reason.contains("0.6200")
                && t.checkpoint_reason.contains("of 3 checkpoint"),
            "{}",
            t.checkpoint_reason
        );
        let adapter = l.get_tree(&Id(t.adapter.0)).unwrap();
        assert!(
            adapter.get("adapter.json").is_some(),
            "the chosen checkpoint's files"
        );
        // One train_step event per metrics line with a step, in order.
        let steps: Vec<schemas::TrainStep> = l
            .chain(l.head(&format!("ext-{seed}/c1/train")).unwrap().unwrap())
            .map(|e| e.unwrap())
            .filter(|e| e.kind == "mass.train_step")
            .map(|e| schemas::decode_event(&e).unwrap())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        assert_eq!(t.steps, 6);
        assert_eq!(steps.len(), 6);
        assert_eq!(
            steps.iter().map(|s| s.step).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6]
        );
        assert_eq!(steps[0].train_loss, Some(1.9));
        assert_eq!(steps[0].learning_rate, Some(0.0002));
        assert_eq!(steps[0].tokens, Some(100));
        assert_eq!(
            (steps[3].checkpoint.as_str(), steps[3].validation_loss),
            ("ckpt-2", Some(0.62))
        );
        // The trained model was served to the held-out evaluation.
        assert_eq!(s.cycles[0].next_model, t.new_model);
        assert!(s.cycles[0].evaluation.is_some());
    }
    assert!(trained > 0, "no seed in {SEEDS:?} produced training data");
}

/// A trainer that leaves no metrics unless `ok` exists beside it.
const FLAKY: &str = r#"
import argparse, json, os, sys
p = argparse.ArgumentParser()
p.add_argument("--train"); p.add_argument("--val"); p.add_argument("--base"); p.add_argument("--out")
p.add_argument("--hp")
a = p.parse_args()
if not os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ok")):
    print("out of memory, no metrics written")
    sys.exit(0)
d = os.path.join(a.out, "ckpt-1"); os.makedirs(d)
json.dump({"skill": 0.6, "delegation": 0.3, "verification": 0.4, "judge_noise": 0.3, "position_bias": 0.1, "blind_spot": 0.3}, open(os.path.join(d, "adapter.json"), "w"))
open(os.path.join(a.out, "metrics.jsonl"), "w").write(json.dumps({"checkpoint": "ckpt-1", "validation_loss": 0.5}) + "\n")
"#;

#[test]
fn a_trainer_that_wrote_no_metrics_is_retried_after_the_cause_is_fixed() {
    // Before: the missing metrics were recorded as NaN (stored as null) and
    // every later read failed "recorded trainer output is unreadable", also
    // after the cause was fixed.
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("train.py");
    std::fs::write(&script, FLAKY).unwrap();
    let l = Arc::new(Ledger::init(&d.path().join("l")).unwrap());
    // The first seed whose run trains (the others collect no data and
    // finish without calling the trainer).
    let mut failed = None;
    for seed in SEEDS {
        let name = format!("flaky-{seed}");
        match run(
            &l,
            &name,
            Mode::Live,
            Some((experiment(&script, seed), "exp.toml".into())),
        ) {
            Ok(s) => assert_eq!(
                s.cycles[0].tasks_with_data, 0,
                "seed {seed} trained without metrics"
            ),
            Err(e) => {
                failed = Some((name, e));
                break;
            }
        }
    }
    let (name, err) = failed.expect("no seed produced training data");
    let msg = err.to_string();
    assert!(
        matches!(err, engine::error::EngineError::Infrastructure { .. }),
        "{msg}"
    );
    assert!(
        msg.contains("metrics.jsonl") && msg.contains("mass resume"),
        "{msg}"
    );
    // Resuming without fixing the cause fails the same way (another attempt).
    assert!(run(&l, &name, Mode::Live, None).is_err());
    // Fixed: the resume runs the trainer again and the run completes.
    std::fs::write(d.path().join("ok"), b"").unwrap();
    let s = run(&l, &name, Mode::Live, None).expect("resume after the fix");
    let head = s.head.unwrap();
    let attempts = l
        .chain(l.head(&format!("{name}/c1/train")).unwrap().unwrap())
        .filter(|e| e.as_ref().unwrap().kind == "effect")
        .count();
    assert_eq!(
        attempts, 6,
        "three journaled attempts (started + result each)"
    );
    let t: schemas::Training = schemas::decode_event(
        &l.chain(head)
            .map(|e| e.unwrap())
            .find(|e| e.kind == "mass.training")
            .unwrap(),
    )
    .unwrap();
    assert!((t.validation_loss - 0.5).abs() < 1e-12);
    // The recording replays without running anything.
    let c = run(&l, &name, Mode::Check, None).expect("replay check");
    assert_eq!(c.head, Some(head));
}

/// A trainer that hangs (and leaves a grandchild behind) until `ok` exists
/// beside it.
const HANGS: &str = r#"
import argparse, json, os, subprocess, sys, time
p = argparse.ArgumentParser()
p.add_argument("--train"); p.add_argument("--val"); p.add_argument("--base"); p.add_argument("--out"); p.add_argument("--hp")
a = p.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
if not os.path.exists(os.path.join(here, "ok")):
    child = subprocess.Popen(["sleep", "300"])
    open(os.path.join(here, "grandchild.pid"), "w").write(str(child.pid))
    print("stuck", flush=True)
    time.sleep(300)
d = os.path.join(a.out, "ckpt-1"); os.makedirs(d)
json.dump({"skill": 0.6, "delegation": 0.3, "verification": 0.4, "judge_noise": 0.3, "position_bias": 0.1, "blind_spot": 0.3}, open(os.path.join(d, "adapter.json"), "w"))
open(os.path.join(a.out, "metrics.jsonl"), "w").write(json.dumps({"checkpoint": "ckpt-1", "validation_loss": 0.5}) + "\n")
"#;

/// A trainer past `trainer.timeout_secs` is killed with everything it
/// started (its process group), the run stops as an infrastructure failure
/// naming the limit, and a resume after the fix trains.
#[test]
fn a_trainer_past_its_timeout_is_killed_with_its_children_and_resumed() {
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("train.py");
    std::fs::write(&script, HANGS).unwrap();
    let l = Arc::new(Ledger::init(&d.path().join("l")).unwrap());
    let mut failed = None;
    for seed in SEEDS {
        let name = format!("hangs-{seed}");
        let text = experiment(&script, seed).replace("timeout_secs = 60", "timeout_secs = 2");
        let started = std::time::Instant::now();
        match run(&l, &name, Mode::Live, Some((text, "exp.toml".into()))) {
            Ok(s) => assert_eq!(s.cycles[0].tasks_with_data, 0, "seed {seed}"),
            Err(e) => {
                failed = Some((name, e, started.elapsed()));
                break;
            }
        }
    }
    let (name, err, took) = failed.expect("no seed produced training data");
    let msg = err.to_string();
    assert!(
        matches!(err, engine::error::EngineError::Infrastructure { .. }),
        "{msg}"
    );
    assert!(
        msg.contains("timeout_secs (2 s)") && msg.contains("stuck"),
        "{msg}"
    );
    assert!(took < std::time::Duration::from_secs(120), "{took:?}");
    // The grandchild died with the group.
    let pid: i32 = std::fs::read_to_string(d.path().join("grandchild.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while alive() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!alive(), "the trainer's child {pid} outlived the timeout");
    std::fs::write(d.path().join("ok"), b"").unwrap();
    let s = run(&l, &name, Mode::Live, None).expect("resume after the fix");
    assert!(s.cycles[0].evaluation.is_some());
}
