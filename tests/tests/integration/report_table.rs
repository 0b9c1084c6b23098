//! ece, brier and `isorun report table` on the real eval fixtures: the
//! metrics `isorun eval` computes equal what NumPy and scikit-learn give on
//! Python TensorFlow's own predictions (`tests/fixtures/eval/calibration.json`,
//! by `scripts/make_calibration_expected.py`), the record carries the
//! reliability diagram, and the leaderboard of two reports, read back from
//! its CSV and JSON Lines, is in the metric's order with the records' values
//! and changes.

use crate::util::eval_fixtures::dir as eval_dir;
use crate::util::{isorun, run, Ran};
use serde_json::Value;
use std::path::Path;

fn calibration_cases() -> Vec<Value> {
    let text = std::fs::read_to_string(eval_dir().join("calibration.json")).unwrap();
    let value: Value = serde_json::from_str(&text).unwrap();
    value["cases"].as_array().unwrap().clone()
}

fn eval(model: &str, label: &str, args: &[&str], report: Option<&Path>) -> Ran {
    let mut command = isorun();
    command
        .arg("eval")
        .arg(eval_dir().join("models").join(model))
        .arg("--data")
        .arg(eval_dir().join("data").join("data.tfrecord"))
        .args(["--label", label, "-j", "1", "--json"])
        .args(args);
    if let Some(report) = report {
        command.arg("--report").arg(report);
    }
    let ran = run(&mut command);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    ran
}

fn close(what: &str, got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-9 * want.abs().max(1e-12), "{what}: isorun says {got}, NumPy/sklearn {want}");
}

#[test]
fn ece_and_brier_match_numpy_and_scikit_learn_on_the_eval_fixtures() {
    for case in calibration_cases() {
        let name = case["name"].as_str().unwrap();
        let model = case["model"].as_str().unwrap();
        let mut args: Vec<&str> = case["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        args.extend(["--metric", "ece", "--metric", "brier", "--metric", "accuracy"]);
        let ran = eval(model, case["label"].as_str().unwrap(), &args, None);
        let record = ran.record(model);
        close(&format!("{name}: ece"), record["metrics"]["ece"].as_f64().unwrap(), case["ece"].as_f64().unwrap());
        close(&format!("{name}: brier"), record["metrics"]["brier"].as_f64().unwrap(), case["brier"].as_f64().unwrap());
        let calibration = &record["calibration"];
        assert_eq!(calibration["bins"], 15, "{name}");
        assert_eq!(calibration["count"], case["count"], "{name}: examples per bin");
        assert_eq!(calibration["edges"].as_array().unwrap().len(), 16, "{name}");
        // Its bins give the ece back: Σ weight·|accuracy − confidence| / Σ weight.
        let (mut gap, mut total) = (0.0, 0.0);
        for b in 0..15 {
            let weight = calibration["weight"][b].as_f64().unwrap();
            if weight > 0.0 {
                let accuracy = calibration["accuracy"][b].as_f64().unwrap();
                gap += weight * (accuracy - calibration["confidence"][b].as_f64().unwrap()).abs();
            } else {
                assert!(calibration["accuracy"][b].is_null(), "{name}: empty bin {b}");
            }
            total += weight;
        }
        close(&format!("{name}: ece from the diagram"), gap / total, case["ece"].as_f64().unwrap());
    }
}

fn csv_rows(text: &str) -> Vec<Vec<String>> {
    text.lines().map(|l| l.split(',').map(str::to_string).collect()).collect()
}

#[test]
fn report_table_ranks_the_models_of_two_reports_in_each_format() {
    let dir = tempfile::tempdir().unwrap();
    let (monday, tuesday) = (dir.path().join("monday.json"), dir.path().join("tuesday.json"));
    let metrics = ["--metric", "accuracy", "--metric", "brier", "--metric", "ece", "--slice", "country"];
    eval("binary", "label_bin", &metrics, Some(&monday));
    // Tuesday's threshold of 0.7 changes accuracy (and ece), not brier; against Monday's baseline.
    let mut tuesday_args = metrics.to_vec();
    let monday_text = monday.to_str().unwrap().to_string();
    tuesday_args.extend(["--threshold", "0.7", "--baseline", &monday_text]);
    eval("binary", "label_bin", &tuesday_args, Some(&tuesday));
    let read = |path: &Path| -> Value { serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap() };
    let (a, b) = (read(&monday), read(&tuesday));
    let (a, b) = (&a["units"][0], &b["units"][0]);
    let accuracy = |u: &Value| u["metrics"]["accuracy"].as_f64().unwrap();
    assert_ne!(accuracy(a), accuracy(b));
    let table = |args: &[&str]| -> String {
        let ran = run(isorun().args(["report", "table"]).arg(&monday).arg(&tuesday).args(args));
        assert_eq!(ran.code, Some(0), "{}", ran.stderr);
        ran.stdout
    };

    // CSV: the better accuracy first, the values and the change the records have.
    let rows = csv_rows(&table(&["--metric", "accuracy", "--format", "csv"]));
    let header = &rows[0];
    let column =
        |name: &str| header.iter().position(|h| h == name).unwrap_or_else(|| panic!("no {name} in {header:?}"));
    assert_eq!(rows.len(), 3);
    let (best, worst) = if accuracy(a) > accuracy(b) { (&monday, &tuesday) } else { (&tuesday, &monday) };
    assert_eq!(rows[1][column("report")], best.display().to_string());
    assert_eq!(rows[2][column("report")], worst.display().to_string());
    assert_eq!((rows[1][column("rank")].as_str(), rows[2][column("rank")].as_str()), ("1", "2"));
    for row in &rows[1..] {
        let record = if row[column("report")] == monday.display().to_string() { a } else { b };
        assert_eq!(row[column("model")], "binary");
        assert_eq!(row[column("value")].parse::<f64>().unwrap(), accuracy(record));
        assert_eq!(row[column("examples")], "1000");
    }
    let tuesday_row = rows.iter().find(|r| r[column("report")] == tuesday.display().to_string()).unwrap();
    let delta = b["change"]["accuracy"].as_f64().or_else(|| b["change"]["accuracy"]["delta"].as_f64()).unwrap();
    assert_eq!(tuesday_row[column("delta")].parse::<f64>().unwrap(), delta);
    assert_eq!(tuesday_row[column("baseline")].parse::<f64>().unwrap(), accuracy(a));

    // Brier is the same at both thresholds and lower is better: a tie, ranked =1 both.
    let rows = csv_rows(&table(&["--metric", "brier", "--format", "csv"]));
    assert_eq!(a["metrics"]["brier"], b["metrics"]["brier"]);
    assert!(rows[1..].iter().all(|r| r[0] == "1" && r[1] == "true"), "{rows:?}");

    // JSON Lines by slice: per country, ranked within it, values from the records' slices.
    let text = table(&["--metric", "ece", "--by", "country", "--format", "jsonl"]);
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 8, "4 countries x 2 reports");
    for pair in lines.chunks(2) {
        let country = pair[0]["slice"]["country"].as_str().unwrap();
        assert_eq!(pair[1]["slice"]["country"], country);
        let (x, y) = (pair[0]["value"].as_f64().unwrap(), pair[1]["value"].as_f64().unwrap());
        assert!(x <= y, "ece: lower first in {country}");
        for row in pair {
            let record = if row["report"] == monday.display().to_string() { a } else { b };
            assert_eq!(row["value"], record["slices"]["country"][country]["ece"]);
            assert_eq!(row["metric"], "ece");
        }
    }

    // Markdown: the default metric is the first --metric, each row names its report.
    let md = table(&[]);
    let lines: Vec<&str> = md.lines().collect();
    assert!(lines[0].starts_with("| Rank | Model | accuracy (higher is better) |"), "{md}");
    assert!(lines[1].starts_with("| ---: | --- |"), "{md}");
    assert!(lines[2].starts_with(&format!("| 1 | `binary` ({}) |", best.display())), "{md}");

    // Bad input exits 2, naming what there is.
    let ran = run(isorun().args(["report", "table"]).arg(&monday).args(["--metric", "r2"]));
    assert_eq!(ran.code, Some(2));
    assert!(ran.stderr.contains("has metric r2; they have: accuracy, brier, ece"), "{}", ran.stderr);
    let ran = run(isorun().args(["report", "table"]).arg(&monday).args(["--by", "city"]));
    assert_eq!(ran.code, Some(2));
    assert!(ran.stderr.contains("slice features: country"), "{}", ran.stderr);
}

#[test]
fn ece_brier_and_the_diagram_of_merged_data_shards_equal_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--metric", "ece", "--metric", "brier", "--weight", "weight", "--slice", "country"];
    let one = dir.path().join("one.json");
    eval("multiclass", "label_cls", &args, Some(&one));
    let mut shards = Vec::new();
    for k in 0..3 {
        let path = dir.path().join(format!("shard-{k}.json"));
        let shard = format!("{k}/3");
        let mut shard_args = args.to_vec();
        shard_args.extend(["--data-shard", &shard]);
        eval("multiclass", "label_cls", &shard_args, Some(&path));
        shards.push(path);
    }
    let merged = dir.path().join("merged.json");
    let ran = run(isorun().args(["report", "merge"]).args(&shards).arg("-o").arg(&merged));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let read = |path: &Path| -> Value { serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap() };
    let (one, merged) = (read(&one), read(&merged));
    let (one, merged) = (&one["units"][0], &merged["units"][0]);
    // Exact sums: the same numbers to the last bit, overall, per slice and per bin.
    assert_eq!(merged["metrics"], one["metrics"]);
    assert_eq!(merged["slices"], one["slices"]);
    assert_eq!(merged["calibration"], one["calibration"]);
    assert!(one["calibration"]["count"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).sum::<u64>() == 1000);
}
