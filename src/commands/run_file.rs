//! `mass run FILE [--set KEY=VALUE]...`: the experiment a run starts from,
//! with its overrides applied exactly as `mass fork --set` and `mass
//! rejudge --set` apply theirs (`Experiment::apply_override_set`), and the
//! check that an existing run of that name was started from the same
//! experiment before `mass run` goes on with it.

use std::path::Path;

use anyhow::{Context, Result};
use engine::config::Experiment;
use ledger::{Event, Ledger};

use super::CliError;

/// `--set KEY=VALUE` items as trimmed (key, value) pairs: the one parser of
/// `--set` for `run`, `fork` and `rejudge`.
pub fn split_sets(set: &[String]) -> Result<Vec<(String, String)>> {
    set.iter()
        .map(|s| match s.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(CliError::Usage(format!("--set takes KEY=VALUE, got {s:?}")).into()),
        })
        .collect()
}

/// The experiment `mass run` starts: the file's text and what it defines.
pub struct Given {
    /// What the run records as its experiment file: the file as written,
    /// or, with overrides, the experiment they give, written out whole
    /// after a comment listing them. The driver parses it again, so the
    /// definition recorded in `run.started` is the overridden one and
    /// resume, replay and forks reproduce it without the flags.
    pub text: String,
    /// The path as given (a relative `tasks_dir` resolves against it).
    pub origin: String,
    pub exp: Experiment,
}

/// Reads the experiment file and applies `set`. A bad key or value is a
/// usage error (exit 2) naming the key; nothing is written.
pub fn given(path: &Path, set: &[String]) -> Result<Given> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let origin = path.to_string_lossy().into_owned();
    let mut exp = Experiment::parse(&text, &origin)?;
    let overrides = split_sets(set)?;
    if overrides.is_empty() {
        return Ok(Given { text, origin, exp });
    }
    exp.apply_override_set(&overrides)
        .map_err(|e| CliError::Usage(format!("{e}; nothing was written")))?;
    // Each override on a comment line of its own, escaped so a value
    // holding a newline cannot end the comment.
    let mut text = format!(
        "# {} with these overrides applied (mass run --set), written out whole:\n",
        path.file_name()
            .map_or(origin.clone(), |n| n.to_string_lossy().into_owned())
    );
    for (k, v) in &overrides {
        text.push_str(&format!("# --set {:?}\n", format!("{k}={v}")));
    }
    text.push_str(&exp.canonical_toml());
    // The driver parses this text again: it must give the experiment just
    // checked, or the run would record something else than was asked.
    let again = Experiment::parse(&text, &origin)?;
    if again.definition_toml() != exp.definition_toml() {
        anyhow::bail!(
            "the experiment with --set applied does not read back as itself (a bug in mass); nothing was written"
        );
    }
    Ok(Given { text, origin, exp })
}

/// `mass run` of an existing run `run` (`first`: its `run.started`) goes
/// on with the experiment it recorded, as it always did, and says so. When
/// the file (with its --set) gives another experiment, the keys that differ
/// are named: going on with an edited file runs the recorded experiment, and
/// the user is told; with --set the run is refused (exit 2), since
/// overrides given now would be ignored, which `mass fork --set` refuses
/// too. Execution settings (concurrency, server addresses) are compared only
/// when --set is given ([`check_execution`]): an edited file's are no part
/// of the definition, and a resume uses the recorded ones. A recording this
/// build cannot read is left to the driver to report.
pub fn check_resume(
    ledger: &Ledger,
    run: &str,
    first: &Event,
    exp: &Experiment,
    (file, set): (&Path, &[String]),
) -> Result<()> {
    let recorded = engine::driver::recorded_experiment(ledger, run, first).ok();
    let keys = match recorded.map(|r| r.definition_toml()) {
        Some(was) if was != exp.definition_toml() => differing_keys(&was, &exp.definition_toml()),
        Some(_) if !set.is_empty() => return check_execution(ledger, run, first, exp, set),
        _ => {
            eprintln!(
                "run {run} exists: resuming it (the recorded experiment definition and tasks are used)"
            );
            return Ok(());
        }
    };
    let asked = set
        .iter()
        .map(|s| format!(" --set {s}"))
        .collect::<String>();
    let differ = format!(
        "run {run} exists and was started from another experiment than {}{asked} gives (they differ in {})",
        file.display(),
        if keys.is_empty() {
            "their definitions".to_string()
        } else {
            keys.join(", ")
        },
    );
    let new = format!(
        "`mass run {}{asked} --ref NEW` starts that experiment as a new run; `mass fork {run} --name NEW --set KEY=VALUE` goes on from {run} with changed settings",
        file.display()
    );
    if !set.is_empty() {
        return Err(CliError::Usage(format!(
            "{differ}: the overrides would be ignored; nothing was written. `mass resume {run}` continues it as recorded; {new}"
        ))
        .into());
    }
    eprintln!("note: {differ}: resuming it as recorded, not as the file now says; {new}");
    Ok(())
}

/// `--set` on an existing run whose definition it leaves as recorded: an
/// override of an execution setting (`concurrency`, a server's address)
/// would be ignored, since a resume executes as the run recorded, so it is
/// refused (exit 2) naming the keys.
fn check_execution(
    ledger: &Ledger,
    run: &str,
    first: &Event,
    exp: &Experiment,
    set: &[String],
) -> Result<()> {
    let was = engine::driver::recorded_execution(ledger, run, first)?.canonical_toml();
    // Only the keys --set names: the rest of the file may differ from what
    // the run recorded, as an edited file may (a resume uses the recording).
    let named: Vec<String> = split_sets(set)?.into_iter().map(|(k, _)| k).collect();
    let keys: Vec<String> = differing_keys(&was, &exp.canonical_toml())
        .into_iter()
        .filter(|d| {
            named.iter().any(|k| {
                d == k || d.starts_with(&format!("{k}.")) || k.starts_with(&format!("{d}."))
            })
        })
        .collect();
    if !keys.is_empty() {
        return Err(CliError::Usage(format!(
            "run {run} exists and records other execution settings than --set gives for {}: a resume executes as recorded, so the overrides would be ignored; nothing was written. `mass resume {run}` continues it as recorded",
            keys.join(", ")
        ))
        .into());
    }
    eprintln!(
        "run {run} exists: resuming it (the recorded experiment definition and tasks are used)"
    );
    Ok(())
}

/// Dotted keys whose values differ between two experiment definitions
/// (TOML), at most ten, for a message.
fn differing_keys(a: &str, b: &str) -> Vec<String> {
    let (Ok(a), Ok(b)) = (a.parse::<toml::Table>(), b.parse::<toml::Table>()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk("", &a, &b, &mut out);
    out.truncate(10);
    out
}

fn walk(prefix: &str, a: &toml::Table, b: &toml::Table, out: &mut Vec<String>) {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for k in keys {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match (a.get(k), b.get(k)) {
            (Some(toml::Value::Table(x)), Some(toml::Value::Table(y))) => walk(&path, x, y, out),
            (x, y) if x != y => out.push(path),
            _ => {}
        }
    }
}
