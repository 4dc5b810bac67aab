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

#[test]
fn a_crashed_trainer_exits_7_and_resume_retries_it() {
    let d = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = d.path().join("train.py");
    std::fs::write(&script, FLAKY).unwrap();
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
    std::fs::write(d.path().join("exp.toml"), text).unwrap();
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
