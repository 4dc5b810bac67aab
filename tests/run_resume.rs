//! `mass run` killed with SIGKILL at random moments and resumed each time ends
//! with the same ids as an uninterrupted run; `mass replay --check` then passes.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

fn mass(ledger: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mass"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("--ledger")
        .arg(ledger)
        .env_remove("MASS_LEDGER");
    c
}

fn head(ledger: &Path, run: &str) -> String {
    let o = mass(ledger).args(["refs", "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == run)
        .map(|r| r["head"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

#[test]
fn killed_and_resumed_run_matches_an_uninterrupted_one() {
    let d = tempfile::tempdir().unwrap();
    let reference = d.path().join("reference");
    let o = mass(&reference)
        .args(["run", "examples/smoke.toml", "--quiet"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = head(&reference, "smoke");
    assert_eq!(want.len(), 64);

    let crashed = d.path().join("crashed");
    let mut rng: u64 = 0x6a09_e667;
    let mut kills = 0;
    for round in 0..6 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let delay = Duration::from_millis(150 + (rng >> 33) % 900);
        let mut cmd = mass(&crashed);
        if round == 0 {
            cmd.args(["run", "examples/smoke.toml", "--quiet"]);
        } else {
            cmd.args(["resume", "smoke", "--quiet"]);
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            kills += 1;
        }
        child.wait().unwrap();
    }
    assert!(kills >= 3, "only {kills} kills landed");
    let o = mass(&crashed)
        .args(["resume", "smoke", "--quiet"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "final resume failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        head(&crashed, "smoke"),
        want,
        "the resumed run ends at the uninterrupted run's head"
    );
    let o = mass(&crashed)
        .args(["replay", "smoke", "--check"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("replay check passed"));
    let o = mass(&crashed).args(["verify"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

#[test]
fn status_and_dataset_export_work_on_a_finished_run() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("l");
    assert!(mass(&l)
        .args(["run", "examples/smoke.toml", "--quiet"])
        .status()
        .unwrap()
        .success());
    let o = mass(&l).args(["status", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["run"], "smoke");
    assert_eq!(v[0]["finished"], true);
    assert_eq!(v[0]["cycles_done"], 1);
    for fmt in ["openai", "trl"] {
        let out = d.path().join(format!("{fmt}.jsonl"));
        let o = mass(&l)
            .args([
                "export", "dataset", "smoke", "--cycle", "1", "--format", fmt, "--out",
            ])
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.lines().count() > 0);
        assert!(d.path().join(format!("{fmt}.validation.jsonl")).exists());
    }
    let o = mass(&l)
        .args(["export", "dataset", "smoke", "--cycle", "9", "--out"])
        .arg(d.path().join("x.jsonl"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no dataset for cycle 9"));
}

/// Ctrl-C during a run prints that nothing recorded is lost and how to
/// continue, ends the process by SIGINT as usual, and `mass resume` then
/// finishes the run with the same head as an uninterrupted one.
#[test]
fn ctrl_c_says_how_to_resume_and_the_resumed_run_matches() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    let d = tempfile::tempdir().unwrap();
    let reference = d.path().join("reference");
    let o = mass(&reference)
        .args(["run", "examples/smoke.toml", "--quiet"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = head(&reference, "smoke");
    let l = d.path().join("interrupted");
    let mut child = mass(&l)
        .args(["run", "examples/smoke.toml"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    // Interrupt once the first stage is done (progress lines: stderr is a pipe).
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen.push_str(&line);
        if line.contains(": done, ") {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            break;
        }
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    seen.push_str(&rest);
    let status = child.wait().unwrap();
    if status.success() {
        // The run finished before the signal landed: nothing to check.
        return;
    }
    assert_eq!(status.signal(), Some(libc::SIGINT), "{seen}");
    assert!(
        seen.contains("interrupted: run smoke stops here") && seen.contains("`mass resume smoke`"),
        "{seen}"
    );
    let o = mass(&l)
        .args(["resume", "smoke", "--quiet"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(head(&l, "smoke"), want);
}
