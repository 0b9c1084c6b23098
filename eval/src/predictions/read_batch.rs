//! What reading a predictions file hands back: the batch
//! ([`RescoreBatch`]) of at most [`READ_ROWS`] rows (eval's first batch
//! aside), the error ([`ReadError`]), and how a saved dtype is read back
//! ([`stored_dtype`]). Shared by the reader (`read.rs`) and its per-format
//! halves (`read_arrow.rs`, `read_jsonl.rs`), which name neither the reader nor
//! each other.

use crate::data::Targets;
use crate::error::DataError;
use isorun_protocol::{DType, Tensor};
use std::path::{Path, PathBuf};

/// Rows per batch read (eval's first batch aside), at most.
pub const READ_ROWS: usize = 8192;

/// Why a predictions file cannot be read (the path is the file's).
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ReadError {
    pub path: PathBuf,
    pub reason: String,
}

/// One batch rebuilt from a file: what the evaluator gets.
#[derive(Debug, Clone)]
pub struct RescoreBatch {
    pub targets: Targets,
    /// The scored output, `[rows]` + its row shape, in its dtype.
    pub output: (String, Tensor),
}

pub(super) fn err(path: &Path, reason: impl Into<String>) -> ReadError {
    ReadError { path: path.to_path_buf(), reason: reason.into() }
}

/// A dataset reader's error, as this module's (its path is the file's).
pub(super) fn data_error(path: &Path, error: DataError) -> ReadError {
    match error {
        DataError::Array { reason, .. } | DataError::Reader { reason, .. } => err(path, reason),
        other => err(path, other.to_string()),
    }
}

/// How a dtype is stored: bfloat16 as float32 (exactly); the rest as they are.
pub(super) fn stored_dtype(dtype: DType) -> (DType, ()) {
    match dtype {
        DType::BFloat16 => (DType::Float32, ()),
        other => (other, ()),
    }
}
