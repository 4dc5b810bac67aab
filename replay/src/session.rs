//! A [`Session`]: one run being driven, in one mode, over one ledger.
//!
//! Runs are namespaces of refs: the main stream of run `R` is the ref `R`, and a
//! stream named `a/b` is the ref `R/a/b`. Event envelopes carry the stream's
//! *relative* name (`main`, `a/b`), never the run name, so the same decisions
//! produce the same ids in any run: recording a seeded driver twice, under two
//! names, yields identical ids.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use ledger::{Id, Ledger};

use crate::effect::Served;
use crate::error::{ReplayError, Result};
use crate::stream::Stream;

/// The relative name of a run's main stream.
pub const MAIN: &str = "main";

/// The relative name of a run's `execution` stream: how the run is
/// executed (`run.execution`), which no step depends on. A fork takes the
/// source's whole, from wherever it forks.
pub const EXECUTION: &str = "execution";

/// How a session treats the recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Serve the run's own history (strictly: any difference is a divergence),
    /// then perform effects live and append. Recording, resuming and running a
    /// fork are all this mode.
    Live,
    /// Re-run the driver over the run's own history and compare every event id;
    /// never perform anything live, never append.
    Check,
}

/// A second run to take effect results from (mixed mode): once a stream is past
/// its own history, and while it is an exact prefix of the source's same
/// stream, an effect whose kind is not in `live_kinds` and that the source
/// recorded at that position is served from the source instead of being
/// performed. Re-judging = source run with rollouts, live `judge` calls.
#[derive(Debug, Clone)]
pub struct SourceRun {
    pub run: String,
    pub live_kinds: BTreeSet<String>,
    /// The head of every stream of the source (by relative name) when the
    /// mixed run began: the source by id, whatever its refs do later. `None`
    /// only for a re-judge recorded by an older build, which named its
    /// source by ref alone.
    pub heads: Option<BTreeMap<String, Id>>,
}

impl SourceRun {
    /// Run `run` as it stands now, pinned by its streams' heads. Fails with
    /// `NoSuchRef` when it has no stream at all.
    pub fn pinned(ledger: &Ledger, run: &str, live_kinds: BTreeSet<String>) -> Result<SourceRun> {
        let prefix = format!("{run}/");
        let mut heads = BTreeMap::new();
        for (name, head) in crate::remove::run_refs(ledger, run)? {
            let rel = if name == run {
                MAIN.to_string()
            } else {
                match name.strip_prefix(&prefix) {
                    Some(r) => r.to_string(),
                    None => continue,
                }
            };
            heads.insert(rel, head);
        }
        if heads.is_empty() {
            return Err(ReplayError::Ledger(ledger::LedgerError::NoSuchRef {
                name: run.to_string(),
            }));
        }
        Ok(SourceRun {
            run: run.to_string(),
            live_kinds,
            heads: Some(heads),
        })
    }

    /// The head stream `rel` of the source had (`None`: no such stream).
    pub fn head(&self, ledger: &Ledger, rel: &str) -> Result<Option<Id>> {
        match &self.heads {
            Some(h) => Ok(h.get(rel).copied()),
            None => Ok(ledger.head(&ref_name(&self.run, rel))?),
        }
    }
}

/// A clock, injectable so tests can be deterministic.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

pub(crate) struct Inner {
    pub ledger: Arc<Ledger>,
    pub run: String,
    pub mode: Mode,
    pub source: Option<SourceRun>,
    pub seed: Mutex<u64>,
    pub clock: Clock,
    pub counts: Mutex<BTreeMap<(String, Served), u64>>,
    /// Per stream opened: how many of its recorded events the session went
    /// past (its furthest position), and how many it had.
    pub visited: Mutex<BTreeMap<String, (u64, u64)>>,
}

/// Cheap to clone; share one per run between tasks.
#[derive(Clone)]
pub struct Session {
    pub(crate) inner: Arc<Inner>,
}

impl Session {
    pub fn new(ledger: Arc<Ledger>, run: impl Into<String>, mode: Mode) -> Result<Session> {
        let run = run.into();
        ledger::check_ref_name(&run)?;
        // A session reads much of its run at random (histories, effect
        // outputs): keep every location in memory rather than ask the index.
        ledger.preload_locations()?;
        Ok(Session {
            inner: Arc::new(Inner {
                ledger,
                run,
                mode,
                source: None,
                seed: Mutex::new(0),
                clock: Arc::new(|| {
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis() as u64)
                        .unwrap_or(0)
                }),
                counts: Mutex::new(BTreeMap::new()),
                visited: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// Adds a mixed-mode source run (see [`SourceRun`]).
    pub fn with_source(self, source: SourceRun) -> Session {
        self.rebuild(|i| i.source = Some(source))
    }

    pub fn with_clock(self, clock: Clock) -> Session {
        self.rebuild(|i| i.clock = clock)
    }

    fn rebuild(self, f: impl FnOnce(&mut Inner)) -> Session {
        let old = Arc::try_unwrap(self.inner).unwrap_or_else(|arc| Inner {
            ledger: arc.ledger.clone(),
            run: arc.run.clone(),
            mode: arc.mode.clone(),
            source: arc.source.clone(),
            seed: Mutex::new(*arc.seed.lock().unwrap_or_else(|p| p.into_inner())),
            clock: arc.clock.clone(),
            counts: Mutex::new(BTreeMap::new()),
            visited: Mutex::new(BTreeMap::new()),
        });
        let mut inner = old;
        f(&mut inner);
        Session {
            inner: Arc::new(inner),
        }
    }

    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.inner.ledger
    }

    pub fn run(&self) -> &str {
        &self.inner.run
    }

    pub fn mode(&self) -> &Mode {
        &self.inner.mode
    }

    /// The mixed-mode source run, if this session has one.
    pub fn source(&self) -> Option<&SourceRun> {
        self.inner.source.as_ref()
    }

    /// Sets the root seed (the driver reads it from the run's first event).
    pub fn set_seed(&self, seed: u64) {
        *self.inner.seed.lock().unwrap_or_else(|p| p.into_inner()) = seed;
    }

    pub fn seed(&self) -> u64 {
        *self.inner.seed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A seed for `purpose` in `stream`, derived from the root seed (pure).
    pub fn derive_seed(&self, stream: &str, purpose: &str) -> u64 {
        crate::seed::derive(self.seed(), stream, purpose)
    }

    /// The ref that holds stream `rel` of this run.
    pub fn ref_name(&self, rel: &str) -> String {
        ref_name(&self.inner.run, rel)
    }

    /// Opens stream `rel` (`main` for the run's main stream), loading its history.
    pub fn stream(&self, rel: &str) -> Result<Stream> {
        Stream::open(self.clone(), rel)
    }

    /// How many effects of each kind were served from history, from the source
    /// run, or performed live.
    pub fn counts(&self) -> BTreeMap<(String, Served), u64> {
        self.inner
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every stream this session opened, with how far into its recorded
    /// history it went and how long that history was (`mass replay
    /// --check` requires every stream of the run to be reproduced to its
    /// end).
    pub fn visited(&self) -> BTreeMap<String, (u64, u64)> {
        self.inner
            .visited
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn note_visit(&self, rel: &str, reached: u64, recorded: u64) {
        let mut v = self.inner.visited.lock().unwrap_or_else(|p| p.into_inner());
        let e = v.entry(rel.to_string()).or_insert((0, recorded));
        e.0 = e.0.max(reached.min(recorded));
        e.1 = e.1.max(recorded);
    }

    pub(crate) fn count(&self, kind: &str, how: Served) {
        *self
            .inner
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((kind.to_string(), how))
            .or_default() += 1;
    }
}

/// The ref of stream `rel` in run `run`.
pub fn ref_name(run: &str, rel: &str) -> String {
    if rel == MAIN {
        run.to_string()
    } else {
        format!("{run}/{rel}")
    }
}
