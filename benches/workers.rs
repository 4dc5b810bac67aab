//! Workers: items per second of `mass run --workers URL` with 1, 2 and 4
//! `mass worker` processes against the in-process executor, when the work
//! waits rather than computes (so this machine's two cores are not the
//! limit), and what the coordinator costs per item.
//!
//! ```text
//! cargo bench --bench workers -- [--quick] [--reps N] [--sleep SECS] [--runs N] [--folder] [--strict]
//! ```
//!
//! The work: a copy, in a temporary directory, of three example tasks
//! (`fin-momentum-backtest` and `pha-hill-fit` to train, `fin-bond-duration`
//! held out) whose check commands start with `sleep SECS; ` (`--sleep`,
//! default 1.0; nothing else of the tasks changes). A check runs in the
//! sandbox as a real process at the end of every rollout and whenever the
//! simulated team calls `run_checks`, so every rollout waits on it without
//! using CPU. The experiment is `examples/smoke.toml` with that `tasks_dir`,
//! `[inner] iterations = 1`, `[outer] collect = "every"` (both train tasks
//! are collected, whatever the search found), `runs_per_task = --runs`
//! (default 24: 48 collection items, 12 per slot at n = 4; with few items
//! per slot the rollouts' uneven lengths leave slots idle at the stage's
//! end whatever the executor, which the in-process scaling printed beside
//! shows), `eval_runs = 1`, and `concurrency` set per configuration
//! (below); seed, roles, backends (simulated) and trainer (simulated) as in
//! smoke.toml. `concurrency` is not part of any id, so every run of the
//! bench records the same run (its head is compared).
//!
//! What is measured: the **collection stage** (`collect` of `mass report
//! RUN --json`: the wall time from the search stage's last step to the
//! collection's milestone, read from the run's records). It is the stage
//! with the most rollouts (`--runs` x 2, all submitted at once, each
//! waiting on its check) and the longest in process; the judge stage's
//! judgments wait on nothing, and are reported apart, as information. Its
//! items are the run's `c1/<task>/collect/<NN>/orch` refs; items/s = items
//! / collect wall. Each repetition runs, each with a fresh ledger (and, for
//! workers, a fresh store):
//!
//! * **in process** (no `--workers`) with `concurrency = n`, n = 1, 2, 4: n
//!   rollouts at a time in one process;
//! * **workers**: `mass run --workers URL` with `concurrency` = the stage's
//!   item count (every collection item is published at once; the workers'
//!   slots are the limit) and n = 1, 2, 4 `mass worker URL --slots 1 --name
//!   wK --idle-exit 120` processes (250 ms polls, 30 s leases: the
//!   defaults), started before the coordinator and each seen on the store
//!   (its heartbeat) before it starts. Worker 1 is started and seen before
//!   the others because workers that start at once on a fresh store race on
//!   its marker (`Remote::ensure_marker` lists the store after finding no
//!   marker; a marker written in between makes it fail with "not a mass
//!   remote ... it holds MASS-REMOTE"). Workers are stopped (SIGTERM, then
//!   SIGKILL after 5 s) when the coordinator exits; each worker gets a
//!   `TMPDIR` of its own run, and what it leaves there is counted.
//!
//! Scaling is rate(n) / (n x rate(1)) of the workers' median rates, for n =
//! 2 and 4; the goal is >= 0.9 at n = 4 (PASS/FAIL). The in-process
//! executor's own scaling is printed beside it (the same rollouts, n at a
//! time in one process, no store: what the stage itself allows on this
//! machine, uneven rollouts leaving slots idle at its end), and workers(n) /
//! in-process(n). Medians over `--reps` (default 3; `--quick` is 1).
//!
//! The store: moto S3 (`scripts/s3-server.sh start`, or the server that
//! `AWS_ENDPOINT` and `MASS_S3_PYTHON` name; a fresh bucket per workers
//! run, made and deleted with boto3), else (`--folder`, or when moto does
//! not start) a fresh folder. With S3, the coordinator and the workers each
//! talk to the server through a counting proxy of this bench (HTTP/1.1,
//! 127.0.0.1, one for the coordinator and one shared by the workers): every
//! request is logged with its method, path and arrival time, so the
//! coordinator's requests are told apart from the workers'. Lines of moto's
//! access log (`$MASS_CACHE/moto-PORT.log`) written during the run are
//! counted as well: every client of the server, including any other
//! process using a shared server. A folder store counts no requests.
//!
//! The coordinator's overhead per item, from each workers run:
//!
//! * store requests: the coordinator's requests over the whole run per item
//!   of the run (each `mass.work` record of the run's `workers` stream is
//!   one item: rollouts and judgments), by kind (list of `work/results`, get
//!   of a result, put of an item, packs and indexes up and down, other);
//!   and its requests between the first collection item's publication and
//!   the last collection item's record, per collection item (what the
//!   polling costs while the stage runs);
//! * latency: per collection item, from the worker's log line saying the
//!   result was published (`item X: done`, stamped when this bench read it
//!   from the worker's stderr) to the coordinator's GET of that result (its
//!   poll; S3 only), and to the `mass.work` record of it in the run's ledger
//!   (`wall_ms` of the event: pulled, checked, recorded). Medians and 90th
//!   percentiles over every collection item of every rep. The worker moves
//!   on as soon as it has published, and every collection item is published
//!   at once, so this delays the stage only after its last results (and
//!   delays nothing else: the items do not wait on each other);
//! * CPU: user + system time of the whole coordinator run (its process and
//!   reaped children) and of the workers against the in-process runs' (the
//!   same run, its rollouts executed there), from
//!   `getrusage(RUSAGE_CHILDREN)` around each; moto's CPU during each run
//!   (from `/proc`; the server's, so another client's requests count too);
//!   and the cores moto, the coordinator and the workers used during the
//!   collection and during the judge stage (sampled every 100 ms). The
//!   judge stage's judgments wait on no check: its wall time, requests and
//!   CPU with workers, against in process, are printed as information.
//!
//! Where the collection's time goes, per configuration: each collection
//! rollout's span (its `orch` stream's first to last event, `wall_ms` as
//! recorded by the process that executed it), their sum, the longest, and
//! the bound max(sum / n, longest): the least wall time n slots need for
//! these rollouts with no overhead of any kind (a stage ends with its last
//! rollout, so uneven rollouts leave slots idle at its end whatever the
//! executor); collect wall / bound; the slot time outside every span per
//! item, (wall x n - sum) / items; and the stage's lead and tail: from its
//! start (the search stage's last milestone) to the first rollout's first
//! event, and from the last rollout's last event to the stage's end (its
//! "collection done" note).
//!
//! From the workers' logs: item starts, results published, items started
//! more than once (executed twice), results found already published
//! (duplicates), failed attempts, leases lost, store errors, items refused,
//! workers that exited before they were stopped; per collection item on a
//! worker the time from its claim (the `item X (...), attempt N` line) to
//! its result (`item X: done`), split into claim -> the rollout's first
//! event (setup) and its last event -> result published (noticing it,
//! pushing, publishing), and the gap from a result to the same worker's
//! next claim.
//!
//! `MASS_BENCH_KEEP=1` keeps the temporary directory (ledgers, stores,
//! worker logs) and the buckets; `MASS_BENCH_BIN=path` runs another `mass`.
//! `--strict` exits 1 when the goal is missed. Run without `--bench` (as
//! `cargo test --all-targets` does) it only writes the task copy and the
//! experiment and checks them (no run, no timing).
//!
//! ## `target/bench/workers.json` (under `CARGO_TARGET_DIR` when set)
//!
//! * `reps`, `sleep_secs` (the check's sleep), `runs_per_task`,
//!   `collect_items` (items of the collection stage), `worker_concurrency`
//!   (the experiment's `concurrency` in workers runs), `tasks` (the copied
//!   task ids), `bench_secs` (the whole bench), `load_before` and
//!   `load_after` (the 1-minute load average when the bench started and
//!   ended, from `/proc/loadavg`: other work on the machine skews times).
//! * `store`: `kind` ("s3" or "folder"), `endpoint` (S3), `proxied` (the
//!   counting proxies were in use), `moto_log` (the access log counted, or
//!   null), `note` (why a folder, when it fell back).
//! * `configs`: one object per configuration, in order: `executor`
//!   ("in-process" or "workers"), `n` (concurrency or workers),
//!   `concurrency` (the experiment's), and per rep, in order: `collect_secs`,
//!   `items`, `rate` (items/s), `run_secs` (the `mass run` process),
//!   `cpu_secs` (its user + system CPU, children included), `stages` (every
//!   stage's wall seconds from the report), `head` (the run's head); then
//!   `rate_median`, `collect_median`, `run_median`.
//! * `scaling`: `workers` and `in_process`: `{n: rate(n) / (n x rate(1))}`
//!   for n = 2, 4 from median rates; `vs_in_process`: `{n: workers rate(n)
//!   / in-process rate(n)}`; `goal` (0.9), `pass` (workers at n = 4 meets
//!   it).
//! * `overhead`: per workers configuration (`n`), over its reps:
//!   `coordinator_requests` and `worker_requests` (per rep, whole run),
//!   `run_items` (per rep: `mass.work` records), `coordinator_per_item`
//!   and `worker_per_item` (medians of the per-rep ratios),
//!   `coordinator_kinds` (rep 0: request kind -> count),
//!   `collect_window_requests` and `collect_window_per_item` (per rep),
//!   `moto_lines` (per rep: every line written during the run) and
//!   `moto_lines_bucket` (those naming the run's bucket),
//!   `publish_to_get_ms` and `publish_to_record_ms` (`{median, p90, max,
//!   n}` over the collection items of every rep),
//!   `worker_exec_ms` (claim to result, collection items),
//!   `worker_setup_ms` (claim to the rollout's first event),
//!   `worker_finish_ms` (its last event to the result) and `worker_gap_ms`
//!   (result to the same worker's next collection claim), all `{median,
//!   p90, max, n}`; `coordinator_cpu_secs` (per rep), `in_process_cpu_secs`
//!   (median of every in-process run), `moto_cpu_secs` and
//!   `workers_cpu_secs` (per rep: all workers, children included),
//!   `worker_kinds` (rep 0: the workers' requests by kind),
//!   `cores_collect` and `cores_judge` (`{moto, coordinator, workers}`:
//!   CPU seconds of each process, sampled every 100 ms from `/proc`, over
//!   the window's seconds, median over reps; the workers summed; children
//!   not included), `collect_requests` (`{coordinator, workers}`, per rep:
//!   requests within the collection's window), `judge` (the judge stage,
//!   not part of the figures above: `items` (its `c1/<task>/pair/...`
//!   records), `secs` (per rep), `in_process_secs` (median, same n),
//!   `coordinator_requests` and `worker_requests` (per rep, within its
//!   window)). Null where the store gives no figure (a folder has no
//!   requests).
//! * `spans`: per configuration: `executor`, `n`, and per rep
//!   `span_median_secs`, `span_max_secs`, `span_sum_secs`, `bound_secs`
//!   (max(sum / n, longest)), `outside_per_item_secs`, `lead_secs` (the
//!   stage's start to its first rollout's first event), `tail_secs` (its
//!   last rollout's last event to the stage's end); `wall_over_bound`
//!   (median of collect wall / bound).
//! * `worker_logs`: per workers configuration and rep: `starts`, `done`,
//!   `jobs_started_twice`, `duplicates`, `failed_attempts`, `lease_lost`,
//!   `store_errors`, `given_up`, `refused`, `released` (items stopped and
//!   released when the worker was stopped), `paused` (infrastructure
//!   failures that pause a worker), `publish_failed`, `summaries` (each
//!   worker's closing line), `exited_early` (names and statuses),
//!   `unusual_lines` (the first few lines that are none of a claim, a
//!   start, a result, a closing line or the banner), `leftover_dirs`
//!   (entries left in the workers' `TMPDIR`, by prefix),
//!   `records_retried` (`mass.work` records with attempt > 1 or failed
//!   attempts listed).
//! * `heads`: `distinct` (the run heads seen), `same` (all equal).
//! * `rows`: the printed table: `executor`, `n`, `items`, `collect_secs`,
//!   `rate`, `scaling` (null for in-process n = 1 and workers n = 1),
//!   `vs_in_process` (workers only), `run_secs`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

const USAGE: &str = "usage: cargo bench --bench workers -- [--quick] [--reps N] [--sleep SECS] [--runs N] [--folder] [--strict]";
/// Set to keep the temporary directory and the buckets.
const KEEP_ENV: &str = "MASS_BENCH_KEEP";
/// Set to the `mass` binary to run instead of the one cargo built.
const BIN_ENV: &str = "MASS_BENCH_BIN";
const RUN: &str = "wbench";
/// The copied tasks: (id, split).
const TASKS: [(&str, &str); 3] = [
    ("fin-momentum-backtest", "train"),
    ("pha-hill-fit", "train"),
    ("fin-bond-duration", "heldout"),
];
const COUNTS: [usize; 3] = [1, 2, 4];
const GOAL: f64 = 0.9;
/// How long a worker waits with nothing to do before it exits on its own
/// (a safety net: the bench stops them).
const IDLE_EXIT_SECS: &str = "120";
/// The longest a `mass run` may take before the bench gives up.
const RUN_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// Bucket making and deleting, run with `$MASS_S3_PYTHON` (boto3).
const HELPER_PY: &str = r#"
import json, os, sys

import boto3
from botocore.config import Config

s3 = boto3.client(
    "s3",
    endpoint_url=os.environ["AWS_ENDPOINT"],
    region_name=os.environ.get("AWS_REGION", "us-east-1"),
    aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
    aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
    config=Config(s3={"addressing_style": "path"}),
)

cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "mkbuckets":
    for b in args:
        s3.create_bucket(Bucket=b)
elif cmd == "rmbuckets":
    for b in args:
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=b):
            keys += [o["Key"] for o in page.get("Contents", [])]
        for i in range(0, len(keys), 1000):
            s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})
        s3.delete_bucket(Bucket=b)
else:
    sys.exit(f"unknown command {cmd}")
print(json.dumps({"buckets": len(args)}))
"#;

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

struct Cfg {
    reps: usize,
    sleep: f64,
    runs: u32,
    folder: bool,
    strict: bool,
}

fn parse_args() -> Result<Cfg, String> {
    let mut cfg = Cfg {
        reps: 3,
        sleep: 1.0,
        runs: 24,
        folder: false,
        strict: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or(format!("{name} needs a value"))
        };
        match flag.as_str() {
            // cargo passes `--bench` to harness = false bench targets.
            "--bench" => {}
            "--quick" => cfg.reps = 1,
            "--strict" => cfg.strict = true,
            "--folder" => cfg.folder = true,
            "--reps" => {
                cfg.reps = value("--reps")?
                    .parse()
                    .map_err(|_| "bad --reps value".to_string())?;
                if cfg.reps == 0 {
                    return Err("--reps must be at least 1".into());
                }
            }
            "--sleep" => {
                cfg.sleep = value("--sleep")?
                    .parse()
                    .map_err(|_| "bad --sleep value".to_string())?;
                if !(cfg.sleep.is_finite() && (0.0..=20.0).contains(&cfg.sleep)) {
                    return Err("--sleep takes seconds from 0 to 20".into());
                }
            }
            "--runs" => {
                cfg.runs = value("--runs")?
                    .parse()
                    .map_err(|_| "bad --runs value".to_string())?;
                // The selection takes 4 train ranks and 1 validation rank.
                if cfg.runs < 5 {
                    return Err("--runs must be at least 5".into());
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            s => return Err(format!("unknown argument {s:?}")),
        }
    }
    Ok(cfg)
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
}

fn keep() -> bool {
    std::env::var_os(KEEP_ENV).is_some()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The value at quantile `q` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
    s[i]
}

/// `{median, p90, max, n}` of a sample, or null when it is empty.
fn summary(v: &[f64]) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    json!({
        "median": median(v),
        "p90": quantile(v, 0.9),
        "max": quantile(v, 1.0),
        "n": v.len(),
    })
}

fn fmt_ms_summary(v: &[f64]) -> String {
    if v.is_empty() {
        return "n/a".into();
    }
    format!(
        "median {:.0} ms, p90 {:.0} ms, max {:.0} ms (n {})",
        median(v),
        quantile(v, 0.9),
        quantile(v, 1.0),
        v.len()
    )
}

/// A number for JSON: null when not finite.
fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

fn fmt_num(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "n/a".into()
    }
}

/// User + system CPU seconds of this process's reaped children so far.
fn children_cpu() -> f64 {
    // SAFETY: getrusage only writes the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    if rc != 0 {
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU seconds of process `pid` (from `/proc`), if readable.
fn process_cpu(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / if hz > 0.0 { hz } else { 100.0 })
}

/// Samples the CPU time of some processes every 100 ms on a thread of its
/// own: (ms, CPU seconds of each, carried forward once a process is gone).
struct Sampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: JoinHandle<Vec<(u64, Vec<f64>)>>,
}

impl Sampler {
    fn start(pids: Vec<Option<u32>>) -> Sampler {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut out: Vec<(u64, Vec<f64>)> = Vec::new();
            let mut last = vec![f64::NAN; pids.len()];
            loop {
                for (i, p) in pids.iter().enumerate() {
                    if let Some(c) = p.and_then(process_cpu) {
                        last[i] = c;
                    }
                }
                out.push((now_ms(), last.clone()));
                if s2.load(std::sync::atomic::Ordering::SeqCst) {
                    return out;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Sampler { stop, handle }
    }

    fn finish(self) -> Vec<(u64, Vec<f64>)> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.handle.join().unwrap_or_default()
    }
}

/// Cores used by process `i` of the samples between `from` and `to` (ms):
/// its CPU seconds over the window's seconds.
fn cores(samples: &[(u64, Vec<f64>)], i: usize, from: u64, to: u64) -> Option<f64> {
    let at = |t: u64| {
        samples
            .iter()
            .rev()
            .find(|(ms, _)| *ms <= t)
            .or_else(|| samples.first())
            .and_then(|(ms, v)| Some((*ms, *v.get(i)?)))
    };
    let ((a_ms, a), (b_ms, b)) = (at(from)?, at(to)?);
    let secs = (b_ms as f64 - a_ms as f64) / 1e3;
    (secs > 0.5 && a.is_finite() && b.is_finite()).then(|| (b - a) / secs)
}

fn load_average() -> Option<f64> {
    fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A fresh directory under /tmp, removed afterwards unless `MASS_BENCH_KEEP` is set.
fn tempdir(tag: &str) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix(&format!("mass-bench-{tag}-"))
        .disable_cleanup(keep())
        .tempdir_in("/tmp")
        .expect("create a temp dir under /tmp");
    if keep() {
        println!("  (keeping {})", d.path().display());
    }
    d
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    for e in fs::read_dir(from).expect("read a task folder").flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let ty = e.file_type().expect("file type");
        if ty.is_dir() {
            copy_dir(&src, &dst);
        } else if ty.is_file() {
            fs::copy(&src, &dst).expect("copy a task file");
            let mode = fs::metadata(&src).expect("stat").permissions();
            fs::set_permissions(&dst, mode).expect("chmod");
        }
    }
}

/// The `mass` binary: `MASS_BENCH_BIN`, else the one cargo built for this
/// bench (`CARGO_BIN_EXE_mass`), else `mass` next to this bench's directory
/// (`target/<profile>/deps/..`), else `target/release/mass`.
fn mass_bin() -> PathBuf {
    let mut tried: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os(BIN_ENV) {
        tried.push(PathBuf::from(p));
    }
    if let Some(p) = option_env!("CARGO_BIN_EXE_mass") {
        tried.push(PathBuf::from(p));
    }
    if let Some(profile_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(Path::to_path_buf))
    {
        tried.push(profile_dir.join("mass"));
    }
    tried.push(target_dir().join("release").join("mass"));
    match tried.iter().find(|p| p.is_file()) {
        Some(p) => p.clone(),
        None => panic!(
            "cannot find the `mass` binary (tried {}); build it with `cargo build --release --bin mass` or set {BIN_ENV}",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Runs `cmd`, returns its stdout and wall time; panics with its output
/// when it fails.
fn run(mut cmd: Command) -> (String, f64) {
    let shown = format!("{cmd:?}");
    let t = Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        panic!(
            "{shown} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (String::from_utf8_lossy(&out.stdout).into_owned(), secs)
}

/// `mass [--ledger LEDGER] ARGS...` with `env`.
fn mass(bin: &Path, ledger: Option<&Path>, env: &[(String, String)], args: &[&str]) -> Command {
    let mut c = Command::new(bin);
    if let Some(l) = ledger {
        c.arg("--ledger").arg(l);
    }
    c.args(args).env_remove("MASS_LEDGER");
    c.envs(env.iter().map(|(k, v)| (k, v)));
    c
}

/// Reads a child's pipe to its end on a thread of its own (so a deadline
/// can be kept while it runs).
fn read_in_thread<R: Read + Send + 'static>(pipe: Option<R>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut text);
        }
        text
    })
}

/// Waits for `child` up to `deadline`; kills it and panics past it.
fn wait_deadline(child: &mut Child, what: &str, deadline: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return s,
            Ok(None) if t.elapsed() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what} did not finish within {} s", deadline.as_secs());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("waiting for {what}: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------
// The task copy and the experiment
// ---------------------------------------------------------------------------

/// Copies the tasks into `dir/tasks` with `sleep SECS; ` at the start of
/// every check command; returns the folder.
fn write_tasks(dir: &Path, sleep: f64) -> PathBuf {
    let tasks = dir.join("tasks");
    for (id, _) in TASKS {
        let to = tasks.join(id);
        copy_dir(&repo().join("examples/tasks").join(id), &to);
        let toml_path = to.join("task.toml");
        let text = fs::read_to_string(&toml_path).expect("read task.toml");
        let mut changed = 0;
        let lines: Vec<String> = text
            .lines()
            .map(|l| match l.strip_prefix("command = '") {
                Some(rest) => {
                    changed += 1;
                    format!("command = 'sleep {sleep}; {rest}")
                }
                None => l.to_string(),
            })
            .collect();
        assert!(
            changed >= 1,
            "{id}/task.toml has no `command = '...'` line to put the sleep in"
        );
        fs::write(&toml_path, lines.join("\n") + "\n").expect("write task.toml");
    }
    tasks
}

/// `examples/smoke.toml` with the copied tasks, one inner iteration, every
/// train task collected `runs` times, one held-out run, and `concurrency`.
fn experiment(tasks: &Path, runs: u32, concurrency: usize) -> String {
    let train: Vec<String> = TASKS
        .iter()
        .filter(|(_, s)| *s == "train")
        .map(|(t, _)| format!("{t:?}"))
        .collect();
    let heldout: Vec<String> = TASKS
        .iter()
        .filter(|(_, s)| *s == "heldout")
        .map(|(t, _)| format!("{t:?}"))
        .collect();
    format!(
        r#"# Written by benches/workers.rs: examples/smoke.toml with sleeping checks.
name = "{RUN}"
seed = 8
tasks_dir = {tasks:?}
train = [{train}]
heldout = [{heldout}]
cycles = 1
concurrency = {concurrency}

[backends.sim]
kind = "sim"

[roles]
orchestrator = "sim"
judge = "sim"
optimizer = "sim"

[inner]
iterations = 1

[outer]
collect = "every"
swap_positions = true
runs_per_task = {runs}
opponents_per_run = 2
train_ranks = 4
validation_ranks = 1
eval_runs = 1
external_judgments = 2

[trainer]
kind = "sim"
"#,
        tasks = tasks.display().to_string(),
        train = train.join(", "),
        heldout = heldout.join(", "),
    )
}

fn train_tasks() -> usize {
    TASKS.iter().filter(|(_, s)| *s == "train").count()
}

// ---------------------------------------------------------------------------
// The S3 server and the boto3 helper
// ---------------------------------------------------------------------------

struct S3 {
    env: Vec<(String, String)>,
    endpoint: String,
    python: PathBuf,
    helper: PathBuf,
    /// This bench started the server (and stops it).
    started: bool,
    buckets: std::cell::RefCell<Vec<String>>,
}

impl S3 {
    fn start(tmp: &Path) -> Result<S3, String> {
        let mut env: Vec<(String, String)> = Vec::new();
        let mut started = false;
        let given = ["AWS_ENDPOINT", "MASS_S3_PYTHON"]
            .iter()
            .all(|k| std::env::var_os(k).is_some());
        if given {
            for k in [
                "AWS_ENDPOINT",
                "AWS_ALLOW_HTTP",
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_REGION",
                "MASS_S3_PYTHON",
            ] {
                if let Ok(v) = std::env::var(k) {
                    env.push((k.into(), v));
                }
            }
            println!("  S3: the server AWS_ENDPOINT names");
        } else {
            let script = repo().join("scripts/s3-server.sh");
            let running = Command::new(&script)
                .arg("url")
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            let t = Instant::now();
            let out = Command::new(&script)
                .arg("start")
                .output()
                .map_err(|e| format!("cannot run scripts/s3-server.sh: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "scripts/s3-server.sh start failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some((k, v)) = line.split_once('=') {
                    env.push((k.trim().into(), v.trim().into()));
                }
            }
            started = !running;
            println!(
                "  S3: {} moto via scripts/s3-server.sh ({:.1} s)",
                if started {
                    "started"
                } else {
                    "reusing the running"
                },
                t.elapsed().as_secs_f64()
            );
        }
        for k in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
            if !env.iter().any(|(n, _)| n == k) {
                env.push((k.into(), "testing".into()));
            }
        }
        let get = |k: &str| {
            env.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .ok_or(format!("the S3 setup gave no {k}"))
        };
        let helper = tmp.join("s3_helper.py");
        fs::write(&helper, HELPER_PY).map_err(|e| e.to_string())?;
        Ok(S3 {
            endpoint: get("AWS_ENDPOINT")?,
            python: PathBuf::from(get("MASS_S3_PYTHON")?),
            env,
            helper,
            started,
            buckets: Default::default(),
        })
    }

    fn helper(&self, args: &[&str]) {
        let mut c = Command::new(&self.python);
        c.arg(&self.helper).args(args);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        run(c);
    }

    /// Makes a bucket, deleted when `self` drops (unless kept).
    fn make_bucket(&self, name: &str) {
        self.buckets.borrow_mut().push(name.to_string());
        self.helper(&["mkbuckets", name]);
    }

    /// The server's access log, when it is a moto this machine's
    /// `scripts/s3-server.sh` runs.
    fn moto_log(&self) -> Option<PathBuf> {
        let port = self.endpoint.rsplit(':').next()?.trim_end_matches('/');
        let cache = std::env::var_os("MASS_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mass")))?;
        let p = cache.join(format!("moto-{port}.log"));
        p.is_file().then_some(p)
    }

    /// The pid of the moto server, for its CPU time.
    fn moto_pid(&self) -> Option<u32> {
        let cache = std::env::var_os("MASS_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mass")))?;
        fs::read_to_string(cache.join("moto.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The server as a socket address (for the proxies), if plain http.
    fn upstream(&self) -> Option<SocketAddr> {
        let hostport = self.endpoint.strip_prefix("http://")?.trim_end_matches('/');
        hostport.to_socket_addrs().ok()?.next()
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let buckets = self.buckets.take();
        if keep() {
            if !buckets.is_empty() {
                println!("  (keeping buckets {})", buckets.join(", "));
            }
        } else if !buckets.is_empty() {
            let ok = Command::new(&self.python)
                .arg(&self.helper)
                .arg("rmbuckets")
                .args(&buckets)
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok {
                eprintln!("could not delete the buckets {}", buckets.join(", "));
            }
        }
        if self.started {
            let _ = Command::new(repo().join("scripts/s3-server.sh"))
                .arg("stop")
                .output();
        }
    }
}

fn line_count(path: &Path) -> Option<u64> {
    let bytes = fs::read(path).ok()?;
    Some(bytes.iter().filter(|b| **b == b'\n').count() as u64)
}

/// Of the log's lines after the first `from`: (all, those naming `/bucket`).
fn lines_since(path: &Path, from: u64, bucket: &str) -> Option<(u64, u64)> {
    let text = String::from_utf8_lossy(&fs::read(path).ok()?).into_owned();
    let needle = format!("/{bucket}");
    let (mut all, mut mine) = (0, 0);
    for l in text.lines().skip(from as usize) {
        all += 1;
        if l.contains(&needle) {
            mine += 1;
        }
    }
    Some((all, mine))
}

// ---------------------------------------------------------------------------
// The counting proxy
// ---------------------------------------------------------------------------

/// One request a proxy forwarded.
#[derive(Debug, Clone)]
struct Req {
    ms: u64,
    method: String,
    target: String,
}

/// An HTTP/1.1 forwarder to the S3 server that logs every request: its
/// method, target and the time its header arrived. Responses are copied
/// back as they come. Lives as long as the bench.
struct Proxy {
    port: u16,
    log: Arc<Mutex<Vec<Req>>>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let log: Arc<Mutex<Vec<Req>>> = Arc::default();
        let l2 = log.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(client) = conn else { continue };
                let log = l2.clone();
                std::thread::spawn(move || {
                    let _ = forward(client, upstream, &log);
                });
            }
        });
        Ok(Proxy { port, log })
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn len(&self) -> usize {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The requests logged from index `from` on.
    fn since(&self, from: usize) -> Vec<Req> {
        let l = self.log.lock().unwrap_or_else(|p| p.into_inner());
        l[from.min(l.len())..].to_vec()
    }
}

/// Serves one client connection: requests parsed (header, then a body of
/// Content-Length bytes or chunked) and forwarded; responses copied back.
fn forward(client: TcpStream, upstream: SocketAddr, log: &Mutex<Vec<Req>>) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut from_server, mut to_client) = (server.try_clone()?, client.try_clone()?);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_server, &mut to_client);
        let _ = to_client.shutdown(std::net::Shutdown::Both);
    });
    let mut r = BufReader::new(client);
    let mut w = server;
    loop {
        let mut head: Vec<u8> = Vec::new();
        loop {
            let mut line = Vec::new();
            if r.read_until(b'\n', &mut line)? == 0 {
                let _ = w.shutdown(std::net::Shutdown::Write);
                return Ok(());
            }
            if head.is_empty() && (line == b"\r\n" || line == b"\n") {
                continue;
            }
            let end = line == b"\r\n" || line == b"\n";
            head.extend_from_slice(&line);
            if end {
                break;
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.lines();
        let first = lines.next().unwrap_or("");
        let mut parts = first.split_whitespace();
        let (method, target) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let (mut length, mut chunked) = (0u64, false);
        for h in lines {
            if let Some((k, v)) = h.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                if k == "content-length" {
                    length = v.parse().unwrap_or(0);
                } else if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
                    chunked = true;
                }
            }
        }
        log.lock().unwrap_or_else(|p| p.into_inner()).push(Req {
            ms: now_ms(),
            method,
            target,
        });
        w.write_all(&head)?;
        if chunked {
            loop {
                let mut size_line = Vec::new();
                r.read_until(b'\n', &mut size_line)?;
                w.write_all(&size_line)?;
                let hex = String::from_utf8_lossy(&size_line);
                let size = u64::from_str_radix(hex.split(';').next().unwrap_or("").trim(), 16)
                    .unwrap_or(0);
                if size == 0 {
                    // Trailers, up to the empty line.
                    loop {
                        let mut t = Vec::new();
                        if r.read_until(b'\n', &mut t)? == 0 {
                            break;
                        }
                        w.write_all(&t)?;
                        if t == b"\r\n" || t == b"\n" {
                            break;
                        }
                    }
                    break;
                }
                std::io::copy(&mut (&mut r).take(size + 2), &mut w)?;
            }
        } else if length > 0 {
            std::io::copy(&mut (&mut r).take(length), &mut w)?;
        }
    }
}

/// What a request was, by the key it names under the bucket: a kind for
/// the breakdown, and the job for work keys.
fn classify(req: &Req) -> (String, Option<String>) {
    let (path, query) = req.target.split_once('?').unwrap_or((&req.target, ""));
    // Path style: /BUCKET/KEY.
    let key = path
        .trim_start_matches('/')
        .split_once('/')
        .map(|(_, k)| k)
        .unwrap_or("");
    if query.contains("list-type") || (key.is_empty() && req.method == "GET") {
        let prefix = query
            .split('&')
            .find_map(|p| p.strip_prefix("prefix="))
            .unwrap_or("")
            .replace("%2F", "/")
            .replace("%2f", "/");
        let dir = prefix.trim_end_matches('/');
        let dir = match dir {
            "" => "(all)",
            d if d.starts_with("work/attempts") => "work/attempts",
            d => d,
        };
        return (format!("LIST {dir}"), None);
    }
    let job = key
        .rsplit('/')
        .next()
        .and_then(|n| n.strip_suffix(".json"))
        .filter(|j| j.len() == 64 && j.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string);
    let class = match key {
        k if k.starts_with("work/items/") => "work/items",
        k if k.starts_with("work/results/") => "work/results",
        k if k.starts_with("work/claims/") => "work/claims",
        k if k.starts_with("work/workers/") => "work/workers",
        k if k.starts_with("work/attempts/") => "work/attempts",
        k if k.starts_with("packs/") && k.ends_with(".pack") => "packs/*.pack",
        k if k.starts_with("packs/") && k.ends_with(".idx") => "packs/*.idx",
        k if k.starts_with("packs/") => "packs/other",
        "MASS-REMOTE" => "MASS-REMOTE",
        k if k.starts_with("refs/") || k.starts_with("history/") => "refs",
        _ => "other",
    };
    (format!("{} {class}", req.method), job)
}

// ---------------------------------------------------------------------------
// Worker processes
// ---------------------------------------------------------------------------

/// A line a worker wrote to stderr, stamped when it was read.
#[derive(Debug, Clone)]
struct Line {
    ms: u64,
    worker: String,
    text: String,
}

struct WorkerGroup {
    children: Vec<(String, Child)>,
    readers: Vec<JoinHandle<()>>,
    lines: Arc<Mutex<Vec<Line>>>,
    exited_early: Vec<String>,
}

impl WorkerGroup {
    fn new() -> WorkerGroup {
        WorkerGroup {
            children: Vec::new(),
            readers: Vec::new(),
            lines: Arc::default(),
            exited_early: Vec::new(),
        }
    }

    fn spawn(&mut self, bin: &Path, url: &str, name: &str, env: &[(String, String)], tmp: &Path) {
        fs::create_dir_all(tmp).expect("mkdir the worker's TMPDIR");
        let mut c = mass(
            bin,
            None,
            env,
            &[
                "worker",
                url,
                "--slots",
                "1",
                "--name",
                name,
                "--idle-exit",
                IDLE_EXIT_SECS,
            ],
        );
        c.env("TMPDIR", tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `mass worker`: {e}"));
        for stream in [
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let (lines, who) = (self.lines.clone(), name.to_string());
            self.readers.push(std::thread::spawn(move || {
                for l in BufReader::new(stream).lines() {
                    let Ok(text) = l else { break };
                    lines.lock().unwrap_or_else(|p| p.into_inner()).push(Line {
                        ms: now_ms(),
                        worker: who.clone(),
                        text,
                    });
                }
            }));
        }
        self.children.push((name.to_string(), child));
    }

    /// Whether a worker has exited (panics with its output if it has).
    fn check_alive(&mut self, name: &str) {
        if let Some((_, c)) = self.children.iter_mut().find(|(n, _)| n == name) {
            if let Ok(Some(s)) = c.try_wait() {
                panic!(
                    "worker {name} exited ({s}) before the run started:\n{}",
                    self.text()
                );
            }
        }
    }

    /// Notes workers that have exited on their own.
    fn note_exited(&mut self) {
        for (name, c) in &mut self.children {
            if let Ok(Some(s)) = c.try_wait() {
                self.exited_early.push(format!("{name} ({s})"));
            }
        }
    }

    /// SIGTERM to every worker, SIGKILL to those still there after 5 s;
    /// waits for them and for their output.
    fn stop(&mut self) {
        for (_, c) in &mut self.children {
            if let Ok(None) = c.try_wait() {
                // SAFETY: kill(2) on our own child's pid.
                unsafe {
                    libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
                }
            }
        }
        let t = Instant::now();
        for (_, c) in &mut self.children {
            while matches!(c.try_wait(), Ok(None)) && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        self.children.clear();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }

    fn lines(&self) -> Vec<Line> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn text(&self) -> String {
        self.lines()
            .iter()
            .map(|l| l.text.clone())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for WorkerGroup {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Worker log events, from lines `worker NAME: item JOB12 (KIND STREAM),
/// attempt N` and `worker NAME: item JOB12: done`, and the anomalies.
#[derive(Default)]
struct WorkerLog {
    /// (job12, worker, ms, stream)
    starts: Vec<(String, String, u64, String)>,
    /// (job12, worker, ms)
    done: Vec<(String, String, u64)>,
    duplicates: u64,
    failed_attempts: u64,
    lease_lost: u64,
    store_errors: u64,
    given_up: u64,
    refused: u64,
    /// Items stopped and released when the worker was stopped.
    released: u64,
    /// Infrastructure failures: item released, the worker pausing.
    paused: u64,
    publish_failed: u64,
    /// Each worker's closing line (done, failed, discarded, duplicates).
    summaries: Vec<String>,
    /// The first few unusual lines, as evidence.
    unusual: Vec<String>,
}

fn parse_worker_lines(lines: &[Line]) -> WorkerLog {
    let mut w = WorkerLog::default();
    for l in lines {
        let body = l
            .text
            .split_once(": ")
            .filter(|(h, _)| h.starts_with("worker "))
            .map(|(_, b)| b)
            .unwrap_or(&l.text);
        let mut normal = false;
        if let Some(rest) = body.strip_prefix("item ") {
            let job = rest.get(..12).unwrap_or("").to_string();
            let tail = rest.get(12..).unwrap_or("");
            if tail == ": done" {
                w.done.push((job, l.worker.clone(), l.ms));
                normal = true;
            } else if tail == ": started" {
                normal = true;
            } else if tail == ": stopped and released" {
                w.released += 1;
            } else if tail.contains("pausing") {
                w.paused += 1;
            } else if tail.contains("could not publish") {
                w.publish_failed += 1;
            } else if tail.starts_with(" (") && tail.contains("), attempt ") {
                let stream = tail
                    .trim_start_matches(" (")
                    .split_once(')')
                    .map(|(s, _)| s.split_once(' ').map(|(_, st)| st).unwrap_or(s))
                    .unwrap_or("")
                    .to_string();
                w.starts.push((job, l.worker.clone(), l.ms, stream));
                normal = true;
            } else if tail.contains("already published") {
                w.duplicates += 1;
            } else if tail.contains("lease lost") {
                w.lease_lost += 1;
            } else if tail.contains("given up") {
                w.given_up += 1;
            } else if tail.contains("failed") || tail.contains("could not start") {
                w.failed_attempts += 1;
            }
        } else if body.starts_with("store error") {
            w.store_errors += 1;
        } else if body.starts_with("refused ") {
            w.refused += 1;
        } else if body.ends_with(" duplicate(s)") && body.contains(" done, ") {
            // The summary a worker prints when it stops.
            w.summaries.push(format!("{}: {body}", l.worker));
            normal = true;
        } else if body.contains("slot(s) on") {
            normal = true;
        }
        if !normal && w.unusual.len() < 8 {
            w.unusual.push(format!("{}: {}", l.worker, l.text));
        }
    }
    w
}

// ---------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------

/// What one `mass run` gave.
struct RunResult {
    collect_secs: f64,
    items: u64,
    run_secs: f64,
    cpu_secs: f64,
    stages: BTreeMap<String, f64>,
    head: String,
    spans: Vec<Span>,
    end_ms: u64,
    workers: Option<WorkersResult>,
}

impl RunResult {
    fn rate(&self) -> f64 {
        self.items as f64 / self.collect_secs
    }
}

/// What a workers run adds.
struct WorkersResult {
    run_items: u64,
    coord_requests: Option<u64>,
    worker_requests: Option<u64>,
    coord_kinds: BTreeMap<String, u64>,
    window_requests: Option<u64>,
    moto_lines: Option<u64>,
    /// Of those, the lines naming this run's bucket.
    moto_lines_bucket: Option<u64>,
    moto_cpu: Option<f64>,
    to_get_ms: Vec<f64>,
    to_record_ms: Vec<f64>,
    exec_ms: Vec<f64>,
    gap_ms: Vec<f64>,
    setup_ms: Vec<f64>,
    finish_ms: Vec<f64>,
    /// The workers' CPU (their processes and reaped children).
    workers_cpu: f64,
    /// Cores used by moto, the coordinator and the workers during the
    /// collection, and during the judge stage.
    cores_collect: [Option<f64>; 3],
    cores_judge: [Option<f64>; 3],
    worker_kinds: BTreeMap<String, u64>,
    /// The judge stage's items (`c1/<task>/pair/...` records) and wall.
    judge_items: u64,
    judge_secs: f64,
    coord_reqs_collect: Option<u64>,
    worker_reqs_collect: Option<u64>,
    coord_reqs_judge: Option<u64>,
    worker_reqs_judge: Option<u64>,
    logs: Value,
    unusual: Vec<String>,
}

/// A collection rollout's span in the ledger: its `orch` stream's first
/// and last event (`wall_ms`, recorded by whichever process executed it).
#[derive(Debug, Clone)]
struct Span {
    /// Relative to the run: `c1/<task>/collect/<NN>`.
    stream: String,
    first: u64,
    last: u64,
}

/// What `mass report` and the refs say of a run.
struct ReadRun {
    collect: f64,
    stages: BTreeMap<String, f64>,
    items: u64,
    head: String,
    spans: Vec<Span>,
    /// The collection's end: its milestone note ("cycle 1: collection
    /// done"), `wall_ms`; its start is `collect` seconds earlier.
    end_ms: u64,
    /// The judge stage's end (its note "cycle 1: N comparison(s) judged");
    /// it starts where the collection ends.
    judge_end_ms: u64,
}

/// The run's collection wall time, stage times, items, head and the
/// collection rollouts' spans.
fn read_run(bin: &Path, ledger: &Path) -> ReadRun {
    let (out, _) = run(mass(bin, Some(ledger), &[], &["report", RUN, "--json"]));
    let rep: Value = serde_json::from_str(&out).expect("`mass report --json` output");
    let mut stages = BTreeMap::new();
    for s in rep["cycles"][0]["stages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        if let (Some(name), Some(secs)) = (s["stage"].as_str(), s["wall_seconds"].as_f64()) {
            stages.insert(name.to_string(), secs);
        }
    }
    let collect = *stages
        .get("collect")
        .unwrap_or_else(|| panic!("`mass report {RUN} --json` has no collect stage: {out}"));
    let (out, _) = run(mass(bin, Some(ledger), &[], &["refs", "--json"]));
    let refs: Value = serde_json::from_str(&out).expect("`mass refs --json` output");
    let mut head = String::new();
    let mut spans = Vec::new();
    for r in refs.as_array().cloned().unwrap_or_default() {
        let name = r["name"].as_str().unwrap_or("");
        if name == RUN {
            head = r["head"].as_str().unwrap_or("").to_string();
        }
        if name.starts_with(&format!("{RUN}/c1/"))
            && name.contains("/collect/")
            && name.ends_with("/orch")
        {
            let (out, _) = run(mass(bin, Some(ledger), &[], &["log", name, "--json"]));
            let events: Vec<Value> = serde_json::from_str(&out).expect("`mass log --json`");
            let ms: Vec<u64> = events
                .iter()
                .filter_map(|e| e["meta"]["wall_ms"].as_u64())
                .collect();
            let stream = name
                .strip_prefix(&format!("{RUN}/"))
                .and_then(|n| n.strip_suffix("/orch"))
                .unwrap_or(name)
                .to_string();
            spans.push(Span {
                stream,
                first: ms.iter().copied().min().unwrap_or(0),
                last: ms.iter().copied().max().unwrap_or(0),
            });
        }
    }
    let (out, _) = run(mass(bin, Some(ledger), &[], &["log", RUN, "--json"]));
    let main: Vec<Value> = serde_json::from_str(&out).expect("`mass log --json`");
    let end_ms = main
        .iter()
        .find(|e| {
            e["kind"] == "note"
                && e["payload"]["text"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("cycle 1: collection done"))
        })
        .and_then(|e| e["meta"]["wall_ms"].as_u64())
        .unwrap_or(0);
    let judge_end_ms = main
        .iter()
        .find(|e| {
            e["kind"] == "note"
                && e["payload"]["text"].as_str().is_some_and(|t| {
                    t.starts_with("cycle 1: ") && t.ends_with("comparison(s) judged")
                })
        })
        .and_then(|e| e["meta"]["wall_ms"].as_u64())
        .unwrap_or(0);
    ReadRun {
        collect,
        stages,
        items: spans.len() as u64,
        head,
        spans,
        end_ms,
        judge_end_ms,
    }
}

fn run_in_process(bin: &Path, dir: &Path, exp: &Path) -> RunResult {
    let ledger = dir.join("ledger");
    let exp_s = exp.display().to_string();
    let cpu0 = children_cpu();
    let t = Instant::now();
    let mut child = mass(bin, Some(&ledger), &[], &["run", "--quiet", &exp_s])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start `mass run`");
    let err = read_in_thread(child.stderr.take());
    let status = wait_deadline(&mut child, "mass run", RUN_DEADLINE);
    let err = err.join().unwrap_or_default();
    let run_secs = t.elapsed().as_secs_f64();
    let cpu_secs = children_cpu() - cpu0;
    assert!(
        status.success(),
        "mass run {exp_s} failed ({status}): {err}"
    );
    let rr = read_run(bin, &ledger);
    if !keep() {
        let _ = fs::remove_dir_all(&ledger);
    }
    RunResult {
        collect_secs: rr.collect,
        items: rr.items,
        run_secs,
        cpu_secs,
        stages: rr.stages,
        head: rr.head,
        spans: rr.spans,
        end_ms: rr.end_ms,
        workers: None,
    }
}

/// The store a workers run uses.
enum Store<'a> {
    S3 {
        s3: &'a S3,
        coord: Option<&'a Proxy>,
        workers: Option<&'a Proxy>,
    },
    Folder,
}

fn run_workers(
    bin: &Path,
    dir: &Path,
    exp: &Path,
    n: usize,
    store: &Store<'_>,
    tag: &str,
) -> RunResult {
    let ledger = dir.join("ledger");
    let wtmp = dir.join("worker-tmp");
    let exp_s = exp.display().to_string();
    // The store, and each side's environment.
    let (url, coord_env, worker_env) = match store {
        Store::S3 { s3, coord, workers } => {
            let bucket = format!("mass-bench-workers-{}-{tag}", std::process::id());
            s3.make_bucket(&bucket);
            let with = |p: Option<&&Proxy>| {
                let mut env = s3.env.clone();
                if let Some(p) = p {
                    for (k, v) in env.iter_mut() {
                        if k == "AWS_ENDPOINT" || k == "MASS_S3_ENDPOINT" {
                            *v = p.endpoint();
                        }
                    }
                }
                env
            };
            (
                format!("s3://{bucket}"),
                with(coord.as_ref()),
                with(workers.as_ref()),
            )
        }
        Store::Folder => {
            let f = dir.join("store");
            (f.display().to_string(), Vec::new(), Vec::new())
        }
    };
    let (coord_proxy, worker_proxy) = match store {
        Store::S3 { coord, workers, .. } => (*coord, *workers),
        Store::Folder => (None, None),
    };
    // A worker is up once its first heartbeat is on the store.
    let seen = |name: &str, from: usize| -> bool {
        match store {
            Store::Folder => dir
                .join("store/work/workers")
                .join(format!("{name}.json"))
                .is_file(),
            Store::S3 { .. } => match worker_proxy {
                Some(p) => p
                    .since(from)
                    .iter()
                    .any(|r| r.target.contains(&format!("work/workers/{name}.json"))),
                // Without a proxy there is nothing to watch: give it time.
                None => true,
            },
        }
    };
    let mut group = WorkerGroup::new();
    let w0 = worker_proxy.map(|p| p.len()).unwrap_or(0);
    for k in 1..=n {
        let name = format!("w{k}");
        group.spawn(bin, &url, &name, &worker_env, &wtmp.join(&name));
        // Worker 1 alone first: it marks the fresh store.
        if k == 1 || k == n {
            let t = Instant::now();
            let names: Vec<String> = (1..=k).map(|i| format!("w{i}")).collect();
            while !names.iter().all(|nm| seen(nm, w0)) {
                for nm in &names {
                    group.check_alive(nm);
                }
                if t.elapsed() > Duration::from_secs(60) {
                    panic!(
                        "the workers did not heartbeat within 60 s:\n{}",
                        group.text()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if worker_proxy.is_none() && matches!(store, Store::S3 { .. }) {
                std::thread::sleep(Duration::from_secs(2));
            }
        }
    }
    let moto_log = match store {
        Store::S3 { s3, .. } => s3.moto_log(),
        Store::Folder => None,
    };
    let moto_pid = match store {
        Store::S3 { s3, .. } => s3.moto_pid(),
        Store::Folder => None,
    };
    let moto0 = moto_log.as_deref().and_then(line_count);
    let moto_cpu0 = moto_pid.and_then(process_cpu);
    let c0 = coord_proxy.map(|p| p.len()).unwrap_or(0);
    let w1 = worker_proxy.map(|p| p.len()).unwrap_or(0);

    // The coordinator.
    let cpu0 = children_cpu();
    let t = Instant::now();
    let mut child = mass(
        bin,
        Some(&ledger),
        &coord_env,
        &["run", "--quiet", &exp_s, "--workers", &url],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start `mass run --workers`");
    // moto, the coordinator, then the workers.
    let mut pids = vec![moto_pid, Some(child.id())];
    pids.extend(group.children.iter().map(|(_, c)| Some(c.id())));
    let sampler = Sampler::start(pids);
    let err = read_in_thread(child.stderr.take());
    let status = wait_deadline(&mut child, "mass run --workers", RUN_DEADLINE);
    let err = err.join().unwrap_or_default();
    let run_secs = t.elapsed().as_secs_f64();
    let cpu_secs = children_cpu() - cpu0;
    let samples = sampler.finish();
    let bucket = url.strip_prefix("s3://").unwrap_or("");
    let moto1 = moto_log
        .as_deref()
        .zip(moto0)
        .and_then(|(p, from)| lines_since(p, from, bucket));
    let moto_cpu1 = moto_pid.and_then(process_cpu);
    group.note_exited();
    let wcpu0 = children_cpu();
    group.stop();
    let workers_cpu = children_cpu() - wcpu0;
    if !status.success() {
        panic!(
            "mass run --workers {url} failed ({status}): {err}\nworkers:\n{}",
            group.text()
        );
    }
    let coord_reqs = coord_proxy.map(|p| p.since(c0));
    let worker_reqs = worker_proxy.map(|p| p.since(w1));

    let rr = read_run(bin, &ledger);
    // The run's `mass.work` records: job -> (stream, ms).
    let (out, _) = run(mass(
        bin,
        Some(&ledger),
        &[],
        &["log", &format!("{RUN}/workers"), "--json"],
    ));
    let records: Vec<Value> = serde_json::from_str(&out).expect("`mass log --json` output");
    let mut recorded: BTreeMap<String, (String, u64)> = BTreeMap::new();
    let mut retried = 0u64;
    for r in &records {
        let p = &r["payload"];
        let job = p["item"].as_str().unwrap_or("").to_string();
        let stream = p["stream"].as_str().unwrap_or("").to_string();
        let ms = r["meta"]["wall_ms"].as_u64().unwrap_or(0);
        if p["attempt"].as_u64().unwrap_or(1) > 1
            || p["attempts"].as_array().is_some_and(|a| !a.is_empty())
        {
            retried += 1;
        }
        recorded.insert(job, (stream, ms));
    }
    let is_collect = |stream: &str| stream.contains("/collect/");
    let collect_jobs: BTreeMap<&String, u64> = recorded
        .iter()
        .filter(|(_, (s, _))| is_collect(s))
        .map(|(j, (_, ms))| (j, *ms))
        .collect();
    let by_prefix = |j12: &str| recorded.keys().find(|k| k.starts_with(j12)).cloned();

    // The workers' logs.
    let lines = group.lines();
    let wl = parse_worker_lines(&lines);
    let mut started: BTreeMap<String, u64> = BTreeMap::new();
    for (j, ..) in &wl.starts {
        *started.entry(j.clone()).or_default() += 1;
    }
    let twice = started.values().filter(|c| **c > 1).count();
    // Per collection item: result published (worker log) -> coordinator
    // GET and -> record.
    let done_at: BTreeMap<String, u64> = wl
        .done
        .iter()
        .filter_map(|(j, _, ms)| Some((by_prefix(j)?, *ms)))
        .collect();
    let mut get_at: BTreeMap<String, u64> = BTreeMap::new();
    let mut publish_at: BTreeMap<String, u64> = BTreeMap::new();
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    for r in coord_reqs.iter().flatten() {
        let (kind, job) = classify(r);
        *kinds.entry(kind.clone()).or_default() += 1;
        if let Some(job) = job {
            if kind == "GET work/results" {
                get_at.entry(job).or_insert(r.ms);
            } else if kind == "PUT work/items" {
                publish_at.entry(job).or_insert(r.ms);
            }
        }
    }
    let mut to_get = Vec::new();
    let mut to_record = Vec::new();
    for (job, rec_ms) in &collect_jobs {
        if let Some(d) = done_at.get(*job) {
            to_record.push(*rec_ms as f64 - *d as f64);
            if let Some(g) = get_at.get(*job) {
                to_get.push(*g as f64 - *d as f64);
            }
        }
    }
    // Per collection item on a worker: start -> result, and the gap from a
    // result to the same worker's next collection start.
    // Also, from the rollout's span in the ledger: claim (its log line) ->
    // the rollout's first event (setup), and its last event -> the result
    // published (finish: the worker noticing, pushing, publishing).
    let mut per_worker: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    let (mut setup_ms, mut finish_ms) = (Vec::new(), Vec::new());
    for (j, w, ms, stream) in &wl.starts {
        if !is_collect(stream) {
            continue;
        }
        if let Some(d) = wl
            .done
            .iter()
            .find(|(dj, dw, dms)| dj == j && dw == w && *dms >= *ms)
        {
            per_worker.entry(w.clone()).or_default().push((*ms, d.2));
            if let Some(sp) = rr.spans.iter().find(|sp| sp.stream == *stream) {
                setup_ms.push(sp.first as f64 - *ms as f64);
                finish_ms.push(d.2 as f64 - sp.last as f64);
            }
        }
    }
    let mut exec_ms = Vec::new();
    let mut gap_ms = Vec::new();
    for v in per_worker.values_mut() {
        v.sort();
        for (i, (s, d)) in v.iter().enumerate() {
            exec_ms.push(*d as f64 - *s as f64);
            if let Some((next, _)) = v.get(i + 1) {
                gap_ms.push(*next as f64 - *d as f64);
            }
        }
    }
    // The coordinator's requests while the collection ran: from the first
    // collection item's publication to its last record.
    let window = coord_reqs.as_ref().and_then(|reqs| {
        let from = collect_jobs
            .keys()
            .filter_map(|j| publish_at.get(*j))
            .min()?;
        let to = collect_jobs.values().max()?;
        Some(reqs.iter().filter(|r| r.ms >= *from && r.ms <= *to).count() as u64)
    });
    // CPU use (cores) of moto, the coordinator and the workers (their own
    // processes, summed) during the collection and the judge stage, and
    // the requests each side made in those windows.
    let collect_from = rr.end_ms.saturating_sub((rr.collect * 1e3) as u64);
    let windows = [(collect_from, rr.end_ms), (rr.end_ms, rr.judge_end_ms)];
    let use_in = |(a, b): (u64, u64)| -> [Option<f64>; 3] {
        let w: Vec<f64> = (0..n)
            .filter_map(|k| cores(&samples, 2 + k, a, b))
            .collect();
        [
            cores(&samples, 0, a, b),
            cores(&samples, 1, a, b),
            (w.len() == n).then(|| w.iter().sum()),
        ]
    };
    let reqs_in = |reqs: &Option<Vec<Req>>, (a, b): (u64, u64)| {
        reqs.as_ref()
            .map(|v| v.iter().filter(|r| r.ms >= a && r.ms <= b).count() as u64)
    };
    let judge_items = recorded
        .values()
        .filter(|(s, _)| s.split('/').nth(2) == Some("pair"))
        .count() as u64;
    let mut worker_kinds: BTreeMap<String, u64> = BTreeMap::new();
    for r in worker_reqs.iter().flatten() {
        *worker_kinds.entry(classify(r).0).or_default() += 1;
    }
    let judge_secs = rr.stages.get("judge").copied().unwrap_or(f64::NAN);
    // What the workers left in their TMPDIR.
    let mut leftover: BTreeMap<String, u64> = BTreeMap::new();
    for wd in fs::read_dir(&wtmp)
        .map(|d| d.flatten().collect::<Vec<_>>())
        .unwrap_or_default()
    {
        for e in fs::read_dir(wd.path())
            .map(|d| d.flatten().collect::<Vec<_>>())
            .unwrap_or_default()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            let prefix = name
                .rsplit_once('-')
                .map(|(p, _)| format!("{p}-*"))
                .unwrap_or(name);
            *leftover.entry(prefix).or_default() += 1;
        }
    }
    let logs = json!({
        "starts": wl.starts.len(),
        "done": wl.done.len(),
        "jobs_started_twice": twice,
        "duplicates": wl.duplicates,
        "failed_attempts": wl.failed_attempts,
        "lease_lost": wl.lease_lost,
        "store_errors": wl.store_errors,
        "given_up": wl.given_up,
        "refused": wl.refused,
        "released": wl.released,
        "paused": wl.paused,
        "publish_failed": wl.publish_failed,
        "summaries": wl.summaries,
        "exited_early": group.exited_early,
        "leftover_dirs": leftover,
        "records_retried": retried,
        "unusual_lines": wl.unusual,
    });
    if !keep() {
        let _ = fs::remove_dir_all(&ledger);
        let _ = fs::remove_dir_all(dir.join("store"));
        let _ = fs::remove_dir_all(&wtmp);
    } else {
        let log_text: Vec<String> = lines
            .iter()
            .map(|l| format!("{} {}: {}", l.ms, l.worker, l.text))
            .collect();
        let _ = fs::write(dir.join("workers.log"), log_text.join("\n") + "\n");
    }
    RunResult {
        collect_secs: rr.collect,
        items: rr.items,
        run_secs,
        cpu_secs,
        stages: rr.stages,
        head: rr.head,
        spans: rr.spans,
        end_ms: rr.end_ms,
        workers: Some(WorkersResult {
            run_items: records.len() as u64,
            coord_requests: coord_reqs.as_ref().map(|v| v.len() as u64),
            worker_requests: worker_reqs.as_ref().map(|v| v.len() as u64),
            coord_kinds: kinds,
            window_requests: window,
            moto_lines: moto1.map(|(all, _)| all),
            moto_lines_bucket: moto1.map(|(_, mine)| mine),
            moto_cpu: moto_cpu0.zip(moto_cpu1).map(|(a, b)| b - a),
            to_get_ms: to_get,
            to_record_ms: to_record,
            exec_ms,
            gap_ms,
            setup_ms,
            finish_ms,
            workers_cpu,
            cores_collect: use_in(windows[0]),
            cores_judge: use_in(windows[1]),
            worker_kinds,
            judge_items,
            judge_secs,
            coord_reqs_collect: reqs_in(&coord_reqs, windows[0]),
            worker_reqs_collect: reqs_in(&worker_reqs, windows[0]),
            coord_reqs_judge: reqs_in(&coord_reqs, windows[1]),
            worker_reqs_judge: reqs_in(&worker_reqs, windows[1]),
            logs,
            unusual: wl.unusual,
        }),
    }
}

// ---------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------

/// One configuration's results over the reps.
struct Config {
    executor: &'static str,
    n: usize,
    concurrency: usize,
    reps: Vec<RunResult>,
}

impl Config {
    fn rates(&self) -> Vec<f64> {
        self.reps.iter().map(RunResult::rate).collect()
    }
    fn rate(&self) -> f64 {
        median(&self.rates())
    }
    fn collect(&self) -> f64 {
        median(&self.reps.iter().map(|r| r.collect_secs).collect::<Vec<_>>())
    }
    fn run_secs(&self) -> f64 {
        median(&self.reps.iter().map(|r| r.run_secs).collect::<Vec<_>>())
    }
    fn items(&self) -> u64 {
        self.reps.first().map(|r| r.items).unwrap_or(0)
    }
}

/// A run's collection rollouts' spans, in seconds.
struct SpanStats {
    median: f64,
    longest: f64,
    sum: f64,
    /// The least wall time n slots need for them: max(sum / n, longest).
    bound: f64,
    /// Slot time outside every span, per item: (wall x n - sum) / items.
    outside: f64,
    /// The stage's start to its first rollout's first event.
    lead: f64,
    /// Its last rollout's last event to the stage's end.
    tail: f64,
}

fn print_table<const N: usize>(rows: &[[String; N]]) {
    let mut widths = [0usize; N];
    for line in rows {
        for (w, cell) in widths.iter_mut().zip(line.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for (i, line) in rows.iter().enumerate() {
        let cells: Vec<String> = line
            .iter()
            .zip(widths.iter())
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("| {} |", cells.join(" | "));
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            println!("|-{}-|", rule.join("-|-"));
        }
    }
}

fn smoke_test() {
    let tmp = tempdir("workers-smoke");
    let tasks = write_tasks(tmp.path(), 0.5);
    for (id, _) in TASKS {
        let text = fs::read_to_string(tasks.join(id).join("task.toml")).expect("task.toml");
        assert!(text.contains("command = 'sleep 0.5; "), "{id}: {text}");
        assert!(tasks.join(id).join("checks/validate.py").is_file());
    }
    let exp = experiment(&tasks, 8, 16);
    assert!(exp.contains("concurrency = 16") && exp.contains("runs_per_task = 8"));
    let parsed: Result<toml::Value, _> = toml::from_str(&exp);
    assert!(parsed.is_ok(), "the experiment is not TOML: {parsed:?}");
    println!("workers bench smoke test passed (measure with `cargo bench --bench workers`)");
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs bench
    // targets without it. There, only a smoke test runs.
    if !std::env::args().skip(1).any(|a| a == "--bench") {
        smoke_test();
        return;
    }
    let cfg = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let load_before = load_average();
    let bin = mass_bin();
    let tmp = tempdir("workers");
    let items = cfg.runs as usize * train_tasks();
    println!(
        "mass workers benchmark: {} rep(s), checks sleep {} s, {} collection items ({} runs x {} train tasks); load average {}; mass {}",
        cfg.reps,
        cfg.sleep,
        items,
        cfg.runs,
        train_tasks(),
        load_before.map(|l| format!("{l:.2}")).unwrap_or_else(|| "n/a".into()),
        bin.display()
    );
    let tasks = write_tasks(tmp.path(), cfg.sleep);
    let exp_at = |c: usize| {
        let p = tmp.path().join(format!("experiment-c{c}.toml"));
        fs::write(&p, experiment(&tasks, cfg.runs, c)).expect("write the experiment");
        p
    };

    // The store.
    let mut note = String::new();
    let s3 = if cfg.folder {
        note = "--folder".into();
        None
    } else {
        match S3::start(tmp.path()) {
            Ok(s) => Some(s),
            Err(e) => {
                println!("  S3 unavailable ({e}); using a folder store");
                note = format!("S3 unavailable: {e}");
                None
            }
        }
    };
    let proxies = s3.as_ref().and_then(|s| {
        let up = s.upstream()?;
        Some((Proxy::start(up).ok()?, Proxy::start(up).ok()?))
    });
    let store = match &s3 {
        Some(s) => Store::S3 {
            s3: s,
            coord: proxies.as_ref().map(|p| &p.0),
            workers: proxies.as_ref().map(|p| &p.1),
        },
        None => Store::Folder,
    };
    match &s3 {
        Some(s) => println!(
            "  store: S3 at {} ({}), a fresh bucket per workers run{}",
            s.endpoint,
            if proxies.is_some() {
                "coordinator and workers through counting proxies"
            } else {
                "no proxies: requests not attributed"
            },
            s.moto_log()
                .map(|p| format!("; moto log {}", p.display()))
                .unwrap_or_default()
        ),
        None => println!("  store: a fresh folder per workers run (no request counts)"),
    }

    let mut configs: Vec<Config> = Vec::new();
    for n in COUNTS {
        configs.push(Config {
            executor: "in-process",
            n,
            concurrency: n,
            reps: Vec::new(),
        });
    }
    for n in COUNTS {
        configs.push(Config {
            executor: "workers",
            n,
            concurrency: items,
            reps: Vec::new(),
        });
    }
    for rep in 0..cfg.reps {
        println!("\n== rep {} of {} ==", rep + 1, cfg.reps);
        for (ci, c) in configs.iter_mut().enumerate() {
            let dir = tmp.path().join(format!("rep{rep}-{ci}"));
            fs::create_dir_all(&dir).expect("mkdir");
            let exp = exp_at(c.concurrency);
            let r = if c.executor == "in-process" {
                run_in_process(&bin, &dir, &exp)
            } else {
                run_workers(&bin, &dir, &exp, c.n, &store, &format!("r{rep}-n{}", c.n))
            };
            let extra = match &r.workers {
                Some(w) => format!(
                    "; coordinator {} request(s) for {} item(s), result -> recorded {}",
                    w.coord_requests
                        .map(|x| x.to_string())
                        .unwrap_or_else(|| "n/a".into()),
                    w.run_items,
                    fmt_ms_summary(&w.to_record_ms)
                ),
                None => String::new(),
            };
            println!(
                "  {:<10} n={} (concurrency {:>2}): collect {} items in {:.2} s = {:.3} items/s; run {:.1} s, CPU {:.1} s{extra}",
                c.executor,
                c.n,
                c.concurrency,
                r.items,
                r.collect_secs,
                r.rate(),
                r.run_secs,
                r.cpu_secs
            );
            if let Some(w) = &r.workers {
                for u in w.unusual.iter().take(4) {
                    println!("    worker log: {u}");
                }
            }
            c.reps.push(r);
        }
    }

    // Table and ratios.
    let ip = |n: usize| {
        configs
            .iter()
            .find(|c| c.executor == "in-process" && c.n == n)
            .map(Config::rate)
            .unwrap_or(f64::NAN)
    };
    let wk = |n: usize| {
        configs
            .iter()
            .find(|c| c.executor == "workers" && c.n == n)
            .map(Config::rate)
            .unwrap_or(f64::NAN)
    };
    let scale = |f: &dyn Fn(usize) -> f64, n: usize| f(n) / (n as f64 * f(1));
    println!("\n== collection stage, medians of {} rep(s) ==", cfg.reps);
    let mut table: Vec<[String; 8]> = vec![[
        "executor",
        "n",
        "items",
        "collect wall",
        "items/s",
        "scaling vs n=1",
        "vs in-process n",
        "run wall",
    ]
    .map(String::from)];
    let mut rows_json = Vec::new();
    for c in &configs {
        let rate = c.rate();
        let scaling = if c.n == 1 {
            f64::NAN
        } else if c.executor == "workers" {
            scale(&wk, c.n)
        } else {
            scale(&ip, c.n)
        };
        let vs = if c.executor == "workers" {
            rate / ip(c.n)
        } else {
            f64::NAN
        };
        let reps_txt = if c.reps.len() > 1 {
            format!(
                " [{}]",
                c.rates()
                    .iter()
                    .map(|r| format!("{r:.3}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            String::new()
        };
        table.push([
            c.executor.to_string(),
            c.n.to_string(),
            c.items().to_string(),
            format!("{:.2} s", c.collect()),
            format!("{rate:.3}{reps_txt}"),
            if scaling.is_finite() {
                format!("{scaling:.3}")
            } else {
                "-".into()
            },
            if vs.is_finite() {
                format!("{vs:.3}")
            } else {
                "-".into()
            },
            format!("{:.1} s", c.run_secs()),
        ]);
        rows_json.push(json!({
            "executor": c.executor,
            "n": c.n,
            "items": c.items(),
            "collect_secs": c.collect(),
            "rate": num(rate),
            "scaling": num(scaling),
            "vs_in_process": num(vs),
            "run_secs": c.run_secs(),
        }));
    }
    print_table(&table);
    let s4 = scale(&wk, 4);
    let pass = s4 >= GOAL;
    println!(
        "\nscaling, workers: n=2 {}, n=4 {} (goal >= {GOAL} at n=4): {}",
        fmt_num(scale(&wk, 2), 3),
        fmt_num(s4, 3),
        if pass { "PASS" } else { "FAIL" }
    );
    println!(
        "scaling, in process (the same rollouts n at a time in one process, no store: what the stage allows here): n=2 {}, n=4 {}",
        fmt_num(scale(&ip, 2), 3),
        fmt_num(scale(&ip, 4), 3)
    );
    println!(
        "workers / in process at the same n: n=1 {}, n=2 {}, n=4 {}",
        fmt_num(wk(1) / ip(1), 3),
        fmt_num(wk(2) / ip(2), 3),
        fmt_num(wk(4) / ip(4), 3)
    );

    // Where the collection's time goes: the rollouts' own spans (first to
    // last event of each), the least time n slots need for them with no
    // overhead at all (the larger of sum / n and the longest), and the wall.
    println!("\n== where the collection's time goes (medians over reps) ==");
    let mut spans_json = Vec::new();
    let mut table2: Vec<[String; 10]> = vec![[
        "executor",
        "n",
        "rollout span median",
        "longest",
        "sum",
        "bound: n slots, no overhead",
        "collect wall / bound",
        "outside spans per item",
        "stage start -> first event",
        "last event -> stage end",
    ]
    .map(String::from)];
    for c in &configs {
        let per_rep: Vec<SpanStats> = c
            .reps
            .iter()
            .map(|r| {
                let d: Vec<f64> = r
                    .spans
                    .iter()
                    .map(|s| (s.last as f64 - s.first as f64) / 1e3)
                    .collect();
                let sum: f64 = d.iter().sum();
                let longest = quantile(&d, 1.0);
                let bound = (sum / c.n as f64).max(longest);
                // Time not inside any rollout's span, per item, on n slots.
                let outside = (r.collect_secs * c.n as f64 - sum) / r.items as f64;
                let end = r.end_ms as f64 / 1e3;
                let start = end - r.collect_secs;
                let first = r.spans.iter().map(|s| s.first).min().unwrap_or(0) as f64 / 1e3;
                let last = r.spans.iter().map(|s| s.last).max().unwrap_or(0) as f64 / 1e3;
                SpanStats {
                    median: median(&d),
                    longest,
                    sum,
                    bound,
                    outside,
                    lead: first - start,
                    tail: end - last,
                }
            })
            .collect();
        let m = |f: &dyn Fn(&SpanStats) -> f64| median(&per_rep.iter().map(f).collect::<Vec<_>>());
        let ratio = median(
            &c.reps
                .iter()
                .zip(per_rep.iter())
                .map(|(r, p)| r.collect_secs / p.bound)
                .collect::<Vec<_>>(),
        );
        table2.push([
            c.executor.to_string(),
            c.n.to_string(),
            format!("{:.2} s", m(&|p| p.median)),
            format!("{:.2} s", m(&|p| p.longest)),
            format!("{:.2} s", m(&|p| p.sum)),
            format!("{:.2} s", m(&|p| p.bound)),
            format!("{ratio:.3}"),
            format!("{:.0} ms", m(&|p| p.outside) * 1e3),
            format!("{:.0} ms", m(&|p| p.lead) * 1e3),
            format!("{:.0} ms", m(&|p| p.tail) * 1e3),
        ]);
        spans_json.push(json!({
            "executor": c.executor,
            "n": c.n,
            "span_median_secs": per_rep.iter().map(|p| p.median).collect::<Vec<_>>(),
            "span_max_secs": per_rep.iter().map(|p| p.longest).collect::<Vec<_>>(),
            "span_sum_secs": per_rep.iter().map(|p| p.sum).collect::<Vec<_>>(),
            "bound_secs": per_rep.iter().map(|p| p.bound).collect::<Vec<_>>(),
            "outside_per_item_secs": per_rep.iter().map(|p| p.outside).collect::<Vec<_>>(),
            "lead_secs": per_rep.iter().map(|p| p.lead).collect::<Vec<_>>(),
            "tail_secs": per_rep.iter().map(|p| p.tail).collect::<Vec<_>>(),
            "wall_over_bound": num(ratio),
        }));
    }
    print_table(&table2);
    println!(
        "  (outside spans per item = (collect wall x n - sum of spans) / items: slot time in no rollout, setup and hand-over included; with n > 1 it also counts slots idle at the stage's end)"
    );

    // Overhead.
    println!("\n== the coordinator's overhead per item ==");
    let mut overhead = Vec::new();
    let mut logs_json = Vec::new();
    let ip_stage = |n: usize, stage: &str| {
        configs
            .iter()
            .find(|c| c.executor == "in-process" && c.n == n)
            .map(|c| {
                median(
                    &c.reps
                        .iter()
                        .filter_map(|r| r.stages.get(stage).copied())
                        .collect::<Vec<_>>(),
                )
            })
            .unwrap_or(f64::NAN)
    };
    let ip_cpu = configs
        .iter()
        .filter(|c| c.executor == "in-process")
        .flat_map(|c| c.reps.iter())
        .map(|r| r.cpu_secs)
        .collect::<Vec<_>>();
    for c in configs.iter().filter(|c| c.executor == "workers") {
        let ws: Vec<&WorkersResult> = c.reps.iter().filter_map(|r| r.workers.as_ref()).collect();
        let per = |f: &dyn Fn(&WorkersResult) -> Option<u64>, d: &dyn Fn(&WorkersResult) -> u64| {
            let v: Vec<f64> = ws
                .iter()
                .filter_map(|w| Some(f(w)? as f64 / d(w) as f64))
                .collect();
            if v.is_empty() {
                f64::NAN
            } else {
                median(&v)
            }
        };
        let coord_per = per(&|w| w.coord_requests, &|w| w.run_items);
        let worker_per = per(&|w| w.worker_requests, &|w| w.run_items);
        let window_per = per(&|w| w.window_requests, &|_| items as u64);
        let moto_per = per(&|w| w.moto_lines, &|w| w.run_items);
        let moto_mine = per(&|w| w.moto_lines_bucket, &|w| w.run_items);
        let all = |f: &dyn Fn(&WorkersResult) -> &Vec<f64>| -> Vec<f64> {
            ws.iter().flat_map(|w| f(w).iter().copied()).collect()
        };
        let (to_get, to_record, exec, gap) = (
            all(&|w| &w.to_get_ms),
            all(&|w| &w.to_record_ms),
            all(&|w| &w.exec_ms),
            all(&|w| &w.gap_ms),
        );
        let cpu: Vec<f64> = c.reps.iter().map(|r| r.cpu_secs).collect();
        let (setup, finish) = (all(&|w| &w.setup_ms), all(&|w| &w.finish_ms));
        let kinds = ws
            .first()
            .map(|w| w.coord_kinds.clone())
            .unwrap_or_default();
        println!("  workers n={}:", c.n);
        println!(
            "    store requests: coordinator {} per item of the run ({} item(s): rollouts and judgments), {} per collection item while the collection ran; workers {} per item; moto access-log lines {} per item, {} naming this run's bucket (the rest: other clients of the server)",
            fmt_num(coord_per, 1),
            ws.first().map(|w| w.run_items).unwrap_or(0),
            fmt_num(window_per, 1),
            fmt_num(worker_per, 1),
            fmt_num(moto_per, 1),
            fmt_num(moto_mine, 1),
        );
        if !kinds.is_empty() {
            let k: Vec<String> = kinds.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("    coordinator requests by kind (rep 1): {}", k.join(", "));
        }
        println!(
            "    result published -> coordinator GET of it: {}",
            fmt_ms_summary(&to_get)
        );
        println!(
            "    result published -> recorded in the run: {}",
            fmt_ms_summary(&to_record)
        );
        println!(
            "    on a worker, per collection item: claimed -> result published {}; of which claimed -> the rollout's first event {}, its last event -> result published {}; result published -> the worker's next claim {}",
            fmt_ms_summary(&exec),
            fmt_ms_summary(&setup),
            fmt_ms_summary(&finish),
            fmt_ms_summary(&gap)
        );
        let wcpu: Vec<f64> = ws.iter().map(|w| w.workers_cpu).collect();
        let moto_cpu: Vec<f64> = ws.iter().filter_map(|w| w.moto_cpu).collect();
        println!(
            "    CPU of the whole run (user + system, children included): coordinator {} s, workers {} s, moto {} s; in-process runs {} s (medians)",
            fmt_num(median(&cpu), 1),
            fmt_num(median(&wcpu), 1),
            fmt_num(median(&moto_cpu), 1),
            fmt_num(median(&ip_cpu), 1),
        );
        let cores_of = |f: &dyn Fn(&WorkersResult) -> [Option<f64>; 3]| -> [f64; 3] {
            let col = |i: usize| median(&ws.iter().filter_map(|w| f(w)[i]).collect::<Vec<_>>());
            [col(0), col(1), col(2)]
        };
        let (cc, cj) = (cores_of(&|w| w.cores_collect), cores_of(&|w| w.cores_judge));
        let sum_opt = |f: &dyn Fn(&WorkersResult) -> Option<u64>| -> Option<u64> {
            ws.iter().map(|w| f(w)).sum::<Option<u64>>()
        };
        let per_k =
            |x: Option<u64>, d: u64| x.map(|x| x as f64 / d.max(1) as f64).unwrap_or(f64::NAN);
        let collect_items_all = items as u64 * ws.len() as u64;
        println!(
            "    during the collection: cores used (medians; processes' own CPU) moto {}, coordinator {}, workers together {}; requests per collection item: coordinator {}, workers {}",
            fmt_num(cc[0], 2),
            fmt_num(cc[1], 2),
            fmt_num(cc[2], 2),
            fmt_num(per_k(sum_opt(&|w| w.coord_reqs_collect), collect_items_all), 1),
            fmt_num(per_k(sum_opt(&|w| w.worker_reqs_collect), collect_items_all), 1),
        );
        let judge_items = ws.first().map(|w| w.judge_items).unwrap_or(0);
        let judge_all = ws.iter().map(|w| w.judge_items).sum::<u64>();
        let judge_secs: Vec<f64> = ws.iter().map(|w| w.judge_secs).collect();
        println!(
            "    judge stage (not in the figures above): {} judgment(s) in {} s (in process, n={}: {} s); requests per judgment: coordinator {}, workers {}; cores used: moto {}, coordinator {}, workers together {}",
            judge_items,
            fmt_num(median(&judge_secs), 1),
            c.n,
            fmt_num(ip_stage(c.n, "judge"), 2),
            fmt_num(per_k(sum_opt(&|w| w.coord_reqs_judge), judge_all), 1),
            fmt_num(per_k(sum_opt(&|w| w.worker_reqs_judge), judge_all), 1),
            fmt_num(cj[0], 2),
            fmt_num(cj[1], 2),
            fmt_num(cj[2], 2),
        );
        let wk_kinds = ws
            .first()
            .map(|w| w.worker_kinds.clone())
            .unwrap_or_default();
        if !wk_kinds.is_empty() {
            let k: Vec<String> = wk_kinds.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("    workers' requests by kind (rep 1): {}", k.join(", "));
        }
        overhead.push(json!({
            "n": c.n,
            "coordinator_requests": ws.iter().map(|w| w.coord_requests).collect::<Vec<_>>(),
            "worker_requests": ws.iter().map(|w| w.worker_requests).collect::<Vec<_>>(),
            "run_items": ws.iter().map(|w| w.run_items).collect::<Vec<_>>(),
            "coordinator_per_item": num(coord_per),
            "worker_per_item": num(worker_per),
            "coordinator_kinds": kinds,
            "collect_window_requests": ws.iter().map(|w| w.window_requests).collect::<Vec<_>>(),
            "collect_window_per_item": num(window_per),
            "moto_lines": ws.iter().map(|w| w.moto_lines).collect::<Vec<_>>(),
            "moto_lines_bucket": ws.iter().map(|w| w.moto_lines_bucket).collect::<Vec<_>>(),
            "publish_to_get_ms": summary(&to_get),
            "publish_to_record_ms": summary(&to_record),
            "worker_exec_ms": summary(&exec),
            "worker_gap_ms": summary(&gap),
            "worker_setup_ms": summary(&setup),
            "worker_finish_ms": summary(&finish),
            "coordinator_cpu_secs": cpu,
            "in_process_cpu_secs": num(median(&ip_cpu)),
            "moto_cpu_secs": ws.iter().map(|w| w.moto_cpu).collect::<Vec<_>>(),
            "workers_cpu_secs": wcpu,
            "worker_kinds": wk_kinds,
            "cores_collect": {"moto": num(cc[0]), "coordinator": num(cc[1]), "workers": num(cc[2])},
            "cores_judge": {"moto": num(cj[0]), "coordinator": num(cj[1]), "workers": num(cj[2])},
            "collect_requests": {
                "coordinator": ws.iter().map(|w| w.coord_reqs_collect).collect::<Vec<_>>(),
                "workers": ws.iter().map(|w| w.worker_reqs_collect).collect::<Vec<_>>(),
            },
            "judge": {
                "items": judge_items,
                "secs": judge_secs,
                "in_process_secs": num(ip_stage(c.n, "judge")),
                "coordinator_requests": ws.iter().map(|w| w.coord_reqs_judge).collect::<Vec<_>>(),
                "worker_requests": ws.iter().map(|w| w.worker_reqs_judge).collect::<Vec<_>>(),
            },
        }));
        for (rep, w) in ws.iter().enumerate() {
            let mut l = w.logs.clone();
            l["n"] = json!(c.n);
            l["rep"] = json!(rep);
            logs_json.push(l);
        }
    }

    println!("\n== the workers' logs ==");
    let mut anomalies = 0u64;
    for l in &logs_json {
        let count = |k: &str| l[k].as_u64().unwrap_or(0);
        let bad = count("jobs_started_twice")
            + count("duplicates")
            + count("failed_attempts")
            + count("lease_lost")
            + count("store_errors")
            + count("given_up")
            + count("refused")
            + count("released")
            + count("paused")
            + count("publish_failed")
            + count("records_retried")
            + l["exited_early"]
                .as_array()
                .map(|a| a.len() as u64)
                .unwrap_or(0);
        anomalies += bad;
        println!(
            "  n={} rep {}: {} start(s), {} result(s); started twice {}, duplicates {}, failed attempts {}, leases lost {}, store errors {}, given up {}, refused {}, released at stop {}, paused {}, publish failed {}, records retried {}, exited early {}; left in TMPDIR {}",
            l["n"],
            l["rep"].as_u64().unwrap_or(0) + 1,
            count("starts"),
            count("done"),
            count("jobs_started_twice"),
            count("duplicates"),
            count("failed_attempts"),
            count("lease_lost"),
            count("store_errors"),
            count("given_up"),
            count("refused"),
            count("released"),
            count("paused"),
            count("publish_failed"),
            count("records_retried"),
            l["exited_early"],
            l["leftover_dirs"]
        );
    }
    let heads: BTreeSet<String> = configs
        .iter()
        .flat_map(|c| c.reps.iter().map(|r| r.head.clone()))
        .collect();
    println!(
        "  run heads: {} ({})",
        if heads.len() == 1 {
            "all the same"
        } else {
            "DIFFER"
        },
        heads
            .iter()
            .map(|h| h.get(..12).unwrap_or(h))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if anomalies > 0 {
        println!("  {anomalies} anomaly count(s) above: see the lines");
    }

    // JSON.
    let configs_json: Vec<Value> = configs
        .iter()
        .map(|c| {
            json!({
                "executor": c.executor,
                "n": c.n,
                "concurrency": c.concurrency,
                "collect_secs": c.reps.iter().map(|r| r.collect_secs).collect::<Vec<_>>(),
                "items": c.reps.iter().map(|r| r.items).collect::<Vec<_>>(),
                "rate": c.rates(),
                "run_secs": c.reps.iter().map(|r| r.run_secs).collect::<Vec<_>>(),
                "cpu_secs": c.reps.iter().map(|r| r.cpu_secs).collect::<Vec<_>>(),
                "stages": c.reps.iter().map(|r| json!(r.stages)).collect::<Vec<_>>(),
                "head": c.reps.iter().map(|r| r.head.clone()).collect::<Vec<_>>(),
                "rate_median": num(c.rate()),
                "collect_median": c.collect(),
                "run_median": c.run_secs(),
            })
        })
        .collect();
    let bench_secs = started.elapsed().as_secs_f64();
    let doc = json!({
        "reps": cfg.reps,
        "sleep_secs": cfg.sleep,
        "runs_per_task": cfg.runs,
        "collect_items": items,
        "worker_concurrency": items,
        "tasks": TASKS.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        "bench_secs": bench_secs,
        "load_before": load_before,
        "load_after": load_average(),
        "store": {
            "kind": if s3.is_some() { "s3" } else { "folder" },
            "endpoint": s3.as_ref().map(|s| s.endpoint.clone()),
            "proxied": proxies.is_some(),
            "moto_log": s3.as_ref().and_then(|s| s.moto_log()).map(|p| p.display().to_string()),
            "note": note,
        },
        "configs": configs_json,
        "scaling": {
            "workers": {"2": num(scale(&wk, 2)), "4": num(s4)},
            "in_process": {"2": num(scale(&ip, 2)), "4": num(scale(&ip, 4))},
            "vs_in_process": {
                "1": num(wk(1) / ip(1)),
                "2": num(wk(2) / ip(2)),
                "4": num(wk(4) / ip(4)),
            },
            "goal": GOAL,
            "pass": pass,
        },
        "overhead": overhead,
        "spans": spans_json,
        "worker_logs": logs_json,
        "heads": {
            "distinct": heads.iter().cloned().collect::<Vec<_>>(),
            "same": heads.len() == 1,
        },
        "rows": rows_json,
    });
    let dir = target_dir().join("bench");
    fs::create_dir_all(&dir).expect("create target/bench");
    let path = dir.join("workers.json");
    let text = serde_json::to_string_pretty(&doc).expect("serialise the bench summary") + "\n";
    fs::write(&path, text).expect("write target/bench/workers.json");
    drop(s3);
    println!(
        "\nwrote {} (total {:.0} s; load average {})",
        path.display(),
        bench_secs,
        load_average()
            .map(|l| format!("{l:.2}"))
            .unwrap_or_else(|| "n/a".into())
    );
    if cfg.strict && !pass {
        std::process::exit(1);
    }
}
