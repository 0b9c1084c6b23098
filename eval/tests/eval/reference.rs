//! The metrics against scikit-learn: tests/reference.py wrote the inputs and
//! sklearn's numbers into reference.json; each case is fed in batches of
//! several sizes and must match to 1e-6 relative (bucketed AUC: 1e-3).

use isorun_eval::{Evaluator, Labels, Metric, MetricsSpec, Targets};
use isorun_protocol::{DType, Tensor};
use serde_json::Value;

use super::util::{floats, scores};

fn lcg(seed: u64, count: usize) -> Vec<f64> {
    let mut x = seed;
    (0..count)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect()
}

struct Case {
    name: String,
    task: String,
    columns: usize,
    labels: Vec<f64>,
    outputs: Vec<f64>,
    weights: Option<Vec<f64>>,
    slice: Option<Vec<String>>,
    spec: MetricsSpec,
    tolerance: f64,
}

fn load(case: &Value) -> Case {
    let columns = case["columns"].as_u64().unwrap() as usize;
    let (labels, outputs) = if let Some(lcg_spec) = case.get("lcg") {
        let rows = lcg_spec["rows"].as_u64().unwrap() as usize;
        let u = lcg(lcg_spec["seed"].as_u64().unwrap(), 2 * rows);
        let labels: Vec<f64> = (0..rows).map(|i| f64::from(u8::from(u[2 * i] < 0.5))).collect();
        let outputs = (0..rows).map(|i| u[2 * i + 1] * 0.8 + labels[i] * 0.2).collect();
        (labels, outputs)
    } else {
        (floats(&case["labels"]), floats(&case["outputs"]))
    };
    let metrics = case
        .get("metrics")
        .map(|m| m.as_array().unwrap().iter().map(|n| Metric::parse(n.as_str().unwrap()).unwrap()).collect())
        .unwrap_or_else(|| case["expected"].as_object().unwrap().keys().map(|k| Metric::parse(k).unwrap()).collect());
    Case {
        name: case["name"].as_str().unwrap().into(),
        task: case["task"].as_str().unwrap().into(),
        columns,
        labels,
        outputs,
        weights: case["weights"].as_array().map(|_| floats(&case["weights"])),
        slice: case.get("slice").map(|s| s.as_array().unwrap().iter().map(|v| v.as_str().unwrap().into()).collect()),
        spec: MetricsSpec {
            metrics,
            from_logits: case["from_logits"].as_bool().unwrap(),
            top_k: case.get("top_k").and_then(Value::as_u64).unwrap_or(5) as usize,
            ..MetricsSpec::default()
        },
        tolerance: case.get("tolerance").and_then(Value::as_f64).unwrap_or(1e-6),
    }
}

fn run(case: &Case, batch: usize) -> isorun_eval::Evaluation {
    let slices: Vec<String> = case.slice.iter().map(|_| "group".to_string()).collect();
    let mut evaluator = Evaluator::new(&case.spec, &scores(case.columns as u64), &slices).unwrap();
    let rows = case.labels.len();
    let mut start = 0;
    while start < rows {
        let end = (start + batch).min(rows);
        let n = end - start;
        let labels = match case.task.as_str() {
            "regression" => Labels::Float(case.labels[start..end].to_vec()),
            _ => Labels::Int(case.labels[start..end].iter().map(|v| *v as i64).collect()),
        };
        let bytes: Vec<u8> =
            case.outputs[start * case.columns..end * case.columns].iter().flat_map(|v| v.to_le_bytes()).collect();
        let shape = if case.columns == 1 { vec![n as u64] } else { vec![n as u64, case.columns as u64] };
        let targets = Targets {
            rows: n,
            labels,
            weights: case.weights.as_ref().map(|w| w[start..end].to_vec()),
            slices: case.slice.iter().map(|s| ("group".to_string(), s[start..end].to_vec())).collect(),
            first_index: start as u64,
            keys: None,
        };
        evaluator.update(&[("out".into(), Tensor::dense(DType::Float64, shape, bytes))], &targets).unwrap();
        start = end;
    }
    evaluator.finish()
}

fn assert_close(what: &str, actual: f64, expected: f64, tolerance: f64) {
    let scale = expected.abs().max(1e-12);
    assert!(
        (actual - expected).abs() <= tolerance * scale,
        "{what}: {actual} but sklearn says {expected} (relative error {:e})",
        (actual - expected).abs() / scale
    );
}

#[test]
fn metrics_match_scikit_learn_at_every_batch_size() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/reference.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for case_json in cases {
        let case = load(case_json);
        let sizes: &[usize] = if case.labels.len() > 10_000 { &[4096] } else { &[1, 7, case.labels.len()] };
        for &batch in sizes {
            let evaluation = run(&case, batch);
            assert_eq!(evaluation.task.name(), case.task, "{}", case.name);
            assert_eq!(evaluation.examples, case.labels.len() as u64);
            for (metric, expected) in case_json["expected"].as_object().unwrap() {
                let actual = evaluation.metrics[metric.as_str()];
                let what = format!("{} (batch {batch}): {metric}", case.name);
                assert_close(&what, actual, expected.as_f64().unwrap(), case.tolerance);
            }
            if case.tolerance > 1e-6 {
                assert!(!evaluation.auc_exact, "{}: {} distinct scores stay exact", case.name, case.labels.len());
            } else {
                assert!(evaluation.auc_exact, "{}", case.name);
            }
            if let Some(slices) = case_json.get("expected_slices") {
                for (value, expected) in slices.as_object().unwrap() {
                    let got = &evaluation.slices["group"][value.as_str()];
                    for (metric, e) in expected.as_object().unwrap() {
                        let what = format!("{} (batch {batch}) slice {value}: {metric}", case.name);
                        assert_close(&what, got[metric.as_str()], e.as_f64().unwrap(), case.tolerance);
                    }
                }
            }
        }
    }
}
