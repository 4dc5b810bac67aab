//! Fork and re-judge overrides are checked against the run's recorded
//! experiment when the fork is made, with the TOML's own messages: a bad key,
//! type or value exits 2 and writes nothing (before: accepted with exit 0,
//! failing only at resume, and `cycles`/`seed` were silently ignored).

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

fn refs(l: &Path) -> String {
    String::from_utf8(mass(l, &["refs", "--json"]).stdout).unwrap()
}

/// A ledger in a fresh directory holding the finished smoke run.
fn smoke_run() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("ledger");
    let o = mass(&l, &["run", "examples/smoke.toml", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (d, l)
}

#[test]
fn fork_overrides_are_validated_before_anything_is_written() {
    let (_d, l) = smoke_run();
    let before = refs(&l);
    for bad in [
        "no_such_key=1",
        "cycles=three",
        "outer.train_ranks=-1",
        "tasks_dir=elsewhere",
    ] {
        for cmd in [
            &["fork", "smoke", "--name", "f", "--set", bad][..],
            &["rejudge", "smoke", "--name", "r", "--set", bad],
        ] {
            let o = mass(&l, cmd);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "mass {cmd:?}: {err}");
            assert!(err.contains("nothing was written"), "mass {cmd:?}: {err}");
            assert_eq!(refs(&l), before, "mass {cmd:?} wrote a ref");
        }
    }
    // A valid override is accepted and honoured: the fork at the finished
    // head runs a second cycle, and its replay check passes.
    let o = mass(
        &l,
        &["fork", "smoke", "--name", "longer", "--set", "cycles=2"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = mass(&l, &["resume", "longer", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = mass(&l, &["status", "longer", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["cycles_done"], 2, "{v}");
    let o = mass(&l, &["replay", "longer", "--check"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Regression (named after the bug): `mass fork RUN --name RUN/x` and
/// `mass run --ref RUN/x` made a run whose refs sat among RUN's streams, so
/// `mass runs rm RUN` removed it too, and `mass runs` did not list it. A
/// new run's name with '/' is refused (exit 2, nothing written), however
/// it is named: `--name`, `--ref`, or an experiment's own `name`. (A plain
/// ref may still be hierarchical: `experiments/alt` in tests/cli.rs.)
#[test]
fn regression_a_run_named_under_another_runs_streams_is_refused() {
    let (d, l) = smoke_run();
    let before = refs(&l);
    let exp = d.path().join("nested.toml");
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/smoke.toml"))
            .unwrap();
    assert!(text.contains("name = \"smoke\""), "{text}");
    std::fs::write(
        &exp,
        text.replace("name = \"smoke\"", "name = \"smoke/nested\""),
    )
    .unwrap();
    let exp = exp.to_string_lossy().into_owned();
    for cmd in [
        &["fork", "smoke", "--name", "smoke/x"][..],
        &["run", "examples/smoke.toml", "--ref", "smoke/x", "--quiet"],
        &["run", &exp, "--quiet"],
    ] {
        let o = mass(&l, cmd);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "mass {cmd:?}: {err}");
        assert!(err.contains("may not hold '/'"), "mass {cmd:?}: {err}");
        assert!(err.contains("nothing was written"), "mass {cmd:?}: {err}");
        assert_eq!(refs(&l), before, "mass {cmd:?} wrote a ref");
    }
    // A step no run holds any more (its run removed) forks as a plain ref,
    // but a ref at a main-stream step is a run: named as one.
    let o = mass(&l, &["fork", "smoke", "--name", "gone"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = String::from_utf8_lossy(&o.stdout).into_owned();
    let step = said
        .split("(fork event ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("no fork event in {said:?}"))
        .to_string();
    let o = mass(&l, &["runs", "rm", "gone"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let before = refs(&l);
    let o = mass(&l, &["fork", &step, "--name", "smoke/orphan"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(refs(&l), before, "a ref was written");
    // A fresh ledger is not even made for such a run.
    let fresh = d.path().join("fresh");
    let o = mass(
        &fresh,
        &["run", "examples/smoke.toml", "--ref", "a/b", "--quiet"],
    );
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!fresh.exists(), "a ledger was made for a refused run");
}

/// Regression (#25, item 7): overrides were applied and validated one at a
/// time, so `--set roles.judge=j2 --set backends.j2.kind=sim` was refused
/// ("unknown backend j2") while the same two flags the other way round were
/// accepted. A set is applied whole and validated once: both orders give
/// the same fork, and a key given twice is refused, whatever the order.
#[test]
fn override_validation_does_not_depend_on_the_order_of_the_flags() {
    let (_d, l) = smoke_run();
    let (role, backend) = ("roles.judge=j2", "backends.j2.kind=sim");
    for (name, first, second) in [("a", role, backend), ("b", backend, role)] {
        let o = mass(
            &l,
            &[
                "fork", "smoke", "--name", name, "--set", first, "--set", second,
            ],
        );
        assert!(
            o.status.success(),
            "--set {first} --set {second}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let before = refs(&l);
    for (first, second) in [("cycles=2", "cycles=3"), ("cycles=3", "cycles=2")] {
        let o = mass(
            &l,
            &[
                "fork", "smoke", "--name", "twice", "--set", first, "--set", second,
            ],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("given twice"), "{err}");
        assert_eq!(refs(&l), before);
    }
    // Regression (#25, item 4): a fork inside a rollout with `seed=9` was
    // accepted and then diverged on resume; a unit keeps the settings it
    // started with, so a fork point inside one takes no overrides.
    let v: serde_json::Value = serde_json::from_str(&refs(&l)).unwrap();
    let inside = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"].as_str().unwrap().starts_with("smoke/"))
        .map(|r| r["head"].as_str().unwrap().to_string())
        .expect("a stream of a unit of work");
    for set in ["seed=9", "sampling.team.temperature=0.3"] {
        let o = mass(
            &l,
            &[
                "fork", &inside, "--from", "smoke", "--name", "in", "--set", set,
            ],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("inside a unit of work"), "{err}");
        assert_eq!(refs(&l), before);
    }
    // A re-judge serves the source's tool results: settings they ran under
    // are refused there (a fork takes them).
    for key in ["limits.tool_output_bytes=64", "sandbox.level=landlock"] {
        let o = mass(&l, &["rejudge", "smoke", "--name", "rj", "--set", key]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("fork instead"), "{err}");
        assert_eq!(refs(&l), before);
    }
}

/// Before: a backend override at a fork point after the run's start was
/// refused ("backends are built when a run starts"), so a fork could not go
/// on with a changed or added model. Now a changed backend is built again at
/// the fork point (adapters trained on it registered again: cycle 2 plays the
/// cycle-1 model) and an added one plays the role handed to it: the fork's
/// cycle-2 optimizer requests name the new backend's model. `status` shows
/// the plan the fork set.
#[test]
fn backend_override_after_the_start_is_honoured_from_the_fork_point() {
    let (d, l) = smoke_run();
    let sets = [
        "cycles=2",
        "backends.sim.sim.skill=0.3",
        "backends.other.kind=sim",
        "roles.optimizer=other",
    ];
    let mut args = vec!["fork", "smoke", "--name", "f"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = mass(&l, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = mass(&l, &["resume", "f", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = mass(&l, &["replay", "f", "--check"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st: serde_json::Value =
        serde_json::from_slice(&mass(&l, &["status", "f", "--json"]).stdout).unwrap();
    assert_eq!(st[0]["cycles_done"], 2, "{st}");
    assert_eq!(st[0]["cycles_planned"], 2, "{st}");

    let out = d.path().join("f.jsonl");
    let o = mass(&l, &["export", "events", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut asked_other = 0;
    for line in std::fs::read_to_string(&out).unwrap().lines() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        if e["kind"] != "effect" || e["payload"]["effect"] != "optimizer" {
            continue;
        }
        let req = e["payload"]["request"].as_str().unwrap();
        let body = mass(&l, &["cat", req]).stdout;
        if String::from_utf8_lossy(&body).contains("other/base") {
            asked_other += 1;
        }
    }
    assert!(
        asked_other > 0,
        "no optimizer request went to the added backend"
    );
}

/// `mass rejudge --judge FILE.toml`: a judge defined in a file of its own is
/// added to the re-judge by value (no path is recorded), judges the cycle
/// live, and the re-judge replays; a file that redefines a backend the run
/// already has (which other roles play) is refused with nothing written.
#[test]
fn rejudge_with_a_judge_defined_in_a_file() {
    let (d, l) = smoke_run();
    let before = refs(&l);
    let clash = d.path().join("clash.toml");
    std::fs::write(
        &clash,
        "[backends.sim]\nkind = \"sim\"\n[backends.sim.sim]\nskill = 0.9\n",
    )
    .unwrap();
    let two = d.path().join("two.toml");
    std::fs::write(
        &two,
        "[backends.a]\nkind = \"sim\"\n[backends.b]\nkind = \"sim\"\n",
    )
    .unwrap();
    for bad in [&clash, &two, &d.path().join("missing.toml")] {
        let o = mass(
            &l,
            &[
                "rejudge",
                "smoke",
                "--name",
                "r",
                "--cycle",
                "1",
                "--judge",
                bad.to_str().unwrap(),
            ],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.contains("nothing was written"), "{err}");
        assert_eq!(refs(&l), before, "{bad:?} wrote a ref");
    }
    let file = d.path().join("strong.toml");
    std::fs::write(
        &file,
        "[backends.strong]\nkind = \"sim\"\n[backends.strong.sim]\nskill = 0.95\njudge_noise = 0.0\n",
    )
    .unwrap();
    let o = mass(
        &l,
        &[
            "rejudge",
            "smoke",
            "--name",
            "strong",
            "--cycle",
            "1",
            "--judge",
            file.to_str().unwrap(),
            "--quiet",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("verdict agreement with smoke's judge"),
        "{out}"
    );
    // The definition travels with the run: the file may go away.
    std::fs::remove_file(&file).unwrap();
    let o = mass(&l, &["replay", "strong", "--check"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = d.path().join("events.jsonl");
    let o = mass(&l, &["export", "events", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let all = std::fs::read_to_string(&out).unwrap();
    assert!(
        all.contains("backends.strong"),
        "the fork record lacks the judge's definition"
    );
    assert!(!all.contains("strong.toml"), "a path entered the ledger");
}

/// The request bodies of a run's model-like effects (`model`, `judge`,
/// `optimizer`), with the stream each was made on.
fn requests(l: &Path, run: &str, dir: &Path) -> Vec<(String, String, serde_json::Value)> {
    let out = dir.join(format!("{run}.jsonl"));
    let o = mass(
        l,
        &["export", "events", run, "--out", out.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut v = Vec::new();
    for line in std::fs::read_to_string(&out).unwrap().lines() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        let kind = e["payload"]["effect"].as_str().unwrap_or("");
        if e["kind"] != "effect" || !matches!(kind, "model" | "judge" | "optimizer") {
            continue;
        }
        let body = mass(l, &["cat", e["payload"]["request"].as_str().unwrap()]).stdout;
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        v.push((
            e["stream"].as_str().unwrap().to_string(),
            kind.to_string(),
            body,
        ));
    }
    v
}

/// `mass ARGS`, which must succeed.
fn ok(l: &Path, args: &[&str]) -> Output {
    let o = mass(l, args);
    assert!(
        o.status.success(),
        "mass {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// examples/smoke.toml run into `l`; the id of the first main-stream step
/// whose `mass log` line satisfies `pick`.
fn smoke_step(l: &Path, pick: impl Fn(&str) -> bool) -> String {
    ok(l, &["run", "examples/smoke.toml", "--quiet"]);
    let log = String::from_utf8_lossy(&ok(l, &["log", "smoke"]).stdout).into_owned();
    log.lines()
        .find(|x| pick(x))
        .and_then(|x| x.split_whitespace().next())
        .expect("the step in `mass log`")
        .to_string()
}

/// Forks smoke at `at` as `name` with `sets`, resumes the fork to its end
/// and checks its replay.
fn fork_and_finish(l: &Path, at: &str, name: &str, sets: &[&str]) {
    let mut args = vec!["fork", at, "--from", "smoke", "--name", name];
    for s in sets {
        args.extend(["--set", s]);
    }
    ok(l, &args);
    ok(l, &["resume", name, "--quiet"]);
    ok(l, &["replay", name, "--check"]);
}

/// Regression (#25, item 4): a fork between a cycle's steps recorded its
/// overrides and `mass status` showed them, but collection, training and
/// evaluation read a copy of the experiment frozen at the cycle's start:
/// every later team request still carried temperature 0.7. Now each stage
/// reads the experiment as it stands: a fork after the inner loop changes
/// the collection's sampling, hands judging to another backend and plays
/// it with that backend's model, and the requests made before the fork
/// point keep what they had.
#[test]
fn overrides_taken_mid_cycle_apply_from_the_fork_point() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("ledger");
    // The main stream's 6th step: "cycle 1: inner iteration 3 done", the
    // last before the collection.
    let at = smoke_step(&l, |x| x.trim_end().ends_with("main#5"));
    let shown = String::from_utf8_lossy(&ok(&l, &["show", &at]).stdout).into_owned();
    assert!(shown.contains("inner iteration 3 done"), "{shown}");
    let sets = [
        "sampling.team.temperature=0.3",
        "backends.other.kind=sim",
        "roles.judge=other",
        "outer.runs_per_task=4",
        "outer.train_ranks=3",
        "seed=9",
    ];
    fork_and_finish(&l, &at, "f", &sets);

    let reqs = requests(&l, "f", d.path());
    let temp = |r: &serde_json::Value| r["params"]["temperature"].as_f64();
    let collect: Vec<_> = reqs.iter().filter(|r| r.0.contains("/collect/")).collect();
    assert!(!collect.is_empty());
    for (s, _, r) in &collect {
        assert_eq!(temp(r), Some(0.3), "{s}: {r}");
    }
    let max_index = collect
        .iter()
        .filter_map(|r| r.0.split("/collect/").nth(1)?.get(..2)?.parse::<u32>().ok())
        .max();
    assert_eq!(
        max_index,
        Some(3),
        "outer.runs_per_task=4 collects runs 00-03"
    );
    // The new seed: every collected rollout's first request carries a seed
    // other than the source's.
    let source = requests(&l, "smoke", d.path());
    let first_seed = |reqs: &[(String, String, serde_json::Value)], stream: &str| {
        reqs.iter()
            .find(|r| r.0 == stream)
            .map(|r| r.2["params"]["seed"].clone())
    };
    for (s, _, _) in &collect {
        let (mine, theirs) = (first_seed(&reqs, s), first_seed(&source, s));
        assert!(
            mine.is_some() && mine != theirs,
            "{s}: seed {mine:?}, source {theirs:?}"
        );
    }
    // Before the fork point: the inner loop as recorded.
    let inner: Vec<_> = reqs
        .iter()
        .filter(|r| r.1 == "model" && (r.0.contains("/inner/") || r.0.ends_with("/reference")))
        .collect();
    assert!(
        !inner.is_empty(),
        "no inner-loop requests in the fork's history"
    );
    assert!(inner.iter().all(|r| temp(&r.2) == Some(0.7)));
    // Judging after the fork point: the added backend's model.
    let pairs: Vec<_> = reqs.iter().filter(|r| r.0.contains("/pair/")).collect();
    assert!(!pairs.is_empty());
    for (s, _, r) in &pairs {
        assert_eq!(r["model"], "other/base", "{s}: {r}");
    }
}

/// Regression (attacker review of #25, item 4): evaluation read the roles as
/// they stood after a fork at the training step but the models and backends
/// of the dataset step, so a backend added there was "not configured" and a
/// judge moved there was asked for the old backend's model. The fork's
/// evaluation judges with the added backend's base model.
#[test]
fn a_fork_at_the_training_step_hands_evaluation_to_the_new_judge() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("ledger");
    let at = smoke_step(&l, |x| x.split_whitespace().nth(1) == Some("mass.training"));
    let sets = ["backends.other.kind=sim", "roles.judge=other"];
    fork_and_finish(&l, &at, "t", &sets);
    let reqs = requests(&l, "t", d.path());
    let eval: Vec<_> = reqs
        .iter()
        .filter(|r| r.1 == "judge" && r.0.starts_with("c1/eval/"))
        .collect();
    assert!(!eval.is_empty(), "no evaluation judgments");
    assert!(
        eval.iter().any(|r| r.2["model"] == "other/base"),
        "no evaluation judgment by the new judge: {:?}",
        eval.iter()
            .map(|r| r.2["model"].clone())
            .collect::<Vec<_>>()
    );
}
