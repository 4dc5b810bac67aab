//! Power-loss simulation. The writer appends and syncs through a file layer
//! that keeps unsynced appends in memory (as a page cache would) and cuts the
//! power at a chosen operation: that operation and every later one fail, and
//! only synced bytes are on disk. Then some of the unsynced bytes reach the
//! disk anyway (none, all, a prefix, or arbitrary 512-byte sectors with holes
//! left as zeros), the index may be lost too, and the ledger is reopened with
//! the real file layer. Every acknowledged batch must be there; the batch in
//! flight is there whole or not at all; the ledger verifies clean and takes
//! new writes. Segments are small so rollovers happen under the cut.
//!
//! Removing the `sync_data` before acknowledgement in `Ledger::commit` makes
//! this test fail (unsynced acknowledged bytes are dropped at the cut).
//!
//! The second test does the same with several threads committing at once,
//! so the cut hits a group of commits that share one write and one sync.
//! Writing each commit with its own marker (several complete batches in one
//! unsynced range) makes it fail: pages of a later commit reach the disk
//! while an earlier one's do not, and the hole looks like damage.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ledger::{AppendFile, FileLayer, Id, Ledger, NewEvent, Options};

#[derive(Debug, Default)]
struct Power {
    ops: u64,
    cut_at: u64,
    cut: bool,
    /// Unsynced appends per file: (offset, bytes).
    unsynced: HashMap<PathBuf, Vec<(u64, Vec<u8>)>>,
    /// The file length as the writer sees it (synced + unsynced).
    len: HashMap<PathBuf, u64>,
    /// Successful syncs.
    syncs: u64,
    /// How long a sync takes (so concurrent committers pile up behind one).
    sync_delay: std::time::Duration,
}

#[derive(Debug, Clone)]
struct SimFiles(Arc<Mutex<Power>>);

impl SimFiles {
    fn op(&self) -> std::io::Result<std::sync::MutexGuard<'_, Power>> {
        let mut p = self.0.lock().unwrap();
        if p.cut {
            return Err(std::io::Error::other("power is off"));
        }
        p.ops += 1;
        if p.ops == p.cut_at {
            p.cut = true;
            return Err(std::io::Error::other("power cut"));
        }
        Ok(p)
    }
}

struct SimAppend {
    files: SimFiles,
    path: PathBuf,
}

impl AppendFile for SimAppend {
    fn append(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let mut p = self.files.op()?;
        let at = p.len[&self.path];
        p.unsynced
            .entry(self.path.clone())
            .or_default()
            .push((at, buf.to_vec()));
        *p.len.get_mut(&self.path).unwrap() += buf.len() as u64;
        Ok(())
    }

    fn sync_data(&mut self) -> std::io::Result<()> {
        let delay = self.files.0.lock().unwrap().sync_delay;
        std::thread::sleep(delay);
        let mut p = self.files.op()?;
        p.syncs += 1;
        let pending = p.unsynced.remove(&self.path).unwrap_or_default();
        let f = OpenOptions::new().write(true).open(&self.path)?;
        for (at, bytes) in pending {
            f.write_all_at(&bytes, at)?;
        }
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        let mut p = self.files.op()?;
        if let Some(v) = p.unsynced.get_mut(&self.path) {
            v.retain(|(at, _)| *at < len);
        }
        p.len.insert(self.path.clone(), len);
        Ok(())
    }
}

impl FileLayer for SimFiles {
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>> {
        let mut p = self.op()?;
        let len = std::fs::metadata(path)?.len();
        p.len.insert(path.to_path_buf(), len);
        Ok(Box::new(SimAppend {
            files: self.clone(),
            path: path.to_path_buf(),
        }))
    }

    fn create_durably(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        drop(self.op()?);
        // Creating a segment is modelled as atomic (temp file, fsync, rename,
        // directory fsync all happen or none).
        ledger::OsFiles.create_durably(path, bytes)
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Lets some unsynced bytes reach the disk, as a real cut may.
fn persist_some(p: &Power, rng: &mut Rng) -> &'static str {
    let mode = rng.below(4);
    for (path, chunks) in &p.unsynced {
        let f = OpenOptions::new().write(true).open(path).unwrap();
        for (at, bytes) in chunks {
            match mode {
                0 => {}
                1 => f.write_all_at(bytes, *at).unwrap(),
                2 => {
                    let n = rng.below(bytes.len() as u64 + 1) as usize;
                    f.write_all_at(&bytes[..n], *at).unwrap();
                }
                _ => {
                    for (i, sector) in bytes.chunks(512).enumerate() {
                        if rng.below(2) == 0 {
                            f.write_all_at(sector, at + 512 * i as u64).unwrap();
                        }
                    }
                }
            }
        }
    }
    ["none", "all", "prefix", "sectors"][mode as usize]
}

struct Acked {
    /// Acknowledged head per stream.
    heads: HashMap<String, Id>,
    /// Every acknowledged object.
    objects: Vec<Id>,
}

#[test]
fn every_acknowledged_batch_survives_a_power_cut() {
    let mut modes: HashMap<&str, u32> = HashMap::new();
    let mut rollovers = 0;
    let mut torn_tails = 0;
    for seed in 1..=60u64 {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("l");
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let power = Arc::new(Mutex::new(Power {
            cut_at: u64::MAX,
            ..Default::default()
        }));
        let files = SimFiles(power.clone());
        let opts = Options {
            segment_max: 8 << 10,
            files: Arc::new(files.clone()),
            ..Options::default()
        };
        let l = Ledger::init_with(&dir, opts).unwrap();
        {
            let mut p = power.lock().unwrap();
            p.cut_at = p.ops + 1 + rng.below(120);
        }
        let mut acked = Acked {
            heads: HashMap::new(),
            objects: Vec::new(),
        };
        let mut in_flight: Option<(String, Id)> = None;
        for i in 0u64.. {
            let stream = format!("s{}", rng.below(3));
            let head = acked.heads.get(&stream).copied();
            let mut b = l.batch();
            let mut objs = Vec::new();
            for _ in 0..rng.below(3) {
                let len = 16 + rng.below(3000) as usize;
                let blob: Vec<u8> = (0..len).map(|j| (j as u64 ^ i ^ seed) as u8).collect();
                objs.push(b.put_blob(&blob).unwrap());
            }
            let ev = b
                .append(
                    &stream,
                    head,
                    NewEvent::new("p.step", 1, i.to_le_bytes().to_vec()).with_refs(objs.clone()),
                )
                .unwrap();
            objs.push(ev);
            match b.commit() {
                Ok(()) => {
                    acked.heads.insert(stream, ev);
                    acked.objects.extend(objs);
                }
                Err(_) => {
                    in_flight = Some((stream, ev));
                    break;
                }
            }
        }
        drop(l);
        let p = std::mem::take(&mut *power.lock().unwrap());
        let mode = persist_some(&p, &mut rng);
        *modes.entry(mode).or_default() += 1;
        if seed % 3 == 0 {
            // sled's own unflushed state is lost too: no index at all.
            std::fs::remove_dir_all(dir.join("index")).unwrap();
        }
        let segs = std::fs::read_dir(dir.join("segments")).unwrap().count();
        if segs > 1 {
            rollovers += 1;
        }

        let (l, report) = Ledger::open_reporting(&dir)
            .unwrap_or_else(|e| panic!("seed {seed} ({mode}): reopen failed: {e}"));
        for id in &acked.objects {
            l.raw_object(id)
                .unwrap_or_else(|e| panic!("seed {seed} ({mode}): acknowledged {id} lost: {e}"));
        }
        let (fl_stream, fl_ev) = in_flight.expect("the cut always interrupts a commit");
        for (s, h) in &acked.heads {
            let now = l.head(s).unwrap();
            let ok = now == Some(*h) || (*s == fl_stream && now == Some(fl_ev));
            assert!(
                ok,
                "seed {seed} ({mode}): stream {s} at {now:?}, acknowledged {h}"
            );
        }
        // The batch in flight is all there or not at all.
        let fl_head = l.head(&fl_stream).unwrap();
        if fl_head == Some(fl_ev) {
            let ev = l.get_event(&fl_ev).unwrap();
            for r in &ev.refs {
                l.raw_object(r).unwrap();
            }
        } else {
            assert_eq!(fl_head, acked.heads.get(&fl_stream).copied());
        }
        let v = l.verify(&|_| Ok(())).unwrap();
        assert!(
            v.is_clean(),
            "seed {seed} ({mode}): {:?} {report:?}",
            v.problems
        );
        if !report.set_aside.is_empty() {
            torn_tails += 1;
        }
        // Whatever was cut off is in quarantine, not gone.
        for s in &report.set_aside {
            assert_eq!(
                std::fs::metadata(dir.join(&s.file)).unwrap().len(),
                s.len,
                "seed {seed}"
            );
        }
        let h = l.head(&fl_stream).unwrap();
        l.append(&fl_stream, h, NewEvent::new("p.after", 1, vec![]))
            .unwrap_or_else(|e| panic!("seed {seed} ({mode}): write after recovery: {e}"));
    }
    assert!(
        rollovers > 10,
        "segment rollovers under the cut: {rollovers}"
    );
    assert!(torn_tails > 5, "torn tails set aside: {torn_tails}");
    for m in ["none", "all", "prefix", "sectors"] {
        assert!(modes.get(m).copied().unwrap_or(0) > 3, "{modes:?}");
    }
}

/// What one committing thread saw.
#[derive(Default)]
struct ThreadLog {
    stream: String,
    head: Option<Id>,
    objects: Vec<Id>,
    acked: u64,
    /// The commit that failed at the cut: its event and objects.
    in_flight: Option<(Id, Vec<Id>)>,
}

#[test]
fn concurrent_commits_survive_a_power_cut() {
    const THREADS: u64 = 4;
    let mut modes: HashMap<&str, u32> = HashMap::new();
    let (mut commits, mut syncs, mut torn_tails, mut in_flight_kept) = (0u64, 0u64, 0, 0);
    for seed in 1..=40u64 {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("l");
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let power = Arc::new(Mutex::new(Power {
            cut_at: u64::MAX,
            sync_delay: std::time::Duration::from_micros(500),
            ..Default::default()
        }));
        let files = SimFiles(power.clone());
        let opts = Options {
            segment_max: 8 << 10,
            files: Arc::new(files.clone()),
            ..Options::default()
        };
        let l = Ledger::init_with(&dir, opts).unwrap();
        {
            let mut p = power.lock().unwrap();
            p.cut_at = p.ops + 20 + rng.below(100);
        }
        let start = std::sync::Barrier::new(THREADS as usize);
        let logs: Vec<ThreadLog> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (l, start) = (&l, &start);
                    s.spawn(move || {
                        let mut rng = Rng((seed * 31 + t).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
                        let mut log = ThreadLog {
                            stream: format!("t{t}"),
                            ..Default::default()
                        };
                        start.wait();
                        for i in 0u64.. {
                            let mut b = l.batch();
                            let mut objs = Vec::new();
                            for _ in 0..rng.below(3) {
                                let len = 16 + rng.below(1500) as usize;
                                let blob: Vec<u8> =
                                    (0..len).map(|j| (j as u64 ^ i ^ t ^ seed) as u8).collect();
                                objs.push(b.put_blob(&blob).unwrap());
                            }
                            let ev = b
                                .append(
                                    &log.stream,
                                    log.head,
                                    NewEvent::new("p.step", 1, i.to_le_bytes().to_vec())
                                        .with_refs(objs.clone()),
                                )
                                .unwrap();
                            match b.commit() {
                                Ok(()) => {
                                    log.head = Some(ev);
                                    log.objects.extend(objs);
                                    log.objects.push(ev);
                                    log.acked += 1;
                                }
                                Err(_) => {
                                    log.in_flight = Some((ev, objs));
                                    return log;
                                }
                            }
                        }
                        unreachable!()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        drop(l);
        let p = std::mem::take(&mut *power.lock().unwrap());
        commits += logs.iter().map(|g| g.acked).sum::<u64>();
        syncs += p.syncs;
        let mode = persist_some(&p, &mut rng);
        *modes.entry(mode).or_default() += 1;
        if seed % 3 == 0 {
            std::fs::remove_dir_all(dir.join("index")).unwrap();
        }
        let (l, report) = Ledger::open_reporting(&dir)
            .unwrap_or_else(|e| panic!("seed {seed} ({mode}): reopen failed: {e}"));
        if !report.set_aside.is_empty() {
            torn_tails += 1;
        }
        for g in &logs {
            for id in &g.objects {
                l.raw_object(id).unwrap_or_else(|e| {
                    panic!("seed {seed} ({mode}): acknowledged {id} lost: {e}")
                });
            }
            let now = l.head(&g.stream).unwrap();
            let (fl_ev, fl_objs) = g.in_flight.as_ref().unwrap();
            if now == Some(*fl_ev) {
                // The unacknowledged commit is there whole.
                in_flight_kept += 1;
                for id in fl_objs {
                    l.raw_object(id).unwrap();
                }
            } else {
                assert_eq!(now, g.head, "seed {seed} ({mode}): stream {}", g.stream);
            }
        }
        let v = l.verify(&|_| Ok(())).unwrap();
        assert!(v.is_clean(), "seed {seed} ({mode}): {:?}", v.problems);
        let h = l.head("t0").unwrap();
        l.append("t0", h, NewEvent::new("p.after", 1, vec![]))
            .unwrap_or_else(|e| panic!("seed {seed} ({mode}): write after recovery: {e}"));
    }
    eprintln!(
        "{commits} acknowledged commits, {syncs} syncs, {torn_tails} torn tails, {in_flight_kept} unacknowledged commits kept whole, modes {modes:?}"
    );
    assert!(torn_tails > 3, "torn tails set aside: {torn_tails}");
    assert!(syncs < commits, "commits did not share syncs");
    for m in ["none", "all", "prefix", "sectors"] {
        assert!(modes.get(m).copied().unwrap_or(0) > 2, "{modes:?}");
    }
}
