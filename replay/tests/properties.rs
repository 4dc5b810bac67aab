//! Property test: random effect scripts over several streams, aborted at a
//! random point and resumed, end with the same heads as an uninterrupted run,
//! never re-run a recorded effect, and replay-check cleanly.

use std::collections::BTreeMap;
use std::sync::Arc;

use ledger::{Id, Ledger};
use proptest::prelude::*;
use replay::{Begin, EffectOutput, EffectRequest, Mode, Session};

#[derive(Debug, Clone)]
enum Op {
    Effect {
        stream: u8,
        kind: u8,
        journaled: bool,
        arg: u16,
    },
    Emit {
        stream: u8,
        arg: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..3, 0u8..3, any::<bool>(), any::<u16>()).prop_map(|(stream, kind, journaled, arg)| Op::Effect { stream, kind, journaled, arg }),
        1 => (0u8..3, any::<u16>()).prop_map(|(stream, arg)| Op::Emit { stream, arg }),
    ]
}

/// Runs the script; stops (as a crash would) after `budget` live executions.
/// Returns the stream heads, or None if it stopped early.
fn run(
    s: &Session,
    script: &[Op],
    budget: &mut Option<usize>,
    executed: &mut BTreeMap<Id, u32>,
) -> Option<BTreeMap<u8, Id>> {
    let mut streams: BTreeMap<u8, replay::Stream> = BTreeMap::new();
    for (i, op) in script.iter().enumerate() {
        let sid = match op {
            Op::Effect { stream, .. } | Op::Emit { stream, .. } => *stream,
        };
        if let std::collections::btree_map::Entry::Vacant(v) = streams.entry(sid) {
            v.insert(s.stream(&format!("s{sid}")).unwrap());
        }
        let st = streams.get_mut(&sid).unwrap();
        match op {
            Op::Effect {
                kind,
                journaled,
                arg,
                ..
            } => {
                let mut req = EffectRequest::json(
                    ["model", "tool", "trainer"][*kind as usize],
                    &serde_json::json!({"arg": arg, "i": i}),
                );
                if *journaled {
                    req = req.journaled();
                }
                let id = req.id();
                match st.begin(req).unwrap() {
                    Begin::Served(_) => {}
                    Begin::Perform(p) => {
                        if let Some(b) = budget {
                            if *b == 0 {
                                return None;
                            }
                            *b -= 1;
                        }
                        *executed.entry(id).or_default() += 1;
                        st.finish(
                            p,
                            Ok(EffectOutput::json(
                                &serde_json::json!({"out": u32::from(*arg) * 7 + i as u32}),
                            )),
                        )
                        .unwrap();
                    }
                }
            }
            Op::Emit { arg, .. } => {
                st.emit(ledger::NewEvent::new(
                    "note",
                    1,
                    schemas::encode(&schemas::Note {
                        text: format!("{arg}/{i}"),
                    })
                    .unwrap(),
                ))
                .unwrap();
            }
        }
    }
    Some(
        streams
            .iter()
            .filter_map(|(k, st)| st.head().map(|h| (*k, h)))
            .collect(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn abort_and_resume_matches_uninterrupted(script in proptest::collection::vec(op(), 1..40), kills in proptest::collection::vec(0usize..12, 1..4)) {
        let rd = tempfile::tempdir().unwrap();
        let rl = Arc::new(Ledger::init(rd.path()).unwrap());
        let reference = run(&Session::new(rl, "r", Mode::Live).unwrap(), &script, &mut None, &mut BTreeMap::new()).unwrap();

        let d = tempfile::tempdir().unwrap();
        let l = Arc::new(Ledger::init(d.path()).unwrap());
        let mut executed = BTreeMap::new();
        for k in kills {
            let _ = run(&Session::new(l.clone(), "r", Mode::Live).unwrap(), &script, &mut Some(k), &mut executed);
        }
        let heads = run(&Session::new(l.clone(), "r", Mode::Live).unwrap(), &script, &mut None, &mut executed).unwrap();
        prop_assert_eq!(&heads, &reference);
        prop_assert!(executed.values().all(|&n| n == 1), "an effect ran twice: {:?}", executed);
        let checked = run(&Session::new(l.clone(), "r", Mode::Check).unwrap(), &script, &mut None, &mut BTreeMap::new()).unwrap();
        prop_assert_eq!(&checked, &reference);
    }
}
