//! Labelled datasets, streamed in batches: what a model is fed and what the
//! supervisor keeps to score it.
//!
//! A [`Dataset`] is the checked list of files (see `paths` for how paths,
//! folders and globs become files, `format` for the formats, `source` for
//! their readers, `shard` for which files and parts a [`DataShard`]
//! reads); [`Dataset::reader`] makes a [`BatchReader`] for one model's
//! signature, which asks the file's source for pieces and builds batches
//! from them with the conversions in `batch`. Each batch has the worker's
//! inputs (dense tensors shaped by the signature) and the [`Targets`]
//! (labels, weights, slice values) that never leave the supervisor.
//!
//! The files: this one opens and checks a [`Dataset`] and plans a reader;
//! `spec` holds what both it and the readers share ([`DataSpec`],
//! [`Feeding`], the checked facts), `first_look` the first example's (or
//! columns') checks and label kind, `kept` the passes kept by
//! [`Dataset::keep_decoded`], `reader` the [`BatchReader`] and its
//! prefetch thread.
//!
//! Decisions:
//! - Feeding: a signature whose only input is a string tensor gets the
//!   serialized records as they are ([`Feeding::RawRecords`], TF Serving's
//!   classify/regress signatures), unless the examples have a feature of that
//!   input's name (after renames), which is then fed as a feature.
//! - A signature's one input that the data has no column of its name for
//!   (and no `--feature` rename names) is fed from the data's one column
//!   nothing else uses, when that column fits it ([`Dataset::auto_feature`]):
//!   Keras names a `Sequential` model's input `input_layer`, whatever the
//!   table calls it. Two candidates, or one that does not fit, leave the
//!   input missing, and its error names the rename to give.
//! - Shapes: the signature's shape without its batch dimension gives the
//!   values per example; one unknown dimension is inferred from the first
//!   example the reader sees, and every later example must have the same
//!   count. `[?]` takes one value per example (shape `[rows]`). An input of
//!   unknown rank gets `[rows]` for one value per example, else `[rows, n]`
//!   (for arrays: the array's own dimensions).
//! - Conversions: float inputs take `float_list` or `int64_list`; integer
//!   and bool inputs take `int64_list` (range-checked; bool is value != 0);
//!   string inputs take `bytes_list`. Arrays (and Parquet/Arrow columns)
//!   convert the same way (an integer input refuses a float array); a
//!   column of strings for a numeric input, or of numbers for a string
//!   input, is refused by [`Dataset::reader`], before any batch.
//! - Labels: integers (or bools) with one value per example are
//!   [`Labels::Int`], floats [`Labels::Float`], more values per example
//!   [`Labels::Matrix`]; the kind is the first example's, and every later
//!   example must agree. String labels are class names: with
//!   `--label-classes` ([`Dataset::open_with_classes`]) each is its index
//!   in the order given (see `label_classes`), without it they are refused
//!   by [`Dataset::open`], showing the first distinct values. Weights are
//!   one number per example.
//! - Slices: a slice feature's value as text (ints decimal, floats Rust's
//!   shortest round trip, bytes UTF-8 lossy, several values joined by `,`);
//!   an example without the feature is in slice `__missing__`.
//! - CSV rows become examples of one-value features (see `source::csv`)
//!   and go through the same conversions.
//! - JSON Lines are read as columns (see `source::jsonl`): each key's values
//!   with the first line's element type and dimensions, converted as arrays.
//! - Example indices in errors are 0-based over the dataset (records skipped
//!   as corrupt are not counted), with the record's (or CSV data row's)
//!   0-based index within its file (within its part, for a shard's part of
//!   a plain TFRecord file, which is entered midway).
//! - Memory: nothing grows with the dataset. Records are read into one
//!   reused buffer, arrays a batch of rows at a time; no buffer is sized by
//!   what a header claims, and a batch is capped at [`MAX_BATCH_BYTES`].
//! - Reading once for several models ([`Dataset::keep_decoded`]): a pass
//!   that read the whole data without an error keeps its batches, when
//!   they come to at most the cap given, and a later reader with the same
//!   plan (the same inputs, dtypes and shapes) replays them instead of
//!   reading and decoding the files again: the same batches, bit for bit,
//!   with the same count of skipped records. A pass over the cap drops
//!   what it kept and no later pass keeps anything; a pass that failed
//!   keeps nothing, so every reader after it reads the files (and meets
//!   the error) again. Off unless asked: a reader alone never keeps more
//!   than the batches in flight.
//! - Failures mid-stream are errors, never an early end: every shard's
//!   label and weight arrays are checked as the first shard's were, and a
//!   panic while reading (or a prefetch thread that stops without saying the
//!   data ended) is a [`DataError::Reader`] naming the file.

mod first_look;
mod kept;
mod reader;
mod spec;

use crate::batch::InputPlan;
use crate::element;
use crate::label_classes::{self, LabelClasses};
use crate::source::Part;
use first_look::{
    check_input_column, check_weight_column, first_label_values, first_look, label_kind, LabelError, Seen,
};
use isorun_protocol::{DType, SignatureInfo};
use kept::{Kept, Start};
use sha2::{Digest, Sha256};
use spec::{options, Inner};
use std::path::PathBuf;
use std::sync::Arc;

pub use crate::batch::{Batch, Labels, Targets, MAX_BATCH_BYTES, MISSING_SLICE};
pub use crate::error::DataError;
pub use crate::format::Format;
pub use crate::shard::DataShard;
pub use kept::KEEP_DECODED_BYTES;
pub use reader::BatchReader;
pub use spec::{DataSpec, Feeding};

/// A checked dataset; cheap to clone, shared between readers.
#[derive(Clone)]
pub struct Dataset {
    inner: Arc<Inner>,
    /// [`Dataset::keep_decoded`]: the decoded batches kept for every reader
    /// of the clones of this dataset.
    kept: Option<Arc<Kept>>,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset").field("files", &self.inner.files).field("digest", &self.inner.digest).finish()
    }
}

impl Dataset {
    /// Checks before any work: every path exists / every glob matches,
    /// every file has a known format, files are readable, the first example
    /// (of the first file) parses and has the label (and weight, and slice
    /// features). Errors name the path. With a shard, the checks are the
    /// whole dataset's (every shard agrees on them), and then the shard's
    /// files and parts are chosen.
    pub fn open(spec: DataSpec) -> Result<Dataset, DataError> {
        Dataset::open_with_classes(spec, None)
    }

    /// [`Dataset::open`], string labels read as the indices of `classes`
    /// (`--label-classes`): a label that is not one of them is an error
    /// naming the file, the row and the value. Without classes, a string
    /// label is refused here, with the first distinct values found.
    pub fn open_with_classes(spec: DataSpec, classes: Option<LabelClasses>) -> Result<Dataset, DataError> {
        if spec.batch_size == 0 {
            return Err(DataError::InvalidSpec { reason: "the batch size must be at least 1".into() });
        }
        if spec.paths.is_empty() {
            return Err(DataError::InvalidSpec { reason: "no data paths given".into() });
        }
        let all = crate::paths::expand(&spec.paths, spec.format)?;
        for (path, format) in &all {
            format.info().probe(path)?;
        }
        let whole = options(&spec, Part::WHOLE, Vec::new(), Arc::default());
        let first = first_look(&all, &whole)?;
        let missing = |what: &'static str, name: &str| DataError::MissingFeature {
            path: first.path.clone(),
            what,
            name: name.to_string(),
            available: first.available(),
        };
        if !first.has(&spec.label) {
            return Err(missing("label", &spec.label));
        }
        if let Some(weight) = &spec.weight {
            if !first.has(weight) {
                return Err(missing("weight", weight));
            }
        }
        for slice in &spec.slices {
            if !first.has(slice) {
                return Err(missing("slice feature", slice));
            }
        }
        if let Some(key) = &spec.example_key {
            if !first.has(key) {
                return Err(missing("example key", key));
            }
        }
        let label = label_kind(&first, &spec.label, classes.as_ref()).map_err(|e| match e {
            LabelError::Data(e) => e,
            LabelError::Strings { path, what } => {
                let format = all.iter().find(|(p, _)| *p == first.path).map_or(all[0].1, |(_, f)| *f);
                let values = first_label_values(&first.path, format, &spec.label, &whole);
                label_classes::missing_classes(&path, what, &values)
            }
        })?;
        if let Some(column) = spec.weight.as_ref().and_then(|w| first.column(w)) {
            check_weight_column(column)?;
        }
        let format = all[0].1;
        // What every shard of this dataset shares: its files, not how they were named or split.
        let dataset_digest =
            digest(&DataSpec { paths: Vec::new(), shard: None, ..spec.clone() }, classes.as_ref(), &all)?;
        let (files, part) = match spec.shard {
            Some(shard) => shard.select(&all),
            None => (all.clone(), Part::WHOLE),
        };
        let digest = digest(&spec, classes.as_ref(), &files)?;
        let dataset_files = all;
        Ok(Dataset {
            inner: Arc::new(Inner {
                spec,
                files,
                part,
                format,
                first,
                label,
                classes,
                digest,
                dataset_files,
                dataset_digest,
            }),
            kept: None,
        })
    }

    /// Reads the data once for several models: the first reader that goes
    /// through every batch without an error keeps the decoded batches, when
    /// they come to at most `cap` bytes, and later readers of this dataset
    /// (or its clones) with the same plan replay them, the same batches bit
    /// for bit, instead of reading the files again. A pass over `cap` drops
    /// what it kept and later readers read the files as without this.
    pub fn keep_decoded(mut self, cap: u64) -> Dataset {
        self.kept = Some(Arc::new(Kept::new(cap)));
        self
    }

    /// The files, in the order read (sorted bytewise within a folder/glob),
    /// and their format; with a shard, the files the shard reads (all of
    /// them when each is split into parts, see [`Dataset::part`]).
    pub fn files(&self) -> &[(PathBuf, Format)] {
        &self.inner.files
    }

    /// Every file of the dataset, in reading order, a shard's or not: what
    /// every data shard of one dataset agrees on.
    pub fn dataset_files(&self) -> &[(PathBuf, Format)] {
        &self.inner.dataset_files
    }

    /// SHA-256 (hex) over every file of the dataset (path, format, size and
    /// mtime) and the spec but for its paths and shard: the same for every
    /// data shard of one dataset read the same way, so `isorun report
    /// merge` can refuse shards of different data.
    pub fn dataset_digest(&self) -> String {
        self.inner.dataset_digest.clone()
    }

    /// Which part of each file is read, `(K, N)`: `(0, 1)` for all of it.
    pub fn part(&self) -> (u64, u64) {
        (self.inner.part.index, self.inner.part.count)
    }

    /// The spec the dataset was opened with.
    pub fn spec(&self) -> &DataSpec {
        &self.inner.spec
    }

    /// SHA-256 (hex) over the spec (its shard included) and each file's
    /// path, size and mtime, for journal keys.
    pub fn digest(&self) -> String {
        self.inner.digest.clone()
    }

    /// A stream of batches for one model's signature. Decides how the model
    /// is fed (see the module docs); errors, before reading batches, when a
    /// signature input has no feature/array of that name (after renames),
    /// naming the input and the available features.
    pub fn reader(&self, signature: &SignatureInfo) -> Result<BatchReader, DataError> {
        let inner = &self.inner;
        let path = inner.first.path.clone();
        let auto = self.auto_feature(signature);
        let feature_name = |input: &str| -> String {
            match inner.spec.renames.iter().find(|(i, _)| i == input) {
                Some((_, feature)) => feature.clone(),
                None => match &auto {
                    Some((only, column)) if only == input => column.clone(),
                    _ => input.to_string(),
                },
            }
        };
        let raw = match signature.inputs.as_slice() {
            [only] if only.dtype == DType::String && inner.format.is_tfrecord() => {
                !inner.first.has(&feature_name(&only.name))
            }
            _ => false,
        };
        let (feeding, inputs) = if raw {
            (Feeding::RawRecords { input: signature.inputs[0].name.clone() }, Vec::new())
        } else {
            let mut plans = Vec::new();
            for spec in &signature.inputs {
                let feature = feature_name(&spec.name);
                if !inner.first.has(&feature) {
                    let (input, available) = (spec.name.clone(), inner.first.available());
                    // A feature nothing else takes (Keras names a Sequential model's input
                    // `input_layer`, whatever the data calls it): the rename to give.
                    let taken = |name: &str| {
                        let inputs = signature.inputs.iter().map(|i| feature_name(&i.name));
                        name == inner.spec.label
                            || inner.spec.weight.as_deref() == Some(name)
                            || inner.spec.text_features().iter().any(|t| t == name)
                            || inputs.into_iter().any(|f| f == name)
                    };
                    return Err(match inner.first.names().into_iter().find(|n| !taken(n)) {
                        Some(unused) => DataError::UnfedInput { path: path.clone(), input, feature, available, unused },
                        None => DataError::MissingInput { path: path.clone(), input, feature, available },
                    });
                }
                if let Some(column) = inner.first.column(&feature) {
                    check_input_column(column, spec)?;
                }
                plans.push(InputPlan::new(spec, feature, &path, !inner.format.is_columnar())?);
            }
            (Feeding::Features, plans)
        };
        let keeping = match &self.kept {
            Some(kept) => match kept.start(&feeding, &inputs) {
                Start::Replay(pass) => return Ok(BatchReader::replay(feeding, pass)),
                Start::Keep(keeping) => Some(keeping),
                Start::Read => None,
            },
            None => None,
        };
        Ok(BatchReader::direct(Arc::clone(&self.inner), feeding, inputs, keeping))
    }
}

impl Dataset {
    /// The column that feeds a signature's one input when the data has no
    /// column of its name and no `--feature` rename names one for it:
    /// `(input, column)` when exactly one column is used by nothing else
    /// (the label, the weight, the slices, the example key, a rename) and
    /// it fits the input (numbers for a number input, strings for a string
    /// one, as many values per example as its shape takes). Table and array
    /// data only (Parquet, Arrow, CSV, JSON Lines, npz); a TFRecord's
    /// features are fed by name (a string input takes the records whole).
    pub fn auto_feature(&self, signature: &SignatureInfo) -> Option<(String, String)> {
        let inner = &self.inner;
        let spec = &inner.spec;
        let [only] = signature.inputs.as_slice() else { return None };
        if inner.first.has(&only.name) || spec.renames.iter().any(|(input, _)| *input == only.name) {
            return None;
        }
        if inner.format.is_tfrecord() {
            return None;
        }
        let taken = |name: &str| {
            name == spec.label
                || spec.weight.as_deref() == Some(name)
                || spec.text_features().iter().any(|t| t == name)
                || spec.renames.iter().any(|(_, feature)| feature == name)
        };
        // Each candidate: its name, whether it holds numbers, its dimensions and values per example.
        let candidates: Vec<(&str, bool, Vec<u64>, u64)> = match &inner.first.what {
            Seen::Columns(columns) => columns
                .iter()
                .map(|c| {
                    (c.name.as_str(), element::number(c.element, &[0; 8]).is_some(), c.dims.clone(), c.row_elements())
                })
                .collect(),
            // A CSV row's one-value features.
            Seen::Features(features) => features
                .iter()
                .map(|(name, kind, len)| (name.as_str(), *kind != "bytes_list", vec![*len as u64], *len as u64))
                .collect(),
        };
        let mut unused = candidates.into_iter().filter(|(name, ..)| !taken(name));
        let (name, numbers, dims, count) = unused.next()?;
        (unused.next().is_none() && fits(only, numbers, &dims, count)).then(|| (only.name.clone(), name.to_string()))
    }
}

/// Whether a column of numbers (or strings), `dims` and `count` values per
/// example, can feed `input` as [`InputPlan`] would shape it.
fn fits(input: &isorun_protocol::TensorSpec, numbers: bool, dims: &[u64], count: u64) -> bool {
    if numbers != (input.dtype != DType::String) {
        return false;
    }
    let Some(shape) = &input.shape else { return true };
    // A scalar input has no batch dimension: nothing feeds it by rows.
    let Some(tail) = shape.get(1..) else { return false };
    if tail.len() == dims.len() && tail.iter().zip(dims).all(|(d, own)| d.is_none_or(|d| d == *own)) {
        return true;
    }
    let known: u64 = tail.iter().flatten().product();
    match tail.iter().filter(|d| d.is_none()).count() {
        0 => known == count,
        1 => count.checked_rem(known) == Some(0),
        _ => false,
    }
}

fn digest(spec: &DataSpec, classes: Option<&LabelClasses>, files: &[(PathBuf, Format)]) -> Result<String, DataError> {
    let mut hasher = Sha256::new();
    hasher.update(format!("{spec:?}").as_bytes());
    // Classes change what the labels are; without them, the digest is as it was.
    if let Some(classes) = classes {
        hasher.update(format!("\0label_classes{:?}", classes.names()).as_bytes());
    }
    for (path, format) in files {
        let meta = std::fs::metadata(path).map_err(|source| DataError::Io { path: path.clone(), source })?;
        let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
        hasher.update(format!("\0{}\0{}\0{}\0{}", path.display(), format.name(), meta.len(), mtime.as_nanos()));
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
