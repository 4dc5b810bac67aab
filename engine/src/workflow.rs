//! Structured team workflows: what the inner loop searches over.
//!
//! A [`Workflow`] lists agents (`agent_id`, `role`, `instruction`), contracts
//! (what each agent returns to the orchestrator and which checks it runs) and
//! hops (the ordered orchestrator-subagent round trips). It has exactly one
//! text form, [`Workflow::render`], which is appended to the task prompt.
//!
//! The rendering is meant for a model to read, but it is also a precise
//! format: [`parse_rendered`] recovers the identical structure from any
//! prompt that contains it, and [`strip_from_prompt`] removes it so the
//! training prompt is byte-identical to the bare task (MASS.md, outer loop
//! step 5). To make that exact for arbitrary text (multi-line, unicode,
//! leading spaces, lines that look like markers), every value is written
//! either inline (`key: value`, only for single-line values without
//! surrounding whitespace) or as an indented block with one `| ` line per
//! value line. Every line a value produces is therefore indented, and the
//! structural lines (heading, end marker) start in column 0, so task text
//! inside a value can never end the section early.
//!
//! The optimizer answers with JSON ([`Proposal`]); [`parse_proposal`] finds
//! the object in whatever prose surrounds it and reports problems with a path
//! (`improved_design.agents[1]`), so the inner loop can re-ask with the error.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The heading that opens the rendered section.
pub const SECTION_HEADING: &str = "## Team workflow";
/// The line that closes the rendered section.
pub const END_MARKER: &str = "<!-- end of team workflow -->";
/// Fixed guidance at the top of the section; part of the format.
pub const PREAMBLE: &str = "You are the orchestrator and the agents below are your team. \
Delegate to each agent with its instruction, hold it to its contract (what it must \
return to you and which checks it must run), and follow the hops in order, sending \
work back whenever a hop's send-back condition holds.";

/// Reserved endpoint name for hops: the orchestrator itself.
pub const ORCHESTRATOR: &str = "orchestrator";
pub const MAX_AGENTS: usize = 12;
/// One contract per agent at most (checked separately), so this is a backstop.
pub const MAX_CONTRACTS: usize = MAX_AGENTS;
pub const MAX_HOPS: usize = 48;
pub const MAX_CHECKS_PER_CONTRACT: usize = 16;
pub const MAX_LIST_ITEMS: usize = 32;
pub const MAX_ID_CHARS: usize = 64;
pub const MAX_TEXT_CHARS: usize = 4000;
/// Larger optimizer replies are rejected before any scanning.
pub const MAX_REPLY_BYTES: usize = 1 << 20;
/// How many '{' positions that do not start a JSON object are tried before
/// giving up; bounds the scan on adversarial prose.
const MAX_FAILED_STARTS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    pub agent_id: String,
    pub role: String,
    pub instruction: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    pub agent_id: String,
    /// What the agent must hand back to the orchestrator.
    pub returns: String,
    /// Checks the agent must run before returning.
    #[serde(default)]
    pub checks: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hop {
    /// An agent id or [`ORCHESTRATOR`].
    pub from: String,
    pub to: String,
    /// What is handed over.
    pub handoff: String,
    /// When the receiver sends the work back for revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_back_when: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workflow {
    #[serde(default)]
    pub agents: Vec<Agent>,
    #[serde(default)]
    pub contracts: Vec<Contract>,
    #[serde(default)]
    pub hops: Vec<Hop>,
}

/// Coarse shape of a workflow, used by the simulated model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkflowFeatures {
    pub agents: usize,
    pub contracts_with_checks: usize,
    pub hops: usize,
    pub send_backs: usize,
    /// Total characters (not bytes) of all agent instructions.
    pub instruction_chars: usize,
}

/// An optimizer's proposal (the MASS optimizer JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub improved_design: Workflow,
    pub changes_from_previous: Vec<String>,
    pub why_it_should_improve: String,
    pub evidence_used: Vec<String>,
    pub expected_impact: String,
    pub verification_checks: Vec<String>,
}

/// One validation problem at a path such as `improved_design.hops[0].to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.path, self.message)
    }
}

/// Why an optimizer reply could not be used. Messages are written to be sent
/// back to the optimizer verbatim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposalError {
    #[error("the optimizer's reply is too long ({bytes} bytes; at most {MAX_REPLY_BYTES})")]
    TooLarge { bytes: usize },
    #[error("no JSON object found in the optimizer's reply")]
    NoJsonObject,
    /// A `{...}` region was found but is not valid JSON.
    #[error("the JSON object in the optimizer's reply is not valid JSON: {message}")]
    Json { message: String },
    /// The JSON does not have the proposal's shape.
    #[error("{}", schema_message(path, message))]
    Schema { path: String, message: String },
    /// The shape is right but the content breaks a rule.
    #[error("{}", join_invalid(.0))]
    Invalid(Vec<Invalid>),
}

fn schema_message(path: &str, message: &str) -> String {
    if path.is_empty() {
        format!("proposal {message}")
    } else {
        format!("proposal field \"{path}\" {message}")
    }
}

fn join_invalid(items: &[Invalid]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

// ---------------------------------------------------------------------------
// Rendering

/// A value can be written inline only if reading back "rest of the line"
/// gives it exactly: one line, non-empty, no surrounding whitespace.
fn is_inline(v: &str) -> bool {
    !v.is_empty() && !v.contains(['\n', '\r']) && v.trim() == v
}

fn push_line(out: &mut String, line: &str) {
    out.push_str(line);
    out.push('\n');
}

/// Writes `{prefix}{key}: value` or `{prefix}{key}:` plus a `|` block.
fn push_field(out: &mut String, prefix: &str, key: &str, value: &str, block_indent: &str) {
    out.push_str(prefix);
    out.push_str(key);
    out.push(':');
    if is_inline(value) {
        out.push(' ');
        push_line(out, value);
    } else {
        out.push('\n');
        push_block(out, value, block_indent);
    }
}

/// One `| line` per line of `value` (split on '\n' only, so '\r' and every
/// other character survive); an empty line is a bare `|`.
fn push_block(out: &mut String, value: &str, indent: &str) {
    for line in value.split('\n') {
        out.push_str(indent);
        out.push('|');
        if !line.is_empty() {
            out.push(' ');
            out.push_str(line);
        }
        out.push('\n');
    }
}

impl Workflow {
    /// The empty workflow: the bare task, no team section at all.
    pub fn bare() -> Workflow {
        Workflow::default()
    }

    pub fn is_bare(&self) -> bool {
        self.agents.is_empty() && self.contracts.is_empty() && self.hops.is_empty()
    }

    /// The canonical text appended to a task prompt (`prompt + &w.render()`).
    /// Starts with a newline and [`SECTION_HEADING`], ends with
    /// [`END_MARKER`] and a newline; the bare workflow renders to "".
    pub fn render(&self) -> String {
        if self.is_bare() {
            return String::new();
        }
        let mut out = String::from("\n");
        for line in [SECTION_HEADING, "", PREAMBLE, "", "### Agents", ""] {
            push_line(&mut out, line);
        }
        if self.agents.is_empty() {
            push_line(&mut out, "None.");
            push_line(&mut out, "");
        }
        for a in &self.agents {
            push_field(&mut out, "- ", "agent_id", &a.agent_id, "    ");
            push_field(&mut out, "  ", "role", &a.role, "    ");
            push_field(&mut out, "  ", "instruction", &a.instruction, "    ");
            push_line(&mut out, "");
        }
        push_line(&mut out, "### Contracts");
        push_line(&mut out, "");
        if self.contracts.is_empty() {
            push_line(&mut out, "None.");
            push_line(&mut out, "");
        }
        for c in &self.contracts {
            push_field(&mut out, "- ", "agent_id", &c.agent_id, "    ");
            push_field(&mut out, "  ", "returns", &c.returns, "    ");
            if c.checks.is_empty() {
                push_line(&mut out, "  checks: none");
            } else {
                push_line(&mut out, "  checks:");
                for check in &c.checks {
                    if is_inline(check) {
                        push_line(&mut out, &format!("    - {check}"));
                    } else {
                        push_line(&mut out, "    -");
                        push_block(&mut out, check, "      ");
                    }
                }
            }
            push_line(&mut out, "");
        }
        push_line(&mut out, "### Hops (in order)");
        push_line(&mut out, "");
        if self.hops.is_empty() {
            push_line(&mut out, "None.");
            push_line(&mut out, "");
        }
        for (i, h) in self.hops.iter().enumerate() {
            let (lead, cont, block) = hop_prefixes(i);
            push_field(&mut out, &lead, "from", &h.from, &block);
            push_field(&mut out, &cont, "to", &h.to, &block);
            push_field(&mut out, &cont, "handoff", &h.handoff, &block);
            if let Some(s) = &h.send_back_when {
                push_field(&mut out, &cont, "send_back_when", s, &block);
            }
            push_line(&mut out, "");
        }
        push_line(&mut out, END_MARKER);
        out
    }

    /// Counts the simulated model uses to score a workflow.
    pub fn summary_features(&self) -> WorkflowFeatures {
        WorkflowFeatures {
            agents: self.agents.len(),
            contracts_with_checks: self
                .contracts
                .iter()
                .filter(|c| !c.checks.is_empty())
                .count(),
            hops: self.hops.len(),
            send_backs: self
                .hops
                .iter()
                .filter(|h| h.send_back_when.is_some())
                .count(),
            instruction_chars: self
                .agents
                .iter()
                .map(|a| a.instruction.chars().count())
                .sum(),
        }
    }

    /// Checks the rules a proposed design must satisfy (unique non-empty ids,
    /// references to existing agents, size bounds). Reports every problem.
    pub fn validate(&self) -> Result<(), ProposalError> {
        self.validate_at("")
    }

    fn validate_at(&self, prefix: &str) -> Result<(), ProposalError> {
        let mut bad = Vec::new();
        let mut add = |path: String, message: String| bad.push(Invalid { path, message });
        if self.agents.len() > MAX_AGENTS {
            add(
                format!("{prefix}agents"),
                format!(
                    "has {} agents; at most {MAX_AGENTS} are allowed",
                    self.agents.len()
                ),
            );
        }
        let mut ids: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, a) in self.agents.iter().enumerate() {
            let p = format!("{prefix}agents[{i}]");
            if let Some(m) = id_problem(&a.agent_id) {
                add(format!("{p}.agent_id"), m);
            } else if a.agent_id == ORCHESTRATOR {
                add(
                    format!("{p}.agent_id"),
                    format!("\"{ORCHESTRATOR}\" is reserved for the orchestrator itself"),
                );
            } else if let Some(first) = ids.insert(&a.agent_id, i) {
                ids.insert(&a.agent_id, first);
                add(
                    format!("{p}.agent_id"),
                    format!(
                        "\"{}\" duplicates {prefix}agents[{first}].agent_id",
                        a.agent_id
                    ),
                );
            }
            text_problem(&mut add, format!("{p}.role"), &a.role);
            text_problem(&mut add, format!("{p}.instruction"), &a.instruction);
        }
        if self.contracts.len() > MAX_CONTRACTS {
            add(
                format!("{prefix}contracts"),
                format!(
                    "has {} contracts; at most {MAX_CONTRACTS} are allowed",
                    self.contracts.len()
                ),
            );
        }
        let mut contracted: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, c) in self.contracts.iter().enumerate() {
            let p = format!("{prefix}contracts[{i}]");
            if !ids.contains_key(c.agent_id.as_str()) {
                add(
                    format!("{p}.agent_id"),
                    format!("names agent \"{}\" which is not in agents", c.agent_id),
                );
            } else if let Some(first) = contracted.insert(&c.agent_id, i) {
                contracted.insert(&c.agent_id, first);
                add(
                    format!("{p}.agent_id"),
                    format!(
                        "agent \"{}\" already has a contract ({prefix}contracts[{first}])",
                        c.agent_id
                    ),
                );
            }
            text_problem(&mut add, format!("{p}.returns"), &c.returns);
            if c.checks.len() > MAX_CHECKS_PER_CONTRACT {
                add(
                    format!("{p}.checks"),
                    format!(
                        "has {} checks; at most {MAX_CHECKS_PER_CONTRACT} are allowed",
                        c.checks.len()
                    ),
                );
            }
            for (j, check) in c.checks.iter().enumerate() {
                text_problem(&mut add, format!("{p}.checks[{j}]"), check);
            }
        }
        if self.hops.len() > MAX_HOPS {
            add(
                format!("{prefix}hops"),
                format!(
                    "has {} hops; at most {MAX_HOPS} are allowed",
                    self.hops.len()
                ),
            );
        }
        for (i, h) in self.hops.iter().enumerate() {
            let p = format!("{prefix}hops[{i}]");
            for (field, end) in [("from", &h.from), ("to", &h.to)] {
                if end != ORCHESTRATOR && !ids.contains_key(end.as_str()) {
                    add(
                        format!("{p}.{field}"),
                        format!(
                            "names agent \"{end}\" which is not in agents (or \"{ORCHESTRATOR}\")"
                        ),
                    );
                }
            }
            if h.from == h.to {
                add(p.clone(), format!("goes from \"{}\" to itself", h.from));
            }
            text_problem(&mut add, format!("{p}.handoff"), &h.handoff);
            if let Some(s) = &h.send_back_when {
                text_problem(&mut add, format!("{p}.send_back_when"), s);
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(ProposalError::Invalid(bad))
        }
    }
}

fn id_problem(id: &str) -> Option<String> {
    if id.trim().is_empty() {
        Some("must not be empty".into())
    } else if id.trim() != id {
        Some("must not start or end with whitespace".into())
    } else if id.chars().any(char::is_control) {
        Some("must not contain control characters or line breaks".into())
    } else if id.chars().count() > MAX_ID_CHARS {
        Some(format!("is longer than {MAX_ID_CHARS} characters"))
    } else {
        None
    }
}

fn text_problem(add: &mut impl FnMut(String, String), path: String, text: &str) {
    let n = text.chars().count();
    if text.trim().is_empty() {
        add(path, "must not be empty".into());
    } else if n > MAX_TEXT_CHARS {
        add(
            path,
            format!("is {n} characters long; at most {MAX_TEXT_CHARS} are allowed"),
        );
    }
}

fn hop_prefixes(i: usize) -> (String, String, String) {
    let lead = format!("{}. ", i + 1);
    let cont = " ".repeat(lead.len());
    let block = format!("{cont}  ");
    (lead, cont, block)
}

// ---------------------------------------------------------------------------
// Parsing the rendered section

/// A line cursor over `text` that knows byte positions, so the section's
/// exact range can be cut out of the prompt.
struct Cursor<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<&'a str> {
        if self.pos >= self.text.len() {
            return None;
        }
        let rest = &self.text[self.pos..];
        Some(rest.find('\n').map_or(rest, |i| &rest[..i]))
    }

    fn take(&mut self) -> Option<&'a str> {
        let line = self.peek()?;
        self.pos = (self.pos + line.len() + 1).min(self.text.len());
        Some(line)
    }

    fn expect(&mut self, line: &str) -> Option<()> {
        (self.take()? == line).then_some(())
    }
}

fn parse_block(cur: &mut Cursor<'_>, indent: &str) -> Option<String> {
    let bar = format!("{indent}|");
    let bar_space = format!("{indent}| ");
    let mut lines = Vec::new();
    while let Some(line) = cur.peek() {
        if line == bar {
            lines.push("");
        } else if let Some(rest) = line.strip_prefix(&bar_space) {
            lines.push(rest);
        } else {
            break;
        }
        cur.take();
    }
    // A block always has at least one line (even for the empty string).
    (!lines.is_empty()).then(|| lines.join("\n"))
}

fn parse_field(
    cur: &mut Cursor<'_>,
    prefix: &str,
    key: &str,
    block_indent: &str,
) -> Option<String> {
    let line = cur.take()?;
    let rest = line
        .strip_prefix(prefix)?
        .strip_prefix(key)?
        .strip_prefix(':')?;
    if rest.is_empty() {
        parse_block(cur, block_indent)
    } else {
        // Only the canonical form is accepted, so parse(render(w)) is exact.
        let value = rest.strip_prefix(' ')?;
        is_inline(value).then(|| value.to_string())
    }
}

/// Parses "None." or a sequence of items, each followed by a blank line.
fn parse_items<T>(
    cur: &mut Cursor<'_>,
    mut starts_item: impl FnMut(&str, usize) -> bool,
    mut item: impl FnMut(&mut Cursor<'_>, usize) -> Option<T>,
) -> Option<Vec<T>> {
    let mut items = Vec::new();
    if cur.peek()? == "None." {
        cur.take();
        cur.expect("")?;
        return Some(items);
    }
    while cur.peek().is_some_and(|l| starts_item(l, items.len())) {
        let parsed = item(cur, items.len())?;
        items.push(parsed);
        cur.expect("")?;
    }
    // "None." is how an empty list is written; no items at all is not canonical.
    (!items.is_empty()).then_some(items)
}

fn parse_agent(cur: &mut Cursor<'_>) -> Option<Agent> {
    Some(Agent {
        agent_id: parse_field(cur, "- ", "agent_id", "    ")?,
        role: parse_field(cur, "  ", "role", "    ")?,
        instruction: parse_field(cur, "  ", "instruction", "    ")?,
    })
}

fn parse_contract(cur: &mut Cursor<'_>) -> Option<Contract> {
    let agent_id = parse_field(cur, "- ", "agent_id", "    ")?;
    let returns = parse_field(cur, "  ", "returns", "    ")?;
    let mut checks = Vec::new();
    match cur.take()? {
        "  checks: none" => {}
        "  checks:" => {
            while let Some(line) = cur.peek() {
                if line == "    -" {
                    cur.take();
                    checks.push(parse_block(cur, "      ")?);
                } else if let Some(v) = line.strip_prefix("    - ") {
                    if !is_inline(v) {
                        return None;
                    }
                    cur.take();
                    checks.push(v.to_string());
                } else {
                    break;
                }
            }
            if checks.is_empty() {
                return None;
            }
        }
        _ => return None,
    }
    Some(Contract {
        agent_id,
        returns,
        checks,
    })
}

fn parse_hop(cur: &mut Cursor<'_>, i: usize) -> Option<Hop> {
    let (lead, cont, block) = hop_prefixes(i);
    let from = parse_field(cur, &lead, "from", &block)?;
    let to = parse_field(cur, &cont, "to", &block)?;
    let handoff = parse_field(cur, &cont, "handoff", &block)?;
    let key = format!("{cont}send_back_when:");
    let send_back_when = if cur.peek().is_some_and(|l| l.starts_with(&key)) {
        Some(parse_field(cur, &cont, "send_back_when", &block)?)
    } else {
        None
    };
    Some(Hop {
        from,
        to,
        handoff,
        send_back_when,
    })
}

/// Parses a section that starts at byte `start` (the newline before the
/// heading); returns the workflow and the byte just past the end marker line.
fn parse_section_at(text: &str, start: usize) -> Option<(Workflow, usize)> {
    let mut cur = Cursor { text, pos: start };
    for line in ["", SECTION_HEADING, "", PREAMBLE, "", "### Agents", ""] {
        cur.expect(line)?;
    }
    let agents = parse_items(&mut cur, |l, _| l.starts_with("- "), |c, _| parse_agent(c))?;
    cur.expect("### Contracts")?;
    cur.expect("")?;
    let contracts = parse_items(
        &mut cur,
        |l, _| l.starts_with("- "),
        |c, _| parse_contract(c),
    )?;
    cur.expect("### Hops (in order)")?;
    cur.expect("")?;
    let hops = parse_items(
        &mut cur,
        |l, n| l.starts_with(&format!("{}. ", n + 1)),
        parse_hop,
    )?;
    cur.expect(END_MARKER)?;
    let w = Workflow {
        agents,
        contracts,
        hops,
    };
    // The bare workflow has no rendering, so a section claiming to be one is not ours.
    (!w.is_bare()).then_some((w, cur.pos))
}

/// Finds the rendered workflow section in `text`: its byte range (including
/// the leading newline and the end marker's newline) and the workflow. When
/// several valid sections exist, the last one wins (the one appended last).
pub fn find_section(text: &str) -> Option<(std::ops::Range<usize>, Workflow)> {
    let needle = format!("\n{SECTION_HEADING}\n");
    // Overlapping search: a prompt that itself ends in "\n## Team workflow"
    // shares its last newline-free line with the real section's needle, and
    // a non-overlapping search would then skip the real start.
    let mut starts = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(&needle) {
        starts.push(from + i);
        from += i + 1;
    }
    starts
        .into_iter()
        .rev()
        .find_map(|start| parse_section_at(text, start).map(|(w, end)| (start..end, w)))
}

/// The workflow rendered inside `text`, if any. For every non-bare `w`,
/// `parse_rendered(&(prompt + &w.render())) == Some(w)`; a prompt without a
/// section (which is how the bare workflow looks) gives `None`.
pub fn parse_rendered(text: &str) -> Option<Workflow> {
    find_section(text).map(|(_, w)| w)
}

/// `prompt` without its workflow section: byte-identical to the prompt the
/// section was appended to (anything after the section is kept). A prompt
/// without a valid section is returned unchanged.
pub fn strip_from_prompt(prompt: &str) -> String {
    match find_section(prompt) {
        Some((range, _)) => {
            let mut out = String::with_capacity(prompt.len() - range.len());
            out.push_str(&prompt[..range.start]);
            out.push_str(&prompt[range.end..]);
            out
        }
        None => prompt.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Optimizer proposals

/// Parses and validates an optimizer reply. Accepts the JSON object alone,
/// in a ```json fence, or surrounded by prose (the last balanced object with
/// an `improved_design` key wins). Only `improved_design` (with `agents`) is
/// required: the commentary fields default to empty, since a design without
/// a rationale is still runnable. List fields may be a string or a list of
/// strings. Unknown top-level keys are ignored (commentary); unknown keys
/// inside `improved_design` are errors, because dropping them would silently
/// run a different design than the optimizer proposed. Strings are trimmed.
pub fn parse_proposal(model_text: &str) -> Result<Proposal, ProposalError> {
    if model_text.len() > MAX_REPLY_BYTES {
        return Err(ProposalError::TooLarge {
            bytes: model_text.len(),
        });
    }
    let object = extract_object(model_text)?;
    let proposal = proposal_from_object(&object)?;
    proposal.improved_design.validate_at("improved_design.")?;
    Ok(proposal)
}

/// Index of the `}` matching the `{` at `start`, honouring JSON strings.
fn balanced_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate().skip(start) {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The outermost balanced JSON objects in `text`; prefers the last one that
/// has `improved_design`.
fn extract_object(text: &str) -> Result<Map<String, Value>, ProposalError> {
    let bytes = text.as_bytes();
    // Each parsed object with the length of its source text.
    let mut objects: Vec<(usize, Map<String, Value>)> = Vec::new();
    // The largest balanced region that failed to parse, to explain why.
    let mut best_failure: Option<(usize, String)> = None;
    let mut failed = 0usize;
    let mut i = 0usize;
    while let Some(offset) = text[i..].find('{') {
        let start = i + offset;
        if let Some(end) = balanced_end(bytes, start) {
            // '{' and '}' are ASCII, so both ends are char boundaries.
            let slice = &text[start..=end];
            match serde_json::from_str::<Value>(slice) {
                Ok(Value::Object(map)) => {
                    objects.push((slice.len(), map));
                    i = end + 1;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    if best_failure
                        .as_ref()
                        .is_none_or(|(len, _)| slice.len() > *len)
                    {
                        best_failure = Some((slice.len(), e.to_string()));
                    }
                }
            }
        }
        failed += 1;
        if failed > MAX_FAILED_STARTS {
            break;
        }
        i = start + 1;
    }
    let largest_ok = objects.iter().map(|(len, _)| *len).max().unwrap_or(0);
    if let Some(pos) = objects
        .iter()
        .rposition(|(_, m)| m.contains_key("improved_design"))
    {
        return Ok(objects.swap_remove(pos).1);
    }
    match best_failure {
        // A broken object bigger than anything that parsed is most likely
        // the intended proposal: report its syntax error.
        Some((len, message)) if len > largest_ok => Err(ProposalError::Json { message }),
        _ => match objects.into_iter().max_by_key(|(len, _)| *len) {
            Some((_, map)) => Ok(map),
            None => Err(ProposalError::NoJsonObject),
        },
    }
}

fn schema(path: &str, message: impl Into<String>) -> ProposalError {
    ProposalError::Schema {
        path: path.to_string(),
        message: message.into(),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn join_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Required string field of an object at `path`.
fn req_string(map: &Map<String, Value>, path: &str, key: &str) -> Result<String, ProposalError> {
    match map.get(key) {
        None | Some(Value::Null) => Err(schema(path, format!("is missing \"{key}\""))),
        Some(Value::String(s)) => Ok(s.trim().to_string()),
        Some(other) => Err(schema(
            &join_path(path, key),
            format!("must be a string, found {}", type_name(other)),
        )),
    }
}

/// A string, a list of strings, or absent/null (empty).
fn string_list(value: Option<&Value>, path: &str) -> Result<Vec<String>, ProposalError> {
    let list = match value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => {
            let s = s.trim();
            if s.is_empty() {
                Vec::new()
            } else {
                vec![s.to_string()]
            }
        }
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) if !s.trim().is_empty() => out.push(s.trim().to_string()),
                    Value::String(_) => {}
                    other => {
                        return Err(schema(
                            &format!("{path}[{i}]"),
                            format!("must be a string, found {}", type_name(other)),
                        ))
                    }
                }
            }
            out
        }
        Some(other) => {
            return Err(schema(
                path,
                format!(
                    "must be a string or a list of strings, found {}",
                    type_name(other)
                ),
            ))
        }
    };
    if list.len() > MAX_LIST_ITEMS {
        return Err(schema(
            path,
            format!(
                "has {} entries; at most {MAX_LIST_ITEMS} are allowed",
                list.len()
            ),
        ));
    }
    for (i, s) in list.iter().enumerate() {
        if s.chars().count() > MAX_TEXT_CHARS {
            return Err(schema(
                &format!("{path}[{i}]"),
                format!("is longer than {MAX_TEXT_CHARS} characters"),
            ));
        }
    }
    Ok(list)
}

/// A prose field: a string (a list of strings is joined with newlines).
fn prose(value: Option<&Value>, path: &str) -> Result<String, ProposalError> {
    let text = match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.trim().to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(v @ Value::Array(_)) => string_list(Some(v), path)?.join("\n"),
        Some(other) => {
            return Err(schema(
                path,
                format!("must be a string, found {}", type_name(other)),
            ))
        }
    };
    if text.chars().count() > MAX_TEXT_CHARS {
        return Err(schema(
            path,
            format!("is longer than {MAX_TEXT_CHARS} characters"),
        ));
    }
    Ok(text)
}

fn object_at<'v>(value: &'v Value, path: &str) -> Result<&'v Map<String, Value>, ProposalError> {
    match value {
        Value::Object(m) => Ok(m),
        other => Err(schema(
            path,
            format!("must be an object, found {}", type_name(other)),
        )),
    }
}

fn array_at<'v>(
    map: &'v Map<String, Value>,
    path: &str,
    key: &str,
    required: bool,
) -> Result<&'v [Value], ProposalError> {
    match map.get(key) {
        None | Some(Value::Null) if required => Err(schema(path, format!("is missing \"{key}\""))),
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(schema(
            &join_path(path, key),
            format!("must be a list, found {}", type_name(other)),
        )),
    }
}

fn deny_unknown(
    map: &Map<String, Value>,
    path: &str,
    allowed: &[&str],
) -> Result<(), ProposalError> {
    match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(schema(
            path,
            format!(
                "has unknown field \"{k}\" (expected {})",
                allowed
                    .iter()
                    .map(|a| format!("\"{a}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        None => Ok(()),
    }
}

fn workflow_from_value(value: &Value, path: &str) -> Result<Workflow, ProposalError> {
    // Some models double-encode the design as a JSON string.
    let decoded;
    let value = match value {
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => {
                decoded = v;
                &decoded
            }
            _ => return Err(schema(path, "must be an object, found a string")),
        },
        v => v,
    };
    let map = object_at(value, path)?;
    deny_unknown(map, path, &["agents", "contracts", "hops"])?;
    let mut w = Workflow::default();
    for (i, item) in array_at(map, path, "agents", true)?.iter().enumerate() {
        let p = format!("{path}.agents[{i}]");
        let m = object_at(item, &p)?;
        deny_unknown(m, &p, &["agent_id", "role", "instruction"])?;
        w.agents.push(Agent {
            agent_id: req_string(m, &p, "agent_id")?,
            role: req_string(m, &p, "role")?,
            instruction: req_string(m, &p, "instruction")?,
        });
    }
    for (i, item) in array_at(map, path, "contracts", false)?.iter().enumerate() {
        let p = format!("{path}.contracts[{i}]");
        let m = object_at(item, &p)?;
        deny_unknown(m, &p, &["agent_id", "returns", "checks"])?;
        w.contracts.push(Contract {
            agent_id: req_string(m, &p, "agent_id")?,
            returns: req_string(m, &p, "returns")?,
            checks: string_list(m.get("checks"), &format!("{p}.checks"))?,
        });
    }
    for (i, item) in array_at(map, path, "hops", false)?.iter().enumerate() {
        let p = format!("{path}.hops[{i}]");
        let m = object_at(item, &p)?;
        deny_unknown(m, &p, &["from", "to", "handoff", "send_back_when"])?;
        let send_back_when = match m.get("send_back_when") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.trim().is_empty() => None,
            Some(Value::String(s)) => Some(s.trim().to_string()),
            Some(other) => {
                return Err(schema(
                    &format!("{p}.send_back_when"),
                    format!("must be a string or null, found {}", type_name(other)),
                ))
            }
        };
        w.hops.push(Hop {
            from: req_string(m, &p, "from")?,
            to: req_string(m, &p, "to")?,
            handoff: req_string(m, &p, "handoff")?,
            send_back_when,
        });
    }
    Ok(w)
}

fn proposal_from_object(map: &Map<String, Value>) -> Result<Proposal, ProposalError> {
    let design = match map.get("improved_design") {
        None | Some(Value::Null) => return Err(schema("", "is missing \"improved_design\"")),
        Some(v) => workflow_from_value(v, "improved_design")?,
    };
    Ok(Proposal {
        improved_design: design,
        changes_from_previous: string_list(
            map.get("changes_from_previous"),
            "changes_from_previous",
        )?,
        why_it_should_improve: prose(map.get("why_it_should_improve"), "why_it_should_improve")?,
        evidence_used: string_list(map.get("evidence_used"), "evidence_used")?,
        expected_impact: prose(map.get("expected_impact"), "expected_impact")?,
        verification_checks: string_list(map.get("verification_checks"), "verification_checks")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Workflow {
        Workflow {
            agents: vec![
                Agent {
                    agent_id: "analyst".into(),
                    role: "Data analyst".into(),
                    instruction: "Load data/prices.csv and run the backtest.".into(),
                },
                Agent {
                    agent_id: "reviewer".into(),
                    role: "Reviewer".into(),
                    instruction: "Check every number in report.md.\n\nRun the validator.".into(),
                },
            ],
            contracts: vec![Contract {
                agent_id: "analyst".into(),
                returns: "results.json and a summary".into(),
                checks: vec![
                    "python3 checks/validate.py passes".into(),
                    " padded ".into(),
                ],
            }],
            hops: vec![
                Hop {
                    from: "orchestrator".into(),
                    to: "analyst".into(),
                    handoff: "the task".into(),
                    send_back_when: None,
                },
                Hop {
                    from: "analyst".into(),
                    to: "reviewer".into(),
                    handoff: "results.json".into(),
                    send_back_when: Some("a check fails".into()),
                },
            ],
        }
    }

    const SAMPLE_RENDERED: &str = "
## Team workflow

You are the orchestrator and the agents below are your team. Delegate to each agent with its instruction, hold it to its contract (what it must return to you and which checks it must run), and follow the hops in order, sending work back whenever a hop's send-back condition holds.

### Agents

- agent_id: analyst
  role: Data analyst
  instruction: Load data/prices.csv and run the backtest.

- agent_id: reviewer
  role: Reviewer
  instruction:
    | Check every number in report.md.
    |
    | Run the validator.

### Contracts

- agent_id: analyst
  returns: results.json and a summary
  checks:
    - python3 checks/validate.py passes
    -
      |  padded 

### Hops (in order)

1. from: orchestrator
   to: analyst
   handoff: the task

2. from: analyst
   to: reviewer
   handoff: results.json
   send_back_when: a check fails

<!-- end of team workflow -->
";

    #[test]
    fn render_is_pinned() {
        assert_eq!(sample().render(), SAMPLE_RENDERED);
    }

    #[test]
    fn bare_renders_empty_and_is_not_found() {
        assert_eq!(Workflow::bare().render(), "");
        assert!(Workflow::bare().is_bare());
        assert_eq!(parse_rendered("# Task\nDo it.\n"), None);
        assert_eq!(strip_from_prompt("# Task\nDo it.\n"), "# Task\nDo it.\n");
    }

    #[test]
    fn round_trip_sample_and_strip() {
        let prompt = "# Task\n\nCompute things.\n";
        let full = format!("{prompt}{}", sample().render());
        assert_eq!(parse_rendered(&full), Some(sample()));
        assert_eq!(strip_from_prompt(&full), prompt);
        // A directive appended after the section survives stripping.
        let with_directive = format!("{full}\nBegin now.\n");
        assert_eq!(parse_rendered(&with_directive), Some(sample()));
        assert_eq!(
            strip_from_prompt(&with_directive),
            format!("{prompt}\nBegin now.\n")
        );
        // No trailing newline on the prompt, and an empty prompt.
        let full = format!("no newline{}", sample().render());
        assert_eq!(strip_from_prompt(&full), "no newline");
        assert_eq!(parse_rendered(&sample().render()), Some(sample()));
        assert_eq!(strip_from_prompt(&sample().render()), "");
    }

    #[test]
    fn decoy_heading_in_task_text_is_ignored() {
        let prompt = "Intro\n## Team workflow\nThe task talks about a team workflow.\n<!-- end of team workflow -->\n";
        let full = format!("{prompt}{}", sample().render());
        assert_eq!(parse_rendered(&full), Some(sample()));
        assert_eq!(strip_from_prompt(&full), prompt);
    }

    #[test]
    fn prompt_ending_in_the_heading_text_is_handled() {
        // Regression: the prompt's own "\n## Team workflow" shares a newline
        // with the section's opening needle.
        let prompt = "Task\n## Team workflow";
        let full = format!("{prompt}{}", sample().render());
        assert_eq!(parse_rendered(&full), Some(sample()));
        assert_eq!(strip_from_prompt(&full), prompt);
    }

    #[test]
    fn damaged_sections_are_not_parsed() {
        let r = sample().render();
        for broken in [
            r.replace(END_MARKER, "<!-- end -->"),
            r.replace("  role: Reviewer", "  role:  Reviewer"),
            r.replace("2. from", "3. from"),
            r.replace("    |\n", "    |x\n"),
            r.replace("### Contracts\n\n", "### Contracts\n"),
        ] {
            assert_eq!(parse_rendered(&broken), None, "{broken}");
            assert_eq!(strip_from_prompt(&broken), broken);
        }
        // A truncated end marker line without its newline still parses.
        let trimmed = r.trim_end_matches('\n');
        assert_eq!(parse_rendered(trimmed), Some(sample()));
    }

    /// Deterministic generator (SplitMix64): no extra dev-dependency needed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn text(&mut self) -> String {
            const PIECES: &[&str] = &[
                "a",
                "word",
                " ",
                "  ",
                "\n",
                "\n\n",
                "\r\n",
                "\t",
                "|",
                "| ",
                "- ",
                "-",
                "1. ",
                "none",
                "None.",
                "checks: none",
                "## Team workflow",
                "\n## Team workflow\n",
                END_MARKER,
                "<!--",
                "é",
                "日本語",
                "🦀",
                "\u{2028}",
                "\u{a0}",
                "{",
                "}",
                "\"",
                "\\",
                "agent_id:",
                "role: x",
                "### Hops (in order)",
                "\u{0}",
                "",
            ];
            let n = self.below(6);
            (0..n).map(|_| PIECES[self.below(PIECES.len())]).collect()
        }
        fn list<T>(&mut self, max: usize, mut f: impl FnMut(&mut Self) -> T) -> Vec<T> {
            let n = self.below(max + 1);
            (0..n).map(|_| f(self)).collect()
        }
        fn workflow(&mut self) -> Workflow {
            Workflow {
                agents: self.list(4, |r| Agent {
                    agent_id: r.text(),
                    role: r.text(),
                    instruction: r.text(),
                }),
                contracts: self.list(3, |r| Contract {
                    agent_id: r.text(),
                    returns: r.text(),
                    checks: r.list(3, Rng::text),
                }),
                // Up to 12 hops so two-digit numbering is exercised.
                hops: self.list(12, |r| Hop {
                    from: r.text(),
                    to: r.text(),
                    handoff: r.text(),
                    send_back_when: if r.below(2) == 0 {
                        None
                    } else {
                        Some(r.text())
                    },
                }),
            }
        }
    }

    #[test]
    fn round_trip_property_on_generated_workflows() {
        let mut rng = Rng(0x5EED);
        let mut checked = 0;
        for _ in 0..3000 {
            let w = rng.workflow();
            let prompt = rng.text();
            let rendered = w.render();
            let full = format!("{prompt}{rendered}");
            if w.is_bare() {
                assert_eq!(rendered, "");
                continue;
            }
            checked += 1;
            assert_eq!(parse_rendered(&full).as_ref(), Some(&w), "{full:?}");
            assert_eq!(strip_from_prompt(&full), prompt, "{full:?}");
            // Text after the section (e.g. a directive) is kept by strip.
            let suffix = rng.text();
            let with_suffix = format!("{full}{suffix}");
            assert_eq!(
                parse_rendered(&with_suffix).as_ref(),
                Some(&w),
                "{with_suffix:?}"
            );
            assert_eq!(strip_from_prompt(&with_suffix), format!("{prompt}{suffix}"));
            // Rendering is a function of the workflow alone.
            assert_eq!(parse_rendered(&full).map(|p| p.render()), Some(rendered));
        }
        assert!(checked > 2500, "{checked}");
    }

    #[test]
    fn workflow_json_round_trip() {
        let w = sample();
        let json = serde_json::to_string(&w).unwrap_or_default();
        let back: Workflow = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, w);
    }

    #[test]
    fn summary_features_counts() {
        let f = sample().summary_features();
        assert_eq!(
            f,
            WorkflowFeatures {
                agents: 2,
                contracts_with_checks: 1,
                hops: 2,
                send_backs: 1,
                instruction_chars: "Load data/prices.csv and run the backtest.".len()
                    + "Check every number in report.md.\n\nRun the validator.".len(),
            }
        );
        assert_eq!(
            Workflow::bare().summary_features(),
            WorkflowFeatures::default()
        );
        let unicode = Workflow {
            agents: vec![Agent {
                agent_id: "a".into(),
                role: "r".into(),
                instruction: "日本語".into(),
            }],
            ..Workflow::default()
        };
        assert_eq!(unicode.summary_features().instruction_chars, 3);
    }

    /// Compact JSON written out literally (not with `json!`), so the key
    /// order the tests edit does not depend on serde_json's features.
    fn proposal_json() -> String {
        concat!(
            r#"{"improved_design":{"agents":["#,
            r#"{"agent_id":"analyst","role":"Data analyst","instruction":"Run it."},"#,
            r#"{"agent_id":"qa","role":"QA","instruction":"Check it."}],"#,
            r#""contracts":[{"agent_id":"analyst","returns":"results.json","checks":"validate passes"}],"#,
            r#""hops":[{"from":"orchestrator","to":"analyst","handoff":"task","send_back_when":null},"#,
            r#"{"from":"analyst","to":"qa","handoff":"results","send_back_when":"a check fails"}]},"#,
            r#""changes_from_previous":"added qa","#,
            r#""why_it_should_improve":"QA catches errors {like this}","#,
            r#""evidence_used":["judge said numbers were wrong","iteration 2 lost"],"#,
            r#""expected_impact":"fewer wrong numbers","#,
            r#""verification_checks":["qa ran validate"]}"#
        )
        .to_string()
    }

    fn ok(text: &str) -> Proposal {
        parse_proposal(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    fn err(text: &str) -> String {
        match parse_proposal(text) {
            Ok(p) => panic!("expected an error, got {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn proposal_in_all_wrappings() {
        let json = proposal_json();
        let expected = ok(&json);
        assert_eq!(expected.improved_design.agents.len(), 2);
        assert_eq!(expected.changes_from_previous, ["added qa"]);
        assert_eq!(expected.evidence_used.len(), 2);
        assert_eq!(
            expected.improved_design.contracts[0].checks,
            ["validate passes"]
        );
        assert_eq!(expected.improved_design.hops[0].send_back_when, None);
        assert_eq!(
            expected.improved_design.hops[1].send_back_when.as_deref(),
            Some("a check fails")
        );
        let pretty = serde_json::from_str::<Value>(&json)
            .and_then(|v| serde_json::to_string_pretty(&v))
            .unwrap_or_default();
        for wrapped in [
            format!("```json\n{pretty}\n```"),
            format!("Here is my proposal {{with braces}} and a stray {{ brace:\n\n```json\n{pretty}\n```\nThanks! }}"),
            format!("Thinking... the old design was {{\"agents\": []}}.\nFinal answer: {json} -- done"),
            format!("<think>{{not json}}</think>\n{json}"),
        ] {
            assert_eq!(ok(&wrapped), expected, "{wrapped}");
        }
    }

    #[test]
    fn double_encoded_design_is_accepted() {
        let inner =
            serde_json::json!({"agents": [{"agent_id": "a", "role": "r", "instruction": "i"}]});
        let text = serde_json::json!({"improved_design": inner.to_string()}).to_string();
        let p = ok(&text);
        assert_eq!(p.improved_design.agents[0].agent_id, "a");
        assert!(p.changes_from_previous.is_empty());
    }

    #[test]
    fn proposal_errors_say_what_and_where() {
        assert_eq!(
            err("I could not decide."),
            "no JSON object found in the optimizer's reply"
        );
        assert_eq!(err(""), "no JSON object found in the optimizer's reply");
        let m = err("```json\n{\"improved_design\": {\"agents\": [],}}\n```");
        assert!(
            m.starts_with("the JSON object in the optimizer's reply is not valid JSON"),
            "{m}"
        );
        assert!(m.contains("line 1"), "{m}");
        assert_eq!(
            err("{\"why\": 1}"),
            "proposal is missing \"improved_design\""
        );

        let missing = proposal_json().replace(",\"instruction\":\"Check it.\"", "");
        assert_eq!(
            err(&missing),
            "proposal field \"improved_design.agents[1]\" is missing \"instruction\""
        );
        let wrong_hop = proposal_json().replace("\"to\":\"qa\"", "\"to\":\"qb\"");
        assert_eq!(
            err(&wrong_hop),
            "improved_design.hops[1].to names agent \"qb\" which is not in agents (or \"orchestrator\")"
        );
        let typed = proposal_json().replace("\"role\":\"QA\"", "\"role\":3");
        assert_eq!(
            err(&typed),
            "proposal field \"improved_design.agents[1].role\" must be a string, found a number"
        );
        let extra = proposal_json().replace("\"role\":\"QA\"", "\"role\":\"QA\",\"tools\":[]");
        assert!(
            err(&extra).starts_with(
                "proposal field \"improved_design.agents[1]\" has unknown field \"tools\""
            ),
            "{}",
            err(&extra)
        );
        let bad_list = proposal_json().replace("\"added qa\"", "{\"x\":1}");
        assert_eq!(
            err(&bad_list),
            "proposal field \"changes_from_previous\" must be a string or a list of strings, found an object"
        );
        let not_obj = "{\"improved_design\": [1, 2]}";
        assert_eq!(
            err(not_obj),
            "proposal field \"improved_design\" must be an object, found a list"
        );
    }

    #[test]
    fn validation_rules() {
        let dup = proposal_json().replace("\"agent_id\":\"qa\"", "\"agent_id\":\"analyst\"");
        let m = err(&dup);
        assert!(
            m.contains("improved_design.agents[1].agent_id \"analyst\" duplicates improved_design.agents[0].agent_id"),
            "{m}"
        );
        let empty = proposal_json().replace("\"agent_id\":\"qa\"", "\"agent_id\":\"  \"");
        assert!(err(&empty).contains("improved_design.agents[1].agent_id must not be empty"));
        let reserved =
            proposal_json().replace("\"agent_id\":\"qa\"", "\"agent_id\":\"orchestrator\"");
        assert!(err(&reserved).contains("is reserved for the orchestrator"));
        let contract = proposal_json().replace(
            "\"contracts\":[{\"agent_id\":\"analyst\"",
            "\"contracts\":[{\"agent_id\":\"ghost\"",
        );
        assert!(
            err(&contract).contains("improved_design.contracts[0].agent_id names agent \"ghost\" which is not in agents"),
            "{}",
            err(&contract)
        );
        let self_hop = proposal_json().replace("\"from\":\"analyst\"", "\"from\":\"qa\"");
        assert!(err(&self_hop).contains("improved_design.hops[1] goes from \"qa\" to itself"));

        let many = Workflow {
            agents: (0..13)
                .map(|i| Agent {
                    agent_id: format!("a{i}"),
                    role: "r".into(),
                    instruction: "i".into(),
                })
                .collect(),
            ..Workflow::default()
        };
        let m = many
            .validate()
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        assert_eq!(m, "agents has 13 agents; at most 12 are allowed");

        let long = Workflow {
            agents: vec![Agent {
                agent_id: "a".into(),
                role: "r".into(),
                instruction: "x".repeat(MAX_TEXT_CHARS + 1),
            }],
            ..Workflow::default()
        };
        let m = long
            .validate()
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        assert_eq!(
            m,
            "agents[0].instruction is 4001 characters long; at most 4000 are allowed"
        );
        assert_eq!(sample().validate(), Ok(()));
        assert_eq!(Workflow::bare().validate(), Ok(()));
    }

    #[test]
    fn multiple_problems_are_reported_together() {
        let w = Workflow {
            agents: vec![Agent {
                agent_id: "a".into(),
                role: "".into(),
                instruction: "i".into(),
            }],
            contracts: vec![],
            hops: vec![Hop {
                from: "a".into(),
                to: "b".into(),
                handoff: "h".into(),
                send_back_when: None,
            }],
        };
        match w.validate() {
            Err(ProposalError::Invalid(items)) => {
                let paths: Vec<&str> = items.iter().map(|i| i.path.as_str()).collect();
                assert_eq!(paths, ["agents[0].role", "hops[0].to"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn oversized_and_adversarial_replies_do_not_hang() {
        let big = "x".repeat(MAX_REPLY_BYTES + 1);
        assert!(matches!(
            parse_proposal(&big),
            Err(ProposalError::TooLarge { .. })
        ));
        let braces = "{".repeat(200_000);
        assert_eq!(parse_proposal(&braces), Err(ProposalError::NoJsonObject));
        let nested = format!("{}{}", "{\"a\":".repeat(10_000), "}".repeat(10_000));
        assert!(parse_proposal(&nested).is_err());
    }

    #[test]
    fn parsed_proposal_renders_and_round_trips() {
        let p = ok(&proposal_json());
        let full = format!("Task.\n{}", p.improved_design.render());
        assert_eq!(parse_rendered(&full), Some(p.improved_design.clone()));
        let json = serde_json::to_string(&p).unwrap_or_default();
        let back: Proposal = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, p);
    }
}
