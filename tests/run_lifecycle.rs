//! Run names and lineage. The bugs (issue 8): a run whose start failed after
//! recording its definition (an unsupported backend) stayed "0/N in progress"
//! forever and `mass run` with the corrected file resumed the broken recorded
//! definition; no command removed a run's refs; and forking at an event shared
//! by several runs (a run and its fork) recorded the alphabetically first run
//! as the parent. The experiments are examples/smoke.toml with an absolute
//! `tasks_dir`, written into temporary directories.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn mass(ledger: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mass"))
        .current_dir(repo())
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .env_remove("MASS_LEDGER")
        .output()
        .expect("run mass")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(ledger: &Path, args: &[&str]) -> Output {
    let o = mass(ledger, args);
    assert!(
        o.status.success(),
        "mass {args:?} failed: {}",
        text(&o.stderr)
    );
    o
}

fn refs(ledger: &Path) -> Vec<(String, String)> {
    let o = ok(ledger, &["refs", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("refs json");
    v.as_array()
        .expect("array")
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_string(),
                r["head"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn head(ledger: &Path, run: &str) -> String {
    refs(ledger)
        .into_iter()
        .find(|(n, _)| n == run)
        .map(|(_, h)| h)
        .unwrap_or_else(|| panic!("no ref {run}"))
}

/// examples/smoke.toml with an absolute tasks_dir, edited by `edit`.
fn experiment(dir: &Path, file: &str, edit: impl Fn(String) -> String) -> String {
    let tasks = repo().join("examples/tasks");
    let s = std::fs::read_to_string(repo().join("examples/smoke.toml")).expect("smoke.toml");
    let s = s.replace(
        "tasks_dir = \"tasks\"",
        &format!("tasks_dir = {:?}", tasks.to_string_lossy()),
    );
    let path = dir.join(file);
    std::fs::write(&path, edit(s)).expect("write experiment");
    path.to_string_lossy().into_owned()
}

fn status_json(ledger: &Path) -> serde_json::Value {
    let o = ok(ledger, &["status", "--json"]);
    serde_json::from_slice(&o.stdout).expect("status json")
}

#[test]
fn a_run_whose_start_failed_can_be_rerun_with_a_fixed_file() {
    let d = tempfile::tempdir().expect("tempdir");
    let ledger = d.path().join("ledger");

    // A misspelt task is caught against the files before anything is
    // recorded: the name stays free.
    let unknown = experiment(d.path(), "unknown.toml", |s| {
        s.replace("\"pha-hill-fit\"", "\"no-such-task\"")
    });
    let o = mass(&ledger, &["run", &unknown, "--quiet"]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("no-such-task"),
        "{}",
        text(&o.stderr)
    );
    assert!(refs(&ledger).is_empty(), "{:?}", refs(&ledger));

    // A backend that cannot be built (its API key variable is not set)
    // fails after run.started is recorded: that is the poisoned name.
    let broken = experiment(d.path(), "broken.toml", |s| {
        s.replace(
            "[backends.sim]\nkind = \"sim\"",
            "[backends.sim]\nkind = \"sim\"\n\n[backends.remote]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\napi_key_env = \"MASS_TEST_KEY_NEVER_SET\"",
        )
    });
    let o = mass(&ledger, &["run", &broken, "--quiet"]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("MASS_TEST_KEY_NEVER_SET"),
        "{}",
        text(&o.stderr)
    );
    let old = head(&ledger, "smoke");
    let st = status_json(&ledger);
    assert_eq!(st[0]["finished"], false);
    assert_eq!(st[0]["never_started"], true);
    assert_eq!(st[0]["last_step"], "started");
    let text_status = text(&ok(&ledger, &["status"]).stdout);
    assert!(text_status.contains("never started"), "{text_status}");

    // The corrected file replaces it, saying so with the old head.
    let fixed = experiment(d.path(), "fixed.toml", |s| s);
    let o = ok(&ledger, &["run", &fixed, "--quiet"]);
    let err = text(&o.stderr);
    assert!(
        err.contains("never started") && err.contains("replaced") && err.contains(&old),
        "{err}"
    );
    let new = head(&ledger, "smoke");
    assert_ne!(new, old);
    let st = status_json(&ledger);
    assert_eq!(st.as_array().map(Vec::len), Some(1), "{st}");
    assert_eq!(st[0]["finished"], true, "{st}");
    assert_eq!(st[0]["never_started"], false, "{st}");
    // The old start is still readable, the replacement is on record.
    ok(&ledger, &["show", &old]);
    let log = text(&ok(&ledger, &["log", "mass/runs", "--json"]).stdout);
    assert!(
        log.contains("run.removed") && log.contains("replaced: start failed") && log.contains(&old),
        "{log}"
    );
    ok(&ledger, &["verify"]);

    // A run that did start is never replaced: it resumes (here: replays to
    // its finished head) with its recorded definition.
    let o = ok(&ledger, &["run", &broken, "--quiet"]);
    assert!(text(&o.stderr).contains("resuming"), "{}", text(&o.stderr));
    assert_eq!(head(&ledger, "smoke"), new);
}

#[test]
fn runs_rm_removes_refs_but_keeps_objects() {
    let d = tempfile::tempdir().expect("tempdir");
    let ledger = d.path().join("ledger");
    let exp = experiment(d.path(), "smoke.toml", |s| s);
    ok(&ledger, &["run", &exp, "--quiet"]);
    let before = refs(&ledger);
    let main = head(&ledger, "smoke");
    let stream = before
        .iter()
        .find(|(n, _)| n.starts_with("smoke/"))
        .map(|(_, h)| h.clone())
        .expect("a stream ref under smoke/");
    assert!(before.len() > 10, "{before:?}");

    let o = ok(&ledger, &["runs", "rm", "smoke"]);
    assert!(text(&o.stdout).contains(&main), "{}", text(&o.stdout));
    // Only the removal stream is left; every object is still there.
    let after = refs(&ledger);
    assert_eq!(
        after.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        vec!["mass/runs"]
    );
    ok(&ledger, &["show", &main]);
    ok(&ledger, &["show", &stream]);
    assert!(ok(&ledger, &["log", &main]).stdout.len() > 100);
    let v = ok(&ledger, &["verify"]);
    assert!(text(&v.stdout).starts_with("ok"), "{}", text(&v.stdout));
    let st = text(&ok(&ledger, &["status"]).stdout);
    assert!(st.contains("no runs yet"), "{st}");

    // The removal is an event naming the run and every old head.
    let log = ok(&ledger, &["log", "mass/runs", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&log.stdout).expect("log json");
    let ev = &v[0];
    assert_eq!(ev["kind"], "run.removed");
    assert_eq!(ev["payload"]["run"], "smoke");
    assert_eq!(ev["payload"]["reason"], "removed");
    let removed = ev["payload"]["refs"].as_array().expect("refs");
    assert_eq!(removed.len(), before.len());
    for (name, h) in &before {
        assert!(
            removed
                .iter()
                .any(|r| r["name"] == *name && r["head"] == *h),
            "{name} {h} missing from the record"
        );
    }

    // Removing again: not found; the removal stream itself is never removed.
    assert_eq!(
        mass(&ledger, &["runs", "rm", "smoke"]).status.code(),
        Some(4)
    );
    assert_eq!(
        mass(&ledger, &["runs", "rm", "mass/runs"]).status.code(),
        Some(2)
    );
    // The name is free again: the same experiment records the same ids.
    ok(&ledger, &["run", &exp, "--quiet"]);
    assert_eq!(head(&ledger, "smoke"), main);
    ok(&ledger, &["verify"]);
}

#[test]
fn fork_lineage_records_the_run_asked_from() {
    let d = tempfile::tempdir().expect("tempdir");
    let ledger = d.path().join("ledger");
    let exp = experiment(d.path(), "smoke.toml", |s| s);
    ok(&ledger, &["run", &exp, "--quiet", "--ref", "a"]);
    // Main-stream steps of run a, oldest first.
    let log = ok(&ledger, &["log", "a", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&log.stdout).expect("log json");
    let mut steps: Vec<String> = v
        .as_array()
        .expect("array")
        .iter()
        .map(|e| e["id"].as_str().unwrap_or_default().to_string())
        .collect();
    steps.reverse();
    assert!(steps.len() > 5, "{steps:?}");

    // b forks a at step 4: steps 0-4 are now on both runs' main streams.
    ok(&ledger, &["fork", &steps[4], "--name", "b"]);
    let shared = &steps[2];
    // Without saying which run, the fork is refused, naming both.
    let o = mass(&ledger, &["fork", shared, "--name", "c"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains("a, b") && err.contains("--from"), "{err}");
    assert!(!refs(&ledger).iter().any(|(n, _)| n == "c"));
    // A run whose main stream does not hold the event is refused.
    let o = mass(&ledger, &["fork", &steps[5], "--name", "c", "--from", "b"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let o = mass(&ledger, &["fork", shared, "--name", "c", "--from", "nope"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));

    // Asked from b: b is the parent, although a sorts first.
    let o = ok(&ledger, &["fork", shared, "--name", "c", "--from", "b"]);
    assert!(
        text(&o.stdout).contains("forked run b"),
        "{}",
        text(&o.stdout)
    );
    let st = status_json(&ledger);
    let c = st
        .as_array()
        .expect("array")
        .iter()
        .find(|r| r["run"] == "c")
        .expect("run c");
    let want = format!("b at {}", &shared[..12]);
    assert_eq!(c["forked_from"], want.as_str(), "{st}");
    let fork_ev = ok(&ledger, &["show", "c", "--json"]);
    let f: serde_json::Value = serde_json::from_slice(&fork_ev.stdout).expect("show json");
    assert_eq!(f["kind"], "run.forked", "{f}");
    assert_eq!(f["payload"]["source_run"], "b", "{f}");

    // A taken name is a conflict (exit 5), nothing written.
    let o = mass(&ledger, &["fork", shared, "--name", "b", "--from", "a"]);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o.stderr));

    // Asked from a: a. And an event only one run holds needs no --from.
    ok(&ledger, &["fork", shared, "--name", "d", "--from", "a"]);
    ok(&ledger, &["fork", &steps[5], "--name", "e"]);
    let st = status_json(&ledger);
    for (run, parent, at) in [("d", "a", shared), ("e", "a", &steps[5])] {
        let r = st
            .as_array()
            .expect("array")
            .iter()
            .find(|r| r["run"] == run)
            .expect("run");
        assert_eq!(r["forked_from"], format!("{parent} at {}", &at[..12]));
    }
    // The fork taken from b continues like any fork.
    ok(&ledger, &["resume", "c", "--quiet"]);
}

/// The run summary explains each column and says who judged the held-out
/// figures: an external judge by name, or the run's own judge, flagged as
/// not independent (before, a smoke run's self-judged win rate read like an
/// independent one). Holds for every seed: a cycle is either "not
/// evaluated" or has its judge line.
#[test]
fn the_summary_explains_its_columns_and_who_judged_the_held_out_runs() {
    let mut judged = [0, 0];
    for (seed, external) in (1..=8).flat_map(|s| [(s, false), (s, true)]) {
        let d = tempfile::tempdir().expect("tempdir");
        let ledger = d.path().join("ledger");
        let exp = experiment(d.path(), "smoke.toml", |s| {
            let s = s.replace("seed = 8", &format!("seed = {seed}"));
            if external {
                s.replace(
                    "[roles]\n",
                    "[backends.ext]\nkind = \"sim\"\n\n[roles]\nexternal_judges = [\"ext\"]\n",
                )
            } else {
                s
            }
        });
        let o = ok(&ledger, &["run", &exp]);
        let out = text(&o.stdout);
        for column in [
            "inner wins:",
            "selected:",
            "tampered:",
            "tampering:",
            "sup.tokens:",
            "delegation:",
            "held-out:",
            "model:",
        ] {
            assert!(
                out.lines().any(|l| l.trim_start().starts_with(column)),
                "seed {seed}: no legend line for {column}\n{out}"
            );
        }
        let evaluated = !out.contains("not evaluated");
        judged[external as usize] += evaluated as u32;
        let judge_line = out
            .lines()
            .find(|l| l.contains("cycle 1: held-out vs base, "));
        let self_only = out.contains("cycle 1: no external judge is configured");
        // `mass status --json` carries the same figures, read back from the
        // records: the tampering counts and the headline held-out figure.
        let st: serde_json::Value =
            serde_json::from_slice(&ok(&ledger, &["status", "smoke", "--json"]).stdout)
                .expect("status json");
        let c1 = &st[0]["cycles"][0];
        assert_eq!(c1["cycle"], 1, "seed {seed}: {st}");
        assert!(
            c1["tampered_in_training"].is_u64() && c1["tampering_rate"].is_f64(),
            "{c1}"
        );
        if let Some(e) = c1["evaluations"].as_array().and_then(|e| e.first()) {
            // The headline is over judgments (W/(W+L), ties excluded).
            let shown = format!(
                "{}-{} [{}] judgments",
                e["judgment_wins"], e["judgment_losses"], e["judgment_ties"]
            );
            let row = out
                .lines()
                .find(|l| l.trim_start().starts_with("1 "))
                .expect("row");
            assert!(row.contains(&shown), "seed {seed}: {row} vs {shown}");
            assert_eq!(e["self_judge"], !external, "seed {seed}: {e}");
        }
        match (evaluated, external) {
            (false, _) => assert!(judge_line.is_none(), "seed {seed}\n{out}"),
            (true, true) => {
                let l = judge_line.expect("judge line");
                assert!(
                    l.contains("judged by ext (") && !self_only,
                    "seed {seed}: {l}"
                );
            }
            (true, false) => {
                let l = judge_line.expect("judge line");
                assert!(
                    l.contains("judged by sim (sim/c1-") && l.contains(", self)") && self_only,
                    "seed {seed}: {l}\n{out}"
                );
            }
        }
    }
    // Both wordings were seen (several of the 8 seeds collect data with either judge).
    assert!(judged[0] > 0 && judged[1] > 0, "{judged:?}");
}

/// Regressions: with stderr not a terminal, a run printed no progress at
/// all (the bars hid themselves); and running a finished run again, which
/// replays it from the ledger, claimed "1 cycle(s) in 0s" as if it had run.
#[test]
fn progress_is_plain_lines_off_a_terminal_and_a_replay_says_it_replayed() {
    let d = tempfile::tempdir().expect("tempdir");
    let ledger = d.path().join("ledger");
    let exp = experiment(d.path(), "smoke.toml", |s| s);
    let o = ok(&ledger, &["run", &exp]);
    let err = text(&o.stderr);
    for stage in ["reference runs", "collection", "judging"] {
        assert!(
            err.lines()
                .any(|l| l.contains(stage) && l.contains(": done, ")),
            "no progress line for {stage}:\n{err}"
        );
    }
    assert!(!text(&o.stdout).contains("replayed from the ledger"));
    let o = ok(&ledger, &["run", &exp, "--quiet"]);
    assert!(
        !text(&o.stderr).contains(": done, "),
        "--quiet printed progress"
    );
    let out = text(&o.stdout);
    assert!(
        out.contains("cycle(s) replayed from the ledger in") && out.contains("nothing ran live"),
        "{out}"
    );
}
