//! A rollout's wire traffic split into conversations by content: each
//! request extends the longest earlier one, so the requests form a chain
//! per agent whatever order background subagents interleave in. The chain
//! the first request starts is the orchestrator's, the others are
//! subagents', which is what the dataset trains on.

use std::collections::{BTreeMap, HashMap, HashSet};

use ledger::{Id, Ledger};
use schemas::{Effect, EffectStatus};
use serde_json::Value;

use crate::error::{EngineError, Result};

/// A rollout's wire traffic as conversations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversations {
    /// The orchestrator's last call (its whole conversation by prefixes).
    pub orchestrator: Option<Id>,
    /// Each subagent's last call, in the order the subagents started.
    pub subagents: Vec<Id>,
    /// Exchanges in the range (failed attempts included).
    pub calls: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// The orchestrator's last reply.
    pub report: String,
}

struct WireCall {
    id: Id,
    prefix: Option<Id>,
    ok: bool,
    chat: bool,
    output: Option<Value>,
}

/// Splits the wire events after `from` up to `to` into conversations.
pub fn conversations(ledger: &Ledger, from: Option<Id>, to: Id) -> Result<Conversations> {
    let mut calls = Vec::new();
    for ev in ledger.chain(to) {
        let ev = ev?;
        if Some(ev.id) == from {
            break;
        }
        let e: Effect = schemas::decode_event(&ev)?;
        let req: Value = serde_json::from_slice(&ledger.get_blob(&Id(e.request.0))?)
            .map_err(|x| EngineError::recording("wire request", x))?;
        let output = match e.output {
            Some(o) if e.status == EffectStatus::Ok => Some(
                serde_json::from_slice::<Value>(&ledger.get_blob(&Id(o.0))?)
                    .map_err(|x| EngineError::recording("wire output", x))?,
            ),
            _ => None,
        };
        calls.push(WireCall {
            id: ev.id,
            prefix: req["prefix"].as_str().and_then(|h| h.parse().ok()),
            ok: e.status == EffectStatus::Ok,
            chat: req["messages"].is_array(),
            output,
        });
    }
    calls.reverse();
    let mut out = Conversations {
        calls: calls.len() as u32,
        ..Default::default()
    };
    let prefix_of: HashMap<Id, Option<Id>> = calls.iter().map(|c| (c.id, c.prefix)).collect();
    let extended: HashSet<Id> = calls.iter().filter_map(|c| c.prefix).collect();
    // The first request of a chain, inside the range (a prefix from an
    // earlier attempt on the same stream ends the walk: that attempt's
    // traffic is not this run's).
    let root = |mut id: Id| {
        while let Some(Some(p)) = prefix_of.get(&id) {
            if !prefix_of.contains_key(p) {
                break;
            }
            id = *p;
        }
        id
    };
    let order: HashMap<Id, usize> = calls.iter().enumerate().map(|(i, c)| (c.id, i)).collect();
    let mut last_leaf: BTreeMap<usize, Id> = BTreeMap::new();
    for c in &calls {
        if let Some(o) = &c.output {
            out.prompt_tokens += o["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
            out.completion_tokens += o["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        }
        if c.ok && c.chat && !extended.contains(&c.id) {
            // Leaves in log order: the last of a chain wins.
            last_leaf.insert(order[&root(c.id)], c.id);
        }
    }
    let first_root = calls.iter().find(|c| c.chat).map(|c| order[&root(c.id)]);
    for (r, leaf) in last_leaf {
        if Some(r) == first_root {
            out.orchestrator = Some(leaf);
        } else {
            out.subagents.push(leaf);
        }
    }
    if let Some(o) = out.orchestrator {
        let last = calls
            .iter()
            .find(|c| c.id == o)
            .and_then(|c| c.output.clone());
        out.report = last
            .map(|v| match &v["message"]["content"] {
                Value::String(s) => s.clone(),
                _ => String::new(),
            })
            .unwrap_or_default();
    }
    Ok(out)
}
