//! The [`Ledger`]: opening, locking, recovery, batched durable commits and reads.
//!
//! Write path (numbered as in ARCHITECTURE.md):
//! 1. A [`Batch`] collects objects and ref updates in memory; ids are computed
//!    from canonical bytes as they are added.
//! 2. `commit`, holding no lock, skips objects the durable log is seen to
//!    hold and encodes the rest as records (zstd, blob and tree deltas).
//! 3. Under the writer lock it checks every ref update against the current
//!    head (compare-and-swap) and every link against the index, the batch
//!    and the groups not yet durable, and appends its records to the open
//!    *group* in memory. Later commits validate against it from now on;
//!    readers do not see it yet.
//! 4. With the lock released it waits until its group is durable. One waiter
//!    at a time leads: it seals the open group with one commit marker (new
//!    commits start the next group), writes it to the active segment in one
//!    write and fsyncs it. Only now are the group's commits durable; a crash
//!    before this point leaves a tail that the next open lists (with a copy
//!    in `quarantine/`), leaves in place and writes past. A failed write or fsync fails the group and every later
//!    one, and stops the writer.
//! 5. The leader publishes the group: the in-memory index (memtable) takes
//!    its entries and readers' heads move; then it wakes the waiters. The
//!    memtable becomes an index table file every `index::FLUSH_OBJECTS`
//!    objects and at close; after a crash, recovery re-indexes the committed
//!    records past the last table.
//! 6. `commit` returns: the batch is acknowledged.
//!
//! Two ways to open: [`Ledger::open`] takes the ledger's lock, recovers and
//! may write; [`Ledger::open_read_only`] takes no lock, changes nothing, and
//! reads the committed prefix of the log into an in-memory index, so it works
//! while another process writes, on a read-only copy, and past damage.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::{LedgerError, Result};
use crate::files::{self, AppendFile, FileLayer, OsFiles};
use crate::id::{Id, IdPrefix, ObjectKind};
use crate::index::{self, EventIndex, Index, IndexItem, ObjLoc, Pos};
use crate::object::{check_ref_name, Event, EventEnvelope, Meta, NewEvent, RefUpdate, DELETED};
use crate::open::{self, Watermark};
use crate::recovery::Damage;
use crate::segment::{
    self, PreRecord, RecordHeader, RecordType, Salt, FLAG_ZSTD, RECORD_HEADER_LEN,
    SEGMENT_HEADER_LEN,
};
use crate::tree::{self, Tree, TreeEntry};

pub(crate) const SEGMENTS_DIR: &str = "segments";
pub(crate) const INDEX_DIR: &str = "index";
/// Bytes set aside by recovery or repair; never deleted by `mass`.
pub const QUARANTINE_DIR: &str = "quarantine";

/// Tuning knobs; the defaults suit both tests and real runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Start a new segment once the active one exceeds this many bytes.
    pub segment_max: u64,
    /// zstd level for tree bodies.
    pub zstd_level: i32,
    /// zstd level for event bodies: small and many, so a fast level (at
    /// level 3, building entropy tables for each ~1 KiB body was a third of
    /// a group commit's CPU time; -1 made group commits ~35% faster).
    pub event_zstd_level: i32,
    /// zstd level for blobs (file contents, messages) of at least
    /// `small_blob` bytes: written once, read often, and the bulk of a
    /// ledger's bytes.
    pub blob_zstd_level: i32,
    /// zstd level for blobs from `tiny_blob` up to `small_blob`: the longer
    /// messages and tool results of a model call. Below 16 KiB zstd
    /// uses its small-input parameters, where level 9 (a binary-tree match
    /// finder) took 2.2-2.5x the CPU of level 6 for output within 0.5%
    /// (1, 4 and 16 KiB pieces of source and prose; at 64 KiB the gap is
    /// 1.6%, so larger blobs keep `blob_zstd_level`).
    pub small_blob_zstd_level: i32,
    /// Blobs from `tiny_blob` up to this size (exclusive) use
    /// `small_blob_zstd_level`.
    pub small_blob: usize,
    /// zstd level for blobs shorter than `tiny_blob`: a model call's
    /// request, reply, message and raw body, and most tool results, a few
    /// hundred bytes each. At those sizes level 3 took 0.44-0.64x the CPU of
    /// level 6 for output within 2% (256 B to 1 KiB pieces of this
    /// repository's prose and source, and request and reply blobs, through
    /// the `zstd` crate with a reused context; `zstd -b` read 0.63-0.69x).
    /// From 2 KiB level 6 saved 1.7-6% for 2.5-3.5x the CPU (2 to 16 KiB
    /// pieces), a trade kept for the larger blobs.
    pub tiny_blob_zstd_level: i32,
    /// Blobs shorter than this use `tiny_blob_zstd_level`.
    pub tiny_blob: usize,
    /// Bodies shorter than this are stored as they are.
    pub compress_min: usize,
    /// The file layer every write goes through (tests substitute one that
    /// simulates power loss).
    pub files: Arc<dyn FileLayer>,
    /// Test-only: protections switched off, so a test can show that its
    /// attack succeeds without them. Never set outside tests.
    #[doc(hidden)]
    pub unprotected: Unprotected,
}

/// Test-only switches, each turning one protection off (all `false`, the
/// default, is the only setting `mass` uses). A test that proves a guarantee
/// runs its attack with the protection on and off, and shows that it fails
/// only for the right reason.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unprotected {
    /// Record checks neither keyed with the ledger's salt nor bound to the
    /// record's position (format 1's checks).
    pub unkeyed_checks: bool,
    /// Index tables, `damaged.jsonl` and quarantine copies written without
    /// fsync, and old tables removed before a merged one is durable.
    pub no_durable_derived: bool,
    /// The writer publishes no watermark, and lock-free readers ignore a
    /// live writer's.
    pub no_reader_watermark: bool,
    /// Index tables, the watermark and segment headers are not taken as
    /// evidence of what was committed.
    pub no_evidence: bool,
    /// Dedup trusts a delta's record without checking its base.
    pub no_chain_dedup: bool,
    /// Deltas against one base are unbounded.
    pub no_delta_bound: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            segment_max: 256 << 20,
            zstd_level: 3,
            event_zstd_level: -1,
            blob_zstd_level: 9,
            small_blob_zstd_level: 6,
            small_blob: 16 << 10,
            tiny_blob_zstd_level: 3,
            tiny_blob: 1 << 10,
            compress_min: 128,
            files: Arc::new(OsFiles),
            unprotected: Unprotected::default(),
        }
    }
}

/// A position in the log: (segment, byte offset).
pub(crate) type LogEnd = (u32, u64);

/// What the ledger knows about a ref's head without reading the event again.
#[derive(Debug, Clone)]
struct HeadInfo {
    id: Id,
    stream: String,
    seq: u64,
}

/// The writer's state, under `Ledger::writer`. Commits validate against it
/// and join its open group; the leader seals that group here, writes and
/// syncs it with no lock held, then publishes it here.
struct Writer {
    /// The group commits are joining; the next leader writes it.
    group: Group,
    /// The ordinal the next object written gets (ahead of the index by the
    /// objects of groups not yet durable).
    next_ordinal: u64,
    /// Every ref's head including groups not yet durable: what
    /// compare-and-swap checks, so a commit sees earlier unsynced ones.
    heads: HashMap<String, Id>,
    /// Stream and seq of recently appended heads (durable or not), to build
    /// the next event cheaply.
    head_info: HashMap<String, HeadInfo>,
    /// Objects of groups not yet durable: their kind and group. Link checks
    /// and dedup consult this besides the index, which holds only durable
    /// objects.
    unsynced: HashMap<Id, (ObjectKind, u64)>,
    /// Every ref's head at `durable_end`: what readers see. Ordered, so a
    /// run's refs are a range (`refs_under`), not a sort of every ref.
    durable_heads: BTreeMap<String, Id>,
    /// Refs moved by groups not yet durable: the last such group.
    moving: HashMap<String, u64>,
    /// The end of the last durable (and published) group.
    durable_end: LogEnd,
    /// Set when a write or fsync failed: the file's state is unknown, so no further
    /// commit is attempted in this process (reopening recovers a valid prefix).
    poisoned: Option<String>,
}

/// Commits that will be written with one commit marker, one `write` and one
/// `fdatasync`: on disk they are one batch (FORMAT.md's commit rule), so a
/// crash keeps all of them or none.
struct Group {
    /// Groups are numbered from 1 in the order they are written.
    no: u64,
    /// Where the group will be written (decided when the previous group was
    /// sealed, so offsets are known as commits join).
    seg: u32,
    base: u64,
    /// The joined commits' records, in order (the marker is added when sealed).
    buf: Vec<u8>,
    records: u32,
    items: Vec<IndexItem>,
    /// The ordinal after the group's last object.
    end_ordinal: u64,
    commits: u32,
    /// For the first group of a new segment: the committed end of the
    /// segment before (the new segment's header records it).
    prev_end: Option<u64>,
}

impl Group {
    /// An empty group starting at `off` of segment `seg`, or at the start of
    /// the next segment when that one is full.
    fn at(no: u64, seg: u32, off: u64, ordinal: u64, segment_max: u64) -> Group {
        let (seg, base, prev_end) = if off >= segment_max {
            (seg + 1, SEGMENT_HEADER_LEN, Some(off))
        } else {
            (seg, off, None)
        };
        Group {
            no,
            seg,
            base,
            buf: Vec::new(),
            records: 0,
            items: Vec::new(),
            end_ordinal: ordinal,
            commits: 0,
            prev_end,
        }
    }
}

/// Who leads, and how far the log is durable; waiters sleep on
/// `Ledger::synced`. Lock order: `writer` before `sync`, never the reverse.
#[derive(Default)]
struct SyncState {
    /// Every group up to this number is durable and published.
    durable: u64,
    /// A committer is writing and syncing a group.
    leading: bool,
    /// The group whose write or sync failed: it and every later group fail.
    failed: Option<Failure>,
    /// Tasks awaiting a [`Durability`], woken when a leader ends.
    wakers: Vec<std::task::Waker>,
}

/// Why a group failed, kept so that every committer waiting on it gets the error.
#[derive(Debug, Clone)]
struct Failure {
    path: Option<PathBuf>,
    kind: std::io::ErrorKind,
    message: String,
}

impl Failure {
    fn of(e: &LedgerError) -> Failure {
        match e {
            LedgerError::Io { path, source } => Failure {
                path: Some(path.clone()),
                kind: source.kind(),
                message: source.to_string(),
            },
            other => Failure {
                path: None,
                kind: std::io::ErrorKind::Other,
                message: other.to_string(),
            },
        }
    }

    fn error(&self) -> LedgerError {
        match &self.path {
            Some(p) => LedgerError::io(p, std::io::Error::new(self.kind, self.message.clone())),
            None => LedgerError::Index {
                detail: format!(
                    "a group commit failed ({}); reopen the ledger",
                    self.message
                ),
            },
        }
    }
}

/// The segment being appended to; only the leader touches it.
struct Active {
    seg_no: u32,
    /// `None` when opened read-only.
    file: Option<Box<dyn AppendFile>>,
}

/// The last tree stored plainly: the delta base for the next trees, which
/// are mostly the same entries (18 snapshots of one workspace share ~all),
/// and how many deltas were stored against it (a base serves at most
/// `segment::MAX_DELTA_GENERATION`).
struct TreeBaseInner {
    id: Id,
    raw: Vec<u8>,
    deltas: std::sync::atomic::AtomicU16,
}
type TreeBase = Arc<TreeBaseInner>;

/// An open ledger. Cheap to share between threads (`&Ledger` is `Sync`).
pub struct Ledger {
    dir: PathBuf,
    seg_dir: PathBuf,
    idx: Index,
    /// The key of every record check (FORMAT.md).
    salt: Salt,
    writer: Mutex<Writer>,
    sync: Mutex<SyncState>,
    /// Signalled when a group becomes durable or fails.
    synced: Condvar,
    active: Mutex<Active>,
    tree_base: Mutex<Option<TreeBase>>,
    /// zstd compression contexts by level, shared by committing threads
    /// (creating one per object was costly).
    cctx: Mutex<Vec<(i32, zstd::bulk::Compressor<'static>)>>,
    readers: Mutex<HashMap<u32, Arc<File>>>,
    /// Every object's location, when preloaded (see `preload_locations`).
    locs: std::sync::RwLock<Option<HashMap<Id, ObjLoc>>>,
    opts: Options,
    read_only: bool,
    recovery: RecoveryReport,
    /// Every damaged range known at open (listed before, or found then):
    /// a read of an object one of them claims says "damaged", not "not
    /// found".
    damaged: Vec<Damage>,
    /// The writer's published durable end (readers stop there).
    watermark: Option<Watermark>,
    /// Where blobs and trees this ledger lacks come from (a lazy clone's
    /// remote), with what it has handed over so far.
    promisor: std::sync::RwLock<Option<Arc<dyn Promisor>>>,
    promised: Mutex<HashMap<Id, Handed>>,
    /// This open ledger's number among this process's ([`Unsettled`]).
    instance: u64,
    _lock: Option<File>,
}

/// An object a promisor handed over: its kind and canonical bytes.
type Handed = (ObjectKind, Arc<Vec<u8>>);

/// The source of objects a partial ledger (a lazy clone) does not hold:
/// reads of an absent blob or tree ask it, check what it returns against
/// the id and keep it in memory for the ledger's lifetime. Nothing it
/// returns is written to the log.
pub trait Promisor: Send + Sync {
    /// The object's kind and canonical bytes, `Ok(None)` if the source does
    /// not have it either, `Err` (a message) if it could not be asked.
    fn fetch(&self, id: &Id) -> std::result::Result<Option<(ObjectKind, Vec<u8>)>, String>;

    /// Blobs and trees the source holds whose id starts with `hex` (an
    /// abbreviation the ledger could not resolve); at most `limit`.
    fn resolve(&self, _hex: &str, _limit: usize) -> Vec<Id> {
        Vec::new()
    }
}

/// Bytes a writer found after the last commit marker of a segment, listed
/// and copied into `quarantine/`, and left where they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAside {
    pub segment: u32,
    pub offset: u64,
    pub len: u64,
    /// The quarantine copy of the bytes, relative to the ledger.
    pub file: PathBuf,
}

/// What opening found and did. Nothing in it is ever silent: the CLI prints
/// every field that is not empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Records indexed because the index had not caught up with the log.
    pub reindexed_records: u64,
    /// Bytes after the last commit marker that nothing durable shows were
    /// committed (not known to have been acknowledged): listed in
    /// `quarantine/damaged.jsonl`, copied into `quarantine/`, left in the
    /// segment, and stepped over by every scan.
    pub tails: Vec<SetAside>,
    /// The writer went on in this new segment (after a tail, or a last
    /// segment whose header has no intact copy).
    pub new_segment: Option<u32>,
    /// Index tables that could not be used (damaged, or left over), with
    /// the reason; their range was scanned instead.
    pub index_rebuilt: Option<String>,
    /// Damaged ranges found that were not listed before. A writer, `reindex`
    /// and `repair` list them (with copies); a read-only open only reports.
    pub damage: Vec<Damage>,
    /// Listed ranges met again, stepped over.
    pub known_damage: u64,
    /// Read-only opens: the log holds less than durable evidence shows it
    /// did (a segment was cut or deleted: acknowledged data is missing). A
    /// writer refuses to open instead ([`LedgerError::LogBehindIndex`]).
    pub log_behind_index: Option<String>,
    /// Read-only opens: bytes at the end of the log past the last commit
    /// marker (a torn tail the next writer will list); not read.
    pub unread_tail: u64,
}

impl RecoveryReport {
    /// Bytes of tails the writer listed and stepped over.
    pub fn tail_bytes(&self) -> u64 {
        self.tails.iter().map(|s| s.len).sum()
    }
}

impl Ledger {
    /// Creates a new, empty ledger in `dir` (which may exist but must be empty).
    pub fn init(dir: &Path) -> Result<Ledger> {
        Self::init_with(dir, Options::default())
    }

    pub fn init_with(dir: &Path, opts: Options) -> Result<Ledger> {
        if dir.join(open::FORMAT_FILE).exists() {
            return Err(LedgerError::AlreadyExists {
                path: dir.to_path_buf(),
            });
        }
        if let Ok(mut rd) = fs::read_dir(dir) {
            if rd.next().is_some() && !interrupted_init(dir) {
                return Err(LedgerError::AlreadyExists {
                    path: dir.to_path_buf(),
                });
            }
        }
        let files = opts.files.as_ref();
        let seg_dir = dir.join(SEGMENTS_DIR);
        files
            .create_dir_all(&seg_dir)
            .and_then(|_| files.sync_dir(dir))
            .map_err(|e| LedgerError::io(&seg_dir, e))?;
        let salt = Salt::random().map_err(|e| LedgerError::io("/dev/urandom", e))?;
        // An interrupted init may have left a header-only segment 1.
        let first = segment::segment_path(&seg_dir, 1);
        if first.exists() {
            files
                .remove_file(&first)
                .map_err(|e| LedgerError::io(&first, e))?;
        }
        crate::startup::create_segment(files, &seg_dir, 1, &salt, 0)?;
        // FORMAT is written last: a crash during init leaves no half-made ledger
        // that `open` would accept.
        let fmt = dir.join(open::FORMAT_FILE);
        files::write_durably(files, &fmt, open::format_text(&salt).as_bytes())
            .map_err(|e| LedgerError::io(&fmt, e))?;
        Self::open_with(dir, opts)
    }

    /// Opens an existing ledger, taking the process lock and recovering after a crash.
    pub fn open(dir: &Path) -> Result<Ledger> {
        Self::open_with(dir, Options::default())
    }

    pub fn open_with(dir: &Path, opts: Options) -> Result<Ledger> {
        Self::open_inner(dir, opts, false).map(|(l, _)| l)
    }

    /// Opens and reports what recovery did.
    pub fn open_reporting(dir: &Path) -> Result<(Ledger, RecoveryReport)> {
        Self::open_inner(dir, Options::default(), false)
    }

    /// [`Ledger::open_reporting`] with options.
    pub fn open_reporting_with(dir: &Path, opts: Options) -> Result<(Ledger, RecoveryReport)> {
        Self::open_inner(dir, opts, false)
    }

    /// Opens without the lock, changing nothing: the committed log as it
    /// is now, indexed in memory. Works while another process writes (it
    /// stops at the writer's published durable end, so it never returns what
    /// was not yet durable), on a read-only copy, and past damaged records
    /// (reported in [`Ledger::recovery`]; their objects are not found).
    /// Commits are refused.
    pub fn open_read_only(dir: &Path) -> Result<Ledger> {
        Self::open_read_only_with(dir, Options::default())
    }

    /// [`Ledger::open_read_only`] with options.
    pub fn open_read_only_with(dir: &Path, opts: Options) -> Result<Ledger> {
        let (idx, report, salt) = crate::startup::reader(dir, &opts)?;
        let end = idx.end();
        Self::assemble(dir, idx, salt, None, end.seg, end.off, report, opts)
    }

    /// Throws the index away and rebuilds it from the segment files. The new
    /// index is built beside the old one and replaces it only when complete,
    /// so a refused or killed rebuild leaves the old index as it was. Damage
    /// is stepped over, listed and reported, as by `repair`; a log that
    /// holds less than the old index proved is refused.
    pub fn reindex(dir: &Path) -> Result<(Ledger, RecoveryReport)> {
        Self::open_inner(dir, Options::default(), true)
    }

    /// Rebuilds the index stepping over damaged records: every intact record
    /// is kept, each damaged range is copied into `quarantine/`, listed in
    /// `quarantine/damaged.jsonl` and reported. No segment byte changes.
    pub fn repair(dir: &Path) -> Result<(Ledger, RecoveryReport)> {
        Self::open_inner(dir, Options::default(), true)
    }

    /// [`Ledger::repair`] with options.
    pub fn repair_with(dir: &Path, opts: Options) -> Result<(Ledger, RecoveryReport)> {
        Self::open_inner(dir, opts, true)
    }

    /// What opening found and did.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// True when opened with [`Ledger::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn open_inner(dir: &Path, opts: Options, rebuild: bool) -> Result<(Ledger, RecoveryReport)> {
        let fmt_salt = open::check_format(dir)?;
        let lock = open::take_lock(dir)?;
        let opened = crate::startup::writer(dir, &opts, fmt_salt, rebuild)?;
        let report = opened.report.clone();
        let mut ledger = Self::assemble(
            dir,
            opened.idx,
            opened.salt,
            Some(opened.file),
            opened.seg,
            opened.offset,
            report.clone(),
            opts,
        )?;
        ledger.watermark = Some(opened.watermark);
        ledger._lock = Some(lock);
        ledger.publish_watermark(opened.seg, opened.offset);
        Ok((ledger, report))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        dir: &Path,
        idx: Index,
        salt: Salt,
        file: Option<Box<dyn AppendFile>>,
        seg_no: u32,
        offset: u64,
        recovery: RecoveryReport,
        opts: Options,
    ) -> Result<Ledger> {
        let next_ordinal = idx.end().ordinal;
        let heads: HashMap<String, Id> = idx.refs().into_iter().collect();
        let read_only = file.is_none();
        let mut damaged = open::read_damaged(dir).unwrap_or_default();
        damaged.extend(recovery.damage.iter().cloned());
        Ok(Ledger {
            dir: dir.to_path_buf(),
            seg_dir: dir.join(SEGMENTS_DIR),
            idx,
            salt,
            writer: Mutex::new(Writer {
                group: Group::at(1, seg_no, offset, next_ordinal, opts.segment_max),
                next_ordinal,
                heads: heads.clone(),
                head_info: HashMap::new(),
                unsynced: HashMap::new(),
                durable_heads: heads.into_iter().collect(),
                moving: HashMap::new(),
                durable_end: (seg_no, offset),
                poisoned: None,
            }),
            sync: Mutex::new(SyncState::default()),
            synced: Condvar::new(),
            active: Mutex::new(Active { seg_no, file }),
            tree_base: Mutex::new(None),
            cctx: Mutex::new(Vec::new()),
            readers: Mutex::new(HashMap::new()),
            locs: std::sync::RwLock::new(None),
            opts,
            read_only,
            recovery,
            damaged,
            watermark: None,
            promisor: std::sync::RwLock::new(None),
            promised: Mutex::new(HashMap::new()),
            instance: INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            _lock: None,
        })
    }

    /// Tells lock-free readers the log is durable up to `seg`/`off`. A
    /// failure only makes readers see less (and is not an error: the data
    /// is durable either way).
    fn publish_watermark(&self, seg: u32, off: u64) {
        if self.opts.unprotected.no_reader_watermark {
            return;
        }
        if let Some(w) = &self.watermark {
            let _ = w.publish(seg, off);
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Starts a batch: everything in it becomes durable and visible atomically.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            ledger: self,
            objects: Vec::new(),
            in_batch: HashSet::new(),
            ref_updates: Vec::new(),
            heads: HashMap::new(),
            absent_ok: false,
            raw_events: Vec::new(),
            chains_as_recorded: false,
        }
    }

    /// Makes this a partial ledger's reader: blobs and trees it lacks are
    /// asked of `p` (see [`Promisor`]).
    pub fn set_promisor(&self, p: Arc<dyn Promisor>) {
        if let Ok(mut g) = self.promisor.write() {
            *g = Some(p);
        }
    }

    /// Whether a promisor is set: the ledger may lack blobs and trees its
    /// events and trees link to.
    pub fn is_partial(&self) -> bool {
        self.promisor.read().is_ok_and(|g| g.is_some())
    }

    /// An absent blob or tree from the promisor, checked against its id.
    fn promised(
        &self,
        id: &Id,
        want: Option<ObjectKind>,
    ) -> Result<Option<(ObjectKind, Arc<Vec<u8>>)>> {
        if want == Some(ObjectKind::Event) {
            return Ok(None); // a partial ledger holds every event
        }
        if let Some(hit) = self.promised.lock().ok().and_then(|m| m.get(id).cloned()) {
            return Ok(Some(hit));
        }
        let Some(p) = self.promisor.read().ok().and_then(|g| g.clone()) else {
            return Ok(None);
        };
        let Some((kind, raw)) = p
            .fetch(id)
            .map_err(|detail| LedgerError::Promisor { id: *id, detail })?
        else {
            return Ok(None);
        };
        if kind == ObjectKind::Event || want.is_some_and(|w| w != kind) || Id::of(kind, &raw) != *id
        {
            return Err(LedgerError::Promisor {
                id: *id,
                detail: format!(
                    "it returned {} whose bytes are not that object",
                    kind.with_article()
                ),
            });
        }
        let got = (kind, Arc::new(raw));
        if let Ok(mut m) = self.promised.lock() {
            m.insert(*id, got.clone());
        }
        Ok(Some(got))
    }

    /// Stores one blob durably.
    pub fn put_blob(&self, bytes: &[u8]) -> Result<Id> {
        let mut b = self.batch();
        let id = b.put_blob(bytes)?;
        b.commit()?;
        Ok(id)
    }

    /// Stores one tree durably (its blobs must already be stored).
    pub fn put_tree(&self, t: &Tree) -> Result<Id> {
        let mut b = self.batch();
        let id = b.put_tree(t)?;
        b.commit()?;
        Ok(id)
    }

    /// Appends one event to `ref_name` if its head is `expected`; durable on return.
    pub fn append(&self, ref_name: &str, expected: Option<Id>, ev: NewEvent) -> Result<Id> {
        let mut b = self.batch();
        let id = b.append(ref_name, expected, ev)?;
        b.commit()?;
        Ok(id)
    }

    /// Creates ref `name` at an existing event (a fork); the ref must not exist.
    pub fn fork(&self, name: &str, at: Id) -> Result<()> {
        self.set_ref(name, None, at)
    }

    /// Moves `name` from `expected` to `new` (compare-and-swap), durably.
    pub fn set_ref(&self, name: &str, expected: Option<Id>, new: Id) -> Result<()> {
        let mut b = self.batch();
        b.set_ref(name, expected, new)?;
        b.commit()
    }

    /// Deletes ref `name` if its head is `expected` (compare-and-swap),
    /// durably. Only the name goes: every object stays stored and readable.
    pub fn delete_ref(&self, name: &str, expected: Id) -> Result<()> {
        let mut b = self.batch();
        b.delete_ref(name, expected)?;
        b.commit()
    }

    /// The current head of a ref: as of the last durable commit (a commit
    /// still waiting for its `fdatasync` is not visible yet).
    pub fn head(&self, name: &str) -> Result<Option<Id>> {
        Ok(self.lock_writer()?.durable_heads.get(name).copied())
    }

    /// All refs, sorted by name.
    pub fn refs(&self) -> Result<Vec<(String, Id)>> {
        Ok(self
            .lock_writer()?
            .durable_heads
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect())
    }

    /// The refs whose names start with `prefix` (a run's streams: `RUN/`),
    /// sorted by name: [`Ledger::refs`] without copying and sorting every
    /// other ref of the ledger.
    pub fn refs_under(&self, prefix: &str) -> Result<Vec<(String, Id)>> {
        Ok(self
            .lock_writer()?
            .durable_heads
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), *v))
            .collect())
    }

    fn lock_writer(&self) -> Result<MutexGuard<'_, Writer>> {
        self.writer.lock().map_err(|_| LedgerError::Index {
            detail: "writer lock poisoned by a panicking thread".into(),
        })
    }

    /// Where an object is, if present.
    pub fn locate(&self, id: &Id) -> Result<Option<ObjLoc>> {
        if let Ok(guard) = self.locs.read() {
            if let Some(l) = guard.as_ref().and_then(|m| m.get(id)) {
                return Ok(Some(*l));
            }
        }
        Ok(self.idx.get(id))
    }

    pub fn contains(&self, id: &Id) -> Result<bool> {
        if let Ok(guard) = self.locs.read() {
            if guard.as_ref().is_some_and(|m| m.contains_key(id)) {
                return Ok(true);
            }
        }
        Ok(self.idx.get(id).is_some())
    }

    /// True if the log holds an intact record for `id` where the index says
    /// (the whole record read back, its keyed checks verified) and, for a
    /// delta, an intact record of its base too. Dedup asks this, never the
    /// index alone, so an index entry the log does not back (damage, or a
    /// delta whose base is damaged) cannot turn a write into a no-op: the
    /// object is written again and the index points to the new copy.
    fn backed(&self, id: &Id) -> Result<bool> {
        let Some(loc) = self.locate(id)? else {
            return Ok(false);
        };
        let Some(rec) = self.record_of(id, &loc)? else {
            return Ok(false);
        };
        if self.opts.unprotected.no_chain_dedup {
            return Ok(true);
        }
        match segment::dict_of(id, rec.header.flags, &rec.body) {
            Ok(None) => Ok(true),
            Ok(Some(base)) => match self.locate(&base)? {
                Some(bl) if bl.kind == loc.kind && bl.flags & segment::FLAG_DICT == 0 => {
                    Ok(self.record_of(&base, &bl)?.is_some())
                }
                _ => Ok(false),
            },
            Err(_) => Ok(false),
        }
    }

    /// The intact record of `id` at `loc`, or `None` when the bytes there
    /// are not that record.
    fn record_of(&self, id: &Id, loc: &ObjLoc) -> Result<Option<segment::ScannedRecord>> {
        let f = self.reader(loc.seg)?;
        let total = (RECORD_HEADER_LEN + segment::RECORD_TRAILER_LEN) as u64
            + loc.body_len as u64
            + loc.meta_len as u64;
        Ok(
            match segment::read_record_at(
                &f,
                &self.seg_dir,
                loc.seg,
                &self.salt,
                loc.offset,
                total,
            )? {
                Ok(rec)
                    if rec.header.id == *id && rec.header.rtype == RecordType::Object(loc.kind) =>
                {
                    Some(rec)
                }
                _ => None,
            },
        )
    }

    /// Where an object is; an error saying why if it is not readable
    /// (`Corruption` for a damaged record a reader stepped over).
    /// Where `id` is; for an object a partial ledger leaves on its remote,
    /// a location in no segment (`seg == u32::MAX`) once the remote gave it.
    pub fn require(&self, id: &Id) -> Result<ObjLoc> {
        if let Some(l) = self.locate(id)? {
            return Ok(l);
        }
        match self.promised(id, None)? {
            Some((kind, raw)) => Ok(ObjLoc::promised(kind, raw.len())),
            None => Err(self.missing(id)),
        }
    }

    pub fn kind_of(&self, id: &Id) -> Result<Option<ObjectKind>> {
        match self.locate(id)? {
            Some(l) => Ok(Some(l.kind)),
            None => Ok(self.promised(id, None)?.map(|(k, _)| k)),
        }
    }

    fn reader(&self, seg: u32) -> Result<Arc<File>> {
        let mut r = self.readers.lock().map_err(|_| LedgerError::Index {
            detail: "reader cache lock poisoned".into(),
        })?;
        if let Some(f) = r.get(&seg) {
            return Ok(f.clone());
        }
        let p = segment::segment_path(&self.seg_dir, seg);
        let f = Arc::new(File::open(&p).map_err(|e| LedgerError::io(&p, e))?);
        r.insert(seg, f.clone());
        Ok(f)
    }

    /// The error for an id the index does not know: `Corruption` if a damaged
    /// record the scan stepped over claims it (so a reader says "damaged",
    /// not "no such object"), `NotFound` otherwise.
    fn missing(&self, id: &Id) -> LedgerError {
        let hex = id.to_hex();
        match self
            .damaged
            .iter()
            .find(|d| d.claimed_id.as_deref() == Some(hex.as_str()))
        {
            Some(d) => LedgerError::Corruption {
                id: *id,
                detail: format!(
                    "its record in segment {} at byte {} is damaged ({}); listed in quarantine/damaged.jsonl",
                    d.segment, d.offset, d.reason
                ),
            },
            None => LedgerError::NotFound { prefix: hex },
        }
    }

    /// Reads, decompresses and hash-checks an object's canonical bytes.
    fn read_verified(&self, id: &Id, want: Option<ObjectKind>) -> Result<(ObjLoc, Vec<u8>)> {
        let Some(loc) = self.locate(id)? else {
            return match self.promised(id, want)? {
                Some((kind, raw)) => Ok((ObjLoc::promised(kind, raw.len()), raw.as_ref().clone())),
                None => Err(self.missing(id)),
            };
        };
        if let Some(w) = want {
            if loc.kind != w {
                return Err(LedgerError::WrongKind {
                    id: *id,
                    expected: w,
                    actual: loc.kind,
                });
            }
        }
        let f = self.reader(loc.seg)?;
        let mut buf = vec![0u8; RECORD_HEADER_LEN + loc.body_len as usize];
        let corrupt = |detail: String| LedgerError::Corruption { id: *id, detail };
        f.read_exact_at(&mut buf, loc.offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                corrupt(format!(
                    "record at segment {} offset {} is cut short",
                    loc.seg, loc.offset
                ))
            } else {
                LedgerError::io(segment::segment_path(&self.seg_dir, loc.seg), e)
            }
        })?;
        if self
            .salt
            .header_check(loc.seg, loc.offset, &buf[..segment::HEADER_CHECK_AT])
            != buf[segment::HEADER_CHECK_AT..RECORD_HEADER_LEN]
        {
            return Err(corrupt(format!(
                "record header at segment {} offset {} fails its check",
                loc.seg, loc.offset
            )));
        }
        let h = RecordHeader::decode(&buf).map_err(|r| corrupt(format!("record header: {r}")))?;
        if h.id != *id
            || h.rtype != RecordType::Object(loc.kind)
            || h.body_len != loc.body_len
            || h.raw_len != loc.raw_len
            || h.flags != loc.flags
        {
            return Err(corrupt(format!(
                "record header at segment {} offset {} does not match the index",
                loc.seg, loc.offset
            )));
        }
        let body = &buf[RECORD_HEADER_LEN..];
        let raw = match segment::dict_of(id, h.flags, body)? {
            None => segment::decode_body(id, h.flags, h.raw_len, body)?,
            Some(dict) => {
                // Dictionaries are always stored plainly: one extra read at most.
                let (_, dict_raw) = self
                    .read_plain(&dict, loc.kind)
                    .map_err(|e| corrupt(format!("its delta base {}: {e}", dict.short(12))))?;
                segment::decode_body_with_dict(id, h.raw_len, body, &dict_raw)?
            }
        };
        let actual = Id::of(loc.kind, &raw);
        if actual != *id {
            return Err(corrupt(format!("content hashes to {actual}")));
        }
        Ok((loc, raw))
    }

    /// Reads an object that must not itself be a delta (a delta's base).
    fn read_plain(&self, id: &Id, kind: ObjectKind) -> Result<(ObjLoc, Vec<u8>)> {
        let loc = self.locate(id)?.ok_or_else(|| self.missing(id))?;
        if loc.flags & segment::FLAG_DICT != 0 || loc.kind != kind {
            return Err(LedgerError::Corruption {
                id: *id,
                detail: "a delta base must be a plainly stored object of the same kind".into(),
            });
        }
        self.read_verified(id, Some(kind))
    }

    /// The canonical bytes of any object, verified.
    pub fn raw_object(&self, id: &Id) -> Result<(ObjectKind, Vec<u8>)> {
        let (loc, raw) = self.read_verified(id, None)?;
        Ok((loc.kind, raw))
    }

    pub fn get_blob(&self, id: &Id) -> Result<Vec<u8>> {
        Ok(self.read_verified(id, Some(ObjectKind::Blob))?.1)
    }

    pub fn get_tree(&self, id: &Id) -> Result<Tree> {
        let raw = self.read_verified(id, Some(ObjectKind::Tree))?.1;
        Tree::from_bytes(id, &raw)
    }

    pub fn get_event(&self, id: &Id) -> Result<Event> {
        let raw = self.read_verified(id, Some(ObjectKind::Event))?.1;
        Ok(Event::from_envelope(
            *id,
            EventEnvelope::from_bytes(id, &raw)?,
        ))
    }

    /// The unhashed metadata stored beside an object.
    pub fn get_meta(&self, id: &Id) -> Result<Meta> {
        let loc = self.locate(id)?.ok_or_else(|| self.missing(id))?;
        if loc.meta_len == 0 {
            return Ok(Meta::default());
        }
        // The whole record is read so its checksum (which covers the
        // metadata; the id covers only the body) can be checked.
        let f = self.reader(loc.seg)?;
        let total = (RECORD_HEADER_LEN + segment::RECORD_TRAILER_LEN) as u64
            + loc.body_len as u64
            + loc.meta_len as u64;
        let rec =
            segment::read_record_at(&f, &self.seg_dir, loc.seg, &self.salt, loc.offset, total)?
                .map_err(|reason| LedgerError::Corruption {
                    id: *id,
                    detail: format!("metadata record in segment {}: {reason}", loc.seg),
                })?;
        if rec.header.id != *id {
            return Err(LedgerError::Corruption {
                id: *id,
                detail: format!(
                    "the record at segment {} byte {} is not this object",
                    loc.seg, loc.offset
                ),
            });
        }
        serde_json::from_slice(&rec.meta).map_err(|e| LedgerError::Corruption {
            id: *id,
            detail: format!("metadata is not valid JSON: {e}"),
        })
    }

    /// Expands an abbreviated id (at least 8 hex digits) to the one object it names.
    pub fn resolve(&self, prefix: &str) -> Result<Id> {
        let p = IdPrefix::parse(prefix)?;
        let found: Vec<Id> = self
            .idx
            .with_prefix(&p.byte_prefix(), 11)
            .into_iter()
            .filter(|id| p.matches(id))
            .collect();
        match found.len() {
            0 => {
                // A damaged record the scan stepped over may claim it.
                let claimed: Vec<Id> = self
                    .damaged
                    .iter()
                    .filter_map(|d| d.claimed_id.as_deref()?.parse::<Id>().ok())
                    .filter(|id| p.matches(id))
                    .collect();
                match claimed.as_slice() {
                    [id] => Ok(*id),
                    _ => self.resolve_promised(p),
                }
            }
            1 => Ok(found[0]),
            _ => Err(LedgerError::Ambiguous {
                prefix: p.hex,
                candidates: found,
            }),
        }
    }

    /// An abbreviation of an object a partial ledger leaves on its remote.
    fn resolve_promised(&self, p: IdPrefix) -> Result<Id> {
        let source = self.promisor.read().ok().and_then(|g| g.clone());
        let found: Vec<Id> = source
            .map(|s| s.resolve(&p.hex, 11))
            .unwrap_or_default()
            .into_iter()
            .filter(|id| p.matches(id))
            .collect();
        match found.len() {
            0 => Err(LedgerError::NotFound { prefix: p.hex }),
            1 => Ok(found[0]),
            _ => Err(LedgerError::Ambiguous {
                prefix: p.hex,
                candidates: found,
            }),
        }
    }

    /// Events that link to `id`, in log order: as their `prev` (the next
    /// event of a stream), as a parent, or as a ref (a record's links to
    /// rollouts, trees, blobs). An index lookup, not a scan: what audits
    /// walk backwards ("which judgments name this rollout").
    pub fn referrers(&self, id: &Id) -> Result<Vec<Id>> {
        // In log order, by the ordinal the index keeps beside each link (a
        // lookup of each referrer's location was most of the cost). An id
        // listed more than once (stored again after its record was damaged:
        // an older table still lists the damaged copy) takes its newest
        // ordinal, the copy `locate` and every read use.
        let mut with_ord = self.idx.referrers(id);
        with_ord.sort_unstable_by_key(|&(ord, c)| (c, std::cmp::Reverse(ord)));
        for i in 1..with_ord.len() {
            if with_ord[i].1 == with_ord[i - 1].1 {
                with_ord[i].0 = with_ord[i - 1].0;
            }
        }
        with_ord.sort_unstable();
        Ok(with_ord.into_iter().map(|(_, c)| c).collect())
    }

    /// Event ids newest first, optionally of one kind.
    pub fn events_newest_first(&self, kind: Option<&str>, limit: usize) -> Result<Vec<Id>> {
        Ok(self.idx.events_newest_first(kind, limit))
    }

    /// Walks a stream backwards from `head` along `prev` links.
    pub fn chain(&self, head: Id) -> Chain<'_> {
        Chain {
            ledger: self,
            next: Some(head),
        }
    }

    /// Loads every object's location into memory (one ordered pass over the
    /// index, ~80 bytes per object), so later reads skip the index. For work
    /// that reads much of a large ledger at random, such as replaying a run:
    /// random index lookups were what made replay slow past ~100k events.
    /// Objects committed afterwards are added as they commit; anything not in
    /// the table falls back to the index.
    pub fn preload_locations(&self) -> Result<()> {
        if self.locs.read().map(|g| g.is_some()).unwrap_or(false) {
            return Ok(());
        }
        let mut m = HashMap::with_capacity(self.object_count()? as usize);
        self.for_each_location(|id, loc| {
            m.insert(id, loc);
        })?;
        if let Ok(mut g) = self.locs.write() {
            *g = Some(m);
        }
        Ok(())
    }

    /// Number of objects in the ledger (from the index's watermark).
    pub fn object_count(&self) -> Result<u64> {
        Ok(self.idx.end().ordinal)
    }

    /// Calls `f` for every indexed object (table by table, then the memtable;
    /// a later entry for an id supersedes an earlier one).
    pub fn for_each_location(&self, f: impl FnMut(Id, ObjLoc)) -> Result<()> {
        self.idx.for_each(f);
        Ok(())
    }

    /// Every object location in log order (from the index).
    pub fn locations(&self) -> Result<Vec<(Id, ObjLoc)>> {
        let mut v = Vec::new();
        self.for_each_location(|id, loc| v.push((id, loc)))?;
        v.sort_by_key(|(_, l)| l.ordinal);
        Ok(v)
    }

    /// Snapshots a directory into a tree (storing its blobs), durably.
    pub fn snapshot_dir(&self, dir: &Path) -> Result<Id> {
        let mut b = self.batch();
        let id = b.snapshot_dir(dir)?;
        b.commit()?;
        Ok(id)
    }

    /// Materialises a tree into `dest`, which must be missing or empty.
    pub fn checkout(&self, tree_id: &Id, dest: &Path) -> Result<()> {
        let t = self.get_tree(tree_id)?;
        tree::prepare_checkout_dir(dest)?;
        for e in &t.entries {
            let content = match e.blob_id() {
                Some(b) => self.get_blob(&b)?,
                None => Vec::new(),
            };
            tree::materialise_entry(dest, e, &content)?;
        }
        tree::finish_checkout(dest, &t)
    }

    /// The key of this ledger's record checks.
    pub(crate) fn salt(&self) -> &Salt {
        &self.salt
    }

    pub(crate) fn segment_dir(&self) -> &Path {
        &self.seg_dir
    }

    /// The end of the durable, published log (scans stop there, so a commit
    /// in progress is never read half-written) and every ref's head at that moment,
    /// taken together (under the writer lock), so a scan up to that end can
    /// be compared with refs that no later commit has moved.
    pub(crate) fn committed_end_and_refs(&self) -> Result<(LogEnd, Vec<(String, Id)>)> {
        let w = self.lock_writer()?;
        let refs: Vec<(String, Id)> = w
            .durable_heads
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        Ok((w.durable_end, refs))
    }

    fn head_info(&self, ref_name: &str, expected: Id) -> Result<HeadInfo> {
        if let Some(h) = self.lock_writer()?.head_info.get(ref_name) {
            if h.id == expected {
                return Ok(h.clone());
            }
        }
        let ev = self.get_event(&expected)?;
        Ok(HeadInfo {
            id: expected,
            stream: ev.stream,
            seq: ev.seq,
        })
    }

    /// Commits a batch (the write path in the module docs): encodes it with
    /// no lock held, joins the open group under the writer lock, then waits
    /// (leading if no one else is) until a sync covers that group.
    fn commit_batch(&self, b: Batch<'_>) -> Result<()> {
        self.submit_batch(b)?.wait()
    }

    /// Steps 2-3 of a commit; the returned [`Durability`] is step 4-6.
    fn submit_batch(&self, b: Batch<'_>) -> Result<Durability<'_>> {
        if self.read_only {
            return Err(LedgerError::ReadOnly {
                path: self.dir.clone(),
            });
        }
        // Step 2: dedup against the durable log and encoding, no lock held.
        let prep = self.prepare(&b)?;
        // Step 3: validation and joining the open group.
        let group = {
            let mut w = self.lock_writer()?;
            if let Some(why) = &w.poisoned {
                return Err(LedgerError::Index {
                    detail: format!("an earlier write failed ({why}); reopen the ledger"),
                });
            }
            self.join(&mut w, b, prep)?
        };
        match group {
            Joined::Group(g) => Ok(Durability {
                ledger: self,
                group: Some(g),
            }),
            Joined::Nothing => Ok(Durability {
                ledger: self,
                group: None,
            }),
            Joined::Conflict { error, moved_by } => {
                // The head the conflict reports is made visible first, so
                // a retry that reads `head()` sees it instead of failing
                // again until its group is durable.
                self.wait_durable(moved_by)?;
                Err(error)
            }
        }
    }

    /// Step 2, with no lock held: skips objects the durable log is seen to
    /// hold (`backed` reads the record back) and encodes the rest as
    /// records. Trees use a snapshot of the shared tree-delta base: any
    /// plainly stored tree earlier in the log is a valid base (FORMAT.md), so
    /// a concurrent commit storing a newer one costs compression, never
    /// correctness, and a single writer stores exactly what it did before.
    fn prepare(&self, b: &Batch<'_>) -> Result<Prepared> {
        // Read before the dedup checks: an object indexed at or past this
        // ordinal was made durable after them (see `join`).
        let checked_ordinal = self.idx.end().ordinal;
        let mut objs = Vec::with_capacity(b.objects.len());
        let mut tree_base: Option<Option<TreeBase>> = None;
        let mut plain_trees: HashSet<Id> = HashSet::new();
        for (at, p) in b.objects.iter().enumerate() {
            // (`Batch::push` keeps the batch's objects distinct.)
            if self.backed(&p.id)? {
                continue;
            }
            let mut base_in_batch = None;
            // Written again because its record does not read back: stored
            // plainly, since deltas stored before may name it as their base.
            let rewrite = self.locate(&p.id)?.is_some();
            let (flags, body) = match p.kind {
                ObjectKind::Tree | ObjectKind::Blob if rewrite => {
                    let level = if p.kind == ObjectKind::Tree {
                        self.opts.zstd_level
                    } else {
                        self.blob_level(p.raw.len())
                    };
                    self.maybe_compress(level, &p.raw)
                }
                ObjectKind::Tree => {
                    let base = tree_base.get_or_insert_with(|| self.tree_base_snapshot());
                    let (flags, body, used) = self.compress_tree(base, &p.id, &p.raw);
                    match used {
                        Some(u) if plain_trees.contains(&u) => base_in_batch = Some(u),
                        Some(_) => {}
                        None => {
                            plain_trees.insert(p.id);
                        }
                    }
                    (flags, body)
                }
                ObjectKind::Blob => {
                    let plain = self.maybe_compress(self.blob_level(p.raw.len()), &p.raw);
                    match p
                        .similar
                        .and_then(|s| self.blob_delta(s, &p.raw, plain.1.len()))
                    {
                        Some(delta) => (FLAG_ZSTD | segment::FLAG_DICT, delta),
                        None => plain,
                    }
                }
                ObjectKind::Event => self.maybe_compress(self.opts.event_zstd_level, &p.raw),
            };
            let (body_len, record) = object_record(p, flags, &body);
            objs.push(Encoded {
                at,
                flags,
                body_len,
                record,
                base_in_batch,
            });
        }
        Ok(Prepared {
            checked_ordinal,
            objs,
        })
    }

    /// Step 3, under the writer lock: compare-and-swap against the heads
    /// including groups not yet durable, dedup and link checks against the
    /// index and those groups, then the batch's records join the open group
    /// and the writer's view (heads, unsynced objects, ordinals) moves.
    /// Returns what to wait for. On error, or a conflict, nothing was written.
    fn join(&self, w: &mut Writer, b: Batch<'_>, prep: Prepared) -> Result<Joined> {
        if let Some(conflict) = check_ref_moves(w, &b)? {
            return Ok(conflict);
        }
        let (mut fresh, written, mut wait) = self.fresh_objects(w, &b, prep)?;
        self.check_ref_targets(w, &b, &written, &mut wait)?;
        if fresh.is_empty() && b.ref_updates.is_empty() {
            return Ok(wait.map_or(Joined::Nothing, Joined::Group));
        }
        // A tree encoded as a delta against a tree of this batch that a
        // concurrent commit wrote instead (perhaps as a delta itself) is
        // stored plainly: a delta's base must be stored plainly. Rare.
        for e in fresh.iter_mut() {
            if e.base_in_batch.is_some_and(|t| !written.contains(&t)) {
                let p = &b.objects[e.at];
                let (flags, body) = self.maybe_compress(self.opts.zstd_level, &p.raw);
                (e.body_len, e.record) = object_record(p, flags, &body);
                e.flags = flags;
                e.base_in_batch = None;
            }
        }
        // Encode the ref updates before touching the group, so a failure
        // leaves it as it was.
        let (collapsed, ref_records) = ref_update_records(&b)?;
        let no = self.place_in_group(w, &b, &fresh, &collapsed, &ref_records);
        for u in &b.ref_updates {
            set(&mut w.moving, &u.name, no);
            match u.new {
                Some(new) => set(&mut w.heads, &u.name, new),
                None => {
                    w.heads.remove(&u.name);
                    w.head_info.remove(&u.name);
                }
            }
        }
        for (name, info) in b.heads {
            if w.heads.get(&name) == Some(&info.id) {
                w.head_info.insert(name, info);
            }
        }
        Ok(Joined::Group(no))
    }

    /// The batch's objects still to write: those no concurrent commit
    /// wrote since `prepare` checked (a concurrent one's group is waited
    /// for instead), each with its links resolving to stored objects
    /// (durable or not yet) or to earlier batch members. Also the ids
    /// written and the group to wait for.
    fn fresh_objects(
        &self,
        w: &Writer,
        b: &Batch<'_>,
        prep: Prepared,
    ) -> Result<(Vec<Encoded>, HashSet<Id>, Option<u64>)> {
        let mut wait: Option<u64> = None;
        // Nothing was published since `prepare` if the index has not moved
        // (publishing takes this lock): then no lookup is needed.
        let published_since = self.idx.end().ordinal != prep.checked_ordinal;
        let mut fresh: Vec<Encoded> = Vec::with_capacity(prep.objs.len());
        let mut written: HashSet<Id> = HashSet::with_capacity(prep.objs.len());
        for e in prep.objs {
            let p = &b.objects[e.at];
            if let Some(&(_, g)) = w.unsynced.get(&p.id) {
                // A concurrent commit wrote it; acknowledged with its group.
                wait = wait.max(Some(g));
                continue;
            }
            if published_since
                && self
                    .locate(&p.id)?
                    .is_some_and(|l| l.ordinal >= prep.checked_ordinal)
            {
                // Written by a commit of this process and made durable since.
                continue;
            }
            for l in &p.links {
                if !b.absent_ok
                    && !written.contains(l)
                    && !w.unsynced.contains_key(l)
                    && !self.contains(l)?
                {
                    return Err(LedgerError::Dangling {
                        referrer: format!("{} {}", p.kind, p.id),
                        missing: *l,
                    });
                }
            }
            written.insert(p.id);
            fresh.push(e);
        }
        Ok((fresh, written, wait))
    }

    /// Every ref the batch moves must name an event: written by the batch,
    /// by a concurrent commit (whose group is then waited for) or stored.
    fn check_ref_targets(
        &self,
        w: &Writer,
        b: &Batch<'_>,
        written: &HashSet<Id>,
        wait: &mut Option<u64>,
    ) -> Result<()> {
        for u in &b.ref_updates {
            let Some(new) = u.new else { continue };
            if written.contains(&new) {
                batch_head_is_event(b, new)?;
                continue;
            }
            let kind = match w.unsynced.get(&new) {
                Some(&(k, g)) => {
                    *wait = (*wait).max(Some(g));
                    Some(k)
                }
                None => self.kind_of(&new)?,
            };
            match kind {
                Some(ObjectKind::Event) => {}
                Some(k) => {
                    return Err(LedgerError::WrongKind {
                        id: new,
                        expected: ObjectKind::Event,
                        actual: k,
                    })
                }
                None => {
                    return Err(LedgerError::Dangling {
                        referrer: format!("ref {}", u.name),
                        missing: new,
                    })
                }
            }
        }
        Ok(())
    }

    /// Appends the fresh objects and the ref updates to the open group
    /// (records, index items, ordinals) and keeps the last plain tree as
    /// the next delta base; the group's number.
    fn place_in_group(
        &self,
        w: &mut Writer,
        b: &Batch<'_>,
        fresh: &[Encoded],
        collapsed: &[PendingRef],
        ref_records: &[PreRecord],
    ) -> u64 {
        let no = w.group.no;
        let mut ordinal = w.next_ordinal;
        let mut last_plain_tree: Option<usize> = None;
        for e in fresh {
            let p = &b.objects[e.at];
            let g = &mut w.group;
            let offset = g.base + g.buf.len() as u64;
            e.record.place(&self.salt, g.seg, offset, &mut g.buf);
            g.items.push(IndexItem::Object {
                id: p.id,
                loc: ObjLoc {
                    kind: p.kind,
                    flags: e.flags,
                    seg: g.seg,
                    offset,
                    body_len: e.body_len,
                    raw_len: p.raw.len() as u32,
                    meta_len: p.meta.len() as u32,
                    ordinal,
                },
                event: p.event_links.clone(),
            });
            ordinal += 1;
            w.unsynced.insert(p.id, (p.kind, no));
            if p.kind == ObjectKind::Tree && e.flags & segment::FLAG_DICT == 0 {
                last_plain_tree = Some(e.at);
            }
        }
        for (u, rec) in collapsed.iter().zip(ref_records) {
            let g = &mut w.group;
            let offset = g.base + g.buf.len() as u64;
            rec.place(&self.salt, g.seg, offset, &mut g.buf);
            w.group.items.push(IndexItem::Ref {
                name: u.name.clone(),
                new: u.new,
            });
        }
        w.group.records += (fresh.len() + collapsed.len()) as u32;
        w.group.commits += 1;
        w.group.end_ordinal = ordinal;
        w.next_ordinal = ordinal;
        if let Some(at) = last_plain_tree {
            let p = &b.objects[at];
            *lock_or_recover(&self.tree_base) = Some(Arc::new(TreeBaseInner {
                id: p.id,
                raw: p.raw.clone(),
                deltas: std::sync::atomic::AtomicU16::new(0),
            }));
        }
        no
    }

    /// The acknowledgement of a commit detached earlier
    /// ([`Durability::detach`]): resolves once its group is durable. A
    /// commit that wrote nothing, or whose group is durable already,
    /// resolves at once.
    pub fn settle(&self, u: Unsettled) -> Result<Durability<'_>> {
        if u.group.is_some() && u.ledger != self.instance {
            return Err(LedgerError::ForeignCommit {
                path: self.dir.clone(),
            });
        }
        Ok(Durability {
            ledger: self,
            group: u.group,
        })
    }

    /// Whether every commit submitted so far is durable: no group holds
    /// commits that are not yet written and synced.
    pub fn all_durable(&self) -> bool {
        let (open, commits) = match self.writer.lock() {
            Ok(w) => (w.group.no, w.group.commits),
            Err(_) => return false,
        };
        commits == 0 && lock_or_recover(&self.sync).durable + 1 >= open
    }

    /// Steps 4-6: returns once group `no` is durable (and published), or
    /// with the error of the group that failed. While no one leads, this
    /// thread does.
    fn wait_durable(&self, no: u64) -> Result<()> {
        let mut s = lock_or_recover(&self.sync);
        loop {
            match self.durable_or_lead(s, no) {
                Ok(done) => return done,
                Err(back) => s = self.synced.wait(back).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// One look at group `no`: its outcome once it is durable or failed
    /// (leading first while no one leads), or the still-held state when
    /// another committer is writing it.
    fn durable_or_lead<'s>(
        &'s self,
        mut s: MutexGuard<'s, SyncState>,
        no: u64,
    ) -> std::result::Result<Result<()>, MutexGuard<'s, SyncState>> {
        loop {
            if s.durable >= no {
                return Ok(Ok(()));
            }
            // Groups are written in order: once one fails, no later one is.
            if let Some(f) = &s.failed {
                return Ok(Err(f.error()));
            }
            if s.leading {
                return Err(s);
            }
            s.leading = true;
            drop(s);
            self.lead();
            s = lock_or_recover(&self.sync);
        }
    }

    /// One committer at a time: seals the open group, writes and syncs it,
    /// publishes it, records the outcome and wakes every waiter.
    fn lead(&self) {
        /// Ends the leadership even if writing panics, failing the group.
        struct Leading<'a>(&'a Ledger, Option<std::result::Result<u64, Failure>>);
        impl Drop for Leading<'_> {
            fn drop(&mut self) {
                let outcome = self.1.take().unwrap_or_else(|| {
                    if let Ok(mut w) = self.0.writer.lock() {
                        w.poisoned = Some("a committing thread panicked".into());
                    }
                    Err(Failure {
                        path: None,
                        kind: std::io::ErrorKind::Other,
                        message: "a committing thread panicked while writing a group".into(),
                    })
                });
                let mut s = lock_or_recover(&self.0.sync);
                match outcome {
                    Ok(no) => s.durable = s.durable.max(no),
                    Err(f) => s.failed = Some(f),
                }
                s.leading = false;
                let wakers = std::mem::take(&mut s.wakers);
                drop(s);
                self.0.synced.notify_all();
                for w in wakers {
                    w.wake();
                }
            }
        }
        let mut leading = Leading(self, None);
        leading.1 = Some(self.write_group());
    }

    /// The leader's work (step 4-5): seal, write, `fdatasync`, publish.
    fn write_group(&self) -> std::result::Result<u64, Failure> {
        let g = {
            let mut w = self.lock_writer().map_err(|e| Failure::of(&e))?;
            if w.group.commits == 0 {
                // Not reached: whoever waits for a group that is not durable
                // yet while no one leads waits for the open one, which it
                // (or the commit whose object it found unsynced) joined.
                debug_assert!(false, "leading an empty group");
                return Ok(w.group.no - 1);
            }
            let marker = segment::commit_marker(w.group.records, w.group.base);
            let marker_at = w.group.base + w.group.buf.len() as u64;
            // The next group starts where this one ends (or in a new segment).
            let end = marker_at + marker.byte_len() as u64;
            let next = Group::at(
                w.group.no + 1,
                w.group.seg,
                end,
                w.next_ordinal,
                self.opts.segment_max,
            );
            let mut g = std::mem::replace(&mut w.group, next);
            marker.place(&self.salt, g.seg, marker_at, &mut g.buf);
            g
        };
        let res = self.append_and_sync(&g);
        let mut w = match self.writer.lock() {
            Ok(w) => w,
            Err(_) => {
                return Err(Failure {
                    path: None,
                    kind: std::io::ErrorKind::Other,
                    message: "writer lock poisoned by a panicking thread".into(),
                })
            }
        };
        if let Err(e) = res {
            // Nothing of this group (or any later one) is acknowledged.
            w.poisoned = Some(e.to_string());
            return Err(Failure::of(&e));
        }
        // Step 5: publish.
        let end = Pos {
            seg: g.seg,
            off: g.base + g.buf.len() as u64,
            ordinal: g.end_ordinal,
        };
        self.idx.apply(&g.items, end);
        if let Ok(mut l) = self.locs.write() {
            if let Some(m) = l.as_mut() {
                for it in &g.items {
                    if let IndexItem::Object { id, loc, .. } = it {
                        m.insert(*id, *loc);
                    }
                }
            }
        }
        for it in &g.items {
            match it {
                IndexItem::Object { id, .. } => {
                    if w.unsynced.get(id).is_some_and(|x| x.1 == g.no) {
                        w.unsynced.remove(id);
                    }
                }
                IndexItem::Ref { name, new } => {
                    match new {
                        Some(new) => match w.durable_heads.get_mut(name) {
                            Some(slot) => *slot = *new,
                            None => {
                                w.durable_heads.insert(name.clone(), *new);
                            }
                        },
                        None => {
                            w.durable_heads.remove(name);
                        }
                    }
                    if w.moving.get(name) == Some(&g.no) {
                        w.moving.remove(name);
                    }
                }
            }
        }
        w.durable_end = (end.seg, end.off);
        drop(w);
        // Readers may now see the group: it is durable. (Leaders run one at
        // a time, so the watermark only moves forward.)
        self.publish_watermark(end.seg, end.off);
        if self.idx.mem_objects() >= index::FLUSH_OBJECTS {
            // A table that cannot be written costs only memory and a longer
            // scan at the next open: the group is already durable.
            let _ = self.idx.flush();
        }
        Ok(g.no)
    }

    /// One `write` and one `fdatasync` of a sealed group, starting its
    /// segment first if it is a new one (every earlier group, so all of the
    /// previous segment, is already durable; the new header records where).
    /// On failure nothing is cut: the writer stops, and the next open finds
    /// the group's bytes (if any reached the disk) as a tail.
    fn append_and_sync(&self, g: &Group) -> Result<()> {
        let mut a = lock_or_recover(&self.active);
        if a.seg_no != g.seg {
            let prev_end = g.prev_end.unwrap_or(0);
            crate::startup::create_segment(
                self.opts.files.as_ref(),
                &self.seg_dir,
                g.seg,
                &self.salt,
                prev_end,
            )?;
            let path = segment::segment_path(&self.seg_dir, g.seg);
            let file = self
                .opts
                .files
                .open_append(&path)
                .map_err(|e| LedgerError::io(&path, e))?;
            a.seg_no = g.seg;
            a.file = Some(file);
        }
        let seg_path = segment::segment_path(&self.seg_dir, g.seg);
        let Some(file) = a.file.as_mut() else {
            return Err(LedgerError::ReadOnly {
                path: self.dir.clone(),
            });
        };
        file.append(&g.buf)
            .and_then(|_| file.sync_data())
            .map_err(|e| LedgerError::io(seg_path, e))
    }

    /// The tree-delta base for a batch's trees: the last tree stored plainly
    /// by this process or, before the first, the latest plain tree in the
    /// ledger (recorded by the index, so it survives processes: one `mass
    /// snapshot` per workspace version still stores deltas).
    fn tree_base_snapshot(&self) -> Option<TreeBase> {
        if let Some(b) = lock_or_recover(&self.tree_base).clone() {
            return Some(b);
        }
        let initial = self.initial_tree_base().map(Arc::new);
        let mut g = lock_or_recover(&self.tree_base);
        if g.is_none() {
            *g = initial;
        }
        g.clone()
    }

    /// The next generation of a delta against a base that has served
    /// `used` deltas, or `None` when the base has served its share (the
    /// object is then stored plainly and becomes a new base).
    fn next_generation(&self, used: u16) -> Option<u16> {
        let g = used.checked_add(1)?;
        (self.opts.unprotected.no_delta_bound || g <= segment::MAX_DELTA_GENERATION).then_some(g)
    }

    /// Trees are stored as a zstd delta against `base` when that is much
    /// smaller; otherwise plainly, becoming the base for the batch's next
    /// trees. Returns the base used, if any.
    fn compress_tree(
        &self,
        base: &mut Option<TreeBase>,
        id: &Id,
        raw: &[u8],
    ) -> (u8, Vec<u8>, Option<Id>) {
        let plain = self.maybe_compress(self.opts.zstd_level, raw);
        if let Some(b) = base.as_ref() {
            let used = b.deltas.load(std::sync::atomic::Ordering::Relaxed);
            let delta = zstd::bulk::Compressor::with_dictionary(self.opts.zstd_level, &b.raw)
                .and_then(|mut c| c.compress(raw));
            if let (Ok(d), Some(_)) = (delta, self.next_generation(used)) {
                if d.len() + segment::DELTA_PREFIX_LEN < plain.1.len() / 2 {
                    let n = b.deltas.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if let Some(g) = self.next_generation(n) {
                        let body = segment::delta_body(&b.id, g, &d);
                        return (FLAG_ZSTD | segment::FLAG_DICT, body, Some(b.id));
                    }
                }
            }
        }
        *base = Some(Arc::new(TreeBaseInner {
            id: *id,
            raw: raw.to_vec(),
            deltas: std::sync::atomic::AtomicU16::new(0),
        }));
        (plain.0, plain.1, None)
    }

    /// A delta body for blob `raw` against `similar`'s base (`similar`
    /// itself when it is stored plainly: a base is never a delta), if that
    /// base has not served its share of deltas and the delta saves at least
    /// 1/8 of `plain_len`, the blob's plain compressed size (a delta costs
    /// one more read; an edited copy stored whole costs far more). A base
    /// that does not read back intact is not used.
    fn blob_delta(&self, similar: Id, raw: &[u8], plain_len: usize) -> Option<Vec<u8>> {
        let loc = self.locate(&similar).ok()??;
        let (base, used) = if loc.flags & segment::FLAG_DICT != 0 {
            let f = self.reader(loc.seg).ok()?;
            let mut b = [0u8; segment::DELTA_PREFIX_LEN];
            f.read_exact_at(&mut b, loc.offset + RECORD_HEADER_LEN as u64)
                .ok()?;
            let (base, g) = segment::delta_of(&similar, loc.flags, &b).ok()??;
            (base, g)
        } else {
            (similar, 0)
        };
        let generation = self.next_generation(used)?;
        let (_, dict) = self.read_plain(&base, ObjectKind::Blob).ok()?;
        let d = zstd::bulk::Compressor::with_dictionary(self.blob_level(raw.len()), &dict)
            .and_then(|mut c| c.compress(raw))
            .ok()?;
        if (d.len() + segment::DELTA_PREFIX_LEN) * 8 >= plain_len * 7 {
            return None;
        }
        Some(segment::delta_body(&base, generation, &d))
    }

    /// The latest plain tree in the ledger, read back, with the generation
    /// of the latest tree if that is a delta against it.
    fn initial_tree_base(&self) -> Option<TreeBaseInner> {
        let latest = self.idx.latest_trees();
        let id = latest.plain?;
        let (_, raw) = self.read_plain(&id, ObjectKind::Tree).ok()?;
        let used = latest
            .any
            .and_then(|t| {
                let loc = self.locate(&t).ok()??;
                let f = self.reader(loc.seg).ok()?;
                let mut b = [0u8; segment::DELTA_PREFIX_LEN];
                f.read_exact_at(&mut b, loc.offset + RECORD_HEADER_LEN as u64)
                    .ok()?;
                segment::delta_of(&t, loc.flags, &b).ok()?
            })
            .filter(|(base, _)| *base == id)
            .map_or(0, |(_, g)| g);
        Some(TreeBaseInner {
            id,
            raw,
            deltas: std::sync::atomic::AtomicU16::new(used),
        })
    }

    /// The zstd level for a blob of `len` bytes (see `Options`).
    fn blob_level(&self, len: usize) -> i32 {
        if len < self.opts.tiny_blob {
            self.opts.tiny_blob_zstd_level
        } else if len < self.opts.small_blob {
            self.opts.small_blob_zstd_level
        } else {
            self.opts.blob_zstd_level
        }
    }

    fn maybe_compress(&self, level: i32, raw: &[u8]) -> (u8, Vec<u8>) {
        if raw.len() >= self.opts.compress_min {
            if let Some(c) = self.compress(level, raw) {
                if c.len() + c.len() / 8 < raw.len() {
                    return (FLAG_ZSTD, c);
                }
            }
        }
        (0, raw.to_vec())
    }

    /// zstd at `level` with a pooled context: one per level and concurrent
    /// compressor, not one per object.
    fn compress(&self, level: i32, raw: &[u8]) -> Option<Vec<u8>> {
        let pooled = {
            let mut pool = lock_or_recover(&self.cctx);
            pool.iter()
                .position(|(l, _)| *l == level)
                .map(|i| pool.swap_remove(i).1)
        };
        let mut c = match pooled {
            Some(c) => c,
            None => zstd::bulk::Compressor::new(level).ok()?,
        };
        let out = c.compress(raw).ok();
        let mut pool = lock_or_recover(&self.cctx);
        if pool.len() < CCTX_POOL_MAX {
            pool.push((level, c));
        }
        out
    }
}

/// Compression contexts kept for reuse (beyond that, a burst of concurrent
/// committers' contexts are dropped after use).
const CCTX_POOL_MAX: usize = 32;

/// Sets `m[k] = v`, cloning the key only when it is new.
fn set<V>(m: &mut HashMap<String, V>, k: &str, v: V) {
    match m.get_mut(k) {
        Some(slot) => *slot = v,
        None => {
            m.insert(k.to_string(), v);
        }
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked.
fn lock_or_recover<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One object's record without its position (the checks that bind it are
/// added when it joins a group), so it is built before the writer lock.
fn object_record(p: &Pending, flags: u8, body: &[u8]) -> (u32, PreRecord) {
    let header = RecordHeader {
        rtype: RecordType::Object(p.kind),
        flags,
        body_len: body.len() as u32,
        meta_len: p.meta.len() as u32,
        raw_len: p.raw.len() as u32,
        id: p.id,
    };
    (header.body_len, PreRecord::new(&header, body, &p.meta))
}

/// What a commit waits for after step 3.
enum Joined {
    /// Its records are in this group.
    Group(u64),
    /// Nothing to write and nothing to wait for.
    Nothing,
    /// A compare-and-swap failed against a head that group `moved_by`, not
    /// yet durable, set.
    Conflict { error: LedgerError, moved_by: u64 },
}

/// A batch after step 2: what it may still need to write, encoded.
struct Prepared {
    /// The index's end ordinal before dedup was checked.
    checked_ordinal: u64,
    /// Batch objects not seen durably stored, in batch order.
    objs: Vec<Encoded>,
}

/// One object encoded as a record.
struct Encoded {
    /// Its place in `Batch::objects`.
    at: usize,
    flags: u8,
    body_len: u32,
    record: PreRecord,
    /// For a tree stored as a delta against a tree earlier in this batch:
    /// that tree, which this batch must then write itself.
    base_in_batch: Option<Id>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("dir", &self.dir)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl Drop for Ledger {
    /// Writes commits submitted but never waited for (a dropped
    /// `Durability`: no later commit led their group), so a clean close
    /// keeps them; then writes the memtable as an index table so the next
    /// open need not scan the log again, and makes the watermark durable.
    /// Derived data: a failure there costs only a longer scan.
    fn drop(&mut self) {
        if self.read_only {
            return;
        }
        let pending = self
            .writer
            .lock()
            .map(|w| w.poisoned.is_none() && w.group.commits > 0)
            .unwrap_or(false);
        if pending {
            // Nobody else holds the ledger now, so no one is leading.
            self.lead();
        }
        let _ = self.idx.flush();
        if let Some(w) = &self.watermark {
            let _ = w.sync();
        }
    }
}

/// Iterator over a stream, newest first.
pub struct Chain<'a> {
    ledger: &'a Ledger,
    next: Option<Id>,
}

impl Iterator for Chain<'_> {
    type Item = Result<Event>;
    fn next(&mut self) -> Option<Result<Event>> {
        let id = self.next.take()?;
        match self.ledger.get_event(&id) {
            Ok(ev) => {
                self.next = ev.prev;
                Some(Ok(ev))
            }
            Err(e) => Some(Err(e)),
        }
    }
}

struct Pending {
    kind: ObjectKind,
    id: Id,
    raw: Vec<u8>,
    meta: Vec<u8>,
    links: Vec<Id>,
    event_links: Option<EventIndex>,
    /// For a blob: an earlier blob likely to be similar (the same path in
    /// the previous snapshot), tried as a delta base when it is stored.
    similar: Option<Id>,
}

struct PendingRef {
    name: String,
    expected: Option<Id>,
    /// `None` deletes the ref.
    new: Option<Id>,
}

/// A set of objects and ref updates committed atomically by [`Batch::commit`].
pub struct Batch<'a> {
    ledger: &'a Ledger,
    objects: Vec<Pending>,
    in_batch: HashSet<Id>,
    ref_updates: Vec<PendingRef>,
    heads: HashMap<String, HeadInfo>,
    absent_ok: bool,
    /// Where each event given whole (`put_raw`) says it sits in its
    /// stream, checked against its prev when the batch is submitted.
    raw_events: Vec<ChainPlace>,
    /// Set by [`Batch::keep_chains_as_recorded`].
    chains_as_recorded: bool,
}

/// An event's own claim of its place: stream, seq and prev.
struct ChainPlace {
    id: Id,
    stream: String,
    seq: u64,
    prev: Option<Id>,
}

impl<'a> Batch<'a> {
    fn push(&mut self, p: Pending) -> Id {
        let id = p.id;
        if self.in_batch.insert(id) {
            self.objects.push(p);
        }
        id
    }

    pub fn put_blob(&mut self, bytes: &[u8]) -> Result<Id> {
        check_size(bytes.len())?;
        let id = Id::of(ObjectKind::Blob, bytes);
        if self.in_batch.contains(&id) {
            return Ok(id);
        }
        Ok(self.push(Pending {
            kind: ObjectKind::Blob,
            id,
            raw: bytes.to_vec(),
            meta: Vec::new(),
            links: Vec::new(),
            event_links: None,
            similar: None,
        }))
    }

    pub fn put_tree(&mut self, t: &Tree) -> Result<Id> {
        t.validate()?;
        let raw = t.to_bytes()?;
        check_size(raw.len())?;
        let id = Id::of(ObjectKind::Tree, &raw);
        let links = t.entries.iter().filter_map(TreeEntry::blob_id).collect();
        Ok(self.push(Pending {
            kind: ObjectKind::Tree,
            id,
            raw,
            meta: Vec::new(),
            links,
            event_links: None,
            similar: None,
        }))
    }

    /// Lets this batch's objects link to objects the ledger does not hold
    /// (a lazy clone lands events and trees whose blobs stay on the
    /// remote). Refs must still name events that are stored.
    pub fn allow_absent_links(&mut self) {
        self.absent_ok = true;
    }

    /// Takes events given whole (`put_raw`) even when one does not continue
    /// its prev's stream at prev's seq + 1: for `migrate`, which copies a
    /// ledger as it was recorded (`verify` names such events afterwards).
    /// Without it such a batch is refused ([`LedgerError::BrokenChain`]):
    /// a pulled or imported chain that says it is somewhere it is not
    /// would mislead every reader that trusts `seq` and `stream`.
    pub fn keep_chains_as_recorded(&mut self) {
        self.chains_as_recorded = true;
    }

    /// Checks every event given whole against its prev, which must be an
    /// event in this batch or stored: a prev that is missing (even where
    /// absent links are allowed: those are blobs and trees a partial ledger
    /// leaves on its remote, never events), not an event, or stored but
    /// unreadable cannot vouch for the event's place, so the batch is
    /// refused. A prev submitted by another batch that is not durable yet
    /// counts as missing: give a chain whole, or commit its start first.
    fn check_raw_chains(&self) -> Result<()> {
        if self.chains_as_recorded || self.raw_events.is_empty() {
            return Ok(());
        }
        let here: HashMap<Id, (&str, u64)> = self
            .raw_events
            .iter()
            .map(|c| (c.id, (c.stream.as_str(), c.seq)))
            .collect();
        let mut at: Option<HashMap<Id, usize>> = None;
        for c in &self.raw_events {
            let broken = |detail: String| LedgerError::BrokenChain { id: c.id, detail };
            let Some(p) = c.prev else {
                if c.seq != 0 {
                    return Err(broken(format!("seq {} without a prev event", c.seq)));
                }
                continue;
            };
            let owned;
            let (stream, seq) = match here.get(&p) {
                Some(&place) => place,
                None => {
                    let at = at.get_or_insert_with(|| {
                        self.objects
                            .iter()
                            .enumerate()
                            .map(|(i, o)| (o.id, i))
                            .collect()
                    });
                    match self.event_in_batch_or_ledger(&p, at)? {
                        Ok(ev) => {
                            owned = ev;
                            (owned.stream.as_str(), owned.seq)
                        }
                        Err(why) => return Err(broken(format!("its prev {p} {why}"))),
                    }
                }
            };
            if stream != c.stream {
                return Err(broken(format!(
                    "its stream is {:?} but its prev {p} is on {stream:?}",
                    c.stream
                )));
            }
            if seq.checked_add(1) != Some(c.seq) {
                return Err(broken(format!("seq {} after prev {p} at seq {seq}", c.seq)));
            }
        }
        Ok(())
    }

    /// An event of this batch (`at`: batch position by id) or a stored
    /// one; else why it cannot be a prev.
    fn event_in_batch_or_ledger(
        &self,
        id: &Id,
        at: &HashMap<Id, usize>,
    ) -> Result<std::result::Result<Event, &'static str>> {
        if let Some(&i) = at.get(id) {
            let o = &self.objects[i];
            if o.kind != ObjectKind::Event {
                return Ok(Err("is not an event"));
            }
            return Ok(Ok(Event::from_envelope(
                *id,
                EventEnvelope::from_bytes(id, &o.raw)?,
            )));
        }
        if !self.ledger.contains(id)? {
            return Ok(Err("is neither in this batch nor stored"));
        }
        match self.ledger.get_event(id) {
            Ok(ev) => Ok(Ok(ev)),
            Err(LedgerError::WrongKind { .. }) => Ok(Err("is not an event")),
            Err(e) => Err(e),
        }
    }

    /// Adds an object given as its kind, canonical bytes and (for an event)
    /// the metadata recorded beside it, as when copying objects from another
    /// ledger: trees and events are decoded and checked as when they were
    /// first written, and their links must resolve when the batch commits;
    /// an event must also continue its prev's stream at prev's seq + 1
    /// (checked when the batch is submitted, see `check_raw_chains`).
    /// Metadata must be a JSON object of the ledger's metadata shape.
    pub fn put_raw(&mut self, kind: ObjectKind, raw: Vec<u8>, meta: Vec<u8>) -> Result<Id> {
        check_size(raw.len())?;
        let id = Id::of(kind, &raw);
        let bad = |reason: String| LedgerError::Corruption { id, detail: reason };
        if kind != ObjectKind::Event && !meta.is_empty() {
            return Err(bad("only events carry metadata".into()));
        }
        if !meta.is_empty() {
            serde_json::from_slice::<Meta>(&meta)
                .map_err(|e| bad(format!("metadata is not the ledger's metadata: {e}")))?;
        }
        let (links, event_links) = match kind {
            ObjectKind::Blob => (Vec::new(), None),
            ObjectKind::Tree => {
                let t = Tree::from_bytes(&id, &raw)?;
                (
                    t.entries.iter().filter_map(TreeEntry::blob_id).collect(),
                    None,
                )
            }
            ObjectKind::Event => {
                let ev = Event::from_envelope(id, EventEnvelope::from_bytes(&id, &raw)?);
                if !self.in_batch.contains(&id) {
                    self.raw_events.push(ChainPlace {
                        id,
                        stream: ev.stream.clone(),
                        seq: ev.seq,
                        prev: ev.prev,
                    });
                }
                let links: Vec<Id> = ev
                    .prev
                    .iter()
                    .chain(ev.parents.iter())
                    .chain(ev.refs.iter())
                    .copied()
                    .collect();
                let referred = referred_by_event(ev.prev, &ev.parents, &ev.refs);
                (
                    links,
                    Some(EventIndex {
                        kind: ev.kind,
                        links: referred,
                    }),
                )
            }
        };
        Ok(self.push(Pending {
            kind,
            id,
            raw,
            meta,
            links,
            event_links,
            similar: None,
        }))
    }

    /// Adds a snapshot of `dir` (its blobs and tree) to the batch. A changed
    /// file is stored as a delta against the same path in the latest tree in
    /// the ledger when that is much smaller (a workspace's versions differ
    /// by small edits; without this every edited copy is stored whole).
    pub fn snapshot_dir(&mut self, dir: &Path) -> Result<Id> {
        self.snapshot_dir_limited(dir, tree::SnapshotLimits::default())
    }

    /// [`Batch::snapshot_dir`] within `limits` (entries and bytes), checked
    /// while walking, before any content is read.
    pub fn snapshot_dir_limited(&mut self, dir: &Path, limits: tree::SnapshotLimits) -> Result<Id> {
        let parent: HashMap<String, Id> = match self.ledger.idx.latest_trees().any {
            Some(t) => match self.ledger.get_tree(&t) {
                Ok(t) => t
                    .entries
                    .iter()
                    .filter_map(|e| Some((e.path.clone(), e.blob_id()?)))
                    .collect(),
                // A damaged parent only costs the deltas.
                Err(_) => HashMap::new(),
            },
            None => HashMap::new(),
        };
        let t = tree::snapshot_with(dir, limits, |item, content| {
            let id = self.put_blob(&content)?;
            if let Some(p) = self.objects.last_mut() {
                if p.id == id && parent.get(&item.rel) != Some(&id) {
                    p.similar = parent.get(&item.rel).copied();
                }
            }
            Ok((id, content.len() as u64))
        })?;
        self.put_tree(&t)
    }

    /// Adds an event at the head of `ref_name`, which must be `expected` when the
    /// batch commits. The event's stream is inherited from `expected` (or is the
    /// ref name for a new stream) and its seq is one past it.
    pub fn append(&mut self, ref_name: &str, expected: Option<Id>, ev: NewEvent) -> Result<Id> {
        check_ref_name(ref_name)?;
        let bad = |reason: String| LedgerError::BadEvent {
            name: ref_name.to_string(),
            reason,
        };
        if ev.kind.is_empty() {
            return Err(bad("event kind is empty".into()));
        }
        let (stream, seq) = match expected {
            None => (ev.stream.clone().unwrap_or_else(|| ref_name.to_string()), 0),
            Some(p) => {
                let info = match self.heads.get(ref_name) {
                    Some(h) if h.id == p => h.clone(),
                    _ => self.ledger.head_info(ref_name, p)?,
                };
                if let Some(s) = &ev.stream {
                    if *s != info.stream {
                        return Err(bad(format!(
                            "names stream {s:?} but continues stream {:?}",
                            info.stream
                        )));
                    }
                }
                (info.stream, info.seq + 1)
            }
        };
        if stream.is_empty() {
            return Err(bad("stream name is empty".into()));
        }
        let env = EventEnvelope::build(&stream, seq, expected, &ev);
        let raw = env.to_bytes()?;
        check_size(raw.len())?;
        let id = Id::of(ObjectKind::Event, &raw);
        let links: Vec<Id> = expected
            .iter()
            .chain(ev.parents.iter())
            .chain(ev.refs.iter())
            .copied()
            .collect();
        let meta = serde_json::to_vec(&Meta::now(ev.meta)).map_err(LedgerError::index)?;
        // The referrers index covers every link: prev, parents and refs.
        let referred: Vec<Id> = referred_by_event(expected, &ev.parents, &ev.refs);
        self.push(Pending {
            kind: ObjectKind::Event,
            id,
            raw,
            meta,
            links,
            event_links: Some(EventIndex {
                kind: ev.kind,
                links: referred,
            }),
            similar: None,
        });
        self.ref_updates.push(PendingRef {
            name: ref_name.to_string(),
            expected,
            new: Some(id),
        });
        self.heads
            .insert(ref_name.to_string(), HeadInfo { id, stream, seq });
        Ok(id)
    }

    pub fn set_ref(&mut self, name: &str, expected: Option<Id>, new: Id) -> Result<()> {
        check_ref_name(name)?;
        self.ref_updates.push(PendingRef {
            name: name.to_string(),
            expected,
            new: Some(new),
        });
        Ok(())
    }

    /// Deletes ref `name`, whose head must be `expected` when the batch
    /// commits. Objects are never deleted: the ref's events stay readable
    /// by id. Recorded as a ref update whose `new` is all zeros.
    pub fn delete_ref(&mut self, name: &str, expected: Id) -> Result<()> {
        check_ref_name(name)?;
        self.ref_updates.push(PendingRef {
            name: name.to_string(),
            expected: Some(expected),
            new: None,
        });
        self.heads.remove(name);
        Ok(())
    }

    /// Number of objects in the batch.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty() && self.ref_updates.is_empty()
    }

    /// Makes the batch durable and visible; on error nothing of it is
    /// visible (after a failed write or fsync it may still reach the disk
    /// whole, as any unacknowledged commit may). Concurrent commits share
    /// one write and one fsync; each returns only once its bytes are durable.
    pub fn commit(self) -> Result<()> {
        self.check_raw_chains()?;
        let l = self.ledger;
        l.commit_batch(self)
    }

    /// Steps 2-3 of [`commit`](Batch::commit) without the wait: the batch
    /// joins the open group (later commits validate against it and may
    /// build on it), and the returned [`Durability`] says when it is
    /// durable. Readers do not see it before then, and it is not
    /// acknowledged: a crash before it is durable loses it (and every
    /// commit after it). A compare-and-swap conflict is returned here.
    pub fn submit(self) -> Result<Durability<'a>> {
        self.check_raw_chains()?;
        let l = self.ledger;
        l.submit_batch(self)
    }
}

/// A submitted commit's acknowledgement ([`Batch::submit`]): `wait` blocks
/// until the commit's group is durable; awaiting it (it is a `Future`,
/// executor-agnostic) suspends the task instead of the thread. Whichever
/// waiter finds no one writing the group leads, blocking or polling, so the
/// thread that polls may write and `fdatasync` one group, as a blocking
/// commit would; every other waiter is woken when that ends.
#[must_use = "a submitted commit is not acknowledged until its Durability resolves"]
pub struct Durability<'a> {
    ledger: &'a Ledger,
    /// `None`: nothing was written (every object was already stored).
    group: Option<u64>,
}

impl Durability<'_> {
    /// Blocks until the commit is durable, or returns its group's failure.
    pub fn wait(self) -> Result<()> {
        match self.group {
            Some(g) => self.ledger.wait_durable(g),
            None => Ok(()),
        }
    }

    /// Lets go of the ledger's borrow without waiting: what is left says
    /// which group to wait for later ([`Ledger::settle`]). Dropping that
    /// is dropping this: the commit stays submitted, is written with a
    /// later group (or when the ledger closes) and is not acknowledged.
    pub fn detach(self) -> Unsettled {
        Unsettled {
            ledger: self.ledger.instance,
            group: self.group,
        }
    }
}

/// A submitted commit not yet known to be durable, detached from its
/// ledger's borrow ([`Durability::detach`]) so that its owner can go on
/// using the ledger and wait later, with [`Ledger::settle`]. Groups become
/// durable in order, so the later of two (`and`) stands for both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsettled {
    /// Which open ledger the group number belongs to.
    ledger: u64,
    group: Option<u64>,
}

impl Default for Unsettled {
    /// Nothing to wait for: settles at once, against any ledger.
    fn default() -> Unsettled {
        Unsettled {
            ledger: FOREIGN,
            group: None,
        }
    }
}

impl Unsettled {
    /// Stands for both commits: the later group of the same ledger. Two
    /// ledgers' commits cannot be settled as one; the result is refused
    /// by `settle`.
    pub fn and(self, other: Unsettled) -> Unsettled {
        match (self.group, other.group) {
            (None, _) => other,
            (_, None) => self,
            (Some(a), Some(b)) if self.ledger == other.ledger => Unsettled {
                ledger: self.ledger,
                group: Some(a.max(b)),
            },
            _ => Unsettled {
                ledger: FOREIGN,
                group: Some(u64::MAX),
            },
        }
    }
}

/// The ledger instance no ledger has: `Unsettled::and` of two ledgers.
const FOREIGN: u64 = u64::MAX;

/// Numbers each opened ledger, so a detached commit is settled only
/// against the ledger that took it.
static INSTANCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl std::future::Future for Durability<'_> {
    type Output = Result<()>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<()>> {
        let Some(no) = self.group else {
            return std::task::Poll::Ready(Ok(()));
        };
        let s = lock_or_recover(&self.ledger.sync);
        match self.ledger.durable_or_lead(s, no) {
            Ok(done) => std::task::Poll::Ready(done),
            Err(mut s) => {
                // Registered under the lock the leader ends under: no
                // wake-up is lost between this check and the leader's end.
                if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    s.wakers.push(cx.waker().clone());
                }
                std::task::Poll::Pending
            }
        }
    }
}

/// True if `dir` holds only what an `init` that never wrote `FORMAT` leaves:
/// `LOCK`, `WATERMARK` and a `segments/` with at most a header-only segment
/// 1 (or its temp file). No record was ever written there, so `init` may
/// start again over it.
fn interrupted_init(dir: &Path) -> bool {
    let Ok(rd) = fs::read_dir(dir) else {
        return false;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        match name.to_str() {
            Some("LOCK") | Some("WATERMARK") => {}
            Some("segments") => {
                let Ok(segs) = fs::read_dir(e.path()) else {
                    return false;
                };
                for s in segs.flatten() {
                    let ok_name = matches!(
                        s.file_name().to_str(),
                        Some("00000001.seg") | Some("00000001.seg.tmp")
                    );
                    let small = s
                        .metadata()
                        .map(|m| m.len() <= SEGMENT_HEADER_LEN)
                        .unwrap_or(false);
                    if !ok_name || !small {
                        return false;
                    }
                }
            }
            _ => return false,
        }
    }
    true
}

/// Compare-and-swap on the batch's refs, applied in order within the
/// batch. A ref that moved meanwhile is a conflict: `Joined::Conflict`
/// when a commit of the open group moved it (the caller retries after
/// it), the error otherwise.
fn check_ref_moves(w: &Writer, b: &Batch<'_>) -> Result<Option<Joined>> {
    let mut heads_after: HashMap<&str, Option<Id>> = HashMap::new();
    for u in &b.ref_updates {
        let current = match heads_after.get(u.name.as_str()) {
            Some(h) => *h,
            None => w.heads.get(&u.name).copied(),
        };
        if current != u.expected {
            let error = LedgerError::Conflict {
                name: u.name.clone(),
                expected: u.expected,
                actual: current,
            };
            if let Some(&moved_by) = w.moving.get(&u.name) {
                return Ok(Some(Joined::Conflict { error, moved_by }));
            }
            return Err(error);
        }
        heads_after.insert(&u.name, u.new);
    }
    Ok(None)
}

/// The batch's ref updates as records: several updates of one ref are one
/// step in the operation log, from the first expected head to the last
/// new one.
fn ref_update_records(b: &Batch<'_>) -> Result<(Vec<PendingRef>, Vec<PreRecord>)> {
    let mut collapsed: Vec<PendingRef> = Vec::new();
    for u in &b.ref_updates {
        match collapsed.iter_mut().find(|c| c.name == u.name) {
            Some(c) => c.new = u.new,
            None => collapsed.push(PendingRef {
                name: u.name.clone(),
                expected: u.expected,
                new: u.new,
            }),
        }
    }
    let mut ref_records = Vec::with_capacity(collapsed.len());
    for u in &collapsed {
        let body = RefUpdate {
            name: u.name.clone(),
            old: u.expected.map(|i| i.0),
            new: u.new.map_or(DELETED, |i| i.0),
        }
        .to_bytes()?;
        let header = RecordHeader {
            rtype: RecordType::RefUpdate,
            flags: 0,
            body_len: body.len() as u32,
            meta_len: 0,
            raw_len: body.len() as u32,
            id: Id(*blake3::hash(&body).as_bytes()),
        };
        ref_records.push(PreRecord::new(&header, &body, &[]));
    }
    Ok((collapsed, ref_records))
}

/// A ref set to an object written by the same batch must still name an
/// event.
fn batch_head_is_event(b: &Batch<'_>, new: Id) -> Result<()> {
    match b.objects.iter().find(|p| p.id == new).map(|p| p.kind) {
        Some(ObjectKind::Event) | None => Ok(()),
        Some(k) => Err(LedgerError::WrongKind {
            id: new,
            expected: ObjectKind::Event,
            actual: k,
        }),
    }
}

fn check_size(len: usize) -> Result<()> {
    if len as u64 >= segment::MAX_BODY_LEN {
        return Err(LedgerError::TooLarge {
            len: len as u64,
            limit: segment::MAX_BODY_LEN,
        });
    }
    Ok(())
}

/// Everything an event links to (prev, parents, refs), each once: the keys
/// under which the index finds it as a referrer.
pub(crate) fn referred_by_event(prev: Option<Id>, parents: &[Id], refs: &[Id]) -> Vec<Id> {
    let mut out: Vec<Id> = prev
        .iter()
        .chain(parents.iter())
        .chain(refs.iter())
        .copied()
        .collect();
    out.sort();
    out.dedup();
    out
}
