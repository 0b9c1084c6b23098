//! What a batch is, and how values become its columns: the code every
//! source shares, so that a format's reader only reads. Signature shapes
//! are resolved here ([`InputPlan`]), numbers convert here ([`put_number`]:
//! integers range-checked, floats refused by integer inputs), and labels,
//! weights and slice values are taken here, from examples (row sources) or
//! from column chunks (columnar sources).

use crate::element::{self, Number};
use crate::example::{Feature, Kind};
use crate::source::{ColumnChunk, ColumnInfo, Values};
use isorun_protocol::{DType, Tensor, TensorData, TensorSpec};
use isorun_tensors::npy::Element;
use serde_bytes::ByteBuf;
use std::path::Path;

use crate::error::DataError;
use crate::label_classes::{self, LabelClasses};

/// The slice value of an example that lacks the slice feature.
pub const MISSING_SLICE: &str = "__missing__";

/// The most memory one batch may take in the supervisor: for arrays, its
/// rows' bytes as read plus as converted (a string element counted with its
/// allocation, so a `|S1` array costs ~25 bytes an element, not 1), checked
/// against each shard's headers before its rows are read; for TFRecord, the
/// serialized records. Past it the batch is an error asking for a smaller
/// `--batch-size`, never an allocation a hostile header chose.
pub const MAX_BATCH_BYTES: u64 = 1 << 30;

/// The most a batch's buffer reserves before the bytes arrive; past it it
/// grows with what is read. Small, since the reservation follows the
/// model's shape and `--batch-size`, not the file: a 2 KB file fed to a
/// model with a 1M-wide input must not cost 64 MiB before a row is read.
pub(crate) const PREALLOCATE_BYTES: usize = 8 << 20;

/// The kind of the label, fixed by the first example.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LabelKind {
    Int,
    Float,
    Matrix(usize),
}

/// How one signature input is built.
#[derive(Debug, Clone)]
pub(crate) struct InputPlan {
    pub(crate) input: String,
    pub(crate) source: String,
    pub(crate) dtype: DType,
    /// The signature's dims after the batch dim; `None` for unknown rank.
    pub(crate) dims: Option<Vec<Option<u64>>>,
    /// The dims and values per example, fixed by the first example seen.
    pub(crate) resolved: Option<(Vec<u64>, usize)>,
}

impl InputPlan {
    pub(crate) fn new(spec: &TensorSpec, source: String, path: &Path, examples: bool) -> Result<InputPlan, DataError> {
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
    pub(crate) fn resolve(&mut self, count: usize, own: Option<&[u64]>) -> Result<usize, String> {
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

    pub(crate) fn tensor(&self, rows: usize, column: Column) -> Tensor {
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

pub(crate) fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::Float32 | DType::Float64 | DType::Float16 | DType::BFloat16)
}

/// Appends one number in `dtype`'s layout; errors say what does not fit.
pub(crate) fn put_number(dtype: DType, value: Number, out: &mut Vec<u8>) -> Result<(), String> {
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
pub(crate) enum Column {
    Dense(Vec<u8>),
    Strings(Vec<ByteBuf>),
}

/// Labels (and weights, slices) being filled.
#[derive(Debug)]
pub(crate) struct TargetsOut {
    pub(crate) labels: Labels,
    pub(crate) weights: Option<Vec<f64>>,
    pub(crate) slices: Vec<Vec<String>>,
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
    /// The 0-based index of the batch's first example in what is read (the
    /// whole dataset's order; a shard's own with `--data-shard`).
    pub first_index: u64,
    /// `--example-key`: each row's key as text.
    pub keys: Option<Vec<String>>,
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
    pub(crate) fn empty(kind: LabelKind, rows: usize) -> Labels {
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

pub(crate) fn element_text(element: Element, bytes: &[u8]) -> String {
    match element::number(element, bytes) {
        Some(Number::Int(i)) => i.to_string(),
        Some(Number::BigUnsigned(u)) => u.to_string(),
        Some(Number::Float(f)) => match element {
            Element::Dense(DType::Float64, _) => f.to_string(),
            _ => (f as f32).to_string(),
        },
        None => String::from_utf8_lossy(&element::string(element, bytes).unwrap_or_default()).into_owned(),
    }
}

pub(crate) fn slice_text(feature: &Feature) -> String {
    match &feature.kind {
        Some(Kind::Int64List(l)) => l.value.iter().map(i64::to_string).collect::<Vec<_>>().join(","),
        Some(Kind::FloatList(l)) => l.value.iter().map(f32::to_string).collect::<Vec<_>>().join(","),
        Some(Kind::BytesList(l)) => l.value.iter().map(|b| String::from_utf8_lossy(b)).collect::<Vec<_>>().join(","),
        None => String::new(),
    }
}

pub(crate) fn push_feature(dtype: DType, feature: &Feature, column: &mut Column) -> Result<(), String> {
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

pub(crate) fn push_label(labels: &mut Labels, feature: &Feature, classes: Option<&LabelClasses>) -> Result<(), String> {
    let wrong =
        |expected: String| format!("is {} of {} values, expected {expected}", feature.kind_name(), feature.len());
    match (labels, &feature.kind) {
        (Labels::Int(v), Some(Kind::BytesList(l))) if l.value.len() == 1 && classes.is_some() => {
            let classes = classes.expect("checked");
            v.push(classes.class_of(&l.value[0]).ok_or_else(|| classes.unknown(&l.value[0]))?);
        }
        (Labels::Int(_), _) if classes.is_some() => {
            return Err(wrong("bytes_list of 1 value (a class name, as in the first example)".into()))
        }
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

pub(crate) fn push_array(dtype: DType, element: Element, bytes: &[u8], column: &mut Column) -> Result<(), String> {
    let size = element.item_size();
    match column {
        Column::Strings(strings) => {
            if size == 0 {
                return Ok(());
            }
            for chunk in bytes.chunks_exact(size) {
                let s = element::string(element, chunk).ok_or("a numeric array cannot feed a string input")?;
                strings.push(ByteBuf::from(s));
            }
        }
        Column::Dense(out) => {
            if element == Element::Dense(dtype, false) && dtype != DType::Bool {
                out.extend_from_slice(bytes);
                return Ok(());
            }
            for chunk in bytes.chunks_exact(size.max(1)) {
                let value = element::number(element, chunk).ok_or("a string array cannot feed a numeric input")?;
                put_number(dtype, value, out)?;
            }
        }
    }
    Ok(())
}

/// The names a batch takes besides the inputs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Roles<'a> {
    pub label: &'a str,
    /// `--label-classes`: string labels are these classes' indices.
    pub classes: Option<&'a LabelClasses>,
    pub weight: Option<&'a str>,
    pub slices: &'a [String],
}

/// Where an example is, for its errors.
#[derive(Clone, Copy)]
pub(crate) struct ExamplePlace<'a> {
    pub path: &'a Path,
    /// 0-based in the dataset.
    pub example: u64,
    /// 0-based in what `within` names.
    pub record: u64,
    pub within: &'a str,
}

impl ExamplePlace<'_> {
    fn error(&self, key: &str, problem: String) -> DataError {
        DataError::Example {
            path: self.path.to_path_buf(),
            example: self.example,
            record: self.record,
            within: self.within.to_string(),
            key: key.to_string(),
            problem,
        }
    }
}

/// Adds one example (a row source's piece) to the batch: its features
/// to the inputs (or, `raw`, the serialized record to the one string
/// input), its label, weight and slice values to the targets.
pub(crate) fn add_example(
    inputs: &mut [InputPlan],
    example: &crate::example::Example,
    raw: Option<&[u8]>,
    place: &ExamplePlace<'_>,
    roles: Roles<'_>,
    columns: &mut [Column],
    targets: &mut TargetsOut,
) -> Result<(), DataError> {
    let features = example.features.as_ref().map(|f| &f.feature);
    let get = |key: &str| features.and_then(|f| f.get(key));
    let error = |key: &str, problem: String| place.error(key, problem);
    match raw {
        Some(raw) => {
            let Column::Strings(strings) = &mut columns[0] else { unreachable!("strings") };
            strings.push(ByteBuf::from(raw.to_vec()));
        }
        None => {
            for (plan, column) in inputs.iter_mut().zip(columns.iter_mut()) {
                let feature = get(&plan.source).ok_or_else(|| error(&plan.source, "is missing".into()))?;
                plan.resolve(feature.len(), None).map_err(|p| error(&plan.source, p))?;
                push_feature(plan.dtype, feature, column).map_err(|p| error(&plan.source, p))?;
            }
        }
    }
    let label = get(roles.label).ok_or_else(|| error(roles.label, "(the label) is missing".into()))?;
    push_label(&mut targets.labels, label, roles.classes)
        .map_err(|p| error(roles.label, format!("(the label) {p}")))?;
    if let (Some(key), Some(weights)) = (roles.weight, targets.weights.as_mut()) {
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
    for (key, values) in roles.slices.iter().zip(targets.slices.iter_mut()) {
        values.push(get(key).map_or_else(|| MISSING_SLICE.to_string(), slice_text));
    }
    Ok(())
}

/// String labels (a piece's, from the row at `place`) as the indices of
/// `--label-classes`; without the flag, the error that says how to give it.
fn push_classes(
    strings: &[Vec<u8>],
    path: &Path,
    place: &ExamplePlace<'_>,
    roles: Roles<'_>,
    labels: &mut Labels,
) -> Result<(), DataError> {
    let (Some(classes), Labels::Int(out)) = (roles.classes, labels) else {
        let values = label_classes::distinct(strings.iter().map(Vec::as_slice));
        return Err(label_classes::missing_classes(path, "strings", &values));
    };
    for (row, value) in strings.iter().enumerate() {
        match classes.class_of(value) {
            Some(class) => out.push(class),
            None => {
                let at =
                    ExamplePlace { example: place.example + row as u64, record: place.record + row as u64, ..*place };
                return Err(at.error(roles.label, format!("(the label) {}", classes.unknown(value))));
            }
        }
    }
    Ok(())
}

/// Adds `rows` rows of columns (a columnar source's piece: the inputs',
/// then the label's, the weight's and the slices') to the batch; `place`
/// is the first row's, for the errors of a label that is no class.
pub(crate) fn add_columns(
    inputs: &mut [InputPlan],
    rows: usize,
    chunks: Vec<ColumnChunk>,
    place: &ExamplePlace<'_>,
    roles: Roles<'_>,
    columns: &mut [Column],
    targets: &mut TargetsOut,
) -> Result<(), DataError> {
    let mut chunks = chunks.into_iter();
    for (plan, column) in inputs.iter_mut().zip(columns.iter_mut()) {
        let chunk = chunks.next().expect("one per input");
        let fail = |reason: String| DataError::Array { path: chunk.path.clone(), reason };
        let per_row = chunk.dims.iter().product::<u64>() as usize;
        plan.resolve(per_row, Some(&chunk.dims)).map_err(fail)?;
        let pushed = match chunk.values {
            Values::Elements { element, bytes } => push_array(plan.dtype, element, &bytes, column),
            Values::Strings(strings) => match column {
                Column::Strings(out) => {
                    out.extend(strings.into_iter().map(ByteBuf::from));
                    Ok(())
                }
                Column::Dense(_) => Err("a string array cannot feed a numeric input".to_string()),
            },
        };
        pushed.map_err(|r| DataError::Array {
            path: chunk.path.clone(),
            reason: format!("cannot feed input '{}' ({}): {r}", plan.input, plan.dtype),
        })?;
    }
    let label = chunks.next().expect("label");
    let path = label.path;
    let row_elements = label.dims.iter().product::<u64>() as usize;
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
    let (element, bytes) = match label.values {
        Values::Strings(strings) => return push_classes(&strings, &path, place, roles, &mut targets.labels),
        Values::Elements { element, bytes } if element::number(element, &[0; 8]).is_none() => {
            let strings: Vec<Vec<u8>> = bytes
                .chunks_exact(element.item_size().max(1))
                .map(|chunk| element::string(element, chunk).unwrap_or_default())
                .collect();
            return push_classes(&strings, &path, place, roles, &mut targets.labels);
        }
        Values::Elements { .. } if roles.classes.is_some() => {
            return Err(DataError::Array {
                path,
                reason: "labels are numbers here, class names (--label-classes) in the first file".into(),
            })
        }
        Values::Elements { element, bytes } => (element, bytes),
    };
    for chunk in bytes.chunks_exact(element.item_size()) {
        let Some(value) = element::number(element, chunk) else {
            return Err(DataError::Array { path, reason: "labels are numbers, not strings".into() });
        };
        match (&mut targets.labels, value) {
            (Labels::Int(v), Number::Int(i)) => v.push(i),
            // A whole float (a JSON Lines key of integers widened by a later 0.5).
            (Labels::Int(v), Number::Float(f)) if f.fract() == 0.0 && f.abs() < 9.2e18 => v.push(f as i64),
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
        let chunk = chunks.next().expect("weight");
        match chunk.values {
            Values::Elements { element, bytes } => {
                for value in bytes.chunks_exact(element.item_size()) {
                    weights.push(element::number(element, value).map_or(f64::NAN, Number::as_f64));
                }
            }
            Values::Strings(strings) => weights.extend(strings.iter().map(|_| f64::NAN)),
        }
    }
    for values in targets.slices.iter_mut() {
        let chunk = chunks.next().expect("slice");
        let per_row = chunk.dims.iter().product::<u64>() as usize;
        if per_row == 0 {
            values.extend(std::iter::repeat_n(String::new(), rows));
            continue;
        }
        match chunk.values {
            Values::Elements { element, bytes } => {
                for row in bytes.chunks_exact(per_row * element.item_size()) {
                    let texts: Vec<String> =
                        row.chunks_exact(element.item_size()).map(|e| element_text(element, e)).collect();
                    values.push(texts.join(","));
                }
            }
            Values::Strings(strings) => {
                for row in strings.chunks_exact(per_row) {
                    let texts: Vec<_> = row.iter().map(|s| String::from_utf8_lossy(s)).collect();
                    values.push(texts.join(","));
                }
            }
        }
    }
    Ok(())
}

/// Refuses a shard whose batches would take more than [`MAX_BATCH_BYTES`]:
/// each row's bytes as read and as kept (converted inputs, strings with
/// their allocation, labels as f64, slice values as text), from the headers,
/// before any row is read. `streams` are the inputs', then the label's,
/// the weight's and the slices', as sources hand them; `rows` a batch's.
pub(crate) fn check_batch_cost(
    inputs: &[InputPlan],
    streams: &[ColumnInfo],
    has_weight: bool,
    rows: u64,
) -> Result<(), DataError> {
    const STRING: u64 = std::mem::size_of::<ByteBuf>() as u64;
    const TEXT: u64 = std::mem::size_of::<String>() as u64;
    let mut costs = Vec::with_capacity(streams.len());
    for (i, stream) in streams.iter().enumerate() {
        let elements = stream.row_elements();
        let item = stream.element.item_size() as u64;
        let kept = match inputs.get(i) {
            Some(plan) if plan.dtype == DType::String => elements.saturating_mul(STRING + item),
            Some(plan) => elements.saturating_mul(plan.dtype.element_size().unwrap_or(1) as u64),
            // The label (f64s), the weight (one f64).
            None if i == inputs.len() || (i == inputs.len() + 1 && has_weight) => elements.saturating_mul(8),
            // A slice: one text per row, made of one text per element (a number is at most 24 characters).
            None => elements.saturating_mul(TEXT + item.max(24) + 1).saturating_add(TEXT),
        };
        costs.push(elements.saturating_mul(item).saturating_add(kept));
    }
    let row: u64 = costs.iter().fold(0, |a, b| a.saturating_add(*b));
    let batch = row.saturating_mul(rows);
    if batch <= MAX_BATCH_BYTES {
        return Ok(());
    }
    let (largest, cost) = streams.iter().zip(&costs).max_by_key(|(_, c)| **c).expect("a batch has arrays");
    Err(DataError::Array {
        path: largest.path.clone(),
        reason: format!(
            "a batch of {rows} examples would take about {batch} bytes ({row} an example, {cost} of them for this \
             {}), more than the {MAX_BATCH_BYTES} a batch may hold; use a smaller --batch-size",
            largest.describe
        ),
    })
}
