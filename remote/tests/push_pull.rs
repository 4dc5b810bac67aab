//! Push and pull through a folder remote, as an attacker would try them:
//! every byte of a pack and of its index flipped on the store, a pack
//! deleted, writers racing on one run, a pull into a ledger that moved.
//! The same protocol runs against S3 in tests/remote_cli.rs.

use std::path::Path;
use std::sync::{Arc, Barrier};

use ledger::{Id, Ledger, NewEvent};
use remote::{pull, push, Quiet, RefChange, Remote, RemoteError};

fn note(text: &str) -> NewEvent {
    NewEvent::new("test.note", 1, text.as_bytes().to_vec())
}

/// A run `r` with a snapshot, a blob and two streams; `salt` varies content.
fn make_run(l: &Ledger, salt: &str, events: usize) -> Id {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), format!("hello {salt}")).unwrap();
    std::fs::create_dir(ws.path().join("d")).unwrap();
    std::fs::write(ws.path().join("d/b.txt"), "x".repeat(300)).unwrap();
    let tree = l.snapshot_dir(ws.path()).unwrap();
    let blob = l.put_blob(format!("body {salt}").as_bytes()).unwrap();
    let sub = l
        .append("r/sub", None, note("sub start").with_refs(vec![blob]))
        .unwrap();
    let mut head = l.head("r").unwrap();
    for i in 0..events {
        let mut ev = note(&format!("{salt} {i}"));
        if i == 0 {
            ev = ev.with_refs(vec![tree]).with_parents(vec![sub]);
        }
        head = Some(l.append("r", head, ev).unwrap());
    }
    head.unwrap()
}

fn remote_at(dir: &Path) -> Remote {
    Remote::open(dir.to_str().unwrap(), None).unwrap()
}

fn refs(l: &Ledger) -> Vec<(String, Id)> {
    l.refs().unwrap()
}

#[test]
fn push_then_pull_copies_every_ref_and_object_and_a_second_push_sends_only_new_objects() {
    let d = tempfile::tempdir().unwrap();
    let a = Ledger::init(&d.path().join("a")).unwrap();
    make_run(&a, "one", 5);
    let store = d.path().join("store");
    let r = remote_at(&store);
    let first = push(&a, &r, &[], &Quiet).unwrap();
    assert_eq!(first.runs.len(), 1);
    let b = Ledger::init(&d.path().join("b")).unwrap();
    let got = pull(&b, &r, &[], &Quiet).unwrap();
    assert_eq!(refs(&a), refs(&b));
    assert_eq!(got.objects, first.objects);
    for (_, head) in refs(&a) {
        assert_eq!(a.get_event(&head).unwrap(), b.get_event(&head).unwrap());
        assert_eq!(a.get_meta(&head).unwrap(), b.get_meta(&head).unwrap());
    }
    assert!(b.verify(&|_| Ok(())).unwrap().is_clean());

    // One more event: the second push uploads it alone.
    let head = a.head("r").unwrap();
    a.append("r", head, note("later")).unwrap();
    let second = push(&a, &r, &[], &Quiet).unwrap();
    assert_eq!(second.objects, 1, "{second:?}");
    let again = pull(&b, &r, &["r".into()], &Quiet).unwrap();
    assert_eq!(again.objects, 1);
    assert!(again.runs[0]
        .1
        .iter()
        .any(|c| matches!(c, RefChange::FastForward { .. })));
    assert_eq!(refs(&a), refs(&b));
}

/// Flips every byte of every pack file on the store in turn and pulls;
/// returns how many flips were refused as corrupt (nothing landing).
fn flip_attack(unprotected: remote::Unprotected) -> (usize, usize) {
    let d = tempfile::tempdir().unwrap();
    let a = Ledger::init(&d.path().join("a")).unwrap();
    make_run(&a, "flip", 2);
    let store = d.path().join("store");
    push(&a, &remote_at(&store), &[], &Quiet).unwrap();
    let packs: Vec<_> = std::fs::read_dir(store.join("packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(packs.len(), 2, "one pack and its index");
    let (mut tried, mut refused) = (0, 0);
    for file in &packs {
        let good = std::fs::read(file).unwrap();
        for pos in 0..good.len() {
            let b = Ledger::init(&d.path().join(format!("b-{tried}"))).unwrap();
            let mut bad = good.clone();
            bad[pos] ^= 0x5a;
            std::fs::write(file, &bad).unwrap();
            // A fresh remote each time: no index cache to hide the damage.
            let mut r = remote_at(&store);
            r.unprotected = unprotected;
            tried += 1;
            if let Err(err @ RemoteError::Corrupt { .. }) = pull(&b, &r, &[], &Quiet) {
                assert!(err.to_string().contains("packs/"), "{err}");
                assert_eq!(b.object_count().unwrap(), 0, "byte {pos}: something landed");
                assert!(refs(&b).is_empty());
                refused += 1;
            }
        }
        std::fs::write(file, &good).unwrap();
    }
    let b = Ledger::init(&d.path().join("b-good")).unwrap();
    pull(&b, &remote_at(&store), &[], &Quiet).unwrap();
    assert_eq!(refs(&a), refs(&b));
    (tried, refused)
}

#[test]
fn every_flipped_byte_of_a_pack_or_index_on_the_store_fails_the_pull_and_writes_nothing() {
    let (tried, refused) = flip_attack(remote::Unprotected::default());
    assert_eq!(
        refused,
        tried,
        "{} of {tried} flipped bytes were not refused",
        tried - refused
    );
    // Without the frame, header and object checks some flips get through
    // (metadata and the header are covered by nothing else).
    let (tried, refused) = flip_attack(remote::Unprotected {
        unchecked_frames: true,
        ..Default::default()
    });
    assert!(refused < tried, "the attack needs the checks to be caught");
}

#[test]
fn a_ref_naming_an_object_no_pack_holds_is_reported_with_the_ref_and_nothing_lands() {
    let d = tempfile::tempdir().unwrap();
    let a = Ledger::init(&d.path().join("a")).unwrap();
    make_run(&a, "gone", 2);
    let store = d.path().join("store");
    push(&a, &remote_at(&store), &[], &Quiet).unwrap();
    for e in std::fs::read_dir(store.join("packs")).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let b = Ledger::init(&d.path().join("b")).unwrap();
    let err = pull(&b, &remote_at(&store), &[], &Quiet).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, RemoteError::MissingObject { .. }), "{text}");
    assert!(
        text.contains("ref r") && text.contains("of run r"),
        "{text}"
    );
    assert!(refs(&b).is_empty());
    assert_eq!(b.object_count().unwrap(), 0);
}

#[test]
fn writers_racing_on_one_run_exactly_one_wins_and_no_update_is_lost() {
    for round in 0..8 {
        race(round, remote::Unprotected::default()).unwrap();
    }
    // Without compare-and-swap every writer "wins" and all but one lose
    // their update.
    let lost = (0..8)
        .filter(|r| {
            race(
                *r,
                remote::Unprotected {
                    unconditional_refs: true,
                    ..Default::default()
                },
            )
            .is_err()
        })
        .count();
    assert!(
        lost > 0,
        "the race needs compare-and-swap to be won by exactly one"
    );
}

/// One round of four writers pushing diverging heads of one run at once.
fn race(round: usize, unprotected: remote::Unprotected) -> Result<(), String> {
    {
        let d = tempfile::tempdir().unwrap();
        let store = d.path().join("store");
        let base = Ledger::init(&d.path().join("base")).unwrap();
        make_run(&base, "base", 1);
        push(&base, &remote_at(&store), &[], &Quiet).unwrap();
        drop(base);
        let n = 4;
        let barrier = Arc::new(Barrier::new(n));
        let handles: Vec<_> = (0..n)
            .map(|w| {
                let dir = d.path().join(format!("w{w}"));
                let store = store.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let l = Ledger::init(&dir).unwrap();
                    pull(&l, &remote_at(&store), &[], &Quiet).unwrap();
                    let head = l.head("r").unwrap();
                    let mine = l
                        .append("r", head, note(&format!("writer {w} round {round}")))
                        .unwrap();
                    let mut r = remote_at(&store);
                    r.unprotected = unprotected;
                    barrier.wait();
                    (mine, push(&l, &r, &[], &Quiet))
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let winners: Vec<Id> = results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(id, _)| *id)
            .collect();
        if winners.len() != 1 {
            return Err(format!(
                "round {round}: {} writers were told they won",
                winners.len()
            ));
        }
        for (_, r) in &results {
            if let Err(e) = r {
                assert!(
                    matches!(e, RemoteError::Conflict { .. }),
                    "round {round}: {e}"
                );
            }
        }
        let (rec, _, _) = remote_at(&store).read_run("r").unwrap().unwrap();
        assert_eq!(
            rec.heads["r"],
            winners[0].to_hex(),
            "round {round}: the winner's head was lost"
        );
        assert_eq!(rec.version, 2);
        let c = Ledger::init(&d.path().join("check")).unwrap();
        pull(&c, &remote_at(&store), &[], &Quiet).unwrap();
        assert_eq!(c.head("r").unwrap(), Some(winners[0]));
    }
    Ok(())
}

#[test]
fn a_push_of_a_run_the_remote_holds_further_is_refused_and_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let a = Ledger::init(&d.path().join("a")).unwrap();
    make_run(&a, "x", 1);
    push(&a, &remote_at(&store), &[], &Quiet).unwrap();
    let b = Ledger::init(&d.path().join("b")).unwrap();
    pull(&b, &remote_at(&store), &[], &Quiet).unwrap();
    let h = b.head("r").unwrap();
    b.append("r", h, note("b moved on")).unwrap();
    push(&b, &remote_at(&store), &[], &Quiet).unwrap();
    let record = std::fs::read(store.join("refs/r.ref")).unwrap();
    // `a` moves its own way: pushing it would lose b's event.
    let h = a.head("r").unwrap();
    a.append("r", h, note("a moved elsewhere")).unwrap();
    let err = push(&a, &remote_at(&store), &[], &Quiet).unwrap_err();
    assert!(matches!(err, RemoteError::Conflict { .. }), "{err}");
    assert!(err.to_string().contains("mass pull"), "{err}");
    assert_eq!(std::fs::read(store.join("refs/r.ref")).unwrap(), record);
    // And pulling into `a` is refused too, writing nothing.
    let count = a.object_count().unwrap();
    let err = pull(&a, &remote_at(&store), &[], &Quiet).unwrap_err();
    assert!(matches!(err, RemoteError::Conflict { .. }), "{err}");
    assert_eq!(a.object_count().unwrap(), count);
}

#[test]
fn a_location_that_is_not_a_remote_is_refused_for_pull_and_for_push_when_not_empty() {
    let d = tempfile::tempdir().unwrap();
    let a = Ledger::init(&d.path().join("a")).unwrap();
    make_run(&a, "x", 1);
    let other = d.path().join("photos");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("cat.jpg"), b"meow").unwrap();
    let err = push(&a, &remote_at(&other), &[], &Quiet).unwrap_err();
    assert!(matches!(err, RemoteError::NotARemote { .. }), "{err}");
    assert!(err.to_string().contains("cat.jpg"), "{err}");
    assert!(!other.join("MASS-REMOTE").exists());
    let err = pull(&a, &remote_at(&d.path().join("empty")), &[], &Quiet).unwrap_err();
    assert!(matches!(err, RemoteError::NotARemote { .. }), "{err}");
}

#[test]
fn run_names_with_characters_stores_escape_round_trip_on_a_folder() {
    let d = tempfile::tempdir().unwrap();
    let a = Ledger::init(&d.path().join("a")).unwrap();
    let store = d.path().join("store");
    for (i, name) in ["café", "sweep[lr=0.1]", "a=b%c~d"].iter().enumerate() {
        let h = a.append(name, None, note(&format!("run {i}"))).unwrap();
        a.append(
            &format!("{name}/sub"),
            None,
            note("sub").with_parents(vec![h]),
        )
        .unwrap();
    }
    push(&a, &remote_at(&store), &[], &Quiet).unwrap();
    // A second push of the same runs is a no-op, not a conflict.
    let again = push(&a, &remote_at(&store), &[], &Quiet).unwrap();
    assert!(
        again.runs.iter().all(|(_, _, changed)| !changed),
        "{again:?}"
    );
    let mut names = remote_at(&store).runs().unwrap();
    names.sort();
    assert_eq!(names, vec!["a=b%c~d", "café", "sweep[lr=0.1]"]);
    let b = Ledger::init(&d.path().join("b")).unwrap();
    pull(&b, &remote_at(&store), &[], &Quiet).unwrap();
    assert_eq!(refs(&a), refs(&b));
}

#[test]
fn a_run_inside_a_run_the_remote_holds_is_refused_and_overlapping_records_pull() {
    let d = tempfile::tempdir().unwrap();
    let a = Ledger::init(&d.path().join("a")).unwrap();
    make_run(&a, "x", 2);
    let store = d.path().join("store");
    push(&a, &remote_at(&store), &["r/sub".into()], &Quiet).unwrap();
    let err = push(&a, &remote_at(&store), &["r".into()], &Quiet).unwrap_err();
    assert!(matches!(err, RemoteError::Nested { .. }), "{err}");
    // Records that overlap anyway (written by hand, or by an older push)
    // pull: the shared ref lands once.
    let sub = std::fs::read_to_string(store.join("refs/r/sub.ref")).unwrap();
    let rec: remote::RunRecord = serde_json::from_str(&sub).unwrap();
    let mut outer = rec.clone();
    outer.run = "r".into();
    outer
        .heads
        .insert("r".into(), a.head("r").unwrap().unwrap().to_hex());
    std::fs::write(store.join("refs/r.ref"), outer.to_bytes()).unwrap();
    // The outer run's events must be on the store: push them as another run.
    let b = Ledger::init(&d.path().join("b")).unwrap();
    let err = pull(&b, &remote_at(&store), &[], &Quiet).unwrap_err();
    assert!(matches!(err, RemoteError::MissingObject { .. }), "{err}");
    let full = d.path().join("full");
    push(&a, &remote_at(&full), &["r".into()], &Quiet).unwrap();
    let mut sub_rec = rec;
    sub_rec.previous = None;
    std::fs::create_dir_all(full.join("refs/r")).unwrap();
    std::fs::write(full.join("refs/r/sub.ref"), sub_rec.to_bytes()).unwrap();
    pull(&b, &remote_at(&full), &[], &Quiet).unwrap();
    assert_eq!(refs(&a), refs(&b));
}

#[test]
fn a_record_whose_head_is_not_an_event_is_refused_and_nothing_lands() {
    let d = tempfile::tempdir().unwrap();
    let a = Ledger::init(&d.path().join("a")).unwrap();
    make_run(&a, "kind", 1);
    let blob = a.put_blob(b"not an event").unwrap();
    a.append(
        "r/holder",
        None,
        note("holds the blob").with_refs(vec![blob]),
    )
    .unwrap();
    let store = d.path().join("store");
    push(&a, &remote_at(&store), &[], &Quiet).unwrap();
    let path = store.join("refs/r.ref");
    let mut rec: remote::RunRecord =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    rec.heads.insert("r/x".into(), blob.to_hex());
    std::fs::write(&path, rec.to_bytes()).unwrap();
    let b = Ledger::init(&d.path().join("b")).unwrap();
    let err = pull(&b, &remote_at(&store), &[], &Quiet).unwrap_err();
    assert!(matches!(err, RemoteError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("not an event"), "{err}");
    assert!(refs(&b).is_empty());
    assert_eq!(b.object_count().unwrap(), 0);
}

#[test]
fn a_pack_gone_while_its_index_stays_is_an_integrity_error_on_pull_and_sent_again_on_push() {
    let d = tempfile::tempdir().unwrap();
    let a = Ledger::init(&d.path().join("a")).unwrap();
    make_run(&a, "gone", 2);
    let store = d.path().join("store");
    push(&a, &remote_at(&store), &[], &Quiet).unwrap();
    let pack = std::fs::read_dir(store.join("packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().unwrap() == "pack")
        .unwrap();
    let bytes = std::fs::read(&pack).unwrap();
    std::fs::remove_file(&pack).unwrap();
    let b = Ledger::init(&d.path().join("b")).unwrap();
    let err = pull(&b, &remote_at(&store), &[], &Quiet).unwrap_err();
    assert!(matches!(err, RemoteError::MissingObject { .. }), "{err}");
    // A push sees the objects as missing and uploads them again.
    let h = a.head("r").unwrap();
    a.append("r", h, note("more")).unwrap();
    let rep = push(&a, &remote_at(&store), &[], &Quiet).unwrap();
    assert!(rep.objects > 1, "{rep:?}");
    pull(&b, &remote_at(&store), &[], &Quiet).unwrap();
    assert_eq!(refs(&a), refs(&b));
    drop(bytes);
}
