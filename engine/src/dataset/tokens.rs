//! Supervised tokens, the cost unit the paper reports ("28.8 M supervised
//! tokens"), counted with a documented offline estimator: no tokenizer
//! model is available offline, and the numbers must be reproducible from
//! the ledger alone.

use super::render::tools_value;
use super::Example;
use crate::chat::{Message, Role};

/// A deterministic token-count **estimate**: no tokenizer model is available
/// offline, and the numbers must be reproducible from the ledger alone. BPE
/// tokenizers of current models spend roughly one token per 4 letters of common
/// text, one per 1-3 digits, and one per punctuation mark; whitespace mostly merges
/// into the next token. So the text is split into runs and counted as:
///
/// * a run of n ASCII letters: ceil(n / 4) tokens;
/// * a run of n ASCII digits: ceil(n / 3) tokens (one per group of up to 3);
/// * whitespace: 0;
/// * every other character (punctuation, symbols, non-ASCII letters, CJK, emoji): 1.
///
/// Comparable across runs of this system, not with a real tokenizer's counts.
pub fn estimate_tokens(text: &str) -> u64 {
    let mut tokens = 0u64;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_alphabetic() {
            let mut n = 1u64;
            while chars.next_if(char::is_ascii_alphabetic).is_some() {
                n += 1;
            }
            tokens += n.div_ceil(4);
        } else if c.is_ascii_digit() {
            let mut n = 1u64;
            while chars.next_if(char::is_ascii_digit).is_some() {
                n += 1;
            }
            tokens += n.div_ceil(3);
        } else if !c.is_whitespace() {
            tokens += 1;
        }
    }
    tokens
}

fn message_tokens(m: &Message) -> u64 {
    estimate_tokens(m.reasoning.as_deref().unwrap_or(""))
        + estimate_tokens(m.content_str())
        + m.tool_calls
            .iter()
            .map(|c| estimate_tokens(&c.function.name) + estimate_tokens(&c.function.arguments))
            .sum::<u64>()
}

/// Estimated tokens the model is trained on: assistant turns only (reasoning,
/// content, tool call names and arguments); system, user and tool turns are
/// masked (MASS.md step 6). Chat-template markers are not counted.
pub fn supervised_tokens(conv: &Example) -> u64 {
    conv.messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .map(message_tokens)
        .sum()
}

/// Estimated tokens of the whole example: every message (as in
/// [`supervised_tokens`]) plus the tool definitions as JSON, which the chat
/// template puts in the prompt. Chat-template markers are not counted.
pub fn total_tokens(conv: &Example) -> u64 {
    let tools = if conv.tools.is_empty() {
        0
    } else {
        estimate_tokens(&tools_value(&conv.tools).to_string())
    };
    conv.messages.iter().map(message_tokens).sum::<u64>() + tools
}
