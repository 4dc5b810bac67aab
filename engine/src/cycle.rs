//! One MASS cycle as the list of its stages (`stages/`): search (the inner
//! loop: a workflow per training task), collect (runs of each champion),
//! judge (a seeded pairing schedule), then per task rank (Bradley-Terry) and
//! select, dataset (render and strip), train, evaluate (held-out tasks),
//! and the `mass.cycle` record with the cycle's figures.
//!
//! Each stage reads what earlier stages recorded and appends its own
//! records; units of work inside a stage run in parallel, and the main
//! stream records a step after each stage, naming the work's heads as
//! parents, so a run forks cleanly at any step boundary (a fork's overrides
//! apply right after the step it was taken at: `context::step`).

use replay::Stream;
use schemas::Hash32;

use crate::config::Experiment;
use crate::context::{Ctx, Models};
use crate::error::Result;
use crate::stages::evaluate::{EvalRuns, Evaluated};
use crate::stages::select::Selected;
use crate::stages::{collect, dataset, evaluate, judge, rank, search, select, train};
use crate::task::Task;

/// The figures of one cycle, for the summary table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CycleResult {
    pub cycle: u32,
    pub model: String,
    pub next_model: String,
    pub inner_wins: u32,
    pub inner_iterations: u32,
    pub tasks_with_data: u32,
    pub selected_runs: u32,
    pub supervised_tokens: u64,
    /// The evaluation of the trained model (none when the model did not
    /// change).
    pub evaluation: Option<crate::stages::evaluate::Outcome>,
    /// Training examples from runs that tampered, as the record shows it:
    /// tool calls that write a protected file or claim passing checks in
    /// the report (`guards::tampering_in`), or a final workspace whose
    /// protected files changed (the guard's finding on the snapshots).
    /// What guards exist to keep at zero.
    pub tampered_in_training: u32,
    /// The cycle's figures as recorded (`mass.cycle` and its evaluations),
    /// exactly what `mass status --json` shows for it.
    pub figures: crate::status::CycleFigures,
    /// Collected runs (with the champion workflow), those whose
    /// orchestrator delegated and those that tampered (as above), whatever
    /// the guards then did with them.
    pub collected_runs: u32,
    pub delegating_runs: u32,
    pub tampered_runs: u32,
}

impl CycleResult {
    /// Share of the collected runs whose orchestrator delegated.
    pub fn delegation_rate(&self) -> f64 {
        share(self.delegating_runs, self.collected_runs)
    }

    /// Share of the collected runs that tampered.
    pub fn tamper_rate(&self) -> f64 {
        share(self.tampered_runs, self.collected_runs)
    }
}

fn share(part: u32, whole: u32) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Runs one whole cycle; returns its figures, the next cycle's models and
/// the roles they play (a fork inside the cycle may have moved a role to
/// another backend).
pub fn run_cycle(
    ctx: &Ctx<'_>,
    main: &mut Stream,
    exp: &mut Experiment,
    cycle: u32,
    m: &Models,
    eval_runs: &mut EvalRuns,
) -> Result<(CycleResult, Models, crate::config::Roles)> {
    let searched = search::run(ctx, main, exp, cycle, m)?;
    let inner_iterations = exp.inner.iterations * searched.tasks.len() as u32;
    let collected = collect::run(ctx, main, exp, cycle, m, &searched)?;
    let judged = judge::run(ctx, main, exp, cycle, m, &collected)?;
    // Rank and select task by task, each ranking followed by its selection.
    let mut selected: Vec<(&Task, Selected<'_>)> = Vec::new();
    for (task_id, runs) in &collected.by_task {
        let task = ctx.train.iter().find(|t| &t.id == task_id).ok_or_else(|| {
            crate::error::EngineError::Invalid(format!("collected runs of unknown task {task_id}"))
        })?;
        ctx.assert_trainable(task, "ranking and selection")?;
        let ranked = rank::run(main, exp, cycle, task_id, runs, &judged)?;
        let excluded = collected
            .excluded
            .get(task_id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        selected.push((
            task,
            select::run(main, exp, cycle, task_id, runs, &ranked, excluded)?,
        ));
    }
    let built = dataset::run(ctx, main, exp, cycle, &collected, &selected)?;
    let trained = train::run(ctx, main, exp, cycle, m, &built)?;
    let evaluated = evaluate::run(ctx, main, exp, cycle, trained, eval_runs)?;
    let result = CycleResult {
        cycle,
        model: m.orchestrator.clone(),
        next_model: evaluated.next.orchestrator.clone(),
        inner_wins: searched.wins(),
        inner_iterations,
        tasks_with_data: collected.tasks_with_data,
        selected_runs: selected
            .iter()
            .map(|(_, s)| (s.train.len() + s.validation.len()) as u32)
            .sum(),
        supervised_tokens: built.supervised_tokens,
        evaluation: evaluated.outcome.clone(),
        tampered_in_training: built.tampered_in_training,
        figures: Default::default(),
        collected_runs: collected.runs,
        delegating_runs: collected.delegating,
        tampered_runs: collected.tampering.len() as u32,
    };
    record(main, exp, result, evaluated)
}

/// The `mass.cycle` record: the cycle's figures and its evaluations.
fn record(
    main: &mut Stream,
    exp: &mut Experiment,
    mut result: CycleResult,
    evaluated: Evaluated,
) -> Result<(CycleResult, Models, crate::config::Roles)> {
    let ev = evaluated.outcome.unwrap_or_default();
    let rec = schemas::Cycle {
        cycle: result.cycle,
        model: result.model.clone(),
        next_model: result.next_model.clone(),
        inner_wins: result.inner_wins,
        inner_iterations: result.inner_iterations,
        selected_runs: result.selected_runs,
        supervised_tokens: result.supervised_tokens,
        collected_runs: result.collected_runs,
        delegating_runs: result.delegating_runs,
        tampered_runs: result.tampered_runs,
        tampered_in_training: result.tampered_in_training,
        bare_delegation: ev.delegation,
        agreement: ev.agreement,
        evaluations: ev.evaluations.iter().map(|(id, _)| Hash32(id.0)).collect(),
    };
    let evaluations: Vec<crate::status::EvaluationFigure> =
        ev.evaluations.iter().map(|(_, e)| e.clone()).collect();
    result.figures = crate::status::CycleFigures::of(&rec, &evaluations);
    crate::context::step(main, exp, schemas::to_event(&rec)?)?;
    Ok((result, evaluated.next, evaluated.roles))
}
