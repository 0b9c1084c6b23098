//! The report as one self-contained HTML page (`--html`): styles, script
//! and charts are inline, nothing is fetched, so the file can be mailed,
//! archived as a CI artifact and opened years later offline. Failures come
//! first because they are why people open it. Every string taken from the
//! records is escaped: model ids, messages and stderr are not trusted.
//!
//! The table sorts when a header is clicked, and on load from the address
//! (`report.html#sort=peak_rss_bytes:desc`), so a sorted view can be
//! linked. When its script has run, the page marks `<html>` with
//! `data-isorun-ready` (the number of table rows); a script error is
//! recorded in `data-isorun-errors`.

use super::change::delta_of;
pub use super::escape::escape_html;
use super::timestamp::parse_rfc3339;
use super::unit::{bytes_text, seconds_text, Unit, Verdict};
use isorun_eval::Metric;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::fmt::Write;

/// The whole page.
pub fn html_page(report: &Value) -> String {
    let units: Vec<Unit<'_>> =
        report["units"].as_array().map(|units| units.iter().map(Unit).collect()).unwrap_or_default();
    let date = report["started_at"].as_str().map_or_else(|| "date unknown".to_string(), readable_time);
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <link rel=\"icon\" href=\"data:,\">\n<title>isorun report, {date}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <header>\n<h1>isorun report <span class=\"date\">{date}</span></h1>\n",
        date = escape_html(&date)
    );
    page.push_str(&summary_line(report, &units));
    page.push_str(&run_details(report));
    page.push_str("</header>\n<main>\n");
    // An eval report opens on its leaderboard.
    page.push_str(&crate::table::html_leaderboard(report));
    page.push_str(&failures(&units));
    page.push_str(&units_table(&units));
    page.push_str(&evaluation(&units));
    page.push_str(&crate::reliability::reliability_diagrams(&units));
    page.push_str("<section id=\"charts\">\n<h2>Peak memory per model</h2>\n");
    page.push_str(&bar_chart("memory", &units, |unit| unit.peak_rss_bytes(), bytes_text));
    page.push_str("<h2>Wall time per model</h2>\n");
    page.push_str(&bar_chart("time", &units, |unit| unit.wall_ms(), seconds_text));
    page.push_str("</section>\n</main>\n");
    let _ = write!(page, "<script>{SCRIPT}</script>\n</body>\n</html>\n");
    page
}

/// `2023-11-14 22:13:20 UTC` from an RFC 3339 time (the text as it is if
/// it is not one).
fn readable_time(rfc3339: &str) -> String {
    match parse_rfc3339(rfc3339) {
        Some(milliseconds) => {
            let utc = super::timestamp::format_rfc3339(milliseconds);
            format!("{} {} UTC", &utc[..10], &utc[11..19])
        }
        None => rfc3339.to_string(),
    }
}

/// `3 models: 2 ok, 1 failed, 0 not run; total time 0.54 s; peak memory max 303 MiB`.
fn summary_line(report: &Value, units: &[Unit<'_>]) -> String {
    let count = |verdict| units.iter().filter(|unit| unit.verdict() == verdict).count();
    let (passed, failed, not_run) = (count(Verdict::Passed), count(Verdict::Failed), count(Verdict::NotRun));
    let mut line = format!(
        "{} model{}: <span class=\"passed\">{passed} ok</span>, <span class=\"{}\">{failed} failed</span>, {not_run} not run",
        units.len(),
        if units.len() == 1 { "" } else { "s" },
        if failed > 0 { "failed" } else { "passed" }
    );
    let flaky = units.iter().filter(|unit| unit.flaky()).count();
    let resumed = units.iter().filter(|unit| unit.resumed()).count();
    if flaky > 0 || resumed > 0 {
        let _ = write!(line, " ({flaky} flaky, {resumed} resumed from a journal)");
    }
    let total = report["wall_ms"].as_u64().map_or_else(|| "unknown".to_string(), seconds_text);
    let peak = units.iter().filter_map(Unit::peak_rss_bytes).max().map_or_else(|| "unknown".to_string(), bytes_text);
    format!("<p class=\"summary\">{line}; total time {total}; peak memory max {peak}</p>\n")
}

/// Versions, machine, command line and settings, small, under the summary.
fn run_details(report: &Value) -> String {
    let mut facts = Vec::new();
    if let Some(version) = report["isorun_version"].as_str() {
        facts.push(format!("isorun {}", escape_html(version)));
    }
    if let Some(version) = report["tensorflow_version"].as_str() {
        facts.push(format!("TensorFlow {}", escape_html(version)));
    }
    let machine = &report["machine"];
    let mut about_machine = Vec::new();
    for key in ["os", "kernel"] {
        if let Some(text) = machine[key].as_str() {
            about_machine.push(escape_html(text));
        }
    }
    if let Some(cpus) = machine["cpus"].as_u64() {
        about_machine.push(format!("{cpus} CPUs"));
    }
    if let Some(bytes) = machine["memory_bytes"].as_u64() {
        about_machine.push(bytes_text(bytes));
    }
    match (machine["hostname"].as_str(), about_machine.is_empty()) {
        (Some(hostname), true) => facts.push(escape_html(hostname)),
        (Some(hostname), false) => facts.push(format!("{} ({})", escape_html(hostname), about_machine.join(", "))),
        (None, false) => facts.push(about_machine.join(", ")),
        (None, true) => {}
    }
    if let Some(finished) = report["finished_at"].as_str() {
        facts.push(format!("finished {}", escape_html(&readable_time(finished))));
    }
    if let Some(shards) = report["settings"]["merged_from"].as_array() {
        facts.push(format!("merged from {} report{}", shards.len(), if shards.len() == 1 { "" } else { "s" }));
    }
    let mut details = format!("<p class=\"facts\">{}</p>\n", facts.join(" · "));
    if let Some(command) = report["command"].as_array() {
        let words: Vec<String> = command.iter().map(|word| escape_html(word.as_str().unwrap_or(""))).collect();
        let _ = writeln!(details, "<p class=\"command\"><code>{}</code></p>", words.join(" "));
    }
    if report["settings"].as_object().is_some_and(|settings| !settings.is_empty()) {
        let settings = serde_json::to_string_pretty(&report["settings"]).expect("a JSON value always serializes");
        let _ =
            writeln!(details, "<details><summary>Settings</summary><pre>{}</pre></details>", escape_html(&settings));
    }
    details
}

/// The failed units, each with its message and the tail of its stderr.
fn failures(units: &[Unit<'_>]) -> String {
    let failed: Vec<&Unit<'_>> = units.iter().filter(|unit| unit.verdict() == Verdict::Failed).collect();
    if failed.is_empty() {
        return String::new();
    }
    let mut section = format!("<section id=\"failures\">\n<h2>Failures ({})</h2>\n", failed.len());
    for unit in failed {
        let _ = write!(
            section,
            "<article class=\"failure\">\n<h3><code>{}</code> <span class=\"status failed\">{}</span></h3>\n<p class=\"message\">{}</p>\n",
            escape_html(unit.model()),
            escape_html(unit.status()),
            escape_html(&unit.failure_text())
        );
        let tail = unit.stderr_tail();
        if !tail.is_empty() {
            let _ = writeln!(section, "<pre class=\"stderr\">{}</pre>", escape_html(&tail.join("\n")));
        }
        section.push_str("</article>\n");
    }
    section.push_str("</section>\n");
    section
}

/// The class that colours a unit: `passed`, `failed` or `not-run`.
fn verdict_class(unit: &Unit<'_>) -> &'static str {
    match unit.verdict() {
        Verdict::Passed => "passed",
        Verdict::Failed => "failed",
        Verdict::NotRun => "not-run",
    }
}

/// Every unit, one row each, sortable by any column.
fn units_table(units: &[Unit<'_>]) -> String {
    let columns = [
        ("model", "text", "Model"),
        ("status", "text", "Status"),
        ("wall_ms", "number", "Wall time"),
        ("load_ms", "number", "Load"),
        ("run_ms", "number", "Run"),
        ("peak_rss_bytes", "number", "Peak memory"),
        ("attempts", "number", "Attempts"),
        ("flaky", "number", "Flaky"),
    ];
    let mut table = String::from("<section id=\"all\">\n<h2>All models</h2>\n");
    if units.is_empty() {
        table.push_str("<p class=\"empty\">No models were run.</p>\n");
    }
    table.push_str("<table id=\"units\">\n<thead><tr>");
    for (key, kind, title) in columns {
        let _ = write!(
            table,
            "<th data-key=\"{key}\" data-type=\"{kind}\"{}><button type=\"button\">{title}</button></th>",
            if kind == "number" { " class=\"number\"" } else { "" }
        );
    }
    table.push_str("</tr></thead>\n<tbody>\n");
    for (position, unit) in units.iter().enumerate() {
        // Sorting by status puts failures first, then units not run, then passes.
        let status_rank = match unit.verdict() {
            Verdict::Failed => 0,
            Verdict::NotRun => 1,
            Verdict::Passed => 2,
        };
        let status = escape_html(unit.status());
        let _ = write!(
            table,
            "<tr class=\"{}\" data-position=\"{position}\"><td class=\"model\"><code>{}</code></td>\
             <td data-value=\"{status_rank} {status}\"><span class=\"status {}\">{status}</span></td>",
            verdict_class(unit),
            escape_html(unit.model()),
            verdict_class(unit)
        );
        for (value, text) in [
            (unit.wall_ms(), unit.wall_ms().map(seconds_text)),
            (unit.load_ms(), unit.load_ms().map(seconds_text)),
            (unit.run_ms(), unit.run_ms().map(seconds_text)),
            (unit.peak_rss_bytes(), unit.peak_rss_bytes().map(bytes_text)),
            (unit.attempt_count(), unit.attempt_count().map(|n| n.to_string())),
        ] {
            let _ = write!(
                table,
                "<td class=\"number\" data-value=\"{}\">{}</td>",
                value.map(|v| v.to_string()).unwrap_or_default(),
                text.unwrap_or_else(|| "–".to_string())
            );
        }
        let flaky = unit.flaky();
        let _ = writeln!(
            table,
            "<td class=\"number\" data-value=\"{}\">{}</td></tr>",
            u8::from(flaky),
            if flaky { "<span class=\"flaky\">flaky</span>" } else { "" }
        );
    }
    table.push_str("</tbody>\n</table>\n</section>\n");
    table
}

/// `isorun eval` reports: a metrics table (with the change against the
/// baseline, where one was given), one chart per metric across models, and
/// each model's slices. Nothing when no unit has metrics.
fn evaluation(units: &[Unit<'_>]) -> String {
    fn metrics_of<'a>(unit: &Unit<'a>) -> Option<&'a serde_json::Map<String, Value>> {
        unit.0.get("metrics").and_then(Value::as_object)
    }
    let no_metrics = serde_json::Map::new();
    // Only the metric names isorun-eval knows get a column and a chart, in
    // its order: a report is not trusted, and each name costs a column of
    // every table and a chart of every unit, so made-up names (a 67 KB report
    // named thousands) made the page quadratic in its input.
    let mut names: Vec<String> = Vec::new();
    let mut other_names: BTreeSet<&str> = BTreeSet::new();
    for unit in units {
        for name in unit.0.get("metrics").and_then(Value::as_object).into_iter().flat_map(|m| m.keys()) {
            if Metric::ALL.iter().any(|m| m.name() == name) {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            } else if other_names.len() < CHART_ROWS {
                other_names.insert(name);
            }
        }
    }
    names.sort_by_key(|name| Metric::ALL.iter().position(|m| m.name() == name));
    if names.is_empty() && other_names.is_empty() {
        return String::new();
    }
    let number = |v: &Value| v.as_f64().map_or_else(|| "–".to_string(), |x| format!("{x:.4}"));
    let mut html = String::from("<section id=\"evaluation\">\n<h2>Metrics</h2>\n");
    if !other_names.is_empty() {
        let more = if other_names.len() >= CHART_ROWS { " or more" } else { "" };
        let _ = writeln!(
            html,
            "<p class=\"empty\">{}{more} other metric names are not shown: isorun eval does not make them.</p>",
            other_names.len()
        );
    }
    html.push_str("<table id=\"metrics\">\n<thead><tr><th>Model</th><th class=\"number\">Examples</th>");
    for name in &names {
        let _ = write!(html, "<th class=\"number\">{}</th>", escape_html(name));
    }
    html.push_str("</tr></thead>\n<tbody>\n");
    for unit in units {
        let metrics = metrics_of(unit).unwrap_or(&no_metrics);
        let _ = write!(
            html,
            "<tr class=\"{}\"><td class=\"model\"><code>{}</code></td><td class=\"number\">{}</td>",
            verdict_class(unit),
            escape_html(unit.model()),
            unit.0.get("examples").and_then(Value::as_u64).map_or_else(|| "–".to_string(), |n| n.to_string())
        );
        for name in &names {
            let value = metrics.get(name).map_or_else(|| "–".to_string(), number);
            let change_of = unit.0.get("change").and_then(|c| c.get(name));
            let significant = change_of.is_some_and(|c| c["significant"] == json!(true));
            let ci = unit.0.get("ci").and_then(|c| c.get(name)).and_then(interval_of);
            let value = match ci {
                Some((low, high)) => format!("{value} <span class=\"ci\">[{low:.3}, {high:.3}]</span>"),
                None => value,
            };
            let change = match change_of.and_then(delta_of) {
                Some(delta) if significant => {
                    format!(" <span class=\"change significant\" title=\"significant\">({delta:+.4} *)</span>")
                }
                Some(delta) => format!(" <span class=\"change\">({delta:+.4})</span>"),
                None if unit.0.get("baseline").and_then(Value::as_str) == Some("new") => {
                    " <span class=\"change\">(new)</span>".to_string()
                }
                None => String::new(),
            };
            let _ = write!(html, "<td class=\"number\">{value}{change}</td>");
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</tbody>\n</table>\n");
    // Bars need whole numbers: metrics are scaled by a billion and shown back as decimals.
    const SCALE: f64 = 1e9;
    for name in &names {
        let _ = writeln!(html, "<h3>{} per model</h3>", escape_html(name));
        let scaled = |x: f64| (x.max(0.0) * SCALE).round() as u64;
        html.push_str(&bar_chart_with_errors(
            &format!("metric-{}", escape_html(name)),
            units,
            |unit| metrics_of(unit)?.get(name)?.as_f64().filter(|x| *x >= 0.0).map(scaled),
            |unit| unit.0.get("ci")?.get(name).and_then(interval_of).map(|(low, high)| (scaled(low), scaled(high))),
            |scaled| format!("{:.4}", scaled as f64 / SCALE),
        ));
    }
    for unit in units {
        let Some(Value::Object(slices)) = unit.0.get("slices") else { continue };
        for (feature, values) in slices {
            let Value::Object(values) = values else { continue };
            let _ = write!(
                html,
                "<h3>Slices of <code>{}</code> by {}</h3>\n<table class=\"slices\"><thead><tr><th>{}</th>",
                escape_html(unit.model()),
                escape_html(feature),
                escape_html(feature)
            );
            for name in &names {
                let _ = write!(html, "<th class=\"number\">{}</th>", escape_html(name));
            }
            html.push_str("</tr></thead>\n<tbody>\n");
            for (value, metrics) in values {
                let _ = write!(html, "<tr><td><code>{}</code></td>", escape_html(value));
                for name in &names {
                    let _ = write!(
                        html,
                        "<td class=\"number\">{}</td>",
                        metrics.get(name).map_or_else(|| "–".to_string(), number)
                    );
                }
                html.push_str("</tr>\n");
            }
            html.push_str("</tbody>\n</table>\n");
        }
    }
    html.push_str("</section>\n");
    html
}

/// The most rows (units) one chart shows, and the most unknown metric
/// names counted.
const CHART_ROWS: usize = 1000;

/// A horizontal bar chart, one bar per unit, scaled to the largest value;
/// a unit without a value gets a label and no bar.
fn bar_chart(
    name: &str,
    units: &[Unit<'_>],
    value_of: impl Fn(&Unit<'_>) -> Option<u64>,
    text_of: impl Fn(u64) -> String,
) -> String {
    bar_chart_with_errors(name, units, value_of, |_| None, text_of)
}

/// `[low, high]` of a record's `"ci"` entry.
fn interval_of(ci: &Value) -> Option<(f64, f64)> {
    Some((ci.get(0)?.as_f64()?, ci.get(1)?.as_f64()?))
}

/// [`bar_chart`] with an error bar (`eval --ci`'s interval, scaled as the
/// values are) drawn over each bar that has one.
fn bar_chart_with_errors(
    name: &str,
    units: &[Unit<'_>],
    value_of: impl Fn(&Unit<'_>) -> Option<u64>,
    error_of: impl Fn(&Unit<'_>) -> Option<(u64, u64)>,
    text_of: impl Fn(u64) -> String,
) -> String {
    const WIDTH: u64 = 960;
    const LABEL_WIDTH: u64 = 300;
    const VALUE_WIDTH: u64 = 90;
    const ROW: u64 = 22;
    const BAR: u64 = 16;
    const MARGIN: u64 = 6;
    if units.is_empty() {
        return "<p class=\"empty\">No models, no chart.</p>\n".to_string();
    }
    // The first CHART_ROWS units; the table above lists them all.
    let shown = &units[..units.len().min(CHART_ROWS)];
    let largest = shown.iter().filter_map(&value_of).max().unwrap_or(0);
    let largest = shown.iter().filter_map(|u| error_of(u).map(|e| e.1)).fold(largest, u64::max);
    let bar_room = WIDTH - LABEL_WIDTH - VALUE_WIDTH - 2 * MARGIN;
    let height = shown.len() as u64 * ROW + 2 * MARGIN;
    let mut svg = format!(
        "<svg class=\"chart\" id=\"chart-{name}\" role=\"img\" viewBox=\"0 0 {WIDTH} {height}\" width=\"{WIDTH}\" height=\"{height}\">\n"
    );
    for (row, unit) in shown.iter().enumerate() {
        let top = MARGIN + row as u64 * ROW;
        let middle = top + ROW / 2 + 4;
        let value = value_of(unit);
        let text = value.map(&text_of).unwrap_or_else(|| "n/a".to_string());
        let length = match value {
            Some(value) if largest > 0 => ((value as f64 / largest as f64) * bar_room as f64).round() as u64,
            _ => 0,
        };
        let bar_left = LABEL_WIDTH + MARGIN;
        let _ = write!(
            svg,
            "<g><title>{model}: {text}</title>\
             <text class=\"label\" x=\"{label_right}\" y=\"{middle}\" text-anchor=\"end\">{short}</text>",
            model = escape_html(unit.model()),
            label_right = LABEL_WIDTH,
            short = escape_html(&shortened(unit.model(), 44)),
        );
        if value.is_some() {
            let _ = write!(
                svg,
                "<rect class=\"bar {}\" x=\"{bar_left}\" y=\"{}\" width=\"{length}\" height=\"{BAR}\" rx=\"2\"></rect>",
                verdict_class(unit),
                top + (ROW - BAR) / 2
            );
        }
        let mut text_left = bar_left + length + 6;
        if let (Some(_), Some((low, high))) = (value, error_of(unit)) {
            let x = |v: u64| bar_left + ((v as f64 / largest.max(1) as f64) * bar_room as f64).round() as u64;
            let (x1, x2, y) = (x(low), x(high), top + ROW / 2);
            let _ = write!(
                svg,
                "<path class=\"error-bar\" d=\"M{x1} {y}H{x2}M{x1} {}V{}M{x2} {}V{}\"></path>",
                y - 4,
                y + 4,
                y - 4,
                y + 4
            );
            text_left = text_left.max(x2 + 6);
        }
        let _ = writeln!(svg, "<text class=\"value\" x=\"{text_left}\" y=\"{middle}\">{text}</text></g>");
    }
    svg.push_str("</svg>\n");
    if units.len() > shown.len() {
        let _ = writeln!(
            svg,
            "<p class=\"more\">… {} more models, not charted (the table lists every model)</p>",
            units.len() - shown.len()
        );
    }
    svg
}

/// At most `limit` characters: the end of a long id is kept (it usually
/// tells models apart), the start replaced by `…`.
fn shortened(text: &str, limit: usize) -> String {
    let count = text.chars().count();
    if count <= limit {
        return text.to_string();
    }
    let kept: String = text.chars().skip(count - (limit - 1)).collect();
    format!("…{kept}")
}

const STYLE: &str = r#"
:root { color-scheme: light; --passed: #1f8a4c; --failed: #c62828; --not-run: #757575; --line: #d9dde3; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; margin: 0; color: #1d2329; background: #fff; line-height: 1.45; }
header { padding: 20px 32px 12px; background: #f5f7fa; border-bottom: 1px solid var(--line); }
main { padding: 8px 32px 40px; }
h1 { font-size: 1.6rem; margin: 0 0 6px; }
h1 .date { font-weight: normal; color: #56606b; font-size: 1.1rem; margin-left: 8px; }
h2 { font-size: 1.2rem; margin: 28px 0 10px; }
h3 { font-size: 1rem; margin: 0 0 6px; }
code, pre { font-family: ui-monospace, "SF Mono", Menlo, Consolas, "DejaVu Sans Mono", monospace; font-size: 0.88rem; }
.summary { font-size: 1.1rem; margin: 4px 0; }
.summary .passed { color: var(--passed); font-weight: 600; }
.summary .failed { color: var(--failed); font-weight: 600; }
.facts, .command { color: #56606b; margin: 2px 0; font-size: 0.9rem; }
details { margin: 6px 0; font-size: 0.9rem; }
details pre { background: #fff; border: 1px solid var(--line); padding: 8px; overflow: auto; }
.failure { border: 1px solid #f1c4c4; border-left: 4px solid var(--failed); background: #fff8f8; padding: 10px 14px; margin: 0 0 12px; border-radius: 4px; }
.failure .message { margin: 0 0 6px; white-space: pre-wrap; overflow-wrap: anywhere; }
.failure pre { background: #1e1f22; color: #e8e8e8; padding: 10px; margin: 0; overflow: auto; max-height: 20em; border-radius: 3px; }
.status { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 0.8rem; font-weight: 600; color: #fff; }
.status.passed { background: var(--passed); }
.status.failed { background: var(--failed); }
.status.not-run { background: var(--not-run); }
.flaky { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 0.8rem; background: #f6c343; color: #3d2f00; }
table { border-collapse: collapse; width: 100%; font-size: 0.92rem; }
th, td { padding: 5px 10px; border-bottom: 1px solid var(--line); text-align: left; }
th { position: sticky; top: 0; background: #eef1f5; }
th button { font: inherit; font-weight: 600; border: 0; background: none; padding: 0; cursor: pointer; color: inherit; }
th[aria-sort="ascending"] button::after { content: " \25B2"; }
th[aria-sort="descending"] button::after { content: " \25BC"; }
.number { text-align: right; font-variant-numeric: tabular-nums; }
th.number button { text-align: right; }
tr.failed td.model code { color: var(--failed); }
tbody tr:hover { background: #f5f9ff; }
.model code { overflow-wrap: anywhere; }
.chart { display: block; max-width: 100%; height: auto; }
.change { color: #56606b; font-size: 0.9em; }
.change.significant { color: var(--failed); font-weight: 600; }
.ci { color: #56606b; font-size: 0.85em; }
.error-bar { stroke: #1d2329; stroke-width: 1.5; fill: none; }
.chart text { font-size: 12px; fill: #1d2329; }
.chart .label { font-family: ui-monospace, Menlo, Consolas, "DejaVu Sans Mono", monospace; }
.chart .value { fill: #56606b; }
.bar.passed { fill: #4a8fe0; }
.bar.failed { fill: var(--failed); }
.bar.not-run { fill: #b0b0b0; }
.empty { color: #56606b; font-style: italic; }
"#;

const SCRIPT: &str = r##"
(function () {
  "use strict";
  var root = document.documentElement;
  var errors = [];
  window.addEventListener("error", function (event) {
    errors.push(String(event.message));
    root.setAttribute("data-isorun-errors", errors.join(" | "));
  });
  var table = document.getElementById("units");
  var body = table.tBodies[0];
  var headers = Array.prototype.slice.call(table.tHead.rows[0].cells);

  function valueOf(row, index, type) {
    var cell = row.cells[index];
    var raw = cell.hasAttribute("data-value") ? cell.getAttribute("data-value") : cell.textContent;
    if (type !== "number") return raw;
    return raw === "" ? null : Number(raw);
  }

  function sortBy(key, descending) {
    var index = -1;
    var type = "text";
    headers.forEach(function (header, i) {
      if (header.getAttribute("data-key") === key) {
        index = i;
        type = header.getAttribute("data-type");
      }
    });
    if (index < 0) return false;
    var rows = Array.prototype.slice.call(body.rows).map(function (row) {
      return { row: row, value: valueOf(row, index, type), position: Number(row.getAttribute("data-position")) };
    });
    rows.sort(function (a, b) {
      if (a.value === null || b.value === null) {
        // Missing values go last, whichever the direction.
        if (a.value === b.value) return a.position - b.position;
        return a.value === null ? 1 : -1;
      }
      var order = type === "number" ? a.value - b.value : (a.value < b.value ? -1 : (a.value > b.value ? 1 : 0));
      if (descending) order = -order;
      return order !== 0 ? order : a.position - b.position;
    });
    rows.forEach(function (entry) { body.appendChild(entry.row); });
    headers.forEach(function (header, i) {
      if (i === index) header.setAttribute("aria-sort", descending ? "descending" : "ascending");
      else header.removeAttribute("aria-sort");
    });
    table.setAttribute("data-sorted-by", key + ":" + (descending ? "desc" : "asc"));
    return true;
  }

  headers.forEach(function (header) {
    header.querySelector("button").addEventListener("click", function () {
      var current = header.getAttribute("aria-sort");
      // First click: largest numbers first, text from A.
      var descending = current ? current === "ascending" : header.getAttribute("data-type") === "number";
      var key = header.getAttribute("data-key");
      sortBy(key, descending);
      try {
        history.replaceState(null, "", "#sort=" + key + ":" + (descending ? "desc" : "asc"));
      } catch (ignored) {
        // Some browsers refuse to change the address of a local file.
      }
    });
  });

  var wanted = /^#sort=([a-z_]+)(?::(asc|desc))?$/.exec(window.location.hash);
  if (wanted) sortBy(wanted[1], wanted[2] === "desc");
  root.setAttribute("data-isorun-ready", String(body.rows.length));
})();
"##;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn record_strings_are_escaped() {
        assert_eq!(
            escape_html(r#"<script>alert("x") & 'y'</script>"#),
            "&lt;script&gt;alert(&quot;x&quot;) &amp; &#39;y&#39;&lt;/script&gt;"
        );
        assert_eq!(escape_html("plain/model_1"), "plain/model_1");
        let report = json!({
            "started_at": "2023-11-14T22:13:20.000Z",
            "wall_ms": 10,
            "units": [{"model": "<img src=x onerror=alert(1)>", "status": "error",
                       "error": {"kind": "tensorflow", "message": "a < b & \"c\""},
                       "stderr_tail": ["</pre><script>evil()</script>"]}]
        });
        let page = html_page(&report);
        assert!(!page.contains("<img src=x"), "{page}");
        assert!(!page.contains("evil()</script>"), "{page}");
        assert!(page.contains("&lt;img src=x onerror=alert(1)&gt;"));
        assert!(page.contains("error: tensorflow: a &lt; b &amp; &quot;c&quot;"));
        assert!(page.contains("isorun report, 2023-11-14 22:13:20 UTC"));
    }

    #[test]
    fn a_page_without_models_or_values_still_renders() {
        let page = html_page(&json!({"units": []}));
        assert!(page.contains("0 models: <span class=\"passed\">0 ok</span>"), "{page}");
        assert!(page.contains("No models, no chart."));
        let page = html_page(&json!({"units": [{"model": "a", "status": "not_run"}]}));
        assert!(page.contains(">n/a</text>"), "{page}");
        assert!(page.contains("peak memory max unknown"));
    }

    #[test]
    fn an_eval_report_has_metrics_changes_charts_and_slices() {
        let report = json!({"units": [
            {"model": "a", "status": "ok", "examples": 10, "metrics": {"accuracy": 0.75},
             "change": {"accuracy": -0.05}, "slices": {"country": {"<fr>": {"accuracy": 0.5}}}},
            {"model": "b", "status": "ok", "examples": 10, "metrics": {"accuracy": 0.5}, "baseline": "new"}
        ]});
        let page = html_page(&report);
        assert!(page.contains("<h2>Metrics</h2>"), "{page}");
        assert!(page.contains(">0.7500 <span class=\"change\">(-0.0500)</span>"), "{page}");
        assert!(page.contains("(new)"), "{page}");
        assert!(page.contains("id=\"chart-metric-accuracy\""), "{page}");
        assert!(page.contains("<code>&lt;fr&gt;</code>"), "{page}");
        let with_ci = json!({"units": [
            {"model": "a", "status": "ok", "examples": 10, "metrics": {"accuracy": 0.75},
             "ci": {"accuracy": [0.7, 0.8]},
             "change": {"accuracy": {"baseline": 0.8, "delta": -0.05, "ci": [-0.08, -0.02], "significant": true}}}
        ]});
        let page = html_page(&with_ci);
        assert!(page.contains("0.7500 <span class=\"ci\">[0.700, 0.800]</span>"), "{page}");
        assert!(page.contains("(-0.0500 *)"), "{page}");
        assert!(page.contains("class=\"error-bar\""), "{page}");
        assert!(!html_page(&json!({"units": [{"model": "a", "status": "ok"}]})).contains("<h2>Metrics</h2>"));
    }

    #[test]
    fn a_crafted_report_cannot_blow_the_page_up() {
        // Many made-up metric names, each on many units: one chart per name
        // and one row per unit in each made the page quadratic in the input.
        let names: Vec<String> = (0..300).map(|i| format!("m{i}")).collect();
        let units: Vec<Value> = (0..300)
            .map(|u| {
                let metrics: serde_json::Map<String, Value> = names.iter().map(|n| (n.clone(), json!(0.5))).collect();
                json!({"model": format!("u{u}"), "status": "ok", "metrics": metrics})
            })
            .collect();
        let report = json!({"units": units});
        let input = report.to_string().len();
        let page = html_page(&report);
        assert!(page.len() < 20 * input, "{} bytes of HTML from {input} of JSON", page.len());
        assert!(page.contains("300 other metric names"), "unknown names are counted, not charted");

        // Known names are charted, and a chart has at most so many rows.
        let units: Vec<Value> = (0..3000)
            .map(|u| json!({"model": format!("u{u}"), "status": "ok", "metrics": {"accuracy": 0.5, "auc": 0.7}}))
            .collect();
        let page = html_page(&json!({"units": units}));
        assert!(page.contains("id=\"chart-metric-accuracy\""));
        assert_eq!(page.matches("<g><title>").count(), 4 * CHART_ROWS, "four charts of {CHART_ROWS} rows");
        assert!(page.contains(&format!("… {} more models", 3000 - CHART_ROWS)), "the cut is said");
    }

    #[test]
    fn long_ids_keep_their_end() {
        assert_eq!(shortened("short", 10), "short");
        assert_eq!(shortened("abcdefghijkl", 5), "…ijkl");
    }
}
