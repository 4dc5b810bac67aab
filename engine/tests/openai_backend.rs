//! The OpenAI-compatible backend against servers that misbehave: a scripted
//! HTTP server on 127.0.0.1 answers with what a test asks (errors, HTML pages,
//! cut bodies, slow answers, `Retry-After`), and a second one serves the
//! simulated model over the wire so a whole MASS cycle runs through the real
//! HTTP client, is interrupted by the server going away, resumes, and replays
//! with no server at all. API keys never reach the ledger.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::backend::openai::OpenAiBackend;
use engine::backend::sim::{SimBackend, SimParams};
use engine::backend::{BackendError, ChatRequest, ChatResponse};
use engine::chat::{Message, ToolDef};
use engine::config::OpenAiParams;
use serde_json::{json, Value};

/// One scripted answer.
#[derive(Clone)]
enum Reply {
    /// Status, extra headers, body.
    Http(u16, Vec<(String, String)>, Vec<u8>),
    /// Claims `Content-Length: n` and sends fewer bytes, then closes.
    Cut(usize, Vec<u8>),
    /// Answers after a delay.
    Slow(Duration, Box<Reply>),
}

/// What a server saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    headers: Vec<(String, String)>,
    body: Value,
}

/// A minimal HTTP/1.1 server on 127.0.0.1: one request per connection.
struct Server {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    served: Arc<AtomicUsize>,
}

impl Server {
    /// Answers from `script`, in order; the last answer repeats.
    fn scripted(script: Vec<Reply>) -> Server {
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        Server::start(move |_body| {
            let mut s = script.lock().unwrap();
            if s.len() > 1 {
                s.pop_front().unwrap()
            } else {
                s.front().cloned().unwrap()
            }
        })
    }

    fn start(answer: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Server {
        Server::start_on(TcpListener::bind("127.0.0.1:0").unwrap(), answer)
    }

    fn start_on(
        listener: TcpListener,
        answer: impl Fn(&Value) -> Reply + Send + Sync + 'static,
    ) -> Server {
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        listener.set_nonblocking(true).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicUsize::new(0));
        let answer = Arc::new(answer);
        {
            let (seen, stop, served) = (seen.clone(), stop.clone(), served.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let (seen, answer, served) =
                                (seen.clone(), answer.clone(), served.clone());
                            std::thread::spawn(move || {
                                // Recorded before the reply goes out, so a
                                // client that has its answer sees it counted.
                                if let Some((conn, s, reply)) = handle(conn, &*answer) {
                                    seen.lock().unwrap().push(s);
                                    served.fetch_add(1, Ordering::SeqCst);
                                    write_reply(conn, reply);
                                }
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
            });
        }
        Server {
            url,
            seen,
            stop,
            served,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Let the accept loop notice and drop the listener.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One completion from synchronous test code, on the engine's runtime.
fn complete(
    b: &dyn engine::backend::Backend,
    req: &ChatRequest,
) -> Result<ChatResponse, BackendError> {
    engine::exec::block_on(b.complete(req)).expect("the engine's runtime starts")
}

fn handle(conn: TcpStream, answer: &dyn Fn(&Value) -> Reply) -> Option<(TcpStream, Seen, Reply)> {
    conn.set_nonblocking(false).ok()?;
    let mut r = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut headers = Vec::new();
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().ok()?;
            }
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let reply = answer(&body);
    Some((conn, Seen { headers, body }, reply))
}

fn write_reply(mut conn: TcpStream, reply: Reply) {
    match reply {
        Reply::Http(status, headers, body) => {
            let mut head = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        }
        Reply::Cut(claimed, body) => {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {claimed}\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n");
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        }
        Reply::Slow(d, inner) => {
            std::thread::sleep(d);
            return write_reply(conn, *inner);
        }
    }
    let _ = conn.flush();
}

fn ok_json(v: Value) -> Reply {
    Reply::Http(
        200,
        vec![("Content-Type".into(), "application/json".into())],
        v.to_string().into_bytes(),
    )
}

fn completion(content: Option<&str>, tool_calls: Value) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": content, "tool_calls": tool_calls,
                                 "reasoning_content": "thinking about it"}}],
        "usage": {"prompt_tokens": 31, "completion_tokens": 7, "total_tokens": 38},
        "system_fingerprint": "fp_test"
    })
}

fn params(url: &str) -> OpenAiParams {
    OpenAiParams {
        base_url: url.to_string(),
        base_url_env: None,
        model: "m".into(),
        api_key_env: None,
        api_key_file: None,
        timeout_secs: 2,
        max_retries: 3,
        max_concurrency: 4,
        structured_output: engine::config::StructuredOutput::JsonSchema,
        temperature: 0.7,
        max_tokens: 256,
        lora_adapter: None,
        serve: None,
    }
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "m".into(),
        messages: vec![Message::system("be brief"), Message::user("hi")],
        tools: engine::tools::tool_defs(true),
        temperature: 0.2,
        seed: 42,
        max_tokens: 64,
        top_p: None,
        stop: Vec::new(),
        tool_choice: None,
        response_format: None,
        tools_json: None,
        messages_json: Default::default(),
    }
}

/// The tools sent as the conversation's JSON text (made once) are the
/// same request as the definitions serialised on every turn.
#[test]
fn tools_sent_as_json_text_are_the_same_request_as_the_definitions() {
    let b = OpenAiBackend::new("srv", &params("http://127.0.0.1:9")).expect("backend");
    let plain = request();
    let canonical = replay::canonical_json(&serde_json::to_value(&plain.tools).expect("tools"));
    let mut cached = request();
    cached.tools_json = engine::backend::ToolsJson::from_json(&canonical);
    assert!(cached.tools_json.is_some());
    assert_eq!(b.body(&cached), b.body(&plain));
    assert_eq!(
        b.body(&cached)["tools"].as_array().map(Vec::len),
        Some(plain.tools.len())
    );
}

/// Messages sent from the conversation's cache (one JSON text per message,
/// grown turn by turn as `call_model` grows it) are the request the
/// messages make serialised whole; a cache made from other messages (other
/// text, text of the same length, other tool-call arguments of the same
/// length) is not used for them; compared as the bytes sent.
#[test]
fn messages_sent_from_the_cache_are_the_same_request_and_a_stale_cache_is_not_used() {
    use engine::backend::MessagesJson;
    use engine::chat::ToolCall;
    let b = OpenAiBackend::new("srv", &params("http://127.0.0.1:9")).expect("backend");
    let mut plain = request();
    plain.messages.push(Message::tool_calls(vec![ToolCall::new(
        "call_1",
        "read_file",
        "{\"path\":\"a \\\"b\\\".txt\"}",
    )]));
    plain.messages.push(Message::tool_result(
        "call_1",
        "line \"quoted\"\n\ttab \u{1F600} \u{7}",
    ));
    let mut cached = request();
    cached.messages = plain.messages.clone();
    let mut wire = MessagesJson::default();
    wire.extend(&cached.messages[..2]);
    wire.extend(&cached.messages);
    cached.messages_json = wire;
    let bytes = |r: &ChatRequest| b.body_bytes(r).expect("body");
    assert_eq!(bytes(&cached), bytes(&plain));
    // Made from other messages: other text, the same text in another
    // string, a tool call with other arguments of the same length.
    let mut edited_call = plain.messages.clone();
    edited_call[2] = Message::tool_calls(vec![ToolCall::new(
        "call_1",
        "read_file",
        "{\"path\":\"a \\\"c\\\".txt\"}",
    )]);
    for made_from in [
        vec![Message::system("something else"), Message::user("hi")],
        vec![Message::system("BE BRIEF"), Message::user("hi")],
        edited_call,
    ] {
        let mut stale = MessagesJson::default();
        stale.extend(&made_from);
        let mut wrong = plain.clone();
        wrong.messages_json = stale;
        assert_eq!(bytes(&wrong), bytes(&plain), "{made_from:?}");
    }
}

#[test]
fn a_response_is_parsed_the_raw_body_kept_and_the_request_is_well_formed() {
    let key_var = "MASS_TEST_KEY_PARSE";
    std::env::set_var(key_var, "sk-test-parse-0123456789");
    let body = completion(
        None,
        json!([{"id": "call_9", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]),
    );
    let server = Server::scripted(vec![ok_json(body.clone())]);
    let mut p = params(&server.url);
    p.api_key_env = Some(key_var.into());
    let b = OpenAiBackend::new("srv", &p).unwrap();
    let r = complete(&b, &request()).unwrap();
    assert_eq!(r.message.tool_calls.len(), 1);
    assert_eq!(r.message.tool_calls[0].id, "call_9");
    assert_eq!(r.message.tool_calls[0].function.name, "bash");
    assert_eq!(
        r.message.tool_calls[0].function.arguments,
        "{\"command\": \"ls\"}"
    );
    assert_eq!((r.usage.prompt_tokens, r.usage.completion_tokens), (31, 7));
    assert_eq!(r.finish_reason, "tool_calls");
    // The raw body, unknown fields included, exactly as received.
    let raw = r.raw.expect("raw body");
    assert_eq!(serde_json::from_slice::<Value>(&raw).unwrap(), body);
    assert!(String::from_utf8_lossy(&raw).contains("reasoning_content"));
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let s = &seen[0];
    assert_eq!(s.body["model"], "m");
    assert_eq!(s.body["seed"], 42);
    assert_eq!(s.body["max_tokens"], 64);
    assert_eq!(s.body["tool_choice"], "auto");
    assert_eq!(s.body["tools"].as_array().unwrap().len(), 7);
    assert_eq!(s.body["messages"][1]["content"], "hi");
    let auth = s
        .headers
        .iter()
        .find(|(k, _)| k == "authorization")
        .map(|(_, v)| v.clone());
    assert_eq!(auth.as_deref(), Some("Bearer sk-test-parse-0123456789"));
    // Debug never shows the key.
    assert!(!format!("{b:?}").contains("sk-test-parse"));
}

/// `sampling.team.tool_choice`: the three keywords go as strings, a tool
/// name as the named-function object servers enforce with a grammar.
#[test]
fn a_forced_tool_choice_is_sent_in_the_wire_shape() {
    let p = params("http://127.0.0.1:9/v1");
    let b = OpenAiBackend::new("srv", &p).unwrap();
    let mut r = request();
    for kw in ["auto", "none", "required"] {
        r.tool_choice = Some(kw.into());
        assert_eq!(b.body(&r)["tool_choice"], kw);
    }
    r.tool_choice = Some("write_file".into());
    assert_eq!(
        b.body(&r)["tool_choice"],
        json!({"type": "function", "function": {"name": "write_file"}})
    );
    // An assistant turn that only called tools goes with empty content (a
    // null one breaks chat-template servers); the tool result keeps its id.
    let call = engine::chat::ToolCall::new("c1", "list_files", "{}");
    let mut turn = Message::assistant("");
    turn.content = None;
    turn.tool_calls = vec![call];
    r.messages.push(turn);
    r.messages.push(Message::tool_result("c1", "a.txt"));
    let body = b.body(&r);
    assert_eq!(body["messages"][2]["content"], "");
    assert_eq!(body["messages"][2]["tool_calls"][0]["id"], "c1");
    assert_eq!(body["messages"][3]["role"], "tool");
    assert_eq!(body["messages"][3]["tool_call_id"], "c1");
    assert!(body["messages"][1].get("tool_calls").is_none());
    // Without tools there is nothing to choose: no tool_choice at all.
    r.tools.clear();
    assert!(b.body(&r).get("tool_choice").is_none());
}

#[test]
fn a_missing_key_variable_is_named_not_guessed() {
    let mut p = params("http://127.0.0.1:9/v1");
    p.api_key_env = Some("MASS_TEST_KEY_UNSET_XYZ".into());
    let e = OpenAiBackend::new("srv", &p).unwrap_err();
    assert!(matches!(e, BackendError::Config { .. }), "{e}");
    assert!(e.to_string().contains("MASS_TEST_KEY_UNSET_XYZ"), "{e}");
}

/// `api_key_file`: the key is read from the file and sent as a bearer
/// token; a missing or empty file is a configuration error naming the path,
/// never a value; naming both a variable and a file is refused.
#[test]
fn a_key_file_is_read_and_its_contents_never_shown() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("key");
    std::fs::write(&path, "sk-file-key-9876543210\n").unwrap();
    let server = Server::scripted(vec![ok_json(completion(Some("hi"), json!(null)))]);
    let mut p = params(&server.url);
    p.api_key_file = Some(path.to_string_lossy().into_owned());
    let b = OpenAiBackend::new("srv", &p).unwrap();
    complete(&b, &request()).unwrap();
    let auth = server.seen()[0]
        .headers
        .iter()
        .find(|(k, _)| k == "authorization")
        .map(|(_, v)| v.clone());
    assert_eq!(auth.as_deref(), Some("Bearer sk-file-key-9876543210"));
    assert!(!format!("{b:?}").contains("sk-file-key"));

    std::fs::write(&path, "  \n").unwrap();
    let e = OpenAiBackend::new("srv", &p).unwrap_err();
    assert!(e.to_string().contains("is empty"), "{e}");
    p.api_key_file = Some(d.path().join("absent").to_string_lossy().into_owned());
    let e = OpenAiBackend::new("srv", &p).unwrap_err().to_string();
    assert!(matches!(
        OpenAiBackend::new("srv", &p),
        Err(BackendError::Config { .. })
    ));
    assert!(e.contains("absent") && e.contains("cannot read"), "{e}");

    let both = "name = \"x\"\nseed = 1\ntasks_dir = \"tasks\"\n[backends.s]\nkind = \"openai\"\nbase_url = \"http://h/v1\"\nmodel = \"m\"\napi_key_env = \"K\"\napi_key_file = \"/k\"\n[roles]\norchestrator = \"s\"\njudge = \"s\"\noptimizer = \"s\"\n";
    let e = engine::config::Experiment::parse(both, "both.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("api_key_env or api_key_file, not both"), "{e}");
}

/// Every way a server can fail becomes a readable error of the right class,
/// never a panic: worth retrying (`Failed`) or not (`Rejected`).
#[test]
fn bad_responses_become_readable_errors_of_the_right_class() {
    let html = b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1><p>nginx</p></body></html>".to_vec();
    let cases: Vec<(&str, Reply, bool, &str)> = vec![
        (
            "503",
            Reply::Http(503, vec![], b"overloaded".to_vec()),
            true,
            "HTTP 503: overloaded",
        ),
        (
            "html 200",
            Reply::Http(200, vec![], html.clone()),
            true,
            "not JSON",
        ),
        ("html 502", Reply::Http(502, vec![], html), true, "HTTP 502"),
        (
            "no choices",
            ok_json(json!({"choices": []})),
            true,
            "no choices",
        ),
        (
            "error object",
            ok_json(json!({"error": {"message": "model crashed"}})),
            true,
            "model crashed",
        ),
        (
            "context length",
            Reply::Http(
                400,
                vec![],
                json!({"error": {"message": "This model's maximum context length is 8192 tokens"}})
                    .to_string()
                    .into_bytes(),
            ),
            false,
            "maximum context length",
        ),
        (
            "cut body",
            Reply::Cut(1000, b"{\"choices\": [".to_vec()),
            true,
            "cut short",
        ),
        (
            "slow",
            Reply::Slow(
                Duration::from_secs(4),
                Box::new(ok_json(completion(Some("late"), json!([])))),
            ),
            true,
            "timed out",
        ),
        (
            "content type",
            ok_json(json!({"choices": [{"message": {"role": "assistant", "content": 5}}]})),
            true,
            "content is a number",
        ),
    ];
    for (name, reply, transient, needle) in cases {
        let server = Server::scripted(vec![reply]);
        let b = OpenAiBackend::new("srv", &params(&server.url)).unwrap();
        let e = complete(&b, &request()).expect_err(name);
        let text = e.to_string();
        match (&e, transient) {
            (BackendError::Failed { .. }, true) | (BackendError::Rejected { .. }, false) => {}
            _ => panic!("{name}: wrong class: {e:?}"),
        }
        assert!(text.contains(needle), "{name}: {text}");
        assert!(
            text.len() < 600,
            "{name}: the error quotes too much: {text}"
        );
    }
    // Nobody listening.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", dead.local_addr().unwrap());
    drop(dead);
    let b = OpenAiBackend::new("srv", &params(&url)).unwrap();
    let e = complete(&b, &request()).unwrap_err();
    assert!(
        matches!(e, BackendError::Failed { .. }) && e.to_string().contains("could not connect"),
        "{e}"
    );
    // Retry-After is read.
    let server = Server::scripted(vec![Reply::Http(
        429,
        vec![("Retry-After".into(), "7".into())],
        b"slow down".to_vec(),
    )]);
    let b = OpenAiBackend::new("srv", &params(&server.url)).unwrap();
    match complete(&b, &request()) {
        Err(BackendError::Failed { retry_after, .. }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(7)))
        }
        other => panic!("{other:?}"),
    }
    // Invalid tool-call JSON is kept as written: the harness answers the model.
    let server = Server::scripted(vec![ok_json(completion(
        None,
        json!([{"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": "}}]),
    ))]);
    let b = OpenAiBackend::new("srv", &params(&server.url)).unwrap();
    let r = complete(&b, &request()).unwrap();
    assert_eq!(r.message.tool_calls[0].function.arguments, "{\"command\": ");
}

// ---------------------------------------------------------------------------
// The simulated model over HTTP: a whole cycle through the real client.

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// The simulated model's default parameters, as an experiment's
/// `[backends.X] kind = "sim"` gets them.
fn sim_params() -> SimParams {
    let p = engine::config::SimConfig::default();
    SimParams::new(
        p.skill,
        p.delegation,
        p.judge_noise,
        p.position_bias,
        p.blind_spot,
    )
}

/// Serves `sim` as an OpenAI-compatible server; answers 503 while `down`.
fn sim_reply(sim: &SimBackend, body: &Value, down: &AtomicBool) -> Reply {
    if down.load(Ordering::SeqCst) {
        return Reply::Http(503, vec![], b"the server is restarting".to_vec());
    }
    let messages: Vec<Message> =
        serde_json::from_value(body["messages"].clone()).unwrap_or_default();
    let tools: Vec<ToolDef> = serde_json::from_value(body["tools"].clone()).unwrap_or_default();
    let req = ChatRequest {
        model: body["model"].as_str().unwrap_or("").to_string(),
        messages,
        tools,
        temperature: body["temperature"].as_f64().unwrap_or(0.0),
        seed: body["seed"].as_u64().unwrap_or(0),
        max_tokens: body["max_tokens"].as_u64().unwrap_or(0),
        top_p: None,
        stop: Vec::new(),
        tool_choice: None,
        response_format: None,
        tools_json: None,
        messages_json: Default::default(),
    };
    match sim.reply(&req) {
        Ok(ChatResponse {
            message,
            usage,
            finish_reason,
            ..
        }) => ok_json(json!({
            "id": "chatcmpl-sim",
            "choices": [{"index": 0, "finish_reason": finish_reason, "message": message}],
            "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
            "x_server": "sim-over-http"
        })),
        Err(e) => Reply::Http(
            404,
            vec![],
            json!({"error": {"message": e.to_string()}})
                .to_string()
                .into_bytes(),
        ),
    }
}

/// The smoke experiment with its one backend served over HTTP at `url`
/// (no training: adapters the trainer makes live with the server).
fn smoke_over_http(url: &str, key_var: &str, seed: u64) -> (String, String) {
    let path = examples().join("smoke.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("seed = ") {
            out.push(format!("seed = {seed}"));
        } else if line == "kind = \"sim\""
            && out.last().is_some_and(|l: &String| l == "[backends.sim]")
        {
            out.push(format!(
                "kind = \"openai\"\nbase_url = \"{url}\"\nmodel = \"sim/base\"\napi_key_env = \"{key_var}\"\nmax_retries = 2\ntimeout_secs = 10"
            ));
        } else {
            out.push(line.to_string());
        }
    }
    let mut text = out.join("\n");
    text.push('\n');
    // No training (the adapter would live with the server) and so no
    // held-out evaluation of a new model.
    text = text.replace("[outer]\n", "[outer]\ntrain = false\n");
    // The judge samples as the experiment says, not as the engine likes.
    text.push_str(
        "\n[sampling.judge]\ntemperature = 0.05\nmax_tokens = 77\ntop_p = 0.5\nstop = [\"END\"]\n",
    );
    assert!(
        text.contains("kind = \"openai\""),
        "smoke.toml changed shape:\n{text}"
    );
    (text, path.to_string_lossy().into_owned())
}

/// Every object of the ledger, decompressed, searched for `needle`.
fn ledger_contains(l: &ledger::Ledger, needle: &[u8]) -> bool {
    l.locations().unwrap().into_iter().any(|(id, _)| {
        let (_, bytes) = l.raw_object(&id).unwrap();
        bytes.windows(needle.len()).any(|w| w == needle)
    })
}

/// The dataset blob of the run's first cycle.
fn dataset(l: &ledger::Ledger, run: &str) -> Option<schemas::Dataset> {
    let head = l.head(run).unwrap()?;
    l.chain(head)
        .map(|e| e.unwrap())
        .find(|e| e.kind == "mass.dataset")
        .map(|e| schemas::decode_event(&e).unwrap())
}

#[test]
fn a_cycle_over_http_survives_the_server_going_away_resumes_and_replays_offline() {
    use engine::context::NoProgress;
    use engine::driver::{drive, RunRequest};
    use replay::Mode;

    let key_var = "MASS_TEST_KEY_CYCLE";
    let key = "sk-live-cycle-7f3a9c21e5";
    std::env::set_var(key_var, key);
    let tasks = examples().join("tasks");
    let seed = 8;
    let run = |l: &Arc<ledger::Ledger>, name: &str, exp: Option<(String, String)>, mode: Mode| {
        drive(
            l.clone(),
            RunRequest {
                run: name.into(),
                experiment: exp,
                mode,
                source: None,
                progress: &NoProgress,
            },
        )
    };

    // Uninterrupted, for reference.
    let sim = SimBackend::new("sim", sim_params(), &tasks).unwrap();
    let never_down = AtomicBool::new(false);
    let server = Server::start(move |b| sim_reply(&sim, b, &never_down));
    let d = tempfile::tempdir().unwrap();
    let whole = Arc::new(ledger::Ledger::init(&d.path().join("whole")).unwrap());
    run(
        &whole,
        "smoke",
        Some(smoke_over_http(&server.url, key_var, seed)),
        Mode::Live,
    )
    .unwrap();
    let calls_whole = server.served.load(Ordering::SeqCst);
    // Per-role sampling reached the wire: judge calls with the judge's
    // settings, team calls with the team defaults.
    let seen = server.seen();
    let judge_calls = seen.iter().filter(|s| s.body["max_tokens"] == 77).count();
    assert!(judge_calls > 0);
    for s in seen.iter().filter(|s| s.body["max_tokens"] == 77) {
        assert_eq!(s.body["response_format"]["json_schema"]["name"], "verdict");
        assert_eq!(s.body["temperature"], 0.05);
        assert_eq!(s.body["top_p"], 0.5);
        assert_eq!(s.body["stop"], json!(["END"]));
    }
    assert!(seen.iter().any(|s| s.body["max_tokens"] == 4096
        && s.body["temperature"] == 0.7
        && s.body.get("top_p").is_none()));
    // Optimizer calls ask for the proposal's schema; team calls for none.
    assert!(seen
        .iter()
        .any(|s| s.body["response_format"]["json_schema"]["name"] == "proposal"));
    assert!(seen
        .iter()
        .filter(|s| s.body["temperature"] == 0.7)
        .all(|s| s.body.get("response_format").is_none()));
    drop(server);
    assert!(calls_whole > 20, "{calls_whole} calls");

    // The same run, with the server failing after 40 calls.
    let sim = SimBackend::new("sim", sim_params(), &tasks).unwrap();
    let down = Arc::new(AtomicBool::new(false));
    let flaky = Arc::new(AtomicBool::new(true));
    let good = Arc::new(AtomicUsize::new(0));
    let (down2, flaky2, good2) = (down.clone(), flaky.clone(), good.clone());
    let server = Server::start(move |b| {
        if flaky2.load(Ordering::SeqCst) && good2.load(Ordering::SeqCst) >= 40 {
            down2.store(true, Ordering::SeqCst);
        }
        let r = sim_reply(&sim, b, &down2);
        if matches!(r, Reply::Http(200, ..)) {
            good2.fetch_add(1, Ordering::SeqCst);
        }
        r
    });
    let l = Arc::new(ledger::Ledger::init(&d.path().join("l")).unwrap());
    let err = run(
        &l,
        "smoke",
        Some(smoke_over_http(&server.url, key_var, seed)),
        Mode::Live,
    )
    .expect_err("the server went away");
    assert!(
        matches!(err, engine::error::EngineError::Infrastructure { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("503"), "{err}");
    assert!(
        !format!("{err} {err:?}").contains(key),
        "the key leaked into an error"
    );
    let before = good.load(Ordering::SeqCst);
    assert_eq!(before, 40);
    // Every attempt was recorded: for each request the server failed (one
    // per unit in flight when it went down), the first try and
    // max_retries = 2 retries.
    let mut attempts: std::collections::BTreeMap<[u8; 32], usize> = Default::default();
    for e in l
        .refs()
        .unwrap()
        .into_iter()
        .flat_map(|(_, h)| l.chain(h).map(|e| e.unwrap()).collect::<Vec<_>>())
        .filter(|e| e.kind == "effect")
    {
        let eff: schemas::Effect = schemas::decode_event(&e).unwrap();
        if eff.status == schemas::EffectStatus::Retriable {
            *attempts.entry(eff.request.0).or_default() += 1;
        }
    }
    assert!(!attempts.is_empty(), "no failed attempt recorded");
    assert!(
        attempts.values().all(|&n| n == 3),
        "attempts recorded per failed request: {:?}",
        attempts.values().collect::<Vec<_>>()
    );

    // The server is back: the resume redoes no recorded call.
    flaky.store(false, Ordering::SeqCst);
    down.store(false, Ordering::SeqCst);
    good.store(0, Ordering::SeqCst);
    run(&l, "smoke", None, Mode::Live).unwrap();
    let after = good.load(Ordering::SeqCst);
    assert_eq!(
        before + after,
        calls_whole,
        "a recorded call was made again, or one was lost"
    );
    drop(server);
    // Same work as the uninterrupted run: the same dataset, byte for byte.
    let (a, b) = (dataset(&whole, "smoke"), dataset(&l, "smoke"));
    assert_eq!(a.map(|x| x.train), b.map(|x| x.train));

    // No server at all: the replay check serves everything.
    let head = l.head("smoke").unwrap();
    let c = run(&l, "smoke", None, Mode::Check).unwrap();
    assert_eq!(c.head, head);
    // The key never entered the ledger; the raw bodies did.
    assert!(!ledger_contains(&l, key.as_bytes()));
    assert!(ledger_contains(&l, b"sim-over-http"));
}

/// `base_url_env` (e.g. `OPENAI_BASE_URL`), when set, replaces `base_url`:
/// one experiment file serves any server.
#[test]
fn base_url_env_points_the_backend_elsewhere() {
    let server = Server::scripted(vec![ok_json(completion(Some("hello"), json!([])))]);
    let var = "MASS_TEST_BASE_URL_ENV";
    std::env::set_var(var, &server.url);
    let mut p = params("http://127.0.0.1:9/v1");
    p.base_url_env = Some(var.into());
    let b = OpenAiBackend::new("srv", &p).unwrap();
    let r = complete(&b, &request()).unwrap();
    assert_eq!(r.message.content.as_deref(), Some("hello"));
    assert_eq!(server.seen().len(), 1);
    // Unset, the file's base_url is used (nobody listens there).
    p.base_url_env = Some("MASS_TEST_BASE_URL_ENV_UNSET".into());
    let b = OpenAiBackend::new("srv", &p).unwrap();
    assert!(complete(&b, &request()).is_err());
}

/// What the reasoning server of the next test thought before answering a
/// request of `n` messages.
fn thought_over(n: usize) -> String {
    format!("Thinking over {n} messages.")
}

/// The lines of a dataset blob, as JSON values.
fn lines_of(l: &ledger::Ledger, blob: schemas::Hash32) -> Vec<Value> {
    let bytes = l.get_blob(&ledger::Id(blob.0)).unwrap();
    String::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// A whole cycle against a server that returns `reasoning_content` beside
/// every reply, and the same cycle against one that returns none. The
/// requests are the same, byte for byte (reasoning is never sent back, and
/// keeping it changes nothing a server sees); the reasoning run's
/// conversations hold each turn's reasoning, its dataset lines carry it on
/// every assistant turn (the turn's own: the server said how many messages
/// it was answering) in the run's format and in the other, and, the
/// reasoning taken out, its lines are the other run's; it replays offline.
#[test]
fn a_cycle_against_a_reasoning_server_keeps_the_reasoning_and_sends_the_same_requests() {
    use engine::context::NoProgress;
    use engine::driver::{drive, RunRequest};
    use replay::Mode;

    let key_var = "MASS_TEST_KEY_REASONING";
    std::env::set_var(key_var, "sk-reasoning");
    let tasks = examples().join("tasks");
    let d = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    let mut ledgers = Vec::new();
    for think in [false, true] {
        let sim = SimBackend::new("sim", sim_params(), &tasks).unwrap();
        let never_down = AtomicBool::new(false);
        let server = Server::start(move |b| {
            let reply = sim_reply(&sim, b, &never_down);
            match reply {
                Reply::Http(200, headers, body) if think => {
                    let mut v: Value = serde_json::from_slice(&body).unwrap();
                    let n = b["messages"].as_array().map_or(0, Vec::len);
                    v["choices"][0]["message"]["reasoning_content"] = json!(thought_over(n));
                    Reply::Http(200, headers, v.to_string().into_bytes())
                }
                other => other,
            }
        });
        let l = Arc::new(ledger::Ledger::init(&d.path().join(format!("{think}"))).unwrap());
        drive(
            l.clone(),
            RunRequest {
                run: "smoke".into(),
                experiment: Some(smoke_over_http(&server.url, key_var, 8)),
                mode: Mode::Live,
                source: None,
                progress: &NoProgress,
            },
        )
        .unwrap();
        let mut bodies: Vec<String> = server.seen().iter().map(|s| s.body.to_string()).collect();
        bodies.sort();
        seen.push(bodies);
        ledgers.push(l);
    }
    assert_eq!(
        seen[0], seen[1],
        "a server returning reasoning saw other requests"
    );
    assert!(seen[1].iter().all(|b| !b.contains("Thinking over")));
    let (plain, thinking) = (&ledgers[0], &ledgers[1]);
    assert!(!ledger_contains(plain, b"reasoning_content"));
    // Every model call's conversation, as recorded, has each assistant
    // turn's reasoning: the reply's and the earlier turns' (message blobs).
    let mut calls = 0;
    for (_, h) in thinking.refs().unwrap() {
        for e in thinking.chain(h).map(|e| e.unwrap()) {
            if e.kind != "effect" {
                continue;
            }
            let eff: schemas::Effect = schemas::decode_event(&e).unwrap();
            if !engine::transcript::MODEL_KINDS.contains(&eff.effect.as_str())
                || eff.status != schemas::EffectStatus::Ok
            {
                continue;
            }
            let t = engine::transcript::model_call(thinking, e.id).unwrap();
            for (i, m) in t.messages.iter().enumerate() {
                let want = (m.role == engine::chat::Role::Assistant).then(|| thought_over(i));
                assert_eq!(m.reasoning, want);
            }
            calls += 1;
        }
    }
    assert!(calls > 20, "{calls} model calls");

    let (a, b) = (
        dataset(plain, "smoke").unwrap(),
        dataset(thinking, "smoke").unwrap(),
    );
    assert!(b.train_supervised_tokens > a.train_supervised_tokens);
    let mut turns = 0;
    for (blob_a, blob_b) in [(a.train, b.train), (a.validation, b.validation)] {
        let (lines_a, lines_b) = (lines_of(plain, blob_a), lines_of(thinking, blob_b));
        assert_eq!(lines_a.len(), lines_b.len());
        for (la, lb) in lines_a.iter().zip(&lines_b) {
            let mut stripped = lb.clone();
            for (i, m) in stripped["messages"]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .enumerate()
            {
                let said = m.as_object_mut().unwrap().remove("reasoning_content");
                if m["role"] == "assistant" {
                    assert_eq!(said, Some(json!(thought_over(i))), "{lb}");
                    turns += 1;
                } else {
                    assert_eq!(said, None);
                }
            }
            assert_eq!(&stripped, la);
            // The other format carries it too.
            let line = lb.to_string();
            let (parsed, other) = match b.format.as_str() {
                "trl" => {
                    let p = engine::dataset::parse_trl_line(&line).unwrap();
                    (p.clone(), engine::dataset::Format::OpenAi)
                }
                _ => {
                    let p = engine::dataset::parse_openai_line(&line).unwrap();
                    (p.clone(), engine::dataset::Format::Trl)
                }
            };
            let example = engine::dataset::Example {
                id: "x".into(),
                run: "r".into(),
                agent: engine::dataset::AgentKind::Subagent,
                messages: parsed.messages,
                tools: parsed.tools,
                split: engine::dataset::ExampleSplit::Train,
            };
            let v: Value =
                serde_json::from_str(&engine::dataset::to_line(&example, other).unwrap()).unwrap();
            let thoughts = v["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["reasoning_content"].is_string())
                .count();
            let assistants = v["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "assistant")
                .count();
            assert_eq!(thoughts, assistants);
        }
    }
    assert!(turns > 0, "no assistant turn in the dataset");

    // Offline, the recording serves every call: the same head.
    let head = thinking.head("smoke").unwrap();
    let c = drive(
        thinking.clone(),
        RunRequest {
            run: "smoke".into(),
            experiment: None,
            mode: Mode::Check,
            source: None,
            progress: &NoProgress,
        },
    )
    .unwrap();
    assert_eq!(c.head, head);
}
