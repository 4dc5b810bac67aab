//! Group commit: many threads committing at once share `fdatasync`s, yet
//! every commit is acknowledged only once a sync covers its bytes, a failed
//! sync fails every commit of its group, compare-and-swap still refuses
//! stale heads (writing nothing), and a batch is visible to readers only
//! once it is durable.
//!
//! The writer appends and syncs through a counting file layer that records,
//! per segment file, how many bytes were appended and how many a successful
//! `sync_data` covered; it can slow syncs down (so committers pile up behind
//! one, as on a real disk), hold them at a gate, or fail the Nth.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::Duration;

use ledger::format::{RECORD_HEADER_LEN, RECORD_TRAILER_LEN};
use ledger::{AppendFile, FileLayer, Id, Ledger, LedgerError, NewEvent, Options};

#[derive(Debug, Default)]
struct Shared {
    syncs: AtomicU64,
    /// Bytes appended per file (what the writer sees).
    appended: Mutex<HashMap<PathBuf, u64>>,
    /// Bytes a successful `sync_data` covered, per file.
    synced: Mutex<HashMap<PathBuf, u64>>,
    /// Each sync sleeps this long before syncing.
    sync_delay: Duration,
    /// The Nth sync (1-based) fails; 0 for none. Tests may set it while
    /// running, to fail the sync after one they hold at the gate.
    fail_sync_at: AtomicU64,
    /// The bytes the failed sync should have made durable.
    failed_bytes: Mutex<Option<Vec<u8>>>,
    /// While `Some(false)`, syncs wait.
    gate: Mutex<Option<bool>>,
    gate_cv: Condvar,
    /// Syncs waiting at the gate.
    at_gate: AtomicU64,
}

#[derive(Debug, Clone, Default)]
struct Counting(Arc<Shared>);

struct CountingFile {
    f: File,
    path: PathBuf,
    shared: Arc<Shared>,
    /// Appended since the last sync (for `failed_bytes`).
    unsynced: Vec<u8>,
}

impl AppendFile for CountingFile {
    fn append(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.f.write_all(buf)?;
        self.unsynced.extend_from_slice(buf);
        *self
            .shared
            .appended
            .lock()
            .unwrap()
            .entry(self.path.clone())
            .or_default() += buf.len() as u64;
        Ok(())
    }

    fn sync_data(&mut self) -> std::io::Result<()> {
        let s = &self.shared;
        {
            let mut g = s.gate.lock().unwrap();
            if *g == Some(false) {
                s.at_gate.fetch_add(1, Ordering::SeqCst);
                while *g == Some(false) {
                    g = s.gate_cv.wait(g).unwrap();
                }
            }
        }
        std::thread::sleep(s.sync_delay);
        let n = s.syncs.fetch_add(1, Ordering::SeqCst) + 1;
        if s.fail_sync_at.load(Ordering::SeqCst) == n {
            *s.failed_bytes.lock().unwrap() = Some(std::mem::take(&mut self.unsynced));
            return Err(std::io::Error::other("injected fsync failure"));
        }
        // What was appended before the sync started is durable after it.
        let len = s.appended.lock().unwrap()[&self.path];
        self.f.sync_data()?;
        self.unsynced.clear();
        s.synced.lock().unwrap().insert(self.path.clone(), len);
        Ok(())
    }
}

impl FileLayer for Counting {
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>> {
        let f = OpenOptions::new().append(true).open(path)?;
        let len = f.metadata()?.len();
        self.0
            .appended
            .lock()
            .unwrap()
            .insert(path.to_path_buf(), len);
        // What is on disk when the writer opens it (created durably, or
        // recovered) counts as synced.
        self.0
            .synced
            .lock()
            .unwrap()
            .insert(path.to_path_buf(), len);
        Ok(Box::new(CountingFile {
            f,
            path: path.to_path_buf(),
            shared: self.0.clone(),
            unsynced: Vec::new(),
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

impl Counting {
    fn new(sync_delay: Duration, fail_sync_at: Option<u64>) -> Counting {
        Counting(Arc::new(Shared {
            sync_delay,
            fail_sync_at: AtomicU64::new(fail_sync_at.unwrap_or(0)),
            ..Default::default()
        }))
    }

    fn syncs(&self) -> u64 {
        self.0.syncs.load(Ordering::SeqCst)
    }

    /// Panics unless a successful sync covered the whole record of `id`.
    fn assert_synced(&self, l: &Ledger, id: &Id) {
        let loc = l
            .locate(id)
            .unwrap()
            .unwrap_or_else(|| panic!("{id} is not visible after its commit returned"));
        let end = loc.offset
            + (RECORD_HEADER_LEN + RECORD_TRAILER_LEN) as u64
            + loc.body_len as u64
            + loc.meta_len as u64;
        let path = l.dir().join("segments").join(format!("{:08}.seg", loc.seg));
        let synced = self.0.synced.lock().unwrap().get(&path).copied();
        assert!(
            synced.is_some_and(|s| s >= end),
            "{id} ends at byte {end} of segment {} but only {synced:?} bytes were synced when its commit returned",
            loc.seg
        );
    }

    fn close_gate(&self) {
        *self.0.gate.lock().unwrap() = Some(false);
    }

    fn open_gate(&self) {
        *self.0.gate.lock().unwrap() = Some(true);
        self.0.gate_cv.notify_all();
    }

    fn wait_at_gate(&self, n: u64) {
        while self.0.at_gate.load(Ordering::SeqCst) < n {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn opts(files: &Counting, segment_max: u64) -> Options {
    Options {
        segment_max,
        files: Arc::new(files.clone()),
        ..Options::default()
    }
}

/// A model-call effect as the engine records one: a "started" event, then
/// a "finished" event referring to the request and response blobs.
fn model_call(l: &Ledger, stream: &str, head: Option<Id>, t: usize, i: usize) -> (Vec<Id>, Id) {
    let started = l
        .append(
            stream,
            head,
            NewEvent::new("model.started", 1, format!("call {t}/{i}").into_bytes()),
        )
        .unwrap();
    let mut b = l.batch();
    let req = b
        .put_blob(format!("request {t}/{i} ").repeat(20).as_bytes())
        .unwrap();
    let resp = b
        .put_blob(format!("response {t}/{i} ").repeat(30).as_bytes())
        .unwrap();
    // Every thread also stores one shared blob: dedup across concurrent
    // commits (only one copy is written, and waits on its group).
    let shared = b
        .put_blob(format!("system prompt {}", i % 3).as_bytes())
        .unwrap();
    let fin = b
        .append(
            stream,
            Some(started),
            NewEvent::new("model.finished", 1, vec![t as u8; 40])
                .with_refs(vec![req, resp, shared]),
        )
        .unwrap();
    b.commit().unwrap();
    (vec![started, req, resp, shared, fin], fin)
}

#[test]
fn concurrent_commits_to_distinct_refs_share_fsyncs_and_survive_reopen() {
    const THREADS: usize = 24;
    const CALLS: usize = 12;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let files = Counting::new(Duration::from_millis(3), None);
    // Small segments: groups roll over into new segment files too.
    let l = Ledger::init_with(&dir, opts(&files, 16 << 10)).unwrap();
    let syncs_before = files.syncs();
    let start = Barrier::new(THREADS);
    let results: Vec<(String, Id, Vec<Id>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (l, files, start) = (&l, &files, &start);
                s.spawn(move || {
                    let stream = format!("rollout/{t}");
                    let mut head = None;
                    let mut all = Vec::new();
                    start.wait();
                    for i in 0..CALLS {
                        let (ids, fin) = model_call(l, &stream, head, t, i);
                        // Acknowledged: a sync covered every record, and the
                        // batch is visible.
                        for id in &ids {
                            files.assert_synced(l, id);
                        }
                        assert_eq!(l.head(&stream).unwrap(), Some(fin));
                        head = Some(fin);
                        all.extend(ids);
                    }
                    (stream, head.unwrap(), all)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let commits = (THREADS * CALLS * 2) as u64;
    let syncs = files.syncs() - syncs_before;
    eprintln!("{commits} commits, {syncs} fsyncs");
    assert!(
        syncs < commits / 2,
        "{commits} concurrent commits took {syncs} fsyncs"
    );
    let segs = std::fs::read_dir(dir.join("segments")).unwrap().count();
    assert!(segs > 2, "segments: {segs}");
    let v = l.verify(&|_| Ok(())).unwrap();
    assert!(v.is_clean(), "{:?}", v.problems);
    drop(l);

    let (l, report) = Ledger::open_reporting(&dir).unwrap();
    assert!(report.tails.is_empty(), "{report:?}");
    for (stream, head, all) in &results {
        assert_eq!(l.head(stream).unwrap(), Some(*head));
        let chain: Vec<Id> = l.chain(*head).map(|e| e.unwrap().id).collect();
        assert_eq!(chain.len(), CALLS * 2, "{stream}");
        for id in all {
            l.raw_object(id).unwrap();
        }
    }
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
}

#[test]
fn concurrent_commits_to_one_ref_detect_every_conflict_and_write_nothing_of_it() {
    const THREADS: usize = 8;
    const WINS: usize = 15;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let files = Counting::new(Duration::from_millis(1), None);
    let l = Ledger::init_with(&dir, opts(&files, 64 << 10)).unwrap();
    let start = Barrier::new(THREADS);
    let results: Vec<(Vec<Id>, Vec<Id>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (l, start) = (&l, &start);
                s.spawn(move || {
                    let mut won = Vec::new();
                    let mut lost_blobs = Vec::new();
                    start.wait();
                    let mut attempt = 0u32;
                    while won.len() < WINS {
                        attempt += 1;
                        let head = l.head("shared").unwrap();
                        let mut b = l.batch();
                        // Unique to this attempt: must not be stored if it loses.
                        let blob = b
                            .put_blob(format!("attempt {t}/{attempt}").as_bytes())
                            .unwrap();
                        let ev = b
                            .append(
                                "shared",
                                head,
                                NewEvent::new("step", 1, vec![t as u8]).with_refs(vec![blob]),
                            )
                            .unwrap();
                        match b.commit() {
                            Ok(()) => won.push(ev),
                            Err(LedgerError::Conflict { expected, .. }) => {
                                assert_eq!(expected, head);
                                assert!(!l.contains(&blob).unwrap());
                                assert!(!l.contains(&ev).unwrap());
                                lost_blobs.push(blob);
                                lost_blobs.push(ev);
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    (won, lost_blobs)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let conflicts: usize = results.iter().map(|r| r.1.len() / 2).sum();
    eprintln!("{} wins, {conflicts} conflicts", THREADS * WINS);
    assert!(conflicts > 0, "no conflicts among {THREADS} threads");
    drop(l);

    let l = Ledger::open(&dir).unwrap();
    let head = l.head("shared").unwrap().unwrap();
    let chain: Vec<Id> = l.chain(head).map(|e| e.unwrap().id).collect();
    assert_eq!(
        chain.len(),
        THREADS * WINS,
        "every win is on the stream, once"
    );
    let on_chain: HashSet<Id> = chain.iter().copied().collect();
    for (won, lost) in &results {
        for id in won {
            assert!(on_chain.contains(id));
        }
        for id in lost {
            assert!(!l.contains(id).unwrap(), "a conflicting batch wrote {id}");
        }
    }
    for (seq, ev) in l.chain(head).map(|e| e.unwrap()).enumerate() {
        assert_eq!(ev.seq as usize, THREADS * WINS - 1 - seq);
    }
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
}

/// Splits a group's bytes into records: (record type, id).
fn records(bytes: &[u8]) -> Vec<(u8, Id)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + RECORD_HEADER_LEN <= bytes.len() {
        let h = &bytes[at..at + RECORD_HEADER_LEN];
        let body = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
        let meta = u32::from_le_bytes(h[12..16].try_into().unwrap()) as usize;
        out.push((h[4], Id::from_slice(&h[20..52]).unwrap()));
        at += RECORD_HEADER_LEN + body + meta + RECORD_TRAILER_LEN;
    }
    out
}

#[test]
fn a_failed_fsync_fails_every_commit_of_its_group_and_poisons_the_writer() {
    const THREADS: usize = 12;
    const FREE: usize = 5;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let files = Counting::new(Duration::from_millis(2), None);
    let l = Ledger::init_with(&dir, opts(&files, 64 << 20)).unwrap();
    // Every thread first commits FREE batches (acknowledged, in groups as
    // timing makes them), then waits. One commit is then held at the gate
    // in its sync, every thread makes one more commit (all of them join the
    // next open group, as no group can be written while one is held), and
    // that group's sync fails. Which commits share the failed group is
    // known by construction, not by timing (a sleep made it hold one
    // commit, now and then, on a loaded machine).
    let free_done = Barrier::new(THREADS + 1);
    let go = Barrier::new(THREADS + 1);
    let entered = AtomicU64::new(0);
    type Outcome = (Id, Id, Result<(), String>);
    let commit = |stream: &str, head: Option<Id>, payload: String| -> Outcome {
        let mut b = l.batch();
        let blob = b.put_blob(payload.as_bytes()).unwrap();
        let ev = b
            .append(
                stream,
                head,
                NewEvent::new("k", 1, payload.into_bytes()).with_refs(vec![blob]),
            )
            .unwrap();
        let r = b.commit().map_err(|e| e.to_string());
        if r.is_ok() {
            files.assert_synced(&l, &ev);
            files.assert_synced(&l, &blob);
        }
        (ev, blob, r)
    };
    let (outcomes, held): (Vec<Vec<Outcome>>, Outcome) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (commit, free_done, go, entered) = (&commit, &free_done, &go, &entered);
                s.spawn(move || {
                    let stream = format!("r/{t}");
                    let mut head = None;
                    let mut out = Vec::new();
                    for i in 0..FREE {
                        let o = commit(&stream, head, format!("{t}/{i}"));
                        assert!(o.2.is_ok(), "{:?}", o.2);
                        head = Some(o.0);
                        out.push(o);
                    }
                    free_done.wait();
                    go.wait();
                    entered.fetch_add(1, Ordering::SeqCst);
                    out.push(commit(&stream, head, format!("{t}/last")));
                    out
                })
            })
            .collect();
        free_done.wait();
        // Nothing else is syncing now: the next sync is the held commit's,
        // the one after it the workers' group.
        files.close_gate();
        files
            .0
            .fail_sync_at
            .store(files.syncs() + 2, Ordering::SeqCst);
        let holder = s.spawn(|| commit("held", None, "held".into()));
        files.wait_at_gate(1);
        go.wait();
        while entered.load(Ordering::SeqCst) < THREADS as u64 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Each worker has entered its commit; placing it in the open group
        // takes microseconds.
        std::thread::sleep(Duration::from_millis(100));
        files.open_gate();
        let held = holder.join().unwrap();
        (
            handles.into_iter().map(|h| h.join().unwrap()).collect(),
            held,
        )
    });
    assert!(held.2.is_ok(), "the held commit failed: {:?}", held.2);
    let failed_bytes = files.0.failed_bytes.lock().unwrap().clone().unwrap();
    let in_failed_group: HashSet<Id> = records(&failed_bytes)
        .into_iter()
        .filter(|(t, _)| *t == 3)
        .map(|(_, id)| id)
        .collect();
    let all: Vec<&Outcome> = outcomes.iter().flatten().chain([&held]).collect();
    let errors: Vec<&Outcome> = all.iter().copied().filter(|o| o.2.is_err()).collect();
    eprintln!(
        "{} commits, {} failed, {} in the failed group",
        all.len(),
        errors.len(),
        in_failed_group.len()
    );
    assert!(
        in_failed_group.len() > 1,
        "the failed sync covered {} commits",
        in_failed_group.len()
    );
    for (ev, _, r) in &all {
        if in_failed_group.contains(ev) {
            let e = r
                .as_ref()
                .expect_err("a commit of the failed group was acknowledged");
            assert!(e.contains("injected fsync failure"), "{e}");
        }
    }
    // Every thread stopped at an error: nothing commits after the failure.
    assert_eq!(errors.len(), THREADS);
    let e = l.put_blob(b"after the failure").unwrap_err();
    assert!(e.to_string().contains("reopen"), "{e}");
    drop(l);

    let (l, report) = Ledger::open_reporting(&dir).unwrap();
    assert!(report.tails.is_empty(), "{report:?}");
    for (ev, blob, r) in &all {
        match r {
            Ok(()) => {
                l.raw_object(ev).unwrap();
                l.raw_object(blob).unwrap();
            }
            // The failed group reached the file whole (only its sync
            // failed) and may read back; later ones were never written.
            Err(_) if in_failed_group.contains(ev) => {}
            Err(_) => assert!(!l.contains(ev).unwrap()),
        }
    }
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
}

#[test]
fn a_batch_is_invisible_until_its_group_is_durable_but_later_commits_see_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let files = Counting::new(Duration::ZERO, None);
    let l = Ledger::init_with(&dir, opts(&files, 64 << 20)).unwrap();
    let base = l.append("r", None, NewEvent::new("k", 1, vec![0])).unwrap();
    let blob = Id::of(ledger::ObjectKind::Blob, b"held at the gate");
    files.close_gate();
    std::thread::scope(|s| {
        let l = &l;
        let a = s.spawn(move || {
            let mut b = l.batch();
            b.put_blob(b"held at the gate").unwrap();
            let ev = b
                .append(
                    "r",
                    Some(base),
                    NewEvent::new("k", 1, vec![1]).with_refs(vec![blob]),
                )
                .unwrap();
            b.commit().unwrap();
            ev
        });
        files.wait_at_gate(1);
        // Written, not durable: readers see the state before it.
        assert_eq!(l.head("r").unwrap(), Some(base));
        assert!(!l.contains(&blob).unwrap());
        assert_eq!(l.refs().unwrap(), vec![("r".to_string(), base)]);
        // Compare-and-swap sees it: the old head is refused (once the head
        // that refuses it is durable, so a retry can see it).
        let stale = s.spawn(move || l.append("r", Some(base), NewEvent::new("k", 1, vec![2])));
        // Link checks see it: an event naming its blob is accepted, and
        // acknowledged after the blob's group.
        let linker = s.spawn(move || {
            l.append(
                "r2",
                None,
                NewEvent::new("k", 1, vec![3]).with_refs(vec![blob]),
            )
            .unwrap()
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!a.is_finished() && !stale.is_finished() && !linker.is_finished());
        assert_eq!(l.head("r").unwrap(), Some(base));
        assert_eq!(l.head("r2").unwrap(), None);
        files.open_gate();
        let ev_a = a.join().unwrap();
        let Err(LedgerError::Conflict { actual, .. }) = stale.join().unwrap() else {
            panic!("a stale head was accepted")
        };
        assert_eq!(actual, Some(ev_a));
        assert_eq!(l.head("r").unwrap(), Some(ev_a));
        let ev_l = linker.join().unwrap();
        assert_eq!(l.head("r2").unwrap(), Some(ev_l));
        files.assert_synced(l, &ev_l);
        files.assert_synced(l, &blob);
    });
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    drop(l);
    let l = Ledger::open(&dir).unwrap();
    assert_eq!(l.chain(l.head("r").unwrap().unwrap()).count(), 2);
}

#[test]
fn a_commit_of_an_object_being_synced_waits_for_that_sync() {
    // Dedup against an unsynced object: the second commit writes nothing,
    // but is acknowledged only once the first one's group is durable.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let files = Counting::new(Duration::ZERO, None);
    let l = Ledger::init_with(&dir, opts(&files, 64 << 20)).unwrap();
    files.close_gate();
    std::thread::scope(|s| {
        let a = s.spawn(|| l.put_blob(b"the same bytes").unwrap());
        files.wait_at_gate(1);
        let b = s.spawn(|| l.put_blob(b"the same bytes").unwrap());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!b.is_finished(), "acknowledged before the sync");
        files.open_gate();
        let (ia, ib) = (a.join().unwrap(), b.join().unwrap());
        assert_eq!(ia, ib);
        files.assert_synced(&l, &ib);
    });
    let seg = std::fs::read(dir.join("segments/00000001.seg")).unwrap();
    let copies = records(&seg[ledger::format::SEGMENT_HEADER_LEN as usize..])
        .iter()
        .filter(|(t, _)| *t == 1)
        .count();
    assert_eq!(copies, 1, "the blob was written {copies} times");
}

#[test]
fn concurrent_snapshots_store_valid_tree_and_blob_deltas() {
    const THREADS: usize = 4;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let files = Counting::new(Duration::from_millis(1), None);
    let l = Ledger::init_with(&dir, opts(&files, 256 << 10)).unwrap();
    let trees: Vec<(PathBuf, Id)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (l, root) = (&l, tmp.path());
                s.spawn(move || {
                    let mut out = Vec::new();
                    for v in 0..6 {
                        let ws = root.join(format!("ws-{t}-{v}"));
                        std::fs::create_dir_all(&ws).unwrap();
                        // Versions share most files: trees and blobs store as deltas.
                        for f in 0..30 {
                            // Text that compresses poorly on its own.
                            let mut x = (f as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                            let mut text = String::new();
                            for _ in 0..600 {
                                x ^= x << 13;
                                x ^= x >> 7;
                                x ^= x << 17;
                                text.push_str(&format!("{} ", x % 9973));
                            }
                            if f % 6 == v % 6 {
                                text.push_str(&format!("edit {t} {v}\n"));
                            }
                            std::fs::write(ws.join(format!("f{f}.txt")), text).unwrap();
                        }
                        out.push((ws.clone(), l.snapshot_dir(&ws).unwrap()));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let (mut tree_deltas, mut blob_deltas) = (0, 0);
    for (_, loc) in l.locations().unwrap() {
        if loc.flags & 2 != 0 {
            match loc.kind {
                ledger::ObjectKind::Tree => tree_deltas += 1,
                _ => blob_deltas += 1,
            }
        }
    }
    eprintln!("deltas: {tree_deltas} trees, {blob_deltas} blobs");
    assert!(tree_deltas > 0 && blob_deltas > 0);
    drop(l);
    let l = Ledger::open(&dir).unwrap();
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    for (i, (ws, tree)) in trees.iter().enumerate() {
        let out = tmp.path().join(format!("out-{i}"));
        l.checkout(tree, &out).unwrap();
        for e in std::fs::read_dir(ws).unwrap() {
            let e = e.unwrap();
            assert_eq!(
                std::fs::read(e.path()).unwrap(),
                std::fs::read(out.join(e.file_name())).unwrap()
            );
        }
    }
}

/// A failed sync cuts nothing (issue 23: no code path shortens a segment):
/// every byte written before is unchanged, the failed group's bytes stay
/// after them, the writer stops, and the next open reads every acknowledged
/// batch (and the failed group, which reached the file whole: not
/// acknowledged, but complete).
#[test]
fn a_failed_sync_never_cuts_and_every_acknowledged_batch_opens_again() {
    for fail_at in [2u64, 3, 5, 8] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("l");
        let files = Counting::new(Duration::ZERO, Some(fail_at));
        let l = Ledger::init_with(&dir, opts(&files, 64 << 20)).unwrap();
        let mut acked = Vec::new();
        let mut head = None;
        let mut before: Option<(PathBuf, Vec<u8>)> = None;
        for i in 0..20u8 {
            // The segment as it stands after the last acknowledged commit.
            let (path, synced) = files
                .0
                .synced
                .lock()
                .unwrap()
                .iter()
                .max_by_key(|(p, _)| (*p).clone())
                .map(|(p, n)| (p.clone(), *n))
                .unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(
                bytes.len() as u64,
                synced,
                "fail_at {fail_at}: unsynced bytes before commit {i}"
            );
            before = Some((path, bytes));
            let mut b = l.batch();
            let blob = b.put_blob(format!("payload {i}").as_bytes()).unwrap();
            let ev = b
                .append(
                    "r",
                    head,
                    NewEvent::new("k", 1, vec![i]).with_refs(vec![blob]),
                )
                .unwrap();
            match b.commit() {
                Ok(()) => {
                    head = Some(ev);
                    acked.push((ev, blob));
                }
                Err(e) => {
                    assert!(e.to_string().contains("injected fsync failure"), "{e}");
                    break;
                }
            }
        }
        assert!(
            !acked.is_empty() && acked.len() < 20,
            "fail_at {fail_at}: {} acked",
            acked.len()
        );
        let (path, bytes) = before.unwrap();
        // Nothing before the failed group changed, and nothing was cut.
        let now = std::fs::read(&path).unwrap();
        assert!(
            now.len() > bytes.len(),
            "fail_at {fail_at}: the failed group was cut"
        );
        assert_eq!(&now[..bytes.len()], &bytes[..], "fail_at {fail_at}");
        drop(l);
        let (l, report) = Ledger::open_reporting(&dir).unwrap();
        assert!(report.tails.is_empty(), "fail_at {fail_at}: {report:?}");
        assert!(report.damage.is_empty(), "fail_at {fail_at}: {report:?}");
        assert_eq!(std::fs::read(&path).unwrap(), now, "fail_at {fail_at}");
        for (ev, blob) in &acked {
            l.raw_object(ev).unwrap();
            l.raw_object(blob).unwrap();
        }
        let h = l.head("r").unwrap();
        assert!(
            h == head || l.get_event(&h.unwrap()).unwrap().prev == head,
            "fail_at {fail_at}"
        );
        assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    }
}

/// Counts wake-ups of a task awaiting a `Durability`.
#[derive(Default)]
struct CountingWaker(AtomicU64);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_submitted_commit_is_awaited_without_a_thread_and_acknowledged_once_durable() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let files = Counting::new(Duration::ZERO, None);
    let l = Ledger::init_with(&dir, opts(&files, 64 << 20)).unwrap();
    files.close_gate();
    std::thread::scope(|s| {
        let l = &l;
        // A blocking commit leads and is held in its sync.
        let first = s.spawn(move || l.append("a", None, NewEvent::new("k", 1, vec![1])).unwrap());
        files.wait_at_gate(1);
        let mut b = l.batch();
        let ev = b.append("b", None, NewEvent::new("k", 1, vec![2])).unwrap();
        let mut durable = std::pin::pin!(b.submit().unwrap());
        let count = Arc::new(CountingWaker::default());
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        // Someone else is syncing: the task is parked, not the thread.
        assert!(durable.as_mut().poll(&mut cx).is_pending());
        assert!(durable.as_mut().poll(&mut cx).is_pending());
        assert_eq!(l.head("b").unwrap(), None, "visible before durable");
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        files.open_gate();
        first.join().unwrap();
        // The leader's end wakes the task (once, though it polled twice).
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        // Its group is not durable yet and no one leads: this poll does.
        assert!(matches!(
            durable.as_mut().poll(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(l.head("b").unwrap(), Some(ev));
        files.assert_synced(l, &ev);
    });
    // A submitted commit whose Durability is dropped is made durable by the
    // next group (groups are written in order): the harness relies on it for
    // workspace snapshots, which the tool record committed next links.
    let mut b = l.batch();
    let blob = b.put_blob(b"a snapshot's file").unwrap();
    drop(b.submit().unwrap());
    let linker = l
        .append(
            "c",
            None,
            NewEvent::new("k", 1, vec![3]).with_refs(vec![blob]),
        )
        .unwrap();
    files.assert_synced(&l, &linker);
    files.assert_synced(&l, &blob);
    assert!(l.contains(&blob).unwrap());
    // One that no later commit covers is written when the ledger closes.
    let mut b = l.batch();
    let last = b.put_blob(b"submitted last, never awaited").unwrap();
    drop(b.submit().unwrap());
    assert!(!l.contains(&last).unwrap(), "visible before durable");
    drop(l);
    let l = Ledger::open(&dir).unwrap();
    assert!(l.contains(&blob).unwrap());
    assert!(l.contains(&last).unwrap(), "lost at a clean close");
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
}

/// `Durability::detach` and `Ledger::settle`: a caller submits commits,
/// goes on using the ledger, and later waits once for all of them (the
/// harness leaves a model reply's and a file tool's records unsettled and
/// settles them before the next request). Settling the later of two
/// acknowledges both, and only once a sync covers their bytes;
/// `all_durable` says whether anything submitted still waits; a commit of
/// another ledger is refused, never taken as settled.
#[test]
fn detached_commits_are_settled_together_and_only_once_durable() {
    let tmp = tempfile::tempdir().unwrap();
    let files = Counting::new(Duration::ZERO, None);
    let l = Ledger::init_with(&tmp.path().join("l"), opts(&files, 64 << 20)).unwrap();
    assert!(l.all_durable(), "a new ledger has nothing waiting");
    let mut b = l.batch();
    let first = b.append("r", None, NewEvent::new("k", 1, vec![1])).unwrap();
    let u1 = b.submit().unwrap().detach();
    assert!(!l.all_durable(), "a submitted commit is not durable yet");
    let mut b = l.batch();
    let second = b
        .append("r", Some(first), NewEvent::new("k", 1, vec![2]))
        .unwrap();
    let u2 = b.submit().unwrap().detach();
    assert!(!l.contains(&first).unwrap(), "visible before durable");
    assert_eq!(files.0.syncs.load(Ordering::SeqCst), 0, "nothing led yet");
    // `and` in either order stands for the later group.
    assert_eq!(u1.and(u2), u2.and(u1));
    l.settle(u1.and(u2)).unwrap().wait().unwrap();
    files.assert_synced(&l, &first);
    files.assert_synced(&l, &second);
    assert_eq!(l.head("r").unwrap(), Some(second));
    assert!(l.all_durable());
    // Settling an acknowledged commit again, or nothing, is immediate.
    l.settle(u1).unwrap().wait().unwrap();
    l.settle(ledger::Unsettled::default())
        .unwrap()
        .wait()
        .unwrap();
    // Another ledger's commit: refused, for itself and joined with ours.
    let other = Ledger::init(&tmp.path().join("other")).unwrap();
    let mut b = other.batch();
    b.append("o", None, NewEvent::new("k", 1, vec![3])).unwrap();
    let foreign = b.submit().unwrap().detach();
    let mut b = l.batch();
    let third = b
        .append("r", Some(second), NewEvent::new("k", 1, vec![4]))
        .unwrap();
    let ours = b.submit().unwrap().detach();
    for u in [foreign, foreign.and(ours), ours.and(foreign)] {
        assert!(matches!(
            l.settle(u),
            Err(LedgerError::ForeignCommit { .. })
        ));
    }
    assert!(
        !l.contains(&third).unwrap(),
        "a refused settle waited for nothing"
    );
    other.settle(foreign).unwrap().wait().unwrap();
    assert!(other.all_durable());
    l.settle(ours).unwrap().wait().unwrap();
    files.assert_synced(&l, &third);
}

/// `Unsettled::and` of commits in different groups (another committer led
/// and sealed the first group in between, as another rollout does between
/// a reply's record and the file tool's after it) stands for the later
/// group: settling it makes both durable.
#[test]
fn and_of_commits_in_different_groups_settles_the_later() {
    let tmp = tempfile::tempdir().unwrap();
    let files = Counting::new(Duration::ZERO, None);
    let l = Ledger::init_with(&tmp.path().join("l"), opts(&files, 64 << 20)).unwrap();
    let mut b = l.batch();
    let e1 = b.append("r", None, NewEvent::new("k", 1, vec![1])).unwrap();
    let u1 = b.submit().unwrap().detach();
    // Another committer leads (and so seals) the first group.
    l.append("other", None, NewEvent::new("k", 1, vec![9]))
        .unwrap();
    let mut b = l.batch();
    let e2 = b
        .append("r", Some(e1), NewEvent::new("k", 1, vec![2]))
        .unwrap();
    let u2 = b.submit().unwrap().detach();
    assert_ne!(u1, u2, "the two commits are in different groups");
    for u in [u1.and(u2), u2.and(u1)] {
        l.settle(u).unwrap().wait().unwrap();
        files.assert_synced(&l, &e1);
        files.assert_synced(&l, &e2);
        assert!(l.all_durable());
    }
}
