//! The allocation bound of the readers of shard reports and predictions
//! files: reading N bytes of them (and merging the shard reports) never
//! holds more than max(64 MiB, 16 × N) bytes more than before, whatever the
//! files claim (10^12 classes, 10,000 replicates of short lists, a curve of
//! 2^24 buckets, eval's first batch of 10^12 rows, 100,000-wide rows of
//! zeros that compress to almost nothing).
//!
//! Its own test binary, with `isorun-alloc-bound`'s counting global
//! allocator: it counts the bytes live and their peak, and refuses (returns
//! null for) any request far past the bound or past 8 GiB live, so a reader
//! that trusts a claimed size aborts this test instead of exhausting the
//! machine. The tests hold `serial()`, so that one measures its reads alone.

use isorun_alloc_bound::{assert_bound, measure, serial, CountingAllocator};
use isorun_eval::bootstrap::Bootstrap;
use isorun_eval::predictions::{Meta, PredictionsFormat, PredictionsReader, PredictionsWriter};
use isorun_eval::{CiSpec, Evaluator, KeyedBy, Labels, Metric, MetricsSpec, Targets};
use isorun_protocol::{DType, SignatureInfo, Tensor, TensorSpec};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// Runs `read` (which reads `bytes` bytes of files), and checks the peak of
/// what it held above what was live before; `read`'s result.
fn within_bound<T>(what: &str, bytes: u64, read: impl FnOnce() -> T) -> T {
    let (result, peak) = measure(what, bytes, read);
    eprintln!("{what}: {bytes} bytes read, peak {} bytes ({:.1}x)", peak.bytes, peak.amplification());
    assert_bound(&peak);
    result
}

fn size(paths: &[PathBuf]) -> u64 {
    paths.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum()
}

/// The metric state of a model of `columns` outputs (1: binary) over a few
/// rows, with `replicates` bootstrap replicates when given.
fn state(columns: usize, metrics: Vec<Metric>, replicates: Option<u32>) -> Value {
    let shape = if columns == 1 { vec![None] } else { vec![None, Some(columns as u64)] };
    let signature = SignatureInfo {
        key: "serving_default".into(),
        inputs: vec![],
        outputs: vec![TensorSpec { name: "out".into(), dtype: DType::Float64, shape: Some(shape) }],
    };
    let spec = MetricsSpec { metrics, ..MetricsSpec::default() };
    let mut evaluator = Evaluator::new(&spec, &signature, &[]).unwrap();
    if let Some(replicates) = replicates {
        let bootstrap = Bootstrap { replicates, seed: 1 };
        evaluator = evaluator.with_ci(CiSpec { bootstrap, level: 0.95, by: KeyedBy::Index });
    }
    let rows = 6;
    let outputs: Vec<f64> = (0..rows * columns).map(|i| ((i * 7) % 10) as f64 / 10.0).collect();
    let labels: Vec<i64> = (0..rows).map(|r| (r % columns.max(2)) as i64).collect();
    let shape = if columns == 1 { vec![rows as u64] } else { vec![rows as u64, columns as u64] };
    let bytes = outputs.iter().flat_map(|v| v.to_le_bytes()).collect();
    let targets =
        Targets { rows, labels: Labels::Int(labels), weights: None, slices: vec![], first_index: 0, keys: None };
    evaluator.update(&[("out".into(), Tensor::dense(DType::Float64, shape, bytes))], &targets).unwrap();
    evaluator.state().to_json()
}

/// Data shard `shard` of an evaluation, one model with `state`.
fn data_shard(dir: &Path, shard: &str, state: &Value) -> PathBuf {
    let report = json!({
        "schema_version": 1, "isorun_version": "0.1.0",
        "started_at": "2024-01-01T10:00:00Z", "finished_at": "2024-01-01T10:00:01Z",
        "command": ["isorun", "eval"], "settings": {"eval": {"label": "y", "data_shard": shard}},
        "units": [{"model": "m", "status": "ok", "examples": 6, "batches": 1, "wall_ms": 1, "metric_state": state}],
    });
    let path = dir.join(format!("shard-{}.json", shard.replace('/', "-of-")));
    std::fs::write(&path, serde_json::to_vec(&report).unwrap()).unwrap();
    path
}

/// Reads and merges the shard reports as `isorun report merge` does.
fn merge(paths: &[PathBuf]) -> Result<(), String> {
    let reports = paths
        .iter()
        .map(|p| isorun_report::read_report(p).map(|r| (p.clone(), r)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    isorun_report::merge_data_shards(&reports).map(|_| ()).map_err(|e| e.to_string())
}

#[test]
fn shard_reports_whose_metric_states_lie_are_read_within_the_bound() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();

    let honest = state(3, vec![Metric::Accuracy, Metric::Auc], Some(200));
    let paths = [data_shard(dir.path(), "0/2", &honest), data_shard(dir.path(), "1/2", &honest)];
    within_bound("honest multiclass shards", size(&paths), || merge(&paths)).unwrap();

    // 10^12 classes, no per-class sums, replicates: (9 + 3 × 10^12) × 200 floats, were they allocated.
    let mut lie = honest.clone();
    lie["classes"] = json!(1_000_000_000_000u64);
    lie.as_object_mut().unwrap().remove("overall");
    let paths = [data_shard(dir.path(), "0/2", &lie), data_shard(dir.path(), "1/2", &honest)];
    let error = within_bound("10^12 classes", size(&paths), || merge(&paths)).unwrap_err();
    assert!(error.contains("1000000000000 classes"), "{error}");

    // 1000 classes backed by sums, but 10,000 replicates of short lists: 240 MB, were they allocated first.
    let mut lie = honest.clone();
    lie["classes"] = json!(1000);
    for key in ["tp", "fp", "fn", "present"] {
        lie["overall"][key] = json!(vec![0; 1000]);
    }
    lie["overall"].as_object_mut().unwrap().remove("curves");
    lie.as_object_mut().unwrap().remove("confusion");
    lie["metrics"] = json!(["accuracy"]);
    lie["requested"] = json!(["accuracy"]);
    lie["replicates"]["replicates"] = json!(10_000);
    let paths = [data_shard(dir.path(), "0/2", &lie), data_shard(dir.path(), "1/2", &honest)];
    let error = within_bound("10,000 replicates", size(&paths), || merge(&paths)).unwrap_err();
    assert!(error.contains("\"values\" is not 30090000 entries"), "{error}");

    // A binary curve claiming 2^24 buckets (256 MiB) in a few bytes.
    let binary = state(1, vec![Metric::Auc], None);
    let mut lie = binary.clone();
    lie["overall"]["curve"] = json!({"cap": 1, "buckets": 1 << 24, "low": 0.0, "high": 1.0, "counts": [[3, 1.0, 0.0]]});
    let paths = [data_shard(dir.path(), "0/2", &lie), data_shard(dir.path(), "1/2", &binary)];
    let error = within_bound("2^24 buckets", size(&paths), || merge(&paths)).unwrap_err();
    assert!(error.contains("16777216 buckets"), "{error}");
}

/// A Parquet predictions file of `batches` batches of `rows` rows of a
/// `width`-wide float32 output of zeros.
fn predictions(dir: &Path, width: u64, rows: usize, batches: usize) -> PathBuf {
    let meta = Meta {
        model: "m".into(),
        output: "p".into(),
        output_shape: Some(vec![None, Some(width)]),
        metrics: vec!["accuracy".into()],
        data_digest: "dddddddddddddddddddddddd".into(),
        max_confusion_classes: 1_000_000_000_000,
        ..Meta::new("y")
    };
    let mut writer = PredictionsWriter::create(dir, PredictionsFormat::Parquet, meta, false).unwrap();
    for b in 0..batches {
        let labels = Labels::Int(vec![1; rows]);
        let targets =
            Targets { rows, labels, weights: None, slices: vec![], first_index: (b * rows) as u64, keys: None };
        let output = Tensor::dense(DType::Float32, vec![rows as u64, width], vec![0u8; rows * width as usize * 4]);
        writer.append(&targets, &[("p".into(), output)]).unwrap();
    }
    writer.finish(Some("multiclass".into()), 0).unwrap()
}

/// Every batch of a predictions file, as `isorun rescore` reads them: the rows read.
fn read_predictions(path: &Path) -> Result<usize, String> {
    let mut reader = PredictionsReader::open(path).map_err(|e| e.to_string())?;
    reader.start("p", &[]).map_err(|e| e.to_string())?;
    let mut rows = 0;
    while let Some(batch) = reader.next_batch() {
        rows += batch.map_err(|e| e.to_string())?.targets.rows;
    }
    Ok(rows)
}

#[test]
fn predictions_files_whose_rows_or_description_lie_are_read_within_the_bound() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    // 96 rows of 100,000 zeros: 38 MB of floats in a file of about 2 MB.
    let path = predictions(&dir.path().join("wide"), 100_000, 8, 12);
    let bytes = size(std::slice::from_ref(&path));
    assert_eq!(within_bound("100,000-wide rows of zeros", bytes, || read_predictions(&path)), Ok(96));

    // Eval's first batch claimed 10^12 rows (the description patched, its length kept).
    let path = predictions(&dir.path().join("first"), 4, 3, 2);
    let mut file = std::fs::read(&path).unwrap();
    for (old, new) in
        [("\"first_batch_rows\":3", "\"first_batch_rows\":1000000000000"), ("dddddddddddddddddddddddd", "dddddddddddd")]
    {
        let at = file.windows(old.len()).position(|w| w == old.as_bytes()).unwrap();
        file.splice(at..at + old.len(), new.bytes());
    }
    std::fs::write(&path, &file).unwrap();
    let error = within_bound("10^12 first rows", file.len() as u64, || read_predictions(&path)).unwrap_err();
    assert!(error.contains("eval's first batch, 1000000000000 rows"), "{error}");
}

#[test]
fn curves_that_claim_buckets_their_file_does_not_hold_are_read_within_the_bound() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let empty = json!({"cap": 1, "buckets": 1024, "low": 0.0, "high": 1.0, "counts": []});

    // 20,000 values of one slice feature (eval keeps 1,000), each an empty
    // curve of 1024 buckets: 320 MiB a file, were the buckets allocated.
    let mut lie = state(1, vec![Metric::Auc], None);
    let values: serde_json::Map<String, Value> =
        (0..20_000).map(|v| (v.to_string(), json!({"examples": 0, "curve": empty}))).collect();
    lie["slice_features"] = json!(["s"]);
    lie["slices"] = json!([{ "values": values }]);
    let paths = [data_shard(dir.path(), "0/2", &lie), data_shard(dir.path(), "1/2", &lie)];
    let error = within_bound("20,000 slice values", size(&paths), || merge(&paths)).unwrap_err();
    assert!(error.contains("slice s: 20000 values, more than the 1000"), "{error}");

    // 2^13 classes, each an empty curve of 1024 buckets (eval's for that
    // many classes): 128 MiB a file, were they allocated; read, merged and
    // scored, they hold what the files hold. (Per class, a parsed report
    // costs some 20 times its bytes: more classes would pass the bound
    // with no curves at all.)
    let classes = 1 << 13;
    let mut lie = state(3, vec![Metric::Auc], None);
    lie["classes"] = json!(classes);
    for key in ["tp", "fp", "fn", "present"] {
        lie["overall"][key] = json!(vec![0; classes]);
    }
    lie["overall"]["curves"] = json!(vec![empty.clone(); classes]);
    lie.as_object_mut().unwrap().remove("confusion");
    let paths = [data_shard(dir.path(), "0/2", &lie), data_shard(dir.path(), "1/2", &lie)];
    within_bound("2^13 empty bucketed curves", size(&paths), || merge(&paths)).unwrap();

    // Exact curves of one score each, capped at one: merged, each passes
    // its cap and is bucketed (1024 buckets, 128 MiB, were they allocated).
    let mut second = lie.clone();
    lie["overall"]["curves"] = json!(vec![json!({"cap": 1, "buckets": 1024, "scores": [[0.25, 1, 0]]}); classes]);
    second["overall"]["curves"] = json!(vec![json!({"cap": 1, "buckets": 1024, "scores": [[0.75, 0, 1]]}); classes]);
    let paths = [data_shard(dir.path(), "0/2", &lie), data_shard(dir.path(), "1/2", &second)];
    within_bound("2^13 curves bucketed by the merge", size(&paths), || merge(&paths)).unwrap();
}
