//! Crash and resume: a child process drives a long seeded run and is SIGKILLed
//! at random points; each time the run is resumed. The final head must equal an
//! uninterrupted run's, and no effect whose result was recorded may run again.

mod common;

use std::collections::HashSet;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{drive, Effects, Variant};
use ledger::{Id, Ledger};
use replay::{Mode, Session};
use schemas::{Effect, EffectStatus};

const CHILD_DIR: &str = "REPLAY_CRASH_CHILD_DIR";
const STEPS: u64 = 200;
const SEED: u64 = 77;

#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let l = std::sync::Arc::new(Ledger::open(&dir.join("l")).expect("open"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("executions.log"))
        .unwrap();
    let fx = Effects {
        log: std::sync::Mutex::new(Some(log)),
        delay: Some(Duration::from_millis(2)),
        ..Default::default()
    };
    let s = Session::new(l, "run", Mode::Live).unwrap();
    s.set_seed(SEED);
    drive(&s, STEPS, &Variant::default(), &fx).unwrap();
    println!("DONE");
}

/// Request ids of effects that have a recorded result in the run.
fn recorded_results(l: &Ledger) -> HashSet<Id> {
    let mut out = HashSet::new();
    for id in l.events_newest_first(Some("effect"), usize::MAX).unwrap() {
        let e: Effect = schemas::decode_event(&l.get_event(&id).unwrap()).unwrap();
        if e.status != EffectStatus::Started {
            out.insert(Id(e.request.0));
        }
    }
    out
}

fn log_lines(dir: &std::path::Path) -> Vec<Id> {
    match std::fs::File::open(dir.join("executions.log")) {
        // A line cut by a kill (before its write completed) is not an execution
        // record of anything: skip what does not parse.
        Ok(f) => std::io::BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| l.parse().ok())
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn sigkill_and_resume_reaches_the_uninterrupted_head() {
    if std::env::var(CHILD_DIR).is_ok() {
        return;
    }
    let kills_wanted: usize = std::env::var("REPLAY_CRASH_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let refdir = tempfile::tempdir().unwrap();
    let reference = {
        let l = std::sync::Arc::new(Ledger::init(&refdir.path().join("l")).unwrap());
        let s = Session::new(l, "reference", Mode::Live).unwrap();
        s.set_seed(SEED);
        drive(&s, STEPS, &Variant::default(), &Effects::default()).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    drop(Ledger::init(&dir.path().join("l")).unwrap());
    let exe = std::env::current_exe().unwrap();
    let mut rng: u64 = 0x5eed;
    let mut kills = 0;
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(rounds < 400, "the run never finished");
        // What had a recorded result before this round must not run again.
        let (before, lines_before) = {
            let l = Ledger::open(&dir.path().join("l")).unwrap();
            (recorded_results(&l), log_lines(dir.path()).len())
        };
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let finished = if kills < kills_wanted {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            std::thread::sleep(Duration::from_millis(15 + (rng >> 33) % 45));
            let done = child.try_wait().unwrap().is_some();
            if !done {
                child.kill().unwrap();
                kills += 1;
            }
            child.wait().unwrap();
            done
        } else {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "final resume failed");
            true
        };
        let again: Vec<Id> = log_lines(dir.path())[lines_before..]
            .iter()
            .filter(|id| before.contains(id))
            .copied()
            .collect();
        assert!(
            again.is_empty(),
            "round {rounds}: effects with recorded results ran again: {again:?}"
        );
        if finished {
            break;
        }
    }
    assert!(
        kills >= kills_wanted,
        "only {kills} kills landed before the run finished"
    );
    let l = Ledger::open(&dir.path().join("l")).unwrap();
    assert_eq!(
        l.head("run").unwrap(),
        Some(reference),
        "resumed run ends where the uninterrupted one does"
    );
    assert!(l.verify(&|_| Ok(())).unwrap().is_clean());
    eprintln!(
        "{kills} kills over {rounds} rounds; {} live executions in all",
        log_lines(dir.path()).len()
    );
}
