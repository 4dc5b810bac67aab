//! A re-judge's source as `recorded_source` reads it back for a resume:
//! pinned heads (v2) that must be in the ledger, or a ref (v1, older
//! builds) that must still exist. A source that is gone is `NotFound`
//! (exit 4 at the CLI), never a silent live run.

use std::sync::Arc;

use engine::error::EngineError;
use schemas::{Hash32, RunMixed, RunMixedV1, StreamHead};

fn ledger() -> (tempfile::TempDir, Arc<ledger::Ledger>) {
    let d = tempfile::tempdir().unwrap();
    let l = Arc::new(ledger::Ledger::init(&d.path().join("l")).unwrap());
    (d, l)
}

fn note(l: &ledger::Ledger, run: &str, text: &str) -> ledger::Id {
    let head = l.head(run).unwrap();
    l.append(
        run,
        head,
        schemas::to_event(&schemas::Note { text: text.into() }).unwrap(),
    )
    .unwrap()
}

#[test]
fn a_v1_rejudge_whose_source_ref_is_gone_is_not_found() {
    let (_d, l) = ledger();
    note(&l, "src", "the source");
    note(&l, "rj", "forked");
    let m = RunMixedV1 {
        source_run: "src".into(),
        live_kinds: vec!["judge".into()],
    };
    let h = l.head("rj").unwrap();
    l.append("rj", h, schemas::to_event(&m).unwrap()).unwrap();
    let s = engine::driver::recorded_source(&l, "rj").unwrap().unwrap();
    assert_eq!((s.run.as_str(), s.heads.is_none()), ("src", true));
    replay::remove_run(&l, "src", "removed").unwrap();
    match engine::driver::recorded_source(&l, "rj") {
        Err(EngineError::NotFound(msg)) => {
            assert!(msg.contains("run rj re-judges run src"), "{msg}");
            assert!(msg.contains("nothing was run"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_v2_rejudge_reads_its_pinned_heads_whatever_the_ref_does() {
    let (_d, l) = ledger();
    let src_head = note(&l, "src", "the source");
    note(&l, "rj", "forked");
    let pinned = RunMixed {
        source_run: "src".into(),
        live_kinds: vec!["judge".into()],
        heads: vec![StreamHead {
            stream: "main".into(),
            head: Hash32(src_head.0),
        }],
    };
    let h = l.head("rj").unwrap();
    l.append("rj", h, schemas::to_event(&pinned).unwrap())
        .unwrap();
    // The source's ref goes: the pinned head still names its records.
    replay::remove_run(&l, "src", "removed").unwrap();
    let s = engine::driver::recorded_source(&l, "rj").unwrap().unwrap();
    assert_eq!(
        s.heads.unwrap().get("main").copied(),
        Some(src_head),
        "pinned, not looked up"
    );
    // A record naming a head the ledger lacks cannot be written at all
    // (links must resolve), so the source cannot silently go missing.
    note(&l, "rj2", "forked");
    let missing = RunMixed {
        heads: vec![StreamHead {
            stream: "main".into(),
            head: Hash32([7; 32]),
        }],
        ..pinned
    };
    let h = l.head("rj2").unwrap();
    assert!(l
        .append("rj2", h, schemas::to_event(&missing).unwrap())
        .is_err());
}
