//! Compressed Arrow IPC files (what pandas' `to_feather()` writes by
//! default: lz4; zstd on request) read whole, and within the allocation
//! bound (see `isorun-alloc-bound`) however their buffers lie about what
//! they decompress to: a claimed length is refused past the reader's limit
//! before arrow-ipc allocates it, and a real bomb (zeros compressed a
//! thousandfold) is refused the same way. Every test measures, and holds
//! `serial()` for its whole body: writing the bomb's 192 MiB outside a
//! measurement would count in another test's.

use arrow_array::{Int64Array, RecordBatch};
use arrow_ipc::writer::{FileWriter, IpcWriteOptions, StreamWriter};
use arrow_ipc::CompressionType;
use isorun_alloc_bound::{bounded, mutations};
use isorun_eval::{DataSpec, Dataset};
use isorun_protocol::{DType, SignatureInfo};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::serial;
use super::util::{self, data_spec, tensor};

fn table(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/eval/data/tables").join(name)
}

fn spec(path: &Path, label: &str) -> DataSpec {
    data_spec(vec![path.to_path_buf()], label, 128)
}

fn signature(input: &str, dtype: DType, shape: Vec<Option<u64>>) -> SignatureInfo {
    util::signature(vec![tensor(input, dtype, &shape)], vec![])
}

/// Reads every batch of `path` (within the bound): the rows read, or the
/// first error's message.
fn read_all(path: &Path, label: &str, signature: &SignatureInfo) -> Result<u64, String> {
    let n = std::fs::metadata(path).unwrap().len();
    bounded(&path.display().to_string(), n, || {
        let dataset = Dataset::open(spec(path, label)).map_err(|e| e.to_string())?;
        let mut reader = dataset.reader(signature).map_err(|e| e.to_string())?;
        let mut rows = 0u64;
        while let Some(batch) = reader.next_batch() {
            rows += batch.map_err(|e| e.to_string())?.targets.rows as u64;
        }
        Ok(rows)
    })
}

#[test]
fn lz4_and_zstd_feather_files_read_whole_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let features = signature("x", DType::Float32, vec![None, Some(4)]);
    let dir = tempfile::tempdir().unwrap();
    for (seed, name) in ["lz4.feather", "zstd.feather"].into_iter().enumerate() {
        assert_eq!(read_all(&table(name), "label_bin", &features), Ok(1000), "{name}");
        let bytes = std::fs::read(table(name)).unwrap();
        let path = dir.path().join(name);
        for mutated in mutations(&bytes, seed as u64, 100) {
            std::fs::write(&path, &mutated).unwrap();

            let _ = read_all(&path, "label_bin", &features);
        }
    }
}

/// `rows` rows of `x` and `y` (int64, `value` in every row) written as an
/// IPC file or stream, its buffers compressed with `codec`.
fn compressed(path: &Path, rows: usize, value: i64, codec: CompressionType, file_format: bool) {
    let column = Arc::new(Int64Array::from(vec![value; rows]));
    let batch = RecordBatch::try_from_iter([("x", column.clone() as _), ("y", column as _)]).unwrap();
    let options = IpcWriteOptions::default().try_with_compression(Some(codec)).unwrap();
    let out = std::fs::File::create(path).unwrap();
    if file_format {
        let mut writer = FileWriter::try_new_with_options(out, &batch.schema(), options).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
    } else {
        let mut writer = StreamWriter::try_new_with_options(out, &batch.schema(), options).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
    }
}

#[test]
fn a_compressed_buffer_claiming_a_terabyte_is_an_error_naming_the_file_not_an_allocation() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let ints = signature("x", DType::Int64, vec![None]);
    // 1,003 rows of a counter-like value: each data buffer claims 8,024 bytes.
    let rows = 1003usize;
    let honest = (rows as i64 * 8).to_le_bytes();
    for codec in [CompressionType::LZ4_FRAME, CompressionType::ZSTD] {
        for file_format in [false, true] {
            let name = format!("{codec:?}-{}.arrow", if file_format { "file" } else { "stream" });
            let path = dir.path().join(&name);
            compressed(&path, rows, 7, codec, file_format);
            assert_eq!(read_all(&path, "y", &ints), Ok(rows as u64), "{name} as written");
            let mut bytes = std::fs::read(&path).unwrap();
            let prefixes: Vec<usize> =
                bytes.windows(8).enumerate().filter(|(_, w)| *w == honest).map(|(i, _)| i).collect();
            assert_eq!(prefixes.len(), 2, "{name}: the two data buffers' prefixes");
            bytes[prefixes[0]..prefixes[0] + 8].copy_from_slice(&(1i64 << 40).to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
            let error = read_all(&path, "y", &ints).unwrap_err();
            assert!(
                error.contains(&name)
                    && error.contains("claims its compressed buffers decompress to 1099511635800 bytes")
                    && error.contains("write it in smaller record batches"),
                "{name}: {error}"
            );
        }
    }
}

#[test]
fn zeros_compressed_a_thousandfold_are_refused_within_the_bound() {
    let _serial = serial();
    // 96 MiB of zeros in each of two columns take a few kilobytes in zstd:
    // more than a small file may decompress to at once.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bomb.arrow");
    compressed(&path, 12 << 20, 0, CompressionType::ZSTD, true);
    let n = std::fs::metadata(&path).unwrap().len();
    assert!(n < 1 << 20, "{n} bytes");
    let error = read_all(&path, "y", &signature("x", DType::Int64, vec![None])).unwrap_err();
    assert!(error.contains("bomb.arrow") && error.contains("claims its compressed buffers"), "{error}");
}
