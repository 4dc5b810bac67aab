//! Fails when a record type's encoding changes without its schema version changing.
//!
//! Each known (kind, version) is pinned to the BLAKE3 of its sample value's
//! encoding. Changing a type's fields changes that hash: bump the type's VERSION,
//! keep a decoder for the old version, and add a new pin line. Editing an
//! existing pin line instead would silently change the meaning of stored bytes.

use schemas::{
    encode, known_kinds, Effect, ModelCall, Note, Record, RunForked, RunStarted, WorkspaceSnapshot,
};

/// (kind, version, blake3 of the sample encoding)
const PINS: &[(&str, u32, &str)] = &[
    (
        "mass.rollout",
        1,
        "ecf8a30c87c77567b66c8fa0de10633caa7eb6630547f18f270dc459ee9b7878",
    ),
    (
        "mass.judgment",
        1,
        "32f0636cff8e369eaf72c066443b9b2f8c6d96a3dae5a7e71e2dcaa61702a35f",
    ),
    (
        "mass.proposal",
        1,
        "837a39fe47421e58cfdb42ec17c0cad18589d8a4b73910850e0ffdcae22ab5f1",
    ),
    (
        "mass.promotion",
        1,
        "f361b7ee7be0ee8c5043cf0e49a0e0825d738d180b1a067989b3374fe99f5670",
    ),
    (
        "mass.ranking",
        1,
        "b45efeca3030b4158f57dfa976ca2c5397750f20e2345418203013f0e5d3e638",
    ),
    (
        "mass.selection",
        1,
        "08beff78834c6f6f0bc404fb6535ede9fc65f8ae2306a8f948284297a611c001",
    ),
    (
        "mass.dataset",
        1,
        "0c4525d26e3ce9eb36c77c75ba3db344520f50a636ca18bc03b28bfd324ae1cc",
    ),
    (
        "mass.training",
        1,
        "e5ec190a1a918157c01add7ee74bee462e82387dc4f400b74788806e1b3ca27a",
    ),
    (
        "mass.evaluation",
        1,
        "eeec9185d66d4623b5cce108a2d1fccb94c8706f477b2fb6c6cbd3be626882fc",
    ),
    (
        "mass.cycle",
        1,
        "ad3791f13c6db4a38f5a3e5663b510a7ce4c23aa106dbe09f46a3226574a9e00",
    ),
    (
        "note",
        1,
        "befd1f7ba49999fc67fd317fc810137c4c78c341b7d251035f6706b73103a904",
    ),
    (
        "model.call",
        1,
        "bc68989794851dedd7fb5c121421bf7a7ca61ccf6c4498a88a3e50f96675c49e",
    ),
    (
        "effect",
        1,
        "15e6fccf049d93e758cc32759547763b85a060bebbde35b853b046748d277ea5",
    ),
    (
        "run.started",
        1,
        "9fa8d7362ac1b6f39a9386b98a4c4e3a1b49d96bf1d08d8d195daaccbe7e4916",
    ),
    (
        "run.forked",
        1,
        "d5dfbeaaa4c3965704fa40ff032000709ce4840d540b3d5dfe89080aabe584e7",
    ),
    (
        "workspace.snapshot",
        1,
        "b119bf211a219395b735df14121a61932cf9c0b590c1c299d735d1eaee077e52",
    ),
];

fn sample_hash(kind: &str) -> String {
    let bytes = match kind {
        "note" => encode(&Note::sample()),
        "model.call" => encode(&ModelCall::sample()),
        "workspace.snapshot" => encode(&WorkspaceSnapshot::sample()),
        "effect" => encode(&Effect::sample()),
        "run.started" => encode(&RunStarted::sample()),
        "run.forked" => encode(&RunForked::sample()),
        "mass.rollout" => encode(&schemas::Rollout::sample()),
        "mass.judgment" => encode(&schemas::Judgment::sample()),
        "mass.proposal" => encode(&schemas::ProposalRecord::sample()),
        "mass.promotion" => encode(&schemas::Promotion::sample()),
        "mass.ranking" => encode(&schemas::Ranking::sample()),
        "mass.selection" => encode(&schemas::Selection::sample()),
        "mass.dataset" => encode(&schemas::Dataset::sample()),
        "mass.training" => encode(&schemas::Training::sample()),
        "mass.evaluation" => encode(&schemas::Evaluation::sample()),
        "mass.cycle" => encode(&schemas::Cycle::sample()),
        other => panic!("kind {other} has no sample in this test: add it"),
    }
    .unwrap();
    blake3::hash(&bytes).to_hex().to_string()
}

#[test]
fn every_known_kind_is_pinned_at_its_current_version() {
    for k in known_kinds() {
        let pin = PINS
            .iter()
            .find(|(kind, v, _)| *kind == k.kind && *v == k.version)
            .unwrap_or_else(|| {
                panic!(
                    "{} v{} has no pin: add (kind, version, hash) to PINS",
                    k.kind, k.version
                )
            });
        assert_eq!(
            sample_hash(k.kind),
            pin.2,
            "the encoding of {} changed but its VERSION is still {}: bump the version and add a pin",
            k.kind,
            k.version
        );
    }
}

#[test]
fn unknown_kinds_and_versions_are_clear_errors() {
    let payload = encode(&Note::sample()).unwrap();
    let e = schemas::describe("note", 2, &payload)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("note has no schema version 2") && e.contains("1"),
        "{e}"
    );
    let e = schemas::describe("no.such.kind", 1, &payload)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown event kind \"no.such.kind\"") && e.contains("model.call"),
        "{e}"
    );
}

#[test]
fn truncated_and_garbage_payloads_are_malformed_not_panics() {
    let payload = encode(&ModelCall::sample()).unwrap();
    for cut in [0, 1, 8, payload.len() / 2, payload.len() - 1] {
        let e = schemas::describe("model.call", 1, &payload[..cut])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("model.call v1 payload is malformed"),
            "cut {cut}: {e}"
        );
    }
    let mut bad = payload.clone();
    let n = bad.len();
    bad[n - 4..].copy_from_slice(&[0xff; 4]);
    assert!(schemas::describe("model.call", 1, &bad).is_err());
}

#[test]
fn records_round_trip_and_list_their_links() {
    let m = ModelCall::sample();
    let ev = schemas::to_event(&m).unwrap();
    assert_eq!((ev.kind.as_str(), ev.version), ("model.call", 1));
    assert_eq!(ev.refs.len(), 5); // prefix, 2 messages, tools, response
    let back: ModelCall = schemas::decode(&ev.kind, ev.version, &ev.payload).unwrap();
    assert_eq!(back, m);
    let json = schemas::describe("model.call", 1, &ev.payload).unwrap();
    assert_eq!(json["response"], serde_json::json!(hex::encode([5u8; 32])));
    assert!(matches!(
        schemas::decode::<Note>("model.call", 1, &ev.payload),
        Err(schemas::SchemaError::KindMismatch { .. })
    ));
}
