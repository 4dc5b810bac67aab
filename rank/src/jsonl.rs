//! Parsing a comparisons file (JSON Lines) into items and comparisons.
//!
//! This module owns the text format in which pairwise verdicts reach the
//! ranking code from outside: one JSON object per line,
//! `{"a": "<item>", "b": "<item>", "winner": "a" | "b" | "tie"}`. Blank
//! (whitespace-only) lines are skipped and other fields (a rationale, judge
//! id, ...) are ignored. Items are numbered in order of first appearance, so
//! the same file always yields the same indices. Every error names the 1-based
//! line and what was expected there, because these files are written by other
//! tools and by hand and the person fixing them needs to find the line.

use std::collections::HashMap;
use std::io::BufRead;

use serde_json::Value;

use crate::bt::{Comparison, Outcome};
use crate::error::{LineProblem, RankError};

/// Items (names, indexed by first appearance) and the comparisons between them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// Item names; `comparisons` refer to positions in this list.
    pub items: Vec<String>,
    /// The comparisons, in file order.
    pub comparisons: Vec<Comparison>,
}

/// Parse a whole comparisons file held in memory.
///
/// # Errors
/// [`RankError::Line`] for the first malformed line.
pub fn parse_comparisons(input: &str) -> Result<Parsed, RankError> {
    let mut builder = Builder::default();
    for (idx, line) in input.lines().enumerate() {
        builder.line(idx + 1, line)?;
    }
    Ok(builder.out)
}

/// Parse a comparisons file from a reader, line by line.
///
/// # Errors
/// [`RankError::Line`] for the first malformed line, [`RankError::Io`] if
/// reading fails (including invalid UTF-8).
pub fn parse_comparisons_reader<R: BufRead>(reader: R) -> Result<Parsed, RankError> {
    let mut builder = Builder::default();
    for (idx, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| RankError::Io {
            line: idx + 1,
            message: e.to_string(),
        })?;
        builder.line(idx + 1, &line)?;
    }
    Ok(builder.out)
}

#[derive(Default)]
struct Builder {
    out: Parsed,
    index: HashMap<String, usize>,
}

impl Builder {
    fn line(&mut self, number: usize, line: &str) -> Result<(), RankError> {
        let err = |problem| RankError::Line {
            line: number,
            problem,
        };
        // A UTF-8 byte order mark may precede the first line of files written
        // by some editors; it is not part of the JSON.
        let text = if number == 1 {
            line.trim_start_matches('\u{feff}')
        } else {
            line
        };
        if text.trim().is_empty() {
            return Ok(());
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| err(LineProblem::InvalidJson(e.to_string())))?;
        let Value::Object(obj) = value else {
            return Err(err(LineProblem::NotAnObject {
                got: type_name(&value),
            }));
        };
        let name = |field: &'static str| -> Result<&str, RankError> {
            match obj.get(field) {
                None => Err(err(LineProblem::MissingField { field })),
                Some(Value::String(s)) if s.is_empty() => {
                    Err(err(LineProblem::EmptyName { field }))
                }
                Some(Value::String(s)) => Ok(s.as_str()),
                Some(other) => Err(err(LineProblem::WrongType {
                    field,
                    got: type_name(other),
                })),
            }
        };
        let a = name("a")?;
        let b = name("b")?;
        let outcome = match obj.get("winner") {
            None => return Err(err(LineProblem::MissingField { field: "winner" })),
            Some(Value::String(s)) => match s.as_str() {
                "a" => Outcome::AWins,
                "b" => Outcome::BWins,
                "tie" => Outcome::Tie,
                _ => return Err(err(LineProblem::BadWinner { got: s.clone() })),
            },
            Some(other) => {
                return Err(err(LineProblem::WrongType {
                    field: "winner",
                    got: type_name(other),
                }))
            }
        };
        if a == b {
            return Err(err(LineProblem::SameItem {
                name: a.to_string(),
            }));
        }
        let a = self.intern(a);
        let b = self.intern(b);
        self.out.comparisons.push(Comparison { a, b, outcome });
        Ok(())
    }

    fn intern(&mut self, name: &str) -> usize {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.out.items.len();
        self.out.items.push(name.to_string());
        self.index.insert(name.to_string(), i);
        i
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
