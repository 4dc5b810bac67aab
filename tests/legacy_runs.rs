//! Runs recorded by an earlier driver keep their meaning. The fixture
//! `tests/fixtures/ledgers/engine-8-smoke` is the smoke experiment recorded
//! by the `mass-engine/8` build (before MASS fidelity, #27: its judge saw
//! the checks' output, its orchestrator was told to delegate). This build
//! must replay it exactly, and a fork of it must go on with that method,
//! not today's: every prompt it sends is the one the recorded run sent.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ledger::Ledger;

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

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A private copy of the fixture (tests never write to it).
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ledgers/engine-8-smoke");
    let d = tempfile::tempdir().unwrap();
    let dst = d.path().join("ledger");
    copy_dir(&src, &dst);
    (d, dst)
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), to).unwrap();
        }
    }
}

/// The first system and user message of every conversation recorded on a
/// stream of run `run` whose name ends with `suffix`.
fn first_prompts(l: &Ledger, run: &str, suffix: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, head) in l.refs().unwrap() {
        if !name.starts_with(&format!("{run}/")) || !name.ends_with(suffix) {
            continue;
        }
        let Some(t) = engine::transcript::stream_conversation(l, head).unwrap() else {
            continue;
        };
        out.push((
            t.messages[0].content_str().to_string(),
            t.messages[1].content_str().to_string(),
        ));
    }
    out
}

#[test]
fn a_run_recorded_by_engine_8_replays_exactly() {
    let (_d, l) = fixture();
    let started = ok(&mass(&l, &["log", "smoke", "--json"]));
    assert!(started.contains("mass-engine/8"), "the fixture is a /8 run");
    let out = ok(&mass(&l, &["replay", "smoke", "--check"]));
    assert!(
        out.contains("replay check passed") && out.contains("none run"),
        "replaying a /8 run did not reproduce it from the ledger alone: {out}"
    );
}

#[test]
fn a_fork_of_an_engine_8_run_keeps_the_method_it_was_recorded_with() {
    let (_d, l) = fixture();
    ok(&mass(
        &l,
        &[
            "fork", "smoke", "--cycle", "1", "--stage", "collect", "--name", "f",
        ],
    ));
    ok(&mass(&l, &["resume", "f", "--quiet"]));
    let held = Ledger::open_read_only(&l).unwrap();
    // The fork's own collection and judging: new streams, run live.
    let orch = first_prompts(&held, "f", "/orch");
    let forked_collect: Vec<_> = held
        .refs()
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n.starts_with("f/c1/") && n.contains("/collect/") && n.ends_with("/orch"))
        .collect();
    assert!(!forked_collect.is_empty(), "the fork collected runs");
    for (system, _) in &orch {
        assert_eq!(
            system,
            engine::prompts::ORCHESTRATOR_SYSTEM,
            "a /8 run's orchestrator prompt"
        );
    }
    let pairs: Vec<_> = held
        .refs()
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n.starts_with("f/c1/") && n.contains("/pair/"))
        .map(|(_, h)| h)
        .collect();
    assert!(!pairs.is_empty(), "the fork judged pairs");
    for h in pairs {
        let t = engine::transcript::stream_conversation(&held, h)
            .unwrap()
            .unwrap();
        assert_eq!(t.messages[0].content_str(), engine::prompts::JUDGE_SYSTEM);
        assert!(
            t.messages[1]
                .content_str()
                .contains(engine::prompts::VALIDATION_HEADER),
            "a /8 run's judge was shown the checks' output"
        );
    }
}
