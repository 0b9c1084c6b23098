//! One dataset on many machines: `isorun eval --data-shard K/N` on each
//! shard, then `isorun report merge`, must give the report one machine
//! gives: for every case of the eval fixtures (binary, weighted, thresholded,
//! sliced, multiclass, logits, regression, raw records) and every data
//! format (TFRecord, gzip TFRecord, `.npz`, an `.npy` folder, a folder of
//! several TFRecord files), with N = 1, 3 and 7, the merged metrics,
//! slices, confusion matrices and example counts equal the one-machine
//! ones to 1e-12, and the statuses and exit codes are the same. Shards that
//! are not of one evaluation (a shard missing, other flags, other or changed
//! data) are refused by the merge, naming what differs. A corrupt record
//! is met by exactly one shard, wherever it falls, as one machine meets it.

use crate::util::eval_fixtures::{data, dir as eval_dir, model};
use crate::util::{isorun, run, Ran};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A case of `tests/fixtures/eval/expected.json`: a model, a label and flags.
struct Case {
    name: String,
    model: String,
    label: String,
    flags: Vec<String>,
}

impl Case {
    /// Whether the case can read `format`: a slice feature (`country`) and
    /// the raw-records model need tf.Example records.
    fn reads(&self, format: &Format) -> bool {
        format.records || !(self.flags.iter().any(|f| f == "--slice") || self.model == "raw_examples")
    }
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(eval_dir().join("expected.json")).unwrap();
    let expected: Value = serde_json::from_str(&text).unwrap();
    let text = |v: &Value| v.as_str().unwrap().to_string();
    expected["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: text(&c["name"]),
            model: text(&c["model"]),
            label: text(&c["label"]),
            flags: c["flags"].as_array().unwrap().iter().map(text).collect(),
        })
        .collect()
}

fn case(name: &str) -> Case {
    cases().into_iter().find(|c| c.name == name).unwrap()
}

/// A data format of the fixtures; `records`: tf.Example records, which
/// have the slice feature and feed the raw-records model.
struct Format {
    path: PathBuf,
    records: bool,
}

fn format(name: &str) -> Format {
    Format { path: data(name), records: !name.ends_with("npz") && name != "npy" }
}

/// `isorun eval` of a case: its exit code and report.
fn eval(dir: &Path, case: &Case, data: &Path, extra: &[&str], report: &str) -> (Option<i32>, Value, Ran) {
    let path = dir.join(report);
    let ran = run(isorun()
        .arg("eval")
        .arg(model(&case.model))
        .arg("--data")
        .arg(data)
        .args(["--label", &case.label, "-j", "1", "-q", "--report"])
        .arg(&path)
        .args(&case.flags)
        .args(extra));
    assert!(path.is_file(), "{}: no report written ({:?}):\n{}", case.name, ran.code, ran.stderr);
    (ran.code, read_json(&path), ran)
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `isorun report merge --output merged.json REPORTS...`.
fn merge(dir: &Path, reports: &[PathBuf], extra: &[&str]) -> Ran {
    run(isorun().args(["report", "merge", "--output"]).arg(dir.join("merged.json")).args(reports).args(extra))
}

/// Runs the `count` data shards of a case and merges them: the merge's exit
/// code and the merged report.
fn sharded(dir: &Path, case: &Case, data: &Path, count: u64) -> (Option<i32>, Value) {
    let reports: Vec<PathBuf> = (0..count)
        .map(|k| {
            let name = format!("shard-{k}-of-{count}.json");
            let (code, report, ran) = eval(dir, case, data, &["--data-shard", &format!("{k}/{count}")], &name);
            // A shard checks no rule: it exits 1 only when the model failed on its part.
            let failed = report["units"].as_array().unwrap().iter().any(|u| u["status"] != "ok");
            assert_eq!(code, Some(i32::from(failed)), "{} shard {k}/{count}:\n{}", case.name, ran.stderr);
            dir.join(name)
        })
        .collect();
    let merged = merge(dir, &reports, &[]);
    (merged.code, read_json(&dir.join("merged.json")))
}

/// What a unit record holds that depends on how the work was run (times,
/// memory, batches, the worker), not on the data and the model.
const RUN_DETAILS: [&str; 15] = [
    "phases_ms",
    "attempts",
    "batch_latency_ms",
    "batches",
    "examples_per_second",
    "wall_ms",
    "load_ms",
    "run_ms",
    "user_ms",
    "sys_ms",
    "peak_rss_bytes",
    "worker_id",
    "worker_start",
    "sandbox",
    "resumed",
];

/// `a` and `b` are equal, numbers to 1e-12 (relative past 1).
fn assert_close(a: &Value, b: &Value, at: &str) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= 1e-12 * x.abs().max(y.abs()).max(1.0), "{at}: {x} against {y}");
        }
        (Value::Object(x), Value::Object(y)) => {
            let keys =
                |o: &serde_json::Map<String, Value>| o.keys().cloned().collect::<std::collections::BTreeSet<_>>();
            assert_eq!(keys(x), keys(y), "{at}: the keys");
            for (key, value) in x {
                assert_close(value, &y[key], &format!("{at}.{key}"));
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}: the lengths");
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                assert_close(x, y, &format!("{at}[{i}]"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

/// The merged report of the data shards is the one-machine report: every
/// field of every unit but the run details (metrics, slices, confusion
/// matrix, examples, status, task, output, exactness) to 1e-12, the
/// summary, and the exit code.
pub(crate) fn assert_same_report(local: (Option<i32>, &Value), merged: (Option<i32>, &Value), count: u64, what: &str) {
    assert_eq!(merged.0, local.0, "{what}: the exit code of the merge and of the one-machine eval");
    let (local, merged) = (local.1, merged.1);
    assert_eq!(merged["summary"], local["summary"], "{what}: the summary");
    let units = |report: &Value| report["units"].as_array().unwrap().clone();
    let (local_units, merged_units) = (units(local), units(merged));
    assert_eq!(local_units.len(), merged_units.len(), "{what}: the units");
    for (local_unit, merged_unit) in local_units.iter().zip(&merged_units) {
        let mut local_unit = local_unit.as_object().unwrap().clone();
        let mut merged_unit = merged_unit.as_object().unwrap().clone();
        let shards = merged_unit.shift_remove("data_shards").unwrap_or_else(|| panic!("{what}: no data_shards"));
        assert_eq!(shards.as_array().unwrap().len() as u64, count, "{what}: {shards}");
        for key in RUN_DETAILS {
            local_unit.shift_remove(key);
            merged_unit.shift_remove(key);
        }
        if local_unit["status"] != "ok" {
            // A failure is the failing shard's own record: its status and error kind are the model's.
            assert_eq!(merged_unit["status"], local_unit["status"], "{what}: {merged_unit:?}");
            assert_eq!(merged_unit["error"]["kind"], local_unit["error"]["kind"], "{what}: {merged_unit:?}");
            continue;
        }
        assert!(local_unit["metrics"].as_object().is_some_and(|m| !m.is_empty()), "{what}: {local_unit:?}");
        assert_close(&Value::Object(local_unit), &Value::Object(merged_unit), what);
    }
    let mut eval_settings = local["settings"]["eval"].clone();
    eval_settings["data_shards"] = count.into();
    let mut merged_settings = merged["settings"]["eval"].clone();
    merged_settings.as_object_mut().unwrap().shift_remove("data_digest");
    assert_eq!(merged_settings, eval_settings, "{what}: settings.eval");
}

/// Every case that reads `format`, with `counts` data shards each, against one machine.
fn every_case_on(format_name: &str, counts_for: impl Fn(&Case) -> Vec<u64>) {
    let format = format(format_name);
    let mut checked = 0;
    for case in cases().iter().filter(|c| c.reads(&format)) {
        let dir = tempfile::tempdir().unwrap();
        let (code, local, ran) = eval(dir.path(), case, &format.path, &[], "local.json");
        assert_eq!(code, Some(0), "{} on {format_name}:\n{}", case.name, ran.stderr);
        for count in counts_for(case) {
            let what = format!("{} on {format_name}, {count} data shards", case.name);
            let merged = sharded(dir.path(), case, &format.path, count);
            assert_same_report((code, &local), (merged.0, &merged.1), count, &what);
            checked += 1;
        }
    }
    assert!(checked >= 9, "{format_name}: only {checked} cases read it");
}

/// N = 3 for every case; 1 and 7 too for the weighted binary case (whose
/// AUC sums weights per distinct score), on every format. One invocation
/// costs a worker start, so not every case gets every N.
fn counts(case: &Case) -> Vec<u64> {
    if case.name == "binary_weighted" {
        vec![1, 3, 7]
    } else {
        vec![3]
    }
}

#[test]
fn shards_of_a_tfrecord_file_split_at_byte_offsets_merge_into_the_one_machine_report() {
    // 7 byte ranges resynchronised on record boundaries for the sliced, multiclass and regression cases too.
    let thorough = ["binary_weighted", "binary_sliced", "multiclass_weighted", "regression_weighted", "raw_examples"];
    every_case_on("data.tfrecord", |case| if thorough.contains(&case.name.as_str()) { vec![1, 3, 7] } else { vec![3] });
}

#[test]
fn shards_of_a_gzip_tfrecord_file_merge_into_the_one_machine_report() {
    every_case_on("data.tfrecord.gz", counts);
}

#[test]
fn shards_of_an_npz_file_merge_into_the_one_machine_report() {
    every_case_on("data.npz", counts);
}

#[test]
fn shards_of_an_npy_folder_merge_into_the_one_machine_report() {
    every_case_on("npy", counts);
}

#[test]
fn shards_of_a_folder_of_files_whole_or_split_merge_into_the_one_machine_report() {
    // Three files: N = 3 gives each shard one whole file, N = 7 splits each file in 7.
    every_case_on("shards", counts);
}

#[test]
fn rules_and_failures_decide_the_merged_outcome_as_on_one_machine() {
    let dir = tempfile::tempdir().unwrap();
    let tfrecord = data("data.tfrecord");
    // A bound the model misses, checked by the merge (a shard checks none): below_threshold, exit 1.
    let mut missed = case("binary");
    missed.flags.extend(["--threshold".into(), "auc>=0.95".into()]);
    let (code, local, _) = eval(dir.path(), &missed, &tfrecord, &[], "local.json");
    assert_eq!((code, local["units"][0]["status"].as_str()), (Some(1), Some("below_threshold")));
    let merged = sharded(dir.path(), &missed, &tfrecord, 3);
    assert_same_report((code, &local), (merged.0, &merged.1), 3, "a missed bound");
    assert_eq!(merged.1["units"][0]["breaches"], local["units"][0]["breaches"]);

    // A model that fails at example 750: the shard holding it fails, and so does the merged model.
    let fails_late = Case { name: "fails_late".into(), model: "fails_late".into(), ..case("binary_default") };
    let (code, local, _) = eval(dir.path(), &fails_late, &tfrecord, &[], "local.json");
    assert_eq!((code, local["units"][0]["status"].as_str()), (Some(1), Some("error")));
    let merged = sharded(dir.path(), &fails_late, &tfrecord, 3);
    assert_same_report((code, &local), (merged.0, &merged.1), 3, "a failure on one shard");
    assert_eq!(merged.1["units"][0]["failed_data_shard"], "2/3", "{}", merged.1["units"][0]);
}

/// The reports of data shards 0 and 1 of 3 of the binary case, in `dir`.
fn two_of_three_shards(dir: &Path) -> Vec<PathBuf> {
    let binary = case("binary");
    (0..2)
        .map(|k| {
            let name = format!("{k}.json");
            let (code, _, ran) =
                eval(dir, &binary, &data("data.tfrecord"), &["--data-shard", &format!("{k}/3")], &name);
            assert_eq!(code, Some(0), "{}", ran.stderr);
            dir.join(name)
        })
        .collect()
}

#[test]
fn a_missing_data_shard_is_refused_unless_partial() {
    let dir = tempfile::tempdir().unwrap();
    let reports = two_of_three_shards(dir.path());
    let merged = merge(dir.path(), &reports, &[]);
    assert_eq!(merged.code, Some(2), "{}", merged.stderr);
    assert!(merged.stderr.contains("missing data shard 2/3"), "{}", merged.stderr);
    assert!(merged.stderr.contains("--partial"), "{}", merged.stderr);
    assert!(!dir.path().join("merged.json").exists(), "a refused merge writes nothing");

    // --partial merges them, but never as the metrics of part of the data: the model is not_run.
    let merged = merge(dir.path(), &reports, &["--partial"]);
    assert_eq!(merged.code, Some(1), "{}", merged.stderr);
    assert!(merged.stderr.contains("missing data shard 2/3"), "{}", merged.stderr);
    let report = read_json(&dir.path().join("merged.json"));
    let unit = &report["units"][0];
    assert_eq!(unit["status"], "not_run", "{unit}");
    assert_eq!(unit["reason"], "shard_task_lost", "{unit}");
    assert_eq!(unit["missing_data_shards"], serde_json::json!(["2/3"]), "{unit}");
    assert!(unit.get("metrics").is_none(), "{unit}");
    assert_eq!(report["settings"]["missing_shards"], serde_json::json!(["data shard 2/3"]));
}

/// Merges shards 0 and 1 with a shard 2 run with `extra` flags (or other
/// `data`): the merge's stderr, after checking it refused (exit 2).
fn refused_third_shard(data: &Path, extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut reports = two_of_three_shards(dir.path());
    let flags = [&["--data-shard", "2/3"], extra].concat();
    let (code, _, ran) = eval(dir.path(), &case("binary"), data, &flags, "2.json");
    assert_eq!(code, Some(0), "{}", ran.stderr);
    reports.push(dir.path().join("2.json"));
    let merged = merge(dir.path(), &reports, &[]);
    assert_eq!(merged.code, Some(2), "{}", merged.stderr);
    assert!(!dir.path().join("merged.json").exists(), "a refused merge writes nothing");
    assert!(merged.stderr.contains("not data shards of one evaluation"), "{}", merged.stderr);
    merged.stderr
}

#[test]
fn a_shard_run_with_other_flags_or_data_is_refused_naming_what_differs() {
    let tfrecord = data("data.tfrecord");
    let error = refused_third_shard(&tfrecord, &["--weight", "weight"]);
    assert!(error.contains("settings.eval.weight differ (absent against \"weight\")"), "{error}");
    let error = refused_third_shard(&tfrecord, &["--slice", "country"]);
    assert!(error.contains("settings.eval.slices differ"), "{error}");
    let error = refused_third_shard(&tfrecord, &["--threshold", "0.7"]);
    assert!(error.contains("settings.eval.thresholds differ"), "{error}");
    // A renamed input reads the same files otherwise: the dataset's digest tells them apart.
    let error = refused_third_shard(&tfrecord, &["--feature", "x=x"]);
    assert!(error.contains("settings.eval.data_digest differ"), "{error}");
    assert!(error.contains("--feature"), "{error}");
    // Other data: the gzip copy of the same examples is other files.
    let error = refused_third_shard(&data("data.tfrecord.gz"), &[]);
    assert!(error.contains("settings.eval.data differ"), "{error}");
    // Flags the metric state keeps: the merge of the states names them.
    let dir = tempfile::tempdir().unwrap();
    let mut reports = two_of_three_shards(dir.path());
    let (_, _, ran) = eval(dir.path(), &case("binary"), &tfrecord, &["--data-shard", "2/3", "--top-k", "3"], "2.json");
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    reports.push(dir.path().join("2.json"));
    let merged = merge(dir.path(), &reports, &[]);
    assert_eq!(merged.code, Some(2), "{}", merged.stderr);
    assert!(merged.stderr.contains("top_k"), "{}", merged.stderr);
}

#[test]
fn a_data_file_changed_between_shards_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("data.tfrecord");
    std::fs::copy(data("data.tfrecord"), &copy).unwrap();
    let binary = case("binary");
    let run_shard = |k: u64| {
        let name = format!("{k}.json");
        let (code, _, ran) = eval(dir.path(), &binary, &copy, &["--data-shard", &format!("{k}/2")], &name);
        assert_eq!(code, Some(0), "{}", ran.stderr);
        dir.path().join(name)
    };
    let first = run_shard(0);
    // Rewritten between the two shards (same bytes, a new modification time), as a pipeline rerun would.
    let file = std::fs::File::options().write(true).open(&copy).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    file.set_modified(later).unwrap();
    drop(file);
    let second = run_shard(1);
    let merged = merge(dir.path(), &[first, second], &[]);
    assert_eq!(merged.code, Some(2), "{}", merged.stderr);
    assert!(merged.stderr.contains("settings.eval.data_digest differ"), "{}", merged.stderr);
    assert!(merged.stderr.contains("size and modification time"), "{}", merged.stderr);
}

#[test]
fn limit_with_data_shard_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run(isorun()
        .arg("eval")
        .arg(model("binary"))
        .arg("--data")
        .arg(data("data.tfrecord"))
        .args(["--label", "label_bin", "--data-shard", "0/2", "--limit", "10", "--report"])
        .arg(dir.path().join("r.json")));
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("--limit cannot be given with --data-shard"), "{}", ran.stderr);
    assert!(!dir.path().join("r.json").exists());
    for bad in ["3/3", "1-3", "0/0"] {
        let ran = run(isorun().arg("eval").arg(model("binary")).arg("--data").arg(data("data.tfrecord")).args([
            "--label",
            "label_bin",
            "--data-shard",
            bad,
        ]));
        assert_eq!(ran.code, Some(2), "--data-shard {bad}: {}", ran.stderr);
        assert!(ran.stderr.contains("--data-shard"), "{}", ran.stderr);
    }
}

#[test]
fn a_corrupt_record_first_in_a_data_shard_is_reported_as_on_one_machine() {
    // Record 500 of 1000 (144 bytes each) starts where data shard 1/2's bytes
    // do; its data CRC fails. One machine fails on it (or with --skip-corrupt
    // skips it); so must the shards merged, not read past it as if it were
    // not a record.
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(data("data.tfrecord")).unwrap();
    let start = bytes.len() / 2;
    assert_eq!(start, 500 * 144);
    bytes[start + 12 + 5] ^= 0x40;
    let corrupt = dir.path().join("corrupt-at-half.tfrecord");
    std::fs::write(&corrupt, &bytes).unwrap();
    let binary = case("binary");
    let (code, local, ran) = eval(dir.path(), &binary, &corrupt, &[], "local.json");
    assert_eq!((code, local["units"][0]["status"].as_str()), (Some(1), Some("error")), "{}", ran.stderr);
    let message = local["units"][0]["error"]["message"].as_str().unwrap();
    assert!(message.contains("data CRC32C mismatch") && message.contains(&start.to_string()), "{message}");
    let merged = sharded(dir.path(), &binary, &corrupt, 2);
    assert_same_report((code, &local), (merged.0, &merged.1), 2, "a corrupt record first in shard 1/2");
    assert_eq!(merged.1["units"][0]["failed_data_shard"], "1/2", "{}", merged.1["units"][0]);

    let skipping = Case { flags: [&binary.flags[..], &["--skip-corrupt".to_string()]].concat(), ..case("binary") };
    let (code, local, ran) = eval(dir.path(), &skipping, &corrupt, &[], "local.json");
    assert_eq!(code, Some(0), "{}", ran.stderr);
    assert_eq!(
        (local["units"][0]["examples"].as_u64(), local["units"][0]["skipped_corrupt"].as_u64()),
        (Some(999), Some(1))
    );
    let merged = sharded(dir.path(), &skipping, &corrupt, 2);
    assert_same_report((code, &local), (merged.0, &merged.1), 2, "a corrupt record first in shard 1/2, skipped");
}
