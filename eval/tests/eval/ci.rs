//! `--ci`: the statistics of the bootstrap intervals (coverage of a known
//! truth), their agreement with a plain NumPy/scikit-learn bootstrap of the
//! same weights, and their merging across data shards.

use isorun_eval::bootstrap::{mix64, Bootstrap};
use isorun_eval::{CiSpec, Evaluation, Evaluator, KeyedBy, Labels, Metric, MetricState, MetricsSpec, Targets};
use isorun_protocol::{DType, SignatureInfo, Tensor};
use std::path::{Path, PathBuf};

use super::util;

fn signature() -> SignatureInfo {
    util::signature(vec![], vec![util::tensor("p", DType::Float64, &[None])])
}

fn output(scores: &[f64]) -> Vec<(String, Tensor)> {
    let bytes = scores.iter().flat_map(|v| v.to_le_bytes()).collect();
    vec![("p".into(), Tensor::dense(DType::Float64, vec![scores.len() as u64], bytes))]
}

/// A seeded stream of uniforms in (0, 1): SplitMix64.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        ((mix64(self.0) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Φ, the standard normal CDF (Numerical Recipes' erfc, relative error < 1.2e-7).
fn phi(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 {
        1.0 - 0.5 * erfc
    } else {
        0.5 * erfc
    }
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Binary examples whose score is the sigmoid of N(±μ/2, 1) (+ for
/// positives): the true accuracy at 0.5 is Φ(μ/2), the true AUC Φ(μ/√2).
fn synthetic(rng: &mut Rng, n: usize, mu: f64) -> (Vec<i64>, Vec<f64>) {
    let mut labels = Vec::with_capacity(n);
    let mut scores = Vec::with_capacity(n);
    for _ in 0..n {
        let positive = rng.uniform() < 0.4;
        let centre = if positive { mu / 2.0 } else { -mu / 2.0 };
        labels.push(i64::from(positive));
        scores.push(sigmoid(centre + rng.normal()));
    }
    (labels, scores)
}

fn targets(labels: &[i64], first_index: u64, keys: Option<Vec<String>>, weights: Option<Vec<f64>>) -> Targets {
    Targets { rows: labels.len(), labels: Labels::Int(labels.to_vec()), weights, slices: vec![], first_index, keys }
}

fn spec(metrics: &[Metric]) -> MetricsSpec {
    MetricsSpec { metrics: metrics.to_vec(), ..MetricsSpec::default() }
}

fn ci(replicates: u32, seed: u64, by: KeyedBy) -> CiSpec {
    CiSpec { bootstrap: Bootstrap { replicates, seed }, level: 0.95, by }
}

fn interval(evaluation: &Evaluation, metric: &str) -> (f64, f64) {
    evaluation.ci.as_ref().expect("--ci").overall[metric].expect("an interval")
}

/// 400 seeded simulations of 2,000 examples, 200 replicates each: the 95%
/// percentile intervals of accuracy and AUC cover the true values in 93% to
/// 97% of them (the binomial sd of 400 at 0.95 is 1.1%). A bootstrap that
/// ignored its weights (zero-width intervals) covers ~0%, one with too
/// little spread far less than 93%, one too wide more than 97%.
#[test]
fn ninety_five_percent_intervals_cover_the_true_accuracy_and_auc_in_93_to_97_percent_of_400_simulations() {
    let (simulations, n, mu) = (400u64, if cfg!(debug_assertions) { 500 } else { 2000 }, 1.0);
    let (true_accuracy, true_auc) = (phi(mu / 2.0), phi(mu / std::f64::consts::SQRT_2));
    let (mut accuracy_covers, mut auc_covers) = (0, 0);
    for simulation in 0..simulations {
        let mut rng = Rng(mix64(simulation ^ 0xc0ffee));
        let (labels, scores) = synthetic(&mut rng, n, mu);
        let mut evaluator = Evaluator::new(&spec(&[Metric::Accuracy, Metric::Auc]), &signature(), &[])
            .unwrap()
            .with_ci(ci(200, simulation, KeyedBy::Index));
        evaluator.update(&output(&scores), &targets(&labels, 0, None, None)).unwrap();
        let evaluation = evaluator.finish();
        let covers = |(low, high): (f64, f64), truth: f64| low <= truth && truth <= high;
        accuracy_covers += usize::from(covers(interval(&evaluation, "accuracy"), true_accuracy));
        auc_covers += usize::from(covers(interval(&evaluation, "auc"), true_auc));
    }
    let within = 372..=388; // 93% and 97% of 400
    assert!(within.contains(&accuracy_covers), "accuracy: {accuracy_covers} of 400 intervals cover {true_accuracy}");
    assert!(within.contains(&auc_covers), "auc: {auc_covers} of 400 intervals cover {true_auc}");
}

fn python() -> Option<PathBuf> {
    let python = std::env::var_os("ISORUN_FIXTURES_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").expect("HOME")).join(".cache"));
        cache.join("isorun/fixtures-venv/bin/python")
    });
    if python.is_file() {
        return Some(python);
    }
    eprintln!(
        "NOTE: ci::numpy agreement SKIPPED: no Python with NumPy and scikit-learn at {} (run scripts/make-fixtures, \
         or set ISORUN_FIXTURES_PYTHON)",
        python.display()
    );
    None
}

/// The script recomputes every replicate's weights (its own SplitMix64,
/// FNV-1a and Poisson inversion), each replicate's accuracy, mse, log_loss
/// and AUC with scikit-learn's `sample_weight`, and `np.quantile` intervals;
/// they agree with the evaluator's to 1e-9, by key with `--weight` and by
/// index from a batch's `first_index`.
#[test]
fn intervals_agree_with_a_numpy_bootstrap_of_the_same_weights_to_1e_9() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let metrics = [Metric::Accuracy, Metric::Mse, Metric::LogLoss, Metric::Auc];
    for (case, by) in [("key", KeyedBy::Key), ("index", KeyedBy::Index)] {
        let mut rng = Rng(mix64(41));
        let (labels, scores) = synthetic(&mut rng, 400, 1.2);
        let keys: Vec<String> = (0..labels.len()).map(|i| format!("example-{}", i * 7)).collect();
        let weights: Vec<f64> = (0..labels.len()).map(|_| 0.5 + rng.uniform() * 1.5).collect();
        let (first_index, row_weights) = match by {
            KeyedBy::Key => (0, Some(weights.clone())),
            KeyedBy::Index => (1000, None),
        };
        let mut evaluator = Evaluator::new(&spec(&metrics), &signature(), &[]).unwrap().with_ci(ci(60, 7, by));
        let batch = targets(&labels, first_index, Some(keys.clone()), row_weights.clone());
        evaluator.update(&output(&scores), &batch).unwrap();
        let record = evaluator.finish().to_json();
        let case_json = serde_json::json!({
            "by": case, "seed": 7, "replicates": 60, "level": 0.95, "first_index": first_index,
            "keys": keys, "labels": labels, "scores": scores, "weights": row_weights,
            "ci": record["ci"], "bootstrap_values": record["bootstrap_values"], "metrics": record["metrics"],
        });
        let path = dir.path().join(format!("{case}.json"));
        std::fs::write(&path, serde_json::to_vec(&case_json).unwrap()).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ci_reference.py");
        let out = std::process::Command::new(&python).arg(&script).arg(&path).output().unwrap();
        assert!(
            out.status.success(),
            "{case}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("agree"), "{}", String::from_utf8_lossy(&out.stdout));
    }
}

fn sliced_run(parts: &[(usize, usize)], by: KeyedBy, labels: &[i64], scores: &[f64]) -> MetricState {
    let slices = vec!["half".to_string()];
    let metrics = [Metric::Accuracy, Metric::Auc, Metric::LogLoss];
    let mut merged: Option<MetricState> = None;
    for &(start, end) in parts {
        let mut evaluator = Evaluator::new(&spec(&metrics), &signature(), &slices).unwrap().with_ci(ci(50, 3, by));
        // Two batches per part, each with the part's own first_index (as --data-shard reads).
        for (from, to) in [(start, (start + end) / 2), ((start + end) / 2, end)] {
            let keys = (from..to).map(|i| format!("k{i}")).collect();
            let mut batch = targets(&labels[from..to], (from - start) as u64, Some(keys), None);
            batch.slices = vec![("half".into(), (from..to).map(|i| (i % 2).to_string()).collect())];
            evaluator.update(&output(&scores[from..to]), &batch).unwrap();
        }
        // Through JSON, as a shard's record carries it.
        let state = MetricState::from_json(&evaluator.state().to_json()).unwrap();
        match &mut merged {
            None => merged = Some(state),
            Some(m) => m.merge(&state).unwrap(),
        }
    }
    merged.unwrap()
}

/// Keyed by `--example-key`, shards merged (through their JSON) give one
/// machine's intervals, overall and per slice, to 1e-12; keyed by each
/// shard's own index they are other (still valid) draws.
#[test]
fn merged_shards_keyed_by_example_key_give_one_machines_intervals() {
    let mut rng = Rng(mix64(5));
    let (labels, scores) = synthetic(&mut rng, 600, 1.0);
    let one = Evaluation::from_state(&sliced_run(&[(0, 600)], KeyedBy::Key, &labels, &scores));
    let three =
        Evaluation::from_state(&sliced_run(&[(0, 250), (250, 400), (400, 600)], KeyedBy::Key, &labels, &scores));
    let (one_ci, three_ci) = (one.ci.as_ref().unwrap(), three.ci.as_ref().unwrap());
    for metric in ["accuracy", "auc", "log_loss"] {
        for (a, b) in one_ci.values[metric].iter().zip(&three_ci.values[metric]) {
            assert!((a - b).abs() < 1e-12, "{metric}: {a} against {b}");
        }
        let ((l1, h1), (l3, h3)) = (one_ci.overall[metric].unwrap(), three_ci.overall[metric].unwrap());
        assert!((l1 - l3).abs() < 1e-12 && (h1 - h3).abs() < 1e-12, "{metric}");
        for value in ["0", "1"] {
            let (a, b) =
                (one_ci.slices["half"][value][metric].unwrap(), three_ci.slices["half"][value][metric].unwrap());
            assert!((a.0 - b.0).abs() < 1e-12 && (a.1 - b.1).abs() < 1e-12, "{metric} slice {value}");
        }
    }
    let record = one.to_json();
    assert_eq!(record["bootstrap"], serde_json::json!({"replicates": 50, "seed": 3, "by": "key"}));
    assert!(record["slices"]["half"]["0"]["ci"]["accuracy"].is_array(), "{record}");
    assert_eq!(record["bootstrap_values"]["accuracy"].as_array().unwrap().len(), 50);
    let by_index = Evaluation::from_state(&sliced_run(&[(0, 300), (300, 600)], KeyedBy::Index, &labels, &scores));
    let whole = Evaluation::from_state(&sliced_run(&[(0, 600)], KeyedBy::Index, &labels, &scores));
    assert_ne!(by_index.ci.unwrap().values["accuracy"], whole.ci.unwrap().values["accuracy"]);
}

/// An evaluator keyed by `--example-key` refuses a batch without keys
/// rather than drawing weights by index.
#[test]
fn a_keyed_bootstrap_needs_every_batchs_keys() {
    let mut evaluator =
        Evaluator::new(&spec(&[Metric::Accuracy]), &signature(), &[]).unwrap().with_ci(ci(10, 0, KeyedBy::Key));
    let err = evaluator.update(&output(&[0.2, 0.9]), &targets(&[0, 1], 0, None, None)).unwrap_err();
    assert!(err.to_string().contains("example keys"), "{err}");
    assert_eq!(evaluator.examples(), 0);
}

/// A metric the replicates do not compute (`ece`) has no interval, and is
/// left out of `"ci"`, overall and per slice, as keys that do not apply
/// are, never `null`; the others keep theirs.
#[test]
fn a_metric_without_an_interval_is_left_out_of_ci_not_null() {
    let mut rng = Rng(mix64(11));
    let (labels, scores) = synthetic(&mut rng, 300, 1.0);
    let slices = vec!["half".to_string()];
    let mut evaluator = Evaluator::new(&spec(&[Metric::Accuracy, Metric::Ece, Metric::Brier]), &signature(), &slices)
        .unwrap()
        .with_ci(ci(20, 1, KeyedBy::Index));
    let mut batch = targets(&labels, 0, None, None);
    batch.slices = vec![("half".into(), (0..labels.len()).map(|i| (i % 2).to_string()).collect())];
    evaluator.update(&output(&scores), &batch).unwrap();
    let record = evaluator.finish().to_json();
    assert!(record["metrics"]["ece"].is_number(), "ece itself is computed: {}", record["metrics"]);
    for ci in [&record["ci"], &record["slices"]["half"]["0"]["ci"], &record["slices"]["half"]["1"]["ci"]] {
        let ci = ci.as_object().unwrap_or_else(|| panic!("no ci object: {record}"));
        assert!(ci["accuracy"].is_array() && ci["brier"].is_array(), "{ci:?}");
        assert!(!ci.contains_key("ece"), "ece has no interval, so no key: {ci:?}");
        assert!(ci.values().all(|v| !v.is_null()), "{ci:?}");
    }
}
