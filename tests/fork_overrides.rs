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

#[test]
fn fork_overrides_are_validated_before_anything_is_written() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("ledger");
    let o = mass(&l, &["run", "examples/smoke.toml", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
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
