//! Checks at fixed paths (#25, "paths never reach ids"): a check finds its
//! task's checks folder at `/tmp/mass/checks` and its copy of the workspace
//! at `/tmp/mass/workspace`, so its recorded output names no host path; and
//! the suite's folder (every task's checks, with their expected values)
//! cannot be named at its host path, wherever the system temp dir is.

use engine::checks::run_on_tree;
use engine::task::Task;
use engine::tools::{BashOptions, Confinement};
use ledger::Ledger;

fn available() -> bool {
    let p = sandbox::probe();
    p.root && p.check(sandbox::Level::Full).is_ok()
}

/// A suite of two tasks in a directory outside /tmp; the first's check
/// prints where it runs and tries the suite's host paths.
fn suite(base: &std::path::Path) -> (Task, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let suite = base.join("suite");
    for t in ["one", "two"] {
        let d = suite.join(t);
        std::fs::create_dir_all(d.join("checks")).unwrap();
        std::fs::create_dir_all(d.join("files")).unwrap();
        std::fs::write(d.join("checks/expected.txt"), format!("{t}-EXPECTED\n")).unwrap();
    }
    let two = suite.join("two/checks/expected.txt");
    let one = suite.join("one/checks/expected.txt");
    std::fs::write(
        suite.join("one/task.toml"),
        format!(
            "id = \"one\"\ndomain = \"test\"\nsplit = \"train\"\ntitle = \"t\"\ndeliverables = [\"a.txt\"]\n\
             [[checks]]\nname = \"where\"\n\
             command = 'echo \"checks=$MASS_CHECKS cwd=$PWD $(pwd)\"; cat \"$MASS_CHECKS/expected.txt\"; \
             cat {} 2>/dev/null || echo NO-TWO; cat {} 2>/dev/null || echo NO-HOST-ONE'\n",
            two.display(),
            one.display()
        ),
    )
    .unwrap();
    std::fs::write(suite.join("one/prompt.md"), "do it\n").unwrap();
    for d in [base, &suite, &suite.join("one"), &suite.join("two")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (Task::load(&suite.join("one")).unwrap(), suite)
}

#[test]
fn a_check_sees_fixed_paths_and_never_the_suite_folder() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    // Outside /tmp, where covering /tmp alone would not hide the suite.
    let base = tempfile::Builder::new()
        .prefix("checks-paths-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let (task, _suite) = suite(base.path());
    let ledger = Ledger::init(&base.path().join("ledger")).unwrap();
    let ws = base.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "a\n").unwrap();
    let tree = ledger.snapshot_dir(&ws).unwrap();
    let opts = BashOptions {
        confinement: Confinement {
            level: sandbox::Level::Full,
            ..Default::default()
        },
        ..Default::default()
    };
    let scratch = std::env::temp_dir().join(format!("checks-paths-{}", std::process::id()));
    let out = run_on_tree(&ledger, &task, tree, &scratch, &opts).unwrap();
    assert_eq!(
        out,
        "checks=/tmp/mass/checks cwd=/tmp/mass/workspace /tmp/mass/workspace\n\
         one-EXPECTED\nNO-TWO\nNO-HOST-ONE\n"
    );
}
