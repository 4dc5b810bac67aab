//! Fails when a record type's encoding changes without its schema version changing.
//!
//! Each known (kind, version) is pinned to the BLAKE3 of its sample value's
//! encoding. Changing a type's fields changes that hash: bump the type's VERSION,
//! keep a decoder for the old version, and add a new pin line. Editing an
//! existing pin line instead would silently change the meaning of stored bytes.
//!
//! A record's sample holds one variant of each enum field, so reordering an
//! enum's variants (which renumbers their stored discriminants) would slip past
//! the record pins whenever the sample's variant keeps its number. Enum fields
//! are therefore pinned variant by variant as well: the archived bytes of every
//! variant, and the hash of the record carrying it.

use schemas::{
    encode, known_kinds, older_versions, Effect, EffectStatus, Hash32, ModelCall, Note, Record,
    RunForked, RunStarted, RunStartedV1, WorkspaceSnapshot,
};

/// (kind, version, blake3 of the sample encoding)
const PINS: &[(&str, u32, &str)] = &[
    (
        "mass.work",
        1,
        "4f509c1a685f0048864c45f4cac6df5fe56bfce389dd859f751fbd444d170831",
    ),
    (
        "mass.guard",
        1,
        "6cd8eb5b53a0ed9ee7f664c53511c4d19d1de397269803a8bd337a88c60e7ba9",
    ),
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
        "mass.evaluation",
        2,
        "961c0ed1f2705a604b6aa013f1f07183b3c3cf6afc905da824e8b86694085839",
    ),
    (
        "mass.evaluation",
        3,
        "a776269e96c4f31a0f3dbcbd89d5c8b808e8c2bfcd9a338c80d001fc52d85cc4",
    ),
    (
        "mass.dataset",
        2,
        "1a81ba1070ad8abbffc1aa2a129375f3031e203756208d6574cfd0aa31e2aba4",
    ),
    (
        "mass.cycle",
        2,
        "ca2c5ddde4fe9c73e1250a94f03abcfe4536d4d8548eb444441b08e63f4f37e9",
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
        "run.execution",
        1,
        "410ffac82ad473f4fd09ad2887637c14092a5dea125a2bd63bc5db5ee32641ba",
    ),
    (
        "run.started",
        1,
        "9fa8d7362ac1b6f39a9386b98a4c4e3a1b49d96bf1d08d8d195daaccbe7e4916",
    ),
    (
        "run.started",
        2,
        "e5461393847a4f0300d64cff80e570cbe382d86e71eceaab07f648fbcbbc78d4",
    ),
    (
        "run.forked",
        1,
        "d5dfbeaaa4c3965704fa40ff032000709ce4840d540b3d5dfe89080aabe584e7",
    ),
    (
        "run.mixed",
        1,
        "72a75fff1cf937750cab3f9c24b6a2573d72dd2bf09333b3cf85e98ce071458f",
    ),
    (
        "run.mixed",
        2,
        "1fb26b1f163385a6a99044b5e2426d6e44f76d998f29698f681b64e862f61843",
    ),
    (
        "run.removed",
        1,
        "55097c92dfcef3518867e4c9908e30787ff11c967f971a597c8d07870da2c733",
    ),
    (
        "workspace.snapshot",
        1,
        "b119bf211a219395b735df14121a61932cf9c0b590c1c299d735d1eaee077e52",
    ),
    (
        "mass.training",
        2,
        "3e2e191d0c4db1a5504061f7814111363394a46b33ed790e575a4c0be9982e46",
    ),
    (
        "mass.training",
        3,
        "9f5189e702bf6eb14b324b5145b62fc0e6974b2c952d42c4403384c9cf9e116c",
    ),
    (
        "mass.selection",
        2,
        "c97743e849ca2d2b8886a372dbc55c76233fc8af16280b355dff42128ea44054",
    ),
    (
        "mass.train_step",
        1,
        "8adaabd44261f2e6f481be646e5f8b60ce4b21c567983f0feceeee9cc03fb4ef",
    ),
];

fn sample_hash(kind: &str, version: u32) -> String {
    let bytes = match (kind, version) {
        ("run.started", 1) => encode(&RunStartedV1::sample()),
        ("run.started", 2) => encode(&RunStarted::sample()),
        ("mass.evaluation", 1) => encode(&schemas::EvaluationV1::sample()),
        ("mass.evaluation", 2) => encode(&schemas::EvaluationV2::sample()),
        ("mass.evaluation", 3) => encode(&schemas::Evaluation::sample()),
        ("mass.cycle", 1) => encode(&schemas::CycleV1::sample()),
        ("mass.cycle", 2) => encode(&schemas::Cycle::sample()),
        ("mass.dataset", 1) => encode(&schemas::DatasetV1::sample()),
        ("mass.dataset", 2) => encode(&schemas::Dataset::sample()),
        ("mass.training", 1) => encode(&schemas::TrainingV1::sample()),
        ("mass.training", 2) => encode(&schemas::TrainingV2::sample()),
        ("mass.training", 3) => encode(&schemas::Training::sample()),
        ("run.mixed", 2) => encode(&schemas::RunMixed::sample()),
        ("mass.selection", 2) => encode(&schemas::Selection::sample()),
        (_, v) if v != 1 => panic!("{kind} v{version} has no sample in this test: add it"),
        ("note", _) => encode(&Note::sample()),
        ("model.call", _) => encode(&ModelCall::sample()),
        ("workspace.snapshot", _) => encode(&WorkspaceSnapshot::sample()),
        ("effect", _) => encode(&Effect::sample()),
        ("run.forked", _) => encode(&RunForked::sample()),
        ("run.execution", _) => encode(&schemas::RunExecution::sample()),
        ("run.removed", _) => encode(&schemas::RunRemoved::sample()),
        ("run.mixed", _) => encode(&schemas::RunMixedV1::sample()),
        ("mass.rollout", _) => encode(&schemas::Rollout::sample()),
        ("mass.judgment", _) => encode(&schemas::Judgment::sample()),
        ("mass.proposal", _) => encode(&schemas::ProposalRecord::sample()),
        ("mass.promotion", _) => encode(&schemas::Promotion::sample()),
        ("mass.ranking", _) => encode(&schemas::Ranking::sample()),
        ("mass.selection", _) => encode(&schemas::SelectionV1::sample()),
        ("mass.guard", _) => encode(&schemas::GuardCheck::sample()),
        ("mass.train_step", _) => encode(&schemas::TrainStep::sample()),
        ("mass.work", _) => encode(&schemas::WorkResult::sample()),
        (other, _) => panic!("kind {other} has no sample in this test: add it"),
    }
    .unwrap();
    blake3::hash(&bytes).to_hex().to_string()
}

#[test]
fn every_known_kind_is_pinned_at_its_current_version() {
    // Older versions are still read, so their layout is pinned as well.
    for k in known_kinds().into_iter().chain(older_versions()) {
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
            sample_hash(k.kind, k.version),
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

/// Every variant of `EffectStatus`. The match has no wildcard, so adding a
/// variant stops this test from compiling until it is listed (and pinned).
fn effect_statuses() -> Vec<(&'static str, EffectStatus)> {
    let all = [
        ("Started", EffectStatus::Started),
        ("Ok", EffectStatus::Ok),
        ("Failed", EffectStatus::Failed),
        ("Retriable", EffectStatus::Retriable),
    ];
    for (_, v) in &all {
        match v {
            EffectStatus::Started
            | EffectStatus::Ok
            | EffectStatus::Failed
            | EffectStatus::Retriable => {}
        }
    }
    all.to_vec()
}

/// (enum, variant, hex of the variant's own rkyv bytes, blake3 of the record
/// sample carrying that variant). The discriminants are the SCHEMAS.md values.
const VARIANT_PINS: &[(&str, &str, &str, &str)] = &[
    (
        "EffectStatus",
        "Started",
        "00",
        "43bcd87470f9e741d4a17e19a09810c9221d89dd822cd32a2d8359637e6bec68",
    ),
    (
        "EffectStatus",
        "Ok",
        "01",
        "15e6fccf049d93e758cc32759547763b85a060bebbde35b853b046748d277ea5",
    ),
    (
        "EffectStatus",
        "Failed",
        "02",
        "336c6b14d997805cd0e5827a1ba40a650703ffebebf419d1c709169e6deb4c93",
    ),
    (
        "EffectStatus",
        "Retriable",
        "03",
        "d8dbf409347d6e10d6fa4ad8247efaebe68bc7040172b6e69785682bb9375fae",
    ),
    (
        "Option<Hash32>",
        "None",
        "000000000000000000000000000000000000000000000000000000000000000000",
        "92f648989e2abbfdf0c0216aee9a247189012e4b92ec3c6b707aa27d2844ae20",
    ),
    (
        "Option<Hash32>",
        "Some",
        "010808080808080808080808080808080808080808080808080808080808080808",
        "15e6fccf049d93e758cc32759547763b85a060bebbde35b853b046748d277ea5",
    ),
];

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn rkyv_hex<T>(v: &T) -> String
where
    T: for<'a> rkyv::Serialize<
        rkyv::api::high::HighSerializer<
            rkyv::util::AlignedVec,
            rkyv::ser::allocator::ArenaHandle<'a>,
            rkyv::rancor::Error,
        >,
    >,
{
    hex_of(&rkyv::to_bytes::<rkyv::rancor::Error>(v).unwrap())
}

fn record_hash<T: Record>(r: &T) -> String
where
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
{
    blake3::hash(&encode(r).unwrap()).to_hex().to_string()
}

/// (enum, variant, variant bytes, record hash) for every variant of every enum
/// stored in a record, computed from the types as they are now.
fn variant_encodings() -> Vec<(&'static str, &'static str, String, String)> {
    let mut out = Vec::new();
    for (name, status) in effect_statuses() {
        let mut e = Effect::sample();
        e.status = status;
        out.push(("EffectStatus", name, rkyv_hex(&status), record_hash(&e)));
    }
    // Option is rkyv's enum, not ours, but a dependency upgrade that renumbered
    // None/Some would re-encode every stored optional id; the record samples
    // only hold Some.
    for (name, output) in [("None", None), ("Some", Some(Hash32([8; 32])))] {
        let mut e = Effect::sample();
        e.output = output;
        out.push(("Option<Hash32>", name, rkyv_hex(&output), record_hash(&e)));
    }
    out
}

#[test]
fn every_enum_variant_is_pinned() {
    let got = variant_encodings();
    for (enum_name, variant, bytes, hash) in &got {
        let pin = VARIANT_PINS
            .iter()
            .find(|(e, v, _, _)| e == enum_name && v == variant)
            .unwrap_or_else(|| {
                panic!("{enum_name}::{variant} has no pin: add (enum, variant, bytes {bytes}, hash {hash}) to VARIANT_PINS")
            });
        assert_eq!(
            (bytes.as_str(), hash.as_str()),
            (pin.2, pin.3),
            "the encoding of {enum_name}::{variant} changed (variants reordered, or rkyv encodes it differently): \
             stored records would be read as another variant; restore the order or bump the versions of the records that hold it"
        );
    }
    assert_eq!(
        got.len(),
        VARIANT_PINS.len(),
        "VARIANT_PINS lists a variant that no longer exists"
    );
}

/// Every enum declared in the schemas crate is a record field (or the error
/// type): a new one must be added to `variant_encodings` and pinned.
#[test]
fn every_schema_enum_has_variant_pins() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut declared = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines() {
            let line = line.trim_start();
            let rest = line
                .strip_prefix("pub enum ")
                .or_else(|| line.strip_prefix("enum "));
            if let Some(rest) = rest {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                declared.push(name);
            }
        }
    }
    // Not stored in any record.
    const NOT_STORED: &[&str] = &["SchemaError"];
    for name in declared {
        if NOT_STORED.contains(&name.as_str()) {
            continue;
        }
        assert!(
            VARIANT_PINS.iter().any(|(e, ..)| *e == name),
            "enum {name} in schemas/src has no VARIANT_PINS entries: pin every variant of it"
        );
    }
}
