//! `isorun eval --data` on Parquet written by pandas and Arrow written by
//! Hugging Face `datasets` (`scripts/make_table_fixtures.py`): the same rows
//! as the TFRecord fixture give the metrics scikit-learn computed for it
//! (`tests/fixtures/eval/expected.json`), and a column that does not fit, a
//! missing column or a corrupt file is an error naming the file, the column
//! and the row.

use crate::util::{fixtures, isorun, run, Ran};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn eval_dir() -> PathBuf {
    fixtures().join("eval")
}

fn model(name: &str) -> PathBuf {
    eval_dir().join("models").join(name)
}

fn table(name: &str) -> PathBuf {
    eval_dir().join("data").join("tables").join(name)
}

fn case(name: &str) -> Value {
    let text = std::fs::read_to_string(eval_dir().join("expected.json")).unwrap();
    let expected: Value = serde_json::from_str(&text).unwrap();
    expected["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap()
}

fn case_flags(case: &Value) -> Vec<String> {
    case["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect()
}

fn eval(model_name: &str, data: &Path, label: &str, args: &[String]) -> Ran {
    run(isorun()
        .arg("eval")
        .arg(model(model_name))
        .arg("--data")
        .arg(data)
        .args(["--label", label, "-j", "1", "--json"])
        .args(args))
}

fn assert_metrics(got: &Value, expected: &Value, what: &str) {
    for (name, want) in expected.as_object().unwrap() {
        let value = got[name].as_f64().unwrap_or_else(|| panic!("{what}: no metric {name} in {got}"));
        let want = want.as_f64().unwrap();
        assert!((value - want).abs() <= 1e-6 * want.abs().max(1e-12), "{what}: {name} is {value}, expected {want}");
    }
}

#[test]
fn parquet_from_pandas_and_arrow_from_datasets_give_the_tfrecord_s_metrics() {
    let sources = [table("data.parquet"), table("hf"), table("hf/data-00000-of-00001.arrow"), table("data.feather")];
    for name in ["binary", "binary_weighted", "binary_sliced", "multiclass", "regression_weighted"] {
        let case = case(name);
        let id = case["model"].as_str().unwrap();
        for source in &sources {
            let what = format!("{name} on {}", source.display());
            // A batch size that cuts row groups and record batches.
            let mut flags = case_flags(&case);
            flags.extend(["--batch-size".to_string(), "128".to_string()]);
            let ran = eval(id, source, case["label"].as_str().unwrap(), &flags);
            assert_eq!(ran.code, Some(0), "{what}: {}\n{}", ran.stdout, ran.stderr);
            let record = ran.record(id);
            assert_eq!(record["status"], "ok", "{what}: {record}");
            assert_eq!(record["examples"], 1000, "{what}: {record}");
            assert_metrics(&record["metrics"], &case["metrics"], &what);
            for (feature, values) in case["slices"].as_object().unwrap() {
                for (value, metrics) in values.as_object().unwrap() {
                    let slice = &record["slices"][feature][value];
                    assert_metrics(slice, metrics, &format!("{what}: slice {feature}={value}"));
                }
            }
        }
    }
}

#[test]
fn a_data_shard_of_a_parquet_file_reads_its_row_groups() {
    // 4 row groups: shard 0/2 reads groups 0 and 1 (600 rows), 1/2 the rest.
    let mut flags = vec!["--metric".to_string(), "accuracy".into(), "--data-shard".into()];
    for (shard, rows) in [("0/2", 600), ("1/2", 400)] {
        flags.push(shard.into());
        let ran = eval("binary", &table("data.parquet"), "label_bin", &flags);
        assert_eq!(ran.code, Some(0), "{}", ran.stderr);
        assert_eq!(ran.record("binary")["examples"], rows, "{shard}");
        flags.pop();
    }
}

/// The message of the one model's error record.
fn model_error(ran: &Ran) -> String {
    let record = ran.record("binary");
    assert_eq!(record["status"], "error", "{record}");
    assert_eq!(record["error"]["kind"], "dataset", "{record}");
    record["error"]["message"].as_str().unwrap().to_string()
}

#[test]
fn columns_that_do_not_fit_name_the_file_column_and_row() {
    // A string column for a float input: refused from the schema, before
    // any batch (the model's error: another model's signature may take it).
    let ran = eval("binary", &table("wrong_type.parquet"), "label_bin", &[]);
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    let message = model_error(&ran);
    assert!(message.contains("wrong_type.parquet: column 'x': a string column cannot feed input x"), "{message}");
    assert!(ran.record("binary").get("batches").is_none(), "no batch was read: {}", ran.stdout);
    // Lists of unequal length in one batch, and a null label: the model's
    // dataset error, met mid-stream, naming the row.
    let small = ["--batch-size".to_string(), "4".to_string()];
    let ran = eval("binary", &table("ragged.parquet"), "label_bin", &small);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let message = model_error(&ran);
    assert!(
        message.contains("ragged.parquet: column 'x': row 6") && message.contains("a list of 3 values"),
        "{message}"
    );
    let ran = eval("binary", &table("null_label.parquet"), "label_bin", &small);
    let message = model_error(&ran);
    assert!(message.contains("null_label.parquet: column 'label_bin': row 4") && message.contains("null"), "{message}");
    // A missing column lists the columns there are.
    for source in [table("data.parquet"), table("hf")] {
        let ran = eval("binary", &source, "label", &[]);
        assert_eq!(ran.code, Some(2), "{}", ran.stderr);
        assert!(ran.stderr.contains("no label 'label'"), "{}", ran.stderr);
        assert!(ran.stderr.contains("label_bin (int64)") && ran.stderr.contains("x (float32 ["), "{}", ran.stderr);
    }
}

#[test]
fn a_truncated_or_corrupt_file_is_an_error_naming_it_never_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    for (name, source) in [("cut.parquet", table("data.parquet")), ("cut.arrow", table("hf/data-00000-of-00001.arrow"))]
    {
        let bytes = std::fs::read(&source).unwrap();
        let path = dir.path().join(name);
        // Cut: the footer (Parquet) or the end-of-stream marker (Arrow) is gone.
        std::fs::write(&path, &bytes[..bytes.len() * 2 / 3]).unwrap();
        let ran = eval("binary", &path, "label_bin", &[]);
        assert_eq!(ran.code, Some(2), "{name}: {}\n{}", ran.stdout, ran.stderr);
        assert!(ran.stderr.contains(name) && ran.stderr.contains("truncated?"), "{name}: {}", ran.stderr);
        // Bytes flipped in the middle (inside the data): an error or, where
        // the format cannot tell (no checksums), other values; never a crash.
        let mut flipped = bytes.clone();
        for at in (bytes.len() / 3..bytes.len() / 2).step_by(97) {
            flipped[at] ^= 0xa5;
        }
        let path = dir.path().join(format!("flipped-{name}"));
        std::fs::write(&path, &flipped).unwrap();
        let ran = eval("binary", &path, "label_bin", &[]);
        assert!(matches!(ran.code, Some(0..=2)), "{name}: {:?}\n{}", ran.code, ran.stderr);
        if ran.code != Some(0) {
            let text = format!("{}{}", ran.stdout, ran.stderr);
            assert!(text.contains(&format!("flipped-{name}")), "{name}: {text}");
        }
    }
}
