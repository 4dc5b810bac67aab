//! Reconstructs conversations from the ledger: a model effect's request names
//! only the messages added since the previous call of its conversation (its
//! `prefix`), so the full history is rebuilt by following prefixes. The
//! engine's own calls cover the prefix's request and response; the proxy's
//! (`wire` records, see `proxy::log`) cover the prefix's request only. A
//! model's reasoning (`Message::reasoning`) is kept: the engine records it
//! on the reply and in the message blobs of later requests; a proxied
//! client usually sends its replies back without it, and it is put back
//! from the recorded reply (`restore_reasoning`).

use ledger::{Id, Ledger};
use schemas::Effect;
use serde_json::Value;

use crate::chat::{Message, Role, ToolDef};
use crate::error::{EngineError, Result};

/// Effect kinds that are model calls.
pub const MODEL_KINDS: [&str; 3] = ["model", "judge", "optimizer"];

/// One conversation as recorded: every message including the last response,
/// and the tools offered.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcript {
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
}

impl Transcript {
    /// The conversation without the models' reasoning: what drivers before
    /// reasoning was kept trained on (`config::Method::keeps_reasoning`).
    pub fn without_reasoning(mut self) -> Transcript {
        for m in &mut self.messages {
            m.reasoning = None;
        }
        self
    }
}

fn effect_of(ledger: &Ledger, id: &Id) -> Result<Effect> {
    let ev = ledger.get_event(id)?;
    schemas::decode_event(&ev)
        .map_err(|e| EngineError::recording(format!("effect {}", id.short(12)), e))
}

fn blob_json(ledger: &Ledger, hex: &str) -> Result<Value> {
    let id: Id = hex
        .parse()
        .map_err(|e| EngineError::recording("blob id", e))?;
    serde_json::from_slice(&ledger.get_blob(&id)?)
        .map_err(|e| EngineError::recording(format!("blob {}", id.short(12)), e))
}

/// The full request messages and response of the model effect `event`.
pub fn model_call(ledger: &Ledger, event: Id) -> Result<Transcript> {
    let mut chain = Vec::new();
    let mut cur = Some(event);
    while let Some(id) = cur {
        let e = effect_of(ledger, &id)?;
        if !MODEL_KINDS.contains(&e.effect.as_str()) {
            return Err(EngineError::recording(
                format!("event {}", id.short(12)),
                "not a model effect",
            ));
        }
        let req: Value = serde_json::from_slice(&ledger.get_blob(&Id(e.request.0))?)
            .map_err(|x| EngineError::recording("model request", x))?;
        cur = match req["prefix"].as_str() {
            Some(h) => Some(
                h.parse()
                    .map_err(|x| EngineError::recording("prefix id", x))?,
            ),
            None => None,
        };
        chain.push((e, req));
    }
    chain.reverse();
    let mut messages = Vec::new();
    let mut tools = Vec::new();
    let last = chain.len().saturating_sub(1);
    // The reply of the previous proxied call, whose reasoning its client may
    // not have sent back.
    let mut replied: Option<Message> = None;
    for (i, (e, req)) in chain.into_iter().enumerate() {
        let first_new = messages.len();
        for m in req["messages"].as_array().into_iter().flatten() {
            let v = blob_json(ledger, m.as_str().unwrap_or_default())?;
            messages
                .push(serde_json::from_value(v).map_err(|x| EngineError::recording("message", x))?);
        }
        if let Some(reply) = replied.take() {
            restore_reasoning(&mut messages[first_new..], &reply);
        }
        if let Some(t) = req["tools"].as_str() {
            tools = serde_json::from_value(blob_json(ledger, t)?)
                .map_err(|x| EngineError::recording("tools", x))?;
        }
        // Each engine call's response is part of the next call's history.
        // A proxied client (`wire` records) sends the response back itself,
        // as the next request's first new message; its reply is read only
        // for the reasoning the client may have left out (a failed exchange
        // has none, and no reply to read).
        if i != last && req["wire"].is_u64() {
            replied = reply_of(ledger, &e).ok();
            continue;
        }
        messages.push(reply_of(ledger, &e)?);
    }
    Ok(Transcript { messages, tools })
}

/// The reply message a model effect recorded.
fn reply_of(ledger: &Ledger, e: &Effect) -> Result<Message> {
    let out = e
        .output
        .ok_or_else(|| EngineError::recording("model effect", "no output"))?;
    let resp: Value = serde_json::from_slice(&ledger.get_blob(&Id(out.0))?)
        .map_err(|x| EngineError::recording("model output", x))?;
    serde_json::from_value(resp["message"].clone())
        .map_err(|x| EngineError::recording("response message", x))
}

/// A proxied client sends its model's reply back as the first new message
/// of its next request, usually without the reasoning the server returned
/// beside the content (chat clients drop it, as chat templates do). That
/// reasoning is what the model thought before the turn, recorded in the
/// reply: put it back on the echoed turn, found as the first assistant
/// message of the new ones, when that turn carries none and says what the
/// reply said (the same tool calls by id and name, or, without calls, the
/// same text but for surrounding whitespace). A turn the client rewrote
/// gets none: reasoning is never attached to words the model did not say.
fn restore_reasoning(new: &mut [Message], reply: &Message) {
    let Some(reasoning) = &reply.reasoning else {
        return;
    };
    let Some(echo) = new.iter_mut().find(|m| m.role == Role::Assistant) else {
        return;
    };
    let same_calls = echo.tool_calls.len() == reply.tool_calls.len()
        && echo
            .tool_calls
            .iter()
            .zip(&reply.tool_calls)
            .all(|(a, b)| a.id == b.id && a.function.name == b.function.name);
    let same_text = echo.content_str().trim() == reply.content_str().trim();
    let same = if reply.tool_calls.is_empty() {
        same_calls && same_text
    } else {
        same_calls
    };
    if echo.reasoning.is_none() && same {
        echo.reasoning = Some(reasoning.clone());
    }
}

/// The conversation of a stream ending at `head`: its last model call.
pub fn stream_conversation(ledger: &Ledger, head: Id) -> Result<Option<Transcript>> {
    for ev in ledger.chain(head) {
        let ev = ev?;
        if ev.kind == "effect" {
            let e: Effect =
                schemas::decode_event(&ev).map_err(|x| EngineError::recording("effect", x))?;
            if MODEL_KINDS.contains(&e.effect.as_str()) && e.status == schemas::EffectStatus::Ok {
                return model_call(ledger, ev.id).map(Some);
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ToolCall;

    fn thinking(mut m: Message) -> Message {
        m.reasoning = Some("because".into());
        m
    }

    /// The echoed reply gets its reasoning back; a turn the client rewrote,
    /// or one with other tool calls, gets none; reasoning the client sent
    /// itself stays.
    #[test]
    fn reasoning_goes_back_only_on_the_turn_that_said_the_same() {
        let reply = thinking(Message::assistant("Done."));
        let mut new = vec![Message::assistant(" Done.\n"), Message::user("ok")];
        restore_reasoning(&mut new, &reply);
        assert_eq!(new[0].reasoning.as_deref(), Some("because"));
        assert_eq!(new[1].reasoning, None);

        let mut rewritten = vec![Message::assistant("Done, I think.")];
        restore_reasoning(&mut rewritten, &reply);
        assert_eq!(rewritten[0].reasoning, None);

        let call = |id: &str| ToolCall::new(id, "write_file", "{}");
        let reply = thinking(Message::tool_calls(vec![call("c1")]));
        let mut other = vec![Message::tool_calls(vec![call("c2")])];
        restore_reasoning(&mut other, &reply);
        assert_eq!(other[0].reasoning, None);
        // The same call, its arguments re-serialised by the client: the same turn.
        let mut echoed = Message::tool_calls(vec![ToolCall::new("c1", "write_file", "{ }")]);
        echoed.content = Some(String::new());
        let mut same = vec![echoed];
        restore_reasoning(&mut same, &reply);
        assert_eq!(same[0].reasoning.as_deref(), Some("because"));

        let mut own = vec![Message::assistant("Done.")];
        own[0].reasoning = Some("the client's".into());
        restore_reasoning(&mut own, &thinking(Message::assistant("Done.")));
        assert_eq!(own[0].reasoning.as_deref(), Some("the client's"));
    }
}
