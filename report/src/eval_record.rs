//! The fields an evaluation adds to a model's record, and its outcome
//! (bounds, drops against a baseline), decided in one place for the three
//! that make them: `isorun eval` over the whole data, `isorun eval
//! --data-shard K/N` (one shard: its metric state, and its metrics marked
//! partial, never checked), and `isorun report merge` (the shards' states
//! merged, then checked as one pass would have been). One function, so a
//! merged record cannot drift from an unsharded one.

use crate::change::{change_json, gate_breaches, BaselineRecord, Gate};
use isorun_eval::{check, Bound, Evaluation, MaxDrop, MetricState};
use isorun_protocol::Outcome;
use serde_json::{json, Map, Value};

/// `--threshold` bounds and `--max-drop` rules.
#[derive(Debug, Clone, Default)]
pub struct EvalRules {
    pub bounds: Vec<Bound>,
    pub drops: Vec<MaxDrop>,
    /// `--gate`: whether a drop must also be significant to breach.
    pub gate: Gate,
}

/// A model's record in the baseline: `None` when no `--baseline` was
/// given, `Some(None)` when the baseline does not have the model (new).
pub type BaselineMetrics<'a> = Option<Option<&'a BaselineRecord>>;

/// The evaluation's keys (`task`, `metrics`, `slices`, ...; not
/// `examples`, which is the engine's), `skipped_corrupt`, the baseline's
/// (`baseline_metrics` and `change`, or `"baseline": "new"`), and the
/// outcome its breaches make (`below_threshold`), if any.
pub fn evaluation_fields(
    evaluation: &Evaluation,
    skipped_corrupt: u64,
    baseline: BaselineMetrics<'_>,
    rules: &EvalRules,
) -> (Map<String, Value>, Option<Outcome>) {
    let mut fields = base_fields(evaluation, skipped_corrupt);
    let baseline = match baseline {
        None => None,
        Some(None) => {
            fields.insert("baseline".into(), json!("new"));
            None
        }
        Some(Some(record)) => {
            let change = change_json(evaluation, record);
            fields.insert("baseline_metrics".into(), json!(record.metrics));
            fields.insert("change".into(), Value::Object(change.clone()));
            Some((&record.metrics, change))
        }
    };
    let breaches = check(evaluation, &rules.bounds, &rules.drops, baseline.as_ref().map(|(m, _)| *m));
    let breaches = match &baseline {
        Some((_, change)) => gate_breaches(breaches, rules.gate, change),
        None => breaches,
    };
    (fields, Outcome::below_threshold(breaches))
}

/// One data shard's fields: `data_shard`, `partial: true`, the shard's own
/// metrics as `partial_metrics` and `partial_slices` (not `metrics`, so no
/// reader takes them for the whole data's: not `--baseline`, not `report
/// diff`), the baseline's metrics for the merge, and `metric_state`. No
/// rule is checked: a shard's metrics are not the model's.
pub fn data_shard_fields(
    evaluation: &Evaluation,
    state: &MetricState,
    data_shard: &str,
    skipped_corrupt: u64,
    baseline: BaselineMetrics<'_>,
) -> Map<String, Value> {
    let mut fields = Map::new();
    fields.insert("data_shard".into(), json!(data_shard));
    fields.insert("partial".into(), json!(true));
    for (key, value) in base_fields(evaluation, skipped_corrupt) {
        match key.as_str() {
            "metrics" => fields.insert("partial_metrics".into(), value),
            "slices" => fields.insert("partial_slices".into(), value),
            // The state holds them; the merged record has the whole data's.
            "confusion_matrix"
            | "top_confusions"
            | "top_confusions_exact"
            | "top_confusions_max_error"
            | "calibration"
            | "ci"
            | "bootstrap_values" => None,
            _ => fields.insert(key, value),
        };
    }
    match baseline {
        None => {}
        Some(None) => {
            fields.insert("baseline".into(), json!("new"));
        }
        Some(Some(record)) => {
            fields.insert("baseline_metrics".into(), json!(record.metrics));
            if let Some(bootstrap) = &record.bootstrap {
                fields.insert("baseline_bootstrap".into(), bootstrap.to_json());
            }
        }
    }
    fields.insert("metric_state".into(), state.to_json());
    fields
}

fn base_fields(evaluation: &Evaluation, skipped_corrupt: u64) -> Map<String, Value> {
    let mut fields = match evaluation.to_json() {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    // Keys that do not apply are left out, as everywhere in records.
    fields.remove("examples");
    fields.retain(|_, value| !value.is_null() && *value != json!({}));
    if skipped_corrupt > 0 {
        fields.insert("skipped_corrupt".into(), json!(skipped_corrupt));
    }
    fields
}
