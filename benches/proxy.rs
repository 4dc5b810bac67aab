//! The recording proxy's cost on the request path: the latency it adds to
//! every request, and to a stream's time to first token, against a local
//! upstream, measured in the same run as the direct path it is compared to.
//!
//! A local OpenAI-compatible stub (plain threads, HTTP/1.1 keep-alive)
//! answers `POST /v1/chat/completions`: non-streamed with a chat.completion
//! holding one tool call after a fixed delay (`--delay-ms`, 2 ms), streamed
//! (`stream: true`) with server-sent events: headers at once, the first
//! chunk after `--ttft-ms` (20 ms), then `--chunks` (20) more every
//! `--chunk-ms` (2 ms), the last followed by `data: [DONE]`. Delays run from
//! the moment the stub has read the whole request, on deadlines
//! (`thread::sleep`, not a millisecond timer wheel), so every path gets the
//! same upstream time.
//!
//! The client (reqwest, the engine's HTTP client, one keep-alive connection
//! per host, on its own thread) plays one agent conversation: a ~20 KiB
//! system prompt, ~10 KiB of tools, a task, then per turn the previous
//! request's messages plus the assistant's reply (a tool call) and the
//! tool's result (0.3 to 5 KiB), so requests grow from ~36 KiB to ~200 KiB
//! over 48 turns as a real agent's do, and the recording does its real work
//! (parsing, hashing, compressing message blobs, prefix chains, a durable
//! commit per exchange). Every turn's request goes three ways, in an order
//! that cycles through all six permutations (so drift, and what ran just
//! before, cancel): A directly to the stub; B through the proxy
//! (the `proxy` crate, on its own multi-threaded runtime with one worker per
//! core, as `mass proxy` runs) recording into a fresh ledger; C through a
//! bare pass-through built here from the proxy's HTTP stack (hyper server,
//! body collected, forwarded by reqwest, response passed on chunk by chunk
//! from a spawned task) that records nothing. B - A is what the issue's goal
//! is about; C - A is the HTTP hop alone and B - C the recording's share of
//! the request path. The same requests are then replayed through the proxy
//! from that recording (no upstream), interleaved with a zero-delay stub as
//! the baseline: the cheapest HTTP answer there is. Every proxied,
//! passed-through and replayed response body is checked byte-equal to the
//! direct one.
//!
//! Printed, in microseconds: median, p90 and min per path; added latency as
//! the difference of medians and as the median (and p90) of the per-request
//! paired differences, with the ratio of medians; B - A and C - A by
//! conversation third (request size) and right after a call on the same
//! path (the previous recording may still be running) or not; how long
//! `Route::finish` waited for the recording after the last response; for
//! streams the same for the time to the first body byte (TTFT) and to the
//! end; verdict lines against the goals (median added latency < 1 ms, TTFT
//! unchanged within 1 ms). Then the recording alone (`WireLog::record` on
//! one thread, no HTTP) per exchange against parsing the request, and
//! storage: ledger bytes per request (the whole directory after close, and
//! its segments) against the raw request + response bytes and a gzip'd
//! JSONL log of the full exchanges, at a quarter, half and all of the
//! conversation: linear against quadratic.
//!
//! Then the concurrent mode, for issue #32's goal (the added TTFT p50 <=
//! 0.3 ms and p99 <= 1 ms with 256 concurrent streaming clients):
//! `--clients=N` clients at once (256; 64 with `--quick`, 4 in the smoke
//! run; `--clients=0` skips it), each its own agent conversation (the same
//! system prompt and tools, its own task, replies and tool results) of
//! `--clients-turns=N` streamed turns (8; 4 with `--quick`, 2 in the smoke
//! run). One proxy (on a runtime as above) serves a recording route per
//! client (`/s/cNNN/v1`, as it serves one per rollout), each recording into
//! its own stream `client-NNN` of one fresh ledger with its own writer, so
//! prefix chains are per client, every exchange committed durably as
//! above. A stub of their own (the same delays, told the conversation by
//! header `x-bench-client`) answers; with a thread per connection it never
//! queues a request behind another. The clients are tasks on one
//! multi-threaded runtime (a worker per core, at least 2: one thread would
//! queue every client's reads and timestamps behind the others'), each
//! with its own reqwest client and so its own keep-alive connections to
//! the stub and to the proxy, as an agent process has: nothing goes
//! through a shared connection or pool. They list the models on both
//! paths, wait for each other, and start spread over one stream's length
//! (agents are not in step). Each turn's request goes directly (A) and
//! through the client's route (B), the order alternating by turn and
//! client so drift cancels; the figures are the per-request differences
//! B - A of the time to the first body byte and to the end of the body.
//! Before that the same clients run once with both paths going straight to
//! the stub (the null run: no proxy, nothing recorded), so the figures
//! come with what the pairing reads when nothing is added, at that load on
//! that machine. Printed: p50, p90, p99 and max of A, B and B - A, the
//! null run's direct - direct TTFT, the wall time, how
//! long the recordings took to be durable after the last client finished,
//! and verdict lines against the goal. Then the ledger is closed and
//! reopened: every client's stream must hold its models listing and every
//! turn in order, each turn's prefix the turn before, each recorded body
//! byte-equal to the direct one (as every proxied body must be), or the
//! bench panics.
//!
//!     cargo bench --bench proxy                  # 48 turns x 5 reps, streamed 24 turns x 2 reps, then 256 clients x 8 turns and their null run (~16 s in all)
//!     cargo bench --bench proxy -- --quick       # 24 x 2, streamed 12 x 1, then 64 clients x 4 turns
//!     cargo bench --bench proxy -- --reps=10 --turns=64 --delay-ms=5 --workers=4
//!     cargo bench --bench proxy -- --clients=128 --clients-turns=16   # --clients=0: one client only
//!
//! The figures are also written to `target/bench/proxy.json` (not by the
//! smoke run): `{"turns", "sse_turns", "reps", "sse_reps", "workers", "cores",
//! "plain": {...}, "streamed": {...}, "bodies_equal", "concurrent": {...}}`,
//! each of `plain` (the time to the end of the body) and `streamed` (the
//! time to the first body byte) holding `"requests"`, `"direct_p50_us"`,
//! `"direct_p99_us"`, `"proxied_p50_us"`, `"proxied_p99_us"`,
//! `"bare_p50_us"` and `"added_paired_p50_us"` / `"added_paired_p99_us"`
//! (quantiles of the per-request differences B - A). `concurrent` (`null`
//! with `--clients=0`) holds `"clients"`, `"turns"` (per client),
//! `"requests"` (per path), `"added_ttft_p50_us"`, `"added_ttft_p90_us"`,
//! `"added_ttft_p99_us"` (quantiles of the paired B - A of the time to the
//! first body byte), `"added_total_p50_us"`, `"added_total_p99_us"` (the
//! same to the end of the body), `"direct_ttft_p50_us"`,
//! `"direct_ttft_p99_us"`, `"proxied_ttft_p50_us"`,
//! `"proxied_ttft_p99_us"`, `"null_ttft_p50_us"`, `"null_ttft_p99_us"`
//! (the null run's paired TTFT difference), `"null_wall_s"` and `"wall_s"`
//! (first turn sent to last turn done, in the null run and the proxied one).
//!
//! Other options: `--sse-turns=N --sse-reps=N --ttft-ms=F --chunks=N
//! --chunk-ms=F --dir=PATH` (where the ledgers go; a temporary directory by
//! default). Diagnostic: `--bare-burn=US[:yield|:thread]` makes the bare
//! pass-through queue US microseconds of CPU work per exchange just before
//! the response ends, where the proxy queues its recording: to a task on its
//! runtime (`:yield`: that yields once first) or to an OS thread, to see
//! what such work costs the client. Run without `--bench` (as `cargo test
//! --all-targets` does) it runs a smoke test in miniature.

#[path = "common/report.rs"]
mod report;

// The allocator `mass proxy` runs with, so the bench measures it.
#[path = "../src/alloc.rs"]
mod alloc;

use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;

use proxy::{Book, Normaliser, ProxyServer, Route, Upstream, WireLog};
use serde_json::{json, Value};

const RUN: &str = "bench";
const MODEL: &str = "bench-model";
const USAGE: &str = "usage: cargo bench --bench proxy -- [--quick] [--turns=N] [--reps=N] \
     [--sse-turns=N] [--sse-reps=N] [--delay-ms=F] [--ttft-ms=F] [--chunks=N] [--chunk-ms=F] \
     [--workers=N] [--dir=PATH] [--bare-burn=US[:yield|:thread]] [--clients=N] [--clients-turns=N]";
/// The issue's goal for the median added latency, and for TTFT.
const GOAL_US: f64 = 1000.0;
/// Issue #32's goals for the paired added TTFT with concurrent clients.
const CLIENTS_GOAL_P50_US: f64 = 300.0;
const CLIENTS_GOAL_P99_US: f64 = 1000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BurnOn {
    Task,
    Yield,
    Thread,
}

#[derive(Debug, Clone)]
struct Cfg {
    smoke: bool,
    turns: usize,
    reps: usize,
    sse_turns: usize,
    sse_reps: usize,
    delay: Duration,
    ttft: Duration,
    chunks: usize,
    interval: Duration,
    /// Worker threads of the proxy's runtime (`mass proxy`: one per core).
    workers: usize,
    dir: Option<PathBuf>,
    /// Diagnostic (`--bare-burn=US[:yield|:thread]`): the bare pass-through
    /// queues this much CPU work per exchange before the response ends, as
    /// the proxy queues its recording, to a task on its runtime (which
    /// yields once first with `:yield`) or to an OS thread (`:thread`).
    bare_burn: Duration,
    bare_burn_on: BurnOn,
    /// The concurrent mode: this many clients at once (0: skipped), each
    /// `clients_turns` streamed turns.
    clients: usize,
    clients_turns: usize,
}

fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn parse_args() -> Result<Cfg, String> {
    let smoke = !std::env::args().skip(1).any(|a| a == "--bench");
    let mut cfg = Cfg {
        smoke,
        turns: 48,
        reps: 5,
        sse_turns: 24,
        sse_reps: 2,
        delay: Duration::from_millis(2),
        ttft: Duration::from_millis(20),
        chunks: 20,
        interval: Duration::from_millis(2),
        workers: cores(),
        dir: None,
        bare_burn: Duration::ZERO,
        bare_burn_on: BurnOn::Task,
        clients: 256,
        clients_turns: 8,
    };
    let (mut quick, mut clients, mut clients_turns) = (false, None, None);
    if smoke {
        // `cargo test --all-targets`: every code path, in miniature.
        cfg.turns = 4;
        cfg.reps = 1;
        cfg.sse_turns = 2;
        cfg.sse_reps = 1;
        cfg.delay = Duration::from_millis(1);
        cfg.ttft = Duration::from_millis(2);
        cfg.chunks = 4;
        cfg.interval = Duration::from_millis(1);
    }
    let ms = |v: &str| -> Result<Duration, String> {
        let f: f64 = v.parse().map_err(|_| format!("bad duration {v:?}"))?;
        if !(0.0..=10_000.0).contains(&f) {
            return Err(format!("duration {v:?} out of range"));
        }
        Ok(Duration::from_secs_f64(f / 1e3))
    };
    let num = |v: &str| -> Result<usize, String> {
        match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("bad count {v:?}")),
        }
    };
    for a in std::env::args().skip(1) {
        let (k, v) = a.split_once('=').unwrap_or((a.as_str(), ""));
        match k {
            "--bench" => {}
            "--quick" => {
                cfg.turns = 24;
                cfg.reps = 2;
                cfg.sse_turns = 12;
                cfg.sse_reps = 1;
                quick = true;
            }
            "--clients" => match v.parse::<usize>() {
                Ok(n) if n <= 2000 => clients = Some(n),
                _ => return Err(format!("bad --clients {v:?} (0 to 2000)")),
            },
            "--clients-turns" => clients_turns = Some(num(v)?),
            "--turns" => cfg.turns = num(v)?.max(4),
            "--reps" => cfg.reps = num(v)?,
            "--sse-turns" => cfg.sse_turns = num(v)?.max(2),
            "--sse-reps" => cfg.sse_reps = num(v)?,
            "--delay-ms" => cfg.delay = ms(v)?,
            "--ttft-ms" => cfg.ttft = ms(v)?,
            "--chunk-ms" => cfg.interval = ms(v)?,
            "--chunks" => cfg.chunks = num(v)?,
            "--workers" => cfg.workers = num(v)?,
            "--dir" if !v.is_empty() => cfg.dir = Some(PathBuf::from(v)),
            "--bare-burn" => {
                let (n, on) = v.split_once(':').unwrap_or((v, "task"));
                cfg.bare_burn = ms(n)? / 1000;
                cfg.bare_burn_on = match on {
                    "task" => BurnOn::Task,
                    "yield" => BurnOn::Yield,
                    "thread" => BurnOn::Thread,
                    _ => return Err(format!("bad --bare-burn {v:?}")),
                };
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => return Err(format!("unknown option {a:?}")),
        }
    }
    // The first chunk, at least two pieces of the reply, the finish chunk
    // and the usage chunk.
    cfg.chunks = cfg.chunks.max(4);
    let (n, t) = match (smoke, quick) {
        (true, _) => (4, 2),
        (false, true) => (64, 4),
        (false, false) => (256, 8),
    };
    cfg.clients = clients.unwrap_or(n);
    cfg.clients_turns = clients_turns.unwrap_or(t);
    Ok(cfg)
}

// ---------------------------------------------------------------------------
// The conversation: deterministic text, an agent's shape.

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo)
    }

    fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
        v[self.below(v.len())]
    }
}

const WORDS: [&str; 64] = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "be",
    "on",
    "not",
    "this",
    "by",
    "are",
    "or",
    "from",
    "file",
    "test",
    "function",
    "value",
    "error",
    "data",
    "model",
    "return",
    "result",
    "check",
    "path",
    "module",
    "config",
    "output",
    "input",
    "before",
    "after",
    "when",
    "each",
    "every",
    "line",
    "change",
    "build",
    "run",
    "call",
    "use",
    "should",
    "must",
    "never",
    "always",
    "workspace",
    "command",
    "report",
    "task",
    "step",
    "first",
    "then",
    "only",
    "tool",
    "user",
    "answer",
    "code",
    "read",
    "write",
];
const SYLLABLES: [&str; 24] = [
    "ka", "ro", "mi", "sen", "tor", "al", "vek", "lu", "pra", "dor", "in", "ex", "qua", "zi",
    "bel", "num", "har", "ost", "ly", "tri", "gon", "pel", "ux", "fen",
];

fn word(rng: &mut Rng) -> String {
    if rng.below(10) < 7 {
        return rng.pick(&WORDS).to_string();
    }
    let n = rng.range(2, 5);
    (0..n).map(|_| rng.pick(&SYLLABLES)).collect()
}

/// About `n` bytes of ASCII prose.
fn prose(rng: &mut Rng, n: usize) -> String {
    let mut s = String::with_capacity(n + 16);
    let mut in_sentence = 0;
    while s.len() < n {
        let mut w = word(rng);
        if in_sentence == 0 {
            w[..1].make_ascii_uppercase();
        }
        s.push_str(&w);
        in_sentence += 1;
        if in_sentence > rng.range(6, 18) {
            s.push_str(". ");
            in_sentence = 0;
        } else {
            s.push(' ');
        }
    }
    s.truncate(n);
    s
}

fn ident(rng: &mut Rng) -> String {
    let n = rng.range(1, 4);
    (0..n)
        .map(|_| rng.pick(&SYLLABLES))
        .collect::<Vec<_>>()
        .join("_")
}

const TOOLS: [&str; 14] = [
    "read_file",
    "write_file",
    "edit_file",
    "glob",
    "grep",
    "bash",
    "run_python",
    "list_dir",
    "web_fetch",
    "todo_write",
    "task",
    "notebook_edit",
    "search_docs",
    "finish",
];

fn tools_json(rng: &mut Rng) -> Value {
    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|name| {
            let mut props = serde_json::Map::new();
            let mut required = Vec::new();
            for i in 0..rng.range(2, 5) {
                let p = ident(rng);
                let n = rng.range(60, 160);
                props.insert(
                    p.clone(),
                    json!({"type": if i % 3 == 2 { "integer" } else { "string" }, "description": prose(rng, n)}),
                );
                if i < 2 {
                    required.push(p);
                }
            }
            let n = rng.range(300, 420);
            json!({"type": "function", "function": {
                "name": name,
                "description": prose(rng, n),
                "parameters": {"type": "object", "properties": props, "required": required},
            }})
        })
        .collect();
    Value::Array(tools)
}

fn tool_output(rng: &mut Rng) -> String {
    let target = rng.range(300, 5000);
    let mut s = String::with_capacity(target + 128);
    match rng.below(3) {
        0 => s = prose(rng, target),
        1 => {
            s.push_str("date,series,value,delta\n");
            while s.len() < target {
                let line = format!(
                    "2024-{:02}-{:02},{},{}.{:03},{}\n",
                    rng.range(1, 13),
                    rng.range(1, 29),
                    ident(rng),
                    rng.below(10_000),
                    rng.below(1000),
                    rng.below(200) as i64 - 100
                );
                s.push_str(&line);
            }
        }
        _ => {
            while s.len() < target {
                let line = format!(
                    "-rw-r--r-- 1 agent agent {:>9} Mar {:>2} {:02}:{:02} src/{}/{}.{}\n",
                    rng.below(5_000_000),
                    rng.range(1, 28),
                    rng.below(24),
                    rng.below(60),
                    ident(rng),
                    ident(rng),
                    rng.pick(&["py", "rs", "json", "md", "csv"])
                );
                s.push_str(&line);
            }
        }
    }
    s.truncate(target);
    s
}

/// What the stub answers at one turn, in both forms.
struct Reply {
    /// The assistant message (what the client appends to the conversation).
    message: Value,
    /// The non-streamed chat.completion body.
    plain: Vec<u8>,
    /// The streamed body's events, each one `data: ...\n\n`, the last one
    /// `data: [DONE]\n\n`.
    sse: Vec<Vec<u8>>,
}

/// The whole conversation, fixed before anything is measured; the stub and
/// the client share it.
struct Script {
    system: Value,
    user: Value,
    tools: Value,
    replies: Vec<Reply>,
    tool_results: Vec<Value>,
}

fn split_even(s: &str, parts: usize) -> Vec<String> {
    let parts = parts.max(1);
    let step = s.len().div_ceil(parts).max(1);
    let mut out: Vec<String> = s
        .as_bytes()
        .chunks(step)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    out.resize(parts, String::new());
    out
}

fn make_reply(rng: &mut Rng, t: usize, chunks: usize) -> Reply {
    let n = rng.range(80, 400);
    let content = prose(rng, n);
    let tool = TOOLS[rng.below(TOOLS.len() - 1)];
    let n = rng.range(60, 800);
    let args =
        json!({"path": format!("src/{}/{}.py", ident(rng), ident(rng)), "text": prose(rng, n)})
            .to_string();
    let call_id = format!("call_{t:04}_{:012x}", rng.next() & 0xFFFF_FFFF_FFFF);
    let message = json!({
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": tool, "arguments": args}}],
    });
    let id = format!("chatcmpl-{t:04}");
    let usage = json!({"prompt_tokens": 8000 + 600 * t, "completion_tokens": 40 + args.len() / 4});
    let plain = json!({
        "id": id,
        "object": "chat.completion",
        "created": 1_700_000_000 + t,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": null}],
        "usage": usage,
    })
    .to_string()
    .into_bytes();
    // First chunk (the role), the content and the arguments in `chunks - 2`
    // pieces, the finish chunk, the usage chunk.
    let chunk = |choices: Value, usage: Option<&Value>| {
        let mut c = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": 1_700_000_000 + t,
            "model": MODEL,
            "choices": choices,
        });
        if let Some(u) = usage {
            c["usage"] = u.clone();
        }
        format!("data: {c}\n\n").into_bytes()
    };
    let delta = |d: Value| json!([{"index": 0, "delta": d, "finish_reason": null}]);
    let mut sse = vec![chunk(
        delta(json!({"role": "assistant", "content": ""})),
        None,
    )];
    let pieces = chunks - 2;
    let content_pieces = (pieces / 2).max(1);
    let arg_pieces = pieces - content_pieces;
    for p in split_even(&content, content_pieces) {
        sse.push(chunk(delta(json!({"content": p})), None));
    }
    for (i, p) in split_even(&args, arg_pieces).into_iter().enumerate() {
        let call = if i == 0 {
            json!({"index": 0, "id": call_id, "type": "function", "function": {"name": tool, "arguments": p}})
        } else {
            json!({"index": 0, "function": {"arguments": p}})
        };
        sse.push(chunk(delta(json!({"tool_calls": [call]})), None));
    }
    sse.push(chunk(
        json!([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        None,
    ));
    sse.push(chunk(json!([]), Some(&usage)));
    sse.push(b"data: [DONE]\n\n".to_vec());
    Reply {
        message,
        plain,
        sse,
    }
}

/// Each turn's reply and tool result.
fn script_turns(rng: &mut Rng, turns: usize, chunks: usize) -> (Vec<Reply>, Vec<Value>) {
    let mut replies = Vec::new();
    let mut tool_results = Vec::new();
    for t in 0..turns {
        let r = make_reply(rng, t, chunks);
        let id = r.message["tool_calls"][0]["id"].clone();
        tool_results.push(json!({"role": "tool", "tool_call_id": id, "content": tool_output(rng)}));
        replies.push(r);
    }
    (replies, tool_results)
}

impl Script {
    fn new(turns: usize, chunks: usize) -> Script {
        let mut rng = Rng(0x5EED_7001);
        let mut system = String::from(
            "You are a software engineering agent working in a repository. Use the tools to \
             read, change and test code; report results exactly as measured.\n\n",
        );
        while system.len() < 20 * 1024 {
            system.push_str(&format!("## {}\n\n", prose(&mut rng, 30)));
            for _ in 0..rng.range(3, 7) {
                let n = rng.range(80, 300);
                system.push_str(&format!("- {}\n", prose(&mut rng, n)));
            }
            let n = rng.range(400, 1200);
            system.push_str(&format!("\n{}\n\n", prose(&mut rng, n)));
        }
        let tools = tools_json(&mut rng);
        let user = json!({"role": "user", "content": format!("Task: {}", prose(&mut rng, 1500))});
        let (replies, tool_results) = script_turns(&mut rng, turns, chunks);
        Script {
            system: json!({"role": "system", "content": system}),
            user,
            tools,
            replies,
            tool_results,
        }
    }

    /// Client `client`'s conversation in the concurrent mode: the same
    /// harness (`base`'s system prompt and tools), its own task, replies
    /// and tool results.
    fn for_client(base: &Script, client: usize, turns: usize, chunks: usize) -> Script {
        let mut rng = Rng(0xC11E_0000_0000 + client as u64);
        let task = format!("Task {client}: {}", prose(&mut rng, 1500));
        let (replies, tool_results) = script_turns(&mut rng, turns, chunks);
        Script {
            system: base.system.clone(),
            user: json!({"role": "user", "content": task}),
            tools: base.tools.clone(),
            replies,
            tool_results,
        }
    }

    /// The request body of turn `t` (0-based): system, task, then every
    /// earlier turn's reply and tool result.
    fn request(&self, t: usize, stream: bool) -> Vec<u8> {
        let mut messages = vec![self.system.clone(), self.user.clone()];
        for i in 0..t {
            messages.push(self.replies[i].message.clone());
            messages.push(self.tool_results[i].clone());
        }
        let mut body = json!({
            "model": MODEL,
            "messages": messages,
            "tools": self.tools,
            "tool_choice": "auto",
            "temperature": 0.2,
            "max_tokens": 4096,
        });
        if stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        serde_json::to_vec(&body).expect("serialise a request")
    }
}

// ---------------------------------------------------------------------------
// The stub upstream: a thread per connection, HTTP/1.1 keep-alive.

#[derive(Clone, Copy)]
struct Timing {
    delay: Duration,
    ttft: Duration,
    interval: Duration,
}

fn timing(cfg: &Cfg) -> Timing {
    Timing {
        delay: cfg.delay,
        ttft: cfg.ttft,
        interval: cfg.interval,
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

fn write_chunk(sock: &mut TcpStream, data: &[u8], last: bool) -> std::io::Result<()> {
    let mut frame = format!("{:x}\r\n", data.len()).into_bytes();
    frame.extend_from_slice(data);
    frame.extend_from_slice(b"\r\n");
    if last {
        frame.extend_from_slice(b"0\r\n\r\n");
    }
    sock.write_all(&frame)
}

/// Serves one connection. The turn comes in header `x-bench-turn`, the
/// mode in `x-bench-stream` and, in the concurrent mode, the conversation
/// in `x-bench-client` (0 when absent; the client sets them; the proxy
/// passes headers through), so the stub does not parse the 36-200 KiB
/// bodies it reads; `x-bench-delay-us: 0` makes every delay zero (the
/// replay baseline).
fn serve_conn(mut sock: TcpStream, scripts: Arc<Vec<Arc<Script>>>, timing: Timing) {
    let mut buf: Vec<u8> = Vec::with_capacity(256 * 1024);
    let mut tmp = vec![0u8; 64 * 1024];
    loop {
        let head_end = loop {
            if let Some(p) = find(&buf, b"\r\n\r\n") {
                break p + 4;
            }
            match sock.read(&mut tmp) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let header = |name: &str| {
            head.lines().find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|r| r.strip_prefix(':'))
                    .map(|v| v.trim().to_string())
            })
        };
        if header("transfer-encoding").is_some() {
            eprintln!("stub: chunked request bodies are not supported");
            return;
        }
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            match sock.read(&mut tmp) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        }
        let got = Instant::now();
        let request_line = head.lines().next().unwrap_or("").to_string();
        buf.drain(..head_end + len);
        let zero = header("x-bench-delay-us").as_deref() == Some("0");
        let t = if zero {
            Timing {
                delay: Duration::ZERO,
                ttft: Duration::ZERO,
                interval: Duration::ZERO,
            }
        } else {
            timing
        };
        if request_line.starts_with("get /v1/models") {
            let body = json!({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}).to_string();
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if sock.write_all(resp.as_bytes()).is_err() {
                return;
            }
            continue;
        }
        let Some(reply) = reply_for(&scripts, header("x-bench-client"), header("x-bench-turn"))
        else {
            let body =
                r#"{"error":{"message":"stub: no such turn","type":"invalid_request_error"}}"#;
            let resp = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if sock.write_all(resp.as_bytes()).is_err() {
                return;
            }
            continue;
        };
        if header("x-bench-stream").as_deref() == Some("1") {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";
            if sock.write_all(head.as_bytes()).is_err() {
                return;
            }
            let n = reply.sse.len();
            for (i, ev) in reply.sse.iter().enumerate() {
                // [DONE] goes right after the last chunk.
                let k = i.min(n - 2) as u32;
                sleep_until(got + t.ttft + t.interval * k);
                if write_chunk(&mut sock, ev, i + 1 == n).is_err() {
                    return;
                }
            }
        } else {
            sleep_until(got + t.delay);
            let mut resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                reply.plain.len()
            )
            .into_bytes();
            resp.extend_from_slice(&reply.plain);
            if sock.write_all(&resp).is_err() {
                return;
            }
        }
    }
}

/// The reply to turn `turn` of conversation `client` (0 when absent).
fn reply_for(
    scripts: &[Arc<Script>],
    client: Option<String>,
    turn: Option<String>,
) -> Option<&Reply> {
    let client = client.map_or(Some(0), |c| c.parse::<usize>().ok())?;
    let turn = turn?.parse::<usize>().ok()?;
    scripts.get(client)?.replies.get(turn)
}

/// Starts the stub answering `scripts` (by `x-bench-client`); returns its
/// base URL.
fn start_stub(scripts: Vec<Arc<Script>>, timing: Timing) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind the stub");
    let addr = l.local_addr().expect("stub address");
    let scripts = Arc::new(scripts);
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            s.set_nodelay(true).ok();
            let scripts = scripts.clone();
            // Named, so a profile tells the stub from the proxy and the clients.
            let _ = std::thread::Builder::new()
                .name("bench-stub".into())
                .spawn(move || serve_conn(s, scripts, timing));
        }
    });
    format!("http://{addr}/v1")
}

// ---------------------------------------------------------------------------
// The client.

struct Call {
    status: u16,
    /// Until the first byte of the body.
    first: Duration,
    /// Until the end of the body.
    total: Duration,
    body: Vec<u8>,
}

async fn call(
    client: &reqwest::Client,
    url: &str,
    body: Option<Vec<u8>>,
    headers: &[(&str, String)],
) -> Call {
    let t0 = Instant::now();
    let mut rb = match body {
        Some(b) => client
            .post(url)
            .header("content-type", "application/json")
            .body(b),
        None => client.get(url),
    };
    rb = rb.header("authorization", "Bearer sk-bench-not-a-key");
    for (k, v) in headers {
        rb = rb.header(*k, v.as_str());
    }
    let mut resp = rb
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = resp.status().as_u16();
    let mut first = None;
    let mut out = Vec::new();
    while let Some(c) = resp
        .chunk()
        .await
        .unwrap_or_else(|e| panic!("body of {url}: {e}"))
    {
        if first.is_none() {
            first = Some(t0.elapsed());
        }
        out.extend_from_slice(&c);
    }
    let total = t0.elapsed();
    Call {
        status,
        first: first.unwrap_or(total),
        total,
        body: out,
    }
}

// ---------------------------------------------------------------------------
// The bare pass-through baseline: the proxy's HTTP stack (a hyper HTTP/1
// server, the request body collected, forwarded by reqwest with the same
// headers left out, the response passed on chunk by chunk through a
// channel from a spawned task) with nothing parsed or recorded. What the
// proxy adds over it is the recording's share of the request path.

struct Bare {
    client: reqwest::Client,
    /// `http://ADDR` of the stub: paths pass through unchanged.
    upstream: String,
    /// Diagnostic (`--bare-burn-us`): a task that burns CPU per exchange.
    burn: Option<tokio::sync::mpsc::UnboundedSender<()>>,
}

struct LiveBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for LiveBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|o| o.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

async fn bare_handle(
    st: Arc<Bare>,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<LiveBody> {
    use http_body_util::BodyExt;
    use proxy::wire::is_hop_header;
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut rb = st
        .client
        .request(parts.method.clone(), format!("{}{path}", st.upstream));
    for (k, v) in &parts.headers {
        if is_hop_header(k.as_str()) || k == "accept-encoding" {
            continue;
        }
        rb = rb.header(k, v);
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let mut resp = match rb.body(body).send().await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bare pass-through: {e}");
            let mut r = hyper::Response::new(LiveBody(rx));
            *r.status_mut() = hyper::StatusCode::BAD_GATEWAY;
            return r;
        }
    };
    let mut out = hyper::Response::builder().status(resp.status());
    for (k, v) in resp.headers() {
        if !is_hop_header(k.as_str()) {
            out = out.header(k, v);
        }
    }
    let burn = st.burn.clone();
    tokio::spawn(async move {
        while let Ok(Some(c)) = resp.chunk().await {
            if tx.send(c).await.is_err() {
                break;
            }
        }
        // Queued before the client sees the end, as the proxy queues its
        // recording.
        if let Some(b) = burn {
            let _ = b.send(());
        }
        drop(tx);
    });
    out.body(LiveBody(rx)).expect("a response")
}

/// Starts the bare pass-through on its own runtime (as many workers as the
/// proxy's); returns the runtime and the client base URL.
fn start_bare(cfg: &Cfg, stub: &str) -> (tokio::runtime::Runtime, String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.workers)
        .enable_all()
        .build()
        .expect("bare runtime");
    let upstream = stub.trim_end_matches("/v1").to_string();
    let (burn_for, burn_on) = (cfg.bare_burn, cfg.bare_burn_on);
    let spin = move || {
        let t = Instant::now();
        while t.elapsed() < burn_for {
            std::hint::spin_loop();
        }
    };
    let base = rt.block_on(async move {
        let burn = (!burn_for.is_zero()).then(|| {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
            if burn_on == BurnOn::Thread {
                std::thread::spawn(move || {
                    while rx.blocking_recv().is_some() {
                        spin();
                    }
                });
            } else {
                tokio::spawn(async move {
                    while rx.recv().await.is_some() {
                        if burn_on == BurnOn::Yield {
                            tokio::task::yield_now().await;
                        }
                        spin();
                    }
                });
            }
            tx
        });
        let st = Arc::new(Bare {
            client: new_client(),
            upstream,
            burn,
        });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the bare pass-through");
        let addr = l.local_addr().expect("bare address");
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = l.accept().await else {
                    continue;
                };
                sock.set_nodelay(true).ok();
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(bare_handle(st, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                        .await;
                });
            }
        });
        format!("http://{addr}/v1")
    });
    (rt, base)
}

// ---------------------------------------------------------------------------
// One repetition: record a conversation through the proxy beside the direct
// path, then replay it beside a zero-delay stub.

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Sse,
}

impl Kind {
    fn stream(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Sse => "sse",
        }
    }
}

/// One call's (time to the first body byte, time to the end of the body).
type Times = (Duration, Duration);

/// One turn of the record phase: the times of each path.
struct Pair {
    req_bytes: usize,
    direct: Times,
    proxied: Times,
    bare: Times,
    /// The call just before the proxied one was proxied too.
    after_proxied: bool,
    /// The call just before the bare one was bare too.
    after_bare: bool,
}

const DIRECT: usize = 0;
const PROXIED: usize = 1;
const BARE: usize = 2;
/// The order of the three paths at turn `t` of rep `r`: `ORDERS[(t + r) % 6]`.
/// Every permutation once, each path once in each position, and each path
/// twice right after itself (across a turn boundary), so drift and what ran
/// just before cancel, and "right after itself" can be compared between B
/// (whose previous recording may still be running) and C.
const ORDERS: [[usize; 3]; 6] = [
    [DIRECT, BARE, PROXIED],
    [PROXIED, DIRECT, BARE],
    [BARE, PROXIED, DIRECT],
    [DIRECT, PROXIED, BARE],
    [BARE, DIRECT, PROXIED],
    [PROXIED, BARE, DIRECT],
];

struct RepOut {
    pairs: Vec<Pair>,
    /// (zero-delay stub, replay through the proxy): (first byte, total).
    replay: Vec<(Times, Times)>,
    finish_wait: Duration,
    book_open: Duration,
    mismatches: Vec<String>,
    requests: usize,
    raw_bytes: u64,
    ledger_bytes: u64,
    segment_bytes: u64,
}

fn runtimes(cfg: &Cfg) -> (tokio::runtime::Runtime, tokio::runtime::Runtime) {
    let proxy = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.workers)
        .thread_name("bench-proxy")
        .enable_all()
        .build()
        .expect("proxy runtime");
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    (proxy, client)
}

fn new_client() -> reqwest::Client {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .no_proxy()
        .build()
        .expect("HTTP client")
}

fn headers(t: usize, kind: Kind, zero: bool) -> Vec<(&'static str, String)> {
    let mut h = vec![
        ("x-bench-turn", t.to_string()),
        (
            "x-bench-stream",
            if kind == Kind::Sse { "1" } else { "0" }.into(),
        ),
    ];
    if zero {
        h.push(("x-bench-delay-us", "0".into()));
    }
    h
}

/// One repetition's plan.
struct Job<'a> {
    kind: Kind,
    turns: usize,
    rep: usize,
    /// A fresh ledger goes here.
    dir: &'a Path,
    /// Beside the direct path and the bare pass-through, with the stub's
    /// delays; otherwise the proxy alone with no delays (storage only).
    timed: bool,
}

/// Records `job.turns` turns of `job.kind` through a proxy into a fresh
/// ledger, then replays them; returns what was measured.
fn run_rep(cfg: &Cfg, script: &Script, stub: &str, job: Job<'_>) -> RepOut {
    let Job {
        kind,
        turns,
        rep,
        dir,
        timed,
    } = job;
    let ledger = Arc::new(ledger::Ledger::init(dir).expect("init the ledger"));
    let (prt, crt) = runtimes(cfg);
    let (server, route, base) = prt.block_on(async {
        let log = WireLog::open(ledger.clone(), RUN, kind.stream()).expect("open the wire log");
        let route = Arc::new(Route::record(log, Upstream::new(stub).expect("upstream")));
        let server = ProxyServer::bind("127.0.0.1:0".parse().expect("address"))
            .await
            .expect("bind the proxy");
        let base = server.set_default(route.clone());
        (server, route, base)
    });
    let (bare_rt, bare) = start_bare(cfg, stub);
    let client = new_client();
    let chat = |b: &str| format!("{b}/chat/completions");
    let urls = [chat(stub), chat(&base), chat(&bare)];
    let mut out = RepOut {
        pairs: Vec::new(),
        replay: Vec::new(),
        finish_wait: Duration::ZERO,
        book_open: Duration::ZERO,
        mismatches: Vec::new(),
        requests: 0,
        raw_bytes: 0,
        ledger_bytes: 0,
        segment_bytes: 0,
    };
    // Warm every connection (and the proxies' to the stub) with what a
    // client does first: list the models. The proxied one is recorded, and
    // replayed.
    crt.block_on(async {
        for b in [stub, base.as_str(), bare.as_str()] {
            let c = call(&client, &format!("{b}/models"), None, &[]).await;
            assert_eq!(c.status, 200, "GET {b}/models");
        }
    });
    let wire = Wire {
        crt: &crt,
        client: &client,
        urls: &urls,
        kind,
        rep,
        timed,
    };
    let recorded_bodies = record_turns(&wire, script, turns, &mut out);
    let tf = Instant::now();
    let head = prt
        .block_on(route.finish())
        .expect("the recording finishes");
    out.finish_wait = tf.elapsed();
    assert!(head.is_some(), "nothing was recorded");

    // Replay the recording, beside the cheapest answer the stub gives.
    let tb = Instant::now();
    let book = Book::open(ledger.clone(), RUN, kind.stream(), Normaliser::default())
        .expect("open the recording");
    out.book_open = tb.elapsed();
    let replay = Arc::new(Route::replay(book, None, None));
    server.set_default(replay.clone());
    let c = crt.block_on(call(&client, &format!("{base}/models"), None, &[]));
    assert_eq!(c.status, 200, "replayed GET /v1/models");
    replay_turns(&wire, script, &recorded_bodies, &mut out);
    let progress = replay.progress();
    if progress != Some((turns + 1, turns + 1)) || !replay.misses().is_empty() {
        out.mismatches.push(format!(
            "replay served {progress:?} of {} with misses {:?}",
            turns + 1,
            replay.misses()
        ));
    }
    // Close everything that holds the ledger, then measure it.
    drop(client);
    drop(crt);
    drop(server);
    drop((route, replay));
    drop(prt);
    drop(bare_rt);
    match Arc::try_unwrap(ledger) {
        Ok(l) => drop(l),
        Err(_) => panic!("the ledger is still shared after the proxy stopped"),
    }
    out.ledger_bytes = dir_size(dir);
    out.segment_bytes = dir_size(&dir.join("segments"));
    out
}

fn dir_size(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

// ---------------------------------------------------------------------------
// Statistics and printing.

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    if q == 0.5 && s.len().is_multiple_of(2) {
        let m = s.len() / 2;
        return (s[m - 1] + s[m]) / 2.0;
    }
    let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
    s[i]
}

fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

fn p90(v: &[f64]) -> f64 {
    quantile(v, 0.9)
}

fn row(label: &str, v: &[f64]) {
    println!(
        "  {label:<34} {:>9.0} {:>9.0} {:>9.0} {:>7}",
        median(v),
        p90(v),
        quantile(v, 0.0),
        v.len()
    );
}

fn header_row(first: &str) {
    println!(
        "  {first:<34} {:>9} {:>9} {:>9} {:>7}",
        "median", "p90", "min", "n"
    );
}

/// Prints the comparison of `base` and `other` (paired samples, in µs) and
/// returns (difference of medians, median of paired differences).
fn added(label: &str, base: &[f64], other: &[f64]) -> (f64, f64) {
    let diffs: Vec<f64> = base.iter().zip(other).map(|(b, o)| o - b).collect();
    let (mb, mo) = (median(base), median(other));
    let md = median(&diffs);
    println!(
        "  {label:<34} {:>9.0} µs of medians; paired: median {:.0} µs, p90 {:.0} µs; ratio {:.3}x",
        mo - mb,
        md,
        p90(&diffs),
        mo / mb
    );
    (mo - mb, md)
}

fn verdict(cfg: &Cfg, ok: bool) -> &'static str {
    if cfg.smoke {
        "n/a (smoke test)"
    } else if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// Prints one metric of the record phase for the three paths; returns
/// (median B - median A, median of the paired B - A).
fn three(title: &str, pairs: &[&Pair], at: fn(Times) -> Duration) -> (f64, f64) {
    let a: Vec<f64> = pairs.iter().map(|p| us(at(p.direct))).collect();
    let b: Vec<f64> = pairs.iter().map(|p| us(at(p.proxied))).collect();
    let c: Vec<f64> = pairs.iter().map(|p| us(at(p.bare))).collect();
    header_row(title);
    row("A direct to the stub", &a);
    row("B through the proxy, recording", &b);
    row("C bare pass-through (info)", &c);
    let r = added("B - A: added by the proxy", &a, &b);
    added("C - A: the HTTP hop alone", &a, &c);
    added("B - C: recording's share", &c, &b);
    r
}

fn total(x: Times) -> Duration {
    x.1
}

fn first(x: Times) -> Duration {
    x.0
}

fn report_plain(cfg: &Cfg, reps: &[RepOut]) -> (f64, f64) {
    let pairs: Vec<&Pair> = reps.iter().flat_map(|r| &r.pairs).collect();
    println!(
        "\n== non-streamed: {} requests per path ({} turns x {} reps), stub delay {:.2} ms; µs ==",
        pairs.len(),
        cfg.turns,
        reps.len(),
        cfg.delay.as_secs_f64() * 1e3
    );
    let (added_medians, added_paired) = three("latency (send to end of body)", &pairs, total);
    let per_rep: Vec<String> = reps
        .iter()
        .map(|r| {
            let d: Vec<f64> = r.pairs.iter().map(|p| us(p.direct.1)).collect();
            let p: Vec<f64> = r.pairs.iter().map(|p| us(p.proxied.1)).collect();
            format!("{:.0}", median(&p) - median(&d))
        })
        .collect();
    println!("  B - A per rep (medians): [{}]", per_rep.join(", "));
    // By conversation third: does the added latency grow with the request?
    let n = cfg.turns;
    let mut by_third = Vec::new();
    for (i, name) in ["first", "middle", "last"].iter().enumerate() {
        let (lo, hi) = (i * n / 3, (i + 1) * n / 3);
        let sel: Vec<&Pair> = reps.iter().flat_map(|r| &r.pairs[lo..hi]).collect();
        let kib =
            sel.iter().map(|p| p.req_bytes as f64).sum::<f64>() / sel.len().max(1) as f64 / 1024.0;
        let paired = |f: fn(&Pair) -> Times| {
            let diffs: Vec<f64> = sel.iter().map(|p| us(f(p).1) - us(p.direct.1)).collect();
            median(&diffs)
        };
        by_third.push(format!(
            "{name} third ({kib:.0} KiB): {:.0} / {:.0}",
            paired(|p| p.proxied),
            paired(|p| p.bare)
        ));
    }
    println!(
        "  paired B - A / C - A by request size: {}",
        by_third.join("; ")
    );
    let split = |f: fn(&Pair) -> (bool, Times), after: bool| -> f64 {
        let diffs: Vec<f64> = pairs
            .iter()
            .filter(|p| f(p).0 == after)
            .map(|p| us(f(p).1 .1) - us(p.direct.1))
            .collect();
        median(&diffs)
    };
    let b = |p: &Pair| (p.after_proxied, p.proxied);
    let c = |p: &Pair| (p.after_bare, p.bare);
    println!(
        "  paired B - A right after another B (its recording may still run): {:.0} µs, otherwise {:.0} µs; \
         C - A the same way: {:.0} / {:.0} µs",
        split(b, true),
        split(b, false),
        split(c, true),
        split(c, false)
    );
    print_recording(reps);
    print_replay(reps, false);
    let worst = added_medians.max(added_paired);
    println!(
        "verdict: median added latency {:.0} µs (paired {:.0} µs) vs goal < {:.0} µs: {} \
         (LiteLLM documents 3250 µs, Bifrost reports 440 µs)",
        added_medians,
        added_paired,
        GOAL_US,
        verdict(cfg, worst < GOAL_US)
    );
    (added_medians, added_paired)
}

fn print_recording(reps: &[RepOut]) {
    let waits: Vec<f64> = reps.iter().map(|r| us(r.finish_wait)).collect();
    let opens: Vec<f64> = reps.iter().map(|r| us(r.book_open)).collect();
    println!(
        "  recording: Route::finish waited {:.0} µs (median of reps) after the last response; \
         Book::open of the recording {:.0} µs",
        median(&waits),
        median(&opens)
    );
}

fn print_replay(reps: &[RepOut], sse: bool) {
    let pick = |f: fn(&(Times, Times)) -> Duration| -> Vec<f64> {
        reps.iter()
            .flat_map(|r| r.replay.iter().map(f))
            .map(us)
            .collect()
    };
    let b = pick(|x| x.0 .1);
    let r = pick(|x| x.1 .1);
    header_row("replay (no upstream), total");
    row("A zero-delay stub", &b);
    row("B replay through the proxy", &r);
    added("replay over the zero-delay stub", &b, &r);
    if sse {
        let b = pick(|x| x.0 .0);
        let r = pick(|x| x.1 .0);
        row("A zero-delay stub, first byte", &b);
        row("B replay, first byte", &r);
    }
}

fn report_sse(cfg: &Cfg, reps: &[RepOut]) -> (f64, f64) {
    let pairs: Vec<&Pair> = reps.iter().flat_map(|r| &r.pairs).collect();
    println!(
        "\n== streamed: {} requests per path ({} turns x {} reps), TTFT {:.1} ms then {} chunks every {:.1} ms; µs ==",
        pairs.len(),
        cfg.sse_turns,
        reps.len(),
        cfg.ttft.as_secs_f64() * 1e3,
        cfg.chunks,
        cfg.interval.as_secs_f64() * 1e3
    );
    let (ttft_m, ttft_p) = three("time to first body byte (TTFT)", &pairs, first);
    three("time to the end of the stream", &pairs, total);
    print_recording(reps);
    print_replay(reps, true);
    let worst = ttft_m.abs().max(ttft_p.abs());
    println!(
        "verdict: streaming TTFT changed by {:.0} µs (paired {:.0} µs) vs goal within {:.0} µs: {}",
        ttft_m,
        ttft_p,
        GOAL_US,
        verdict(cfg, worst < GOAL_US)
    );
    (ttft_m, ttft_p)
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the timespec we pass.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The recording's own cost, what the proxy does for every exchange after
/// passing it on: the non-streamed conversation recorded by
/// `WireLog::record` alone (no HTTP, one thread, a fresh ledger), beside
/// parsing the request body alone (`wire::ChatBody::parse`, the first thing
/// it does) as the baseline.
fn record_cost(cfg: &Cfg, script: &Script, stub: &str, root: &Path) {
    use proxy::log::{Exchange, HttpReply, Outcome, Timing as WireTiming};
    let dir = root.join("record-alone");
    let ledger = Arc::new(ledger::Ledger::init(&dir).expect("init the ledger"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut log = WireLog::open(ledger.clone(), RUN, "alone").expect("open the wire log");
    let (mut wall, mut cpu, mut parse, mut kib) = (vec![], vec![], vec![], vec![]);
    for t in 0..cfg.turns {
        let body = script.request(t, false);
        let reply = script.replies[t].plain.clone();
        let c0 = thread_cpu();
        let parsed = proxy::wire::ChatBody::parse(&body);
        parse.push(us(thread_cpu() - c0));
        assert!(parsed.is_some(), "the request parses");
        kib.push(body.len() as f64 / 1024.0);
        let ex = Exchange {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            body,
            user_agent: Some("bench".into()),
            outcome: Outcome::Http(HttpReply {
                status: 200,
                headers: vec![("content-type".into(), "application/json".into())],
                chunks: vec![reply.len()],
                body: reply,
                cut: None,
            }),
            timing: WireTiming::default(),
            served_by: stub.to_string(),
        };
        let (w0, c0) = (Instant::now(), thread_cpu());
        log.record(&ex).expect("record an exchange");
        cpu.push(us(thread_cpu() - c0));
        wall.push(us(w0.elapsed()));
    }
    drop((log, rt, ledger));
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "\n== the recording alone: {} non-streamed exchanges through WireLog::record on one thread; µs ==",
        cfg.turns
    );
    header_row("per exchange");
    row("wall (the commit's fsync included)", &wall);
    row("thread CPU", &cpu);
    row("baseline: parsing the request only", &parse);
    let n = cfg.turns;
    let thirds: Vec<String> = ["first", "middle", "last"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let (lo, hi) = (i * n / 3, (i + 1) * n / 3);
            format!(
                "{name} third ({:.0} KiB): {:.0} ({:.1}x parsing)",
                kib[lo..hi].iter().sum::<f64>() / (hi - lo).max(1) as f64,
                median(&cpu[lo..hi]),
                median(&cpu[lo..hi]) / median(&parse[lo..hi])
            )
        })
        .collect();
    println!("  CPU by request size: {}", thirds.join("; "));
}

/// gzip'd JSONL of the full exchanges, as a logging proxy writes them.
fn gzip_jsonl(script: &Script, kind: Kind, n: usize) -> u64 {
    use flate2::write::GzEncoder;
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    for t in 0..n {
        let req: Value = serde_json::from_slice(&script.request(t, kind == Kind::Sse))
            .expect("a request parses");
        let reply = &script.replies[t];
        let response = match kind {
            Kind::Plain => serde_json::from_slice::<Value>(&reply.plain).expect("a reply parses"),
            Kind::Sse => Value::String(String::from_utf8_lossy(&reply.sse.concat()).into_owned()),
        };
        let mut line = serde_json::to_vec(&json!({
            "id": format!("req-{t}"),
            "timestamp": format!("2024-06-01T12:00:{:02}Z", t % 60),
            "latency_ms": 2,
            "request": req,
            "response": response,
        }))
        .expect("serialise a log line");
        line.push(b'\n');
        gz.write_all(&line).expect("gzip");
    }
    gz.finish().expect("gzip").len() as u64
}

fn storage(cfg: &Cfg, script: &Script, stub: &str, root: &Path) {
    println!(
        "\n== storage: bytes per request (the ledger after close; raw = request + response bodies) =="
    );
    println!(
        "  {:<6} {:>5} {:>10} {:>12} {:>12} {:>12} {:>10} {:>11}",
        "kind",
        "turns",
        "raw B/req",
        "gz JSONL B/r",
        "ledger B/req",
        "segments B/r",
        "ledger/raw",
        "ledger/gz"
    );
    let mut sizes = vec![
        (Kind::Plain, cfg.turns / 4),
        (Kind::Plain, cfg.turns / 2),
        (Kind::Plain, cfg.turns),
    ];
    sizes.push((Kind::Sse, cfg.sse_turns));
    for (i, (kind, n)) in sizes.into_iter().enumerate() {
        let n = n.max(1);
        let dir = root.join(format!("storage-{i}"));
        let job = Job {
            kind,
            turns: n,
            rep: 0,
            dir: &dir,
            timed: false,
        };
        let r = run_rep(cfg, script, stub, job);
        assert!(r.mismatches.is_empty(), "{:?}", r.mismatches);
        let per = |b: u64| b as f64 / r.requests as f64;
        let gz = gzip_jsonl(script, kind, n);
        println!(
            "  {:<6} {:>5} {:>10.0} {:>12.0} {:>12.0} {:>12.0} {:>9.3}x {:>10.3}x",
            kind.stream(),
            n,
            per(r.raw_bytes),
            per(gz),
            per(r.ledger_bytes),
            per(r.segment_bytes),
            r.ledger_bytes as f64 / r.raw_bytes as f64,
            r.ledger_bytes as f64 / gz as f64
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!("  (raw and gzip'd JSONL grow with the conversation per request: quadratic in total; the ledger stores each message once)");
}

// ---------------------------------------------------------------------------
// Concurrent clients (`--clients=N`): N agent conversations at once, each
// streamed request paired direct (A) and through the recording proxy (B).

/// One client turn: the streamed request's times on each path.
struct ClientTurn {
    direct: Times,
    proxied: Times,
}

/// What the concurrent mode measured.
struct ClientsOut {
    turns: Vec<ClientTurn>,
    /// From the first client's first turn to the last one's last.
    wall: Duration,
    /// From the last client done to every route's recording durable.
    finish_wait: Duration,
    /// Exchanges found on the clients' streams in the reopened ledger.
    recorded: usize,
    /// The same clients with both paths going directly to the stub (no
    /// proxy, nothing recorded): what the pairing reads when nothing is
    /// added, at this load on this machine.
    null: Vec<ClientTurn>,
    /// The null run's wall time (as `wall`).
    null_wall: Duration,
}

/// Client `i`'s stream of the run, and its route (`/s/<route>/v1`).
fn client_stream(i: usize) -> (String, String) {
    (format!("client-{i:03}"), format!("c{i:03}"))
}

/// One recording route per client, as the proxy has one per rollout: each
/// records into its own stream (its own prefix chain and writer thread).
/// Returns the server, the routes and each client's base URL.
async fn client_routes(
    ledger: &Arc<ledger::Ledger>,
    stub: &str,
    n: usize,
) -> (ProxyServer, Vec<Arc<Route>>, Vec<String>) {
    let server = ProxyServer::bind("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("bind the proxy");
    let (mut routes, mut bases) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let (stream, name) = client_stream(i);
        let log = WireLog::open(ledger.clone(), RUN, &stream).expect("open the wire log");
        let route = Arc::new(Route::record(log, Upstream::new(stub).expect("upstream")));
        bases.push(server.add(&name, route.clone()));
        routes.push(route);
    }
    (server, routes, bases)
}

/// One client of the concurrent mode: its own HTTP client (its own
/// keep-alive connections, as an agent process has), the models listed on
/// both paths, then, once every client is ready and after its `offset`,
/// its turns, each request sent directly (`urls[0]`) and through its route
/// (`urls[1]`) in an order alternating by turn and client. Panics on a
/// status other than 200 or a body other than the stub's.
async fn agent(
    i: usize,
    script: Arc<Script>,
    urls: [String; 2],
    turns: usize,
    start: (Arc<tokio::sync::Barrier>, Duration),
) -> (Instant, Instant, Vec<ClientTurn>) {
    let client = new_client();
    for u in &urls {
        let c = call(&client, &format!("{u}/models"), None, &[]).await;
        assert_eq!(c.status, 200, "client {i}: GET {u}/models");
    }
    start.0.wait().await;
    tokio::time::sleep(start.1).await;
    let began = Instant::now();
    let mut out = Vec::with_capacity(turns);
    for t in 0..turns {
        let body = script.request(t, true);
        let mut h = headers(t, Kind::Sse, false);
        h.push(("x-bench-client", i.to_string()));
        let proxied_first = (t + i) % 2 == 1;
        let mut got: [Option<Call>; 2] = [None, None];
        for p in [proxied_first, !proxied_first] {
            let url = format!("{}/chat/completions", urls[p as usize]);
            got[p as usize] = Some(call(&client, &url, Some(body.clone()), &h).await);
        }
        let [Some(d), Some(p)] = got else {
            unreachable!("both paths were called")
        };
        let want = script.replies[t].sse.concat();
        assert!(
            d.status == 200 && d.body == want,
            "client {i}, turn {t}: the direct answer (status {}) is not the stub's",
            d.status
        );
        assert!(
            p.status == 200 && p.body == d.body,
            "client {i}, turn {t}: the proxied body (status {}) differs from the direct one: {}",
            p.status,
            String::from_utf8_lossy(&p.body[..p.body.len().min(300)])
        );
        out.push(ClientTurn {
            direct: (d.first, d.total),
            proxied: (p.first, p.total),
        });
    }
    (began, Instant::now(), out)
}

/// Runs the clients on a multi-threaded runtime (one task each); returns
/// each client's (first turn sent, last turn done, turns).
fn drive_clients(
    cfg: &Cfg,
    scripts: &[Arc<Script>],
    stub: &str,
    bases: &[String],
) -> Vec<(Instant, Instant, Vec<ClientTurn>)> {
    let n = scripts.len();
    let crt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores().max(2))
        .thread_name("bench-client")
        .enable_all()
        .build()
        .expect("client runtime");
    // Spread the starts over one stream's length: agents are not in step.
    let stream_time = cfg.ttft + cfg.interval * cfg.chunks as u32;
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    crt.block_on(async {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let urls = [stub.to_string(), bases[i].clone()];
                let offset = stream_time * i as u32 / n as u32;
                let start = (barrier.clone(), offset);
                tokio::spawn(agent(i, scripts[i].clone(), urls, cfg.clients_turns, start))
            })
            .collect();
        let mut out = Vec::with_capacity(n);
        for (i, t) in tasks.into_iter().enumerate() {
            match t.await {
                Ok(r) => out.push(r),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("client {i} did not finish: {e}"),
            }
        }
        out
    })
}

/// The concurrent mode: `cfg.clients` conversations of `cfg.clients_turns`
/// streamed turns at once against a stub of their own, through one proxy
/// recording every client into its own stream of a fresh ledger; then the
/// ledger is closed, reopened and checked (`check_recording`).
fn run_clients(cfg: &Cfg, base: &Script, root: &Path) -> ClientsOut {
    let n = cfg.clients;
    let scripts: Vec<Arc<Script>> = (0..n)
        .map(|i| Arc::new(Script::for_client(base, i, cfg.clients_turns, cfg.chunks)))
        .collect();
    let stub = start_stub(scripts.clone(), timing(cfg));
    // The null run first: the same load with "B" sent straight to the stub.
    let null_runs = drive_clients(cfg, &scripts, &stub, &vec![stub.clone(); n]);
    let null_wall = span(&null_runs);
    let null = null_runs.into_iter().flat_map(|r| r.2).collect();
    let dir = root.join("clients");
    let ledger = Arc::new(ledger::Ledger::init(&dir).expect("init the ledger"));
    let (prt, _) = runtimes(cfg);
    let (server, routes, bases) = prt.block_on(client_routes(&ledger, &stub, n));
    let runs = drive_clients(cfg, &scripts, &stub, &bases);
    let tf = Instant::now();
    prt.block_on(async {
        for (i, r) in routes.iter().enumerate() {
            let head = r.finish().await.expect("a client's recording finishes");
            assert!(head.is_some(), "client {i}: nothing was recorded");
            let lost = r.unrecorded();
            assert!(lost.is_empty(), "client {i}: not recorded: {lost:?}");
        }
    });
    let finish_wait = tf.elapsed();
    drop(server);
    drop(routes);
    drop(prt);
    match Arc::try_unwrap(ledger) {
        Ok(l) => drop(l),
        Err(_) => panic!("the ledger is still shared after the proxy stopped"),
    }
    let recorded = check_recording(&dir, &scripts, cfg.clients_turns);
    let _ = std::fs::remove_dir_all(&dir);
    ClientsOut {
        wall: span(&runs),
        turns: runs.into_iter().flat_map(|r| r.2).collect(),
        finish_wait,
        recorded,
        null,
        null_wall,
    }
}

/// From the first client's first turn to the last one's last.
fn span(runs: &[(Instant, Instant, Vec<ClientTurn>)]) -> Duration {
    let first = runs.iter().map(|r| r.0).min().expect("a client");
    let last = runs.iter().map(|r| r.1).max().expect("a client");
    last - first
}

/// Reopens the concurrent run's ledger and checks every client's stream:
/// the models listing, then each turn in order, each turn's prefix the
/// turn before (chains per client), each recorded body byte-equal to the
/// stub's (the direct) one. Panics otherwise; returns the exchanges found.
fn check_recording(dir: &Path, scripts: &[Arc<Script>], turns: usize) -> usize {
    use proxy::log::RecordedOutcome;
    let ledger = ledger::Ledger::open(dir).expect("reopen the ledger");
    let mut found = 0;
    for (i, script) in scripts.iter().enumerate() {
        let (stream, _) = client_stream(i);
        let recorded = proxy::log::load(&ledger, RUN, &stream)
            .unwrap_or_else(|e| panic!("read stream {stream}: {e}"));
        assert_eq!(
            recorded.len(),
            turns + 1,
            "stream {stream}: exchanges recorded, against the models listing and {turns} turns made"
        );
        let chats: Vec<_> = recorded.iter().filter(|r| r.is_chat()).collect();
        assert_eq!(chats.len(), turns, "stream {stream}: chat exchanges");
        for (t, r) in chats.iter().enumerate() {
            let prev = t.checked_sub(1).map(|p| chats[p].event);
            assert_eq!(r.prefix(), prev, "stream {stream}, turn {t}: prefix");
            let body = match &r.reply {
                RecordedOutcome::Http {
                    status: 200,
                    body: Some(id),
                    cut: None,
                    ..
                } => ledger
                    .get_blob(id)
                    .unwrap_or_else(|e| panic!("stream {stream}, turn {t}: body: {e}")),
                other => panic!("stream {stream}, turn {t}: recorded {other:?}"),
            };
            assert!(
                body == script.replies[t].sse.concat(),
                "stream {stream}, turn {t}: the recorded body differs from the direct one"
            );
        }
        found += recorded.len();
    }
    found
}

fn qrow(label: &str, v: &[f64]) {
    println!(
        "  {label:<34} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>7}",
        median(v),
        p90(v),
        quantile(v, 0.99),
        quantile(v, 1.0),
        v.len()
    );
}

/// Prints the concurrent mode's table and verdicts; returns its figures
/// for `target/bench/proxy.json`.
fn report_clients(cfg: &Cfg, out: &ClientsOut) -> Value {
    let pick = |f: fn(&ClientTurn) -> Duration| -> Vec<f64> {
        out.turns.iter().map(|c| us(f(c))).collect()
    };
    let (a1, b1) = (pick(|c| c.direct.0), pick(|c| c.proxied.0));
    let (a2, b2) = (pick(|c| c.direct.1), pick(|c| c.proxied.1));
    let diff = |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| y - x).collect() };
    let (d1, d2) = (diff(&a1, &b1), diff(&a2, &b2));
    println!(
        "\n== concurrent: {} clients at once x {} streamed turns ({} requests per path), \
         TTFT {:.1} ms then {} chunks every {:.1} ms; µs ==",
        cfg.clients,
        cfg.clients_turns,
        out.turns.len(),
        cfg.ttft.as_secs_f64() * 1e3,
        cfg.chunks,
        cfg.interval.as_secs_f64() * 1e3
    );
    for (title, a, b, d) in [
        ("time to first body byte (TTFT)", &a1, &b1, &d1),
        ("time to the end of the stream", &a2, &b2, &d2),
    ] {
        println!(
            "  {title:<34} {:>9} {:>9} {:>9} {:>9} {:>7}",
            "p50", "p90", "p99", "max", "n"
        );
        qrow("A direct to the stub", a);
        qrow("B through the proxy, recording", b);
        qrow("B - A paired: added by the proxy", d);
    }
    let null_d1: Vec<f64> = out
        .null
        .iter()
        .map(|c| us(c.proxied.0) - us(c.direct.0))
        .collect();
    qrow("null run, TTFT: direct - direct", &null_d1);
    println!(
        "  (null run: the same clients with both paths straight to the stub, wall {:.2} s: \
         what the pairing reads at this load when nothing is added)",
        out.null_wall.as_secs_f64()
    );
    println!(
        "  wall {:.2} s; every route's recording durable {:.0} ms after the last client finished; \
         the reopened ledger holds {} exchanges on {} streams (models + turns each), every \
         recorded and proxied body byte-equal to the direct one",
        out.wall.as_secs_f64(),
        out.finish_wait.as_secs_f64() * 1e3,
        out.recorded,
        cfg.clients
    );
    let (p50, p99) = (median(&d1), quantile(&d1, 0.99));
    println!(
        "verdict: added TTFT with {} concurrent streaming clients p50 {p50:.0} µs vs goal <= {:.0} µs: {}; \
         p99 {p99:.0} µs vs goal <= {:.0} µs: {}",
        cfg.clients,
        CLIENTS_GOAL_P50_US,
        verdict(cfg, p50 <= CLIENTS_GOAL_P50_US),
        CLIENTS_GOAL_P99_US,
        verdict(cfg, p99 <= CLIENTS_GOAL_P99_US)
    );
    json!({
        "clients": cfg.clients,
        "turns": cfg.clients_turns,
        "requests": out.turns.len(),
        "added_ttft_p50_us": p50,
        "added_ttft_p90_us": p90(&d1),
        "added_ttft_p99_us": p99,
        "added_total_p50_us": median(&d2),
        "added_total_p99_us": quantile(&d2, 0.99),
        "direct_ttft_p50_us": median(&a1),
        "direct_ttft_p99_us": quantile(&a1, 0.99),
        "proxied_ttft_p50_us": median(&b1),
        "proxied_ttft_p99_us": quantile(&b1, 0.99),
        "null_ttft_p50_us": median(&null_d1),
        "null_ttft_p99_us": quantile(&null_d1, 0.99),
        "null_wall_s": out.null_wall.as_secs_f64(),
        "wall_s": out.wall.as_secs_f64(),
    })
}

fn main() {
    let cfg = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let tmp = match &cfg.dir {
        Some(d) => {
            std::fs::create_dir_all(d).expect("create --dir");
            tempfile::tempdir_in(d).expect("tempdir")
        }
        None => tempfile::tempdir().expect("tempdir"),
    };
    let root = tmp.path().to_path_buf();
    let script = Arc::new(Script::new(cfg.turns.max(cfg.sse_turns), cfg.chunks));
    let stub = start_stub(vec![script.clone()], timing(&cfg));
    let size = |t: usize| script.request(t, false).len() as f64 / 1024.0;
    println!(
        "proxy benchmark{}: requests {:.0} KiB .. {:.0} KiB over {} turns; proxy runtime {} workers on {} cores; ledgers under {}",
        if cfg.smoke { " (smoke test: run `cargo bench --bench proxy` to measure)" } else { "" },
        size(0),
        size(cfg.turns - 1),
        cfg.turns,
        cfg.workers,
        cores(),
        root.display()
    );
    let mut all_ok = true;
    let mut figures = serde_json::Map::new();
    for (kind, turns, reps) in [
        (Kind::Plain, cfg.turns, cfg.reps),
        (Kind::Sse, cfg.sse_turns, cfg.sse_reps),
    ] {
        let outs: Vec<RepOut> = (0..reps)
            .map(|rep| {
                let dir = root.join(format!("{}-{rep}", kind.stream()));
                let job = Job {
                    kind,
                    turns,
                    rep,
                    dir: &dir,
                    timed: true,
                };
                let r = run_rep(&cfg, &script, &stub, job);
                let _ = std::fs::remove_dir_all(&dir);
                r
            })
            .collect();
        for m in outs.iter().flat_map(|r| &r.mismatches) {
            all_ok = false;
            eprintln!("MISMATCH: {m}");
        }
        let (name, at): (&str, fn(Times) -> Duration) = match kind {
            Kind::Plain => ("plain", total),
            Kind::Sse => ("streamed", first),
        };
        figures.insert(name.into(), summary(&outs, at));
        match kind {
            Kind::Plain => report_plain(&cfg, &outs),
            Kind::Sse => report_sse(&cfg, &outs),
        };
    }
    record_cost(&cfg, &script, &stub, &root);
    storage(&cfg, &script, &stub, &root);
    let concurrent =
        (cfg.clients > 0).then(|| report_clients(&cfg, &run_clients(&cfg, &script, &root)));
    println!(
        "\nevery proxied and replayed body byte-equal to the direct one: {} (total {:.1} s)",
        if all_ok { "yes" } else { "NO" },
        started.elapsed().as_secs_f64()
    );
    if !cfg.smoke {
        let doc = serde_json::json!({
            "turns": cfg.turns,
            "sse_turns": cfg.sse_turns,
            "reps": cfg.reps,
            "sse_reps": cfg.sse_reps,
            "workers": cfg.workers,
            "cores": cores(),
            "plain": figures.remove("plain"),
            "streamed": figures.remove("streamed"),
            "bodies_equal": all_ok,
            "concurrent": concurrent,
        });
        if let Some(p) = report::write("proxy", &doc) {
            println!("figures: {}", p.display());
        }
    }
    if !all_ok {
        std::process::exit(1);
    }
}

/// The figures of one kind of request for `target/bench/proxy.json`.
fn summary(outs: &[RepOut], at: fn(Times) -> Duration) -> serde_json::Value {
    let pairs: Vec<&Pair> = outs.iter().flat_map(|r| &r.pairs).collect();
    let pick = |f: fn(&Pair) -> Times| -> Vec<f64> { pairs.iter().map(|p| us(at(f(p)))).collect() };
    let (a, b, c) = (pick(|p| p.direct), pick(|p| p.proxied), pick(|p| p.bare));
    let diffs: Vec<f64> = a.iter().zip(&b).map(|(x, y)| y - x).collect();
    serde_json::json!({
        "requests": pairs.len(),
        "direct_p50_us": median(&a),
        "direct_p99_us": quantile(&a, 0.99),
        "proxied_p50_us": median(&b),
        "proxied_p99_us": quantile(&b, 0.99),
        "bare_p50_us": median(&c),
        "added_paired_p50_us": median(&diffs),
        "added_paired_p99_us": quantile(&diffs, 0.99),
    })
}

/// What one repetition's turns go through: the client's runtime and
/// client, the three URLs (direct, proxied, bare), and the job's shape.
#[derive(Clone, Copy)]
struct Wire<'a> {
    crt: &'a tokio::runtime::Runtime,
    client: &'a reqwest::Client,
    urls: &'a [String; 3],
    kind: Kind,
    rep: usize,
    timed: bool,
}

/// Every turn sent on each path in this repetition's order (only through
/// the recording proxy when untimed); the proxied bodies, as recorded.
fn record_turns(w: &Wire<'_>, script: &Script, turns: usize, out: &mut RepOut) -> Vec<Vec<u8>> {
    let Wire {
        crt,
        client,
        urls,
        kind,
        rep,
        timed,
    } = *w;
    let mut recorded_bodies = Vec::with_capacity(turns);
    let mut prev = None;
    for t in 0..turns {
        let body = script.request(t, kind == Kind::Sse);
        out.requests += 1;
        out.raw_bytes += body.len() as u64;
        let h = headers(t, kind, !timed);
        let mut calls: [Option<Call>; 3] = [None, None, None];
        let mut after_self = [false; 3];
        for path in ORDERS[(t + rep) % ORDERS.len()] {
            if !timed && path != PROXIED {
                continue;
            }
            let url = &urls[path];
            let c = crt.block_on(call(client, url, Some(body.clone()), &h));
            after_self[path] = prev == Some(path);
            prev = Some(path);
            if c.status != 200 {
                out.mismatches.push(format!(
                    "turn {t}: status {} from {url}: {}",
                    c.status,
                    String::from_utf8_lossy(&c.body)
                ));
            }
            calls[path] = Some(c);
        }
        let [d, p, b] = calls;
        let p = p.expect("the proxied call");
        out.raw_bytes += p.body.len() as u64;
        if let (Some(d), Some(b)) = (d, b) {
            if d.body != p.body || d.body != b.body {
                out.mismatches.push(format!(
                    "turn {t}: the proxied or passed-through body differs from the direct one"
                ));
            }
            out.pairs.push(Pair {
                req_bytes: body.len(),
                direct: (d.first, d.total),
                proxied: (p.first, p.total),
                bare: (b.first, b.total),
                after_proxied: after_self[PROXIED],
                after_bare: after_self[BARE],
            });
        }
        recorded_bodies.push(p.body);
    }
    recorded_bodies
}

/// Every recorded turn asked again of the replaying proxy (beside the
/// zero-delay stub when timed); a replayed answer must equal the recorded one.
fn replay_turns(w: &Wire<'_>, script: &Script, recorded_bodies: &[Vec<u8>], out: &mut RepOut) {
    let Wire {
        crt,
        client,
        urls,
        kind,
        rep,
        timed,
    } = *w;
    let (direct_url, proxy_url) = (&urls[DIRECT], &urls[PROXIED]);
    for (t, recorded) in recorded_bodies.iter().enumerate() {
        let body = script.request(t, kind == Kind::Sse);
        let replay_first = (t + rep) % 2 == 1;
        let h = headers(t, kind, true);
        let (mut b, mut r) = (None, None);
        for replayed in [replay_first, !replay_first] {
            if !timed && !replayed {
                continue;
            }
            let url = if replayed { proxy_url } else { direct_url };
            let c = crt.block_on(call(client, url, Some(body.clone()), &h));
            if replayed {
                if c.status != 200 || &c.body != recorded {
                    out.mismatches.push(format!(
                        "turn {t}: the replayed answer (status {}) differs from the recorded one: {}",
                        c.status,
                        String::from_utf8_lossy(&c.body[..c.body.len().min(300)])
                    ));
                }
                r = Some((c.first, c.total));
            } else {
                b = Some((c.first, c.total));
            }
        }
        if let (Some(b), Some(r)) = (b, r) {
            out.replay.push((b, r));
        }
    }
}
