//! `isorun report`'s subcommands and flags: `diff`, `merge` and `table` of
//! run and eval reports.

use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum ReportCommand {
    /// List models that newly fail, newly pass, or got slower or bigger between two reports.
    #[command(after_help = "Examples:
  isorun report diff last-night.json tonight.json
  isorun report diff old.json new.json --time-ratio 1.5 --memory-ratio 1.2 \\
      --json

Slower and bigger apply to models ok in both reports; times under 50 ms count as 50 ms.
Exit codes: 0 no model newly fails; 1 some model passed in OLD.json and does not in NEW.json;
2 a file cannot be read or is not a report of this schema version.")]
    Diff(ReportDiffArgs),
    /// Join the reports of shard runs (`--shard K/N`, `eval --data-shard K/N`) into one, as if it were one run.
    #[command(after_help = "Examples:
  isorun report merge shards/*.json -o report.json --junit report.xml \\
      --html report.html
  # the reports of eval --data-shard 0/3, 1/3 and 2/3, joined:
  isorun report merge eval-0.json eval-1.json eval-2.json -o eval.json

Exit codes: 0 merged; 1 (data shards only) some merged model is not ok, as the unsharded eval;
2 a report cannot be read, or the reports are not shards of one run, or an output (-o, --junit,
--html) another isorun is writing.")]
    Merge(ReportMergeArgs),
    /// A leaderboard of the models of eval reports: sorted by a metric, with intervals, the change
    /// against the baseline and its significance; models whose intervals overlap are tied.
    #[command(after_help = "Examples:
  isorun report table eval.json
  isorun report table eval.json --metric auc --by country
  isorun report table monday.json tuesday.json --format csv > leaderboard.csv

Rows are sorted in the metric's direction (log_loss, mse, ece, brier: lower is better). Ranks come in
groups: the best model not yet placed leads a group with every other model whose interval (\"ci\",
from eval --ci) overlaps its own, shown tied as =R; without intervals only equal values tie. Models
without the metric come last, unranked. A model in several reports is named with its file.
Exit codes: 0 printed; 2 a report cannot be read, or has no such metric or slice.")]
    Table(ReportTableArgs),
}

#[derive(Debug, Args)]
pub struct ReportTableArgs {
    /// Eval reports (isorun eval --report); the rows of all of them.
    #[arg(value_name = "REPORT.json", required = true)]
    pub reports: Vec<PathBuf>,
    /// The metric to rank by [default: the first --metric of the first report, else its first
    /// model's first metric in the order of the --metric list of isorun eval].
    #[arg(long, value_name = "NAME")]
    pub metric: Option<String>,
    /// One row per model and value of this slice feature (eval --slice), ranked within each value.
    #[arg(long, value_name = "FEATURE")]
    pub by: Option<String>,
    /// md: a GitHub Markdown table; csv: with a header line; jsonl: one JSON object per row.
    #[arg(long, value_name = "FORMAT", default_value = "md")]
    pub format: TableFormatArg,
}

/// How `report table` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TableFormatArg {
    /// A GitHub Markdown table.
    Md,
    /// Comma-separated values with a header line.
    Csv,
    /// One JSON object per row.
    Jsonl,
}

#[derive(Debug, Args)]
pub struct ReportDiffArgs {
    /// The earlier report.
    #[arg(value_name = "OLD.json")]
    pub old: PathBuf,
    /// The later report.
    #[arg(value_name = "NEW.json")]
    pub new: PathBuf,
    /// A model "got slower" when its wall time grew by more than this factor.
    #[arg(long, value_name = "RATIO", default_value_t = 1.5)]
    pub time_ratio: f64,
    /// A model "got bigger" when its peak memory grew by more than this factor.
    #[arg(long, value_name = "RATIO", default_value_t = 1.2)]
    pub memory_ratio: f64,
    /// JSON Lines instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReportMergeArgs {
    /// Shard reports to join: of `--shard K/N` runs, of `eval --data-shard K/N` (each model's metric
    /// states merged into exact metrics, then --threshold and --max-drop checked, exit 1 when a
    /// model is not ok, as the unsharded eval), or both. Data shards must be of one evaluation:
    /// the same settings.eval (files, label, metrics, rules), signature, tags and data_digest (the
    /// files' sizes and modification times, --feature, --skip-corrupt); else exit 2, naming it.
    #[arg(value_name = "REPORT.json", required_unless_present = "models")]
    pub reports: Vec<PathBuf>,
    /// Where to write the merged report.
    #[arg(short, long, value_name = "PATH.json")]
    pub output: PathBuf,
    /// Also write a JUnit XML file.
    #[arg(long, value_name = "PATH.xml")]
    pub junit: Option<PathBuf>,
    /// Also write a self-contained HTML page.
    #[arg(long, value_name = "PATH.html")]
    pub html: Option<PathBuf>,
    /// The models the shards were to run (`models.json` of `isorun slurm submit`): a listed model
    /// in no report is added as `not_run` with reason `shard_task_lost`.
    #[arg(long, value_name = "PATH.json")]
    pub models: Option<PathBuf>,
    /// Merge shard reports even when some shards of the run are missing (a warning names them,
    /// and so does the merged report's `settings.missing_shards`); without it that is refused.
    /// A model without every data shard (`eval --data-shard`) is then not_run, never partial metrics.
    #[arg(long)]
    pub partial: bool,
}
