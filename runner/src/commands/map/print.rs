//! What `isorun map` shows as it goes: one record per item in item order,
//! each as soon as it and all before it are done, as JSON Lines or (on a
//! terminal) a table with a totals line. Items, messages and value types
//! are the user's: every table cell passes `text::one_line`.

use crate::cli::Format;
use crate::support::own_peak_rss;
use isorun_report::text::one_line;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::Duration;

/// Prints records in item order.
pub struct Printer {
    pub format: Format,
    next: usize,
    waiting: BTreeMap<usize, Value>,
    fail_on: Vec<String>,
    pub failures: usize,
    pub count: usize,
    pub ok: usize,
    pub broken_pipe: bool,
    /// Every record, for the reports (kept only when one is asked for).
    pub records: Vec<Value>,
    pub keep_records: bool,
    width: usize,
    /// The terminal's width (or `COLUMNS`): rows are cut to it, as `run`'s.
    columns: Option<usize>,
    /// Messages the rows cut: (item, message), printed whole under the totals.
    cut: Vec<(String, String)>,
}

impl Printer {
    pub fn new(format: Format, fail_on: Vec<String>, width: usize) -> Printer {
        Printer {
            format,
            next: 0,
            waiting: BTreeMap::new(),
            fail_on,
            failures: 0,
            count: 0,
            ok: 0,
            broken_pipe: false,
            records: Vec::new(),
            keep_records: false,
            width: width.clamp(4, 60),
            columns: crate::printer::terminal_columns(1, std::env::var("COLUMNS").ok().as_deref()),
            cut: Vec::new(),
        }
    }

    /// Takes item `index`'s record; prints it and every waiting one after it that is due.
    pub fn accept(&mut self, index: usize, record: Value) {
        self.count += 1;
        if record["status"] == "ok" {
            self.ok += 1;
        }
        if self.fail_on.iter().any(|s| record["status"] == s.as_str()) {
            self.failures += 1;
        }
        self.waiting.insert(index, record);
        while let Some(record) = self.waiting.remove(&self.next) {
            if !self.broken_pipe {
                let text = match self.format {
                    Format::Jsonl => record.to_string(),
                    Format::Table => {
                        let (line, whole) = row(&record, self.width, self.columns);
                        if let Some(whole) = whole {
                            self.cut.push((item_text(&record), whole));
                        }
                        if self.next == 0 {
                            format!("{}\n{line}", header(self.width))
                        } else {
                            line
                        }
                    }
                };
                let mut out = io::stdout().lock();
                if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
                    self.broken_pipe = true;
                }
            }
            if self.keep_records {
                // Reports leave values out: keep none (up to 1 MiB each).
                let mut record = record;
                if let Some(fields) = record.as_object_mut() {
                    fields.remove("value");
                }
                self.records.push(record);
            }
            self.next += 1;
        }
    }

    /// On a table, the totals line under it.
    pub fn finish(&self, elapsed: Duration) {
        if self.format == Format::Table && !self.broken_pipe {
            let peak = own_peak_rss().map_or("-".into(), |b| format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0)));
            let _ = writeln!(
                io::stdout().lock(),
                "\n{} {}: {} ok, {} not ok, in {:.2} s; supervisor peak memory {peak}",
                self.count,
                if self.count == 1 { "item" } else { "items" },
                self.ok,
                self.count - self.ok,
                elapsed.as_secs_f64()
            );
            let _ = write!(io::stdout().lock(), "{}", crate::printer::cut_messages(&self.cut));
        }
    }
}

fn header(width: usize) -> String {
    format!("{:<width$}  {:<14}  {:>8}  {:>9}  value / error", "item", "status", "time", "peak mem")
}

fn item_text(record: &Value) -> String {
    match &record["item"] {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The row, and the error message whole when the row cut it to the
/// terminal's width (`columns`; none: no message is cut, a value is cut at
/// 100 characters).
fn row(record: &Value, width: usize, columns: Option<usize>) -> (String, Option<String>) {
    let item: String = one_line(&item_text(record)).chars().take(width).collect();
    let detail = if record["status"] == "ok" {
        match record.get("value") {
            Some(value) => value.to_string(),
            None => format!("<{}>", record["value_type"].as_str().unwrap_or("?")),
        }
    } else {
        record["error"]["message"].as_str().unwrap_or("").lines().next().unwrap_or("").to_string()
    };
    let detail = one_line(&detail);
    let resumed = if record["resumed"] == true { " (resumed)" } else { "" };
    let peak = record["peak_rss_bytes"].as_u64().map_or("-".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0));
    let prefix = format!(
        "{item:<width$}  {:<14}  {:>6.2} s  {peak:>9}  ",
        one_line(record["status"].as_str().unwrap_or("?")),
        record["wall_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
    );
    let room = columns.map(|c| c.saturating_sub(prefix.chars().count() + resumed.len()).max(MIN_DETAIL));
    let count = detail.chars().count();
    let (detail, whole) = match room {
        Some(room) if count > room => {
            // Cut in the middle, as run's rows: a message's end says most.
            let head: String = detail.chars().take((room - 1) / 3).collect();
            let tail: String = detail.chars().skip(count - (room - 1 - (room - 1) / 3)).collect();
            let whole =
                (record["status"] != "ok").then(|| record["error"]["message"].as_str().unwrap_or("").to_string());
            (format!("{head}…{tail}"), whole)
        }
        None if record["status"] == "ok" && count > 100 => (detail.chars().take(100).collect(), None),
        _ => (detail.to_string(), None),
    };
    (format!("{prefix}{detail}{resumed}"), whole)
}

/// The fewest characters a row gives its value or message, however narrow
/// the terminal (the row wraps rather than saying nothing).
const MIN_DETAIL: usize = 20;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_item_or_message_cannot_forge_a_row() {
        let record = json!({"item": "a\r\x1b[2Kfake", "status": "error", "wall_ms": 5,
                            "error": {"message": "ValueError: one\nok"}});
        let (text, _) = row(&record, 20, Some(80));
        assert!(!text.chars().any(|c| c.is_control()), "{text:?}");
    }
}
