//! The tables read from a run's streams other than its main one: team
//! runs (`rollouts`), model and tool calls, judgments and training steps.
//! Each stream (a ref `RUN/<rel>` whose events are on stream `<rel>`,
//! `audit::run_streams`) is read on its own, oldest event first;
//! per stream only its guard findings and the attempts at each request are
//! kept, so memory follows the largest stream, not the run.

use std::collections::HashMap;

use ledger::{Event, Id, Ledger};
use schemas::{Effect, EffectStatus, GuardCheck, Judgment, Rollout, TrainStep};
use serde_json::Value;

use crate::main_stream::{Counts, RunContext};
use crate::schema::{JUDGMENTS, MODEL_CALLS, ROLLOUTS, TOOL_CALLS, TRAINING_STEPS};
use crate::sink::Cell;
use crate::{hex, hex_or_null, recorded, Result, TablesError, Writers};

/// One stream being read.
struct StreamCtx<'a> {
    run: &'a str,
    rel: &'a str,
    /// The cycle and stage its calls count toward (`mass report`'s rule).
    stage: Option<(u32, &'static str)>,
    guards: HashMap<Id, GuardCheck>,
    /// Per request: its last attempt's number and whether it succeeded.
    attempts: HashMap<[u8; 32], (u32, bool)>,
}

/// The attempt number of a finished record of `request`: one more than the
/// last record of the same request when that one failed (a retry follows
/// a failed attempt), else 1 — the same tool call made again later (`ls`
/// twice) is a new call, not a retry.
fn next_attempt(attempts: &mut HashMap<[u8; 32], (u32, bool)>, request: [u8; 32], ok: bool) -> u32 {
    let n = match attempts.get(&request) {
        Some(&(n, false)) => n + 1,
        _ => 1,
    };
    attempts.insert(request, (n, ok));
    n
}

/// Writes the rows of every stream of `run` but its main one.
pub(crate) fn tables(l: &Ledger, run: &str, ctx: &RunContext, w: &mut Writers) -> Result<Counts> {
    let mut counts = Counts::default();
    for (rel, head) in audit::run_streams(l, run)? {
        let rel = rel.as_str();
        let mut events: Vec<Event> = l.chain(head).collect::<std::result::Result<_, _>>()?;
        events.reverse();
        counts.streams += 1;
        counts.events += events.len() as u64;
        let mut s = StreamCtx {
            run,
            rel,
            stage: audit::report::stage_of(rel),
            guards: HashMap::new(),
            attempts: HashMap::new(),
        };
        for ev in &events {
            event_rows(l, ev, ctx, &mut s, &mut counts, w)?;
        }
    }
    Ok(counts)
}

fn event_rows(
    l: &Ledger,
    ev: &Event,
    ctx: &RunContext,
    s: &mut StreamCtx,
    counts: &mut Counts,
    w: &mut Writers,
) -> Result<()> {
    match ev.kind.as_str() {
        "effect" if ev.version == 1 => effect(l, ev, s, counts, w),
        "mass.guard" if ev.version == 1 => {
            s.guards.insert(ev.id, decode(ev)?);
            Ok(())
        }
        "mass.rollout" if ev.version == 1 => w.push(&ROLLOUTS, rollout_row(l, ev, ctx, s)?),
        "mass.judgment" if ev.version == 1 => w.push(&JUDGMENTS, judgment_row(ev, ctx, s)?),
        "mass.train_step" if ev.version == 1 => w.push(&TRAINING_STEPS, step_row(ev, s)?),
        _ => Ok(()),
    }
}

fn decode<T: schemas::Decodable>(ev: &Event) -> Result<T> {
    T::from_event(ev).map_err(|e| TablesError::record(&ev.kind, &ev.id, e))
}

fn json_blob(l: &Ledger, ev: &Event, id: &schemas::Hash32, what: &str) -> Result<Value> {
    serde_json::from_slice(&l.get_blob(&Id(id.0))?)
        .map_err(|e| TablesError::record(&format!("effect {what}"), &ev.id, e))
}

/// A model or tool call's row; other effects (checks, snapshots, the
/// trainer, the clock) have none.
fn effect(
    l: &Ledger,
    ev: &Event,
    s: &mut StreamCtx,
    counts: &mut Counts,
    w: &mut Writers,
) -> Result<()> {
    let e: Effect = decode(ev)?;
    let model = matches!(e.effect.as_str(), "model" | "judge" | "optimizer");
    if (!model && e.effect != "tool") || e.status == EffectStatus::Started {
        return Ok(());
    }
    let attempt = next_attempt(&mut s.attempts, e.request.0, e.status == EffectStatus::Ok);
    let request = json_blob(l, ev, &e.request, "request")?;
    let output = match &e.output {
        Some(o) if e.status == EffectStatus::Ok => Some(json_blob(l, ev, o, "output")?),
        _ => None,
    };
    let meta = l.get_meta(&ev.id)?;
    let latency_us = meta
        .extra
        .get(replay::ELAPSED_META)
        .or_else(|| meta.extra.get("wire.total_us"))
        .and_then(|v| v.parse::<u64>().ok());
    let common = Common {
        status: match e.status {
            EffectStatus::Ok => "ok",
            EffectStatus::Failed => "failed",
            _ => "retriable",
        },
        attempt,
        latency_ms: latency_us.map(|us| us as f64 / 1000.0),
        wall_ms: meta.known_wall_ms(),
    };
    if model {
        let out = output.as_ref().unwrap_or(&Value::Null);
        let usage = |k: &str| out["usage"][k].as_u64();
        if let (Some((cycle, stage)), Some(_)) = (s.stage, &output) {
            let c = counts.calls.entry((cycle, stage)).or_default();
            c.0 += 1;
            c.1 += usage("prompt_tokens").unwrap_or(0);
            c.2 += usage("completion_tokens").unwrap_or(0);
        }
        let row = call_row(ev, &e, s, &common, &request, out);
        w.push(&MODEL_CALLS, row)
    } else {
        let row = tool_row(ev, &e, s, &common, &request, output.as_ref());
        w.push(&TOOL_CALLS, row)
    }
}

/// What model and tool call rows share.
struct Common {
    status: &'static str,
    attempt: u32,
    latency_ms: Option<f64>,
    wall_ms: Option<u64>,
}

fn role(effect: &str, rel: &str) -> String {
    match effect {
        "judge" | "optimizer" => effect.to_string(),
        _ => match rel.rsplit('/').next().unwrap_or(rel) {
            "orch" => "orchestrator".to_string(),
            last if last.starts_with("sub") => "subagent".to_string(),
            last => last.to_string(),
        },
    }
}

fn text(v: &Value) -> Cell {
    v.as_str().map(str::to_string).into()
}

fn failure(e: &Effect) -> Cell {
    match e.status {
        EffectStatus::Ok => Cell::Null,
        _ => e.error.as_str().into(),
    }
}

fn call_row(
    ev: &Event,
    e: &Effect,
    s: &StreamCtx,
    c: &Common,
    request: &Value,
    out: &Value,
) -> Vec<Cell> {
    vec![
        s.run.into(),
        ev.id.to_hex().into(),
        s.rel.into(),
        s.stage.map(|x| x.0).into(),
        s.stage.map(|x| x.1).into(),
        role(&e.effect, s.rel).into(),
        e.effect.as_str().into(),
        text(&request["model"]),
        c.status.into(),
        c.attempt.into(),
        out["usage"]["prompt_tokens"].as_u64().into(),
        out["usage"]["completion_tokens"].as_u64().into(),
        text(&out["finish_reason"]),
        c.latency_ms.into(),
        c.wall_ms.into(),
        hex(&e.request).into(),
        e.output.as_ref().map(hex).into(),
        failure(e),
    ]
}

fn tool_row(
    ev: &Event,
    e: &Effect,
    s: &StreamCtx,
    c: &Common,
    request: &Value,
    out: Option<&Value>,
) -> Vec<Cell> {
    let tree = out.map(|o| text(&o["tree"])).unwrap_or(Cell::Null);
    vec![
        s.run.into(),
        ev.id.to_hex().into(),
        s.rel.into(),
        s.stage.map(|x| x.0).into(),
        s.stage.map(|x| x.1).into(),
        text(&request["tool"]),
        c.status.into(),
        c.attempt.into(),
        c.latency_ms.into(),
        c.wall_ms.into(),
        hex(&e.request).into(),
        e.output.as_ref().map(hex).into(),
        tree,
        failure(e),
    ]
}

fn rollout_row(l: &Ledger, ev: &Event, ctx: &RunContext, s: &StreamCtx) -> Result<Vec<Cell>> {
    let r: Rollout = decode(ev)?;
    // The guard's finding is a parent of the rollout, recorded just before
    // it on the same stream.
    let mut guard = None;
    for p in &ev.parents {
        if let Some(g) = s.guards.get(p) {
            guard = Some(g.clone());
        } else {
            let pe = l.get_event(p)?;
            if pe.kind == "mass.guard" && pe.version == 1 {
                guard = Some(decode::<GuardCheck>(&pe)?);
            }
        }
    }
    let meta = l.get_meta(&ev.id)?;
    let ranked = ctx.ranked.get(&ev.id);
    let guard_excluded = guard
        .as_ref()
        .is_some_and(|g| !g.violations.is_empty() && g.action == "exclude");
    // As `mass runs RUN` decides it (audit::rollouts).
    let selection = match (ctx.selected.get(&ev.id), ranked) {
        (Some(d), _) => Some(*d),
        (None, Some(rk)) if ctx.read_rankings.contains(&rk.2) => Some("not selected"),
        _ if guard_excluded && r.purpose == "collect" => Some("excluded"),
        _ => None,
    };
    Ok(vec![
        s.run.into(),
        ev.id.to_hex().into(),
        s.rel.into(),
        r.task.into(),
        r.purpose.into(),
        r.cycle.into(),
        r.index.into(),
        hex(&r.workflow).into(),
        r.orchestrator_model.into(),
        r.subagent_model.into(),
        r.status.into(),
        r.detail.into(),
        guard.as_ref().map(|g| g.violations.join("; ")).into(),
        guard.map(|g| g.action).into(),
        recorded(&meta, "score_passed", r.score_passed).into(),
        recorded(&meta, "score_total", r.score_total).into(),
        ranked.map(|x| x.0).into(),
        ranked.map(|x| x.1).into(),
        selection.into(),
        r.delegations.into(),
        r.turns.into(),
        r.prompt_tokens.into(),
        r.completion_tokens.into(),
        hex_or_null(&r.tree).into(),
        meta.tree_from().map(str::to_string).into(),
        hex_or_null(&r.validation).into(),
        hex(&r.orchestrator).into(),
        (r.subagents.len() as u64).into(),
    ])
}

fn judgment_row(ev: &Event, ctx: &RunContext, s: &StreamCtx) -> Result<Vec<Cell>> {
    let j: Judgment = decode(ev)?;
    // A run another run folder holds (an imported external judgment) is
    // the zero id: null, not an id.
    let winner = match j.winner.as_str() {
        "a" => hex_or_null(&j.a),
        "b" => hex_or_null(&j.b),
        _ => None,
    };
    let shown_first = if j.swapped {
        hex_or_null(&j.b)
    } else {
        hex_or_null(&j.a)
    };
    Ok(vec![
        s.run.into(),
        ev.id.to_hex().into(),
        s.rel.into(),
        s.stage.map(|x| x.0).into(),
        s.stage.map(|x| x.1).into(),
        j.task.into(),
        hex_or_null(&j.a).into(),
        hex_or_null(&j.b).into(),
        j.swapped.into(),
        shown_first.into(),
        j.judge_model.into(),
        j.winner.into(),
        winner.into(),
        j.invalid_attempts.into(),
        j.rationale.into(),
        hex_or_null(&j.conversation).into(),
        ctx.judgment_evaluation
            .get(&ev.id)
            .map(|e| e.to_hex())
            .into(),
        ctx.judgment_ranking.get(&ev.id).map(|e| e.to_hex()).into(),
    ])
}

fn step_row(ev: &Event, s: &StreamCtx) -> Result<Vec<Cell>> {
    let t: TrainStep = decode(ev)?;
    Ok(vec![
        s.run.into(),
        ev.id.to_hex().into(),
        t.cycle.into(),
        t.step.into(),
        t.epoch.into(),
        t.train_loss.into(),
        t.validation_loss.into(),
        engine::trainer::base_validation_loss(&t.line).into(),
        t.learning_rate.into(),
        t.tokens.into(),
        t.checkpoint.into(),
        t.line.into(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_counts_on_and_the_same_call_made_again_starts_over() {
        let mut m = HashMap::new();
        let (a, b) = ([1u8; 32], [2u8; 32]);
        // a fails twice then succeeds: attempts 1, 2, 3.
        assert_eq!(next_attempt(&mut m, a, false), 1);
        assert_eq!(next_attempt(&mut m, a, false), 2);
        assert_eq!(next_attempt(&mut m, a, true), 3);
        // The same request made again after its success: a new call.
        assert_eq!(next_attempt(&mut m, a, true), 1);
        // Another request in between does not disturb a's count.
        assert_eq!(next_attempt(&mut m, a, false), 1);
        assert_eq!(next_attempt(&mut m, b, true), 1);
        assert_eq!(next_attempt(&mut m, a, true), 2);
    }
}
