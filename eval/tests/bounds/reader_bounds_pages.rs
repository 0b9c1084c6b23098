//! What reading untrusted bytes may cost where a small file decompresses
//! (or a line parses) into much more than itself: a Parquet page, a gzip
//! JSON Lines line, a rescore predictions line. Each read of N bytes holds
//! at most max(64 MiB, 16 × N) at once (the bound of `reader_bounds.rs`,
//! measured by the same plain count, `peak.rs`). Tests run one at a time
//! (they share the counters).

use arrow_array::{ArrayRef, DictionaryArray, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use isorun_eval::predictions::{Meta, PredictionsFormat, PredictionsReader, PredictionsWriter};
use isorun_eval::{DataSpec, Dataset, Labels, Targets};
use isorun_protocol::{DType, SignatureInfo, Tensor};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::peak::bounded;
use super::serial;
use super::util::{self, data_spec, tensor};

fn spec(path: &Path) -> DataSpec {
    data_spec(vec![path.to_path_buf()], "y", 16)
}

fn signature(input: &str, dtype: DType, shape: Vec<Option<u64>>) -> SignatureInfo {
    util::signature(vec![tensor(input, dtype, &shape)], vec![])
}

/// Opens and reads every batch of a dataset: the rows read, or the first error's message.
fn read_dataset(path: &Path, signature: &SignatureInfo) -> Result<u64, String> {
    let dataset = Dataset::open(spec(path)).map_err(|e| e.to_string())?;
    let mut reader = dataset.reader(signature).map_err(|e| e.to_string())?;
    let mut rows = 0u64;
    while let Some(batch) = reader.next_batch() {
        rows += batch.map_err(|e| e.to_string())?.targets.rows as u64;
    }
    Ok(rows)
}

/// A zstd Parquet file of rows that all refer to one dictionary string of
/// `value_bytes` bytes (column `x`), with an integer label `y`.
fn one_value_parquet(dir: &Path, name: &str, value_bytes: usize, rows: usize) -> PathBuf {
    let keys = Int32Array::from(vec![0; rows]);
    let x = DictionaryArray::try_new(keys, Arc::new(StringArray::from(vec!["a".repeat(value_bytes)]))).unwrap();
    let schema = Schema::new(vec![
        Field::new("x", DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)), false),
        Field::new("y", DataType::Int64, false),
    ]);
    let columns: Vec<ArrayRef> = vec![Arc::new(x), Arc::new(Int64Array::from(vec![1; rows]))];
    let batch = RecordBatch::try_new(Arc::new(schema), columns).unwrap();
    super::reader_bounds::write_parquet(dir, name, &batch)
}

#[test]
fn a_small_parquet_file_claiming_a_200_mib_dictionary_page_is_refused_before_decompressing_it() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = one_value_parquet(dir.path(), "bomb.parquet", 200 << 20, 256);
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(len < 64 << 10, "{len}");
    let strings = signature("x", DType::String, vec![None]);
    let (result, _) = bounded(&path, || read_dataset(&path, &strings));
    let error = result.unwrap_err();
    assert!(
        error.contains("bomb.parquet") && error.contains("row group 0 column 'x' page 0 at byte offset"),
        "{error}"
    );
    // The dictionary page holds the value and its 4-byte length.
    assert!(error.contains(&format!("decompress to {} bytes", (200u64 << 20) + 4)), "{error}");
    assert!(error.contains(&format!("more than the {} a page of a {len}-byte file", 32 << 20)), "{error}");
    assert!(error.contains("decompression bomb"), "{error}");
    // A page of a few MiB from a small file is read, as before.
    let path = one_value_parquet(dir.path(), "small.parquet", 4 << 20, 2);
    let (result, _) = bounded(&path, || read_dataset(&path, &strings));
    assert_eq!(result, Ok(2));
}

/// A JSON object of one key `x`, a list of `n` zeros, and a label `y`.
fn zeros_line(n: usize) -> Vec<u8> {
    let mut line = Vec::with_capacity(2 * n + 32);
    line.extend_from_slice(b"{\"x\": [");
    for i in 0..n {
        line.extend_from_slice(if i == 0 { b"0" } else { b",0" });
    }
    line.extend_from_slice(b"], \"y\": 1}\n");
    line
}

fn gzip(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(&path).unwrap(), flate2::Compression::best());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap();
    path
}

#[test]
fn a_gzip_json_lines_line_is_capped_by_the_compressed_file_s_size() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // A 60 MiB line of zeros (under the 64 MiB line cap), gzipped to tens of KB.
    let n = 30usize << 20;
    let path = gzip(dir.path(), "bomb.jsonl.gz", &zeros_line(n));
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(len < 1 << 20, "{len}");
    let (result, peak) =
        bounded(&path, || read_dataset(&path, &signature("x", DType::Float32, vec![None, Some(n as u64)])));
    let error = result.unwrap_err();
    assert!(error.contains("bomb.jsonl.gz") && error.contains("line 1"), "{error}");
    assert!(
        error.contains(&format!("longer than {} bytes", 8 << 20)) && error.contains(&format!("{len}-byte")),
        "{error}"
    );
    assert!(error.contains("decompression bomb"), "{error}");
    // Found without holding the line: the cap and the read buffers.
    assert!(peak < 16 << 20, "{peak}");
    // A line of half a MiB gzipped (to 1 KB) is read, as before.
    let n = 1usize << 18;
    let path = gzip(dir.path(), "small.jsonl.gz", &zeros_line(n));
    let (result, _) =
        bounded(&path, || read_dataset(&path, &signature("x", DType::Float32, vec![None, Some(n as u64)])));
    assert_eq!(result, Ok(1));
}

fn predictions_meta(width: u64) -> Meta {
    Meta {
        model: "m".into(),
        output: "p".into(),
        output_shape: Some(vec![None, Some(width)]),
        metrics: vec!["accuracy".into()],
        data_digest: "dddddddddddddddddddddddd".into(),
        ..Meta::new("y")
    }
}

/// A JSON Lines predictions file (and its sidecar) of `rows` rows of a
/// `width`-wide float32 output, each row's values `0, 1, ...`.
fn write_predictions(dir: &Path, width: u64, rows: usize) -> PathBuf {
    let mut writer = PredictionsWriter::create(dir, PredictionsFormat::Jsonl, predictions_meta(width), false).unwrap();
    let targets =
        Targets { rows, labels: Labels::Int(vec![1; rows]), weights: None, slices: vec![], first_index: 0, keys: None };
    let bytes: Vec<u8> = (0..rows * width as usize).flat_map(|i| (i as f32).to_le_bytes()).collect();
    writer.append(&targets, &[("p".into(), Tensor::dense(DType::Float32, vec![rows as u64, width], bytes))]).unwrap();
    writer.finish(Some("multiclass".into()), 0).unwrap()
}

/// Reads every batch of a predictions file: rows and the output's values, or the first error.
fn read_predictions(path: &Path) -> Result<(usize, Vec<u8>), String> {
    let mut reader = PredictionsReader::open(path).map_err(|e| e.to_string())?;
    reader.start("p", &[]).map_err(|e| e.to_string())?;
    let (mut rows, mut values) = (0, Vec::new());
    while let Some(batch) = reader.next_batch() {
        let batch = batch.map_err(|e| e.to_string())?;
        rows += batch.targets.rows;
        let isorun_protocol::TensorData::Dense(bytes) = &batch.output.1.data else { panic!("dense") };
        values.extend_from_slice(bytes);
    }
    Ok((rows, values))
}

#[test]
fn a_rescore_predictions_line_of_zeros_costs_a_small_multiple_of_its_bytes() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = write_predictions(dir.path(), 4, 3);
    // Read as written.
    let (result, _) = bounded(&path, || read_predictions(&path));
    let expected: Vec<u8> = (0..12).flat_map(|i| (i as f32).to_le_bytes()).collect();
    assert_eq!(result, Ok((3, expected)));
    // The same description, and a line of 30 million zeros for its 4-wide output (60 MiB).
    let text = std::fs::read_to_string(&path).unwrap();
    let first = text.lines().next().unwrap();
    let head = &first[..first.find("\"output:p\":").unwrap()];
    let mut line = head.as_bytes().to_vec();
    line.extend_from_slice(b"\"output:p\":[");
    let n = 30usize << 20;
    for i in 0..n {
        line.extend_from_slice(if i == 0 { b"0" } else { b",0" });
    }
    line.extend_from_slice(b"]}\n");
    std::fs::write(&path, &line).unwrap();
    drop(line);
    let (result, peak) = bounded(&path, || read_predictions(&path));
    let error = result.unwrap_err();
    assert!(error.contains(&path.display().to_string()) && error.contains("line 1"), "{error}");
    assert!(error.contains("'output:p' has more than 4 values, eval wrote 4"), "{error}");
    // The line and little more.
    assert!(peak < 80 << 20, "{peak}");
    // A line past the line cap (no newline: 65 MiB of NUL bytes) is an error naming the cap.
    std::fs::write(&path, b"{\"index\":").unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(65 << 20).unwrap();
    let (result, peak) = bounded(&path, || read_predictions(&path));
    let error = result.unwrap_err();
    assert!(error.contains("line 1") && error.contains(&format!("longer than {} bytes", 64 << 20)), "{error}");
    assert!(peak < 80 << 20, "{peak}");
}
