//! The collect stage: `outer.runs_per_task` runs of each champion workflow
//! whose task yields data (its champion beat the bare-task reference, or
//! `outer.collect = "every"`), under the settings as they stand after the
//! search. Reads the search's champions; writes the rollouts (each on its
//! `c{cycle}/{task}/collect/{i}` stream) and a main-stream step naming every
//! one of them. Runs the guards flagged are set aside here when the policy
//! says `exclude`, and (from `mass-engine/9`) so are runs that did not
//! finish (halted at a limit, or failed), each named by id with its reason
//! for its task's selection: they are neither judged nor ranked.
//!
//! Why not judge them: a halted or failed run can never be selected, so a
//! verdict on it is a wasted call, and worse, it moves the finished runs'
//! scores (beating a broken run is easy). The pairing schedule is built
//! over the finished runs only, so it stays connected for exactly the runs
//! that can become data. `mass-engine/8` and earlier judged and ranked them
//! and skipped them at selection (lower ranks filled in): those runs keep
//! that flow (`exp.method.legacy()`).

use std::collections::{BTreeMap, BTreeSet};

use ledger::Id;
use replay::Stream;

use super::dataset::run_conversations;
use super::guard_reason;
use super::search::{Searched, TaskSearch};
use crate::config::{Collect, Experiment, GuardAction};
use crate::context::{note, step, Ctx, Models, Now};
use crate::dataset::{Example, ExampleSplit};
use crate::error::Result;
use crate::exec;
use crate::harness::RunSpec;
use crate::judge::RunRef;
use crate::task::Task;

/// What collection produced.
pub(crate) struct Collected {
    /// Tasks whose champion collection ran for.
    pub(crate) tasks_with_data: u32,
    /// Each task's runs that go on to judging, in collection order.
    pub(crate) by_task: BTreeMap<String, Vec<RunRef>>,
    /// Runs kept out of judging and ranking, by task: each run's event and
    /// reason (the guards' `exclude`; from `mass-engine/9` also runs that
    /// did not finish), in collection order.
    pub(crate) excluded: BTreeMap<String, Vec<(Id, String)>>,
    /// Runs that tampered, by their guard findings or their recorded tool
    /// calls, flagged or not.
    pub(crate) tampering: BTreeSet<Id>,
    /// Every collected run, and those whose orchestrator delegated.
    pub(crate) runs: u32,
    pub(crate) delegating: u32,
}

/// Whether the run these conversations come from tampered, by its
/// recorded tool calls (every agent's).
fn tampered(task: &Task, convs: &[Example]) -> bool {
    let calls: Vec<(String, serde_json::Value)> = convs
        .iter()
        .flat_map(|c| c.messages.iter())
        .flat_map(|m| m.tool_calls.iter())
        .map(|c| {
            let args = serde_json::from_str(&c.function.arguments).unwrap_or_default();
            (c.function.name.clone(), args)
        })
        .collect();
    crate::guards::tampering_in(task, &calls).is_some()
}

/// Runs the collect stage of cycle `cycle`.
pub(crate) fn run(
    ctx: &Ctx<'_>,
    main: &mut Stream,
    exp: &mut Experiment,
    cycle: u32,
    m: &Models,
    searched: &Searched,
) -> Result<Collected> {
    let with_data: Vec<&TaskSearch> = searched
        .tasks
        .iter()
        .filter(|t| t.beat_reference || exp.outer.collect == Collect::Every)
        .collect();
    for t in &with_data {
        ctx.assert_trainable(&t.task, "collection")?;
    }
    let runs = collect_runs(ctx, exp, cycle, m, &with_data)?;
    let mut out = Collected {
        tasks_with_data: with_data.len() as u32,
        by_task: BTreeMap::new(),
        excluded: BTreeMap::new(),
        tampering: tampering_runs(ctx, &with_data, &runs)?,
        runs: runs.len() as u32,
        delegating: runs.iter().filter(|r| r.record.delegations > 0).count() as u32,
    };
    // Every collected run is a parent of the step, the ones the guards
    // exclude too: a fork there keeps their streams instead of running them
    // again live.
    let collected: Vec<Id> = runs.iter().map(|r| r.event).collect();
    for r in runs {
        let task = r.record.task.clone();
        out.by_task.entry(task.clone()).or_default();
        if let Some(reason) = left_out(exp, &r) {
            out.excluded
                .entry(task)
                .or_default()
                .push((r.event, reason));
            continue;
        }
        out.by_task.entry(task).or_default().push(r);
    }
    step(
        main,
        exp,
        note(format!(
            "cycle {cycle}: collection done ({} runs)",
            out.runs
        ))?
        .with_parents(collected),
    )?;
    Ok(out)
}

/// Why run `r` is kept out of judging and ranking, if it is: flagged by a
/// guard under `exclude`, or (not for `mass-engine/8` and earlier) it did
/// not finish. The reason reads as `mass.selection` records it.
fn left_out(exp: &Experiment, r: &RunRef) -> Option<String> {
    if !r.violations.is_empty() && exp.guards.action == GuardAction::Exclude {
        return Some(format!("{} (not ranked)", guard_reason(&r.violations)));
    }
    if r.record.status != "finished" && !exp.method.legacy() {
        return Some(format!(
            "{}: {} (not ranked)",
            r.record.status, r.record.detail
        ));
    }
    None
}

/// N runs of each champion, under the settings as they stand after the
/// inner loop's last step.
fn collect_runs(
    ctx: &Ctx<'_>,
    exp: &Experiment,
    cycle: u32,
    m: &Models,
    with_data: &[&TaskSearch],
) -> Result<Vec<RunRef>> {
    let now = Now::of(ctx, exp, m)?;
    let c = ctx.at(&now.exp);
    let team = c.team_spec(&now.models);
    let n = now.exp.outer.runs_per_task;
    let items: Vec<_> = with_data
        .iter()
        .flat_map(|t| (0..n).map(move |i| (t, i)))
        .map(|(t, i)| {
            team.item(&RunSpec {
                task: &t.task,
                workflow: &t.champion,
                stream: format!("c{cycle}/{}/collect/{i:02}", t.task.id),
                purpose: "collect",
                cycle,
                index: i,
            })
        })
        .collect();
    let stage = format!("cycle {cycle}: collection");
    ctx.progress.stage(&stage, items.len() as u64);
    let runs = exec::all(
        c.threads(),
        items,
        |item| ctx.executor.rollout(item),
        || ctx.progress.tick(&stage),
    )?;
    ctx.progress.done(&stage);
    Ok(runs)
}

/// Runs that tampered, by their guard findings or their recorded tool
/// calls: read once, for the collection figure here and the training
/// figure at the dataset.
fn tampering_runs(
    ctx: &Ctx<'_>,
    with_data: &[&TaskSearch],
    runs: &[RunRef],
) -> Result<BTreeSet<Id>> {
    let mut out = BTreeSet::new();
    for r in runs {
        if crate::guards::changed_protected(&r.violations) {
            out.insert(r.event);
            continue;
        }
        if let Some(t) = with_data.iter().find(|t| t.task.id == r.record.task) {
            let convs = run_conversations(ctx, &t.task, r, ExampleSplit::Train)?;
            if tampered(&t.task, &convs) {
                out.insert(r.event);
            }
        }
    }
    Ok(out)
}
