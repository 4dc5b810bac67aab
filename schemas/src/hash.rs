//! [`Hash32`]: an object id inside a record, shown as hex in JSON views.

use std::fmt;

/// 32 bytes naming a ledger object. Kept separate from `ledger::Id` so records
/// archive with plain rkyv derives.
#[derive(
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
)]
pub struct Hash32(pub [u8; 32]);

impl From<ledger::Id> for Hash32 {
    fn from(id: ledger::Id) -> Self {
        Hash32(id.0)
    }
}

impl From<Hash32> for ledger::Id {
    fn from(h: Hash32) -> Self {
        ledger::Id(h.0)
    }
}

impl fmt::Debug for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", &hex::encode(self.0)[..12])
    }
}

impl fmt::Display for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl serde::Serialize for Hash32 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}
