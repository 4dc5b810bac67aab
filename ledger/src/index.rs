//! The sled index: derived data that makes lookups fast.
//!
//! Everything here can be rebuilt from the segment files (`mass reindex`), so
//! the index is never the only copy of anything. All keys live in one sled tree.
//! A commit's index entries are plain inserts followed by one insert of the
//! *watermark* (the log position up to which the index is complete, with the
//! next ordinal). sled recovers a prefix of its own log after a crash, so the
//! watermark never survives without the entries before it; entries past a
//! surviving watermark are simply written again by recovery (idempotent).
//! (sled's atomic `apply_batch` forces an I/O buffer roll per call, which cost
//! an extra device write per commit.) Key layout (documented in `FORMAT.md`):
//!
//! | prefix | key rest                         | value                  |
//! |--------|----------------------------------|------------------------|
//! | `o`    | id (32)                          | [`ObjLoc`] (34 bytes)  |
//! | `r`    | ref name                         | head id (32)           |
//! | `c`    | parent id (32) + child id (32)   | empty (prev and parent links only) |
//! | `e`    | ordinal (u64 BE)                 | event id (32)          |
//! | `k`    | kind + 0x00 + ordinal (u64 BE)   | event id (32)          |
//! | `w`    | -                                | segment (u32 LE) + offset (u64 LE) + next ordinal (u64 LE) |

use std::collections::BTreeMap;
use std::sync::RwLock;

use crate::id::{Id, ObjectKind};

pub const P_OBJ: u8 = b'o';
pub const P_REF: u8 = b'r';
pub const P_CHILD: u8 = b'c';
pub const P_EVENT: u8 = b'e';
pub const P_KIND: u8 = b'k';
pub const K_WATERMARK: &[u8] = b"w";

/// Where an object's record is, plus what is needed to read it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjLoc {
    pub kind: ObjectKind,
    pub flags: u8,
    pub seg: u32,
    /// Offset of the record header in the segment.
    pub offset: u64,
    pub body_len: u32,
    pub raw_len: u32,
    pub meta_len: u32,
    /// Position of the object in the log (0-based over all objects).
    pub ordinal: u64,
}

impl ObjLoc {
    pub const LEN: usize = 34;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = self.kind as u8;
        b[1] = self.flags;
        b[2..6].copy_from_slice(&self.seg.to_le_bytes());
        b[6..14].copy_from_slice(&self.offset.to_le_bytes());
        b[14..18].copy_from_slice(&self.body_len.to_le_bytes());
        b[18..22].copy_from_slice(&self.raw_len.to_le_bytes());
        b[22..26].copy_from_slice(&self.meta_len.to_le_bytes());
        b[26..34].copy_from_slice(&self.ordinal.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<ObjLoc> {
        if b.len() != Self::LEN {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(x)
        };
        Some(ObjLoc {
            kind: ObjectKind::from_u8(b[0])?,
            flags: b[1],
            seg: u32_at(2),
            offset: u64_at(6),
            body_len: u32_at(14),
            raw_len: u32_at(18),
            meta_len: u32_at(22),
            ordinal: u64_at(26),
        })
    }
}

pub fn obj_key(id: &Id) -> [u8; 33] {
    let mut k = [0u8; 33];
    k[0] = P_OBJ;
    k[1..].copy_from_slice(&id.0);
    k
}

pub fn ref_key(name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + name.len());
    k.push(P_REF);
    k.extend_from_slice(name.as_bytes());
    k
}

pub fn child_key(parent: &Id, child: &Id) -> [u8; 65] {
    let mut k = [0u8; 65];
    k[0] = P_CHILD;
    k[1..33].copy_from_slice(&parent.0);
    k[33..].copy_from_slice(&child.0);
    k
}

pub fn event_key(ordinal: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = P_EVENT;
    k[1..].copy_from_slice(&ordinal.to_be_bytes());
    k
}

pub fn kind_prefix(kind: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + kind.len());
    k.push(P_KIND);
    k.extend_from_slice(kind.as_bytes());
    k.push(0);
    k
}

pub fn kind_key(kind: &str, ordinal: u64) -> Vec<u8> {
    let mut k = kind_prefix(kind);
    k.extend_from_slice(&ordinal.to_be_bytes());
    k
}

/// The watermark: everything before (segment, offset) is indexed, and the
/// next object gets `next_ordinal`. One value, so both move together.
pub fn encode_watermark(seg: u32, offset: u64, next_ordinal: u64) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&seg.to_le_bytes());
    b[4..12].copy_from_slice(&offset.to_le_bytes());
    b[12..20].copy_from_slice(&next_ordinal.to_le_bytes());
    b
}

pub fn decode_watermark(b: &[u8]) -> Option<(u32, u64, u64)> {
    if b.len() != 20 {
        return None;
    }
    let mut s = [0u8; 4];
    s.copy_from_slice(&b[0..4]);
    let mut o = [0u8; 8];
    o.copy_from_slice(&b[4..12]);
    let mut n = [0u8; 8];
    n.copy_from_slice(&b[12..20]);
    Some((
        u32::from_le_bytes(s),
        u64::from_le_bytes(o),
        u64::from_le_bytes(n),
    ))
}

/// Index writes gathered for one commit (or one recovery step).
#[derive(Default)]
pub struct Writes(pub Vec<(Vec<u8>, Vec<u8>)>);

impl Writes {
    pub fn insert(&mut self, k: impl AsRef<[u8]>, v: impl AsRef<[u8]>) {
        self.0.push((k.as_ref().to_vec(), v.as_ref().to_vec()));
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Applies the entries, then the watermark last.
    pub fn apply(self, idx: &Idx, seg: u32, end: u64, next_ordinal: u64) -> Result<(), String> {
        for (k, v) in self.0 {
            idx.insert(k, v)?;
        }
        idx.insert(
            K_WATERMARK.to_vec(),
            encode_watermark(seg, end, next_ordinal).to_vec(),
        )
    }
}

/// The key-value store behind the index, with the same key layout either way.
///
/// A writer keeps the index in sled (persistent, shared with nobody: sled
/// locks its directory). A reader that must not take the ledger's lock (a
/// command run while `mass run` writes, a read-only copy, a ledger with
/// damaged records) builds the same keys in memory from one scan of the
/// committed log and never writes anything.
pub enum Idx {
    Sled(sled::Tree),
    Mem(RwLock<BTreeMap<Vec<u8>, Vec<u8>>>),
}

impl Idx {
    pub fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, String> {
        match self {
            Idx::Sled(t) => t
                .get(k)
                .map(|v| v.map(|v| v.to_vec()))
                .map_err(|e| e.to_string()),
            Idx::Mem(m) => Ok(read(m)?.get(k).cloned()),
        }
    }

    pub fn contains_key(&self, k: &[u8]) -> Result<bool, String> {
        match self {
            Idx::Sled(t) => t.contains_key(k).map_err(|e| e.to_string()),
            Idx::Mem(m) => Ok(read(m)?.contains_key(k)),
        }
    }

    pub fn insert(&self, k: Vec<u8>, v: Vec<u8>) -> Result<(), String> {
        match self {
            Idx::Sled(t) => t.insert(k, v).map(|_| ()).map_err(|e| e.to_string()),
            Idx::Mem(m) => {
                m.write()
                    .map_err(|_| "index lock poisoned".to_string())?
                    .insert(k, v);
                Ok(())
            }
        }
    }

    /// Calls `f` on every entry whose key starts with `prefix`, in key order
    /// (or reversed), until `f` returns `false`.
    pub fn scan(
        &self,
        prefix: &[u8],
        reverse: bool,
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), String> {
        match self {
            Idx::Sled(t) => {
                let it = t.scan_prefix(prefix);
                let mut step = |kv: sled::Result<(sled::IVec, sled::IVec)>| match kv {
                    Ok((k, v)) => Ok(f(&k, &v)),
                    Err(e) => Err(e.to_string()),
                };
                if reverse {
                    for kv in it.rev() {
                        if !step(kv)? {
                            break;
                        }
                    }
                } else {
                    for kv in it {
                        if !step(kv)? {
                            break;
                        }
                    }
                }
                Ok(())
            }
            Idx::Mem(m) => {
                let m = read(m)?;
                let range = m
                    .range::<[u8], _>((
                        std::ops::Bound::Included(prefix),
                        std::ops::Bound::Unbounded,
                    ))
                    .take_while(|(k, _)| k.starts_with(prefix));
                if reverse {
                    let all: Vec<_> = range.collect();
                    for (k, v) in all.into_iter().rev() {
                        if !f(k, v) {
                            break;
                        }
                    }
                } else {
                    for (k, v) in range {
                        if !f(k, v) {
                            break;
                        }
                    }
                }
                Ok(())
            }
        }
    }

    pub fn flush(&self) -> Result<(), String> {
        match self {
            Idx::Sled(t) => t.flush().map(|_| ()).map_err(|e| e.to_string()),
            Idx::Mem(_) => Ok(()),
        }
    }
}

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

fn read(m: &RwLock<Map>) -> Result<std::sync::RwLockReadGuard<'_, Map>, String> {
    m.read().map_err(|_| "index lock poisoned".to_string())
}

/// An index update derived from one record (a commit, recovery or a scan).
pub(crate) enum IndexItem {
    Object {
        id: Id,
        loc: ObjLoc,
        event: Option<EventIndex>,
    },
    Ref {
        name: String,
        new: Id,
    },
}

/// What the index keeps about an event besides its location.
#[derive(Clone)]
pub(crate) struct EventIndex {
    pub kind: String,
    /// Event-to-event links (prev and parents): the children index.
    pub links: Vec<Id>,
}

impl IndexItem {
    pub(crate) fn apply(&self, batch: &mut Writes) {
        match self {
            IndexItem::Object { id, loc, event } => {
                batch.insert(&obj_key(id)[..], &loc.encode()[..]);
                if let Some(ev) = event {
                    batch.insert(&event_key(loc.ordinal)[..], &id.0[..]);
                    batch.insert(kind_key(&ev.kind, loc.ordinal), &id.0[..]);
                    for l in &ev.links {
                        batch.insert(&child_key(l, id)[..], &[][..]);
                    }
                }
            }
            IndexItem::Ref { name, new } => {
                batch.insert(ref_key(name), &new.0[..]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objloc_round_trip() {
        let l = ObjLoc {
            kind: ObjectKind::Event,
            flags: 1,
            seg: 3,
            offset: 1 << 40,
            body_len: 77,
            raw_len: 99,
            meta_len: 5,
            ordinal: 123456,
        };
        assert_eq!(ObjLoc::decode(&l.encode()), Some(l));
        assert_eq!(ObjLoc::decode(&[0; 3]), None);
    }
}
