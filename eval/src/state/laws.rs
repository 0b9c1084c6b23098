//! Property tests of the merge laws `crate::accumulator` states, for every
//! accumulator (`ExactSum`, `Curve`, `Calibration`, `TopConfusions`) and
//! for the whole [`MetricState`]: merging is associative and commutative,
//! an empty state is its identity, the JSON round-trips, and any split of
//! the data merges to the one-pass result. These laws are what `isorun
//! report merge` relies on, so they are checked here on many random inputs
//! rather than on a few hand-picked ones.
//!
//! The inputs come from a small seeded generator (splitmix64; no
//! dependency, the same cases on every machine, and a failure names its
//! seed to replay). Where a law holds to the last bit the comparison is
//! exact: counts, `ExactSum`s, and curve counts of dyadic weights (k/4) at
//! dyadic scores (k/64), whose plain sums never round at these sizes. Only
//! the curve with arbitrary weights is compared with a tolerance (see
//! [`curves_with_any_weights_merge_to_the_one_pass_values_to_rounding`]).

use super::metric_state::MetricState;
use crate::accumulator::Accumulator;
use crate::calibration::Calibration;
use crate::confusion::TopConfusions;
use crate::curve::Curve;
use crate::data::{Labels, Targets};
use crate::exact::ExactSum;
use crate::metrics::{Evaluation, Evaluator, MetricsSpec};
use crate::task::{Metric, Task};
use isorun_protocol::{DType, SignatureInfo, Tensor, TensorSpec};
use serde_json::Value;

/// Random cases per law and accumulator.
const CASES: u64 = 200;

/// splitmix64 (`isorun_alloc_bound::SplitMix`), seeded per case, with the
/// draws the laws need.
struct Rng(isorun_alloc_bound::SplitMix);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(isorun_alloc_bound::SplitMix(seed))
    }

    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, n).
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    /// A dyadic weight in {0.25, 0.5, .., 2}: sums of a few hundred never round.
    fn dyadic_weight(&mut self) -> f64 {
        (1 + self.below(8)) as f64 / 4.0
    }

    /// A dyadic probability k/64: few distinct scores, so ties.
    fn dyadic_score(&mut self) -> f64 {
        self.below(65) as f64 / 64.0
    }

    /// Cut points splitting `0..n` into `parts` consecutive pieces (some may be empty).
    fn split(&mut self, n: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
        let mut cuts: Vec<usize> = (1..parts).map(|_| self.below(n + 1)).collect();
        cuts.sort_unstable();
        let bounds: Vec<usize> = std::iter::once(0).chain(cuts).chain(std::iter::once(n)).collect();
        bounds.windows(2).map(|w| w[0]..w[1]).collect()
    }
}

/// Checks the laws of one accumulator over `CASES` random cases.
///
/// `fresh` makes an empty accumulator (the same settings every time),
/// `inputs` draws a case's examples, `bounds` what decoding it needs, and
/// `same` asserts two accumulators equal as the laws promise (panicking
/// with the message it is given).
fn check_laws<A, I>(
    name: &str,
    fresh: impl Fn() -> A,
    inputs: impl Fn(&mut Rng) -> Vec<I>,
    bounds: impl Fn() -> A::Bounds,
    same: impl Fn(&A, &A, &str),
) where
    A: Accumulator<Input = I> + Clone,
    I: Clone,
{
    let of = |items: &[I]| {
        let mut acc = fresh();
        acc.add_batch(items.iter().cloned());
        acc
    };
    let merged = |a: &A, b: &A| {
        let mut out = a.clone();
        out.merge(b).unwrap_or_else(|e| panic!("{name}: merge refused: {e}"));
        out
    };
    for seed in 0..CASES {
        let mut rng = Rng::new(seed);
        let items = inputs(&mut rng);
        let one_pass = of(&items);
        let what = |law: &str| format!("{name}, seed {seed}: {law}");

        // Any split, merged left to right, each part through its JSON.
        let parts = 1 + rng.below(5);
        let mut split = fresh();
        for range in rng.split(items.len(), parts) {
            let part =
                A::decode(&of(&items[range]).encode(), bounds()).unwrap_or_else(|e| panic!("{}: {e}", what("decode")));
            split = merged(&split, &part);
        }
        same(&split, &one_pass, &what(&format!("{parts} parts merged against one pass")));

        let thirds = rng.split(items.len(), 3);
        let [x, y, z] = [0, 1, 2].map(|i| of(&items[thirds[i].clone()]));
        same(&merged(&x, &y), &merged(&y, &x), &what("commutative"));
        same(&merged(&merged(&x, &y), &z), &merged(&x, &merged(&y, &z)), &what("associative"));
        same(&merged(&x, &fresh()), &x, &what("empty on the right"));
        same(&merged(&fresh(), &x), &x, &what("empty on the left"));
        let back = A::decode(&x.encode(), bounds()).unwrap_or_else(|e| panic!("{}: {e}", what("decode")));
        same(&back, &x, &what("JSON round trip"));
    }
}

/// Two sums are the same number exactly: their difference is exactly 0.
fn same_sum(a: &ExactSum, b: &ExactSum, what: &str) {
    let (partials, special) = b.parts();
    let negated: Vec<f64> = partials.iter().map(|p| -p).collect();
    let mut difference = a.clone();
    difference.merge(&ExactSum::from_parts(&negated, 0.0));
    let (_, a_special) = a.parts();
    assert!(
        difference.finish() == 0.0 && a_special.to_bits() == special.to_bits(),
        "{what}: {} against {}",
        a.finish(),
        b.finish()
    );
    assert_eq!(a.finish().to_bits(), b.finish().to_bits(), "{what}");
}

#[test]
fn exact_sums_merge_to_the_one_pass_sum_to_the_last_bit() {
    check_laws(
        "ExactSum",
        ExactSum::default,
        |rng| {
            // Magnitudes over 40 decades and both signs: a plain sum would round.
            (0..rng.below(200)).map(|_| (rng.unit() - 0.5) * 10f64.powi(rng.below(40) as i32 - 20)).collect()
        },
        || (),
        same_sum,
    );
}

/// Curves equal as the laws promise: the same JSON (scores and counts, or
/// buckets) and the same AUC and average precision to the bit.
fn same_curve(a: &Curve, b: &Curve, what: &str) {
    assert_eq!(a.exact(), b.exact(), "{what}: exact");
    assert_eq!(a.encode(), b.encode(), "{what}");
    let ((auc_a, ap_a), (auc_b, ap_b)) = (a.finish(), b.finish());
    assert_eq!((auc_a.to_bits(), ap_a.to_bits()), (auc_b.to_bits(), ap_b.to_bits()), "{what}");
}

#[test]
fn exact_curves_merge_to_the_one_pass_curve() {
    check_laws(
        "Curve (exact)",
        || Curve::new(1 << 10, 64),
        |rng| (0..rng.below(300)).map(|_| (rng.dyadic_score(), rng.coin(), rng.dyadic_weight())).collect(),
        || 64,
        same_curve,
    );
}

#[test]
fn bucketed_curves_of_probabilities_merge_to_the_one_pass_curve() {
    // A cap of 16 distinct scores: most cases bucket (over [0, 1], as
    // probabilities always do), some parts stay exact until merged.
    check_laws(
        "Curve (bucketed)",
        || Curve::new(16, 32),
        |rng| (0..rng.below(300)).map(|_| (rng.dyadic_score(), rng.coin(), rng.dyadic_weight())).collect(),
        || 32,
        same_curve,
    );
}

#[test]
fn curves_with_any_weights_merge_to_the_one_pass_values_to_rounding() {
    // Arbitrary weights in [0, 3): a score's counts are plain f64 sums of
    // at most 300 terms, which another order changes by at most
    // 300 · 2⁻⁵³ ≈ 3.3e-14 of the sum of their magnitudes (all positive
    // here, so of the count itself); AUC and average precision are sums of
    // products and ratios of those counts, a few such errors each: 1e-12
    // relative leaves a margin of ~10× and still catches any real change
    // (a misplaced example moves them by ≥ 1/(300·3) ≈ 1e-3).
    let close = |a: f64, b: f64, what: &str| {
        assert!(a.is_nan() && b.is_nan() || (a - b).abs() <= 1e-12 * a.abs().max(b.abs()), "{what}: {a} against {b}");
    };
    check_laws(
        "Curve (any weights)",
        || Curve::new(1 << 10, 64),
        |rng| (0..rng.below(300)).map(|_| (rng.dyadic_score(), rng.coin(), rng.unit() * 3.0)).collect(),
        || 64,
        |a: &Curve, b: &Curve, what: &str| {
            let ((auc_a, ap_a), (auc_b, ap_b)) = (a.finish(), b.finish());
            close(auc_a, auc_b, &format!("{what}: roc_auc"));
            close(ap_a, ap_b, &format!("{what}: average_precision"));
        },
    );
}

#[test]
fn calibration_bins_merge_to_the_one_pass_bins_to_the_last_bit() {
    check_laws(
        "Calibration",
        || Calibration::new(10),
        |rng| {
            // Any confidences (outside [0, 1] too) and weights: every sum is exact.
            (0..rng.below(300)).map(|_| (rng.unit() * 1.2 - 0.1, rng.coin(), rng.unit() * 5.0)).collect()
        },
        || (),
        |a: &Calibration, b: &Calibration, what: &str| {
            assert_eq!(a.diagram(), b.diagram(), "{what}");
            assert_eq!(a.finish().to_bits(), b.finish().to_bits(), "{what}: ece");
        },
    );
}

#[test]
fn top_confusions_within_their_entries_merge_to_the_one_pass_counts() {
    // 64 entries, at most 7 × 6 = 42 distinct confused pairs: never full, every count exact.
    check_laws(
        "TopConfusions (exact)",
        || TopConfusions::new(64),
        |rng| (0..rng.below(400)).map(|_| (rng.below(7), rng.below(7))).collect(),
        || 7,
        |a: &TopConfusions, b: &TopConfusions, what: &str| {
            assert_eq!(a.encode(), b.encode(), "{what}");
            assert!(a.finish().exact, "{what}: exact");
        },
    );
}

#[test]
fn top_confusions_past_their_entries_keep_their_bound_whatever_the_split() {
    // 8 entries for up to 90 distinct pairs: counters are taken from. What
    // holds of any split and grouping is the bound: a kept count is at most
    // the true count and at least it minus max_error, and a pair confused
    // more than max_error times is kept.
    let classes = 10;
    for seed in 0..CASES {
        let mut rng = Rng::new(seed);
        // Skewed: pair (0, 1) often, the rest spread.
        let items: Vec<(usize, usize)> = (0..rng.below(600))
            .map(|_| if rng.below(4) == 0 { (0, 1) } else { (rng.below(classes), rng.below(classes)) })
            .collect();
        let mut truth = std::collections::HashMap::new();
        for &(t, p) in items.iter().filter(|(t, p)| t != p) {
            *truth.entry((t as u64, p as u64)).or_insert(0u64) += 1;
        }
        let of = |items: &[(usize, usize)]| {
            let mut acc = TopConfusions::new(8);
            acc.add_batch(items.iter().copied());
            acc
        };
        let check = |acc: &TopConfusions, law: &str| {
            let json = acc.encode();
            let max_error = json["max_error"].as_u64().unwrap();
            let kept: std::collections::HashMap<(u64, u64), u64> = json["counts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| ((c[0].as_u64().unwrap(), c[1].as_u64().unwrap()), c[2].as_u64().unwrap()))
                .collect();
            assert!(kept.len() <= 8, "seed {seed}, {law}: {} counters", kept.len());
            for (pair, &count) in &truth {
                let held = kept.get(pair).copied().unwrap_or(0);
                assert!(held <= count && count <= held + max_error, "seed {seed}, {law}: {pair:?} {held} of {count}");
                assert!(count <= max_error || held > 0, "seed {seed}, {law}: {pair:?} ({count} > {max_error}) dropped");
            }
            assert!(kept.keys().all(|pair| truth.contains_key(pair)), "seed {seed}, {law}: a pair never confused");
        };
        check(&of(&items), "one pass");
        let count = 1 + rng.below(5);
        let parts = rng.split(items.len(), count);
        let mut split = TopConfusions::new(8);
        for range in parts {
            split.merge(&TopConfusions::decode(&of(&items[range]).encode(), classes).unwrap()).unwrap();
        }
        check(&split, "split");
        let thirds = rng.split(items.len(), 3);
        let [x, y, z] = [0, 1, 2].map(|i| of(&items[thirds[i].clone()]));
        let merged = |a: &TopConfusions, b: &TopConfusions| {
            let mut out = a.clone();
            out.merge(b).unwrap();
            out
        };
        assert_eq!(merged(&x, &y).encode(), merged(&y, &x).encode(), "seed {seed}: commutative");
        check(&merged(&merged(&x, &y), &z), "(x ⊕ y) ⊕ z");
        check(&merged(&x, &merged(&y, &z)), "x ⊕ (y ⊕ z)");
    }
}

/// One model's rows for a MetricState case: the task's output columns,
/// labels, dyadic weights or none, and a slice value per row.
struct Rows {
    columns: usize,
    outputs: Vec<f64>,
    labels: Labels,
    weights: Option<Vec<f64>>,
    slice: Vec<String>,
}

impl Rows {
    fn draw(rng: &mut Rng, task: Task) -> Rows {
        let n = rng.below(120);
        let columns = match task {
            Task::Multiclass { classes } => classes,
            _ => 1,
        };
        let outputs: Vec<f64> = match task {
            // Scores of k/64 that sum to 1 over the classes.
            Task::Multiclass { classes } => (0..n)
                .flat_map(|_| {
                    let mut left = 64;
                    let mut row: Vec<f64> = (0..classes - 1)
                        .map(|_| {
                            let k = rng.below(left + 1);
                            left -= k;
                            k as f64 / 64.0
                        })
                        .collect();
                    row.push(left as f64 / 64.0);
                    row
                })
                .collect(),
            Task::Binary => (0..n).map(|_| rng.dyadic_score()).collect(),
            Task::Regression => (0..n).map(|_| (rng.below(257) as f64 - 128.0) / 16.0).collect(),
        };
        let labels = match task {
            Task::Multiclass { classes } => Labels::Int((0..n).map(|_| rng.below(classes) as i64).collect()),
            Task::Binary => Labels::Int((0..n).map(|_| i64::from(rng.coin())).collect()),
            Task::Regression => Labels::Float((0..n).map(|_| (rng.below(257) as f64 - 128.0) / 16.0).collect()),
        };
        let weights = rng.coin().then(|| (0..n).map(|_| rng.dyadic_weight()).collect());
        let slice = (0..n).map(|_| format!("v{}", rng.below(4))).collect();
        Rows { columns, outputs, labels, weights, slice }
    }

    /// The metric state of rows `range`, fed in batches of up to 7.
    fn state(&self, spec: &MetricsSpec, range: std::ops::Range<usize>) -> MetricState {
        let shape = if self.columns == 1 { vec![None] } else { vec![None, Some(self.columns as u64)] };
        let signature = SignatureInfo {
            key: "serving_default".into(),
            inputs: vec![],
            outputs: vec![TensorSpec { name: "out".into(), dtype: DType::Float64, shape: Some(shape) }],
        };
        let mut evaluator = Evaluator::new(spec, &signature, &["group".to_string()]).unwrap();
        let rows: Vec<usize> = range.collect();
        for chunk in rows.chunks(7) {
            let n = chunk.len();
            let bytes: Vec<u8> = chunk
                .iter()
                .flat_map(|&r| {
                    self.outputs[r * self.columns..(r + 1) * self.columns].iter().flat_map(|v| v.to_le_bytes())
                })
                .collect();
            let shape = if self.columns == 1 { vec![n as u64] } else { vec![n as u64, self.columns as u64] };
            let labels = match &self.labels {
                Labels::Int(all) => Labels::Int(chunk.iter().map(|&r| all[r]).collect()),
                Labels::Float(all) => Labels::Float(chunk.iter().map(|&r| all[r]).collect()),
                _ => unreachable!("drawn as ints or floats"),
            };
            let targets = Targets {
                rows: n,
                labels,
                weights: self.weights.as_ref().map(|w| chunk.iter().map(|&r| w[r]).collect()),
                slices: vec![("group".to_string(), chunk.iter().map(|&r| self.slice[r].clone()).collect())],
                first_index: chunk[0] as u64,
                keys: None,
            };
            evaluator.update(&[("out".into(), Tensor::dense(DType::Float64, shape, bytes))], &targets).unwrap();
        }
        evaluator.state()
    }
}

/// Whether two states' JSON are the same, a sum compared by its exact
/// value where the partials that hold it differ (another order of the same
/// terms may leave one exact sum in other partials; a missing sum is 0).
fn same_state_json(a: &Value, b: &Value, at: &str) -> Result<(), String> {
    if a == b {
        return Ok(());
    }
    let sum = |v: &Value| if v.is_null() { Ok(ExactSum::default()) } else { ExactSum::decode(v, ()) };
    let as_sums = || match (sum(a), sum(b)) {
        (Ok(x), Ok(y)) => {
            let mut difference = x.clone();
            let (partials, special) = y.parts();
            difference.merge(&ExactSum::from_parts(&partials.iter().map(|p| -p).collect::<Vec<_>>(), 0.0));
            let same = difference.finish() == 0.0 && x.parts().1.to_bits() == special.to_bits();
            if same {
                Ok(())
            } else {
                Err(format!("{at}: {a} against {b}"))
            }
        }
        _ => Err(format!("{at}: {a} against {b}")),
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.keys().chain(y.keys()).try_for_each(|key| {
            let (x, y) = (x.get(key).unwrap_or(&Value::Null), y.get(key).unwrap_or(&Value::Null));
            same_state_json(x, y, &format!("{at}.{key}"))
        }),
        // A list of sums, or one sum's partials: element by element, else as one sum.
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .try_for_each(|(i, (x, y))| same_state_json(x, y, &format!("{at}[{i}]")))
            .or_else(|e| as_sums().map_err(|_| e)),
        _ => as_sums(),
    }
}

/// Two metric states equal as the laws promise: the same state (sums by
/// their exact value) and the same finished metrics, to the bit.
fn same_state(a: &MetricState, b: &MetricState, what: &str) {
    same_state_json(&a.to_json(), &b.to_json(), "state").unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(Evaluation::from_state(a).to_json(), Evaluation::from_state(b).to_json(), "{what}: metrics");
}

#[test]
fn metric_states_merge_to_the_one_pass_state_for_every_task() {
    let tasks = [Task::Binary, Task::Multiclass { classes: 4 }, Task::Regression];
    for task in tasks {
        // Every metric of the task (AUC curves and ece bins included), and
        // top confusions rather than a matrix past 3 classes.
        let spec = MetricsSpec {
            metrics: Metric::ALL.into_iter().filter(|m| m.applies_to(task)).collect(),
            calibration_bins: 5,
            max_confusion_classes: 3,
            ..MetricsSpec::default()
        };
        for seed in 0..CASES / 4 {
            let mut rng = Rng::new(seed);
            let rows = Rows::draw(&mut rng, task);
            let n = rows.slice.len();
            let what = |law: &str| format!("{task:?}, seed {seed}: {law}");
            let one_pass = rows.state(&spec, 0..n);
            let merged = |a: &MetricState, b: &MetricState| {
                let mut out = a.clone();
                out.merge(b).unwrap_or_else(|e| panic!("{}: {e}", what("merge")));
                out
            };

            let parts = 1 + rng.below(5);
            let mut split = rows.state(&spec, 0..0);
            for range in rng.split(n, parts) {
                let part = MetricState::from_json(&rows.state(&spec, range).to_json()).unwrap();
                split = merged(&split, &part);
            }
            same_state(&split, &one_pass, &what(&format!("{parts} parts merged against one pass")));

            let thirds = rng.split(n, 3);
            let [x, y, z] = [0, 1, 2].map(|i| rows.state(&spec, thirds[i].clone()));
            let empty = rows.state(&spec, 0..0);
            same_state(&merged(&x, &y), &merged(&y, &x), &what("commutative"));
            same_state(&merged(&merged(&x, &y), &z), &merged(&x, &merged(&y, &z)), &what("associative"));
            same_state(&merged(&x, &empty), &x, &what("empty on the right"));
            same_state(&merged(&empty, &x), &x, &what("empty on the left"));
            same_state(&MetricState::from_json(&x.to_json()).unwrap(), &x, &what("JSON round trip"));
        }
    }
}
