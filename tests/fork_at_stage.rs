//! `mass fork RUN --cycle C --stage NAME` forks right before a stage of a
//! cycle: every step of the earlier stages is kept as recorded, and the
//! stage and everything after it run again on `mass resume` with the
//! fork's overrides. The fork points are checked against this file's own
//! reading of the recorded steps (kinds and note texts), not the engine's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const STAGES: [&str; 8] = [
    "search", "collect", "judge", "rank", "select", "dataset", "train", "evaluate",
];

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
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A run's main stream, oldest first.
fn main_stream(l: &Path, run: &str) -> Vec<Value> {
    let v: Vec<Value> = serde_json::from_str(&ok(&mass(l, &["log", run, "--json"]))).unwrap();
    v.into_iter().rev().collect()
}

/// The stage (by its position in `STAGES`) a cycle-1 step closes work of,
/// read from its kind and, for notes, its text. Selection is counted with
/// ranking: they run task by task, one after the other.
fn stage_of(e: &Value) -> Option<usize> {
    let text = e["payload"]["text"].as_str().unwrap_or("");
    let name = match e["kind"].as_str()? {
        "note" if text == "cycle 1: reference runs done" => "search",
        "note" if text.starts_with("cycle 1: inner iteration") => "search",
        "note" if text.starts_with("cycle 1: collection done") => "collect",
        "note" if text.starts_with("cycle 1: ") && text.ends_with("judged") => "judge",
        "mass.ranking" | "mass.selection" => "rank",
        "mass.dataset" => "dataset",
        "mass.training" => "train",
        "mass.evaluation" | "mass.cycle" => "evaluate",
        _ => return None,
    };
    STAGES.iter().position(|s| *s == name)
}

/// A fresh ledger holding the smoke run.
fn smoke_run() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("ledger");
    ok(&mass(&l, &["run", "examples/smoke.toml", "--quiet"]));
    (d, l)
}

/// The payloads of a run's main-stream records of one kind, oldest first.
fn payloads(l: &Path, run: &str, kind: &str) -> Vec<Value> {
    main_stream(l, run)
        .into_iter()
        .filter(|e| e["kind"] == kind)
        .map(|e| e["payload"].clone())
        .collect()
}

fn figures(l: &Path, run: &str) -> Value {
    let v: Value = serde_json::from_str(&ok(&mass(l, &["status", run, "--json"]))).unwrap();
    v[0]["cycles"].clone()
}

#[test]
fn a_fork_before_each_stage_keeps_the_earlier_steps_and_reruns_the_rest() {
    let (_d, l) = smoke_run();
    let source = main_stream(&l, "smoke");
    let source_figures = figures(&l, "smoke");
    for (si, stage) in STAGES.iter().enumerate() {
        let name = format!("f-{stage}");
        let said = ok(&mass(
            &l,
            &[
                "fork", "smoke", "--cycle", "1", "--stage", stage, "--name", &name,
            ],
        ));
        assert!(said.contains("forked run smoke at"), "{said}");
        // The fork's main stream: the source's up to the fork point, then
        // the fork event.
        let fork = main_stream(&l, &name);
        let (last, kept) = fork.split_last().unwrap();
        assert_eq!(last["kind"], "run.forked", "{stage}");
        let point = kept.len();
        for (a, b) in kept.iter().zip(&source) {
            assert_eq!(a["id"], b["id"], "{stage}: the fork rewrote a kept step");
        }
        let first_of = if *stage == "select" { 3 } else { si };
        for e in kept {
            assert!(
                stage_of(e).is_none_or(|s| s < first_of),
                "{stage}: kept a step of a later stage: {e}"
            );
        }
        // The first step not kept is the stage's, but for the note on the
        // sandbox level, which belongs to the run's start (a fork before
        // cycle 1's search is taken before it, where the driver applies
        // overrides before choosing tasks and checking the sandbox).
        let next = source[point..].iter().find(|e| {
            !e["payload"]["text"]
                .as_str()
                .unwrap_or("")
                .starts_with("sandbox: ")
        });
        assert_eq!(
            next.and_then(stage_of),
            Some(first_of),
            "{stage}: the first step not kept is not the stage's"
        );
        if *stage == "search" {
            assert_eq!(kept.last().unwrap()["kind"], "run.started", "{stage}");
        }
        // Resumed without overrides, the simulated run comes out the same.
        ok(&mass(&l, &["resume", &name, "--quiet"]));
        assert_eq!(figures(&l, &name), source_figures, "{stage}");
    }
}

#[test]
fn a_fork_before_selection_keeps_the_ranking_and_changes_what_is_selected() {
    let (_d, l) = smoke_run();
    ok(&mass(
        &l,
        &[
            "fork",
            "smoke",
            "--cycle",
            "1",
            "--stage",
            "select",
            "--name",
            "one",
            "--set",
            "outer.train_ranks=1",
        ],
    ));
    ok(&mass(&l, &["resume", "one", "--quiet"]));
    let of = |run: &str, kind: &str| payloads(&l, run, kind);
    assert_eq!(of("one", "mass.ranking"), of("smoke", "mass.ranking"));
    let (a, b) = (of("smoke", "mass.selection"), of("one", "mass.selection"));
    assert_eq!(a.len(), b.len());
    for (a, b) in a.iter().zip(&b) {
        assert_eq!(b["train"].as_array().unwrap().len(), 1, "{b}");
        assert!(a["train"].as_array().unwrap().len() > 1, "{a}");
    }
}

#[test]
fn a_stage_or_cycle_the_run_does_not_have_is_refused_and_nothing_is_written() {
    let (_d, l) = smoke_run();
    let refs = || ok(&mass(&l, &["refs", "--json"]));
    let before = refs();
    let o = mass(
        &l,
        &[
            "fork", "smoke", "--cycle", "1", "--stage", "judging", "--name", "x",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("search, collect, judge, rank, select, dataset, train, evaluate"),
        "{err}"
    );
    let o = mass(
        &l,
        &[
            "fork", "smoke", "--cycle", "2", "--stage", "judge", "--name", "x",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("recorded no step of cycle 2"), "{err}");
    let o = mass(
        &l,
        &[
            "fork", "nope", "--cycle", "1", "--stage", "judge", "--name", "x",
        ],
    );
    assert_ne!(o.status.code(), Some(0));
    assert_eq!(refs(), before);
}

/// Found by review: a fork before cycle 1's search was taken after the
/// sandbox note, where the driver had already chosen the tasks, so
/// `--set train=...` was ignored there.
#[test]
fn a_fork_before_the_first_search_can_choose_other_tasks() {
    let (_d, l) = smoke_run();
    ok(&mass(
        &l,
        &[
            "fork",
            "smoke",
            "--cycle",
            "1",
            "--stage",
            "search",
            "--name",
            "one-task",
            "--set",
            "train=[\"pha-hill-fit\"]",
        ],
    ));
    ok(&mass(&l, &["resume", "one-task", "--quiet"]));
    let rows: Vec<Value> =
        serde_json::from_str(&ok(&mass(&l, &["runs", "one-task", "--json"]))).unwrap();
    let tasks: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter(|r| r["kind"] == "reference")
        .map(|r| r["task"].as_str().unwrap())
        .collect();
    assert_eq!(tasks.into_iter().collect::<Vec<_>>(), ["pha-hill-fit"]);
}

/// Found by review: forking a fork at a stage before its own fork point
/// dropped that fork's settings while naming it as the parent. Refused,
/// saying what to do; a stage after it is forked as usual.
#[test]
fn a_fork_of_a_fork_before_its_own_fork_point_is_refused() {
    let (_d, l) = smoke_run();
    ok(&mass(
        &l,
        &[
            "fork",
            "smoke",
            "--cycle",
            "1",
            "--stage",
            "judge",
            "--name",
            "b",
            "--set",
            "outer.train_ranks=1",
        ],
    ));
    ok(&mass(&l, &["resume", "b", "--quiet"]));
    let before = ok(&mass(&l, &["refs", "--json"]));
    let o = mass(
        &l,
        &[
            "fork", "b", "--cycle", "1", "--stage", "collect", "--name", "c",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("comes before b was forked"), "{err}");
    assert_eq!(ok(&mass(&l, &["refs", "--json"])), before);
    ok(&mass(
        &l,
        &[
            "fork", "b", "--cycle", "1", "--stage", "rank", "--name", "c",
        ],
    ));
    ok(&mass(&l, &["resume", "c", "--quiet"]));
    let train = |run: &str| -> Vec<Value> {
        payloads(&l, run, "mass.selection")
            .into_iter()
            .map(|p| p["train"].clone())
            .collect()
    };
    // c keeps b's setting: one training run per task.
    assert_eq!(train("c"), train("b"));
}

/// Found by review: the search of the cycle after a finished run's last one
/// was refused; it starts after that cycle's record.
#[test]
fn the_next_cycles_search_of_a_finished_run_can_be_forked() {
    let (_d, l) = smoke_run();
    ok(&mass(
        &l,
        &[
            "fork", "smoke", "--cycle", "2", "--stage", "search", "--name", "two", "--set",
            "cycles=2",
        ],
    ));
    let fork = main_stream(&l, "two");
    assert_eq!(fork[fork.len() - 2]["kind"], "mass.cycle");
    ok(&mass(&l, &["resume", "two", "--quiet"]));
    let v: Value = serde_json::from_str(&ok(&mass(&l, &["status", "two", "--json"]))).unwrap();
    assert_eq!(v[0]["cycles_done"], 2, "{v}");
    let o = mass(
        &l,
        &[
            "fork", "smoke", "--cycle", "2", "--stage", "judge", "--name", "x",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
}
