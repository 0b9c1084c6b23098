//! A metric state's JSON comes from a file (a shard report): every size it
//! claims (classes, bootstrap replicates, curve buckets) must be backed by
//! the data in it, within hard bounds, before anything is allocated by it,
//! and counts summed while merging must not wrap. Each lying state here is
//! refused with an error that says what is wrong.

use isorun_eval::bootstrap::Bootstrap;
use isorun_eval::{CiSpec, Evaluator, KeyedBy, Labels, Metric, MetricState, MetricsSpec, Targets};
use isorun_protocol::{DType, Tensor};
use serde_json::{json, Value};

use super::util::scores;

/// The state of a model of `columns` outputs (1: binary) over a few rows,
/// with `replicates` bootstrap replicates when given.
fn state(columns: usize, metrics: Vec<Metric>, replicates: Option<u32>) -> Value {
    let signature = scores(columns as u64);
    let spec = MetricsSpec { metrics, ..MetricsSpec::default() };
    let mut evaluator = Evaluator::new(&spec, &signature, &[]).unwrap();
    if let Some(replicates) = replicates {
        let bootstrap = Bootstrap { replicates, seed: 1 };
        evaluator = evaluator.with_ci(CiSpec { bootstrap, level: 0.95, by: KeyedBy::Index });
    }
    let rows = 6;
    let outputs: Vec<f64> = (0..rows * columns).map(|i| ((i * 7) % 10) as f64 / 10.0).collect();
    let labels: Vec<i64> = (0..rows).map(|r| (r % columns.max(2)) as i64).collect();
    let shape = if columns == 1 { vec![rows as u64] } else { vec![rows as u64, columns as u64] };
    let bytes = outputs.iter().flat_map(|v| v.to_le_bytes()).collect();
    let targets =
        Targets { rows, labels: Labels::Int(labels), weights: None, slices: vec![], first_index: 0, keys: None };
    evaluator.update(&[("out".into(), Tensor::dense(DType::Float64, shape, bytes))], &targets).unwrap();
    evaluator.state().to_json()
}

fn refused(value: &Value) -> String {
    match MetricState::from_json(value) {
        Ok(_) => panic!("a lying state was read"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_class_count_not_backed_by_per_class_sums_is_refused_before_anything_is_sized_by_it() {
    let honest = state(3, vec![Metric::Accuracy], Some(200));
    assert!(MetricState::from_json(&honest).is_ok());

    // 10^12 classes with replicates: (9 + 3 × classes) × 200 floats, were they allocated.
    let mut huge = honest.clone();
    huge["classes"] = json!(1_000_000_000_000u64);
    assert_eq!(refused(&huge), "metric_state: 1000000000000 classes: a multiclass state has 2 to 1048576");

    // Within the bound, but not what the per-class sums hold.
    let mut more = honest.clone();
    more["classes"] = json!(1000);
    assert_eq!(refused(&more), "metric_state: overall: \"present\" is not 1000 flags");

    // No per-class sums at all: nothing backs the count.
    let mut bare = more.clone();
    bare.as_object_mut().unwrap().remove("overall");
    assert_eq!(
        refused(&bare),
        "metric_state: a multiclass state of 1000 classes without its per-class sums (\"overall\")"
    );
}

#[test]
fn replicate_lists_must_hold_what_the_counts_claim() {
    let honest = state(3, vec![Metric::Accuracy], Some(20));
    let mut more = honest.clone();
    more["replicates"]["replicates"] = json!(10_000);
    assert_eq!(refused(&more), "metric_state: replicates: overall: \"values\" is not 180000 entries");

    let mut short = honest.clone();
    short["replicates"]["overall"]["present"] = json!([1, 0]);
    assert_eq!(refused(&short), "metric_state: replicates: overall: \"present\" is not 60 entries");

    let mut too_many = honest;
    too_many["replicates"]["replicates"] = json!(1_000_000_000u64);
    assert_eq!(refused(&too_many), "metric_state: replicates: no valid \"replicates\" count");
}

#[test]
fn curves_and_confusion_matrices_are_no_bigger_than_eval_makes_them() {
    let honest = state(1, vec![Metric::Auc], None);
    assert!(MetricState::from_json(&honest).is_ok());
    // A bucketed curve of 2^24 buckets is 256 MiB; eval's binary curve has 2^16.
    let mut buckets = honest.clone();
    buckets["overall"]["curve"] = json!({"cap": 1, "buckets": 1 << 24, "low": 0.0, "high": 1.0, "counts": []});
    assert_eq!(refused(&buckets), "metric_state: overall: curve: 16777216 buckets, more than the 65536 of its place");

    let mut square = honest;
    square["confusion"] = json!([[1, 0, 0], [0, 1, 0], [0, 0, 1]]);
    assert_eq!(refused(&square), "metric_state: a confusion matrix of 3 rows for 2 classes");
}

#[test]
fn counts_that_would_pass_u64_when_merged_are_an_error_not_a_wrap() {
    let honest = state(1, vec![Metric::Accuracy], Some(10));
    let mut full = honest.clone();
    full["examples"] = json!(u64::MAX - 2);
    let mut first = MetricState::from_json(&full).unwrap();
    first.set_source("a.json");
    let mut second = MetricState::from_json(&honest).unwrap();
    second.set_source("b.json");
    assert_eq!(
        first.merge(&second).unwrap_err().to_string(),
        "cannot merge the metric state of b.json into that of a.json: the summed examples overflow a 64-bit count \
         (18446744073709551613 + 6)"
    );

    let mut inner = honest.clone();
    inner["overall"]["examples"] = json!(u64::MAX);
    let mut first = MetricState::from_json(&inner).unwrap();
    let error = first.merge(&second).unwrap_err().to_string();
    assert!(error.ends_with("the summed examples overflow a 64-bit count (18446744073709551615 + 6)"), "{error}");

    let mut replicate = honest;
    let examples = replicate["replicates"]["overall"]["examples"].as_array().unwrap().len();
    replicate["replicates"]["overall"]["examples"] = json!(vec![u64::MAX; examples]);
    let mut first = MetricState::from_json(&replicate).unwrap();
    let error = first.merge(&second).unwrap_err().to_string();
    assert!(error.contains("the summed replicate examples overflow a 64-bit count"), "{error}");
}

#[test]
fn slices_hold_no_more_values_than_eval_keeps_and_curves_only_where_eval_keeps_them() {
    let empty = json!({"cap": 1, "buckets": 1024, "low": 0.0, "high": 1.0, "counts": []});
    let mut binary = state(1, vec![Metric::Auc], None);
    binary["slice_features"] = json!(["s"]);
    let values = |n: usize, slice: &Value| -> Value {
        json!([{ "values": (0..n).map(|v| (v.to_string(), slice.clone())).collect::<serde_json::Map<_, _>>() }])
    };
    binary["slices"] = values(1000, &json!({"examples": 0, "curve": empty}));
    assert!(MetricState::from_json(&binary).is_ok());
    // 1001 values: past MAX_SLICE_VALUES, which eval never writes.
    binary["slices"] = values(1001, &json!({"examples": 0, "curve": empty}));
    assert_eq!(
        refused(&binary),
        "metric_state: slice s: 1001 values, more than the 1000 eval keeps for a slice feature"
    );

    // Eval keeps no curves for a multiclass state's slice values.
    let mut multiclass = state(3, vec![Metric::Auc], None);
    multiclass["slice_features"] = json!(["s"]);
    let mut slice = multiclass["overall"].clone();
    assert!(slice["curves"].is_array());
    multiclass["slices"] = values(1, &slice);
    assert_eq!(
        refused(&multiclass),
        "metric_state: slice s=0: AUC curves, which eval keeps for no slice of a multiclass state"
    );
    slice.as_object_mut().unwrap().remove("curves");
    multiclass["slices"] = values(1, &slice);
    assert!(MetricState::from_json(&multiclass).is_ok());
}
