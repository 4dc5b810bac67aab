//! The export check: no exported line may still hold the workflow a run was
//! given (MASS.md, outer loop step 5). Stripping (`strip.rs`) removes the
//! rendered section wherever it finds it; this check does not trust that
//! and reads every exported line back, failing closed.
//!
//! What counts as the workflow's text (the criterion, as documented in
//! ARCHITECTURE.md):
//!
//! - **Markers**, anywhere in a line (any message, any role, any field, the
//!   tool definitions): the section heading and end marker (whitespace
//!   collapsed), and in every message any window of [`WINDOW`] words of the
//!   fixed preamble (not in the tool definitions: the harness's `delegate`
//!   tool describes contracts in the preamble's words). Only a rendered
//!   workflow puts these there.
//! - **The workflow's own strings**: every window of [`WINDOW`] consecutive
//!   words of an agent's role or instruction, a contract's `returns` or
//!   checks, or a hop's handoff or send-back condition (a string of
//!   [`MIN_WORDS`] to [`WINDOW`] words counts whole; shorter ones are not
//!   a significant part). Words are compared lowercased with surrounding
//!   punctuation dropped (`| `, bullets, quotes), so re-indenting,
//!   re-wrapping or re-bulleting the text does not hide it, and windows run
//!   across message boundaries, so splitting it over messages does not
//!   either. Windows that occur in the text a run legitimately shows (the
//!   bare task prompt, the closing directives, the fixed system prompts)
//!   are dropped. These are checked in every message except model output
//!   (assistant turns: an orchestrator's delegations are what it learns to
//!   write) and a subagent's messages before its first reply (its system
//!   prompt and the delegation as handed over: MASS keeps subagent
//!   instructions). A tool result, a later user message, a side request
//!   or the orchestrator's prompt holding them is a leak.

use std::collections::{BTreeMap, HashSet};

use serde_json::Value;

use super::AgentKind;
use crate::workflow::{Workflow, END_MARKER, PREAMBLE, SECTION_HEADING};

/// Words in a window of the workflow's text.
pub const WINDOW: usize = 8;
/// A string shorter than this (in words) is not a significant part.
pub const MIN_WORDS: usize = 5;

/// The text of one run's workflow, as the check looks for it.
#[derive(Debug, Clone, Default)]
pub struct WorkflowText {
    /// Heading and end marker, whitespace collapsed.
    markers: Vec<String>,
    /// Preamble windows: checked everywhere.
    fixed: Windows,
    /// The workflow's own strings: checked outside model output and a
    /// subagent's delegation.
    own: Windows,
}

/// Word windows by length.
#[derive(Debug, Clone, Default)]
struct Windows(BTreeMap<usize, HashSet<String>>);

/// Lowercased words with surrounding punctuation dropped.
fn words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Windows {
    fn add(&mut self, text: &str) {
        let w = words(text);
        if w.len() >= WINDOW {
            let set = self.0.entry(WINDOW).or_default();
            for win in w.windows(WINDOW) {
                set.insert(win.join(" "));
            }
        } else if w.len() >= MIN_WORDS {
            self.0.entry(w.len()).or_default().insert(w.join(" "));
        }
    }

    /// Drops every window that occurs in `allowed`.
    fn remove_in(&mut self, allowed: &[String]) {
        for (len, set) in self.0.iter_mut() {
            for text in allowed {
                for win in text.split(' ').collect::<Vec<_>>().windows(*len) {
                    set.remove(&win.join(" "));
                }
            }
        }
        self.0.retain(|_, set| !set.is_empty());
    }

    /// The first window found in `tokens`, and the index of its first word.
    fn find(&self, tokens: &[String]) -> Option<(usize, String)> {
        let mut best: Option<(usize, String)> = None;
        for (len, set) in &self.0 {
            for (i, win) in tokens.windows(*len).enumerate() {
                if best.as_ref().is_some_and(|(b, _)| *b <= i) {
                    break;
                }
                let joined = win.join(" ");
                if set.contains(&joined) {
                    best = Some((i, joined));
                    break;
                }
            }
        }
        best
    }
}

impl WorkflowText {
    /// The text of `workflow`, less what also occurs in `allowed` (the bare
    /// task prompt, directives, fixed system prompts). Empty for the bare
    /// workflow: a run given no workflow has none to leak.
    pub fn new(workflow: &Workflow, allowed: &[&str]) -> WorkflowText {
        if workflow.is_bare() {
            return WorkflowText::default();
        }
        let allowed_words: Vec<String> = allowed.iter().map(|a| words(a).join(" ")).collect();
        let allowed_collapsed: Vec<String> = allowed.iter().map(|a| collapse(a)).collect();
        let markers = [SECTION_HEADING, END_MARKER]
            .iter()
            .map(|m| collapse(m))
            .filter(|m| !allowed_collapsed.iter().any(|a| a.contains(m.as_str())))
            .collect();
        let mut fixed = Windows::default();
        fixed.add(PREAMBLE);
        fixed.remove_in(&allowed_words);
        let mut own = Windows::default();
        for a in &workflow.agents {
            own.add(&a.role);
            own.add(&a.instruction);
        }
        for c in &workflow.contracts {
            own.add(&c.returns);
            for check in &c.checks {
                own.add(check);
            }
        }
        for h in &workflow.hops {
            own.add(&h.handoff);
            if let Some(s) = &h.send_back_when {
                own.add(s);
            }
        }
        own.remove_in(&allowed_words);
        WorkflowText {
            markers,
            fixed,
            own,
        }
    }

    /// Whether there is nothing to look for.
    pub fn is_empty(&self) -> bool {
        self.markers.is_empty() && self.fixed.0.is_empty() && self.own.0.is_empty()
    }
}

/// The text every run of a task shows whatever its workflow: the bare task
/// prompt with each closing directive, and the fixed system prompts.
pub fn allowed_text(prompt: &str, task_id: &str, deliverables: &[String]) -> Vec<String> {
    vec![
        format!(
            "{prompt}{}",
            crate::prompts::directive(task_id, deliverables)
        ),
        format!(
            "{prompt}{}",
            crate::prompts::external_directive(task_id, deliverables)
        ),
        crate::prompts::ORCHESTRATOR_SYSTEM.to_string(),
        crate::prompts::ORCHESTRATOR_SYSTEM_NEUTRAL.to_string(),
        crate::prompts::subagent_system("", "", task_id),
    ]
}

/// Where in a line the workflow's text was found, and what of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leak {
    /// `message N` (from 1) or `tools`.
    pub place: String,
    pub found: String,
}

/// Every string in `v` except the keys that only name things (`role`,
/// `type`, ids), joined by newlines.
fn strings(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => {
            for (k, x) in o {
                if !matches!(k.as_str(), "role" | "type" | "id" | "tool_call_id") {
                    strings(x, out);
                }
            }
        }
        _ => {}
    }
}

/// One text per message of a line, with whether only markers and the
/// preamble are looked for in it (model output, a subagent's delegation).
fn message_texts(line: &Value, agent: AgentKind) -> Vec<(String, bool)> {
    let msgs = line["messages"].as_array().cloned().unwrap_or_default();
    let first_reply = msgs
        .iter()
        .position(|m| m["role"] == "assistant")
        .unwrap_or(msgs.len());
    msgs.iter()
        .enumerate()
        .map(|(i, m)| {
            let mut text = String::new();
            strings(m, &mut text);
            let exempt =
                m["role"] == "assistant" || (agent == AgentKind::Subagent && i < first_reply);
            (text, exempt)
        })
        .collect()
}

/// Looks for `wf` in one exported line of a conversation of `agent`; a line
/// that is not JSON is reported as a leak (it cannot be checked).
pub fn line_leak(line: &str, agent: AgentKind, wf: &WorkflowText) -> Option<Leak> {
    if wf.is_empty() {
        return None;
    }
    let Ok(v) = serde_json::from_str::<Value>(line) else {
        return Some(Leak {
            place: "the whole line".into(),
            found: "a line that is not JSON cannot be checked".into(),
        });
    };
    let texts = message_texts(&v, agent);
    let place = |i: usize| format!("message {}", i + 1);
    // Markers and the preamble: every message, across their boundaries.
    let collapsed: Vec<String> = texts.iter().map(|(t, _)| collapse(t)).collect();
    let all = collapsed.join(" ");
    for m in &wf.markers {
        if let Some(at) = all.find(m.as_str()) {
            let (mut end, mut i) = (0, 0);
            for (j, c) in collapsed.iter().enumerate() {
                end += c.len() + 1;
                i = j;
                if at < end {
                    break;
                }
            }
            return Some(Leak {
                place: place(i),
                found: format!("{m:?}"),
            });
        }
    }
    let tokens = |exempt_too: bool| -> (Vec<String>, Vec<usize>) {
        let (mut t, mut at) = (Vec::new(), Vec::new());
        for (i, (text, exempt)) in texts.iter().enumerate() {
            if exempt_too || !exempt {
                let w = words(text);
                at.extend(std::iter::repeat_n(i, w.len()));
                t.extend(w);
            }
        }
        (t, at)
    };
    for (windows, exempt_too) in [(&wf.fixed, true), (&wf.own, false)] {
        let (t, at) = tokens(exempt_too);
        if let Some((i, found)) = windows.find(&t) {
            return Some(Leak {
                place: place(at[i]),
                found: format!("{found:?}"),
            });
        }
    }
    let mut tools = String::new();
    strings(&v["tools"], &mut tools);
    let t = words(&tools);
    let in_tools = wf
        .markers
        .iter()
        .any(|m| collapse(&tools).contains(m.as_str()))
        .then(|| "a marker".to_string())
        .or_else(|| wf.own.find(&t).map(|(_, f)| f));
    in_tools.map(|found| Leak {
        place: "tools".into(),
        found: format!("{found:?}"),
    })
}

/// An exported line that still holds the workflow: export refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{file} line {line} (run {run}, conversation {conversation}, {place}) still holds the workflow's text ({found}): refusing to export training data that carries the workflow"
)]
pub struct WorkflowLeak {
    /// `train` or `validation`.
    pub file: String,
    /// From 1.
    pub line: usize,
    pub run: String,
    pub conversation: String,
    pub place: String,
    pub found: String,
}

#[cfg(test)]
mod tests {
    //! Attacker tests: each puts the workflow where a line could carry it
    //! into training and expects either stripping to remove it or the
    //! check to refuse the line (never a line exported with it).

    use super::*;
    use crate::chat::{Message, ToolCall};
    use crate::dataset::{
        strip_orchestrator_workflow_within, strip_workflow_everywhere, to_openai_line, Example,
        ExampleSplit,
    };
    use crate::workflow::{Agent, Contract, Hop};

    const TASK: &str =
        "Estimate the Sharpe ratio of the momentum strategy on data/prices.csv and report it.";
    const INSTRUCTION: &str = "Backtest the momentum signal with a twenty day lookback, net of costs, and save every intermediate table to results.json before reporting";

    fn workflow() -> Workflow {
        Workflow {
            agents: vec![Agent {
                agent_id: "quant".into(),
                role: "quantitative analyst".into(),
                instruction: INSTRUCTION.into(),
            }],
            contracts: vec![Contract {
                agent_id: "quant".into(),
                returns: "the annualised Sharpe ratio with its bootstrap interval and the cost assumptions used".into(),
                checks: vec!["recompute the ratio from the saved returns and compare to four decimals".into()],
            }],
            hops: vec![Hop {
                from: "orchestrator".into(),
                to: "quant".into(),
                handoff: "the task statement and the location of the price file".into(),
                send_back_when: Some("the recomputed ratio differs from the reported one in any decimal".into()),
            }],
        }
    }

    fn directives() -> Vec<String> {
        vec![
            crate::prompts::directive("fin", &["report.md".into()]),
            crate::prompts::external_directive("fin", &["report.md".into()]),
        ]
    }

    fn text() -> WorkflowText {
        let d = directives();
        let allowed: Vec<String> = d
            .iter()
            .map(|x| format!("{TASK}{x}"))
            .chain([crate::prompts::ORCHESTRATOR_SYSTEM.to_string()])
            .collect();
        WorkflowText::new(
            &workflow(),
            &allowed.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    }

    /// The team's first prompt as the harness builds it.
    fn prompt() -> String {
        format!("{TASK}\n\n{}{}", workflow().render(), directives()[1])
    }

    fn conv(agent: AgentKind, n: u32, messages: Vec<Message>) -> Example {
        Example {
            id: format!("run#{n}"),
            run: "run".into(),
            agent,
            messages,
            tools: Vec::new(),
            split: ExampleSplit::Train,
        }
    }

    fn delegate_call() -> Message {
        Message::tool_calls(vec![ToolCall::new(
            "c1",
            "delegate",
            serde_json::json!({"role": "quantitative analyst", "instructions": INSTRUCTION})
                .to_string(),
        )])
    }

    /// A run as the built-in harness records it: the orchestrator delegates
    /// the instruction; the subagent gets its contract and instruction.
    fn team() -> Vec<Example> {
        let contract = &workflow().contracts[0].returns;
        vec![
            conv(
                AgentKind::Orchestrator,
                0,
                vec![
                    Message::system(crate::prompts::ORCHESTRATOR_SYSTEM),
                    Message::user(prompt()),
                    delegate_call(),
                    Message::tool_result("c1", "Done (quantitative analyst). Sharpe 0.81."),
                    Message::assistant("Finished."),
                ],
            ),
            conv(
                AgentKind::Subagent,
                1,
                vec![
                    Message::system(crate::prompts::subagent_system(
                        "quantitative analyst",
                        contract,
                        "fin",
                    )),
                    Message::user(INSTRUCTION),
                    Message::assistant("Sharpe 0.81."),
                ],
            ),
        ]
    }

    fn strip_all(convs: &mut [Example]) {
        let rendered = workflow().render();
        for c in convs {
            strip_workflow_everywhere(c, TASK, &directives(), &rendered);
        }
    }

    /// The exported line (as `to_openai_line` writes it, without its
    /// validation, which a fragment of a conversation would not pass).
    fn line(c: &Example) -> String {
        serde_json::json!({ "messages": c.messages }).to_string()
    }

    fn leak_of(convs: &[Example]) -> Option<(String, Leak)> {
        let wf = text();
        convs.iter().find_map(|c| {
            let line = line(c);
            line_leak(&line, c.agent, &wf).map(|l| (c.id.clone(), l))
        })
    }

    #[test]
    fn a_team_run_as_recorded_passes_once_stripped() {
        let mut convs = team();
        assert!(
            leak_of(&convs).is_some(),
            "the unstripped prompt must be found"
        );
        strip_all(&mut convs);
        assert_eq!(leak_of(&convs), None);
        assert_eq!(
            convs[0].messages[1].content_str(),
            format!("{TASK}{}", directives()[1])
        );
    }

    #[test]
    fn a_side_request_repeating_task_and_workflow_is_stripped_or_refused() {
        let mut convs = team();
        convs.push(conv(
            AgentKind::Subagent,
            2,
            vec![
                Message::system("Summarise the conversation so far."),
                Message::user(format!("<env>cwd</env>\n{}", prompt())),
                Message::assistant("A summary."),
            ],
        ));
        // As the first chain's first message alone was stripped: refused.
        let mut old = convs.clone();
        for c in &mut old {
            strip_orchestrator_workflow_within(c, TASK, &directives());
        }
        let (id, leak) = leak_of(&old).expect("the side request still holds the workflow");
        assert_eq!((id.as_str(), leak.place.as_str()), ("run#2", "message 2"));
        // Stripped everywhere: nothing left.
        strip_all(&mut convs);
        assert_eq!(leak_of(&convs), None);
        assert!(!to_openai_line(&convs[2]).unwrap().contains("twenty day"));
    }

    #[test]
    fn a_reformatted_workflow_is_refused() {
        let reflowed = prompt().replace('\n', " \n ").replace("  ", "   ");
        let mut convs = team();
        convs[0].messages.insert(2, Message::user(reflowed));
        strip_all(&mut convs);
        let (id, leak) = leak_of(&convs).expect("a re-wrapped workflow is still the workflow");
        assert_eq!((id.as_str(), leak.place.as_str()), ("run#0", "message 3"));
    }

    #[test]
    fn a_workflow_split_across_messages_is_refused() {
        // Half the instruction in one message, half in the next: no
        // message alone holds a window, the two together do.
        let words: Vec<&str> = INSTRUCTION.split(' ').collect();
        let (a, b) = words.split_at(words.len() / 2);
        let mut convs = team();
        convs[0]
            .messages
            .insert(2, Message::user(format!("Note: {}", a.join(" "))));
        convs[0].messages.insert(3, Message::user(b.join(" ")));
        strip_all(&mut convs);
        for half in [a, b] {
            let alone = conv(
                AgentKind::Orchestrator,
                9,
                vec![Message::user(half.join(" "))],
            );
            assert!(half.len() < WINDOW || leak_of(&[alone]).is_some());
        }
        let (_, leak) = leak_of(&convs).expect("the split instruction is found");
        assert!(
            leak.place == "message 3" || leak.place == "message 4",
            "{leak:?}"
        );
    }

    #[test]
    fn an_instruction_in_a_tool_result_is_refused() {
        let mut convs = team();
        convs[0].messages[3] = Message::tool_result(
            "c1",
            format!("I was asked to: {}", INSTRUCTION.to_uppercase()),
        );
        strip_all(&mut convs);
        let (id, leak) = leak_of(&convs).expect("an echoed instruction is a leak");
        assert_eq!((id.as_str(), leak.place.as_str()), ("run#0", "message 4"));
        // In a subagent's later tool result too.
        let mut convs = team();
        convs[1].messages.push(Message::tool_result(
            "c2",
            workflow().contracts[0].checks[0].clone(),
        ));
        strip_all(&mut convs);
        assert_eq!(leak_of(&convs).unwrap().1.place, "message 4");
    }

    #[test]
    fn a_fallback_that_would_leave_the_workflow_is_refused() {
        // The harness reworded the task: the first user message has no
        // task prompt, so the fallback replaces it; the workflow also sat
        // in the system prompt, re-indented, and stays there.
        let mut convs = team();
        convs[0].messages[0] = Message::system(format!(
            "{}\n{}",
            crate::prompts::ORCHESTRATOR_SYSTEM,
            workflow().render().replace("\n  ", "\n\t")
        ));
        convs[0].messages[1] = Message::user("Please do the finance task.");
        strip_all(&mut convs);
        assert_eq!(
            convs[0].messages[1].content_str(),
            format!("{TASK}{}", directives()[0])
        );
        let (_, leak) =
            leak_of(&convs).expect("the fallback left the workflow in the system prompt");
        assert_eq!(leak.place, "message 1");
    }

    #[test]
    fn task_text_an_instruction_repeats_is_not_a_leak() {
        let mut w = workflow();
        w.agents[0].instruction = format!("{TASK} Then write it up.");
        let allowed = format!("{TASK}{}", directives()[0]);
        let wf = WorkflowText::new(&w, &[allowed.as_str()]);
        let c = conv(
            AgentKind::Orchestrator,
            0,
            vec![Message::user(allowed.clone())],
        );
        assert_eq!(line_leak(&line(&c), c.agent, &wf), None);
        assert!(WorkflowText::new(&Workflow::bare(), &[]).is_empty());
    }
}
