//! Orchestration throughput: how close the engine comes to the call rate a
//! model server allows when hundreds of rollouts wait on it at once.
//!
//! A local OpenAI-compatible stub answers every chat completion after a
//! fixed delay (100 ms: a server's latency, not its throughput). Each
//! rollout is the real harness (`engine::harness::run_team`) on a real
//! ledger: `calls` model calls, each answered with a small tool call
//! (`read_file`, or `write_file` every fourth turn, which snapshots the
//! workspace), then `finish` and the task's check. All rollouts run at once
//! as async units (`engine::exec::all`), through one `OpenAiBackend`.
//!
//! Printed per size, from the same run:
//! - the ideal call rate (every rollout's calls back to back, nothing else:
//!   rollouts x calls / (calls x delay)) and the achieved rate, as a ratio;
//! - a transport-only baseline: the same number of concurrent loops calling
//!   the stub through the same HTTP client with no engine and no ledger, so
//!   the ratio engine/transport isolates what the engine adds;
//! - process CPU per call (user + system, stub included) for both, then
//!   the stub's own share of it (its thread's CPU clock: the stub stands in
//!   for a model server, which is another process in a real run). An
//!   approximation either way: loopback delivery runs on the sending
//!   thread, so the kernel's work for the stub's sockets is partly on the
//!   client's threads and the client's partly on the stub's. And with
//!   `--ledger-share` the share of the engine run's CPU spent in ledger work
//!   (`exec::ledger_cpu`: thread CPU time of stream and blob operations,
//!   i.e. encoding, hashing, compression, index updates and write/fsync
//!   system calls; measuring costs two system calls per ledger call, so it
//!   is off by default and the column shows `-`);
//! - peak resident memory of each phase (VmHWM, reset between phases);
//! - where the wall time beyond the ideal goes, from the stub's clock: by
//!   when every rollout's first call had arrived (`first calls in`), the
//!   mean time from one turn's last call arriving to the next turn's
//!   (`turn cycle`: the stub's delay plus what the slowest rollout of the
//!   turn took between its reply and its next call, waiting for the CPU
//!   included), and how long after the last rollout's last reply the run
//!   ended (`tail`: the rollouts' final steps, the checks among them). The
//!   wall time is about `first + (calls - 1) x cycle + delay + tail`. All
//!   rollouts start at once and the stub answers each call after the same
//!   delay, so the rollouts' replies come in bursts: a turn's cycle grows
//!   with the CPU that a burst of replies needs, and fixed costs per rollout
//!   (a workspace made, a check run) show in the first phase and the tail,
//!   not in the calls' own latency.
//!
//! Medians over repetitions.
//!
//!     cargo bench --bench orchestration             # 256 and 1024 rollouts, 3 repetitions
//!     cargo bench --bench orchestration -- --quick  # 64 and 256 rollouts, 1 repetition
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it is a smoke
//! run: 16 rollouts, once, nothing written.
//!     cargo bench --bench orchestration -- --sizes=256 --reps=1 --level=full  # checks confined
//!     TMPDIR=/dev/shm cargo bench --bench orchestration -- --dir=/var/tmp/orch  # workspaces in memory, ledgers on disk
//!
//! `--dir=PATH` is where the ledgers go (a temporary directory by default);
//! rollouts' workspaces and check copies go to the process's scratch root
//! in the system temp dir (`TMPDIR`), so the two can be put apart: on an
//! ext4 without a journal (as on the 2-core machines here) creating files
//! costs far more CPU after many deletions (the inode allocator's
//! `recently_deleted` scan), which a workspace in memory does not pay.
//!
//! The figures are also written to `target/bench/orchestration.json`:
//! `{"calls_per_rollout", "delay_ms", "level", "reps", "ledger_dir", "scratch_dir",
//! "cores", "rows": [{"rollouts",
//! "ideal", "transport", "engine", "vs_ideal", "vs_transport", "cpu_ms_per_call",
//! "transport_cpu_ms_per_call", "ledger_share", "peak_mib", "transport_peak_mib",
//! "first_calls_ms", "transport_first_calls_ms", "cycle_ms", "transport_cycle_ms",
//! "tail_ms", "transport_tail_ms",
//! "stub_cpu_ms_per_call", "transport_stub_cpu_ms_per_call"}]}`:
//! `ideal`, `transport` and `engine` in calls per second, `vs_*` their
//! ratios, `cpu_ms_per_call` the engine run's process CPU per call (the
//! transport's beside it), `ledger_share` the fraction of the engine run's
//! CPU in ledger work (`null` without `--ledger-share`), peaks in MiB,
//! `*first_calls_ms`, `*cycle_ms` and `*tail_ms` the phases above in
//! milliseconds,
//! `*stub_cpu_ms_per_call` the stub thread's CPU per call of each run;
//! medians over the repetitions.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::backend::openai::OpenAiBackend;
use engine::backend::Backend;
use engine::config::{OpenAiParams, StructuredOutput};
use engine::harness::{run_team, RunRules, RunSpec, Team};
use engine::task::Task;
use engine::workflow::Workflow;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "common/report.rs"]
mod report;

// The allocator `mass` runs with, so the bench measures it.
#[path = "../src/alloc.rs"]
mod alloc;

struct Cfg {
    /// Run by `cargo test --all-targets` (no `--bench` argument): a smoke
    /// run at a small size that checks the bench works and writes nothing.
    smoke: bool,
    sizes: Vec<usize>,
    /// How every command (the rollout's check) is confined.
    level: sandbox::Level,
    calls: usize,
    delay: Duration,
    reps: usize,
    /// Where the ledgers go (`None`: the bench's temporary directory).
    dir: Option<PathBuf>,
    /// Measure the ledger's share of the CPU (`--ledger-share`; costs two
    /// system calls per ledger call, so off unless asked for).
    ledger_share: bool,
}

fn parse_args() -> Cfg {
    let smoke = !std::env::args().skip(1).any(|a| a == "--bench");
    let mut cfg = Cfg {
        smoke,
        sizes: if smoke { vec![16] } else { vec![256, 1024] },
        level: sandbox::Level::None,
        calls: 20,
        delay: Duration::from_millis(100),
        reps: if smoke { 1 } else { 3 },
        dir: None,
        ledger_share: smoke,
    };
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--quick" => {
                cfg.sizes = vec![64, 256];
                cfg.reps = 1;
            }
            "--bench" => {}
            "--ledger-share" => cfg.ledger_share = true,
            other if other.starts_with("--reps=") => {
                cfg.reps = other[7..].parse().unwrap_or(cfg.reps).max(1);
            }
            other if other.starts_with("--dir=") => cfg.dir = Some(PathBuf::from(&other[6..])),
            "--level=full" => cfg.level = sandbox::Level::Full,
            "--level=landlock" => cfg.level = sandbox::Level::Landlock,
            "--level=none" => cfg.level = sandbox::Level::None,
            other if other.starts_with("--sizes=") => {
                cfg.sizes = other[8..]
                    .split(',')
                    .filter_map(|s| s.parse().ok())
                    .collect();
            }
            _ => {}
        }
    }
    cfg
}

// ---------------------------------------------------------------------------
// The stub server: HTTP/1.1 with keep-alive, one task per connection.

/// When the stub saw each call arrive, with its turn, and wrote each
/// rollout's last reply (the `finish` turn), for the phase columns. One
/// phase runs at a time; `timeline_reset` starts one.
static TIMELINE: std::sync::Mutex<(Vec<Arrival>, Vec<Instant>)> =
    std::sync::Mutex::new((Vec::new(), Vec::new()));

/// A call's turn, and when the stub had read it.
type Arrival = (usize, Instant);

/// Where a run's wall time beyond the ideal goes, from the stub's clock
/// (milliseconds).
#[derive(Clone, Copy)]
struct Phases {
    /// From the start until every rollout's first call had arrived.
    first: f64,
    /// From one turn's last call arriving to the next turn's, averaged
    /// over the turns: the stub's delay plus what the slowest rollout of
    /// each turn took between its reply and its next call, queueing for
    /// the CPU included.
    cycle: f64,
    /// The shortest turn's cycle: never under the stub's delay, since the
    /// rollout whose call ended one turn waited for that call's reply
    /// before making its next.
    min_cycle: f64,
    /// From the last rollout's last reply until the run ended.
    tail: f64,
}

impl Phases {
    /// Checks what the smoke run can know for certain: no turn's cycle is
    /// shorter than the stub's delay, and the phases add up to no more
    /// than the wall time (the last reply left at least `delay` after the
    /// last call came in). A miscounted turn, or a phase counted twice,
    /// fails here.
    fn check(&self, what: &str, calls: usize, delay: Duration, wall: Duration) {
        let (delay, wall) = (delay.as_secs_f64() * 1e3, wall.as_secs_f64() * 1e3);
        assert!(
            self.min_cycle >= delay - 0.5,
            "{what}: a turn cycle of {:.1} ms, under the stub's delay of {delay} ms",
            self.min_cycle
        );
        let sum = self.first + (calls - 1) as f64 * self.cycle + delay + self.tail;
        assert!(
            sum <= wall + 1.0,
            "{what}: the phases add up to {sum:.1} ms, over the wall time of {wall:.1} ms"
        );
    }
}

fn timeline_reset() {
    let mut t = TIMELINE.lock().unwrap_or_else(|e| e.into_inner());
    t.0.clear();
    t.1.clear();
}

/// The run's [`Phases`], `t0` and `end` being its start and end.
fn timeline_phases(t0: Instant, end: Instant) -> Phases {
    let t = TIMELINE.lock().unwrap_or_else(|e| e.into_inner());
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    // The last arrival of each turn.
    let mut last: Vec<Option<Instant>> = Vec::new();
    for &(turn, at) in &t.0 {
        if last.len() <= turn {
            last.resize(turn + 1, None);
        }
        last[turn] = Some(last[turn].map_or(at, |l| l.max(at)));
    }
    let first = last
        .first()
        .copied()
        .flatten()
        .map_or(f64::NAN, |i| ms(i.duration_since(t0)));
    let cycles: Vec<f64> = last
        .windows(2)
        .filter_map(|w| Some(ms(w[1]?.duration_since(w[0]?))))
        .collect();
    let cycle = cycles.iter().sum::<f64>() / cycles.len() as f64;
    let min_cycle = cycles.iter().copied().fold(f64::INFINITY, f64::min);
    let tail =
        t.1.iter()
            .max()
            .map_or(f64::NAN, |i| ms(end.duration_since(*i)));
    Phases {
        first,
        cycle,
        min_cycle,
        tail,
    }
}

/// What the stub answers at turn `t` (the number of assistant messages so
/// far in the request) of a rollout of `calls` calls.
fn reply_for(t: usize, calls: usize) -> String {
    let (name, args) = if t + 1 >= calls {
        ("finish", r#"{"report": "done: see notes"}"#.to_string())
    } else if t % 4 == 3 {
        (
            "write_file",
            format!(r#"{{"path": "notes/{t}.md", "content": "step {t}: checked the data\n"}}"#),
        )
    } else {
        ("read_file", r#"{"path": "data.txt"}"#.to_string())
    };
    let body = serde_json::json!({
        "id": format!("chatcmpl-{t}"),
        "object": "chat.completion",
        "choices": [{
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": format!("call_{t}"),
                    "type": "function",
                    "function": {"name": name, "arguments": args}
                }]
            }
        }],
        "usage": {"prompt_tokens": 200 + 40 * t, "completion_tokens": 24}
    });
    body.to_string()
}

/// Reads straight into the connection's one buffer: a read buffer kept on
/// the future (as a 64 KiB array was) made each of 1,024 connections hold
/// 72 KiB more, which the peak memory column charged to the engine.
async fn serve_conn(mut sock: tokio::net::TcpStream, calls: usize, delay: Duration) {
    let mut buf = Vec::with_capacity(16 * 1024);
    loop {
        // Headers.
        let header_end = loop {
            if let Some(p) = find(&buf, b"\r\n\r\n") {
                break p + 4;
            }
            buf.reserve(8192);
            if !matches!(sock.read_buf(&mut buf).await, Ok(n) if n > 0) {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..header_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < header_end + len {
            buf.reserve(header_end + len - buf.len());
            if !matches!(sock.read_buf(&mut buf).await, Ok(n) if n > 0) {
                return;
            }
        }
        // The turn is the number of assistant messages so far; counted
        // without parsing the whole conversation, so the stub's own CPU
        // stays small beside the engine's.
        let turn = count(&buf[header_end..header_end + len], br#""role":"assistant""#);
        buf.drain(..header_end + len);
        TIMELINE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .push((turn, Instant::now()));
        tokio::time::sleep(delay).await;
        let reply = reply_for(turn, calls);
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{}",
            reply.len(),
            reply
        );
        if sock.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        if turn + 1 >= calls {
            TIMELINE
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .1
                .push(Instant::now());
        }
    }
}

// The stub's CPU is in both columns' CPU per call, so it searches with
// `memchr::memmem` (a window-by-window compare was ~3% of the engine run's
// samples at 1,024 rollouts).
fn count(hay: &[u8], needle: &[u8]) -> usize {
    memchr::memmem::find_iter(hay, needle).count()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

/// The stub thread's CPU clock (`pthread_getcpuclockid`), once it runs.
#[cfg(target_os = "linux")]
static STUB_CLOCK: std::sync::OnceLock<libc::clockid_t> = std::sync::OnceLock::new();

/// CPU time the stub's thread has used (zero before it started, or if its
/// clock cannot be read, or off Linux).
#[cfg(target_os = "linux")]
fn stub_cpu() -> Duration {
    let Some(&clock) = STUB_CLOCK.get() else {
        return Duration::ZERO;
    };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the timespec we pass; the
    // clock is a live thread's (the stub's thread never ends).
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(not(target_os = "linux"))]
fn stub_cpu() -> Duration {
    Duration::ZERO
}

/// Notes the calling thread's CPU clock as the stub's.
fn note_stub_clock() {
    #[cfg(target_os = "linux")]
    {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: pthread_getcpuclockid writes only into `clock`.
        if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0 {
            let _ = STUB_CLOCK.set(clock);
        }
    }
}

/// Starts the stub on its own runtime thread; returns its base URL.
fn start_stub(calls: usize, delay: Duration) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        note_stub_clock();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("stub runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(l.local_addr().expect("addr")).ok();
            loop {
                if let Ok((s, _)) = l.accept().await {
                    s.set_nodelay(true).ok();
                    tokio::spawn(serve_conn(s, calls, delay));
                }
            }
        });
    });
    let addr = rx.recv().expect("stub address");
    format!("http://{addr}/v1")
}

// ---------------------------------------------------------------------------
// Measurements.

fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct we pass and nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Resets the peak resident set size (Linux: `5` to clear_refs).
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

struct Sample {
    wall: Duration,
    calls: usize,
    cpu: Duration,
    /// The stub thread's share of `cpu`.
    stub_cpu: Duration,
    ledger_cpu: Duration,
    peak_mib: f64,
    /// `timeline_phases` of the run.
    phases: Phases,
}

fn backend(url: &str, n: usize) -> OpenAiBackend {
    OpenAiBackend::new(
        "stub",
        &OpenAiParams {
            base_url: url.into(),
            base_url_env: None,
            model: "stub-model".into(),
            api_key_env: None,
            api_key_file: None,
            timeout_secs: 60,
            max_retries: 0,
            max_concurrency: n as u32,
            structured_output: StructuredOutput::Off,
            temperature: 0.7,
            max_tokens: 256,
            lora_adapter: None,
            serve: None,
        },
    )
    .expect("backend")
}

/// The baseline: `n` concurrent loops of `calls` sequential requests through
/// the same client, nothing recorded.
fn transport_only(url: &str, n: usize, calls: usize) -> Sample {
    let b = Arc::new(backend(url, n));
    reset_peak();
    let cpu0 = cpu_time();
    let stub0 = stub_cpu();
    timeline_reset();
    let t0 = Instant::now();
    let done = engine::exec::all(
        n,
        (0..n).collect(),
        |i: usize| {
            let b = b.clone();
            async move {
                let mut messages = vec![engine::chat::Message::user(format!("rollout {i}"))];
                for _ in 0..calls {
                    let req = engine::backend::ChatRequest {
                        model: "stub-model".into(),
                        messages: messages.clone(),
                        tools: engine::tools::tool_defs(true),
                        temperature: 0.7,
                        seed: i as u64,
                        max_tokens: 256,
                        top_p: None,
                        stop: Vec::new(),
                        tool_choice: None,
                        response_format: None,
                        tools_json: None,
                        messages_json: Default::default(),
                    };
                    let r = b.complete(&req).await?;
                    messages.push(r.message);
                    messages.push(engine::chat::Message::tool_result("call", "ok"));
                }
                Ok(calls)
            }
        },
        || {},
    )
    .expect("transport run");
    let end = Instant::now();
    Sample {
        wall: end - t0,
        calls: done.iter().sum(),
        cpu: cpu_time() - cpu0,
        stub_cpu: stub_cpu() - stub0,
        ledger_cpu: Duration::ZERO,
        peak_mib: peak_rss_mib(),
        phases: timeline_phases(t0, end),
    }
}

/// A task folder: a data file, a deliverable and a trivial check.
fn make_task(root: &Path) -> Task {
    let dir = root.join("bench-task");
    std::fs::create_dir_all(dir.join("files")).expect("task dir");
    std::fs::create_dir_all(dir.join("checks")).expect("checks dir");
    std::fs::write(
        dir.join("task.toml"),
        r#"id = "bench-task"
domain = "finance"
split = "train"
title = "Read the data and take notes"
deliverables = ["notes"]
protected = ["data.txt"]

[[checks]]
name = "notes"
command = 'test -d notes && echo "PASS notes" && echo "SCORE 1/1" || echo "SCORE 0/1"'
timeout_secs = 10
"#,
    )
    .expect("task.toml");
    std::fs::write(dir.join("prompt.md"), "Read data.txt and write notes.\n").expect("prompt");
    std::fs::write(
        dir.join("files/data.txt"),
        "date,price\n2024-01-02,101.5\n2024-01-03,102.25\n2024-01-04,99.75\n",
    )
    .expect("data");
    Task::load(&dir).expect("task loads")
}

fn engine_run(url: &str, root: &Path, task: &Task, n: usize, cfg: &Cfg, rep: usize) -> Sample {
    let calls = cfg.calls;
    let dir = cfg
        .dir
        .as_deref()
        .unwrap_or(root)
        .join(format!("ledger-{n}-{rep}"));
    let l = Arc::new(ledger::Ledger::init(&dir).expect("ledger"));
    let session = replay::Session::new(l, "bench", replay::Mode::Live).expect("session");
    let b: Arc<dyn Backend> = Arc::new(backend(url, n));
    let team = Team {
        orchestrator: b.clone(),
        orchestrator_model: "stub-model".into(),
        subagent: b,
        subagent_model: "stub-model".into(),
        sampling: engine::config::SamplingConfig::with(0.7, 256),
    };
    let mut rules = RunRules::default();
    rules.limits.max_turns = calls as u32 + 1;
    rules.limits.max_tokens = 10_000_000;
    // Orchestration, not confinement, is measured by default; `--level`
    // confines each rollout's check as a run would.
    rules.sandbox.level = cfg.level;
    reset_peak();
    let ledger0 = engine::exec::ledger_cpu();
    let cpu0 = cpu_time();
    let stub0 = stub_cpu();
    timeline_reset();
    let t0 = Instant::now();
    let outcomes = engine::exec::all(
        n,
        (0..n).collect(),
        |i: usize| {
            let (session, team, rules, task) =
                (session.clone(), team.clone(), rules.clone(), task.clone());
            async move {
                let spec = RunSpec {
                    task: &task,
                    workflow: &Workflow::bare(),
                    stream: format!("r{i:04}"),
                    purpose: "bench",
                    cycle: 1,
                    index: i as u32,
                };
                run_team(&session, &spec, &team, &rules).await
            }
        },
        || {},
    )
    .expect("engine run");
    let end = Instant::now();
    let wall = end - t0;
    for o in &outcomes {
        assert_eq!(o.record.status, "finished", "{}", o.record.detail);
        assert_eq!(o.record.turns as usize, calls);
    }
    let s = Sample {
        wall,
        calls: outcomes.iter().map(|o| o.record.turns as usize).sum(),
        cpu: cpu_time() - cpu0,
        stub_cpu: stub_cpu() - stub0,
        ledger_cpu: engine::exec::ledger_cpu() - ledger0,
        peak_mib: peak_rss_mib(),
        phases: timeline_phases(t0, end),
    };
    // The ledger closed first: closing writes (its index), and a directory
    // removed under an open ledger came back, so a second run with the same
    // `--dir` found it and stopped.
    drop(outcomes);
    drop(session);
    let _ = std::fs::remove_dir_all(&dir);
    s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn main() {
    let cfg = parse_args();
    let tmp = tempfile::tempdir().expect("tempdir");
    let root: PathBuf = tmp.path().to_path_buf();
    // A confined check runs as an unprivileged user that must reach the
    // task's checks under this directory.
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod bench dir");
    let task = make_task(&root);
    let url = start_stub(cfg.calls, cfg.delay);
    println!(
        "orchestration: {} calls per rollout, stub delay {} ms, sandbox {}, {} repetition(s), {} cores",
        cfg.calls,
        cfg.delay.as_millis(),
        cfg.level.as_str(),
        cfg.reps,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!(
        "ledgers in {}, workspaces under {}",
        cfg.dir.as_deref().unwrap_or(&root).display(),
        std::env::temp_dir().display()
    );
    println!(
        "{:>9} {:>10} {:>12} {:>12} {:>8} {:>10} {:>11} {:>11} {:>9} {:>11} {:>11}",
        "rollouts",
        "ideal/s",
        "transport/s",
        "engine/s",
        "vs ideal",
        "vs transp.",
        "cpu/call tr",
        "cpu/call en",
        "ledger %",
        "peak MiB tr",
        "peak MiB en"
    );
    engine::exec::measure_ledger_cpu(cfg.ledger_share);
    // Warm the runtime and the connection pool's code paths.
    let _ = transport_only(&url, 8, 2);
    let rows: Vec<serde_json::Value> = cfg
        .sizes
        .iter()
        .map(|&n| measure_size(&url, &root, &task, n, &cfg))
        .collect();
    println!("goal: engine/ideal >= 0.90 at 256 rollouts");
    let doc = serde_json::json!({
        "calls_per_rollout": cfg.calls,
        "delay_ms": cfg.delay.as_millis() as u64,
        "level": cfg.level.as_str(),
        "reps": cfg.reps,
        "ledger_dir": cfg.dir.as_ref().map(|d| d.display().to_string()),
        "scratch_dir": std::env::temp_dir().display().to_string(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "rows": rows,
    });
    if cfg.smoke {
        println!(
            "(smoke run under `cargo test`: run `cargo bench --bench orchestration` to measure)"
        );
    } else if let Some(p) = report::write("orchestration", &doc) {
        println!("figures: {}", p.display());
    }
}

/// Every repetition of one size, transport then engine: printed as a row
/// and returned as the row of `orchestration.json` (medians).
fn measure_size(url: &str, root: &Path, task: &Task, n: usize, cfg: &Cfg) -> serde_json::Value {
    let ideal = (n * cfg.calls) as f64 / (cfg.calls as f64 * cfg.delay.as_secs_f64());
    let (mut tr_rate, mut en_rate, mut tr_cpu, mut en_cpu, mut share, mut tr_mem, mut en_mem) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut tr_stub, mut en_stub) = (vec![], vec![]);
    // (first calls in, turn cycle, tail) of each repetition: transport,
    // then engine.
    let mut phases: [Vec<f64>; 6] = Default::default();
    for rep in 0..cfg.reps {
        let t = transport_only(url, n, cfg.calls);
        if cfg.smoke {
            t.phases.check("transport", cfg.calls, cfg.delay, t.wall);
        }
        tr_rate.push(t.calls as f64 / t.wall.as_secs_f64());
        tr_cpu.push(t.cpu.as_secs_f64() * 1e3 / t.calls as f64);
        tr_stub.push(t.stub_cpu.as_secs_f64() * 1e3 / t.calls as f64);
        tr_mem.push(t.peak_mib);
        phases[0].push(t.phases.first);
        phases[1].push(t.phases.cycle);
        phases[2].push(t.phases.tail);
        let e = engine_run(url, root, task, n, cfg, rep);
        if cfg.smoke {
            e.phases.check("engine", cfg.calls, cfg.delay, e.wall);
        }
        en_rate.push(e.calls as f64 / e.wall.as_secs_f64());
        en_cpu.push(e.cpu.as_secs_f64() * 1e3 / e.calls as f64);
        en_stub.push(e.stub_cpu.as_secs_f64() * 1e3 / e.calls as f64);
        if cfg.ledger_share {
            share.push(100.0 * e.ledger_cpu.as_secs_f64() / e.cpu.as_secs_f64().max(1e-9));
        }
        en_mem.push(e.peak_mib);
        phases[3].push(e.phases.first);
        phases[4].push(e.phases.cycle);
        phases[5].push(e.phases.tail);
    }
    let [tr_first, tr_cycle, tr_tail, en_first, en_cycle, en_tail] = phases.map(median);
    let (tr_stub, en_stub) = (median(tr_stub), median(en_stub));
    let (tr, en) = (median(tr_rate), median(en_rate));
    let share = (!share.is_empty()).then(|| median(share));
    let (tr_cpu, en_cpu, tr_mem, en_mem) = (
        median(tr_cpu),
        median(en_cpu),
        median(tr_mem),
        median(en_mem),
    );
    println!(
        "{:>9} {:>10.0} {:>12.0} {:>12.0} {:>8.2} {:>10.2} {:>9.2}ms {:>9.2}ms {:>9} {:>11.0} {:>11.0}",
        n,
        ideal,
        tr,
        en,
        en / ideal,
        en / tr,
        tr_cpu,
        en_cpu,
        share.map_or("-".to_string(), |s| format!("{s:.1}%")),
        tr_mem,
        en_mem
    );
    println!(
        "{:>9} phases: every first call in by {en_first:.0} ms (transport {tr_first:.0} ms); the last rollout ended {en_tail:.0} ms after the last reply (transport {tr_tail:.0} ms)",
        ""
    );
    println!(
        "{:>9} turn cycle (one turn's last call to the next's; the stub takes {:.0} ms): {en_cycle:.1} ms (transport {tr_cycle:.1} ms)",
        "",
        cfg.delay.as_secs_f64() * 1e3
    );
    println!(
        "{:>9} cpu per call: the stub's thread {en_stub:.3} ms (transport {tr_stub:.3} ms)",
        ""
    );
    serde_json::json!({
        "rollouts": n,
        "ideal": ideal,
        "transport": tr,
        "engine": en,
        "vs_ideal": en / ideal,
        "vs_transport": en / tr,
        "cpu_ms_per_call": en_cpu,
        "transport_cpu_ms_per_call": tr_cpu,
        "ledger_share": share.map(|s| s / 100.0),
        "peak_mib": en_mem,
        "transport_peak_mib": tr_mem,
        "first_calls_ms": en_first,
        "transport_first_calls_ms": tr_first,
        "cycle_ms": en_cycle,
        "transport_cycle_ms": tr_cycle,
        "tail_ms": en_tail,
        "transport_tail_ms": tr_tail,
        "stub_cpu_ms_per_call": en_stub,
        "transport_stub_cpu_ms_per_call": tr_stub,
    })
}
