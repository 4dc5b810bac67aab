//! A seeded multi-stream test driver exercising every replay mechanism: a main
//! stream of steps, two worker streams per step, journaled and plain effects,
//! a conversation-like effect chain, decisions as events, derived seeds.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use ledger::{Id, NewEvent};
use replay::{Begin, EffectOutput, EffectRequest, Session, Stream, MAIN};
use schemas::Note;
use serde_json::json;

/// How the driver varies (to provoke divergences and to apply overrides).
#[derive(Clone, Debug, Default)]
pub struct Variant {
    /// Add an extra effect in worker `a` of this step.
    pub extra_effect_at_step: Option<u64>,
    /// Change the temperature of the `model` effect from this step on.
    pub temperature_from_step: Option<(u64, f64)>,
    /// Use the `judge` kind for worker b's scoring (for mixed mode).
    pub judge_bias: i64,
}

/// Counts live executions, by effect kind and by request id; can abort the
/// driver after a number of live executions (to simulate a crash in-process).
#[derive(Default)]
pub struct Effects {
    pub by_kind: Mutex<BTreeMap<String, u64>>,
    pub by_request: Mutex<BTreeMap<Id, u64>>,
    pub budget: Mutex<Option<u64>>,
    pub started: AtomicU64,
    /// Appends one line per live execution (request id), for crash tests.
    pub log: Mutex<Option<std::fs::File>>,
    /// Sleep this long in every live execution, so a crash can land mid-run.
    pub delay: Option<std::time::Duration>,
}

#[derive(Debug)]
pub struct Aborted;

impl Effects {
    fn run(&self, req: &EffectRequest) -> Result<(), Aborted> {
        let mut b = self.budget.lock().unwrap();
        if let Some(n) = b.as_mut() {
            if *n == 0 {
                return Err(Aborted);
            }
            *n -= 1;
        }
        if let Some(f) = self.log.lock().unwrap().as_mut() {
            use std::io::Write;
            // One write per line: a kill must not leave half a line that the
            // next process's line is then glued onto.
            f.write_all(format!("{}\n", req.id()).as_bytes()).unwrap();
        }
        if let Some(d) = self.delay {
            std::thread::sleep(d);
        }
        *self
            .by_kind
            .lock()
            .unwrap()
            .entry(req.kind.clone())
            .or_default() += 1;
        *self.by_request.lock().unwrap().entry(req.id()).or_default() += 1;
        Ok(())
    }
}

pub enum DriveError {
    Replay(replay::ReplayError),
    Aborted,
}

impl std::fmt::Debug for DriveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriveError::Replay(e) => write!(f, "{e}"),
            DriveError::Aborted => f.write_str("aborted"),
        }
    }
}

impl From<replay::ReplayError> for DriveError {
    fn from(e: replay::ReplayError) -> Self {
        DriveError::Replay(e)
    }
}

fn note(text: String) -> NewEvent {
    schemas::to_event(&Note { text }).unwrap()
}

/// Runs one effect through the stream; a pure function of the request decides
/// the output, so live and replayed runs agree.
fn effect(
    st: &mut Stream,
    fx: &Effects,
    req: EffectRequest,
    out: impl FnOnce() -> serde_json::Value,
) -> Result<serde_json::Value, DriveError> {
    match st.begin(req.clone())? {
        Begin::Served(r) => Ok(r.json().expect("recorded output")),
        Begin::Perform(p) => {
            fx.run(&req).map_err(|_| DriveError::Aborted)?;
            let v = out();
            let r = st.finish(p, Ok(EffectOutput::json(&v)))?;
            Ok(r.json().expect("output"))
        }
    }
}

/// The driver: `steps` steps on the main stream; returns the main head.
pub fn drive(s: &Session, steps: u64, v: &Variant, fx: &Effects) -> Result<Id, DriveError> {
    let mut main = s.stream(MAIN)?;
    if main.position() == 0 && !main.replaying() {
        main.emit(note(format!("run seed {}", s.seed())))?;
    } else {
        // Replaying: the first event is the run's start; take it as recorded.
        let first = main.peek_history().map(|e| e.kind.clone());
        if first.as_deref() == Some("note") {
            main.emit(note(format!("run seed {}", s.seed())))?;
        }
    }
    let mut overrides: BTreeMap<String, String> = BTreeMap::new();
    let mut total: i64 = 0;
    for step in 0..steps {
        while let Some(f) = main.take_recorded("run.forked") {
            let rf: schemas::RunForked = schemas::decode_event(&f).unwrap();
            for o in rf.overrides {
                overrides.insert(o.key, o.value);
            }
        }
        let bias: i64 = overrides
            .get("bias")
            .and_then(|b| b.parse().ok())
            .unwrap_or(0);
        let mut heads = Vec::new();
        for w in ["a", "b"] {
            let mut st = s.stream(&format!("step/{step}/{w}"))?;
            let seed = st.derive_seed("x");
            let x = (seed % 1000) as i64;
            // A long, journaled computation.
            let c = effect(
                &mut st,
                fx,
                EffectRequest::json("compute", &json!({"x": x, "step": step})).journaled(),
                || json!({"y": x * 3 + 1}),
            )?;
            let y = c["y"].as_i64().unwrap() + bias;
            // A chat-like call whose messages are blobs and whose prefix is the previous call.
            let temp = match v.temperature_from_step {
                Some((from, t)) if step >= from => t,
                _ => 0.7,
            };
            let m1 = serde_json::to_vec(&json!({"role": "user", "content": format!("value {y}")}))
                .unwrap();
            let m1_id = Id::of(ledger::ObjectKind::Blob, &m1);
            let mut req = EffectRequest::json("model", &json!({"model": "sim", "params": {"temperature": temp}, "messages": [m1_id.to_hex()], "prefix": st.head().map(|h| h.to_hex())})).with_blob(m1);
            if let Some(h) = st.head() {
                req = req.with_link(h);
            }
            let r = effect(
                &mut st,
                fx,
                req,
                || json!({"role": "assistant", "content": format!("ok {}", y % 7)}),
            )?;
            if v.extra_effect_at_step == Some(step) && w == "a" {
                effect(
                    &mut st,
                    fx,
                    EffectRequest::json("compute", &json!({"extra": step})),
                    || json!({"y": 0}),
                )?;
            }
            // A judgement-like call (live in mixed-mode tests).
            let j = effect(
                &mut st,
                fx,
                EffectRequest::json(
                    "judge",
                    &json!({"y": y, "reply": r["content"], "step": step, "w": w}),
                ),
                || json!({"score": y % 5 + v.judge_bias}),
            )?;
            total += j["score"].as_i64().unwrap();
            st.emit(note(format!(
                "worker {w} of step {step}: y={y} score={}",
                j["score"]
            )))?;
            heads.push(st.head().unwrap());
        }
        main.emit(note(format!("step {step} total {total}")).with_parents(heads))?;
    }
    Ok(main.head().unwrap())
}

pub fn ledger_in(dir: &std::path::Path) -> Arc<ledger::Ledger> {
    Arc::new(ledger::Ledger::init(dir).unwrap())
}
