//! What a dataset was opened as: its [`DataSpec`], how a model is fed
//! ([`Feeding`]), the checked facts every reader of one dataset shares
//! (`Inner`) and how its sources are opened. Both the
//! [`Dataset`](super::Dataset) that checks them and the readers that read
//! by them name these, so they live in this leaf rather than in `data`
//! itself, which names its readers.

use super::first_look::FirstLook;
use crate::batch::LabelKind;
use crate::format::Format;
use crate::label_classes::LabelClasses;
use crate::shard::DataShard;
use crate::source::{Options, Part};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// What to read and what to keep apart from the inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct DataSpec {
    /// As the user gave them: files, folders, or glob patterns.
    pub paths: Vec<PathBuf>,
    /// The label feature (or array).
    pub label: String,
    /// The per-example weight feature, if any.
    pub weight: Option<String>,
    /// Feature names to slice metrics by.
    pub slices: Vec<String>,
    /// `(signature input name, feature name)`.
    pub renames: Vec<(String, String)>,
    /// Read at most this many examples (of the shard's, with `shard`).
    pub limit: Option<u64>,
    /// Rows per batch, at least 1.
    pub batch_size: usize,
    /// Skip corrupt TFRecord records (counted) instead of failing.
    pub skip_corrupt: bool,
    /// Read only this shard of the dataset (see the `shard` module).
    pub shard: Option<DataShard>,
    /// Read the files named (or matched by a pattern) as this format,
    /// whatever their names say (`--data-format`); folders are still
    /// listed by file name endings.
    pub format: Option<Format>,
    /// `--example-key FEATURE`: each example's identity, read as a slice
    /// value is (its text) and handed in [`Targets::keys`](crate::data::Targets::keys): what bootstrap
    /// weights are drawn from and what predictions are matched by.
    pub example_key: Option<String>,
}

impl DataSpec {
    /// `paths` read in batches of `batch_size` rows with `label` as the
    /// label, and nothing else asked for: no weight, slice, rename, limit,
    /// shard, format or example key, corrupt records an error.
    pub fn new(paths: Vec<PathBuf>, label: impl Into<String>, batch_size: usize) -> DataSpec {
        DataSpec {
            paths,
            label: label.into(),
            weight: None,
            slices: Vec::new(),
            renames: Vec::new(),
            limit: None,
            batch_size,
            skip_corrupt: false,
            shard: None,
            format: None,
            example_key: None,
        }
    }

    /// The features read as text for each example: the slices, then the
    /// example key.
    pub(crate) fn text_features(&self) -> Vec<String> {
        self.slices.iter().chain(self.example_key.iter()).cloned().collect()
    }
}

/// How a model is fed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Feeding {
    /// The serialized records go, as they are, to the one string input.
    RawRecords { input: String },
    /// Features (or arrays) are converted into dense tensors, one per input.
    Features,
}

pub(super) struct Inner {
    pub(super) spec: DataSpec,
    /// The files this dataset (or shard) reads.
    pub(super) files: Vec<(PathBuf, Format)>,
    /// The part of each file read.
    pub(super) part: Part,
    /// The family's format that decides feeding: the first file's.
    pub(super) format: Format,
    pub(super) first: FirstLook,
    pub(super) label: LabelKind,
    /// `--label-classes`: string labels are these classes' indices.
    pub(super) classes: Option<LabelClasses>,
    pub(super) digest: String,
    /// Every file of the dataset, a shard's or not.
    pub(super) dataset_files: Vec<(PathBuf, Format)>,
    pub(super) dataset_digest: String,
}

impl Inner {
    /// The path of the `opened`-th file opened (1-based; 0 before any: the first).
    pub(super) fn file_path(&self, opened: usize) -> PathBuf {
        self.files[opened.saturating_sub(1).min(self.files.len() - 1)].0.clone()
    }
}

/// How sources are opened for this spec.
pub(super) fn options(spec: &DataSpec, part: Part, columns: Vec<String>, skipped: Arc<AtomicU64>) -> Options {
    Options { skip_corrupt: spec.skip_corrupt, skipped, columns, part }
}
