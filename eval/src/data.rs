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

use crate::batch::{
    add_columns, add_example, check_batch_cost, Column, ExamplePlace, InputPlan, LabelKind, Roles, TargetsOut,
    PREALLOCATE_BYTES,
};
use crate::element;
use crate::example::Example;
use crate::label_classes::{self, LabelClasses};
use crate::source::{ColumnInfo, Look, Options, Part, Piece, Source, Values};
use isorun_protocol::{DType, SignatureInfo, Tensor, TensorData};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::batch::{Batch, Labels, Targets, MAX_BATCH_BYTES, MISSING_SLICE};
pub use crate::error::DataError;
pub use crate::format::Format;
pub use crate::shard::DataShard;

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
    /// value is (its text) and handed in [`Targets::keys`]: what bootstrap
    /// weights are drawn from and what predictions are matched by.
    pub example_key: Option<String>,
}

impl DataSpec {
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

/// What the first example (or the first file's columns) shows.
#[derive(Debug, Clone)]
struct FirstLook {
    path: PathBuf,
    what: Seen,
}

#[derive(Debug, Clone)]
enum Seen {
    /// Feature names with their kind and length.
    Features(Vec<(String, &'static str, usize)>),
    Columns(Vec<ColumnInfo>),
}

impl FirstLook {
    fn available(&self) -> String {
        let names: Vec<String> = match &self.what {
            Seen::Features(features) => {
                features.iter().map(|(n, kind, len)| format!("{n} ({kind}, {len} values)")).collect()
            }
            Seen::Columns(columns) => columns.iter().map(|c| format!("{} ({})", c.name, c.describe)).collect(),
        };
        if names.is_empty() {
            "nothing".into()
        } else {
            names.join(", ")
        }
    }

    /// The features' (or columns') names, in the order [`FirstLook::available`] lists them.
    fn names(&self) -> Vec<String> {
        match &self.what {
            Seen::Features(features) => features.iter().map(|(n, ..)| n.clone()).collect(),
            Seen::Columns(columns) => columns.iter().map(|c| c.name.clone()).collect(),
        }
    }

    fn has(&self, name: &str) -> bool {
        match &self.what {
            Seen::Features(features) => features.iter().any(|(n, ..)| n == name),
            Seen::Columns(columns) => columns.iter().any(|c| c.name == name),
        }
    }

    fn column(&self, name: &str) -> Option<&ColumnInfo> {
        match &self.what {
            Seen::Features(_) => None,
            Seen::Columns(columns) => columns.iter().find(|c| c.name == name),
        }
    }
}

struct Inner {
    spec: DataSpec,
    /// The files this dataset (or shard) reads.
    files: Vec<(PathBuf, Format)>,
    /// The part of each file read.
    part: Part,
    /// The family's format that decides feeding: the first file's.
    format: Format,
    first: FirstLook,
    label: LabelKind,
    /// `--label-classes`: string labels are these classes' indices.
    classes: Option<LabelClasses>,
    digest: String,
    /// Every file of the dataset, a shard's or not.
    dataset_files: Vec<(PathBuf, Format)>,
    dataset_digest: String,
}

/// A checked dataset; cheap to clone, shared between readers.
#[derive(Clone)]
pub struct Dataset {
    inner: Arc<Inner>,
    /// [`Dataset::keep_decoded`]: the decoded batches kept for every reader
    /// of the clones of this dataset.
    kept: Option<Arc<Kept>>,
}

/// The cap `isorun eval` gives [`Dataset::keep_decoded`] for a run of
/// several models: a dataset that decodes to more is read again per model.
pub const KEEP_DECODED_BYTES: u64 = 256 << 20;

/// A whole pass's decoded batches, kept to be replayed (see
/// [`Dataset::keep_decoded`]).
struct Kept {
    /// The most bytes of decoded batches kept.
    cap: u64,
    state: Mutex<KeptState>,
}

#[derive(Default)]
struct KeptState {
    /// The first pass that read everything, and for which plan.
    pass: Option<(PlanKey, Arc<KeptPass>)>,
    /// A pass went over the cap: no later one keeps anything either.
    over_cap: bool,
}

/// A kept pass: its batches and the records it skipped as corrupt.
struct KeptPass {
    batches: Vec<Batch>,
    skipped: u64,
}

/// What makes two readers' batches the same: how the model is fed, and
/// each input's name, data column, dtype and signature dims.
type PlanKey = (Feeding, Vec<(String, String, DType, Option<Vec<Option<u64>>>)>);

/// A pass being kept, on the thread that decodes it.
struct Keeping {
    kept: Arc<Kept>,
    key: PlanKey,
    batches: Vec<Batch>,
    bytes: u64,
}

/// The bytes a decoded batch holds (its tensors' elements, its labels,
/// weights, slice values and keys), what [`Kept::cap`] counts.
fn batch_bytes(batch: &Batch) -> u64 {
    let tensors: usize = batch
        .inputs
        .iter()
        .map(|(_, t)| match &t.data {
            TensorData::Dense(bytes) => bytes.len(),
            TensorData::Strings(strings) => strings.iter().map(|s| s.len() + 24).sum(),
            TensorData::Shared(_) => 0,
        })
        .sum();
    let t = &batch.targets;
    let labels = match &t.labels {
        Labels::Int(v) => v.len() * 8,
        Labels::Float(v) => v.len() * 8,
        Labels::Matrix { values, .. } => values.len() * 8,
    };
    let texts = |v: &[String]| v.iter().map(|s| s.len() + 24).sum::<usize>();
    let slices: usize = t.slices.iter().map(|(_, v)| texts(v)).sum();
    let keys = t.keys.as_deref().map_or(0, texts);
    (tensors + labels + t.weights.as_ref().map_or(0, |w| w.len() * 8) + slices + keys) as u64
}

impl Keeping {
    /// Keeps a batch just decoded; false (and nothing kept, by this pass or
    /// any later one) when it would take the pass over the cap.
    fn keep(&mut self, batch: &Batch) -> bool {
        self.bytes = self.bytes.saturating_add(batch_bytes(batch));
        if self.bytes > self.kept.cap {
            self.kept.state.lock().unwrap_or_else(|e| e.into_inner()).over_cap = true;
            return false;
        }
        self.batches.push(batch.clone());
        true
    }

    /// The pass read everything: its batches are kept for later readers
    /// (unless another pass was kept first).
    fn finish(self, skipped: u64) {
        let mut state = self.kept.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.pass.is_none() && !state.over_cap {
            state.pass = Some((self.key, Arc::new(KeptPass { batches: self.batches, skipped })));
        }
    }
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
            (format.info().probe)(path)?;
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
        self.kept = Some(Arc::new(Kept { cap, state: Mutex::default() }));
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
        let decoding = Arc::new(AtomicU64::new(0));
        let keeping = match &self.kept {
            Some(kept) => {
                let key: PlanKey = (
                    feeding.clone(),
                    inputs.iter().map(|p| (p.input.clone(), p.source.clone(), p.dtype, p.dims.clone())).collect(),
                );
                let state = kept.state.lock().unwrap_or_else(|e| e.into_inner());
                match &state.pass {
                    Some((kept_key, pass)) if *kept_key == key => {
                        let skipped = Arc::new(AtomicU64::new(pass.skipped));
                        let mode = Mode::Replay { pass: Arc::clone(pass), next: 0 };
                        return Ok(BatchReader { feeding, skipped, decoding, mode });
                    }
                    Some(_) => None,
                    None if state.over_cap => None,
                    None => Some(Keeping { kept: Arc::clone(kept), key, batches: Vec::new(), bytes: 0 }),
                }
            }
            None => None,
        };
        let direct = Direct {
            data: Arc::clone(&self.inner),
            feeding: feeding.clone(),
            inputs,
            next_file: 0,
            reading: Arc::new(AtomicUsize::new(0)),
            source: None,
            source_row: 0,
            produced: 0,
            example_index: 0,
            skipped: Arc::new(AtomicU64::new(0)),
            decoding: Arc::clone(&decoding),
            keeping,
        };
        let skipped = Arc::clone(&direct.skipped);
        Ok(BatchReader { feeding, skipped, decoding, mode: Mode::Direct(Box::new(direct), false) })
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

/// How sources are opened for this spec.
fn options(spec: &DataSpec, part: Part, columns: Vec<String>, skipped: Arc<AtomicU64>) -> Options {
    Options { skip_corrupt: spec.skip_corrupt, skipped, columns, part }
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

/// An example's features, sorted by name: name, kind and value count.
fn feature_list(example: &Example) -> Vec<(String, &'static str, usize)> {
    let mut features: Vec<(String, &'static str, usize)> = example
        .features
        .iter()
        .flat_map(|f| f.feature.iter())
        .map(|(k, f)| (k.clone(), f.kind_name(), f.len()))
        .collect();
    features.sort();
    features
}

/// The first example of the first file that has one (row formats), or the
/// first file's columns (columnar formats, whose files all show columns).
fn first_look(files: &[(PathBuf, Format)], options: &Options) -> Result<FirstLook, DataError> {
    for (path, format) in files {
        let what = match (format.info().peek)(path, options)? {
            None => continue,
            Some(Look::Example(example)) => Seen::Features(feature_list(&example)),
            Some(Look::Columns(columns)) => Seen::Columns(columns),
        };
        return Ok(FirstLook { path: path.clone(), what });
    }
    Err(DataError::Empty { path: files[0].0.clone() })
}

/// Why a label cannot be read: a data error, or a string label without
/// `--label-classes` (whose error shows the first values, read by the caller).
enum LabelError {
    Data(DataError),
    Strings { path: PathBuf, what: &'static str },
}

impl From<DataError> for LabelError {
    fn from(e: DataError) -> Self {
        LabelError::Data(e)
    }
}

fn label_kind(first: &FirstLook, label: &str, classes: Option<&LabelClasses>) -> Result<LabelKind, LabelError> {
    match &first.what {
        Seen::Features(features) => {
            let (_, kind, len) = features.iter().find(|(n, ..)| n == label).expect("checked");
            let problem = match (*kind, *len, classes) {
                (_, 0, _) => "is empty",
                ("bytes_list", 1, Some(_)) => return Ok(LabelKind::Int),
                ("bytes_list", 1, None) => {
                    let path = PathBuf::from(format!("{}: feature '{label}'", first.path.display()));
                    return Err(LabelError::Strings { path, what: "bytes_list" });
                }
                ("bytes_list", _, Some(_)) => "is bytes_list of several values; --label-classes takes one class name",
                ("bytes_list", _, None) => "is bytes_list; labels are numbers (int64_list or float_list)",
                (_, _, Some(_)) => "is numbers, but --label-classes names the classes of a string label",
                (_, n, None) if n > 1 => return Ok(LabelKind::Matrix(n)),
                ("int64_list", _, None) => return Ok(LabelKind::Int),
                _ => return Ok(LabelKind::Float),
            };
            Err(LabelError::Data(DataError::Example {
                path: first.path.clone(),
                example: 0,
                record: 0,
                within: "this file".into(),
                key: label.to_string(),
                problem: format!("(the label) {problem}"),
            }))
        }
        Seen::Columns(_) => column_label_kind(first.column(label).expect("checked"), classes),
    }
}

/// The label kind of a column, checked for every file: numbers, at least
/// one per example, or with `--label-classes` one string per example.
fn column_label_kind(column: &ColumnInfo, classes: Option<&LabelClasses>) -> Result<LabelKind, LabelError> {
    let strings = element::number(column.element, &[0; 8]).is_none();
    let fail = |reason: String| LabelError::Data(DataError::Array { path: column.path.clone(), reason });
    match (strings, classes, column.row_elements()) {
        (true, Some(_), 1) => Ok(LabelKind::Int),
        (true, Some(_), n) => {
            Err(fail(format!("--label-classes takes one class name per example, but this label has {n} values")))
        }
        (true, None, _) => Err(LabelError::Strings { path: column.path.clone(), what: "strings" }),
        (false, Some(_), _) => Err(fail(format!(
            "--label-classes names the classes of a string label, but this label is {}",
            column.describe
        ))),
        (false, None, 0) => Err(fail("labels have no values".into())),
        (false, None, 1) if element::is_integer(column.element) => Ok(LabelKind::Int),
        (false, None, 1) => Ok(LabelKind::Float),
        (false, None, n) => Ok(LabelKind::Matrix(n as usize)),
    }
}

/// The first distinct values of a string label, from the first rows of
/// `path` (for the error that asks for `--label-classes`); none when they
/// cannot be read.
fn first_label_values(path: &Path, format: Format, label: &str, whole: &Options) -> Vec<Vec<u8>> {
    let options = Options { columns: vec![label.to_string()], ..whole.clone() };
    let Ok(mut source) = (format.info().open)(path, &options) else { return Vec::new() };
    let mut values: Vec<Vec<u8>> = Vec::new();
    let mut rows = 0;
    while rows < label_classes::SAMPLED_ROWS && values.len() < label_classes::SHOWN_VALUES {
        let piece = match source.next_piece(label_classes::SAMPLED_ROWS - rows) {
            Ok(Some(piece)) => piece,
            _ => break,
        };
        let found: Vec<Vec<u8>> = match piece {
            Piece::Example { example, .. } => {
                rows += 1;
                let feature = example.features.as_ref().and_then(|f| f.feature.get(label));
                match feature.and_then(|f| f.kind.as_ref()) {
                    Some(crate::example::Kind::BytesList(l)) => l.value.clone(),
                    _ => Vec::new(),
                }
            }
            Piece::Columns { rows: taken, mut columns } => {
                rows += taken.max(1);
                match columns.pop().map(|c| c.values) {
                    Some(Values::Strings(strings)) => strings,
                    Some(Values::Elements { element, bytes }) => bytes
                        .chunks_exact(element.item_size().max(1))
                        .filter_map(|chunk| element::string(element, chunk))
                        .collect(),
                    None => Vec::new(),
                }
            }
        };
        values.extend(found);
        values = label_classes::distinct(values.iter().map(Vec::as_slice));
    }
    values
}

/// A column of strings cannot feed a numeric input, nor numbers a string
/// input: refused from the first file's header or schema, before any work.
fn check_input_column(column: &ColumnInfo, input: &isorun_protocol::TensorSpec) -> Result<(), DataError> {
    let numbers = element::number(column.element, &[0; 8]).is_some();
    if numbers == (input.dtype != DType::String) {
        return Ok(());
    }
    Err(DataError::Array {
        path: column.path.clone(),
        // A type ("string") is named as a column's; a description that is a
        // phrase of its own (JSON Lines' "an object or value ...") as it is.
        reason: if column.describe.starts_with("a ") || column.describe.starts_with("an ") {
            format!("{} cannot feed input {}", column.describe, input.describe())
        } else {
            format!("a {} column cannot feed input {}", column.describe, input.describe())
        },
    })
}

/// Weights are one number per example, in every file.
fn check_weight_column(column: &ColumnInfo) -> Result<(), DataError> {
    if column.row_elements() != 1 || element::number(column.element, &[0; 8]).is_none() {
        return Err(DataError::Array {
            path: column.path.clone(),
            reason: format!("weights must be one number per example, not {}", column.describe),
        });
    }
    Ok(())
}

/// The reader itself, on the caller's thread or the prefetch thread.
struct Direct {
    data: Arc<Inner>,
    feeding: Feeding,
    inputs: Vec<InputPlan>,
    next_file: usize,
    /// `next_file`, shared with the reader's owner while prefetching.
    reading: Arc<AtomicUsize>,
    source: Option<Box<dyn Source>>,
    /// Rows the open columnar source has handed (what its rows count from).
    source_row: u64,
    produced: u64,
    example_index: u64,
    skipped: Arc<AtomicU64>,
    /// Nanoseconds spent decoding batches, summed (shared with the owner).
    decoding: Arc<AtomicU64>,
    /// [`Dataset::keep_decoded`]: this pass's batches so far, while under the cap.
    keeping: Option<Keeping>,
}

enum Mode {
    /// The reader, and whether it is finished.
    Direct(Box<Direct>, bool),
    Prefetch {
        batches: mpsc::Receiver<FromThread>,
        done: bool,
        /// The file the thread reads, for an error when it stops without a word.
        reading: Arc<AtomicUsize>,
        data: Arc<Inner>,
    },
    /// A kept pass replayed ([`Dataset::keep_decoded`]): the next batch's index.
    Replay { pass: Arc<KeptPass>, next: usize },
}

/// What the prefetch thread sends: a channel that closes without `End`
/// means the thread died, which is an error, not the end of the data.
enum FromThread {
    Batch(Result<Batch, DataError>),
    End,
}

/// A stream of batches for one model.
pub struct BatchReader {
    feeding: Feeding,
    skipped: Arc<AtomicU64>,
    /// Nanoseconds spent decoding, on whichever thread decodes.
    decoding: Arc<AtomicU64>,
    mode: Mode,
}

impl std::fmt::Debug for BatchReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchReader").field("feeding", &self.feeding).field("skipped", &self.skipped()).finish()
    }
}

impl BatchReader {
    /// How the model is fed.
    pub fn feeding(&self) -> &Feeding {
        &self.feeding
    }

    /// The next batch, or `None` at the end (or at the limit). Data errors
    /// come as `Err`; after an `Err` the reader is finished.
    pub fn next_batch(&mut self) -> Option<Result<Batch, DataError>> {
        match &mut self.mode {
            Mode::Direct(_, true) | Mode::Prefetch { done: true, .. } => None,
            Mode::Replay { pass, next } => {
                let batch = pass.batches.get(*next).cloned()?;
                *next += 1;
                Some(Ok(batch))
            }
            Mode::Direct(direct, finished) => {
                let result = direct.fill_timed().transpose();
                if !matches!(result, Some(Ok(_))) {
                    *finished = true;
                }
                result
            }
            Mode::Prefetch { batches, done, reading, data } => {
                let result = match batches.recv() {
                    Ok(FromThread::Batch(result)) => Some(result),
                    Ok(FromThread::End) => None,
                    Err(mpsc::RecvError) => Some(Err(DataError::Reader {
                        path: data.file_path(reading.load(Ordering::Relaxed)),
                        reason: "the prefetch thread stopped before the end of the data".into(),
                    })),
                };
                if !matches!(result, Some(Ok(_))) {
                    *done = true;
                }
                result
            }
        }
    }

    /// Corrupt records skipped so far (with `skip_corrupt`): one per bad
    /// record, and one for a file whose rest was skipped (bad length CRC,
    /// truncation). With prefetching it may count a batch or two ahead.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// The time spent decoding the batches read so far (and, prefetching,
    /// the one or two ahead), on the prefetch thread when there is one:
    /// there it overlapped the caller's work. A replayed pass decodes nothing.
    pub fn decode_time(&self) -> Duration {
        Duration::from_nanos(self.decoding.load(Ordering::Relaxed))
    }

    /// True when the batches come from a pass kept by an earlier reader
    /// ([`Dataset::keep_decoded`]), not from the files.
    pub fn replays(&self) -> bool {
        matches!(self.mode, Mode::Replay { .. })
    }

    /// Moves reading to a thread that keeps up to `depth` batches ready
    /// (double buffering: `prefetch(2)`); same interface. `depth` 0 counts as 1.
    /// Dropping the reader stops the thread after the batch it is reading.
    pub fn prefetch(self, depth: usize) -> BatchReader {
        let BatchReader { feeding, skipped, decoding, mode } = self;
        let Mode::Direct(mut direct, finished) = mode else {
            return BatchReader { feeding, skipped, decoding, mode };
        };
        let (sender, batches) = mpsc::sync_channel(depth.max(1) - 1);
        let reading = Arc::clone(&direct.reading);
        let data = Arc::clone(&direct.data);
        if !finished {
            std::thread::Builder::new()
                .name("isorun-eval-prefetch".into())
                .spawn(move || loop {
                    let message = match direct.fill_timed().transpose() {
                        Some(result) => FromThread::Batch(result),
                        None => FromThread::End,
                    };
                    let last = !matches!(message, FromThread::Batch(Ok(_)));
                    if sender.send(message).is_err() || last {
                        break;
                    }
                })
                .expect("spawn the prefetch thread");
        }
        BatchReader { feeding, skipped, decoding, mode: Mode::Prefetch { batches, done: finished, reading, data } }
    }
}

impl Inner {
    /// The path of the `opened`-th file opened (1-based; 0 before any: the first).
    fn file_path(&self, opened: usize) -> PathBuf {
        self.files[opened.saturating_sub(1).min(self.files.len() - 1)].0.clone()
    }
}

/// The text of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_string(),
        (_, Some(text)) => text.clone(),
        _ => "a panic".into(),
    }
}

impl Direct {
    /// [`Direct::fill_caught`], its time added to `decoding`, and the batch
    /// kept when the dataset keeps decoded passes: a whole pass's batches
    /// are kept at its end, a failed pass's dropped.
    fn fill_timed(&mut self) -> Result<Option<Batch>, DataError> {
        let started = Instant::now();
        let result = self.fill_caught();
        self.decoding.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match &result {
            Ok(Some(batch)) => {
                if let Some(keeping) = &mut self.keeping {
                    if !keeping.keep(batch) {
                        self.keeping = None;
                    }
                }
            }
            Ok(None) => {
                if let Some(keeping) = self.keeping.take() {
                    keeping.finish(self.skipped.load(Ordering::Relaxed));
                }
            }
            Err(_) => self.keeping = None,
        }
        result
    }

    /// [`Direct::fill`], with a panic (a bug, but one an untrusted file may
    /// find) turned into the file's error: never a silent end of the data,
    /// and never the supervisor's crash.
    fn fill_caught(&mut self) -> Result<Option<Batch>, DataError> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.fill())).unwrap_or_else(|payload| {
            Err(DataError::Reader {
                path: self.data.file_path(self.next_file),
                reason: format!("panicked: {}", panic_text(payload.as_ref())),
            })
        })
    }

    /// Reads the next batch; `Ok(None)` at the end.
    fn fill(&mut self) -> Result<Option<Batch>, DataError> {
        let data = Arc::clone(&self.data);
        let spec = &data.spec;
        let want = match spec.limit {
            Some(limit) => (limit.saturating_sub(self.produced)).min(spec.batch_size as u64) as usize,
            None => spec.batch_size,
        };
        if want == 0 {
            return Ok(None);
        }
        let first_index = self.example_index;
        let text_features = spec.text_features();
        let mut columns: Vec<Column> = match &self.feeding {
            Feeding::RawRecords { .. } => vec![Column::Strings(Vec::with_capacity(want.min(PREALLOCATE_BYTES / 24)))],
            Feeding::Features => self
                .inputs
                .iter()
                .map(|p| {
                    // Never more than PREALLOCATE_BYTES from the dims a header claims.
                    let per_row = p.resolved.as_ref().map_or(1, |r| r.1);
                    let elements = want.saturating_mul(per_row);
                    if p.dtype == DType::String {
                        Column::Strings(Vec::with_capacity(elements.min(PREALLOCATE_BYTES / 24)))
                    } else {
                        let bytes = elements.saturating_mul(p.dtype.element_size().unwrap_or(1));
                        Column::Dense(Vec::with_capacity(bytes.min(PREALLOCATE_BYTES)))
                    }
                })
                .collect(),
        };
        let mut targets = TargetsOut {
            labels: Labels::empty(data.label, want),
            weights: spec.weight.as_ref().map(|_| Vec::with_capacity(want)),
            slices: text_features.iter().map(|_| Vec::with_capacity(want)).collect(),
        };
        let roles = Roles {
            label: &spec.label,
            classes: data.classes.as_ref(),
            weight: spec.weight.as_deref(),
            slices: &text_features,
        };
        let raw_feeding = matches!(self.feeding, Feeding::RawRecords { .. });
        // Serialized record bytes in the batch being filled.
        let mut batch_bytes = 0u64;
        let mut rows = 0;
        while rows < want {
            if self.source.is_none() && !self.open_next()? {
                break;
            }
            let path = data.files[self.next_file - 1].0.as_path();
            let source = self.source.as_mut().expect("opened");
            let within = source.within().to_string();
            match source.next_piece(want - rows)? {
                None => {
                    self.source = None;
                }
                Some(Piece::Example { example, record, raw }) => {
                    if let Some(raw) = raw {
                        batch_bytes += raw.bytes.len() as u64;
                        if batch_bytes > MAX_BATCH_BYTES {
                            return Err(DataError::Unsupported {
                                path: path.to_path_buf(),
                                reason: format!(
                                    "record {record} at byte offset {} brings this batch's records to {batch_bytes} \
                                     bytes, more than the {MAX_BATCH_BYTES} a batch may hold; use a smaller \
                                     --batch-size",
                                    raw.offset
                                ),
                            });
                        }
                    }
                    let place = ExamplePlace { path, example: self.example_index, record, within: &within };
                    self.example_index += 1;
                    let raw = if raw_feeding { Some(raw.map_or(&[][..], |r| r.bytes)) } else { None };
                    add_example(&mut self.inputs, example, raw, &place, roles, &mut columns, &mut targets)?;
                    rows += 1;
                }
                Some(Piece::Columns { rows: taken, columns: chunks }) => {
                    let place =
                        ExamplePlace { path, example: self.example_index, record: self.source_row, within: &within };
                    add_columns(&mut self.inputs, taken, chunks, &place, roles, &mut columns, &mut targets)?;
                    self.example_index += taken as u64;
                    self.source_row += taken as u64;
                    rows += taken;
                }
            }
        }
        if rows == 0 {
            return Ok(None);
        }
        self.produced += rows as u64;
        let inputs = match &self.feeding {
            Feeding::RawRecords { input } => {
                let column = columns.pop().expect("one column");
                let Column::Strings(strings) = column else { unreachable!("raw records are strings") };
                vec![(
                    input.clone(),
                    Tensor { dtype: DType::String, shape: vec![rows as u64], data: TensorData::Strings(strings) },
                )]
            }
            Feeding::Features => self
                .inputs
                .iter()
                .zip(columns)
                .map(|(plan, column)| (plan.input.clone(), plan.tensor(rows, column)))
                .collect(),
        };
        let mut texts = targets.slices;
        let keys = match &spec.example_key {
            Some(key) => {
                let keys = texts.pop().expect("the key is the last text feature");
                if let Some(row) = keys.iter().position(|k| k == MISSING_SLICE) {
                    return Err(DataError::Example {
                        path: data.files[self.next_file.max(1) - 1].0.clone(),
                        example: first_index + row as u64,
                        record: first_index + row as u64,
                        within: "the data".into(),
                        key: key.clone(),
                        problem: "(the example key) is missing".into(),
                    });
                }
                Some(keys)
            }
            None => None,
        };
        let slices = spec.slices.iter().cloned().zip(texts).collect();
        let targets = Targets { rows, labels: targets.labels, weights: targets.weights, slices, first_index, keys };
        Ok(Some(Batch { inputs, targets }))
    }

    /// Opens the next file's source; false when there is none. A columnar
    /// file's columns are checked as the first file's were: a later file's
    /// string label or empty weight is its error, not a panic.
    fn open_next(&mut self) -> Result<bool, DataError> {
        let Some((path, format)) = self.data.files.get(self.next_file).cloned() else { return Ok(false) };
        self.next_file += 1;
        self.reading.store(self.next_file, Ordering::Relaxed);
        let spec = &self.data.spec;
        let columns: Vec<String> = self
            .inputs
            .iter()
            .map(|p| p.source.clone())
            .chain(std::iter::once(spec.label.clone()))
            .chain(spec.weight.clone())
            .chain(spec.text_features())
            .collect();
        let options = options(spec, self.data.part, columns, Arc::clone(&self.skipped));
        let source = (format.info().open)(&path, &options)?;
        let infos = source.columns();
        if !infos.is_empty() {
            let label = &infos[self.inputs.len()];
            column_label_kind(label, self.data.classes.as_ref()).map_err(|e| match e {
                LabelError::Data(e) => e,
                LabelError::Strings { path, what } => label_classes::missing_classes(&path, what, &[]),
            })?;
            if spec.weight.is_some() {
                check_weight_column(&infos[self.inputs.len() + 1])?;
            }
            let rows = spec.limit.unwrap_or(u64::MAX).min(spec.batch_size as u64).max(1);
            check_batch_cost(&self.inputs, infos, spec.weight.is_some(), rows)?;
        }
        self.source = Some(source);
        self.source_row = 0;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example::Feature;
    use isorun_protocol::TensorSpec;
    use std::path::Path;

    /// A dataset of one TFRecord file of `n` examples, and its signature.
    fn tfrecord_dataset(dir: &Path, n: i64) -> (Dataset, SignatureInfo) {
        let path = dir.join("data.tfrecord");
        let mut bytes = Vec::new();
        for i in 0..n {
            let example = Example::new([
                ("x".to_string(), Feature::floats(vec![i as f32])),
                ("label".to_string(), Feature::ints(vec![i % 2])),
            ]);
            crate::tfrecord::write_record(&mut bytes, &prost::Message::encode_to_vec(&example));
        }
        std::fs::write(&path, bytes).unwrap();
        let spec = DataSpec {
            paths: vec![path],
            label: "label".into(),
            weight: None,
            slices: vec![],
            renames: vec![],
            limit: None,
            batch_size: 2,
            skip_corrupt: false,
            shard: None,
            format: None,
            example_key: None,
        };
        let signature = SignatureInfo {
            key: "serving_default".into(),
            inputs: vec![TensorSpec { name: "x".into(), dtype: DType::Float32, shape: Some(vec![None]) }],
            outputs: vec![],
        };
        (Dataset::open(spec).unwrap(), signature)
    }

    /// A reader whose next `fill` panics (a file being read, but none opened).
    fn panicking_reader(dataset: &Dataset, signature: &SignatureInfo) -> BatchReader {
        let mut reader = dataset.reader(signature).unwrap();
        let Mode::Direct(direct, _) = &mut reader.mode else { unreachable!("direct") };
        let path = &dataset.files()[0].0;
        let options = options(dataset.spec(), Part::WHOLE, Vec::new(), Arc::default());
        direct.source = Some((Format::TfRecord.info().open)(path, &options).unwrap());
        reader
    }

    #[test]
    fn a_panic_while_reading_is_a_data_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (dataset, signature) = tfrecord_dataset(dir.path(), 5);
        for prefetch in [false, true] {
            let mut reader = panicking_reader(&dataset, &signature);
            if prefetch {
                reader = reader.prefetch(2);
            }
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.next_batch()));
            let message = match result {
                Ok(Some(Err(e))) => e.to_string(),
                Ok(other) => panic!("prefetch {prefetch}: {other:?}"),
                Err(_) => panic!("prefetch {prefetch}: the panic reached the caller"),
            };
            assert!(message.contains("data.tfrecord") && message.contains("panicked"), "{message}");
            assert!(reader.next_batch().is_none(), "finished after the error");
        }
    }

    /// A file's source whose second batch's decoding waits until the
    /// worker has the first (`sent`), and then says it began (`decoding`).
    struct Gated {
        inner: Box<dyn Source>,
        handed: usize,
        second_batch: usize,
        sent: mpsc::Receiver<()>,
        decoding: mpsc::Sender<()>,
    }

    impl Source for Gated {
        fn next_piece(&mut self, max_rows: usize) -> Result<Option<Piece<'_>>, DataError> {
            if self.handed == self.second_batch {
                self.sent.recv().expect("the worker's request");
                self.decoding.send(()).expect("the worker waits");
            }
            self.handed += 1;
            self.inner.next_piece(max_rows)
        }
    }

    /// The next batch is decoded while the worker runs this one, not after:
    /// the second batch's decoding starts only once the first was sent, and
    /// the "worker" ends its run only once that decoding began, which in
    /// series (decoding in `next_batch`) would never happen.
    #[test]
    fn the_next_batch_is_decoded_while_the_worker_runs_this_one() {
        let dir = tempfile::tempdir().unwrap();
        let (dataset, signature) = tfrecord_dataset(dir.path(), 6);
        let mut reader = dataset.reader(&signature).unwrap();
        let (sent, sent_here) = mpsc::channel();
        let (decoding_here, decoding) = mpsc::channel();
        let Mode::Direct(direct, _) = &mut reader.mode else { unreachable!("direct") };
        let options = options(dataset.spec(), Part::WHOLE, Vec::new(), Arc::default());
        let inner = (Format::TfRecord.info().open)(&dataset.files()[0].0, &options).unwrap();
        direct.source =
            Some(Box::new(Gated { inner, handed: 0, second_batch: 2, sent: sent_here, decoding: decoding_here }));
        direct.next_file = 1;
        let mut reader = reader.prefetch(2);
        let mut labels = Vec::new();
        let first = reader.next_batch().unwrap().unwrap();
        // The request is sent; the worker runs batch 1, during which batch 2 is decoded.
        sent.send(()).unwrap();
        decoding
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("batch 2 was not decoded while the worker ran batch 1: reading in series");
        let Labels::Int(first) = first.targets.labels else { unreachable!("int labels") };
        labels.extend(first);
        while let Some(batch) = reader.next_batch() {
            let Labels::Int(batch) = batch.unwrap().targets.labels else { unreachable!("int labels") };
            labels.extend(batch);
        }
        assert_eq!(labels, [0, 1, 0, 1, 0, 1], "every batch, in order");
        assert!(reader.decode_time() > std::time::Duration::ZERO, "the decoding is timed");
    }

    #[test]
    fn a_prefetch_thread_that_stops_without_an_end_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (dataset, signature) = tfrecord_dataset(dir.path(), 5);
        let reader = dataset.reader(&signature).unwrap();
        let (sender, batches) = mpsc::sync_channel(1);
        sender.send(FromThread::Batch(Err(DataError::InvalidSpec { reason: "first".into() }))).unwrap();
        drop(sender);
        let mut reader = BatchReader {
            mode: Mode::Prefetch {
                batches,
                done: false,
                reading: Arc::new(AtomicUsize::new(1)),
                data: Arc::clone(&dataset.inner),
            },
            ..reader
        };
        assert!(matches!(reader.next_batch(), Some(Err(DataError::InvalidSpec { .. }))));
        assert!(reader.next_batch().is_none(), "finished after an error");
        if let Mode::Prefetch { done, .. } = &mut reader.mode {
            *done = false;
        }
        let message = reader.next_batch().unwrap().unwrap_err().to_string();
        assert!(message.contains("data.tfrecord") && message.contains("stopped before the end"), "{message}");
    }
}
