//! The tables read from a run's main stream: its decisions (rankings,
//! selections, datasets, trainings, evaluations, cycles) and, once its
//! other streams are read, its stages and its `runs` row. The main stream
//! holds tens of events per cycle, so it is read into memory once; what the
//! other streams' rows need from it (each rollout's Bradley-Terry score and
//! selection, which evaluation or ranking counted each judgment) is kept
//! in maps keyed by id.

use std::collections::{BTreeMap, HashMap, HashSet};

use engine::status::{CycleFigures, EvaluationFigure, RunStatus};
use ledger::{Event, Id, Ledger};
use schemas::{Decodable, Ranking, Selection, Training};
use serde_json::Value;

use crate::schema::{
    CYCLES, DATASET_LINES, EVALUATIONS, RANKINGS, RUNS, SELECTIONS, STAGES, TRAININGS,
};
use crate::sink::Cell;
use crate::{hex, hex_or_null, recorded, Result, TablesError, Writers};

/// What the other streams' rows need from the main stream.
pub(crate) struct RunContext {
    pub main: Vec<Event>,
    pub status: RunStatus,
    /// Ranked rollout → (Bradley-Terry score, rank, ranking), from this
    /// run's last ranking that names it.
    pub ranked: HashMap<Id, (f64, u32, Id)>,
    /// Rankings a selection read.
    pub read_rankings: HashSet<Id>,
    /// Rollout → `train`, `validation` or `excluded`.
    pub selected: HashMap<Id, &'static str>,
    pub judgment_ranking: HashMap<Id, Id>,
    pub judgment_evaluation: HashMap<Id, Id>,
}

/// What reading the other streams counted, for the `stages` and `runs`
/// rows.
#[derive(Default)]
pub(crate) struct Counts {
    pub streams: u64,
    pub events: u64,
    /// (cycle, stage) → (successful model calls, prompt, completion tokens).
    pub calls: BTreeMap<(u32, &'static str), (u64, u64, u64)>,
}

fn decode<T: Decodable>(ev: &Event) -> Result<T> {
    T::from_event(ev).map_err(|e| TablesError::record(&ev.kind, &ev.id, e))
}

/// Writes the main stream's tables of `run` and returns what the other
/// streams' rows need.
pub(crate) fn tables(l: &Ledger, run: &str, w: &mut Writers) -> Result<RunContext> {
    let head = l
        .head(run)?
        .ok_or_else(|| TablesError::NoRun(run.to_string()))?;
    let mut main: Vec<Event> = l.chain(head).collect::<std::result::Result<_, _>>()?;
    main.reverse();
    let status = engine::status::fold_read(l, &main)?;
    let mut ctx = RunContext {
        main: Vec::new(),
        status,
        ranked: HashMap::new(),
        read_rankings: HashSet::new(),
        selected: HashMap::new(),
        judgment_ranking: HashMap::new(),
        judgment_evaluation: HashMap::new(),
    };
    let cycle_records = cycle_records(&main)?;
    for ev in &main {
        match ev.kind.as_str() {
            "mass.ranking" => ranking(run, ev, &mut ctx, w)?,
            "mass.selection" => selection(l, run, ev, &mut ctx, w)?,
            "mass.training" => training(l, run, ev, w)?,
            "mass.dataset" if ev.version == 2 => dataset_lines(l, run, ev, w)?,
            "mass.evaluation" => evaluation(run, ev, &cycle_records, &mut ctx, w)?,
            _ => {}
        }
    }
    for c in &ctx.status.cycles {
        let event = cycle_records.iter().find(|r| r.1 == c.cycle).map(|r| r.0);
        w.push(&CYCLES, cycle_row(run, event, c))?;
    }
    ctx.main = main;
    Ok(ctx)
}

/// Each cycle's counting `mass.cycle` record (the last of its number: a
/// fork that re-ran a cycle recorded it again) and the evaluations it
/// links, as (event, cycle, evaluations).
fn cycle_records(main: &[Event]) -> Result<Vec<(Id, u32, Vec<Id>)>> {
    let mut out: Vec<(Id, u32, Vec<Id>)> = Vec::new();
    for ev in main.iter().filter(|e| e.kind == "mass.cycle") {
        let (cycle, evals) = if ev.version == schemas::CycleV1::VERSION {
            let c: schemas::CycleV1 = decode(ev)?;
            (c.cycle, c.evaluation.map(|e| Id(e.0)).into_iter().collect())
        } else {
            let c: schemas::Cycle = decode(ev)?;
            (c.cycle, c.evaluations.iter().map(|e| Id(e.0)).collect())
        };
        out.retain(|r| r.1 != cycle);
        out.push((ev.id, cycle, evals));
    }
    Ok(out)
}

fn cycle_row(run: &str, event: Option<Id>, c: &CycleFigures) -> Vec<Cell> {
    vec![
        run.into(),
        event.map(|e| e.to_hex()).into(),
        c.cycle.into(),
        c.model.as_str().into(),
        c.next_model.as_str().into(),
        c.inner_wins.into(),
        c.inner_iterations.into(),
        c.selected_runs.into(),
        c.supervised_tokens.into(),
        c.collected_runs.into(),
        c.delegation_rate.into(),
        c.tampered_in_training.into(),
        c.tampering_rate.into(),
    ]
}

fn ranking(run: &str, ev: &Event, ctx: &mut RunContext, w: &mut Writers) -> Result<()> {
    let rk: Ranking = decode(ev)?;
    for r in &rk.runs {
        ctx.ranked.insert(Id(r.rollout.0), (r.score, r.rank, ev.id));
        w.push(
            &RANKINGS,
            vec![
                run.into(),
                ev.id.to_hex().into(),
                rk.cycle.into(),
                rk.task.as_str().into(),
                hex(&r.rollout).into(),
                r.score.into(),
                r.rank.into(),
                r.wins.into(),
                r.losses.into(),
                r.ties.into(),
                rk.prior.into(),
                rk.iterations.into(),
                rk.converged.into(),
            ],
        )?;
    }
    for j in &rk.judgments {
        ctx.judgment_ranking.insert(Id(j.0), ev.id);
    }
    Ok(())
}

fn selection(
    l: &Ledger,
    run: &str,
    ev: &Event,
    ctx: &mut RunContext,
    w: &mut Writers,
) -> Result<()> {
    let Some(sel) = Selection::read(ev) else {
        return Ok(()); // a version this build does not know
    };
    let sel = sel.map_err(|e| TablesError::record(&ev.kind, &ev.id, e))?;
    ctx.read_rankings.insert(Id(sel.ranking.0));
    let mut rows: Vec<(Option<Id>, &'static str, Option<String>)> = Vec::new();
    rows.extend(sel.train.iter().map(|r| (Some(Id(r.0)), "train", None)));
    rows.extend(
        sel.validation
            .iter()
            .map(|r| (Some(Id(r.0)), "validation", None)),
    );
    for (r, reason) in audit::selection_exclusions(l, &sel)? {
        rows.push((r, "excluded", Some(reason)));
    }
    for (rollout, decision, reason) in rows {
        if let Some(r) = rollout {
            ctx.selected.insert(r, decision);
        }
        w.push(
            &SELECTIONS,
            vec![
                run.into(),
                ev.id.to_hex().into(),
                sel.cycle.into(),
                sel.task.as_str().into(),
                hex(&sel.ranking).into(),
                rollout.map(|r| r.to_hex()).into(),
                decision.into(),
                reason.into(),
                sel.wanted_train.into(),
                sel.wanted_validation.into(),
                sel.shortfall.as_str().into(),
            ],
        )?;
    }
    Ok(())
}

fn training(l: &Ledger, run: &str, ev: &Event, w: &mut Writers) -> Result<()> {
    let Some(t) = Training::read(ev) else {
        return Ok(());
    };
    let meta = l.get_meta(&ev.id)?;
    let t = t.map_err(|e| TablesError::record(&ev.kind, &ev.id, e))?;
    w.push(
        &TRAININGS,
        vec![
            run.into(),
            ev.id.to_hex().into(),
            t.cycle.into(),
            hex(&t.dataset).into(),
            t.base_model.into(),
            t.new_model.into(),
            t.command.into(),
            recorded(&meta, "exit_status", t.exit_status).into(),
            t.checkpoint.into(),
            t.checkpoint_reason.into(),
            t.validation_loss.into(),
            t.base_validation_loss.into(),
            t.steps.into(),
            hex_or_null(&t.adapter).into(),
            t.trainer_version.into(),
        ],
    )
}

/// One row per line of a v2 dataset's provenance sidecar (JSON lines).
fn dataset_lines(l: &Ledger, run: &str, ev: &Event, w: &mut Writers) -> Result<()> {
    let d: schemas::Dataset = decode(ev)?;
    let blob = l.get_blob(&Id(d.provenance.0))?;
    for (n, line) in blob.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let v: Value = serde_json::from_slice(line).map_err(|e| {
            TablesError::record(
                "mass.dataset provenance",
                &ev.id,
                format!("line {}: {e}", n + 1),
            )
        })?;
        let text = |k: &str| -> Cell { v[k].as_str().map(str::to_string).into() };
        w.push(
            &DATASET_LINES,
            vec![
                run.into(),
                ev.id.to_hex().into(),
                d.cycle.into(),
                text("file"),
                v["line"].as_u64().into(),
                text("rollout"),
                text("conversation"),
                text("agent"),
                text("stream_head"),
                text("selection"),
                text("ranking"),
            ],
        )?;
    }
    Ok(())
}

fn evaluation(
    run: &str,
    ev: &Event,
    cycle_records: &[(Id, u32, Vec<Id>)],
    ctx: &mut RunContext,
    w: &mut Writers,
) -> Result<()> {
    let (cycle, fig, judgments) = match ev.version {
        3 => {
            let e: schemas::Evaluation = decode(ev)?;
            (e.cycle, EvaluationFigure::of(&e), e.judgments)
        }
        2 => {
            let e: schemas::EvaluationV2 = decode(ev)?;
            (e.cycle, EvaluationFigure::of_v2(&e), e.judgments)
        }
        _ => return Ok(()), // v1 records name no judge model or pairs
    };
    for j in &judgments {
        ctx.judgment_evaluation.insert(Id(j.0), ev.id);
    }
    let counted = cycle_records
        .iter()
        .find(|r| r.2.contains(&ev.id))
        .map(|r| r.0.to_hex());
    w.push(&EVALUATIONS, evaluation_row(run, ev, cycle, counted, fig))
}

fn evaluation_row(
    run: &str,
    ev: &Event,
    cycle: u32,
    counted: Option<String>,
    f: EvaluationFigure,
) -> Vec<Cell> {
    vec![
        run.into(),
        ev.id.to_hex().into(),
        cycle.into(),
        counted.into(),
        f.split.into(),
        f.against.into(),
        f.model.into(),
        f.baseline.into(),
        f.judge.into(),
        f.judge_model.into(),
        f.self_judge.into(),
        f.order.into(),
        f.judgments.into(),
        f.verdicts.into(),
        f.judgment_wins.into(),
        f.judgment_losses.into(),
        f.judgment_ties.into(),
        f.judgment_win_rate.into(),
        f.model_first.into(),
        f.pairs.into(),
        f.wins.into(),
        f.losses.into(),
        f.ties.into(),
        f.win_rate.into(),
        f.interval.map(|i| i[0]).into(),
        f.interval.map(|i| i[1]).into(),
        f.swapped.into(),
        f.same_position.into(),
    ]
}

/// The `stages` rows (each finished cycle's eight stages, as `mass report`
/// shows them) and the `runs` row, once the other streams are read.
pub(crate) fn finish(
    l: &Ledger,
    run: &str,
    ctx: &RunContext,
    counts: &Counts,
    w: &mut Writers,
) -> Result<()> {
    let seconds = audit::report::stage_seconds(l, &ctx.main)?;
    for c in &ctx.status.cycles {
        for stage in audit::report::STAGES {
            let (calls, prompt, completion) = counts
                .calls
                .get(&(c.cycle, stage))
                .copied()
                .unwrap_or_default();
            w.push(
                &STAGES,
                vec![
                    run.into(),
                    c.cycle.into(),
                    stage.into(),
                    // No step closed it: null, as in `report` (the stage
                    // did not run, or an import's time is unknown).
                    seconds.get(&(c.cycle, stage)).copied().flatten().into(),
                    calls.into(),
                    prompt.into(),
                    completion.into(),
                ],
            )?;
        }
    }
    w.push(&RUNS, run_row(l, run, ctx, counts)?)
}

fn run_row(l: &Ledger, run: &str, ctx: &RunContext, counts: &Counts) -> Result<Vec<Cell>> {
    let Some(first) = ctx.main.first() else {
        return Err(TablesError::NoRun(run.to_string()));
    };
    let (driver, config, tasks, seed) = match (first.kind.as_str(), first.version) {
        ("run.started", 2) => {
            let s: schemas::RunStarted = decode(first)?;
            (s.driver, hex(&s.config), hex_or_null(&s.tasks), s.seed)
        }
        ("run.started", 1) => {
            let s: schemas::RunStartedV1 = decode(first)?;
            (s.driver, hex(&s.config), None, s.seed)
        }
        _ => {
            return Err(TablesError::record(
                "run start",
                &first.id,
                format!(
                    "the main stream begins with {} v{}",
                    first.kind, first.version
                ),
            ))
        }
    };
    let s = &ctx.status;
    // As `mass status` reads them: a definition that cannot be read leaves
    // the name and plan null; a fork that set `cycles` changed the plan.
    let (experiment, planned) = match engine::status::describe_start(l, first) {
        Ok((name, cycles)) => (Some(name), Some(s.cycles_override.unwrap_or(cycles))),
        Err(_) => (None, s.cycles_override),
    };
    let head = ctx.main.last().map(|e| e.id.to_hex());
    let meta = l.get_meta(&first.id)?;
    Ok(vec![
        run.into(),
        head.into(),
        first.id.to_hex().into(),
        driver.into(),
        experiment.into(),
        recorded(&meta, "seed", seed).map(|s| s.to_string()).into(),
        config.into(),
        tasks.into(),
        planned.into(),
        s.cycles_done.into(),
        s.finished.into(),
        s.forked_from.clone().into(),
        meta.known_wall_ms().into(),
        (counts.streams + 1).into(),
        (counts.events + ctx.main.len() as u64).into(),
    ])
}
