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
//!    before this point leaves a torn tail that recovery moves into
//!    `quarantine/`. A failed write or fsync fails the group and every later
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

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::{LedgerError, Result};
use crate::files::{self, AppendFile, FileLayer, OsFiles};
use crate::id::{Id, IdPrefix, ObjectKind};
use crate::index::{self, EventIndex, Index, IndexItem, ObjLoc, Pos};
use crate::object::{check_ref_name, Event, EventEnvelope, Meta, NewEvent, RefUpdate, DELETED};
use crate::recovery::{self, Damage, ScanMode};
use crate::segment::{
    self, encode_record, RecordHeader, RecordType, FLAG_ZSTD, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
};
use crate::tree::{self, Tree, TreeEntry};

const FORMAT_FILE: &str = "FORMAT";
const FORMAT_TEXT: &str = "mass-ledger 1\n";
const LOCK_FILE: &str = "LOCK";
const SEGMENTS_DIR: &str = "segments";
const INDEX_DIR: &str = "index";
/// Where a rebuilt index is made before it replaces the old one.
const INDEX_NEW_DIR: &str = "index.new";
/// Bytes set aside by recovery or repair; never deleted by `mass`.
pub const QUARANTINE_DIR: &str = "quarantine";
/// The damaged ranges `repair` set aside, one JSON object per line.
const DAMAGED_FILE: &str = "damaged.jsonl";

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
    /// zstd level for blobs (file contents, messages): written once, read
    /// often, and the bulk of a ledger's bytes.
    pub blob_zstd_level: i32,
    /// Bodies shorter than this are stored as they are.
    pub compress_min: usize,
    /// The file layer the writer appends and syncs through (tests substitute
    /// one that simulates power loss).
    pub files: Arc<dyn FileLayer>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            segment_max: 256 << 20,
            zstd_level: 3,
            event_zstd_level: -1,
            blob_zstd_level: 9,
            compress_min: 128,
            files: Arc::new(OsFiles),
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
    /// Every ref's head at `durable_end`: what readers see.
    durable_heads: HashMap<String, Id>,
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
}

impl Group {
    /// An empty group starting at `off` of segment `seg`, or at the start of
    /// the next segment when that one is full.
    fn at(no: u64, seg: u32, off: u64, ordinal: u64, segment_max: u64) -> Group {
        let (seg, base) = if off >= segment_max {
            (seg + 1, SEGMENT_HEADER_LEN)
        } else {
            (seg, off)
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
/// are mostly the same entries (18 snapshots of one workspace share ~all).
type TreeBase = Arc<(Id, Vec<u8>)>;

/// An open ledger. Cheap to share between threads (`&Ledger` is `Sync`).
pub struct Ledger {
    dir: PathBuf,
    seg_dir: PathBuf,
    idx: Index,
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
    _lock: Option<File>,
}

/// Bytes recovery moved out of a segment into `quarantine/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAside {
    pub segment: u32,
    pub offset: u64,
    pub len: u64,
    /// The quarantine file that holds the bytes, relative to the ledger.
    pub file: PathBuf,
}

/// What opening found and did. Nothing in it is ever silent: the CLI prints
/// every field that is not empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Records indexed because the index had not caught up with the log.
    pub reindexed_records: u64,
    /// A torn tail (bytes no valid commit marker follows, so never
    /// acknowledged) moved into `quarantine/` and cut from the last segment.
    pub set_aside: Vec<SetAside>,
    /// Index tables that could not be used (damaged, or left over) and were
    /// replaced by scanning the log, with the reason.
    pub index_rebuilt: Option<String>,
    /// Damaged ranges found (read-only opens and repair step over them).
    pub damage: Vec<Damage>,
    /// Damaged ranges skipped because an earlier `repair` set them aside.
    pub known_damage: u64,
    /// Read-only opens: the index covers more than the log holds (a segment
    /// was cut or deleted: acknowledged data is missing). A writer refuses to
    /// open instead ([`LedgerError::LogBehindIndex`]).
    pub log_behind_index: Option<String>,
    /// Read-only opens: bytes at the end of the log past the last commit
    /// marker (a commit in progress, or a torn tail the next writer will set
    /// aside); not read.
    pub unread_tail: u64,
}

impl RecoveryReport {
    /// Bytes recovery moved into quarantine.
    pub fn set_aside_bytes(&self) -> u64 {
        self.set_aside.iter().map(|s| s.len).sum()
    }
}

impl Ledger {
    /// Creates a new, empty ledger in `dir` (which may exist but must be empty).
    pub fn init(dir: &Path) -> Result<Ledger> {
        Self::init_with(dir, Options::default())
    }

    pub fn init_with(dir: &Path, opts: Options) -> Result<Ledger> {
        if dir.join(FORMAT_FILE).exists() {
            return Err(LedgerError::AlreadyExists {
                path: dir.to_path_buf(),
            });
        }
        if let Ok(mut rd) = fs::read_dir(dir) {
            if rd.next().is_some() {
                return Err(LedgerError::AlreadyExists {
                    path: dir.to_path_buf(),
                });
            }
        }
        let seg_dir = dir.join(SEGMENTS_DIR);
        fs::create_dir_all(&seg_dir).map_err(|e| LedgerError::io(&seg_dir, e))?;
        create_segment(opts.files.as_ref(), &seg_dir, 1)?;
        // FORMAT is written last: a crash during init leaves no half-made ledger
        // that `open` would accept.
        let fmt = dir.join(FORMAT_FILE);
        files::write_durably(&fmt, FORMAT_TEXT.as_bytes()).map_err(|e| LedgerError::io(&fmt, e))?;
        Self::open_with(dir, opts)
    }

    /// Opens an existing ledger, taking the process lock and recovering after a crash.
    pub fn open(dir: &Path) -> Result<Ledger> {
        Self::open_with(dir, Options::default())
    }

    pub fn open_with(dir: &Path, opts: Options) -> Result<Ledger> {
        Self::open_inner(dir, opts, Open::Normal).map(|(l, _)| l)
    }

    /// Opens and reports what recovery did.
    pub fn open_reporting(dir: &Path) -> Result<(Ledger, RecoveryReport)> {
        Self::open_inner(dir, Options::default(), Open::Normal)
    }

    /// [`Ledger::open_reporting`] with options.
    pub fn open_reporting_with(dir: &Path, opts: Options) -> Result<(Ledger, RecoveryReport)> {
        Self::open_inner(dir, opts, Open::Normal)
    }

    /// Opens without the lock, changing nothing: the committed prefix of the
    /// log as it is now, indexed in memory. Works while another process
    /// writes, on a read-only copy, and past damaged records (which are
    /// reported in [`Ledger::recovery`], and whose objects are not found).
    /// Commits are refused.
    pub fn open_read_only(dir: &Path) -> Result<Ledger> {
        check_format(dir)?;
        let seg_dir = dir.join(SEGMENTS_DIR);
        let segs = list_segments_checked(&seg_dir)?;
        let set_aside = read_damaged(dir)?;
        let start = log_start(&segs);
        let mut index_note = None;
        let mut log_behind = None;
        let idx = match Index::open(&dir.join(INDEX_DIR), start, false) {
            Ok((idx, _)) => match log_shorter_than(&seg_dir, &segs, idx.end())? {
                // Tables that claim more than the log holds are not used:
                // the log itself is read, and the loss is reported.
                Some(why) => {
                    log_behind = Some(why);
                    Index::in_memory(start)
                }
                None => idx,
            },
            Err(why) => {
                index_note = Some(why);
                Index::in_memory(start)
            }
        };
        let out = recovery::scan_log(
            &seg_dir,
            &segs,
            &idx,
            idx.end(),
            &set_aside,
            ScanMode::Reader,
        )?;
        let report = RecoveryReport {
            reindexed_records: out.records,
            damage: out.damage,
            known_damage: out.skipped_set_aside,
            unread_tail: out.tail.as_ref().map_or(0, |t| t.len),
            index_rebuilt: index_note,
            log_behind_index: log_behind,
            ..Default::default()
        };
        let end = idx.end();
        Self::assemble(dir, idx, None, end.seg, end.off, report, Options::default())
    }

    /// Throws the index away and rebuilds it from the segment files. The new
    /// index is built beside the old one and replaces it only when complete,
    /// so a refused or killed rebuild leaves the old index as it was.
    /// Refuses (changing nothing) when the log has damage in the middle:
    /// that is `repair`'s job.
    pub fn reindex(dir: &Path) -> Result<(Ledger, RecoveryReport)> {
        Self::open_inner(dir, Options::default(), Open::Rebuild(ScanMode::Writer))
    }

    /// Rebuilds the index stepping over damaged records: every intact record
    /// is kept, each damaged range is copied into `quarantine/`, listed in
    /// `quarantine/damaged.jsonl` (so later scans step over it too) and
    /// reported. The segment files are not changed, except that a torn tail
    /// is moved into quarantine as on every open.
    pub fn repair(dir: &Path) -> Result<(Ledger, RecoveryReport)> {
        Self::open_inner(dir, Options::default(), Open::Rebuild(ScanMode::Repair))
    }

    /// What opening found and did.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// True when opened with [`Ledger::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn open_inner(dir: &Path, opts: Options, how: Open) -> Result<(Ledger, RecoveryReport)> {
        check_format(dir)?;
        let lock = take_lock(dir)?;
        let seg_dir = dir.join(SEGMENTS_DIR);
        let segs = list_segments_checked(&seg_dir)?;
        let index_dir = dir.join(INDEX_DIR);
        let new_dir = dir.join(INDEX_NEW_DIR);
        // A rebuild that was killed leaves a partial new index: derived data
        // that nothing points to. So is an index in the earlier sled format.
        if new_dir.exists() {
            fs::remove_dir_all(&new_dir).map_err(|e| LedgerError::io(&new_dir, e))?;
        }
        if index_dir.join("db").exists() {
            fs::remove_dir_all(&index_dir).map_err(|e| LedgerError::io(&index_dir, e))?;
        }
        let mut report = RecoveryReport::default();
        if let Open::Rebuild(mode) = how {
            report = rebuild_index(dir, &seg_dir, &segs, mode)?;
        }
        let start = log_start(&segs);
        let (idx, opened) =
            Index::open(&index_dir, start, true).map_err(|detail| LedgerError::Index { detail })?;
        if !opened.ignored.is_empty() {
            report.index_rebuilt = Some(
                opened
                    .ignored
                    .iter()
                    .map(|(p, why)| format!("{}: {why}", p.display()))
                    .collect::<Vec<_>>()
                    .join("; "),
            );
        }
        let set_aside = read_damaged(dir)?;
        let rec = recover(dir, &seg_dir, &segs, &idx, &set_aside)?;
        report.reindexed_records += rec.reindexed_records;
        report.set_aside.extend(rec.set_aside);
        report.known_damage += rec.known_damage;
        let last = *segs.last().unwrap_or(&1);
        let seg_path = segment::segment_path(&seg_dir, last);
        let file = opts
            .files
            .open_append(&seg_path)
            .map_err(|e| LedgerError::io(&seg_path, e))?;
        let offset = fs::metadata(&seg_path)
            .map_err(|e| LedgerError::io(&seg_path, e))?
            .len();
        let mut ledger = Self::assemble(dir, idx, Some(file), last, offset, report.clone(), opts)?;
        ledger._lock = Some(lock);
        Ok((ledger, report))
    }

    fn assemble(
        dir: &Path,
        idx: Index,
        file: Option<Box<dyn AppendFile>>,
        seg_no: u32,
        offset: u64,
        recovery: RecoveryReport,
        opts: Options,
    ) -> Result<Ledger> {
        let next_ordinal = idx.end().ordinal;
        let heads: HashMap<String, Id> = idx.refs().into_iter().collect();
        let read_only = file.is_none();
        Ok(Ledger {
            dir: dir.to_path_buf(),
            seg_dir: dir.join(SEGMENTS_DIR),
            idx,
            writer: Mutex::new(Writer {
                group: Group::at(1, seg_no, offset, next_ordinal, opts.segment_max),
                next_ordinal,
                heads: heads.clone(),
                head_info: HashMap::new(),
                unsynced: HashMap::new(),
                durable_heads: heads,
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
            _lock: None,
        })
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
        }
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
        let mut v: Vec<(String, Id)> = self
            .lock_writer()?
            .durable_heads
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        v.sort();
        Ok(v)
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

    /// True if the log holds an intact record for `id` where the index says:
    /// the whole record is read back and its checksum and header checked.
    /// Dedup asks this, never the index alone, so an index entry the log
    /// does not back (a cut or damaged segment) cannot turn a write into a
    /// no-op; the object is written again and the index points to the copy.
    fn backed(&self, id: &Id) -> Result<bool> {
        let Some(loc) = self.locate(id)? else {
            return Ok(false);
        };
        let f = self.reader(loc.seg)?;
        let path = segment::segment_path(&self.seg_dir, loc.seg);
        let total = (RECORD_HEADER_LEN + segment::RECORD_TRAILER_LEN) as u64
            + loc.body_len as u64
            + loc.meta_len as u64;
        Ok(
            match segment::read_record_at(&f, &path, loc.offset, total)? {
                Ok(rec) => rec.header.id == *id && rec.header.rtype == RecordType::Object(loc.kind),
                Err(_) => false,
            },
        )
    }

    /// Where an object is; an error saying why if it is not readable
    /// (`Corruption` for a damaged record a reader stepped over).
    pub fn require(&self, id: &Id) -> Result<ObjLoc> {
        self.locate(id)?.ok_or_else(|| self.missing(id))
    }

    pub fn kind_of(&self, id: &Id) -> Result<Option<ObjectKind>> {
        Ok(self.locate(id)?.map(|l| l.kind))
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
            .recovery
            .damage
            .iter()
            .find(|d| d.claimed_id.as_deref() == Some(hex.as_str()))
        {
            Some(d) => LedgerError::Corruption {
                id: *id,
                detail: format!(
                    "its record in segment {} at byte {} is damaged ({}); `mass repair` sets it aside",
                    d.segment, d.offset, d.reason
                ),
            },
            None => LedgerError::NotFound { prefix: hex },
        }
    }

    /// Reads, decompresses and hash-checks an object's canonical bytes.
    fn read_verified(&self, id: &Id, want: Option<ObjectKind>) -> Result<(ObjLoc, Vec<u8>)> {
        let loc = self.locate(id)?.ok_or_else(|| self.missing(id))?;
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
        let path = segment::segment_path(&self.seg_dir, loc.seg);
        let total = (RECORD_HEADER_LEN + segment::RECORD_TRAILER_LEN) as u64
            + loc.body_len as u64
            + loc.meta_len as u64;
        let rec = segment::read_record_at(&f, &path, loc.offset, total)?.map_err(|reason| {
            LedgerError::Corruption {
                id: *id,
                detail: format!("metadata record in segment {}: {reason}", loc.seg),
            }
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
                    .recovery
                    .damage
                    .iter()
                    .filter_map(|d| d.claimed_id.as_deref()?.parse::<Id>().ok())
                    .filter(|id| p.matches(id))
                    .collect();
                match claimed.as_slice() {
                    [id] => Ok(*id),
                    _ => Err(LedgerError::NotFound { prefix: p.hex }),
                }
            }
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
        let out = self.idx.referrers(id);
        let mut with_ord = Vec::with_capacity(out.len());
        for c in out {
            let ord = self.locate(&c)?.map(|l| l.ordinal).unwrap_or(u64::MAX);
            with_ord.push((ord, c));
        }
        with_ord.sort();
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

    pub(crate) fn segment_dir(&self) -> &Path {
        &self.seg_dir
    }

    /// The end of the durable, published log (scans stop there, so a commit
    /// in progress is never read half-written) and every ref's head at that moment,
    /// taken together (under the writer lock), so a scan up to that end can
    /// be compared with refs that no later commit has moved.
    pub(crate) fn committed_end_and_refs(&self) -> Result<(LogEnd, Vec<(String, Id)>)> {
        let w = self.lock_writer()?;
        let mut refs: Vec<(String, Id)> = w
            .durable_heads
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        refs.sort();
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
            let (flags, body) = match p.kind {
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
                    let plain = self.maybe_compress(self.opts.blob_zstd_level, &p.raw);
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
        // Compare-and-swap on refs, applied in order within the batch.
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
                    return Ok(Joined::Conflict { error, moved_by });
                }
                return Err(error);
            }
            heads_after.insert(&u.name, u.new);
        }
        // Dedup against what was written since `prepare` checked, and links:
        // they must resolve to stored objects (durable or not yet) or to
        // earlier batch members.
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
                if !written.contains(l) && !w.unsynced.contains_key(l) && !self.contains(l)? {
                    return Err(LedgerError::Dangling {
                        referrer: format!("{} {}", p.kind, p.id),
                        missing: *l,
                    });
                }
            }
            written.insert(p.id);
            fresh.push(e);
        }
        for u in &b.ref_updates {
            let Some(new) = u.new else { continue };
            if written.contains(&new) {
                continue;
            }
            let kind = match w.unsynced.get(&new) {
                Some(&(k, g)) => {
                    wait = wait.max(Some(g));
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
        // Several updates of one ref in a batch are one step in the operation
        // log: from the first expected head to the last new one.
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
        // Encode the ref updates before touching the group, so a failure
        // leaves it as it was.
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
            ref_records.push(encode_record(&header, &body, &[]));
        }
        // Join the open group.
        let no = w.group.no;
        let mut ordinal = w.next_ordinal;
        let mut last_plain_tree: Option<usize> = None;
        for e in &fresh {
            let p = &b.objects[e.at];
            let g = &mut w.group;
            let offset = g.base + g.buf.len() as u64;
            g.buf.extend_from_slice(&e.record);
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
        for (u, rec) in collapsed.iter().zip(&ref_records) {
            w.group.buf.extend_from_slice(rec);
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
            *lock_or_recover(&self.tree_base) = Some(Arc::new((p.id, p.raw.clone())));
        }
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
            let marker = commit_marker(w.group.records);
            // The next group starts where this one ends (or in a new segment).
            let end = w.group.base + (w.group.buf.len() + marker.len()) as u64;
            let next = Group::at(
                w.group.no + 1,
                w.group.seg,
                end,
                w.next_ordinal,
                self.opts.segment_max,
            );
            let mut g = std::mem::replace(&mut w.group, next);
            g.buf.extend_from_slice(&marker);
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
                        Some(new) => set(&mut w.durable_heads, name, *new),
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
        if self.idx.mem_objects() >= index::FLUSH_OBJECTS {
            // A table that cannot be written costs only memory and a longer
            // scan at the next open: the group is already durable.
            let _ = self.idx.flush();
        }
        Ok(g.no)
    }

    /// One `write` and one `fdatasync` of a sealed group, starting its
    /// segment first if it is a new one (every earlier group, so all of the
    /// previous segment, is already durable). On failure the group's bytes
    /// are cut off again where possible; they were never acknowledged.
    fn append_and_sync(&self, g: &Group) -> Result<()> {
        let mut a = lock_or_recover(&self.active);
        if a.seg_no != g.seg {
            let path = create_segment(self.opts.files.as_ref(), &self.seg_dir, g.seg)?;
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
        if let Err(e) = file.append(&g.buf).and_then(|_| file.sync_data()) {
            // The tail is uncommitted garbage at worst; try to drop it now, and stop
            // writing either way because the file's durable state is unknown.
            let _ = file.truncate(g.base);
            return Err(LedgerError::io(seg_path, e));
        }
        Ok(())
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
            let (base_id, base_raw) = (&b.0, &b.1);
            let delta = zstd::bulk::Compressor::with_dictionary(self.opts.zstd_level, base_raw)
                .and_then(|mut c| c.compress(raw));
            if let Ok(d) = delta {
                if d.len() + 32 < plain.1.len() / 2 {
                    let mut body = Vec::with_capacity(32 + d.len());
                    body.extend_from_slice(&base_id.0);
                    body.extend_from_slice(&d);
                    return (FLAG_ZSTD | segment::FLAG_DICT, body, Some(*base_id));
                }
            }
        }
        *base = Some(Arc::new((*id, raw.to_vec())));
        (plain.0, plain.1, None)
    }

    /// A delta body for blob `raw` against `similar` (or, if that is itself a
    /// delta, against its base: a base is never a delta), if it saves at
    /// least 1/8 of `plain_len`, the blob's plain compressed size (a delta
    /// costs one more read; an edited copy stored whole costs far more).
    fn blob_delta(&self, similar: Id, raw: &[u8], plain_len: usize) -> Option<Vec<u8>> {
        let loc = self.locate(&similar).ok()??;
        let base = if loc.flags & segment::FLAG_DICT != 0 {
            let f = self.reader(loc.seg).ok()?;
            let mut b = [0u8; 32];
            f.read_exact_at(&mut b, loc.offset + RECORD_HEADER_LEN as u64)
                .ok()?;
            Id(b)
        } else {
            similar
        };
        let (_, dict) = self.read_plain(&base, ObjectKind::Blob).ok()?;
        let d = zstd::bulk::Compressor::with_dictionary(self.opts.blob_zstd_level, &dict)
            .and_then(|mut c| c.compress(raw))
            .ok()?;
        if (d.len() + 32) * 8 >= plain_len * 7 {
            return None;
        }
        let mut body = Vec::with_capacity(32 + d.len());
        body.extend_from_slice(&base.0);
        body.extend_from_slice(&d);
        Some(body)
    }

    /// The latest plain tree in the ledger, read back.
    fn initial_tree_base(&self) -> Option<(Id, Vec<u8>)> {
        let id = self.idx.latest_trees().plain?;
        let (_, raw) = self.read_plain(&id, ObjectKind::Tree).ok()?;
        Some((id, raw))
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

/// One object's record (header, body, metadata, checksum): its position in
/// the log is not part of it, so it is built before the writer lock.
fn object_record(p: &Pending, flags: u8, body: &[u8]) -> (u32, Vec<u8>) {
    let header = RecordHeader {
        rtype: RecordType::Object(p.kind),
        flags,
        body_len: body.len() as u32,
        meta_len: p.meta.len() as u32,
        raw_len: p.raw.len() as u32,
        id: p.id,
    };
    (header.body_len, encode_record(&header, body, &p.meta))
}

/// The commit marker closing a group of `count` records.
fn commit_marker(count: u32) -> Vec<u8> {
    let header = RecordHeader {
        rtype: RecordType::Commit,
        flags: 0,
        body_len: 4,
        meta_len: 0,
        raw_len: 4,
        id: Id([0; 32]),
    };
    encode_record(&header, &count.to_le_bytes(), &[])
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
    record: Vec<u8>,
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
    /// open need not scan the log again. Derived data: a failure there
    /// costs only a longer scan.
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

    /// Adds a snapshot of `dir` (its blobs and tree) to the batch. A changed
    /// file is stored as a delta against the same path in the latest tree in
    /// the ledger when that is much smaller (a workspace's versions differ
    /// by small edits; without this every edited copy is stored whole).
    pub fn snapshot_dir(&mut self, dir: &Path) -> Result<Id> {
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
        let mut entries = Vec::new();
        for item in tree::walk(dir)? {
            let content = tree::read_item(&item)?;
            let (blob, size) = match item.kind {
                tree::EntryKind::Dir => ([0u8; 32], 0),
                _ => {
                    let id = self.put_blob(&content)?;
                    if let Some(p) = self.objects.last_mut() {
                        if p.id == id && parent.get(&item.rel) != Some(&id) {
                            p.similar = parent.get(&item.rel).copied();
                        }
                    }
                    (id.0, content.len() as u64)
                }
            };
            entries.push(TreeEntry {
                path: item.rel,
                kind: item.kind,
                mode: item.mode,
                size,
                blob,
            });
        }
        self.put_tree(&Tree::new(entries)?)
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
}

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

fn check_size(len: usize) -> Result<()> {
    if len as u64 >= segment::MAX_BODY_LEN {
        return Err(LedgerError::TooLarge {
            len: len as u64,
            limit: segment::MAX_BODY_LEN,
        });
    }
    Ok(())
}

/// How `open_inner` treats the index.
#[derive(Clone, Copy)]
enum Open {
    Normal,
    /// Build a new index from the whole log first, scanning in this mode.
    Rebuild(ScanMode),
}

fn check_format(dir: &Path) -> Result<()> {
    let fmt_path = dir.join(FORMAT_FILE);
    let fmt = match fs::read_to_string(&fmt_path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(LedgerError::NotALedger {
                path: dir.to_path_buf(),
            })
        }
        Err(e) => return Err(LedgerError::io(&fmt_path, e)),
    };
    if fmt != FORMAT_TEXT {
        return Err(LedgerError::UnsupportedFormat {
            path: fmt_path,
            found: fmt.trim().to_string(),
            supported: segment::FORMAT_VERSION,
        });
    }
    Ok(())
}

/// The segment numbers, which must run without gaps: a missing segment in
/// the middle is lost data, reported rather than read around.
fn list_segments_checked(seg_dir: &Path) -> Result<Vec<u32>> {
    let segs = segment::list_segments(seg_dir)?;
    let Some(&first) = segs.first() else {
        return Err(LedgerError::CorruptLog {
            path: seg_dir.to_path_buf(),
            offset: 0,
            detail: "no segment files".into(),
        });
    };
    for (i, &s) in segs.iter().enumerate() {
        let want = first + i as u32;
        if s != want {
            return Err(LedgerError::LogBehindIndex {
                detail: format!(
                    "segment {want} is missing from {} (found {} next); restore it from a backup",
                    seg_dir.display(),
                    s
                ),
            });
        }
    }
    Ok(segs)
}

/// Where the log starts: the first record of the first segment.
fn log_start(segs: &[u32]) -> Pos {
    Pos {
        seg: segs.first().copied().unwrap_or(1),
        off: SEGMENT_HEADER_LEN,
        ordinal: 0,
    }
}

/// `Some(reason)` if the log ends before `pos` (a segment the index covers
/// is missing or shorter than the index says): acknowledged data is gone.
fn log_shorter_than(seg_dir: &Path, segs: &[u32], pos: Pos) -> Result<Option<String>> {
    let path = segment::segment_path(seg_dir, pos.seg);
    if !segs.contains(&pos.seg) {
        return Ok(Some(format!(
            "the index covers segment {} up to byte {}, but {} is missing",
            pos.seg,
            pos.off,
            path.display()
        )));
    }
    let len = fs::metadata(&path)
        .map_err(|e| LedgerError::io(&path, e))?
        .len();
    Ok((len < pos.off).then(|| {
        format!(
            "{} holds {len} bytes but the index covers {}: {} bytes of acknowledged data are missing",
            path.display(),
            pos.off,
            pos.off - len
        )
    }))
}

/// Brings the index up to the end of the committed log. First checks that
/// the log still holds everything the index says it does (a log shorter than
/// the index means acknowledged data is gone, and is reported, never
/// re-indexed over); then indexes committed records past the index's end and
/// moves a torn tail into quarantine.
fn recover(
    dir: &Path,
    seg_dir: &Path,
    segs: &[u32],
    idx: &Index,
    set_aside: &[Damage],
) -> Result<RecoveryReport> {
    if let Some(detail) = log_shorter_than(seg_dir, segs, idx.end())? {
        return Err(LedgerError::LogBehindIndex { detail });
    }
    let out = recovery::scan_log(seg_dir, segs, idx, idx.end(), set_aside, ScanMode::Writer)?;
    let mut report = RecoveryReport {
        reindexed_records: out.records,
        known_damage: out.skipped_set_aside,
        ..Default::default()
    };
    if let Some(t) = &out.tail {
        report.set_aside.push(quarantine_tail(dir, seg_dir, t)?);
    }
    Ok(report)
}

/// Builds a new index from the whole log beside the old one, then swaps it in.
fn rebuild_index(
    dir: &Path,
    seg_dir: &Path,
    segs: &[u32],
    mode: ScanMode,
) -> Result<RecoveryReport> {
    let new_dir = dir.join(INDEX_NEW_DIR);
    if new_dir.exists() {
        fs::remove_dir_all(&new_dir).map_err(|e| LedgerError::io(&new_dir, e))?;
    }
    let set_aside = read_damaged(dir)?;
    let start = log_start(segs);
    let mut report = RecoveryReport::default();
    {
        let (idx, _) =
            Index::open(&new_dir, start, true).map_err(|detail| LedgerError::Index { detail })?;
        let scanned = recovery::scan_log(seg_dir, segs, &idx, start, &set_aside, mode);
        let out = match scanned {
            Ok(out) => out,
            Err(e) => {
                drop(idx);
                let _ = fs::remove_dir_all(&new_dir);
                return Err(e);
            }
        };
        report.reindexed_records = out.records;
        report.known_damage = out.skipped_set_aside;
        if !out.damage.is_empty() {
            for d in &out.damage {
                copy_to_quarantine(dir, seg_dir, d.segment, d.offset, d.len, "damaged")?;
            }
            append_damaged(dir, &out.damage)?;
            report.damage = out.damage;
        }
        if let Some(t) = &out.tail {
            report.set_aside.push(quarantine_tail(dir, seg_dir, t)?);
        }
        idx.flush()
            .map_err(|detail| LedgerError::Index { detail })?;
        // An empty log leaves no table; the (empty) index is still swapped in.
        fs::create_dir_all(&new_dir).map_err(|e| LedgerError::io(&new_dir, e))?;
    }
    let index_dir = dir.join(INDEX_DIR);
    if index_dir.exists() {
        fs::remove_dir_all(&index_dir).map_err(|e| LedgerError::io(&index_dir, e))?;
    }
    fs::rename(&new_dir, &index_dir).map_err(|e| LedgerError::io(&index_dir, e))?;
    files::sync_dir(dir).map_err(|e| LedgerError::io(dir, e))?;
    Ok(report)
}

/// Copies `len` bytes at `offset` of a segment into a new file under
/// `quarantine/` (durably) and returns its path relative to the ledger.
fn copy_to_quarantine(
    dir: &Path,
    seg_dir: &Path,
    seg: u32,
    offset: u64,
    len: u64,
    what: &str,
) -> Result<PathBuf> {
    let path = segment::segment_path(seg_dir, seg);
    let f = File::open(&path).map_err(|e| LedgerError::io(&path, e))?;
    let mut bytes = vec![0u8; len as usize];
    f.read_exact_at(&mut bytes, offset)
        .map_err(|e| LedgerError::io(&path, e))?;
    let qdir = dir.join(QUARANTINE_DIR);
    fs::create_dir_all(&qdir).map_err(|e| LedgerError::io(&qdir, e))?;
    // The content hash keeps two set-asides at the same place (two crashes
    // at one offset) from overwriting each other.
    let short = &blake3::hash(&bytes).to_hex()[..12];
    let rel = PathBuf::from(QUARANTINE_DIR).join(format!("{seg:08}-{offset}-{what}-{short}.bin"));
    let full = dir.join(&rel);
    if !full.exists() {
        files::write_durably(&full, &bytes).map_err(|e| LedgerError::io(&full, e))?;
    }
    Ok(rel)
}

/// Moves a torn tail into quarantine: copy (durably), then cut it off.
fn quarantine_tail(dir: &Path, seg_dir: &Path, t: &recovery::Tail) -> Result<SetAside> {
    let file = copy_to_quarantine(dir, seg_dir, t.segment, t.offset, t.len, "tail")?;
    let path = segment::segment_path(seg_dir, t.segment);
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| LedgerError::io(&path, e))?;
    f.set_len(t.offset)
        .and_then(|_| f.sync_all())
        .map_err(|e| LedgerError::io(&path, e))?;
    Ok(SetAside {
        segment: t.segment,
        offset: t.offset,
        len: t.len,
        file,
    })
}

/// The damaged ranges an earlier `repair` set aside.
pub(crate) fn read_damaged(dir: &Path) -> Result<Vec<Damage>> {
    let path = dir.join(QUARANTINE_DIR).join(DAMAGED_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LedgerError::io(&path, e)),
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(line).map_err(|e| LedgerError::CorruptLog {
                path: path.clone(),
                offset: i as u64 + 1,
                detail: format!("line {} is not a damaged-range record: {e}", i + 1),
            })?,
        );
    }
    Ok(out)
}

/// Adds ranges to `quarantine/damaged.jsonl` (rewritten atomically with the
/// old lines first: the list only grows).
fn append_damaged(dir: &Path, new: &[Damage]) -> Result<()> {
    let mut all = read_damaged(dir)?;
    for d in new {
        if !all
            .iter()
            .any(|o| o.segment == d.segment && o.offset == d.offset)
        {
            all.push(d.clone());
        }
    }
    let mut text = String::new();
    for d in &all {
        text.push_str(&serde_json::to_string(d).map_err(LedgerError::index)?);
        text.push('\n');
    }
    let qdir = dir.join(QUARANTINE_DIR);
    fs::create_dir_all(&qdir).map_err(|e| LedgerError::io(&qdir, e))?;
    let path = qdir.join(DAMAGED_FILE);
    files::write_durably(&path, text.as_bytes()).map_err(|e| LedgerError::io(&path, e))
}

fn take_lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| LedgerError::io(&path, e))?;
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut s = String::new();
            let _ = f.read_to_string(&mut s);
            let pid = s.trim().to_string();
            return Err(LedgerError::Locked {
                path: dir.to_path_buf(),
                pid: if pid.is_empty() {
                    "unknown".into()
                } else {
                    pid
                },
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(LedgerError::io(&path, e)),
    }
    f.set_len(0)
        .and_then(|_| f.write_all(format!("{}\n", std::process::id()).as_bytes()))
        .map_err(|e| LedgerError::io(&path, e))?;
    Ok(f)
}

fn create_segment(files: &dyn FileLayer, seg_dir: &Path, seg_no: u32) -> Result<PathBuf> {
    let path = segment::segment_path(seg_dir, seg_no);
    files
        .create_durably(&path, &segment::segment_header(seg_no))
        .map_err(|e| LedgerError::io(&path, e))?;
    Ok(path)
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
