//! `mass rejudge` of a run imported from the reference implementation
//! (`engine::rejudge_imported`): the `--judge` file alone defines the judge (the
//! run defines no backends), one cycle is re-judged, and nothing after it
//! runs. Prints what moved, as a re-judge of the engine's own runs does.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use engine::rejudge_imported::{JudgeDef, RejudgeError, Request};
use ledger::Ledger;

use super::runs::{keep_report_facts, progress, what_moved, RejudgeOptions};
use super::{engine_error, CliError};

/// Re-judges cycle `opts.cycle` of the imported run `source` as `name`.
pub fn imported(
    ledger: &Arc<Ledger>,
    source: &str,
    name: &str,
    opts: &RejudgeOptions,
    quiet: bool,
) -> Result<ExitCode> {
    let usage = |m: String| -> anyhow::Error {
        CliError::Usage(format!("{m}; nothing was written")).into()
    };
    let Some(cycle) = opts.cycle else {
        return Err(usage(format!(
            "run {source} was imported from a reference run folder, which holds one cycle: re-judge it with --cycle C"
        )));
    };
    if cycle == 0 {
        return Err(usage("cycles are numbered from 1".into()));
    }
    if opts.through_training {
        return Err(usage(format!(
            "run {source} was imported: no engine can train or evaluate it, so a re-judge stops at the cycle's selections (drop --through-training)"
        )));
    }
    if !opts.set.is_empty() {
        return Err(usage(format!(
            "run {source} was imported and defines no experiment for --set to change; the --judge file is the whole change"
        )));
    }
    let judge = judge_def(source, opts.judge.as_deref()).map_err(usage)?;
    let req = Request {
        source,
        name,
        cycle,
        judge,
    };
    // What continues this re-judge: the same command (`mass resume`
    // refuses a run that starts as an imported one).
    let again = format!(
        "the same `mass rejudge {source} --cycle {cycle} --judge {} --name {name}` continues it (recorded verdicts served, the rest asked)",
        opts.judge.as_deref().unwrap_or_default()
    );
    crate::interrupt::say_on_sigint(format!(
        "\ninterrupted: re-judge {name} stops here; everything it recorded is kept. {again}\n"
    ));
    let progress = progress(quiet);
    let done = engine::rejudge_imported::rejudge(ledger, &req, progress.as_ref())
        .map_err(|e| rejudge_error(e, &again))?;
    keep_report_facts(ledger, name);
    let mut out = crate::output::stdout();
    writeln!(
        out,
        "run {name}: {} comparison(s) of {} task(s) judged by {} ({} served from an earlier attempt), head {}",
        done.comparisons, done.tasks, req.judge.name, done.served, done.head
    )?;
    for line in what_moved(ledger, source, name, cycle)? {
        writeln!(out, "{line}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The judge a `--judge` file defines: exactly one `[backends.NAME]` table.
fn judge_def(source: &str, judge: Option<&str>) -> std::result::Result<JudgeDef, String> {
    let Some(path) = judge else {
        return Err(format!(
            "run {source} was imported and defines no backends: give the judge as a file, --judge FILE with one [backends.NAME] table"
        ));
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!("--judge {path}: cannot read it as a file ({e}); an imported run defines no backend to name instead")
    })?;
    // Checked as the engine checks a judge file (one backend, nothing
    // else, a valid definition), then read as that definition.
    let (name, _) = engine::config::backend_override(&text, path)
        .map_err(|e| format!("--judge {path}: {e}"))?;
    let def = text
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("backends"))
        .and_then(|b| b.get(&name).cloned())
        .ok_or_else(|| format!("--judge {path}: no [backends.{name}] table"))?;
    let backend = def.try_into().map_err(|e: toml::de::Error| {
        format!("--judge {path}: [backends.{name}]: {}", e.message())
    })?;
    Ok(JudgeDef { name, backend })
}

/// `again`: what continues the re-judge, said where the engine's own
/// message would say `mass resume`.
fn rejudge_error(e: RejudgeError, again: &str) -> anyhow::Error {
    use engine::error::EngineError;
    match e {
        RejudgeError::Refused(why) => CliError::Usage(why).into(),
        e @ RejudgeError::NameTaken { .. } => CliError::Conflict(e.to_string()).into(),
        RejudgeError::Engine(EngineError::Infrastructure { what, detail }) => {
            CliError::Stopped(format!(
                "{what} failed: {detail} (an infrastructure failure: the attempt is recorded; fix the cause, then {again})"
            ))
            .into()
        }
        RejudgeError::Engine(e) => engine_error(e),
        RejudgeError::Replay(replay::ReplayError::Ledger(le)) | RejudgeError::Ledger(le) => {
            anyhow::Error::new(le)
        }
        other => anyhow::anyhow!("{other}"),
    }
}
