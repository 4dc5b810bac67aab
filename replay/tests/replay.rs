//! Record, replay-check, divergence, mixed mode and fork, with the test driver.

mod common;

use std::collections::BTreeSet;

use common::{drive, ledger_in, DriveError, Effects, Variant};
use replay::{fork_run, Mode, ReplayError, Served, Session, SourceRun};

fn session(l: &std::sync::Arc<ledger::Ledger>, run: &str, mode: Mode, seed: u64) -> Session {
    let s = Session::new(l.clone(), run, mode).unwrap();
    s.set_seed(seed);
    s
}

#[test]
fn recording_twice_gives_identical_ids_and_replay_reproduces_them() {
    let d = tempfile::tempdir().unwrap();
    let l = ledger_in(&d.path().join("l"));
    let fx = Effects::default();
    let h1 = drive(
        &session(&l, "first", Mode::Live, 7),
        5,
        &Variant::default(),
        &fx,
    )
    .unwrap();
    let live_after_first: u64 = fx.by_kind.lock().unwrap().values().sum();
    // A second recording under another name, in another ledger too.
    let d2 = tempfile::tempdir().unwrap();
    let l2 = ledger_in(&d2.path().join("l"));
    let h2 = drive(
        &session(&l2, "second", Mode::Live, 7),
        5,
        &Variant::default(),
        &Effects::default(),
    )
    .unwrap();
    assert_eq!(h1, h2, "same seed, same decisions -> same ids");
    // Every worker stream ends at the same id in both ledgers.
    for step in 0..5 {
        for w in ["a", "b"] {
            assert_eq!(
                l.head(&format!("first/step/{step}/{w}")).unwrap(),
                l2.head(&format!("second/step/{step}/{w}")).unwrap()
            );
        }
    }
    // A different seed gives different ids.
    let h3 = drive(
        &session(&l2, "third", Mode::Live, 8),
        5,
        &Variant::default(),
        &Effects::default(),
    )
    .unwrap();
    assert_ne!(h1, h3);
    // Replay check: same ids, nothing executed.
    let s = session(&l, "first", Mode::Check, 7);
    let hc = drive(&s, 5, &Variant::default(), &fx).unwrap();
    assert_eq!(hc, h1);
    assert_eq!(
        fx.by_kind.lock().unwrap().values().sum::<u64>(),
        live_after_first,
        "a replay check runs nothing"
    );
    assert!(s.counts().keys().all(|(_, how)| *how == Served::History));
}

#[test]
fn an_altered_request_is_a_divergence_with_a_readable_diff() {
    let d = tempfile::tempdir().unwrap();
    let l = ledger_in(&d.path().join("l"));
    let fx = Effects::default();
    drive(
        &session(&l, "r", Mode::Live, 3),
        4,
        &Variant::default(),
        &fx,
    )
    .unwrap();
    let v = Variant {
        temperature_from_step: Some((2, 0.9)),
        ..Default::default()
    };
    let err = drive(&session(&l, "r", Mode::Check, 3), 4, &v, &fx).unwrap_err();
    let DriveError::Replay(ReplayError::Divergence(div)) = err else {
        panic!("expected a divergence, got {err:?}")
    };
    assert_eq!(div.stream, "step/2/a");
    assert_eq!(div.position, 2, "after compute's started+result");
    assert_ne!(div.expected, div.actual);
    assert!(
        div.diff
            .iter()
            .any(|l| l == "$.params.temperature: 0.7 -> 0.9"),
        "{:?}",
        div.diff
    );
    let text = div.to_string();
    assert!(
        text.contains("stream \"step/2/a\" at position 2") && text.contains(&div.expected.to_hex()),
        "{text}"
    );
}

#[test]
fn an_extra_request_is_a_divergence_at_the_right_position() {
    let d = tempfile::tempdir().unwrap();
    let l = ledger_in(&d.path().join("l"));
    let fx = Effects::default();
    drive(
        &session(&l, "r", Mode::Live, 3),
        4,
        &Variant::default(),
        &fx,
    )
    .unwrap();
    let v = Variant {
        extra_effect_at_step: Some(1),
        ..Default::default()
    };
    let err = drive(&session(&l, "r", Mode::Check, 3), 4, &v, &fx).unwrap_err();
    let DriveError::Replay(ReplayError::Divergence(div)) = err else {
        panic!("{err:?}")
    };
    assert_eq!((div.stream.as_str(), div.position), ("step/1/a", 3));
    assert!(div.summary.contains("effect compute"), "{}", div.summary);
    assert!(
        div.diff.iter().any(|l| l.contains("$.extra")),
        "{:?}",
        div.diff
    );
}

#[test]
fn a_message_change_is_shown_by_content_not_hash() {
    let d = tempfile::tempdir().unwrap();
    let l = ledger_in(&d.path().join("l"));
    drive(
        &session(&l, "r", Mode::Live, 3),
        2,
        &Variant::default(),
        &Effects::default(),
    )
    .unwrap();
    // An override of `bias` changes y and so the model message text.
    let s = session(&l, "r", Mode::Check, 3);
    let head = l.head("r").unwrap().unwrap();
    let _ = head;
    let mut st = s.stream("step/0/a").unwrap();
    // Serve compute, then ask for the model call with another message.
    let seed = st.derive_seed("x");
    let x = (seed % 1000) as i64;
    st.effect_blocking(
        replay::EffectRequest::json("compute", &serde_json::json!({"x": x, "step": 0})).journaled(),
        || unreachable!(),
    )
    .unwrap();
    let m =
        serde_json::to_vec(&serde_json::json!({"role": "user", "content": "value 12345"})).unwrap();
    let mid = ledger::Id::of(ledger::ObjectKind::Blob, &m);
    let req = replay::EffectRequest::json("model", &serde_json::json!({"model": "sim", "params": {"temperature": 0.7}, "messages": [mid.to_hex()], "prefix": st.head().map(|h| h.to_hex())})).with_blob(m);
    let err = st.effect_blocking(req, || unreachable!()).unwrap_err();
    let ReplayError::Divergence(div) = err else {
        panic!("{err}")
    };
    assert!(
        div.diff
            .iter()
            .any(|l| l.starts_with("$.messages[0]@.content: \"value ")
                && l.ends_with("-> \"value 12345\"")),
        "{:?}",
        div.diff
    );
}

#[test]
fn mixed_mode_calls_only_the_live_kind() {
    let d = tempfile::tempdir().unwrap();
    let l = ledger_in(&d.path().join("l"));
    drive(
        &session(&l, "orig", Mode::Live, 11),
        4,
        &Variant::default(),
        &Effects::default(),
    )
    .unwrap();
    let fx = Effects::default();
    let s = session(&l, "rejudged", Mode::Live, 11)
        .with_source(SourceRun::pinned(&l, "orig", BTreeSet::from(["judge".to_string()])).unwrap());
    // A different judge: its scores differ, nothing else may run.
    let v = Variant {
        judge_bias: 100,
        ..Default::default()
    };
    let h = drive(&s, 4, &v, &fx).unwrap();
    let kinds: Vec<String> = fx.by_kind.lock().unwrap().keys().cloned().collect();
    assert_eq!(
        kinds,
        vec!["judge".to_string()],
        "only judge calls run live"
    );
    assert_eq!(fx.by_kind.lock().unwrap()["judge"], 8);
    let counts = s.counts();
    assert_eq!(counts[&("compute".to_string(), Served::Source)], 8);
    assert_eq!(counts[&("model".to_string(), Served::Source)], 8);
    assert_ne!(
        Some(h),
        l.head("orig").unwrap(),
        "new verdicts, new decisions"
    );
    // The re-judged run is a normal run: it replays and checks by itself.
    let h2 = drive(
        &session(&l, "rejudged", Mode::Check, 11),
        4,
        &v,
        &Effects::default(),
    )
    .unwrap();
    assert_eq!(h, h2);
}

#[test]
fn fork_shares_ids_before_the_fork_point_and_differs_after() {
    let d = tempfile::tempdir().unwrap();
    let l = ledger_in(&d.path().join("l"));
    let parent_head = drive(
        &session(&l, "base", Mode::Live, 5),
        6,
        &Variant::default(),
        &Effects::default(),
    )
    .unwrap();
    let parent_refs = l.refs().unwrap();
    // Main stream: [start, step0, step1, ...]; fork after step 2.
    let mut main: Vec<ledger::Id> = l.chain(parent_head).map(|e| e.unwrap().id).collect();
    main.reverse();
    let at = main[3];
    fork_run(&l, "base", at, "alt", &[("bias".into(), "50".into())]).unwrap();
    let fx = Effects::default();
    let h = drive(
        &session(&l, "alt", Mode::Live, 5),
        6,
        &Variant::default(),
        &fx,
    )
    .unwrap();
    let mut alt: Vec<ledger::Id> = l.chain(h).map(|e| e.unwrap().id).collect();
    alt.reverse();
    assert_eq!(&alt[..4], &main[..4], "shared history up to the fork point");
    assert_eq!(l.get_event(&alt[4]).unwrap().kind, "run.forked");
    assert!(
        alt[5..].iter().all(|id| !main.contains(id)),
        "everything after differs"
    );
    // Steps before the fork were not re-run; steps after were.
    assert_eq!(
        fx.by_kind.lock().unwrap()["compute"],
        6,
        "3 steps x 2 workers re-run"
    );
    for step in 0..3 {
        assert_eq!(
            l.head(&format!("alt/step/{step}/a")).unwrap(),
            l.head(&format!("base/step/{step}/a")).unwrap()
        );
    }
    // The parent is untouched.
    assert_eq!(
        parent_refs
            .iter()
            .filter(|(n, _)| n.starts_with("base"))
            .collect::<Vec<_>>(),
        l.refs()
            .unwrap()
            .iter()
            .filter(|(n, _)| n.starts_with("base"))
            .collect::<Vec<_>>()
    );
    // The fork replays and checks by itself.
    assert_eq!(
        drive(
            &session(&l, "alt", Mode::Check, 5),
            6,
            &Variant::default(),
            &Effects::default()
        )
        .unwrap(),
        h
    );
    // A fork at a worker event keeps that stream up to the event and goes
    // live after it: without overrides it ends where the source ended.
    let w_head = l.head("base/step/1/a").unwrap().unwrap();
    let mut w_chain: Vec<ledger::Id> = l.chain(w_head).map(|e| e.unwrap().id).collect();
    w_chain.reverse();
    let w = w_chain[w_chain.len() / 2];
    fork_run(&l, "base", w, "mid", &[]).unwrap();
    assert_eq!(l.head("mid/step/1/a").unwrap(), Some(w));
    drive(
        &session(&l, "mid", Mode::Live, 5),
        6,
        &Variant::default(),
        &Effects::default(),
    )
    .unwrap();
    assert_eq!(l.head("mid/step/1/a").unwrap(), Some(w_head));
    // An event that is on none of the run's streams is refused.
    let other = l.put_blob(b"not an event").unwrap();
    let e = fork_run(&l, "base", other, "bad", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not an event"), "{e}");
}

#[test]
fn resume_after_an_in_process_abort_finishes_with_the_same_head() {
    let d = tempfile::tempdir().unwrap();
    let reference = drive(
        &session(&ledger_in(&d.path().join("ref")), "r", Mode::Live, 9),
        5,
        &Variant::default(),
        &Effects::default(),
    )
    .unwrap();
    for budget in [0u64, 1, 2, 5, 13, 21, 29] {
        let dd = tempfile::tempdir().unwrap();
        let l = ledger_in(&dd.path().join("l"));
        let fx = Effects::default();
        *fx.budget.lock().unwrap() = Some(budget);
        assert!(matches!(
            drive(
                &session(&l, "r", Mode::Live, 9),
                5,
                &Variant::default(),
                &fx
            ),
            Err(DriveError::Aborted)
        ));
        *fx.budget.lock().unwrap() = None;
        let h = drive(
            &session(&l, "r", Mode::Live, 9),
            5,
            &Variant::default(),
            &fx,
        )
        .unwrap();
        assert_eq!(h, reference, "budget {budget}");
        assert!(
            fx.by_request.lock().unwrap().values().all(|&n| n == 1),
            "budget {budget}: an effect ran twice"
        );
    }
}
