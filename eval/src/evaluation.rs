//! The metrics of one model on one dataset ([`Evaluation`]): what an
//! evaluator's state finishes into, merged states included, and its JSON
//! as records and reports show it. Apart from the `Evaluator` that feeds
//! the state (`metrics.rs`), so that the result and its wording can be read
//! without the batch-by-batch scoring.

use crate::calibration::ReliabilityDiagram;
use crate::confusion::{TopConfusionsSummary, TOP_CONFUSIONS_SHOWN};
use crate::probabilities::NotProbabilities;
use crate::replicates::Intervals;
use crate::state::task::{metric_values, State};
use crate::state::{MetricState, OTHER_SLICE};
use crate::task::Task;
use std::collections::BTreeMap;

/// The metrics of one model on one dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub examples: u64,
    /// The task (a guess from the output's declared shape when no batch came).
    pub task: Task,
    pub output: String,
    /// The metrics were the task's default, not asked for.
    pub defaulted: bool,
    /// Metric name -> value (NaN where it cannot be computed).
    pub metrics: BTreeMap<String, f64>,
    /// Slice feature -> value -> metric name -> value (plus `examples`).
    pub slices: BTreeMap<String, BTreeMap<String, BTreeMap<String, f64>>>,
    /// Classification tasks up to `--max-confusion-classes` classes:
    /// example counts, rows = true class.
    pub confusion_matrix: Option<Vec<Vec<u64>>>,
    /// A classifier with more classes than `--max-confusion-classes`: its
    /// confusion matrix was not kept (`top_confusions` instead).
    pub confusion_matrix_omitted: bool,
    /// Past `--max-confusion-classes`: the most frequent confusions.
    pub top_confusions: Option<TopConfusionsSummary>,
    /// With `ece`: the reliability diagram of the whole data.
    pub calibration: Option<ReliabilityDiagram>,
    /// Whether auc and pr_auc are exact (not bucketed).
    pub auc_exact: bool,
    /// Whether the slices' auc and pr_auc are exact.
    pub slices_auc_exact: bool,
    /// k of top_k_accuracy.
    pub top_k: usize,
    /// The binary decision threshold.
    pub threshold: f64,
    pub from_logits: bool,
    /// `--ci`: bootstrap intervals of the metrics, overall and per slice.
    pub ci: Option<Intervals>,
    /// A classifier's scores that were not all probabilities: the metrics
    /// that read them as probabilities are NaN, overall and per slice, have
    /// no interval in `ci`, and this says why (`crate::probabilities`).
    pub not_probabilities: Option<NotProbabilities>,
}

fn json_number(v: f64) -> serde_json::Value {
    serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

fn json_metrics(m: &BTreeMap<String, f64>) -> serde_json::Value {
    serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), json_number(*v))).collect())
}

/// `{METRIC: [low, high] | null}`.
fn intervals_json(intervals: &BTreeMap<String, Option<(f64, f64)>>) -> serde_json::Value {
    let object = intervals.iter().map(|(m, ci)| {
        let value = match ci {
            Some((low, high)) => serde_json::json!([json_number(*low), json_number(*high)]),
            None => serde_json::Value::Null,
        };
        (m.clone(), value)
    });
    serde_json::Value::Object(object.collect())
}

/// A slice's metrics, with its `examples` count as an integer (the map
/// holds it as an `f64` beside the metrics).
fn slice_json(m: &BTreeMap<String, f64>) -> serde_json::Value {
    let mut object = json_metrics(m);
    if let (Some(examples), Some(fields)) = (m.get("examples"), object.as_object_mut()) {
        fields.insert("examples".into(), (*examples as u64).into());
    }
    object
}

impl Evaluation {
    /// The metrics of a metric state ([`Evaluator::state`](crate::Evaluator::state), maybe merged
    /// with others): the same as [`Evaluator::finish`](crate::Evaluator::finish) of one pass over all
    /// the examples the state holds.
    pub fn from_state(state: &MetricState) -> Evaluation {
        let task = state.task.unwrap_or(match state.output_columns {
            Some(c) if c >= 2 => Task::Multiclass { classes: c as usize },
            _ => Task::Binary,
        });
        let not_probabilities = NotProbabilities::of(&state.scores, state.examples, task, &state.metrics);
        let left_out = not_probabilities.as_ref().map_or(&[][..], |n| &n.left_out[..]);
        let leave_out = |m: &mut BTreeMap<String, f64>| {
            for metric in left_out {
                if let Some(value) = m.get_mut(metric.name()) {
                    *value = f64::NAN;
                }
            }
        };
        let mut metrics = state.overall.as_ref().map(|s| metric_values(s, &state.metrics)).unwrap_or_default();
        leave_out(&mut metrics);
        let mut slices = BTreeMap::new();
        let mut slices_exact = true;
        for (name, states) in state.slice_names.iter().zip(&state.slices) {
            let mut by_value = BTreeMap::new();
            for (value, slice) in
                states.values.iter().map(|(v, s)| (v.as_str(), s)).chain(states.other.iter().map(|s| (OTHER_SLICE, s)))
            {
                let mut m = metric_values(slice, &state.metrics);
                leave_out(&mut m);
                m.insert("examples".into(), slice.examples() as f64);
                slices_exact &= slice.exact();
                by_value.insert(value.to_string(), m);
            }
            slices.insert(name.clone(), by_value);
        }
        // A metric left out has no interval either: no entry, as one no replicate computes.
        let mut ci = state.replicates.as_ref().map(|r| r.intervals(&state.metrics, &state.slice_names));
        if let Some(ci) = &mut ci {
            for metric in left_out {
                let name = metric.name();
                for intervals in
                    std::iter::once(&mut ci.overall).chain(ci.slices.values_mut().flat_map(|v| v.values_mut()))
                {
                    intervals.remove(name);
                }
                ci.values.remove(name);
            }
        }
        let calibration = match not_probabilities {
            Some(_) => None,
            None => state.overall.as_ref().and_then(State::calibration).map(|c| c.diagram()),
        };
        Evaluation {
            examples: state.examples,
            task,
            output: state.output.clone(),
            defaulted: state.requested.is_empty(),
            metrics,
            slices,
            confusion_matrix: state.confusion.clone(),
            confusion_matrix_omitted: matches!(task, Task::Multiclass { classes } if classes > state.max_confusion_classes),
            top_confusions: state.top_confusions.as_ref().map(|t| t.summary(TOP_CONFUSIONS_SHOWN)),
            calibration,
            auc_exact: state.overall.as_ref().is_none_or(State::exact),
            slices_auc_exact: slices_exact,
            top_k: state.top_k,
            threshold: state.threshold,
            from_logits: state.from_logits,
            ci,
            not_probabilities,
        }
    }

    /// `{"examples", "task", "classes"?, "output", "metrics_defaulted",
    /// "metrics": {..}, "slices": {..}, "confusion_matrix": [[..]] | null,
    /// "confusion_matrix_omitted"?: true, "top_confusions"?: [{"true",
    /// "predicted", "count"}], "top_confusions_exact"?, "top_confusions_max_error"?,
    /// "calibration"?: {"bins", "edges", "count", "weight", "confidence", "accuracy"},
    /// "auc_exact", "slices_auc_exact",
    /// "threshold" (binary), "top_k" (multiclass), "from_logits" (both),
    /// "not_probabilities"?: {"examples", "of", "min", "max", "row_sums"?,
    /// "left_out", "message"}}`; NaN is `null`; a slice's `examples` is an
    /// integer.
    pub fn to_json(&self) -> serde_json::Value {
        let mut object = serde_json::Map::new();
        object.insert("examples".into(), self.examples.into());
        object.insert("task".into(), self.task.name().into());
        if let Task::Multiclass { classes } = self.task {
            object.insert("classes".into(), classes.into());
        }
        object.insert("output".into(), self.output.clone().into());
        object.insert("metrics_defaulted".into(), self.defaulted.into());
        object.insert("metrics".into(), json_metrics(&self.metrics));
        if let Some(found) = &self.not_probabilities {
            object.insert("not_probabilities".into(), found.to_json(&self.output));
        }
        let slices = self
            .slices
            .iter()
            .map(|(feature, values)| {
                let values = values
                    .iter()
                    .map(|(v, m)| {
                        let mut slice = slice_json(m);
                        let ci = self.ci.as_ref().and_then(|ci| ci.slices.get(feature)?.get(v));
                        if let (Some(ci), Some(fields)) = (ci, slice.as_object_mut()) {
                            fields.insert("ci".into(), intervals_json(ci));
                        }
                        (v.clone(), slice)
                    })
                    .collect();
                (feature.clone(), serde_json::Value::Object(values))
            })
            .collect();
        object.insert("slices".into(), serde_json::Value::Object(slices));
        if let Some(ci) = &self.ci {
            object.insert("ci".into(), intervals_json(&ci.overall));
            object.insert("ci_level".into(), json_number(ci.spec.level));
            object.insert(
                "bootstrap".into(),
                serde_json::json!({
                    "replicates": ci.spec.bootstrap.replicates,
                    "seed": ci.spec.bootstrap.seed,
                    "by": ci.spec.by.name(),
                }),
            );
            let values = ci
                .values
                .iter()
                .map(|(m, v)| (m.clone(), serde_json::Value::Array(v.iter().map(|x| json_number(*x)).collect())))
                .collect();
            object.insert("bootstrap_values".into(), serde_json::Value::Object(values));
        }
        object.insert(
            "confusion_matrix".into(),
            self.confusion_matrix.as_ref().map_or(serde_json::Value::Null, |m| serde_json::json!(m)),
        );
        if self.confusion_matrix_omitted {
            object.insert("confusion_matrix_omitted".into(), true.into());
        }
        if let Some(top) = &self.top_confusions {
            object.insert("top_confusions".into(), top.to_json());
            object.insert("top_confusions_exact".into(), top.exact.into());
            if !top.exact {
                object.insert("top_confusions_max_error".into(), top.max_error.into());
            }
        }
        if let Some(calibration) = &self.calibration {
            object.insert("calibration".into(), calibration.to_json());
        }
        object.insert("auc_exact".into(), self.auc_exact.into());
        object.insert("slices_auc_exact".into(), self.slices_auc_exact.into());
        // Only the settings that apply to the task: k to top_k_accuracy
        // (multiclass), the decision threshold to binary, logits to both.
        match self.task {
            Task::Binary => {
                object.insert("threshold".into(), json_number(self.threshold));
                object.insert("from_logits".into(), self.from_logits.into());
            }
            Task::Multiclass { .. } => {
                object.insert("top_k".into(), self.top_k.into());
                object.insert("from_logits".into(), self.from_logits.into());
            }
            Task::Regression => {}
        }
        serde_json::Value::Object(object)
    }
}
