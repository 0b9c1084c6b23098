//! `isorun eval --data` on JSON Lines (`.jsonl`, `.jsonl.gz`): the fixture
//! data written by Python's json module (`scripts/make_eval_fixtures.py`)
//! gives the TFRecord run's metrics for every fixture model; `--data-format`
//! reads a file of another name; bad lines are errors naming the file, the
//! line and the key, before any worker runs when the first line shows them.

use crate::util::eval_fixtures::{self, case_flags};
use crate::util::{fixtures, isorun, run, Ran};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    fixtures().join("eval").join("data").join(name)
}

fn model(name: &str) -> PathBuf {
    fixtures().join("eval").join("models").join(name)
}

fn cases() -> Vec<Value> {
    let text = std::fs::read_to_string(fixtures().join("eval").join("expected.json")).unwrap();
    let expected: Value = serde_json::from_str(&text).unwrap();
    expected["cases"].as_array().unwrap().clone()
}

fn eval(model_name: &str, data: &Path, label: &str, args: &[String]) -> Ran {
    eval_fixtures::eval(&[model(model_name)], data, label, args)
}

fn ok_record(ran: &Ran, id: &str) -> Value {
    assert_eq!(ran.code, Some(0), "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    let record = ran.record(id).clone();
    assert_eq!(record["status"], "ok", "{record}");
    record
}

/// Every number in `want` (metrics, slices' metrics) equals `got`'s to 1e-12.
fn assert_same_numbers(got: &Value, want: &Value, what: &str) {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            assert_eq!(g.keys().collect::<Vec<_>>(), w.keys().collect::<Vec<_>>(), "{what}");
            for (key, value) in w {
                assert_same_numbers(&g[key], value, &format!("{what}.{key}"));
            }
        }
        (Value::Number(g), Value::Number(w)) => {
            let (g, w) = (g.as_f64().unwrap(), w.as_f64().unwrap());
            assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "{what}: {g} from JSON Lines, {w} from TFRecord");
        }
        _ => assert_eq!(got, want, "{what}"),
    }
}

#[test]
fn jsonl_and_jsonl_gz_give_the_tfrecord_run_s_metrics_for_every_fixture_model() {
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        let id = case["model"].as_str().unwrap();
        if id == "raw_examples" {
            // Fed serialized tf.Examples, which only TFRecord holds.
            continue;
        }
        let label = case["label"].as_str().unwrap();
        let tfrecord = ok_record(&eval(id, &data("data.tfrecord"), label, &case_flags(&case)), id);
        for file in ["data.jsonl", "data.jsonl.gz"] {
            let record = ok_record(&eval(id, &data(file), label, &case_flags(&case)), id);
            assert_eq!(record["examples"], 1000, "{name} {file}: {record}");
            assert_eq!(record["task"], tfrecord["task"], "{name} {file}");
            assert_same_numbers(&record["metrics"], &tfrecord["metrics"], &format!("{name} {file}"));
            if let Some(slices) = tfrecord.get("slices") {
                assert_same_numbers(&record["slices"], slices, &format!("{name} {file} slices"));
            }
        }
    }
}

#[test]
fn data_format_reads_a_jsonl_file_of_another_name() {
    let dir = tempfile::tempdir().unwrap();
    let txt = dir.path().join("examples.txt");
    std::fs::copy(data("data.jsonl"), &txt).unwrap();
    let metric = ["--metric".to_string(), "auc".to_string()];
    let ran = eval("binary", &txt, "label_bin", &metric);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("examples.txt: unknown data format") && ran.stderr.contains("--data-format"),
        "{}",
        ran.stderr
    );
    let with_format = [metric.to_vec(), vec!["--data-format".into(), "jsonl".into()]].concat();
    let record = ok_record(&eval("binary", &txt, "label_bin", &with_format), "binary");
    let tfrecord = ok_record(&eval("binary", &data("data.tfrecord"), "label_bin", &metric), "binary");
    assert_same_numbers(&record["metrics"], &tfrecord["metrics"], "examples.txt");
    // An unknown name lists the names.
    let ran = eval("binary", &txt, "label_bin", &["--data-format".into(), "json-lines".into()]);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("invalid value 'json-lines' for '--data-format <NAME>'"), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("tfrecord, tfrecord-gzip, npz, npy-folder, csv, parquet, arrow, jsonl, jsonl-gzip"),
        "{}",
        ran.stderr
    );
    assert!(ran.records.is_empty());
}

#[test]
fn bad_first_lines_are_usage_errors_naming_file_line_and_key_before_any_worker_runs() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "string_label.jsonl",
            format!("{}\n", r#"{"x": [1.0, 2.0, 3.0, 4.0], "label_bin": "yes"}"#),
            "string_label.jsonl: line 1: key 'label_bin': labels are numbers, not string",
        ),
        ("no_label.jsonl", format!("\n{}\n", r#"{"x": [1.0, 2.0, 3.0, 4.0]}"#), "no label 'label_bin'"),
        (
            "bad_json.jsonl",
            "{\"x\": [1.0, 2.0, 3.0, 4.0], \"label_bin\": 1\n".to_string(),
            "bad_json.jsonl: line 1: column",
        ),
        ("empty.jsonl", "\n\n".to_string(), "empty.jsonl: holds no examples"),
        ("cut.jsonl.gz", String::new(), "cut.jsonl.gz: line 1: cannot read: the gzip stream is corrupt or truncated"),
    ];
    for (name, text, want) in cases {
        let path = dir.path().join(name);
        if name.ends_with(".gz") {
            // A gzip stream cut after its header.
            let gz = std::fs::read(data("data.jsonl.gz")).unwrap();
            std::fs::write(&path, &gz[..20]).unwrap();
        } else {
            std::fs::write(&path, text).unwrap();
        }
        let report = dir.path().join("report.json");
        let ran = run(isorun()
            .arg("eval")
            .arg(model("binary"))
            .arg("--data")
            .arg(&path)
            .args(["--label", "label_bin", "--json", "--report"])
            .arg(&report));
        assert_eq!(ran.code, Some(2), "{name}: {}", ran.stderr);
        assert!(ran.stderr.contains(want), "{name}: expected '{want}' in: {}", ran.stderr);
        assert!(ran.records.is_empty() && !report.exists(), "{name}: nothing is run or written");
    }
    // A key the model's signature needs but the first line lacks is that
    // model's error (another model may not need it), before its worker is fed
    // (two keys could feed x: neither is chosen, see Dataset::auto_feature).
    let path = dir.path().join("no_x.jsonl");
    std::fs::write(&path, "{\"z\": [1.0, 2.0, 3.0, 4.0], \"label_bin\": 1, \"w\": 2.0}\n").unwrap();
    let ran = eval("binary", &path, "label_bin", &[]);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let message = ran.record("binary")["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("no_x.jsonl") && message.contains("input 'x'"), "{message}");
    assert!(message.contains("there are: z (float64 [4]), label_bin (int64)"), "{message}");
}

#[test]
fn a_later_line_that_does_not_fit_is_the_model_s_dataset_error_naming_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("later.jsonl");
    let mut text = std::fs::read_to_string(data("data.jsonl")).unwrap();
    text.push_str("{\"x\": [1.0, 2.0, 3.0], \"label_bin\": 1, \"country\": \"de\"}\n");
    std::fs::write(&path, text).unwrap();
    let ran = eval("binary", &path, "label_bin", &[]);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let record = ran.record("binary");
    assert_eq!(record["status"], "error", "{record}");
    assert_eq!(record["error"]["kind"], "dataset", "{record}");
    let message = record["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("later.jsonl: line 1001: key 'x' is a list of shape [3] but a list of shape [4] on line 1"),
        "{message}"
    );
}
