//! Where a run stands, as a pure fold over its main stream (a projection), plus
//! the effects that were started and never finished (what a resume re-issues)
//! and what its recorded definition says (name, planned cycles).

use ledger::{Event, Ledger};
use schemas::{Effect, EffectStatus};

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
}

/// Folds a main stream, oldest event first.
pub fn fold(events: &[Event]) -> Result<RunStatus> {
    let mut s = RunStatus::default();
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
                let sel: schemas::Selection = schemas::decode_event(ev)?;
                for line in &sel.excluded {
                    for reason in exclusion_reasons(line) {
                        *s.exclusions.entry(reason).or_default() += 1;
                    }
                }
                s.last_step = ev.kind.clone();
            }
            "mass.cycle" => {
                let c: schemas::Cycle = schemas::decode_event(ev)?;
                s.cycles_done = c.cycle;
                s.last_step = format!("cycle {} done (next model {})", c.cycle, c.next_model);
            }
            other => s.last_step = other.to_string(),
        }
    }
    Ok(s)
}

/// The reasons in one `mass.selection` exclusion line: `guard: ...` lines
/// (see `cycle.rs`) give one reason per violation, named without its figures;
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
    let status = line
        .split_once(": ")
        .map_or(line, |(_, r)| r)
        .split_whitespace()
        .next()
        .unwrap_or("other");
    vec![status.to_string()]
}

/// Effects of the run whose stream ends in `started` (interrupted work) or in
/// a transient failure (an infrastructure failure that stopped the run), each
/// described with what `mass resume` will do about it.
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
                    "{} effect in {name} was started and never finished (a resume re-issues it)",
                    e.effect
                )),
                EffectStatus::Retriable => out.push(format!(
                    "{} effect in {name} failed for a reason outside the run ({}); a resume retries it",
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
