//! Model-based property test: random sequences of append / stale append / fork /
//! batch / reopen against a simple in-memory model where each ref is a vector of
//! event ids from its root to its head.

use std::collections::BTreeMap;

use ledger::{Id, Ledger, LedgerError, NewEvent};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Append { stream: u8, payload: Vec<u8> },
    StaleAppend { stream: u8 },
    Fork { from: u8, back: u8, name: u8 },
    BatchTwo { a: u8, b: u8 },
    Delete { name: u8, stale: bool },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, proptest::collection::vec(any::<u8>(), 0..300)).prop_map(|(stream, payload)| Op::Append { stream, payload }),
        1 => (0u8..4).prop_map(|stream| Op::StaleAppend { stream }),
        2 => (0u8..8, 0u8..5, 0u8..8).prop_map(|(from, back, name)| Op::Fork { from, back, name }),
        2 => (0u8..8, 0u8..8).prop_map(|(a, b)| Op::BatchTwo { a, b }),
        1 => (0u8..8, any::<bool>()).prop_map(|(name, stale)| Op::Delete { name, stale }),
        1 => Just(Op::Reopen),
    ]
}

fn name(i: u8) -> String {
    if i < 4 {
        format!("s{i}")
    } else {
        format!("fork/{i}")
    }
}

fn check(l: &Ledger, model: &BTreeMap<String, Vec<Id>>) -> Result<(), TestCaseError> {
    let refs: BTreeMap<String, Id> = l.refs().unwrap().into_iter().collect();
    let heads: BTreeMap<String, Id> = model
        .iter()
        .map(|(k, v)| (k.clone(), *v.last().unwrap()))
        .collect();
    prop_assert_eq!(&refs, &heads);
    for (k, chain) in model {
        let mut walked: Vec<Id> = l
            .chain(*chain.last().unwrap())
            .map(|e| e.unwrap().id)
            .collect();
        walked.reverse();
        prop_assert_eq!(&walked, chain, "stream {}", k);
        for (seq, id) in chain.iter().enumerate() {
            prop_assert_eq!(l.get_event(id).unwrap().seq, seq as u64);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn ledger_agrees_with_model(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        let mut l = Some(Ledger::init(&path).unwrap());
        let mut model: BTreeMap<String, Vec<Id>> = BTreeMap::new();
        let mut counter = 0u64;
        // Events of deleted refs: no longer named, still stored.
        let mut unnamed: Vec<Id> = Vec::new();
        for op in ops {
            let led = l.as_ref().unwrap();
            counter += 1;
            match op {
                Op::Append { stream, payload } => {
                    let n = name(stream);
                    let head = model.get(&n).and_then(|v| v.last().copied());
                    let mut p = payload;
                    p.extend_from_slice(&counter.to_le_bytes());
                    let id = led.append(&n, head, NewEvent::new("prop", 1, p)).unwrap();
                    model.entry(n).or_default().push(id);
                }
                Op::StaleAppend { stream } => {
                    let n = name(stream);
                    let chain = model.get(&n).cloned().unwrap_or_default();
                    // The expected head is wrong: one step back, or "no ref" when it exists.
                    let stale = if chain.len() >= 2 { Some(chain[chain.len() - 2]) } else if chain.len() == 1 { None } else { Some(Id([9; 32])) };
                    let r = led.append(&n, stale, NewEvent::new("prop", 1, counter.to_le_bytes().to_vec()));
                    prop_assert!(matches!(r, Err(LedgerError::Conflict { .. }) | Err(LedgerError::NotFound { .. })), "{:?}", r);
                }
                Op::Fork { from, back, name: nm } => {
                    let src = name(from);
                    let dst = name(4 + nm % 4);
                    let Some(chain) = model.get(&src).cloned() else { continue };
                    let pos = chain.len().saturating_sub(1 + back as usize);
                    let at = chain[pos];
                    let r = led.fork(&dst, at);
                    match model.entry(dst) {
                        std::collections::btree_map::Entry::Occupied(_) => {
                            prop_assert!(matches!(r, Err(LedgerError::Conflict { .. })), "{:?}", r);
                        }
                        std::collections::btree_map::Entry::Vacant(v) => {
                            r.unwrap();
                            v.insert(chain[..=pos].to_vec());
                        }
                    }
                }
                Op::BatchTwo { a, b } => {
                    let (na, nb) = (name(a), name(b));
                    let mut batch = led.batch();
                    let blob = batch.put_blob(&counter.to_be_bytes()).unwrap();
                    let ha = model.get(&na).and_then(|v| v.last().copied());
                    let ia = batch.append(&na, ha, NewEvent::new("prop.batch", 1, vec![1]).with_refs(vec![blob])).unwrap();
                    let hb = if na == nb { Some(ia) } else { model.get(&nb).and_then(|v| v.last().copied()) };
                    let ib = batch.append(&nb, hb, NewEvent::new("prop.batch", 1, counter.to_le_bytes().to_vec())).unwrap();
                    batch.commit().unwrap();
                    model.entry(na).or_default().push(ia);
                    model.entry(nb).or_default().push(ib);
                }
                Op::Delete { name: nm, stale } => {
                    let n = name(nm);
                    let chain = model.get(&n).cloned().unwrap_or_default();
                    let expected = match (chain.last(), stale) {
                        (Some(&h), false) => h,
                        (Some(_), true) if chain.len() >= 2 => chain[chain.len() - 2],
                        _ => Id([9; 32]),
                    };
                    let r = led.delete_ref(&n, expected);
                    if chain.last() == Some(&expected) {
                        r.unwrap();
                        model.remove(&n);
                        unnamed.extend(chain);
                    } else {
                        prop_assert!(matches!(r, Err(LedgerError::Conflict { .. })), "{:?}", r);
                    }
                }
                Op::Reopen => {
                    drop(l.take());
                    l = Some(Ledger::open(&path).unwrap());
                }
            }
            check(l.as_ref().unwrap(), &model)?;
            for id in &unnamed {
                l.as_ref().unwrap().get_event(id).unwrap();
            }
        }
        drop(l.take());
        let (l2, _) = Ledger::reindex(&path).unwrap();
        check(&l2, &model)?;
        for id in &unnamed {
            l2.get_event(id).unwrap();
        }
        prop_assert!(l2.verify(&|_| Ok(())).unwrap().is_clean());
    }

    /// Arbitrary bytes never panic the decoders; they yield errors.
    #[test]
    fn decoders_reject_garbage_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let id = Id([1; 32]);
        let _ = ledger::EventEnvelope::from_bytes(&id, &bytes);
        let _ = ledger::Tree::from_bytes(&id, &bytes);
    }
}
