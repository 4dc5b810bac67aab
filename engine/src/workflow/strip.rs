//! Finding the rendered section inside a prompt, and cutting it out again
//! so a training prompt is byte-identical to the bare task (MASS.md, outer
//! loop step 5). Separate from `parse.rs`, which reads one section at a
//! known position: this is where a prompt's text is searched.

use super::parse::parse_section_at;
use super::{Workflow, SECTION_HEADING};

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
