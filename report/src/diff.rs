//! `isorun report diff OLD NEW`: what changed between two runs, the
//! question a nightly job asks of last night's report. Units are matched
//! by model id. Only a model that passed before and fails now makes the
//! exit code 1, so the command can gate a pipeline without failing on
//! models that were already broken.

use super::text::one_line;
use super::unit::{bytes_text, seconds_text, Unit, Verdict};
use super::ReportError;
use isorun_eval::{paired_change, PairedChange};
use isorun_protocol::short_number;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Wall times below this count as this much: a model going from 2 ms to
/// 9 ms is noise, not a slowdown.
const SMALLEST_COMPARED_TIME_MS: u64 = 50;

/// What the diff looks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Slower: wall time grew by more than this factor.
    pub time_ratio: f64,
    /// Bigger: peak memory grew by more than this factor.
    pub memory_ratio: f64,
}

/// One difference between two reports, for one model.
#[derive(Debug, Clone, PartialEq)]
pub enum Finding {
    /// Passed before, does not now.
    NewlyFailing { model: String, old_status: String, status: String, message: String },
    /// Did not pass before, passes now.
    NewlyPassing { model: String, old_status: String },
    /// Passed both times, and took more than `time_ratio` times as long.
    Slower { model: String, old_wall_ms: u64, new_wall_ms: u64 },
    /// Passed both times, and its peak memory grew by more than `memory_ratio`.
    Bigger { model: String, old_peak_rss_bytes: u64, new_peak_rss_bytes: u64 },
    /// An evaluation metric changed (`isorun eval` reports); `worse` in
    /// the metric's own direction (lower is better for losses and errors).
    /// `paired`: both reports were made with the same `--ci` bootstrap, so
    /// the change is paired over the same examples' replicates.
    Metric { model: String, metric: String, old: f64, new: f64, worse: bool, paired: Option<PairedChange> },
    /// Only in the new report.
    Added { model: String, status: String },
    /// Only in the old report.
    Removed { model: String, old_status: String },
}

impl Finding {
    /// The `change` word of the JSON form.
    pub fn change(&self) -> &'static str {
        match self {
            Finding::NewlyFailing { .. } => "newly_failing",
            Finding::NewlyPassing { .. } => "newly_passing",
            Finding::Slower { .. } => "slower",
            Finding::Bigger { .. } => "bigger",
            Finding::Metric { worse: true, .. } => "metric_worse",
            Finding::Metric { worse: false, .. } => "metric_better",
            Finding::Added { .. } => "added",
            Finding::Removed { .. } => "removed",
        }
    }

    pub fn model(&self) -> &str {
        match self {
            Finding::NewlyFailing { model, .. }
            | Finding::NewlyPassing { model, .. }
            | Finding::Slower { model, .. }
            | Finding::Bigger { model, .. }
            | Finding::Metric { model, .. }
            | Finding::Added { model, .. }
            | Finding::Removed { model, .. } => model,
        }
    }

    /// One line for people: `newly failing  models/a  crashed: killed by SIGSEGV`.
    pub fn text(&self) -> String {
        let label = self.change().replace('_', " ");
        let detail = match self {
            Finding::NewlyFailing { message, .. } => message.clone(),
            Finding::NewlyPassing { old_status, .. } => format!("ok, was {old_status}"),
            Finding::Slower { old_wall_ms, new_wall_ms, .. } => format!(
                "{} -> {} (x{:.2})",
                seconds_text(*old_wall_ms),
                seconds_text(*new_wall_ms),
                ratio(*old_wall_ms, *new_wall_ms)
            ),
            Finding::Bigger { old_peak_rss_bytes, new_peak_rss_bytes, .. } => format!(
                "{} -> {} (x{:.2})",
                bytes_text(*old_peak_rss_bytes),
                bytes_text(*new_peak_rss_bytes),
                ratio(*old_peak_rss_bytes, *new_peak_rss_bytes)
            ),
            Finding::Metric { metric, old, new, paired, .. } => {
                let change = new - old;
                let sign = if change >= 0.0 { "+" } else { "" };
                let paired = match paired {
                    Some(p) => format!(
                        ", {} [{}, {}] p={:.3}",
                        if p.significant { "significant" } else { "not significant" },
                        short_number(p.interval.0),
                        short_number(p.interval.1),
                        p.p
                    ),
                    None => String::new(),
                };
                format!(
                    "{metric} {} -> {} ({sign}{}{paired})",
                    short_number(*old),
                    short_number(*new),
                    short_number(change)
                )
            }
            Finding::Added { status, .. } => status.clone(),
            Finding::Removed { old_status, .. } => format!("was {old_status}"),
        };
        // Model ids, statuses and messages come from the reports: a newline
        // or an escape sequence in them must not forge or hide a finding.
        format!("{label}  {}  {}", one_line(self.model()), one_line(&detail))
    }

    /// One JSON object for programs: `{"change", "model", ...}`.
    pub fn json(&self) -> Value {
        let model = self.model();
        match self {
            Finding::NewlyFailing { old_status, status, message, .. } => json!({
                "change": self.change(), "model": model, "old_status": old_status, "status": status, "message": message,
            }),
            Finding::NewlyPassing { old_status, .. } => {
                json!({"change": self.change(), "model": model, "old_status": old_status, "status": "ok"})
            }
            Finding::Slower { old_wall_ms, new_wall_ms, .. } => json!({
                "change": self.change(), "model": model, "old_wall_ms": old_wall_ms, "new_wall_ms": new_wall_ms,
                "ratio": rounded_ratio(*old_wall_ms, *new_wall_ms),
            }),
            Finding::Bigger { old_peak_rss_bytes, new_peak_rss_bytes, .. } => json!({
                "change": self.change(), "model": model,
                "old_peak_rss_bytes": old_peak_rss_bytes, "new_peak_rss_bytes": new_peak_rss_bytes,
                "ratio": rounded_ratio(*old_peak_rss_bytes, *new_peak_rss_bytes),
            }),
            Finding::Metric { metric, old, new, paired, .. } => {
                let mut finding = json!({
                    "change": self.change(), "model": model, "metric": metric, "old": old, "new": new, "delta": new - old,
                });
                if let Some(p) = paired {
                    finding["ci"] = json!([p.interval.0, p.interval.1]);
                    finding["p"] = json!(p.p);
                    finding["significant"] = json!(p.significant);
                }
                finding
            }
            Finding::Added { status, .. } => json!({"change": self.change(), "model": model, "status": status}),
            Finding::Removed { old_status, .. } => {
                json!({"change": self.change(), "model": model, "old_status": old_status})
            }
        }
    }
}

fn ratio(old: u64, new: u64) -> f64 {
    if old == 0 {
        f64::INFINITY
    } else {
        new as f64 / old as f64
    }
}

/// The ratio to two decimals, or `null` when the old value was 0.
fn rounded_ratio(old: u64, new: u64) -> Value {
    let ratio = ratio(old, new);
    if ratio.is_finite() {
        json!((ratio * 100.0).round() / 100.0)
    } else {
        Value::Null
    }
}

/// Every finding, newly failing first, then newly passing, slower, bigger,
/// added, removed; within each, by model id. A report that has a model
/// twice is refused.
pub fn diff(old: &Value, new: &Value, thresholds: Thresholds) -> Result<Vec<Finding>, ReportError> {
    // A model twice in one report (an edited or forged file) would make
    // one of its units hide the other: refused, as `merge` refuses it.
    let by_model = |report: &Value, which: &'static str| -> Result<BTreeMap<String, Value>, ReportError> {
        let mut units = BTreeMap::new();
        for unit in report["units"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let model = Unit(unit).model();
            if units.insert(model.to_string(), unit.clone()).is_some() {
                return Err(ReportError::TwiceInReport { model: model.to_string(), which });
            }
        }
        Ok(units)
    };
    let (old_units, new_units) = (by_model(old, "old")?, by_model(new, "new")?);
    let mut findings = Vec::new();
    for (model, old_unit) in &old_units {
        let old_unit = Unit(old_unit);
        let Some(new_unit) = new_units.get(model).map(Unit) else {
            findings.push(Finding::Removed { model: model.clone(), old_status: old_unit.status().to_string() });
            continue;
        };
        match (old_unit.verdict(), new_unit.verdict()) {
            (Verdict::Passed, Verdict::Passed) => {
                if let (Some(old_wall_ms), Some(new_wall_ms)) = (old_unit.wall_ms(), new_unit.wall_ms()) {
                    let (old_compared, new_compared) =
                        (old_wall_ms.max(SMALLEST_COMPARED_TIME_MS), new_wall_ms.max(SMALLEST_COMPARED_TIME_MS));
                    if new_compared as f64 > old_compared as f64 * thresholds.time_ratio {
                        findings.push(Finding::Slower { model: model.clone(), old_wall_ms, new_wall_ms });
                    }
                }
                if let (Some(old_peak_rss_bytes), Some(new_peak_rss_bytes)) =
                    (old_unit.peak_rss_bytes(), new_unit.peak_rss_bytes())
                {
                    if new_peak_rss_bytes as f64 > old_peak_rss_bytes as f64 * thresholds.memory_ratio {
                        findings.push(Finding::Bigger { model: model.clone(), old_peak_rss_bytes, new_peak_rss_bytes });
                    }
                }
            }
            (Verdict::Passed, _) => findings.push(Finding::NewlyFailing {
                model: model.clone(),
                old_status: old_unit.status().to_string(),
                status: new_unit.status().to_string(),
                message: new_unit.failure_text(),
            }),
            (_, Verdict::Passed) => {
                findings.push(Finding::NewlyPassing { model: model.clone(), old_status: old_unit.status().to_string() })
            }
            _ => {}
        }
        metric_changes(model, &old_unit, &new_unit, &mut findings);
    }
    for (model, new_unit) in &new_units {
        if !old_units.contains_key(model) {
            findings.push(Finding::Added { model: model.clone(), status: Unit(new_unit).status().to_string() });
        }
    }
    findings.sort_by_key(|finding| {
        let rank =
            ["newly_failing", "newly_passing", "slower", "bigger", "metric_worse", "metric_better", "added", "removed"]
                .iter()
                .position(|change| *change == finding.change());
        (rank, finding.model().to_string())
    });
    Ok(findings)
}

/// Every metric both units have, whose value changed.
fn metric_changes(model: &str, old: &Unit<'_>, new: &Unit<'_>, findings: &mut Vec<Finding>) {
    let (old_record, new_record) = (old.0, new.0);
    let (Some(Value::Object(old_metrics)), Some(Value::Object(new_metrics))) =
        (old.0.get("metrics"), new.0.get("metrics"))
    else {
        return;
    };
    for (metric, new_value) in new_metrics {
        let (Some(old), Some(new)) = (old_metrics.get(metric).and_then(Value::as_f64), new_value.as_f64()) else {
            continue;
        };
        if old != new {
            // The metric's own direction; a name isorun-eval does not know counts as higher-is-better.
            let higher_is_better = isorun_eval::Metric::parse(metric).map_or(true, |m| m.higher_is_better());
            let worse = if higher_is_better { new < old } else { new > old };
            let paired = paired_of(old_record, new_record, metric);
            findings.push(Finding::Metric {
                model: model.to_string(),
                metric: metric.clone(),
                old,
                new,
                worse,
                paired,
            });
        }
    }
}

/// The paired change of `metric` when both records carry replicates of the
/// same bootstrap (replicates, seed, keying) and level.
fn paired_of(old: &Value, new: &Value, metric: &str) -> Option<PairedChange> {
    let level = new["ci_level"].as_f64()?;
    if old["bootstrap"] != new["bootstrap"] || old["ci_level"] != new["ci_level"] || !new["bootstrap"].is_object() {
        return None;
    }
    let values = |unit: &Value| -> Option<Vec<f64>> {
        let list = unit["bootstrap_values"][metric].as_array()?;
        Some(list.iter().map(|v| v.as_f64().unwrap_or(f64::NAN)).collect())
    };
    paired_change(&values(new)?, &values(old)?, level)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THRESHOLDS: Thresholds = Thresholds { time_ratio: 1.5, memory_ratio: 1.2 };

    fn report(units: Value) -> Value {
        json!({"schema_version": 1, "units": units})
    }

    #[test]
    fn metric_changes_are_worse_or_better_in_the_metric_s_direction() {
        let old =
            report(json!([{"model": "m", "status": "ok", "metrics": {"accuracy": 0.9, "log_loss": 0.3, "auc": 0.8}}]));
        let new =
            report(json!([{"model": "m", "status": "ok", "metrics": {"accuracy": 0.85, "log_loss": 0.2, "auc": 0.8}}]));
        let findings = diff(&old, &new, THRESHOLDS).unwrap();
        let changes: Vec<(&str, &str)> = findings
            .iter()
            .map(|f| match f {
                Finding::Metric { metric, .. } => (f.change(), metric.as_str()),
                _ => (f.change(), ""),
            })
            .collect();
        assert_eq!(changes, [("metric_worse", "accuracy"), ("metric_better", "log_loss")]);
        assert_eq!(findings[0].json()["delta"].as_f64().unwrap(), 0.85 - 0.9);
        // With the same bootstrap in both, the change is paired: significant when its interval excludes 0.
        let boot = json!({"replicates": 4, "seed": 0, "by": "index"});
        let old = report(json!([{"model": "m", "status": "ok", "metrics": {"accuracy": 0.9}, "ci_level": 0.95,
            "bootstrap": boot, "bootstrap_values": {"accuracy": [0.9, 0.91, 0.89, 0.9]}}]));
        let new = report(json!([{"model": "m", "status": "ok", "metrics": {"accuracy": 0.8}, "ci_level": 0.95,
            "bootstrap": boot, "bootstrap_values": {"accuracy": [0.8, 0.8, 0.79, 0.81]}}]));
        let findings = diff(&old, &new, THRESHOLDS).unwrap();
        assert!(findings[0].text().contains("significant ["), "{}", findings[0].text());
        assert_eq!(findings[0].json()["significant"], json!(true));
    }

    #[test]
    fn each_change_is_found_once() {
        let old = report(json!([
            {"model": "breaks", "status": "ok", "wall_ms": 100},
            {"model": "heals", "status": "crashed", "wall_ms": 100},
            {"model": "slows", "status": "ok", "wall_ms": 1200},
            {"model": "grows", "status": "ok", "wall_ms": 100, "peak_rss_bytes": 100_000_000},
            {"model": "tiny", "status": "ok", "wall_ms": 2},
            {"model": "steady", "status": "ok", "wall_ms": 100, "peak_rss_bytes": 100_000_000},
            {"model": "still_broken", "status": "error", "wall_ms": 100},
            {"model": "gone", "status": "ok"},
        ]));
        let new = report(json!([
            {"model": "breaks", "status": "crashed", "wall_ms": 10,
             "error": {"kind": "crashed", "message": "crashed: killed by SIGSEGV"}},
            {"model": "heals", "status": "ok", "wall_ms": 100},
            {"model": "slows", "status": "ok", "wall_ms": 2500},
            {"model": "grows", "status": "ok", "wall_ms": 100, "peak_rss_bytes": 130_000_000},
            {"model": "tiny", "status": "ok", "wall_ms": 40},
            {"model": "steady", "status": "ok", "wall_ms": 140, "peak_rss_bytes": 110_000_000},
            {"model": "still_broken", "status": "timeout", "wall_ms": 100},
            {"model": "new", "status": "error"},
        ]));
        let findings = diff(&old, &new, THRESHOLDS).unwrap();
        let lines: Vec<String> = findings.iter().map(Finding::text).collect();
        assert_eq!(
            lines,
            [
                "newly failing  breaks  crashed: killed by SIGSEGV",
                "newly passing  heals  ok, was crashed",
                "slower  slows  1.20 s -> 2.50 s (x2.08)",
                "bigger  grows  95 MiB -> 124 MiB (x1.30)",
                "added  new  error",
                "removed  gone  was ok",
            ]
        );
        assert_eq!(
            findings[0].json(),
            json!({"change": "newly_failing", "model": "breaks", "old_status": "ok", "status": "crashed",
                   "message": "crashed: killed by SIGSEGV"})
        );
        assert_eq!(findings[2].json()["ratio"], 2.08);
    }

    #[test]
    fn a_message_or_model_id_cannot_forge_a_finding() {
        let old = report(json!([{"model": "m\x1b[2K", "status": "ok"}]));
        let new = report(json!([{"model": "m\x1b[2K", "status": "crashed",
                                 "error": {"kind": "crashed", "message": "crashed: boom\nnewly passing  other  ok, was crashed\r"}}]));
        let findings = diff(&old, &new, THRESHOLDS).unwrap();
        let text = findings[0].text();
        assert_eq!(text, "newly failing  m\\x1b[2K  crashed: boom\\nnewly passing  other  ok, was crashed\\r");
        assert_eq!(
            findings[0].json()["message"],
            "crashed: boom\nnewly passing  other  ok, was crashed\r",
            "JSON keeps the text"
        );
    }

    #[test]
    fn a_report_with_a_model_twice_is_refused() {
        let once = report(json!([{"model": "a", "status": "ok"}]));
        let twice = report(json!([{"model": "a", "status": "ok"}, {"model": "a", "status": "crashed"}]));
        let error = diff(&once, &twice, THRESHOLDS).unwrap_err().to_string();
        assert_eq!(error, "model a is in the new report twice");
        let error = diff(&twice, &once, THRESHOLDS).unwrap_err().to_string();
        assert_eq!(error, "model a is in the old report twice");
    }

    #[test]
    fn tiny_times_count_as_fifty_milliseconds() {
        let old = report(json!([{"model": "a", "status": "ok", "wall_ms": 1}]));
        let quick = report(json!([{"model": "a", "status": "ok", "wall_ms": 70}]));
        assert!(diff(&old, &quick, THRESHOLDS).unwrap().is_empty());
        let slow = report(json!([{"model": "a", "status": "ok", "wall_ms": 80}]));
        assert_eq!(diff(&old, &slow, THRESHOLDS).unwrap()[0].change(), "slower");
    }

    #[test]
    fn same_reports_have_no_findings() {
        let same = report(json!([{"model": "a", "status": "ok", "wall_ms": 100, "peak_rss_bytes": 5}]));
        assert!(diff(&same, &same, THRESHOLDS).unwrap().is_empty());
    }
}
