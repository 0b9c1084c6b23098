//! `isorun report diff|merge|table`: reports read back. `table` prints a
//! leaderboard (`isorun-report`'s `table`) and exits 0. `diff` exits 0 when no
//! model newly fails and 1 when one does; `merge` exits 0, except that a
//! merge of data shards (`eval --data-shard`) exits as the unsharded eval
//! would: 1 when some model is not ok. A report that
//! cannot be read (or is not a report of this schema version) is an error,
//! exit 2. The reading, comparing and merging are `isorun-report`'s.

use crate::cli::{ReportCommand, ReportDiffArgs, ReportMergeArgs, ReportTableArgs, TableFormatArg};
use crate::error::CliError;
use crate::support::{lock_given_outputs, with_causes};
use isorun_protocol::exit_code;
use isorun_report::{
    diff, given_shards, merge_data_shards, merge_with_models, missing_shards, read_model_list, read_report,
    write_files, Finding, ReportError, Thresholds,
};
use std::io::Write;

/// Runs the command; `Err` is a usage error (exit 2).
pub fn main(command: &ReportCommand) -> Result<i32, CliError> {
    let result = match command {
        ReportCommand::Diff(args) => diff_command(args),
        ReportCommand::Merge(args) => {
            // Held to the end: two merges into one -o would each write it, the last one's left.
            let _locks = lock_given_outputs(&[
                ("-o", Some(args.output.as_path())),
                ("--junit", args.junit.as_deref()),
                ("--html", args.html.as_deref()),
            ])?;
            merge_command(args)
        }
        ReportCommand::Table(args) => return table_command(args),
    };
    result.map_err(|error| with_causes(&error).into())
}

fn diff_command(args: &ReportDiffArgs) -> Result<i32, ReportError> {
    for (flag, value) in [("--time-ratio", args.time_ratio), ("--memory-ratio", args.memory_ratio)] {
        if !(value.is_finite() && value > 0.0) {
            return Err(ReportError::BadRatio { flag, value });
        }
    }
    let old = read_report(&args.old)?;
    let new = read_report(&args.new)?;
    let findings = diff(&old, &new, Thresholds { time_ratio: args.time_ratio, memory_ratio: args.memory_ratio })?;
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

/// `report table`: the leaderboard on stdout (a closed stdout is a normal end).
fn table_command(args: &ReportTableArgs) -> Result<i32, CliError> {
    let reports = args
        .reports
        .iter()
        .map(|path| read_report(path).map(|report| (path.clone(), report)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| with_causes(&error))?;
    let table = isorun_report::table::table(&reports, args.metric.as_deref(), args.by.as_deref())
        .map_err(|error| error.to_string())?;
    let format = match args.format {
        TableFormatArg::Md => isorun_report::table::TableFormat::Markdown,
        TableFormatArg::Csv => isorun_report::table::TableFormat::Csv,
        TableFormatArg::Jsonl => isorun_report::table::TableFormat::Jsonl,
    };
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(table.render(format).as_bytes()).and_then(|()| stdout.flush());
    Ok(exit_code::OK)
}

fn merge_command(args: &ReportMergeArgs) -> Result<i32, ReportError> {
    let reports = args
        .reports
        .iter()
        .map(|path| read_report(path).map(|report| (path.clone(), report)))
        .collect::<Result<Vec<_>, _>>()?;
    let models = args.models.as_deref().map(read_model_list).transpose()?;
    // Data shards first: each model shard's data shards become one report of it.
    let data = merge_data_shards(&reports)?;
    let (reports, data_missing) = match &data {
        Some(data) => (data.reports.clone(), data.missing.clone()),
        None => (reports, Vec::new()),
    };
    let given = data.as_ref().map_or_else(|| given_shards(&reports), |data| data.given.clone());
    let mut missing = missing_shards(&reports)?;
    missing.extend(data_missing);
    if !missing.is_empty() {
        if models.is_none() && !args.partial {
            return Err(ReportError::MissingShards { missing, given });
        }
        // With --models, the missing shards' models are in the report as not_run.
        eprintln!(
            "isorun: warning: missing {} (merged from {}); the merged report names them in settings.missing_shards",
            missing.join(", "),
            given.join(", ")
        );
    }
    let mut merged = merge_with_models(&reports, models.as_ref())?;
    if data.is_some() {
        merged["settings"]["merged_from"] = serde_json::json!(given);
        if !missing.is_empty() {
            merged["settings"]["missing_shards"] = serde_json::json!(missing);
        }
    }
    write_files(&merged, Some(&args.output), args.junit.as_deref(), args.html.as_deref())?;
    let all_ok = merged["units"].as_array().into_iter().flatten().all(|unit| unit["status"] == "ok");
    Ok(if data.is_some() && !all_ok { exit_code::SOME_FAILED } else { exit_code::OK })
}
