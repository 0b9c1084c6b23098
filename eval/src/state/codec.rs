//! The metric state's JSON: [`MetricState::to_json`] and
//! [`MetricState::from_json`], and the per-task states' part of it. Kept
//! apart from the arithmetic because reading is where a state is a file's
//! claim, checked against the caps of `limits` before anything is sized by
//! it; the parts (sums, curves, bins, top confusions) encode and decode
//! themselves through `crate::accumulator::Accumulator`.
//!
//! The JSON is versioned ([`STATE_VERSION`]) and compact: zero sums are
//! left out, a sum is a number (or its exact partials, a list, when one
//! number cannot hold it). Its size is bounded by the caps: an exact curve
//! is at most [`AUC_EXACT_CAP`](super::AUC_EXACT_CAP) scores (~40 bytes each, ~10 MB), a slice
//! value's at most [`SLICE_AUC_CAP`]; `ece`'s reliability bins are 4
//! numbers per bin (`--calibration-bins`, ≤ 10,000) per state; past
//! `max_confusion_classes` the top confusions are at most
//! `TOP_CONFUSION_ENTRIES` triples (~0.4 MB), and the settings
//! `calibration_bins` and `max_confusion_classes` (absent in older states:
//! the defaults) must agree for states to merge. A classifier's state keeps
//! the check of its scores (`scores`, see `crate::probabilities`; absent in
//! older states: nothing known).
//!
//! Read back, a state is a file's claim (a shard report's): no size is
//! taken from it that its data does not back. A multiclass state's classes
//! (at most [`MAX_CLASSES`]) must be the length of its per-class sums,
//! replicate lists the lengths their counts say (checked before anything is
//! allocated), a curve at most the buckets eval makes for its place (and
//! holding only the buckets it gives counts for, `crate::curve`), a slice
//! feature at most [`MAX_SLICE_VALUES`] values, curves only where eval
//! keeps them (not on a multiclass state's slices).

use super::limits::{overall_curve_sizes, MAX_CLASSES, MAX_SLICE_VALUES, SLICE_AUC_CAP};
use super::metric_state::MetricState;
use super::task::{BinaryState, MulticlassState, RegressionState, State, SumField, Sums};
use crate::accumulator::Accumulator;
use crate::calibration::Calibration;
use crate::confusion::TopConfusions;
use crate::curve::Curve;
use crate::exact::ExactSum;
use crate::probabilities::ScoreCheck;
use crate::replicates::Replicates;
use crate::task::{Metric, Task};
use serde_json::{json, Map, Value};

/// The version of the state's JSON; another version is refused.
pub const STATE_VERSION: u64 = 1;

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
                o.insert("top_confusions".into(), top.encode());
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
            state.top_confusions = Some(TopConfusions::decode(&value["top_confusions"], classes).map_err(invalid)?);
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

fn put_sum(o: &mut Map<String, Value>, key: &str, sum: &ExactSum) {
    if *sum != ExactSum::default() {
        o.insert(key.into(), sum.encode());
    }
}

fn get_sum(o: &Value, key: &str) -> Result<ExactSum, String> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(ExactSum::default()),
        Some(v) => ExactSum::decode(v, ()).map_err(|e| format!("{key}: {e}")),
    }
}

fn state_json(state: &State) -> Value {
    let mut o = Map::new();
    let sums = state.sums();
    o.insert("examples".into(), sums.examples.into());
    for field in SumField::ALL {
        put_sum(&mut o, field.name(), sums.get(field));
    }
    match state {
        State::Binary(s) => {
            for (name, sum) in [("tp", &s.tp), ("fp", &s.fp), ("tn", &s.tn), ("fn", &s.fn_)] {
                put_sum(&mut o, name, sum);
            }
            if let Some(curve) = &s.curve {
                o.insert("curve".into(), curve.encode());
            }
            if let Some(calibration) = &s.calibration {
                o.insert("calibration".into(), calibration.encode());
            }
        }
        State::Multiclass(s) => {
            put_sum(&mut o, "correct", &s.correct);
            put_sum(&mut o, "top_k", &s.top_k);
            for (name, sums) in [("tp", &s.tp), ("fp", &s.fp), ("fn", &s.fn_)] {
                o.insert(name.into(), sums.iter().map(ExactSum::encode).collect());
            }
            o.insert("present".into(), s.present.iter().map(|&p| u8::from(p)).collect());
            if let Some(curves) = &s.curves {
                o.insert("curves".into(), curves.iter().map(Curve::encode).collect());
            }
            put_sum(&mut o, "brier", &s.brier);
            if let Some(calibration) = &s.calibration {
                o.insert("calibration".into(), calibration.encode());
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
    let mut sums = Sums::of_examples(value["examples"].as_u64().ok_or("no \"examples\" count")?);
    for field in SumField::ALL {
        *sums.get_mut(field) = get_sum(value, field.name())?;
    }
    let read_curve = |v: &Value| match max_buckets {
        Some(max_buckets) => Curve::decode(v, max_buckets),
        None => Err(format!("AUC curves, which eval keeps for no slice of a {} state", task.name())),
    };
    let curve = |v: &Value| if v.is_null() { Ok(None) } else { read_curve(v).map(Some) };
    let calibration =
        if value["calibration"].is_null() { None } else { Some(Calibration::decode(&value["calibration"], ())?) };
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
                list.iter().map(|sum| ExactSum::decode(sum, ())).collect()
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
