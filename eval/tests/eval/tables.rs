//! Parquet and Arrow IPC through the public API: every column type the
//! sources read feeds the signature's dtype and shape (scalars, fixed-size
//! and equal-length lists, lists of lists, bool, float16, uint64,
//! dictionary strings as inputs and as slices), and truncated, byte-flipped
//! or hostile files are errors naming the file, never a panic.

use arrow_array::builder::{FixedSizeListBuilder, Float32Builder, ListBuilder, StringDictionaryBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, BooleanArray, Float16Array, Int64Array, LargeStringArray, RecordBatch, StringArray, UInt64Array,
};
use arrow_ipc::writer::{FileWriter, StreamWriter};
use arrow_schema::Schema;
use isorun_eval::{DataError, DataSpec, Dataset, Labels};
use isorun_protocol::{DType, SignatureInfo, TensorData};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::util::{self, data_spec, tensor};

const ROWS: usize = 10;

/// A batch of every readable kind of column.
fn batch() -> RecordBatch {
    let mut fixed = FixedSizeListBuilder::new(Float32Builder::new(), 2);
    let mut nested = ListBuilder::new(ListBuilder::new(Float32Builder::new()));
    let mut group = StringDictionaryBuilder::<Int32Type>::new();
    for i in 0..ROWS {
        fixed.values().append_slice(&[i as f32, -(i as f32)]);
        fixed.append(true);
        for j in 0..2 {
            nested.values().values().append_slice(&[i as f32, j as f32, 0.5]);
            nested.values().append(true);
        }
        nested.append(true);
        group.append_value(if i % 3 == 0 { "a" } else { "b" });
    }
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("label", Arc::new(Int64Array::from_iter_values((0..ROWS as i64).map(|i| i % 2)))),
        ("flag", Arc::new(BooleanArray::from_iter((0..ROWS).map(|i| Some(i % 2 == 1))))),
        ("half", Arc::new(Float16Array::from_iter_values((0..ROWS).map(|i| half::f16::from_f32(i as f32))))),
        ("big", Arc::new(UInt64Array::from_iter_values((0..ROWS as u64).map(|i| i * 1000)))),
        ("fixed", Arc::new(fixed.finish())),
        ("nested", Arc::new(nested.finish())),
        ("group", Arc::new(group.finish())),
        ("text", Arc::new(LargeStringArray::from_iter_values((0..ROWS).map(|i| format!("t{i}"))))),
        ("name", Arc::new(StringArray::from_iter_values((0..ROWS).map(|i| format!("n{i}"))))),
    ];
    RecordBatch::try_from_iter(columns).unwrap()
}

fn write(dir: &Path, name: &str, batch: &RecordBatch) -> PathBuf {
    let path = dir.join(name);
    let file = std::fs::File::create(&path).unwrap();
    let schema: Arc<Schema> = batch.schema();
    if name.ends_with(".parquet") {
        let properties = WriterProperties::builder().set_max_row_group_row_count(Some(3)).build();
        let mut writer = ArrowWriter::try_new(file, schema, Some(properties)).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
    } else if name.ends_with(".feather") {
        let mut writer = FileWriter::try_new(file, &schema).unwrap();
        writer.write(&batch.slice(0, 4)).unwrap();
        writer.write(&batch.slice(4, ROWS - 4)).unwrap();
        writer.finish().unwrap();
    } else {
        let mut writer = StreamWriter::try_new(file, &schema).unwrap();
        writer.write(&batch.slice(0, 4)).unwrap();
        writer.write(&batch.slice(4, ROWS - 4)).unwrap();
        writer.finish().unwrap();
    }
    path
}

fn spec(path: &Path) -> DataSpec {
    DataSpec {
        weight: Some("big".into()),
        slices: vec!["group".into(), "fixed".into()],
        renames: vec![("flag_in".into(), "flag".into())],
        ..data_spec(vec![path.to_path_buf()], "label", 4)
    }
}

fn signature() -> SignatureInfo {
    util::signature(
        vec![
            tensor("flag_in", DType::Float32, &[None, Some(1)]),
            tensor("half", DType::Float32, &[None]),
            tensor("fixed", DType::Float64, &[None, Some(2)]),
            tensor("nested", DType::Float32, &[None, None, Some(3)]),
            tensor("group", DType::String, &[None]),
            tensor("text", DType::String, &[None]),
        ],
        vec![],
    )
}

fn floats(data: &TensorData, size: usize) -> Vec<f64> {
    let TensorData::Dense(bytes) = data else { panic!("dense") };
    bytes
        .chunks_exact(size)
        .map(|c| {
            if size == 4 {
                f64::from(f32::from_le_bytes(c.try_into().unwrap()))
            } else {
                f64::from_le_bytes(c.try_into().unwrap())
            }
        })
        .collect()
}

/// Reads every batch (an error is returned, a panic is not caught here).
fn read_all(path: &Path) -> Result<Vec<isorun_eval::Batch>, DataError> {
    let dataset = Dataset::open(spec(path))?;
    let mut reader = dataset.reader(&signature())?;
    let mut batches = Vec::new();
    while let Some(batch) = reader.next_batch() {
        batches.push(batch?);
    }
    Ok(batches)
}

#[test]
fn every_column_type_feeds_the_signature_s_dtype_and_shape() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["t.parquet", "t.arrow", "t.feather"] {
        let path = write(dir.path(), name, &batch());
        let batches = read_all(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(batches.iter().map(|b| b.targets.rows).collect::<Vec<_>>(), [4, 4, 2], "{name}");
        let first = &batches[0];
        let get = |input: &str| &first.inputs.iter().find(|(n, _)| n == input).unwrap().1;
        assert_eq!(get("flag_in").shape, [4, 1], "{name}");
        assert_eq!(floats(&get("flag_in").data, 4), [0.0, 1.0, 0.0, 1.0], "{name}: bool as float");
        assert_eq!(floats(&get("half").data, 4), [0.0, 1.0, 2.0, 3.0], "{name}: float16");
        assert_eq!(get("fixed").shape, [4, 2], "{name}");
        assert_eq!(floats(&get("fixed").data, 8)[..4], [0.0, -0.0, 1.0, -1.0], "{name}: fixed-size list as f64");
        assert_eq!(get("nested").shape, [4, 2, 3], "{name}: lists of lists");
        assert_eq!(floats(&get("nested").data, 4)[..6], [0.0, 0.0, 0.5, 0.0, 1.0, 0.5], "{name}");
        let TensorData::Strings(groups) = &get("group").data else { panic!("strings") };
        let groups: Vec<&[u8]> = groups.iter().map(|s| s.as_slice()).collect();
        assert_eq!(groups, [b"a", b"b", b"b", b"a"], "{name}: dictionary strings as an input");
        let TensorData::Strings(texts) = &get("text").data else { panic!("strings") };
        assert_eq!(texts[3].as_slice(), b"t3", "{name}: large utf8");
        assert_eq!(first.targets.labels, Labels::Int(vec![0, 1, 0, 1]), "{name}");
        assert_eq!(first.targets.weights, Some(vec![0.0, 1000.0, 2000.0, 3000.0]), "{name}: uint64 weights");
        assert_eq!(first.targets.slices[0].1, ["a", "b", "b", "a"], "{name}: dictionary strings as a slice");
        assert_eq!(first.targets.slices[1].1[1], "1,-1", "{name}: a list slice");
    }
}

#[test]
fn a_column_that_does_not_fit_names_the_file_column_and_row() {
    let dir = tempfile::tempdir().unwrap();
    // Lists of 2 values, but 3 in row 5.
    let mut ragged = ListBuilder::new(Float32Builder::new());
    for i in 0..ROWS {
        ragged.values().append_slice(if i == 5 { &[1.0, 2.0, 3.0] } else { &[1.0, 2.0] });
        ragged.append(true);
    }
    let mut columns: Vec<(String, ArrayRef)> =
        batch().schema().fields().iter().map(|f| f.name().clone()).zip(batch().columns().iter().cloned()).collect();
    columns.retain(|(n, _)| n != "fixed");
    columns.push(("fixed".into(), Arc::new(ragged.finish())));
    let ragged = RecordBatch::try_from_iter(columns).unwrap();
    for name in ["r.parquet", "r.arrow"] {
        let path = write(dir.path(), name, &ragged);
        let error = read_all(&path).unwrap_err().to_string();
        assert!(
            error.contains(&format!("{name}: column 'fixed': row 5 (0-based in the file): a list of 3")),
            "{error}"
        );
    }
    // A null label.
    let mut columns: Vec<(String, ArrayRef)> =
        batch().schema().fields().iter().map(|f| f.name().clone()).zip(batch().columns().iter().cloned()).collect();
    columns[0].1 = Arc::new(Int64Array::from_iter((0..ROWS as i64).map(|i| (i != 7).then_some(i % 2))));
    let nulls = RecordBatch::try_from_iter(columns).unwrap();
    for name in ["n.parquet", "n.feather"] {
        let path = write(dir.path(), name, &nulls);
        let error = read_all(&path).unwrap_err().to_string();
        assert!(error.contains(&format!("{name}: column 'label': row 7 (0-based in the file): is null")), "{error}");
    }
}

#[test]
fn truncated_flipped_and_hostile_files_are_errors_naming_the_file_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["h.parquet", "h.arrow", "h.feather"] {
        let good = std::fs::read(write(dir.path(), name, &batch())).unwrap();
        let path = dir.path().join(format!("bad-{name}"));
        let mut cases: Vec<Vec<u8>> = (0..good.len()).step_by(7).map(|n| good[..n].to_vec()).collect();
        for at in (0..good.len()).step_by(5) {
            let mut flipped = good.clone();
            flipped[at] ^= 0xff;
            cases.push(flipped);
        }
        // A footer length that claims 4 GiB (a stream has no footer: a
        // message claiming 4 GiB of metadata instead).
        let mut huge = good.clone();
        let n = huge.len();
        let at = if name.ends_with(".parquet") {
            n - 8
        } else if name.ends_with(".feather") {
            n - 10
        } else {
            4
        };
        huge[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        cases.push(huge);
        for (i, bytes) in cases.iter().enumerate() {
            std::fs::write(&path, bytes).unwrap();
            let result = std::panic::catch_unwind(|| read_all(&path).map(|b| b.len()));
            match result {
                Err(_) => panic!("{name} case {i}: a panic reached the caller"),
                Ok(Err(e)) => {
                    let text = e.to_string();
                    assert!(text.contains(&format!("bad-{name}")), "{name} case {i}: {text}");
                }
                Ok(Ok(_)) => {}
            }
        }
        let error = read_all(&path).unwrap_err().to_string();
        assert!(
            error.contains("footer claims") || error.contains("claims 4294967295 bytes of metadata"),
            "{name}: {error}"
        );
    }
}

/// A Parquet file of a few rows whose `blob` column is one zstd page that
/// decompresses to `blob_bytes` zeros: a few KB on disk.
fn bomb(dir: &Path, blob_bytes: usize) -> PathBuf {
    use arrow_array::BinaryArray;
    use parquet::basic::{Compression, ZstdLevel};
    let zeros = vec![0u8; blob_bytes];
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("label", Arc::new(Int64Array::from_iter_values([0, 1]))),
        ("x", Arc::new(arrow_array::Float32Array::from_iter_values([0.5, 1.5]))),
        ("blob", Arc::new(BinaryArray::from_iter_values([&zeros[..], b"small"]))),
    ];
    drop(zeros);
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()))
        .set_dictionary_enabled(false)
        .set_statistics_enabled(parquet::file::properties::EnabledStatistics::None)
        .set_data_page_size_limit(usize::MAX / 2)
        .build();
    let path = dir.join("bomb.parquet");
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    path
}

#[test]
fn a_page_that_decompresses_past_the_cap_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    // Past the most any file's page may take (256 MiB), and so past a small
    // file's cap: eight times the file, at least 32 MiB.
    let path = bomb(dir.path(), (256 << 20) + 1);
    let on_disk = std::fs::metadata(&path).unwrap().len();
    assert!(on_disk < 1 << 20, "the bomb is small on disk: {on_disk} bytes");
    let cap = 32 << 20;
    let spec = |slices: Vec<String>| DataSpec { weight: None, slices, renames: vec![], ..spec(&path) };
    let sig = |inputs| util::signature(inputs, vec![]);
    let read = |spec: DataSpec, sig: SignatureInfo| -> Result<usize, DataError> {
        let dataset = Dataset::open(spec)?;
        let mut reader = dataset.reader(&sig)?;
        let mut rows = 0;
        while let Some(batch) = reader.next_batch() {
            rows += batch?.targets.rows;
        }
        Ok(rows)
    };
    // Read as an input: refused, naming the row group, column, page and sizes.
    let err = read(spec(vec![]), sig(vec![tensor("blob", DType::String, &[None])])).unwrap_err().to_string();
    assert!(
        err.contains("bomb.parquet")
            && err.contains("row group 0 column 'blob' page 0")
            && err.contains("claims to decompress to")
            && err.contains(&format!("more than the {cap} a page of a {on_disk}-byte file may take")),
        "{err}"
    );
    // As a slice too (slices are read as text).
    let err = read(spec(vec!["blob".into()]), sig(vec![tensor("x", DType::Float32, &[None])])).unwrap_err();
    assert!(err.to_string().contains("column 'blob'"), "{err}");
    // The pages of a column not read are not checked: the other columns read.
    assert_eq!(read(spec(vec![]), sig(vec![tensor("x", DType::Float32, &[None])])).unwrap(), 2);
}

#[test]
fn a_page_just_under_the_cap_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = bomb(dir.path(), 8 << 20);
    let spec = DataSpec { weight: None, slices: vec![], renames: vec![], ..spec(&path) };
    let dataset = Dataset::open(spec).unwrap();
    let sig = util::signature(vec![tensor("blob", DType::String, &[None])], vec![]);
    let mut reader = dataset.reader(&sig).unwrap();
    let batch = reader.next_batch().unwrap().unwrap();
    let TensorData::Strings(strings) = &batch.inputs[0].1.data else { panic!("strings") };
    assert_eq!(strings[0].len(), 8 << 20);
    assert_eq!(&strings[1][..], b"small");
}
