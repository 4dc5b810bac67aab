//! Two rollouts side by side attack each other (#24): from one workspace, a
//! command tries to change (chmod, utime, xattr, rename, link, delete),
//! read, list and watch the other's workspace, home and check copy, which
//! all sit beside it under one parent, as the engine lays them out. Each
//! attack is a case of `common` with its guards:
//!
//! - the view (`Policy::hide`, Level::Full): the sibling cannot be named
//!   (ENOENT), while the same operation on the command's own file works
//!   (the control);
//! - behind it, the scratch root's mode 0700 (file modes, the command is
//!   not root): EACCES;
//! - behind that, for the operations Landlock governs (rename, link,
//!   unlink, read, list): Landlock. chmod, utime, xattrs and inotify are
//!   not governed by Landlock: with the view off and the root traversable
//!   they get through, which is why the view exists.
//!
//! The runs: every layer in force; the view off (root 0700: EACCES); and,
//! with a traversable root (0711, as a layout that let every local user
//! through would be), the view off, then the view and Landlock off. The
//! mode is the fixture's, not a switch: switching `DropRoot` off would make
//! the command root of its user namespace, which has no rights over the
//! files of uid 65534 either.
//! Must run as root on a machine where `probe().check(Level::Full)` passes.

mod common;

use common::{errno, fixed, guard, Case, Outcome};
use sandbox::{command, prepare, probe, Layer, Level, Policy};
use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One mass process's scratch root (mode 0700, root's, or 0711) with two
/// rollouts: each a workspace, its `.home` and its `.checks` copy.
struct Scratch {
    _base: tempfile::TempDir,
    root: PathBuf,
}

/// The sibling's files each attack aims at (one per attack, so an attack
/// that gets through does not change the next one's target).
const TARGETS: &[&str] = &[
    "f_chmod", "f_utime", "f_xattr", "f_rename", "f_link", "f_unlink",
];

impl Scratch {
    fn new(root_mode: u32) -> Scratch {
        let base = tempfile::Builder::new()
            .prefix("iso-")
            .tempdir_in("/tmp")
            .unwrap();
        let root = base.path().join("mass-work");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(root_mode)).unwrap();
        for r in ["r1", "r2"] {
            let ws = root.join(r);
            std::fs::create_dir_all(ws.join(".tmp")).unwrap();
            for f in TARGETS.iter().chain(&["f", "c", "d"]) {
                std::fs::write(ws.join(f), format!("{r}'s file\n")).unwrap();
            }
            std::fs::create_dir(root.join(format!("{r}.home"))).unwrap();
            std::fs::write(root.join(format!("{r}.home/key")), "home state").unwrap();
            std::fs::create_dir(root.join(format!("{r}.checks"))).unwrap();
            std::fs::write(root.join(format!("{r}.checks/check.py")), "print('ok')").unwrap();
        }
        Scratch { _base: base, root }
    }

    fn ws(&self, r: &str) -> PathBuf {
        self.root.join(r)
    }

    fn home(&self, r: &str) -> PathBuf {
        self.root.join(format!("{r}.home"))
    }

    fn policy(&self, r: &str, off: &BTreeSet<Layer>) -> Policy {
        let mut p = Policy::new(Level::Full, &self.ws(r));
        p.writable.push(self.home(r));
        p.hide = vec![self.root.clone()];
        p.unprotected = off.iter().copied().collect();
        p
    }
}

/// The attacks of rollout `me` on rollout `other`, with their guards for a
/// scratch root of mode 0700 (`closed`) or 0711.
fn cases(s: &Scratch, me: &str, other: &str, closed: bool) -> Vec<Case> {
    use Layer::*;
    let o = s.ws(other);
    let od = o.display();
    let (enoent, eacces) = (errno(libc::ENOENT), errno(libc::EACCES));
    let view = || {
        guard(
            View,
            enoent.clone(),
            "the view: the sibling cannot be named",
        )
    };
    let modes = || {
        fixed(
            eacces.clone(),
            "file modes: the scratch root is 0700 root's",
        )
    };
    let landlock = |e: i32| {
        guard(
            LandlockFs,
            errno(e),
            "Landlock: the sibling is outside the rules",
        )
    };
    let target = |f: &str| s.ws(other).join(f);
    let with = |c: Case, ll: Option<i32>| {
        // A control naming its own path below a 0700 root needs the view
        // (it binds the path back); without it the mode refuses it too.
        let own_abs = c.control.contains(&*s.root.to_string_lossy());
        let c = if closed && own_abs {
            c.control_needs(View)
        } else {
            c
        };
        let c = c.guard(view());
        let c = if closed { c.guard(modes()) } else { c };
        match ll {
            Some(e) => c.guard(landlock(e)),
            None => c,
        }
    };
    let inotify = |path: &str| {
        format!(
            "fd = libc.inotify_init()\nif libc.inotify_add_watch(fd, b'{path}', 0xfff) < 0:\n    e = ctypes.get_errno()\n    raise OSError(e, os.strerror(e))"
        )
    };
    vec![
        with(
            Case::new(
                "chmod",
                format!("os.chmod('{od}/f_chmod', 0)"),
                "os.chmod('f', 0o600)",
            ),
            None,
        )
        .effect(changed(target("f_chmod"), |m| {
            m.is_some_and(|m| m.mode() & 0o777 == 0)
        })),
        with(
            Case::new(
                "utime",
                format!("os.utime('{od}/f_utime', (978307200, 978307200))"),
                "os.utime('f', (978307200, 978307200))",
            ),
            None,
        )
        .effect(changed(target("f_utime"), |m| {
            m.is_some_and(|m| m.mtime() == 978307200)
        })),
        with(
            Case::new(
                "setxattr",
                format!("os.setxattr('{od}/f_xattr', 'user.x', b'1')"),
                "os.setxattr('f', 'user.x', b'1')",
            ),
            None,
        )
        .effect({
            let p = target("f_xattr");
            move || xattr_set(&p)
        }),
        with(
            Case::new(
                "rename",
                format!("os.rename('{od}/f_rename', '{od}/g')"),
                "os.rename('c', 'c2')",
            ),
            Some(libc::EACCES),
        )
        .effect(changed(target("f_rename"), |m| m.is_none())),
        with(
            Case::new(
                "link",
                format!("os.link('{od}/f_link', 'linked')"),
                "os.link('f', 'f2')",
            ),
            Some(libc::EXDEV),
        )
        .effect(changed(target("f_link"), |m| {
            m.is_some_and(|m| m.nlink() == 2)
        })),
        with(
            Case::new(
                "unlink",
                format!("os.unlink('{od}/f_unlink')"),
                "os.unlink('d')",
            ),
            Some(libc::EACCES),
        )
        .effect(changed(target("f_unlink"), |m| m.is_none())),
        with(
            Case::new(
                "read_home",
                format!("open('{}/key').read()", s.home(other).display()),
                format!("open('{}/key').read()", s.home(me).display()),
            ),
            Some(libc::EACCES),
        ),
        with(
            Case::new(
                "list_workspace",
                format!("os.listdir('{od}')"),
                "os.listdir('.')",
            ),
            Some(libc::EACCES),
        ),
        with(
            Case::new(
                "list_checks",
                format!(
                    "os.listdir('{}')",
                    s.root.join(format!("{other}.checks")).display()
                ),
                format!("os.listdir('{}')", s.home(me).display()),
            ),
            Some(libc::EACCES),
        ),
        with(
            Case::new("inotify", inotify(&od.to_string()), inotify(".")),
            None,
        ),
        // `..` is the view's cover: Landlock grants nothing on it, and
        // without Landlock it holds only this rollout's own mount points.
        {
            let c = Case::new(
                "list_parent",
                format!(
                    "names = os.listdir('..')\nif '{other}' not in names:\n    raise Refused('own names only')"
                ),
                "os.listdir('.')",
            )
            .guard(guard(LandlockFs, eacces.clone(), "Landlock: no right on the view's cover"))
            .guard(guard(View, Outcome::Refused("own names only"), "the view: the cover holds own mount points only"));
            c.guard(if closed {
                modes()
            } else {
                fixed(
                    eacces.clone(),
                    "file modes: the scratch root is 0711 (others may traverse, not list)",
                )
            })
        },
    ]
}

/// A host-side check on the sibling's file `p`: `test` gets its metadata
/// (None once it is gone).
fn changed(
    p: PathBuf,
    test: fn(Option<std::fs::Metadata>) -> bool,
) -> impl Fn() -> bool + Send + 'static {
    move || test(std::fs::symlink_metadata(&p).ok())
}

fn xattr_set(p: &Path) -> bool {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: valid C strings and a null buffer of size 0 (size query).
    unsafe { libc::getxattr(c.as_ptr(), c"user.x".as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}

fn spawn(policy: &Policy, ws: &Path, script: &str) -> std::process::Child {
    prepare(policy).unwrap();
    let mut cmd: Command = command("python3", policy).unwrap();
    cmd.arg("-c")
        .arg(script)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", ws)
        .current_dir(ws)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

/// Both rollouts attack each other at the same time with `off` switched
/// off; returns the mismatches with what each rollout printed.
fn run_pair(root_mode: u32, off: &BTreeSet<Layer>) -> Vec<String> {
    let s = Scratch::new(root_mode);
    let closed = root_mode == 0o700;
    let (c1, c2) = (cases(&s, "r1", "r2", closed), cases(&s, "r2", "r1", closed));
    let a = spawn(&s.policy("r1", off), &s.ws("r1"), &common::script(&c1));
    let b = spawn(&s.policy("r2", off), &s.ws("r2"), &common::script(&c2));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let mut bad = Vec::new();
    for (who, cases, out) in [("r1", &c1, &a), ("r2", &c2, &b)] {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mine = common::check(Level::Full, off, cases, &stdout);
        if !mine.is_empty() {
            bad.extend(
                mine.into_iter()
                    .map(|l| format!("{who} (root {root_mode:o}): {l}")),
            );
            bad.push(format!(
                "--- {who} stdout\n{stdout}--- stderr\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    bad
}

fn available() -> bool {
    let p = probe();
    p.root && p.check(Level::Full).is_ok()
}

#[test]
fn rollouts_side_by_side_cannot_touch_each_other() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    let bad = run_pair(0o700, &BTreeSet::new());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The view switched off, and what stands behind it: with the scratch root
/// 0700 every attack fails on its mode (EACCES); with a traversable root,
/// chmod, utime, xattrs and inotify get through (Landlock does not govern
/// them) and the rest fail on Landlock, until Landlock is off too.
#[test]
fn switched_off_view() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    let mut bad = Vec::new();
    for mode in [0o700, 0o711] {
        let s = Scratch::new(mode);
        let mut sets: Vec<BTreeSet<Layer>> = Vec::new();
        for c in cases(&s, "r1", "r2", mode == 0o700) {
            for (_, set) in c.off_sets() {
                if set.contains(&Layer::View) && !sets.contains(&set) {
                    sets.push(set);
                }
            }
        }
        for off in sets {
            bad.extend(run_pair(mode, &off));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Landlock switched off with the view in force: only `..` changes (the
/// cover lists this rollout's own mount points, nothing of the sibling).
#[test]
fn switched_off_landlock_fs_behind_the_view() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    let bad = run_pair(0o700, &[Layer::LandlockFs].into_iter().collect());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The symlink-swap race (#24): while `prepare` (run as root) hands a
/// workspace to the sandbox uid, a surviving process keeps swapping a
/// directory of it for a symlink to a host directory. No host file may end
/// up owned by the sandbox uid: every step of the walk is relative to a
/// directory fd opened without following links.
#[test]
fn a_directory_swapped_for_a_symlink_never_steers_prepare_outside() {
    if !available() {
        eprintln!("skipped: needs root and Level::Full");
        return;
    }
    let s = Scratch::new(0o711);
    let host = tempfile::tempdir().unwrap();
    for i in 0..50 {
        std::fs::write(host.path().join(format!("f{i}")), "host").unwrap();
    }
    let ws = s.ws("r1");
    let d = ws.join("dd");
    let link = ws.join("dd.link");
    std::fs::create_dir(&d).unwrap();
    for i in 0..50 {
        std::fs::write(d.join(format!("f{i}")), "ws").unwrap();
    }
    std::os::unix::fs::symlink(host.path(), &link).unwrap();
    let (cd, cl) = (
        std::ffi::CString::new(d.to_str().unwrap()).unwrap(),
        std::ffi::CString::new(link.to_str().unwrap()).unwrap(),
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            // `dd` is always either the directory or the symlink: swapped
            // atomically (RENAME_EXCHANGE), as fast as possible.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: valid C strings.
                unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        cd.as_ptr(),
                        libc::AT_FDCWD,
                        cl.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    );
                }
            }
        });
        // Traversable without the view: the race is prepare's, at any level.
        let mut policy = s.policy("r1", &BTreeSet::new());
        policy.hide.clear();
        for _ in 0..200 {
            let _ = prepare(&policy);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    for e in std::fs::read_dir(host.path()).unwrap() {
        let m = e.unwrap().metadata().unwrap();
        assert_eq!(m.uid(), 0, "a host file was handed to the sandbox uid");
    }
    assert_eq!(std::fs::metadata(host.path()).unwrap().uid(), 0);
}
