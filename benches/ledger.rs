//! Ledger benchmarks, each measured against a baseline in the same run.
//!
//! ```text
//! cargo bench --bench ledger -- [append|snapshots|conversations|scan|concurrent ...]
//!                               [--quick | --full] [--reps N] [--strict]
//! ```
//!
//! What each benchmark measures (the targets of the ledger-trust issue):
//!
//! * `append`:
//!   - per-event durable appends, `Ledger::append` (one write + `fdatasync`
//!     each) vs raw sled 0.34 `insert` + `flush()` each (goal >= 0.5x). sled's
//!     `flush()` is `pwrite` + `sync_file_range` (no device cache flush),
//!     weaker than `fdatasync`, so an info row also compares with sled +
//!     `fdatasync` of its data file. Per-event runs are shortened to fit this
//!     machine's fsync speed unless `--full` (the output says so).
//!   - group commit, `batch()` of 100 appends + `commit()` vs sled
//!     `apply_batch` of the same 100 values + `flush()` (goal >= 0.5x), always
//!     on 100k events.
//!   - index bytes per event on disk **after close** at 100k events (goal <=
//!     350 B): everything in the ledger directory that is not
//!     `segments/*.seg`, `FORMAT` or `LOCK` (today sled's `index/`), measured
//!     after the `Ledger` is dropped and every lock on its files (the ledger's
//!     `LOCK`, sled's `db`, which sled releases from a background thread) is
//!     gone. Reported per event, against segment bytes per event (the ratio
//!     is index/segments), with a breakdown by file. The raw sled dbs are
//!     measured the same way (dropped, lock released, then the directory).
//! * `snapshots`: 18 versions of a generated research workspace, each stored
//!   by **its own `mass --ledger DIR snapshot WORKSPACE` process** (the built
//!   binary, see `mass_bin`), vs `git add -A && git commit` per version then a
//!   plain `git gc`. Goal: whole ledger directory / whole `.git` directory
//!   <= 1.0x; info rows: segments vs git's pack files, the ledger vs `git gc
//!   --aggressive`, and one in-process `Ledger::snapshot_dir` per version
//!   (which keeps the tree-delta base between snapshots; separate processes
//!   do not). Every tree id printed by `mass snapshot` is checked against the
//!   in-process one.
//! * `conversations`: agent conversations logged as shared message blobs plus
//!   `model.call` events vs an OpenAI-style logging proxy's gzip'd JSONL.
//! * `scan`: `mass verify` vs the same checks over a raw sled store of the same
//!   events (below); each scan runs in a child process (this binary
//!   re-executed) so that its peak memory (VmHWM) belongs to the scan alone.
//! * `concurrent`: small durable commits from many threads at once (64
//!   threads x 200 batches of one ~300-byte event, each thread its own
//!   stream, as concurrent rollouts record model calls) vs the same batches
//!   committed by one thread, in the same run: batches/s and the ratio (group
//!   commit shares one `fdatasync` among the commits waiting for it), and
//!   `fdatasync`s per batch, counted by a file layer around the OS's.
//!   `--quick`: 64 x 30.
//!
//! ## The verify baseline
//!
//! `mass verify` (`src/commands/maintain.rs`) opens the ledger with
//! `Options::for_scan()` and calls `Ledger::verify_with` with the schema
//! registry as the payload check and the index cross-check on. Per
//! `ledger/src/verify.rs` that is: (1) one ordered pass over the index loading
//! every object's location into a table keyed by a 16-byte id prefix; (2) a
//! sequential scan of every segment: each record's checksum, zstd decoding
//! (with the delta base for tree deltas), re-hashing the canonical bytes
//! against the id, the index placing the object at exactly that record,
//! decoding and validating (bytecheck) the event envelope, `prev` being an
//! event stored earlier (or `seq == 0` without one), every parent and ref
//! stored earlier, the payload decoding as its registered kind and version
//! (`schemas::check`), and the metadata parsing as JSON; (3) every index entry
//! met by the scan; (4) the refs in the index equal to those replayed from the
//! log's ref-update records. The bench runs exactly that call in its child
//! (and once runs the `mass verify` binary on the same ledger to confirm it is
//! clean and counts the same events).
//!
//! The baseline stores the same events (byte-identical canonical envelopes;
//! their ids are checked equal to the ledger's while building) in raw sled,
//! the way one would without the ledger: tree `log` maps the ordinal (u64 BE)
//! to what a ledger record holds (the id, the envelope and the same metadata
//! JSON), tree `ids` maps id to ordinal (the index) and tree `refs` maps ref
//! name to head. `sled_verify` then does
//! the same checks in the same order with the same library calls: (1) one
//! ordered pass over `ids` into the same 16-byte-prefix table; (2) an ordered
//! scan of `log` re-hashing every envelope (`Id::of`) against its stored id,
//! checking the index places it at that ordinal, `EventEnvelope::from_bytes`, the `prev`/seq,
//! parent and ref links against what was seen earlier, `schemas::check` on the
//! payload and the metadata JSON; (3) every `ids` entry seen; (4) `refs` equal
//! to each stream's last event in the log. What remains different is storage
//! itself: the ledger checks its own record checksums and decompresses zstd
//! bodies, sled checks its own page CRCs and stores values uncompressed. An
//! info row compares `mass verify --log-only` with the same baseline without
//! steps (1) and (3).
//!
//! Every figure is a median over repetitions and is reported as a ratio to its
//! baseline, never alone; rows with a goal say PASS or MISS. The summary table
//! is also written as JSON to `target/bench-ledger.json` and
//! `target/bench/ledger.json`. All data is
//! generated deterministically from fixed seeds. `--quick` shrinks the other
//! sizes about 10x (a smoke run, under ~2 minutes), `--full` uses the issue's
//! sizes everywhere (1M events for `scan`, 100k per-event durable appends) and
//! 5 repetitions; `--strict` exits 1 when a goal is missed. Set
//! `MASS_BENCH_KEEP=1` to keep the temporary ledgers, sled dbs and git
//! repositories under /tmp for inspection (e.g. with `mass stats`), and
//! `MASS_BENCH_BIN=path` to use another `mass` binary. Run without `--bench`
//! (as `cargo test --all-targets` does) it only runs a smoke test of every code
//! path in miniature.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{EventEnvelope, Id, Ledger, NewEvent, ObjectKind};
use schemas::{Hash32, ModelCall, Note};
use serde_json::{json, Value};

const BENCHES: [&str; 5] = ["append", "snapshots", "conversations", "scan", "concurrent"];
const USAGE: &str =
    "usage: cargo bench --bench ledger -- [append|snapshots|conversations|scan|concurrent ...] \
                     [--quick | --full] [--reps N] [--strict]";
const CHILD_ENV: &str = "MASS_BENCH_CHILD";
const CHILD_DIR_ENV: &str = "MASS_BENCH_DIR";
/// Set to keep every temporary directory (ledgers, sled dbs, git repos) for inspection.
const KEEP_ENV: &str = "MASS_BENCH_KEEP";
/// Set to the `mass` binary to run instead of the one cargo built.
const BIN_ENV: &str = "MASS_BENCH_BIN";
/// Set in a scan child: also run the index passes (what `mass verify` does by default).
const INDEX_ENV: &str = "MASS_BENCH_VERIFY_INDEX";
const MIB: f64 = 1024.0 * 1024.0;

const SEED_LEX: u64 = 0x5EED_0001;
const SEED_APPEND: u64 = 0x5EED_0002;
const SEED_SNAP: u64 = 0x5EED_0003;
const SEED_CONV: u64 = 0x5EED_0004;
const SEED_SCAN: u64 = 0x5EED_0005;
const SEED_CONC: u64 = 0x5EED_0006;

/// `write!` into a `String`, which cannot fail.
macro_rules! put {
    ($dst:expr, $($arg:tt)*) => {{
        let _ = write!($dst, $($arg)*);
    }};
}
macro_rules! putln {
    ($dst:expr, $($arg:tt)*) => {{
        let _ = writeln!($dst, $($arg)*);
    }};
}

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Quick,
    Default,
    Full,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Quick => "quick",
            Mode::Default => "default",
            Mode::Full => "full",
        }
    }
}

#[derive(Debug, Clone)]
struct Cfg {
    mode: Mode,
    names: Vec<&'static str>,
    reps: usize,
    strict: bool,
    /// Events appended in the group-commit run, whose index is measured (and
    /// the payload pool); the issue's size, 100k, in every mode.
    append_events: usize,
    /// Per-event durable appends wanted (the issue's size is 100k).
    durable_target: usize,
    /// Seconds all per-event durable repetitions (both systems) may take.
    durable_budget_s: f64,
    /// Multiplies file counts (and the log length) of the generated workspace.
    snap_scale: f64,
    snap_variants: usize,
    conv_k: usize,
    conv_turns: usize,
    scan_n: usize,
    /// Committing threads (and streams) of the concurrent benchmark.
    conc_threads: usize,
    /// Batches each of them commits.
    conc_batches: usize,
}

fn parse_args() -> Result<Cfg, String> {
    let mut mode = Mode::Default;
    let mut reps: Option<usize> = None;
    let mut strict = false;
    let mut names: Vec<&'static str> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => mode = Mode::Quick,
            "--full" => mode = Mode::Full,
            "--strict" => strict = true,
            // cargo passes `--bench` to harness = false bench targets.
            "--bench" => {}
            "--reps" => {
                let v = args.next().ok_or("--reps needs a number")?;
                let n: usize = v.parse().map_err(|_| format!("bad --reps value {v:?}"))?;
                if n == 0 {
                    return Err("--reps must be at least 1".into());
                }
                reps = Some(n);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s:?}")),
            s => match BENCHES.iter().find(|b| **b == s) {
                Some(b) => {
                    if !names.contains(b) {
                        names.push(b)
                    }
                }
                None => {
                    return Err(format!(
                        "unknown benchmark {s:?}; known: {}",
                        BENCHES.join(", ")
                    ))
                }
            },
        }
    }
    if names.is_empty() {
        names = BENCHES.to_vec();
    }
    let (append_events, durable_target, durable_budget_s) = match mode {
        Mode::Quick => (100_000, 10_000, 6.0),
        Mode::Default => (100_000, 100_000, 90.0),
        Mode::Full => (100_000, 100_000, f64::INFINITY),
    };
    let (snap_scale, conv_k, scan_n) = match mode {
        Mode::Quick => (0.1, 2, 20_000),
        Mode::Default => (1.0, 20, 200_000),
        Mode::Full => (1.0, 20, 1_000_000),
    };
    Ok(Cfg {
        mode,
        names,
        reps: reps.unwrap_or(if mode == Mode::Full { 5 } else { 3 }),
        strict,
        append_events,
        durable_target,
        durable_budget_s,
        snap_scale,
        snap_variants: 18,
        conv_k,
        conv_turns: 50,
        scan_n,
        conc_threads: 64,
        conc_batches: if mode == Mode::Quick { 30 } else { 200 },
    })
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Unit {
    EventsPerSec,
    BatchesPerSec,
    FsyncsPerBatch,
    Bytes,
    BytesPerEvent,
    Secs,
}

#[derive(Debug, Clone, Copy)]
enum Goal {
    /// ledger / baseline must be at least this.
    RatioAtLeast(f64),
    /// ledger / baseline must be at most this.
    RatioAtMost(f64),
    /// The ledger's value (in the row's unit) must be below this.
    LedgerBelow(f64),
    /// The ledger's value (in the row's unit) must be at most this.
    LedgerAtMost(f64),
}

impl Goal {
    fn describe(self, unit: Unit) -> String {
        match self {
            Goal::RatioAtLeast(r) => format!(">= {r:.2}x"),
            Goal::RatioAtMost(r) => format!("<= {r:.2}x"),
            Goal::LedgerBelow(v) => format!("< {}", fmt_val(unit, v)),
            Goal::LedgerAtMost(v) => format!("<= {}", fmt_val(unit, v)),
        }
    }
}

#[derive(Debug, Clone)]
struct Row {
    bench: &'static str,
    metric: String,
    unit: Unit,
    ledger: f64,
    baseline: f64,
    baseline_name: &'static str,
    goal: Option<Goal>,
    note: String,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.ledger / self.baseline
    }

    fn pass(&self) -> Option<bool> {
        Some(match self.goal? {
            Goal::RatioAtLeast(r) => self.ratio() >= r,
            Goal::RatioAtMost(r) => self.ratio() <= r,
            Goal::LedgerBelow(v) => self.ledger < v,
            Goal::LedgerAtMost(v) => self.ledger <= v,
        })
    }

    fn verdict(&self) -> &'static str {
        match self.pass() {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "info",
        }
    }
}

fn fmt_val(unit: Unit, v: f64) -> String {
    match unit {
        Unit::EventsPerSec => {
            if v >= 1e6 {
                format!("{:.2}M ev/s", v / 1e6)
            } else if v >= 1e3 {
                format!("{:.1}k ev/s", v / 1e3)
            } else {
                format!("{v:.0} ev/s")
            }
        }
        Unit::Bytes => {
            if v >= MIB {
                format!("{:.2} MiB", v / MIB)
            } else if v >= 1024.0 {
                format!("{:.1} KiB", v / 1024.0)
            } else {
                format!("{v:.0} B")
            }
        }
        Unit::BatchesPerSec => {
            if v >= 1e3 {
                format!("{:.1}k batch/s", v / 1e3)
            } else {
                format!("{v:.0} batch/s")
            }
        }
        Unit::FsyncsPerBatch => format!("{v:.3} fsync/batch"),
        Unit::BytesPerEvent => format!("{v:.0} B/ev"),
        Unit::Secs => {
            if v >= 1.0 {
                format!("{v:.2} s")
            } else {
                format!("{:.1} ms", v * 1e3)
            }
        }
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

/// Prints one measured comparison and returns its row.
#[allow(clippy::too_many_arguments)]
fn report(
    bench: &'static str,
    metric: String,
    unit: Unit,
    ledger: &[f64],
    baseline_name: &'static str,
    baseline: &[f64],
    goal: Option<Goal>,
    note: String,
) -> Row {
    let row = Row {
        bench,
        metric,
        unit,
        ledger: median(ledger),
        baseline: median(baseline),
        baseline_name,
        goal,
        note,
    };
    let verdict = row.verdict();
    println!("  {}", row.metric);
    println!(
        "    ledger   {:>14}  reps {}",
        fmt_val(unit, row.ledger),
        fmt_reps(unit, ledger)
    );
    println!(
        "    {:<8} {:>14}  reps {}",
        baseline_name,
        fmt_val(unit, row.baseline),
        fmt_reps(unit, baseline)
    );
    let goal_s = goal.map(|g| g.describe(unit)).unwrap_or_else(|| "-".into());
    println!(
        "    ratio    {:>13.3}x  goal {goal_s}  {verdict}",
        row.ratio()
    );
    if !row.note.is_empty() {
        println!("    note: {}", row.note);
    }
    row
}

fn print_summary(cfg: &Cfg, rows: &[Row]) {
    println!();
    println!(
        "== summary ({} mode, medians of {} reps) ==",
        cfg.mode.name(),
        cfg.reps
    );
    let header = [
        "benchmark",
        "metric",
        "ledger",
        "baseline",
        "ratio",
        "goal",
        "result",
    ];
    let mut table: Vec<[String; 7]> = vec![header.map(String::from)];
    for r in rows {
        table.push([
            r.bench.to_string(),
            r.metric.clone(),
            fmt_val(r.unit, r.ledger),
            format!("{} ({})", fmt_val(r.unit, r.baseline), r.baseline_name),
            format!("{:.3}x", r.ratio()),
            r.goal
                .map(|g| g.describe(r.unit))
                .unwrap_or_else(|| "-".into()),
            r.verdict().into(),
        ]);
    }
    let mut widths = [0usize; 7];
    for line in &table {
        for (w, cell) in widths.iter_mut().zip(line.iter()) {
            *w = (*w).max(cell.len());
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

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

fn write_json(cfg: &Cfg, rows: &[Row], notes: &[String]) -> PathBuf {
    let unit_name = |u: Unit| match u {
        Unit::EventsPerSec => "events/s",
        Unit::BatchesPerSec => "batches/s",
        Unit::FsyncsPerBatch => "fsyncs/batch",
        Unit::Bytes => "bytes",
        Unit::BytesPerEvent => "bytes/event",
        Unit::Secs => "seconds",
    };
    let rows_json: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "benchmark": r.bench,
                "metric": r.metric,
                "unit": unit_name(r.unit),
                "ledger": r.ledger,
                "baseline": r.baseline,
                "baseline_name": r.baseline_name,
                "ratio": r.ratio(),
                "goal": r.goal.map(|g| g.describe(r.unit)),
                "pass": r.pass(),
                "result": r.verdict(),
                "note": r.note,
            })
        })
        .collect();
    let doc = json!({
        "mode": cfg.mode.name(),
        "reps": cfg.reps,
        "benchmarks": cfg.names,
        "sizes": {
            "append_events": cfg.append_events,
            "durable_target": cfg.durable_target,
            "snapshot_scale": cfg.snap_scale,
            "snapshot_variants": cfg.snap_variants,
            "conversations": cfg.conv_k,
            "turns": cfg.conv_turns,
            "scan_events": cfg.scan_n,
            "concurrent_threads": cfg.conc_threads,
            "concurrent_batches_per_thread": cfg.conc_batches,
        },
        "notes": notes,
        "rows": rows_json,
    });
    let dir = target_dir();
    let path = dir.join("bench-ledger.json");
    fs::create_dir_all(dir.join("bench")).expect("create target/bench");
    let text = serde_json::to_string_pretty(&doc).expect("serialise bench summary") + "\n";
    fs::write(&path, &text).expect("write target/bench-ledger.json");
    // The team's convention: every bench's figures in target/bench/NAME.json.
    fs::write(dir.join("bench").join("ledger.json"), &text)
        .expect("write target/bench/ledger.json");
    path
}

// ---------------------------------------------------------------------------
// Deterministic data
// ---------------------------------------------------------------------------

/// splitmix64: tiny, fast and good enough for generating test data.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

fn mix(seed: u64, i: u64) -> u64 {
    seed ^ i.wrapping_add(1).wrapping_mul(0xA24B_AED4_963E_E407)
}

/// A vocabulary of pronounceable pseudo-words, drawn with a skewed (Zipf-like)
/// distribution so text compresses like prose rather than like noise or like
/// a repeated template.
struct Lex {
    words: Vec<String>,
}

impl Lex {
    fn new(seed: u64, n: usize) -> Lex {
        const ONSETS: [&str; 24] = [
            "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
            "br", "ch", "st", "tr", "pl", "gr", "sh",
        ];
        const VOWELS: [&str; 8] = ["a", "e", "i", "o", "u", "ai", "ea", "ou"];
        const CODAS: [&str; 10] = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"];
        let mut rng = Rng::new(seed);
        let mut seen = HashSet::new();
        let mut words = Vec::with_capacity(n);
        while words.len() < n {
            let syllables = rng.range(1, 4);
            let mut w = String::new();
            for _ in 0..syllables {
                w.push_str(rng.pick::<&str>(&ONSETS));
                w.push_str(rng.pick::<&str>(&VOWELS));
                w.push_str(rng.pick::<&str>(&CODAS));
            }
            if seen.insert(w.clone()) {
                words.push(w);
            }
        }
        Lex { words }
    }

    fn word(&self, rng: &mut Rng) -> &str {
        let u = rng.unit();
        let i = (u * u * u * self.words.len() as f64) as usize;
        &self.words[i.min(self.words.len() - 1)]
    }

    /// A word or two joined by `_`, usable as an identifier.
    fn ident(&self, rng: &mut Rng) -> String {
        if rng.chance(0.5) {
            self.word(rng).to_string()
        } else {
            format!("{}_{}", self.word(rng), self.word(rng))
        }
    }

    fn number(rng: &mut Rng, out: &mut String) {
        match rng.below(5) {
            0 => put!(out, "{}", rng.below(1000)),
            1 => put!(out, "{:.4}", rng.unit() * 10.0),
            2 => put!(out, "{:.2}%", rng.unit() * 100.0),
            3 => put!(out, "{:.3e}", rng.unit() * 1e-3),
            _ => put!(out, "{}", rng.below(1_000_000)),
        }
    }

    fn sentence(&self, rng: &mut Rng, out: &mut String) {
        let n = rng.range(5, 18);
        for k in 0..n {
            if k > 0 {
                out.push(' ');
            }
            if rng.chance(0.12) {
                Lex::number(rng, out);
            } else {
                let w = self.word(rng);
                if k == 0 {
                    let mut cs = w.chars();
                    if let Some(c) = cs.next() {
                        out.push(c.to_ascii_uppercase());
                        out.push_str(cs.as_str());
                    }
                } else {
                    out.push_str(w);
                }
            }
            if k + 1 < n && rng.chance(0.07) {
                out.push(',');
            }
        }
        out.push('.');
    }

    /// Prose of exactly `len` bytes (ASCII).
    fn prose(&self, rng: &mut Rng, len: usize) -> String {
        let mut s = String::with_capacity(len + 128);
        while s.len() < len {
            if !s.is_empty() {
                s.push(' ');
            }
            self.sentence(rng, &mut s);
        }
        s.truncate(len);
        s
    }
}

/// An event payload of 64 B to 2 KiB: a JSON-ish record head and prose.
fn event_payload(lex: &Lex, seed: u64, i: u64) -> Vec<u8> {
    let mut rng = Rng::new(mix(seed, i));
    let len = rng.range(64, 2048);
    let mut s = String::with_capacity(len + 160);
    put!(
        s,
        "{{\"step\":{i},\"loss\":{:.6},\"lr\":{:.3e},\"note\":\"",
        rng.unit() * 3.0,
        rng.unit() * 1e-3
    );
    while s.len() < len {
        lex.sentence(&mut rng, &mut s);
        s.push(' ');
    }
    s.truncate(len);
    s.into_bytes()
}

// ---------------------------------------------------------------------------
// Filesystem helpers
// ---------------------------------------------------------------------------

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

/// Calls `f(relative path, length)` for every file under `dir`.
fn walk_files(dir: &Path, rel: &str, f: &mut dyn FnMut(&str, &Path, u64)) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let r = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        match e.metadata() {
            Ok(m) if m.is_dir() => walk_files(&e.path(), &r, f),
            Ok(m) => f(&r, &e.path(), m.len()),
            Err(_) => {}
        }
    }
}

/// Apparent size of every file under `p`.
fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    walk_files(p, "", &mut |_, _, n| total += n);
    total
}

fn write_file(path: &Path, bytes: &[u8]) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap_or_else(|e| panic!("mkdir {}: {e}", parent.display()));
    }
    fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Waits until nothing holds a lock on `path` (a missing file counts as free).
fn wait_unlocked(path: &Path) {
    let Ok(f) = fs::File::open(path) else { return };
    let t = Instant::now();
    loop {
        match f.try_lock() {
            Ok(()) => {
                let _ = f.unlock();
                return;
            }
            Err(fs::TryLockError::WouldBlock) if t.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("{} is still locked 30 s after close: {e}", path.display()),
        }
    }
}

/// Waits until a dropped ledger or sled db has let go of its files: the
/// ledger's `LOCK` and every sled `db` file under `dir` (sled releases its lock
/// from a background flusher thread after the last handle drops, possibly
/// after one more write), so that what is measured next is the closed store.
fn wait_closed(dir: &Path) {
    let mut locked = Vec::new();
    walk_files(dir, "", &mut |_, p, _| {
        if matches!(
            p.file_name().and_then(|n| n.to_str()),
            Some("LOCK") | Some("db")
        ) {
            locked.push(p.to_path_buf());
        }
    });
    for p in locked {
        wait_unlocked(&p);
    }
}

/// A closed ledger directory on disk, split the way the issue counts it.
#[derive(Debug, Clone, Default)]
struct Layout {
    /// Every file in the directory.
    total: u64,
    /// `segments/*.seg`: the source of truth.
    segments: u64,
    /// Everything else except `FORMAT` and `LOCK`: derived index files (today sled's `index/`).
    index: u64,
    /// Index bytes by file (sled's `snap.*` files grouped), largest first when printed.
    parts: BTreeMap<String, u64>,
}

impl Layout {
    /// The parts as "name size (x B/ev)", largest first.
    fn describe_parts(&self, events: Option<usize>) -> String {
        let mut v: Vec<(&String, &u64)> = self.parts.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let parts: Vec<String> = v
            .into_iter()
            .map(|(k, n)| match events {
                Some(e) => format!(
                    "{k} {} ({:.0} B/ev)",
                    fmt_val(Unit::Bytes, *n as f64),
                    *n as f64 / e as f64
                ),
                None => format!("{k} {}", fmt_val(Unit::Bytes, *n as f64)),
            })
            .collect();
        if parts.is_empty() {
            "no index files".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Measures a ledger directory; call `close_ledger` (or let the owning process
/// exit) first.
fn ledger_layout(dir: &Path) -> Layout {
    let mut l = Layout::default();
    walk_files(dir, "", &mut |rel, _, n| {
        l.total += n;
        if rel.starts_with("segments/") && rel.ends_with(".seg") {
            l.segments += n;
        } else if rel != "FORMAT" && rel != "LOCK" {
            l.index += n;
            let mut key: Vec<&str> = rel.splitn(3, '/').take(2).collect();
            if key.last().is_some_and(|k| k.starts_with("snap.")) {
                key.pop();
                key.push("snap.*");
            }
            *l.parts.entry(key.join("/")).or_default() += n;
        }
    });
    l
}

/// Drops the ledger, waits until its files are let go, and measures the directory.
fn close_ledger(l: Ledger) -> Layout {
    let dir = l.dir().to_path_buf();
    drop(l);
    wait_closed(&dir);
    ledger_layout(&dir)
}

/// Drops a raw sled db, waits for its flusher to let go, and measures the directory.
fn close_sled(db: sled::Db, dir: &Path) -> u64 {
    drop(db);
    wait_closed(dir);
    dir_size(dir)
}

fn open_sled(path: &Path) -> sled::Db {
    sled::Config::new()
        .path(path)
        .open()
        .unwrap_or_else(|e| panic!("open sled at {}: {e}", path.display()))
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

/// Runs `mass --ledger LEDGER ARGS...`, returns its stdout; panics with its
/// stderr when it fails.
fn run_mass(bin: &Path, ledger: &Path, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(bin)
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .env_remove("MASS_LEDGER")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    if !out.status.success() {
        panic!(
            "{} --ledger {} {:?} failed ({}): {}{}",
            bin.display(),
            ledger.display(),
            args,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---------------------------------------------------------------------------
// 1. append
// ---------------------------------------------------------------------------

const APPEND_REF: &str = "bench/append";
const APPEND_KIND: &str = "bench.append";

/// What one ledger append run measured.
struct AppendRun {
    secs: f64,
    /// The directory after the ledger was closed.
    layout: Layout,
    /// `Ledger::stats()` when asked for (it reads every event back).
    stats: Option<ledger::Stats>,
    /// Events/s over the first and the last tenth of the run.
    first_tenth: f64,
    last_tenth: f64,
}

/// Appends `payloads` to a fresh ledger, `group` events per durable commit
/// (`group == 1` uses `Ledger::append`), then closes it and measures it.
fn run_ledger_append(payloads: &[Vec<u8>], group: usize, want_stats: bool) -> AppendRun {
    run_ledger_append_with(payloads, group, want_stats, ledger::Options::default())
}

/// [`run_ledger_append`] with options (the protections bench switches the
/// keyed checks or the watermark off to price them).
fn run_ledger_append_with(
    payloads: &[Vec<u8>],
    group: usize,
    want_stats: bool,
    opts: ledger::Options,
) -> AppendRun {
    let tmp = tempdir("append-ledger");
    let dir = tmp.path().join("ledger");
    let l = Ledger::init_with(&dir, opts).expect("init ledger");
    let mut head: Option<Id> = None;
    let tenth = (payloads.len() / 10).max(1);
    let mut marks = Vec::with_capacity(12);
    let t = Instant::now();
    let mut done = 0usize;
    for chunk in payloads.chunks(group) {
        if group == 1 {
            let ev = NewEvent::new(APPEND_KIND, 1, chunk[0].clone());
            head = Some(l.append(APPEND_REF, head, ev).expect("ledger append"));
        } else {
            let mut b = l.batch();
            for p in chunk {
                let ev = NewEvent::new(APPEND_KIND, 1, p.clone());
                head = Some(b.append(APPEND_REF, head, ev).expect("batch append"));
            }
            b.commit().expect("batch commit");
        }
        let before = done;
        done += chunk.len();
        if before / tenth != done / tenth || done == payloads.len() {
            marks.push((done, t.elapsed().as_secs_f64()));
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let rate = |a: (usize, f64), b: (usize, f64)| (b.0 - a.0) as f64 / (b.1 - a.1).max(1e-9);
    let first = marks.first().copied().unwrap_or((0, 0.0));
    let first_tenth = rate((0, 0.0), first);
    let last_tenth = match marks.len() {
        0 | 1 => first_tenth,
        n => rate(marks[n - 2], marks[n - 1]),
    };
    let stats = want_stats.then(|| l.stats().expect("ledger stats"));
    AppendRun {
        secs,
        layout: close_ledger(l),
        stats,
        first_tenth,
        last_tenth,
    }
}

/// Inserts `payloads` into a fresh raw sled db under counter keys: with
/// `group == 1` one `insert` + `flush()` per value, otherwise one `apply_batch`
/// of `group` values + `flush()` per group. With `fdatasync`, each flush is
/// followed by `fdatasync` of sled's data file: sled 0.34's `flush()` only
/// calls `sync_file_range`, which neither flushes the device cache nor persists
/// file metadata, so this variant is the one whose durability matches the
/// ledger's `fdatasync`.
/// Returns (seconds, bytes on disk after closing).
fn run_sled_append(payloads: &[Vec<u8>], group: usize, fdatasync: bool) -> (f64, u64) {
    let tmp = tempdir("append-sled");
    let path = tmp.path().join("sled");
    let db = open_sled(&path);
    let data_file = fs::File::open(path.join("db")).expect("open sled's db file");
    let flush = || {
        db.flush().expect("sled flush");
        if fdatasync {
            data_file.sync_data().expect("fdatasync sled db file");
        }
    };
    let t = Instant::now();
    if group == 1 {
        for (i, p) in payloads.iter().enumerate() {
            db.insert((i as u64).to_be_bytes(), p.as_slice())
                .expect("sled insert");
            flush();
        }
    } else {
        for (c, chunk) in payloads.chunks(group).enumerate() {
            let mut b = sled::Batch::default();
            for (j, p) in chunk.iter().enumerate() {
                let k = (c * group + j) as u64;
                b.insert(&k.to_be_bytes()[..], p.as_slice());
            }
            db.apply_batch(b).expect("sled apply_batch");
            flush();
        }
    }
    let secs = t.elapsed().as_secs_f64();
    drop(data_file);
    (secs, close_sled(db, &path))
}

/// Runs ledger and sled `reps` times each, alternating which goes first.
fn alternate<L, S>(reps: usize, mut ledger: L, mut sled_run: S) -> (Vec<f64>, Vec<f64>)
where
    L: FnMut() -> f64,
    S: FnMut() -> f64,
{
    let mut a = Vec::with_capacity(reps);
    let mut b = Vec::with_capacity(reps);
    for r in 0..reps {
        if r.is_multiple_of(2) {
            a.push(ledger());
            b.push(sled_run());
        } else {
            b.push(sled_run());
            a.push(ledger());
        }
    }
    (a, b)
}

fn bench_append(cfg: &Cfg, lex: &Lex, rows: &mut Vec<Row>, notes: &mut Vec<String>) {
    let n = cfg.append_events;
    let payloads: Vec<Vec<u8>> = (0..n as u64)
        .map(|i| event_payload(lex, SEED_APPEND, i))
        .collect();
    let total: usize = payloads.iter().map(Vec::len).sum();
    println!(
        "\n== append: payloads 64 B-2 KiB (mean {} B, text-like), {} reps ==",
        total / n,
        cfg.reps
    );

    // Per-event durability: calibrate against this machine's fsync speed.
    let probe = 300.min(n);
    let tl = run_ledger_append(&payloads[..probe], 1, false).secs;
    let (ts, _) = run_sled_append(&payloads[..probe], 1, false);
    let (tf, _) = run_sled_append(&payloads[..probe], 1, true);
    let per_event = (tl + ts + tf) / probe as f64;
    let mut durable_n = 500.min(cfg.durable_target);
    for c in [100_000, 50_000, 20_000, 10_000, 5_000, 2_000, 1_000, 500] {
        if c <= cfg.durable_target.min(n)
            && c as f64 * per_event * cfg.reps as f64 <= cfg.durable_budget_s
        {
            durable_n = c;
            break;
        }
    }
    let projected = cfg.durable_target as f64 * per_event;
    let durable_note = if durable_n < cfg.durable_target {
        format!(
            "measured on {durable_n} events, not {}: at this machine's fsync speed (probe: ledger {:.0} ev/s, sled {:.0} ev/s, sled+fdatasync {:.0} ev/s) {} per-event appends would take ~{:.0} s per rep for the three runs; use --full for the issue size",
            cfg.durable_target,
            probe as f64 / tl,
            probe as f64 / ts,
            probe as f64 / tf,
            cfg.durable_target,
            projected
        )
    } else {
        String::new()
    };
    if !durable_note.is_empty() {
        println!("  per-event durable: {durable_note}");
        notes.push(format!("append: {durable_note}"));
    }
    let d = &payloads[..durable_n];
    let (mut l, mut s, mut f) = (Vec::new(), Vec::new(), Vec::new());
    let mut tenths = Vec::new();
    for r in 0..cfg.reps {
        // Rotate which of the three goes first.
        for k in 0..3 {
            match (r + k) % 3 {
                0 => {
                    let run = run_ledger_append(d, 1, false);
                    tenths.push((run.first_tenth, run.last_tenth, run.layout.index));
                    l.push(durable_n as f64 / run.secs)
                }
                1 => s.push(durable_n as f64 / run_sled_append(d, 1, false).0),
                _ => f.push(durable_n as f64 / run_sled_append(d, 1, true).0),
            }
        }
    }
    rows.push(report(
        "append",
        format!("per-event durable appends ({durable_n} events)"),
        Unit::EventsPerSec,
        &l,
        "sled",
        &s,
        Some(Goal::RatioAtLeast(0.5)),
        format!("ledger: Ledger::append (write + fdatasync each); sled: insert + flush() each (pwrite + sync_file_range: no device cache flush). {durable_note}"),
    ));
    rows.push(report(
        "append",
        format!("per-event durable, sled + fdatasync ({durable_n} events)"),
        Unit::EventsPerSec,
        &l,
        "sled+fds",
        &f,
        None,
        "baseline: insert + flush() + fdatasync of sled's db file, i.e. the same durability as the ledger".into(),
    ));
    let ft: Vec<f64> = tenths.iter().map(|x| x.0).collect();
    let lt: Vec<f64> = tenths.iter().map(|x| x.1).collect();
    let ib: Vec<f64> = tenths
        .iter()
        .map(|x| x.2 as f64 / durable_n as f64)
        .collect();
    let line = format!(
        "ledger per-event appends: {} over the first tenth of the run, {} over the last; index {:.0} B/event after close",
        fmt_val(Unit::EventsPerSec, median(&ft)),
        fmt_val(Unit::EventsPerSec, median(&lt)),
        median(&ib)
    );
    println!("  {line}");
    notes.push(format!("append: {line}"));

    // Group commit; its closed directories give the index size at n events.
    let mut stats: Option<ledger::Stats> = None;
    let mut layouts: Vec<Layout> = Vec::new();
    let mut sbytes = Vec::new();
    let (l, s) = alternate(
        cfg.reps,
        || {
            let run = run_ledger_append(&payloads, 100, layouts.is_empty());
            if run.stats.is_some() {
                stats = run.stats;
            }
            layouts.push(run.layout);
            n as f64 / run.secs
        },
        || {
            let (secs, bytes) = run_sled_append(&payloads, 100, false);
            sbytes.push(bytes as f64 / n as f64);
            n as f64 / secs
        },
    );
    rows.push(report(
        "append",
        format!("group commit, 100 per batch ({n} events)"),
        Unit::EventsPerSec,
        &l,
        "sled",
        &s,
        Some(Goal::RatioAtLeast(0.5)),
        "ledger: batch() of 100 appends + commit() (one write + fdatasync); sled: apply_batch of the same 100 values + flush()".into(),
    ));
    let per = |x: u64| x as f64 / n as f64;
    let idx: Vec<f64> = layouts.iter().map(|x| per(x.index)).collect();
    let seg: Vec<f64> = layouts.iter().map(|x| per(x.segments)).collect();
    let all: Vec<f64> = layouts.iter().map(|x| per(x.total)).collect();
    // The breakdown of the median run (by index size).
    let mid = {
        let mut v: Vec<&Layout> = layouts.iter().collect();
        v.sort_by_key(|x| x.index);
        v[v.len() / 2].clone()
    };
    let parts = mid.describe_parts(Some(n));
    println!("  index files after close (median run): {parts}");
    notes.push(format!(
        "append: index files after close at {n} events: {parts}"
    ));
    rows.push(report(
        "append",
        format!("index bytes/event after close ({n} events) vs segment bytes/event"),
        Unit::BytesPerEvent,
        &idx,
        "segments",
        &seg,
        Some(Goal::LedgerAtMost(350.0)),
        format!(
            "the group-commit ledgers, dropped and unlocked, then measured: everything but segments/*.seg, FORMAT and LOCK; ratio = index/segments. Files: {parts}"
        ),
    ));
    if let Some(st) = &stats {
        let ev = st.by_kind.get("event").cloned().unwrap_or_default();
        let line = format!(
            "ledger bytes per event (group commit run): payload {:.0}, event envelope raw {:.0}, stored {:.0} (zstd when it saves >11%), segment {:.0} (so {:.0} of record framing, metadata, one ref-update record per append and commit markers), index {:.0} after close",
            per(total as u64),
            per(ev.raw_bytes),
            per(ev.stored_bytes),
            median(&seg),
            median(&seg) - per(ev.stored_bytes),
            median(&idx)
        );
        println!("  {line}");
        notes.push(format!("append: {line}"));
    }
    bench_protections(cfg, &payloads, rows);
    rows.push(report(
        "append",
        format!("segment bytes/event vs raw sled db after close ({n} events)"),
        Unit::BytesPerEvent,
        &seg,
        "sled",
        &sbytes,
        None,
        format!(
            "payload {:.0} B/event; sled holds the payloads under 8-byte keys, measured after drop and lock release",
            per(total as u64)
        ),
    ));
    rows.push(report(
        "append",
        format!("whole ledger dir/event vs raw sled db after close ({n} events)"),
        Unit::BytesPerEvent,
        &all,
        "sled",
        &sbytes,
        None,
        "segments + index + FORMAT + LOCK".into(),
    ));
}

/// What the format-2 protections cost, in the same run: group commits (100
/// per batch) with everything on vs with the keyed, positional record checks
/// off (format 1's unkeyed checksum) and vs with the reader watermark off
/// (no `pwrite` after each `fdatasync`). Info rows: the ratio is protected /
/// unprotected throughput.
fn bench_protections(cfg: &Cfg, payloads: &[Vec<u8>], rows: &mut Vec<Row>) {
    let n = payloads.len();
    for (what, base, off) in [
        (
            "keyed record checks",
            "unkeyed",
            ledger::Unprotected {
                unkeyed_checks: true,
                ..Default::default()
            },
        ),
        (
            "reader watermark",
            "no mark",
            ledger::Unprotected {
                no_reader_watermark: true,
                ..Default::default()
            },
        ),
    ] {
        let (on, offs) = alternate(
            cfg.reps,
            || n as f64 / run_ledger_append(payloads, 100, false).secs,
            || {
                let opts = ledger::Options {
                    unprotected: off,
                    ..ledger::Options::default()
                };
                n as f64 / run_ledger_append_with(payloads, 100, false, opts).secs
            },
        );
        rows.push(report(
            "append",
            format!("cost of the {what}: group commit, 100 per batch ({n} events)"),
            Unit::EventsPerSec,
            &on,
            base,
            &offs,
            None,
            format!("ledger as shipped vs the same with the {what} switched off (Options::unprotected, test-only)"),
        ));
    }
}

// ---------------------------------------------------------------------------
// 2. snapshots
// ---------------------------------------------------------------------------

fn python_stmt(lex: &Lex, rng: &mut Rng, s: &mut String, indent: usize) {
    let pad = "    ".repeat(indent);
    match rng.below(6) {
        0 => {
            let (a, f, b) = (lex.ident(rng), lex.ident(rng), lex.ident(rng));
            putln!(s, "{pad}{a} = {f}({b}, {:.4})", rng.unit() * 10.0);
        }
        1 => {
            let (v, w) = (lex.ident(rng), lex.ident(rng));
            putln!(s, "{pad}for i in range({}):", rng.below(100));
            putln!(s, "{pad}    {v} += {w}[i] * {:.4}", rng.unit());
        }
        2 => {
            let (v, w, m, a) = (
                lex.ident(rng),
                lex.ident(rng),
                lex.word(rng).to_string(),
                lex.ident(rng),
            );
            putln!(s, "{pad}if {v} > {:.3}:", rng.unit() * 5.0);
            putln!(s, "{pad}    {v} = {w}.{m}({a})");
        }
        3 => {
            let n = rng.range(20, 90);
            putln!(s, "{pad}# {}", lex.prose(rng, n));
        }
        4 => {
            let v = lex.ident(rng);
            let k = rng.range(2, 8);
            let xs: Vec<String> = (0..k).map(|_| format!("{:.3}", rng.unit())).collect();
            putln!(s, "{pad}{v} = [{}]", xs.join(", "));
        }
        _ => {
            let n = rng.range(10, 50);
            let msg = lex.prose(rng, n);
            let v = lex.ident(rng);
            putln!(s, "{pad}log.info(\"{msg} %s\", {v})");
        }
    }
}

fn python_function(lex: &Lex, rng: &mut Rng, s: &mut String) {
    let name = lex.ident(rng);
    let nargs = rng.range(0, 3);
    let args: Vec<String> = (0..nargs).map(|_| lex.ident(rng)).collect();
    putln!(s, "\ndef {name}({}):", args.join(", "));
    let n = rng.range(30, 160);
    putln!(s, "    \"\"\"{}\"\"\"", lex.prose(rng, n));
    for _ in 0..rng.range(2, 9) {
        python_stmt(lex, rng, s, 1);
    }
    let r = lex.ident(rng);
    putln!(s, "    return {r}");
}

fn python_source(lex: &Lex, rng: &mut Rng, target: usize) -> String {
    let mut s = String::with_capacity(target + 1024);
    let n = rng.range(60, 240);
    putln!(s, "\"\"\"{}\"\"\"\n", lex.prose(rng, n));
    for _ in 0..rng.range(2, 6) {
        let m = lex.word(rng).to_string();
        putln!(s, "import {m}");
    }
    let (a, b, c, d) = (
        lex.word(rng).to_string(),
        lex.word(rng).to_string(),
        lex.ident(rng),
        lex.ident(rng),
    );
    putln!(s, "from {a}.{b} import {c}, {d}");
    while s.len() < target {
        python_function(lex, rng, &mut s);
    }
    s
}

fn csv_data(lex: &Lex, rng: &mut Rng, target: usize) -> String {
    let mut s = String::with_capacity(target + 256);
    s.push_str("step,epoch,split,loss,accuracy,lr,grad_norm,tokens_per_s,label\n");
    let mut step = 0usize;
    let mut loss = 2.0 + rng.unit();
    let splits = ["train", "train", "train", "val", "test"];
    while s.len() < target {
        step += rng.range(1, 50);
        loss *= 0.9995 - rng.unit() * 0.002;
        let noisy = loss + (rng.unit() - 0.5) * 0.05;
        let acc = (1.0 - loss / 3.0 + (rng.unit() - 0.5) * 0.02).clamp(0.0, 1.0);
        let split = *rng.pick(&splits);
        let label = lex.word(rng).to_string();
        putln!(
            s,
            "{step},{},{split},{noisy:.6},{acc:.5},{:.3e},{:.4},{:.1},{label}",
            step / 1000,
            3e-4 * (1.0 - rng.unit() * 0.5),
            rng.unit() * 4.0,
            8000.0 + rng.unit() * 4000.0
        );
    }
    s
}

fn json_result(lex: &Lex, rng: &mut Rng, n_tasks: usize) -> String {
    let tasks: Vec<Value> = (0..n_tasks)
        .map(|_| {
            json!({
                "task": lex.ident(rng),
                "score": (rng.unit() * 1e4).round() / 1e4,
                "n": rng.below(500),
                "passed": rng.chance(0.6),
                "runtime_s": (rng.unit() * 1e5).round() / 1e2,
            })
        })
        .collect();
    let v = json!({
        "run_id": format!("{:016x}", rng.next_u64()),
        "model": lex.ident(rng),
        "config": {
            "lr": rng.unit() * 1e-3,
            "batch_size": 8 << rng.below(5),
            "seed": rng.below(10_000),
            "warmup_steps": rng.below(2000),
        },
        "metrics": {
            "loss": rng.unit() * 2.0,
            "accuracy": rng.unit(),
            "f1": rng.unit(),
            "wall_s": rng.unit() * 1e4,
        },
        "tasks": tasks,
    });
    serde_json::to_string_pretty(&v).expect("serialise result json")
}

fn markdown(lex: &Lex, rng: &mut Rng, target: usize) -> String {
    let mut s = String::with_capacity(target + 1024);
    let title = lex.prose(rng, 30);
    putln!(s, "# {title}\n");
    while s.len() < target {
        match rng.below(5) {
            0 => {
                let h = lex.prose(rng, 24);
                putln!(s, "## {h}\n");
            }
            1 => {
                for _ in 0..rng.range(3, 6) {
                    let n = rng.range(30, 110);
                    putln!(s, "- {}", lex.prose(rng, n));
                }
                s.push('\n');
            }
            2 => {
                s.push_str("| run | loss | accuracy | f1 |\n|---|---|---|---|\n");
                for _ in 0..rng.range(3, 6) {
                    let r = lex.ident(rng);
                    putln!(
                        s,
                        "| {r} | {:.4} | {:.4} | {:.4} |",
                        rng.unit() * 2.0,
                        rng.unit(),
                        rng.unit()
                    );
                }
                s.push('\n');
            }
            3 => {
                s.push_str("```python\n");
                for _ in 0..rng.range(2, 5) {
                    python_stmt(lex, rng, &mut s, 0);
                }
                s.push_str("```\n\n");
            }
            _ => {
                let n = rng.range(200, 600);
                putln!(s, "{}\n", lex.prose(rng, n));
            }
        }
    }
    s
}

fn yaml_config(lex: &Lex, rng: &mut Rng, target: usize) -> String {
    let mut s = String::new();
    while s.len() < target {
        let sec = lex.ident(rng);
        putln!(s, "{sec}:");
        for _ in 0..rng.range(2, 6) {
            let k = lex.ident(rng);
            match rng.below(3) {
                0 => putln!(s, "  {k}: {:.5}", rng.unit()),
                1 => putln!(s, "  {k}: {}", rng.below(4096)),
                _ => {
                    let v = lex.word(rng).to_string();
                    putln!(s, "  {k}: {v}")
                }
            }
        }
    }
    s
}

/// A PNG signature and chunk framing around incompressible "image data".
fn png_like(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut v = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    v.extend_from_slice(&(320 + rng.below(640) as u32).to_be_bytes());
    v.extend_from_slice(&(240 + rng.below(480) as u32).to_be_bytes());
    v.extend_from_slice(b"\x08\x06\0\0\0IDAT");
    let body = len.saturating_sub(v.len() + 12);
    let start = v.len();
    v.resize(start + body, 0);
    rng.fill(&mut v[start..]);
    v.extend_from_slice(b"\0\0\0\0IEND\xaeB`\x82");
    v
}

/// Training-run log lines: the line templates (and their words) come from
/// `template_seed`, the numbers and timestamps from `number_seed`, so a
/// variant "rewrites the log with different numbers".
fn logs_txt(lex: &Lex, template_seed: u64, number_seed: u64, lines: usize) -> String {
    let mut s = String::with_capacity(lines * 110);
    let levels = ["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"];
    let comps = ["trainer", "data", "eval", "optim", "ckpt", "agent"];
    let mut clock = Rng::new(number_seed).below(86_400_000);
    for j in 0..lines as u64 {
        let mut t = Rng::new(mix(template_seed, j));
        let mut n = Rng::new(mix(number_seed, j));
        clock += n.range(1, 4000);
        let ms = clock % 1000;
        let secs = clock / 1000;
        put!(
            s,
            "2025-03-{:02}T{:02}:{:02}:{:02}.{ms:03}Z {:<5} [{}] ",
            1 + secs / 86_400 % 28,
            secs / 3600 % 24,
            secs / 60 % 60,
            secs % 60,
            t.pick(&levels),
            t.pick(&comps)
        );
        match t.below(4) {
            0 => putln!(
                s,
                "step={} loss={:.5} lr={:.3e} grad_norm={:.4} tok/s={:.1}",
                j * 10 + n.below(10) as u64,
                n.unit() * 3.0,
                n.unit() * 1e-3,
                n.unit() * 5.0,
                5000.0 + n.unit() * 5000.0
            ),
            1 => {
                let w = lex.ident(&mut t);
                putln!(
                    s,
                    "eval {w} acc={:.4} f1={:.4} n={}",
                    n.unit(),
                    n.unit(),
                    n.below(5000)
                )
            }
            2 => {
                let len = t.range(15, 70);
                let msg = lex.prose(&mut t, len);
                putln!(s, "{msg} ({} ms)", n.below(20_000))
            }
            _ => {
                let w = lex.word(&mut t).to_string();
                putln!(
                    s,
                    "checkpoint saved to ckpt/{w}-{}.pt size={} bytes",
                    n.below(100_000),
                    n.range(1 << 20, 1 << 30)
                )
            }
        }
    }
    s
}

struct Workspace {
    root: PathBuf,
    src: Vec<PathBuf>,
    figures: Vec<(PathBuf, usize)>,
    log_lines: usize,
}

const LOG_TEMPLATE_SEED: u64 = 0x1065;

fn gen_workspace(root: &Path, lex: &Lex, scale: f64) -> Workspace {
    let mut rng = Rng::new(SEED_SNAP);
    let count = |n: usize| ((n as f64 * scale).round() as usize).max(1);
    let pkgs = ["agents", "data", "models", "train", "eval", "utils"];
    let mut src = Vec::new();
    for i in 0..count(120) {
        let name = format!("{}_{i:03}.py", lex.word(&mut rng));
        let p = root.join("src").join(pkgs[i % pkgs.len()]).join(name);
        let len = rng.range(1000, 12_000);
        write_file(&p, python_source(lex, &mut rng, len).as_bytes());
        src.push(p);
    }
    for i in 0..count(20) {
        let p = root.join("tests").join(format!("test_{i:02}.py"));
        let len = rng.range(800, 5000);
        write_file(&p, python_source(lex, &mut rng, len).as_bytes());
        src.push(p);
    }
    for i in 0..count(50) {
        let p = root
            .join("data")
            .join(format!("{}_{i:02}.csv", lex.word(&mut rng)));
        let len = rng.range(20_000, 120_000);
        write_file(&p, csv_data(lex, &mut rng, len).as_bytes());
    }
    for i in 0..count(80) {
        let p = root.join("results").join(format!("exp_{i:03}.json"));
        let k = rng.range(2, 30);
        write_file(&p, json_result(lex, &mut rng, k).as_bytes());
    }
    for i in 0..count(30) {
        let p = root
            .join("notes")
            .join(format!("{i:02}_{}.md", lex.word(&mut rng)));
        let len = rng.range(1000, 8000);
        write_file(&p, markdown(lex, &mut rng, len).as_bytes());
    }
    for i in 0..count(25) {
        let p = root
            .join("configs")
            .join(format!("{}_{i:02}.yaml", lex.word(&mut rng)));
        let len = rng.range(300, 2000);
        write_file(&p, yaml_config(lex, &mut rng, len).as_bytes());
    }
    let mut figures = Vec::new();
    for i in 0..count(6).max(2) {
        let p = root.join("figures").join(format!("fig_{i:02}.png"));
        let len = rng.range(20_000, 60_000);
        write_file(&p, &png_like(&mut rng, len));
        figures.push((p, len));
    }
    let readme = markdown(lex, &mut rng, 3000);
    write_file(&root.join("README.md"), readme.as_bytes());
    let mut reqs = String::new();
    for _ in 0..15 {
        let w = lex.word(&mut rng).to_string();
        putln!(
            reqs,
            "{w}=={}.{}.{}",
            rng.below(4),
            rng.below(30),
            rng.below(10)
        );
    }
    write_file(&root.join("requirements.txt"), reqs.as_bytes());
    let report_md = markdown(lex, &mut rng, 8000);
    write_file(&root.join("report.md"), report_md.as_bytes());
    let results = json_result(lex, &mut rng, 40);
    write_file(&root.join("results.json"), results.as_bytes());
    let log_lines = count(2500);
    write_file(
        &root.join("logs.txt"),
        logs_txt(lex, LOG_TEMPLATE_SEED, 0, log_lines).as_bytes(),
    );
    Workspace {
        root: root.to_path_buf(),
        src,
        figures,
        log_lines,
    }
}

/// Variant `v` (1-based): a new report, new results, the log rewritten with
/// different numbers, one source file edited, one figure regenerated and one
/// new result file.
fn mutate(ws: &Workspace, lex: &Lex, v: usize) {
    let mut rng = Rng::new(mix(SEED_SNAP ^ 0xABCD, v as u64));
    let root = &ws.root;
    let report_md = markdown(lex, &mut rng, 8000);
    write_file(&root.join("report.md"), report_md.as_bytes());
    let results = json_result(lex, &mut rng, 40);
    write_file(&root.join("results.json"), results.as_bytes());
    write_file(
        &root.join("logs.txt"),
        logs_txt(lex, LOG_TEMPLATE_SEED, v as u64, ws.log_lines).as_bytes(),
    );
    let p = &ws.src[rng.below(ws.src.len())];
    let text = fs::read_to_string(p).expect("read source file to edit");
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    for _ in 0..3 {
        let i = rng.below(lines.len());
        let mut s = String::new();
        python_stmt(lex, &mut rng, &mut s, 1);
        lines[i] = s.trim_end().to_string();
    }
    let mut f = String::new();
    python_function(lex, &mut rng, &mut f);
    let at = rng.below(lines.len());
    lines.insert(at, f);
    write_file(p, (lines.join("\n") + "\n").as_bytes());
    let (fig, len) = &ws.figures[rng.below(ws.figures.len())];
    write_file(fig, &png_like(&mut rng, *len));
    let extra = json_result(lex, &mut rng, 10);
    write_file(
        &root.join("results").join(format!("run_{v:02}.json")),
        extra.as_bytes(),
    );
}

struct Git {
    dir: PathBuf,
    work: PathBuf,
}

impl Git {
    fn run(&self, args: &[&str]) {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(&self.dir)
            .arg("--work-tree")
            .arg(&self.work)
            .args([
                "-c",
                "user.name=mass-bench",
                "-c",
                "user.email=bench@example.invalid",
                "-c",
                "commit.gpgsign=false",
                "-c",
                "gc.auto=0",
            ])
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_DATE", "2025-01-01T00:00:00Z")
            .env("GIT_COMMITTER_DATE", "2025-01-01T00:00:00Z")
            .output()
            .unwrap_or_else(|e| panic!("cannot run git {args:?}: {e}"));
        if !out.status.success() {
            panic!(
                "git {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Bytes of git's pack files (`objects/pack/*.pack`).
fn pack_bytes(git_dir: &Path) -> u64 {
    let mut total = 0;
    walk_files(
        &git_dir.join("objects").join("pack"),
        "",
        &mut |rel, _, n| {
            if rel.ends_with(".pack") {
                total += n
            }
        },
    );
    total
}

struct SnapRep {
    /// One `mass snapshot` process per variant.
    proc_secs: f64,
    /// One open `Ledger`, `snapshot_dir` per variant.
    inproc_secs: f64,
    git_secs: f64,
    gc_secs: f64,
    proc: Layout,
    inproc: Layout,
    git_before_gc: u64,
    git_gc: u64,
    git_gc_pack: u64,
    git_aggressive: u64,
    git_aggressive_pack: u64,
    workspace_bytes: u64,
    files: usize,
}

fn snapshot_rep(cfg: &Cfg, lex: &Lex, bin: &Path, rep: usize) -> SnapRep {
    let tmp = tempdir("snapshots");
    let work = tmp.path().join("workspace");
    let ws = gen_workspace(&work, lex, cfg.snap_scale);
    let proc_dir = tmp.path().join("ledger-per-process");
    run_mass(bin, &proc_dir, &["init".as_ref()]);
    let l = Ledger::init(&tmp.path().join("ledger-in-process")).expect("init ledger");
    let git = Git {
        dir: tmp.path().join("git"),
        work: work.clone(),
    };
    // No template: sample hooks are not data.
    git.run(&["init", "-q", "--template="]);
    let (mut proc_secs, mut inproc_secs, mut git_secs) = (0.0, 0.0, 0.0);
    let mut last_tree = None;
    for v in 1..=cfg.snap_variants {
        mutate(&ws, lex, v);
        let mut printed = None;
        let mut stored = None;
        // Rotate which of the three goes first.
        for k in 0..3 {
            match (v + rep + k) % 3 {
                0 => {
                    let t = Instant::now();
                    let out = run_mass(bin, &proc_dir, &["snapshot".as_ref(), work.as_os_str()]);
                    proc_secs += t.elapsed().as_secs_f64();
                    printed = Some(out.trim().to_string());
                }
                1 => {
                    let t = Instant::now();
                    stored = Some(l.snapshot_dir(&work).expect("snapshot_dir"));
                    inproc_secs += t.elapsed().as_secs_f64();
                }
                _ => {
                    let t = Instant::now();
                    git.run(&["add", "-A"]);
                    git.run(&["commit", "-q", "-m", &format!("variant {v}")]);
                    git_secs += t.elapsed().as_secs_f64();
                }
            }
        }
        let stored = stored.expect("in-process snapshot ran");
        assert_eq!(
            printed.as_deref(),
            Some(stored.to_hex().as_str()),
            "variant {v}: `mass snapshot` printed another tree id than Ledger::snapshot_dir"
        );
        last_tree = Some(stored);
    }
    let last = l
        .get_tree(&last_tree.expect("a snapshot"))
        .expect("read the last tree");
    let files = last
        .entries
        .iter()
        .filter(|e| e.kind == ledger::EntryKind::File)
        .count();
    let inproc = close_ledger(l);
    wait_closed(&proc_dir);
    let proc = ledger_layout(&proc_dir);
    let git_before_gc = dir_size(&git.dir);
    let t = Instant::now();
    git.run(&["gc", "-q"]);
    let gc_secs = t.elapsed().as_secs_f64();
    let (git_gc, git_gc_pack) = (dir_size(&git.dir), pack_bytes(&git.dir));
    git.run(&["gc", "--aggressive", "--prune=now", "-q"]);
    SnapRep {
        proc_secs,
        inproc_secs,
        git_secs,
        gc_secs,
        proc,
        inproc,
        git_before_gc,
        git_gc,
        git_gc_pack,
        git_aggressive: dir_size(&git.dir),
        git_aggressive_pack: pack_bytes(&git.dir),
        workspace_bytes: last.content_bytes(),
        files,
    }
}

fn bench_snapshots(cfg: &Cfg, lex: &Lex, rows: &mut Vec<Row>) {
    let bin = mass_bin();
    println!(
        "\n== snapshots: {} workspace variants, one `mass snapshot` process each ({}) vs git add -A + commit, then git gc; {} reps ==",
        cfg.snap_variants,
        bin.display(),
        cfg.reps
    );
    let reps: Vec<SnapRep> = (0..cfg.reps)
        .map(|r| snapshot_rep(cfg, lex, &bin, r))
        .collect();
    let r0 = &reps[0];
    let col = |f: &dyn Fn(&SnapRep) -> f64| reps.iter().map(f).collect::<Vec<f64>>();
    println!(
        "  workspace: {} files, {} per version; .git before gc {}, git gc took {}",
        r0.files,
        fmt_val(Unit::Bytes, r0.workspace_bytes as f64),
        fmt_val(Unit::Bytes, r0.git_before_gc as f64),
        fmt_val(Unit::Secs, median(&col(&|r| r.gc_secs)))
    );
    let v = cfg.snap_variants;
    rows.push(report(
        "snapshots",
        format!("{v} versions, one process each: whole ledger dir vs whole .git after git gc"),
        Unit::Bytes,
        &col(&|r| r.proc.total as f64),
        "git",
        &col(&|r| r.git_gc as f64),
        Some(Goal::RatioAtMost(1.0)),
        format!(
            "{} files, {} per version; ledger: segments {}, index files {} ({}), measured after the last process exited; git: packs {}, before gc {}",
            r0.files,
            fmt_val(Unit::Bytes, r0.workspace_bytes as f64),
            fmt_val(Unit::Bytes, r0.proc.segments as f64),
            fmt_val(Unit::Bytes, r0.proc.index as f64),
            r0.proc.describe_parts(None),
            fmt_val(Unit::Bytes, r0.git_gc_pack as f64),
            fmt_val(Unit::Bytes, r0.git_before_gc as f64)
        ),
    ));
    rows.push(report(
        "snapshots",
        "segments only vs git pack files after git gc (info)".into(),
        Unit::Bytes,
        &col(&|r| r.proc.segments as f64),
        "git pack",
        &col(&|r| r.git_gc_pack as f64),
        None,
        "segments/*.seg vs objects/pack/*.pack".into(),
    ));
    rows.push(report(
        "snapshots",
        "whole ledger dir vs whole .git after git gc --aggressive (info)".into(),
        Unit::Bytes,
        &col(&|r| r.proc.total as f64),
        "git aggr",
        &col(&|r| r.git_aggressive as f64),
        None,
        format!(
            "git gc --aggressive --prune=now after the plain gc; its packs {}",
            fmt_val(Unit::Bytes, r0.git_aggressive_pack as f64)
        ),
    ));
    rows.push(report(
        "snapshots",
        "in-process (one Ledger, snapshot_dir per version): whole dir vs .git after git gc (info)"
            .into(),
        Unit::Bytes,
        &col(&|r| r.inproc.total as f64),
        "git",
        &col(&|r| r.git_gc as f64),
        None,
        format!(
            "keeps the tree-delta base between snapshots: segments {} ({:.3}x the git packs), index files {}",
            fmt_val(Unit::Bytes, r0.inproc.segments as f64),
            median(&col(&|r| r.inproc.segments as f64)) / median(&col(&|r| r.git_gc_pack as f64)),
            fmt_val(Unit::Bytes, r0.inproc.index as f64)
        ),
    ));
    rows.push(report(
        "snapshots",
        format!("time to store {v} versions: `mass snapshot` processes vs git add -A + commit"),
        Unit::Secs,
        &col(&|r| r.proc_secs),
        "git",
        &col(&|r| r.git_secs),
        Some(Goal::RatioAtMost(1.0)),
        format!(
            "each `mass snapshot` opens the ledger, snapshots and fsyncs, exits; git with default settings (core.fsync does not cover loose objects); in-process snapshot_dir took {} in all",
            fmt_val(Unit::Secs, median(&col(&|r| r.inproc_secs)))
        ),
    ));
}

// ---------------------------------------------------------------------------
// 3. conversations
// ---------------------------------------------------------------------------

const TOOL_NAMES: [&str; 4] = ["run_python", "shell", "read_file", "write_file"];
const MODEL: &str = "sim-base";

fn tools_json() -> Value {
    let string = |d: &str| json!({"type": "string", "description": d});
    json!([
        {"type": "function", "function": {
            "name": "run_python",
            "description": "Run a Python snippet in the task workspace and return its stdout, stderr and exit status. State persists between calls within one conversation.",
            "parameters": {"type": "object", "properties": {
                "code": string("Python source to execute."),
                "timeout_s": {"type": "integer", "description": "Wall-clock limit in seconds (default 60)."}
            }, "required": ["code"]}
        }},
        {"type": "function", "function": {
            "name": "shell",
            "description": "Run a shell command in the workspace (bash -lc) and return the combined output, truncated to 16 KiB.",
            "parameters": {"type": "object", "properties": {
                "cmd": string("The command line."),
                "cwd": string("Directory relative to the workspace root.")
            }, "required": ["cmd"]}
        }},
        {"type": "function", "function": {
            "name": "read_file",
            "description": "Read a text file from the workspace, optionally a line range.",
            "parameters": {"type": "object", "properties": {
                "path": string("Path relative to the workspace root."),
                "start": {"type": "integer"}, "end": {"type": "integer"}
            }, "required": ["path"]}
        }},
        {"type": "function", "function": {
            "name": "write_file",
            "description": "Create or overwrite a text file in the workspace.",
            "parameters": {"type": "object", "properties": {
                "path": string("Path relative to the workspace root."),
                "content": string("The complete new content.")
            }, "required": ["path", "content"]}
        }}
    ])
}

fn tool_args(lex: &Lex, rng: &mut Rng, tool: &str) -> String {
    let v = match tool {
        "run_python" => {
            let mut code = String::new();
            let target = rng.range(40, 650);
            while code.len() < target {
                python_stmt(lex, rng, &mut code, 0);
            }
            json!({"code": code})
        }
        "shell" => {
            let (a, b) = (lex.word(rng).to_string(), lex.ident(rng));
            json!({"cmd": format!("python -m {a}.{b} --epochs {} --lr {:.2e} 2>&1 | tail -n {}", rng.range(1, 20), rng.unit() * 1e-3, rng.range(5, 80))})
        }
        "read_file" => {
            let (a, b) = (lex.word(rng).to_string(), lex.ident(rng));
            json!({"path": format!("src/{a}/{b}.py"), "start": rng.below(200)})
        }
        _ => {
            let mut content = String::new();
            let target = rng.range(80, 600);
            while content.len() < target {
                python_stmt(lex, rng, &mut content, 0);
            }
            let a = lex.ident(rng);
            json!({"path": format!("src/{a}.py"), "content": content})
        }
    };
    serde_json::to_string(&v).expect("serialise tool arguments")
}

/// 300 B to 6 KiB of varied tool output: prose, CSV, logs, a traceback or a listing.
fn tool_output(lex: &Lex, rng: &mut Rng) -> String {
    let target = rng.range(300, 6144);
    let mut s = String::with_capacity(target + 256);
    match rng.below(5) {
        0 => s = lex.prose(rng, target),
        1 => s = csv_data(lex, rng, target),
        2 => {
            let seed = rng.next_u64();
            s = logs_txt(lex, seed, seed ^ 1, target / 100 + 1);
        }
        3 => {
            s.push_str("Traceback (most recent call last):\n");
            while s.len() < target {
                let (f, m) = (lex.ident(rng), lex.word(rng).to_string());
                putln!(
                    s,
                    "  File \"/workspace/src/{m}/{f}.py\", line {}, in {}",
                    rng.range(1, 900),
                    lex.ident(rng)
                );
                python_stmt(lex, rng, &mut s, 1);
            }
            let n = rng.range(20, 120);
            putln!(s, "ValueError: {}", lex.prose(rng, n));
        }
        _ => {
            while s.len() < target {
                let (d, f) = (lex.word(rng).to_string(), lex.ident(rng));
                putln!(
                    s,
                    "-rw-r--r-- 1 agent agent {:>9} Mar {:>2} {:02}:{:02} {d}/{f}.{}",
                    rng.below(5_000_000),
                    rng.range(1, 28),
                    rng.below(24),
                    rng.below(60),
                    rng.pick(&["py", "csv", "json", "md", "png", "pt"])
                );
            }
        }
    }
    s.truncate(target);
    s
}

fn system_prompt(lex: &Lex) -> Value {
    let mut rng = Rng::new(SEED_CONV);
    let body = lex.prose(&mut rng, 1900);
    json!({"role": "system", "content": format!("You are a research agent working in a Python workspace. Use the tools to run experiments; report numbers exactly as measured. {body}")})
}

/// Messages of one conversation: system, user, then per turn an assistant
/// message and (except after the last turn) the tool result it asked for.
fn gen_conversation(lex: &Lex, system: &Value, c: usize, turns: usize) -> Vec<Value> {
    let mut rng = Rng::new(mix(SEED_CONV, c as u64));
    let mut msgs = vec![system.clone()];
    let n = rng.range(900, 1200);
    let task = lex.prose(&mut rng, n);
    msgs.push(json!({"role": "user", "content": format!("Task {c}: {task}")}));
    for t in 1..=turns {
        if t == turns {
            let n = rng.range(100, 1500);
            msgs.push(json!({"role": "assistant", "content": lex.prose(&mut rng, n)}));
            break;
        }
        let n = rng.range(60, 700);
        let content = lex.prose(&mut rng, n);
        let tool = *rng.pick(&TOOL_NAMES);
        let call_id = format!("call_{:016x}", rng.next_u64());
        let args = tool_args(lex, &mut rng, tool);
        msgs.push(json!({
            "role": "assistant",
            "content": content,
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": tool, "arguments": args}}],
        }));
        let out = tool_output(lex, &mut rng);
        msgs.push(json!({"role": "tool", "tool_call_id": call_id, "content": out}));
    }
    msgs
}

/// Number of request messages of call `t` (1-based); the response is `msgs[n]`.
fn request_len(t: usize) -> usize {
    2 + 2 * (t - 1)
}

fn finish_reason(resp: &Value) -> &'static str {
    if resp.get("tool_calls").is_some() {
        "tool_calls"
    } else {
        "stop"
    }
}

fn approx_tokens(msgs: &[Value]) -> u64 {
    msgs.iter()
        .map(|m| serde_json::to_vec(m).map(|v| v.len()).unwrap_or(0) as u64 / 4)
        .sum()
}

#[derive(serde::Serialize)]
struct LogRow<'a> {
    id: String,
    timestamp: String,
    latency_ms: u64,
    request: LogRequest<'a>,
    response: LogResponse<'a>,
}

#[derive(serde::Serialize)]
struct LogRequest<'a> {
    model: &'a str,
    messages: &'a [Value],
    tools: &'a Value,
    temperature: f64,
    seed: u64,
}

#[derive(serde::Serialize)]
struct LogResponse<'a> {
    id: String,
    object: &'a str,
    model: &'a str,
    choices: [LogChoice<'a>; 1],
    usage: LogUsage,
}

#[derive(serde::Serialize)]
struct LogChoice<'a> {
    index: u32,
    message: &'a Value,
    finish_reason: &'a str,
}

#[derive(serde::Serialize)]
struct LogUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

/// The calls in log order: turn by turn, conversations interleaved.
fn call_order(k: usize, turns: usize) -> Vec<(usize, usize)> {
    let mut v = Vec::with_capacity(k * turns);
    for t in 1..=turns {
        for c in 0..k {
            v.push((c, t));
        }
    }
    v
}

/// (a) the proxy log: one JSONL row per request with the whole history, gzip'd.
/// Returns (seconds, gzip bytes, raw bytes).
fn run_jsonl(convs: &[Vec<Value>], tools: &Value, turns: usize) -> (f64, u64, u64) {
    let t0 = Instant::now();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut raw = 0u64;
    let mut line = Vec::with_capacity(1 << 20);
    for (i, (c, t)) in call_order(convs.len(), turns).into_iter().enumerate() {
        let msgs = &convs[c];
        let n = request_len(t);
        let resp = &msgs[n];
        let prompt = approx_tokens(&msgs[..n]);
        let completion = approx_tokens(std::slice::from_ref(resp));
        let row = LogRow {
            id: format!("req-{c:03}-{t:03}"),
            timestamp: format!("2025-03-01T12:{:02}:{:02}Z", i / 60 % 60, i % 60),
            latency_ms: 800 + (i as u64 * 37) % 4000,
            request: LogRequest {
                model: MODEL,
                messages: &msgs[..n],
                tools,
                temperature: 0.7,
                seed: 7,
            },
            response: LogResponse {
                id: format!("chatcmpl-{c:03}{t:03}"),
                object: "chat.completion",
                model: MODEL,
                choices: [LogChoice {
                    index: 0,
                    message: resp,
                    finish_reason: finish_reason(resp),
                }],
                usage: LogUsage {
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    total_tokens: prompt + completion,
                },
            },
        };
        line.clear();
        serde_json::to_writer(&mut line, &row).expect("serialise log row");
        line.push(b'\n');
        raw += line.len() as u64;
        gz.write_all(&line).expect("gzip write");
    }
    let out = gz.finish().expect("gzip finish");
    (t0.elapsed().as_secs_f64(), out.len() as u64, raw)
}

/// (b) the ledger: message blobs shared by content, one `model.call` event per
/// call chained by `prefix`, one ref per conversation, one durable commit per call.
/// With `check`, rebuilds every conversation's last request afterwards (see
/// `check_reconstruction`). Returns (seconds, the directory after closing).
fn run_ledger_conv(
    convs: &[Vec<Value>],
    tools: &Value,
    turns: usize,
    check: bool,
) -> (f64, Layout) {
    let tmp = tempdir("conversations");
    let l = Ledger::init(&tmp.path().join("ledger")).expect("init ledger");
    let mut heads: Vec<Option<Id>> = vec![None; convs.len()];
    let t0 = Instant::now();
    for (i, (c, t)) in call_order(convs.len(), turns).into_iter().enumerate() {
        let msgs = &convs[c];
        let n = request_len(t);
        let new = if t == 1 { &msgs[..2] } else { &msgs[n - 1..n] };
        let resp = &msgs[n];
        let mut b = l.batch();
        let mut new_ids = Vec::with_capacity(new.len());
        for m in new {
            let bytes = serde_json::to_vec(m).expect("canonical message json");
            new_ids.push(Hash32::from(b.put_blob(&bytes).expect("put message")));
        }
        let tools_id = b
            .put_blob(&serde_json::to_vec(tools).expect("tools json"))
            .expect("put tools");
        let resp_bytes = serde_json::to_vec(resp).expect("canonical response json");
        let resp_id = b.put_blob(&resp_bytes).expect("put response");
        let prompt = approx_tokens(&msgs[..n]);
        let call = ModelCall {
            role: "subagent".into(),
            model: MODEL.into(),
            params: r#"{"seed":7,"temperature":0.7}"#.into(),
            prefix: heads[c].map(Hash32::from),
            messages: new_ids,
            tools: Some(tools_id.into()),
            response: resp_id.into(),
            prompt_tokens: prompt,
            completion_tokens: resp_bytes.len() as u64 / 4,
            finish_reason: finish_reason(resp).into(),
        };
        let ev = schemas::to_event(&call)
            .expect("model.call event")
            .with_meta("latency_ms", (800 + (i as u64 * 37) % 4000).to_string());
        let id = b
            .append(&format!("conv/{c:03}"), heads[c], ev)
            .expect("append model.call");
        b.commit().expect("commit model call");
        heads[c] = Some(id);
    }
    let secs = t0.elapsed().as_secs_f64();
    if check {
        check_reconstruction(&l, convs, tools, turns);
        let r = l.verify(&schema_check).expect("verify");
        assert!(r.is_clean(), "conversation ledger: {:?}", r.problems);
    }
    let layout = close_ledger(l);
    drop(tmp);
    (secs, layout)
}

/// Rebuilds the full request of each conversation's last call by following
/// `prefix` links and checks it byte for byte against what was sent.
fn check_reconstruction(l: &Ledger, convs: &[Vec<Value>], tools: &Value, turns: usize) {
    let tools_bytes = serde_json::to_vec(tools).expect("tools json");
    for (c, msgs) in convs.iter().enumerate() {
        let head = l
            .head(&format!("conv/{c:03}"))
            .expect("read head")
            .expect("conversation ref exists");
        let mut chain: Vec<ModelCall> = Vec::new();
        let mut cur = Some(head);
        while let Some(id) = cur {
            let ev = l.get_event(&id).expect("read model.call");
            let call: ModelCall = schemas::decode_event(&ev).expect("decode model.call");
            cur = call.prefix.map(Id::from);
            chain.push(call);
        }
        chain.reverse();
        assert_eq!(chain.len(), turns, "conversation {c}: chain length");
        let mut request: Vec<Vec<u8>> = Vec::new();
        for (i, call) in chain.iter().enumerate() {
            if i > 0 {
                request.push(l.get_blob(&chain[i - 1].response.into()).expect("blob"));
            }
            for m in &call.messages {
                request.push(l.get_blob(&(*m).into()).expect("blob"));
            }
        }
        let last = chain.last().expect("at least one call");
        let n = request_len(turns);
        let want: Vec<Vec<u8>> = msgs[..n]
            .iter()
            .map(|m| serde_json::to_vec(m).expect("json"))
            .collect();
        assert_eq!(request.len(), want.len(), "conversation {c}: message count");
        assert!(
            request == want,
            "conversation {c}: reconstructed request differs from the one sent"
        );
        let resp = l.get_blob(&last.response.into()).expect("response blob");
        assert_eq!(resp, serde_json::to_vec(&msgs[n]).expect("json"));
        let t = l
            .get_blob(&last.tools.expect("tools").into())
            .expect("tools blob");
        assert_eq!(t, tools_bytes, "conversation {c}: tools");
    }
}

fn bench_conversations(cfg: &Cfg, lex: &Lex, rows: &mut Vec<Row>) {
    let (k, turns) = (cfg.conv_k, cfg.conv_turns);
    let system = system_prompt(lex);
    let tools = tools_json();
    let convs: Vec<Vec<Value>> = (0..k)
        .map(|c| gen_conversation(lex, &system, c, turns))
        .collect();
    let msg_bytes: usize = convs
        .iter()
        .flatten()
        .map(|m| serde_json::to_vec(m).map(|v| v.len()).unwrap_or(0))
        .sum();
    println!(
        "\n== conversations: K={k} x {turns} turns ({} calls), {} of distinct messages, {} reps ==",
        k * turns,
        fmt_val(Unit::Bytes, msg_bytes as f64),
        cfg.reps
    );
    let mut ledger_secs = Vec::new();
    let mut seg = Vec::new();
    let mut all = Vec::new();
    let mut jsonl_secs = Vec::new();
    let mut gz = Vec::new();
    let mut raw = 0;
    for r in 0..cfg.reps {
        let mut do_ledger = || {
            let (secs, layout) = run_ledger_conv(&convs, &tools, turns, r == 0);
            if r == 0 {
                println!("  check: the full request of every conversation's last call was rebuilt from prefixes, byte-identical");
            }
            ledger_secs.push(secs);
            seg.push(layout.segments as f64);
            all.push(layout.total as f64);
        };
        let mut do_jsonl = || {
            let (secs, g, rb) = run_jsonl(&convs, &tools, turns);
            jsonl_secs.push(secs);
            gz.push(g as f64);
            raw = rb;
        };
        if r.is_multiple_of(2) {
            do_ledger();
            do_jsonl();
        } else {
            do_jsonl();
            do_ledger();
        }
    }
    let note = format!(
        "JSONL uncompressed {}; gzip level 6",
        fmt_val(Unit::Bytes, raw as f64)
    );
    rows.push(report(
        "conversations",
        format!("stored bytes, {k}x{turns} calls: segments vs gzip JSONL"),
        Unit::Bytes,
        &seg,
        "gz-jsonl",
        &gz,
        Some(Goal::RatioAtMost(0.1)),
        note,
    ));
    rows.push(report(
        "conversations",
        "whole ledger dir after close vs gzip JSONL (info)".into(),
        Unit::Bytes,
        &all,
        "gz-jsonl",
        &gz,
        None,
        String::new(),
    ));
    rows.push(report(
        "conversations",
        "time to log all calls (info)".into(),
        Unit::Secs,
        &ledger_secs,
        "gz-jsonl",
        &jsonl_secs,
        None,
        "ledger: one durable (fsync'd) commit per call; JSONL: serialise + gzip in memory, no fsync".into(),
    ));
}

// ---------------------------------------------------------------------------
// 4. scan
// ---------------------------------------------------------------------------

const SCAN_REF: &str = "bench/scan";
/// The raw sled store of the verify baseline (see the module doc): ordinal
/// (u64 BE) -> id (32) + envelope length (u32 LE) + canonical envelope +
/// metadata JSON, i.e. what a ledger record holds.
const SLED_LOG: &str = "log";
/// id -> ordinal (u64 BE): the baseline's index.
const SLED_IDS: &str = "ids";
/// ref name -> head id.
const SLED_REFS: &str = "refs";
/// In the default tree: the number of events (u64 LE), to size the seen-table.
const SLED_COUNT: &[u8] = b"count";

/// The payload check `mass verify` passes to `Ledger::verify_with`: the schema registry.
fn schema_check(ev: &ledger::Event) -> Result<(), String> {
    schemas::check(&ev.kind, ev.version, &ev.payload).map_err(|e| e.to_string())
}

/// Scan event `i`: a `note` (a registered kind, so `mass verify` can check
/// its payload) of 64 B to 2 KiB of text.
fn scan_event(lex: &Lex, i: u64) -> NewEvent {
    let text = String::from_utf8(event_payload(lex, SEED_SCAN, i)).expect("payloads are ASCII");
    schemas::to_event(&Note { text }).expect("encode a note event")
}

fn sled_tree(db: &sled::Db, name: &str) -> sled::Tree {
    db.open_tree(name)
        .unwrap_or_else(|e| panic!("open sled tree {name}: {e}"))
}

/// Writes the same `n` events to a ledger (batches of 1000) and to the raw
/// sled store, checking that both give every event the same id. Returns the
/// seconds each took and both directories' sizes after closing.
fn build_scan_stores(
    lex: &Lex,
    n: usize,
    ledger_dir: &Path,
    sled_dir: &Path,
) -> (f64, f64, Layout, u64) {
    const GROUP: usize = 1000;
    let l = Ledger::init(ledger_dir).expect("init ledger");
    let db = open_sled(sled_dir);
    let (log, ids, refs) = (
        sled_tree(&db, SLED_LOG),
        sled_tree(&db, SLED_IDS),
        sled_tree(&db, SLED_REFS),
    );
    let host = fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mut head: Option<Id> = None;
    let mut sled_head: Option<Id> = None;
    let mut lsecs = 0.0;
    let mut ssecs = 0.0;
    let mut i = 0usize;
    while i < n {
        let end = (i + GROUP).min(n);
        let events: Vec<NewEvent> = (i..end).map(|j| scan_event(lex, j as u64)).collect();
        let t = Instant::now();
        let mut b = l.batch();
        let mut ledger_ids = Vec::with_capacity(events.len());
        for ev in &events {
            let id = b.append(SCAN_REF, head, ev.clone()).expect("batch append");
            ledger_ids.push(id);
            head = Some(id);
        }
        b.commit().expect("batch commit");
        lsecs += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let meta = serde_json::to_vec(&ledger::Meta {
            wall_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            host: host.clone(),
            pid: std::process::id(),
            extra: BTreeMap::new(),
        })
        .expect("metadata json");
        let mut lb = sled::Batch::default();
        let mut ib = sled::Batch::default();
        let mut sled_ids = Vec::with_capacity(events.len());
        for (j, ev) in events.iter().enumerate() {
            let ord = (i + j) as u64;
            let env = EventEnvelope::build(SCAN_REF, ord, sled_head, ev)
                .to_bytes()
                .expect("encode envelope");
            let id = Id::of(ObjectKind::Event, &env);
            let mut v = Vec::with_capacity(36 + env.len() + meta.len());
            v.extend_from_slice(&id.0);
            v.extend_from_slice(&(env.len() as u32).to_le_bytes());
            v.extend_from_slice(&env);
            v.extend_from_slice(&meta);
            lb.insert(&ord.to_be_bytes()[..], v);
            ib.insert(&id.0[..], &ord.to_be_bytes()[..]);
            sled_ids.push(id);
            sled_head = Some(id);
        }
        log.apply_batch(lb).expect("sled apply_batch log");
        ids.apply_batch(ib).expect("sled apply_batch ids");
        if let Some(h) = sled_head {
            refs.insert(SCAN_REF, &h.0[..]).expect("sled insert ref");
        }
        db.insert(SLED_COUNT, &(end as u64).to_le_bytes()[..])
            .expect("sled insert count");
        ssecs += t.elapsed().as_secs_f64();
        assert!(
            ledger_ids == sled_ids,
            "events {i}..{end}: the raw sled store must hold the ledger's events (same ids)"
        );
        i = end;
    }
    let t = Instant::now();
    db.flush().expect("sled flush");
    ssecs += t.elapsed().as_secs_f64();
    drop((log, ids, refs));
    let sled_bytes = close_sled(db, sled_dir);
    (lsecs, ssecs, close_ledger(l), sled_bytes)
}

/// What `sled_verify` found.
#[derive(Debug, Default)]
struct MirrorReport {
    events: u64,
    bytes: u64,
    problems: Vec<String>,
}

/// The baseline's seen-table entry, like `Slot` in ledger/src/verify.rs.
#[derive(Clone, Copy)]
struct SeenSlot {
    ordinal: u64,
    seen: bool,
}

fn key16(id: &[u8]) -> [u8; 16] {
    let mut k = [0u8; 16];
    k.copy_from_slice(&id[..16]);
    k
}

/// The checks of `Ledger::verify_with` (with the schema registry as payload
/// check, as `mass verify` does), done over the raw sled store: see the module
/// doc. `index` adds the index passes (steps 1 and 3), as `mass verify` does
/// unless `--log-only`.
fn sled_verify(db: &sled::Db, index: bool) -> MirrorReport {
    let (log, ids, refs) = (
        sled_tree(db, SLED_LOG),
        sled_tree(db, SLED_IDS),
        sled_tree(db, SLED_REFS),
    );
    let count = db
        .get(SLED_COUNT)
        .expect("sled get count")
        .and_then(|v| <[u8; 8]>::try_from(&v[..]).ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    let mut r = MirrorReport::default();
    let mut seen: HashMap<[u8; 16], SeenSlot> = HashMap::with_capacity(count as usize);
    // 1. One ordered pass over the index.
    if index {
        for kv in ids.iter() {
            let (k, v) = kv.expect("sled iterate ids");
            match (k.len(), <[u8; 8]>::try_from(&v[..])) {
                (32, Ok(o)) => {
                    seen.insert(
                        key16(&k),
                        SeenSlot {
                            ordinal: u64::from_be_bytes(o),
                            seen: false,
                        },
                    );
                }
                _ => r
                    .problems
                    .push(format!("malformed index entry {}", hex::encode(&k))),
            }
        }
    }
    // 2. The log, in order.
    let mut heads: HashMap<String, Id> = HashMap::new();
    for kv in log.iter() {
        let (k, v) = kv.expect("sled iterate log");
        r.bytes += (k.len() + v.len()) as u64;
        let Ok(ord) = <[u8; 8]>::try_from(&k[..]).map(u64::from_be_bytes) else {
            r.problems
                .push(format!("malformed log key {}", hex::encode(&k)));
            continue;
        };
        let id = v.get(..32).and_then(Id::from_slice);
        let split = <[u8; 4]>::try_from(v.get(32..36).unwrap_or(&[]))
            .ok()
            .map(|n| 36 + u32::from_le_bytes(n) as usize)
            .filter(|&e| e <= v.len());
        let (Some(id), Some(env_end)) = (id, split) else {
            r.problems
                .push(format!("log entry {ord}: too short or bad envelope length"));
            continue;
        };
        let (env_bytes, meta) = (&v[36..env_end], &v[env_end..]);
        r.events += 1;
        match check_sled_event(&id, ord, env_bytes, meta, &seen, index) {
            Ok(stream) => {
                heads.insert(stream, id);
            }
            Err(what) => r.problems.push(format!("{id}: {what}")),
        }
        if index {
            if let Some(s) = seen.get_mut(&key16(&id.0)) {
                s.seen = true;
            }
        } else {
            seen.insert(
                key16(&id.0),
                SeenSlot {
                    ordinal: ord,
                    seen: true,
                },
            );
        }
    }
    // 3. Every index entry must be an event the scan met.
    if index {
        for (k, s) in &seen {
            if !s.seen {
                r.problems.push(format!(
                    "the index places {}... at ordinal {}, where the log has no such event",
                    hex::encode(k),
                    s.ordinal
                ));
            }
        }
    }
    // 4. The refs must be the heads the log ends with.
    let mut nrefs = 0;
    for kv in refs.iter() {
        let (k, v) = kv.expect("sled iterate refs");
        nrefs += 1;
        let name = String::from_utf8_lossy(&k).into_owned();
        match (Id::from_slice(&v), heads.get(&name)) {
            (Some(id), Some(h)) if id == *h => {}
            (id, h) => r.problems.push(format!(
                "ref {name:?} is {id:?} in the refs tree but {h:?} in the log"
            )),
        }
    }
    if nrefs != heads.len() {
        r.problems.push(format!(
            "{} refs stored, {} streams in the log",
            nrefs,
            heads.len()
        ));
    }
    r
}

/// One event of the baseline's log, as `check_object` checks one in the ledger.
/// Returns its stream.
fn check_sled_event(
    id: &Id,
    ord: u64,
    env_bytes: &[u8],
    meta: &[u8],
    seen: &HashMap<[u8; 16], SeenSlot>,
    index: bool,
) -> Result<String, String> {
    if index {
        match seen.get(&key16(&id.0)) {
            Some(s) if s.ordinal == ord => {}
            Some(s) => {
                return Err(format!(
                    "index places it at ordinal {}, log at {ord}",
                    s.ordinal
                ))
            }
            None => return Err("missing from the index".into()),
        }
    }
    let actual = Id::of(ObjectKind::Event, env_bytes);
    if actual != *id {
        return Err(format!("content hashes to {actual}"));
    }
    let env = EventEnvelope::from_bytes(id, env_bytes).map_err(|e| e.to_string())?;
    let stored_before = |x: &[u8; 32]| seen.get(&key16(x)).is_some_and(|s| s.seen);
    match &env.prev {
        Some(p) if !stored_before(p) => {
            return Err(format!(
                "prev {} is not stored before it (dangling reference)",
                hex::encode(p)
            ))
        }
        None if env.seq != 0 => return Err(format!("seq {} without a prev event", env.seq)),
        _ => {}
    }
    for (what, links) in [("parent", &env.parents), ("ref", &env.refs)] {
        if let Some(x) = links.iter().find(|x| !stored_before(x)) {
            return Err(format!(
                "{what} {} is not stored before it (dangling reference)",
                hex::encode(x)
            ));
        }
    }
    schemas::check(&env.kind, env.version, &env.payload)
        .map_err(|e| format!("payload of {} v{}: {e}", env.kind, env.version))?;
    if !meta.is_empty() && serde_json::from_slice::<serde::de::IgnoredAny>(meta).is_err() {
        return Err("metadata is not valid JSON".into());
    }
    Ok(env.stream)
}

fn vm_kb(field: &str) -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix(field)?.strip_prefix(':')?;
            rest.trim().trim_end_matches("kB").trim().parse().ok()
        })
        .unwrap_or(0)
}

/// Runs in a re-executed copy of this binary: one scan, result as JSON on stdout.
fn child_main(kind: &str) {
    let dir = PathBuf::from(std::env::var_os(CHILD_DIR_ENV).expect("MASS_BENCH_DIR is set"));
    let index = std::env::var(INDEX_ENV).is_ok_and(|v| v == "1");
    let (secs, events, problems, hwm_open) = match kind {
        "verify" => {
            // Exactly `mass verify` (src/commands/maintain.rs); `--log-only`
            // when `index` is off.
            let l = Ledger::open_with(&dir, ledger::Options::default())
                .expect("open ledger for verify");
            let hwm_open = vm_kb("VmHWM");
            let t = Instant::now();
            let r = l
                .verify_with(
                    &schema_check,
                    ledger::VerifyOptions {
                        index,
                        absent_ok: false,
                    },
                )
                .expect("verify");
            let secs = t.elapsed().as_secs_f64();
            let problems: Vec<String> = r.problems.iter().map(|p| p.to_string()).collect();
            (secs, r.events, problems, hwm_open)
        }
        "sled" => {
            let db = open_sled(&dir);
            let hwm_open = vm_kb("VmHWM");
            let t = Instant::now();
            let r = sled_verify(&db, index);
            (t.elapsed().as_secs_f64(), r.events, r.problems, hwm_open)
        }
        other => panic!("unknown child kind {other:?}"),
    };
    let hwm = vm_kb("VmHWM");
    if !problems.is_empty() {
        for p in problems.iter().take(10) {
            eprintln!("{kind} problem: {p}");
        }
        std::process::exit(3);
    }
    println!(
        "{}",
        json!({"secs": secs, "events": events, "hwm_kb": hwm, "hwm_open_kb": hwm_open})
    );
}

fn run_child(kind: &str, dir: &Path, index: bool) -> Value {
    let exe = std::env::current_exe().expect("path of the bench binary");
    let out = Command::new(exe)
        .env(CHILD_ENV, kind)
        .env(CHILD_DIR_ENV, dir)
        .env(INDEX_ENV, if index { "1" } else { "0" })
        .output()
        .expect("re-execute the bench binary");
    if !out.status.success() {
        panic!(
            "{kind} child failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{kind} child output {line:?}: {e}"))
}

/// Per rep: (events/s, peak RSS bytes, peak RSS after open) of ledger and sled.
struct ScanRuns {
    lrate: Vec<f64>,
    srate: Vec<f64>,
    lhwm: Vec<f64>,
    shwm: Vec<f64>,
    lopen: Vec<f64>,
}

fn scan_runs(cfg: &Cfg, ldir: &Path, sdir: &Path, index: bool) -> ScanRuns {
    let n = cfg.scan_n;
    let kb = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0) * 1024.0;
    let rate = |v: &Value| n as f64 / v["secs"].as_f64().unwrap_or(f64::NAN);
    let (mut lv, mut sv) = (Vec::new(), Vec::new());
    for r in 0..cfg.reps {
        // Alternate which goes first.
        for k in 0..2 {
            if (r + k) % 2 == 0 {
                let v = run_child("verify", ldir, index);
                assert_eq!(v["events"].as_u64(), Some(n as u64), "verify event count");
                lv.push(v);
            } else {
                let v = run_child("sled", sdir, index);
                assert_eq!(v["events"].as_u64(), Some(n as u64), "sled verify count");
                sv.push(v);
            }
        }
    }
    ScanRuns {
        lrate: lv.iter().map(rate).collect(),
        srate: sv.iter().map(rate).collect(),
        lhwm: lv.iter().map(|v| kb(v, "hwm_kb")).collect(),
        shwm: sv.iter().map(|v| kb(v, "hwm_kb")).collect(),
        lopen: lv.iter().map(|v| kb(v, "hwm_open_kb")).collect(),
    }
}

fn bench_scan(cfg: &Cfg, lex: &Lex, rows: &mut Vec<Row>) {
    let n = cfg.scan_n;
    println!(
        "\n== scan: `mass verify` vs the same checks over raw sled, {n} note events, {} reps (each in a child process) ==",
        cfg.reps
    );
    let tmp = tempdir("scan");
    let ldir = tmp.path().join("ledger");
    let sdir = tmp.path().join("sled");
    let (lb, sb, layout, sled_bytes) = build_scan_stores(lex, n, &ldir, &sdir);
    println!(
        "  built: ledger {} (segments {}, index {}; {} groups of 1000, {}), sled {} ({}); same event ids in both",
        fmt_val(Unit::Bytes, layout.total as f64),
        fmt_val(Unit::Bytes, layout.segments as f64),
        fmt_val(Unit::Bytes, layout.index as f64),
        n.div_ceil(1000),
        fmt_val(Unit::Secs, lb),
        fmt_val(Unit::Bytes, sled_bytes as f64),
        fmt_val(Unit::Secs, sb)
    );
    let bin = mass_bin();
    let t = Instant::now();
    let out = run_mass(&bin, &ldir, &["verify".as_ref(), "--json".as_ref()]);
    let v: Value = serde_json::from_str(&out).expect("`mass verify --json` output");
    assert_eq!(v["clean"], json!(true), "`mass verify` on the bench ledger");
    assert_eq!(
        v["events"].as_u64(),
        Some(n as u64),
        "`mass verify` event count"
    );
    println!(
        "  check: the `mass verify` binary finds the bench ledger clean with {n} events ({} including process start and open)",
        fmt_val(Unit::Secs, t.elapsed().as_secs_f64())
    );
    let full = scan_runs(cfg, &ldir, &sdir, true);
    let log_only = scan_runs(cfg, &ldir, &sdir, false);
    rows.push(report(
        "scan",
        format!("`mass verify` ({n} events) vs the same checks over raw sled"),
        Unit::EventsPerSec,
        &full.lrate,
        "sled",
        &full.srate,
        Some(Goal::RatioAtLeast(0.5)),
        "log + index cross-check + refs on both sides (see the bench doc); warm page cache for both".into(),
    ));
    rows.push(report(
        "scan",
        format!("`mass verify --log-only` ({n} events) vs the same without index passes (info)"),
        Unit::EventsPerSec,
        &log_only.lrate,
        "sled",
        &log_only.srate,
        None,
        format!(
            "peak RSS: ledger {}, sled {}",
            fmt_val(Unit::Bytes, median(&log_only.lhwm)),
            fmt_val(Unit::Bytes, median(&log_only.shwm))
        ),
    ));
    let max = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    let note = if n < 1_000_000 {
        format!(
            "peak after Ledger::open {}; the goal is stated for 1M events, this run has {n} (run --full for 1M)",
            fmt_val(Unit::Bytes, max(&full.lopen))
        )
    } else {
        format!(
            "peak after Ledger::open {}",
            fmt_val(Unit::Bytes, max(&full.lopen))
        )
    };
    rows.push(report(
        "scan",
        format!("peak RSS (VmHWM) of `mass verify` ({n} events)"),
        Unit::Bytes,
        &full.lhwm,
        "sled",
        &full.shwm,
        Some(Goal::LedgerBelow(256.0 * MIB)),
        note,
    ));
}

// ---------------------------------------------------------------------------
// 5. concurrent
// ---------------------------------------------------------------------------

/// The OS file layer, counting `sync_data` calls.
#[derive(Debug, Default)]
struct CountingFiles {
    syncs: Arc<AtomicU64>,
}

struct CountingAppend {
    inner: Box<dyn ledger::AppendFile>,
    syncs: Arc<AtomicU64>,
}

impl ledger::AppendFile for CountingAppend {
    fn append(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.inner.append(buf)
    }
    fn sync_data(&mut self) -> std::io::Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.inner.sync_data()
    }
}

impl ledger::FileLayer for CountingFiles {
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn ledger::AppendFile>> {
        Ok(Box::new(CountingAppend {
            inner: ledger::OsFiles.open_append(path)?,
            syncs: self.syncs.clone(),
        }))
    }
    fn write_file(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        ledger::OsFiles.write_file(path, bytes)
    }
    fn sync_file(&self, path: &Path) -> std::io::Result<()> {
        ledger::OsFiles.sync_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        ledger::OsFiles.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        ledger::OsFiles.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> std::io::Result<()> {
        ledger::OsFiles.remove_dir_all(path)
    }
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        ledger::OsFiles.create_dir_all(path)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        ledger::OsFiles.sync_dir(dir)
    }
}

/// A 300-byte text-like event payload (a model call's "finished" record).
fn small_payload(lex: &Lex, stream: usize, i: usize) -> Vec<u8> {
    let mut rng = Rng::new(mix(SEED_CONC, ((stream as u64) << 32) | i as u64));
    let mut s = String::with_capacity(400);
    put!(s, "{{\"call\":{i},\"stream\":{stream},\"text\":\"");
    while s.len() < 300 {
        lex.sentence(&mut rng, &mut s);
        s.push(' ');
    }
    s.truncate(300);
    s.into_bytes()
}

/// Commits `payloads[s][i]` as one-event batches to stream `s`: from one
/// thread per stream, all at once, or (`threads == 1`) from one thread,
/// round-robin over the streams. Returns (seconds, fsyncs during the run).
fn run_concurrent(payloads: &[Vec<Vec<u8>>], threads: usize) -> (f64, u64) {
    let tmp = tempdir("concurrent");
    let dir = tmp.path().join("ledger");
    let files = CountingFiles::default();
    let syncs = files.syncs.clone();
    let opts = ledger::Options {
        files: Arc::new(files),
        ..ledger::Options::default()
    };
    let l = Ledger::init_with(&dir, opts).expect("init ledger");
    let streams = payloads.len();
    let name = |s: usize| format!("rollout/{s}");
    let before = syncs.load(Ordering::SeqCst);
    let secs = if threads == 1 {
        let mut heads: Vec<Option<Id>> = vec![None; streams];
        let t = Instant::now();
        let per = payloads[0].len();
        for i in 0..per {
            for (s, (head, mine)) in heads.iter_mut().zip(payloads).enumerate() {
                let ev = NewEvent::new("model.finished", 1, mine[i].clone());
                *head = Some(l.append(&name(s), *head, ev).expect("append"));
            }
        }
        t.elapsed().as_secs_f64()
    } else {
        assert_eq!(threads, streams, "one thread per stream");
        let start = std::sync::Barrier::new(streams + 1);
        let t = std::thread::scope(|sc| {
            for (s, mine) in payloads.iter().enumerate() {
                let (l, start, name) = (&l, &start, &name);
                sc.spawn(move || {
                    let stream = name(s);
                    let mut head = None;
                    start.wait();
                    for p in mine {
                        let ev = NewEvent::new("model.finished", 1, p.clone());
                        head = Some(l.append(&stream, head, ev).expect("append"));
                    }
                });
            }
            start.wait();
            // Leaving the scope joins every committer.
            Instant::now()
        });
        t.elapsed().as_secs_f64()
    };
    let fsyncs = syncs.load(Ordering::SeqCst) - before;
    // Every batch is there, in order.
    for (s, mine) in payloads.iter().enumerate() {
        let head = l.head(&name(s)).expect("head").expect("stream exists");
        let ev = l.get_event(&head).expect("head event");
        assert_eq!(ev.seq as usize + 1, mine.len(), "stream {s}");
    }
    close_ledger(l);
    (secs, fsyncs)
}

fn bench_concurrent(cfg: &Cfg, lex: &Lex, rows: &mut Vec<Row>) {
    let (threads, per) = (cfg.conc_threads, cfg.conc_batches);
    let n = threads * per;
    let payloads: Vec<Vec<Vec<u8>>> = (0..threads)
        .map(|s| (0..per).map(|i| small_payload(lex, s, i)).collect())
        .collect();
    println!(
        "\n== concurrent: {threads} threads x {per} batches of one {}-byte event, distinct streams, {} reps ==",
        payloads[0][0].len(),
        cfg.reps
    );
    let mut fsyncs_conc = Vec::new();
    let mut fsyncs_one = Vec::new();
    let (conc, one) = alternate(
        cfg.reps,
        || {
            let (secs, f) = run_concurrent(&payloads, threads);
            fsyncs_conc.push(f as f64 / n as f64);
            n as f64 / secs
        },
        || {
            let (secs, f) = run_concurrent(&payloads, 1);
            fsyncs_one.push(f as f64 / n as f64);
            n as f64 / secs
        },
    );
    rows.push(report(
        "concurrent",
        format!("{threads} threads x {per} one-event batches vs 1 thread ({n} batches)"),
        Unit::BatchesPerSec,
        &conc,
        "1 thread",
        &one,
        None,
        format!(
            "Ledger::append of a 300 B event per batch, durable on return; {threads} threads, each its own stream, vs the same batches from one thread (round-robin over the streams)"
        ),
    ));
    rows.push(report(
        "concurrent",
        format!("fsyncs per batch, {threads} threads vs 1 thread"),
        Unit::FsyncsPerBatch,
        &fsyncs_conc,
        "1 thread",
        &fsyncs_one,
        None,
        "sync_data calls counted by a file layer around the OS's, per batch committed".into(),
    ));
}

// ---------------------------------------------------------------------------

/// What runs under `cargo test`: every code path in miniature, with the
/// correctness checks, and no measurements. Needs no git.
fn smoke_test() {
    let t = Instant::now();
    let lex = Lex::new(SEED_LEX, 500);
    let payloads: Vec<Vec<u8>> = (0..50)
        .map(|i| event_payload(&lex, SEED_APPEND, i))
        .collect();
    assert!(payloads.iter().all(|p| (64..=2048).contains(&p.len())));
    let run = run_ledger_append(&payloads, 10, true);
    let st = run.stats.expect("stats were asked for");
    assert_eq!(st.by_kind.get("event").map(|k| k.count), Some(50));
    assert!(run.layout.segments > 0 && run.layout.index > 0);
    assert!(run.layout.total > run.layout.segments + run.layout.index);
    let (_, sled_bytes) = run_sled_append(&payloads[..5], 1, true);
    assert!(sled_bytes > 0);
    let (_, sled_bytes) = run_sled_append(&payloads, 10, false);
    assert!(sled_bytes > 0);

    // Concurrent small commits: every batch lands; one thread syncs once per
    // batch, several share syncs (at most one per batch).
    let small: Vec<Vec<Vec<u8>>> = (0..4)
        .map(|s| (0..5).map(|i| small_payload(&lex, s, i)).collect())
        .collect();
    assert!(small.iter().flatten().all(|p| p.len() == 300));
    let (_, one) = run_concurrent(&small, 1);
    assert_eq!(one, 20);
    let (_, conc) = run_concurrent(&small, 4);
    assert!((1..=20).contains(&conc), "{conc} fsyncs");

    let system = system_prompt(&lex);
    let tools = tools_json();
    let convs: Vec<Vec<Value>> = (0..2)
        .map(|c| gen_conversation(&lex, &system, c, 4))
        .collect();
    let (_, gz, raw) = run_jsonl(&convs, &tools, 4);
    assert!(gz > 0 && gz < raw);
    let (_, layout) = run_ledger_conv(&convs, &tools, 4, true);
    assert!(layout.segments > 0);

    // Snapshots: `mass snapshot` in its own process prints the tree id the
    // in-process snapshot computes.
    let bin = mass_bin();
    let tmp = tempdir("smoke");
    let ws = gen_workspace(&tmp.path().join("w"), &lex, 0.02);
    mutate(&ws, &lex, 1);
    let proc_dir = tmp.path().join("l-proc");
    run_mass(&bin, &proc_dir, &["init".as_ref()]);
    let printed = run_mass(&bin, &proc_dir, &["snapshot".as_ref(), ws.root.as_os_str()]);
    let ld = Ledger::init(&tmp.path().join("l")).expect("init ledger");
    let tree = ld.snapshot_dir(&ws.root).expect("snapshot_dir");
    assert_eq!(printed.trim(), tree.to_hex());
    assert!(ld.get_tree(&tree).expect("tree").content_bytes() > 0);
    let inproc = close_ledger(ld);
    wait_closed(&proc_dir);
    let proc = ledger_layout(&proc_dir);
    assert!(proc.segments > 0 && inproc.segments > 0);
    assert_eq!(pack_bytes(&tmp.path().join("no-git")), 0);

    // Scan: both stores clean, same counts; the CLI agrees; damage is caught
    // by the baseline.
    let n = 300;
    let (ldir, sdir) = (tmp.path().join("scan-l"), tmp.path().join("scan-s"));
    build_scan_stores(&lex, n, &ldir, &sdir);
    {
        let l = Ledger::open_with(&ldir, ledger::Options::default()).expect("open ledger");
        let r = l.verify(&schema_check).expect("verify");
        assert!(r.is_clean(), "{:?}", r.problems);
        assert_eq!(r.events, n as u64);
        close_ledger(l);
    }
    let out = run_mass(&bin, &ldir, &["verify".as_ref(), "--json".as_ref()]);
    let v: Value = serde_json::from_str(&out).expect("`mass verify --json` output");
    assert_eq!(v["clean"], json!(true));
    let db = open_sled(&sdir);
    for index in [true, false] {
        let r = sled_verify(&db, index);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.events, n as u64);
    }
    let log = sled_tree(&db, SLED_LOG);
    let k = 7u64.to_be_bytes();
    let mut v = log.get(k).expect("get").expect("event 7").to_vec();
    let env_len = u32::from_le_bytes([v[32], v[33], v[34], v[35]]) as usize;
    v[36 + env_len / 2] ^= 1; // inside the envelope

    log.insert(k, v).expect("insert");
    assert!(!sled_verify(&db, true).problems.is_empty());
    assert!(!sled_verify(&db, false).problems.is_empty());
    drop(log);
    close_sled(db, &sdir);
    println!(
        "ledger bench smoke test passed in {} (measure with `cargo bench --bench ledger -- --quick`)",
        fmt_val(Unit::Secs, t.elapsed().as_secs_f64())
    );
}

fn main() {
    if let Ok(kind) = std::env::var(CHILD_ENV) {
        child_main(&kind);
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs bench
    // targets without it (in the unoptimised test profile). There, only a tiny
    // smoke check runs, and no results are written.
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
    println!(
        "mass ledger benchmarks: {} mode, {} reps, benchmarks: {}",
        cfg.mode.name(),
        cfg.reps,
        cfg.names.join(", ")
    );
    let started = Instant::now();
    let lex = Lex::new(SEED_LEX, 6000);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for name in cfg.names.clone() {
        let t = Instant::now();
        match name {
            "append" => bench_append(&cfg, &lex, &mut rows, &mut notes),
            "snapshots" => bench_snapshots(&cfg, &lex, &mut rows),
            "conversations" => bench_conversations(&cfg, &lex, &mut rows),
            "scan" => bench_scan(&cfg, &lex, &mut rows),
            "concurrent" => bench_concurrent(&cfg, &lex, &mut rows),
            _ => unreachable!("names are validated"),
        }
        println!(
            "  ({name} took {})",
            fmt_val(Unit::Secs, t.elapsed().as_secs_f64())
        );
    }
    print_summary(&cfg, &rows);
    let path = write_json(&cfg, &rows, &notes);
    println!(
        "\nwrote {} (total {})",
        path.display(),
        fmt_val(Unit::Secs, started.elapsed().as_secs_f64())
    );
    if cfg.strict && rows.iter().any(|r| r.pass() == Some(false)) {
        std::process::exit(1);
    }
}
