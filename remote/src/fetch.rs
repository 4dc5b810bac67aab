//! On-demand fetching for a partial ledger (a lazy clone or pull): the
//! [`ledger::Promisor`] that hands the ledger a blob or tree it lacks,
//! downloaded from the remote the ledger was pulled from. The remote's
//! indexes are loaded at the first miss (from the index cache when it has
//! them) and each frame is downloaded once per process; every frame is
//! checked against its index and every object against its id, as a pull
//! checks them. Fetched objects live in the ledger's memory only: nothing is
//! written, so read-only commands stay read-only.

use std::path::PathBuf;
use std::sync::Mutex;

use ledger::{Id, ObjectKind};

use crate::pull::{fetch_frames, FrameCache, PullReport};
use crate::{pack, Indexes, Quiet, Remote};

struct Opened {
    remote: Remote,
    idx: Indexes,
    frames: FrameCache,
}

/// Fetches absent objects from the remote at `url`.
pub struct Fetcher {
    url: String,
    cache: Option<PathBuf>,
    state: Mutex<Option<Opened>>,
}

impl Fetcher {
    pub fn new(url: &str, cache: Option<PathBuf>) -> Fetcher {
        Fetcher {
            url: url.to_string(),
            cache,
            state: Mutex::new(None),
        }
    }

    fn opened(&self) -> crate::Result<std::sync::MutexGuard<'_, Option<Opened>>> {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let remote = Remote::open(&self.url, self.cache.as_deref())?;
            remote.require_marker()?;
            let idx = remote.indexes(&Quiet)?;
            *guard = Some(Opened {
                remote,
                idx,
                frames: FrameCache::new(),
            });
        }
        Ok(guard)
    }

    fn fetch_here(&self, id: &Id) -> crate::Result<Option<(ObjectKind, Vec<u8>)>> {
        let mut guard = self.opened()?;
        let Some(st) = guard.as_mut() else {
            return Ok(None);
        };
        let Some((key, p, e)) = st.idx.find(id) else {
            return Ok(None);
        };
        let (key, p, e) = (key.to_string(), p.clone(), e.clone());
        let shown = format!("{}/{key}", st.remote.location());
        if !st.frames.contains_key(&(key.clone(), e.frame)) {
            let mut report = PullReport::default();
            fetch_frames(
                &st.remote,
                &key,
                &shown,
                &p,
                &[e.frame],
                &mut st.frames,
                &mut report,
            )?;
        }
        let Some(raw) = st.frames.get(&(key, e.frame)) else {
            return Ok(None);
        };
        let (bytes, _) = pack::extract(&shown, &e, raw, true)?;
        Ok(Some((e.kind, bytes)))
    }
}

impl ledger::Promisor for Fetcher {
    fn fetch(&self, id: &Id) -> std::result::Result<Option<(ObjectKind, Vec<u8>)>, String> {
        // On a thread of its own: the store's runtime must not be entered
        // from a task of another runtime (replay and the engine run some
        // reads inside tokio).
        std::thread::scope(|s| {
            s.spawn(|| {
                self.fetch_here(id)
                    .map_err(|e| format!("{} ({})", e, self.url))
            })
            .join()
            .unwrap_or_else(|_| Err("the fetch panicked".into()))
        })
    }

    fn resolve(&self, hex_prefix: &str, limit: usize) -> Vec<Id> {
        let found = std::thread::scope(|s| {
            s.spawn(|| -> crate::Result<Vec<Id>> {
                let guard = self.opened()?;
                let Some(st) = guard.as_ref() else {
                    return Ok(Vec::new());
                };
                let mut out: Vec<Id> = st
                    .idx
                    .packs
                    .iter()
                    .flat_map(|(_, p)| p.entries.iter())
                    .filter(|e| {
                        e.kind != ObjectKind::Event && e.id.to_hex().starts_with(hex_prefix)
                    })
                    .map(|e| e.id)
                    .collect();
                out.sort();
                out.dedup();
                out.truncate(limit);
                Ok(out)
            })
            .join()
        });
        match found {
            Ok(Ok(ids)) => ids,
            _ => Vec::new(),
        }
    }
}
