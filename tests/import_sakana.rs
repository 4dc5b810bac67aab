//! `mass import sakana` through the binary: a run folder in the reference
//! implementation's formats (`import::fixture`) becomes a run that `mass
//! why` (a rollout, a dataset line), `report` (text, `--json`), `diff`
//! (against a second imported run) and `export tables` read unchanged
//! (`rejudge --cycle`: `tests/rejudge_imported.rs`); exit codes for bad
//! input; a planted key is in no output and no object.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use import::fixture::{self, Spec};

#[path = "common/cli.rs"]
mod cli;
use cli::{mass, ok, text};

const KEY: &str = "sk-planted-CLI-SECRET-abcdef0123456789";

struct Setup {
    _tmp: tempfile::TempDir,
    ledger: PathBuf,
    runs: Vec<PathBuf>,
}

/// Two run folders (the second judged differently) imported as `ref` and
/// `ref2`; the key planted in both when `key`.
fn setup(key: bool) -> (Setup, Vec<String>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ledger = tmp.path().join("ledger");
    let mut runs = Vec::new();
    let mut outputs = Vec::new();
    for (i, name) in ["ref", "ref2"].iter().enumerate() {
        let dir = tmp.path().join(format!("run{i}"));
        let spec = Spec {
            key: key.then(|| KEY.to_string()),
            variant: i as u32,
            ..Spec::default()
        };
        fixture::write_run(&dir, &spec).expect("fixture");
        let o = mass(
            &ledger,
            &["import", "sakana", dir.to_str().unwrap(), "--name", name],
        );
        outputs.push(text(&o));
        ok(o);
        runs.push(dir);
    }
    (
        Setup {
            _tmp: tmp,
            ledger,
            runs,
        },
        outputs,
    )
}

#[test]
fn an_imported_run_answers_why_report_diff_and_tables() {
    let (s, _) = setup(false);
    let l = &s.ledger;
    let again = ok(mass(
        l,
        &[
            "import",
            "sakana",
            s.runs[0].to_str().unwrap(),
            "--name",
            "ref",
        ],
    ));
    assert!(again.contains("already holds this import"), "{again}");
    let rows: serde_json::Value =
        serde_json::from_str(&ok(mass(l, &["runs", "ref", "--json"]))).expect("JSON");
    let rollout = rows
        .as_array()
        .and_then(|r| r.iter().find(|x| x["kind"] == "collection"))
        .and_then(|r| r["event"].as_str())
        .expect("a collected rollout")
        .to_string();
    let why = ok(mass(l, &["why", &rollout]));
    for want in [
        "from the run folder at import, not proven to be the workspace at the episode's end",
        "checks output not recorded",
        "collect run",
        "judge: 2 judgment(s)",
        "rank: rank",
        "select: train",
        "dataset: cycle 1",
        "train: Qwen",
    ] {
        assert!(why.contains(want), "why lacks {want:?}:\n{why}");
    }
    let out = s._tmp.path().join("ds.jsonl");
    ok(mass(
        l,
        &[
            "export",
            "dataset",
            "ref",
            "--cycle",
            "1",
            "--out",
            out.to_str().unwrap(),
        ],
    ));
    let line = ok(mass(l, &["why", &format!("{}:1", out.display())]));
    assert!(
        line.contains("the line is the recorded one") && line.contains("(orchestrator)"),
        "{line}"
    );
    let report = ok(mass(l, &["report", "ref"]));
    assert!(
        report.contains("cycle 1 (Qwen/Qwen3.6-27B-FP8 -> L1-fp8)"),
        "{report}"
    );
    assert!(
        report.contains("validation loss 1.5000 -> 1.1250"),
        "{report}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(mass(l, &["report", "ref", "--json"]))).expect("JSON");
    assert_eq!(json["cycles"][0]["figures"]["collected_runs"], 4);
    assert_eq!(json["cycles"][0]["figures"]["selected_runs"], 3);
    let diff = ok(mass(l, &["diff", "ref", "ref2"]));
    assert!(
        diff.contains("c1/query51/pair") && diff.contains("rankings:"),
        "{diff}"
    );
    let tables = s._tmp.path().join("tables");
    export_csv(l, &["ref", "ref2"], &tables);
    check_two_runs_tables(&tables);
}

/// `mass export tables RUN... --out DIR --format csv`.
fn export_csv(l: &Path, runs: &[&str], out: &Path) {
    let mut args = vec!["export", "tables"];
    args.extend_from_slice(runs);
    args.extend(["--out", out.to_str().unwrap(), "--format", "csv"]);
    ok(mass(l, &args));
}

/// The tables of the two imported runs of `setup`: their model calls, the
/// absent checks (null, not an id), present workspaces and the
/// self-judged verdicts.
fn check_two_runs_tables(tables: &Path) {
    let calls = std::fs::read_to_string(tables.join("model_calls.csv")).expect("model_calls.csv");
    // 8 episodes x 3 chat calls per run; one per episode reported no usage.
    assert_eq!(calls.lines().count(), 1 + 2 * 24, "{calls}");
    assert_eq!(
        calls
            .lines()
            .filter(|l| l.contains(",ok,1,,,stop,"))
            .count(),
        16,
        "{calls}"
    );
    // Absent is absent: no checks output (null, not an id); the workspace
    // is the folder's (an id).
    let rollouts = std::fs::read_to_string(tables.join("rollouts.csv")).expect("rollouts.csv");
    let header: Vec<&str> = rollouts.lines().next().unwrap().split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|c| *c == name)
            .unwrap_or_else(|| panic!("{name} column"))
    };
    let (tree, validation) = (column("tree"), column("validation"));
    let tree_from = column("tree_from");
    for row in rollouts.lines().skip(1) {
        let cells: Vec<&str> = row.split(',').collect();
        assert_eq!(cells[validation], "", "{row}");
        assert_eq!(cells[tree].len(), 64, "{row}");
        assert_eq!(cells[tree_from], "run folder at import", "{row}");
    }
    let judgments = std::fs::read_to_string(tables.join("judgments.csv")).expect("judgments.csv");
    assert_eq!(judgments.lines().count(), 1 + 8);
}

/// Every file under `dir` gets modified time `at` (as a copy or a
/// checkout sets them: nothing to do with when the run wrote them).
fn touch_all(dir: &Path, at: std::time::SystemTime) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            touch_all(&p, at);
        } else {
            let f = std::fs::File::options().write(true).open(&p).expect("open");
            f.set_modified(at).expect("set_modified");
        }
    }
}

/// Regression (stop 40's note: the judge stage of an imported run showed
/// 29,090,462 s): stage times of an imported run came from file mtimes.
/// The reference logs no time for its stage files, so a span that starts
/// or ends at one is unknown (null, "unknown"), never the distance between
/// two copies' mtimes; a span between two logged times is still measured.
#[test]
fn regression_imported_stage_times_are_unknown_not_file_mtimes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ledger = tmp.path().join("ledger");
    let dir = tmp.path().join("run");
    fixture::write_run(&dir, &Spec::default()).expect("fixture");
    // Far from the episodes' logged times (2026-01-01): a late copy.
    let copied = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_900_000_000);
    touch_all(&dir, copied);
    let d = dir.to_str().unwrap();
    ok(mass(&ledger, &["import", "sakana", d, "--name", "ref"]));
    let json: serde_json::Value =
        serde_json::from_str(&ok(mass(&ledger, &["report", "ref", "--json"]))).expect("JSON");
    let stages = json["cycles"][0]["stages"].as_array().expect("stages");
    let wall = |name: &str| {
        let s = stages.iter().find(|s| s["stage"] == name).expect(name);
        s["wall_seconds"].clone()
    };
    for name in [
        "search", "judge", "rank", "select", "dataset", "train", "evaluate",
    ] {
        assert!(wall(name).is_null(), "{name}: {}", wall(name));
    }
    // From the last reference run's logged end to the last collected
    // run's: both logged by the reference, so measured (the fixture's
    // episodes all run within a day).
    let collect = wall("collect").as_f64().expect("collect is measured");
    assert!((0.0..86_400.0).contains(&collect), "{collect}");
    let text = ok(mass(&ledger, &["report", "ref"]));
    let judge = text
        .lines()
        .find(|l| l.trim_start().starts_with("judge "))
        .expect("a judge row");
    assert!(judge.trim_end().ends_with("unknown"), "{text}");
    let out = tmp.path().join("tables");
    let o = out.to_str().unwrap();
    ok(mass(
        &ledger,
        &["export", "tables", "ref", "--out", o, "--format", "csv"],
    ));
    let csv = std::fs::read_to_string(out.join("stages.csv")).expect("stages.csv");
    let row = csv
        .lines()
        .find(|l| l.contains(",judge,"))
        .expect("a judge row");
    assert!(row.contains(",judge,,"), "wall_seconds is null: {row}");
    let runs = std::fs::read_to_string(out.join("runs.csv")).expect("runs.csv");
    assert!(
        !runs.contains("1900000000"),
        "started_ms is a stand-in: {runs}"
    );
}

/// Column `name` of a CSV table with no quoted commas in the columns read.
fn column(csv: &str, name: &str) -> Vec<String> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let at = header.iter().position(|c| *c == name).expect(name);
    lines
        .map(|l| l.split(',').nth(at).unwrap_or("?").to_string())
        .collect()
}

/// Regression (stop 41's note, "fields the schema forces are zero"): the
/// reference records no root seed, runs no checks and no guards, counts no
/// supervised tokens and writes no trainer exit status, yet its run showed
/// 0 for each, which reads as a measurement. The import lists them as not
/// recorded in the events' metadata, and every reader shows them so.
#[test]
fn regression_imported_placeholders_are_not_recorded_not_zero() {
    let (s, _) = setup(false);
    let l = &s.ledger;
    let out = s._tmp.path().join("tables");
    let o = out.to_str().unwrap();
    ok(mass(
        l,
        &["export", "tables", "ref", "--out", o, "--format", "csv"],
    ));
    let table = |t: &str| std::fs::read_to_string(out.join(format!("{t}.csv"))).expect(t);
    for (t, col) in [
        ("runs", "seed"),
        ("runs", "tasks"),
        ("cycles", "supervised_tokens"),
        ("cycles", "tampered_in_training"),
        ("cycles", "tampering_rate"),
        ("rollouts", "checks_passed"),
        ("rollouts", "checks_total"),
        ("trainings", "exit_status"),
    ] {
        let values = column(&table(t), col);
        assert!(!values.is_empty(), "{t}.{col} has rows");
        assert!(values.iter().all(|v| v.is_empty()), "{t}.{col}: {values:?}");
    }
    // What the reference did record stays: the selected runs, the steps.
    assert_eq!(column(&table("cycles"), "selected_runs"), ["3"]);
    let json: serde_json::Value =
        serde_json::from_str(&ok(mass(l, &["report", "ref", "--json"]))).expect("JSON");
    let f = &json["cycles"][0]["figures"];
    for k in [
        "supervised_tokens",
        "tampered_in_training",
        "tampering_rate",
    ] {
        assert!(f[k].is_null(), "{k}: {}", f[k]);
    }
    let report = ok(mass(l, &["report", "ref"]));
    assert!(
        report.contains("supervised tokens: not recorded"),
        "{report}"
    );
    let rows: serde_json::Value =
        serde_json::from_str(&ok(mass(l, &["runs", "ref", "--json"]))).expect("JSON");
    let rollout = rows
        .as_array()
        .and_then(|r| r.iter().find(|x| x["selection"] == "train"))
        .and_then(|r| r["event"].as_str())
        .expect("a selected rollout")
        .to_string();
    let why = ok(mass(l, &["why", &rollout]));
    assert!(why.contains("exit not recorded"), "{why}");
    let model = ok(mass(l, &["why", "L1-fp8"]));
    assert!(
        model.contains("(exit not recorded)") && model.contains("not recorded supervised tokens"),
        "{model}"
    );
}

#[test]
fn bad_input_exit_codes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let l = tmp.path().join("ledger");
    let run = tmp.path().join("run");
    fixture::write_run(&run, &Spec::default()).expect("fixture");
    let r = run.to_str().unwrap();
    let missing = tmp.path().join("nope");
    let code = |args: &[&str]| mass(&l, args).status.code();
    assert_eq!(
        code(&["import", "sakana", missing.to_str().unwrap()]),
        Some(4)
    );
    assert_eq!(code(&["import", "sakana", r, "--name", "a/b"]), Some(2));
    assert!(!l.exists(), "a refused import left a ledger behind");
    // A name the ledger takes whose streams (`NAME/c1/query51/...`) it
    // would not: refused as a bad name before any ledger is made.
    let long = "n".repeat(240);
    let o = mass(&l, &["import", "sakana", r, "--name", &long]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!l.exists(), "a refused import left a ledger behind");
    // A task id that is no number: refused with its file and line (exit 3),
    // no ledger made.
    let pool = std::fs::read_to_string(run.join("pool.json")).unwrap();
    std::fs::write(
        run.join("pool.json"),
        pool.replacen("\"task\": 51", "\"task\": \"1 2\"", 1),
    )
    .unwrap();
    let o = mass(&l, &["import", "sakana", r]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("pool.json:1: no task id"), "{}", text(&o));
    assert!(!l.exists(), "a refused import left a ledger behind");
    std::fs::remove_file(run.join("config.json")).unwrap();
    let o = mass(&l, &["import", "sakana", r]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(!l.exists(), "a refused import left a ledger behind");
    fixture::write_run(&run, &Spec::default()).expect("fixture");
    ok(mass(&l, &["import", "sakana", r, "--name", "x"]));
    let other = tmp.path().join("other");
    fixture::write_run(
        &other,
        &Spec {
            key: None,
            variant: 1,
            ..Spec::default()
        },
    )
    .expect("fixture");
    let o = mass(
        &l,
        &["import", "sakana", other.to_str().unwrap(), "--name", "x"],
    );
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
}

#[test]
fn a_planted_key_is_in_no_output_and_no_object() {
    let (s, outputs) = setup(true);
    let l = &s.ledger;
    let mut seen = outputs.join("\n");
    for args in [
        &["log", "--json"][..],
        &["report", "ref", "--json"],
        &["export", "events", "ref", "--out", "/dev/stdout"],
    ] {
        seen.push_str(&text(&mass(l, args)));
    }
    // An error about a file of the folder.
    let bad = s._tmp.path().join("bad");
    fixture::write_run(
        &bad,
        &Spec {
            key: Some(KEY.into()),
            variant: 0,
            ..Spec::default()
        },
    )
    .expect("fixture");
    std::fs::write(
        bad.join("selection/train.json"),
        format!("[{{\"episode\": \"{KEY}\"}}]"),
    )
    .unwrap();
    let o = mass(
        l,
        &["import", "sakana", bad.to_str().unwrap(), "--name", "bad"],
    );
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    seen.push_str(&text(&o));
    assert!(!seen.contains(KEY), "the key is in the output:\n{seen}");
    // The library test reads every object back decompressed; here every
    // blob an event of the log names, through the binary.
    let log: serde_json::Value =
        serde_json::from_str(&ok(mass(l, &["log", "--json", "--limit", "100000"]))).expect("JSON");
    let events = log.as_array().expect("a list of events");
    assert!(events.len() > 50, "{}", events.len());
    let mut blobs = 0;
    for ev in events {
        for r in ev["refs"].as_array().into_iter().flatten() {
            let id = r.as_str().unwrap_or_default();
            let o = mass(l, &["cat", id]);
            if o.status.success() {
                blobs += 1;
                assert!(
                    !String::from_utf8_lossy(&o.stdout).contains(KEY),
                    "blob {id} holds the key"
                );
            }
        }
    }
    assert!(blobs > 50, "{blobs}");
    // The workspaces' files (a tree, which `cat` does not print): checked
    // out, the key is in none, and `why` names the files recorded with it
    // replaced.
    let (rollout, tree) = rollout_and_tree(l, "ref/c1/query51/collect/00/orch");
    let out = s._tmp.path().join("co");
    ok(mass(l, &["checkout", &tree, out.to_str().unwrap()]));
    let env = std::fs::read_to_string(out.join(".env")).expect(".env");
    assert_eq!(env, "OPENAI_API_KEY=REDACTED\n");
    assert!(!std::fs::read_to_string(out.join("report.md"))
        .expect("report.md")
        .contains(KEY));
    let why = ok(mass(l, &["why", &rollout]));
    assert!(
        why.contains("2 file(s) recorded with a credential replaced by REDACTED")
            && why.contains(".env, report.md"),
        "{why}"
    );
}

/// A run folder with the external judges' verdicts on its evaluation runs
/// (`evaluation/external.jsonl`): `mass report --json` shows each judge's
/// held-out and training-task figures as counted here from the file's
/// lines (and together, the reference's own W/(W+L) of the pair's `a`),
/// and `export tables` has them in `evaluations` and every verdict in
/// `judgments`, the other run folder's run null.
#[test]
fn an_imported_runs_external_verdicts_are_its_evaluation() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let l = tmp.path().join("ledger");
    let dir = tmp.path().join("run");
    let spec = Spec {
        external: true,
        ..Spec::default()
    };
    fixture::write_run(&dir, &spec).expect("fixture");
    ok(mass(
        &l,
        &["import", "sakana", dir.to_str().unwrap(), "--name", "ext"],
    ));
    // The oracle: (split, judge) -> judgments won by a, by b, tied; pairs
    // won by a, by b, tied (each pair's majority).
    let text = std::fs::read_to_string(dir.join("evaluation/external.jsonl")).expect("file");
    let mut want: BTreeMap<(String, String), [u32; 6]> = BTreeMap::new();
    let mut pairs: BTreeMap<(String, String, String), i64> = BTreeMap::new();
    let (mut all_a, mut all_b) = (0, 0);
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).expect("JSON line");
        let split = if r["pair"]["task"] == 60 {
            "heldout"
        } else {
            "train"
        };
        let key = (
            split.to_string(),
            r["provider"].as_str().unwrap().to_string(),
        );
        let w = r["winner"].as_str().unwrap();
        let slot = ["A", "B", "tie"].iter().position(|x| *x == w).unwrap();
        want.entry(key.clone()).or_default()[slot] += 1;
        all_a += u32::from(w == "A");
        all_b += u32::from(w == "B");
        let margin = pairs
            .entry((key.0, key.1, r["pair"]["a"].to_string()))
            .or_default();
        *margin += i64::from(w == "A") - i64::from(w == "B");
    }
    for ((split, judge, _), margin) in pairs {
        let slot = match margin.signum() {
            1 => 3,
            -1 => 4,
            _ => 5,
        };
        want.get_mut(&(split, judge)).unwrap()[slot] += 1;
    }
    let json: serde_json::Value =
        serde_json::from_str(&ok(mass(&l, &["report", "ext", "--json"]))).expect("JSON");
    let evals = json["cycles"][0]["figures"]["evaluations"]
        .as_array()
        .expect("evaluations")
        .clone();
    assert_eq!(evals.len(), want.len(), "{evals:?}");
    let (mut sum_w, mut sum_l) = (0, 0);
    for e in &evals {
        let key = (
            e["split"].as_str().unwrap().to_string(),
            e["judge"].as_str().unwrap().to_string(),
        );
        let f = want[&key];
        let n = |k: &str| e[k].as_u64().unwrap() as u32;
        let got = [
            n("judgment_wins"),
            n("judgment_losses"),
            n("judgment_ties"),
            n("wins"),
            n("losses"),
            n("ties"),
        ];
        assert_eq!(got, f, "{key:?}: {e}");
        let rate = e["judgment_win_rate"].as_f64().unwrap();
        assert!(
            (rate - f[0] as f64 / (f[0] + f[1]) as f64).abs() < 1e-12,
            "{e}"
        );
        assert_eq!(e["against"], "other-run");
        assert_eq!(e["baseline"], fixture::OTHER_RUN);
        assert_eq!(e["self_judge"], false);
        sum_w += got[0];
        sum_l += got[1];
    }
    // The reference's summary: W/(W+L) of a over every line.
    assert_eq!((sum_w, sum_l), (all_a, all_b));
    let report = ok(mass(&l, &["report", "ext"]));
    assert!(
        report.contains("heldout vs other-run by openai (gpt-5.5)"),
        "{report}"
    );
    let tables = tmp.path().join("tables");
    export_csv(&l, &["ext"], &tables);
    check_external_tables(&tables, want.len(), text.lines().count());
}

/// The tables of a run with external verdicts: `evaluations` rows, and
/// each of the `verdicts` judgments with this folder's run as `a`, the
/// other folder's null, and its evaluation named.
fn check_external_tables(tables: &Path, evaluations_n: usize, verdicts: usize) {
    let evaluations = std::fs::read_to_string(tables.join("evaluations.csv")).expect("csv");
    assert_eq!(
        evaluations.lines().count(),
        1 + evaluations_n,
        "{evaluations}"
    );
    let judgments = std::fs::read_to_string(tables.join("judgments.csv")).expect("csv");
    let header: Vec<&str> = judgments.lines().next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|c| *c == name).unwrap();
    let evaluated: Vec<Vec<&str>> = judgments
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|r| r[col("stage")] == "evaluate")
        .collect();
    assert_eq!(evaluated.len(), verdicts);
    for r in &evaluated {
        assert_eq!(r[col("a")].len(), 64, "{r:?}");
        assert_eq!(r[col("b")], "", "the other folder's run is null: {r:?}");
        assert_eq!(r[col("evaluation")].len(), 64, "{r:?}");
    }
}

/// Review finding (placeholders still shown as measured): the rollouts'
/// `score_passed`/`score_total` are listed as not recorded, and `export
/// tables` gives null, but `mass why ROLLOUT` printed `checks 0/0`, `mass
/// runs RUN` a `0/0` column (`--json`: 0 and 0) and `report --json` 0 of
/// 0 per scored run; `mass export dataset` printed `(0 supervised
/// tokens)` for the dataset whose token counts are not recorded.
#[test]
fn review_imported_checks_and_dataset_tokens_are_not_recorded_everywhere() {
    let (s, _) = setup(false);
    let l = &s.ledger;
    let rows: serde_json::Value =
        serde_json::from_str(&ok(mass(l, &["runs", "ref", "--json"]))).expect("JSON");
    let rows = rows.as_array().expect("rows");
    for r in rows {
        assert!(
            r["checks_passed"].is_null() && r["checks_total"].is_null(),
            "{r}"
        );
    }
    let table = ok(mass(l, &["runs", "ref"]));
    assert!(!table.contains(" 0/0 "), "{table}");
    let rollout = rows
        .iter()
        .find(|x| x["selection"] == "train")
        .and_then(|r| r["event"].as_str())
        .expect("a selected rollout");
    let why = ok(mass(l, &["why", rollout]));
    assert!(
        !why.contains("checks 0/0") && why.contains("checks not recorded"),
        "{why}"
    );
    let why: serde_json::Value =
        serde_json::from_str(&ok(mass(l, &["why", rollout, "--json"]))).expect("JSON");
    assert!(why["rollout"]["checks_total"].is_null(), "{why}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(mass(l, &["report", "ref", "--json"]))).expect("JSON");
    let scored = &json["cycles"][0]["scores"][0]["runs"];
    assert!(!scored.as_array().expect("scored runs").is_empty());
    for r in scored.as_array().unwrap() {
        assert!(
            r["checks_passed"].is_null() && r["checks_total"].is_null(),
            "{r}"
        );
    }
    let out = s._tmp.path().join("ds.jsonl");
    let said = ok(mass(
        l,
        &[
            "export",
            "dataset",
            "ref",
            "--cycle",
            "1",
            "--out",
            out.to_str().unwrap(),
        ],
    ));
    assert!(
        !said.contains("(0 supervised tokens)")
            && said.contains("(not recorded supervised tokens)"),
        "{said}"
    );
}

/// Review finding (ids do not cover metadata): the ledger keeps the
/// metadata of an event's first write, so a folder imported by a mass
/// older than the stand-in and not-recorded marks keeps its unmarked
/// events (report: a judge stage of months, checks 0/0), and importing it
/// again said only "already holds this import; nothing written". The
/// import must say the run's events lack the marks, and what to do.
#[test]
fn review_an_import_by_an_older_mass_is_said_to_lack_the_marks() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("run");
    fixture::write_run(&dir, &Spec::default()).expect("fixture");
    let d = dir.to_str().unwrap();
    let marked = tmp.path().join("marked");
    ok(mass(&marked, &["import", "sakana", d, "--name", "ref"]));
    // The same objects and refs as an older mass wrote them: metadata
    // without the marks.
    let older = tmp.path().join("older");
    {
        let from = ledger::Ledger::open(&marked).expect("open");
        let to = ledger::Ledger::init(&older).expect("init");
        let mut b = to.batch();
        for (id, _) in from.locations().expect("locations") {
            let (kind, raw) = from.raw_object(&id).expect("raw");
            let meta = if kind == ledger::ObjectKind::Event {
                let mut m = from.get_meta(&id).expect("meta");
                m.extra.remove(ledger::WALL_MS_FROM);
                m.extra.remove(ledger::NOT_RECORDED);
                serde_json::to_vec(&m).expect("meta JSON")
            } else {
                Vec::new()
            };
            b.put_raw(kind, raw, meta).expect("put_raw");
        }
        for (name, h) in from.refs().expect("refs") {
            b.set_ref(&name, None, h).expect("set_ref");
        }
        b.commit().expect("commit");
    }
    let again = mass(&older, &["import", "sakana", d, "--name", "ref"]);
    let said = text(&again);
    assert!(again.status.success(), "{said}");
    assert!(said.contains("already holds this import"), "{said}");
    assert!(
        said.contains("older mass") && said.contains("new ledger"),
        "the import says the run's events lack the marks: {said}"
    );
    // Where the current mass wrote them: no such warning.
    let again = text(&mass(&marked, &["import", "sakana", d, "--name", "ref"]));
    assert!(!again.contains("older mass"), "{again}");
}

/// Review finding (a stage no step closed): the reference writes
/// `selected_checkpoint.json` only after training ran to its end; without
/// it the import records no training and no note closes the train stage,
/// and `report` showed the train stage at a measured-looking `0.0` s while
/// its time (if the reference trained at all) is unknown. A stage no step
/// of an imported run closed is now unknown in every reader
/// (`audit::report::walltimes`); the import records nothing
/// new (no "not trained" claim it cannot know).
#[test]
fn review_an_imported_run_without_training_shows_no_zero_train_time() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ledger = tmp.path().join("ledger");
    let dir = tmp.path().join("run");
    fixture::write_run(&dir, &Spec::default()).expect("fixture");
    std::fs::remove_file(dir.join("selected_checkpoint.json")).expect("rm");
    let d = dir.to_str().unwrap();
    ok(mass(&ledger, &["import", "sakana", d, "--name", "ref"]));
    let json: serde_json::Value =
        serde_json::from_str(&ok(mass(&ledger, &["report", "ref", "--json"]))).expect("JSON");
    let stages = json["cycles"][0]["stages"].as_array().expect("stages");
    let train = stages
        .iter()
        .find(|s| s["stage"] == "train")
        .expect("train");
    assert!(train["wall_seconds"].is_null(), "{train}");
    // Said so in the text and the tables too, never 0.
    let report = ok(mass(&ledger, &["report", "ref"]));
    let line = report
        .lines()
        .find(|l| l.trim_start().starts_with("train "))
        .expect("a train line");
    assert!(line.trim_end().ends_with("unknown"), "{report}");
    let tables = tmp.path().join("tables");
    export_csv(&ledger, &["ref"], &tables);
    let stages = std::fs::read_to_string(tables.join("stages.csv")).expect("stages.csv");
    let names = column(&stages, "stage");
    let walls = column(&stages, "wall_seconds");
    let at = names.iter().position(|s| s == "train").expect("train row");
    assert_eq!(walls[at], "", "{stages}");
}

/// Review finding: `mass show` of an imported step printed its stand-in
/// time as `time 2030-...` like any other, the `wall_ms_from` mark only on
/// a later `meta` line; the time line itself says it is a stand-in.
#[test]
fn review_show_says_a_stand_in_time_is_one() {
    let (s, _) = setup(false);
    let l = &s.ledger;
    let log = ok(mass(l, &["log", "ref", "--json"]));
    let events: serde_json::Value = serde_json::from_str(&log).expect("JSON");
    let started = events
        .as_array()
        .and_then(|e| e.iter().find(|e| e["kind"] == "run.started"))
        .and_then(|e| e["id"].as_str())
        .expect("run.started")
        .to_string();
    let shown = ok(mass(l, &["show", &started]));
    let time = shown
        .lines()
        .find(|x| x.starts_with("time "))
        .expect("a time line");
    assert!(time.contains("a stand-in (file mtime)"), "{shown}");
}

/// Issue #31, part 1 through the CLI: an imported rollout's workspace is
/// checked out file for file as the folder holds it, and `show` and `why`
/// say it is the folder's at import. Fails with workspaces not imported.
#[test]
fn an_imported_rollouts_workspace_checks_out_and_is_said_to_be_the_folders() {
    let (s, _) = setup(false);
    let l = &s.ledger;
    let (rollout, tree) = rollout_and_tree(l, "ref/c1/query51/collect/01/orch");
    let out = s._tmp.path().join("co");
    ok(mass(l, &["checkout", &tree, out.to_str().unwrap()]));
    let ws = s.runs[0].join("pool/workspaces/t51_L0_s10101");
    for f in ["results.json", "report.md", "src/solve.py"] {
        assert_eq!(
            std::fs::read(out.join(f)).expect("checked out"),
            std::fs::read(ws.join(f)).expect("written"),
            "{f}"
        );
    }
    assert!(out.join("out").is_dir());
    let shown = ok(mass(l, &["show", &rollout]));
    assert!(
        shown.lines().any(|x| x.starts_with("tree ")
            && x.contains(&tree)
            && x.contains("from the run folder at import")),
        "{shown}"
    );
    let why = ok(mass(l, &["why", &rollout]));
    assert!(
        why.contains(&format!("final workspace tree {}", &tree[..12]))
            && why.contains("not proven to be the workspace at the episode's end"),
        "{why}"
    );
}

/// The rollout ending stream `stream` and its `tree`, through the CLI.
fn rollout_and_tree(l: &Path, stream: &str) -> (String, String) {
    let refs: serde_json::Value =
        serde_json::from_str(&ok(mass(l, &["refs", "--json"]))).expect("JSON");
    let rollout = refs
        .as_array()
        .and_then(|r| r.iter().find(|x| x["name"] == stream))
        .and_then(|r| r["head"].as_str())
        .expect("the rollout's stream")
        .to_string();
    let shown = ok(mass(l, &["show", &rollout, "--json"]));
    let ev: serde_json::Value = serde_json::from_str(&shown).expect("JSON");
    let tree = ev["payload"]["tree"].as_str().expect("tree").to_string();
    (rollout, tree)
}
