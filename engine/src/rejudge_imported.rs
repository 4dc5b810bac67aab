//! Re-judging one cycle of an imported run (`mass rejudge RUN --cycle C
//! --judge FILE`): another judge, shown each collected run's workspace,
//! judges again the pairs the reference judged, and the cycle's rankings
//! and selections are made again from its verdicts, so what would have
//! entered training under that judge can be compared with what did.
//!
//! What is kept and what is made, given that no engine made the imported
//! run (nothing of it can be replayed or re-run):
//! - **kept**: the collected episodes, as imported, and the reference's own
//!   pairs (the judgments its ranking names, in their order, each as
//!   recorded: `a` shown first). A schedule drawn here, even from the
//!   config's `ranking.seed`, would not be the reference's Python draw.
//! - **the task**: the judge reads the task's statement from the
//!   reference episode's `prompt.txt` (the bare task, recorded in that
//!   rollout's workflow blob); the folder names no deliverables, so the
//!   judge is told none. A task without a reference episode is refused.
//! - **the workspaces**: each run's tree, which is the run folder's at
//!   import (`tree_from`), not a snapshot taken when the episode ended; an
//!   episode without one is refused.
//! - **made again**: one `mass.judgment` per pair on
//!   `c{C}/{task}/pair/{NNN}` (the engine's own streams, recorded through
//!   `engine::judge::judge_pair`, so an interrupted re-judge serves what it
//!   recorded and asks only for the rest), the note closing the judge
//!   stage, per task a `mass.ranking` (Bradley-Terry, the reference's 0.5
//!   virtual wins and losses, at most its 500 iterations; runs the new
//!   verdicts cannot tell apart in collection order, as the rank stage
//!   orders them, never in the reference's rank order) and a
//!   `mass.selection` (ranks 1..`train_ranks` to training, rank
//!   `validation_rank` to validation, as the run's config says; the
//!   source's exclusions of episodes that did not finish), then a note
//!   saying the run ends there: the dataset, training and evaluation are
//!   not redone.
//!
//! The new run forks the imported one at the step that closes its
//! collection (`replay::fork_run`), with the judge's backend (its
//! definition, without the address a machine reaches it at), its name as
//! `roles.judge` and the cycle as the fork's overrides. Running the same
//! command again continues a re-judge that was interrupted (the fork's
//! overrides must match); a run of that name that is anything else is
//! refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{Backend as BackendCfg, OuterConfig, SamplingRoles};
use crate::judge::{judge_pair, Brief, Judge, RunRef, Shown};
use crate::milestone::{last_step, Stage};
use ledger::{Event, Id, Ledger, NewEvent};
use schemas::{
    Cycle, Exclusion, Hash32, Judgment, Note, Ranking, Rollout, RunForked, RunStarted, Selection,
};
use serde_json::Value;

/// The zero id: what the import records for what the folder lacks.
const ABSENT: Hash32 = Hash32([0; 32]);

/// The driver name prefix of an imported run's `run.started`
/// (`import::DRIVER` is `sakana-import/1`; the engine does not depend on
/// the import, as `driver::check_run_start` does not).
pub const IMPORT_DRIVER_PREFIX: &str = "sakana-import/";

/// The reference's Bradley-Terry fit (`mass/ranking.py`): 0.5 virtual wins
/// and losses per run, 500 iterations.
const PRIOR: f64 = 0.5;
const ITERATIONS: usize = 500;

/// Why a re-judge of an imported run could not be made. Nothing is
/// written unless the error comes from the judge or the ledger after the
/// fork (then the run holds what was judged, and the same command
/// continues it).
#[derive(Debug, thiserror::Error)]
pub enum RejudgeError {
    #[error("{0}")]
    Refused(String),
    #[error("run {run} exists and is not this re-judge of {of} ({why}): remove it with `mass runs rm {run}` or choose another --name")]
    NameTaken {
        run: String,
        of: String,
        why: String,
    },
    #[error(transparent)]
    Engine(#[from] crate::error::EngineError),
    #[error(transparent)]
    Replay(#[from] replay::ReplayError),
    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),
    #[error(transparent)]
    Schema(#[from] schemas::SchemaError),
}

type Result<T> = std::result::Result<T, RejudgeError>;

fn refused(why: impl Into<String>) -> RejudgeError {
    RejudgeError::Refused(why.into())
}

/// The judge: a backend defined by a `--judge` file, under its name there.
#[derive(Debug, Clone)]
pub struct JudgeDef {
    pub name: String,
    pub backend: BackendCfg,
}

/// What to re-judge.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub source: &'a str,
    pub name: &'a str,
    pub cycle: u32,
    pub judge: JudgeDef,
}

/// What a re-judge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejudged {
    /// The new run's head.
    pub head: Id,
    pub comparisons: usize,
    /// Verdicts an interrupted attempt had recorded, served, not asked again.
    pub served: u64,
    pub tasks: usize,
}

/// Whether `first` (a run's first event) starts a run this crate imported.
pub fn is_imported(first: &Event) -> bool {
    first.kind == <RunStarted as schemas::Record>::KIND
        && schemas::decode_event::<RunStarted>(first)
            .is_ok_and(|rs| rs.driver.starts_with(IMPORT_DRIVER_PREFIX))
}

/// The command that continues `run` when it is a re-judge of an imported
/// run (its steps, oldest first, start with the imported `run.started` and
/// hold the re-judge's `run.forked`): the same `mass rejudge`, since
/// `mass resume` refuses a run that starts as an imported one. The judge
/// file's path is not recorded, only the backend it defines. `None` for
/// any other run.
pub fn continue_command(steps: &[Event], run: &str) -> Option<String> {
    if !steps.first().is_some_and(is_imported) {
        return None;
    }
    let forked = steps
        .iter()
        .find(|e| e.kind == <RunForked as schemas::Record>::KIND)?;
    let f: RunForked = schemas::decode_event(forked).ok()?;
    let set = |key: &str| {
        f.overrides
            .iter()
            .find(|o| o.key == key)
            .map(|o| o.value.clone())
    };
    let (cycle, judge) = (set("cycles")?, set("roles.judge")?);
    Some(format!(
        "the same `mass rejudge {} --cycle {cycle} --judge FILE --name {run}` again, FILE being the file that defines backend {judge}",
        f.source_run
    ))
}

/// One task of the cycle as the source holds it.
struct TaskPlan {
    task: String,
    /// The reference episode's `prompt.txt`.
    prompt: String,
    /// The runs the source ranked, in collection order (as the engine's
    /// rank stage holds them: runs the new verdicts cannot tell apart keep
    /// that order, never the reference's ranking).
    runs: Vec<RunRef>,
    /// The reference's pairs: indexes into `runs`, `a` shown first.
    pairs: Vec<(usize, usize)>,
    /// The source's exclusions (episodes that did not finish).
    exclusions: Vec<Exclusion>,
}

/// The source's cycle: where to fork, its tasks, and the config's ranks.
struct Source {
    at: Id,
    /// The source's record of the cycle.
    cycle: Cycle,
    tasks: Vec<TaskPlan>,
    train_ranks: u32,
    validation_rank: Option<u32>,
}

/// Re-judges `req.cycle` of the imported run `req.source` as run
/// `req.name`; the judging is reported to `progress` as one stage, once
/// every check has passed.
pub fn rejudge(
    ledger: &Arc<Ledger>,
    req: &Request<'_>,
    progress: &dyn crate::context::Progress,
) -> Result<Rejudged> {
    let src = source(ledger, req.source, req.cycle)?;
    let (judge, limit) = build_judge(&req.judge)?;
    let overrides = overrides(req)?;
    let forked = fork_or_continue(ledger, req, src.at, &overrides)?;
    let session = replay::Session::new(ledger.clone(), req.name, replay::Mode::Live)?;
    // The reference records no root seed (imported as 0, not recorded): the
    // judge's sampling seeds derive from 0, the same on every attempt.
    session.set_seed(0);
    let stage = format!("cycle {}: judging", req.cycle);
    let pairs: usize = src.tasks.iter().map(|t| t.pairs.len()).sum();
    progress.stage(&stage, pairs as u64);
    let judged = judge_all(&session, &src, &judge, req.cycle, limit, || {
        progress.tick(&stage)
    });
    progress.done(&stage);
    let verdicts = judged?;
    let served = session
        .counts()
        .iter()
        .filter(|((kind, how), _)| kind == "judge" && *how != replay::Served::Live)
        .map(|(_, n)| *n)
        .sum();
    let mut w = Steps::after(ledger, req.name, forked)?;
    write_steps(&mut w, &src, req, &verdicts)?;
    if w.pos < w.recorded.len() {
        return Err(RejudgeError::NameTaken {
            run: req.name.to_string(),
            of: req.source.to_string(),
            why: "it holds steps past the ones this re-judge makes".into(),
        });
    }
    Ok(Rejudged {
        head: w.head,
        comparisons: verdicts.iter().map(Vec::len).sum(),
        served,
        tasks: src.tasks.len(),
    })
}

/// Reads the imported run `run`'s cycle `cycle`.
fn source(ledger: &Ledger, run: &str, cycle: u32) -> Result<Source> {
    let head = ledger
        .head(run)?
        .ok_or_else(|| refused(format!("no run named {run:?} (`mass status` lists runs)")))?;
    let mut main = ledger.chain(head).collect::<ledger::Result<Vec<Event>>>()?;
    main.reverse();
    let first = main.first().ok_or_else(|| refused("empty run"))?;
    if !is_imported(first) {
        return Err(refused(format!(
            "run {run} was not imported from a reference run folder"
        )));
    }
    let rs: RunStarted = schemas::decode_event(first)?;
    let config: Value = serde_json::from_slice(&ledger.get_blob(&Id(rs.config.0))?)
        .map_err(|e| refused(format!("run {run}'s recorded config is not JSON ({e})")))?;
    let at = last_step(&main, cycle, Stage::Collect).ok_or_else(|| {
        refused(format!(
            "run {run} holds no collection in cycle {cycle}: nothing to re-judge there (an imported run holds the one cycle of its folder)"
        ))
    })?;
    let mut tasks = Vec::new();
    let mut selections = BTreeMap::new();
    let mut record = None;
    for e in main
        .iter()
        .filter(|e| e.kind == <Cycle as schemas::Record>::KIND)
    {
        let c: Cycle = schemas::decode_event(e)?;
        if c.cycle == cycle {
            record = Some(c);
        }
    }
    let record = record.ok_or_else(|| {
        refused(format!(
            "run {run} holds no record of cycle {cycle} (mass.cycle): it was not imported whole"
        ))
    })?;
    for e in &main {
        if let Some(s) = Selection::read(e) {
            let s = s?;
            if s.cycle == cycle {
                selections.insert(s.task.clone(), s.exclusions);
            }
        }
    }
    for e in main.iter().filter(|e| e.kind == "mass.ranking") {
        let r: Ranking = schemas::decode_event(e)?;
        if r.cycle == cycle {
            let exclusions = selections.remove(&r.task).unwrap_or_default();
            tasks.push(task_plan(ledger, run, cycle, r, exclusions)?);
        }
    }
    if tasks.is_empty() {
        return Err(refused(format!(
            "run {run} ranked no task in cycle {cycle}: the reference judged no pairs to judge again"
        )));
    }
    let col = config.get("collection");
    let rank = |key: &str| {
        col.and_then(|c| c.get(key)?.as_u64())
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
    };
    Ok(Source {
        at,
        cycle: record,
        tasks,
        train_ranks: rank("train_ranks").unwrap_or(0),
        validation_rank: rank("validation_rank"),
    })
}

/// A task's runs, pairs and statement, from its ranking in the source.
fn task_plan(
    ledger: &Ledger,
    run: &str,
    cycle: u32,
    ranking: Ranking,
    exclusions: Vec<Exclusion>,
) -> Result<TaskPlan> {
    let task = ranking.task.clone();
    let mut runs = Vec::new();
    for r in &ranking.runs {
        let event = Id(r.rollout.0);
        let record: Rollout = schemas::decode_event(&ledger.get_event(&event)?)?;
        if record.tree == ABSENT {
            return Err(refused(format!(
                "rollout {event} of task {task} has no workspace recorded (its folder was not in the run folder): the judge would see nothing of it"
            )));
        }
        runs.push(RunRef {
            event,
            record,
            violations: Vec::new(),
        });
    }
    // Bradley-Terry ranks equal scores by item order: in the source's rank
    // order, the reference's verdicts would order what the new judge ties.
    runs.sort_by_key(|r| (r.record.index, r.event.0));
    let index = |h: Hash32| runs.iter().position(|r| r.event.0 == h.0);
    let mut pairs = Vec::new();
    for j in &ranking.judgments {
        let ev = ledger.get_event(&Id(j.0))?;
        let v: Judgment = schemas::decode_event(&ev)?;
        match (index(v.a), index(v.b)) {
            (Some(a), Some(b)) => pairs.push((a, b)),
            _ => {
                return Err(refused(format!(
                    "judgment {} of task {task} names a run its ranking does not",
                    ev.id
                )))
            }
        }
    }
    let prompt = reference_prompt(ledger, run, cycle, &task)?;
    Ok(TaskPlan {
        task,
        prompt,
        runs,
        pairs,
        exclusions,
    })
}

/// The bare task prompt: the `prompt.txt` of the task's reference episode,
/// kept in that rollout's workflow blob.
fn reference_prompt(ledger: &Ledger, run: &str, cycle: u32, task: &str) -> Result<String> {
    let prefix = format!("{run}/c{cycle}/{task}/reference/");
    for (name, head) in ledger.refs_under(&prefix)? {
        if !name.ends_with("/orch") {
            continue;
        }
        let ev = ledger.get_event(&head)?;
        let Ok(r) = schemas::decode_event::<Rollout>(&ev) else {
            continue;
        };
        let wf: Value = serde_json::from_slice(&ledger.get_blob(&Id(r.workflow.0))?)
            .map_err(|e| refused(format!("{name}: its workflow blob is not JSON ({e})")))?;
        if let Some(p) = wf.get("reference_prompt").and_then(Value::as_str) {
            if !p.trim().is_empty() {
                return Ok(p.to_string());
            }
        }
    }
    Err(refused(format!(
        "task {task} has no reference episode with a prompt.txt in run {run}: the run folder holds the task's statement only there, and the judge must be told the task"
    )))
}

/// The judge and how many verdicts to ask for at once.
fn build_judge(def: &JudgeDef) -> Result<(Judge, usize)> {
    let p = match &def.backend {
        BackendCfg::OpenAi(p) => p,
        BackendCfg::Sim(_) => {
            return Err(refused(format!(
                "backend {} is simulated: the simulated judge knows only the tasks of a suite, and an imported run's tasks are in none; give a server backend (kind = \"openai\")",
                def.name
            )))
        }
    };
    if p.serve.is_some() {
        return Err(refused(format!(
            "backend {} has a [serve] table: a re-judge of an imported run starts no server; start it and give its base_url",
            def.name
        )));
    }
    let mut map = BTreeMap::new();
    map.insert(def.name.clone(), def.backend.clone());
    let built = crate::backend::Backends::build(&map, std::path::Path::new(""))
        .map_err(|e| refused(e.to_string()))?;
    let backend = built.get(&def.name).map_err(|e| refused(e.to_string()))?;
    let judge = Judge {
        backend,
        model: p.model.clone(),
        max_retries: OuterConfig::default().max_verdict_retries,
        sampling: SamplingRoles::default().judge,
        shown: Shown::Workspaces,
    };
    Ok((judge, p.max_concurrency.max(1) as usize))
}

/// The fork's overrides: what the re-judge changed, as `mass rejudge`
/// records it for a run of the engine.
fn overrides(req: &Request<'_>) -> Result<Vec<(String, String)>> {
    let def = toml::to_string(&req.judge.backend.definition())
        .map_err(|e| refused(format!("backend {}: {e}", req.judge.name)))?;
    Ok(vec![
        (format!("backends.{}", req.judge.name), def),
        ("roles.judge".into(), req.judge.name.clone()),
        ("cycles".into(), req.cycle.to_string()),
    ])
}

/// Forks the source at `at` as the new run, or finds the fork an earlier,
/// interrupted attempt made; the `run.forked` event.
fn fork_or_continue(
    ledger: &Ledger,
    req: &Request<'_>,
    at: Id,
    overrides: &[(String, String)],
) -> Result<Id> {
    let Some(head) = ledger.head(req.name)? else {
        return Ok(replay::fork_run(
            ledger, req.source, at, req.name, overrides,
        )?);
    };
    let taken = |why: &str| RejudgeError::NameTaken {
        run: req.name.to_string(),
        of: req.source.to_string(),
        why: why.to_string(),
    };
    for e in ledger.chain(head) {
        let e = e?;
        if e.kind != <RunForked as schemas::Record>::KIND {
            continue;
        }
        let f: RunForked = schemas::decode_event(&e)?;
        let same = f.source_run == req.source
            && f.at.0 == at.0
            && f.overrides.len() == overrides.len()
            && f.overrides
                .iter()
                .zip(overrides)
                .all(|(o, (k, v))| o.key == *k && o.value == *v);
        return if same {
            Ok(e.id)
        } else {
            Err(taken(
                "it was forked from another run or point, or with another judge",
            ))
        };
    }
    Err(taken("it is not a fork"))
}

/// Every pair's verdict, judged (or served from an earlier attempt) on its
/// own stream; per task, in pair order: the judgment and its winner.
fn judge_all(
    session: &replay::Session,
    src: &Source,
    judge: &Judge,
    cycle: u32,
    limit: usize,
    tick: impl Fn(),
) -> Result<Vec<Vec<(Id, Judgment)>>> {
    let mut items = Vec::new();
    for (t, plan) in src.tasks.iter().enumerate() {
        for (p, &(a, b)) in plan.pairs.iter().enumerate() {
            items.push((t, p, a, b));
        }
    }
    let shared = Arc::new((session.clone(), judge.clone()));
    let tasks: Arc<Vec<(String, String, Vec<RunRef>)>> = Arc::new(
        src.tasks
            .iter()
            .map(|t| (t.task.clone(), t.prompt.clone(), t.runs.clone()))
            .collect(),
    );
    let done = crate::exec::all(
        limit,
        items,
        |(t, p, a, b)| {
            let (shared, tasks) = (shared.clone(), tasks.clone());
            async move {
                let (session, judge) = (&shared.0, &shared.1);
                let (task, prompt, runs) = &tasks[t];
                let rel = format!("c{cycle}/{task}/pair/{p:03}");
                let brief = Brief {
                    id: task,
                    prompt,
                    deliverables: &[],
                };
                let v = judge_pair(session, &rel, brief, &runs[a], &runs[b], false, judge).await?;
                Ok((t, v))
            }
        },
        tick,
    )?;
    let mut out: Vec<Vec<(Id, Judgment)>> = vec![Vec::new(); src.tasks.len()];
    for (t, v) in done {
        out[t].push(v);
    }
    Ok(out)
}

/// The main-stream steps after the judging, each appended, or found
/// where an interrupted attempt recorded it: the judge stage's closing
/// note, each task's ranking and selection, and the run's last note.
fn write_steps(
    w: &mut Steps<'_>,
    src: &Source,
    req: &Request<'_>,
    verdicts: &[Vec<(Id, Judgment)>],
) -> Result<()> {
    let c = req.cycle;
    let all: Vec<Id> = verdicts.iter().flatten().map(|(id, _)| *id).collect();
    let n = all.len();
    w.step(note(format!("cycle {c}: {n} comparison(s) judged"), all)?)?;
    let mut selected = 0;
    for (plan, mine) in src.tasks.iter().zip(verdicts) {
        let ranking = ranking(plan, c, mine)?;
        let ids: Vec<Id> = mine.iter().map(|(id, _)| *id).collect();
        let rid = w.step(schemas::to_event(&ranking)?.with_parents(ids))?;
        let sel = selection(src, plan, &ranking, rid);
        selected += sel.train.len() + sel.validation.len();
        w.step(schemas::to_event(&sel)?)?;
    }
    w.step(cycle_record(&src.cycle, selected as u32)?)?;
    w.step(note(
        format!(
            "run finished (cycle {c} of imported run {} re-judged by {}; its dataset, training and evaluation are not redone)",
            req.source, req.judge.name
        ),
        Vec::new(),
    )?)?;
    Ok(())
}

/// The new run's main stream past its fork: steps an earlier attempt
/// recorded are checked equal to the ones made now and kept; the rest are
/// appended.
struct Steps<'l> {
    ledger: &'l Ledger,
    run: &'l str,
    head: Id,
    recorded: Vec<Event>,
    pos: usize,
}

impl<'l> Steps<'l> {
    fn after(ledger: &'l Ledger, run: &'l str, forked: Id) -> Result<Steps<'l>> {
        let head = ledger.head(run)?.unwrap_or(forked);
        let mut recorded = Vec::new();
        for e in ledger.chain(head) {
            let e = e?;
            if e.id == forked {
                break;
            }
            recorded.push(e);
        }
        recorded.reverse();
        Ok(Steps {
            ledger,
            run,
            head,
            recorded,
            pos: 0,
        })
    }

    fn step(&mut self, ev: NewEvent) -> Result<Id> {
        if let Some(r) = self.recorded.get(self.pos) {
            self.pos += 1;
            let same = r.kind == ev.kind
                && r.version == ev.version
                && r.payload == ev.payload
                && r.parents == ev.parents;
            if !same {
                return Err(RejudgeError::NameTaken {
                    run: self.run.to_string(),
                    of: "its source".into(),
                    why: format!(
                        "its step {} ({}) is not the one this re-judge makes there",
                        r.id, r.kind
                    ),
                });
            }
            return Ok(r.id);
        }
        let id = self.ledger.append(self.run, Some(self.head), ev)?;
        self.head = id;
        Ok(id)
    }
}

/// The re-judged cycle's record: the source's, with the new selection's
/// size, and nothing trained or evaluated (the next model is the cycle's
/// model; the source's evaluations judged the model trained on the
/// source's selection, so they are not this run's). The source's figures
/// of collection and search are kept; what the import could not count
/// stays listed as not recorded.
fn cycle_record(source: &Cycle, selected: u32) -> Result<NewEvent> {
    let record = Cycle {
        next_model: source.model.clone(),
        selected_runs: selected,
        supervised_tokens: 0,
        tampered_in_training: 0,
        agreement: Vec::new(),
        evaluations: Vec::new(),
        ..source.clone()
    };
    let mut ev = schemas::to_event(&record)?;
    ev.meta.insert(
        ledger::NOT_RECORDED.to_string(),
        "supervised_tokens,tampered_runs,tampered_in_training".into(),
    );
    Ok(ev)
}

fn note(text: String, parents: Vec<Id>) -> Result<NewEvent> {
    Ok(schemas::to_event(&Note { text })?.with_parents(parents))
}

/// Task `plan`'s Bradley-Terry ranking from its new verdicts.
fn ranking(plan: &TaskPlan, cycle: u32, verdicts: &[(Id, Judgment)]) -> Result<Ranking> {
    let comparisons: Vec<rank::bt::Comparison> = plan
        .pairs
        .iter()
        .zip(verdicts)
        .filter_map(|(&(a, b), (_, j))| crate::stages::rank::comparison(a, b, &j.winner))
        .collect();
    let opts = rank::bt::FitOptions {
        prior: rank::bt::Prior::Virtual(PRIOR),
        max_iterations: ITERATIONS,
        ..Default::default()
    };
    let fit = rank::bt::fit(plan.runs.len(), &comparisons, &opts)
        .map_err(|e| refused(format!("Bradley-Terry for {}: {e}", plan.task)))?;
    let runs = crate::stages::rank::ranked_runs(&fit, &plan.runs);
    Ok(Ranking {
        task: plan.task.clone(),
        cycle,
        prior: PRIOR,
        iterations: fit.iterations as u32,
        converged: fit.converged,
        runs,
        judgments: verdicts.iter().map(|(id, _)| Hash32(id.0)).collect(),
    })
}

/// Task `plan`'s selection from its new ranking: ranks 1..`train_ranks`
/// train, rank `validation_rank` validates (the reference's
/// `collection` settings); the source's exclusions are kept.
fn selection(src: &Source, plan: &TaskPlan, ranking: &Ranking, rid: Id) -> Selection {
    let wanted_train = src.train_ranks;
    let train: Vec<Hash32> = ranking
        .runs
        .iter()
        .filter(|r| r.rank >= 1 && r.rank <= wanted_train)
        .map(|r| r.rollout)
        .collect();
    let validation: Vec<Hash32> = src
        .validation_rank
        .filter(|v| *v > wanted_train)
        .and_then(|v| ranking.runs.iter().find(|r| r.rank == v))
        .map(|r| r.rollout)
        .into_iter()
        .collect();
    let wanted_validation = u32::from(src.validation_rank.is_some());
    let shortfall = if (train.len() as u32) < wanted_train
        || (validation.len() as u32) < wanted_validation
    {
        format!(
                "{} run(s) ranked: {} training run(s) of {wanted_train} wanted, {} validation run(s) of {wanted_validation} wanted",
                ranking.runs.len(),
                train.len(),
                validation.len()
            )
    } else {
        String::new()
    };
    Selection {
        task: plan.task.clone(),
        cycle: ranking.cycle,
        ranking: Hash32(rid.0),
        train,
        validation,
        excluded: Vec::new(),
        exclusions: plan.exclusions.clone(),
        wanted_train,
        wanted_validation,
        shortfall,
    }
}
