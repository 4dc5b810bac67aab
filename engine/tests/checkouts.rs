//! Adapter checkouts are housekeeping, not data: each set of backends
//! keeps its own directory and removes it when the last clone goes; the
//! directory of a process killed outright is removed by the next process
//! to check anything out; a live process's directory is left alone.

use std::collections::BTreeMap;

use engine::backend::Backends;

fn tree(l: &ledger::Ledger, dir: &std::path::Path) -> ledger::Id {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("adapter.gguf"), b"weights").unwrap();
    l.snapshot_dir(dir).unwrap()
}

#[test]
fn checkouts_go_with_their_backends_and_with_dead_processes() {
    let d = tempfile::tempdir().unwrap();
    let l = ledger::Ledger::init(&d.path().join("ledger")).unwrap();
    let id = tree(&l, &d.path().join("adapter"));
    // A directory left by a process that is gone (no such pid), and one
    // of a live process (this one, under another name).
    let tmp = std::env::temp_dir();
    let dead = tmp.join("mass-adapters-4194304999-left");
    let live = tmp.join(format!("mass-adapters-{}-other", std::process::id()));
    std::fs::create_dir_all(dead.join("x")).unwrap();
    std::fs::create_dir_all(&live).unwrap();

    let b = Backends::build(&BTreeMap::new(), d.path()).unwrap();
    let dir = b.checkout_adapter(&l, &id).unwrap();
    assert_eq!(std::fs::read(dir.join("adapter.gguf")).unwrap(), b"weights");
    // Checked out once per content.
    assert_eq!(b.checkout_adapter(&l, &id).unwrap(), dir);
    assert!(!dead.exists(), "a dead process's checkouts stayed");
    assert!(live.exists(), "a live process's checkouts were removed");
    let root = b.checkouts_dir().expect("made");
    let clone = b.clone();
    drop(b);
    assert!(root.exists(), "removed while a clone still serves from it");
    drop(clone);
    assert!(!root.exists(), "the backends' checkouts outlived them");
    let _ = std::fs::remove_dir_all(&live);
}
