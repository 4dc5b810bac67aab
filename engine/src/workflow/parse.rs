//! Reading a rendered workflow section back into a [`Workflow`]. Only the
//! canonical form `render.rs` writes is accepted, line for line, so that
//! `parse(render(w)) == w` holds exactly and a damaged or hand-edited
//! section is not mistaken for one of ours.

use super::render::{hop_prefixes, is_inline};
use super::{Agent, Contract, Hop, Workflow, END_MARKER, PREAMBLE, SECTION_HEADING};

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
pub(super) fn parse_section_at(text: &str, start: usize) -> Option<(Workflow, usize)> {
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
