//! A format-1 ledger (written by the build before record checks were keyed;
//! `fixtures/v1-ledger`, made with that build's own API: blobs plain,
//! compressed and as deltas, trees, events with metadata on three streams,
//! a fork, a ref deletion, two segments) is copied into a format-2 ledger:
//! every object with its id, every event's metadata, every ref; the old
//! ledger is never written; damage refuses the copy before anything is
//! written; a torn tail is left out and reported.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use ledger::{Id, Ledger, LedgerError};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-ledger")
}

fn manifest() -> (BTreeMap<String, Id>, Vec<Id>) {
    let text = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-ledger.manifest"),
    )
    .unwrap();
    let mut refs = BTreeMap::new();
    let mut objects = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["ref", name, id] => {
                refs.insert(name.to_string(), id.parse().unwrap());
            }
            ["object", id] => objects.push(id.parse().unwrap()),
            _ => {}
        }
    }
    (refs, objects)
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let t = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &t);
        } else {
            fs::copy(e.path(), t).unwrap();
        }
    }
}

fn all_bytes(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(dir.join("segments")).unwrap() {
        let p = e.unwrap().path();
        out.insert(p.clone(), fs::read(&p).unwrap());
    }
    out.insert(dir.join("FORMAT"), fs::read(dir.join("FORMAT")).unwrap());
    out
}

#[test]
fn a_format_1_ledger_is_copied_whole_and_left_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let old = tmp.path().join("old");
    copy_dir(&fixture(), &old);
    let before = all_bytes(&old);
    // The new build refuses to open it, saying which format it is.
    match Ledger::open_read_only(&old) {
        Err(LedgerError::UnsupportedFormat { found, .. }) => assert_eq!(found, "1"),
        other => panic!("{other:?}"),
    }
    assert!(ledger::is_v1(&old));
    let new = tmp.path().join("new");
    let l = Ledger::init(&new).unwrap();
    let m = ledger::migrate_v1(&old, &l).unwrap();
    let (refs, objects) = manifest();
    assert_eq!(m.objects as usize, objects.len(), "{m:?}");
    assert_eq!(m.tail_bytes, 0);
    for id in &objects {
        l.raw_object(id).unwrap_or_else(|e| panic!("{id}: {e}"));
    }
    let got: BTreeMap<String, Id> = l.refs().unwrap().into_iter().collect();
    assert_eq!(
        got, refs,
        "the deleted ref stays deleted, the fork is there"
    );
    // Event metadata is the recorded one, not the time of the copy.
    let head = refs["run/1"];
    let meta = l.get_meta(&head).unwrap();
    assert_eq!(meta.extra.get("latency_ms").map(String::as_str), Some("70"));
    assert!(meta.wall_ms > 0);
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    assert_eq!(all_bytes(&old), before, "the old ledger was written");
    // A second copy into a fresh ledger gives the same heads.
    let new2 = tmp.path().join("new2");
    let l2 = Ledger::init(&new2).unwrap();
    ledger::migrate_v1(&old, &l2).unwrap();
    assert_eq!(l2.refs().unwrap(), l.refs().unwrap());
}

#[test]
fn a_damaged_format_1_record_refuses_the_copy_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let old = tmp.path().join("old");
    copy_dir(&fixture(), &old);
    let seg = old.join("segments/00000001.seg");
    let mut b = fs::read(&seg).unwrap();
    b[16 + 52 + 3] ^= 0x10; // inside the first record's body; batches follow
    fs::write(&seg, &b).unwrap();
    let new = tmp.path().join("new");
    let l = Ledger::init(&new).unwrap();
    let err = ledger::migrate_v1(&old, &l).unwrap_err();
    assert!(err.is_corruption(), "{err}");
    assert!(err.to_string().contains("byte 16"), "{err}");
    assert!(l.refs().unwrap().is_empty(), "nothing may be half-copied");
    assert_eq!(l.object_count().unwrap(), 0);
}

#[test]
fn a_format_1_torn_tail_is_left_out_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let old = tmp.path().join("old");
    copy_dir(&fixture(), &old);
    let seg = old.join("segments/00000002.seg");
    let mut b = fs::read(&seg).unwrap();
    b.extend_from_slice(b"MREC\x01\x00\x00\x00half a record of an interrupted write");
    fs::write(&seg, &b).unwrap();
    let new = tmp.path().join("new");
    let l = Ledger::init(&new).unwrap();
    let m = ledger::migrate_v1(&old, &l).unwrap();
    assert_eq!(m.tail_bytes, 45);
    let (refs, _) = manifest();
    assert_eq!(
        l.refs().unwrap().into_iter().collect::<BTreeMap<_, _>>(),
        refs
    );
}
