//! The allocation bound (see `isorun-alloc-bound`) for the dataset readers
//! the supervisor runs on user files and that `reader_bounds.rs` does not
//! cover: `.npz` datasets, folders of `.npy`, TFRecord files (plain and
//! gzip) and the `tf.Example` records in them. Each is fed real fixtures, a
//! few hundred seeded mutations of each, and files that claim far more than
//! they hold, and read as `isorun eval` reads them (several signatures, a
//! few batches, with prefetch). For gzip, N is the decompressed stream's
//! length: a record may be as large as `MAX_GZIP_RECORD` whatever it
//! compressed to. Every test measures, each holding `serial()` (the count
//! is process-wide).

use isorun_alloc_bound::{bounded, mutations};
use isorun_eval::example::{BytesList, Example, Feature, Features, Kind};
use isorun_eval::tfrecord::{masked_crc32c, write_record};
use isorun_eval::{DataError, DataSpec, Dataset};
use isorun_protocol::{DType, SignatureInfo, TensorSpec};
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::serial;
use super::util::data_spec;

const MUTATIONS: usize = 200;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

fn data(name: &str) -> PathBuf {
    repo().join("tests/fixtures/eval/data").join(name)
}

fn spec(path: &Path, label: &str, other: Option<&str>) -> DataSpec {
    DataSpec {
        weight: other.map(str::to_string),
        slices: other.iter().map(|s| s.to_string()).collect(),
        limit: Some(64),
        ..data_spec(vec![path.to_path_buf()], label, 7)
    }
}

fn input(name: &str, dtype: DType, shape: Option<Vec<Option<u64>>>) -> TensorSpec {
    TensorSpec { name: name.to_string(), dtype, shape }
}

/// Opens the dataset at `path` and reads a few batches for several
/// signatures over its features, as the fuzz targets do; failures are fine,
/// allocations past the bound are not.
fn read_dataset(path: &Path) {
    // A label nobody has: the error lists what there is.
    let available = match Dataset::open(spec(path, "\u{0}", None)) {
        Err(DataError::MissingFeature { available, .. }) => available,
        _ => return,
    };
    let names: Vec<String> = if available == "nothing" {
        Vec::new()
    } else {
        available.split("), ").filter_map(|e| e.rfind(" (").map(|i| e[..i].to_string())).take(4).collect()
    };
    let Some(label) = names.first() else { return };
    let second = names.get(1).map(String::as_str);
    let Some(dataset) = second
        .and_then(|other| Dataset::open(spec(path, label, Some(other))).ok())
        .or_else(|| Dataset::open(spec(path, label, None)).ok())
    else {
        return;
    };
    let all = |dtype: DType, shape: Option<Vec<Option<u64>>>| -> Vec<TensorSpec> {
        names.iter().map(|n| input(n, dtype, shape.clone())).collect()
    };
    let signatures = [
        all(DType::Float32, None),
        all(DType::Int64, Some(vec![None])),
        all(DType::Float64, Some(vec![None, None])),
        vec![input(label, DType::String, Some(vec![None]))],
        vec![input("\u{0}records", DType::String, Some(vec![None]))],
    ];
    for (i, inputs) in signatures.into_iter().enumerate() {
        let signature = SignatureInfo { key: "serving_default".into(), inputs, outputs: Vec::new() };
        let Ok(reader) = dataset.reader(&signature) else { continue };
        let mut reader = if i == 0 { reader.prefetch(2) } else { reader };
        for _ in 0..3 {
            match reader.next_batch() {
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            }
        }
    }
}

fn len(path: &Path) -> u64 {
    if path.is_dir() {
        std::fs::read_dir(path).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
    } else {
        std::fs::metadata(path).unwrap().len()
    }
}

/// Reads `bytes` as a dataset file named `name` in `dir`.
fn read_bytes(label: &str, name: &str, bytes: &[u8], dir: &Path) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    bounded(label, bytes.len() as u64, || read_dataset(&path));
}

fn fixtures_and_mutations(fixtures: &[PathBuf], name: &str, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    for (i, fixture) in fixtures.iter().enumerate() {
        let bytes = std::fs::read(fixture).unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
        read_bytes(&fixture.display().to_string(), name, &bytes, dir.path());
        for (m, mutated) in mutations(&bytes, seed + i as u64, MUTATIONS).enumerate() {
            read_bytes(&format!("{} mutation {m}", fixture.display()), name, &mutated, dir.path());
        }
    }
}

fn seeds(target: &str) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> =
        std::fs::read_dir(repo().join("fuzz/seeds").join(target)).unwrap().map(|e| e.unwrap().path()).collect();
    all.sort();
    all
}

#[test]
fn npz_datasets_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let mut fixtures = vec![data("data.npz")];
    fixtures.extend(seeds("eval_npz"));
    fixtures_and_mutations(&fixtures, "x.npz", 0);
}

#[test]
fn npy_folders_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("npy");
    std::fs::create_dir(&folder).unwrap();
    let mut names: Vec<PathBuf> = std::fs::read_dir(data("npy")).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    for path in &names {
        std::fs::copy(path, folder.join(path.file_name().unwrap())).unwrap();
    }
    bounded("the npy fixture folder", len(&folder), || read_dataset(&folder));
    for (i, path) in names.iter().enumerate() {
        let target = folder.join(path.file_name().unwrap());
        let original = std::fs::read(path).unwrap();
        for (m, mutated) in mutations(&original, 100 + i as u64, MUTATIONS).enumerate() {
            std::fs::write(&target, &mutated).unwrap();
            bounded(&format!("{} mutation {m}", path.display()), len(&folder), || read_dataset(&folder));
        }
        std::fs::write(&target, &original).unwrap();
    }
}

#[test]
fn tfrecord_datasets_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let mut fixtures = vec![
        data("data.tfrecord"),
        data("corrupt.tfrecord"),
        data("truncated.tfrecord"),
        data("shards/part-00001.tfrecord"),
        repo().join("examples/eval/iris.tfrecord"),
    ];
    fixtures.extend(seeds("tfrecord").into_iter().filter(|p| !p.to_string_lossy().ends_with(".gz")));
    fixtures_and_mutations(&fixtures, "x.tfrecord", 200);
}

#[test]
fn gzip_tfrecord_datasets_and_their_mutations_stay_within_the_bound() {
    let _serial = serial();
    let fixtures = [data("data.tfrecord.gz"), repo().join("fuzz/seeds/tfrecord/four.tfrecord.gz")];
    fixtures_and_mutations(&fixtures, "x.tfrecord.gz", 300);
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// A record header claiming `claimed` bytes, with a good length CRC.
fn lying_header(claimed: u64) -> Vec<u8> {
    let mut bytes = claimed.to_le_bytes().to_vec();
    bytes.extend_from_slice(&masked_crc32c(&claimed.to_le_bytes()).to_le_bytes());
    bytes
}

#[test]
fn tfrecord_lengths_that_claim_more_than_the_file_holds_stay_within_the_bound() {
    let _serial = serial();
    read_lying_lengths(&[1 << 40, 255 << 20, 64 << 20]);
}

#[test]
fn a_tfrecord_length_of_u64_max_stays_within_the_bound() {
    let _serial = serial();
    read_lying_lengths(&[u64::MAX]);
}

/// A good file, then a record header claiming each of `claims` bytes, read
/// plain and gzip-compressed.
fn read_lying_lengths(claims: &[u64]) {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(data("data.tfrecord")).unwrap();
    for &claimed in claims {
        let mut bytes = good.clone();
        bytes.extend_from_slice(&lying_header(claimed));
        bytes.extend_from_slice(&[0; 100]);
        let label = format!("a record claiming {claimed} bytes");
        read_bytes(&label, "x.tfrecord", &bytes, dir.path());
        // Gzip: nothing says how long the stream is; N is its decompressed length.
        let compressed = gzip(&bytes);
        let path = dir.path().join("x.tfrecord.gz");
        std::fs::write(&path, &compressed).unwrap();
        bounded(&format!("{label} (gzip)"), bytes.len() as u64, || read_dataset(&path));
    }
}

/// An example of `count` empty strings in one bytes feature, beside a label.
fn example_of_empty_strings(count: usize) -> Vec<u8> {
    Example::new([
        ("x".to_string(), Feature { kind: Some(Kind::BytesList(BytesList { value: vec![Vec::new(); count] })) }),
        ("label".to_string(), Feature::ints(vec![1])),
    ])
    .encode_to_vec()
}

#[test]
fn examples_and_their_mutations_decode_within_the_bound() {
    let _serial = serial();
    for (i, seed) in seeds("example").iter().enumerate() {
        let bytes = std::fs::read(seed).unwrap();
        for (m, mutated) in std::iter::once(bytes.clone()).chain(mutations(&bytes, 400 + i as u64, 500)).enumerate() {
            let label = format!("{} mutation {m}", seed.display());
            bounded(&label, mutated.len() as u64, || Example::decode(mutated.as_slice()).is_ok());
        }
    }
    // Features with empty names and values: two bytes of map entry each.
    let mut features = Vec::new();
    for i in 0..200_000u32 {
        let name = format!("{i:x}");
        let entry = [&[0x0a, name.len() as u8][..], name.as_bytes(), &[0x12, 0x00]].concat();
        features.extend_from_slice(&[0x0a, entry.len() as u8]);
        features.extend_from_slice(&entry);
    }
    let mut example = vec![0x0a];
    prost::encoding::encode_varint(features.len() as u64, &mut example);
    example.extend_from_slice(&features);
    bounded("an example of 200,000 empty features", example.len() as u64, || {
        Example::decode(example.as_slice()).is_ok()
    });
    assert!(Features::default().feature.is_empty());
}

#[test]
fn examples_of_millions_of_empty_strings_stay_within_the_bound() {
    let _serial = serial();
    let record = example_of_empty_strings(4 << 20);
    let error = Example::decode(record.as_slice()).unwrap_err().to_string();
    assert!(error.contains("a tf.Example of 8388647 bytes would take about"), "{error}");
    // Honest examples of the same size decode: floats, wide strings, small ints.
    let honest = Example::new([
        ("f".to_string(), Feature::floats(vec![0.5; 1 << 20])),
        ("s".to_string(), Feature::bytes(vec![vec![7; 16]; 1 << 18])),
        ("i".to_string(), Feature::ints(vec![3; 1 << 20])),
    ])
    .encode_to_vec();
    let decoded = bounded("an honest 10 MB example", honest.len() as u64, || Example::decode(honest.as_slice()));
    assert_eq!(decoded.unwrap().get("i").map(Feature::len), Some(1 << 20));
    bounded("an example of 4 Mi empty strings", record.len() as u64, || Example::decode(record.as_slice()).is_ok());
    let dir = tempfile::tempdir().unwrap();
    let mut file = Vec::new();
    write_record(&mut file, &record);
    read_bytes("a TFRecord of an example of 4 Mi empty strings", "x.tfrecord", &file, dir.path());
}
