//! End-to-end tests of the `mass` binary: real processes, real files. Golden
//! output pins ids and text of deterministic commands.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn mass(ledger: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mass"))
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .env_remove("MASS_LEDGER")
        .output()
        .expect("run mass")
}

fn ok(ledger: &Path, args: &[&str]) -> String {
    let o = mass(ledger, args);
    assert!(
        o.status.success(),
        "mass {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn fresh() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("ledger");
    (d, l)
}

/// The demo writes fixed content, so its ids are fixed: this pins the whole
/// path from records through rkyv and BLAKE3 to the CLI's text.
#[test]
fn golden_demo_log() {
    let (_d, l) = fresh();
    ok(&l, &["init"]);
    ok(&l, &["demo"]);
    let log = ok(&l, &["log"]);
    assert_eq!(log, GOLDEN_LOG, "mass log output changed:\n{log}");
}

const GOLDEN_LOG: &str = concat!(
    "baf9ec586eae  workspace.snapshot     demo/1#2\n",
    "3407d2e8670c  model.call             demo/1/orchestrator#1\n",
    "e1ec8072cb0f  model.call             demo/1/subagent-1#0\n",
    "e4483e389104  model.call             demo/1/orchestrator#0\n",
    "b3a4d3f17830  workspace.snapshot     demo/1#1\n",
    "58cafc1c3665  note                   demo/1#0\n",
);

#[test]
fn log_json_has_ids_kinds_and_parents() {
    let (_d, l) = fresh();
    ok(&l, &["demo"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&l, &["log", "--json"])).unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 6);
    for e in arr {
        let id = e["id"].as_str().unwrap();
        assert_eq!(id.len(), 64);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(e["kind"].is_string());
        assert!(e["parents"].is_array());
        assert!(e["payload"].is_object(), "{e}");
    }
    // --kind and --limit filter; a stream log follows prev links.
    let calls: serde_json::Value = serde_json::from_str(&ok(
        &l,
        &["log", "--kind", "model.call", "--limit", "2", "--json"],
    ))
    .unwrap();
    assert_eq!(calls.as_array().unwrap().len(), 2);
    let stream = ok(&l, &["log", "demo/1/orchestrator"]);
    assert_eq!(stream.lines().count(), 2);
    assert!(stream
        .lines()
        .next()
        .unwrap()
        .contains("demo/1/orchestrator#1"));
}

#[test]
fn show_cat_refs_fork_with_abbreviated_ids() {
    let (_d, l) = fresh();
    ok(&l, &["demo"]);
    let v: serde_json::Value =
        serde_json::from_str(&ok(&l, &["log", "demo/1/orchestrator", "--json"])).unwrap();
    let head = v[0]["id"].as_str().unwrap().to_string();
    let shown = ok(&l, &["show", &head[..8]]);
    assert!(shown.starts_with(&format!("event   {head}")), "{shown}");
    assert!(shown.contains("kind    model.call v1"));
    // The response blob is readable with cat, byte for byte.
    let resp = v[0]["payload"]["response"].as_str().unwrap();
    let raw = ok(&l, &["cat", &resp[..10]]);
    let msg: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(msg["role"], "assistant");
    let refs = ok(&l, &["refs"]);
    assert!(refs.contains("demo/1/orchestrator"));
    let first = v[1]["id"].as_str().unwrap();
    ok(&l, &["fork", &first[..12], "--name", "experiments/alt"]);
    let refs: serde_json::Value = serde_json::from_str(&ok(&l, &["refs", "--json"])).unwrap();
    assert!(refs
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "experiments/alt" && r["head"] == first));
    // Forking onto an existing name is a conflict (exit 5).
    let o = mass(&l, &["fork", &first[..12], "--name", "experiments/alt"]);
    assert_eq!(
        o.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn snapshot_checkout_diff_round_trip() {
    let (d, l) = fresh();
    ok(&l, &["init"]);
    let ws = d.path().join("ws");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/main.py"), "print(1)\n").unwrap();
    std::fs::write(ws.join("notes.md"), "# notes\n").unwrap();
    let a = ok(&l, &["snapshot", ws.to_str().unwrap()])
        .trim()
        .to_string();
    assert_eq!(a.len(), 64);
    std::fs::write(ws.join("src/main.py"), "print(2)\n").unwrap();
    std::fs::remove_file(ws.join("notes.md")).unwrap();
    std::fs::write(ws.join("report.md"), "done\n").unwrap();
    let b = ok(&l, &["snapshot", ws.to_str().unwrap()])
        .trim()
        .to_string();
    assert_eq!(
        ok(&l, &["diff", &a[..8], &b[..8]]),
        "D notes.md\nA report.md\nM src/main.py\n"
    );
    let out = d.path().join("out");
    ok(&l, &["checkout", &a, out.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(out.join("src/main.py")).unwrap(),
        "print(1)\n"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("notes.md")).unwrap(),
        "# notes\n"
    );
    let shown = ok(&l, &["show", &a]);
    assert!(shown.contains("src/main.py"), "{shown}");
}

#[test]
fn verify_stats_export() {
    let (d, l) = fresh();
    ok(&l, &["demo"]);
    let v = ok(&l, &["verify"]);
    assert!(v.starts_with("ok: "), "{v}");
    let s: serde_json::Value = serde_json::from_str(&ok(&l, &["stats", "--json"])).unwrap();
    assert_eq!(s["by_kind"]["event"]["count"], 6);
    assert!(s["dedup_ratio"].as_f64().unwrap() >= 1.0);
    let out = d.path().join("events.jsonl");
    ok(&l, &["export", "events", "--out", out.to_str().unwrap()]);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|x| serde_json::from_str(x).unwrap())
        .collect();
    assert_eq!(lines.len(), 6);
    assert_eq!(lines[0]["kind"], "note"); // oldest first
    let out2 = d.path().join("orch.jsonl");
    ok(
        &l,
        &[
            "export",
            "events",
            "demo/1/orchestrator",
            "--out",
            out2.to_str().unwrap(),
        ],
    );
    assert_eq!(std::fs::read_to_string(&out2).unwrap().lines().count(), 2);
}

#[test]
fn verify_exits_3_and_names_corrupt_objects() {
    let (_d, l) = fresh();
    ok(&l, &["demo"]);
    let v: serde_json::Value =
        serde_json::from_str(&ok(&l, &["log", "--kind", "note", "--json"])).unwrap();
    let note = v[0]["id"].as_str().unwrap().to_string();
    // Flip a byte in the middle of the segment's first record body (the note).
    let seg = l.join("segments/00000001.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = ledger::format::SEGMENT_HEADER_LEN as usize + ledger::format::RECORD_HEADER_LEN + 10;
    bytes[at] ^= 0xff;
    std::fs::write(&seg, bytes).unwrap();
    let o = mass(&l, &["verify"]);
    assert_eq!(o.status.code(), Some(3));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("BAD {note}")), "{text}");
    let o = mass(&l, &["show", &note]);
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("corrupt object {note}")));
}

#[test]
fn errors_have_documented_exit_codes_and_say_what_to_do() {
    let (_d, l) = fresh();
    let o = mass(&l, &["log"]);
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("mass init"));
    ok(&l, &["init"]);
    let o = mass(&l, &["show", "xyz"]);
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("neither a ref nor an object id"));
    let o = mass(&l, &["show", "0123456789abcdef"]);
    assert_eq!(o.status.code(), Some(4));
    // Regression: a too-short hex id is a malformed id (2), not "not found".
    let o = mass(&l, &["show", "abc12"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("at least 8 hex digits"));
    // A second process that wants to write gets the lock error; readers
    // do not need the lock.
    let held = ledger::Ledger::open(&l).unwrap();
    ok(&l, &["log"]);
    let o = mass(&l, &["snapshot", l.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(6));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("in use by pid {}", std::process::id())),
        "{err}"
    );
    drop(held);
    let o = mass(&l, &["bogus-command"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn rank_prints_scores_and_json() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("c.jsonl");
    std::fs::write(&f, "{\"a\":\"run-1\",\"b\":\"run-2\",\"winner\":\"a\"}\n{\"a\":\"run-2\",\"b\":\"run-3\",\"winner\":\"a\"}\n{\"a\":\"run-3\",\"b\":\"run-1\",\"winner\":\"tie\"}\n").unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok(
        &d.path().join("unused"),
        &["rank", f.to_str().unwrap(), "--json"],
    ))
    .unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 3);
    assert_eq!(arr[0]["item"], "run-1");
    assert_eq!(arr[0]["rank"], 1);
    let sum: f64 = arr.iter().map(|r| r["score"].as_f64().unwrap()).sum();
    assert!(sum.abs() < 1e-9, "scores are mean-centred");
    std::fs::write(&f, "{\"a\":\"x\",\"b\":\"y\",\"winner\":\"q\"}\n").unwrap();
    let o = mass(&d.path().join("unused"), &["rank", f.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("line 1"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Regression (#23): `reindex` once refused mid-log damage, and a flipped
/// byte in the last batch was cut off as a torn tail. Both rebuilds now step
/// over the damaged record, list it and keep every intact one.
#[test]
fn reindex_and_repair_step_over_damage_and_keep_every_intact_record() {
    let (_d, l) = fresh();
    ok(&l, &["demo"]);
    let before: serde_json::Value =
        serde_json::from_str(&ok(&l, &["log", "--json", "--limit", "100"])).unwrap();
    // Damage the first record (the note): valid records follow it.
    let seg = l.join("segments/00000001.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    let first = ledger::format::SEGMENT_HEADER_LEN as usize;
    bytes[first + ledger::format::RECORD_HEADER_LEN + 10] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    let out = ok(&l, &["reindex"]);
    assert!(
        out.contains(&format!("damaged bytes in segment 1 at byte {first}")),
        "{out}"
    );
    assert!(out.contains("listed and stepped over"), "{out}");
    assert_eq!(
        std::fs::read(&seg).unwrap(),
        bytes,
        "reindex changed the segment"
    );
    let out = ok(&l, &["repair"]);
    assert!(
        out.contains("stepped over 1 range(s) listed before"),
        "{out}"
    );
    assert!(out.contains("no segment bytes were changed"), "{out}");
    assert_eq!(
        std::fs::read(&seg).unwrap(),
        bytes,
        "repair changed the segment"
    );
    let after: serde_json::Value =
        serde_json::from_str(&ok(&l, &["log", "--json", "--limit", "100"])).unwrap();
    // Every event but the damaged note is still there.
    let ids = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect()
    };
    let (b, a) = (ids(&before), ids(&after));
    assert_eq!(a.len() + 1, b.len(), "{a:?} vs {b:?}");
    assert!(a.iter().all(|x| b.contains(x)));
    // verify says what was listed and what depended on it.
    let o = mass(&l, &["verify"]);
    assert_eq!(o.status.code(), Some(3));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("listed in quarantine/damaged.jsonl"),
        "{text}"
    );
    assert!(text.contains("dangling"), "{text}");
    // The ledger takes writes again.
    ok(&l, &["snapshot", l.join("segments").to_str().unwrap()]);
}

#[test]
fn a_log_cut_short_is_reported_by_every_kind_of_open() {
    // Before: cutting the last batch at a record boundary (or deleting the
    // last segment) left `verify` saying ok, and re-snapshotting the lost
    // tree printed its id and wrote nothing.
    let (d, l) = fresh();
    ok(&l, &["init"]);
    let ws = d.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "first version").unwrap();
    ok(&l, &["snapshot", ws.to_str().unwrap()]);
    let seg = l.join("segments/00000001.seg");
    let before = std::fs::metadata(&seg).unwrap().len();
    std::fs::write(ws.join("a.txt"), "second version, lost later").unwrap();
    let tree = ok(&l, &["snapshot", ws.to_str().unwrap()]);
    // Cut the second snapshot's batch off at its first record.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(before)
        .unwrap();
    for args in [
        &["verify"][..],
        &["verify", "--log-only"],
        &["snapshot", ws.to_str().unwrap()],
    ] {
        let o = mass(&l, args);
        assert_eq!(o.status.code(), Some(3), "mass {args:?}");
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            all.contains("shorter than the index"),
            "mass {args:?}: {all}"
        );
    }
    assert!(!tree.is_empty());
}

/// Regressions: `mass status` on a ledger whose only run's head was
/// damaged said "no runs yet" and exited 0; `mass status NAME` of a run
/// that does not exist exited 1 instead of 4.
#[test]
fn status_names_a_run_whose_head_cannot_be_read() {
    let (_d, l) = fresh();
    {
        let ledger = ledger::Ledger::init(&l).unwrap();
        ledger
            .append("exp", None, ledger::NewEvent::new("note", 1, vec![7; 64]))
            .unwrap();
    }
    let seg = l.join("segments/00000001.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[ledger::format::SEGMENT_HEADER_LEN as usize + ledger::format::RECORD_HEADER_LEN + 10] ^=
        0xff;
    std::fs::write(&seg, bytes).unwrap();
    let o = mass(&l, &["status"]);
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("exp: its head") && err.contains("mass verify"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("no runs yet"));
    let o = mass(&l, &["status", "exp"]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = mass(&l, &["status", "nope"]);
    assert_eq!(o.status.code(), Some(4));
}

/// Regression: a failed snapshot said "cannot snapshot X: cannot snapshot X: ...".
#[test]
fn a_failed_snapshot_names_the_path_once() {
    let (d, l) = fresh();
    ok(&l, &["init"]);
    let missing = d.path().join("no-such-dir");
    let o = mass(&l, &["snapshot", missing.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("cannot snapshot").count(), 1, "{err}");
}

/// A ledger written by the build before format 2 is refused with a hint,
/// and `mass migrate --from` copies it into a new ledger (the fixture is the
/// ledger crate's: three refs, 43 objects, 14 batches).
#[test]
fn a_format_1_ledger_is_refused_with_a_hint_and_migrated() {
    let (d, l) = fresh();
    let old = Path::new(env!("CARGO_MANIFEST_DIR")).join("ledger/tests/fixtures/v1-ledger");
    let o = mass(&old, &["refs"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("format version 1") && err.contains("mass migrate --from"),
        "{err}"
    );
    let out = ok(&l, &["migrate", "--from", old.to_str().unwrap()]);
    assert!(
        out.contains("copied 14 batches (43 objects, 14 ref updates)"),
        "{out}"
    );
    let refs = ok(&l, &["refs"]);
    assert_eq!(refs.lines().count(), 3, "{refs}");
    // Not a format-1 ledger: a usage error, nothing created.
    let o = mass(
        &d.path().join("again"),
        &["migrate", "--from", l.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(!d.path().join("again").exists());
}
