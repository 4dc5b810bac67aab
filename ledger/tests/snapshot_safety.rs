//! What a snapshot (often run as root over a directory an untrusted process
//! could still touch) and a checkout will and will not do (#24): no
//! setuid/setgid/sticky bit is recorded or recreated; a file swapped for a
//! symlink, a FIFO, or reached through a directory swapped for a symlink
//! between the walk and the read is an error, never a read of another file
//! or a hang; a directory over the entry or byte limit is refused before
//! anything is read or stored.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use ledger::tree::{self, EntryKind, SnapshotLimits, Tree, TreeEntry, WalkItem};
use ledger::{Id, Ledger, ObjectKind};

#[test]
fn setuid_setgid_and_sticky_bits_are_never_recorded_nor_recreated() {
    let d = tempfile::tempdir().unwrap();
    let ws = d.path().join("ws");
    fs::create_dir_all(ws.join("sub")).unwrap();
    fs::write(ws.join("x"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(ws.join("x"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(ws.join("sub"), fs::Permissions::from_mode(0o3775)).unwrap();
    let l = Ledger::init(&d.path().join("l")).unwrap();
    let t = l.get_tree(&l.snapshot_dir(&ws).unwrap()).unwrap();
    assert_eq!(t.get("x").unwrap().mode, 0o755);
    assert_eq!(t.get("sub").unwrap().mode, 0o775);
    // A stored tree that carries the bits anyway (an older snapshot, or a
    // crafted one) checks out without them.
    let blob = l.put_blob(b"#!/bin/sh\n").unwrap();
    let crafted = Tree::new(vec![
        TreeEntry {
            path: "d".into(),
            kind: EntryKind::Dir,
            mode: 0o1777,
            size: 0,
            blob: [0; 32],
        },
        TreeEntry {
            path: "s".into(),
            kind: EntryKind::File,
            mode: 0o6755,
            size: 10,
            blob: blob.0,
        },
    ])
    .unwrap();
    let id = l.put_tree(&crafted).unwrap();
    let out = d.path().join("out");
    l.checkout(&id, &out).unwrap();
    let mode = |p: &str| {
        fs::symlink_metadata(out.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("s"), 0o755);
    assert_eq!(mode("d"), 0o777);
}

fn item(root: &std::path::Path, rel: &str) -> WalkItem {
    WalkItem {
        rel: rel.into(),
        abs: root.join(rel),
        kind: EntryKind::File,
        mode: 0o644,
    }
}

#[test]
fn a_file_swapped_after_the_walk_is_an_error_not_another_read_nor_a_hang() {
    let d = tempfile::tempdir().unwrap();
    let ws = d.path().join("ws");
    fs::create_dir_all(ws.join("dir")).unwrap();
    let secret = d.path().join("secret");
    fs::write(&secret, b"the harness's key").unwrap();
    // The walk saw regular files; then a process swapped them.
    fs::write(ws.join("f"), b"x").unwrap();
    let walked = tree::walk(&ws).unwrap();
    assert!(walked.iter().any(|i| i.rel == "f"));
    fs::remove_file(ws.join("f")).unwrap();
    std::os::unix::fs::symlink(&secret, ws.join("f")).unwrap();
    let e = tree::read_item_beneath(&ws, &item(&ws, "f")).unwrap_err();
    assert!(!e.to_string().contains("the harness's key"), "{e}");
    // Through a directory swapped for a symlink.
    fs::remove_dir(ws.join("dir")).unwrap();
    std::os::unix::fs::symlink(d.path(), ws.join("dir")).unwrap();
    assert!(tree::read_item_beneath(&ws, &item(&ws, "dir/secret")).is_err());
    // A FIFO: an error at once, not a read that waits for a writer.
    let fifo = ws.join("p");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let t = Instant::now();
    assert!(tree::read_item_beneath(&ws, &item(&ws, "p")).is_err());
    assert!(t.elapsed() < Duration::from_secs(2));
    // The control: an untouched file reads.
    fs::write(ws.join("ok"), b"fine").unwrap();
    assert_eq!(
        tree::read_item_beneath(&ws, &item(&ws, "ok")).unwrap(),
        b"fine"
    );
}

#[test]
fn a_directory_over_the_snapshot_limits_is_refused_before_anything_is_stored() {
    let d = tempfile::tempdir().unwrap();
    let ws = d.path().join("ws");
    fs::create_dir_all(&ws).unwrap();
    for i in 0..10 {
        fs::write(ws.join(format!("f{i}")), vec![b'a' + i as u8; 1000]).unwrap();
    }
    let l = Ledger::init(&d.path().join("l")).unwrap();
    for limits in [
        SnapshotLimits {
            max_entries: 5,
            max_bytes: 1 << 20,
        },
        SnapshotLimits {
            max_entries: 100,
            max_bytes: 5_000,
        },
    ] {
        let before = l.object_count().unwrap();
        let mut b = l.batch();
        let e = b.snapshot_dir_limited(&ws, limits).unwrap_err();
        assert!(e.to_string().contains("snapshot limit"), "{e}");
        assert!(b.is_empty(), "nothing was added to the batch");
        drop(b);
        assert_eq!(l.object_count().unwrap(), before);
    }
    let mut b = l.batch();
    b.snapshot_dir_limited(
        &ws,
        SnapshotLimits {
            max_entries: 10,
            max_bytes: 10_000,
        },
    )
    .unwrap();
    b.commit().unwrap();
    assert!(l
        .contains(&Id::of(ObjectKind::Blob, &[b'a'; 1000]))
        .unwrap());
}
