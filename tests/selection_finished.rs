//! Issue #27, point 6: selection ranks only runs that finished. Smoke runs
//! with `max_turns = 3` (so some collected runs halt) over several seeds,
//! through the `mass` binary: no halted or failed run is judged, ranked or
//! selected, or appears in a dataset line; every run left out is named by
//! id and reason in its selection, `mass report` and `mass why`; a task
//! with fewer finished runs than the selection wants selects fewer (never
//! a worse run to fill in) and says so.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ledger::{Id, Ledger};
use serde_json::Value;

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

fn json(ledger: &Path, args: &[&str]) -> Value {
    serde_json::from_slice(&ok(ledger, args).stdout).expect("json output")
}

/// The smoke experiment under `seed`, every task collected, at most
/// `max_turns` turns per agent.
fn run(dir: &Path, seed: u64, max_turns: u32) -> PathBuf {
    let s = std::fs::read_to_string(repo().join("examples/smoke.toml")).expect("smoke.toml");
    let s = s
        .replace("seed = 8", &format!("seed = {seed}"))
        .replace(
            "tasks_dir = \"tasks\"",
            &format!("tasks_dir = {:?}", repo().join("examples/tasks")),
        )
        .replace("[outer]\n", "[outer]\ncollect = \"every\"\n")
        + &format!("\n[limits]\nmax_turns = {max_turns}\n");
    let exp = dir.join("smoke.toml");
    std::fs::write(&exp, s).expect("write experiment");
    let ledger = dir.join("ledger");
    ok(
        &ledger,
        &["run", "--quiet", exp.to_str().expect("utf-8 path")],
    );
    ledger
}

fn main_events(l: &Ledger, kind: &str) -> Vec<ledger::Event> {
    let head = l.head("smoke").unwrap().unwrap();
    let mut v: Vec<_> = l
        .chain(head)
        .map(|e| e.unwrap())
        .filter(|e| e.kind == kind)
        .collect();
    v.reverse();
    v
}

fn rollout(l: &Ledger, id: Id) -> schemas::Rollout {
    schemas::decode_event(&l.get_event(&id).unwrap()).unwrap()
}

/// What one seed showed: halted runs seen, and selections short of runs.
#[derive(Default)]
struct Seen {
    halted: usize,
    short: usize,
}

fn check_seed(dir: &Path, seed: u64) -> Seen {
    let ledger = run(dir, seed, 3);
    let mut seen = Seen::default();
    let l = Ledger::open(&ledger).unwrap();
    let mut excluded_ids = BTreeSet::new();
    let mut trained_or_ranked = BTreeSet::new();
    for ev in main_events(&l, "mass.selection") {
        assert_eq!(ev.version, 2, "seed {seed}: a mass-engine/9 run writes v2");
        let s: schemas::Selection = schemas::decode_event(&ev).unwrap();
        let rk: schemas::Ranking =
            schemas::decode_event(&l.get_event(&Id(s.ranking.0)).unwrap()).unwrap();
        for r in &rk.runs {
            let status = rollout(&l, Id(r.rollout.0)).status;
            assert_eq!(status, "finished", "seed {seed}: a {status} run was ranked");
            trained_or_ranked.insert(r.rollout);
        }
        for x in &s.exclusions {
            let r = rollout(&l, Id(x.rollout.0));
            assert_eq!(r.task, s.task);
            if r.status != "finished" {
                assert!(
                    x.reason.starts_with(&format!("{}: ", r.status)),
                    "seed {seed}: reason {:?} for a {} run",
                    x.reason,
                    r.status
                );
            }
            assert!(!trained_or_ranked.contains(&x.rollout));
            excluded_ids.insert(Id(x.rollout.0));
        }
        // Never a worse run to fill in: the selection is the top of the
        // ranking of finished runs, in order, as many as there are.
        let chosen: Vec<_> = s.train.iter().chain(s.validation.iter()).copied().collect();
        let top: Vec<_> = rk
            .runs
            .iter()
            .map(|r| r.rollout)
            .take(chosen.len())
            .collect();
        assert_eq!(
            chosen, top,
            "seed {seed}: selection is not the ranking's top"
        );
        let wanted = (s.wanted_train + s.wanted_validation) as usize;
        if rk.runs.len() < wanted {
            seen.short += 1;
            assert_eq!(chosen.len(), rk.runs.len());
            assert!(
                s.shortfall
                    .contains(&format!("{} run(s) ranked", rk.runs.len())),
                "seed {seed}: shortfall not said: {:?}",
                s.shortfall
            );
        } else {
            assert!(s.shortfall.is_empty());
        }
    }
    // Every collected run that did not finish is an exclusion, by id.
    for ev in main_events(&l, "note") {
        for p in &ev.parents {
            let e = l.get_event(p).unwrap();
            if e.kind != "mass.rollout" {
                continue;
            }
            let r: schemas::Rollout = schemas::decode_event(&e).unwrap();
            if r.purpose == "collect" && r.status != "finished" {
                seen.halted += 1;
                assert!(
                    excluded_ids.contains(p),
                    "seed {seed}: {} run {} not named in its selection",
                    r.status,
                    p.short(12)
                );
            }
        }
    }
    // No dataset line comes from a run that did not finish.
    for ev in main_events(&l, "mass.dataset") {
        let d: schemas::Dataset = schemas::decode_event(&ev).unwrap();
        let prov = String::from_utf8(l.get_blob(&Id(d.provenance.0)).unwrap()).unwrap();
        for line in prov.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let id: Id = v["rollout"].as_str().unwrap().parse().unwrap();
            assert_eq!(
                rollout(&l, id).status,
                "finished",
                "seed {seed}: line {line}"
            );
        }
    }
    drop(l);
    check_audit(&ledger, seed, &excluded_ids);
    seen
}

/// `mass report` and `mass why` name each excluded run and its reason.
fn check_audit(ledger: &Path, seed: u64, excluded: &BTreeSet<Id>) {
    let report = json(ledger, &["report", "smoke", "--json"]);
    let listed: BTreeSet<String> = report["cycles"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["excluded_runs"].as_array().unwrap().iter())
        .map(|x| {
            assert!(!x["reason"].as_str().unwrap().is_empty());
            x["rollout"].as_str().unwrap().to_string()
        })
        .collect();
    let want: BTreeSet<String> = excluded.iter().map(|i| i.to_hex()).collect();
    assert_eq!(listed, want, "seed {seed}: report's excluded runs");
    let text = String::from_utf8(ok(ledger, &["report", "smoke"]).stdout).unwrap();
    for id in excluded {
        assert!(
            text.contains(&format!("run {}", &id.to_hex()[..12])),
            "seed {seed}: the report text does not name run {}:\n{text}",
            id.short(12)
        );
        let w = json(ledger, &["why", &id.to_hex(), "--json"]);
        assert_eq!(
            w["selection"]["decision"], "excluded",
            "seed {seed}: why of an excluded run: {w}"
        );
        let status = w["rollout"]["status"].as_str().unwrap();
        if status != "finished" {
            let why = w["selection"]["why"].as_str().unwrap();
            assert!(why.starts_with(status), "seed {seed}: {why}");
        }
    }
}

#[test]
fn only_finished_runs_are_ranked_and_exclusions_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut halted, mut short) = (0, 0);
    for seed in [1, 2, 3, 4, 5, 6] {
        let dir = tmp.path().join(format!("seed-{seed}"));
        std::fs::create_dir_all(&dir).unwrap();
        let s = check_seed(&dir, seed);
        halted += s.halted;
        short += s.short;
    }
    // The limit bites: the checks above ran on halted runs and on short
    // selections, not only on full ones.
    assert!(halted > 0, "no collected run halted at max_turns = 3");
    assert!(short > 0, "no selection was short of finished runs");
}
