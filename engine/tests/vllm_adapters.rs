//! One server, many adapters: with `serve.adapter_api = "vllm"` a trained
//! adapter is loaded into the running base-model server through vLLM's
//! `POST /v1/load_lora_adapter` and called by its name as the model,
//! instead of a server of its own. Tested against a fake vLLM (a Python
//! HTTP server started by `serve.command`) that implements the endpoints
//! vLLM documents, refuses to serve a model it has not loaded (as vLLM
//! does), and records every start, load and call; it is then killed under
//! the run, and the restarted server gets the adapter loaded again.

use std::path::Path;

mod common;

use common::served::{self, ask, log, request};
use engine::backend::openai::OpenAiBackend;
use engine::backend::Backend;
use engine::config::{AdapterApi, ServeParams};

/// A fake vLLM: `/v1/models` (ready), `/v1/load_lora_adapter`, and
/// `/v1/chat/completions` answering with the model it was asked for.
/// Every line it records goes to `LOG`; its pid to `PIDS`.
const FAKE: &str = r#"
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
LOG, PIDS, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3])
loaded = {"base": "/base"}
def note(**kw):
    with open(LOG, "a") as f:
        f.write(json.dumps(kw) + "\n")
with open(PIDS, "a") as f:
    f.write(f"{os.getpid()}\n")
note(event="start")
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def send(self, code, body):
        data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
        self.send_response(code)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.send(200, {"data": [{"id": m} for m in loaded]})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path == "/v1/load_lora_adapter":
            name, path = req["lora_name"], req["lora_path"]
            if name in loaded:
                return self.send(400, f"The lora adapter '{name}' has already been loaded.")
            if not os.path.isfile(os.path.join(path, "adapter_config.json")):
                return self.send(400, "no adapter_config.json")
            loaded[name] = path
            note(event="load", name=name, path=path)
            return self.send(200, f"Success: LoRA adapter '{name}' added successfully.")
        model = req["model"]
        if model not in loaded:
            return self.send(404, {"error": {"message": f"The model `{model}` does not exist."}})
        note(event="call", model=model)
        self.send(200, {"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": f"served by {model}"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
HTTPServer(("127.0.0.1", PORT), H).serve_forever()
"#;

fn backend(dir: &Path) -> OpenAiBackend {
    let script = dir.join("fake_vllm.py");
    std::fs::write(&script, FAKE).unwrap();
    let (log, pids) = (dir.join("log.jsonl"), dir.join("pids"));
    let serve = ServeParams {
        command: format!(
            "python3 {} {} {} {{port}}",
            script.display(),
            log.display(),
            pids.display()
        ),
        adapter_command: None,
        ready_path: "/v1/models".into(),
        start_timeout_secs: 30,
        prompt_tokens_command: None,
        adapter_api: Some(AdapterApi::Vllm),
        adapter_file: None,
    };
    served::backend(serve, 2)
}

fn adapter(dir: &Path, name: &str) -> std::path::PathBuf {
    let a = dir.join(name);
    std::fs::create_dir_all(&a).unwrap();
    std::fs::write(a.join("adapter_config.json"), "{}").unwrap();
    a
}

#[test]
fn adapters_load_into_the_running_server_and_again_after_it_restarts() {
    let d = tempfile::tempdir().unwrap();
    let b = backend(d.path());
    assert!(b.serves_adapters());
    assert_eq!(ask(&b, "base"), "served by base");
    let (a1, a2) = (adapter(d.path(), "c1"), adapter(d.path(), "c2"));
    b.register_adapter_dir("base+c1-aaaa", &a1).unwrap();
    b.register_adapter_dir("base+c2-bbbb", &a2).unwrap();
    for _ in 0..2 {
        assert_eq!(ask(&b, "base+c1-aaaa"), "served by base+c1-aaaa");
    }
    assert_eq!(ask(&b, "base+c2-bbbb"), "served by base+c2-bbbb");
    assert_eq!(ask(&b, "base"), "served by base");
    let events = log(d.path());
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["start", "call", "load", "call", "call", "load", "call", "call"],
        "one server for the base model and both adapters, each adapter loaded once: {events:?}"
    );
    assert_eq!(events[2]["name"], "base+c1-aaaa");
    assert_eq!(events[2]["path"], a1.to_str().unwrap());

    // The server dies under the run: the next call starts it again and
    // loads the adapter into the new one before calling it.
    let pids = std::fs::read_to_string(d.path().join("pids")).unwrap();
    let pid: i32 = pids.lines().next().unwrap().parse().unwrap();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(ask(&b, "base+c2-bbbb"), "served by base+c2-bbbb");
    let events = log(d.path());
    let tail: Vec<&str> = events[8..]
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(tail, ["start", "load", "call"], "{events:?}");
    assert_eq!(
        std::fs::read_to_string(d.path().join("pids"))
            .unwrap()
            .lines()
            .count(),
        2
    );
}

#[test]
fn an_adapter_the_server_refuses_is_an_error_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let b = backend(d.path());
    let empty = d.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    b.register_adapter_dir("base+c1-cccc", &empty).unwrap();
    let req = request("base+c1-cccc", "hi");
    let err = engine::exec::block_on(b.complete(&req))
        .expect("runtime")
        .expect_err("the server refused the adapter");
    let text = err.to_string();
    assert!(
        text.contains("base+c1-cccc") && text.contains("no adapter_config.json"),
        "{text}"
    );
}
