//! Per-example predictions (`isorun eval --predictions DIR`) and reading
//! them back (`isorun rescore`): one file per model, one row per example,
//! so that metrics can be recomputed, and two runs compared example by
//! example, in a process that never loads TensorFlow.
//!
//! Columns (Parquet; the same names as keys of each JSON Lines object):
//! `index` (uint64, the example's 0-based index in what was read), `key`
//! (string, with `--example-key`), `label` (int64, float64, or a list of
//! float64 for multi-value labels, as read), `weight` (float64, with
//! `--weight`), `slice:<feature>` (string, per `--slice`), and
//! `output:<name>` for the scored output (all outputs with
//! `--predictions-all`): a scalar column of the output's dtype for `[N]`
//! and `[N, 1]`, a list column for wider rows (bfloat16 is stored as
//! float32, which holds it exactly; strings as binary).
//!
//! [`Meta`] says what the file holds and how eval scored it: Parquet keeps
//! it as the file's key-value metadata `isorun` (JSON), JSON Lines in a
//! sidecar `<file>.isorun.json`, so that every line of the `.jsonl` is a row
//! and pandas reads it as it is.

mod diff;
mod meta;
mod read;
mod write;

pub use diff::{mcnemar_exact_p, Changed, DiffError, DiffOptions, DiffSummary, Differ, Prediction};
pub use meta::{Meta, SavedOutput, META_KEY};
pub use read::{list_files, PredictionsReader, ReadError, RescoreBatch};
pub use write::{ChangedWriter, PredictionsWriter, WriteError, ROW_GROUP_ROWS};

/// How predictions are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PredictionsFormat {
    Parquet,
    Jsonl,
}

impl PredictionsFormat {
    /// `parquet` or `jsonl`, as `--predictions-format` takes them.
    pub fn from_name(name: &str) -> Option<PredictionsFormat> {
        match name {
            "parquet" => Some(PredictionsFormat::Parquet),
            "jsonl" => Some(PredictionsFormat::Jsonl),
            _ => None,
        }
    }

    /// The file name's extension.
    pub fn extension(self) -> &'static str {
        match self {
            PredictionsFormat::Parquet => "parquet",
            PredictionsFormat::Jsonl => "jsonl",
        }
    }
}

/// Column names.
pub const INDEX: &str = "index";
pub const KEY: &str = "key";
pub const LABEL: &str = "label";
pub const WEIGHT: &str = "weight";
/// `slice:<feature>`.
pub fn slice_column(feature: &str) -> String {
    format!("slice:{feature}")
}
/// `output:<name>`.
pub fn output_column(output: &str) -> String {
    format!("output:{output}")
}

/// The sidecar that holds a JSON Lines file's [`Meta`].
pub fn sidecar(path: &std::path::Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".isorun.json");
    std::path::PathBuf::from(name)
}
