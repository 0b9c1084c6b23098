//! Bootstrap replicates of a model's metric state (`eval --ci`): one more
//! [`State`] per replicate, overall and per slice value, updated in the same
//! streaming pass as the real state. Replicate `r` counts each example
//! [`Bootstrap::weight`]`(id, r)` times (a Poisson(1) weight, multiplied into
//! the row's own `--weight`); the interval of a metric is
//! [`percentile_interval`] of its replicate values. Nothing is resampled and
//! nothing is stored per example.
//!
//! Cost. Per row the R weights are drawn once ([`Bootstrap::weights`]), and
//! replicates whose weight is 0 (e⁻¹ ≈ 37% of them) are skipped. Counts and
//! sums cost a few `ExactSum`s per replicate (hundreds of bytes). An AUC
//! curve is the expensive part: the real state keeps up to 2^18 distinct
//! scores, and a replicate doing the same would cost as much as the whole
//! state, 200 times over. A replicate's curve is therefore bounded to
//! [`REPLICATE_AUC_CAP`] (2^11) distinct scores over all its classes (at
//! least 2^6 per class), then as many buckets: at most ~64 KiB per replicate
//! while exact and 32 KiB once bucketed, so 200 replicates stay under ~13 MiB
//! whatever the dataset's size. Slice values' replicates (binary tasks, as
//! for the real slices) keep at most [`REPLICATE_SLICE_AUC_CAP`] (2^8). Past
//! the cap a replicate's AUC is bucketed (scores in one bucket count as
//! tied): the interval is then approximate by about the bucket width, while
//! the metric itself stays exact.
//!
//! Memory: R × (the overall state + one state per slice value), independent
//! of the number of examples.
//!
//! Shards. Replicates merge across `--data-shard` shards like the real
//! state (their JSON is part of the metric state's). With `--example-key`
//! an example's weights depend on its key only, so merged shards give the
//! intervals of one pass exactly (to rounding); without it they are keyed by
//! the index within each shard, so a merged interval is a valid bootstrap
//! interval but not the one a single machine draws.

use crate::bootstrap::{percentile_interval, Bootstrap};
use crate::state::{metric_values, state_from_json, state_json, Row, State};
use crate::task::{Metric, Task};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};

/// Distinct scores (then buckets) of one replicate's AUC curves, over all classes.
pub const REPLICATE_AUC_CAP: usize = 1 << 11;
/// Distinct scores (then buckets) of a slice value replicate's AUC curve.
pub const REPLICATE_SLICE_AUC_CAP: usize = 1 << 8;
/// The version of the replicates' JSON inside the metric state.
pub const REPLICATES_VERSION: u64 = 1;

/// What an example's bootstrap weights are keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyedBy {
    /// Its 0-based index in what is read (a shard's own with `--data-shard`).
    Index,
    /// Its `--example-key` value.
    Key,
}

impl KeyedBy {
    /// `index` or `key`, as records write it.
    pub fn name(self) -> &'static str {
        match self {
            KeyedBy::Index => "index",
            KeyedBy::Key => "key",
        }
    }

    fn parse(text: &str) -> Option<KeyedBy> {
        match text {
            "index" => Some(KeyedBy::Index),
            "key" => Some(KeyedBy::Key),
            _ => None,
        }
    }
}

/// `--ci LEVEL --bootstrap N --bootstrap-seed S`, and what weights are keyed by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CiSpec {
    pub bootstrap: Bootstrap,
    /// In (0, 1): 0.95 for a 95% interval.
    pub level: f64,
    pub by: KeyedBy,
}

/// The replicate states of one model.
#[derive(Debug, Clone)]
pub(crate) struct Replicates {
    pub(crate) spec: CiSpec,
    /// R states; empty until the first batch decides the task.
    overall: Vec<State>,
    /// Per slice feature: slice value (or `__other__`, as the real state
    /// routes it) -> R states.
    slices: Vec<HashMap<String, Vec<State>>>,
    /// Scratch: the current row's weights.
    weights: Vec<u32>,
}

/// The intervals of one evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Intervals {
    pub spec: CiSpec,
    /// Metric -> [low, high] (`None` where no replicate could compute it).
    pub overall: BTreeMap<String, Option<(f64, f64)>>,
    /// Metric -> each replicate's value (NaN where it could not be computed).
    pub values: BTreeMap<String, Vec<f64>>,
    /// Slice feature -> value -> metric -> [low, high].
    pub slices: BTreeMap<String, BTreeMap<String, BTreeMap<String, Option<(f64, f64)>>>>,
}

fn curve_caps(task: Task, wants_curves: bool, slice: bool) -> Option<(usize, usize)> {
    if !wants_curves {
        return None;
    }
    if slice {
        return (task == Task::Binary).then_some((REPLICATE_SLICE_AUC_CAP, REPLICATE_SLICE_AUC_CAP));
    }
    let curves = match task {
        Task::Multiclass { classes } => classes,
        _ => 1,
    };
    let cap = (REPLICATE_AUC_CAP / curves).max(1 << 6);
    Some((cap, cap))
}

impl Replicates {
    pub(crate) fn new(spec: CiSpec, slice_features: usize) -> Replicates {
        Replicates { spec, overall: Vec::new(), slices: vec![HashMap::new(); slice_features], weights: Vec::new() }
    }

    fn fresh(&self, task: Task, metrics: &[Metric], slice: bool) -> Vec<State> {
        let wants_curves = metrics.iter().any(|m| matches!(m, Metric::Auc | Metric::PrAuc));
        let caps = curve_caps(task, wants_curves, slice);
        (0..self.spec.bootstrap.replicates).map(|_| State::new(task, caps)).collect()
    }

    /// Adds one example (identity `id`) to every replicate whose weight is
    /// not 0; `slots` are its slice values as the real state routed them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add(
        &mut self,
        (task, metrics): (Task, &[Metric]),
        id: u64,
        row: &Row<'_>,
        slots: &[&str],
        threshold: f64,
        top_k: usize,
        eps: f64,
    ) {
        if self.overall.is_empty() {
            self.overall = self.fresh(task, metrics, false);
        }
        let mut weights = std::mem::take(&mut self.weights);
        self.spec.bootstrap.weights(id, &mut weights);
        let weighted = |w: u32| Row {
            scores: row.scores,
            label: row.label,
            class: row.class,
            predicted: row.predicted,
            soft_label: row.soft_label,
            weight: row.weight * f64::from(w),
        };
        for (state, &w) in self.overall.iter_mut().zip(&weights) {
            if w != 0 {
                state.add(&weighted(w), threshold, top_k, eps);
            }
        }
        for f in 0..self.slices.len() {
            let slot = slots[f];
            if !self.slices[f].contains_key(slot) {
                let fresh = self.fresh(task, metrics, true);
                self.slices[f].insert(slot.to_string(), fresh);
            }
            let states = self.slices[f].get_mut(slot).expect("present");
            for (state, &w) in states.iter_mut().zip(&weights) {
                if w != 0 {
                    state.add(&weighted(w), threshold, top_k, eps);
                }
            }
        }
        self.weights = weights;
    }

    /// Adds the replicates of other examples with the same settings.
    pub(crate) fn merge(&mut self, other: &Replicates, slot_of: &dyn Fn(usize, &str) -> String) -> Result<(), String> {
        if self.spec != other.spec {
            return Err(format!("their bootstrap settings differ ({:?} against {:?})", self.spec, other.spec));
        }
        if self.slices.len() != other.slices.len() {
            return Err("replicates of different slice features".into());
        }
        match (self.overall.is_empty(), other.overall.is_empty()) {
            (_, true) => {}
            (true, false) => self.overall = other.overall.clone(),
            (false, false) => {
                for (mine, theirs) in self.overall.iter_mut().zip(&other.overall) {
                    mine.merge(theirs)?;
                }
            }
        }
        for (f, (mine, theirs)) in self.slices.iter_mut().zip(&other.slices).enumerate() {
            let mut values: Vec<(&String, &Vec<State>)> = theirs.iter().collect();
            values.sort_by(|a, b| a.0.cmp(b.0));
            for (value, states) in values {
                match mine.get_mut(&slot_of(f, value)) {
                    Some(target) => {
                        for (m, t) in target.iter_mut().zip(states) {
                            m.merge(t)?;
                        }
                    }
                    None => {
                        mine.insert(slot_of(f, value), states.clone());
                    }
                }
            }
        }
        Ok(())
    }

    /// The intervals of every metric, overall and per slice value.
    pub(crate) fn intervals(&self, metrics: &[Metric], slice_names: &[String]) -> Intervals {
        let level = self.spec.level;
        let values_of = |states: &[State]| -> BTreeMap<String, Vec<f64>> {
            let per_replicate: Vec<BTreeMap<String, f64>> = states.iter().map(|s| metric_values(s, metrics)).collect();
            metrics
                .iter()
                .map(|m| (m.name().to_string(), per_replicate.iter().map(|v| v[m.name()]).collect()))
                .collect()
        };
        let interval_of = |values: &BTreeMap<String, Vec<f64>>| -> BTreeMap<String, Option<(f64, f64)>> {
            values.iter().map(|(m, v)| (m.clone(), percentile_interval(v, level))).collect()
        };
        let values = values_of(&self.overall);
        let overall = interval_of(&values);
        let slices = slice_names
            .iter()
            .zip(&self.slices)
            .map(|(name, by_value)| {
                let by_value = by_value.iter().map(|(v, states)| (v.clone(), interval_of(&values_of(states)))).collect();
                (name.clone(), by_value)
            })
            .collect();
        Intervals { spec: self.spec, overall, values, slices }
    }

    pub(crate) fn to_json(&self) -> Value {
        let slices: Vec<Value> = self
            .slices
            .iter()
            .map(|by_value| {
                let mut values: Vec<(&String, &Vec<State>)> = by_value.iter().collect();
                values.sort_by(|a, b| a.0.cmp(b.0));
                let object: Map<String, Value> = values
                    .into_iter()
                    .map(|(v, states)| (v.clone(), states.iter().map(state_json).collect()))
                    .collect();
                Value::Object(object)
            })
            .collect();
        json!({
            "version": REPLICATES_VERSION,
            "replicates": self.spec.bootstrap.replicates,
            "seed": self.spec.bootstrap.seed,
            "by": self.spec.by.name(),
            "level": self.spec.level,
            "overall": self.overall.iter().map(state_json).collect::<Vec<_>>(),
            "slices": slices,
        })
    }

    pub(crate) fn from_json(value: &Value, task: Option<Task>, slice_features: usize) -> Result<Replicates, String> {
        if value["version"].as_u64() != Some(REPLICATES_VERSION) {
            return Err(format!(
                "replicates version {}; this isorun reads version {REPLICATES_VERSION}",
                value["version"]
            ));
        }
        let replicates = value["replicates"]
            .as_u64()
            .filter(|r| (1..=u64::from(crate::bootstrap::MAX_REPLICATES)).contains(r))
            .ok_or("replicates: no valid \"replicates\" count")? as u32;
        let seed = value["seed"].as_u64().ok_or("replicates: no \"seed\"")?;
        let by = value["by"].as_str().and_then(KeyedBy::parse).ok_or("replicates: \"by\" is not index or key")?;
        let level = value["level"].as_f64().filter(|l| *l > 0.0 && *l < 1.0).ok_or("replicates: no valid \"level\"")?;
        let spec = CiSpec { bootstrap: Bootstrap { replicates, seed }, level, by };
        let mut out = Replicates::new(spec, slice_features);
        let states = |list: &Value, what: &str| -> Result<Vec<State>, String> {
            let list = list.as_array().ok_or_else(|| format!("replicates: {what} is not a list"))?;
            if list.is_empty() {
                return Ok(Vec::new());
            }
            let task = task.ok_or("replicates of a state that saw no examples")?;
            if list.len() != replicates as usize {
                return Err(format!("replicates: {what} has {} states for {replicates} replicates", list.len()));
            }
            list.iter().map(|s| state_from_json(s, task).map_err(|e| format!("replicates: {what}: {e}"))).collect()
        };
        out.overall = states(&value["overall"], "overall")?;
        let slices = value["slices"].as_array().map(Vec::as_slice).unwrap_or_default();
        if slices.len() != slice_features {
            return Err(format!("replicates: {} slice features for {slice_features}", slices.len()));
        }
        for (f, feature) in slices.iter().enumerate() {
            let object = feature.as_object().ok_or("replicates: a slice feature is not an object")?;
            for (v, list) in object {
                out.slices[f].insert(v.clone(), states(list, &format!("slice value {v}"))?);
            }
        }
        Ok(out)
    }
}

/// The paired change of a metric against a baseline's replicates of the
/// same examples: `new_r − base_r` per replicate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairedChange {
    /// [low, high] of the replicate deltas at the level.
    pub interval: (f64, f64),
    /// Two-sided bootstrap p: min(1, 2·min(P(δ ≤ 0), P(δ ≥ 0))).
    pub p: f64,
    /// The interval excludes 0.
    pub significant: bool,
}

/// The paired change of replicate values `new` against `base` (the same
/// replicates of the same examples), NaN pairs left out; `None` when the
/// lengths differ or no pair is left.
pub fn paired_change(new: &[f64], base: &[f64], level: f64) -> Option<PairedChange> {
    if new.len() != base.len() {
        return None;
    }
    let deltas: Vec<f64> = new.iter().zip(base).map(|(n, b)| n - b).filter(|d| !d.is_nan()).collect();
    let interval = percentile_interval(&deltas, level)?;
    let n = deltas.len() as f64;
    let at_most = deltas.iter().filter(|d| **d <= 0.0).count() as f64 / n;
    let at_least = deltas.iter().filter(|d| **d >= 0.0).count() as f64 / n;
    let p = (2.0 * at_most.min(at_least)).min(1.0);
    Some(PairedChange { interval, p, significant: interval.0 > 0.0 || interval.1 < 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_change_is_significant_only_when_the_interval_excludes_zero() {
        let base = vec![0.5; 100];
        let shifted: Vec<f64> = (0..100).map(|i| 0.45 + f64::from(i) * 1e-4).collect();
        let change = paired_change(&shifted, &base, 0.95).unwrap();
        assert!(change.significant && change.interval.1 < 0.0 && change.p == 0.0, "{change:?}");
        let noise: Vec<f64> = (0..100).map(|i| 0.5 + (f64::from(i) - 49.5) * 1e-4).collect();
        let change = paired_change(&noise, &base, 0.95).unwrap();
        assert!(!change.significant && (change.p - 1.0).abs() < 1e-12, "{change:?}");
        assert_eq!(paired_change(&[1.0], &[1.0, 2.0], 0.95), None);
    }
}
