//! `isorun report merge`: the reports of shard runs (`--shard K/N` on N
//! machines) joined into the report the whole run would have made. Units
//! are sorted by model id, as one run would have found them; a model in
//! two reports means the shards overlap (or one report was given twice),
//! which is refused rather than guessed at.

use super::document::{assemble, Header};
use super::junit::shard_text;
use super::timestamp::parse_rfc3339;
use super::unit::Unit;
use super::ReportError;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The merged report of `reports` (each with the file it came from).
pub fn merge(reports: &[(PathBuf, Value)]) -> Result<Value, ReportError> {
    let Some((_, first)) = reports.first() else {
        return Err(ReportError::NothingToMerge);
    };
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

    let mut settings = first["settings"].as_object().cloned().unwrap_or_default();
    settings.remove("shard");
    let merged_from: Vec<String> =
        reports.iter().map(|(path, report)| shard_text(report).unwrap_or_else(|| path.display().to_string())).collect();
    settings.insert("merged_from".into(), json!(merged_from));

    let header = Header {
        isorun_version: first["isorun_version"].as_str().unwrap_or(env!("CARGO_PKG_VERSION")).to_string(),
        tensorflow_version: reports
            .iter()
            .find_map(|(_, report)| report["tensorflow_version"].as_str())
            .map(str::to_string),
        started_at_ms,
        finished_at_ms,
        command: first["command"].clone(),
        settings: Value::Object(settings),
        machine: first["machine"].clone(),
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
