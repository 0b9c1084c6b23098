//! What `run` shows as it goes: records in model order as JSON Lines or a
//! table with a totals line under it, a progress bar on a terminal, and
//! the `--summary` (the same table and totals on stderr, for JSON Lines). Every
//! string of a record but the JSON lines passes `text::one_line`: ids,
//! statuses, messages and output names are the model's to choose.

use crate::cli::Format;
use crate::support::own_peak_rss;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use isorun_engine::Model;
use isorun_report::text::one_line;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::time::Duration;

/// A progress bar on stderr for `total` models.
pub fn progress_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style =
        ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:25}] {pos}/{len} models  {msg}  (ETA {eta})")
            .expect("valid template")
            .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Prints records in model order, as soon as the ones before are done,
/// as JSON Lines or table rows, under a progress bar when there is one.
pub struct Printer<'a> {
    models: &'a [Model],
    pub format: Format,
    pub bar: Option<ProgressBar>,
    next: usize,
    waiting: BTreeMap<usize, Value>,
    running: BTreeSet<usize>,
    /// Statuses that count as failures.
    fail_on: Vec<String>,
    pub failures: usize,
    /// Records accepted, and how many of them were ok: the totals line.
    pub count: usize,
    pub ok: usize,
    pub broken_pipe: bool,
    /// Every record, kept only when a report or summary needs them, so the
    /// supervisor's memory does not grow with the number of units otherwise.
    pub records: Vec<Value>,
    pub keep_records: bool,
    id_width: usize,
}

impl<'a> Printer<'a> {
    pub fn new(models: &'a [Model], format: Format, bar: Option<ProgressBar>, fail_on: Vec<String>) -> Printer<'a> {
        let id_width = models.iter().map(|m| one_line(&m.id).chars().count()).max().unwrap_or(5).clamp(5, 60);
        Printer {
            models,
            format,
            bar,
            next: 0,
            waiting: BTreeMap::new(),
            running: BTreeSet::new(),
            fail_on,
            failures: 0,
            count: 0,
            ok: 0,
            broken_pipe: false,
            records: Vec::new(),
            keep_records: false,
            id_width,
        }
    }

    pub fn started(&mut self, index: usize) {
        self.running.insert(index);
        self.update_bar();
    }

    fn update_bar(&self) {
        if let Some(bar) = &self.bar {
            let running: Vec<_> = self.running.iter().take(3).map(|&i| one_line(&self.models[i].id)).collect();
            let more = self.running.len().saturating_sub(running.len());
            let more = if more > 0 { format!(" +{more}") } else { String::new() };
            bar.set_message(format!("{} failed · running: {}{more}", self.failures, running.join(", ")));
        }
    }

    pub fn accept(&mut self, index: usize, record: Value) {
        self.running.remove(&index);
        self.count += 1;
        if record["status"] == "ok" {
            self.ok += 1;
        }
        if self.fail_on.iter().any(|s| record["status"] == s.as_str()) {
            self.failures += 1;
        }
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
        self.update_bar();
        self.waiting.insert(index, record);
        while let Some(record) = self.waiting.remove(&self.next) {
            if !self.broken_pipe {
                let text = match self.format {
                    Format::Jsonl => record.to_string(),
                    Format::Table if self.next == 0 => {
                        format!("{}\n{}", table_header(self.id_width), table_row(&record, self.id_width))
                    }
                    Format::Table => table_row(&record, self.id_width),
                };
                let write = || -> io::Result<()> {
                    let mut out = io::stdout().lock();
                    writeln!(out, "{text}")?;
                    out.flush()
                };
                let written = match &self.bar {
                    Some(bar) => bar.suspend(write),
                    None => write(),
                };
                if written.is_err() {
                    self.broken_pipe = true;
                }
            }
            // Values live in the output files and JSON lines, not in reports.
            let mut kept = record;
            if let Some(Value::Object(outputs)) = kept.get_mut("outputs") {
                drop_values(outputs);
            }
            // `--warmup-inputs`: each request's outputs.
            if let Some(Value::Array(requests)) = kept.get_mut("requests") {
                for request in requests {
                    if let Some(Value::Object(outputs)) = request.get_mut("outputs") {
                        drop_values(outputs);
                    }
                }
            }
            if self.keep_records {
                self.records.push(kept);
            }
            self.next += 1;
        }
    }

    /// Ends the printing: on a table, the totals line under it (stdout, as the table).
    pub fn finish(&self, elapsed: Duration) {
        if self.format == Format::Table && !self.broken_pipe {
            let write = || -> io::Result<()> {
                let mut out = io::stdout().lock();
                writeln!(out, "\n{}", totals_line(self.count, self.ok, elapsed))?;
                out.flush()
            };
            let _ = write();
        }
    }
}

/// Removes `values` from each output of a record.
fn drop_values(outputs: &mut serde_json::Map<String, Value>) {
    for output in outputs.values_mut() {
        if let Value::Object(o) = output {
            o.remove("values");
        }
    }
}

/// The table's header line, for ids up to `id_width` characters.
fn table_header(id_width: usize) -> String {
    format!(
        "{:<w$}  {:<14}  {:>8}  {:>9}  {}",
        "model",
        "status",
        "time",
        "peak mem",
        "outputs, metrics / error",
        w = id_width
    )
}

/// One record as a table row.
fn table_row(record: &Value, id_width: usize) -> String {
    let metrics = record.get("metrics").and_then(Value::as_object).filter(|_| record["status"] == "ok");
    let warmup = record.get("warmup").filter(|_| record["status"] == "ok");
    let detail = match record.get("outputs").and_then(Value::as_object) {
        _ if warmup.is_some() => {
            let requests = warmup.and_then(|w| w["requests"].as_u64()).unwrap_or(0);
            let plural = if requests == 1 { "" } else { "s" };
            format!("{requests} warm-up request{plural}, {} examples", record["examples"].as_u64().unwrap_or(0))
        }
        _ if metrics.is_some() => {
            // `0.8140 [0.790, 0.837]` with --ci, and the change against a baseline.
            let metrics = metrics.into_iter().flatten().map(|(name, value)| {
                let text = isorun_report::change::metric_text(record, name).unwrap_or_else(|| value.to_string());
                format!("{} {}", one_line(name), one_line(&text))
            });
            std::iter::once(format!("{} examples", record["examples"].as_u64().unwrap_or(0)))
                .chain(metrics)
                .collect::<Vec<_>>()
                .join(", ")
        }
        Some(outputs) => outputs
            .iter()
            .map(|(name, o)| {
                let dims: Vec<String> = o["shape"].as_array().into_iter().flatten().map(|d| d.to_string()).collect();
                format!("{} {}[{}]", one_line(name), one_line(o["dtype"].as_str().unwrap_or("?")), dims.join(", "))
            })
            .collect::<Vec<_>>()
            .join(", "),
        None => {
            let text = record["error"]["message"].as_str().unwrap_or("");
            let first = text.lines().next().unwrap_or("");
            let first = if first.chars().count() > 100 {
                format!("{}...", first.chars().take(100).collect::<String>())
            } else {
                first.to_string()
            };
            // `lines` split at `\n` only: a lone `\r` (or an escape
            // sequence) is still there, and must not rewrite the row.
            one_line(&first).into_owned()
        }
    };
    let resumed = if record["resumed"] == true { " (resumed)" } else { "" };
    format!(
        "{:<w$}  {:<14}  {:>6.2} s  {:>9}  {detail}{resumed}",
        one_line(record["model"].as_str().unwrap_or("?")),
        one_line(record["status"].as_str().unwrap_or("?")),
        record["wall_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
        mib(record["peak_rss_bytes"].as_u64()),
        w = id_width
    )
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("-".into(), |b| format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0)))
}

/// The totals line: `3 models: 2 ok, 1 not ok, in 0.54 s; supervisor peak memory 6 MiB`.
fn totals_line(count: usize, ok: usize, elapsed: Duration) -> String {
    format!(
        "{count} models: {ok} ok, {} not ok, in {:.2} s; supervisor peak memory {}",
        count - ok,
        elapsed.as_secs_f64(),
        mib(own_peak_rss())
    )
}

/// The `--summary` with JSON Lines on stdout: the table (the layout a
/// terminal shows) and the totals line, on stderr.
pub fn print_summary(records: &[Value], elapsed: Duration) {
    let _ = io::stderr().lock().write_all(summary_text(records, elapsed).as_bytes());
}

/// The `--summary` table's text.
fn summary_text(records: &[Value], elapsed: Duration) -> String {
    use std::fmt::Write as _;
    let width = records
        .iter()
        .filter_map(|r| r["model"].as_str())
        .map(|m| one_line(m).chars().count())
        .max()
        .unwrap_or(5)
        .clamp(5, 60);
    let mut err = String::new();
    let _ = writeln!(err, "\n{}", table_header(width));
    for r in records {
        let _ = writeln!(err, "{}", table_row(r, width));
    }
    let ok = records.iter().filter(|r| r["status"] == "ok").count();
    let _ = writeln!(err, "\n{}", totals_line(records.len(), ok, elapsed));
    for r in records.iter().filter(|r| r["status"] != "ok") {
        let _ = writeln!(
            err,
            "  {}: {}",
            one_line(r["model"].as_str().unwrap_or("?")),
            one_line(r["error"]["message"].as_str().unwrap_or(""))
        );
    }
    err
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FORGED: &str = "\r\x1b[2Kfake  ok  0.02 s  70 MiB\x1b[8m";

    fn assert_no_control_characters(text: &str) {
        let bad: Vec<char> = text.chars().filter(|c| c.is_control() && *c != '\n').collect();
        assert!(bad.is_empty(), "control characters {bad:?} in {text:?}");
    }

    #[test]
    fn a_model_s_text_cannot_forge_a_table_row_or_the_summary() {
        let models = [Model::saved_model("evil\x1b]0;title\x07", "/models/evil")];
        let record = json!({"model": models[0].id, "status": "error", "wall_ms": 20,
                            "error": {"kind": "error", "message": FORGED}});
        let row = table_row(&record, 20);
        assert_no_control_characters(&row);
        assert_eq!(row.lines().count(), 1, "one row: {row}");
        assert!(row.contains("\\r\\x1b[2Kfake"), "{row}");
        let ok = json!({"model": "m", "status": "ok", "wall_ms": 20,
        "outputs": {"y\n\x1b[31m": {"dtype": "float32", "shape": [1]}},
        });
        assert_no_control_characters(&table_row(&ok, 20));

        let message = json!({"model": "two\nlines", "status": "error", "error": {"message": "one\nforged: ok"}});
        let summary = summary_text(&[record, message], Duration::from_secs(1));
        assert_no_control_characters(&summary);
        assert!(summary.contains("two\\nlines") && summary.contains("one\\nforged: ok"), "{summary}");
    }
}
