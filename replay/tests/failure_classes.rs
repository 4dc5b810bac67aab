//! Failure classes (the fork/re-judge issue's "a failure is forever"): a
//! transient failure that ends a stream is retried on resume, with every
//! attempt recorded; a final failure is served as recorded; replaying a
//! stream with several attempts serves the last one; check mode serves what
//! the run saw. Holds for journaled and plain effects.

use std::sync::Arc;

use replay::{EffectError, EffectOutput, EffectRequest, FailureClass, Mode, Session};

fn ledger(dir: &std::path::Path) -> Arc<ledger::Ledger> {
    Arc::new(ledger::Ledger::init(&dir.join("l")).unwrap())
}

fn req(journaled: bool) -> EffectRequest {
    let r = EffectRequest::json("trainer", &serde_json::json!({"cycle": 1}));
    if journaled {
        r.journaled()
    } else {
        r
    }
}

fn attempt(
    l: &Arc<ledger::Ledger>,
    mode: Mode,
    journaled: bool,
    result: Result<&str, EffectError>,
) -> (replay::Recorded, u32) {
    let s = Session::new(l.clone(), "run", mode).unwrap();
    s.set_seed(1);
    let mut st = s.stream("train").unwrap();
    let mut calls = 0;
    let r = st
        .effect_blocking(req(journaled), || {
            calls += 1;
            result.map(|o| EffectOutput::new(o.as_bytes().to_vec()))
        })
        .unwrap();
    (r, calls)
}

fn records(l: &ledger::Ledger) -> usize {
    let head = l.head("run/train").unwrap().unwrap();
    l.chain(head).count()
}

#[test]
fn a_transient_failure_that_ends_a_stream_is_retried_on_resume() {
    for journaled in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let l = ledger(d.path());
        let per = if journaled { 2 } else { 1 };
        let (r, calls) = attempt(
            &l,
            Mode::Live,
            journaled,
            Err(EffectError::transient("exit 137")),
        );
        assert_eq!((calls, r.failure), (1, Some(FailureClass::Transient)));
        assert_eq!(r.output, Err("exit 137".to_string()));
        // Check mode serves what the run saw, running nothing.
        let (r, calls) = attempt(&l, Mode::Check, journaled, Ok("never"));
        assert_eq!((calls, r.output), (0, Err("exit 137".to_string())));
        // A second transient failure is recorded beside the first.
        let (_, calls) = attempt(
            &l,
            Mode::Live,
            journaled,
            Err(EffectError::transient("exit 1")),
        );
        assert_eq!(calls, 1);
        assert_eq!(records(&l), 2 * per);
        // Resumed after the cause is fixed, it runs again and succeeds.
        let (r, calls) = attempt(&l, Mode::Live, journaled, Ok("trained"));
        assert_eq!((calls, r.output), (1, Ok(b"trained".to_vec())));
        assert_eq!(records(&l), 3 * per, "every attempt stays recorded");
        // From then on the success is served, in live and check mode alike.
        for mode in [Mode::Live, Mode::Check] {
            let (r, calls) = attempt(&l, mode, journaled, Err(EffectError::transient("no")));
            assert_eq!((calls, r.output), (0, Ok(b"trained".to_vec())));
        }
    }
}

#[test]
fn a_final_failure_is_served_not_retried() {
    for journaled in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let l = ledger(d.path());
        let (r, _) = attempt(
            &l,
            Mode::Live,
            journaled,
            Err(EffectError::final_("bad args")),
        );
        assert_eq!(r.failure, Some(FailureClass::Final));
        let (r, calls) = attempt(&l, Mode::Live, journaled, Ok("would succeed"));
        assert_eq!((calls, r.output), (0, Err("bad args".to_string())));
        assert_eq!(r.failure, Some(FailureClass::Final));
        // A plain message is a final failure.
        let e: EffectError = "x".to_string().into();
        assert_eq!(e.class, FailureClass::Final);
    }
}

#[test]
fn a_transient_failure_the_run_moved_past_is_served() {
    // The driver saw the failure and went on: a resume must not retry it
    // (that would change the run's course), only the end of a stream is.
    let d = tempfile::tempdir().unwrap();
    let l = ledger(d.path());
    let s = Session::new(l.clone(), "run", Mode::Live).unwrap();
    s.set_seed(1);
    let mut st = s.stream("train").unwrap();
    st.effect_blocking(req(false), || Err(EffectError::transient("flaky")))
        .unwrap();
    let other = EffectRequest::json("tool", &serde_json::json!({"after": true}));
    st.effect_blocking(other.clone(), || Ok(EffectOutput::new(b"ok".to_vec())))
        .unwrap();
    drop(st);
    let s = Session::new(l.clone(), "run", Mode::Live).unwrap();
    s.set_seed(1);
    let mut st = s.stream("train").unwrap();
    let r = st
        .effect_blocking(req(false), || panic!("must be served"))
        .unwrap();
    assert_eq!(r.output, Err("flaky".to_string()));
    let r = st
        .effect_blocking(other, || panic!("must be served"))
        .unwrap();
    assert_eq!(r.output, Ok(b"ok".to_vec()));
}

fn mixed(l: &Arc<ledger::Ledger>, run: &str, source: &str) -> Session {
    let s = Session::new(l.clone(), run, Mode::Live)
        .unwrap()
        .with_source(replay::SourceRun::pinned(l, source, Default::default()).unwrap());
    s.set_seed(1);
    s
}

/// Regression (#24, item 10): a re-judge or fork over a source that
/// recovered from a transient failure ([503, then OK]) once served the
/// recorded failure, which made the caller retry (sleeping, charging its
/// retry budget) or stop with an infrastructure error. The source's
/// transient attempts that a later attempt follows are stepped over, as
/// resume steps over them in a run's own history.
#[test]
fn a_source_that_recovered_from_a_transient_failure_serves_the_recovery() {
    for journaled in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let l = ledger(d.path());
        attempt(
            &l,
            Mode::Live,
            journaled,
            Err(EffectError::transient("HTTP 503")),
        );
        attempt(&l, Mode::Live, journaled, Ok("trained"));
        let s = mixed(&l, "fork", "run");
        let mut st = s.stream("train").unwrap();
        let r = st
            .effect_blocking(req(journaled), || panic!("served from the source"))
            .unwrap();
        assert_eq!(r.output, Ok(b"trained".to_vec()), "journaled {journaled}");
    }
}

/// On resume, a mixed-mode stream does not serve again what its own
/// history already took from the source (two identical requests: the
/// second call after the resume gets the source's second answer).
#[test]
fn a_resumed_mixed_stream_never_serves_the_same_source_record_twice() {
    let d = tempfile::tempdir().unwrap();
    let l = ledger(d.path());
    let s = Session::new(l.clone(), "run", Mode::Live).unwrap();
    s.set_seed(1);
    let mut st = s.stream("train").unwrap();
    for out in ["first", "second"] {
        st.effect_blocking(req(false), || {
            Ok(EffectOutput::new(out.as_bytes().to_vec()))
        })
        .unwrap();
    }
    drop(st);
    let s = mixed(&l, "fork", "run");
    let mut st = s.stream("train").unwrap();
    let r = st.effect_blocking(req(false), || panic!("served")).unwrap();
    assert_eq!(r.output, Ok(b"first".to_vec()));
    drop(st);
    // Resumed: the history serves "first", then the source's next record.
    let s = mixed(&l, "fork", "run");
    let mut st = s.stream("train").unwrap();
    let r = st.effect_blocking(req(false), || panic!("served")).unwrap();
    assert_eq!(r.output, Ok(b"first".to_vec()));
    let r = st.effect_blocking(req(false), || panic!("served")).unwrap();
    assert_eq!(r.output, Ok(b"second".to_vec()));
}
