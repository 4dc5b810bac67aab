//! Golden ids: the content address of fixed objects is pinned to literal hashes.
//! If a dependency upgrade or a layout change would re-address stored objects,
//! these fail. Changing an expected value here means every existing ledger's ids
//! change: that needs a format version bump, not an edit of this file.

use ledger::{EntryKind, EventEnvelope, Id, Ledger, NewEvent, ObjectKind, Tree, TreeEntry};

/// The BLAKE3 crate itself must hash as the reference says (official vectors,
/// copied with their source into fixtures/blake3_vectors.json).
#[test]
fn blake3_matches_official_test_vectors() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/blake3_vectors.json"
    ))
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = v["cases"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for c in cases {
        let n = c["input_len"].as_u64().unwrap() as usize;
        let input: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        assert_eq!(
            blake3::hash(&input).to_hex().as_str(),
            c["hash"].as_str().unwrap(),
            "input_len {n}"
        );
    }
}

#[test]
fn blob_id_is_pinned() {
    assert_eq!(
        Id::of(ObjectKind::Blob, b"hello, ledger\n").to_hex(),
        "a360b28bf61986c96e9f3d07e94db0170940b08d2f84e6b7f552f0c7099e9320"
    );
    // Domain separation: the tag is hashed before the bytes.
    let mut h = blake3::Hasher::new();
    h.update(b"mass.blob\0");
    h.update(b"hello, ledger\n");
    assert_eq!(
        Id::of(ObjectKind::Blob, b"hello, ledger\n").0,
        *h.finalize().as_bytes()
    );
}

fn fixed_tree() -> Tree {
    Tree::new(vec![
        TreeEntry {
            path: "data/prices.csv".into(),
            kind: EntryKind::File,
            mode: 0o644,
            size: 14,
            blob: Id::of(ObjectKind::Blob, b"hello, ledger\n").0,
        },
        TreeEntry {
            path: "data".into(),
            kind: EntryKind::Dir,
            mode: 0o755,
            size: 0,
            blob: [0; 32],
        },
        TreeEntry {
            path: "run.sh".into(),
            kind: EntryKind::File,
            mode: 0o755,
            size: 0,
            blob: Id::of(ObjectKind::Blob, b"").0,
        },
        TreeEntry {
            path: "latest".into(),
            kind: EntryKind::Symlink,
            mode: 0o777,
            size: 4,
            blob: Id::of(ObjectKind::Blob, b"data").0,
        },
    ])
    .unwrap()
}

#[test]
fn tree_id_is_pinned() {
    let t = fixed_tree();
    let bytes = t.to_bytes().unwrap();
    assert_eq!(
        Id::of(ObjectKind::Tree, &bytes).to_hex(),
        "8b84a3053ddacd0de7f501b89ba9b3f64cd47b86760d66818a40589cff6d4f3d"
    );
}

fn fixed_envelope() -> EventEnvelope {
    EventEnvelope {
        kind: "note".into(),
        version: 1,
        stream: "golden/stream".into(),
        seq: 7,
        prev: Some([0xab; 32]),
        parents: vec![[0x01; 32], [0x02; 32]],
        refs: vec![[0x03; 32]],
        payload: b"payload bytes".to_vec(),
    }
}

#[test]
fn event_id_is_pinned() {
    let bytes = fixed_envelope().to_bytes().unwrap();
    assert_eq!(
        Id::of(ObjectKind::Event, &bytes).to_hex(),
        "a9d5f5159420737259890fe0323f132a2c7433f4d52c759c17c8a3a4c9748c07"
    );
}

/// The same objects stored through a real ledger get the same ids, and
/// wall-clock metadata does not leak into the hash.
#[test]
fn ledger_assigns_pinned_ids_regardless_of_time_and_host() {
    let mut ids = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let l = Ledger::init(dir.path()).unwrap();
        let blob = l.put_blob(b"hello, ledger\n").unwrap();
        let e0 = l
            .append(
                "golden",
                None,
                NewEvent::new("note", 1, b"a".to_vec())
                    .with_refs(vec![blob])
                    .with_meta("latency_ms", "12"),
            )
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let e1 = l
            .append(
                "golden",
                Some(e0),
                NewEvent::new("note", 1, b"b".to_vec()).with_meta("latency_ms", "99"),
            )
            .unwrap();
        ids.push((blob, e0, e1));
    }
    assert_eq!(ids[0], ids[1]);
    assert_eq!(
        ids[0].2.to_hex(),
        "80f0266461342917c95369b7431fff4f61ed45bbade6235f4f47b2b95684719d"
    );
}

/// Every variant of `ObjectKind` with its on-disk number (FORMAT.md). The
/// match has no wildcard: a new variant does not compile until it is pinned.
fn object_kinds() -> [(ObjectKind, u8); 3] {
    let all = [
        (ObjectKind::Blob, 1),
        (ObjectKind::Tree, 2),
        (ObjectKind::Event, 3),
    ];
    for (k, _) in &all {
        match k {
            ObjectKind::Blob | ObjectKind::Tree | ObjectKind::Event => {}
        }
    }
    all
}

/// The numbers of the object kinds are format constants: they are written as
/// record types and stored in the index. A reorder or renumbering must fail.
#[test]
fn object_kind_discriminants_are_pinned() {
    for (kind, number) in object_kinds() {
        assert_eq!(kind as u8, number, "{kind} must stay record type {number}");
    }
}

/// `EntryKind` is archived by rkyv inside every tree, by its position in the
/// declaration (File=0, Symlink=1, Dir=2 in FORMAT.md). One single-entry tree
/// per variant is pinned, so swapping any two variants changes a pinned id
/// (the mixed tree above would not catch every swap on its own).
#[test]
fn entry_kind_variants_are_pinned() {
    let pins = [
        (
            EntryKind::File,
            "file",
            "fad054a916e3876bbb23a5a20e440973d4f8a0e4bab07f02b254f037deead25d",
        ),
        (
            EntryKind::Symlink,
            "symlink",
            "73b6f9f1cce1a838cfafe95a4029377b56f7866f16044896de4f2591fcc2f491",
        ),
        (
            EntryKind::Dir,
            "dir",
            "e17e6cec81fc1fc186520e8605f62ef0f92d46dbb0844b67417b67a18cf3f985",
        ),
    ];
    for (kind, _, _) in &pins {
        match kind {
            EntryKind::File | EntryKind::Symlink | EntryKind::Dir => {}
        }
    }
    for (kind, name, want) in pins {
        assert_eq!(kind.name(), name);
        let (mode, size, blob) = match kind {
            EntryKind::Dir => (0o755, 0, [0; 32]),
            EntryKind::Symlink => (0o777, 4, Id::of(ObjectKind::Blob, b"data").0),
            EntryKind::File => (0o644, 4, Id::of(ObjectKind::Blob, b"data").0),
        };
        let t = Tree::new(vec![TreeEntry {
            path: "x".into(),
            kind,
            mode,
            size,
            blob,
        }])
        .unwrap();
        assert_eq!(
            Id::of(ObjectKind::Tree, &t.to_bytes().unwrap()).to_hex(),
            want,
            "the encoding of EntryKind::{kind:?} changed: stored trees would read as another kind"
        );
    }
}

/// The record type byte of each record as written to a segment file (offset 4
/// of the record header, FORMAT.md): 1 blob, 2 tree, 3 event, 4 ref update,
/// 5 commit. Read from real files, so this holds whatever the writer's
/// internal types are called.
#[test]
fn record_type_bytes_on_disk_are_pinned() {
    use ledger::format::{RECORD_HEADER_LEN, RECORD_MAGIC, RECORD_TRAILER_LEN, SEGMENT_HEADER_LEN};
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::init(dir.path()).unwrap();
    let blob = l.put_blob(b"hello, ledger\n").unwrap();
    l.put_blob(b"").unwrap();
    l.put_blob(b"data").unwrap();
    let tree = l.put_tree(&fixed_tree()).unwrap();
    let ev = l
        .append(
            "golden",
            None,
            NewEvent::new("note", 1, b"a".to_vec()).with_refs(vec![blob, tree]),
        )
        .unwrap();
    drop(l);

    let mut seen = Vec::new();
    let mut segs: Vec<_> = std::fs::read_dir(dir.path().join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segs.sort();
    for seg in segs {
        let bytes = std::fs::read(&seg).unwrap();
        let mut at = SEGMENT_HEADER_LEN as usize;
        while at < bytes.len() {
            let h = &bytes[at..at + RECORD_HEADER_LEN];
            assert_eq!(&h[..4], RECORD_MAGIC, "record at {at}");
            let body = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
            let meta = u32::from_le_bytes(h[12..16].try_into().unwrap()) as usize;
            let id = Id::from_slice(&h[20..52]).unwrap();
            seen.push((h[4], id));
            at += RECORD_HEADER_LEN + body + meta + RECORD_TRAILER_LEN;
        }
    }
    let type_of = |want: Id| {
        seen.iter()
            .find(|(_, id)| *id == want)
            .map(|(t, _)| *t)
            .unwrap_or_else(|| panic!("{want} was not written"))
    };
    assert_eq!(type_of(blob), 1, "blob record type");
    assert_eq!(type_of(tree), 2, "tree record type");
    assert_eq!(type_of(ev), 3, "event record type");
    let types: Vec<u8> = seen.iter().map(|(t, _)| *t).collect();
    // put_blob x3, put_tree, append (event, its ref update): a commit after each.
    assert_eq!(
        types,
        [1, 5, 1, 5, 1, 5, 2, 5, 3, 4, 5],
        "record types in log order"
    );
}
