//! `isorun report table`: a leaderboard of the models of one or more eval
//! reports, one row per model (per model and slice value with `--by`),
//! sorted by one metric in its own direction, with its interval (`"ci"`),
//! the change against the baseline (`"change"`) and whether that change is
//! significant. It reads the records only, so it works on any report, old
//! or new: fields a record lacks are left empty.
//!
//! Ranks come in groups, so that noise is not ranked: the best model not
//! yet placed leads a group with every other model not yet placed whose
//! interval overlaps the leader's; a group of two or more is shown as tied,
//! `=R`, R being one more than the models placed above it. A model without
//! an interval counts as the point of its value (so without `--ci` only
//! equal values tie). Models without the metric (failed, not run, or a
//! metric their task lacks) come last, unranked.
//!
//! `"change"` is read in both forms: `{M: delta}` (reports before
//! intervals) and `{M: {"baseline", "delta", "ci"?, "p"?, "significant"?}}`.
//!
//! Reports are untrusted: model ids, slice values, statuses and file names
//! pass [`one_line`] in the Markdown and CSV tables (a control character
//! there could forge a row on a terminal), and the table is made in
//! O(n log n) of its rows, since it also heads every `--html` page.

use crate::text::one_line;
use crate::unit::Unit;
use isorun_eval::Metric;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write;
use std::path::PathBuf;

/// How the table is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFormat {
    /// A GitHub Markdown table.
    Markdown,
    /// Comma-separated values with a header line.
    Csv,
    /// One JSON object per row.
    Jsonl,
}

/// Why a table cannot be made.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TableError {
    #[error("--metric {name}: {reason}")]
    UnknownMetric { name: String, reason: String },
    #[error("no model of {reports} has metric {metric}; they have: {available}")]
    MetricAbsent { metric: String, reports: String, available: String },
    #[error("no model of the reports has metrics: they are not eval reports (isorun eval --report)")]
    NoMetrics,
    #[error("--by {feature}: no model of {reports} has slices by {feature}; slice features: {available}")]
    SliceAbsent { feature: String, reports: String, available: String },
}

/// The change of a model's metric against the baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub baseline: Option<f64>,
    pub delta: f64,
    pub ci: Option<(f64, f64)>,
    pub p: Option<f64>,
    pub significant: Option<bool>,
}

/// A row's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rank {
    /// Alone in its group.
    Ranked(usize),
    /// In a group of several whose intervals overlap its leader's.
    Tied(usize),
    /// No value of the metric.
    Unranked,
}

impl Rank {
    /// `1`, `=1`, or `–`.
    pub fn text(&self) -> String {
        match self {
            Rank::Ranked(r) => r.to_string(),
            Rank::Tied(r) => format!("={r}"),
            Rank::Unranked => "–".to_string(),
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRow {
    pub rank: Rank,
    /// The report file the row comes from.
    pub report: PathBuf,
    pub model: String,
    /// The model is in more than one report: the Markdown table names the file too.
    pub in_several_reports: bool,
    /// With `--by`: the slice value.
    pub slice_value: Option<String>,
    pub status: String,
    pub value: Option<f64>,
    pub ci: Option<(f64, f64)>,
    pub change: Option<Change>,
    pub examples: Option<u64>,
}

/// The leaderboard.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub metric: String,
    pub higher_is_better: bool,
    /// With `--by`: the slice feature.
    pub by: Option<String>,
    /// The records' `ci_level`, when one has it.
    pub ci_level: Option<f64>,
    /// Slice values in order, then ranks within each.
    pub rows: Vec<TableRow>,
}

fn pair(value: &Value) -> Option<(f64, f64)> {
    match value.as_array().map(Vec::as_slice) {
        Some([low, high]) => Some((low.as_f64()?, high.as_f64()?)),
        _ => None,
    }
}

fn change_of(unit: &Value, metric: &str) -> Option<Change> {
    let change = unit.get("change")?.get(metric)?;
    let baseline_metric = unit.get("baseline_metrics").and_then(|b| b.get(metric)).and_then(Value::as_f64);
    match change {
        Value::Number(delta) => {
            Some(Change { baseline: baseline_metric, delta: delta.as_f64()?, ci: None, p: None, significant: None })
        }
        Value::Object(fields) => Some(Change {
            baseline: fields.get("baseline").and_then(Value::as_f64).or(baseline_metric),
            delta: fields.get("delta")?.as_f64()?,
            ci: fields.get("ci").and_then(pair),
            p: fields.get("p").and_then(Value::as_f64),
            significant: fields.get("significant").and_then(Value::as_bool),
        }),
        _ => None,
    }
}

/// The metric a table is of when `--metric` is not given: the first
/// `--metric` of the first report's `settings.eval.metrics`, else the first
/// metric, in the vocabulary's order (accuracy, top_k_accuracy, auc, ...),
/// of the first model with metrics.
pub fn default_metric(reports: &[(PathBuf, Value)]) -> Option<String> {
    if let Some(first) = reports.first().and_then(|(_, r)| r["settings"]["eval"]["metrics"][0].as_str()) {
        if let Ok(metric) = Metric::parse(first) {
            return Some(metric.name().to_string());
        }
    }
    let metrics = reports
        .iter()
        .flat_map(|(_, r)| r["units"].as_array().into_iter().flatten())
        .find_map(|u| u.get("metrics").and_then(Value::as_object).filter(|m| !m.is_empty()))?;
    Metric::ALL.iter().find(|m| metrics.contains_key(m.name())).map(|m| m.name().to_string())
}

/// The leaderboard of the reports' models by `metric` (default:
/// [`default_metric`]), per value of slice feature `by` when given.
pub fn table(reports: &[(PathBuf, Value)], metric: Option<&str>, by: Option<&str>) -> Result<Table, TableError> {
    let units: Vec<(&PathBuf, &Value)> = reports
        .iter()
        .flat_map(|(path, r)| r["units"].as_array().into_iter().flatten().map(move |u| (path, u)))
        .collect();
    let names = || reports.iter().map(|(p, _)| p.display().to_string()).collect::<Vec<_>>().join(", ");
    let metric = match metric {
        Some(name) => {
            Metric::parse(name).map_err(|reason| TableError::UnknownMetric { name: name.to_string(), reason })?
        }
        None => {
            let name = default_metric(reports).ok_or(TableError::NoMetrics)?;
            Metric::parse(&name).map_err(|reason| TableError::UnknownMetric { name, reason })?
        }
    };
    let name = metric.name();
    let mut available: Vec<&str> = Vec::new();
    let mut known: HashSet<&str> = HashSet::new();
    for (_, unit) in &units {
        for key in unit.get("metrics").and_then(Value::as_object).into_iter().flat_map(Map::keys) {
            if known.insert(key) {
                available.push(key);
            }
        }
    }
    if available.is_empty() {
        return Err(TableError::NoMetrics);
    }
    if !available.contains(&name) {
        return Err(TableError::MetricAbsent {
            metric: name.into(),
            reports: names(),
            available: available.join(", "),
        });
    }
    let ci_level = units.iter().find_map(|(_, u)| u.get("ci_level").and_then(Value::as_f64));
    // Model id -> the reports it is in.
    let mut reports_of: HashMap<&str, HashSet<&PathBuf>> = HashMap::new();
    for (path, unit) in &units {
        reports_of.entry(Unit(unit).model()).or_default().insert(path);
    }
    let in_several = |model: &str| reports_of.get(model).is_some_and(|paths| paths.len() > 1);
    let mut rows: Vec<TableRow> = Vec::new();
    let row = |path: &PathBuf, unit: &Value, slice_value: Option<String>, fields: Option<&Value>| {
        let u = Unit(unit);
        let value = fields.and_then(|f| f.get(name)).and_then(Value::as_f64);
        let ci = fields.and_then(|f| f.get("ci")).and_then(|c| c.get(name)).and_then(pair);
        TableRow {
            rank: Rank::Unranked,
            report: path.clone(),
            model: u.model().to_string(),
            in_several_reports: in_several(u.model()),
            slice_value,
            status: u.status().to_string(),
            value,
            ci: ci.filter(|_| value.is_some()),
            change: None,
            examples: fields.and_then(|f| f.get("examples")).and_then(Value::as_u64),
        }
    };
    match by {
        None => {
            for (path, unit) in &units {
                let mut r = row(path, unit, None, unit.get("metrics"));
                // The record's examples and interval are the unit's, beside its metrics.
                r.ci = unit.get("ci").and_then(|c| c.get(name)).and_then(pair).filter(|_| r.value.is_some());
                r.examples = unit.get("examples").and_then(Value::as_u64);
                r.change = change_of(unit, name);
                rows.push(r);
            }
        }
        Some(feature) => {
            let mut features: Vec<&str> = Vec::new();
            let mut known: HashSet<&str> = HashSet::new();
            for (path, unit) in &units {
                let slices = unit.get("slices").and_then(Value::as_object);
                for key in slices.into_iter().flat_map(Map::keys) {
                    if known.insert(key) {
                        features.push(key);
                    }
                }
                if let Some(values) = slices.and_then(|s| s.get(feature)).and_then(Value::as_object) {
                    for (value, fields) in values {
                        rows.push(row(path, unit, Some(value.clone()), Some(fields)));
                    }
                }
            }
            if rows.is_empty() {
                let available = if features.is_empty() { "none".to_string() } else { features.join(", ") };
                return Err(TableError::SliceAbsent { feature: feature.into(), reports: names(), available });
            }
        }
    }
    let higher = metric.higher_is_better();
    let mut grouped: Vec<TableRow> = Vec::with_capacity(rows.len());
    let mut by_value: BTreeMap<Option<String>, Vec<TableRow>> = BTreeMap::new();
    for row in rows {
        by_value.entry(row.slice_value.clone()).or_default().push(row);
    }
    for (_, rows) in by_value {
        let (mut ranked, unranked): (Vec<TableRow>, Vec<TableRow>) = rows.into_iter().partition(|r| r.value.is_some());
        ranked.sort_by(|a, b| {
            let (x, y) = (a.value.unwrap_or(f64::NAN), b.value.unwrap_or(f64::NAN));
            let order = if higher { y.total_cmp(&x) } else { x.total_cmp(&y) };
            order.then_with(|| a.model.cmp(&b.model)).then_with(|| a.report.cmp(&b.report))
        });
        grouped.extend(rank(ranked));
        let mut unranked = unranked;
        unranked.sort_by(|a, b| a.model.cmp(&b.model).then_with(|| a.report.cmp(&b.report)));
        grouped.extend(unranked);
    }
    Ok(Table {
        metric: name.to_string(),
        higher_is_better: higher,
        by: by.map(str::to_string),
        ci_level,
        rows: grouped,
    })
}

fn interval(row: &TableRow) -> (f64, f64) {
    let v = row.value.unwrap_or(f64::NAN);
    row.ci.unwrap_or((v, v))
}

/// Rows sorted best first, in tie groups (see the module's doc): the first
/// row not yet placed leads a group of every row not yet placed whose
/// interval `(l, h)` overlaps the leader's `(low, high)`: `l <= high` and
/// `low <= h`. The rows not yet placed are kept in order of `l`, in a tree
/// of the highest `h` under each node ([`HighestEnds`]): those with
/// `l <= high` are a prefix of that order, and each of them with
/// `h >= low` is found in O(log n), then removed. Every row is placed
/// once, so ranking n rows is O(n log n) (it was O(n²): every leader
/// looked at every row left).
fn rank(sorted: Vec<TableRow>) -> Vec<TableRow> {
    let n = sorted.len();
    let intervals: Vec<(f64, f64)> = sorted.iter().map(interval).collect();
    // Row indices in order of their interval's low end, and each row's place in that order.
    let mut by_low: Vec<usize> = (0..n).collect();
    by_low.sort_by(|&a, &b| intervals[a].0.total_cmp(&intervals[b].0));
    let mut place_of = vec![0; n];
    for (place, &row) in by_low.iter().enumerate() {
        place_of[row] = place;
    }
    let mut tree = HighestEnds::new(by_low.iter().map(|&row| intervals[row].1));
    let mut left: Vec<Option<TableRow>> = sorted.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(n);
    let mut members = Vec::new();
    for i in 0..n {
        let Some(leader) = left[i].take() else { continue };
        tree.remove(place_of[i]);
        let (low, high) = intervals[i];
        let prefix = by_low.partition_point(|&row| intervals[row].0 <= high);
        members.clear();
        tree.take_at_least(prefix, low, &mut members);
        // Members in the order the rows were sorted in (best first), as they are shown.
        let mut rows: Vec<usize> = members.iter().map(|&place| by_low[place]).collect();
        rows.sort_unstable();
        let place = out.len() + 1;
        let tied = !rows.is_empty();
        let group = std::iter::once(leader).chain(rows.into_iter().filter_map(|row| left[row].take()));
        for mut r in group {
            r.rank = if tied { Rank::Tied(place) } else { Rank::Ranked(place) };
            out.push(r);
        }
    }
    out
}

// Nodes `HighestEnds::take_at_least` visited, for the test that ranking
// is O(n log n).
#[cfg(test)]
thread_local! {
    static VISITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A tournament tree over the rows not yet placed, in order of their
/// interval's low end: each node holds the highest high end under it.
struct HighestEnds {
    /// Leaves: a power of two, at least one.
    leaves: usize,
    /// `highest[1]` is the root, `highest[leaves + p]` place `p`'s high end.
    highest: Vec<f64>,
    removed: Vec<bool>,
}

impl HighestEnds {
    fn new(ends: impl ExactSizeIterator<Item = f64>) -> HighestEnds {
        let leaves = ends.len().next_power_of_two().max(1);
        let mut highest = vec![f64::NEG_INFINITY; 2 * leaves];
        for (place, end) in ends.enumerate() {
            highest[leaves + place] = end;
        }
        for node in (1..leaves).rev() {
            highest[node] = highest[2 * node].max(highest[2 * node + 1]);
        }
        let removed = vec![false; leaves];
        HighestEnds { leaves, highest, removed }
    }

    fn remove(&mut self, place: usize) {
        self.removed[place] = true;
        let mut node = self.leaves + place;
        self.highest[node] = f64::NEG_INFINITY;
        while node > 1 {
            node /= 2;
            self.highest[node] = self.highest[2 * node].max(self.highest[2 * node + 1]);
        }
    }

    /// Removes every place below `end` whose high end is at least `low`,
    /// appending it to `out`.
    fn take_at_least(&mut self, end: usize, low: f64, out: &mut Vec<usize>) {
        let first = out.len();
        self.collect(1, 0..self.leaves, end, low, out);
        for &place in &out[first..] {
            self.remove(place);
        }
    }

    fn collect(&self, node: usize, span: std::ops::Range<usize>, end: usize, low: f64, out: &mut Vec<usize>) {
        #[cfg(test)]
        VISITS.with(|v| v.set(v.get() + 1));
        // Nothing here at least `low` (a NaN end is never at least anything).
        let none_at_least = matches!(self.highest[node].partial_cmp(&low), None | Some(std::cmp::Ordering::Less));
        if span.start >= end || none_at_least {
            return;
        }
        if span.len() == 1 {
            if !self.removed[span.start] {
                out.push(span.start);
            }
            return;
        }
        let middle = span.start + span.len() / 2;
        self.collect(2 * node, span.start..middle, end, low, out);
        self.collect(2 * node + 1, middle..span.end, end, low, out);
    }
}

fn decimal(x: f64) -> String {
    format!("{x:.4}")
}

fn signed(x: f64) -> String {
    format!("{x:+.4}")
}

fn markdown_cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// A CSV cell: control characters escaped ([`one_line`]), then quoted when needed.
fn csv_cell(text: &str) -> String {
    let text = one_line(text);
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

fn number_json(x: Option<f64>) -> Value {
    x.and_then(serde_json::Number::from_f64).map_or(Value::Null, Value::Number)
}

fn pair_json(x: Option<(f64, f64)>) -> Value {
    x.map_or(Value::Null, |(l, h)| json!([number_json(Some(l)), number_json(Some(h))]))
}

impl Table {
    /// The table as `format` prints it (ending in a newline).
    pub fn render(&self, format: TableFormat) -> String {
        match format {
            TableFormat::Markdown => self.markdown(),
            TableFormat::Csv => self.csv(),
            TableFormat::Jsonl => {
                self.rows.iter().map(|r| self.row_json(r).to_string() + "\n").collect::<Vec<_>>().concat()
            }
        }
    }

    fn ci_header(&self) -> String {
        self.ci_level.map_or_else(|| "CI".to_string(), |l| format!("{}% CI", (l * 1000.0).round() / 10.0))
    }

    fn markdown(&self) -> String {
        let any_ci = self.rows.iter().any(|r| r.ci.is_some());
        let any_change = self.rows.iter().any(|r| r.change.is_some());
        let any_change_ci = self.rows.iter().any(|r| r.change.as_ref().is_some_and(|c| c.ci.is_some()));
        let any_p = self.rows.iter().any(|r| r.change.as_ref().is_some_and(|c| c.p.is_some()));
        let any_significant = self.rows.iter().any(|r| r.change.as_ref().is_some_and(|c| c.significant.is_some()));
        let direction = if self.higher_is_better { "higher is better" } else { "lower is better" };
        let mut header = vec!["Rank".to_string(), "Model".to_string()];
        if let Some(by) = &self.by {
            header.push(markdown_cell(&one_line(by)));
        }
        header.push(format!("{} ({direction})", self.metric));
        if any_ci {
            header.push(self.ci_header());
        }
        if any_change {
            header.push("Δ vs baseline".into());
        }
        if any_change_ci {
            header.push(format!("Δ {}", self.ci_header()));
        }
        if any_p {
            header.push("p".into());
        }
        if any_significant {
            header.push("Significant".into());
        }
        header.push("Examples".into());
        header.push("Status".into());
        let mut text = format!("| {} |\n|", header.join(" | "));
        for h in &header {
            let by = self.by.as_deref().map(|by| markdown_cell(&one_line(by)));
            let right = !matches!(h.as_str(), "Model" | "Status") && Some(h) != by.as_ref();
            text.push_str(if right { " ---: |" } else { " --- |" });
        }
        text.push('\n');
        for r in &self.rows {
            let model = if r.in_several_reports {
                format!("`{}` ({})", one_line(&r.model), one_line(&r.report.display().to_string()))
            } else {
                format!("`{}`", one_line(&r.model))
            };
            let mut cells = vec![r.rank.text(), markdown_cell(&model)];
            if self.by.is_some() {
                cells.push(markdown_cell(&one_line(r.slice_value.as_deref().unwrap_or(""))));
            }
            cells.push(r.value.map_or_else(|| "–".into(), decimal));
            if any_ci {
                cells.push(r.ci.map_or_else(|| "–".into(), |(l, h)| format!("[{}, {}]", decimal(l), decimal(h))));
            }
            let change = r.change.as_ref();
            if any_change {
                cells.push(change.map_or_else(|| "–".into(), |c| signed(c.delta)));
            }
            if any_change_ci {
                cells.push(
                    change
                        .and_then(|c| c.ci)
                        .map_or_else(|| "–".into(), |(l, h)| format!("[{}, {}]", signed(l), signed(h))),
                );
            }
            if any_p {
                cells.push(change.and_then(|c| c.p).map_or_else(|| "–".into(), |p| format!("{p:.3}")));
            }
            if any_significant {
                let word = match change.and_then(|c| c.significant) {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "–",
                };
                cells.push(word.into());
            }
            cells.push(r.examples.map_or_else(|| "–".into(), |n| n.to_string()));
            cells.push(markdown_cell(&one_line(&r.status)));
            let _ = writeln!(text, "| {} |", cells.join(" | "));
        }
        text
    }

    fn csv(&self) -> String {
        let mut header = vec!["rank", "tied", "report", "model"];
        if self.by.is_some() {
            header.push("slice_value");
        }
        header.extend([
            "metric",
            "value",
            "ci_low",
            "ci_high",
            "baseline",
            "delta",
            "delta_ci_low",
            "delta_ci_high",
            "p",
            "significant",
            "examples",
            "status",
        ]);
        let mut text = header.join(",") + "\n";
        let number = |x: Option<f64>| x.map_or_else(String::new, |x| x.to_string());
        for r in &self.rows {
            let (rank, tied) = match r.rank {
                Rank::Ranked(n) => (n.to_string(), "false"),
                Rank::Tied(n) => (n.to_string(), "true"),
                Rank::Unranked => (String::new(), ""),
            };
            let mut cells = vec![rank, tied.to_string(), csv_cell(&r.report.display().to_string()), csv_cell(&r.model)];
            if self.by.is_some() {
                cells.push(csv_cell(r.slice_value.as_deref().unwrap_or("")));
            }
            let c = r.change.as_ref();
            cells.extend([
                self.metric.clone(),
                number(r.value),
                number(r.ci.map(|x| x.0)),
                number(r.ci.map(|x| x.1)),
                number(c.and_then(|c| c.baseline)),
                number(c.map(|c| c.delta)),
                number(c.and_then(|c| c.ci).map(|x| x.0)),
                number(c.and_then(|c| c.ci).map(|x| x.1)),
                number(c.and_then(|c| c.p)),
                c.and_then(|c| c.significant).map_or_else(String::new, |s| s.to_string()),
                r.examples.map_or_else(String::new, |n| n.to_string()),
                csv_cell(&r.status),
            ]);
            text.push_str(&cells.join(","));
            text.push('\n');
        }
        text
    }

    /// `{"rank", "tied", "report", "model", "slice"?: {feature: value}, "metric", "value", "ci",
    /// "change": {"baseline", "delta", "ci", "p", "significant"} | null, "examples", "status"}`.
    pub fn row_json(&self, r: &TableRow) -> Value {
        let (rank, tied) = match r.rank {
            Rank::Ranked(n) => (json!(n), json!(false)),
            Rank::Tied(n) => (json!(n), json!(true)),
            Rank::Unranked => (Value::Null, Value::Null),
        };
        let mut o = Map::new();
        o.insert("rank".into(), rank);
        o.insert("tied".into(), tied);
        o.insert("report".into(), json!(r.report.display().to_string()));
        o.insert("model".into(), json!(r.model));
        if let (Some(by), Some(value)) = (&self.by, &r.slice_value) {
            o.insert("slice".into(), json!({ by.as_str(): value }));
        }
        o.insert("metric".into(), json!(self.metric));
        o.insert("value".into(), number_json(r.value));
        o.insert("ci".into(), pair_json(r.ci));
        o.insert(
            "change".into(),
            r.change.as_ref().map_or(Value::Null, |c| {
                json!({
                    "baseline": number_json(c.baseline),
                    "delta": number_json(Some(c.delta)),
                    "ci": pair_json(c.ci),
                    "p": number_json(c.p),
                    "significant": c.significant,
                })
            }),
        );
        o.insert("examples".into(), r.examples.map_or(Value::Null, |n| json!(n)));
        o.insert("status".into(), json!(r.status));
        Value::Object(o)
    }
}

/// The most rows the HTML leaderboard shows.
const HTML_ROWS: usize = 1000;

/// The HTML report's first view: the leaderboard of its models by the
/// default metric (see [`default_metric`]); nothing for a report without
/// metrics (not an eval report).
pub(crate) fn html_leaderboard(report: &Value) -> String {
    use crate::escape::escape_html;
    let reports = [(PathBuf::from("report"), report.clone())];
    let Ok(table) = table(&reports, None, None) else { return String::new() };
    let any_ci = table.rows.iter().any(|r| r.ci.is_some());
    let any_change = table.rows.iter().any(|r| r.change.is_some());
    let any_significant = table.rows.iter().any(|r| r.change.as_ref().is_some_and(|c| c.significant.is_some()));
    let direction = if table.higher_is_better { "higher is better" } else { "lower is better" };
    let mut html = format!(
        "<section id=\"leaderboard\">\n<h2>Leaderboard by {} <span class=\"date\">({direction}; =R: tied, intervals overlap)</span></h2>\n\
         <table id=\"leaderboard-table\">\n<thead><tr><th class=\"number\">Rank</th><th>Model</th><th class=\"number\">{}</th>",
        escape_html(&table.metric),
        escape_html(&table.metric)
    );
    if any_ci {
        let _ = write!(html, "<th class=\"number\">{}</th>", escape_html(&table.ci_header()));
    }
    if any_change {
        html.push_str("<th class=\"number\">Δ vs baseline</th>");
    }
    if any_significant {
        html.push_str("<th>Significant</th>");
    }
    html.push_str("<th>Status</th></tr></thead>\n<tbody>\n");
    for r in table.rows.iter().take(HTML_ROWS) {
        let _ = write!(
            html,
            "<tr><td class=\"number\">{}</td><td class=\"model\"><code>{}</code></td><td class=\"number\">{}</td>",
            escape_html(&r.rank.text()),
            escape_html(&r.model),
            r.value.map_or_else(|| "–".into(), decimal)
        );
        if any_ci {
            let ci = r.ci.map_or_else(|| "–".into(), |(l, h)| format!("[{}, {}]", decimal(l), decimal(h)));
            let _ = write!(html, "<td class=\"number\">{ci}</td>");
        }
        let change = r.change.as_ref();
        if any_change {
            let delta = change.map_or_else(|| "–".into(), |c| signed(c.delta));
            let _ = write!(html, "<td class=\"number\">{delta}</td>");
        }
        if any_significant {
            let word = match change.and_then(|c| c.significant) {
                Some(true) => "yes",
                Some(false) => "no",
                None => "–",
            };
            let _ = write!(html, "<td>{word}</td>");
        }
        let _ = writeln!(html, "<td>{}</td></tr>", escape_html(&r.status));
    }
    html.push_str("</tbody>\n</table>\n</section>\n");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(units: Value) -> Value {
        json!({"schema_version": 1, "units": units})
    }

    fn one(units: Value) -> Vec<(PathBuf, Value)> {
        vec![(PathBuf::from("r.json"), report(units))]
    }

    fn ranks(table: &Table) -> Vec<(String, String)> {
        table.rows.iter().map(|r| (r.rank.text(), r.model.clone())).collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn overlapping_intervals_tie_with_their_leader_and_the_rest_rank_by_place() {
        let reports = one(json!([
            {"model": "c", "status": "ok", "metrics": {"accuracy": 0.80}, "ci": {"accuracy": [0.78, 0.82]}},
            {"model": "a", "status": "ok", "metrics": {"accuracy": 0.90}, "ci": {"accuracy": [0.88, 0.92]}},
            {"model": "b", "status": "ok", "metrics": {"accuracy": 0.89}, "ci": {"accuracy": [0.87, 0.91]}},
            {"model": "d", "status": "ok", "metrics": {"accuracy": 0.70}, "ci": {"accuracy": [0.65, 0.75]}},
            {"model": "e", "status": "crashed"},
            {"model": "f", "status": "ok", "metrics": {"accuracy": 0.69}, "ci": {"accuracy": [0.66, 0.72]}},
        ]));
        let table = table(&reports, Some("acc"), None).unwrap();
        assert_eq!(table.metric, "accuracy");
        assert_eq!(ranks(&table), pairs(&[("=1", "a"), ("=1", "b"), ("3", "c"), ("=4", "d"), ("=4", "f"), ("–", "e")]));
        let md = table.render(TableFormat::Markdown);
        assert!(md.starts_with("| Rank | Model | accuracy (higher is better) | CI | Examples | Status |\n"), "{md}");
        assert!(md.contains("| =1 | `a` | 0.9000 | [0.8800, 0.9200] | – | ok |"), "{md}");
        assert!(md.contains("| – | `e` | – | – | – | crashed |"), "{md}");
    }

    #[test]
    fn lower_is_better_metrics_sort_up_and_without_intervals_only_equal_values_tie() {
        let reports = one(json!([
            {"model": "a", "status": "ok", "metrics": {"log_loss": 0.5, "accuracy": 0.1}},
            {"model": "b", "status": "ok", "metrics": {"log_loss": 0.3}},
            {"model": "c", "status": "ok", "metrics": {"log_loss": 0.5}, "ci": {"log_loss": null}},
        ]));
        let table = table(&reports, Some("log_loss"), None).unwrap();
        assert_eq!(ranks(&table), pairs(&[("1", "b"), ("=2", "a"), ("=2", "c")]));
        assert!(!table.higher_is_better);
        assert!(!table.render(TableFormat::Markdown).contains("CI"), "no interval, no column");
    }

    #[test]
    fn both_forms_of_change_are_read() {
        let reports = one(json!([
            {"model": "old", "status": "ok", "metrics": {"auc": 0.8}, "baseline_metrics": {"auc": 0.85},
             "change": {"auc": -0.05}},
            {"model": "new", "status": "ok", "metrics": {"auc": 0.9}, "ci": {"auc": [0.85, 0.95]},
             "change": {"auc": {"baseline": 0.8, "delta": 0.1, "ci": [0.05, 0.15], "p": 0.004, "significant": true}}},
            {"model": "fresh", "status": "ok", "metrics": {"auc": 0.7}, "baseline": "new"},
        ]));
        let t = table(&reports, Some("auc"), None).unwrap();
        assert_eq!(ranks(&t), pairs(&[("1", "new"), ("2", "old"), ("3", "fresh")]));
        assert_eq!(
            t.rows[0].change,
            Some(Change {
                baseline: Some(0.8),
                delta: 0.1,
                ci: Some((0.05, 0.15)),
                p: Some(0.004),
                significant: Some(true)
            })
        );
        assert_eq!(
            t.rows[1].change,
            Some(Change { baseline: Some(0.85), delta: -0.05, ci: None, p: None, significant: None })
        );
        let md = t.render(TableFormat::Markdown);
        assert!(
            md.contains("| 1 | `new` | 0.9000 | [0.8500, 0.9500] | +0.1000 | [+0.0500, +0.1500] | 0.004 | yes |"),
            "{md}"
        );
        assert!(md.contains("| 2 | `old` | 0.8000 | – | -0.0500 | – | – | – |"), "{md}");
        let csv = t.render(TableFormat::Csv);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "rank,tied,report,model,metric,value,ci_low,ci_high,baseline,delta,delta_ci_low,delta_ci_high,p,significant,examples,status"
        );
        assert_eq!(lines[1], "1,false,r.json,new,auc,0.9,0.85,0.95,0.8,0.1,0.05,0.15,0.004,true,,ok");
        assert_eq!(lines[2], "2,false,r.json,old,auc,0.8,,,0.85,-0.05,,,,,,ok");
        let jsonl = t.render(TableFormat::Jsonl);
        let first: Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
        assert_eq!(first["change"]["significant"], true);
        assert_eq!(first["ci"], json!([0.85, 0.95]));
        let third: Value = serde_json::from_str(jsonl.lines().nth(2).unwrap()).unwrap();
        assert!(third["change"].is_null());
    }

    #[test]
    fn by_slice_ranks_within_each_value() {
        let reports = one(json!([
            {"model": "a", "status": "ok", "metrics": {"accuracy": 0.9}, "slices": {"country": {
                "de": {"accuracy": 0.95, "examples": 10, "ci": {"accuracy": [0.9, 1.0]}},
                "fr": {"accuracy": 0.5, "examples": 12}}}},
            {"model": "b", "status": "ok", "metrics": {"accuracy": 0.8}, "slices": {"country": {
                "de": {"accuracy": 0.7, "examples": 10, "ci": {"accuracy": [0.6, 0.8]}},
                "fr": {"accuracy": 0.6, "examples": 12}}}},
        ]));
        let t = table(&reports, None, Some("country")).unwrap();
        let got: Vec<(String, String, String)> =
            t.rows.iter().map(|r| (r.slice_value.clone().unwrap(), r.rank.text(), r.model.clone())).collect();
        let want = [("de", "1", "a"), ("de", "2", "b"), ("fr", "1", "b"), ("fr", "2", "a")];
        assert_eq!(got, want.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())));
        assert_eq!(t.rows[0].ci, Some((0.9, 1.0)));
        assert_eq!(t.rows[0].examples, Some(10));
        let first: Value = serde_json::from_str(t.render(TableFormat::Jsonl).lines().next().unwrap()).unwrap();
        assert_eq!(first["slice"], json!({"country": "de"}));
        assert!(t.render(TableFormat::Csv).starts_with("rank,tied,report,model,slice_value,metric,"));
        let error = table(&reports, None, Some("city")).unwrap_err();
        assert_eq!(error.to_string(), "--by city: no model of r.json has slices by city; slice features: country");
    }

    #[test]
    fn the_default_metric_and_errors_name_what_there_is() {
        let mut reports = one(json!([{"model": "a", "status": "ok", "metrics": {"log_loss": 0.3, "auc": 0.8}}]));
        assert_eq!(table(&reports, None, None).unwrap().metric, "auc", "the vocabulary's order");
        reports[0].1["settings"] = json!({"eval": {"metrics": ["log_loss", "auc"]}});
        assert_eq!(table(&reports, None, None).unwrap().metric, "log_loss", "the first --metric");
        let error = table(&reports, Some("r2"), None).unwrap_err();
        assert_eq!(error.to_string(), "no model of r.json has metric r2; they have: log_loss, auc");
        assert!(matches!(table(&reports, Some("acuracy"), None), Err(TableError::UnknownMetric { .. })));
        assert_eq!(table(&one(json!([{"model": "a", "status": "ok"}])), None, None), Err(TableError::NoMetrics));
    }

    #[test]
    fn a_model_in_two_reports_is_named_by_its_file() {
        let reports = vec![
            (PathBuf::from("monday.json"), report(json!([{"model": "m", "status": "ok", "metrics": {"f1": 0.5}}]))),
            (
                PathBuf::from("tuesday.json"),
                report(json!([{"model": "m", "status": "ok", "metrics": {"f1": 0.6}},
                                                           {"model": "n", "status": "ok", "metrics": {"f1": 0.1}}])),
            ),
        ];
        let t = table(&reports, None, None).unwrap();
        let md = t.render(TableFormat::Markdown);
        assert!(md.contains("| 1 | `m` (tuesday.json) | 0.6000 |"), "{md}");
        assert!(md.contains("| 2 | `m` (monday.json) | 0.5000 |"), "{md}");
        assert!(md.contains("| 3 | `n` | 0.1000 |"), "{md}");
        assert!(t.render(TableFormat::Csv).contains("\n1,false,tuesday.json,m,f1,0.6,"));
    }

    #[test]
    fn the_html_leaderboard_is_escaped_and_empty_without_metrics() {
        let page = html_leaderboard(&report(json!([
            {"model": "<b>", "status": "ok", "metrics": {"accuracy": 0.9}, "ci": {"accuracy": [0.8, 1.0]}},
            {"model": "c", "status": "ok", "metrics": {"accuracy": 0.85}, "ci": {"accuracy": [0.75, 0.95]}},
        ])));
        assert!(page.contains("<h2>Leaderboard by accuracy"), "{page}");
        assert!(page.contains("<td class=\"number\">=1</td><td class=\"model\"><code>&lt;b&gt;</code></td>"), "{page}");
        assert!(html_leaderboard(&report(json!([{"model": "a", "status": "ok"}]))).is_empty());
    }

    #[test]
    fn model_ids_slice_values_and_statuses_cannot_forge_rows_or_send_escape_sequences() {
        let reports = one(json!([
            {"model": "m\r\x1b[2K| 1 | `best` | 1.0000 |", "status": "ok\x1b]0;title\x07",
             "metrics": {"accuracy": 0.5},
             "slices": {"country": {"de\n| 1 | `x` |\u{9b}31m": {"accuracy": 0.5, "examples": 3}}}},
        ]));
        for by in [None, Some("country")] {
            let t = table(&reports, None, by).unwrap();
            for format in [TableFormat::Markdown, TableFormat::Csv] {
                let text = t.render(format);
                let controls: Vec<char> = text.chars().filter(|c| c.is_control() && *c != '\n').collect();
                assert!(controls.is_empty(), "{format:?} {by:?}: {controls:?} in {text:?}");
                assert_eq!(text.lines().count(), 2 + usize::from(format == TableFormat::Markdown), "{text}");
                assert!(text.contains("m\\r\\x1b[2K"), "{text}");
            }
        }
        let md = table(&reports, None, Some("country")).unwrap().render(TableFormat::Markdown);
        assert!(md.contains("| de\\n\\| 1 \\| `x` \\|\\u{9b}31m |"), "{md}");
        assert!(md.contains("| ok\\x1b]0;title\\x07 |"), "{md}");
    }

    /// The ranking of the module's doc, as it was written first: every
    /// leader looks at every row left (O(n²)), the reference for [`rank`].
    fn rank_by_looking_at_every_row(sorted: Vec<TableRow>) -> Vec<(String, String)> {
        let mut left: Vec<Option<TableRow>> = sorted.into_iter().map(Some).collect();
        let mut out = Vec::new();
        for i in 0..left.len() {
            let Some(leader) = left[i].take() else { continue };
            let (low, high) = interval(&leader);
            let mut group = vec![leader];
            for slot in left.iter_mut().skip(i + 1) {
                if slot.as_ref().is_some_and(|r| interval(r).0 <= high && low <= interval(r).1) {
                    group.extend(slot.take());
                }
            }
            let place = out.len() + 1;
            let rank = if group.len() > 1 { Rank::Tied(place) } else { Rank::Ranked(place) };
            out.extend(group.into_iter().map(|r| (rank.text(), r.model)));
        }
        out
    }

    fn row(model: String, value: f64, ci: Option<(f64, f64)>) -> TableRow {
        TableRow {
            rank: Rank::Unranked,
            report: PathBuf::from("r.json"),
            model,
            in_several_reports: false,
            slice_value: None,
            status: "ok".into(),
            value: Some(value),
            ci,
            change: None,
            examples: None,
        }
    }

    #[test]
    fn ranking_agrees_with_looking_at_every_row() {
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for case in 0..300 {
            let n = 1 + case % 40;
            let mut rows: Vec<TableRow> = (0..n)
                .map(|i| {
                    let value = (next() * 20.0).round() / 20.0;
                    // Some without an interval, some wide, some reversed (a hostile report's).
                    let ci = match (next() * 4.0) as u32 {
                        0 => None,
                        1 => Some((value - next() * 0.3, value + next() * 0.3)),
                        2 => Some((value - 0.01, value + 0.01)),
                        _ => Some((value + next() * 0.2, value - next() * 0.2)),
                    };
                    row(format!("m{i}"), value, ci)
                })
                .collect();
            rows.sort_by(|a, b| b.value.unwrap().total_cmp(&a.value.unwrap()).then_with(|| a.model.cmp(&b.model)));
            let got: Vec<(String, String)> = rank(rows.clone()).into_iter().map(|r| (r.rank.text(), r.model)).collect();
            assert_eq!(got, rank_by_looking_at_every_row(rows), "case {case}");
        }
    }

    #[test]
    fn ranking_is_n_log_n_in_the_rows() {
        // Every interval apart: no ties, the worst case of looking at every row left (n²/2).
        let n: usize = 1 << 13;
        let rows: Vec<TableRow> = (0..n)
            .map(|i| row(format!("m{i}"), (n - i) as f64, Some(((n - i) as f64 - 0.1, (n - i) as f64 + 0.1))))
            .collect();
        VISITS.with(|v| v.set(0));
        let ranked = rank(rows);
        assert!(ranked.iter().enumerate().all(|(i, r)| r.rank == Rank::Ranked(i + 1)));
        let visits = VISITS.with(std::cell::Cell::get);
        let log = u64::from(n.ilog2());
        assert!(visits <= 4 * n as u64 * log, "{visits} tree nodes visited for {n} rows");
    }

    #[test]
    fn cells_are_escaped() {
        let reports = one(json!([{"model": "a|b,\"c\"", "status": "ok", "metrics": {"mse": 0.5}}]));
        let t = table(&reports, None, None).unwrap();
        assert!(t.render(TableFormat::Markdown).contains("`a\\|b,\"c\"`"));
        assert!(t.render(TableFormat::Csv).contains(",\"a|b,\"\"c\"\"\",mse,"));
    }
}
