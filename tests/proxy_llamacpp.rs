//! `mass proxy` between the official OpenAI Python client and a real model
//! server: llama-cpp-python serving SmolLM2-135M-Instruct
//! (`scripts/llamacpp-server.sh`), on a port of the test's own so that it can
//! stop it without disturbing a shared server.
//!
//! The client session (tests/fixtures/openai_session.py: a non-streamed
//! completion, then a streamed one continuing the conversation) is recorded
//! through `mass proxy`; the proxy is stopped, then the server, and the port
//! is checked closed; the same session then runs against `mass proxy
//! --replay` and must get the same texts, the same completion and the same
//! chunks, value for value. The client's API key passes through and is
//! recorded nowhere: not in any ledger object (decompressed) or file, nor in
//! the output of `mass log`, `mass show` or `mass export events`.
//!
//! Ignored by default: needs the llama.cpp server build (cached by
//! `scripts/llamacpp-server.sh`) and the OpenAI client's Python
//! (`MASS_OPENAI_PYTHON`, from `scripts/openai-env.sh`):
//!
//!   eval "$(scripts/openai-env.sh | sed 's/^/export /')"
//!   cargo test --test proxy_llamacpp -- --ignored --nocapture

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const RUN: &str = "clients";
const STREAM: &str = "openai-python";
const REF: &str = "clients/openai-python";
/// The client's API key (OPENAI_API_KEY): the server ignores it, the proxy
/// passes it through and must record it nowhere.
const KEY: &str = "sk-mass-proxy-llamacpp-81c4e6f09a2d7b35";
/// Text of the session's first user message (a control for the key search).
const QUESTION: &str = "What is the capital of France?";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> String {
    std::env::var("MASS_OPENAI_PYTHON")
        .expect("MASS_OPENAI_PYTHON: eval \"$(scripts/openai-env.sh | sed 's/^/export /')\" first")
}

fn mass(ledger: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mass"));
    c.arg("--ledger").arg(ledger).env_remove("MASS_LEDGER");
    c
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(cmd: &mut Command) -> Output {
    let o = cmd.output().expect("run");
    assert!(o.status.success(), "{cmd:?}: {}", text(&o));
    o
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

// ---------------------------------------------------------------------------
// The model server of the test's own.

/// `scripts/llamacpp-server.sh CMD` for `port`.
fn server_script(port: u16, cmd: &str) -> Output {
    Command::new("bash")
        .arg(root().join("scripts/llamacpp-server.sh"))
        .arg(cmd)
        .env("MASS_LLAMACPP_PORT", port.to_string())
        .stderr(Stdio::inherit())
        .output()
        .unwrap()
}

/// A server on its own port, stopped when dropped.
struct OwnServer {
    port: u16,
}

impl OwnServer {
    fn start(port: u16) -> (OwnServer, String) {
        let s = OwnServer { port };
        let o = server_script(port, "start");
        assert!(o.status.success(), "the server did not start: {}", text(&o));
        let url = String::from_utf8(o.stdout).unwrap().trim().to_string();
        (s, url)
    }

    fn pid(&self) -> i32 {
        let o = server_script(self.port, "pid");
        String::from_utf8(o.stdout).unwrap().trim().parse().unwrap()
    }

    fn log(&self) -> PathBuf {
        let o = server_script(self.port, "log");
        PathBuf::from(String::from_utf8(o.stdout).unwrap().trim())
    }

    /// Stops the server and waits until its process is gone and its port
    /// refuses connections.
    fn stop(&self) {
        let pid = self.pid();
        let o = server_script(self.port, "stop");
        assert!(o.status.success(), "{}", text(&o));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // SAFETY: signal 0 only checks that the process exists.
            let alive = unsafe { libc::kill(pid, 0) } == 0;
            let open = std::net::TcpStream::connect_timeout(
                &([127, 0, 0, 1], self.port).into(),
                Duration::from_millis(200),
            )
            .is_ok();
            if !alive && !open {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the server (pid {pid}) is still {} 30 s after stop",
                if open { "listening" } else { "running" }
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        server_script(self.port, "stop");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Chat completions the server answered, from uvicorn's access log.
fn requests_served(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"POST /v1/chat/completions HTTP/1.1\""))
        .count()
}

// ---------------------------------------------------------------------------
// `mass proxy`.

/// A `mass proxy` process with its output in files; killed and reaped when
/// dropped unless it already ended.
struct Proxy {
    name: &'static str,
    child: Option<Child>,
    out: PathBuf,
    err: PathBuf,
    url: String,
}

impl Proxy {
    /// `mass proxy ARGS --run RUN --stream STREAM` on a free port; returns
    /// once it announced its URL.
    fn start(name: &'static str, ledger: &Path, dir: &Path, args: &[&str]) -> Proxy {
        let out = dir.join(format!("{name}.out"));
        let err = dir.join(format!("{name}.err"));
        let url_file = dir.join(format!("{name}.url"));
        let child = mass(ledger)
            .arg("proxy")
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--run", RUN, "--stream", STREAM])
            .arg("--url-file")
            .arg(&url_file)
            .stdin(Stdio::null())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let mut p = Proxy {
            name,
            child: Some(child),
            out,
            err,
            url: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(s) = std::fs::read_to_string(&url_file) {
                if !s.trim().is_empty() {
                    p.url = s.trim().to_string();
                    return p;
                }
            }
            if let Some(st) = p.child.as_mut().unwrap().try_wait().unwrap() {
                p.child = None;
                panic!("{name} ended ({st}) before listening:\n{}", p.output());
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not listen:\n{}",
                p.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    fn output(&self) -> String {
        format!(
            "{} stdout:\n{}\n{} stderr:\n{}",
            self.name,
            std::fs::read_to_string(&self.out).unwrap_or_default(),
            self.name,
            self.stderr()
        )
    }

    /// SIGTERM, then the exit status.
    fn terminate(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("running");
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: kill(2) on our own child, which is not reaped yet.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "kill");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within 30 s of SIGTERM:\n{}",
                self.name,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// tests/fixtures/openai_session.py against `base_url`; its JSON and output.
fn session(base_url: &str, out: &Path) -> (Value, Output) {
    let t = Instant::now();
    let o = Command::new(python())
        .arg(root().join("tests/fixtures/openai_session.py"))
        .args(["--base-url", base_url, "--model", "smollm2-135m"])
        .args(["--max-tokens", "16", "--out"])
        .arg(out)
        .env("OPENAI_API_KEY", KEY)
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_ORG_ID")
        .env_remove("OPENAI_PROJECT_ID")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "openai_session.py: {}", text(&o));
    eprintln!(
        "openai_session.py against {base_url}: {:.1?}\n{}",
        t.elapsed(),
        String::from_utf8_lossy(&o.stderr).trim_end()
    );
    let v = serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
    (v, o)
}

#[test]
#[ignore = "needs the llama.cpp server build (scripts/llamacpp-server.sh) and MASS_OPENAI_PYTHON (scripts/openai-env.sh)"]
fn an_openai_python_session_recorded_through_the_proxy_replays_with_the_server_stopped() {
    let t0 = Instant::now();
    let _ = python();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let ledger = dir.join("ledger");
    ok(mass(&ledger).arg("init"));

    // --- Record, against the test's own server.
    let port = free_port();
    let t = Instant::now();
    let (server, server_url) = OwnServer::start(port);
    eprintln!("llama.cpp server on port {port}: {:.1?}", t.elapsed());
    let mut rec = Proxy::start("record", &ledger, dir, &["--upstream", &server_url]);
    let (recorded, rec_out) = session(&rec.url, &dir.join("recorded.json"));
    let st = rec.terminate();
    assert_eq!(st.code(), Some(0), "{}", rec.output());
    assert!(
        rec.stderr()
            .contains(&format!("recorded into {REF} (head ")),
        "{}",
        rec.output()
    );
    // Every request went to the server once: two completions, and a third
    // if the server refused stream_options and the client asked again.
    let requests = if recorded["stream_options"] == true {
        2
    } else {
        3
    };
    assert_eq!(requests_served(&server.log()), requests);

    // --- Stop the server: nothing listens on its port any more.
    server.stop();

    // --- Replay: the same session, from the recording only.
    let mut rep = Proxy::start("replay", &ledger, dir, &["--replay"]);
    let (replayed, rep_out) = session(&rep.url, &dir.join("replayed.json"));
    let st = rep.terminate();
    assert_eq!(st.code(), Some(0), "{}", rep.output());
    assert!(
        rep.stderr().contains(&format!(
            "replayed {requests} of {requests} recorded exchanges"
        )),
        "{}",
        rep.output()
    );

    // The client got the same session, value for value.
    let replies = recorded["replies"].as_array().unwrap();
    assert_eq!(replies.len(), 2, "{recorded}");
    for r in replies {
        assert!(
            !r["text"].as_str().unwrap().is_empty(),
            "an empty reply: {recorded}"
        );
    }
    assert_eq!(replies[1]["stream"], true);
    let chunks = recorded["chunks"].as_array().unwrap();
    assert!(chunks.len() >= 3, "{} chunks: {recorded}", chunks.len());
    assert_eq!(
        recorded["deltas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect::<String>(),
        replies[1]["text"].as_str().unwrap()
    );
    for key in [
        "replies",
        "completion",
        "chunks",
        "deltas",
        "stream_options",
    ] {
        assert_eq!(
            replayed[key], recorded[key],
            "{key} differs between the recorded and the replayed session"
        );
    }
    assert_eq!(replayed, recorded);

    // --- The stream: one effect per request, each reassembled.
    let events: Value =
        serde_json::from_slice(&ok(mass(&ledger).args(["log", REF, "--json"])).stdout).unwrap();
    let events = events.as_array().unwrap();
    assert_eq!(events.len(), requests);
    let last = &events[0];
    assert_eq!(last["payload"]["status"], "ok", "{last}");
    let output: Value = serde_json::from_slice(
        &ok(mass(&ledger).args(["cat", last["payload"]["output"].as_str().unwrap()])).stdout,
    )
    .unwrap();
    assert_eq!(output["message"]["content"], replies[1]["text"], "{output}");

    // --- The key: in no object (decompressed), no ledger file, no output.
    let key = KEY.as_bytes();
    let l = ledger::Ledger::open_read_only(&ledger).unwrap();
    let (mut objects, mut saw_question) = (0, false);
    for (id, _) in l.locations().unwrap() {
        let (_, bytes) = l.raw_object(&id).unwrap();
        assert!(!contains(&bytes, key), "the key is in object {id:?}");
        saw_question |= contains(&bytes, QUESTION.as_bytes());
        objects += 1;
    }
    // Control: the search sees the recorded text.
    assert!(saw_question, "the recorded question is in no object");
    drop(l);
    let (mut stack, mut files) = (vec![ledger.clone()], 0);
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let b = std::fs::read(e.path()).unwrap();
                assert!(!contains(&b, key), "the key is in {}", e.path().display());
                files += 1;
            }
        }
    }
    let mut outputs = vec![
        ("record session".to_string(), rec_out),
        ("replay session".to_string(), rep_out),
    ];
    outputs.push(("log".into(), ok(mass(&ledger).args(["log", "--json"]))));
    for e in events {
        let id = e["id"].as_str().unwrap();
        outputs.push((format!("show {id}"), ok(mass(&ledger).args(["show", id]))));
        for field in ["request", "output"] {
            if let Some(b) = e["payload"][field].as_str() {
                outputs.push((format!("cat {b}"), ok(mass(&ledger).args(["cat", b]))));
            }
        }
    }
    for (label, o) in &outputs {
        assert!(
            !contains(&o.stdout, key) && !contains(&o.stderr, key),
            "the key is in the output of {label}"
        );
    }
    let exported = dir.join("events.jsonl");
    ok(mass(&ledger)
        .args(["export", "events", "--out"])
        .arg(&exported));
    let exported = std::fs::read(&exported).unwrap();
    assert!(contains(&exported, b"wire.served_by"));
    assert!(
        !contains(&exported, key),
        "the key is in mass export events"
    );
    for p in [&rec, &rep] {
        assert!(!p.output().contains(KEY), "{}", p.output());
    }
    eprintln!(
        "turn 1: {:?}\nturn 2: {:?} ({} chunks)\nkey searched: {objects} objects, {files} files, {} outputs; {:.1?} in all",
        replies[0]["text"],
        replies[1]["text"],
        chunks.len(),
        outputs.len(),
        t0.elapsed()
    );
}
