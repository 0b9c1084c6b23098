//! `--gate significant` fails closed and pairs through predictions: last
//! night's report evaluated with `--predictions` but without `--ci` still
//! gates tonight (its replicates drawn again from its predictions, accuracy
//! decided by McNemar's exact test on the two nights' predictions), a
//! `--max-drop` on a metric the run does not compute is a usage error (it
//! used to panic), and a breach with no paired statistic (`ece`) stays a
//! breach (it used to pass). Fixtures: tests/fixtures/ci.

use crate::util::{fixtures, isorun, run, Ran};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn ci(name: &str) -> PathBuf {
    fixtures().join("ci").join(name)
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn unit(report: &Path) -> Value {
    let text = std::fs::read_to_string(report).unwrap_or_else(|e| panic!("{}: {e}", report.display()));
    serde_json::from_str::<Value>(&text).unwrap()["units"][0].clone()
}

/// `isorun eval CHECKPOINT --data data.tfrecord --label label --example-key id --predictions DIR ARGS`.
fn night(model: &str, predictions: &Path, args: &[&str]) -> Ran {
    run(isorun()
        .arg("eval")
        .arg(ci(model).join("classifier"))
        .arg("--data")
        .arg(ci("data.tfrecord"))
        .args(["--label", "label", "--example-key", "id", "-j", "1", "-q", "--json", "--predictions"])
        .arg(predictions)
        .args(args))
}

#[test]
fn the_gate_pairs_through_last_night_s_predictions_and_fails_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = |name: &str| tmp.path().join(name);
    // Last night: predictions and keys, no --ci.
    let last = dir("last.json");
    let ran = night("last_night", &dir("p-last"), &["--metric", "accuracy", "--metric", "auc", "--report", p(&last)]);
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(unit(&last).get("bootstrap_values").is_none());
    let tonight = ["--ci", "0.95", "--bootstrap", "50", "--metric", "accuracy", "--metric", "auc"];
    let gate = ["--baseline", p(&last), "--max-drop", "accuracy=0.002", "--gate", "significant"];
    let mut noise_change = Value::Null;
    for (model, code) in [("noise", 0), ("regressed", 1)] {
        let report = dir(&format!("{model}.json"));
        let args = [&tonight[..], &gate[..], &["--report", p(&report)]].concat();
        let ran = night(model, &dir(&format!("p-{model}")), &args);
        // It used to be refused: "no bootstrap replicates".
        assert_eq!(ran.code, Some(code), "{model}: {ran:?}");
        let record = unit(&report);
        let accuracy = &record["change"]["accuracy"];
        assert_eq!(accuracy["test"], "mcnemar_exact", "{model}: {accuracy}");
        // The discordant counts give the change, and the exact p decides at 0.95.
        let (broke, fixed) = (accuracy["broke"].as_f64().unwrap(), accuracy["fixed"].as_f64().unwrap());
        let delta = (fixed - broke) / record["examples"].as_f64().unwrap();
        assert!((accuracy["delta"].as_f64().unwrap() - delta).abs() < 1e-9, "{accuracy}");
        assert_eq!(accuracy["p"].as_f64().unwrap() < 0.05, model == "regressed", "{model}: {accuracy}");
        assert_eq!(accuracy["significant"], json!(model == "regressed"), "{model}: {accuracy}");
        // auc pairs through last night's replicates, drawn again from its predictions.
        let auc = &record["change"]["auc"];
        assert_eq!(auc["test"], "paired_bootstrap", "{model}: {auc}");
        assert!(auc["significant"].is_boolean() && auc["ci"].is_array(), "{model}: {auc}");
        if model == "noise" {
            noise_change = record["change"].clone();
        } else {
            assert_eq!(record["breach"]["metric"], "accuracy", "{record}");
        }
        // rescore of tonight's predictions decides the same.
        let predictions = dir(&format!("p-{model}"));
        let args = [&[p(&predictions)][..], &tonight[..], &gate[..], &["--json"]].concat();
        let rescored = run(isorun().arg("rescore").args(&args));
        assert_eq!(rescored.code, Some(code), "{rescored:?}");
        assert_eq!(rescored.record("classifier")["change"], record["change"], "{model}");
    }

    // A --max-drop on a metric the run does not compute: a usage error before any work (it panicked, exit 101).
    let with_replicates = dir("noise.json");
    let regressed = dir("p-regressed");
    let not_computed =
        ["--baseline", p(&with_replicates), "--max-drop", "auc=0.01", "--gate", "significant", "--metric", "accuracy"];
    let rescored =
        run(isorun().arg("rescore").arg(&regressed).args(["--ci", "0.95", "--bootstrap", "50"]).args(not_computed));
    assert_eq!(rescored.code, Some(2), "{rescored:?}");
    assert!(rescored.stderr.contains("auc is not computed"), "{}", rescored.stderr);
    let ran =
        night("regressed", &dir("p-unused"), &[&["--ci", "0.95", "--bootstrap", "50"][..], &not_computed].concat());
    assert_eq!(ran.code, Some(2), "{ran:?}");
    assert!(
        ran.stderr.contains("--max-drop auc=0.01: auc is not computed") && ran.stderr.contains("accuracy"),
        "{ran:?}"
    );

    // A breach with no paired interval stays a breach (it passed, exit 0): ece has no replicates.
    // Last night's ece set to 0, so tonight's is a rise past ece=0.
    let mut baseline: Value = serde_json::from_str(&std::fs::read_to_string(&with_replicates).unwrap()).unwrap();
    baseline["units"][0]["metrics"]["ece"] = json!(0.0);
    let ece_baseline = dir("ece-baseline.json");
    std::fs::write(&ece_baseline, baseline.to_string()).unwrap();
    let rescored = run(isorun()
        .arg("rescore")
        .arg(&regressed)
        .args(["--ci", "0.95", "--bootstrap", "50", "--metric", "accuracy", "--metric", "ece", "--json"])
        .args(["--baseline", p(&ece_baseline), "--max-drop", "ece=0", "--gate", "significant"]));
    assert_eq!(rescored.code, Some(1), "{rescored:?}");
    let record = rescored.record("classifier");
    assert_eq!(record["breach"]["metric"], "ece", "{record}");
    assert_eq!(record["change"]["ece"]["significant"], Value::Null, "{record}");
    // (tonight's replicates do not compute ece, nor had the baseline any of it)
    assert!(record["change"]["ece"]["unpaired"].as_str().unwrap().contains("replicates of ece"), "{record}");
    // The noise night's change is recorded as tested, not significant.
    assert_eq!(noise_change["accuracy"]["significant"], false);
}
