//! `isorun report merge`: the reports of shard runs (`--shard K/N` on N
//! machines) joined into the report the whole run would have made. Units
//! are sorted by model id, as one run would have found them; a model in
//! two reports means the shards overlap (or one report was given twice),
//! which is refused rather than guessed at.
//!
//! With the list of models the shards were to run (`--models`, the
//! `models.json` of `isorun slurm submit`), a listed model that no report
//! holds (its shard task failed or was cancelled before writing its report)
//! becomes a `not_run` unit with reason `shard_task_lost`: a lost task shows
//! in the merged report instead of making its models silently disappear.
//!
//! Shard reports say which shard they are (`settings.shard`, `K/N`): the
//! shards of N that no report is are [`missing_shards`], which the CLI
//! refuses without `--partial` or `--models` (a merge of half the shards
//! looked like a whole run), and a merged report of them names them in
//! `settings.missing_shards`. Reports of different N, or a `run` report
//! with an `eval` report (`settings.eval`), are not one run: refused.

use super::document::{assemble, Header};
use super::junit::shard_text;
use super::timestamp::{parse_rfc3339, unix_milliseconds};
use super::unit::Unit;
use super::ReportError;
use isorun_protocol::{NotRunReason, Outcome};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The merged report of `reports` (each with the file it came from).
pub fn merge(reports: &[(PathBuf, Value)]) -> Result<Value, ReportError> {
    merge_with_models(reports, None)
}

/// `(K, N)` of a shard report's `settings.shard` (`"K/N"` or `{"index", "count"}`).
fn shard_of(report: &Value) -> Option<(u64, u64)> {
    match &report["settings"]["shard"] {
        Value::String(text) => {
            let (index, count) = text.split_once('/')?;
            Some((index.trim().parse().ok()?, count.trim().parse().ok()?))
        }
        Value::Object(shard) => Some((shard.get("index")?.as_u64()?, shard.get("count")?.as_u64()?)),
        _ => None,
    }
}

/// `(K, N)` as [`shard_of`], refused unless 0 <= K < N: a report that
/// claims shard `2/2` or `0/0` is no shard of any run (the shards a run
/// makes are `--shard K/N`, checked the same way), and merging it would
/// add models or data no shard was given.
pub(crate) fn checked_shard(
    path: &Path,
    key: &'static str,
    shard: Option<(u64, u64)>,
) -> Result<Option<(u64, u64)>, ReportError> {
    match shard {
        Some((index, count)) if index >= count => {
            Err(ReportError::BadShard { path: path.to_path_buf(), key, shard: format!("{index}/{count}") })
        }
        shard => Ok(shard),
    }
}

/// The shards (`K/N`) of the sharded run that none of `reports` is, in
/// order; empty when no report is a shard or every shard is there. Shard
/// reports of different counts are refused.
pub fn missing_shards(reports: &[(PathBuf, Value)]) -> Result<Vec<String>, ReportError> {
    let mut first: Option<(u64, u64, &Path)> = None;
    let mut present = std::collections::BTreeSet::new();
    for (path, report) in reports {
        let Some((index, count)) = checked_shard(path, "shard", shard_of(report))? else { continue };
        match first {
            Some((first_index, first_count, first_path)) if first_count != count => {
                return Err(ReportError::ShardCounts {
                    first: format!("{first_index}/{first_count}"),
                    first_path: first_path.to_path_buf(),
                    second: format!("{index}/{count}"),
                    second_path: path.clone(),
                });
            }
            Some(_) => {}
            None => first = Some((index, count, path)),
        }
        present.insert(index);
    }
    Ok(first.map_or_else(Vec::new, |(_, count, _)| {
        (0..count).filter(|k| !present.contains(k)).map(|k| format!("{k}/{count}")).collect()
    }))
}

/// The shards `reports` are (`K/N`, as given), for a message.
pub fn given_shards(reports: &[(PathBuf, Value)]) -> Vec<String> {
    reports.iter().map(|(path, report)| shard_text(report).unwrap_or_else(|| path.display().to_string())).collect()
}

/// Refuses a `run` report merged with an `eval` report (an eval report's
/// settings have `eval`).
fn check_one_kind(reports: &[(PathBuf, Value)]) -> Result<(), ReportError> {
    let is_eval = |report: &Value| report["settings"].get("eval").is_some();
    let run = reports.iter().find(|(_, report)| !is_eval(report));
    let eval = reports.iter().find(|(_, report)| is_eval(report));
    match (run, eval) {
        (Some((run, _)), Some((eval, _))) => Err(ReportError::MixedKinds { run: run.clone(), eval: eval.clone() }),
        _ => Ok(()),
    }
}

/// The models a sharded run was to run, as `models.json` lists them:
/// `{"shards": N, "submitted_at": RFC 3339, "command": [...], "models":
/// [{"model": id, "path": path, "shard": K}, ...]}` (only `models` and each
/// `model` are required).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelList {
    pub shards: Option<u64>,
    pub submitted_at_ms: Option<i64>,
    pub command: Value,
    pub models: Vec<ListedModel>,
}

/// One model of a [`ModelList`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedModel {
    pub model: String,
    pub path: Option<String>,
    pub shard: Option<u64>,
}

/// Reads a model list (`models.json`).
pub fn read_model_list(path: &Path) -> Result<ModelList, ReportError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| ReportError::Read { path: path.to_path_buf(), source })?;
    let value: Value =
        serde_json::from_str(&text).map_err(|source| ReportError::NotJson { path: path.to_path_buf(), source })?;
    let wrong = |what: &str| ReportError::NotAModelList { path: path.to_path_buf(), what: what.to_string() };
    let entries = value["models"].as_array().ok_or_else(|| wrong("no \"models\" list"))?;
    let models = entries
        .iter()
        .map(|entry| {
            Ok(ListedModel {
                model: entry["model"].as_str().ok_or_else(|| wrong("a model without a \"model\" id"))?.to_string(),
                path: entry["path"].as_str().map(str::to_string),
                shard: entry["shard"].as_u64(),
            })
        })
        .collect::<Result<Vec<_>, ReportError>>()?;
    Ok(ModelList {
        shards: value["shards"].as_u64(),
        submitted_at_ms: value["submitted_at"].as_str().and_then(parse_rfc3339),
        command: value["command"].clone(),
        models,
    })
}

/// The unit of a listed model that no shard report holds.
fn lost_unit(listed: &ListedModel, shards: Option<u64>) -> Value {
    let reason = NotRunReason::ShardTaskLost;
    let mut unit = serde_json::Map::new();
    unit.insert("model".into(), json!(listed.model));
    if let Some(path) = &listed.path {
        unit.insert("path".into(), json!(path));
    }
    unit.insert("status".into(), json!("not_run"));
    unit.insert("error".into(), json!({"kind": "not_run", "message": Outcome::NotRun { reason }.to_string()}));
    unit.insert("reason".into(), json!(reason.name()));
    unit.insert("wall_ms".into(), json!(0));
    if let (Some(index), Some(count)) = (listed.shard, shards) {
        unit.insert("shard".into(), json!(format!("{index}/{count}")));
    }
    Value::Object(unit)
}

/// [`merge`], plus a `not_run` (`shard_task_lost`) unit for each model of
/// `models` that no report holds. With a model list, no report at all is a
/// report of lost units only.
pub fn merge_with_models(reports: &[(PathBuf, Value)], models: Option<&ModelList>) -> Result<Value, ReportError> {
    if reports.is_empty() && models.is_none() {
        return Err(ReportError::NothingToMerge);
    }
    check_one_kind(reports)?;
    for (path, report) in reports {
        checked_shard(path, "shard", shard_of(report))?;
    }
    let missing = missing_shards(reports)?;
    let no_report = Value::Null;
    let first = reports.first().map_or(&no_report, |(_, report)| report);
    let mut owner: BTreeMap<String, &Path> = BTreeMap::new();
    let mut units = Vec::new();
    for (path, report) in reports {
        for unit in report["units"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let model = Unit(unit).model();
            if let Some(first_path) = owner.insert(model.to_string(), path) {
                return Err(ReportError::DuplicateModel {
                    model: model.to_string(),
                    first: first_path.to_path_buf(),
                    second: path.clone(),
                });
            }
            units.push(unit.clone());
        }
    }
    if let Some(list) = models {
        let lost = list.models.iter().filter(|listed| !owner.contains_key(&listed.model));
        units.extend(lost.map(|listed| lost_unit(listed, list.shards)));
    }
    units.sort_by(|a, b| Unit(a).model().as_bytes().cmp(Unit(b).model().as_bytes()));

    let mut started_at_ms = i64::MAX;
    let mut finished_at_ms = i64::MIN;
    for (path, report) in reports {
        let time = |key: &str| {
            report[key].as_str().and_then(parse_rfc3339).ok_or_else(|| ReportError::NotAReport {
                path: path.clone(),
                what: format!("{key} is not an RFC 3339 time"),
            })
        };
        started_at_ms = started_at_ms.min(time("started_at")?);
        finished_at_ms = finished_at_ms.max(time("finished_at")?);
    }
    if reports.is_empty() {
        let submitted = models.and_then(|list| list.submitted_at_ms);
        started_at_ms = submitted.unwrap_or_else(|| unix_milliseconds(std::time::SystemTime::now()));
        finished_at_ms = started_at_ms;
    }

    let mut settings = first["settings"].as_object().cloned().unwrap_or_default();
    settings.remove("shard");
    settings.insert("merged_from".into(), json!(given_shards(reports)));
    if !missing.is_empty() {
        settings.insert("missing_shards".into(), json!(missing));
    }

    let header = Header {
        isorun_version: first["isorun_version"].as_str().unwrap_or(env!("CARGO_PKG_VERSION")).to_string(),
        tensorflow_version: reports
            .iter()
            .find_map(|(_, report)| report["tensorflow_version"].as_str())
            .map(str::to_string),
        started_at_ms,
        finished_at_ms,
        command: match (reports.is_empty(), models) {
            (true, Some(list)) => list.command.clone(),
            _ => first["command"].clone(),
        },
        settings: Value::Object(settings),
        machine: if reports.is_empty() { json!({}) } else { first["machine"].clone() },
    };
    Ok(assemble(header, units))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(shard: &str, started_at: &str, finished_at: &str, models: &[&str]) -> Value {
        let units: Vec<Value> = models.iter().map(|model| json!({"model": model, "status": "ok"})).collect();
        json!({
            "schema_version": 1, "isorun_version": "0.1.0",
            "started_at": started_at, "finished_at": finished_at, "wall_ms": 0,
            "command": ["isorun", "run"], "settings": {"jobs": 2, "shard": shard}, "machine": {"os": "linux"},
            "summary": {}, "units": units,
        })
    }

    #[test]
    fn shards_join_into_one_sorted_report() {
        let reports = [
            (
                PathBuf::from("0.json"),
                shard("0/2", "2024-01-01T10:00:05.000Z", "2024-01-01T10:00:07.000Z", &["c", "a"]),
            ),
            (PathBuf::from("1.json"), shard("1/2", "2024-01-01T10:00:00.000Z", "2024-01-01T10:00:06.000Z", &["b"])),
        ];
        let merged = merge(&reports).unwrap();
        let models: Vec<&str> =
            merged["units"].as_array().unwrap().iter().map(|u| u["model"].as_str().unwrap()).collect();
        assert_eq!(models, ["a", "b", "c"]);
        assert_eq!(merged["started_at"], "2024-01-01T10:00:00.000Z");
        assert_eq!(merged["finished_at"], "2024-01-01T10:00:07.000Z");
        assert_eq!(merged["wall_ms"], 7000);
        assert_eq!(merged["settings"], json!({"jobs": 2, "merged_from": ["0/2", "1/2"]}));
        assert_eq!(merged["summary"]["total"], 3);
        assert_eq!(merged["summary"]["by_status"]["ok"], 3);
    }

    fn listed(models: &[(&str, u64)]) -> ModelList {
        ModelList {
            shards: Some(2),
            submitted_at_ms: parse_rfc3339("2024-01-01T09:00:00Z"),
            command: json!(["isorun", "run", "models/"]),
            models: models
                .iter()
                .map(|(model, shard)| ListedModel {
                    model: model.to_string(),
                    path: Some(format!("/models/{model}")),
                    shard: Some(*shard),
                })
                .collect(),
        }
    }

    #[test]
    fn listed_models_of_a_lost_shard_are_not_run_shard_task_lost() {
        let reports =
            [(PathBuf::from("0.json"), shard("0/2", "2024-01-01T10:00:00Z", "2024-01-01T10:00:01Z", &["a", "c"]))];
        let merged = merge_with_models(&reports, Some(&listed(&[("a", 0), ("b", 1), ("c", 0), ("d", 1)]))).unwrap();
        let units = merged["units"].as_array().unwrap();
        let models: Vec<&str> = units.iter().map(|u| u["model"].as_str().unwrap()).collect();
        assert_eq!(models, ["a", "b", "c", "d"]);
        assert_eq!(
            units[1],
            json!({
                "model": "b", "path": "/models/b", "status": "not_run",
                "error": {"kind": "not_run", "message": "not run: shard_task_lost"},
                "reason": "shard_task_lost", "wall_ms": 0, "shard": "1/2",
            })
        );
        assert_eq!(merged["summary"]["by_status"]["not_run"], 2);
        assert_eq!(merged["summary"]["by_status"]["ok"], 2);
    }

    #[test]
    fn with_a_model_list_no_report_at_all_is_every_model_lost() {
        let merged = merge_with_models(&[], Some(&listed(&[("a", 0), ("b", 1)]))).unwrap();
        assert_eq!(merged["summary"]["by_status"]["not_run"], 2);
        assert_eq!(merged["started_at"], "2024-01-01T09:00:00.000Z");
        assert_eq!(merged["command"], json!(["isorun", "run", "models/"]));
        assert_eq!(merged["settings"], json!({"merged_from": []}));
        assert!(matches!(merge_with_models(&[], None), Err(ReportError::NothingToMerge)));
    }

    #[test]
    fn missing_shards_are_named_and_kept_in_the_merged_settings() {
        let at = ("2024-01-01T10:00:00Z", "2024-01-01T10:00:01Z");
        let reports = [(PathBuf::from("0.json"), shard("0/3", at.0, at.1, &["a"]))];
        assert_eq!(missing_shards(&reports).unwrap(), ["1/3", "2/3"]);
        let merged = merge(&reports).unwrap();
        assert_eq!(merged["settings"]["missing_shards"], json!(["1/3", "2/3"]));

        let mut whole = reports.to_vec();
        whole.push((PathBuf::from("1.json"), shard("1/3", at.0, at.1, &["b"])));
        whole.push((PathBuf::from("2.json"), shard("2/3", at.0, at.1, &["c"])));
        assert!(missing_shards(&whole).unwrap().is_empty());
        assert!(merge(&whole).unwrap()["settings"].get("missing_shards").is_none());

        let mut unsharded = shard("0/1", at.0, at.1, &["a"]);
        unsharded["settings"].as_object_mut().unwrap().remove("shard");
        assert!(missing_shards(&[(PathBuf::from("r.json"), unsharded)]).unwrap().is_empty());

        let other_count = [whole[0].clone(), (PathBuf::from("x.json"), shard("1/2", at.0, at.1, &["b"]))];
        assert_eq!(
            merge(&other_count).unwrap_err().to_string(),
            "0.json is shard 0/3 but x.json is shard 1/2: not shards of one run"
        );
    }

    #[test]
    fn a_run_report_and_an_eval_report_are_not_merged() {
        let at = ("2024-01-01T10:00:00Z", "2024-01-01T10:00:01Z");
        let mut eval = shard("1/2", at.0, at.1, &["b"]);
        eval["settings"]["eval"] = json!({"label": "y"});
        let reports =
            [(PathBuf::from("run.json"), shard("0/2", at.0, at.1, &["a"])), (PathBuf::from("eval.json"), eval)];
        assert_eq!(
            merge(&reports).unwrap_err().to_string(),
            "cannot merge the run report run.json with the eval report eval.json: they are not shards of one run"
        );
    }

    #[test]
    fn a_shard_k_of_n_with_k_not_below_n_is_refused() {
        let at = ("2024-01-01T10:00:00Z", "2024-01-01T10:00:01Z");
        for (bad, text) in [("2/2", "2/2"), ("0/0", "0/0"), ("7/3", "7/3")] {
            let reports = [
                (PathBuf::from("0.json"), shard("0/2", at.0, at.1, &["a"])),
                (PathBuf::from("1.json"), shard("1/2", at.0, at.1, &["b"])),
                (PathBuf::from("bad.json"), shard(bad, at.0, at.1, &["c"])),
            ];
            let want = format!(
                "bad.json: settings.shard is {text}: not a shard K/N (K must be from 0 to N-1, and N at least 1)"
            );
            assert_eq!(merge(&reports).unwrap_err().to_string(), want);
        }
        let mut object = shard("0/1", at.0, at.1, &["a"]);
        object["settings"]["shard"] = json!({"index": 0, "count": 0});
        let error = missing_shards(&[(PathBuf::from("o.json"), object)]).unwrap_err();
        assert!(matches!(error, ReportError::BadShard { .. }), "{error}");
    }

    #[test]
    fn a_model_in_two_shards_is_refused() {
        let reports = [
            (PathBuf::from("first.json"), shard("0/2", "2024-01-01T10:00:00Z", "2024-01-01T10:00:01Z", &["a", "b"])),
            (PathBuf::from("second.json"), shard("1/2", "2024-01-01T10:00:00Z", "2024-01-01T10:00:01Z", &["b"])),
        ];
        let error = merge(&reports).unwrap_err().to_string();
        assert_eq!(error, "model b is in two reports: first.json and second.json");
    }
}
