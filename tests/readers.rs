//! Readers alongside a writer: `status`, `log`, `show`, `refs`, `export` and
//! `verify --log-only` take no lock and change nothing, so they work while
//! `mass run` writes and on a copy of a ledger nobody may write to.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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

fn ok(ledger: &Path, args: &[&str]) -> String {
    let o = mass(ledger, args);
    assert!(
        o.status.success(),
        "mass {args:?} exited {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.insert(
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn status_and_log_work_while_mass_run_writes() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("ledger");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mass"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("--ledger")
        .arg(&l)
        .args(["run", "examples/quickstart.toml", "--quiet"])
        .env_remove("MASS_LEDGER")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut checked = 0;
    while start.elapsed() < Duration::from_secs(120) && checked < 5 {
        std::thread::sleep(Duration::from_millis(200));
        if !l.join("FORMAT").exists() {
            continue;
        }
        let refs = ok(&l, &["refs"]);
        if !refs.contains("quickstart") {
            continue;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before the readers could be checked"
        );
        let status = ok(&l, &["status", "quickstart"]);
        assert!(status.contains("quickstart"), "{status}");
        let log = ok(&l, &["log", "quickstart", "--limit", "3"]);
        assert!(!log.is_empty());
        ok(&l, &["verify", "--log-only"]);
        checked += 1;
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended before the readers could be checked"
    );
    assert_eq!(checked, 5, "readers were checked only {checked} times");
    // A writer still gets the lock error while the run holds the ledger.
    let o = mass(&l, &["snapshot", "examples"]);
    assert_eq!(o.status.code(), Some(6));
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn read_commands_change_nothing_in_a_ledger() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("ledger");
    ok(&l, &["demo"]);
    // A copy nobody writes to: no LOCK file, and none may appear.
    let copy = d.path().join("copy");
    std::fs::create_dir_all(copy.join("segments")).unwrap();
    std::fs::copy(l.join("FORMAT"), copy.join("FORMAT")).unwrap();
    for e in std::fs::read_dir(l.join("segments")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, copy.join("segments").join(p.file_name().unwrap())).unwrap();
    }
    let before = files(&copy);
    let log = ok(&copy, &["log", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&log).unwrap();
    let id = v[0]["id"].as_str().unwrap().to_string();
    ok(&copy, &["show", &id]);
    ok(&copy, &["refs"]);
    ok(&copy, &["status"]);
    ok(&copy, &["stats"]);
    ok(&copy, &["verify", "--log-only"]);
    let out = d.path().join("events.jsonl");
    ok(&copy, &["export", "events", "--out", out.to_str().unwrap()]);
    assert_eq!(files(&copy), before, "a read command wrote into the ledger");
    assert_eq!(
        ok(&copy, &["log"]),
        ok(&l, &["log"]),
        "the copy reads as the original"
    );
}
