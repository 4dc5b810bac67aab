//! One table being written: rows are appended to Arrow column builders and
//! handed to the file every [`BATCH_ROWS`] rows, so memory holds one batch
//! (and, for Parquet, the row group being encoded) whatever the run's size.
//! A table is written to `NAME.EXT.partial`, synced, and renamed only when
//! every table of the export is complete, so a reader never opens half a
//! table (or tables of two exports) under the final names.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::schema::{TableDef, Type};
use crate::{Format, Result, TablesError};

/// Rows per Arrow batch.
pub const BATCH_ROWS: usize = 8192;
/// Rows per Parquet row group (a reader's unit of skipping). The writer
/// keeps a row group's encoded pages in memory until it is complete, so a
/// row group is one batch: memory then holds one batch per table, however
/// many rows the table gets.
const ROW_GROUP_ROWS: usize = BATCH_ROWS;

/// One cell of a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Null,
}

impl From<&str> for Cell {
    fn from(v: &str) -> Cell {
        Cell::Str(v.to_string())
    }
}
impl From<String> for Cell {
    fn from(v: String) -> Cell {
        Cell::Str(v)
    }
}
impl From<u32> for Cell {
    fn from(v: u32) -> Cell {
        Cell::Int(i64::from(v))
    }
}
impl From<i32> for Cell {
    fn from(v: i32) -> Cell {
        Cell::Int(i64::from(v))
    }
}
impl From<u64> for Cell {
    fn from(v: u64) -> Cell {
        // Counts and steps; a value past i64 would be a corrupt record, and
        // is shown as null rather than wrapped.
        i64::try_from(v).map_or(Cell::Null, Cell::Int)
    }
}
impl From<f64> for Cell {
    fn from(v: f64) -> Cell {
        Cell::Float(v)
    }
}
impl From<bool> for Cell {
    fn from(v: bool) -> Cell {
        Cell::Bool(v)
    }
}
impl<T: Into<Cell>> From<Option<T>> for Cell {
    fn from(v: Option<T>) -> Cell {
        v.map_or(Cell::Null, Into::into)
    }
}

enum Builder {
    Str(StringBuilder),
    Int(Int64Builder),
    Float(Float64Builder),
    Bool(BooleanBuilder),
}

impl Builder {
    fn new(ty: Type) -> Builder {
        match ty {
            Type::Str => Builder::Str(StringBuilder::new()),
            Type::Int => Builder::Int(Int64Builder::new()),
            Type::Float => Builder::Float(Float64Builder::new()),
            Type::Bool => Builder::Bool(BooleanBuilder::new()),
        }
    }

    /// Appends a cell; `false` when its type is not the column's.
    fn push(&mut self, cell: Cell) -> bool {
        match (self, cell) {
            (Builder::Str(b), Cell::Str(v)) => b.append_value(v),
            (Builder::Int(b), Cell::Int(v)) => b.append_value(v),
            (Builder::Float(b), Cell::Float(v)) => b.append_value(v),
            (Builder::Bool(b), Cell::Bool(v)) => b.append_value(v),
            (Builder::Str(b), Cell::Null) => b.append_null(),
            (Builder::Int(b), Cell::Null) => b.append_null(),
            (Builder::Float(b), Cell::Null) => b.append_null(),
            (Builder::Bool(b), Cell::Null) => b.append_null(),
            _ => return false,
        }
        true
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Builder::Str(b) => Arc::new(b.finish()),
            Builder::Int(b) => Arc::new(b.finish()),
            Builder::Float(b) => Arc::new(b.finish()),
            Builder::Bool(b) => Arc::new(b.finish()),
        }
    }
}

enum Out {
    Parquet(ArrowWriter<File>),
    Csv(arrow_csv::Writer<BufWriter<File>>),
}

/// A table being written.
pub struct Table {
    def: &'static TableDef,
    schema: SchemaRef,
    builders: Vec<Builder>,
    pending: usize,
    rows: u64,
    out: Out,
    partial: PathBuf,
    path: PathBuf,
}

/// The Arrow schema of a table.
pub fn arrow_schema(def: &TableDef) -> SchemaRef {
    let fields: Vec<Field> = def
        .columns
        .iter()
        .map(|c| {
            let ty = match c.ty {
                Type::Str => DataType::Utf8,
                Type::Int => DataType::Int64,
                Type::Float => DataType::Float64,
                Type::Bool => DataType::Boolean,
            };
            Field::new(c.name, ty, true)
        })
        .collect();
    Arc::new(Schema::new(fields))
}

impl Table {
    /// Opens `DIR/NAME.parquet.partial` (or `.csv.partial`).
    pub fn create(def: &'static TableDef, dir: &Path, format: Format) -> Result<Table> {
        let path = dir.join(format!("{}.{}", def.name, format.extension()));
        let partial = dir.join(format!("{}.{}.partial", def.name, format.extension()));
        let file = File::create(&partial).map_err(|e| TablesError::io(&partial, e))?;
        let schema = arrow_schema(def);
        let out = match format {
            Format::Parquet => {
                let props = WriterProperties::builder()
                    .set_compression(Compression::ZSTD(ZstdLevel::default()))
                    .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
                    .build();
                let w = ArrowWriter::try_new(file, schema.clone(), Some(props))
                    .map_err(|e| TablesError::parquet(&partial, e))?;
                Out::Parquet(w)
            }
            Format::Csv => Out::Csv(
                arrow_csv::WriterBuilder::new()
                    .with_header(true)
                    .build(BufWriter::new(file)),
            ),
        };
        Ok(Table {
            def,
            schema,
            builders: def.columns.iter().map(|c| Builder::new(c.ty)).collect(),
            pending: 0,
            rows: 0,
            out,
            partial,
            path,
        })
    }

    /// Appends a row: one cell per column, in column order.
    pub fn push(&mut self, row: Vec<Cell>) -> Result<()> {
        if row.len() != self.builders.len() {
            return Err(TablesError::Row(format!(
                "table {} has {} columns, a row came with {}",
                self.def.name,
                self.builders.len(),
                row.len()
            )));
        }
        for ((b, cell), col) in self.builders.iter_mut().zip(row).zip(self.def.columns) {
            if !b.push(cell) {
                return Err(TablesError::Row(format!(
                    "column {}.{} ({}) got a value of another type",
                    self.def.name,
                    col.name,
                    col.ty.name()
                )));
            }
        }
        self.pending += 1;
        self.rows += 1;
        if self.pending == BATCH_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        let arrays: Vec<ArrayRef> = self.builders.iter_mut().map(Builder::finish).collect();
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| TablesError::Row(format!("table {}: {e}", self.def.name)))?;
        self.pending = 0;
        match &mut self.out {
            Out::Parquet(w) => w
                .write(&batch)
                .map_err(|e| TablesError::parquet(&self.partial, e)),
            Out::Csv(w) => w
                .write(&batch)
                .map_err(|e| TablesError::csv(&self.partial, e)),
        }
    }

    /// Writes what is left and syncs the file, still under its partial
    /// name: [`Done::publish`] gives it its final one once every table is
    /// complete.
    pub fn finish(mut self) -> Result<Done> {
        self.flush()?;
        let file = match self.out {
            Out::Parquet(w) => w
                .into_inner()
                .map_err(|e| TablesError::parquet(&self.partial, e))?,
            Out::Csv(w) => {
                let mut buf = w.into_inner();
                buf.flush().map_err(|e| TablesError::io(&self.partial, e))?;
                buf.into_inner()
                    .map_err(|e| TablesError::io(&self.partial, e.into_error()))?
            }
        };
        file.sync_all()
            .map_err(|e| TablesError::io(&self.partial, e))?;
        Ok(Done {
            name: self.def.name,
            partial: self.partial,
            path: self.path,
            rows: self.rows,
        })
    }

    /// The partial file's path (removed when the export fails).
    pub fn partial(&self) -> &Path {
        &self.partial
    }
}

/// A complete table under its partial name.
pub struct Done {
    pub name: &'static str,
    pub partial: PathBuf,
    pub path: PathBuf,
    pub rows: u64,
}

impl Done {
    pub fn publish(&self) -> Result<()> {
        std::fs::rename(&self.partial, &self.path).map_err(|e| TablesError::io(&self.path, e))
    }
}
