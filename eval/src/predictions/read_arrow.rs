//! A Parquet predictions file's rows, as the Parquet crate hands them (an
//! Arrow `RecordBatch` of eval's columns), rebuilt as a [`RescoreBatch`]:
//! each column checked to be of the type eval writes and free of nulls,
//! list columns flattened (every row the saved width), the scored output
//! turned into a dense tensor's bytes in its stored dtype.

use super::columns::{output_column, slice_column, INDEX, KEY, LABEL, WEIGHT};
use super::meta::Meta;
use super::read_batch::{err, stored_dtype, ReadError, RescoreBatch};
use crate::data::{Labels, Targets};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use isorun_protocol::{DType, Tensor};
use std::path::Path;

/// The column `name` of `batch` (`None`: the file has no such column); an error where a row is null.
fn column<'b>(path: &Path, batch: &'b RecordBatch, name: &str) -> Result<Option<&'b ArrayRef>, ReadError> {
    let Some(array) = batch.column_by_name(name) else { return Ok(None) };
    if array.null_count() > 0 {
        let row = (0..array.len()).find(|&r| array.is_null(r)).unwrap_or(0);
        return Err(err(path, format!("column '{name}' is null at row {row} of a batch")));
    }
    Ok(Some(array))
}

/// One record batch of the file at `path` (described by `meta`) as the
/// batch the evaluator gets: `output` scored, the slices `slice_names` read.
pub(super) fn batch_of_arrow(
    path: &Path,
    meta: &Meta,
    output: &str,
    slice_names: &[String],
    batch: &RecordBatch,
) -> Result<RescoreBatch, ReadError> {
    let rows = batch.num_rows();
    let bad = |name: &str, array: &ArrayRef| {
        err(path, format!("column '{name}' is {}, not what eval writes", array.data_type()))
    };
    let index = column(path, batch, INDEX)?.ok_or_else(|| err(path, "has no column 'index'"))?;
    let first_index =
        index.as_primitive_opt::<UInt64Type>().ok_or_else(|| bad(INDEX, index))?.values().first().copied();
    let keys = match column(path, batch, KEY)? {
        Some(array) => Some(strings(array).ok_or_else(|| bad(KEY, array))?),
        None => None,
    };
    let label = column(path, batch, LABEL)?.ok_or_else(|| err(path, "has no column 'label'"))?;
    let labels = match label.data_type() {
        DataType::Int64 => Labels::Int(label.as_primitive::<Int64Type>().values().to_vec()),
        DataType::Float64 => Labels::Float(label.as_primitive::<Float64Type>().values().to_vec()),
        _ => {
            let (values, columns) = flat_list(label, rows).ok_or_else(|| bad(LABEL, label))?;
            let values = values.as_primitive_opt::<Float64Type>().ok_or_else(|| bad(LABEL, label))?;
            Labels::Matrix { columns, values: values.values().to_vec() }
        }
    };
    let weights = match column(path, batch, WEIGHT)? {
        Some(array) => {
            Some(array.as_primitive_opt::<Float64Type>().ok_or_else(|| bad(WEIGHT, array))?.values().to_vec())
        }
        None => None,
    };
    let mut slices = Vec::new();
    for slice in slice_names {
        let name = slice_column(slice);
        let array = column(path, batch, &name)?.ok_or_else(|| err(path, format!("has no column '{name}'")))?;
        slices.push((slice.clone(), strings(array).ok_or_else(|| bad(&name, array))?));
    }
    let name = output_column(output);
    let array = column(path, batch, &name)?.ok_or_else(|| err(path, format!("has no column '{name}'")))?;
    let saved = meta.saved(output).expect("checked by start");
    let (values, width) =
        if saved.scalar() { (array.clone(), 1) } else { flat_list(array, rows).ok_or_else(|| bad(&name, array))? };
    if width != saved.width() {
        return Err(err(path, format!("column '{name}' has {width} values a row, eval wrote {}", saved.width())));
    }
    let (dtype, bytes) = dense_bytes(&values, saved.dtype).ok_or_else(|| bad(&name, array))?;
    let mut shape = vec![rows as u64];
    shape.extend_from_slice(&saved.row_shape);
    let targets = Targets { rows, labels, weights, slices, first_index: first_index.unwrap_or(0), keys };
    Ok(RescoreBatch { targets, output: (output.to_string(), Tensor::dense(dtype, shape, bytes)) })
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
