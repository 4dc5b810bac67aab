//! One llama.cpp server, many adapters: with `serve.adapter_api =
//! "llama-cpp"` the base model's `llama-server` is started with every
//! adapter known so far (`{loras}`), restarted (after the requests in
//! flight end) for an adapter it lacks, and each request names its adapter
//! in its body. Tested against a fake llama-server (Python, started by
//! `serve.command`) that parses the options as llama-server does, numbers
//! its adapters in the *reverse* of their order (so ids are read back, not
//! assumed), applies per-request scales as llama-server does (unlisted
//! adapters at 0; without a list, the global scales), and records every
//! start and call. The real llama-server is covered by tests/real_cpu.rs
//! and trainers/selftest.sh.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

use common::served::{self, ask, log, request};
use engine::backend::openai::OpenAiBackend;
use engine::backend::Backend;
use engine::config::{AdapterApi, ServeParams};

const FAKE: &str = r#"
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
args = sys.argv[1:]
LOG, PIDS, PORT = args[0], args[1], int(args[2])
paths = [args[i + 1] for i, a in enumerate(args) if a == "--lora"]
apply = "--lora-init-without-apply" not in args
# Ids in reverse order of the options: a client must read them back.
adapters = [{"id": i, "path": p, "scale": 1.0 if apply else 0.0}
            for i, p in enumerate(reversed(paths))]
def note(**kw):
    with open(LOG, "a") as f:
        f.write(json.dumps(kw) + "\n")
with open(PIDS, "a") as f:
    f.write(f"{os.getpid()}\n")
note(event="start", loras=paths, pid=os.getpid())
flaky = os.path.join(os.path.dirname(LOG), "flaky-once")
if paths and os.path.exists(flaky):
    os.remove(flaky)
    sys.exit("a passing fault")
for p in paths:
    if not os.path.isfile(p) or open(p, "rb").read() != b"GGUF":
        sys.exit(f"failed to load adapter {p}")
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/lora-adapters":
            return self.send(200, adapters)
        self.send(200, {"data": [{"id": "base"}]})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["content-length"])))
        text = req["messages"][-1]["content"]
        if "slow" in text:
            time.sleep(1.5)
        scales = {a["id"]: a["scale"] for a in adapters}
        if "lora" in req:
            scales = {a["id"]: 0.0 for a in adapters}
            for e in req["lora"]:
                scales[e["id"]] = e["scale"]
        on = [a["path"] for a in adapters if scales[a["id"]] != 0.0]
        note(event="call", model=req["model"], lora=req.get("lora"), applied=on, pid=os.getpid())
        served = "base" if not on else "+".join(os.path.basename(os.path.dirname(p)) for p in on)
        self.send(200, {"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": f"served by {served}"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
"#;

fn serve(dir: &Path) -> ServeParams {
    let script = dir.join("fake_llama_server.py");
    std::fs::write(&script, FAKE).unwrap();
    ServeParams {
        command: format!(
            "exec python3 {} {} {} {{port}} -m base.gguf {{loras}}",
            script.display(),
            dir.join("log.jsonl").display(),
            dir.join("pids").display()
        ),
        adapter_command: None,
        ready_path: "/v1/models".into(),
        start_timeout_secs: 30,
        prompt_tokens_command: None,
        adapter_api: Some(AdapterApi::LlamaCpp),
        adapter_file: None,
    }
}

fn backend(dir: &Path) -> OpenAiBackend {
    served::backend(serve(dir), 4)
}

fn starts(dir: &Path) -> Vec<serde_json::Value> {
    log(dir)
        .into_iter()
        .filter(|e| e["event"] == "start")
        .collect()
}

/// An adapter directory named `name` holding an `adapter.gguf`.
fn adapter(dir: &Path, name: &str) -> PathBuf {
    let a = dir.join(name);
    std::fs::create_dir_all(&a).unwrap();
    std::fs::write(a.join("adapter.gguf"), b"GGUF").unwrap();
    a
}

fn alive(pid: i64) -> bool {
    // Not a zombie either: /proc/PID/stat's state field.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[test]
fn one_llama_server_serves_the_base_model_and_every_adapter() {
    let d = tempfile::tempdir().unwrap();
    let b = backend(d.path());
    assert!(b.serves_adapters());
    assert_eq!(ask(&b, "base"), "served by base");
    let (a1, a2) = (adapter(d.path(), "c1"), adapter(d.path(), "c2"));
    b.register_adapter_dir("base+c1-aaaa", &a1).unwrap();
    // Registering alone starts nothing: the first call for it does.
    assert_eq!(starts(d.path()).len(), 1);
    assert_eq!(ask(&b, "base+c1-aaaa"), "served by c1");
    assert_eq!(ask(&b, "base"), "served by base");
    b.register_adapter_dir("base+c2-bbbb", &a2).unwrap();
    assert_eq!(ask(&b, "base+c2-bbbb"), "served by c2");
    assert_eq!(ask(&b, "base+c1-aaaa"), "served by c1");
    assert_eq!(ask(&b, "base"), "served by base");

    let s = starts(d.path());
    let loras: Vec<&serde_json::Value> = s.iter().map(|e| &e["loras"]).collect();
    let (p1, p2) = (
        a1.join("adapter.gguf").display().to_string(),
        a2.join("adapter.gguf").display().to_string(),
    );
    assert_eq!(
        loras,
        [
            &serde_json::json!([]),
            &serde_json::json!([p1]),
            &serde_json::json!([p1, p2])
        ],
        "a restart per new adapter, each with every adapter so far: {s:?}"
    );
    // Only the last server is left: each predecessor was stopped.
    let pids: Vec<i64> = s.iter().map(|e| e["pid"].as_i64().unwrap()).collect();
    let living: Vec<i64> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert_eq!(living, [pids[2]], "only the last server runs: {pids:?}");
    // Every call on the last server listed both adapters and applied at
    // most one (the fake records which it applied).
    for call in log(d.path())
        .iter()
        .filter(|e| e["event"] == "call" && e["pid"] == pids[2])
    {
        assert_eq!(call["lora"].as_array().unwrap().len(), 2, "{call}");
        assert!(call["applied"].as_array().unwrap().len() <= 1, "{call}");
    }
    drop(b);
    assert!(!alive(pids[2]), "the server ends with the backend");
}

#[test]
fn a_restart_for_a_new_adapter_waits_for_the_requests_in_flight() {
    let d = tempfile::tempdir().unwrap();
    let b = std::sync::Arc::new(backend(d.path()));
    assert_eq!(ask(&b, "base"), "served by base");
    let a1 = adapter(d.path(), "c1");
    b.register_adapter_dir("base+c1-aaaa", &a1).unwrap();
    let slow = {
        let b = b.clone();
        std::thread::spawn(move || {
            engine::exec::block_on(b.complete(&request("base", "slow, please")))
                .expect("runtime")
                .map(|r| r.message.content.unwrap_or_default())
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // This call needs a restart; the slow one is still being answered.
    assert_eq!(ask(&b, "base+c1-aaaa"), "served by c1");
    let answer = slow.join().unwrap();
    assert_eq!(
        answer.as_deref().map_err(|e| e.to_string()),
        Ok("served by base"),
        "the request in flight was not cut off by the restart"
    );
    let s = starts(d.path());
    assert_eq!(s.len(), 2);
    // Answered by the first server (so it was in flight across the
    // restart), not by the second after waiting for it.
    let slow_call = log(d.path())
        .into_iter()
        .filter(|e| e["event"] == "call" && e["model"] == "base")
        .nth(1)
        .expect("the slow call");
    assert_eq!(slow_call["pid"], s[0]["pid"], "{slow_call}");
}

#[test]
fn a_killed_server_comes_back_with_every_adapter() {
    let d = tempfile::tempdir().unwrap();
    let b = backend(d.path());
    let a1 = adapter(d.path(), "c1");
    b.register_adapter_dir("base+c1-aaaa", &a1).unwrap();
    assert_eq!(ask(&b, "base+c1-aaaa"), "served by c1");
    let pid = starts(d.path())[0]["pid"].as_i64().unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(ask(&b, "base+c1-aaaa"), "served by c1");
    assert_eq!(ask(&b, "base"), "served by base");
    let s = starts(d.path());
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(s[1]["loras"], s[0]["loras"]);
}

fn refused(b: &OpenAiBackend, model: &str) -> String {
    engine::exec::block_on(b.complete(&request(model, "hi")))
        .expect("runtime")
        .map(|r| format!("{:?}", r.message.content))
        .expect_err("refused")
        .to_string()
}

#[test]
fn a_missing_adapter_file_is_named_and_the_rest_stays_served() {
    let d = tempfile::tempdir().unwrap();
    let b = backend(d.path());
    let empty = d.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    b.register_adapter_dir("base+c1-cccc", &empty).unwrap();
    let text = refused(&b, "base+c1-cccc");
    assert!(
        text.contains("base+c1-cccc") && text.contains("empty/adapter.gguf"),
        "{text}"
    );
    assert_eq!(ask(&b, "base"), "served by base");
    // Asked again, refused again, without another start.
    assert!(refused(&b, "base+c1-cccc").contains("is missing"));
    let s = starts(d.path());
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0]["loras"], serde_json::json!([]));
}

#[test]
fn an_adapter_the_server_cannot_load_is_left_out_and_the_others_stay_served() {
    let d = tempfile::tempdir().unwrap();
    let b = backend(d.path());
    let good = adapter(d.path(), "c1");
    let bad = d.path().join("c2");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("adapter.gguf"), b"BAD").unwrap();
    b.register_adapter_dir("base+c1-aaaa", &good).unwrap();
    assert_eq!(ask(&b, "base+c1-aaaa"), "served by c1");
    b.register_adapter_dir("base+c2-bbbb", &bad).unwrap();
    let text = refused(&b, "base+c2-bbbb");
    assert!(
        text.contains("base+c2-bbbb") && text.contains("did not start with it"),
        "{text}"
    );
    assert_eq!(ask(&b, "base+c1-aaaa"), "served by c1");
    assert_eq!(ask(&b, "base"), "served by base");
    assert!(refused(&b, "base+c2-bbbb").contains("did not start with it"));
    let loras: Vec<usize> = starts(d.path())
        .iter()
        .map(|e| e["loras"].as_array().unwrap().len())
        .collect();
    // c1 alone, then c1 with the bad c2 (failed, and failed again: not a
    // passing fault), then c1 alone again.
    assert_eq!(loras, [1, 2, 2, 1]);
}

#[test]
fn a_start_that_fails_once_does_not_break_the_new_adapter() {
    let d = tempfile::tempdir().unwrap();
    let b = backend(d.path());
    let a1 = adapter(d.path(), "c1");
    b.register_adapter_dir("base+c1-aaaa", &a1).unwrap();
    std::fs::write(d.path().join("flaky-once"), b"").unwrap();
    assert_eq!(ask(&b, "base+c1-aaaa"), "served by c1");
    let loras: Vec<usize> = starts(d.path())
        .iter()
        .map(|e| e["loras"].as_array().unwrap().len())
        .collect();
    assert_eq!(loras, [1, 1], "failed once, then started with it again");
}

#[test]
fn two_models_on_one_adapter_directory_are_both_served_by_it() {
    let d = tempfile::tempdir().unwrap();
    let b = backend(d.path());
    let a = adapter(d.path(), "same");
    b.register_adapter_dir("base+c1-aaaa", &a).unwrap();
    b.register_adapter_dir("base+c2-aaaa", &a).unwrap();
    assert_eq!(ask(&b, "base+c1-aaaa"), "served by same");
    assert_eq!(ask(&b, "base+c2-aaaa"), "served by same");
    assert_eq!(ask(&b, "base"), "served by base");
    assert_eq!(starts(d.path()).len(), 1);
}

#[test]
fn an_external_harness_is_refused_an_adapter_it_could_not_select() {
    let d = tempfile::tempdir().unwrap();
    let b = backend(d.path());
    let a1 = adapter(d.path(), "c1");
    b.register_adapter_dir("base+c1-aaaa", &a1).unwrap();
    let err = engine::exec::block_on(b.endpoint("base+c1-aaaa"))
        .expect("runtime")
        .expect_err("refused");
    assert!(err.to_string().contains("adapter_command"), "{err}");
    let base = engine::exec::block_on(b.endpoint("base"))
        .expect("runtime")
        .unwrap()
        .unwrap();
    assert!(base.base_url.starts_with("http://127.0.0.1:"), "{base:?}");
}
