//! `isorun eval --predictions` and `isorun rescore`: the files exist only
//! for models that went through every batch, pandas/pyarrow/polars read
//! them as they are, `rescore` gives eval's records bit for bit on every
//! eval fixture case without starting a worker, and `rescore --diff` finds
//! exactly the examples planted as changed, refusing files of other data.

use crate::util::eval_fixtures::{data, eval, expected, model};
use crate::util::{fixtures, isorun, run, Ran};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn strings(flags: &Value) -> Vec<String> {
    flags.as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect()
}

/// `isorun rescore ARGS --json`, with a "worker" that leaves a mark if anything ever starts it.
fn rescore(args: &[&str], marker_dir: &Path) -> Ran {
    let marker = marker_dir.join("worker-started");
    let worker = marker_dir.join("fake-worker");
    if !worker.exists() {
        std::fs::write(&worker, format!("#!/bin/sh\ntouch '{}'\nexit 1\n", marker.display())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let ran = run(isorun().arg("rescore").args(args).arg("--json").env("ISORUN_WORKER", &worker).env("PATH", ""));
    assert!(!marker.exists(), "rescore started a worker: {ran:?}");
    ran
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Rescore's record equals eval's in every field it has (not its own
/// path, timing and file), and eval's record has no evaluation field that
/// rescore's lacks; `what` names the case.
fn assert_same_evaluation(rescored: &Value, evaluated: &Value, what: &str) {
    for (key, value) in rescored.as_object().unwrap() {
        if !matches!(key.as_str(), "path" | "wall_ms" | "predictions") {
            assert_eq!(value, &evaluated[key], "{what}: field {key}\nrescore: {rescored}\neval: {evaluated}");
        }
    }
    for key in ["metrics", "slices", "confusion_matrix", "task", "classes", "baseline_metrics", "change", "auc_exact"] {
        assert_eq!(rescored.get(key).is_some(), evaluated.get(key).is_some(), "{what}: field {key}");
    }
    assert!(rescored["metrics"].as_object().is_some_and(|m| !m.is_empty()), "{what}: {rescored}");
}

/// The fixtures venv's Python (pandas, pyarrow, scikit-learn), if any.
fn python() -> Option<PathBuf> {
    crate::util::fixtures_python("predictions python checks")
}

/// Runs a Python script with arguments; its stdout parsed as JSON.
fn python_json(python: &Path, script: &str, args: &[&str]) -> Value {
    let out = std::process::Command::new(python).arg("-c").arg(script).args(args).output().unwrap();
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn rescore_gives_eval_s_records_bit_for_bit_on_every_fixture_case_without_a_worker() {
    let expected = expected();
    let tmp = tempfile::tempdir().unwrap();
    for case in expected["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let id = case["model"].as_str().unwrap();
        let flags = strings(&case["flags"]);
        for format in ["parquet", "jsonl"] {
            let dir = tmp.path().join(format!("{name}-{format}"));
            let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
            args.extend(["--predictions", p(&dir), "--predictions-format", format]);
            let ran = eval(&[model(id)], &data("data.tfrecord"), case["label"].as_str().unwrap(), &args);
            assert_eq!(ran.code, Some(0), "{name}: {ran:?}");
            let record = ran.record(id);
            let file = dir.join(format!("{id}.{format}"));
            assert_eq!(record["predictions"], json!(file.to_string_lossy()), "{name}: {record}");
            // The file alone: eval's settings come from its description.
            let rescored = rescore(&[p(&dir)], tmp.path());
            assert_eq!(rescored.code, Some(0), "{name}: {rescored:?}");
            assert_same_evaluation(rescored.record(id), record, &format!("{name} ({format})"));
            // The same options given again: the same record.
            let mut again: Vec<&str> = vec![p(&file)];
            again.extend(flags.iter().filter(|f| *f != "--weight" && *f != "weight").map(String::as_str));
            let rescored = rescore(&again, tmp.path());
            assert_eq!(rescored.code, Some(0), "{name}: {rescored:?}");
            assert_same_evaluation(rescored.record(id), record, &format!("{name} ({format}, flags given)"));
        }
    }
}

#[test]
fn rescore_computes_a_metric_eval_was_not_asked_for_and_checks_rules_and_baselines() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("preds");
    let ran = eval(
        &[model("binary")],
        &data("data.tfrecord"),
        "label_bin",
        &["--metric", "accuracy", "--predictions", p(&dir)],
    );
    assert_eq!(ran.code, Some(0), "{ran:?}");
    // pr_auc, which eval did not compute, equals what a full eval computes.
    let full = eval(&[model("binary")], &data("data.tfrecord"), "label_bin", &["--metric", "pr_auc"]);
    let rescored = rescore(&[p(&dir), "--metric", "pr_auc"], tmp.path());
    assert_eq!(rescored.record("binary")["metrics"], full.record("binary")["metrics"]);
    // A bound it misses: below_threshold, exit 1, and a report like eval's.
    let report = tmp.path().join("r.json");
    let rescored = rescore(&[p(&dir), "--threshold", "accuracy>=0.99", "--report", p(&report)], tmp.path());
    assert_eq!(rescored.code, Some(1), "{rescored:?}");
    assert_eq!(rescored.record("binary")["status"], "below_threshold");
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(written["units"][0]["status"], "below_threshold", "{written}");
    // A baseline report and --max-drop, as eval takes them.
    let baseline = tmp.path().join("base.json");
    assert_eq!(rescore(&[p(&dir), "--report", p(&baseline)], tmp.path()).code, Some(0));
    let rescored = rescore(
        &[p(&dir), "--threshold", "0.9", "--baseline", p(&baseline), "--max-drop", "accuracy=0.01"],
        tmp.path(),
    );
    assert_eq!(rescored.code, Some(1), "{rescored:?}");
    assert!(rescored.record("binary")["change"]["accuracy"]["delta"].is_number(), "{}", rescored.record("binary"));
    // A slice eval did not save: exit 2 naming the file and its columns.
    let rescored = rescore(&[p(&dir), "--slice", "country"], tmp.path());
    assert_eq!(rescored.code, Some(2), "{rescored:?}");
    assert!(
        rescored.stderr.contains("binary.parquet") && rescored.stderr.contains("slice:country"),
        "{}",
        rescored.stderr
    );
    assert!(rescored.stderr.contains("index, label, output:probability"), "{}", rescored.stderr);
    // Not a predictions file: exit 2 naming it.
    let rescored = rescore(&[p(&data("tables"))], tmp.path());
    assert_eq!(rescored.code, Some(2), "{rescored:?}");
}

#[test]
fn a_model_that_fails_part_way_leaves_no_predictions_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("preds");
    let ran = eval(
        &[model("fails_late"), model("binary")],
        &data("data.tfrecord"),
        "label_bin",
        &["--batch-size", "100", "--predictions", p(&dir)],
    );
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert_eq!(ran.record("fails_late")["status"], "error");
    assert!(ran.record("fails_late").get("predictions").is_none());
    assert_eq!(ran.record("binary")["status"], "ok");
    let left: BTreeSet<String> =
        std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, BTreeSet::from(["binary.parquet".to_string()]), "no file, not even a temporary, for fails_late");
}

#[test]
fn pandas_pyarrow_and_polars_read_the_files_as_they_are() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("preds");
    let args = ["--weight", "weight", "--slice", "country", "--predictions", p(&dir), "--predictions-all"];
    assert_eq!(eval(&[model("binary")], &data("data.tfrecord"), "label_bin", &args).code, Some(0));
    assert_eq!(eval(&[model("multiclass")], &data("data.tfrecord"), "label_cls", &args).code, Some(0));
    let jsonl = tmp.path().join("jsonl");
    let args = ["--predictions", p(&jsonl), "--predictions-format", "jsonl"];
    assert_eq!(eval(&[model("multiclass")], &data("data.tfrecord"), "label_cls", &args).code, Some(0));
    let script = r#"
import json, sys
import pandas as pd, pyarrow.parquet as pq
out = {}
for name in ["binary", "multiclass"]:
    path = f"{sys.argv[1]}/{name}.parquet"
    df = pd.read_parquet(path)
    out[name] = {"columns": list(df.columns), "dtypes": [str(d) for d in df.dtypes], "rows": len(df),
                 "index_is_range": bool((df["index"] == range(len(df))).all()),
                 "first_output": [float(v) for v in (df.iloc[0, -1] if name == "multiclass" else [df.iloc[0, -1]])],
                 "meta": json.loads(pq.read_metadata(path).metadata[b"isorun"])}
try:
    import polars as pl
    out["polars_rows"] = pl.read_parquet(f"{sys.argv[1]}/multiclass.parquet").height
except ImportError:
    out["polars_rows"] = None
lines = pd.read_json(f"{sys.argv[2]}/multiclass.jsonl", lines=True)
out["jsonl"] = {"columns": list(lines.columns), "rows": len(lines), "labels": str(lines["label"].dtype)}
print(json.dumps(out))
"#;
    let got = python_json(&python, script, &[p(&dir), p(&jsonl)]);
    assert_eq!(
        got["binary"]["columns"],
        json!(["index", "label", "weight", "slice:country", "output:probability"]),
        "{got}"
    );
    assert_eq!(got["binary"]["dtypes"], json!(["uint64", "int64", "float64", "str", "float32"]), "{got}");
    assert_eq!(got["binary"]["rows"], 1000);
    assert_eq!(got["binary"]["index_is_range"], true);
    assert_eq!(got["binary"]["meta"]["task"], "binary");
    assert_eq!(got["binary"]["meta"]["output"], "probability");
    assert_eq!(got["multiclass"]["columns"][4], "output:probabilities");
    assert_eq!(got["multiclass"]["dtypes"][4], "object", "a list column");
    assert_eq!(got["multiclass"]["first_output"].as_array().unwrap().len(), 3);
    if !got["polars_rows"].is_null() {
        assert_eq!(got["polars_rows"], 1000);
    }
    assert_eq!(got["jsonl"]["columns"], json!(["index", "label", "output:probabilities"]), "{got}");
    assert_eq!(got["jsonl"]["rows"], 1000);
    assert_eq!(got["jsonl"]["labels"], "int64");
}

/// Copies a predictions file with pyarrow, keeping its description: `edit`
/// is Python run on `t` (a pyarrow Table) and may print JSON.
fn edit_copy(python: &Path, from: &Path, to: &Path, edit: &str) -> Value {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    let script = format!(
        r#"
import json, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
meta = pq.read_metadata(sys.argv[1]).metadata[b"isorun"]
t = pq.read_table(sys.argv[1])
result = None
{edit}
pq.write_table(t.replace_schema_metadata({{b"isorun": meta}}), sys.argv[2])
print(json.dumps(result))
"#
    );
    python_json(python, &script, &[p(from), p(to)])
}

fn changed_lines(ran: &Ran) -> Vec<&Value> {
    ran.records.iter().filter(|r| r.get("summary").is_none()).collect()
}

fn summary(ran: &Ran) -> &Value {
    &ran.records.iter().find(|r| r.get("summary").is_some()).unwrap_or_else(|| panic!("no summary: {ran:?}"))["summary"]
}

#[test]
fn diff_finds_exactly_the_planted_changes_by_index_with_mcnemar_s_p() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    assert_eq!(
        eval(&[model("binary")], &data("data.tfrecord"), "label_bin", &["--predictions", p(&base)]).code,
        Some(0)
    );
    let new = tmp.path().join("new");
    // Four examples flipped (p -> 1 - p changes the class at threshold 0.5), and one moved a little.
    let planted = edit_copy(
        &python,
        &base.join("binary.parquet"),
        &new.join("binary.parquet"),
        r#"
out = t.column("output:probability").to_numpy().copy()
label = t.column("label").to_numpy()
flip = [3, 17, 500, 999]
before = out > 0.5
out[flip] = 1 - out[flip]
out[20] = out[20] + 1e-4 if abs(out[20] - 0.5) > 0.01 else out[20]
after = out > 0.5
fixed = int(sum((before[i] != label[i]) and (after[i] == label[i]) for i in flip))
broke = int(sum((before[i] == label[i]) and (after[i] != label[i]) for i in flip))
t = t.set_column(t.schema.get_field_index("output:probability"), "output:probability", pa.array(out, pa.float32()))
from scipy.stats import binomtest
result = {"fixed": fixed, "broke": broke, "p": binomtest(fixed, fixed + broke).pvalue}
"#,
    );
    let changed = tmp.path().join("changed.parquet");
    let ran = rescore(&["--diff", p(&base), p(&new), "--output-changed", p(&changed)], tmp.path());
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let indices: Vec<u64> = changed_lines(&ran).iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert_eq!(indices, vec![3, 17, 500, 999], "{ran:?}");
    let s = summary(&ran);
    assert_eq!((s["examples"].as_u64(), s["changed"].as_u64()), (Some(1000), Some(4)), "{s}");
    assert_eq!(s["fixed"], planted["fixed"], "{s} vs {planted}");
    assert_eq!(s["broke"], planted["broke"], "{s} vs {planted}");
    assert_eq!(s["matched_by"], "index");
    let (got, want) = (s["mcnemar_p"].as_f64().unwrap(), planted["p"].as_f64().unwrap());
    assert!((got - want).abs() < 1e-12, "McNemar p {got}, scipy's binomtest {want}");
    let line = changed_lines(&ran)[0];
    assert!(line["label"].is_number() && line["baseline"]["class"] != line["new"]["class"], "{line}");
    // With a tolerance, the small move counts too.
    let ran = rescore(&["--diff", p(&base), p(&new), "--tolerance", "1e-5"], tmp.path());
    assert_eq!(summary(&ran)["changed"], 5, "{ran:?}");
    // The changed examples, for pandas.
    let rows = python_json(
        &python,
        "import json,sys,pandas as pd; d=pd.read_parquet(sys.argv[1]); print(json.dumps([list(d.columns), d['index'].tolist()]))",
        &[p(&changed)],
    );
    assert_eq!(rows[1], json!([3, 17, 500, 999]), "{rows}");
    assert!(rows[0].as_array().unwrap().contains(&json!("baseline_score")), "{rows}");
}

#[test]
fn diff_matches_by_key_whatever_the_order_and_refuses_other_data() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    // The JSON Lines fixture with an id per example.
    let text = std::fs::read_to_string(data("data.jsonl")).unwrap();
    let with_ids: String = text
        .lines()
        .enumerate()
        .map(|(i, line)| format!("{{\"id\": \"ex{i}\", {}\n", &line.trim_start()[1..]))
        .collect();
    let dataset = tmp.path().join("ids.jsonl");
    std::fs::write(&dataset, with_ids).unwrap();
    let base = tmp.path().join("base");
    let args = ["--example-key", "id", "--predictions", p(&base)];
    assert_eq!(eval(&[model("binary")], &dataset, "label_bin", &args).code, Some(0));
    let new = tmp.path().join("new");
    edit_copy(
        &python,
        &base.join("binary.parquet"),
        &new.join("binary.parquet"),
        r#"
keys = t.column("key").to_pylist()
out = t.column("output:probability").to_numpy().copy()
for k in ["ex5", "ex77"]:
    i = keys.index(k); out[i] = 1 - out[i]
t = t.set_column(t.schema.get_field_index("output:probability"), "output:probability", pa.array(out, pa.float32()))
t = t.take(np.random.default_rng(0).permutation(len(t)))
"#,
    );
    let ran = rescore(&["--diff", p(&base), p(&new)], tmp.path());
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let keys: BTreeSet<&str> = changed_lines(&ran).iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, BTreeSet::from(["ex5", "ex77"]), "{ran:?}");
    assert_eq!(summary(&ran)["matched_by"], "key");
    // Keys on one side only.
    let plain = tmp.path().join("plain");
    assert_eq!(eval(&[model("binary")], &dataset, "label_bin", &["--predictions", p(&plain)]).code, Some(0));
    let ran = rescore(&["--diff", p(&base), p(&plain)], tmp.path());
    assert_eq!(ran.code, Some(2), "{ran:?}");
    assert!(ran.stderr.contains(p(&base.join("binary.parquet"))) && ran.stderr.contains("keys"), "{}", ran.stderr);
    // Another example count.
    let fewer = tmp.path().join("fewer");
    let args = ["--limit", "500", "--predictions", p(&fewer)];
    assert_eq!(eval(&[model("binary")], &dataset, "label_bin", &args).code, Some(0));
    let ran = rescore(&["--diff", p(&plain), p(&fewer)], tmp.path());
    assert_eq!(ran.code, Some(2), "{ran:?}");
    assert!(
        ran.stderr.contains(p(&fewer.join("binary.parquet"))) && ran.stderr.contains("1000 examples, the other 500"),
        "{}",
        ran.stderr
    );
    // A label that differs for a matched example.
    let relabelled = tmp.path().join("relabelled");
    edit_copy(
        &python,
        &plain.join("binary.parquet"),
        &relabelled.join("binary.parquet"),
        r#"
label = t.column("label").to_numpy().copy(); label[10] = 1 - label[10]
t = t.set_column(t.schema.get_field_index("label"), "label", pa.array(label, pa.int64()))
"#,
    );
    let ran = rescore(&["--diff", p(&plain), p(&relabelled)], tmp.path());
    assert_eq!(ran.code, Some(2), "{ran:?}");
    assert!(ran.stderr.contains("index 10 has label"), "{}", ran.stderr);
    assert!(ran.stderr.contains(p(&relabelled.join("binary.parquet"))), "{}", ran.stderr);
}

#[test]
fn records_skipped_as_corrupt_are_counted_by_rescore_as_by_eval() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("preds");
    let args = ["--skip-corrupt", "--predictions", p(&dir)];
    let ran = eval(&[model("binary")], &data("corrupt.tfrecord"), "label_bin", &args);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let record = ran.record("binary");
    assert_eq!(record["skipped_corrupt"], 1, "{record}");
    let rescored = rescore(&[p(&dir)], tmp.path());
    assert_same_evaluation(rescored.record("binary"), record, "--skip-corrupt");
}

#[test]
fn rescore_ci_gives_eval_s_intervals_and_paired_gate_from_the_saved_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let ci = fixtures().join("ci");
    let night = |model: &str, dir: &std::path::Path, extra: &[&str]| {
        let mut command = isorun();
        command
            .arg("eval")
            .arg(ci.join(model).join("classifier"))
            .arg("--data")
            .arg(ci.join("data.tfrecord"))
            .args(["--label", "label", "--example-key", "id", "--ci", "0.9", "--bootstrap", "50"])
            .args(["--metric", "accuracy", "--metric", "auc", "--predictions"])
            .arg(dir)
            .args(extra);
        run(&mut command)
    };
    let last = tmp.path().join("last.json");
    let ran = night("last_night", &tmp.path().join("p-last"), &["--report", p(&last)]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let gate = ["--baseline", p(&last), "--max-drop", "accuracy=0.002", "--gate", "significant"];
    for (model, code) in [("noise", 0), ("regressed", 1)] {
        let dir = tmp.path().join(format!("p-{model}"));
        let evaluated = night(model, &dir, &gate);
        assert_eq!(evaluated.code, Some(code), "{evaluated:?}");
        let mut args = vec![p(&dir), "--ci", "0.9", "--bootstrap", "50", "--metric", "accuracy", "--metric", "auc"];
        args.extend(gate);
        let rescored = rescore(&args, tmp.path());
        assert_eq!(rescored.code, Some(code), "{rescored:?}");
        let (a, b) = (evaluated.record("classifier"), rescored.record("classifier"));
        for key in ["metrics", "ci", "ci_level", "bootstrap", "bootstrap_values", "change", "status"] {
            assert_eq!(a[key], b[key], "{model}: {key}");
        }
        assert_eq!(b["change"]["accuracy"]["significant"], json!(model == "regressed"), "{b}");
    }
    // Another seed: other weights, other intervals; last night's replicates are drawn
    // again from its predictions with that seed, so the gate still pairs.
    let dir = tmp.path().join("p-noise");
    let mut args = vec![p(&dir), "--ci", "0.9", "--bootstrap", "50", "--bootstrap-seed", "3"];
    args.extend(gate);
    let paired = rescore(&args, tmp.path());
    assert_eq!(paired.code, Some(0), "{paired:?}");
    assert_eq!(paired.record("classifier")["change"]["auc"]["test"], "paired_bootstrap", "{paired:?}");
    // Without its predictions the baseline's replicates of seed 0 cannot pair: refused (exit 2), naming it.
    let mut report: Value = serde_json::from_str(&std::fs::read_to_string(&last).unwrap()).unwrap();
    report["units"][0].as_object_mut().unwrap().remove("predictions");
    let bare = tmp.path().join("bare.json");
    std::fs::write(&bare, report.to_string()).unwrap();
    let mut args = vec![p(&dir), "--ci", "0.9", "--bootstrap", "50", "--bootstrap-seed", "3"];
    args.extend(["--baseline", p(&bare), "--max-drop", "accuracy=0.002", "--gate", "significant"]);
    let refused = rescore(&args, tmp.path());
    assert_eq!(refused.code, Some(2), "{refused:?}");
    assert!(refused.stderr.contains("bare.json"), "{}", refused.stderr);
}

#[test]
fn rescore_never_sizes_a_confusion_matrix_from_the_file_s_max_confusion_classes() {
    // A file claiming eval's --max-confusion-classes was 10^12, of a 2,000-class output:
    // believed, it is a 2,000² matrix (at 100,000 classes, 80 GB); rescore's default (1000) holds.
    let tmp = tempfile::tempdir().unwrap();
    let classes = 2000;
    let path = tmp.path().join("m.jsonl");
    let mut lines = String::new();
    for index in 0..4 {
        let mut output = vec![0.0f32; classes];
        output[index] = 1.0;
        lines += &json!({"index": index, "label": (index + 1) % classes, "output:p": output}).to_string();
        lines.push('\n');
    }
    std::fs::write(&path, lines).unwrap();
    let meta = json!({"isorun": {
        "version": 1, "model": "m", "output": "p", "output_shape": [null, classes],
        "outputs": [{"name": "p", "dtype": "float32", "row_shape": [classes]}],
        "label": "y", "label_kind": "int", "weight": null, "slices": [], "example_key": null,
        "metrics": ["accuracy"], "threshold": 0.5, "top_k": 5, "from_logits": false, "task": "multiclass",
        "first_batch_rows": 4, "examples": 4, "data_digest": "d", "data_shard": null, "skipped_corrupt": 0,
        "calibration_bins": 15, "max_confusion_classes": 1_000_000_000_000u64,
    }});
    std::fs::write(tmp.path().join("m.jsonl.isorun.json"), meta.to_string()).unwrap();
    let ran = rescore(&[p(&path)], tmp.path());
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let record: Value = serde_json::from_str(ran.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(record["status"], "ok", "{record}");
    assert_eq!(record["confusion_matrix_omitted"], true, "{record}");
    assert!(record.get("confusion_matrix").is_none_or(Value::is_null), "a {classes}² matrix was made");
    assert_eq!(record["top_confusions"][0], json!({"true": 1, "predicted": 0, "count": 1}), "{record}");
    // The user's flag, not the file, may ask for more.
    let ran = rescore(&[p(&path), "--max-confusion-classes", "2000"], tmp.path());
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let record: Value = serde_json::from_str(ran.stdout.lines().next().unwrap()).unwrap();
    let matrix = record["confusion_matrix"].as_array().expect("the matrix, as --max-confusion-classes asked");
    assert_eq!(matrix.len(), classes, "{}", record["confusion_matrix_omitted"]);
    assert_eq!(matrix[1][0], 1);
}
