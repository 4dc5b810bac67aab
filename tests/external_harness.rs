//! `[harness] kind = "external"` through the `mass` binary, with a tiny
//! agent program (tests/fixtures/tiny_agent.py, python3 only) against the
//! scripted OpenAI-compatible server: the happy path (recorded, exported,
//! re-executed against the recording with the server stopped) and the
//! paths off it: a program that fails, one that hangs, and a model server
//! that is not there (the run stops with exit 7 and `mass resume` runs the
//! rollout again once it is). tests/qwen_code.rs does the same with the
//! real Qwen Code.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{root, scripted_server, text};

/// A port nothing listens on.
fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}/v1", l.local_addr().unwrap())
}

struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    exp: PathBuf,
}

/// An experiment whose team is the tiny agent (`command`, `timeout_secs`
/// as given), the judge and optimizer simulated. The directory is made
/// traversable: the sandbox user runs the agent from it.
fn setup(command: &str, timeout_secs: u64) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent_dir = dir.join("agent");
    std::fs::create_dir(&agent_dir).unwrap();
    std::fs::copy(
        root().join("tests/fixtures/tiny_agent.py"),
        agent_dir.join("tiny_agent.py"),
    )
    .unwrap();
    let status = Command::new("cp")
        .arg("-r")
        .arg(root().join("examples/tasks"))
        .arg(dir.join("tasks"))
        .status()
        .unwrap();
    assert!(status.success());
    let exp = dir.join("tiny.toml");
    std::fs::write(
        &exp,
        format!(
            r#"
name = "tiny"
seed = 3
tasks_dir = "tasks"
train = ["pha-hill-fit"]
heldout = ["fin-bond-duration"]
cycles = 1

[backends.server]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
base_url_env = "OPENAI_BASE_URL"
model = "scripted"
timeout_secs = 30

[backends.sim]
kind = "sim"

[roles]
orchestrator = "server"
judge = "sim"
optimizer = "sim"

[inner]
iterations = 1

[outer]
runs_per_task = 2
opponents_per_run = 1
train_ranks = 1
validation_ranks = 1
eval_runs = 1
eval_train_runs = 0
collect = "every"
train = false

[harness]
kind = "external"
command = '{command}'
pass_env = ["TINY_AGENT"]
readable = ["$TINY_AGENT_DIR"]
timeout_secs = {timeout_secs}
"#
        ),
    )
    .unwrap();
    Setup {
        _tmp: tmp,
        dir,
        exp,
    }
}

fn mass(s: &Setup, base_url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mass"))
        .current_dir(&s.dir)
        .arg("--ledger")
        .arg(s.dir.join("ledger"))
        .args(args)
        .env_remove("MASS_LEDGER")
        .env("OPENAI_BASE_URL", base_url)
        .env("TINY_AGENT", s.dir.join("agent/tiny_agent.py"))
        .env("TINY_AGENT_DIR", s.dir.join("agent"))
        .output()
        .unwrap()
}

fn ok(s: &Setup, base_url: &str, args: &[&str]) -> String {
    let o = mass(s, base_url, args);
    assert!(o.status.success(), "mass {args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn rollouts(s: &Setup) -> Vec<Value> {
    let v: Value = serde_json::from_str(&ok(s, "", &["runs", "tiny", "--json"])).unwrap();
    v.as_array().cloned().unwrap()
}

fn payload(s: &Setup, id: &str) -> Value {
    let v: Value = serde_json::from_str(&ok(s, "", &["show", id, "--json"])).unwrap();
    v["payload"].clone()
}

const AGENT: &str = r#"python3 "$TINY_AGENT" {prompt_file}"#;

#[test]
fn an_external_harness_rollout_is_recorded_exported_and_reexecuted_with_the_server_stopped() {
    let s = setup(AGENT, 60);
    let (server, url) = scripted_server(&s.dir, "qwen_script.json");
    ok(&s, &url, &["init"]);
    ok(&s, &url, &["run", s.exp.to_str().unwrap(), "--quiet"]);
    let rs = rollouts(&s);
    assert_eq!(rs.len(), 4);
    for r in &rs {
        let id = r["event"].as_str().unwrap();
        let p = payload(&s, id);
        assert_eq!(p["status"], "finished", "{p}");
        assert_eq!(p["delegations"], 1, "{p}");
        assert_eq!(p["turns"], 6, "4 orchestrator and 2 subagent calls: {p}");
        let ws = s.dir.join(format!("ws-{}", &id[..12]));
        ok(
            &s,
            "",
            &[
                "checkout",
                p["tree"].as_str().unwrap(),
                ws.to_str().unwrap(),
            ],
        );
        assert_eq!(
            std::fs::read_to_string(ws.join("result.txt")).unwrap(),
            "hello from the scripted model\n"
        );
        assert_eq!(
            std::fs::read_to_string(ws.join("size.txt")).unwrap().trim(),
            "30"
        );
        assert_eq!(
            std::fs::read_to_string(ws.join("sub.txt")).unwrap(),
            "written by the subagent\n"
        );
    }
    let data = s.dir.join("d.jsonl");
    ok(
        &s,
        "",
        &[
            "export",
            "dataset",
            "tiny",
            "--cycle",
            "1",
            "--out",
            data.to_str().unwrap(),
        ],
    );
    // The train file and its `.validation` twin; the sidecar covers both.
    let lines = std::fs::read_to_string(&data).unwrap()
        + &std::fs::read_to_string(s.dir.join("d.validation.jsonl")).unwrap();
    let agents: Vec<String> = std::fs::read_to_string(s.dir.join("d.provenance.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["agent"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(lines.lines().count(), agents.len());
    assert!(
        agents.contains(&"orchestrator".to_string()) && agents.contains(&"subagent".to_string()),
        "{agents:?}"
    );

    drop(server);
    let dead = dead_url();
    for r in &rs {
        let id = r["event"].as_str().unwrap();
        let o = mass(&s, &dead, &["harness-replay", id, "--json"]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(
            (v["identical"].clone(), v["served"].clone()),
            (Value::Bool(true), Value::from(6)),
            "{v}"
        );
    }
}

#[test]
fn a_harness_that_fails_or_hangs_ends_its_rollout_and_the_run_goes_on() {
    for (command, timeout, status, detail) in [
        ("echo broken >&2; exit 5", 60, "failed", "status 5: broken"),
        ("sleep 30", 2, "halted", "harness time limit (2 s) reached"),
    ] {
        let s = setup(command, timeout);
        let url = dead_url();
        ok(&s, &url, &["init"]);
        let t = Instant::now();
        ok(&s, &url, &["run", s.exp.to_str().unwrap(), "--quiet"]);
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{command}: {:?}",
            t.elapsed()
        );
        let rs = rollouts(&s);
        assert_eq!(rs.len(), 4, "{command}");
        for r in &rs {
            let p = payload(&s, r["event"].as_str().unwrap());
            assert_eq!(p["status"], status, "{command}: {p}");
            assert!(
                p["detail"].as_str().unwrap().contains(detail),
                "{command}: {p}"
            );
            assert_eq!(p["turns"], 0, "{p}");
        }
    }
}

#[test]
fn a_model_server_that_is_not_there_stops_the_run_with_exit_7_and_resume_runs_the_rollout_again() {
    let s = setup(AGENT, 60);
    let dead = dead_url();
    ok(&s, &dead, &["init"]);
    let o = mass(&s, &dead, &["run", s.exp.to_str().unwrap(), "--quiet"]);
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the model server failed the harness's last request"),
        "{err}"
    );
    assert!(err.contains("mass resume"), "{err}");

    let (_server, url) = scripted_server(&s.dir, "qwen_script.json");
    let out = ok(&s, &url, &["resume", "tiny", "--quiet"]);
    assert!(out.contains("harness: 4 live"), "{out}");
    let rs = rollouts(&s);
    assert_eq!(rs.len(), 4);
    for r in &rs {
        let p = payload(&s, r["event"].as_str().unwrap());
        assert_eq!(p["status"], "finished", "{p}");
    }
    // The first rollout's stream holds the failed attempt too; its rollout
    // is the second attempt alone.
    let o = mass(
        &s,
        &dead_url(),
        &[
            "harness-replay",
            rs.iter()
                .map(|r| r["event"].as_str().unwrap())
                .next()
                .unwrap(),
            "--json",
        ],
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert_eq!(v["identical"], true, "{}", text(&o));
}
