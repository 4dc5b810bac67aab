//! Places (#25, "paths never reach ids"): a command sees its workspace,
//! home and scratch at fixed paths whatever the host calls them, so two runs
//! in different host directories print the same; the host paths cannot be
//! named from inside; a writable directory inside a read-only one (a check
//! copy's `TMPDIR`) stays writable; and places that could not be made are
//! refused before anything starts. With the view switched off the two runs
//! print different paths: that is the protection the equality rests on.
//! Must run as root on a machine where `probe().check(Level::Full)` passes.

use sandbox::{command, prepare, probe, Layer, Level, Place, Policy, SandboxError};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn available() -> bool {
    let p = probe();
    p.root && p.check(Level::Full).is_ok()
}

/// One mass process's scratch root (0700) with a workspace (holding a
/// `.tmp`) and its home, named as the engine names them: a random part.
struct Scratch {
    _base: tempfile::TempDir,
    root: PathBuf,
    ws: PathBuf,
    home: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let base = tempfile::Builder::new()
            .prefix("places-")
            .tempdir_in("/tmp")
            .unwrap();
        let root = base
            .path()
            .join(format!("mass-work-{}", std::process::id()));
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        let tag = base
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let ws = root.join(format!("{tag}-0"));
        let home = root.join(format!("{tag}-0.home"));
        std::fs::create_dir_all(ws.join(".tmp")).unwrap();
        std::fs::write(ws.join("data.txt"), "same\n").unwrap();
        std::fs::create_dir(&home).unwrap();
        Scratch {
            _base: base,
            root,
            ws,
            home,
        }
    }

    /// The workspace writable (or read-only with its `.tmp` writable, as
    /// the checks run), the home writable, both placed under /tmp/mass.
    fn policy(&self, read_only: bool, off: &[Layer]) -> Policy {
        let mut p = Policy::new(Level::Full, &self.ws);
        if read_only {
            p.writable = vec![self.ws.join(".tmp")];
            p.readable.push(self.ws.clone());
        }
        p.writable.push(self.home.clone());
        p.hide = vec![self.root.clone(), PathBuf::from("/tmp")];
        p.places = vec![
            Place {
                path: self.ws.clone(),
                at: PathBuf::from("/tmp/mass/workspace"),
            },
            Place {
                path: self.home.clone(),
                at: PathBuf::from("/tmp/mass/home"),
            },
        ];
        p.unprotected = off.to_vec();
        p
    }
}

/// Runs `script` with bash in `s`'s workspace under `policy`, with HOME and
/// TMPDIR where the policy says the command finds them.
fn run(s: &Scratch, policy: &Policy, script: &str) -> (String, String) {
    prepare(policy).unwrap();
    let mut cmd: Command = command("bash", policy).unwrap();
    cmd.arg("-c")
        .arg(script)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", policy.seen(&s.home))
        .env("TMPDIR", policy.seen(&s.ws.join(".tmp")))
        .current_dir(&s.ws)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = cmd.spawn().unwrap().wait_with_output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What a curious agent prints about where it is.
const WHERE: &str = "pwd; echo \"home=$HOME tmp=$TMPDIR\"; (cd .. && pwd); \
                     python3 -c 'import os, tempfile; print(os.getcwd(), tempfile.gettempdir())'; \
                     readlink /proc/self/cwd; ls -A \"$HOME\"; cat data.txt";

#[test]
fn a_placed_workspace_is_seen_at_its_place_and_two_runs_print_the_same() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    let (a, b) = (Scratch::new(), Scratch::new());
    assert_ne!(a.ws, b.ws);
    let (out_a, err_a) = run(&a, &a.policy(false, &[]), WHERE);
    let (out_b, _) = run(&b, &b.policy(false, &[]), WHERE);
    assert_eq!(
        out_a,
        "/tmp/mass/workspace\nhome=/tmp/mass/home tmp=/tmp/mass/workspace/.tmp\n/tmp/mass\n\
         /tmp/mass/workspace /tmp/mass/workspace/.tmp\n/tmp/mass/workspace\nsame\n",
        "stderr: {err_a}"
    );
    assert_eq!(out_a, out_b, "two runs in different host directories");
}

#[test]
fn the_host_paths_cannot_be_named_and_writes_land_in_the_host_directories() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    let s = Scratch::new();
    let script = format!(
        "echo w > out.txt; echo h > \"$HOME/state\"; echo t > \"$TMPDIR/t\"; \
         for p in {ws} {home} {root} {parent}; do test -e \"$p\" && echo \"NAMED $p\"; done; \
         ls -A /tmp; ls -A /tmp/mass",
        ws = s.ws.display(),
        home = s.home.display(),
        root = s.root.display(),
        parent = s.root.parent().unwrap().display(),
    );
    let (out, err) = run(&s, &s.policy(false, &[]), &script);
    assert!(!out.contains("NAMED"), "host paths visible: {out}\n{err}");
    assert_eq!(
        std::fs::read_to_string(s.ws.join("out.txt")).unwrap(),
        "w\n"
    );
    assert_eq!(
        std::fs::read_to_string(s.home.join("state")).unwrap(),
        "h\n"
    );
    assert_eq!(std::fs::read_to_string(s.ws.join(".tmp/t")).unwrap(), "t\n");
    // /tmp holds the places only (Landlock refuses to list it at all).
    assert!(
        !out.contains("mass-work") && !out.contains("places-"),
        "{out}\n{err}"
    );
}

/// A check copy is read-only but its `TMPDIR` inside it is writable: the
/// read-only bind of the copy used to take the writable `.tmp` with it.
#[test]
fn a_writable_tmp_inside_a_read_only_workspace_stays_writable() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    for placed in [true, false] {
        let s = Scratch::new();
        let mut p = s.policy(true, &[]);
        if !placed {
            // The scratch root alone hidden, paths bound back where they are.
            p.places.clear();
            p.hide = vec![s.root.clone()];
        }
        let (out, err) = run(
            &s,
            &p,
            "echo t > \"$TMPDIR/t\" && echo TMP-OK; echo x > data.txt 2>/dev/null || echo WS-REFUSED",
        );
        assert_eq!(out, "TMP-OK\nWS-REFUSED\n", "placed={placed}: {err}");
        assert_eq!(
            std::fs::read_to_string(s.ws.join("data.txt")).unwrap(),
            "same\n"
        );
    }
}

/// The protection the equality rests on: without the view each run prints
/// its own host paths.
#[test]
fn switched_off_view_prints_host_paths() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    let (a, b) = (Scratch::new(), Scratch::new());
    let (out_a, _) = run(&a, &a.policy(false, &[Layer::View]), "pwd");
    let (out_b, _) = run(&b, &b.policy(false, &[Layer::View]), "pwd");
    assert_eq!(out_a.trim_end(), a.ws.display().to_string());
    assert_ne!(out_a, out_b);
}

#[test]
fn places_that_cannot_be_made_are_refused_before_anything_runs() {
    let s = Scratch::new();
    let refused = |p: &Policy| match command("true", p) {
        Err(SandboxError::PathUnusable { role, reason, .. }) => {
            assert_eq!(role, "placed");
            reason
        }
        other => panic!("expected a refusal, got {other:?}"),
    };
    let mut p = s.policy(false, &[]);
    p.places[0].at = PathBuf::from("/srv/workspace");
    assert!(refused(&p).contains("below a hidden directory"));
    let mut p = s.policy(false, &[]);
    p.places[0].path = s.root.join("elsewhere");
    assert!(refused(&p).contains("writable or readable path"));
    let mut p = s.policy(false, &[]);
    p.places[1].at = PathBuf::from("/tmp/mass/workspace/home");
    assert!(refused(&p).contains("overlap"));
    let mut p = s.policy(false, &[]);
    p.places[0].at = PathBuf::from("mass/workspace");
    assert!(refused(&p).contains("absolute"));
}

#[test]
fn seen_maps_paths_below_a_place_and_only_at_level_full() {
    let s = Scratch::new();
    let p = s.policy(false, &[]);
    assert_eq!(
        p.seen(&s.ws.join("a/b")),
        Path::new("/tmp/mass/workspace/a/b")
    );
    assert_eq!(p.seen(&s.home), Path::new("/tmp/mass/home"));
    assert_eq!(p.seen(Path::new("/usr/bin")), Path::new("/usr/bin"));
    let mut low = p.clone();
    low.level = Level::Landlock;
    assert_eq!(low.seen(&s.ws), s.ws);
}

/// A readable path that holds the scratch root (`harness.readable =
/// ["$TMPDIR"]` with TMPDIR=/tmp/build): once `/tmp` is covered, that path
/// is bound back whole, and with it every other rollout's workspace, unless
/// the scratch root is covered again inside it (attacker review). The
/// scratch root is traversable (0711) and the other rollout's file
/// world-readable, so only the view stands in the way.
#[test]
fn a_readable_path_holding_the_scratch_root_shows_no_other_rollout() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    let s = Scratch::new();
    let base = s.root.parent().unwrap().to_path_buf();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&s.root, std::fs::Permissions::from_mode(0o711)).unwrap();
    let other = s.root.join("ffff-1");
    std::fs::create_dir(&other).unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(other.join("secret"), "OTHER-ROLLOUT\n").unwrap();
    std::fs::set_permissions(other.join("secret"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(base.join("shared.txt"), "shared\n").unwrap();
    std::fs::set_permissions(
        base.join("shared.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let script = format!(
        "cat {b}/shared.txt; cat {o}/secret 2>/dev/null || echo NO-SECRET; \
         echo \"LS:$(ls {r} 2>/dev/null)\"; pwd; echo x > f && cat f",
        b = base.display(),
        o = other.display(),
        r = s.root.display()
    );
    let mut p = s.policy(false, &[]);
    p.readable.push(base.clone());
    let (out, err) = run(&s, &p, &script);
    assert!(
        out.starts_with("shared\n"),
        "the readable path: {out}\n{err}"
    );
    assert_eq!(
        out, "shared\nNO-SECRET\nLS:\n/tmp/mass/workspace\nx\n",
        "another rollout is visible: {err}"
    );
    // The guard is the view: without it the file is there to read.
    p.unprotected = vec![Layer::View];
    let (out, _) = run(&s, &p, &format!("cat {}/secret", other.display()));
    assert_eq!(out, "OTHER-ROLLOUT\n");
}
