//! Partial ledgers: objects linked but not stored (a lazy clone's blobs)
//! are asked of a `Promisor`, and what it hands over is checked against the
//! id before anyone reads it. Also the batch rule that a ref names an event
//! even when the object was written by the same batch.

use std::sync::{Arc, Mutex};

use ledger::{Id, Ledger, LedgerError, NewEvent, ObjectKind, Promisor};

/// Hands over whatever it was given for an id (honest or not), and counts
/// the questions.
struct Fake {
    answers: Vec<(Id, ObjectKind, Vec<u8>)>,
    asked: Mutex<usize>,
}

impl Promisor for Fake {
    fn fetch(&self, id: &Id) -> Result<Option<(ObjectKind, Vec<u8>)>, String> {
        *self.asked.lock().unwrap() += 1;
        Ok(self
            .answers
            .iter()
            .find(|(i, _, _)| i == id)
            .map(|(_, k, b)| (*k, b.clone())))
    }
    fn resolve(&self, hex: &str, _limit: usize) -> Vec<Id> {
        self.answers
            .iter()
            .map(|(i, _, _)| *i)
            .filter(|i| i.to_hex().starts_with(hex))
            .collect()
    }
}

fn partial_ledger(dir: &std::path::Path, absent: &[u8]) -> (Ledger, Id) {
    let l = Ledger::init(dir).unwrap();
    let blob = Id::of(ObjectKind::Blob, absent);
    let mut b = l.batch();
    let ev = NewEvent::new("test.note", 1, b"names an absent blob".to_vec()).with_refs(vec![blob]);
    b.append("r", None, ev.clone()).unwrap();
    // Without permission the batch is refused.
    assert!(matches!(b.commit(), Err(LedgerError::Dangling { .. })));
    let mut b = l.batch();
    b.allow_absent_links();
    b.append("r", None, ev).unwrap();
    b.commit().unwrap();
    (l, blob)
}

#[test]
fn an_absent_blob_is_read_through_the_promisor_once_and_checked() {
    let d = tempfile::tempdir().unwrap();
    let (l, blob) = partial_ledger(d.path(), b"the content");
    assert!(matches!(
        l.get_blob(&blob),
        Err(LedgerError::NotFound { .. })
    ));
    let fake = Arc::new(Fake {
        answers: vec![(blob, ObjectKind::Blob, b"the content".to_vec())],
        asked: Mutex::new(0),
    });
    l.set_promisor(fake.clone());
    assert!(l.is_partial());
    assert_eq!(l.get_blob(&blob).unwrap(), b"the content");
    assert_eq!(l.get_blob(&blob).unwrap(), b"the content");
    assert_eq!(l.kind_of(&blob).unwrap(), Some(ObjectKind::Blob));
    assert_eq!(l.require(&blob).unwrap().seg, u32::MAX);
    assert_eq!(l.resolve(&blob.to_hex()[..10]).unwrap(), blob);
    assert_eq!(*fake.asked.lock().unwrap(), 1, "fetched once, then kept");
    // Nothing was written: the object is still not stored.
    assert!(!l.contains(&blob).unwrap());
    assert!(
        l.get_event(&blob).is_err(),
        "an event read never asks the promisor"
    );
}

#[test]
fn a_promisor_handing_over_other_bytes_or_another_kind_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let (l, blob) = partial_ledger(d.path(), b"the content");
    l.set_promisor(Arc::new(Fake {
        answers: vec![(blob, ObjectKind::Blob, b"forged content".to_vec())],
        asked: Mutex::new(0),
    }));
    let err = l.get_blob(&blob).unwrap_err();
    assert!(matches!(err, LedgerError::Promisor { .. }), "{err}");
    let d2 = tempfile::tempdir().unwrap();
    let (l2, blob2) = partial_ledger(d2.path(), b"x");
    l2.set_promisor(Arc::new(Fake {
        answers: vec![(blob2, ObjectKind::Tree, b"x".to_vec())],
        asked: Mutex::new(0),
    }));
    assert!(l2.get_blob(&blob2).is_err());
}

#[test]
fn verify_counts_what_a_partial_ledger_leaves_out_and_flags_it_otherwise() {
    let d = tempfile::tempdir().unwrap();
    let (l, blob) = partial_ledger(d.path(), b"the content");
    let partial = ledger::VerifyOptions {
        index: true,
        absent_ok: true,
    };
    let r = l.verify_with(&|_| Ok(()), partial).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    assert_eq!(r.absent, 1);
    let r = l.verify(&|_| Ok(())).unwrap();
    assert!(!r.is_clean(), "a full ledger must not lack what it links");
    // Filled in later (a full pull): nothing is absent any more.
    l.put_blob(b"the content").unwrap();
    let r = l.verify_with(&|_| Ok(()), partial).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    assert_eq!(r.absent, 0, "{blob}");
}

#[test]
fn regression_a_ref_set_in_the_batch_that_writes_a_blob_must_still_name_an_event() {
    let d = tempfile::tempdir().unwrap();
    let l = Ledger::init(d.path()).unwrap();
    let mut b = l.batch();
    let blob = b.put_blob(b"not an event").unwrap();
    b.set_ref("r", None, blob).unwrap();
    let err = b.commit().unwrap_err();
    assert!(matches!(err, LedgerError::WrongKind { .. }), "{err}");
    assert_eq!(l.head("r").unwrap(), None);
}
