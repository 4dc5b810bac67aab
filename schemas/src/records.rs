//! The record types. Each one's layout is documented in `SCHEMAS.md`; changing a
//! field means bumping `VERSION` (and teaching readers the old one).

use crate::{Hash32, Record};

/// `note` v1: a free-text annotation (operator notes, demo markers).
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct Note {
    pub text: String,
}

impl Record for Note {
    const KIND: &'static str = "note";
    const VERSION: u32 = 1;
    fn sample() -> Self {
        Note {
            text: "sample note".into(),
        }
    }
}

/// `model.call` v1: one chat-completion request and its response.
///
/// The request's messages are stored as blobs (canonical JSON, one per message)
/// and shared by content: a conversation's calls chain through `prefix`, so the
/// full request of call *n* is `request(prefix) ++ [response(prefix)] ++ messages`
/// and storage grows with the conversation, not with its square.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct ModelCall {
    /// Which part the model played: `orchestrator`, `subagent`, `judge`, `optimizer`, ...
    pub role: String,
    /// Model (or LoRA adapter) name as sent to the backend.
    pub model: String,
    /// Sampling parameters as canonical JSON (sorted keys), e.g. `{"seed":7,"temperature":0.7}`.
    pub params: String,
    /// An earlier `model.call` event this request extends, if any.
    pub prefix: Option<Hash32>,
    /// Messages after the prefix (blobs of canonical message JSON).
    pub messages: Vec<Hash32>,
    /// Tool definitions (blob of JSON), if tools were offered.
    pub tools: Option<Hash32>,
    /// The assistant message returned (blob of canonical message JSON).
    pub response: Hash32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `stop`, `tool_calls`, `length`, ...
    pub finish_reason: String,
}

impl Record for ModelCall {
    const KIND: &'static str = "model.call";
    const VERSION: u32 = 1;
    fn links(&self) -> Vec<Hash32> {
        let mut v: Vec<Hash32> = self.prefix.iter().copied().collect();
        v.extend(self.messages.iter().copied());
        v.extend(self.tools.iter().copied());
        v.push(self.response);
        v
    }
    fn sample() -> Self {
        ModelCall {
            role: "orchestrator".into(),
            model: "sim-base".into(),
            params: r#"{"seed":7,"temperature":0.7}"#.into(),
            prefix: Some(Hash32([1; 32])),
            messages: vec![Hash32([2; 32]), Hash32([3; 32])],
            tools: Some(Hash32([4; 32])),
            response: Hash32([5; 32]),
            prompt_tokens: 1200,
            completion_tokens: 80,
            finish_reason: "tool_calls".into(),
        }
    }
}

/// `workspace.snapshot` v1: the state of a run's workspace at a labelled point.
#[derive(
    rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, serde::Serialize, Debug, Clone, PartialEq, Eq,
)]
pub struct WorkspaceSnapshot {
    /// `initial`, `final`, or a step label.
    pub label: String,
    /// The tree id.
    pub tree: Hash32,
}

impl Record for WorkspaceSnapshot {
    const KIND: &'static str = "workspace.snapshot";
    const VERSION: u32 = 1;
    fn links(&self) -> Vec<Hash32> {
        vec![self.tree]
    }
    fn sample() -> Self {
        WorkspaceSnapshot {
            label: "final".into(),
            tree: Hash32([6; 32]),
        }
    }
}
