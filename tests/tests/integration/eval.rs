//! `isorun eval` on models and datasets made by Python TensorFlow
//! (`scripts/make_eval_fixtures.py`): every metric equals what scikit-learn
//! and NumPy computed on Python TensorFlow's own predictions (the numbers
//! are in `tests/fixtures/eval/expected.json`); every data source gives the
//! same numbers; corrupt data, failures and crashes mid-dataset, thresholds,
//! baselines and resume behave as users rely on.

use crate::util::eval_fixtures::{self, case_flags, data, expected, model};
use crate::util::{bin, copy_dir, isorun, npy_bytes, ran, run, Ran};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `isorun eval MODELS --data DATA --label LABEL ARGS -j 1 --json`.
fn eval(models: &[PathBuf], data: &Path, label: &str, args: &[String]) -> Ran {
    eval_fixtures::eval(models, data, label, args)
}

fn case(name: &str) -> Value {
    expected()["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1e-12) || (a - b).abs() < 1e-12
}

/// Every metric of `expected` is in `got`, within 1e-6 relative.
fn assert_metrics(got: &Value, expected: &Value, what: &str) {
    for (name, want) in expected.as_object().unwrap() {
        let value = got[name].as_f64().unwrap_or_else(|| panic!("{what}: no metric {name} in {got}"));
        let want = want.as_f64().unwrap();
        assert!(close(value, want), "{what}: {name} is {value}, scikit-learn says {want}");
    }
}

fn ok_record<'a>(ran: &'a Ran, id: &str) -> &'a Value {
    assert_eq!(ran.code, Some(0), "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let record = ran.record(id);
    assert_eq!(record["status"], "ok", "{record}");
    record
}

#[test]
fn every_metric_matches_scikit_learn_on_tensorflow_s_predictions() {
    let expected = expected();
    for case in expected["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let id = case["model"].as_str().unwrap();
        let ran = eval(&[model(id)], &data("data.tfrecord"), case["label"].as_str().unwrap(), &case_flags(case));
        let record = ok_record(&ran, id);
        assert_eq!(record["examples"], expected["examples"], "{name}: {record}");
        assert_eq!(record["task"], case["task"], "{name}: {record}");
        assert_metrics(&record["metrics"], &case["metrics"], name);
        let asked = case_flags(case).iter().filter(|f| *f == "--metric").count();
        if asked > 0 {
            assert_eq!(record["metrics"].as_object().unwrap().len(), asked, "{name}: only the metrics asked for");
        } else {
            assert_eq!(record["metrics_defaulted"], true, "{name}: {record}");
        }
        for (feature, values) in case["slices"].as_object().unwrap() {
            for (value, metrics) in values.as_object().unwrap() {
                assert_metrics(&record["slices"][feature][value], metrics, &format!("{name} slice {feature}={value}"));
            }
        }
        // Throughput and latency are measured per model.
        assert!(record["examples_per_second"].as_f64().unwrap() > 0.0, "{record}");
        assert!(
            record["batch_latency_ms"]["p99"].as_f64().unwrap() >= record["batch_latency_ms"]["p50"].as_f64().unwrap()
        );
        assert!(record.get("outputs").is_none(), "an evaluation keeps metrics, not outputs: {record}");
    }
}

#[test]
fn every_data_source_gives_the_same_numbers() {
    let case = case("binary");
    let glob = data("shards").join("*.tfrecord");
    for source in [data("data.tfrecord.gz"), data("shards"), glob, data("data.npz"), data("npy")] {
        let ran = eval(&[model("binary")], &source, "label_bin", &case_flags(&case));
        let record = ok_record(&ran, "binary");
        assert_eq!(record["examples"], 1000, "{}: {record}", source.display());
        assert_metrics(&record["metrics"], &case["metrics"], &source.display().to_string());
    }
    // Several --data are read in order, as one dataset.
    let ran = run(isorun()
        .arg("eval")
        .arg(model("binary"))
        .args(["--label", "label_bin", "-j", "1", "--json"])
        .args(case_flags(&case))
        .arg("--data")
        .arg(data("shards/part-00000.tfrecord"))
        .arg("--data")
        .arg(data("shards/part-00001.tfrecord"))
        .arg("--data")
        .arg(data("shards/part-00002.tfrecord")));
    assert_metrics(&ok_record(&ran, "binary")["metrics"], &case["metrics"], "three --data");
}

#[test]
fn a_string_input_signature_is_fed_the_serialized_records() {
    let case = case("raw_examples");
    let ran = eval(&[model("raw_examples")], &data("data.tfrecord"), "label_bin", &case_flags(&case));
    let record = ok_record(&ran, "raw_examples");
    assert_metrics(&record["metrics"], &case["metrics"], "raw_examples");
    // The model parses the examples itself: its numbers are the binary model's.
    assert_metrics(&record["metrics"], &case["metrics"], "binary");
}

#[test]
fn limit_evaluates_the_first_examples_only() {
    let ran = eval(&[model("binary")], &data("data.tfrecord"), "label_bin", &["--limit".into(), "250".into()]);
    assert_eq!(ok_record(&ran, "binary")["examples"], 250);
}

#[test]
fn a_corrupt_record_is_the_model_s_error_naming_file_and_offset() {
    let expected = expected();
    let offset = expected["corrupt_offset"].as_u64().unwrap();
    let ran = eval(&[model("binary"), model("multiclass")], &data("corrupt.tfrecord"), "label_bin", &[]);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    for id in ["binary", "multiclass"] {
        let record = ran.record(id);
        assert_eq!(record["status"], "error", "{record}");
        assert_eq!(record["error"]["kind"], "dataset", "{record}");
        let message = record["error"]["message"].as_str().unwrap();
        assert!(message.contains("corrupt.tfrecord"), "{message}");
        assert!(message.contains(&offset.to_string()), "the offset {offset} is not in: {message}");
        // The batches before the corrupt record were evaluated.
        assert!(record["examples"].as_u64().unwrap() < 300, "{record}");
    }
    // --skip-corrupt goes on, and counts what it skipped.
    let ran = eval(&[model("binary")], &data("corrupt.tfrecord"), "label_bin", &["--skip-corrupt".into()]);
    let record = ok_record(&ran, "binary");
    assert_eq!(record["examples"], 999, "{record}");
    assert_eq!(record["skipped_corrupt"], 1, "{record}");
    // A file cut in the middle of a record.
    let truncated = expected["truncated_offset"].as_u64().unwrap();
    let ran = eval(&[model("binary")], &data("truncated.tfrecord"), "label_bin", &[]);
    let record = ran.record("binary");
    assert_eq!(record["status"], "error", "{record}");
    let message = record["error"]["message"].as_str().unwrap();
    assert!(message.contains("truncated.tfrecord") && message.contains(&truncated.to_string()), "{message}");
}

#[test]
fn a_model_that_fails_mid_dataset_reports_how_far_it_got() {
    // Example 750 makes fails_late fail: batches of 100 get through 700 examples.
    let ran = eval(
        &[model("fails_late"), model("binary")],
        &data("data.tfrecord"),
        "label_bin",
        &["--batch-size".into(), "100".into()],
    );
    assert_eq!(ran.code, Some(1));
    let record = ran.record("fails_late");
    assert_eq!(record["status"], "error", "{record}");
    assert_eq!(record["examples"], 700, "{record}");
    assert!(record["error"]["message"].as_str().unwrap().contains("fails_late expects"), "{record}");
    // The other model is not touched by it.
    assert_eq!(ran.record("binary")["status"], "ok");
    assert_eq!(ran.record("binary")["examples"], 1000);
}

/// A folder of NAME.npy arrays: `x` float32 [n, 1] (row `crash_row` holds 7.0, every other 0.25 or 0.75) and `label` int64 [n].
fn npy_dataset(dir: &Path, n: usize, crash_row: Option<usize>) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let x: Vec<u8> = (0..n)
        .map(|i| {
            if Some(i) == crash_row {
                7.0f32
            } else if i % 3 == 0 {
                0.75
            } else {
                0.25
            }
        })
        .flat_map(f32::to_le_bytes)
        .collect();
    let label: Vec<u8> = (0..n as i64).map(|i| i64::from(i % 2 == 0)).flat_map(i64::to_le_bytes).collect();
    let header =
        |descr: &str, shape: &str| format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    std::fs::write(data.join("x.npy"), npy_bytes(&header("<f4", &format!("({n}, 1)")), &x)).unwrap();
    std::fs::write(data.join("label.npy"), npy_bytes(&header("<i8", &format!("({n},)")), &label)).unwrap();
    data
}

#[test]
fn a_crash_mid_dataset_is_the_unit_s_outcome_and_a_retry_starts_from_the_first_example() {
    let dir = tempfile::tempdir().unwrap();
    // The fault worker echoes its inputs, as the echo model does; it crashes on
    // a batch whose first value is 7.0 (row 500: the sixth batch of 100).
    let crashing = dir.path().join("fault-crash-at-7");
    copy_dir(&model("echo"), &crashing);
    let data = npy_dataset(dir.path(), 1000, Some(500));
    let log = dir.path().join("served.log");
    let ran = run(isorun()
        .env("ISORUN_WORKER", bin("isorun-fault-worker"))
        .arg("eval")
        .arg(format!("--worker-arg=--log={}", log.display()))
        .args(["--sandbox", "off"])
        .arg(&crashing)
        .arg("--data")
        .arg(&data)
        .args([
            "--label",
            "label",
            "--batch-size",
            "100",
            "-j",
            "1",
            "--json",
            "--retries",
            "1",
            "--retry-on",
            "crashed",
        ]));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = ran.record("fault-crash-at-7");
    assert_eq!(record["status"], "crashed", "{record}");
    assert_eq!(record["examples"], 500, "{record}");
    assert_eq!(record["attempts"].as_array().unwrap().len(), 2, "{record}");
    // Each attempt sent batches 0..=5 (the sixth crashed): twelve requests, not six.
    let served = std::fs::read_to_string(&log).unwrap();
    assert_eq!(served.lines().count(), 12, "{served}");
}

#[test]
fn thresholds_and_baselines_decide_below_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let binary = case("binary");
    let accuracy = binary["metrics"]["accuracy"].as_f64().unwrap();
    // A bound the model misses: below_threshold, exit 1, the breach in the record.
    let ran =
        eval(&[model("binary")], &data("data.tfrecord"), "label_bin", &["--threshold".into(), "accuracy>=0.9".into()]);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = ran.record("binary");
    assert_eq!(record["status"], "below_threshold", "{record}");
    assert_eq!(record["breach"]["metric"], "accuracy");
    assert_eq!(record["breach"]["bound"], 0.9);
    assert!(close(record["breach"]["value"].as_f64().unwrap(), accuracy), "{record}");
    assert!(close(record["metrics"]["accuracy"].as_f64().unwrap(), accuracy), "the metrics stay in the record");
    // A bound it meets, and a loss bound in its own direction.
    let ran = eval(
        &[model("binary")],
        &data("data.tfrecord"),
        "label_bin",
        &["--threshold".into(), "accuracy>=0.8".into(), "--threshold".into(), "log_loss<=0.5".into()],
    );
    ok_record(&ran, "binary");

    // Last night's report, with accuracy 0.05 higher than today's for binary.
    let report = dir.path().join("baseline.json");
    let ran = run(isorun()
        .arg("eval")
        .arg(model("binary"))
        .arg(model("multiclass"))
        .arg("--data")
        .arg(data("data.tfrecord"))
        .args(["--label", "label_bin", "-j", "1", "--json", "--metric", "accuracy", "--report"])
        .arg(&report));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let mut baseline: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(baseline["schema_version"], 2);
    let units = baseline["units"].as_array_mut().unwrap();
    units.retain(|u| u["model"] == "binary");
    units[0]["metrics"] = json!({"accuracy": accuracy + 0.05});
    std::fs::write(&report, baseline.to_string()).unwrap();
    let with_baseline = |drop: &str| {
        run(isorun()
            .arg("eval")
            .arg(model("binary"))
            .arg(model("multiclass"))
            .arg("--data")
            .arg(data("data.tfrecord"))
            .args(["--label", "label_bin", "-j", "1", "--json", "--metric", "accuracy", "--baseline"])
            .arg(&report)
            .args(["--max-drop", drop]))
    };
    let ran = with_baseline("accuracy=0.01");
    let record = ran.record("binary");
    assert_eq!(record["status"], "below_threshold", "{record}");
    assert!(close(record["breach"]["baseline"].as_f64().unwrap(), accuracy + 0.05), "{record}");
    assert!(close(record["change"]["accuracy"]["delta"].as_f64().unwrap(), -0.05), "{record}");
    assert!(close(record["change"]["accuracy"]["baseline"].as_f64().unwrap(), accuracy + 0.05), "{record}");
    // A model the baseline does not have is new, not failed.
    assert_eq!(ran.record("multiclass")["status"], "ok");
    assert_eq!(ran.record("multiclass")["baseline"], "new");
    // 10% relative allows the 0.05 drop from about 0.86.
    let ran = with_baseline("accuracy=10%");
    assert_eq!(ran.record("binary")["status"], "ok", "{}", ran.stdout);
}

#[test]
fn bad_eval_arguments_are_usage_errors_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--data".into(),
                dir.path().join("missing.tfrecord").display().to_string(),
                "--label".into(),
                "label_bin".into(),
            ],
            "missing.tfrecord",
        ),
        (vec!["--data".into(), data("data.tfrecord").display().to_string(), "--label".into(), "nope".into()], "nope"),
        (
            vec![
                "--data".into(),
                data("data.tfrecord").display().to_string(),
                "--label".into(),
                "label_bin".into(),
                "--metric".into(),
                "acuracy".into(),
            ],
            "acuracy",
        ),
        (
            vec![
                "--data".into(),
                data("data.tfrecord").display().to_string(),
                "--label".into(),
                "label_bin".into(),
                "--threshold".into(),
                "accuracy=>0.9".into(),
            ],
            "accuracy=>0.9",
        ),
        (
            vec![
                "--data".into(),
                data("data.tfrecord").display().to_string(),
                "--label".into(),
                "label_bin".into(),
                "--input".into(),
                "x=x.npy".into(),
            ],
            "--input",
        ),
        (
            vec![
                "--data".into(),
                data("data.tfrecord").display().to_string(),
                "--label".into(),
                "label_bin".into(),
                "--feature".into(),
                "x".into(),
            ],
            "INPUT=FEATURE",
        ),
    ];
    for (args, named) in cases {
        let report = dir.path().join("report.json");
        let ran = run(isorun().arg("eval").arg(model("binary")).args(&args).arg("--report").arg(&report));
        assert_eq!(ran.code, Some(2), "{args:?}: {}", ran.stderr);
        assert!(ran.stderr.contains(named), "{args:?}: the error does not name {named}: {}", ran.stderr);
        assert!(ran.records.is_empty() && !report.exists(), "{args:?}: nothing is run or written");
    }
}

#[test]
fn resume_after_sigkill_gives_each_model_s_metrics_once() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.jsonl");
    let models = [model("binary"), model("multiclass"), model("regressor")];
    let args = |command: &mut std::process::Command| {
        command
            .arg("eval")
            .args(&models)
            .arg("--data")
            .arg(data("data.tfrecord"))
            .args(["--label", "label_bin", "-j", "1", "--json", "--metric", "accuracy", "--journal"])
            .arg(&journal);
    };
    let mut command = isorun();
    args(&mut command);
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_to_string(&journal).map_or(0, |j| j.lines().count()) == 0 {
        assert!(Instant::now() < deadline, "no unit was journaled");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let journaled = std::fs::read_to_string(&journal).unwrap().lines().count();
    assert!(journaled < 3, "SIGKILL came too late to test resume ({journaled} done)");
    let mut command = isorun();
    args(&mut command);
    let resumed = ran(command.arg("--resume").output().unwrap());
    assert_eq!(resumed.code, Some(0), "{}", resumed.stderr);
    assert_eq!(resumed.records.len(), 3, "{}", resumed.stdout);
    let fresh = eval(&models, &data("data.tfrecord"), "label_bin", &["--metric".into(), "accuracy".into()]);
    for (id, count) in [("binary", 1), ("multiclass", 1), ("regressor", 1)] {
        assert_eq!(resumed.records.iter().filter(|r| r["model"] == id).count(), count);
        assert_eq!(resumed.record(id)["metrics"], fresh.record(id)["metrics"], "{id}");
    }
    assert_eq!(resumed.records.iter().filter(|r| r["resumed"] == true).count(), journaled);
    // The journal holds each model once more than it was run again: never twice by a resume.
    let lines = std::fs::read_to_string(&journal).unwrap().lines().count();
    assert_eq!(lines, 3, "each model journaled once");
}

#[test]
fn the_supervisor_s_memory_does_not_grow_with_the_dataset() {
    // 40M examples (160 MB of float32 features, 320 MB of int64 labels),
    // several times the supervisor's bound, through the cheap echo model.
    let dir = tempfile::tempdir().unwrap();
    let n = 40_000_000;
    let data = npy_dataset(dir.path(), n, None);
    let ran = run(isorun().arg("eval").arg(model("echo")).arg("--data").arg(&data).args([
        "--label",
        "label",
        "--batch-size",
        "65536",
        "-j",
        "1",
        "--json",
        "--summary",
        "--metric",
        "accuracy",
        "--metric",
        "auc",
    ]));
    let record = ok_record(&ran, "echo");
    assert_eq!(record["examples"], n as u64);
    let peak_mib = crate::util::supervisor_peak_mib(&ran);
    let dataset_mib = (n * (4 + 8)) as f64 / (1024.0 * 1024.0);
    eprintln!("supervisor peak {peak_mib} MiB for a {dataset_mib:.0} MiB dataset");
    // 64 MiB, plus a few batches of 65536 rows (768 KiB each), plus slack.
    assert!(peak_mib < 96.0, "the supervisor peaked at {peak_mib} MiB for a {dataset_mib:.0} MiB dataset");
}

#[test]
fn output_dir_writes_every_batch_s_outputs_and_a_failed_model_leaves_none() {
    let dir = tempfile::tempdir().unwrap();
    let dataset = npy_dataset(dir.path(), 1000, None);
    let out = dir.path().join("out");
    let ran = run(isorun()
        .arg("eval")
        .arg(model("echo"))
        .arg("--data")
        .arg(&dataset)
        .args(["--label", "label", "--batch-size", "64", "-j", "1", "--json", "--metric", "accuracy", "--output-dir"])
        .arg(&out));
    assert_eq!(ran.record("echo")["status"], "ok", "{}", ran.stdout);
    // The echo model's output is its input: the file holds the 1000 rows, in order.
    let written = isorun_tensors::npy::read_npy_file(&out.join("echo").join("x.npy")).unwrap();
    let given = isorun_tensors::npy::read_npy_file(&dataset.join("x.npy")).unwrap();
    assert_eq!(written, given);
    // fails_late gets through 700 examples (seven batches written) before it fails: nothing stays.
    let out = dir.path().join("out-failed");
    let ran = run(isorun()
        .arg("eval")
        .arg(model("fails_late"))
        .arg("--data")
        .arg(data("data.tfrecord"))
        .args(["--label", "label_bin", "--batch-size", "100", "-j", "1", "--json", "--output-dir"])
        .arg(&out));
    let record = ran.record("fails_late");
    assert_eq!((record["status"].as_str(), record["examples"].as_u64()), (Some("error"), Some(700)), "{record}");
    let left: Vec<_> = std::fs::read_dir(out.join("fails_late")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "a failed model leaves no output, not even a temporary: {left:?}");
}

#[test]
fn a_batch_that_cannot_be_scored_ends_the_unit_with_its_error_and_leaves_no_files() {
    // Scored beside the worker, a batch's error may be learnt a batch later:
    // the unit still ends with it, the examples scored before it, no files.
    let dir = tempfile::tempdir().unwrap();
    let data = npy_dataset(dir.path(), 1000, None);
    // Row 450 (the fifth batch of 100) has label 5: outside a binary task's 0 and 1.
    let label: Vec<u8> =
        (0..1000i64).map(|i| if i == 450 { 5 } else { i64::from(i % 2 == 0) }).flat_map(i64::to_le_bytes).collect();
    let header = "{'descr': '<i8', 'fortran_order': False, 'shape': (1000,), }";
    std::fs::write(data.join("label.npy"), npy_bytes(header, &label)).unwrap();
    let (out, predictions) = (dir.path().join("out"), dir.path().join("preds"));
    let ran = run(isorun()
        .arg("eval")
        .arg(model("echo"))
        .arg("--data")
        .arg(&data)
        .args(["--label", "label", "--batch-size", "100", "-j", "1", "--json", "--metric", "accuracy"])
        .arg("--output-dir")
        .arg(&out)
        .arg("--predictions")
        .arg(&predictions));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = ran.record("echo");
    assert_eq!((record["status"].as_str(), record["examples"].as_u64()), (Some("error"), Some(400)), "{record}");
    assert_eq!(record["error"]["kind"], "evaluation", "{record}");
    let message = record["error"]["message"].as_str().unwrap();
    assert!(message.contains("label 5 at row 50 of the batch is outside"), "{record}");
    assert!(record.get("metrics").is_none() && record.get("predictions").is_none(), "{record}");
    let left: Vec<_> = std::fs::read_dir(out.join("echo")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "no outputs, not even a temporary: {left:?}");
    let left: Vec<_> = std::fs::read_dir(&predictions).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "no predictions, not even a temporary: {left:?}");
}

#[test]
fn batch_timeout_bounds_each_batch_and_timeout_the_whole_model() {
    let dir = tempfile::tempdir().unwrap();
    let dataset = npy_dataset(dir.path(), 1000, None);
    // The fault worker echoes, like the echo model, after sleeping this many ms per batch.
    let slow = |ms: u64| {
        let folder = dir.path().join(format!("fault-slow-{ms}"));
        copy_dir(&model("echo"), &folder);
        folder
    };
    let eval_slow = |folder: &Path, limits: &[&str]| {
        let started = Instant::now();
        let ran = run(isorun()
            .env("ISORUN_WORKER", bin("isorun-fault-worker"))
            .arg("eval")
            .arg(folder)
            .arg("--data")
            .arg(&dataset)
            .args(["--label", "label", "--batch-size", "100", "-j", "1", "--json", "--metric", "accuracy"])
            .args(limits));
        (ran, started.elapsed())
    };
    // Each batch takes 3 s; a batch may take 1 s.
    let (ran, took) = eval_slow(&slow(3000), &["--batch-timeout", "1"]);
    let record = ran.record("fault-slow-3000");
    assert_eq!((record["status"].as_str(), record["phase"].as_str()), (Some("timeout"), Some("run")), "{record}");
    assert_eq!(record["examples"], 0, "{record}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    // Each of the ten batches takes 0.4 s: fine for --batch-timeout 1, not for --timeout 2 over the whole model.
    let (ran, _) = eval_slow(&slow(400), &["--batch-timeout", "1"]);
    assert_eq!(ran.record("fault-slow-400")["status"], "ok", "{}", ran.stdout);
    let (ran, took) = eval_slow(&slow(400), &["--timeout", "2"]);
    let record = ran.record("fault-slow-400");
    assert_eq!(record["status"], "timeout", "{record}");
    let examples = record["examples"].as_u64().unwrap();
    assert!((100..1000).contains(&examples), "part of the data went through: {record}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn batch_timeout_bounds_a_later_batch_that_the_worker_answers_without_loaded() {
    // A worker says `Loaded` only for the request that loaded its model; the
    // sixth batch (first value 7.0, row 500) hangs: its run deadline runs
    // from its sending.
    let dir = tempfile::tempdir().unwrap();
    let hanging = dir.path().join("fault-hang-at-7");
    copy_dir(&model("echo"), &hanging);
    let data = npy_dataset(dir.path(), 1000, Some(500));
    let started = Instant::now();
    let ran = run(isorun()
        .env("ISORUN_WORKER", bin("isorun-fault-worker"))
        .arg("eval")
        .arg(&hanging)
        .arg("--data")
        .arg(&data)
        .args(["--label", "label", "--batch-size", "100", "-j", "1", "--json", "--metric", "accuracy"])
        .args(["--batch-timeout", "1"]));
    let record = ran.record("fault-hang-at-7");
    assert_eq!((record["status"].as_str(), record["phase"].as_str()), (Some("timeout"), Some("run")), "{record}");
    assert_eq!(record["examples"], 500, "five batches went through: {record}");
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
}

/// One `.npz` shard: its file name, and its entries' names and `.npy` bytes.
type Shard<'a> = (&'a str, Vec<(&'a str, Vec<u8>)>);

/// `.npz` shards in a folder, each a stored zip.
fn npz_shards(dir: &Path, shards: &[Shard]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, entries) in shards {
        let entries: Vec<(&str, &[u8])> = entries.iter().map(|(n, b)| (*n, b.as_slice())).collect();
        std::fs::write(dir.join(name), crate::bad_input::zip_stored(&entries, None)).unwrap();
    }
}

#[test]
fn a_later_npz_shard_with_a_string_label_is_the_models_dataset_error_not_the_end_of_the_data() {
    // Only the first shard's label kind was checked; the second's string
    // label killed the reading thread, which read as the end of the data:
    // the model ended `ok`, scored on the first shard, exit 0.
    let tmp = tempfile::tempdir().unwrap();
    let x = std::fs::read(data("npy/x.npy")).unwrap();
    let rows = isorun_tensors::npy::read_npy_file(&data("npy/x.npy")).unwrap().shape[0];
    let label = std::fs::read(data("npy/label_bin.npy")).unwrap();
    let strings = npy_bytes(
        &format!("{{'descr': '|S1', 'fortran_order': False, 'shape': ({rows},), }}"),
        &vec![b'y'; rows as usize],
    );
    let shards = tmp.path().join("shards");
    npz_shards(
        &shards,
        &[
            ("a.npz", vec![("x.npy", x.clone()), ("label_bin.npy", label)]),
            ("b.npz", vec![("x.npy", x), ("label_bin.npy", strings)]),
        ],
    );
    let ran = eval(&[model("binary")], &shards, "label_bin", &[]);
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let record = &ran.records[0];
    assert_eq!(record["status"], "error", "{record}");
    assert_eq!(record["error"]["kind"], "dataset", "{record}");
    let message = record["error"]["message"].as_str().unwrap();
    assert!(message.contains("b.npz"), "{message}");
}

#[test]
fn an_npz_whose_entry_claims_more_than_the_file_holds_is_refused_before_work() {
    let tmp = tempfile::tempdir().unwrap();
    let x = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 274877906944), }", &[0; 16]);
    let label = npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", &[0; 8]);
    let entries: Vec<(&str, &[u8])> = vec![("x.npy", &x), ("label_bin.npy", &label)];
    let path = tmp.path().join("lying.npz");
    std::fs::write(&path, crate::bad_input::zip_stored(&entries, Some(0xffff_fff0))).unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() < 1024);
    let ran = eval(&[model("binary")], &path, "label_bin", &[]);
    assert_eq!(ran.code, Some(2), "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.records.is_empty(), "{}", ran.stdout);
    assert!(ran.stderr.contains("lying.npz"), "{}", ran.stderr);
}

/// `--metric` flags of `names`.
fn metric_flags(names: &[&str]) -> Vec<String> {
    names.iter().flat_map(|m| ["--metric".to_string(), m.to_string()]).collect()
}

/// `isorun eval MODEL --data data.tfrecord --label LABEL -q --report DIR/NAME ARGS`: the one unit of the report.
fn unit_of_report(dir: &Path, name: &str, id: &str, label: &str, args: &[String]) -> Value {
    let path = dir.join(name);
    let ran = run(isorun()
        .arg("eval")
        .arg(model(id))
        .arg("--data")
        .arg(data("data.tfrecord"))
        .args(["--label", label, "-j", "1", "-q", "--report"])
        .arg(&path)
        .args(args));
    assert_eq!(ran.code, Some(0), "{name}: {}\n{}", ran.stdout, ran.stderr);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    report["units"][0].clone()
}

/// Scores that are not probabilities scored as if they were (the logits
/// model without `--from-logits`: brier 6.15, ece 0.92, log_loss 2.37; the
/// regressor scored as a binary classifier: ece 1.62, above its maximum of
/// 1): the metrics that read probabilities are left out (null) rather than
/// printed wrong, the record says why and what to do, the table shows them
/// as n/a, a bound on one cannot pass, and the metrics that stay right
/// (accuracy) are kept. Data shards merged say the same as one machine.
#[test]
fn scores_that_are_not_probabilities_leave_out_the_metrics_that_read_probabilities() {
    let tfrecord = data("data.tfrecord");
    let metrics = metric_flags(&["accuracy", "log_loss", "brier", "ece"]);
    let ran = eval(&[model("logits")], &tfrecord, "label_cls", &metrics);
    let record = ok_record(&ran, "logits");
    for metric in ["log_loss", "brier", "ece"] {
        assert!(record["metrics"][metric].is_null(), "{metric} of logits: {record}");
    }
    let found = &record["not_probabilities"];
    assert_eq!((found["examples"].as_u64(), found["of"].as_u64()), (Some(1000), Some(1000)), "{record}");
    assert_eq!(found["left_out"], json!(["log_loss", "brier", "ece"]), "{record}");
    assert!(found["min"].as_f64().unwrap() < 0.0, "{record}");
    let message = found["message"].as_str().unwrap();
    assert!(
        message.contains("output 'logits' are not probabilities") && message.contains("--from-logits"),
        "{message}"
    );
    assert!(record.get("calibration").is_none(), "no reliability diagram of logits: {record}");
    // With --from-logits every metric is there, and accuracy (argmax) is the same.
    let softmaxed =
        eval(&[model("logits")], &tfrecord, "label_cls", &[metrics.clone(), vec!["--from-logits".into()]].concat());
    let softmaxed = ok_record(&softmaxed, "logits");
    assert!(softmaxed.get("not_probabilities").is_none(), "{softmaxed}");
    assert!(softmaxed["metrics"].as_object().unwrap().values().all(Value::is_f64), "{softmaxed}");
    assert_eq!(softmaxed["metrics"]["accuracy"], record["metrics"]["accuracy"]);

    // The table says n/a, not a number.
    let table = run(isorun()
        .arg("eval")
        .arg(model("logits"))
        .arg("--data")
        .arg(&tfrecord)
        .args(["--label", "label_cls", "-j", "1", "--format", "table"])
        .args(&metrics));
    assert_eq!(table.code, Some(0), "{}\n{}", table.stdout, table.stderr);
    assert!(table.stdout.contains("ece n/a (not probabilities)"), "{}", table.stdout);

    // The regressor scored as a binary classifier: a bound on ece cannot pass.
    let bound = [metric_flags(&["accuracy", "ece"]), vec!["--threshold".into(), "ece<=0.5".into()]].concat();
    let ran = eval(&[model("regressor")], &tfrecord, "label_bin", &bound);
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let record = ran.record("regressor");
    assert_eq!(
        (record["status"].as_str(), record["breach"]["metric"].as_str()),
        (Some("below_threshold"), Some("ece"))
    );
    assert!(record["metrics"]["ece"].is_null() && record["metrics"]["accuracy"].is_f64(), "{record}");
    assert!(record["not_probabilities"]["max"].as_f64().unwrap() > 1.0, "{record}");

    // Three data shards merged: the same finding as one machine's.
    let dir = tempfile::tempdir().unwrap();
    let flags = metric_flags(&["accuracy", "ece"]);
    let one = unit_of_report(dir.path(), "one.json", "regressor", "label_bin", &flags);
    let shards: Vec<PathBuf> = (0..3)
        .map(|k| {
            let name = format!("{k}.json");
            let shard = [flags.clone(), vec!["--data-shard".into(), format!("{k}/3")]].concat();
            unit_of_report(dir.path(), &name, "regressor", "label_bin", &shard);
            dir.path().join(name)
        })
        .collect();
    let merged_path = dir.path().join("merged.json");
    let merged = run(isorun().args(["report", "merge", "--output"]).arg(&merged_path).args(&shards));
    assert_eq!(merged.code, Some(0), "{}", merged.stderr);
    let merged: Value = serde_json::from_str(&std::fs::read_to_string(&merged_path).unwrap()).unwrap();
    let merged = &merged["units"][0];
    assert!(one["not_probabilities"].is_object(), "{one}");
    assert_eq!(merged["not_probabilities"], one["not_probabilities"], "{merged}");
    assert!(merged["metrics"]["ece"].is_null(), "{merged}");
    assert_eq!(merged["metrics"]["accuracy"], one["metrics"]["accuracy"]);
}
