//! The metric state of one model ([`MetricState`]): the per-task states
//! (overall and per slice value), the confusion matrix or top confusions,
//! the check of the scores and the bootstrap replicates, with the checks
//! that two states may merge (same output, metrics and settings) and the
//! merge itself. The per-task arithmetic lives in `task`, the JSON in
//! `codec`; this file holds what ties them into one model's state.

use super::limits::{MAX_CONFUSION_CLASSES, MAX_SLICE_VALUES, OTHER_SLICE};
use super::task::State;
use crate::accumulator::{added, Accumulator};
use crate::confusion::TopConfusions;
use crate::probabilities::ScoreCheck;
use crate::replicates::Replicates;
use crate::task::{Metric, Task};
use std::collections::HashMap;

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
}
