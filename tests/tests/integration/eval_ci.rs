//! `isorun eval --ci`: intervals on every metric and slice, the same for
//! the same model and data every time, the same merged from `--data-shard`
//! shards keyed by `--example-key` as on one machine, and `--baseline …
//! --gate significant` passing a noise-level drop while failing a planted
//! regression (tests/fixtures/ci, made by scripts/make_ci_fixtures.py with
//! TensorFlow: last night's classifier, tonight's flipped near the decision
//! boundary and tonight's flipped on a known set of examples).

use crate::util::{fixtures, isorun, run, Ran};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn ci_dir() -> PathBuf {
    fixtures().join("ci")
}

fn checkpoint(name: &str) -> PathBuf {
    ci_dir().join(name).join("classifier")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// `isorun eval CHECKPOINT --data data.tfrecord --label label --example-key id --ci 0.95 ARGS --report REPORT`.
fn eval_ci(model: &Path, report: &Path, args: &[&str]) -> (Ran, Value) {
    let ran = run(isorun()
        .arg("eval")
        .arg(model)
        .arg("--data")
        .arg(ci_dir().join("data.tfrecord"))
        .args(["--label", "label", "--example-key", "id", "--ci", "0.95", "-j", "1", "-q", "--report"])
        .arg(report)
        .args(args));
    assert!(report.is_file(), "no report ({:?}):\n{}", ran.code, ran.stderr);
    let unit = read_json(report)["units"][0].clone();
    (ran, unit)
}

fn interval(value: &Value) -> (f64, f64) {
    (value[0].as_f64().unwrap(), value[1].as_f64().unwrap())
}

#[test]
fn every_metric_and_slice_has_an_interval_around_it_and_the_same_one_every_run() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--slice", "country", "--bootstrap", "100"];
    let (ran, unit) = eval_ci(&checkpoint("last_night"), &dir.path().join("a.json"), &args);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(unit["ci_level"], 0.95);
    assert_eq!(unit["bootstrap"], serde_json::json!({"replicates": 100, "seed": 0, "by": "key"}));
    for (metric, value) in unit["metrics"].as_object().unwrap() {
        let (low, high) = interval(&unit["ci"][metric]);
        let value = value.as_f64().unwrap();
        assert!(low < high && low <= value + 1e-3 && value - 1e-3 <= high, "{metric}: {value} [{low}, {high}]");
        assert_eq!(unit["bootstrap_values"][metric].as_array().unwrap().len(), 100, "{metric}");
    }
    let countries = unit["slices"]["country"].as_object().unwrap();
    assert_eq!(countries.len(), 4, "{unit}");
    for (country, slice) in countries {
        let (low, high) = interval(&slice["ci"]["accuracy"]);
        // A quarter of the data: a wider interval than the whole data's.
        let (all_low, all_high) = interval(&unit["ci"]["accuracy"]);
        assert!(high - low > all_high - all_low, "{country}: [{low}, {high}] against [{all_low}, {all_high}]");
    }
    // The same model, the same data: the same weights, the same interval, bit for bit.
    let (_, again) = eval_ci(&checkpoint("last_night"), &dir.path().join("b.json"), &args);
    assert_eq!(again["ci"], unit["ci"]);
    assert_eq!(again["slices"]["country"]["de"]["ci"], unit["slices"]["country"]["de"]["ci"]);
    // Another seed, other weights.
    let (_, seeded) = eval_ci(
        &checkpoint("last_night"),
        &dir.path().join("c.json"),
        &[&args[..], &["--bootstrap-seed", "9"]].concat(),
    );
    assert_ne!(seeded["ci"], unit["ci"]);
}

#[test]
fn data_shards_keyed_by_example_key_merge_into_one_machines_intervals() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--slice", "country", "--bootstrap", "50", "--metric", "accuracy", "--metric", "auc"];
    let (_, whole) = eval_ci(&checkpoint("last_night"), &dir.path().join("whole.json"), &args);
    let shards: Vec<PathBuf> = (0..3)
        .map(|k| {
            let path = dir.path().join(format!("shard-{k}.json"));
            let (ran, _) =
                eval_ci(&checkpoint("last_night"), &path, &[&args[..], &["--data-shard", &format!("{k}/3")]].concat());
            assert_eq!(ran.code, Some(0), "{}", ran.stderr);
            path
        })
        .collect();
    let merged_path = dir.path().join("merged.json");
    let merged = run(isorun().args(["report", "merge", "--output"]).arg(&merged_path).args(&shards));
    assert_eq!(merged.code, Some(0), "{}", merged.stderr);
    let merged = read_json(&merged_path)["units"][0].clone();
    let close = |a: &Value, b: &Value, what: &str| {
        let (a, b) = (interval(a), interval(b));
        assert!((a.0 - b.0).abs() < 1e-12 && (a.1 - b.1).abs() < 1e-12, "{what}: {a:?} against {b:?}");
    };
    for metric in ["accuracy", "auc"] {
        close(&merged["ci"][metric], &whole["ci"][metric], metric);
        for country in ["de", "fr", "jp", "us"] {
            let (m, w) = (
                &merged["slices"]["country"][country]["ci"][metric],
                &whole["slices"]["country"][country]["ci"][metric],
            );
            close(m, w, &format!("{metric} in {country}"));
        }
    }
    assert_eq!(merged["bootstrap"], whole["bootstrap"]);
}

#[test]
fn gate_significant_passes_a_noise_level_drop_and_fails_the_planted_regression() {
    let dir = tempfile::tempdir().unwrap();
    let expected = read_json(&ci_dir().join("expected.json"));
    let accuracy = |model: &str| expected["models"][model]["accuracy"].as_f64().unwrap();
    let baseline = dir.path().join("last-night.json");
    let (ran, _) = eval_ci(&checkpoint("last_night"), &baseline, &["--metric", "accuracy"]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let baseline_text = baseline.to_str().unwrap();
    // Both drop by more than 0.002: the noise model by a few discordant examples near the boundary.
    assert!(accuracy("last_night") - accuracy("noise") > 0.002);
    assert!(accuracy("last_night") - accuracy("regressed") > 0.02);
    let tonight = |model: &str, gate: &str| {
        let report = dir.path().join(format!("{model}-{gate}.json"));
        let args =
            ["--metric", "accuracy", "--baseline", baseline_text, "--max-drop", "accuracy=0.002", "--gate", gate];
        eval_ci(&checkpoint(model), &report, &args)
    };
    // Without the gate, noise fails the night.
    let (ran, unit) = tonight("noise", "always");
    assert_eq!((ran.code, unit["status"].as_str()), (Some(1), Some("below_threshold")), "{unit}");
    // With it, the noise-level drop passes: its paired interval holds 0.
    let (ran, unit) = tonight("noise", "significant");
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let change = &unit["change"]["accuracy"];
    assert!((change["delta"].as_f64().unwrap() - (accuracy("noise") - accuracy("last_night"))).abs() < 1e-12);
    assert_eq!(change["baseline"].as_f64().unwrap(), accuracy("last_night"));
    let (low, high) = interval(&change["ci"]);
    assert!(low < 0.0 && 0.0 < high && change["significant"] == false, "{change}");
    assert!(change["p"].as_f64().unwrap() > 0.05, "{change}");
    // The planted regression fails, gate or not: its interval is all below 0.
    let (ran, unit) = tonight("regressed", "significant");
    assert_eq!((ran.code, unit["status"].as_str()), (Some(1), Some("below_threshold")), "{unit}");
    let change = &unit["change"]["accuracy"];
    assert!(interval(&change["ci"]).1 < 0.0 && change["significant"] == true, "{change}");
    assert_eq!(unit["breach"]["metric"], "accuracy", "{unit}");
    // `report diff` pairs them too, and says which change is significant.
    let diff = run(isorun().args(["report", "diff"]).arg(&baseline).arg(dir.path().join("regressed-significant.json")));
    assert!(
        diff.stdout.contains("accuracy") && diff.stdout.contains("significant ["),
        "{}{}",
        diff.stdout,
        diff.stderr
    );
}

#[test]
fn bad_ci_flags_and_a_baseline_without_replicates_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = ci_dir().join("data.tfrecord");
    let eval = |args: &[&str]| {
        run(isorun()
            .arg("eval")
            .arg(checkpoint("noise"))
            .arg("--data")
            .arg(&data)
            .args(["--label", "label"])
            .args(args))
    };
    for (args, says) in [
        (&["--bootstrap", "10"][..], "--bootstrap 10: give --ci"),
        (&["--ci", "1.5"][..], "--ci 1.5"),
        (&["--ci", "0"][..], "--ci 0"),
        (&["--ci", "0.9", "--bootstrap", "0"][..], "--bootstrap 0"),
        (&["--ci", "0.9", "--bootstrap", "10001"][..], "--bootstrap 10001"),
        (&["--ci", "0.9", "--gate", "sometimes"][..], "invalid value 'sometimes' for '--gate <always|significant>'"),
        (&["--gate", "significant"][..], "--gate significant needs --ci"),
    ] {
        let ran = eval(args);
        assert_eq!(ran.code, Some(2), "{args:?}: {}", ran.stderr);
        assert!(ran.stderr.contains(says), "{args:?}: {}", ran.stderr);
    }
    // A baseline evaluated without --ci cannot gate on significance: the error names it.
    let plain = dir.path().join("plain.json");
    let made = eval(&["--report", plain.to_str().unwrap(), "-q"]);
    assert_eq!(made.code, Some(0), "{}", made.stderr);
    let ran = eval(&[
        "--ci",
        "0.95",
        "--baseline",
        plain.to_str().unwrap(),
        "--max-drop",
        "accuracy=0.01",
        "--gate",
        "significant",
    ]);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(
        ran.stderr.contains(plain.to_str().unwrap()) && ran.stderr.contains("no bootstrap replicates"),
        "{}",
        ran.stderr
    );
}
