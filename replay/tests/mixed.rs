//! Mixed mode (re-judges, forks over a source run) serves a recorded result
//! only while the stream is an exact positional prefix of the source's same
//! stream; from the first difference on, the stream is live to its end.
//! Every test runs over several seeds of the effects' contents, and each
//! one fails on the lookup by stream name and request id it replaced.

use std::sync::Arc;

use replay::{EffectError, EffectOutput, EffectRequest, Mode, Served, Session, SourceRun};

fn ledger(dir: &std::path::Path) -> Arc<ledger::Ledger> {
    Arc::new(ledger::Ledger::init(&dir.join("l")).unwrap())
}

fn session(l: &Arc<ledger::Ledger>, run: &str, source: Option<&str>) -> Session {
    let s = Session::new(l.clone(), run, Mode::Live).unwrap();
    let s = match source {
        Some(src) => s.with_source(
            SourceRun::pinned(l, src, ["judge".to_string()].into_iter().collect()).unwrap(),
        ),
        None => s,
    };
    s.set_seed(1);
    s
}

/// A tool request that, like `read_file notes.txt`, names neither the
/// workspace state nor the position.
fn tool(call: &str, journaled: bool) -> EffectRequest {
    let r = EffectRequest::json("tool", &serde_json::json!({ "call": call }));
    if journaled {
        r.journaled()
    } else {
        r
    }
}

/// A tiny workspace whose `notes.txt` the effects below write and read.
struct Ws(String);

impl Ws {
    /// Runs `call` against the workspace (`write X` or `read`) as a live
    /// effect would, or takes the served result (which a served `write`
    /// applies too, as a recorded tree would be checked out).
    fn step(
        &mut self,
        st: &mut replay::Stream,
        call: &str,
        journaled: bool,
        lives: &mut u32,
    ) -> String {
        let r = st
            .effect_blocking(tool(call, journaled), || {
                *lives += 1;
                Ok(EffectOutput::new(self.apply(call).into_bytes()))
            })
            .unwrap();
        let out = String::from_utf8(r.output.unwrap()).unwrap();
        if r.source != Served::Live {
            if let Some(v) = call.strip_prefix("write ") {
                self.0 = v.to_string();
            }
        }
        out
    }

    fn apply(&mut self, call: &str) -> String {
        match call.strip_prefix("write ") {
            Some(v) => {
                self.0 = v.to_string();
                "written".into()
            }
            None => self.0.clone(),
        }
    }
}

/// Regression (#25): a re-judge whose rollout wrote `notes.txt = BARE`
/// (a request the source never made) then had its `read_file notes.txt`
/// served from the source's record, `WITH-WORKFLOW`: the source was looked
/// up by request id alone. The stream is live from its first difference,
/// so the read sees what this run wrote, and equals a plain run's stream.
#[test]
fn regression_a_rejudge_never_serves_a_stale_tool_result() {
    for seed in 0..6u32 {
        let journaled = seed % 2 == 0;
        let d = tempfile::tempdir().unwrap();
        let l = ledger(d.path());
        let with = format!("WITH-WORKFLOW-{seed}");
        let bare = format!("BARE-{seed}");
        let src = session(&l, "src", None);
        let mut st = src.stream("rollout").unwrap();
        let (mut ws, mut lives) = (Ws(String::new()), 0);
        ws.step(&mut st, "read", journaled, &mut lives);
        ws.step(&mut st, &format!("write {with}"), journaled, &mut lives);
        assert_eq!(ws.step(&mut st, "read", journaled, &mut lives), with);
        drop(st);

        let rj = session(&l, "rj", Some("src"));
        let mut st = rj.stream("rollout").unwrap();
        let (mut ws, mut lives) = (Ws(String::new()), 0);
        // Same first request: served (the prefix is the source's).
        ws.step(&mut st, "read", journaled, &mut lives);
        assert_eq!(lives, 0, "seed {seed}: the common prefix is served");
        ws.step(&mut st, &format!("write {bare}"), journaled, &mut lives);
        let read = ws.step(&mut st, "read", journaled, &mut lives);
        assert_eq!(read, bare, "seed {seed}: a stale result was served");
        assert_eq!(lives, 2, "seed {seed}");

        // The same steps in a run with no source give the same stream.
        let plain = session(&l, "plain", None);
        let mut pst = plain.stream("rollout").unwrap();
        let (mut pws, mut plives) = (Ws(String::new()), 0);
        for call in ["read".to_string(), format!("write {bare}"), "read".into()] {
            pws.step(&mut pst, &call, journaled, &mut plives);
        }
        assert_eq!(st.head(), pst.head(), "seed {seed}");
    }
}

/// While a stream is the source's prefix, its records are the source's
/// (same ids), transient attempts a later attempt follows included but
/// stepped over (never served); a live-kind effect (the judge) runs live,
/// and when its result differs the rest of the stream is live, although
/// its requests are the source's.
#[test]
fn a_stream_is_served_while_it_is_the_sources_prefix_and_live_after() {
    for seed in 0..4u32 {
        let journaled = seed % 2 == 1;
        let d = tempfile::tempdir().unwrap();
        let l = ledger(d.path());
        let src = session(&l, "src", None);
        let mut st = src.stream("judging").unwrap();
        let first = tool(&format!("fetch {seed}"), journaled);
        let failed = st
            .effect_blocking(first.clone(), || Err(EffectError::transient("HTTP 503")))
            .unwrap();
        assert!(failed.output.is_err());
        st.effect_blocking(first.clone(), || Ok(EffectOutput::new(b"fetched".to_vec())))
            .unwrap();
        let judge = EffectRequest::json("judge", &serde_json::json!({ "pair": seed }));
        st.effect_blocking(judge.clone(), || Ok(EffectOutput::new(b"A".to_vec())))
            .unwrap();
        st.effect_blocking(tool("after", journaled), || {
            Ok(EffectOutput::new(b"source-after".to_vec()))
        })
        .unwrap();
        let src_head = st.head();
        drop(st);

        for (verdict, want_after, same_head) in
            [("A", "source-after", true), ("B", "live-after", false)]
        {
            let name = format!("rj-{verdict}");
            let rj = session(&l, &name, Some("src"));
            let mut st = rj.stream("judging").unwrap();
            let r = st
                .effect_blocking(first.clone(), || panic!("seed {seed}: served"))
                .unwrap();
            assert_eq!(r.output, Ok(b"fetched".to_vec()), "seed {seed}");
            assert_eq!(r.source, Served::Source);
            let mut judged = 0;
            st.effect_blocking(judge.clone(), || {
                judged += 1;
                Ok(EffectOutput::new(verdict.as_bytes().to_vec()))
            })
            .unwrap();
            assert_eq!(judged, 1, "the judge always runs live");
            let r = st
                .effect_blocking(tool("after", journaled), || {
                    Ok(EffectOutput::new(b"live-after".to_vec()))
                })
                .unwrap();
            assert_eq!(r.output, Ok(want_after.as_bytes().to_vec()), "{verdict}");
            assert_eq!(st.head() == src_head, same_head, "seed {seed} {verdict}");
        }
    }
}

/// A resumed mixed stream goes on from where its own history ends: what
/// the history took from the source is not served again, and a stream that
/// diverged before the crash stays live after it.
#[test]
fn a_resumed_mixed_stream_keeps_its_place_and_its_divergence() {
    let d = tempfile::tempdir().unwrap();
    let l = ledger(d.path());
    let src = session(&l, "src", None);
    let mut st = src.stream("s").unwrap();
    for out in ["one", "two", "three"] {
        st.effect_blocking(tool("next", true), || {
            Ok(EffectOutput::new(out.as_bytes().to_vec()))
        })
        .unwrap();
    }
    drop(st);
    // Takes "one", then crashes.
    let rj = session(&l, "rj", Some("src"));
    let mut st = rj.stream("s").unwrap();
    let r = st.effect_blocking(tool("next", true), || panic!()).unwrap();
    assert_eq!(r.output, Ok(b"one".to_vec()));
    drop(st);
    let rj = session(&l, "rj", Some("src"));
    let mut st = rj.stream("s").unwrap();
    let outs: Vec<Vec<u8>> = (0..3)
        .map(|_| {
            st.effect_blocking(tool("next", true), || panic!("served"))
                .unwrap()
                .output
                .unwrap()
        })
        .collect();
    assert_eq!(outs, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);

    // Diverges at its second step, crashes, resumes: live from there on.
    let fk = session(&l, "fk", Some("src"));
    let mut st = fk.stream("s").unwrap();
    st.effect_blocking(tool("next", true), || panic!()).unwrap();
    st.effect_blocking(tool("other", true), || {
        Ok(EffectOutput::new(b"mine".to_vec()))
    })
    .unwrap();
    drop(st);
    let fk = session(&l, "fk", Some("src"));
    let mut st = fk.stream("s").unwrap();
    st.effect_blocking(tool("next", true), || panic!()).unwrap();
    st.effect_blocking(tool("other", true), || panic!())
        .unwrap();
    let mut lives = 0;
    let r = st
        .effect_blocking(tool("next", true), || {
            lives += 1;
            Ok(EffectOutput::new(b"live".to_vec()))
        })
        .unwrap();
    assert_eq!((lives, r.output), (1, Ok(b"live".to_vec())));
}

/// A source whose caller saw a transient failure and went on (no second
/// attempt) is served that failure; resumed right after it, a mixed stream
/// serves it again from its own history instead of retrying it live (found
/// by an attacker's review: the resume retried, and the rest of the stream
/// ran live).
#[test]
fn a_resumed_mixed_stream_serves_a_failure_its_source_moved_past() {
    for journaled in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let l = ledger(d.path());
        let src = session(&l, "src", None);
        let mut st = src.stream("s").unwrap();
        st.effect_blocking(tool("flaky", journaled), || {
            Err(EffectError::transient("HTTP 503"))
        })
        .unwrap();
        st.effect_blocking(tool("next", journaled), || {
            Ok(EffectOutput::new(b"went on".to_vec()))
        })
        .unwrap();
        let src_head = st.head();
        drop(st);

        let rj = session(&l, "rj", Some("src"));
        let mut st = rj.stream("s").unwrap();
        let r = st
            .effect_blocking(tool("flaky", journaled), || panic!("served"))
            .unwrap();
        assert!(r.output.is_err(), "journaled {journaled}");
        drop(st);
        // Resumed here: the failure is served, then the source goes on.
        let rj = session(&l, "rj", Some("src"));
        let mut st = rj.stream("s").unwrap();
        let r = st
            .effect_blocking(tool("flaky", journaled), || panic!("not retried"))
            .unwrap();
        assert!(r.output.is_err(), "journaled {journaled}");
        let r = st
            .effect_blocking(tool("next", journaled), || panic!("served"))
            .unwrap();
        assert_eq!(r.output, Ok(b"went on".to_vec()));
        assert_eq!(st.head(), src_head, "journaled {journaled}");
    }
}
