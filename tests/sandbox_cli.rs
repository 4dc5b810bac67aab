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

/// The levels `mass sandbox --probe` says this machine offers.
fn available_levels() -> Vec<String> {
    let o = mass(&["sandbox", "--probe"]);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("level "))
        .filter(|l| l.trim_end().ends_with(" available"))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// A workspace the sandbox user can reach (level full runs commands as
/// another uid when mass runs as root).
fn reachable_workspace() -> (tempfile::TempDir, String) {
    let d = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(
        d.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let ws = d.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let w = ws.to_str().unwrap().to_string();
    (d, w)
}

/// Regression (#31, part 5): `mass sandbox -- python3 -c "print('x')"`
/// joined its arguments unquoted into one bash line, so python3 got
/// `print(x)` (or bash a syntax error). Several arguments now reach the
/// program byte for byte: quotes, spaces, `$`, backslashes, newlines,
/// globs, an empty string; one argument is still a shell line.
#[test]
fn several_arguments_reach_the_program_as_given() {
    let levels = available_levels();
    assert!(
        levels.iter().any(|l| l == "none"),
        "level none is always available: {levels:?}"
    );
    let (_d, w) = reachable_workspace();
    let args = [
        "it's",
        "say \"hi\"",
        "two  words",
        "$HOME",
        "back\\slash",
        "line\nbreak",
        "",
        "*",
        "a;b|c&&d",
        "`id` $(id)",
    ];
    let expected: String = args.iter().map(|a| format!("[{a}]\n")).collect();
    for level in &levels {
        let base = ["sandbox", "--level", level, "--workspace", &w, "--"];
        let direct = [&base[..], &["printf", "[%s]\\n"], &args[..]].concat();
        let o = mass(&direct);
        assert!(o.status.success(), "level {level}: {}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            expected,
            "level {level}"
        );
        // Through `sh -c` and "$@": each argument arrives as one.
        let script = "printf '[%s]\\n' \"$@\"";
        let via_sh = [&base[..], &["sh", "-c", script, "sh"], &args[..]].concat();
        let o = mass(&via_sh);
        assert!(o.status.success(), "level {level}: {}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            expected,
            "level {level}"
        );
        // One argument stays a shell line: the pipe is the shell's.
        let o = mass(&[&base[..], &["printf 'a\\nb\\n' | wc -l"]].concat());
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            "2",
            "{}",
            text(&o)
        );
    }
    let python = Command::new("python3").arg("-c").arg("0").output();
    if !python.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped the python3 case: no python3 on this machine");
        return;
    }
    let o = mass(&[
        "sandbox",
        "--level",
        "none",
        "--workspace",
        &w,
        "--",
        "python3",
        "-c",
        "print('x')",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "x\n");
}
