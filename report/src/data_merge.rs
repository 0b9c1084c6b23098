//! `isorun report merge` of data shards (`isorun eval --data-shard K/N`):
//! each model's metric states, one per shard, merged into the metrics one
//! machine would have computed over the whole dataset, then checked
//! against the `--threshold` bounds and `--max-drop` rules the shards were
//! given (and did not check), so the merged record has the outcome an
//! unsharded eval would have given.
//!
//! The reports must be shards of one evaluation: every one a data shard of
//! the same N, with the same `settings.eval` but for `data_shard` (the same
//! files, label, metrics, rules and baseline). With model shards too (the
//! Slurm array of models × data shards), each model shard's N data shards
//! are merged first, into one report of that model shard, which the model
//! merge then joins as ever. A data shard given twice is refused; a missing
//! one is named, and a model without every data shard is `not_run`
//! (`shard_task_lost`, with `missing_data_shards`), never metrics of part
//! of the data. A model that failed on one data shard (crash, timeout,
//! error) has that shard's outcome.

use super::change::{BaselineRecord, Gate};
use super::eval_record::{evaluation_fields, EvalRules};
use super::record::outcome_fields;
use super::timestamp::parse_rfc3339;
use super::unit::Unit;
use super::ReportError;
use isorun_eval::{Bound, Evaluation, MaxDrop, MetricState};
use isorun_protocol::{NotRunReason, Outcome};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Keys of a data shard's record that a merged record does not keep.
const SHARD_ONLY_KEYS: [&str; 6] =
    ["metric_state", "partial_metrics", "partial_slices", "partial", "data_shard", "baseline_bootstrap"];

/// `(K, N)` of a data shard report's `settings.eval.data_shard`.
pub fn data_shard_of(report: &Value) -> Option<(u64, u64)> {
    let (index, count) = report["settings"]["eval"]["data_shard"].as_str()?.split_once('/')?;
    Some((index.trim().parse().ok()?, count.trim().parse().ok()?))
}

/// Data shard reports merged, one report per model shard.
#[derive(Debug, Clone)]
pub struct DataMerge {
    /// One report per model shard (or one, without model shards), as an
    /// unsharded eval of that model shard would have written it.
    pub reports: Vec<(PathBuf, Value)>,
    /// The data shards no report is (`data shard 2/3`, or with model
    /// shards `shard 1/2 data shard 2/3`).
    pub missing: Vec<String>,
    /// What each given report was (`data shard 0/3`, `shard 1/2 data shard 0/3`).
    pub given: Vec<String>,
}

fn label(model_shard: &str, (index, count): (u64, u64)) -> String {
    if model_shard.is_empty() {
        format!("data shard {index}/{count}")
    } else {
        format!("shard {model_shard} data shard {index}/{count}")
    }
}

/// The data shards of `reports` merged per model shard; `None` when no
/// report is a data shard (a plain merge of model shards).
pub fn merge_data_shards(reports: &[(PathBuf, Value)]) -> Result<Option<DataMerge>, ReportError> {
    for (path, report) in reports {
        super::merge::checked_shard(path, "eval.data_shard", data_shard_of(report))?;
    }
    let Some((first_path, first)) = reports.iter().find(|(_, r)| data_shard_of(r).is_some()) else {
        return Ok(None);
    };
    let (_, count) = data_shard_of(first).expect("found");
    let reference = eval_settings_but_shard(first);
    // Model shard ("" when none) -> data shard index -> report.
    let mut groups: BTreeMap<String, BTreeMap<u64, (&PathBuf, &Value)>> = BTreeMap::new();
    let mut given = Vec::new();
    for (path, report) in reports {
        let Some((index, this_count)) = data_shard_of(report) else {
            return Err(ReportError::NotADataShard { sharded: first_path.clone(), other: path.clone() });
        };
        if this_count != count {
            return Err(ReportError::ShardCounts {
                first: format!("data shard {}", first["settings"]["eval"]["data_shard"].as_str().unwrap_or("")),
                first_path: first_path.clone(),
                second: format!("data shard {index}/{this_count}"),
                second_path: path.clone(),
            });
        }
        if let Some((key, first_value, second_value)) = differing_key(&reference, &eval_settings_but_shard(report)) {
            let hint = if key == "eval.data_digest" {
                "the same files must be read, unchanged (size and modification time), with the same \
                 --feature, --skip-corrupt, --label, --weight and --slice"
            } else {
                "every data shard must be run with the same flags and data"
            };
            return Err(ReportError::DataSettings {
                first: first_path.clone(),
                second: path.clone(),
                key,
                values: format!("{first_value} against {second_value}"),
                hint,
            });
        }
        let model_shard = super::junit::shard_text(report).unwrap_or_default();
        given.push(label(&model_shard, (index, count)));
        let group = groups.entry(model_shard.clone()).or_default();
        if let Some((earlier, _)) = group.insert(index, (path, report)) {
            return Err(ReportError::DataShardTwice {
                shard: label(&model_shard, (index, count)),
                first: earlier.clone(),
                second: path.clone(),
            });
        }
    }
    let mut merged = Vec::new();
    let mut missing = Vec::new();
    for (model_shard, members) in &groups {
        missing.extend((0..count).filter(|k| !members.contains_key(k)).map(|k| label(model_shard, (k, count))));
        merged.push(merge_group(members, count)?);
    }
    Ok(Some(DataMerge { reports: merged, missing, given }))
}

/// What the data shards of one evaluation share: `settings.eval` but for
/// `data_shard` (files, dataset digest, label, metrics, rules, baseline),
/// and the signature and tags the models were run with, keyed by their
/// path under `settings`.
fn eval_settings_but_shard(report: &Value) -> Map<String, Value> {
    let mut shared = Map::new();
    for (key, value) in report["settings"]["eval"].as_object().into_iter().flatten() {
        if key != "data_shard" {
            shared.insert(format!("eval.{key}"), value.clone());
        }
    }
    for key in ["signature", "tags"] {
        if let Some(value) = report["settings"].get(key) {
            shared.insert(key.to_string(), value.clone());
        }
    }
    shared
}

/// The first key whose values differ, with both values (shortened), `absent`
/// for none. The dataset's digest sums up files and flags that have keys of
/// their own, so it comes last: a differing flag is named, not the digest.
fn differing_key(a: &Map<String, Value>, b: &Map<String, Value>) -> Option<(String, String, String)> {
    let digest_last = |key: &&String| key.as_str() == "eval.data_digest";
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort_by_key(digest_last);
    let key = keys.into_iter().find(|key| a.get(*key) != b.get(*key))?;
    let shown = |value: Option<&Value>| match value {
        None => "absent".to_string(),
        Some(value) => {
            let text = value.to_string();
            match text.char_indices().nth(120) {
                Some((at, _)) => format!("{}...", &text[..at]),
                None => text,
            }
        }
    };
    Some((key.clone(), shown(a.get(key)), shown(b.get(key))))
}

/// The data shards of one model shard, as one report.
fn merge_group(members: &BTreeMap<u64, (&PathBuf, &Value)>, count: u64) -> Result<(PathBuf, Value), ReportError> {
    let (first_path, first) = *members.values().next().expect("a group has a member");
    let eval_settings = &first["settings"]["eval"];
    let rules = rules_of(first_path, eval_settings)?;
    let with_baseline = eval_settings.get("baseline").is_some();
    // Model id -> data shard index -> (report, unit), models in order of first appearance.
    let mut models: Vec<(String, ShardUnits<'_>)> = Vec::new();
    for (&index, (path, report)) in members {
        for unit in report["units"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let model = Unit(unit).model();
            let at = match models.iter().position(|(m, _)| m == model) {
                Some(at) => at,
                None => {
                    models.push((model.to_string(), BTreeMap::new()));
                    models.len() - 1
                }
            };
            if models[at].1.insert(index, (path.as_path(), unit)).is_some() {
                return Err(ReportError::TwiceInReport { model: model.to_string(), which: "data shard" });
            }
        }
    }
    let units = models
        .iter()
        .map(|(model, shards)| merge_model(model, shards, count, &rules, with_baseline))
        .collect::<Result<Vec<_>, _>>()?;

    let mut report = first.clone();
    let times = |key: &'static str| -> Vec<i64> {
        members.values().filter_map(|(_, r)| r[key].as_str().and_then(parse_rfc3339)).collect()
    };
    let (started, finished) = (times("started_at").into_iter().min(), times("finished_at").into_iter().max());
    if let (Some(started), Some(finished)) = (started, finished) {
        report["started_at"] = json!(super::format_rfc3339(started));
        report["finished_at"] = json!(super::format_rfc3339(finished));
    }
    if let Some(eval) = report["settings"]["eval"].as_object_mut() {
        eval.remove("data_shard");
        eval.insert("data_shards".into(), json!(count));
    }
    report["units"] = Value::Array(units);
    Ok((first_path.clone(), report))
}

/// The bounds of `settings.eval.thresholds` (a number there is the decision
/// threshold, which the metric states keep) and its `max_drops`.
fn rules_of(path: &Path, eval: &Value) -> Result<EvalRules, ReportError> {
    let texts = |key: &str| eval[key].as_array().into_iter().flatten().filter_map(Value::as_str);
    let bad = |rule: &str, reason: String| ReportError::BadRule { path: path.to_path_buf(), rule: rule.into(), reason };
    let mut rules = EvalRules::default();
    for rule in texts("thresholds").filter(|t| t.trim().parse::<f64>().is_err()) {
        rules.bounds.push(rule.parse::<Bound>().map_err(|e| bad(rule, e))?);
    }
    for rule in texts("max_drops") {
        rules.drops.push(rule.parse::<MaxDrop>().map_err(|e| bad(rule, e))?);
    }
    if let Some(gate) = eval["gate"].as_str() {
        rules.gate = Gate::parse(gate).ok_or_else(|| bad(gate, "--gate is always or significant".into()))?;
    }
    Ok(rules)
}

/// One model's units by data shard index, with the report each came from.
type ShardUnits<'a> = BTreeMap<u64, (&'a Path, &'a Value)>;

/// One model's data shards, as one record.
fn merge_model(
    model: &str,
    shards: &ShardUnits<'_>,
    count: u64,
    rules: &EvalRules,
    with_baseline: bool,
) -> Result<Value, ReportError> {
    let (_, first) = *shards.values().next().expect("a model has a shard");
    let summary: Vec<Value> = shards
        .iter()
        .map(|(index, (_, unit))| {
            let mut s = Map::new();
            s.insert("data_shard".into(), json!(format!("{index}/{count}")));
            s.insert("status".into(), unit["status"].clone());
            for key in ["examples", "wall_ms", "peak_rss_bytes"] {
                if let Some(value) = unit.get(key) {
                    s.insert(key.into(), value.clone());
                }
            }
            Value::Object(s)
        })
        .collect();
    let missing: Vec<String> = (0..count).filter(|k| !shards.contains_key(k)).map(|k| format!("{k}/{count}")).collect();
    if !missing.is_empty() {
        let reason = NotRunReason::ShardTaskLost;
        let mut unit = Map::new();
        unit.insert("model".into(), json!(model));
        if let Some(path) = first.get("path") {
            unit.insert("path".into(), path.clone());
        }
        unit.insert("status".into(), json!("not_run"));
        unit.insert("error".into(), json!({"kind": "not_run", "message": Outcome::NotRun { reason }.to_string()}));
        unit.insert("reason".into(), json!(reason.name()));
        unit.insert("missing_data_shards".into(), json!(missing));
        unit.insert("wall_ms".into(), json!(0));
        unit.insert("data_shards".into(), Value::Array(summary));
        return Ok(Value::Object(unit));
    }
    // A failure on any part of the data is the model's outcome: never the metrics of the rest.
    if let Some((index, (_, failed))) = shards.iter().find(|(_, (_, unit))| Unit(unit).status() != "ok") {
        let mut unit = failed.as_object().cloned().unwrap_or_default();
        SHARD_ONLY_KEYS.iter().for_each(|key| {
            unit.shift_remove(*key);
        });
        unit.insert("failed_data_shard".into(), json!(format!("{index}/{count}")));
        unit.insert("data_shards".into(), Value::Array(summary));
        return Ok(Value::Object(unit));
    }

    let mut merged: Option<MetricState> = None;
    for (index, (path, unit)) in shards {
        let bad = |reason: String| ReportError::BadState { path: path.to_path_buf(), model: model.into(), reason };
        let mut state = MetricState::from_json(&unit["metric_state"]).map_err(|e| bad(e.to_string()))?;
        state.set_source(format!("{} (model {model}, data shard {index}/{count})", path.display()));
        match &mut merged {
            None => merged = Some(state),
            Some(merged) => merged.merge(&state).map_err(|e| bad(e.to_string()))?,
        }
    }
    let state = merged.expect("every shard is there");
    let evaluation = Evaluation::from_state(&state);
    // Counts of the shards' records (files): summed without wrapping.
    let (first_path, _) = *shards.values().next().expect("a model has a shard");
    let total = |key: &str| -> Result<u64, ReportError> {
        shards.values().filter_map(|(_, u)| u[key].as_u64()).try_fold(0u64, |sum, n| {
            sum.checked_add(n).ok_or_else(|| ReportError::Overflow {
                path: first_path.to_path_buf(),
                model: model.into(),
                what: key.replace('_', " "),
            })
        })
    };
    let skipped = total("skipped_corrupt")?;
    let baseline_record = BaselineRecord::from_shard_unit(first);
    let baseline = with_baseline.then_some(baseline_record.as_ref());
    let (fields, breach) = evaluation_fields(&evaluation, skipped, baseline, rules);
    let outcome = breach.unwrap_or(Outcome::Ok);

    let mut r = Map::new();
    r.insert("model".into(), json!(model));
    if let Some(path) = first.get("path") {
        r.insert("path".into(), path.clone());
    }
    r.insert("status".into(), json!(outcome.status()));
    outcome_fields(&mut r, &outcome);
    r.insert("examples".into(), json!(evaluation.examples));
    r.extend(fields);
    r.insert("batches".into(), json!(total("batches")?));
    // Examples over the shards' summed time: the rate of one machine doing them all.
    let seconds: Option<f64> = shards
        .values()
        .map(|(_, u)| {
            let rate = u["examples_per_second"].as_f64()?;
            Some(u["examples"].as_f64()? / rate)
        })
        .sum();
    if let Some(seconds) = seconds.filter(|s| *s > 0.0) {
        r.insert("examples_per_second".into(), json!((evaluation.examples as f64 / seconds * 1000.0).round() / 1000.0));
    }
    r.insert("wall_ms".into(), json!(total("wall_ms")?));
    if let Some(peak) = shards.values().filter_map(|(_, u)| u["peak_rss_bytes"].as_u64()).max() {
        r.insert("peak_rss_bytes".into(), json!(peak));
    }
    r.insert("data_shards".into(), Value::Array(summary));
    Ok(Value::Object(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data shard report of one model whose state saw no examples.
    fn data_shard(shard: &str, batches: u64) -> Value {
        let state = json!({
            "version": 1, "output": "out", "requested": [], "top_k": 5, "threshold": 0.5,
            "from_logits": false, "slice_features": [], "examples": 0,
        });
        json!({
            "schema_version": 1, "isorun_version": "0.1.0",
            "started_at": "2024-01-01T10:00:00Z", "finished_at": "2024-01-01T10:00:01Z",
            "command": ["isorun", "eval"], "settings": {"eval": {"label": "y", "data_shard": shard}},
            "units": [{"model": "m", "status": "ok", "examples": 0, "batches": batches, "wall_ms": 1,
                       "metric_state": state}],
        })
    }

    #[test]
    fn a_data_shard_k_of_n_with_k_not_below_n_is_refused() {
        for bad in ["2/2", "0/0"] {
            let reports = [
                (PathBuf::from("0.json"), data_shard("0/2", 1)),
                (PathBuf::from("1.json"), data_shard("1/2", 1)),
                (PathBuf::from("bad.json"), data_shard(bad, 1)),
            ];
            let want = format!(
                "bad.json: settings.eval.data_shard is {bad}: not a shard K/N (K must be from 0 to N-1, and N at least 1)"
            );
            assert_eq!(merge_data_shards(&reports).unwrap_err().to_string(), want);
        }
        let whole = [(PathBuf::from("0.json"), data_shard("0/2", 1)), (PathBuf::from("1.json"), data_shard("1/2", 2))];
        let merged = merge_data_shards(&whole).unwrap().unwrap();
        assert_eq!(merged.reports[0].1["units"][0]["batches"], 3);
    }

    #[test]
    fn counts_summed_over_data_shards_do_not_wrap() {
        let reports =
            [(PathBuf::from("0.json"), data_shard("0/2", u64::MAX)), (PathBuf::from("1.json"), data_shard("1/2", 1))];
        assert_eq!(
            merge_data_shards(&reports).unwrap_err().to_string(),
            "0.json: model m: the summed batches of its data shards overflow a 64-bit count"
        );
    }
}
