//! `remote`: ledgers on object stores. A run recorded on one machine is
//! pushed to S3 (or an S3-compatible server), GCS, Azure or a folder and
//! pulled or cloned on another, the way git moves commits.
//!
//! What travels is objects (blobs, trees, events with their metadata) in
//! immutable, content-addressed [packs](pack) with sorted indexes, written
//! with create-if-absent, and one [run record](refs) per run moved by
//! compare-and-swap. A push finds what the remote lacks from its indexes
//! (never by listing objects), uploads packs first and records last, and
//! refuses to move a run the remote holds further than this ledger does; a
//! pull reads what a run reaches from the indexes, fetches just the frames
//! holding it, checks every frame and object against its hash, and lands
//! objects and refs in one ledger commit. Either, killed at any moment,
//! leaves both sides consistent (a pack nothing names is harmless and is
//! reused), and running it again completes.
//!
//! The byte layouts are in `ledger/FORMAT.md` ("Remotes").

pub mod config;
pub mod error;
mod fetch;
pub mod pack;
mod pull;
mod push;
pub mod refs;
pub mod store;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use ledger::Id;

pub use config::Remotes;
pub use error::{RemoteError, Result};
pub use fetch::Fetcher;
pub use pack::PackIndex;
pub use pull::{pull, pull_heads, pull_with, HeadCheck, PullReport, RefChange};
pub use push::{push, push_objects, PushReport};
pub use refs::RunRecord;
pub use store::{Store, Version};

/// The file that makes a location a mass remote.
pub const MARKER_KEY: &str = "MASS-REMOTE";
pub const MARKER: &[u8] = b"mass-remote 1\n";

/// Progress of a long transfer, one line at a time.
pub trait Progress {
    fn line(&self, msg: &str);
}

/// Says nothing.
pub struct Quiet;

impl Progress for Quiet {
    fn line(&self, _msg: &str) {}
}

/// Test-only switches, each turning one protection off (all `false`, the
/// default, is the only setting `mass` uses), so the tests that prove a
/// guarantee can show they fail without it.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unprotected {
    /// Run records are overwritten without comparing versions.
    pub unconditional_refs: bool,
    /// Pulled frames, pack headers and objects are not checked against
    /// their hashes.
    pub unchecked_frames: bool,
}

/// An opened remote with the local cache of its pack indexes.
pub struct Remote {
    store: Store,
    cache: Option<PathBuf>,
    #[doc(hidden)]
    pub unprotected: Unprotected,
}

/// Every pack index on a remote, and where each object is.
pub struct Indexes {
    pub packs: Vec<(String, PackIndex)>,
    at: HashMap<Id, (u32, u32)>,
}

impl Indexes {
    /// The pack (its key and index) and entry holding `id`.
    pub fn find(&self, id: &Id) -> Option<(&str, &PackIndex, &pack::Entry)> {
        let (p, e) = *self.at.get(id)?;
        let (key, idx) = &self.packs[p as usize];
        Some((key.as_str(), idx, &idx.entries[e as usize]))
    }

    pub fn contains(&self, id: &Id) -> bool {
        self.at.contains_key(id)
    }

    pub fn objects(&self) -> usize {
        self.at.len()
    }
}

impl Remote {
    /// Opens `url`; pack indexes read from it are cached under `cache`, in
    /// a folder of this location's own (they are immutable and checked
    /// again on every load).
    pub fn open(url: &str, cache: Option<&Path>) -> Result<Remote> {
        Ok(Remote {
            store: Store::open(url)?,
            // One cache per location: an index is only trusted for the
            // remote it was read from (another could serve a crafted index
            // under the same pack name).
            cache: cache.map(|c| c.join(&blake3::hash(url.as_bytes()).to_hex()[..16])),
            unprotected: Unprotected::default(),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn location(&self) -> &str {
        self.store.location()
    }

    /// Fails unless the location holds the mass remote marker.
    pub fn require_marker(&self) -> Result<()> {
        match self.store.get(MARKER_KEY)? {
            Some((b, _)) if b.as_ref() == MARKER => Ok(()),
            Some(_) => Err(RemoteError::NotARemote {
                location: self.location().to_string(),
                hint: format!(" of this version (its {MARKER_KEY} says something else)"),
            }),
            None => Err(RemoteError::NotARemote {
                location: self.location().to_string(),
                hint: " (nothing was pushed there yet, or the URL is wrong)".into(),
            }),
        }
    }

    /// Makes the location a mass remote if it is empty; fails if it holds
    /// anything else.
    pub fn ensure_marker(&self) -> Result<()> {
        if self.store.get(MARKER_KEY)?.is_some() {
            return self.require_marker();
        }
        let other: Vec<String> = self
            .store
            .list("")?
            .into_iter()
            // A folder's lock, and temporary files a killed first push
            // left, are not someone else's data.
            .filter(|k| k != "LOCK" && !k.contains(".tmp-"))
            .take(3)
            .collect();
        if !other.is_empty() {
            // Another process may have marked it since we looked (two
            // workers starting at once on an empty location).
            if self.store.get(MARKER_KEY)?.is_some() {
                return self.require_marker();
            }
            return Err(RemoteError::NotARemote {
                location: self.location().to_string(),
                hint: format!(
                    ", and it is not empty (it holds {}): push to an empty location or an existing remote",
                    other.join(", ")
                ),
            });
        }
        self.store.create(MARKER_KEY, Bytes::from_static(MARKER))?;
        self.require_marker()
    }

    /// The runs the remote holds records for, sorted.
    pub fn runs(&self) -> Result<Vec<String>> {
        Ok(self
            .store
            .list("refs")?
            .into_iter()
            .filter_map(|k| refs::decode_name(k.strip_prefix("refs/")?.strip_suffix(".ref")?))
            .collect())
    }

    /// A run's record and the version to swap it against, if it has one.
    pub fn read_run(&self, run: &str) -> Result<Option<(RunRecord, Version, String)>> {
        let key = refs::record_key(run);
        let Some((bytes, version)) = self.store.get(&key)? else {
            return Ok(None);
        };
        let rec = RunRecord::parse(&format!("{}/{key}", self.location()), run, &bytes)?;
        Ok(Some((
            rec,
            version,
            blake3::hash(&bytes).to_hex().to_string(),
        )))
    }

    /// Loads every pack index (from the cache when it has it).
    pub fn indexes(&self, progress: &dyn Progress) -> Result<Indexes> {
        let listed = self.store.list("packs")?;
        let packs_there: std::collections::HashSet<&str> = listed
            .iter()
            .filter_map(|k| k.strip_suffix(".pack"))
            .collect();
        // An index whose pack is gone (deleted, lost) describes nothing the
        // remote holds: a push uploads those objects again, a pull says
        // which ref names an object no pack holds.
        let names: Vec<String> = listed
            .iter()
            .filter(|k| {
                k.strip_suffix(".idx")
                    .is_some_and(|p| packs_there.contains(p))
            })
            .cloned()
            .collect();
        let mut packs = Vec::with_capacity(names.len());
        let mut at = HashMap::new();
        for (i, key) in names.iter().enumerate() {
            let idx = self.load_index(key)?;
            for (e, entry) in idx.entries.iter().enumerate() {
                at.entry(entry.id).or_insert((i as u32, e as u32));
            }
            let pack_key = format!("{}.pack", key.trim_end_matches(".idx"));
            packs.push((pack_key, idx));
            if (i + 1) % 50 == 0 {
                progress.line(&format!("read {} of {} pack indexes", i + 1, names.len()));
            }
        }
        Ok(Indexes { packs, at })
    }

    fn load_index(&self, key: &str) -> Result<PackIndex> {
        let shown = format!("{}/{key}", self.location());
        let name = key
            .strip_prefix("packs/")
            .and_then(|k| k.strip_suffix(".idx"))
            .and_then(|h| hex::decode(h).ok())
            .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
            .ok_or_else(|| RemoteError::Corrupt {
                key: shown.clone(),
                detail: "a pack index must be named packs/<64 hex digits>.idx".into(),
            })?;
        let cached = self
            .cache
            .as_ref()
            .map(|c| c.join(format!("{}.idx", hex::encode(name))));
        if let Some(bytes) = cached.as_ref().and_then(|p| std::fs::read(p).ok()) {
            if let Ok(idx) = PackIndex::parse(&shown, &name, &bytes) {
                return Ok(idx);
            }
        }
        let (bytes, _) = self.store.get(key)?.ok_or_else(|| RemoteError::Corrupt {
            key: shown.clone(),
            detail: "listed but gone when read".into(),
        })?;
        let idx = PackIndex::parse(&shown, &name, &bytes)?;
        if let Some(p) = cached {
            config::write_cache(&p, &bytes);
        }
        Ok(idx)
    }
}
