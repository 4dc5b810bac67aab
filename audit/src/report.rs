//! `mass report RUN`: per cycle, what the run's records say about its
//! search, its judges and its cost. Figures come from the records only:
//! the cycle and evaluation records (`status::CycleFigures`, plus a
//! percentile-bootstrap interval beside each Wilson interval), the
//! promotions of each task's inner loop (accepted or not, and how many
//! lines of the workflow the candidate changed), the selections (guard
//! exclusions by reason), the usage every recorded model call returned
//! (tokens per stage, by the stream the call was made in), and the wall
//! clock of the main stream's milestones (time per stage; a resumed run's
//! downtime counts in the stage it interrupted). Like `diff`, this reads
//! every event of the run once.

use std::collections::BTreeMap;

use ledger::{Event, Id, Ledger};
use schemas::{
    Decodable, Promotion, ProposalRecord, Rollout, RunStarted, Selection, TrainStep, Training,
};
use serde::Serialize;

pub use super::facts::Mode;
use super::facts::{Facts, KeptFile, Projection};
use super::{decode, id_of};
use engine::error::{EngineError, Result};
use engine::status::CycleFigures;

/// Resamples of each bootstrap interval, and its seed (fixed: a report is
/// reproducible).
const RESAMPLES: usize = 2000;
const SEED: u64 = 0x6d61_7373;

/// The stages a cycle's cost is split into: every stage of a cycle, by the
/// names `engine::milestone::Stage` gives them.
pub const STAGES: [&str; 8] = [
    "search", "collect", "judge", "rank", "select", "dataset", "train", "evaluate",
];

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub run: String,
    pub cycles: Vec<CycleReport>,
    /// Per served model, over the whole run: live calls whose prompt the
    /// trainer's side counted (`serve.prompt_tokens_command`), and how many
    /// of those counts equal the server's `usage.prompt_tokens`. Empty
    /// when no backend counts.
    pub template_parity: BTreeMap<String, Parity>,
}

/// Template parity of one model's calls (engine::backend::parity).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Parity {
    /// Live calls counted on the trainer's side (failed counts included).
    pub calls: u32,
    /// Of those, calls whose two counts are equal.
    pub equal: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct CycleReport {
    pub figures: CycleFigures,
    /// Percentile-bootstrap 95% interval of each evaluation's pair-majority
    /// win rate (`win_rate`, over pairs; not the judgments' headline
    /// `judgment_win_rate`), in the order of `figures.evaluations` (null
    /// when every pair tied).
    pub bootstrap: Vec<Option<[f64; 2]>>,
    pub inner: Vec<InnerTask>,
    pub stages: Vec<StageCost>,
    /// Runs left out of ranking or training data, by reason.
    pub exclusions: BTreeMap<String, u32>,
    /// Each run left out, with its task and reason, in selection order.
    pub excluded_runs: Vec<ExcludedRun>,
    /// Tasks whose selection holds fewer runs than wanted, and why.
    pub shortfalls: Vec<Shortfall>,
    /// Per task, the Bradley-Terry score of every ranked collected run.
    pub scores: Vec<TaskScores>,
    /// The trainer's recorded metrics (`mass.train_step`), in step order.
    pub loss: Vec<LossPoint>,
    /// The cycle's `mass.training` record: the model it made and whether
    /// it learnt (the chosen checkpoint's validation loss against the
    /// base model's on the same lines); null when the cycle trained
    /// nothing.
    pub training: Option<TrainedModel>,
    /// Per task, how the outer loop's verdicts split by the position the
    /// winner was shown in (position bias of the judge stage).
    pub position: Vec<TaskPosition>,
    /// Inner-loop iterations whose optimizer gave no usable proposal (every
    /// attempt malformed or changing nothing), so no candidate ran.
    pub failed_proposals: Vec<FailedProposal>,
    /// The cycle's share of the run's `template_parity`, per model.
    pub template_parity: BTreeMap<String, Parity>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailedProposal {
    pub task: String,
    pub iteration: u32,
    pub attempts: u32,
    /// The last attempt's error, as the optimizer was told.
    pub error: String,
}

/// The outer loop's verdicts on one task by presentation order: a judge
/// without position bias gives the run shown first about half the
/// decisive verdicts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TaskPosition {
    pub task: String,
    /// Valid verdicts (invalid ones are left out).
    pub verdicts: u32,
    /// Verdicts won by the run shown as Workspace A.
    pub first_shown: u32,
    /// Verdicts won by the run shown as Workspace B.
    pub second_shown: u32,
    pub ties: u32,
    /// Verdicts given with the pair's runs shown swapped.
    pub swapped: u32,
}

/// One run a selection left out.
#[derive(Debug, Clone, Serialize)]
pub struct ExcludedRun {
    pub task: String,
    /// The run's `mass.rollout` event (empty when a recorded line names no
    /// run), and its collection index when known.
    pub rollout: String,
    pub index: Option<u32>,
    pub reason: String,
}

/// A task's selection with fewer runs than the experiment wanted.
#[derive(Debug, Clone, Serialize)]
pub struct Shortfall {
    pub task: String,
    pub train: u32,
    pub wanted_train: u32,
    pub validation: u32,
    pub wanted_validation: u32,
    pub why: String,
}

/// What a cycle's training made, from its `mass.training` record.
#[derive(Debug, Clone, Serialize)]
pub struct TrainedModel {
    pub event: String,
    pub base_model: String,
    pub new_model: String,
    pub checkpoint: String,
    /// The chosen checkpoint's loss on the held-out validation lines.
    pub validation_loss: f64,
    /// The base model's loss on the same lines, when the trainer measured
    /// it (as `mass.training` v3 defines it; null otherwise, and for
    /// records older than v3).
    pub base_validation_loss: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LossPoint {
    pub step: u64,
    pub train_loss: Option<f64>,
    pub validation_loss: Option<f64>,
    /// The checkpoint a validation line evaluated, or empty.
    pub checkpoint: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct TaskScores {
    pub task: String,
    pub runs: Vec<ScoredRun>,
    /// The self-judge's ranking against the external verifier (the hidden
    /// checks, which the judge never saw): of the pairs of ranked runs
    /// whose check scores differ, how many the Bradley-Terry scores order
    /// the same way.
    pub check_agreement: CheckAgreement,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CheckAgreement {
    pub agree: u32,
    pub compared: u32,
}

impl CheckAgreement {
    /// Counts, over every pair of runs, whether score and check share
    /// (passed / total) order them alike; pairs with equal check shares
    /// or equal scores are not compared.
    fn of(runs: &[ScoredRun]) -> CheckAgreement {
        // A run whose checks gave no score, or were not recorded (an
        // imported run), is not compared (not the worst).
        let shares: Vec<(f64, &ScoredRun)> = runs
            .iter()
            .filter_map(|r| match (r.checks_passed, r.checks_total) {
                (Some(p), Some(t)) if t > 0 => Some((f64::from(p) / f64::from(t), r)),
                _ => None,
            })
            .collect();
        let mut c = CheckAgreement::default();
        for (i, (sa, a)) in shares.iter().enumerate() {
            for (sb, b) in &shares[i + 1..] {
                let (da, ds) = (sa - sb, a.score - b.score);
                if da == 0.0 || ds == 0.0 {
                    continue;
                }
                c.compared += 1;
                c.agree += u32::from((da > 0.0) == (ds > 0.0));
            }
        }
        c
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ScoredRun {
    pub rollout: String,
    pub index: u32,
    pub score: f64,
    pub rank: Option<u32>,
    /// The hidden checks' result (the external verifier); `None`: not
    /// recorded (`ledger::NOT_RECORDED`, an imported run).
    pub checks_passed: Option<u32>,
    pub checks_total: Option<u32>,
    /// `train`, `validation`, `not selected` (ranked below the runs
    /// taken) or `excluded` (see the cycle's `excluded_runs`).
    pub selection: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct InnerTask {
    pub task: String,
    pub iterations: Vec<Iteration>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Iteration {
    pub iteration: u32,
    pub accepted: bool,
    pub beat_reference: bool,
    /// Lines of the workflow (pretty JSON) the candidate added or removed
    /// against the champion it challenged.
    pub edit_lines: u32,
    pub reason: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct StageCost {
    pub stage: String,
    pub model_calls: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `None` (JSON `null`) when a span of the stage starts or ends at a
    /// step whose time is a stand-in (`ledger::WALL_MS_FROM`: an imported
    /// run's file mtimes), or when no step closed the stage; never a
    /// guessed duration.
    pub wall_seconds: Option<f64>,
    /// No step of the run closed the stage, and the run was recorded by
    /// an engine, which closes every stage it runs (one it skips, with a
    /// note): the stage did not run, because the run ended before it (a
    /// re-judge that stops at the dataset) or has not reached it yet. An
    /// imported run's unclosed stage is not that (its folder may just lack
    /// the stage's files): its time is unknown.
    pub not_run: bool,
}

/// The cycle and stage a stream's model calls count toward, from its name
/// (relative to the run): `c1/TASK/collect/...` is cycle 1's collect stage.
pub fn stage_of(stream: &str) -> Option<(u32, &'static str)> {
    let mut parts = stream.split('/');
    let cycle: u32 = parts.next()?.strip_prefix('c')?.parse().ok()?;
    let second = parts.next()?;
    if second == "eval" {
        return Some((cycle, "evaluate"));
    }
    if second == "train" {
        return Some((cycle, "train"));
    }
    let stage = match parts.next()? {
        "reference" | "inner" => "search",
        "collect" => "collect",
        "pair" => "judge",
        _ => return None,
    };
    Some((cycle, stage))
}

fn workflow_lines(l: &Ledger, rollout: Id) -> Result<Vec<String>> {
    let r: Rollout = decode(&l.get_event(&rollout)?)?;
    let v: serde_json::Value = serde_json::from_slice(&l.get_blob(&id_of(r.workflow))?)
        .map_err(|e| EngineError::recording("workflow", e))?;
    let text =
        serde_json::to_string_pretty(&v).map_err(|e| EngineError::recording("workflow", e))?;
    Ok(text.lines().map(str::to_string).collect())
}

/// Each cycle's `mass.training` record (on the main stream), as the model
/// it made and its validation loss against the base model's.
fn trainings(main: &[Event], cycles: &mut BTreeMap<u32, CycleReport>) -> Result<()> {
    for ev in main {
        let Some(t) = Training::read(ev) else {
            continue;
        };
        let t = t.map_err(|e| EngineError::recording("mass.training", e))?;
        if let Some(c) = cycles.get_mut(&t.cycle) {
            c.training = Some(TrainedModel {
                event: ev.id.to_hex(),
                base_model: t.base_model,
                new_model: t.new_model,
                checkpoint: t.checkpoint,
                validation_loss: t.validation_loss,
                base_validation_loss: t.base_validation_loss,
            });
        }
    }
    Ok(())
}

/// Lines in one list and not the other, counted with multiplicity.
fn changed_lines(a: &[String], b: &[String]) -> u32 {
    let mut count: BTreeMap<&str, i64> = BTreeMap::new();
    for x in a {
        *count.entry(x).or_default() += 1;
    }
    for x in b {
        *count.entry(x).or_default() -= 1;
    }
    count.values().map(|c| c.unsigned_abs() as u32).sum()
}

pub fn report(l: &Ledger, run: &str) -> Result<Report> {
    report_with(l, run, Mode::Off)
}

/// Brings run `run`'s kept stream facts (the report projection) up to its
/// current heads, folding only the streams that moved, without computing
/// a report: what a command that ends a run does, so the run's first
/// report reads them.
pub fn keep_facts(l: &Ledger, run: &str) -> Result<()> {
    let file = KeptFile::read(l, run, Mode::Kept);
    let kept = file.as_ref().and_then(|f| f.entries()).unwrap_or_default();
    let mut projection = Projection::open(l, run, Mode::Kept, kept);
    projection.run_streams(l, run)?;
    projection.close();
    Ok(())
}

/// Removes the report facts a removed run kept (`facts::forget`).
pub fn forget_facts(l: &Ledger, run: &str) -> std::io::Result<()> {
    super::facts::forget(l, run)
}

/// [`report`], reading and keeping the run's stream facts as `mode` says
/// (the report projection, `facts`).
pub fn report_with(l: &Ledger, run: &str, mode: Mode) -> Result<Report> {
    let head = l
        .head(run)?
        .ok_or_else(|| EngineError::Invalid(format!("no run named {run:?}")))?;
    let mut main: Vec<Event> = l.chain(head).collect::<std::result::Result<_, _>>()?;
    main.reverse();
    let status = engine::status::fold_read(l, &main)?;
    let mut cycles: BTreeMap<u32, CycleReport> = status
        .cycles
        .into_iter()
        .map(|f| (f.cycle, cycle_report(f)))
        .collect();
    walltimes(l, &main, &mut cycles)?;
    trainings(&main, &mut cycles)?;
    let file = KeptFile::read(l, run, mode);
    let kept = file.as_ref().and_then(|f| f.entries()).unwrap_or_default();
    let mut projection = Projection::open(l, run, mode, kept);
    let streams = projection.run_streams(l, run)?;
    bt_scores(l, run, projection.used(), &mut cycles)?;
    exclusions(l, &main, &mut cycles)?;
    for ((rel, h), (_, facts)) in streams.iter().zip(projection.used()) {
        let rel = rel.as_str();
        let Some((cycle, stage)) = stage_of(rel) else {
            continue;
        };
        let Some(c) = cycles.get_mut(&cycle) else {
            continue;
        };
        add_facts(facts, stage, c);
        stream_extras(l, rel, stage, *h, c)?;
    }
    projection.close();
    for c in cycles.values_mut() {
        c.inner.sort_by(|a, b| a.task.cmp(&b.task));
        c.position.sort_by(|a, b| a.task.cmp(&b.task));
        c.failed_proposals
            .sort_by(|a, b| (&a.task, a.iteration).cmp(&(&b.task, b.iteration)));
        // The stream was walked from its head: back to log order, then by
        // step (stable, so a step's training line stays before its
        // checkpoint's).
        c.loss.reverse();
        c.loss.sort_by_key(|p| p.step);
    }
    let mut template_parity: BTreeMap<String, Parity> = BTreeMap::new();
    for (model, p) in cycles.values().flat_map(|c| &c.template_parity) {
        let t = template_parity.entry(model.clone()).or_default();
        t.calls += p.calls;
        t.equal += p.equal;
    }
    Ok(Report {
        run: run.into(),
        cycles: cycles.into_values().collect(),
        template_parity,
    })
}

/// A cycle's report from its recorded figures (with a bootstrap interval
/// beside each evaluation's), the rest still empty.
fn cycle_report(f: CycleFigures) -> CycleReport {
    let bootstrap = f
        .evaluations
        .iter()
        .map(|e| {
            rank::winrate::WinRate::new(e.wins as u64, e.losses as u64, e.ties as u64)
                .bootstrap95(RESAMPLES, SEED)
                .ok()
                .map(|i| [i.lower, i.upper])
        })
        .collect();
    CycleReport {
        figures: f,
        bootstrap,
        inner: Vec::new(),
        stages: STAGES
            .iter()
            .map(|s| StageCost {
                stage: s.to_string(),
                ..StageCost::default()
            })
            .collect(),
        exclusions: BTreeMap::new(),
        excluded_runs: Vec::new(),
        shortfalls: Vec::new(),
        scores: Vec::new(),
        loss: Vec::new(),
        training: None,
        position: Vec::new(),
        failed_proposals: Vec::new(),
        template_parity: BTreeMap::new(),
    }
}

/// The selections' exclusions on the main stream: counted by reason, and
/// each with its run; the selections that hold fewer runs than wanted.
fn exclusions(l: &Ledger, main: &[Event], cycles: &mut BTreeMap<u32, CycleReport>) -> Result<()> {
    for ev in main {
        let Some(s) = Selection::read(ev) else {
            continue;
        };
        let s = s.map_err(|e| EngineError::recording("mass.selection", e))?;
        let Some(c) = cycles.get_mut(&s.cycle) else {
            continue;
        };
        for line in &s.excluded {
            for reason in engine::status::exclusion_reasons(line) {
                *c.exclusions.entry(reason).or_default() += 1;
            }
        }
        for x in &s.exclusions {
            for reason in engine::status::exclusion_reasons(&format!("run: {}", x.reason)) {
                *c.exclusions.entry(reason).or_default() += 1;
            }
        }
        for (run, reason) in super::selection_exclusions(l, &s)? {
            let index = match run {
                Some(id) => Some(decode::<Rollout>(&l.get_event(&id)?)?.index),
                None => None,
            };
            c.excluded_runs.push(ExcludedRun {
                task: s.task.clone(),
                rollout: run.map(|id| id.to_hex()).unwrap_or_default(),
                index,
                reason,
            });
        }
        if !s.shortfall.is_empty() {
            c.shortfalls.push(Shortfall {
                task: s.task.clone(),
                train: s.train.len() as u32,
                wanted_train: s.wanted_train,
                validation: s.validation.len() as u32,
                wanted_validation: s.wanted_validation,
                why: s.shortfall.clone(),
            });
        }
    }
    Ok(())
}

/// What one stream's facts (`rel`, counted toward `stage`) add to its
/// cycle: its model calls' usage and template parity, and its verdicts by
/// the position their winner was shown in (judge streams).
fn add_facts(f: &Facts<'_>, stage: &str, c: &mut CycleReport) {
    if let Some(s) = c.stages.iter_mut().find(|s| s.stage == stage) {
        let (prompt, completion) = f.tokens();
        s.model_calls += f.calls();
        s.prompt_tokens += prompt;
        s.completion_tokens += completion;
    }
    f.each_parity(|model, calls, equal| {
        let t = c.template_parity.entry(model.to_string()).or_default();
        t.calls += calls;
        t.equal += equal;
    });
    if stage == "judge" {
        f.each_verdict(|task, winner, swapped| count_position(task, winner, swapped, c));
    }
}

/// What a train, inner-loop decisions or optimizer stream adds beyond its
/// facts: the trainer's metrics, the promotions, the failed proposals.
/// Other streams are not read again.
fn stream_extras(l: &Ledger, rel: &str, stage: &str, h: Id, c: &mut CycleReport) -> Result<()> {
    let is_decisions = rel.ends_with("/inner") && rel.matches('/').count() == 2;
    let is_optimizer = rel.ends_with("/optimizer");
    if !(stage == "train" || is_decisions || is_optimizer) {
        return Ok(());
    }
    let mut promotions = Vec::new();
    let mut proposals = Vec::new();
    for ev in l.chain(h) {
        let ev = ev?;
        if stage == "train" && ev.kind == <TrainStep as Decodable>::KIND {
            let t: TrainStep = decode(&ev)?;
            // The starting model's loss, measured before the first step,
            // starts the validation curve at step 0.
            let validation_loss = t
                .validation_loss
                .or_else(|| engine::trainer::base_validation_loss(&t.line));
            c.loss.push(LossPoint {
                step: t.step,
                train_loss: t.train_loss,
                validation_loss,
                checkpoint: t.checkpoint,
            });
        }
        if is_decisions && ev.kind == <Promotion as Decodable>::KIND {
            promotions.push(decode::<Promotion>(&ev)?);
        }
        if is_optimizer && ev.kind == <ProposalRecord as Decodable>::KIND {
            proposals.push(decode::<ProposalRecord>(&ev)?);
        }
    }
    if let (false, Some(last)) = (proposals.iter().any(|p| p.valid), proposals.first()) {
        // Walked from the head: the first is the last attempt.
        c.failed_proposals.push(FailedProposal {
            task: last.task.clone(),
            iteration: last.iteration,
            attempts: proposals.len() as u32,
            error: last.error.clone(),
        });
    }
    if is_decisions {
        promotions.reverse();
        let task = rel.split('/').nth(1).unwrap_or_default().to_string();
        c.inner.push(inner_task(l, task, promotions)?);
    }
    Ok(())
}

/// Counts an outer-loop verdict by the position its winner was shown in.
/// `c.position` is kept sorted by task and searched by halves: a scan per
/// verdict made a run's report quadratic in its tasks (verdicts x tasks
/// string comparisons, the bulk of a 1M-event report).
fn count_position(task: &str, winner: &str, swapped: bool, c: &mut CycleReport) {
    let i = match c.position.binary_search_by(|t| t.task.as_str().cmp(task)) {
        Ok(i) => i,
        Err(i) => {
            c.position.insert(
                i,
                TaskPosition {
                    task: task.to_string(),
                    ..TaskPosition::default()
                },
            );
            i
        }
    };
    let t = &mut c.position[i];
    // `winner` names the run (`a` or `b` of the record); shown swapped,
    // run `b` was Workspace A.
    match (winner, swapped) {
        ("a", false) | ("b", true) => t.first_shown += 1,
        ("a", true) | ("b", false) => t.second_shown += 1,
        ("tie", _) => t.ties += 1,
        _ => return,
    }
    t.verdicts += 1;
    t.swapped += u32::from(swapped);
}

/// What the report reads of a model call's output: the usage, and the
/// trainer's count of the prompt when there is one. Numbers that are not
/// unsigned integers (and names that are not strings) count as absent.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct OutputFigures {
    pub(crate) prompt_tokens: Option<u64>,
    pub(crate) completion_tokens: Option<u64>,
    pub(crate) trainer_model: Option<String>,
    pub(crate) trainer_prompt_tokens: Option<u64>,
}

impl OutputFigures {
    /// Parsed into the engine's output shape when it is one (no JSON tree
    /// built: this runs for every model call of a run), else read from
    /// the JSON tree, as leniently as before.
    pub(crate) fn of(bytes: &[u8]) -> Result<OutputFigures> {
        #[derive(serde::Deserialize)]
        struct Usage {
            prompt_tokens: u64,
            completion_tokens: u64,
        }
        #[derive(serde::Deserialize)]
        struct Trainer {
            model: String,
            prompt_tokens: Option<u64>,
        }
        #[derive(serde::Deserialize)]
        struct Shape {
            usage: Usage,
            trainer_tokens: Option<Trainer>,
        }
        if let Ok(o) = serde_json::from_slice::<Shape>(bytes) {
            return Ok(OutputFigures {
                prompt_tokens: Some(o.usage.prompt_tokens),
                completion_tokens: Some(o.usage.completion_tokens),
                trainer_prompt_tokens: o.trainer_tokens.as_ref().and_then(|t| t.prompt_tokens),
                trainer_model: o.trainer_tokens.map(|t| t.model),
            });
        }
        Self::of_tree(bytes)
    }

    /// From the JSON tree: the reading before the typed one (the oracle
    /// its test compares with).
    fn of_tree(bytes: &[u8]) -> Result<OutputFigures> {
        let out: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|x| EngineError::recording("model output", x))?;
        let t = &out["trainer_tokens"];
        Ok(OutputFigures {
            prompt_tokens: out["usage"]["prompt_tokens"].as_u64(),
            completion_tokens: out["usage"]["completion_tokens"].as_u64(),
            trainer_model: t["model"].as_str().map(str::to_string),
            trainer_prompt_tokens: t["prompt_tokens"].as_u64(),
        })
    }
}

/// A task's inner-loop steps, in log order, each with the size of the edit
/// its candidate made to the champion it challenged.
fn inner_task(l: &Ledger, task: String, promotions: Vec<Promotion>) -> Result<InnerTask> {
    let mut iterations = Vec::new();
    for p in promotions {
        let edit = changed_lines(
            &workflow_lines(l, id_of(p.candidate))?,
            &workflow_lines(l, id_of(p.champion))?,
        );
        iterations.push(Iteration {
            iteration: p.iteration,
            accepted: p.accepted,
            beat_reference: p.beat_reference,
            edit_lines: edit,
            reason: p.reason,
        });
    }
    Ok(InnerTask { task, iterations })
}

/// The Bradley-Terry score of every ranked collected run, per cycle and
/// task, sorted by rank.
fn bt_scores(
    l: &Ledger,
    run: &str,
    streams: &[(Id, Facts<'_>)],
    cycles: &mut BTreeMap<u32, CycleReport>,
) -> Result<()> {
    let mut heads = Vec::new();
    for (id, f) in streams {
        if let Some(r) = f.rollout()? {
            heads.push((*id, r));
        }
    }
    for r in super::rollouts_of(l, run, heads.iter().map(|(id, r)| (*id, r)))? {
        let (Some(score), Some(c)) = (r.score, cycles.get_mut(&r.cycle)) else {
            continue;
        };
        let scored = ScoredRun {
            rollout: r.event,
            index: r.index,
            score,
            rank: r.rank,
            checks_passed: r.checks_passed,
            checks_total: r.checks_total,
            selection: r.selection.unwrap_or_else(|| "not selected".into()),
        };
        // Kept sorted by task and searched by halves (as `count_position`).
        match c.scores.binary_search_by(|t| t.task.as_str().cmp(&r.task)) {
            Ok(i) => c.scores[i].runs.push(scored),
            Err(i) => c.scores.insert(
                i,
                TaskScores {
                    task: r.task,
                    runs: vec![scored],
                    check_agreement: CheckAgreement::default(),
                },
            ),
        }
    }
    for c in cycles.values_mut() {
        c.scores.sort_by(|a, b| a.task.cmp(&b.task));
        for t in &mut c.scores {
            t.check_agreement = CheckAgreement::of(&t.runs);
            t.runs
                .sort_by_key(|r| (r.rank.unwrap_or(u32::MAX), r.index));
        }
    }
    Ok(())
}

/// Time per stage from the main stream's milestones
/// (`engine::milestone::closes`): each step a stage records ends a span of
/// that stage's time, which starts where the previous step ended.
fn walltimes(l: &Ledger, main: &[Event], cycles: &mut BTreeMap<u32, CycleReport>) -> Result<()> {
    let engine_from = engine_made_from(main);
    for (cycle, c) in cycles.iter_mut() {
        for (i, s) in c.stages.iter_mut().enumerate() {
            s.wall_seconds = None;
            s.not_run = engine_from.is_some_and(|from| (*cycle, i) > from);
        }
    }
    for ((cycle, stage), seconds) in stage_seconds(l, main)? {
        if let Some(c) = cycles.get_mut(&cycle) {
            if let Some(s) = c.stages.iter_mut().find(|s| s.stage == stage) {
                s.wall_seconds = seconds;
                s.not_run = false;
            }
        }
    }
    Ok(())
}

/// From where on the run whose main stream is `main` was recorded by an
/// engine, as the (cycle, index in [`STAGES`]) after which every stage is
/// the engine's: all of it (`(0, 0)`, before any stage) unless it was
/// imported; for a re-judge of an imported run, the stages after the step
/// it forked at; `None` for an imported run itself. A stage the engine's
/// part of a run did not close did not run (see [`StageCost::not_run`]).
fn engine_made_from(main: &[Event]) -> Option<(u32, usize)> {
    if !imported(main) {
        return Some((0, 0));
    }
    let fork = main.iter().position(|e| e.kind == "run.forked")?;
    let at = main[..fork]
        .iter()
        .rev()
        .find_map(engine::milestone::closes)?;
    let index = STAGES.iter().position(|s| *s == at.1.name())?;
    Some((at.0, index))
}

/// Whether the run whose main stream is `main` was imported (driver
/// `sakana-import/`; a re-judge of one shares its start). Such a folder
/// records only the steps whose files it holds, so a stage no step closed
/// may still have run: without `selected_checkpoint.json` it says neither
/// that the reference did not train nor how long it took. A run an engine
/// recorded closes every stage it runs (one it skips with a note: `no
/// training data`, `dataset recorded, not trained`).
fn imported(main: &[Event]) -> bool {
    main.iter()
        .find(|e| e.kind == <RunStarted as schemas::Record>::KIND)
        .filter(|e| e.version == <RunStarted as schemas::Record>::VERSION)
        .and_then(|e| schemas::decode_event::<RunStarted>(e).ok())
        .is_some_and(|r| r.driver.starts_with("sakana-import/"))
}

/// Seconds per (cycle, stage) of a run's main stream `main` (in log
/// order), as `mass report` counts them: each step a stage records ends a
/// span of that stage's time, which starts where the previous step ended.
/// A stage no step closed has no entry (the cycle's own record closes the
/// evaluate stage only after an evaluation did).
/// A stage is `None` when one of its spans starts or ends at a step whose
/// time is a stand-in (`Meta::known_wall_ms`): its total is not known.
pub fn stage_seconds(
    l: &Ledger,
    main: &[Event],
) -> Result<BTreeMap<(u32, &'static str), Option<f64>>> {
    let mut out = BTreeMap::new();
    // The previous step's time (`None` inside: a stand-in), once seen.
    let mut last: Option<Option<u64>> = None;
    for ev in main {
        let ms = l.get_meta(&ev.id)?.known_wall_ms();
        let from = *last.get_or_insert(ms);
        // A fork or re-judge continues from here: the time since its
        // source's step belongs to no stage.
        if ev.kind == "run.forked" || ev.kind == "run.mixed" {
            last = Some(ms);
            continue;
        }
        let Some((cycle, stage)) = engine::milestone::closes(ev) else {
            continue;
        };
        // The cycle's record closes the evaluate stage's last span, but
        // alone it is no evaluation: a cycle that evaluated nothing (a
        // re-judge's, which stops at the selections) leaves the stage
        // unclosed, not 0 s long.
        if ev.kind == <schemas::Cycle as schemas::Record>::KIND
            && !out.contains_key(&(cycle, stage.name()))
        {
            last = Some(ms);
            continue;
        }
        let span = from
            .zip(ms)
            .map(|(a, b)| b.saturating_sub(a) as f64 / 1000.0);
        let total = out.entry((cycle, stage.name())).or_insert(Some(0.0));
        *total = total.zip(span).map(|(t, s)| t + s);
        last = Some(ms);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::OutputFigures;

    /// Verdicts counted per task in any order of tasks give the counts an
    /// oracle map gives, in task order (the sorted vector searched by
    /// halves that replaced a scan per verdict).
    #[test]
    fn positions_are_counted_per_task_in_any_order() {
        use std::collections::BTreeMap;
        let mut c = super::cycle_report(engine::status::CycleFigures::default());
        let mut oracle: BTreeMap<String, [u32; 4]> = BTreeMap::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let task = format!("t{}", x % 37);
            let winner = ["a", "b", "tie", "bogus"][(x >> 8) as usize % 4];
            let swapped = (x >> 12) & 1 == 1;
            super::count_position(&task, winner, swapped, &mut c);
            let o = oracle.entry(task).or_default();
            match (winner, swapped) {
                ("a", false) | ("b", true) => o[0] += 1,
                ("a", true) | ("b", false) => o[1] += 1,
                ("tie", _) => o[2] += 1,
                _ => continue,
            }
            o[3] += u32::from(swapped);
        }
        let got: Vec<(String, [u32; 4])> = c
            .position
            .iter()
            .map(|t| {
                (
                    t.task.clone(),
                    [t.first_shown, t.second_shown, t.ties, t.swapped],
                )
            })
            .collect();
        assert_eq!(got, oracle.into_iter().collect::<Vec<_>>());
    }

    /// The typed reading gives what the JSON tree gives, on the engine's
    /// own outputs and on every odd shape a damaged or foreign ledger may
    /// hold (it falls back to the tree for those).
    #[test]
    fn output_figures_read_as_the_json_tree_does() {
        let usage = [
            r#""usage":{"prompt_tokens":12,"completion_tokens":3}"#,
            r#""usage":{"prompt_tokens":12}"#,
            r#""usage":{"prompt_tokens":1.5,"completion_tokens":3}"#,
            r#""usage":{"prompt_tokens":-4,"completion_tokens":"3"}"#,
            r#""usage":null"#,
            r#""usage":7"#,
            r#""usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens":9}"#,
            r#""other":1"#,
        ];
        let trainer = [
            "",
            r#","trainer_tokens":null"#,
            r#","trainer_tokens":{"model":"m","prompt_tokens":12}"#,
            r#","trainer_tokens":{"model":"m","prompt_tokens":11}"#,
            r#","trainer_tokens":{"model":"m"}"#,
            r#","trainer_tokens":{"model":5,"prompt_tokens":12}"#,
            r#","trainer_tokens":{"prompt_tokens":12}"#,
            r#","trainer_tokens":{"model":"m","prompt_tokens":-1}"#,
            r#","trainer_tokens":"m""#,
        ];
        let mut n = 0;
        for u in usage {
            for t in trainer {
                for extra in [
                    "",
                    r#","message":{"role":"assistant","content":"hi"},"finish_reason":"stop""#,
                ] {
                    let text = format!("{{{u}{t}{extra}}}");
                    let typed = OutputFigures::of(text.as_bytes()).expect("typed");
                    let tree = OutputFigures::of_tree(text.as_bytes()).expect("tree");
                    assert_eq!(typed, tree, "{text}");
                    n += 1;
                }
            }
        }
        assert_eq!(n, 8 * 9 * 2);
        assert!(OutputFigures::of(b"not json").is_err());
    }
}
