//! Every command that writes to standard output ends quietly when its reader
//! has gone (`mass report RUN --json | head`), as `mass log | head` always
//! did: exit 0 (or the code the command had decided before printing, e.g.
//! the sandboxed command's own), and no error, panic or "Broken pipe" on
//! stderr. Before: the JSON writers (`log`, `show`, `refs`, `runs RUN`,
//! `report`, `status`, `why`, `diff`, `verify`, `stats`, `rank` with
//! `--json`) and `export events --out /dev/stdout` printed "error: Broken
//! pipe (os error 32)" and exited 1, and every `println!` (`init`, `fork`,
//! `snapshot`, `demo`, `reindex`, `migrate`, `clone`, `replay --check`,
//! `export dataset`, `worker`, `status --workers`, `proxy`) panicked.
//!
//! Each command runs with its stdout on a pipe whose read end is closed
//! before the command starts, so its first write fails (EPIPE), however
//! little it prints; a control run first shows the command does print.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn mass(ledger: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mass"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("--ledger")
        .arg(ledger)
        .env_remove("MASS_LEDGER")
        .stdin(Stdio::null());
    c
}

/// `mass ARGS` with stdout on a pipe nobody reads: the read end is closed
/// before the child starts.
fn closed(ledger: &Path, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    mass(ledger)
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("mass runs")
}

/// `mass ARGS` as usual (the control): it succeeds and prints something.
fn prints(ledger: &Path, args: &[&str]) {
    let o = mass(ledger).args(args).output().expect("mass runs");
    assert!(
        o.status.success() && !o.stdout.is_empty(),
        "control `mass {}`: exit {:?}, stdout {} bytes, stderr:\n{}",
        args.join(" "),
        o.status.code(),
        o.stdout.len(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Exit `code`, and nothing on stderr that says something went wrong.
fn assert_quiet(o: &Output, args: &[&str], code: i32) {
    let err = String::from_utf8_lossy(&o.stderr);
    let what = args.join(" ");
    assert_eq!(o.status.code(), Some(code), "mass {what}:\n{err}");
    for bad in ["Broken pipe", "error", "panicked", "os error"] {
        assert!(!err.contains(bad), "mass {what} said {bad:?}:\n{err}");
    }
}

/// The control run, then the run with the reader gone: quiet, exit 0.
fn check(ledger: &Path, args: &[&str]) {
    prints(ledger, args);
    assert_quiet(&closed(ledger, args), args, 0);
}

/// A finished smoke run, shared read-only by the tests (commands that
/// write work on a copy), and ids in it.
struct Fixture {
    ledger: PathBuf,
    rollout: String,
    blob: String,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("broken_pipe");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("fixture dir");
        let ledger = dir.join("ledger");
        let o = mass(&ledger)
            .args(["run", "examples/smoke.toml", "--quiet"])
            .output()
            .expect("mass run");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let json = |args: &[&str]| -> serde_json::Value {
            let o = mass(&ledger).args(args).output().expect("mass");
            serde_json::from_slice(&o.stdout).expect("JSON")
        };
        let rollout = json(&["runs", "smoke", "--json"])[0]["event"]
            .as_str()
            .expect("a rollout")
            .to_string();
        let blob = json(&["log", "smoke", "--kind", "run.started", "--json"])[0]["payload"]
            ["config"]
            .as_str()
            .expect("run.started's config")
            .to_string();
        Fixture {
            ledger,
            rollout,
            blob,
        }
    })
}

/// A copy of the fixture's ledger, for a command that writes.
fn copy() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().expect("tempdir");
    let l = d.path().join("ledger");
    let st = Command::new("cp")
        .arg("-a")
        .arg(&fixture().ledger)
        .arg(&l)
        .status()
        .expect("cp");
    assert!(st.success());
    (d, l)
}

#[test]
fn reading_commands_end_quietly() {
    let f = fixture();
    let l = &f.ledger;
    let (r, b) = (f.rollout.as_str(), f.blob.as_str());
    for args in [
        &["log"][..],
        &["log", "--json"],
        &["log", "smoke", "--json"],
        &["show", "smoke"],
        &["show", "smoke", "--json"],
        &["cat", b],
        &["refs"],
        &["refs", "--json"],
        &["runs", "smoke"],
        &["runs", "smoke", "--json"],
        &["why", r],
        &["why", r, "--json"],
        &["report", "smoke"],
        &["report", "smoke", "--json"],
        &["status"],
        &["status", "smoke"],
        &["status", "--json"],
        &["diff", "smoke", "smoke"],
        &["diff", "smoke", "smoke", "--json"],
        &["verify", "--log-only"],
        &["verify", "--log-only", "--json"],
        &["stats"],
        &["stats", "--json"],
        &["export", "events", "smoke", "--out", "/dev/stdout"],
        &["export", "events", "--out", "/dev/stdout"],
        &["sandbox", "--probe"],
        &["--help"],
        &["--version"],
    ] {
        check(l, args);
    }
}

/// The lock-taking readers (`verify` checks the index, `replay --check`
/// drives the run), each on a copy so they do not wait for each other.
#[test]
fn verify_and_replay_check_end_quietly() {
    for args in [
        &["verify"][..],
        &["verify", "--json"],
        &["replay", "smoke", "--check"],
    ] {
        let (_d, l) = copy();
        check(&l, args);
    }
}

/// Commands that change something finish their work, then print; the
/// work is done although nobody read the report.
#[test]
fn writing_commands_do_their_work_and_end_quietly() {
    let t = tempfile::tempdir().expect("tempdir");
    let fresh = t.path().join("fresh");
    assert_quiet(&closed(&fresh, &["init"]), &["init"], 0);
    assert!(fresh.join("FORMAT").exists());
    let demo = t.path().join("demo");
    assert_quiet(&closed(&demo, &["demo"]), &["demo"], 0);
    let (_d, l) = copy();
    for args in [
        &["fork", "smoke", "--name", "longer", "--set", "cycles=2"][..],
        &["fork", "smoke", "--name", "plain-ref"],
        &["runs", "rm", "plain-ref"],
        &["snapshot", "examples/tasks"],
        &["reindex"],
        &["repair"],
        &["repair", "--json"],
        &[
            "remote",
            "add",
            "shelf",
            t.path().join("shelf").to_str().unwrap_or(""),
        ],
    ] {
        assert_quiet(&closed(&l, args), args, 0);
    }
    prints(&l, &["log", "longer"]);
    check(&l, &["remote", "list"]);
    check(&l, &["remote", "list", "--json"]);
    // Two trees: the example tasks and one task of them.
    let tree = |dir: &str| {
        let o = mass(&l).args(["snapshot", dir]).output().expect("mass");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let (a, b) = (tree("examples/tasks"), tree("examples/tasks/pha-hill-fit"));
    check(&l, &["diff", &a, &b]);
    check(&l, &["diff", &a, &b, "--json"]);
    let out = t.path().join("data/train.jsonl");
    let args = ["export", "dataset", "smoke", "--cycle", "1", "--out"];
    let mut args = args.to_vec();
    let out_s = out.to_string_lossy().to_string();
    std::fs::create_dir_all(t.path().join("data")).expect("mkdir");
    args.push(&out_s);
    assert_quiet(&closed(&l, &args), &args, 0);
    assert!(t.path().join("data/train.provenance.jsonl").exists());
}

/// Moving runs between ledgers through a folder remote.
#[test]
fn push_pull_clone_and_migrate_end_quietly() {
    let t = tempfile::tempdir().expect("tempdir");
    let (_d, l) = copy();
    let shelf = t.path().join("shelf");
    let shelf_s = shelf.to_string_lossy().to_string();
    assert_quiet(&closed(&l, &["push", &shelf_s]), &["push"], 0);
    assert_quiet(&closed(&l, &["pull", &shelf_s]), &["pull"], 0);
    let cloned = t.path().join("cloned");
    let args = ["clone", &shelf_s, cloned.to_str().unwrap_or("")];
    assert_quiet(&closed(&l, &args), &args, 0);
    prints(&cloned, &["refs"]);
    let old = Path::new(env!("CARGO_MANIFEST_DIR")).join("ledger/tests/fixtures/v1-ledger");
    let args = ["migrate", "--from", old.to_str().unwrap_or("")];
    let migrated = t.path().join("migrated");
    assert_quiet(&closed(&migrated, &args), &args, 0);
    prints(&migrated, &["refs"]);
}

/// Running cycles: the run is recorded whole, then the summary is lost.
#[test]
fn run_resume_and_rejudge_end_quietly() {
    let t = tempfile::tempdir().expect("tempdir");
    let l = t.path().join("ledger");
    let args = ["run", "examples/smoke.toml", "--quiet"];
    assert_quiet(&closed(&l, &args), &args, 0);
    let (_d, l) = copy();
    let args = ["fork", "smoke", "--name", "two", "--set", "cycles=2"];
    assert_quiet(&closed(&l, &args), &args, 0);
    let args = ["resume", "two", "--quiet"];
    assert_quiet(&closed(&l, &args), &args, 0);
    let args = ["rejudge", "smoke", "--name", "again", "--quiet"];
    assert_quiet(&closed(&l, &args), &args, 0);
    let o = mass(&l).args(["status", "two", "--json"]).output();
    let v: serde_json::Value = serde_json::from_slice(&o.expect("mass").stdout).expect("JSON");
    assert_eq!(v[0]["cycles_done"], 2, "{v}");
}

/// The sandbox passes the command's own exit code on, reader or not.
#[test]
fn sandbox_ends_quietly_with_the_commands_exit_code() {
    let t = tempfile::tempdir().expect("tempdir");
    let ws = t.path().join("ws");
    std::fs::create_dir_all(&ws).expect("mkdir");
    let ws = ws.to_string_lossy().to_string();
    let (_d, l) = copy();
    let base = ["sandbox", "--level", "none", "--workspace", &ws, "--"];
    let args = [&base[..], &["echo hello"]].concat();
    check(&l, &args);
    let args = [&base[..], &["echo hello; exit 3"]].concat();
    let o = closed(&l, &args);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("Broken pipe") && !err.contains("error"),
        "{err}"
    );
}

/// `mass worker` prints its tally when it stops, `mass status --workers`
/// the store's work.
#[test]
fn worker_and_status_workers_end_quietly() {
    let t = tempfile::tempdir().expect("tempdir");
    let store = t.path().join("store");
    std::fs::create_dir_all(&store).expect("mkdir");
    let store = store.to_string_lossy().to_string();
    let l = &fixture().ledger;
    let args = ["worker", &store, "--idle-exit", "0.2", "--name", "w"];
    assert_quiet(&closed(l, &args), &args, 0);
    check(l, &["status", "--workers", &store]);
}

/// `mass proxy` prints its URL and serves: with nobody reading the URL it
/// goes on serving (it is in --url-file too) and stops on SIGTERM as usual.
#[test]
fn proxy_serves_when_nobody_reads_its_url() {
    let t = tempfile::tempdir().expect("tempdir");
    let (_d, l) = copy();
    let url_file = t.path().join("url");
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut child = mass(&l)
        .args(["proxy", "--run", "smoke", "--stream", "p"])
        .args(["--upstream", "http://127.0.0.1:9/v1", "--url-file"])
        .arg(&url_file)
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("mass proxy");
    let start = Instant::now();
    while !url_file.exists() {
        if start.elapsed() > Duration::from_secs(30) || child.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let serving = url_file.exists() && child.try_wait().ok().flatten().is_none();
    // SAFETY: kill(2) on our own child, which is not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(serving, "the proxy did not serve:\n{err}");
    assert_quiet(&o, &["proxy"], 0);
}

/// `mass rank` reads a comparisons file.
#[test]
fn import_ends_quietly_and_imports() {
    let run = tempfile::tempdir().expect("tempdir");
    import::fixture::write_run(run.path(), &Default::default()).expect("fixture");
    let d = tempfile::tempdir().expect("tempdir");
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    let dir = run.path().to_str().expect("UTF-8 path");
    let args = ["import", "sakana", dir, "--name", "ref"];
    prints(&a, &args);
    // The second import's "nothing written", then a first import's summary.
    assert_quiet(&closed(&a, &args), &args, 0);
    assert_quiet(&closed(&b, &args), &args, 0);
    let o = mass(&b).args(["runs", "ref"]).output().expect("mass runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn rank_ends_quietly() {
    let t = tempfile::tempdir().expect("tempdir");
    let file = t.path().join("cmp.jsonl");
    let lines = [
        r#"{"a": "x", "b": "y", "winner": "a"}"#,
        r#"{"a": "y", "b": "z", "winner": "b"}"#,
        r#"{"a": "x", "b": "z", "winner": "tie"}"#,
    ];
    std::fs::write(&file, lines.join("\n")).expect("write");
    let file = file.to_string_lossy().to_string();
    let l = t.path().join("unused");
    check(&l, &["rank", &file]);
    check(&l, &["rank", &file, "--json"]);
}
