//! Object identifiers: the BLAKE3 hash of an object's canonical encoding.
//!
//! An [`Id`] is 32 bytes, shown as 64 lowercase hex digits. The hash input is a
//! domain-separation tag naming the object kind followed by the object's
//! canonical bytes (see `FORMAT.md`), so a blob can never share an id with an
//! event or a tree even when their bytes are equal.

use std::fmt;
use std::str::FromStr;

use crate::error::LedgerError;

/// Length of an id in bytes.
pub const ID_LEN: usize = 32;

/// Shortest accepted abbreviation, in hex digits (as in git's `core.abbrev` floor).
pub const MIN_PREFIX_HEX: usize = 8;

/// The kind of a stored object. The discriminants are part of the on-disk format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    Blob = 1,
    Tree = 2,
    Event = 3,
}

impl ObjectKind {
    /// The domain-separation tag hashed before the canonical bytes.
    pub fn tag(self) -> &'static [u8] {
        match self {
            ObjectKind::Blob => b"mass.blob\0",
            ObjectKind::Tree => b"mass.tree\0",
            ObjectKind::Event => b"mass.event\0",
        }
    }

    /// The name with its indefinite article, for messages ("an event").
    pub fn with_article(self) -> &'static str {
        match self {
            ObjectKind::Blob => "a blob",
            ObjectKind::Tree => "a tree",
            ObjectKind::Event => "an event",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ObjectKind::Blob => "blob",
            ObjectKind::Tree => "tree",
            ObjectKind::Event => "event",
        }
    }

    pub(crate) fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(ObjectKind::Blob),
            2 => Some(ObjectKind::Tree),
            3 => Some(ObjectKind::Event),
            _ => None,
        }
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A content address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(pub [u8; ID_LEN]);

impl Id {
    /// Hashes `bytes` as an object of `kind`.
    pub fn of(kind: ObjectKind, bytes: &[u8]) -> Id {
        let mut h = blake3::Hasher::new();
        h.update(kind.tag());
        h.update(bytes);
        Id(*h.finalize().as_bytes())
    }

    pub fn as_bytes(&self) -> &[u8; ID_LEN] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first `n` hex digits, for display.
    pub fn short(&self, n: usize) -> String {
        let mut s = self.to_hex();
        s.truncate(n.min(64));
        s
    }

    pub fn from_slice(b: &[u8]) -> Option<Id> {
        <[u8; ID_LEN]>::try_from(b).ok().map(Id)
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Id({})", self.short(12))
    }
}

impl FromStr for Id {
    type Err = LedgerError;

    /// Parses a full 64-digit id. Abbreviations go through `Ledger::resolve`.
    fn from_str(s: &str) -> Result<Id, LedgerError> {
        let p = IdPrefix::parse(s)?;
        if p.hex.len() != 64 {
            return Err(LedgerError::MalformedId {
                input: s.to_string(),
                reason: format!("a full id has 64 hex digits, got {}", p.hex.len()),
            });
        }
        let mut out = [0u8; ID_LEN];
        hex::decode_to_slice(&p.hex, &mut out).map_err(|e| LedgerError::MalformedId {
            input: s.to_string(),
            reason: e.to_string(),
        })?;
        Ok(Id(out))
    }
}

/// A validated hex prefix of an id (8 to 64 digits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdPrefix {
    /// Lowercase hex digits.
    pub hex: String,
}

impl IdPrefix {
    pub fn parse(s: &str) -> Result<IdPrefix, LedgerError> {
        let t = s.trim();
        let bad = |reason: String| LedgerError::MalformedId {
            input: s.to_string(),
            reason,
        };
        if let Some(c) = t.chars().find(|c| !c.is_ascii_hexdigit()) {
            return Err(bad(format!("{c:?} is not a hex digit")));
        }
        if t.len() < MIN_PREFIX_HEX {
            return Err(bad(format!(
                "an id or abbreviation needs at least {MIN_PREFIX_HEX} hex digits, got {}",
                t.len()
            )));
        }
        if t.len() > 64 {
            return Err(bad(format!(
                "an id has at most 64 hex digits, got {}",
                t.len()
            )));
        }
        Ok(IdPrefix {
            hex: t.to_ascii_lowercase(),
        })
    }

    /// The whole bytes covered by the prefix (an odd final digit is checked separately).
    pub(crate) fn byte_prefix(&self) -> Vec<u8> {
        let even = self.hex.len() / 2 * 2;
        // The digits are validated hex, so decoding cannot fail.
        hex::decode(&self.hex[..even]).unwrap_or_default()
    }

    pub fn matches(&self, id: &Id) -> bool {
        id.to_hex().starts_with(&self.hex)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_separation() {
        assert_ne!(
            Id::of(ObjectKind::Blob, b"x"),
            Id::of(ObjectKind::Tree, b"x")
        );
        assert_ne!(
            Id::of(ObjectKind::Blob, b"x"),
            Id::of(ObjectKind::Event, b"x")
        );
    }

    #[test]
    fn parse_errors_say_why() {
        let e = "xyz12345".parse::<Id>().unwrap_err().to_string();
        assert!(e.contains("'x' is not a hex digit"), "{e}");
        let e = "abc".parse::<Id>().unwrap_err().to_string();
        assert!(e.contains("at least 8"), "{e}");
        let e = "abcdef0123".parse::<Id>().unwrap_err().to_string();
        assert!(e.contains("64 hex digits"), "{e}");
    }

    #[test]
    fn hex_round_trip() {
        let id = Id::of(ObjectKind::Blob, b"hello");
        assert_eq!(id.to_hex().parse::<Id>().unwrap(), id);
        assert_eq!(id.to_hex().to_uppercase().parse::<Id>().unwrap(), id);
    }
}
