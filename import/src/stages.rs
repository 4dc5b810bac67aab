//! The run as the engine would have recorded it, from the checked plan:
//! `run.started`, the episodes (`episodes.rs`) closed stage by stage by the
//! notes `engine::milestone` reads, the self-judged comparisons as
//! `mass.judgment`, each task's `mass.ranking` and `mass.selection`, the
//! selected conversations as a `mass.dataset` with its provenance, the
//! trainer's metrics as `mass.train_step`, the chosen checkpoint as
//! `mass.training` and the external judges' verdicts as the cycle's
//! evaluations (`evaluation.rs`). Every main-stream step names what it
//! closes as parents, so the run's head covers every imported object
//! (the evaluations through the cycle record's links): change one byte of an
//! episode and the head changes. Mapping and what stays absent:
//! ARCHITECTURE.md, "Importing a reference run".

use std::collections::{BTreeMap, HashMap};

use ledger::Id;
use schemas::{
    Cycle, Dataset, Exclusion, Judgment, Note, RankedRun, Ranking, RunStarted, Selection,
    TrainStep, Training,
};
use serde_json::{json, Value};

use crate::episodes::{self, Imported};
use crate::error::Result;
use crate::objects::{id32, Objects, When, ABSENT, MAIN};
use crate::plan::{Plan, TaskEpisodes, TaskStage};

/// The driver named in an imported run's `run.started`: no engine drives
/// it (resume, replay, fork and re-judge refuse it by this name).
pub const DRIVER: &str = "sakana-import/1";

fn note(o: &mut Objects, text: String, parents: Vec<Id>, at: When) -> Result<Id> {
    let n = Note { text };
    o.record(MAIN, &n, parents, at)
}

fn cfg_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Every object of the import of `plan`.
pub fn build(plan: &Plan) -> Result<Objects> {
    let s = &plan.scrub;
    let c = plan.cycle;
    let mut o = Objects::new(plan.caps.objects);
    let cfg = s.json(&plan.config.value);
    let model = cfg_str(&cfg, "model_id").unwrap_or("").to_string();
    let config = o.json(&cfg);
    let started = RunStarted {
        driver: DRIVER.into(),
        config: id32(config),
        tasks: ABSENT,
        seed: 0,
    };
    let at = When::Mtime(plan.config.mtime_ms);
    o.partial(MAIN, &started, Vec::new(), at, &["seed"])?;
    let mut collected: HashMap<String, Imported> = HashMap::new();
    for purpose in ["reference", "inner", "collect", "eval"] {
        let mut groups: BTreeMap<u32, Vec<Id>> = BTreeMap::new();
        let mut at = When::Logged(0);
        for ep in plan.episodes.iter().filter(|e| e.purpose == purpose) {
            let imp = episodes::import(&mut o, s, ep, c, &model)?;
            let key = if purpose == "inner" { ep.index } else { 0 };
            groups.entry(key).or_default().push(imp.rollout);
            at = at.later(imp.finished);
            if purpose == "collect" {
                collected.insert(ep.name.clone(), imp);
            }
        }
        for (k, rollouts) in groups {
            let n = rollouts.len();
            let text = match purpose {
                "reference" => format!("cycle {c}: reference runs done"),
                "inner" => format!("cycle {c}: inner iteration {k} done ({n} run(s))"),
                "collect" => format!("cycle {c}: collection done ({n} run(s))"),
                _ => crate::evaluation::runs_note(plan, n),
            };
            note(&mut o, text, rollouts, at)?;
        }
    }
    let mut selections = Vec::new();
    let mut chosen: HashMap<String, (Id, Id)> = HashMap::new();
    let judged = judgments(&mut o, plan, &collected, &model)?;
    for st in plan.stages.iter().filter(|t| !t.ranked.is_empty()) {
        let js = judged.get(&st.task).cloned().unwrap_or_default();
        let (ranking, sel) = rank_and_select(&mut o, plan, st, &collected, &js)?;
        selections.push(sel);
        if let Some(t) = plan.by_task.get(&st.task) {
            for e in t.train.iter().chain(&t.validation) {
                chosen.insert(e.clone(), (sel, ranking));
            }
        }
    }
    let dataset = dataset(&mut o, plan, &collected, &chosen, selections)?;
    let next_model = match dataset {
        Some(d) => training(&mut o, plan, &cfg, &model, d)?,
        None => None,
    };
    let selected = plan.train.len() + plan.validation.len();
    let cycle = Cycle {
        cycle: c,
        model: model.clone(),
        next_model: next_model.unwrap_or_else(|| model.clone()),
        inner_wins: plan.inner_wins,
        inner_iterations: cfg
            .get("search")
            .and_then(|x| x.get("iterations")?.as_u64())
            .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        selected_runs: selected as u32,
        supervised_tokens: 0,
        collected_runs: collected.len() as u32,
        delegating_runs: collected.values().filter(|i| i.delegations > 0).count() as u32,
        // The reference runs no guards: nothing was checked, nothing found.
        tampered_runs: 0,
        tampered_in_training: 0,
        bare_delegation: Vec::new(),
        agreement: Vec::new(),
        // After training, as the evaluate stage runs.
        evaluations: crate::evaluation::build(&mut o, plan, &model)?,
    };
    let at = plan
        .selected
        .as_ref()
        .map_or(plan.selection_mtime, |f| f.mtime_ms)
        .max(plan.external.as_ref().map_or(0, |e| e.mtime_ms));
    // No tokenizer in the folder, no guards run: nothing counted.
    let missing = ["supervised_tokens", "tampered_runs", "tampered_in_training"];
    o.partial(MAIN, &cycle, Vec::new(), When::Mtime(at), &missing)?;
    let text = format!("run finished (imported by {DRIVER} from a reference run folder)");
    let last = plan
        .episodes
        .iter()
        .map(|e| e.files.mtime_ms)
        .chain([plan.selection_mtime, plan.config.mtime_ms])
        .chain(plan.selected.as_ref().map(|f| f.mtime_ms))
        .chain(plan.external.as_ref().map(|e| e.mtime_ms))
        .max()
        .unwrap_or(0);
    note(&mut o, text, Vec::new(), When::Mtime(last))?;
    Ok(o)
}

/// The self-judged comparisons of every task, on its `pair` stream; the
/// judgment events per task and match order. A closing note follows.
fn judgments(
    o: &mut Objects,
    plan: &Plan,
    collected: &HashMap<String, Imported>,
    model: &str,
) -> Result<HashMap<String, Vec<Id>>> {
    let s = &plan.scrub;
    let c = plan.cycle;
    let mut out: HashMap<String, Vec<Id>> = HashMap::new();
    let mut heads = Vec::new();
    let mut at = 0;
    for st in &plan.stages {
        let rel = format!("c{c}/{}/pair", st.task);
        for m in &st.matches {
            // plan.rs checked both names are collected episodes.
            let (Some(a), Some(b)) = (collected.get(&m.a), collected.get(&m.b)) else {
                continue;
            };
            let v = s.json(&m.row.value);
            let j = Judgment {
                task: st.task.clone(),
                a: id32(a.rollout),
                b: id32(b.rollout),
                swapped: false,
                judge_model: cfg_str(&v, "model").unwrap_or(model).to_string(),
                winner: m.winner.into(),
                rationale: cfg_str(&v, "rationale").unwrap_or("").to_string(),
                invalid_attempts: 0,
                conversation: ABSENT,
            };
            let id = o.record(&rel, &j, Vec::new(), When::Mtime(st.matches_mtime))?;
            out.entry(st.task.clone()).or_default().push(id);
        }
        if let Some(h) = o.head(&rel) {
            heads.push(h);
            at = at.max(st.matches_mtime);
        }
    }
    let n: usize = out.values().map(Vec::len).sum();
    if n > 0 {
        note(
            o,
            format!("cycle {c}: {n} comparison(s) judged"),
            heads,
            When::Mtime(at),
        )?;
    }
    Ok(out)
}

/// A task's `mass.ranking` (the reference's scores and ranks; wins,
/// losses and ties counted from its matches) and `mass.selection`.
fn rank_and_select(
    o: &mut Objects,
    plan: &Plan,
    st: &TaskStage,
    collected: &HashMap<String, Imported>,
    judgments: &[Id],
) -> Result<(Id, Id)> {
    let c = plan.cycle;
    // Wins, losses and ties of each episode, in one pass over the matches
    // (not one per ranked episode).
    let mut tally: HashMap<&str, (u32, u32, u32)> = HashMap::new();
    for m in &st.matches {
        let (a, b) = match m.winner {
            "tie" => ((0, 0, 1), (0, 0, 1)),
            "a" => ((1, 0, 0), (0, 1, 0)),
            _ => ((0, 1, 0), (1, 0, 0)),
        };
        for (name, d) in [(m.a.as_str(), a), (m.b.as_str(), b)] {
            let x = tally.entry(name).or_default();
            *x = (x.0 + d.0, x.1 + d.1, x.2 + d.2);
        }
    }
    let mut runs = Vec::new();
    for r in &st.ranked {
        let Some(imp) = collected.get(&r.episode) else {
            continue;
        };
        let (w, l, t) = tally.get(r.episode.as_str()).copied().unwrap_or_default();
        runs.push(RankedRun {
            rollout: id32(imp.rollout),
            score: r.score,
            rank: r.rank,
            wins: w,
            losses: l,
            ties: t,
        });
    }
    // The reference's fit (mass/ranking.py): prior 0.5, a fixed 500
    // iterations, no convergence test (so never reported converged).
    let ranking = Ranking {
        task: st.task.clone(),
        cycle: c,
        prior: 0.5,
        iterations: 500,
        converged: false,
        runs,
        judgments: judgments.iter().copied().map(id32).collect(),
    };
    let rid = o.record(MAIN, &ranking, Vec::new(), When::Mtime(st.ranked_mtime))?;
    let sid = selection(o, plan, st, collected, rid)?;
    Ok((rid, sid))
}

/// A task's `mass.selection`: the manifests' episodes of the task, and the
/// collected episodes the reference did not complete as exclusions.
fn selection(
    o: &mut Objects,
    plan: &Plan,
    st: &TaskStage,
    collected: &HashMap<String, Imported>,
    rid: Id,
) -> Result<Id> {
    let c = plan.cycle;
    let none = TaskEpisodes::default();
    let mine = plan.by_task.get(&st.task).unwrap_or(&none);
    let pick = |names: &[String]| -> Vec<schemas::Hash32> {
        names
            .iter()
            .filter_map(|n| collected.get(n))
            .map(|i| id32(i.rollout))
            .collect()
    };
    let train = pick(&mine.train);
    let validation = pick(&mine.validation);
    let mut exclusions = Vec::new();
    for e in mine.collected.iter().map(|&i| &plan.episodes[i]) {
        if let Some(imp) = collected.get(&e.name).filter(|i| i.status != "finished") {
            exclusions.push(Exclusion {
                rollout: id32(imp.rollout),
                reason: format!(
                    "{}: not completed in the reference (not ranked)",
                    imp.status
                ),
            });
        }
    }
    let col = plan.config.value.get("collection");
    let wanted_train = col
        .and_then(|x| x.get("train_ranks")?.as_u64())
        // Past u32 asks for more than any manifest holds: still a shortfall.
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
    // A rank, as the re-judge reads it (`rejudge_imported`): `null`, or
    // anything but a number, asks for no validation run.
    let wanted_validation = u32::from(
        col.and_then(|x| x.get("validation_rank")?.as_u64())
            .is_some(),
    );
    let shortfall =
        if (train.len() as u32) < wanted_train || (validation.len() as u32) < wanted_validation {
            "fewer runs selected than the config's ranks ask (as the reference's manifests hold)"
                .to_string()
        } else {
            String::new()
        };
    let sel = Selection {
        task: st.task.clone(),
        cycle: c,
        ranking: id32(rid),
        train,
        validation,
        excluded: Vec::new(),
        exclusions,
        wanted_train,
        wanted_validation,
        shortfall,
    };
    let at = plan.selection_mtime.max(st.ranked_mtime);
    o.record(MAIN, &sel, Vec::new(), When::Mtime(at))
}

/// The selected episodes' conversations (each leaf of its request tree,
/// reply included) as OpenAI chat lines, train then validation, with the
/// provenance sidecar `mass why` reads; `None` when nothing was selected.
fn dataset(
    o: &mut Objects,
    plan: &Plan,
    collected: &HashMap<String, Imported>,
    chosen: &HashMap<String, (Id, Id)>,
    selections: Vec<Id>,
) -> Result<Option<Id>> {
    if plan.train.is_empty() && plan.validation.is_empty() {
        return Ok(None);
    }
    let mut files = [String::new(), String::new()];
    let mut counts = [0u32; 2];
    let mut provenance = String::new();
    for (i, (names, file)) in [(&plan.train, "train"), (&plan.validation, "validation")]
        .into_iter()
        .enumerate()
    {
        for name in names {
            let (Some(imp), Some(&(sel, rank))) = (collected.get(name), chosen.get(name)) else {
                continue;
            };
            for (n, (messages, head)) in imp.conversations.iter().enumerate() {
                files[i].push_str(&json!({"messages": messages}).to_string());
                files[i].push('\n');
                counts[i] += 1;
                let p = json!({"file": file, "line": counts[i], "rollout": imp.rollout.to_hex(), "conversation": format!("{}#{n}", imp.rollout.short(16)), "agent": if n == 0 { "orchestrator" } else { "subagent" }, "stream_head": head.to_hex(), "selection": sel.to_hex(), "ranking": rank.to_hex()});
                provenance.push_str(&p.to_string());
                provenance.push('\n');
            }
        }
    }
    let train = o.blob(files[0].as_bytes());
    let validation = o.blob(files[1].as_bytes());
    let prov = o.blob(provenance.as_bytes());
    // Supervised tokens need the trainer's tokenizer, which the run
    // folder does not hold: 0, and SCHEMAS/ARCHITECTURE say so.
    let d = Dataset {
        cycle: plan.cycle,
        format: "openai".into(),
        train: id32(train),
        validation: id32(validation),
        train_examples: counts[0],
        validation_examples: counts[1],
        train_supervised_tokens: 0,
        validation_supervised_tokens: 0,
        selections: selections.into_iter().map(id32).collect(),
        provenance: id32(prov),
    };
    let missing = ["train_supervised_tokens", "validation_supervised_tokens"];
    let at = When::Mtime(plan.selection_mtime);
    Ok(Some(o.partial(MAIN, &d, Vec::new(), at, &missing)?))
}

fn opt_f64(v: &Value, keys: &[&str]) -> Option<f64> {
    keys.iter()
        .find_map(|k| v.get(*k)?.as_f64())
        .filter(|x| x.is_finite())
}

/// The trainer's metrics lines as `mass.train_step` on the cycle's
/// `train` stream, and the chosen checkpoint as `mass.training` (only
/// when `selected_checkpoint.json` exists: the reference writes it after
/// training ran to its end).
fn training(
    o: &mut Objects,
    plan: &Plan,
    cfg: &Value,
    model: &str,
    dataset: Id,
) -> Result<Option<String>> {
    let (Some(sel), Some((rows, mtime))) = (&plan.selected, &plan.train_log) else {
        return Ok(None);
    };
    let s = &plan.scrub;
    let rel = format!("c{}/train", plan.cycle);
    let mut log = String::new();
    let mut steps = 0u32;
    let mut base = None;
    for row in rows {
        let v = s.json(&row.value);
        let line = v.to_string();
        log.push_str(&line);
        log.push('\n');
        let Some(step) = v.get("step").and_then(Value::as_u64) else {
            continue;
        };
        let val = opt_f64(&v, &["val_loss"]);
        if step == 0 {
            // `--val-at-start`: the base model's loss on the same lines.
            base = base.or(val);
        }
        let t = TrainStep {
            cycle: plan.cycle,
            step,
            epoch: opt_f64(&v, &["epoch"]),
            train_loss: opt_f64(&v, &["train_loss", "loss"]),
            validation_loss: val,
            learning_rate: opt_f64(&v, &["lr", "learning_rate"]),
            tokens: v.get("tokens").and_then(Value::as_u64),
            checkpoint: if val.is_some() && step > 0 {
                format!("step_{step:05}")
            } else {
                String::new()
            },
            line,
        };
        o.record(&rel, &t, Vec::new(), When::Mtime(*mtime))?;
        steps += 1;
    }
    let sv = s.json(&sel.value);
    let checkpoint = cfg_str(&sv, "checkpoint")
        .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
        .unwrap_or_default();
    let new_model = ["next_fp8", "next_bf16"]
        .iter()
        .find_map(|k| cfg_str(cfg, k))
        .map(|p| {
            p.trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or(p)
                .to_string()
        })
        .unwrap_or_else(|| format!("{model} after cycle {}", plan.cycle));
    let log = o.blob(log.as_bytes());
    let hyper = o.json(cfg.get("training").unwrap_or(&json!({})));
    let t = Training {
        cycle: plan.cycle,
        dataset: id32(dataset),
        base_model: model.into(),
        new_model: new_model.clone(),
        command: "reference: training/train_sft_lora.py (command not recorded in the run folder)"
            .into(),
        exit_status: 0,
        output: ABSENT,
        log: id32(log),
        checkpoint,
        validation_loss: opt_f64(&sv, &["val_loss"]).unwrap_or(f64::NAN),
        base_validation_loss: base,
        effect: ABSENT,
        hyperparameters: id32(hyper),
        checkpoint_reason: cfg_str(&sv, "criterion").unwrap_or("").into(),
        adapter: ABSENT,
        trainer_version: String::new(),
        steps,
    };
    let parents: Vec<Id> = o.head(&rel).into_iter().collect();
    let at = When::Mtime(sel.mtime_ms);
    o.partial(MAIN, &t, parents, at, &["exit_status"])?;
    Ok(Some(new_model))
}
