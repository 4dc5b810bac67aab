//! Corruption sweep: flip one byte at each of 240 seeded positions of a
//! fixture ledger (every record type: blobs, trees and tree deltas, events,
//! ref updates, commit markers; headers, bodies, metadata and checksums),
//! then open read-only, verify, open for writing, reindex and repair. Nothing
//! may panic; every object not in the damaged record reads back identical;
//! verify names the damaged record; reindex refuses mid-log damage without
//! changing a byte; repair keeps every intact record; and nothing intact
//! disappears (a damaged last batch is moved into quarantine, not dropped).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use ledger::{Id, Ledger, NewEvent, VerifyOptions};

struct Rec {
    start: u64,
    end: u64,
    /// The object id, for object records (type 1..=3).
    id: Option<Id>,
    /// Index of the batch this record belongs to.
    batch: usize,
}

/// Parses the segment's records (header: type at 4, body len at 8, meta len
/// at 12, id at 20; then body, metadata, 8-byte checksum).
fn records(seg: &[u8]) -> Vec<Rec> {
    let mut out = Vec::new();
    let mut at = 16usize;
    let mut batch = 0;
    while at < seg.len() {
        let u32_at = |o: usize| u32::from_le_bytes(seg[o..o + 4].try_into().unwrap()) as usize;
        let len = 52 + u32_at(at + 8) + u32_at(at + 12) + 8;
        let rtype = seg[at + 4];
        let id = (1..=3)
            .contains(&rtype)
            .then(|| Id(seg[at + 20..at + 52].try_into().unwrap()));
        out.push(Rec {
            start: at as u64,
            end: (at + len) as u64,
            id,
            batch,
        });
        if rtype == 5 {
            batch += 1;
        }
        at += len;
    }
    out
}

fn fixture(dir: &Path) -> Vec<Id> {
    let l = Ledger::init(dir).unwrap();
    let ws = tempfile::tempdir().unwrap();
    fs::create_dir_all(ws.path().join("src")).unwrap();
    let mut ids = Vec::new();
    let mut heads: [Option<Id>; 2] = [None, None];
    for i in 0..30u32 {
        for f in 0..6 {
            let text = format!(
                "file {f} of variant {}\n",
                if f == i as usize % 6 { i } else { 0 }
            );
            fs::write(
                ws.path().join("src").join(format!("f{f}.txt")),
                text.repeat(8),
            )
            .unwrap();
        }
        let mut b = l.batch();
        let blob = b
            .put_blob(format!("blob {i}").repeat(30).as_bytes())
            .unwrap();
        let tree = b.snapshot_dir(ws.path()).unwrap();
        let s = (i % 2) as usize;
        let ev = b
            .append(
                &format!("run/s{s}"),
                heads[s],
                NewEvent::new("sweep.step", 1, i.to_le_bytes().to_vec())
                    .with_refs(vec![blob, tree]),
            )
            .unwrap();
        b.commit().unwrap();
        heads[s] = Some(ev);
        ids.extend([blob, tree, ev]);
    }
    let mut all: Vec<Id> = Vec::new();
    l.for_each_location(|id, _| all.push(id)).unwrap();
    all.sort();
    all
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.file_name().unwrap() == "LOCK" {
            continue;
        }
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

fn read_all(l: &Ledger, ids: &[Id]) -> BTreeMap<Id, Option<Vec<u8>>> {
    ids.iter()
        .map(|id| (*id, l.raw_object(id).ok().map(|(_, b)| b)))
        .collect()
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn a_flipped_byte_anywhere_loses_nothing_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let ids = fixture(&base);
    let original = {
        let l = Ledger::open(&base).unwrap();
        read_all(&l, &ids)
    };
    let seg_path = base.join("segments/00000001.seg");
    let seg = fs::read(&seg_path).unwrap();
    let recs = records(&seg);
    assert_eq!(recs.last().unwrap().end as usize, seg.len());
    // Delta trees: which base each names (read through the clean ledger).
    let deltas: Vec<(Id, Id)> = {
        let l = Ledger::open(&base).unwrap();
        let mut v = Vec::new();
        l.for_each_location(|id, loc| {
            if loc.flags & 2 != 0 {
                let start = loc.offset as usize + 52;
                v.push((id, Id(seg[start..start + 32].try_into().unwrap())));
            }
        })
        .unwrap();
        v
    };
    assert!(!deltas.is_empty(), "the fixture should store tree deltas");

    let mut rng = Rng(0x5EED_C0DE);
    let mut positions: Vec<u64> = (0..200)
        .map(|_| 16 + rng.below(seg.len() as u64 - 16))
        .collect();
    // Make sure every kind of record is hit, including markers and ref updates.
    for r in recs.iter().filter(|r| r.id.is_none()).step_by(3) {
        positions.push(r.start + rng.below(r.end - r.start));
    }
    let last_batch = recs.last().unwrap().batch;
    let (mut refused, mut repaired, mut tails) = (0, 0, 0);
    for (n, &pos) in positions.iter().enumerate() {
        let hit = recs.iter().find(|r| r.start <= pos && pos < r.end).unwrap();
        let case = tmp.path().join(format!("case{n}"));
        copy_dir(&base, &case);
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(case.join("segments/00000001.seg"))
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, pos).unwrap();
        f.write_all_at(&[b[0] ^ 0x5a], pos).unwrap();
        drop(f);

        let mut lost: Vec<Id> = hit.id.into_iter().collect();
        if hit.batch == last_batch {
            lost.extend(
                recs.iter()
                    .filter(|r| r.batch == last_batch)
                    .filter_map(|r| r.id),
            );
        }
        for (d, b) in &deltas {
            if lost.contains(b) {
                lost.push(*d);
            }
        }
        let check = |l: &Ledger, what: &str| {
            let now = read_all(l, &ids);
            for id in &ids {
                if !lost.contains(id) {
                    assert_eq!(
                        now[id], original[id],
                        "flip at {pos} ({what}): {id} changed"
                    );
                }
            }
        };

        // Read-only: everything else reads; verify names the record.
        let ro = Ledger::open_read_only(&case)
            .unwrap_or_else(|e| panic!("flip at {pos}: read-only open failed: {e}"));
        check(&ro, "read-only");
        let v = ro
            .verify_with(&|_| Ok(()), VerifyOptions { index: false })
            .unwrap();
        let named = v.problems.iter().any(|p| {
            p.what.contains(&format!("byte {}", hit.start)) || (hit.id.is_some() && p.id == hit.id)
        });
        let tail = ro.recovery().unread_tail > 0;
        assert!(
            named || (tail && hit.batch == last_batch),
            "flip at {pos} in record at {}: verify did not name it: {:?}",
            hit.start,
            v.problems
        );
        drop(ro);

        if n % 4 != 0 {
            continue;
        }
        // Writer open with the old index; reindex; repair.
        let seg_before = fs::read(case.join("segments/00000001.seg")).unwrap();
        {
            let l = Ledger::open(&case).unwrap_or_else(|e| panic!("flip at {pos}: open: {e}"));
            check(&l, "open");
        }
        match Ledger::reindex(&case) {
            Err(e) => {
                assert!(e.is_corruption(), "flip at {pos}: {e}");
                assert_eq!(
                    fs::read(case.join("segments/00000001.seg")).unwrap(),
                    seg_before,
                    "flip at {pos}: a refused reindex changed the segment"
                );
                refused += 1;
            }
            Ok((l, r)) => {
                // Only a damaged last batch can look like a torn tail.
                assert_eq!(
                    hit.batch, last_batch,
                    "flip at {pos}: reindex accepted damage"
                );
                assert_eq!(r.set_aside.len(), 1);
                let q = fs::read(case.join(&r.set_aside[0].file)).unwrap();
                assert_eq!(&q[..], &seg_before[r.set_aside[0].offset as usize..]);
                check(&l, "reindex");
                tails += 1;
            }
        }
        let (l, _) = Ledger::repair(&case).unwrap_or_else(|e| panic!("flip at {pos}: repair: {e}"));
        check(&l, "repair");
        l.put_blob(format!("written after repairing flip {pos}").as_bytes())
            .unwrap();
        repaired += 1;
        drop(l);
        fs::remove_dir_all(&case).unwrap();
    }
    eprintln!(
        "{} flips: reindex refused {refused}, set a damaged last batch aside {tails}, repaired {repaired}",
        positions.len()
    );
    assert!(
        refused > 20 && repaired > 50,
        "refused {refused}, repaired {repaired}, tails {tails}"
    );
}
