//! What a store shared by many processes can do to a run, in process: an
//! item executed twice (one result stays, the second is discarded), a
//! forged result naming streams outside its item (refused; with the
//! protection switched off it would move a ref elsewhere in the run), and
//! an item whose bytes were changed on the store (refused by every worker).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::context::NoProgress;
use engine::driver::{drive_with, RunRequest};
use ledger::Ledger;
use replay::Mode;
use workers::wire::{self, Envelope, WorkResult};
use workers::{Options, Settings, Worker};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn smoke() -> (String, String) {
    let exp = std::fs::read_to_string(root().join("examples/smoke.toml")).unwrap();
    let tasks = root().join("examples/tasks");
    let exp = exp.replace(
        "tasks_dir = \"tasks\"",
        &format!("tasks_dir = {:?}", tasks.to_str().unwrap()),
    );
    (exp, "smoke.toml".into())
}

fn settings(url: &str) -> Settings {
    Settings {
        url: url.into(),
        patience: Duration::from_secs(60),
        poll: Duration::from_millis(50),
        max_attempts: 3,
        cache: None,
        unconfined_results: false,
    }
}

fn options(url: &str, name: &str) -> Options {
    Options {
        url: url.into(),
        name: name.into(),
        slots: 2,
        lease: Duration::from_secs(10),
        poll: Duration::from_millis(50),
        idle_exit: Some(Duration::from_secs(3)),
        stop: None,
    }
}

fn run(ledger: &Path, s: &Settings) -> engine::error::Result<engine::driver::RunSummary> {
    let l = Arc::new(Ledger::init(ledger).unwrap());
    drive_with(
        l,
        RunRequest {
            run: "smoke".into(),
            experiment: Some(smoke()),
            mode: Mode::Live,
            source: None,
            progress: &NoProgress,
        },
        Some(s),
    )
}

fn jobs(store: &Path, dir: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(store.join(dir))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.strip_suffix(".json").map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Every item executed twice before the coordinator collects it (a worker
/// thought dead that finishes after all, for every item): the second
/// result is discarded and the first stays byte for byte, and the run's
/// head is the in-process head.
#[test]
fn every_item_executed_twice_keeps_one_result_and_the_in_process_head() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let url = store.to_str().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let twice = {
        let (url, store, stop) = (url.clone(), store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            let mut duplicates = 0;
            while !stop.load(Ordering::SeqCst) {
                for job in jobs(&store, "work/items") {
                    if !seen.insert(job.clone()) {
                        continue;
                    }
                    let exec = |n: &str| {
                        workers::worker::execute_unclaimed(options(&url, n), &job).unwrap()
                    };
                    assert!(exec("first"), "the first execution of {job} must publish");
                    let before = std::fs::read(store.join(wire::result_key(&job))).unwrap();
                    assert!(!exec("second"), "a second result was published for {job}");
                    let after = std::fs::read(store.join(wire::result_key(&job))).unwrap();
                    assert_eq!(before, after, "the first result changed");
                    duplicates += 1;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            duplicates
        })
    };
    let first = run(&d.path().join("coord"), &settings(&url)).unwrap();
    stop.store(true, Ordering::SeqCst);
    let duplicates = twice.join().unwrap();
    assert_eq!(duplicates, jobs(&store, "work/results").len());
    // The same experiment in process: the same head.
    let l = Arc::new(Ledger::init(&d.path().join("inproc")).unwrap());
    let inproc = engine::driver::drive(
        l,
        RunRequest {
            run: "smoke".into(),
            experiment: Some(smoke()),
            mode: Mode::Live,
            source: None,
            progress: &NoProgress,
        },
    )
    .unwrap();
    assert_eq!(first.head, inproc.head);
}

/// A forger (here: the test, playing a worker) publishes, for the first
/// item, a result whose heads also name a stream outside the item's. The
/// coordinator refuses it and no ref outside the item moves; with the
/// protection switched off, the forged ref lands in the run.
#[test]
fn a_result_naming_streams_outside_its_item_is_refused() {
    for protected in [true, false] {
        let d = tempfile::tempdir().unwrap();
        let store = d.path().join("store");
        let url = store.to_str().unwrap().to_string();
        let mut s = settings(&url);
        s.unconfined_results = !protected;
        let stop = Arc::new(AtomicBool::new(false));
        let forged = Arc::new(Mutex::new(None));
        let forger = {
            let (store, stop, forged) = (store.clone(), stop.clone(), forged.clone());
            std::thread::spawn(move || forge_results(&store, &stop, &forged))
        };
        let l = d.path().join("coord");
        let out = run(&l, &s);
        stop.store(true, Ordering::SeqCst);
        forger.join().unwrap();
        let err = out
            .expect_err("a forged result cannot finish the run")
            .to_string();
        let ledger = Ledger::open(&l).unwrap();
        let evil = ledger.head("smoke/c9/evil/orch").unwrap();
        if protected {
            assert!(err.contains("outside the item's"), "{err}");
            assert!(evil.is_none(), "a forged ref landed");
        } else {
            assert!(
                evil.is_some(),
                "the unprotected coordinator should take the forged ref: {err}"
            );
        }
        assert!(forged.lock().unwrap().is_some());
    }
}

/// Publishes, for every item as it appears, a result naming an event the
/// store holds (the run's own) as the item's record and as a stream
/// `c9/evil/orch` outside the item.
fn forge_results(store: &Path, stop: &AtomicBool, forged: &Mutex<Option<String>>) {
    let mut done = std::collections::BTreeSet::new();
    while !stop.load(Ordering::SeqCst) {
        for job in jobs(store, "work/items") {
            if !done.insert(job.clone()) {
                continue;
            }
            let bytes = std::fs::read(store.join(wire::item_key(&job))).unwrap();
            let env = Envelope::decode(&job, &bytes).unwrap();
            let main = any_event(store);
            let stream = format!("{}/orch", env.work.stream());
            let r = WorkResult {
                format: wire::RESULT_FORMAT.into(),
                worker: "forger".into(),
                attempt: 1,
                outcome: "done".into(),
                heads: [
                    (stream, main.clone()),
                    ("c9/evil/orch".to_string(), main.clone()),
                ]
                .into_iter()
                .collect(),
                event: main,
                attempts: Vec::new(),
            };
            let s = remote::Store::open(store.to_str().unwrap()).unwrap();
            assert!(s
                .create(&wire::result_key(&job), wire::to_bytes(&r))
                .unwrap());
            *forged.lock().unwrap() = Some(job);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An event the store's packs hold (the run's own, pushed by the
/// coordinator before its first item).
fn any_event(store: &Path) -> String {
    let r = remote::Remote::open(store.to_str().unwrap(), None).unwrap();
    let idx = r.indexes(&remote::Quiet).unwrap();
    idx.packs
        .iter()
        .flat_map(|(_, p)| p.entries.iter())
        .find(|e| e.kind == ledger::ObjectKind::Event)
        .map(|e| e.id.to_hex())
        .expect("the coordinator pushed the run before its first item")
}

/// An item changed on the store after it was published: its bytes no
/// longer hash to its name, and a worker refuses it (and goes on).
#[test]
fn an_item_changed_on_the_store_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let url = store.to_str().unwrap().to_string();
    // Publish one real item by starting a run with no worker, then stop.
    let stop = Arc::new(AtomicBool::new(false));
    let (st, sp) = (store.clone(), stop.clone());
    let tamper = std::thread::spawn(move || {
        let t0 = Instant::now();
        loop {
            if let Some(job) = jobs(&st, "work/items").into_iter().next() {
                let p = st.join(wire::item_key(&job));
                let mut b = std::fs::read(&p).unwrap();
                let at = b.iter().position(|c| *c == b'7').unwrap_or(b.len() / 2);
                b[at] ^= 1;
                std::fs::write(&p, &b).unwrap();
                sp.store(true, Ordering::SeqCst);
                return job;
            }
            assert!(t0.elapsed() < Duration::from_secs(60));
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let mut s = settings(&url);
    s.patience = Duration::from_secs(60);
    let coord = {
        let (l, s) = (d.path().join("coord"), s.clone());
        std::thread::spawn(move || run(&l, &s))
    };
    let job = tamper.join().unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = lines.clone();
    let mut o = options(&url, "careful");
    o.idle_exit = Some(Duration::from_secs(2));
    let stats = Worker::new(
        o,
        Box::new(move |l| seen.lock().unwrap().push(l.to_string())),
    )
    .unwrap()
    .run()
    .unwrap();
    // Other items (untouched) may have been executed; this one never.
    let _ = stats;
    let log = lines.lock().unwrap().join("\n");
    assert!(
        log.contains(&format!("refused {}", wire::item_key(&job)))
            && log.contains("do not hash to its name"),
        "{log}"
    );
    assert!(!store.join(wire::result_key(&job)).exists());
    assert!(
        !store.join(wire::claim_key(&job)).exists(),
        "a refused item was claimed"
    );
    // The coordinator stops on the refusal, saying what to do.
    let err = coord
        .join()
        .unwrap()
        .expect_err("a refused item cannot finish the run")
        .to_string();
    assert!(
        err.contains("refused it") && err.contains("same mass build"),
        "{err}"
    );
}

/// Regression (a result handing the coordinator another item's record):
/// the forger executes one item honestly, then publishes for every other
/// item a result naming that record under the other item's stream. The
/// coordinator refuses it (the event belongs to another stream) and no
/// ref of the run names it under a wrong stream.
#[test]
fn a_result_naming_another_items_record_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let url = store.to_str().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let forger = {
        let (url, store, stop) = (url.clone(), store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut honest: Option<(String, WorkResult)> = None;
            let mut forged = 0;
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(Ordering::SeqCst) {
                for job in jobs(&store, "work/items") {
                    if !seen.insert(job.clone()) {
                        continue;
                    }
                    let Some((_, real)) = &honest else {
                        workers::worker::execute_unclaimed(options(&url, "honest"), &job).unwrap();
                        let b = std::fs::read(store.join(wire::result_key(&job))).unwrap();
                        honest = Some((job.clone(), wire::parse("r", &b).unwrap()));
                        continue;
                    };
                    let env = Envelope::decode(
                        &job,
                        &std::fs::read(store.join(wire::item_key(&job))).unwrap(),
                    )
                    .unwrap();
                    let r = WorkResult {
                        heads: [(format!("{}/orch", env.work.stream()), real.event.clone())]
                            .into_iter()
                            .collect(),
                        worker: "forger".into(),
                        ..real.clone()
                    };
                    let s = remote::Store::open(store.to_str().unwrap()).unwrap();
                    assert!(s
                        .create(&wire::result_key(&job), wire::to_bytes(&r))
                        .unwrap());
                    forged += 1;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            forged
        })
    };
    let l = d.path().join("coord");
    let out = run(&l, &settings(&url));
    stop.store(true, Ordering::SeqCst);
    assert!(forger.join().unwrap() > 0, "nothing was forged");
    let err = out
        .expect_err("a forged result cannot finish the run")
        .to_string();
    assert!(err.contains("that event belongs to stream"), "{err}");
    // Every rollout ref of the run names an event of its own stream.
    let ledger = Ledger::open(&l).unwrap();
    for (name, head) in ledger.refs().unwrap() {
        let Some(rel) = name.strip_prefix("smoke/") else {
            continue;
        };
        if rel == workers::WORKERS_STREAM {
            continue;
        }
        assert_eq!(ledger.get_event(&head).unwrap().stream, rel, "ref {name}");
    }
}
