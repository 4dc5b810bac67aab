//! `import`: run folders of the reference implementation of MASS
//! (SakanaAI/mass, Python) become runs in the ledger, in the event shapes
//! the engine records, so `mass why`, `report`, `diff` and `export tables`
//! read them unchanged, and an imported cycle can be judged again by
//! another judge (`engine::rejudge_imported`: an import drives nothing).
//!
//! An import has three steps, and only the last writes:
//!
//! 1. **plan** (`plan.rs`, `reference.rs`, `fsread.rs`, and
//!    `evaluation.rs` for the external judges' verdicts): the whole folder
//!    is read beneath a directory descriptor without following links,
//!    within caps, parsed and cross-checked; every secret it holds is
//!    learnt (`secrets.rs`). Any problem is an [`ImportError`] naming the
//!    file and line.
//! 2. **build** (`stages.rs`, `episodes.rs`, `evaluation.rs`,
//!    `objects.rs`): every blob and event is made in memory with its id,
//!    scrubbed, its time taken from the reference's files (never the
//!    import's clock), so the same folder always gives the same objects
//!    and the same head.
//! 3. **write**: one batch with every object and every ref, committed
//!    once. A run already holding exactly this head is left alone (the
//!    second import of a folder writes nothing); a run of that name with
//!    another head is refused.

mod episodes;
mod error;
mod evaluation;
pub mod fixture;
mod fsread;
mod objects;
mod plan;
mod reference;
mod secrets;
mod stages;

use std::path::Path;

use ledger::{Id, Ledger, Meta, ObjectKind, NOT_RECORDED, WALL_MS_FROM};

pub use error::{ImportError, Result};
pub use fsread::Caps;
pub use secrets::Scrubber;
pub use stages::DRIVER;

/// How to import.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub caps: Caps,
    /// Test-only: records secrets as found (to see the secret tests fail).
    #[doc(hidden)]
    pub unscrubbed_for_tests: bool,
}

/// What an import did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The run was written: its head, and what it holds.
    Imported {
        head: Id,
        episodes: usize,
        objects: usize,
        /// See `AlreadyImported`.
        unmarked: usize,
    },
    /// The run already held exactly this import: nothing written.
    AlreadyImported {
        head: Id,
        /// Events of the import the ledger held before without the marks
        /// this import gives them (`ledger::WALL_MS_FROM`,
        /// `ledger::NOT_RECORDED`: written by an older mass). A ledger
        /// keeps an event's first metadata (ids do not cover it), so their
        /// stand-in times and placeholders still read as measured, and no
        /// import into this ledger can mark them.
        unmarked: usize,
    },
}

/// The default run name for folder `dir`: its last component, with
/// characters a run name cannot hold replaced by `-`.
pub fn default_name(dir: &Path) -> String {
    let base = dir
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_start_matches('.').to_string();
    if name.is_empty() {
        "sakana-run".into()
    } else {
        name
    }
}

/// A run folder read, checked and turned into objects, not yet written.
#[derive(Debug)]
pub struct Prepared {
    objects: objects::Objects,
    head: Id,
    episodes: usize,
}

/// Steps 1 and 2: reads and checks run folder `dir` and builds every
/// object of its import. Touches no ledger.
pub fn prepare(dir: &Path, opts: &Options) -> Result<Prepared> {
    let mut p = plan::plan(dir, opts.caps)?;
    if opts.unscrubbed_for_tests {
        p.scrub.disable_for_tests();
    }
    let objects = stages::build(&p)?;
    let head = objects
        .head(objects::MAIN)
        .ok_or_else(|| ImportError::invalid("config.json", 1, "nothing to import"))?;
    // The ledger refuses a body this long only inside the commit; checked
    // here, before any ledger is opened or made.
    if let Some(big) = objects
        .objs
        .iter()
        .find(|o| o.raw.len() as u64 >= ledger::MAX_BODY_LEN)
    {
        return Err(ImportError::TooLarge {
            file: dir.display().to_string(),
            what: format!("an object of the import ({} bytes)", big.raw.len()),
            cap: ledger::MAX_BODY_LEN - 1,
        });
    }
    Ok(Prepared {
        objects,
        head,
        episodes: p.episodes.len(),
    })
}

/// Imports run folder `dir` as run `run` of `ledger`, all or nothing.
pub fn import(ledger: &Ledger, dir: &Path, run: &str, opts: &Options) -> Result<Outcome> {
    prepare(dir, opts)?.write(ledger, run)
}

impl Prepared {
    /// The head the run will have.
    pub fn head(&self) -> Id {
        self.head
    }

    /// Whether `run` names this import's run and every stream beneath it
    /// (`run/c1/query51/collect/00/orch`, ...) as the ledger allows: for
    /// callers to check before they open or make a ledger.
    pub fn check_name(&self, run: &str) -> std::result::Result<(), ledger::LedgerError> {
        ledger::check_ref_name(run)?;
        for rel in self.objects.heads.keys() {
            if rel != objects::MAIN {
                ledger::check_ref_name(&format!("{run}/{rel}"))?;
            }
        }
        Ok(())
    }

    /// Step 3: every object and ref in one commit, as run `run`; nothing
    /// when the run already holds this head; refused when the name is
    /// taken by anything else.
    pub fn write(self, ledger: &Ledger, run: &str) -> Result<Outcome> {
        self.check_name(run)?;
        let head = self.head;
        match ledger.head(run)? {
            Some(h) if h == head => {
                let unmarked = self.unmarked(ledger)?;
                return Ok(Outcome::AlreadyImported { head, unmarked });
            }
            Some(h) => {
                return Err(ImportError::NameTaken {
                    run: run.to_string(),
                    head: h.to_hex(),
                })
            }
            None => {}
        }
        let prefix = format!("{run}/");
        if let Some((name, h)) = ledger
            .refs()?
            .into_iter()
            .find(|(n, _)| n.starts_with(&prefix))
        {
            return Err(ImportError::NameTaken {
                run: name,
                head: h.to_hex(),
            });
        }
        let unmarked = self.unmarked(ledger)?;
        let mut o = self.objects;
        let count = o.objs.len();
        let mut b = ledger.batch();
        // Moved into the batch, not copied: an import's objects are most
        // of its memory, and two copies would double it.
        for obj in std::mem::take(&mut o.objs) {
            b.put_raw(obj.kind, obj.raw, obj.meta)?;
        }
        // Sub-streams first, the run's own ref last (one commit: the order
        // only shows in the ref log).
        for (rel, &(h, _)) in o.heads.iter().filter(|(r, _)| r.as_str() != objects::MAIN) {
            b.set_ref(&format!("{run}/{rel}"), None, h)?;
        }
        b.set_ref(run, None, head)?;
        b.commit()?;
        Ok(Outcome::Imported {
            head,
            episodes: self.episodes,
            objects: count,
            unmarked,
        })
    }

    /// How many of the import's events `ledger` already holds with other
    /// marks than the import gives them (a stand-in time, `WALL_MS_FROM`;
    /// fields not recorded, `NOT_RECORDED`): an older mass wrote them. The
    /// ledger keeps an event's first metadata, so they stay as they are.
    fn unmarked(&self, ledger: &Ledger) -> Result<usize> {
        let marks = |m: &Meta| {
            (
                m.extra.contains_key(WALL_MS_FROM),
                m.extra.get(NOT_RECORDED).cloned(),
            )
        };
        let mut n = 0;
        for o in self
            .objects
            .objs
            .iter()
            .filter(|o| o.kind == ObjectKind::Event)
        {
            let id = Id::of(ObjectKind::Event, &o.raw);
            if !ledger.contains(&id)? {
                continue;
            }
            // Made by `Objects::event` from a `Meta`: it reads back.
            let planned: Meta = serde_json::from_slice(&o.meta).unwrap_or_default();
            if marks(&ledger.get_meta(&id)?) != marks(&planned) {
                n += 1;
            }
        }
        Ok(n)
    }
}

/// A text with every secret the folder holds replaced: for messages that
/// may quote it (the CLI passes its error text through this). Reading the
/// folder again is cheap next to an import, and keeps the scrubber out of
/// error values.
pub fn scrub_message(dir: &Path, text: &str) -> String {
    let mut s = Scrubber::new();
    if let Ok(root) = fsread::Root::open(dir, Caps::default()) {
        learn_all(&root, "", &mut s, 0);
    }
    s.text(text)
}

fn learn_all(root: &fsread::Root, rel: &str, s: &mut Scrubber, depth: u32) {
    if depth > 16 {
        return;
    }
    let Ok(Some(entries)) = root.list(rel) else {
        return;
    };
    for (name, kind) in entries {
        let path = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        match kind {
            fsread::Kind::Dir => learn_all(root, &path, s, depth + 1),
            // Compressed logs are left out: an error message never
            // quotes them, and a hostile one would cost its cap again.
            fsread::Kind::File if path.ends_with(".gz") => {}
            fsread::Kind::File => {
                if let Ok(Some(l)) = root.read(&path) {
                    s.learn_text(&l.bytes);
                }
            }
            _ => {}
        }
    }
}
