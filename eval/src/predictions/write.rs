//! Writing one model's predictions batch by batch, under a temporary name
//! in the target's folder, renamed into place by [`PredictionsWriter::finish`]
//! only: a writer dropped unfinished (a unit that failed part-way) removes
//! its temporary file, so a failed unit leaves nothing behind. Parquet row
//! groups are flushed every [`ROW_GROUP_ROWS`] rows, so memory stays flat.

use super::columns::{output_column, sidecar, slice_column, PredictionsFormat, INDEX, KEY, LABEL, WEIGHT};
use super::meta::{label_kind, Meta, SavedOutput, META_KEY};
use crate::data::{Labels, Targets};
use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Float16Array, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array,
    Int8Array, ListArray, RecordBatch, StringArray, UInt16Array, UInt32Array, UInt64Array, UInt8Array,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use isorun_protocol::{DType, Tensor, TensorData};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows per Parquet row group: what the writer holds before it flushes.
pub const ROW_GROUP_ROWS: usize = 64 * 1024;

/// Why predictions could not be written (the path is the file's).
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct WriteError {
    pub path: PathBuf,
    pub reason: String,
}

enum Sink {
    /// Until the first batch fixes the schema.
    Pending(File),
    Parquet(Box<ArrowWriter<File>>),
    Jsonl(BufWriter<File>),
    Done,
}

/// One model's predictions file being written.
pub struct PredictionsWriter {
    target: PathBuf,
    temporary: PathBuf,
    format: PredictionsFormat,
    sink: Sink,
    meta: Meta,
    /// `--predictions-all`: every output, not only the scored one.
    all: bool,
    schema: Option<SchemaRef>,
    line: String,
}

/// A temporary name of its own for each writer (process id and a count),
/// so that a retry's writer and the failed attempt's, dropped later, never
/// share one.
fn temporary_of(target: &Path) -> PathBuf {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    target.with_file_name(format!(".{name}.tmp-{}-{count}", std::process::id()))
}

/// A new file, never opened through a link (a stale one goes first).
fn create_new(path: &Path) -> std::io::Result<File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::OpenOptions::new().write(true).create_new(true).open(path)
}

impl PredictionsWriter {
    /// `DIR/<model id>.<format>` (an id with `/` nests folders, as
    /// `--output-dir` does). `meta` holds eval's settings; the columns and
    /// counts are filled in as batches come.
    pub fn create(
        dir: &Path,
        format: PredictionsFormat,
        meta: Meta,
        all: bool,
    ) -> Result<PredictionsWriter, WriteError> {
        let target = isorun_tensors::output::model_file(dir, &meta.model, format.extension())
            .map_err(|e| WriteError { path: dir.join(&meta.model), reason: e.to_string() })?;
        let temporary = temporary_of(&target);
        let file = create_new(&temporary).map_err(|e| WriteError { path: temporary.clone(), reason: e.to_string() })?;
        let sink = match format {
            PredictionsFormat::Parquet => Sink::Pending(file),
            PredictionsFormat::Jsonl => Sink::Jsonl(BufWriter::with_capacity(1 << 20, file)),
        };
        Ok(PredictionsWriter { target, temporary, format, sink, meta, all, schema: None, line: String::new() })
    }

    /// Where the file goes once finished.
    pub fn target(&self) -> &Path {
        &self.target
    }

    fn error(&self, reason: impl Into<String>) -> WriteError {
        WriteError { path: self.target.clone(), reason: reason.into() }
    }

    /// Appends one batch: its targets and the worker's outputs for it.
    pub fn append(&mut self, targets: &Targets, outputs: &[(String, Tensor)]) -> Result<(), WriteError> {
        let chosen: Vec<&(String, Tensor)> = if self.all {
            outputs.iter().collect()
        } else {
            outputs.iter().filter(|(name, _)| *name == self.meta.output).collect()
        };
        let rows = targets.rows;
        if self.meta.label_kind.is_none() {
            self.meta.label_kind = Some(label_kind(&targets.labels));
            self.meta.first_batch_rows = rows as u64;
            self.meta.outputs = chosen
                .iter()
                .map(|(name, tensor)| SavedOutput {
                    name: name.clone(),
                    dtype: tensor.dtype,
                    row_shape: tensor.shape.get(1..).unwrap_or_default().to_vec(),
                })
                .collect();
        } else if Some(label_kind(&targets.labels)) != self.meta.label_kind {
            return Err(self.error(format!(
                "the labels of the batch at example {} are {}, earlier ones {}",
                targets.first_index,
                label_kind(&targets.labels),
                self.meta.label_kind.as_deref().unwrap_or("?")
            )));
        }
        if chosen.len() != self.meta.outputs.len() {
            return Err(self.error(format!(
                "a batch has {} outputs, the first had {}",
                chosen.len(),
                self.meta.outputs.len()
            )));
        }
        for ((name, tensor), saved) in chosen.iter().zip(&self.meta.outputs) {
            if *name != saved.name || tensor.dtype != saved.dtype || tensor.shape.get(1..) != Some(&saved.row_shape[..])
            {
                return Err(self.error(format!(
                    "output '{name}' is {} {:?} in the batch at example {}; the first batch had '{}' {} [N, {:?}]",
                    tensor.dtype, tensor.shape, targets.first_index, saved.name, saved.dtype, saved.row_shape
                )));
            }
            if tensor.shape.first() != Some(&(rows as u64)) {
                return Err(
                    self.error(format!("output '{name}' has {:?} rows, the batch {rows}", tensor.shape.first()))
                );
            }
        }
        self.meta.examples += rows as u64;
        match self.format {
            PredictionsFormat::Parquet => self.append_parquet(targets, &chosen),
            PredictionsFormat::Jsonl => self.append_jsonl(targets, &chosen),
        }
    }

    fn append_parquet(&mut self, targets: &Targets, outputs: &[&(String, Tensor)]) -> Result<(), WriteError> {
        let rows = targets.rows;
        let mut fields = Vec::new();
        let mut columns: Vec<ArrayRef> = Vec::new();
        fields.push(Field::new(INDEX, DataType::UInt64, false));
        columns.push(Arc::new(UInt64Array::from_iter_values((0..rows as u64).map(|r| targets.first_index + r))));
        if let Some(keys) = &targets.keys {
            fields.push(Field::new(KEY, DataType::Utf8, false));
            columns.push(Arc::new(StringArray::from_iter_values(keys.iter())));
        }
        let label: ArrayRef = match &targets.labels {
            Labels::Int(v) => Arc::new(Int64Array::from(v.clone())),
            Labels::Float(v) => Arc::new(Float64Array::from(v.clone())),
            Labels::Matrix { columns, values } => list(Arc::new(Float64Array::from(values.clone())), *columns, rows),
        };
        fields.push(Field::new(LABEL, label.data_type().clone(), false));
        columns.push(label);
        if let Some(weights) = &targets.weights {
            fields.push(Field::new(WEIGHT, DataType::Float64, false));
            columns.push(Arc::new(Float64Array::from(weights.clone())));
        }
        for (name, values) in &targets.slices {
            fields.push(Field::new(slice_column(name), DataType::Utf8, false));
            columns.push(Arc::new(StringArray::from_iter_values(values.iter())));
        }
        for ((name, tensor), saved) in outputs.iter().zip(&self.meta.outputs) {
            let values = elements(tensor).map_err(|reason| self.error(format!("output '{name}': {reason}")))?;
            let array = if saved.scalar() { values } else { list(values, saved.width(), rows) };
            fields.push(Field::new(output_column(name), array.data_type().clone(), false));
            columns.push(array);
        }
        let schema = match &self.schema {
            Some(schema) => Arc::clone(schema),
            None => {
                let schema = Arc::new(Schema::new(fields));
                self.schema = Some(Arc::clone(&schema));
                schema
            }
        };
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns)
            .map_err(|e| self.error(format!("the batch at example {}: {e}", targets.first_index)))?;
        if let Sink::Pending(_) = self.sink {
            let Sink::Pending(file) = std::mem::replace(&mut self.sink, Sink::Done) else { unreachable!() };
            // Dictionaries pay for strings (slices, a few values each), not
            // for scores, whose values are nearly all distinct: trying one
            // per float column cost more than everything else the writer does.
            let mut properties = WriterProperties::builder()
                .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
                .set_compression(Compression::SNAPPY)
                .set_dictionary_enabled(false);
            for field in schema.fields() {
                if field.name().starts_with("slice:") {
                    properties =
                        properties.set_column_dictionary_enabled(ColumnPath::from(field.name().as_str()), true);
                }
            }
            let properties = properties.build();
            let writer = ArrowWriter::try_new(file, schema, Some(properties)).map_err(|e| self.error(e.to_string()))?;
            self.sink = Sink::Parquet(Box::new(writer));
        }
        match &mut self.sink {
            Sink::Parquet(writer) => {
                writer.write(&batch).map_err(|e| WriteError { path: self.temporary.clone(), reason: e.to_string() })
            }
            _ => Err(self.error("written after its end")),
        }
    }

    fn append_jsonl(&mut self, targets: &Targets, outputs: &[&(String, Tensor)]) -> Result<(), WriteError> {
        use std::fmt::Write as _;
        let quoted = |s: &str| serde_json::Value::from(s).to_string();
        let mut decoded = Vec::with_capacity(outputs.len());
        for (name, tensor) in outputs {
            decoded.push(json_elements(tensor).map_err(|reason| self.error(format!("output '{name}': {reason}")))?);
        }
        let names: Vec<String> = outputs.iter().map(|(name, _)| quoted(&output_column(name))).collect();
        let slice_names: Vec<String> = targets.slices.iter().map(|(name, _)| quoted(&slice_column(name))).collect();
        let Sink::Jsonl(out) = &mut self.sink else { return Err(self.error("written after its end")) };
        let line = &mut self.line;
        for r in 0..targets.rows {
            line.clear();
            let _ = write!(line, "{{\"index\":{}", targets.first_index + r as u64);
            if let Some(keys) = &targets.keys {
                let _ = write!(line, ",\"key\":{}", quoted(&keys[r]));
            }
            match &targets.labels {
                Labels::Int(v) => {
                    let _ = write!(line, ",\"label\":{}", v[r]);
                }
                Labels::Float(v) => {
                    let _ = write!(line, ",\"label\":{}", json_f64(v[r]));
                }
                Labels::Matrix { columns, values } => {
                    let row: Vec<String> =
                        values[r * columns..(r + 1) * columns].iter().map(|v| json_f64(*v)).collect();
                    let _ = write!(line, ",\"label\":[{}]", row.join(","));
                }
            }
            if let Some(weights) = &targets.weights {
                let _ = write!(line, ",\"weight\":{}", json_f64(weights[r]));
            }
            for (name, (_, values)) in slice_names.iter().zip(&targets.slices) {
                let _ = write!(line, ",{name}:{}", quoted(&values[r]));
            }
            for ((name, values), saved) in names.iter().zip(&decoded).zip(&self.meta.outputs) {
                let width = saved.width();
                let row = &values[r * width..(r + 1) * width];
                if saved.scalar() {
                    let _ = write!(line, ",{name}:{}", row[0]);
                } else {
                    let _ = write!(line, ",{name}:[{}]", row.join(","));
                }
            }
            line.push_str("}\n");
            out.write_all(line.as_bytes())
                .map_err(|e| WriteError { path: self.temporary.clone(), reason: e.to_string() })?;
        }
        Ok(())
    }

    /// Closes the file with its metadata (the task eval decided, the
    /// corrupt records skipped) and renames it into place; the path written.
    pub fn finish(mut self, task: Option<String>, skipped_corrupt: u64) -> Result<PathBuf, WriteError> {
        self.meta.task = task;
        self.meta.skipped_corrupt = skipped_corrupt;
        let meta = self.meta.to_json().to_string();
        let sink = std::mem::replace(&mut self.sink, Sink::Done);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |e: std::io::Error| WriteError { path: path.clone(), reason: e.to_string() }
        };
        match sink {
            Sink::Pending(file) => {
                // No batch came: a file of no rows with the columns known.
                let schema = Arc::new(Schema::new(vec![Field::new(INDEX, DataType::UInt64, false)]));
                let mut writer = ArrowWriter::try_new(file, schema, None).map_err(|e| self.error(e.to_string()))?;
                writer.append_key_value_metadata(KeyValue::new(META_KEY.into(), meta));
                let file = writer.into_inner().map_err(|e| self.error(e.to_string()))?;
                file.sync_all().map_err(io(&self.temporary))?;
            }
            Sink::Parquet(mut writer) => {
                writer.append_key_value_metadata(KeyValue::new(META_KEY.into(), meta));
                let file = writer.into_inner().map_err(|e| self.error(e.to_string()))?;
                file.sync_all().map_err(io(&self.temporary))?;
            }
            Sink::Jsonl(mut out) => {
                out.flush().map_err(io(&self.temporary))?;
                out.into_inner().map_err(|e| self.error(e.to_string()))?.sync_all().map_err(io(&self.temporary))?;
                // The sidecar first: a `.jsonl` in place always has its description.
                let side = sidecar(&self.target);
                let side_tmp = temporary_of(&side);
                let mut file = create_new(&side_tmp).map_err(io(&side_tmp))?;
                let written = file
                    .write_all(serde_json::json!({ META_KEY: self.meta.to_json() }).to_string().as_bytes())
                    .and_then(|_| file.sync_all())
                    .and_then(|_| std::fs::rename(&side_tmp, &side));
                if let Err(e) = written {
                    let _ = std::fs::remove_file(&side_tmp);
                    return Err(io(&side)(e));
                }
            }
            Sink::Done => return Err(self.error("finished twice")),
        }
        std::fs::rename(&self.temporary, &self.target).map_err(io(&self.target))?;
        Ok(self.target.clone())
    }
}

impl Drop for PredictionsWriter {
    fn drop(&mut self) {
        // Finished: renamed away already, and this is a no-op.
        let _ = std::fs::remove_file(&self.temporary);
    }
}

/// Rows of `width` values each, as a list column.
fn list(values: ArrayRef, width: usize, rows: usize) -> ArrayRef {
    let field = Arc::new(Field::new_list_field(values.data_type().clone(), false));
    Arc::new(ListArray::new(field, OffsetBuffer::from_repeated_length(width, rows), values, None))
}

fn chunks<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    bytes.chunks_exact(N).map(|c| c.try_into().expect("N bytes"))
}

/// A dense tensor's elements as one flat Arrow array (bfloat16 as float32).
fn elements(tensor: &Tensor) -> Result<ArrayRef, String> {
    let bytes: &[u8] = match &tensor.data {
        TensorData::Dense(bytes) => bytes,
        TensorData::Strings(strings) => {
            return Ok(Arc::new(BinaryArray::from_iter_values(strings.iter().map(|s| s.as_slice()))))
        }
        TensorData::Shared(_) => return Err("is not in memory".into()),
    };
    Ok(match tensor.dtype {
        DType::Float32 => Arc::new(Float32Array::from_iter_values(chunks(bytes).map(f32::from_le_bytes))),
        DType::Float64 => Arc::new(Float64Array::from_iter_values(chunks(bytes).map(f64::from_le_bytes))),
        DType::Float16 => Arc::new(Float16Array::from_iter_values(chunks(bytes).map(half::f16::from_le_bytes))),
        DType::BFloat16 => {
            Arc::new(Float32Array::from_iter_values(chunks(bytes).map(|c| half::bf16::from_le_bytes(c).to_f32())))
        }
        DType::Int8 => Arc::new(Int8Array::from_iter_values(chunks(bytes).map(i8::from_le_bytes))),
        DType::Int16 => Arc::new(Int16Array::from_iter_values(chunks(bytes).map(i16::from_le_bytes))),
        DType::Int32 => Arc::new(Int32Array::from_iter_values(chunks(bytes).map(i32::from_le_bytes))),
        DType::Int64 => Arc::new(Int64Array::from_iter_values(chunks(bytes).map(i64::from_le_bytes))),
        DType::UInt8 => Arc::new(UInt8Array::from_iter_values(bytes.iter().copied())),
        DType::UInt16 => Arc::new(UInt16Array::from_iter_values(chunks(bytes).map(u16::from_le_bytes))),
        DType::UInt32 => Arc::new(UInt32Array::from_iter_values(chunks(bytes).map(u32::from_le_bytes))),
        DType::UInt64 => Arc::new(UInt64Array::from_iter_values(chunks(bytes).map(u64::from_le_bytes))),
        DType::Bool => Arc::new(BooleanArray::from(bytes.iter().map(|b| *b != 0).collect::<Vec<_>>())),
        DType::String => return Err("holds strings but is not a string tensor".into()),
    })
}

/// A float as JSON: the shortest text that reads back to the same value;
/// `null` for a non-finite one (JSON has none).
fn json_f64(v: f64) -> String {
    if v.is_finite() {
        format!("{v:?}")
    } else {
        "null".into()
    }
}

fn json_f32(v: f32) -> String {
    if v.is_finite() {
        format!("{v:?}")
    } else {
        "null".into()
    }
}

/// A tensor's elements as JSON texts (strings as UTF-8, lossily).
fn json_elements(tensor: &Tensor) -> Result<Vec<String>, String> {
    let bytes: &[u8] = match &tensor.data {
        TensorData::Dense(bytes) => bytes,
        TensorData::Strings(strings) => {
            return Ok(strings
                .iter()
                .map(|s| serde_json::Value::from(String::from_utf8_lossy(s).into_owned()).to_string())
                .collect())
        }
        TensorData::Shared(_) => return Err("is not in memory".into()),
    };
    Ok(match tensor.dtype {
        DType::Float32 => chunks(bytes).map(|c| json_f32(f32::from_le_bytes(c))).collect(),
        DType::Float64 => chunks(bytes).map(|c| json_f64(f64::from_le_bytes(c))).collect(),
        DType::Float16 => chunks(bytes).map(|c| json_f32(half::f16::from_le_bytes(c).to_f32())).collect(),
        DType::BFloat16 => chunks(bytes).map(|c| json_f32(half::bf16::from_le_bytes(c).to_f32())).collect(),
        DType::Int8 => chunks(bytes).map(|c| i8::from_le_bytes(c).to_string()).collect(),
        DType::Int16 => chunks(bytes).map(|c| i16::from_le_bytes(c).to_string()).collect(),
        DType::Int32 => chunks(bytes).map(|c| i32::from_le_bytes(c).to_string()).collect(),
        DType::Int64 => chunks(bytes).map(|c| i64::from_le_bytes(c).to_string()).collect(),
        DType::UInt8 => bytes.iter().map(|b| b.to_string()).collect(),
        DType::UInt16 => chunks(bytes).map(|c| u16::from_le_bytes(c).to_string()).collect(),
        DType::UInt32 => chunks(bytes).map(|c| u32::from_le_bytes(c).to_string()).collect(),
        DType::UInt64 => chunks(bytes).map(|c| u64::from_le_bytes(c).to_string()).collect(),
        DType::Bool => bytes.iter().map(|b| (*b != 0).to_string()).collect(),
        DType::String => return Err("holds strings but is not a string tensor".into()),
    })
}

/// The changed examples of `rescore --diff --output-changed`, as Parquet:
/// `model`, `index`, `key` (null without keys), `label`,
/// `baseline_class`/`class` (null for regression), `baseline_score`/`score`,
/// `change` (`fixed`, `broke`, `changed`). Written in batches under a
/// temporary name, renamed into place by [`ChangedWriter::finish`].
pub struct ChangedWriter {
    target: PathBuf,
    temporary: PathBuf,
    writer: Option<ArrowWriter<File>>,
    schema: SchemaRef,
    rows: Vec<(String, super::diff::Changed)>,
}

impl ChangedWriter {
    pub fn create(target: &Path) -> Result<ChangedWriter, WriteError> {
        let temporary = temporary_of(target);
        let error = |e: &dyn std::fmt::Display| WriteError { path: target.to_path_buf(), reason: e.to_string() };
        let file = create_new(&temporary).map_err(|e| error(&e))?;
        let schema = Arc::new(Schema::new(vec![
            Field::new("model", DataType::Utf8, false),
            Field::new(INDEX, DataType::UInt64, false),
            Field::new(KEY, DataType::Utf8, true),
            Field::new(LABEL, DataType::Float64, false),
            Field::new("baseline_class", DataType::Int64, true),
            Field::new("class", DataType::Int64, true),
            Field::new("baseline_score", DataType::Float64, false),
            Field::new("score", DataType::Float64, false),
            Field::new("change", DataType::Utf8, false),
        ]));
        let properties = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        let writer = ArrowWriter::try_new(file, Arc::clone(&schema), Some(properties)).map_err(|e| error(&e))?;
        Ok(ChangedWriter { target: target.to_path_buf(), temporary, writer: Some(writer), schema, rows: Vec::new() })
    }

    pub fn push(&mut self, model: &str, changed: &super::diff::Changed) -> Result<(), WriteError> {
        self.rows.push((model.to_string(), changed.clone()));
        if self.rows.len() >= 8192 {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), WriteError> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let rows = std::mem::take(&mut self.rows);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(rows.iter().map(|(m, _)| m.as_str()))),
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|(_, c)| c.index))),
            Arc::new(StringArray::from(rows.iter().map(|(_, c)| c.key.clone()).collect::<Vec<_>>())),
            Arc::new(Float64Array::from_iter_values(rows.iter().map(|(_, c)| c.label))),
            Arc::new(Int64Array::from(rows.iter().map(|(_, c)| c.baseline.class).collect::<Vec<_>>())),
            Arc::new(Int64Array::from(rows.iter().map(|(_, c)| c.new.class).collect::<Vec<_>>())),
            Arc::new(Float64Array::from_iter_values(rows.iter().map(|(_, c)| c.baseline.score))),
            Arc::new(Float64Array::from_iter_values(rows.iter().map(|(_, c)| c.new.score))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|(_, c)| c.kind))),
        ];
        let error = |e: &dyn std::fmt::Display| WriteError { path: self.target.clone(), reason: e.to_string() };
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns).map_err(|e| error(&e))?;
        self.writer.as_mut().ok_or_else(|| error(&"finished"))?.write(&batch).map_err(|e| error(&e))
    }

    /// Closes the file and renames it into place.
    pub fn finish(mut self) -> Result<PathBuf, WriteError> {
        self.flush()?;
        let error = |e: &dyn std::fmt::Display| WriteError { path: self.target.clone(), reason: e.to_string() };
        let writer = self.writer.take().ok_or_else(|| error(&"finished twice"))?;
        let file = writer.into_inner().map_err(|e| error(&e))?;
        file.sync_all().map_err(|e| error(&e))?;
        std::fs::rename(&self.temporary, &self.target).map_err(|e| error(&e))?;
        Ok(self.target.clone())
    }
}

impl Drop for ChangedWriter {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.temporary);
    }
}

/// One batch on its way to the writer's thread (boxed: a small message).
type Job = Box<(Targets, Vec<(String, Tensor)>)>;

/// A [`PredictionsWriter`] on a thread of its own, so that encoding a batch
/// overlaps the worker's next one instead of delaying it: batches are moved
/// (not copied) into a channel of [`BACKGROUND_BATCHES`], so at most that
/// many wait. The first error stops the thread; the next `append` or
/// `finish` returns it. Dropped unfinished, it ends the thread, whose
/// writer removes its temporary file.
pub struct BackgroundWriter {
    sender: Option<std::sync::mpsc::SyncSender<Job>>,
    thread: Option<std::thread::JoinHandle<Result<PredictionsWriter, WriteError>>>,
    target: PathBuf,
    output: String,
    all: bool,
}

/// Batches that may wait for the writer's thread.
pub const BACKGROUND_BATCHES: usize = 2;

impl BackgroundWriter {
    pub fn start(writer: PredictionsWriter) -> BackgroundWriter {
        let (sender, receiver) = std::sync::mpsc::sync_channel::<Job>(BACKGROUND_BATCHES);
        let target = writer.target.clone();
        let output = writer.meta.output.clone();
        let all = writer.all;
        let thread = std::thread::Builder::new()
            .name("predictions".into())
            .spawn(move || {
                let mut writer = writer;
                for job in receiver {
                    let (targets, outputs) = *job;
                    writer.append(&targets, &outputs)?;
                }
                Ok(writer)
            })
            .expect("spawn the predictions thread");
        BackgroundWriter { sender: Some(sender), thread: Some(thread), target, output, all }
    }

    /// Where the file goes once finished.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Hands one batch to the thread (only the scored output unless every
    /// output is saved).
    pub fn append(&mut self, targets: Targets, mut outputs: Vec<(String, Tensor)>) -> Result<(), WriteError> {
        if !self.all {
            outputs.retain(|(name, _)| *name == self.output);
        }
        let sent = self.sender.as_ref().map(|s| s.send(Box::new((targets, outputs))));
        match sent {
            Some(Ok(())) => Ok(()),
            // The thread stopped at an error: that error.
            _ => match self.join() {
                Err(e) => Err(e),
                Ok(_) => Err(WriteError { path: self.target.clone(), reason: "the writer's thread ended".into() }),
            },
        }
    }

    fn join(&mut self) -> Result<PredictionsWriter, WriteError> {
        self.sender = None;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => {
                Err(WriteError { path: self.target.clone(), reason: "the writer's thread panicked".into() })
            }
            None => Err(WriteError { path: self.target.clone(), reason: "the writer's thread ended".into() }),
        }
    }

    /// Waits for every batch, then [`PredictionsWriter::finish`].
    pub fn finish(mut self, task: Option<String>, skipped_corrupt: u64) -> Result<PathBuf, WriteError> {
        self.join()?.finish(task, skipped_corrupt)
    }
}

impl Drop for BackgroundWriter {
    fn drop(&mut self) {
        let _ = self.join();
    }
}
