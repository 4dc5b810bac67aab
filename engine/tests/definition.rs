//! A run hashes its experiment's definition, not the text it was given
//! (#25, item 7): comments, `concurrency`, `tasks_dir` and a backend's
//! address, key source, timeouts and retry budget never reach an id. The
//! text as given is kept in `run.started`'s unhashed metadata for resuming;
//! because metadata is not hashed, a text that does not define the hashed
//! definition (damage, or a crafted edit) is refused, never run.

use engine::config::Experiment;
use ledger::{Id, ObjectKind};

const OPENAI: &str = r#"
name = "x"
seed = 3
tasks_dir = "tasks"

[backends.m]
kind = "openai"
base_url = "http://127.0.0.1:8080/v1"
model = "qwen"

[roles]
orchestrator = "m"
judge = "m"
optimizer = "m"
"#;

fn parse(text: &str) -> Experiment {
    Experiment::parse(text, "exp.toml").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn execution_settings_and_comments_do_not_change_the_definition() {
    let base = parse(OPENAI).definition_toml();
    let variants = [
        format!("# a comment\n{OPENAI}"),
        OPENAI.replace("seed = 3", "seed = 3\nconcurrency = 16"),
        OPENAI.replace("\"tasks\"", "\"/somewhere/else/tasks\""),
        OPENAI.replace("127.0.0.1:8080", "gpu-node-7:9000"),
        OPENAI.replace(
            "model = \"qwen\"",
            "model = \"qwen\"\napi_key_env = \"MY_KEY\"\ntimeout_secs = 5\nmax_retries = 9\nmax_concurrency = 2\nbase_url_env = \"URL\"",
        ),
    ];
    for v in &variants {
        assert_eq!(parse(v).definition_toml(), base, "{v}");
    }
    // What the experiment means does change it.
    for v in [
        OPENAI.replace("seed = 3", "seed = 4"),
        OPENAI.replace("model = \"qwen\"", "model = \"llama\""),
        OPENAI.replace("seed = 3", "seed = 3\ncycles = 2"),
    ] {
        assert_ne!(parse(&v).definition_toml(), base, "{v}");
    }
    // Taking the definition of a definition changes nothing.
    let d = parse(OPENAI).definition();
    assert_eq!(d.definition_toml(), base);
}

fn started(l: &ledger::Ledger, config: &str, text: Option<&str>) -> ledger::Event {
    let config = l.put_blob(config.as_bytes()).unwrap();
    let tasks = l.put_blob(b"tasks").unwrap();
    let rs = schemas::RunStarted {
        driver: "mass-engine/7".into(),
        config: config.into(),
        tasks: tasks.into(),
        seed: 3,
    };
    let mut ev = schemas::to_event(&rs).unwrap();
    if let Some(t) = text {
        let blob = l.put_blob(t.as_bytes()).unwrap();
        ev = ev.with_meta(engine::driver::EXPERIMENT_TEXT_META, blob.to_hex());
    }
    let id = l.append("r", None, ev).unwrap();
    l.get_event(&id).unwrap()
}

#[test]
fn the_recorded_text_must_define_the_hashed_definition() {
    let d = tempfile::tempdir().unwrap();
    let l = ledger::Ledger::init(&d.path().join("l")).unwrap();
    let def = parse(OPENAI).definition_toml();
    // The text as given, with an address: accepted, and what resumes run with.
    let ev = started(&l, &def, Some(OPENAI));
    let exp = engine::driver::recorded_experiment(&l, &ev).unwrap();
    match &exp.backends["m"] {
        engine::config::Backend::OpenAi(o) => assert_eq!(o.base_url, "http://127.0.0.1:8080/v1"),
        other => panic!("{other:?}"),
    }
    let (_, config, _) = engine::driver::recorded_text(&l, &ev).unwrap();
    assert_eq!(config, Id::of(ObjectKind::Blob, def.as_bytes()));

    // A text that means something else (another seed in the unhashed
    // metadata): refused as damaged, not run.
    let d2 = tempfile::tempdir().unwrap();
    let l2 = ledger::Ledger::init(&d2.path().join("l")).unwrap();
    let ev = started(&l2, &def, Some(&OPENAI.replace("seed = 3", "seed = 4")));
    let err = engine::driver::recorded_experiment(&l2, &ev)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not the definition"), "{err}");
    assert!(err.contains("damaged"), "{err}");

    // No text at all.
    let d3 = tempfile::tempdir().unwrap();
    let l3 = ledger::Ledger::init(&d3.path().join("l")).unwrap();
    let ev = started(&l3, &def, None);
    let err = engine::driver::recorded_experiment(&l3, &ev)
        .unwrap_err()
        .to_string();
    assert!(err.contains("names none"), "{err}");
}
