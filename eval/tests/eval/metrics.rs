//! The evaluator's decisions and errors, and the threshold rules.

use isorun_eval::{check, Bound, BoundOp, EvalError, Evaluator, Labels, MaxDrop, Metric, MetricsSpec, Targets, Task};
use isorun_protocol::{DType, SignatureInfo, Tensor};
use std::collections::BTreeMap;

use super::util;

fn signature(outputs: &[(&str, DType, Vec<Option<u64>>)]) -> SignatureInfo {
    util::signature(vec![], outputs.iter().map(|(n, d, s)| util::tensor(n, *d, s)).collect())
}

fn f32_output(name: &str, shape: Vec<u64>, values: &[f32]) -> Vec<(String, Tensor)> {
    vec![(name.into(), Tensor::dense(DType::Float32, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect()))]
}

fn targets(labels: Labels) -> Targets {
    Targets { rows: labels.len(), labels, weights: None, slices: vec![], first_index: 0, keys: None }
}

#[test]
fn the_task_and_default_metrics_follow_output_shape_and_label_kind() {
    let sig = signature(&[("p", DType::Float32, vec![None])]);
    let mut binary = Evaluator::new(&MetricsSpec::default(), &sig, &[]).unwrap();
    binary.update(&f32_output("p", vec![4], &[0.9, 0.2, 0.6, 0.4]), &targets(Labels::Int(vec![1, 0, 0, 1]))).unwrap();
    let e = binary.finish();
    assert_eq!(e.task, Task::Binary);
    assert!(e.defaulted);
    assert_eq!(e.metrics.keys().collect::<Vec<_>>(), ["accuracy", "auc", "f1", "log_loss", "precision", "recall"]);
    assert_eq!(e.metrics["accuracy"], 0.5);
    assert_eq!(e.confusion_matrix, Some(vec![vec![1, 1], vec![1, 1]]));
    let json = e.to_json();
    assert_eq!(json["task"], "binary");
    assert_eq!(json["metrics_defaulted"], true);
    assert_eq!(json["confusion_matrix"], serde_json::json!([[1, 1], [1, 1]]));
    assert_eq!((json["threshold"].as_f64(), json["from_logits"].as_bool()), (Some(0.5), Some(false)));
    assert!(json.get("top_k").is_none(), "top_k is multiclass's: {json}");

    let mut regression = Evaluator::new(&MetricsSpec::default(), &sig, &[]).unwrap();
    regression.update(&f32_output("p", vec![2], &[1.0, 3.0]), &targets(Labels::Float(vec![0.0, 1.0]))).unwrap();
    let e = regression.finish();
    assert_eq!(e.task, Task::Regression);
    assert_eq!(e.metrics["mse"], 2.5);
    assert_eq!(e.metrics["rmse"], 2.5f64.sqrt());
    assert_eq!(e.confusion_matrix, None);
    let json = e.to_json();
    for key in ["top_k", "threshold", "from_logits"] {
        assert!(json.get(key).is_none(), "{key} does not apply to regression: {json}");
    }

    let sig3 =
        signature(&[("probabilities", DType::Float32, vec![None, Some(3)]), ("classes", DType::Int64, vec![None])]);
    let mut multiclass = Evaluator::new(&MetricsSpec::default(), &sig3, &[]).unwrap();
    assert_eq!(multiclass.output(), "probabilities", "named like probabilities, chosen among several");
    let one_hot = Labels::Matrix { columns: 3, values: vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0] };
    multiclass
        .update(&f32_output("probabilities", vec![2, 3], &[0.1, 0.2, 0.7, 0.3, 0.6, 0.1]), &targets(one_hot))
        .unwrap();
    let e = multiclass.finish();
    assert_eq!(e.task, Task::Multiclass { classes: 3 });
    assert_eq!(e.metrics.keys().collect::<Vec<_>>(), ["accuracy", "log_loss"], "no top-5 of 3 classes");
    assert_eq!(e.metrics["accuracy"], 0.5);
    assert_eq!(e.confusion_matrix, Some(vec![vec![0, 1, 0], vec![0, 0, 0], vec![0, 0, 1]]));
    let json = e.to_json();
    assert_eq!(json["top_k"], 5);
    assert!(json.get("threshold").is_none(), "the binary decision threshold is binary's: {json}");
}

#[test]
fn bad_outputs_labels_and_metrics_are_errors_naming_them() {
    let two = signature(&[("a", DType::Float32, vec![None]), ("b", DType::Float32, vec![None])]);
    let err = Evaluator::new(&MetricsSpec::default(), &two, &[]).unwrap_err();
    assert!(matches!(err, EvalError::AmbiguousOutput { .. }) && err.to_string().contains("a (float32, [?])"), "{err}");
    let named = MetricsSpec { output: Some("c".into()), ..MetricsSpec::default() };
    assert!(Evaluator::new(&named, &two, &[]).unwrap_err().to_string().contains("no output 'c'"));
    let strings = signature(&[("s", DType::String, vec![None])]);
    assert!(matches!(Evaluator::new(&MetricsSpec::default(), &strings, &[]), Err(EvalError::NotNumeric { .. })));

    let sig = signature(&[("p", DType::Float32, vec![None, Some(3)])]);
    let mut e = Evaluator::new(&MetricsSpec::default(), &sig, &[]).unwrap();
    let err = e.update(&f32_output("p", vec![1, 3], &[0.2, 0.3, 0.5]), &targets(Labels::Int(vec![3]))).unwrap_err();
    assert_eq!(err.to_string(), "label 3 at row 0 of the batch is outside [0, 3) for a multiclass task");
    let err = e.update(&f32_output("p", vec![2, 3], &[0.2; 6]), &targets(Labels::Int(vec![1]))).unwrap_err();
    assert!(matches!(err, EvalError::Rows { output_rows: 2, rows: 1, .. }), "{err}");

    let auc = MetricsSpec { metrics: vec![Metric::Auc], ..MetricsSpec::default() };
    let mut e = Evaluator::new(&auc, &signature(&[("p", DType::Float32, vec![None])]), &[]).unwrap();
    let err = e.update(&f32_output("p", vec![1], &[0.5]), &targets(Labels::Float(vec![0.3]))).unwrap_err();
    assert!(err.to_string().starts_with("metric auc does not apply to a regression task"), "{err}");

    let mut e = Evaluator::new(&MetricsSpec::default(), &signature(&[("p", DType::Float32, vec![None])]), &[]).unwrap();
    e.update(&f32_output("p", vec![2], &[0.5, 0.1]), &targets(Labels::Int(vec![0, 1]))).unwrap();
    let err = e.update(&f32_output("p", vec![1], &[0.5]), &targets(Labels::Int(vec![2]))).unwrap_err();
    assert!(err.to_string().contains("outside {0, 1} for a binary task"), "{err}");
    let err = e.update(&f32_output("p", vec![1], &[f32::NAN]), &targets(Labels::Int(vec![1]))).unwrap_err();
    assert!(matches!(err, EvalError::NotFinite { row: 0, .. }), "{err}");
    assert_eq!(e.examples(), 2, "failed batches add nothing");

    assert!(Metric::parse("acuracy").unwrap_err().contains("did you mean 'accuracy'"));
    assert_eq!(Metric::parse("PR-AUC"), Ok(Metric::PrAuc));
}

#[test]
fn metric_aliases_are_taken_and_a_prefix_is_suggested_before_a_near_name() {
    assert_eq!(Metric::parse("acc"), Ok(Metric::Accuracy));
    assert_eq!(Metric::parse("roc_auc"), Ok(Metric::Auc));
    assert_eq!(Metric::parse("logloss"), Ok(Metric::LogLoss));
    // `accu` is one edit from nothing useful but the start of accuracy.
    assert!(Metric::parse("accu").unwrap_err().contains("did you mean 'accuracy'"));
    assert!(Metric::parse("calib").unwrap_err().contains("did you mean 'calibration'"));
    assert!(Metric::parse("acuracy").unwrap_err().contains("did you mean 'accuracy'"));
}

#[test]
fn slices_have_their_own_metrics_and_log_loss_clips_like_sklearn() {
    let sig = signature(&[("p", DType::Float64, vec![None])]);
    let spec = MetricsSpec { metrics: vec![Metric::Accuracy, Metric::LogLoss], ..MetricsSpec::default() };
    let mut e = Evaluator::new(&spec, &sig, &["country".into()]).unwrap();
    let outputs = vec![(
        "p".to_string(),
        Tensor::dense(DType::Float64, vec![3], [1.0f64, 0.0, 0.8].iter().flat_map(|v| v.to_le_bytes()).collect()),
    )];
    let t = Targets {
        rows: 3,
        labels: Labels::Int(vec![0, 0, 1]),
        weights: Some(vec![1.0, 1.0, 2.0]),
        slices: vec![("country".into(), vec!["fr".into(), "de".into(), "fr".into()])],
        first_index: 0,
        keys: None,
    };
    e.update(&outputs, &t).unwrap();
    let eval = e.finish();
    // p = 1 for a negative: clipped to 1 - eps(float64), as sklearn does.
    let worst = -(f64::EPSILON).ln();
    let expected = (worst + 0.0 + 2.0 * -(0.8f64.ln())) / 4.0;
    assert!((eval.metrics["log_loss"] - expected).abs() < 1e-12, "{}", eval.metrics["log_loss"]);
    assert_eq!(eval.slices["country"]["fr"]["accuracy"], 2.0 / 3.0);
    assert_eq!(eval.slices["country"]["de"]["accuracy"], 1.0);
    assert_eq!(eval.slices["country"]["de"]["examples"], 1.0);
    let json = eval.to_json();
    assert_eq!(json["slices"]["country"]["fr"]["examples"].to_string(), "2", "an integer, not 2.0");
    assert!(json["slices"]["country"]["fr"]["examples"].is_u64());
}

#[test]
fn bounds_and_drops_parse_and_check_in_the_metrics_direction() {
    let bound: Bound = "accuracy>=0.9".parse().unwrap();
    assert_eq!(bound, Bound { metric: Metric::Accuracy, op: BoundOp::AtLeast, value: 0.9 });
    assert_eq!("log_loss <= 0.3".parse::<Bound>().unwrap().op, BoundOp::AtMost);
    assert!("accuracy>0.9".parse::<Bound>().unwrap_err().contains("'>' and '<' and '=' alone are not bounds"));
    assert!("acuracy>=0.9".parse::<Bound>().unwrap_err().contains("unknown metric 'acuracy'"));
    assert_eq!("acc>=0.9".parse::<Bound>().unwrap().metric, Metric::Accuracy, "an alias");
    assert!("accuracy>=high".parse::<Bound>().unwrap_err().contains("'high' is not a number"));
    let relative: MaxDrop = "accuracy=2%".parse().unwrap();
    assert_eq!(relative, MaxDrop { metric: Metric::Accuracy, amount: 0.02, relative: true });
    assert!("accuracy=-1".parse::<MaxDrop>().is_err());

    let sig = signature(&[("p", DType::Float32, vec![None])]);
    let mut e = Evaluator::new(&MetricsSpec::default(), &sig, &[]).unwrap();
    e.update(&f32_output("p", vec![4], &[0.9, 0.2, 0.6, 0.1]), &targets(Labels::Int(vec![1, 0, 0, 0]))).unwrap();
    let eval = e.finish();
    assert_eq!(eval.metrics["accuracy"], 0.75);
    assert_eq!(check(&eval, &["accuracy>=0.75".parse().unwrap()], &[], None), []);
    let breach = check(&eval, &["accuracy>=0.8".parse().unwrap()], &[], None).remove(0);
    assert_eq!(
        (breach.metric.as_str(), breach.rule.as_str(), breach.bound, breach.value),
        ("accuracy", "accuracy>=0.8", 0.8, 0.75)
    );

    let baseline: BTreeMap<String, f64> = [("accuracy".to_string(), 0.76), ("log_loss".to_string(), 0.30)].into();
    let drops: Vec<MaxDrop> = vec!["accuracy=2%".parse().unwrap()];
    assert_eq!(check(&eval, &[], &drops, Some(&baseline)), [], "0.75 >= 0.76 - 2%");
    let drops: Vec<MaxDrop> = vec!["accuracy=0.005".parse().unwrap()];
    let breach = check(&eval, &[], &drops, Some(&baseline)).remove(0);
    assert_eq!((breach.rule.as_str(), breach.baseline), ("max drop accuracy=0.005", Some(0.76)));
    assert!((breach.bound - 0.755).abs() < 1e-12);
    // Lower is better for log loss: a rise is the drop.
    let ll = eval.metrics["log_loss"];
    let tight: BTreeMap<String, f64> = [("log_loss".to_string(), ll - 0.1)].into();
    let breach = check(&eval, &[], &["log_loss=0.05".parse().unwrap()], Some(&tight)).remove(0);
    assert!((breach.bound - (ll - 0.05)).abs() < 1e-12);
    assert!(check(&eval, &[], &["log_loss=0.05".parse().unwrap()], None).is_empty(), "no baseline: a new model");
    assert!(check(&eval, &[], &["mse=0.05".parse().unwrap()], Some(&tight)).is_empty(), "metric not in the baseline");
    // A bound on a metric not computed does not pass.
    assert!(check(&eval, &["rmse<=1".parse().unwrap()], &[], None)[0].value.is_nan());
}

#[test]
fn the_confusion_matrix_is_left_out_past_its_class_cap_and_metrics_stay_right() {
    let classes = 50_000usize;
    let sig = signature(&[("p", DType::Float32, vec![None, Some(classes as u64)])]);
    let spec = MetricsSpec {
        metrics: vec![Metric::Accuracy, Metric::Precision, Metric::Recall, Metric::F1],
        ..MetricsSpec::default()
    };
    let mut evaluator = Evaluator::new(&spec, &sig, &[]).unwrap();
    // Three rows: true 7 predicted 7, true 49999 predicted 7, true 3 predicted 3.
    let mut scores = vec![0.0f32; 3 * classes];
    scores[7] = 1.0;
    scores[classes + 7] = 1.0;
    scores[2 * classes + 3] = 1.0;
    evaluator
        .update(&f32_output("p", vec![3, classes as u64], &scores), &targets(Labels::Int(vec![7, 49_999, 3])))
        .unwrap();
    let e = evaluator.finish();
    assert_eq!(e.confusion_matrix, None);
    let json = e.to_json();
    assert_eq!(json["confusion_matrix"], serde_json::Value::Null);
    assert_eq!(json["confusion_matrix_omitted"], serde_json::json!(true), "{json}");
    assert!((e.metrics["accuracy"] - 2.0 / 3.0).abs() < 1e-12);
    // Classes present: 3, 7, 49999. Precision: 1, 0.5, 0; recall: 1, 1, 0.
    assert!((e.metrics["precision"] - 0.5).abs() < 1e-12, "{:?}", e.metrics);
    assert!((e.metrics["recall"] - 2.0 / 3.0).abs() < 1e-12, "{:?}", e.metrics);

    // At the cap it is kept.
    let classes = isorun_eval::metrics::MAX_CONFUSION_CLASSES;
    let sig = signature(&[("p", DType::Float32, vec![None, Some(classes as u64)])]);
    let mut evaluator = Evaluator::new(&spec, &sig, &[]).unwrap();
    let mut scores = vec![0.0f32; classes];
    scores[2] = 1.0;
    evaluator.update(&f32_output("p", vec![1, classes as u64], &scores), &targets(Labels::Int(vec![5]))).unwrap();
    let e = evaluator.finish();
    let matrix = e.confusion_matrix.as_ref().expect("kept at the cap");
    assert_eq!((matrix.len(), matrix[5][2]), (classes, 1));
    assert!(e.to_json().get("confusion_matrix_omitted").is_none());
}
