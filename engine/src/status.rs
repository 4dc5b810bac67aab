//! Where a run stands, as a pure fold over its main stream (a projection), plus
//! the effects that were started and never finished (what a resume re-issues)
//! and what its recorded definition says (name, planned cycles).

use ledger::{Event, Ledger};
use schemas::{Effect, EffectStatus, Record};

use crate::error::{EngineError, Result};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunStatus {
    pub experiment: String,
    pub cycles_planned: u32,
    pub cycles_done: u32,
    pub last_step: String,
    pub finished: bool,
    pub forked_from: Option<String>,
    /// The last `cycles` a fork on this stream set (it overrides the plan in
    /// the recorded definition).
    pub cycles_override: Option<u32>,
    /// Runs left out of ranking or training data, by reason (from the
    /// `mass.selection` records): a run flagged by several guards counts
    /// once under each.
    pub exclusions: std::collections::BTreeMap<String, u32>,
    /// Each finished cycle's figures, from its `mass.cycle` record and the
    /// `mass.evaluation` records it links.
    pub cycles: Vec<CycleFigures>,
}

/// A finished cycle's figures as `mass status --json` and the run summary
/// show them: the recorded counts plus the rates and intervals they give.
/// Figures a `mass.cycle` v1 record did not carry are absent (null).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct CycleFigures {
    pub cycle: u32,
    pub model: String,
    pub next_model: String,
    pub inner_wins: u32,
    pub inner_iterations: u32,
    pub selected_runs: u32,
    /// `None`: not recorded (`ledger::NOT_RECORDED`, see `fold_read`).
    pub supervised_tokens: Option<u64>,
    pub collected_runs: Option<u32>,
    /// Share of collected runs (with the champion workflow) that delegated.
    pub delegation_rate: Option<f64>,
    /// Training examples from runs that tampered (recorded tool calls, or
    /// protected files changed in the final workspace).
    pub tampered_in_training: Option<u32>,
    /// Share of collected runs that tampered.
    pub tampering_rate: Option<f64>,
    /// Delegation in bare-task evaluation runs, per model.
    pub bare_delegation: Vec<DelegationFigure>,
    pub agreement: Vec<AgreementFigure>,
    pub evaluations: Vec<EvaluationFigure>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DelegationFigure {
    pub model: String,
    pub runs: u32,
    pub delegated: u32,
    pub rate: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AgreementFigure {
    pub judge: String,
    pub judge_model: String,
    pub other: String,
    pub other_model: String,
    pub compared: u32,
    pub agreed: u32,
    pub rate: Option<f64>,
}

/// One judge's verdicts on one comparison (`mass.evaluation`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EvaluationFigure {
    /// `heldout` or `train`.
    pub split: String,
    /// `base` or `previous`.
    pub against: String,
    pub model: String,
    pub baseline: String,
    pub judge: String,
    pub judge_model: String,
    /// The judge is the model being trained, not an independent one.
    pub self_judge: bool,
    /// The unit of the headline win rate: `judgments` (`judgment_win_rate`,
    /// ties excluded) or, for a v2 record, `pairs` (`win_rate`).
    pub headline_unit: String,
    /// How each pair's judgments were ordered: `random` (`mass.evaluation`
    /// v3) or `alternating` (v2: runs of `mass-engine/8` and earlier).
    pub order: String,
    /// Judgments made (recorded judgment events) and the valid ones.
    pub judgments: u32,
    pub verdicts: u32,
    /// The headline, as the MASS articles count it: judgments won by the
    /// model, by the baseline, tied, and W/(W+L) over judgments with ties
    /// excluded (null when every judgment tied). Null for a v2 record,
    /// which counted pairs only.
    pub judgment_wins: Option<u32>,
    pub judgment_losses: Option<u32>,
    pub judgment_ties: Option<u32>,
    pub judgment_win_rate: Option<f64>,
    /// Judgments that showed the model first (null for v2: alternating).
    pub model_first: Option<u32>,
    /// Pair outcomes (majority of each pair's verdicts).
    pub pairs: u32,
    pub wins: u32,
    pub losses: u32,
    pub ties: u32,
    /// Pair majority: W/(W+L) over pairs and its 95% Wilson interval (null
    /// when every pair tied). The interval's unit is the pair: one pair's
    /// judgments are not independent samples.
    pub win_rate: Option<f64>,
    pub interval: Option<[f64; 2]>,
    /// Judgments of one pair in opposite orders, both decided, and the
    /// share where the judge picked the same position both times.
    pub swapped: u32,
    pub same_position: u32,
    pub position_bias: Option<f64>,
}

fn share(part: u32, whole: u32) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

impl DelegationFigure {
    /// `MODEL DELEGATED of RUNS (RATE%)`, as the summary and the report
    /// print it.
    pub fn describe(&self) -> String {
        format!(
            "{} {} of {} ({})",
            self.model,
            self.delegated,
            self.runs,
            self.rate
                .map_or("n/a".into(), |r| format!("{:.0}%", r * 100.0))
        )
    }
}

impl EvaluationFigure {
    /// From a `mass.evaluation` v3 record.
    pub fn of(e: &schemas::Evaluation) -> EvaluationFigure {
        let (w, l) = (e.judgment_wins, e.judgment_losses);
        EvaluationFigure {
            headline_unit: "judgments".into(),
            order: "random".into(),
            judgment_wins: Some(w),
            judgment_losses: Some(l),
            judgment_ties: Some(e.judgment_ties),
            judgment_win_rate: share(w, w + l),
            model_first: Some(e.model_first),
            ..EvaluationFigure::of_v2(&e.v2())
        }
    }

    /// From a `mass.evaluation` v2 record (pair figures only).
    pub fn of_v2(e: &schemas::EvaluationV2) -> EvaluationFigure {
        let wr = win_rate(e.wins, e.losses);
        EvaluationFigure {
            headline_unit: "pairs".into(),
            order: "alternating".into(),
            judgments: e.judgments.len() as u32,
            verdicts: e.verdicts,
            judgment_wins: None,
            judgment_losses: None,
            judgment_ties: None,
            judgment_win_rate: None,
            model_first: None,
            split: e.split.clone(),
            against: e.against.clone(),
            model: e.model.clone(),
            baseline: e.baseline.clone(),
            judge: e.judge.clone(),
            judge_model: e.judge_model.clone(),
            self_judge: e.self_judge,
            pairs: e.pairs,
            wins: e.wins,
            losses: e.losses,
            ties: e.ties,
            win_rate: wr.map(|w| w.0),
            interval: wr.map(|w| [w.1, w.2]),
            swapped: e.swapped,
            same_position: e.same_position,
            position_bias: share(e.same_position, e.swapped),
        }
    }

    /// The headline with its unit: `61.2% of 49 judgments (W/(W+L) 30-19,
    /// 5 ties excluded)`; `None` for a v2 record (no judgment counts).
    pub fn judgment_text(&self) -> Option<String> {
        let (w, l, t) = (
            self.judgment_wins?,
            self.judgment_losses?,
            self.judgment_ties?,
        );
        let invalid = self.judgments.saturating_sub(self.verdicts);
        Some(format!(
            "{} of {} judgments (W/(W+L) {w}-{l}, {t} tie{} excluded{})",
            pct1(self.judgment_win_rate),
            w + l,
            if t == 1 { "" } else { "s" },
            if invalid > 0 {
                format!(", {invalid} invalid")
            } else {
                String::new()
            }
        ))
    }

    /// The pair majority with its unit and intervals (`bootstrap`: the
    /// report's percentile interval, when it has one): `pair majority 9/16
    /// pairs, 64.3% (W/(W+L) 9-5, 2 tied; 95% Wilson 39-84%)`.
    pub fn pair_text(&self, bootstrap: Option<Option<[f64; 2]>>) -> String {
        let range = |i: Option<[f64; 2]>| {
            i.map_or("n/a".into(), |[lo, hi]| {
                format!("{:.0}-{:.0}%", lo * 100.0, hi * 100.0)
            })
        };
        let boot = bootstrap.map_or(String::new(), |b| format!(", bootstrap {}", range(b)));
        format!(
            "pair majority {}/{} pairs, {} (W/(W+L) {}-{}, {} tied; 95% Wilson {}{boot})",
            self.wins,
            self.pairs,
            pct1(self.win_rate),
            self.wins,
            self.losses,
            self.ties,
            range(self.interval)
        )
    }

    /// How the pairs were judged: `6 judgments per pair in random order
    /// (24 of 48 model first)` or `2 verdicts per pair in alternating order`.
    pub fn order_text(&self) -> String {
        let per_pair = self.judgments.checked_div(self.pairs).unwrap_or(0);
        match self.model_first {
            Some(m) => format!(
                "{per_pair} judgments per pair in random order ({m} of {} model first)",
                self.judgments
            ),
            None => format!("{per_pair} verdicts per pair in {} order", self.order),
        }
    }

    /// The evaluation's line: the headline (judgments) first, the pair
    /// majority beside it; a v2 record's pair majority alone.
    pub fn describe(&self, bootstrap: Option<Option<[f64; 2]>>) -> String {
        match self.judgment_text() {
            Some(j) => format!("win rate {j}; {}", self.pair_text(bootstrap)),
            None => self.pair_text(bootstrap),
        }
    }
}

/// `61.2%`, or `n/a`.
fn pct1(rate: Option<f64>) -> String {
    rate.map_or("n/a".into(), |r| format!("{:.1}%", r * 100.0))
}

impl CycleFigures {
    /// From a `mass.cycle` v2 record and the evaluations it links.
    pub fn of(c: &schemas::Cycle, evaluations: &[EvaluationFigure]) -> CycleFigures {
        CycleFigures {
            cycle: c.cycle,
            model: c.model.clone(),
            next_model: c.next_model.clone(),
            inner_wins: c.inner_wins,
            inner_iterations: c.inner_iterations,
            selected_runs: c.selected_runs,
            supervised_tokens: Some(c.supervised_tokens),
            collected_runs: Some(c.collected_runs),
            delegation_rate: Some(share(c.delegating_runs, c.collected_runs).unwrap_or(0.0)),
            tampered_in_training: Some(c.tampered_in_training),
            tampering_rate: Some(share(c.tampered_runs, c.collected_runs).unwrap_or(0.0)),
            bare_delegation: c
                .bare_delegation
                .iter()
                .map(|d| DelegationFigure {
                    model: d.model.clone(),
                    runs: d.runs,
                    delegated: d.delegated,
                    rate: share(d.delegated, d.runs),
                })
                .collect(),
            agreement: c
                .agreement
                .iter()
                .map(|a| AgreementFigure {
                    judge: a.judge.clone(),
                    judge_model: a.judge_model.clone(),
                    other: a.other.clone(),
                    other_model: a.other_model.clone(),
                    compared: a.compared,
                    agreed: a.agreed,
                    rate: share(a.agreed, a.compared),
                })
                .collect(),
            evaluations: evaluations.to_vec(),
        }
    }

    /// From a `mass.cycle` v1 record, which carried no evaluation figures.
    fn of_v1(c: &schemas::CycleV1) -> CycleFigures {
        CycleFigures {
            cycle: c.cycle,
            model: c.model.clone(),
            next_model: c.next_model.clone(),
            inner_wins: c.inner_wins,
            inner_iterations: c.inner_iterations,
            selected_runs: c.selected_runs,
            supervised_tokens: Some(c.supervised_tokens),
            delegation_rate: Some(c.delegation_rate),
            ..CycleFigures::default()
        }
    }
}

impl CycleFigures {
    /// Forgets the figures whose counts the cycle record's metadata lists
    /// as not recorded (an imported run's placeholders): they become
    /// `None`, shown as "not recorded", never as the placeholder zero.
    pub fn forget_unrecorded(&mut self, meta: &ledger::Meta) {
        if meta.not_recorded("supervised_tokens") {
            self.supervised_tokens = None;
        }
        if meta.not_recorded("tampered_in_training") {
            self.tampered_in_training = None;
        }
        if meta.not_recorded("tampered_runs") {
            self.tampering_rate = None;
        }
    }
}

/// `fold`, then each cycle's figures without the counts its record's
/// metadata lists as not recorded (`CycleFigures::forget_unrecorded`):
/// what a reader with the ledger at hand shows.
pub fn fold_read(l: &Ledger, events: &[Event]) -> Result<RunStatus> {
    let mut s = fold(events)?;
    let mut seen = std::collections::HashSet::new();
    // The last record of a cycle's number is the one whose figures count.
    for ev in events.iter().rev().filter(|e| e.kind == "mass.cycle") {
        let Some((cycle, _)) = crate::milestone::closes(ev) else {
            continue;
        };
        if !seen.insert(cycle) {
            continue;
        }
        if let Some(f) = s.cycles.iter_mut().find(|f| f.cycle == cycle) {
            f.forget_unrecorded(&l.get_meta(&ev.id)?);
        }
    }
    Ok(s)
}

/// Folds a main stream, oldest event first.
pub fn fold(events: &[Event]) -> Result<RunStatus> {
    let mut s = RunStatus::default();
    // Evaluations come before the cycle record that links them.
    let mut evaluations: Vec<(ledger::Id, EvaluationFigure)> = Vec::new();
    for ev in events {
        match ev.kind.as_str() {
            // The experiment's name and plan are in the recorded definition
            // (see `describe_start`); the fold reads events only.
            "run.started" => s.last_step = "started".into(),
            "run.forked" => {
                let f: schemas::RunForked = schemas::decode_event(ev)?;
                for o in f.overrides.iter().filter(|o| o.key.trim() == "cycles") {
                    s.cycles_override = o.value.trim().parse().ok().or(s.cycles_override);
                }
                let sets: Vec<String> = f
                    .overrides
                    .iter()
                    .map(|o| format!("{}={}", o.key, o.value))
                    .collect();
                s.forked_from = Some(format!(
                    "{} at {}{}",
                    f.source_run,
                    &f.at.to_string()[..12],
                    if sets.is_empty() {
                        String::new()
                    } else {
                        format!(" with {}", sets.join(", "))
                    }
                ));
                s.last_step = "forked".into();
            }
            "note" => {
                let n: schemas::Note = schemas::decode_event(ev)?;
                s.finished = n.text.starts_with("run finished");
                s.last_step = n.text;
            }
            "mass.selection" => {
                let sel = schemas::Selection::read(ev).ok_or_else(|| {
                    EngineError::recording(
                        format!("mass.selection v{}", ev.version),
                        "unknown version",
                    )
                })??;
                for line in &sel.excluded {
                    for reason in exclusion_reasons(line) {
                        *s.exclusions.entry(reason).or_default() += 1;
                    }
                }
                for x in &sel.exclusions {
                    for reason in exclusion_reasons(&format!("run: {}", x.reason)) {
                        *s.exclusions.entry(reason).or_default() += 1;
                    }
                }
                s.last_step = ev.kind.clone();
            }
            "mass.evaluation" if ev.version == schemas::Evaluation::VERSION => {
                let e: schemas::Evaluation = schemas::decode_event(ev)?;
                evaluations.push((ev.id, EvaluationFigure::of(&e)));
                s.last_step = ev.kind.clone();
            }
            "mass.evaluation" if ev.version == schemas::EvaluationV2::VERSION => {
                let e: schemas::EvaluationV2 = schemas::decode_event(ev)?;
                evaluations.push((ev.id, EvaluationFigure::of_v2(&e)));
                s.last_step = ev.kind.clone();
            }
            "mass.cycle" => {
                let figures = if ev.version == schemas::CycleV1::VERSION {
                    CycleFigures::of_v1(&schemas::decode_event(ev)?)
                } else {
                    let c: schemas::Cycle = schemas::decode_event(ev)?;
                    let linked: Vec<EvaluationFigure> = evaluations
                        .iter()
                        .filter(|(id, _)| c.evaluations.contains(&schemas::Hash32(id.0)))
                        .map(|(_, e)| e.clone())
                        .collect();
                    CycleFigures::of(&c, &linked)
                };
                evaluations.clear();
                s.cycles_done = figures.cycle;
                s.last_step = format!(
                    "cycle {} done (next model {})",
                    figures.cycle, figures.next_model
                );
                // A fork that re-ran a cycle replaces its figures.
                s.cycles.retain(|c| c.cycle < figures.cycle);
                s.cycles.push(figures);
            }
            other => s.last_step = other.to_string(),
        }
    }
    Ok(s)
}

/// The reasons in one `mass.selection` exclusion line: `guard: ...` lines
/// (see `stages::guard_reason`) give one reason per violation, named without its figures;
/// `rank N: halted (...)` lines give the run's status.
pub fn exclusion_reasons(line: &str) -> Vec<String> {
    if let Some((_, rest)) = line.split_once("guard: ") {
        let rest = rest
            .trim_end_matches(" (not ranked)")
            .trim_end_matches(" (ranked, not trained on)");
        return rest
            .split("; ")
            .map(|v| {
                let what = if v.starts_with("protected files changed") {
                    "protected files changed"
                } else if v.contains("files changed outside the deliverables") {
                    "too many files changed"
                } else if v.contains("bytes changed outside the deliverables") {
                    "too many bytes changed"
                } else {
                    v.split(':').next().unwrap_or(v)
                };
                format!("guard: {what}")
            })
            .collect();
    }
    // `rank 4: halted (max_turns)` (v1) or `run: halted: max_turns (not
    // ranked)` (a v2 exclusion's reason after `run: `).
    let status = line
        .split_once(": ")
        .map_or(line, |(_, r)| r)
        .split_whitespace()
        .next()
        .unwrap_or("other")
        .trim_end_matches(':');
    vec![status.to_string()]
}

/// Effects of the run whose stream ends in `started` (interrupted work) or in
/// a transient failure (an infrastructure failure that stopped the run), each
/// described with what continuing the run (`mass resume`, or for a re-judge
/// of an imported run the same `mass rejudge`) will do about it.
pub fn unfinished_effects(ledger: &Ledger, run: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let prefix = format!("{run}/");
    for (name, head) in ledger.refs()? {
        if name != run && !name.starts_with(&prefix) {
            continue;
        }
        let ev = ledger.get_event(&head)?;
        if ev.kind == "effect" {
            let e: Effect =
                schemas::decode_event(&ev).map_err(|x| EngineError::recording("effect", x))?;
            match e.status {
                EffectStatus::Started => out.push(format!(
                    "{} effect in {name} was started and never finished (continuing the run issues it again)",
                    e.effect
                )),
                EffectStatus::Retriable => out.push(format!(
                    "{} effect in {name} failed for a reason outside the run ({}); continuing the run retries it",
                    e.effect, e.error
                )),
                EffectStatus::Ok | EffectStatus::Failed => {}
            }
        }
    }
    Ok(out)
}

/// The experiment name and planned number of cycles of a run, from its
/// recorded definition. Reads runs of every `run.started` version, so `mass
/// status` still lists runs recorded by older builds.
pub fn describe_start(ledger: &Ledger, first: &Event) -> Result<(String, u32)> {
    let config = match first.version {
        1 => schemas::decode_event::<schemas::RunStartedV1>(first)?.config,
        _ => schemas::decode_event::<schemas::RunStarted>(first)?.config,
    };
    let text = String::from_utf8(ledger.get_blob(&ledger::Id(config.0))?)
        .map_err(|e| EngineError::recording("experiment", e))?;
    let exp = crate::config::Experiment::parse(&text, "recorded experiment")?;
    Ok((exp.name, exp.cycles))
}

/// W/(W+L) of an evaluation's pairs with its 95% Wilson interval, as
/// fractions.
pub fn win_rate(wins: u32, losses: u32) -> Option<(f64, f64, f64)> {
    let n = (wins + losses) as u64;
    let ci = rank::winrate::wilson(wins as u64, n, rank::winrate::Z_95).ok()?;
    Some((wins as f64 / n as f64, ci.lower, ci.upper))
}

#[cfg(test)]
mod tests {
    use super::exclusion_reasons;

    #[test]
    fn exclusion_lines_are_counted_by_reason_without_figures() {
        assert_eq!(
            exclusion_reasons("run 0123abcd: guard: protected files changed: sim/push.py; 250 files changed outside the deliverables (limit 200) (not ranked)"),
            ["guard: protected files changed", "guard: too many files changed"]
        );
        assert_eq!(
            exclusion_reasons("rank 3: guard: 99999999 bytes changed outside the deliverables (limit 16777216) (ranked, not trained on)"),
            ["guard: too many bytes changed"]
        );
        assert_eq!(
            exclusion_reasons("rank 5: halted (turn limit (24) reached)"),
            ["halted"]
        );
    }
}
