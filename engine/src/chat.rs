//! Chat messages, tool calls and tool definitions in the OpenAI chat-completions
//! wire shape: what every backend takes and returns, what the harness keeps,
//! and what dataset export writes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One tool call made by the assistant. `arguments` is a string holding JSON
/// as the model produced it: it may be invalid and must be validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

fn function_type() -> String {
    "function".into()
}

impl ToolCall {
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        ToolCall {
            id: id.into(),
            kind: function_type(),
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.into(),
            },
        }
    }
}

/// A chat message. `content` is `None` for an assistant turn that only calls tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "MessageIn")]
pub struct Message {
    pub role: Role,
    /// On the wire also a list of content parts (external harnesses send
    /// those); their text parts are read joined with newlines, as vLLM
    /// renders them.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// What a reasoning model thought before this assistant turn, as the
    /// server returned it apart from the content (`reasoning_content`, or
    /// vLLM's newer `reasoning`). Written as `reasoning_content` and left out
    /// when `None`, so a message without reasoning has the bytes, and the
    /// blob id, it always had. Never sent back to a server (see
    /// `backend::openai::WireMessages`); kept for transcripts and training.
    #[serde(rename = "reasoning_content", skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// A message as read: `content` in any of its wire shapes, and reasoning
/// under either name. vLLM sent both names with the same text for a while
/// (it renamed `reasoning_content` to `reasoning` and kept the old name for
/// compatibility), so both may be present: `reasoning_content` wins. Only a
/// non-empty string is reasoning; `null`, `""` or another type is none.
#[derive(Deserialize)]
struct MessageIn {
    role: Role,
    #[serde(default, deserialize_with = "content_text")]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCall>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    reasoning_content: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
}

impl From<MessageIn> for Message {
    fn from(m: MessageIn) -> Message {
        let reasoning = reasoning_text(m.reasoning_content.as_ref())
            .or_else(|| reasoning_text(m.reasoning.as_ref()));
        Message {
            role: m.role,
            content: m.content,
            tool_calls: m.tool_calls,
            tool_call_id: m.tool_call_id,
            reasoning,
        }
    }
}

/// A reasoning field's text: a non-empty string, else none.
pub fn reasoning_text(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// A message's `content`: a string, null, or a list of parts of which the
/// `text` ones are kept.
fn content_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| match p {
                    Value::String(s) => Some(s.as_str()),
                    _ => p["text"].as_str(),
                })
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Some(other) => {
            return Err(serde::de::Error::custom(format!(
                "message content must be a string or a list of parts, not {other}"
            )))
        }
    })
}

impl Message {
    pub fn system(text: impl Into<String>) -> Self {
        Self::text(Role::System, text)
    }
    pub fn user(text: impl Into<String>) -> Self {
        Self::text(Role::User, text)
    }
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::text(Role::Assistant, text)
    }
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Message {
            role,
            content: Some(text.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning: None,
        }
    }
    pub fn tool_result(call_id: impl Into<String>, text: impl Into<String>) -> Self {
        Message {
            role: Role::Tool,
            content: Some(text.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
            reasoning: None,
        }
    }
    pub fn tool_calls(calls: Vec<ToolCall>) -> Self {
        Message {
            role: Role::Assistant,
            content: None,
            tool_calls: calls,
            tool_call_id: None,
            reasoning: None,
        }
    }

    /// Canonical bytes (sorted keys, no whitespace): the blob a message is stored as.
    pub fn canonical(&self) -> Vec<u8> {
        let v = serde_json::to_value(self).unwrap_or(Value::Null);
        serde_json::to_vec(&v).unwrap_or_default()
    }

    pub fn content_str(&self) -> &str {
        self.content.as_deref().unwrap_or("")
    }
}

/// A tool offered to the model: `{"type":"function","function":{name, description, parameters}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    pub name: String,
    /// Optional on the wire (external harnesses leave it out of some tools).
    #[serde(default)]
    pub description: String,
    /// Optional on the wire too; left out again when absent.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub parameters: Value,
}

impl ToolDef {
    pub fn new(name: &str, description: &str, parameters: Value) -> Self {
        ToolDef {
            kind: function_type(),
            function: FunctionDef {
                name: name.into(),
                description: description.into(),
                parameters,
            },
        }
    }
}

/// Token usage as reported by a backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_parts_are_read_as_their_text() {
        let m: Message = serde_json::from_value(serde_json::json!({
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "b", "cache_control": {}}]
        }))
        .unwrap();
        assert_eq!(m.content.as_deref(), Some("a\nb"));
        let m: Message =
            serde_json::from_value(serde_json::json!({"role": "assistant", "content": null}))
                .unwrap();
        assert_eq!(m.content, None);
        assert!(serde_json::from_value::<Message>(
            serde_json::json!({"role": "user", "content": 3})
        )
        .is_err());
    }

    /// Reasoning is read under either name (`reasoning_content` first, as
    /// vLLM sent both for a while), only as non-empty text, and written as
    /// `reasoning_content`; a message without it has the bytes it always had.
    #[test]
    fn reasoning_is_read_under_both_names_and_absent_leaves_the_bytes_alone() {
        let read = |v: Value| serde_json::from_value::<Message>(v).unwrap();
        let both = read(serde_json::json!({"role": "assistant", "content": "a",
            "reasoning_content": "old name", "reasoning": "new name"}));
        assert_eq!(both.reasoning.as_deref(), Some("old name"));
        let vllm =
            read(serde_json::json!({"role": "assistant", "content": "a", "reasoning": "new"}));
        assert_eq!(vllm.reasoning.as_deref(), Some("new"));
        assert_eq!(
            vllm.canonical(),
            br#"{"content":"a","reasoning_content":"new","role":"assistant"}"#
        );
        for none in [
            serde_json::json!({"role": "assistant", "content": "a", "reasoning_content": ""}),
            serde_json::json!({"role": "assistant", "content": "a", "reasoning_content": null, "reasoning": {"x": 1}}),
            serde_json::json!({"role": "assistant", "content": "a"}),
        ] {
            let m = read(none);
            assert_eq!(m.reasoning, None);
            assert_eq!(m.canonical(), br#"{"content":"a","role":"assistant"}"#);
        }
    }

    /// A tool call streamed in pieces and reassembled by the proxy is read
    /// by the engine's message type (the transcript rebuilds proxy traffic
    /// into these messages).
    #[test]
    fn a_reassembled_streamed_tool_call_is_read_as_a_message() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"write_file\",\"arguments\":\"{\\\"file_\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"path\\\":\\\"/w/a\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"c2\",\"function\":{\"name\":\"glob\",\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        let r = proxy::wire::reply_from_sse(body.as_bytes()).unwrap();
        let m: Message = serde_json::from_value(r.message).unwrap();
        assert_eq!(m.tool_calls.len(), 2);
        assert_eq!(
            m.tool_calls[0].function.arguments,
            "{\"file_path\":\"/w/a\"}"
        );
    }
}
