//! `mass push`, `pull` and `clone` through the binary, against a folder and
//! against a real S3-compatible server (moto, started by scripts/test.sh
//! through scripts/s3-server.sh; those tests are `#[ignore]`d without
//! `MASS_S3_ENDPOINT`). Each suite: a two-cycle run pushed, cloned, verified
//! and replayed away from its directory; the push SIGKILLed before every
//! write it makes and at random moments, the pull at random moments, then
//! completed; a corrupted pack detected; a planted secret absent from every
//! object and output; bad locations refused with nothing written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const SECRET: &str = "mass-planted-secret-7f3a9c1e5b";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn mass_in(cwd: &Path, ledger: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mass"));
    c.current_dir(cwd)
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .env_remove("MASS_LEDGER");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Where runs are pushed: a folder, or a bucket on the S3 server.
#[derive(Clone)]
enum Target {
    Folder(PathBuf),
    S3 { bucket: String },
}

impl Target {
    fn url(&self) -> String {
        match self {
            Target::Folder(p) => p.to_string_lossy().into_owned(),
            Target::S3 { bucket } => format!("s3://{bucket}/team/runs"),
        }
    }

    /// Every stored file: key and bytes.
    fn files(&self) -> Vec<(String, Vec<u8>)> {
        match self {
            Target::Folder(p) => walk(p)
                .into_iter()
                .map(|f| (f.to_string_lossy().into_owned(), std::fs::read(&f).unwrap()))
                .collect(),
            Target::S3 { bucket } => {
                let dir = tempfile::tempdir().unwrap();
                s3_py(&format!(
                    "import boto3,os\ns=boto3.client('s3',endpoint_url=os.environ['AWS_ENDPOINT'])\nfor p in s.get_paginator('list_objects_v2').paginate(Bucket='{bucket}'):\n  for o in p.get('Contents',[]):\n    d=os.path.join('{dir}',o['Key'])\n    os.makedirs(os.path.dirname(d),exist_ok=True)\n    s.download_file('{bucket}',o['Key'],d)\n",
                    dir = dir.path().display()
                ));
                walk(dir.path())
                    .into_iter()
                    .map(|f| (f.to_string_lossy().into_owned(), std::fs::read(&f).unwrap()))
                    .collect()
            }
        }
    }

    /// A location beside this one holding a file that is not ours.
    fn with_foreign_file(&self) -> String {
        match self {
            Target::Folder(p) => {
                let dir = p.with_extension("foreign");
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join("precious.csv"), "a,b\n").unwrap();
                dir.to_string_lossy().into_owned()
            }
            Target::S3 { bucket } => {
                s3_py(&format!("import boto3,os\nboto3.client('s3',endpoint_url=os.environ['AWS_ENDPOINT']).put_object(Bucket='{bucket}',Key='other/precious.csv',Body=b'a,b')\n"));
                format!("s3://{bucket}/other")
            }
        }
    }

    /// Flips one byte in the middle of the first pack on the store.
    fn corrupt_a_pack(&self) {
        match self {
            Target::Folder(p) => {
                let pack = walk(p).into_iter().find(|f| f.extension().is_some_and(|e| e == "pack")).unwrap();
                let mut b = std::fs::read(&pack).unwrap();
                let mid = b.len() / 2;
                b[mid] ^= 1;
                std::fs::write(&pack, b).unwrap();
            }
            Target::S3 { bucket } => s3_py(&format!(
                "import boto3,os\ns=boto3.client('s3',endpoint_url=os.environ['AWS_ENDPOINT'])\nk=[o['Key'] for o in s.list_objects_v2(Bucket='{bucket}')['Contents'] if o['Key'].endswith('.pack')][0]\nb=bytearray(s.get_object(Bucket='{bucket}',Key=k)['Body'].read())\nb[len(b)//2]^=1\ns.put_object(Bucket='{bucket}',Key=k,Body=bytes(b))\n"
            )),
        }
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn s3_py(code: &str) {
    let py = std::env::var("MASS_S3_PYTHON").expect("MASS_S3_PYTHON (scripts/s3-server.sh start)");
    let o = Command::new(py).arg("-c").arg(code).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

fn new_bucket(name: &str) -> Target {
    let bucket = format!(
        "{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            % 1_000_000_000
    );
    s3_py(&format!("import boto3,os\nboto3.client('s3',endpoint_url=os.environ['AWS_ENDPOINT']).create_bucket(Bucket='{bucket}')\n"));
    Target::S3 { bucket }
}

/// A two-cycle run `smoke` (examples/smoke.toml with `cycles = 2`).
fn two_cycle_run(dir: &Path) -> PathBuf {
    let exp = std::fs::read_to_string(root().join("examples/smoke.toml")).unwrap();
    let tasks = root().join("examples/tasks");
    let exp = exp.replace("\ncycles = 1", "\ncycles = 2").replace(
        "tasks_dir = \"tasks\"",
        &format!("tasks_dir = {:?}", tasks.to_str().unwrap()),
    );
    assert!(exp.contains("cycles = 2"));
    let file = dir.join("smoke2.toml");
    std::fs::write(&file, exp).unwrap();
    let l = dir.join("origin-ledger");
    let o = mass_in(dir, &l, &["run", file.to_str().unwrap(), "--quiet"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    l
}

fn refs_of(l: &Path) -> String {
    let o = mass_in(Path::new("/"), l, &["refs"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A clone into a fresh directory, checked: refs as the origin's, verify
/// clean, replay exact (from a directory with no tasks in it).
fn clone_and_check(target: &Target, origin: &Path, away: &Path, env: &[(&str, &str)]) {
    let dst = away.join(format!(
        "clone-{}",
        std::process::id() as u128 + Instant::now().elapsed().as_nanos()
    ));
    let _ = std::fs::remove_dir_all(&dst);
    let o = mass_in(
        away,
        Path::new("unused"),
        &["clone", &target.url(), dst.to_str().unwrap(), "--quiet"],
        env,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(refs_of(origin), refs_of(&dst));
    let o = mass_in(away, &dst, &["verify"], env);
    assert!(o.status.success(), "{}", text(&o));
    let o = mass_in(away, &dst, &["replay", "smoke", "--check"], env);
    assert!(
        o.status.success() && text(&o).contains("replay check passed"),
        "{}",
        text(&o)
    );
    let report = |l: &Path| text(&mass_in(away, l, &["report", "smoke", "--json"], env));
    assert_eq!(report(origin), report(&dst));
    std::fs::remove_dir_all(&dst).unwrap();
}

/// A lazy clone: much smaller, and `show`, `why`, `report` and `replay
/// --check` give what they give on the origin, fetching blobs on demand;
/// then a full pull fills it in.
fn lazy_clone_reads_like_the_origin(
    target: &Target,
    origin: &Path,
    away: &Path,
    env: &[(&str, &str)],
) {
    let lazy = away.join("lazy");
    let o = mass_in(
        away,
        Path::new("unused"),
        &[
            "clone",
            &target.url(),
            lazy.to_str().unwrap(),
            "--lazy",
            "--quiet",
        ],
        env,
    );
    assert!(
        o.status.success() && text(&o).contains("lazy"),
        "{}",
        text(&o)
    );
    let size = |l: &Path| {
        walk(&l.join("segments"))
            .iter()
            .map(|f| std::fs::metadata(f).unwrap().len())
            .sum::<u64>()
    };
    assert!(
        size(&lazy) * 2 < size(origin),
        "a lazy clone ({} B) should hold far less than the origin ({} B)",
        size(&lazy),
        size(origin)
    );
    let o = mass_in(away, &lazy, &["verify"], env);
    assert!(
        o.status.success() && text(&o).contains("partial ledger: "),
        "{}",
        text(&o)
    );
    let same = |args: &[&str]| {
        let here = mass_in(away, &lazy, args, env);
        let there = mass_in(away, origin, args, env);
        assert!(here.status.success(), "{args:?}: {}", text(&here));
        assert_eq!(
            String::from_utf8_lossy(&here.stdout),
            String::from_utf8_lossy(&there.stdout),
            "{args:?}"
        );
    };
    same(&["report", "smoke", "--json"]);
    let runs = mass_in(away, origin, &["runs", "smoke", "--json"], env);
    let rollouts: serde_json::Value = serde_json::from_slice(&runs.stdout).unwrap();
    let first = rollouts[0]["event"].as_str().unwrap().to_string();
    same(&["why", &first, "--json"]);
    // A blob only the remote holds, by abbreviation.
    let blob = mass_in(away, origin, &["show", &first, "--json"], env);
    let ev: serde_json::Value = serde_json::from_slice(&blob.stdout).unwrap();
    let blob_id = ev["refs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .find(|r| {
            let o = mass_in(away, origin, &["show", r, "--json"], env);
            String::from_utf8_lossy(&o.stdout).contains("\"kind\": \"blob\"")
        });
    if let Some(b) = blob_id {
        same(&["cat", &b[..12]]);
    }
    let o = mass_in(away, &lazy, &["replay", "smoke", "--check"], env);
    assert!(
        o.status.success() && text(&o).contains("replay check passed"),
        "{}",
        text(&o)
    );
    let o = mass_in(away, &lazy, &["pull", "--quiet"], env);
    assert!(o.status.success(), "{}", text(&o));
    let o = mass_in(away, &lazy, &["verify"], env);
    assert!(
        o.status.success() && !text(&o).contains("partial ledger: "),
        "a full pull left blobs out: {}",
        text(&o)
    );
    std::fs::remove_dir_all(&lazy).unwrap();
}

fn push(target: &Target, origin: &Path, env: &[(&str, &str)]) -> Output {
    mass_in(
        Path::new("/"),
        origin,
        &["push", &target.url(), "--quiet"],
        env,
    )
}

fn round_trip(target: Target, env: &[(&str, &str)]) {
    let d = tempfile::tempdir().unwrap();
    let origin = two_cycle_run(d.path());
    let o = push(&target, &origin, env);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("smoke: updated"), "{}", text(&o));
    let away = tempfile::tempdir().unwrap();
    clone_and_check(&target, &origin, away.path(), env);
    lazy_clone_reads_like_the_origin(&target, &origin, away.path(), env);
    // A second push finds nothing to send.
    let o = push(&target, &origin, env);
    assert!(
        text(&o).contains("0 object(s) in 0 pack(s)") && text(&o).contains("up to date"),
        "{}",
        text(&o)
    );
}

/// The push killed before each of its writes (small packs, so there are
/// many), then completed; the remote is consistent at every stop.
fn killed_push_completes(make_target: &dyn Fn(usize) -> Target, env: &[(&str, &str)]) {
    let d = tempfile::tempdir().unwrap();
    let origin = two_cycle_run(d.path());
    let mut env = env.to_vec();
    env.push(("MASS_REMOTE_PACK_BYTES", "150000"));
    let mut n = 1;
    loop {
        let target = make_target(n);
        let at = n.to_string();
        let mut killing = env.clone();
        killing.push(("MASS_REMOTE_KILL_AT_WRITE", &at));
        let o = push(&target, &origin, &killing);
        if o.status.success() {
            assert!(n > 6, "a push of several packs makes more than {n} writes");
            break;
        }
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(o.status.signal(), Some(9), "write {n}: {}", text(&o));
        // Whatever survived reads as a remote without the run, or not at all.
        let probe = d.path().join(format!("probe-{n}"));
        let o = mass_in(
            d.path(),
            Path::new("unused"),
            &["clone", &target.url(), probe.to_str().unwrap(), "--quiet"],
            &env,
        );
        assert!(
            !o.status.success() || refs_of(&probe).is_empty(),
            "write {n}: a clone of a half-pushed run succeeded: {}",
            text(&o)
        );
        assert!(
            !probe.exists() || refs_of(&probe).is_empty(),
            "write {n}: a failed clone left {}",
            probe.display()
        );
        let o = push(&target, &origin, &env);
        assert!(o.status.success(), "write {n}, pushed again: {}", text(&o));
        clone_and_check(&target, &origin, d.path(), &env);
        n += 1;
    }
}

/// SIGKILL at a random moment of a push and of a pull, for several seeds,
/// then both run again to the end.
fn killed_at_random_moments(make_target: &dyn Fn(usize) -> Target, env: &[(&str, &str)]) {
    let d = tempfile::tempdir().unwrap();
    let origin = two_cycle_run(d.path());
    let mut env = env.to_vec();
    env.push(("MASS_REMOTE_PACK_BYTES", "150000"));
    let t0 = Instant::now();
    let o = push(&make_target(0), &origin, &env);
    assert!(o.status.success(), "{}", text(&o));
    let full = t0.elapsed();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for seed in 1..=6 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let wait = Duration::from_micros(rng % (full.as_micros() as u64 + 1));
        let target = make_target(seed);
        let mut c = Command::new(env!("CARGO_BIN_EXE_mass"));
        c.arg("--ledger")
            .arg(&origin)
            .args(["push", &target.url(), "--quiet"])
            .env_remove("MASS_LEDGER");
        for (k, v) in &env {
            c.env(k, v);
        }
        let mut child = c
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(wait);
        let _ = child.kill();
        let _ = child.wait();
        let o = push(&target, &origin, &env);
        assert!(o.status.success(), "seed {seed}: {}", text(&o));
        // A pull killed at a random moment, then run again.
        let dst = d.path().join(format!("pulled-{seed}"));
        let o = mass_in(d.path(), &dst, &["init"], &env);
        assert!(o.status.success());
        let mut c = Command::new(env!("CARGO_BIN_EXE_mass"));
        c.arg("--ledger")
            .arg(&dst)
            .args(["pull", &target.url(), "--quiet"])
            .env_remove("MASS_LEDGER");
        for (k, v) in &env {
            c.env(k, v);
        }
        let mut child = c
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(wait);
        let _ = child.kill();
        let _ = child.wait();
        let o = mass_in(d.path(), &dst, &["verify"], &env);
        assert!(
            o.status.success(),
            "seed {seed}: a killed pull left damage: {}",
            text(&o)
        );
        let o = mass_in(d.path(), &dst, &["pull", &target.url(), "--quiet"], &env);
        assert!(o.status.success(), "seed {seed}: {}", text(&o));
        assert_eq!(refs_of(&origin), refs_of(&dst), "seed {seed}");
    }
}

/// A corrupted pack is refused on clone (no directory left) and on pull
/// (nothing written); bad locations are refused with their exit codes.
fn bad_input(target: Target, env: &[(&str, &str)]) {
    let d = tempfile::tempdir().unwrap();
    let origin = two_cycle_run(d.path());
    assert!(push(&target, &origin, env).status.success());
    target.corrupt_a_pack();
    let dst = d.path().join("clone");
    let o = mass_in(
        d.path(),
        Path::new("unused"),
        &["clone", &target.url(), dst.to_str().unwrap()],
        env,
    );
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains("corrupt remote file") && text(&o).contains(".pack"),
        "{}",
        text(&o)
    );
    assert!(!dst.exists(), "a failed clone left {}", dst.display());
    let mine = d.path().join("mine");
    assert!(mass_in(d.path(), &mine, &["init"], env).status.success());
    let o = mass_in(d.path(), &mine, &["pull", &target.url()], env);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(refs_of(&mine).is_empty());

    let o = mass_in(d.path(), &origin, &["push", "ftp://example.com/x"], env);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let empty = d.path().join("nothing-here");
    let o = mass_in(
        d.path(),
        Path::new("unused"),
        &["clone", empty.to_str().unwrap(), dst.to_str().unwrap()],
        env,
    );
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("is not a mass remote"), "{}", text(&o));
    assert!(!dst.exists());
    let o = mass_in(
        d.path(),
        &origin,
        &["push", &target.url(), "no-such-run"],
        env,
    );
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));

    // A location holding someone else's data is not taken over.
    let foreign = target.with_foreign_file();
    let o = mass_in(d.path(), &origin, &["push", &foreign, "--quiet"], env);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("precious.csv"), "{}", text(&o));
    // A clone never removes what it did not create (a symlink named DIR).
    let link = d.path().join("link");
    std::os::unix::fs::symlink(d.path().join("nowhere"), &link).unwrap();
    let o = mass_in(
        d.path(),
        Path::new("unused"),
        &["clone", &target.url(), link.to_str().unwrap()],
        env,
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        link.symlink_metadata().is_ok(),
        "the clone removed the user's symlink"
    );
}

/// A secret in the environment (the store's key, as a user has it) and in
/// a URL someone pasted: absent from every stored byte and every output.
fn secret_stays(target: Target, env: &[(&str, &str)]) {
    let d = tempfile::tempdir().unwrap();
    let origin = two_cycle_run(d.path());
    let mut env = env.to_vec();
    env.push(("AWS_SECRET_ACCESS_KEY", SECRET));
    env.push(("MASS_TEST_PLANTED", SECRET));
    let mut outputs = Vec::new();
    outputs.push(push(&target, &origin, &env));
    let dst = d.path().join("clone");
    outputs.push(mass_in(
        d.path(),
        Path::new("unused"),
        &["clone", &target.url(), dst.to_str().unwrap()],
        &env,
    ));
    assert!(
        outputs.iter().all(|o| o.status.success()),
        "{}",
        outputs.iter().map(text).collect::<String>()
    );
    let with_key = format!("s3://AKIAEXAMPLE:{SECRET}@bucket/x");
    outputs.push(mass_in(d.path(), &origin, &["push", &with_key], &env));
    outputs.push(mass_in(
        d.path(),
        &origin,
        &["remote", "add", "leaky", &with_key],
        &env,
    ));
    outputs.push(mass_in(
        d.path(),
        &origin,
        &["push", &format!("s3://bucket/x?X-Amz-Signature={SECRET}")],
        &env,
    ));
    assert!(
        outputs[2..].iter().all(|o| o.status.code() == Some(2)),
        "{}",
        outputs.iter().map(text).collect::<String>()
    );
    for o in &outputs {
        assert!(
            !text(o).contains(SECRET),
            "the secret was printed: {}",
            text(o)
        );
    }
    for (key, bytes) in target.files() {
        assert!(
            !String::from_utf8_lossy(&bytes).contains(SECRET),
            "the secret is in {key} on the store"
        );
    }
    for f in walk(&dst).into_iter().chain(walk(&origin)) {
        assert!(
            !String::from_utf8_lossy(&std::fs::read(&f).unwrap()).contains(SECRET),
            "the secret is in {}",
            f.display()
        );
    }
}

fn folder(d: &tempfile::TempDir, n: usize) -> Target {
    Target::Folder(d.path().join(format!("store-{n}")))
}

#[test]
fn folder_remote_push_clone_verify_and_replay_away_from_the_origin() {
    let d = tempfile::tempdir().unwrap();
    round_trip(folder(&d, 0), &[]);
}

#[test]
fn folder_remote_push_killed_before_every_write_then_completed() {
    let d = tempfile::tempdir().unwrap();
    killed_push_completes(&|n| folder(&d, n), &[]);
}

#[test]
fn folder_remote_push_and_pull_killed_at_random_moments_then_completed() {
    let d = tempfile::tempdir().unwrap();
    killed_at_random_moments(&|n| folder(&d, n), &[]);
}

#[test]
fn folder_remote_corrupt_pack_and_bad_locations_are_refused() {
    let d = tempfile::tempdir().unwrap();
    bad_input(folder(&d, 0), &[]);
}

#[test]
fn folder_remote_planted_secret_is_nowhere() {
    let d = tempfile::tempdir().unwrap();
    secret_stays(folder(&d, 0), &[]);
}

fn s3_env() -> Vec<(&'static str, &'static str)> {
    assert!(
        std::env::var("MASS_S3_ENDPOINT").is_ok(),
        "start the S3 server: eval \"$(scripts/s3-server.sh start | sed 's/^/export /')\""
    );
    Vec::new()
}

#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_remote_push_clone_verify_and_replay_away_from_the_origin() {
    let env = s3_env();
    round_trip(new_bucket("roundtrip"), &env);
}

#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_remote_push_killed_before_every_write_then_completed() {
    let env = s3_env();
    killed_push_completes(&|n| new_bucket(&format!("kill{n}")), &env);
}

#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_remote_push_and_pull_killed_at_random_moments_then_completed() {
    let env = s3_env();
    killed_at_random_moments(&|n| new_bucket(&format!("random{n}")), &env);
}

#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_remote_corrupt_pack_and_bad_locations_are_refused() {
    let env = s3_env();
    bad_input(new_bucket("corrupt"), &env);
}

#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_remote_planted_secret_is_nowhere() {
    let env = s3_env();
    secret_stays(new_bucket("secret"), &env);
}

#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_remote_two_writers_racing_on_one_run_exactly_one_wins() {
    let env = s3_env();
    let d = tempfile::tempdir().unwrap();
    let origin = two_cycle_run(d.path());
    for round in 0..4 {
        let target = new_bucket(&format!("race{round}"));
        assert!(push(&target, &origin, &env).status.success());
        // Two clones that each move the run their own way (a note appended
        // to its main stream), then push at once.
        let mut heads = Vec::new();
        let mut children = Vec::new();
        for w in 0..2 {
            let dst = d.path().join(format!("w{round}-{w}"));
            let o = mass_in(
                d.path(),
                Path::new("unused"),
                &["clone", &target.url(), dst.to_str().unwrap(), "--quiet"],
                &env,
            );
            assert!(o.status.success(), "{}", text(&o));
            {
                let l = ledger::Ledger::open(&dst).unwrap();
                let head = l.head("smoke").unwrap();
                let note = schemas::to_event(&schemas::Note {
                    text: format!("writer {w}"),
                })
                .unwrap();
                heads.push(l.append("smoke", head, note).unwrap());
            }
            let mut c = Command::new(env!("CARGO_BIN_EXE_mass"));
            c.arg("--ledger")
                .arg(&dst)
                .args(["push", &target.url(), "--quiet"])
                .env_remove("MASS_LEDGER");
            children.push((dst, c));
        }
        let running: Vec<_> = children
            .iter_mut()
            .map(|(_, c)| {
                c.stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outs: Vec<Output> = running
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let won: Vec<usize> = (0..2).filter(|i| outs[*i].status.success()).collect();
        assert_eq!(
            won.len(),
            1,
            "round {round}: {}",
            outs.iter().map(text).collect::<String>()
        );
        let lost = 1 - won[0];
        assert_eq!(outs[lost].status.code(), Some(5), "{}", text(&outs[lost]));
        assert!(
            text(&outs[lost]).contains("mass pull"),
            "{}",
            text(&outs[lost])
        );
        let check = d.path().join(format!("check-{round}"));
        let o = mass_in(
            d.path(),
            Path::new("unused"),
            &["clone", &target.url(), check.to_str().unwrap(), "--quiet"],
            &env,
        );
        assert!(o.status.success(), "{}", text(&o));
        let l = ledger::Ledger::open_read_only(&check).unwrap();
        assert_eq!(
            l.head("smoke").unwrap(),
            Some(heads[won[0]]),
            "round {round}: the winner's push was lost"
        );
    }
}

/// A failed clone removes only what it created: a directory it made goes,
/// an empty directory the user made stays (empty), a non-empty one is
/// refused before anything is written, and the origin is never touched.
#[test]
fn a_failed_clone_removes_only_what_it_created() {
    let d = tempfile::tempdir().unwrap();
    let origin = two_cycle_run(d.path());
    let store = d.path().join("store");
    assert!(push(&Target::Folder(store.clone()), &origin, &[])
        .status
        .success());
    let before = refs_of(&origin);
    Target::Folder(store.clone()).corrupt_a_pack();
    let url = store.to_str().unwrap().to_string();
    let clone = |dst: &Path| {
        mass_in(
            d.path(),
            Path::new("unused"),
            &["clone", &url, dst.to_str().unwrap(), "--quiet"],
            &[],
        )
    };
    let made = d.path().join("made-by-clone");
    assert_eq!(clone(&made).status.code(), Some(3));
    assert!(!made.exists());
    let users = d.path().join("users-empty");
    std::fs::create_dir(&users).unwrap();
    assert_eq!(clone(&users).status.code(), Some(3));
    assert!(users.is_dir() && std::fs::read_dir(&users).unwrap().next().is_none());
    let full = d.path().join("users-full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("notes.txt"), "mine").unwrap();
    assert_eq!(clone(&full).status.code(), Some(2));
    assert_eq!(
        std::fs::read_to_string(full.join("notes.txt")).unwrap(),
        "mine"
    );
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 1);
    assert_eq!(refs_of(&origin), before);
    assert!(mass_in(d.path(), &origin, &["verify"], &[])
        .status
        .success());
}
