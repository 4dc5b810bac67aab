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
                let convs = run_conversations(ctx, task, run, split)?;
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

/// The orchestrator and subagent conversations of a selected run, the
/// orchestrator's first prompt stripped to the bare task.
pub(crate) fn run_conversations(
    ctx: &Ctx<'_>,
    task: &Task,
    run: &RunRef,
    split: ExampleSplit,
) -> Result<Vec<Example>> {
    ctx.assert_trainable(task, "the dataset")?;
    let ledger = ctx.session.ledger();
    let directives = [
        crate::prompts::directive(&task.id, &task.deliverables),
        crate::prompts::external_directive(&task.id, &task.deliverables),
    ];
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
        let mut conv = Example {
            id: format!("{}#{n}", run.event.short(16)),
            run: run.event.to_hex(),
            agent,
            messages: t.messages,
            tools: t.tools,
            split,
        };
        dataset::strip_orchestrator_workflow_within(&mut conv, &task.prompt, &directives);
        out.push(conv);
    }
    Ok(out)
}
