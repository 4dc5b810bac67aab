//! Library tests of `import`: a fixture run folder (`import::fixture`,
//! written from the reference's documented formats) imported into a fresh
//! ledger, and every protection with the input that defeats it. Tests that
//! have a test-only switch run their attack once more with the protection
//! off and check that it then lands, so the test is known to catch it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use import::fixture::{self, Spec};
use import::{Caps, ImportError, Options, Outcome, Scrubber};
use ledger::{Id, Ledger, ObjectKind};
use schemas::{Effect, Judgment, Rollout, RunStarted};

const KEY: &str = "sk-planted-SECRET-0123456789abcdefXYZ";

fn fixture_dir(spec: &Spec) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    fixture::write_run(d.path(), spec).unwrap();
    d
}

fn ledger() -> (tempfile::TempDir, Ledger) {
    let d = tempfile::tempdir().unwrap();
    let l = Ledger::init(d.path()).unwrap();
    (d, l)
}

fn import(dir: &Path) -> (tempfile::TempDir, Ledger, Result<Outcome, ImportError>) {
    let (d, l) = ledger();
    let r = import::import(&l, dir, "ref", &Options::default());
    (d, l, r)
}

fn head_of(r: &Result<Outcome, ImportError>) -> Id {
    match r {
        Ok(Outcome::Imported { head, .. }) => *head,
        other => panic!("{other:?}"),
    }
}

/// Writes the fixture to $MASS_FIXTURE_OUT, for looking at by hand.
#[test]
#[ignore]
fn write_fixture_for_inspection() {
    if let Ok(out) = std::env::var("MASS_FIXTURE_OUT") {
        let key = std::env::var("MASS_FIXTURE_KEY").ok();
        fixture::write_run(
            Path::new(&out),
            &Spec {
                key,
                external: std::env::var_os("MASS_FIXTURE_EXTERNAL").is_some(),
                ..Spec::default()
            },
        )
        .unwrap();
    }
}

#[test]
fn imports_a_run_and_a_second_import_is_a_no_op() {
    let dir = fixture_dir(&Spec::default());
    let (_d, l, first) = import(dir.path());
    let head = head_of(&first);
    let Ok(Outcome::Imported { episodes, .. }) = first else {
        unreachable!()
    };
    assert_eq!(episodes, 8);
    assert_eq!(l.head("ref").unwrap(), Some(head));
    let refs_before = l.refs().unwrap();
    let again = import::import(&l, dir.path(), "ref", &Options::default()).unwrap();
    assert_eq!(again, Outcome::AlreadyImported { head, unmarked: 0 });
    assert_eq!(l.refs().unwrap(), refs_before);
}

#[test]
fn same_folder_same_ids_wherever_and_whenever_it_is_imported() {
    let a = fixture_dir(&Spec::default());
    // Written again later: other file times, the same contents.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let b = fixture_dir(&Spec::default());
    let (_d1, _l1, r1) = import(a.path());
    let (_d2, _l2, r2) = import(b.path());
    assert_eq!(head_of(&r1), head_of(&r2));
}

#[test]
fn another_folder_under_a_taken_name_is_refused_and_writes_nothing() {
    let a = fixture_dir(&Spec::default());
    let b = fixture_dir(&Spec {
        key: None,
        variant: 1,
        ..Spec::default()
    });
    let (_d, l, r) = import(a.path());
    let head = head_of(&r);
    let refs = l.refs().unwrap();
    let objects = l.object_count().unwrap();
    let e = import::import(&l, b.path(), "ref", &Options::default()).unwrap_err();
    assert!(matches!(e, ImportError::NameTaken { .. }), "{e}");
    assert_eq!(l.refs().unwrap(), refs);
    assert_eq!(l.object_count().unwrap(), objects);
    assert_eq!(l.head("ref").unwrap(), Some(head));
}

#[test]
fn the_head_covers_every_episode() {
    let a = fixture_dir(&Spec::default());
    let (_d, _l, r) = import(a.path());
    let base = head_of(&r);
    // One reply changed in one collected episode's proxy log, and one
    // held-out evaluation run's prompt: each changes the run's head.
    for (rel, from, to) in [
        (
            "pool/runlogs/t51_L0_s10103/api_requests.jsonl.gz",
            "Finished.",
            "Finished!",
        ),
        ("evaluation/logs/query60_r0/prompt.txt", "Solve", "solve"),
    ] {
        let b = fixture_dir(&Spec::default());
        let p = b.path().join(rel);
        if rel.ends_with(".gz") {
            let text = gunzip(&std::fs::read(&p).unwrap());
            std::fs::write(&p, fixture::gzip(text.replace(from, to).as_bytes())).unwrap();
        } else {
            let text = std::fs::read_to_string(&p).unwrap();
            std::fs::write(&p, text.replace(from, to)).unwrap();
        }
        let (_d, _l, r) = import(b.path());
        assert_ne!(head_of(&r), base, "{rel} changed, the head did not");
    }
}

fn gunzip(b: &[u8]) -> String {
    use std::io::Read;
    let mut s = String::new();
    flate2::read::MultiGzDecoder::new(b)
        .read_to_string(&mut s)
        .unwrap();
    s
}

/// Every object's canonical bytes and every event's metadata.
fn everything(l: &Ledger) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (id, _) in l.locations().unwrap() {
        let (kind, raw) = l.raw_object(&id).unwrap();
        out.push(raw);
        if kind == ObjectKind::Event {
            out.push(serde_json::to_vec(&l.get_meta(&id).unwrap()).unwrap());
        }
    }
    out.push(format!("{:?}", l.refs().unwrap()).into_bytes());
    out
}

fn holds(all: &[Vec<u8>], needle: &str) -> usize {
    all.iter()
        .filter(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
        .count()
}

#[test]
fn a_planted_key_reaches_no_object_and_lands_with_scrubbing_off() {
    let dir = fixture_dir(&Spec {
        key: Some(KEY.into()),
        variant: 0,
        ..Spec::default()
    });
    let (_d, l, r) = import(dir.path());
    head_of(&r);
    let all = everything(&l);
    assert_eq!(holds(&all, KEY), 0, "the planted key is in the ledger");
    assert!(holds(&all, "REDACTED") > 0, "nothing was redacted");
    // The same import with the protection off: the key is in objects.
    let (_d2, l2) = ledger();
    let off = Options {
        unscrubbed_for_tests: true,
        ..Options::default()
    };
    import::import(&l2, dir.path(), "ref", &off).unwrap();
    assert!(holds(&everything(&l2), KEY) > 5);
}

fn link(target: &Path, at: &Path) {
    let _ = std::fs::remove_file(at);
    let _ = std::fs::remove_dir_all(at);
    std::os::unix::fs::symlink(target, at).unwrap();
}

#[test]
fn symlinks_are_refused_by_name_never_followed() {
    let outside = tempfile::tempdir().unwrap();
    let copy = outside.path().join("train.json");
    let src = fixture_dir(&Spec::default());
    std::fs::copy(src.path().join("selection/train.json"), &copy).unwrap();
    let cases: [(&str, &Path); 4] = [
        (
            "pool/runlogs/t51_L0_s10101/run_status.json",
            Path::new("/proc/self/environ"),
        ),
        ("selection/train.json", &copy),
        ("pool/runlogs/t51_L0_s10102", outside.path()),
        ("training", outside.path()),
    ];
    for (rel, target) in cases {
        let dir = fixture_dir(&Spec::default());
        link(target, &dir.path().join(rel));
        let (_d, l, r) = import(dir.path());
        match r {
            Err(ImportError::Symlink { file }) => assert_eq!(file, rel),
            other => panic!("{rel}: {other:?}"),
        }
        assert!(l.refs().unwrap().is_empty());
    }
}

fn expect_err(dir: &Path, caps: Caps) -> (String, Ledger, tempfile::TempDir) {
    let (d, l) = ledger();
    let opts = Options {
        caps,
        ..Options::default()
    };
    let e = import::import(&l, dir, "ref", &opts).unwrap_err();
    assert!(l.refs().unwrap().is_empty(), "{e}");
    assert_eq!(l.object_count().unwrap(), 0, "{e}");
    (e.to_string(), l, d)
}

/// What a case does to the fixture folder.
type Spoil = Box<dyn Fn(&Path)>;

#[test]
fn bad_input_is_named_by_file_and_line_and_nothing_is_written() {
    let cases: Vec<(&str, Spoil, &str)> = vec![
        ("not a run", Box::new(|p: &Path| std::fs::remove_file(p.join("config.json")).unwrap()), "not a run folder of the reference"),
        ("truncated gz", Box::new(|p: &Path| {
            let f = p.join("pool/runlogs/t51_L0_s10102/api_requests.jsonl.gz");
            let b = std::fs::read(&f).unwrap();
            std::fs::write(&f, &b[..b.len() / 2]).unwrap();
        }), "pool/runlogs/t51_L0_s10102/api_requests.jsonl.gz: damaged or truncated gzip"),
        ("invalid json line 2", Box::new(|p: &Path| {
            let f = p.join("selection/task51_matches.jsonl");
            let t = std::fs::read_to_string(&f).unwrap();
            let mut lines: Vec<&str> = t.lines().collect();
            lines[1] = "{\"a\": oops";
            std::fs::write(&f, lines.join("\n")).unwrap();
        }), "selection/task51_matches.jsonl:2: invalid JSON"),
        ("missing episode", Box::new(|p: &Path| std::fs::remove_dir_all(p.join("pool/runlogs/t51_L0_s10103")).unwrap()), "pool.json:4: names episode \"t51_L0_s10103\", but pool/runlogs/t51_L0_s10103 does not exist"),
        ("duplicate manifest row", Box::new(|p: &Path| {
            let f = p.join("selection/val.json");
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p.join("selection/train.json")).unwrap()).unwrap();
            std::fs::write(&f, serde_json::to_vec(&serde_json::json!([v[0]])).unwrap()).unwrap();
        }), "selection/val.json:1: episode \"t51_L0_s10100\" is selected twice"),
        ("duplicate match", Box::new(|p: &Path| {
            let f = p.join("selection/task51_matches.jsonl");
            let t = std::fs::read_to_string(&f).unwrap();
            let first = t.lines().next().unwrap().to_string();
            std::fs::write(&f, format!("{t}{first}\n")).unwrap();
        }), "selection/task51_matches.jsonl:5: pair"),
        (
            "manifest names an unranked episode",
            Box::new(|p: &Path| {
                let f = p.join("selection/task51_ranked.json");
                let mut v: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
                v.as_array_mut().unwrap().remove(2);
                std::fs::write(&f, serde_json::to_vec(&v).unwrap()).unwrap();
            }),
            "selection/val.json:1: names episode \"t51_L0_s10102\", which no selection/task*_ranked.json ranks",
        ),
        // The last file the import reads: nothing before it is written.
        ("bad file late", Box::new(|p: &Path| {
            std::fs::write(p.join("selected_checkpoint.json"), b"{\"step\": 20}").unwrap();
        }), "selected_checkpoint.json:1: no finite \"val_loss\""),
    ];
    for (what, spoil, says) in cases {
        let dir = fixture_dir(&Spec::default());
        spoil(dir.path());
        let (e, _l, _d) = expect_err(dir.path(), Caps::default());
        assert!(e.contains(says), "{what}: {e}");
    }
}

#[test]
fn caps_stop_a_gzip_bomb_a_huge_line_and_a_huge_file() {
    let small = Caps {
        file: 64 << 10,
        log: 1 << 20,
        line: 16 << 10,
        total: 64 << 20,
        rows: 1000,
        ..Caps::default()
    };
    // A gzip bomb: 2 MiB of empty lines, a few KiB compressed.
    let dir = fixture_dir(&Spec::default());
    let rel = "pool/runlogs/t51_L0_s10101/api_requests.jsonl.gz";
    std::fs::write(dir.path().join(rel), fixture::gzip(&vec![b'\n'; 2 << 20])).unwrap();
    let (e, _l, _d) = expect_err(dir.path(), small);
    assert!(
        e.contains(rel) && e.contains("decompressed log is larger than the cap"),
        "{e}"
    );
    // A line past the line cap (within the log cap).
    let dir = fixture_dir(&Spec::default());
    let long = format!("{{\"pad\": \"{}\"}}\n", "x".repeat(64 << 10));
    std::fs::write(dir.path().join(rel), fixture::gzip(long.as_bytes())).unwrap();
    let (e, _l, _d) = expect_err(dir.path(), small);
    assert!(
        e.contains(rel) && e.contains("line 1 is larger than the cap"),
        "{e}"
    );
    // A plain file past the file cap.
    let dir = fixture_dir(&Spec::default());
    std::fs::write(dir.path().join("pool.json"), vec![b' '; 128 << 10]).unwrap();
    let (e, _l, _d) = expect_err(dir.path(), small);
    assert!(
        e.contains("pool.json: the file is larger than the cap"),
        "{e}"
    );
    // Many files each within its cap, past the folder's total.
    let dir = fixture_dir(&Spec::default());
    let tiny_total = Caps {
        total: 16 << 10,
        ..small
    };
    let (e, _l, _d) = expect_err(dir.path(), tiny_total);
    assert!(e.contains("the run folder in all"), "{e}");
    // The same bomb under the default caps is read (and refused for what
    // it is, not for its size): the small caps are what stopped it.
    let dir = fixture_dir(&Spec::default());
    std::fs::write(dir.path().join(rel), fixture::gzip(&vec![b'\n'; 2 << 20])).unwrap();
    let (d, l) = ledger();
    let r = import::import(&l, dir.path(), "ref", &Options::default());
    assert!(r.is_ok(), "{r:?}");
    drop(d);
}

/// A log of blank lines costs nothing (never a row, never kept), and a log
/// of many tiny records stops at the row cap, named with its file and line.
#[test]
fn blank_lines_cost_nothing_and_rows_stop_at_their_cap() {
    let caps = Caps {
        rows: 200,
        ..Caps::default()
    };
    let rel = "pool/runlogs/t51_L0_s10101/api_requests.jsonl.gz";
    let dir = fixture_dir(&Spec::default());
    std::fs::write(dir.path().join(rel), fixture::gzip(&vec![b'\n'; 2 << 20])).unwrap();
    let (d, l) = ledger();
    let opts = Options {
        caps,
        ..Options::default()
    };
    let r = import::import(&l, dir.path(), "ref", &opts);
    assert!(r.is_ok(), "{r:?}");
    drop(d);
    // 300 records of `{}` (3 bytes each), blank lines between them.
    let dir = fixture_dir(&Spec::default());
    std::fs::write(
        dir.path().join(rel),
        fixture::gzip("{}\n\n".repeat(300).as_bytes()),
    )
    .unwrap();
    let (e, _l, _d) = expect_err(dir.path(), caps);
    assert!(
        e.contains(&format!("{rel}:")) && e.contains("rows") && e.contains("cap of 200"),
        "{e}"
    );
}

#[test]
fn absent_stays_absent_and_times_are_the_references() {
    let dir = fixture_dir(&Spec::default());
    let (_d, l, r) = import(dir.path());
    let head = head_of(&r);
    let main: Vec<_> = l.chain(head).map(|e| e.unwrap()).collect();
    let first = main.last().unwrap();
    let rs: RunStarted = schemas::decode_event(first).unwrap();
    assert_eq!(rs.driver, import::DRIVER);
    // The reference logs no start time: the config's mtime stands in, and
    // the metadata says so.
    let meta = l.get_meta(&first.id).unwrap();
    assert_eq!(meta.known_wall_ms(), None);
    assert_eq!(
        meta.extra.get(ledger::WALL_MS_FROM).map(String::as_str),
        Some("file mtime")
    );
    assert_eq!(rs.tasks.0, [0; 32], "no task suite: absent");
    let orch = l.head("ref/c1/query51/collect/00/orch").unwrap().unwrap();
    let ev = l.get_event(&orch).unwrap();
    let ro: Rollout = schemas::decode_event(&ev).unwrap();
    // No checks ran: absent. The workspace is the folder's (see
    // each_rollouts_tree_is_its_workspace_as_the_folder_holds_it).
    assert_eq!(ro.validation.0, [0; 32]);
    assert_ne!(ro.tree.0, [0; 32]);
    // 120 + 160 prompt tokens: the subagent's reply reported none and adds none.
    assert_eq!((ro.prompt_tokens, ro.completion_tokens), (280, 38));
    let mut nulls = 0;
    let mut times = Vec::new();
    for e in l.chain(orch) {
        let e = e.unwrap();
        if e.kind != "effect" {
            continue;
        }
        let fx: Effect = schemas::decode_event(&e).unwrap();
        let meta = l.get_meta(&e.id).unwrap();
        assert_eq!(meta.known_wall_ms(), Some(meta.wall_ms), "a logged time");
        times.push(meta.wall_ms);
        if fx.effect == "model" {
            let out: serde_json::Value =
                serde_json::from_slice(&l.get_blob(&Id(fx.output.unwrap().0)).unwrap()).unwrap();
            nulls += usize::from(out["usage"].is_null());
        }
    }
    assert_eq!(nulls, 1, "the reply without usage records usage null");
    // Episode 10 of the fixture starts at 2026-01-01T10:00:00Z.
    let t0 = (1_767_225_600 + 10 * 3600) * 1000;
    assert!(
        times.iter().all(|t| (t0..t0 + 600_000).contains(t)),
        "{times:?}"
    );
    let judge = l.head("ref/c1/query51/pair").unwrap().unwrap();
    let j: Judgment = schemas::decode_event(&l.get_event(&judge).unwrap()).unwrap();
    assert_eq!(
        j.conversation.0, [0; 32],
        "no judge conversation recorded: absent"
    );
}

/// Every file under `dir` and its bytes.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push((p.clone(), std::fs::read(&p).unwrap()));
        }
    }
    out.sort();
    out
}

#[test]
fn a_late_bad_file_leaves_the_ledger_byte_identical() {
    let (d, l) = ledger();
    let good = fixture_dir(&Spec::default());
    import::import(&l, good.path(), "ref", &Options::default()).unwrap();
    let before = files(d.path());
    // Every episode and stage file is good; the last file read is not.
    let bad = fixture_dir(&Spec {
        key: None,
        variant: 1,
        ..Spec::default()
    });
    std::fs::write(
        bad.path().join("selected_checkpoint.json"),
        b"{\"step\": 20}",
    )
    .unwrap();
    let e = import::import(&l, bad.path(), "other", &Options::default()).unwrap_err();
    assert!(e.to_string().contains("selected_checkpoint.json"), "{e}");
    assert_eq!(files(d.path()), before, "the ledger changed");
    assert_eq!(
        l.refs()
            .unwrap()
            .iter()
            .filter(|(n, _)| n.starts_with("other"))
            .count(),
        0
    );
}

/// A key the model echoed token by token: in the proxy's raw SSE text and
/// in qwen-code's partial-message lines it lies in pieces, whole only in
/// the reassembled message. No piece, no 8-byte window of it, reaches any
/// object.
#[test]
fn a_key_split_across_stream_chunks_reaches_no_object() {
    let key = "sk-or-v1-Zq7XwPmN3kLrT9bVy2HcJd5GsQf8UeAo1WiKn4RxEt6";
    let pieces = [&key[..14], &key[14..33], &key[33..]];
    let dir = fixture_dir(&Spec::default());
    let ep = dir.path().join("pool/runlogs/t51_L0_s10101");
    let gz = ep.join("api_requests.jsonl.gz");
    let mut rows: Vec<serde_json::Value> = gunzip(&std::fs::read(&gz).unwrap())
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let said = format!("Your key is {key}");
    let last = rows.last_mut().unwrap();
    last["response"]["choices"][0]["message"]["content"] = said.clone().into();
    let sse: String = ["Your key is ", pieces[0], pieces[1], pieces[2]]
        .iter()
        .map(|p| {
            format!(
                "data: {}\n\n",
                serde_json::json!({"choices": [{"delta": {"content": p}}]})
            )
        })
        .collect();
    last["sse_raw"] = format!("{sse}data: [DONE]\n").into();
    let lines: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(&gz, fixture::gzip(lines.as_bytes())).unwrap();
    let mut trace = std::fs::read_to_string(ep.join("qwen_stream.jsonl")).unwrap();
    for p in ["Your key is ", pieces[0], pieces[1], pieces[2]] {
        let ev = serde_json::json!({"type": "stream_event", "event": {"type": "content_block_delta",
            "delta": {"type": "text_delta", "text": p}}});
        trace.push_str(&format!("{ev}\n"));
    }
    let whole = serde_json::json!({"type": "assistant", "message": {"content": [{"type": "text", "text": said}]}});
    trace.push_str(&format!("{whole}\n"));
    std::fs::write(ep.join("qwen_stream.jsonl"), trace).unwrap();
    let (_d, l, r) = import(dir.path());
    head_of(&r);
    let all = everything(&l);
    assert_eq!(holds(&all, key), 0, "the whole key is in the ledger");
    for p in pieces {
        assert_eq!(holds(&all, p), 0, "piece {p:?} is in the ledger");
    }
    for w in 0..=key.len() - 8 {
        let frag = &key[w..w + 8];
        assert_eq!(holds(&all, frag), 0, "fragment {frag:?} is in the ledger");
    }
}

/// Memory the byte caps do not see: many empty episode folders, many
/// objects, and JSON whose parsed form is many times its text.
#[test]
fn counts_and_parsed_size_are_capped() {
    // 30 empty evaluation folders: no bytes, but each an episode.
    let dir = fixture_dir(&Spec::default());
    for i in 0..30 {
        std::fs::create_dir_all(dir.path().join(format!("evaluation/logs/query7_r{i}"))).unwrap();
    }
    let caps = Caps {
        episodes: 20,
        ..Caps::default()
    };
    let (e, _l, _d) = expect_err(dir.path(), caps);
    assert!(
        e.contains("evaluation/logs/query7_r")
            && e.contains("episode folders")
            && e.contains("cap of 20"),
        "{e}"
    );
    // Objects past their cap.
    let dir = fixture_dir(&Spec::default());
    let caps = Caps {
        objects: 50,
        ..Caps::default()
    };
    let (e, _l, _d) = expect_err(dir.path(), caps);
    assert!(
        e.contains("objects in the import") && e.contains("cap of 50"),
        "{e}"
    );
    // 300 KB of `[0,0,...]`: within a 1 MiB total as text, some 5 MB once
    // parsed.
    let dir = fixture_dir(&Spec::default());
    let list = format!("[{}0]", "0,".repeat(150_000));
    std::fs::write(
        dir.path()
            .join("search/query51_ourTeam/retained_workflow.json"),
        list,
    )
    .unwrap();
    let caps = Caps {
        total: 1 << 20,
        ..Caps::default()
    };
    let (e, _l, _d) = expect_err(dir.path(), caps);
    assert!(
        e.contains("search/query51_ourTeam/retained_workflow.json: the run folder in all"),
        "{e}"
    );
}

fn with_caps(dir: &Path, caps: Caps) -> (tempfile::TempDir, Ledger, Result<Outcome, ImportError>) {
    let (d, l) = ledger();
    let opts = Options {
        caps,
        ..Options::default()
    };
    let r = import::import(&l, dir, "ref", &opts);
    (d, l, r)
}

/// A folder of endless `x_key=...` lines is refused at the secrets cap
/// (each learnt secret is searched for in everything recorded), and a
/// secret whose start is another secret is replaced whole.
#[test]
fn learnt_secrets_are_capped_and_replaced_longest_first() {
    let rel = "pool/runlogs/t51_L0_s10101/prompt.txt";
    let dir = fixture_dir(&Spec::default());
    let lines: String = (0..2000)
        .map(|n| format!("a_key=AAAAAAAA{n:08}Qz\n"))
        .collect();
    std::fs::write(dir.path().join(rel), lines).unwrap();
    let caps = Caps {
        secrets: 1000,
        ..Caps::default()
    };
    let (e, _l, _d) = expect_err(dir.path(), caps);
    assert!(e.contains(rel) && e.contains("cap of 1000"), "{e}");
    // The shorter secret learnt first: replacing it first would leave the
    // longer one's tail in the text.
    let dir = fixture_dir(&Spec::default());
    let (short, long) = ("Tk9xQ2mLp7Rz4Vb8", "Tk9xQ2mLp7Rz4Vb8Wn3Ys6Hd");
    let text = format!("y_token={short}\nx_token={long}\nbare: {long}\n");
    std::fs::write(dir.path().join(rel), text).unwrap();
    let (_d, l, r) = with_caps(dir.path(), Caps::default());
    head_of(&r);
    let all = everything(&l);
    assert_eq!(
        holds(&all, "Wn3Ys6Hd"),
        0,
        "the longer secret's tail is in the ledger"
    );
    assert_eq!(holds(&all, short), 0);
}

/// Regression (second review of #31): two learnt secrets where one starts
/// inside the other (`…1234` and `1234…`) were replaced leftmost first, and
/// the second one's tail stayed in every object that held them side by side.
#[test]
fn overlapping_secrets_leave_no_tail() {
    let rel = "pool/runlogs/t51_L0_s10101/prompt.txt";
    let dir = fixture_dir(&Spec::default());
    let (a, b) = ("Qm7Rt2Lx9Vb4Kp1Z", "Kp1ZWn3Ys6Hd8Jc5");
    // Both learnt on their own lines; then written overlapping, as a log
    // that prints one key's end glued to another's start would.
    let glued = "Qm7Rt2Lx9Vb4Kp1ZWn3Ys6Hd8Jc5";
    let text = format!("a_token={a}\nb_token={b}\nboth: {glued}\n");
    std::fs::write(dir.path().join(rel), text).unwrap();
    let (_d, l, r) = with_caps(dir.path(), Caps::default());
    head_of(&r);
    let all = everything(&l);
    for tail in ["Wn3Ys6Hd8Jc5", "Qm7Rt2Lx9Vb4"] {
        assert_eq!(
            holds(&all, tail),
            0,
            "{tail} (part of a secret) is in the ledger"
        );
    }
    let mut s = Scrubber::new();
    s.learn_text(format!("a_token={a}\nb_token={b}\n").as_bytes());
    assert_eq!(s.text(&format!("<{glued}>")), "<REDACTED>");
    assert_eq!(s.text(&format!("{a} {b}")), "REDACTED REDACTED");
}

/// Names that become stream names are what the reference writes (digits),
/// checked before anything is written; two folders of one stream are
/// refused, never merged.
#[test]
fn bad_task_names_and_colliding_indices_are_refused_with_their_file() {
    let set_task = |task: serde_json::Value| {
        move |p: &Path| {
            let f = p.join("pool.json");
            let mut v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
            v[1]["task"] = task.clone();
            std::fs::write(&f, serde_json::to_vec(&v).unwrap()).unwrap();
        }
    };
    let cases: Vec<(&str, Spoil, &str)> = vec![
        ("space", Box::new(set_task("1 2".into())), "pool.json:2: no task id"),
        ("dots", Box::new(set_task("..".into())), "pool.json:2: no task id"),
        ("long", Box::new(set_task("9".repeat(240).into())), "pool.json:2: no task id"),
        ("negative", Box::new(set_task((-1).into())), "pool.json:2: no task id"),
        ("empty episode", Box::new(|p: &Path| {
            let f = p.join("pool.json");
            let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
            v[0]["episode"] = "".into();
            std::fs::write(&f, serde_json::to_vec(&v).unwrap()).unwrap();
        }), "pool.json:1: episode name is not a folder name"),
        ("r0 and r00", Box::new(|p: &Path| {
            let logs = p.join("evaluation/logs");
            std::fs::create_dir_all(logs.join("query60_r00")).unwrap();
            std::fs::copy(logs.join("query60_r0/prompt.txt"), logs.join("query60_r00/prompt.txt")).unwrap();
        }), "evaluation/logs/query60_r00: is the same eval episode of query60 as evaluation/logs/query60_r0"),
    ];
    for (what, spoil, says) in cases {
        let dir = fixture_dir(&Spec::default());
        spoil(dir.path());
        let (e, _l, _d) = expect_err(dir.path(), Caps::default());
        assert!(e.contains(says), "{what}: {e}");
    }
    // `query60_r+1` is no index the reference writes: not an episode.
    let dir = fixture_dir(&Spec::default());
    let logs = dir.path().join("evaluation/logs");
    std::fs::create_dir_all(logs.join("query60_r+1")).unwrap();
    let (_d, _l, r) = import(dir.path());
    assert!(
        matches!(r, Ok(Outcome::Imported { episodes: 8, .. })),
        "{r:?}"
    );
}

/// Numbers at the edge of their type: an overflow would panic (or wrap to
/// a wrong cycle); each is refused with its file and line.
#[test]
fn overflowing_numbers_are_refused_with_their_file() {
    let cases: Vec<(&str, Spoil, &str)> = vec![
        (
            "generation",
            Box::new(|p: &Path| {
                let f = p.join("config.json");
                let t = std::fs::read_to_string(&f).unwrap();
                std::fs::write(
                    &f,
                    t.replacen(
                        "\"generation\": 0",
                        "\"generation\": 18446744073709551615",
                        1,
                    ),
                )
                .unwrap();
            }),
            "config.json:1: \"generation\" is not a whole number",
        ),
        (
            "year",
            Box::new(|p: &Path| {
                let f = p.join("pool/runlogs/t51_L0_s10101/run_status.json");
                let mut v: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
                v["started_at"] = "99999999999999999-01-01T00:00:00Z".into();
                std::fs::write(&f, serde_json::to_vec(&v).unwrap()).unwrap();
            }),
            "pool/runlogs/t51_L0_s10101/run_status.json:1: \"started_at\" is not a time",
        ),
    ];
    for (what, spoil, says) in cases {
        let dir = fixture_dir(&Spec::default());
        spoil(dir.path());
        let (e, _l, _d) = expect_err(dir.path(), Caps::default());
        assert!(e.contains(says), "{what}: {e}");
    }
}

/// A hard link is a file from outside the folder under a name inside it;
/// a FIFO or a device is never opened (an open may block or act).
#[test]
fn hard_links_and_fifos_are_refused_never_read() {
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("netrc");
    std::fs::write(&secret, "machine api login me password Hl7secretVALUE99\n").unwrap();
    let rel = "pool/runlogs/t51_L0_s10101/prompt.txt";
    let dir = fixture_dir(&Spec::default());
    std::fs::remove_file(dir.path().join(rel)).unwrap();
    std::fs::hard_link(&secret, dir.path().join(rel)).unwrap();
    let (e, _l, _d) = expect_err(dir.path(), Caps::default());
    assert!(e.contains(rel) && e.contains("hard links"), "{e}");
    let dir = fixture_dir(&Spec::default());
    let at = dir.path().join(rel);
    std::fs::remove_file(&at).unwrap();
    let c = std::ffi::CString::new(at.to_str().unwrap()).unwrap();
    // SAFETY: a valid path string; the result is checked.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (e, _l, _d) = expect_err(dir.path(), Caps::default());
    assert!(e.contains(rel) && e.contains("not a regular file"), "{e}");
}

/// Code and schema after a key-like name are not credentials: they stay,
/// every occurrence, while a real key (not provider-shaped, learnt only
/// from `MY_TOKEN=`) goes wherever it appears.
#[test]
fn code_and_schema_survive_while_real_keys_go() {
    let real = "Zx81QwErTy55UiOp";
    let rel = "pool/runlogs/t51_L0_s10101/prompt.txt";
    let dir = fixture_dir(&Spec::default());
    let text = format!(
        "token = tokenizer.encode(x)\n{{\"key\": \"description\", \"type\": \"string\"}}\n\
         export MY_TOKEN={real}\nlater, bare: {real}\n"
    );
    std::fs::write(dir.path().join(rel), text).unwrap();
    let (_d, l, r) = import(dir.path());
    head_of(&r);
    let all = everything(&l);
    assert_eq!(holds(&all, real), 0, "the real key is in the ledger");
    assert!(
        holds(&all, "token = tokenizer.encode(x)") > 0,
        "code was redacted"
    );
    assert!(
        holds(&all, r#"{"key": "description""#) > 0,
        "the schema was redacted"
    );
    // The fixture's tool schemas and replies are whole: "description"
    // and "tokenizer" were never learnt, so only the real key was replaced.
    for b in all
        .iter()
        .filter(|b| b.windows(8).any(|w| w == b"REDACTED"))
    {
        let n = b.windows(8).filter(|w| *w == b"REDACTED").count();
        assert_eq!(
            n,
            2,
            "more than the real key: {}",
            String::from_utf8_lossy(b)
        );
    }
}

/// Regression (a review of the first credential rule): keys that are short,
/// single-case or dotted, after a key-like name, must still be learnt and
/// taken out where they stand bare, while code and words are not.
#[test]
fn short_single_case_and_dotted_keys_are_learnt_not_only_mixed_case_ones() {
    let keys = [
        ("export OPENAI_API_KEY=abcd1234efgh", "abcd1234efgh"),
        (r#"{"api_key": "k3y9short7x"}"#, "k3y9short7x"),
        (r#"{"password": "hunter22"}"#, "hunter22"),
        ("token=ABCD1234EFGH", "ABCD1234EFGH"),
        (
            "Authorization: Bearer 4f9a1c2e.7b3d8e0a.55c1d2e3",
            "4f9a1c2e.7b3d8e0a.55c1d2e3",
        ),
    ];
    let rel = "pool/runlogs/t51_L0_s10101/prompt.txt";
    let dir = fixture_dir(&Spec::default());
    let mut text = String::from("token = tokenizer.encode(x)\nsecret = config.api_key\n");
    for (marked, key) in &keys {
        text.push_str(&format!("{marked}\nlater, bare: {key}\n"));
    }
    std::fs::write(dir.path().join(rel), text).unwrap();
    let (_d, l, r) = import(dir.path());
    head_of(&r);
    let all = everything(&l);
    for (_, key) in &keys {
        assert_eq!(holds(&all, key), 0, "{key} is in the ledger");
    }
    assert!(holds(&all, "tokenizer.encode(x)") > 0, "code was redacted");
    assert!(
        holds(&all, "config.api_key") > 0,
        "a dotted name was redacted"
    );
}

/// One key per learning rule, none provider-shaped (so only that rule can
/// learn it), each written once where the rule looks and once bare in the
/// trace: none may reach the ledger. A short key in a recorded path goes
/// by the proxy's rule.
#[test]
fn each_learning_rule_takes_a_key_that_is_not_provider_shaped() {
    let keys = [
        (
            "bearer",
            "Qm7Lx2Vb9Nc4Zr8T",
            "the header said Bearer Qm7Lx2Vb9Nc4Zr8T",
        ),
        (
            "pair",
            "Wd3Fg6Hj9Kl2Mn5P",
            "export SERVICE_TOKEN=Wd3Fg6Hj9Kl2Mn5P",
        ),
        (
            "query, encoded name",
            "Pq3Rs8Tu1Vw6Xy0Z",
            "GET https://h.example/v1?api%5Fkey=Pq3Rs8Tu1Vw6Xy0Z",
        ),
        (
            "userinfo, password",
            "Jk4Lm7Np0Qr3St6U",
            "https://me:Jk4Lm7Np0Qr3St6U@db.example/x",
        ),
        (
            "userinfo, token alone",
            "Ab12Cd34Ef56Gh78",
            "git clone https://Ab12Cd34Ef56Gh78@git.example/r",
        ),
        (
            "query, percent-encoded value",
            "Uv9/Wx2+Yz5=Ab8c",
            "https://h.example/?token=Uv9%2FWx2%2BYz5%3DAb8c",
        ),
    ];
    let ep = "pool/runlogs/t51_L0_s10101";
    let dir = fixture_dir(&Spec::default());
    let marked: String = keys.iter().map(|(_, _, m)| format!("{m}\n")).collect();
    std::fs::write(dir.path().join(ep).join("prompt.txt"), marked).unwrap();
    let mut trace = std::fs::read_to_string(dir.path().join(ep).join("qwen_stream.jsonl")).unwrap();
    for (_, k, _) in &keys {
        let said = serde_json::json!({"type": "assistant", "message": {"content": [{"type": "text", "text": format!("I used {k} there.")}]}});
        trace.push_str(&format!("{said}\n"));
    }
    std::fs::write(dir.path().join(ep).join("qwen_stream.jsonl"), trace).unwrap();
    // A short key in a path: no secret to learn (too short), the
    // parameter's value taken where it stands.
    let gz = dir.path().join(ep).join("api_requests.jsonl.gz");
    let log = gunzip(&std::fs::read(&gz).unwrap()).replace("/v1/models", "/v1/models?key=abc1234");
    std::fs::write(&gz, fixture::gzip(log.as_bytes())).unwrap();
    let (_d, l, r) = import(dir.path());
    head_of(&r);
    let all = everything(&l);
    for (rule, k, _) in keys {
        assert_eq!(holds(&all, k), 0, "{rule}: {k} is in the ledger");
    }
    assert_eq!(
        holds(&all, "Uv9%2FWx2%2BYz5%3DAb8c"),
        0,
        "the encoded form is in the ledger"
    );
    assert_eq!(
        holds(&all, "abc1234"),
        0,
        "the short query key is in the ledger"
    );
}

/// What would count twice is refused with its file and line, not merged.
#[test]
fn duplicates_are_refused_not_merged() {
    let cases: Vec<(&str, Spoil, &str)> = vec![
        (
            "rank twice",
            Box::new(|p: &Path| {
                let f = p.join("selection/task51_ranked.json");
                let mut v: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
                v[1]["rank"] = 1.into();
                std::fs::write(&f, serde_json::to_vec(&v).unwrap()).unwrap();
            }),
            "selection/task51_ranked.json:2: rank 1 is given twice",
        ),
        (
            "step twice",
            Box::new(|p: &Path| {
                let f = p.join("training/train_log.jsonl");
                let t = std::fs::read_to_string(&f).unwrap();
                let second = t.lines().nth(1).unwrap().to_string();
                std::fs::write(&f, format!("{t}{second}\n")).unwrap();
            }),
            "training/train_log.jsonl:4: step 10 is logged twice",
        ),
        (
            "both logs",
            Box::new(|p: &Path| {
                let ep = p.join("pool/runlogs/t51_L0_s10102");
                let log = gunzip(&std::fs::read(ep.join("api_requests.jsonl.gz")).unwrap());
                std::fs::write(ep.join("api_requests.jsonl"), log).unwrap();
            }),
            "pool/runlogs/t51_L0_s10102/api_requests.jsonl: is next to api_requests.jsonl.gz",
        ),
    ];
    for (what, spoil, says) in cases {
        let dir = fixture_dir(&Spec::default());
        spoil(dir.path());
        let (e, _l, _d) = expect_err(dir.path(), Caps::default());
        assert!(e.contains(says), "{what}: {e}");
    }
}

/// The fixture's `evaluation/external.jsonl`, line by line.
fn external_rows(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("evaluation/external.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What each evaluation (split, judge) must show, counted here from the
/// file's lines as the reference and the articles count: judgments won by
/// the pair's `a`, by its `b`, tied; pairs won by the majority of their
/// judgments; judgments that showed `a` first. Task 60 is the fixture
/// config's test task, 51 its training task.
fn oracle(rows: &[serde_json::Value]) -> BTreeMap<(String, String), [u32; 8]> {
    let mut per_pair: BTreeMap<(String, String, String), (u32, u32)> = BTreeMap::new();
    let mut out: BTreeMap<(String, String), [u32; 8]> = BTreeMap::new();
    for r in rows {
        let split = if r["pair"]["task"] == 60 {
            "heldout"
        } else {
            "train"
        };
        let key = (
            split.to_string(),
            r["provider"].as_str().unwrap().to_string(),
        );
        let f = out.entry(key.clone()).or_default();
        let w = r["winner"].as_str().unwrap();
        f[0] += 1;
        f[1] += u32::from(w == "A");
        f[2] += u32::from(w == "B");
        f[3] += u32::from(w == "tie");
        f[7] += u32::from(r["swapped"] == false);
        let pair = per_pair
            .entry((key.0, key.1, r["pair"]["a"].to_string()))
            .or_default();
        pair.0 += u32::from(w == "A");
        pair.1 += u32::from(w == "B");
    }
    for ((split, judge, _), (a, b)) in per_pair {
        let f = out.get_mut(&(split, judge)).unwrap();
        f[4] += 1;
        // A tied pair goes in no column here: the test checks pairs =
        // wins + losses + ties.
        match a.cmp(&b) {
            std::cmp::Ordering::Greater => f[5] += 1,
            std::cmp::Ordering::Less => f[6] += 1,
            std::cmp::Ordering::Equal => {}
        }
    }
    out
}

/// The run's `mass.evaluation` records (oldest first) and the cycle's links.
fn evaluations(l: &Ledger, head: Id) -> (Vec<(Id, schemas::Evaluation)>, Vec<Id>) {
    let mut evals = Vec::new();
    let mut linked = Vec::new();
    for e in l.chain(head) {
        let e = e.unwrap();
        match e.kind.as_str() {
            "mass.evaluation" => evals.push((e.id, schemas::decode_event(&e).unwrap())),
            "mass.cycle" => {
                let c: schemas::Cycle = schemas::decode_event(&e).unwrap();
                linked = c.evaluations.iter().map(|h| Id(h.0)).collect();
            }
            _ => {}
        }
    }
    evals.reverse();
    (evals, linked)
}

#[test]
fn external_judgments_become_the_cycles_evaluations() {
    let spec = Spec {
        external: true,
        ..Spec::default()
    };
    let dir = fixture_dir(&spec);
    let rows = external_rows(dir.path());
    assert_eq!(rows.len(), 18);
    let (_d, l, r) = import(dir.path());
    let head = head_of(&r);
    let (evals, linked) = evaluations(&l, head);
    assert_eq!(evals.len(), 4, "one per split and judge");
    assert_eq!(linked, evals.iter().map(|e| e.0).collect::<Vec<_>>());
    let want = oracle(&rows);
    let mut judged = 0;
    for (_, e) in &evals {
        let f = want[&(e.split.clone(), e.judge.clone())];
        let got = [
            e.judgments.len() as u32,
            e.judgment_wins,
            e.judgment_losses,
            e.judgment_ties,
            e.pairs,
            e.wins,
            e.losses,
            e.model_first,
        ];
        assert_eq!(got, f, "{} by {}", e.split, e.judge);
        assert_eq!(e.pairs, e.wins + e.losses + e.ties);
        assert_eq!(e.verdicts, e.judgments.len() as u32);
        assert_eq!(
            (e.against.as_str(), e.model.as_str(), e.baseline.as_str()),
            ("other-run", "Qwen/Qwen3.6-27B-FP8", fixture::OTHER_RUN)
        );
        assert!(!e.self_judge && e.cycle == 1);
        for j in &e.judgments {
            let j: Judgment = schemas::decode_event(&l.get_event(&Id(j.0)).unwrap()).unwrap();
            // This folder's run is its rollout; the other folder's is absent.
            let task_runs: Vec<Id> = l
                .refs()
                .unwrap()
                .into_iter()
                .filter(|(n, _)| n.starts_with(&format!("ref/c1/{}/eval/", j.task)))
                .map(|(_, h)| h)
                .collect();
            assert!(task_runs.contains(&Id(j.a.0)), "{j:?}");
            assert_eq!((j.b.0, j.conversation.0), ([0; 32], [0; 32]));
            judged += 1;
        }
    }
    assert_eq!(judged, rows.len());
    // The same folder again, elsewhere: the same head.
    let again = fixture_dir(&spec);
    let (_d2, _l2, r2) = import(again.path());
    assert_eq!(head_of(&r2), head);
}

#[test]
fn bad_external_lines_are_refused_by_line_and_leave_the_ledger_byte_identical() {
    type Edit = Box<dyn Fn(&mut Vec<String>)>;
    let set = |line: usize, f: fn(&mut serde_json::Value)| -> Edit {
        Box::new(move |lines: &mut Vec<String>| {
            let mut v: serde_json::Value = serde_json::from_str(&lines[line - 1]).unwrap();
            f(&mut v);
            lines[line - 1] = v.to_string();
        })
    };
    let cases: Vec<(Edit, &str)> = vec![
        (
            set(8, |v| {
                v["pair"]["a"] = "/abs/runs/demo/evaluation/workspaces/query60_r7".into();
                v["pair"]["b"] = "/abs/runs/L0-other/evaluation/workspaces/query60_r7".into();
            }),
            ":8: names episode evaluation/logs/query60_r7, which the folder does not hold",
        ),
        (set(3, |v| v["winner"] = "C".into()), ":3: winner is not"),
        (
            Box::new(|lines: &mut Vec<String>| {
                let last = lines.pop().unwrap();
                lines.push(last[..last.len() / 2].to_string());
            }),
            ":18: invalid JSON",
        ),
        (
            set(5, |v| {
                v["pair"]["a"] = "/abs/runs/L1/evaluation/workspaces/query60_r0".into();
            }),
            ":5: neither run of the pair is this folder's",
        ),
        (
            Box::new(|lines: &mut Vec<String>| lines.push(lines[0].clone())),
            ":19: the pair of line 1 is judged again",
        ),
        (
            set(2, |v| {
                v.as_object_mut().unwrap().remove("swapped");
            }),
            ":2: no boolean \"swapped\"",
        ),
    ];
    let spec = Spec {
        external: true,
        ..Spec::default()
    };
    let (d, l) = ledger();
    let good = fixture_dir(&spec);
    import::import(&l, good.path(), "ref", &Options::default()).unwrap();
    let before = files(d.path());
    for (edit, says) in cases {
        let bad = fixture_dir(&Spec {
            variant: 1,
            ..spec.clone()
        });
        let f = bad.path().join("evaluation/external.jsonl");
        let mut lines: Vec<String> = std::fs::read_to_string(&f)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        edit(&mut lines);
        std::fs::write(&f, lines.join("\n")).unwrap();
        let e = import::import(&l, bad.path(), "other", &Options::default()).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains(&format!("evaluation/external.jsonl{says}")),
            "{says}: {e}"
        );
        assert_eq!(files(d.path()), before, "{says}: the ledger changed");
        assert!(l
            .refs()
            .unwrap()
            .iter()
            .all(|(n, _)| !n.starts_with("other")));
    }
}

#[test]
fn a_key_in_an_external_verdict_reaches_no_object_and_lands_with_scrubbing_off() {
    let dir = fixture_dir(&Spec {
        key: Some(KEY.into()),
        external: true,
        ..Spec::default()
    });
    // The fixture plants the key in the second line's rationale (seed 43
    // of query60_r0 by the first judge).
    let rows = external_rows(dir.path());
    assert!(rows[1]["rationale"].as_str().unwrap().contains(KEY));
    let stream = "ref/c1/eval/heldout-other-run/query60/judge-external-1/00";
    let rationales = |l: &Ledger| -> Vec<String> {
        let head = l.head(stream).unwrap().expect("the judge's stream");
        l.chain(head)
            .map(|e| {
                schemas::decode_event::<Judgment>(&e.unwrap())
                    .unwrap()
                    .rationale
            })
            .collect()
    };
    let (_d, l, r) = import(dir.path());
    head_of(&r);
    assert_eq!(
        holds(&everything(&l), KEY),
        0,
        "the planted key is in the ledger"
    );
    assert!(
        rationales(&l).iter().any(|r| r.contains("REDACTED")),
        "{:?}",
        rationales(&l)
    );
    let (_d2, l2) = ledger();
    let off = Options {
        unscrubbed_for_tests: true,
        ..Options::default()
    };
    import::import(&l2, dir.path(), "ref", &off).unwrap();
    assert!(rationales(&l2).iter().any(|r| r.contains(KEY)));
}

/// Review finding (honesty of imported times): a request the proxy logged
/// without `ts_start` was given its episode's `started_at` as a logged
/// time, so `export tables`' `model_calls.wall_ms` showed the episode's
/// start as the call's time, as if measured. It is a stand-in: marked.
#[test]
fn a_request_without_ts_start_gets_a_marked_stand_in_time() {
    let dir = fixture_dir(&Spec::default());
    let log = dir
        .path()
        .join("pool/runlogs/t51_L0_s10100/api_requests.jsonl.gz");
    let lines: Vec<String> = gunzip(&std::fs::read(&log).unwrap())
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if v["seq"] == 2 {
                v.as_object_mut().unwrap().remove("ts_start");
            }
            format!("{v}\n")
        })
        .collect();
    std::fs::write(&log, fixture::gzip(lines.concat().as_bytes())).unwrap();
    let (_d, l, r) = import(dir.path());
    head_of(&r);
    let orch = l.head("ref/c1/query51/collect/00/orch").unwrap().unwrap();
    let mut unknown = Vec::new();
    for e in l.chain(orch) {
        let e = e.unwrap();
        let meta = l.get_meta(&e.id).unwrap();
        if e.kind == "effect" && meta.known_wall_ms().is_none() {
            unknown.push(meta.extra[ledger::WALL_MS_FROM].clone());
        }
    }
    assert_eq!(
        unknown,
        ["episode start (no ts_start)"],
        "the one request without ts_start has a marked stand-in time"
    );
}

/// Review finding (ids do not cover metadata): a ledger keeps the
/// metadata of an event's first write. A folder imported by a mass older
/// than the stand-in and not-recorded marks (`ledger::WALL_MS_FROM`,
/// `ledger::NOT_RECORDED`) holds the same ids without the marks, so its
/// report shows file mtimes and placeholders as measured, and importing
/// the folder again said only "already holds this import". It must say
/// that the run's events lack the marks.
#[test]
fn an_import_by_an_older_mass_without_the_marks_is_reported() {
    let dir = fixture_dir(&Spec::default());
    let (_d, marked, r) = import(dir.path());
    let head = head_of(&r);
    // The same objects and refs as an older mass wrote them: metadata
    // without the marks.
    let (_d2, l) = ledger();
    let mut b = l.batch();
    for (id, _) in marked.locations().unwrap() {
        let (kind, raw) = marked.raw_object(&id).unwrap();
        let meta = if kind == ObjectKind::Event {
            let mut m = marked.get_meta(&id).unwrap();
            m.extra.remove(ledger::WALL_MS_FROM);
            m.extra.remove(ledger::NOT_RECORDED);
            serde_json::to_vec(&m).unwrap()
        } else {
            Vec::new()
        };
        b.put_raw(kind, raw, meta).unwrap();
    }
    for (name, h) in marked.refs().unwrap() {
        b.set_ref(&name, None, h).unwrap();
    }
    b.commit().unwrap();
    let started = l.chain(head).map(|e| e.unwrap()).last().unwrap();
    assert!(
        l.get_meta(&started.id).unwrap().known_wall_ms().is_some(),
        "the older import's stand-in reads as a time"
    );
    let again = import::import(&l, dir.path(), "ref", &Options::default()).unwrap();
    match again {
        Outcome::AlreadyImported { unmarked, .. } => {
            assert!(unmarked > 0, "{again:?}")
        }
        other => panic!("{other:?}"),
    }
    // The same folder under another name shares those events: said too.
    let other = import::import(&l, dir.path(), "other", &Options::default()).unwrap();
    match other {
        Outcome::Imported { unmarked, .. } => assert!(unmarked > 0, "{other:?}"),
        o => panic!("{o:?}"),
    }
    // A ledger the current mass wrote: nothing unmarked.
    let again = import::import(&marked, dir.path(), "ref", &Options::default()).unwrap();
    assert_eq!(again, Outcome::AlreadyImported { head, unmarked: 0 });
}

/// Every episode's rollout stream and the workspace folder the fixture
/// wrote for it (the reference's layout).
const WORKSPACES: [(&str, &str); 8] = [
    ("c1/query51/reference/00/orch", "reference/query51"),
    ("c1/query51/inner/00/orch", "workspaces/v0/query51_ourTeam"),
    ("c1/query51/inner/01/orch", "workspaces/v1/query51_ourTeam"),
    (
        "c1/query51/collect/00/orch",
        "pool/workspaces/t51_L0_s10100",
    ),
    (
        "c1/query51/collect/01/orch",
        "pool/workspaces/t51_L0_s10101",
    ),
    (
        "c1/query51/collect/02/orch",
        "pool/workspaces/t51_L0_s10102",
    ),
    (
        "c1/query51/collect/03/orch",
        "pool/workspaces/t51_L0_s10103",
    ),
    (
        "c1/query60/eval/00/orch",
        "evaluation/workspaces/query60_r0",
    ),
];

/// The rollout ending stream `rel` of run `ref`, and its metadata.
fn rollout_at(l: &Ledger, rel: &str) -> (Rollout, ledger::Meta) {
    let id = l.head(&format!("ref/{rel}")).unwrap().unwrap();
    let ro: Rollout = schemas::decode_event(&l.get_event(&id).unwrap()).unwrap();
    (ro, l.get_meta(&id).unwrap())
}

/// Everything beneath `dir` as the test sees it with std::fs (no link
/// followed): path -> ("file", bytes) / ("link", target) / ("dir", empty).
fn listing(dir: &Path) -> BTreeMap<String, (&'static str, Vec<u8>)> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_str().unwrap().to_string();
            let t = std::fs::symlink_metadata(&p).unwrap().file_type();
            let v = if t.is_symlink() {
                (
                    "link",
                    std::fs::read_link(&p)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                )
            } else if t.is_dir() {
                todo.push(p.clone());
                ("dir", Vec::new())
            } else {
                ("file", std::fs::read(&p).unwrap())
            };
            out.insert(rel, v);
        }
    }
    out
}

/// Part 1 of issue #31: each rollout's tree is its workspace, file for
/// file (a checkout gives back exactly what the test wrote), the same tree
/// the engine's own snapshot of that folder makes, marked as the run
/// folder's at import. Fails with workspaces not imported (zero trees).
#[test]
fn each_rollouts_tree_is_its_workspace_as_the_folder_holds_it() {
    let dir = fixture_dir(&Spec::default());
    let (_d, l, r) = import(dir.path());
    head_of(&r);
    let (_e, engine) = ledger();
    for (rel, ws) in WORKSPACES {
        let (ro, meta) = rollout_at(&l, rel);
        assert_ne!(ro.tree.0, [0; 32], "{rel}: no tree");
        assert_eq!(ro.validation.0, [0; 32], "{rel}: checks stay absent");
        let written = dir.path().join(ws);
        let out = tempfile::tempdir().unwrap();
        let dest = out.path().join("co");
        l.checkout(&Id(ro.tree.0), &dest).unwrap();
        assert_eq!(listing(&dest), listing(&written), "{rel}");
        assert!(listing(&written).contains_key("src/solve.py"));
        let oracle = engine.snapshot_dir(&written).unwrap();
        assert_eq!(Id(ro.tree.0), oracle, "{rel}: not the engine's tree");
        assert_eq!(meta.tree_from(), Some("run folder at import"), "{rel}");
        assert!(meta.tree_scrubbed().is_empty(), "{rel}");
        assert!(meta.not_recorded("score_passed"), "{rel}");
    }
}

/// A workspace the folder lacks leaves that rollout's tree not recorded
/// (the zero id, no mark) and the others recorded.
#[test]
fn a_missing_workspace_leaves_only_its_rollout_not_recorded() {
    let dir = fixture_dir(&Spec::default());
    std::fs::remove_dir_all(dir.path().join("pool/workspaces/t51_L0_s10102")).unwrap();
    let (_d, l, r) = import(dir.path());
    head_of(&r);
    for (rel, _) in WORKSPACES {
        let (ro, meta) = rollout_at(&l, rel);
        if rel == "c1/query51/collect/02/orch" {
            assert_eq!(ro.tree.0, [0; 32], "{rel}");
            assert_eq!(meta.tree_from(), None, "{rel}");
        } else {
            assert_ne!(ro.tree.0, [0; 32], "{rel}");
            assert!(meta.tree_from().is_some(), "{rel}");
        }
    }
}

/// A link in a workspace is recorded as a link (its target text), never
/// followed: the file it points to outside the folder is in no object,
/// nor a folder's files behind a linked folder. A link on the way to a
/// workspace (the workspace folder itself, or `pool/workspaces`) is
/// refused by name, as every link in the run folder is.
#[test]
fn a_link_in_a_workspace_is_recorded_as_a_link_and_never_followed() {
    const OUTSIDE: &str = "OUTSIDE-THE-RUN-FOLDER-7d1c";
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), OUTSIDE).unwrap();
    let dir = fixture_dir(&Spec::default());
    let ws = dir.path().join("pool/workspaces/t51_L0_s10101");
    let target = outside.path().join("secret.txt");
    link(&target, &ws.join("data.txt"));
    link(outside.path(), &ws.join("src/linked"));
    let (_d, l, r) = import(dir.path());
    head_of(&r);
    assert_eq!(holds(&everything(&l), OUTSIDE), 0, "a link was followed");
    let (ro, _) = rollout_at(&l, "c1/query51/collect/01/orch");
    let t = l.get_tree(&Id(ro.tree.0)).unwrap();
    for (path, to) in [
        ("data.txt", &target),
        ("src/linked", &outside.path().to_path_buf()),
    ] {
        let e = t
            .get(path)
            .unwrap_or_else(|| panic!("{path} not in the tree"));
        assert_eq!(e.kind, ledger::EntryKind::Symlink, "{path}");
        let blob = l.get_blob(&e.blob_id().unwrap()).unwrap();
        assert_eq!(blob, to.to_str().unwrap().as_bytes(), "{path}");
    }
    assert!(t.get("src/linked/secret.txt").is_none());
    for rel in ["pool/workspaces/t51_L0_s10101", "pool/workspaces"] {
        let dir = fixture_dir(&Spec::default());
        link(outside.path(), &dir.path().join(rel));
        let (_d, l, r) = import(dir.path());
        match r {
            Err(ImportError::Symlink { file }) => assert_eq!(file, rel),
            other => panic!("{rel}: {other:?}"),
        }
        assert!(l.refs().unwrap().is_empty());
    }
}

/// A key the agent wrote only into its workspace (`api_key = ...` in a
/// script, bare in a note) is learnt from the workspace and reaches no
/// object, and the rollout names the files recorded with it replaced; with
/// scrubbing off it lands, so the scan would see it.
#[test]
fn a_key_only_in_a_workspace_reaches_no_object_and_its_files_are_named() {
    const WS_KEY: &str = "wsonly9f8e7d6c5b4a3210";
    let dir = fixture_dir(&Spec::default());
    let ws = dir.path().join("pool/workspaces/t51_L0_s10101");
    std::fs::write(
        ws.join("src/config.py"),
        format!("api_key = \"{WS_KEY}\"\n"),
    )
    .unwrap();
    std::fs::write(ws.join("notes.txt"), format!("used {WS_KEY} once\n")).unwrap();
    let (_d, l, r) = import(dir.path());
    head_of(&r);
    let all = everything(&l);
    assert_eq!(
        holds(&all, WS_KEY),
        0,
        "the workspace's key is in the ledger"
    );
    let (ro, meta) = rollout_at(&l, "c1/query51/collect/01/orch");
    assert_eq!(meta.tree_scrubbed(), ["notes.txt", "src/config.py"]);
    let t = l.get_tree(&Id(ro.tree.0)).unwrap();
    let note = l
        .get_blob(&t.get("notes.txt").unwrap().blob_id().unwrap())
        .unwrap();
    assert_eq!(note, b"used REDACTED once\n");
    assert_eq!(t.get("notes.txt").unwrap().size, note.len() as u64);
    let (_o, other) = rollout_at(&l, "c1/query51/collect/00/orch");
    assert!(other.tree_scrubbed().is_empty());
    let (_d2, l2) = ledger();
    let off = Options {
        unscrubbed_for_tests: true,
        ..Options::default()
    };
    import::import(&l2, dir.path(), "ref", &off).unwrap();
    assert_eq!(
        holds(&everything(&l2), WS_KEY),
        2,
        "the scan would not see it"
    );
}

/// What the import refuses in a workspace, each named by its path: a FIFO
/// (never opened), a file with another hard link, a workspace past the
/// snapshot limits, and a `pool.json` row whose workspace is another
/// episode's. Nothing is written.
#[test]
fn hostile_workspaces_are_refused_by_path_and_nothing_is_written() {
    let ws = "pool/workspaces/t51_L0_s10101";
    let fifo = move |d: &Path| {
        let p = std::ffi::CString::new(d.join(ws).join("pipe").to_str().unwrap()).unwrap();
        // SAFETY: a valid path string; the result is checked.
        assert_eq!(unsafe { libc::mkfifo(p.as_ptr(), 0o600) }, 0);
    };
    let hard = move |d: &Path| {
        std::fs::hard_link(d.join(ws).join("report.md"), d.join("elsewhere.md")).unwrap();
    };
    let pool = |d: &Path| {
        let p = d.join("pool.json");
        let text = std::fs::read_to_string(&p).unwrap();
        let swapped = text.replacen(
            "pool/workspaces/t51_L0_s10101\"",
            "pool/workspaces/t51_L0_s10100\"",
            1,
        );
        assert_ne!(swapped, text);
        std::fs::write(&p, swapped).unwrap();
    };
    type Plant = Box<dyn Fn(&Path)>;
    let cases: [(Plant, &str, &str); 3] = [
        (Box::new(fifo), "/pipe", "special file"),
        (Box::new(hard), "/report.md", "hard links"),
        (Box::new(pool), "pool.json:", "not its own"),
    ];
    for (plant, file, why) in cases {
        let dir = fixture_dir(&Spec::default());
        plant(dir.path());
        let (msg, l, _d) = expect_err(dir.path(), Caps::default());
        assert!(msg.contains(file) && msg.contains(why), "{msg}");
        assert!(l.refs().unwrap().is_empty());
    }
    let dir = fixture_dir(&Spec::default());
    let limits = ledger::tree::SnapshotLimits {
        max_entries: 3,
        max_bytes: 1 << 30,
    };
    let caps = Caps {
        workspace: limits,
        ..Caps::default()
    };
    let (msg, _l, _d) = expect_err(dir.path(), caps);
    assert!(
        msg.contains("reference/query51") && msg.contains("more than 3 entries"),
        "{msg}"
    );
}

/// A workspace with more files holding a key than its rollout's metadata
/// can name (over 1 MiB of paths) is refused, naming the workspace, rather
/// than marked in part.
#[test]
fn a_workspace_whose_scrubbed_files_cannot_all_be_named_is_refused() {
    let dir = fixture_dir(&Spec {
        key: Some(KEY.into()),
        ..Spec::default()
    });
    let many = dir.path().join("pool/workspaces/t51_L0_s10102/many");
    std::fs::create_dir_all(&many).unwrap();
    for i in 0..9_000 {
        let name = format!("{i:05}-{}", "n".repeat(110));
        std::fs::write(many.join(name), KEY).unwrap();
    }
    let (msg, _l, _d) = expect_err(dir.path(), Caps::default());
    assert!(
        msg.contains("pool/workspaces/t51_L0_s10102") && msg.contains("9002 files recorded"),
        "{msg}"
    );
}
