//! Regression tests for the ledger-trust issue: a repair never deletes
//! acknowledged data, a log shorter than the index is reported, metadata is
//! checked on read, torn tails are moved aside (not dropped), and readers work
//! without the lock. Each test is named after the bug it pins.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ledger::{Id, Ledger, LedgerError, NewEvent, Options};

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

fn seg(dir: &Path, n: u32) -> PathBuf {
    dir.join("segments").join(format!("{n:08}.seg"))
}

/// Every file under `dir` except the derived index, with its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if rel.starts_with("index") || rel.starts_with("index.new") {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// A ledger of 40 batches (a blob, a snapshot tree and an event each) on one
/// stream; returns every object id written, in order.
fn build(dir: &Path, opts: Options) -> Vec<Id> {
    let l = Ledger::init_with(dir, opts).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut ids = Vec::new();
    let mut head = None;
    for i in 0..40u32 {
        fs::write(
            ws.path().join("notes.txt"),
            format!("variant {i}\n").repeat(20),
        )
        .unwrap();
        fs::write(ws.path().join("fixed.txt"), b"the same in every variant").unwrap();
        let mut b = l.batch();
        let blob = b.put_blob(format!("blob number {i}").as_bytes()).unwrap();
        let tree = b.snapshot_dir(ws.path()).unwrap();
        let ev = b
            .append(
                "run",
                head,
                NewEvent::new("t.step", 1, i.to_le_bytes().to_vec()).with_refs(vec![blob, tree]),
            )
            .unwrap();
        b.commit().unwrap();
        head = Some(ev);
        ids.extend([blob, tree, ev]);
    }
    ids
}

fn read_all(l: &Ledger, ids: &[Id]) -> BTreeMap<Id, Result<Vec<u8>, String>> {
    ids.iter()
        .map(|id| {
            (
                *id,
                l.raw_object(id).map(|(_, b)| b).map_err(|e| e.to_string()),
            )
        })
        .collect()
}

fn loc_of(dir: &Path, id: &Id) -> ledger::ObjLoc {
    let l = Ledger::open(dir).unwrap();
    l.locate(id).unwrap().unwrap()
}

/// Regression (issue 23): one flipped byte in a batch that valid batches
/// follow. `reindex` once refused; a flipped byte in the *last* batch was
/// once called a torn tail and cut off. Now every rebuild steps over the
/// damaged record, lists it, keeps every intact record, and changes no
/// segment byte.
#[test]
fn reindex_after_a_flipped_byte_mid_segment_steps_over_it_and_cuts_nothing() {
    for victim_at in [30usize, 117] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("l");
        let ids = build(&dir, Options::default());
        let before = read_all(&Ledger::open(&dir).unwrap(), &ids);
        // Batch 10's blob (valid batches follow), or the last batch's event.
        let victim = ids[victim_at];
        let loc = loc_of(&dir, &victim);
        flip(&seg(&dir, loc.seg), loc.offset + 60);
        let seg_before = fs::read(seg(&dir, loc.seg)).unwrap();

        let (l, report) = Ledger::reindex(&dir).unwrap();
        assert_eq!(report.damage.len(), 1, "{report:?}");
        assert!(report.tails.is_empty(), "{report:?}");
        let d = &report.damage[0];
        assert_eq!((d.segment, d.offset), (loc.seg, loc.offset));
        assert!(!d.reason.contains("never acknowledged"), "{}", d.reason);
        assert_eq!(fs::read(seg(&dir, loc.seg)).unwrap(), seg_before);
        let after = read_all(&l, &ids);
        for id in &ids {
            if *id == victim {
                assert!(
                    after[id].as_ref().unwrap_err().contains("damaged"),
                    "{:?}",
                    after[id]
                );
            } else {
                assert_eq!(after[id], before[id], "{id}");
            }
        }
    }
}

#[test]
fn repair_sets_damage_aside_and_keeps_every_intact_record() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let ids = build(&dir, Options::default());
    let before = read_all(&Ledger::open(&dir).unwrap(), &ids);
    let victim = ids[30];
    let loc = loc_of(&dir, &victim);
    flip(&seg(&dir, loc.seg), loc.offset + 60);
    let seg_before = fs::read(seg(&dir, loc.seg)).unwrap();

    let (l, report) = Ledger::repair(&dir).unwrap();
    assert_eq!(report.damage.len(), 1, "{report:?}");
    let d = &report.damage[0];
    assert_eq!((d.segment, d.offset), (loc.seg, loc.offset));
    assert_eq!(d.claimed_id.as_deref(), Some(victim.to_hex().as_str()));
    // The segment is byte for byte what it was; the bad bytes are also copied aside.
    assert_eq!(fs::read(seg(&dir, loc.seg)).unwrap(), seg_before);
    let q: Vec<_> = fs::read_dir(dir.join("quarantine"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(q.iter().any(|n| n == "damaged.jsonl"), "{q:?}");
    assert!(q.iter().any(|n| n.contains("damaged")), "{q:?}");
    let after = read_all(&l, &ids);
    for id in &ids {
        if *id == victim {
            assert!(after[id].is_err());
        } else {
            assert_eq!(after[id], before[id], "{id}");
        }
    }
    // The ledger takes writes again, and a later reindex steps over the
    // range repair set aside instead of refusing.
    l.put_blob(b"after repair").unwrap();
    drop(l);
    let (l, r) = Ledger::reindex(&dir).unwrap();
    assert_eq!(r.known_damage, 1);
    assert!(l
        .get_blob(&Id::of(ledger::ObjectKind::Blob, b"after repair"))
        .is_ok());
}

#[test]
fn a_flipped_commit_marker_mid_log_loses_no_snapshot() {
    // Before: one flipped commit marker + reindex lost 16 of 18 snapshots.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let ids = build(&dir, Options::default());
    let before = read_all(&Ledger::open(&dir).unwrap(), &ids);
    // The commit marker of batch 5 ends right before the blob of batch 6.
    let next = loc_of(&dir, &ids[18]);
    let marker_at = next.offset - 8 - 12 - 60; // trailer, body, header
    flip(&seg(&dir, next.seg), marker_at + 2 + 60);
    let (l, report) = Ledger::repair(&dir).unwrap();
    assert_eq!(report.damage.len(), 1, "{report:?}");
    assert_eq!(
        read_all(&l, &ids),
        before,
        "every object survives a bad marker"
    );
}

#[test]
fn a_log_cut_at_a_record_boundary_is_reported_not_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let ids = build(&dir, Options::default());
    let last_blob = ids[ids.len() - 3];
    let loc = loc_of(&dir, &last_blob);
    let f = OpenOptions::new()
        .write(true)
        .open(seg(&dir, loc.seg))
        .unwrap();
    f.set_len(loc.offset).unwrap();
    let err = Ledger::open(&dir).expect_err("open must report the short log");
    assert!(matches!(err, LedgerError::LogBehindIndex { .. }), "{err}");
    assert!(err.is_corruption());
    let ro = Ledger::open_read_only(&dir).unwrap();
    assert!(
        ro.raw_object(&ids[0]).is_ok(),
        "readers still read the rest"
    );
}

#[test]
fn a_missing_last_segment_is_reported_not_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let opts = Options {
        segment_max: 4096,
        ..Options::default()
    };
    build(&dir, opts);
    let segs: Vec<_> = fs::read_dir(dir.join("segments")).unwrap().collect();
    assert!(segs.len() > 2, "the fixture should roll over segments");
    let last = segs.len() as u32;
    fs::remove_file(seg(&dir, last)).unwrap();
    let err = Ledger::open(&dir).expect_err("a deleted segment must be reported");
    assert!(matches!(err, LedgerError::LogBehindIndex { .. }), "{err}");
    // A gap in the middle is reported too.
    let tmp2 = tempfile::tempdir().unwrap();
    let dir2 = tmp2.path().join("l");
    build(
        &dir2,
        Options {
            segment_max: 4096,
            ..Options::default()
        },
    );
    fs::remove_file(seg(&dir2, 2)).unwrap();
    let err = Ledger::open(&dir2).expect_err("a gap must be reported");
    assert!(err.to_string().contains("segment 2 is missing"), "{err}");
}

#[test]
fn dedup_writes_again_when_the_log_no_longer_holds_the_object() {
    // Before: re-snapshotting a tree whose records were lost printed its id,
    // exited 0 and wrote nothing, because dedup trusted the index.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let l = Ledger::init(&dir).unwrap();
    let content = b"this blob's record is damaged under the writer".repeat(3);
    let lost = l.put_blob(&content).unwrap();
    l.put_blob(b"a later record").unwrap();
    let loc = l.locate(&lost).unwrap().unwrap();
    flip(&seg(&dir, loc.seg), loc.offset + 60);
    assert!(l.get_blob(&lost).unwrap_err().is_corruption());
    let again = l.put_blob(&content).unwrap();
    assert_eq!(again, lost);
    assert_eq!(l.get_blob(&lost).unwrap(), content);
    assert_ne!(l.locate(&lost).unwrap().unwrap().offset, loc.offset);
}

#[test]
fn a_damaged_timestamp_is_reported_not_shown() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let l = Ledger::init(&dir).unwrap();
    let ev = l
        .append("s", None, NewEvent::new("k", 1, b"payload".to_vec()))
        .unwrap();
    let loc = l.locate(&ev).unwrap().unwrap();
    assert!(l.get_meta(&ev).unwrap().wall_ms > 0);
    // Change one digit of the metadata JSON (`{"wall_ms":1764...`).
    let meta_at = loc.offset + ledger::format::RECORD_HEADER_LEN as u64 + loc.body_len as u64;
    let path = seg(&dir, loc.seg);
    let bytes = fs::read(&path).unwrap();
    let m = &bytes[meta_at as usize..(meta_at + loc.meta_len as u64) as usize];
    let digit = m.iter().position(|b| b.is_ascii_digit()).unwrap() as u64;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, meta_at + digit).unwrap();
    b[0] = if b[0] == b'9' { b'1' } else { b[0] + 1 };
    f.write_all_at(&b, meta_at + digit).unwrap();
    let err = l
        .get_meta(&ev)
        .expect_err("damaged metadata must not be shown");
    assert!(err.is_corruption(), "{err}");
    assert!(l.get_event(&ev).is_ok(), "the event body itself is intact");
}

#[test]
fn a_torn_tail_is_copied_into_quarantine_and_left_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let ids = build(&dir, Options::default());
    let path = seg(&dir, 1);
    let garbage = b"MREC\x01\x00\x00\x00half a record that never got its commit marker";
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut f, garbage).unwrap();
    drop(f);
    let len = fs::metadata(&path).unwrap().len();
    let (l, report) = Ledger::open_reporting(&dir).unwrap();
    assert_eq!(report.tails.len(), 1);
    let s = &report.tails[0];
    assert_eq!(
        (s.offset, s.len),
        (len - garbage.len() as u64, garbage.len() as u64)
    );
    assert_eq!(fs::read(dir.join(&s.file)).unwrap(), garbage);
    assert_eq!(fs::metadata(&path).unwrap().len(), len, "never cut");
    assert_eq!(report.new_segment, Some(2));
    for id in &ids {
        l.raw_object(id).unwrap();
    }
}

#[test]
fn readers_work_while_a_writer_holds_the_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let ids = build(&dir, Options::default());
    let w = Ledger::open(&dir).unwrap();
    assert!(matches!(
        Ledger::open(&dir),
        Err(LedgerError::Locked { .. })
    ));
    let head = w.head("run").unwrap().unwrap();
    let r = Ledger::open_read_only(&dir).unwrap();
    assert_eq!(r.head("run").unwrap(), Some(head));
    assert_eq!(read_all(&r, &ids), read_all(&w, &ids));
    // The reader sees the prefix committed when it opened; a later reader sees more.
    let next = w
        .append("run", Some(head), NewEvent::new("t.more", 1, vec![1]))
        .unwrap();
    assert_eq!(r.head("run").unwrap(), Some(head));
    let r2 = Ledger::open_read_only(&dir).unwrap();
    assert_eq!(r2.head("run").unwrap(), Some(next));
    assert_eq!(r2.events_newest_first(None, 1).unwrap(), vec![next]);
    assert_eq!(r2.referrers(&head).unwrap(), vec![next]);
    assert!(matches!(
        r2.put_blob(b"x"),
        Err(LedgerError::ReadOnly { .. })
    ));
}

#[test]
fn a_read_only_open_changes_nothing_even_with_a_torn_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let ids = build(&dir, Options::default());
    let mut f = OpenOptions::new().append(true).open(seg(&dir, 1)).unwrap();
    std::io::Write::write_all(&mut f, b"MREC torn").unwrap();
    drop(f);
    let before = files(&dir);
    let r = Ledger::open_read_only(&dir).unwrap();
    assert_eq!(r.recovery().unread_tail, 9);
    for id in &ids {
        r.raw_object(id).unwrap();
    }
    let v = r
        .verify_with(
            &|_| Ok(()),
            ledger::VerifyOptions {
                index: false,
                absent_ok: false,
            },
        )
        .unwrap();
    assert!(v.is_clean(), "{:?}", v.problems);
    drop(r);
    assert_eq!(files(&dir), before);
    assert!(!dir.join("quarantine").exists());
}

#[test]
fn verify_is_clean_while_another_thread_commits() {
    // Before: verify compared refs read after its scan with the refs the
    // scanned log held, so a commit racing the scan was reported as damage.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    build(&dir, Options::default());
    let l = std::sync::Arc::new(Ledger::open(&dir).unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appended = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let writer = {
        let (l, stop, appended) = (l.clone(), stop.clone(), appended.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                l.append(&format!("busy/{n}"), None, NewEvent::new("k", 1, vec![1]))
                    .unwrap();
                n += 1;
                appended.store(n, std::sync::atomic::Ordering::Relaxed);
            }
            n
        })
    };
    // At least 20 scans, and on until the writer has committed a few times
    // during them (it may not have started yet when the first scans end).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut scans = 0;
    while scans < 20 || appended.load(std::sync::atomic::Ordering::Relaxed) < 3 {
        let v = l.verify(&|_| Ok(())).unwrap();
        assert!(v.is_clean(), "{:?}", v.problems);
        scans += 1;
        assert!(
            std::time::Instant::now() < deadline,
            "the writer never committed"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(writer.join().unwrap() >= 3);
}

/// A file layer whose Nth append writes half its bytes and fails (a full
/// disk), or whose Nth sync fails after a whole append. Nothing may cut the
/// file afterwards (the layer has no way to, and no other path may): the
/// writer stops, and the next open lists the failed batch's bytes as a tail
/// not known to have been acknowledged and goes on in a new segment.
#[derive(Debug)]
struct Flaky {
    fail_at: u64,
    on_sync: bool,
    ops: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

struct FlakyFile {
    f: std::fs::File,
    fail_at: u64,
    on_sync: bool,
    ops: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl ledger::AppendFile for FlakyFile {
    fn append(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let n = self.ops.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if n == self.fail_at && !self.on_sync {
            std::io::Write::write_all(&mut self.f, &buf[..buf.len() / 2])?;
            return Err(std::io::Error::other("no space left on device"));
        }
        std::io::Write::write_all(&mut self.f, buf)
    }
    fn sync_data(&mut self) -> std::io::Result<()> {
        let n = self.ops.load(std::sync::atomic::Ordering::SeqCst);
        if n == self.fail_at && self.on_sync {
            return Err(std::io::Error::other("fsync failed"));
        }
        self.f.sync_data()
    }
}

impl ledger::FileLayer for Flaky {
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn ledger::AppendFile>> {
        Ok(Box::new(FlakyFile {
            f: OpenOptions::new().append(true).open(path)?,
            fail_at: self.fail_at,
            on_sync: self.on_sync,
            ops: self.ops.clone(),
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

fn segment_lengths(dir: &Path) -> Vec<u64> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v.iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect()
}

#[test]
fn a_failed_write_is_never_cut_and_the_next_open_steps_over_it() {
    for on_sync in [false, true] {
        for fail_at in [1u64, 2, 7, 19] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("l");
            let opts = Options {
                segment_max: 2048,
                files: std::sync::Arc::new(Flaky {
                    fail_at,
                    on_sync,
                    ops: Default::default(),
                }),
                ..Options::default()
            };
            let l = Ledger::init_with(&dir, opts).unwrap();
            let mut acked: Vec<Id> = Vec::new();
            let mut head = None;
            let mut failed = None;
            for i in 0u32..40 {
                let blob = format!("payload {i} ").repeat(20);
                let mut b = l.batch();
                let bl = b.put_blob(blob.as_bytes()).unwrap();
                let ev = b
                    .append(
                        "s",
                        head,
                        NewEvent::new("k", 1, i.to_le_bytes().to_vec()).with_refs(vec![bl]),
                    )
                    .unwrap();
                match b.commit() {
                    Ok(()) => {
                        acked.extend([bl, ev]);
                        head = Some(ev);
                    }
                    Err(_) => {
                        failed = Some(ev);
                        break;
                    }
                }
            }
            assert!(
                l.put_blob(b"after the failure").is_err(),
                "a poisoned writer refuses"
            );
            let before = segment_lengths(&dir);
            drop(l);
            let (l, report) = Ledger::open_reporting(&dir).unwrap();
            let after = segment_lengths(&dir);
            for (i, (b, a)) in before.iter().zip(&after).enumerate() {
                assert_eq!(b, a, "segment {} changed length", i + 1);
            }
            if on_sync {
                // The whole batch reached the file (only its fsync failed):
                // complete, it is read like any batch that was not
                // acknowledged but reached the disk whole.
                assert!(report.tails.is_empty(), "{report:?}");
                assert_eq!(l.head("s").unwrap(), failed);
                continue;
            }
            // The half-written batch is a tail (listed, copied, left in
            // place), and the writer went on in a new segment.
            assert_eq!(
                report.tails.len(),
                1,
                "fail_at {fail_at} on_sync {on_sync}: {report:?}"
            );
            assert_eq!(report.new_segment, Some(before.len() as u32 + 1));
            let t = &report.tails[0];
            let q = std::fs::read(dir.join(&t.file)).unwrap();
            let seg_bytes = std::fs::read(seg(&dir, t.segment)).unwrap();
            assert_eq!(
                &q[..],
                &seg_bytes[t.offset as usize..(t.offset + t.len) as usize]
            );
            for id in &acked {
                l.raw_object(id)
                    .unwrap_or_else(|e| panic!("{id} lost: {e}"));
            }
            assert_eq!(l.head("s").unwrap(), head);
            let next = l.put_blob(b"after the reopen").unwrap();
            let v = l.verify(&|_| Ok(())).unwrap();
            assert!(
                v.is_clean(),
                "fail_at {fail_at} on_sync {on_sync}: {:?}",
                v.problems
            );
            drop(l);
            let l = Ledger::open(&dir).unwrap();
            assert_eq!(l.get_blob(&next).unwrap(), b"after the reopen");
            assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
        }
    }
}

/// Opening removes what a killed `reindex` leaves (`index.new/` without its
/// completion mark). That is derived data; the
/// removal must never reach a recorded byte: not through a symlink planted
/// where a leftover is expected, not through anything next to the index.
/// Every file outside the index stays byte-identical and every acknowledged
/// object reads back.
#[test]
fn removing_leftover_index_dirs_never_touches_the_log() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("l");
    let ids = build(&dir, Options::default());
    let before = files(&dir);
    assert!(before.keys().any(|p| p.starts_with("segments")));
    let want = read_all(&Ledger::open_read_only(&dir).unwrap(), &ids);

    // A partial rebuild.
    fs::create_dir_all(dir.join("index.new/sub")).unwrap();
    fs::write(dir.join("index.new/sub/partial.idx"), b"half a table").unwrap();
    let l = Ledger::open(&dir).unwrap();
    assert!(!dir.join("index.new").exists());
    assert_eq!(read_all(&l, &ids), want);
    drop(l);
    assert_eq!(files(&dir), before, "a recorded byte changed");

    // `index.new` as a symlink to the segments: only the link goes.
    std::os::unix::fs::symlink(dir.join("segments"), dir.join("index.new")).unwrap();
    let l = Ledger::open(&dir).unwrap();
    assert!(fs::symlink_metadata(dir.join("index.new")).is_err());
    assert_eq!(read_all(&l, &ids), want);
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    drop(l);
    assert_eq!(files(&dir), before, "a recorded byte changed");
}
