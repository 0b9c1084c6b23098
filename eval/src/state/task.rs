//! The metric state of one task (binary, multiclass, regression) over some
//! examples, and the one definition of its fields' layout. It is a leaf of
//! the state: the aggregate ([`super::MetricState`]), its JSON codec and the
//! bootstrap replicates (`crate::replicates`) all build on it, and it
//! imports none of them.
//!
//! The layout lives here because two places lay the same sums out: the
//! state itself (named fields of exact sums) and a bootstrap replicate
//! (plain `f64` sums in one flat list, `crate::replicates`). [`SumField`]
//! names the sums every task keeps, and [`PlainLayout`] says where each of
//! a task's sums sits in a flat list; the replicates write by it and
//! [`State::from_plain`] reads by it, so the two cannot drift apart.

use crate::accumulator::{added, Accumulator};
use crate::calibration::Calibration;
use crate::curve::Curve;
use crate::exact::{two_product, ExactSum};
use crate::task::{Metric, Task};
use std::collections::BTreeMap;

/// Metric state of one task over some examples.
#[derive(Debug, Clone)]
pub(crate) enum State {
    Binary(BinaryState),
    Multiclass(MulticlassState),
    Regression(RegressionState),
}

/// A sum every task keeps (multiclass: only weight and log loss are
/// filled), in the order of a [`PlainLayout`]; [`SumField::name`] is its key
/// in the state's JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SumField {
    Weight,
    LogLoss,
    /// Σ w·p.
    Prediction,
    /// Σ w·y and Σ w·y², exactly (the products too), for mean_label and r2.
    Label,
    LabelSquared,
    SquaredError,
    AbsoluteError,
}

impl SumField {
    /// Every field, in layout order.
    pub(crate) const ALL: [SumField; 7] = [
        SumField::Weight,
        SumField::LogLoss,
        SumField::Prediction,
        SumField::Label,
        SumField::LabelSquared,
        SumField::SquaredError,
        SumField::AbsoluteError,
    ];

    /// The field's key in the state's JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SumField::Weight => "weight",
            SumField::LogLoss => "log_loss",
            SumField::Prediction => "prediction",
            SumField::Label => "label",
            SumField::LabelSquared => "label_squared",
            SumField::SquaredError => "squared_error",
            SumField::AbsoluteError => "absolute_error",
        }
    }
}

/// A cell of a binary task's confusion matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cell {
    TruePositive,
    FalsePositive,
    TrueNegative,
    FalseNegative,
}

impl Cell {
    /// The cell of an example with this label and decision.
    pub(crate) fn of(positive: bool, predicted: bool) -> Cell {
        match (positive, predicted) {
            (true, true) => Cell::TruePositive,
            (false, true) => Cell::FalsePositive,
            (false, false) => Cell::TrueNegative,
            (true, false) => Cell::FalseNegative,
        }
    }
}

/// Where each of a task's sums sits in a flat list of plain sums (a
/// bootstrap replicate's, `crate::replicates`): the [`SumField`]s in
/// order, then binary: the [`Cell`]s in order; multiclass: correct, top_k,
/// then tp, fp and fn per class; regression: nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlainLayout {
    task: Task,
}

impl PlainLayout {
    const SUMS: usize = SumField::ALL.len();

    pub(crate) fn of(task: Task) -> PlainLayout {
        PlainLayout { task }
    }

    /// How many sums the task keeps.
    pub(crate) fn len(self) -> usize {
        match self.task {
            Task::Binary => Self::SUMS + 4,
            Task::Multiclass { classes } => Self::SUMS + 2 + 3 * classes,
            Task::Regression => Self::SUMS,
        }
    }

    pub(crate) fn sum(self, field: SumField) -> usize {
        field as usize
    }

    /// Binary: a confusion cell.
    pub(crate) fn cell(self, cell: Cell) -> usize {
        Self::SUMS + cell as usize
    }

    /// Multiclass: Σ w of the examples classified right.
    pub(crate) fn correct(self) -> usize {
        Self::SUMS
    }

    /// Multiclass: Σ w of the examples whose class is in the top k.
    pub(crate) fn top_k(self) -> usize {
        Self::SUMS + 1
    }

    fn classes(self) -> usize {
        match self.task {
            Task::Multiclass { classes } => classes,
            _ => 0,
        }
    }

    /// Multiclass: a class's true positives.
    pub(crate) fn tp(self, class: usize) -> usize {
        Self::SUMS + 2 + class
    }

    /// Multiclass: a class's false positives.
    pub(crate) fn fp(self, class: usize) -> usize {
        Self::SUMS + 2 + self.classes() + class
    }

    /// Multiclass: a class's false negatives.
    pub(crate) fn fn_(self, class: usize) -> usize {
        Self::SUMS + 2 + 2 * self.classes() + class
    }
}

/// The sums every task keeps (multiclass: examples, weight and log loss).
#[derive(Debug, Clone, Default)]
pub(crate) struct Sums {
    pub(crate) examples: u64,
    weight: ExactSum,
    log_loss: ExactSum,
    prediction: ExactSum,
    label: ExactSum,
    label_squared: ExactSum,
    squared_error: ExactSum,
    absolute_error: ExactSum,
}

impl Sums {
    /// Sums of `examples` examples, all zero (to be filled field by field).
    pub(crate) fn of_examples(examples: u64) -> Sums {
        Sums { examples, ..Sums::default() }
    }

    pub(crate) fn get(&self, field: SumField) -> &ExactSum {
        match field {
            SumField::Weight => &self.weight,
            SumField::LogLoss => &self.log_loss,
            SumField::Prediction => &self.prediction,
            SumField::Label => &self.label,
            SumField::LabelSquared => &self.label_squared,
            SumField::SquaredError => &self.squared_error,
            SumField::AbsoluteError => &self.absolute_error,
        }
    }

    pub(crate) fn get_mut(&mut self, field: SumField) -> &mut ExactSum {
        match field {
            SumField::Weight => &mut self.weight,
            SumField::LogLoss => &mut self.log_loss,
            SumField::Prediction => &mut self.prediction,
            SumField::Label => &mut self.label,
            SumField::LabelSquared => &mut self.label_squared,
            SumField::SquaredError => &mut self.squared_error,
            SumField::AbsoluteError => &mut self.absolute_error,
        }
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
        for field in SumField::ALL {
            self.get_mut(field).merge(other.get(field));
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
    pub(crate) sums: Sums,
    pub(crate) tp: ExactSum,
    pub(crate) fp: ExactSum,
    pub(crate) tn: ExactSum,
    pub(crate) fn_: ExactSum,
    pub(crate) curve: Option<Curve>,
    /// Reliability bins, with `ece`.
    pub(crate) calibration: Option<Calibration>,
}

impl BinaryState {
    fn cell_mut(&mut self, cell: Cell) -> &mut ExactSum {
        match cell {
            Cell::TruePositive => &mut self.tp,
            Cell::FalsePositive => &mut self.fp,
            Cell::TrueNegative => &mut self.tn,
            Cell::FalseNegative => &mut self.fn_,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct MulticlassState {
    pub(crate) sums: Sums,
    pub(crate) correct: ExactSum,
    pub(crate) top_k: ExactSum,
    pub(crate) tp: Vec<ExactSum>,
    pub(crate) fp: Vec<ExactSum>,
    pub(crate) fn_: Vec<ExactSum>,
    pub(crate) present: Vec<bool>,
    pub(crate) curves: Option<Vec<Curve>>,
    /// Σ w·Σ_c (p_c − y_c)² (halved for 2 classes, as sklearn's brier_score_loss).
    pub(crate) brier: ExactSum,
    /// Reliability bins, with `ece`.
    pub(crate) calibration: Option<Calibration>,
}

#[derive(Debug, Clone)]
pub(crate) struct RegressionState {
    pub(crate) sums: Sums,
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
                s.cell_mut(Cell::of(positive, predicted)).add(row.weight);
                let q = if positive { p } else { 1.0 - p };
                s.sums.log_loss.add(-row.weight * q.clamp(eps, 1.0 - eps).ln());
                s.sums.add(p, row.label, row.weight);
                if let Some(curve) = &mut s.curve {
                    curve.add((p, positive, row.weight));
                }
                if let Some(calibration) = &mut s.calibration {
                    let confidence = if predicted { p } else { 1.0 - p };
                    calibration.add((confidence, predicted == positive, row.weight));
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
                    calibration.add((scores[row.predicted], row.predicted == class, row.weight));
                }
                if let Some(curves) = &mut s.curves {
                    for (c, curve) in curves.iter_mut().enumerate() {
                        curve.add((scores[c], c == class, row.weight));
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
    /// (`crate::replicates`): `values` laid out as [`PlainLayout`] says for
    /// `task`. `present`: multiclass, the classes seen.
    pub(crate) fn from_plain(
        task: Task,
        examples: u64,
        values: &[f64],
        present: &[bool],
        curves: Option<Vec<Curve>>,
    ) -> State {
        let layout = PlainLayout::of(task);
        let sum = |at: usize| ExactSum::from_parts(&[values[at]], 0.0);
        let mut sums = Sums::of_examples(examples);
        for field in SumField::ALL {
            *sums.get_mut(field) = sum(layout.sum(field));
        }
        match task {
            Task::Binary => State::Binary(BinaryState {
                sums,
                tp: sum(layout.cell(Cell::TruePositive)),
                fp: sum(layout.cell(Cell::FalsePositive)),
                tn: sum(layout.cell(Cell::TrueNegative)),
                fn_: sum(layout.cell(Cell::FalseNegative)),
                curve: curves.and_then(|c| c.into_iter().next()),
                // Not kept per replicate: ece has no interval.
                calibration: None,
            }),
            Task::Multiclass { classes } => {
                let per_class =
                    |at: fn(PlainLayout, usize) -> usize| (0..classes).map(|c| sum(at(layout, c))).collect();
                State::Multiclass(MulticlassState {
                    sums,
                    correct: sum(layout.correct()),
                    top_k: sum(layout.top_k()),
                    tp: per_class(PlainLayout::tp),
                    fp: per_class(PlainLayout::fp),
                    fn_: per_class(PlainLayout::fn_),
                    present: present.to_vec(),
                    curves,
                    // Not kept per replicate: a multiclass brier or ece has no
                    // interval (NaN replicates: `ci` is null), never a wrong one.
                    brier: ExactSum::from_parts(&[f64::NAN], 0.0),
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

    pub(crate) fn sums(&self) -> &Sums {
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
            (State::Binary(s), Metric::Ece) => s.calibration.as_ref().map_or(f64::NAN, Calibration::finish),
            (State::Multiclass(s), Metric::Ece) => s.calibration.as_ref().map_or(f64::NAN, Calibration::finish),
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
    pub(crate) fn merge(&mut self, other: &State) -> Result<(), String> {
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
                    (Some(x), Some(y)) => {
                        for (x, y) in x.iter_mut().zip(y) {
                            x.merge(y)?;
                        }
                    }
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
        (Some(a), Some(b)) => a.merge(b),
        (None, None) => Ok(()),
        _ => Err("one has an AUC curve and the other not".into()),
    }
}

impl MulticlassState {
    fn macro_average(&self, per_class: impl Fn(usize) -> f64) -> f64 {
        mean((0..self.present.len()).filter(|&c| self.present[c]).map(per_class))
    }
}

/// The metrics of `state` (a slice value's or the whole data's), by name.
pub(crate) fn metric_values(state: &State, metrics: &[Metric]) -> BTreeMap<String, f64> {
    metrics.iter().map(|m| (m.name().to_string(), state.value(*m))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_layout_gives_every_sum_of_a_task_its_own_place() {
        for task in [Task::Binary, Task::Multiclass { classes: 5 }, Task::Regression] {
            let layout = PlainLayout::of(task);
            let mut places: Vec<usize> = SumField::ALL.iter().map(|&f| layout.sum(f)).collect();
            match task {
                Task::Binary => places.extend(
                    [Cell::TruePositive, Cell::FalsePositive, Cell::TrueNegative, Cell::FalseNegative]
                        .map(|c| layout.cell(c)),
                ),
                Task::Multiclass { classes } => {
                    places.extend([layout.correct(), layout.top_k()]);
                    for c in 0..classes {
                        places.extend([layout.tp(c), layout.fp(c), layout.fn_(c)]);
                    }
                }
                Task::Regression => {}
            }
            places.sort_unstable();
            assert_eq!(places, (0..layout.len()).collect::<Vec<_>>(), "{task:?}");
        }
    }
}
