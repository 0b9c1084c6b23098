//! Reading a predictions file back as batches for the same [`Evaluator`]
//! eval fed (`isorun rescore`): labels of the kind eval read, the output in
//! the dtype the model gave (so log loss clips with the same epsilon),
//! slices as text, eval's first batch first (the task is decided on it).
//! Parquet is read row group by row group and JSON Lines line by line, so
//! memory does not grow with the file.
//!
//! A predictions file is untrusted: Parquet is read through the dataset
//! reader's hardened path (`source::parquet`: its footer capped and its
//! column ranges checked, every page header checked before a page is
//! decompressed, a panic of the Parquet crate the file's error), and no
//! size is taken from what the file claims. Rows per batch come from a byte
//! budget ([`batch_budget`]) and the row's size, never from the
//! description's `first_batch_rows`; eval's first batch is refused when it
//! is more than the budget holds. A JSON Lines line is read with the dataset
//! readers' line cap (`source::lines`, 64 MiB) and walked, never built into
//! a `serde_json::Value` (one cost ~70 bytes a number: a 60 MiB line of
//! zeros took gigabytes): each value goes straight into its column, and an
//! output longer than its saved width is refused at the first value past it,
//! so a line costs a small multiple of its bytes.
//!
//! [`Evaluator`]: crate::Evaluator

use super::meta::{Meta, META_KEY};
use super::{output_column, sidecar, slice_column, INDEX, KEY, LABEL, WEIGHT};
use crate::data::{Labels, Targets};
use crate::error::DataError;
use crate::source::arrow::contained;
use crate::source::jsonl::{read_line, without_line_end, LineError, MAX_LINE_BYTES};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use isorun_protocol::{DType, Tensor};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use serde::de::{DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

/// Rows per batch read (eval's first batch aside), at most.
pub const READ_ROWS: usize = 8192;

/// The fewest bytes a batch may hold, whatever the file's size.
pub const MIN_BATCH_BYTES: u64 = 4 << 20;
/// The most bytes a batch may hold.
pub const MAX_BATCH_BYTES: u64 = 1 << 30;

/// The bytes one batch of a file of `file_len` bytes may hold (its rows'
/// scored output, labels and index): twice the file, within
/// [`MIN_BATCH_BYTES`] and [`MAX_BATCH_BYTES`]. Reading a batch holds about
/// five times its bytes at once (the Parquet crate's buffers, the array,
/// the tensor made of it), so a read stays within the readers' bound of
/// max(64 MiB, 16 × the file); outputs stored at less than half their size
/// come in smaller batches.
pub fn batch_budget(file_len: u64) -> u64 {
    file_len.saturating_mul(2).clamp(MIN_BATCH_BYTES, MAX_BATCH_BYTES)
}

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

/// The predictions files under each path (a folder's `.parquet` and
/// `.jsonl` files, recursively, sorted; a file as it is).
pub fn list_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ReadError> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ReadError> {
        let entries = std::fs::read_dir(dir).map_err(|e| ReadError { path: dir.into(), reason: e.to_string() })?;
        let mut found: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        found.sort();
        for path in found {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with('.') {
                continue;
            }
            if path.is_dir() {
                walk(&path, out)?;
            } else if name.ends_with(".parquet") || name.ends_with(".jsonl") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    for path in paths {
        if path.is_dir() {
            let before = out.len();
            walk(path, &mut out)?;
            if out.len() == before {
                return Err(ReadError { path: path.clone(), reason: "holds no .parquet or .jsonl predictions".into() });
            }
        } else if path.exists() {
            out.push(path.clone());
        } else {
            return Err(ReadError { path: path.clone(), reason: "no such file or folder".into() });
        }
    }
    Ok(out)
}

enum Rows {
    Parquet(Box<ParquetRecordBatchReader>),
    /// A JSON Lines file: its reader, the lines read, the line buffer.
    Jsonl(BufReader<File>, u64, Vec<u8>),
}

/// One predictions file, opened.
pub struct PredictionsReader {
    path: PathBuf,
    pub meta: Meta,
    /// The file's columns, as it has them.
    pub columns: Vec<String>,
    rows: Option<Rows>,
    output: String,
    slices: Vec<String>,
    /// Rows of the current Parquet batch not handed out yet.
    pending: Option<RecordBatch>,
    first: bool,
    /// A Parquet file's metadata, its footer checked (`source::parquet`).
    parquet: Option<ArrowReaderMetadata>,
    /// Rows per batch, from [`batch_budget`] and the row's size (see [`PredictionsReader::start`]).
    batch_rows: usize,
}

fn err(path: &Path, reason: impl Into<String>) -> ReadError {
    ReadError { path: path.to_path_buf(), reason: reason.into() }
}

/// A dataset reader's error, as this module's (its path is the file's).
fn data_error(path: &Path, error: DataError) -> ReadError {
    match error {
        DataError::Array { reason, .. } | DataError::Reader { reason, .. } => err(path, reason),
        other => err(path, other.to_string()),
    }
}

/// The most a `.jsonl` file's description (its sidecar) may hold: eval
/// writes a few KB; a larger one is not read whole.
const MAX_SIDECAR_BYTES: u64 = 16 << 20;

/// Reads a sidecar, refusing one past [`MAX_SIDECAR_BYTES`] without reading
/// it whole.
fn read_sidecar(side: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(side)?.take(MAX_SIDECAR_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_SIDECAR_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it is larger than {MAX_SIDECAR_BYTES} bytes (eval writes a few KB)"),
        ));
    }
    Ok(text)
}

impl PredictionsReader {
    /// Opens a `.parquet` (with its `isorun` metadata) or a `.jsonl` (with
    /// its sidecar) and checks its description.
    pub fn open(path: &Path) -> Result<PredictionsReader, ReadError> {
        let name = path.to_string_lossy();
        let mut parquet = None;
        let (meta, columns) = if name.ends_with(".jsonl") {
            let side = sidecar(path);
            let text = read_sidecar(&side)
                .map_err(|e| err(&side, format!("cannot read the description of {}: {e}", path.display())))?;
            isorun_tensors::json_cost::check_json_cost(text.as_bytes()).map_err(|e| err(&side, e))?;
            let value: Value = serde_json::from_str(&text).map_err(|e| err(&side, format!("not JSON: {e}")))?;
            let meta = Meta::from_json(&value[META_KEY]).map_err(|e| err(&side, e))?;
            let columns = jsonl_columns(&meta);
            (meta, columns)
        } else {
            let checked =
                contained(path, || crate::source::parquet::metadata(path)).map_err(|e| data_error(path, e))?;
            let text = checked
                .metadata()
                .file_metadata()
                .key_value_metadata()
                .and_then(|kv| kv.iter().find(|kv| kv.key == META_KEY))
                .and_then(|kv| kv.value.clone())
                .ok_or_else(|| {
                    err(path, format!("has no '{META_KEY}' metadata: is it a file of isorun eval --predictions?"))
                })?;
            isorun_tensors::json_cost::check_json_cost(text.as_bytes())
                .map_err(|e| err(path, format!("its '{META_KEY}' metadata: {e}")))?;
            let value: Value =
                serde_json::from_str(&text).map_err(|e| err(path, format!("its '{META_KEY}' metadata: {e}")))?;
            let meta = Meta::from_json(&value).map_err(|e| err(path, format!("its '{META_KEY}' metadata: {e}")))?;
            let columns = checked.schema().fields().iter().map(|f| f.name().clone()).collect();
            parquet = Some(checked);
            (meta, columns)
        };
        let output = meta.output.clone();
        let slices = meta.slices.clone();
        Ok(PredictionsReader {
            path: path.to_path_buf(),
            meta,
            columns,
            rows: None,
            output,
            slices,
            pending: None,
            first: true,
            parquet,
            batch_rows: READ_ROWS,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A signature with the saved outputs, as [`crate::Evaluator::new`]
    /// takes it: each in the dtype it is read in (bfloat16 as float32,
    /// whose log-loss epsilon it shares), eval's scored output with its
    /// declared shape, the others `[?, row shape]`.
    pub fn signature(&self) -> isorun_protocol::SignatureInfo {
        let outputs = self
            .meta
            .outputs
            .iter()
            .map(|o| isorun_protocol::TensorSpec {
                name: o.name.clone(),
                dtype: stored_dtype(o.dtype).0,
                shape: if o.name == self.meta.output {
                    self.meta.output_shape.clone()
                } else {
                    Some(std::iter::once(None).chain(o.row_shape.iter().map(|d| Some(*d))).collect())
                },
            })
            .collect();
        isorun_protocol::SignatureInfo {
            key: format!("predictions of {}", self.meta.model),
            inputs: Vec::new(),
            outputs,
        }
    }

    /// Chooses the output scored and the slices read (each must be a
    /// column of the file), then starts reading rows.
    pub fn start(&mut self, output: &str, slices: &[String]) -> Result<(), ReadError> {
        let has = |column: &str| self.columns.iter().any(|c| c == column);
        if self.meta.saved(output).is_none() || !has(&output_column(output)) {
            let saved: Vec<&str> = self.meta.outputs.iter().map(|o| o.name.as_str()).collect();
            return Err(err(
                &self.path,
                format!(
                    "has no output '{output}'; it saved: {} (eval --predictions-all saves every output)",
                    saved.join(", ")
                ),
            ));
        }
        for slice in slices {
            if !has(&slice_column(slice)) {
                return Err(err(
                    &self.path,
                    format!(
                        "has no column '{}': rescore can slice only by features eval saved (eval --slice {slice}); \
                         its columns are: {}",
                        slice_column(slice),
                        self.columns.join(", ")
                    ),
                ));
            }
        }
        self.output = output.to_string();
        self.slices = slices.to_vec();
        self.batch_rows = self.rows_per_batch()?;
        let rows = if self.path.to_string_lossy().ends_with(".jsonl") {
            let file = File::open(&self.path).map_err(|e| err(&self.path, e.to_string()))?;
            Rows::Jsonl(BufReader::with_capacity(1 << 20, file), 0, Vec::new())
        } else {
            let path = self.path.clone();
            let meta = self.parquet.clone().expect("a Parquet file's metadata is read by open");
            let mut wanted: Vec<String> = vec![INDEX.into(), KEY.into(), LABEL.into(), WEIGHT.into()];
            wanted.push(output_column(output));
            wanted.extend(slices.iter().map(|s| slice_column(s)));
            let indices: Vec<usize> = meta
                .schema()
                .fields()
                .iter()
                .enumerate()
                .filter(|(_, f)| wanted.contains(f.name()))
                .map(|(i, _)| i)
                .collect();
            let batch_size = self.batch_rows.max(self.meta.first_batch_rows as usize);
            let reader = contained(&path, || {
                let groups = meta.metadata().num_row_groups();
                crate::source::parquet::check_pages(&path, &meta, 0..groups, &indices)?;
                let file = File::open(&path).map_err(crate::source::io_error(&path))?;
                let mask = ProjectionMask::roots(meta.parquet_schema(), indices.iter().copied());
                ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
                    .with_projection(mask)
                    .with_batch_size(batch_size)
                    .build()
                    .map_err(|e| DataError::Array {
                        path: path.clone(),
                        reason: format!("cannot read it as Parquet: {e}"),
                    })
            })
            .map_err(|e| data_error(&path, e))?;
            Rows::Parquet(Box::new(reader))
        };
        self.rows = Some(rows);
        Ok(())
    }

    /// Rows per batch: as many as [`batch_budget`] holds of the scored
    /// output's rows (and matrix labels, index and weight), at most
    /// [`READ_ROWS`]. Eval's first batch must fit in the budget whole (its
    /// rows decide the task): a description claiming more is refused.
    fn rows_per_batch(&self) -> Result<usize, ReadError> {
        let saved = self.meta.saved(&self.output).expect("checked by start");
        let element = stored_dtype(saved.dtype).0.element_size().unwrap_or(8) as u64;
        let label_columns = self
            .meta
            .label_kind
            .as_deref()
            .and_then(|kind| kind.strip_prefix("matrix:"))
            .and_then(|columns| columns.parse::<u64>().ok())
            .unwrap_or(1);
        let row_bytes = saved
            .row_shape
            .iter()
            .try_fold(element, |bytes, &d| bytes.checked_mul(d))
            .and_then(|bytes| bytes.checked_add(label_columns.checked_mul(8)?))
            .and_then(|bytes| bytes.checked_add(24))
            .unwrap_or(u64::MAX);
        let file_len = std::fs::metadata(&self.path).map_err(|e| err(&self.path, e.to_string()))?.len();
        let budget = batch_budget(file_len);
        let rows = (budget / row_bytes).min(READ_ROWS as u64) as usize;
        let first = self.meta.first_batch_rows;
        if rows == 0 || u128::from(first) * u128::from(row_bytes) > u128::from(budget) {
            let rows = first.max(1);
            return Err(err(
                &self.path,
                format!(
                    "eval's first batch, {rows} rows of {row_bytes} bytes (output '{}' of row shape {:?}), is more \
                     than the {budget} bytes rescore reads at once from a file of {file_len} bytes",
                    self.output, saved.row_shape
                ),
            ));
        }
        Ok(rows)
    }

    /// The next batch; `None` at the end.
    pub fn next_batch(&mut self) -> Option<Result<RescoreBatch, ReadError>> {
        let first = std::mem::replace(&mut self.first, false);
        let first_rows = self.meta.first_batch_rows as usize;
        let want = if first && first_rows > 0 { first_rows } else { self.batch_rows };
        match self.rows.as_mut()? {
            Rows::Parquet(reader) => {
                let batch = match self.pending.take() {
                    Some(batch) => batch,
                    None => {
                        let next = contained(&self.path, || {
                            reader.next().transpose().map_err(|e| DataError::Array {
                                path: self.path.clone(),
                                reason: format!("cannot read it as Parquet: {e}"),
                            })
                        });
                        match next {
                            Ok(Some(batch)) => batch,
                            Ok(None) => return None,
                            Err(e) => return Some(Err(data_error(&self.path, e))),
                        }
                    }
                };
                let batch = if first && batch.num_rows() > want {
                    self.pending = Some(batch.slice(want, batch.num_rows() - want));
                    batch.slice(0, want)
                } else {
                    batch
                };
                Some(self.batch_of_arrow(&batch))
            }
            Rows::Jsonl(reader, line_number, buf) => {
                let mut batch = match JsonBatch::new(&self.path, &self.meta, &self.output, &self.slices, want) {
                    Ok(batch) => batch,
                    Err(e) => return Some(Err(e)),
                };
                let path = &self.path;
                while batch.rows < want {
                    match read_line(reader, buf, MAX_LINE_BYTES) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(LineError::Io(e)) => {
                            return Some(Err(err(path, format!("line {}: cannot read: {e}", *line_number + 1))))
                        }
                        Err(LineError::TooLong { max }) => {
                            return Some(Err(err(
                                path,
                                format!(
                                    "line {}: the line is longer than {max} bytes, the most a line may hold (one \
                                     JSON object per line)",
                                    *line_number + 1
                                ),
                            )))
                        }
                    }
                    *line_number += 1;
                    let text = without_line_end(buf);
                    if text.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    if let Err(reason) = batch.push_line(text) {
                        return Some(Err(err(path, format!("line {line_number}: {reason}"))));
                    }
                }
                if batch.rows == 0 {
                    return None;
                }
                let saved = self.meta.saved(&self.output).expect("checked by start");
                Some(Ok(batch.finish(&self.output, &saved.row_shape)))
            }
        }
    }

    fn column<'b>(&self, batch: &'b RecordBatch, name: &str) -> Result<Option<&'b ArrayRef>, ReadError> {
        let Some(array) = batch.column_by_name(name) else { return Ok(None) };
        if array.null_count() > 0 {
            let row = (0..array.len()).find(|&r| array.is_null(r)).unwrap_or(0);
            return Err(err(&self.path, format!("column '{name}' is null at row {row} of a batch")));
        }
        Ok(Some(array))
    }

    fn batch_of_arrow(&self, batch: &RecordBatch) -> Result<RescoreBatch, ReadError> {
        let rows = batch.num_rows();
        let bad = |name: &str, array: &ArrayRef| {
            err(&self.path, format!("column '{name}' is {}, not what eval writes", array.data_type()))
        };
        let index = self.column(batch, INDEX)?.ok_or_else(|| err(&self.path, "has no column 'index'"))?;
        let first_index =
            index.as_primitive_opt::<UInt64Type>().ok_or_else(|| bad(INDEX, index))?.values().first().copied();
        let keys = match self.column(batch, KEY)? {
            Some(array) => Some(strings(array).ok_or_else(|| bad(KEY, array))?),
            None => None,
        };
        let label = self.column(batch, LABEL)?.ok_or_else(|| err(&self.path, "has no column 'label'"))?;
        let labels = match label.data_type() {
            DataType::Int64 => Labels::Int(label.as_primitive::<Int64Type>().values().to_vec()),
            DataType::Float64 => Labels::Float(label.as_primitive::<Float64Type>().values().to_vec()),
            _ => {
                let (values, columns) = flat_list(label, rows).ok_or_else(|| bad(LABEL, label))?;
                let values = values.as_primitive_opt::<Float64Type>().ok_or_else(|| bad(LABEL, label))?;
                Labels::Matrix { columns, values: values.values().to_vec() }
            }
        };
        let weights = match self.column(batch, WEIGHT)? {
            Some(array) => {
                Some(array.as_primitive_opt::<Float64Type>().ok_or_else(|| bad(WEIGHT, array))?.values().to_vec())
            }
            None => None,
        };
        let mut slices = Vec::new();
        for slice in &self.slices {
            let name = slice_column(slice);
            let array = self.column(batch, &name)?.ok_or_else(|| err(&self.path, format!("has no column '{name}'")))?;
            slices.push((slice.clone(), strings(array).ok_or_else(|| bad(&name, array))?));
        }
        let name = output_column(&self.output);
        let array = self.column(batch, &name)?.ok_or_else(|| err(&self.path, format!("has no column '{name}'")))?;
        let saved = self.meta.saved(&self.output).expect("checked by start");
        let (values, width) = if saved.scalar() {
            (array.clone(), 1)
        } else {
            flat_list(array, rows).ok_or_else(|| bad(&name, array))?
        };
        if width != saved.width() {
            return Err(err(
                &self.path,
                format!("column '{name}' has {width} values a row, eval wrote {}", saved.width()),
            ));
        }
        let (dtype, bytes) = dense_bytes(&values, saved.dtype).ok_or_else(|| bad(&name, array))?;
        let mut shape = vec![rows as u64];
        shape.extend_from_slice(&saved.row_shape);
        let targets = Targets { rows, labels, weights, slices, first_index: first_index.unwrap_or(0), keys };
        Ok(RescoreBatch { targets, output: (self.output.clone(), Tensor::dense(dtype, shape, bytes)) })
    }
}

/// The columns a JSON Lines file's rows have, from its description.
fn jsonl_columns(meta: &Meta) -> Vec<String> {
    let mut columns = vec![INDEX.to_string()];
    if meta.example_key.is_some() {
        columns.push(KEY.into());
    }
    columns.push(LABEL.into());
    if meta.weight.is_some() {
        columns.push(WEIGHT.into());
    }
    columns.extend(meta.slices.iter().map(|s| slice_column(s)));
    columns.extend(meta.outputs.iter().map(|o| output_column(&o.name)));
    columns
}

/// How a dtype is stored: bfloat16 as float32 (exactly); the rest as they are.
fn stored_dtype(dtype: DType) -> (DType, ()) {
    match dtype {
        DType::BFloat16 => (DType::Float32, ()),
        other => (other, ()),
    }
}

fn strings(array: &ArrayRef) -> Option<Vec<String>> {
    match array.data_type() {
        DataType::Utf8 => Some(array.as_string::<i32>().iter().map(|s| s.unwrap_or_default().to_string()).collect()),
        DataType::LargeUtf8 => {
            Some(array.as_string::<i64>().iter().map(|s| s.unwrap_or_default().to_string()).collect())
        }
        DataType::Utf8View => Some(array.as_string_view().iter().map(|s| s.unwrap_or_default().to_string()).collect()),
        _ => None,
    }
}

/// A list column's values, flat, and the (same) length of every row.
fn flat_list(array: &ArrayRef, rows: usize) -> Option<(ArrayRef, usize)> {
    let (values, offsets): (ArrayRef, Vec<usize>) = match array.data_type() {
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            (list.values().clone(), list.value_offsets().iter().map(|o| *o as usize).collect())
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            (list.values().clone(), list.value_offsets().iter().map(|o| *o as usize).collect())
        }
        DataType::FixedSizeList(_, width) => {
            let list = array.as_fixed_size_list();
            let width = *width as usize;
            let start = list.offset() * width;
            return Some((list.values().slice(start, rows * width), width));
        }
        _ => return None,
    };
    let width = if rows == 0 { 0 } else { offsets[1] - offsets[0] };
    if offsets.windows(2).any(|w| w[1] - w[0] != width) || values.null_count() > 0 {
        return None;
    }
    let start = offsets.first().copied().unwrap_or(0);
    Some((values.slice(start, rows * width), width))
}

/// A flat Arrow array as a dense tensor's bytes in `dtype` (as stored).
fn dense_bytes(values: &ArrayRef, dtype: DType) -> Option<(DType, Vec<u8>)> {
    fn le<T: arrow_array::ArrowPrimitiveType>(values: &ArrayRef, f: impl Fn(T::Native) -> Vec<u8>) -> Option<Vec<u8>> {
        Some(values.as_primitive_opt::<T>()?.values().iter().flat_map(|v| f(*v)).collect())
    }
    let (stored, _) = stored_dtype(dtype);
    let bytes = match stored {
        DType::Float32 => le::<Float32Type>(values, |v| v.to_le_bytes().to_vec()),
        DType::Float64 => le::<Float64Type>(values, |v| v.to_le_bytes().to_vec()),
        DType::Float16 => le::<Float16Type>(values, |v| v.to_le_bytes().to_vec()),
        DType::Int8 => le::<Int8Type>(values, |v| v.to_le_bytes().to_vec()),
        DType::Int16 => le::<Int16Type>(values, |v| v.to_le_bytes().to_vec()),
        DType::Int32 => le::<Int32Type>(values, |v| v.to_le_bytes().to_vec()),
        DType::Int64 => le::<Int64Type>(values, |v| v.to_le_bytes().to_vec()),
        DType::UInt8 => le::<UInt8Type>(values, |v| v.to_le_bytes().to_vec()),
        DType::UInt16 => le::<UInt16Type>(values, |v| v.to_le_bytes().to_vec()),
        DType::UInt32 => le::<UInt32Type>(values, |v| v.to_le_bytes().to_vec()),
        DType::UInt64 => le::<UInt64Type>(values, |v| v.to_le_bytes().to_vec()),
        DType::Bool => values.as_boolean_opt().map(|b| b.values().iter().map(u8::from).collect()),
        DType::BFloat16 | DType::String => None,
    }?;
    Some((stored, bytes))
}

/// One JSON value where a scalar is expected: numbers as serde_json reads
/// them, a string, or what else it was (a list or object is skipped, not built).
#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    U(u64),
    I(i64),
    F(f64),
    Bool(bool),
    Null,
    Str(String),
    List,
    Object,
}

impl Scalar {
    /// As `serde_json::Value::as_f64`.
    fn as_f64(&self) -> Option<f64> {
        match *self {
            Scalar::U(v) => Some(v as f64),
            Scalar::I(v) => Some(v as f64),
            Scalar::F(v) => Some(v),
            _ => None,
        }
    }

    /// As `serde_json::Value::as_i64`.
    fn as_i64(&self) -> Option<i64> {
        match *self {
            Scalar::U(v) => i64::try_from(v).ok(),
            Scalar::I(v) => Some(v),
            _ => None,
        }
    }

    fn as_bool(&self) -> Option<bool> {
        match *self {
            Scalar::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// As `serde_json::Value::as_u64`.
    fn as_u64(&self) -> Option<u64> {
        match *self {
            Scalar::U(v) => Some(v),
            Scalar::I(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::U(v) => write!(f, "{v}"),
            Scalar::I(v) => write!(f, "{v}"),
            Scalar::F(v) => write!(f, "{v}"),
            Scalar::Bool(v) => write!(f, "{v}"),
            Scalar::Null => f.write_str("null"),
            Scalar::Str(v) => write!(f, "{}", Value::from(v.as_str())),
            Scalar::List => f.write_str("a list"),
            Scalar::Object => f.write_str("an object"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Scalar, D::Error> {
        struct ScalarVisitor;
        impl<'de> Visitor<'de> for ScalarVisitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::I(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::U(v))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar::F(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<Scalar, E> {
                Ok(Scalar::Str(v))
            }
            fn visit_unit<E>(self) -> Result<Scalar, E> {
                Ok(Scalar::Null)
            }
            fn visit_none<E>(self) -> Result<Scalar, E> {
                Ok(Scalar::Null)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::List)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Object)
            }
        }
        deserializer.deserialize_any(ScalarVisitor)
    }
}

/// A key of a predictions row that is read (the rest are skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Index,
    Key,
    Label,
    Weight,
    Output,
    Slice(usize),
}

/// One batch of a JSON Lines predictions file, built a line at a time:
/// each line's values go straight into these columns.
struct JsonBatch {
    /// The keys read, by name, and which column each fills.
    fields: Vec<(String, Field)>,
    /// Which of [`JsonBatch::fields`] the current line has had.
    seen: Vec<bool>,
    dtype: DType,
    scalar: bool,
    width: usize,
    labels: Labels,
    weights: Option<Vec<f64>>,
    keys: Option<Vec<String>>,
    slices: Vec<(String, Vec<String>)>,
    /// The scored output's values, in `dtype`'s layout.
    bytes: Vec<u8>,
    first_index: Option<u64>,
    rows: usize,
}

impl JsonBatch {
    fn new(path: &Path, meta: &Meta, output: &str, slices: &[String], rows: usize) -> Result<JsonBatch, ReadError> {
        let saved = meta.saved(output).expect("checked by start");
        // Rows hold at most the budget's rows (see `rows_per_batch`); not more than READ_ROWS are reserved.
        let rows = rows.min(READ_ROWS);
        let labels = match meta.label_kind.as_deref().unwrap_or("int") {
            "int" => Labels::Int(Vec::with_capacity(rows)),
            "float" => Labels::Float(Vec::with_capacity(rows)),
            other => {
                let columns = other
                    .strip_prefix("matrix:")
                    .and_then(|c| c.parse().ok())
                    .ok_or_else(|| err(path, format!("label kind '{other}' is unknown")))?;
                Labels::Matrix { columns, values: Vec::new() }
            }
        };
        let mut fields = vec![(INDEX.to_string(), Field::Index), (LABEL.to_string(), Field::Label)];
        if meta.example_key.is_some() {
            fields.push((KEY.to_string(), Field::Key));
        }
        if meta.weight.is_some() {
            fields.push((WEIGHT.to_string(), Field::Weight));
        }
        fields.extend(slices.iter().enumerate().map(|(i, s)| (slice_column(s), Field::Slice(i))));
        fields.push((output_column(output), Field::Output));
        Ok(JsonBatch {
            seen: vec![false; fields.len()],
            fields,
            dtype: stored_dtype(saved.dtype).0,
            scalar: saved.scalar(),
            width: saved.width(),
            labels,
            weights: meta.weight.as_ref().map(|_| Vec::with_capacity(rows)),
            keys: meta.example_key.as_ref().map(|_| Vec::with_capacity(rows)),
            slices: slices.iter().map(|s| (s.clone(), Vec::new())).collect(),
            // Grown as values are read: the row's width is the file's claim.
            bytes: Vec::new(),
            first_index: None,
            rows: 0,
        })
    }

    /// Reads one line (a JSON object) into the columns; why not, if not.
    fn push_line(&mut self, text: &[u8]) -> Result<(), String> {
        self.seen.iter_mut().for_each(|s| *s = false);
        let mut de = serde_json::Deserializer::from_slice(text);
        RowSeed(self).deserialize(&mut de).and_then(|()| de.end()).map_err(|e| e.to_string())?;
        if let Some(i) = self.seen.iter().position(|s| !s) {
            return Err(format!("has no '{}'", self.fields[i].0));
        }
        self.rows += 1;
        Ok(())
    }

    /// Reads the value of `field` (the key `name`).
    fn read_value<'de, A: MapAccess<'de>>(&mut self, map: &mut A, name: &str, field: Field) -> Result<(), A::Error> {
        let fail = |reason: String| A::Error::custom(reason);
        match field {
            Field::Index => {
                let index =
                    map.next_value::<Scalar>()?.as_u64().ok_or_else(|| fail("'index' is not a count".into()))?;
                self.first_index.get_or_insert(index);
            }
            Field::Key => match map.next_value::<Scalar>()? {
                Scalar::Str(key) => self.keys.get_or_insert_with(Vec::new).push(key),
                _ => return Err(fail("'key' is not a string".into())),
            },
            Field::Weight => {
                let weight =
                    map.next_value::<Scalar>()?.as_f64().ok_or_else(|| fail("'weight' is not a number".into()))?;
                self.weights.get_or_insert_with(Vec::new).push(weight);
            }
            Field::Slice(i) => match map.next_value::<Scalar>()? {
                Scalar::Str(value) => self.slices[i].1.push(value),
                _ => return Err(fail(format!("'{name}' is not a string"))),
            },
            Field::Label => match &mut self.labels {
                Labels::Int(v) => v.push(
                    map.next_value::<Scalar>()?.as_i64().ok_or_else(|| fail("'label' is not an integer".into()))?,
                ),
                Labels::Float(v) => {
                    v.push(map.next_value::<Scalar>()?.as_f64().ok_or_else(|| fail("'label' is not a number".into()))?)
                }
                Labels::Matrix { columns, values } => {
                    let mut seed =
                        ListSeed { name, width: *columns, put: |s: &Scalar| s.as_f64().map(|v| values.push(v)) };
                    map.next_value_seed(&mut seed)?;
                }
            },
            Field::Output => {
                let (dtype, bytes) = (self.dtype, &mut self.bytes);
                if self.scalar {
                    let value = map.next_value::<Scalar>()?;
                    put_scalar(dtype, &value, bytes).ok_or_else(|| fail(format!("'{name}' holds {value}")))?;
                } else {
                    let mut seed = ListSeed { name, width: self.width, put: |s: &Scalar| put_scalar(dtype, s, bytes) };
                    map.next_value_seed(&mut seed)?;
                }
            }
        }
        Ok(())
    }

    fn finish(self, output: &str, row_shape: &[u64]) -> RescoreBatch {
        let mut shape = vec![self.rows as u64];
        shape.extend_from_slice(row_shape);
        let targets = Targets {
            rows: self.rows,
            labels: self.labels,
            weights: self.weights,
            slices: self.slices,
            first_index: self.first_index.unwrap_or(0),
            keys: self.keys,
        };
        RescoreBatch { targets, output: (output.to_string(), Tensor::dense(self.dtype, shape, self.bytes)) }
    }
}

/// Reads one line's object into a [`JsonBatch`].
struct RowSeed<'a>(&'a mut JsonBatch);

impl<'de> DeserializeSeed<'de> for RowSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RowSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object (one row of isorun eval --predictions)")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let batch = self.0;
        while let Some(at) = map.next_key_seed(KeySeed(&batch.fields))? {
            let Some(at) = at else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let (name, field) = batch.fields[at].clone();
            if std::mem::replace(&mut batch.seen[at], true) {
                return Err(A::Error::custom(format!("'{name}' appears twice")));
            }
            batch.read_value(&mut map, &name, field)?;
        }
        Ok(())
    }
}

/// A key, as its place among the keys read (`None`: skipped); never copied.
struct KeySeed<'a>(&'a [(String, Field)]);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<usize>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|(name, _)| name == v))
    }
}

/// A list of `width` scalars, each handed to `put` (`None`: not what the
/// column holds), refused at the first value past `width`.
struct ListSeed<'n, F> {
    name: &'n str,
    width: usize,
    put: F,
}

impl<'de, F: FnMut(&Scalar) -> Option<()>> DeserializeSeed<'de> for &mut ListSeed<'_, F> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, F: FnMut(&Scalar) -> Option<()>> Visitor<'de> for &mut ListSeed<'_, F> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "'{}' to be a list of {} values", self.name, self.width)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (name, width) = (self.name, self.width);
        let mut count = 0usize;
        while let Some(value) = seq.next_element::<Scalar>()? {
            if count == width {
                return Err(A::Error::custom(format!("'{name}' has more than {width} values, eval wrote {width}")));
            }
            (self.put)(&value).ok_or_else(|| A::Error::custom(format!("'{name}' holds {value}")))?;
            count += 1;
        }
        if count != width {
            return Err(A::Error::custom(format!("'{name}' has {count} values, eval wrote {width}")));
        }
        Ok(())
    }
}

/// Appends a JSON number in `dtype`'s layout; `None` when it does not fit.
fn put_scalar(dtype: DType, value: &Scalar, out: &mut Vec<u8>) -> Option<()> {
    match dtype {
        DType::Float32 => out.extend_from_slice(&(value.as_f64()? as f32).to_le_bytes()),
        DType::Float64 => out.extend_from_slice(&value.as_f64()?.to_le_bytes()),
        DType::Float16 => out.extend_from_slice(&half::f16::from_f64(value.as_f64()?).to_le_bytes()),
        DType::Int8 => out.extend_from_slice(&i8::try_from(value.as_i64()?).ok()?.to_le_bytes()),
        DType::Int16 => out.extend_from_slice(&i16::try_from(value.as_i64()?).ok()?.to_le_bytes()),
        DType::Int32 => out.extend_from_slice(&i32::try_from(value.as_i64()?).ok()?.to_le_bytes()),
        DType::Int64 => out.extend_from_slice(&value.as_i64()?.to_le_bytes()),
        DType::UInt8 => out.push(u8::try_from(value.as_u64()?).ok()?),
        DType::UInt16 => out.extend_from_slice(&u16::try_from(value.as_u64()?).ok()?.to_le_bytes()),
        DType::UInt32 => out.extend_from_slice(&u32::try_from(value.as_u64()?).ok()?.to_le_bytes()),
        DType::UInt64 => out.extend_from_slice(&value.as_u64()?.to_le_bytes()),
        DType::Bool => out.push(u8::from(value.as_bool()?)),
        DType::BFloat16 | DType::String => return None,
    }
    Some(())
}

/// A dense numeric tensor's elements as f64 (what [`super::Differ`] compares).
pub(crate) fn values_f64(tensor: &Tensor, out: &mut Vec<f64>) -> Result<(), String> {
    let isorun_protocol::TensorData::Dense(bytes) = &tensor.data else {
        return Err("the output is not a dense tensor in memory".into());
    };
    let size = tensor.dtype.element_size().ok_or("the output holds strings")?;
    let element = isorun_tensors::npy::Element::Dense(tensor.dtype, false);
    out.clear();
    out.extend(bytes.chunks_exact(size).map(|c| crate::element::number(element, c).map_or(f64::NAN, |n| n.as_f64())));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            model: "m".into(),
            output: "p".into(),
            output_shape: Some(vec![None, Some(2)]),
            outputs: vec![super::super::SavedOutput { name: "p".into(), dtype: DType::Float32, row_shape: vec![2] }],
            label_kind: Some("int".into()),
            label: "y".into(),
            weight: None,
            slices: vec!["s".into()],
            example_key: None,
            metrics: vec!["accuracy".into()],
            threshold: 0.5,
            top_k: 5,
            from_logits: false,
            task: None,
            first_batch_rows: 0,
            examples: 0,
            data_digest: "d".into(),
            data_shard: None,
            skipped_corrupt: 0,
            calibration_bins: 15,
            max_confusion_classes: 1000,
        }
    }

    fn push(lines: &[&str]) -> Result<RescoreBatch, String> {
        let mut batch = JsonBatch::new(Path::new("m.jsonl"), &meta(), "p", &["s".into()], 8).map_err(|e| e.reason)?;
        for line in lines {
            batch.push_line(line.as_bytes())?;
        }
        Ok(batch.finish("p", &[2]))
    }

    #[test]
    fn a_line_is_walked_into_its_columns_and_a_lie_is_named() {
        let good = r#"{"index":7,"label":1,"slice:s":"a","output:p":[0.5,2],"other":[[1,2],{"x":3}]}"#;
        let batch = push(&[good, good]).unwrap();
        assert_eq!(batch.targets.rows, 2);
        assert_eq!(batch.targets.first_index, 7);
        assert!(matches!(&batch.targets.labels, Labels::Int(v) if v == &[1, 1]));
        assert_eq!(batch.targets.slices, vec![("s".to_string(), vec!["a".to_string(), "a".to_string()])]);
        let isorun_protocol::TensorData::Dense(bytes) = &batch.output.1.data else { panic!("dense") };
        let expected: Vec<u8> = [0.5f32, 2.0, 0.5, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(batch.output.1.shape, vec![2, 2]);
        assert_eq!(bytes, &expected);
        for (line, says) in [
            (
                r#"{"index":0,"label":1,"slice:s":"a","output:p":[0,1,2]}"#,
                "'output:p' has more than 2 values, eval wrote 2",
            ),
            (r#"{"index":0,"label":1,"slice:s":"a","output:p":[0]}"#, "'output:p' has 1 values, eval wrote 2"),
            (r#"{"index":0,"label":1,"slice:s":"a","output:p":[0,null]}"#, "'output:p' holds null"),
            (r#"{"index":0,"label":1.5,"slice:s":"a","output:p":[0,1]}"#, "'label' is not an integer"),
            (r#"{"index":-1,"label":1,"slice:s":"a","output:p":[0,1]}"#, "'index' is not a count"),
            (r#"{"index":0,"label":1,"slice:s":3,"output:p":[0,1]}"#, "'slice:s' is not a string"),
            (r#"{"index":0,"label":1,"output:p":[0,1]}"#, "has no 'slice:s'"),
            (r#"{"index":0,"label":1,"label":2,"slice:s":"a","output:p":[0,1]}"#, "'label' appears twice"),
            (r#"{"index":0,"label":1,"slice:s":"a","output:p":[0,1]} x"#, "trailing characters"),
            (r#"[1]"#, "expected a JSON object"),
        ] {
            let error = push(&[line]).err().unwrap_or_default();
            assert!(error.contains(says), "{line}: {error}");
        }
    }
}
