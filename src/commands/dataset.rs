//! `mass export dataset`: a cycle's recorded training data as files, after
//! the export check.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ledger::{Id, Ledger};

use super::CliError;
use crate::cli::DatasetFormat;

/// What `export dataset` needs of a `mass.dataset` record, of any version.
struct Exported {
    cycle: u32,
    train: schemas::Hash32,
    validation: schemas::Hash32,
    train_examples: u32,
    validation_examples: u32,
    /// `None`: not recorded (`ledger::NOT_RECORDED`: an imported run has
    /// no tokenizer).
    train_supervised_tokens: Option<u64>,
    validation_supervised_tokens: Option<u64>,
    /// Version 2 and later: the line provenance blob.
    provenance: Option<schemas::Hash32>,
}

pub fn export_dataset(
    l: &Ledger,
    run: &str,
    cycle: u32,
    format: DatasetFormat,
    out: &Path,
) -> Result<ExitCode> {
    let head = l.head(run)?.ok_or_else(|| {
        CliError::NotFound(format!("no run named {run:?} (`mass status` lists runs)"))
    })?;
    let found = recorded_dataset(l, head, cycle)?;
    let d = found.with_context(|| {
        format!(
            "run {run} has no dataset for cycle {cycle} (`mass status {run}` shows how far it got)"
        )
    })?;
    let train =
        String::from_utf8(l.get_blob(&Id(d.train.0))?).context("train split is not UTF-8")?;
    let val = String::from_utf8(l.get_blob(&Id(d.validation.0))?)
        .context("validation split is not UTF-8")?;
    // The export check (`leak.rs`): refuse a line that still holds its
    // run's workflow. A dataset without provenance cannot name its lines'
    // runs and is exported as recorded, with a note.
    // An imported run has no engine workflow to check against: its lines
    // are the conversations as the reference recorded them.
    let imported = super::import::is_imported(l, head)?;
    if imported {
        eprintln!(
            "note: run {run} was imported from a reference run folder: the export check is not applied \
             (its lines are the conversations as recorded, the teacher prompt included; the reference \
             substitutes the bare task prompt when it renders its own data)"
        );
    }
    if let Some(p) = d.provenance.filter(|_| !imported) {
        let prov = String::from_utf8(l.get_blob(&Id(p.0))?).context("provenance is not UTF-8")?;
        if let Some(leak) = super::leak::check(l, run, head, &train, &val, &prov)? {
            return Err(CliError::Conflict(format!(
                "{leak}; `mass why {}` shows the conversation",
                leak.conversation
            ))
            .into());
        }
    }
    let (train, val) = match format {
        DatasetFormat::Openai => (train, val),
        DatasetFormat::Trl => (
            engine::dataset::openai_to_trl(&train)?,
            engine::dataset::openai_to_trl(&val)?,
        ),
    };
    let val_path = validation_path(out);
    std::fs::write(out, &train).with_context(|| format!("cannot write {}", out.display()))?;
    std::fs::write(&val_path, &val)
        .with_context(|| format!("cannot write {}", val_path.display()))?;
    // Every file is written before anything is printed: a reader of the
    // summary that stops early must not leave the export without its
    // provenance sidecar.
    let prov_path = match d.provenance {
        Some(p) => {
            let prov_path = sidecar_path(out, "provenance");
            std::fs::write(&prov_path, l.get_blob(&Id(p.0))?)
                .with_context(|| format!("cannot write {}", prov_path.display()))?;
            Some(prov_path)
        }
        None => None,
    };
    let tokens = |n: Option<u64>| n.map_or_else(|| "not recorded".to_string(), |n| n.to_string());
    crate::output::outln!(
        "{}: {} train examples ({} supervised tokens); {}: {} validation examples ({} supervised tokens)",
        out.display(),
        d.train_examples,
        tokens(d.train_supervised_tokens),
        val_path.display(),
        d.validation_examples,
        tokens(d.validation_supervised_tokens)
    )?;
    match prov_path {
        Some(p) => crate::output::outln!(
            "{}: where each line of both files came from (rollout, conversation, selection, ranking)",
            p.display()
        )?,
        None => crate::output::outln!(
            "(no line provenance: the workflow check could not run on this dataset)\n\
             (this dataset was recorded by an older mass, without line provenance)"
        )?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The `mass.dataset` of `cycle` on the main stream ending at `head` (the
/// last one recorded for it), of either version (version 1 datasets carry
/// no provenance).
fn recorded_dataset(l: &Ledger, head: Id, cycle: u32) -> Result<Option<Exported>> {
    for ev in l.chain(head) {
        let ev = ev?;
        if ev.kind != "mass.dataset" {
            continue;
        }
        let d = if ev.version == 1 {
            let d: schemas::DatasetV1 = schemas::decode_event(&ev)?;
            Exported {
                cycle: d.cycle,
                train: d.train,
                validation: d.validation,
                train_examples: d.train_examples,
                validation_examples: d.validation_examples,
                train_supervised_tokens: Some(d.train_supervised_tokens),
                validation_supervised_tokens: Some(d.validation_supervised_tokens),
                provenance: None,
            }
        } else {
            let d: schemas::Dataset = schemas::decode_event(&ev)?;
            if d.cycle != cycle {
                continue;
            }
            let meta = l.get_meta(&ev.id)?;
            let recorded = |field: &str, n: u64| (!meta.not_recorded(field)).then_some(n);
            Exported {
                cycle: d.cycle,
                train: d.train,
                validation: d.validation,
                train_examples: d.train_examples,
                validation_examples: d.validation_examples,
                train_supervised_tokens: recorded(
                    "train_supervised_tokens",
                    d.train_supervised_tokens,
                ),
                validation_supervised_tokens: recorded(
                    "validation_supervised_tokens",
                    d.validation_supervised_tokens,
                ),
                provenance: Some(d.provenance),
            }
        };
        if d.cycle == cycle {
            return Ok(Some(d));
        }
    }
    Ok(None)
}

fn validation_path(out: &Path) -> std::path::PathBuf {
    sidecar_path(out, "validation")
}

/// `dir/name.jsonl` -> `dir/name.<what>.jsonl`.
fn sidecar_path(out: &Path, what: &str) -> std::path::PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "dataset".into());
    let ext = out
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    out.with_file_name(format!("{stem}.{what}{ext}"))
}
