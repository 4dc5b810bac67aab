//! `mass why`: the evidence chain of a rollout, as text or one JSON document
//! (`audit` walks the ledger's referrers index; this renders it).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use audit::Why;
use ledger::Ledger;

use super::resolve;

pub fn why(l: &Ledger, what: &str, json: bool, run: Option<&str>) -> Result<ExitCode> {
    if let Some(r) = run {
        if !is_run(l, r)? {
            anyhow::bail!(super::CliError::NotFound(format!(
                "no run named {r:?} (`mass status` lists runs)"
            )));
        }
    }
    // `FILE:LINE`: a line of an exported dataset file.
    if let Some((file, line)) = what.rsplit_once(':') {
        if let (true, Ok(line)) = (Path::new(file).is_file(), line.parse::<u64>()) {
            return why_line(l, Path::new(file), line, json, run);
        }
    }
    // `<rollout>#<n>` names one conversation of a rollout.
    let (prefix, conversation) = match what.split_once('#') {
        Some((p, n)) => (p, Some(n)),
        None => (what, None),
    };
    let id = match resolve(l, prefix) {
        Ok(id) => id,
        Err(e) => {
            // Not an id or a ref: perhaps a trained model's name.
            return match audit::data::find_model(l, what).map_err(super::engine_error)? {
                Some((training, runs)) => why_model(l, training, runs, json),
                None => Err(e),
            };
        }
    };
    let kind = l.get_event(&id).map(|e| e.kind).unwrap_or_default();
    if kind == "mass.training" {
        return why_model(l, id, Vec::new(), json);
    }
    if kind == "mass.dataset" {
        let d = audit::data::dataset_why(l, id).map_err(super::engine_error)?;
        return emit(&d, dataset_text(&d), json);
    }
    let rollout = audit::find_rollout(l, &id.to_hex()).map_err(super::engine_error)?;
    let w = rollout_why(l, rollout, conversation, run)?;
    emit(&w, text(&w), json)
}

/// The chain of `rollout`, narrowed to conversation `#n` when one is named.
fn rollout_why(
    l: &Ledger,
    rollout: ledger::Id,
    conversation: Option<&str>,
    run: Option<&str>,
) -> Result<Why> {
    let mut w = audit::why_in(l, rollout, run).map_err(super::engine_error)?;
    if let Some(n) = conversation {
        let name = format!("{}#{n}", rollout.short(16));
        w.agents.retain(|a| a.conversation == name);
        w.dataset_lines.retain(|d| d.conversation == name);
        if w.agents.is_empty() {
            anyhow::bail!(super::CliError::NotFound(format!(
                "rollout {} has no conversation #{n}",
                rollout.short(12)
            )));
        }
    }
    Ok(w)
}

/// Writes `value` as one JSON document, or `lines` as text.
fn emit<T: serde::Serialize>(value: &T, lines: Vec<String>, json: bool) -> Result<ExitCode> {
    let mut out = crate::output::stdout();
    if json {
        serde_json::to_writer_pretty(&mut out, value)?;
        writeln!(out)?;
    } else {
        for line in lines {
            writeln!(out, "{line}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `mass why FILE:LINE`: the line's origin, then its conversation's chain.
fn why_line(l: &Ledger, path: &Path, line: u64, json: bool, run: Option<&str>) -> Result<ExitCode> {
    let lw = audit::data::line_why(l, path, line).map_err(super::engine_error)?;
    let rollout: ledger::Id = lw.rollout.parse()?;
    let n = lw.conversation.rsplit_once('#').map(|(_, n)| n.to_string());
    let w = rollout_why(l, rollout, n.as_deref(), run)?;
    let mut lines = vec![
        format!(
            "{} line {}: {} line {} of dataset {} ({}), conversation {} ({}) of rollout {} (from {})",
            lw.path,
            lw.line,
            lw.file,
            lw.line,
            short(&lw.dataset),
            match lw.content.as_str() {
                "differs" => "the line DIFFERS from the recorded one: edited after export, or another dataset's file".to_string(),
                f => format!("the line is the recorded one, {f} format"),
            },
            lw.conversation,
            lw.agent,
            short(&lw.rollout),
            lw.sidecar
        ),
        String::new(),
    ];
    lines.extend(text(&w));
    emit(
        &serde_json::json!({"dataset_line": lw, "rollout": w}),
        lines,
        json,
    )
}

fn why_model(l: &Ledger, training: ledger::Id, runs: Vec<String>, json: bool) -> Result<ExitCode> {
    let m = audit::data::model_why(l, training, runs).map_err(super::engine_error)?;
    let t = &m.training;
    let mut lines = vec![
        format!(
            "model {}: trained in cycle {} from {} (event {}){}",
            m.model,
            t.cycle,
            t.base_model,
            short(&t.event),
            if m.runs.is_empty() {
                String::new()
            } else {
                format!(", recorded by run(s) {}", m.runs.join(", "))
            }
        ),
        format!(
            "  trainer: {} (exit {})",
            t.command,
            or_unrecorded(t.exit_status)
        ),
        format!(
            "  chosen checkpoint {} with validation loss {:.4}; output tree {} (`mass checkout {} DIR`), log {}",
            t.checkpoint,
            t.validation_loss,
            short(&t.output),
            short(&t.output),
            short(&t.log)
        ),
    ];
    if m.used_by_cycles.is_empty() {
        lines.push(format!(
            "  no later cycle of these runs played it (cycle {}'s evaluation compared its runs with the base model's)",
            t.cycle
        ));
    } else {
        lines.push(format!("  used by {}", m.used_by_cycles.join(", ")));
    }
    lines.extend(dataset_text(&m.dataset));
    emit(&m, lines, json)
}

/// A figure, or `not recorded` where its record's source did not record
/// it (`ledger::NOT_RECORDED`).
fn or_unrecorded<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "not recorded".to_string(), |v| v.to_string())
}

/// A rollout's checks, `passed/total`, or `not recorded` (an imported
/// run: its source ran no checks, `ledger::NOT_RECORDED`).
fn checks(passed: Option<u32>, total: Option<u32>) -> String {
    match (passed, total) {
        (Some(p), Some(t)) => format!("{p}/{t}"),
        _ => "not recorded".to_string(),
    }
}

fn dataset_text(d: &audit::data::DatasetWhy) -> Vec<String> {
    let mut lines = vec![
        format!(
            "dataset {} (cycle {}, recorded as {}): {} train example(s), {} supervised tokens; {} validation example(s), {} supervised tokens",
            short(&d.event),
            d.cycle,
            d.format,
            d.train_examples,
            or_unrecorded(d.train_supervised_tokens),
            d.validation_examples,
            or_unrecorded(d.validation_supervised_tokens)
        ),
        format!(
            "  selections: {}; trained by: {}",
            d.selections.iter().map(|s| short(s)).collect::<Vec<_>>().join(", "),
            d.trained_by.as_deref().map_or("no training step", short)
        ),
    ];
    for e in &d.examples {
        lines.push(format!(
            "  {} line {}: task {}, rollout {}, conversation {} ({}), selection {}, ranking {}",
            e.file,
            e.line,
            e.task,
            short(&e.rollout),
            e.conversation,
            e.agent,
            short(&e.selection),
            short(&e.ranking)
        ));
    }
    lines.push("(`mass why ROLLOUT` for any rollout's full chain)".into());
    lines
}

fn short(hex: &str) -> &str {
    &hex[..hex.len().min(12)]
}

/// The chain as lines, each naming the stage that recorded it
/// (`engine::milestone::Stage`) and the event it comes from.
fn text(w: &Why) -> Vec<String> {
    let mut l = rollout_lines(&w.rollout);
    guard_and_workflow_lines(w, &mut l);
    decision_lines(w, &mut l);
    l
}

/// The rollout itself: what ran, how it ended, where its workspace is.
fn rollout_lines(r: &audit::RolloutFacts) -> Vec<String> {
    vec![
        format!(
            "rollout {} ({} run {} of task {}, cycle {}) in stream {}",
            short(&r.event),
            r.purpose,
            r.index,
            r.task,
            r.cycle,
            r.stream
        ),
        format!(
            "  status {}{}; checks {}; {} delegation(s), {} turn(s), {} prompt + {} completion tokens; models {} / {}",
            r.status,
            if r.detail.is_empty() { String::new() } else { format!(" ({})", r.detail) },
            checks(r.checks_passed, r.checks_total),
            r.delegations,
            r.turns,
            r.prompt_tokens,
            r.completion_tokens,
            r.orchestrator_model,
            r.subagent_model
        ),
        workspace_line(r),
    ]
}

/// Where the rollout's final workspace is. The zero id is not recorded (a
/// run imported from a reference run folder without the episode's
/// workspace, and an import's checks); a stand-in tree (`tree_from`) says
/// where it came from, and which of its files were scrubbed.
fn workspace_line(r: &audit::RolloutFacts) -> String {
    let zero = |h: &str| h.bytes().all(|b| b == b'0');
    let checks = if zero(&r.validation) {
        "not recorded".to_string()
    } else {
        short(&r.validation).to_string()
    };
    if zero(&r.tree) {
        return if zero(&r.validation) {
            "  final workspace and checks output not recorded (imported run)".to_string()
        } else {
            format!("  final workspace not recorded, checks output {checks}")
        };
    }
    let from = match &r.tree_from {
        Some(from) => {
            format!(" from the {from}, not proven to be the workspace at the episode's end")
        }
        None => String::new(),
    };
    let scrubbed = match r.tree_scrubbed.len() {
        0 => String::new(),
        n => {
            // The first few named; `why --json` lists them all.
            let mut names = r.tree_scrubbed[..n.min(10)].join(", ");
            if n > 10 {
                names.push_str(&format!(" and {} more (`why --json`)", n - 10));
            }
            format!("; {n} file(s) recorded with a credential replaced by REDACTED, not as the folder holds them: {names}")
        }
    };
    // A recorded tree keeps the line it always had; marks end in `;`.
    let sep = if from.is_empty() && scrubbed.is_empty() {
        ","
    } else {
        ";"
    };
    format!(
        "  final workspace tree {} (`mass checkout {} DIR`){from}{scrubbed}{sep} checks output {checks}",
        short(&r.tree),
        short(&r.tree),
    )
}

/// The guards' finding, the workflow (and the search step that made it
/// champion) and each agent's conversation.
fn guard_and_workflow_lines(w: &Why, l: &mut Vec<String>) {
    match &w.guard {
        Some(g) if g.violations.is_empty() => l.push(format!(
            "guards: nothing flagged (event {})",
            short(&g.event)
        )),
        Some(g) => l.push(format!(
            "guards: {} — action {} (event {})",
            g.violations.join("; "),
            g.action,
            short(&g.event)
        )),
        None => l.push("guards: no guard record".into()),
    }
    let wf = &w.workflow;
    if wf.bare {
        l.push(format!(
            "search: workflow none, the bare task (blob {})",
            short(&wf.blob)
        ));
    } else {
        l.push(format!(
            "search: workflow blob {} (`mass cat {}`)",
            short(&wf.blob),
            short(&wf.blob)
        ));
        if let Some(p) = &wf.proposal {
            l.push(format!("  {} (event {})", p.summary, short(&p.event)));
        }
        match &wf.promotion {
            Some(m) => l.push(format!(
                "  made champion at iteration {} (candidate run {}){}: {} (event {}; {} judgment(s))",
                m.iteration,
                short(&m.candidate_run),
                if m.beat_reference {
                    ", beating the bare-task reference"
                } else {
                    ""
                },
                m.reason,
                short(&m.event),
                m.judgments.len()
            )),
            None => l.push("  no accepted promotion of it before this rollout".into()),
        }
    }
    for a in &w.agents {
        l.push(format!(
            "conversation {} (stream head {}): {} tool call(s)",
            a.conversation,
            short(&a.stream_head),
            a.tool_calls.len()
        ));
        for c in &a.tool_calls {
            l.push(format!("  {c}"));
        }
    }
}

/// The stages after collection: judge, rank, select, dataset, train.
fn decision_lines(w: &Why, l: &mut Vec<String>) {
    l.push(format!("judge: {} judgment(s)", w.judgments.len()));
    for j in &w.judgments {
        l.push(format!(
            "  {} vs {} (shown {}): {} — judge {} (event {}): {}",
            j.outcome,
            short(&j.opponent),
            if j.shown_first { "first" } else { "second" },
            j.stream,
            j.judge_model,
            short(&j.event),
            j.rationale
        ));
    }
    match &w.ranking {
        Some(k) => l.push(format!(
            "rank: rank {} of {}, Bradley-Terry score {:.3} ({}-{}-{} W-L-T; prior {}, {} iteration(s){}) (event {})",
            k.rank,
            k.of,
            k.score,
            k.wins,
            k.losses,
            k.ties,
            k.prior,
            k.iterations,
            if k.converged { "" } else { ", not converged" },
            short(&k.event)
        )),
        None => l.push("rank: not ranked (only collected runs are)".into()),
    }
    if let Some(s) = &w.selection {
        l.push(format!(
            "select: {} — {} (event {})",
            s.decision,
            s.why,
            short(&s.event)
        ));
    }
    for d in &w.dataset_lines {
        l.push(format!(
            "dataset: cycle {} {} file line {} ({}, conversation {}) (event {})",
            d.cycle,
            d.file,
            d.line,
            d.agent,
            d.conversation,
            short(&d.dataset)
        ));
    }
    if let Some(t) = &w.training {
        l.push(format!(
            "train: {} -> {} (checkpoint {}, validation loss {:.4}, exit {}) (event {})",
            t.base_model,
            t.new_model,
            t.checkpoint,
            t.validation_loss,
            or_unrecorded(t.exit_status),
            short(&t.event)
        ));
    }
}

/// `mass runs RUN`: one line per rollout (or a JSON array), filtered by
/// cycle and task.
pub fn runs(
    l: &Ledger,
    run: &str,
    cycle: Option<u32>,
    task: Option<&str>,
    json: bool,
) -> Result<ExitCode> {
    if l.head(run)?.is_none() {
        anyhow::bail!(super::CliError::NotFound(format!(
            "no run named {run:?} (`mass status` lists runs)"
        )));
    }
    let rows: Vec<_> = audit::rollouts(l, run)
        .map_err(super::engine_error)?
        .into_iter()
        .filter(|r| cycle.is_none_or(|c| r.cycle == c))
        .filter(|r| task.is_none_or(|t| r.task == t))
        .collect();
    let mut out = crate::output::stdout();
    if json {
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "{:<12}  {:>5}  {:<24}  {:<16}  {:>5}  {:<20}  {:>7}  {:>8}  {:>5}  {:<12}  model",
        "rollout",
        "cycle",
        "task",
        "kind",
        "index",
        "status",
        "checks",
        "BT score",
        "rank",
        "selection"
    )?;
    for r in &rows {
        writeln!(
            out,
            "{:<12}  {:>5}  {:<24}  {:<16}  {:>5}  {:<20}  {:>7}  {:>8}  {:>5}  {:<12}  {}",
            short(&r.event),
            r.cycle,
            r.task,
            r.kind,
            r.index,
            r.status,
            match (r.checks_passed, r.checks_total) {
                (Some(p), Some(t)) => format!("{p}/{t}"),
                _ => "-".to_string(),
            },
            r.score.map_or("-".into(), |s| format!("{s:.3}")),
            r.rank.map_or("-".into(), |k| k.to_string()),
            r.selection.as_deref().unwrap_or("-"),
            r.model
        )?;
    }
    if rows.iter().any(|r| r.checks_total.is_none()) {
        writeln!(
            out,
            "checks -: not recorded (a run imported from a reference run folder ran no checks)"
        )?;
    }
    writeln!(out, "{} rollout(s); `mass why ID` explains one", rows.len())?;
    Ok(ExitCode::SUCCESS)
}

/// Whether `name` is a run: a ref whose stream starts with `run.started`.
pub fn is_run(l: &Ledger, name: &str) -> Result<bool> {
    let Some(head) = l.head(name)? else {
        return Ok(false);
    };
    let mut first = None;
    for ev in l.chain(head) {
        first = Some(ev?.kind);
    }
    Ok(first.as_deref() == Some("run.started"))
}

/// `mass diff RUN_A RUN_B`.
pub fn diff_runs(l: &Ledger, a: &str, b: &str, json: bool) -> Result<ExitCode> {
    let d = audit::diff::diff(l, a, b).map_err(super::engine_error)?;
    let mut out = crate::output::stdout();
    if json {
        serde_json::to_writer_pretty(&mut out, &d)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let side = |s: &Option<String>| s.clone().unwrap_or_else(|| "(ends)".into());
    writeln!(
        out,
        "main streams: {} event(s) shared from the start; then {a}: {}, {b}: {}",
        d.main.shared,
        side(&d.main.a),
        side(&d.main.b)
    )?;
    writeln!(
        out,
        "streams: {} identical, {} diverged, {} only in {a}, {} only in {b}",
        d.identical_streams, d.diverged_streams, d.only_in_a, d.only_in_b
    )?;
    for s in &d.diverged {
        writeln!(
            out,
            "  {}: {} shared, then {a}: {}, {b}: {}",
            s.stream,
            s.shared,
            side(&s.a),
            side(&s.b)
        )?;
    }
    for c in &d.cycles {
        writeln!(out, "cycle {}:", c.cycle)?;
        writeln!(
            out,
            "  verdicts: {} of {} compared (on the same judgment stream, else on the same pair of rollouts) name another winner",
            c.verdicts_changed, c.verdicts_compared
        )?;
        for v in &c.changed_verdicts {
            writeln!(out, "    {v}")?;
        }
        for (what, lines) in [
            ("champions", &c.champions),
            ("rankings", &c.rankings),
            ("selections", &c.selections),
        ] {
            if lines.is_empty() {
                writeln!(out, "  {what}: no difference")?;
            }
            for line in lines {
                writeln!(out, "  {what}: {line}")?;
            }
        }
        if let Some(ds) = &c.dataset {
            writeln!(out, "  dataset: {ds}")?;
        }
        if let Some(t) = &c.training {
            writeln!(out, "  training: {t}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The report's line comparing a task's ranking with the hidden checks
/// (the external verifier the self-judge never saw).
fn write_check_agreement(
    out: &mut impl Write,
    t: &audit::report::TaskScores,
) -> std::io::Result<()> {
    let a = t.check_agreement;
    let share = match a.compared {
        0 => "n/a".to_string(),
        n => format!("{:.0}%", 100.0 * f64::from(a.agree) / f64::from(n)),
    };
    writeln!(
        out,
        "  ranking vs hidden checks, {}: {} of {} pairs of runs with different check scores ordered alike ({share})",
        t.task, a.agree, a.compared
    )
}

/// The report's position-bias line per task of the outer loop's judging:
/// the share of decisive verdicts won by the run shown first.
fn write_position(
    out: &mut impl Write,
    position: &[audit::report::TaskPosition],
) -> std::io::Result<()> {
    for t in position {
        let decisive = t.first_shown + t.second_shown;
        let share = if decisive == 0 {
            "n/a".to_string()
        } else {
            format!(
                "{:.0}%",
                100.0 * f64::from(t.first_shown) / f64::from(decisive)
            )
        };
        writeln!(
            out,
            "  judge position bias, {}: the run shown first won {} of {} decisive verdicts ({share}), {} tie(s); {} of {} verdicts with the pair swapped",
            t.task, t.first_shown, decisive, t.ties, t.swapped, t.verdicts
        )?;
    }
    Ok(())
}

/// The report's inner-loop lines of one cycle: each task's steps, then the
/// iterations with no usable proposal.
fn write_inner(out: &mut impl Write, c: &audit::report::CycleReport) -> std::io::Result<()> {
    for t in &c.inner {
        let steps: Vec<String> = t
            .iterations
            .iter()
            .map(|i| {
                format!(
                    "{}:{}{} ({} lines)",
                    i.iteration,
                    if i.accepted { "accepted" } else { "rejected" },
                    if i.beat_reference { "+ref" } else { "" },
                    i.edit_lines
                )
            })
            .collect();
        writeln!(out, "    {}: {}", t.task, steps.join(", "))?;
    }
    for f in &c.failed_proposals {
        writeln!(
            out,
            "    {} {}: no usable proposal after {} attempt(s), no candidate ran (last: {})",
            f.task, f.iteration, f.attempts, f.error
        )?;
    }
    Ok(())
}

/// The report's training lines: the loss from first to last step and the
/// lowest validation loss with its checkpoint, then the model made and its
/// validation loss against the base model's.
fn write_training(
    out: &mut impl Write,
    loss: &[audit::report::LossPoint],
    trained: Option<&audit::report::TrainedModel>,
) -> std::io::Result<()> {
    let train: Vec<f64> = loss.iter().filter_map(|p| p.train_loss).collect();
    let best = loss
        .iter()
        .filter_map(|p| p.validation_loss.map(|l| (l, p)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let mut parts = vec![format!("{} recorded step line(s)", loss.len())];
    if let (Some(a), Some(b)) = (train.first(), train.last()) {
        parts.push(format!("training loss {a:.4} -> {b:.4}"));
    }
    if let Some((l, p)) = best {
        parts.push(format!(
            "lowest validation loss {l:.4} at step {}{}",
            p.step,
            if p.checkpoint.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.checkpoint)
            }
        ));
    }
    if loss.is_empty() {
        writeln!(out, "  training: no metrics recorded")?;
    } else {
        writeln!(out, "  training: {}", parts.join("; "))?;
    }
    if let Some(t) = trained {
        let base = match t.base_validation_loss {
            Some(b) => format!(
                "{b:.4} -> {:.4} ({})",
                t.validation_loss,
                if t.validation_loss < b {
                    "lower: it learnt"
                } else {
                    "not lower: it did not learn on these lines"
                }
            ),
            None => format!(
                "{:.4} (the base model's was not measured)",
                t.validation_loss
            ),
        };
        writeln!(
            out,
            "  trained {} -> {} ({}): validation loss {base}",
            t.base_model, t.new_model, t.checkpoint
        )?;
    }
    Ok(())
}

/// The report's Bradley-Terry scores per task, each with its ranking's
/// agreement with the hidden checks.
fn write_scores(out: &mut impl Write, scores: &[audit::report::TaskScores]) -> std::io::Result<()> {
    for t in scores {
        let scores: Vec<String> = t
            .runs
            .iter()
            .map(|r| {
                format!(
                    "{:.2}{}",
                    r.score,
                    match r.selection.as_str() {
                        "train" => "T",
                        "validation" => "V",
                        "excluded" => "x",
                        _ => "",
                    }
                )
            })
            .collect();
        writeln!(
            out,
            "  Bradley-Terry scores, {} (by rank; T train, V validation, x excluded): {}",
            t.task,
            scores.join(" ")
        )?;
        write_check_agreement(out, t)?;
    }
    Ok(())
}

/// The report's table of calls, tokens and wall time per stage.
fn write_stages(out: &mut impl Write, stages: &[audit::report::StageCost]) -> std::io::Result<()> {
    writeln!(
        out,
        "  {:<12} {:>8} {:>14} {:>14} {:>9}",
        "stage", "calls", "prompt tok", "completion tok", "wall s"
    )?;
    for s in stages {
        let wall = match s.wall_seconds {
            Some(w) => format!("{w:.1}"),
            None if s.not_run => "not run".to_string(),
            None => "unknown".to_string(),
        };
        writeln!(
            out,
            "  {:<12} {:>8} {:>14} {:>14} {:>9}",
            s.stage, s.model_calls, s.prompt_tokens, s.completion_tokens, wall
        )?;
    }
    Ok(())
}

/// The report's exclusions of one cycle: counts by reason, each run left
/// out with its reason, and each task whose selection fell short.
fn write_exclusions(out: &mut impl Write, c: &audit::report::CycleReport) -> std::io::Result<()> {
    if c.exclusions.is_empty() {
        writeln!(out, "  exclusions: none")?;
    }
    for (why, n) in &c.exclusions {
        writeln!(out, "  excluded: {why} {n}")?;
    }
    for x in &c.excluded_runs {
        let run = if x.rollout.is_empty() {
            "(no run named)".to_string()
        } else {
            format!(
                "run {}{}",
                short(&x.rollout),
                x.index.map(|i| format!(" (#{i})")).unwrap_or_default()
            )
        };
        writeln!(out, "  excluded {} {run}: {}", x.task, x.reason)?;
    }
    for s in &c.shortfalls {
        writeln!(
            out,
            "  selection short, {}: {} of {} training, {} of {} validation runs: {}",
            s.task, s.train, s.wanted_train, s.validation, s.wanted_validation, s.why
        )?;
    }
    Ok(())
}

/// The report's template parity line: per served model, how many live
/// calls the server counted as many prompt tokens as the trainer's side.
fn write_parity(
    out: &mut impl Write,
    parity: &std::collections::BTreeMap<String, audit::report::Parity>,
) -> std::io::Result<()> {
    if parity.is_empty() {
        return Ok(());
    }
    let each: Vec<String> = parity
        .iter()
        .map(|(m, p)| format!("{m} {} of {} call(s)", p.equal, p.calls))
        .collect();
    writeln!(
        out,
        "template parity (the server's prompt tokens equal to the trainer's count): {}",
        each.join(", ")
    )
}

/// `mass report RUN`.
pub fn report(
    l: &Ledger,
    run: &str,
    json: bool,
    html: Option<&Path>,
    fresh: bool,
) -> Result<ExitCode> {
    if !is_run(l, run)? {
        anyhow::bail!(super::CliError::NotFound(format!(
            "no run named {run:?} (`mass status` lists runs)"
        )));
    }
    let mode = match fresh {
        true => audit::report::Mode::Fresh,
        false => audit::report::Mode::Kept,
    };
    let r = audit::report::report_with(l, run, mode).map_err(super::engine_error)?;
    if let Some(path) = html {
        std::fs::write(path, audit::html::render(&r))
            .with_context(|| format!("cannot write the HTML report to {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    let mut out = crate::output::stdout();
    if json {
        serde_json::to_writer_pretty(&mut out, &r)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let pct = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{:.0}%", v * 100.0));
    writeln!(out, "run {}: {} cycle(s)", r.run, r.cycles.len())?;
    write_parity(&mut out, &r.template_parity)?;
    for c in &r.cycles {
        let f = &c.figures;
        writeln!(out, "\ncycle {} ({} -> {})", f.cycle, f.model, f.next_model)?;
        writeln!(
            out,
            "  inner loop ({}/{} steps accepted):",
            f.inner_wins, f.inner_iterations
        )?;
        write_inner(&mut out, c)?;
        writeln!(
            out,
            "  win rates (pairs of bare-task runs; W/(W+L) over judgments with ties excluded, then the pair majority with its 95% Wilson and percentile bootstrap intervals over pairs):"
        )?;
        for (e, b) in f.evaluations.iter().zip(&c.bootstrap) {
            writeln!(
                out,
                "    {} vs {} by {} ({}{}): {}; {}; position bias {} of {} judgment pairs in opposite orders",
                e.split,
                e.against,
                e.judge,
                e.judge_model,
                if e.self_judge { ", self" } else { "" },
                e.describe(Some(*b)),
                e.order_text(),
                pct(e.position_bias),
                e.swapped
            )?;
        }
        for a in &f.agreement {
            writeln!(
                out,
                "  agreement {} ({}) with {} ({}): {} of {}",
                a.judge,
                a.judge_model,
                a.other,
                a.other_model,
                pct(a.rate),
                a.compared
            )?;
        }
        let bare: Vec<String> = f
            .bare_delegation
            .iter()
            .map(|d| format!("{} {}", d.model, pct(d.rate)))
            .collect();
        writeln!(
            out,
            "  delegation: with the champion workflow {} of collected runs; without a workflow {}",
            pct(f.delegation_rate),
            if bare.is_empty() {
                "not measured".into()
            } else {
                bare.join(", ")
            }
        )?;
        let tokens = or_unrecorded(f.supervised_tokens);
        writeln!(out, "  supervised tokens: {tokens}")?;
        write_training(&mut out, &c.loss, c.training.as_ref())?;
        write_stages(&mut out, &c.stages)?;
        write_scores(&mut out, &c.scores)?;
        write_position(&mut out, &c.position)?;
        write_exclusions(&mut out, c)?;
    }
    Ok(ExitCode::SUCCESS)
}
