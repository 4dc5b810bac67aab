//! `[harness] kind = "external"` through the `mass` binary, with a tiny
//! agent program (tests/fixtures/tiny_agent.py, python3 only) against the
//! scripted OpenAI-compatible server: the happy path (recorded, exported,
//! re-executed against the recording with the server stopped) and the
//! paths off it: a program that fails, one that hangs, and a model server
//! that is not there (the run stops with exit 7 and `mass resume` runs the
//! rollout again once it is), and mass SIGKILLed while a rollout's program
//! runs (nothing is left running; the resume ends each rollout once).
//! tests/qwen_code.rs does the same with the real Qwen Code.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{root, scripted_server, scripted_server_dumping, text};

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
    setup_with(command, timeout_secs, "", "")
}

/// [`setup`] with lines added to the server backend's and the harness's
/// tables.
fn setup_with(command: &str, timeout_secs: u64, backend: &str, harness: &str) -> Setup {
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
{backend}

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
{harness}
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

/// What the probing harness below does before it runs the tiny agent: dumps
/// its environment into the workspace and on stdout (both recorded), then
/// runs [`PROBE_PY`] (saved beside the tiny agent).
const PROBE: &str = r#"env > env-dump.txt; env; python3 "$(dirname "$TINY_AGENT")/probe.py" 2> probe-err.txt; python3 "$TINY_AGENT" {prompt_file}"#;

/// Tries the model server directly, its own route with a wrong token, the
/// upstream's other endpoints and a path out of its base with its own, and
/// lists what it can see beside its workspace.
const PROBE_PY: &str = r#"import json, os, socket, urllib.request, urllib.error
out = {}
host, port = os.environ["REAL_SERVER"].split(":")
try:
    socket.create_connection((host, int(port)), timeout=3).close()
    out["direct"] = "connected"
except OSError as e:
    out["direct"] = "refused: %s" % e
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/models",
                             headers={"authorization": "Bearer sk-guessed"})
try:
    urllib.request.urlopen(req, timeout=5)
    out["wrong_token"] = "served"
except urllib.error.HTTPError as e:
    out["wrong_token"] = e.code
except OSError as e:
    out["wrong_token"] = "unreachable: %s" % e
def status(method, path):
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + path, method=method,
                                 headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        urllib.request.urlopen(req, timeout=5)
        return 200
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return "unreachable: %s" % e
out["files"] = status("GET", "/files")
out["escape"] = status("GET", "/%2e%2e/%2e%2e/admin/keys")
try:
    out["siblings"] = sorted(os.listdir(".."))
except OSError as e:
    out["siblings"] = "unlistable: %s" % e
out["me"] = os.path.basename(os.getcwd())
open("probe.json", "w").write(json.dumps(out))
"#;

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `mass ARGS` for a setup whose server backend reads its key from
/// PLANTED_SERVER_KEY; `extra` adds environment variables.
fn mass_keyed(s: &Setup, url: &str, key: &str, extra: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mass"));
    c.current_dir(&s.dir)
        .arg("--ledger")
        .arg(s.dir.join("ledger"))
        .args(args)
        .env_remove("MASS_LEDGER")
        .env("OPENAI_BASE_URL", url)
        .env("PLANTED_SERVER_KEY", key)
        .env("TINY_AGENT", s.dir.join("agent/tiny_agent.py"))
        .env("TINY_AGENT_DIR", s.dir.join("agent"));
    for (k, v) in extra {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The authorization headers the scripted server received, per request.
fn upstream_auth(dump: &std::path::Path) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dump).unwrap() {
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(e.unwrap().path()).unwrap()).unwrap();
        out.push(
            v["headers"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|h| h[0].as_str().unwrap().eq_ignore_ascii_case("authorization"))
                .map(|h| h[1].as_str().unwrap().to_string())
                .collect(),
        );
    }
    out
}

/// Checks one probed rollout's workspace; returns its token.
fn check_probe(ws: &std::path::Path) -> String {
    let env = std::fs::read_to_string(ws.join("env-dump.txt")).unwrap();
    let token = env
        .lines()
        .find_map(|l| l.strip_prefix("OPENAI_API_KEY="))
        .unwrap_or_default()
        .to_string();
    assert!(token.starts_with("mass-rollout-"), "{env}");
    let Ok(probe) = std::fs::read_to_string(ws.join("probe.json")) else {
        panic!(
            "the probe failed: {}",
            std::fs::read_to_string(ws.join("probe-err.txt")).unwrap_or_default()
        );
    };
    let probe: Value = serde_json::from_str(&probe).unwrap();
    assert!(
        probe["direct"].as_str().unwrap().starts_with("refused"),
        "the program reached the model server: {probe}"
    );
    assert_eq!(probe["wrong_token"], 401, "{probe}");
    // Its token opens model calls only, under the upstream's base path.
    assert_eq!(probe["files"], 403, "{probe}");
    assert_eq!(probe["escape"], 400, "{probe}");
    // Its own workspace, home and proxy directory, or nothing; nobody
    // else's.
    if probe["siblings"].is_string() {
        return token;
    }
    let me = probe["me"].as_str().unwrap();
    let want: Vec<String> = ["", ".home", ".proxy"]
        .iter()
        .map(|t| format!("{me}{t}"))
        .collect();
    let seen: Vec<String> = probe["siblings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(seen, want, "{probe}");
    token
}

/// Regression (#24): an external harness was handed the backend's real key
/// as `OPENAI_API_KEY` and ran on the host network, so a program that
/// printed its environment put the key into its workspace, its output and
/// 8 places in the ledger, and could reach the model server (and every
/// other rollout's proxy) directly. Now the program holds a per-rollout
/// token that opens its own route only, the route sends the real key
/// upstream, and the program's namespace has no other endpoint: the key
/// (a fresh random one) is in no decompressed object, no metadata entry,
/// no ledger file and no output of any command (a re-judge and a replay
/// check included), while the server saw it on every call.
#[test]
fn regression_an_external_harness_never_holds_the_backend_key() {
    let key = format!(
        "sk-planted-{}",
        blake3::hash(format!("{:?}", std::time::SystemTime::now()).as_bytes()).to_hex()
    );
    let dump = tempfile::tempdir().unwrap();
    let s0 = setup(PROBE, 60);
    let (server, url) = scripted_server_dumping(&s0.dir, "qwen_script.json", Some(dump.path()));
    let real = url
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string();
    let s = setup_with(
        PROBE,
        60,
        r#"api_key_env = "PLANTED_SERVER_KEY""#,
        &format!("env = {{ REAL_SERVER = \"{real}\" }}"),
    );
    std::fs::write(s.dir.join("agent/probe.py"), PROBE_PY).unwrap();
    let run = |args: &[&str]| {
        let o = mass_keyed(&s, &url, &key, &[], args);
        assert!(o.status.success(), "mass {args:?}: {}", text(&o));
        let all = [o.stdout.as_slice(), o.stderr.as_slice()].concat();
        assert!(
            !contains(&all, key.as_bytes()),
            "mass {args:?} printed the key"
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    run(&["init"]);
    run(&["run", s.exp.to_str().unwrap(), "--quiet"]);
    let rs: Vec<Value> = serde_json::from_str(&run(&["runs", "tiny", "--json"])).unwrap();
    assert_eq!(rs.len(), 4);
    let mut tokens = std::collections::BTreeSet::new();
    for r in &rs {
        let id = r["event"].as_str().unwrap();
        let p: Value = serde_json::from_str(&run(&["show", id, "--json"])).unwrap();
        let p = &p["payload"];
        assert_eq!(p["status"], "finished", "{p}");
        let ws = s.dir.join(format!("ws-{}", &id[..12]));
        run(&[
            "checkout",
            p["tree"].as_str().unwrap(),
            ws.to_str().unwrap(),
        ]);
        tokens.insert(check_probe(&ws));
    }
    assert_eq!(tokens.len(), 4, "one token per rollout: {tokens:?}");
    // A re-judge of the run (its rollouts served from the recording) and
    // its replay check hold no key either.
    run(&["rejudge", "tiny", "--name", "rj", "--quiet"]);
    run(&["replay", "rj", "--check"]);
    drop(server);
    let auth = upstream_auth(dump.path());
    assert_eq!(auth.len(), 24, "6 calls per rollout");
    for a in &auth {
        assert_eq!(a, &vec![format!("Bearer {key}")]);
    }
    // Every object decompressed, every metadata entry, every file.
    let l = ledger::Ledger::open_read_only(&s.dir.join("ledger")).unwrap();
    let mut ids = Vec::new();
    l.for_each_location(|id, _| ids.push(id)).unwrap();
    assert!(ids.len() > 100, "{} objects", ids.len());
    for id in &ids {
        let (_, bytes) = l.raw_object(id).unwrap();
        assert!(
            !contains(&bytes, key.as_bytes()),
            "object {id} holds the key"
        );
        let meta = format!("{:?}", l.get_meta(id).unwrap());
        assert!(!meta.contains(&key), "metadata of {id} holds the key");
    }
    let out = Command::new("grep")
        .args(["-rlF", &key])
        .arg(s.dir.join("ledger"))
        .output()
        .unwrap();
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A program is never handed a credential through `pass_env` either: a
/// variable named like one is refused, and so is one that holds the
/// backend's key; neither message shows a value.
#[test]
fn a_harness_passing_a_credential_is_refused() {
    for (pass, msg) in [
        ("OTHER_API_KEY", "is named like a credential"),
        ("INNOCENT", "holds the backend's API key"),
    ] {
        let s = setup_with(AGENT, 60, r#"api_key_env = "PLANTED_SERVER_KEY""#, "");
        let exp = std::fs::read_to_string(&s.exp).unwrap().replace(
            r#"pass_env = ["TINY_AGENT"]"#,
            &format!(r#"pass_env = ["TINY_AGENT", "{pass}"]"#),
        );
        std::fs::write(&s.exp, exp).unwrap();
        let url = dead_url();
        let extra = [
            ("OTHER_API_KEY", "sk-planted-other"),
            ("INNOCENT", "prefix sk-planted-pass-env"),
        ];
        let go = |args: &[&str]| mass_keyed(&s, &url, "sk-planted-pass-env", &extra, args);
        assert!(go(&["init"]).status.success());
        let o = go(&["run", s.exp.to_str().unwrap(), "--quiet"]);
        let t = text(&o);
        assert!(!o.status.success(), "{pass}: {t}");
        assert!(t.contains(msg), "{pass}: {t}");
        assert!(!t.contains("sk-planted"), "{pass}: {t}");
    }
}

/// Processes whose command line contains `needle`.
fn running(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&c)
                .replace('\0', " ")
                .contains(needle)
            {
                out.push(pid);
            }
        }
    }
    out
}

/// #25 (nothing outlives the run): `kill -9` of mass while a rollout's
/// program runs a long command leaves no process behind, and `mass resume`
/// runs that rollout again (once the old one is gone) and each rollout
/// ends with exactly one result.
#[test]
fn a_sigkilled_mass_leaves_no_harness_command_and_resume_runs_each_rollout_once() {
    let nonce = 7_000_000 + std::process::id() % 1_000_000;
    let needle = format!("sleep {nonce}");
    let s = setup(r#"sh "$(dirname "$TINY_AGENT")/long.sh""#, 600);
    std::fs::write(
        s.dir.join("agent/long.sh"),
        format!(
            "if [ -e \"$(dirname \"$0\")/go\" ]; then echo resumed; exit 4; fi\nexec {needle}\n"
        ),
    )
    .unwrap();
    let url = dead_url();
    ok(&s, &url, &["init"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_mass"))
        .current_dir(&s.dir)
        .arg("--ledger")
        .arg(s.dir.join("ledger"))
        .args(["run", s.exp.to_str().unwrap(), "--quiet"])
        .env_remove("MASS_LEDGER")
        .env("OPENAI_BASE_URL", &url)
        .env("TINY_AGENT", s.dir.join("agent/tiny_agent.py"))
        .env("TINY_AGENT_DIR", s.dir.join("agent"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while running(&needle).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the command never started"
        );
        assert!(child.try_wait().unwrap().is_none(), "mass ended first");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let t = Instant::now();
    while !running(&needle).is_empty() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = running(&needle);
    for p in &left {
        // SAFETY: a plain signal to a process this test caused.
        unsafe { libc::kill(*p as i32, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "the command outlived mass: {left:?}");

    std::fs::write(s.dir.join("agent/go"), b"").unwrap();
    ok(&s, &url, &["resume", "tiny", "--quiet"]);
    assert!(running(&needle).is_empty());
    let rs = rollouts(&s);
    assert_eq!(rs.len(), 4);
    for r in &rs {
        let p = payload(&s, r["event"].as_str().unwrap());
        assert!(p["detail"].as_str().unwrap().contains("status 4"), "{p}");
    }
    // One result per rollout: the killed attempt left only its journal
    // record, and nothing ran twice.
    let out = s.dir.join("events.jsonl");
    ok(
        &s,
        &url,
        &["export", "events", "tiny", "--out", out.to_str().unwrap()],
    );
    let results = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["kind"] == "effect" && e["payload"]["effect"] == "harness")
        .filter(|e| e["payload"]["status"] != "started")
        .count();
    assert_eq!(results, rs.len(), "harness results");
    ok(&s, &url, &["replay", "tiny", "--check"]);
}

/// An agent that prints where it runs before it works: its directory, its
/// HOME and TMPDIR, the paths it was told, and a Python traceback from a
/// file in its home (the tiny agent then states its directory to the model,
/// as Qwen Code does).
const PRINTS_PATHS: &str = r#"pwd; echo "home=$HOME tmp=$TMPDIR told={workspace} {home} {prompt_file}"; printf "raise ValueError(1)\n" > {home}/t.py; python3 {home}/t.py; python3 "$TINY_AGENT" {prompt_file}"#;

/// The refs of `s`'s ledger as name -> head.
fn refs(s: &Setup) -> std::collections::BTreeMap<String, String> {
    let v: Value = serde_json::from_str(&ok(s, "", &["refs", "--json"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let name = r["name"].as_str().unwrap().to_string();
            (name, r["head"].as_str().unwrap().to_string())
        })
        .collect()
}

/// #25 ("paths never reach ids"): the same experiment run twice, from two
/// directories, by two mass processes (so every host path differs: the
/// task folder, the scratch root's pid, the workspaces' random names) gives
/// the same head, though the agent prints its paths and tells them to the
/// model. Fails with the places switched off (`Confinement::fixes_paths`
/// returning false): each run then records its own paths. The second file
/// also differs in what only says how to execute it (a comment, the
/// concurrency, the server's address, timeout and concurrency limit): the
/// same ids again (it fails with `run.started` naming the file as given).
#[test]
fn two_runs_of_an_agent_printing_its_paths_give_the_same_head() {
    let (a, b) = (setup(PRINTS_PATHS, 60), setup(PRINTS_PATHS, 60));
    let text = std::fs::read_to_string(&b.exp).unwrap();
    let executed_otherwise = format!("# run on the other machine\n{text}")
        .replace("cycles = 1\n", "cycles = 1\nconcurrency = 3\n")
        .replace(
            "base_url = \"http://127.0.0.1:9/v1\"",
            "base_url = \"http://127.0.0.2:9/v1\"\nmax_concurrency = 2",
        )
        .replace("timeout_secs = 30", "timeout_secs = 45");
    assert_ne!(executed_otherwise, text);
    assert_eq!(executed_otherwise.matches("concurrency").count(), 2);
    std::fs::write(&b.exp, executed_otherwise).unwrap();
    let mut heads = Vec::new();
    for s in [&a, &b] {
        let (_server, url) = scripted_server(&s.dir, "qwen_script.json");
        ok(s, &url, &["init"]);
        ok(s, &url, &["run", s.exp.to_str().unwrap(), "--quiet"]);
        heads.push(refs(s));
    }
    // The agent did print paths, and told the model its directory.
    let out = a.dir.join("events.jsonl");
    ok(
        &a,
        "",
        &["export", "events", "tiny", "--out", out.to_str().unwrap()],
    );
    let outputs: String = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["payload"]["effect"] == "harness" && e["payload"]["status"] == "ok")
        .map(|e| ok(&a, "", &["cat", e["payload"]["output"].as_str().unwrap()]))
        .collect();
    for seen in [
        "/tmp/mass/workspace\\nhome=/tmp/mass/workspace tmp=/tmp/mass/workspace/.tmp told=/tmp/mass/workspace /tmp/mass/home /tmp/mass/home/prompt.md",
        r#"File \"/tmp/mass/home/t.py\""#,
    ] {
        assert!(outputs.contains(seen), "{seen} is not in the record: {outputs}");
    }
    let rs = rollouts(&a);
    assert_eq!(rs.len(), 4);
    for r in &rs {
        assert_eq!(
            payload(&a, r["event"].as_str().unwrap())["status"],
            "finished"
        );
    }
    // Each run's `execution` stream records its file as given; every step
    // is the same.
    let execution: Vec<String> = heads
        .iter_mut()
        .map(|h| h.remove("tiny/execution").expect("an execution stream"))
        .collect();
    assert_ne!(execution[0], execution[1]);
    assert!(heads[0].len() > 10, "{:?}", heads[0]);
    assert_eq!(heads[0], heads[1], "two identical runs, two heads");
    ok(&b, "", &["replay", "tiny", "--check"]);
}
