//! Remotes: `mass push` and `mass clone` of the quickstart ledger through a
//! real S3 server (moto, `scripts/s3-server.sh`), each against boto3 moving
//! the ledger directory's files through the same server in the same run, and
//! what a push stores and uploads against what the ledger holds.
//!
//! ```text
//! cargo bench --bench remote -- [--reps N] [--cycles N] [--strict]
//! ```
//!
//! What it does, in order:
//!
//! 1. **The ledger**: `mass --ledger TMP/ledger run --quiet
//!    examples/quickstart.toml` (2 cycles on the 12 example tasks, simulated
//!    backend and trainer; 83-88 s in release on this 2-core machine). With
//!    `--cycles N` a copy of the file runs instead, with `cycles = N` and
//!    `tasks_dir` made absolute (the only two lines changed).
//! 2. **Time** (median of `--reps`, default 5, at least 3; the two sides
//!    alternate which goes first): `mass push --quiet s3://BUCKET` of the
//!    ledger, each rep into a fresh bucket, against a boto3 script (run with
//!    `$MASS_S3_PYTHON`) doing `upload_file` of every file under the ledger
//!    directory, sequentially, into another fresh bucket; then `mass clone
//!    s3://BUCKET DIR` of rep i's pushed bucket into a fresh directory
//!    against boto3 listing rep i's baseline bucket and `download_file` of
//!    every object into a fresh directory. mass is timed as its whole
//!    process (start, ledger open, S3 client, transfer, and for clone the
//!    ledger commit with its fsyncs and index); boto3 inside the script from
//!    the first file to the last (interpreter start, `import boto3` and the
//!    client's creation excluded, so the baseline is the transfer alone; the
//!    script's whole process time is printed beside it). boto3's
//!    `upload_file` uploads a file over 8 MiB (the segment) in 8 MiB parts
//!    on up to 10 threads (its default transfer config). Buckets are made
//!    beforehand, untimed. The first clone is checked against the ledger
//!    (`mass refs` equal; `mass verify --json` clean with the same events,
//!    blobs and refs: not trees, as the quickstart ledger holds a tree no
//!    ref reaches, which a push leaves behind), the first download against
//!    the ledger's files (same names and sizes). Then, as information, the same push to a fresh
//!    folder and clone from it, `--reps` times: the local share of the work
//!    (no network; a folder remote syncs what it writes).
//! 3. **Bytes**: every object in rep 0's bucket after the push (the marker,
//!    packs, indexes, run records and their history, listed with boto3)
//!    against the ledger directory as `mass run` and `mass verify` left it
//!    (the sum of its file sizes, `du -b`): goal <= 1.0x. Then one more cycle: the run is
//!    pushed (untimed) to a fresh bucket, forked at its final head with one
//!    more cycle (`mass fork quickstart --name quickstart-cN+1 --set
//!    cycles=N+1`) and continued (`mass resume quickstart-cN+1`: cycles 1..N
//!    replay from the ledger, cycle N+1 runs live), and pushed again. The
//!    bytes that second push uploads (the `B` of its line "pushed to URL: N
//!    object(s) in K pack(s), B bytes uploaded": packs and indexes, not the
//!    run records) against the bytes the ledger's `segments/*.seg` grew by
//!    from before the fork to after the resume: goal <= 1.2x. (`mass run`
//!    of a copy with `cycles = N+1` does not add a cycle: a run that exists
//!    is resumed with its *recorded* definition, so it only replays; the
//!    fork is how a run gets more cycles.) The fork alone writes a copy of
//!    every ref of the run under the new name (ref records in the
//!    segments); its share of the growth is printed.
//! 4. A summary table, and `target/bench/remote.json` (under
//!    `CARGO_TARGET_DIR` when set).
//!
//! The S3 server: with `AWS_ENDPOINT` and `MASS_S3_PYTHON` both set, that
//! server is used as it is; otherwise `scripts/s3-server.sh start` starts
//! moto (or finds the one running, which is then left running; one this
//! bench started is stopped at the end). Every bucket the bench made is
//! deleted at the end. moto runs on the same 2 cores as both clients.
//! `MASS_BENCH_KEEP=1` keeps the temporary directory (ledger, clones) and
//! the buckets; `MASS_BENCH_BIN=path` runs another `mass`. `--strict` exits 1
//! when a goal is missed. Run without `--bench` (as `cargo test
//! --all-targets` does) it only pushes the engine-8-smoke fixture ledger to
//! a folder remote and clones it back (no S3, no python, no timing).
//!
//! ## `target/bench/remote.json`
//!
//! * `reps`: repetitions per timing; `server`: the S3 endpoint;
//!   `experiment`: `file` (what `mass run` ran), `run` and `cycles`,
//!   `run_secs` (how long `mass run` took), `extra_run` (the fork's name),
//!   `fork_secs`, `resume_secs`.
//! * `ledger`: the ledger directory after `mass run` and `mass verify`:
//!   `bytes` (every file,
//!   `du -b`), `segments` (`segments/*.seg`), `index` (`index/`), `files`,
//!   `objects` (`blobs` + `trees` + `events` of `mass verify --json`),
//!   `events`, `refs`.
//! * `push` and `clone`: `mass_secs` and `baseline_secs` (every rep, in
//!   order), `mass_median`, `baseline_median`, `ratio` (mass / baseline,
//!   medians), `baseline_process_secs` (the boto3 script's whole process per
//!   rep), `baseline` (what the baseline is), `folder_secs` (the same
//!   command with a folder for the bucket, every rep). `push` also has
//!   `objects`, `packs`, `uploaded` (the push line's figures, rep 0); `clone` has
//!   `downloaded` (frame bytes its line reports) and `clone_bytes` (the
//!   cloned directory, `du -b`, rep 0, its `remote-cache/` of the remote's
//!   pack indexes included).
//! * `bucket`: rep 0's bucket after the push: `objects`, `bytes`, and per
//!   kind (`marker`, `pack`, `idx`, `ref`, `history`, `other`) `{objects,
//!   bytes}` in `kinds`; `idx_entries`, `idx_frames`, `idx_links` (summed
//!   from the indexes' headers: an index is 60 bytes per entry, 48 per
//!   frame, 32 per event link, plus 1,128 bytes of header, fan-out and
//!   footer); `ratio` (bucket bytes / ledger bytes), `goal` (1.0), `pass`.
//! * `incremental`: `segments_before`, `segments_after_fork`,
//!   `segments_after`, `segments_grew` (after - before), `fork_bytes` (what
//!   the fork alone added), `uploaded`, `objects`, `packs` (the second push's
//!   line), `idx_bytes`, `pack_bytes`, `idx_entries`, `idx_links` (of the
//!   pack it added), `bucket_grew` (every object, run records included),
//!   `push_secs`, `ratio` (uploaded / segments_grew), `goal` (1.2), `pass`.
//! * `rows`: the summary table: `metric`, `unit` ("seconds" or "bytes"),
//!   `mass`, `baseline`, `baseline_name`, `ratio`, `goal` (text or null),
//!   `pass` (bool or null), `result` ("PASS", "MISS" or "info"), `note`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{json, Value};

const USAGE: &str = "usage: cargo bench --bench remote -- [--reps N] [--cycles N] [--strict]";
/// Set to keep the temporary directory and the buckets.
const KEEP_ENV: &str = "MASS_BENCH_KEEP";
/// Set to the `mass` binary to run instead of the one cargo built.
const BIN_ENV: &str = "MASS_BENCH_BIN";
const EXPERIMENT: &str = "examples/quickstart.toml";
const RUN: &str = "quickstart";
const MIB: f64 = 1024.0 * 1024.0;
const BYTES_GOAL: f64 = 1.0;
const INCREMENT_GOAL: f64 = 1.2;

/// The baseline and the bucket listing, run with `$MASS_S3_PYTHON` (boto3).
/// Prints one JSON object.
const HELPER_PY: &str = r#"
import json, os, struct, sys, time

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


def objects(bucket):
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        yield from page.get("Contents", [])


def kind(key):
    if key == "MASS-REMOTE":
        return "marker"
    for k in ("pack", "idx"):
        if key.startswith("packs/") and key.endswith("." + k):
            return k
    for k in ("refs", "history"):
        if key.startswith(k + "/"):
            return k.rstrip("s")
    return "other"


cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "mkbuckets":
    for b in args:
        s3.create_bucket(Bucket=b)
    out = {"buckets": len(args)}
elif cmd == "rmbuckets":
    for b in args:
        keys = [o["Key"] for o in objects(b)]
        for i in range(0, len(keys), 1000):
            s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})
        s3.delete_bucket(Bucket=b)
    out = {"buckets": len(args)}
elif cmd == "upload":
    root, bucket = args
    files = n = 0
    t = time.perf_counter()
    for d, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(d, name)
            s3.upload_file(path, bucket, os.path.relpath(path, root))
            files += 1
            n += os.path.getsize(path)
    out = {"secs": time.perf_counter() - t, "files": files, "bytes": n}
elif cmd == "download":
    bucket, root = args
    files = n = 0
    t = time.perf_counter()
    for o in objects(bucket):
        path = os.path.join(root, o["Key"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        s3.download_file(bucket, o["Key"], path)
        files += 1
        n += o["Size"]
    out = {"secs": time.perf_counter() - t, "files": files, "bytes": n}
elif cmd == "list":
    (bucket,) = args
    out = {"objects": 0, "bytes": 0, "kinds": {}, "idx_entries": 0, "idx_frames": 0, "idx_links": 0, "keys": {}}
    for o in objects(bucket):
        key, size = o["Key"], o["Size"]
        k = kind(key)
        out["objects"] += 1
        out["bytes"] += size
        agg = out["kinds"].setdefault(k, {"objects": 0, "bytes": 0})
        agg["objects"] += 1
        agg["bytes"] += size
        out["keys"][key] = size
        if k == "idx":
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            e, f, l = struct.unpack_from("<III", body, 56)
            out["idx_entries"] += e
            out["idx_frames"] += f
            out["idx_links"] += l
else:
    sys.exit(f"unknown command {cmd}")
print(json.dumps(out))
"#;

// ---------------------------------------------------------------------------
// Configuration and results
// ---------------------------------------------------------------------------

struct Cfg {
    reps: usize,
    /// `cycles` for a copy of the experiment; None runs the file as it is.
    cycles: Option<u32>,
    strict: bool,
}

fn parse_args() -> Result<Cfg, String> {
    let mut cfg = Cfg {
        reps: 5,
        cycles: None,
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
                .ok_or(format!("{name} needs a number"))?
                .parse::<u32>()
                .map_err(|_| format!("bad {name} value"))
        };
        match flag.as_str() {
            // cargo passes `--bench` to harness = false bench targets.
            "--bench" => {}
            "--strict" => cfg.strict = true,
            "--reps" => {
                cfg.reps = value("--reps")? as usize;
                if cfg.reps < 3 {
                    return Err("--reps must be at least 3 (medians)".into());
                }
            }
            "--cycles" => {
                let n = value("--cycles")?;
                if n == 0 {
                    return Err("--cycles must be at least 1".into());
                }
                cfg.cycles = Some(n);
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

#[derive(Debug, Clone, Copy)]
enum Unit {
    Secs,
    Bytes,
}

struct Row {
    metric: String,
    unit: Unit,
    mass: f64,
    baseline: f64,
    baseline_name: &'static str,
    /// mass / baseline must be at most this.
    goal: Option<f64>,
    note: String,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.mass / self.baseline
    }
    fn pass(&self) -> Option<bool> {
        self.goal.map(|g| self.ratio() <= g)
    }
    fn verdict(&self) -> &'static str {
        match self.pass() {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "info",
        }
    }
    fn goal_text(&self) -> Option<String> {
        self.goal.map(|g| format!("<= {g:.2}x"))
    }
}

fn fmt_val(unit: Unit, v: f64) -> String {
    match unit {
        Unit::Secs if v >= 1.0 => format!("{v:.2} s"),
        Unit::Secs => format!("{:.0} ms", v * 1e3),
        Unit::Bytes if v >= MIB => format!("{:.2} MiB", v / MIB),
        Unit::Bytes if v >= 1024.0 => format!("{:.1} KiB", v / 1024.0),
        Unit::Bytes => format!("{v:.0} B"),
    }
}

fn fmt_reps(unit: Unit, v: &[f64]) -> String {
    let parts: Vec<String> = v.iter().map(|x| fmt_val(unit, *x)).collect();
    format!("[{}]", parts.join(", "))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
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

/// Prints one comparison (with every rep when given) and returns its row.
#[allow(clippy::too_many_arguments)]
fn report(
    metric: String,
    unit: Unit,
    mass: &[f64],
    baseline_name: &'static str,
    baseline: &[f64],
    goal: Option<f64>,
    note: String,
) -> Row {
    let row = Row {
        metric,
        unit,
        mass: median(mass),
        baseline: median(baseline),
        baseline_name,
        goal,
        note,
    };
    let reps = |v: &[f64]| {
        if v.len() > 1 {
            format!("  reps {}", fmt_reps(unit, v))
        } else {
            String::new()
        }
    };
    println!("  {}", row.metric);
    println!("    mass     {:>12}{}", fmt_val(unit, row.mass), reps(mass));
    println!(
        "    {:<8} {:>12}{}",
        baseline_name,
        fmt_val(unit, row.baseline),
        reps(baseline)
    );
    println!(
        "    ratio    {:>11.3}x  goal {}  {}",
        row.ratio(),
        row.goal_text().unwrap_or_else(|| "-".into()),
        row.verdict()
    );
    if !row.note.is_empty() {
        println!("    note: {}", row.note);
    }
    row
}

fn print_summary(reps: usize, rows: &[Row]) {
    println!("\n== summary (medians of {reps} reps) ==");
    let header = ["metric", "mass", "baseline", "ratio", "goal", "result"];
    let mut table: Vec<[String; 6]> = vec![header.map(String::from)];
    for r in rows {
        table.push([
            r.metric.clone(),
            fmt_val(r.unit, r.mass),
            format!("{} ({})", fmt_val(r.unit, r.baseline), r.baseline_name),
            format!("{:.3}x", r.ratio()),
            r.goal_text().unwrap_or_else(|| "-".into()),
            r.verdict().into(),
        ]);
    }
    let mut widths = [0usize; 6];
    for line in &table {
        for (w, cell) in widths.iter_mut().zip(line.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for (i, line) in table.iter().enumerate() {
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

fn rows_json(rows: &[Row]) -> Vec<Value> {
    rows.iter()
        .map(|r| {
            json!({
                "metric": r.metric,
                "unit": match r.unit { Unit::Secs => "seconds", Unit::Bytes => "bytes" },
                "mass": r.mass,
                "baseline": r.baseline,
                "baseline_name": r.baseline_name,
                "ratio": r.ratio(),
                "goal": r.goal_text(),
                "pass": r.pass(),
                "result": r.verdict(),
                "note": r.note,
            })
        })
        .collect()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
}

fn write_json(doc: &Value) -> PathBuf {
    let dir = target_dir().join("bench");
    fs::create_dir_all(&dir).expect("create target/bench");
    let path = dir.join("remote.json");
    let text = serde_json::to_string_pretty(doc).expect("serialise bench summary") + "\n";
    fs::write(&path, text).expect("write target/bench/remote.json");
    path
}

// ---------------------------------------------------------------------------
// Files and processes
// ---------------------------------------------------------------------------

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh directory under /tmp, removed afterwards unless `MASS_BENCH_KEEP` is set.
fn tempdir(tag: &str) -> tempfile::TempDir {
    let keep = std::env::var_os(KEEP_ENV).is_some();
    let d = tempfile::Builder::new()
        .prefix(&format!("mass-bench-{tag}-"))
        .disable_cleanup(keep)
        .tempdir_in("/tmp")
        .expect("create a temp dir under /tmp");
    if keep {
        println!("  (keeping {})", d.path().display());
    }
    d
}

/// Every file under `dir`: relative path -> length.
fn files(dir: &Path) -> BTreeMap<String, u64> {
    fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, u64>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path(), &r, out),
                Ok(m) => {
                    out.insert(r, m.len());
                }
                Err(_) => {}
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out);
    out
}

/// The sum of file sizes under `dir` (`du -b`), or of those whose relative
/// path starts with `prefix` and ends with `suffix`.
fn bytes_under(dir: &Path, prefix: &str, suffix: &str) -> u64 {
    files(dir)
        .iter()
        .filter(|(k, _)| k.starts_with(prefix) && k.ends_with(suffix))
        .map(|(_, n)| n)
        .sum()
}

/// A listing without `LOCK`, whose length is that of the last writer's pid.
fn without_lock(mut files: BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    files.remove("LOCK");
    files
}

fn segments(dir: &Path) -> u64 {
    bytes_under(dir, "segments/", ".seg")
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

/// `mass [--ledger LEDGER] ARGS...` with the S3 environment.
struct Mass {
    bin: PathBuf,
    env: Vec<(String, String)>,
}

impl Mass {
    fn cmd(&self, ledger: Option<&Path>, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        if let Some(l) = ledger {
            c.arg("--ledger").arg(l);
        }
        c.args(args).env_remove("MASS_LEDGER");
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }
    /// Runs it: (stdout, seconds).
    fn run(&self, ledger: Option<&Path>, args: &[&str]) -> (String, f64) {
        run(self.cmd(ledger, args))
    }
}

/// The figures of `mass push`'s line "pushed to URL: N object(s) in K
/// pack(s), B bytes uploaded".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pushed {
    objects: u64,
    packs: u64,
    bytes: u64,
}

fn parse_pushed(out: &str) -> Pushed {
    let line = out
        .lines()
        .find(|l| l.starts_with("pushed to "))
        .unwrap_or_else(|| panic!("no `pushed to` line in mass push's output: {out}"));
    let nums: Vec<u64> = line
        .rsplit_once(": ")
        .map(|(_, tail)| tail)
        .unwrap_or_default()
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect();
    match nums[..] {
        [objects, packs, bytes] => Pushed {
            objects,
            packs,
            bytes,
        },
        _ => panic!("cannot read the figures of {line:?}"),
    }
}

/// The frame bytes of `mass pull`/`clone`'s line "pulled from URL: N
/// object(s), B bytes downloaded".
fn parse_pulled(out: &str) -> (u64, u64) {
    let line = out
        .lines()
        .find(|l| l.starts_with("pulled from "))
        .unwrap_or_else(|| panic!("no `pulled from` line in the output: {out}"));
    let nums: Vec<u64> = line
        .rsplit_once(": ")
        .map(|(_, tail)| tail)
        .unwrap_or_default()
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect();
    match nums[..] {
        [objects, bytes] => (objects, bytes),
        _ => panic!("cannot read the figures of {line:?}"),
    }
}

/// `mass verify --json`'s counts: (clean, events, blobs, trees, refs).
fn verify(m: &Mass, ledger: &Path) -> (bool, u64, u64, u64, u64) {
    let (out, _) = m.run(Some(ledger), &["verify", "--json"]);
    let v: Value = serde_json::from_str(&out).expect("`mass verify --json` output");
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    (
        v["clean"] == json!(true),
        n("events"),
        n("blobs"),
        n("trees"),
        n("refs"),
    )
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
    /// Buckets made, to delete.
    buckets: std::cell::RefCell<Vec<String>>,
}

impl S3 {
    fn start(tmp: &Path) -> S3 {
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
        } else {
            let script = repo().join("scripts/s3-server.sh");
            let running = Command::new(&script)
                .arg("url")
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            let (out, secs) = run({
                let mut c = Command::new(&script);
                c.arg("start");
                c
            });
            for line in out.lines() {
                if let Some((k, v)) = line.split_once('=') {
                    env.push((k.trim().into(), v.trim().into()));
                }
            }
            started = !running;
            println!(
                "  S3: {} moto via scripts/s3-server.sh ({})",
                if started {
                    "started"
                } else {
                    "reusing the running"
                },
                fmt_val(Unit::Secs, secs)
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
                .unwrap_or_else(|| panic!("the S3 setup gave no {k}"))
        };
        let helper = tmp.join("s3_helper.py");
        fs::write(&helper, HELPER_PY).expect("write the boto3 helper");
        S3 {
            endpoint: get("AWS_ENDPOINT"),
            python: PathBuf::from(get("MASS_S3_PYTHON")),
            env,
            helper,
            started,
            buckets: Default::default(),
        }
    }

    /// Runs the boto3 helper: its JSON answer and the process's wall time.
    fn helper(&self, args: &[&str]) -> (Value, f64) {
        let mut c = Command::new(&self.python);
        c.arg(&self.helper).args(args);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        let (out, secs) = run(c);
        let v = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("the boto3 helper said {out:?}: {e}"));
        (v, secs)
    }

    /// Makes the buckets, which are deleted when `self` drops (unless
    /// `MASS_BENCH_KEEP` is set).
    fn make_buckets(&self, names: &[String]) {
        let mut args = vec!["mkbuckets"];
        args.extend(names.iter().map(String::as_str));
        self.buckets.borrow_mut().extend(names.iter().cloned());
        self.helper(&args);
    }
}

/// Deletes the buckets made and stops a server this bench started, also
/// when a step panicked.
impl Drop for S3 {
    fn drop(&mut self) {
        let buckets = self.buckets.take();
        if std::env::var_os(KEEP_ENV).is_some() {
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

/// Counts of a bucket listing.
fn kind_bytes(list: &Value, kind: &str) -> u64 {
    list["kinds"][kind]["bytes"].as_u64().unwrap_or(0)
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

// ---------------------------------------------------------------------------

/// The experiment to run: the file itself, or a copy with `cycles = N` and
/// `tasks_dir` made absolute. Returns (path, cycles).
fn experiment(cfg: &Cfg, tmp: &Path) -> (PathBuf, u32) {
    let src = repo().join(EXPERIMENT);
    let text = fs::read_to_string(&src).expect("read the quickstart experiment");
    let field = |name: &str| {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == name).then(|| v.split('#').next().unwrap_or("").trim().to_string())
            })
            .unwrap_or_else(|| panic!("{EXPERIMENT} has no {name} line"))
    };
    let file_cycles: u32 = field("cycles").parse().expect("cycles is a number");
    let Some(n) = cfg.cycles.filter(|n| *n != file_cycles) else {
        return (src, file_cycles);
    };
    let tasks = field("tasks_dir");
    let tasks = src
        .parent()
        .expect("examples/")
        .join(tasks.trim_matches('"'));
    let copy: Vec<String> = text
        .lines()
        .map(|l| match l.split_once('=').map(|(k, _)| k.trim()) {
            Some("cycles") => format!("cycles = {n}"),
            Some("tasks_dir") => format!("tasks_dir = {:?}", tasks.display().to_string()),
            _ => l.to_string(),
        })
        .collect();
    let path = tmp.join("quickstart.toml");
    fs::write(&path, copy.join("\n") + "\n").expect("write the experiment copy");
    (path, n)
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
    let tmp = tempdir("remote");
    let keep = std::env::var_os(KEEP_ENV).is_some();
    println!("mass remote benchmark: {} reps", cfg.reps);
    let s3 = S3::start(tmp.path());
    let m = Mass {
        bin: mass_bin(),
        env: s3.env.clone(),
    };
    println!("  S3 endpoint {}; mass {}", s3.endpoint, m.bin.display());

    // 1. The ledger.
    let (exp, cycles) = experiment(&cfg, tmp.path());
    let ledger = tmp.path().join("ledger");
    let exp_s = exp.display().to_string();
    println!("\n== the ledger: mass run {exp_s} ({cycles} cycle(s)) ==");
    let (_, run_secs) = m.run(Some(&ledger), &["run", "--quiet", &exp_s]);
    let (clean, events, blobs, trees, refs) = verify(&m, &ledger);
    assert!(clean, "`mass verify` of the new ledger");
    // After verify: it rewrites `LOCK` (the pid of its writer) and `WATERMARK`.
    let layout = files(&ledger);
    let ledger_bytes: u64 = layout.values().sum();
    let seg0 = segments(&ledger);
    let idx0 = bytes_under(&ledger, "index/", "");
    let objects = events + blobs + trees;
    println!(
        "  {} in {}: {} in {} files (segments {}, index {}); {objects} objects ({events} events, {blobs} blobs, {trees} trees), {refs} refs",
        RUN,
        fmt_val(Unit::Secs, run_secs),
        fmt_val(Unit::Bytes, ledger_bytes as f64),
        layout.len(),
        fmt_val(Unit::Bytes, seg0 as f64),
        fmt_val(Unit::Bytes, idx0 as f64),
    );

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let tag = format!("mass-bench-{}-{now}", std::process::id());
    let push_b: Vec<String> = (0..cfg.reps).map(|i| format!("{tag}-push-{i}")).collect();
    let base_b: Vec<String> = (0..cfg.reps).map(|i| format!("{tag}-boto-{i}")).collect();
    let incr_b = format!("{tag}-incr");
    let all_b: Vec<String> = push_b
        .iter()
        .chain(base_b.iter())
        .chain([&incr_b])
        .cloned()
        .collect();
    s3.make_buckets(&all_b);

    // 2. Time: push vs upload, clone vs download.
    println!(
        "\n== push and clone vs boto3 ({} reps, alternating which goes first) ==",
        cfg.reps
    );
    let ledger_s = ledger.display().to_string();
    let (mut push_s, mut up_s, mut up_proc) = (Vec::new(), Vec::new(), Vec::new());
    let mut pushed0 = None;
    for r in 0..cfg.reps {
        let url = format!("s3://{}", push_b[r]);
        let mut mass_side = || {
            let (out, secs) = m.run(Some(&ledger), &["push", "--quiet", &url]);
            let p = parse_pushed(&out);
            assert!(p.objects > 0, "rep {r} pushed nothing: {out}");
            pushed0.get_or_insert(p);
            push_s.push(secs);
        };
        let mut boto_side = || {
            let (v, proc_secs) = s3.helper(&["upload", &ledger_s, &base_b[r]]);
            assert!(
                u(&v, "bytes").abs_diff(ledger_bytes) <= 8,
                "boto3 uploaded the ledger ({} bytes, {ledger_bytes} measured; LOCK holds a pid)",
                u(&v, "bytes")
            );
            up_s.push(v["secs"].as_f64().expect("secs"));
            up_proc.push(proc_secs);
        };
        if r % 2 == 0 {
            mass_side();
            boto_side();
        } else {
            boto_side();
            mass_side();
        }
    }
    let pushed0 = pushed0.expect("at least one push");
    assert_eq!(
        without_lock(files(&ledger)),
        without_lock(layout.clone()),
        "the ledger's files changed while pushing to fresh buckets"
    );
    let (mut clone_s, mut down_s, mut down_proc) = (Vec::new(), Vec::new(), Vec::new());
    let mut clone0 = None;
    for r in 0..cfg.reps {
        let url = format!("s3://{}", push_b[r]);
        let cdir = tmp.path().join(format!("clone-{r}"));
        let ddir = tmp.path().join(format!("download-{r}"));
        let cdir_s = cdir.display().to_string();
        let ddir_s = ddir.display().to_string();
        let mut mass_side = || {
            let (out, secs) = m.run(None, &["clone", "--quiet", &url, &cdir_s]);
            clone_s.push(secs);
            if r == 0 {
                let (objs, down) = parse_pulled(&out);
                assert_eq!(objs, pushed0.objects, "clone brought every pushed object");
                let (a, _) = m.run(Some(&ledger), &["refs"]);
                let (b, _) = m.run(Some(&cdir), &["refs"]);
                assert!(a == b, "the clone's refs differ from the ledger's");
                let (clean, ev, bl, _, rf) = verify(&m, &cdir);
                assert!(clean, "`mass verify` of the clone");
                assert_eq!((ev, bl, rf), (events, blobs, refs), "the clone's counts");
                clone0 = Some((down, bytes_under(&cdir, "", "")));
            }
        };
        let mut boto_side = || {
            let (v, proc_secs) = s3.helper(&["download", &base_b[r], &ddir_s]);
            down_s.push(v["secs"].as_f64().expect("secs"));
            down_proc.push(proc_secs);
            if r == 0 {
                assert_eq!(
                    without_lock(files(&ddir)),
                    without_lock(layout.clone()),
                    "boto3 downloaded the ledger's files"
                );
            }
        };
        if r % 2 == 0 {
            mass_side();
            boto_side();
        } else {
            boto_side();
            mass_side();
        }
        if !keep {
            let _ = fs::remove_dir_all(&cdir);
            let _ = fs::remove_dir_all(&ddir);
        }
    }
    let (clone_down, clone_bytes) = clone0.expect("rep 0 cloned");
    // The same to and from a folder: the local share of the work (reading,
    // packing, hashing, checking, the ledger commit), with no network.
    let (mut fpush_s, mut fclone_s) = (Vec::new(), Vec::new());
    for r in 0..cfg.reps {
        let folder = tmp.path().join(format!("folder-{r}"));
        let fclone = tmp.path().join(format!("folder-clone-{r}"));
        let (folder_s, fclone_str) = (folder.display().to_string(), fclone.display().to_string());
        let (out, secs) = m.run(Some(&ledger), &["push", "--quiet", &folder_s]);
        assert_eq!(parse_pushed(&out), pushed0, "a folder push sends the same");
        fpush_s.push(secs);
        let (_, secs) = m.run(None, &["clone", "--quiet", &folder_s, &fclone_str]);
        fclone_s.push(secs);
        if !keep {
            let _ = fs::remove_dir_all(&folder);
            let _ = fs::remove_dir_all(&fclone);
        }
    }
    let mut rows = Vec::new();
    rows.push(report(
        "push: `mass push` to a fresh bucket vs boto3 upload_file of every ledger file".into(),
        Unit::Secs,
        &push_s,
        "boto3",
        &up_s,
        None,
        format!(
            "mass: whole process, {} object(s) in {} pack(s), {} uploaded; the same push to a folder (no network, synced) {}; boto3: transfer loop only, {} file(s), {}; its whole process {}",
            pushed0.objects,
            pushed0.packs,
            fmt_val(Unit::Bytes, pushed0.bytes as f64),
            fmt_val(Unit::Secs, median(&fpush_s)),
            layout.len(),
            fmt_val(Unit::Bytes, ledger_bytes as f64),
            fmt_val(Unit::Secs, median(&up_proc))
        ),
    ));
    rows.push(report(
        "clone: `mass clone` into a fresh dir vs boto3 download_file of every object".into(),
        Unit::Secs,
        &clone_s,
        "boto3",
        &down_s,
        None,
        format!(
            "mass: whole process, {} of frames downloaded (+ indexes), builds a {} directory (the ledger, synced, indexed, every object checked, and the remote's index cache); the same clone from a folder {}; boto3: list + transfer loop, its whole process {}",
            fmt_val(Unit::Bytes, clone_down as f64),
            fmt_val(Unit::Bytes, clone_bytes as f64),
            fmt_val(Unit::Secs, median(&fclone_s)),
            fmt_val(Unit::Secs, median(&down_proc))
        ),
    ));

    // 3. Bytes.
    println!("\n== bytes ==");
    let (list0, _) = s3.helper(&["list", &push_b[0]]);
    let bucket_bytes = u(&list0, "bytes");
    let kinds_text = |l: &Value| {
        ["pack", "idx", "ref", "history", "marker", "other"]
            .iter()
            .filter(|k| l["kinds"][**k].is_object())
            .map(|k| {
                format!(
                    "{k} {} x{}",
                    fmt_val(Unit::Bytes, kind_bytes(l, k) as f64),
                    l["kinds"][*k]["objects"]
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    rows.push(report(
        "bytes: every object in the bucket after push vs the ledger directory (du -b)".into(),
        Unit::Bytes,
        &[bucket_bytes as f64],
        "ledger",
        &[ledger_bytes as f64],
        Some(BYTES_GOAL),
        format!(
            "{} bucket objects: {}; indexes hold {} entries (60 B each), {} event links (32 B each), {} frames; ledger: segments {}, index {}",
            u(&list0, "objects"),
            kinds_text(&list0),
            u(&list0, "idx_entries"),
            u(&list0, "idx_links"),
            u(&list0, "idx_frames"),
            fmt_val(Unit::Bytes, seg0 as f64),
            fmt_val(Unit::Bytes, idx0 as f64),
        ),
    ));

    // One more cycle: push, fork with cycles + 1, resume, push again.
    let incr_url = format!("s3://{incr_b}");
    let (out, _) = m.run(Some(&ledger), &["push", "--quiet", &incr_url]);
    let first = parse_pushed(&out);
    let (before_list, _) = s3.helper(&["list", &incr_b]);
    let extra = format!("{RUN}-c{}", cycles + 1);
    let set = format!("cycles={}", cycles + 1);
    let seg_before = segments(&ledger);
    let (_, fork_secs) = m.run(
        Some(&ledger),
        &["fork", RUN, "--name", &extra, "--set", &set],
    );
    let seg_fork = segments(&ledger);
    let (_, resume_secs) = m.run(Some(&ledger), &["resume", "--quiet", &extra]);
    let seg_after = segments(&ledger);
    let (out, incr_secs) = m.run(Some(&ledger), &["push", "--quiet", &incr_url]);
    let second = parse_pushed(&out);
    assert!(
        out.contains(&format!("{extra}: updated")),
        "the second push moved {extra}: {out}"
    );
    let (after_list, _) = s3.helper(&["list", &incr_b]);
    let before_keys = before_list["keys"].as_object().cloned().unwrap_or_default();
    let new_of = |kind: &str| -> u64 {
        after_list["keys"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| {
                        !before_keys.contains_key(*k) && k.ends_with(&format!(".{kind}"))
                    })
                    .filter_map(|(_, v)| v.as_u64())
                    .sum()
            })
            .unwrap_or(0)
    };
    let (new_idx, new_pack) = (new_of("idx"), new_of("pack"));
    let entries_added = u(&after_list, "idx_entries") - u(&before_list, "idx_entries");
    let links_added = u(&after_list, "idx_links") - u(&before_list, "idx_links");
    let grew = seg_after - seg_before;
    let bucket_grew = u(&after_list, "bytes") - u(&before_list, "bytes");
    println!(
        "  one more cycle: first push {} object(s) in {} pack(s), {}; `mass fork {RUN} --name {extra} --set {set}` {} (segments +{}), `mass resume {extra}` {} (segments +{}); second push {} object(s) in {} pack(s), {} in {}",
        first.objects,
        first.packs,
        fmt_val(Unit::Bytes, first.bytes as f64),
        fmt_val(Unit::Secs, fork_secs),
        fmt_val(Unit::Bytes, (seg_fork - seg_before) as f64),
        fmt_val(Unit::Secs, resume_secs),
        fmt_val(Unit::Bytes, (seg_after - seg_fork) as f64),
        second.objects,
        second.packs,
        fmt_val(Unit::Bytes, second.bytes as f64),
        fmt_val(Unit::Secs, incr_secs),
    );
    rows.push(report(
        format!("bytes: second push after one more cycle ({extra}) vs segment growth"),
        Unit::Bytes,
        &[second.bytes as f64],
        "segments",
        &[grew as f64],
        Some(INCREMENT_GOAL),
        format!(
            "uploaded = the push line's B: pack {} + index {} ({entries_added} entries, {links_added} event links); segments grew {} -> {} (the fork's ref copies {} of it); the bucket grew {} (run records included)",
            fmt_val(Unit::Bytes, new_pack as f64),
            fmt_val(Unit::Bytes, new_idx as f64),
            fmt_val(Unit::Bytes, seg_before as f64),
            fmt_val(Unit::Bytes, seg_after as f64),
            fmt_val(Unit::Bytes, (seg_fork - seg_before) as f64),
            fmt_val(Unit::Bytes, bucket_grew as f64),
        ),
    ));

    // 4. Summary and JSON.
    print_summary(cfg.reps, &rows);
    let timing = |mass: &[f64], base: &[f64], proc_secs: &[f64], what: &str| {
        json!({
            "mass_secs": mass,
            "baseline_secs": base,
            "mass_median": median(mass),
            "baseline_median": median(base),
            "ratio": median(mass) / median(base),
            "baseline_process_secs": proc_secs,
            "baseline": what,
        })
    };
    let mut push_j = timing(
        &push_s,
        &up_s,
        &up_proc,
        "boto3 upload_file of every file under the ledger directory, sequential, transfer loop timed",
    );
    push_j["folder_secs"] = json!(fpush_s);
    push_j["objects"] = json!(pushed0.objects);
    push_j["packs"] = json!(pushed0.packs);
    push_j["uploaded"] = json!(pushed0.bytes);
    let mut clone_j = timing(
        &clone_s,
        &down_s,
        &down_proc,
        "boto3 list + download_file of every object of a bucket the ledger's files were uploaded to",
    );
    clone_j["folder_secs"] = json!(fclone_s);
    clone_j["downloaded"] = json!(clone_down);
    clone_j["clone_bytes"] = json!(clone_bytes);
    let mut bucket = list0.clone();
    if let Some(o) = bucket.as_object_mut() {
        o.remove("keys");
    }
    bucket["ratio"] = json!(bucket_bytes as f64 / ledger_bytes as f64);
    bucket["goal"] = json!(BYTES_GOAL);
    bucket["pass"] = json!(bucket_bytes as f64 / ledger_bytes as f64 <= BYTES_GOAL);
    let ratio2 = second.bytes as f64 / grew as f64;
    let doc = json!({
        "reps": cfg.reps,
        "server": s3.endpoint,
        "experiment": {
            "file": if exp == repo().join(EXPERIMENT) {
                EXPERIMENT.to_string()
            } else {
                format!("{EXPERIMENT} (a copy with cycles = {cycles}, tasks_dir absolute)")
            },
            "run": RUN,
            "cycles": cycles,
            "run_secs": run_secs,
            "extra_run": extra,
            "fork_secs": fork_secs,
            "resume_secs": resume_secs,
        },
        "ledger": {
            "bytes": ledger_bytes,
            "segments": seg0,
            "index": idx0,
            "files": layout.len(),
            "objects": objects,
            "events": events,
            "refs": refs,
        },
        "push": push_j,
        "clone": clone_j,
        "bucket": bucket,
        "incremental": {
            "segments_before": seg_before,
            "segments_after_fork": seg_fork,
            "segments_after": seg_after,
            "segments_grew": grew,
            "fork_bytes": seg_fork - seg_before,
            "uploaded": second.bytes,
            "objects": second.objects,
            "packs": second.packs,
            "idx_bytes": new_idx,
            "pack_bytes": new_pack,
            "idx_entries": entries_added,
            "idx_links": links_added,
            "bucket_grew": bucket_grew,
            "push_secs": incr_secs,
            "ratio": ratio2,
            "goal": INCREMENT_GOAL,
            "pass": ratio2 <= INCREMENT_GOAL,
        },
        "rows": rows_json(&rows),
    });
    let path = write_json(&doc);

    drop(s3);
    println!(
        "\nwrote {} (total {})",
        path.display(),
        fmt_val(Unit::Secs, started.elapsed().as_secs_f64())
    );
    if cfg.strict && rows.iter().any(|r| r.pass() == Some(false)) {
        std::process::exit(1);
    }
}

/// What runs under `cargo test`: the fixture ledger pushed to a folder
/// remote and cloned back, the output lines parsed, the clone checked. No S3,
/// no python, no timing.
fn smoke_test() {
    let t = Instant::now();
    let tmp = tempdir("remote-smoke");
    let src = repo().join("tests/fixtures/ledgers/engine-8-smoke");
    let ledger = tmp.path().join("ledger");
    fs::create_dir_all(ledger.join("segments")).expect("mkdir");
    for rel in files(&src).keys() {
        let to = ledger.join(rel);
        fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        fs::copy(src.join(rel), &to).expect("copy the fixture ledger");
    }
    let m = Mass {
        bin: mass_bin(),
        env: Vec::new(),
    };
    let remote = tmp.path().join("remote");
    let url = remote.display().to_string();
    let (out, _) = m.run(Some(&ledger), &["push", "--quiet", &url]);
    let p = parse_pushed(&out);
    assert!(p.objects > 0 && p.packs >= 1 && p.bytes > 0, "{out}");
    let packs = bytes_under(&remote, "packs/", ".pack") + bytes_under(&remote, "packs/", ".idx");
    assert_eq!(
        packs, p.bytes,
        "the push line's bytes are its packs and indexes"
    );
    let ledger_bytes = bytes_under(&ledger, "", "");
    assert!(bytes_under(&remote, "", "") > 0 && ledger_bytes > 0);
    let (out, _) = m.run(Some(&ledger), &["push", "--quiet", &url]);
    assert_eq!(
        parse_pushed(&out).objects,
        0,
        "a second push has nothing to send"
    );
    let clone = tmp.path().join("clone");
    let clone_s = clone.display().to_string();
    let (out, _) = m.run(None, &["clone", "--quiet", &url, &clone_s]);
    let (objects, _) = parse_pulled(&out);
    assert_eq!(objects, p.objects, "the clone holds every pushed object");
    let (a, _) = m.run(Some(&ledger), &["refs"]);
    let (b, _) = m.run(Some(&clone), &["refs"]);
    assert_eq!(a, b, "the clone's refs");
    let (clean, ..) = verify(&m, &clone);
    assert!(clean, "`mass verify` of the clone");
    println!(
        "remote bench smoke test passed in {} (measure with `cargo bench --bench remote`)",
        fmt_val(Unit::Secs, t.elapsed().as_secs_f64())
    );
}
