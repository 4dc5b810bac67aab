//! Credentials out of everything the proxy records, logs, prints or echoes.
//! One scrubber, used by the writer (`log.rs`), the replay matcher
//! (`book.rs`, on the live request before comparing, so a recording still
//! matches) and the HTTP side (`server/`, for replies and reports):
//!
//! - key-like query parameters (`is_secret_name`) get the value [`REDACTED`];
//! - an URL's userinfo (`http://user:pass@host`) is removed;
//! - key-like fields of a JSON request body get the value [`REDACTED`], at
//!   any depth, except inside `messages` (the conversation as sent);
//! - known secrets ([`Needles`]: the upstream's key and URL password, a
//!   route's token, the values the request carried in credential headers,
//!   key-like query parameters and body fields) are replaced wherever they
//!   appear in recorded bytes (messages and response bodies included) and in
//!   error texts.
//!
//! What is forwarded to the upstream is the client's request as it came
//! (the upstream needs it); only what is kept or shown is scrubbed.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::wire::ChatBody;

/// Masks known secrets in a body passed on chunk by chunk, one split
/// across chunks too: each chunk is searched together with what the
/// previous one held back (kept as received, so a secret that starts in it
/// is still found whole), and the end that could be the start of a secret
/// is held back in turn (only such an end: a body with no partial match is
/// passed on as it comes). Bytes already known to be part of a secret stay
/// marked while held back, so two secrets that overlap are both masked.
#[derive(Debug, Default)]
pub struct StreamMask {
    needles: Needles,
    carry: Vec<u8>,
    /// Which bytes of `carry` belong to a secret found so far.
    hide: Vec<bool>,
}

impl StreamMask {
    pub fn new(needles: Needles) -> StreamMask {
        StreamMask {
            needles,
            ..StreamMask::default()
        }
    }

    /// How many received bytes are held back.
    pub fn held(&self) -> usize {
        self.carry.len()
    }

    /// What can be passed on now of `chunk` (after what was held back),
    /// every byte of every secret masked.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.needles.is_empty() {
            return chunk.to_vec();
        }
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(chunk);
        let mut hide = std::mem::take(&mut self.hide);
        hide.resize(buf.len(), false);
        self.needles.cover(&buf, &mut hide);
        let cut = buf.len() - self.needles.partial_at_end(&buf);
        self.carry = buf.split_off(cut);
        self.hide = hide.split_off(cut);
        apply(&mut buf, &hide);
        buf
    }

    /// What is still held back when the body ends: the start of a secret
    /// that never completed, masked whole when it is [`MIN_NEEDLE`] bytes
    /// or longer (a prefix that long is part of a key all the same).
    pub fn finish(&mut self) -> Vec<u8> {
        let mut tail = std::mem::take(&mut self.carry);
        let hide = std::mem::take(&mut self.hide);
        if tail.len() >= MIN_NEEDLE {
            tail.fill(b'*');
        } else {
            apply(&mut tail, &hide);
        }
        tail
    }
}

/// Overwrites with `*` every byte `hide` marks.
fn apply(bytes: &mut [u8], hide: &[bool]) {
    for (b, h) in bytes.iter_mut().zip(hide) {
        if *h {
            *b = b'*';
        }
    }
}

/// What replaces a secret value (query parameters, body fields, texts).
pub const REDACTED: &str = "REDACTED";

/// Known secrets shorter than this are not searched for in free text (a
/// short value would match ordinary words); as a query parameter or body
/// field value they are replaced whatever their length.
pub const MIN_NEEDLE: usize = 8;

/// A credential: never printed (`Debug` shows no byte of it; there is no
/// `Display`), compared in constant time.
#[derive(Clone)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(Arc::from(s.into()))
    }

    /// The secret itself, to send it where it belongs.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this secret, in time independent of where
    /// they differ (their blake3 hashes are compared, in constant time).
    pub fn matches(&self, presented: &[u8]) -> bool {
        blake3::hash(self.0.as_bytes()) == blake3::hash(presented)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Whether a query parameter, JSON field or header name holds a credential
/// (case-insensitive): key, api_key, apikey, api-key, token, access_token,
/// auth, authorization, sig, signature, secret, client_secret, password,
/// passwd, credential(s), x-api-key, and any name ending in `_key`,
/// `_token`, `_secret` (or `-key`, `-token`, `-secret`), `apikey`,
/// `_password` (`-password`), `_passwd`, `_pat`, `_credential(s)`, `_auth`.
pub fn is_secret_name(name: &str) -> bool {
    let n = name.trim().to_ascii_lowercase();
    matches!(
        n.as_str(),
        "key"
            | "api_key"
            | "apikey"
            | "api-key"
            | "token"
            | "access_token"
            | "auth"
            | "authorization"
            | "sig"
            | "signature"
            | "secret"
            | "client_secret"
            | "password"
            | "passwd"
            | "credential"
            | "credentials"
            | "x-api-key"
    ) || [
        "_key",
        "_token",
        "_secret",
        "-key",
        "-token",
        "-secret",
        "apikey",
        "_password",
        "-password",
        "_passwd",
        "_pat",
        "_credentials",
        "_credential",
        "_auth",
    ]
    .iter()
    .any(|s| n.ends_with(s))
}

/// Known secret values, searched for in recorded bytes and in texts. Each
/// is kept with its JSON-escaped form when that differs (a secret echoed
/// inside a JSON string).
#[derive(Clone, Default)]
pub struct Needles(Vec<Vec<u8>>);

impl fmt::Debug for Needles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Needles({} secret(s))", self.0.len())
    }
}

impl Needles {
    pub fn new() -> Needles {
        Needles(Vec::new())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds a secret (ignored when shorter than [`MIN_NEEDLE`]).
    pub fn add(&mut self, secret: &[u8]) {
        if secret.len() < MIN_NEEDLE {
            return;
        }
        let mut push = |b: Vec<u8>| {
            if !self.0.contains(&b) {
                self.0.push(b);
            }
        };
        push(secret.to_vec());
        if let Some(inner) = json_spelling(secret).filter(|e| e != secret) {
            push(inner);
        }
    }

    /// Adds every secret of `other`.
    pub fn extend(&mut self, other: &Needles) {
        for n in &other.0 {
            if !self.0.contains(n) {
                self.0.push(n.clone());
            }
        }
    }

    /// Overwrites every occurrence in place with `*`, keeping the length (a
    /// response body's chunk boundaries stay true). Whether any was found.
    /// Occurrences are found in the bytes as given, before any is
    /// overwritten, so overlapping secrets are all masked whatever their
    /// order.
    pub fn mask(&self, bytes: &mut [u8]) -> bool {
        let mut hide = vec![false; bytes.len()];
        let found = self.cover(bytes, &mut hide);
        apply(bytes, &hide);
        found
    }

    /// Marks in `hide` (as long as `bytes`) every byte of every occurrence
    /// of every secret, overlapping ones included. Whether any was found.
    pub fn cover(&self, bytes: &[u8], hide: &mut [bool]) -> bool {
        let mut found = false;
        for n in &self.0 {
            let mut at = 0;
            while let Some(i) = find(&bytes[at..], n) {
                let s = at + i;
                hide[s..s + n.len()].fill(true);
                at = s + 1;
                found = true;
            }
        }
        found
    }

    /// Replaces every occurrence with [`REDACTED`]: each run of bytes that
    /// some secret covers becomes one `REDACTED`. The occurrences are found
    /// in the bytes as given (`cover`), so a secret that overlaps another
    /// (one the prefix of another) is hidden whole whatever their order;
    /// replacing one secret after another left the longer one's tail.
    pub fn replace<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        if !self.any_in(bytes) {
            return Cow::Borrowed(bytes);
        }
        let mut hide = vec![false; bytes.len()];
        self.cover(bytes, &mut hide);
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if hide[i] {
                out.extend_from_slice(REDACTED.as_bytes());
                while i < bytes.len() && hide[i] {
                    i += 1;
                }
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        Cow::Owned(out)
    }

    /// A text with every occurrence replaced with [`REDACTED`].
    pub fn text(&self, s: &str) -> String {
        match self.replace(s.as_bytes()) {
            Cow::Borrowed(_) => s.to_string(),
            Cow::Owned(b) => String::from_utf8_lossy(&b).into_owned(),
        }
    }
}

impl Needles {
    /// The length of the longest end of `bytes` that is the start (not the
    /// whole) of a secret: what a body passed on in chunks must hold back
    /// until the next chunk shows whether a secret straddles the boundary.
    pub fn partial_at_end(&self, bytes: &[u8]) -> usize {
        let mut keep = 0;
        for n in &self.0 {
            let longest = (n.len() - 1).min(bytes.len());
            for k in (keep + 1..=longest).rev() {
                if bytes.ends_with(&n[..k]) {
                    keep = k;
                    break;
                }
            }
        }
        keep
    }

    /// Whether a secret that JSON spells otherwise (one holding `"`, `\\`
    /// or a control character, and so each escaped variant `add` keeps)
    /// occurs in `json` spelt as JSON spells it: a decoded string then
    /// holds the secret as `value` searches for it, though `json`'s bytes
    /// hold no needle.
    pub fn escaped_in(&self, json: &[u8]) -> bool {
        self.0
            .iter()
            .any(|n| json_spelling(n).is_some_and(|e| e != *n && find(json, &e).is_some()))
    }

    /// Whether any of the secrets occurs in `bytes`.
    pub fn any_in(&self, bytes: &[u8]) -> bool {
        self.0.iter().any(|n| find(bytes, n).is_some())
    }

    /// `bytes` with every occurrence overwritten with `*` (same length).
    pub fn masked<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        if !self.any_in(bytes) {
            return Cow::Borrowed(bytes);
        }
        let mut b = bytes.to_vec();
        self.mask(&mut b);
        Cow::Owned(b)
    }

    /// Replaces every occurrence with [`REDACTED`] in every string and
    /// every object key of `v`. Whether any was found.
    pub fn value(&self, v: &mut Value) -> bool {
        match v {
            Value::String(s) => {
                // JSON held in a string (a tool call's arguments) may spell
                // a secret with escapes its text keeps (`\u0073k-...`).
                if let Some(p) = plain_escapes(s).filter(|p| self.any_in(p.as_bytes())) {
                    *s = self.text(&p);
                    return true;
                }
                if !self.any_in(s.as_bytes()) {
                    return false;
                }
                let t = self.text(s);
                let changed = t != *s;
                *s = t;
                changed
            }
            Value::Array(a) => a.iter_mut().fold(false, |c, x| self.value(x) | c),
            Value::Object(m) => {
                let values = m.values_mut().fold(false, |c, x| self.value(x) | c);
                self.keys(m) | values
            }
            _ => false,
        }
    }

    /// Masks the keys of `m` that hold a secret. Two keys that mask alike
    /// stay two entries: a later one (in the map's order) gets `~2`, `~3`,
    /// ... after it, so no value is dropped to hide a secret.
    fn keys(&self, m: &mut serde_json::Map<String, Value>) -> bool {
        if !m.keys().any(|k| self.any_in(k.as_bytes())) {
            return false;
        }
        for (k, x) in std::mem::take(m) {
            let masked = if self.any_in(k.as_bytes()) {
                self.text(&k)
            } else {
                k
            };
            let mut key = masked.clone();
            let mut n = 2;
            while m.contains_key(&key) {
                key = format!("{masked}~{n}");
                n += 1;
            }
            m.insert(key, x);
        }
        true
    }
}

/// A request body as it is recorded and as it is matched.
#[derive(Debug, Clone)]
pub enum Body {
    /// A chat request taken apart.
    Chat(ChatBody),
    /// Any other body: its bytes as they came, unless a secret was taken
    /// out of them (then, for JSON, the canonical JSON of what is left).
    Opaque(Vec<u8>),
}

/// A request scrubbed: the path's key-like query values, key-like body
/// fields (outside `messages`) and every known secret (`known`, and those
/// the request itself carried there) replaced by [`REDACTED`]. Returns the
/// path, the body and every secret known by then (for the response).
pub fn request(path: &str, body: &[u8], known: &Needles) -> (String, Body, Needles) {
    let (path, body, found) = request_parts(path, body, known);
    // Known secrets anywhere in the path (a value under any name).
    (found.text(&path), body, found)
}

/// [`request`], the path's known secrets not yet masked.
fn request_parts(path: &str, body: &[u8], known: &Needles) -> (String, Body, Needles) {
    let mut found = known.clone();
    let path = query(path, &mut found).into_owned();
    let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
        let b = found.replace(body).into_owned();
        return (path, Body::Opaque(b), found);
    };
    let mut changed = match &mut v {
        // The conversation is kept as sent: only known secrets leave it.
        Value::Object(m) => m
            .iter_mut()
            .filter(|(k, _)| k.as_str() != "messages")
            .fold(false, |c, (k, x)| entry(k, x, &mut found) | c),
        other => json(other, &mut found),
    };
    // Every string is searched as decoded, not only the body's bytes: a
    // secret written with escapes (`\u0073k-...`, `\/`) is not in them.
    if !found.is_empty() {
        changed |= found.value(&mut v);
    }
    match ChatBody::from_value(v) {
        Ok(chat) => (path, Body::Chat(chat), found),
        Err(v) if changed => (path, Body::Opaque(replay::canonical_json(&v)), found),
        Err(_) => (path, Body::Opaque(body.to_vec()), found),
    }
}

/// A chat request as [`request`] scrubs it when no secret is to be masked
/// in its body: everything but the messages parsed and scrubbed, the
/// messages left as sent (raw JSON), so a recorder that has seen a
/// message's bytes before need not parse and re-encode it again.
#[derive(Debug)]
pub struct RawChat<'a> {
    pub model: String,
    /// The `tools` field scrubbed, as canonical JSON.
    pub tools: Option<Vec<u8>>,
    pub params: Map<String, Value>,
    pub messages: Vec<&'a RawValue>,
}

/// A body's `tools` field as [`request`] scrubs it: kept by a recorder
/// for the next request, which sends the same tools (10-20 KiB of schemas
/// an agent resends on every turn).
#[derive(Debug, Clone)]
pub struct SeenTools {
    /// BLAKE3 of the field's bytes as sent.
    hash: [u8; 32],
    /// The field scrubbed, as canonical JSON.
    canonical: Vec<u8>,
    /// The secrets scrubbing it found (key-like fields), in order.
    found: Needles,
}

/// [`request`] for a chat request in which no secret is to be masked
/// (the common case): the same path, needles and, with each message
/// parsed, the same `ChatBody`. `None` when that is not so or cannot be
/// told without parsing the whole body (not a JSON object with a
/// `messages` array, a key given twice, a part nested deep, a secret known
/// by then in the body or an escape that could spell one); [`request`]
/// then gives the answer. `tools` is the `tools` field
/// of the caller's previous request, used when this one's bytes are the
/// same, and replaced when they are not.
pub fn request_raw<'a>(
    path: &str,
    body: &'a [u8],
    known: &Needles,
    tools: &mut Option<SeenTools>,
) -> Option<(String, RawChat<'a>, Needles)> {
    let mut found = known.clone();
    let path = query(path, &mut found).into_owned();
    // A key given twice: the whole-body parse also reads the value the
    // later one replaces (and may refuse it), so `request` decides.
    let Unique(top) = serde_json::from_slice(body).ok()?;
    let (mut messages, mut these_tools) = (None, None);
    let mut params = Map::new();
    for (k, raw) in top {
        if k == "messages" {
            messages = Some(serde_json::from_str::<Vec<&RawValue>>(raw.get()).ok()?);
            continue;
        }
        if k == "tools" {
            let t = tools_field(raw, tools)?;
            // As `entry` would have added them to `found` here.
            found.extend(&t.found);
            these_tools = Some(t.canonical);
            continue;
        }
        if !shallow(raw) {
            return None;
        }
        let mut x: Value = serde_json::from_str(raw.get()).ok()?;
        entry(&k, &mut x, &mut found);
        params.insert(k, x);
    }
    if !found.is_empty() && (found.any_in(body) || may_hide(body) || found.escaped_in(body)) {
        return None;
    }
    let model = match params.remove("model") {
        Some(Value::String(s)) => s,
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let chat = RawChat {
        model,
        tools: these_tools,
        params,
        messages: messages?,
    };
    Some((found.text(&path), chat, found))
}

/// `s` with its JSON escapes spelt as serde_json spells the character:
/// `\uXXXX` (a surrogate pair as one character) and `\/` as the plain
/// character, except `"`, `\\` and control characters, which get serde's
/// escape (`\u0022` becomes `\"`); other escapes (`\n`, `\\`, ...) are
/// kept. JSON text held in `s` stays the same JSON, one level deep, and a
/// secret spelt through escapes in it is then spelt as a needle is.
/// `None` when nothing changed.
fn plain_escapes(s: &str) -> Option<String> {
    if !may_hide(s.as_bytes()) {
        return None;
    }
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let (mut i, mut from, mut changed) = (0, 0, false);
    while i < b.len() {
        if b[i] != b'\\' || i + 1 >= b.len() {
            i += 1;
            continue;
        }
        let (decoded, len) = match b[i + 1] {
            b'/' => (Some('/'), 2),
            b'u' => escaped_char(&b[i..]),
            _ => (None, 2),
        };
        if let Some(c) = decoded {
            // The character as serde spells it (`json_spelling`): plain,
            // or for one JSON must escape serde's escape (`\"`, `\\`, `\n`,
            // `\u001f`), which `Needles::add` keeps for a secret holding one.
            let mut buf = [0u8; 4];
            let plain = c.encode_utf8(&mut buf).as_bytes();
            let spelt = json_spelling(plain).unwrap_or_else(|| plain.to_vec());
            if spelt != b[i..i + len] {
                out.push_str(&s[from..i]);
                out.push_str(&String::from_utf8_lossy(&spelt));
                from = i + len;
                changed = true;
            }
        }
        i += len;
    }
    out.push_str(&s[from..]);
    changed.then_some(out)
}

/// The character a `\uXXXX` escape at the start of `b` spells (a pair of
/// them for a character past the BMP), and the escape's length; `None`
/// (length 2, so the scan goes on past the backslash) when it spells none.
fn escaped_char(b: &[u8]) -> (Option<char>, usize) {
    let hex4 = |at: usize| -> Option<u32> {
        let h = b.get(at..at + 4)?;
        // Four hex digits, as JSON has them (`from_str_radix` would take a sign).
        h.iter()
            .try_fold(0u32, |n, d| Some(n * 16 + (*d as char).to_digit(16)?))
    };
    let Some(hi) = hex4(2) else {
        return (None, 2);
    };
    if (0xD800..0xDC00).contains(&hi) {
        if b.get(6..8) == Some(b"\\u") {
            if let Some(lo) = hex4(8).filter(|lo| (0xDC00..0xE000).contains(lo)) {
                let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                return (char::from_u32(c), 12);
            }
        }
        return (None, 6);
    }
    (char::from_u32(hi), 6)
}

/// How serde_json spells `bytes` (UTF-8) inside a JSON string: the
/// string's text without its quotes. `None` for bytes that are not UTF-8.
fn json_spelling(bytes: &[u8]) -> Option<Vec<u8>> {
    let j = serde_json::to_string(std::str::from_utf8(bytes).ok()?).ok()?;
    Some(j.as_bytes()[1..j.len() - 1].to_vec())
}

/// Whether a JSON text has an escape that can spell a secret's characters
/// otherwise than the needles do (`\u` for any character, `\/`). Without
/// one, a secret in a decoded string is in the bytes as one of its needles
/// (the rest of JSON's escapes each have the one spelling `Needles::add`
/// keeps), so searching the bytes finds every secret.
fn may_hide(json: &[u8]) -> bool {
    memchr::memmem::find(json, b"\\u").is_some() || memchr::memmem::find(json, b"\\/").is_some()
}

/// A JSON object's fields as sent, refused when a key occurs twice.
struct Unique<'a>(std::collections::BTreeMap<String, &'a RawValue>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Unique<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Fields<'a> {
            type Value = Unique<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object with distinct keys")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Unique<'a>, A::Error> {
                let mut out = std::collections::BTreeMap::new();
                while let Some((k, v)) = m.next_entry::<String, &'a RawValue>()? {
                    if out.insert(k, v).is_some() {
                        return Err(serde::de::Error::custom("a key occurs twice"));
                    }
                }
                Ok(Unique(out))
            }
        }
        d.deserialize_map(Fields(std::marker::PhantomData))
    }
}

/// The `tools` field scrubbed: `seen` when its bytes are the same, else
/// parsed, scrubbed as [`entry`] does, and kept in `seen`.
fn tools_field(raw: &RawValue, seen: &mut Option<SeenTools>) -> Option<SeenTools> {
    let hash: [u8; 32] = blake3::hash(raw.get().as_bytes()).into();
    if let Some(t) = seen.as_ref().filter(|t| t.hash == hash) {
        return Some(t.clone());
    }
    if !shallow(raw) {
        return None;
    }
    let mut x: Value = serde_json::from_str(raw.get()).ok()?;
    let mut found = Needles::new();
    entry("tools", &mut x, &mut found);
    let t = SeenTools {
        hash,
        canonical: replay::canonical_json(&x),
        found,
    };
    *seen = Some(t.clone());
    Some(t)
}

/// How deep a part of a body may nest for [`request_raw`] to take it.
/// serde_json refuses to parse a value nested deeper than 128 levels; a
/// part parsed alone starts at level 0, inside the whole body at level 2
/// (a message: the body's object, then `messages`). Parts far below the
/// limit parse the same either way; deeper ones go to [`request`], so a
/// body it refuses as too deep is never taken apart here.
pub const RAW_DEPTH_MAX: usize = 100;

/// Whether `raw` (valid JSON) nests no deeper than [`RAW_DEPTH_MAX`]
/// (brackets inside strings not counted).
pub fn shallow(raw: &RawValue) -> bool {
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    for &b in raw.get().as_bytes() {
        if in_str {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > RAW_DEPTH_MAX {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

/// The first position of `needle` in `hay` (`memchr`'s vectorised
/// substring search: a recorded request is scanned once per secret, and a
/// byte-at-a-time scan of 100+ KiB conversations was 6% of the recording
/// thread's time with 256 clients).
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    memchr::memmem::find(hay, needle)
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decodes (and `+` as a space, as forms write it).
pub fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex_val(b[i + 1]), hex_val(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// A path with its query's key-like parameters' values replaced by
/// [`REDACTED`]; each value replaced goes to `found` (as written and
/// decoded).
pub fn query<'a>(path_q: &'a str, found: &mut Needles) -> Cow<'a, str> {
    let Some((path, q)) = path_q.split_once('?') else {
        return Cow::Borrowed(path_q);
    };
    let mut changed = false;
    let parts: Vec<String> = q
        .split('&')
        .map(|p| {
            let (name, value) = p.split_once('=').unwrap_or((p, ""));
            let decoded = percent_decode(name);
            if is_secret_name(&String::from_utf8_lossy(&decoded)) && !value.is_empty() {
                found.add(value.as_bytes());
                found.add(&percent_decode(value));
                changed = true;
                format!("{name}={REDACTED}")
            } else {
                p.to_string()
            }
        })
        .collect();
    if changed {
        Cow::Owned(format!("{path}?{}", parts.join("&")))
    } else {
        Cow::Borrowed(path_q)
    }
}

/// The parts of an URL: scheme with `://`, userinfo (without `@`), and the
/// rest (host, port, path, query).
fn split_userinfo(url: &str) -> (&str, Option<&str>, &str) {
    let Some(i) = url.find("://") else {
        return ("", None, url);
    };
    let (scheme, after) = url.split_at(i + 3);
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    match after[..end].rfind('@') {
        Some(at) => (scheme, Some(&after[..at]), &after[at + 1..]),
        None => (scheme, None, after),
    }
}

/// An URL as it may be recorded or printed: no userinfo, key-like query
/// parameters redacted.
pub fn url(u: &str) -> String {
    let (scheme, _, rest) = split_userinfo(u);
    let rest = query(rest, &mut Needles::new()).into_owned();
    format!("{scheme}{rest}")
}

/// The secrets an URL carries: its password (as written and decoded), the
/// `Authorization: Basic` value an HTTP client derives from its userinfo,
/// and its key-like query parameters' values.
pub fn url_secrets(u: &str) -> Needles {
    let mut n = Needles::new();
    let (_, info, rest) = split_userinfo(u);
    if let Some(info) = info {
        let (user, pass) = info.split_once(':').unwrap_or((info, ""));
        n.add(pass.as_bytes());
        let pass_d = percent_decode(pass);
        n.add(&pass_d);
        let mut basic = percent_decode(user);
        basic.push(b':');
        basic.extend_from_slice(&pass_d);
        n.add(base64(&basic).as_bytes());
    }
    let _ = query(rest, &mut n);
    n
}

/// Standard base64 with padding (what `Authorization: Basic` uses).
pub fn base64(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let v = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(T[(v >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Replaces the values of key-like fields (strings and numbers; objects
/// and arrays are searched further) at any depth; each replaced value goes
/// to `found`. Whether anything changed.
pub fn json(v: &mut Value, found: &mut Needles) -> bool {
    match v {
        Value::Object(m) => fields(m, found),
        Value::Array(a) => a.iter_mut().fold(false, |c, x| json(x, found) | c),
        _ => false,
    }
}

/// [`json`] over an object's fields.
pub fn fields(m: &mut Map<String, Value>, found: &mut Needles) -> bool {
    m.iter_mut().fold(false, |c, (k, x)| entry(k, x, found) | c)
}

/// [`json`] over one field.
fn entry(k: &str, x: &mut Value, found: &mut Needles) -> bool {
    if is_secret_name(k) {
        let secret = match x {
            Value::String(s) if !s.is_empty() && s != REDACTED => Some(s.as_bytes().to_vec()),
            Value::Number(n) => Some(n.to_string().into_bytes()),
            _ => None,
        };
        if let Some(s) = secret {
            found.add(&s);
            *x = Value::String(REDACTED.into());
            return true;
        }
    }
    json(x, found)
}

/// The secrets a request carries in its credential headers (`Authorization`
/// values whole and without their scheme, `api-key`, `x-api-key`, cookies
/// and every header `wire::is_secret_header` names).
pub fn header_secrets<'a>(headers: impl Iterator<Item = (&'a str, &'a [u8])>) -> Needles {
    let mut n = Needles::new();
    for (k, v) in headers {
        if !super::wire::is_secret_header(k) {
            continue;
        }
        match v.iter().position(|b| *b == b' ') {
            // `Bearer <token>`: the token (what an echo would show).
            Some(i) if v.len() - i > MIN_NEEDLE => n.add(v[i + 1..].trim_ascii()),
            _ => n.add(v),
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The bug (found by review): secrets were replaced one after another,
    /// so with a secret that is the prefix of another the longer one's
    /// tail was left (`REDACTED-TAILSECRET-...`). Occurrences are now found
    /// in the text as given, in either order of the secrets.
    #[test]
    fn regression_overlapping_secrets_are_replaced_whole() {
        let short = "sk-abcdefgh";
        let long = "sk-abcdefgh-TAILSECRET-0123456789";
        for order in [[short, long], [long, short]] {
            let mut n = Needles::new();
            for s in order {
                n.add(s.as_bytes());
            }
            assert_eq!(
                n.text(&format!("x {long} y {short}.")),
                "x REDACTED y REDACTED."
            );
        }
        let mut n = Needles::new();
        n.add(b"aaaa-bbbb-cccc");
        n.add(b"cccc-dddd-eeee");
        assert_eq!(n.text("<aaaa-bbbb-cccc-dddd-eeee>"), "<REDACTED>");
        assert_eq!(n.text("no secret here"), "no secret here");
    }

    /// `plain_escapes` keeps JSON the same JSON: random values of strings
    /// drawn from quotes, backslashes, slashes, control, BMP and astral
    /// characters, serialised, then with random characters re-spelt as
    /// `\uXXXX` (pairs past the BMP) or `\/`, parse to the same value
    /// after it as before, and hold no escape it could have decoded.
    #[test]
    fn plain_escapes_keeps_json_the_same_json() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        const POOL: [char; 12] = [
            '"', '\\', '/', 'u', 's', 'k', '-', '\n', '\u{1}', 'é', '€', '😀',
        ];
        for _ in 0..5_000 {
            let text: String = (0..next(12)).map(|_| POOL[next(12) as usize]).collect();
            let v = json!({"a": text, "b": [text.clone(), 1]});
            let plain = v.to_string();
            // Re-spell some characters of the JSON text through escapes.
            let mut spelt = String::new();
            let mut in_string = false;
            let mut chars = plain.chars().peekable();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    // An escape serde wrote: copied whole (`\u0001`: six),
                    // or `\"`, `\\` and `\n` re-spelt as `\u0022`, ...
                    let e = chars.next();
                    let code = match e {
                        Some('"') => Some(0x22),
                        Some('\\') => Some(0x5c),
                        Some('n') => Some(0x0a),
                        _ => None,
                    };
                    match code {
                        Some(u) if next(2) == 0 => spelt.push_str(&format!("\\u{u:04x}")),
                        _ => {
                            spelt.push(c);
                            spelt.extend(e);
                            if e == Some('u') {
                                spelt.extend(chars.by_ref().take(4));
                            }
                        }
                    }
                    continue;
                }
                if c == '"' {
                    in_string = !in_string;
                } else if in_string && next(3) == 0 {
                    if c == '/' && next(2) == 0 {
                        spelt.push_str("\\/");
                    } else {
                        let mut units = [0u16; 2];
                        for u in c.encode_utf16(&mut units) {
                            spelt.push_str(&format!("\\u{u:04x}"));
                        }
                    }
                    continue;
                }
                spelt.push(c);
            }
            let before: Value = serde_json::from_str(&spelt).expect("re-spelt JSON parses");
            assert_eq!(before, v, "{spelt}");
            let after = plain_escapes(&spelt).unwrap_or_else(|| spelt.clone());
            let again: Value = serde_json::from_str(&after).expect("still JSON");
            assert_eq!(again, v, "{spelt} -> {after}");
            assert!(
                plain_escapes(&after).is_none(),
                "{after}: an escape left that spells a plain character"
            );
            // Independently: every escape left is one serde_json writes.
            let mut rest = after.as_str();
            while let Some(at) = rest.find('\\') {
                let esc = &rest[at..];
                let len = match esc.as_bytes().get(1) {
                    Some(b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't') => 2,
                    Some(b'u') => {
                        let code = u32::from_str_radix(&esc[2..6], 16).expect("hex");
                        assert!(
                            code < 0x20
                                && ![8, 9, 10, 12, 13].contains(&code)
                                && &esc[2..4] == "00",
                            "{after}: {} is not serde's spelling",
                            &esc[..6]
                        );
                        6
                    }
                    _ => panic!("{after}: a stray escape at {}", &esc[..2]),
                };
                rest = &rest[at + len..];
            }
        }
    }

    /// `find` against the plainest search there is, over every needle of
    /// up to 4 bytes from a 3-letter alphabet in every haystack of up to 7
    /// (overlaps, repeats, needles longer than the haystack): the
    /// vectorised search must agree at every one.
    #[test]
    fn find_agrees_with_a_window_scan_everywhere() {
        fn all(max: usize) -> Vec<Vec<u8>> {
            let mut out = vec![vec![]];
            let mut layer = vec![vec![]];
            for _ in 0..max {
                layer = layer
                    .iter()
                    .flat_map(|w: &Vec<u8>| {
                        b"abz".iter().map(move |c| [w.as_slice(), &[*c]].concat())
                    })
                    .collect();
                out.extend(layer.iter().cloned());
            }
            out
        }
        let (hays, needles) = (all(7), all(4));
        for hay in &hays {
            for n in &needles {
                let want = if n.is_empty() {
                    None
                } else {
                    hay.windows(n.len()).position(|w| w == n.as_slice())
                };
                assert_eq!(find(hay, n), want, "{hay:?} {n:?}");
            }
        }
    }

    #[test]
    fn secret_names_are_recognised_case_insensitively() {
        for n in [
            "key",
            "API_KEY",
            "ApiKey",
            "api-key",
            "Token",
            "access_token",
            "auth",
            "Authorization",
            "sig",
            "signature",
            "secret",
            "client_secret",
            "password",
            "X-Api-Key",
            "openai_key",
            "refresh_token",
            "my_secret",
        ] {
            assert!(is_secret_name(n), "{n}");
        }
        for n in [
            "model",
            "max_tokens",
            "messages",
            "stream",
            "keys",
            "author",
        ] {
            assert!(!is_secret_name(n), "{n}");
        }
    }

    #[test]
    fn query_values_are_replaced_and_collected() {
        let mut f = Needles::new();
        let q = query(
            "/v1/chat?key=abcdefgh123&model=m&API%5FKEY=s%2Fcret-value-9&sig=",
            &mut f,
        );
        assert_eq!(
            q,
            format!("/v1/chat?key={REDACTED}&model=m&API%5FKEY={REDACTED}&sig=")
        );
        let mut b = b"x abcdefgh123 y s/cret-value-9 z s%2Fcret-value-9".to_vec();
        assert!(f.mask(&mut b));
        assert_eq!(b, b"x *********** y ************** z ****************");
        assert_eq!(query("/v1/models", &mut f), "/v1/models");
    }

    #[test]
    fn userinfo_is_removed_and_its_secrets_known() {
        let u = "https://bob:pa%40ss-word-1@host:8080/v1?token=zzzzzzzzzz";
        assert_eq!(url(u), format!("https://host:8080/v1?token={REDACTED}"));
        let n = url_secrets(u);
        let basic = base64(b"bob:pa@ss-word-1");
        let text = format!("a pa@ss-word-1 b pa%40ss-word-1 c {basic} d zzzzzzzzzz");
        let t = n.text(&text);
        assert_eq!(t, "a REDACTED b REDACTED c REDACTED d REDACTED");
        assert_eq!(url("http://127.0.0.1:9/v1"), "http://127.0.0.1:9/v1");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abcd"), "YWJjZA==");
    }

    #[test]
    fn key_like_json_fields_are_replaced_at_any_depth_but_not_schemas() {
        let mut v = json!({
            "api_key": "sk-1234567890",
            "extra": {"auth": {"token": "tok-abcdefghij"}, "n": 1},
            "list": [{"client_secret": 42}],
            "tools": [{"parameters": {"properties": {"key": {"type": "string"}}}}],
            "max_tokens": 5
        });
        let mut f = Needles::new();
        assert!(json(&mut v, &mut f));
        assert_eq!(v["api_key"], REDACTED);
        assert_eq!(v["extra"]["auth"]["token"], REDACTED);
        assert_eq!(v["list"][0]["client_secret"], REDACTED);
        assert_eq!(
            v["tools"][0]["parameters"]["properties"]["key"]["type"],
            "string"
        );
        assert_eq!(v["max_tokens"], 5);
        assert_eq!(f.text("sk-1234567890 tok-abcdefghij"), "REDACTED REDACTED");
        // Idempotent: a scrubbed value is not a new secret.
        let mut again = Needles::new();
        assert!(!json(&mut v, &mut again));
        assert!(again.is_empty());
    }

    #[test]
    fn a_secret_split_across_chunks_is_masked_at_every_split() {
        // Regression: each chunk was masked alone, so a key the upstream
        // echoed across a chunk boundary reached the client whole.
        let key = "sk-live-0123456789abcdef";
        let mut n = Needles::new();
        n.add(key.as_bytes());
        let body = format!("data: {{\"error\":\"bad key {key}\"}}\n\ndata: [DONE]\n\n");
        let b = body.as_bytes();
        for i in 0..=b.len() {
            for j in i..=b.len() {
                let mut m = StreamMask::new(n.clone());
                let mut out = Vec::new();
                for part in [&b[..i], &b[i..j], &b[j..]] {
                    out.extend(m.push(part));
                }
                out.extend(m.finish());
                assert_eq!(out.len(), b.len(), "split at {i},{j}");
                assert!(find(&out, key.as_bytes()).is_none(), "split at {i},{j}");
                assert_eq!(
                    String::from_utf8_lossy(&out),
                    body.replace(key, &"*".repeat(key.len())),
                    "split at {i},{j}"
                );
            }
        }
        // Nothing is held back where no secret can start.
        let mut m = StreamMask::new(n.clone());
        assert_eq!(m.push(b"data: hello\n\n"), b"data: hello\n\n");
        assert_eq!(m.push(b"data: s"), b"data: ");
        assert_eq!(m.push(b"o\n"), b"so\n");
        // Overlapping secrets (one a prefix of the other, one ending where
        // the other starts), in either order, at every split: all masked.
        for secrets in [
            ["abcdefgh-TAILSECRET", "abcdefgh"],
            ["abcdefgh", "abcdefgh-TAILSECRET"],
            ["pw-0123456789", "0123456789-key-zz"],
        ] {
            let mut n2 = Needles::new();
            for x in secrets {
                n2.add(x.as_bytes());
            }
            let body = format!("x {} y {} z", secrets[0], secrets[1]);
            let b = body.as_bytes();
            let mut want = b.to_vec();
            n2.mask(&mut want);
            for x in secrets {
                assert!(find(&want, x.as_bytes()).is_none(), "{secrets:?}");
            }
            assert!(
                !String::from_utf8_lossy(&want).contains("TAIL"),
                "{secrets:?}"
            );
            for i in 0..=b.len() {
                let mut m = StreamMask::new(n2.clone());
                let mut out = m.push(&b[..i]);
                out.extend(m.push(&b[i..]));
                out.extend(m.finish());
                assert_eq!(out, want, "{secrets:?} split at {i}");
            }
        }
        // A body that ends inside a secret's first 8 bytes or more: masked.
        let mut m = StreamMask::new(n);
        assert_eq!(m.push(b"x sk-live-01"), b"x ");
        assert_eq!(m.finish(), b"**********");
    }

    #[test]
    fn a_secret_never_shows_in_debug_and_compares_whole() {
        let s = Secret::new("sk-very-secret-value");
        assert!(!format!("{s:?}").contains("very"));
        assert!(s.matches(b"sk-very-secret-value"));
        assert!(!s.matches(b"sk-very-secret-valu"));
        assert!(!s.matches(b""));
    }
}
