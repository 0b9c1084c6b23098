//! Labelled datasets, streamed in batches: what a model is fed and what the
//! supervisor keeps to score it.
//!
//! A [`Dataset`] is the checked list of files (see `paths` for how paths,
//! folders and globs become files); [`Dataset::reader`] makes a
//! [`BatchReader`] for one model's signature. Each batch has the worker's
//! inputs (dense tensors shaped by the signature) and the [`Targets`]
//! (labels, weights, slice values) that never leave the supervisor.
//!
//! Decisions:
//! - Feeding: a signature whose only input is a string tensor gets the
//!   serialized records as they are ([`Feeding::RawRecords`], TF Serving's
//!   classify/regress signatures), unless the examples have a feature of that
//!   input's name (after renames), which is then fed as a feature.
//! - Shapes: the signature's shape without its batch dimension gives the
//!   values per example; one unknown dimension is inferred from the first
//!   example the reader sees, and every later example must have the same
//!   count. `[?]` takes one value per example (shape `[rows]`). An input of
//!   unknown rank gets `[rows]` for one value per example, else `[rows, n]`
//!   (for arrays: the array's own dimensions).
//! - Conversions: float inputs take `float_list` or `int64_list`; integer
//!   and bool inputs take `int64_list` (range-checked; bool is value != 0);
//!   string inputs take `bytes_list`. Arrays convert the same way (an
//!   integer input refuses a float array).
//! - Labels: integers (or bools) with one value per example are
//!   [`Labels::Int`], floats [`Labels::Float`], more values per example
//!   [`Labels::Matrix`]; the kind is the first example's, and every later
//!   example must agree. Weights are one number per example.
//! - Slices: a slice feature's value as text (ints decimal, floats Rust's
//!   shortest round trip, bytes UTF-8 lossy, several values joined by `,`);
//!   an example without the feature is in slice `__missing__`.
//! - CSV rows become examples of one-value features (see the `csv` module)
//!   and go through the same conversions.
//! - Example indices in errors are 0-based over the dataset (records skipped
//!   as corrupt are not counted), with the record's (or CSV data row's)
//!   0-based index within its file.
//! - Memory: nothing grows with the dataset. Records are read into one
//!   reused buffer, arrays a batch of rows at a time; no buffer is sized by
//!   what a header claims, and a batch is capped at [`MAX_BATCH_BYTES`].
//! - Failures mid-stream are errors, never an early end: every shard's
//!   label and weight arrays are checked as the first shard's were, and a
//!   panic while reading (or a prefetch thread that stops without saying the
//!   data ended) is a [`DataError::Reader`] naming the file.

use crate::arrays::{self, ArrayInfo, ArrayStream, Number, Shard};
use crate::csv::{CsvFault, CsvReader};
use crate::example::{Example, Feature, Kind};
use crate::tfrecord::{RecordFault, RecordReader};
use isorun_protocol::{DType, SignatureInfo, Tensor, TensorData, TensorSpec};
use isorun_tensors::npy::Element;
use prost::Message;
use serde_bytes::ByteBuf;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

/// The slice value of an example that lacks the slice feature.
pub const MISSING_SLICE: &str = "__missing__";

/// The most memory one batch may take in the supervisor: for arrays, its
/// rows' bytes as read plus as converted (a string element counted with its
/// allocation, so a `|S1` array costs ~25 bytes an element, not 1), checked
/// against each shard's headers before its rows are read; for TFRecord, the
/// serialized records. Past it the batch is an error asking for a smaller
/// `--batch-size`, never an allocation a hostile header chose.
pub const MAX_BATCH_BYTES: u64 = 1 << 30;

/// The most a batch's buffers reserve before the bytes arrive; past it they
/// grow with what is read.
const PREALLOCATE_BYTES: usize = 64 << 20;

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
    /// Read at most this many examples.
    pub limit: Option<u64>,
    /// Rows per batch, at least 1.
    pub batch_size: usize,
    /// Skip corrupt TFRecord records (counted) instead of failing.
    pub skip_corrupt: bool,
}

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
    /// `.csv`: a header row, then one example per row (see the `csv` module).
    Csv,
}

impl Format {
    /// The name used in messages and records.
    pub fn name(self) -> &'static str {
        match self {
            Format::TfRecord => "tfrecord",
            Format::TfRecordGzip => "tfrecord-gzip",
            Format::Npz => "npz",
            Format::NpyFolder => "npy-folder",
            Format::Csv => "csv",
        }
    }

    /// Whether the file holds arrays (`.npz`, a folder of `.npy`).
    pub fn is_arrays(self) -> bool {
        matches!(self, Format::Npz | Format::NpyFolder)
    }

    /// Files of one family can be one dataset: TFRecord, arrays, CSV.
    pub(crate) fn family(self) -> &'static str {
        match self {
            Format::TfRecord | Format::TfRecordGzip => "TFRecord",
            Format::Npz | Format::NpyFolder => ".npz/.npy",
            Format::Csv => "CSV",
        }
    }

    /// Whether the file holds TFRecord records.
    pub fn is_tfrecord(self) -> bool {
        matches!(self, Format::TfRecord | Format::TfRecordGzip)
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

/// Why data could not be read. Every variant names the file (or pattern).
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: no such file or folder")]
    NotFound { path: PathBuf },
    #[error("{pattern}: the pattern matches no file")]
    NoMatch { pattern: PathBuf },
    #[error("{pattern}: bad glob pattern: {reason}")]
    BadPattern { pattern: PathBuf, reason: String },
    #[error(
        "{path}: unknown data format (expected .tfrecord, .tfrecords, .tfrec, .gz, .npz, or a folder of NAME.npy \
         arrays; a lone .npy file holds one array, give its folder)"
    )]
    UnknownFormat { path: PathBuf },
    #[error("{path}: no data files (.tfrecord, .tfrecords, .tfrec, .gz, .npz, or .npy arrays) in this folder")]
    NoData { path: PathBuf },
    #[error("{first} is {first_family} but {other} is {other_family}: one dataset's files are all TFRecord, all .npz/.npy or all CSV")]
    MixedFormats { first: PathBuf, first_family: &'static str, other: PathBuf, other_family: &'static str },
    #[error("{path}: line {line}: {reason}")]
    Csv { path: PathBuf, line: u64, reason: String },
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
        "{path}: example {example} (0-based in the dataset; record {record} of this file): feature '{key}' {problem}"
    )]
    Example { path: PathBuf, example: u64, record: u64, key: String, problem: String },
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
    #[error("{path}: {reason}")]
    Unsupported { path: PathBuf, reason: String },
    #[error("invalid data spec: {reason}")]
    InvalidSpec { reason: String },
    #[error("{path}: the data reader failed while reading this file: {reason}")]
    Reader { path: PathBuf, reason: String },
}

/// The kind of the label, fixed by the first example.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LabelKind {
    Int,
    Float,
    Matrix(usize),
}

/// What the first example (or the first shard's headers) shows.
#[derive(Debug, Clone)]
enum FirstLook {
    /// Feature names with their kind and length.
    Example {
        path: PathBuf,
        features: Vec<(String, &'static str, usize)>,
    },
    Arrays(Shard),
}

impl FirstLook {
    fn path(&self) -> &Path {
        match self {
            FirstLook::Example { path, .. } => path,
            FirstLook::Arrays(shard) => &shard.path,
        }
    }

    fn available(&self) -> String {
        let names: Vec<String> = match self {
            FirstLook::Example { features, .. } => {
                features.iter().map(|(n, kind, len)| format!("{n} ({kind}, {len} values)")).collect()
            }
            FirstLook::Arrays(shard) => shard.arrays.iter().map(|a| format!("{} ({})", a.name, a.describe())).collect(),
        };
        if names.is_empty() {
            "nothing".into()
        } else {
            names.join(", ")
        }
    }

    fn has(&self, name: &str) -> bool {
        match self {
            FirstLook::Example { features, .. } => features.iter().any(|(n, ..)| n == name),
            FirstLook::Arrays(shard) => shard.arrays.iter().any(|a| a.name == name),
        }
    }
}

struct Inner {
    spec: DataSpec,
    files: Vec<(PathBuf, Format)>,
    first: FirstLook,
    label: LabelKind,
    digest: String,
}

/// A checked dataset; cheap to clone, shared between readers.
#[derive(Clone)]
pub struct Dataset {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset").field("files", &self.inner.files).field("digest", &self.inner.digest).finish()
    }
}

fn kind_of(feature: &Feature) -> &'static str {
    feature.kind_name()
}

impl Dataset {
    /// Checks before any work: every path exists / every glob matches,
    /// every file has a known format, files are readable, the first example
    /// (of the first file) parses and has the label (and weight, and slice
    /// features). Errors name the path.
    pub fn open(spec: DataSpec) -> Result<Dataset, DataError> {
        if spec.batch_size == 0 {
            return Err(DataError::InvalidSpec { reason: "the batch size must be at least 1".into() });
        }
        if spec.paths.is_empty() {
            return Err(DataError::InvalidSpec { reason: "no data paths given".into() });
        }
        let files = crate::paths::expand(&spec.paths)?;
        for (path, format) in &files {
            let io = |source| DataError::Io { path: path.clone(), source };
            match format {
                Format::NpyFolder => drop(std::fs::read_dir(path).map_err(io)?),
                Format::TfRecordGzip => drop(RecordReader::open(path, true).map_err(io)?),
                _ => drop(std::fs::File::open(path).map_err(io)?),
            }
        }
        let first = if files[0].1.is_tfrecord() {
            first_example(&files, spec.skip_corrupt)?
        } else if files[0].1 == Format::Csv {
            first_row(&files)?
        } else {
            FirstLook::Arrays(arrays::open_shard(&files[0].0, files[0].1 == Format::Npz)?)
        };
        let missing = |what: &'static str, name: &str| DataError::MissingFeature {
            path: first.path().to_path_buf(),
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
        let label = label_kind(&first, &spec.label)?;
        if let (Some(weight), FirstLook::Arrays(shard)) = (&spec.weight, &first) {
            check_weight_array(shard.arrays.iter().find(|a| &a.name == weight).expect("checked"))?;
        }
        let digest = digest(&spec, &files)?;
        Ok(Dataset { inner: Arc::new(Inner { spec, files, first, label, digest }) })
    }

    /// The files, in the order read (sorted bytewise within a folder/glob), and their format.
    pub fn files(&self) -> &[(PathBuf, Format)] {
        &self.inner.files
    }

    /// The spec the dataset was opened with.
    pub fn spec(&self) -> &DataSpec {
        &self.inner.spec
    }

    /// SHA-256 (hex) over the spec and each file's path, size and mtime, for journal keys.
    pub fn digest(&self) -> String {
        self.inner.digest.clone()
    }

    /// A stream of batches for one model's signature. Decides how the model
    /// is fed (see the module docs); errors, before reading batches, when a
    /// signature input has no feature/array of that name (after renames),
    /// naming the input and the available features.
    pub fn reader(&self, signature: &SignatureInfo) -> Result<BatchReader, DataError> {
        let inner = &self.inner;
        let path = inner.first.path().to_path_buf();
        let feature_name = |input: &str| -> String {
            inner.spec.renames.iter().find(|(i, _)| i == input).map_or(input.to_string(), |(_, f)| f.clone())
        };
        let raw = match signature.inputs.as_slice() {
            [only] if only.dtype == DType::String && inner.files[0].1.is_tfrecord() => {
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
                    return Err(DataError::MissingInput {
                        path: path.clone(),
                        input: spec.name.clone(),
                        feature,
                        available: inner.first.available(),
                    });
                }
                plans.push(InputPlan::new(spec, feature, &path, !inner.files[0].1.is_arrays())?);
            }
            (Feeding::Features, plans)
        };
        let direct = Direct {
            data: Arc::clone(&self.inner),
            feeding: feeding.clone(),
            inputs,
            next_file: 0,
            reading: Arc::new(AtomicUsize::new(0)),
            source: None,
            produced: 0,
            example_index: 0,
            skipped: Arc::new(AtomicU64::new(0)),
            record: Vec::new(),
            example: Example::default(),
            batch_bytes: 0,
        };
        let skipped = Arc::clone(&direct.skipped);
        Ok(BatchReader { feeding, skipped, mode: Mode::Direct(Box::new(direct), false) })
    }
}

fn digest(spec: &DataSpec, files: &[(PathBuf, Format)]) -> Result<String, DataError> {
    let mut hasher = Sha256::new();
    hasher.update(format!("{spec:?}").as_bytes());
    for (path, format) in files {
        let meta = std::fs::metadata(path).map_err(|source| DataError::Io { path: path.clone(), source })?;
        let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
        hasher.update(format!("\0{}\0{}\0{}\0{}", path.display(), format.name(), meta.len(), mtime.as_nanos()));
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// An example's features, sorted by name: name, kind and value count.
fn feature_list(example: &Example) -> Vec<(String, &'static str, usize)> {
    let mut features: Vec<(String, &'static str, usize)> =
        example.features.iter().flat_map(|f| f.feature.iter()).map(|(k, f)| (k.clone(), kind_of(f), f.len())).collect();
    features.sort();
    features
}

/// The first row of the first CSV file that has one, as an example.
fn first_row(files: &[(PathBuf, Format)]) -> Result<FirstLook, DataError> {
    for (path, _) in files {
        let csv_error =
            |(path, fault): (PathBuf, CsvFault)| DataError::Csv { path, line: fault.line, reason: fault.reason };
        let mut reader = CsvReader::open(path).map_err(csv_error)?;
        let mut example = Example::default();
        if reader.next_row(&mut example).map_err(|f| csv_error((path.clone(), f)))?.is_some() {
            return Ok(FirstLook::Example { path: path.clone(), features: feature_list(&example) });
        }
    }
    Err(DataError::Empty { path: files[0].0.clone() })
}

/// The first example of the first file that has one.
fn first_example(files: &[(PathBuf, Format)], skip_corrupt: bool) -> Result<FirstLook, DataError> {
    let mut data = Vec::new();
    for (path, format) in files {
        let gzip = *format == Format::TfRecordGzip;
        let mut reader =
            RecordReader::open(path, gzip).map_err(|source| DataError::Io { path: path.clone(), source })?;
        loop {
            match reader.next_record(&mut data) {
                Ok(None) => break,
                Ok(Some(offset)) => {
                    let example = Example::decode(data.as_slice()).map_err(|source| DataError::NotAnExample {
                        path: path.clone(),
                        record: 0,
                        offset,
                        source,
                    })?;
                    return Ok(FirstLook::Example { path: path.clone(), features: feature_list(&example) });
                }
                Err((_, fault)) if skip_corrupt && fault.resumable() => {}
                Err((_, _)) if skip_corrupt => break,
                Err((offset, fault)) => return Err(DataError::Corrupt { path: path.clone(), offset, gzip, fault }),
            }
        }
    }
    Err(DataError::Empty { path: files[0].0.clone() })
}

fn label_kind(first: &FirstLook, label: &str) -> Result<LabelKind, DataError> {
    match first {
        FirstLook::Example { path, features } => {
            let (_, kind, len) = features.iter().find(|(n, ..)| n == label).expect("checked");
            let problem = match (*kind, *len) {
                (_, 0) => "is empty",
                ("bytes_list", _) => "is bytes_list; labels are numbers (int64_list or float_list)",
                (_, n) if n > 1 => return Ok(LabelKind::Matrix(n)),
                ("int64_list", _) => return Ok(LabelKind::Int),
                _ => return Ok(LabelKind::Float),
            };
            Err(DataError::Example {
                path: path.clone(),
                example: 0,
                record: 0,
                key: label.to_string(),
                problem: format!("(the label) {problem}"),
            })
        }
        FirstLook::Arrays(shard) => array_label_kind(shard.arrays.iter().find(|a| a.name == label).expect("checked")),
    }
}

/// The label kind of an array, checked for every shard: numbers, at least
/// one per example.
fn array_label_kind(array: &ArrayInfo) -> Result<LabelKind, DataError> {
    if arrays::number(array.element, &[0; 8]).is_none() {
        return Err(DataError::Array {
            path: array.path.clone(),
            reason: format!("labels are numbers, not {}", array.describe()),
        });
    }
    Ok(match array.row_elements() {
        0 => return Err(DataError::Array { path: array.path.clone(), reason: "labels have no values".into() }),
        1 if arrays::is_integer(array.element) => LabelKind::Int,
        1 => LabelKind::Float,
        n => LabelKind::Matrix(n as usize),
    })
}

/// Weights are one number per example, in every shard.
fn check_weight_array(array: &ArrayInfo) -> Result<(), DataError> {
    if array.row_elements() != 1 || arrays::number(array.element, &[0; 8]).is_none() {
        return Err(DataError::Array {
            path: array.path.clone(),
            reason: format!("weights must be one number per example, not {}", array.describe()),
        });
    }
    Ok(())
}

/// How one signature input is built.
#[derive(Debug, Clone)]
struct InputPlan {
    input: String,
    source: String,
    dtype: DType,
    /// The signature's dims after the batch dim; `None` for unknown rank.
    dims: Option<Vec<Option<u64>>>,
    /// The dims and values per example, fixed by the first example seen.
    resolved: Option<(Vec<u64>, usize)>,
}

impl InputPlan {
    fn new(spec: &TensorSpec, source: String, path: &Path, examples: bool) -> Result<InputPlan, DataError> {
        let dims = match &spec.shape {
            None => None,
            Some(dims) if dims.is_empty() => {
                return Err(DataError::Unsupported {
                    path: path.to_path_buf(),
                    reason: format!("signature input {} is a scalar: it has no batch dimension", spec.describe()),
                })
            }
            Some(dims) => {
                let tail = dims[1..].to_vec();
                if examples && tail.iter().filter(|d| d.is_none()).count() > 1 {
                    return Err(DataError::Unsupported {
                        path: path.to_path_buf(),
                        reason: format!(
                            "signature input {} has more than one unknown dimension besides the batch: features \
                             cannot be shaped for it",
                            spec.describe()
                        ),
                    });
                }
                Some(tail)
            }
        };
        Ok(InputPlan { input: spec.name.clone(), source, dtype: spec.dtype, dims, resolved: None })
    }

    fn shape_text(&self) -> String {
        match &self.dims {
            None => "<unknown rank>".into(),
            Some(d) => {
                let all: Vec<String> = std::iter::once("?".to_string())
                    .chain(d.iter().map(|d| d.map_or("?".into(), |n| n.to_string())))
                    .collect();
                format!("[{}]", all.join(", "))
            }
        }
    }

    /// Fixes the per-example dims from a first count (and an array's own dims).
    fn resolve(&mut self, count: usize, own: Option<&[u64]>) -> Result<usize, String> {
        if let Some((_, n)) = &self.resolved {
            return if *n == count {
                Ok(*n)
            } else {
                Err(format!("has {count} values, expected {n} (input '{}' shape {})", self.input, self.shape_text()))
            };
        }
        let tail: Vec<u64> = match (&self.dims, own) {
            (None, Some(own)) => own.to_vec(),
            (None, None) if count == 1 => Vec::new(),
            (None, None) => vec![count as u64],
            (Some(dims), Some(own))
                if own.len() == dims.len() && dims.iter().zip(own).all(|(d, o)| d.is_none_or(|d| d == *o)) =>
            {
                own.to_vec()
            }
            (Some(dims), _) => {
                let known: u64 = dims.iter().flatten().product();
                let unknown = dims.iter().filter(|d| d.is_none()).count();
                let fits = match unknown {
                    0 => known == count as u64,
                    1 => (count as u64).checked_rem(known) == Some(0),
                    _ => false,
                };
                if !fits {
                    return Err(format!(
                        "has {count} values per example, which input '{}' of shape {} cannot take",
                        self.input,
                        self.shape_text()
                    ));
                }
                dims.iter().map(|d| d.unwrap_or_else(|| count as u64 / known)).collect()
            }
        };
        self.resolved = Some((tail, count));
        Ok(count)
    }

    fn tensor(&self, rows: usize, column: Column) -> Tensor {
        let mut shape = vec![rows as u64];
        if let Some((tail, _)) = &self.resolved {
            shape.extend_from_slice(tail);
        } else if let Some(dims) = &self.dims {
            // No row seen (an empty batch cannot happen); unknown dims as 0.
            shape.extend(dims.iter().map(|d| d.unwrap_or(0)));
        }
        match column {
            Column::Dense(bytes) => Tensor::dense(self.dtype, shape, bytes),
            Column::Strings(strings) => Tensor { dtype: DType::String, shape, data: TensorData::Strings(strings) },
        }
    }
}

fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::Float32 | DType::Float64 | DType::Float16 | DType::BFloat16)
}

/// Appends one number in `dtype`'s layout; errors say what does not fit.
fn put_number(dtype: DType, value: Number, out: &mut Vec<u8>) -> Result<(), String> {
    let out_of_range = || format!("value {} is out of range for {dtype}", value.as_f64());
    let int = || match value {
        Number::Int(i) => Ok(i),
        Number::BigUnsigned(_) => Err(out_of_range()),
        Number::Float(f) => Err(format!("float value {f} cannot feed a {dtype} input")),
    };
    match dtype {
        DType::Float32 => out.extend_from_slice(&(value.as_f64() as f32).to_le_bytes()),
        DType::Float64 => out.extend_from_slice(&value.as_f64().to_le_bytes()),
        DType::Float16 => out.extend_from_slice(&half::f16::from_f64(value.as_f64()).to_le_bytes()),
        DType::BFloat16 => out.extend_from_slice(&half::bf16::from_f64(value.as_f64()).to_le_bytes()),
        DType::Bool => out.push(u8::from(int()? != 0)),
        DType::Int8 => out.extend_from_slice(&i8::try_from(int()?).map_err(|_| out_of_range())?.to_le_bytes()),
        DType::Int16 => out.extend_from_slice(&i16::try_from(int()?).map_err(|_| out_of_range())?.to_le_bytes()),
        DType::Int32 => out.extend_from_slice(&i32::try_from(int()?).map_err(|_| out_of_range())?.to_le_bytes()),
        DType::Int64 => out.extend_from_slice(&int()?.to_le_bytes()),
        DType::UInt8 => out.extend_from_slice(&u8::try_from(int()?).map_err(|_| out_of_range())?.to_le_bytes()),
        DType::UInt16 => out.extend_from_slice(&u16::try_from(int()?).map_err(|_| out_of_range())?.to_le_bytes()),
        DType::UInt32 => out.extend_from_slice(&u32::try_from(int()?).map_err(|_| out_of_range())?.to_le_bytes()),
        DType::UInt64 => match value {
            Number::BigUnsigned(u) => out.extend_from_slice(&u.to_le_bytes()),
            _ => out.extend_from_slice(&u64::try_from(int()?).map_err(|_| out_of_range())?.to_le_bytes()),
        },
        DType::String => return Err("a number cannot feed a string input".into()),
    }
    Ok(())
}

/// A column being filled.
#[derive(Debug)]
enum Column {
    Dense(Vec<u8>),
    Strings(Vec<ByteBuf>),
}

/// Labels (and weights, slices) being filled.
#[derive(Debug)]
struct TargetsOut {
    labels: Labels,
    weights: Option<Vec<f64>>,
    slices: Vec<Vec<String>>,
}

/// One batch: what the worker gets and what stays in the supervisor.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Signature input name -> dense tensor with the signature's dtype, shape `[rows, ...]`.
    pub inputs: Vec<(String, Tensor)>,
    /// Labels, weights and slice values: these stay in the supervisor.
    pub targets: Targets,
}

/// What a batch is scored against.
#[derive(Debug, Clone, PartialEq)]
pub struct Targets {
    pub rows: usize,
    pub labels: Labels,
    pub weights: Option<Vec<f64>>,
    /// Per `--slice` feature: each row's value as text.
    pub slices: Vec<(String, Vec<String>)>,
}

/// A batch's labels.
#[derive(Debug, Clone, PartialEq)]
pub enum Labels {
    Int(Vec<i64>),
    Float(Vec<f64>),
    /// One-hot or multi-value labels, row-major.
    Matrix {
        columns: usize,
        values: Vec<f64>,
    },
}

impl Labels {
    fn empty(kind: LabelKind, rows: usize) -> Labels {
        match kind {
            LabelKind::Int => Labels::Int(Vec::with_capacity(rows)),
            LabelKind::Float => Labels::Float(Vec::with_capacity(rows)),
            LabelKind::Matrix(columns) => Labels::Matrix {
                columns,
                values: Vec::with_capacity(rows.saturating_mul(columns).min(PREALLOCATE_BYTES / 8)),
            },
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        match self {
            Labels::Int(v) => v.len(),
            Labels::Float(v) => v.len(),
            Labels::Matrix { columns, values } => values.len() / (*columns).max(1),
        }
    }

    /// Whether no rows are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where rows come from now.
enum Source {
    Records { reader: RecordReader, record: u64 },
    Csv { reader: CsvReader, row: u64 },
    Arrays { streams: Vec<ArrayStream>, remaining: u64 },
}

/// The reader itself, on the caller's thread or the prefetch thread.
struct Direct {
    data: Arc<Inner>,
    feeding: Feeding,
    inputs: Vec<InputPlan>,
    next_file: usize,
    /// `next_file`, shared with the reader's owner while prefetching.
    reading: Arc<AtomicUsize>,
    source: Option<Source>,
    produced: u64,
    example_index: u64,
    skipped: Arc<AtomicU64>,
    record: Vec<u8>,
    example: Example,
    /// Serialized record bytes in the batch being filled.
    batch_bytes: u64,
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
            Mode::Direct(direct, finished) => {
                let result = direct.fill_caught().transpose();
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

    /// Moves reading to a thread that keeps up to `depth` batches ready
    /// (double buffering: `prefetch(2)`); same interface. `depth` 0 counts as 1.
    /// Dropping the reader stops the thread after the batch it is reading.
    pub fn prefetch(self, depth: usize) -> BatchReader {
        let BatchReader { feeding, skipped, mode } = self;
        let Mode::Direct(mut direct, finished) = mode else {
            return BatchReader { feeding, skipped, mode };
        };
        let (sender, batches) = mpsc::sync_channel(depth.max(1) - 1);
        let reading = Arc::clone(&direct.reading);
        let data = Arc::clone(&direct.data);
        if !finished {
            std::thread::Builder::new()
                .name("isorun-eval-prefetch".into())
                .spawn(move || loop {
                    let message = match direct.fill_caught().transpose() {
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
        BatchReader { feeding, skipped, mode: Mode::Prefetch { batches, done: finished, reading, data } }
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
            labels: Labels::empty(self.data.label, want),
            weights: spec.weight.as_ref().map(|_| Vec::with_capacity(want)),
            slices: spec.slices.iter().map(|_| Vec::with_capacity(want)).collect(),
        };
        self.batch_bytes = 0;
        let mut rows = 0;
        while rows < want {
            if self.source.is_none() && !self.open_next()? {
                break;
            }
            match self.source.as_mut().expect("opened") {
                Source::Records { .. } | Source::Csv { .. } => {
                    if !self.read_record(&mut columns, &mut targets)? {
                        self.source = None;
                        continue;
                    }
                    rows += 1;
                }
                Source::Arrays { remaining, .. } => {
                    let take = (*remaining).min((want - rows) as u64) as usize;
                    if take == 0 {
                        self.source = None;
                        continue;
                    }
                    self.read_arrays(take, &mut columns, &mut targets)?;
                    rows += take;
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
        let slices = spec.slices.iter().cloned().zip(targets.slices).collect();
        Ok(Some(Batch { inputs, targets: Targets { rows, labels: targets.labels, weights: targets.weights, slices } }))
    }

    /// Opens the next file; false when there is none.
    fn open_next(&mut self) -> Result<bool, DataError> {
        let Some((path, format)) = self.data.files.get(self.next_file).cloned() else { return Ok(false) };
        self.next_file += 1;
        self.reading.store(self.next_file, Ordering::Relaxed);
        self.source = Some(if format == Format::Csv {
            let reader = CsvReader::open(&path).map_err(|(path, fault)| DataError::Csv {
                path,
                line: fault.line,
                reason: fault.reason,
            })?;
            Source::Csv { reader, row: 0 }
        } else if format.is_tfrecord() {
            let reader = RecordReader::open(&path, format == Format::TfRecordGzip)
                .map_err(|source| DataError::Io { path: path.clone(), source })?;
            Source::Records { reader, record: 0 }
        } else {
            let shard = arrays::open_shard(&path, format == Format::Npz)?;
            let find = |name: &str| -> Result<&ArrayInfo, DataError> {
                shard.arrays.iter().find(|a| a.name == name).ok_or_else(|| DataError::MissingInput {
                    path: path.clone(),
                    input: name.to_string(),
                    feature: name.to_string(),
                    available: shard.arrays.iter().map(|a| a.name.clone()).collect::<Vec<_>>().join(", "),
                })
            };
            let spec = &self.data.spec;
            let names = self
                .inputs
                .iter()
                .map(|p| p.source.as_str())
                .chain(std::iter::once(spec.label.as_str()))
                .chain(spec.weight.as_deref())
                .chain(spec.slices.iter().map(String::as_str));
            // Every shard is checked as the first was: a later shard's
            // string label or empty weight is its error, not a panic.
            array_label_kind(find(&spec.label)?)?;
            if let Some(weight) = &spec.weight {
                check_weight_array(find(weight)?)?;
            }
            let mut streams = Vec::new();
            for name in names {
                streams.push(ArrayStream::open(&shard, find(name)?)?);
            }
            check_batch_cost(&self.inputs, &streams, spec)?;
            Source::Arrays { streams, remaining: shard.rows }
        });
        Ok(true)
    }

    /// Reads one record (or CSV row) into the batch; false at the end of the file.
    fn read_record(&mut self, columns: &mut [Column], targets: &mut TargetsOut) -> Result<bool, DataError> {
        let data = Arc::clone(&self.data);
        let path = data.files[self.next_file - 1].0.as_path();
        let index = match self.source.as_mut() {
            Some(Source::Csv { reader, row }) => {
                let line = reader.next_row(&mut self.example).map_err(|fault| DataError::Csv {
                    path: path.to_path_buf(),
                    line: fault.line,
                    reason: fault.reason,
                })?;
                if line.is_none() {
                    return Ok(false);
                }
                *row += 1;
                *row - 1
            }
            Some(Source::Records { reader, record }) => {
                let offset = loop {
                    match reader.next_record(&mut self.record) {
                        Ok(None) => return Ok(false),
                        Ok(Some(offset)) => break offset,
                        Err((_, fault)) if data.spec.skip_corrupt => {
                            self.skipped.fetch_add(1, Ordering::Relaxed);
                            if !fault.resumable() {
                                return Ok(false);
                            }
                            *record += 1;
                        }
                        Err((offset, fault)) => {
                            return Err(DataError::Corrupt {
                                path: path.to_path_buf(),
                                offset,
                                gzip: reader.gzip(),
                                fault,
                            })
                        }
                    }
                };
                let index = *record;
                *record += 1;
                self.batch_bytes += self.record.len() as u64;
                if self.batch_bytes > MAX_BATCH_BYTES {
                    return Err(DataError::Unsupported {
                        path: path.to_path_buf(),
                        reason: format!(
                            "record {index} at byte offset {offset} brings this batch's records to {} bytes, more \
                             than the {MAX_BATCH_BYTES} a batch may hold; use a smaller --batch-size",
                            self.batch_bytes
                        ),
                    });
                }
                self.example.clear();
                self.example.merge(self.record.as_slice()).map_err(|source| DataError::NotAnExample {
                    path: path.to_path_buf(),
                    record: index,
                    offset,
                    source,
                })?;
                index
            }
            _ => unreachable!("examples"),
        };
        let example_index = self.example_index;
        self.example_index += 1;
        let error = |key: &str, problem: String| DataError::Example {
            path: path.to_path_buf(),
            example: example_index,
            record: index,
            key: key.to_string(),
            problem,
        };
        let features = self.example.features.as_ref().map(|f| &f.feature);
        let get = |key: &str| features.and_then(|f| f.get(key));
        match &self.feeding {
            Feeding::RawRecords { .. } => {
                let Column::Strings(strings) = &mut columns[0] else { unreachable!("strings") };
                strings.push(ByteBuf::from(self.record.clone()));
            }
            Feeding::Features => {
                for (plan, column) in self.inputs.iter_mut().zip(columns.iter_mut()) {
                    let feature = get(&plan.source).ok_or_else(|| error(&plan.source, "is missing".into()))?;
                    plan.resolve(feature.len(), None).map_err(|p| error(&plan.source, p))?;
                    push_feature(plan.dtype, feature, column).map_err(|p| error(&plan.source, p))?;
                }
            }
        }
        let spec = &self.data.spec;
        let label = get(&spec.label).ok_or_else(|| error(&spec.label, "(the label) is missing".into()))?;
        push_label(&mut targets.labels, label).map_err(|p| error(&spec.label, format!("(the label) {p}")))?;
        if let (Some(key), Some(weights)) = (&spec.weight, targets.weights.as_mut()) {
            let feature = get(key).ok_or_else(|| error(key, "(the weight) is missing".into()))?;
            let value = match &feature.kind {
                Some(Kind::FloatList(l)) if l.value.len() == 1 => f64::from(l.value[0]),
                Some(Kind::Int64List(l)) if l.value.len() == 1 => l.value[0] as f64,
                _ => {
                    return Err(error(
                        key,
                        format!(
                            "(the weight) is {} of {} values; weights are one number",
                            feature.kind_name(),
                            feature.len()
                        ),
                    ))
                }
            };
            weights.push(value);
        }
        for (key, values) in spec.slices.iter().zip(targets.slices.iter_mut()) {
            values.push(get(key).map_or_else(|| MISSING_SLICE.to_string(), slice_text));
        }
        Ok(true)
    }

    /// Reads `take` rows of every array into the batch.
    fn read_arrays(&mut self, take: usize, columns: &mut [Column], targets: &mut TargetsOut) -> Result<(), DataError> {
        let Some(Source::Arrays { streams, remaining }) = self.source.as_mut() else { unreachable!("arrays") };
        *remaining -= take as u64;
        let mut streams = streams.iter_mut();
        for (plan, column) in self.inputs.iter_mut().zip(columns.iter_mut()) {
            let stream = streams.next().expect("one per input");
            let info = stream.info.clone();
            let fail = |reason: String| DataError::Array { path: info.path.clone(), reason };
            plan.resolve(info.row_elements() as usize, Some(&info.shape[1..])).map_err(fail)?;
            let bytes = stream.read_rows(take)?;
            push_array(plan.dtype, info.element, bytes, column).map_err(|r| DataError::Array {
                path: info.path.clone(),
                reason: format!("cannot feed input '{}' ({}): {r}", plan.input, plan.dtype),
            })?;
        }
        let label = streams.next().expect("label");
        let element = label.info.element;
        let size = element.item_size();
        let path = label.info.path.clone();
        let row_elements = label.info.row_elements() as usize;
        let bytes = label.read_rows(take)?;
        let expected = match &targets.labels {
            Labels::Matrix { columns, .. } => *columns,
            _ => 1,
        };
        if row_elements != expected {
            return Err(DataError::Array {
                path,
                reason: format!("labels have {row_elements} values per example here, {expected} in the first shard"),
            });
        }
        for chunk in bytes.chunks_exact(size) {
            let Some(value) = arrays::number(element, chunk) else {
                return Err(DataError::Array { path, reason: "labels are numbers, not strings".into() });
            };
            match (&mut targets.labels, value) {
                (Labels::Int(v), Number::Int(i)) => v.push(i),
                (Labels::Float(v), n) => v.push(n.as_f64()),
                (Labels::Matrix { values, .. }, n) => values.push(n.as_f64()),
                (Labels::Int(_), n) => {
                    return Err(DataError::Array {
                        path,
                        reason: format!("label {} is not an integer like the first shard's labels", n.as_f64()),
                    })
                }
            }
        }
        if let Some(weights) = targets.weights.as_mut() {
            let stream = streams.next().expect("weight");
            let element = stream.info.element;
            let bytes = stream.read_rows(take)?;
            for chunk in bytes.chunks_exact(element.item_size()) {
                weights.push(arrays::number(element, chunk).map_or(f64::NAN, Number::as_f64));
            }
        }
        for values in targets.slices.iter_mut() {
            let stream = streams.next().expect("slice");
            let info = stream.info.clone();
            let per_row = info.row_elements() as usize * info.element.item_size();
            let bytes = stream.read_rows(take)?;
            if per_row == 0 {
                values.extend(std::iter::repeat_n(String::new(), take));
                continue;
            }
            for row in bytes.chunks_exact(per_row) {
                let texts: Vec<String> =
                    row.chunks_exact(info.element.item_size()).map(|e| element_text(info.element, e)).collect();
                values.push(texts.join(","));
            }
        }
        Ok(())
    }
}

/// Refuses a shard whose batches would take more than [`MAX_BATCH_BYTES`]:
/// each row's bytes as read and as kept (converted inputs, strings with
/// their allocation, labels as f64, slice values as text), from the headers,
/// before any row is read. `streams` are the inputs', then the label's,
/// the weight's and the slices', as `open_next` opens them.
fn check_batch_cost(inputs: &[InputPlan], streams: &[ArrayStream], spec: &DataSpec) -> Result<(), DataError> {
    const STRING: u64 = std::mem::size_of::<ByteBuf>() as u64;
    const TEXT: u64 = std::mem::size_of::<String>() as u64;
    let mut costs = Vec::with_capacity(streams.len());
    for (i, stream) in streams.iter().enumerate() {
        let elements = stream.info.row_elements();
        let item = stream.info.element.item_size() as u64;
        let kept = match inputs.get(i) {
            Some(plan) if plan.dtype == DType::String => elements.saturating_mul(STRING + item),
            Some(plan) => elements.saturating_mul(plan.dtype.element_size().unwrap_or(1) as u64),
            // The label (f64s), the weight (one f64).
            None if i == inputs.len() || (i == inputs.len() + 1 && spec.weight.is_some()) => elements.saturating_mul(8),
            // A slice: one text per row, made of one text per element (a number is at most 24 characters).
            None => elements.saturating_mul(TEXT + item.max(24) + 1).saturating_add(TEXT),
        };
        costs.push((stream.row_bytes() as u64).saturating_add(kept));
    }
    let row: u64 = costs.iter().fold(0, |a, b| a.saturating_add(*b));
    let rows = spec.limit.unwrap_or(u64::MAX).min(spec.batch_size as u64).max(1);
    let batch = row.saturating_mul(rows);
    if batch <= MAX_BATCH_BYTES {
        return Ok(());
    }
    let (largest, cost) = streams.iter().zip(&costs).max_by_key(|(_, c)| **c).expect("a batch has arrays");
    Err(DataError::Array {
        path: largest.info.path.clone(),
        reason: format!(
            "a batch of {rows} examples would take about {batch} bytes ({row} an example, {cost} of them for this \
             {}), more than the {MAX_BATCH_BYTES} a batch may hold; use a smaller --batch-size",
            largest.info.describe()
        ),
    })
}

fn element_text(element: Element, bytes: &[u8]) -> String {
    match arrays::number(element, bytes) {
        Some(Number::Int(i)) => i.to_string(),
        Some(Number::BigUnsigned(u)) => u.to_string(),
        Some(Number::Float(f)) => match element {
            Element::Dense(DType::Float64, _) => f.to_string(),
            _ => (f as f32).to_string(),
        },
        None => String::from_utf8_lossy(&arrays::string(element, bytes).unwrap_or_default()).into_owned(),
    }
}

fn slice_text(feature: &Feature) -> String {
    match &feature.kind {
        Some(Kind::Int64List(l)) => l.value.iter().map(i64::to_string).collect::<Vec<_>>().join(","),
        Some(Kind::FloatList(l)) => l.value.iter().map(f32::to_string).collect::<Vec<_>>().join(","),
        Some(Kind::BytesList(l)) => l.value.iter().map(|b| String::from_utf8_lossy(b)).collect::<Vec<_>>().join(","),
        None => String::new(),
    }
}

fn push_feature(dtype: DType, feature: &Feature, column: &mut Column) -> Result<(), String> {
    let wrong_kind = |expected: &str| format!("is {}, expected {expected} for a {dtype} input", feature.kind_name());
    match (column, &feature.kind) {
        (Column::Strings(strings), Some(Kind::BytesList(l))) => {
            strings.extend(l.value.iter().map(|b| ByteBuf::from(b.clone())));
        }
        (Column::Strings(_), _) => return Err(wrong_kind("bytes_list")),
        (Column::Dense(out), Some(Kind::FloatList(l))) if is_float(dtype) => {
            if dtype == DType::Float32 {
                for v in &l.value {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            } else {
                for v in &l.value {
                    put_number(dtype, Number::Float(f64::from(*v)), out)?;
                }
            }
        }
        (Column::Dense(out), Some(Kind::Int64List(l))) => {
            for v in &l.value {
                put_number(dtype, Number::Int(*v), out)?;
            }
        }
        (Column::Dense(_), _) if is_float(dtype) => return Err(wrong_kind("float_list or int64_list")),
        (Column::Dense(_), _) => return Err(wrong_kind("int64_list")),
    }
    Ok(())
}

fn push_label(labels: &mut Labels, feature: &Feature) -> Result<(), String> {
    let wrong =
        |expected: String| format!("is {} of {} values, expected {expected}", feature.kind_name(), feature.len());
    match (labels, &feature.kind) {
        (Labels::Int(v), Some(Kind::Int64List(l))) if l.value.len() == 1 => v.push(l.value[0]),
        (Labels::Int(_), _) => return Err(wrong("int64_list of 1 value (as in the first example)".into())),
        (Labels::Float(v), Some(Kind::FloatList(l))) if l.value.len() == 1 => v.push(f64::from(l.value[0])),
        (Labels::Float(_), _) => return Err(wrong("float_list of 1 value (as in the first example)".into())),
        (Labels::Matrix { columns, values }, Some(Kind::FloatList(l))) if l.value.len() == *columns => {
            values.extend(l.value.iter().map(|v| f64::from(*v)));
        }
        (Labels::Matrix { columns, values }, Some(Kind::Int64List(l))) if l.value.len() == *columns => {
            values.extend(l.value.iter().map(|v| *v as f64));
        }
        (Labels::Matrix { columns, .. }, _) => {
            return Err(wrong(format!("{columns} numbers (as in the first example)")))
        }
    }
    Ok(())
}

fn push_array(dtype: DType, element: Element, bytes: &[u8], column: &mut Column) -> Result<(), String> {
    let size = element.item_size();
    match column {
        Column::Strings(strings) => {
            if size == 0 {
                return Ok(());
            }
            for chunk in bytes.chunks_exact(size) {
                let s = arrays::string(element, chunk).ok_or("a numeric array cannot feed a string input")?;
                strings.push(ByteBuf::from(s));
            }
        }
        Column::Dense(out) => {
            if element == Element::Dense(dtype, false) && dtype != DType::Bool {
                out.extend_from_slice(bytes);
                return Ok(());
            }
            for chunk in bytes.chunks_exact(size.max(1)) {
                let value = arrays::number(element, chunk).ok_or("a string array cannot feed a numeric input")?;
                put_number(dtype, value, out)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dataset of one TFRecord file of `n` examples, and its signature.
    fn tfrecord_dataset(dir: &Path, n: i64) -> (Dataset, SignatureInfo) {
        let path = dir.join("data.tfrecord");
        let mut bytes = Vec::new();
        for i in 0..n {
            let example = Example::new([
                ("x".to_string(), Feature::floats(vec![i as f32])),
                ("label".to_string(), Feature::ints(vec![i % 2])),
            ]);
            crate::tfrecord::write_record(&mut bytes, &example.encode_to_vec());
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
        direct.source = Some(Source::Records { reader: RecordReader::open(path, false).unwrap(), record: 0 });
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
