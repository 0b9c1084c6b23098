//! What `run` shows as it goes: records in model order as JSON Lines or a
//! table with a totals line under it, a progress bar on a terminal, and
//! the `--summary` (the same table and totals on stderr, for JSON Lines). Every
//! string of a record but the JSON lines passes `text::one_line`: ids,
//! statuses, messages and output names are the model's to choose.
//!
//! An error's end usually says what to do (`--python / ISORUN_PYTHON`,
//! `--keras-unsafe`, `unknown input 'x'`), so a message is never cut at its
//! end: paths under the working folder are shown relative to it (a model
//! elsewhere by its id, its path within the folder the user named), a row
//! too wide for the terminal (its width, or `COLUMNS`) is cut in the middle
//! with `…`, and the messages cut are printed whole under the totals; with
//! `-v` the rows hold them whole. Where stdout is no terminal and `COLUMNS`
//! is not set (a file), nothing is cut.

use crate::cli::Format;
use crate::support::own_peak_rss;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use isorun_engine::Model;
use isorun_report::text::one_line;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
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
    layout: Layout,
    /// The models whose row cut their message, and the message whole (shown under the totals).
    cut: Vec<(String, String)>,
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
            layout: Layout::of(libc::STDOUT_FILENO),
            cut: Vec::new(),
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
                    Format::Table => {
                        let (row, whole) = table_row(&record, self.id_width, &self.layout);
                        if let Some(whole) = whole {
                            self.cut.push((one_line(record["model"].as_str().unwrap_or("?")).into_owned(), whole));
                        }
                        match self.next {
                            0 => format!("{}\n{row}", table_header(self.id_width)),
                            _ => row,
                        }
                    }
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

    /// Ends the printing: on a table, the totals line under it (stdout, as
    /// the table), then the messages the rows cut, whole.
    pub fn finish(&self, elapsed: Duration) {
        if self.format == Format::Table && !self.broken_pipe {
            let write = || -> io::Result<()> {
                let mut out = io::stdout().lock();
                writeln!(out, "\n{}", totals_line(self.count, self.ok, elapsed))?;
                write!(out, "{}", cut_messages(&self.cut))?;
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

/// How rows are laid out: the width to fit messages in (none: a file,
/// where nothing is cut), whether `-v` asked for messages whole, and the
/// working folder that paths are shown relative to.
#[derive(Debug, Clone, Default)]
struct Layout {
    columns: Option<usize>,
    whole: bool,
    cwd: Option<PathBuf>,
}

impl Layout {
    /// The layout for a table printed on `fd` (stdout, or stderr for `--summary`).
    fn of(fd: i32) -> Layout {
        Layout {
            columns: terminal_columns(fd, std::env::var("COLUMNS").ok().as_deref()),
            // `-v` (info and more verbose) says more: whole messages too.
            whole: tracing::level_filters::LevelFilter::current() >= tracing::level_filters::LevelFilter::INFO,
            cwd: std::env::current_dir().ok(),
        }
    }
}

/// The width of the terminal on `fd`: `COLUMNS` when it is set to a
/// number (as `ls` takes it), else the terminal's own (`TIOCGWINSZ`), else
/// none (not a terminal).
pub(crate) fn terminal_columns(fd: i32, columns_var: Option<&str>) -> Option<usize> {
    if let Some(columns) = columns_var.and_then(|c| c.trim().parse::<usize>().ok()).filter(|&c| c > 0) {
        return Some(columns);
    }
    let mut size = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one winsize into `size`, which lives through the call.
    let asked = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size) };
    (asked == 0 && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// The fewest characters a row gives its message, however narrow the
/// terminal: the row wraps rather than saying nothing. Small, so that on a
/// narrow terminal (60 columns) a row still fits it where the other
/// columns leave room, and wraps by little where they do not.
const MIN_MESSAGE: usize = 20;

/// One record as a table row, and its message whole when the row had to
/// cut it to the terminal's width. A message's further lines (TensorFlow's
/// node trace under an assertion) are shown with `-v` only.
fn table_row(record: &Value, id_width: usize, layout: &Layout) -> (String, Option<String>) {
    let metrics = record.get("metrics").and_then(Value::as_object).filter(|_| record["status"] == "ok");
    let warmup = record.get("warmup").filter(|_| record["status"] == "ok");
    let shard = record.get("data_shard").and_then(Value::as_str).filter(|_| record["status"] == "ok");
    let examples = record["examples"].as_u64().unwrap_or(0);
    let resumed = if record["resumed"] == true { " (resumed)" } else { "" };
    let prefix = format!(
        "{:<w$}  {:<14}  {:>6.2} s  {:>9}  ",
        one_line(record["model"].as_str().unwrap_or("?")),
        one_line(record["status"].as_str().unwrap_or("?")),
        record["wall_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
        mib(record["peak_rss_bytes"].as_u64()),
        w = id_width
    );
    let mut whole = None;
    let detail = match record.get("outputs").and_then(Value::as_object) {
        _ if warmup.is_some() => {
            let requests = warmup.and_then(|w| w["requests"].as_u64()).unwrap_or(0);
            let plural = if requests == 1 { "" } else { "s" };
            format!("{requests} warm-up request{plural}, {examples} examples")
        }
        // `eval --data-shard K/N`: the shard's metrics are partial; the model's come when the shards merge.
        _ if shard.is_some() => {
            format!("{examples} examples of data shard {}, metrics at report merge", one_line(shard.unwrap_or("?")))
        }
        _ if metrics.is_some() => {
            // `0.8140 [0.790, 0.837]` with --ci, and the change against a baseline.
            let metrics = metrics.into_iter().flatten().map(|(name, value)| {
                let text = isorun_report::change::metric_text(record, name).unwrap_or_else(|| value.to_string());
                format!("{} {}", one_line(name), one_line(&text))
            });
            std::iter::once(format!("{examples} examples")).chain(metrics).collect::<Vec<_>>().join(", ")
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
            let message = shown_paths(record["error"]["message"].as_str().unwrap_or(""), record, layout.cwd.as_deref());
            let mut lines = message.lines();
            // `lines` split at `\n` only: a lone `\r` (or an escape
            // sequence) is still there, and must not rewrite the row.
            let first = one_line(lines.next().unwrap_or("")).into_owned();
            let more = lines.next().is_some();
            let room = layout
                .columns
                .map(|columns| columns.saturating_sub(prefix.chars().count() + resumed.len()).max(MIN_MESSAGE));
            let (first, was_cut) = match room {
                Some(room) if !layout.whole => cut_middle(first, room),
                _ => (first, false),
            };
            if layout.whole && more {
                // `-v`: every line, the further ones under the row.
                let rest: Vec<String> = message.lines().skip(1).map(|l| format!("    {}", one_line(l))).collect();
                return (format!("{prefix}{first}{resumed}\n{}", rest.join("\n")), None);
            }
            if was_cut {
                whole = Some(message.into_owned());
            }
            first
        }
    };
    (format!("{prefix}{detail}{resumed}"), whole)
}

/// `text` cut to `room` characters by taking out its middle (the start
/// says where, the end what is wrong and what to do), and whether it was:
/// a third of the room for the start, the rest for the end, so both grow
/// with the terminal.
fn cut_middle(text: String, room: usize) -> (String, bool) {
    let count = text.chars().count();
    if count <= room {
        return (text, false);
    }
    let head = room / 3;
    let tail = room - head - 1;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(count - tail).collect();
    (format!("{start}…{end}"), true)
}

/// `message` with the model's own path shown as the user knows it: a path
/// under the working folder relative to it (`models/m/assets.extra/...`),
/// and the model's path elsewhere as its id (its path within the folder
/// the user named).
fn shown_paths<'a>(message: &'a str, record: &Value, cwd: Option<&Path>) -> Cow<'a, str> {
    // The working folder `/` would make every absolute path relative: none.
    let cwd = cwd.and_then(Path::to_str).map(|c| c.trim_end_matches('/')).filter(|c| c.starts_with('/'));
    let mut shown = Cow::Borrowed(message);
    if let (Some(path), Some(id)) = (record["path"].as_str(), record["model"].as_str()) {
        let under_cwd = cwd.is_some_and(|cwd| Path::new(path).starts_with(cwd));
        if !under_cwd && Path::new(path).is_absolute() && Path::new(path).ends_with(id) && !id.is_empty() {
            shown = Cow::Owned(replace_path(&shown, path, id));
        }
    }
    if let Some(cwd) = cwd {
        let prefix = format!("{cwd}/");
        if shown.contains(&prefix) {
            shown = Cow::Owned(replace_path(&shown, &prefix, ""));
        }
    }
    shown
}

/// `text` with each whole occurrence of the path `from` (not one inside a
/// longer path or name) replaced by `to`.
fn replace_path(text: &str, from: &str, to: &str) -> String {
    let name_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    let mut out = String::with_capacity(text.len());
    let mut rest = 0;
    for (at, _) in text.match_indices(from) {
        if at < rest {
            continue;
        }
        let before = text[..at].chars().next_back();
        let after = text[at + from.len()..].chars().next();
        let whole = before.is_none_or(|c| !name_char(c))
            && (from.ends_with('/') || after.is_none_or(|c| !(c.is_alphanumeric() || matches!(c, '_' | '-'))));
        if whole {
            out.push_str(&text[rest..at]);
            out.push_str(to);
            rest = at + from.len();
        }
    }
    out.push_str(&text[rest..]);
    out
}

/// The messages the rows cut, whole, for under the totals line; empty when none was.
pub(crate) fn cut_messages(cut: &[(String, String)]) -> String {
    use std::fmt::Write as _;
    let mut text = String::new();
    if cut.is_empty() {
        return text;
    }
    let _ = writeln!(text, "\nmessages cut above, whole (-v shows them in the table):");
    for (model, message) in cut {
        let _ = write!(text, "  {model}: ");
        for (i, line) in message.lines().enumerate() {
            let indent = if i == 0 { "" } else { "    " };
            let _ = writeln!(text, "{indent}{}", one_line(line));
        }
    }
    text
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("-".into(), |b| format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0)))
}

/// The totals line: `3 models: 2 ok, 1 not ok, in 0.54 s; supervisor peak memory 6 MiB`
/// (`1 model: ...` for one).
fn totals_line(count: usize, ok: usize, elapsed: Duration) -> String {
    format!(
        "{count} {}: {ok} ok, {} not ok, in {:.2} s; supervisor peak memory {}",
        if count == 1 { "model" } else { "models" },
        count - ok,
        elapsed.as_secs_f64(),
        mib(own_peak_rss())
    )
}

/// The `--summary` with JSON Lines on stdout: the table (the layout a
/// terminal shows) and the totals line, on stderr.
pub fn print_summary(records: &[Value], elapsed: Duration) {
    let text = summary_text(records, elapsed, &Layout::of(libc::STDERR_FILENO));
    let _ = io::stderr().lock().write_all(text.as_bytes());
}

/// The `--summary` table's text: the table, the totals, and every message
/// of a unit not ok, whole.
fn summary_text(records: &[Value], elapsed: Duration, layout: &Layout) -> String {
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
        let _ = writeln!(err, "{}", table_row(r, width, layout).0);
    }
    let ok = records.iter().filter(|r| r["status"] == "ok").count();
    let _ = writeln!(err, "\n{}", totals_line(records.len(), ok, elapsed));
    for r in records.iter().filter(|r| r["status"] != "ok") {
        let _ = writeln!(
            err,
            "  {}: {}",
            one_line(r["model"].as_str().unwrap_or("?")),
            one_line(&shown_paths(r["error"]["message"].as_str().unwrap_or(""), r, layout.cwd.as_deref()))
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
        let layout = Layout::default();
        let row = table_row(&record, 20, &layout).0;
        assert_no_control_characters(&row);
        assert_eq!(row.lines().count(), 1, "one row: {row}");
        assert!(row.contains("\\r\\x1b[2Kfake"), "{row}");
        let ok = json!({"model": "m", "status": "ok", "wall_ms": 20,
        "outputs": {"y\n\x1b[31m": {"dtype": "float32", "shape": [1]}},
        });
        assert_no_control_characters(&table_row(&ok, 20, &layout).0);

        let message = json!({"model": "two\nlines", "status": "error", "error": {"message": "one\nforged: ok"}});
        let summary = summary_text(&[record, message], Duration::from_secs(1), &layout);
        assert_no_control_characters(&summary);
        assert!(summary.contains("two\\nlines") && summary.contains("one\\nforged: ok"), "{summary}");
    }

    fn wide(columns: usize) -> Layout {
        Layout { columns: Some(columns), whole: false, cwd: Some(PathBuf::from("/home/u/work")) }
    }

    fn error_record(path: &str, message: &str) -> Value {
        json!({"model": "m", "path": path, "status": "error", "wall_ms": 20, "error": {"message": message}})
    }

    /// The three messages: a row cut to the terminal keeps their end.
    #[test]
    fn a_row_too_wide_is_cut_in_its_middle_and_says_so() {
        let python = "/usr/bin/python3 has no Keras: pip install tensorflow-cpu (it brings Keras 3), or name \
                      another Python with --python / ISORUN_PYTHON";
        let (row, whole) = table_row(&error_record("/home/u/work/m", python), 5, &wide(100));
        assert_eq!(row.chars().count(), 100, "{row}");
        assert!(
            row.ends_with("… Python with --python / ISORUN_PYTHON") && row.contains("  /usr/bin/python3 h…"),
            "{row}"
        );
        assert_eq!(whole.as_deref(), Some(python));
        // Wide enough: whole, and nothing to print under the table.
        let (row, whole) = table_row(&error_record("/home/u/work/m", python), 5, &wide(200));
        assert!(row.ends_with(python) && whole.is_none(), "{row}");
        // So narrow that the message would vanish: it keeps MIN_MESSAGE characters.
        let (row, _) = table_row(&error_record("/home/u/work/m", python), 5, &wide(20));
        assert_eq!(row.chars().count(), 44 + MIN_MESSAGE, "{row}");
        // A narrow terminal (64 columns: 20 for the message) still gets rows of its width, with
        // the message's start and end (they had 40 characters, and the start 10 of them).
        let metric = "metric accuracy needs a label of 0 or 1 for a binary score; row 3 of data.csv has 7: \
                      give --task multiclass";
        let (row, whole) = table_row(&error_record("/home/u/work/m", metric), 5, &wide(64));
        assert_eq!(row.chars().count(), 64, "{row}");
        assert!(row.ends_with("  metric…sk multiclass"), "{row}");
        assert_eq!(whole.as_deref(), Some(metric));
        // -v: whole, each further line under the row.
        let layout = Layout { whole: true, ..wide(60) };
        let (row, whole) = table_row(&error_record("/home/u/work/m", &format!("{python}\nsecond")), 5, &layout);
        assert!(row.contains(python) && row.ends_with("\n    second") && whole.is_none(), "{row}");
        // A message of several lines: the row shows its first (the rest with -v);
        // a cut one follows the totals with every line.
        let (row, whole) = table_row(&error_record("/home/u/work/m", "first\nsecond"), 5, &wide(200));
        assert!(row.ends_with("  first") && whole.is_none(), "{row}");
        assert_eq!(
            cut_messages(&[("m".into(), "first\nsecond".into())]).lines().skip(2).collect::<Vec<_>>(),
            ["  m: first", "    second"]
        );
    }

    #[test]
    fn paths_are_shown_relative_to_the_working_folder_or_as_the_model_s_id() {
        let cwd = Some(Path::new("/home/u/work"));
        let warmup = "/home/u/work/models/dynamic/assets.extra/tf_serving_warmup_requests: request 0 (record at \
                      byte 0): unknown input 'x'";
        let record = json!({"model": "dynamic", "path": "/home/u/work/models/dynamic"});
        assert_eq!(
            shown_paths(warmup, &record, cwd),
            "models/dynamic/assets.extra/tf_serving_warmup_requests: request 0 (record at byte 0): unknown input 'x'"
        );
        // A model outside the working folder: its path within the folder the user named, its id.
        let record = json!({"model": "v1/dynamic", "path": "/data/models/v1/dynamic"});
        let message =
            "/data/models/v1/dynamic: cannot load; /data/models/v1/dynamic2 and /x/data/models/v1/dynamic stay";
        assert_eq!(
            shown_paths(message, &record, cwd),
            "v1/dynamic: cannot load; /data/models/v1/dynamic2 and /x/data/models/v1/dynamic stay"
        );
        // Other files under the working folder too, not a longer folder's; `/` makes nothing relative.
        let record = json!({"model": "m", "path": "/elsewhere/m"});
        assert_eq!(
            shown_paths("/home/u/work/data.csv, /home/u/workshop/x", &record, cwd),
            "data.csv, /home/u/workshop/x"
        );
        assert_eq!(shown_paths("/home/u/work/data.csv", &record, Some(Path::new("/"))), "/home/u/work/data.csv");
    }

    #[test]
    fn columns_come_from_columns_or_the_terminal() {
        assert_eq!(terminal_columns(-1, Some("132")), Some(132));
        assert_eq!(terminal_columns(-1, Some("wide")), None);
        assert_eq!(terminal_columns(-1, Some("0")), None);
        assert_eq!(terminal_columns(-1, None), None, "no terminal on fd -1");
    }

    #[test]
    fn a_data_shard_row_shows_its_examples_and_that_its_metrics_come_at_report_merge() {
        let record = json!({"model": "m", "status": "ok", "examples": 500, "data_shard": "0/2", "partial": true,
                            "partial_metrics": {"accuracy": 0.852}, "wall_ms": 414});
        let (row, _) = table_row(&record, 5, &Layout::default());
        assert!(row.ends_with("  500 examples of data shard 0/2, metrics at report merge"), "{row}");
    }
}
