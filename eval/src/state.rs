//! The metric state of one model over some examples: everything the
//! metrics are computed from (counts, sums, confusion counts, per-score
//! positive and negative weights for AUC, per-slice states), and nothing
//! else. It is what `isorun eval --data-shard K/N` writes into a record and
//! what `isorun report merge` joins: [`MetricState::merge`] of the states of
//! any split of the data, finished with `Evaluation::from_state`, gives the
//! metrics of one pass over all of it.
//!
//! Exactness: counts are integers; every sum of weights, losses and errors
//! is an `ExactSum` (exact whatever the order of its terms; the terms are
//! per-example values, computed the same way on any machine), so those
//! metrics are the same to the last bit. AUC and average precision keep the
//! weight of positives and negatives per distinct score: unweighted, those
//! are exact integer counts and the merged AUC is the one-pass AUC exactly;
//! with `--weight`, a score's weights are plain sums (each score's few
//! examples, rounded in another order: ~1e-16 relative). A curve past its
//! cap is bucketed, here as in one pass (`auc_exact: false`, and `exact` in
//! the state's JSON). Slices past [`MAX_SLICE_VALUES`] values: which values
//! get their own state depends on the order the values came in, and merged
//! shards see them in shard order.
//!
//! The JSON ([`MetricState::to_json`]) is versioned ([`STATE_VERSION`]) and
//! compact: zero sums are left out, a sum is a number (or its exact
//! partials, a list, when one number cannot hold it). Its size is bounded by
//! the caps: an exact curve is at most [`AUC_EXACT_CAP`] scores (~40 bytes
//! each, ~10 MB), a slice value's at most [`SLICE_AUC_CAP`]; `ece`'s
//! reliability bins are 4 numbers per bin (`--calibration-bins`, ≤ 10,000)
//! per state; past `max_confusion_classes` the top confusions are at most
//! `TOP_CONFUSION_ENTRIES` triples (~0.4 MB), and the settings
//! `calibration_bins` and `max_confusion_classes` (absent in older states:
//! the defaults) must agree for states to merge. A classifier's state keeps
//! the check of its scores (`scores`, see `crate::probabilities`; absent in
//! older states: nothing known), merged with the rest, so merged shards say
//! what one pass says of scores that are not probabilities.
//!
//! Read back ([`MetricState::from_json`]), a state is a file's claim (a
//! shard report's): no size is taken from it that its data does not back.
//! A multiclass state's classes (at most [`MAX_CLASSES`]) must be the length
//! of its per-class sums, replicate lists the lengths their counts say
//! (checked before anything is allocated), a curve at most the buckets eval
//! makes for its place (and holding only the buckets it gives counts for,
//! `crate::curve`), a slice feature at most [`MAX_SLICE_VALUES`] values,
//! curves only where eval keeps them (not on a multiclass state's slices);
//! and counts summed by [`MetricState::merge`] are checked, an overflow an
//! error rather than a wrap.

use crate::calibration::Calibration;
use crate::confusion::TopConfusions;
use crate::curve::Curve;
use crate::exact::{two_product, ExactSum};
use crate::probabilities::ScoreCheck;
use crate::replicates::Replicates;
use crate::task::{Metric, Task};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};

/// The slice value that collects values past [`MAX_SLICE_VALUES`].
pub const OTHER_SLICE: &str = "__other__";
/// Distinct values kept per slice feature.
pub const MAX_SLICE_VALUES: usize = 1000;
/// Distinct scores kept exactly, over all classes, before AUC is bucketed.
pub const AUC_EXACT_CAP: usize = 1 << 18;
/// Buckets of a bucketed AUC.
pub const AUC_BUCKETS: usize = 1 << 16;
/// Distinct scores (and then buckets) per slice value.
pub const SLICE_AUC_CAP: usize = 1 << 10;
/// The most classes a confusion matrix is kept for (classes² counts) when
/// `--max-confusion-classes` is not given; past them, the top confusions.
pub const MAX_CONFUSION_CLASSES: usize = 1000;
/// The version of the state's JSON; another version is refused.
pub const STATE_VERSION: u64 = 1;
/// The most classes a state read from JSON may have. A state's JSON is
/// untrusted (a shard report), and what is allocated for it grows with its
/// classes (three sums per class per bootstrap replicate): the class count
/// must be backed by that many per-class sums in the JSON itself, and may
/// never pass this bound, far past any classifier eval has met.
pub const MAX_CLASSES: usize = 1 << 20;

/// The exact-score cap and bucket count of the overall state's AUC curves
/// (one per class, or one): `AUC_EXACT_CAP` distinct scores and
/// `AUC_BUCKETS × 16` buckets shared out over the curves, within bounds.
pub(crate) fn overall_curve_sizes(curve_count: usize) -> (usize, usize) {
    let curve_count = curve_count.max(1);
    let cap = (AUC_EXACT_CAP / curve_count).max(1 << 12);
    let buckets = (AUC_BUCKETS * 16 / curve_count).clamp(1 << 10, AUC_BUCKETS);
    (cap, buckets)
}

/// Metric state of one task over some examples.
#[derive(Debug, Clone)]
pub(crate) enum State {
    Binary(BinaryState),
    Multiclass(MulticlassState),
    Regression(RegressionState),
}

/// The sums every task keeps (multiclass: examples, weight and log loss).
#[derive(Debug, Clone, Default)]
pub(crate) struct Sums {
    pub(crate) examples: u64,
    pub(crate) weight: ExactSum,
    pub(crate) log_loss: ExactSum,
    /// Σ w·p.
    prediction: ExactSum,
    /// Σ w·y and Σ w·y², exactly (the products too), for mean_label and r2.
    label: ExactSum,
    label_squared: ExactSum,
    squared_error: ExactSum,
    absolute_error: ExactSum,
}

const SUM_NAMES: [&str; 7] =
    ["weight", "log_loss", "prediction", "label", "label_squared", "squared_error", "absolute_error"];

impl Sums {
    fn fields(&self) -> [&ExactSum; 7] {
        [
            &self.weight,
            &self.log_loss,
            &self.prediction,
            &self.label,
            &self.label_squared,
            &self.squared_error,
            &self.absolute_error,
        ]
    }

    fn fields_mut(&mut self) -> [&mut ExactSum; 7] {
        [
            &mut self.weight,
            &mut self.log_loss,
            &mut self.prediction,
            &mut self.label,
            &mut self.label_squared,
            &mut self.squared_error,
            &mut self.absolute_error,
        ]
    }

    fn add(&mut self, prediction: f64, label: f64, weight: f64) {
        self.examples += 1;
        self.weight.add(weight);
        self.prediction.add(weight * prediction);
        let (wy, wy_low) = two_product(weight, label);
        self.label.add(wy);
        self.label.add(wy_low);
        for (high, low) in [two_product(wy, label), two_product(wy_low, label)] {
            self.label_squared.add(high);
            self.label_squared.add(low);
        }
        let error = prediction - label;
        self.squared_error.add(weight * error * error);
        self.absolute_error.add(weight * error.abs());
    }

    fn merge(&mut self, other: &Sums) -> Result<(), String> {
        self.examples = added("examples", self.examples, other.examples)?;
        for (mine, theirs) in self.fields_mut().into_iter().zip(other.fields()) {
            mine.merge(theirs);
        }
        Ok(())
    }

    /// sklearn's r2_score: 1 − SS_res/SS_tot, SS_tot = Σw·y² − (Σw·y)²/Σw
    /// from exact sums in double-double (no cancellation left to round).
    fn r2(&self) -> f64 {
        let (w, s1, s2) = (self.weight.dd(), self.label.dd(), self.label_squared.dd());
        let total = s2.add(s1.mul(s1).div(w).neg());
        // What double-double leaves of an exact 0 (every label equal) is 0.
        let total = if total.0.abs() <= 1e-30 * s2.0.abs() { 0.0 } else { total.value() };
        let residual = self.squared_error.value();
        if total == 0.0 {
            return if residual == 0.0 { 1.0 } else { 0.0 };
        }
        1.0 - residual / total
    }
}

#[derive(Debug, Clone)]
pub(crate) struct BinaryState {
    sums: Sums,
    tp: ExactSum,
    fp: ExactSum,
    tn: ExactSum,
    fn_: ExactSum,
    curve: Option<Curve>,
    /// Reliability bins, with `ece`.
    calibration: Option<Calibration>,
}

#[derive(Debug, Clone)]
pub(crate) struct MulticlassState {
    sums: Sums,
    correct: ExactSum,
    top_k: ExactSum,
    tp: Vec<ExactSum>,
    fp: Vec<ExactSum>,
    fn_: Vec<ExactSum>,
    present: Vec<bool>,
    curves: Option<Vec<Curve>>,
    /// Σ w·Σ_c (p_c − y_c)² (halved for 2 classes, as sklearn's brier_score_loss).
    brier: ExactSum,
    /// Reliability bins, with `ece`.
    calibration: Option<Calibration>,
}

#[derive(Debug, Clone)]
pub(crate) struct RegressionState {
    sums: Sums,
}

/// `a + b` for counts summed while merging, or why not: a state's counts
/// come from files, and a sum past `u64::MAX` must be an error, not wrap.
pub(crate) fn added(what: &str, a: u64, b: u64) -> Result<u64, String> {
    a.checked_add(b).ok_or_else(|| format!("the summed {what} overflow a 64-bit count ({a} + {b})"))
}

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

fn divide(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        f64::NAN
    } else {
        a / b
    }
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.filter(|v| !v.is_nan()).fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

/// One example as every state needs it.
pub(crate) struct Row<'a> {
    /// Probabilities (after sigmoid/softmax); binary and regression: one value.
    pub(crate) scores: &'a [f64],
    /// Binary/regression label.
    pub(crate) label: f64,
    /// Multiclass true class and predicted class.
    pub(crate) class: usize,
    pub(crate) predicted: usize,
    /// Multiclass `Matrix` labels.
    pub(crate) soft_label: Option<&'a [f64]>,
    pub(crate) weight: f64,
}

/// A multiclass row's log loss: against its soft (one-hot or multi-value)
/// label, else its class; probabilities clipped to [eps, 1 − eps]. The one
/// definition the state and its bootstrap replicates share.
pub(crate) fn multiclass_log_loss(row: &Row, eps: f64) -> f64 {
    let scores = row.scores;
    match row.soft_label {
        Some(soft) => {
            soft.iter().zip(scores).filter(|(y, _)| **y != 0.0).map(|(y, p)| -y * p.clamp(eps, 1.0 - eps).ln()).sum()
        }
        None => -scores[row.class].clamp(eps, 1.0 - eps).ln(),
    }
}

impl State {
    pub(crate) fn new(task: Task, curves: Option<(usize, usize)>) -> State {
        match task {
            Task::Binary => State::Binary(BinaryState {
                sums: Sums::default(),
                tp: ExactSum::default(),
                fp: ExactSum::default(),
                tn: ExactSum::default(),
                fn_: ExactSum::default(),
                curve: curves.map(|(cap, buckets)| Curve::new(cap, buckets)),
                calibration: None,
            }),
            Task::Multiclass { classes } => State::Multiclass(MulticlassState {
                sums: Sums::default(),
                correct: ExactSum::default(),
                top_k: ExactSum::default(),
                tp: vec![ExactSum::default(); classes],
                fp: vec![ExactSum::default(); classes],
                fn_: vec![ExactSum::default(); classes],
                present: vec![false; classes],
                curves: curves.map(|(cap, buckets)| (0..classes).map(|_| Curve::new(cap, buckets)).collect()),
                brier: ExactSum::default(),
                calibration: None,
            }),
            Task::Regression => State::Regression(RegressionState { sums: Sums::default() }),
        }
    }

    /// The state with reliability bins (`ece`): `bins` of them, or none.
    pub(crate) fn with_calibration(mut self, bins: Option<usize>) -> State {
        match &mut self {
            State::Binary(s) => s.calibration = bins.map(Calibration::new),
            State::Multiclass(s) => s.calibration = bins.map(Calibration::new),
            State::Regression(_) => {}
        }
        self
    }

    pub(crate) fn add(&mut self, row: &Row<'_>, threshold: f64, top_k: usize, eps: f64) {
        match self {
            State::Binary(s) => {
                let p = row.scores[0];
                let positive = row.label == 1.0;
                let predicted = p > threshold;
                match (positive, predicted) {
                    (true, true) => s.tp.add(row.weight),
                    (false, true) => s.fp.add(row.weight),
                    (false, false) => s.tn.add(row.weight),
                    (true, false) => s.fn_.add(row.weight),
                }
                let q = if positive { p } else { 1.0 - p };
                s.sums.log_loss.add(-row.weight * q.clamp(eps, 1.0 - eps).ln());
                s.sums.add(p, row.label, row.weight);
                if let Some(curve) = &mut s.curve {
                    curve.add(p, positive, row.weight);
                }
                if let Some(calibration) = &mut s.calibration {
                    let confidence = if predicted { p } else { 1.0 - p };
                    calibration.add(confidence, predicted == positive, row.weight);
                }
            }
            State::Multiclass(s) => {
                let class = row.class;
                let scores = row.scores;
                s.sums.examples += 1;
                s.sums.weight.add(row.weight);
                if row.predicted == class {
                    s.correct.add(row.weight);
                    s.tp[class].add(row.weight);
                } else {
                    s.fn_[class].add(row.weight);
                    s.fp[row.predicted].add(row.weight);
                }
                s.present[class] = true;
                s.present[row.predicted] = true;
                let higher = scores.iter().filter(|&&v| v > scores[class]).count();
                if higher < top_k {
                    s.top_k.add(row.weight);
                }
                s.sums.log_loss.add(row.weight * multiclass_log_loss(row, eps));
                let squares: f64 = match row.soft_label {
                    Some(soft) => soft.iter().zip(scores).map(|(y, p)| (p - y) * (p - y)).sum(),
                    None => scores
                        .iter()
                        .enumerate()
                        .map(|(c, p)| {
                            let e = p - f64::from(u8::from(c == class));
                            e * e
                        })
                        .sum(),
                };
                let squares = if scores.len() == 2 { squares / 2.0 } else { squares };
                s.brier.add(row.weight * squares);
                if let Some(calibration) = &mut s.calibration {
                    calibration.add(scores[row.predicted], row.predicted == class, row.weight);
                }
                if let Some(curves) = &mut s.curves {
                    for (c, curve) in curves.iter_mut().enumerate() {
                        curve.add(scores[c], c == class, row.weight);
                    }
                }
            }
            State::Regression(s) => s.sums.add(row.scores[0], row.label, row.weight),
        }
    }

    /// The reliability bins, when `ece` is computed.
    pub(crate) fn calibration(&self) -> Option<&Calibration> {
        match self {
            State::Binary(s) => s.calibration.as_ref(),
            State::Multiclass(s) => s.calibration.as_ref(),
            State::Regression(_) => None,
        }
    }

    /// A bootstrap replicate's state from its plain sums
    /// (`crate::replicates`): `values` are the 7 sums of `SUM_NAMES`, then
    /// binary tp, fp, tn, fn; multiclass correct, top_k, then tp, fp and fn
    /// per class. `present`: multiclass, the classes seen.
    pub(crate) fn from_plain(
        task: Task,
        examples: u64,
        values: &[f64],
        present: &[bool],
        curves: Option<Vec<Curve>>,
    ) -> State {
        let sum = |x: f64| ExactSum::from_parts(&[x], 0.0);
        let mut sums = Sums { examples, ..Sums::default() };
        for (field, &x) in sums.fields_mut().into_iter().zip(values) {
            *field = sum(x);
        }
        let rest = &values[SUM_NAMES.len()..];
        match task {
            Task::Binary => State::Binary(BinaryState {
                sums,
                tp: sum(rest[0]),
                fp: sum(rest[1]),
                tn: sum(rest[2]),
                fn_: sum(rest[3]),
                curve: curves.and_then(|c| c.into_iter().next()),
                // Not kept per replicate: ece has no interval.
                calibration: None,
            }),
            Task::Multiclass { classes } => {
                let per_class =
                    |k: usize| rest[2 + k * classes..2 + (k + 1) * classes].iter().map(|x| sum(*x)).collect();
                State::Multiclass(MulticlassState {
                    sums,
                    correct: sum(rest[0]),
                    top_k: sum(rest[1]),
                    tp: per_class(0),
                    fp: per_class(1),
                    fn_: per_class(2),
                    present: present.to_vec(),
                    curves,
                    // Not kept per replicate: a multiclass brier or ece has no
                    // interval (NaN replicates: `ci` is null), never a wrong one.
                    brier: sum(f64::NAN),
                    calibration: None,
                })
            }
            Task::Regression => State::Regression(RegressionState { sums }),
        }
    }

    pub(crate) fn exact(&self) -> bool {
        match self {
            State::Binary(s) => s.curve.as_ref().is_none_or(Curve::exact),
            State::Multiclass(s) => s.curves.iter().flatten().all(Curve::exact),
            State::Regression(_) => true,
        }
    }

    fn sums(&self) -> &Sums {
        match self {
            State::Binary(s) => &s.sums,
            State::Multiclass(s) => &s.sums,
            State::Regression(s) => &s.sums,
        }
    }

    pub(crate) fn value(&self, metric: Metric) -> f64 {
        let sums = self.sums();
        let w = sums.weight.value();
        match (self, metric) {
            (_, Metric::LogLoss) => divide(sums.log_loss.value(), w),
            (_, Metric::Mse) => divide(sums.squared_error.value(), w),
            (_, Metric::Rmse) => divide(sums.squared_error.value(), w).sqrt(),
            (_, Metric::Mae) => divide(sums.absolute_error.value(), w),
            (_, Metric::MeanPrediction) => divide(sums.prediction.value(), w),
            (_, Metric::MeanLabel) => divide(sums.label.value(), w),
            (_, Metric::Calibration) => divide(sums.prediction.value(), sums.label.value()),
            (_, Metric::R2) => sums.r2(),
            (State::Binary(s), Metric::Accuracy) => {
                let mut right = s.tp.clone();
                right.merge(&s.tn);
                divide(right.value(), w)
            }
            (State::Binary(s), Metric::Precision) => {
                let tp = s.tp.value();
                ratio(tp, tp + s.fp.value())
            }
            (State::Binary(s), Metric::Recall) => {
                let tp = s.tp.value();
                ratio(tp, tp + s.fn_.value())
            }
            (State::Binary(s), Metric::F1) => {
                let tp = s.tp.value();
                ratio(2.0 * tp, 2.0 * tp + s.fp.value() + s.fn_.value())
            }
            (State::Binary(_), Metric::Brier) => divide(sums.squared_error.value(), w),
            (State::Multiclass(s), Metric::Brier) => divide(s.brier.value(), w),
            (State::Binary(s), Metric::Ece) => s.calibration.as_ref().map_or(f64::NAN, Calibration::ece),
            (State::Multiclass(s), Metric::Ece) => s.calibration.as_ref().map_or(f64::NAN, Calibration::ece),
            (State::Binary(s), Metric::Auc) => s.curve.as_ref().map_or(f64::NAN, Curve::roc_auc),
            (State::Binary(s), Metric::PrAuc) => s.curve.as_ref().map_or(f64::NAN, Curve::average_precision),
            (State::Multiclass(s), Metric::Accuracy) => divide(s.correct.value(), w),
            (State::Multiclass(s), Metric::TopKAccuracy) => divide(s.top_k.value(), w),
            (State::Multiclass(s), Metric::Precision) => {
                s.macro_average(|c| ratio(s.tp[c].value(), s.tp[c].value() + s.fp[c].value()))
            }
            (State::Multiclass(s), Metric::Recall) => {
                s.macro_average(|c| ratio(s.tp[c].value(), s.tp[c].value() + s.fn_[c].value()))
            }
            (State::Multiclass(s), Metric::F1) => s.macro_average(|c| {
                let tp = s.tp[c].value();
                ratio(2.0 * tp, 2.0 * tp + s.fp[c].value() + s.fn_[c].value())
            }),
            (State::Multiclass(s), Metric::Auc) => {
                s.curves.as_ref().map_or(f64::NAN, |c| mean(c.iter().map(Curve::roc_auc)))
            }
            (State::Multiclass(s), Metric::PrAuc) => {
                s.curves.as_ref().map_or(f64::NAN, |c| mean(c.iter().map(Curve::average_precision)))
            }
            _ => f64::NAN,
        }
    }

    pub(crate) fn examples(&self) -> u64 {
        self.sums().examples
    }

    /// Adds `other`, a state of the same task over other examples.
    fn merge(&mut self, other: &State) -> Result<(), String> {
        match (self, other) {
            (State::Binary(a), State::Binary(b)) => {
                a.sums.merge(&b.sums)?;
                for (x, y) in [(&mut a.tp, &b.tp), (&mut a.fp, &b.fp), (&mut a.tn, &b.tn), (&mut a.fn_, &b.fn_)] {
                    x.merge(y);
                }
                merge_calibration(&mut a.calibration, b.calibration.as_ref())?;
                merge_curve(&mut a.curve, b.curve.as_ref())
            }
            (State::Multiclass(a), State::Multiclass(b)) => {
                if a.tp.len() != b.tp.len() {
                    return Err(format!("{} classes against {}", a.tp.len(), b.tp.len()));
                }
                a.sums.merge(&b.sums)?;
                a.correct.merge(&b.correct);
                a.top_k.merge(&b.top_k);
                for (x, y) in [(&mut a.tp, &b.tp), (&mut a.fp, &b.fp), (&mut a.fn_, &b.fn_)] {
                    x.iter_mut().zip(y).for_each(|(x, y)| x.merge(y));
                }
                a.present.iter_mut().zip(&b.present).for_each(|(x, y)| *x |= *y);
                a.brier.merge(&b.brier);
                merge_calibration(&mut a.calibration, b.calibration.as_ref())?;
                match (&mut a.curves, &b.curves) {
                    (Some(x), Some(y)) => x.iter_mut().zip(y).for_each(|(x, y)| x.merge(y)),
                    (None, None) => {}
                    _ => return Err("one has AUC curves and the other not".into()),
                }
                Ok(())
            }
            (State::Regression(a), State::Regression(b)) => a.sums.merge(&b.sums),
            _ => Err("states of different tasks".into()),
        }
    }
}

fn merge_calibration(mine: &mut Option<Calibration>, theirs: Option<&Calibration>) -> Result<(), String> {
    match (mine, theirs) {
        (Some(a), Some(b)) => a.merge(b),
        (None, None) => Ok(()),
        _ => Err("one has calibration bins and the other not".into()),
    }
}

fn merge_curve(mine: &mut Option<Curve>, theirs: Option<&Curve>) -> Result<(), String> {
    match (mine, theirs) {
        (Some(a), Some(b)) => {
            a.merge(b);
            Ok(())
        }
        (None, None) => Ok(()),
        _ => Err("one has an AUC curve and the other not".into()),
    }
}

impl MulticlassState {
    fn macro_average(&self, per_class: impl Fn(usize) -> f64) -> f64 {
        mean((0..self.present.len()).filter(|&c| self.present[c]).map(per_class))
    }
}

/// One slice feature's states.
#[derive(Debug, Clone, Default)]
pub(crate) struct SliceStates {
    pub(crate) values: HashMap<String, State>,
    pub(crate) other: Option<State>,
}

impl SliceStates {
    /// Values of `other` join this feature's states: the same value's state,
    /// a new one while fewer than [`MAX_SLICE_VALUES`], else `__other__`.
    fn merge(&mut self, other: &SliceStates) -> Result<(), String> {
        let mut values: Vec<(&String, &State)> = other.values.iter().collect();
        values.sort_by(|a, b| a.0.cmp(b.0));
        for (value, state) in values.into_iter().map(|(v, s)| (Some(v), s)).chain(other.other.iter().map(|s| (None, s)))
        {
            let target = match value {
                Some(value) if self.values.contains_key(value) => self.values.get_mut(value),
                Some(value) if self.values.len() < MAX_SLICE_VALUES => {
                    self.values.insert(value.clone(), state.clone());
                    continue;
                }
                _ => None,
            };
            match (target, &mut self.other) {
                (Some(mine), _) => mine.merge(state)?,
                (None, Some(mine)) => mine.merge(state)?,
                (None, other @ None) => *other = Some(state.clone()),
            }
        }
        Ok(())
    }
}

/// Everything one model's metrics are computed from, over the examples seen
/// so far: [`crate::Evaluator::state`], merged with [`MetricState::merge`],
/// finished with [`crate::Evaluation::from_state`].
#[derive(Debug, Clone)]
pub struct MetricState {
    pub(crate) output: String,
    /// The output's declared columns, to guess the task of no examples.
    pub(crate) output_columns: Option<u64>,
    /// The metrics asked for (empty: the task's default).
    pub(crate) requested: Vec<Metric>,
    pub(crate) top_k: usize,
    pub(crate) threshold: f64,
    pub(crate) from_logits: bool,
    pub(crate) slice_names: Vec<String>,
    /// Decided at the first batch; `None` before any.
    pub(crate) task: Option<Task>,
    /// The metrics computed (`requested`, or the task's default).
    pub(crate) metrics: Vec<Metric>,
    pub(crate) overall: Option<State>,
    pub(crate) slices: Vec<SliceStates>,
    pub(crate) confusion: Option<Vec<Vec<u64>>>,
    /// Bins of `ece` (`--calibration-bins`).
    pub(crate) calibration_bins: usize,
    /// Classes up to which the full confusion matrix is kept (`--max-confusion-classes`).
    pub(crate) max_confusion_classes: usize,
    /// Past them: the top confusions.
    pub(crate) top_confusions: Option<TopConfusions>,
    pub(crate) examples: u64,
    /// `--ci`: the bootstrap replicates (`crate::replicates`).
    pub(crate) replicates: Option<Replicates>,
    /// Whether the classifier's scores were probabilities (`crate::probabilities`).
    pub(crate) scores: ScoreCheck,
    /// What the state is of, for errors (`shards/0.json, model m, data shard 0/3`).
    source: String,
}

/// Why two metric states cannot be merged.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MergeError {
    #[error("cannot merge the metric state of {second} into that of {first}: their {what} differ ({first_value} against {second_value})")]
    Differ { what: &'static str, first: String, first_value: String, second: String, second_value: String },
    #[error("cannot merge the metric state of {second} into that of {first}: {reason}")]
    Inconsistent { first: String, second: String, reason: String },
}

/// Why a metric state's JSON cannot be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StateError {
    #[error("metric_state version {found}; this isorun reads version {STATE_VERSION}")]
    Version { found: String },
    #[error("metric_state: {what}")]
    Invalid { what: String },
}

fn invalid(what: impl Into<String>) -> StateError {
    StateError::Invalid { what: what.into() }
}

impl MetricState {
    pub(crate) fn new(
        output: String,
        output_columns: Option<u64>,
        requested: Vec<Metric>,
        (top_k, threshold, from_logits): (usize, f64, bool),
        slice_names: Vec<String>,
    ) -> MetricState {
        let slices = vec![SliceStates::default(); slice_names.len()];
        MetricState {
            output,
            output_columns,
            requested,
            top_k,
            threshold,
            from_logits,
            slice_names,
            task: None,
            metrics: Vec::new(),
            overall: None,
            slices,
            confusion: None,
            calibration_bins: crate::calibration::DEFAULT_CALIBRATION_BINS,
            max_confusion_classes: MAX_CONFUSION_CLASSES,
            top_confusions: None,
            examples: 0,
            replicates: None,
            scores: ScoreCheck::default(),
            source: "this state".into(),
        }
    }

    /// Examples the state holds.
    pub fn examples(&self) -> u64 {
        self.examples
    }

    /// The task, once a batch decided it.
    pub fn task(&self) -> Option<Task> {
        self.task
    }

    /// Names what the state is of, for merge errors.
    pub fn set_source(&mut self, source: impl Into<String>) {
        self.source = source.into();
    }

    /// What the state is of (as [`MetricState::set_source`] named it).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether every curve (overall and slices) is per distinct score, not bucketed.
    pub fn exact(&self) -> bool {
        self.overall.as_ref().is_none_or(State::exact)
            && self.slices.iter().all(|s| s.values.values().chain(s.other.iter()).all(State::exact))
    }

    /// Adds the state of other examples of the same model and settings (the
    /// same output, metrics asked for, k, decision threshold, logits, slice
    /// features, and task once both saw examples): the state one pass over
    /// both would hold. A refused merge changes nothing.
    pub fn merge(&mut self, other: &MetricState) -> Result<(), MergeError> {
        let (first, second) = (self.source.clone(), other.source.clone());
        let differ = |what: &'static str, a: String, b: String| MergeError::Differ {
            what,
            first: first.clone(),
            first_value: a,
            second: second.clone(),
            second_value: b,
        };
        let names = |m: &[Metric]| format!("[{}]", m.iter().map(Metric::name).collect::<Vec<_>>().join(", "));
        if self.output != other.output {
            return Err(differ("outputs", self.output.clone(), other.output.clone()));
        }
        if self.requested != other.requested {
            return Err(differ("metrics", names(&self.requested), names(&other.requested)));
        }
        if self.slice_names != other.slice_names {
            return Err(differ("slices", format!("{:?}", self.slice_names), format!("{:?}", other.slice_names)));
        }
        // The settings most runs share are named only when they differ.
        let (bins_differ, classes_differ) = (
            self.calibration_bins != other.calibration_bins,
            self.max_confusion_classes != other.max_confusion_classes,
        );
        let settings = |s: &MetricState| {
            let mut text = format!("top_k {}, threshold {}, from_logits {}", s.top_k, s.threshold, s.from_logits);
            if bins_differ {
                text += &format!(", calibration_bins {}", s.calibration_bins);
            }
            if classes_differ {
                text += &format!(", max_confusion_classes {}", s.max_confusion_classes);
            }
            text
        };
        let key = |s: &MetricState| {
            (s.top_k, s.threshold.to_bits(), s.from_logits, s.calibration_bins, s.max_confusion_classes)
        };
        if key(self) != key(other) {
            return Err(differ("settings", settings(self), settings(other)));
        }
        let Some(task) = other.task else {
            return Ok(()); // no examples: nothing to add
        };
        let Some(mine) = self.task else {
            let source = std::mem::take(&mut self.source);
            *self = other.clone();
            self.source = source;
            return Ok(());
        };
        let task_text = |t: Task| match t {
            Task::Multiclass { classes } => format!("multiclass ({classes} classes)"),
            t => t.name().to_string(),
        };
        if mine != task {
            return Err(differ("tasks", task_text(mine), task_text(task)));
        }
        if self.metrics != other.metrics {
            return Err(differ("metrics", names(&self.metrics), names(&other.metrics)));
        }
        let inconsistent =
            |reason: String| MergeError::Inconsistent { first: first.clone(), second: second.clone(), reason };
        let mut merged = self.clone();
        match (&mut merged.overall, &other.overall) {
            (Some(a), Some(b)) => a.merge(b).map_err(&inconsistent)?,
            (a @ None, b) => a.clone_from(b),
            (Some(_), None) => {}
        }
        for (mine, theirs) in merged.slices.iter_mut().zip(&other.slices) {
            mine.merge(theirs).map_err(&inconsistent)?;
        }
        match (&mut merged.confusion, &other.confusion) {
            (Some(a), Some(b)) if a.len() == b.len() => {
                for (x, y) in a.iter_mut().flatten().zip(b.iter().flatten()) {
                    *x = added("confusion counts", *x, *y).map_err(&inconsistent)?;
                }
            }
            (None, None) => {}
            _ => return Err(inconsistent("confusion matrices of different sizes".into())),
        }
        match (&mut merged.top_confusions, &other.top_confusions) {
            (Some(a), Some(b)) => a.merge(b).map_err(&inconsistent)?,
            (None, None) => {}
            _ => return Err(inconsistent("one has top confusions and the other not".into())),
        }
        match (&mut merged.replicates, &other.replicates) {
            (Some(a), Some(b)) => {
                let slices = &merged.slices;
                let slot_of = |f: usize, value: &str| {
                    if value == OTHER_SLICE || slices[f].values.contains_key(value) {
                        value.to_string()
                    } else {
                        OTHER_SLICE.to_string()
                    }
                };
                a.merge(b, &slot_of).map_err(&inconsistent)?;
            }
            (None, None) => {}
            _ => return Err(inconsistent("one has bootstrap replicates (--ci) and the other not".into())),
        }
        merged.scores.merge(&other.scores).map_err(&inconsistent)?;
        merged.examples = added("examples", merged.examples, other.examples).map_err(&inconsistent)?;
        *self = merged;
        Ok(())
    }

    /// The state as compact JSON (see the module's doc).
    pub fn to_json(&self) -> Value {
        let mut o = Map::new();
        o.insert("version".into(), STATE_VERSION.into());
        o.insert("output".into(), json!(self.output));
        if let Some(columns) = self.output_columns {
            o.insert("output_columns".into(), columns.into());
        }
        o.insert("requested".into(), json!(self.requested.iter().map(Metric::name).collect::<Vec<_>>()));
        o.insert("top_k".into(), self.top_k.into());
        o.insert("threshold".into(), json!(self.threshold));
        o.insert("from_logits".into(), self.from_logits.into());
        o.insert("calibration_bins".into(), self.calibration_bins.into());
        o.insert("max_confusion_classes".into(), self.max_confusion_classes.into());
        o.insert("slice_features".into(), json!(self.slice_names));
        o.insert("examples".into(), self.examples.into());
        o.insert("exact".into(), self.exact().into());
        if let Some(task) = self.task {
            o.insert("task".into(), task.name().into());
            if let Task::Multiclass { classes } = task {
                o.insert("classes".into(), classes.into());
            }
            o.insert("metrics".into(), json!(self.metrics.iter().map(Metric::name).collect::<Vec<_>>()));
            if let Some(overall) = &self.overall {
                o.insert("overall".into(), state_json(overall));
            }
            let slices = self.slices.iter().map(|s| {
                let mut values: Vec<(&String, &State)> = s.values.iter().collect();
                values.sort_by(|a, b| a.0.cmp(b.0));
                let values: Map<String, Value> = values.into_iter().map(|(v, s)| (v.clone(), state_json(s))).collect();
                let mut feature = json!({ "values": values });
                if let Some(other) = &s.other {
                    feature["other"] = state_json(other);
                }
                feature
            });
            o.insert("slices".into(), slices.collect());
            if let Some(confusion) = &self.confusion {
                o.insert("confusion".into(), json!(confusion));
            }
            if let Some(top) = &self.top_confusions {
                o.insert("top_confusions".into(), top.to_json());
            }
            if let Some(scores) = self.scores.to_json() {
                o.insert("scores".into(), scores);
            }
        }
        if let Some(replicates) = &self.replicates {
            o.insert("replicates".into(), replicates.to_json());
        }
        Value::Object(o)
    }

    /// The state of [`MetricState::to_json`]'s JSON.
    pub fn from_json(value: &Value) -> Result<MetricState, StateError> {
        match value["version"].as_u64() {
            Some(STATE_VERSION) => {}
            _ => return Err(StateError::Version { found: value["version"].to_string() }),
        }
        let text = |key: &str| value[key].as_str().map(str::to_string).ok_or_else(|| invalid(format!("no \"{key}\"")));
        let metrics_of = |key: &str| -> Result<Vec<Metric>, StateError> {
            let list = value[key].as_array().ok_or_else(|| invalid(format!("no \"{key}\" list")))?;
            list.iter()
                .map(|m| {
                    m.as_str()
                        .ok_or_else(|| invalid(format!("{key}: {m}")))
                        .and_then(|m| Metric::parse(m).map_err(invalid))
                })
                .collect()
        };
        let slice_names: Vec<String> = value["slice_features"]
            .as_array()
            .ok_or_else(|| invalid("no \"slice_features\" list"))?
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or_else(|| invalid("a slice feature that is not a string")))
            .collect::<Result<_, _>>()?;
        let mut state = MetricState::new(
            text("output")?,
            value["output_columns"].as_u64(),
            metrics_of("requested")?,
            (
                value["top_k"].as_u64().ok_or_else(|| invalid("no \"top_k\""))? as usize,
                value["threshold"].as_f64().ok_or_else(|| invalid("no \"threshold\""))?,
                value["from_logits"].as_bool().ok_or_else(|| invalid("no \"from_logits\""))?,
            ),
            slice_names,
        );
        // States written before these settings existed used the defaults.
        if let Some(bins) = value.get("calibration_bins") {
            state.calibration_bins =
                bins.as_u64()
                    .filter(|&b| b >= 1 && b as usize <= crate::calibration::MAX_CALIBRATION_BINS)
                    .ok_or_else(|| invalid(format!("calibration_bins {bins}")))? as usize;
        }
        if let Some(classes) = value.get("max_confusion_classes") {
            state.max_confusion_classes =
                classes.as_u64().ok_or_else(|| invalid(format!("max_confusion_classes {classes}")))? as usize;
        }
        state.examples = value["examples"].as_u64().ok_or_else(|| invalid("no \"examples\" count"))?;
        let Some(task_name) = value["task"].as_str() else {
            if state.examples > 0 {
                return Err(invalid("examples but no \"task\""));
            }
            if !value["replicates"].is_null() {
                let features = state.slice_names.len();
                state.replicates =
                    Some(Replicates::from_json(&value["replicates"], None, &[], features).map_err(invalid)?);
            }
            return Ok(state);
        };
        let task = match task_name {
            "binary" => Task::Binary,
            "regression" => Task::Regression,
            "multiclass" => {
                let classes = value["classes"].as_u64().ok_or_else(|| invalid("no \"classes\""))?;
                if !(2..=MAX_CLASSES as u64).contains(&classes) {
                    return Err(invalid(format!("{classes} classes: a multiclass state has 2 to {MAX_CLASSES}")));
                }
                Task::Multiclass { classes: classes as usize }
            }
            other => return Err(invalid(format!("unknown task '{other}'"))),
        };
        state.task = Some(task);
        state.metrics = metrics_of("metrics")?;
        let curve_count = match task {
            Task::Multiclass { classes } => classes,
            _ => 1,
        };
        // Curves read are never bigger than the ones eval makes for their place.
        let (overall_buckets, slice_buckets) = (overall_curve_sizes(curve_count).1, SLICE_AUC_CAP);
        if !value["overall"].is_null() {
            let overall = state_from_json(&value["overall"], task, Some(overall_buckets));
            state.overall = Some(overall.map_err(|e| invalid(format!("overall: {e}")))?);
        }
        // The class count is backed by per-class sums (checked by
        // `state_from_json`) before anything is sized by it (replicates).
        if let (Task::Multiclass { classes }, None) = (task, &state.overall) {
            return Err(invalid(format!(
                "a multiclass state of {classes} classes without its per-class sums (\"overall\")"
            )));
        }
        let slices = value["slices"].as_array().map(Vec::as_slice).unwrap_or_default();
        if slices.len() != state.slice_names.len() {
            return Err(invalid(format!(
                "{} slice states for {} slice features",
                slices.len(),
                state.slice_names.len()
            )));
        }
        // Eval keeps AUC curves for slices of a binary state only.
        let slice_buckets = (task == Task::Binary).then_some(slice_buckets);
        for ((feature, states), name) in slices.iter().zip(&mut state.slices).zip(&state.slice_names) {
            let values =
                feature["values"].as_object().ok_or_else(|| invalid(format!("slice {name}: no \"values\"")))?;
            if values.len() > MAX_SLICE_VALUES {
                return Err(invalid(format!(
                    "slice {name}: {} values, more than the {MAX_SLICE_VALUES} eval keeps for a slice feature",
                    values.len()
                )));
            }
            for (v, s) in values {
                let parsed =
                    state_from_json(s, task, slice_buckets).map_err(|e| invalid(format!("slice {name}={v}: {e}")))?;
                states.values.insert(v.clone(), parsed);
            }
            if !feature["other"].is_null() {
                let parsed = state_from_json(&feature["other"], task, slice_buckets)
                    .map_err(|e| invalid(format!("slice {name} other: {e}")))?;
                states.other = Some(parsed);
            }
        }
        if !value["confusion"].is_null() {
            let rows = value["confusion"].as_array().ok_or_else(|| invalid("confusion is not a list"))?;
            let expected = match task {
                Task::Regression => 0,
                _ => curve_count.max(2),
            };
            if rows.len() != expected {
                return Err(invalid(format!("a confusion matrix of {} rows for {expected} classes", rows.len())));
            }
            let matrix = rows
                .iter()
                .map(|row| {
                    row.as_array()
                        .and_then(|r| r.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
                        .filter(|r| r.len() == rows.len())
                        .ok_or_else(|| invalid("confusion is not a square matrix of counts"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            state.confusion = Some(matrix);
        }
        if !value["top_confusions"].is_null() {
            let classes = match task {
                Task::Multiclass { classes } => classes,
                _ => 2,
            };
            state.top_confusions = Some(TopConfusions::from_json(&value["top_confusions"], classes).map_err(invalid)?);
        }
        if !value["replicates"].is_null() {
            let features = state.slice_names.len();
            let replicates = Replicates::from_json(&value["replicates"], Some(task), &state.metrics, features);
            state.replicates = Some(replicates.map_err(invalid)?);
        }
        // States written before the check have none: nothing is known of their scores.
        if !value["scores"].is_null() {
            let multiclass = matches!(task, Task::Multiclass { .. });
            state.scores = ScoreCheck::from_json(&value["scores"], state.examples, multiclass).map_err(invalid)?;
        }
        Ok(state)
    }
}

fn special_name(x: f64) -> &'static str {
    if x.is_nan() {
        "nan"
    } else if x > 0.0 {
        "inf"
    } else {
        "-inf"
    }
}

/// A sum: a number when one number holds it exactly, else its partials
/// (and `"inf"`, `"-inf"` or `"nan"` for non-finite terms).
fn sum_json(sum: &ExactSum) -> Value {
    let (partials, special) = sum.parts();
    match partials {
        [] | [_] if special == 0.0 => json!(partials.first().copied().unwrap_or(0.0)),
        _ => {
            let mut list: Vec<Value> = partials.iter().map(|p| json!(p)).collect();
            if special != 0.0 || special.is_nan() {
                list.push(json!(special_name(special)));
            }
            Value::Array(list)
        }
    }
}

fn sum_from_json(value: &Value) -> Result<ExactSum, String> {
    if let Some(x) = value.as_f64() {
        return Ok(ExactSum::from_parts(&[x], 0.0));
    }
    let list = value.as_array().ok_or_else(|| format!("{value} is not a sum"))?;
    let mut terms = Vec::new();
    let mut special = 0.0;
    for item in list {
        match (item.as_f64(), item.as_str()) {
            (Some(x), _) => terms.push(x),
            (None, Some("inf")) => special += f64::INFINITY,
            (None, Some("-inf")) => special += f64::NEG_INFINITY,
            (None, Some("nan")) => special = f64::NAN,
            _ => return Err(format!("{item} is not a term of a sum")),
        }
    }
    Ok(ExactSum::from_parts(&terms, special))
}

fn put_sum(o: &mut Map<String, Value>, key: &str, sum: &ExactSum) {
    if *sum != ExactSum::default() {
        o.insert(key.into(), sum_json(sum));
    }
}

fn get_sum(o: &Value, key: &str) -> Result<ExactSum, String> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(ExactSum::default()),
        Some(v) => sum_from_json(v).map_err(|e| format!("{key}: {e}")),
    }
}

fn state_json(state: &State) -> Value {
    let mut o = Map::new();
    let sums = state.sums();
    o.insert("examples".into(), sums.examples.into());
    for (name, sum) in SUM_NAMES.iter().zip(sums.fields()) {
        put_sum(&mut o, name, sum);
    }
    match state {
        State::Binary(s) => {
            for (name, sum) in [("tp", &s.tp), ("fp", &s.fp), ("tn", &s.tn), ("fn", &s.fn_)] {
                put_sum(&mut o, name, sum);
            }
            if let Some(curve) = &s.curve {
                o.insert("curve".into(), curve.to_json());
            }
            if let Some(calibration) = &s.calibration {
                o.insert("calibration".into(), calibration.to_json(sum_json));
            }
        }
        State::Multiclass(s) => {
            put_sum(&mut o, "correct", &s.correct);
            put_sum(&mut o, "top_k", &s.top_k);
            for (name, sums) in [("tp", &s.tp), ("fp", &s.fp), ("fn", &s.fn_)] {
                o.insert(name.into(), sums.iter().map(sum_json).collect());
            }
            o.insert("present".into(), s.present.iter().map(|&p| u8::from(p)).collect());
            if let Some(curves) = &s.curves {
                o.insert("curves".into(), curves.iter().map(Curve::to_json).collect());
            }
            put_sum(&mut o, "brier", &s.brier);
            if let Some(calibration) = &s.calibration {
                o.insert("calibration".into(), calibration.to_json(sum_json));
            }
        }
        State::Regression(_) => {}
    }
    Value::Object(o)
}

/// A state of [`state_json`]'s JSON; its AUC curves of at most `max_buckets`
/// buckets, and none where that is `None` (eval keeps none there).
fn state_from_json(value: &Value, task: Task, max_buckets: Option<usize>) -> Result<State, String> {
    if !value.is_object() {
        return Err("not an object".into());
    }
    let mut sums = Sums { examples: value["examples"].as_u64().ok_or("no \"examples\" count")?, ..Sums::default() };
    for (name, sum) in SUM_NAMES.iter().zip(sums.fields_mut()) {
        *sum = get_sum(value, name)?;
    }
    let read_curve = |v: &Value| match max_buckets {
        Some(max_buckets) => Curve::from_json(v, max_buckets),
        None => Err(format!("AUC curves, which eval keeps for no slice of a {} state", task.name())),
    };
    let curve = |v: &Value| if v.is_null() { Ok(None) } else { read_curve(v).map(Some) };
    let calibration = if value["calibration"].is_null() {
        None
    } else {
        Some(Calibration::from_json(&value["calibration"], sum_from_json)?)
    };
    Ok(match task {
        Task::Binary => State::Binary(BinaryState {
            sums,
            tp: get_sum(value, "tp")?,
            fp: get_sum(value, "fp")?,
            tn: get_sum(value, "tn")?,
            fn_: get_sum(value, "fn")?,
            curve: curve(&value["curve"])?,
            calibration,
        }),
        Task::Multiclass { classes } => {
            let per_class = |key: &str| -> Result<Vec<ExactSum>, String> {
                let list = value[key].as_array().filter(|l| l.len() == classes);
                let list = list.ok_or_else(|| format!("\"{key}\" is not {classes} sums"))?;
                list.iter().map(sum_from_json).collect()
            };
            let present = value["present"]
                .as_array()
                .filter(|l| l.len() == classes)
                .and_then(|l| l.iter().map(|p| p.as_u64().map(|p| p != 0)).collect::<Option<Vec<bool>>>())
                .ok_or_else(|| format!("\"present\" is not {classes} flags"))?;
            let curves = match value["curves"].as_array() {
                None => None,
                Some(list) if list.len() == classes => Some(list.iter().map(read_curve).collect::<Result<_, _>>()?),
                Some(list) => return Err(format!("{} curves for {classes} classes", list.len())),
            };
            State::Multiclass(MulticlassState {
                sums,
                correct: get_sum(value, "correct")?,
                top_k: get_sum(value, "top_k")?,
                tp: per_class("tp")?,
                fp: per_class("fp")?,
                fn_: per_class("fn")?,
                present,
                curves,
                brier: get_sum(value, "brier")?,
                calibration,
            })
        }
        Task::Regression => State::Regression(RegressionState { sums }),
    })
}

/// The metrics of `state` (a slice value's or the whole data's), by name.
pub(crate) fn metric_values(state: &State, metrics: &[Metric]) -> BTreeMap<String, f64> {
    metrics.iter().map(|m| (m.name().to_string(), state.value(*m))).collect()
}
