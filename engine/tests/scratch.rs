//! Regression (#25): workspaces of a mass killed mid-run stayed in the
//! temp dir forever (a confined command orphaned with them kept writing
//! into one). A live run removes the scratch roots and server logs of
//! mass processes that no longer run, and only those (not one a live
//! process claimed).

use std::process::Command;

#[test]
fn stale_scratch_of_dead_processes_is_removed_and_live_ones_kept() {
    let tmp = std::env::temp_dir();
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let mut live = Command::new("sleep").arg("30").spawn().unwrap();
    let live_pid = live.id();
    let dirs = [
        (tmp.join(format!("mass-work-{dead_pid}")), false),
        (tmp.join(format!("mass-serve-{dead_pid}-sim")), false),
        (tmp.join(format!("mass-work-{live_pid}")), true),
        (tmp.join(format!("mass-work-{dead_pid}x")), true),
        // A dead process's root that a live one (`mass harness-replay` at
        // the recorded paths) claimed.
        (tmp.join(format!("mass-work-{dead_pid}-claimed")), true),
    ];
    for (d, _) in &dirs {
        std::fs::create_dir_all(d.join("ws/sub")).unwrap();
        std::fs::write(d.join("ws/sub/f"), b"left behind").unwrap();
    }
    std::fs::write(dirs[4].0.join(format!(".claimed-by-{live_pid}")), b"").unwrap();
    let removed = engine::harness::clean_stale_scratch();
    let mut kept = Vec::new();
    for (d, keep) in &dirs {
        assert_eq!(d.exists(), *keep, "{}", d.display());
        assert_eq!(removed.contains(d), !*keep, "{}", d.display());
        if *keep {
            kept.push(d.clone());
        }
    }
    for d in kept {
        std::fs::remove_dir_all(d).unwrap();
    }
    live.kill().unwrap();
    live.wait().unwrap();
}
