//! Crash test: a child process (this test binary, re-run with an environment
//! variable) commits continuously from several threads at once (so commits
//! share group commits) and prints every acknowledged append; the parent
//! SIGKILLs it at random moments, then checks that the ledger opens, `verify`
//! is clean, every acknowledged event is present on its stream, and every
//! stream is a hash chain (a prefix of what was written).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use ledger::{Id, Ledger, LedgerError, NewEvent};

const CHILD_ENV: &str = "LEDGER_CRASH_CHILD_DIR";
/// Committing threads in the child, and streams each owns.
const THREADS: usize = 4;
const STREAMS: usize = 3;
/// One more stream, `crash/{SHARED}`, that every thread appends to now and
/// then (compare-and-swap with retries).
const SHARED: usize = THREADS * STREAMS;

fn stream_name(s: usize) -> String {
    format!("crash/{s}")
}

/// The child's body; a no-op unless run as the crash child.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let seed: u64 = std::env::var("LEDGER_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let l = Ledger::open(std::path::Path::new(&dir)).expect("child open");
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let l = &l;
            scope.spawn(move || child_thread(l, seed, t));
        }
    });
}

fn child_thread(l: &Ledger, seed: u64, t: usize) {
    let ack = |s: usize, id: Id| {
        // One line per write, so lines of different threads never mix.
        let mut out = std::io::stdout().lock();
        writeln!(out, "ACK {s} {id}").unwrap();
        out.flush().unwrap();
    };
    let mut rng = (seed * 7 + t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mine: Vec<usize> = (0..STREAMS).map(|s| t * STREAMS + s).collect();
    let mut heads: Vec<Option<Id>> = mine
        .iter()
        .map(|&s| l.head(&stream_name(s)).unwrap())
        .collect();
    for i in 0u64.. {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let k = (rng % STREAMS as u64) as usize;
        let s = mine[k];
        let len = 64 + (rng >> 8) as usize % 1985; // 64 B to 2 KiB
        let payload: Vec<u8> = (0..len).map(|j| (j as u64 ^ rng ^ i) as u8).collect();
        let name = stream_name(s);
        if rng.is_multiple_of(8) {
            // The shared stream: retry until the compare-and-swap holds.
            let name = stream_name(SHARED);
            loop {
                let head = l.head(&name).unwrap();
                let ev = NewEvent::new("crash.shared", 1, payload[..16].to_vec());
                match l.append(&name, head, ev) {
                    Ok(id) => {
                        ack(SHARED, id);
                        break;
                    }
                    Err(LedgerError::Conflict { .. }) => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        let id = if rng.is_multiple_of(4) {
            // A batch with a blob and two events on the same stream.
            let mut b = l.batch();
            let blob = b.put_blob(&payload).unwrap();
            let a = b
                .append(
                    &name,
                    heads[k],
                    NewEvent::new("crash.blobref", 1, i.to_le_bytes().to_vec())
                        .with_refs(vec![blob]),
                )
                .unwrap();
            let c = b
                .append(
                    &name,
                    Some(a),
                    NewEvent::new("crash.tail", 1, payload[..8].to_vec()),
                )
                .unwrap();
            b.commit().unwrap();
            ack(s, a);
            c
        } else {
            l.append(&name, heads[k], NewEvent::new("crash.event", 1, payload))
                .unwrap()
        };
        heads[k] = Some(id);
        ack(s, id);
    }
}

#[test]
fn sigkill_at_random_points_loses_nothing_acknowledged() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let rounds: u64 = std::env::var("LEDGER_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    drop(Ledger::init(&path).unwrap());
    let exe = std::env::current_exe().unwrap();
    let mut acked: Vec<(usize, Id)> = Vec::new();
    let mut rng: u64 = 0x1234_5678;
    let mut truncations = 0;
    let mut seg_lens: Vec<u64> = Vec::new();
    let mut reindexed = 0;
    for round in 0..rounds {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let delay = Duration::from_millis(10 + (rng >> 33) % 150);
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .env("LEDGER_CRASH_SEED", (round + 1).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // A line cut short by the kill was never fully reported: skip it.
                if let Some(rest) = line.strip_prefix("ACK ") {
                    let mut it = rest.split(' ');
                    let s = it.next().and_then(|x| x.parse::<usize>().ok());
                    let id = it.next().and_then(|x| x.parse::<Id>().ok());
                    if let (Some(s), Some(id)) = (s, id) {
                        v.push((s, id));
                    }
                }
            }
            v
        });
        std::thread::sleep(delay);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        acked.extend(reader.join().unwrap());

        let (l, report) = Ledger::open_reporting(&path)
            .unwrap_or_else(|e| panic!("round {round}: reopen failed: {e}"));
        if report.tail_bytes() > 0 {
            truncations += 1;
        }
        // No segment ever shrinks: a tail is listed and stepped over.
        let lens = segment_lengths(&path);
        for (i, (was, now)) in seg_lens.iter().zip(&lens).enumerate() {
            assert!(
                now >= was,
                "round {round}: segment {} shrank from {was} to {now}",
                i + 1
            );
        }
        seg_lens = lens;
        reindexed += report.reindexed_records;
        let v = l.verify(&|_| Ok(())).unwrap();
        assert!(v.is_clean(), "round {round}: verify found {:?}", v.problems);
        for s in 0..=SHARED {
            let chain: std::collections::HashSet<Id> = match l.head(&stream_name(s)).unwrap() {
                Some(h) => l.chain(h).map(|e| e.unwrap().id).collect(),
                None => Default::default(),
            };
            for (_, id) in acked.iter().filter(|(st, _)| *st == s) {
                assert!(
                    chain.contains(id),
                    "round {round}: acknowledged {id} missing from stream {s}"
                );
            }
        }
    }
    assert!(
        acked.len() as u64 > rounds,
        "children acknowledged only {} appends",
        acked.len()
    );
    let shared = acked.iter().filter(|(s, _)| *s == SHARED).count();
    assert!(
        shared > 0,
        "no append to the shared stream was acknowledged"
    );
    eprintln!("{rounds} kills, {} acknowledged appends ({shared} to the shared stream, from {THREADS} threads), {truncations} torn tails listed and stepped over, {reindexed} records re-indexed from the log", acked.len());
}

fn segment_lengths(dir: &std::path::Path) -> Vec<u64> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v.iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect()
}

const REBUILD_ENV: &str = "LEDGER_REBUILD_CHILD_DIR";

/// The child for the rebuild test: reindexes (and repairs) in a loop.
#[test]
fn rebuild_child() {
    let Ok(dir) = std::env::var(REBUILD_ENV) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    loop {
        let (l, _) = Ledger::reindex(&dir).expect("child reindex");
        drop(l);
        let (l, _) = Ledger::repair(&dir).expect("child repair");
        drop(l);
        println!("REBUILT");
    }
}

#[test]
fn sigkill_during_an_index_rebuild_loses_nothing() {
    if std::env::var(REBUILD_ENV).is_ok() || std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let mut all: Vec<Id> = Vec::new();
    let mut heads: Vec<(String, Id)> = Vec::new();
    {
        let l = Ledger::init(&path).unwrap();
        let mut head = None;
        for i in 0..3000u32 {
            let blob = l
                .put_blob(format!("payload {i}").repeat(4).as_bytes())
                .unwrap();
            let ev = l
                .append(
                    "r",
                    head,
                    NewEvent::new("k", 1, i.to_le_bytes().to_vec()).with_refs(vec![blob]),
                )
                .unwrap();
            head = Some(ev);
            all.extend([blob, ev]);
        }
        heads.push(("r".into(), head.unwrap()));
    }
    let exe = std::env::current_exe().unwrap();
    let mut rng: u64 = 0xfeed_beef;
    for round in 0..12 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let delay = Duration::from_millis(5 + (rng >> 33) % 300);
        let mut child = Command::new(&exe)
            .args([
                "rebuild_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(REBUILD_ENV, &path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        child.kill().unwrap();
        child.wait().unwrap();
        let l = Ledger::open(&path).unwrap_or_else(|e| panic!("round {round}: reopen: {e}"));
        for (name, h) in &heads {
            assert_eq!(l.head(name).unwrap(), Some(*h), "round {round}");
        }
        for id in &all {
            l.raw_object(id)
                .unwrap_or_else(|e| panic!("round {round}: {id} lost: {e}"));
        }
        assert!(l.verify(&|_| Ok(())).unwrap().is_clean(), "round {round}");
    }
}
