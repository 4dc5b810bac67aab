//! `mass run --workers URL` and `mass worker URL` through the binary,
//! against a folder store and against a real S3-compatible server (moto,
//! started by scripts/test.sh through scripts/s3-server.sh; those tests are
//! `#[ignore]`d without `MASS_S3_ENDPOINT`).
//!
//! The oracle is the in-process run: the smoke experiment recorded without
//! workers. With three worker processes the run must reach the same head,
//! whatever happens to the workers and the store on the way: a worker
//! SIGKILLed at random moments (several seeds), the coordinator SIGKILLed
//! and resumed, the store unreachable for 10 s (through a TCP forwarder that
//! refuses and cuts connections), the store unreachable past the
//! coordinator's patience (exit 7, then `mass resume` finishes), a worker cut
//! off from the store while it holds an item (it discards its work), and a
//! poison item that fails on every worker (each attempt recorded, then the
//! rollout recorded as failed, and the run goes on).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn mass_cmd(cwd: &Path, ledger: &Path, args: &[&str], env: &[(String, String)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mass"));
    c.current_dir(cwd)
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .env_remove("MASS_LEDGER")
        .env_remove("MASS_WORKER_TEST_FAIL_TASK")
        .env_remove("MASS_WORKER_TEST_ITEM_DELAY_MS");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn mass(cwd: &Path, ledger: &Path, args: &[&str], env: &[(String, String)]) -> Output {
    mass_cmd(cwd, ledger, args, env).output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The smoke experiment, with its tasks by absolute path.
fn experiment(dir: &Path) -> PathBuf {
    let exp = std::fs::read_to_string(root().join("examples/smoke.toml")).unwrap();
    let tasks = root().join("examples/tasks");
    let exp = exp.replace(
        "tasks_dir = \"tasks\"",
        &format!("tasks_dir = {:?}", tasks.to_str().unwrap()),
    );
    let file = dir.join("smoke.toml");
    std::fs::write(&file, exp).unwrap();
    file
}

/// The main head of run `smoke` in ledger `l`.
fn head(l: &Path) -> String {
    let o = mass(Path::new("/"), l, &["refs"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    out.lines()
        .find_map(|line| {
            let mut w = line.split_whitespace();
            let (a, b) = (w.next()?, w.next()?);
            (a == "smoke")
                .then(|| b.to_string())
                .or((b == "smoke").then(|| a.to_string()))
        })
        .unwrap_or_else(|| panic!("no ref smoke in:\n{out}"))
}

/// The oracle: the smoke run's head in process (computed once).
fn in_process_head() -> String {
    static HEAD: OnceLock<String> = OnceLock::new();
    HEAD.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let l = d.path().join("inproc");
        let o = mass(
            d.path(),
            &l,
            &["run", experiment(d.path()).to_str().unwrap(), "--quiet"],
            &[],
        );
        assert!(o.status.success(), "{}", text(&o));
        head(&l)
    })
    .clone()
}

/// A worker process on `url`, logging to `log`.
fn worker(url: &str, name: &str, lease: &str, env: &[(String, String)], log: &Path) -> Child {
    let err = std::fs::File::create(log).unwrap();
    mass_cmd(
        Path::new("/"),
        Path::new("/nonexistent-ledger"),
        &[
            "worker",
            url,
            "--slots",
            "2",
            "--name",
            name,
            "--lease-secs",
            lease,
            "--idle-exit",
            "60",
            "--poll-ms",
            "100",
        ],
        env,
    )
    .stdout(Stdio::null())
    .stderr(err)
    .spawn()
    .unwrap()
}

struct Workers {
    children: Vec<Child>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn start_workers(
    url: &str,
    n: usize,
    lease: &str,
    env: &[(String, String)],
    dir: &Path,
) -> Workers {
    Workers {
        children: (0..n)
            .map(|i| {
                worker(
                    url,
                    &format!("w{i}"),
                    lease,
                    env,
                    &dir.join(format!("w{i}.log")),
                )
            })
            .collect(),
    }
}

fn logs(dir: &Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            out.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    out
}

/// A finished run with workers, checked against the oracle: same head,
/// replay exact without workers, ledger clean.
fn check_run(dir: &Path, l: &Path, o: &Output) {
    assert!(
        o.status.success(),
        "{}\n--- worker logs ---\n{}",
        text(o),
        logs(dir)
    );
    assert_eq!(head(l), in_process_head(), "{}\n{}", text(o), logs(dir));
    let r = mass(Path::new("/"), l, &["replay", "smoke", "--check"], &[]);
    assert!(r.status.success(), "{}", text(&r));
    let v = mass(Path::new("/"), l, &["verify"], &[]);
    assert!(v.status.success(), "{}", text(&v));
}

fn run_with_workers(
    dir: &Path,
    url: &str,
    extra: &[&str],
    env: &[(String, String)],
) -> (PathBuf, Output) {
    let l = dir.join("coord");
    let exp = experiment(dir);
    let mut args = vec!["run", exp.to_str().unwrap(), "--quiet", "--workers", url];
    args.extend_from_slice(extra);
    (l.clone(), mass(dir, &l, &args, env))
}

/// Returns everything the commands and workers printed.
fn same_head_with_three_workers(url: &str, env: &[(String, String)]) -> String {
    let d = tempfile::tempdir().unwrap();
    let w = start_workers(url, 3, "5", env, d.path());
    let (l, o) = run_with_workers(d.path(), url, &[], env);
    check_run(d.path(), &l, &o);
    let s = mass(Path::new("/"), &l, &["status", "--workers", url], env);
    let out = text(&s);
    assert!(s.status.success(), "{out}");
    assert!(out.contains("0 failed, 0 claimed"), "{out}");
    for w in ["w0", "w1", "w2"] {
        assert!(out.contains(&format!("worker {w}:")), "{out}");
    }
    drop(w);
    format!("{}{out}{}", text(&o), logs(d.path()))
}

/// Kills a random worker at random moments (and starts a replacement)
/// while the run goes on.
fn worker_killed_at_random_moments(url_of: &dyn Fn(u64) -> String, env: &[(String, String)]) {
    for seed in 1..=3u64 {
        let url = url_of(seed);
        let d = tempfile::tempdir().unwrap();
        let ws = Arc::new(Mutex::new(start_workers(&url, 3, "1.5", env, d.path())));
        let stop = Arc::new(AtomicBool::new(false));
        let killer = {
            let (ws, stop, url, env, dir) = (
                ws.clone(),
                stop.clone(),
                url.clone(),
                env.to_vec(),
                d.path().to_path_buf(),
            );
            std::thread::spawn(move || {
                let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut next = || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut kills = 0;
                while !stop.load(Ordering::SeqCst) && kills < 4 {
                    std::thread::sleep(Duration::from_millis(300 + next() % 2500));
                    let mut g = ws.lock().unwrap();
                    let i = (next() % 3) as usize;
                    let _ = g.children[i].kill();
                    let _ = g.children[i].wait();
                    kills += 1;
                    g.children[i] = worker(
                        &url,
                        &format!("w{i}k{kills}"),
                        "1.5",
                        &env,
                        &dir.join(format!("w{i}k{kills}.log")),
                    );
                }
                kills
            })
        };
        let (l, o) = run_with_workers(d.path(), &url, &[], env);
        stop.store(true, Ordering::SeqCst);
        let kills = killer.join().unwrap();
        assert!(kills > 0, "seed {seed}: no worker was killed");
        check_run(d.path(), &l, &o);
    }
}

/// The coordinator SIGKILLed once some results are in; `mass resume`
/// finishes with no item executed twice.
fn coordinator_killed_then_resumed(
    url: &str,
    results: &dyn Fn() -> usize,
    env: &[(String, String)],
) {
    let d = tempfile::tempdir().unwrap();
    let _w = start_workers(url, 3, "5", env, d.path());
    let l = d.path().join("coord");
    let exp = experiment(d.path());
    let mut c = mass_cmd(
        d.path(),
        &l,
        &["run", exp.to_str().unwrap(), "--quiet", "--workers", url],
        env,
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let t0 = Instant::now();
    while results() < 20 {
        assert!(t0.elapsed() < Duration::from_secs(120), "no results came");
        assert!(
            c.try_wait().unwrap().is_none(),
            "the run ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill().unwrap();
    c.wait().unwrap();
    let o = mass(
        d.path(),
        &l,
        &["resume", "smoke", "--quiet", "--workers", url],
        env,
    );
    check_run(d.path(), &l, &o);
    let log = logs(d.path());
    assert!(
        !log.contains("already published"),
        "an item ran twice:\n{log}"
    );
}

/// Every item of one task fails on every worker: each attempt recorded,
/// then the rollout recorded as failed, and the run finishes.
fn poison_item(url: &str, attempts: &dyn Fn() -> usize, env: &[(String, String)]) {
    let d = tempfile::tempdir().unwrap();
    let mut env = env.to_vec();
    env.push(("MASS_WORKER_TEST_FAIL_TASK".into(), "pha-hill-fit".into()));
    let _w = start_workers(url, 3, "5", &env, d.path());
    let (l, o) = run_with_workers(d.path(), url, &["--max-attempts", "2"], &[]);
    assert!(o.status.success(), "{}\n{}", text(&o), logs(d.path()));
    let r = mass(
        Path::new("/"),
        &l,
        &["runs", "smoke", "--task", "pha-hill-fit"],
        &[],
    );
    let out = text(&r);
    assert!(r.status.success(), "{out}");
    assert!(out.contains("infrastructure failure"), "{out}");
    let first = out
        .lines()
        .nth(1)
        .and_then(|line| line.split_whitespace().next())
        .unwrap()
        .to_string();
    let shown = mass(Path::new("/"), &l, &["show", &first], &[]);
    assert!(
        text(&shown).contains("not executed: failed on every attempt (2)"),
        "{}",
        text(&shown)
    );
    assert!(
        !out.contains("completed"),
        "a poisoned rollout finished:\n{out}"
    );
    let other = mass(
        Path::new("/"),
        &l,
        &["runs", "smoke", "--task", "fin-momentum-backtest"],
        &[],
    );
    assert!(text(&other).contains("completed"), "{}", text(&other));
    let n = attempts();
    assert!(n >= 2, "{n} attempts recorded");
    let log = logs(d.path());
    assert!(log.contains("MASS_WORKER_TEST_FAIL_TASK"), "{log}");
    let ev = mass(Path::new("/"), &l, &["log", "smoke/workers"], &[]);
    assert!(text(&ev).contains("mass.work"), "{}", text(&ev));
    let r = mass(Path::new("/"), &l, &["replay", "smoke", "--check"], &[]);
    assert!(r.status.success(), "{}", text(&r));
}

fn count_files(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            if e.path().is_dir() {
                count_files(&e.path())
            } else {
                1
            }
        })
        .sum()
}

#[test]
fn folder_workers_give_the_in_process_head() {
    let d = tempfile::tempdir().unwrap();
    let printed = same_head_with_three_workers(d.path().join("store").to_str().unwrap(), &[]);
    assert!(printed.contains("worker w0:"), "{printed}");
}

#[test]
fn folder_worker_sigkilled_at_random_moments_the_run_is_unchanged() {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().to_path_buf();
    worker_killed_at_random_moments(
        &|s| {
            base.join(format!("store{s}"))
                .to_string_lossy()
                .into_owned()
        },
        &[],
    );
}

#[test]
fn folder_coordinator_killed_then_resumed_reuses_published_results() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let results = store.join("work/results");
    coordinator_killed_then_resumed(store.to_str().unwrap(), &|| count_files(&results), &[]);
}

#[test]
fn folder_poison_item_is_recorded_failed_and_the_run_goes_on() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let attempts = store.join("work/attempts");
    poison_item(store.to_str().unwrap(), &|| count_files(&attempts), &[]);
}

// ---- S3 (moto), through a TCP forwarder that can take the store away ----

fn s3_py(code: &str) -> String {
    let py = std::env::var("MASS_S3_PYTHON").expect("MASS_S3_PYTHON (scripts/s3-server.sh start)");
    let o = Command::new(py).arg("-c").arg(code).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn new_bucket(name: &str) -> String {
    assert!(
        std::env::var("MASS_S3_ENDPOINT").is_ok(),
        "start the S3 server: eval \"$(scripts/s3-server.sh start | sed 's/^/export /')\""
    );
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
    bucket
}

fn s3_count(bucket: &str, prefix: &str) -> usize {
    s3_py(&format!("import boto3,os\ns=boto3.client('s3',endpoint_url=os.environ['AWS_ENDPOINT'])\nn=0\nfor p in s.get_paginator('list_objects_v2').paginate(Bucket='{bucket}',Prefix='{prefix}'):\n  n+=len(p.get('Contents',[]))\nprint(n)\n"))
        .trim()
        .parse()
        .unwrap()
}

/// A TCP forwarder to the S3 server that can be taken down (new
/// connections closed at once, open ones cut within 100 ms).
struct Forwarder {
    port: u16,
    down: Arc<AtomicBool>,
}

impl Forwarder {
    fn start() -> Forwarder {
        let upstream = std::env::var("MASS_S3_ENDPOINT").unwrap();
        let upstream = upstream.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = Arc::new(AtomicBool::new(false));
        let d = down.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(client) = conn else { continue };
                if d.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                pipe(client, s2, d.clone());
                pipe(server, c2, d.clone());
            }
        });
        Forwarder { port, down }
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![(
            "AWS_ENDPOINT".into(),
            format!("http://127.0.0.1:{}", self.port),
        )]
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either ends or the forwarder goes down
/// (then both are cut); the thread's sockets close with it.
fn pipe(mut from: TcpStream, mut to: TcpStream, down: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
        let mut buf = [0u8; 16384];
        loop {
            if down.load(Ordering::SeqCst) {
                let _ = from.shutdown(Shutdown::Both);
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

const S3: &str = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh";

#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_workers_give_the_in_process_head() {
    let _ = S3;
    let b = new_bucket("wk-head");
    // A planted secret as the store's credential: on no object, in no output.
    let secret = "mass-planted-secret-5d1e9b7c3a";
    let env = vec![("AWS_SECRET_ACCESS_KEY".to_string(), secret.to_string())];
    let printed = same_head_with_three_workers(&format!("s3://{b}/work"), &env);
    assert!(!printed.contains(secret), "{printed}");
    let found = s3_py(&format!("import boto3,os\ns=boto3.client('s3',endpoint_url=os.environ['AWS_ENDPOINT'])\nn=0\nhit=[]\nfor p in s.get_paginator('list_objects_v2').paginate(Bucket='{b}'):\n  for o in p.get('Contents',[]):\n    n+=1\n    if b'{secret}' in s.get_object(Bucket='{b}',Key=o['Key'])['Body'].read():\n      hit.append(o['Key'])\nprint(n, hit)\n"));
    assert!(
        found.trim().ends_with("[]"),
        "the secret is on the store: {found}"
    );
    let objects: usize = found.split_whitespace().next().unwrap().parse().unwrap();
    assert!(objects > 100, "{found}");
}

#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_worker_sigkilled_at_random_moments_the_run_is_unchanged() {
    worker_killed_at_random_moments(
        &|s| format!("s3://{}/work", new_bucket(&format!("wk-kill{s}"))),
        &[],
    );
}

#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_coordinator_killed_then_resumed_reuses_published_results() {
    let b = new_bucket("wk-coord");
    let url = format!("s3://{b}/work");
    coordinator_killed_then_resumed(&url, &|| s3_count(&b, "work/work/results/"), &[]);
}

#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_poison_item_is_recorded_failed_and_the_run_goes_on() {
    let b = new_bucket("wk-poison");
    let url = format!("s3://{b}/work");
    poison_item(&url, &|| s3_count(&b, "work/work/attempts/"), &[]);
}

/// The store unreachable for 10 s mid-run: everyone retries, the run
/// finishes with the in-process head.
#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_store_down_for_ten_seconds_mid_run_the_run_is_unchanged() {
    let b = new_bucket("wk-down");
    let url = format!("s3://{b}/work");
    let f = Forwarder::start();
    let env = f.env();
    let d = tempfile::tempdir().unwrap();
    let _w = start_workers(&url, 3, "30", &env, d.path());
    let outage = std::thread::scope(|s| {
        let t = s.spawn(|| {
            while s3_count(&b, "work/work/results/") < 10 {
                std::thread::sleep(Duration::from_millis(50));
            }
            f.set_down(true);
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs(10));
            f.set_down(false);
            t0.elapsed()
        });
        let (l, o) = run_with_workers(d.path(), &url, &[], &env);
        check_run(d.path(), &l, &o);
        t.join().unwrap()
    });
    assert!(outage >= Duration::from_secs(10));
}

/// The store unreachable past the coordinator's patience: exit 7 with
/// everything kept; `mass resume` finishes once it answers.
#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_store_down_past_the_patience_exits_7_and_resume_finishes() {
    let b = new_bucket("wk-patience");
    let url = format!("s3://{b}/work");
    let f = Forwarder::start();
    let env = f.env();
    let d = tempfile::tempdir().unwrap();
    let _w = start_workers(&url, 3, "30", &env, d.path());
    let (l, o) = std::thread::scope(|s| {
        s.spawn(|| {
            while s3_count(&b, "work/work/results/") < 10 {
                std::thread::sleep(Duration::from_millis(50));
            }
            f.set_down(true);
        });
        run_with_workers(d.path(), &url, &["--store-patience", "3"], &env)
    });
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    assert!(text(&o).contains("mass resume"), "{}", text(&o));
    f.set_down(false);
    let r = mass(
        d.path(),
        &l,
        &["resume", "smoke", "--quiet", "--workers", &url],
        &env,
    );
    check_run(d.path(), &l, &r);
}

/// One worker cut off from the store while it holds an item: its renewals
/// fail, it stops and discards the item, another worker executes it.
#[test]
#[ignore = "needs the S3 server (scripts/s3-server.sh); run by scripts/test.sh"]
fn s3_worker_cut_off_from_the_store_discards_its_work() {
    let b = new_bucket("wk-cut");
    let url = format!("s3://{b}/work");
    let f = Forwarder::start();
    let d = tempfile::tempdir().unwrap();
    let mut ws = start_workers(&url, 2, "2", &[], d.path());
    let mut env = f.env();
    env.push(("MASS_WORKER_TEST_ITEM_DELAY_MS".into(), "4000".into()));
    let lonely = worker(&url, "lonely", "2", &env, &d.path().join("lonely.log"));
    ws.children.push(lonely);
    let log = d.path().join("lonely.log");
    let (l, o) = std::thread::scope(|s| {
        s.spawn(|| {
            // Cut it off as soon as it has started an item.
            let t0 = Instant::now();
            while !std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains(": started")
            {
                assert!(t0.elapsed() < Duration::from_secs(120));
                std::thread::sleep(Duration::from_millis(10));
            }
            f.set_down(true);
        });
        run_with_workers(d.path(), &url, &[], &[])
    });
    check_run(d.path(), &l, &o);
    let lonely_log = std::fs::read_to_string(&log).unwrap();
    assert!(lonely_log.contains("lease lost"), "{lonely_log}");
}
