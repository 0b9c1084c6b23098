//! Bootstrap replicates of a model's metric state (`eval --ci`): the sums of
//! one more metric state per replicate, overall and per slice value, updated in the same
//! streaming pass as the real state. Replicate `r` counts each example
//! [`Bootstrap::weight`]`(id, r)` times (a Poisson(1) weight, multiplied into
//! the row's own `--weight`); the interval of a metric is
//! [`percentile_interval`] of its replicate values. Nothing is resampled and
//! nothing is stored per example.
//!
//! Cost. A replicate is not a full `State` (whose `ExactSum`s would cost a
//! loop and an allocation per term, R times per row) but plain `f64` sums,
//! laid out field by field over the replicates (`values[field × R + r]`), so
//! a row is one pass over its few non-zero contributions, each a
//! multiply-add over the R weights (drawn once per row,
//! [`Bootstrap::weights`]); the metrics of a replicate are computed at the
//! end by the real state's code (`State::from_plain`); where each sum sits
//! in that list is `crate::state::task::PlainLayout`, the one definition
//! both sides use. Plain sums round:
//! a replicate's metric is exact to ~1e-15 relative, not to the bit.
//!
//! AUC. The real state's curve keeps up to 2^18 distinct scores; a
//! replicate doing the same would cost as much as the whole state, 200
//! times over. The replicates of one curve share one table of distinct
//! scores (one lookup per row) and keep only counts: positive and negative
//! weight per score per replicate (16 bytes × R per score), at most
//! [`REPLICATE_AUC_CAP`] (2^11) scores over all of a state's classes (at
//! least 2^6 per class), then as many buckets (over [0, 1] for
//! probabilities, else the range seen): 2^11 × 16 bytes × 200 replicates =
//! 6.3 MiB at most, whatever the dataset's size. A slice value's replicates
//! (binary tasks, as for the real slices) keep at most
//! [`REPLICATE_SLICE_AUC_CAP`] (2^8). Past the cap a replicate's AUC is that
//! of bucketed scores (scores in one bucket tie): the interval is then
//! approximate by about a bucket's width, while the metric itself stays
//! exact.
//!
//! Memory: R × (the overall state + one state per slice value), independent
//! of the number of examples.
//!
//! Shards. Replicates merge across `--data-shard` shards like the real
//! state (their JSON is part of the metric state's). With `--example-key`
//! an example's weights depend on its key only, so merged shards give the
//! intervals of one pass (to rounding, ~1e-15); without it they are keyed by
//! the index within each shard, so a merged interval is a valid bootstrap
//! interval but not the one a single machine draws.

use crate::accumulator::Accumulator;
use crate::bootstrap::{percentile_interval, Bootstrap};
use crate::curve::Curve;
use crate::state::task::{metric_values, multiclass_log_loss, Cell, PlainLayout, Row, State, SumField};
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
    /// `None` until the first batch decides the task.
    overall: Option<Lean>,
    /// Per slice feature: slice value (or `__other__`, as the real state
    /// routes it) -> its replicates.
    slices: Vec<HashMap<String, Lean>>,
    /// Scratch: the current row's weights, as drawn and as floats.
    weights: Vec<u32>,
    floats: Vec<f64>,
}

/// Metric -> [low, high]; a metric no replicate could compute has no entry
/// (`None` only where the caller withdrew an interval afterwards).
pub type MetricIntervals = BTreeMap<String, Option<(f64, f64)>>;

/// The intervals of one evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Intervals {
    pub spec: CiSpec,
    /// Metric -> [low, high] (no entry where no replicate could compute it).
    pub overall: MetricIntervals,
    /// Metric -> each replicate's value (NaN where it could not be computed).
    pub values: BTreeMap<String, Vec<f64>>,
    /// Slice feature -> value -> metric -> [low, high].
    pub slices: BTreeMap<String, BTreeMap<String, MetricIntervals>>,
}

/// The replicates of one state: plain sums, field by field over the replicates.
#[derive(Debug, Clone)]
struct Lean {
    task: Task,
    /// Where each of the task's sums sits in `values` (per replicate).
    layout: PlainLayout,
    replicates: usize,
    /// `values[field × R + r]`.
    values: Vec<f64>,
    /// Examples with a non-zero weight, per replicate.
    examples: Vec<u64>,
    /// Multiclass: `present[class × R + r]`.
    present: Vec<bool>,
    /// One per AUC curve (binary 1, multiclass one per class), or none.
    curves: Vec<SharedCurve>,
}

/// `acc[r] += weights[r] × c` for every replicate.
fn axpy(acc: &mut [f64], weights: &[f64], c: f64) {
    for (a, w) in acc.iter_mut().zip(weights) {
        *a += w * c;
    }
}

impl Lean {
    fn new(task: Task, replicates: usize, curves: Option<(usize, usize)>) -> Lean {
        let classes = match task {
            Task::Multiclass { classes } => classes,
            _ => 0,
        };
        let layout = PlainLayout::of(task);
        Lean {
            task,
            layout,
            replicates,
            values: vec![0.0; layout.len() * replicates],
            examples: vec![0; replicates],
            present: vec![false; classes * replicates],
            curves: curves.map(|(count, cap)| (0..count).map(|_| SharedCurve::new(cap)).collect()).unwrap_or_default(),
        }
    }

    fn field(&mut self, f: usize) -> &mut [f64] {
        &mut self.values[f * self.replicates..(f + 1) * self.replicates]
    }

    /// Adds a row weighted `weights[r]` (× its own weight) in replicate r,
    /// with the contributions `State::add` computes for it.
    fn add(&mut self, row: &Row<'_>, weights: &[f64], drawn: &[u32], (threshold, top_k, eps): (f64, usize, f64)) {
        let wt = row.weight;
        let r_count = self.replicates;
        let layout = self.layout;
        for (e, w) in self.examples.iter_mut().zip(drawn) {
            *e += u64::from(*w != 0);
        }
        let sums = |lean: &mut Lean, p: f64, y: f64| {
            let error = p - y;
            for (f, c) in [
                (SumField::Weight, wt),
                (SumField::Prediction, wt * p),
                (SumField::Label, wt * y),
                (SumField::LabelSquared, wt * y * y),
                (SumField::SquaredError, wt * error * error),
                (SumField::AbsoluteError, wt * error.abs()),
            ] {
                if c != 0.0 {
                    axpy(lean.field(layout.sum(f)), weights, c);
                }
            }
        };
        match self.task {
            Task::Binary => {
                let p = row.scores[0];
                let positive = row.label == 1.0;
                let q = if positive { p } else { 1.0 - p };
                sums(self, p, row.label);
                axpy(self.field(layout.sum(SumField::LogLoss)), weights, -wt * q.clamp(eps, 1.0 - eps).ln());
                axpy(self.field(layout.cell(Cell::of(positive, p > threshold))), weights, wt);
                if let Some(curve) = self.curves.first_mut() {
                    curve.add(p, positive, wt, weights, r_count);
                }
            }
            Task::Multiclass { .. } => {
                let (class, predicted, scores) = (row.class, row.predicted, row.scores);
                axpy(self.field(layout.sum(SumField::Weight)), weights, wt);
                if predicted == class {
                    axpy(self.field(layout.correct()), weights, wt);
                    axpy(self.field(layout.tp(class)), weights, wt);
                } else {
                    axpy(self.field(layout.fn_(class)), weights, wt);
                    axpy(self.field(layout.fp(predicted)), weights, wt);
                }
                if scores.iter().filter(|&&v| v > scores[class]).count() < top_k {
                    axpy(self.field(layout.top_k()), weights, wt);
                }
                let loss = multiclass_log_loss(row, eps);
                axpy(self.field(layout.sum(SumField::LogLoss)), weights, wt * loss);
                for c in [class, predicted] {
                    for (present, w) in self.present[c * r_count..(c + 1) * r_count].iter_mut().zip(drawn) {
                        *present |= *w != 0;
                    }
                }
                for (c, curve) in self.curves.iter_mut().enumerate() {
                    curve.add(scores[c], c == class, wt, weights, r_count);
                }
            }
            Task::Regression => sums(self, row.scores[0], row.label),
        }
    }

    fn merge(&mut self, other: &Lean) -> Result<(), String> {
        if self.task != other.task || self.values.len() != other.values.len() || self.curves.len() != other.curves.len()
        {
            return Err("replicates of different tasks or curves".into());
        }
        for (a, b) in self.examples.iter_mut().zip(&other.examples) {
            *a = crate::accumulator::added("replicate examples", *a, *b)?;
        }
        self.values.iter_mut().zip(&other.values).for_each(|(a, b)| *a += b);
        self.present.iter_mut().zip(&other.present).for_each(|(a, b)| *a |= b);
        for (mine, theirs) in self.curves.iter_mut().zip(&other.curves) {
            mine.merge(theirs, self.replicates);
        }
        Ok(())
    }

    /// Replicate r as a `State`, for the metrics' own code.
    fn state(&self, r: usize) -> State {
        let n = self.replicates;
        let values: Vec<f64> = (0..self.values.len() / n).map(|f| self.values[f * n + r]).collect();
        let present: Vec<bool> = (0..self.present.len() / n).map(|c| self.present[c * n + r]).collect();
        let curves = (!self.curves.is_empty()).then(|| self.curves.iter().map(|c| c.curve(r, n)).collect());
        State::from_plain(self.task, self.examples[r], &values, &present, curves)
    }

    fn to_json(&self) -> Value {
        let mut o = Map::new();
        o.insert("examples".into(), json!(self.examples));
        o.insert("values".into(), json!(self.values));
        if !self.present.is_empty() {
            o.insert("present".into(), self.present.iter().map(|&p| u8::from(p)).collect());
        }
        if !self.curves.is_empty() {
            o.insert("curves".into(), self.curves.iter().map(SharedCurve::to_json).collect());
        }
        Value::Object(o)
    }

    /// The replicates of [`Lean::to_json`]'s JSON, of `task` with
    /// `replicates` replicates and `curves` as [`Lean::new`] takes them.
    /// Every list's length is checked against the JSON before anything is
    /// allocated: the sizes (classes × replicates) are what a file claims,
    /// and must be backed by that many numbers in it.
    fn from_json(value: &Value, task: Task, replicates: usize, curves: Option<(usize, usize)>) -> Result<Lean, String> {
        let classes = match task {
            Task::Multiclass { classes } => classes,
            _ => 0,
        };
        // `None` when the product passes usize: no JSON list is that long.
        let sized = |key: &str, n: Option<usize>| -> Result<&Vec<Value>, String> {
            let what = n.map_or_else(|| "more than fit in memory".to_string(), |n| n.to_string());
            value[key]
                .as_array()
                .filter(|list| Some(list.len()) == n)
                .ok_or_else(|| format!("\"{key}\" is not {what} entries"))
        };
        let values = sized("values", PlainLayout::of(task).len().checked_mul(replicates))?;
        let values =
            values.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>().ok_or("\"values\" holds a non-number")?;
        let examples = sized("examples", Some(replicates))?;
        let examples =
            examples.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>().ok_or("\"examples\" holds a non-count")?;
        let present = if classes == 0 {
            Vec::new()
        } else {
            let flags = sized("present", classes.checked_mul(replicates))?;
            flags
                .iter()
                .map(|p| p.as_u64().map(|p| p != 0))
                .collect::<Option<Vec<bool>>>()
                .ok_or("\"present\" holds a non-flag")?
        };
        let curves = match curves {
            None => Vec::new(),
            Some((count, cap)) => {
                let list = sized("curves", Some(count))?;
                let mut curves = Vec::with_capacity(list.len());
                for v in list {
                    let mut curve = SharedCurve::new(cap);
                    curve.read_json(v, replicates)?;
                    curves.push(curve);
                }
                curves
            }
        };
        Ok(Lean { task, layout: PlainLayout::of(task), replicates, values, examples, present, curves })
    }
}

/// Positive and negative weight per score per replicate, the distinct
/// scores shared by every replicate, capped then bucketed.
#[derive(Debug, Clone)]
struct SharedCurve {
    cap: usize,
    /// Exact: a score's bits -> its slot.
    slots: HashMap<u64, usize>,
    /// A slot's score (bucketed: the bucket's middle).
    scores: Vec<f64>,
    /// `counts[(slot × 2 + negative) × R + r]`.
    counts: Vec<f64>,
    /// Bucketed over [low, high] (`cap` buckets).
    buckets: Option<(f64, f64)>,
}

impl SharedCurve {
    fn new(cap: usize) -> SharedCurve {
        SharedCurve { cap: cap.max(2), slots: HashMap::new(), scores: Vec::new(), counts: Vec::new(), buckets: None }
    }

    fn bucket(&self, (low, high): (f64, f64), score: f64) -> usize {
        let at = ((score - low) / (high - low) * self.cap as f64).floor();
        if at.is_nan() {
            0
        } else {
            (at.max(0.0) as usize).min(self.cap - 1)
        }
    }

    fn switch_to_buckets(&mut self, n: usize, range: Option<(f64, f64)>) {
        let (low, high) = range.unwrap_or_else(|| {
            let (l, h) =
                self.scores.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), s| (l.min(*s), h.max(*s)));
            if l >= 0.0 && h <= 1.0 {
                (0.0, 1.0)
            } else {
                (l, h)
            }
        });
        let mut counts = vec![0.0; self.cap * 2 * n];
        for (slot, score) in self.scores.iter().enumerate() {
            let b = self.bucket((low, high), *score);
            for j in 0..2 {
                let (from, to) = ((slot * 2 + j) * n, (b * 2 + j) * n);
                for r in 0..n {
                    counts[to + r] += self.counts[from + r];
                }
            }
        }
        self.scores = (0..self.cap).map(|i| low + (i as f64 + 0.5) / self.cap as f64 * (high - low)).collect();
        self.counts = counts;
        self.slots = HashMap::new();
        self.buckets = Some((low, high));
    }

    fn slot(&mut self, score: f64, n: usize) -> usize {
        if let Some(range) = self.buckets {
            return self.bucket(range, score);
        }
        let key = (score + 0.0).to_bits();
        if let Some(&slot) = self.slots.get(&key) {
            return slot;
        }
        if self.scores.len() < self.cap {
            let slot = self.scores.len();
            self.slots.insert(key, slot);
            self.scores.push(score);
            self.counts.resize(self.counts.len() + 2 * n, 0.0);
            return slot;
        }
        self.scores.push(score);
        self.counts.resize(self.counts.len() + 2 * n, 0.0);
        self.switch_to_buckets(n, None);
        self.bucket(self.buckets.expect("bucketed"), score)
    }

    fn add(&mut self, score: f64, positive: bool, weight: f64, weights: &[f64], n: usize) {
        let slot = self.slot(score, n);
        let at = (slot * 2 + usize::from(!positive)) * n;
        axpy(&mut self.counts[at..at + n], weights, weight);
    }

    fn merge(&mut self, other: &SharedCurve, n: usize) {
        if let (None, Some(range)) = (self.buckets, other.buckets) {
            self.switch_to_buckets(n, Some(range));
        }
        for (slot, score) in other.scores.iter().enumerate() {
            let mine = self.slot(*score, n);
            for j in 0..2 {
                let (to, from) = ((mine * 2 + j) * n, (slot * 2 + j) * n);
                for r in 0..n {
                    self.counts[to + r] += other.counts[from + r];
                }
            }
        }
    }

    /// Replicate r's curve.
    fn curve(&self, r: usize, n: usize) -> Curve {
        let mut curve = Curve::new(self.scores.len().max(1), self.cap);
        for (slot, score) in self.scores.iter().enumerate() {
            let (pos, neg) = (self.counts[slot * 2 * n + r], self.counts[(slot * 2 + 1) * n + r]);
            if pos != 0.0 {
                curve.add((*score, true, pos));
            }
            if neg != 0.0 {
                curve.add((*score, false, neg));
            }
        }
        curve
    }

    fn to_json(&self) -> Value {
        json!({"scores": self.scores, "counts": self.counts, "buckets": self.buckets.map(|(l, h)| [l, h])})
    }

    fn read_json(&mut self, value: &Value, n: usize) -> Result<(), String> {
        let numbers = |key: &str| -> Option<Vec<f64>> { value[key].as_array()?.iter().map(Value::as_f64).collect() };
        let scores = numbers("scores").ok_or("a curve without \"scores\"")?;
        let counts = numbers("counts")
            .filter(|c| c.len() == scores.len() * 2 * n)
            .ok_or("a curve's counts do not match its scores")?;
        self.buckets = match value["buckets"].as_array() {
            Some(b) if b.len() == 2 => Some((b[0].as_f64().ok_or("bad buckets")?, b[1].as_f64().ok_or("bad buckets")?)),
            _ => None,
        };
        if self.buckets.is_some() && scores.len() != self.cap || self.buckets.is_none() && scores.len() > self.cap {
            return Err(format!("a curve of {} scores for a cap of {}", scores.len(), self.cap));
        }
        self.slots = if self.buckets.is_none() {
            scores.iter().enumerate().map(|(i, s)| ((s + 0.0).to_bits(), i)).collect()
        } else {
            HashMap::new()
        };
        self.scores = scores;
        self.counts = counts;
        Ok(())
    }
}

fn curve_caps(task: Task, wants_curves: bool, slice: bool) -> Option<(usize, usize)> {
    if !wants_curves {
        return None;
    }
    if slice {
        return (task == Task::Binary).then_some((1, REPLICATE_SLICE_AUC_CAP));
    }
    let curves = match task {
        Task::Multiclass { classes } => classes,
        _ => 1,
    };
    Some((curves, (REPLICATE_AUC_CAP / curves).max(1 << 6)))
}

impl Replicates {
    pub(crate) fn new(spec: CiSpec, slice_features: usize) -> Replicates {
        Replicates {
            spec,
            overall: None,
            slices: vec![HashMap::new(); slice_features],
            weights: Vec::new(),
            floats: Vec::new(),
        }
    }

    fn fresh(&self, task: Task, metrics: &[Metric], slice: bool) -> Lean {
        Lean::new(task, self.spec.bootstrap.replicates as usize, Self::curves_of(task, metrics, slice))
    }

    /// The curves of a state's replicates, as [`Lean::new`] takes them.
    fn curves_of(task: Task, metrics: &[Metric], slice: bool) -> Option<(usize, usize)> {
        let wants_curves = metrics.iter().any(|m| matches!(m, Metric::Auc | Metric::PrAuc));
        curve_caps(task, wants_curves, slice)
    }

    /// Adds one example (identity `id`) to every replicate, weighted by its
    /// Poisson weight there; `slots` are its slice values as the real state
    /// routed them.
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
        if self.overall.is_none() {
            self.overall = Some(self.fresh(task, metrics, false));
        }
        let (mut weights, mut floats) = (std::mem::take(&mut self.weights), std::mem::take(&mut self.floats));
        self.spec.bootstrap.weights(id, &mut weights);
        floats.clear();
        floats.extend(weights.iter().map(|w| f64::from(*w)));
        let settings = (threshold, top_k, eps);
        self.overall.as_mut().expect("made").add(row, &floats, &weights, settings);
        for (f, slot) in slots.iter().enumerate().take(self.slices.len()) {
            if !self.slices[f].contains_key(*slot) {
                let fresh = self.fresh(task, metrics, true);
                self.slices[f].insert(slot.to_string(), fresh);
            }
            self.slices[f].get_mut(*slot).expect("present").add(row, &floats, &weights, settings);
        }
        (self.weights, self.floats) = (weights, floats);
    }

    /// Adds the replicates of other examples with the same settings.
    pub(crate) fn merge(&mut self, other: &Replicates, slot_of: &dyn Fn(usize, &str) -> String) -> Result<(), String> {
        if self.spec != other.spec {
            return Err(format!("their bootstrap settings differ ({:?} against {:?})", self.spec, other.spec));
        }
        if self.slices.len() != other.slices.len() {
            return Err("replicates of different slice features".into());
        }
        match (&mut self.overall, &other.overall) {
            (_, None) => {}
            (mine @ None, Some(theirs)) => *mine = Some(theirs.clone()),
            (Some(mine), Some(theirs)) => mine.merge(theirs)?,
        }
        for (f, (mine, theirs)) in self.slices.iter_mut().zip(&other.slices).enumerate() {
            let mut values: Vec<(&String, &Lean)> = theirs.iter().collect();
            values.sort_by(|a, b| a.0.cmp(b.0));
            for (value, lean) in values {
                let slot = slot_of(f, value);
                match mine.get_mut(&slot) {
                    Some(target) => target.merge(lean)?,
                    None => {
                        mine.insert(slot, lean.clone());
                    }
                }
            }
        }
        Ok(())
    }

    /// The intervals of every metric, overall and per slice value.
    pub(crate) fn intervals(&self, metrics: &[Metric], slice_names: &[String]) -> Intervals {
        let level = self.spec.level;
        let values_of = |lean: Option<&Lean>| -> BTreeMap<String, Vec<f64>> {
            let per_replicate: Vec<BTreeMap<String, f64>> = match lean {
                Some(lean) => (0..lean.replicates).map(|r| metric_values(&lean.state(r), metrics)).collect(),
                None => Vec::new(),
            };
            metrics
                .iter()
                .map(|m| (m.name().to_string(), per_replicate.iter().map(|v| v[m.name()]).collect()))
                .collect()
        };
        // A metric no replicate computes (`ece`, multiclass `brier`, an AUC
        // of one class) has no interval and no entry: records leave it out
        // of `"ci"` rather than write `null`.
        let interval_of = |values: &BTreeMap<String, Vec<f64>>| -> BTreeMap<String, Option<(f64, f64)>> {
            values.iter().filter_map(|(m, v)| Some((m.clone(), Some(percentile_interval(v, level)?)))).collect()
        };
        let values = values_of(self.overall.as_ref());
        let overall = interval_of(&values);
        let slices = slice_names
            .iter()
            .zip(&self.slices)
            .map(|(name, by_value)| {
                let by_value =
                    by_value.iter().map(|(v, lean)| (v.clone(), interval_of(&values_of(Some(lean))))).collect();
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
                let mut values: Vec<(&String, &Lean)> = by_value.iter().collect();
                values.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(values.into_iter().map(|(v, lean)| (v.clone(), lean.to_json())).collect())
            })
            .collect();
        json!({
            "version": REPLICATES_VERSION,
            "replicates": self.spec.bootstrap.replicates,
            "seed": self.spec.bootstrap.seed,
            "by": self.spec.by.name(),
            "level": self.spec.level,
            "overall": self.overall.as_ref().map(Lean::to_json),
            "slices": slices,
        })
    }

    pub(crate) fn from_json(
        value: &Value,
        task: Option<Task>,
        metrics: &[Metric],
        slice_features: usize,
    ) -> Result<Replicates, String> {
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
        let lean = |v: &Value, slice: bool, what: &str| -> Result<Lean, String> {
            let task = task.ok_or("replicates of a state that saw no examples")?;
            let curves = Replicates::curves_of(task, metrics, slice);
            Lean::from_json(v, task, replicates as usize, curves).map_err(|e| format!("replicates: {what}: {e}"))
        };
        let overall = if value["overall"].is_null() { None } else { Some(lean(&value["overall"], false, "overall")?) };
        let slices = value["slices"].as_array().map(Vec::as_slice).unwrap_or_default();
        if slices.len() != slice_features {
            return Err(format!("replicates: {} slice features for {slice_features}", slices.len()));
        }
        let mut parsed = vec![HashMap::new(); slice_features];
        for (f, feature) in slices.iter().enumerate() {
            let object = feature.as_object().ok_or("replicates: a slice feature is not an object")?;
            for (v, state) in object {
                parsed[f].insert(v.clone(), lean(state, true, &format!("slice value {v}"))?);
            }
        }
        out.overall = overall;
        out.slices = parsed;
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
