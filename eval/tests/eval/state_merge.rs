//! Metric states of parts of a dataset, merged, give the metrics of one
//! pass over all of it: every reference case (each task, metric, weights,
//! slices, bucketed AUC) and adversarial sums, split at random into 1, 3 and
//! 7 parts, each part's state through its JSON and back, merged in a random
//! order. Metrics agree to 1e-12 relative, and to the last bit without
//! weights (AUC included).

use isorun_eval::{Evaluation, Evaluator, Labels, MergeError, Metric, MetricState, MetricsSpec, Targets};
use isorun_protocol::{DType, Tensor};
use serde_json::Value;

use super::util::{floats, scores};

/// A small deterministic generator (no dependency, same numbers everywhere).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: usize) -> usize {
        ((self.next() * n as f64) as usize).min(n - 1)
    }
}

#[derive(Clone)]
struct Case {
    name: String,
    regression: bool,
    columns: usize,
    labels: Vec<f64>,
    outputs: Vec<f64>,
    weights: Option<Vec<f64>>,
    slice: Option<Vec<String>>,
    spec: MetricsSpec,
}

fn reference_cases() -> Vec<Case> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/reference.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let mut cases = Vec::new();
    for case in reference["cases"].as_array().unwrap() {
        let columns = case["columns"].as_u64().unwrap() as usize;
        let (labels, outputs) = if let Some(lcg) = case.get("lcg") {
            let rows = lcg["rows"].as_u64().unwrap() as usize;
            let mut g = Lcg(lcg["seed"].as_u64().unwrap());
            let u: Vec<f64> = (0..2 * rows).map(|_| g.next()).collect();
            let labels: Vec<f64> = (0..rows).map(|i| f64::from(u8::from(u[2 * i] < 0.5))).collect();
            let outputs = (0..rows).map(|i| u[2 * i + 1] * 0.8 + labels[i] * 0.2).collect();
            (labels, outputs)
        } else {
            (floats(&case["labels"]), floats(&case["outputs"]))
        };
        // Every metric that applies, not only the ones sklearn was asked for.
        let task = case["task"].as_str().unwrap();
        let metrics = Metric::ALL
            .into_iter()
            .filter(|m| match task {
                "binary" => m.applies_to(isorun_eval::Task::Binary),
                "regression" => m.applies_to(isorun_eval::Task::Regression),
                _ => m.applies_to(isorun_eval::Task::Multiclass { classes: columns }),
            })
            .collect();
        cases.push(Case {
            name: case["name"].as_str().unwrap().into(),
            regression: task == "regression",
            columns,
            labels,
            outputs,
            weights: case["weights"].as_array().map(|_| floats(&case["weights"])),
            slice: case
                .get("slice")
                .map(|s| s.as_array().unwrap().iter().map(|v| v.as_str().unwrap().into()).collect()),
            spec: MetricsSpec {
                metrics,
                from_logits: case["from_logits"].as_bool().unwrap(),
                top_k: case.get("top_k").and_then(Value::as_u64).unwrap_or(5) as usize,
                ..MetricsSpec::default()
            },
        });
    }
    cases
}

/// Sums that a plain f64 sum in another order gets wrong: labels of 1e8 plus
/// noise (r2's cancellation), values of ±1e15 that cancel (mean_label near
/// 0), weights from 1e-6 to 1e6, and many distinct slices.
fn adversarial_cases() -> Vec<Case> {
    let mut g = Lcg(7);
    let rows = 3000;
    let mut cases = Vec::new();
    let regression = |name: &str, labels: Vec<f64>, outputs: Vec<f64>, weights: Option<Vec<f64>>| Case {
        name: name.into(),
        regression: true,
        columns: 1,
        labels,
        outputs,
        weights,
        slice: None,
        spec: MetricsSpec {
            metrics: [Metric::Mse, Metric::Mae, Metric::Rmse, Metric::R2, Metric::MeanLabel, Metric::MeanPrediction]
                .into(),
            ..MetricsSpec::default()
        },
    };
    let big: Vec<f64> = (0..rows).map(|_| 1e8 + g.next()).collect();
    let near: Vec<f64> = big.iter().map(|y| y + (g.next() - 0.5) * 0.1).collect();
    let spread: Vec<f64> = (0..rows).map(|_| 10f64.powf(g.next() * 12.0 - 6.0)).collect();
    cases.push(regression("labels near 1e8", big.clone(), near.clone(), None));
    cases.push(regression("labels near 1e8, weights 1e-6..1e6", big, near, Some(spread.clone())));
    let cancel: Vec<f64> = (0..rows).map(|i| if i % 2 == 0 { 1e15 } else { -1e15 } + g.next()).collect();
    let cancel_pred: Vec<f64> = cancel.iter().map(|y| -y * 1e-3 + g.next()).collect();
    cases.push(regression("±1e15 that cancel", cancel, cancel_pred, Some(spread.clone())));
    // Binary: weights over twelve decades, scores with many ties, 40 slice values.
    let labels: Vec<f64> = (0..rows).map(|_| f64::from(u8::from(g.next() < 0.4))).collect();
    let outputs: Vec<f64> = labels.iter().map(|y| ((g.next() * 0.7 + y * 0.3) * 64.0).round() / 64.0).collect();
    let slice: Vec<String> = (0..rows).map(|_| format!("v{}", g.below(40))).collect();
    let binary = Case {
        name: "binary, weights 1e-6..1e6, ties, slices".into(),
        regression: false,
        columns: 1,
        labels,
        outputs,
        weights: Some(spread),
        slice: Some(slice),
        spec: MetricsSpec {
            metrics: Metric::ALL.into_iter().filter(|m| m.applies_to(isorun_eval::Task::Binary)).collect(),
            ..MetricsSpec::default()
        },
    };
    let mut unweighted = binary.clone();
    unweighted.name = "binary, ties, slices".into();
    unweighted.weights = None;
    cases.push(binary);
    cases.push(unweighted);
    cases
}

/// The evaluator after the rows `rows` of `case`, in batches of `batch`.
fn evaluate(case: &Case, rows: &[usize], batch: usize) -> Evaluator {
    let slices: Vec<String> = case.slice.iter().map(|_| "group".to_string()).collect();
    let mut evaluator = Evaluator::new(&case.spec, &scores(case.columns as u64), &slices).unwrap();
    for chunk in rows.chunks(batch) {
        let n = chunk.len();
        let labels = if case.regression {
            Labels::Float(chunk.iter().map(|&r| case.labels[r]).collect())
        } else {
            Labels::Int(chunk.iter().map(|&r| case.labels[r] as i64).collect())
        };
        let bytes: Vec<u8> = chunk
            .iter()
            .flat_map(|&r| case.outputs[r * case.columns..(r + 1) * case.columns].iter().flat_map(|v| v.to_le_bytes()))
            .collect();
        let shape = if case.columns == 1 { vec![n as u64] } else { vec![n as u64, case.columns as u64] };
        let targets = Targets {
            rows: n,
            labels,
            weights: case.weights.as_ref().map(|w| chunk.iter().map(|&r| w[r]).collect()),
            slices: case
                .slice
                .iter()
                .map(|s| ("group".to_string(), chunk.iter().map(|&r| s[r].clone()).collect()))
                .collect(),
            first_index: chunk[0] as u64,
            keys: None,
        };
        evaluator.update(&[("out".into(), Tensor::dense(DType::Float64, shape, bytes))], &targets).unwrap();
    }
    evaluator
}

fn same(what: &str, merged: f64, one: f64, bitwise: bool) {
    if merged.is_nan() && one.is_nan() {
        return;
    }
    if bitwise {
        assert_eq!(merged.to_bits(), one.to_bits(), "{what}: merged {merged}, one pass {one}");
    }
    let scale = one.abs().max(f64::MIN_POSITIVE);
    assert!((merged - one).abs() <= 1e-12 * scale, "{what}: merged {merged}, one pass {one}");
}

fn assert_equal(case: &Case, what: &str, merged: &Evaluation, one: &Evaluation) {
    let bitwise = case.weights.is_none();
    assert_eq!(merged.examples, one.examples, "{what}");
    assert_eq!(merged.task, one.task, "{what}");
    assert_eq!(merged.auc_exact, one.auc_exact, "{what}");
    assert_eq!(merged.slices_auc_exact, one.slices_auc_exact, "{what}");
    assert_eq!(merged.confusion_matrix, one.confusion_matrix, "{what}");
    assert_eq!(merged.calibration, one.calibration, "{what}: reliability diagram");
    assert_eq!(merged.metrics.keys().collect::<Vec<_>>(), one.metrics.keys().collect::<Vec<_>>(), "{what}");
    for (name, value) in &one.metrics {
        same(&format!("{what}: {name}"), merged.metrics[name], *value, bitwise);
    }
    assert_eq!(merged.slices.len(), one.slices.len(), "{what}");
    for (feature, values) in &one.slices {
        assert_eq!(merged.slices[feature].len(), values.len(), "{what}: slice {feature}");
        for (value, metrics) in values {
            for (name, v) in metrics {
                same(
                    &format!("{what}: slice {feature}={value} {name}"),
                    merged.slices[feature][value][name],
                    *v,
                    bitwise,
                );
            }
        }
    }
}

/// The state of each part through its JSON text and back.
fn through_json(state: &MetricState) -> MetricState {
    let text = serde_json::to_string(&state.to_json()).unwrap();
    MetricState::from_json(&serde_json::from_str(&text).unwrap()).unwrap()
}

#[test]
fn merged_states_of_random_splits_give_one_pass_metrics() {
    let mut g = Lcg(2026);
    for case in reference_cases().into_iter().chain(adversarial_cases()) {
        let rows = case.labels.len();
        let big = rows > 10_000;
        let all: Vec<usize> = (0..rows).collect();
        let one = evaluate(&case, &all, if big { 4096 } else { 5 }).finish();
        // The 300,000 rows of bucketed AUC: one split (a debug build is slow).
        let splits: &[usize] = if big { &[7] } else { &[1, 3, 7] };
        for &parts in splits {
            // Rows go to parts at random (each part keeps its rows' order);
            // contiguous ranges too, as --data-shard makes of one file.
            for contiguous in [false, true] {
                let mut assigned: Vec<Vec<usize>> = vec![Vec::new(); parts];
                for r in 0..rows {
                    let part = if contiguous { r * parts / rows } else { g.below(parts) };
                    assigned[part].push(r);
                }
                let mut states: Vec<MetricState> = assigned
                    .iter()
                    .map(|rows| through_json(&evaluate(&case, rows, if big { 4096 } else { 1 + g.below(9) }).state()))
                    .collect();
                // Merged in a random order.
                let mut merged = states.swap_remove(g.below(states.len()));
                while !states.is_empty() {
                    merged.merge(&states.swap_remove(g.below(states.len()))).unwrap();
                }
                let what = format!("{} in {parts} parts{}", case.name, if contiguous { ", contiguous" } else { "" });
                assert_equal(&case, &what, &Evaluation::from_state(&merged), &one);
                assert_equal(&case, &what, &Evaluation::from_state(&through_json(&merged)), &one);
            }
        }
        // A part with no examples changes nothing.
        let mut merged = evaluate(&case, &[], 1).state();
        merged.merge(&evaluate(&case, &all, if big { 4096 } else { 64 }).state()).unwrap();
        merged.merge(&evaluate(&case, &[], 1).state()).unwrap();
        assert_equal(&case, &format!("{} with empty parts", case.name), &Evaluation::from_state(&merged), &one);
    }
}

#[test]
fn states_of_other_settings_or_tasks_are_refused_naming_both() {
    let case = &reference_cases()[0];
    let all: Vec<usize> = (0..case.labels.len()).collect();
    let mut first = evaluate(case, &all, 4).state();
    first.set_source("a.json (model m, data shard 0/2)");
    let before = Evaluation::from_state(&first);
    let mut other_threshold = case.clone();
    other_threshold.spec.threshold = 0.7;
    let mut second = evaluate(&other_threshold, &all, 4).state();
    second.set_source("b.json (model m, data shard 1/2)");
    let error = first.merge(&second).unwrap_err();
    assert!(matches!(error, MergeError::Differ { what: "settings", .. }), "{error}");
    assert_eq!(
        error.to_string(),
        "cannot merge the metric state of b.json (model m, data shard 1/2) into that of a.json (model m, data \
         shard 0/2): their settings differ (top_k 5, threshold 0.5, from_logits false against top_k 5, threshold \
         0.7, from_logits false)"
    );
    assert_eq!(Evaluation::from_state(&first), before, "a refused merge changes nothing");

    let regression = Case { regression: true, spec: case.spec.clone(), ..case.clone() };
    let mut regression = regression;
    regression.spec.metrics = vec![];
    let mut binary = case.clone();
    binary.spec.metrics = vec![];
    let mut a = evaluate(&binary, &all, 4).state();
    let b = evaluate(&regression, &all, 4).state();
    let error = a.merge(&b).unwrap_err().to_string();
    assert!(error.contains("their tasks differ (binary against regression)"), "{error}");

    let mut json = first.to_json();
    json["version"] = 2.into();
    assert_eq!(
        MetricState::from_json(&json).unwrap_err().to_string(),
        "metric_state version 2; this isorun reads version 1"
    );
}
