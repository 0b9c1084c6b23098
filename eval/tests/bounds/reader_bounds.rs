//! What reading untrusted bytes may cost: a reader of N bytes never holds
//! more than max(64 MiB, 16 × N) at once, however the file lies about what
//! it holds. Measured by the plain count of `peak.rs`, which also refuses
//! any request that would take live bytes past 8 GiB, so a reader that
//! amplifies aborts this binary instead of exhausting the machine. Tests
//! run one at a time (they share the counters).
//!
//! The lying inputs: a Parquet file (and an Arrow IPC stream) whose
//! dictionary holds one large string that every row refers to; a JSON
//! Lines line of zeros under the line cap; a CSV file without a newline.

use arrow_array::{ArrayRef, DictionaryArray, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use isorun_eval::{DataSpec, Dataset};
use isorun_protocol::{DType, SignatureInfo, TensorData};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::peak::{bound, bounded, peak_of};
use super::serial;
use super::util::{self, data_spec, tensor};

fn spec(path: &Path, batch_size: usize) -> DataSpec {
    data_spec(vec![path.to_path_buf()], "y", batch_size)
}

fn signature(input: &str, dtype: DType, shape: Vec<Option<u64>>) -> SignatureInfo {
    util::signature(vec![tensor(input, dtype, &shape)], vec![])
}

/// Reads every batch of `path`: the rows read, or the first error's message;
/// and the peak held while reading, checked against the file's bound.
fn read_all(path: &Path, batch_size: usize, signature: &SignatureInfo) -> (Result<u64, String>, usize) {
    bounded(path, || {
        let dataset = Dataset::open(spec(path, batch_size)).map_err(|e| e.to_string())?;
        let mut reader = dataset.reader(signature).map_err(|e| e.to_string())?;
        let mut rows = 0u64;
        while let Some(batch) = reader.next_batch() {
            rows += batch.map_err(|e| e.to_string())?.targets.rows as u64;
        }
        Ok(rows)
    })
}

/// Rows that all refer to one dictionary value of `value_bytes` bytes (a
/// string input `x`), with an integer label `y`: as a dictionary-typed
/// column, or as a plain string column (which Parquet writes with a
/// dictionary page all the same).
fn one_value_rows(value_bytes: usize, rows: usize, dictionary_typed: bool) -> RecordBatch {
    let value = "a".repeat(value_bytes);
    let (x, x_type): (ArrayRef, DataType) = if dictionary_typed {
        let keys = Int32Array::from(vec![0; rows]);
        let array = DictionaryArray::try_new(keys, Arc::new(StringArray::from(vec![value]))).unwrap();
        (Arc::new(array), DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)))
    } else {
        (Arc::new(StringArray::from(vec![value.as_str(); rows])), DataType::Utf8)
    };
    let schema = Schema::new(vec![Field::new("x", x_type, false), Field::new("y", DataType::Int64, false)]);
    RecordBatch::try_new(Arc::new(schema), vec![x, Arc::new(Int64Array::from(vec![1; rows]))]).unwrap()
}

/// A zstd Parquet file of `batch`: its dictionary pages compressed to
/// almost nothing, no statistics (which would hold the value again).
pub(crate) fn write_parquet(dir: &Path, name: &str, batch: &RecordBatch) -> PathBuf {
    let path = dir.join(name);
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap()))
        .set_dictionary_page_size_limit(256 << 20)
        .set_statistics_enabled(EnabledStatistics::None)
        .build();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(properties)).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
    path
}

fn strings() -> SignatureInfo {
    signature("x", DType::String, vec![None])
}

/// The error of a dictionary value repeated past what the file may make:
/// it names the file, the column and a row.
fn assert_repeats_refused(path: &Path, result: Result<u64, String>) {
    let error = result.unwrap_err();
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(error.contains(&format!("{name}: column 'x'")), "{error}");
    assert!(error.contains("row ") && error.contains("a batch may take"), "{error}");
}

#[test]
fn a_parquet_dictionary_value_repeated_by_every_row_is_counted_as_it_is_copied() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // One 2 MiB string, 64 rows referring to it: 128 MiB if copied per row.
    for (name, dictionary_typed) in [("dictionary.parquet", true), ("plain.parquet", false)] {
        let path = write_parquet(dir.path(), name, &one_value_rows(2 << 20, 64, dictionary_typed));
        assert!(std::fs::metadata(&path).unwrap().len() < 64 << 10);
        let (result, _) = read_all(&path, 128, &strings());
        assert_repeats_refused(&path, result);
    }
    // The same value repeated by a few rows is read.
    let path = write_parquet(dir.path(), "few.parquet", &one_value_rows(1 << 20, 4, true));
    let (result, _) = read_all(&path, 128, &strings());
    assert_eq!(result, Ok(4));
}

#[test]
fn an_arrow_dictionary_value_repeated_by_every_row_is_counted_as_it_is_copied() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // A stream of one 4 MiB string in a dictionary, and record batches of
    // one row each referring to it: a batch gathers them (128 rows: 512 MiB).
    let path = dir.path().join("dictionary.arrow");
    let one = one_value_rows(4 << 20, 1, true);
    let mut writer =
        arrow_ipc::writer::StreamWriter::try_new(std::fs::File::create(&path).unwrap(), &one.schema()).unwrap();
    for _ in 0..128 {
        writer.write(&one).unwrap();
    }
    writer.finish().unwrap();
    drop(writer);
    let (result, _) = read_all(&path, 128, &strings());
    assert_repeats_refused(&path, result);
    // One record batch of 128 rows, the same.
    let path = dir.path().join("one_batch.arrow");
    let all = one_value_rows(4 << 20, 128, true);
    let mut writer =
        arrow_ipc::writer::StreamWriter::try_new(std::fs::File::create(&path).unwrap(), &all.schema()).unwrap();
    writer.write(&all).unwrap();
    writer.finish().unwrap();
    drop(writer);
    let (result, _) = read_all(&path, 128, &strings());
    assert_repeats_refused(&path, result);
}

#[test]
fn a_json_lines_line_of_zeros_costs_a_small_multiple_of_its_bytes() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // 8 MiB of "0,": four million numbers on one line.
    let n = 4usize << 20;
    let mut line = String::with_capacity(2 * n + 32);
    line.push_str("{\"x\": [");
    for i in 0..n {
        line.push_str(if i == 0 { "0" } else { ",0" });
    }
    line.push_str("], \"y\": 1}\n");
    let path = dir.path().join("zeros.jsonl");
    std::fs::write(&path, &line).unwrap();
    drop(line);
    let (result, peak) = read_all(&path, 1, &signature("x", DType::Float32, vec![None, Some(n as u64)]));
    assert_eq!(result, Ok(1));
    // The batch itself holds 16 MiB of float32; the line 8 MiB.
    assert!(peak < 96 << 20, "{peak}");
    // What is read is right: read again, keeping the batch.
    let dataset = Dataset::open(spec(&path, 1)).unwrap();
    let mut reader = dataset.reader(&signature("x", DType::Float32, vec![None, Some(n as u64)])).unwrap();
    let batch = reader.next_batch().unwrap().unwrap();
    assert_eq!(batch.inputs[0].1.shape, vec![1, n as u64]);
    let TensorData::Dense(bytes) = &batch.inputs[0].1.data else { panic!("dense") };
    assert!(bytes.len() == 4 * n && bytes.iter().all(|&b| b == 0));
}

#[test]
fn a_csv_file_without_a_newline_is_an_error_naming_the_line_and_the_cap() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // A header, then a row that never ends: 65 MiB of NUL bytes (a sparse file).
    let path = dir.path().join("endless.csv");
    std::fs::write(&path, "x,y\n1,").unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(65 << 20).unwrap();
    drop(file);
    let (result, peak) = read_all(&path, 4, &signature("x", DType::Float32, vec![None]));
    let error = result.unwrap_err();
    assert!(error.contains("endless.csv") && error.contains("line 2"), "{error}");
    assert!(error.contains(&format!("longer than {} bytes", 64 << 20)), "{error}");
    // Found without holding the line: the cap and a read buffer or two.
    assert!(peak < 80 << 20, "{peak}");
}

#[test]
fn parquet_lists_of_strings_read_as_views_and_are_counted_too() {
    use arrow_array::builder::{ListBuilder, StringBuilder};
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let list_of = |value: &str, rows: usize| {
        let mut lists = ListBuilder::new(StringBuilder::new());
        for _ in 0..rows {
            lists.values().append_value(value);
            lists.values().append_value("q");
            lists.append(true);
        }
        let x: ArrayRef = Arc::new(lists.finish());
        let y: ArrayRef = Arc::new(Int64Array::from(vec![1; rows]));
        RecordBatch::try_from_iter([("x", x), ("y", y)]).unwrap()
    };
    let list_input = signature("x", DType::String, vec![None, Some(2)]);
    // Read right.
    let path = write_parquet(dir.path(), "lists.parquet", &list_of("p", 5));
    let dataset = Dataset::open(spec(&path, 8)).unwrap();
    let mut reader = dataset.reader(&list_input).unwrap();
    let batch = reader.next_batch().unwrap().unwrap();
    assert_eq!(batch.inputs[0].1.shape, vec![5, 2]);
    let TensorData::Strings(strings) = &batch.inputs[0].1.data else { panic!("strings") };
    assert_eq!(
        strings.iter().map(|s| s.to_vec()).collect::<Vec<_>>(),
        (0..5).flat_map(|_| [b"p".to_vec(), b"q".to_vec()]).collect::<Vec<_>>()
    );
    // One 2 MiB value in every row's list: refused as it is copied.
    let path = write_parquet(dir.path(), "list_bomb.parquet", &list_of(&"a".repeat(2 << 20), 64));
    let (result, _) = read_all(&path, 64, &list_input);
    assert_repeats_refused(&path, result);
}

/// Reads `path` with each byte in turn replaced by each of `values`; every
/// read, an error or not, within the bound of the file's size.
fn read_each_byte_changed(path: &Path, values: &[u8], signature: &SignatureInfo) -> usize {
    let original = std::fs::read(path).unwrap();
    let mut worst = 0;
    for at in 0..original.len() {
        for &value in values {
            let mut bytes = original.clone();
            bytes[at] = value;
            std::fs::write(path, &bytes).unwrap();
            let (_, peak) = peak_of(|| {
                let dataset = Dataset::open(spec(path, 4)).map_err(|e| e.to_string())?;
                let mut reader = dataset.reader(signature).map_err(|e| e.to_string())?;
                while let Some(batch) = reader.next_batch() {
                    batch.map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            });
            assert!(peak <= bound(bytes.len() as u64), "byte {at} set to {value}: {peak} bytes held");
            worst = worst.max(peak);
        }
    }
    worst
}

#[test]
fn arrow_and_parquet_files_with_any_byte_changed_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let rows = one_value_rows(3, 6, true);
    let mut files = vec![write_parquet(dir.path(), "small.parquet", &rows)];
    for (name, stream) in [("small_stream.arrow", true), ("small_file.arrow", false)] {
        let path = dir.path().join(name);
        let file = std::fs::File::create(&path).unwrap();
        if stream {
            let mut writer = arrow_ipc::writer::StreamWriter::try_new(file, &rows.schema()).unwrap();
            writer.write(&rows).unwrap();
            writer.finish().unwrap();
        } else {
            let mut writer = arrow_ipc::writer::FileWriter::try_new(file, &rows.schema()).unwrap();
            writer.write(&rows).unwrap();
            writer.finish().unwrap();
        }
        files.push(path);
    }
    for path in files {
        let worst = read_each_byte_changed(&path, &[0xff, 0x7f, 0x00], &strings());
        eprintln!("{}: worst peak {worst} bytes", path.display());
    }
}
