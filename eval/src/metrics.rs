//! Metrics computed batch by batch from a model's outputs and the targets,
//! keeping state (sums, counts, per-score counts), never predictions.
//!
//! Meanings follow Keras and scikit-learn, and the reference test checks
//! them against scikit-learn 1.9 to 1e-6 relative:
//! - Task, decided at the first batch and kept: an output `[N]`/`[N, 1]`
//!   with integer labels all 0 or 1 in that batch is binary (a later label
//!   2 is then an error; other integer labels in the first batch make it
//!   regression); `[N, C]`, C ≥ 2, with integer labels or `Matrix` labels of
//!   C columns (one-hot: argmax, like Keras's categorical metrics) is
//!   multiclass; float labels are regression.
//! - Default metrics: binary accuracy, auc, log_loss, precision, recall, f1;
//!   multiclass accuracy, top_k_accuracy (when C > k), log_loss; regression
//!   mse, mae, rmse. `Evaluation::defaulted` says when these were used.
//! - `--from-logits`: binary outputs go through a sigmoid, multiclass through
//!   a softmax, before anything else. Without it binary outputs are the
//!   probability of class 1 and multiclass rows are probabilities as given:
//!   scikit-learn 1.9's `log_loss` no longer renormalizes rows (it warns),
//!   and neither does this; AUC ranks the scores as given. Scores read as
//!   probabilities must be ones: a score outside [0, 1] or a multiclass row
//!   not summing to 1 (within 1e-3, or rounding to the output's dtype) makes
//!   the metrics that read probabilities (log_loss, brier, ece; multiclass
//!   auc and pr_auc, as sklearn) NaN, and the evaluation says why
//!   (`not_probabilities`, see `probabilities`), naming `--from-logits`.
//! - Binary decisions: class 1 when p > threshold (Keras's `BinaryAccuracy`).
//!   Multiclass: argmax (the first of tied maxima, like NumPy); top-k: the
//!   true class is a hit when fewer than k classes score strictly higher.
//! - Precision, recall, f1: binary for class 1; multiclass macro averages over
//!   the classes present in the labels or the predictions (sklearn's
//!   `average='macro'`); 0 where a denominator is 0 (sklearn's
//!   `zero_division` default). auc: ROC AUC, multiclass one-vs-rest macro
//!   (`multi_class='ovr'`) over classes with positives and negatives;
//!   pr_auc: average precision (`average_precision_score`), multiclass the
//!   macro average over binarized classes. Both exact per distinct score up
//!   to a cap (2^18 distinct scores over all classes of the whole dataset,
//!   at least 2^12 per class), then bucketed (2^16 buckets), reported as
//!   `auc_exact: false`; for slices, binary tasks only, exact up to 2^10
//!   distinct scores per slice value, then 2^10 buckets (`slices_auc_exact`).
//! - log_loss: probabilities clipped to [eps, 1 − eps], eps the machine
//!   epsilon of the output's dtype (float32's for float32 and bfloat16, float16's for float16,
//!   float64's for float64 and integers), as sklearn 1.9 does.
//! - Weights weight every metric as sklearn's `sample_weight` does. The
//!   confusion matrix counts examples, unweighted (rows: true class), up to
//!   `--max-confusion-classes` classes (default [`MAX_CONFUSION_CLASSES`],
//!   8 MB); past them the full matrix is left out
//!   (`confusion_matrix_omitted`), since classes² cells would be 20 GB at
//!   50,000 classes, and the record lists the top confusions instead
//!   (`top_confusions`, from a bounded summary: see `confusion`, exact
//!   unless `top_confusions_exact: false`). Precision, recall and f1 never
//!   read it: they keep their own per-class counts.
//! - ece: expected calibration error of the top class over
//!   `--calibration-bins` (default 15) equal-width bins, bin b holding the
//!   confidences in (b/N, (b+1)/N], the first [0, 1/N] (Guo et al. 2017;
//!   see `calibration`); weighted. The record's `calibration` is the
//!   reliability diagram of the whole data.
//! - brier: sklearn 1.9's `brier_score_loss`: binary the weighted mean of
//!   (p − y)² (the same as mse); multiclass the weighted mean over examples
//!   of Σ_c (p_c − y_c)², y one-hot (or the label row given), halved for
//!   two classes (sklearn's `scale_by_half="auto"`, so [N, 2] outputs score
//!   as binary ones).
//! - mse, mae, rmse (and r2) on binary tasks score the probability against
//!   the 0/1 label (mse is then the Brier score). rmse is √mse; r2 is
//!   sklearn's `r2_score` (1 − SS_res/SS_tot; 1 or 0 when SS_tot is 0).
//!   mean_prediction and mean_label are weighted means; calibration is
//!   their ratio (TFMA's).
//! - Slices: each value of each slice feature gets its own state; past 1000
//!   distinct values of one feature, further values share `__other__`.
//!   A metric that cannot be computed (AUC with one class only) is NaN,
//!   written as `null` in JSON.

use crate::accumulator::Accumulator;
use crate::bootstrap;
pub use crate::calibration::{ReliabilityDiagram, DEFAULT_CALIBRATION_BINS, MAX_CALIBRATION_BINS};
use crate::confusion::TopConfusions;
pub use crate::confusion::{Confusion, TopConfusionsSummary, TOP_CONFUSIONS_SHOWN, TOP_CONFUSION_ENTRIES};
use crate::data::{Labels, Targets};
use crate::probabilities::Tolerance;
use crate::replicates::{CiSpec, KeyedBy, Replicates};
use crate::state::task::{Row, State};
use crate::state::MetricState;
pub use crate::state::{
    AUC_BUCKETS, AUC_EXACT_CAP, MAX_CONFUSION_CLASSES, MAX_SLICE_VALUES, OTHER_SLICE, SLICE_AUC_CAP,
};
pub use crate::task::{Metric, Task};
use isorun_protocol::{DType, SignatureInfo, Tensor, TensorData};

pub use crate::evaluation::Evaluation;

/// What to compute, and how to read the output.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSpec {
    /// Empty: the task's default.
    pub metrics: Vec<Metric>,
    /// Which output to score. `None`: the only output; with several, the
    /// one named (case-insensitively) `probabilities`, `probs`,
    /// `predictions`, `scores`, `logits`, `output`, `outputs`, `output_0`,
    /// in that order of preference; else an error listing them.
    pub output: Option<String>,
    /// k of top_k_accuracy (default 5).
    pub top_k: usize,
    /// Binary decision threshold (default 0.5).
    pub threshold: f64,
    /// Outputs are logits (sigmoid/softmax them first).
    pub from_logits: bool,
    /// Equal-width confidence bins of `ece` (default 15).
    pub calibration_bins: usize,
    /// Classes up to which the full confusion matrix is kept (default
    /// [`MAX_CONFUSION_CLASSES`]); past them, the top confusions.
    pub max_confusion_classes: usize,
}

impl Default for MetricsSpec {
    fn default() -> MetricsSpec {
        MetricsSpec {
            metrics: Vec::new(),
            output: None,
            top_k: 5,
            threshold: 0.5,
            from_logits: false,
            calibration_bins: DEFAULT_CALIBRATION_BINS,
            max_confusion_classes: MAX_CONFUSION_CLASSES,
        }
    }
}

/// Output names preferred when a signature has several outputs.
const PREFERRED_OUTPUTS: [&str; 8] =
    ["probabilities", "probs", "predictions", "scores", "logits", "output", "outputs", "output_0"];

/// Why outputs could not be scored.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("signature '{signature}' has no output '{output}'; outputs are: {available}")]
    NoOutput { signature: String, output: String, available: String },
    #[error("signature '{signature}' has several outputs ({available}); say which to score (--output NAME)")]
    AmbiguousOutput { signature: String, available: String },
    #[error("the batch's outputs have no '{output}'; they are: {available}")]
    MissingOutput { output: String, available: String },
    #[error("output '{output}' is {dtype}; metrics need numbers")]
    NotNumeric { output: String, dtype: DType },
    #[error("output '{output}' has shape {shape:?}; metrics take [N], [N, 1] or [N, C]")]
    BadShape { output: String, shape: Vec<u64> },
    #[error("output '{output}' has {output_rows} rows but the batch has {rows} examples")]
    Rows { output: String, output_rows: u64, rows: usize },
    #[error("{what} has {len} rows but the batch has {rows} examples")]
    TargetRows { what: String, len: usize, rows: usize },
    #[error("output '{output}' holds a non-finite value ({value}) at row {row} of the batch")]
    NotFinite { output: String, row: usize, value: f64 },
    #[error("label {label} at row {row} of the batch is outside {range} for a {task} task")]
    LabelOutOfRange { label: String, row: usize, range: String, task: &'static str },
    #[error("output '{output}' {reason}")]
    Mismatch { output: String, reason: String },
    #[error("metric {metric} does not apply to a {task} task; it takes: {applicable}")]
    NotApplicable { metric: Metric, task: &'static str, applicable: String },
    #[error("invalid metrics spec: {reason}")]
    InvalidSpec { reason: String },
}

/// Scores batches of one model's outputs.
#[derive(Debug, Clone)]
pub struct Evaluator {
    spec: MetricsSpec,
    output_dtype: DType,
    /// Everything the metrics come from (`state()` hands out a copy).
    state: MetricState,
    values: Vec<f64>,
}

/// The machine epsilon sklearn clips log loss with: float64's for float64
/// (and integer) outputs, float16's for float16, float32's otherwise.
fn epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::Float32 | DType::BFloat16 => f64::from(f32::EPSILON),
        DType::Float16 => f64::from(half::f16::EPSILON.to_f32()),
        _ => f64::EPSILON,
    }
}

fn numeric(dtype: DType) -> bool {
    !matches!(dtype, DType::String | DType::Bool)
}

/// The tensor's elements as f64, into `out`.
fn to_f64(tensor: &Tensor, output: &str, out: &mut Vec<f64>) -> Result<(), EvalError> {
    let TensorData::Dense(bytes) = &tensor.data else {
        return Err(EvalError::Mismatch { output: output.into(), reason: "is not a dense tensor in memory".into() });
    };
    if !numeric(tensor.dtype) {
        return Err(EvalError::NotNumeric { output: output.into(), dtype: tensor.dtype });
    }
    let size = tensor.dtype.element_size().expect("dense");
    out.clear();
    out.reserve(bytes.len() / size);
    let element = isorun_tensors::npy::Element::Dense(tensor.dtype, false);
    if tensor.dtype == DType::Float32 {
        out.extend(bytes.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))));
    } else if tensor.dtype == DType::Float64 {
        out.extend(bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))));
    } else {
        out.extend(
            bytes.chunks_exact(size).map(|c| crate::element::number(element, c).map_or(f64::NAN, |n| n.as_f64())),
        );
    }
    Ok(())
}

pub(crate) fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn softmax(row: &mut [f64]) {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in row.iter_mut() {
        *v /= sum;
    }
}

pub(crate) fn argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best
}

impl Evaluator {
    /// Checks the spec against the signature (the output exists; its dtype
    /// is numeric) before any batch. `slices` are the slice feature names,
    /// in the order of `Targets::slices`.
    pub fn new(spec: &MetricsSpec, signature: &SignatureInfo, slices: &[String]) -> Result<Evaluator, EvalError> {
        if spec.top_k == 0 {
            return Err(EvalError::InvalidSpec { reason: "top k must be at least 1".into() });
        }
        if !spec.threshold.is_finite() {
            return Err(EvalError::InvalidSpec { reason: format!("threshold {} is not a number", spec.threshold) });
        }
        if spec.calibration_bins == 0 || spec.calibration_bins > MAX_CALIBRATION_BINS {
            return Err(EvalError::InvalidSpec {
                reason: format!("calibration bins must be 1 to {MAX_CALIBRATION_BINS}, not {}", spec.calibration_bins),
            });
        }
        let available = || signature.outputs.iter().map(|o| o.describe()).collect::<Vec<_>>().join(", ");
        let chosen = match &spec.output {
            Some(name) => signature.outputs.iter().find(|o| &o.name == name).ok_or_else(|| EvalError::NoOutput {
                signature: signature.key.clone(),
                output: name.clone(),
                available: available(),
            })?,
            None => match signature.outputs.as_slice() {
                [only] => only,
                [] => {
                    return Err(EvalError::NoOutput {
                        signature: signature.key.clone(),
                        output: "(any)".into(),
                        available: "none".into(),
                    })
                }
                outputs => PREFERRED_OUTPUTS
                    .iter()
                    .find_map(|p| outputs.iter().find(|o| o.name.eq_ignore_ascii_case(p)))
                    .ok_or_else(|| EvalError::AmbiguousOutput {
                        signature: signature.key.clone(),
                        available: available(),
                    })?,
            },
        };
        if !numeric(chosen.dtype) {
            return Err(EvalError::NotNumeric { output: chosen.name.clone(), dtype: chosen.dtype });
        }
        let output_columns = match &chosen.shape {
            Some(dims) if dims.len() > 2 || dims.is_empty() => {
                return Err(EvalError::BadShape {
                    output: chosen.name.clone(),
                    shape: dims.iter().map(|d| d.unwrap_or(0)).collect(),
                })
            }
            Some(dims) if dims.len() == 2 => dims[1],
            Some(_) => Some(1),
            None => None,
        };
        let mut state = MetricState::new(
            chosen.name.clone(),
            output_columns,
            spec.metrics.clone(),
            (spec.top_k, spec.threshold, spec.from_logits),
            slices.to_vec(),
        );
        state.calibration_bins = spec.calibration_bins;
        state.max_confusion_classes = spec.max_confusion_classes;
        Ok(Evaluator { spec: spec.clone(), output_dtype: chosen.dtype, state, values: Vec::new() })
    }

    /// Adds bootstrap replicates (`--ci`): every metric gets an interval,
    /// overall and per slice (see [`crate::replicates`]). Call before the
    /// first batch. With [`crate::replicates::KeyedBy::Key`] every batch
    /// must carry [`Targets::keys`].
    pub fn with_ci(mut self, ci: CiSpec) -> Evaluator {
        self.state.replicates = Some(Replicates::new(ci, self.state.slice_names.len()));
        self
    }

    /// The output scored.
    pub fn output(&self) -> &str {
        &self.state.output
    }

    /// The task, once the first batch decided it.
    pub fn task(&self) -> Option<Task> {
        self.state.task
    }

    fn decide(&mut self, columns: usize, labels: &Labels) -> Result<Task, EvalError> {
        let output = self.state.output.clone();
        let task = match labels {
            Labels::Float(_) if columns == 1 => Task::Regression,
            Labels::Float(_) => {
                return Err(EvalError::Mismatch {
                    output,
                    reason: format!("has {columns} values per example but the labels are one float each (regression)"),
                })
            }
            Labels::Int(values) if columns == 1 => {
                if values.iter().all(|v| *v == 0 || *v == 1) {
                    Task::Binary
                } else {
                    Task::Regression
                }
            }
            Labels::Int(_) => Task::Multiclass { classes: columns },
            Labels::Matrix { columns: label_columns, .. } if *label_columns == columns => {
                Task::Multiclass { classes: columns }
            }
            Labels::Matrix { columns: label_columns, .. } => {
                return Err(EvalError::Mismatch {
                    output,
                    reason: format!("has {columns} values per example but the labels have {label_columns}"),
                })
            }
        };
        let defaulted = self.spec.metrics.is_empty();
        let metrics = if defaulted { task.default_metrics(self.spec.top_k) } else { self.spec.metrics.clone() };
        for metric in &metrics {
            if !metric.applies_to(task) {
                let applicable: Vec<&str> =
                    Metric::ALL.iter().filter(|m| m.applies_to(task)).map(|m| m.name()).collect();
                return Err(EvalError::NotApplicable {
                    metric: *metric,
                    task: task.name(),
                    applicable: applicable.join(", "),
                });
            }
        }
        let mut unique = Vec::new();
        for m in metrics {
            if !unique.contains(&m) {
                unique.push(m);
            }
        }
        self.state.metrics = unique;
        self.state.task = Some(task);
        let wants_curves = self.state.metrics.iter().any(|m| matches!(m, Metric::Auc | Metric::PrAuc));
        let curve_count = match task {
            Task::Multiclass { classes } => classes,
            _ => 1,
        };
        let overall_curves = wants_curves.then(|| crate::state::overall_curve_sizes(curve_count));
        self.state.overall = Some(State::new(task, overall_curves).with_calibration(self.calibration_bins()));
        if matches!(task, Task::Binary | Task::Multiclass { .. }) {
            if curve_count <= self.state.max_confusion_classes {
                self.state.confusion = Some(vec![vec![0; curve_count.max(2)]; curve_count.max(2)]);
            } else {
                self.state.top_confusions = Some(TopConfusions::new(TOP_CONFUSION_ENTRIES));
            }
        }
        Ok(task)
    }

    /// Reliability bins when `ece` is computed.
    fn calibration_bins(&self) -> Option<usize> {
        self.state.metrics.contains(&Metric::Ece).then_some(self.state.calibration_bins)
    }

    fn slice_state(&self) -> State {
        let task = self.state.task.expect("decided");
        let wants_curves = self.state.metrics.iter().any(|m| matches!(m, Metric::Auc | Metric::PrAuc));
        State::new(task, (wants_curves && task == Task::Binary).then_some((SLICE_AUC_CAP, SLICE_AUC_CAP)))
            .with_calibration(self.calibration_bins())
    }

    /// Scores one batch. `outputs` are the worker's outputs for it. Decides
    /// the task at the first batch and keeps it. Errors: rows differ from the
    /// targets', a label outside [0, classes), a non-numeric output, a metric
    /// that does not apply to the task; a failed batch adds nothing.
    pub fn update(&mut self, outputs: &[(String, Tensor)], targets: &Targets) -> Result<(), EvalError> {
        let output = self.state.output.clone();
        let (_, tensor) = outputs.iter().find(|(n, _)| *n == output).ok_or_else(|| EvalError::MissingOutput {
            output: output.clone(),
            available: outputs.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>().join(", "),
        })?;
        let columns = match tensor.shape.as_slice() {
            [_] => 1,
            [_, c] if *c >= 1 => *c as usize,
            shape => return Err(EvalError::BadShape { output, shape: shape.to_vec() }),
        };
        let rows = targets.rows;
        if tensor.shape[0] != rows as u64 {
            return Err(EvalError::Rows { output, output_rows: tensor.shape[0], rows });
        }
        if targets.labels.len() != rows {
            return Err(EvalError::TargetRows { what: "the labels".into(), len: targets.labels.len(), rows });
        }
        if let Some(w) = &targets.weights {
            if w.len() != rows {
                return Err(EvalError::TargetRows { what: "the weights".into(), len: w.len(), rows });
            }
        }
        if targets.slices.len() != self.state.slice_names.len() {
            return Err(EvalError::TargetRows {
                what: format!(
                    "the slices ({} features, expected {})",
                    targets.slices.len(),
                    self.state.slice_names.len()
                ),
                len: targets.slices.len(),
                rows,
            });
        }
        for (name, values) in &targets.slices {
            if values.len() != rows {
                return Err(EvalError::TargetRows { what: format!("slice '{name}'"), len: values.len(), rows });
            }
        }
        let mut values = std::mem::take(&mut self.values);
        let result = self.score(tensor, columns, targets, &mut values);
        self.values = values;
        result
    }

    fn score(
        &mut self,
        tensor: &Tensor,
        columns: usize,
        targets: &Targets,
        values: &mut Vec<f64>,
    ) -> Result<(), EvalError> {
        let output = self.state.output.clone();
        to_f64(tensor, &output, values)?;
        if let Some((row, value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(EvalError::NotFinite { output, row: row / columns, value: *value });
        }
        let task = match self.state.task {
            Some(task) => task,
            None => self.decide(columns, &targets.labels)?,
        };
        let expected_columns = match task {
            Task::Multiclass { classes } => classes,
            _ => 1,
        };
        if columns != expected_columns {
            return Err(EvalError::Mismatch {
                output,
                reason: format!("has {columns} values per example; earlier batches had {expected_columns}"),
            });
        }
        // Check every label before any state changes: a failed batch adds nothing.
        let rows = targets.rows;
        match (&targets.labels, task) {
            (Labels::Int(labels), Task::Binary) => {
                if let Some((row, l)) = labels.iter().enumerate().find(|(_, l)| **l != 0 && **l != 1) {
                    return Err(EvalError::LabelOutOfRange {
                        label: l.to_string(),
                        row,
                        range: "{0, 1}".into(),
                        task: "binary",
                    });
                }
            }
            (Labels::Int(labels), Task::Multiclass { classes }) => {
                if let Some((row, l)) = labels.iter().enumerate().find(|(_, l)| **l < 0 || **l >= classes as i64) {
                    return Err(EvalError::LabelOutOfRange {
                        label: l.to_string(),
                        row,
                        range: format!("[0, {classes})"),
                        task: "multiclass",
                    });
                }
            }
            (Labels::Matrix { columns: c, .. }, Task::Multiclass { classes }) if *c == classes => {}
            (Labels::Int(_) | Labels::Float(_), Task::Regression) => {}
            (labels, task) => {
                let kind = match labels {
                    Labels::Int(_) => "integer",
                    Labels::Float(_) => "float",
                    Labels::Matrix { .. } => "multi-value",
                };
                return Err(EvalError::Mismatch {
                    output,
                    reason: format!("was scored as a {} task but this batch has {kind} labels", task.name()),
                });
            }
        }
        if self.spec.from_logits {
            match task {
                Task::Binary => values.iter_mut().for_each(|v| *v = sigmoid(*v)),
                Task::Multiclass { .. } => values.chunks_exact_mut(columns).for_each(softmax),
                Task::Regression => {}
            }
        }
        let eps = epsilon(self.output_dtype);
        let tolerance = Tolerance::of(self.output_dtype);
        let (threshold, top_k) = (self.spec.threshold, self.spec.top_k);
        let mut overall = self.state.overall.take().expect("decided");
        let mut slices = std::mem::take(&mut self.state.slices);
        let mut replicates = self.state.replicates.take();
        if let Some(replicates) = &replicates {
            if replicates.spec.by == KeyedBy::Key && targets.keys.as_ref().is_none_or(|k| k.len() != rows) {
                self.state.replicates = Some(replicates.clone());
                self.state.overall = Some(overall);
                self.state.slices = slices;
                return Err(EvalError::TargetRows {
                    what: "the example keys (--ci keyed by --example-key)".into(),
                    len: targets.keys.as_ref().map_or(0, Vec::len),
                    rows,
                });
            }
        }
        let metrics = self.state.metrics.clone();
        let mut slots: Vec<&str> = Vec::with_capacity(slices.len());
        for r in 0..rows {
            let scores = &values[r * columns..(r + 1) * columns];
            let weight = targets.weights.as_ref().map_or(1.0, |w| w[r]);
            let (label, class, soft_label) = match &targets.labels {
                Labels::Int(l) => (l[r] as f64, l[r].max(0) as usize, None),
                Labels::Float(l) => (l[r], 0, None),
                Labels::Matrix { columns: c, values: v } => {
                    let soft = &v[r * c..(r + 1) * c];
                    (0.0, argmax(soft), Some(soft))
                }
            };
            let predicted = if columns > 1 { argmax(scores) } else { 0 };
            if task != Task::Regression {
                self.state.scores.add(scores, columns > 1, tolerance);
            }
            let row = Row { scores, label, class, predicted, soft_label, weight };
            overall.add(&row, threshold, top_k, eps);
            let (truth, guess) = match task {
                Task::Binary => (label as usize, usize::from(scores[0] > threshold)),
                _ => (class, predicted),
            };
            if let Some(confusion) = &mut self.state.confusion {
                confusion[truth][guess] += 1;
            }
            if let Some(top) = &mut self.state.top_confusions {
                top.add((truth, guess));
            }
            for (states, (_, values)) in slices.iter_mut().zip(&targets.slices) {
                let value = values[r].as_str();
                let state = if states.values.contains_key(value) {
                    states.values.get_mut(value).expect("present")
                } else if states.values.len() < MAX_SLICE_VALUES {
                    states.values.entry(value.to_string()).or_insert_with(|| self.slice_state())
                } else {
                    states.other.get_or_insert_with(|| self.slice_state())
                };
                state.add(&row, threshold, top_k, eps);
            }
            if let Some(replicates) = &mut replicates {
                slots.clear();
                for (states, (_, values)) in slices.iter().zip(&targets.slices) {
                    let value = values[r].as_str();
                    slots.push(if states.values.contains_key(value) { value } else { OTHER_SLICE });
                }
                let id = match &targets.keys {
                    Some(keys) if replicates.spec.by == KeyedBy::Key => bootstrap::id_of_key(&keys[r]),
                    _ => bootstrap::id_of_index(targets.first_index + r as u64),
                };
                replicates.add((task, &metrics), id, &row, &slots, threshold, top_k, eps);
            }
        }
        self.state.overall = Some(overall);
        self.state.slices = slices;
        self.state.replicates = replicates;
        self.state.examples += rows as u64;
        Ok(())
    }

    /// Examples scored so far.
    pub fn examples(&self) -> u64 {
        self.state.examples
    }

    /// The metrics so far (cheap enough to call once at the end).
    pub fn finish(&self) -> Evaluation {
        Evaluation::from_state(&self.state)
    }

    /// The metric state so far: what `--data-shard` writes, and what
    /// merges with the states of the other shards.
    pub fn state(&self) -> MetricState {
        self.state.clone()
    }
}
