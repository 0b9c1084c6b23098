//! Reading datasets: TFRecord (plain, gzip, shards, globs), corrupt and
//! hostile files, tf.Example errors, raw-record feeding, npz/npy shards,
//! limits and prefetching, each through the public API.

use isorun_eval::example::{Example, Feature};
use isorun_eval::tfrecord::write_record;
use isorun_eval::{Batch, DataError, DataSpec, Dataset, Feeding, Format, Labels};
use isorun_protocol::{DType, SignatureInfo, Tensor, TensorData, TensorSpec};
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::util::{self, data_spec, npy, tensor};

fn spec(paths: Vec<PathBuf>) -> DataSpec {
    data_spec(paths, "label", 4)
}

fn example(i: i64) -> Example {
    Example::new([
        ("x".to_string(), Feature::floats(vec![i as f32, 0.5 * i as f32, -1.0])),
        ("label".to_string(), Feature::ints(vec![i % 2])),
        ("w".to_string(), Feature::floats(vec![1.0 + i as f32])),
        ("group".to_string(), Feature::bytes(vec![if i % 3 == 0 { b"a".to_vec() } else { b"b".to_vec() }])),
    ])
}

fn records(range: std::ops::Range<i64>) -> Vec<u8> {
    let mut out = Vec::new();
    for i in range {
        write_record(&mut out, &example(i).encode_to_vec());
    }
    out
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn signature(inputs: Vec<TensorSpec>) -> SignatureInfo {
    util::signature(inputs, vec![tensor("p", DType::Float32, &[None])])
}

fn x_signature() -> SignatureInfo {
    signature(vec![tensor("x", DType::Float32, &[None, Some(3)])])
}

fn read_all(dataset: &Dataset, sig: &SignatureInfo) -> Result<Vec<Batch>, DataError> {
    let mut reader = dataset.reader(sig)?;
    let mut batches = Vec::new();
    while let Some(batch) = reader.next_batch() {
        batches.push(batch?);
    }
    Ok(batches)
}

fn f32s(t: &Tensor) -> Vec<f32> {
    let TensorData::Dense(b) = &t.data else { panic!("dense") };
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn int_labels(batches: &[Batch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| match &b.targets.labels {
            Labels::Int(v) => v.clone(),
            other => panic!("int labels, not {other:?}"),
        })
        .collect()
}

#[test]
fn tfrecord_shards_plain_gzip_and_globs_read_in_order() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("part-0.tfrecord"), &records(0..5));
    write(&dir.path().join("part-1.tfrecord.gz"), &gzip(&records(5..11)));
    write(&dir.path().join("README"), b"not data");
    for paths in [
        vec![dir.path().to_path_buf()],
        vec![dir.path().join("part-*")],
        vec![dir.path().join("part-0.tfrecord"), dir.path().join("part-1.tfrecord.gz")],
    ] {
        let mut s = spec(paths);
        s.weight = Some("w".into());
        s.slices = vec!["group".into()];
        let dataset = Dataset::open(s).unwrap();
        assert_eq!(
            dataset.files().iter().map(|(p, f)| (p.file_name().unwrap().to_owned(), *f)).collect::<Vec<_>>(),
            vec![("part-0.tfrecord".into(), Format::TfRecord), ("part-1.tfrecord.gz".into(), Format::TfRecordGzip)]
        );
        let batches = read_all(&dataset, &x_signature()).unwrap();
        assert_eq!(batches.iter().map(|b| b.targets.rows).collect::<Vec<_>>(), vec![4, 4, 3]);
        assert_eq!(int_labels(&batches), (0..11).map(|i| i % 2).collect::<Vec<_>>());
        let x = &batches[1].inputs[0];
        assert_eq!(x.0, "x");
        assert_eq!(x.1.shape, vec![4, 3]);
        assert_eq!(f32s(&x.1)[..3], [4.0, 2.0, -1.0]);
        assert_eq!(batches[0].targets.weights.as_deref(), Some(&[1.0, 2.0, 3.0, 4.0][..]));
        assert_eq!(
            batches[0].targets.slices,
            vec![("group".to_string(), vec!["a".into(), "b".into(), "b".into(), "a".into()])]
        );
    }
}

#[test]
fn a_flipped_data_byte_names_file_and_offset_and_skip_corrupt_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.tfrecord");
    let mut bytes = records(0..6);
    let one = records(0..1).len();
    // The third record's data: 2 records in, past its 12-byte header.
    bytes[2 * one + 14] ^= 0x40;
    write(&path, &bytes);
    let dataset = Dataset::open(spec(vec![path.clone()])).unwrap();
    let err = read_all(&dataset, &x_signature()).unwrap_err();
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains(&format!("byte offset {}", 2 * one)), "{message}");
    assert!(message.contains("data CRC32C mismatch"), "{message}");

    let mut s = spec(vec![path]);
    s.skip_corrupt = true;
    let dataset = Dataset::open(s).unwrap();
    let mut reader = dataset.reader(&x_signature()).unwrap();
    let mut labels = Vec::new();
    while let Some(batch) = reader.next_batch() {
        labels.extend(int_labels(&[batch.unwrap()]));
    }
    assert_eq!(labels, vec![0, 1, 1, 0, 1], "record 2 skipped, the rest read");
    assert_eq!(reader.skipped(), 1);
}

#[test]
fn truncated_files_and_hostile_lengths_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let full = records(0..3);
    let one = records(0..1).len();
    let truncated = dir.path().join("truncated.tfrecord");
    write(&truncated, &full[..full.len() - 5]);
    let dataset = Dataset::open(spec(vec![truncated.clone()])).unwrap();
    let message = read_all(&dataset, &x_signature()).unwrap_err().to_string();
    assert!(message.contains("truncated record") && message.contains(&format!("byte offset {}", 2 * one)), "{message}");

    // A length of 2^63 with a valid length CRC, in a plain and in a gzip file.
    let mut hostile = records(0..1);
    let len = (1u64 << 63).to_le_bytes();
    hostile.extend_from_slice(&len);
    hostile.extend_from_slice(&isorun_eval::tfrecord::masked_crc32c(&len).to_le_bytes());
    hostile.extend_from_slice(&[0; 32]);
    let plain = dir.path().join("hostile.tfrecord");
    write(&plain, &hostile);
    let gz = dir.path().join("hostile.gz");
    write(&gz, &gzip(&hostile));
    for path in [&plain, &gz] {
        let dataset = Dataset::open(spec(vec![path.clone()])).unwrap();
        let message = read_all(&dataset, &x_signature()).unwrap_err().to_string();
        assert!(message.contains(&format!("byte offset {one}")), "{message}");
        assert!(message.contains(&path.display().to_string()), "{message}");
    }
    // With skip_corrupt the rest of the file is skipped and counted once.
    let mut s = spec(vec![plain, truncated]);
    s.skip_corrupt = true;
    let dataset = Dataset::open(s).unwrap();
    let mut reader = dataset.reader(&x_signature()).unwrap();
    let mut rows = 0;
    while let Some(batch) = reader.next_batch() {
        rows += batch.unwrap().targets.rows;
    }
    assert_eq!((rows, reader.skipped()), (1 + 2, 2));
}

#[test]
fn example_errors_name_the_example_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.tfrecord");
    let mut bytes = records(0..3);
    let mut missing = example(3);
    missing.features.as_mut().unwrap().feature.remove("x");
    write_record(&mut bytes, &missing.encode_to_vec());
    write(&path, &bytes);
    let dataset = Dataset::open(spec(vec![path.clone()])).unwrap();
    let message = read_all(&dataset, &x_signature()).unwrap_err().to_string();
    assert!(message.contains("example 3") && message.contains("'x' is missing"), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");

    let wrong_length = signature(vec![tensor("x", DType::Float32, &[None, Some(4)])]);
    let message = read_all(&dataset, &wrong_length).unwrap_err().to_string();
    assert!(message.contains("example 0") && message.contains("has 3 values per example"), "{message}");

    let wrong_kind = signature(vec![tensor("x", DType::Int64, &[None, Some(3)])]);
    let message = read_all(&dataset, &wrong_kind).unwrap_err().to_string();
    assert!(message.contains("is float_list, expected int64_list"), "{message}");

    let absent = signature(vec![tensor("pixels", DType::Float32, &[None, Some(3)])]);
    let message = dataset.reader(&absent).unwrap_err().to_string();
    assert!(message.contains("input 'pixels'") && message.contains("x (float_list, 3 values)"), "{message}");

    let mut renamed = spec(vec![path]);
    renamed.renames = vec![("pixels".into(), "x".into())];
    let batches = read_all(&Dataset::open(renamed).unwrap(), &absent).unwrap_err().to_string();
    assert!(batches.contains("example 3"), "renamed input reads until the bad example: {batches}");

    let mut no_label = spec(vec![dir.path().join("bad.tfrecord")]);
    no_label.label = "target".into();
    let message = Dataset::open(no_label).unwrap_err().to_string();
    assert!(message.contains("no label 'target'") && message.contains("label (int64_list, 1 values)"), "{message}");
}

#[test]
fn a_single_string_input_gets_the_serialized_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.tfrecords");
    write(&path, &records(0..3));
    let dataset = Dataset::open(spec(vec![path])).unwrap();
    let sig = signature(vec![tensor("examples", DType::String, &[None])]);
    let mut reader = dataset.reader(&sig).unwrap();
    assert_eq!(reader.feeding(), &Feeding::RawRecords { input: "examples".into() });
    let batch = reader.next_batch().unwrap().unwrap();
    let TensorData::Strings(strings) = &batch.inputs[0].1.data else { panic!("strings") };
    assert_eq!(batch.inputs[0].1.shape, vec![3]);
    assert_eq!(Example::decode(strings[1].as_slice()).unwrap(), example(1));
    // A string input named like a bytes feature gets that feature.
    let sig = signature(vec![tensor("group", DType::String, &[None])]);
    let mut reader = dataset.reader(&sig).unwrap();
    assert_eq!(reader.feeding(), &Feeding::Features);
    let batch = reader.next_batch().unwrap().unwrap();
    let TensorData::Strings(strings) = &batch.inputs[0].1.data else { panic!("strings") };
    assert_eq!(
        strings.iter().map(|s| s.to_vec()).collect::<Vec<_>>(),
        vec![b"a".to_vec(), b"b".to_vec(), b"b".to_vec()]
    );
}

fn npz(path: &Path, arrays: &[(&str, Vec<u8>)], deflate: bool) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let method = if deflate { zip::CompressionMethod::Deflated } else { zip::CompressionMethod::Stored };
    for (name, bytes) in arrays {
        zip.start_file(format!("{name}.npy"), zip::write::SimpleFileOptions::default().compression_method(method))
            .unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
}

fn shard(rows: std::ops::Range<i64>) -> Vec<(&'static str, Vec<u8>)> {
    let n = rows.end - rows.start;
    let x: Vec<u8> = rows.clone().flat_map(|i| [i as f32, 1.0, 2.0]).flat_map(f32::to_le_bytes).collect();
    let label: Vec<u8> = rows.flat_map(|i| (i % 2).to_le_bytes()).collect();
    vec![("x", npy("<f4", &[n as u64, 3], &x)), ("label", npy("<i8", &[n as u64], &label))]
}

#[test]
fn npz_shards_stream_stored_and_deflated_and_folders_of_npy() {
    let dir = tempfile::tempdir().unwrap();
    npz(&dir.path().join("a.npz"), &shard(0..5), false);
    npz(&dir.path().join("b.npz"), &shard(5..7), true);
    let folder = dir.path().join("c");
    std::fs::create_dir(&folder).unwrap();
    for (name, bytes) in shard(7..10) {
        write(&folder.join(format!("{name}.npy")), &bytes);
    }
    let dataset = Dataset::open(spec(vec![dir.path().to_path_buf()])).unwrap();
    assert_eq!(
        dataset.files().iter().map(|f| f.1).collect::<Vec<_>>(),
        vec![Format::Npz, Format::Npz, Format::NpyFolder]
    );
    let batches = read_all(&dataset, &x_signature()).unwrap();
    assert_eq!(batches.iter().map(|b| b.targets.rows).collect::<Vec<_>>(), vec![4, 4, 2]);
    assert_eq!(int_labels(&batches), (0..10).map(|i| i % 2).collect::<Vec<_>>());
    let x: Vec<f32> = batches.iter().flat_map(|b| f32s(&b.inputs[0].1)).collect();
    assert_eq!(x.chunks(3).map(|r| r[0]).collect::<Vec<_>>(), (0..10).map(|i| i as f32).collect::<Vec<_>>());
    // A float64 input takes the float32 array, converted.
    let wide = signature(vec![tensor("x", DType::Float64, &[None, Some(3)])]);
    assert_eq!(read_all(&dataset, &wide).unwrap()[0].inputs[0].1.dtype, DType::Float64);

    let bad = dir.path().join("bad.npz");
    let mut arrays = shard(0..5);
    arrays[1] = ("label", npy("<i8", &[4], &[0; 32]));
    npz(&bad, &arrays, false);
    let message = Dataset::open(spec(vec![bad])).unwrap_err().to_string();
    assert!(message.contains("5 examples (first axis)") && message.contains("has 4"), "{message}");
    assert!(message.contains("bad.npz/x.npy") && message.contains("bad.npz/label.npy"), "{message}");
}

/// Three TFRecord shards of ten examples each (`s0`..`s2` in `dir`,
/// examples 0 to 29), read 23 examples in batches of 5: the last batch is short.
fn three_shards_limited_to_23(dir: &Path) -> DataSpec {
    for i in 0..3 {
        write(&dir.join(format!("s{i}.tfrecord")), &records(i * 10..i * 10 + 10));
    }
    let mut s = spec(vec![dir.join("s*.tfrecord")]);
    s.limit = Some(23);
    s.batch_size = 5;
    s
}

#[test]
fn limit_stops_mid_batch_and_prefetch_gives_the_same_batches() {
    let dir = tempfile::tempdir().unwrap();
    let dataset = Dataset::open(three_shards_limited_to_23(dir.path())).unwrap();
    let direct = read_all(&dataset, &x_signature()).unwrap();
    assert_eq!(direct.iter().map(|b| b.targets.rows).collect::<Vec<_>>(), vec![5, 5, 5, 5, 3]);
    for depth in [0, 1, 2, 8] {
        let mut reader = dataset.reader(&x_signature()).unwrap().prefetch(depth);
        let mut prefetched = Vec::new();
        while let Some(b) = reader.next_batch() {
            prefetched.push(b.unwrap());
        }
        assert!(reader.next_batch().is_none());
        assert_eq!(prefetched, direct, "depth {depth}");
    }
    // An error ends a prefetching reader too.
    let path = dir.path().join("s1.tfrecord");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() - 3);
    write(&path, &bytes);
    let mut reader = dataset.reader(&x_signature()).unwrap().prefetch(2);
    let results: Vec<_> = std::iter::from_fn(|| reader.next_batch()).collect();
    assert!(results.last().unwrap().is_err() && results[..results.len() - 1].iter().all(Result::is_ok));
}

#[test]
fn open_checks_paths_patterns_and_formats_first() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.tfrecord");
    assert!(matches!(Dataset::open(spec(vec![missing])), Err(DataError::NotFound { .. })));
    let pattern = dir.path().join("*.tfrecord");
    let message = Dataset::open(spec(vec![pattern])).unwrap_err().to_string();
    assert!(message.contains("matches no file"), "{message}");
    let csv = dir.path().join("data.txt");
    write(&csv, b"a,b\n");
    assert!(matches!(Dataset::open(spec(vec![csv])), Err(DataError::UnknownFormat { .. })));
    let fake_gz = dir.path().join("data.gz");
    write(&fake_gz, b"plain text");
    let message = Dataset::open(spec(vec![fake_gz])).unwrap_err().to_string();
    assert!(message.contains("data.gz") && message.contains("cannot read"), "{message}");
    let empty = dir.path().join("empty.tfrecord");
    write(&empty, b"");
    assert!(matches!(Dataset::open(spec(vec![empty.clone()])), Err(DataError::Empty { .. })));
    // The digest changes with the files.
    let good = dir.path().join("good.tfrecord");
    write(&good, &records(0..2));
    let a = Dataset::open(spec(vec![good.clone()])).unwrap().digest();
    write(&good, &records(0..3));
    let b = Dataset::open(spec(vec![good])).unwrap().digest();
    assert_ne!(a, b);
    assert_eq!(a.len(), 64);
}

#[test]
fn reading_100k_small_examples_is_fast() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.tfrecord");
    write(&path, &records(0..100_000));
    let mut s = spec(vec![path]);
    s.batch_size = 256;
    let dataset = Dataset::open(s).unwrap();
    let start = std::time::Instant::now();
    let mut reader = dataset.reader(&x_signature()).unwrap();
    let mut rows = 0;
    while let Some(b) = reader.next_batch() {
        rows += b.unwrap().targets.rows;
    }
    let elapsed = start.elapsed();
    assert_eq!(rows, 100_000);
    eprintln!("read 100k examples in {elapsed:?}");
    // Generous: an unoptimized test build on a shared machine.
    assert!(elapsed.as_secs() < 20, "{elapsed:?}");
}

#[test]
fn a_truncated_gzip_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.tfrecord.gz");
    let full = gzip(&records(0..50));
    write(&path, &full[..full.len() / 2]);
    let dataset = Dataset::open(spec(vec![path.clone()])).unwrap();
    let message = read_all(&dataset, &x_signature()).unwrap_err().to_string();
    assert!(
        message.contains(&path.display().to_string()) && message.contains("of the decompressed stream"),
        "{message}"
    );
}

#[test]
fn multi_value_labels_are_a_matrix_and_scalar_inputs_are_one_value_per_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("onehot.tfrecord");
    let mut bytes = Vec::new();
    for i in 0..3i64 {
        let mut one_hot = vec![0.0f32; 3];
        one_hot[i as usize] = 1.0;
        let e = Example::new([
            ("age".to_string(), Feature::ints(vec![20 + i])),
            ("label".to_string(), Feature::floats(one_hot)),
        ]);
        write_record(&mut bytes, &e.encode_to_vec());
    }
    write(&path, &bytes);
    let dataset = Dataset::open(spec(vec![path])).unwrap();
    let sig = signature(vec![tensor("age", DType::Float32, &[None])]);
    let batch = read_all(&dataset, &sig).unwrap().remove(0);
    assert_eq!(batch.inputs[0].1.shape, vec![3]);
    assert_eq!(f32s(&batch.inputs[0].1), vec![20.0, 21.0, 22.0]);
    assert_eq!(
        batch.targets.labels,
        Labels::Matrix { columns: 3, values: vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0] }
    );
    // An int32 input takes int64_list values, range-checked.
    let sig = signature(vec![tensor("age", DType::Int8, &[None, Some(1)])]);
    assert_eq!(read_all(&dataset, &sig).unwrap()[0].inputs[0].1.shape, vec![3, 1]);
}

#[test]
fn datasets_readers_and_evaluators_cross_threads() {
    fn send_sync<T: Send + Sync + Clone>() {}
    fn send<T: Send>() {}
    send_sync::<Dataset>();
    send::<isorun_eval::BatchReader>();
    send::<isorun_eval::Evaluator>();
}

#[test]
fn csv_rows_are_examples_with_quoting_and_kind_errors_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.csv");
    write(&path, b"\xef\xbb\xbfx,label,city\r\n1.5,1,\"Paris, FR\"\r\n2,0,\"multi\nline \"\"q\"\"\"\n\n-3,1,Rome\n");
    let mut s = spec(vec![path.clone()]);
    s.slices = vec!["city".into()];
    let dataset = Dataset::open(s).unwrap();
    assert_eq!(dataset.files()[0].1, Format::Csv);
    let sig = signature(vec![tensor("x", DType::Float64, &[None])]);
    let batch = read_all(&dataset, &sig).unwrap().remove(0);
    assert_eq!(batch.targets.labels, Labels::Int(vec![1, 0, 1]));
    assert_eq!(batch.inputs[0].1.shape, vec![3]);
    assert_eq!(
        batch.targets.slices[0].1,
        vec!["Paris, FR".to_string(), "multi\nline \"q\"".to_string(), "Rome".to_string()]
    );

    let bad = dir.path().join("bad.csv");
    // Within the first 1000 rows a word makes the column bytes: not a label.
    write(&bad, b"x,label\n1,0\n2,1\n3,yes\n");
    let message = Dataset::open(spec(vec![bad.clone()])).unwrap_err().to_string();
    assert!(
        message.contains("bad.csv: feature 'label': labels are numbers, not bytes_list")
            && message.contains("--label-classes 0,1,yes"),
        "{message}"
    );
    // Past them, a cell that does not fit its column is an error naming its line.
    let mut text = b"x,label\n".to_vec();
    for i in 0..1000 {
        text.extend_from_slice(format!("{i},{}\n", i % 2).as_bytes());
    }
    text.extend_from_slice(b"7,yes\n");
    write(&bad, &text);
    let message = read_all(&Dataset::open(spec(vec![bad.clone()])).unwrap(), &sig).unwrap_err().to_string();
    assert!(message.contains("bad.csv: line 1002") && message.contains("column 'label' is 'yes'"), "{message}");
    write(&bad, b"x,label\n1,0\n2\n");
    let message = read_all(&Dataset::open(spec(vec![bad.clone()])).unwrap(), &sig).unwrap_err().to_string();
    assert!(message.contains("line 3: row has 1 cells but the header has 2"), "{message}");
    // One dataset is one family of formats.
    let tf = dir.path().join("a.tfrecord");
    write(&tf, &records(0..1));
    let message = Dataset::open(spec(vec![tf, path])).unwrap_err().to_string();
    assert!(message.contains("is TFRecord but") && message.contains("is CSV"), "{message}");
}

/// Reads every batch with prefetching, as `isorun eval` does.
fn read_all_prefetched(dataset: &Dataset, sig: &SignatureInfo) -> Result<Vec<Batch>, DataError> {
    let mut reader = dataset.reader(sig)?.prefetch(2);
    let mut batches = Vec::new();
    while let Some(batch) = reader.next_batch() {
        batches.push(batch?);
    }
    Ok(batches)
}

#[test]
fn a_later_shard_with_a_string_label_is_an_error_not_the_end_of_the_data() {
    let dir = tempfile::tempdir().unwrap();
    npz(&dir.path().join("a.npz"), &shard(0..5), false);
    let mut arrays = shard(5..7);
    arrays[1] = ("label", npy("|S1", &[2], b"ab"));
    npz(&dir.path().join("b.npz"), &arrays, false);
    let dataset = Dataset::open(spec(vec![dir.path().to_path_buf()])).unwrap();
    for (how, result) in
        [("direct", read_all(&dataset, &x_signature())), ("prefetch", read_all_prefetched(&dataset, &x_signature()))]
    {
        let message = result.map(|b| b.len()).expect_err(how).to_string();
        assert!(message.contains("b.npz/label.npy") && message.contains("labels are numbers"), "{how}: {message}");
    }
}

#[test]
fn a_later_shard_with_a_zero_width_weight_is_an_error_not_the_end_of_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = shard(0..5);
    first.push(("w", npy("<f4", &[5], &[0; 20])));
    npz(&dir.path().join("a.npz"), &first, false);
    let mut second = shard(5..7);
    second.push(("w", npy("|S0", &[2, 0], b"")));
    npz(&dir.path().join("b.npz"), &second, false);
    let mut s = spec(vec![dir.path().to_path_buf()]);
    s.weight = Some("w".into());
    let dataset = Dataset::open(s).unwrap();
    for (how, result) in
        [("direct", read_all(&dataset, &x_signature())), ("prefetch", read_all_prefetched(&dataset, &x_signature()))]
    {
        let message = result.map(|b| b.len()).expect_err(how).to_string();
        assert!(message.contains("b.npz/w.npy") && message.contains("weights must be one number"), "{how}: {message}");
    }
}

/// One entry of a zip written byte by byte: what a hostile writer can claim.
struct RawEntry {
    name: &'static str,
    deflated: bool,
    /// The bytes stored in the archive (already deflated when `deflated`).
    data: Vec<u8>,
    /// The uncompressed size claimed (ZIP64 when past 4 GiB).
    claimed_size: u64,
    /// The compressed size claimed; `None`: the data's length.
    claimed_compressed: Option<u64>,
}

/// A zip archive (CRCs zero: the reader does not check them) whose sizes
/// are whatever the entries claim.
fn raw_zip(entries: &[RawEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for entry in entries {
        let offset = out.len() as u32;
        let compressed = entry.claimed_compressed.unwrap_or(entry.data.len() as u64);
        let wide = |n: u64| if n >= u32::MAX as u64 { u32::MAX } else { n as u32 };
        let mut extra = Vec::new();
        if entry.claimed_size >= u32::MAX as u64 || compressed >= u32::MAX as u64 {
            let mut fields = Vec::new();
            if entry.claimed_size >= u32::MAX as u64 {
                fields.extend_from_slice(&entry.claimed_size.to_le_bytes());
            }
            if compressed >= u32::MAX as u64 {
                fields.extend_from_slice(&compressed.to_le_bytes());
            }
            extra.extend_from_slice(&1u16.to_le_bytes());
            extra.extend_from_slice(&(fields.len() as u16).to_le_bytes());
            extra.extend_from_slice(&fields);
        }
        let method: u16 = if entry.deflated { 8 } else { 0 };
        let common = |out: &mut Vec<u8>| {
            out.extend_from_slice(&45u16.to_le_bytes()); // version needed
            out.extend_from_slice(&0u16.to_le_bytes()); // flags
            out.extend_from_slice(&method.to_le_bytes());
            out.extend_from_slice(&[0, 0, 0x21, 0]); // time, date
            out.extend_from_slice(&0u32.to_le_bytes()); // crc
            out.extend_from_slice(&wide(compressed).to_le_bytes());
            out.extend_from_slice(&wide(entry.claimed_size).to_le_bytes());
            out.extend_from_slice(&(entry.name.len() as u16).to_le_bytes());
            out.extend_from_slice(&(extra.len() as u16).to_le_bytes());
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        common(&mut out);
        out.extend_from_slice(entry.name.as_bytes());
        out.extend_from_slice(&extra);
        out.extend_from_slice(&entry.data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&45u16.to_le_bytes()); // version made by
        common(&mut central);
        central.extend_from_slice(&[0; 10]); // comment length, disk, internal and external attributes
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(entry.name.as_bytes());
        central.extend_from_slice(&extra);
    }
    let central_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&central_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

fn deflate(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A ~520-byte `.npz` whose `label.npy` claims shape `(1, 2^38)` of float32
/// and whose entry claims 1 TiB (ZIP64), deflated or stored.
fn hostile_npz(deflated: bool) -> Vec<u8> {
    let x = npy("<f4", &[1, 3], &[0; 12]);
    let label = npy("<f4", &[1, 1 << 38], &[]);
    let claimed = (1u64 << 40) + label.len() as u64;
    let entry = |name, bytes: Vec<u8>, claimed_size: u64| {
        if deflated {
            RawEntry { name, deflated, data: deflate(&bytes), claimed_size, claimed_compressed: None }
        } else {
            RawEntry { name, deflated, claimed_compressed: Some(claimed_size), data: bytes, claimed_size }
        }
    };
    let x_len = x.len() as u64;
    raw_zip(&[entry("x.npy", x, x_len), entry("label.npy", label, claimed)])
}

#[test]
fn an_npz_entry_claiming_a_terabyte_is_an_error_not_an_allocation() {
    let dir = tempfile::tempdir().unwrap();
    for deflated in [true, false] {
        let bytes = hostile_npz(deflated);
        assert!(bytes.len() < 1024, "{} bytes", bytes.len());
        // Alone, it is refused before any work.
        let path = dir.path().join(format!("hostile-{deflated}.npz"));
        write(&path, &bytes);
        let message = Dataset::open(spec(vec![path.clone()])).map(|_| ()).unwrap_err().to_string();
        assert!(message.contains("label.npy") && message.contains("claims"), "{message}");
        // As a later shard, it is the stream's error.
        let shards = dir.path().join(format!("shards-{deflated}"));
        std::fs::create_dir(&shards).unwrap();
        npz(&shards.join("a.npz"), &shard(0..5), false);
        write(&shards.join("b.npz"), &bytes);
        let dataset = Dataset::open(spec(vec![shards])).unwrap();
        let message = read_all_prefetched(&dataset, &x_signature()).map(|b| b.len()).unwrap_err().to_string();
        assert!(message.contains("b.npz") && message.contains("label.npy") && message.contains("claims"), "{message}");
    }
}

/// A folder of `.npy` files whose `x.npy` is a sparse file of `bytes` of
/// data (costing no disk) with a header of `shape` and `dtype`.
fn sparse_npy_folder(dir: &Path, dtype: &str, shape: &[u64], bytes: u64) -> PathBuf {
    let folder = dir.join(format!("sparse-{}", dtype.replace(['<', '|'], "")));
    std::fs::create_dir(&folder).unwrap();
    let header = npy(dtype, shape, &[]);
    let file = std::fs::File::create(folder.join("x.npy")).unwrap();
    (&file).write_all(&header).unwrap();
    file.set_len(header.len() as u64 + bytes).unwrap();
    let rows = shape[0] as usize;
    write(&folder.join("label.npy"), &npy("<i8", &[rows as u64], &vec![0; rows * 8]));
    folder
}

#[test]
fn a_batch_past_the_byte_cap_is_an_error_not_an_allocation() {
    let dir = tempfile::tempdir().unwrap();
    // 4 rows of 512 MiB: 2 GiB a batch.
    let folder = sparse_npy_folder(dir.path(), "|u1", &[4, 1 << 29], 1 << 31);
    let dataset = Dataset::open(spec(vec![folder])).unwrap();
    let sig = signature(vec![tensor("x", DType::UInt8, &[None, Some(1 << 29)])]);
    let message = read_all_prefetched(&dataset, &sig).map(|b| b.len()).unwrap_err().to_string();
    assert!(message.contains("x.npy") && message.contains("--batch-size"), "{message}");
}

#[test]
fn one_byte_strings_are_budgeted_by_what_they_cost() {
    let dir = tempfile::tempdir().unwrap();
    // 128 MiB of |S1 in one row: 2^27 strings, ~3 GiB as byte strings.
    let folder = sparse_npy_folder(dir.path(), "|S1", &[1, 1 << 27], 1 << 27);
    let dataset = Dataset::open(spec(vec![folder])).unwrap();
    let sig = signature(vec![tensor("x", DType::String, &[None, None])]);
    let message = read_all_prefetched(&dataset, &sig).map(|b| b.len()).unwrap_err().to_string();
    assert!(message.contains("x.npy") && message.contains("--batch-size"), "{message}");
}

#[test]
fn a_tfrecord_that_grows_while_read_is_read_as_it_was_opened() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("growing.tfrecord");
    write(&path, &records(0..1));
    let mut s = spec(vec![path.clone()]);
    s.batch_size = 1;
    let dataset = Dataset::open(s).unwrap();
    let mut reader = dataset.reader(&x_signature()).unwrap();
    // The first batch opens the file; then another record is appended.
    assert_eq!(reader.next_batch().unwrap().unwrap().targets.rows, 1);
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(&records(1..2)).unwrap();
    drop(file);
    assert!(reader.next_batch().is_none());
}

#[test]
fn globs_walk_each_folder_once_through_symlink_loops() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("part-0.tfrecord"), &records(0..2));
    std::os::unix::fs::symlink(".", dir.path().join("a")).unwrap();
    std::os::unix::fs::symlink(".", dir.path().join("b")).unwrap();
    let pattern = dir.path().join("**").join("*.tfrecord");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(Dataset::open(spec(vec![pattern])).map(|d| d.files().len()));
    });
    // Two links to `.` used to make 2^40 walks (until the kernel's limit of 40 links in a path).
    let files = receiver.recv_timeout(std::time::Duration::from_secs(20)).expect("the walk ends").unwrap();
    assert_eq!(files, 1);
}

#[test]
fn example_keys_and_indices_come_with_each_batch_and_a_missing_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.tfrecord");
    let mut bytes = Vec::new();
    for i in 0..10i64 {
        let mut e = example(i);
        e.features.as_mut().unwrap().feature.insert("id".into(), Feature::bytes(vec![format!("ex-{i}").into_bytes()]));
        write_record(&mut bytes, &e.encode_to_vec());
    }
    write(&path, &bytes);
    let keyed = DataSpec { example_key: Some("id".into()), slices: vec!["group".into()], ..spec(vec![path.clone()]) };
    let batches = read_all(&Dataset::open(keyed).unwrap(), &x_signature()).unwrap();
    let firsts: Vec<u64> = batches.iter().map(|b| b.targets.first_index).collect();
    assert_eq!(firsts, [0, 4, 8]);
    let keys: Vec<String> = batches.iter().flat_map(|b| b.targets.keys.clone().unwrap()).collect();
    assert_eq!(keys, (0..10).map(|i| format!("ex-{i}")).collect::<Vec<_>>());
    // The key is not a slice: the slices are only those asked for.
    assert_eq!(batches[0].targets.slices.len(), 1);
    let unkeyed = read_all(&Dataset::open(spec(vec![path.clone()])).unwrap(), &x_signature()).unwrap();
    assert!(unkeyed.iter().all(|b| b.targets.keys.is_none()));

    let other = dir.path().join("no-id.tfrecord");
    write(&other, &records(0..3));
    let err = Dataset::open(DataSpec { example_key: Some("id".into()), ..spec(vec![other]) }).unwrap_err().to_string();
    assert!(err.contains("example key") && err.contains("no-id.tfrecord"), "{err}");
}

/// Every batch of a reader prefetching 2 ahead, or its first error.
fn read_pass(dataset: &Dataset, sig: &SignatureInfo) -> (Result<Vec<Batch>, DataError>, bool, u64) {
    let mut reader = dataset.reader(sig).unwrap().prefetch(2);
    let replays = reader.replays();
    let mut batches = Vec::new();
    while let Some(batch) = reader.next_batch() {
        match batch {
            Ok(batch) => batches.push(batch),
            Err(e) => return (Err(e), replays, reader.skipped()),
        }
    }
    (Ok(batches), replays, reader.skipped())
}

#[test]
fn a_small_dataset_is_decoded_once_and_its_batches_replayed_for_the_next_model() {
    let dir = tempfile::tempdir().unwrap();
    let plain = Dataset::open(three_shards_limited_to_23(dir.path())).unwrap();
    let direct = read_all(&plain, &x_signature()).unwrap();
    let dataset = plain.keep_decoded(1 << 20);
    let (first, replayed, _) = read_pass(&dataset, &x_signature());
    assert!(!replayed, "the first pass reads the files");
    assert_eq!(first.unwrap(), direct);
    // The files are gone: the next model's pass is the kept one, bit for bit.
    for i in 0..3 {
        std::fs::remove_file(dir.path().join(format!("s{i}.tfrecord"))).unwrap();
    }
    for _ in 0..2 {
        let mut reader = dataset.clone().reader(&x_signature()).unwrap().prefetch(2);
        assert!(reader.replays());
        let batches: Vec<Batch> = std::iter::from_fn(|| reader.next_batch()).map(Result::unwrap).collect();
        assert_eq!(batches, direct);
        assert!(reader.next_batch().is_none());
        assert_eq!(reader.decode_time(), std::time::Duration::ZERO, "nothing decoded again");
    }
    // Another plan (another dtype for x) is not the kept one: it reads the files.
    let other = signature(vec![tensor("x", DType::Float64, &[None, Some(3)])]);
    let message = read_pass(&dataset, &other).0.unwrap_err().to_string();
    assert!(message.contains("s0.tfrecord"), "{message}");
}

#[test]
fn a_dataset_over_the_cap_is_read_again_for_each_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.tfrecord");
    write(&path, &records(0..40));
    let plain = Dataset::open(spec(vec![path])).unwrap();
    let direct = read_all(&plain, &x_signature()).unwrap();
    // 40 examples of 3 floats and an int64 label: 800 bytes decoded, over 500.
    let dataset = plain.keep_decoded(500);
    for pass in 0..3 {
        let (batches, replayed, _) = read_pass(&dataset, &x_signature());
        assert!(!replayed, "pass {pass}");
        assert_eq!(batches.unwrap(), direct, "pass {pass}");
    }
}

#[test]
fn a_bad_record_mid_file_is_every_pass_s_error_and_skipped_records_are_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.tfrecord");
    let mut bytes = records(0..12);
    let one = records(0..1).len();
    // The seventh record's data: in the second batch of 4.
    bytes[6 * one + 14] ^= 0x40;
    write(&path, &bytes);
    let plain = Dataset::open(spec(vec![path.clone()])).unwrap();
    let expected = read_all(&plain, &x_signature()).unwrap_err().to_string();
    assert!(expected.contains(&format!("byte offset {}", 6 * one)), "{expected}");
    assert!(expected.contains("data CRC32C mismatch") && expected.contains("data.tfrecord"), "{expected}");
    let dataset = plain.keep_decoded(1 << 20);
    for pass in 0..2 {
        let (result, replayed, _) = read_pass(&dataset, &x_signature());
        assert!(!replayed, "a pass that failed is not kept (pass {pass})");
        assert_eq!(result.unwrap_err().to_string(), expected, "pass {pass}");
    }

    let mut s = spec(vec![path]);
    s.skip_corrupt = true;
    let dataset = Dataset::open(s).unwrap().keep_decoded(1 << 20);
    let (first, replayed, skipped) = read_pass(&dataset, &x_signature());
    assert!(!replayed);
    assert_eq!(skipped, 1);
    let (again, replayed, skipped_again) = read_pass(&dataset, &x_signature());
    assert!(replayed, "a whole pass that skipped a corrupt record is kept");
    assert_eq!(skipped_again, 1, "the kept pass's skipped records");
    let first = first.unwrap();
    assert_eq!(int_labels(&first), vec![0, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1]);
    assert_eq!(again.unwrap(), first);
}
