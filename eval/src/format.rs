//! The data formats and their registry: one line per format says its name,
//! the file name endings that select it, its family (files of one family
//! can be one dataset), how it is laid out, and its reader's functions (in
//! `source`). Adding a format is a variant here, its line in `FORMATS`,
//! and its file in `source/`.

use crate::source::{self, Open, Peek, Probe};

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
    pub probe: Probe,
    pub peek: Peek,
    pub open: Open,
}

/// Every format.
#[rustfmt::skip]
pub(crate) const FORMATS: &[FormatInfo] = &[
    FormatInfo { format: Format::TfRecord, name: "tfrecord", suffixes: &[".tfrecord", ".tfrecords", ".tfrec"], family: "TFRecord", layout: Layout::Records, probe: source::tfrecord::probe_plain, peek: source::tfrecord::peek_plain, open: source::tfrecord::open_plain },
    FormatInfo { format: Format::TfRecordGzip, name: "tfrecord-gzip", suffixes: &[".gz"], family: "TFRecord", layout: Layout::Records, probe: source::tfrecord::probe_gzip, peek: source::tfrecord::peek_gzip, open: source::tfrecord::open_gzip },
    FormatInfo { format: Format::Npz, name: "npz", suffixes: &[".npz"], family: ".npz/.npy", layout: Layout::Columns, probe: source::probe_file, peek: source::arrays::peek_npz, open: source::arrays::open_npz },
    FormatInfo { format: Format::NpyFolder, name: "npy-folder", suffixes: &[], family: ".npz/.npy", layout: Layout::Columns, probe: source::arrays::probe_folder, peek: source::arrays::peek_folder, open: source::arrays::open_folder },
    FormatInfo { format: Format::Csv, name: "csv", suffixes: &[".csv"], family: "CSV", layout: Layout::Rows, probe: source::probe_file, peek: source::csv::peek, open: source::csv::open },
    FormatInfo { format: Format::Parquet, name: "parquet", suffixes: &[".parquet", ".pq"], family: "Parquet/Arrow", layout: Layout::Columns, probe: source::probe_file, peek: source::parquet::peek, open: source::parquet::open },
    FormatInfo { format: Format::Arrow, name: "arrow", suffixes: &[".arrow", ".feather", ".ipc"], family: "Parquet/Arrow", layout: Layout::Columns, probe: source::probe_file, peek: source::arrow::peek, open: source::arrow::open },
    FormatInfo { format: Format::Jsonl, name: "jsonl", suffixes: &[".jsonl", ".ndjson"], family: "JSON Lines", layout: Layout::Columns, probe: source::probe_file, peek: source::jsonl::peek_plain, open: source::jsonl::open_plain },
    FormatInfo { format: Format::JsonlGzip, name: "jsonl-gzip", suffixes: &[".jsonl.gz", ".ndjson.gz"], family: "JSON Lines", layout: Layout::Columns, probe: source::probe_file, peek: source::jsonl::peek_gzip, open: source::jsonl::open_gzip },
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

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
