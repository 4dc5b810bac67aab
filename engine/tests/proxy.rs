//! The recording proxy against hostile fakes: an upstream that answers
//! differently every time, chunks its streams at random, fails with 500s
//! and disappears; clients that interleave conversations and send
//! credentials. Each property holds for many seeds.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use ledger::Ledger;
use proxy::{Book, Normaliser, ProxyServer, Route, Upstream, WireLog};
use serde_json::{json, Value};

/// What the fake upstream does and saw.
#[derive(Default)]
struct Fake {
    /// Answer this many requests with HTTP 500 first.
    fail_next: AtomicU32,
    calls: AtomicU64,
    seed: u64,
    /// Authorization headers received.
    auth: Mutex<Vec<String>>,
    /// Response bodies sent, in order.
    sent: Mutex<Vec<Vec<u8>>>,
    /// Answer as a reasoning model: [`thought`] beside the content, as
    /// `reasoning_content` on even calls and vLLM's `reasoning` on odd ones.
    think: bool,
}

/// What a thinking fake thought before answering call `n`: wrapped in
/// newlines, as reasoning parsers often leave it.
fn thought(n: u64) -> String {
    format!("\nCall {n}: the user wants progress.\nI will answer briefly.\n")
}

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// An answer that is different on every call (a counter in it), so a
/// replay that went upstream would be caught.
fn answer(fake: &Fake, req: &Value) -> (Vec<u8>, Vec<usize>) {
    let n = fake.calls.fetch_add(1, Ordering::SeqCst);
    let mut r = rng(fake.seed ^ n.wrapping_mul(7919));
    let turns = req["messages"].as_array().map_or(0, Vec::len);
    let text = format!("reply {n} to {turns} messages: {}", r() % 100_000);
    let tool = r().is_multiple_of(2);
    let key = if n.is_multiple_of(2) {
        "reasoning_content"
    } else {
        "reasoning"
    };
    if req["stream"] == json!(true) {
        let mut events = vec![
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content": if tool { Value::Null } else { json!("") }}}]}),
        ];
        if fake.think {
            let t = thought(n);
            let (a, b) = t.split_at(t.len() / 2);
            for piece in [a, b] {
                events.push(json!({"choices":[{"index":0,"delta":{key: piece}}]}));
            }
        }
        if tool {
            let args = format!("{{\"path\":\"/ws/{n}.txt\",\"content\":\"{text}\"}}");
            let (a, b) = args.split_at(args.len() / 2);
            events.push(json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":format!("call_{n}"),"type":"function","function":{"name":"write_file","arguments":a}}]}}]}));
            events.push(json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":b}}]}}]}));
        } else {
            for w in text.split_inclusive(' ') {
                events.push(json!({"choices":[{"index":0,"delta":{"content":w}}]}));
            }
        }
        events.push(json!({"choices":[{"index":0,"delta":{},"finish_reason": if tool {"tool_calls"} else {"stop"}}]}));
        events
            .push(json!({"choices":[],"usage":{"prompt_tokens":turns * 10,"completion_tokens":7}}));
        let mut body = String::new();
        for e in events {
            body.push_str(&format!("data: {e}\n\n"));
        }
        body.push_str("data: [DONE]\n\n");
        // Cut at random places, not at event boundaries.
        let bytes = body.into_bytes();
        let mut chunks = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let n = (1 + r() as usize % 90).min(bytes.len() - at);
            chunks.push(n);
            at += n;
        }
        (bytes, chunks)
    } else {
        let mut message = if tool {
            json!({"role":"assistant","content":null,"tool_calls":[{"id":format!("call_{n}"),"type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a\"}"}}]})
        } else {
            json!({"role":"assistant","content":text})
        };
        if fake.think {
            message[key] = json!(thought(n));
        }
        let body = json!({"id":format!("x{n}"),"object":"chat.completion","choices":[{"index":0,"message":message,"finish_reason":"stop"}],"usage":{"prompt_tokens":turns,"completion_tokens":3}});
        let b = serde_json::to_vec(&body).unwrap();
        let len = b.len();
        (b, vec![len])
    }
}

type FakeBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn fake_handle(
    fake: Arc<Fake>,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<FakeBody> {
    if let Some(a) = req.headers().get("authorization") {
        fake.auth
            .lock()
            .unwrap()
            .push(a.to_str().unwrap_or("").to_string());
    }
    let body = req.into_body().collect().await.unwrap().to_bytes();
    if fake
        .fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
        .is_ok()
    {
        let b = Bytes::from_static(b"{\"error\":{\"message\":\"overloaded\"}}");
        fake.sent.lock().unwrap().push(b.to_vec());
        return hyper::Response::builder()
            .status(500)
            .header("content-type", "application/json")
            .body(Full::new(b).boxed())
            .unwrap();
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (bytes, chunks) = answer(&fake, &v);
    fake.sent.lock().unwrap().push(bytes.clone());
    if v["stream"] == json!(true) {
        let mut q = VecDeque::new();
        let mut at = 0;
        for n in chunks {
            q.push_back(Ok::<_, Infallible>(Frame::data(Bytes::copy_from_slice(
                &bytes[at..at + n],
            ))));
            at += n;
        }
        let stream = futures_stream(q);
        hyper::Response::builder()
            .header("content-type", "text/event-stream")
            .header("x-upstream", "fake")
            .body(BodyExt::boxed(StreamBody::new(stream)))
            .unwrap()
    } else {
        hyper::Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(bytes)).boxed())
            .unwrap()
    }
}

/// Frames delivered one per poll with a yield between them, so the
/// proxy really sees them as separate chunks.
fn futures_stream(
    q: VecDeque<Result<Frame<Bytes>, Infallible>>,
) -> impl futures_core::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + Sync {
    struct S(VecDeque<Result<Frame<Bytes>, Infallible>>, bool);
    impl futures_core::Stream for S {
        type Item = Result<Frame<Bytes>, Infallible>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            // Every other poll is Pending: chunks leave one at a time.
            self.1 = !self.1;
            if self.1 {
                cx.waker().wake_by_ref();
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(self.0.pop_front())
        }
    }
    S(q, false)
}

async fn start_fake(fake: Arc<Fake>) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let fake = fake.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let fake = fake.clone();
                    async move { Ok::<_, Infallible>(fake_handle(fake, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    (addr, task)
}

struct Sent {
    status: u16,
    body: Vec<u8>,
}

async fn post(client: &reqwest::Client, base: &str, body: &Value, key: &str) -> Sent {
    let mut r = client
        .post(format!("{base}/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("x-api-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let mut out = Vec::new();
    while let Some(c) = r.chunk().await.unwrap() {
        out.extend_from_slice(&c);
    }
    Sent { status, body: out }
}

/// One agent conversation of `turns` requests, as a client keeps it: it
/// sends the reply back in its own serialisation, then a tool result.
/// Returns each request and the bytes it got.
async fn converse(
    client: &reqwest::Client,
    base: &str,
    who: &str,
    turns: usize,
    date: &str,
    key: &str,
) -> Vec<(Value, Sent)> {
    let mut messages = vec![
        json!({"role":"system","content": format!("You are {who}. {}", "Rules. ".repeat(200))}),
        json!({"role":"user","content":[{"type":"text","text":format!("Today is {date}.")},{"type":"text","text":format!("Task for {who}.")}]}),
    ];
    let mut out = Vec::new();
    for t in 0..turns {
        let body = json!({"model":"m","messages":messages,"stream": t % 3 != 2,"stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"write_file","description":"w","parameters":{}}}]});
        let sent = post(client, base, &body, key).await;
        assert_eq!(sent.status, 200, "{}", String::from_utf8_lossy(&sent.body));
        let reply = proxy::wire::reply_of(&sent.body, body["stream"] == json!(true)).unwrap();
        let mut m = reply.message.clone();
        m.as_object_mut().unwrap().retain(|_, v| !v.is_null());
        let call = m["tool_calls"][0]["id"].as_str().map(str::to_string);
        messages.push(m);
        messages.push(match call {
            Some(id) => json!({"role":"tool","tool_call_id":id,"content":format!("ok {t}")}),
            None => json!({"role":"user","content":format!("go on {t}")}),
        });
        out.push((body, sent));
    }
    out
}

fn ledger_in(dir: &std::path::Path) -> Arc<Ledger> {
    Arc::new(Ledger::init(dir).unwrap())
}

async fn recording_proxy(
    ledger: &Arc<Ledger>,
    run: &str,
    upstream: SocketAddr,
) -> (ProxyServer, Arc<Route>, String) {
    let log = WireLog::open(ledger.clone(), run, "agent").unwrap();
    let route = Arc::new(Route::record(
        log,
        Upstream::new(&format!("http://{upstream}/v1")).unwrap(),
    ));
    let server = ProxyServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let base = server.set_default(route.clone());
    (server, route, base)
}

async fn replaying_proxy(
    ledger: &Arc<Ledger>,
    run: &str,
    normaliser: Normaliser,
) -> (ProxyServer, Arc<Route>, String) {
    let book = Book::open(ledger.clone(), run, "agent", normaliser).unwrap();
    let route = Arc::new(Route::replay(book, None, None));
    let server = ProxyServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let base = server.set_default(route.clone());
    (server, route, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_pass_through_byte_for_byte_and_replay_the_same_bytes_with_the_upstream_gone() {
    for seed in 1..=6u64 {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(dir.path());
        let fake = Arc::new(Fake {
            seed,
            ..Default::default()
        });
        let (up, up_task) = start_fake(fake.clone()).await;
        let (server, route, base) = recording_proxy(&ledger, "rec", up).await;
        let client = reqwest::Client::new();
        let got = converse(
            &client,
            &base,
            "orchestrator",
            6,
            "2026-12-01",
            "sk-SECRET-1",
        )
        .await;
        // Byte for byte: what the client got is what the upstream sent.
        let sent = fake.sent.lock().unwrap().clone();
        assert_eq!(got.len(), sent.len());
        for ((_, g), s) in got.iter().zip(&sent) {
            assert_eq!(&g.body, s, "seed {seed}");
        }
        let head = route.finish().await.unwrap().unwrap();
        drop(server);
        up_task.abort();

        // Linear space: each request after the first names only what it adds.
        let recorded = proxy::log::load(&ledger, "rec", "agent").unwrap();
        assert_eq!(recorded.len(), 6);
        assert!(recorded[0].prefix().is_none());
        for (i, r) in recorded.iter().enumerate().skip(1) {
            assert_eq!(r.prefix(), Some(recorded[i - 1].event), "seed {seed}");
            assert_eq!(
                r.new_messages().len(),
                2,
                "seed {seed}: reply + tool result"
            );
        }
        // Streamed replies were seen in pieces, as they came.
        for (r, (body, _)) in recorded.iter().zip(&got) {
            if let proxy::log::RecordedOutcome::Http { chunks, .. } = &r.reply {
                if body["stream"] == json!(true) {
                    assert!(chunks.len() > 1, "seed {seed}: {chunks:?}");
                }
            }
        }
        // The conversation reads back whole, ending in the last reply.
        let t = engine::transcript::model_call(&ledger, head).unwrap();
        assert_eq!(t.messages.len(), 2 + 2 * 5 + 1);
        assert_eq!(
            t.messages[1].content.as_deref(),
            Some("Today is 2026-12-01.\nTask for orchestrator.")
        );

        // Replay, the upstream gone: the same bytes, chunk for chunk.
        let calls_before = fake.calls.load(Ordering::SeqCst);
        let (_server, route, base) = replaying_proxy(&ledger, "rec", Normaliser::default()).await;
        for (body, g) in &got {
            let again = post(&client, &base, body, "sk-other").await;
            assert_eq!(again.status, 200);
            assert_eq!(again.body, g.body, "seed {seed}");
        }
        assert_eq!(route.progress(), Some((6, 6)));
        assert_eq!(fake.calls.load(Ordering::SeqCst), calls_before);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_conversations_replay_in_any_order_matched_by_content() {
    for seed in 1..=5u64 {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(dir.path());
        let fake = Arc::new(Fake {
            seed,
            ..Default::default()
        });
        let (up, _t) = start_fake(fake.clone()).await;
        let (_server, route, base) = recording_proxy(&ledger, "rec", up).await;
        let client = reqwest::Client::new();
        // Three agents at once, as background subagents run.
        let (a, b, c) = tokio::join!(
            converse(&client, &base, "orchestrator", 4, "d", "k"),
            converse(&client, &base, "sub-1", 3, "d", "k"),
            converse(&client, &base, "sub-2", 3, "d", "k"),
        );
        route.finish().await.unwrap();
        // Three conversations come apart again: each chain is one agent's.
        let recorded = proxy::log::load(&ledger, "rec", "agent").unwrap();
        assert_eq!(recorded.len(), 10);
        assert_eq!(recorded.iter().filter(|r| r.prefix().is_none()).count(), 3);
        // As an external harness's rollout splits them: the chain the first
        // request starts is the orchestrator's, whichever agent that was.
        let head = recorded.last().unwrap().event;
        let convs = engine::harness::external::conversations(&ledger, None, head).unwrap();
        assert_eq!(convs.calls, 10);
        assert_eq!(convs.subagents.len(), 2, "seed {seed}");
        let first_system = |id| {
            let t = engine::transcript::model_call(&ledger, id).unwrap();
            t.messages[0].content.clone().unwrap()
        };
        let first_agent = recorded[0].event;
        let orch = convs.orchestrator.unwrap();
        assert_eq!(first_system(orch), first_system(first_agent), "seed {seed}");
        let mut lengths: Vec<usize> = std::iter::once(orch)
            .chain(convs.subagents.iter().copied())
            .map(|id| {
                engine::transcript::model_call(&ledger, id)
                    .unwrap()
                    .messages
                    .len()
            })
            .collect();
        lengths.sort();
        // Two subagents of 3 turns and an orchestrator of 4: 2 + 2 per earlier turn + the reply.
        assert_eq!(lengths, vec![7, 7, 9], "seed {seed}");

        // Replayed in another order (reversed, one agent after another).
        let (_s, route, base) = replaying_proxy(&ledger, "rec", Normaliser::default()).await;
        for conv in [&c, &a, &b] {
            for (body, g) in conv {
                let again = post(&client, &base, body, "k").await;
                assert_eq!(again.body, g.body, "seed {seed}");
            }
        }
        assert_eq!(route.progress(), Some((10, 10)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_miss_fails_closed_naming_the_stream_the_position_and_the_difference() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(dir.path());
    let fake = Arc::new(Fake {
        seed: 3,
        ..Default::default()
    });
    let (up, up_task) = start_fake(fake.clone()).await;
    let (_server, route, base) = recording_proxy(&ledger, "rec", up).await;
    let client = reqwest::Client::new();
    let got = converse(
        &client,
        &base,
        "orchestrator",
        3,
        "Tuesday, December 1, 2026",
        "k",
    )
    .await;
    route.finish().await.unwrap();
    up_task.abort();

    // The same session a day later: the date in the prompt differs.
    let redate = |v: &Value| {
        serde_json::from_str::<Value>(&v.to_string().replace("December 1,", "December 2,")).unwrap()
    };
    let (_s, route, base) = replaying_proxy(&ledger, "rec", Normaliser::default()).await;
    let miss = post(&client, &base, &redate(&got[0].0), "k").await;
    assert_eq!(miss.status, 400);
    let err: Value = serde_json::from_slice(&miss.body).unwrap();
    assert_eq!(err["error"]["type"], "mass_replay_miss");
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(msg.contains("stream rec/agent"), "{msg}");
    assert!(msg.contains("request 1 "), "{msg}");
    assert!(msg.contains("$.messages[1].content"), "{msg}");
    assert!(
        msg.contains("December 1") && msg.contains("December 2"),
        "{msg}"
    );
    assert_eq!(route.misses().len(), 1);

    // With a rule for the date, the same requests are served.
    let cfg: proxy::NormaliseConfig = toml::from_str(
        r#"
        [[rules]]
        pattern = '(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), [A-Z][a-z]+ \d{1,2}, \d{4}'
        replace = "<DATE>"
        "#,
    )
    .unwrap();
    let (_s, route, base) = replaying_proxy(&ledger, "rec", Normaliser::new(&cfg).unwrap()).await;
    for (body, g) in &got {
        let body = serde_json::from_str::<Value>(
            &body
                .to_string()
                .replace("Tuesday, December 1", "Wednesday, December 2"),
        )
        .unwrap();
        assert_eq!(post(&client, &base, &body, "k").await.body, g.body);
    }
    // One request more than recorded: a miss that says the recording was used up.
    let extra = post(&client, &base, &got[2].0, "k").await;
    assert_eq!(extra.status, 400);
    assert!(String::from_utf8_lossy(&extra.body).contains("3 of 3 recorded exchanges served"));
    assert_eq!(route.progress(), Some((3, 3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_and_retries_are_recorded_and_replayed_in_order() {
    for seed in 1..=3u64 {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(dir.path());
        let fake = Arc::new(Fake {
            seed,
            ..Default::default()
        });
        fake.fail_next.store(2, Ordering::SeqCst);
        let (up, up_task) = start_fake(fake.clone()).await;
        let (_server, route, base) = recording_proxy(&ledger, "rec", up).await;
        let client = reqwest::Client::new();
        let body = json!({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true});
        let mut seen = Vec::new();
        for _ in 0..3 {
            let s = post(&client, &base, &body, "k").await;
            seen.push((s.status, s.body));
        }
        assert_eq!(
            seen.iter().map(|s| s.0).collect::<Vec<_>>(),
            vec![500, 500, 200]
        );
        route.finish().await.unwrap();
        up_task.abort();
        let recorded = proxy::log::load(&ledger, "rec", "agent").unwrap();
        assert_eq!(
            recorded.iter().map(|r| r.status).collect::<Vec<_>>(),
            vec![
                schemas::EffectStatus::Retriable,
                schemas::EffectStatus::Retriable,
                schemas::EffectStatus::Ok
            ]
        );
        let (_s, _route, base) = replaying_proxy(&ledger, "rec", Normaliser::default()).await;
        for (status, b) in &seen {
            let again = post(&client, &base, &body, "k").await;
            assert_eq!((again.status, &again.body), (*status, b), "seed {seed}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_a_502_recorded_and_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(dir.path());
    // A port nothing listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (_server, route, base) = recording_proxy(&ledger, "rec", dead).await;
    let client = reqwest::Client::new();
    let body = json!({"model":"m","messages":[{"role":"user","content":"hi"}]});
    let s = post(&client, &base, &body, "k").await;
    assert_eq!(s.status, 502);
    assert!(String::from_utf8_lossy(&s.body).contains("unreachable"));
    route.finish().await.unwrap();
    let (_s, _r, base) = replaying_proxy(&ledger, "rec", Normaliser::default()).await;
    let again = post(&client, &base, &body, "k").await;
    assert_eq!((again.status, again.body), (502, s.body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_reach_the_upstream_and_are_never_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(dir.path());
    let fake = Arc::new(Fake {
        seed: 9,
        ..Default::default()
    });
    let (up, _t) = start_fake(fake.clone()).await;
    let (_server, route, base) = recording_proxy(&ledger, "rec", up).await;
    let client = reqwest::Client::new();
    converse(&client, &base, "orchestrator", 3, "d", "sk-VERY-SECRET-42").await;
    route.finish().await.unwrap();
    assert_eq!(
        fake.auth.lock().unwrap().clone(),
        vec!["Bearer sk-VERY-SECRET-42".to_string(); 3]
    );
    // Every object and every object's metadata, decoded.
    let mut checked = 0;
    for (id, _) in ledger.locations().unwrap() {
        let (_, bytes) = ledger.raw_object(&id).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains("VERY-SECRET"),
            "object {}",
            id.short(12)
        );
        let meta = ledger.get_meta(&id).unwrap();
        assert!(!format!("{meta:?}").contains("VERY-SECRET"));
        checked += 1;
    }
    assert!(checked > 10);
    // And the raw segment files (zstd leaves short strings as they are).
    for f in walk(dir.path()) {
        let b = std::fs::read(&f).unwrap();
        assert!(
            !b.windows(11).any(|w| w == b"VERY-SECRET"),
            "{}",
            f.display()
        );
    }
}

fn walk(d: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_mode_answers_hits_from_the_recording_sends_misses_live_and_records_both() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(dir.path());
    let fake = Arc::new(Fake {
        seed: 4,
        ..Default::default()
    });
    let (up, _t) = start_fake(fake.clone()).await;
    let (_server, route, base) = recording_proxy(&ledger, "rec", up).await;
    let client = reqwest::Client::new();
    let got = converse(&client, &base, "orchestrator", 2, "d", "k").await;
    route.finish().await.unwrap();

    let book = Book::open(ledger.clone(), "rec", "agent", Normaliser::default()).unwrap();
    let into = WireLog::open(ledger.clone(), "mixed", "agent").unwrap();
    let upstream = Upstream::new(&format!("http://{up}/v1")).unwrap();
    let route = Arc::new(Route::replay(book, Some(upstream), Some(into)));
    let server = ProxyServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let base = server.set_default(route.clone());
    let calls = fake.calls.load(Ordering::SeqCst);
    for (body, g) in &got {
        assert_eq!(post(&client, &base, body, "k").await.body, g.body);
    }
    let fresh = json!({"model":"m","messages":[{"role":"user","content":"something new"}]});
    let live = post(&client, &base, &fresh, "k").await;
    assert_eq!(live.status, 200);
    assert_eq!(fake.calls.load(Ordering::SeqCst), calls + 1);
    route.finish().await.unwrap();
    // The new run holds the whole session and replays on its own.
    let (_s, route, base) = replaying_proxy(&ledger, "mixed", Normaliser::default()).await;
    for (body, g) in &got {
        assert_eq!(post(&client, &base, body, "k").await.body, g.body);
    }
    assert_eq!(post(&client, &base, &fresh, "k").await.body, live.body);
    assert_eq!(route.progress(), Some((3, 3)));
}

/// An upstream that sends its first event, then waits until the test says
/// the client has it: a proxy that held chunks back would never get the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chunk_reaches_the_client_before_the_upstream_sends_the_next() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    let g = gate.clone();
    tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        let g = g.clone();
        let svc = hyper::service::service_fn(move |_req| {
            let g = g.clone();
            async move {
                let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
                tokio::spawn(async move {
                    let first =
                        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
                    tx.send(Ok(Frame::data(Bytes::from(first)))).await.unwrap();
                    g.notified().await;
                    let rest = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
                    tx.send(Ok(Frame::data(Bytes::from(rest)))).await.unwrap();
                });
                let body = StreamBody::new(ReceiverStream(rx));
                Ok::<_, Infallible>(
                    hyper::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(body)
                        .unwrap(),
                )
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
            .await;
    });
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(dir.path());
    let (_server, route, base) = recording_proxy(&ledger, "rec", up).await;
    let client = reqwest::Client::new();
    let mut r = client
        .post(format!("{base}/chat/completions"))
        .json(&json!({"model":"m","messages":[],"stream":true}))
        .send()
        .await
        .unwrap();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), r.chunk())
        .await
        .expect("the first chunk was held back")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"a\""));
    gate.notify_one();
    let mut rest = Vec::new();
    while let Some(c) = r.chunk().await.unwrap() {
        rest.extend_from_slice(&c);
    }
    assert!(String::from_utf8_lossy(&rest).ends_with("[DONE]\n\n"));
    let head = route.finish().await.unwrap().unwrap();
    let t = engine::transcript::model_call(&ledger, head).unwrap();
    assert_eq!(t.messages.last().unwrap().content.as_deref(), Some("ab"));
}

struct ReceiverStream(tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);

impl futures_core::Stream for ReceiverStream {
    type Item = Result<Frame<Bytes>, Infallible>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// A harness run again after a crash records a second attempt on the same
/// stream; its first request extends the first attempt's (same messages).
/// The second attempt alone replays, and splits into its own conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_attempt_on_the_same_stream_replays_and_splits_on_its_own() {
    for seed in 1..=3u64 {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger_in(dir.path());
        let fake = Arc::new(Fake {
            seed,
            ..Default::default()
        });
        let (up, up_task) = start_fake(fake.clone()).await;
        let client = reqwest::Client::new();
        let (_s1, route, base) = recording_proxy(&ledger, "rec", up).await;
        converse(&client, &base, "orchestrator", 2, "d", "k").await;
        let first_attempt = route.finish().await.unwrap();
        let (_s2, route, base) = recording_proxy(&ledger, "rec", up).await;
        let second = converse(&client, &base, "orchestrator", 3, "d", "k").await;
        let last = route.finish().await.unwrap().unwrap();
        up_task.abort();

        let recorded = proxy::log::load(&ledger, "rec", "agent").unwrap();
        assert_eq!(recorded.len(), 5);
        assert_eq!(
            recorded[2].prefix(),
            Some(recorded[0].event),
            "seed {seed}: crosses attempts"
        );

        let book = Book::open_range(
            ledger.clone(),
            "agent",
            Normaliser::default(),
            first_attempt,
            last,
        )
        .unwrap();
        let route = Arc::new(Route::replay(book, None, None));
        let server = ProxyServer::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let base = server.set_default(route.clone());
        for (body, g) in &second {
            assert_eq!(
                post(&client, &base, body, "k").await.body,
                g.body,
                "seed {seed}"
            );
        }
        assert_eq!(route.progress(), Some((3, 3)));

        let convs = engine::harness::external::conversations(&ledger, first_attempt, last).unwrap();
        assert_eq!(
            (convs.calls, convs.orchestrator, convs.subagents.len()),
            (3, Some(last), 0)
        );
        let t = engine::transcript::model_call(&ledger, last).unwrap();
        assert_eq!(t.messages.len(), 7);
    }
}

/// An upstream whose connection breaks mid-body: the client gets what came
/// and then an error (never a clean end: the bug was a cut body reaching
/// the client as a whole reply), and the exchange is recorded as a
/// transient failure saying why, its partial body kept and served again on
/// replay, where it breaks off again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_off_mid_stream_is_recorded_as_a_transient_failure_with_its_cause() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    let partial = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half\"}}]}\n\n";
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 65536];
        let _ = sock.read(&mut buf).await.unwrap();
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 1000\r\n\r\n";
        sock.write_all(head.as_bytes()).await.unwrap();
        sock.write_all(partial.as_bytes()).await.unwrap();
        // The connection goes away 1000 - len bytes early.
    });
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(dir.path());
    let (_server, route, base) = recording_proxy(&ledger, "rec", up).await;
    let client = reqwest::Client::new();
    let body = json!({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true});
    let (got, broke) = post_until_error(&client, &base, &body).await;
    assert_eq!(got, partial.as_bytes());
    assert!(
        broke,
        "the client saw a clean end of a body the upstream cut"
    );
    route.finish().await.unwrap();
    let recorded = proxy::log::load(&ledger, "rec", "agent").unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].status, schemas::EffectStatus::Retriable);
    match &recorded[0].reply {
        proxy::log::RecordedOutcome::Http { status, cut, .. } => {
            assert_eq!(*status, 200);
            assert!(cut.as_deref().is_some_and(|c| !c.is_empty()), "{cut:?}");
        }
        other => panic!("{other:?}"),
    }
    let (_s, _r, base) = replaying_proxy(&ledger, "rec", Normaliser::default()).await;
    let (again, broke) = post_until_error(&client, &base, &body).await;
    assert_eq!(again, partial.as_bytes());
    assert!(broke, "the replay ended the cut body cleanly");
}

/// POSTs `body` and reads the reply until it ends or breaks: the bytes, and
/// whether it broke (an error instead of a clean end).
async fn post_until_error(client: &reqwest::Client, base: &str, body: &Value) -> (Vec<u8>, bool) {
    let mut r = client
        .post(format!("{base}/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    let mut out = Vec::new();
    loop {
        match r.chunk().await {
            Ok(Some(c)) => out.extend_from_slice(&c),
            Ok(None) => return (out, false),
            Err(_) => return (out, true),
        }
    }
}

/// The trainer's fixture of a conversation with reasoning
/// (`trainers/testdata/reasoning.jsonl`, read by trainers/test_lora_sft.py):
/// the TRL line this test exports. `MASS_BLESS=1` rewrites it.
fn reasoning_fixture() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../trainers/testdata/reasoning.jsonl")
}

/// A reasoning model behind the proxy, streamed and not, under both names
/// (`reasoning_content`, vLLM's `reasoning`); a client that, as chat
/// clients do, sends each reply back without its reasoning. The recorded
/// conversation has every assistant turn's reasoning (the last reply's from
/// its own record, the earlier ones put back from theirs), and so do the
/// dataset lines of both formats, which parse back to the same messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_streamed_or_not_is_kept_in_the_conversation_and_both_dataset_formats() {
    use engine::chat::Role;
    use engine::dataset::{self, AgentKind, Example, ExampleSplit};

    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(dir.path());
    let fake = Arc::new(Fake {
        // Replies: a tool call streamed, one not, text streamed, text not.
        seed: 13,
        think: true,
        ..Default::default()
    });
    let (up, _t) = start_fake(fake.clone()).await;
    let (_server, route, base) = recording_proxy(&ledger, "rec", up).await;
    let client = reqwest::Client::new();
    let tools = json!([{"type":"function","function":{"name":"write_file","description":"w","parameters":{}}},
                       {"type":"function","function":{"name":"read_file","description":"r","parameters":{}}}]);
    let mut messages = vec![
        json!({"role":"system","content":"You are brief."}),
        json!({"role":"user","content":"Make progress."}),
    ];
    let turns = 4;
    for t in 0..turns {
        let streamed = t % 2 == 0;
        let body = json!({"model":"m","messages":messages,"stream":streamed,"tools":tools});
        let sent = post(&client, &base, &body, "k").await;
        assert_eq!(sent.status, 200);
        let mut m = proxy::wire::reply_of(&sent.body, streamed).unwrap().message;
        let m_obj = m.as_object_mut().unwrap();
        m_obj.retain(|k, v| !v.is_null() && k != "reasoning_content" && k != "reasoning");
        let call = m["tool_calls"][0]["id"].as_str().map(str::to_string);
        messages.push(m);
        messages.push(match call {
            Some(id) => json!({"role":"tool","tool_call_id":id,"content":format!("ok {t}")}),
            None => json!({"role":"user","content":format!("go on {t}")}),
        });
    }
    let head = route.finish().await.unwrap().unwrap();
    let sent = fake.sent.lock().unwrap().clone();
    let both = |needle: &str| {
        sent.iter()
            .any(|b| String::from_utf8_lossy(b).contains(needle))
    };
    assert!(both("\"reasoning\"") && both("\"reasoning_content\""));

    let t = engine::transcript::model_call(&ledger, head).unwrap();
    let assistants: Vec<_> = t
        .messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .collect();
    assert_eq!(assistants.len(), turns);
    let calls: Vec<bool> = assistants
        .iter()
        .map(|m| !m.tool_calls.is_empty())
        .collect();
    assert_eq!(calls, [true, true, false, false]);
    for (n, m) in assistants.iter().enumerate() {
        assert_eq!(
            m.reasoning.as_deref(),
            Some(thought(n as u64).as_str()),
            "turn {n}"
        );
    }
    assert!(t
        .messages
        .iter()
        .all(|m| (m.role == Role::Assistant) == m.reasoning.is_some()));

    let example = Example {
        id: "rec#0".into(),
        run: "rec".into(),
        agent: AgentKind::Subagent,
        messages: t.messages.clone(),
        tools: t.tools.clone(),
        split: ExampleSplit::Train,
    };
    let openai = dataset::to_openai_line(&example).unwrap();
    let trl = dataset::to_trl_line(&example).unwrap();
    for (line, parsed) in [
        (&openai, dataset::parse_openai_line(&openai).unwrap()),
        (&trl, dataset::parse_trl_line(&trl).unwrap()),
    ] {
        let v: Value = serde_json::from_str(line).unwrap();
        let thoughts: Vec<&str> = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["reasoning_content"].as_str())
            .collect();
        let want: Vec<String> = (0..turns as u64).map(thought).collect();
        assert_eq!(thoughts, want);
        let back: Vec<_> = parsed.messages.iter().map(|m| &m.reasoning).collect();
        let orig: Vec<_> = t.messages.iter().map(|m| &m.reasoning).collect();
        assert_eq!(back, orig);
    }
    let fixture = reasoning_fixture();
    if std::env::var_os("MASS_BLESS").is_some() {
        std::fs::write(&fixture, format!("{trl}\n")).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&fixture).unwrap(),
        format!("{trl}\n"),
        "{} is not this export (MASS_BLESS=1 rewrites it)",
        fixture.display()
    );
}
