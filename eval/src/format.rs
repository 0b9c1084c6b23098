//! The data formats and their registry: one line per format says its name,
//! the file name endings that select it, its family (files of one family
//! can be one dataset), how it is laid out, how its files are compressed,
//! and its reader's functions (in `source`). Adding a format is a variant
//! here, its line in `FORMATS`, and its file in `source/`; a compressed
//! variant of a format is a line with the same reader and another
//! `Compression` (the name users give, `jsonl-gzip`, stays a format).
//! Messages that list the formats' file name endings or families are built
//! from the registry (`suffix_list`, `family_list`).

use crate::error::DataError;
use crate::source::{self, Compression, Look, Open, Options, Peek, Probe, Source};
use std::path::Path;

/// The format of one data file (or folder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// `.tfrecord`, `.tfrecords`, `.tfrec`: TFRecord of `tf.Example`.
    TfRecord,
    /// `.gz`: gzip-compressed TFRecord.
    TfRecordGzip,
    /// `.npz`: arrays aligned by name.
    Npz,
    /// A folder of `NAME.npy` arrays.
    NpyFolder,
    /// `.csv`: a header row, then one example per row (see the `csv` source).
    Csv,
    /// `.parquet`, `.pq`: Parquet, read through Arrow (see the `parquet` source).
    Parquet,
    /// `.arrow`, `.feather`, `.ipc`: Arrow IPC, the file or the stream format
    /// (what Hugging Face `datasets` writes; see the `arrow` source).
    Arrow,
    /// `.jsonl`, `.ndjson`: one JSON object per line (see the `jsonl` source).
    Jsonl,
    /// `.jsonl.gz`, `.ndjson.gz`: gzip-compressed JSON Lines.
    JsonlGzip,
}

/// How a format stores examples, which decides how it is fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Serialized `tf.Example` records: fed as features, or as the records
    /// themselves to a lone string input.
    Records,
    /// Rows that become `tf.Example`s.
    Rows,
    /// Columns with a type and shape per column.
    Columns,
}

/// One format's line in the registry.
pub(crate) struct FormatInfo {
    pub format: Format,
    pub name: &'static str,
    /// File name endings that select it (the longest matching one wins);
    /// none for a folder format.
    pub suffixes: &'static [&'static str],
    pub family: &'static str,
    pub layout: Layout,
    /// How its files are compressed, which its reader is opened with.
    pub compression: Compression,
    probe: Probe,
    peek: Peek,
    open: Open,
}

impl FormatInfo {
    /// Checks a file can be read, before any work (cheap: no rows read).
    pub(crate) fn probe(&self, path: &Path) -> Result<(), DataError> {
        (self.probe)(path, self.compression)
    }

    /// What a file shows first; `None` when it has no example (row sources).
    pub(crate) fn peek(&self, path: &Path, options: &Options) -> Result<Option<Look>, DataError> {
        (self.peek)(path, self.compression, options)
    }

    /// Opens a file's source.
    pub(crate) fn open(&self, path: &Path, options: &Options) -> Result<Box<dyn Source>, DataError> {
        (self.open)(path, self.compression, options)
    }
}

/// Every format.
#[rustfmt::skip]
pub(crate) const FORMATS: &[FormatInfo] = &[
    FormatInfo { format: Format::TfRecord, name: "tfrecord", suffixes: &[".tfrecord", ".tfrecords", ".tfrec"], family: "TFRecord", layout: Layout::Records, compression: Compression::None, probe: source::tfrecord::probe, peek: source::tfrecord::peek, open: source::tfrecord::open },
    FormatInfo { format: Format::TfRecordGzip, name: "tfrecord-gzip", suffixes: &[".gz"], family: "TFRecord", layout: Layout::Records, compression: Compression::Gzip, probe: source::tfrecord::probe, peek: source::tfrecord::peek, open: source::tfrecord::open },
    FormatInfo { format: Format::Npz, name: "npz", suffixes: &[".npz"], family: ".npz/.npy", layout: Layout::Columns, compression: Compression::None, probe: source::probe_file, peek: source::arrays::peek_npz, open: source::arrays::open_npz },
    FormatInfo { format: Format::NpyFolder, name: "npy-folder", suffixes: &[], family: ".npz/.npy", layout: Layout::Columns, compression: Compression::None, probe: source::arrays::probe_folder, peek: source::arrays::peek_folder, open: source::arrays::open_folder },
    FormatInfo { format: Format::Csv, name: "csv", suffixes: &[".csv"], family: "CSV", layout: Layout::Rows, compression: Compression::None, probe: source::probe_file, peek: source::csv::peek, open: source::csv::open },
    FormatInfo { format: Format::Parquet, name: "parquet", suffixes: &[".parquet", ".pq"], family: "Parquet/Arrow", layout: Layout::Columns, compression: Compression::None, probe: source::probe_file, peek: source::parquet::peek, open: source::parquet::open },
    FormatInfo { format: Format::Arrow, name: "arrow", suffixes: &[".arrow", ".feather", ".ipc"], family: "Parquet/Arrow", layout: Layout::Columns, compression: Compression::None, probe: source::probe_file, peek: source::arrow::peek, open: source::arrow::open },
    FormatInfo { format: Format::Jsonl, name: "jsonl", suffixes: &[".jsonl", ".ndjson"], family: "JSON Lines", layout: Layout::Columns, compression: Compression::None, probe: source::probe_file, peek: source::jsonl::peek, open: source::jsonl::open },
    FormatInfo { format: Format::JsonlGzip, name: "jsonl-gzip", suffixes: &[".jsonl.gz", ".ndjson.gz"], family: "JSON Lines", layout: Layout::Columns, compression: Compression::Gzip, probe: source::probe_file, peek: source::jsonl::peek, open: source::jsonl::open },
];

impl Format {
    /// Its line in the registry.
    pub(crate) fn info(self) -> &'static FormatInfo {
        FORMATS.iter().find(|f| f.format == self).expect("every format is registered")
    }

    /// The name used in messages and records (and by `--data-format`).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The format of this name.
    pub fn from_name(name: &str) -> Option<Format> {
        FORMATS.iter().find(|f| f.name == name).map(|f| f.format)
    }

    /// Every format's name, in the registry's order.
    pub fn names() -> Vec<&'static str> {
        FORMATS.iter().map(|f| f.name).collect()
    }

    /// The format a file's name selects (the longest matching ending).
    pub fn of_file_name(name: &[u8]) -> Option<Format> {
        FORMATS
            .iter()
            .flat_map(|f| f.suffixes.iter().map(move |s| (f.format, s.as_bytes())))
            .filter(|(_, s)| name.len() > s.len() && name.ends_with(s))
            .max_by_key(|(_, s)| s.len())
            .map(|(format, _)| format)
    }

    /// Whether the file holds arrays (`.npz`, a folder of `.npy`).
    pub fn is_arrays(self) -> bool {
        matches!(self, Format::Npz | Format::NpyFolder)
    }

    /// Files of one family can be one dataset: TFRecord, arrays, CSV, Parquet/Arrow, JSON Lines.
    pub(crate) fn family(self) -> &'static str {
        self.info().family
    }

    /// Whether the file holds TFRecord records.
    pub fn is_tfrecord(self) -> bool {
        self.info().layout == Layout::Records
    }

    /// Whether columns (not examples) are read.
    pub(crate) fn is_columnar(self) -> bool {
        self.info().layout == Layout::Columns
    }
}

/// Every format's file name endings, in the registry's order, for
/// messages: `.tfrecord, .tfrecords, ..., .ndjson.gz`.
pub(crate) fn suffix_list() -> String {
    FORMATS.iter().flat_map(|f| f.suffixes.iter().copied()).collect::<Vec<_>>().join(", ")
}

/// The families, each once in the registry's order, for messages: `all
/// TFRecord, all .npz/.npy, ... or all JSON Lines`.
pub(crate) fn family_list() -> String {
    let mut families: Vec<String> = Vec::new();
    for family in FORMATS.iter().map(|f| format!("all {}", f.family)) {
        if !families.contains(&family) {
            families.push(family);
        }
    }
    match families.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_list_the_registry_s_endings_and_families() {
        assert_eq!(
            suffix_list(),
            ".tfrecord, .tfrecords, .tfrec, .gz, .npz, .csv, .parquet, .pq, .arrow, .feather, .ipc, .jsonl, .ndjson, \
             .jsonl.gz, .ndjson.gz"
        );
        assert_eq!(family_list(), "all TFRecord, all .npz/.npy, all CSV, all Parquet/Arrow or all JSON Lines");
    }

    #[test]
    fn a_compressed_format_is_its_plain_format_s_reader_with_a_compression() {
        for (plain, compressed) in [(Format::TfRecord, Format::TfRecordGzip), (Format::Jsonl, Format::JsonlGzip)] {
            let (plain, compressed) = (plain.info(), compressed.info());
            assert_eq!((plain.compression, compressed.compression), (Compression::None, Compression::Gzip));
            assert_eq!(plain.family, compressed.family);
        }
    }
}
