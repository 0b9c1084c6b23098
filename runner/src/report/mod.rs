//! Reports of a whole run, for people and machines that were not watching
//! it: a JSON document to keep and compare (`--report`), JUnit XML for CI
//! (`--junit`), a self-contained HTML page (`--html`), and the commands
//! that read reports back: `isorun report diff` (what changed since last
//! time) and `isorun report merge` (shard reports joined into one).
//!
//! Reports are built from the same unit records `run` prints, so a report
//! never knows more or less than the JSON lines did.

mod diff;
mod document;
mod files;
mod html;
mod junit;
mod merge;
mod timestamp;
mod unit;

pub use diff::{diff, Finding, Thresholds};
pub use document::{build, summary, RunInfo, SCHEMA_VERSION};
pub use files::write_files;
pub use html::{escape_html, html_page};
pub use junit::junit_xml;
pub use merge::merge;
pub use timestamp::{format_rfc3339, parse_rfc3339, unix_milliseconds};

use crate::cli::{ReportCommand, ReportDiffArgs, ReportMergeArgs};
use isorun_protocol::exit_code;
use std::io::Write;
use std::path::PathBuf;

/// Why a report could not be read, merged or written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: cannot read", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not JSON", path.display())]
    NotJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: not an isorun report: {what}", path.display())]
    NotAReport { path: PathBuf, what: String },
    #[error("{}: report schema_version {found}, but this isorun reads version {SCHEMA_VERSION}", path.display())]
    SchemaVersion { path: PathBuf, found: String },
    #[error("model {model} is in two reports: {} and {}", first.display(), second.display())]
    DuplicateModel { model: String, first: PathBuf, second: PathBuf },
    #[error("no report to merge")]
    NothingToMerge,
    #[error("{}: not a model list (the models.json of isorun slurm submit): {what}", path.display())]
    NotAModelList { path: PathBuf, what: String },
    #[error("{flag} {value}: expected a positive number")]
    BadRatio { flag: &'static str, value: f64 },
    #[error("{}: cannot write", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: cannot make the JUnit XML", path.display())]
    Junit {
        path: PathBuf,
        #[source]
        source: Box<quick_junit::SerializeError>,
    },
}

/// `isorun report diff|merge`. `diff` exits 0 when no model newly fails and
/// 1 when one does; `merge` exits 0. A report that cannot be read (or is
/// not a report of this schema version) is an error, exit 2.
pub fn main(command: &ReportCommand) -> Result<i32, String> {
    let result = match command {
        ReportCommand::Diff(args) => diff_command(args),
        ReportCommand::Merge(args) => merge_command(args),
    };
    result.map_err(|error| crate::run::with_causes(&error))
}

fn diff_command(args: &ReportDiffArgs) -> Result<i32, ReportError> {
    for (flag, value) in [("--time-ratio", args.time_ratio), ("--memory-ratio", args.memory_ratio)] {
        if !(value.is_finite() && value > 0.0) {
            return Err(ReportError::BadRatio { flag, value });
        }
    }
    let old = files::read_report(&args.old)?;
    let new = files::read_report(&args.new)?;
    let findings = diff(&old, &new, Thresholds { time_ratio: args.time_ratio, memory_ratio: args.memory_ratio });
    let mut text = String::new();
    for finding in &findings {
        let line = if args.json { finding.json().to_string() } else { finding.text() };
        text.push_str(&line);
        text.push('\n');
    }
    let mut stdout = std::io::stdout().lock();
    // A closed stdout (`isorun report diff ... | head -1`) is a normal end.
    let _ = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush());
    if findings.is_empty() && !args.json {
        eprintln!("isorun: no changes between {} and {}", args.old.display(), args.new.display());
    }
    let newly_failing = findings.iter().any(|finding| matches!(finding, Finding::NewlyFailing { .. }));
    Ok(if newly_failing { exit_code::SOME_FAILED } else { exit_code::OK })
}

fn merge_command(args: &ReportMergeArgs) -> Result<i32, ReportError> {
    let reports = args
        .reports
        .iter()
        .map(|path| files::read_report(path).map(|report| (path.clone(), report)))
        .collect::<Result<Vec<_>, _>>()?;
    let models = args.models.as_deref().map(merge::read_model_list).transpose()?;
    let merged = merge::merge_with_models(&reports, models.as_ref())?;
    files::write_report_files(&merged, Some(&args.output), args.junit.as_deref(), args.html.as_deref())?;
    Ok(exit_code::OK)
}
