//! One reading abstraction for every data format: a [`Source`] reads one
//! file (or `.npy` folder) and hands pieces of examples to the batching in
//! `data`, which owns everything the formats share (shape resolution,
//! conversions, labels, weights, slices, limits, prefetching).
//!
//! Two kinds of sources, by how the format stores data:
//! - row sources (TFRecord, CSV) hand one [`Example`] at a time
//!   ([`Piece::Example`]); a `tf.Example` is the common row type, so a CSV
//!   row goes through the same conversions as a TFRecord record;
//! - columnar sources (`.npz`, `.npy` folders, Parquet, Arrow IPC, JSON Lines) hand whole columns of up to
//!   a batch of rows ([`Piece::Columns`]): bytes with an element type, or
//!   strings, one [`ColumnChunk`] per column asked for, in the order asked.
//!
//! A format is one file here (its reader and its [`Source`]) and one line
//! in the registry (`crate::format::FORMATS`): its name, file name endings,
//! family, compression, and the functions below. A compressed file is its
//! format's reader opened with a [`Compression`] (see `compression`), not a
//! reader of its own.
//!
//! Parts of a file ([`Part`]): a source asked for part `K` of `N` reads only
//! its share of the file, so that the `N` parts of a file hold each of its
//! examples exactly once (see `crate::shard` for the rules per format).

pub(crate) mod arrays;
pub(crate) mod arrow;
mod arrow_compressed;
pub(crate) mod compression;
pub(crate) mod csv;
pub(crate) mod jsonl;
mod lines;
pub(crate) mod parquet;
mod parquet_pages;
pub(crate) mod tfrecord;

use crate::error::DataError;
use crate::example::Example;
use isorun_tensors::npy::Element;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Which share of a file to read: part `index` of `count` (0 of 1 is all of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    pub index: u64,
    pub count: u64,
}

impl Part {
    /// The whole file.
    pub const WHOLE: Part = Part { index: 0, count: 1 };

    /// The rows `[index*rows/count, (index+1)*rows/count)` of `rows`: the
    /// parts of `rows` rows cover each row once, in order.
    pub fn rows(self, rows: u64) -> (u64, u64) {
        let at = |k: u64| (u128::from(k) * u128::from(rows) / u128::from(self.count)) as u64;
        (at(self.index), at(self.index + 1))
    }

    /// Whether this is the whole file.
    pub fn is_whole(self) -> bool {
        self.count <= 1
    }
}

/// How to open a source.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Skip corrupt TFRecord records (counted in `skipped`) instead of failing.
    pub skip_corrupt: bool,
    /// Corrupt records skipped, shared with the reader's owner.
    pub skipped: Arc<AtomicU64>,
    /// The columns a columnar source hands, in this order: the inputs'
    /// (after renames), the label, the weight, the slices. Row sources
    /// ignore it (an example has all its features).
    pub columns: Vec<String>,
    /// The share of the file to read.
    pub part: Part,
}

/// One column of a columnar file, as its header or schema describes it.
#[derive(Debug, Clone)]
pub(crate) struct ColumnInfo {
    pub name: String,
    /// Where it is, for errors (`shard.npz/NAME.npy`, or the file).
    pub path: PathBuf,
    pub element: Element,
    /// The dimensions of one example's value (`[]` for one value).
    pub dims: Vec<u64>,
    /// A short description for messages: `int64 [100, 3]`.
    pub describe: String,
}

impl ColumnInfo {
    /// Values per example.
    pub fn row_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// What a file shows before reading: its first example, or its columns.
#[derive(Debug, Clone)]
pub(crate) enum Look {
    Example(Example),
    Columns(Vec<ColumnInfo>),
}

/// The values of one column for the rows of a piece.
#[derive(Debug)]
pub(crate) enum Values {
    /// `rows × row elements` elements, each `element.item_size()` bytes.
    Elements { element: Element, bytes: Vec<u8> },
    /// `rows × row elements` byte strings.
    Strings(Vec<Vec<u8>>),
}

/// One column of a piece: its values for the piece's rows.
#[derive(Debug)]
pub(crate) struct ColumnChunk {
    /// Where the column is, for errors.
    pub path: PathBuf,
    /// One example's dimensions, the same for every row of the piece.
    pub dims: Vec<u64>,
    pub values: Values,
}

/// A serialized record, as read (TFRecord only: fed to a model as it is).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Raw<'a> {
    pub bytes: &'a [u8],
    /// The record's byte offset (in the decompressed stream for gzip).
    pub offset: u64,
}

/// What a source hands: one example, or columns of several rows.
#[derive(Debug)]
pub(crate) enum Piece<'a> {
    Example {
        example: &'a Example,
        /// The example's 0-based index in its file (record, or CSV data row).
        record: u64,
        raw: Option<Raw<'a>>,
    },
    Columns {
        rows: usize,
        columns: Vec<ColumnChunk>,
    },
}

/// A reader of one file's examples.
pub(crate) trait Source: Send {
    /// The columns it hands, in [`Options::columns`] order (columnar
    /// sources; row sources have none).
    fn columns(&self) -> &[ColumnInfo] {
        &[]
    }

    /// What [`Piece::Example::record`] counts in, for errors: `this file`,
    /// or a part of it whose start is not counted from the file's.
    fn within(&self) -> &str {
        "this file"
    }

    /// The next piece, of at most `max_rows` rows (at least 1); `Ok(None)`
    /// at the end of the file (or of its part).
    fn next_piece(&mut self, max_rows: usize) -> Result<Option<Piece<'_>>, DataError>;
}

pub(crate) use compression::Compression;

/// Checks a file can be read, before any work (cheap: no rows read).
pub(crate) type Probe = fn(&Path, Compression) -> Result<(), DataError>;
/// What a file shows first; `None` when it has no example (row sources).
pub(crate) type Peek = fn(&Path, Compression, &Options) -> Result<Option<Look>, DataError>;
/// Opens a file's source. A format whose files are never compressed
/// ignores the [`Compression`] (its registry lines all say `None`).
pub(crate) type Open = fn(&Path, Compression, &Options) -> Result<Box<dyn Source>, DataError>;

/// The `io::Error` of opening `path`, as a [`DataError`].
pub(crate) fn io_error(path: &Path) -> impl Fn(std::io::Error) -> DataError + '_ {
    move |source| DataError::Io { path: path.to_path_buf(), source }
}

/// Opens a file to check it is readable (a compressed one's stream is
/// checked when it is read).
pub(crate) fn probe_file(path: &Path, _compression: Compression) -> Result<(), DataError> {
    std::fs::File::open(path).map(drop).map_err(io_error(path))
}
