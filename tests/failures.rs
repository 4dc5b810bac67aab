//! A transient failure through the CLI: a trainer that writes no metrics
//! stops `mass run` with exit 7 (an infrastructure failure), `mass status`
//! says what failed and that a resume retries it, and after the cause is
//! fixed `mass resume` completes the run, which then replays exactly.

use std::path::Path;
use std::process::{Command, Output};

fn mass(ledger: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mass"))
        .current_dir(cwd)
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .env_remove("MASS_LEDGER")
        .output()
        .unwrap()
}

const FLAKY: &str = r#"
import argparse, json, os, sys
p = argparse.ArgumentParser()
p.add_argument("--train"); p.add_argument("--val"); p.add_argument("--base"); p.add_argument("--out")
a = p.parse_args()
if not os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ok")):
    print("killed: out of memory")
    sys.exit(137)
d = os.path.join(a.out, "ckpt-1"); os.makedirs(d)
json.dump({"skill": 0.6, "delegation": 0.3, "verification": 0.4, "judge_noise": 0.3, "position_bias": 0.1, "blind_spot": 0.3}, open(os.path.join(d, "adapter.json"), "w"))
open(os.path.join(a.out, "metrics.jsonl"), "w").write(json.dumps({"checkpoint": "ckpt-1", "validation_loss": 0.5}) + "\n")
"#;

/// The smoke experiment in `dir/exp.toml`, its trainer running `script`.
fn write_experiment(dir: &Path, script: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tasks = std::fs::canonicalize(root.join("examples/tasks")).unwrap();
    let text = std::fs::read_to_string(root.join("examples/smoke.toml"))
        .unwrap()
        .replace(
            "tasks_dir = \"tasks\"",
            &format!("tasks_dir = {:?}", tasks.to_string_lossy()),
        )
        .replace(
            "[trainer]\nkind = \"sim\"",
            &format!("[trainer]\nkind = \"command\"\ncommand = \"python3 {} --train {{train}} --val {{validation}} --base {{base_model}} --out {{output_dir}}\"", script.display()),
        );
    assert!(
        text.contains("kind = \"command\""),
        "smoke.toml changed shape"
    );
    std::fs::write(dir.join("exp.toml"), text).unwrap();
}

#[test]
fn a_crashed_trainer_exits_7_and_resume_retries_it() {
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("train.py");
    std::fs::write(&script, FLAKY).unwrap();
    write_experiment(d.path(), &script);
    let l = d.path().join("ledger");
    let o = mass(&l, d.path(), &["run", "exp.toml", "--quiet"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(7), "{err}");
    assert!(
        err.contains("trainer") && err.contains("mass resume"),
        "{err}"
    );
    let o = mass(&l, d.path(), &["status", "smoke"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("failed for a reason outside the run") && out.contains("137"),
        "{out}"
    );
    std::fs::write(d.path().join("ok"), b"").unwrap();
    let o = mass(&l, d.path(), &["resume", "smoke", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = mass(&l, d.path(), &["replay", "smoke", "--check"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = mass(&l, d.path(), &["verify"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

/// A trainer that counts its starts in `starts.log` beside it, then, until
/// a file `ok` appears there, sleeps as if training for a long time.
const SLOW: &str = r#"
import argparse, json, os, time
here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser()
p.add_argument("--train"); p.add_argument("--val"); p.add_argument("--base"); p.add_argument("--out")
a = p.parse_args()
open(os.path.join(here, "starts.log"), "a").write("start\n")
if not os.path.exists(os.path.join(here, "ok")):
    time.sleep(1000)
d = os.path.join(a.out, "ckpt-1"); os.makedirs(d)
json.dump({"skill": 0.6, "delegation": 0.3, "verification": 0.4, "judge_noise": 0.3, "position_bias": 0.1, "blind_spot": 0.3}, open(os.path.join(d, "adapter.json"), "w"))
open(os.path.join(a.out, "metrics.jsonl"), "w").write(json.dumps({"checkpoint": "ckpt-1", "validation_loss": 0.5}) + "\n")
"#;

/// Pids whose command line names `needle`.
fn running(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&c).contains(needle) {
                out.push(pid);
            }
        }
    }
    out
}

/// Regression (#25): `kill -9` of mass during training left the trainer
/// running (parent 1), and `mass resume` started a second one beside it
/// (on a GPU, two jobs on one device). The trainer runs supervised: it is
/// gone within seconds of mass, and the resume trains once more, alone.
#[test]
fn regression_a_sigkilled_mass_leaves_no_trainer_and_resume_trains_once() {
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("slow_train.py");
    std::fs::write(&script, SLOW).unwrap();
    write_experiment(d.path(), &script);
    let l = d.path().join("ledger");
    let starts = d.path().join("starts.log");
    let count = || {
        std::fs::read_to_string(&starts)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_mass"))
        .current_dir(d.path())
        .arg("--ledger")
        .arg(&l)
        .args(["run", "exp.toml", "--quiet"])
        .env_remove("MASS_LEDGER")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let needle = script.to_string_lossy().into_owned();
    let t = std::time::Instant::now();
    while count() == 0 || running(&needle).is_empty() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(120),
            "the trainer never started"
        );
        assert!(child.try_wait().unwrap().is_none(), "mass ended first");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let t = std::time::Instant::now();
    while !running(&needle).is_empty() && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let left = running(&needle);
    for p in &left {
        // SAFETY: a plain signal to a process this test started.
        unsafe { libc::kill(*p as i32, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "the trainer outlived mass: {left:?}");
    std::fs::write(d.path().join("ok"), b"").unwrap();
    let o = mass(&l, d.path(), &["resume", "smoke", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(count(), 2, "one killed start, one resumed start");
    assert!(running(&needle).is_empty());
}
