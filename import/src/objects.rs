//! The objects of an import, built in memory before anything is written:
//! blobs and events with their ids, the metadata each event carries (its
//! time from the reference's files, never the import's clock) and the head
//! of every stream. `Prepared::write` (`lib.rs`) then puts them all and
//! sets every ref in one commit. Ids are computed here exactly as the ledger computes them, so
//! the planned head can be compared with an existing run before writing.

use std::collections::{BTreeMap, HashSet};

use ledger::{EventEnvelope, Id, Meta, NewEvent, ObjectKind, NOT_RECORDED, WALL_MS_FROM};
use schemas::{Hash32, Record};
use serde_json::Value;

use crate::error::{ImportError, Result};

/// The main stream's name inside events (`replay::MAIN`).
pub const MAIN: &str = "main";

/// An object to write: kind, canonical bytes, metadata (events only).
#[derive(Debug, Clone)]
pub struct Obj {
    pub kind: ObjectKind,
    pub raw: Vec<u8>,
    pub meta: Vec<u8>,
}

/// Everything one import writes.
#[derive(Debug, Default)]
pub struct Objects {
    pub objs: Vec<Obj>,
    seen: HashSet<Id>,
    /// Stream (relative name, `main` for the main stream) -> (head, seq).
    pub heads: BTreeMap<String, (Id, u64)>,
    /// The most objects this import may hold (`Caps::objects`).
    limit: u64,
}

/// The zero hash: a field the reference did not record (no checks
/// output, no judge conversation; no workspace where the run folder holds
/// none for the episode).
pub const ABSENT: Hash32 = Hash32([0; 32]);

/// When a step happened, as far as the reference's files tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// A time the reference logged (`run_status.json`, a request's
    /// `ts_start`), ms since the Unix epoch.
    Logged(u64),
    /// A file's mtime, where the reference logged no time: a stand-in, as
    /// copying or checking out the folder changes it. The event's metadata
    /// says so (`ledger::WALL_MS_FROM`), and `mass report` counts no
    /// duration that starts or ends there.
    Mtime(u64),
    /// Another step's logged time standing in for this one's, named by
    /// `from` in the event's metadata (`ledger::WALL_MS_FROM`): a request
    /// the proxy logged without `ts_start` at its episode's `started_at`.
    Borrowed(u64, &'static str),
}

impl When {
    /// The time to store as the event's `wall_ms`.
    pub fn ms(self) -> u64 {
        match self {
            When::Logged(ms) | When::Mtime(ms) | When::Borrowed(ms, _) => ms,
        }
    }

    /// Where a stand-in time came from (`ledger::WALL_MS_FROM`'s value);
    /// `None` for a logged one.
    pub fn stand_in(self) -> Option<&'static str> {
        match self {
            When::Logged(_) => None,
            When::Mtime(_) => Some("file mtime"),
            When::Borrowed(_, from) => Some(from),
        }
    }

    /// This time used for a step the reference logged no time of its own
    /// for: a logged time becomes a stand-in borrowed `from` it; a stand-in
    /// stays what it is.
    pub fn borrowed(self, from: &'static str) -> When {
        match self {
            When::Logged(ms) => When::Borrowed(ms, from),
            other => other,
        }
    }

    /// The later of two times; logged only if both are (a stand-in may
    /// lie in either direction, so the maximum is known only then; it
    /// keeps a stand-in's source). `When::Logged(0)` is the identity.
    pub fn later(self, other: When) -> When {
        let ms = self.ms().max(other.ms());
        let kind = if let When::Logged(_) = self {
            other
        } else {
            self
        };
        match kind {
            When::Logged(_) => When::Logged(ms),
            When::Mtime(_) => When::Mtime(ms),
            When::Borrowed(_, from) => When::Borrowed(ms, from),
        }
    }
}

pub fn id32(id: Id) -> Hash32 {
    Hash32(id.0)
}

impl Objects {
    /// No objects yet, at most `limit` of them.
    pub fn new(limit: u64) -> Objects {
        Objects {
            limit,
            ..Objects::default()
        }
    }

    /// Adds a blob; its id.
    pub fn blob(&mut self, bytes: &[u8]) -> Id {
        let id = Id::of(ObjectKind::Blob, bytes);
        if self.seen.insert(id) {
            self.objs.push(Obj {
                kind: ObjectKind::Blob,
                raw: bytes.to_vec(),
                meta: Vec::new(),
            });
        }
        id
    }

    /// Adds a tree (its blobs must be added first); its id.
    pub fn tree(&mut self, t: &ledger::Tree) -> Result<Id> {
        let raw = t.to_bytes()?;
        let id = Id::of(ObjectKind::Tree, &raw);
        if self.seen.insert(id) {
            self.objs.push(Obj {
                kind: ObjectKind::Tree,
                raw,
                meta: Vec::new(),
            });
        }
        Ok(id)
    }

    /// Adds the canonical JSON of `v` as a blob.
    pub fn json(&mut self, v: &Value) -> Id {
        self.blob(&replay::canonical_json(v))
    }

    /// Appends `ev` to stream `rel` at time `at` with metadata `extra` (and
    /// `WALL_MS_FROM` when `at` is a stand-in); links of the zero hash
    /// (absent fields) are left out of the event's refs, as they name
    /// nothing.
    pub fn event(
        &mut self,
        rel: &str,
        mut ev: NewEvent,
        at: When,
        mut extra: BTreeMap<String, String>,
    ) -> Result<Id> {
        // Every blob is linked from an event made soon after it, so a
        // check here bounds them all (within one event's links).
        if self.objs.len() as u64 >= self.limit {
            return Err(ImportError::TooMany {
                file: format!("stream {rel}"),
                what: "objects in the import".into(),
                cap: self.limit,
            });
        }
        ev.refs.retain(|r| r.0 != ABSENT.0);
        ev.refs.dedup();
        let (prev, seq) = match self.heads.get(rel) {
            Some(&(h, s)) => (Some(h), s + 1),
            None => (None, 0),
        };
        let env = EventEnvelope::build(rel, seq, prev, &ev);
        let raw = env.to_bytes()?;
        let id = Id::of(ObjectKind::Event, &raw);
        if let Some(from) = at.stand_in() {
            extra.insert(WALL_MS_FROM.to_string(), from.to_string());
        }
        let meta = Meta {
            wall_ms: at.ms(),
            host: String::new(),
            pid: 0,
            extra,
        };
        let meta = serde_json::to_vec(&meta).map_err(|e| ledger::LedgerError::Index {
            detail: format!("cannot encode metadata: {e}"),
        })?;
        if self.seen.insert(id) {
            self.objs.push(Obj {
                kind: ObjectKind::Event,
                raw,
                meta,
            });
        }
        self.heads.insert(rel.to_string(), (id, seq));
        Ok(id)
    }

    /// Appends a record of the schemas crate.
    pub fn record<T>(&mut self, rel: &str, r: &T, parents: Vec<Id>, at: When) -> Result<Id>
    where
        T: Record,
        T::Archived: for<'a> rkyv::bytecheck::CheckBytes<
                rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>,
            > + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
    {
        self.partial(rel, r, parents, at, &[])
    }

    /// As `record`, with `missing` the record's fields the reference does
    /// not record (their values are the schema's placeholders), listed in
    /// the metadata as `ledger::NOT_RECORDED` so readers show them as such.
    pub fn partial<T>(
        &mut self,
        rel: &str,
        r: &T,
        parents: Vec<Id>,
        at: When,
        missing: &[&str],
    ) -> Result<Id>
    where
        T: Record,
        T::Archived: for<'a> rkyv::bytecheck::CheckBytes<
                rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>,
            > + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
    {
        self.marked(rel, r, parents, at, missing, BTreeMap::new())
    }

    /// As `partial`, with more metadata `extra` (a rollout's stand-in
    /// tree, `ledger::TREE_FROM`).
    pub fn marked<T>(
        &mut self,
        rel: &str,
        r: &T,
        parents: Vec<Id>,
        at: When,
        missing: &[&str],
        mut extra: BTreeMap<String, String>,
    ) -> Result<Id>
    where
        T: Record,
        T::Archived: for<'a> rkyv::bytecheck::CheckBytes<
                rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>,
            > + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
    {
        let ev = schemas::to_event(r)
            .map_err(|e| ledger::LedgerError::Index {
                detail: format!("cannot encode {}: {e}", T::KIND),
            })?
            .with_parents(parents);
        if !missing.is_empty() {
            extra.insert(NOT_RECORDED.to_string(), missing.join(","));
        }
        self.event(rel, ev, at, extra)
    }

    /// The head of stream `rel`.
    pub fn head(&self, rel: &str) -> Option<Id> {
        self.heads.get(rel).map(|&(h, _)| h)
    }
}

/// Parses `YYYY-MM-DDTHH:MM:SSZ` (what `date -u` writes in
/// `run_status.json`) to ms since the Unix epoch; `None` for anything
/// else, a year outside 1970-9999 included.
pub fn iso_ms(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (d, t) = s.split_once('T')?;
    let mut d = d.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = t.split(':').map(|x| x.parse::<f64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    // Ranges first: a hostile year (99999999999999999) would overflow the
    // day count below.
    if !(1970..=9999).contains(&y)
        || !(1..=12).contains(&m)
        || !(1..=31).contains(&day)
        || !(0.0..24.0).contains(&hh)
        || !(0.0..60.0).contains(&mm)
        || !(0.0..61.0).contains(&ss)
    {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = days as f64 * 86400.0 + hh * 3600.0 + mm * 60.0 + ss;
    (secs >= 0.0).then_some((secs * 1000.0) as u64)
}

/// Seconds as a float (the proxy's `ts_start`) to ms.
pub fn secs_ms(v: Option<&Value>) -> Option<u64> {
    let s = v?.as_f64()?;
    (s.is_finite() && s >= 0.0).then_some((s * 1000.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::When;

    /// The latest of several times is logged only when all of them are: a
    /// stand-in may be earlier or later than the truth.
    #[test]
    fn a_later_time_is_logged_only_when_both_are() {
        let (l, m) = (When::Logged(5), When::Mtime(9));
        assert_eq!(l.later(When::Logged(7)), When::Logged(7));
        assert_eq!(l.later(m), When::Mtime(9));
        assert_eq!(m.later(l), When::Mtime(9));
        assert_eq!(When::Logged(9).later(When::Mtime(5)), When::Mtime(9));
        assert_eq!(When::Logged(0).later(m), m);
        assert_eq!(When::Logged(0).later(l), l);
        let b = When::Logged(3).borrowed("episode start");
        assert_eq!(b, When::Borrowed(3, "episode start"));
        assert_eq!(m.borrowed("episode start"), m, "a stand-in stays one");
        assert_eq!(l.later(b), When::Borrowed(5, "episode start"));
        assert_eq!(b.stand_in(), Some("episode start"));
        assert_eq!(l.stand_in(), None);
    }
}
