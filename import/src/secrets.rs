//! Credentials out of everything an import records or prints. The
//! reference's logging proxy writes requests as they came, so a run folder
//! may hold API keys: in a request body (`api_key`), in a URL (`?key=`,
//! `https://user:pass@host`), in text that quotes a header
//! (`Authorization: Bearer ...`, `x-api-key: ...`) or an environment
//! (`OPENAI_API_KEY=...`), or bare in a message. The import learns every
//! such value from the whole folder first ([`Scrubber::learn_text`] on
//! each file's bytes, [`Scrubber::learn_json`] on each parsed record), so a
//! key seen once in a marked place is also taken out where it appears bare;
//! provider-shaped keys (`sk-...`, `hf_...`, ...) are taken wherever they
//! are. A value after a key-like name (`token = `, `"key": `, `Bearer `) is
//! learnt unless it is clearly code or a word ([`credential_like`]); JSON
//! keys are never rewritten. Each secret is searched
//! for as written, percent-encoded and percent-decoded. Then every blob, field and message is passed through
//! [`Scrubber::json`] / [`Scrubber::bytes`]: key-like fields become
//! `REDACTED` (the proxy's rules, `proxy::scrub::is_secret_name`, at any
//! depth), and every learnt value is replaced by `REDACTED`, all of them in
//! one Aho-Corasick pass that finds every occurrence, overlapping ones
//! merged into one `REDACTED` so no secret's tail is left. At
//! most [`Caps::secrets`](crate::Caps) are learnt; a folder holding more is
//! refused, naming the file that passed the cap.

use aho_corasick::{AhoCorasick, MatchKind};
use proxy::scrub::{is_secret_name, MIN_NEEDLE, REDACTED};
use regex::Regex;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::OnceLock;

use crate::error::{ImportError, Result};

/// What the import knows to be secret, and the rules to take it out.
#[derive(Debug, Default, Clone)]
pub struct Scrubber {
    needles: Needles,
    /// Test-only switch: scrubbing off, to see the protection tests fail.
    disabled: bool,
}

/// The most secrets one import learns by default: a real run holds a
/// handful; a folder of millions of `x_key=...` lines is an attack on the
/// scrubber's time, refused rather than searched for.
pub const MAX_SECRETS: u64 = 100_000;

/// Learnt secrets, each with its JSON-escaped form when that differs (a
/// secret echoed inside a JSON string). A set, so adding one is constant
/// time, and one Aho-Corasick automaton (built when first needed after a
/// change), so replacing them all is one pass over the text, not one per
/// secret.
#[derive(Clone)]
struct Needles {
    set: HashSet<Vec<u8>>,
    cap: u64,
    /// The first secret past the cap was met (reported by `check`).
    over: bool,
    ac: OnceLock<Option<AhoCorasick>>,
}

impl Default for Needles {
    fn default() -> Needles {
        Needles {
            set: HashSet::new(),
            cap: MAX_SECRETS,
            over: false,
            ac: OnceLock::new(),
        }
    }
}

impl std::fmt::Debug for Needles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Needles({} secret(s))", self.set.len())
    }
}

impl Needles {
    /// Adds a secret (ignored when shorter than the proxy's minimum).
    fn add(&mut self, secret: &[u8]) {
        if secret.len() < MIN_NEEDLE {
            return;
        }
        // As written, decoded and encoded: a key learnt from a URL's query
        // (`%2B`) also appears decoded in a body, and the other way round.
        let mut forms = vec![secret.to_vec(), percent_encode(secret)];
        if let Ok(s) = std::str::from_utf8(secret) {
            forms.push(proxy::scrub::percent_decode(s));
        }
        forms.retain(|f| f.len() >= MIN_NEEDLE);
        let escaped = std::str::from_utf8(secret).map(serde_json::to_string);
        if let Ok(Ok(j)) = escaped {
            forms.push(j.as_bytes()[1..j.len() - 1].to_vec());
        }
        forms.dedup();
        for f in forms {
            if self.set.contains(&f) {
                continue;
            }
            if self.set.len() as u64 >= self.cap {
                self.over = true;
                return;
            }
            self.set.insert(f);
            self.ac = OnceLock::new();
        }
    }

    /// Every byte covered by an occurrence of any secret replaced, one
    /// [`REDACTED`] per run of covered bytes. Every occurrence is found,
    /// overlapping ones too, and their ranges merged: replacing leftmost
    /// matches only would leave the tail of a secret that starts inside
    /// another (`abcdefgh1234` and `1234WXYZ9876` in `abcdefgh1234WXYZ9876`).
    fn replace<'a>(&self, bytes: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        let ac = self.ac.get_or_init(|| {
            // Sorted, so the automaton is the same for the same secrets.
            let mut pats: Vec<&Vec<u8>> = self.set.iter().collect();
            pats.sort();
            (!pats.is_empty())
                .then(|| {
                    AhoCorasick::builder()
                        .match_kind(MatchKind::Standard)
                        .build(pats)
                        .ok()
                })
                .flatten()
        });
        let Some(ac) = ac else {
            return std::borrow::Cow::Borrowed(bytes);
        };
        let mut spans: Vec<(usize, usize)> = ac
            .find_overlapping_iter(bytes)
            .map(|m| (m.start(), m.end()))
            .collect();
        if spans.is_empty() {
            return std::borrow::Cow::Borrowed(bytes);
        }
        spans.sort_unstable();
        let mut out = Vec::with_capacity(bytes.len());
        let mut at = 0;
        let mut i = 0;
        while i < spans.len() {
            let (start, mut end) = spans[i];
            i += 1;
            // Merge every span that starts before this run ends.
            while i < spans.len() && spans[i].0 < end {
                end = end.max(spans[i].1);
                i += 1;
            }
            out.extend_from_slice(&bytes[at..start]);
            out.extend_from_slice(REDACTED.as_bytes());
            at = end;
        }
        out.extend_from_slice(&bytes[at..]);
        std::borrow::Cow::Owned(out)
    }

    fn text(&self, s: &str) -> String {
        match self.replace(s.as_bytes()) {
            std::borrow::Cow::Borrowed(_) => s.to_string(),
            std::borrow::Cow::Owned(b) => String::from_utf8_lossy(&b).into_owned(),
        }
    }
}

struct Patterns {
    bearer: Regex,
    pair: Regex,
    userinfo: Regex,
    query: Regex,
    shaped: Regex,
}

fn patterns() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| {
        let tok = r#"[A-Za-z0-9._~+/=\-]{8,}"#;
        // Constant patterns, not input: one that does not compile is a bug
        // every test of the crate hits.
        let re = |s: &str| Regex::new(s).unwrap_or_else(|e| panic!("pattern {s}: {e}"));
        Patterns {
            bearer: re(&format!(r"(?i)\b(?:bearer|basic|token)\s+({tok})")),
            pair: re(&format!(
                r#"([A-Za-z][A-Za-z0-9_.\-]*)[\\"']*\s*[:=]\s*[\\"']*(?:(?i:bearer)\s+)?({tok})"#
            )),
            userinfo: re(r"[A-Za-z][A-Za-z0-9+.\-]*://([^/\s:@]+)(?::([^/\s@]+))?@"),
            query: re(r#"[?&;]([A-Za-z0-9_.%\-]+)=([^&#\s"'\\]{8,})"#),
            shaped: re(
                r"\b(sk-[A-Za-z0-9_\-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_\-]{20,}|xox[abpr]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16})",
            ),
        }
    })
}

/// `b` percent-encoded (every byte but the URL's unreserved ones).
fn percent_encode(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    for &c in b {
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            out.push(c);
        } else {
            out.extend_from_slice(format!("%{c:02X}").as_bytes());
        }
    }
    out
}

/// Whether a value found after a key-like name (`token = ...`,
/// `"key": ...`, `Bearer ...`) is learnt as a secret: every value of 8
/// bytes or more is, unless it is clearly code or a word, since a key
/// missed leaks while a word learnt only over-redacts. Code and words are:
/// a value holding a parenthesis, bracket or brace (`os.environ[...]`,
/// `tokenizer.encode(x)`, `${KEY}`), a `$` reference (`$OPENAI_API_KEY`),
/// letters (with `_` and `-`) alone (`description`, `string`,
/// `os_environ`), or a dotted path of such words (`tokenizer.encode`,
/// `config.api_key`). So `"key": "description"` and `token =
/// tokenizer.encode` keep their text, while `abcd1234efgh`, `hunter22`,
/// `ABCD1234EFGH` and a dotted token with digits are learnt. A secret of
/// letters alone is still redacted where it stands in a key-named JSON
/// field, but not learnt for other places.
fn credential_like(v: &str) -> bool {
    if v.len() < 8 || v.starts_with('$') {
        return false;
    }
    let code = |c: char| matches!(c, '(' | ')' | '[' | ']' | '{' | '}');
    if v.chars().any(code) {
        return false;
    }
    let word = |w: &str| {
        !w.is_empty()
            && w.bytes()
                .all(|b| b.is_ascii_alphabetic() || b == b'_' || b == b'-')
    };
    !v.split('.').all(word)
}

impl Scrubber {
    pub fn new() -> Scrubber {
        Scrubber::default()
    }

    /// A scrubber that learns at most `cap` secrets.
    pub fn with_cap(cap: u64) -> Scrubber {
        let mut s = Scrubber::default();
        s.needles.cap = cap;
        s
    }

    /// Refuses the folder once more secrets were learnt than the cap, the
    /// error naming `file`, the one being read when the cap was passed.
    pub fn check(&self, file: &str) -> Result<()> {
        if self.needles.over {
            return Err(ImportError::TooMany {
                file: file.to_string(),
                what: "credential-looking values (secrets to scrub) in the run folder".into(),
                cap: self.needles.cap,
            });
        }
        Ok(())
    }

    /// Turns scrubbing off: for the protection tests only, which must see
    /// the planted key reach the ledger without it.
    #[doc(hidden)]
    pub fn disable_for_tests(&mut self) {
        self.disabled = true;
    }

    /// Learns every secret-looking value in a file's text.
    pub fn learn_text(&mut self, bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes);
        let p = patterns();
        for c in p.bearer.captures_iter(&text) {
            if credential_like(&c[1]) {
                self.needles.add(c[1].as_bytes());
            }
        }
        for c in p.pair.captures_iter(&text) {
            if is_secret_name(&c[1]) && credential_like(&c[2]) {
                self.needles.add(c[2].as_bytes());
            }
        }
        for c in p.userinfo.captures_iter(&text) {
            match c.get(2) {
                Some(pass) => self.needles.add(pass.as_str().as_bytes()),
                // `https://TOKEN@host/`: a user alone is a token when it
                // looks like one (not `git@`).
                None if credential_like(&c[1]) => self.needles.add(c[1].as_bytes()),
                None => {}
            }
        }
        for c in p.query.captures_iter(&text) {
            // The name as a server reads it: `api%5Fkey` is `api_key`.
            let name = proxy::scrub::percent_decode(&c[1]);
            if is_secret_name(&String::from_utf8_lossy(&name)) {
                self.needles.add(c[2].as_bytes());
            }
        }
        for c in p.shaped.captures_iter(&text) {
            self.needles.add(c[1].as_bytes());
        }
    }

    /// Learns the values of key-like fields (at any depth) and what the
    /// strings of `v` hold.
    pub fn learn_json(&mut self, v: &Value) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    match x {
                        Value::String(s) if is_secret_name(k) && credential_like(s) => {
                            self.needles.add(s.as_bytes())
                        }
                        Value::Number(n) if is_secret_name(k) => {
                            self.needles.add(n.to_string().as_bytes())
                        }
                        _ => self.learn_json(x),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| self.learn_json(x)),
            Value::String(s) => self.learn_text(s.as_bytes()),
            _ => {}
        }
    }

    /// `v` with key-like fields redacted and every known secret replaced.
    pub fn json(&self, v: &Value) -> Value {
        if self.disabled {
            return v.clone();
        }
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| {
                        let x = match x {
                            Value::String(_) | Value::Number(_) if is_secret_name(k) => {
                                Value::String(REDACTED.into())
                            }
                            _ => self.json(x),
                        };
                        // Keys are never rewritten: a learnt value that
                        // is also a word would rename a tool schema's
                        // fields; a key-like field's value is redacted
                        // above whatever it is.
                        (k.clone(), x)
                    })
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.json(x)).collect()),
            Value::String(s) => Value::String(self.text(s)),
            other => other.clone(),
        }
    }

    /// A text with every known secret replaced.
    pub fn text(&self, s: &str) -> String {
        if self.disabled {
            return s.to_string();
        }
        self.needles.text(s)
    }

    /// Bytes with every known secret replaced.
    pub fn bytes(&self, b: &[u8]) -> Vec<u8> {
        if self.disabled {
            return b.to_vec();
        }
        self.needles.replace(b).into_owned()
    }
}
