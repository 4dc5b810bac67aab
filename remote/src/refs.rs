//! Run records: what a remote says a run's refs point at.
//!
//! One JSON file per run, `refs/RUN.ref`, holds the heads of the run's main
//! ref and every ref under `RUN/`, a version counting its updates and the
//! BLAKE3 of the record it replaced. It moves only by compare-and-swap
//! against the version read before (`If-Match` on the ETag), so of two
//! machines pushing the same run one wins and the other is told, and no
//! update is lost. Each record is also kept, immutable and named by its
//! BLAKE3, under `history/RUN/`, written before the swap: the chain of
//! `previous` hashes from the current record is the run's push history.

use std::collections::BTreeMap;

use ledger::Id;
use serde::{Deserialize, Serialize};

use crate::error::{RemoteError, Result};

pub const RECORD_FORMAT: &str = "mass-remote-ref 1";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub format: String,
    pub run: String,
    /// 1 for the first push, then one more per update.
    pub version: u64,
    /// Ref name to head id (hex), the run's main ref and every ref under it.
    pub heads: BTreeMap<String, String>,
    /// BLAKE3 (hex) of the record this one replaced (`history/RUN/HASH.ref`).
    pub previous: Option<String>,
}

pub fn record_key(run: &str) -> String {
    format!("refs/{}.ref", encode_name(run))
}

pub fn history_key(run: &str, hash: &str) -> String {
    format!("history/{}/{hash}.ref", encode_name(run))
}

/// A run name as a key: bytes other than `A-Z a-z 0-9 . _ -` and `/` are
/// written `=XX` (hex), so every store (and a folder) sees the same plain
/// ASCII key and `object_store` has nothing to escape.
pub fn encode_name(run: &str) -> String {
    let mut out = String::with_capacity(run.len());
    for b in run.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
    out
}

/// The run name a key part encodes, if it is a valid encoding.
pub fn decode_name(key: &str) -> Option<String> {
    let b = key.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'=' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether ref `name` belongs to run `run`.
pub fn in_run(run: &str, name: &str) -> bool {
    name == run
        || name
            .strip_prefix(run)
            .is_some_and(|rest| rest.starts_with('/'))
}

impl RunRecord {
    /// Parses and checks a record read from `key`.
    pub fn parse(key: &str, run: &str, bytes: &[u8]) -> Result<RunRecord> {
        let bad = |detail: String| RemoteError::Corrupt {
            key: key.to_string(),
            detail,
        };
        let rec: RunRecord =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a run record: {e}")))?;
        if rec.format != RECORD_FORMAT {
            return Err(bad(format!(
                "format {:?}; this build reads {RECORD_FORMAT:?}",
                rec.format
            )));
        }
        if rec.run != run {
            return Err(bad(format!("the record is for run {:?}", rec.run)));
        }
        for (name, head) in &rec.heads {
            ledger::check_ref_name(name).map_err(|e| bad(e.to_string()))?;
            if !in_run(run, name) {
                return Err(bad(format!("ref {name:?} is not part of run {run:?}")));
            }
            parse_id(head)
                .ok_or_else(|| bad(format!("ref {name:?} has head {head:?}, not a 64-digit id")))?;
        }
        Ok(rec)
    }

    /// The heads as ids (checked by `parse`).
    pub fn head_ids(&self) -> Vec<(String, Id)> {
        self.heads
            .iter()
            .filter_map(|(n, h)| parse_id(h).map(|id| (n.clone(), id)))
            .collect()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

pub fn parse_id(hex_id: &str) -> Option<Id> {
    if hex_id.len() != 64 {
        return None;
    }
    let bytes = hex::decode(hex_id).ok()?;
    Id::from_slice(&bytes)
}
