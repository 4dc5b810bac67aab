//! The canonical text of a workflow: [`Workflow::render`] and the line
//! helpers it shares with the parser (`parse.rs`), which must read back
//! exactly what is written here. Kept apart from parsing so the one format
//! is defined once, by its writer; see the parent module for the format's
//! rules.

use super::{Workflow, END_MARKER, PREAMBLE, SECTION_HEADING};

/// A value can be written inline only if reading back "rest of the line"
/// gives it exactly: one line, non-empty, no surrounding whitespace.
pub(super) fn is_inline(v: &str) -> bool {
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
}

pub(super) fn hop_prefixes(i: usize) -> (String, String, String) {
    let lead = format!("{}. ", i + 1);
    let cont = " ".repeat(lead.len());
    let block = format!("{cont}  ");
    (lead, cont, block)
}
