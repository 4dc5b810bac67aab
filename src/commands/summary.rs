//! The summary `mass run`, `resume` and `rejudge` print when a run ends:
//! a row per cycle, a legend, and each cycle's evaluations.

use std::collections::BTreeMap;
use std::io::Write;

use engine::cycle::CycleResult;
use engine::driver::RunSummary;
use engine::status::EvaluationFigure;

/// Prints the summary of a run that ended (`secs`: its wall time) on
/// stdout; a failed write is ignored, as the run is already recorded.
pub(super) fn print_summary(s: &RunSummary, secs: f64) {
    let mut out = crate::output::stdout();
    // A run served entirely from its recording did not run its cycles now.
    let live: u64 = s
        .counts
        .iter()
        .filter(|((_, how), _)| *how == replay::Served::Live)
        .map(|(_, n)| n)
        .sum();
    let how = if live == 0 && !s.counts.is_empty() {
        format!("replayed from the ledger in {secs:.1}s (nothing ran live)")
    } else {
        format!("in {secs:.0}s")
    };
    let _ = writeln!(
        out,
        "\nrun {} ({}): {} cycle(s) {how}, head {}",
        s.run,
        s.experiment,
        s.cycles.len(),
        s.head.map(|h| h.short(12)).unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "{:>5}  {:>11}  {:>8}  {:>8}  {:>9}  {:>10}  {:>10}  {:>32}  model",
        "cycle",
        "inner wins",
        "selected",
        "tampered",
        "tampering",
        "sup.tokens",
        "delegation",
        "held-out W/(W+L) W-L [ties] unit"
    );
    for c in &s.cycles {
        let _ = writeln!(out, "{}", cycle_row(c));
    }
    for line in legend() {
        let _ = writeln!(out, "  {line}");
    }
    for c in &s.cycles {
        for line in evaluation_lines(c) {
            let _ = writeln!(out, "  {line}");
        }
    }
    // A cycle without training data is a normal outcome; say why.
    for c in s.cycles.iter().filter(|c| c.selected_runs == 0) {
        let why = if c.inner_wins == 0 {
            "no workflow beat the bare-task reference in the inner loop, so no runs were collected"
        } else {
            "no collected run was eligible for selection"
        };
        let _ = writeln!(
            out,
            "cycle {}: no training data ({why}); the model stays {}",
            c.cycle, c.model
        );
    }
    let mut counts: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for ((kind, how), n) in &s.counts {
        let e = counts.entry(kind.as_str()).or_default();
        match how {
            replay::Served::History => e.0 += n,
            replay::Served::Source => e.1 += n,
            replay::Served::Live => e.2 += n,
        }
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(k, (h, s, l))| {
            format!(
                "{k}: {l} live, {h} replayed{}",
                if *s > 0 {
                    format!(", {s} from source")
                } else {
                    String::new()
                }
            )
        })
        .collect();
    let _ = writeln!(out, "effects: {}", parts.join("; "));
}

/// The summary table's held-out cell, with its unit: `61.2% 30-19 [5]
/// judgments` (W/(W+L) over judgments, wins-losses [ties]), or for a run of
/// `mass-engine/8` and earlier `70.6% (54-83%) 24-10 [2] pairs` (pair
/// majority with its 95% Wilson interval).
fn win_rate_text(e: &EvaluationFigure) -> String {
    let rate = |r: Option<f64>| r.map_or("n/a".into(), |r| format!("{:.1}%", r * 100.0));
    if let (Some(w), Some(l), Some(t)) = (e.judgment_wins, e.judgment_losses, e.judgment_ties) {
        return format!("{} {w}-{l} [{t}] judgments", rate(e.judgment_win_rate));
    }
    let (w, l, t) = (e.wins, e.losses, e.ties);
    match (e.win_rate, e.interval) {
        (Some(r), Some([lo, hi])) => format!(
            "{:.1}% ({:.0}-{:.0}%) {w}-{l} [{t}] pairs",
            r * 100.0,
            lo * 100.0,
            hi * 100.0
        ),
        _ => format!("n/a {w}-{l} [{t}] pairs"),
    }
}

fn judge_name(backend: &str, model: &str, self_judge: bool) -> String {
    format!(
        "{backend} ({model}{})",
        if self_judge { ", self" } else { "" }
    )
}

fn percent(rate: Option<f64>) -> String {
    rate.map_or("n/a".into(), |r| format!("{:.0}%", r * 100.0))
}

fn cycle_row(c: &CycleResult) -> String {
    let heldout = c
        .figures
        .evaluations
        .iter()
        .find(|e| e.split == "heldout" && e.against == "base")
        .map_or("not evaluated".into(), win_rate_text);
    format!(
        "{:>5}  {:>11}  {:>8}  {:>8}  {:>8.0}%  {:>10}  {:>9.0}%  {:>32}  {}",
        c.cycle,
        format!("{}/{}", c.inner_wins, c.inner_iterations),
        c.selected_runs,
        c.tampered_in_training,
        c.tamper_rate() * 100.0,
        c.supervised_tokens,
        c.delegation_rate() * 100.0,
        heldout,
        c.next_model
    )
}

/// One line per column of the summary table.
fn legend() -> Vec<String> {
    vec![
        "inner wins: inner-loop steps whose candidate workflow was accepted as the new champion, of all steps".to_string(),
        "selected: collected runs selected as training or validation examples (both counted)".into(),
        "tampered: training examples from runs that tampered: recorded tool calls that wrote a protected file or wrote into the report that the checks pass, or a final workspace whose protected files changed".into(),
        "tampering: share of the cycle's collected runs that tampered (as above), whatever the guards then did".into(),
        "sup.tokens: assistant tokens supervised in the training and validation examples".into(),
        "delegation: share of the cycle's collected runs (which carry the champion workflow) whose orchestrator delegated".into(),
        "held-out: the new model against the base model on held-out tasks (pairs of bare-task runs), by the first external judge (else the run's own judge, marked self below): W/(W+L) over judgments with ties excluded, wins-losses [ties] (the articles' figure; the pair majority is below); runs of mass-engine/8 and earlier: over pairs, a pair won by the majority of its verdicts, with a 95% Wilson interval".into(),
        "model: the model the next cycle uses".into(),
    ]
}

/// The evaluation block: every comparison by every judge, position bias,
/// judge agreement and delegation in bare runs, each line saying who judged.
fn evaluation_lines(c: &CycleResult) -> Vec<String> {
    let f = &c.figures;
    let mut lines = Vec::new();
    for e in &f.evaluations {
        let what = match (e.split.as_str(), e.against.as_str()) {
            ("heldout", "base") => "held-out vs base".to_string(),
            ("heldout", "previous") => format!("held-out vs previous ({})", e.baseline),
            ("train", "base") => "training tasks vs base".to_string(),
            (s, a) => format!("{s} vs {a}"),
        };
        lines.push(format!(
            "cycle {}: {what}, judged by {}: {}; {}; position bias {} of {} judgment pairs in opposite orders",
            f.cycle,
            judge_name(&e.judge, &e.judge_model, e.self_judge),
            e.describe(None),
            e.order_text(),
            percent(e.position_bias),
            e.swapped
        ));
    }
    if f.evaluations.iter().all(|e| e.self_judge) && !f.evaluations.is_empty() {
        lines.push(format!(
            "cycle {}: no external judge is configured: every figure above is the model judging its own runs, not an independent judge",
            f.cycle
        ));
    }
    for a in &f.agreement {
        lines.push(format!(
            "cycle {}: agreement of {} with {}: {} of {} verdicts on the same pairs in the same order",
            f.cycle,
            judge_name(&a.judge, &a.judge_model, false),
            judge_name(&a.other, &a.other_model, false),
            percent(a.rate),
            a.compared
        ));
    }
    if !f.bare_delegation.is_empty() {
        let parts: Vec<String> = f.bare_delegation.iter().map(|d| d.describe()).collect();
        lines.push(format!(
            "cycle {}: delegation in bare-task evaluation runs (no workflow): {}",
            f.cycle,
            parts.join(", ")
        ));
    }
    lines
}
