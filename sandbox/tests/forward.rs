//! Loopback endpoints (#24, item 3): a command without network reaches its
//! own unix socket through 127.0.0.1:PORT in its own network namespace, and
//! nothing else: not a TCP server on the host's loopback, not another
//! rollout's socket, not a unix socket by path (no AF_UNIX at all). Each
//! attack is a case of `common`, with its guards:
//!
//! - TCP to the host's loopback: Landlock (connect only to the endpoint's
//!   port, EACCES), behind it the network namespace (nothing listens on
//!   that port in it: ECONNREFUSED); with both off the host's server
//!   answers;
//! - TCP to another port: Landlock (EACCES), behind it nothing there;
//! - TCP off the machine: Landlock, behind it the namespace (no route:
//!   ENETUNREACH); never run with the namespace off (it would leave the
//!   machine);
//! - unix sockets by path (its own, another rollout's): seccomp (only IP
//!   sockets, EPERM); behind it, for the other rollout's, the view (ENOENT)
//!   and the scratch root's mode 0700 (EACCES).
//!
//! The control of every case is the command's own endpoint (it needs the
//! network namespace, and the view that binds the socket's path back
//! below the 0700 scratch root for the relay).
//! Must run as root on a machine where `probe().check(Level::Full)` passes.

mod common;

use common::{errno, fixed, guard, Case};
use sandbox::{command, prepare, probe, Forward, Layer, Level, Policy};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn available() -> bool {
    let p = probe();
    p.root && p.check(Level::Full).is_ok()
}

/// A unix-socket server answering every connection with `reply` once it
/// has read a line; runs until the test ends.
fn serve(path: &Path, reply: &'static str) {
    let l = UnixListener::bind(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut c = c;
                let mut b = [0u8; 256];
                let _ = c.read(&mut b);
                let _ = c.write_all(reply.as_bytes());
            });
        }
    });
}

/// A free port on the host's loopback (nothing listens there afterwards).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

struct Setup {
    _base: tempfile::TempDir,
    root: PathBuf,
    /// The endpoint's port (free on the host, so with the network
    /// namespace off nothing answers there).
    port: u16,
    /// A TCP server on the host's loopback, and how many connections it got.
    host_port: u16,
    host_hits: Arc<AtomicUsize>,
}

fn setup() -> Setup {
    let base = tempfile::Builder::new()
        .prefix("fwd-")
        .tempdir_in("/tmp")
        .unwrap();
    let root = base.path().join("mass-work");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
    for r in ["r1", "r2"] {
        std::fs::create_dir_all(root.join(r).join(".tmp")).unwrap();
        serve(
            &root.join(format!("{r}.sock")),
            if r == "r1" { "MINE\n" } else { "OTHERS\n" },
        );
    }
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    let host_hits = Arc::new(AtomicUsize::new(0));
    let hits = host_hits.clone();
    std::thread::spawn(move || {
        for c in host.incoming().flatten() {
            hits.fetch_add(1, Ordering::SeqCst);
            let mut c = c;
            let _ = c.write_all(b"HOST\n");
        }
    });
    Setup {
        _base: base,
        root,
        port: free_port(),
        host_port,
        host_hits,
    }
}

const TCP: &str = "s = socket.create_connection((HOST, PORT), timeout=3)\ns.sendall(b'hello\\n')\nr = s.recv(64).decode().strip()\nif r != WANT:\n    raise Refused('got ' + r)";

fn tcp(host: &str, port: u16, want: &str) -> String {
    TCP.replace("HOST", &format!("'{host}'"))
        .replace("PORT", &port.to_string())
        .replace("WANT", &format!("'{want}'"))
}

fn unix(path: &Path, want: &str) -> String {
    format!(
        "s = socket.socket(socket.AF_UNIX)\ns.connect('{}')\ns.sendall(b'hello\\n')\nif s.recv(64).decode().strip() != '{want}':\n    raise Refused('wrong reply')",
        path.display()
    )
}

fn cases(s: &Setup, off: &BTreeSet<Layer>) -> Vec<Case> {
    use Layer::*;
    let (eacces, eperm) = (errno(libc::EACCES), errno(libc::EPERM));
    let landlock = || {
        guard(
            LandlockNet,
            eacces.clone(),
            "Landlock: TCP connect to the endpoint's port only",
        )
    };
    let seccomp = || guard(Seccomp, eperm.clone(), "seccomp: IP sockets only");
    let modes = || {
        fixed(
            eacces.clone(),
            "file modes: the scratch root is 0700 root's",
        )
    };
    // The control: the command's own endpoint, which needs the network
    // namespace, and the view to bind the socket back for the relay.
    let case = |name, attack: String| {
        Case::new(name, attack, tcp("127.0.0.1", s.port, "MINE"))
            .control_needs(NetNamespace)
            .control_needs(View)
    };
    let hits = s.host_hits.clone();
    let mut v = vec![
        case(
            "tcp_to_host_loopback",
            tcp("127.0.0.1", s.host_port, "HOST"),
        )
        .guard(landlock())
        .guard(guard(
            NetNamespace,
            errno(libc::ECONNREFUSED),
            "network namespace: nothing listens there in it",
        ))
        .effect(move || hits.load(Ordering::SeqCst) > 0),
        case("tcp_to_another_port", tcp("127.0.0.1", free_port(), "-"))
            .guard(landlock())
            .open(errno(libc::ECONNREFUSED)),
        case("own_socket_by_path", unix(&s.root.join("r1.sock"), "MINE"))
            .guard(seccomp())
            .guard(modes().only_without(View)),
        case(
            "other_rollouts_socket_by_path",
            unix(&s.root.join("r2.sock"), "OTHERS"),
        )
        .guard(seccomp())
        .guard(guard(
            View,
            errno(libc::ENOENT),
            "the view: the other rollout's socket cannot be named",
        ))
        .guard(modes()),
    ];
    if !off.contains(&NetNamespace) {
        // Without the namespace this would try the real network.
        v.push(
            case("tcp_off_the_machine", tcp("10.0.0.1", 80, "-"))
                .guard(landlock())
                .guard(fixed(
                    errno(libc::ENETUNREACH),
                    "network namespace: no route but `lo`",
                )),
        );
    }
    v
}

fn run(s: &Setup, off: &BTreeSet<Layer>) -> Vec<String> {
    let ws = s.root.join("r1");
    let sock = s.root.join("r1.sock");
    let mut p = Policy::new(Level::Full, &ws);
    p.hide = vec![s.root.clone()];
    p.readable.push(sock.clone());
    p.forward = vec![Forward {
        port: s.port,
        socket: sock,
    }];
    p.unprotected = off.iter().copied().collect();
    prepare(&p).unwrap();
    let cases = cases(s, off);
    let out = command("python3", &p)
        .unwrap()
        .arg("-c")
        .arg(common::script(&cases))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir(&ws)
        .process_group(0)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut bad = common::check(Level::Full, off, &cases, &stdout);
    if !bad.is_empty() {
        bad.push(format!(
            "--- stdout\n{stdout}--- stderr\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    bad
}

#[test]
fn a_command_reaches_its_own_endpoint_and_nothing_else() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    let bad = run(&setup(), &BTreeSet::new());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Each guard switched off in turn (with those consulted before it): the
/// case then ends in the next guard's errno, or reaches the host.
#[test]
fn switched_off_one_layer_at_a_time() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    let s = setup();
    let mut sets: Vec<BTreeSet<Layer>> = Vec::new();
    for c in cases(&s, &BTreeSet::new()) {
        for (_, set) in c.off_sets() {
            if !sets.contains(&set) {
                sets.push(set);
            }
        }
    }
    let mut bad = Vec::new();
    for off in sets {
        // A fresh setup per run: the host server counts connections.
        bad.extend(run(&setup(), &off));
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
