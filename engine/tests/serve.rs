//! `[backends.NAME.serve]`: model servers `mass` starts itself. Against a
//! fake OpenAI-compatible server (tests/fixtures/fake_server.py, which says
//! in every answer what it serves), over two cycles and several seeds:
//! the base model's calls are answered by a server started with `command`;
//! after training, the trained model's by a server started with
//! `adapter_command` on the adapter files the trainer wrote (checked out of
//! the ledger); every server is gone when the run returns; a replay starts
//! none; a server that dies before it is ready stops the run as an
//! infrastructure failure that names its log.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use engine::context::NoProgress;
use engine::driver::{drive, RunRequest};
use ledger::Ledger;
use replay::Mode;

const TRAINER: &str = r#"
import argparse, json, os
p = argparse.ArgumentParser()
for a in ["--train", "--validation", "--base-model", "--output-dir", "--init"]:
    p.add_argument(a)
a = p.parse_args()
n = sum(1 for l in open(a.train) if l.strip())
d = os.path.join(a.output_dir, "checkpoint-1")
os.makedirs(d)
start = ""
if a.init:
    start = " from [" + open(os.path.join(a.init, "adapter.txt")).read() + "]"
open(os.path.join(d, "adapter.txt"), "w").write(f"{a.base_model} tuned on {n}{start}")
with open(os.path.join(a.output_dir, "metrics.jsonl"), "w") as m:
    m.write(json.dumps({"step": 1, "train_loss": 1.5}) + "\n")
    m.write(json.dumps({"step": 1, "checkpoint": "checkpoint-1", "validation_loss": 1.2}) + "\n")
"#;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The llama.cpp example turned to the fake server `mass` starts: two
/// cycles, `seed`, the trainer above; `extra` is added to the serve table.
fn experiment(dir: &Path, seed: u64, extra: &str) -> String {
    let fake = root().join("engine/tests/fixtures/fake_server.py");
    let fake = fake.canonicalize().expect("fixture");
    let tasks = root().join("examples/tasks").canonicalize().expect("tasks");
    let trainer = dir.join("trainer.py");
    std::fs::write(&trainer, TRAINER).expect("trainer");
    let pids = dir.join("pids");
    let text = std::fs::read_to_string(root().join("examples/llamacpp.toml")).expect("example");
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("base_url") || line.starts_with("command = ") {
            continue;
        }
        let line = match line {
            l if l.starts_with("tasks_dir") => {
                format!("tasks_dir = {:?}", tasks.display().to_string())
            }
            l if l.starts_with("seed =") => format!("seed = {seed}"),
            l if l.starts_with("cycles =") => "cycles = 2".to_string(),
            l => l.to_string(),
        };
        out.push(line);
        if out.last().is_some_and(|l| l == "[trainer]") {
            out.push(format!(
                "command = \"python3 {} --train {{train}} --validation {{validation}} --base-model {{base_model}} --output-dir {{output_dir}} --init {{base_adapter}}\"",
                trainer.display()
            ));
        }
    }
    let mut text = out.join("\n");
    text.push_str(&format!(
        "\n[backends.server.serve]\ncommand = \"python3 {f} --port {{port}} --pidfile {p}\"\nadapter_command = \"python3 {f} --port {{port}} --adapter {{adapter}} --pidfile {p}\"\nstart_timeout_secs = 30\n{extra}\n",
        f = fake.display(),
        p = pids.display()
    ));
    text
}

fn run(
    l: &Arc<Ledger>,
    name: &str,
    mode: Mode,
    exp: Option<String>,
) -> engine::error::Result<engine::driver::RunSummary> {
    drive(
        l.clone(),
        RunRequest {
            run: name.to_string(),
            experiment: exp.map(|t| (t, "serve.toml".to_string())),
            mode,
            source: None,
            progress: &NoProgress,
        },
    )
}

/// Every rollout of run `name`: (orchestrator model, purpose, report).
fn rollouts(l: &Ledger, name: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (r, head) in l.refs().expect("refs") {
        if !r.starts_with(&format!("{name}/")) {
            continue;
        }
        let ev = l.get_event(&head).expect("head");
        if ev.kind == "mass.rollout" {
            let ro: schemas::Rollout = schemas::decode_event(&ev).expect("rollout");
            out.push((ro.orchestrator_model, ro.purpose, ro.report));
        }
    }
    out
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

fn pids(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
fn trained_adapters_are_served_by_servers_mass_starts_and_stops() {
    for seed in [1u64, 2, 3] {
        let d = tempfile::tempdir().expect("tempdir");
        let l = Arc::new(Ledger::init(&d.path().join("l")).expect("ledger"));
        let name = format!("serve-{seed}");
        let s = run(&l, &name, Mode::Live, Some(experiment(d.path(), seed, "")))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let models: Vec<String> = s.cycles.iter().map(|c| c.next_model.clone()).collect();
        assert_eq!(models.len(), 2, "seed {seed}");
        for (i, m) in models.iter().enumerate() {
            assert!(
                m.starts_with(&format!("smollm2-135m+c{}-", i + 1)),
                "seed {seed}: a trained adapter gets a name of its own: {m}"
            );
        }
        let rs = rollouts(&l, &name);
        let mut by_adapter = 0;
        for (model, purpose, report) in &rs {
            if model == "smollm2-135m" {
                assert_eq!(report, "served by base", "seed {seed} {purpose}");
            } else {
                // The trained model's calls went to the server started on
                // its adapter files: the base model's name and the data
                // the trainer saw are in them.
                assert!(
                    report.starts_with("served by adapter smollm2-135m")
                        && report.contains("tuned on"),
                    "seed {seed}: {model} {purpose}: {report}"
                );
                assert!(models.contains(model), "seed {seed}: {model}");
                // Cycle 2's model was trained on from cycle 1's adapter
                // files ({base_adapter}); cycle 1's from the base.
                if model == &models[1] {
                    assert!(
                        report.contains(&format!("{} tuned on", models[0]))
                            && report.contains(" from [smollm2-135m tuned on"),
                        "seed {seed}: {report}"
                    );
                } else {
                    assert!(!report.contains(" from ["), "seed {seed}: {report}");
                }
                by_adapter += 1;
            }
        }
        assert!(
            by_adapter > 0,
            "seed {seed}: no call reached a trained model"
        );
        // Base, c1 and c2: three servers, all gone now.
        let started = pids(d.path());
        assert_eq!(started.len(), 3, "seed {seed}: {started:?}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while started.iter().any(|p| alive(*p)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(
            !started.iter().any(|p| alive(*p)),
            "seed {seed}: a server outlived the run"
        );
        // A replay answers every call from the ledger: no server starts.
        let c = run(&l, &name, Mode::Check, None).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(c.head, s.head, "seed {seed}");
        assert_eq!(
            pids(d.path()).len(),
            3,
            "seed {seed}: the replay started a server"
        );
    }
}

#[test]
fn a_server_that_dies_before_it_is_ready_stops_the_run_and_names_its_log() {
    let d = tempfile::tempdir().expect("tempdir");
    let l = Arc::new(Ledger::init(&d.path().join("l")).expect("ledger"));
    let text = experiment(d.path(), 1, "").replace("--pidfile", "--fail --pidfile");
    let err = run(&l, "dies", Mode::Live, Some(text)).expect_err("no server, no run");
    let msg = err.to_string();
    assert!(
        matches!(err, engine::error::EngineError::Infrastructure { .. }),
        "{msg}"
    );
    assert!(
        msg.contains("exited with") && msg.contains(".log") && msg.contains("out of memory"),
        "{msg}"
    );
}
