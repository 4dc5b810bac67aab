//! How long a model server `mass` starts (`[backends.NAME.serve]`) lives:
//! exactly as long as the process that started it. The fake server is
//! `python3 -m http.server` started through `bash -c`, which first starts
//! two grandchildren: `sleep 1000 &` (in the server's process group) and
//! `setsid sleep 1000 &` (a daemon that left the group and the session).
//! All three pids are written to a file, with the server's own.
//!
//! - the runtime that started the server idles for 30 s (tokio's blocking
//!   threads exit after 10 s idle): the server and both grandchildren live;
//! - the process that started the server is SIGKILLed: within a few
//!   seconds, nothing of the server's tree is left;
//! - the pool is dropped: when `drop` returns, nothing of the tree is left.
//!
//! Each case failed with the spawn this replaced (`bash -c` with
//! `PR_SET_PDEATHSIG(SIGKILL)` set in a `pre_exec` hook, group killed on
//! drop): the idle server was SIGKILLed by its spawning thread's exit, and
//! both grandchildren survived a SIGKILLed parent, the daemon a drop.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::backend::serve::ServerPool;
use engine::config::{shell_quote, ServeParams};

/// Set to a directory, the test binary is the child program of
/// `a_sigkilled_parent_takes_its_server_tree_with_it`.
const CHILD_DIR: &str = "MASS_TEST_SERVE_LIFETIME_CHILD";

/// A pool whose one model, `m`, is served by the fake server described
/// above, writing its pids to `dir/pids`.
fn pool(dir: &Path) -> ServerPool {
    let p = shell_quote(&dir.join("pids").to_string_lossy());
    let www = shell_quote(&dir.to_string_lossy());
    let command = format!(
        "sleep 1000 & echo $! >> {p}; setsid sleep 1000 & echo $! >> {p}; echo $$ >> {p}; \
         exec python3 -m http.server --bind 127.0.0.1 --directory {www} {{port}}"
    );
    let params = ServeParams {
        prompt_tokens_command: None,
        adapter_api: None,
        adapter_file: None,
        command,
        adapter_command: None,
        ready_path: "/".into(),
        start_timeout_secs: 30,
    };
    ServerPool::new("lifetime", &params, "m", None)
}

/// A process as it was seen: its pid and start time (so a reused pid is
/// never taken for it).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Proc {
    pid: i32,
    start: u64,
}

/// Fields of /proc/PID/stat after the command name: (state, ppid,
/// starttime).
fn stat(pid: i32) -> Option<(char, i32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((
        f.first()?.chars().next()?,
        f.get(1)?.parse().ok()?,
        f.get(19)?.parse().ok()?,
    ))
}

fn seen(pid: i32) -> Option<Proc> {
    stat(pid).map(|(_, _, start)| Proc { pid, start })
}

/// The process still runs (a zombie has ended).
fn alive(p: Proc) -> bool {
    matches!(stat(p.pid), Some((state, _, start)) if start == p.start && state != 'Z')
}

/// The server's tree as it wrote it: the in-group grandchild, the daemon,
/// the server.
struct Tree(Vec<Proc>);

impl Tree {
    fn read(dir: &Path) -> Tree {
        let text = std::fs::read_to_string(dir.join("pids")).expect("pids");
        let procs: Vec<Proc> = text
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .map(|pid| seen(pid).unwrap_or_else(|| panic!("{pid} is not running")))
            .collect();
        assert_eq!(procs.len(), 3, "{text}");
        Tree(procs)
    }

    fn server(&self) -> Proc {
        self.0[2]
    }

    fn survivors(&self) -> Vec<Proc> {
        self.0.iter().copied().filter(|p| alive(*p)).collect()
    }

    /// Waits up to `limit` for every process of the tree to end.
    fn gone_within(&self, limit: Duration) -> Vec<Proc> {
        let deadline = Instant::now() + limit;
        while !self.survivors().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.survivors()
    }
}

impl Drop for Tree {
    /// A failed test leaves nothing running either.
    fn drop(&mut self) {
        for p in self.survivors() {
            // SAFETY: only sends a signal, to a process checked (start
            // time) to be the one recorded.
            unsafe {
                libc::kill(p.pid, libc::SIGKILL);
            }
        }
    }
}

/// `GET /` of the server at `base` (`http://127.0.0.1:PORT/v1`) answers 200.
fn answers(base: &str) -> bool {
    let Some(addr) = base
        .strip_prefix("http://")
        .and_then(|r| r.strip_suffix("/v1"))
    else {
        return false;
    };
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET / HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.0 200")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// As a unit of a run does: the server is started from a task on a worker,
/// which then runs something blocking (`exec::blocking`, as a bash tool
/// does), so the worker thread that spawned it leaves for the blocking pool.
fn start_from_a_unit(rt: &tokio::runtime::Runtime, pool: &Arc<ServerPool>) -> String {
    let p = pool.clone();
    rt.block_on(async move {
        tokio::spawn(async move {
            let url = p.base_url("m").await;
            engine::exec::blocking(|| std::thread::sleep(Duration::from_millis(300)));
            url
        })
        .await
    })
    .expect("task")
    .expect("server")
}

#[test]
fn a_server_lives_while_the_runtime_that_started_it_idles() {
    let d = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let pool = Arc::new(pool(d.path()));
    let url = start_from_a_unit(&rt, &pool);
    let tree = Tree::read(d.path());
    // Longer than tokio's keep-alive of idle blocking threads (10 s).
    std::thread::sleep(Duration::from_secs(30));
    assert_eq!(
        tree.survivors(),
        tree.0,
        "the server or a grandchild died while the run idled"
    );
    assert!(answers(&url), "the server no longer answers at {url}");
    // And a call after the idle time reaches the same server.
    let again = rt.block_on(pool.base_url("m")).expect("server");
    assert_eq!(again, url);
    drop(pool);
    assert_eq!(tree.survivors(), vec![], "a dropped pool left processes");
}

#[test]
fn dropping_the_pool_ends_the_whole_tree_before_drop_returns() {
    let d = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let pool = Arc::new(pool(d.path()));
    let url = start_from_a_unit(&rt, &pool);
    let tree = Tree::read(d.path());
    assert!(answers(&url));
    assert_eq!(tree.survivors(), tree.0);
    let logs = pool.logs().to_path_buf();
    assert!(logs.join("m.log").is_file(), "{}", logs.display());
    drop(pool);
    assert_eq!(
        tree.survivors(),
        vec![],
        "left by the drop (the last one is the server; the second the daemon that left its group)"
    );
    assert!(
        !logs.exists(),
        "a pool whose servers all ran to the end left its logs in {}",
        logs.display()
    );
}

#[test]
fn a_server_that_fails_keeps_its_log() {
    let params = ServeParams {
        prompt_tokens_command: None,
        adapter_api: None,
        adapter_file: None,
        command: "echo the weights are missing >&2; exit 3".into(),
        adapter_command: None,
        ready_path: "/".into(),
        start_timeout_secs: 30,
    };
    let pool = ServerPool::new("keeps-logs", &params, "m", None);
    let err = runtime()
        .block_on(pool.base_url("m"))
        .expect_err("a server that exits is an error");
    let logs = pool.logs().to_path_buf();
    assert!(err.to_string().contains("m.log"), "{err}");
    drop(pool);
    let log = std::fs::read_to_string(logs.join("m.log")).expect("the failed server's log is kept");
    assert!(log.contains("the weights are missing"), "{log}");
    let _ = std::fs::remove_dir_all(&logs);
}

/// The pids of `root`'s descendants, from /proc.
fn descendants(root: i32) -> Vec<Proc> {
    let mut all = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Some((_, ppid, start)) = stat(pid) {
            all.push((Proc { pid, start }, ppid));
        }
    }
    let mut out: Vec<Proc> = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for (p, ppid) in &all {
            if *ppid == parent && !out.contains(p) {
                out.push(*p);
                parents.push(p.pid);
            }
        }
    }
    out
}

#[test]
fn a_sigkilled_parent_takes_its_server_tree_with_it() {
    let d = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let mut child = std::process::Command::new(exe)
        .args([
            "--exact",
            "child_program_starts_a_server_and_waits_to_be_killed",
            "--nocapture",
        ])
        .env(CHILD_DIR, d.path())
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("child program");
    let ready = d.path().join("ready");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        assert!(
            Instant::now() < deadline,
            "the child program never started its server"
        );
        assert!(
            child.try_wait().expect("child").is_none(),
            "the child program exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let tree = Tree::read(d.path());
    // Everything the child program started (whatever supervises the
    // server, the server, its grandchildren), and the daemon, reparented.
    let mut everything = descendants(child.id() as i32);
    for p in &tree.0 {
        if !everything.contains(p) {
            everything.push(*p);
        }
    }
    assert!(everything.contains(&tree.server()), "{everything:?}");
    // SAFETY: only sends a signal, to our own unreaped child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGKILL);
    }
    let _ = child.wait();
    let everything = Tree(everything);
    assert_eq!(
        everything.gone_within(Duration::from_secs(5)),
        vec![],
        "left running 5 s after the parent was SIGKILLed (the server's tree: {:?})",
        tree.0
    );
}

/// Not a test of its own: the child program of
/// `a_sigkilled_parent_takes_its_server_tree_with_it` (this binary
/// re-entered with `CHILD_DIR` set). It starts a server as a run does, says
/// so, and waits to be killed. Without `CHILD_DIR` it does nothing.
#[test]
fn child_program_starts_a_server_and_waits_to_be_killed() {
    let Some(dir) = std::env::var_os(CHILD_DIR).map(PathBuf::from) else {
        return;
    };
    let rt = runtime();
    let pool = Arc::new(pool(&dir));
    start_from_a_unit(&rt, &pool);
    std::fs::write(dir.join("ready"), b"").expect("ready");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}
