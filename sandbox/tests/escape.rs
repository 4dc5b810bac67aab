//! Escape suite: each test tries one way out of the sandbox and asserts it
//! is blocked, next to a control doing the same operation on an allowed
//! path, so no test can pass because the command simply failed to run.
//! Commands are built exactly as the integrator will build them (see `run`).
//! Must run as root on a machine where `probe().check(Level::Full)` passes.

use sandbox::{command, outside_links, prepare, Level, Policy};
use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const API_KEY: &str = "sk-test-sandbox-secret-4f1c";

/// A workspace under a 0o711 parent so uid 65534 can traverse to it.
struct Ws {
    base: tempfile::TempDir,
    dir: PathBuf,
}

impl Ws {
    fn new() -> Ws {
        let base = tempfile::Builder::new()
            .prefix("sbx-")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let dir = base.path().join("ws");
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(dir.join(".tmp")).unwrap();
        Ws { base, dir }
    }
    fn base(&self) -> &Path {
        self.base.path()
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
    fn policy(&self, level: Level) -> Policy {
        Policy::new(level, &self.dir)
    }
}

#[derive(Debug)]
struct Out {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
    elapsed: Duration,
    /// The PID namespace the command ran in (Level::Full), read right after spawn.
    pid_ns: Option<PathBuf>,
}

/// The PID namespace the launcher `pid` created for its children, once it
/// has (within 3 s); `None` if it exits first or never creates one.
fn new_pid_namespace(pid: i32) -> Option<PathBuf> {
    let ours = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let deadline = Instant::now() + secs(3);
    while Instant::now() < deadline {
        // The link can be briefly unreadable while the launcher changes
        // its credentials; a process that ended (a zombie) never creates one.
        match std::fs::read_link(format!("/proc/{pid}/ns/pid_for_children")) {
            Ok(ns) if ns != ours => return Some(ns),
            Ok(_) => {}
            Err(_) => {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                let state = stat.rsplit(") ").next()?.chars().next()?;
                if state == 'Z' {
                    return None;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// Asserts that no live process is left in the command's PID namespace.
fn assert_namespace_empty(o: &Out) {
    let ns = o.pid_ns.clone().expect("pid namespace recorded");
    let deadline = Instant::now() + secs(3);
    loop {
        let left: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .filter(|e| std::fs::read_link(e.path().join("ns/pid")).ok().as_ref() == Some(&ns))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes left in the sandbox namespace: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Out {
    fn has(&self, marker: &str) -> bool {
        self.stdout.lines().any(|l| l.trim() == marker)
    }
}

/// Runs `script` the way the integrator will: bash -c, env_clear plus an
/// allow-listed env, process_group(0), stdin null, piped output, prepare +
/// sandbox::command, a timeout that SIGKILLs the group, and a final killpg after
/// the command returns.
fn run(policy: &Policy, ws: &Path, script: &str, timeout: Duration) -> Out {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // The harness has secrets in its own environment; the command must not see them.
    ONCE.call_once(|| std::env::set_var("OPENAI_API_KEY", API_KEY));
    prepare(policy).unwrap();
    let mut cmd = command("bash", policy).unwrap();
    cmd.arg("-c")
        .arg(script)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", ws)
        .env("TMPDIR", ws.join(".tmp"))
        .current_dir(ws)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let pid = child.id() as i32;
    // The relay's children (the command) live in this namespace. The
    // launcher enters it shortly after spawn returns (spawn does not wait
    // for the confinement), so wait until it differs from ours.
    let pid_ns = if policy.level == Level::Full {
        new_pid_namespace(pid)
    } else {
        None
    };
    let (tx, rx) = mpsc::channel();
    for (i, mut r) in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ]
    .into_iter()
    .enumerate()
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            let _ = tx.send((i, buf));
        });
    }
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > timeout {
            timed_out = true;
            unsafe { libc::killpg(pid, libc::SIGKILL) };
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    unsafe { libc::killpg(pid, libc::SIGKILL) };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    for _ in 0..2 {
        // A daemon that escaped would hold the pipes open: do not hang on it.
        if let Ok((i, buf)) = rx.recv_timeout(Duration::from_secs(5)) {
            let s = String::from_utf8_lossy(&buf).into_owned();
            if i == 0 {
                stdout = s
            } else {
                stderr = s
            }
        }
    }
    Out {
        code: status.code(),
        signal: status.signal(),
        stdout,
        stderr,
        timed_out,
        elapsed,
        pid_ns,
    }
}

fn run_full(ws: &Ws, script: &str) -> Out {
    run(
        &ws.policy(Level::Full),
        &ws.dir,
        script,
        Duration::from_secs(20),
    )
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The control every file-system test shares: the workspace is writable.
const CONTROL_WRITE: &str =
    "echo ok > control.txt && cat control.txt >/dev/null && echo CONTROL_OK";

#[test]
fn read_etc_shadow_is_blocked() {
    let ws = Ws::new();
    std::fs::write(ws.path("mine.txt"), "hello").unwrap();
    let o = run_full(
        &ws,
        "cat /etc/shadow && echo LEAK; cat mine.txt >/dev/null && echo CONTROL_OK",
    );
    assert!(!o.has("LEAK") && o.has("CONTROL_OK"), "{o:?}");
}

#[test]
fn read_secret_in_callers_home_is_blocked() {
    let ws = Ws::new();
    let secret = PathBuf::from(format!("/root/.sandbox-test-secret-{}", std::process::id()));
    std::fs::write(&secret, "TOPSECRET").unwrap();
    // World-readable so only the sandbox, not file modes, can stop the read.
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = run_full(
        &ws,
        &format!("cat {} ; echo; {CONTROL_WRITE}", secret.display()),
    );
    std::fs::remove_file(&secret).unwrap();
    assert!(
        !o.stdout.contains("TOPSECRET") && o.has("CONTROL_OK"),
        "{o:?}"
    );
}

#[test]
fn list_root_home_is_blocked() {
    let ws = Ws::new();
    std::fs::write(ws.path("visible.txt"), "x").unwrap();
    let o = run_full(
        &ws,
        "ls /root && echo LISTED; ls . | grep -q visible.txt && echo CONTROL_OK",
    );
    assert!(!o.has("LISTED") && o.has("CONTROL_OK"), "{o:?}");
}

#[test]
fn write_outside_via_dotdot_is_blocked() {
    let ws = Ws::new();
    // The parent is root-owned 0711; make it world-writable so only Landlock can refuse.
    std::fs::set_permissions(ws.base(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = run_full(
        &ws,
        &format!("echo pwn > ../escape.txt && echo WROTE; {CONTROL_WRITE}"),
    );
    assert!(
        !ws.base().join("escape.txt").exists() && !o.has("WROTE") && o.has("CONTROL_OK"),
        "{o:?}"
    );
}

#[test]
fn write_outside_via_absolute_path_is_blocked() {
    let ws = Ws::new();
    let target = PathBuf::from(format!("/tmp/sandbox-escape-abs-{}", std::process::id()));
    let o = run_full(
        &ws,
        &format!(
            "echo pwn > {} && echo WROTE; {CONTROL_WRITE}",
            target.display()
        ),
    );
    let exists = target.exists();
    let _ = std::fs::remove_file(&target);
    assert!(!exists && !o.has("WROTE") && o.has("CONTROL_OK"), "{o:?}");
}

#[test]
fn write_through_symlink_pointing_outside_is_blocked() {
    let ws = Ws::new();
    let outside = ws.base().join("outside.txt");
    std::fs::write(&outside, "original").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::symlink(&outside, ws.path("link")).unwrap();
    std::fs::write(ws.path("inner.txt"), "inner").unwrap();
    std::os::unix::fs::symlink(ws.path("inner.txt"), ws.path("inner-link")).unwrap();
    let o = run_full(
        &ws,
        "echo pwn > link && echo WROTE; echo new > inner-link && echo CONTROL_OK",
    );
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "original",
        "{o:?}"
    );
    assert!(!o.has("WROTE") && o.has("CONTROL_OK"), "{o:?}");
    assert_eq!(
        std::fs::read_to_string(ws.path("inner.txt")).unwrap(),
        "new\n"
    );
}

#[test]
fn creating_hard_link_to_outside_file_is_blocked() {
    let ws = Ws::new();
    std::fs::write(ws.path("a.txt"), "a").unwrap();
    let o = run_full(
        &ws,
        "ln /etc/passwd x && echo LINKED; ln a.txt b.txt && echo CONTROL_OK",
    );
    assert!(
        !ws.path("x").exists() && !o.has("LINKED") && o.has("CONTROL_OK"),
        "{o:?}"
    );
}

#[test]
fn existing_hard_link_to_outside_file_cannot_modify_it() {
    let ws = Ws::new();
    let outside = ws.base().join("outside.txt");
    std::fs::write(&outside, "original").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::hard_link(&outside, ws.path("linked.txt")).unwrap();
    // An internal hard link pair is fine and must stay usable.
    std::fs::write(ws.path("in1.txt"), "in").unwrap();
    std::fs::hard_link(ws.path("in1.txt"), ws.path("in2.txt")).unwrap();
    assert_eq!(outside_links(&ws.dir), vec![ws.path("linked.txt")]);
    let o = run_full(
        &ws,
        "echo pwn >> linked.txt && echo WROTE; echo more >> in2.txt && echo CONTROL_OK",
    );
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "original",
        "{o:?}"
    );
    assert_eq!(
        std::fs::metadata(&outside).unwrap().uid(),
        0,
        "prepare must not chown an outside inode"
    );
    assert!(!o.has("WROTE") && o.has("CONTROL_OK"), "{o:?}");
    // A world-writable outside link is refused outright: file modes would not protect it.
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o666)).unwrap();
    let err = prepare(&ws.policy(Level::Full)).unwrap_err().to_string();
    assert!(
        err.contains("hard link to a file outside the workspace"),
        "{err}"
    );
}

#[test]
fn read_shadow_via_proc_self_root_is_blocked() {
    let ws = Ws::new();
    let o = run_full(&ws, "cat /proc/self/root/etc/shadow && echo LEAK; cat /proc/self/status >/dev/null && echo CONTROL_OK");
    assert!(!o.has("LEAK") && o.has("CONTROL_OK"), "{o:?}");
}

#[test]
fn host_process_environ_is_invisible() {
    let ws = Ws::new();
    let mut host = Command::new("sleep")
        .arg("30")
        .env("HOST_ONLY_SECRET", "hostsecret-93a")
        .spawn()
        .unwrap();
    let hp = host.id();
    let o = run_full(
        &ws,
        &format!("cat /proc/{hp}/environ; cat /proc/1/environ; echo; cat /proc/self/environ | tr '\\0' '\\n' | grep -q '^PATH=' && echo CONTROL_OK"),
    );
    let _ = host.kill();
    let _ = host.wait();
    assert!(
        !o.stdout.contains("hostsecret-93a") && o.has("CONTROL_OK"),
        "{o:?}"
    );
}

#[test]
fn tcp_to_host_loopback_is_blocked() {
    let ws = Ws::new();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    // Control: the listener works from the test itself.
    drop(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
    l.accept().unwrap();
    l.set_nonblocking(true).unwrap();
    let o = run_full(
        &ws,
        &format!("(exec 3<>/dev/tcp/127.0.0.1/{port}) && echo CONNECTED; python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\" && echo PYCONNECTED; {CONTROL_WRITE}"),
    );
    assert!(
        !o.has("CONNECTED") && !o.has("PYCONNECTED") && o.has("CONTROL_OK"),
        "{o:?}"
    );
    assert!(
        l.accept().is_err(),
        "the listener got a connection from the sandbox"
    );
}

/// Before: a world-writable unix socket of the host (here one the test
/// listens on in /tmp; in real life an X server's or a daemon's) was
/// reachable by path, which Landlock (ABI 7) does not cover. Without
/// network, no socket can be made; socketpair() still works.
#[test]
fn regression_a_host_unix_socket_is_unreachable() {
    use std::os::unix::fs::PermissionsExt;
    let ws = Ws::new();
    let path = std::env::temp_dir().join(format!("mass-escape-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    // Control: the listener works from the test itself.
    drop(std::os::unix::net::UnixStream::connect(&path).unwrap());
    l.accept().unwrap();
    l.set_nonblocking(true).unwrap();
    let o = run_full(
        &ws,
        &format!(
            "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{}')\" && echo CONNECTED; \
             python3 -c \"import socket; a, b = socket.socketpair(); a.send(b'x'); print(b.recv(1).decode())\"",
            path.display()
        ),
    );
    let _ = std::fs::remove_file(&path);
    assert!(!o.has("CONNECTED") && o.has("x"), "{o:?}");
    assert!(
        l.accept().is_err(),
        "the listener got a connection from the sandbox"
    );
}

#[test]
fn dns_udp_and_curl_are_blocked() {
    let ws = Ws::new();
    // A fake resolver and web server on loopback stand in for outside hosts:
    // this suite sends no traffic off the machine even if the sandbox broke.
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let uport = udp.local_addr().unwrap().port();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let tport = tcp.local_addr().unwrap().port();
    tcp.set_nonblocking(true).unwrap();
    let o = run_full(
        &ws,
        &format!(
            "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'q', ('127.0.0.1', {uport}))\" && echo SENT; \
             curl -sS --max-time 3 http://127.0.0.1:{tport}/ && echo FETCHED; \
             curl -sS --max-time 3 http://localhost:{tport}/ && echo FETCHED; {CONTROL_WRITE}"
        ),
    );
    udp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert!(
        udp.recv(&mut buf).is_err(),
        "the fake resolver got a datagram: {o:?}"
    );
    assert!(
        tcp.accept().is_err(),
        "the fake web server got a connection: {o:?}"
    );
    assert!(
        !o.has("SENT") && !o.has("FETCHED") && o.has("CONTROL_OK"),
        "{o:?}"
    );
}

fn assert_daemon_dies(script: &str) {
    let ws = Ws::new();
    let o = run_full(&ws, script);
    assert!(o.has("STARTED") && !o.timed_out, "{o:?}");
    assert_namespace_empty(&o);
    let log = ws.path("d.log");
    assert!(log.exists(), "control: the daemon did run: {o:?}");
    std::thread::sleep(Duration::from_millis(300));
    let a = std::fs::metadata(&log).unwrap().len();
    std::thread::sleep(secs(1));
    let b = std::fs::metadata(&log).unwrap().len();
    assert_eq!(a, b, "the daemon outlived the call");
}

#[test]
fn setsid_daemon_does_not_outlive_the_call() {
    assert_daemon_dies(
        "setsid bash -c 'while :; do echo x >> d.log; sleep 0.1; done' </dev/null >/dev/null 2>&1 & sleep 0.5; echo STARTED",
    );
}

#[test]
fn double_fork_daemon_does_not_outlive_the_call() {
    assert_daemon_dies(
        "( ( exec </dev/null >/dev/null 2>&1; while :; do echo x >> d.log; sleep 0.1; done ) & ) ; sleep 0.5; echo STARTED",
    );
}

#[test]
fn killing_the_relay_kills_the_namespace() {
    // The caller's timeout path: SIGKILL the group while a setsid daemon runs.
    let ws = Ws::new();
    let o = run(
        &ws.policy(Level::Full),
        &ws.dir,
        "setsid bash -c 'while :; do echo x >> d.log; sleep 0.1; done' </dev/null >/dev/null 2>&1 & sleep 30",
        secs(1),
    );
    assert!(o.timed_out, "{o:?}");
    assert_namespace_empty(&o);
    std::thread::sleep(Duration::from_millis(300));
    let a = std::fs::metadata(ws.path("d.log")).unwrap().len();
    std::thread::sleep(secs(1));
    assert_eq!(
        a,
        std::fs::metadata(ws.path("d.log")).unwrap().len(),
        "daemon survived SIGKILL of the group"
    );
}

#[test]
fn fork_bomb_ends_and_host_can_still_spawn() {
    let ws = Ws::new();
    let o = run(&ws.policy(Level::Full), &ws.dir, ":(){ :|:& };:", secs(4));
    assert!(o.elapsed < secs(10), "{o:?}");
    assert_ne!(
        o.pid_ns,
        std::fs::read_link("/proc/self/ns/pid").ok(),
        "control: it ran in its own namespace"
    );
    assert_namespace_empty(&o);
    assert!(Command::new("true").status().unwrap().success());
}

#[test]
fn process_limit_stops_forking() {
    let ws = Ws::new();
    let mut p = ws.policy(Level::Full);
    p.limits.processes = 32;
    let o = run(
        &p,
        &ws.dir,
        "python3 -c \"
import os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(5); os._exit(0)
        n += 1
except OSError:
    print('LIMIT', n)
\"",
        secs(20),
    );
    let n: u64 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("LIMIT "))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no limit hit: {o:?}"));
    // Control: forking works up to the limit.
    assert!((16..32).contains(&n), "forked {n}: {o:?}");
}

#[test]
fn memory_hog_fails() {
    let ws = Ws::new();
    let o = run_full(
        &ws,
        "python3 -c 'b = bytearray(8 << 30); print(\"ALLOCATED\")'; python3 -c 'b = bytearray(100 << 20); print(\"CONTROL_OK\")'",
    );
    assert!(!o.has("ALLOCATED") && o.has("CONTROL_OK"), "{o:?}");
}

#[test]
fn huge_file_is_stopped_at_file_size_limit() {
    let ws = Ws::new();
    let mut p = ws.policy(Level::Full);
    p.limits.file_size_mb = 16;
    let o = run(
        &p,
        &ws.dir,
        "truncate -s 10G sparse.bin && echo TRUNCATED; dd if=/dev/zero of=big.bin bs=1M count=10240 2>/dev/null && echo DD_DONE; head -c 1000000 /dev/zero > small.bin && echo CONTROL_OK",
        secs(20),
    );
    assert!(
        !o.has("TRUNCATED") && !o.has("DD_DONE") && o.has("CONTROL_OK"),
        "{o:?}"
    );
    for f in ["sparse.bin", "big.bin"] {
        let len = std::fs::metadata(ws.path(f)).map(|m| m.len()).unwrap_or(0);
        assert!(len <= 16 << 20, "{f} is {len} bytes");
    }
    assert_eq!(
        std::fs::metadata(ws.path("small.bin")).unwrap().len(),
        1_000_000
    );
}

#[test]
fn cpu_spin_is_killed_at_cpu_limit() {
    let ws = Ws::new();
    let mut p = ws.policy(Level::Full);
    p.limits.cpu_secs = 2;
    let o = run(&p, &ws.dir, "python3 -c 'while True: pass'", secs(15));
    assert!(!o.timed_out && o.elapsed < secs(8), "{o:?}");
    assert!(
        o.signal == Some(libc::SIGKILL)
            || o.signal == Some(libc::SIGXCPU)
            || o.code.unwrap_or(0) > 128,
        "{o:?}"
    );
}

#[test]
fn harness_secrets_are_not_visible() {
    let ws = Ws::new();
    let me = std::process::id();
    let o = run_full(
        &ws,
        &format!("echo \"key=${{OPENAI_API_KEY:-unset}}\"; cat /proc/{me}/environ; cat /proc/$PPID/environ; env; echo \"home=$HOME\""),
    );
    assert_eq!(
        std::env::var("OPENAI_API_KEY").unwrap(),
        API_KEY,
        "control: the harness has the key"
    );
    assert!(!o.stdout.contains(API_KEY) && o.has("key=unset"), "{o:?}");
    assert!(o.has(&format!("home={}", ws.dir.display())), "{o:?}");
}

#[test]
fn signals_cannot_reach_the_harness() {
    let ws = Ws::new();
    let me = std::process::id();
    // A host process of the same uid as the sandbox: only namespaces/Landlock can protect it.
    let mut peer = Command::new("sleep")
        .arg("30")
        .uid(65534)
        .gid(65534)
        .spawn()
        .unwrap();
    let peer_pid = peer.id();
    let o = run_full(
        &ws,
        &format!("kill -9 {me}; kill -9 {peer_pid}; kill -9 $PPID; kill -TERM -1; sleep 0.2; echo CONTROL_OK"),
    );
    std::thread::sleep(Duration::from_millis(200));
    let alive = peer.try_wait().unwrap().is_none();
    let _ = peer.kill();
    let _ = peer.wait();
    assert!(alive, "a host process of uid 65534 was killed: {o:?}");
    // We are obviously alive if we got here; the command itself kept running too.
    assert!(o.has("CONTROL_OK"), "{o:?}");
}

#[test]
fn mount_and_unshare_fail_inside() {
    let ws = Ws::new();
    std::fs::create_dir(ws.path("m")).unwrap();
    let o = run_full(
        &ws,
        "mount -t tmpfs none m && echo MOUNTED; unshare -Ur true && echo UNSHARED; unshare -rm true && echo UNSHARED2; {CONTROL}".replace("{CONTROL}", CONTROL_WRITE).as_str(),
    );
    assert!(
        !o.has("MOUNTED") && !o.has("UNSHARED") && !o.has("UNSHARED2") && o.has("CONTROL_OK"),
        "{o:?}"
    );
}

#[test]
fn command_runs_without_root() {
    let ws = Ws::new();
    let o = run_full(
        &ws,
        "echo hi > owned.txt; grep -E '^(CapEff|CapPrm|NoNewPrivs|Seccomp):' /proc/self/status; echo oom=$(cat /proc/self/oom_score_adj)",
    );
    let m = std::fs::metadata(ws.path("owned.txt")).unwrap();
    assert_ne!(m.uid(), 0, "{o:?}");
    assert_eq!(m.uid(), 65534, "{o:?}");
    assert!(o.stdout.contains("CapEff:\t0000000000000000"), "{o:?}");
    assert!(o.stdout.contains("NoNewPrivs:\t1"), "{o:?}");
    assert!(o.stdout.contains("Seccomp:\t2"), "{o:?}");
    assert!(
        o.has("oom=1000"),
        "the OOM killer should pick the sandbox first: {o:?}"
    );
}

#[test]
fn controls_workspace_usr_python_and_readable_dir_work() {
    let ws = Ws::new();
    let validator = ws.base().join("validator");
    std::fs::create_dir(&validator).unwrap();
    std::fs::set_permissions(&validator, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = validator.join("check.py");
    std::fs::write(&script, "print('VALIDATOR_OK')\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut p = ws.policy(Level::Full);
    p.readable.push(validator.clone());
    let o = run(
        &p,
        &ws.dir,
        &format!(
            "echo data > w.txt && mkdir -p sub && mv w.txt sub/ && rm sub/w.txt && echo WRITE_OK; \
             ls /usr/bin >/dev/null && echo USR_OK; python3 -c 'print(1)'; python3 -I {} ; \
             echo tmp > \"$TMPDIR/t\" && echo TMP_OK; echo STDOUT_OK > /dev/stdout; echo STDERR_OK > /dev/stderr; cat <(echo PROCSUB_OK); echo x 2>/dev/null > {}/evil.py || echo READONLY_OK",
            script.display(),
            validator.display()
        ),
        secs(20),
    );
    for m in [
        "WRITE_OK",
        "USR_OK",
        "1",
        "VALIDATOR_OK",
        "TMP_OK",
        "READONLY_OK",
    ] {
        assert!(o.has(m), "missing {m}: {o:?}");
    }
    assert!(!validator.join("evil.py").exists());
    assert_eq!(o.stderr, "STDERR_OK\n", "python/bash complained: {o:?}");
}

#[test]
fn exit_status_is_relayed() {
    let ws = Ws::new();
    let o = run_full(&ws, "exit 7");
    assert_eq!(o.code, Some(7), "{o:?}");
    let o = run_full(&ws, "python3 -c 'import ctypes; ctypes.string_at(0)'");
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{o:?}");
}

/// Before: the command was PID 1 of its namespace, which the kernel shields
/// from signals it has no handler for, so `kill -9 $$`, `kill -TERM $$`,
/// `alarm` and `abort` did nothing. A minimal init is PID 1 now and the
/// command runs as PID 2 with ordinary signal semantics.
#[test]
fn regression_the_command_is_not_pid1_and_signals_work() {
    let ws = Ws::new();
    let o = run_full(&ws, "echo $$");
    assert_eq!(o.stdout.trim(), "2", "{o:?}");
    for (script, sig) in [
        ("kill -9 $$", libc::SIGKILL),
        ("kill -TERM $$; sleep 5", libc::SIGTERM),
        (
            "python3 -c 'import signal, time; signal.alarm(1); time.sleep(5)'",
            libc::SIGALRM,
        ),
        ("python3 -c 'import os; os.abort()'", libc::SIGABRT),
    ] {
        let o = run_full(&ws, script);
        assert_eq!(o.signal, Some(sig), "{script}: {o:?}");
    }
}

// ---- Level::Landlock: no namespaces, same file-system and network walls ----

fn run_ll(ws: &Ws, script: &str) -> Out {
    run(&ws.policy(Level::Landlock), &ws.dir, script, secs(20))
}

#[test]
fn landlock_level_blocks_file_system_escapes() {
    let ws = Ws::new();
    std::fs::set_permissions(ws.base(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let outside = ws.base().join("outside.txt");
    std::fs::write(&outside, "original").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::symlink(&outside, ws.path("link")).unwrap();
    let o = run_ll(
        &ws,
        &format!(
            "cat /etc/shadow && echo LEAK1; cat /proc/self/root/etc/shadow && echo LEAK2; ls /root && echo LEAK3; \
             cat /proc/1/environ && echo LEAK4; \
             echo pwn > ../escape.txt && echo W1; echo pwn > link && echo W2; ln /etc/passwd x && echo W3; \
             mount -t tmpfs none . && echo W4; unshare -Ur true && echo W5; \
             python3 -c 'print(1)'; {CONTROL_WRITE}"
        ),
    );
    for bad in [
        "LEAK1", "LEAK2", "LEAK3", "LEAK4", "W1", "W2", "W3", "W4", "W5",
    ] {
        assert!(!o.has(bad), "{bad}: {o:?}");
    }
    assert!(o.has("1") && o.has("CONTROL_OK"), "{o:?}");
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "original");
    assert_eq!(
        std::fs::metadata(ws.path("control.txt")).unwrap().uid(),
        65534
    );
}

#[test]
fn landlock_level_blocks_network_and_signals() {
    let ws = Ws::new();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    l.set_nonblocking(true).unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let uport = udp.local_addr().unwrap().port();
    let mut peer = Command::new("sleep")
        .arg("30")
        .uid(65534)
        .gid(65534)
        .spawn()
        .unwrap();
    let peer_pid = peer.id();
    let o = run_ll(
        &ws,
        &format!(
            "(exec 3<>/dev/tcp/127.0.0.1/{port}) && echo CONNECTED; \
             python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'q', ('127.0.0.1', {uport}))\" && echo SENT; \
             kill -9 {peer_pid} && echo KILLED; kill -TERM -1; {CONTROL_WRITE}"
        ),
    );
    std::thread::sleep(Duration::from_millis(200));
    let alive = peer.try_wait().unwrap().is_none();
    let _ = peer.kill();
    let _ = peer.wait();
    udp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 4];
    assert!(udp.recv(&mut buf).is_err());
    assert!(l.accept().is_err());
    assert!(alive, "{o:?}");
    assert!(
        !o.has("CONNECTED") && !o.has("SENT") && !o.has("KILLED") && o.has("CONTROL_OK"),
        "{o:?}"
    );
}

#[test]
fn level_none_only_limits() {
    let ws = Ws::new();
    let mut p = ws.policy(Level::None);
    p.limits.file_size_mb = 1;
    let o = run(
        &p,
        &ws.dir,
        "head -c 2000000 /dev/zero > f.bin; id -u",
        secs(10),
    );
    assert!(
        o.has("0"),
        "Level::None keeps root (documented unsafe): {o:?}"
    );
    assert!(std::fs::metadata(ws.path("f.bin")).unwrap().len() <= 1 << 20);
}

#[test]
fn policy_serde_uses_documented_names_and_defaults() {
    let p: Policy = serde_json::from_str(r#"{"level":"landlock","writable":["/w"]}"#).unwrap();
    assert_eq!(p.level, Level::Landlock);
    assert_eq!(p.limits.cpu_secs, 120);
    assert_eq!(p.limits.address_space_mb, 4096);
    assert_eq!(p.limits.processes, 128);
    assert_eq!(p.limits.file_size_mb, 256);
    assert_eq!(p.limits.open_files, 256);
    assert!(!p.network);
    assert_eq!(serde_json::to_string(&Level::Full).unwrap(), "\"full\"");
    assert_eq!(serde_json::to_string(&Level::None).unwrap(), "\"none\"");
    let l: sandbox::Limits = serde_json::from_str(r#"{"cpu_secs":5}"#).unwrap();
    assert_eq!((l.cpu_secs, l.processes), (5, 128));
}

#[test]
fn relative_paths_are_refused() {
    let p = Policy::new(Level::Full, Path::new("rel/ws"));
    let err = command("true", &p).unwrap_err().to_string();
    assert!(err.contains("not absolute"), "{err}");
}

#[test]
fn system_read_paths_lists_existing_allow_list() {
    let paths = sandbox::system_read_paths();
    assert!(paths.contains(&PathBuf::from("/usr")));
    assert!(paths.contains(&PathBuf::from("/dev/null")));
    assert!(!paths
        .iter()
        .any(|p| p.starts_with("/etc/passwd") || p.starts_with("/root") || p == Path::new("/etc")));
}

#[test]
fn clearing_parent_death_signal_does_not_save_a_daemon() {
    // PID 1 of the namespace tries to unhook itself from the relay
    // (prctl(PR_SET_PDEATHSIG, 0) or a harmless signal) and leave the process
    // group, so that killing the group would leave it running.
    let ws = Ws::new();
    let o = run(
        &ws.policy(Level::Full),
        &ws.dir,
        "exec python3 -c \"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
print('KILL', libc.prctl(1, 9, 0, 0, 0), flush=True)
print('CLEAR', libc.prctl(1, 0, 0, 0, 0), flush=True)
print('USR1', libc.prctl(1, 10, 0, 0, 0), flush=True)
os.setsid()
while True:
    with open('d.log', 'a') as f: f.write('x')
    time.sleep(0.1)
\"",
        secs(1),
    );
    assert!(o.timed_out, "{o:?}");
    assert_namespace_empty(&o);
    std::thread::sleep(Duration::from_millis(300));
    let a = std::fs::metadata(ws.path("d.log")).unwrap().len();
    std::thread::sleep(secs(1));
    let b = std::fs::metadata(ws.path("d.log")).unwrap().len();
    assert_eq!(a, b, "PID 1 outlived the relay: {o:?}");
    // Control: setting SIGKILL itself stays allowed.
    assert!(
        o.has("CLEAR -1") && o.has("USR1 -1") && o.has("KILL 0"),
        "{o:?}"
    );
}

#[test]
fn network_policy_true_is_the_control_for_network_tests() {
    // Same connection as tcp_to_host_loopback_is_blocked, with network allowed: it works.
    let ws = Ws::new();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut p = ws.policy(Level::Full);
    p.network = true;
    let o = run(
        &p,
        &ws.dir,
        &format!("(exec 3<>/dev/tcp/127.0.0.1/{port}) && echo CONNECTED"),
        secs(10),
    );
    assert!(o.has("CONNECTED"), "{o:?}");
    l.set_nonblocking(true).unwrap();
    assert!(l.accept().is_ok());
}

#[test]
fn leaked_harness_fd_does_not_reach_the_command() {
    let ws = Ws::new();
    let outside = ws.base().join("leaked.txt");
    std::fs::write(&outside, "original").unwrap();
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(&outside)
        .unwrap();
    let raw = std::os::fd::AsRawFd::as_raw_fd(&f);
    let p = ws.policy(Level::Full);
    prepare(&p).unwrap();
    let mut cmd = command("bash", &p).unwrap();
    cmd.arg("-c")
        .arg("echo pwn >&50 && echo WROTE; echo CONTROL_OK")
        .env_clear()
        .current_dir(&ws.dir)
        .stdin(Stdio::null());
    // Simulate a harness that leaked a non-CLOEXEC fd: dup it to 50 before the launcher runs.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(raw, 50) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "original",
        "{out:?}"
    );
    assert!(
        !stdout.contains("WROTE") && stdout.contains("CONTROL_OK"),
        "{out:?}"
    );
}

#[test]
fn private_dev_shm_works_for_multiprocessing() {
    let ws = Ws::new();
    let o = run_full(
        &ws,
        "python3 -c 'import multiprocessing as m; print(\"POOL\", sum(m.Pool(2).map(abs, [-1, -2])))'; echo x > /dev/shm/sbx-test && echo SHM_OK",
    );
    assert!(o.has("POOL 3") && o.has("SHM_OK"), "{o:?}");
    assert!(
        !Path::new("/dev/shm/sbx-test").exists(),
        "the command's /dev/shm is the host's"
    );
}

#[test]
fn prepare_reports_unreachable_paths() {
    let ws = Ws::new();
    let hidden = ws.base().join("hidden");
    std::fs::create_dir(&hidden).unwrap();
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut p = ws.policy(Level::Full);
    p.readable.push(hidden.clone());
    let err = prepare(&p).unwrap_err().to_string();
    assert!(
        err.contains("not readable by the sandbox user") && err.contains("chmod o+rX"),
        "{err}"
    );
    p.readable = vec![hidden.join("inner")];
    std::fs::create_dir(hidden.join("inner")).unwrap();
    let err = prepare(&p).unwrap_err().to_string();
    assert!(
        err.contains("not searchable by the sandbox user") && err.contains("chmod o+x"),
        "{err}"
    );
    // Control: once readable, prepare accepts it.
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(hidden.join("inner"), std::fs::Permissions::from_mode(0o755)).unwrap();
    prepare(&p).unwrap();
}

#[test]
fn public_types_are_thread_safe() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<sandbox::SandboxError>();
    assert_send_sync::<Policy>();
    assert_send_sync::<sandbox::Availability>();
}
