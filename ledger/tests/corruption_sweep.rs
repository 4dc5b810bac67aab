//! Exhaustive damage sweep of ledger format 2, checked against an oracle
//! computed apart from the implementation.
//!
//! Three small ledgers are built (a `mass demo`-like one with blobs, two
//! workspace snapshots, events on several streams, a batch moving two
//! streams, a fork and a ref deletion; one spanning three segments under
//! `segment_max = 4096`, written by two writer sessions; one with blob and
//! tree deltas). The oracle parses their segment files per FORMAT.md (this
//! file's own parser, not the crate's): every record's byte range, type,
//! object id, batch, delta base and (for ref updates) the ref operation the
//! fixture performed. For a byte flipped at (segment, offset) with a mask, a
//! record is *intact* if the byte lies outside it.
//!
//! For each flip, each operation runs on its own copy of the damaged ledger
//! (read-only operations run on a working copy flipped in place and flipped
//! back, after checking that they changed no file at all):
//! `open_read_only` (+ every read, `verify`), a writer open
//! (`open_reporting`), `repair` and `reindex`, each writer followed by a
//! batch that stores every blob and tree again (dedup must rewrite exactly
//! what is not intact) and by a read-only open; with `index/` and
//! `WATERMARK` present, `index/` removed, `WATERMARK` removed, or both
//! removed. Asserted for every run:
//!
//! 1. no panic;
//! 2. every object whose record is intact (and, for a delta, whose base's
//!    record is intact) reads back byte-identical (`raw_object`, and
//!    `get_meta` for events), except what FORMAT.md says cannot be known to
//!    have been committed (the one exception is documented at
//!    [`Expect::tail`]); after the test stored every blob and tree again,
//!    every blob and tree reads;
//! 3. no read returns bytes that differ from the oracle, no object is
//!    located anywhere but its oracle record (or, once stored again, past
//!    the old end of the log), and no id outside the oracle is indexed;
//! 4. no segment file shrinks or changes a byte (a writer may add a new
//!    segment file, and the test's own batch may append);
//! 5. refs are the oracle's, or the replay of the intact ref updates;
//! 6. every message that calls something a tail says it is "not known to
//!    have been acknowledged", no intact committed record is called a tail
//!    or listed as damage, a scan that covers the damaged record reports
//!    it, `verify` names it, and every listed range has its quarantine copy.
//!
//! Tests:
//! - `sweep_demo`, `sweep_three_segments`, `sweep_deltas` (CI): every byte
//!   of every segment with mask 0x01 through read-only opens with index/ and
//!   WATERMARK and with neither (`verify` on one of the two, alternating),
//!   plus a structural, seeded sample (every record's magic, lengths, id,
//!   header check, a body byte, trailer; every byte of each segment's last
//!   commit marker; header bytes) with masks 0x80 and 0xff through a
//!   read-only open without index/ and two writer operations each, rotating.
//!   `SWEEP_SEED` changes the sample. Each prints
//!   `sweep FIXTURE: N flips, M intact records checked, 0 wrong reads, ...`.
//! - `full_sweep_*` (`#[ignore]`): every byte x 0x01, 0x80, 0xff x all nine
//!   operations: `cargo test -p ledger --test corruption_sweep --
//!   --ignored --nocapture` (measured in a debug build on a shared 2-core
//!   machine: 8 minutes for demo, 22 for segments, 36 for deltas; the
//!   three run in parallel in 36 minutes).
//! - Part B: flips in `index/*.idx` and `WATERMARK` (never trusted, nothing
//!   lost) and in `FORMAT` (the version line may refuse; the salt line must
//!   cost nothing: FORMAT.md keeps the salt in every segment header too).
//! - `both_header_copies_damaged_cost_nothing_but_the_header`.
//! - `evidence_keeps_a_batch_whose_marker_is_damaged_*`: the same flips with
//!   `Unprotected::no_evidence` lose the batch the protected run keeps.
//! - Smallest reproductions of what the sweep found, which fail until the
//!   implementation is fixed: the intact last batch lost when the marker
//!   before it is damaged, a FORMAT salt digit changed into another digit,
//!   a tree stored again whose record check fails. And one that pins the
//!   reason given for damage in a batch that later batches follow.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

use ledger::format::{
    FORMAT_VERSION, HEADER_BLOCK_LEN, RECORD_HEADER_LEN, RECORD_MAGIC, RECORD_TRAILER_LEN,
    SEGMENT_HEADER_LEN, SEGMENT_MAGIC,
};
use ledger::{
    DamageKind, Id, Ledger, LedgerError, Meta, NewEvent, ObjLoc, ObjectKind, Options,
    RecoveryReport, Tree, Unprotected,
};

/// What FORMAT.md says of bytes nothing shows were committed.
const TAIL_PHRASE: &str = "not known to have been acknowledged";

// ---------------------------------------------------------------------------
// Scratch space, files, randomness

/// A scratch directory, in /dev/shm when there is one (the sweep makes many
/// small copies and fsyncs; a RAM disk keeps that from dominating).
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(t) = tempfile::Builder::new()
            .prefix("ledger-sweep-")
            .tempdir_in(shm)
        {
            return t;
        }
    }
    tempfile::Builder::new()
        .prefix("ledger-sweep-")
        .tempdir()
        .expect("creating a temporary directory")
}

struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn seed() -> u64 {
    std::env::var("SWEEP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED)
}

fn seg_path(dir: &Path, seg: u32) -> PathBuf {
    dir.join("segments").join(format!("{seg:08}.seg"))
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn flip_file(path: &Path, pos: u64, mask: u8) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("opening {} to flip byte {pos}: {e}", path.display()));
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, pos)
        .unwrap_or_else(|e| panic!("reading byte {pos} of {}: {e}", path.display()));
    f.write_all_at(&[b[0] ^ mask], pos)
        .unwrap_or_else(|e| panic!("writing byte {pos} of {}: {e}", path.display()));
}

/// Every segment file of a ledger, by number.
fn segments(dir: &Path) -> BTreeMap<u32, Vec<u8>> {
    let mut out = BTreeMap::new();
    let sd = dir.join("segments");
    for e in fs::read_dir(&sd).unwrap_or_else(|e| panic!("listing {}: {e}", sd.display())) {
        let p = e.expect("directory entry").path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(n) = name
            .strip_suffix(".seg")
            .and_then(|s| s.parse::<u32>().ok())
        {
            out.insert(n, read(&p));
        }
    }
    out
}

/// Every file under `dir` (relative path -> bytes), LOCK excepted.
fn all_files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).expect("under root").to_path_buf();
            if rel == Path::new("LOCK") {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.insert(rel, read(&p));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Which derived files a copy keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// `index/` and `WATERMARK` as the writer left them.
    Full,
    /// `index/` removed (the watermark is the evidence of the log's end).
    NoIndex,
    /// `WATERMARK` removed (the index tables are the evidence).
    NoWatermark,
    /// Both removed: only commit markers and segment headers say what was
    /// committed.
    Bare,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Full => "index+watermark",
            Variant::NoIndex => "no index/",
            Variant::NoWatermark => "no WATERMARK",
            Variant::Bare => "no index/ and no WATERMARK",
        }
    }
    fn keeps(self, top: &str) -> bool {
        match top {
            "LOCK" => false,
            "index" => matches!(self, Variant::Full | Variant::NoWatermark),
            "WATERMARK" => matches!(self, Variant::Full | Variant::NoIndex),
            _ => true,
        }
    }
    /// True when an index table or the watermark covers the whole log.
    fn evidence(self) -> bool {
        self != Variant::Bare
    }
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap_or_else(|e| panic!("creating {}: {e}", to.display()));
    for e in fs::read_dir(from).unwrap_or_else(|e| panic!("listing {}: {e}", from.display())) {
        let p = e.expect("directory entry").path();
        let dest = to.join(p.file_name().expect("file name"));
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            fs::copy(&p, &dest)
                .unwrap_or_else(|e| panic!("copying {} to {}: {e}", p.display(), dest.display()));
        }
    }
}

/// Copies a ledger keeping the derived files `v` keeps.
fn copy_variant(from: &Path, to: &Path, v: Variant) {
    fs::create_dir_all(to).unwrap_or_else(|e| panic!("creating {}: {e}", to.display()));
    for e in fs::read_dir(from).unwrap_or_else(|e| panic!("listing {}: {e}", from.display())) {
        let p = e.expect("directory entry").path();
        let name = p
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        if !v.keeps(&name) {
            continue;
        }
        if p.is_dir() {
            copy_dir(&p, &to.join(&name));
        } else {
            fs::copy(&p, to.join(&name)).unwrap_or_else(|e| panic!("copying {}: {e}", p.display()));
        }
    }
}

// ---------------------------------------------------------------------------
// Fixtures. Each returns, per commit, the ref updates it wrote (one per ref
// name, in first-appearance order, with the batch's last value: FORMAT.md's
// operation log), so the oracle knows what every ref-update record says.

type RefOps = Vec<Vec<(String, Option<Id>)>>;

fn json_msg(role: &str, content: &str) -> Vec<u8> {
    format!("{{\"role\":\"{role}\",\"content\":\"{content}\"}}").into_bytes()
}

fn ok<T>(what: &str, r: Result<T, LedgerError>) -> T {
    r.unwrap_or_else(|e| panic!("fixture: {what}: {e}"))
}

/// Like `mass demo`: a note, a workspace snapshot, an orchestrator and a
/// subagent conversation (blobs per message, metadata), a final snapshot,
/// a batch moving two streams, a fork, a ref deletion, a last batch.
fn build_demo(dir: &Path) -> RefOps {
    let l = ok("init", Ledger::init(dir));
    let mut ops: RefOps = Vec::new();
    let ws = scratch();
    let w = ws.path();
    fs::create_dir_all(w.join("data")).expect("workspace");
    let mut rng = Rng::new(7);
    let prices: String = (0..40)
        .map(|i| {
            format!(
                "2024-01-{:02},{}.{:02}\n",
                i % 28 + 1,
                100 + rng.below(50),
                rng.below(100)
            )
        })
        .collect();
    fs::write(w.join("data/prices.csv"), prices).expect("workspace");
    fs::write(
        w.join("backtest.py"),
        "import csv\nprint('sharpe')\n".repeat(6),
    )
    .expect("workspace");
    fs::write(w.join("README.md"), b"# demo workspace\n").expect("workspace");
    let (run, orch, sub) = ("demo/1", "demo/1/orchestrator", "demo/1/subagent-1");

    let note = ok(
        "note",
        l.append(
            run,
            None,
            NewEvent::new(
                "note",
                1,
                b"scripted demo: fixed messages, no model".to_vec(),
            ),
        ),
    );
    ops.push(vec![(run.into(), Some(note))]);
    let initial = ok("snapshot", l.snapshot_dir(w));
    ops.push(vec![]);
    let snap = ok(
        "snapshot event",
        l.append(
            run,
            Some(note),
            NewEvent::new("workspace.snapshot", 1, b"initial".to_vec()).with_refs(vec![initial]),
        ),
    );
    ops.push(vec![(run.into(), Some(snap))]);

    let mut b = l.batch();
    let m1 = ok(
        "blob",
        b.put_blob(&json_msg(
            "system",
            "You are the orchestrator of a research team.",
        )),
    );
    let m2 = ok(
        "blob",
        b.put_blob(&json_msg(
            "user",
            "Compute the Sharpe ratio without look-ahead.",
        )),
    );
    let r1 = ok(
        "blob",
        b.put_blob(&json_msg("assistant", "delegate: backtest with lag 1")),
    );
    let call1 = ok(
        "call1",
        b.append(
            orch,
            None,
            NewEvent::new("model.call", 1, b"orchestrator call 1".to_vec())
                .with_refs(vec![m1, m2, r1])
                .with_meta("latency_ms", "812"),
        ),
    );
    ok("commit", b.commit());
    ops.push(vec![(orch.into(), Some(call1))]);

    let mut b = l.batch();
    let s1 = ok(
        "blob",
        b.put_blob(&json_msg("system", "You are the analyst.")),
    );
    let s2 = ok(
        "blob",
        b.put_blob(&json_msg(
            "assistant",
            "Sharpe 0.84 (python3 backtest.py --lag 1).",
        )),
    );
    let sub_call = ok(
        "sub call",
        b.append(
            sub,
            None,
            NewEvent::new("model.call", 1, b"subagent call".to_vec())
                .with_refs(vec![s1, s2])
                .with_meta("latency_ms", "433"),
        ),
    );
    ok("commit", b.commit());
    ops.push(vec![(sub.into(), Some(sub_call))]);

    let mut b = l.batch();
    let t = ok("blob", b.put_blob(&json_msg("tool", "Sharpe 0.84")));
    let call2 = ok(
        "call2",
        b.append(
            orch,
            Some(call1),
            NewEvent::new("model.call", 1, b"orchestrator call 2".to_vec())
                .with_refs(vec![t])
                .with_parents(vec![sub_call]),
        ),
    );
    ok("commit", b.commit());
    ops.push(vec![(orch.into(), Some(call2))]);

    fs::write(
        w.join("report.md"),
        "# Result\n\nSharpe ratio 0.84, positions lagged one day.\n",
    )
    .expect("workspace");
    let fin = ok("final snapshot", l.snapshot_dir(w));
    ops.push(vec![]);

    let mut b = l.batch();
    let end = ok(
        "final",
        b.append(
            run,
            Some(snap),
            NewEvent::new("workspace.snapshot", 1, b"final".to_vec())
                .with_refs(vec![fin])
                .with_parents(vec![call2]),
        ),
    );
    let done = ok(
        "done",
        b.append(
            orch,
            Some(call2),
            NewEvent::new("note", 1, b"orchestrator done".to_vec()),
        ),
    );
    ok("commit", b.commit());
    ops.push(vec![(run.into(), Some(end)), (orch.into(), Some(done))]);

    ok("fork", l.fork("demo/1/fork-of-call1", call1));
    ops.push(vec![("demo/1/fork-of-call1".into(), Some(call1))]);
    ok("fork", l.fork("demo/1/short-lived", note));
    ops.push(vec![("demo/1/short-lived".into(), Some(note))]);
    ok("delete", l.delete_ref("demo/1/short-lived", note));
    ops.push(vec![("demo/1/short-lived".into(), None)]);

    let mut b = l.batch();
    let last_blob = ok(
        "blob",
        b.put_blob(&json_msg("assistant", "a last reply in the last batch")),
    );
    let last = ok(
        "last",
        b.append(
            sub,
            Some(sub_call),
            NewEvent::new("model.call", 1, b"subagent call 2".to_vec()).with_refs(vec![last_blob]),
        ),
    );
    ok("commit", b.commit());
    ops.push(vec![(sub.into(), Some(last))]);
    ops
}

/// Three segments under `segment_max = 4096`, written by two writer
/// sessions: incompressible blobs and events on two streams.
fn build_segments(dir: &Path) -> RefOps {
    let opts = Options {
        segment_max: 4096,
        ..Default::default()
    };
    let mut ops: RefOps = Vec::new();
    let mut heads: [Option<Id>; 2] = [None, None];
    let mut rng = Rng::new(11);
    let mut l = ok("init", Ledger::init_with(dir, opts.clone()));
    for i in 0..11u32 {
        if i == 6 {
            drop(l);
            l = ok("reopen", Ledger::open_with(dir, opts.clone()));
        }
        let mut b = l.batch();
        let x = ok(
            "blob",
            b.put_blob(&rng.bytes(260 + (i as usize * 37) % 200)),
        );
        let y = ok("blob", b.put_blob(&rng.bytes(180)));
        let s = (i % 2) as usize;
        let name = format!("segments/stream-{s}");
        let ev = ok(
            "event",
            b.append(
                &name,
                heads[s],
                NewEvent::new("seg.step", 1, i.to_le_bytes().to_vec())
                    .with_refs(vec![x, y])
                    .with_meta("i", i.to_string()),
            ),
        );
        ok("commit", b.commit());
        heads[s] = Some(ev);
        ops.push(vec![(name, Some(ev))]);
    }
    drop(l);
    ops
}

/// Ten versions of a 4 KB text file (one line edited each time) in a
/// workspace of 14 more files, each snapshotted with an event naming the
/// tree: blob deltas and tree deltas.
fn build_deltas(dir: &Path) -> RefOps {
    let l = ok("init", Ledger::init(dir));
    let mut ops: RefOps = Vec::new();
    let ws = scratch();
    let w = ws.path();
    fs::create_dir_all(w.join("cfg")).expect("workspace");
    let words = [
        "ledger",
        "segment",
        "record",
        "commit",
        "marker",
        "salt",
        "index",
        "table",
        "delta",
        "base",
        "tree",
        "blob",
        "event",
        "stream",
        "fork",
        "tail",
        "quarantine",
        "repair",
    ];
    let mut rng = Rng::new(3);
    let mut lines: Vec<String> = (0..64)
        .map(|n| {
            let mut s = format!("{n:02}:");
            while s.len() < 63 {
                s.push(' ');
                s.push_str(words[rng.below(words.len() as u64) as usize]);
            }
            s.truncate(63);
            s
        })
        .collect();
    for f in 0..14 {
        fs::write(
            w.join(format!("cfg/setting-{f:02}.toml")),
            format!("[setting]\nname = \"setting-{f}\"\nvalue = {}\n", f * 17),
        )
        .expect("workspace");
    }
    let mut head = None;
    for v in 0..10u32 {
        if v > 0 {
            let n = (v as usize * 7) % lines.len();
            lines[n] = format!("{n:02}: edited in version {v} {}", "=".repeat(30));
        }
        fs::write(w.join("notes.txt"), lines.join("\n")).expect("workspace");
        let mut b = l.batch();
        let t = ok("snapshot", b.snapshot_dir(w));
        let ev = ok(
            "event",
            b.append(
                "deltas/main",
                head,
                NewEvent::new("workspace.snapshot", 1, v.to_le_bytes().to_vec()).with_refs(vec![t]),
            ),
        );
        ok("commit", b.commit());
        head = Some(ev);
        ops.push(vec![("deltas/main".into(), Some(ev))]);
    }
    ops
}

// ---------------------------------------------------------------------------
// The oracle: the segment files parsed per FORMAT.md.

#[derive(Debug, Clone)]
struct Rec {
    seg: u32,
    start: u64,
    end: u64,
    rtype: u8,
    flags: u8,
    /// Object records (types 1-3).
    id: Option<Id>,
    /// Global batch number (the n-th commit marker closes batch n).
    batch: usize,
    body: Vec<u8>,
}

/// Where an object is, ordinal aside (ordinals legitimately shift when a
/// scan steps over a damaged record).
type LocKey = (ObjectKind, u8, u32, u64, u32, u32, u32);

fn key(l: &ObjLoc) -> LocKey {
    (
        l.kind, l.flags, l.seg, l.offset, l.body_len, l.raw_len, l.meta_len,
    )
}

#[derive(Debug)]
struct Obj {
    kind: ObjectKind,
    raw: Vec<u8>,
    meta: Option<Meta>,
    rec: usize,
    /// A delta's base record.
    base: Option<usize>,
    loc: LocKey,
}

#[derive(Debug)]
struct RefUpd {
    rec: usize,
    name: String,
    new: Option<Id>,
}

struct Oracle {
    name: &'static str,
    /// The clean ledger as its writer left it (index/ and WATERMARK).
    dir: PathBuf,
    segs: BTreeMap<u32, Vec<u8>>,
    recs: Vec<Rec>,
    objs: BTreeMap<Id, Obj>,
    refs: BTreeMap<String, Id>,
    updates: Vec<RefUpd>,
    last_batch: usize,
    /// Where the last batch starts.
    last_batch_start: u64,
    _tmp: tempfile::TempDir,
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

/// Parses one segment file per FORMAT.md: the 128-byte header (the same
/// 64-byte block twice) and then records back to back.
fn parse_segment(name: &str, seg: u32, b: &[u8], batch: &mut usize, out: &mut Vec<Rec>) {
    let hl = HEADER_BLOCK_LEN;
    assert!(
        b.len() as u64 >= SEGMENT_HEADER_LEN,
        "{name}: segment {seg} shorter than its header"
    );
    assert_eq!(&b[..8], SEGMENT_MAGIC, "{name}: segment {seg} magic");
    assert_eq!(
        b[..hl],
        b[hl..2 * hl],
        "{name}: segment {seg}: header copies differ"
    );
    assert_eq!(
        u32_at(b, 8),
        FORMAT_VERSION,
        "{name}: segment {seg} version"
    );
    assert_eq!(u32_at(b, 12), seg, "{name}: segment {seg} number");
    let mut at = SEGMENT_HEADER_LEN as usize;
    while at < b.len() {
        assert_eq!(
            &b[at..at + 4],
            RECORD_MAGIC,
            "{name}: segment {seg}: no record at byte {at}"
        );
        let rtype = b[at + 4];
        let flags = b[at + 5];
        let body_len = u32_at(b, at + 8) as usize;
        let meta_len = u32_at(b, at + 12) as usize;
        let end = at + RECORD_HEADER_LEN + body_len + meta_len + RECORD_TRAILER_LEN;
        assert!(
            end <= b.len(),
            "{name}: segment {seg}: record at {at} runs past the end"
        );
        let id = (1..=3)
            .contains(&rtype)
            .then(|| Id(b[at + 20..at + 52].try_into().expect("32 bytes")));
        let body_at = at + RECORD_HEADER_LEN;
        out.push(Rec {
            seg,
            start: at as u64,
            end: end as u64,
            rtype,
            flags,
            id,
            batch: *batch,
            body: b[body_at..body_at + body_len].to_vec(),
        });
        if rtype == 5 {
            assert_eq!(body_len, 12, "{name}: commit marker body");
            *batch += 1;
        }
        at = end;
    }
    let last = out.last().expect("a segment with records");
    assert_eq!(
        (last.seg, last.rtype),
        (seg, 5),
        "{name}: segment {seg} does not end with a commit marker"
    );
}

fn replay<'a>(updates: impl Iterator<Item = &'a RefUpd>) -> BTreeMap<String, Id> {
    let mut refs = BTreeMap::new();
    for u in updates {
        match u.new {
            Some(id) => {
                refs.insert(u.name.clone(), id);
            }
            None => {
                refs.remove(&u.name);
            }
        }
    }
    refs
}

fn build(name: &'static str, f: fn(&Path) -> RefOps) -> Oracle {
    let tmp = scratch();
    let dir = tmp.path().join(name);
    let ops = f(&dir);
    let segs = segments(&dir);
    let mut recs = Vec::new();
    let mut batch = 0;
    for (&n, bytes) in &segs {
        parse_segment(name, n, bytes, &mut batch, &mut recs);
    }
    assert_eq!(batch, ops.len(), "{name}: one commit marker per commit");
    // Ref updates: the type-4 records of batch k are the fixture's ops of
    // commit k, in order.
    let mut updates = Vec::new();
    for (k, batch_ops) in ops.iter().enumerate() {
        let rs: Vec<usize> = (0..recs.len())
            .filter(|&i| recs[i].batch == k && recs[i].rtype == 4)
            .collect();
        assert_eq!(
            rs.len(),
            batch_ops.len(),
            "{name}: ref updates in batch {k}"
        );
        for (&i, (n, new)) in rs.iter().zip(batch_ops) {
            assert!(
                recs[i].body.windows(n.len()).any(|w| w == n.as_bytes()),
                "{name}: the ref update at byte {} does not name {n}",
                recs[i].start
            );
            if let Some(id) = new {
                assert!(
                    recs[i].body.windows(32).any(|w| w == id.0),
                    "{name}: the ref update at byte {} does not hold {id}",
                    recs[i].start
                );
            }
            updates.push(RefUpd {
                rec: i,
                name: n.clone(),
                new: *new,
            });
        }
    }
    let by_id: BTreeMap<Id, usize> = (0..recs.len())
        .filter_map(|i| recs[i].id.map(|id| (id, i)))
        .collect();
    assert_eq!(
        by_id.len(),
        recs.iter().filter(|r| r.id.is_some()).count(),
        "{name}: every object is stored once"
    );
    let l = Ledger::open_read_only(&dir).unwrap_or_else(|e| panic!("{name}: clean open: {e}"));
    assert!(
        l.recovery().damage.is_empty() && l.recovery().unread_tail == 0,
        "{name}: clean ledger reports {:?}",
        l.recovery()
    );
    let mut objs = BTreeMap::new();
    for (&id, &i) in &by_id {
        let r = &recs[i];
        let (kind, raw) = l
            .raw_object(&id)
            .unwrap_or_else(|e| panic!("{name}: clean read of {id}: {e}"));
        let loc = l
            .locate(&id)
            .unwrap_or_else(|e| panic!("{name}: locate {id}: {e}"))
            .unwrap_or_else(|| panic!("{name}: {id} not indexed"));
        assert_eq!(
            (loc.seg, loc.offset, loc.flags, kind as u8),
            (r.seg, r.start, r.flags, r.rtype),
            "{name}: the index and the parser disagree about {id}"
        );
        let base = (r.flags & 2 != 0).then(|| {
            let b = Id(r.body[..32].try_into().expect("delta base id"));
            *by_id
                .get(&b)
                .unwrap_or_else(|| panic!("{name}: delta {id}: base {b} not stored"))
        });
        let meta = (kind == ObjectKind::Event).then(|| {
            l.get_meta(&id)
                .unwrap_or_else(|e| panic!("{name}: meta of {id}: {e}"))
        });
        objs.insert(
            id,
            Obj {
                kind,
                raw,
                meta,
                rec: i,
                base,
                loc: key(&loc),
            },
        );
    }
    let mut indexed = 0;
    l.for_each_location(|_, _| indexed += 1)
        .expect("for_each_location");
    assert_eq!(indexed, objs.len(), "{name}: index entries");
    let refs: BTreeMap<String, Id> = l.refs().expect("refs").into_iter().collect();
    assert_eq!(
        refs,
        replay(updates.iter()),
        "{name}: refs are the replay of the ref updates"
    );
    drop(l);
    let last_marker = recs.len() - 1;
    let last_batch = recs[last_marker].batch;
    let last_batch_start = recs
        .iter()
        .find(|r| r.batch == last_batch)
        .map(|r| r.start)
        .expect("a last batch");
    Oracle {
        name,
        dir,
        segs,
        recs,
        objs,
        refs,
        updates,
        last_batch,
        last_batch_start,
        _tmp: tmp,
    }
}

impl Oracle {
    fn last_seg(&self) -> u32 {
        *self.segs.keys().last().expect("segments")
    }
    fn old_len(&self, seg: u32) -> Option<u64> {
        self.segs.get(&seg).map(|b| b.len() as u64)
    }
    /// A location past the end of the log as it was (where the test's own
    /// batch writes objects again).
    fn past_old_end(&self, l: &ObjLoc) -> bool {
        match self.old_len(l.seg) {
            Some(len) => l.offset >= len,
            None => l.seg > self.last_seg(),
        }
    }
    fn describe(&self, i: usize) -> String {
        let r = &self.recs[i];
        let what = match r.rtype {
            1 => "blob",
            2 => "tree",
            3 => "event",
            4 => "ref update",
            5 => "commit marker",
            _ => "?",
        };
        let id =
            r.id.map(|id| format!(" {}", id.short(16)))
                .unwrap_or_default();
        format!(
            "{what}{id} record [{}, {}) of segment {} (batch {}{})",
            r.start,
            r.end,
            r.seg,
            r.batch,
            if r.flags & 2 != 0 { ", delta" } else { "" }
        )
    }
}

// ---------------------------------------------------------------------------
// What a flip may cost.

#[derive(Debug, Clone, Copy)]
struct Flip {
    seg: u32,
    pos: u64,
    mask: u8,
}

/// What a flip may cost under FORMAT.md, given whether durable evidence
/// (an index table or the watermark) covers the whole log.
struct Expect {
    /// The record the flipped byte lies in (`None`: a segment header copy,
    /// which must cost nothing: the other copy is intact).
    hit: Option<usize>,
    /// EXCEPTION (FORMAT.md, "A batch with bad bytes" and "Tail"): with
    /// no index table and no watermark, a flip anywhere in the last batch of
    /// the last segment (one of its records, or its commit marker) leaves
    /// that batch with nothing after it that proves it committed: a batch
    /// holding bad bytes "counts as committed only if something later
    /// proves it ... Otherwise the whole batch, from its first byte, is part
    /// of the tail ... and none of it is read", and bytes after the last
    /// marker that closes a whole batch are a tail, "not known to have been
    /// acknowledged". Its intact records must then NOT be read (a batch is
    /// atomic). This is the only loss of intact records the spec allows: in
    /// a sealed segment the next segment's header proves the batch
    /// committed, and any index table or the watermark proves it too.
    /// `tail` is then (segment, start of the last batch, length to the end).
    tail: Option<(u32, u64, u64)>,
    /// Objects that must read back.
    readable: BTreeSet<Id>,
    /// Objects of the tail (which must not read back).
    tail_ids: BTreeSet<Id>,
    /// Refs as the replay of every intact, committed ref update.
    refs_replayed: BTreeMap<String, Id>,
}

fn expect(o: &Oracle, f: Flip, evidence: bool) -> Expect {
    let hit = o
        .recs
        .iter()
        .position(|r| r.seg == f.seg && r.start <= f.pos && f.pos < r.end);
    let tail_case = !evidence && hit.is_some_and(|i| o.recs[i].batch == o.last_batch);
    let lost = |i: usize| Some(i) == hit || (tail_case && o.recs[i].batch == o.last_batch);
    let readable = o
        .objs
        .iter()
        .filter(|(_, ob)| !lost(ob.rec) && ob.base.is_none_or(|b| !lost(b)))
        .map(|(id, _)| *id)
        .collect();
    let tail_ids = o
        .objs
        .iter()
        .filter(|(_, ob)| tail_case && o.recs[ob.rec].batch == o.last_batch)
        .map(|(id, _)| *id)
        .collect();
    let refs_replayed = replay(o.updates.iter().filter(|u| !lost(u.rec)));
    let last = o.last_seg();
    let tail = tail_case.then(|| {
        let len = o.old_len(last).expect("last segment") - o.last_batch_start;
        (last, o.last_batch_start, len)
    });
    Expect {
        hit,
        tail,
        readable,
        tail_ids,
        refs_replayed,
    }
}

// ---------------------------------------------------------------------------
// Tally of violations.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A read returned bytes (or a location, or an id) the oracle does not have.
    Wrong,
    /// An intact object did not read back.
    Lost,
    /// A segment file shrank or changed.
    Shortened,
    Panic,
    /// Something intact called a tail, or a tail read / applied.
    Tail,
    /// Refs neither the oracle's nor the replay of the intact updates.
    Refs,
    /// An operation failed that should have worked.
    Error,
    /// A message calls something a tail without saying it is not known to
    /// have been acknowledged, or a damage listing covers intact records.
    Message,
    /// `verify` did not name the damaged record.
    Silent,
    /// A quarantine copy missing or not holding the listed bytes.
    Quarantine,
}

#[derive(Default)]
struct Tally {
    flips: u64,
    ops: u64,
    intact_checked: u64,
    counts: BTreeMap<String, u64>,
    failures: Vec<String>,
    /// The flip being run, and every flip with a violation (with how many).
    current: String,
    failed_flips: BTreeMap<String, u64>,
    /// Not a violation of the sweep's rules, counted for the engineer:
    /// reads of an object whose record is damaged (its trailer or, for an
    /// event, its metadata) that returned the right bytes. FORMAT.md says
    /// such a read "fails with `Corruption` naming the record".
    damaged_but_read: u64,
    /// Scratch root, replaced by `<tmp>` in messages before they are checked.
    root: String,
}

impl Tally {
    fn start(&mut self, label: String) {
        self.flips += 1;
        self.current = label;
    }
    fn bad(&mut self, kind: Kind, msg: String) {
        *self.counts.entry(format!("{kind:?}")).or_default() += 1;
        let n = self.failed_flips.entry(self.current.clone()).or_default();
        *n += 1;
        // The first violations of the first flips that have any.
        if *n <= 3 && self.failures.len() < 60 {
            self.failures.push(format!("[{kind:?}] {msg}"));
        }
    }
    fn count(&self, kind: Kind) -> u64 {
        self.counts.get(&format!("{kind:?}")).copied().unwrap_or(0)
    }
    /// Rule 6 for one message.
    fn message(&mut self, ctx: &str, text: &str) {
        let t = text.replace(&self.root, "<tmp>");
        if t.to_lowercase().contains("tail") && !t.contains(TAIL_PHRASE) {
            self.bad(
                Kind::Message,
                format!("{ctx}: a message calls something a tail without saying it is {TAIL_PHRASE:?}: {t}"),
            );
        }
    }
    fn summary(&self, name: &str, secs: f64) -> String {
        format!(
            "sweep {name}: {} flips ({} operations), {} intact records checked, {} wrong reads, {} shortened segments, {} panics, {} intact objects lost, {} tail violations, {} ref mismatches, {} failed operations, {} bad messages, {} silent verifies, {} quarantine mismatches; {} reads of a damaged record returned its (right) bytes ({secs:.1}s)",
            self.flips,
            self.ops,
            self.intact_checked,
            self.count(Kind::Wrong),
            self.count(Kind::Shortened),
            self.count(Kind::Panic),
            self.count(Kind::Lost),
            self.count(Kind::Tail),
            self.count(Kind::Refs),
            self.count(Kind::Error),
            self.count(Kind::Message),
            self.count(Kind::Silent),
            self.count(Kind::Quarantine),
            self.damaged_but_read,
        )
    }
    fn assert_clean(&self, name: &str, secs: f64) {
        let line = self.summary(name, secs);
        eprintln!("{line}");
        if !self.failures.is_empty() {
            let flips = compact(self.failed_flips.keys());
            eprintln!("{name}: flips with violations: {}", flips.join("; "));
            panic!(
                "{line}\n{} flips with violations: {}\nfirst violations:\n{}",
                self.failed_flips.len(),
                flips.join("; "),
                self.failures.join("\n")
            );
        }
    }
}

/// Flip labels "segment S byte P mask M" grouped by (S, M) with
/// consecutive bytes merged: "segment 1 bytes 1327-1334 mask 0x01".
fn compact<'a>(labels: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut groups: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    let mut other = Vec::new();
    for l in labels {
        let w: Vec<&str> = l.split(' ').collect();
        match (w.as_slice(), w.get(3).and_then(|p| p.parse::<u64>().ok())) {
            (["segment", s, "byte", _, "mask", m], Some(p)) => groups
                .entry((s.to_string(), m.to_string()))
                .or_default()
                .push(p),
            _ => other.push(l.clone()),
        }
    }
    let mut out = Vec::new();
    for ((s, m), mut ps) in groups {
        ps.sort_unstable();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for p in ps {
            match ranges.last_mut() {
                Some(r) if r.1 + 1 == p => r.1 = p,
                _ => ranges.push((p, p)),
            }
        }
        let r: Vec<String> = ranges
            .iter()
            .map(|(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect();
        out.push(format!("segment {s} mask {m} bytes {}", r.join(",")));
    }
    out.extend(other);
    out
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(non-string panic)".into())
}

/// Runs `f`, turning a panic into a tallied violation.
fn guarded<T>(t: &mut Tally, ctx: &str, what: &str, f: impl FnOnce() -> T) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(p) => {
            t.bad(
                Kind::Panic,
                format!("{ctx}: {what} panicked: {}", panic_text(&*p)),
            );
            None
        }
    }
}

// ---------------------------------------------------------------------------
// The checks.

/// Rules 2, 3, 5 on an open ledger. `again`: objects the test stored again
/// after opening (they must read, and may sit past the old end of the log).
fn check_ledger(
    t: &mut Tally,
    o: &Oracle,
    e: &Expect,
    ctx: &str,
    l: &Ledger,
    again: &BTreeSet<Id>,
) {
    for (id, ob) in &o.objs {
        let must = e.readable.contains(id) || again.contains(id);
        let in_tail = e.tail_ids.contains(id) && !again.contains(id);
        let Some(r) = guarded(t, ctx, &format!("raw_object({id})"), || l.raw_object(id)) else {
            continue;
        };
        match r {
            Ok((kind, bytes)) => {
                if kind != ob.kind || bytes != ob.raw {
                    t.bad(
                        Kind::Wrong,
                        format!("{ctx}: raw_object({id}) returned {} {} bytes that are not the oracle's {} ({})", kind, bytes.len(), ob.kind, o.describe(ob.rec)),
                    );
                } else if in_tail {
                    t.bad(
                        Kind::Tail,
                        format!(
                            "{ctx}: {id} of the unacknowledged tail reads back ({})",
                            o.describe(ob.rec)
                        ),
                    );
                } else if Some(ob.rec) == e.hit && !again.contains(id) {
                    t.damaged_but_read += 1;
                }
            }
            Err(err) => {
                let text = err.to_string();
                t.message(ctx, &text);
                if must {
                    t.bad(
                        Kind::Lost,
                        format!("{ctx}: intact {} does not read: {text}", o.describe(ob.rec)),
                    );
                }
            }
        }
        if must {
            t.intact_checked += 1;
        }
        match guarded(t, ctx, &format!("locate({id})"), || l.locate(id)) {
            Some(Ok(Some(loc))) => {
                if key(&loc) != ob.loc && !(again.contains(id) && o.past_old_end(&loc)) {
                    t.bad(
                        Kind::Wrong,
                        format!(
                            "{ctx}: {id} is located at segment {} byte {}, its record is {}",
                            loc.seg,
                            loc.offset,
                            o.describe(ob.rec)
                        ),
                    );
                }
            }
            Some(Ok(None)) | None => {}
            Some(Err(err)) => t.bad(Kind::Error, format!("{ctx}: locate({id}): {err}")),
        }
        if ob.kind == ObjectKind::Event {
            match guarded(t, ctx, &format!("get_meta({id})"), || l.get_meta(id)) {
                Some(Ok(m)) if Some(&m) != ob.meta.as_ref() => {
                    t.bad(
                        Kind::Wrong,
                        format!(
                            "{ctx}: get_meta({id}) returned {m:?}, not the oracle's {:?}",
                            ob.meta
                        ),
                    );
                }
                Some(Ok(_)) => {}
                Some(Err(err)) => {
                    t.message(ctx, &err.to_string());
                    if e.readable.contains(id) {
                        t.bad(
                            Kind::Lost,
                            format!(
                                "{ctx}: metadata of intact {} does not read: {err}",
                                o.describe(ob.rec)
                            ),
                        );
                    }
                }
                None => {}
            }
        }
    }
    // Nothing outside the oracle is indexed, nothing at a new place.
    let mut entries = Vec::new();
    if guarded(t, ctx, "for_each_location", || {
        l.for_each_location(|id, loc| entries.push((id, loc)))
    })
    .is_some()
    {
        for (id, loc) in entries {
            match o.objs.get(&id) {
                None => t.bad(Kind::Wrong, format!("{ctx}: the index lists {id}, which the ledger never stored (segment {} byte {})", loc.seg, loc.offset)),
                Some(ob) if key(&loc) != ob.loc && !(again.contains(&id) && o.past_old_end(&loc)) => t.bad(
                    Kind::Wrong,
                    format!("{ctx}: the index lists {id} at segment {} byte {}, its record is {}", loc.seg, loc.offset, o.describe(ob.rec)),
                ),
                Some(_) => {}
            }
        }
    }
    match guarded(t, ctx, "refs", || l.refs()) {
        Some(Ok(refs)) => {
            let refs: BTreeMap<String, Id> = refs.into_iter().collect();
            let ok = if e.tail.is_some() {
                refs == e.refs_replayed
            } else {
                refs == o.refs || refs == e.refs_replayed
            };
            if !ok {
                t.bad(
                    Kind::Refs,
                    format!(
                        "{ctx}: refs {refs:?}\n   oracle {:?}\n   replay of intact updates {:?}",
                        o.refs, e.refs_replayed
                    ),
                );
            }
        }
        Some(Err(err)) => t.bad(Kind::Error, format!("{ctx}: refs(): {err}")),
        None => {}
    }
}

/// Rule 6 on a recovery report: tails only where the spec allows them,
/// damage only inside the hit record.
fn check_report(
    t: &mut Tally,
    o: &Oracle,
    e: &Expect,
    ctx: &str,
    r: &RecoveryReport,
    listed_tail_ok: bool,
) {
    if let Some(why) = &r.log_behind_index {
        t.bad(
            Kind::Error,
            format!("{ctx}: log_behind_index reported though no segment is short: {why}"),
        );
    }
    for s in &r.tails {
        if e.tail != Some((s.segment, s.offset, s.len)) {
            t.bad(
                Kind::Tail,
                format!("{ctx}: tail set aside at segment {} byte {} ({} bytes); allowed: {:?} (hit: {})", s.segment, s.offset, s.len, e.tail, e.hit.map(|i| o.describe(i)).unwrap_or("segment header".into())),
            );
        }
    }
    if r.unread_tail > 0 && e.tail.map(|x| x.2) != Some(r.unread_tail) {
        t.bad(
            Kind::Tail,
            format!(
                "{ctx}: read-only open reports an unread tail of {} bytes; allowed: {:?} (hit: {})",
                r.unread_tail,
                e.tail,
                e.hit
                    .map(|i| o.describe(i))
                    .unwrap_or("segment header".into())
            ),
        );
    }
    if !listed_tail_ok && e.tail.is_some() && r.unread_tail == 0 && r.tails.is_empty() {
        t.bad(
            Kind::Tail,
            format!(
                "{ctx}: the last batch is a tail ({:?}) but the report says nothing of it: {r:?}",
                e.tail
            ),
        );
    }
    for d in &r.damage {
        check_listed(
            t,
            o,
            e,
            ctx,
            d.segment,
            d.offset,
            d.len,
            d.kind == DamageKind::Tail,
            &d.reason,
        );
    }
    if let Some(why) = &r.index_rebuilt {
        t.message(ctx, why);
    }
}

/// A scan that covered the damaged record must report it (FORMAT.md: bad
/// bytes there are "listed, stepped over"); only the tail exception may
/// instead report an unread tail or set the batch aside.
fn check_reported(t: &mut Tally, o: &Oracle, e: &Expect, ctx: &str, r: &RecoveryReport) {
    let Some(i) = e.hit else { return };
    if e.tail.is_some() {
        return;
    }
    let h = &o.recs[i];
    let named = r
        .damage
        .iter()
        .any(|d| d.segment == h.seg && d.offset < h.end && h.start < d.offset + d.len.max(1));
    if !named {
        t.bad(
            Kind::Silent,
            format!(
                "{ctx}: the scan covered the damaged {} but its report does not list it: {:?}",
                o.describe(i),
                r.damage
            ),
        );
    }
}

/// One listed or reported range.
#[allow(clippy::too_many_arguments)]
fn check_listed(
    t: &mut Tally,
    o: &Oracle,
    e: &Expect,
    ctx: &str,
    seg: u32,
    off: u64,
    len: u64,
    tail: bool,
    reason: &str,
) {
    t.message(ctx, reason);
    if tail {
        if !reason.contains(TAIL_PHRASE) {
            t.bad(
                Kind::Message,
                format!("{ctx}: a tail's reason does not say {TAIL_PHRASE:?}: {reason}"),
            );
        }
        if e.tail != Some((seg, off, len)) {
            t.bad(Kind::Tail, format!("{ctx}: segment {seg} [{off}, +{len}) is called a tail; allowed: {:?}: {reason}", e.tail));
        }
        return;
    }
    let inside = e.hit.is_some_and(|i| {
        let h = &o.recs[i];
        h.seg == seg && h.start <= off && off + len <= h.end
    });
    if !inside {
        t.bad(
            Kind::Message,
            format!("{ctx}: damage listed at segment {seg} [{off}, +{len}) ({reason}) outside the damaged record ({})", e.hit.map(|i| o.describe(i)).unwrap_or("segment header copy".into())),
        );
    }
}

/// `quarantine/damaged.jsonl`, read with a small hand parser (the crate's
/// test dependencies have no JSON parser).
fn listed_ranges(dir: &Path) -> Vec<(u32, u64, u64, String, String)> {
    let Ok(text) = fs::read_to_string(dir.join("quarantine").join("damaged.jsonl")) else {
        return Vec::new();
    };
    fn num(line: &str, field: &str) -> u64 {
        let k = format!("\"{field}\":");
        let at = line.find(&k).map(|i| i + k.len()).unwrap_or(line.len());
        line[at..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect::<String>()
            .parse()
            .unwrap_or(u64::MAX)
    }
    fn string(line: &str, field: &str) -> Option<String> {
        let k = format!("\"{field}\":\"");
        let at = line.find(&k)? + k.len();
        let mut out = String::new();
        let mut esc = false;
        for c in line[at..].chars() {
            match (esc, c) {
                (true, c) => {
                    out.push(c);
                    esc = false;
                }
                (false, '\\') => esc = true,
                (false, '"') => return Some(out),
                (false, c) => out.push(c),
            }
        }
        Some(out)
    }
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            (
                num(l, "segment") as u32,
                num(l, "offset"),
                num(l, "len"),
                string(l, "kind").unwrap_or_else(|| "damage".into()),
                string(l, "reason").unwrap_or_default(),
            )
        })
        .collect()
}

fn check_listed_file(t: &mut Tally, o: &Oracle, e: &Expect, ctx: &str, dir: &Path) {
    for (seg, off, len, kind, reason) in listed_ranges(dir) {
        check_listed(
            t,
            o,
            e,
            &format!("{ctx} (damaged.jsonl)"),
            seg,
            off,
            len,
            kind == "tail",
            &reason,
        );
    }
}

/// `verify` on a read-only ledger: no error, and the damaged record named
/// (or set aside by an earlier writer, or reported as the unread tail).
fn check_verify(t: &mut Tally, o: &Oracle, e: &Expect, ctx: &str, l: &Ledger) {
    let Some(r) = guarded(t, ctx, "verify", || l.verify(&|_| Ok(()))) else {
        return;
    };
    let v = match r {
        Ok(v) => v,
        Err(err) => {
            t.bad(Kind::Error, format!("{ctx}: verify failed: {err}"));
            return;
        }
    };
    for p in &v.problems {
        t.message(ctx, &p.to_string());
    }
    let Some(i) = e.hit else { return };
    let h = &o.recs[i];
    let at = format!("at byte {}:", h.start);
    let prefix = h.id.map(|id| hex16(&id));
    let named = v.problems.iter().any(|p| {
        (p.what.contains(&at) && p.what.contains(&format!("{:08}.seg", h.seg)))
            || (h.id.is_some() && p.id == h.id)
            || prefix.as_ref().is_some_and(|x| p.what.contains(x.as_str()))
    });
    let tail_reported = e.tail.is_some() && l.recovery().unread_tail > 0;
    if !named && v.set_aside == 0 && !tail_reported {
        t.bad(
            Kind::Silent,
            format!(
                "{ctx}: verify does not name the damaged {} (problems: {:?})",
                o.describe(i),
                v.problems
            ),
        );
    }
}

fn hex16(id: &Id) -> String {
    id.0[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Rule 4: existing segments unchanged (`appended`: the last one may have
/// grown by the test's own batch).
fn check_segments(
    t: &mut Tally,
    ctx: &str,
    before: &BTreeMap<u32, Vec<u8>>,
    dir: &Path,
    appended: bool,
) {
    let now = segments(dir);
    let last = *before.keys().last().expect("segments");
    for (n, b) in before {
        match now.get(n) {
            None => t.bad(Kind::Shortened, format!("{ctx}: segment {n} is gone")),
            Some(a) if a.len() < b.len() => t.bad(
                Kind::Shortened,
                format!(
                    "{ctx}: segment {n} shrank from {} to {} bytes",
                    b.len(),
                    a.len()
                ),
            ),
            Some(a) if (appended && *n == last && a.starts_with(b)) || a == b => {}
            Some(a) => {
                let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(b.len());
                t.bad(
                    Kind::Shortened,
                    format!("{ctx}: segment {n} changed (first difference at byte {at})"),
                );
            }
        }
    }
    for n in now.keys().filter(|n| !before.contains_key(n)) {
        if *n <= last {
            t.bad(
                Kind::Shortened,
                format!("{ctx}: a segment {n} appeared below the last one"),
            );
        }
    }
}

/// FORMAT.md: every listed range has a quarantine copy of its bytes (at
/// most 64 MiB), `quarantine/SSSSSSSS-OFFSET-KIND-HASH.bin`.
fn check_quarantine(
    t: &mut Tally,
    ctx: &str,
    dir: &Path,
    segs: &BTreeMap<u32, Vec<u8>>,
    r: &RecoveryReport,
) {
    let range = |seg: u32, off: u64, len: u64| -> Option<Vec<u8>> {
        let b = segs.get(&seg)?;
        let end = (off + len).min(b.len() as u64);
        Some(b.get(off as usize..end as usize)?.to_vec())
    };
    for s in &r.tails {
        match (fs::read(dir.join(&s.file)), range(s.segment, s.offset, s.len)) {
            (Ok(q), Some(want)) if q == want => {}
            (q, _) => t.bad(
                Kind::Quarantine,
                format!("{ctx}: the quarantine copy {} of the tail at segment {} byte {} does not hold its {} bytes ({:?})", s.file.display(), s.segment, s.offset, s.len, q.map(|q| q.len())),
            ),
        }
    }
    let qdir = dir.join("quarantine");
    for d in &r.damage {
        let kind = match d.kind {
            DamageKind::Damage => "damaged",
            DamageKind::Header => "header",
            DamageKind::Tail => "tail",
        };
        let prefix = format!("{:08}-{}-{kind}-", d.segment, d.offset);
        let want = range(d.segment, d.offset, d.len);
        let found = fs::read_dir(&qdir)
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                e.file_name().to_string_lossy().starts_with(&prefix)
                    && fs::read(e.path()).ok() == want
            });
        if !found {
            t.bad(
                Kind::Quarantine,
                format!(
                    "{ctx}: no quarantine copy {prefix}*.bin holding the {} bytes of {:?}",
                    d.len, d
                ),
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The operations.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// `open_read_only`, every read, `verify`.
    ReadOnly(Variant),
    /// The same without `verify` (the cheap pass alternates the two).
    ReadOnlyNoVerify(Variant),
    Writer(Variant),
    Repair(Variant),
    Reindex(Variant),
}

impl Op {
    fn name(self) -> String {
        match self {
            Op::ReadOnly(v) => format!("open_read_only ({})", v.name()),
            Op::ReadOnlyNoVerify(v) => format!("open_read_only without verify ({})", v.name()),
            Op::Writer(v) => format!("open_reporting ({})", v.name()),
            Op::Repair(v) => format!("repair ({})", v.name()),
            Op::Reindex(v) => format!("reindex ({})", v.name()),
        }
    }
    fn variant(self) -> Variant {
        match self {
            Op::ReadOnly(v)
            | Op::ReadOnlyNoVerify(v)
            | Op::Writer(v)
            | Op::Repair(v)
            | Op::Reindex(v) => v,
        }
    }
}

const ALL_OPS: [Op; 9] = [
    Op::ReadOnly(Variant::Full),
    Op::ReadOnly(Variant::NoIndex),
    Op::ReadOnly(Variant::Bare),
    Op::Writer(Variant::Full),
    Op::Writer(Variant::NoIndex),
    Op::Writer(Variant::NoWatermark),
    Op::Writer(Variant::Bare),
    Op::Repair(Variant::Full),
    Op::Reindex(Variant::Bare),
];

/// Working copies, one per variant, for the read-only operations.
struct Work {
    root: tempfile::TempDir,
    copies: BTreeMap<String, (PathBuf, BTreeMap<PathBuf, Vec<u8>>)>,
    n: u64,
}

impl Work {
    fn new(o: &Oracle) -> Work {
        let root = scratch();
        let mut copies = BTreeMap::new();
        for v in [
            Variant::Full,
            Variant::NoIndex,
            Variant::NoWatermark,
            Variant::Bare,
        ] {
            let d = root.path().join(format!("ro-{v:?}"));
            copy_variant(&o.dir, &d, v);
            let files = all_files(&d);
            copies.insert(format!("{v:?}"), (d, files));
        }
        Work { root, copies, n: 0 }
    }
    fn fresh(&mut self, o: &Oracle, v: Variant) -> PathBuf {
        self.n += 1;
        let d = self.root.path().join(format!("case-{}", self.n));
        copy_variant(&o.dir, &d, v);
        d
    }
}

fn run_op(t: &mut Tally, o: &Oracle, w: &mut Work, f: Flip, op: Op) {
    t.ops += 1;
    let v = op.variant();
    let e = expect(o, f, v.evidence());
    let ctx = format!(
        "{}: flip {:#04x} at segment {} byte {} [{}], {}",
        o.name,
        f.mask,
        f.seg,
        f.pos,
        e.hit
            .map(|i| o.describe(i))
            .unwrap_or("segment header".into()),
        op.name()
    );
    match op {
        Op::ReadOnly(v) | Op::ReadOnlyNoVerify(v) => {
            let (dir, clean) = w.copies[&format!("{v:?}")].clone();
            let path = seg_path(&dir, f.seg);
            flip_file(&path, f.pos, f.mask);
            let verify = matches!(op, Op::ReadOnly(_));
            read_only(
                t,
                o,
                &e,
                &ctx,
                &dir,
                &BTreeSet::new(),
                true,
                verify,
                !v.keeps("index"),
            );
            let now = all_files(&dir);
            flip_file(&path, f.pos, f.mask);
            let rel = path.strip_prefix(&dir).expect("under dir").to_path_buf();
            let mut want = clean.clone();
            if let Some(b) = want.get_mut(&rel) {
                b[f.pos as usize] ^= f.mask;
            }
            if now != want {
                let changed: Vec<_> = now
                    .keys()
                    .chain(want.keys())
                    .filter(|k| now.get(*k) != want.get(*k))
                    .collect();
                t.bad(
                    Kind::Shortened,
                    format!("{ctx}: a read-only open changed files: {changed:?}"),
                );
            }
            if all_files(&dir) != clean {
                panic!("{ctx}: could not restore the working copy");
            }
        }
        Op::Writer(_) | Op::Repair(_) | Op::Reindex(_) => {
            let dir = w.fresh(o, v);
            flip_file(&seg_path(&dir, f.seg), f.pos, f.mask);
            writer(t, o, &e, &ctx, &dir, op);
            let _ = fs::remove_dir_all(&dir);
        }
    }
}

/// A read-only open with every check. `fresh`: the first open after the
/// flip (so its report must show the tail, if there is one; after a writer
/// listed it, it need not); `verify`: run `verify` too; `scans`: the open
/// scans the damaged range (no index/), so its report must list it.
#[allow(clippy::too_many_arguments)]
fn read_only(
    t: &mut Tally,
    o: &Oracle,
    e: &Expect,
    ctx: &str,
    dir: &Path,
    again: &BTreeSet<Id>,
    fresh: bool,
    verify: bool,
    scans: bool,
) {
    let Some(r) = guarded(t, ctx, "open_read_only", || Ledger::open_read_only(dir)) else {
        return;
    };
    match r {
        Err(err) => {
            t.message(ctx, &err.to_string());
            t.bad(Kind::Error, format!("{ctx}: open_read_only failed: {err}"));
        }
        Ok(l) => {
            check_report(t, o, e, ctx, l.recovery(), !fresh);
            if fresh && scans {
                check_reported(t, o, e, ctx, l.recovery());
            }
            check_ledger(t, o, e, ctx, &l, again);
            if verify {
                check_verify(t, o, e, ctx, &l);
            }
        }
    }
}

/// Stores every blob and tree of the oracle again in one batch (blobs
/// first, so trees' links resolve): dedup must write again exactly what
/// does not read back intact.
fn store_again(l: &Ledger, o: &Oracle) -> Result<BTreeSet<Id>, LedgerError> {
    let mut b = l.batch();
    let mut out = BTreeSet::new();
    let mut order: Vec<(&Id, &Obj)> = o.objs.iter().collect();
    order.sort_by_key(|(_, ob)| (ob.kind != ObjectKind::Blob, ob.rec));
    for (id, ob) in order {
        match ob.kind {
            ObjectKind::Blob => {
                b.put_blob(&ob.raw)?;
            }
            ObjectKind::Tree => {
                b.put_tree(&Tree::from_bytes(id, &ob.raw)?)?;
            }
            ObjectKind::Event => continue,
        }
        out.insert(*id);
    }
    b.commit()?;
    Ok(out)
}

fn writer(t: &mut Tally, o: &Oracle, e: &Expect, ctx: &str, dir: &Path, op: Op) {
    let before = segments(dir);
    let opened = guarded(t, ctx, "open", || match op {
        Op::Writer(_) => Ledger::open_reporting(dir),
        Op::Repair(_) => Ledger::repair(dir),
        Op::Reindex(_) => Ledger::reindex(dir),
        Op::ReadOnly(_) | Op::ReadOnlyNoVerify(_) => unreachable!("not a writer"),
    });
    let mut again = BTreeSet::new();
    match opened {
        None => {}
        Some(Err(err)) => {
            t.message(ctx, &err.to_string());
            t.bad(Kind::Error, format!("{ctx}: failed: {err}"));
        }
        Some(Ok((l, report))) => {
            check_segments(t, ctx, &before, dir, false);
            check_report(t, o, e, ctx, &report, false);
            check_quarantine(t, ctx, dir, &before, &report);
            let scans = match op {
                Op::Writer(v) => !v.keeps("index"),
                _ => true,
            };
            if scans {
                check_reported(t, o, e, ctx, &report);
            }
            if report.new_segment.is_some() != e.tail.is_some() {
                t.bad(
                    Kind::Tail,
                    format!(
                        "{ctx}: new segment {:?}, tail expected {:?}",
                        report.new_segment, e.tail
                    ),
                );
            }
            check_ledger(t, o, e, ctx, &l, &BTreeSet::new());
            match guarded(t, ctx, "storing every blob and tree again", || {
                store_again(&l, o)
            }) {
                Some(Ok(ids)) => again = ids,
                Some(Err(err)) => t.bad(
                    Kind::Error,
                    format!("{ctx}: storing every blob and tree again failed: {err}"),
                ),
                None => {}
            }
            check_ledger(
                t,
                o,
                e,
                &format!("{ctx}, after storing blobs and trees again"),
                &l,
                &again,
            );
            guarded(t, ctx, "closing", move || drop(l));
        }
    }
    check_segments(t, ctx, &before, dir, true);
    check_listed_file(t, o, e, ctx, dir);
    let ctx2 = format!("{ctx}, then open_read_only");
    read_only(t, o, e, &ctx2, dir, &again, false, true, false);
    check_segments(t, &ctx2, &before, dir, true);
}

// ---------------------------------------------------------------------------
// Plans.

/// Every byte of every segment with one mask through `ops` (`ops(pos)`).
fn every_byte(o: &Oracle, mask: u8, ops: &dyn Fn(u64) -> Vec<Op>) -> Vec<(Flip, Vec<Op>)> {
    let mut out = Vec::new();
    for (&seg, b) in &o.segs {
        for pos in 0..b.len() as u64 {
            out.push((Flip { seg, pos, mask }, ops(pos)));
        }
    }
    out
}

/// The cheap pass: read-only opens with index/ and WATERMARK and with
/// neither, `verify` on one of the two, alternating by byte.
fn cheap(pos: u64) -> Vec<Op> {
    if pos.is_multiple_of(2) {
        vec![
            Op::ReadOnly(Variant::Full),
            Op::ReadOnlyNoVerify(Variant::Bare),
        ]
    } else {
        vec![
            Op::ReadOnlyNoVerify(Variant::Full),
            Op::ReadOnly(Variant::Bare),
        ]
    }
}

/// A structural sample: per record its magic, length, header check, a
/// body byte and its last byte; every byte of each segment's last commit
/// marker; a few header bytes. Masks 0x80 and 0xff alternate; each flip
/// goes through one read-only open without index and two of the costly
/// operations, rotating, so each costly operation meets each record kind.
fn sample(o: &Oracle, seed: u64) -> Vec<(Flip, Vec<Op>)> {
    let mut rng = Rng::new(seed ^ o.recs.len() as u64);
    let mut at: BTreeSet<(u32, u64)> = BTreeSet::new();
    for r in &o.recs {
        let body = r.end - r.start - (RECORD_HEADER_LEN + RECORD_TRAILER_LEN) as u64;
        at.insert((r.seg, r.start + rng.below(4)));
        at.insert((r.seg, r.start + 8 + rng.below(4)));
        at.insert((r.seg, r.start + 20 + rng.below(32)));
        at.insert((r.seg, r.start + 52 + rng.below(8)));
        if body > 0 {
            at.insert((r.seg, r.start + RECORD_HEADER_LEN as u64 + rng.below(body)));
        }
        at.insert((r.seg, r.end - 1 - rng.below(8)));
    }
    for &seg in o.segs.keys() {
        let m = o
            .recs
            .iter()
            .rfind(|r| r.seg == seg)
            .expect("a last marker");
        for p in m.start..m.end {
            at.insert((seg, p));
        }
        for _ in 0..6 {
            at.insert((seg, rng.below(SEGMENT_HEADER_LEN)));
        }
    }
    let costly = [
        Op::Writer(Variant::Full),
        Op::Writer(Variant::Bare),
        Op::Repair(Variant::Full),
        Op::Writer(Variant::NoIndex),
        Op::Reindex(Variant::Bare),
        Op::Writer(Variant::NoWatermark),
    ];
    at.into_iter()
        .enumerate()
        .map(|(i, (seg, pos))| {
            let mask = [0x80, 0xff][i % 2];
            let ops = vec![
                Op::ReadOnly(Variant::NoIndex),
                costly[(2 * i) % costly.len()],
                // Never the same as the first: offset 1..=5.
                costly[(2 * i + 1 + (i / costly.len()) % (costly.len() - 1)) % costly.len()],
            ];
            (Flip { seg, pos, mask }, ops)
        })
        .collect()
}

fn run_plan(o: &Oracle, plan: Vec<(Flip, Vec<Op>)>) -> Tally {
    let mut w = Work::new(o);
    let mut t = Tally {
        root: w.root.path().display().to_string(),
        ..Default::default()
    };
    for (f, ops) in plan {
        t.start(format!(
            "segment {} byte {} mask {:#04x}",
            f.seg, f.pos, f.mask
        ));
        for op in ops {
            run_op(&mut t, o, &mut w, f, op);
        }
    }
    t
}

fn sanity(o: &Oracle) {
    let kinds: BTreeSet<u8> = o.recs.iter().map(|r| r.rtype).collect();
    assert!(
        kinds.is_superset(&[3, 4, 5].into_iter().collect()),
        "{}: record types {kinds:?}",
        o.name
    );
}

fn ci_sweep(name: &'static str, f: fn(&Path) -> RefOps, check: impl Fn(&Oracle)) {
    let t0 = Instant::now();
    let o = build(name, f);
    sanity(&o);
    check(&o);
    let mut plan = every_byte(&o, 0x01, &cheap);
    plan.extend(sample(&o, seed()));
    let t = run_plan(&o, plan);
    t.assert_clean(name, t0.elapsed().as_secs_f64());
}

fn full_sweep(name: &'static str, f: fn(&Path) -> RefOps) {
    let t0 = Instant::now();
    let o = build(name, f);
    let mut plan = Vec::new();
    for mask in [0x01, 0x80, 0xff] {
        plan.extend(every_byte(&o, mask, &|_| ALL_OPS.to_vec()));
    }
    let t = run_plan(&o, plan);
    t.assert_clean(&format!("{name} (full)"), t0.elapsed().as_secs_f64());
}

fn check_demo(o: &Oracle) {
    assert!(
        o.refs.contains_key("demo/1/fork-of-call1"),
        "demo: the fork"
    );
    assert!(
        !o.refs.contains_key("demo/1/short-lived"),
        "demo: the deleted ref"
    );
    assert!(
        o.objs.values().any(|b| b.kind == ObjectKind::Tree),
        "demo: trees"
    );
    let streams: BTreeSet<&str> = o.updates.iter().map(|u| u.name.as_str()).collect();
    assert!(streams.len() >= 3, "demo: streams {streams:?}");
}

fn check_segments_fixture(o: &Oracle) {
    assert_eq!(
        o.segs.len(),
        3,
        "segments fixture: 3 segment files, got {}",
        o.segs.len()
    );
    assert!(
        fs::read_dir(o.dir.join("index"))
            .map(|d| d.count())
            .unwrap_or(0)
            >= 1,
        "segments fixture: index tables"
    );
}

fn check_deltas(o: &Oracle) {
    let delta = |k: ObjectKind| {
        o.objs
            .values()
            .filter(|b| b.kind == k && b.loc.1 & 2 != 0)
            .count()
    };
    assert!(
        delta(ObjectKind::Blob) >= 5,
        "deltas fixture: {} blob deltas",
        delta(ObjectKind::Blob)
    );
    assert!(
        delta(ObjectKind::Tree) >= 5,
        "deltas fixture: {} tree deltas",
        delta(ObjectKind::Tree)
    );
}

// ---------------------------------------------------------------------------
// Part B: flips in index tables, WATERMARK and FORMAT.

/// Nothing damaged in the log: everything must read, refs exactly.
fn expect_nothing(o: &Oracle) -> Expect {
    Expect {
        hit: None,
        tail: None,
        readable: o.objs.keys().copied().collect(),
        tail_ids: BTreeSet::new(),
        refs_replayed: o.refs.clone(),
    }
}

/// Flips byte `pos` of the derived file `rel` (index table, WATERMARK,
/// FORMAT) in a fresh copy and runs a read-only open and a writer open
/// (then a read-only open). `refusal_ok`: the file's first line may make
/// an open refuse with `UnsupportedFormat` (FORMAT's version line).
#[allow(clippy::too_many_arguments)]
fn derived_flip(
    t: &mut Tally,
    o: &Oracle,
    w: &mut Work,
    v: Variant,
    rel: &Path,
    pos: u64,
    mask: u8,
    refusal_ok: bool,
) {
    t.start(format!("{} byte {pos} mask {mask:#04x}", rel.display()));
    let e = expect_nothing(o);
    let refused =
        |err: &LedgerError| refusal_ok && matches!(err, LedgerError::UnsupportedFormat { .. });
    // Read-only.
    t.ops += 1;
    let ctx = format!(
        "{}: flip {mask:#04x} at byte {pos} of {} ({}), open_read_only",
        o.name,
        rel.display(),
        v.name()
    );
    let dir = w.fresh(o, v);
    flip_file(&dir.join(rel), pos, mask);
    let clean = segments(&dir);
    match guarded(t, &ctx, "open_read_only", || Ledger::open_read_only(&dir)) {
        Some(Ok(l)) => {
            check_report(t, o, &e, &ctx, l.recovery(), false);
            if !l.recovery().damage.is_empty() {
                t.bad(
                    Kind::Message,
                    format!(
                        "{ctx}: damage reported in an intact log: {:?}",
                        l.recovery().damage
                    ),
                );
            }
            check_ledger(t, o, &e, &ctx, &l, &BTreeSet::new());
        }
        Some(Err(err)) if refused(&err) => {}
        Some(Err(err)) => t.bad(Kind::Error, format!("{ctx}: failed: {err}")),
        None => {}
    }
    check_segments(t, &ctx, &clean, &dir, false);
    // Writer, then read-only.
    t.ops += 1;
    let ctx = format!(
        "{}: flip {mask:#04x} at byte {pos} of {} ({}), open_reporting",
        o.name,
        rel.display(),
        v.name()
    );
    let flipped = read(&dir.join(rel));
    let mut again = BTreeSet::new();
    match guarded(t, &ctx, "open_reporting", || Ledger::open_reporting(&dir)) {
        Some(Ok((l, report))) => {
            check_segments(t, &ctx, &clean, &dir, false);
            check_report(t, o, &e, &ctx, &report, false);
            if !report.damage.is_empty() || report.new_segment.is_some() {
                t.bad(
                    Kind::Message,
                    format!("{ctx}: damage or a new segment in an intact log: {report:?}"),
                );
            }
            check_ledger(t, o, &e, &ctx, &l, &BTreeSet::new());
            if rel.starts_with("index") && fs::read(dir.join(rel)).ok().as_ref() == Some(&flipped) {
                t.bad(Kind::Message, format!("{ctx}: the writer kept an index table that fails its checks (FORMAT.md: a writer removes them)"));
            }
            match guarded(t, &ctx, "storing blobs and trees again", || {
                store_again(&l, o)
            }) {
                Some(Ok(ids)) => again = ids,
                Some(Err(err)) => t.bad(Kind::Error, format!("{ctx}: storing again: {err}")),
                None => {}
            }
            guarded(t, &ctx, "closing", move || drop(l));
            let ctx2 = format!("{ctx}, then open_read_only");
            read_only(t, o, &e, &ctx2, &dir, &again, false, true, false);
        }
        Some(Err(err)) if refused(&err) => {}
        Some(Err(err)) => t.bad(Kind::Error, format!("{ctx}: failed: {err}")),
        None => {}
    }
    check_segments(t, &ctx, &clean, &dir, true);
    let _ = fs::remove_dir_all(&dir);
}

/// Which derived files `derived_sweep` damages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Derived {
    TablesAndWatermark,
    Format,
}

fn derived_sweep(name: &'static str, f: fn(&Path) -> RefOps, which: Derived) {
    let t0 = Instant::now();
    let o = build(name, f);
    let mut w = Work::new(&o);
    let mut t = Tally {
        root: w.root.path().display().to_string(),
        ..Default::default()
    };
    let mut rng = Rng::new(seed() ^ 0xB);
    // Index tables: the header, the footer (its checksum) and a sample of
    // the rest, three masks each.
    let mut tables: Vec<PathBuf> = fs::read_dir(o.dir.join("index"))
        .expect("index/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "idx"))
        .collect();
    tables.sort();
    assert!(!tables.is_empty(), "{name}: no index table");
    if which == Derived::Format {
        tables.clear();
    }
    for table in &tables {
        let rel = table.strip_prefix(&o.dir).expect("under dir").to_path_buf();
        let len = read(table).len() as u64;
        let mut at: BTreeSet<u64> = (0..72).step_by(3).collect();
        at.extend(len - 32..len);
        for _ in 0..40 {
            at.insert(rng.below(len));
        }
        for (i, pos) in at.into_iter().enumerate() {
            let mask = [0x01, 0x80, 0xff][i % 3];
            derived_flip(&mut t, &o, &mut w, Variant::Full, &rel, pos, mask, false);
        }
    }
    // WATERMARK, where it is the only evidence besides the log (no index).
    for pos in (0..32).filter(|_| which == Derived::TablesAndWatermark) {
        for mask in [0x01, 0x80, 0xff] {
            derived_flip(
                &mut t,
                &o,
                &mut w,
                Variant::NoIndex,
                Path::new("WATERMARK"),
                pos,
                mask,
                false,
            );
        }
    }
    // FORMAT: its version line may refuse (another version is named); its
    // salt line must not matter (FORMAT.md: the salt is in both copies of
    // every segment header too, "so any one of them gives it back").
    let format = read(&o.dir.join("FORMAT"));
    let first_line = format
        .iter()
        .position(|&b| b == b'\n')
        .expect("FORMAT has lines") as u64;
    for pos in (0..format.len() as u64).filter(|_| which == Derived::Format) {
        for mask in [0x01, 0x80, 0xff] {
            derived_flip(
                &mut t,
                &o,
                &mut w,
                Variant::Full,
                Path::new("FORMAT"),
                pos,
                mask,
                pos <= first_line,
            );
        }
    }
    let what = match which {
        Derived::TablesAndWatermark => "index tables, WATERMARK",
        Derived::Format => "FORMAT",
    };
    t.assert_clean(&format!("{name} ({what})"), t0.elapsed().as_secs_f64());
}

#[test]
fn flipped_index_tables_and_watermark_are_never_trusted_demo() {
    derived_sweep("demo", build_demo, Derived::TablesAndWatermark);
}

#[test]
fn flipped_index_tables_and_watermark_are_never_trusted_segments() {
    derived_sweep("segments", build_segments, Derived::TablesAndWatermark);
}

/// Every byte of FORMAT, three masks. Fails today: see
/// `a_format_salt_digit_changed_to_another_digit_loses_nothing`.
#[test]
fn a_flipped_format_file_never_loses_anything() {
    derived_sweep("demo", build_demo, Derived::Format);
}

/// The smallest reproduction of the FORMAT bug the sweep above finds. One
/// hex digit of FORMAT's salt line turned into another hex digit (bit 0 of
/// '0'..'9', 'b'..'e') still parses as a salt: a wrong one. FORMAT.md says
/// the salt is in FORMAT "and into both copies of every segment header, so
/// any one of them gives it back", and that a header copy counts only if it
/// names "the ledger's salt". The implementation takes FORMAT's salt
/// without comparing it with the (checksummed, unanimous) segment headers:
/// every header then "names another ledger's salt", every record fails its
/// check, nothing reads, and a writer lists every segment header as damaged
/// and starts a new segment under the wrong salt.
#[test]
fn a_format_salt_digit_changed_to_another_digit_loses_nothing() {
    let tmp = scratch();
    let dir = tmp.path().join("l");
    let l = Ledger::init(&dir).expect("init");
    let blob = l
        .put_blob(b"a blob before FORMAT is damaged")
        .expect("put_blob");
    let ev = l
        .append(
            "main",
            None,
            NewEvent::new("note", 1, b"x".to_vec()).with_refs(vec![blob]),
        )
        .expect("append");
    drop(l);
    let text = read(&dir.join("FORMAT"));
    let salt_at = text
        .windows(5)
        .position(|w| w == b"salt ")
        .expect("a salt line")
        + 5;
    // The first salt digit whose bit 0 flips to another hex digit.
    let pos = (salt_at..salt_at + 64)
        .find(|&i| (text[i] ^ 1).is_ascii_hexdigit() && !(text[i] ^ 1).is_ascii_uppercase())
        .expect("a digit") as u64;
    flip_file(&dir.join("FORMAT"), pos, 0x01);
    let ro = Ledger::open_read_only(&dir).expect("open_read_only with a damaged FORMAT salt line");
    let read_blob = ro.raw_object(&blob);
    assert!(
        read_blob.is_ok(),
        "FORMAT byte {pos} (salt digit) flipped with 0x01: the blob does not read: {:?}",
        read_blob.err().map(|e| e.to_string())
    );
    assert_eq!(
        ro.head("main").expect("head"),
        Some(ev),
        "FORMAT salt digit flipped: refs"
    );
    drop(ro);
    let (w, report) =
        Ledger::open_reporting(&dir).expect("writer open with a damaged FORMAT salt line");
    assert!(
        report.damage.is_empty() && report.new_segment.is_none(),
        "FORMAT salt digit flipped: the writer lists intact segments as damaged: {report:?}"
    );
    assert!(
        w.raw_object(&ev).is_ok(),
        "FORMAT salt digit flipped: the event does not read"
    );
}

/// The smallest reproduction of the data loss the sweep finds in every
/// fixture (e.g. demo: any byte of the commit marker of batch 10 of 12,
/// mask 0x01, read-only open / writer open / reindex with no index/ and no
/// WATERMARK). Two batches, each one blob; the first batch's commit marker
/// damaged; no index table and no watermark. The second (last) batch is
/// whole, its marker intact, and it starts after the damaged bytes: by
/// FORMAT.md it is committed ("Bytes are known to have been committed when
/// a valid commit marker follows them and its batch starts after them"),
/// and the tail is only what comes "after the last valid commit marker that
/// closes a whole batch". The scan instead counts the previous batch's
/// damaged marker as bad bytes of the last batch ("holds bad bytes"), holds
/// it, and, nothing following, reports it as an unread tail / sets it aside
/// in a new segment: an acknowledged batch is lost.
#[test]
fn a_damaged_marker_of_the_batch_before_does_not_make_the_last_batch_a_tail() {
    let tmp = scratch();
    let dir = tmp.path().join("l");
    let l = Ledger::init(&dir).expect("init");
    l.put_blob(b"the first batch").expect("put_blob");
    let last = l.put_blob(b"the last batch").expect("put_blob");
    let loc = l.locate(&last).expect("locate").expect("indexed");
    drop(l);
    fs::remove_dir_all(dir.join("index")).expect("removing index/");
    fs::remove_file(dir.join("WATERMARK")).expect("removing WATERMARK");
    // The first batch's marker is the 80 bytes before the last batch.
    let marker_len = (RECORD_HEADER_LEN + 12 + RECORD_TRAILER_LEN) as u64;
    let body = loc.offset - marker_len + RECORD_HEADER_LEN as u64;
    flip_file(&seg_path(&dir, loc.seg), body, 0x01);
    let ro = Ledger::open_read_only(&dir).expect("open_read_only");
    let unread = ro.recovery().unread_tail;
    let read_last = ro.get_blob(&last).map_err(|e| e.to_string());
    assert!(
        read_last.is_ok() && unread == 0,
        "first batch's commit marker damaged (segment {} byte {body}, mask 0x01), no index/ or WATERMARK: the intact last batch at byte {} is not read: {read_last:?}, unread tail {unread} bytes",
        loc.seg,
        loc.offset
    );
    drop(ro);
    let (w, report) = Ledger::open_reporting(&dir).expect("open_reporting");
    assert!(
        report.tails.is_empty() && report.new_segment.is_none(),
        "first batch's commit marker damaged: the writer sets the intact last batch aside as a tail: {report:?}"
    );
    assert!(
        w.get_blob(&last).is_ok(),
        "the last batch's blob does not read after a writer open"
    );
}

/// FORMAT.md, "Evidence": bytes are known to have been committed when "a
/// valid commit marker follows them and its batch starts after them" or an
/// index table or the watermark covers them. A damaged record in the first
/// of three batches, repaired with index/ and WATERMARK present, is proven
/// committed three times over; its listed reason must not say it only may
/// have been acknowledged (an earlier version of the scan said so of any
/// damage inside a batch its own intact marker closes).
#[test]
fn damage_in_a_batch_that_later_batches_follow_is_listed_as_committed() {
    let tmp = scratch();
    let dir = tmp.path().join("l");
    let l = Ledger::init(&dir).expect("init");
    let first = l.put_blob(b"a blob in the first batch").expect("put_blob");
    let mut head = None;
    for i in 0..2u8 {
        head = Some(
            l.append("main", head, NewEvent::new("note", 1, vec![i]))
                .expect("append"),
        );
    }
    let loc = l.locate(&first).expect("locate").expect("indexed");
    drop(l);
    flip_file(
        &seg_path(&dir, loc.seg),
        loc.offset + RECORD_HEADER_LEN as u64,
        0x01,
    );
    let (_, report) = Ledger::repair(&dir).expect("repair");
    assert_eq!(report.damage.len(), 1, "{report:?}");
    let reason = &report.damage[0].reason;
    assert!(
        !reason.contains("may have been acknowledged"),
        "a damaged record of the first of three batches (segment {} byte {}), index/ and WATERMARK present, repaired: the reason says it only may have been acknowledged: {reason}",
        loc.seg,
        loc.offset
    );
}

/// The smallest reproduction of the dedup bug the sweep finds (e.g. demo,
/// flip 0xff in the last byte of the first snapshot's tree record, writer
/// open with index/, then storing that tree again). A plainly stored tree
/// T, the latest plain one (the tree-delta base), whose record's trailer
/// (record check) is damaged while its header and body are intact; a later
/// tree D is a delta against T. A writer opens with index/ present and T is
/// stored again (`put_tree`, or a snapshot of the same workspace).
/// `backed(T)` rightly says T's record is not intact, so T is written again;
/// but the tree-delta base is read with `read_plain` (header check and
/// content hash only, no record check), which accepts T, so the new copy of
/// T is encoded as a *delta against T itself*. The index now points T at
/// that delta: T ("a delta base must be a plainly stored object") and every
/// delta against it (D, whose record is intact) stop reading, though both
/// read before the write. FORMAT.md: "Bases are never deltas themselves";
/// an object not backed "is written again (plainly when its base is
/// damaged), and the index points to the new copy".
#[test]
fn storing_again_a_tree_whose_record_check_fails_keeps_it_and_its_deltas_readable() {
    let tmp = scratch();
    let dir = tmp.path().join("l");
    let ws = scratch();
    fs::create_dir_all(ws.path().join("cfg")).expect("workspace");
    for f in 0..24 {
        fs::write(
            ws.path().join(format!("cfg/setting-{f:02}.toml")),
            format!("value = {f}\n"),
        )
        .expect("workspace");
    }
    let l = Ledger::init(&dir).expect("init");
    let t = l.snapshot_dir(ws.path()).expect("first snapshot");
    fs::write(ws.path().join("cfg/setting-03.toml"), "value = 333\n").expect("workspace");
    let d = l.snapshot_dir(ws.path()).expect("second snapshot");
    let tl = l.locate(&t).expect("locate").expect("T indexed");
    let dl = l.locate(&d).expect("locate").expect("D indexed");
    assert_eq!(tl.flags & 2, 0, "T is stored plainly");
    assert_ne!(dl.flags & 2, 0, "D is a delta (against T)");
    let (_, t_raw) = l.raw_object(&t).expect("read T");
    let (_, d_raw) = l.raw_object(&d).expect("read D");
    drop(l);
    // The last byte of T's record: its record check.
    let last = tl.offset
        + (RECORD_HEADER_LEN + RECORD_TRAILER_LEN) as u64
        + tl.body_len as u64
        + tl.meta_len as u64
        - 1;
    flip_file(&seg_path(&dir, tl.seg), last, 0xff);
    let l = Ledger::open(&dir).expect("writer open");
    assert_eq!(l.raw_object(&d).expect("D reads before").1, d_raw);
    l.put_tree(&Tree::from_bytes(&t, &t_raw).expect("T decodes"))
        .expect("storing T again");
    let now = l.locate(&t).expect("locate").expect("T indexed");
    let t_now = l.raw_object(&t).map(|x| x.1).map_err(|e| e.to_string());
    let d_now = l.raw_object(&d).map(|x| x.1).map_err(|e| e.to_string());
    assert!(
        now.flags & 2 == 0 && t_now.as_ref() == Ok(&t_raw) && d_now.as_ref() == Ok(&d_raw),
        "after storing T again (T's record check damaged at segment {} byte {last}, index present): T's new copy has flags {} at byte {}; T reads: {:?}; D reads: {:?}",
        tl.seg,
        now.flags,
        now.offset,
        t_now.map(|_| "ok"),
        d_now.map(|_| "ok"),
    );
}

// ---------------------------------------------------------------------------
// Both copies of a segment header damaged.

/// FORMAT.md: "With neither copy intact the header is listed (kind
/// `header`) and costs nothing else: records are checked with the salt from
/// `FORMAT` (or any other segment's header), and a writer whose last
/// segment's header is damaged starts a new segment." Single flips never
/// reach this (the other copy is intact), so the same byte of both copies is
/// flipped (magic, segment number, salt, `prev_end`, checksum), in each
/// segment of the three-segment fixture, through every operation.
#[test]
fn both_header_copies_damaged_cost_nothing_but_the_header() {
    let t0 = Instant::now();
    let o = build("segments", build_segments);
    let mut w = Work::new(&o);
    let mut t = Tally {
        root: w.root.path().display().to_string(),
        ..Default::default()
    };
    let e = expect_nothing(&o);
    let hl = HEADER_BLOCK_LEN as u64;
    for &seg in o.segs.keys() {
        for p in [0u64, 12, 20, 50, 60] {
            t.start(format!("segment {seg} header byte {p} in both copies"));
            for op in ALL_OPS {
                t.ops += 1;
                let v = op.variant();
                let ctx = format!(
                    "segments: byte {p} of both header copies of segment {seg} flipped (0xff), {}",
                    op.name()
                );
                let dir = w.fresh(&o, v);
                flip_file(&seg_path(&dir, seg), p, 0xff);
                flip_file(&seg_path(&dir, seg), hl + p, 0xff);
                let before = segments(&dir);
                let report = match op {
                    Op::ReadOnly(_) | Op::ReadOnlyNoVerify(_) => {
                        match guarded(&mut t, &ctx, "open_read_only", || {
                            Ledger::open_read_only(&dir)
                        }) {
                            Some(Ok(l)) => {
                                check_ledger(&mut t, &o, &e, &ctx, &l, &BTreeSet::new());
                                Some(l.recovery().clone())
                            }
                            Some(Err(err)) => {
                                t.bad(Kind::Error, format!("{ctx}: failed: {err}"));
                                None
                            }
                            None => None,
                        }
                    }
                    _ => {
                        let r = guarded(&mut t, &ctx, "open", || match op {
                            Op::Writer(_) => Ledger::open_reporting(&dir),
                            Op::Repair(_) => Ledger::repair(&dir),
                            _ => Ledger::reindex(&dir),
                        });
                        match r {
                            Some(Ok((l, report))) => {
                                check_segments(&mut t, &ctx, &before, &dir, false);
                                check_ledger(&mut t, &o, &e, &ctx, &l, &BTreeSet::new());
                                let last = seg == o.last_seg();
                                if report.new_segment.is_some() != last {
                                    t.bad(
                                        Kind::Error,
                                        format!(
                                            "{ctx}: new segment {:?} (FORMAT.md: a writer whose last segment's header is damaged starts a new one, and only then)",
                                            report.new_segment
                                        ),
                                    );
                                }
                                let again = match store_again(&l, &o) {
                                    Ok(ids) => ids,
                                    Err(err) => {
                                        t.bad(Kind::Error, format!("{ctx}: storing again: {err}"));
                                        BTreeSet::new()
                                    }
                                };
                                guarded(&mut t, &ctx, "closing", move || drop(l));
                                check_segments(&mut t, &ctx, &before, &dir, true);
                                let ctx2 = format!("{ctx}, then open_read_only");
                                match Ledger::open_read_only(&dir) {
                                    Ok(l) => check_ledger(&mut t, &o, &e, &ctx2, &l, &again),
                                    Err(err) => t.bad(Kind::Error, format!("{ctx2}: {err}")),
                                }
                                Some(report)
                            }
                            Some(Err(err)) => {
                                t.bad(Kind::Error, format!("{ctx}: failed: {err}"));
                                None
                            }
                            None => None,
                        }
                    }
                };
                if let Some(r) = report {
                    if !r.tails.is_empty() || r.unread_tail > 0 || r.log_behind_index.is_some() {
                        t.bad(
                            Kind::Tail,
                            format!("{ctx}: tails or a short log reported: {r:?}"),
                        );
                    }
                    for d in &r.damage {
                        t.message(&ctx, &d.reason);
                        if (d.segment, d.offset, d.len, d.kind)
                            != (seg, 0, SEGMENT_HEADER_LEN, DamageKind::Header)
                        {
                            t.bad(
                                Kind::Message,
                                format!("{ctx}: damage other than the header listed: {d:?}"),
                            );
                        }
                    }
                }
                let _ = fs::remove_dir_all(&dir);
            }
        }
    }
    t.assert_clean("segments (both header copies)", t0.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------
// The evidence switch: the same flips with `Unprotected::no_evidence`.

/// Objects of batch `batch` that do not read back.
fn unread_of_batch(o: &Oracle, l: &Ledger, batch: usize) -> usize {
    o.objs
        .iter()
        .filter(|(_, ob)| o.recs[ob.rec].batch == batch)
        .filter(|(id, ob)| l.raw_object(id).map(|(_, b)| b != ob.raw).unwrap_or(true))
        .count()
}

/// FORMAT.md's evidence (index tables, the watermark, the next segment's
/// header) is what keeps a segment's last batch when a byte of it is
/// damaged (its marker, or one of its records: a batch holding bad bytes is
/// committed only if something later proves it). For every byte of the last
/// batch of every segment (mask 0x01; and 0x80, 0xff on the commit marker):
/// with the evidence, every intact record of the batch reads (and every
/// check of the sweep holds); with `Unprotected::no_evidence` the same
/// damage loses the whole batch. Cases: a read-only open with only
/// WATERMARK (the last segment) or with neither (a sealed segment: the next
/// header is the evidence), and `repair` with index/ present (the tables)
/// on the marker's bytes and every 16th byte of the rest.
fn evidence_switch(name: &'static str, f: fn(&Path) -> RefOps) {
    let t0 = Instant::now();
    let o = build(name, f);
    let mut w = Work::new(&o);
    let mut t = Tally {
        root: w.root.path().display().to_string(),
        ..Default::default()
    };
    let off = Options {
        unprotected: Unprotected {
            no_evidence: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let (mut kept, mut lost_without) = (0u64, 0u64);
    for &seg in o.segs.keys() {
        let m = o.recs.iter().rposition(|r| r.seg == seg).expect("marker");
        let (marker, batch) = (o.recs[m].clone(), o.recs[m].batch);
        let batch_objs = o
            .objs
            .values()
            .filter(|ob| o.recs[ob.rec].batch == batch)
            .count();
        assert!(
            batch_objs > 0,
            "{name}: segment {seg}'s last batch holds objects"
        );
        let sealed = seg != o.last_seg();
        let batch_start = o
            .recs
            .iter()
            .find(|r| r.batch == batch)
            .map(|r| r.start)
            .expect("a batch");
        for pos in batch_start..marker.end {
            let in_marker = pos >= marker.start;
            let masks: &[u8] = if in_marker {
                &[0x01, 0x80, 0xff]
            } else {
                &[0x01]
            };
            for &mask in masks {
                let do_repair = if in_marker {
                    mask == 0xff
                } else {
                    (pos - batch_start).is_multiple_of(16)
                };
                t.start(format!("segment {seg} byte {pos} mask {mask:#04x}"));
                let f = Flip { seg, pos, mask };
                let variant = if sealed {
                    Variant::Bare
                } else {
                    Variant::NoIndex
                };
                // Protected: the full sweep's checks.
                run_op(&mut t, &o, &mut w, f, Op::ReadOnly(variant));
                // Unprotected: the batch is lost.
                let ctx = format!("{name}: flip {mask:#04x} at segment {seg} byte {pos} (last batch), no_evidence, open_read_only ({})", variant.name());
                let dir = w.fresh(&o, variant);
                flip_file(&seg_path(&dir, seg), pos, mask);
                t.ops += 1;
                match guarded(&mut t, &ctx, "open", || {
                    Ledger::open_read_only_with(&dir, off.clone())
                }) {
                    Some(Ok(l)) => {
                        let n = unread_of_batch(&o, &l, batch);
                        if n == batch_objs {
                            lost_without += 1;
                        } else {
                            t.bad(Kind::Error, format!("{ctx}: without evidence the batch should be lost, yet {} of its {batch_objs} objects read", batch_objs - n));
                        }
                    }
                    Some(Err(err)) => t.bad(Kind::Error, format!("{ctx}: {err}")),
                    None => {}
                }
                let _ = fs::remove_dir_all(&dir);
                if !do_repair {
                    continue;
                }
                // repair with index/ present, with and without evidence.
                run_op(&mut t, &o, &mut w, f, Op::Repair(Variant::Full));
                let ctx = format!("{name}: flip {mask:#04x} at segment {seg} byte {pos} (last batch), no_evidence, repair (index present)");
                let dir = w.fresh(&o, Variant::Full);
                flip_file(&seg_path(&dir, seg), pos, mask);
                t.ops += 1;
                match guarded(&mut t, &ctx, "repair", || {
                    Ledger::repair_with(&dir, off.clone())
                }) {
                    Some(Ok((l, _))) => {
                        let n = unread_of_batch(&o, &l, batch);
                        if n == batch_objs {
                            lost_without += 1;
                        } else {
                            t.bad(Kind::Error, format!("{ctx}: without evidence the batch should be lost, yet {} of its {batch_objs} objects read", batch_objs - n));
                        }
                    }
                    Some(Err(err)) => t.bad(Kind::Error, format!("{ctx}: {err}")),
                    None => {}
                }
                let _ = fs::remove_dir_all(&dir);
            }
            kept += 1;
        }
    }
    eprintln!("evidence switch {name}: {kept} bytes of segments' last batches; with evidence no intact record lost; without it the batch was lost {lost_without} times");
    t.assert_clean(
        &format!("{name} (evidence switch)"),
        t0.elapsed().as_secs_f64(),
    );
}

#[test]
fn evidence_keeps_a_batch_whose_marker_is_damaged_demo() {
    evidence_switch("demo", build_demo);
}

#[test]
fn evidence_keeps_a_batch_whose_marker_is_damaged_segments() {
    evidence_switch("segments", build_segments);
}

#[test]
fn sweep_demo() {
    ci_sweep("demo", build_demo, check_demo);
}

#[test]
fn sweep_three_segments() {
    ci_sweep("segments", build_segments, check_segments_fixture);
}

#[test]
fn sweep_deltas() {
    ci_sweep("deltas", build_deltas, check_deltas);
}

#[test]
#[ignore = "full sweep: every byte x 3 masks x 9 operations (tens of minutes)"]
fn full_sweep_demo() {
    full_sweep("demo", build_demo);
}

#[test]
#[ignore = "full sweep: every byte x 3 masks x 9 operations (tens of minutes)"]
fn full_sweep_three_segments() {
    full_sweep("segments", build_segments);
}

#[test]
#[ignore = "full sweep: every byte x 3 masks x 9 operations (tens of minutes)"]
fn full_sweep_deltas() {
    full_sweep("deltas", build_deltas);
}
