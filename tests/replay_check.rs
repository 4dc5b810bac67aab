//! Regression (#25, item 7): `mass replay RUN --check` compared the main
//! head only, so events of other streams the replay never reached (a
//! fork's partial streams, anything appended beside the run) passed
//! unnoticed. Every stream of the run must now be reproduced to its end,
//! or be named, by its head, in an event the replay reproduced.

use std::path::Path;
use std::process::{Command, Output};

fn mass(ledger: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mass"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .env_remove("MASS_LEDGER")
        .output()
        .unwrap()
}

fn note(text: &str) -> ledger::NewEvent {
    schemas::to_event(&schemas::Note { text: text.into() }).unwrap()
}

#[test]
fn regression_replay_check_reproduces_every_stream_not_only_the_main_head() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("ledger");
    let o = mass(&l, &["run", "examples/smoke.toml", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = mass(&l, &["replay", "smoke", "--check"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("streams reproduced"), "{out}");

    // One event past the end of a rollout's stream, and a stream of its
    // own nothing names.
    let stream = {
        let ledger = ledger::Ledger::open(&l).unwrap();
        let (name, head) = replay::run_refs(&ledger, "smoke")
            .unwrap()
            .into_iter()
            .find(|(n, _)| n.ends_with("/orch"))
            .expect("a rollout stream");
        ledger
            .append(&name, Some(head), note("appended beside the run"))
            .unwrap();
        ledger
            .append("smoke/stray", None, note("a stray stream"))
            .unwrap();
        name.strip_prefix("smoke/").unwrap().to_string()
    };
    let o = mass(&l, &["replay", "smoke", "--check"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains(&format!("stream {stream}: ")), "{err}");
    assert!(err.contains("recorded events reproduced"), "{err}");
    assert!(err.contains("stream stray (head "), "{err}");
    assert!(err.contains("never reached by the replay"), "{err}");
}

/// The execution settings (#25, item 7) are recorded beside the run, on
/// its `execution` stream, covered by no step's id. A second `run.execution`
/// appended there (a file with the same definition but another server, or
/// `serve` command) must not become what a resume or a replay check runs
/// with: only the event written with the run's `run.started` is accepted
/// (attacker review: any head with the same definition was).
#[test]
fn a_swapped_execution_record_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("ledger");
    let o = mass(&l, &["run", "examples/smoke.toml", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    {
        let ledger = ledger::Ledger::open(&l).unwrap();
        let head = ledger
            .head("smoke/execution")
            .unwrap()
            .expect("an execution stream");
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/smoke.toml"),
        )
        .unwrap();
        let other = ledger
            .put_blob(format!("# same definition, other settings\n{text}").as_bytes())
            .unwrap();
        let rec = schemas::RunExecution {
            config: schemas::Hash32(other.0),
        };
        ledger
            .append(
                "smoke/execution",
                Some(head),
                schemas::to_event(&rec).unwrap(),
            )
            .unwrap();
    }
    for args in [
        &["replay", "smoke", "--check"][..],
        &["resume", "smoke", "--quiet"],
    ] {
        let o = mass(&l, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}: {err}");
        assert!(
            err.contains("is not the run.execution event written with this run's run.started"),
            "{args:?}: {err}"
        );
    }
}
