//! Why data could not be read: one error type for every reader, in a leaf
//! module so that the readers (`source`), the path expansion (`paths`) and
//! the batching (`data`) share it without importing each other.

use crate::tfrecord::RecordFault;
use std::path::PathBuf;

/// Why data could not be read. Every variant names the file (or pattern).
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: no such file or folder")]
    NotFound { path: PathBuf },
    #[error("{pattern}: the pattern matches no file")]
    NoMatch { pattern: PathBuf },
    #[error("{pattern}: bad glob pattern: {reason}")]
    BadPattern { pattern: PathBuf, reason: String },
    /// `suffixes`: the registry's endings (`format::suffix_list`), given by
    /// the caller so that this leaf imports no reader.
    #[error(
        "{path}: unknown data format (expected {suffixes}, or a folder of NAME.npy arrays; a lone .npy file holds one \
         array, give its folder; --data-format NAME reads a file of another name)"
    )]
    UnknownFormat { path: PathBuf, suffixes: String },
    #[error("{path}: no data files ({suffixes}, or .npy arrays) in this folder")]
    NoData { path: PathBuf, suffixes: String },
    /// `families`: the registry's families (`format::family_list`).
    #[error("{first} is {first_family} but {other} is {other_family}: one dataset's files are {families}")]
    MixedFormats {
        first: PathBuf,
        first_family: &'static str,
        other: PathBuf,
        other_family: &'static str,
        families: String,
    },
    #[error("{path}: line {line}: {reason}")]
    Csv { path: PathBuf, line: u64, reason: String },
    #[error("{path}: line {line}: {reason}")]
    Jsonl { path: PathBuf, line: u64, reason: String },
    #[error("{path}: cannot read")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {fault} at byte offset {offset}{}", if *.gzip { " of the decompressed stream" } else { "" })]
    Corrupt { path: PathBuf, offset: u64, gzip: bool, fault: RecordFault },
    #[error("{path}: record {record} at byte offset {offset} is not a tf.Example")]
    NotAnExample {
        path: PathBuf,
        record: u64,
        offset: u64,
        #[source]
        source: prost::DecodeError,
    },
    #[error(
        "{path}: example {example} (0-based in the dataset; record {record} of {within}): feature '{key}' {problem}"
    )]
    Example { path: PathBuf, example: u64, record: u64, within: String, key: String, problem: String },
    #[error("{path}: {reason}")]
    Array { path: PathBuf, reason: String },
    #[error("{path}: {rows} examples (first axis) but {other} has {other_rows}")]
    RowMismatch { path: PathBuf, rows: u64, other: PathBuf, other_rows: u64 },
    #[error("{path}: holds no examples")]
    Empty { path: PathBuf },
    #[error("{path}: no {what} '{name}' in the first example; it has: {available}")]
    MissingFeature { path: PathBuf, what: &'static str, name: String, available: String },
    #[error("{path}: signature input '{input}' has no feature or array '{feature}'; there are: {available}")]
    MissingInput { path: PathBuf, input: String, feature: String, available: String },
    #[error(
        "{path}: signature input '{input}' has no feature or array '{feature}'; there are: {available}; \
         give --feature {input}=NAME to feed it from one (e.g. --feature {input}={unused}, which nothing else uses)"
    )]
    UnfedInput { path: PathBuf, input: String, feature: String, available: String, unused: String },
    #[error("{path}: {reason}")]
    Unsupported { path: PathBuf, reason: String },
    #[error("invalid data spec: {reason}")]
    InvalidSpec { reason: String },
    #[error("{path}: the data reader failed while reading this file: {reason}")]
    Reader { path: PathBuf, reason: String },
}
