//! Whether the scores a classifier is scored on are probabilities. log_loss,
//! brier and ece (and multiclass auc and pr_auc, which sklearn refuses on
//! rows that are not probabilities) read each score as a probability; on
//! logits scored without `--from-logits`, or a regressor's outputs scored as
//! a binary classifier, they print numbers that cannot be right (an ece of
//! 1.62, above its maximum of 1) without a word. So every scored row is
//! checked (a running count, minimum and maximum: nothing allocated per
//! example), and an evaluation whose scores were not all probabilities
//! leaves those metrics out (NaN, `null` in JSON) and says why, with what to
//! do ([`NotProbabilities`]). Metrics that stay right on any score are kept:
//! accuracy and top-k (argmax), precision, recall and f1, binary auc and
//! pr_auc (rankings), mse and mae.
//!
//! The check is part of the metric state ([`ScoreCheck`]) and merges with
//! it, so a `report merge` of data shards says so when any shard saw scores
//! that are not probabilities, as one pass over all the data would have.

use crate::task::{Metric, Task};
use isorun_protocol::DType;
use serde_json::{json, Map, Value};

/// The least tolerance of a row's sum against 1 (relative, so absolute).
pub const ROW_SUM_TOLERANCE: f64 = 1e-3;

/// The spacing of the output's dtype at 1: what rounding its values to the
/// dtype may move them by (integers, like float64, are exact).
fn spacing(dtype: DType) -> f64 {
    match dtype {
        DType::Float16 => f64::from(half::f16::EPSILON.to_f32()),
        DType::BFloat16 => f64::from(half::bf16::EPSILON.to_f32()),
        DType::Float32 => f64::from(f32::EPSILON),
        _ => f64::EPSILON,
    }
}

/// How far a score may lie outside [0, 1], and a row's sum away from 1, for
/// an output of `dtype` and still count as a probability: rounding to the
/// dtype, and a row sum off by [`ROW_SUM_TOLERANCE`] or twice the dtype's
/// spacing (bfloat16 softmaxes are off by a few thousandths).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Tolerance {
    range: f64,
    row_sum: f64,
}

impl Tolerance {
    pub(crate) fn of(dtype: DType) -> Tolerance {
        let spacing = spacing(dtype);
        Tolerance { range: spacing, row_sum: ROW_SUM_TOLERANCE.max(2.0 * spacing) }
    }
}

/// What the scores of the examples scored so far were: how many examples'
/// scores were not probabilities, the least and greatest score, and (a
/// multiclass task) the least and greatest row sum. Regression keeps none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreCheck {
    /// Examples with a score outside [0, 1] or (multiclass) a row that does not sum to 1.
    pub not_probabilities: u64,
    /// The least and greatest score (`+inf`, `-inf` before any).
    pub min: f64,
    pub max: f64,
    /// Multiclass: the least and greatest row sum (`+inf`, `-inf` before any).
    pub row_sum_min: f64,
    pub row_sum_max: f64,
}

impl Default for ScoreCheck {
    fn default() -> ScoreCheck {
        ScoreCheck {
            not_probabilities: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            row_sum_min: f64::INFINITY,
            row_sum_max: f64::NEG_INFINITY,
        }
    }
}

impl ScoreCheck {
    /// Adds one example's scores (after `--from-logits`, when given): one
    /// score of a binary task, or a multiclass row, whose sum is checked.
    pub(crate) fn add(&mut self, scores: &[f64], multiclass: bool, tolerance: Tolerance) {
        let mut outside = false;
        let mut sum = 0.0;
        for &score in scores {
            self.min = self.min.min(score);
            self.max = self.max.max(score);
            outside |= !(-tolerance.range..=1.0 + tolerance.range).contains(&score);
            sum += score;
        }
        if multiclass {
            self.row_sum_min = self.row_sum_min.min(sum);
            self.row_sum_max = self.row_sum_max.max(sum);
            outside |= (sum - 1.0).abs() > tolerance.row_sum;
        }
        self.not_probabilities += u64::from(outside);
    }

    /// The check of both parts of the data.
    pub(crate) fn merge(&mut self, other: &ScoreCheck) -> Result<(), String> {
        self.not_probabilities =
            crate::accumulator::added("not_probabilities", self.not_probabilities, other.not_probabilities)?;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.row_sum_min = self.row_sum_min.min(other.row_sum_min);
        self.row_sum_max = self.row_sum_max.max(other.row_sum_max);
        Ok(())
    }

    /// `{"not_probabilities", "min", "max", "row_sum_min"?, "row_sum_max"?}`;
    /// `None` before any example.
    pub(crate) fn to_json(self) -> Option<Value> {
        if !self.min.is_finite() {
            return None;
        }
        let mut o = Map::new();
        o.insert("not_probabilities".into(), self.not_probabilities.into());
        o.insert("min".into(), json!(self.min));
        o.insert("max".into(), json!(self.max));
        if self.row_sum_min.is_finite() {
            o.insert("row_sum_min".into(), json!(self.row_sum_min));
            o.insert("row_sum_max".into(), json!(self.row_sum_max));
        }
        Some(Value::Object(o))
    }

    /// The check of [`ScoreCheck::to_json`]'s JSON, of a state of
    /// `examples` examples: a file's claim, so its counts and numbers are
    /// checked (finite, ordered, no more examples than the state has).
    pub(crate) fn from_json(value: &Value, examples: u64, multiclass: bool) -> Result<ScoreCheck, String> {
        let number = |key: &str| {
            value[key].as_f64().filter(|x| x.is_finite()).ok_or_else(|| format!("scores: no finite \"{key}\""))
        };
        let not_probabilities = value["not_probabilities"].as_u64().ok_or("scores: no \"not_probabilities\" count")?;
        if not_probabilities > examples {
            return Err(format!("scores: {not_probabilities} examples not probabilities of {examples}"));
        }
        let (min, max) = (number("min")?, number("max")?);
        if min > max {
            return Err(format!("scores: min {min} above max {max}"));
        }
        let (row_sum_min, row_sum_max) = if multiclass {
            (number("row_sum_min")?, number("row_sum_max")?)
        } else {
            (f64::INFINITY, f64::NEG_INFINITY)
        };
        if multiclass && row_sum_min > row_sum_max {
            return Err(format!("scores: row_sum_min {row_sum_min} above row_sum_max {row_sum_max}"));
        }
        Ok(ScoreCheck { not_probabilities, min, max, row_sum_min, row_sum_max })
    }
}

/// Whether a metric reads the scores of `task` as probabilities.
pub fn reads_probabilities(metric: Metric, task: Task) -> bool {
    match task {
        Task::Binary => matches!(metric, Metric::LogLoss | Metric::Brier | Metric::Ece),
        Task::Multiclass { .. } => {
            matches!(metric, Metric::LogLoss | Metric::Brier | Metric::Ece | Metric::Auc | Metric::PrAuc)
        }
        Task::Regression => false,
    }
}

/// An evaluation whose scores were not all probabilities: what they were,
/// and the metrics left out for it.
#[derive(Debug, Clone, PartialEq)]
pub struct NotProbabilities {
    /// Examples whose scores were not probabilities, of `of`.
    pub examples: u64,
    pub of: u64,
    pub min: f64,
    pub max: f64,
    /// Multiclass: the least and greatest row sum.
    pub row_sums: Option<(f64, f64)>,
    /// The metrics computed that read probabilities: NaN in the evaluation.
    pub left_out: Vec<Metric>,
}

impl NotProbabilities {
    /// The finding of a check over `of` examples of `task` computing
    /// `metrics`; `None` when every score was a probability.
    pub(crate) fn of(check: &ScoreCheck, of: u64, task: Task, metrics: &[Metric]) -> Option<NotProbabilities> {
        if check.not_probabilities == 0 || task == Task::Regression {
            return None;
        }
        Some(NotProbabilities {
            examples: check.not_probabilities,
            of,
            min: check.min,
            max: check.max,
            row_sums: check.row_sum_min.is_finite().then_some((check.row_sum_min, check.row_sum_max)),
            left_out: metrics.iter().copied().filter(|m| reads_probabilities(*m, task)).collect(),
        })
    }

    /// What a person reads: what the scores were, what was left out, and
    /// what to do.
    pub fn message(&self, output: &str) -> String {
        let mut text = format!(
            "the scores of output '{output}' are not probabilities: {} of {} examples have scores outside [0, 1]",
            self.examples, self.of
        );
        let range = format!("scores {} to {}", short(self.min), short(self.max));
        match self.row_sums {
            Some((low, high)) => {
                text += &format!(" or rows that do not sum to 1 ({range}, row sums {} to {})", short(low), short(high))
            }
            None => text += &format!(" ({range})"),
        }
        if !self.left_out.is_empty() {
            let names: Vec<&str> = self.left_out.iter().map(Metric::name).collect();
            text += &format!("; {} left out", names.join(", "));
        }
        text += ". If they are logits, pass --from-logits; if the model is a regressor, score it with float labels \
                 (a regression task: mse, mae, rmse)";
        text
    }

    /// `{"examples", "of", "min", "max", "row_sums"?: [low, high], "left_out": [..], "message"}`.
    pub fn to_json(&self, output: &str) -> Value {
        let mut o = Map::new();
        o.insert("examples".into(), self.examples.into());
        o.insert("of".into(), self.of.into());
        o.insert("min".into(), json!(self.min));
        o.insert("max".into(), json!(self.max));
        if let Some((low, high)) = self.row_sums {
            o.insert("row_sums".into(), json!([low, high]));
        }
        o.insert("left_out".into(), json!(self.left_out.iter().map(Metric::name).collect::<Vec<_>>()));
        o.insert("message".into(), self.message(output).into());
        Value::Object(o)
    }
}

/// A number as people read it in a message: 4 significant digits.
fn short(x: f64) -> String {
    let text = format!("{x:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".into()
    } else {
        text.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(rows: &[&[f64]], dtype: DType) -> ScoreCheck {
        let mut check = ScoreCheck::default();
        for row in rows {
            check.add(row, row.len() > 1, Tolerance::of(dtype));
        }
        check
    }

    #[test]
    fn scores_outside_0_1_are_not_probabilities_and_rounding_is_allowed() {
        let check = checked(&[&[0.0], &[1.0], &[0.3], &[-1e-9], &[1.0 + 1e-9]], DType::Float64);
        assert_eq!((check.not_probabilities, check.min, check.max), (2, -1e-9, 1.0 + 1e-9));
        // float32's rounding of a value near 1 is a probability.
        let check = checked(&[&[1.0 + 1e-7], &[-1e-7], &[0.5]], DType::Float32);
        assert_eq!(check.not_probabilities, 0);
        let check = checked(&[&[-2.3], &[0.4], &[1.7]], DType::Float32);
        assert_eq!((check.not_probabilities, check.min, check.max), (2, -2.3, 1.7));
        assert!(!check.row_sum_min.is_finite(), "binary scores keep no row sums");
    }

    #[test]
    fn multiclass_rows_must_sum_to_1_within_the_tolerance() {
        let float32_softmax: &[f64] = &[0.2000001, 0.3, 0.4999999];
        let off_by_a_thousandth: &[f64] = &[0.2, 0.3, 0.5005];
        let sigmoids: &[f64] = &[0.75, 0.5, 0.5];
        let logits: &[f64] = &[-1.0, 2.0, 0.5];
        let check = checked(&[float32_softmax, off_by_a_thousandth], DType::Float32);
        assert_eq!(check.not_probabilities, 0);
        let check = checked(&[&[0.25, 0.25, 0.5], sigmoids, logits], DType::Float32);
        assert_eq!(check.not_probabilities, 2);
        assert_eq!((check.row_sum_min, check.row_sum_max), (1.0, 1.75));
        // A bfloat16 softmax is off by more than a thousandth and is still one.
        let bfloat16_softmax: &[f64] = &[0.19921875, 0.30078125, 0.50390625];
        assert_eq!(checked(&[bfloat16_softmax], DType::BFloat16).not_probabilities, 0);
        assert_eq!(checked(&[bfloat16_softmax], DType::Float32).not_probabilities, 1);
    }

    #[test]
    fn checks_of_any_split_merge_to_the_check_of_all() {
        let rows: [&[f64]; 4] = [&[0.1, 0.9], &[0.5, 0.5], &[-1.0, 3.0], &[0.7, 0.3]];
        let whole = checked(&rows, DType::Float32);
        let mut first = checked(&rows[..1], DType::Float32);
        first.merge(&checked(&rows[1..3], DType::Float32)).unwrap();
        first.merge(&checked(&rows[3..], DType::Float32)).unwrap();
        first.merge(&ScoreCheck::default()).unwrap();
        assert_eq!(first, whole);
        let json = whole.to_json().unwrap();
        assert_eq!(ScoreCheck::from_json(&json, 4, true).unwrap(), whole);
        assert_eq!(ScoreCheck::default().to_json(), None);
    }

    #[test]
    fn a_check_read_from_a_file_is_checked() {
        let json = json!({"not_probabilities": 5, "min": 0.0, "max": 1.0});
        assert!(ScoreCheck::from_json(&json, 4, false).unwrap_err().contains("5 examples"));
        let json = json!({"not_probabilities": 1, "min": 2.0, "max": 1.0});
        assert!(ScoreCheck::from_json(&json, 4, false).unwrap_err().contains("above"));
        let json = json!({"not_probabilities": 1, "min": 0.0, "max": 1.0});
        assert!(ScoreCheck::from_json(&json, 4, true).unwrap_err().contains("row_sum_min"));
        // A binary check keeps no row sums, and reads back as it was.
        let binary = checked(&[&[0.25], &[1.5]], DType::Float32);
        assert_eq!(ScoreCheck::from_json(&binary.to_json().unwrap(), 2, false).unwrap(), binary);
    }

    #[test]
    fn the_message_says_what_the_scores_were_and_what_to_do() {
        let check = checked(&[&[-1.25, 2.0, 0.5], &[0.2, 0.3, 0.5]], DType::Float32);
        let metrics = [Metric::Accuracy, Metric::LogLoss, Metric::Auc, Metric::Ece];
        let found = NotProbabilities::of(&check, 2, Task::Multiclass { classes: 3 }, &metrics).unwrap();
        assert_eq!(found.left_out, [Metric::LogLoss, Metric::Auc, Metric::Ece]);
        assert_eq!(
            found.message("logits"),
            "the scores of output 'logits' are not probabilities: 1 of 2 examples have scores outside [0, 1] or \
             rows that do not sum to 1 (scores -1.25 to 2, row sums 1 to 1.25); log_loss, auc, ece left out. If \
             they are logits, pass --from-logits; if the model is a regressor, score it with float labels (a \
             regression task: mse, mae, rmse)"
        );
        // Binary auc ranks the scores: right on any.
        let found = NotProbabilities::of(&check, 2, Task::Binary, &metrics).unwrap();
        assert_eq!(found.left_out, [Metric::LogLoss, Metric::Ece]);
        assert_eq!(NotProbabilities::of(&check, 2, Task::Regression, &metrics), None);
        assert_eq!(NotProbabilities::of(&ScoreCheck::default(), 2, Task::Binary, &metrics), None);
    }

    use crate::bootstrap::Bootstrap;
    use crate::data::{Labels, Targets};
    use crate::metrics::{Evaluation, Evaluator, MetricsSpec};
    use crate::replicates::{CiSpec, KeyedBy};
    use crate::state::MetricState;
    use isorun_protocol::{SignatureInfo, Tensor, TensorSpec};

    /// A model's signature with one float32 output of `columns` columns.
    fn signature(columns: Option<u64>) -> SignatureInfo {
        let shape = match columns {
            Some(c) => vec![None, Some(c)],
            None => vec![None],
        };
        SignatureInfo {
            key: "serving_default".into(),
            inputs: vec![],
            outputs: vec![TensorSpec { name: "logits".into(), dtype: DType::Float32, shape: Some(shape) }],
        }
    }

    /// One batch: float32 `scores`, `columns` per example, integer labels, a slice `half`.
    fn batch(scores: &[f32], columns: usize, labels: &[i64]) -> (Vec<(String, Tensor)>, Targets) {
        let shape = if columns == 1 { vec![labels.len() as u64] } else { vec![labels.len() as u64, columns as u64] };
        let bytes = scores.iter().flat_map(|v| v.to_le_bytes()).collect();
        let targets = Targets {
            rows: labels.len(),
            labels: Labels::Int(labels.to_vec()),
            weights: None,
            slices: vec![("half".into(), (0..labels.len()).map(|i| (i % 2).to_string()).collect())],
            first_index: 0,
            keys: None,
        };
        (vec![("logits".into(), Tensor::dense(DType::Float32, shape, bytes))], targets)
    }

    fn evaluate(spec: &MetricsSpec, columns: Option<u64>, scores: &[f32], labels: &[i64]) -> Evaluation {
        let ci = CiSpec { bootstrap: Bootstrap { replicates: 20, seed: 0 }, level: 0.95, by: KeyedBy::Index };
        let mut evaluator = Evaluator::new(spec, &signature(columns), &["half".to_string()]).unwrap().with_ci(ci);
        let (outputs, targets) = batch(scores, columns.unwrap_or(1) as usize, labels);
        evaluator.update(&outputs, &targets).unwrap();
        evaluator.finish()
    }

    const LOGITS: [f32; 18] =
        [2.0, -1.0, 0.5, -0.3, 1.2, -2.0, 0.1, 0.2, 3.0, 1.5, 1.4, -0.5, -1.0, -2.0, 0.4, 0.3, 2.2, -0.7];
    const CLASSES: [i64; 6] = [0, 1, 2, 1, 2, 1];

    #[test]
    fn logits_scored_as_probabilities_leave_out_the_metrics_that_read_them_and_say_why() {
        use Metric::*;
        let metrics = vec![Accuracy, TopKAccuracy, LogLoss, Brier, Ece, Auc, F1];
        let spec = MetricsSpec { metrics, top_k: 2, ..MetricsSpec::default() };
        let logits = evaluate(&spec, Some(3), &LOGITS, &CLASSES);
        let softmaxed = evaluate(&MetricsSpec { from_logits: true, ..spec }, Some(3), &LOGITS, &CLASSES);
        assert_eq!(softmaxed.not_probabilities, None);
        assert!(softmaxed.metrics.values().all(|v| v.is_finite()), "{:?}", softmaxed.metrics);
        let found = logits.not_probabilities.clone().expect("logits are not probabilities");
        assert_eq!((found.examples, found.of, found.min, found.max), (6, 6, -2.0, 3.0));
        assert_eq!(found.left_out, [LogLoss, Brier, Ece, Auc]);
        // The metrics that read probabilities are left out everywhere; the others are those of the softmax.
        for (name, value) in &logits.metrics {
            match found.left_out.iter().any(|m| m.name() == name) {
                true => assert!(value.is_nan(), "{name} is {value}"),
                false => assert_eq!(*value, softmaxed.metrics[name], "{name}"),
            }
        }
        for slice in logits.slices["half"].values() {
            assert!(found.left_out.iter().all(|m| slice[m.name()].is_nan()), "{slice:?}");
            assert!(slice["accuracy"].is_finite());
        }
        let ci = logits.ci.as_ref().unwrap();
        let intervals = std::iter::once(&ci.overall).chain(ci.slices["half"].values());
        for (metric, intervals) in found.left_out.iter().flat_map(|m| intervals.clone().map(move |i| (m, i))) {
            assert!(!intervals.contains_key(metric.name()), "{metric}: {intervals:?}");
            assert!(!ci.values.contains_key(metric.name()), "{metric}");
        }
        assert!(ci.overall["accuracy"].is_some());
        assert_eq!(logits.calibration, None, "no reliability diagram of scores that are not probabilities");
        let json = logits.to_json();
        assert_eq!(json["metrics"]["log_loss"], Value::Null, "{json}");
        assert_eq!(json["not_probabilities"]["left_out"], json!(["log_loss", "brier", "ece", "auc"]));
        let row_sums = json["not_probabilities"]["row_sums"].as_array().unwrap();
        assert!((row_sums[0].as_f64().unwrap() + 2.6).abs() < 1e-6, "{row_sums:?}");
        assert!((row_sums[1].as_f64().unwrap() - 3.3).abs() < 1e-6, "{row_sums:?}");
        assert!(json["not_probabilities"]["message"].as_str().unwrap().contains("pass --from-logits"), "{json}");
    }

    #[test]
    fn a_regressor_scored_as_a_binary_classifier_keeps_its_ranking_and_error_metrics() {
        use Metric::*;
        let spec = MetricsSpec { metrics: vec![Accuracy, Auc, LogLoss, Ece, Brier, Mse], ..MetricsSpec::default() };
        let evaluation = evaluate(&spec, None, &[0.25, 1.75, -0.5, 2.5, 0.875, 1.125], &[0, 1, 0, 1, 1, 0]);
        let found = evaluation.not_probabilities.clone().unwrap();
        assert_eq!((found.examples, found.min, found.max, found.row_sums), (4, -0.5, 2.5, None));
        assert_eq!(found.left_out, [LogLoss, Ece, Brier]);
        // auc ranks the scores; mse is the regressor's own error: both stay.
        assert!(evaluation.metrics["auc"].is_finite() && evaluation.metrics["mse"].is_finite());
        assert!(evaluation.metrics["ece"].is_nan());
    }

    /// One shard that saw scores that are not probabilities makes the merged
    /// state say so, in any order, as one pass over all of it does.
    #[test]
    fn a_shard_that_saw_scores_that_are_not_probabilities_makes_the_merge_say_so() {
        let spec = MetricsSpec { metrics: vec![Metric::Accuracy, Metric::LogLoss], ..MetricsSpec::default() };
        let scores = [0.1, 0.8, 0.3, 0.9, 1.6, 0.2];
        let labels = [0, 1, 0, 1, 1, 0];
        let state_of = |scores: &[f32], labels: &[i64]| {
            let mut evaluator = Evaluator::new(&spec, &signature(None), &["half".to_string()]).unwrap();
            let (outputs, targets) = batch(scores, 1, labels);
            evaluator.update(&outputs, &targets).unwrap();
            // Through JSON, as a shard's record carries it.
            MetricState::from_json(&evaluator.state().to_json()).unwrap()
        };
        let one_pass = Evaluation::from_state(&state_of(&scores, &labels));
        let (clean, unclean) = (state_of(&scores[..4], &labels[..4]), state_of(&scores[4..], &labels[4..]));
        for (first, second) in [(&clean, &unclean), (&unclean, &clean)] {
            let mut merged = first.clone();
            merged.merge(second).unwrap();
            let merged = Evaluation::from_state(&merged);
            assert_eq!(merged.not_probabilities, one_pass.not_probabilities);
            assert!(merged.metrics["log_loss"].is_nan() && merged.metrics["accuracy"] == one_pass.metrics["accuracy"]);
        }
        assert_eq!(one_pass.not_probabilities.as_ref().map(|n| (n.examples, n.of)), Some((1, 6)));
        let mut both_clean = clean.clone();
        both_clean.merge(&clean).unwrap();
        assert_eq!(Evaluation::from_state(&both_clean).not_probabilities, None);
        // A state written before the check knows nothing of its scores: it adds no finding.
        let mut old = clean.to_json();
        old.as_object_mut().unwrap().remove("scores");
        let old = MetricState::from_json(&old).unwrap();
        assert_eq!(Evaluation::from_state(&old).not_probabilities, None);
    }
}
