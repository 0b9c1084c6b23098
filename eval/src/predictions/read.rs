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

use super::columns::{output_column, sidecar, slice_column, INDEX, KEY, LABEL, WEIGHT};
use super::meta::{Meta, META_KEY};
use super::read_arrow::batch_of_arrow;
use super::read_batch::{data_error, err, stored_dtype};
pub use super::read_batch::{ReadError, RescoreBatch, READ_ROWS};
use super::read_jsonl::JsonBatch;
use crate::error::DataError;
use crate::source::arrow::contained;
use crate::source::jsonl::{read_line, without_line_end, LineError, MAX_LINE_BYTES};
use arrow_array::RecordBatch;
use isorun_protocol::Tensor;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use serde_json::Value;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

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
                Some(batch_of_arrow(&self.path, &self.meta, &self.output, &self.slices, &batch))
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
