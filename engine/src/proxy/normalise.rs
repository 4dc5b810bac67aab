//! The replay normaliser: how two requests are judged the same. Harnesses
//! put the date, the working directory, home paths and random ids in their
//! prompts, so a request replayed on another day, in another directory, does
//! not repeat the recorded bytes. The rules are explicit: a list of regular
//! expressions, each replacing what it matches in every string of the
//! request (keys are left alone), applied in order, plus top-level fields
//! left out of the comparison. No rule is implied: with none, requests must
//! be equal as JSON values.

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One rule as written in a file: `pattern` (Rust `regex` syntax) and what
/// replaces each match (`$1` names a group).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub pattern: String,
    pub replace: String,
}

/// The normaliser as written (`--normalise FILE`, or `[harness.normalise]`):
///
/// ```toml
/// ignore = ["max_tokens"]               # top-level request fields not compared
/// [[rules]]
/// pattern = '\d{4}-\d{2}-\d{2}'
/// replace = "<DATE>"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NormaliseConfig {
    pub ignore: Vec<String>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, thiserror::Error)]
#[error("normaliser rule {index} ({pattern:?}): {detail}")]
pub struct NormaliseError {
    pub index: usize,
    pub pattern: String,
    pub detail: String,
}

/// A compiled normaliser.
#[derive(Debug, Clone, Default)]
pub struct Normaliser {
    ignore: Vec<String>,
    rules: Vec<(Regex, String)>,
}

impl Normaliser {
    pub fn new(cfg: &NormaliseConfig) -> Result<Normaliser, NormaliseError> {
        let mut rules = Vec::new();
        for (i, r) in cfg.rules.iter().enumerate() {
            let re = Regex::new(&r.pattern).map_err(|e| NormaliseError {
                index: i + 1,
                pattern: r.pattern.clone(),
                detail: e.to_string(),
            })?;
            rules.push((re, r.replace.clone()));
        }
        Ok(Normaliser {
            ignore: cfg.ignore.clone(),
            rules,
        })
    }

    /// Adds a rule replacing a literal string (a workspace path, say).
    pub fn with_literal(mut self, literal: &str, replace: &str) -> Normaliser {
        if !literal.is_empty() {
            if let Ok(re) = Regex::new(&regex::escape(literal)) {
                // Literal rules go first: a path is replaced before a
                // pattern could cut into it.
                self.rules.insert(0, (re, replace.replace('$', "$$")));
            }
        }
        self
    }

    /// Whether a top-level field is left out of the comparison.
    pub fn ignores(&self, field: &str) -> bool {
        self.ignore.iter().any(|f| f == field)
    }

    /// A string with every rule applied in order.
    pub fn text(&self, s: &str) -> String {
        let mut cur = std::borrow::Cow::Borrowed(s);
        for (re, rep) in &self.rules {
            if let std::borrow::Cow::Owned(o) = re.replace_all(&cur, rep.as_str()) {
                cur = std::borrow::Cow::Owned(o);
            }
        }
        cur.into_owned()
    }

    /// A JSON value with every string (not key) normalised.
    pub fn value(&self, v: &Value) -> Value {
        if self.rules.is_empty() {
            return v.clone();
        }
        match v {
            Value::String(s) => Value::String(self.text(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.value(x)).collect()),
            Value::Object(m) => {
                Value::Object(m.iter().map(|(k, x)| (k.clone(), self.value(x))).collect())
            }
            other => other.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_apply_to_strings_in_order_and_literals_first() {
        let cfg: NormaliseConfig = toml::from_str(
            r#"
            ignore = ["max_tokens"]
            [[rules]]
            pattern = '\d{4}-\d{2}-\d{2}'
            replace = "<DATE>"
            [[rules]]
            pattern = 'session ([0-9a-f]+)'
            replace = "session <ID>"
        "#,
        )
        .unwrap();
        let n = Normaliser::new(&cfg)
            .unwrap()
            .with_literal("/tmp/ws-1$x", "<WS>");
        let v =
            json!({"a": ["on 2026-12-01 in /tmp/ws-1$x/f", {"2026-12-01": "session 9f3"}], "n": 3});
        assert_eq!(
            n.value(&v),
            json!({"a": ["on <DATE> in <WS>/f", {"2026-12-01": "session <ID>"}], "n": 3})
        );
        assert!(n.ignores("max_tokens"));
        assert!(!n.ignores("model"));
    }

    #[test]
    fn a_bad_pattern_is_named() {
        let cfg = NormaliseConfig {
            ignore: vec![],
            rules: vec![Rule {
                pattern: "(".into(),
                replace: String::new(),
            }],
        };
        let e = Normaliser::new(&cfg).unwrap_err();
        assert_eq!(e.index, 1);
        assert!(e.to_string().contains("\"(\""), "{e}");
    }
}
