//! What the targets share: the allocation bound every input is held to
//! ([`bounded`], under a counting global allocator), a per-process temp
//! folder whose files are rewritten each run (the readers take paths), and
//! a workout of `isorun_eval::Dataset` and its `BatchReader` as `isorun
//! eval` drives them.

#![allow(dead_code)]

use isorun_alloc_bound::{CountingAllocator, Peak};
use isorun_eval::{DataError, DataSpec, Dataset};
use isorun_protocol::{DType, SignatureInfo, TensorSpec};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

/// The worst an input did to the bound in this process, for `scripts/fuzz`.
#[derive(Default)]
struct Worst {
    inputs: u64,
    /// Peak bytes per input byte, and the input that did it.
    amplification: Option<Peak>,
    /// The largest peak, and the input that did it.
    largest: Option<Peak>,
}

static WORST: Mutex<Worst> = Mutex::new(Worst { inputs: 0, amplification: None, largest: None });

/// Runs one input's work for `target` under the allocation bound: a
/// request that would take it past max(64 MiB, 16 x the input's length) is
/// refused, so the process aborts at the offending allocation (a crash
/// libFuzzer saves), and a peak past it panics. Where the worst
/// amplification or the largest peak grows, it is written to
/// `$ISORUN_FUZZ_STATS/TARGET.tsv`, which `scripts/fuzz` reads.
pub fn bounded(target: &str, data: &[u8], run: impl FnOnce()) {
    static HEADROOM: std::sync::Once = std::sync::Once::new();
    HEADROOM.call_once(|| isorun_alloc_bound::set_headroom(1));
    let ((), peak) = isorun_alloc_bound::measure(target, data.len() as u64, run);
    record(target, &peak);
    isorun_alloc_bound::assert_bound(&peak);
}

fn record(target: &str, peak: &Peak) {
    let mut worst = WORST.lock().unwrap_or_else(|e| e.into_inner());
    worst.inputs += 1;
    let mut changed = false;
    if worst.amplification.as_ref().is_none_or(|w| peak.amplification() > w.amplification()) {
        worst.amplification = Some(peak.clone());
        changed = true;
    }
    if worst.largest.as_ref().is_none_or(|w| peak.bytes > w.bytes) {
        worst.largest = Some(peak.clone());
        changed = true;
    }
    let Some(dir) = std::env::var_os("ISORUN_FUZZ_STATS").filter(|_| changed) else { return };
    let (Some(amplification), Some(largest)) = (&worst.amplification, &worst.largest) else { return };
    // One line, rewritten whole: the fuzzer may exit at any moment.
    let line = format!(
        "{target}\t{:.1}\t{}\t{}\t{}\t{}\t{:.3}\n",
        amplification.amplification(),
        amplification.bytes,
        amplification.input_bytes,
        largest.bytes,
        largest.input_bytes,
        largest.bytes as f64 / largest.bound() as f64,
    );
    let path = Path::new(&dir).join(format!("{target}.tsv"));
    let partial = path.with_extension("tsv.partial");
    if std::fs::write(&partial, line).is_ok() {
        let _ = std::fs::rename(&partial, &path);
    }
}

/// This process's temp folder, made once (removed by nobody: a fuzzing run
/// leaves a few small files in the system temp folder).
pub fn temp_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("isorun-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp folder");
        dir
    })
}

/// Writes `data` to `name` in the temp folder (made, with its parents, once)
/// and gives its path.
pub fn write(name: &str, data: &[u8]) -> PathBuf {
    let path = temp_dir().join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("a temp folder");
    }
    std::fs::write(&path, data).expect("writing a temp file");
    path
}

/// Batches read per signature: enough to go past the first, few enough to stay fast.
const BATCHES: usize = 3;

fn spec(path: &Path, label: &str, weight: Option<&str>, slices: &[&str], skip_corrupt: bool) -> DataSpec {
    DataSpec {
        paths: vec![path.to_path_buf()],
        label: label.to_string(),
        weight: weight.map(str::to_string),
        slices: slices.iter().map(|s| s.to_string()).collect(),
        renames: Vec::new(),
        limit: Some(64),
        batch_size: 7,
        skip_corrupt,
        shard: None,
        format: None,
        example_key: None,
    }
}

/// The names in a `MissingFeature`'s list of what there is: `name (kind,
/// n values), …` or `name (dtype [shape]), …`. Best effort: a name holding
/// `), ` is cut.
fn names(available: &str) -> Vec<String> {
    if available == "nothing" {
        return Vec::new();
    }
    available.split("), ").filter_map(|entry| entry.rfind(" (").map(|i| entry[..i].to_string())).take(4).collect()
}

fn input(name: &str, dtype: DType, shape: Option<Vec<Option<u64>>>) -> TensorSpec {
    TensorSpec { name: name.to_string(), dtype, shape }
}

/// Opens the dataset at `path` (a file or folder) and reads a few batches
/// for several signatures over its features; every failure must be an
/// error, and a batch must agree with its own shapes.
pub fn exercise_dataset(path: &Path, skip_corrupt: bool) {
    // A label nobody has: the error lists what there is.
    let names = match Dataset::open(spec(path, "\u{0}", None, &[], skip_corrupt)) {
        Err(DataError::MissingFeature { available, .. }) => names(&available),
        _ => return,
    };
    let Some(label) = names.first() else { return };
    let second = names.get(1).map(String::as_str);
    let dataset = match second {
        Some(other) => Dataset::open(spec(path, label, Some(other), &[other], skip_corrupt)).ok(),
        None => None,
    };
    let Some(dataset) = dataset.or_else(|| Dataset::open(spec(path, label, None, &[label], skip_corrupt)).ok()) else {
        return;
    };
    let all = |dtype: DType, shape: Option<Vec<Option<u64>>>| -> Vec<TensorSpec> {
        names.iter().map(|n| input(n, dtype, shape.clone())).collect()
    };
    let signatures = [
        all(DType::Float32, None),
        all(DType::Int64, Some(vec![None])),
        all(DType::Float64, Some(vec![None, None])),
        vec![input(label, DType::Float16, Some(vec![None, Some(2)]))],
        vec![input(label, DType::Bool, Some(vec![None, Some(1)]))],
        vec![input(label, DType::String, Some(vec![None]))],
        // Fed the serialized records where the data is TFRecord.
        vec![input("\u{0}records", DType::String, Some(vec![None]))],
    ];
    for inputs in signatures {
        let signature = SignatureInfo { key: "serving_default".into(), inputs, outputs: Vec::new() };
        let Ok(mut reader) = dataset.reader(&signature) else { continue };
        for _ in 0..BATCHES {
            match reader.next_batch() {
                Some(Ok(batch)) => {
                    let rows = batch.targets.rows;
                    assert_eq!(batch.targets.labels.len(), rows, "one label per row");
                    for (name, tensor) in &batch.inputs {
                        tensor.validate(|_| None).unwrap_or_else(|e| panic!("input {name}: {e}"));
                        assert_eq!(tensor.shape.first().copied(), Some(rows as u64), "input {name}: rows");
                    }
                }
                Some(Err(_)) | None => break,
            }
        }
    }
}
