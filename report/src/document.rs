//! The report document (`--report`): one JSON object holding the whole
//! run, made to be kept and compared: when and where it ran, with which
//! settings, a summary, and every unit record without output values
//! (values can be huge, and `--output-dir` keeps them better).

use super::timestamp::{format_rfc3339, unix_milliseconds};
use super::unit::{Unit, STATUSES};
use serde_json::{json, Map, Value};
use std::time::SystemTime;

/// The `schema_version` this isorun writes. A change that would break a
/// reader of reports increases it. Version 2 (`isorun eval`) added, per
/// unit, `examples`, `metrics`, `slices`, `task`, `output`, `breach` and
/// `breaches` (of status `below_threshold`; `breaches`, every rule missed,
/// is an addition a reader may ignore), `baseline_metrics` and `change`; a version 1
/// report is a version 2 report without them, so both are read.
pub const SCHEMA_VERSION: u64 = 2;

/// The oldest `schema_version` this isorun reads.
pub const OLDEST_SCHEMA_VERSION: u64 = 1;

/// What the report says about the run as a whole.
#[derive(Debug, Clone)]
pub struct RunInfo {
    pub started_at: SystemTime,
    pub finished_at: SystemTime,
    /// The command line, program name first.
    pub command: Vec<String>,
    /// The settings the run used (as `run` resolved them), kept as given.
    pub settings: Value,
    /// The TensorFlow version a worker reported, when one started.
    pub tensorflow_version: Option<String>,
}

/// The report of a run from its unit records (in model order).
pub fn build(records: &[Value], info: &RunInfo) -> Value {
    let header = Header {
        isorun_version: env!("CARGO_PKG_VERSION").to_string(),
        tensorflow_version: info.tensorflow_version.clone(),
        started_at_ms: unix_milliseconds(info.started_at),
        finished_at_ms: unix_milliseconds(info.finished_at),
        command: json!(info.command),
        settings: info.settings.clone(),
        machine: this_machine(),
    };
    assemble(header, records.iter().map(without_values).collect())
}

/// Everything in a report but its units and summary.
#[derive(Debug, Clone)]
pub(super) struct Header {
    pub isorun_version: String,
    pub tensorflow_version: Option<String>,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
    pub command: Value,
    pub settings: Value,
    pub machine: Value,
}

/// The report object, keys in their documented order.
pub(super) fn assemble(header: Header, units: Vec<Value>) -> Value {
    let mut report = Map::new();
    report.insert("schema_version".into(), json!(SCHEMA_VERSION));
    report.insert("isorun_version".into(), json!(header.isorun_version));
    if let Some(version) = header.tensorflow_version {
        report.insert("tensorflow_version".into(), json!(version));
    }
    report.insert("started_at".into(), json!(format_rfc3339(header.started_at_ms)));
    report.insert("finished_at".into(), json!(format_rfc3339(header.finished_at_ms)));
    let wall_ms = header.finished_at_ms.saturating_sub(header.started_at_ms).max(0);
    report.insert("wall_ms".into(), json!(wall_ms));
    report.insert("command".into(), header.command);
    report.insert("settings".into(), header.settings);
    report.insert("machine".into(), header.machine);
    report.insert("summary".into(), summary(&units));
    report.insert("units".into(), Value::Array(units));
    Value::Object(report)
}

/// `{"total", "by_status": {status: count}, "flaky", "resumed"}`; every
/// known status is listed, with 0 when none had it, so `jq
/// .summary.by_status.crashed` is always a number.
pub fn summary(units: &[Value]) -> Value {
    let mut by_status: Map<String, Value> = STATUSES.iter().map(|status| (status.to_string(), json!(0))).collect();
    for unit in units.iter().map(Unit) {
        let count = by_status.entry(unit.status()).or_insert(json!(0));
        *count = json!(count.as_u64().unwrap_or(0) + 1);
    }
    json!({
        "total": units.len(),
        "by_status": by_status,
        "flaky": units.iter().filter(|unit| Unit(unit).flaky()).count(),
        "resumed": units.iter().filter(|unit| Unit(unit).resumed()).count(),
    })
}

/// A record as the report keeps it: output values removed.
fn without_values(record: &Value) -> Value {
    let mut record = record.clone();
    if let Some(outputs) = record.get_mut("outputs").and_then(Value::as_object_mut) {
        for output in outputs.values_mut() {
            if let Some(output) = output.as_object_mut() {
                output.remove("values");
            }
        }
    }
    record
}

/// Where the run happened; what cannot be read is left out.
fn this_machine() -> Value {
    let read = |path: &str| std::fs::read_to_string(path).ok().map(|text| text.trim().to_string());
    let mut machine = Map::new();
    if let Some(hostname) = read("/proc/sys/kernel/hostname") {
        machine.insert("hostname".into(), json!(hostname));
    }
    machine.insert("os".into(), json!(std::env::consts::OS));
    if let Some(kernel) = read("/proc/sys/kernel/osrelease") {
        machine.insert("kernel".into(), json!(kernel));
    }
    if let Ok(cpus) = std::thread::available_parallelism() {
        machine.insert("cpus".into(), json!(cpus.get()));
    }
    if let Some(bytes) = read("/proc/meminfo").as_deref().and_then(memory_total_bytes) {
        machine.insert("memory_bytes".into(), json!(bytes));
    }
    Value::Object(machine)
}

/// `MemTotal:  16384 kB` from /proc/meminfo, in bytes.
fn memory_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kibibytes: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kibibytes * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn info() -> RunInfo {
        RunInfo {
            started_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_000),
            finished_at: UNIX_EPOCH + Duration::from_millis(1_700_000_002_500),
            command: vec!["isorun".into(), "run".into(), "models/".into()],
            settings: json!({"jobs": 2}),
            tensorflow_version: Some("2.21.0".into()),
        }
    }

    #[test]
    fn the_summary_counts_statuses_flaky_and_resumed_units() {
        let records = [
            json!({"model": "a", "status": "ok", "flaky": true}),
            json!({"model": "b", "status": "ok", "resumed": true}),
            json!({"model": "c", "status": "crashed"}),
            json!({"model": "d", "status": "not_run", "reason": "interrupted"}),
            json!({"model": "e", "status": "ok"}),
        ];
        let report = build(&records, &info());
        let summary = &report["summary"];
        assert_eq!(summary["total"], 5);
        assert_eq!(summary["by_status"]["ok"], 3);
        assert_eq!(summary["by_status"]["crashed"], 1);
        assert_eq!(summary["by_status"]["not_run"], 1);
        assert_eq!(summary["by_status"]["timeout"], 0);
        assert_eq!(summary["flaky"], 1);
        assert_eq!(summary["resumed"], 1);
        let statuses: Vec<&String> = summary["by_status"].as_object().unwrap().keys().collect();
        assert_eq!(statuses, STATUSES, "every status, in order");
    }

    #[test]
    fn the_report_holds_the_run_and_drops_output_values() {
        let records = [json!({"model": "a", "status": "ok", "outputs": {
            "y": {"dtype": "float32", "shape": [1], "values": [1.5]}
        }})];
        let report = build(&records, &info());
        let keys: Vec<&String> = report.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "schema_version",
                "isorun_version",
                "tensorflow_version",
                "started_at",
                "finished_at",
                "wall_ms",
                "command",
                "settings",
                "machine",
                "summary",
                "units"
            ]
        );
        assert_eq!(report["schema_version"], 2);
        assert_eq!(report["started_at"], "2023-11-14T22:13:20.000Z");
        assert_eq!(report["finished_at"], "2023-11-14T22:13:22.500Z");
        assert_eq!(report["wall_ms"], 2500);
        assert_eq!(report["machine"]["os"], "linux");
        assert_eq!(report["units"][0]["outputs"]["y"], json!({"dtype": "float32", "shape": [1]}));
    }

    #[test]
    fn memory_total_is_read_from_meminfo() {
        assert_eq!(memory_total_bytes("MemTotal:       16384 kB\nMemFree: 1 kB\n"), Some(16384 * 1024));
        assert_eq!(memory_total_bytes("MemFree: 1 kB\n"), None);
    }
}
