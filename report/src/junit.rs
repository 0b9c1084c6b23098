//! The report as JUnit XML, the format CI systems show as test results: one
//! test case per model. A failed unit is a `failure` whose type is the
//! status (so CI can group crashes apart from model errors), a `not_run`
//! unit is `skipped` (a failure when its shard task was lost), and a flaky unit passes with its failed attempts kept
//! as `flakyFailure` elements.

use super::unit::{failure_text, Unit, Verdict};
use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestRerun, TestSuite, XmlString};
use serde_json::Value;
use std::time::Duration;

/// The JUnit XML of a report.
pub fn junit_xml(report: &Value) -> Result<String, quick_junit::SerializeError> {
    let mut suite = TestSuite::new(suite_name(report));
    if let Some(wall_ms) = report["wall_ms"].as_u64() {
        suite.set_time(Duration::from_millis(wall_ms));
    }
    if let Some(started_at) = report["started_at"].as_str() {
        suite.extra.insert(XmlString::new("timestamp"), XmlString::new(started_at));
    }
    if let Some(hostname) = report["machine"]["hostname"].as_str() {
        suite.extra.insert(XmlString::new("hostname"), XmlString::new(hostname));
    }
    for key in ["isorun_version", "tensorflow_version"] {
        if let Some(version) = report[key].as_str() {
            suite.add_property(Property::new(key, version));
        }
    }
    if let Some(shard) = shard_text(report) {
        suite.add_property(Property::new("shard", shard));
    }
    let units = report["units"].as_array().map(Vec::as_slice).unwrap_or_default();
    suite.add_test_cases(units.iter().map(|unit| test_case(Unit(unit))));

    let mut junit = Report::new("isorun");
    if let Some(wall_ms) = report["wall_ms"].as_u64() {
        junit.set_time(Duration::from_millis(wall_ms));
    }
    junit.add_test_suite(suite);
    // quick-junit drops the C0 controls XML forbids but not U+FFFE and
    // U+FFFF, which XML forbids too (they are outside its `Char`
    // production): one in a model's name or message made the whole file
    // unreadable to CI. They cannot appear in XML at all, so removing them
    // from the document removes them from every field, present and future.
    Ok(junit.to_string()?.replace(['\u{fffe}', '\u{ffff}'], ""))
}

/// `isorun`, or `isorun shard 1/4` for a shard's report.
fn suite_name(report: &Value) -> String {
    match shard_text(report) {
        Some(shard) => format!("isorun shard {shard}"),
        None => "isorun".to_string(),
    }
}

/// `settings.shard` as text (`1/4`), however it was written.
pub(super) fn shard_text(report: &Value) -> Option<String> {
    match &report["settings"]["shard"] {
        Value::Null => None,
        Value::String(shard) => Some(shard.clone()),
        Value::Object(shard) => match (shard.get("index"), shard.get("count")) {
            (Some(index), Some(count)) => Some(format!("{index}/{count}")),
            _ => Some(Value::Object(shard.clone()).to_string()),
        },
        other => Some(other.to_string()),
    }
}

fn test_case(unit: Unit<'_>) -> TestCase {
    let mut status = match unit.verdict() {
        Verdict::Passed => {
            let mut status = TestCaseStatus::success();
            status.add_reruns(unit.earlier_attempts().iter().filter(|a| a["status"] != "ok").map(rerun));
            status
        }
        // A model lost with its shard task never ran through no choice of
        // the user's: a dashboard must show it red, not skipped.
        Verdict::NotRun if unit.reason() == Some("shard_task_lost") => {
            let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
            status.set_type("not_run");
            status.set_message("not run: shard_task_lost (its Slurm or Kubernetes task failed or was cancelled)");
            status
        }
        Verdict::NotRun => {
            let mut status = TestCaseStatus::skipped();
            status.set_type("not_run");
            status.set_message(
                unit.reason().map_or_else(|| "not run".to_string(), |reason| format!("not run: {reason}")),
            );
            status
        }
        Verdict::Failed => {
            let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
            status.set_type(unit.status());
            status.set_message(unit.error_message().unwrap_or(unit.status()));
            let tail = unit.stderr_tail();
            if !tail.is_empty() {
                status.set_description(tail.join("\n"));
            }
            status.add_reruns(unit.earlier_attempts().iter().map(rerun));
            status
        }
    };
    if unit.verdict() == Verdict::Passed && unit.flaky() && unit.earlier_attempts().is_empty() {
        // An old report counts attempts without saying how they ended.
        let mut earlier = TestRerun::new(NonSuccessKind::Failure);
        earlier.set_message("an earlier attempt failed");
        status.add_rerun(earlier);
    }
    let mut case = TestCase::new(unit.model(), status);
    case.set_classname("isorun");
    if let Some(wall_ms) = unit.wall_ms() {
        case.set_time(Duration::from_millis(wall_ms));
    }
    let tail = unit.stderr_tail();
    if unit.verdict() == Verdict::Failed && !tail.is_empty() {
        case.set_system_err(tail.join("\n"));
    }
    if unit.flaky() {
        case.add_property(Property::new("flaky", "true"));
    }
    if let Some(attempts) = unit.attempt_count().filter(|&n| n > 1) {
        case.add_property(Property::new("attempts", attempts.to_string()));
    }
    // An evaluation's numbers, for CI dashboards that chart properties.
    if let Some(examples) = unit.0.get("examples").and_then(Value::as_u64) {
        case.add_property(Property::new("examples", examples.to_string()));
    }
    if let Some(Value::Object(metrics)) = unit.0.get("metrics") {
        for (name, value) in metrics {
            case.add_property(Property::new(format!("metric.{name}"), value.to_string()));
            if let Some(ci) = unit.0.get("ci").and_then(|ci| ci.get(name)).filter(|ci| ci.is_array()) {
                case.add_property(Property::new(format!("ci.{name}"), ci.to_string()));
            }
        }
        // `--ci` intervals and changes against the baseline, as text a CI page shows.
        if unit.0.get("ci").is_some() || unit.0.get("change").is_some() {
            let lines: Vec<String> = metrics
                .keys()
                .filter_map(|name| Some(format!("{name} {}", crate::change::metric_text(unit.0, name)?)))
                .collect();
            if unit.verdict() != Verdict::Failed || unit.stderr_tail().is_empty() {
                case.set_system_out(lines.join("\n"));
            }
        }
    }
    case
}

/// An earlier attempt of a unit, as a `flakyFailure` or `rerunFailure`.
fn rerun(attempt: &Value) -> TestRerun {
    let status = attempt["status"].as_str().unwrap_or("failed");
    let mut rerun = TestRerun::new(NonSuccessKind::Failure);
    rerun.set_type(status);
    rerun.set_message(failure_text(status, attempt["error"]["message"].as_str()));
    if let Some(wall_ms) = attempt["wall_ms"].as_u64() {
        rerun.set_time(Duration::from_millis(wall_ms));
    }
    if let Some(Value::Array(lines)) = attempt.get("stderr_tail") {
        let lines: Vec<&str> = lines.iter().filter_map(Value::as_str).collect();
        rerun.set_system_err(lines.join("\n"));
    }
    rerun
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_model_lost_with_its_shard_task_is_a_failure() {
        let report = json!({
            "isorun_version": "0.1.0",
            "units": [{"model": "m", "status": "not_run", "reason": "shard_task_lost", "shard": "2/4"}]
        });
        let xml = junit_xml(&report).unwrap();
        assert!(xml.contains(r#"failures="1""#), "{xml}");
        assert!(xml.contains(r#"type="not_run">"#) || xml.contains(r#"type="not_run"/>"#), "{xml}");
        assert!(!xml.contains("<skipped"), "{xml}");
    }

    #[test]
    fn statuses_become_successes_failures_and_skips() {
        let report = json!({
            "isorun_version": "0.1.0",
            "wall_ms": 1500,
            "settings": {"shard": "1/4"},
            "units": [
                {"model": "a", "status": "ok", "wall_ms": 10, "attempts": 1},
                {"model": "b<&>", "status": "crashed", "wall_ms": 20,
                 "error": {"kind": "crashed", "message": "crashed: killed by SIGSEGV"},
                 "stderr_tail": ["line \u{1b}[31mone", "line <two>"]},
                {"model": "c", "status": "not_run", "reason": "interrupted"},
                {"model": "d", "status": "ok", "flaky": true, "attempts": [
                    {"status": "timeout", "error": {"kind": "timeout", "message": "timeout while in phase run"}, "wall_ms": 3000},
                    {"status": "ok", "wall_ms": 12}
                ]}
            ]
        });
        let xml = junit_xml(&report).unwrap();
        assert!(
            xml.contains(r#"<testsuite name="isorun shard 1/4" tests="4" disabled="1" errors="0" failures="1""#),
            "{xml}"
        );
        assert!(xml.contains(r#"<property name="isorun_version" value="0.1.0"/>"#), "{xml}");
        assert!(xml.contains(r#"<testcase name="b&lt;&amp;&gt;" classname="isorun" time="0.020">"#), "{xml}");
        assert!(xml.contains(r#"<failure message="crashed: killed by SIGSEGV" type="crashed">line one"#), "{xml}");
        assert!(xml.contains(r#"<skipped message="not run: interrupted" type="not_run"/>"#), "{xml}");
        assert!(
            xml.contains(r#"<flakyFailure time="3.000" message="timeout while in phase run" type="timeout">"#),
            "{xml}"
        );
        assert!(xml.contains(r#"<property name="flaky" value="true"/>"#), "{xml}");
    }

    #[test]
    fn metrics_are_properties_and_a_breach_is_a_failure() {
        let report = json!({
            "units": [
                {"model": "a", "status": "ok", "examples": 1000, "metrics": {"accuracy": 0.75, "auc": 0.5}},
                {"model": "b", "status": "below_threshold", "examples": 1000, "metrics": {"accuracy": 0.5},
                 "error": {"kind": "below_threshold", "message": "below threshold: accuracy>=0.9 not met: 0.5"},
                 "breach": {"metric": "accuracy", "rule": "accuracy>=0.9", "bound": 0.9, "value": 0.5}}
            ]
        });
        let xml = junit_xml(&report).unwrap();
        assert!(xml.contains(r#"<property name="metric.accuracy" value="0.75"/>"#), "{xml}");
        let with_ci = json!({"units": [{"model": "a", "status": "ok", "metrics": {"accuracy": 0.75},
            "ci": {"accuracy": [0.7, 0.8]}, "change": {"accuracy": {"baseline": 0.8, "delta": -0.05}}}]});
        let ci_xml = junit_xml(&with_ci).unwrap();
        assert!(ci_xml.contains(r#"<property name="ci.accuracy" value="[0.7,0.8]"/>"#), "{ci_xml}");
        assert!(ci_xml.contains("accuracy 0.7500 [0.700, 0.800] (-0.0500)</system-out>"), "{ci_xml}");
        assert!(xml.contains(r#"<property name="examples" value="1000"/>"#), "{xml}");
        assert!(xml.contains(r#"failures="1""#), "{xml}");
        assert!(
            xml.contains(r#"<failure message="below threshold: accuracy&gt;=0.9 not met: 0.5" type="below_threshold""#),
            "{xml}"
        );
    }

    #[test]
    fn noncharacters_in_a_name_or_message_leave_the_xml_well_formed() {
        let report = json!({
            "units": [
                {"model": "a\u{fffe}b\u{ffff}", "status": "crashed",
                 "error": {"kind": "crashed", "message": "bad \u{ffff} message \u{1b}[31m \u{fdd0}"},
                 "stderr_tail": ["tail \u{fffe}", "\u{1fffe} more"]},
                {"model": "ok\u{ffff}", "status": "ok", "metrics": {"accuracy\u{fffe}": 0.5}}
            ]
        });
        let xml = junit_xml(&report).unwrap();
        let document = roxmltree::Document::parse(&xml).unwrap_or_else(|e| panic!("{e}: {xml}"));
        let names: Vec<&str> =
            document.descendants().filter(|n| n.has_tag_name("testcase")).filter_map(|n| n.attribute("name")).collect();
        assert_eq!(names, ["ab", "ok"]);
    }
}
