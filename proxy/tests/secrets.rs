//! Credentials through the recording proxy, tried as an attacker would:
//! random secrets planted in the query string, the upstream URL's userinfo,
//! body fields, the upstream's key and a route's token, against an upstream
//! that echoes everything it receives; then every object and every
//! metadata entry of the ledger, and every reply body, searched for each
//! secret as written, hex, base64 and JSON-escaped. And route tokens: two
//! routes side by side, neither reachable with the other's token; a route
//! on a unix socket.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ledger::Ledger;
use proxy::scrub::base64;
use proxy::{Book, Normaliser, ProxyServer, Route, Secret, Upstream, WireLog};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A random secret: `prefix` and 24 random characters.
fn secret(prefix: &str) -> String {
    let mut b = [0u8; 24];
    let f = std::fs::File::open("/dev/urandom").unwrap();
    std::io::Read::read_exact(&mut &f, &mut b).unwrap();
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let tail: String = b.iter().map(|x| A[*x as usize % A.len()] as char).collect();
    format!("{prefix}{tail}")
}

/// A secret as written, hex (both cases), base64 and JSON-escaped.
fn forms(s: &str) -> Vec<Vec<u8>> {
    let mut v = vec![
        s.as_bytes().to_vec(),
        hex::encode(s).into_bytes(),
        hex::encode_upper(s).into_bytes(),
        base64(s.as_bytes()).into_bytes(),
    ];
    let j = serde_json::to_string(s).unwrap();
    v.push(j.as_bytes()[1..j.len() - 1].to_vec());
    v
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Where any form of any secret occurs in `hay`.
fn hits(what: &str, hay: &[u8], secrets: &[(&str, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (name, s) in secrets {
        for f in forms(s) {
            if contains(hay, &f) {
                out.push(format!("{name} in {what}"));
            }
        }
    }
    out
}

/// Every object of the ledger decompressed, and every object's metadata.
fn scan_ledger(l: &Ledger, secrets: &[(&str, String)]) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    l.for_each_location(|id, _| ids.push(id)).unwrap();
    let mut out = Vec::new();
    for id in &ids {
        let (_, bytes) = l.raw_object(id).unwrap();
        out.extend(hits(&format!("object {}", id.short(12)), &bytes, secrets));
        let meta = l.get_meta(id).unwrap();
        out.extend(hits(
            &format!("metadata of {}", id.short(12)),
            format!("{meta:?}").as_bytes(),
            secrets,
        ));
    }
    (out, ids.len())
}

/// What the echoing upstream received.
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<(String, Vec<u8>)>>,
}

async fn read_request(sock: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    Some((head, buf[head_end..head_end + len].to_vec()))
}

/// An upstream that answers every request with all of it: the request line
/// and headers (credentials included) and the body, as the reply's content
/// (streamed if asked) and in a response header.
async fn echo_upstream(seen: Arc<Seen>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Some((head, body)) = read_request(&mut sock).await {
                    seen.requests
                        .lock()
                        .unwrap()
                        .push((head.clone(), body.clone()));
                    let echo = format!("{head}{}", String::from_utf8_lossy(&body));
                    let auth = head
                        .lines()
                        .filter(|l| l.to_ascii_lowercase().starts_with("authorization:"))
                        .collect::<Vec<_>>()
                        .join(" | ");
                    let streamed = serde_json::from_slice::<Value>(&body)
                        .is_ok_and(|v| v["stream"] == json!(true));
                    let (ct, b) = if streamed {
                        let e1 = json!({"choices":[{"index":0,"delta":{"content":echo}}]});
                        let e2 = json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]});
                        (
                            "text/event-stream",
                            format!("data: {e1}\n\ndata: {e2}\n\ndata: [DONE]\n\n"),
                        )
                    } else {
                        let v = json!({"choices":[{"index":0,"message":{"role":"assistant","content":echo},"finish_reason":"stop"}],"data":[{"id":"m"}]});
                        ("application/json", v.to_string())
                    };
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: {ct}\r\nx-echo-auth: {}\r\ncontent-length: {}\r\n\r\n{b}",
                        auth.replace(['\r', '\n'], " "),
                        b.len()
                    );
                    if sock.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

struct Reply {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

async fn call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    auth: Option<(&str, &str)>,
    body: Option<&Value>,
) -> Reply {
    let mut rb = client.request(method, url);
    if let Some((k, v)) = auth {
        rb = rb.header(k, v);
    }
    if let Some(b) = body {
        rb = rb.json(b);
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = format!("{:?}", r.headers());
    let body = r.bytes().await.unwrap().to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

/// The planted secrets and the requests that carry them.
struct Plant {
    pass: String,
    key: String,
    token: String,
    query: String,
    field: String,
    nested: String,
}

impl Plant {
    fn new() -> Plant {
        Plant {
            pass: secret("pw-"),
            key: secret("sk-upstream-"),
            token: secret("tok-"),
            query: secret("qk-"),
            field: secret("fk-"),
            nested: secret("nk-"),
        }
    }

    fn all(&self) -> Vec<(&'static str, String)> {
        vec![
            ("the URL password", self.pass.clone()),
            ("the upstream key", self.key.clone()),
            ("the route token", self.token.clone()),
            ("the query key", self.query.clone()),
            ("the body field key", self.field.clone()),
            ("the nested body key", self.nested.clone()),
            (
                "the Basic credential",
                base64(format!("bob:{}", self.pass).as_bytes()),
            ),
        ]
    }

    /// A chat request whose message mentions the body's key and `token`
    /// (an agent that printed its environment).
    fn chat(&self, stream: bool, turn: &str, token: &str) -> Value {
        json!({
            "model": "m",
            "messages": [{"role": "user", "content": format!("{turn}: my key is {} and the token {token}", self.field)}],
            "stream": stream,
            "api_key": self.field,
            "metadata": {"auth": {"client_secret": self.nested}, "note": "kept"},
        })
    }

    fn path(&self) -> String {
        format!(
            "/chat/completions?key={}&api-version=2024-01-01",
            self.query
        )
    }
}

/// One attacker's session against the proxy: the planted secrets, the
/// echoing upstream, the ledger, and every reply the proxy made itself.
struct Session {
    p: Plant,
    seen: Arc<Seen>,
    up: std::net::SocketAddr,
    ledger: Arc<Ledger>,
    _dir: tempfile::TempDir,
    client: reqwest::Client,
    /// Replies the proxy made from the recording or by itself.
    replies: Vec<(String, Reply)>,
}

impl Session {
    async fn new() -> Session {
        let seen = Arc::new(Seen::default());
        let up = echo_upstream(seen.clone()).await;
        let dir = tempfile::tempdir().unwrap();
        Session {
            p: Plant::new(),
            seen,
            up,
            ledger: Arc::new(Ledger::init(dir.path()).unwrap()),
            _dir: dir,
            client: reqwest::Client::new(),
            replies: Vec::new(),
        }
    }

    /// The echoing upstream, through its URL's userinfo and with mass's key.
    fn upstream(&self) -> Upstream {
        Upstream::new(&format!("http://bob:{}@{}/v1", self.p.pass, self.up))
            .unwrap()
            .with_api_key(Secret::new(self.p.key.clone()))
    }

    async fn serve(route: &Arc<Route>) -> (ProxyServer, String) {
        let server = ProxyServer::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let base = server.set_default(route.clone());
        (server, base)
    }

    /// POSTs a chat request (mentioning `token`) with `token` as bearer.
    async fn chat(&self, base: &str, stream: bool, turn: &str, token: &str) -> Reply {
        let bearer = format!("Bearer {token}");
        let url = format!("{base}{}", self.p.path());
        let body = self.p.chat(stream, turn, token);
        let auth = Some(("authorization", bearer.as_str()));
        call(&self.client, reqwest::Method::POST, &url, auth, Some(&body)).await
    }

    /// Records two chat requests and a models list through a route with a
    /// token; what the client never had does not reach it via the echo.
    async fn record(&mut self) {
        let log = WireLog::open(self.ledger.clone(), "rec", "agent").unwrap();
        let token = Secret::new(self.p.token.clone());
        let route = Arc::new(Route::record(log, self.upstream()).require_token(token));
        let (server, base) = Session::serve(&route).await;
        for (i, stream) in [false, true].into_iter().enumerate() {
            let r = self
                .chat(&base, stream, &i.to_string(), &self.p.token)
                .await;
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            for (name, s) in [("key", &self.p.key), ("password", &self.p.pass)] {
                assert!(
                    !contains(&r.body, s.as_bytes()) && !r.headers.contains(s.as_str()),
                    "the upstream's {name} reached the client"
                );
            }
        }
        let bearer = format!("Bearer {}", self.p.token);
        let url = format!("{base}/models?api_key={}", self.p.query);
        let auth = Some(("authorization", bearer.as_str()));
        let models = call(&self.client, reqwest::Method::GET, &url, auth, None).await;
        assert_eq!(models.status, 200);
        drop(server);
        route.finish().await.unwrap();
    }

    /// The upstream got what it needs: the client's query and body as
    /// sent, the real key as its only credential, never the route's token.
    fn check_upstream(&self) {
        let got = self.seen.requests.lock().unwrap().clone();
        assert_eq!(got.len(), 3);
        for (head, _) in &got {
            let auths: Vec<&str> = head
                .lines()
                .filter(|l| l.to_ascii_lowercase().starts_with("authorization:"))
                .collect();
            let want = format!("authorization: Bearer {}", self.p.key);
            assert_eq!(auths, vec![want], "{head}");
            assert!(head.contains(&self.p.query), "{head}");
            // Not as a header (the client's own message mentions it: that
            // is the conversation, sent as written).
            assert!(!head.contains(&self.p.token), "{head}");
        }
        let body = &got[0].1;
        assert!(
            contains(body, self.p.field.as_bytes()) && contains(body, self.p.nested.as_bytes())
        );
    }

    /// Replays (mixed mode) with another token: the same requests match
    /// (scrubbed alike); a new one goes live and is recorded.
    async fn replay_mixed(&mut self, other_token: &str) {
        let book = Book::open(self.ledger.clone(), "rec", "agent", Normaliser::default()).unwrap();
        let into = WireLog::open(self.ledger.clone(), "mixed", "agent").unwrap();
        let route = Arc::new(
            Route::replay(book, Some(self.upstream()), Some(into))
                .require_token(Secret::new(other_token)),
        );
        let (server, base) = Session::serve(&route).await;
        for (i, stream) in [false, true].into_iter().enumerate() {
            let r = self.chat(&base, stream, &i.to_string(), other_token).await;
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            self.replies.push((format!("replayed reply {i}"), r));
        }
        assert_eq!(route.progress(), Some((2, 3)));
        let fresh = self.chat(&base, false, "new", other_token).await;
        assert_eq!(fresh.status, 200);
        drop(server);
        route.finish().await.unwrap();
    }

    /// A pure replay's miss; the report.
    async fn miss(&mut self) -> String {
        let book = Book::open(self.ledger.clone(), "rec", "agent", Normaliser::default()).unwrap();
        let route = Arc::new(Route::replay(book, None, None));
        let (server, base) = Session::serve(&route).await;
        let miss = self.chat(&base, false, "changed", &self.p.token).await;
        assert_eq!(miss.status, 400);
        let text = String::from_utf8_lossy(&miss.body).to_string();
        assert!(text.contains("REDACTED"), "{text}");
        self.replies.push(("the miss".into(), miss));
        drop(server);
        route.misses().join("\n")
    }

    /// A 502 from an upstream that is down, its URL with a password and a
    /// key in its query.
    async fn down(&mut self) {
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let url = format!("http://bob:{}@{dead}/v1?key={}", self.p.pass, self.p.query);
        let log = WireLog::open(self.ledger.clone(), "down", "agent").unwrap();
        let route = Arc::new(Route::record(log, Upstream::new(&url).unwrap()));
        let (server, base) = Session::serve(&route).await;
        let bad = self.chat(&base, false, "0", &self.p.token).await;
        let text = String::from_utf8_lossy(&bad.body).to_string();
        assert_eq!(bad.status, 502, "{text}");
        assert!(text.contains(&dead.to_string()), "{text}");
        self.replies.push(("the 502".into(), bad));
        drop(server);
        route.finish().await.unwrap();
    }
}

/// The bugs: a key in the query string, the upstream URL's password and
/// key-like body fields were recorded (3 places each), echoed in 502s and
/// miss reports; an upstream that echoes credentials put them in the
/// recorded response. With the upstream's own key and a route token in play
/// too, none of them is in any object or metadata of the ledger, whatever
/// the upstream echoes, nor in any reply the proxy makes; the upstream
/// still gets what it needs (the client's query and body as sent, the real
/// key, never the token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_echoes_every_credential_gets_none_of_them_recorded() {
    let mut s = Session::new().await;
    s.record().await;
    s.check_upstream();
    let other_token = secret("tok2-");
    s.replay_mixed(&other_token).await;
    let report = s.miss().await;
    s.down().await;
    let mut all = s.p.all();
    all.push(("the replay's token", other_token));
    for (what, r) in &s.replies {
        let h = hits(what, &r.body, &all);
        assert!(h.is_empty(), "{h:?}");
    }
    let h = hits("the miss report", report.as_bytes(), &all);
    assert!(h.is_empty(), "{h:?}");
    let (h, n) = scan_ledger(&s.ledger, &all);
    assert!(h.is_empty(), "{h:?}");
    assert!(n > 20, "{n} objects");
    // Control: the search finds what the ledger does hold.
    let kept = [
        ("the kept note", "kept".into()),
        ("the echo", "api-version=2024-01-01".into()),
    ];
    let (c, _) = scan_ledger(&s.ledger, &kept);
    assert!(c.len() >= 2, "{c:?}");
}

/// A raw request with a bearer token (or none) to a route of `base`.
async fn to_route(
    client: &reqwest::Client,
    base: &str,
    header: Option<(&str, String)>,
    n: u32,
) -> u16 {
    let mut rb = client
        .post(format!("{base}/chat/completions"))
        .json(&json!({
            "model": "m", "messages": [{"role": "user", "content": format!("request {n}")}]
        }));
    if let Some((k, v)) = header {
        rb = rb.header(k, v);
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    let body = r.bytes().await.unwrap();
    if status == 401 {
        let e: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(e["error"]["code"], "invalid_api_key", "{e}");
        assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    }
    status
}

/// The bug: any local process could write into another rollout's recorded
/// conversation through its proxy route. Two routes side by side, each with
/// its token: without a token, or with the other route's, a request is
/// refused (401, OpenAI's shape), forwarded nowhere and recorded nowhere;
/// with its own (as `Authorization: Bearer`, `api-key` or `x-api-key`) it
/// passes. The upstream sees the real key, never a token; the ledger holds
/// neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_token_keeps_other_clients_out_and_never_reaches_the_upstream_or_the_ledger() {
    let seen = Arc::new(Seen::default());
    let up = echo_upstream(seen.clone()).await;
    let key = secret("sk-real-");
    let (ta, tb) = (secret("tok-a-"), secret("tok-b-"));
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(Ledger::init(dir.path()).unwrap());
    let route = |stream: &str, token: &str| {
        let log = WireLog::open(ledger.clone(), "run", stream).unwrap();
        let u = Upstream::new(&format!("http://{up}/v1"))
            .unwrap()
            .with_api_key(Secret::new(key.clone()));
        Arc::new(Route::record(log, u).require_token(Secret::new(token)))
    };
    let (ra, rb) = (route("a/wire", &ta), route("b/wire", &tb));
    let server = ProxyServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (base_a, base_b) = (server.add("a", ra.clone()), server.add("b", rb.clone()));
    let c = reqwest::Client::new();
    let bearer = |t: &str| Some(("authorization", format!("Bearer {t}")));
    // Refused: none, the other's, a prefix of its own, its own with junk.
    assert_eq!(to_route(&c, &base_a, None, 0).await, 401);
    assert_eq!(to_route(&c, &base_a, bearer(&tb), 1).await, 401);
    assert_eq!(to_route(&c, &base_b, bearer(&ta), 2).await, 401);
    assert_eq!(
        to_route(&c, &base_b, Some(("x-api-key", ta.clone())), 3).await,
        401
    );
    assert_eq!(
        to_route(&c, &base_a, bearer(&ta[..ta.len() - 1]), 4).await,
        401
    );
    assert_eq!(
        to_route(&c, &base_a, bearer(&format!("{ta}x")), 5).await,
        401
    );
    assert_eq!(
        to_route(&c, &base_a, Some(("authorization", ta.clone())), 6).await,
        401
    );
    assert!(
        seen.requests.lock().unwrap().is_empty(),
        "a refused request was forwarded"
    );
    // Passed: each with its own, in each header clients use.
    assert_eq!(to_route(&c, &base_a, bearer(&ta), 7).await, 200);
    assert_eq!(
        to_route(&c, &base_b, Some(("api-key", tb.clone())), 8).await,
        200
    );
    assert_eq!(
        to_route(&c, &base_b, Some(("x-api-key", tb.clone())), 9).await,
        200
    );
    drop(server);
    ra.finish().await.unwrap();
    rb.finish().await.unwrap();
    let in_stream = |s: &str| -> Vec<String> {
        proxy::log::load(&ledger, "run", s)
            .unwrap()
            .iter()
            .map(|r| {
                let m = r.new_messages()[0];
                let v: Value = serde_json::from_slice(&ledger.get_blob(&m).unwrap()).unwrap();
                v["content"].as_str().unwrap().to_string()
            })
            .collect()
    };
    assert_eq!(in_stream("a/wire"), vec!["request 7"]);
    assert_eq!(in_stream("b/wire"), vec!["request 8", "request 9"]);
    for (head, body) in seen.requests.lock().unwrap().iter() {
        assert!(
            head.contains(&format!("authorization: Bearer {key}")),
            "{head}"
        );
        for t in [&ta, &tb] {
            assert!(
                !head.contains(t.as_str()) && !contains(body, t.as_bytes()),
                "a token reached the upstream: {head}"
            );
        }
    }
    let secrets = [
        ("the key", key.clone()),
        ("token a", ta.clone()),
        ("token b", tb.clone()),
    ];
    let (h, _) = scan_ledger(&ledger, &secrets);
    assert!(h.is_empty(), "{h:?}");
}

/// A request to no route gets 404 naming the path, its key redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_no_route_is_not_echoed_with_its_key() {
    let server = ProxyServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let qk = secret("qk-");
    let url = format!("http://{}/s/zzz/v1/models?key={qk}", server.addr().unwrap());
    let r = reqwest::Client::new().get(url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let body = r.bytes().await.unwrap();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("/s/zzz/v1/models?key=REDACTED"), "{text}");
    assert!(!contains(&body, qk.as_bytes()), "{text}");
}

/// The proxy on a unix socket (what a forwarder inside a rollout's network
/// namespace relays to): the same routes over HTTP/1, the socket only its
/// owner's, removed with the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_serves_its_routes_on_a_unix_socket() {
    use std::os::unix::fs::PermissionsExt;
    let seen = Arc::new(Seen::default());
    let up = echo_upstream(seen.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(Ledger::init(&dir.path().join("ledger")).unwrap());
    let token = secret("tok-");
    let log = WireLog::open(ledger.clone(), "run", "r1/wire").unwrap();
    let route = Arc::new(
        Route::record(log, Upstream::new(&format!("http://{up}/v1")).unwrap())
            .require_token(Secret::new(token.clone())),
    );
    let sock = dir.path().join("proxy.sock");
    let server = ProxyServer::bind_unix(&sock).await.unwrap();
    assert!(server.addr().is_none());
    assert_eq!(server.unix_path(), Some(sock.as_path()));
    let base = server.add("r1", route.clone());
    assert_eq!(base, "http://localhost/s/r1/v1");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let body =
        json!({"model":"m","messages":[{"role":"user","content":"over a socket"}]}).to_string();
    let raw = |auth: &str| {
        format!(
            "POST /s/r1/v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let exchange = |req: String| {
        let sock = sock.clone();
        async move {
            let mut s = tokio::net::UnixStream::connect(&sock).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
                .await
                .unwrap()
                .unwrap();
            String::from_utf8_lossy(&out).to_string()
        }
    };
    let refused = exchange(raw("")).await;
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    let ok = exchange(raw(&format!("authorization: Bearer {token}\r\n"))).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("over a socket"), "{ok}");
    drop(server);
    assert!(!sock.exists(), "the socket outlived its server");
    route.finish().await.unwrap();
    assert_eq!(
        proxy::log::load(&ledger, "run", "r1/wire").unwrap().len(),
        1
    );
    let (h, _) = scan_ledger(&ledger, &[("the token", token)]);
    assert!(h.is_empty(), "{h:?}");
}

/// An upstream that streams back the bearer key it was sent, split across
/// two chunks of a chunked body (sent apart, so the proxy reads them as two):
/// request n splits the key after byte n.
async fn splitting_upstream() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let n = n.clone();
            tokio::spawn(async move {
                while let Some((head, _)) = read_request(&mut sock).await {
                    let key = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("authorization")
                                .then(|| v.trim().trim_start_matches("Bearer ").to_string())
                        })
                        .unwrap_or_default();
                    let at = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % key.len().max(1);
                    let (a, b) = key.split_at(at);
                    let first = format!(
                        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"your key {a}"
                    );
                    let second = format!("{b}\"}}}}]}}\n\ndata: [DONE]\n\n");
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                    let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
                    let parts = [
                        format!("{head}{}", chunk(&first)),
                        format!("{}0\r\n\r\n", chunk(&second)),
                    ];
                    for p in parts {
                        if sock.write_all(p.as_bytes()).await.is_err() {
                            return;
                        }
                        let _ = sock.flush().await;
                        tokio::time::sleep(Duration::from_millis(15)).await;
                    }
                }
            });
        }
    });
    addr
}

/// Regression (#24 review): the proxy masked the upstream's key in each
/// chunk alone, so an upstream that echoed it across a chunk boundary
/// handed the agent the key. Every split position of the key: the client
/// never sees it, and the ledger never holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_echoed_across_a_chunk_boundary_never_reaches_the_client() {
    let up = splitting_upstream().await;
    let key = secret("sk-split-");
    let token = secret("tok-");
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(Ledger::init(dir.path()).unwrap());
    let log = WireLog::open(ledger.clone(), "rec", "agent").unwrap();
    let upstream = Upstream::new(&format!("http://{up}/v1"))
        .unwrap()
        .with_api_key(Secret::new(key.clone()));
    let route = Arc::new(Route::record(log, upstream).require_token(Secret::new(token.clone())));
    let server = ProxyServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let base = server.set_default(route.clone());
    let client = reqwest::Client::new();
    let secrets = [("the upstream key", key.clone())];
    for i in 0..key.len() {
        let body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": format!("turn {i}")}]});
        let bearer = format!("Bearer {token}");
        let r = call(
            &client,
            reqwest::Method::POST,
            &format!("{base}/chat/completions"),
            Some(("authorization", bearer.as_str())),
            Some(&body),
        )
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let h = hits(&format!("reply {i}"), &r.body, &secrets);
        assert!(h.is_empty(), "split after byte {i}: {h:?}");
        // The rest of the reply passes unchanged (the mask holds back only
        // what could start the key).
        let text = String::from_utf8_lossy(&r.body);
        assert!(
            text.ends_with("data: [DONE]\n\n") && text.contains("your key "),
            "{text}"
        );
    }
    route.finish().await.unwrap();
    drop(server);
    let (h, n) = scan_ledger(&ledger, &secrets);
    assert!(h.is_empty(), "{h:?}");
    assert!(n > 10, "{n} objects");
}

/// A chat request to `path` answered with the JSON `reply`, to record.
fn chat_exchange(path: &str, body: &str, reply: &str) -> proxy::log::Exchange {
    use proxy::log::{Exchange, HttpReply, Outcome, Timing};
    Exchange {
        method: "POST".into(),
        path: path.into(),
        body: body.as_bytes().to_vec(),
        user_agent: None,
        outcome: Outcome::Http(HttpReply {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: reply.as_bytes().to_vec(),
            chunks: vec![reply.len()],
            cut: None,
        }),
        timing: Timing::default(),
        served_by: "http://upstream.test".into(),
    }
}

/// Records `ex` knowing `known`, through the recorder's fast path and with
/// it switched off, each into a fresh ledger; panics if any form of any of
/// `secrets` is in either ledger.
fn assert_recorded_without(
    ex: &proxy::log::Exchange,
    known: &proxy::scrub::Needles,
    secrets: &[(&str, String)],
) {
    for unremembered in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let l = Arc::new(Ledger::init(d.path()).unwrap());
        let mut w = WireLog::open(l.clone(), "r", "s").unwrap();
        w.unremembered = unremembered;
        w.record_with(ex, known).unwrap();
        let (found, objects) = scan_ledger(&l, secrets);
        assert!(objects > 3, "nothing recorded");
        assert!(found.is_empty(), "unremembered {unremembered}: {found:?}");
    }
}

/// The bug (found by review): the recorder searched a request for its
/// known secrets in the body's bytes only, so a secret spelt with JSON
/// escapes (`\u0073k-...`, or `\/` for a slash) was not found there,
/// and the message blobs, which hold the decoded text, held the secret
/// whole; so did the reassembled reply of an upstream that echoed it so.
/// Now decoded strings are searched, on both of the recorder's paths.
#[test]
fn regression_a_known_secret_spelt_with_json_escapes_never_reaches_the_ledger() {
    let a = secret("sk-");
    let b = format!("{}/{}", secret("sk-"), secret(""));
    let escaped_a = format!("\\u0073{}", &a[1..]);
    let escaped_b = b.replace('/', "\\/");
    let body = format!(
        r#"{{"model":"m","user":"{escaped_a}","messages":[{{"role":"system","content":"key {escaped_a}"}},{{"role":"user","content":"path {escaped_b}"}}]}}"#
    );
    let reply = format!(
        r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","content":"it is {escaped_a} and {escaped_b}"}},"finish_reason":"stop"}}]}}"#
    );
    let mut known = proxy::scrub::Needles::new();
    known.add(a.as_bytes());
    known.add(b.as_bytes());
    let ex = chat_exchange("/v1/chat/completions", &body, &reply);
    assert_recorded_without(&ex, &known, &[("a", a.clone()), ("b", b.clone())]);
}

/// The bug (found by review): only query values under key-like names were
/// redacted in the recorded path, so a known secret under any other name
/// (`?q=sk-...`) was recorded as sent. Known secrets are now masked
/// anywhere in the path, on both of the recorder's paths.
#[test]
fn regression_a_known_secret_under_any_query_name_is_masked_in_the_path() {
    let a = secret("sk-");
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let reply = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;
    let mut known = proxy::scrub::Needles::new();
    known.add(a.as_bytes());
    let ex = chat_exchange(&format!("/v1/chat/completions?q={a}&x=1"), body, reply);
    assert_recorded_without(&ex, &known, &[("a", a.clone())]);
}

/// A known secret used as an object key, in a request (outside the
/// conversation and inside a message's content part) and in a reply
/// message, was recorded whole in the decoded blobs: the scrubber masked
/// string values only. Keys are masked too now, and two keys that mask
/// alike stay two entries (nothing recorded is dropped to hide a secret).
#[test]
fn regression_a_known_secret_used_as_an_object_key_never_reaches_the_ledger() {
    let a = secret("sk-");
    let b = secret("sk-");
    let body = format!(
        r#"{{"model":"m","metadata":{{"{a}":1,"{b}":2,"REDACTED":3}},"messages":[{{"role":"user","content":[{{"type":"text","text":"hi","{a}":"x"}}]}}]}}"#
    );
    let reply = format!(
        r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","content":"ok","{a}":true}},"finish_reason":"stop"}}]}}"#
    );
    let mut known = proxy::scrub::Needles::new();
    known.add(a.as_bytes());
    known.add(b.as_bytes());
    let ex = chat_exchange("/v1/chat/completions", &body, &reply);
    assert_recorded_without(&ex, &known, &[("a", a.clone()), ("b", b.clone())]);
    // Masked, not dropped: the three keys of `metadata` stay three.
    let mut v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(known.value(&mut v));
    let m = v["metadata"].as_object().unwrap();
    assert_eq!(m.len(), 3, "{m:?}");
    let mut values: Vec<i64> = m.values().map(|x| x.as_i64().unwrap()).collect();
    values.sort();
    assert_eq!(values, [1, 2, 3]);
}

/// JSON held inside a string (a tool call's arguments) was searched as
/// the string's text, so a known secret spelt there with escapes
/// (`\u0073k-...`, `\/`) stayed in the message blobs, one parse away from
/// the secret. The escapes that can spell a plain character are read as
/// that character before the search, on both of the recorder's paths; the
/// tail after the escaped first character is searched for, so the
/// escaped spelling cannot pass unseen.
#[test]
fn regression_a_secret_spelt_with_escapes_inside_tool_call_arguments_never_reaches_the_ledger() {
    let a = secret("sk-");
    let b = format!("{}/{}", secret("sk-"), secret(""));
    // The arguments' JSON text, as a string of the body: `\\u0073` there
    // is `\u0073` in the decoded arguments.
    let escaped_a = format!("\\\\u0073{}", &a[1..]);
    let escaped_b = b.replace('/', "\\\\/");
    let args = format!(
        r#"{{\"key\": \"{escaped_a}\", \"path\": \"{escaped_b}\", \"note\": \"\\\\u0022quoted\\\\u0022 \\\\\\\\u0073\"}}"#
    );
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"go"}},{{"role":"assistant","content":null,"tool_calls":[{{"id":"c1","type":"function","function":{{"name":"f","arguments":"{args}"}}}}]}},{{"role":"tool","tool_call_id":"c1","content":"done"}}]}}"#
    );
    let v: serde_json::Value = serde_json::from_str(&body).expect("the body is JSON");
    let parsed: serde_json::Value = serde_json::from_str(
        v["messages"][1]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .expect("the arguments are JSON");
    assert_eq!(parsed["key"], a.as_str(), "one parse away from the secret");
    let reply = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;
    let mut known = proxy::scrub::Needles::new();
    known.add(a.as_bytes());
    known.add(b.as_bytes());
    let ex = chat_exchange("/v1/chat/completions", &body, reply);
    let b_tail = b[1..].replace('/', "\\/");
    assert_recorded_without(
        &ex,
        &known,
        &[
            ("a", a.clone()),
            ("b", b.clone()),
            ("a's tail", a[1..].to_string()),
            ("b's escaped tail", b_tail),
        ],
    );
}

/// Found by review: a known secret holding `"` written inside tool-call
/// arguments as `\u0022` stayed, since the escapes were read only for
/// characters JSON need not escape, and the needle holds `\"`. Every
/// escape is brought to serde's spelling now (`\u0022` becomes `\"`).
#[test]
fn regression_a_secret_holding_a_quote_spelt_u0022_in_arguments_never_reaches_the_ledger() {
    let a = format!("pw-{}\"{}", secret(""), secret(""));
    let (head, tail) = a.split_once('"').unwrap();
    // In the body, the arguments' text spells the quote `\u0022`.
    let args = format!(r#"{{\"password\": \"{head}\\u0022{tail}\"}}"#);
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"go"}},{{"role":"assistant","content":null,"tool_calls":[{{"id":"c1","type":"function","function":{{"name":"f","arguments":"{args}"}}}}]}},{{"role":"tool","tool_call_id":"c1","content":"done"}}]}}"#
    );
    let v: serde_json::Value = serde_json::from_str(&body).expect("the body is JSON");
    let arguments = v["messages"][1]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap();
    let parsed: serde_json::Value = serde_json::from_str(arguments).expect("JSON arguments");
    assert_eq!(
        parsed["password"],
        a.as_str(),
        "one parse away from the secret"
    );
    let reply = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;
    let mut known = proxy::scrub::Needles::new();
    known.add(a.as_bytes());
    let ex = chat_exchange("/v1/chat/completions", &body, reply);
    assert_recorded_without(
        &ex,
        &known,
        &[
            ("a's head", head.to_string()),
            ("a's tail", tail.to_string()),
        ],
    );
}
