//! Whole datasets: the train and validation JSONL texts rendered in memory
//! (for the ledger) or written to disk, with the checks only a whole
//! dataset allows (repeated conversations, runs in both splits), and the
//! conversion of an OpenAI-format dataset to TRL's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::arguments::warnings;
use super::parse::parse_openai_line;
use super::render::{to_line, to_trl_line};
use super::tokens::supervised_tokens;
use super::{AgentKind, DatasetError, DatasetSummary, Example, ExampleSplit, Format};

/// Renders the train and validation JSONL texts (one line per conversation, each
/// ending in `\n`, in input order) without touching disk, so the engine can store
/// the exact bytes in the ledger. Fails on the first invalid conversation, on a
/// repeated conversation id (it would double an example's weight) and on a run
/// whose conversations sit in both splits (it would leak training data into the
/// validation loss). Non-fatal problems go to `warnings`, including an empty split.
pub fn render_dataset(
    conversations: &[Example],
    format: Format,
) -> Result<(String, String, DatasetSummary), DatasetError> {
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut run_split: BTreeMap<&str, (ExampleSplit, &str)> = BTreeMap::new();
    for conv in conversations {
        if !seen.insert(&conv.id) {
            return Err(DatasetError::DuplicateConversation(conv.id.clone()));
        }
        match run_split.get(conv.run.as_str()) {
            Some(&(split, other)) if split != conv.split => {
                let (train, validation) = match conv.split {
                    ExampleSplit::Train => (conv.id.clone(), other.to_owned()),
                    ExampleSplit::Validation => (other.to_owned(), conv.id.clone()),
                };
                return Err(DatasetError::RunInBothSplits {
                    run: conv.run.clone(),
                    train,
                    validation,
                });
            }
            Some(_) => {}
            None => {
                run_split.insert(&conv.run, (conv.split, &conv.id));
            }
        }
    }

    let (mut train, mut validation) = (String::new(), String::new());
    let mut summary = DatasetSummary::default();
    for conv in conversations {
        let line = to_line(conv, format)?;
        let tokens = supervised_tokens(conv);
        let (text, examples, supervised) = match conv.split {
            ExampleSplit::Train => (
                &mut train,
                &mut summary.train_examples,
                &mut summary.train_supervised_tokens,
            ),
            ExampleSplit::Validation => (
                &mut validation,
                &mut summary.validation_examples,
                &mut summary.validation_supervised_tokens,
            ),
        };
        text.push_str(&line);
        text.push('\n');
        *examples += 1;
        *supervised += tokens;
        summary.warnings.extend(warnings(conv, format));
    }
    if summary.train_examples == 0 {
        summary.warnings.push("no training examples".to_owned());
    }
    if summary.validation_examples == 0 {
        summary
            .warnings
            .push("no validation examples: checkpoint selection has no loss to use".to_owned());
    }
    Ok((train, validation, summary))
}

/// Renders (see [`render_dataset`]) and writes the two JSONL files: trainers take
/// train and validation data separately. Each file is written to `<path>.tmp` and
/// renamed, so a crash never leaves a truncated file under the final name.
pub fn write_dataset(
    conversations: &[Example],
    format: Format,
    train_path: &Path,
    validation_path: &Path,
) -> Result<DatasetSummary, DatasetError> {
    if train_path == validation_path {
        return Err(DatasetError::SamePath(train_path.to_owned()));
    }
    let (train, validation, summary) = render_dataset(conversations, format)?;
    write_file(train_path, &train)?;
    write_file(validation_path, &validation)?;
    Ok(summary)
}

fn write_file(path: &Path, text: &str) -> Result<(), DatasetError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let io = |source| DatasetError::Io {
        path: path.to_owned(),
        source,
    };
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Converts a dataset in OpenAI's format to TRL's, line by line (the same
/// conversations; arguments become objects).
pub fn openai_to_trl(jsonl: &str) -> Result<String, DatasetError> {
    let mut out = String::new();
    for (i, line) in jsonl
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let p = parse_openai_line(line)?;
        let conv = Example {
            id: format!("line-{}", i + 1),
            run: String::new(),
            agent: if p.tools.iter().any(|t| t.function.name == "delegate") {
                AgentKind::Orchestrator
            } else {
                AgentKind::Subagent
            },
            messages: p.messages,
            tools: p.tools,
            split: ExampleSplit::Train,
        };
        out.push_str(&to_trl_line(&conv)?);
        out.push('\n');
    }
    Ok(out)
}
