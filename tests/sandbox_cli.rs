//! `mass sandbox` runs one command as a rollout's `bash` would: confined to
//! its workspace, without the caller's secrets; `--probe` names the levels
//! this machine offers; a run records the level in force on its main stream.

use std::process::{Command, Output};

fn mass(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mass"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .env_remove("MASS_LEDGER")
        .env("OPENAI_API_KEY", "sk-planted-secret")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn probe_lists_every_level() {
    let o = mass(&["sandbox", "--probe"]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    for level in ["full", "landlock", "none"] {
        assert!(t.contains(&format!("level {level}")), "{t}");
    }
}

#[test]
fn a_command_is_confined_to_its_workspace() {
    let d = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    // The sandbox user must be able to reach the workspace.
    std::fs::set_permissions(
        d.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let ws = d.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let outside = d.path().join("outside.txt");
    std::fs::write(&outside, "keep").unwrap();
    let w = ws.to_str().unwrap();
    // Writing in the workspace works (control).
    let o = mass(&[
        "sandbox",
        "--workspace",
        w,
        "--",
        "echo ok > in.txt && cat in.txt",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(ws.join("in.txt")).unwrap(), "ok\n");
    // Each escape is blocked (non-zero exit) and changes nothing outside.
    let escapes = [
        "cat /etc/shadow".to_string(),
        format!("echo gone > {}", outside.display()),
        "echo gone > ../outside.txt".to_string(),
        "test -z \"$OPENAI_API_KEY\" && exit 9".to_string(),
        "ls /root".to_string(),
    ];
    for cmd in &escapes {
        let o = mass(&["sandbox", "--workspace", w, "--", cmd]);
        assert!(!o.status.success(), "{cmd}: {}", text(&o));
        assert!(
            text(&o).contains("[sandbox level full"),
            "{cmd}: {}",
            text(&o)
        );
    }
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
    // The secret is absent, not just empty-looking: exit 9 above means the
    // variable was unset inside.
    let o = mass(&["sandbox", "--workspace", w, "--", "env"]);
    assert!(!text(&o).contains("sk-planted-secret"), "{}", text(&o));
    // Unknown levels are usage errors.
    let o = mass(&[
        "sandbox",
        "--workspace",
        w,
        "--level",
        "bogus",
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn a_run_records_the_sandbox_level_in_force() {
    let d = tempfile::tempdir().unwrap();
    let l = d.path().join("l");
    let l = l.to_str().unwrap();
    let o = mass(&["--ledger", l, "run", "examples/smoke.toml", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = mass(&["--ledger", l, "log", "smoke", "--kind", "note", "--json"]);
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("sandbox: level full"), "{t}");
}
