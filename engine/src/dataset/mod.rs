//! Training-data export: the end of the MASS outer loop (MASS.md steps 4-6).
//!
//! Selected runs arrive here as [`Example`]s (one per agent of a run: the
//! orchestrator's and each subagent's) already assigned to an [`ExampleSplit`]. This module
//!
//! * removes the workflow text from an orchestrator's first prompt
//!   ([`strip_orchestrator_workflow`], step 5), so the model learns to organise the
//!   team without being told how;
//! * validates every conversation before it is written ([`validate`]): a malformed
//!   line is either rejected by the trainer or, worse, silently trains the model
//!   on a broken tool protocol;
//! * renders one JSON line per conversation in one of two wire formats
//!   ([`to_openai_line`], [`to_trl_line`]) and parses both back
//!   ([`parse_openai_line`], [`parse_trl_line`]) so tests can prove nothing is
//!   lost on the way;
//! * counts supervised tokens, the cost unit the paper reports ("28.8 M supervised
//!   tokens"), with a documented offline estimator ([`estimate_tokens`]);
//! * writes (or renders in memory, for the ledger) the train and validation files
//!   ([`write_dataset`], [`render_dataset`]).
//!
//! # Wire formats
//!
//! **OpenAI** (supervised fine-tuning line, `FineTuneChatRequestInput`):
//! `{"messages": [...], "tools": [...], "parallel_tool_calls": bool}`. Assistant
//! tool calls are `{"id", "type": "function", "function": {"name", "arguments"}}`
//! with `arguments` a JSON *string* holding exactly what the model produced; an
//! assistant turn that only calls tools has no `content` key; tool messages carry
//! `tool_call_id`. `tools` and `parallel_tool_calls` are omitted when the
//! conversation offered no tools, because the OpenAI API rejects
//! `parallel_tool_calls` without `tools`. `parallel_tool_calls` is `false` unless
//! some assistant turn really made several calls at once, in which case it is
//! `true`: declaring `false` over an example that contradicts it would teach (or
//! be rejected as) an inconsistent protocol.
//!
//! **TRL** (conversational language modelling with a `tools` column, as in TRL's
//! `dataset_formats.md` "Tool Calling" and Axolotl's `chat_template` datasets):
//! `{"messages": [...], "tools": [...]}`. Assistant tool calls are
//! `{"id", "type": "function", "function": {"name", "arguments": <JSON object>}}`:
//! chat templates (Qwen's among them) render `arguments` with `tojson`, so they
//! want the parsed object. Arguments that are not a JSON object (invalid JSON, or
//! valid JSON of another type) are kept as the original string and reported as a
//! warning instead of failing the export: it is what the model emitted. Tool
//! messages carry `tool_call_id` and the `name` of the function they answer.
//! The call `id` is not needed by most templates (Mistral's excepted) but is kept
//! so the line parses back to exactly the recorded messages; unknown keys are
//! ignored by templates.
//!
//! **Reasoning**, in both formats: an assistant turn whose model returned
//! reasoning apart from its content ([`Message::reasoning`]) carries it as
//! `reasoning_content`, the key Qwen3's chat template and
//! `trainers/chatml_tools.jinja` render (as `<think>...</think>` before the
//! content, a training target like the rest of the turn); a turn without
//! reasoning has no such key, so a conversation without reasoning renders
//! as it always did. OpenAI's hosted fine-tuning documents no such key: a
//! dataset with reasoning is for trainers that read it.
//!
//! Round trips: OpenAI line -> messages is exact. TRL line -> messages is exact up
//! to [`normalise_arguments`] (object arguments come back as compact JSON with
//! sorted keys): whitespace and key order of an arguments string are not
//! significant, its parsed value is. Numbers that `serde_json` cannot hold exactly
//! (integers beyond 64 bits, more than 15 significant digits) are flagged by a
//! warning because the TRL normalisation could change their value.
//!
//! # Where things live
//!
//! The types and errors are here; step 5 in `strip.rs`, the conversation
//! rules in `validate.rs`, tool-call arguments and warnings in
//! `arguments.rs`, the wire formats in `render.rs` (writing) and `parse.rs`
//! (reading back), token estimates in `tokens.rs`, and whole datasets in
//! `export.rs`. Everything public is re-exported here, so
//! `crate::dataset::X` names it wherever it is defined.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::chat::{Message, Role, ToolDef};

mod arguments;
mod export;
mod leak;
mod parse;
mod render;
mod strip;
mod tokens;
mod validate;

pub use arguments::{normalise_arguments, warnings};
pub use export::{openai_to_trl, render_dataset, write_dataset};
pub use leak::{allowed_text, line_leak, Leak, WorkflowLeak, WorkflowText};
pub use parse::{parse_openai_line, parse_trl_line};
pub use render::{to_line, to_openai_line, to_trl_line};
pub use strip::{
    strip_orchestrator_workflow, strip_orchestrator_workflow_within, strip_workflow_everywhere,
};
pub use tokens::{estimate_tokens, supervised_tokens, total_tokens};
pub use validate::validate;

/// Which part of the team a conversation belongs to. Only the orchestrator's first
/// prompt carries the workflow that step 5 removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    Orchestrator,
    Subagent,
}

/// Train (ranks 1-15) or validation (rank 16, used for checkpoint selection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExampleSplit {
    Train,
    Validation,
}

/// One agent's conversation from one selected run: one training example.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Example {
    /// Unique within a dataset; named in every error and warning.
    pub id: String,
    /// The run this conversation came from; all conversations of a run must share a split.
    pub run: String,
    pub agent: AgentKind,
    pub messages: Vec<Message>,
    /// The tools offered to the agent: the chat template renders them into the prompt.
    pub tools: Vec<ToolDef>,
    pub split: ExampleSplit,
}

/// Output wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    OpenAi,
    Trl,
}

/// What was written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetSummary {
    pub train_examples: u64,
    pub validation_examples: u64,
    /// [`supervised_tokens`] summed over the split (an estimate, see [`estimate_tokens`]).
    pub train_supervised_tokens: u64,
    pub validation_supervised_tokens: u64,
    /// Problems that did not stop the export (see [`warnings`]), in input order.
    pub warnings: Vec<String>,
}

/// A line parsed back into the chat types.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedLine {
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    /// As written in the line; `None` when absent (always for TRL lines we write).
    pub parallel_tool_calls: Option<bool>,
}

/// Where in a conversation (or line) a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// The conversation (or line) as a whole.
    Whole,
    /// `messages[index]`.
    Message(usize),
    /// `messages[message].tool_calls[call]`.
    ToolCall { message: usize, call: usize },
    /// `tools[index]`.
    Tool(usize),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Whole => Ok(()),
            Location::Message(i) => write!(f, "message {i}: "),
            Location::ToolCall { message, call } => {
                write!(f, "message {message}, tool call {call}: ")
            }
            Location::Tool(i) => write!(f, "tools[{i}]: "),
        }
    }
}

/// Why a conversation cannot be exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    NoMessages,
    /// Chat templates and the OpenAI validator expect a system or user message first.
    FirstMessageRole(Role),
    /// Nothing to train on: every token would be masked.
    NoAssistantMessage,
    /// An assistant message with neither content nor tool calls.
    EmptyAssistantMessage,
    /// A system, user or tool message without content.
    MissingContent(Role),
    ToolCallsOutsideAssistant(Role),
    ToolCallIdOutsideToolMessage(Role),
    /// Reasoning is what an assistant turn thought; on another role it
    /// would be trained as if the model had said it.
    ReasoningOutsideAssistant(Role),
    ToolMessageWithoutCallId,
    /// The id was never issued by an earlier assistant message.
    UnknownToolCallId(String),
    /// The id was issued earlier but already answered.
    ToolCallAlreadyAnswered(String),
    /// The id is issued while a call with the same id is still unanswered, so a
    /// result could not be attributed.
    DuplicateToolCallId(String),
    EmptyToolCallId,
    EmptyFunctionName,
    /// Only `"function"` tool calls / tools exist in this system.
    NotAFunction(String),
    /// OpenAI: `a-z A-Z 0-9 _ -`, 1 to 64 characters.
    InvalidToolName(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NoMessages => write!(f, "has no messages"),
            Problem::FirstMessageRole(r) => {
                write!(f, "first message is {r:?}, must be System or User")
            }
            Problem::NoAssistantMessage => {
                write!(f, "has no assistant message, so nothing to train on")
            }
            Problem::EmptyAssistantMessage => {
                write!(f, "assistant message has neither content nor tool calls")
            }
            Problem::MissingContent(r) => write!(f, "{r:?} message has no content"),
            Problem::ToolCallsOutsideAssistant(r) => {
                write!(f, "{r:?} message carries tool calls; only assistant messages may")
            }
            Problem::ToolCallIdOutsideToolMessage(r) => {
                write!(f, "{r:?} message carries a tool_call_id; only tool messages may")
            }
            Problem::ReasoningOutsideAssistant(r) => {
                write!(f, "{r:?} message carries reasoning; only assistant messages may")
            }
            Problem::ToolMessageWithoutCallId => write!(f, "tool message has no tool_call_id"),
            Problem::UnknownToolCallId(id) => write!(
                f,
                "tool message answers tool_call_id {id:?}, which no earlier assistant message issued"
            ),
            Problem::ToolCallAlreadyAnswered(id) => {
                write!(f, "tool message answers tool_call_id {id:?}, which was already answered")
            }
            Problem::DuplicateToolCallId(id) => write!(
                f,
                "tool call id {id:?} is issued again while a call with that id is unanswered"
            ),
            Problem::EmptyToolCallId => write!(f, "tool call has an empty id"),
            Problem::EmptyFunctionName => write!(f, "tool call has an empty function name"),
            Problem::NotAFunction(kind) => write!(f, "type is {kind:?}, must be \"function\""),
            Problem::InvalidToolName(name) => write!(
                f,
                "tool name {name:?} must be 1-64 characters of a-z, A-Z, 0-9, '_' or '-'"
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("conversation {conversation:?}: {at}{problem}")]
    Invalid {
        conversation: String,
        at: Location,
        problem: Problem,
    },
    #[error("conversation id {0:?} appears more than once in the dataset")]
    DuplicateConversation(String),
    /// One run feeding both splits would leak training data into the validation
    /// loss that selects the checkpoint.
    #[error(
        "run {run:?} has conversations in both splits (train {train:?}, validation {validation:?})"
    )]
    RunInBothSplits {
        run: String,
        train: String,
        validation: String,
    },
    #[error("line is not valid JSON: {0}")]
    LineJson(#[source] serde_json::Error),
    #[error("line: {at}{reason}")]
    Line { at: Location, reason: String },
    #[error("train and validation paths are the same file: {}", .0.display())]
    SamePath(PathBuf),
    #[error("cannot write {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::arguments::lossy_numbers;
    use super::render::tools_value;
    use super::*;
    use crate::chat::ToolCall;
    use serde_json::{json, Value};

    const FIXTURE: &str = include_str!("../../tests/fixtures/tool_calls_wire_formats.json");

    fn fixture() -> Value {
        serde_json::from_str(FIXTURE).expect("fixture is JSON")
    }

    fn read_tool() -> ToolDef {
        ToolDef::new(
            "read_file",
            "Read a file of the workspace",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        )
    }

    fn conv(id: &str, run: &str, split: ExampleSplit, messages: Vec<Message>) -> Example {
        Example {
            id: id.into(),
            run: run.into(),
            agent: AgentKind::Subagent,
            messages,
            tools: vec![read_tool()],
            split,
        }
    }

    /// A realistic orchestrator conversation: text + call, two parallel calls (one
    /// with invalid arguments), unicode and newlines, a final answer.
    fn sample() -> Example {
        Example {
            id: "run1/orchestrator".into(),
            run: "run1".into(),
            agent: AgentKind::Orchestrator,
            messages: vec![
                Message::system("You are the orchestrator."),
                Message::user("Task: price the option.\n\nWorkflow: agents A, B; hops A->B."),
                Message {
                    role: Role::Assistant,
                    content: Some("I will read the data first.".into()),
                    tool_calls: vec![ToolCall::new(
                        "call_1",
                        "read_file",
                        r#"{ "path": "data/prices.csv",  "limit": 10 }"#,
                    )],
                    tool_call_id: None,
                    reasoning: None,
                },
                Message::tool_result("call_1", "date,price\n2024-01-02,101.5"),
                Message::tool_calls(vec![
                    ToolCall::new("call_2", "read_file", r#"{"path": "café/日本.txt"}"#),
                    ToolCall::new("call_3", "read_file", r#"{"path": "x.txt""#),
                ]),
                Message::tool_result("call_3", "error: invalid arguments"),
                Message::tool_result("call_2", "ünïcode ✓"),
                Message::assistant("Done: the report is in report.md.\n\"quoted\""),
            ],
            tools: vec![read_tool()],
            split: ExampleSplit::Train,
        }
    }

    fn normalised(messages: &[Message]) -> Vec<Message> {
        let mut out = messages.to_vec();
        for m in &mut out {
            for c in &mut m.tool_calls {
                c.function.arguments = normalise_arguments(&c.function.arguments);
            }
        }
        out
    }

    fn problem_of(err: DatasetError) -> (Location, Problem) {
        match err {
            DatasetError::Invalid { at, problem, .. } => (at, problem),
            other => panic!("expected Invalid, got {other}"),
        }
    }

    // --- token estimates -------------------------------------------------------

    #[test]
    fn estimate_tokens_on_fixed_strings() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("  \n\t "), 0);
        // Hello(5 -> 2) ,(1) world(5 -> 2) !(1)
        assert_eq!(estimate_tokens("Hello, world!"), 6);
        // The(1) year(1) 2024(2) had(1) 365(1) days(1) .(1)
        assert_eq!(estimate_tokens("The year 2024 had 365 days."), 8);
        assert_eq!(estimate_tokens("internationalization"), 5); // 20 letters
        assert_eq!(estimate_tokens("1234567"), 3); // 3 + 3 + 1 digits
        assert_eq!(estimate_tokens("abc123"), 2);
        // { " path " : " src / main . rs " }: 13 single tokens
        assert_eq!(estimate_tokens(r#"{"path": "src/main.rs"}"#), 13);
        // snake(2) _ case(1) _ name(1)
        assert_eq!(estimate_tokens("snake_case_name"), 6);
        // na ï ve | caf é | three CJK chars
        assert_eq!(estimate_tokens("naïve café 日本語"), 8);
    }

    #[test]
    fn supervised_tokens_count_only_assistant_turns() {
        let c = conv(
            "c",
            "r",
            ExampleSplit::Train,
            vec![
                Message::user("Please read the file"),
                Message {
                    role: Role::Assistant,
                    content: Some("Sure.".into()),
                    tool_calls: vec![ToolCall::new("k", "read_file", r#"{"path":"a"}"#)],
                    tool_call_id: None,
                    reasoning: None,
                },
                Message::tool_result("k", "lots of file content here"),
                Message::assistant("ok"),
            ],
        );
        // Sure.(2) + read_file(read 1, _ 1, file 1) + {"path":"a"}({ " path " : " a " } = 9) + ok(1)
        assert_eq!(supervised_tokens(&c), 2 + 3 + 9 + 1);
        // user: Please(2) read(1) the(1) file(1); tool: lots(1) of(1) file(1) content(2) here(1)
        let messages = 15 + 5 + 6;
        let tools = estimate_tokens(&tools_value(&c.tools).to_string());
        assert!(tools > 0);
        assert_eq!(total_tokens(&c), messages + tools);
        let mut bare = c.clone();
        bare.tools.clear();
        assert_eq!(total_tokens(&bare), messages);
    }

    // --- OpenAI format ---------------------------------------------------------

    #[test]
    fn openai_line_shape() {
        let c = sample();
        let line = to_openai_line(&c).unwrap();
        assert!(!line.contains('\n'), "a JSONL line must be one line");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["parallel_tool_calls"], json!(true)); // message 4 makes two calls
        assert_eq!(v["tools"], tools_value(&c.tools));
        let m = &v["messages"];
        assert_eq!(
            m[0],
            json!({"role": "system", "content": "You are the orchestrator."})
        );
        assert_eq!(
            m[2]["tool_calls"][0],
            json!({"id": "call_1", "type": "function", "function": {
                "name": "read_file",
                "arguments": "{ \"path\": \"data/prices.csv\",  \"limit\": 10 }"}})
        );
        // Tool-only assistant turn: no content key.
        assert!(m[4].get("content").is_none());
        assert_eq!(
            m[4]["tool_calls"][1]["function"]["arguments"],
            json!("{\"path\": \"x.txt\"")
        );
        assert_eq!(
            m[5],
            json!({"role": "tool", "tool_call_id": "call_3", "content": "error: invalid arguments"})
        );
    }

    #[test]
    fn openai_parallel_flag_and_tools_omitted_without_tools() {
        let mut c = conv(
            "c",
            "r",
            ExampleSplit::Train,
            vec![Message::user("hi"), Message::assistant("hello")],
        );
        let v: Value = serde_json::from_str(&to_openai_line(&c).unwrap()).unwrap();
        assert_eq!(v["parallel_tool_calls"], json!(false));
        c.tools.clear();
        let v: Value = serde_json::from_str(&to_openai_line(&c).unwrap()).unwrap();
        assert_eq!(
            v,
            json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}]})
        );
    }

    #[test]
    fn openai_round_trip_is_exact() {
        let c = sample();
        let parsed = parse_openai_line(&to_openai_line(&c).unwrap()).unwrap();
        assert_eq!(parsed.messages, c.messages);
        assert_eq!(parsed.tools, c.tools);
        assert_eq!(parsed.parallel_tool_calls, Some(true));
    }

    #[test]
    fn openai_spec_example_parses_and_renders_back() {
        let example =
            fixture()["openai_fine_tuning_supervised_jsonl_line"]["example_from_spec"].clone();
        let parsed = parse_openai_line(&example.to_string()).unwrap();
        assert_eq!(parsed.parallel_tool_calls, Some(false));
        assert_eq!(parsed.messages.len(), 2);
        assert_eq!(parsed.messages[1].content, None);
        assert_eq!(
            parsed.messages[1].tool_calls[0].function.name,
            "get_current_weather"
        );
        let c = Example {
            id: "spec".into(),
            run: "spec".into(),
            agent: AgentKind::Subagent,
            messages: parsed.messages,
            tools: parsed.tools,
            split: ExampleSplit::Train,
        };
        let rendered: Value = serde_json::from_str(&to_openai_line(&c).unwrap()).unwrap();
        assert_eq!(rendered, example);
    }

    // --- TRL format ------------------------------------------------------------

    #[test]
    fn trl_line_shape() {
        let c = sample();
        let line = to_trl_line(&c).unwrap();
        assert!(!line.contains('\n'));
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v.as_object().unwrap().len(),
            2,
            "only messages and tools: {v}"
        );
        assert_eq!(v["tools"], tools_value(&c.tools));
        let m = &v["messages"];
        assert_eq!(
            m[2]["tool_calls"][0],
            json!({"id": "call_1", "type": "function", "function": {
                "name": "read_file", "arguments": {"path": "data/prices.csv", "limit": 10}}})
        );
        assert!(m[4].get("content").is_none());
        assert_eq!(
            m[4]["tool_calls"][0]["function"]["arguments"],
            json!({"path": "café/日本.txt"})
        );
        // Invalid JSON stays the model's string.
        assert_eq!(
            m[4]["tool_calls"][1]["function"]["arguments"],
            json!("{\"path\": \"x.txt\"")
        );
        assert_eq!(
            m[6],
            json!({"role": "tool", "tool_call_id": "call_2", "name": "read_file", "content": "ünïcode ✓"})
        );
    }

    #[test]
    fn trl_round_trip_preserves_messages_with_normalised_arguments() {
        let c = sample();
        let parsed = parse_trl_line(&to_trl_line(&c).unwrap()).unwrap();
        assert_eq!(parsed.messages, normalised(&c.messages));
        assert_eq!(parsed.tools, c.tools);
        assert_eq!(parsed.parallel_tool_calls, None);
        // Arguments compare equal as parsed JSON, the invalid one byte for byte.
        let before: Value =
            serde_json::from_str(&c.messages[2].tool_calls[0].function.arguments).unwrap();
        let after: Value =
            serde_json::from_str(&parsed.messages[2].tool_calls[0].function.arguments).unwrap();
        assert_eq!(before, after);
        assert_eq!(
            parsed.messages[4].tool_calls[1].function.arguments,
            r#"{"path": "x.txt""#
        );
        // And the OpenAI rendering of the parsed messages is a valid line again.
        let mut again = c.clone();
        again.messages = parsed.messages;
        assert!(to_openai_line(&again).is_ok());
    }

    #[test]
    fn trl_non_object_arguments_kept_as_string() {
        let c = conv(
            "c",
            "r",
            ExampleSplit::Train,
            vec![
                Message::user("go"),
                Message::tool_calls(vec![ToolCall::new("a", "read_file", "[1, 2]")]),
            ],
        );
        let v: Value = serde_json::from_str(&to_trl_line(&c).unwrap()).unwrap();
        assert_eq!(
            v["messages"][1]["tool_calls"][0]["function"]["arguments"],
            json!("[1, 2]")
        );
        let parsed = parse_trl_line(&v.to_string()).unwrap();
        assert_eq!(parsed.messages, c.messages);
    }

    #[test]
    fn trl_docs_example_parses_and_renders_to_the_same_shape() {
        let example = fixture()["trl_sft_conversational"]["tool_calling_example_from_docs"]
            ["messages"]
            .clone();
        // The docs' tools entry is a placeholder, so parse the messages alone.
        let parsed = parse_trl_line(&json!({"messages": example}).to_string()).unwrap();
        let call = &parsed.messages[1].tool_calls[0];
        assert_eq!(call.id, "call_1_0"); // synthesised
        assert_eq!(call.function.name, "control_light");
        assert_eq!(
            call.function.arguments,
            r#"{"room":"living room","state":"on"}"#
        );
        assert_eq!(parsed.messages[2].tool_call_id.as_deref(), Some("call_1_0"));
        let c = Example {
            id: "trl-docs".into(),
            run: "trl-docs".into(),
            agent: AgentKind::Subagent,
            messages: parsed.messages,
            tools: vec![ToolDef::new(
                "control_light",
                "Controls the lights in a room.",
                json!({"type": "object", "properties": {"room": {"type": "string"}, "state": {"type": "string"}}}),
            )],
            split: ExampleSplit::Train,
        };
        let mut rendered: Value = serde_json::from_str(&to_trl_line(&c).unwrap()).unwrap();
        // Our extra keys (id, tool_call_id) aside, the messages are the docs' own.
        for m in rendered["messages"].as_array_mut().unwrap() {
            let m = m.as_object_mut().unwrap();
            m.remove("tool_call_id");
            for call in m
                .get_mut("tool_calls")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                call.as_object_mut().unwrap().remove("id");
            }
        }
        assert_eq!(rendered["messages"], example);
    }

    #[test]
    fn trl_parse_matches_unnamed_results_by_name_then_order() {
        let line = json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [
                {"function": {"name": "a", "arguments": {}}},
                {"function": {"name": "b", "arguments": {}}},
                {"id": "call_1_2", "function": {"name": "c", "arguments": {}}}]},
            {"role": "tool", "name": "b", "content": "rb"},
            {"role": "tool", "content": "ra"},
            {"role": "tool", "tool_call_id": "call_1_2", "content": "rc"}]});
        let parsed = parse_trl_line(&line.to_string()).unwrap();
        let ids: Vec<&str> = parsed.messages[1]
            .tool_calls
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(ids, ["call_1_0", "call_1_1", "call_1_2"]);
        assert_eq!(parsed.messages[2].tool_call_id.as_deref(), Some("call_1_1"));
        assert_eq!(parsed.messages[3].tool_call_id.as_deref(), Some("call_1_0"));
        assert_eq!(parsed.messages[4].tool_call_id.as_deref(), Some("call_1_2"));

        // Synthesised ids avoid explicit ones.
        let line = json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [
                {"id": "call_1_1", "function": {"name": "a", "arguments": {}}},
                {"function": {"name": "b", "arguments": {}}}]}]});
        let parsed = parse_trl_line(&line.to_string()).unwrap();
        assert_eq!(parsed.messages[1].tool_calls[1].id, "call_1_1_1");

        let orphan = json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "tool", "name": "a", "content": "r"}]});
        assert!(matches!(
            parse_trl_line(&orphan.to_string()),
            Err(DatasetError::Line {
                at: Location::Message(1),
                ..
            })
        ));
    }

    // --- warnings --------------------------------------------------------------

    #[test]
    fn warnings_name_invalid_arguments_per_format() {
        let c = sample();
        let trl = warnings(&c, Format::Trl);
        assert_eq!(trl.len(), 1, "{trl:?}");
        assert!(trl[0].contains("\"run1/orchestrator\""), "{}", trl[0]);
        assert!(trl[0].contains("message 4, tool call 1"), "{}", trl[0]);
        assert!(trl[0].contains("not valid JSON"), "{}", trl[0]);
        assert!(trl[0].contains("not an object"), "{}", trl[0]);
        let openai = warnings(&c, Format::OpenAi);
        assert_eq!(openai.len(), 1);
        assert!(openai[0].contains("verbatim"), "{}", openai[0]);
    }

    #[test]
    fn warnings_flag_lossy_numbers_for_trl_only() {
        let c = conv(
            "c",
            "r",
            ExampleSplit::Train,
            vec![
                Message::user("go"),
                Message::tool_calls(vec![ToolCall::new(
                    "a",
                    "f",
                    r#"{"big": 123456789012345678901234, "ok": -12, "fine": 0.25, "long": 3.14159265358979323846, "s": "99999999999999999999999"}"#,
                )]),
            ],
        );
        let trl = warnings(&c, Format::Trl);
        assert_eq!(trl.len(), 1, "{trl:?}");
        assert!(
            trl[0].contains("123456789012345678901234, 3.14159265358979323846"),
            "{}",
            trl[0]
        );
        assert!(
            !trl[0].contains("99999"),
            "numbers inside strings are not numbers"
        );
        assert!(warnings(&c, Format::OpenAi).is_empty());
        assert!(lossy_numbers(
            r#"{"a": 9223372036854775807, "b": 18446744073709551615, "c": 1e5, "d": -0.5}"#
        )
        .is_empty());
        assert_eq!(
            lossy_numbers(r#"{"a": 18446744073709551616, "b": "x\"1e999999999999999999999"}"#),
            ["18446744073709551616"]
        );
    }

    #[test]
    fn warnings_flag_calls_never_answered_unless_last() {
        let c = conv(
            "c",
            "r",
            ExampleSplit::Train,
            vec![
                Message::user("go"),
                Message::tool_calls(vec![
                    ToolCall::new("a", "read_file", "{}"),
                    ToolCall::new("b", "read_file", "{}"),
                ]),
                Message::tool_result("a", "ra"),
                Message::tool_calls(vec![ToolCall::new("c", "read_file", "{}")]),
            ],
        );
        let w = warnings(&c, Format::OpenAi);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("message 1, tool call 1") && w[0].contains("never answered"),
            "{}",
            w[0]
        );
    }

    // --- validation ------------------------------------------------------------

    #[test]
    fn validation_rejects_bad_conversations_naming_id_and_index() {
        let ok = || {
            vec![
                Message::system("s"),
                Message::user("u"),
                Message::tool_calls(vec![ToolCall::new("a", "read_file", "{}")]),
                Message::tool_result("a", "r"),
                Message::assistant("done"),
            ]
        };
        let check = |messages: Vec<Message>| {
            let c = conv("bad-conv", "r", ExampleSplit::Train, messages);
            let openai = to_openai_line(&c).unwrap_err();
            assert!(openai.to_string().contains("\"bad-conv\""), "{openai}");
            let trl = to_trl_line(&c).unwrap_err();
            assert_eq!(trl.to_string(), openai.to_string());
            problem_of(openai)
        };
        assert!(validate(&conv("c", "r", ExampleSplit::Train, ok())).is_ok());

        assert_eq!(check(vec![]), (Location::Whole, Problem::NoMessages));

        let mut m = ok();
        m.remove(0);
        m.remove(0);
        assert_eq!(
            check(m),
            (
                Location::Message(0),
                Problem::FirstMessageRole(Role::Assistant)
            )
        );

        let mut m = ok();
        m[3].tool_call_id = Some("zz".into());
        let err =
            to_openai_line(&conv("bad-conv", "r", ExampleSplit::Train, m.clone())).unwrap_err();
        assert_eq!(
            err.to_string(),
            "conversation \"bad-conv\": message 3: tool message answers tool_call_id \"zz\", which no earlier assistant message issued"
        );
        assert_eq!(
            check(m),
            (
                Location::Message(3),
                Problem::UnknownToolCallId("zz".into())
            )
        );

        // A result before its call does not count as answering it.
        let mut m = ok();
        m.swap(2, 3);
        assert_eq!(
            check(m),
            (Location::Message(2), Problem::UnknownToolCallId("a".into()))
        );

        let mut m = ok();
        m.insert(4, Message::tool_result("a", "again"));
        assert_eq!(
            check(m),
            (
                Location::Message(4),
                Problem::ToolCallAlreadyAnswered("a".into())
            )
        );

        let mut m = ok();
        m[3].tool_call_id = None;
        assert_eq!(
            check(m),
            (Location::Message(3), Problem::ToolMessageWithoutCallId)
        );

        let mut m = ok();
        m[3].content = None;
        assert_eq!(
            check(m),
            (Location::Message(3), Problem::MissingContent(Role::Tool))
        );

        let m = vec![Message::user("u"), Message::tool_result("a", "r")];
        assert_eq!(
            check(m),
            (Location::Message(1), Problem::UnknownToolCallId("a".into()))
        );

        let m = vec![Message::system("s"), Message::user("u")];
        assert_eq!(check(m), (Location::Whole, Problem::NoAssistantMessage));

        let mut m = ok();
        m[4].content = Some(String::new());
        assert_eq!(
            check(m),
            (Location::Message(4), Problem::EmptyAssistantMessage)
        );

        let mut m = ok();
        m[1].tool_calls = vec![ToolCall::new("u", "read_file", "{}")];
        assert_eq!(
            check(m),
            (
                Location::Message(1),
                Problem::ToolCallsOutsideAssistant(Role::User)
            )
        );

        let mut m = ok();
        m[4].tool_call_id = Some("a".into());
        assert_eq!(
            check(m),
            (
                Location::Message(4),
                Problem::ToolCallIdOutsideToolMessage(Role::Assistant)
            )
        );

        let mut m = ok();
        m[2].tool_calls[0].id.clear();
        assert_eq!(
            check(m),
            (
                Location::ToolCall {
                    message: 2,
                    call: 0
                },
                Problem::EmptyToolCallId
            )
        );

        let mut m = ok();
        m[2].tool_calls[0].function.name.clear();
        assert_eq!(
            check(m),
            (
                Location::ToolCall {
                    message: 2,
                    call: 0
                },
                Problem::EmptyFunctionName
            )
        );

        let mut m = ok();
        m[2].tool_calls[0].kind = "custom".into();
        assert_eq!(
            check(m),
            (
                Location::ToolCall {
                    message: 2,
                    call: 0
                },
                Problem::NotAFunction("custom".into())
            )
        );

        let mut m = ok();
        m[2].tool_calls.push(ToolCall::new("a", "read_file", "{}"));
        assert_eq!(
            check(m),
            (
                Location::ToolCall {
                    message: 2,
                    call: 1
                },
                Problem::DuplicateToolCallId("a".into())
            )
        );

        let mut c = conv("bad-tool", "r", ExampleSplit::Train, ok());
        c.tools.push(ToolDef::new("has space", "", json!({})));
        let err = to_openai_line(&c).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("conversation \"bad-tool\": tools[1]: "),
            "{err}"
        );
        assert_eq!(
            problem_of(err).1,
            Problem::InvalidToolName("has space".into())
        );
    }

    #[test]
    fn validation_allows_reused_ids_after_answer_and_open_final_calls() {
        let c = conv(
            "c",
            "r",
            ExampleSplit::Train,
            vec![
                Message::user("u"),
                Message::tool_calls(vec![ToolCall::new("call_0", "read_file", "{}")]),
                Message::tool_result("call_0", "r1"),
                Message::tool_calls(vec![ToolCall::new("call_0", "read_file", "{}")]),
                Message::tool_result("call_0", "r2"),
                Message::tool_calls(vec![ToolCall::new("call_0", "read_file", "{}")]),
            ],
        );
        assert!(validate(&c).is_ok());
        let parsed = parse_openai_line(&to_openai_line(&c).unwrap()).unwrap();
        assert_eq!(parsed.messages, c.messages);
        let v: Value = serde_json::from_str(&to_trl_line(&c).unwrap()).unwrap();
        assert_eq!(v["messages"][4]["name"], json!("read_file"));
        assert_eq!(parse_trl_line(&v.to_string()).unwrap().messages, c.messages);
    }

    // --- parsing errors --------------------------------------------------------

    #[test]
    fn parse_errors_are_reported() {
        assert!(matches!(
            parse_openai_line("{not json"),
            Err(DatasetError::LineJson(_))
        ));
        assert!(matches!(
            parse_openai_line("[]"),
            Err(DatasetError::Line {
                at: Location::Whole,
                ..
            })
        ));
        assert!(matches!(
            parse_trl_line(r#"{"tools": []}"#),
            Err(DatasetError::Line {
                at: Location::Whole,
                ..
            })
        ));
        let bad_role = r#"{"messages": [{"role": "developer", "content": "x"}]}"#;
        let err = parse_openai_line(bad_role).unwrap_err();
        assert!(
            err.to_string()
                .contains("message 0: unsupported role \"developer\""),
            "{err}"
        );
        // OpenAI arguments must be strings; TRL accepts objects.
        let object_args = r#"{"messages": [{"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}]}"#;
        assert!(matches!(
            parse_openai_line(object_args),
            Err(DatasetError::Line {
                at: Location::ToolCall {
                    message: 0,
                    call: 0
                },
                ..
            })
        ));
        assert_eq!(
            parse_trl_line(object_args).unwrap().messages[0].tool_calls[0]
                .function
                .arguments,
            r#"{"x":1}"#
        );
        let no_id = r#"{"messages": [{"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}"#;
        assert!(parse_openai_line(no_id).is_err());
        let bad_content = r#"{"messages": [{"role": "user", "content": 3}]}"#;
        assert!(matches!(
            parse_trl_line(bad_content),
            Err(DatasetError::Line {
                at: Location::Message(0),
                ..
            })
        ));
    }

    // --- whole datasets --------------------------------------------------------

    fn dataset() -> Vec<Example> {
        let mut orchestrator = sample();
        let sub = conv(
            "run1/sub-a",
            "run1",
            ExampleSplit::Train,
            vec![
                Message::user("Compute the volatility."),
                Message::assistant("It is 0.2"),
            ],
        );
        let mut val = conv(
            "run16/orchestrator",
            "run16",
            ExampleSplit::Validation,
            vec![Message::user("Task"), Message::assistant("Answer")],
        );
        val.agent = AgentKind::Orchestrator;
        orchestrator.split = ExampleSplit::Train;
        vec![orchestrator, sub, val]
    }

    #[test]
    fn render_dataset_splits_counts_and_warns() {
        let data = dataset();
        for format in [Format::OpenAi, Format::Trl] {
            let (train, validation, summary) = render_dataset(&data, format).unwrap();
            let train_lines: Vec<&str> = train.lines().collect();
            assert_eq!(train_lines.len(), 2);
            assert!(train.ends_with('\n') && validation.ends_with('\n'));
            assert_eq!(train_lines[0], to_line(&data[0], format).unwrap());
            assert_eq!(train_lines[1], to_line(&data[1], format).unwrap());
            assert_eq!(
                validation,
                format!("{}\n", to_line(&data[2], format).unwrap())
            );
            assert_eq!(summary.train_examples, 2);
            assert_eq!(summary.validation_examples, 1);
            assert_eq!(
                summary.train_supervised_tokens,
                supervised_tokens(&data[0]) + supervised_tokens(&data[1])
            );
            // Answer(2)
            assert_eq!(summary.validation_supervised_tokens, 2);
            assert_eq!(summary.warnings, warnings(&data[0], format));
        }
        let (_, validation, summary) = render_dataset(&data[..2], Format::Trl).unwrap();
        assert!(validation.is_empty());
        assert!(summary
            .warnings
            .last()
            .unwrap()
            .starts_with("no validation examples"));
    }

    #[test]
    fn render_dataset_rejects_duplicates_leaks_and_invalid_conversations() {
        let mut data = dataset();
        data.push(data[1].clone());
        assert!(matches!(
            render_dataset(&data, Format::OpenAi),
            Err(DatasetError::DuplicateConversation(id)) if id == "run1/sub-a"
        ));

        let mut data = dataset();
        data[1].split = ExampleSplit::Validation;
        match render_dataset(&data, Format::Trl) {
            Err(DatasetError::RunInBothSplits {
                run,
                train,
                validation,
            }) => {
                assert_eq!(
                    (run.as_str(), train.as_str(), validation.as_str()),
                    ("run1", "run1/orchestrator", "run1/sub-a")
                );
            }
            other => panic!("expected RunInBothSplits, got {other:?}"),
        }

        let mut data = dataset();
        data[2].messages.pop();
        let err = render_dataset(&data, Format::OpenAi).unwrap_err();
        assert_eq!(
            err.to_string(),
            "conversation \"run16/orchestrator\": has no assistant message, so nothing to train on"
        );
    }

    #[test]
    fn write_dataset_writes_two_files_equal_to_render() {
        let dir = std::env::temp_dir().join(format!("mass-dataset-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let train_path = dir.join("data.jsonl");
        let validation_path = dir.join("data.validation.jsonl");
        let data = dataset();
        let summary = write_dataset(&data, Format::Trl, &train_path, &validation_path).unwrap();
        let (train, validation, rendered) = render_dataset(&data, Format::Trl).unwrap();
        assert_eq!(summary, rendered);
        assert_eq!(std::fs::read_to_string(&train_path).unwrap(), train);
        assert_eq!(
            std::fs::read_to_string(&validation_path).unwrap(),
            validation
        );
        assert!(!dir.join("data.jsonl.tmp").exists());
        // Every written line parses back.
        for line in train.lines().chain(validation.lines()) {
            parse_trl_line(line).unwrap();
        }
        assert!(matches!(
            write_dataset(&data, Format::Trl, &train_path, &train_path),
            Err(DatasetError::SamePath(_))
        ));
        let missing = dir.join("no/such/dir/x.jsonl");
        assert!(matches!(
            write_dataset(&data, Format::Trl, &missing, &validation_path),
            Err(DatasetError::Io { path, .. }) if path == missing
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // --- step 5 ----------------------------------------------------------------

    #[test]
    fn strip_replaces_only_the_orchestrators_first_user_message() {
        let mut c = sample();
        c.messages.insert(3, Message::user("a later user message"));
        let before = c.clone();
        assert!(strip_orchestrator_workflow(
            &mut c,
            "Task: price the option."
        ));
        assert_eq!(
            c.messages[1].content.as_deref(),
            Some("Task: price the option.")
        );
        assert_eq!(c.messages[1].role, Role::User);
        for (i, (a, b)) in c.messages.iter().zip(&before.messages).enumerate() {
            if i != 1 {
                assert_eq!(a, b, "message {i} changed");
            }
        }
        assert_eq!(
            (&c.id, &c.tools, c.split),
            (&before.id, &before.tools, before.split)
        );

        let mut sub = conv(
            "s",
            "r",
            ExampleSplit::Train,
            vec![Message::user("instructions"), Message::assistant("ok")],
        );
        let sub_before = sub.clone();
        assert!(!strip_orchestrator_workflow(&mut sub, "bare"));
        assert_eq!(sub, sub_before);

        let mut no_user = conv(
            "o",
            "r",
            ExampleSplit::Train,
            vec![Message::system("s"), Message::assistant("a")],
        );
        no_user.agent = AgentKind::Orchestrator;
        let no_user_before = no_user.clone();
        assert!(!strip_orchestrator_workflow(&mut no_user, "bare"));
        assert_eq!(no_user, no_user_before);
    }

    #[test]
    fn strip_within_keeps_a_harness_context_around_the_task_and_drops_the_workflow() {
        let mut c = sample();
        let (task, wf) = (
            "Task: price the option.",
            "\n\n## Team workflow\n\nAgents...",
        );
        let closing = [
            "\n---\nTask id: t. Call `finish`.".to_string(),
            "\n---\nTask id: t. Answer.".to_string(),
        ];
        let context = "<system-reminder>Today's date is ...</system-reminder>\n";
        c.messages[1].content = Some(format!("{context}{task}{wf}{}\nafter", closing[1]));
        assert!(strip_orchestrator_workflow_within(&mut c, task, &closing));
        assert_eq!(
            c.messages[1].content.as_deref(),
            Some(format!("{context}{task}{}\nafter", closing[1]).as_str())
        );
        // Without the task in it, the whole message becomes the bare task
        // with the first closing.
        let mut d = sample();
        d.messages[1].content = Some("something else".into());
        assert!(strip_orchestrator_workflow_within(&mut d, task, &closing));
        assert_eq!(
            d.messages[1].content.as_deref(),
            Some(format!("{task}{}", closing[0]).as_str())
        );
    }

    #[test]
    fn conversation_serde_uses_snake_case_tags() {
        let c = conv(
            "c",
            "r",
            ExampleSplit::Validation,
            vec![Message::user("u"), Message::assistant("a")],
        );
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["agent"], json!("subagent"));
        assert_eq!(v["split"], json!("validation"));
        let back: Example = serde_json::from_value(v).unwrap();
        assert_eq!(back, c);
    }
}
