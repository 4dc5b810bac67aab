//! End-to-end tests of the engine on the shipped example tasks and the
//! simulated backend: determinism, replay check, held-out isolation, workflow
//! stripping, dataset formats, selection rules, forks and mixed-mode re-judging.
//!
//! Every test holds for the smoke experiment under 8 seeds (recorded once, in
//! a shared fixture), never one chosen seed: a seed whose cycle produces no
//! training data is a normal outcome, checked as such.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use engine::context::NoProgress;
use engine::cycle::CycleResult;
use engine::driver::{drive, RunRequest, RunSummary};
use ledger::{Id, Ledger};
use replay::{Mode, Served, SourceRun};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// The smoke experiment under `seed`.
fn smoke_seeded(seed: u64) -> (String, String) {
    let path = examples().join("smoke.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("seed = "))
        .expect("smoke.toml sets a seed")
        .to_string();
    let text = text.replace(&line, &format!("seed = {seed}"));
    (text, path.to_string_lossy().into_owned())
}

/// The smoke experiment as shipped.
fn smoke_text() -> (String, String) {
    let path = examples().join("smoke.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    (text, path.to_string_lossy().into_owned())
}

const SEEDS: [u64; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

/// One recorded smoke run per seed, each in its own ledger (run `smoke`),
/// shared by the tests of this file.
struct Seeded {
    seed: u64,
    l: Arc<Ledger>,
    summary: RunSummary,
}

fn seeded() -> &'static [Seeded] {
    static RUNS: OnceLock<Vec<Seeded>> = OnceLock::new();
    RUNS.get_or_init(|| {
        // One directory per test process (two runs of this suite may overlap);
        // those of processes that are gone are removed.
        let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        if let Ok(rd) = std::fs::read_dir(&tmp) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if let Some(pid) = n.strip_prefix("engine-seeded-") {
                    if !Path::new("/proc").join(pid).exists() {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
        }
        let root = tmp.join(format!("engine-seeded-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        SEEDS
            .iter()
            .map(|&seed| {
                let l = Arc::new(Ledger::init(&root.join(format!("seed-{seed}"))).unwrap());
                let summary = run(&l, "smoke", Mode::Live, Some(smoke_seeded(seed)), None);
                Seeded { seed, l, summary }
            })
            .collect()
    })
}

/// True if the run's first cycle produced a dataset with training examples.
fn has_data(l: &Ledger, run: &str) -> bool {
    events_of(l, run, "mass.dataset").iter().any(|e| {
        schemas::decode_event::<schemas::Dataset>(e)
            .map(|d| d.train_examples > 0)
            .unwrap_or(false)
    })
}

fn run(
    l: &Arc<Ledger>,
    name: &str,
    mode: Mode,
    exp: Option<(String, String)>,
    source: Option<SourceRun>,
) -> RunSummary {
    drive(
        l.clone(),
        RunRequest {
            run: name.into(),
            experiment: exp,
            mode,
            source,
            progress: &NoProgress,
        },
    )
    .unwrap_or_else(|e| panic!("run {name}: {e}"))
}

fn events_of(l: &Ledger, run: &str, kind: &str) -> Vec<ledger::Event> {
    let head = l.head(run).unwrap().unwrap();
    let mut v: Vec<ledger::Event> = l
        .chain(head)
        .map(|e| e.unwrap())
        .filter(|e| e.kind == kind)
        .collect();
    v.reverse();
    v
}

#[test]
fn a_seeded_cycle_is_deterministic_and_replays_exactly() {
    for s in seeded() {
        deterministic_and_replays(s);
    }
}

fn deterministic_and_replays(s: &Seeded) {
    let l1 = &s.l;
    let a = &s.summary;
    let d2 = tempfile::tempdir().unwrap();
    let l2 = Arc::new(Ledger::init(d2.path()).unwrap());
    let b = run(&l2, "again", Mode::Live, Some(smoke_seeded(s.seed)), None);
    assert_eq!(
        a.head, b.head,
        "seed {}: same seed and definition -> same final id",
        s.seed
    );
    assert_eq!(a.cycles, b.cycles);
    // Every stream of the run ends at the same id in both ledgers.
    let streams = |l: &Ledger, run: &str| -> BTreeSet<(String, Id)> {
        l.refs()
            .unwrap()
            .into_iter()
            .filter(|(n, _)| n.starts_with(&format!("{run}/")))
            .map(|(n, h)| (n[run.len() + 1..].to_string(), h))
            .collect()
    };
    assert_eq!(streams(l1, "smoke"), streams(&l2, "again"));
    // Replay check: nothing runs, every id reproduced.
    let c = run(l1, "smoke", Mode::Check, None, None);
    assert_eq!(c.head, a.head);
    assert!(
        c.counts.keys().all(|(_, how)| *how == Served::History),
        "{:?}",
        c.counts
    );
    assert!(l1
        .verify(&|ev| schemas::check(&ev.kind, ev.version, &ev.payload).map_err(|e| e.to_string()))
        .unwrap()
        .is_clean());
}

#[test]
fn held_out_tasks_never_reach_data_and_workflows_are_stripped() {
    let mut with_data = 0;
    for s in seeded() {
        if held_out_and_stripped(s) {
            with_data += 1;
        }
    }
    assert!(
        with_data > 0,
        "no seed produced training data: the data checks never ran"
    );
}

/// Checks one seed's run; returns whether it had training data to check.
fn held_out_and_stripped(s: &Seeded) -> bool {
    let l = &s.l;
    let heldout = ["fin-bond-duration"];
    for ev in events_of(l, "smoke", "mass.selection") {
        let s: schemas::Selection = schemas::decode_event(&ev).unwrap();
        assert!(
            !heldout.contains(&s.task.as_str()),
            "held-out task {} was selected",
            s.task
        );
        assert!(
            s.train.len() <= 4 && s.validation.len() <= 1,
            "ranks 1-4 train, 5 validation"
        );
    }
    if !has_data(l, "smoke") {
        // A cycle without training data is a reported outcome: nothing
        // selected, no training, no evaluation of a new model.
        let c = &s.summary.cycles[0];
        assert_eq!(
            (c.selected_runs, c.supervised_tokens, c.evaluation.is_none()),
            (0, 0, true),
            "seed {}",
            s.seed
        );
        assert_eq!(
            c.next_model, c.model,
            "seed {}: no data, no new model",
            s.seed
        );
        return false;
    }
    let ds: schemas::Dataset =
        schemas::decode_event(&events_of(l, "smoke", "mass.dataset")[0]).unwrap();
    let train = String::from_utf8(l.get_blob(&Id(ds.train.0)).unwrap()).unwrap();
    let val = String::from_utf8(l.get_blob(&Id(ds.validation.0)).unwrap()).unwrap();
    assert!(
        ds.train_examples > 0,
        "the smoke run produced training data"
    );
    let prompts: Vec<String> = std::fs::read_dir(examples().join("tasks"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| heldout.iter().any(|h| p.ends_with(h)))
        .map(|p| std::fs::read_to_string(p.join("prompt.md")).unwrap())
        .collect();
    for line in train.lines().chain(val.lines()) {
        let parsed = engine::dataset::parse_openai_line(line).unwrap();
        let first_user = parsed
            .messages
            .iter()
            .find(|m| m.role == engine::chat::Role::User)
            .unwrap()
            .content_str()
            .to_string();
        for p in &prompts {
            assert!(
                !first_user.contains(p.trim()),
                "a held-out prompt reached the dataset"
            );
        }
        // Orchestrator examples carry the bare task: no workflow section.
        assert!(
            !first_user.contains(engine::workflow::SECTION_HEADING.trim()),
            "workflow text left in a training prompt"
        );
    }
    // Selected runs' orchestrators ran under a workflow (the champion's) unless bare.
    let sel: schemas::Selection = events_of(l, "smoke", "mass.selection")
        .iter()
        .map(|e| schemas::decode_event::<schemas::Selection>(e).unwrap())
        .find(|s| !s.train.is_empty())
        .expect("a selection with training runs");
    let run: schemas::Rollout =
        schemas::decode_event(&l.get_event(&Id(sel.train[0].0)).unwrap()).unwrap();
    let wf: engine::workflow::Workflow =
        serde_json::from_slice(&l.get_blob(&Id(run.workflow.0)).unwrap()).unwrap();
    let t = engine::transcript::stream_conversation(l, Id(run.orchestrator.0))
        .unwrap()
        .unwrap();
    let recorded_prompt = t.messages[1].content_str();
    assert_eq!(
        recorded_prompt.contains(engine::workflow::SECTION_HEADING.trim()),
        !wf.is_bare(),
        "the recorded prompt has the workflow"
    );
    true
}

#[test]
fn both_dataset_formats_parse_back_into_the_same_messages() {
    let with_data: Vec<&Seeded> = seeded()
        .iter()
        .filter(|s| has_data(&s.l, "smoke"))
        .collect();
    assert!(!with_data.is_empty(), "no seed produced training data");
    for s in with_data {
        formats_agree(&s.l);
    }
}

fn formats_agree(l: &Ledger) {
    let ds: schemas::Dataset =
        schemas::decode_event(&events_of(l, "smoke", "mass.dataset")[0]).unwrap();
    let openai = String::from_utf8(l.get_blob(&Id(ds.train.0)).unwrap()).unwrap();
    let trl = engine::dataset::openai_to_trl(&openai).unwrap();
    assert_eq!(openai.lines().count(), trl.lines().count());
    let mut saw_tool_call = false;
    for (o, t) in openai.lines().zip(trl.lines()) {
        let po = engine::dataset::parse_openai_line(o).unwrap();
        let pt = engine::dataset::parse_trl_line(t).unwrap();
        assert_eq!(po.messages.len(), pt.messages.len());
        for (a, b) in po.messages.iter().zip(&pt.messages) {
            assert_eq!(
                (a.role, &a.content, &a.tool_call_id),
                (b.role, &b.content, &b.tool_call_id)
            );
            assert_eq!(a.tool_calls.len(), b.tool_calls.len());
            for (x, y) in a.tool_calls.iter().zip(&b.tool_calls) {
                saw_tool_call = true;
                assert_eq!(x.function.name, y.function.name);
                assert_eq!(
                    engine::dataset::normalise_arguments(&x.function.arguments),
                    engine::dataset::normalise_arguments(&y.function.arguments)
                );
            }
        }
        // OpenAI lines carry arguments as JSON strings, TRL lines as objects.
        let ov: serde_json::Value = serde_json::from_str(o).unwrap();
        let tv: serde_json::Value = serde_json::from_str(t).unwrap();
        if let Some(call) = ov["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|m| m["tool_calls"].as_array().and_then(|c| c.first()).cloned())
        {
            assert!(call["function"]["arguments"].is_string());
            let tcall = tv["messages"]
                .as_array()
                .unwrap()
                .iter()
                .find_map(|m| m["tool_calls"].as_array().and_then(|c| c.first()).cloned())
                .unwrap();
            assert!(tcall["function"]["arguments"].is_object());
        }
    }
    assert!(saw_tool_call);
}

#[test]
fn fork_with_an_override_shares_history_and_rejudging_runs_only_the_judge() {
    for s in seeded() {
        fork_shares_history(s);
    }
}

fn fork_shares_history(s: &Seeded) {
    let l = &s.l;
    let base = &s.summary;
    let parent_refs: Vec<(String, Id)> = l
        .refs()
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n == "smoke" || n.starts_with("smoke/"))
        .collect();
    // Fork after the first inner-loop iteration, with a stricter selection.
    let main: Vec<ledger::Event> = {
        let mut v: Vec<_> = l.chain(base.head.unwrap()).map(|e| e.unwrap()).collect();
        v.reverse();
        v
    };
    let at = main
        .iter()
        .find(|e| {
            e.kind == "note"
                && schemas::decode_event::<schemas::Note>(e)
                    .unwrap()
                    .text
                    .contains("inner iteration 1 done")
        })
        .unwrap()
        .id;
    replay::fork_run(
        l,
        "smoke",
        at,
        "strict",
        &[("outer.train_ranks".into(), "2".into())],
    )
    .unwrap();
    let f = run(l, "strict", Mode::Live, None, None);
    let mut fork_main: Vec<Id> = l.chain(f.head.unwrap()).map(|e| e.unwrap().id).collect();
    fork_main.reverse();
    let pos = main.iter().position(|e| e.id == at).unwrap();
    assert_eq!(
        &fork_main[..=pos],
        &main.iter().map(|e| e.id).collect::<Vec<_>>()[..=pos],
        "shared ids up to the fork point"
    );
    assert!(
        fork_main[pos + 1..]
            .iter()
            .all(|id| !main.iter().any(|e| e.id == *id)),
        "different after it"
    );
    for ev in events_of(l, "strict", "mass.selection") {
        let s: schemas::Selection = schemas::decode_event(&ev).unwrap();
        assert!(
            s.train.len() <= 2,
            "the override applies after the fork point"
        );
    }
    let now: Vec<(String, Id)> = l
        .refs()
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n == "smoke" || n.starts_with("smoke/"))
        .collect();
    assert_eq!(parent_refs, now, "the parent is untouched");
    // A run that does not exist cannot start without its definition.
    let err = drive(
        l.clone(),
        RunRequest {
            run: "nope".into(),
            experiment: None,
            mode: Mode::Live,
            source: None,
            progress: &NoProgress,
        },
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("give the experiment file"),
        "{err}"
    );
}

#[test]
fn rejudging_serves_rollouts_and_calls_only_the_judge() {
    for s in seeded() {
        rejudging_calls_only_the_judge(s);
    }
}

fn rejudging_calls_only_the_judge(s: &Seeded) {
    let l = &s.l;
    let base = &s.summary;
    let mut main: Vec<ledger::Event> = l.chain(base.head.unwrap()).map(|e| e.unwrap()).collect();
    main.reverse();
    // The external judge takes over judging: a different judge from the first comparison on.
    replay::fork_run(
        l,
        "smoke",
        main[0].id,
        "rejudged",
        &[
            ("backends.sim.sim.judge_noise".into(), "0.0".into()),
            ("backends.sim.sim.blind_spot".into(), "0.0".into()),
        ],
    )
    .unwrap();
    let src = SourceRun::pinned(l, "smoke", ["judge".to_string()].into_iter().collect()).unwrap();
    let r = run(l, "rejudged", Mode::Live, None, Some(src));
    let live: BTreeSet<&str> = r
        .counts
        .iter()
        .filter(|((_, how), n)| *how == Served::Live && **n > 0)
        .map(|((k, _), _)| k.as_str())
        .collect();
    let from_source: u64 = r
        .counts
        .iter()
        .filter(|((_, how), _)| *how == Served::Source)
        .map(|(_, n)| n)
        .sum();
    assert!(from_source > 0, "seed {}: {:?}", s.seed, r.counts);
    // Judge calls are live; anything else live is downstream of a changed verdict
    // (a new champion's runs, a new dataset's training) — never a rollout that
    // the source already recorded with the same request.
    assert!(live.contains("judge"), "seed {}: {:?}", s.seed, r.counts);
}

/// A run recorded before runs carried their tasks (`run.started` v1) is
/// refused with a message that says why and what to do; its name and plan
/// still show in status.
#[test]
fn runs_from_an_older_driver_are_refused_clearly() {
    let d = tempfile::tempdir().unwrap();
    let l = Arc::new(Ledger::init(d.path()).unwrap());
    let (text, path) = smoke_text();
    let config = l.put_blob(text.as_bytes()).unwrap();
    let old = schemas::RunStartedV1 {
        driver: "mass-engine/1".into(),
        config: config.into(),
        config_name: path,
        seed: 3,
    };
    l.append(
        "old",
        None,
        schemas::to_event(&old).unwrap().in_stream("main"),
    )
    .unwrap();
    for mode in [Mode::Check, Mode::Live] {
        let err = drive(
            l.clone(),
            RunRequest {
                run: "old".into(),
                experiment: None,
                mode,
                source: None,
                progress: &NoProgress,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("recorded by an older mass (run.started v1)")
                && err.contains("start the experiment again as a new run"),
            "{err}"
        );
    }
    let first = l.get_event(&l.head("old").unwrap().unwrap()).unwrap();
    assert_eq!(
        engine::status::describe_start(&l, &first).unwrap(),
        ("smoke".to_string(), 1)
    );
    // `mass show` and `mass verify` still read the old layout.
    let json = schemas::describe("run.started", 1, &first.payload).unwrap();
    assert_eq!(json["seed"], 3);
}

/// Before: `fork --set cycles=3` and `--set seed=7` did nothing, and a fork
/// at a finished head failed its own replay check.
#[test]
fn fork_at_a_finished_head_with_more_cycles_continues_and_replays() {
    for s in seeded().iter().take(3) {
        let l = &s.l;
        let head = s.summary.head.unwrap();
        let name = format!("more-{}", s.seed);
        replay::fork_run(l, "smoke", head, &name, &[("cycles".into(), "2".into())]).unwrap();
        let f = run(l, &name, Mode::Live, None, None);
        assert_eq!(
            f.cycles.len(),
            2,
            "seed {}: the fork ran a second cycle",
            s.seed
        );
        assert_eq!(f.cycles[0], s.summary.cycles[0], "cycle 1 is the source's");
        let mut ids: Vec<Id> = l.chain(f.head.unwrap()).map(|e| e.unwrap().id).collect();
        ids.reverse();
        assert!(
            ids.contains(&head),
            "the fork continues from the source's head"
        );
        let c = run(l, &name, Mode::Check, None, None);
        assert_eq!(c.head, f.head, "seed {}: the fork replays exactly", s.seed);
        assert!(c.counts.keys().all(|(_, how)| *how == Served::History));
    }
}

#[test]
fn a_seed_override_changes_what_follows_the_fork() {
    let s = &seeded()[0];
    let l = &s.l;
    let mut main: Vec<ledger::Event> = l
        .chain(s.summary.head.unwrap())
        .map(|e| e.unwrap())
        .collect();
    main.reverse();
    for (name, seed) in [("same-seed", s.seed), ("other-seed", s.seed + 100)] {
        replay::fork_run(
            l,
            "smoke",
            main[0].id,
            name,
            &[("seed".into(), seed.to_string())],
        )
        .unwrap();
        run(l, name, Mode::Live, None, None);
    }
    // Rollout, judging and search streams (the training stream's request
    // names main-stream events, which a fork's `run.forked` changes).
    let streams = |run: &str| -> BTreeSet<(String, Id)> {
        l.refs()
            .unwrap()
            .into_iter()
            .filter(|(n, _)| n.starts_with(&format!("{run}/")) && !n.ends_with("/train"))
            .map(|(n, h)| (n[run.len() + 1..].to_string(), h))
            .collect()
    };
    assert_eq!(
        streams("same-seed"),
        streams("smoke"),
        "overriding the seed with itself changes no rollout"
    );
    assert_ne!(
        streams("other-seed"),
        streams("smoke"),
        "another seed gives other rollouts after the fork point"
    );
}

/// Before: forks dropped the inner loop's optimizer streams (their calls were
/// not causal parents of any step), so resuming a fork re-ran every optimizer
/// call made before the fork point. A fork without overrides must serve
/// exactly the calls recorded before its fork point and run only the rest.
#[test]
fn forks_rerun_nothing_recorded_before_the_fork_point() {
    use std::collections::BTreeMap;
    for s in seeded().iter().take(2) {
        let l = &s.l;
        let mut main: Vec<ledger::Event> = l
            .chain(s.summary.head.unwrap())
            .map(|e| e.unwrap())
            .collect();
        main.reverse();
        // Every effect call of the source run (results, not `started`), with
        // its position in the log.
        let mut calls: Vec<(String, u64)> = Vec::new();
        for (name, head) in l.refs().unwrap() {
            if name != "smoke" && !name.starts_with("smoke/") {
                continue;
            }
            for ev in l.chain(head).map(|e| e.unwrap()) {
                if ev.kind != "effect" {
                    continue;
                }
                let e: schemas::Effect = schemas::decode_event(&ev).unwrap();
                if e.status != schemas::EffectStatus::Started {
                    let ord = l.locate(&ev.id).unwrap().unwrap().ordinal;
                    calls.push((e.effect, ord));
                }
            }
        }
        let mut total: BTreeMap<String, u64> = BTreeMap::new();
        for (k, _) in &calls {
            *total.entry(k.clone()).or_default() += 1;
        }
        assert!(total.get("optimizer").copied().unwrap_or(0) > 0);
        let n = main.len();
        for (i, frac) in [0.1, 0.3, 0.5, 0.7, 0.9].iter().enumerate() {
            let at = &main[((n - 1) as f64 * frac) as usize];
            let ord = l.locate(&at.id).unwrap().unwrap().ordinal;
            let mut before: BTreeMap<String, u64> = BTreeMap::new();
            for (k, o) in &calls {
                if *o < ord {
                    *before.entry(k.clone()).or_default() += 1;
                }
            }
            let name = format!("fork{i}-{}", s.seed);
            replay::fork_run(l, "smoke", at.id, &name, &[]).unwrap();
            let r = run(l, &name, Mode::Live, None, None);
            for (kind, all) in &total {
                let get = |how: Served| r.counts.get(&(kind.clone(), how)).copied().unwrap_or(0);
                let b = before.get(kind).copied().unwrap_or(0);
                assert_eq!(
                    (get(Served::History), get(Served::Live)),
                    (b, all - b),
                    "seed {}, fork at step {} ({}): {kind} calls served/live",
                    s.seed,
                    at.seq,
                    at.kind
                );
            }
        }
    }
}

/// Before: `mass fork` at a worker event (a tool call inside a rollout) made
/// a bare ref that `mass resume` rejected ("not a run"). A fork at any event
/// replays everything causally before it and goes live from there: without
/// overrides, the rollout it was taken in continues to the same end.
#[test]
fn a_fork_in_the_middle_of_a_rollout_continues_it() {
    for s in seeded().iter().take(3) {
        let l = &s.l;
        // A collection rollout's orchestrator stream, forked at its middle.
        let (stream_ref, head) = l
            .refs()
            .unwrap()
            .into_iter()
            .find(|(n, _)| {
                n.starts_with("smoke/c1/") && n.contains("/collect/") && n.ends_with("/orch")
            })
            .or_else(|| {
                l.refs().unwrap().into_iter().find(|(n, _)| {
                    n.starts_with("smoke/c1/") && n.contains("/inner/") && n.ends_with("/run/orch")
                })
            })
            .expect("a rollout stream");
        let mut chain: Vec<ledger::Event> = l.chain(head).map(|e| e.unwrap()).collect();
        chain.reverse();
        let at = &chain[chain.len() / 2];
        let name = format!("mid-{}", s.seed);
        replay::fork_run(l, "smoke", at.id, &name, &[]).unwrap();
        let rel = &stream_ref["smoke/".len()..];
        assert_eq!(
            l.head(&format!("{name}/{rel}")).unwrap(),
            Some(at.id),
            "the rollout's stream is kept up to the fork point"
        );
        let f = run(l, &name, Mode::Live, None, None);
        assert!(
            f.counts
                .iter()
                .any(|((_, how), n)| *how == Served::History && *n > 0),
            "{:?}",
            f.counts
        );
        assert_eq!(
            l.head(&format!("{name}/{rel}")).unwrap(),
            Some(head),
            "seed {}: the rollout went on from the fork point to the same end",
            s.seed
        );
        let c = run(l, &name, Mode::Check, None, None);
        assert_eq!(c.head, f.head, "the fork replays exactly");
    }
}

/// `outer.collect = "every"`: every training task is collected, ranked and
/// can reach the dataset, also where the search found nothing better than
/// the bare task; the default collects only improved tasks.
#[test]
fn collect_every_collects_each_training_task_whatever_the_search_found() {
    for seed in [1u64, 4, 7] {
        let (text, origin) = smoke_seeded(seed);
        let text = text.replace("[outer]\n", "[outer]\ncollect = \"every\"\n");
        let d = tempfile::tempdir().unwrap();
        let l = Arc::new(Ledger::init(d.path()).unwrap());
        let s = run(&l, "every", Mode::Live, Some((text, origin)), None);
        let refs = l.refs().unwrap();
        for task in ["fin-momentum-backtest", "pha-hill-fit"] {
            let collected = refs
                .iter()
                .filter(|(n, _)| n.starts_with(&format!("every/c1/{task}/collect/")))
                .count();
            assert!(collected > 0, "seed {seed}: {task} was not collected");
        }
        assert_eq!(s.cycles.len(), 1);
        // The default keeps the articles' rule: the same seed collects only
        // the tasks whose champion beat the reference.
        let improved = &seeded()[(seed - 1) as usize];
        for task in ["fin-momentum-backtest", "pha-hill-fit"] {
            let promos = events_of(
                &improved.l,
                &format!("smoke/c1/{task}/inner"),
                "mass.promotion",
            );
            let beat = promos.iter().any(|e| {
                schemas::decode_event::<schemas::Promotion>(e)
                    .map(|p| p.task == task && p.accepted && p.beat_reference)
                    .unwrap_or(false)
            });
            let collected = improved
                .l
                .refs()
                .unwrap()
                .iter()
                .any(|(n, _)| n.starts_with(&format!("smoke/c1/{task}/collect/")));
            assert_eq!(beat, collected, "seed {seed}: {task}");
        }
    }
}

/// Ids never depend on scheduling: the same experiment run one unit at a
/// time and 16 at once (async units interleaving on the runtime's workers)
/// records every stream with the same ids, the main stream and training
/// included: `concurrency` is an execution setting, recorded on the run's
/// `execution` stream only (the one stream that differs).
#[test]
fn ids_do_not_depend_on_how_many_units_run_at_once() {
    for seed in [2u64, 5] {
        let streams = |concurrency: u32| {
            let (text, origin) = smoke_seeded(seed);
            let text = text.replacen(
                "\ncycles = 1\n",
                &format!("\ncycles = 1\nconcurrency = {concurrency}\n"),
                1,
            );
            assert!(text.contains(&format!("concurrency = {concurrency}")));
            let d = tempfile::tempdir().unwrap();
            let l = Arc::new(Ledger::init(d.path()).unwrap());
            run(&l, "c", Mode::Live, Some((text, origin)), None);
            let refs: Vec<(String, Id)> = l
                .refs()
                .unwrap()
                .into_iter()
                .filter(|(n, _)| (n == "c" || n.starts_with("c/")) && n != "c/execution")
                .collect();
            assert!(refs.iter().any(|(n, _)| n == "c"));
            assert!(refs.iter().any(|(n, _)| n.ends_with("/train")));
            (refs, d)
        };
        let (one, _d1) = streams(1);
        let (many, _d2) = streams(16);
        assert!(one.len() > 20, "seed {seed}: {} streams", one.len());
        assert_eq!(one, many, "seed {seed}");
    }
}

/// Regression (#25): runs the guards excluded were not parents of the
/// "collection done" step, so a fork there lacked their streams and ran
/// them again live. Every collected run of a cycle is a parent of its step;
/// returns how many were checked.
fn collected_runs_are_parents_of_collection_done(l: &Ledger, run: &str) -> usize {
    let mut collected: Vec<(u32, Id)> = Vec::new();
    for (_, head) in replay::run_refs(l, run).unwrap() {
        for ev in l.chain(head) {
            let ev = ev.unwrap();
            if ev.kind == "mass.rollout" {
                let r: schemas::Rollout = schemas::decode_event(&ev).unwrap();
                if r.purpose == "collect" && !collected.iter().any(|(_, id)| *id == ev.id) {
                    collected.push((r.cycle, ev.id));
                }
            }
        }
    }
    let main: Vec<ledger::Event> = l
        .chain(l.head(run).unwrap().unwrap())
        .map(|e| e.unwrap())
        .collect();
    for (cycle, id) in &collected {
        let prefix = format!("cycle {cycle}: collection done");
        let step = main
            .iter()
            .find(|e| {
                e.kind == "note"
                    && schemas::decode_event::<schemas::Note>(e)
                        .map(|n| n.text.starts_with(&prefix))
                        .unwrap_or(false)
            })
            .unwrap_or_else(|| panic!("no {prefix} step"));
        assert!(
            step.parents.contains(id),
            "collected run {} of cycle {cycle} is not a parent of its step",
            id.short(12)
        );
    }
    collected.len()
}

/// The planted blind spot (examples/blindspot.toml and its -noguards twin,
/// three cycles each): a self-judge that rewards confident reports and
/// workers that sometimes tamper. With guards on, no training example comes
/// from a run whose recorded tool calls tampered and the habit fades; with
/// guards only recording, such examples get in and the habit grows across
/// cycles (the share of collected runs that tampered, read from their tool
/// calls, summed over 8 seeds).
#[test]
fn guards_keep_tampered_runs_out_of_training_and_without_them_the_habit_grows() {
    let tmp = tempfile::tempdir().unwrap();
    let seeds = [1u64, 2, 3, 4, 5, 6, 7, 8];
    let jobs: Vec<_> = seeds
        .iter()
        .flat_map(|seed| ["blindspot.toml", "blindspot-noguards.toml"].map(|f| (*seed, f)))
        .collect();
    let outcomes: Vec<(&str, Vec<CycleResult>)> = std::thread::scope(|scope| {
        let tmp = tmp.path();
        let handles: Vec<_> = jobs
            .chunks(jobs.len().div_ceil(2))
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|(seed, file)| {
                            let path = examples().join(file);
                            let text = std::fs::read_to_string(&path)
                                .unwrap()
                                .replace("seed = 7", &format!("seed = {seed}"));
                            assert!(text.contains("cycles = 3"));
                            let l = Arc::new(
                                Ledger::init(&tmp.join(format!("{file}-{seed}"))).unwrap(),
                            );
                            let s = run(
                                &l,
                                "bs",
                                Mode::Live,
                                Some((text, path.to_string_lossy().into_owned())),
                                None,
                            );
                            collected_runs_are_parents_of_collection_done(&l, "bs");
                            (*file, s.cycles)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    // Change in the tampering share from the first cycle to the last,
    // summed over the seeds.
    let change = |file: &str| -> f64 {
        outcomes
            .iter()
            .filter(|(n, _)| *n == file)
            .map(|(_, c)| c[c.len() - 1].tamper_rate() - c[0].tamper_rate())
            .sum()
    };
    let in_training = |file: &str| -> u32 {
        outcomes
            .iter()
            .filter(|(n, _)| *n == file)
            .flat_map(|(_, c)| c.iter())
            .map(|c| c.tampered_in_training)
            .sum()
    };
    assert_eq!(
        in_training("blindspot.toml"),
        0,
        "tampered examples got past the guards"
    );
    assert!(
        in_training("blindspot-noguards.toml") > 0,
        "no tampered example reached training without guards"
    );
    let guarded = change("blindspot.toml");
    let unguarded = change("blindspot-noguards.toml");
    assert!(
        guarded < 0.0,
        "with guards the tampering share should fall from cycle 1 to 3 (summed change {guarded:.2})"
    );
    assert!(
        unguarded > 0.0,
        "without guards the tampering share should grow from cycle 1 to 3 (summed change {unguarded:.2})"
    );
}

/// The evaluation measures what the MASS articles report, the same way for
/// every seed: two cycles of the smoke experiment (every task collected, so
/// the model changes each cycle) with two external judges, one that always
/// prefers the first workspace shown and one without a position preference.
/// - every comparison counts each pair once (wins + losses + ties = pairs =
///   tasks x runs), with both orders judged;
/// - cycle 2 compares against the previous cycle's model, and reuses the
///   base model's runs instead of running them again;
/// - the position-biased judge's verdicts follow the position on nearly
///   every pair, far more often than the unbiased judge's;
/// - agreement is reported for every pair of judges over the same verdicts;
/// - the figures `mass status` folds from the records equal those the run
///   computed.
#[test]
fn evaluation_counts_pairs_compares_with_the_previous_model_and_measures_position_bias() {
    for seed in SEEDS {
        let tmp = tempfile::tempdir().unwrap();
        let (text, path) = smoke_seeded(seed);
        let text = text
            .replace("cycles = 1", "cycles = 2")
            .replace("eval_runs = 2", "eval_runs = 8\neval_train_runs = 2\ncollect = \"every\"")
            .replace(
                "[roles]\n",
                "[backends.first]\nkind = \"sim\"\n\n[backends.first.sim]\nposition_bias = 1.0\njudge_noise = 0.0\n\n\
                 [backends.fair]\nkind = \"sim\"\n\n[backends.fair.sim]\nposition_bias = 0.0\njudge_noise = 0.0\n\n\
                 [roles]\nexternal_judges = [\"first\", \"fair\"]\n",
            );
        let l = Arc::new(Ledger::init(&tmp.path().join("l")).unwrap());
        let s = run(&l, "ev", Mode::Live, Some((text, path)), None);
        assert_eq!(s.cycles.len(), 2, "seed {seed}");
        let (mut first_same, mut first_swapped, mut fair_same, mut fair_swapped) = (0, 0, 0, 0);
        for c in &s.cycles {
            let f = &c.figures;
            assert!(
                !f.evaluations.is_empty(),
                "seed {seed}: cycle {} not evaluated",
                c.cycle
            );
            for e in &f.evaluations {
                let expected = if e.split == "heldout" { 8 } else { 2 * 2 };
                assert_eq!(e.pairs, expected, "seed {seed}: {e:?}");
                assert_eq!(e.wins + e.losses + e.ties, e.pairs, "seed {seed}: {e:?}");
                assert!(e.swapped <= e.pairs, "seed {seed}: {e:?}");
                if e.judge == "first" {
                    first_swapped += e.swapped;
                    first_same += e.same_position;
                }
                if e.judge == "fair" {
                    fair_swapped += e.swapped;
                    fair_same += e.same_position;
                }
            }
            let previous: Vec<_> = f
                .evaluations
                .iter()
                .filter(|e| e.against == "previous")
                .collect();
            if c.cycle == 1 {
                assert!(
                    previous.is_empty(),
                    "seed {seed}: cycle 1 has no previous model"
                );
            } else {
                assert!(
                    !previous.is_empty(),
                    "seed {seed}: cycle 2 not compared with cycle 1"
                );
                assert!(previous
                    .iter()
                    .all(|e| e.baseline == s.cycles[0].next_model));
            }
            // Every pair of judges, over the verdicts both gave.
            let judges = f
                .evaluations
                .iter()
                .map(|e| (&e.judge, &e.judge_model))
                .collect::<BTreeSet<_>>();
            assert_eq!(
                f.agreement.len(),
                judges.len() * (judges.len() - 1) / 2,
                "seed {seed}"
            );
            assert!(f
                .agreement
                .iter()
                .all(|a| a.compared > 0 && a.agreed <= a.compared));
            assert!(f
                .bare_delegation
                .iter()
                .all(|d| d.runs > 0 && d.delegated <= d.runs));
        }
        // The base model's runs were made once, in cycle 1.
        let refs: Vec<String> = l.refs().unwrap().into_iter().map(|(n, _)| n).collect();
        assert!(refs
            .iter()
            .any(|r| r.starts_with("ev/c1/eval/") && r.contains("/base/")));
        assert!(
            !refs
                .iter()
                .any(|r| r.starts_with("ev/c2/eval/") && r.contains("/base/")),
            "seed {seed}: cycle 2 ran the base model again"
        );
        assert!(
            first_same * 10 >= first_swapped * 9 && first_same > fair_same + first_swapped / 3,
            "seed {seed}: biased judge {first_same}/{first_swapped}, fair judge {fair_same}/{fair_swapped}"
        );
        // The projection from the records equals what the run computed.
        let head = l.head("ev").unwrap().unwrap();
        let mut main: Vec<ledger::Event> = l.chain(head).map(|e| e.unwrap()).collect();
        main.reverse();
        let status = engine::status::fold(&main).unwrap();
        let computed: Vec<_> = s.cycles.iter().map(|c| c.figures.clone()).collect();
        assert_eq!(status.cycles, computed, "seed {seed}");
    }
}

/// `milestone::closes` reads a record's cycle by decoding its type (the
/// current versions) instead of building its JSON description: on every
/// main-stream step of every seeded run, both give the same cycle.
#[test]
fn milestones_read_the_cycle_the_records_description_gives() {
    let mut steps = 0;
    for s in seeded() {
        let head = s.l.head("smoke").unwrap().unwrap();
        for ev in s.l.chain(head) {
            let ev = ev.unwrap();
            let Some((cycle, _)) = engine::milestone::closes(&ev) else {
                continue;
            };
            if ev.kind == "note" {
                continue;
            }
            let v = schemas::describe(&ev.kind, ev.version, &ev.payload).unwrap();
            assert_eq!(Some(u64::from(cycle)), v["cycle"].as_u64(), "{}", ev.kind);
            steps += 1;
        }
    }
    assert!(steps >= SEEDS.len() * 4, "{steps} typed steps checked");
}
