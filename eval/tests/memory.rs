//! Memory does not grow with the dataset: reading (with prefetch) and
//! scoring a ~200 MB TFRecord keeps the peak RSS within a few batches of
//! where it started. Its own test binary with one test: cargo runs tests of
//! one binary in parallel threads, which would share the process's RSS.

use isorun_eval::example::{Example, Feature};
use isorun_eval::tfrecord::write_record;
use isorun_eval::{DataSpec, Dataset, Evaluator, Metric, MetricsSpec};
use isorun_protocol::{DType, SignatureInfo, Tensor, TensorSpec};
use prost::Message;
use std::io::Write;

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn reading_and_scoring_a_large_tfrecord_keeps_peak_rss_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.tfrecord");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let values = 1024;
    let examples = 50_000i64;
    let mut chunk = Vec::new();
    for i in 0..examples {
        let example = Example::new([
            ("x".to_string(), Feature::floats((0..values).map(|v| (v as i64 ^ i) as f32).collect())),
            ("label".to_string(), Feature::ints(vec![i % 2])),
        ]);
        write_record(&mut chunk, &example.encode_to_vec());
        if chunk.len() > 1 << 20 {
            file.write_all(&chunk).unwrap();
            chunk.clear();
        }
    }
    file.write_all(&chunk).unwrap();
    file.flush().unwrap();
    drop(file);
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size > 200_000_000, "{size} bytes");

    let before = peak_rss_kib();
    let spec = DataSpec::new(vec![path], "label", 256);
    let signature = SignatureInfo {
        key: "serving_default".into(),
        inputs: vec![TensorSpec { name: "x".into(), dtype: DType::Float32, shape: Some(vec![None, Some(values)]) }],
        outputs: vec![TensorSpec { name: "p".into(), dtype: DType::Float32, shape: Some(vec![None]) }],
    };
    let dataset = Dataset::open(spec).unwrap();
    let metrics =
        MetricsSpec { metrics: vec![Metric::Accuracy, Metric::Auc, Metric::LogLoss], ..MetricsSpec::default() };
    let mut evaluator = Evaluator::new(&metrics, &signature, &[]).unwrap();
    let mut reader = dataset.reader(&signature).unwrap().prefetch(2);
    let mut rows = 0u64;
    while let Some(batch) = reader.next_batch() {
        let batch = batch.unwrap();
        // A stand-in model: one distinct score per example.
        let scores: Vec<u8> =
            (0..batch.targets.rows).flat_map(|r| ((rows + r as u64) as f32 / examples as f32).to_le_bytes()).collect();
        let output = Tensor::dense(DType::Float32, vec![batch.targets.rows as u64], scores);
        evaluator.update(&[("p".into(), output)], &batch.targets).unwrap();
        rows += batch.targets.rows as u64;
    }
    let evaluation = evaluator.finish();
    assert_eq!(rows, examples as u64);
    assert_eq!(evaluation.examples, examples as u64);
    assert!(evaluation.auc_exact);
    let growth_mib = (peak_rss_kib().saturating_sub(before)) as f64 / 1024.0;
    eprintln!("read {size} bytes; peak RSS grew by {growth_mib:.1} MiB (from {} MiB)", before / 1024);
    // A batch is 1 MiB of floats; a few in flight, the record buffer, the
    // metric state (50k distinct scores): far below the file's 200 MB.
    assert!(growth_mib < 64.0, "peak RSS grew by {growth_mib:.1} MiB");
}
