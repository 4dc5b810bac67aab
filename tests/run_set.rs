//! `mass run FILE --set KEY=VALUE` (#31, part 5): overrides are checked as
//! `mass fork --set` checks them (a bad key or value exits 2 naming it,
//! before anything is written), applied before the experiment is recorded
//! (the run's definition is the overridden one, so resume and replay need
//! no flag), and a later `mass run FILE` of that run says how the file
//! differs instead of passing the recorded run off as the file's.

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
        .expect("mass runs")
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(ledger: &Path, args: &[&str]) -> Output {
    let o = mass(ledger, args);
    assert!(o.status.success(), "mass {}:\n{}", args.join(" "), err(&o));
    o
}

fn json(ledger: &Path, args: &[&str]) -> serde_json::Value {
    serde_json::from_slice(&ok(ledger, args).stdout).expect("JSON")
}

fn head(ledger: &Path, run: &str) -> String {
    json(ledger, &["log", run, "--limit", "1", "--json"])[0]["id"]
        .as_str()
        .expect("a head")
        .to_string()
}

/// The text of the blob an event of `stream` names in `payload.config`.
fn config_blob(ledger: &Path, stream: &str) -> String {
    let v = json(ledger, &["log", stream, "--json"]);
    let last = v.as_array().and_then(|a| a.last()).expect("an event");
    let id = last["payload"]["config"].as_str().expect("a config blob");
    String::from_utf8_lossy(&ok(ledger, &["cat", id]).stdout).into_owned()
}

#[test]
fn bad_overrides_are_refused_before_anything_is_written() {
    let d = tempfile::tempdir().expect("tempdir");
    let l = d.path().join("ledger");
    for (bad, named) in [
        ("no_such_key=1", "no_such_key"),
        ("inner.iterations=many", "inner.iterations"),
        ("outer.bogus=1", "outer.bogus"),
        ("cycles", "cycles"),
        ("=3", "=3"),
    ] {
        let o = mass(&l, &["run", "examples/smoke.toml", "--set", bad]);
        assert_eq!(o.status.code(), Some(2), "--set {bad}: {}", err(&o));
        assert!(err(&o).contains(named), "--set {bad}: {}", err(&o));
        assert!(!l.exists(), "--set {bad} created the ledger");
    }
    // A key given twice is refused as fork refuses it.
    let o = mass(
        &l,
        &[
            "run",
            "examples/smoke.toml",
            "--set",
            "cycles=2",
            "--set",
            "cycles=3",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("given twice"), "{}", err(&o));
    assert!(!l.exists());
}

#[test]
fn overrides_are_run_recorded_and_reproduced() {
    let d = tempfile::tempdir().expect("tempdir");
    let l = d.path().join("ledger");
    let sets = ["--set", "cycles=2", "--set", "inner.iterations=1"];
    let run = |extra: &[&str]| {
        let mut a = vec!["run", "examples/smoke.toml", "--quiet"];
        a.extend_from_slice(extra);
        mass(&l, &a)
    };
    let o = run(&[&sets[..], &["--set", "concurrency=3"]].concat());
    assert!(o.status.success(), "{}", err(&o));
    // Run with the values set: two cycles (smoke.toml says one).
    let st = json(&l, &["status", "smoke", "--json"]);
    assert_eq!(st[0]["cycles_planned"], 2, "{st}");
    assert_eq!(st[0]["cycles_done"], 2, "{st}");
    assert_eq!(st[0]["finished"], true, "{st}");
    // The definition run.started records is the overridden one; the
    // execution stream holds the experiment as given, overrides listed,
    // execution settings (concurrency) included.
    let def = config_blob(&l, "smoke");
    assert!(
        def.contains("cycles = 2") && def.contains("iterations = 1"),
        "{def}"
    );
    assert!(def.contains("concurrency = 1"), "{def}");
    let given = config_blob(&l, "smoke/execution");
    for s in [
        "--set \"cycles=2\"",
        "--set \"inner.iterations=1\"",
        "concurrency = 3",
    ] {
        assert!(given.contains(s), "{s}: {given}");
    }
    let out = String::from_utf8_lossy(&ok(&l, &["replay", "smoke", "--check"]).stdout).into_owned();
    assert!(out.contains("replay check passed"), "{out}");
    let want = head(&l, "smoke");

    // The same file and overrides: the run resumes (here: replays to its head).
    let o = run(&sets);
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("resuming"), "{}", err(&o));
    assert_eq!(head(&l, "smoke"), want);

    // The file alone gives another experiment: said, naming the keys, and
    // the run goes on as recorded (as for an edited file).
    let o = run(&[]);
    assert!(o.status.success(), "{}", err(&o));
    let e = err(&o);
    assert!(
        e.contains("another experiment") && e.contains("cycles, inner.iterations"),
        "{e}"
    );
    assert!(e.contains("--ref NEW"), "{e}");
    assert_eq!(head(&l, "smoke"), want);

    // Other overrides would be ignored: refused, nothing written.
    let refs = ok(&l, &["refs"]).stdout;
    let o = run(&["--set", "cycles=3"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    let e = err(&o);
    assert!(
        e.contains("would be ignored") && e.contains("nothing was written"),
        "{e}"
    );
    assert_eq!(ok(&l, &["refs"]).stdout, refs);

    // An execution setting set again to another value would be ignored
    // too (a resume executes as recorded): refused, naming it.
    let o = run(&[&sets[..], &["--set", "concurrency=2"]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    let e = err(&o);
    assert!(
        e.contains("concurrency") && e.contains("would be ignored"),
        "{e}"
    );
    assert_eq!(ok(&l, &["refs"]).stdout, refs);
    // The value it recorded is no change: the run goes on.
    let o = run(&[&sets[..], &["--set", "concurrency=3"]].concat());
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(head(&l, "smoke"), want);

    // Resume needs no flag: the recorded definition is the overridden one.
    ok(&l, &["resume", "smoke", "--quiet"]);
    assert_eq!(head(&l, "smoke"), want);
}
