//! `mass proxy` through the binary, tried as an attacker would, with an
//! in-process fake upstream (plain threads) and `curl` as the client:
//!
//! - a random secret planted in the query string, in the upstream URL's
//!   userinfo, in key-like body fields: recorded, replayed, mixed, a 502
//!   from an upstream that is down, a replay miss, a usage error; then
//!   every object and metadata entry of the ledger, `mass log --json`,
//!   `mass export`, every proxy's stdout and stderr and every reply the
//!   client got searched for the secret as written, hex, base64 and
//!   JSON-escaped: no hit (one test per place, named after its bug);
//! - the mass-held key and the route token (`--upstream-key-env`,
//!   `--token-env`), the size caps (`--max-request-bytes`);
//! - SIGTERM with an exchange in flight: drained and recorded, or (stuck
//!   past `--drain-secs`) named, and the exit is 1.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const PATIENCE: Duration = Duration::from_secs(15);
const RUN: &str = "guarded";
const STREAM: &str = "agent";

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

/// A random secret: `prefix` and 24 random characters.
fn secret(prefix: &str) -> String {
    let mut b = [0u8; 24];
    File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let tail: String = b.iter().map(|x| A[*x as usize % A.len()] as char).collect();
    format!("{prefix}{tail}")
}

/// The secret as written, hex (both cases), base64, JSON-escaped.
fn forms(s: &str) -> Vec<Vec<u8>> {
    let j = serde_json::to_string(s).unwrap();
    vec![
        s.as_bytes().to_vec(),
        hex::encode(s).into_bytes(),
        hex::encode_upper(s).into_bytes(),
        proxy::scrub::base64(s.as_bytes()).into_bytes(),
        j.as_bytes()[1..j.len() - 1].to_vec(),
    ]
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A `mass proxy` child with its output in files; killed when dropped.
struct Proc {
    name: String,
    child: Option<Child>,
    out: PathBuf,
    err: PathBuf,
}

impl Proc {
    fn output(&self) -> String {
        format!(
            "{} stdout:\n{}\n{} stderr:\n{}",
            self.name,
            std::fs::read_to_string(&self.out).unwrap_or_default(),
            self.name,
            std::fs::read_to_string(&self.err).unwrap_or_default()
        )
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Sends SIGTERM; the exit status and how long it took.
    fn terminate(&mut self) -> (ExitStatus, Duration) {
        let child = self.child.as_mut().expect("running");
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: kill(2) on our own child, not reaped yet.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                return (st, t0.elapsed());
            }
            assert!(
                t0.elapsed() < PATIENCE,
                "no exit after SIGTERM:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `mass proxy ARGS` on a free port; the client base URL it announced.
fn proxy(
    name: &str,
    ledger: &Path,
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Proc, String) {
    let url_file = dir.join(format!("{name}.url"));
    let (out, err) = (
        dir.join(format!("{name}.out")),
        dir.join(format!("{name}.err")),
    );
    let child = mass(ledger)
        .arg("proxy")
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--stream", STREAM])
        .arg("--url-file")
        .arg(&url_file)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let mut p = Proc {
        name: name.to_string(),
        child: Some(child),
        out,
        err,
    };
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(&url_file) {
            if !s.trim().is_empty() {
                return (p, s.trim().to_string());
            }
        }
        if let Some(st) = p.child.as_mut().unwrap().try_wait().unwrap() {
            p.child = None;
            panic!("{name} ended ({st}) before listening:\n{}", p.output());
        }
        assert!(
            t0.elapsed() < PATIENCE,
            "{name} did not listen:\n{}",
            p.output()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What the fake upstream does with a request.
#[derive(Clone, Copy, PartialEq)]
enum Act {
    Answer,
    /// Answers after this long.
    Slow(Duration),
    /// Never answers (holds the connection until the proxy drops it).
    Stuck,
}

/// Requests as the upstream read them: head and body.
type Seen = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A fake OpenAI-compatible upstream on a thread per connection, saving
/// every request (head and body) it reads.
struct Upstream {
    url: String,
    seen: Seen,
}

fn read_request(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut tmp).ok().filter(|n| *n > 0)?;
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
        let n = s.read(&mut tmp).ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&tmp[..n]);
    }
    Some((head, buf[head_end..head_end + len].to_vec()))
}

fn upstream(act: Act) -> Upstream {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}/v1", l.local_addr().unwrap().port());
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for sock in l.incoming() {
            let Ok(mut sock) = sock else { continue };
            let seen = s2.clone();
            std::thread::spawn(move || {
                while let Some((head, body)) = read_request(&mut sock) {
                    seen.lock().unwrap().push((head, body.clone()));
                    match act {
                        Act::Stuck => {
                            let _ = sock.read(&mut [0u8; 1]);
                            return;
                        }
                        Act::Slow(d) => std::thread::sleep(d),
                        Act::Answer => {}
                    }
                    let n = seen.lock().unwrap().len();
                    let b = json!({"id": format!("c{n}"), "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("answer {n}")}, "finish_reason": "stop"}], "data": [{"id": "m"}]}).to_string();
                    let r = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{b}",
                        b.len()
                    );
                    if sock.write_all(r.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Upstream { url, seen }
}

/// One request with curl; status and body (headers into the body too, so
/// a secret there is searched for as well).
fn curl(url: &str, headers: &[String], body: Option<&Value>) -> (u16, Vec<u8>) {
    let mut c = Command::new("curl");
    c.args(["-sS", "--noproxy", "*", "--max-time", "20", "-i"]);
    for h in headers {
        c.args(["-H", h]);
    }
    if let Some(b) = body {
        c.args(["-H", "content-type: application/json", "--data-binary"])
            .arg(b.to_string());
    }
    let o = c.arg(url).output().expect("curl");
    let out = o.stdout;
    let status = String::from_utf8_lossy(&out)
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, [out, o.stderr].concat())
}

/// Where the secret is planted.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Plant {
    Query,
    Userinfo,
    BodyField,
}

/// Outputs and replies, named.
type Outputs = Vec<(String, Vec<u8>)>;

/// A session with a secret planted at one place: the proxies run, and
/// everything they printed or answered.
struct Session<'a> {
    plant: Plant,
    s: &'a str,
    dir: &'a Path,
    ledger: PathBuf,
    up: Upstream,
    /// The upstream URL as the operator gives it.
    up_url: String,
    seen: Outputs,
    procs: Vec<Proc>,
}

impl Session<'_> {
    fn path(&self) -> String {
        match self.plant {
            Plant::Query => format!("/chat/completions?key={}&api-version=1", self.s),
            _ => "/chat/completions".to_string(),
        }
    }

    fn chat(&self, turn: &str) -> Value {
        let mut v = json!({"model": "m", "messages": [{"role": "user", "content": format!("turn {turn}")}]});
        if self.plant == Plant::BodyField {
            v["api_key"] = json!(self.s);
            v["extra_body"] = json!({"auth": {"token": self.s}, "note": "kept"});
        }
        v
    }

    /// POSTs turn `turn` to `url`, expecting `status`; keeps the reply.
    fn post(&mut self, url: &str, turn: &str, status: u16, what: &str) {
        let (st, b) = curl(
            &format!("{url}{}", self.path()),
            &[],
            Some(&self.chat(turn)),
        );
        assert_eq!(st, status, "{what}: {}", String::from_utf8_lossy(&b));
        self.seen.push((what.to_string(), b));
    }

    fn start(&self, name: &str, args: &[&str]) -> (Proc, String) {
        proxy(name, &self.ledger, self.dir, args, &[])
    }

    /// Ends a proxy with SIGTERM, expecting `code`; keeps it for its output.
    fn stop(&mut self, mut p: Proc, code: i32) {
        assert_eq!(p.terminate().0.code(), Some(code), "{}", p.output());
        self.procs.push(p);
    }

    /// Records a chat request and a models list; the upstream gets the
    /// secret where it was planted, as sent.
    fn record(&mut self) {
        let up_url = self.up_url.clone();
        let (p, url) = self.start("record", &["--run", RUN, "--upstream", &up_url]);
        self.post(&url, "1", 200, "the recorded reply");
        let models = match self.plant {
            Plant::Query => format!("/models?api_key={}", self.s),
            _ => "/models".to_string(),
        };
        let (st, b) = curl(&format!("{url}{models}"), &[], None);
        assert_eq!(st, 200, "{}", String::from_utf8_lossy(&b));
        self.seen.push(("the models reply".into(), b));
        self.stop(p, 0);
        let got = self.up.seen.lock().unwrap().clone();
        assert_eq!(got.len(), 2);
        let (head, body) = &got[0];
        match self.plant {
            Plant::Query => assert!(head.contains(&format!("key={}", self.s)), "{head}"),
            Plant::Userinfo => {
                let basic = proxy::scrub::base64(format!("bob:{}", self.s).as_bytes());
                assert!(head.contains(&basic), "{head}")
            }
            Plant::BodyField => assert!(contains(body, self.s.as_bytes())),
        }
    }

    /// Replay: the same request is a hit, a changed one a miss (exit 1);
    /// mixed: a hit and a live miss, both recorded.
    fn replay(&mut self) {
        let (p, url) = self.start("replay", &["--run", RUN, "--replay"]);
        self.post(&url, "1", 200, "the replayed reply");
        self.post(&url, "changed", 400, "the miss reply");
        // The miss reports are printed when the proxy stops.
        self.stop(p, 1);
        let last = self.procs.last().expect("just stopped");
        assert!(last.stderr().contains("turn changed"), "{}", last.output());
        let up_url = self.up_url.clone();
        let args = [
            "--run",
            RUN,
            "--replay",
            "--upstream",
            &up_url,
            "--into",
            "mixed",
        ];
        let (p, url) = self.start("mixed", &args);
        self.post(&url, "1", 200, "the mixed hit");
        self.post(&url, "2", 200, "the mixed miss, live");
        self.stop(p, 0);
    }

    /// The upstream down: a 502 naming where it went; a usage error naming
    /// a bad URL.
    fn down(&mut self) {
        let dead = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let dead_url = match self.plant {
            Plant::Userinfo => format!("http://bob:{}@{dead}/v1", self.s),
            _ => format!("http://{dead}/v1"),
        };
        let (p, url) = self.start("down", &["--run", "down", "--upstream", &dead_url]);
        self.post(&url, "1", 502, "the 502 reply");
        let last = &self.seen.last().unwrap().1;
        assert!(
            contains(last, dead.to_string().as_bytes()),
            "{}",
            String::from_utf8_lossy(last)
        );
        self.stop(p, 0);
        if self.plant == Plant::Userinfo {
            let bad = format!("ftp://bob:{}@{dead}/v1", self.s);
            let o = mass(&self.ledger)
                .args(["proxy", "--run", "x", "--upstream", &bad])
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(2), "{}", text(&o));
            self.seen
                .push(("a usage error".into(), [o.stdout, o.stderr].concat()));
        }
    }

    /// Every proxy's output, and the ledger as `mass log` and `mass
    /// export` show it.
    fn outputs(&mut self) {
        for p in &self.procs {
            self.seen
                .push((format!("{} output", p.name), p.output().into_bytes()));
        }
        for args in [vec!["log", "--json"], vec!["log", "mixed/agent", "--json"]] {
            let o = ok(mass(&self.ledger).args(&args));
            self.seen.push((
                format!("mass {}", args.join(" ")),
                [o.stdout, o.stderr].concat(),
            ));
        }
        let exported = self.dir.join("events.jsonl");
        ok(mass(&self.ledger)
            .args(["export", "events", "--out"])
            .arg(&exported));
        self.seen.push((
            "mass export events".into(),
            std::fs::read(&exported).unwrap(),
        ));
    }
}

/// The whole session with `secret` planted at `plant`: every output and
/// reply, and the ledger directory.
fn session(plant: Plant, s: &str, dir: &Path) -> (Outputs, PathBuf) {
    let ledger = dir.join("ledger");
    ok(mass(&ledger).arg("init"));
    let up = upstream(Act::Answer);
    let up_url = match plant {
        Plant::Userinfo => up.url.replace("http://", &format!("http://bob:{s}@")),
        _ => up.url.clone(),
    };
    let mut session = Session {
        plant,
        s,
        dir,
        ledger,
        up,
        up_url,
        seen: Vec::new(),
        procs: Vec::new(),
    };
    session.record();
    session.replay();
    session.down();
    session.outputs();
    (session.seen, session.ledger)
}

/// Searches every output and reply, then every object (decompressed) and
/// every object's metadata of the ledger, for every form of `s`.
fn assert_nowhere(s: &str, seen: &Outputs, ledger: &Path) {
    let forms = forms(s);
    let mut hits = Vec::new();
    for (what, bytes) in seen {
        if forms.iter().any(|f| contains(bytes, f)) {
            hits.push(what.clone());
        }
    }
    let l = ledger::Ledger::open_read_only(ledger).unwrap();
    let mut ids = Vec::new();
    l.for_each_location(|id, _| ids.push(id)).unwrap();
    let mut control = false;
    for id in &ids {
        let (_, bytes) = l.raw_object(id).unwrap();
        if forms.iter().any(|f| contains(&bytes, f)) {
            hits.push(format!("object {}", id.short(12)));
        }
        control |= contains(&bytes, b"turn changed") || contains(&bytes, b"turn 2");
        let meta = format!("{:?}", l.get_meta(id).unwrap());
        if forms.iter().any(|f| contains(meta.as_bytes(), f)) {
            hits.push(format!("metadata of {}", id.short(12)));
        }
    }
    assert!(hits.is_empty(), "the secret is in: {hits:?}");
    // Control: the search sees what was recorded.
    assert!(control, "the recorded requests are in no object");
    assert!(ids.len() > 15, "{} objects", ids.len());
}

/// The bug: `mass proxy` stored a key passed in the query string
/// (`?key=...`) in the ledger (3 places) and echoed it in 502s and miss
/// reports.
#[test]
fn a_key_in_the_query_string_is_never_recorded_printed_or_echoed() {
    let d = tempfile::tempdir().unwrap();
    let s = secret("qk-");
    let (seen, ledger) = session(Plant::Query, &s, d.path());
    assert_nowhere(&s, &seen, &ledger);
}

/// The bug: the password of an upstream URL (`http://u:PASS@host/v1`) was
/// recorded as the upstream (`wire.served_by`), and echoed in 502s and
/// usage errors.
#[test]
fn the_password_of_the_upstream_url_is_never_recorded_printed_or_echoed() {
    let d = tempfile::tempdir().unwrap();
    let s = secret("pw-");
    let (seen, ledger) = session(Plant::Userinfo, &s, d.path());
    assert_nowhere(&s, &seen, &ledger);
    // And its Basic form, which is what an HTTP client sends.
    let basic = proxy::scrub::base64(format!("bob:{s}").as_bytes());
    assert_nowhere(&basic, &seen, &ledger);
}

/// The bug: key-like fields of request bodies (`api_key`, a nested
/// `token`) were recorded as parameters, and shown in miss reports.
#[test]
fn a_key_like_body_field_is_never_recorded_printed_or_echoed() {
    let d = tempfile::tempdir().unwrap();
    let s = secret("fk-");
    let (seen, ledger) = session(Plant::BodyField, &s, d.path());
    assert_nowhere(&s, &seen, &ledger);
}

/// The mass-held key and the route token from the command line: a client
/// without the token gets 401 and reaches nothing; with it, the upstream
/// gets mass's key (not the token); a body over `--max-request-bytes` gets
/// 413. Neither secret is printed or recorded.
#[test]
fn proxy_keeps_the_key_checks_the_token_and_caps_bodies_from_its_flags() {
    let d = tempfile::tempdir().unwrap();
    let ledger = d.path().join("ledger");
    ok(mass(&ledger).arg("init"));
    let up = upstream(Act::Answer);
    let (key, token) = (secret("sk-held-"), secret("tok-"));
    let args = [
        "--run",
        RUN,
        "--upstream",
        &up.url,
        "--upstream-key-env",
        "HELD_KEY",
        "--token-env",
        "ROUTE_TOKEN",
        "--max-request-bytes",
        "2000",
    ];
    let env = [("HELD_KEY", key.as_str()), ("ROUTE_TOKEN", token.as_str())];
    let (mut p, url) = proxy("guarded", &ledger, d.path(), &args, &env);
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let auth = vec![format!("Authorization: Bearer {token}")];
    let mut seen = Vec::new();
    let (st, b) = curl(&format!("{url}/chat/completions"), &[], Some(&chat));
    assert_eq!(st, 401, "{}", String::from_utf8_lossy(&b));
    seen.push(("the 401".to_string(), b));
    let (st, b) = curl(
        &format!("{url}/chat/completions"),
        &[format!("x-api-key: {key}")],
        Some(&chat),
    );
    assert_eq!(st, 401, "the upstream's key is not the route's token");
    seen.push(("the other 401".to_string(), b));
    assert!(
        up.seen.lock().unwrap().is_empty(),
        "a refused request went upstream"
    );
    let big = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(4000)}]});
    let (st, b) = curl(&format!("{url}/chat/completions"), &auth, Some(&big));
    assert_eq!(st, 413, "{}", String::from_utf8_lossy(&b));
    seen.push(("the 413".to_string(), b));
    let (st, b) = curl(&format!("{url}/chat/completions"), &auth, Some(&chat));
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&b));
    seen.push(("the reply".to_string(), b));
    assert_eq!(p.terminate().0.code(), Some(0), "{}", p.output());
    let got = up.seen.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert!(
        got[0].0.contains(&format!("authorization: Bearer {key}")),
        "{}",
        got[0].0
    );
    assert!(
        !got[0].0.contains(&token),
        "the token reached the upstream: {}",
        got[0].0
    );
    seen.push(("the proxy's output".to_string(), p.output().into_bytes()));
    assert_nowhere_secrets(&[&key, &token], &seen, &ledger);
    // The flags are documented, the drain time with them.
    let help = ok(mass(&ledger).args(["proxy", "--help"]));
    let help = String::from_utf8_lossy(&help.stdout);
    for want in [
        "--drain-secs",
        "--max-request-bytes",
        "--max-response-bytes",
        "--upstream-key-env",
        "--token-env",
        "10 s",
    ] {
        assert!(help.contains(want), "{want} not in the help:\n{help}");
    }
}

fn assert_nowhere_secrets(secrets: &[&str], seen: &[(String, Vec<u8>)], ledger: &Path) {
    let l = ledger::Ledger::open_read_only(ledger).unwrap();
    let mut ids = Vec::new();
    l.for_each_location(|id, _| ids.push(id)).unwrap();
    for s in secrets {
        for f in forms(s) {
            for (what, b) in seen {
                assert!(!contains(b, &f), "a secret is in {what}");
            }
            for id in &ids {
                assert!(
                    !contains(&l.raw_object(id).unwrap().1, &f),
                    "a secret is in {id:?}"
                );
                assert!(!format!("{:?}", l.get_meta(id).unwrap())
                    .contains(&String::from_utf8_lossy(&f).to_string()));
            }
        }
    }
}

/// Sends one chat request in the background; its status and body later.
fn in_background(url: &str) -> std::thread::JoinHandle<(u16, Vec<u8>)> {
    let url = format!("{url}/chat/completions");
    std::thread::spawn(move || {
        curl(
            &url,
            &[],
            Some(&json!({"model": "m", "messages": [{"role": "user", "content": "slow"}]})),
        )
    })
}

/// The bug: on SIGTERM the proxy dropped the exchanges in flight, though its
/// help said everything passed through is durable. Now it waits for them:
/// the client gets its whole reply, the exchange is recorded, exit 0.
#[test]
fn sigterm_waits_for_an_exchange_in_flight_and_records_it() {
    let d = tempfile::tempdir().unwrap();
    let ledger = d.path().join("ledger");
    ok(mass(&ledger).arg("init"));
    let up = upstream(Act::Slow(Duration::from_millis(1500)));
    let (mut p, url) = proxy(
        "drain",
        &ledger,
        d.path(),
        &["--run", RUN, "--upstream", &up.url],
        &[],
    );
    let client = in_background(&url);
    let t0 = Instant::now();
    while up.seen.lock().unwrap().is_empty() {
        assert!(
            t0.elapsed() < PATIENCE,
            "the request never reached the upstream"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (st, took) = p.terminate();
    assert_eq!(st.code(), Some(0), "{}", p.output());
    assert!(
        took >= Duration::from_millis(800),
        "exited after {took:?}: it did not wait"
    );
    let (status, body) = client.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(contains(&body, b"answer 1"));
    let log = ok(mass(&ledger).args(["log", &format!("{RUN}/{STREAM}")]));
    assert_eq!(
        String::from_utf8_lossy(&log.stdout).lines().count(),
        1,
        "{}",
        text(&log)
    );
}

/// Past `--drain-secs`, an exchange still in flight cannot be recorded: the
/// proxy names it and exits 1, instead of claiming everything is durable.
#[test]
fn sigterm_exits_non_zero_naming_the_exchanges_it_could_not_record() {
    let d = tempfile::tempdir().unwrap();
    let ledger = d.path().join("ledger");
    ok(mass(&ledger).arg("init"));
    let up = upstream(Act::Stuck);
    let args = ["--run", RUN, "--upstream", &up.url, "--drain-secs", "1"];
    let (mut p, url) = proxy("stuck", &ledger, d.path(), &args, &[]);
    let _client = in_background(&url);
    let t0 = Instant::now();
    while up.seen.lock().unwrap().is_empty() {
        assert!(
            t0.elapsed() < PATIENCE,
            "the request never reached the upstream"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (st, took) = p.terminate();
    assert_eq!(st.code(), Some(1), "{}", p.output());
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(8),
        "{took:?}"
    );
    let err = p.stderr();
    assert!(
        err.contains("not recorded: POST /v1/chat/completions on guarded/agent"),
        "{}",
        p.output()
    );
}
