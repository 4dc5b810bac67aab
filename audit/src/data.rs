//! `mass why` for what training produced and consumed: a trained model (by
//! name or by its `mass.training` event), a recorded dataset (its
//! `mass.dataset` event), and one line of an exported dataset file (through
//! the `*.provenance.jsonl` sidecar `mass export dataset` writes beside
//! it). From a model the chain runs back through the training step to the
//! dataset, its selections and every example's rollout and conversation;
//! from a dataset line to the one rollout whose conversation it is (the
//! rollout's own chain is then `audit::why`).
//!
//! Model names are not ids, so a name is found by reading the main stream
//! of every run (tens of events each), never the whole log; everything
//! after that is a direct read or a referrers lookup.

use std::path::{Path, PathBuf};

use ledger::{Event, Id, Ledger};
use schemas::{Dataset, Training};
use serde::Serialize;
use serde_json::Value;

use super::{decode, hex, id_of, referrers_of};
use engine::error::{EngineError, Result};

/// Why a trained model exists: the step that made it and the data it saw.
#[derive(Debug, Clone, Serialize)]
pub struct ModelWhy {
    pub model: String,
    /// Runs whose main stream records the training step (a fork shares
    /// its source's steps up to the fork point).
    pub runs: Vec<String>,
    pub training: TrainingStep,
    pub dataset: DatasetWhy,
    /// Cycles (of the runs above) whose team, judge and optimizer ran the
    /// model, from the cycle records.
    pub used_by_cycles: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrainingStep {
    pub event: String,
    pub cycle: u32,
    pub base_model: String,
    pub new_model: String,
    /// The trainer command as recorded (placeholders unexpanded), or
    /// `builtin:sim`.
    pub command: String,
    /// `None`: not recorded (`ledger::NOT_RECORDED`, an imported run).
    pub exit_status: Option<i32>,
    pub checkpoint: String,
    pub validation_loss: f64,
    /// The trainer's output directory as a tree (`mass checkout` it) and
    /// its log blob.
    pub output: String,
    pub log: String,
    pub effect: String,
}

/// A recorded dataset: what it holds and where each example came from.
#[derive(Debug, Clone, Serialize)]
pub struct DatasetWhy {
    pub event: String,
    pub cycle: u32,
    pub format: String,
    pub train_blob: String,
    pub validation_blob: String,
    pub train_examples: u32,
    pub validation_examples: u32,
    /// `None`: not recorded (an imported run has no tokenizer).
    pub train_supervised_tokens: Option<u64>,
    pub validation_supervised_tokens: Option<u64>,
    pub selections: Vec<String>,
    pub examples: Vec<ExampleOrigin>,
    /// The training step that consumed it, if one did.
    pub trained_by: Option<String>,
}

/// One line of a dataset and the conversation it was made from.
#[derive(Debug, Clone, Serialize)]
pub struct ExampleOrigin {
    /// `train` or `validation`.
    pub file: String,
    pub line: u64,
    pub rollout: String,
    pub conversation: String,
    pub agent: String,
    pub task: String,
    pub selection: String,
    pub ranking: String,
}

/// A line of an exported dataset file, matched to the ledger.
#[derive(Debug, Clone, Serialize)]
pub struct LineWhy {
    pub path: String,
    pub sidecar: String,
    /// `train` or `validation`.
    pub file: String,
    pub line: u64,
    pub dataset: String,
    pub rollout: String,
    pub conversation: String,
    pub agent: String,
    /// `openai` or `trl` when the file's line is, byte for byte, the
    /// recorded line in that format; `differs` when it is neither (the file
    /// was edited after export, or belongs to another dataset).
    pub content: String,
}

fn training_step(ev: &Event, t: &Training, meta: &ledger::Meta) -> TrainingStep {
    TrainingStep {
        event: hex(&ev.id),
        cycle: t.cycle,
        base_model: t.base_model.clone(),
        new_model: t.new_model.clone(),
        command: t.command.clone(),
        exit_status: (!meta.not_recorded("exit_status")).then_some(t.exit_status),
        checkpoint: t.checkpoint.clone(),
        validation_loss: t.validation_loss,
        output: hex(&id_of(t.output)),
        log: hex(&id_of(t.log)),
        effect: hex(&id_of(t.effect)),
    }
}

/// The names of every run (a ref with no `/` whose stream starts with
/// `run.started`), sorted.
fn run_names(l: &Ledger) -> Result<Vec<(String, Id)>> {
    Ok(l.refs()?
        .into_iter()
        .filter(|(name, _)| !name.contains('/'))
        .collect())
}

/// The training step that produced model `name`, and the runs recording
/// it; None when no run trained a model of that name.
pub fn find_model(l: &Ledger, name: &str) -> Result<Option<(Id, Vec<String>)>> {
    let mut found: Option<Id> = None;
    let mut runs = Vec::new();
    for (run, head) in run_names(l)? {
        for ev in l.chain(head) {
            let ev = ev?;
            if let Some(t) = Training::read(&ev) {
                let t = t.map_err(|e| EngineError::recording("mass.training", e))?;
                if t.new_model == name && found.is_none_or(|f| f == ev.id) {
                    found = Some(ev.id);
                    runs.push(run.clone());
                }
            }
        }
    }
    Ok(found.map(|id| (id, runs)))
}

/// Why the model trained by training event `id` exists.
pub fn model_why(l: &Ledger, id: Id, runs: Vec<String>) -> Result<ModelWhy> {
    let ev = l.get_event(&id)?;
    let t = Training::read(&ev)
        .ok_or_else(|| EngineError::Invalid(format!("{} is not a training step", id.short(12))))?
        .map_err(|e| EngineError::recording("mass.training", e))?;
    let dataset = dataset_why(l, id_of(t.dataset))?;
    let mut used_by_cycles = Vec::new();
    for run in &runs {
        let Some(head) = l.head(run)? else { continue };
        let mut main: Vec<Event> = l.chain(head).collect::<std::result::Result<_, _>>()?;
        main.reverse();
        for c in engine::status::fold(&main)?.cycles {
            if c.model == t.new_model {
                used_by_cycles.push(format!("{run} cycle {}", c.cycle));
            }
        }
    }
    Ok(ModelWhy {
        model: t.new_model.clone(),
        runs,
        training: training_step(&ev, &t, &l.get_meta(&ev.id)?),
        dataset,
        used_by_cycles,
    })
}

/// A recorded dataset (event `id`): its counts, selections, the origin of
/// every line (its provenance blob) and the step that trained on it.
pub fn dataset_why(l: &Ledger, id: Id) -> Result<DatasetWhy> {
    let ev = l.get_event(&id)?;
    let d: Dataset = decode(&ev)?;
    let meta = l.get_meta(&id)?;
    let recorded = |field: &str, n: u64| (!meta.not_recorded(field)).then_some(n);
    let mut examples = Vec::new();
    for v in provenance(l, &d)? {
        let rollout = v["rollout"].as_str().unwrap_or_default().to_string();
        let task = match rollout.parse::<Id>().ok() {
            Some(r) => decode::<schemas::Rollout>(&l.get_event(&r)?)?.task,
            None => String::new(),
        };
        examples.push(ExampleOrigin {
            file: v["file"].as_str().unwrap_or_default().into(),
            line: v["line"].as_u64().unwrap_or(0),
            rollout,
            conversation: v["conversation"].as_str().unwrap_or_default().into(),
            agent: v["agent"].as_str().unwrap_or_default().into(),
            task,
            selection: v["selection"].as_str().unwrap_or_default().into(),
            ranking: v["ranking"].as_str().unwrap_or_default().into(),
        });
    }
    let trained_by = super::trainings_of(l, &id)?
        .into_iter()
        .last()
        .map(|(tev, _)| hex(&tev.id));
    Ok(DatasetWhy {
        event: hex(&id),
        cycle: d.cycle,
        format: d.format.clone(),
        train_blob: hex(&id_of(d.train)),
        validation_blob: hex(&id_of(d.validation)),
        train_examples: d.train_examples,
        validation_examples: d.validation_examples,
        train_supervised_tokens: recorded("train_supervised_tokens", d.train_supervised_tokens),
        validation_supervised_tokens: recorded(
            "validation_supervised_tokens",
            d.validation_supervised_tokens,
        ),
        selections: d.selections.iter().map(|s| hex(&id_of(*s))).collect(),
        examples,
        trained_by,
    })
}

fn provenance(l: &Ledger, d: &Dataset) -> Result<Vec<Value>> {
    let text = l.get_blob(&id_of(d.provenance))?;
    String::from_utf8_lossy(&text)
        .lines()
        .map(|line| serde_json::from_str(line).map_err(|e| EngineError::recording("provenance", e)))
        .collect()
}

/// `dir/name.validation.jsonl` -> (`dir/name.provenance.jsonl`,
/// `validation`); `dir/name.jsonl` -> (`dir/name.provenance.jsonl`,
/// `train`): the names `mass export dataset --out dir/name.jsonl` writes.
pub fn sidecar_of(path: &Path) -> (PathBuf, &'static str) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (stem, ext) = match name.rfind('.') {
        Some(i) if i > 0 => (name[..i].to_string(), name[i..].to_string()),
        _ => (name.clone(), String::new()),
    };
    let (base, file) = match stem.strip_suffix(".validation") {
        Some(b) => (b.to_string(), "validation"),
        None => (stem, "train"),
    };
    (path.with_file_name(format!("{base}.provenance{ext}")), file)
}

/// Line `line` (1-based) of exported dataset file `path`, matched through
/// its provenance sidecar to the recorded dataset and the rollout it came
/// from; the line's bytes are compared with the recorded line.
pub fn line_why(l: &Ledger, path: &Path, line: u64) -> Result<LineWhy> {
    let (sidecar, file) = sidecar_of(path);
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|e| {
            EngineError::NotFound(format!(
                "cannot read {}: {e}{}",
                p.display(),
                if p == sidecar {
                    " (`mass export dataset` writes this provenance sidecar beside the dataset files)"
                } else {
                    ""
                }
            ))
        })
    };
    let text = read(path)?;
    let lines: Vec<&str> = text.lines().collect();
    let Some(content) = line.checked_sub(1).and_then(|i| lines.get(i as usize)) else {
        return Err(EngineError::NotFound(format!(
            "{} has {} line(s); there is no line {line}",
            path.display(),
            lines.len()
        )));
    };
    let origin = read(&sidecar)?
        .lines()
        .map(serde_json::from_str::<Value>)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| EngineError::Invalid(format!("{}: not JSON lines: {e}", sidecar.display())))?
        .into_iter()
        .find(|v| v["file"] == file && v["line"].as_u64() == Some(line))
        .ok_or_else(|| {
            EngineError::NotFound(format!(
                "{} names no {file} line {line}: it does not belong to {}",
                sidecar.display(),
                path.display()
            ))
        })?;
    let field = |k: &str| -> Result<Id> {
        origin[k]
            .as_str()
            .and_then(|s| s.parse::<Id>().ok())
            .ok_or_else(|| EngineError::Invalid(format!("{}: no {k} id", sidecar.display())))
    };
    let (rollout, selection) = (field("rollout")?, field("selection")?);
    // The dataset that read this selection and recorded this very line.
    let mut best: Option<(Event, Dataset)> = None;
    for (dev, d) in referrers_of::<Dataset>(l, &selection)? {
        let holds = provenance(l, &d)?.iter().any(|v| {
            v["file"] == file
                && v["line"].as_u64() == Some(line)
                && v["rollout"] == origin["rollout"]
        });
        if holds {
            best = Some((dev, d));
        }
    }
    let (dev, d) = best.ok_or_else(|| {
        EngineError::NotFound(format!(
            "no dataset in this ledger records {file} line {line} from rollout {} (was the file exported from another ledger?)",
            rollout.short(12)
        ))
    })?;
    let recorded = l.get_blob(&id_of(if file == "train" {
        d.train
    } else {
        d.validation
    }))?;
    let recorded = String::from_utf8_lossy(&recorded).into_owned();
    let nth = |s: &str| s.lines().nth(line as usize - 1).map(str::to_string);
    let matches = if nth(&recorded).as_deref() == Some(*content) {
        "openai"
    } else if engine::dataset::openai_to_trl(&recorded)
        .ok()
        .and_then(|t| nth(&t))
        .as_deref()
        == Some(*content)
    {
        "trl"
    } else {
        "differs"
    };
    Ok(LineWhy {
        path: path.display().to_string(),
        sidecar: sidecar.display().to_string(),
        file: file.into(),
        line,
        dataset: hex(&dev.id),
        rollout: hex(&rollout),
        conversation: origin["conversation"].as_str().unwrap_or_default().into(),
        agent: origin["agent"].as_str().unwrap_or_default().into(),
        content: matches.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sidecar_is_named_as_export_names_it() {
        assert_eq!(
            sidecar_of(Path::new("/d/train.jsonl")),
            (PathBuf::from("/d/train.provenance.jsonl"), "train")
        );
        assert_eq!(
            sidecar_of(Path::new("/d/train.validation.jsonl")),
            (PathBuf::from("/d/train.provenance.jsonl"), "validation")
        );
        assert_eq!(
            sidecar_of(Path::new("data")),
            (PathBuf::from("data.provenance"), "train")
        );
    }
}
