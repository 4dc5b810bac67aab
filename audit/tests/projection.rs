//! The report projection (`audit/src/facts.rs`): a report that reads kept
//! stream facts must be the report folded from the ledger, whatever the
//! file holds. Runs are built from the real record types over many seeds
//! (model calls with and without usage and trainer counts, failed calls,
//! guard exclusions, verdicts in both orders, rankings), then extended;
//! the file is attacked byte by byte, with another run's file, and with
//! facts a build with another fold key would have written. The test-only
//! `Mode::KeptUnchecked` (footer and key not checked) shows the attacks
//! land when the checks are off.

use std::path::{Path, PathBuf};

use audit::report::{report_with, Mode};
use ledger::{Id, Ledger};
use schemas::{
    Cycle, Effect, EffectStatus, GuardCheck, Hash32, Judgment, RankedRun, Ranking, Rollout,
};

fn h(id: Id) -> Hash32 {
    Hash32(id.0)
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A model call's effect: usage reported or not, a trainer count equal to
/// the server's or not, or a failed call.
fn model_call(b: &mut ledger::Batch<'_>, rng: &mut Rng, tag: &str) -> ledger::NewEvent {
    let request = b
        .put_blob(format!("request {tag}").as_bytes())
        .expect("blob");
    let prompt = 100 + rng.below(50);
    let mut output = serde_json::json!({
        "message": {"role": "assistant", "content": tag},
        "usage": {"prompt_tokens": prompt, "completion_tokens": rng.below(40)},
    });
    match rng.below(4) {
        0 => output["trainer_tokens"] = serde_json::json!({"model": "m", "prompt_tokens": prompt}),
        1 => {
            output["trainer_tokens"] =
                serde_json::json!({"model": "m2", "prompt_tokens": prompt + 1})
        }
        2 => output["usage"] = serde_json::Value::Null,
        _ => {}
    }
    let output = b.put_blob(output.to_string().as_bytes()).expect("blob");
    let failed = rng.below(6) == 0;
    schemas::to_event(&Effect {
        effect: ["model", "judge", "tool"][rng.below(3) as usize].into(),
        request: h(request),
        status: if failed {
            EffectStatus::Failed
        } else {
            EffectStatus::Ok
        },
        output: Some(h(output)),
        error: String::new(),
        links: vec![],
    })
    .expect("encode")
}

/// Appends `calls` model calls to stream `rel` of run `run` after `prev`.
fn calls(
    b: &mut ledger::Batch<'_>,
    rng: &mut Rng,
    run: &str,
    rel: &str,
    mut prev: Option<Id>,
    calls: u64,
) -> Option<Id> {
    for k in 0..calls {
        let tag = format!("{rel} {k} {}", rng.next());
        let e = model_call(b, rng, &tag).in_stream(rel);
        prev = Some(b.append(&format!("{run}/{rel}"), prev, e).expect("append"));
    }
    prev
}

/// One task of cycle 1: collected runs (model calls, a guard, the
/// rollout), judgments between them and a ranking on the main stream.
fn task(l: &Ledger, rng: &mut Rng, run: &str, t: u64, main: Option<Id>) -> Id {
    let mut b = l.batch();
    let task = format!("task-{t}");
    let tree = b.put_blob(format!("tree {t}").as_bytes()).expect("blob");
    let runs = 2 + rng.below(3) as usize;
    let mut rollouts = Vec::new();
    for i in 0..runs {
        let rel = format!("c1/{task}/collect/{i:02}/orch");
        let n = 1 + rng.below(3);
        let head = calls(&mut b, rng, run, &rel, None, n);
        let flagged = rng.below(3) == 0;
        let guard = GuardCheck {
            task: task.clone(),
            initial: h(tree),
            final_tree: h(tree),
            protected_changed: vec![],
            changed_files: 1,
            changed_bytes: 10,
            violations: if flagged {
                vec!["edited a check".into()]
            } else {
                vec![]
            },
            action: "exclude".into(),
        };
        let guard = schemas::to_event(&guard)
            .expect("encode")
            .in_stream(format!("c1/{task}/collect/{i:02}/guard"));
        let guard = b
            .append(
                &format!("{run}/c1/{task}/collect/{i:02}/guard"),
                None,
                guard,
            )
            .expect("append");
        let r = Rollout {
            task: task.clone(),
            purpose: "collect".into(),
            cycle: 1,
            index: i as u32,
            workflow: h(tree),
            orchestrator_model: "m".into(),
            subagent_model: "m".into(),
            status: ["finished", "halted"][rng.below(2) as usize].into(),
            detail: String::new(),
            tree: h(tree),
            validation: h(tree),
            score_passed: rng.below(5) as u32,
            score_total: 4 + rng.below(2) as u32,
            orchestrator: h(head.expect("a call")),
            subagents: vec![],
            delegations: 0,
            turns: n as u32,
            prompt_tokens: 1,
            completion_tokens: 1,
            report: String::new(),
        };
        let r = schemas::to_event(&r)
            .expect("encode")
            .with_parents(vec![guard])
            .in_stream(rel.clone());
        rollouts.push(b.append(&format!("{run}/{rel}"), head, r).expect("append"));
    }
    let mut judgments = Vec::new();
    for p in 0..runs {
        let (a, c) = (rollouts[p], rollouts[(p + 1) % runs]);
        let j = Judgment {
            task: task.clone(),
            a: h(a),
            b: h(c),
            swapped: rng.below(2) == 0,
            judge_model: "m".into(),
            winner: ["a", "b", "tie", "no verdict"][rng.below(4) as usize].into(),
            rationale: String::new(),
            invalid_attempts: 0,
            conversation: h(tree),
        };
        let rel = format!("c1/{task}/pair/{p:03}");
        let j = schemas::to_event(&j)
            .expect("encode")
            .with_parents(vec![a, c])
            .in_stream(rel.clone());
        judgments.push(b.append(&format!("{run}/{rel}"), None, j).expect("append"));
    }
    let ranking = Ranking {
        task: task.clone(),
        cycle: 1,
        prior: 0.5,
        iterations: 40,
        converged: true,
        runs: rollouts
            .iter()
            .enumerate()
            .map(|(k, r)| RankedRun {
                rollout: h(*r),
                score: rng.below(1000) as f64 / 1000.0,
                rank: k as u32 + 1,
                wins: 1,
                losses: 1,
                ties: 0,
            })
            .collect(),
        judgments: judgments.iter().map(|j| h(*j)).collect(),
    };
    let ranking = schemas::to_event(&ranking)
        .expect("encode")
        .with_parents(judgments)
        .in_stream("main");
    let head = b.append(run, main, ranking).expect("append");
    b.commit().expect("commit");
    head
}

/// Closes the run with cycle 1's record (the report's cycle).
fn close(l: &Ledger, run: &str, main: Id) {
    let c = Cycle {
        cycle: 1,
        model: "m".into(),
        next_model: "m+1".into(),
        inner_wins: 0,
        inner_iterations: 0,
        selected_runs: 0,
        supervised_tokens: 0,
        collected_runs: 0,
        delegating_runs: 0,
        tampered_runs: 0,
        tampered_in_training: 0,
        bare_delegation: vec![],
        agreement: vec![],
        evaluations: vec![],
    };
    let mut b = l.batch();
    b.append(
        run,
        Some(main),
        schemas::to_event(&c).expect("encode").in_stream("main"),
    )
    .expect("append");
    b.commit().expect("commit");
}

/// A run of `tasks` tasks under `seed`.
fn build(l: &Ledger, run: &str, seed: u64, tasks: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut main = None;
    for t in 0..tasks {
        main = Some(task(l, &mut rng, run, t, main));
    }
    close(l, run, main.expect("a task"));
}

fn json(l: &Ledger, run: &str, mode: Mode) -> serde_json::Value {
    serde_json::to_value(report_with(l, run, mode).expect("report")).expect("json")
}

/// The run's projection file (the only one in the ledger's cache).
fn kept_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir.join("cache/report"))
        .expect("the report wrote its projection")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

#[test]
fn kept_facts_give_the_report_a_fresh_fold_gives_as_runs_grow() {
    for seed in 1..=16u64 {
        let tmp = tempfile::tempdir().expect("tempdir");
        let l = Ledger::init(&tmp.path().join("l")).expect("init");
        build(&l, "r", seed, 1 + seed % 4);
        let oracle = json(&l, "r", Mode::Off);
        assert!(oracle["cycles"][0]["stages"].is_array(), "{oracle}");
        assert_eq!(
            json(&l, "r", Mode::Kept),
            oracle,
            "seed {seed}: first (folds, keeps)"
        );
        let file = kept_file(l.dir());
        let written = std::fs::read(&file).expect("read");
        assert_eq!(
            json(&l, "r", Mode::Kept),
            oracle,
            "seed {seed}: read from the file"
        );
        assert_eq!(
            std::fs::read(&file).expect("read"),
            written,
            "nothing changed, nothing rewritten"
        );
        // The run grows: a stream moves on, new streams appear.
        let mut rng = Rng(seed + 77);
        let rel = "c1/task-0/collect/00/orch";
        let head = l.head(&format!("r/{rel}")).expect("head");
        let mut b = l.batch();
        calls(&mut b, &mut rng, "r", rel, head, 2);
        calls(&mut b, &mut rng, "r", "c1/task-0/pair/900", None, 1);
        b.commit().expect("commit");
        let grown = json(&l, "r", Mode::Off);
        assert_ne!(grown, oracle, "seed {seed}: the new calls count");
        assert_eq!(
            json(&l, "r", Mode::Kept),
            grown,
            "seed {seed}: grown, kept facts updated"
        );
        assert_eq!(
            json(&l, "r", Mode::Kept),
            grown,
            "seed {seed}: grown, read again"
        );
        assert_eq!(json(&l, "r", Mode::Fresh), grown, "seed {seed}: --fresh");
    }
}

/// Writes `bytes` over the run's projection, runs a report with `mode`,
/// and says whether it equals `oracle`. A kept report never fails for its
/// file; unchecked, a failure is no silent wrong answer either.
fn report_over(
    l: &Ledger,
    file: &Path,
    bytes: &[u8],
    mode: Mode,
    oracle: &serde_json::Value,
) -> bool {
    std::fs::write(file, bytes).expect("write");
    match report_with(l, "r", mode) {
        Ok(r) => serde_json::to_value(r).expect("json") == *oracle,
        Err(e) if mode == Mode::KeptUnchecked => !e.to_string().is_empty(),
        Err(e) => panic!("a damaged projection failed the report: {e}"),
    }
}

#[test]
fn every_flipped_byte_of_the_projection_is_caught() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let l = Ledger::init(&tmp.path().join("l")).expect("init");
    build(&l, "r", 3, 1);
    let oracle = json(&l, "r", Mode::Off);
    json(&l, "r", Mode::Kept);
    let file = kept_file(l.dir());
    let good = std::fs::read(&file).expect("read");
    let mut landed_unchecked = 0;
    for i in 0..good.len() {
        for bit in [0x01u8, 0x80] {
            let mut bad = good.clone();
            bad[i] ^= bit;
            assert!(
                report_over(&l, &file, &bad, Mode::Kept, &oracle),
                "byte {i} of {} flipped ({bit:#04x}): the report differs from the ledger's",
                good.len()
            );
            if !report_over(&l, &file, &bad, Mode::KeptUnchecked, &oracle) {
                landed_unchecked += 1;
            }
        }
    }
    assert!(
        landed_unchecked > 0,
        "with the footer and key unchecked, some flip must change the report (else this test proves nothing)"
    );
}

#[test]
fn another_runs_file_and_another_builds_facts_are_not_used() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let l = Ledger::init(&tmp.path().join("l")).expect("init");
    build(&l, "r", 5, 2);
    let oracle = json(&l, "r", Mode::Off);
    json(&l, "r", Mode::Kept);
    let file = kept_file(l.dir());
    let good = std::fs::read(&file).expect("read");
    // A flip the unchecked read takes as facts: wrong facts for the right heads.
    let (body, _) = good.split_at(good.len() - 32);
    let forged = (40..body.len()).find_map(|i| {
        let mut bad = body.to_vec();
        bad[i] ^= 0x01;
        bad.extend_from_slice(blake3::hash(&bad).as_bytes());
        (!report_over(&l, &file, &bad, Mode::KeptUnchecked, &oracle)).then_some(bad)
    });
    let forged = forged.expect("some payload byte is a count the report shows");
    // Its footer is right: the checked read takes it unless the key differs.
    let mut other_key = forged[..forged.len() - 32].to_vec();
    other_key[8] ^= 0x01;
    other_key.extend_from_slice(blake3::hash(&other_key).as_bytes());
    assert!(
        report_over(&l, &file, &other_key, Mode::Kept, &oracle),
        "a file folded by other code is not read"
    );
    assert!(
        !report_over(&l, &file, &other_key, Mode::KeptUnchecked, &oracle),
        "unchecked, it is"
    );
    // Another run's kept facts under this run's name: its heads are not this run's.
    let other = tempfile::tempdir().expect("tempdir");
    let l2 = Ledger::init(&other.path().join("l")).expect("init");
    build(&l2, "r", 6, 2);
    json(&l2, "r", Mode::Kept);
    let theirs = std::fs::read(kept_file(l2.dir())).expect("read");
    assert!(
        report_over(&l, &file, &theirs, Mode::Kept, &oracle),
        "another ledger's run r"
    );
}

/// What the report must count in the collect stage of `run`, read here
/// without the report's code: every successful `model`/`judge`/
/// `optimizer` effect on a collect stream, and the usage its output gives.
fn collect_calls(l: &Ledger, run: &str) -> (u64, u64, u64) {
    let (mut calls, mut prompt, mut completion) = (0, 0, 0);
    for (name, head) in l.refs().expect("refs") {
        if !(name.starts_with(&format!("{run}/c1/")) && name.contains("/collect/")) {
            continue;
        }
        for ev in l.chain(head) {
            let ev = ev.expect("event");
            let Ok(e) = schemas::decode_event::<Effect>(&ev) else {
                continue;
            };
            if ev.kind != "effect" || e.status != EffectStatus::Ok || e.effect == "tool" {
                continue;
            }
            let out: serde_json::Value = serde_json::from_slice(
                &l.get_blob(&Id(e.output.expect("output").0)).expect("blob"),
            )
            .expect("json");
            calls += 1;
            prompt += out["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
            completion += out["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        }
    }
    (calls, prompt, completion)
}

/// A run with more streams than one batch of the fold's threads: the
/// facts folded on several threads are those of every stream, in order,
/// checked against counts taken here from the events and against the
/// rollouts `mass runs` lists (each read on one thread).
#[test]
fn facts_folded_on_several_threads_are_every_streams() {
    for seed in [11u64, 12] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let l = Ledger::init(&tmp.path().join("l")).expect("init");
        build(&l, "r", seed, 90);
        let r = json(&l, "r", Mode::Off);
        let collect = r["cycles"][0]["stages"]
            .as_array()
            .expect("stages")
            .iter()
            .find(|s| s["stage"] == "collect")
            .expect("collect")
            .clone();
        let (calls, prompt, completion) = collect_calls(&l, "r");
        let streams = l.refs_under("r/").expect("refs").len();
        assert!(streams > 2 * 256, "{streams} streams: several batches");
        assert_eq!(collect["model_calls"], calls, "seed {seed}");
        assert_eq!(collect["prompt_tokens"], prompt, "seed {seed}");
        assert_eq!(collect["completion_tokens"], completion, "seed {seed}");
        let listed = audit::rollouts(&l, "r").expect("rollouts");
        let scored: usize = r["cycles"][0]["scores"]
            .as_array()
            .expect("scores")
            .iter()
            .map(|t| t["runs"].as_array().expect("runs").len())
            .sum();
        assert_eq!(scored, listed.iter().filter(|x| x.score.is_some()).count());
        assert_eq!(json(&l, "r", Mode::Kept), r, "seed {seed}: kept");
        assert_eq!(json(&l, "r", Mode::Kept), r, "seed {seed}: read");
    }
}

/// Every `.rs` file under `dir` (relative to `root`, `/`-separated).
fn rust_sources(root: &Path, dir: &str, out: &mut Vec<String>) {
    for e in std::fs::read_dir(root.join(dir)).expect("read dir") {
        let name = e.expect("entry").file_name();
        let rel = format!("{dir}/{}", name.to_str().expect("utf-8 name"));
        if root.join(&rel).is_dir() {
            rust_sources(root, &rel, out);
        } else if rel.ends_with(".rs") {
            out.push(rel);
        }
    }
}

/// Regression: the fold key covered `facts.rs` alone, yet a fold runs code
/// elsewhere: `report.rs` (`OutputFigures::of`, a call's usage), `lib.rs`
/// (`decode`), the schemas crate (each record's decoding, older versions
/// upgraded) and `ledger/src/object.rs` (events as decoded). A
/// build that changed any of them read an older build's facts as its own
/// (a finished run's heads never move, so for good). The key written must
/// be the one over all of them, each schemas file included (one added
/// there fails this test until the fold key lists it).
#[test]
fn regression_the_fold_key_covers_every_source_a_fold_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace");
    let mut sources: Vec<String> = [
        "audit/src/facts.rs",
        "audit/src/lib.rs",
        "audit/src/report.rs",
        "ledger/src/object.rs",
    ]
    .map(String::from)
    .to_vec();
    rust_sources(root, "schemas/src", &mut sources);
    sources.sort();
    let mut h = blake3::Hasher::new();
    h.update(b"mass report facts, format 1\n");
    for s in &sources {
        let bytes = std::fs::read(root.join(s)).expect("read source");
        h.update(s.as_bytes());
        h.update(&[0]);
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let l = Ledger::init(&tmp.path().join("l")).expect("init");
    build(&l, "r", 1, 1);
    json(&l, "r", Mode::Kept);
    let written = std::fs::read(kept_file(l.dir())).expect("read");
    assert_eq!(
        &written[8..40],
        h.finalize().as_bytes(),
        "the fold key is not the one over {sources:?}"
    );
}

/// Run `run` of one ranked collected rollout that scored 0 of 0, its
/// counts marked not recorded (as an import marks them) or not (as an
/// older mass imported them): the same ids either way (metadata is outside
/// them).
fn zero_of_zero(l: &Ledger, run: &str, marked: bool) {
    let mut b = l.batch();
    let tree = b.put_blob(b"tree").expect("blob");
    let rel = "c1/task-0/collect/00/orch";
    let r = Rollout {
        task: "task-0".into(),
        purpose: "collect".into(),
        cycle: 1,
        index: 0,
        workflow: h(tree),
        orchestrator_model: "m".into(),
        subagent_model: "m".into(),
        status: "finished".into(),
        detail: String::new(),
        tree: h(tree),
        validation: h(tree),
        score_passed: 0,
        score_total: 0,
        orchestrator: h(tree),
        subagents: vec![],
        delegations: 0,
        turns: 1,
        prompt_tokens: 1,
        completion_tokens: 1,
        report: String::new(),
    };
    let mut r = schemas::to_event(&r).expect("encode").in_stream(rel);
    if marked {
        r = r.with_meta(ledger::NOT_RECORDED, "score_passed,score_total");
    }
    let rollout = b.append(&format!("{run}/{rel}"), None, r).expect("append");
    let ranking = Ranking {
        task: "task-0".into(),
        cycle: 1,
        prior: 0.5,
        iterations: 1,
        converged: true,
        runs: vec![RankedRun {
            rollout: h(rollout),
            score: 0.5,
            rank: 1,
            wins: 0,
            losses: 0,
            ties: 0,
        }],
        judgments: vec![],
    };
    let ranking = schemas::to_event(&ranking)
        .expect("encode")
        .in_stream("main");
    let main = b.append(run, None, ranking).expect("append");
    b.commit().expect("commit");
    close(l, run, main);
}

/// Regression: a rollout's kept facts held whether its 0 of 0 was
/// recorded, read from its metadata, which its id does not cover: two
/// ledgers can hold the same rollout with and without the marks (one
/// imported by an older mass, see `import::Outcome::AlreadyImported`), and
/// one ledger can get a copy with other metadata (stored again after its
/// record was damaged). Kept facts must be a function of the head's id
/// alone, so a file holding the same stream at the same head, whatever
/// ledger wrote it, gives this ledger's report.
#[test]
fn regression_kept_facts_do_not_hold_what_metadata_says() {
    let (a, b) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let marked = Ledger::init(&a.path().join("l")).expect("init");
    let unmarked = Ledger::init(&b.path().join("l")).expect("init");
    zero_of_zero(&marked, "r", true);
    zero_of_zero(&unmarked, "r", false);
    assert_eq!(
        marked.head("r").expect("head"),
        unmarked.head("r").expect("head")
    );
    let oracle = json(&marked, "r", Mode::Off);
    let run = &oracle["cycles"][0]["scores"][0]["runs"][0];
    assert!(run["checks_total"].is_null(), "not recorded: {oracle}");
    assert_ne!(json(&unmarked, "r", Mode::Kept), oracle, "recorded there");
    let theirs = std::fs::read(kept_file(unmarked.dir())).expect("read");
    json(&marked, "r", Mode::Kept);
    let file = kept_file(marked.dir());
    assert!(
        report_over(&marked, &file, &theirs, Mode::Kept, &oracle),
        "the same stream at the same head, kept by a ledger whose metadata differs"
    );
}
