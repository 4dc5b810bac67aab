//! Model backends behind one trait. A backend turns a chat request (messages,
//! tools, sampling parameters) into an assistant message; the engine never
//! calls one directly, only through a `model` effect, so every call is
//! recorded and replayable.

pub mod sim;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::chat::{Message, ToolDef, Usage};

/// What is sent to a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    pub temperature: f64,
    pub seed: u64,
    pub max_tokens: u64,
}

/// What a model returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    pub message: Message,
    pub usage: Usage,
    pub finish_reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend {backend}: {detail}")]
    Failed { backend: String, detail: String },
    #[error("backend {backend} does not know model {model:?}")]
    UnknownModel { backend: String, model: String },
}

/// A model server (or the built-in simulation).
pub trait Backend: Send + Sync {
    /// The configured backend name (as in the experiment file).
    fn name(&self) -> &str;
    /// The model name to send for the base (untrained) model.
    fn base_model(&self) -> String;
    /// One chat completion.
    fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, BackendError>;
    /// Makes a trained adapter available under `model` (its bytes are what the
    /// trainer produced). Backends that load adapters server-side ignore this.
    fn register_adapter(&self, _model: &str, _adapter: &[u8]) -> Result<(), BackendError> {
        Ok(())
    }
    /// The trainable state of `model` as the built-in trainer reads it (the
    /// simulated backend's parameters); `None` for servers, whose weights live
    /// with an external trainer.
    fn export_model(&self, _model: &str) -> Option<Vec<u8>> {
        None
    }
}

/// The backends of an experiment, by name.
#[derive(Clone, Default)]
pub struct Backends {
    pub by_name: BTreeMap<String, Arc<dyn Backend>>,
}

impl Backends {
    pub fn get(&self, name: &str) -> Result<&Arc<dyn Backend>, BackendError> {
        self.by_name.get(name).ok_or_else(|| BackendError::Failed {
            backend: name.to_string(),
            detail: "not configured".into(),
        })
    }
}

/// A rough token count for the simulated backend's usage figures (4 bytes a token).
pub fn rough_tokens(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| {
            let args: usize = m
                .tool_calls
                .iter()
                .map(|c| c.function.arguments.len() + c.function.name.len())
                .sum();
            ((m.content_str().len() + args) as u64).div_ceil(4) + 4
        })
        .sum()
}
