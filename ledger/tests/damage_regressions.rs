//! Regression tests for the ledger-under-damage issue (#23): one test per bug
//! the probes found, each named after it. Each one failed on the format-1
//! ledger; several also show that switching the protection off
//! (`Options::unprotected`) brings the bug back, so they fail for the right
//! reason.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ledger::{format, Id, Ledger, LedgerError, NewEvent, ObjectKind, Options, Unprotected};

fn seg(dir: &Path, n: u32) -> PathBuf {
    dir.join("segments").join(format!("{n:08}.seg"))
}

fn xor(path: &Path, offset: u64, mask: u8) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    f.write_all_at(&[b[0] ^ mask], offset).unwrap();
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

fn seg_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v.into_iter()
        .map(|p| {
            let b = fs::read(&p).unwrap();
            (p, b)
        })
        .collect()
}

/// Every existing segment file is byte-identical to `before` (new ones may
/// have been added after them).
fn assert_segments_unchanged(dir: &Path, before: &[(PathBuf, Vec<u8>)], what: &str) {
    let now = seg_files(dir);
    assert!(
        now.len() >= before.len(),
        "{what}: a segment file went away"
    );
    for ((p, b), (_, n)) in before.iter().zip(&now) {
        assert!(
            b == n,
            "{what}: {} changed ({} -> {} bytes)",
            p.display(),
            b.len(),
            n.len()
        );
    }
}

/// A small run: three batches on one stream (a blob and an event each).
fn demo(dir: &Path, opts: Options) -> Vec<Id> {
    let l = Ledger::init_with(dir, opts).unwrap();
    let mut head = None;
    let mut ids = Vec::new();
    for i in 0..3u8 {
        let mut b = l.batch();
        let blob = b
            .put_blob(format!("result {i} ").repeat(20).as_bytes())
            .unwrap();
        let ev = b
            .append(
                "demo/1",
                head,
                NewEvent::new("demo.step", 1, vec![i]).with_refs(vec![blob]),
            )
            .unwrap();
        b.commit().unwrap();
        head = Some(ev);
        ids.extend([blob, ev]);
    }
    ids
}

/// The bug: one byte flipped inside the last batch's event record, then
/// `reindex` (or `repair`, or a writer open with `index/` gone) called the
/// batch "an interrupted write ... never acknowledged", copied it away and
/// cut the segment; the run's head moved back one step.
#[test]
fn an_acknowledged_last_batch_is_not_cut_after_one_flipped_byte() {
    for op in ["reindex", "repair", "writer open without index/"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("l");
        let ids = demo(&dir, Options::default());
        let (last_blob, last_ev) = (ids[4], ids[5]);
        let loc = Ledger::open_read_only(&dir)
            .unwrap()
            .locate(&last_ev)
            .unwrap()
            .unwrap();
        xor(
            &seg(&dir, loc.seg),
            loc.offset + format::RECORD_HEADER_LEN as u64 + 3,
            0x01,
        );
        if op == "writer open without index/" {
            fs::remove_dir_all(dir.join("index")).unwrap();
        }
        let before = seg_files(&dir);
        let (l, report) = match op {
            "reindex" => Ledger::reindex(&dir).unwrap(),
            "repair" => Ledger::repair(&dir).unwrap(),
            _ => Ledger::open_reporting(&dir).unwrap(),
        };
        assert_segments_unchanged(&dir, &before, op);
        assert!(report.tails.is_empty(), "{op}: called a tail: {report:?}");
        assert_eq!(report.damage.len(), 1, "{op}: {report:?}");
        let d = &report.damage[0];
        assert_eq!(d.offset, loc.offset, "{op}");
        assert!(
            !d.reason.contains("never acknowledged"),
            "{op}: {}",
            d.reason
        );
        // The ref update of the batch is intact and the head stays where the
        // acknowledged commit put it: on the event, now reported damaged.
        assert_eq!(l.head("demo/1").unwrap(), Some(last_ev), "{op}");
        assert!(l.get_event(&last_ev).unwrap_err().is_corruption(), "{op}");
        assert_eq!(
            l.raw_object(&last_blob).unwrap().0,
            ObjectKind::Blob,
            "{op}"
        );
        for id in &ids[..4] {
            l.raw_object(id).unwrap();
        }
        // Later opens still say "damaged" (not "not found"): the range is
        // listed.
        drop(l);
        for l in [
            Ledger::open(&dir).unwrap(),
            Ledger::open_read_only(&dir).unwrap(),
        ] {
            let e = l.get_event(&last_ev).unwrap_err();
            assert!(e.is_corruption(), "{op}: {e}");
        }
        assert_segments_unchanged(&dir, &before, op);
    }
}

/// The bug: one flipped byte in bytes 0-16 of the only segment lost every
/// record after `repair`, and every later writer open failed (exit 3);
/// bytes 8-11 (the version) were not even treated as damage.
#[test]
fn a_segment_header_byte_costs_at_most_the_header() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let ids = demo(&base, Options::default());
    for pos in 0..format::SEGMENT_HEADER_LEN {
        for mask in [0x01u8, 0xff] {
            let case = tmp.path().join(format!("c{pos}-{mask}"));
            copy_dir(&base, &case);
            xor(&seg(&case, 1), pos, mask);
            for op in ["read-only", "repair", "writer"] {
                let l = match op {
                    "read-only" => Ledger::open_read_only(&case).unwrap(),
                    "repair" => Ledger::repair(&case).unwrap().0,
                    _ => Ledger::open(&case).unwrap(),
                };
                for id in &ids {
                    l.raw_object(id)
                        .unwrap_or_else(|e| panic!("byte {pos} mask {mask:#x} {op}: {id}: {e}"));
                }
                if op == "writer" {
                    l.put_blob(format!("after {pos}").as_bytes()).unwrap();
                }
            }
            fs::remove_dir_all(&case).unwrap();
        }
    }
}

/// Ten versions of a 4 KB text file, one line edited each time, one
/// snapshot each: returns each version's blob id.
fn versions(dir: &Path, opts: Options) -> Vec<Id> {
    let l = Ledger::init_with(dir, opts).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut lines: Vec<String> = (0..100)
        .map(|i| format!("line {i:03} of a text file\n"))
        .collect();
    let mut blobs = Vec::new();
    for v in 0..10 {
        lines[v * 7 % 100] = format!("line edited in version {v}\n");
        let text: String = lines.concat();
        fs::write(ws.path().join("notes.txt"), &text).unwrap();
        l.snapshot_dir(ws.path()).unwrap();
        blobs.push(Id::of(ObjectKind::Blob, text.as_bytes()));
    }
    blobs
}

/// The bug: one flipped byte in the first version's record made all 9
/// later versions unreadable, and snapshotting version 5 again did not help
/// (dedup saw its delta record and skipped the write).
#[test]
fn a_damaged_delta_base_heals_when_its_content_is_put_again() {
    for protected in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("l");
        let opts = || Options {
            unprotected: Unprotected {
                no_chain_dedup: !protected,
                ..Default::default()
            },
            ..Options::default()
        };
        let blobs = versions(&dir, opts());
        let (base, contents) = {
            let l = Ledger::open(&dir).unwrap();
            let loc = l.locate(&blobs[5]).unwrap().unwrap();
            assert_ne!(loc.flags & 2, 0, "version 5 is stored as a delta");
            let all: Vec<Vec<u8>> = blobs.iter().map(|b| l.get_blob(b).unwrap()).collect();
            (blobs[0], all)
        };
        let l = Ledger::open(&dir).unwrap();
        let loc = l.locate(&base).unwrap().unwrap();
        drop(l);
        xor(
            &seg(&dir, loc.seg),
            loc.offset + format::RECORD_HEADER_LEN as u64 + 5,
            0x20,
        );
        let (l, _) = Ledger::repair_with(&dir, opts()).unwrap();
        // verify names every object the damaged base made unreadable.
        let v = l.verify(&|_| Ok(())).unwrap();
        let named: Vec<Id> = v.problems.iter().filter_map(|p| p.id).collect();
        for b in &blobs[1..] {
            if l.get_blob(b).is_err() {
                assert!(
                    named.contains(b),
                    "verify does not name {b}: {:?}",
                    v.problems
                );
            }
        }
        assert!(
            l.get_blob(&blobs[5]).is_err(),
            "version 5 depends on the damaged base"
        );
        // Snapshot version 5 again: it must be written anew.
        let again = l.put_blob(&contents[5]).unwrap();
        assert_eq!(again, blobs[5]);
        let healed = l.get_blob(&blobs[5]);
        if protected {
            assert_eq!(
                healed.unwrap(),
                contents[5],
                "version 5 was not written again"
            );
        } else {
            assert!(
                healed.is_err(),
                "without the chain check dedup skips the write"
            );
        }
    }
}

/// A base serves a bounded number of versions: 40 versions of one file
/// store a new plain base at least every `MAX_DELTA_GENERATION` versions,
/// so one damaged record costs at most that many (and the delta bound off
/// lets every version depend on one base).
#[test]
fn one_damaged_base_costs_a_bounded_number_of_versions() {
    for bounded in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("l");
        let l = Ledger::init_with(
            &dir,
            Options {
                unprotected: Unprotected {
                    no_delta_bound: !bounded,
                    ..Default::default()
                },
                ..Options::default()
            },
        )
        .unwrap();
        let ws = tempfile::tempdir().unwrap();
        let mut lines: Vec<String> = (0..100).map(|i| format!("line {i:03}\n")).collect();
        let mut per_base: std::collections::HashMap<Id, usize> = Default::default();
        for v in 0..40 {
            lines[v % 100] = format!("edited in {v}\n");
            let text = lines.concat();
            fs::write(ws.path().join("f.txt"), &text).unwrap();
            l.snapshot_dir(ws.path()).unwrap();
            let id = Id::of(ObjectKind::Blob, text.as_bytes());
            let loc = l.locate(&id).unwrap().unwrap();
            if loc.flags & 2 != 0 {
                let f = fs::File::open(seg(&dir, loc.seg)).unwrap();
                let mut b = [0u8; 32];
                f.read_exact_at(&mut b, loc.offset + format::RECORD_HEADER_LEN as u64)
                    .unwrap();
                *per_base.entry(Id(b)).or_default() += 1;
            }
        }
        let most = per_base.values().copied().max().unwrap_or(0);
        if bounded {
            assert!(
                most <= format::MAX_DELTA_GENERATION as usize,
                "a base serves {most} deltas"
            );
            assert!(per_base.len() >= 2, "no new base was started: {per_base:?}");
        } else {
            assert!(most > format::MAX_DELTA_GENERATION as usize, "{per_base:?}");
        }
    }
}

fn rolled(dir: &Path) -> Vec<Id> {
    let l = Ledger::init_with(
        dir,
        Options {
            segment_max: 2048,
            ..Options::default()
        },
    )
    .unwrap();
    let mut ids = Vec::new();
    let mut head = None;
    for i in 0..30u32 {
        let ev = l
            .append(
                "s",
                head,
                NewEvent::new("k", 1, format!("event {i} ").repeat(10).into_bytes()),
            )
            .unwrap();
        head = Some(ev);
        ids.push(ev);
    }
    assert!(fs::read_dir(dir.join("segments")).unwrap().count() >= 4);
    ids
}

/// The bug: a missing *first* segment was accepted (the log simply started
/// at segment 2), and the index tables that proved segment 1 existed were
/// deleted as "not part of the chain".
#[test]
fn a_missing_first_segment_is_log_behind_index_and_no_table_is_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    rolled(&dir);
    let tables_before: Vec<_> = fs::read_dir(dir.join("index"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    fs::remove_file(seg(&dir, 1)).unwrap();
    for open in ["writer", "reindex"] {
        let err = match open {
            "writer" => Ledger::open(&dir).unwrap_err(),
            _ => Ledger::reindex(&dir).unwrap_err(),
        };
        assert!(
            matches!(err, LedgerError::LogBehindIndex { .. }),
            "{open}: {err}"
        );
        assert!(err.to_string().contains("segment 1 is missing"), "{err}");
    }
    for t in &tables_before {
        assert!(t.exists(), "{} was deleted", t.display());
    }
    let ro = Ledger::open_read_only(&dir).unwrap();
    assert!(ro.recovery().log_behind_index.is_some());
}

/// The bug: a truncated sealed segment other than the last was not caught
/// at open (only the segment where the index ends was checked). Now the
/// next segment's header names each sealed segment's committed end.
#[test]
fn a_truncated_sealed_segment_is_log_behind_index() {
    for without_index in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("l");
        rolled(&dir);
        let p = seg(&dir, 2);
        let len = fs::metadata(&p).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(len - 30)
            .unwrap();
        if without_index {
            fs::remove_dir_all(dir.join("index")).unwrap();
            fs::remove_file(dir.join("WATERMARK")).unwrap();
        }
        let err = Ledger::open(&dir).unwrap_err();
        assert!(
            matches!(err, LedgerError::LogBehindIndex { .. }),
            "without index {without_index}: {err}"
        );
        assert!(err.to_string().contains("00000002.seg"), "{err}");
    }
}

/// The bug: a table with a valid checksum but inconsistent contents made a
/// lookup panic (index out of range). Tables are now checked for
/// consistency when opened and ignored when they fail.
#[test]
fn an_index_table_with_a_valid_checksum_but_bad_contents_is_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let ids = demo(&dir, Options::default());
    let table = fs::read_dir(dir.join("index"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "idx"))
        .unwrap();
    let good = fs::read(&table).unwrap();
    // Each edit keeps the file's size and then fixes the BLAKE3 footer.
    type Edit = Box<dyn Fn(&mut Vec<u8>)>;
    let edits: Vec<(&str, Edit)> = vec![
        (
            "event position past the objects",
            Box::new(|b: &mut Vec<u8>| {
                let n = u32::from_le_bytes(b[48..52].try_into().unwrap()) as usize;
                let at = 72 + 1024 + n * 66;
                b[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
            }),
        ),
        (
            "fan-out not a running count",
            Box::new(|b: &mut Vec<u8>| {
                b[72..76].copy_from_slice(&9999u32.to_le_bytes());
            }),
        ),
        (
            "ids out of order",
            Box::new(|b: &mut Vec<u8>| {
                let (x, y) = (72 + 1024, 72 + 1024 + 66);
                let first: Vec<u8> = b[x..x + 66].to_vec();
                let second: Vec<u8> = b[y..y + 66].to_vec();
                b[x..x + 66].copy_from_slice(&second);
                b[y..y + 66].copy_from_slice(&first);
            }),
        ),
        (
            "object count zero with events",
            Box::new(|b: &mut Vec<u8>| {
                b[48..52].copy_from_slice(&0u32.to_le_bytes());
            }),
        ),
    ];
    for (what, edit) in edits {
        let mut b = good.clone();
        edit(&mut b);
        let n = b.len();
        let sum = *blake3::hash(&b[..n - 32]).as_bytes();
        b[n - 32..].copy_from_slice(&sum);
        fs::write(&table, &b).unwrap();
        let ro = Ledger::open_read_only(&dir).unwrap();
        assert!(
            ro.recovery().index_rebuilt.is_some(),
            "{what}: the table was used"
        );
        for id in &ids {
            ro.raw_object(id).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        assert_eq!(ro.events_newest_first(None, 10).unwrap().len(), 3, "{what}");
    }
    fs::write(&table, &good).unwrap();
}

/// Found by the power-loss harness: a cut during `init` before `FORMAT` was
/// durable left a directory that `open` refused as not a ledger and `init`
/// refused as not empty. `init` now starts again over what an interrupted
/// init leaves (a header-only segment 1, `LOCK`, `WATERMARK`), and never
/// over anything that holds a record.
#[test]
fn init_starts_again_after_an_interrupted_init_but_never_over_records() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    demo(&dir, Options::default());
    // Interrupted: FORMAT never written, segment 1 holds only its header.
    let half = tmp.path().join("half");
    fs::create_dir_all(half.join("segments")).unwrap();
    let seg1 = fs::read(seg(&dir, 1)).unwrap();
    fs::write(seg(&half, 1), &seg1[..format::SEGMENT_HEADER_LEN as usize]).unwrap();
    fs::write(half.join("LOCK"), b"123\n").unwrap();
    let l = Ledger::init(&half).unwrap();
    l.put_blob(b"fresh").unwrap();
    drop(l);
    // A directory whose segment holds records is never taken over.
    fs::remove_file(dir.join("FORMAT")).unwrap();
    let before = seg_files(&dir);
    assert!(matches!(
        Ledger::init(&dir),
        Err(LedgerError::AlreadyExists { .. })
    ));
    assert_segments_unchanged(&dir, &before, "init over records");
    assert_eq!(seg_files(&dir).len(), before.len());
}

/// Found in review: a writer whose open is refused (the log behind the
/// evidence) must not destroy the evidence. The watermark once was zeroed
/// at the start of every writer open, so a second attempt (index/ gone)
/// saw no evidence and opened over the loss.
#[test]
fn a_refused_open_keeps_the_evidence_that_refused_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    demo(&dir, Options::default());
    fs::remove_dir_all(dir.join("index")).unwrap();
    let p = seg(&dir, 1);
    let len = fs::metadata(&p).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    for attempt in 0..3 {
        let err = Ledger::open(&dir).unwrap_err();
        assert!(
            matches!(err, LedgerError::LogBehindIndex { .. }),
            "attempt {attempt}: {err}"
        );
        let err = Ledger::reindex(&dir).unwrap_err();
        assert!(
            matches!(err, LedgerError::LogBehindIndex { .. }),
            "attempt {attempt}: {err}"
        );
    }
    assert!(Ledger::open_read_only(&dir)
        .unwrap()
        .recovery()
        .log_behind_index
        .is_some());
}

/// Regression (3fbdbb6): `referrers` sorted each link by the ordinal its
/// own table keeps, where it had sorted by `locate` (an id's newest
/// location). An event stored again after its record was damaged (an
/// older table still lists the damaged copy, a newer part of the index the
/// copy read from) came first at the damaged copy's place, out of the log
/// order every read of it sees. Each referrer sorts where it is read from.
#[test]
fn regression_an_event_stored_again_is_a_referrer_where_it_is_read_from() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (p, a, b, raw_a) = {
        let l = Ledger::init(&dir).unwrap();
        let p = l
            .append("p", None, NewEvent::new("demo.p", 1, b"p".to_vec()))
            .unwrap();
        let linked = |name: &str| {
            let ev = NewEvent::new("demo.link", 1, name.repeat(40).into_bytes());
            l.append(name, None, ev.with_parents(vec![p])).unwrap()
        };
        let (a, b) = (linked("a"), linked("b"));
        let raw = l.raw_object(&a).unwrap().1;
        (p, a, b, raw)
    }; // closed: its index is a table
    let loc = Ledger::open(&dir).unwrap().locate(&a).unwrap().unwrap();
    xor(
        &seg(&dir, loc.seg),
        loc.offset + format::RECORD_HEADER_LEN as u64 + 5,
        0x20,
    );
    let l = Ledger::open(&dir).unwrap();
    assert!(l.get_event(&a).is_err(), "a's record is damaged");
    let mut batch = l.batch();
    batch.put_raw(ObjectKind::Event, raw_a, Vec::new()).unwrap();
    batch.commit().unwrap();
    assert!(l.get_event(&a).is_ok(), "a is stored again");
    let ord = |id: &Id| l.locate(id).unwrap().unwrap().ordinal;
    assert!(ord(&a) > ord(&b), "a's copy is after b");
    let got = l.referrers(&p).unwrap();
    let ords: Vec<u64> = got.iter().map(ord).collect();
    assert!(
        ords.windows(2).all(|w| w[0] <= w[1]),
        "not in the log order reads see: {got:?} at {ords:?} (a {a}, b {b})"
    );
    assert_eq!(got.last(), Some(&a));
}
