//! Arrow IPC files and streams (`.arrow`, `.feather`, `.ipc`) as columns:
//! what Hugging Face `datasets` writes in its cache and with
//! `save_to_disk` (the IPC *stream* format), and what pyarrow's
//! `feather`/`ipc.new_file` write (the IPC *file* format). This module also
//! holds the conversion of Arrow arrays into column chunks, which the
//! Parquet source (read through Arrow) shares.
//!
//! Decisions:
//! - Types: int8..int64, uint8..uint64, float16/32/64 and bool columns
//!   feed numbers (converted to the signature's dtype by the same path as
//!   `.npz` arrays); utf8, large utf8, binary, large binary (and their view
//!   types) feed string tensors; a dictionary-encoded column is read as its
//!   values. A fixed-size list of `k` feeds `[N, k]`; a list (or large list)
//!   whose lists have the same length in every row of a piece feeds
//!   `[N, k]` too (unequal lengths: an error naming the column and the
//!   row); lists of lists `[N, k, m]`. Other types (structs, maps, dates)
//!   are refused when a run asks for the column.
//! - Nulls are refused (an error naming the column and the row): a model
//!   cannot be fed a missing value, and no value is invented for it.
//! - A list column's per-example dims are shown (before reading) as its
//!   first row's.
//! - Untrusted input: the message framing is walked once before a reader
//!   is made (a first pass that reads only message headers, never bodies),
//!   checking that every claimed metadata and body length lies within the
//!   file, so no claimed size makes an allocation larger than the file; it
//!   also counts the rows, and reads the decompressed length each
//!   compressed buffer (lz4, zstd: what pandas' `to_feather()` writes)
//!   states, refusing a record batch that claims more than [`piece_limit`](super::arrow_compressed::piece_limit)
//!   before arrow-ipc allocates it (`arrow_compressed`). A panic in the
//!   Arrow crates is the file's [`DataError::Reader`]. What a file's rows make is not bounded by the
//!   file (every row may repeat a dictionary's one large value), so a
//!   conversion counts each row's bytes before it copies them ([`Budget`])
//!   against [`piece_limit`](super::arrow_compressed::piece_limit), and a piece gathers all of a batch's rows
//!   from the file (across record batches), so one count covers the batch:
//!   past it, an error naming the column and row.
//! - Parts: part `K` of `N` is the rows `[K*n/N, (K+1)*n/N)` of the file's
//!   `n` (counted by the first pass); batches before the part are read and
//!   dropped without being converted.

use super::arrow_compressed::{piece_limit, Claims, PIECE_FACTOR, PIECE_FLOOR};
use super::{ColumnChunk, ColumnInfo, Compression, Look, Options, Piece, Source, Values};
use crate::batch::{MAX_BATCH_BYTES, PREALLOCATE_BYTES};
use crate::error::DataError;
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, OffsetSizeTrait, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field, Schema};
use isorun_protocol::DType;
use isorun_tensors::npy::Element;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The most bytes one IPC message's metadata (flatbuffer) may claim.
const MAX_METADATA: u64 = 64 << 20;

/// The magic of the IPC file format (the stream format has none).
const FILE_MAGIC: &[u8; 6] = b"ARROW1";

/// Where a column is, for its errors: `file: column 'x'`.
pub(crate) fn column_path(path: &Path, name: &str) -> PathBuf {
    PathBuf::from(format!("{}: column '{name}'", path.display()))
}

/// Runs `f`, a panic in it (the Arrow and Parquet crates can panic on a
/// corrupt file) being the file's [`DataError::Reader`].
pub(crate) fn contained<T>(path: &Path, f: impl FnOnce() -> Result<T, DataError>) -> Result<T, DataError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let text = match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
            (Some(text), _) => (*text).to_string(),
            (_, Some(text)) => text.clone(),
            _ => "a panic".into(),
        };
        Err(DataError::Reader { path: path.to_path_buf(), reason: format!("panicked: {text}") })
    })
}

/// The element a column's values have, and how it is described, from its type.
fn element_of(data_type: &DataType) -> Option<Element> {
    Some(match data_type {
        DataType::Boolean => Element::Dense(DType::Bool, false),
        DataType::Int8 => Element::Dense(DType::Int8, false),
        DataType::Int16 => Element::Dense(DType::Int16, false),
        DataType::Int32 => Element::Dense(DType::Int32, false),
        DataType::Int64 => Element::Dense(DType::Int64, false),
        DataType::UInt8 => Element::Dense(DType::UInt8, false),
        DataType::UInt16 => Element::Dense(DType::UInt16, false),
        DataType::UInt32 => Element::Dense(DType::UInt32, false),
        DataType::UInt64 => Element::Dense(DType::UInt64, false),
        DataType::Float16 => Element::Dense(DType::Float16, false),
        DataType::Float32 => Element::Dense(DType::Float32, false),
        DataType::Float64 => Element::Dense(DType::Float64, false),
        // Strings are handed as strings; the element only sizes and describes them.
        DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView => Element::Bytes(0),
        DataType::Dictionary(_, value) => return element_of(value),
        DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f) => return element_of(f.data_type()),
        _ => return None,
    })
}

/// Whether a column's value is a list of variable length (its dims known only from rows).
fn has_variable_list(data_type: &DataType) -> bool {
    match data_type {
        DataType::List(_) | DataType::LargeList(_) => true,
        DataType::FixedSizeList(f, _) => has_variable_list(f.data_type()),
        _ => false,
    }
}

/// The dims a type fixes (fixed-size lists), with `None` for variable lists.
fn type_dims(data_type: &DataType) -> Vec<Option<u64>> {
    match data_type {
        DataType::FixedSizeList(f, k) => std::iter::once(Some(*k as u64)).chain(type_dims(f.data_type())).collect(),
        DataType::List(f) | DataType::LargeList(f) => std::iter::once(None).chain(type_dims(f.data_type())).collect(),
        _ => Vec::new(),
    }
}

/// One column as it shows before its rows are read; `first` is the
/// column's first row (needed for a variable list's dims), if read.
pub(crate) fn column_info(path: &Path, field: &Field, first: Option<&ArrayRef>) -> ColumnInfo {
    let data_type = field.data_type();
    let name = field.name().clone();
    let mut dims: Vec<u64> = first
        .and_then(|a| convert(a, 0, &mut Budget::new(MAX_BATCH_BYTES, None), &name, path).ok())
        .map(|(dims, _)| dims)
        .unwrap_or_else(|| type_dims(data_type).into_iter().map(|d| d.unwrap_or(1)).collect());
    let element = element_of(data_type);
    let kind = match element {
        Some(Element::Dense(d, _)) => d.name().to_string(),
        Some(_) => "string".to_string(),
        None => format!("{data_type} (not readable)"),
    };
    if element.is_none() {
        dims.clear();
    }
    let shown: Vec<String> = type_dims(data_type)
        .iter()
        .zip(&dims)
        .map(|(t, d)| t.map_or(format!("list of {d}"), |k| k.to_string()))
        .collect();
    let describe = if shown.is_empty() { kind } else { format!("{kind} [{}]", shown.join(", ")) };
    ColumnInfo {
        name,
        path: column_path(path, field.name()),
        // An unreadable column describes itself and is refused when asked for.
        element: element.unwrap_or(Element::Bytes(0)),
        dims,
        describe,
    }
}

/// The indices (in `schema`) of the columns whose dims need a first row.
pub(crate) fn variable_columns(schema: &Schema, wanted: impl Fn(&str) -> bool) -> Vec<usize> {
    schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| wanted(f.name()) && has_variable_list(f.data_type()))
        .map(|(i, _)| i)
        .collect()
}

fn unsupported(path: &Path, name: &str, data_type: &DataType) -> DataError {
    DataError::Unsupported {
        path: column_path(path, name),
        reason: format!(
            "type {data_type} cannot be read; columns are numbers (int, uint, float, bool), strings or binary, \
             dictionaries of them, or (fixed-size) lists of them"
        ),
    }
}

/// The bytes a piece's conversion has materialised, counted before each
/// allocation: strings at their bytes and their `Vec`, dictionaries at each
/// row's value (not once per dictionary).
pub(crate) struct Budget {
    used: u64,
    limit: u64,
    /// The file's size, for the message.
    file_len: Option<u64>,
}

impl Budget {
    pub(crate) fn new(limit: u64, file_len: Option<u64>) -> Budget {
        Budget { used: 0, limit, file_len }
    }

    /// Counts `bytes` more for the value of file row `row` of column `name`.
    fn charge(&mut self, bytes: u64, row: u64, name: &str, path: &Path) -> Result<(), DataError> {
        self.used = self.used.saturating_add(bytes);
        if self.used <= self.limit {
            return Ok(());
        }
        let of_file = match self.file_len {
            Some(len) => format!(
                " from this {len}-byte file ({PIECE_FACTOR} times its size, at least {PIECE_FLOOR}, at most \
                 {MAX_BATCH_BYTES})"
            ),
            None => String::new(),
        };
        Err(DataError::Array {
            path: column_path(path, name),
            reason: format!(
                "row {row} (0-based in the file): the values read for this batch, with this row's, come to {} bytes, \
                 more than the {} a batch may take{of_file} (a dictionary's value counts for every row that repeats \
                 it); use a smaller --batch-size",
                self.used, self.limit
            ),
        })
    }
}

/// The first null of `array`, as a row of the column (`per` values per row).
fn null_error(array: &dyn Array, first_row: u64, per: u64, name: &str, path: &Path) -> Option<DataError> {
    let nulls = array.logical_nulls()?;
    let at = (0..array.len()).find(|&i| nulls.is_null(i))?;
    let row = first_row + at as u64 / per.max(1);
    let what = if per > 1 { "a value inside row's list is null" } else { "is null" };
    Some(DataError::Array {
        path: column_path(path, name),
        reason: format!(
            "row {row} (0-based in the file): {what}; null values cannot be fed or scored (fill or drop them first)"
        ),
    })
}

/// The bytes of string (or binary) value `i` of `array`; `None` when it
/// holds no strings.
fn string_at(array: &dyn Array, i: usize) -> Option<&[u8]> {
    Some(match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().value(i).as_bytes(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(i).as_bytes(),
        DataType::Utf8View => array.as_string_view().value(i).as_bytes(),
        DataType::Binary => array.as_binary::<i32>().value(i),
        DataType::LargeBinary => array.as_binary::<i64>().value(i),
        DataType::BinaryView => array.as_binary_view().value(i),
        _ => return None,
    })
}

/// Whether an array of this type holds strings (or binary values).
fn holds_strings(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
    )
}

/// What one string costs as it is held: its bytes and its `Vec`.
const STRING_COST: u64 = std::mem::size_of::<Vec<u8>>() as u64;

/// Where the values of a piece's rows come from, for [`take_values`]: the
/// array itself, or a dictionary's values picked by the rows' keys.
struct Picks<'a> {
    values: &'a dyn Array,
    /// Per row item, the index into `values` (`None`: the item's own).
    keys: Option<Vec<usize>>,
    len: usize,
}

impl Picks<'_> {
    fn index(&self, i: usize) -> usize {
        self.keys.as_ref().map_or(i, |k| k[i])
    }
}

/// The values of `picks` as one piece's items (`per` of them a row, the
/// first in file row `first_row`), each counted before it is copied.
fn take_values(
    picks: &Picks,
    first_row: u64,
    per: u64,
    budget: &mut Budget,
    name: &str,
    path: &Path,
) -> Result<Option<Values>, DataError> {
    let values = picks.values;
    let per = per.max(1);
    if holds_strings(values.data_type()) {
        let mut out = Vec::with_capacity(picks.len.min(PREALLOCATE_BYTES / 24));
        for i in 0..picks.len {
            let bytes = string_at(values, picks.index(i)).unwrap_or_default();
            budget.charge(bytes.len() as u64 + STRING_COST, first_row + i as u64 / per, name, path)?;
            out.push(bytes.to_vec());
        }
        return Ok(Some(Values::Strings(out)));
    }
    let (dtype, item) = match values.data_type() {
        DataType::Boolean => (DType::Bool, 1),
        other => match element_of(other) {
            Some(Element::Dense(dtype, _)) => (dtype, dtype.element_size().expect("dense")),
            _ => return Ok(None),
        },
    };
    // Counted row by row before any is copied, so that the row past the limit is named.
    for row in 0..(picks.len as u64).div_ceil(per) {
        budget.charge(item as u64 * per, first_row + row, name, path)?;
    }
    let element = Element::Dense(dtype, false);
    let mut out = Vec::with_capacity(picks.len * item);
    if dtype == DType::Bool {
        let bools = values.as_boolean();
        out.extend((0..picks.len).map(|i| u8::from(bools.value(picks.index(i)))));
    } else {
        let data = values.to_data();
        let buffer = &data.buffers()[0].as_slice()[data.offset() * item..(data.offset() + data.len()) * item];
        match &picks.keys {
            None => out.extend_from_slice(&buffer[..picks.len * item]),
            Some(keys) => {
                for &k in keys {
                    out.extend_from_slice(&buffer[k * item..(k + 1) * item]);
                }
            }
        }
    }
    Ok(Some(Values::Elements { element, bytes: out }))
}

/// Converts `array` (the values of a column's rows from `first_row`, each
/// row `per` of its items) into one row's dims and the values, counting
/// what it materialises against `budget`.
fn convert_items(
    array: &dyn Array,
    first_row: u64,
    per: u64,
    budget: &mut Budget,
    name: &str,
    path: &Path,
) -> Result<(Vec<u64>, Values), DataError> {
    if let Some(error) = null_error(array, first_row, per, name, path) {
        return Err(error);
    }
    let data_type = array.data_type();
    let picks = match data_type {
        DataType::FixedSizeList(_, k) => {
            let list = array.as_fixed_size_list();
            let k = *k as u64;
            let (inner, values) = convert_items(list.values().as_ref(), first_row, per * k, budget, name, path)?;
            return Ok((std::iter::once(k).chain(inner).collect(), values));
        }
        DataType::List(_) => return convert_list(array.as_list::<i32>(), first_row, per, budget, name, path),
        DataType::LargeList(_) => return convert_list(array.as_list::<i64>(), first_row, per, budget, name, path),
        // A dictionary's values are picked row by row, never converted
        // whole (nor copied whole for each piece).
        DataType::Dictionary(..) => {
            let dictionary = array.as_any_dictionary();
            Picks { values: dictionary.values().as_ref(), keys: Some(dictionary.normalized_keys()), len: array.len() }
        }
        _ => Picks { values: array, keys: None, len: array.len() },
    };
    match take_values(&picks, first_row, per, budget, name, path)? {
        Some(values) => Ok((Vec::new(), values)),
        None => Err(unsupported(path, name, data_type)),
    }
}

/// A list column's items whose lists all have one length.
fn convert_list<O: OffsetSizeTrait>(
    list: &arrow_array::GenericListArray<O>,
    first_row: u64,
    per: u64,
    budget: &mut Budget,
    name: &str,
    path: &Path,
) -> Result<(Vec<u64>, Values), DataError> {
    let offsets = list.value_offsets();
    let lengths = offsets.windows(2).map(|w| (w[1] - w[0]).as_usize() as u64);
    let k = lengths.clone().next().unwrap_or(0);
    if let Some((at, length)) = lengths.enumerate().find(|&(_, l)| l != k) {
        let row = first_row + at as u64 / per.max(1);
        let first = first_row;
        return Err(DataError::Array {
            path: column_path(path, name),
            reason: format!(
                "row {row} (0-based in the file): a list of {length} values, but row {first} has {k}: the lists of \
                 one batch must have one length to make a tensor"
            ),
        });
    }
    let start = offsets.first().map_or(0, |o| o.as_usize());
    let end = offsets.last().map_or(0, |o| o.as_usize());
    let child = list.values().slice(start, end - start);
    let (inner, values) = convert_items(child.as_ref(), first_row, per * k.max(1), budget, name, path)?;
    Ok((std::iter::once(k).chain(inner).collect(), values))
}

/// Converts a column's rows `[first_row, first_row + array.len())` into a
/// chunk's dims and values, counting what it materialises against `budget`.
pub(crate) fn convert(
    array: &ArrayRef,
    first_row: u64,
    budget: &mut Budget,
    name: &str,
    path: &Path,
) -> Result<(Vec<u64>, Values), DataError> {
    if element_of(array.data_type()).is_none() {
        return Err(unsupported(path, name, array.data_type()));
    }
    convert_items(array.as_ref(), first_row, 1, budget, name, path)
}

/// The column indices (in `schema`) of the asked-for columns, in the asked
/// order; a missing one names what the file has.
pub(crate) fn find_columns(path: &Path, schema: &Schema, asked: &[String]) -> Result<Vec<usize>, DataError> {
    asked
        .iter()
        .map(|name| {
            schema.index_of(name).map_err(|_| DataError::MissingInput {
                path: path.to_path_buf(),
                input: name.clone(),
                feature: name.clone(),
                available: schema.fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>().join(", "),
            })
        })
        .collect()
}

/// Record batches as a reader hands them.
pub(crate) type Batches = Box<dyn Iterator<Item = Result<RecordBatch, DataError>> + Send>;

/// Batches in, pieces out: the part of a Source that Arrow and Parquet share.
pub(crate) struct BatchPieces {
    pub path: PathBuf,
    pub batches: Batches,
    pub columns: Vec<ColumnInfo>,
    /// For each asked column, its index in the batches.
    pub indices: Vec<usize>,
    /// The batch being handed, and the next row in it to hand.
    pub current: Option<(RecordBatch, usize)>,
    /// The file row of the current batch's first row.
    pub batch_row: u64,
    /// Rows to drop before the part, and rows of the part still to hand.
    pub skip: u64,
    pub remaining: u64,
    /// The file's size, which bounds what a piece may materialise ([`piece_limit`](super::arrow_compressed::piece_limit)).
    pub file_len: u64,
}

impl BatchPieces {
    /// The next piece: up to `max_rows` rows, gathered across the file's
    /// record batches, so that a piece is all of a batch's rows from this
    /// file and one [`Budget`] counts all they materialise.
    fn next(&mut self, max_rows: usize) -> Result<Option<Piece<'_>>, DataError> {
        let mut budget = Budget::new(piece_limit(self.file_len), Some(self.file_len));
        let mut rows = 0usize;
        let mut gathered: Vec<ColumnChunk> = Vec::new();
        while rows < max_rows && self.remaining > 0 {
            if let Some((batch, at)) = &mut self.current {
                let left = batch.num_rows() - *at;
                if left > 0 {
                    let take = left.min(max_rows - rows).min(self.remaining as usize);
                    let first_row = self.batch_row + *at as u64;
                    for (column, (&index, info)) in self.indices.iter().zip(&self.columns).enumerate() {
                        let array = batch.column(index).slice(*at, take);
                        let (dims, values) = convert(&array, first_row, &mut budget, &info.name, &self.path)?;
                        match gathered.get_mut(column) {
                            None => gathered.push(ColumnChunk { path: info.path.clone(), dims, values }),
                            Some(chunk) => append(chunk, dims, values, first_row)?,
                        }
                    }
                    *at += take;
                    rows += take;
                    self.remaining -= take as u64;
                    continue;
                }
                self.batch_row += batch.num_rows() as u64;
                self.current = None;
            }
            let Some(batch) = self.batches.next().transpose()? else {
                return Err(DataError::Reader {
                    path: self.path.clone(),
                    reason: format!("the file ended {} rows before the rows it claims", self.skip + self.remaining),
                });
            };
            let batch_rows = batch.num_rows() as u64;
            if self.skip >= batch_rows {
                // Before the part: dropped without converting.
                self.skip -= batch_rows;
                self.batch_row += batch_rows;
                continue;
            }
            let at = self.skip as usize;
            self.skip = 0;
            self.current = Some((batch, at));
        }
        Ok((rows > 0).then_some(Piece::Columns { rows, columns: gathered }))
    }
}

/// Appends a later record batch's values of a column (from file row
/// `first_row`) to the piece's chunk: one shape, one element type.
fn append(chunk: &mut ColumnChunk, dims: Vec<u64>, values: Values, first_row: u64) -> Result<(), DataError> {
    if dims != chunk.dims {
        return Err(DataError::Array {
            path: chunk.path.clone(),
            reason: format!(
                "row {first_row} (0-based in the file): a value of shape {dims:?}, but the rows before it in this \
                 batch have {:?}: the rows of one batch must have one shape to make a tensor",
                chunk.dims
            ),
        });
    }
    match (&mut chunk.values, values) {
        (Values::Strings(all), Values::Strings(more)) => all.extend(more),
        (Values::Elements { element, bytes }, Values::Elements { element: more_element, bytes: more })
            if *element == more_element =>
        {
            bytes.extend_from_slice(&more)
        }
        _ => {
            return Err(DataError::Array {
                path: chunk.path.clone(),
                reason: format!("row {first_row} (0-based in the file): its record batch changes the column's type"),
            })
        }
    }
    Ok(())
}

/// An Arrow (or Parquet) file's asked-for columns, read a batch at a time.
pub(crate) struct BatchSource(pub BatchPieces);

impl Source for BatchSource {
    fn columns(&self) -> &[ColumnInfo] {
        &self.0.columns
    }

    /// A panic here (the Arrow crates can panic on a corrupt file) is
    /// caught by the batching, as the file's error.
    fn next_piece(&mut self, max_rows: usize) -> Result<Option<Piece<'_>>, DataError> {
        self.0.next(max_rows)
    }
}

// ---- The IPC format ----

/// What the first pass found: the format, and the rows of each record batch.
struct Framing {
    file_format: bool,
    batch_rows: Vec<u64>,
    file_len: u64,
}

fn corrupt(path: &Path, offset: u64, reason: impl std::fmt::Display) -> DataError {
    DataError::Array {
        path: path.to_path_buf(),
        reason: format!("not a valid Arrow IPC file or stream at byte offset {offset}: {reason}"),
    }
}

fn arrow_error(path: &Path) -> impl Fn(ArrowError) -> DataError + '_ {
    move |e| DataError::Array { path: path.to_path_buf(), reason: format!("cannot read it as Arrow IPC: {e}") }
}

/// One message's header at `at` (before `end`): `None` for the
/// end-of-stream marker, else where its body ends and, for a record batch,
/// its rows. Every claimed length is checked against `end`, and what its
/// compressed buffers claim against `claims`.
fn message_at(
    reader: &mut BufReader<File>,
    path: &Path,
    at: u64,
    end: u64,
    buf: &mut Vec<u8>,
    claims: &mut Claims,
) -> Result<Option<(u64, Option<u64>)>, DataError> {
    reader.seek(SeekFrom::Start(at)).map_err(super::io_error(path))?;
    let mut word = [0u8; 4];
    let truncated = || corrupt(path, at, "ends inside a message header (truncated?)");
    reader.read_exact(&mut word).map_err(|_| truncated())?;
    let mut header = 4;
    if word == [0xff; 4] {
        reader.read_exact(&mut word).map_err(|_| truncated())?;
        header = 8;
    }
    let meta = u64::from(u32::from_le_bytes(word));
    if meta == 0 {
        return Ok(None);
    }
    if meta > MAX_METADATA || at + header + meta > end {
        return Err(corrupt(path, at, format!("a message claims {meta} bytes of metadata, past the end (truncated?)")));
    }
    buf.resize(meta as usize, 0);
    reader.read_exact(buf).map_err(|_| corrupt(path, at, "ends inside a message (truncated?)"))?;
    let message = arrow_ipc::root_as_message(buf).map_err(|e| corrupt(path, at, e))?;
    let body = u64::try_from(message.bodyLength()).map_err(|_| corrupt(path, at, "a negative body length"))?;
    let next = at + header + meta;
    if body > end - next {
        return Err(corrupt(
            path,
            at,
            format!("a message claims a body of {body} bytes, but {} are left (truncated?)", end - next),
        ));
    }
    claims.check(reader, path, at, next, body, &message)?;
    let rows = match message.header_as_record_batch() {
        Some(batch) => Some(u64::try_from(batch.length()).map_err(|_| corrupt(path, at, "a negative row count"))?),
        None => None,
    };
    Ok(Some((next + body, rows)))
}

/// Walks the message framing (headers only, never bodies), checking every
/// claimed length against the file; the rows of each record batch. A file
/// is walked by its footer's blocks, a stream message by message.
fn walk(path: &Path) -> Result<Framing, DataError> {
    let io = super::io_error(path);
    let file = File::open(path).map_err(&io)?;
    let len = file.metadata().map_err(&io)?.len();
    let mut reader = BufReader::new(file);
    let mut magic = Vec::with_capacity(8);
    (&mut reader).take(8).read_to_end(&mut magic).map_err(&io)?;
    let mut batch_rows = Vec::new();
    let mut buf = Vec::new();
    let mut claims = Claims::new(len);
    if !magic.starts_with(FILE_MAGIC) {
        let mut at = 0;
        loop {
            if at >= len {
                return Err(corrupt(path, at, "the stream ends without its end-of-stream marker (truncated?)"));
            }
            match message_at(&mut reader, path, at, len, &mut buf, &mut claims)? {
                None => break,
                Some((next, rows)) => {
                    batch_rows.extend(rows);
                    at = next;
                }
            }
        }
        return Ok(Framing { file_format: false, batch_rows, file_len: len });
    }
    if len < 8 + 10 {
        return Err(corrupt(path, 0, "too short for the Arrow file format (truncated?)"));
    }
    let mut tail = [0u8; 10];
    reader.seek(SeekFrom::Start(len - 10)).map_err(&io)?;
    reader.read_exact(&mut tail).map_err(&io)?;
    if &tail[4..] != FILE_MAGIC {
        return Err(corrupt(path, len - 6, "the file does not end with ARROW1 (truncated?)"));
    }
    let footer = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if footer + 10 + 8 > len || footer > MAX_METADATA {
        return Err(corrupt(path, len - 10, format!("the footer claims {footer} bytes of a {len}-byte file")));
    }
    let end = len - 10 - footer;
    let mut bytes = vec![0u8; footer as usize];
    reader.seek(SeekFrom::Start(end)).map_err(&io)?;
    reader.read_exact(&mut bytes).map_err(&io)?;
    let parsed = arrow_ipc::root_as_footer(&bytes).map_err(|e| corrupt(path, end, format!("its footer: {e}")))?;
    let blocks = parsed.dictionaries().into_iter().flatten().map(|b| (b, false));
    for (block, batch) in blocks.chain(parsed.recordBatches().into_iter().flatten().map(|b| (b, true))) {
        let at = u64::try_from(block.offset()).map_err(|_| corrupt(path, end, "a block at a negative offset"))?;
        let claimed = u64::try_from(block.bodyLength()).ok().zip(u64::try_from(block.metaDataLength()).ok());
        let fits = claimed.and_then(|(b, m)| at.checked_add(b)?.checked_add(m)).is_some_and(|e| e <= end);
        if !fits {
            return Err(corrupt(path, at, "the footer claims a block past the data (truncated?)"));
        }
        let Some((_, rows)) = message_at(&mut reader, path, at, end, &mut buf, &mut claims)? else {
            return Err(corrupt(path, at, "the footer's block holds no message"));
        };
        if batch {
            batch_rows.push(rows.ok_or_else(|| corrupt(path, at, "the footer's block is not a record batch"))?);
        }
    }
    Ok(Framing { file_format: true, batch_rows, file_len: len })
}

/// An IPC reader of the projected columns (all when `projection` is `None`).
fn ipc_batches(
    path: &Path,
    file_format: bool,
    projection: Option<Vec<usize>>,
) -> Result<(std::sync::Arc<Schema>, Batches), DataError> {
    let file = File::open(path).map_err(super::io_error(path))?;
    let owned = path.to_path_buf();
    let error = move |e: ArrowError| DataError::Array {
        path: owned.clone(),
        reason: format!("cannot read it as Arrow IPC: {e}"),
    };
    if file_format {
        let reader = arrow_ipc::reader::FileReader::try_new_buffered(file, projection).map_err(arrow_error(path))?;
        Ok((reader.schema(), Box::new(reader.map(move |b| b.map_err(&error)))))
    } else {
        let reader = arrow_ipc::reader::StreamReader::try_new_buffered(file, projection).map_err(arrow_error(path))?;
        Ok((reader.schema(), Box::new(reader.map(move |b| b.map_err(&error)))))
    }
}

/// The schema's columns, variable lists shown by their first row (of the
/// columns `wanted`).
fn ipc_columns(
    path: &Path,
    framing: &Framing,
    schema: &Schema,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<ColumnInfo>, DataError> {
    let variable = variable_columns(schema, wanted);
    let mut first: Vec<Option<ArrayRef>> = vec![None; schema.fields().len()];
    if !variable.is_empty() && framing.batch_rows.iter().any(|&r| r > 0) {
        let (_, mut batches) = ipc_batches(path, framing.file_format, Some(variable.clone()))?;
        for batch in batches.by_ref() {
            let batch = batch?;
            if batch.num_rows() > 0 {
                for (column, &index) in variable.iter().enumerate() {
                    first[index] = Some(batch.column(column).slice(0, 1));
                }
                break;
            }
        }
    }
    Ok(schema.fields().iter().zip(&first).map(|(f, first)| column_info(path, f, first.as_ref())).collect())
}

pub(crate) fn peek(path: &Path, _compression: Compression, _options: &Options) -> Result<Option<Look>, DataError> {
    contained(path, || {
        let framing = walk(path)?;
        let (schema, _) = ipc_batches(path, framing.file_format, None)?;
        Ok(Some(Look::Columns(ipc_columns(path, &framing, &schema, |_| true)?)))
    })
}

pub(crate) fn open(path: &Path, _compression: Compression, options: &Options) -> Result<Box<dyn Source>, DataError> {
    contained(path, || {
        let framing = walk(path)?;
        let (schema, _) = ipc_batches(path, framing.file_format, None)?;
        let asked = find_columns(path, &schema, &options.columns)?;
        let infos = ipc_columns(path, &framing, &schema, |name| options.columns.iter().any(|c| c == name))?;
        let columns: Vec<ColumnInfo> = asked.iter().map(|&i| infos[i].clone()).collect();
        // The projection, in the file's order: batches hold the asked columns sorted.
        let mut projection = asked.clone();
        projection.sort_unstable();
        projection.dedup();
        let indices = asked.iter().map(|i| projection.binary_search(i).expect("projected")).collect();
        let (_, batches) = ipc_batches(path, framing.file_format, Some(projection))?;
        let rows: u64 = framing.batch_rows.iter().sum();
        let (lo, hi) = options.part.rows(rows);
        Ok(Box::new(BatchSource(BatchPieces {
            path: path.to_path_buf(),
            batches,
            columns,
            indices,
            current: None,
            batch_row: 0,
            skip: lo,
            remaining: hi - lo,
            file_len: framing.file_len,
        })) as Box<dyn Source>)
    })
}
