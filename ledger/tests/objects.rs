//! Round trips of every object kind, trees against real directories, id
//! abbreviation, refs and forks, bad input, and the single-process lock.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use ledger::{Id, Ledger, LedgerError, NewEvent, ObjectKind};

fn new_ledger() -> (tempfile::TempDir, Ledger) {
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::init(&dir.path().join("l")).unwrap();
    (dir, l)
}

#[test]
fn blob_round_trip_small_large_and_empty() {
    let (_d, l) = new_ledger();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 97) as u8).collect();
    for data in [Vec::new(), b"x".to_vec(), big.clone()] {
        let id = l.put_blob(&data).unwrap();
        assert_eq!(id, Id::of(ObjectKind::Blob, &data));
        assert_eq!(l.get_blob(&id).unwrap(), data);
    }
    // Compressible content is stored compressed.
    let loc = l.locate(&Id::of(ObjectKind::Blob, &big)).unwrap().unwrap();
    assert!(
        (loc.body_len as usize) < big.len() / 10,
        "{} stored bytes",
        loc.body_len
    );
}

#[test]
fn identical_bytes_are_stored_once() {
    let (_d, l) = new_ledger();
    let a = l.put_blob(b"same content").unwrap();
    let before = l.locations().unwrap().len();
    let b = l.put_blob(b"same content").unwrap();
    assert_eq!(a, b);
    assert_eq!(l.locations().unwrap().len(), before);
}

#[test]
fn event_round_trip_with_links_and_meta() {
    let (_d, l) = new_ledger();
    let blob = l.put_blob(b"body").unwrap();
    let e0 = l
        .append(
            "s",
            None,
            NewEvent::new("k.one", 3, vec![1, 2, 3])
                .with_refs(vec![blob])
                .with_meta("latency_ms", "41"),
        )
        .unwrap();
    let other = l
        .append("t", None, NewEvent::new("k.two", 1, vec![]))
        .unwrap();
    let e1 = l
        .append(
            "s",
            Some(e0),
            NewEvent::new("k.one", 3, vec![4]).with_parents(vec![other]),
        )
        .unwrap();
    let ev = l.get_event(&e1).unwrap();
    assert_eq!(
        (ev.kind.as_str(), ev.version, ev.stream.as_str(), ev.seq),
        ("k.one", 3, "s", 1)
    );
    assert_eq!(ev.prev, Some(e0));
    assert_eq!(ev.parents, vec![other]);
    let ev0 = l.get_event(&e0).unwrap();
    assert_eq!(ev0.refs, vec![blob]);
    assert_eq!(ev0.payload, vec![1, 2, 3]);
    let meta = l.get_meta(&e0).unwrap();
    assert_eq!(meta.extra.get("latency_ms").map(String::as_str), Some("41"));
    assert_eq!(meta.pid, std::process::id());
    assert!(meta.wall_ms > 0);
    assert_eq!(l.referrers(&e0).unwrap(), vec![e1]);
    assert_eq!(l.referrers(&other).unwrap(), vec![e1]);
    // A ref is a link too: the blob e0 names finds e0.
    assert_eq!(l.referrers(&blob).unwrap(), vec![e0]);
    assert_eq!(
        l.events_newest_first(Some("k.one"), 10).unwrap(),
        vec![e1, e0]
    );
    let chain: Vec<Id> = l.chain(e1).map(|e| e.unwrap().id).collect();
    assert_eq!(chain, vec![e1, e0]);
}

#[test]
fn wrong_kind_reads_are_refused() {
    let (_d, l) = new_ledger();
    let b = l.put_blob(b"abc").unwrap();
    assert!(matches!(
        l.get_event(&b),
        Err(LedgerError::WrongKind {
            expected: ObjectKind::Event,
            actual: ObjectKind::Blob,
            ..
        })
    ));
    assert!(matches!(l.get_tree(&b), Err(LedgerError::WrongKind { .. })));
    // Regression: the message said "is a event".
    let e = l.append("s", None, NewEvent::new("k", 1, vec![])).unwrap();
    let msg = l.get_tree(&e).unwrap_err().to_string();
    assert!(msg.ends_with(" is an event, not a tree"), "{msg}");
}

#[test]
fn compare_and_swap_conflict_names_both_heads() {
    let (_d, l) = new_ledger();
    let e0 = l.append("r", None, NewEvent::new("k", 1, vec![0])).unwrap();
    let e1 = l
        .append("r", Some(e0), NewEvent::new("k", 1, vec![1]))
        .unwrap();
    let err = l
        .append("r", Some(e0), NewEvent::new("k", 1, vec![2]))
        .unwrap_err();
    match &err {
        LedgerError::Conflict {
            name,
            expected,
            actual,
        } => {
            assert_eq!(name, "r");
            assert_eq!(*expected, Some(e0));
            assert_eq!(*actual, Some(e1));
        }
        other => panic!("expected a conflict, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&e0.to_hex()) && msg.contains(&e1.to_hex()),
        "{msg}"
    );
    // Creating a ref that exists is a conflict too.
    assert!(matches!(
        l.append("r", None, NewEvent::new("k", 1, vec![3])),
        Err(LedgerError::Conflict { .. })
    ));
    // A failed append leaves nothing behind.
    assert_eq!(l.head("r").unwrap(), Some(e1));
}

#[test]
fn fork_is_a_new_head_sharing_history() {
    let (_d, l) = new_ledger();
    let e0 = l
        .append("main", None, NewEvent::new("k", 1, vec![0]))
        .unwrap();
    let e1 = l
        .append("main", Some(e0), NewEvent::new("k", 1, vec![1]))
        .unwrap();
    l.fork("exp", e0).unwrap();
    let f1 = l
        .append("exp", Some(e0), NewEvent::new("k", 1, vec![9]))
        .unwrap();
    assert_eq!(l.head("main").unwrap(), Some(e1));
    assert_eq!(l.head("exp").unwrap(), Some(f1));
    let fe = l.get_event(&f1).unwrap();
    assert_eq!((fe.stream.as_str(), fe.seq, fe.prev), ("main", 1, Some(e0)));
    assert!(matches!(
        l.fork("exp", e1),
        Err(LedgerError::Conflict { .. })
    ));
    let blob = l.put_blob(b"not an event").unwrap();
    assert!(matches!(
        l.fork("bad", blob),
        Err(LedgerError::WrongKind { .. })
    ));
    assert!(matches!(
        l.fork("bad", Id([7; 32])),
        Err(LedgerError::Dangling { .. })
    ));
}

#[test]
fn dangling_links_are_refused() {
    let (_d, l) = new_ledger();
    let missing = Id([0x42; 32]);
    let err = l
        .append(
            "s",
            None,
            NewEvent::new("k", 1, vec![]).with_refs(vec![missing]),
        )
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::Dangling { missing: m, .. } if m == missing),
        "{err}"
    );
    assert_eq!(l.head("s").unwrap(), None);
}

#[test]
fn batch_is_atomic() {
    let (_d, l) = new_ledger();
    let e0 = l.append("a", None, NewEvent::new("k", 1, vec![])).unwrap();
    let _e1 = l
        .append("a", Some(e0), NewEvent::new("k", 1, vec![1]))
        .unwrap();
    let mut b = l.batch();
    let blob = b.put_blob(b"in batch").unwrap();
    b.append(
        "b",
        None,
        NewEvent::new("k", 1, vec![]).with_refs(vec![blob]),
    )
    .unwrap();
    b.append("a", Some(e0), NewEvent::new("k", 1, vec![2]))
        .unwrap(); // stale: conflicts
    assert!(b.commit().is_err());
    assert!(!l.contains(&blob).unwrap());
    assert_eq!(l.head("b").unwrap(), None);
}

#[test]
fn abbreviations_resolve_and_ambiguity_is_reported() {
    let (_d, l) = new_ledger();
    let id = l.put_blob(b"one blob").unwrap();
    assert_eq!(l.resolve(&id.short(8)).unwrap(), id);
    assert_eq!(l.resolve(&id.short(13)).unwrap(), id); // odd length
    assert_eq!(l.resolve(&id.to_hex().to_uppercase()).unwrap(), id);
    assert!(matches!(
        l.resolve(&id.short(7)),
        Err(LedgerError::MalformedId { .. })
    ));
    // Two contents whose ids share 8 hex digits: by the birthday bound about
    // 77k candidates are hashed in memory; only the colliding pair is stored.
    let mut by_prefix: std::collections::HashMap<String, Vec<u8>> =
        std::collections::HashMap::new();
    let (a, b) = (0u64..)
        .find_map(|i| {
            let data = i.to_le_bytes().to_vec();
            let p = Id::of(ObjectKind::Blob, &data).short(8);
            by_prefix.insert(p, data.clone()).map(|other| (other, data))
        })
        .unwrap();
    let (ia, ib) = (l.put_blob(&a).unwrap(), l.put_blob(&b).unwrap());
    let shared = ia.short(8);
    match l.resolve(&shared) {
        Err(LedgerError::Ambiguous { prefix, candidates }) => {
            assert_eq!(prefix, shared);
            assert!(candidates.contains(&ia) && candidates.contains(&ib));
        }
        other => panic!("expected ambiguity, got {other:?}"),
    }
    let msg = l.resolve(&shared).unwrap_err().to_string();
    assert!(
        msg.contains("ambiguous") && msg.contains(&ia.short(16)) && msg.contains(&ib.short(16)),
        "{msg}"
    );
    // A longer prefix that tells them apart resolves.
    let n = (8..64).find(|&n| ia.short(n) != ib.short(n)).unwrap();
    assert_eq!(l.resolve(&ia.short(n)).unwrap(), ia);
    assert!(matches!(
        l.resolve("0000000000000000dead"),
        Err(LedgerError::NotFound { .. })
    ));
}

#[test]
fn malformed_ids_and_ref_names_get_clear_errors() {
    let (_d, l) = new_ledger();
    for (input, needle) in [
        ("zz", "not a hex digit"),
        ("abc", "at least 8"),
        (&"a".repeat(65)[..], "at most 64"),
    ] {
        let e = l.resolve(input).unwrap_err().to_string();
        assert!(e.contains(needle), "{input}: {e}");
    }
    for name in ["", "a b", "../x", "a//b", "x/./y"] {
        let e = l
            .append(name, None, NewEvent::new("k", 1, vec![]))
            .unwrap_err();
        assert!(matches!(e, LedgerError::BadRefName { .. }), "{name:?}: {e}");
    }
}

fn write(p: &Path, data: &[u8], mode: u32) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, data).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn snapshot_and_checkout_are_byte_for_byte_with_modes_and_links() {
    let (d, l) = new_ledger();
    let src = d.path().join("ws");
    write(&src.join("data/prices.csv"), b"date,close\n1,2\n", 0o644);
    write(&src.join("bin/run.sh"), b"#!/bin/sh\necho hi\n", 0o755);
    write(&src.join("secret.txt"), b"0600", 0o600);
    fs::create_dir_all(src.join("empty/nested")).unwrap();
    symlink("data/prices.csv", src.join("latest")).unwrap();
    symlink("/etc/passwd", src.join("outside")).unwrap();
    let t = l.snapshot_dir(&src).unwrap();
    let dest = d.path().join("out");
    l.checkout(&t, &dest).unwrap();
    // Same tree when snapshotting the checkout: contents, modes and links agree.
    assert_eq!(l.snapshot_dir(&dest).unwrap(), t);
    assert_eq!(
        fs::read(dest.join("bin/run.sh")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    assert_eq!(
        fs::metadata(dest.join("bin/run.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    assert_eq!(
        fs::metadata(dest.join("secret.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert!(dest.join("empty/nested").is_dir());
    // Links are recreated as links, never followed.
    assert_eq!(
        fs::read_link(dest.join("outside")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert!(fs::symlink_metadata(dest.join("latest"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn checkout_refuses_a_non_empty_directory() {
    let (d, l) = new_ledger();
    let src = d.path().join("ws");
    write(&src.join("a"), b"1", 0o644);
    let t = l.snapshot_dir(&src).unwrap();
    let e = l.checkout(&t, &src).unwrap_err();
    assert!(e.to_string().contains("not empty"), "{e}");
}

#[test]
fn diff_lists_added_removed_modified() {
    let (d, l) = new_ledger();
    let a = d.path().join("a");
    write(&a.join("same"), b"1", 0o644);
    write(&a.join("changed"), b"1", 0o644);
    write(&a.join("mode"), b"1", 0o644);
    write(&a.join("gone"), b"1", 0o644);
    let ta = l.snapshot_dir(&a).unwrap();
    write(&a.join("changed"), b"2", 0o644);
    fs::set_permissions(a.join("mode"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::remove_file(a.join("gone")).unwrap();
    write(&a.join("new"), b"1", 0o644);
    let tb = l.snapshot_dir(&a).unwrap();
    let d: Vec<String> = ledger::tree::diff(&l.get_tree(&ta).unwrap(), &l.get_tree(&tb).unwrap())
        .iter()
        .map(|c| format!("{} {}", c.letter(), c.path()))
        .collect();
    assert_eq!(d, ["M changed", "D gone", "M mode", "A new"]);
}

#[test]
fn second_opener_gets_the_lock_error() {
    let (d, l) = new_ledger();
    let err = Ledger::open(&d.path().join("l")).expect_err("second open must fail");
    let msg = err.to_string();
    assert!(matches!(err, LedgerError::Locked { .. }), "{msg}");
    assert!(
        msg.contains(&format!("in use by pid {}", std::process::id())),
        "{msg}"
    );
    drop(l);
    Ledger::open(&d.path().join("l")).unwrap();
}

#[test]
fn open_reports_missing_ledger_and_init_refuses_existing() {
    let d = tempfile::tempdir().unwrap();
    let e = Ledger::open(&d.path().join("nope")).err().unwrap();
    assert!(matches!(e, LedgerError::NotALedger { .. }), "{e}");
    let l = Ledger::init(&d.path().join("x")).unwrap();
    drop(l);
    assert!(matches!(
        Ledger::init(&d.path().join("x")),
        Err(LedgerError::AlreadyExists { .. })
    ));
}

#[test]
fn reindex_rebuilds_the_same_index() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("l");
    let l = Ledger::init(&p).unwrap();
    let b = l.put_blob(b"x").unwrap();
    let e0 = l
        .append("s", None, NewEvent::new("k", 1, vec![]).with_refs(vec![b]))
        .unwrap();
    let e1 = l
        .append("s", Some(e0), NewEvent::new("k2", 1, vec![]))
        .unwrap();
    l.fork("f", e0).unwrap();
    let refs = l.refs().unwrap();
    let locs = l.locations().unwrap();
    drop(l);
    let (l, report) = Ledger::reindex(&p).unwrap();
    assert_eq!(report.reindexed_records, 6); // 3 objects + 3 ref updates
    assert_eq!(l.refs().unwrap(), refs);
    assert_eq!(l.locations().unwrap(), locs);
    assert_eq!(l.referrers(&e0).unwrap(), vec![e1]);
    assert_eq!(l.referrers(&b).unwrap(), vec![e0]);
    assert_eq!(l.events_newest_first(Some("k2"), 5).unwrap(), vec![e1]);
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
}

/// Index tables written before refs were indexed (`MASSIDX1`) are not
/// trusted: they are ignored like damaged ones and their range scanned
/// again, so a referrer lookup on an old ledger still finds refs.
#[test]
fn an_index_table_from_before_refs_were_indexed_is_rebuilt_not_trusted() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("l");
    let l = Ledger::init(&p).unwrap();
    let b = l.put_blob(b"x").unwrap();
    let e0 = l
        .append("s", None, NewEvent::new("k", 1, vec![]).with_refs(vec![b]))
        .unwrap();
    drop(l);
    let mut tables = 0;
    for e in std::fs::read_dir(p.join("index")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "idx") {
            let mut bytes = std::fs::read(&path).unwrap();
            assert_eq!(&bytes[..8], b"MASSIDX3");
            bytes[7] = b'2';
            std::fs::write(&path, bytes).unwrap();
            tables += 1;
        }
    }
    assert!(tables > 0, "closing the ledger writes a table");
    for open in [Ledger::open_read_only, Ledger::open] {
        let l = open(&p).unwrap();
        assert_eq!(l.referrers(&b).unwrap(), vec![e0]);
    }
}

#[test]
fn segments_rotate_and_everything_stays_readable() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("l");
    let opts = ledger::Options {
        segment_max: 64 << 10,
        ..Default::default()
    };
    let l = Ledger::init_with(&p, opts.clone()).unwrap();
    let mut head = None;
    let mut ids = Vec::new();
    for i in 0..400u32 {
        let blob = l
            .put_blob(
                &[(i % 251) as u8; 700]
                    .iter()
                    .enumerate()
                    .map(|(j, b)| b ^ (j as u8).wrapping_mul(i as u8))
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        head = Some(
            l.append(
                "s",
                head,
                NewEvent::new("k", 1, i.to_le_bytes().to_vec()).with_refs(vec![blob]),
            )
            .unwrap(),
        );
        ids.push(head.unwrap());
    }
    let segs = fs::read_dir(p.join("segments")).unwrap().count();
    assert!(segs > 2, "{segs} segments");
    drop(l);
    let l = Ledger::open_with(&p, opts).unwrap();
    for id in &ids {
        l.get_event(id).unwrap();
    }
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
}

/// Regression: reopening right after dropping failed with sled's "could not
/// acquire lock" because sled releases its file lock asynchronously.
#[test]
fn reopen_immediately_after_drop() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("l");
    drop(Ledger::init(&p).unwrap());
    for i in 0..30u32 {
        let l = Ledger::open(&p).unwrap_or_else(|e| panic!("reopen {i}: {e}"));
        l.put_blob(&i.to_le_bytes()).unwrap();
        drop(l);
    }
}

/// Successive snapshots of one workspace are stored as deltas against an
/// earlier plain tree: they read back exactly, verify, survive reindexing,
/// and take much less room than the first.
#[test]
fn similar_trees_are_stored_as_deltas_and_read_back() {
    let (d, l) = new_ledger();
    let ws = d.path().join("ws");
    for i in 0..300 {
        write(
            &ws.join(format!("data/file{i:03}.csv")),
            format!("row,{i}\n").as_bytes(),
            0o644,
        );
    }
    let first = l.snapshot_dir(&ws).unwrap();
    let mut trees = vec![first];
    for v in 0..5 {
        write(
            &ws.join("report.md"),
            format!("version {v}\n").as_bytes(),
            0o644,
        );
        trees.push(l.snapshot_dir(&ws).unwrap());
    }
    let base = l.locate(&first).unwrap().unwrap();
    for t in &trees[1..] {
        let loc = l.locate(t).unwrap().unwrap();
        assert!(loc.flags & 2 != 0, "stored as a delta");
        assert!(
            loc.body_len * 4 < base.body_len,
            "delta {} vs base {}",
            loc.body_len,
            base.body_len
        );
        let tree = l.get_tree(t).unwrap();
        assert_eq!(tree.entries.len(), 300 + 1 + 1);
    }
    let out = d.path().join("out");
    l.checkout(trees.last().unwrap(), &out).unwrap();
    assert_eq!(fs::read(out.join("report.md")).unwrap(), b"version 4\n");
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    let dir = l.dir().to_path_buf();
    drop(l);
    let (l, _) = Ledger::reindex(&dir).unwrap();
    assert_eq!(l.get_tree(&trees[3]).unwrap().entries.len(), 302);
}

/// With locations preloaded, reads of old and newly committed objects agree
/// with the index, and unknown ids still fall back to it.
#[test]
fn preloaded_locations_serve_old_and_new_objects() {
    let (_d, l) = new_ledger();
    let old = l.put_blob(b"before preload").unwrap();
    let e0 = l
        .append(
            "s",
            None,
            NewEvent::new("k", 1, vec![1]).with_refs(vec![old]),
        )
        .unwrap();
    l.preload_locations().unwrap();
    assert_eq!(l.get_blob(&old).unwrap(), b"before preload");
    let new = l.put_blob(b"after preload").unwrap();
    let e1 = l
        .append(
            "s",
            Some(e0),
            NewEvent::new("k", 1, vec![2]).with_refs(vec![new]),
        )
        .unwrap();
    assert_eq!(l.get_blob(&new).unwrap(), b"after preload");
    assert_eq!(l.get_event(&e1).unwrap().prev, Some(e0));
    assert_eq!(l.locate(&Id([3; 32])).unwrap(), None);
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
}

#[test]
fn deleted_ref_is_gone_everywhere_but_its_events_stay() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("l");
    let l = Ledger::init(&p).unwrap();
    let e0 = l.append("r", None, NewEvent::new("k", 1, vec![0])).unwrap();
    let e1 = l
        .append("r", Some(e0), NewEvent::new("k", 1, vec![1]))
        .unwrap();
    l.fork("r/sub", e0).unwrap();
    // Compare-and-swap: a stale or absent head is a conflict, nothing changes.
    assert!(matches!(
        l.delete_ref("r", e0),
        Err(LedgerError::Conflict { .. })
    ));
    assert!(matches!(
        l.delete_ref("nope", e0),
        Err(LedgerError::Conflict { .. })
    ));
    assert_eq!(l.head("r").unwrap(), Some(e1));
    // Deleting a ref and appending elsewhere commit together.
    let mut b = l.batch();
    b.delete_ref("r", e1).unwrap();
    b.delete_ref("r/sub", e0).unwrap();
    let note = b
        .append(
            "log",
            None,
            NewEvent::new("removed", 1, vec![]).with_refs(vec![e1]),
        )
        .unwrap();
    b.commit().unwrap();
    let want = vec![("log".to_string(), note)];
    assert_eq!(l.head("r").unwrap(), None);
    assert_eq!(l.refs().unwrap(), want);
    assert_eq!(l.get_event(&e1).unwrap().prev, Some(e0));
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    drop(l);
    // Rebuilt from the log (recovery scan, a reader, a full reindex).
    let l = Ledger::open(&p).unwrap();
    assert_eq!(l.refs().unwrap(), want);
    drop(l);
    let ro = Ledger::open_read_only(&p).unwrap();
    assert_eq!(ro.refs().unwrap(), want);
    drop(ro);
    let (l, _) = Ledger::reindex(&p).unwrap();
    assert_eq!(l.refs().unwrap(), want);
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    // The name can be used again.
    let f = l.append("r", None, NewEvent::new("k", 1, vec![7])).unwrap();
    assert_eq!(l.head("r").unwrap(), Some(f));
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
}
