//! `tables`: runs as data. `mass export tables RUN --out DIR` writes one
//! table per concept of a MASS run (runs, cycles, stages, rollouts, model
//! and tool calls, judgments, rankings, selections, dataset lines,
//! trainings, training steps, evaluations) as Parquet or CSV files that
//! pandas, polars and DuckDB load as they are. Columns are defined once
//! (`schema.rs`) and documented in `SCHEMAS.md`; ids are hex strings, so a
//! row leads back to `mass show`, `mass cat` and `mass why`.
//!
//! It reads a run the way the audit does: the main stream (tens of events)
//! in memory, then every other stream of the run one at a time, so memory
//! holds one stream and one batch of rows per table, not the run
//! (`sink.rs`). Figures that `mass report` also shows (stage costs,
//! evaluation win rates) come from the same functions, so the two agree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ledger::Ledger;

mod main_stream;
pub mod schema;
pub mod sink;
mod streams;

use schema::TableDef;
use sink::{Cell, Done, Table};

/// What went wrong exporting, with the file or record it concerns.
#[derive(Debug, thiserror::Error)]
pub enum TablesError {
    #[error("no run named {0:?} (`mass status` lists runs)")]
    NoRun(String),
    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),
    #[error(transparent)]
    Engine(#[from] engine::error::EngineError),
    #[error("cannot decode {what} {event}: {detail}")]
    Record {
        what: String,
        event: String,
        detail: String,
    },
    #[error("cannot write {path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Write { path: PathBuf, detail: String },
    #[error("internal: {0}")]
    Row(String),
}

impl TablesError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> TablesError {
        TablesError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
    pub(crate) fn parquet(path: &Path, e: parquet::errors::ParquetError) -> TablesError {
        // The writer reports I/O failures inside its own error type.
        match e {
            parquet::errors::ParquetError::External(x) => match x.downcast::<std::io::Error>() {
                Ok(io) => TablesError::io(path, *io),
                Err(x) => TablesError::Write {
                    path: path.to_path_buf(),
                    detail: x.to_string(),
                },
            },
            e => TablesError::Write {
                path: path.to_path_buf(),
                detail: e.to_string(),
            },
        }
    }
    pub(crate) fn csv(path: &Path, e: arrow_schema::ArrowError) -> TablesError {
        match e {
            arrow_schema::ArrowError::IoError(_, io) => TablesError::io(path, io),
            e => TablesError::Write {
                path: path.to_path_buf(),
                detail: e.to_string(),
            },
        }
    }
    pub(crate) fn record(what: &str, event: &ledger::Id, detail: impl ToString) -> TablesError {
        TablesError::Record {
            what: what.to_string(),
            event: event.to_hex(),
            detail: detail.to_string(),
        }
    }
}

pub type Result<T> = std::result::Result<T, TablesError>;

/// The file format of the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Parquet,
    Csv,
}

impl Format {
    pub fn extension(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Csv => "csv",
        }
    }
}

/// The open tables of one export, by name.
pub(crate) struct Writers {
    tables: BTreeMap<&'static str, Table>,
}

impl Writers {
    pub(crate) fn push(&mut self, def: &TableDef, row: Vec<Cell>) -> Result<()> {
        match self.tables.get_mut(def.name) {
            Some(t) => t.push(row),
            None => Err(TablesError::Row(format!("no table {}", def.name))),
        }
    }
}

/// What an export wrote: each table's file and rows, in `schema::TABLES`
/// order.
#[derive(Debug, Clone)]
pub struct Summary {
    pub tables: Vec<(PathBuf, u64)>,
}

/// Writes the tables of `runs` into `out` (created if missing), one file
/// per table holding the rows of every run (each row names its run; a run
/// named twice is exported once). Every table is written in full under a
/// partial name first; only then are the files renamed into place, one by
/// one. A failure before that leaves the previous tables as they were and
/// no partial file; a rename that fails (a path that became a directory,
/// say) is reported naming the tables already replaced.
pub fn export(l: &Ledger, runs: &[String], out: &Path, format: Format) -> Result<Summary> {
    let mut unique: Vec<String> = Vec::new();
    for run in runs {
        if l.head(run)?.is_none() {
            return Err(TablesError::NoRun(run.clone()));
        }
        if !unique.contains(run) {
            unique.push(run.clone());
        }
    }
    std::fs::create_dir_all(out).map_err(|e| TablesError::io(out, e))?;
    let mut w = Writers {
        tables: BTreeMap::new(),
    };
    let done = match write_all(l, &unique, out, format, &mut w) {
        Ok(done) => done,
        Err(e) => {
            for t in w.tables.values() {
                let _ = std::fs::remove_file(t.partial());
            }
            return Err(e);
        }
    };
    publish(&done)?;
    Ok(Summary {
        tables: done.into_iter().map(|d| (d.path, d.rows)).collect(),
    })
}

/// Renames every complete table into place, after checking that none of
/// the final names is taken by something a file cannot replace.
fn publish(done: &[Done]) -> Result<()> {
    let remove_partials = |from: usize| {
        for d in &done[from..] {
            let _ = std::fs::remove_file(&d.partial);
        }
    };
    for d in done {
        if d.path.is_dir() {
            remove_partials(0);
            return Err(TablesError::Write {
                path: d.path.clone(),
                detail: "is a directory; nothing was replaced".into(),
            });
        }
    }
    for (i, d) in done.iter().enumerate() {
        if let Err(e) = d.publish() {
            remove_partials(i);
            let replaced: Vec<&str> = done[..i].iter().map(|d| d.name).collect();
            return Err(TablesError::Write {
                path: d.path.clone(),
                detail: format!(
                    "{e}; tables already replaced: {}",
                    if replaced.is_empty() {
                        "none".to_string()
                    } else {
                        replaced.join(", ")
                    }
                ),
            });
        }
    }
    Ok(())
}

fn write_all(
    l: &Ledger,
    runs: &[String],
    out: &Path,
    format: Format,
    w: &mut Writers,
) -> Result<Vec<Done>> {
    for def in schema::TABLES {
        w.tables.insert(def.name, Table::create(def, out, format)?);
    }
    for run in runs {
        let ctx = main_stream::tables(l, run, w)?;
        let counts = streams::tables(l, run, &ctx, w)?;
        main_stream::finish(l, run, &ctx, &counts, w)?;
    }
    let mut done = Vec::new();
    for def in schema::TABLES {
        if let Some(t) = w.tables.remove(def.name) {
            let partial = t.partial().to_path_buf();
            match t.finish() {
                Ok(d) => done.push(d),
                Err(e) => {
                    let _ = std::fs::remove_file(partial);
                    for d in &done {
                        let _ = std::fs::remove_file(&d.partial);
                    }
                    return Err(e);
                }
            }
        }
    }
    Ok(done)
}

/// An id as the tables show it.
pub(crate) fn hex(h: &schemas::Hash32) -> String {
    ledger::Id(h.0).to_hex()
}

/// A record's field, or `None` when the event's metadata lists it as not
/// recorded (`ledger::NOT_RECORDED`: its value is a placeholder).
pub(crate) fn recorded<T>(meta: &ledger::Meta, field: &str, value: T) -> Option<T> {
    (!meta.not_recorded(field)).then_some(value)
}

/// An id that may be absent: the zero id (a field an imported run's
/// source did not record, `mass import sakana`) is null, not an id.
pub(crate) fn hex_or_null(h: &schemas::Hash32) -> Option<String> {
    (h.0 != [0; 32]).then(|| hex(h))
}
