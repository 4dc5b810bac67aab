//! The dataset stage: the selected runs' conversations (the orchestrator's
//! and each subagent's, the orchestrator's first prompt stripped to the bare
//! task, as MASS trains on them) rendered as OpenAI chat JSONL, a train and
//! a validation file, with a provenance sidecar naming the rollout,
//! conversation, selection and ranking of every line. Reads the selections;
//! writes the three blobs and one `mass.dataset` on the main stream.

use ledger::Id;
use replay::Stream;

use super::collect::Collected;
use super::select::Selected;
use crate::config::Experiment;
use crate::context::{step, Ctx};
use crate::dataset::{self, AgentKind, Example, ExampleSplit, Format};
use crate::error::{EngineError, Result};
use crate::judge::RunRef;
use crate::task::Task;

/// The recorded dataset.
pub(crate) struct Built {
    pub(crate) id: Id,
    pub(crate) train_jsonl: String,
    pub(crate) validation_jsonl: String,
    pub(crate) train_examples: u64,
    pub(crate) supervised_tokens: u64,
    /// Training examples from runs that tampered (see
    /// `CycleResult::tampered_in_training`).
    pub(crate) tampered_in_training: u32,
}

/// Runs the dataset stage of cycle `cycle` over each task's selection.
pub(crate) fn run(
    ctx: &Ctx<'_>,
    main: &mut Stream,
    exp: &mut Experiment,
    cycle: u32,
    collected: &Collected,
    selected: &[(&Task, Selected<'_>)],
) -> Result<Built> {
    let mut conversations = Vec::new();
    // Where each conversation comes from: (rollout, selection, ranking).
    let mut origins: Vec<(&RunRef, Id, Id)> = Vec::new();
    let mut tampered_in_training = 0;
    for (task, sel) in selected {
        for (split, list) in [
            (ExampleSplit::Train, &sel.train),
            (ExampleSplit::Validation, &sel.validation),
        ] {
            for run in list.iter() {
                let convs = if exp.method.legacy() {
                    run_conversations(ctx, task, run, split)?
                } else {
                    conversations_stripped(ctx, task, run, split)?
                };
                if split == ExampleSplit::Train && collected.tampering.contains(&run.event) {
                    tampered_in_training += convs.len() as u32;
                }
                origins.extend(convs.iter().map(|_| (*run, sel.id, sel.ranking)));
                conversations.extend(convs);
            }
        }
    }
    let (train_jsonl, validation_jsonl, summary) =
        dataset::render_dataset(&conversations, Format::OpenAi)
            .map_err(|e| EngineError::Invalid(format!("dataset: {e}")))?;
    if !exp.method.legacy() {
        check_export(
            ctx,
            selected,
            &conversations,
            &train_jsonl,
            &validation_jsonl,
        )?;
    }
    let ledger = ctx.session.ledger();
    let (train_blob, val_blob) = (
        ledger.put_blob(train_jsonl.as_bytes())?,
        ledger.put_blob(validation_jsonl.as_bytes())?,
    );
    let provenance = ledger.put_blob(provenance_jsonl(&conversations, &origins).as_bytes())?;
    let ds = schemas::Dataset {
        cycle,
        format: "openai".into(),
        train: train_blob.into(),
        validation: val_blob.into(),
        train_examples: summary.train_examples as u32,
        validation_examples: summary.validation_examples as u32,
        train_supervised_tokens: summary.train_supervised_tokens,
        validation_supervised_tokens: summary.validation_supervised_tokens,
        selections: selected
            .iter()
            .map(|(_, s)| schemas::Hash32(s.id.0))
            .collect(),
        provenance: provenance.into(),
    };
    let id = step(main, exp, schemas::to_event(&ds)?)?;
    Ok(Built {
        id,
        train_jsonl,
        validation_jsonl,
        train_examples: summary.train_examples,
        supervised_tokens: summary.train_supervised_tokens + summary.validation_supervised_tokens,
        tampered_in_training,
    })
}

/// The dataset's provenance sidecar (`mass.dataset` v2): one JSON object
/// per example, in the order `dataset::render_dataset` writes the lines of
/// each file, naming the rollout, conversation, agent stream, selection and
/// ranking it came from.
fn provenance_jsonl(conversations: &[Example], origins: &[(&RunRef, Id, Id)]) -> String {
    let mut line = [0u32; 2];
    let mut out = String::new();
    for (conv, (run, selection, ranking)) in conversations.iter().zip(origins) {
        let (file, n) = match conv.split {
            ExampleSplit::Train => ("train", &mut line[0]),
            ExampleSplit::Validation => ("validation", &mut line[1]),
        };
        *n += 1;
        // `run_conversations` names conversation n after the n-th stream
        // head: the orchestrator's, then each subagent's.
        let index: usize = conv
            .id
            .rsplit_once('#')
            .and_then(|(_, n)| n.parse().ok())
            .unwrap_or(0);
        let head = std::iter::once(run.record.orchestrator)
            .chain(run.record.subagents.iter().copied())
            .nth(index);
        let v = serde_json::json!({
            "file": file,
            "line": *n,
            "rollout": run.event.to_hex(),
            "conversation": conv.id,
            "agent": conv.agent,
            "stream_head": head.map(|h| Id(h.0).to_hex()),
            "selection": selection.to_hex(),
            "ranking": ranking.to_hex(),
        });
        out.push_str(&v.to_string());
        out.push('\n');
    }
    out
}

/// The export check (`dataset::leak`): every line of both files is read
/// back and refused, naming its run, conversation and line, when it still
/// holds its run's workflow. Not for `mass-engine/8` and earlier runs: their
/// recorded dataset is what they trained on, and replaying one must give it
/// again (`mass export dataset` still refuses a leaking line of theirs).
fn check_export(
    ctx: &Ctx<'_>,
    selected: &[(&Task, Selected<'_>)],
    conversations: &[Example],
    train_jsonl: &str,
    validation_jsonl: &str,
) -> Result<()> {
    let mut texts: std::collections::BTreeMap<String, dataset::WorkflowText> = Default::default();
    for (task, sel) in selected {
        for run in sel.train.iter().chain(sel.validation.iter()) {
            texts.insert(run.event.to_hex(), workflow_text(ctx, task, run)?);
        }
    }
    let (mut train, mut validation) = (train_jsonl.lines(), validation_jsonl.lines());
    let mut n = [0usize; 2];
    for conv in conversations {
        let (file, lines, k) = match conv.split {
            ExampleSplit::Train => ("train", &mut train, 0),
            ExampleSplit::Validation => ("validation", &mut validation, 1),
        };
        n[k] += 1;
        let line = lines.next().unwrap_or_default();
        let wf = texts.get(&conv.run).ok_or_else(|| {
            EngineError::Invalid(format!(
                "dataset: conversation {} of no selected run",
                conv.id
            ))
        })?;
        if let Some(leak) = dataset::line_leak(line, conv.agent, wf) {
            return Err(EngineError::Invalid(
                dataset::WorkflowLeak {
                    file: file.into(),
                    line: n[k],
                    run: conv.run.clone(),
                    conversation: conv.id.clone(),
                    place: leak.place,
                    found: leak.found,
                }
                .to_string(),
            ));
        }
    }
    Ok(())
}

/// The workflow run `run` was given, as its recorded blob holds it.
fn run_workflow(ctx: &Ctx<'_>, run: &RunRef) -> Result<crate::workflow::Workflow> {
    let bytes = ctx.session.ledger().get_blob(&Id(run.record.workflow.0))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| EngineError::recording(format!("workflow of run {}", run.event.short(12)), e))
}

/// What the export check looks for in run `run`'s lines: its workflow,
/// less the text every run of the task shows anyway.
pub(crate) fn workflow_text(
    ctx: &Ctx<'_>,
    task: &Task,
    run: &RunRef,
) -> Result<dataset::WorkflowText> {
    let workflow = run_workflow(ctx, run)?;
    Ok(dataset::WorkflowText::new(
        &workflow,
        &allowed_text(task)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    ))
}

/// The text every run of `task` shows whatever its workflow
/// (`dataset::allowed_text`).
fn allowed_text(task: &Task) -> Vec<String> {
    dataset::allowed_text(&task.prompt, &task.id, &task.deliverables)
}

fn directives(task: &Task) -> [String; 2] {
    [
        crate::prompts::directive(&task.id, &task.deliverables),
        crate::prompts::external_directive(&task.id, &task.deliverables),
    ]
}

/// The conversations of a selected run (`mass-engine/9`), the workflow
/// removed from every message of every conversation that holds it
/// (`dataset::strip_workflow_everywhere`).
fn conversations_stripped(
    ctx: &Ctx<'_>,
    task: &Task,
    run: &RunRef,
    split: ExampleSplit,
) -> Result<Vec<Example>> {
    let rendered = run_workflow(ctx, run)?.render();
    let directives = directives(task);
    let mut out = conversations_as_recorded(ctx, task, run, split)?;
    for conv in &mut out {
        dataset::strip_workflow_everywhere(conv, &task.prompt, &directives, &rendered);
    }
    Ok(out)
}

/// The orchestrator and subagent conversations of a selected run, the
/// orchestrator's first prompt stripped to the bare task (as runs of
/// `mass-engine/8` and earlier were, and as collection reads the calls).
pub(crate) fn run_conversations(
    ctx: &Ctx<'_>,
    task: &Task,
    run: &RunRef,
    split: ExampleSplit,
) -> Result<Vec<Example>> {
    let directives = directives(task);
    let mut out = conversations_as_recorded(ctx, task, run, split)?;
    for conv in &mut out {
        dataset::strip_orchestrator_workflow_within(conv, &task.prompt, &directives);
    }
    Ok(out)
}

/// A run's conversations as recorded: the orchestrator's, then each
/// subagent's.
fn conversations_as_recorded(
    ctx: &Ctx<'_>,
    task: &Task,
    run: &RunRef,
    split: ExampleSplit,
) -> Result<Vec<Example>> {
    ctx.assert_trainable(task, "the dataset")?;
    let ledger = ctx.session.ledger();
    let mut out = Vec::new();
    let heads = std::iter::once((AgentKind::Orchestrator, Id(run.record.orchestrator.0))).chain(
        run.record
            .subagents
            .iter()
            .map(|s| (AgentKind::Subagent, Id(s.0))),
    );
    for (n, (agent, head)) in heads.enumerate() {
        let Some(t) = crate::transcript::stream_conversation(ledger, head)? else {
            continue;
        };
        // A run of an older driver is trained as it was recorded.
        let t = match ctx.exp.method.keeps_reasoning() {
            true => t,
            false => t.without_reasoning(),
        };
        let conv = Example {
            id: format!("{}#{n}", run.event.short(16)),
            run: run.event.to_hex(),
            agent,
            messages: t.messages,
            tools: t.tools,
            split,
        };
        out.push(conv);
    }
    Ok(out)
}
