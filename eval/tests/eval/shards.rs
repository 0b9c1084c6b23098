//! Data shards (`DataSpec::shard`): for every format, the N shards of a
//! dataset hold each example exactly once, in file order within each
//! shard, whether whole files go round robin (at least N files) or each
//! file is split into N parts (fewer), including files with fewer examples
//! than N and empty ones.

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_ipc::writer::{FileWriter, StreamWriter};
use arrow_schema::{DataType, Field, Schema};
use isorun_eval::example::{Example, Feature};
use isorun_eval::tfrecord::write_record;
use isorun_eval::{DataShard, DataSpec, Dataset, Labels};
use isorun_protocol::{DType, TensorData};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::util::{self, data_spec, tensor};

#[derive(Debug, Clone, Copy)]
enum Kind {
    TfRecord,
    TfRecordGzip,
    Npz,
    NpzDeflated,
    NpyFolder,
    Csv,
    /// Row groups of 2 rows.
    Parquet,
    /// Record batches of 2 rows.
    ArrowStream,
    ArrowFile,
    Jsonl,
    JsonlGzip,
}

const KINDS: [Kind; 11] = [
    Kind::TfRecord,
    Kind::TfRecordGzip,
    Kind::Npz,
    Kind::NpzDeflated,
    Kind::NpyFolder,
    Kind::Csv,
    Kind::Parquet,
    Kind::ArrowStream,
    Kind::ArrowFile,
    Kind::Jsonl,
    Kind::JsonlGzip,
];

/// The ids as a label column and a string column, in batches of 2 rows.
fn record_batches(ids: &[i64]) -> (Arc<Schema>, Vec<RecordBatch>) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("label", DataType::Int64, false),
        Field::new("pad", DataType::Utf8, false),
    ]));
    let batches = ids
        .chunks(2)
        .map(|ids| {
            let pads: Vec<String> = ids.iter().map(|id| "q".repeat((*id as usize * 7) % 13)).collect();
            let columns: Vec<ArrayRef> =
                vec![Arc::new(Int64Array::from(ids.to_vec())), Arc::new(StringArray::from(pads))];
            RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
        })
        .collect();
    (schema, batches)
}

/// JSON Lines of different lengths (so that byte ranges fall inside lines),
/// with blank lines and a `\r\n` line end between some of them.
fn jsonl(ids: &[i64]) -> Vec<u8> {
    let mut text = String::new();
    for &id in ids {
        let pad = "p".repeat((id as usize * 37) % 301);
        text.push_str(&format!("{{\"pad\": \"{pad}\", \"label\": {id}}}"));
        text.push_str(match id % 3 {
            0 => "\n",
            1 => "\r\n\n",
            _ => "\n  \n",
        });
    }
    text.into_bytes()
}

/// Records of different sizes, so that byte ranges fall inside records.
fn tfrecords(ids: &[i64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &id in ids {
        let pad = vec![b'p'; (id as usize * 37) % 301];
        let example = Example::new([
            ("label".to_string(), Feature::ints(vec![id])),
            ("pad".to_string(), Feature::bytes(vec![pad])),
        ]);
        write_record(&mut out, &example.encode_to_vec());
    }
    out
}

fn npy_i64(ids: &[i64]) -> Vec<u8> {
    let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    super::util::npy("<i8", &[ids.len() as u64], &bytes)
}

/// Writes one file (or folder) of `kind` holding examples `ids`.
fn write_file(dir: &Path, index: usize, kind: Kind, ids: &[i64]) -> PathBuf {
    let name = |ext: &str| dir.join(format!("part-{index:02}{ext}"));
    match kind {
        Kind::TfRecord => {
            let path = name(".tfrecord");
            std::fs::write(&path, tfrecords(ids)).unwrap();
            path
        }
        Kind::TfRecordGzip => {
            let path = name(".tfrecord.gz");
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&tfrecords(ids)).unwrap();
            std::fs::write(&path, e.finish().unwrap()).unwrap();
            path
        }
        Kind::Npz | Kind::NpzDeflated => {
            let path = name(".npz");
            let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
            let method = match kind {
                Kind::Npz => zip::CompressionMethod::Stored,
                _ => zip::CompressionMethod::Deflated,
            };
            let options = zip::write::SimpleFileOptions::default().compression_method(method);
            zip.start_file("label.npy", options).unwrap();
            zip.write_all(&npy_i64(ids)).unwrap();
            zip.finish().unwrap();
            path
        }
        Kind::NpyFolder => {
            let path = name("");
            std::fs::create_dir(&path).unwrap();
            std::fs::write(path.join("label.npy"), npy_i64(ids)).unwrap();
            path
        }
        Kind::Csv => {
            let path = name(".csv");
            let mut text = String::from("label,pad\n");
            for id in ids {
                text.push_str(&format!("{id},\"{}\"\n", "q,".repeat((*id as usize * 7) % 13)));
            }
            std::fs::write(&path, text).unwrap();
            path
        }
        Kind::Parquet => {
            let path = name(".parquet");
            let (schema, batches) = record_batches(ids);
            let properties = WriterProperties::builder().set_max_row_group_row_count(Some(2)).build();
            let file = std::fs::File::create(&path).unwrap();
            let mut writer = ArrowWriter::try_new(file, schema, Some(properties)).unwrap();
            for batch in &batches {
                writer.write(batch).unwrap();
                writer.flush().unwrap();
            }
            writer.close().unwrap();
            path
        }
        Kind::ArrowStream => {
            let path = name(".arrow");
            let (schema, batches) = record_batches(ids);
            let mut writer = StreamWriter::try_new(std::fs::File::create(&path).unwrap(), &schema).unwrap();
            for batch in &batches {
                writer.write(batch).unwrap();
            }
            writer.finish().unwrap();
            path
        }
        Kind::ArrowFile => {
            let path = name(".feather");
            let (schema, batches) = record_batches(ids);
            let mut writer = FileWriter::try_new(std::fs::File::create(&path).unwrap(), &schema).unwrap();
            for batch in &batches {
                writer.write(batch).unwrap();
            }
            writer.finish().unwrap();
            path
        }
        Kind::Jsonl => {
            let path = name(".jsonl");
            std::fs::write(&path, jsonl(ids)).unwrap();
            path
        }
        Kind::JsonlGzip => {
            let path = name(".jsonl.gz");
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(&jsonl(ids)).unwrap();
            std::fs::write(&path, gz.finish().unwrap()).unwrap();
            path
        }
    }
}

fn spec(paths: Vec<PathBuf>, shard: Option<DataShard>, limit: Option<u64>) -> DataSpec {
    DataSpec { limit, shard, ..data_spec(paths, "label", 3) }
}

/// The example ids a (sharded) dataset yields, in order; fed to an int64 input
/// too, so both the inputs and the targets are checked.
fn read_ids(spec: DataSpec) -> Vec<i64> {
    let dataset = Dataset::open(spec).unwrap();
    let signature = util::signature(vec![tensor("label", DType::Int64, &[None])], vec![]);
    let mut reader = dataset.reader(&signature).unwrap();
    let mut ids = Vec::new();
    while let Some(batch) = reader.next_batch() {
        let batch = batch.unwrap();
        let Labels::Int(labels) = &batch.targets.labels else { panic!("int labels") };
        let TensorData::Dense(bytes) = &batch.inputs[0].1.data else { panic!("dense input") };
        let fed: Vec<i64> = bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(&fed, labels, "inputs and labels agree");
        ids.extend_from_slice(labels);
    }
    ids
}

/// Datasets as the example counts of their files; ids run on across files.
const LAYOUTS: &[&[usize]] = &[&[1], &[2], &[5], &[40], &[3, 1], &[6, 0, 4], &[1, 2, 3, 4, 5, 6, 7, 8]];

#[test]
fn the_shards_of_every_format_hold_each_example_once_in_file_order() {
    for kind in KINDS {
        for layout in LAYOUTS {
            let dir = tempfile::tempdir().unwrap();
            let mut next = 0;
            let paths: Vec<PathBuf> = layout
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let ids: Vec<i64> = (next..next + n as i64).collect();
                    next += n as i64;
                    write_file(dir.path(), i, kind, &ids)
                })
                .collect();
            let all = read_ids(spec(paths.clone(), None, None));
            assert_eq!(all, (0..next).collect::<Vec<_>>(), "{kind:?} {layout:?}: unsharded");
            for count in [1, 2, 3, 7] {
                let mut union = Vec::new();
                for index in 0..count {
                    let ids = read_ids(spec(paths.clone(), Some(DataShard { index, count }), None));
                    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{kind:?} {layout:?} {index}/{count}: {ids:?}");
                    union.extend(ids);
                }
                union.sort();
                assert_eq!(union, all, "{kind:?} {layout:?}: the {count} shards together");
            }
        }
    }
}

#[test]
fn a_limit_counts_the_shards_own_examples_and_the_digest_names_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), 0, Kind::TfRecord, &(0..30).collect::<Vec<_>>());
    let second = Some(DataShard { index: 1, count: 3 });
    let ids = read_ids(spec(vec![path.clone()], second, None));
    assert_eq!(ids.len(), 10, "a third of similar records: {ids:?}");
    assert_eq!(read_ids(spec(vec![path.clone()], second, Some(4))), ids[..4]);
    let digest = |shard| Dataset::open(spec(vec![path.clone()], shard, None)).unwrap().digest();
    assert_ne!(digest(None), digest(second));
    assert_ne!(digest(Some(DataShard { index: 0, count: 3 })), digest(second));
}

#[test]
fn a_tfrecord_part_resynchronises_on_record_boundaries_at_any_offset() {
    // Every split point of a small file, through the public API: N = bytes,
    // so some part starts at every byte of the file.
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<i64> = (0..6).collect();
    let path = write_file(dir.path(), 0, Kind::TfRecord, &ids);
    let count = std::fs::metadata(&path).unwrap().len();
    let mut union = Vec::new();
    for index in 0..count {
        union.extend(read_ids(spec(vec![path.clone()], Some(DataShard { index, count }), None)));
    }
    assert_eq!(union, ids, "in order, each once");
}

#[test]
fn a_jsonl_part_holds_the_lines_that_start_in_it_at_any_offset() {
    // N = bytes: some part starts at every byte of the file, inside lines,
    // on line ends and on blank lines; each line is read once, in order.
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<i64> = (0..7).collect();
    let path = write_file(dir.path(), 0, Kind::Jsonl, &ids);
    let count = std::fs::metadata(&path).unwrap().len();
    let mut union = Vec::new();
    for index in 0..count {
        union.extend(read_ids(spec(vec![path.clone()], Some(DataShard { index, count }), None)));
    }
    assert_eq!(union, ids, "in order, each once");
}
