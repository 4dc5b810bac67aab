//! `mass proxy` end to end through the binary, with no network: a scripted
//! OpenAI-compatible server (tests/fixtures/scripted_openai.py, python3
//! stdlib only) as the upstream and `curl` as the client.
//!
//! - Recording: a non-streamed chat completion, a streamed one (SSE, with
//!   `stream_options.include_usage`) continuing the conversation, and a
//!   `GET /v1/models` (not a chat request) pass through with the client's
//!   `Authorization` header (the upstream receives it); SIGTERM ends the
//!   proxy with exit 0 once the records are durable, naming the stream. The
//!   stream then holds one `effect` per request, the raw bodies are in the
//!   ledger byte for byte, and the API key is in no object, no ledger file
//!   and no command's output.
//! - Replay, the upstream gone: the same requests, sent in another order,
//!   get byte-identical bodies with the recorded status and content type; a
//!   changed request gets HTTP 400 with an OpenAI-style error
//!   (`mass_replay_miss`) naming the stream, the request's position and the
//!   difference; SIGTERM ends it with exit 1 and the miss report.
//! - Usage errors exit 2 with a message.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const RUN: &str = "cli";
const STREAM: &str = "agent";
/// The stream's ref name, as the proxy names it.
const REF: &str = "cli/agent";
/// The client's API key: passed through to the upstream, never recorded.
const KEY: &str = "sk-mass-proxy-cli-5e0b7a93d1c2f468";
/// How long a process gets to start or to stop.
const PATIENCE: Duration = Duration::from_secs(10);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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
    let o = cmd.output().expect("run mass");
    assert!(o.status.success(), "{cmd:?}: {}", text(&o));
    o
}

/// A child process with its output in files; killed (SIGKILL) and reaped
/// when dropped unless it already ended, whatever assertion failed first.
struct Proc {
    name: &'static str,
    child: Option<Child>,
    out: PathBuf,
    err: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, cmd: &mut Command, dir: &Path) -> Proc {
        let out = dir.join(format!("{name}.out"));
        let err = dir.join(format!("{name}.err"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc {
            name,
            child: Some(child),
            out,
            err,
        }
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    fn output(&self) -> String {
        format!(
            "{} stdout:\n{}\n{} stderr:\n{}",
            self.name,
            self.stdout(),
            self.name,
            self.stderr()
        )
    }

    /// The contents of `file` once the process has written it (atomically:
    /// both writers rename a finished file into place).
    fn wait_for(&mut self, file: &Path) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(s) = std::fs::read_to_string(file) {
                if !s.trim().is_empty() {
                    return s.trim().to_string();
                }
            }
            let child = self.child.as_mut().expect("running");
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                panic!(
                    "{} ended ({st}) before writing {}:\n{}",
                    self.name,
                    file.display(),
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} wrote no {} in {PATIENCE:?}:\n{}",
                self.name,
                file.display(),
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends SIGTERM and returns the exit status.
    fn terminate(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("running");
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: kill(2) on our own child, which is not reaped yet.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "kill");
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {PATIENCE:?} of SIGTERM:\n{}",
                self.name,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Ends the process now (SIGKILL).
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The scripted upstream, saving every request it gets into `dump`.
fn scripted_server(dir: &Path, dump: &Path) -> (Proc, String) {
    let port_file = dir.join("upstream.port");
    let mut p = Proc::spawn(
        "scripted_openai.py",
        Command::new("python3")
            .arg(root().join("tests/fixtures/scripted_openai.py"))
            .args(["--port", "0", "--port-file"])
            .arg(&port_file)
            .arg("--script")
            .arg(root().join("tests/fixtures/qwen_script.json"))
            .arg("--dump-dir")
            .arg(dump),
        dir,
    );
    let port = p.wait_for(&port_file);
    (p, format!("http://127.0.0.1:{port}/v1"))
}

/// `mass proxy ARGS --run RUN --stream STREAM` on any free port, and the
/// client base URL it announced.
fn proxy(name: &'static str, ledger: &Path, dir: &Path, args: &[&str]) -> (Proc, String) {
    let url_file = dir.join(format!("{name}.url"));
    let mut p = Proc::spawn(
        name,
        mass(ledger)
            .arg("proxy")
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--run", RUN, "--stream", STREAM])
            .arg("--url-file")
            .arg(&url_file),
        dir,
    );
    let url = p.wait_for(&url_file);
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/v1"),
        "{url}"
    );
    assert_eq!(p.stdout().trim(), url, "the URL on stdout and in the file");
    (p, url)
}

/// What a client got back.
#[derive(Debug, Clone, PartialEq)]
struct Reply {
    status: u16,
    content_type: String,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// One request with curl: POSTs `body` as JSON (GET without one), with the
/// API key. The response headers go to curl's stderr, the body to stdout.
fn curl(base: &str, path: &str, body: Option<&Value>) -> Reply {
    let mut c = Command::new("curl");
    c.args([
        "-sS",
        "--noproxy",
        "*",
        "--max-time",
        "10",
        "-D",
        "/dev/stderr",
    ])
    .args(["-H", &format!("Authorization: Bearer {KEY}")]);
    if let Some(b) = body {
        c.args(["-H", "Content-Type: application/json", "--data-binary"])
            .arg(b.to_string());
    }
    let o = c.arg(format!("{base}{path}")).output().expect("run curl");
    assert!(o.status.success(), "curl {path}: {}", text(&o));
    let head = String::from_utf8_lossy(&o.stderr);
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head}"));
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    Reply {
        status,
        content_type,
        body: o.stdout,
    }
}

const CHAT: &str = "/chat/completions";

/// The conversation: a first turn (not streamed), its continuation (streamed).
fn first_turn() -> Value {
    json!({
        "model": "scripted",
        "messages": [
            {"role": "system", "content": "You are a test client. Be brief."},
            {"role": "user", "content": "Say hello."}
        ],
        "temperature": 0,
        "max_tokens": 16
    })
}

fn second_turn(first_reply: &Value) -> Value {
    let mut v = first_turn();
    let ms = v["messages"].as_array_mut().unwrap();
    ms.push(first_reply.clone());
    ms.push(json!({"role": "user", "content": "And now?"}));
    v["stream"] = json!(true);
    v["stream_options"] = json!({"include_usage": true});
    v
}

/// The assistant message of a non-streamed completion.
fn message_of(r: &Reply) -> Value {
    r.json()["choices"][0]["message"].clone()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn proxy_records_a_session_and_replays_it_byte_for_byte_and_fails_closed_on_a_changed_request() {
    let t0 = Instant::now();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let ledger = dir.join("ledger");
    let dump = dir.join("upstream-requests");
    ok(mass(&ledger).arg("init"));

    // --- Recording.
    let (mut upstream, upstream_url) = scripted_server(dir, &dump);
    let (mut rec, url) = proxy("record", &ledger, dir, &["--upstream", &upstream_url]);

    let first = curl(&url, CHAT, Some(&first_turn()));
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.content_type, "application/json");
    // The script's subagent turn 0: a tool call.
    assert_eq!(
        message_of(&first)["tool_calls"][0]["function"]["name"],
        "write_file"
    );
    let second_req = second_turn(&message_of(&first));
    let second = curl(&url, CHAT, Some(&second_req));
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(second.content_type, "text/event-stream");
    let sse = String::from_utf8(second.body.clone()).unwrap();
    assert!(sse.ends_with("data: [DONE]\n\n"), "{sse}");
    assert!(sse.contains(r#""content": "Wrote s""#), "{sse}");
    assert!(sse.contains(r#""usage": {"prompt_tokens""#), "{sse}");
    let models = curl(&url, "/models", None);
    assert_eq!(models.status, 200, "{models:?}");
    assert_eq!(models.json()["data"][0]["id"], "scripted");

    let st = rec.terminate();
    assert_eq!(st.code(), Some(0), "{}", rec.output());
    let err = rec.stderr();
    assert!(
        err.contains(&format!("recorded into {REF} (head ")),
        "{}",
        rec.output()
    );

    // The upstream got both chat requests, with the client's key.
    let mut dumped: Vec<PathBuf> = std::fs::read_dir(&dump)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dumped.sort();
    assert_eq!(dumped.len(), 2, "{dumped:?}\n{}", upstream.output());
    for f in &dumped {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        let auth = v["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h[0].as_str().unwrap().eq_ignore_ascii_case("authorization"))
            .map(|h| h[1].clone());
        assert_eq!(
            auth,
            Some(json!(format!("Bearer {KEY}"))),
            "{}",
            f.display()
        );
    }
    upstream.kill();

    // The stream: one effect per request, newest first.
    let log = ok(mass(&ledger).args(["log", REF]));
    let log = String::from_utf8(log.stdout).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 3, "{log}");
    for (line, n) in lines.iter().zip([2, 1, 0]) {
        assert!(line.contains("effect"), "{log}");
        assert!(line.ends_with(&format!("{STREAM}#{n}")), "{log}");
    }
    let head = lines[0].split_whitespace().next().unwrap();
    assert!(err.contains(&format!("(head {head}")), "{err} vs {log}");
    let refs: Value =
        serde_json::from_slice(&ok(mass(&ledger).args(["refs", "--json"])).stdout).unwrap();
    assert!(
        refs.as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == REF && r["head"].as_str().unwrap().starts_with(head)),
        "{refs}"
    );
    // Each effect's output holds the raw body: the bytes the client got,
    // recoverable with `mass cat`. Chat requests are `model` effects; the
    // models list is a plain `http` one.
    let events: Value =
        serde_json::from_slice(&ok(mass(&ledger).args(["log", REF, "--json"])).stdout).unwrap();
    let events = events.as_array().unwrap();
    let cat_json = |id: &str| -> Value {
        serde_json::from_slice(&ok(mass(&ledger).args(["cat", id])).stdout).unwrap()
    };
    let mut raw_bodies = Vec::new();
    for (i, e) in events.iter().rev().enumerate() {
        let p = &e["payload"];
        assert_eq!(p["effect"], if i < 2 { "model" } else { "http" }, "{e}");
        assert_eq!(e["meta"]["extra"]["wire.served_by"], json!(upstream_url));
        let request = cat_json(p["request"].as_str().unwrap());
        assert_eq!(request["wire"], 1, "{request}");
        let output = match p["output"].as_str() {
            Some(o) => cat_json(o),
            None => serde_json::from_str(p["error"].as_str().unwrap()).unwrap(),
        };
        assert_eq!(output["http"]["status"], 200, "{e}");
        let raw = ok(mass(&ledger).args(["cat", output["raw_body"].as_str().unwrap()])).stdout;
        raw_bodies.push((p["status"].clone(), request, output, raw));
    }
    assert_eq!(raw_bodies[0].3, first.body);
    assert_eq!(raw_bodies[1].3, second.body);
    assert_eq!(raw_bodies[2].3, models.body);
    // The chat requests are taken apart (the second extends the first), the
    // replies reassembled; the models request is kept as it came.
    assert_eq!(raw_bodies[0].0, "ok");
    assert_eq!(raw_bodies[0].1["model"], "scripted");
    assert_eq!(raw_bodies[0].2["finish_reason"], "tool_calls");
    assert_eq!(raw_bodies[1].0, "ok");
    assert_eq!(raw_bodies[1].1["prefix"], events[2]["id"]);
    assert_eq!(raw_bodies[1].1["messages"].as_array().unwrap().len(), 2);
    assert_eq!(raw_bodies[1].2["message"]["content"], "Wrote sub.txt.");
    assert_eq!(raw_bodies[1].2["usage"]["completion_tokens"], 3);
    assert_eq!(raw_bodies[2].0, "ok");
    assert_eq!(raw_bodies[2].1["method"], "GET");
    assert_eq!(raw_bodies[2].1["path"], "/v1/models");

    // --- Replay: no upstream at all; the requests in another order.
    let (mut rep, url) = proxy("replay", &ledger, dir, &["--replay"]);
    assert_eq!(curl(&url, "/models", None), models);
    assert_eq!(curl(&url, CHAT, Some(&second_req)), second);
    assert_eq!(curl(&url, CHAT, Some(&first_turn())), first);
    // A changed request: request 4 on the stream.
    let mut changed = first_turn();
    changed["messages"][1]["content"] = json!("Say goodbye.");
    let miss = curl(&url, CHAT, Some(&changed));
    assert_eq!(miss.status, 400, "{miss:?}");
    assert_eq!(miss.content_type, "application/json");
    let e = &miss.json()["error"];
    assert_eq!(e["type"], "mass_replay_miss", "{e}");
    let msg = e["message"].as_str().unwrap();
    for want in [
        format!("stream {REF}"),
        "request 4 (POST /v1/chat/completions)".to_string(),
        "3 of 3 recorded exchanges served".to_string(),
        r#"$.messages[1].content: "Say hello." -> "Say goodbye.""#.to_string(),
    ] {
        assert!(
            msg.contains(&want),
            "{want:?} not in the miss report:\n{msg}"
        );
    }
    let st = rep.terminate();
    assert_eq!(st.code(), Some(1), "{}", rep.output());
    let err = rep.stderr();
    assert!(
        err.contains("replayed 3 of 3 recorded exchanges"),
        "{}",
        rep.output()
    );
    assert!(err.contains(msg.trim_end()), "{}", rep.output());
    // A pure replay records nothing.
    let after = ok(mass(&ledger).args(["log", REF]));
    assert_eq!(String::from_utf8(after.stdout).unwrap(), log);

    // --- The key: in no object (decompressed), no ledger file, no output.
    let key = KEY.as_bytes();
    let l = ledger::Ledger::open_read_only(&ledger).unwrap();
    let mut objects = 0;
    let mut saw_prompt = false;
    for (id, _) in l.locations().unwrap() {
        let (_, bytes) = l.raw_object(&id).unwrap();
        assert!(!contains(&bytes, key), "the key is in object {id:?}");
        // Control: the search sees the recorded text.
        saw_prompt |= contains(&bytes, b"You are a test client.");
        objects += 1;
    }
    assert!(saw_prompt, "the recorded system prompt is in no object");
    drop(l);
    let mut stack = vec![ledger.clone()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let b = std::fs::read(e.path()).unwrap();
                assert!(!contains(&b, key), "the key is in {}", e.path().display());
            }
        }
    }
    for args in [vec!["log", "--json"], vec!["show", head]] {
        let o = ok(mass(&ledger).args(&args));
        assert!(
            !contains(&o.stdout, key) && !contains(&o.stderr, key),
            "the key is in the output of mass {args:?}"
        );
    }
    let exported = dir.join("events.jsonl");
    ok(mass(&ledger)
        .args(["export", "events", "--out"])
        .arg(&exported));
    let exported = std::fs::read(&exported).unwrap();
    assert!(contains(&exported, b"wire.served_by"), "export is empty?");
    assert!(
        !contains(&exported, key),
        "the key is in mass export events"
    );
    for p in [&rec, &rep] {
        assert!(!p.output().contains(KEY), "{}", p.output());
    }
    eprintln!(
        "{objects} objects searched; record, replay and checks in {:.1?}",
        t0.elapsed()
    );
}

#[test]
fn proxy_usage_errors_exit_2_with_a_message() {
    let d = tempfile::tempdir().unwrap();
    let ledger = d.path().join("ledger");
    ok(mass(&ledger).arg("init"));
    let cases: [(&[&str], &str); 4] = [
        (&["--run", "r"], "give --upstream URL to record"),
        (
            &[
                "--run",
                "r",
                "--replay",
                "--upstream",
                "http://127.0.0.1:9/v1",
            ],
            "mixed mode needs both --upstream URL and --into RUN",
        ),
        (
            &["--run", "r", "--upstream", "ftp://127.0.0.1/v1"],
            "is not an http(s) URL",
        ),
        (
            &[
                "--run",
                "r",
                "--upstream",
                "http://127.0.0.1:9/v1",
                "--into",
                "x",
            ],
            "--normalise and --into go with --replay",
        ),
    ];
    for (args, want) in cases {
        let o = mass(&ledger).arg("proxy").args(args).output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(2),
            "mass proxy {args:?}: {}",
            text(&o)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "mass proxy {args:?}: {}", text(&o));
    }
    // Replaying a stream that holds nothing fails at once, naming it.
    let o = mass(&ledger)
        .args([
            "proxy",
            "--replay",
            "--run",
            "r",
            "--stream",
            "nothing-here",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("stream r/nothing-here holds no recorded exchange"),
        "{}",
        text(&o)
    );
}
