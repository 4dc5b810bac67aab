//! Damaged bytes: flipped bits in stored objects, torn tails, garbage appended.
//! Reads must return `Corruption` naming the object, `verify` must list the bad
//! ids, recovery must step over an unacknowledged tail without cutting a
//! byte, and nothing may panic.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ledger::{format, Id, Ledger, LedgerError, NewEvent, ObjLoc};

fn seg_path(dir: &Path, loc: &ObjLoc) -> PathBuf {
    dir.join("segments").join(format!("{:08}.seg", loc.seg))
}

fn flip(path: &Path, offset: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, offset).unwrap();
    f.sync_all().unwrap();
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    blob: Id,
    big_blob: Id,
    tree: Id,
    event: Id,
    last: Id,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let l = Ledger::init(&path).unwrap();
    let blob = l.put_blob(b"small plain blob").unwrap();
    let big: Vec<u8> = b"compressible text "
        .iter()
        .cycle()
        .take(50_000)
        .copied()
        .collect();
    let big_blob = l.put_blob(&big).unwrap();
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws).unwrap();
    fs::write(ws.join("a.txt"), b"alpha").unwrap();
    let tree = l.snapshot_dir(&ws).unwrap();
    let event = l
        .append(
            "s",
            None,
            NewEvent::new("k", 1, b"first".to_vec()).with_refs(vec![blob, tree]),
        )
        .unwrap();
    let last = l
        .append("s", Some(event), NewEvent::new("k", 1, b"second".to_vec()))
        .unwrap();
    drop(l);
    Fixture {
        _dir: dir,
        path,
        blob,
        big_blob,
        tree,
        event,
        last,
    }
}

fn body_offset(loc: &ObjLoc) -> u64 {
    loc.offset + format::RECORD_HEADER_LEN as u64
}

#[test]
fn flipped_body_bytes_give_corruption_naming_the_object() {
    let fx = fixture();
    for (id, what) in [
        (fx.blob, "blob"),
        (fx.big_blob, "compressed blob"),
        (fx.tree, "tree"),
        (fx.event, "event"),
    ] {
        let l = Ledger::open(&fx.path).unwrap();
        let loc = l.locate(&id).unwrap().unwrap();
        drop(l);
        let p = seg_path(&fx.path, &loc);
        flip(&p, body_offset(&loc) + loc.body_len as u64 / 2);
        let l = Ledger::open(&fx.path).unwrap();
        let err = match loc.kind {
            ledger::ObjectKind::Blob => l.get_blob(&id).unwrap_err(),
            ledger::ObjectKind::Tree => l.get_tree(&id).unwrap_err(),
            ledger::ObjectKind::Event => l.get_event(&id).unwrap_err(),
        };
        assert!(
            matches!(&err, LedgerError::Corruption { id: bad, .. } if *bad == id),
            "{what}: {err}"
        );
        assert!(err.is_corruption());
        let report = l.verify(&|_| Ok(())).unwrap();
        assert!(
            report.problems.iter().any(|p| p.id == Some(id)),
            "{what}: verify did not name {id}: {:?}",
            report.problems
        );
        let log_only = l
            .verify_with(
                &|_| Ok(()),
                ledger::VerifyOptions {
                    index: false,
                    absent_ok: false,
                },
            )
            .unwrap();
        assert!(
            log_only.problems.iter().any(|p| p.id == Some(id)),
            "{what}: log-only verify did not name {id}"
        );
        drop(l);
        flip(&p, body_offset(&loc) + loc.body_len as u64 / 2); // repair for the next case
        let l = Ledger::open(&fx.path).unwrap();
        assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    }
}

#[test]
fn flipped_header_bytes_are_reported_by_id_not_panicked_on() {
    let fx = fixture();
    let l = Ledger::open(&fx.path).unwrap();
    let loc = l.locate(&fx.event).unwrap().unwrap();
    drop(l);
    // The record's length field: the scanner cannot trust anything after it.
    flip(&seg_path(&fx.path, &loc), loc.offset + 9);
    let l = Ledger::open(&fx.path).unwrap();
    let err = l.get_event(&fx.event).unwrap_err();
    assert!(
        matches!(&err, LedgerError::Corruption { id, .. } if *id == fx.event),
        "{err}"
    );
    let report = l.verify(&|_| Ok(())).unwrap();
    assert!(!report.is_clean());
    assert!(
        report.problems.iter().any(|p| p.id == Some(fx.event)),
        "{:?}",
        report.problems
    );
    // The event after it is found again by its keyed header check: it
    // reads back and verify does not blame it.
    assert_eq!(l.get_event(&fx.last).unwrap().payload, b"second");
    assert!(
        report
            .problems
            .iter()
            .filter(|p| p.id == Some(fx.last))
            .all(|p| p.what.starts_with("prev ")),
        "only its link to the damaged event is blamed: {:?}",
        report.problems
    );
}

#[test]
fn a_torn_tail_is_listed_never_cut_and_acknowledged_data_survives() {
    let fx = fixture();
    let l = Ledger::open(&fx.path).unwrap();
    let loc = l.locate(&fx.last).unwrap().unwrap();
    drop(l);
    let seg = seg_path(&fx.path, &loc);
    let good_len = fs::metadata(&seg).unwrap().len();
    // Simulate a power cut halfway through writing a further batch: copy the
    // ledger, append a new event there, then chop the segment mid-record.
    for cut in [1u64, 7, 52, 60, 100] {
        let copy = tempfile::tempdir().unwrap();
        let cp = copy.path().join("l");
        copy_dir(&fx.path, &cp);
        let l = Ledger::open(&cp).unwrap();
        l.append("s", Some(fx.last), NewEvent::new("k", 1, vec![7; 300]))
            .unwrap();
        drop(l);
        let seg_cp = cp.join("segments").join(seg.file_name().unwrap());
        let full = fs::metadata(&seg_cp).unwrap().len();
        assert!(full > good_len + cut);
        OpenOptions::new()
            .write(true)
            .open(&seg_cp)
            .unwrap()
            .set_len(good_len + cut)
            .unwrap();
        // The index and the watermark saw the lost batch; a power cut during
        // its write would have left neither, so throw them away.
        fs::remove_dir_all(cp.join("index")).unwrap();
        fs::remove_file(cp.join("WATERMARK")).unwrap();
        let (l, report) = Ledger::open_reporting(&cp).unwrap();
        assert_eq!(report.tail_bytes(), cut, "cut {cut}");
        assert_eq!(report.new_segment, Some(loc.seg + 1));
        assert_eq!(l.head("s").unwrap(), Some(fx.last));
        assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
        assert_eq!(
            fs::metadata(&seg_cp).unwrap().len(),
            good_len + cut,
            "never cut"
        );
        // And the ledger keeps working, in the next segment.
        let e = l
            .append("s", Some(fx.last), NewEvent::new("k", 1, vec![8]))
            .unwrap();
        assert_eq!(l.locate(&e).unwrap().unwrap().seg, loc.seg + 1);
        drop(l);
        let (l, report) = Ledger::open_reporting(&cp).unwrap();
        assert!(
            report.tails.is_empty() && report.damage.is_empty(),
            "{report:?}"
        );
        assert_eq!(l.head("s").unwrap(), Some(e));
        assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    }
}

#[test]
fn garbage_after_the_last_commit_is_listed_and_stepped_over() {
    let fx = fixture();
    let seg = fx.path.join("segments/00000001.seg");
    let len = fs::metadata(&seg).unwrap().len();
    let f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all_at(b"MREC\x03garbage that is not a record", len)
        .unwrap();
    let (l, report) = Ledger::open_reporting(&fx.path).unwrap();
    assert!(report.tail_bytes() > 0);
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    assert_eq!(fs::metadata(&seg).unwrap().len(), len + 33);
}

/// Both copies of the only segment's header damaged: the header is listed,
/// every record after it still reads back, and a writer opens (going on in
/// a new segment).
#[test]
fn a_segment_header_with_both_copies_damaged_costs_only_itself() {
    let fx = fixture();
    let seg = fx.path.join("segments/00000001.seg");
    flip(&seg, 0);
    flip(&seg, format::HEADER_BLOCK_LEN as u64 + 9);
    fs::remove_dir_all(fx.path.join("index")).unwrap();
    let ro = Ledger::open_read_only(&fx.path).unwrap();
    assert_eq!(ro.recovery().damage.len(), 1, "{:?}", ro.recovery());
    assert_eq!(ro.get_blob(&fx.blob).unwrap(), b"small plain blob");
    drop(ro);
    let (l, report) = Ledger::open_reporting(&fx.path).unwrap();
    assert_eq!(report.damage.len(), 1, "{report:?}");
    assert_eq!(report.new_segment, Some(2));
    assert_eq!(l.head("s").unwrap(), Some(fx.last));
    assert_eq!(l.get_event(&fx.last).unwrap().payload, b"second");
    l.put_blob(b"after").unwrap();
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
}

#[test]
fn a_wrong_format_version_is_refused() {
    let fx = fixture();
    fs::write(fx.path.join("FORMAT"), "mass-ledger 99\n").unwrap();
    let err = Ledger::open(&fx.path).err().unwrap();
    assert!(
        matches!(err, LedgerError::UnsupportedFormat { .. }),
        "{err}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let t = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &t);
        } else if e.file_name() != "LOCK" {
            fs::copy(e.path(), t).unwrap();
        }
    }
}

/// Regression: after a SIGKILL, the earlier sled index once failed to reopen
/// its own files. The index is derived data: damaged index tables are
/// ignored and the log is scanned instead.
#[test]
fn a_damaged_index_is_rebuilt_on_open() {
    let fx = fixture();
    // Damage every file of the index.
    fn scribble(dir: &Path) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                scribble(&p);
            } else if fs::metadata(&p).unwrap().len() > 0 {
                fs::write(&p, vec![0xA5; 4096]).unwrap();
            }
        }
    }
    scribble(&fx.path.join("index"));
    let (l, report) = Ledger::open_reporting(&fx.path).unwrap();
    assert!(report.index_rebuilt.is_some(), "{report:?}");
    assert_eq!(l.head("s").unwrap(), Some(fx.last));
    assert_eq!(l.get_blob(&fx.blob).unwrap(), b"small plain blob");
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
}
