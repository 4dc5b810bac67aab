//! The replay normaliser: how two requests are judged the same. Harnesses
//! put the date, the working directory, home paths and random ids in their
//! prompts, so a request replayed on another day, in another directory, does
//! not repeat the recorded bytes. The rules are explicit: a list of regular
//! expressions, each replacing what it matches in every string (keys are
//! left alone) of the request fields it names, applied in order, plus
//! top-level fields left out of the comparison. A rule names no field by
//! default: then it touches the conversation only (every string of every
//! message, `messages`), never `model`, `tools` or another parameter, so
//! `gpt-4o-2024-08-06` and `gpt-4o-2024-05-13` stay different under a date
//! rule. No rule is implied: with none, requests must be equal as JSON
//! values.

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One rule as written in a file: `pattern` (Rust `regex` syntax), what
/// replaces each match (`$1` names a group), and the top-level request
/// fields it applies to (`fields`; none given: `["messages"]`, the
/// conversation). A field of an opaque (non-chat) JSON body is named the
/// same way; `"body"` names a body that is not JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub pattern: String,
    pub replace: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
}

/// The field a rule touches when it names none.
pub const DEFAULT_FIELD: &str = "messages";

/// The normaliser as written (`--normalise FILE`, or `[harness.normalise]`):
///
/// ```toml
/// ignore = ["max_tokens"]               # top-level request fields not compared
/// [[rules]]
/// pattern = '\d{4}-\d{2}-\d{2}'
/// replace = "<DATE>"                     # in messages only
/// [[rules]]
/// pattern = '/tmp/ws-\d+'
/// replace = "<WS>"
/// fields = ["messages", "tools"]         # here also in the tool definitions
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

/// A compiled rule: the pattern, its replacement, the fields it touches.
#[derive(Debug, Clone)]
struct Compiled {
    re: Regex,
    replace: String,
    fields: Vec<String>,
}

/// A compiled normaliser.
#[derive(Debug, Clone, Default)]
pub struct Normaliser {
    ignore: Vec<String>,
    rules: Vec<Compiled>,
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
            let fields = if r.fields.is_empty() {
                vec![DEFAULT_FIELD.to_string()]
            } else {
                r.fields.clone()
            };
            rules.push(Compiled {
                re,
                replace: r.replace.clone(),
                fields,
            });
        }
        Ok(Normaliser {
            ignore: cfg.ignore.clone(),
            rules,
        })
    }

    /// Adds a rule replacing a literal string (a workspace path, say) in
    /// the messages and the tool definitions (a harness names its working
    /// directory in both).
    pub fn with_literal(mut self, literal: &str, replace: &str) -> Normaliser {
        if !literal.is_empty() {
            if let Ok(re) = Regex::new(&regex::escape(literal)) {
                // Literal rules go first: a path is replaced before a
                // pattern could cut into it.
                self.rules.insert(
                    0,
                    Compiled {
                        re,
                        replace: replace.replace('$', "$$"),
                        fields: vec![DEFAULT_FIELD.into(), "tools".into()],
                    },
                );
            }
        }
        self
    }

    /// Whether a top-level field is left out of the comparison.
    pub fn ignores(&self, field: &str) -> bool {
        self.ignore.iter().any(|f| f == field)
    }

    fn touches(&self, field: &str) -> bool {
        self.rules
            .iter()
            .any(|r| r.fields.iter().any(|f| f == field))
    }

    /// A string of field `field` with every rule naming it applied in order.
    pub fn text(&self, field: &str, s: &str) -> String {
        let mut cur = std::borrow::Cow::Borrowed(s);
        for r in &self.rules {
            if !r.fields.iter().any(|f| f == field) {
                continue;
            }
            if let std::borrow::Cow::Owned(o) = r.re.replace_all(&cur, r.replace.as_str()) {
                cur = std::borrow::Cow::Owned(o);
            }
        }
        cur.into_owned()
    }

    /// The value of top-level field `field` with every string (not key)
    /// normalised by the rules naming that field.
    pub fn field(&self, field: &str, v: &Value) -> Value {
        if !self.touches(field) {
            return v.clone();
        }
        self.strings(field, v)
    }

    fn strings(&self, field: &str, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.text(field, s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.strings(field, x)).collect()),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), self.strings(field, x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// A whole request body (a JSON object) normalised field by field;
    /// anything else is the field `body`.
    pub fn body(&self, v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), self.field(k, x)))
                    .collect(),
            ),
            other => self.field("body", other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_apply_to_message_strings_in_order_and_literals_first() {
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
        let v = json!(["on 2026-12-01 in /tmp/ws-1$x/f", {"2026-12-01": "session 9f3"}]);
        assert_eq!(
            n.field("messages", &v),
            json!(["on <DATE> in <WS>/f", {"2026-12-01": "session <ID>"}])
        );
        // Literal rules reach the tools; the patterns do not.
        assert_eq!(
            n.field("tools", &json!("in /tmp/ws-1$x on 2026-12-01")),
            json!("in <WS> on 2026-12-01")
        );
        assert!(n.ignores("max_tokens"));
        assert!(!n.ignores("model"));
    }

    /// The bug: the date rule applied to `model` made two model versions
    /// the same request.
    #[test]
    fn a_date_rule_leaves_the_model_name_alone_unless_it_names_it() {
        let date = |fields: &str| {
            let cfg: NormaliseConfig = toml::from_str(&format!(
                "[[rules]]\npattern = '\\d{{4}}-\\d{{2}}-\\d{{2}}'\nreplace = \"<DATE>\"\n{fields}"
            ))
            .unwrap();
            Normaliser::new(&cfg).unwrap()
        };
        let n = date("");
        let a =
            json!({"model": "gpt-4o-2024-08-06", "messages": ["2026-01-01"], "stop": "2024-01-01"});
        let b =
            json!({"model": "gpt-4o-2024-05-13", "messages": ["2026-01-02"], "stop": "2024-01-01"});
        assert_ne!(n.body(&a), n.body(&b));
        assert_eq!(n.body(&a)["messages"], n.body(&b)["messages"]);
        let m = date("fields = [\"model\", \"messages\"]");
        assert_eq!(m.body(&a), m.body(&b));
        // Written back the same way (the harness records its config).
        let cfg: NormaliseConfig =
            toml::from_str("[[rules]]\npattern = 'x'\nreplace = 'y'").unwrap();
        assert_eq!(
            serde_json::to_value(&cfg).unwrap()["rules"][0],
            json!({"pattern": "x", "replace": "y"})
        );
    }

    #[test]
    fn a_bad_pattern_is_named() {
        let cfg = NormaliseConfig {
            ignore: vec![],
            rules: vec![Rule {
                pattern: "(".into(),
                replace: String::new(),
                fields: vec![],
            }],
        };
        let e = Normaliser::new(&cfg).unwrap_err();
        assert_eq!(e.index, 1);
        assert!(e.to_string().contains("\"(\""), "{e}");
    }
}
