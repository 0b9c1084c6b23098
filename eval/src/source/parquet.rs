//! Parquet files (`.parquet`, `.pq`) as columns, read through Arrow: what
//! pandas, polars, pyarrow and the Hugging Face Hub write.
//!
//! Only the columns a run needs are read (a projection of the file's root
//! columns), a row group at a time and [`READ_ROWS`] rows at a time within
//! it, so memory does not grow with the file. Types, lists, nulls and
//! strings convert as in the Arrow source (`source::arrow`), which this
//! module shares. String and binary columns are read as views (see
//! [`as_view`]): a dictionary's value is copied only by the conversion,
//! which counts each copy against the batch's bound.
//!
//! Untrusted input: the footer is read here, not by the crate, with its
//! claimed length checked against the file and capped at [`MAX_FOOTER`];
//! every column chunk's claimed byte range must lie within the file, and
//! every page a read will decompress is checked first (`parquet_pages`:
//! no decompression bombs). A panic in the Parquet crate is the file's
//! [`DataError::Reader`].
//! Compression: uncompressed, snappy (pandas' and pyarrow's default), zstd
//! (polars' default) and gzip; others (lz4, brotli) are refused by name.
//!
//! Parts: part `K` of `N` is the row groups `[K*g/N, (K+1)*g/N)` of the
//! file's `g` (a file of fewer row groups than parts leaves some parts
//! empty).

use super::arrow::{column_info, contained, find_columns, variable_columns, BatchPieces, BatchSource};
use super::{ColumnInfo, Compression, Look, Options, Source};
use crate::error::DataError;
use arrow_array::ArrayRef;
use arrow_schema::{DataType, Field, FieldRef, Schema};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::ParquetMetaDataReader;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

/// The most bytes a file's footer (its metadata) may claim.
pub const MAX_FOOTER: u64 = 64 << 20;

/// Rows decoded at a time.
pub const READ_ROWS: usize = 1024;

fn bad(path: &Path, reason: impl std::fmt::Display) -> DataError {
    DataError::Array { path: path.to_path_buf(), reason: format!("not a valid Parquet file: {reason}") }
}

/// Reads and checks the footer; the file's metadata, as Arrow sees it.
/// Also the predictions reader's (`crate::predictions::read`): one hardened path.
pub(crate) fn metadata(path: &Path) -> Result<ArrowReaderMetadata, DataError> {
    let io = super::io_error(path);
    let mut file = File::open(path).map_err(&io)?;
    let len = file.metadata().map_err(&io)?.len();
    if len < 12 {
        return Err(bad(path, format!("{len} bytes is too short (a Parquet file starts and ends with PAR1)")));
    }
    let mut head = [0u8; 4];
    file.read_exact(&mut head).map_err(&io)?;
    let mut tail = [0u8; 8];
    file.seek(SeekFrom::Start(len - 8)).map_err(&io)?;
    file.read_exact(&mut tail).map_err(&io)?;
    if &head != b"PAR1" {
        return Err(bad(path, "it does not start with PAR1"));
    }
    match &tail[4..] {
        b"PAR1" => {}
        b"PARE" => return Err(bad(path, "its footer is encrypted, which is not read")),
        _ => return Err(bad(path, "it does not end with PAR1 (truncated?)")),
    }
    let footer = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if footer > len - 12 {
        return Err(bad(path, format!("the footer claims {footer} bytes, but the file is {len} bytes long")));
    }
    if footer > MAX_FOOTER {
        return Err(bad(path, format!("the footer claims {footer} bytes, more than the {MAX_FOOTER} read")));
    }
    let mut bytes = vec![0u8; footer as usize];
    file.seek(SeekFrom::Start(len - 8 - footer)).map_err(&io)?;
    file.read_exact(&mut bytes).map_err(&io)?;
    let parsed = ParquetMetaDataReader::decode_metadata(&bytes).map_err(|e| bad(path, format!("its footer: {e}")))?;
    for (g, group) in parsed.row_groups().iter().enumerate() {
        if group.num_rows() < 0 {
            return Err(bad(path, format!("row group {g} claims {} rows", group.num_rows())));
        }
        for column in group.columns() {
            let start = column.dictionary_page_offset().unwrap_or(column.data_page_offset());
            let size = column.compressed_size();
            let fits = u64::try_from(start)
                .ok()
                .zip(u64::try_from(size).ok())
                .and_then(|(s, n)| s.checked_add(n))
                .is_some_and(|end| end <= len);
            if !fits {
                return Err(bad(
                    path,
                    format!(
                        "row group {g} column '{}' claims bytes [{start}, {start} + {size}) of a {len}-byte file",
                        column.column_path()
                    ),
                ));
            }
        }
    }
    ArrowReaderMetadata::try_new(Arc::new(parsed), ArrowReaderOptions::new())
        .map_err(|e| bad(path, format!("its schema: {e}")))
}

/// The type a column is read as: strings and binary values as views, which
/// the Parquet crate builds over a dictionary page without copying it;
/// read plainly, it copies the dictionary's value for every row that
/// refers to it (256 rows referring to one 200 MiB string: 50 GiB, from a
/// file of kilobytes) before this crate sees a row. Views leave the copying
/// to the conversion, which counts it (`arrow::Budget`).
fn as_view(data_type: &DataType) -> DataType {
    let field = |f: &FieldRef| Arc::new(f.as_ref().clone().with_data_type(as_view(f.data_type())));
    match data_type {
        DataType::Utf8 | DataType::LargeUtf8 => DataType::Utf8View,
        DataType::Binary | DataType::LargeBinary => DataType::BinaryView,
        DataType::Dictionary(_, value) if matches!(as_view(value), DataType::Utf8View | DataType::BinaryView) => {
            as_view(value)
        }
        DataType::List(f) => DataType::List(field(f)),
        DataType::LargeList(f) => DataType::LargeList(field(f)),
        DataType::FixedSizeList(f, k) => DataType::FixedSizeList(field(f), *k),
        other => other.clone(),
    }
}

/// The file's metadata with its string columns read as views ([`as_view`]).
fn with_views(path: &Path, meta: ArrowReaderMetadata) -> Result<ArrowReaderMetadata, DataError> {
    let schema = meta.schema();
    let fields: Vec<Field> =
        schema.fields().iter().map(|f| f.as_ref().clone().with_data_type(as_view(f.data_type()))).collect();
    let hinted = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    ArrowReaderMetadata::try_new(Arc::clone(meta.metadata()), ArrowReaderOptions::new().with_schema(hinted))
        .map_err(|e| bad(path, format!("its schema, with strings read as views: {e}")))
}

/// Checks the page headers of the row groups `groups` for the leaf columns
/// under the root columns `roots` (see `parquet_pages`).
pub(crate) fn check_pages(
    path: &Path,
    meta: &ArrowReaderMetadata,
    groups: std::ops::Range<usize>,
    roots: &[usize],
) -> Result<(), DataError> {
    let schema = meta.parquet_schema();
    let leaf = |c: usize| c < schema.num_columns() && roots.contains(&schema.get_column_root_idx(c));
    super::parquet_pages::check_pages(path, meta.metadata(), groups, leaf)
}

fn read_error(path: &Path) -> impl Fn(parquet::errors::ParquetError) -> DataError + '_ {
    move |e| DataError::Array { path: path.to_path_buf(), reason: format!("cannot read it as Parquet: {e}") }
}

/// The file's columns, variable lists shown by their first row (of the columns `wanted`).
fn columns(
    path: &Path,
    meta: &ArrowReaderMetadata,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<ColumnInfo>, DataError> {
    let schema = meta.schema();
    let variable = variable_columns(schema, wanted);
    let mut first: Vec<Option<ArrayRef>> = vec![None; schema.fields().len()];
    let group = meta.metadata().row_groups().iter().position(|g| g.num_rows() > 0);
    if let (false, Some(group)) = (variable.is_empty(), group) {
        check_pages(path, meta, group..group + 1, &variable)?;
        let file = File::open(path).map_err(super::io_error(path))?;
        let mut reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
            .with_projection(ProjectionMask::roots(meta.parquet_schema(), variable.iter().copied()))
            .with_row_groups(vec![group])
            .with_batch_size(1)
            .build()
            .map_err(read_error(path))?;
        if let Some(batch) = reader.next() {
            let batch = batch.map_err(|e| bad(path, e))?;
            for (column, &index) in variable.iter().enumerate() {
                first[index] = Some(batch.column(column).clone());
            }
        }
    }
    Ok(schema.fields().iter().zip(&first).map(|(f, first)| column_info(path, f, first.as_ref())).collect())
}

pub(crate) fn peek(path: &Path, _compression: Compression, _options: &Options) -> Result<Option<Look>, DataError> {
    contained(path, || {
        let meta = with_views(path, metadata(path)?)?;
        Ok(Some(Look::Columns(columns(path, &meta, |_| true)?)))
    })
}

pub(crate) fn open(path: &Path, _compression: Compression, options: &Options) -> Result<Box<dyn Source>, DataError> {
    contained(path, || {
        let meta = with_views(path, metadata(path)?)?;
        let file_len = std::fs::metadata(path).map_err(super::io_error(path))?.len();
        let schema = Arc::clone(meta.schema());
        let asked = find_columns(path, &schema, &options.columns)?;
        let infos = columns(path, &meta, |name| options.columns.iter().any(|c| c == name))?;
        let columns: Vec<ColumnInfo> = asked.iter().map(|&i| infos[i].clone()).collect();
        let mut projection = asked.clone();
        projection.sort_unstable();
        projection.dedup();
        let indices = asked.iter().map(|i| projection.binary_search(i).expect("projected")).collect();
        let groups = meta.metadata().row_groups();
        let (lo, hi) = options.part.rows(groups.len() as u64);
        let (lo, hi) = (lo as usize, hi as usize);
        let rows_before: u64 = groups[..lo].iter().map(|g| g.num_rows() as u64).sum();
        let rows: u64 = groups[lo..hi].iter().map(|g| g.num_rows() as u64).sum();
        check_pages(path, &meta, lo..hi, &projection)?;
        let file = File::open(path).map_err(super::io_error(path))?;
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
            .with_projection(ProjectionMask::roots(meta.parquet_schema(), projection.iter().copied()))
            .with_row_groups((lo..hi).collect())
            .with_batch_size(READ_ROWS)
            .build()
            .map_err(read_error(path))?;
        let owned = path.to_path_buf();
        let batches = reader.map(move |b| {
            b.map_err(|e| DataError::Array { path: owned.clone(), reason: format!("cannot read it as Parquet: {e}") })
        });
        Ok(Box::new(BatchSource(BatchPieces {
            path: path.to_path_buf(),
            batches: Box::new(batches),
            columns,
            indices,
            current: None,
            batch_row: rows_before,
            skip: 0,
            remaining: rows,
            file_len,
        })) as Box<dyn Source>)
    })
}
