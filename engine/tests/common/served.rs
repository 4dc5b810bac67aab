//! What the tests of servers `mass` starts share: a backend on a serve
//! table, a one-message request, and the JSON-lines log a fake server
//! writes (`log.jsonl` in the test's directory).

use std::path::Path;

use engine::backend::openai::OpenAiBackend;
use engine::backend::{Backend, ChatRequest};
use engine::chat::Message;
use engine::config::{OpenAiParams, ServeParams};

/// Backend `policy` for base model `base`, its servers started by `serve`.
pub fn backend(serve: ServeParams, max_concurrency: u32) -> OpenAiBackend {
    let params = OpenAiParams {
        base_url: "http://127.0.0.1/v1".into(),
        base_url_env: None,
        model: "base".into(),
        api_key_env: None,
        api_key_file: None,
        timeout_secs: 10,
        max_retries: 0,
        max_concurrency,
        structured_output: engine::config::StructuredOutput::JsonSchema,
        temperature: 0.0,
        max_tokens: 8,
        lora_adapter: None,
        serve: Some(serve),
    };
    OpenAiBackend::new("policy", &params).unwrap()
}

pub fn request(model: &str, text: &str) -> ChatRequest {
    ChatRequest {
        model: model.into(),
        messages: vec![Message::user(text)],
        tools: Vec::new(),
        temperature: 0.0,
        seed: 1,
        max_tokens: 8,
        top_p: None,
        stop: Vec::new(),
        tool_choice: None,
        response_format: None,
        tools_json: None,
        messages_json: Default::default(),
    }
}

/// The answer's text to "hi" from `model`; panics naming the model on an
/// error.
pub fn ask(b: &OpenAiBackend, model: &str) -> String {
    let r = engine::exec::block_on(b.complete(&request(model, "hi")))
        .expect("runtime")
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    r.message.content.unwrap_or_default()
}

/// The fake server's records, in order.
pub fn log(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("log.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
