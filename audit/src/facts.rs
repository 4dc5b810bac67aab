//! What `mass report` reads of each stream of a run, folded once per
//! stream head and kept: the **report projection**.
//!
//! A stream's facts (the stream its head event names, its successful model
//! calls and their usage, its judgments' verdicts, and, when its head is a
//! rollout, what `mass runs` shows of it) are a function of the head's id
//! alone: events are immutable and content-addressed, and so is everything
//! a chain reaches; nothing kept is read from metadata, which ids do not
//! cover (whether a rollout's 0 of 0 was recorded is read at each
//! listing). So they can be kept, keyed by that id, and reused
//! until the head moves. Reading a 1M-event run's streams took ~15 s
//! (`cargo bench --bench why`); reading its kept facts is a file read.
//!
//! The projection is derived data, like the index: a file per run in
//! `LEDGER/cache/report/` (see `ledger/FORMAT.md`), rewritten whole (temp
//! file, then rename) by each report whose facts changed, holding the facts
//! of the run's current heads only. A file that fails any check (magic,
//! the fold's key, the BLAKE3 footer, rkyv's validation) is ignored and
//! folded again, never trusted in part; one that cannot be written (a
//! read-only ledger) is skipped. The key covers the source of every file
//! a fold runs code from (this module, `lib.rs`, `report.rs`, the schemas
//! crate, `ledger`'s `object.rs`: [`FOLD_SOURCES`]), so a build that folds
//! differently never reads another build's facts.
//! `mass report --fresh` folds every stream again from the ledger (a kept
//! fact never hides damage a fresh fold would meet).

use std::io::Write;
use std::path::{Path, PathBuf};

use ledger::{Event, Id, Ledger};
use rkyv::rancor;
use schemas::{Decodable, Effect, EffectStatus, GuardCheck, Judgment, Rollout};

use super::{decode, id_of};
use engine::error::{EngineError, Result};

/// What a rollout event says of itself, as `mass runs` lists it (before
/// the run's rankings and selections are looked up).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub(crate) struct RolloutHead {
    pub(crate) task: String,
    pub(crate) cycle: u32,
    pub(crate) index: u32,
    pub(crate) purpose: String,
    pub(crate) status: String,
    /// The hidden checks' counts as the event holds them. Whether a 0 of 0
    /// was recorded is the event's metadata, which its id does not cover
    /// (two ledgers may hold one rollout with and without the mark), so it
    /// is read at each listing, never kept.
    pub(crate) score_passed: u32,
    pub(crate) score_total: u32,
    pub(crate) model: String,
    /// A guard flagged it and the experiment excluded such runs.
    pub(crate) guard_excluded: bool,
}

/// One verdict: task, winner (`a`, `b`, `tie`, or what the judge failed
/// with) and whether run `b` was shown first.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    pub(crate) task: String,
    pub(crate) winner: String,
    pub(crate) swapped: bool,
}

/// Template parity of one model's calls in a stream.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub(crate) struct ParityCount {
    pub(crate) model: String,
    pub(crate) calls: u32,
    pub(crate) equal: u32,
}

/// Everything `mass report` counts of one stream, from its head back.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq, Default)]
pub(crate) struct StreamFacts {
    /// The stream the head event names (relative to its run): a ref under
    /// a run whose head names another stream is not one of its streams.
    pub(crate) stream: String,
    /// Model calls (`model`, `judge`, `optimizer` effects) that succeeded,
    /// and the usage they reported.
    pub(crate) calls: u32,
    pub(crate) prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
    /// Per model the trainer's side counted prompts for.
    pub(crate) parity: Vec<ParityCount>,
    /// Every judgment of the stream, from the head back.
    pub(crate) verdicts: Vec<Verdict>,
    /// The head, when it is a rollout.
    pub(crate) rollout: Option<RolloutHead>,
}

/// Folds the stream whose head event is `head`: reads every event of it
/// once, and each successful model call's output.
pub(crate) fn fold(l: &Ledger, head: &Event) -> Result<StreamFacts> {
    let mut f = StreamFacts {
        stream: head.stream.clone(),
        rollout: rollout_head(l, head)?,
        ..StreamFacts::default()
    };
    count_event(l, head, &mut f)?;
    if let Some(prev) = head.prev {
        for ev in l.chain(prev) {
            count_event(l, &ev?, &mut f)?;
        }
    }
    Ok(f)
}

/// What one event adds: a model call's usage, a judgment's verdict.
fn count_event(l: &Ledger, ev: &Event, f: &mut StreamFacts) -> Result<()> {
    if ev.kind == <Effect as Decodable>::KIND && ev.version == <Effect as Decodable>::VERSION {
        count_model_call(l, ev, f)?;
    }
    if ev.kind == <Judgment as Decodable>::KIND {
        let j: Judgment = decode(ev)?;
        f.verdicts.push(Verdict {
            task: j.task,
            winner: j.winner,
            swapped: j.swapped,
        });
    }
    Ok(())
}

/// Adds an effect's usage when it is a model call that succeeded.
fn count_model_call(l: &Ledger, ev: &Event, f: &mut StreamFacts) -> Result<()> {
    let e: Effect = decode(ev)?;
    // Model calls are recorded as `model` (team), `judge` and
    // `optimizer` effects; each output carries the usage.
    let call = matches!(e.effect.as_str(), "model" | "judge" | "optimizer");
    let (true, Some(output)) = (call && e.status == EffectStatus::Ok, e.output) else {
        return Ok(());
    };
    let o = super::report::OutputFigures::of(&l.get_blob(&id_of(output))?)?;
    f.calls += 1;
    f.prompt_tokens += o.prompt_tokens.unwrap_or(0);
    f.completion_tokens += o.completion_tokens.unwrap_or(0);
    // Counted on the trainer's side too: does the server render the
    // prompt as the trainer does?
    if let Some(model) = o.trainer_model {
        let i = match f.parity.iter().position(|p| p.model == model) {
            Some(i) => i,
            None => {
                f.parity.push(ParityCount {
                    model,
                    calls: 0,
                    equal: 0,
                });
                f.parity.len() - 1
            }
        };
        let p = &mut f.parity[i];
        p.calls += 1;
        if o.prompt_tokens.is_some() && o.trainer_prompt_tokens == o.prompt_tokens {
            p.equal += 1;
        }
    }
    Ok(())
}

/// What rollout event `ev` says of itself; `None` when it is no rollout.
pub(crate) fn rollout_head(l: &Ledger, ev: &Event) -> Result<Option<RolloutHead>> {
    if ev.kind != <Rollout as Decodable>::KIND {
        return Ok(None);
    }
    let r: Rollout = decode(ev)?;
    let mut guard_excluded = false;
    for p in &ev.parents {
        let p = l.get_event(p)?;
        if p.kind == <GuardCheck as Decodable>::KIND {
            let g: GuardCheck = decode(&p)?;
            guard_excluded |= !g.violations.is_empty() && g.action == "exclude";
        }
    }
    Ok(Some(RolloutHead {
        score_passed: r.score_passed,
        score_total: r.score_total,
        task: r.task,
        cycle: r.cycle,
        index: r.index,
        purpose: r.purpose,
        status: r.status,
        model: r.orchestrator_model,
        guard_excluded,
    }))
}

/// Whether a report reads kept facts or folds every stream again.
// The hidden variant is a test-only switch, not a marker that more modes
// may come.
#[allow(clippy::manual_non_exhaustive)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Reads the run's projection file, folds the streams it lacks, and
    /// writes it back when that added or dropped any.
    Kept,
    /// Folds every stream from the ledger; writes the result as the new
    /// projection.
    Fresh,
    /// Folds every stream and touches no file (a read-only caller, tests'
    /// oracle).
    Off,
    /// Test-only: [`Mode::Kept`] without the file's footer and fold-key
    /// checks (the protection off), so a test can show what they catch.
    #[doc(hidden)]
    KeptUnchecked,
}

/// One stream's facts as a report holds them: read in place from the
/// projection file, or folded now.
pub(crate) enum Facts<'k> {
    Kept(&'k ArchivedStreamFacts),
    Folded(Box<StreamFacts>),
}

impl Facts<'_> {
    pub(crate) fn calls(&self) -> u32 {
        match self {
            Facts::Kept(f) => f.calls.to_native(),
            Facts::Folded(f) => f.calls,
        }
    }

    /// Prompt and completion tokens.
    pub(crate) fn tokens(&self) -> (u64, u64) {
        match self {
            Facts::Kept(f) => (f.prompt_tokens.to_native(), f.completion_tokens.to_native()),
            Facts::Folded(f) => (f.prompt_tokens, f.completion_tokens),
        }
    }

    /// Each model's template parity: model, calls, equal.
    pub(crate) fn each_parity(&self, mut each: impl FnMut(&str, u32, u32)) {
        match self {
            Facts::Kept(f) => f
                .parity
                .iter()
                .for_each(|p| each(p.model.as_str(), p.calls.to_native(), p.equal.to_native())),
            Facts::Folded(f) => f
                .parity
                .iter()
                .for_each(|p| each(&p.model, p.calls, p.equal)),
        }
    }

    /// Each verdict: task, winner, swapped.
    pub(crate) fn each_verdict(&self, mut each: impl FnMut(&str, &str, bool)) {
        match self {
            Facts::Kept(f) => f
                .verdicts
                .iter()
                .for_each(|v| each(v.task.as_str(), v.winner.as_str(), v.swapped)),
            Facts::Folded(f) => f
                .verdicts
                .iter()
                .for_each(|v| each(&v.task, &v.winner, v.swapped)),
        }
    }

    /// What the head says of itself when it is a rollout.
    pub(crate) fn rollout(&self) -> Result<Option<RolloutHead>> {
        match self {
            Facts::Kept(f) => f.rollout.as_ref().map(deserialize).transpose(),
            Facts::Folded(f) => Ok(f.rollout.clone()),
        }
    }

    fn to_owned(&self) -> Result<StreamFacts> {
        match self {
            Facts::Kept(f) => deserialize(*f),
            Facts::Folded(f) => Ok(f.as_ref().clone()),
        }
    }
}

fn deserialize<T, A>(a: &A) -> Result<T>
where
    A: rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    rkyv::deserialize::<T, rancor::Error>(a)
        .map_err(|e| EngineError::Invalid(format!("report projection: {e}")))
}

/// A run's projection file as read: its bytes, aligned for rkyv.
pub(crate) struct KeptFile {
    bytes: rkyv::util::AlignedVec<16>,
}

impl KeptFile {
    /// The file of run `run`, when `mode` reads one and it passes every
    /// check but rkyv's (see [`KeptFile::entries`]).
    pub(crate) fn read(l: &Ledger, run: &str, mode: Mode) -> Option<KeptFile> {
        let checked = match mode {
            Mode::Kept => true,
            Mode::KeptUnchecked => false,
            Mode::Fresh | Mode::Off => return None,
        };
        let raw = std::fs::read(path_of(l.dir(), run)).ok()?;
        let body_end = raw.len().checked_sub(32)?;
        let (body, footer) = raw.split_at(body_end);
        if body.len() < 40 || (checked && blake3::hash(body).as_bytes() != footer) {
            return None;
        }
        let (head, payload) = body.split_at(40);
        if checked && (&head[..8] != MAGIC || head[8..40] != fold_key()) {
            return None;
        }
        let mut bytes = rkyv::util::AlignedVec::<16>::with_capacity(payload.len());
        bytes.extend_from_slice(payload);
        Some(KeptFile { bytes })
    }

    /// The entries, validated by rkyv once (`None` when they fail).
    pub(crate) fn entries(&self) -> Option<&[ArchivedEntry]> {
        rkyv::access::<rkyv::Archived<Vec<Entry>>, rancor::Error>(&self.bytes)
            .ok()
            .map(|v| v.as_slice())
    }
}

/// A run's stream facts as one report uses them.
pub(crate) struct Projection<'k> {
    path: Option<PathBuf>,
    /// The kept facts, in the order they were used: by ref name.
    kept: &'k [ArchivedEntry],
    /// How many kept facts were reused.
    reused: usize,
    used: Vec<(Id, Facts<'k>)>,
    folded: usize,
}

impl<'k> Projection<'k> {
    /// The projection of run `run` in ledger `l`, as `mode` says, with the
    /// entries of its file (empty: none read).
    pub(crate) fn open(l: &Ledger, run: &str, mode: Mode, kept: &'k [ArchivedEntry]) -> Self {
        Projection {
            path: (mode != Mode::Off).then(|| path_of(l.dir(), run)),
            kept,
            reused: 0,
            used: Vec::new(),
            folded: 0,
        }
    }

    /// The streams of run `run` (as `run_streams` lists them: each ref
    /// under the run whose head names its stream), by name; their facts
    /// are [`Projection::used`], in the same order. Kept facts are walked
    /// beside the refs (both are in name order), and one is reused only
    /// for the same stream at the same head.
    pub(crate) fn run_streams(&mut self, l: &Ledger, run: &str) -> Result<Vec<(String, Id)>> {
        let prefix = format!("{run}/");
        // Each ref: its kept facts, or the number of its fold (`todo`).
        let mut slots: Vec<(String, Id, Result<&'k ArchivedStreamFacts, usize>)> = Vec::new();
        let mut todo = Vec::new();
        let mut kept = self.kept.iter().peekable();
        for (mut name, head) in l.refs_under(&prefix)? {
            if !name.starts_with(&prefix) {
                continue;
            }
            name.drain(..prefix.len());
            let rel = name.as_str();
            while kept.next_if(|e| e.facts.stream.as_str() < rel).is_some() {}
            let slot = match kept.next_if(|e| e.facts.stream == rel && e.id == head.0) {
                Some(e) => Ok(&e.facts),
                None => {
                    todo.push((rel.to_string(), head));
                    Err(todo.len() - 1)
                }
            };
            slots.push((name, head, slot));
        }
        let mut folded = fold_all(l, &todo)?;
        let mut out = Vec::with_capacity(slots.len());
        for (name, head, slot) in slots {
            let f = match slot {
                Ok(k) => {
                    self.reused += 1;
                    Facts::Kept(k)
                }
                // A head naming another stream: not a stream of the run.
                Err(j) => match folded.get_mut(j).and_then(Option::take) {
                    Some(f) => {
                        self.folded += 1;
                        Facts::Folded(Box::new(f))
                    }
                    None => continue,
                },
            };
            out.push((name, head));
            self.used.push((head, f));
        }
        Ok(out)
    }

    /// The facts of the streams [`Projection::run_streams`] listed.
    pub(crate) fn used(&self) -> &[(Id, Facts<'k>)] {
        &self.used
    }

    /// Writes the facts used back when any was folded now or any kept one
    /// went unused (a head that moved, a stream removed); an error writing
    /// is ignored: the projection is only ever a shortcut.
    pub(crate) fn close(self) {
        let Some(path) = self.path else { return };
        if self.folded == 0 && self.reused == self.kept.len() {
            return;
        }
        let _ = store(&path, &self.used);
    }
}

/// Folds the streams `todo` names (relative name, head) on as many threads
/// as there are cores, each taking the next batch of streams as it
/// finishes one: streams are independent, and the first report of a run
/// folds all of them (1M events: 5.7 s on one thread). In `todo`'s order;
/// `None` for a head that names another stream (no stream of the run).
fn fold_all(l: &Ledger, todo: &[(String, Id)]) -> Result<Vec<Option<StreamFacts>>> {
    const BATCH: usize = 256;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads == 1 || todo.len() <= BATCH {
        return todo
            .iter()
            .map(|(rel, head)| fold_named(l, rel, *head))
            .collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let batches: Vec<_> = todo.chunks(BATCH).collect();
    type Folded = Result<Vec<Option<StreamFacts>>>;
    let mut done: Vec<(usize, Folded)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.min(batches.len()))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let b = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(batch) = batches.get(b) else {
                            return mine;
                        };
                        let facts: Folded = batch
                            .iter()
                            .map(|(rel, head)| fold_named(l, rel, *head))
                            .collect();
                        mine.push((b, facts));
                    }
                })
            })
            .collect();
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.join().map_err(|_| {
                EngineError::Invalid("a thread folding report facts panicked".into())
            })?);
        }
        Ok::<_, EngineError>(all)
    })?;
    // In `todo`'s order, so a damaged stream's error is the first one's,
    // as a fold on one thread would meet it.
    done.sort_by_key(|(b, _)| *b);
    let mut out = Vec::with_capacity(todo.len());
    for (_, facts) in done {
        out.extend(facts?);
    }
    Ok(out)
}

/// The facts of stream `rel` at `head`; `None` when the head names
/// another stream.
fn fold_named(l: &Ledger, rel: &str, head: Id) -> Result<Option<StreamFacts>> {
    let ev = l.get_event(&head)?;
    if ev.stream != rel {
        return Ok(None);
    }
    fold(l, &ev).map(Some)
}

/// Removes run `run`'s kept facts, if it has any: what `mass runs rm`
/// does, so that a removed run's projection does not stay in
/// `cache/report/`. Kept facts are derived data, folded again by the next
/// report that needs them; nothing recorded is touched.
pub(crate) fn forget(l: &Ledger, run: &str) -> std::io::Result<()> {
    match std::fs::remove_file(path_of(l.dir(), run)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// `LEDGER/cache/report/HEX.facts`, HEX the first 16 bytes of the BLAKE3
/// of the run's name (names may hold `/`).
fn path_of(dir: &Path, run: &str) -> PathBuf {
    let h = blake3::hash(run.as_bytes());
    let name: String = h.as_bytes()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    dir.join("cache")
        .join("report")
        .join(format!("{name}.facts"))
}

const MAGIC: &[u8; 8] = b"MASSFCT1";

/// Every source file whose code a fold runs, by path from the workspace
/// root, sorted: this module (the fold, the file's layout), `lib.rs`
/// (`decode`), `report.rs` (`OutputFigures::of`: a call's usage),
/// `ledger`'s `object.rs` (events as decoded) and every file of
/// the schemas crate (each record's decoding, older versions upgraded). A
/// change to any of them may change what a fold gives, so it changes the
/// key (a test reads the schemas crate's files: one added there must be
/// listed here).
const FOLD_SOURCES: [(&str, &[u8]); 10] = [
    ("audit/src/facts.rs", include_bytes!("facts.rs")),
    ("audit/src/lib.rs", include_bytes!("lib.rs")),
    ("audit/src/report.rs", include_bytes!("report.rs")),
    (
        "ledger/src/object.rs",
        include_bytes!("../../ledger/src/object.rs"),
    ),
    (
        "schemas/src/hash.rs",
        include_bytes!("../../schemas/src/hash.rs"),
    ),
    (
        "schemas/src/lib.rs",
        include_bytes!("../../schemas/src/lib.rs"),
    ),
    (
        "schemas/src/mass.rs",
        include_bytes!("../../schemas/src/mass.rs"),
    ),
    (
        "schemas/src/mass/outcomes.rs",
        include_bytes!("../../schemas/src/mass/outcomes.rs"),
    ),
    (
        "schemas/src/records.rs",
        include_bytes!("../../schemas/src/records.rs"),
    ),
    (
        "schemas/src/registry.rs",
        include_bytes!("../../schemas/src/registry.rs"),
    ),
];

/// The fold's key: the format's name and every source a fold runs
/// ([`FOLD_SOURCES`]: each path, a zero byte, its length as a u64 LE, its
/// bytes), so facts folded by other code are never read.
fn fold_key() -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"mass report facts, format 1\n");
    for (path, bytes) in FOLD_SOURCES {
        h.update(path.as_bytes());
        h.update(&[0]);
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    *h.finalize().as_bytes()
}

/// One stored entry: a stream head's id and its facts.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    id: [u8; 32],
    facts: StreamFacts,
}

fn store(path: &Path, used: &[(Id, Facts<'_>)]) -> Result<()> {
    let entries = used
        .iter()
        .map(|(id, f)| {
            Ok(Entry {
                id: id.0,
                facts: f.to_owned()?,
            })
        })
        .collect::<Result<Vec<Entry>>>()?;
    let payload = rkyv::to_bytes::<rancor::Error>(&entries)
        .map_err(|e| EngineError::Invalid(format!("report projection: {e}")))?;
    let mut bytes = Vec::with_capacity(payload.len() + 72);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&fold_key());
    bytes.extend_from_slice(&payload);
    let footer = blake3::hash(&bytes);
    bytes.extend_from_slice(footer.as_bytes());
    let io = |e: std::io::Error| EngineError::Invalid(format!("{}: {e}", path.display()));
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    // A temp file per writer, renamed over the old one: a reader sees the
    // old file or the new one whole (a torn one fails its footer).
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    tmp.write_all(&bytes).map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}
