//! `mass export dataset`'s export check: every line of a recorded dataset
//! is read back against its run's workflow (`engine::dataset::line_leak`,
//! the criterion in ARCHITECTURE.md) before a file is written, for runs of
//! every driver version. A leaking line is refused, naming its run,
//! conversation, file and line. Only the export refuses: replaying, resuming
//! or forking an older run whose recorded dataset leaks is untouched (its
//! recorded data is what it trained on).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use engine::dataset::{line_leak, AgentKind, WorkflowLeak, WorkflowText};
use ledger::{Id, Ledger};
use serde_json::Value;

/// The lines of `train` and `validation` by provenance (a JSONL blob,
/// `mass.dataset` v2); `head` is the run's main head (its `run.started`
/// names the recorded task suite). `Ok(None)`: nothing leaks.
pub fn check(
    l: &Ledger,
    run: &str,
    head: Id,
    train: &str,
    validation: &str,
    provenance: &str,
) -> Result<Option<WorkflowLeak>> {
    let tasks = recorded_tasks(l, run, head)?;
    let files = [("train", train), ("validation", validation)];
    let mut texts: BTreeMap<String, WorkflowText> = BTreeMap::new();
    for p in provenance.lines() {
        let v: Value = serde_json::from_str(p).context("provenance line is not JSON")?;
        let (file, n) = (
            v["file"].as_str().unwrap_or_default(),
            v["line"].as_u64().unwrap_or(0) as usize,
        );
        let rollout = v["rollout"].as_str().unwrap_or_default().to_string();
        let Some(line) = files
            .iter()
            .find(|(f, _)| *f == file)
            .and_then(|(_, text)| text.lines().nth(n.saturating_sub(1)))
        else {
            anyhow::bail!("provenance names {file} line {n}, which the dataset does not hold");
        };
        if !texts.contains_key(&rollout) {
            let wf = workflow_text(l, &rollout, &tasks)?;
            texts.insert(rollout.clone(), wf);
        }
        let agent = if v["agent"] == "orchestrator" {
            AgentKind::Orchestrator
        } else {
            AgentKind::Subagent
        };
        if let Some(leak) = line_leak(line, agent, &texts[&rollout]) {
            return Ok(Some(WorkflowLeak {
                file: file.into(),
                line: n,
                run: rollout,
                conversation: v["conversation"].as_str().unwrap_or_default().into(),
                place: leak.place,
                found: leak.found,
            }));
        }
    }
    Ok(None)
}

/// Each recorded task's allowed text (`engine::dataset::allowed_text`), by id.
fn recorded_tasks(l: &Ledger, run: &str, head: Id) -> Result<BTreeMap<String, Vec<String>>> {
    let mut tree = None;
    for ev in l.chain(head) {
        let ev = ev?;
        if ev.kind == "run.started" && ev.version == 2 {
            let s: schemas::RunStarted = schemas::decode_event(&ev)?;
            tree = Some(Id(s.tasks.0));
        }
    }
    let tree = tree.with_context(|| format!("run {run} records no task suite"))?;
    let suite = engine::suite::checkout(l, tree, run)?;
    let tasks = engine::task::load_suite(suite.path())?;
    Ok(tasks
        .iter()
        .map(|t| {
            (
                t.id.clone(),
                engine::dataset::allowed_text(&t.prompt, &t.id, &t.deliverables),
            )
        })
        .collect())
}

/// What the check looks for in the lines of rollout `rollout` (hex).
fn workflow_text(
    l: &Ledger,
    rollout: &str,
    tasks: &BTreeMap<String, Vec<String>>,
) -> Result<WorkflowText> {
    let id: Id = rollout.parse().context("provenance names no rollout id")?;
    let r: schemas::Rollout = schemas::decode_event(&l.get_event(&id)?)?;
    let w: engine::workflow::Workflow = serde_json::from_slice(&l.get_blob(&Id(r.workflow.0))?)
        .with_context(|| format!("workflow of rollout {}", id.short(12)))?;
    let allowed = tasks
        .get(&r.task)
        .with_context(|| format!("task {} is not in the recorded suite", r.task))?;
    Ok(WorkflowText::new(
        &w,
        &allowed.iter().map(String::as_str).collect::<Vec<_>>(),
    ))
}
