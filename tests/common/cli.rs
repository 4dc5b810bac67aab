//! The `mass` binary as the run-folder tests drive it (tests/import_sakana.rs,
//! tests/rejudge_imported.rs): on a given ledger, with no `MASS_LEDGER`
//! from the caller and nothing on stdin, and its whole output in a failed
//! assertion (`text` also for the external-harness tests, through
//! tests/common/mod.rs).

use std::path::Path;
use std::process::{Command, Output, Stdio};

pub fn mass(ledger: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mass"))
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .env_remove("MASS_LEDGER")
        .stdin(Stdio::null())
        .output()
        .expect("mass runs")
}

pub fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The stdout of a command that must succeed.
pub fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}
