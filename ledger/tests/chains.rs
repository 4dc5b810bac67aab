//! Events given whole (`Batch::put_raw`: pull, import) must sit where they
//! say: on their prev's stream at prev's seq + 1, or at seq 0 without a
//! prev (FORMAT.md). Before, `put_raw` checked only that the links resolve,
//! so a hostile remote could hand over a chain whose `seq` and `stream` lie
//! (a later event numbered before an earlier one, an event claiming another
//! stream), and `verify` checked only seq 0 without a prev.
//!
//! The attacker's sweep: after a genuine event at seq 2 of stream `s`, an
//! event at every seq 0..=6 and on each of three streams, its prev put in
//! the same batch or already stored, committed or submitted; the oracle accepts
//! exactly seq 3 on `s`. A refused batch leaves the ledger as it was. With
//! the check switched off (`keep_chains_as_recorded`, what `migrate` uses)
//! the same events are taken, and `verify` then names each one.

use ledger::{EventEnvelope, Id, Ledger, LedgerError, NewEvent, ObjectKind};

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn envelope(stream: &str, seq: u64, prev: Option<Id>, text: &str) -> Vec<u8> {
    EventEnvelope {
        kind: "note".into(),
        version: 1,
        stream: stream.into(),
        seq,
        prev: prev.map(|p| p.0),
        parents: vec![],
        refs: vec![],
        payload: text.as_bytes().to_vec(),
    }
    .to_bytes()
    .expect("envelope bytes")
}

/// A source chain of three events on stream `s` (seq 0, 1, 2), as raw bytes.
fn genuine(dir: &std::path::Path) -> Vec<Vec<u8>> {
    let l = Ledger::init(dir).expect("create source");
    let mut head = None;
    let mut ids = Vec::new();
    for i in 0..3 {
        let ev = NewEvent::new("note", 1, format!("step {i}").into_bytes());
        let id = l.append("s", head, ev).expect("append");
        ids.push(id);
        head = Some(id);
    }
    ids.iter()
        .map(|id| {
            l.raw_object(id)
                .map(|(_, raw)| raw)
                .expect("raw of a genuine event")
        })
        .collect()
}

/// What a batch's outcome leaves: refs and object count.
fn state(l: &Ledger) -> (Vec<(String, Id)>, u64) {
    (l.refs().expect("refs"), l.object_count().expect("count"))
}

#[derive(Clone, Copy, Debug)]
enum Placement {
    /// The whole chain and the probe in one batch (links name earlier
    /// members, so the probe comes last).
    Batch,
    /// The chain committed before; the probe alone.
    PrevStored,
}

fn put(l: &Ledger, objs: &[Vec<u8>], loose: bool, submit: bool) -> Result<(), LedgerError> {
    let mut b = l.batch();
    if loose {
        b.keep_chains_as_recorded();
    }
    for raw in objs {
        b.put_raw(ObjectKind::Event, raw.clone(), vec![])?;
    }
    if submit {
        b.submit()?.wait()
    } else {
        b.commit()
    }
}

fn probe(chain: &[Vec<u8>], stream: &str, seq: u64) -> Vec<u8> {
    let prev = Id::of(ObjectKind::Event, &chain[2]);
    envelope(stream, seq, Some(prev), &format!("probe {stream} {seq}"))
}

#[test]
fn put_raw_takes_only_the_event_that_continues_its_prev() {
    let src = scratch();
    let chain = genuine(src.path());
    for placement in [Placement::Batch, Placement::PrevStored] {
        for stream in ["s", "t", "s/child"] {
            for seq in 0..=6u64 {
                for submit in [false, true] {
                    let d = scratch();
                    let l = Ledger::init(d.path()).expect("create");
                    let p = probe(&chain, stream, seq);
                    let objs: Vec<Vec<u8>> = match placement {
                        Placement::Batch => {
                            let mut v = chain.clone();
                            v.push(p.clone());
                            v
                        }
                        Placement::PrevStored => {
                            put(&l, &chain, false, false).expect("genuine chain");
                            vec![p.clone()]
                        }
                    };
                    let before = state(&l);
                    let r = put(&l, &objs, false, submit);
                    let ctx = format!("{placement:?}, stream {stream}, seq {seq}, submit {submit}");
                    if stream == "s" && seq == 3 {
                        r.unwrap_or_else(|e| panic!("{ctx}: the genuine next event refused: {e}"));
                        let id = Id::of(ObjectKind::Event, &p);
                        assert_eq!(l.get_event(&id).expect("probe").seq, 3, "{ctx}");
                        continue;
                    }
                    match r {
                        Err(LedgerError::BrokenChain { id, detail }) => {
                            assert_eq!(id, Id::of(ObjectKind::Event, &p), "{ctx}: {detail}");
                        }
                        other => panic!("{ctx}: taken or refused for another reason: {other:?}"),
                    }
                    assert_eq!(
                        state(&l),
                        before,
                        "{ctx}: a refused batch changed the ledger"
                    );
                }
            }
        }
    }
}

#[test]
fn put_raw_refuses_a_first_event_that_is_not_at_seq_0() {
    let d = scratch();
    let l = Ledger::init(d.path()).expect("create");
    for seq in 1..=3u64 {
        let raw = envelope("fresh", seq, None, "orphan");
        match put(&l, &[raw], false, false) {
            Err(LedgerError::BrokenChain { detail, .. }) => {
                assert!(detail.contains("without a prev"), "{detail}")
            }
            other => panic!("seq {seq} without a prev: {other:?}"),
        }
    }
    put(&l, &[envelope("fresh", 0, None, "first")], false, false).expect("seq 0 is a start");
    assert_eq!(l.object_count().expect("count"), 1);
}

/// The check switched off: the same lies are taken (so the sweep above
/// fails for the right reason), and `verify` names every one of them.
#[test]
fn verify_names_events_that_do_not_continue_their_stream() {
    let src = scratch();
    let chain = genuine(src.path());
    let d = scratch();
    let l = Ledger::init(d.path()).expect("create");
    put(&l, &chain, false, false).expect("genuine chain");
    assert!(l.verify(&|_| Ok(())).expect("verify").is_clean());
    let lies = [
        probe(&chain, "s", 5),
        probe(&chain, "s", 2),
        probe(&chain, "t", 3),
        envelope("fresh", 4, None, "orphan"),
    ];
    for raw in &lies {
        put(&l, std::slice::from_ref(raw), true, false).expect("taken with the check off");
    }
    let report = l.verify(&|_| Ok(())).expect("verify");
    for raw in &lies {
        let id = Id::of(ObjectKind::Event, raw);
        let named: Vec<&str> = report
            .problems
            .iter()
            .filter(|p| p.id == Some(id))
            .map(|p| p.what.as_str())
            .collect();
        assert_eq!(named.len(), 1, "verify on {id}: {:?}", report.problems);
        assert!(
            named[0].contains("seq") || named[0].contains("stream"),
            "{}",
            named[0]
        );
    }
    assert_eq!(report.problems.len(), lies.len(), "{:?}", report.problems);
}

/// A prev that cannot vouch for the event's place is refused, whatever
/// the event claims: a blob (in the batch or stored) named as prev, and a
/// prev that is not there, even in a batch that may lack blobs and trees
/// (a lazy pull's; events always travel). Found by an attacker review:
/// these were stepped over, so any seq and stream got in.
#[test]
fn put_raw_refuses_an_event_whose_prev_is_not_a_stored_event() {
    let blob = b"not an event".to_vec();
    let blob_id = Id::of(ObjectKind::Blob, &blob);
    let absent = Id::of(ObjectKind::Event, b"never stored");
    for (what, stored_blob, in_batch_blob, lazy, prev) in [
        ("a blob in the batch", false, true, false, blob_id),
        ("a stored blob", true, false, false, blob_id),
        ("a missing prev", false, false, false, absent),
        (
            "a missing prev, absent links allowed",
            false,
            false,
            true,
            absent,
        ),
    ] {
        let d = scratch();
        let l = Ledger::init(d.path()).expect("create");
        if stored_blob {
            l.put_blob(&blob).expect("blob");
        }
        let before = state(&l);
        let lie = envelope("main", 1_000_000, Some(prev), "lie");
        let mut b = l.batch();
        if lazy {
            b.allow_absent_links();
        }
        if in_batch_blob {
            b.put_raw(ObjectKind::Blob, blob.clone(), vec![])
                .expect("blob");
        }
        b.put_raw(ObjectKind::Event, lie.clone(), vec![])
            .expect("put");
        b.set_ref("r", None, Id::of(ObjectKind::Event, &lie))
            .expect("ref");
        match b.commit() {
            Err(LedgerError::BrokenChain { detail, .. }) => {
                assert!(detail.contains(&prev.to_hex()), "{what}: {detail}")
            }
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(
            state(&l),
            before,
            "{what}: a refused batch changed the ledger"
        );
    }
}
