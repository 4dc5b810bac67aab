//! `mass export tables` through the binary, on two-cycle smoke runs over
//! several seeds: every table's rows are read back from the Parquet files
//! and checked against what the ledger says by other routes — row counts
//! against the events (`mass export events`), stage costs, evaluation
//! figures and training losses against `mass report --json`, Bradley-Terry
//! scores and selections against `mass runs RUN --json`, the headline win
//! rate recomputed from the judgments and rollouts tables as a notebook
//! would. CSV carries the same rows; several runs share one set of tables;
//! a failed export leaves the previous tables as they were.
//!
//! The same tables loaded in DuckDB and polars (a cached venv,
//! `scripts/data-env.sh`) are checked by the ignored test at the end:
//!
//!   eval "$(scripts/data-env.sh | sed 's/^/export /')"
//!   cargo test --test tables -- --ignored --nocapture

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use arrow_array::{Array, BooleanArray, Float64Array, Int64Array, StringArray};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{json, Value};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn mass(ledger: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mass"))
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .env_remove("MASS_LEDGER")
        .output()
        .expect("run mass")
}

fn ok(ledger: &Path, args: &[&str]) -> Output {
    let o = mass(ledger, args);
    assert!(
        o.status.success(),
        "mass {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn json_of(ledger: &Path, args: &[&str]) -> Value {
    serde_json::from_slice(&ok(ledger, args).stdout).expect("json output")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for e in std::fs::read_dir(from).expect("read dir") {
        let e = e.expect("dir entry");
        if e.file_name() == "__pycache__" {
            continue;
        }
        let target = to.join(e.file_name());
        if e.file_type().expect("file type").is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy file");
        }
    }
}

/// Runs the smoke experiment for two cycles under `seed` as run `name`
/// into `ledger` (every task collected, so each cycle trains).
fn smoke(dir: &Path, ledger: &Path, name: &str, seed: u64) {
    if !dir.join("tasks").exists() {
        copy_dir(&repo().join("examples/tasks"), &dir.join("tasks"));
    }
    let s = std::fs::read_to_string(repo().join("examples/smoke.toml")).expect("smoke.toml");
    let s = s
        .replace("seed = 8", &format!("seed = {seed}"))
        .replace("cycles = 1", "cycles = 2")
        .replace("name = \"smoke\"", &format!("name = \"{name}\""))
        .replace("[outer]\n", "[outer]\ncollect = \"every\"\n");
    assert!(
        s.contains(&format!("name = \"{name}\"")),
        "smoke.toml names its run"
    );
    let exp = dir.join(format!("{name}.toml"));
    std::fs::write(&exp, s).expect("write experiment");
    ok(
        ledger,
        &["run", "--quiet", exp.to_str().expect("utf-8 path")],
    );
}

/// A Parquet table's rows as JSON objects (column name → value).
fn read_parquet(path: &Path) -> Vec<BTreeMap<String, Value>> {
    let f = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let reader = ParquetRecordBatchReaderBuilder::try_new(f)
        .expect("parquet footer")
        .build()
        .expect("parquet reader");
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.expect("record batch");
        let schema = batch.schema();
        for r in 0..batch.num_rows() {
            let mut row = BTreeMap::new();
            for (c, field) in schema.fields().iter().enumerate() {
                row.insert(field.name().clone(), cell(batch.column(c).as_ref(), r));
            }
            rows.push(row);
        }
    }
    rows
}

fn cell(a: &dyn Array, r: usize) -> Value {
    if a.is_null(r) {
        return Value::Null;
    }
    let any = a.as_any();
    if let Some(s) = any.downcast_ref::<StringArray>() {
        json!(s.value(r))
    } else if let Some(i) = any.downcast_ref::<Int64Array>() {
        json!(i.value(r))
    } else if let Some(f) = any.downcast_ref::<Float64Array>() {
        json!(f.value(r))
    } else if let Some(b) = any.downcast_ref::<BooleanArray>() {
        json!(b.value(r))
    } else {
        panic!("unexpected column type {:?}", a.data_type())
    }
}

type Tables = BTreeMap<String, Vec<BTreeMap<String, Value>>>;

fn export(ledger: &Path, runs: &[&str], out: &Path) -> Tables {
    let mut args = vec!["export", "tables"];
    args.extend_from_slice(runs);
    args.extend_from_slice(&["--out", out.to_str().expect("utf-8")]);
    ok(ledger, &args);
    tables::schema::TABLES
        .iter()
        .map(|t| {
            let rows = read_parquet(&out.join(format!("{}.parquet", t.name)));
            (t.name.to_string(), rows)
        })
        .collect()
}

/// Events of the run by kind (and, for effects, by effect kind and
/// whether the record finished an attempt), from `mass export events`.
fn event_counts(ledger: &Path, run: &str, dir: &Path) -> BTreeMap<String, usize> {
    let path = dir.join(format!("{run}.events.jsonl"));
    ok(
        ledger,
        &[
            "export",
            "events",
            run,
            "--out",
            path.to_str().expect("utf-8"),
        ],
    );
    let mut counts = BTreeMap::new();
    for line in std::fs::read_to_string(&path).expect("events").lines() {
        let ev: Value = serde_json::from_str(line).expect("event json");
        let kind = ev["kind"].as_str().expect("kind").to_string();
        *counts.entry(kind.clone()).or_default() += 1;
        *counts.entry("all".into()).or_default() += 1;
        if kind == "effect" && ev["payload"]["status"] != "started" {
            let e = ev["payload"]["effect"]
                .as_str()
                .expect("effect")
                .to_string();
            *counts.entry(format!("effect:{e}")).or_default() += 1;
        }
    }
    counts
}

fn of_run<'a>(t: &'a Tables, table: &str, run: &str) -> Vec<&'a BTreeMap<String, Value>> {
    t[table].iter().filter(|r| r["run"] == run).collect()
}

fn check_counts(t: &Tables, run: &str, n: &BTreeMap<String, usize>) {
    let count = |k: &str| n.get(k).copied().unwrap_or(0);
    assert_eq!(of_run(t, "rollouts", run).len(), count("mass.rollout"));
    assert_eq!(of_run(t, "judgments", run).len(), count("mass.judgment"));
    assert_eq!(
        of_run(t, "training_steps", run).len(),
        count("mass.train_step")
    );
    assert_eq!(
        of_run(t, "evaluations", run).len(),
        count("mass.evaluation")
    );
    assert_eq!(of_run(t, "trainings", run).len(), count("mass.training"));
    assert_eq!(of_run(t, "cycles", run).len(), count("mass.cycle"));
    assert_eq!(
        of_run(t, "model_calls", run).len(),
        count("effect:model") + count("effect:judge") + count("effect:optimizer")
    );
    assert_eq!(of_run(t, "tool_calls", run).len(), count("effect:tool"));
    let runs = of_run(t, "runs", run);
    assert_eq!(runs.len(), 1);
    // Every event of the run is counted once (`export events` lists each
    // event of every stream once).
    assert_eq!(runs[0]["events"], json!(count("all")), "{runs:?}");
    assert!(count("mass.rollout") > 0 && count("mass.train_step") > 0);
}

/// Equal values; floats to the last bit but one (serde_json reads a
/// printed f64 back within one unit in the last place, the Parquet side is
/// exact).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) if a.is_f64() || b.is_f64() => {
            x == y || ((x - y).abs() <= f64::EPSILON * x.abs().max(y.abs()))
        }
        _ => a == b,
    }
}

/// Stages, evaluations and trainings as `mass report --json` shows them.
fn check_report(t: &Tables, run: &str, report: &Value) {
    for c in report["cycles"].as_array().expect("cycles") {
        let cycle = c["figures"]["cycle"].clone();
        for s in c["stages"].as_array().expect("stages") {
            let row = of_run(t, "stages", run)
                .into_iter()
                .find(|r| r["cycle"] == cycle && r["stage"] == s["stage"])
                .unwrap_or_else(|| panic!("no stages row for {cycle} {}", s["stage"]));
            for k in [
                "wall_seconds",
                "model_calls",
                "prompt_tokens",
                "completion_tokens",
            ] {
                assert!(
                    same(&row[k], &s[k]),
                    "stage {} {k} of cycle {cycle}: {row:?}",
                    s["stage"]
                );
            }
        }
        for e in c["figures"]["evaluations"].as_array().expect("evaluations") {
            let key = [
                "split",
                "against",
                "model",
                "baseline",
                "judge",
                "judge_model",
            ];
            let rows: Vec<_> = of_run(t, "evaluations", run)
                .into_iter()
                .filter(|r| r["cycle"] == cycle && key.iter().all(|k| r[*k] == e[*k]))
                .filter(|r| r["cycle_record"].is_string())
                .collect();
            assert_eq!(rows.len(), 1, "one evaluations row for {e}");
            for k in [
                "judgment_wins",
                "judgment_losses",
                "judgment_ties",
                "judgment_win_rate",
            ] {
                assert!(same(&rows[0][k], &e[k]), "{k} of {e}: {:?}", rows[0]);
            }
            for k in [
                "pairs",
                "wins",
                "losses",
                "ties",
                "win_rate",
                "swapped",
                "same_position",
            ] {
                assert!(same(&rows[0][k], &e[k]), "{k} of {e}: {:?}", rows[0]);
            }
            assert!(same(&rows[0]["win_rate_low"], &e["interval"][0]), "{e}");
            assert!(same(&rows[0]["win_rate_high"], &e["interval"][1]), "{e}");
            check_recomputed(t, run, rows[0]);
        }
        let tr = &c["training"];
        let row = of_run(t, "trainings", run)
            .into_iter()
            .find(|r| r["cycle"] == cycle)
            .expect("a trainings row per trained cycle");
        assert_eq!(row["event"], tr["event"]);
        assert!(
            same(&row["validation_loss"], &tr["validation_loss"]),
            "{tr}"
        );
        assert_eq!(row["new_model"], tr["new_model"]);
    }
}

/// The headline recomputed as the README's notebook example does: the
/// evaluation's judgments, each won by the rollout named, whose model is
/// the evaluated one (a win) or the baseline (a loss).
fn check_recomputed(t: &Tables, run: &str, e: &BTreeMap<String, Value>) {
    let model_of: BTreeMap<&str, &Value> = of_run(t, "rollouts", run)
        .into_iter()
        .map(|r| {
            (
                r["event"].as_str().expect("event"),
                &r["orchestrator_model"],
            )
        })
        .collect();
    let (mut w, mut l) = (0i64, 0i64);
    for j in of_run(t, "judgments", run) {
        if j["evaluation"] != e["event"] || j["winner_rollout"].is_null() {
            continue;
        }
        let m = model_of[j["winner_rollout"].as_str().expect("winner")];
        w += i64::from(*m == e["model"]);
        l += i64::from(*m == e["baseline"]);
    }
    assert_eq!(json!(w), e["judgment_wins"], "wins recomputed for {e:?}");
    assert_eq!(
        json!(l),
        e["judgment_losses"],
        "losses recomputed for {e:?}"
    );
}

/// Scores, ranks and selections as `mass runs RUN --json` lists them.
fn check_rollouts(t: &Tables, run: &str, listed: &Value) {
    let rows = of_run(t, "rollouts", run);
    let listed = listed.as_array().expect("rollout list");
    assert_eq!(rows.len(), listed.len());
    for l in listed {
        let r = rows
            .iter()
            .find(|r| r["event"] == l["event"])
            .unwrap_or_else(|| panic!("rollout {} missing", l["event"]));
        assert!(same(&r["score"], &l["score"]), "{l}");
        assert_eq!(r["rank"], l["rank"], "{l}");
        assert_eq!(r["selection"], l["selection"], "{l}");
        assert_eq!(r["checks_passed"], l["checks_passed"], "{l}");
        // The engine snapshots the workspace the run ended with: no stand-in.
        assert_eq!(r["tree_from"], Value::Null, "{l}");
    }
}

/// Every id a row names is an object of the ledger: checked with `mass
/// show` / `mass cat` on the first row of each table.
fn check_ids_resolve(ledger: &Path, t: &Tables) {
    for (name, rows) in t {
        let Some(row) = rows.first() else { continue };
        for (col, v) in row {
            let Some(s) = v.as_str() else { continue };
            if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            let shown = mass(ledger, &["show", s]);
            let cat = mass(ledger, &["cat", s]);
            assert!(
                shown.status.success() || cat.status.success(),
                "{name}.{col} = {s} is no object of the ledger"
            );
        }
    }
}

#[test]
fn tables_agree_with_the_report_the_rollout_list_and_the_log_over_seeds() {
    for seed in [3u64, 8, 21] {
        let d = tempfile::tempdir().expect("tempdir");
        let ledger = d.path().join("ledger");
        smoke(d.path(), &ledger, "smoke", seed);
        let t = export(&ledger, &["smoke"], &d.path().join("tables"));
        check_counts(&t, "smoke", &event_counts(&ledger, "smoke", d.path()));
        check_report(
            &t,
            "smoke",
            &json_of(&ledger, &["report", "smoke", "--json"]),
        );
        check_rollouts(&t, "smoke", &json_of(&ledger, &["runs", "smoke", "--json"]));
        check_ids_resolve(&ledger, &t);
        let lines = of_run(&t, "dataset_lines", "smoke");
        assert!(!lines.is_empty(), "seed {seed}: the dataset's lines");
        for l in lines {
            let why = mass(&ledger, &["why", l["rollout"].as_str().expect("rollout")]);
            assert!(why.status.success(), "a dataset line's rollout answers why");
        }
        // A run recorded by this build times every live call.
        for table in ["model_calls", "tool_calls"] {
            for r in of_run(&t, table, "smoke") {
                let ms = r["latency_ms"].as_f64();
                assert!(ms.is_some_and(|ms| ms >= 0.0), "{table}: {r:?}");
            }
        }
        let runs = of_run(&t, "runs", "smoke");
        assert_eq!(runs[0]["seed"], json!(seed.to_string()));
        assert_eq!(runs[0]["cycles_done"], json!(2));
        assert_eq!(runs[0]["finished"], json!(true));
    }
}

#[test]
fn csv_holds_the_same_rows_with_a_header_of_the_documented_columns() {
    let d = tempfile::tempdir().expect("tempdir");
    let ledger = d.path().join("ledger");
    smoke(d.path(), &ledger, "smoke", 5);
    let parquet = export(&ledger, &["smoke"], &d.path().join("p"));
    let out = d.path().join("c");
    let o = out.to_str().expect("utf-8");
    ok(
        &ledger,
        &["export", "tables", "smoke", "--out", o, "--format", "csv"],
    );
    for t in tables::schema::TABLES {
        let path = out.join(format!("{}.csv", t.name));
        let text = std::fs::read_to_string(&path).expect("csv");
        let header: Vec<&str> = t.columns.iter().map(|c| c.name).collect();
        assert_eq!(
            text.lines().next(),
            Some(header.join(",").as_str()),
            "{}",
            t.name
        );
        let reader = arrow_csv::ReaderBuilder::new(tables::sink::arrow_schema(t))
            .with_header(true)
            .build(File::open(&path).expect("open csv"))
            .expect("csv reader");
        let mut rows = Vec::new();
        for batch in reader {
            let batch = batch.expect("csv batch");
            for r in 0..batch.num_rows() {
                let row: BTreeMap<String, Value> = t
                    .columns
                    .iter()
                    .enumerate()
                    .map(|(c, col)| (col.name.to_string(), cell(batch.column(c).as_ref(), r)))
                    .collect();
                rows.push(row);
            }
        }
        // CSV has no null string apart from the empty one: compare with
        // empty strings read as null.
        let norm = |rows: &[BTreeMap<String, Value>]| -> Vec<BTreeMap<String, Value>> {
            rows.iter()
                .map(|r| {
                    r.iter()
                        .map(|(k, v)| {
                            (
                                k.clone(),
                                if *v == json!("") {
                                    Value::Null
                                } else {
                                    v.clone()
                                },
                            )
                        })
                        .collect()
                })
                .collect()
        };
        assert_eq!(norm(&rows), norm(&parquet[t.name]), "{}", t.name);
    }
}

#[test]
fn two_runs_share_one_set_of_tables_each_row_naming_its_run() {
    let d = tempfile::tempdir().expect("tempdir");
    let ledger = d.path().join("ledger");
    smoke(d.path(), &ledger, "alpha", 11);
    smoke(d.path(), &ledger, "beta", 12);
    let both = export(&ledger, &["alpha", "beta"], &d.path().join("both"));
    let alpha = export(&ledger, &["alpha"], &d.path().join("a"));
    let beta = export(&ledger, &["beta"], &d.path().join("b"));
    for t in tables::schema::TABLES {
        let name = t.name;
        assert_eq!(
            of_run(&both, name, "alpha"),
            of_run(&alpha, name, "alpha"),
            "{name}"
        );
        assert_eq!(
            of_run(&both, name, "beta"),
            of_run(&beta, name, "beta"),
            "{name}"
        );
        assert_eq!(
            both[name].len(),
            alpha[name].len() + beta[name].len(),
            "{name}"
        );
    }
}

/// Regression: a run named under another (`smoke/sub`, a fork) has refs
/// under `smoke/`; they were counted as streams of `smoke` (its rollouts
/// twice, its calls with no stage) by the tables, `mass runs` and `mass
/// report`. `mass fork` now refuses such a name, but ledgers made before
/// hold such runs, so the fork is made here as it was then.
#[test]
fn a_run_named_under_another_run_is_not_part_of_it() {
    let d = tempfile::tempdir().expect("tempdir");
    let ledger = d.path().join("ledger");
    smoke(d.path(), &ledger, "smoke", 6);
    let before = export(&ledger, &["smoke"], &d.path().join("before"));
    let runs_before = json_of(&ledger, &["runs", "smoke", "--json"]);
    let report_before = json_of(&ledger, &["report", "smoke", "--json"]);
    let fork = ["fork", "smoke", "--cycle", "2", "--stage", "evaluate"];
    let refused = mass(&ledger, &[&fork[..], &["--name", "smoke/sub"]].concat());
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    fork_as_before_names_were_checked(&ledger, "smoke", 2, "evaluate", "smoke/sub");
    let after = export(&ledger, &["smoke"], &d.path().join("after"));
    assert_eq!(before, after, "the fork's refs changed the tables of smoke");
    assert_eq!(json_of(&ledger, &["runs", "smoke", "--json"]), runs_before);
    assert_eq!(
        json_of(&ledger, &["report", "smoke", "--json"]),
        report_before
    );
    let sub = export(&ledger, &["smoke/sub"], &d.path().join("sub"));
    assert!(
        !of_run(&sub, "rollouts", "smoke/sub").is_empty(),
        "the fork has its own rows"
    );
}

/// Forks `run` right before `stage` of `cycle` as `name`, through the
/// library as `mass fork --cycle --stage` did before it checked the name.
fn fork_as_before_names_were_checked(
    ledger: &Path,
    run: &str,
    cycle: u32,
    stage: &str,
    name: &str,
) {
    use engine::milestone::{fork_point, Stage};
    let l = ledger::Ledger::open(ledger).expect("open");
    let head = l.head(run).expect("head").expect("the run");
    let mut main = l
        .chain(head)
        .collect::<ledger::Result<Vec<_>>>()
        .expect("chain");
    main.reverse();
    let st = Stage::named(stage).expect("a stage");
    let at = fork_point(&main, cycle, st).expect("a fork point");
    replay::fork_run(&l, run, at, name, &[]).expect("fork");
}

#[test]
fn an_unknown_run_or_a_failed_export_leaves_the_previous_tables_as_they_were() {
    let d = tempfile::tempdir().expect("tempdir");
    let ledger = d.path().join("ledger");
    smoke(d.path(), &ledger, "smoke", 7);
    let out = d.path().join("t");
    let o = out.to_str().expect("utf-8");
    let first = export(&ledger, &["smoke"], &out);
    // A replaced table is a new file (renamed over the old one): its inode
    // tells, whatever its bytes.
    let inode = |name: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(out.join(name)).expect("table").ino()
    };
    let before = inode("runs.parquet");

    let x = mass(
        &ledger,
        &["export", "tables", "smoke", "nosuchrun", "--out", o],
    );
    assert_eq!(x.status.code(), Some(4), "an unknown run is not found");
    assert!(String::from_utf8_lossy(&x.stderr).contains("nosuchrun"));

    // A table that cannot be written stops the export before any final
    // file is replaced, and its partial files are gone.
    std::fs::create_dir(out.join("judgments.parquet.partial")).expect("block a table");
    let x = mass(&ledger, &["export", "tables", "smoke", "--out", o]);
    assert_eq!(
        x.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&x.stderr)
    );
    assert!(String::from_utf8_lossy(&x.stderr).contains("judgments.parquet.partial"));
    assert_eq!(inode("runs.parquet"), before, "the runs table was replaced");
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want: Vec<String> = first.keys().map(|k| format!("{k}.parquet")).collect();
    want.push("judgments.parquet.partial".into());
    want.sort();
    assert_eq!(names, want, "no partial file left but the blocked one");

    // A final name taken by a directory: found before anything is renamed.
    std::fs::remove_dir(out.join("judgments.parquet.partial")).expect("unblock");
    std::fs::remove_file(out.join("rankings.parquet")).expect("remove a table");
    std::fs::create_dir(out.join("rankings.parquet")).expect("block a final name");
    let x = mass(&ledger, &["export", "tables", "smoke", "--out", o]);
    assert_eq!(x.status.code(), Some(1));
    let err = String::from_utf8_lossy(&x.stderr);
    assert!(
        err.contains("rankings.parquet") && err.contains("nothing was replaced"),
        "{err}"
    );
    assert_eq!(inode("runs.parquet"), before, "the runs table was replaced");
    let partials = std::fs::read_dir(&out)
        .expect("read dir")
        .filter(|e| {
            let name = e.as_ref().expect("entry").file_name();
            name.to_string_lossy().ends_with(".partial")
        })
        .count();
    assert_eq!(partials, 0, "partial files left behind");
}

/// DuckDB and polars (from PyPI, in `scripts/data-env.sh`'s venv) load the
/// tables and recompute the report's held-out win rates with the README's
/// example, on runs of several seeds, each exported with a fork of it that
/// re-ran its last evaluation (so the two share cycle 1's records, and a
/// query that joined on ids alone would count them twice).
#[test]
#[ignore = "needs MASS_DATA_PYTHON (scripts/data-env.sh)"]
fn the_tables_load_in_duckdb_and_polars_with_the_reports_figures() {
    let python = std::env::var("MASS_DATA_PYTHON")
        .expect("MASS_DATA_PYTHON: eval \"$(scripts/data-env.sh | sed 's/^/export /')\" first");
    for seed in [4u64, 9] {
        let d = tempfile::tempdir().expect("tempdir");
        let ledger = d.path().join("ledger");
        smoke(d.path(), &ledger, "smoke", seed);
        let fork = ["fork", "smoke", "--cycle", "2", "--stage", "evaluate"];
        ok(&ledger, &[&fork[..], &["--name", "again"]].concat());
        ok(&ledger, &["resume", "again"]);
        let out = d.path().join("tables");
        export(&ledger, &["smoke", "again"], &out);
        let csv = d.path().join("csv");
        let c = csv.to_str().expect("utf-8");
        ok(
            &ledger,
            &[
                "export", "tables", "smoke", "again", "--out", c, "--format", "csv",
            ],
        );
        for run in ["smoke", "again"] {
            let report = d.path().join(format!("{run}.report.json"));
            std::fs::write(&report, ok(&ledger, &["report", run, "--json"]).stdout)
                .expect("write report");
            let o = Command::new(&python)
                .arg(repo().join("tests/fixtures/tables_check.py"))
                .arg(&out)
                .arg(run)
                .arg(&report)
                .arg(&csv)
                .output()
                .expect("run python");
            println!("{}", String::from_utf8_lossy(&o.stdout));
            assert!(
                o.status.success(),
                "seed {seed}, run {run}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(String::from_utf8_lossy(&o.stdout).contains("duckdb: "));
            assert!(String::from_utf8_lossy(&o.stdout).contains("polars: "));
        }
    }
}
