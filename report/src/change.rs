//! A model's change against its baseline record (`eval --baseline`): the
//! record's `"change": {METRIC: {"baseline", "delta"}}`, and with `--ci`
//! and a baseline evaluated with the same bootstrap (replicates, seed, and
//! what weights are keyed by) the paired change of the same examples: the
//! interval of the replicate deltas `new_r − base_r`, a two-sided bootstrap
//! p and whether the interval excludes 0 (`"significant"`). `--gate
//! significant` keeps a `--max-drop` breach only when its change is
//! significant. In its own module so every reader and writer of `change`
//! (eval, report merge) decides it in one place.

use isorun_eval::{paired_change, Breach, Evaluation};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// When a `--max-drop` breach fails a model (`--gate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gate {
    /// The drop alone (without `--gate`).
    #[default]
    Always,
    /// The drop and a paired interval of the change that excludes 0.
    Significant,
}

impl Gate {
    /// `always` or `significant`.
    pub fn parse(text: &str) -> Option<Gate> {
        match text {
            "always" => Some(Gate::Always),
            "significant" => Some(Gate::Significant),
            _ => None,
        }
    }

    /// As `--gate` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Gate::Always => "always",
            Gate::Significant => "significant",
        }
    }
}

/// A model's record in the baseline: its metrics and, when it was
/// evaluated with `--ci`, its bootstrap settings and replicate values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BaselineRecord {
    pub metrics: BTreeMap<String, f64>,
    pub bootstrap: Option<BaselineBootstrap>,
}

/// The baseline's `"bootstrap"` settings and `"bootstrap_values"`.
#[derive(Debug, Clone, PartialEq)]
pub struct BaselineBootstrap {
    /// `{"replicates", "seed", "by"}` as the record has it.
    pub settings: Value,
    pub values: BTreeMap<String, Vec<f64>>,
}

fn numbers(value: &Value) -> BTreeMap<String, f64> {
    value
        .as_object()
        .map(|m| m.iter().filter_map(|(name, v)| Some((name.clone(), v.as_f64()?))).collect())
        .unwrap_or_default()
}

impl BaselineBootstrap {
    /// From a record's `"bootstrap"` and `"bootstrap_values"` (NaN for `null`).
    pub fn from_fields(settings: &Value, values: &Value) -> Option<BaselineBootstrap> {
        let values = values
            .as_object()?
            .iter()
            .filter_map(|(m, list)| {
                let list = list.as_array()?.iter().map(|v| v.as_f64().unwrap_or(f64::NAN)).collect();
                Some((m.clone(), list))
            })
            .collect();
        settings.is_object().then(|| BaselineBootstrap { settings: settings.clone(), values })
    }

    /// `{"bootstrap": .., "values": ..}`, as a data shard's record keeps it for `report merge`.
    pub fn to_json(&self) -> Value {
        json!({"bootstrap": self.settings, "values": self.values})
    }
}

impl BaselineRecord {
    /// A unit record of an eval report (`metrics`, `bootstrap`, `bootstrap_values`).
    pub fn from_unit(unit: &Value) -> Option<BaselineRecord> {
        let metrics = numbers(unit.get("metrics")?);
        let bootstrap = BaselineBootstrap::from_fields(&unit["bootstrap"], &unit["bootstrap_values"]);
        Some(BaselineRecord { metrics, bootstrap })
    }

    /// What a data shard's record carries (`baseline_metrics`, `baseline_bootstrap`).
    pub fn from_shard_unit(unit: &Value) -> Option<BaselineRecord> {
        let metrics = numbers(unit.get("baseline_metrics")?);
        let b = &unit["baseline_bootstrap"];
        let bootstrap = BaselineBootstrap::from_fields(&b["bootstrap"], &b["values"]);
        Some(BaselineRecord { metrics, bootstrap })
    }

    /// Whether its replicates pair with `evaluation`'s: the same replicates, seed and keying.
    pub fn pairs_with(&self, evaluation: &Evaluation) -> bool {
        match (&self.bootstrap, &evaluation.ci) {
            (Some(base), Some(ci)) => {
                base.settings
                    == json!({"replicates": ci.spec.bootstrap.replicates, "seed": ci.spec.bootstrap.seed, "by": ci.spec.by.name()})
            }
            _ => false,
        }
    }
}

/// The bootstrap settings `--ci` draws with, as records write them.
pub fn bootstrap_settings(replicates: u32, seed: u64, by: &str) -> Value {
    json!({"replicates": replicates, "seed": seed, "by": by})
}

/// `{METRIC: {"baseline", "delta", "ci"?, "p"?, "significant"?}}` for the
/// metrics both have; the paired statistics when the replicates pair.
pub fn change_json(evaluation: &Evaluation, baseline: &BaselineRecord) -> Map<String, Value> {
    let paired = baseline.pairs_with(evaluation);
    let mut change = Map::new();
    for (name, value) in &evaluation.metrics {
        let Some(base) = baseline.metrics.get(name) else { continue };
        let mut entry = Map::new();
        entry.insert("baseline".into(), json!(base));
        entry.insert("delta".into(), number(value - base));
        if let (true, Some(ci), Some(base_values)) =
            (paired, &evaluation.ci, baseline.bootstrap.as_ref().map(|b| &b.values))
        {
            if let (Some(new), Some(old)) = (ci.values.get(name), base_values.get(name)) {
                if let Some(p) = paired_change(new, old, ci.spec.level) {
                    entry.insert("ci".into(), json!([number(p.interval.0), number(p.interval.1)]));
                    entry.insert("p".into(), number(p.p));
                    entry.insert("significant".into(), json!(p.significant));
                }
            }
        }
        change.insert(name.clone(), Value::Object(entry));
    }
    change
}

fn number(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// `--gate significant`: drops against the baseline (breaches with a
/// baseline value) stay only where `change` says the metric's change is
/// significant; bounds always stay.
pub fn gate_breaches(breaches: Vec<Breach>, gate: Gate, change: &Map<String, Value>) -> Vec<Breach> {
    match gate {
        Gate::Always => breaches,
        Gate::Significant => breaches
            .into_iter()
            .filter(|b| b.baseline.is_none() || change[&b.metric]["significant"] == json!(true))
            .collect(),
    }
}

/// A record's change of `metric`: its delta, whether an old bare number
/// (reports before the change object) or `{"delta"}`.
pub fn delta_of(change: &Value) -> Option<f64> {
    change.as_f64().or_else(|| change["delta"].as_f64())
}

/// A metric of a record as people read it: `0.8140 [0.790, 0.837]` with
/// `--ci`, then its change against the baseline when there is one:
/// `(-0.0100 [-0.030, 0.010], p=0.32)`, `significant` marked.
pub fn metric_text(record: &Value, metric: &str) -> Option<String> {
    let value = record["metrics"].get(metric)?;
    let mut text = match value.as_f64() {
        Some(x) => format!("{x:.4}"),
        None => value.to_string(),
    };
    let interval = |ci: &Value| Some((ci.get(0)?.as_f64()?, ci.get(1)?.as_f64()?));
    if let Some((low, high)) = record["ci"].get(metric).and_then(interval) {
        text += &format!(" [{low:.3}, {high:.3}]");
    }
    let change = &record["change"][metric];
    if let Some(delta) = delta_of(change) {
        text += &format!(" ({delta:+.4}");
        if let Some((low, high)) = interval(&change["ci"]) {
            text += &format!(" [{low:+.3}, {high:+.3}]");
        }
        if let Some(p) = change["p"].as_f64() {
            text += &format!(", p={p:.3}");
        }
        if change["significant"] == json!(true) {
            text += ", significant";
        }
        text += ")";
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_significant_keeps_only_significant_drops_and_every_bound() {
        let breach = |metric: &str, baseline: Option<f64>| Breach {
            metric: metric.into(),
            rule: "r".into(),
            bound: 0.0,
            value: 0.0,
            baseline,
        };
        let change: Map<String, Value> = serde_json::from_value(json!({
            "accuracy": {"baseline": 0.9, "delta": -0.1, "significant": true},
            "auc": {"baseline": 0.9, "delta": -0.1, "significant": false},
        }))
        .unwrap();
        let all = vec![breach("accuracy", Some(0.9)), breach("auc", Some(0.9)), breach("auc", None)];
        let kept = gate_breaches(all.clone(), Gate::Significant, &change);
        assert_eq!(kept, vec![all[0].clone(), all[2].clone()]);
        assert_eq!(gate_breaches(all.clone(), Gate::Always, &change), all);
        assert_eq!(delta_of(&json!(-0.5)), Some(-0.5));
        assert_eq!(delta_of(&json!({"delta": 0.25})), Some(0.25));
        let record = json!({"metrics": {"accuracy": 0.814}, "ci": {"accuracy": [0.79, 0.8372]},
            "change": {"accuracy": {"baseline": 0.9, "delta": -0.086, "ci": [-0.1, -0.07], "p": 0.0, "significant": true}}});
        assert_eq!(
            metric_text(&record, "accuracy").unwrap(),
            "0.8140 [0.790, 0.837] (-0.0860 [-0.100, -0.070], p=0.000, significant)"
        );
    }
}
