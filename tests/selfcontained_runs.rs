//! Runs are self-contained: the bugs were that `mass replay --check`, `mass
//! resume` and `mass rejudge` failed outside the directory a run was started
//! from ("cannot read examples/tasks"), that `--check` re-read task files from
//! disk (an edited prompt made it diverge), and that the experiment path was
//! hashed (`examples/smoke.toml`, `./examples/smoke.toml` and an absolute path
//! gave three heads). A run now records its task suite by content and every
//! later session reads it from the ledger.
//!
//! The experiments are copies of examples/smoke.toml (with its tasks beside
//! it, so `tasks_dir = "tasks"` is relative as in the example) under several
//! seeds, in temporary directories the tests can move, edit and delete.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SEEDS: [u64; 2] = [3, 8];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn mass(cwd: &Path, ledger: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mass"))
        .current_dir(cwd)
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .env_remove("MASS_LEDGER")
        .output()
        .expect("run mass")
}

fn ok(cwd: &Path, ledger: &Path, args: &[&str]) -> String {
    let o = mass(cwd, ledger, args);
    assert!(
        o.status.success(),
        "mass {args:?} in {} failed: {}",
        cwd.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8 output")
}

fn head(ledger: &Path, run: &str) -> String {
    let out = ok(&repo(), ledger, &["refs", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("refs json");
    v.as_array()
        .expect("array")
        .iter()
        .find(|r| r["name"] == run)
        .and_then(|r| r["head"].as_str())
        .unwrap_or_else(|| panic!("no ref {run}"))
        .to_string()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for ent in std::fs::read_dir(from).expect("read_dir") {
        let ent = ent.expect("entry");
        let dest = to.join(ent.file_name());
        if ent.file_type().expect("file type").is_dir() {
            copy_dir(&ent.path(), &dest);
        } else {
            std::fs::copy(ent.path(), &dest).expect("copy");
        }
    }
}

/// `root/exp/smoke.toml` (examples/smoke.toml with `seed`) and
/// `root/exp/tasks` (a copy of examples/tasks).
fn experiment(root: &Path, seed: u64) {
    let text = std::fs::read_to_string(repo().join("examples/smoke.toml")).expect("smoke.toml");
    assert!(
        text.contains("\nseed = 8\n"),
        "smoke.toml's seed line moved"
    );
    let exp = root.join("exp");
    copy_dir(&repo().join("examples/tasks"), &exp.join("tasks"));
    std::fs::write(
        exp.join("smoke.toml"),
        text.replace("\nseed = 8\n", &format!("\nseed = {seed}\n")),
    )
    .expect("write toml");
}

/// The main-stream step after the first inner-loop iteration (a fork point
/// with live work after it).
fn inner_step(cwd: &Path, ledger: &Path, run: &str) -> String {
    let out = ok(cwd, ledger, &["log", run, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("log json");
    v.as_array()
        .expect("array")
        .iter()
        .find(|e| {
            e["payload"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("inner iteration 1 done"))
        })
        .and_then(|e| e["id"].as_str())
        .expect("an inner-iteration step")
        .to_string()
}

/// Everything a recorded run supports, from `cwd`: replay check, resume (of
/// the finished run: it replays to the same head), re-judging (live judge
/// calls, which need the judge's view of the tasks), and a fork resumed live
/// (workspaces, tools, checks and the reference solver all need task files).
fn exercise(cwd: &Path, ledger: &Path) {
    let want = head(ledger, "smoke");
    let out = ok(cwd, ledger, &["replay", "smoke", "--check"]);
    assert!(out.contains("replay check passed"), "{out}");
    ok(cwd, ledger, &["resume", "smoke", "--quiet"]);
    assert_eq!(head(ledger, "smoke"), want, "resuming a finished run");

    let out = ok(
        cwd,
        ledger,
        &[
            "rejudge",
            "smoke",
            "--name",
            "rejudged",
            "--set",
            "backends.sim.sim.blind_spot=0",
            "--quiet",
        ],
    );
    let live_judge = out
        .lines()
        .find(|l| l.starts_with("effects:"))
        .and_then(|l| l.split("judge: ").nth(1))
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(live_judge > 0, "the judge ran live: {out}");
    ok(cwd, ledger, &["replay", "rejudged", "--check"]);

    let at = inner_step(cwd, ledger, "smoke");
    ok(
        cwd,
        ledger,
        &[
            "fork",
            &at,
            "--name",
            "strict",
            "--set",
            "outer.train_ranks=2",
        ],
    );
    let out = ok(cwd, ledger, &["resume", "strict", "--quiet"]);
    assert!(
        out.contains("model: ") && !out.contains("model: 0 live"),
        "the fork ran models live: {out}"
    );
    ok(cwd, ledger, &["replay", "strict", "--check"]);
    ok(cwd, ledger, &["verify"]);
}

#[test]
fn replay_resume_and_rejudge_work_from_another_working_directory() {
    for seed in SEEDS {
        let d = tempfile::tempdir().expect("tempdir");
        experiment(d.path(), seed);
        let ledger = d.path().join("ledger");
        // Started with a relative path, as `mass run examples/smoke.toml` is.
        ok(d.path(), &ledger, &["run", "exp/smoke.toml", "--quiet"]);
        let elsewhere = tempfile::tempdir().expect("tempdir");
        exercise(elsewhere.path(), &ledger);
    }
    // The shipped example from the repository root, checked from elsewhere.
    let d = tempfile::tempdir().expect("tempdir");
    let ledger = d.path().join("ledger");
    ok(&repo(), &ledger, &["run", "examples/smoke.toml", "--quiet"]);
    let out = ok(d.path(), &ledger, &["replay", "smoke", "--check"]);
    assert!(out.contains("replay check passed"), "{out}");
}

#[test]
fn a_copied_ledger_replays_without_the_task_folders() {
    for seed in SEEDS {
        let d = tempfile::tempdir().expect("tempdir");
        experiment(d.path(), seed);
        let ledger = d.path().join("ledger");
        ok(d.path(), &ledger, &["run", "exp/smoke.toml", "--quiet"]);
        let want = head(&ledger, "smoke");

        // "Another machine": the ledger copied, the experiment and its tasks gone.
        let other = tempfile::tempdir().expect("tempdir");
        let copy = other.path().join("ledger");
        copy_dir(&ledger, &copy);
        drop(d);
        let cwd = other.path().join("work");
        std::fs::create_dir_all(&cwd).expect("mkdir");
        assert_eq!(head(&copy, "smoke"), want);
        exercise(&cwd, &copy);
    }
}

#[test]
fn the_path_spelling_of_the_experiment_does_not_change_the_head() {
    for seed in SEEDS {
        let d = tempfile::tempdir().expect("tempdir");
        experiment(d.path(), seed);
        let abs = d.path().join("exp/smoke.toml");
        let abs = abs.to_str().expect("utf-8 temp path");
        let mut heads = Vec::new();
        for (i, (cwd, spelling)) in [
            (d.path().to_path_buf(), "exp/smoke.toml"),
            (d.path().to_path_buf(), "./exp/smoke.toml"),
            (repo(), abs),
            (d.path().join("exp"), "smoke.toml"),
        ]
        .iter()
        .enumerate()
        {
            let ledger = d.path().join(format!("ledger-{i}"));
            ok(cwd, &ledger, &["run", spelling, "--quiet"]);
            heads.push((spelling.to_string(), head(&ledger, "smoke")));
        }
        assert!(
            heads.windows(2).all(|w| w[0].1 == w[1].1),
            "seed {seed}: {heads:?}"
        );
        if seed == 8 {
            // The shipped file (same text, same tasks, another place) too.
            let ledger = d.path().join("ledger-shipped");
            ok(&repo(), &ledger, &["run", "examples/smoke.toml", "--quiet"]);
            assert_eq!(head(&ledger, "smoke"), heads[0].1);
        }
    }
}

#[test]
fn editing_a_task_after_the_run_does_not_change_its_replay() {
    for seed in SEEDS {
        let d = tempfile::tempdir().expect("tempdir");
        experiment(d.path(), seed);
        let ledger = d.path().join("ledger");
        ok(d.path(), &ledger, &["run", "exp/smoke.toml", "--quiet"]);
        let want = head(&ledger, "smoke");

        let task = d.path().join("exp/tasks/fin-momentum-backtest");
        let prompt = std::fs::read_to_string(task.join("prompt.md")).expect("prompt");
        std::fs::write(
            task.join("prompt.md"),
            format!("{prompt}\nAlso report the Sortino ratio.\n"),
        )
        .expect("edit prompt");
        let out = ok(d.path(), &ledger, &["replay", "smoke", "--check"]);
        assert!(out.contains("replay check passed"), "{out}");
        // `mass run` of an existing run resumes it with what it recorded.
        ok(d.path(), &ledger, &["run", "exp/smoke.toml", "--quiet"]);
        assert_eq!(head(&ledger, "smoke"), want);

        // A new run records the edited prompt: its ids differ.
        ok(
            d.path(),
            &ledger,
            &["run", "exp/smoke.toml", "--ref", "edited", "--quiet"],
        );
        assert_ne!(head(&ledger, "edited"), want, "seed {seed}");
        ok(d.path(), &ledger, &["replay", "edited", "--check"]);
    }
}

#[test]
fn a_fork_cannot_point_a_run_at_other_task_files() {
    let d = tempfile::tempdir().expect("tempdir");
    let ledger = d.path().join("ledger");
    ok(&repo(), &ledger, &["run", "examples/smoke.toml", "--quiet"]);
    let o = mass(
        d.path(),
        &ledger,
        &[
            "rejudge",
            "smoke",
            "--name",
            "x",
            "--set",
            "tasks_dir=/elsewhere",
        ],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tasks_dir cannot be overridden"), "{err}");
    assert!(
        !ok(d.path(), &ledger, &["refs"]).contains("x "),
        "no fork was created"
    );
}

/// A run recorded by the previous driver (`run.started` v1: a path, no tasks)
/// cannot be driven any more: replay, resume, rejudge and fork say so (and
/// create no fork), while status, show and verify still read it.
#[test]
fn a_run_without_recorded_tasks_is_refused_clearly() {
    let d = tempfile::tempdir().expect("tempdir");
    let ledger = d.path().join("ledger");
    let first = {
        let l = ledger::Ledger::init(&ledger).expect("init");
        let text = std::fs::read_to_string(repo().join("examples/smoke.toml")).expect("toml");
        let config = l.put_blob(text.as_bytes()).expect("blob");
        let old = schemas::RunStartedV1 {
            driver: "mass-engine/1".into(),
            config: config.into(),
            config_name: "examples/smoke.toml".into(),
            seed: 3,
        };
        let ev = schemas::to_event(&old).expect("event").in_stream("main");
        l.append("old", None, ev).expect("append").to_hex()
    };
    let cwd = d.path();
    for args in [
        vec!["replay", "old", "--check"],
        vec!["resume", "old"],
        vec!["rejudge", "old", "--name", "x"],
        vec!["fork", first.as_str(), "--name", "y"],
    ] {
        let o = mass(cwd, &ledger, &args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("recorded by an older mass (run.started v1)")
                && err.contains("start the experiment again as a new run"),
            "{args:?}: {err}"
        );
    }
    let refs = ok(cwd, &ledger, &["refs", "--json"]);
    assert!(!refs.contains("\"x\"") && !refs.contains("\"y\""), "{refs}");
    let status = ok(cwd, &ledger, &["status"]);
    assert!(status.starts_with("old: smoke — 0/1 cycles"), "{status}");
    ok(cwd, &ledger, &["show", &first]);
    ok(cwd, &ledger, &["verify"]);
}
