//! `isorun rescore`'s flags: eval's metrics recomputed from saved
//! predictions, or two runs' predictions compared (`--diff`).

use super::shared::{gate_parser, Format};
use clap::Args;
use isorun_report::change::Gate;
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun eval models/ --data val.tfrecord --label y --slice country \\
      --predictions preds/
  isorun rescore preds/ --metric pr_auc --slice country   # one eval skipped
  isorun rescore preds/binary.parquet --threshold 0.7 --report rescored.json
  isorun rescore --diff last-night/ preds/ --output-changed changed.parquet

No worker starts and TensorFlow is never loaded: the files hold everything eval scored.
Settings not given (--metric, --slice, --threshold, --top-k, --from-logits, --output) are the
ones eval used, from each file's description, so `isorun rescore DIR` gives eval's records.")]
pub struct RescoreArgs {
    /// Predictions files (.parquet, .jsonl) or folders of them (eval --predictions DIR). With
    /// --diff: BASELINE then NEW, two files or two folders (matched by model id).
    #[arg(value_name = "DIR_OR_FILE", required = true)]
    pub paths: Vec<PathBuf>,

    /// A metric (repeatable), as eval takes them [default: the ones eval computed].
    #[arg(long = "metric", value_name = "NAME")]
    pub metrics: Vec<String>,

    /// Metrics per value of this feature too (repeatable); only features eval saved (eval --slice
    /// FEATURE) [default: eval's slices].
    #[arg(long = "slice", value_name = "FEATURE")]
    pub slices: Vec<String>,

    /// A number: the binary decision threshold [default: eval's]. METRIC>=X or METRIC<=X: a
    /// bound the model must meet, else it ends below_threshold (repeatable).
    #[arg(long = "threshold", value_name = "X|RULE")]
    pub thresholds: Vec<String>,

    /// An earlier eval (or rescore) --report: --max-drop compares each model's metrics with it.
    #[arg(long, value_name = "REPORT.json")]
    pub baseline: Option<PathBuf>,

    /// METRIC=X (absolute) or METRIC=X% (relative): how much worse than the baseline a metric
    /// may get (repeatable).
    #[arg(long = "max-drop", value_name = "METRIC=X", requires = "baseline")]
    pub max_drops: Vec<String>,

    /// k of top_k_accuracy [default: eval's].
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    pub top_k: Option<u64>,

    /// Equal-width confidence bins of ece [default: eval's].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub calibration_bins: Option<u64>,

    /// Classes up to which the record carries the full confusion matrix [default: eval's, at
    /// most 1000: a classes² matrix is never sized from what a predictions file says].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(2..=20_000))]
    pub max_confusion_classes: Option<u64>,

    /// Confidence intervals at LEVEL (e.g. 0.95), by the same Poisson bootstrap as eval --ci:
    /// each file's examples are weighted by their key or index as eval's were, so the intervals
    /// equal eval's for the same --bootstrap and --bootstrap-seed.
    #[arg(long, value_name = "LEVEL")]
    pub ci: Option<f64>,

    /// Bootstrap replicates for --ci [default: 200].
    #[arg(long, value_name = "N")]
    pub bootstrap: Option<u32>,

    /// The bootstrap generator's seed.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub bootstrap_seed: u64,

    /// always, or significant: a --max-drop breach fails a model only when the change against the
    /// baseline is significant (accuracy with both nights' predictions: McNemar's exact test; else
    /// the paired bootstrap interval excludes 0); a change that cannot be tested stays a breach.
    #[arg(
        long,
        value_name = "always|significant",
        default_value = "always",
        value_parser = gate_parser(),
        hide_possible_values = true
    )]
    pub gate: Gate,

    /// Outputs are logits [default: as eval scored them].
    #[arg(long)]
    pub from_logits: bool,

    /// The output to score: one the file saved (eval --predictions-all saves all) [default: eval's].
    #[arg(long, value_name = "NAME")]
    pub output: Option<String>,

    /// Compare two runs' predictions of the same examples (matched by key when both have one,
    /// else by index): print each example whose prediction changed class (or moved by more than
    /// --tolerance) as a JSON line, then a summary with McNemar's exact p for accuracy.
    #[arg(long, conflicts_with_all = ["metrics", "slices", "thresholds", "baseline", "report", "junit", "html", "ci"])]
    pub diff: bool,

    /// With --diff: also write the changed examples to this Parquet file.
    #[arg(long, value_name = "PATH.parquet", requires = "diff")]
    pub output_changed: Option<PathBuf>,

    /// With --diff: a score that moves by more than X counts as changed too (regression: any
    /// move counts without it).
    #[arg(long, value_name = "X", requires = "diff")]
    pub tolerance: Option<f64>,

    /// Write a JSON report of the records, as eval's --report.
    #[arg(long, value_name = "PATH.json")]
    pub report: Option<PathBuf>,

    /// Also write a JUnit XML file.
    #[arg(long, value_name = "PATH.xml")]
    pub junit: Option<PathBuf>,

    /// Also write a self-contained HTML page.
    #[arg(long, value_name = "PATH.html")]
    pub html: Option<PathBuf>,

    /// Output format on stdout [default: table on a terminal, jsonl otherwise].
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<Format>,

    /// Short for --format jsonl.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
}
