//! ece, brier and the reliability diagram against NumPy and scikit-learn:
//! tests/calibration_reference.py wrote the inputs and the reference's
//! numbers into calibration_reference.json (binary and multiclass, weights,
//! logits, slices, several bin counts, scores on the bin edges); each case
//! is fed in batches of several sizes and must match to 1e-9 relative.

use isorun_eval::{Evaluation, Evaluator, Labels, Metric, MetricsSpec, Targets};
use isorun_protocol::{DType, Tensor};
use serde_json::Value;

use super::util::{floats, scores};

fn run(case: &Value, batch: usize) -> Evaluation {
    let columns = case["columns"].as_u64().unwrap() as usize;
    let labels: Vec<i64> = floats(&case["labels"]).into_iter().map(|v| v as i64).collect();
    let outputs = floats(&case["outputs"]);
    let weights = case["weights"].as_array().map(|_| floats(&case["weights"]));
    let slice: Option<Vec<String>> =
        case.get("slice").map(|s| s.as_array().unwrap().iter().map(|v| v.as_str().unwrap().into()).collect());
    let spec = MetricsSpec {
        metrics: vec![Metric::Ece, Metric::Brier],
        from_logits: case["from_logits"].as_bool().unwrap(),
        threshold: case["threshold"].as_f64().unwrap(),
        calibration_bins: case["bins"].as_u64().unwrap() as usize,
        ..MetricsSpec::default()
    };
    let slices: Vec<String> = slice.iter().map(|_| "group".to_string()).collect();
    let mut evaluator = Evaluator::new(&spec, &scores(columns as u64), &slices).unwrap();
    let rows = labels.len();
    let mut start = 0;
    while start < rows {
        let end = (start + batch).min(rows);
        let n = end - start;
        let bytes: Vec<u8> = outputs[start * columns..end * columns].iter().flat_map(|v| v.to_le_bytes()).collect();
        let shape = if columns == 1 { vec![n as u64] } else { vec![n as u64, columns as u64] };
        let targets = Targets {
            rows: n,
            labels: Labels::Int(labels[start..end].to_vec()),
            weights: weights.as_ref().map(|w| w[start..end].to_vec()),
            slices: slice.iter().map(|s| ("group".to_string(), s[start..end].to_vec())).collect(),
            first_index: start as u64,
            keys: None,
        };
        evaluator.update(&[("out".into(), Tensor::dense(DType::Float64, shape, bytes))], &targets).unwrap();
        start = end;
    }
    evaluator.finish()
}

fn assert_close(what: &str, actual: f64, expected: f64) {
    let scale = expected.abs().max(1e-12);
    assert!(
        (actual - expected).abs() <= 1e-9 * scale,
        "{what}: {actual} but the reference says {expected} (relative error {:e})",
        (actual - expected).abs() / scale
    );
}

#[test]
fn ece_brier_and_the_reliability_diagram_match_numpy_and_scikit_learn() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/calibration_reference.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let rows = case["labels"].as_array().unwrap().len();
        for batch in [1, 7, rows] {
            let evaluation = run(case, batch);
            assert_eq!(evaluation.task.name(), case["task"].as_str().unwrap(), "{name}");
            for (metric, expected) in case["expected"].as_object().unwrap() {
                let what = format!("{name} (batch {batch}): {metric}");
                assert_close(&what, evaluation.metrics[metric.as_str()], expected.as_f64().unwrap());
            }
            let diagram = evaluation.calibration.as_ref().expect("a reliability diagram with ece");
            let expected = &case["diagram"];
            assert_eq!(diagram.bins as u64, expected["bins"].as_u64().unwrap(), "{name}");
            assert_eq!(diagram.edges, floats(&expected["edges"]), "{name}: edges are k/N");
            let counts: Vec<u64> = expected["count"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
            assert_eq!(diagram.count, counts, "{name}: examples per bin");
            for (key, got) in [("confidence", &diagram.confidence), ("accuracy", &diagram.accuracy)] {
                for (b, e) in expected[key].as_array().unwrap().iter().enumerate() {
                    match e.as_f64() {
                        Some(e) => assert_close(&format!("{name}: {key} of bin {b}"), got[b].unwrap(), e),
                        None => assert!(got[b].is_none(), "{name}: empty bin {b} has no {key}"),
                    }
                }
            }
            let json = evaluation.to_json();
            assert_eq!(json["calibration"]["count"], expected["count"], "{name}");
            if let Some(slices) = case.get("expected_slices") {
                for (value, metrics) in slices.as_object().unwrap() {
                    for (metric, e) in metrics.as_object().unwrap() {
                        let what = format!("{name} (batch {batch}) slice {value}: {metric}");
                        assert_close(
                            &what,
                            evaluation.slices["group"][value.as_str()][metric.as_str()],
                            e.as_f64().unwrap(),
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn calibration_bins_out_of_range_are_refused() {
    for bins in [0, 10_001] {
        let spec = MetricsSpec { metrics: vec![Metric::Ece], calibration_bins: bins, ..MetricsSpec::default() };
        let error = Evaluator::new(&spec, &scores(1), &[]).unwrap_err();
        assert!(error.to_string().contains("calibration bins must be 1 to 10000"), "{error}");
    }
}
