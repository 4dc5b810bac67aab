//! The OpenAI chat-completions wire format as the proxy reads it: a request
//! body taken apart into model, messages, tools and the other parameters, and
//! a response body (plain JSON or a server-sent-event stream) reassembled
//! into one assistant message. Nothing here is on the forwarding path: bodies
//! pass through as bytes and are read only to be recorded or matched.

use serde_json::{json, Map, Value};

/// A chat request body taken apart. Field order and whitespace of the
/// original are not kept (the bytes were forwarded as they came; what is
/// recorded is their JSON value).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatBody {
    pub model: String,
    pub messages: Vec<Value>,
    pub tools: Option<Value>,
    /// Every other top-level field (`stream`, `max_tokens`, ...).
    pub params: Map<String, Value>,
}

impl ChatBody {
    /// Reads a request body; `None` when it is not a JSON object with a
    /// `messages` array (then it is recorded as opaque bytes).
    pub fn parse(bytes: &[u8]) -> Option<ChatBody> {
        ChatBody::from_value(serde_json::from_slice::<Value>(bytes).ok()?).ok()
    }

    /// A parsed body taken apart; the value back when it is not a chat
    /// request.
    pub fn from_value(v: Value) -> Result<ChatBody, Value> {
        let mut map = match v {
            Value::Object(m) if m.get("messages").is_some_and(Value::is_array) => m,
            other => return Err(other),
        };
        let Some(Value::Array(messages)) = map.remove("messages") else {
            return Err(Value::Object(map));
        };
        let model = match map.remove("model") {
            Some(Value::String(s)) => s,
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let tools = map.remove("tools");
        Ok(ChatBody {
            model,
            messages,
            tools,
            params: map,
        })
    }

    /// The body as one JSON value again.
    pub fn to_value(&self) -> Value {
        let mut m = self.params.clone();
        m.insert("model".into(), Value::String(self.model.clone()));
        m.insert("messages".into(), Value::Array(self.messages.clone()));
        if let Some(t) = &self.tools {
            m.insert("tools".into(), t.clone());
        }
        Value::Object(m)
    }

    /// Whether the client asked for a server-sent-event stream.
    pub fn streamed(&self) -> bool {
        self.params.get("stream").and_then(Value::as_bool) == Some(true)
    }
}

/// What a response said, reassembled: the assistant message (content, tool
/// calls, reasoning), the finish reason and the token usage.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub message: Value,
    pub finish_reason: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Reply {
    /// As recorded in a model effect's output (the shape the engine's own
    /// model calls record, so transcripts and datasets read both alike).
    pub fn to_value(&self) -> Value {
        json!({
            "message": self.message,
            "finish_reason": self.finish_reason,
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens},
        })
    }
}

fn usage_of(v: &Value) -> (u64, u64) {
    (
        v["prompt_tokens"].as_u64().unwrap_or(0),
        v["completion_tokens"].as_u64().unwrap_or(0),
    )
}

/// Reads a non-streamed chat completion: its first choice.
pub fn reply_from_json(body: &[u8]) -> Option<Reply> {
    reply_from_value(&serde_json::from_slice(body).ok()?)
}

/// `reply_from_json` of the parsed body.
fn reply_from_value(v: &Value) -> Option<Reply> {
    let choice = v["choices"].get(0)?;
    let (p, c) = usage_of(&v["usage"]);
    Some(Reply {
        message: choice["message"].clone(),
        finish_reason: choice["finish_reason"].as_str().unwrap_or("").to_string(),
        prompt_tokens: p,
        completion_tokens: c,
    })
}

/// The `data:` payloads of a server-sent-event body, in order, up to and
/// excluding `[DONE]`. Events are separated by a blank line (`\n\n` or
/// `\r\n\r\n`); an event's data lines are joined with `\n`, as the SSE
/// specification says.
pub fn sse_data(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let mut out = Vec::new();
    let mut data: Vec<&str> = Vec::new();
    let flush = |data: &mut Vec<&str>, out: &mut Vec<String>| {
        if !data.is_empty() {
            out.push(data.join("\n"));
            data.clear();
        }
    };
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            flush(&mut data, &mut out);
        } else if let Some(rest) = line.strip_prefix("data:") {
            data.push(rest.strip_prefix(' ').unwrap_or(rest));
        }
    }
    flush(&mut data, &mut out);
    if let Some(end) = out.iter().position(|d| d.trim() == "[DONE]") {
        out.truncate(end);
    }
    out
}

/// Reassembles a streamed chat completion (first choice): content and
/// reasoning deltas concatenated (reasoning as `reasoning_content`, read
/// from `reasoning_content` or else vLLM's `reasoning` in each delta), tool
/// calls merged by their `index` (id,
/// type and name from the first delta that has them, arguments appended),
/// the last finish reason and usage seen. `None` if no chunk parses.
pub fn reply_from_sse(body: &[u8]) -> Option<Reply> {
    let chunks: Vec<Value> = sse_data(body)
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    reply_from_chunks(chunks.iter())
}

/// `reply_from_sse` of a stream's chunks that parse, in order.
fn reply_from_chunks<'a>(chunks: impl Iterator<Item = &'a Value>) -> Option<Reply> {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls: Vec<(u64, Map<String, Value>, String, String)> = Vec::new();
    let mut finish = String::new();
    let mut usage = (0, 0);
    let mut any = false;
    for chunk in chunks {
        any = true;
        if chunk["usage"].is_object() {
            usage = usage_of(&chunk["usage"]);
        }
        let Some(choice) = chunk["choices"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["index"].as_u64().unwrap_or(0) == 0))
        else {
            continue;
        };
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
        let delta = &choice["delta"];
        if let Some(s) = delta["content"].as_str() {
            content.push_str(s);
        }
        // One name per delta: vLLM sent the same text under both names
        // for a while (`reasoning` new, `reasoning_content` kept).
        if let Some(s) = delta["reasoning_content"]
            .as_str()
            .or_else(|| delta["reasoning"].as_str())
        {
            reasoning.push_str(s);
        }
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = tc["index"].as_u64().unwrap_or(calls.len() as u64);
            let pos = match calls.iter().position(|c| c.0 == index) {
                Some(p) => p,
                None => {
                    calls.push((index, Map::new(), String::new(), String::new()));
                    calls.len() - 1
                }
            };
            let entry = &mut calls[pos];
            for key in ["id", "type"] {
                if let Some(s) = tc[key].as_str() {
                    entry
                        .1
                        .entry(key)
                        .or_insert_with(|| Value::String(s.into()));
                }
            }
            if let Some(s) = tc["function"]["name"].as_str() {
                entry.2.push_str(s);
            }
            if let Some(s) = tc["function"]["arguments"].as_str() {
                entry.3.push_str(s);
            }
        }
    }
    if !any {
        return None;
    }
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert(
        "content".into(),
        if content.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            Value::String(content)
        },
    );
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), Value::String(reasoning));
    }
    if !calls.is_empty() {
        calls.sort_by_key(|c| c.0);
        let list: Vec<Value> = calls
            .into_iter()
            .map(|(_, mut head, name, args)| {
                head.entry("type").or_insert_with(|| json!("function"));
                head.insert("function".into(), json!({"name": name, "arguments": args}));
                Value::Object(head)
            })
            .collect();
        message.insert("tool_calls".into(), Value::Array(list));
    }
    Some(Reply {
        message: Value::Object(message),
        finish_reason: finish,
        prompt_tokens: usage.0,
        completion_tokens: usage.1,
    })
}

/// Why a 2xx chat reply is not a whole answer, though the upstream ended
/// its body cleanly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The body carries an error: a top-level `error` in the JSON reply or
    /// in one of the stream's events, or an SSE event named `error`. The
    /// text is the error as sent.
    InBandError(String),
    /// No choice has a `finish_reason`: the reply stopped before the model
    /// finished (a server or a hop in between ended it early).
    NoFinishReason,
}

/// What is wrong with a 2xx chat reply's body, if anything.
pub fn reply_problem(body: &[u8], event_stream: bool) -> Option<Problem> {
    read_reply(body, event_stream).0
}

/// A chat reply's body read once: what is wrong with it (`reply_problem`)
/// and the reply (`reply_of`). The recorder needs both, and parsing every
/// chunk of a stream twice was 10% of its time.
pub fn read_reply(body: &[u8], event_stream: bool) -> (Option<Problem>, Option<Reply>) {
    if !event_stream {
        return match serde_json::from_slice::<Value>(body) {
            Ok(v) => (
                in_band_error(&v).or((!finished(&v)).then_some(Problem::NoFinishReason)),
                reply_from_value(&v),
            ),
            Err(_) => (None, None),
        };
    }
    // The events up to the first `[DONE]` (sse_data's cut), parsed once.
    let events = sse_events(body);
    let done = events.iter().position(|(_, d)| d.trim() == "[DONE]");
    let parsed: Vec<Option<Value>> = events[..done.unwrap_or(events.len())]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).ok())
        .collect();
    let reply = reply_from_chunks(parsed.iter().flatten());
    (sse_problem(&events, &parsed), reply)
}

/// A top-level `error` that is not null.
fn in_band_error(v: &Value) -> Option<Problem> {
    match v.get("error") {
        Some(Value::Null) | None => None,
        Some(e) => Some(Problem::InBandError(e.to_string())),
    }
}

/// Whether some choice has a finish reason.
fn finished(v: &Value) -> bool {
    v["choices"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["finish_reason"].as_str().is_some_and(|f| !f.is_empty()))
    })
}

/// `reply_problem` of a stream: its events, and the parsed data of those
/// before the first `[DONE]`. An event named `error` counts even as the
/// `[DONE]` one.
fn sse_problem(events: &[(Option<String>, String)], parsed: &[Option<Value>]) -> Option<Problem> {
    let mut any_finish = false;
    for (i, (event, data)) in events.iter().enumerate() {
        if event.as_deref() == Some("error") {
            return Some(Problem::InBandError(data.clone()));
        }
        let Some(v) = parsed.get(i) else {
            break;
        };
        let Some(v) = v else {
            continue;
        };
        if let Some(p) = in_band_error(v) {
            return Some(p);
        }
        any_finish |= finished(v);
    }
    (!any_finish).then_some(Problem::NoFinishReason)
}

/// The events of a server-sent-event body, in order: each event's name
/// (`event:`, if any) and its `data:` lines joined with `\n`.
pub fn sse_events(body: &[u8]) -> Vec<(Option<String>, String)> {
    let text = String::from_utf8_lossy(body);
    let mut out = Vec::new();
    let mut data: Vec<&str> = Vec::new();
    let mut event: Option<String> = None;
    let mut flush = |event: &mut Option<String>, data: &mut Vec<&str>| {
        if !data.is_empty() || event.is_some() {
            out.push((event.take(), data.join("\n")));
            data.clear();
        }
    };
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            flush(&mut event, &mut data);
        } else if let Some(rest) = line.strip_prefix("data:") {
            data.push(rest.strip_prefix(' ').unwrap_or(rest));
        } else if let Some(rest) = line.strip_prefix("event:") {
            event = Some(rest.trim().to_string());
        }
    }
    flush(&mut event, &mut data);
    out
}

/// Reads a response body by its content type.
pub fn reply_of(body: &[u8], event_stream: bool) -> Option<Reply> {
    if event_stream {
        reply_from_sse(body)
    } else {
        reply_from_json(body)
    }
}

/// Request headers never recorded, whatever they hold: credentials.
pub fn is_secret_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "authorization" | "proxy-authorization" | "cookie" | "api-key" | "x-api-key"
    ) || n.contains("token")
        || n.contains("secret")
        || n.ends_with("-key")
}

/// Headers that carry the sender's clock (`Date`, RFC 9110 6.6.1), not
/// the reply: passed to the client, never recorded, so two runs of a
/// deterministic server record the same exchange.
pub fn is_clock_header(name: &str) -> bool {
    name.eq_ignore_ascii_case("date")
}

/// Headers that describe one connection, not the message (RFC 9110 7.6.1),
/// plus those the proxy sets itself: never forwarded or recorded.
pub fn is_hop_header(name: &str) -> bool {
    matches!(
        name.to_ascii_lowercase().as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `reply_problem` as it was before `read_reply` read the body once:
    /// the oracle for `read_reply_reads_as_the_two_passes_did`.
    fn two_pass_problem(body: &[u8], event_stream: bool) -> Option<Problem> {
        if !event_stream {
            let v: Value = serde_json::from_slice(body).ok()?;
            return in_band_error(&v).or((!finished(&v)).then_some(Problem::NoFinishReason));
        }
        let mut any_finish = false;
        for (event, data) in sse_events(body) {
            if event.as_deref() == Some("error") {
                return Some(Problem::InBandError(data));
            }
            if data.trim() == "[DONE]" {
                break;
            }
            let Ok(v) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            if let Some(p) = in_band_error(&v) {
                return Some(p);
            }
            any_finish |= finished(&v);
        }
        (!any_finish).then_some(Problem::NoFinishReason)
    }

    /// Bodies stitched from fragments a stream can hold (chunks with
    /// content, tool calls, finish reasons, usage and errors; `[DONE]`;
    /// named events; empty, CRLF and junk lines) in 20,000 random orders,
    /// and as plain JSON: reading once gives what the two passes gave.
    #[test]
    fn read_reply_reads_as_the_two_passes_did() {
        let frags: &[&str] = &[
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n",
            "data: {\"error\":{\"message\":\"no\"}}\n\n",
            "data: {\"error\":null,\"choices\":[{\"index\":1,\"finish_reason\":\"length\"}]}\n\n",
            "data: [DONE]\n\n",
            "data:[DONE]\r\n\r\n",
            "data:  [DONE] \n\n",
            "event: error\ndata: boom\n\n",
            "event: error\ndata: [DONE]\n\n",
            "event: ping\n\n",
            "data: {\"choices\":\n",
            "data: [{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n",
            ": comment\n",
            "data: not json\n\n",
            "data:\n\n",
            "\r\n",
            "\n",
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        for _ in 0..20_000 {
            let len = next(9);
            let body: String = (0..len).map(|_| frags[next(frags.len())]).collect();
            for es in [true, false] {
                let want = (
                    two_pass_problem(body.as_bytes(), es),
                    reply_of(body.as_bytes(), es),
                );
                assert_eq!(
                    read_reply(body.as_bytes(), es),
                    want,
                    "{body:?}, stream {es}"
                );
            }
        }
        for plain in [
            r#"{"choices":[{"message":{"content":"x"},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"message":{"content":"x"}}]}"#,
            r#"{"error":{"message":"no"},"choices":[]}"#,
            r#"{"choices":[]}"#,
            "not json",
        ] {
            let want = (
                two_pass_problem(plain.as_bytes(), false),
                reply_of(plain.as_bytes(), false),
            );
            assert_eq!(read_reply(plain.as_bytes(), false), want, "{plain}");
        }
    }

    fn sse(chunks: &[Value]) -> Vec<u8> {
        let mut s = String::new();
        for c in chunks {
            s.push_str(&format!("data: {c}\n\n"));
        }
        s.push_str("data: [DONE]\n\n");
        s.into_bytes()
    }

    #[test]
    fn a_streamed_tool_call_split_over_chunks_is_reassembled() {
        let body = sse(&[
            json!({"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"write_file","arguments":"{\"file_"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"path\":\"/w/a\"}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"c2","function":{"name":"glob","arguments":"{}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
            json!({"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":7}}),
        ]);
        let r = reply_from_sse(&body).unwrap();
        assert_eq!(r.finish_reason, "tool_calls");
        assert_eq!((r.prompt_tokens, r.completion_tokens), (11, 7));
        assert_eq!(r.message["content"], Value::Null);
        assert_eq!(
            r.message["tool_calls"],
            json!([
                {"id":"c1","type":"function","function":{"name":"write_file","arguments":"{\"file_path\":\"/w/a\"}"}},
                {"id":"c2","type":"function","function":{"name":"glob","arguments":"{}"}}
            ])
        );
    }

    #[test]
    fn content_and_reasoning_deltas_are_concatenated_across_crlf_events() {
        let body = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"}}]}\r\n\r\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\r\n\r\n: keep-alive\r\n\r\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\r\n\r\ndata: [DONE]\r\n\r\n";
        let r = reply_from_sse(body).unwrap();
        assert_eq!(r.message["content"], "Hello");
        assert_eq!(r.message["reasoning_content"], "hm");
        assert_eq!(r.finish_reason, "stop");
    }

    /// vLLM between renaming `reasoning_content` to `reasoning` and
    /// dropping the old name sent both, with the same text, in each delta:
    /// the thought is kept once, not twice; a delta with only the new name
    /// is read too.
    #[test]
    fn reasoning_sent_under_both_names_is_kept_once() {
        let body = sse(&[
            json!({"choices":[{"index":0,"delta":{"reasoning":"Let me ","reasoning_content":"Let me "}}]}),
            json!({"choices":[{"index":0,"delta":{"reasoning":"think."}}]}),
            json!({"choices":[{"index":0,"delta":{"content":"42"},"finish_reason":"stop"}]}),
        ]);
        let r = reply_from_sse(&body).unwrap();
        assert_eq!(r.message["reasoning_content"], "Let me think.");
        assert_eq!(r.message["content"], "42");
        assert!(r.message.get("reasoning").is_none());
    }

    #[test]
    fn a_request_body_comes_apart_and_back_together() {
        let raw = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}],"stream":true,"max_tokens":5}"#;
        let b = ChatBody::parse(raw).unwrap();
        assert!(b.streamed());
        assert_eq!(b.messages.len(), 1);
        assert_eq!(b.to_value(), serde_json::from_slice::<Value>(raw).unwrap());
        assert!(ChatBody::parse(b"[1]").is_none());
        assert!(ChatBody::parse(b"{\"prompt\":\"x\"}").is_none());
    }

    #[test]
    fn in_band_errors_and_missing_finish_reasons_are_problems() {
        let ok = sse(&[
            json!({"choices":[{"index":0,"delta":{"content":"a"}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
        ]);
        assert_eq!(reply_problem(&ok, true), None);
        let err = sse(&[
            json!({"choices":[{"index":0,"delta":{"content":"a"}}]}),
            json!({"error":{"message":"overloaded","code":503}}),
        ]);
        assert!(matches!(
            reply_problem(&err, true),
            Some(Problem::InBandError(m)) if m.contains("overloaded")
        ));
        let named = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\nevent: error\ndata: boom\n\n";
        assert_eq!(
            reply_problem(named, true),
            Some(Problem::InBandError("boom".into()))
        );
        let unfinished = sse(&[json!({"choices":[{"index":0,"delta":{"content":"a"}}]})]);
        assert_eq!(
            reply_problem(&unfinished, true),
            Some(Problem::NoFinishReason)
        );
        let plain = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}]}"#;
        assert_eq!(reply_problem(plain, false), None);
        let plain_unfinished = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":null}]}"#;
        assert_eq!(
            reply_problem(plain_unfinished, false),
            Some(Problem::NoFinishReason)
        );
        assert!(matches!(
            reply_problem(br#"{"error":{"message":"no"}}"#, false),
            Some(Problem::InBandError(_))
        ));
    }

    #[test]
    fn credentials_are_secret_headers() {
        for h in [
            "Authorization",
            "x-api-key",
            "api-key",
            "X-Goog-Api-Key",
            "cookie",
        ] {
            assert!(is_secret_header(h), "{h}");
        }
        assert!(!is_secret_header("user-agent"));
        assert!(!is_secret_header("content-type"));
    }
}
