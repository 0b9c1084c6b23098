//! The command line as parsed, before validation (`run.rs` turns it into
//! settings). Flag names are the interface users and scripts rely on.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Run TensorFlow SavedModels in short-lived worker processes, so that the
/// operating system, not TensorFlow, gives the memory back.
#[derive(Debug, Parser)]
#[command(name = "isorun", version, propagate_version = true, after_help = EXAMPLES)]
pub struct Cli {
    /// Say more on stderr (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Say less on stderr: no progress bar, warnings and errors only.
    #[arg(short, long, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

const EXAMPLES: &str = "Examples:
  isorun run models/ --inputs batch.npz     # a JSON line per SavedModel
  isorun run models/ --inputs batch.npz --output-dir out/ -j 2 --timeout 60
  isorun inspect models/resnet              # signatures, inputs and outputs
  isorun ls models/ --json | jq -r .path    # the SavedModels isorun finds
  echo '{\"id\": 1, \"inputs\": {\"x\": [[1, 2, 3, 4]]}}' | isorun pipe models/linear
  isorun doctor                             # what this machine offers isorun";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every model with the same inputs, one JSON line per model on stdout.
    Run(Box<RunArgs>),
    /// Evaluate every model on a labelled dataset: metrics, slices, thresholds, a baseline.
    Eval(Box<EvalArgs>),
    /// Show a SavedModel's meta graphs, signatures, inputs and outputs, or a .keras, .h5 or .onnx file's (no TensorFlow needed).
    Inspect(InspectArgs),
    /// List the models found under folders (SavedModels, .keras, .h5, .onnx), one per line as `id<TAB>path<TAB>format`.
    Ls(LsArgs),
    /// Keep one model in a worker and answer JSON Lines requests from stdin.
    Pipe(PipeArgs),
    /// Call a Python function on each item, each call in a fresh process forked from a warm zygote.
    Map(Box<MapArgs>),
    /// Say what this machine offers isorun; exit 1 if it cannot run models here.
    Doctor(DoctorArgs),
    /// The Keras export cache: list its SavedModels, or clear it.
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Recompute eval's metrics from saved predictions (eval --predictions), without TensorFlow; --diff compares two runs example by example.
    Rescore(Box<RescoreArgs>),
    /// Compare or merge run reports (`--report` files).
    #[command(subcommand)]
    Report(ReportCommand),
    /// Run on a Slurm cluster: one array task per shard, then a job that merges their reports.
    #[command(subcommand)]
    Slurm(SlurmCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Print a man page (roff) on stdout: isorun's, or a command's (`isorun man run`); --out-dir installs them all.
    Man(ManArgs),
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun man run | man -l -
  isorun man --out-dir ~/.local/share/man/man1   # isorun.1, isorun-run.1, ...")]
pub struct ManArgs {
    /// The command whose page to print (`run`, `report diff`) [default: isorun's own].
    #[arg(value_name = "COMMAND")]
    pub command: Vec<String>,

    /// Write the pages into DIR as files (every page, or COMMAND's), and print their paths.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun inspect models/resnet
  isorun inspect models/resnet --json | jq '.signatures.serving_default.inputs'")]
pub struct InspectArgs {
    /// A SavedModel folder, a .keras / full-model .h5 file, or an .onnx file (read without TensorFlow).
    #[arg(value_name = "MODEL")]
    pub model: PathBuf,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,

    /// Also show TensorFlow's internal signatures (`__saved_model_init_op`).
    #[arg(long)]
    pub all: bool,

    /// Tag set whose signatures are the top-level `signatures` in JSON (repeat for several tags).
    #[arg(long = "tag", value_name = "TAG", default_values_t = vec!["serve".to_string()])]
    pub tags: Vec<String>,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun ls models/
  isorun ls models/ --json | jq -r .path | head -3
  isorun ls serving/ --latest-version")]
pub struct LsArgs {
    /// Folders to search (recursively) for SavedModels and Keras files.
    #[arg(value_name = "DIR", required = true)]
    pub dirs: Vec<PathBuf>,

    /// JSON Lines (`{"id": ..., "path": ..., "format": ...}`) instead of `id<TAB>path<TAB>format`.
    #[arg(long)]
    pub json: bool,

    /// With TensorFlow Serving's layout (model/1, model/2), keep only the highest version of each model.
    #[arg(long)]
    pub latest_version: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  printf '%s\\n' '{\"id\": 1, \"inputs\": {\"x\": [[1, 2, 3, 4]]}}' \\
      | isorun pipe models/linear

Exit codes: 0 end of input (or a closed stdout); 1 --max-restarts reached, or stdin unreadable;
2 usage error (the model cannot load; nothing read); 130/143 interrupted by Ctrl-C/SIGTERM,
even while waiting for a line (the worker is stopped first).")]
pub struct PipeArgs {
    /// The SavedModel folder to serve.
    #[arg(value_name = "MODEL")]
    pub model: PathBuf,

    /// Signature to run.
    #[arg(long, value_name = "KEY", default_value = "serving_default")]
    pub signature: String,

    /// Tag of the meta graph to load (repeat for a tag set).
    #[arg(long = "tag", value_name = "TAG", default_values_t = vec!["serve".to_string()])]
    pub tags: Vec<String>,

    /// Start a fresh worker after this many requests [default: never].
    #[arg(long, value_name = "N")]
    pub recycle_after: Option<u64>,

    /// Start a fresh worker when the worker's resident memory passes SIZE (e.g. 2G, 512M).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub recycle_rss: Option<u64>,

    /// Give up after this many worker crashes in a row.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub max_restarts: u32,

    /// Run up to N request lines that are already waiting as one batch (concatenated along the first
    /// dimension; each answer holds only its own rows). Requests that cannot be batched (other inputs or
    /// shapes, a signature with a fixed batch size, an output without a row per input row) run one by one.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_batch: u32,

    /// With --max-batch: how long to wait for more lines after the first, in microseconds [default: 0, only
    /// lines already waiting].
    #[arg(long, value_name = "MICROS", default_value_t = 0)]
    pub batch_wait: u64,

    /// Run each request's ops on the worker's serving thread instead of handing them to TensorFlow's inter-op
    /// pool (`inter_op_parallelism_threads` = -1; ops still use the intra-op pool). Spares a thread hand-off per
    /// request: 5x the requests/s on a tiny model here (BENCHMARKS.md). `false` for models with parallel branches.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub ops_on_caller_thread: bool,

    /// After an answer, the worker polls for the next request, and after a request the supervisor polls for
    /// its answer, this many microseconds before sleeping: a sleeping process's wake-up is most of a tiny
    /// request's cost here (BENCHMARKS.md). 0 sleeps at once (no CPU spent waiting).
    #[arg(long, value_name = "MICROS", default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub spin_us: u32,

    /// Limit on each request, in seconds [default: none].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub timeout: Option<f64>,

    /// Confine the worker (Landlock, no signals out, no UNIX sockets, no network, no new privileges, clean environment).
    #[arg(long, value_enum, value_name = "MODE", default_value = "strict", env = "ISORUN_SANDBOX")]
    pub sandbox: SandboxMode,

    /// How workers start: `auto` and `zygote` exec the first and fork every later one (after a crash or a
    /// recycle) from a zygote; `exec` execs each.
    #[arg(long, value_enum, value_name = "MODE", default_value = "auto", env = "ISORUN_SPAWN")]
    pub spawn: SpawnMode,

    #[command(flatten)]
    pub worker: WorkerArgs,

    #[command(flatten)]
    pub keras: KerasArgs,
}

/// Where the worker and libtensorflow are.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The worker binary [default: isorun-worker next to isorun].
    #[arg(long, value_name = "PATH", env = "ISORUN_WORKER", help_heading = "Workers")]
    pub worker: Option<PathBuf>,

    /// Extra argument for the worker binary (for test workers; repeatable).
    #[arg(long, value_name = "ARG", hide = true, allow_hyphen_values = true)]
    pub worker_arg: Vec<String>,

    /// Folder holding libtensorflow [default: the cache of scripts/fetch-libtensorflow].
    #[arg(long, value_name = "DIR", env = "ISORUN_LIBTENSORFLOW_DIR", help_heading = "Workers")]
    pub libtensorflow_dir: Option<PathBuf>,
}

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

/// How far workers are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SandboxMode {
    /// Everything the kernel allows (a one-line warning names what it does not).
    Strict,
    /// No confinement: the model can do what the user can.
    Off,
}

/// How workers are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpawnMode {
    /// Exec when there are no more models than slots, else exec each slot's first worker while its
    /// zygote starts and fork the rest: the first result as fast as exec, the rest as fast as fork.
    Auto,
    /// Fork each worker from a per-slot zygote (falls back to exec where that fails).
    Zygote,
    /// Exec a fresh worker process for each unit.
    Exec,
}

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
    #[arg(long, value_name = "always|significant", default_value = "always")]
    pub gate: String,

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

/// How `run` prints its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
    /// A readable table.
    Table,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub worker: WorkerArgs,

    /// The Python to check for Keras files (default: python3 on PATH).
    #[arg(long, value_name = "PATH", env = "ISORUN_PYTHON")]
    pub python: Option<PathBuf>,

    /// One JSON object instead of text: `{"can_run_models", "checks": [{"name", "status", "detail"}]}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun run models/ --inputs batch.npz
  isorun run models/resnet --input images=images.npy --output-dir out/ --values
  isorun run models/ --inputs batch.npz -j 2 --timeout 60 --json \\
      | jq -r 'select(.status != \"ok\") | .model'
  isorun run models/linear --input 'x=@[[1, 2, 3, 4]]' --values
  isorun run exports/ --warmup-inputs   # each export on its TF Serving warm-up

Exit codes: 0 every model ok; 1 some model not ok; 2 usage error (nothing run),
or an output (--report, --junit, --html, --journal, --output-dir) another
isorun is writing; 130/143 interrupted by Ctrl-C/SIGTERM. A closed stdout ends
the run with 0.")]
pub struct RunArgs {
    // Only run's: inputs given directly, and what it keeps of or checks in the outputs.
    #[command(flatten)]
    pub given: RunInputArgs,

    // The flags eval takes too; `args.jobs` reaches them through `Deref`.
    #[command(flatten)]
    pub shared: SharedRunArgs,

    #[command(flatten)]
    pub golden: ExpectArgs,
}

impl std::ops::Deref for RunArgs {
    type Target = SharedRunArgs;

    fn deref(&self) -> &SharedRunArgs {
        &self.shared
    }
}

/// `run`'s flags that `eval` does not take (its inputs come from `--data`): inputs given
/// directly, dtype strictness, output values in the records.
#[derive(Debug, Args)]
pub struct RunInputArgs {
    /// An input: NAME=PATH.npy, NAME=PATH.json (a nested list) or NAME=@JSON inline (repeatable).
    #[arg(long = "input", value_name = "NAME=PATH", help_heading = "Inputs")]
    pub input: Vec<String>,

    /// Inputs keyed by input name: an .npz, a .json object (or one bare nested list for a
    /// one-input signature), or - for such JSON on stdin (repeatable).
    #[arg(long = "inputs", value_name = "FILE", help_heading = "Inputs")]
    pub inputs: Vec<PathBuf>,

    /// Per-model inputs: DIR/<model id>/<input name>.npy (or .json), used before the shared ones.
    #[arg(long, value_name = "DIR", help_heading = "Inputs")]
    pub inputs_dir: Option<PathBuf>,

    /// Run each SavedModel on its own TF Serving warm-up requests
    /// (assets.extra/tf_serving_warmup_requests): one record per model, ok when every request ran, a model
    /// without the file an error. A request runs the signature it names, else --signature; classify and
    /// regress requests feed their tf.Examples to a signature's one string input.
    #[arg(
        long,
        conflicts_with_all = ["input", "inputs", "inputs_dir", "batch_size", "expect"],
        help_heading = "Inputs"
    )]
    pub warmup_inputs: bool,

    /// With --warmup-inputs: only the first N requests of each model's file.
    #[arg(
        long,
        value_name = "N",
        requires = "warmup_inputs",
        value_parser = clap::value_parser!(u64).range(1..),
        help_heading = "Inputs"
    )]
    pub warmup_limit: Option<u64>,

    /// Refuse an input whose dtype is not the signature's; by default float64 becomes float32,
    /// integers become narrower integers or floats where every value fits exactly (records say `cast`).
    #[arg(long, help_heading = "Inputs")]
    pub strict_dtypes: bool,

    /// Include output values in the JSON lines.
    #[arg(long, help_heading = "Outputs")]
    pub values: bool,
}

/// `--expect`: golden outputs `run` compares with (not `eval`'s).
#[derive(Debug, Args)]
pub struct ExpectArgs {
    /// Golden outputs (the layout --output-dir writes): a differing result is status `mismatch`.
    #[arg(long, value_name = "DIR", help_heading = "Nightly")]
    pub expect: Option<PathBuf>,

    /// Relative tolerance for --expect.
    #[arg(long, value_name = "X", default_value_t = 1e-5, help_heading = "Nightly")]
    pub rtol: f64,

    /// Absolute tolerance for --expect.
    #[arg(long, value_name = "X", default_value_t = 1e-8, help_heading = "Nightly")]
    pub atol: f64,
}

/// What `run` and `eval` share: the models, how workers run them, limits, outputs and reports.
#[derive(Debug, Args)]
pub struct SharedRunArgs {
    /// SavedModel folders, .keras or .h5 files, or folders searched recursively for them.
    #[arg(value_name = "MODEL", required = true)]
    pub models: Vec<PathBuf>,

    /// Split inputs along their first dimension into runs of at most N rows; outputs are joined back
    /// (eval: examples per batch [default: 256]).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Inputs")]
    pub batch_size: Option<u64>,

    /// Load a custom-op library (.so) into each worker before the model (repeatable).
    #[arg(long, value_name = "PATH.so", help_heading = "Inputs")]
    pub load_library: Vec<PathBuf>,

    /// Signature to run.
    #[arg(long, value_name = "KEY", default_value = "serving_default", help_heading = "Inputs")]
    pub signature: String,

    /// Tag of the meta graph to load (repeat for a tag set).
    #[arg(long = "tag", value_name = "TAG", default_values_t = vec!["serve".to_string()], help_heading = "Inputs")]
    pub tags: Vec<String>,

    /// Write each output to DIR/<model id>/<output name>.npy.
    #[arg(long, value_name = "DIR", help_heading = "Outputs")]
    pub output_dir: Option<PathBuf>,

    /// With JSON Lines on stdout, print the table and the totals line on stderr when done (a table
    /// on a terminal, or --format table, ends with the totals line anyway).
    #[arg(long, help_heading = "Outputs")]
    pub summary: bool,

    /// Output format on stdout [default: table on a terminal, jsonl otherwise].
    #[arg(long, value_enum, value_name = "FORMAT", help_heading = "Outputs")]
    pub format: Option<Format>,

    /// Short for --format jsonl.
    #[arg(long, conflicts_with = "format", help_heading = "Outputs")]
    pub json: bool,

    /// With TensorFlow Serving's layout (model/1, model/2), run only the highest version of each model.
    #[arg(long, help_heading = "Inputs")]
    pub latest_version: bool,

    /// Workers running at once [default: number of CPUs].
    #[arg(short, long, value_name = "N", env = "ISORUN_JOBS", help_heading = "Workers")]
    pub jobs: Option<usize>,

    /// How workers start: forked from a zygote that has loaded libtensorflow once (fast), or exec'd.
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        default_value = "auto",
        env = "ISORUN_SPAWN",
        help_heading = "Workers"
    )]
    pub spawn: SpawnMode,

    /// Confine each worker (Landlock, no signals out, no UNIX sockets, no network, no new privileges, clean environment) before it loads a model.
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        default_value = "strict",
        env = "ISORUN_SANDBOX",
        help_heading = "Workers"
    )]
    pub sandbox: SandboxMode,

    /// Let sandboxed workers write core dumps.
    #[arg(long, help_heading = "Workers")]
    pub core_dumps: bool,

    /// Models each worker runs before it exits and a fresh one starts.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Workers")]
    pub models_per_worker: u64,

    /// Warm spare workers per slot: forked from the zygote for the next models in line, sandboxed for them and warmed up (TensorFlow's first-use set-up, on a built-in model) while the current one runs; 0 turns them off [default: 2 while the slots leave a CPU idle, else 0].
    #[arg(long, value_name = "N", env = "ISORUN_SPARES", help_heading = "Workers")]
    pub spares: Option<usize>,

    /// Limit on each model, start to end, in seconds [default: none].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "ISORUN_TIMEOUT",
        allow_negative_numbers = true,
        help_heading = "Workers"
    )]
    pub timeout: Option<f64>,

    /// Limit on starting a worker and loading a model, in seconds [default: none].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true, help_heading = "Workers")]
    pub load_timeout: Option<f64>,

    /// Limit on each batch once the model is loaded (eval's batches, run's --batch-size chunks), in seconds [default: none].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true, help_heading = "Workers")]
    pub batch_timeout: Option<f64>,

    /// Limit on a worker's start, until it says hello, in seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 60.0,
        allow_negative_numbers = true,
        help_heading = "Workers"
    )]
    pub start_timeout: f64,

    /// TensorFlow intra-op threads per worker [default: CPUs / jobs].
    #[arg(long, value_name = "N", help_heading = "Workers")]
    pub intra_op_threads: Option<u32>,

    /// TensorFlow inter-op threads per worker [default: CPUs / jobs].
    #[arg(long, value_name = "N", help_heading = "Workers")]
    pub inter_op_threads: Option<u32>,

    /// GPUs for the workers: indexes as nvidia-smi shows them, or UUIDs, comma-separated (0,1), or
    /// `all` (needs NVML). Each worker slot is bound to one device, slot i to device i mod n; with
    /// no --gpus, workers see no GPU unless CUDA_VISIBLE_DEVICES says otherwise.
    #[arg(long, value_name = "LIST", value_parser = isorun_engine::gpus::parse_gpus, help_heading = "GPUs")]
    pub gpus: Option<isorun_engine::gpus::GpuList>,

    /// Worker slots per GPU: -j defaults to (number of --gpus) × N.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        requires = "gpus",
        value_parser = clap::value_parser!(u64).range(1..=64),
        help_heading = "GPUs"
    )]
    pub workers_per_gpu: u64,

    /// Let TensorFlow take this share of each visible GPU's memory up front (0 < F <= 1), instead
    /// of growing as needed (the default).
    #[arg(long, value_name = "F", help_heading = "GPUs")]
    pub gpu_memory_fraction: Option<f64>,

    /// Stop a worker whose private memory (RssAnon + RssShmem) passes SIZE (e.g. 2G, 512M; a bare number is bytes, at least 16 MiB).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_memory_limit, help_heading = "Nightly")]
    pub memory_limit: Option<u64>,

    /// Run a unit again up to N times when it crashes, times out, hits the memory limit, breaks the protocol or cannot start.
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Nightly")]
    pub retries: u32,

    /// Statuses that are retried (comma-separated).
    #[arg(
        long,
        value_name = "STATUSES",
        value_delimiter = ',',
        default_value = "crashed,timeout,memory_limit,protocol_error,spawn_failed",
        help_heading = "Nightly"
    )]
    pub retry_on: Vec<String>,

    /// Append one JSON line per finished unit to PATH (fsynced), for --resume.
    #[arg(long, value_name = "PATH", help_heading = "Nightly")]
    pub journal: Option<PathBuf>,

    /// Skip units already in the journal with the same model, inputs and settings.
    #[arg(long, requires = "journal", help_heading = "Nightly")]
    pub resume: bool,

    /// Write a JSON report of the whole run.
    #[arg(long, value_name = "PATH.json", help_heading = "Nightly")]
    pub report: Option<PathBuf>,

    /// Write a JUnit XML report (one test case per model).
    #[arg(long, value_name = "PATH.xml", help_heading = "Nightly")]
    pub junit: Option<PathBuf>,

    /// Write a self-contained HTML report.
    #[arg(long, value_name = "PATH.html", help_heading = "Nightly")]
    pub html: Option<PathBuf>,

    /// Run only shard K of N (K from 0), chosen by a stable hash of each model id.
    #[arg(long, value_name = "K/N", value_parser = isorun_report::shard::parse_shard, help_heading = "Nightly")]
    pub shard: Option<isorun_report::shard::Shard>,

    /// Statuses that make the exit code 1 (comma-separated) [default: every status but ok].
    #[arg(long, value_name = "STATUSES", value_delimiter = ',', help_heading = "Nightly")]
    pub fail_on: Vec<String>,

    /// Stop starting models after N failures (the rest are `not_run`).
    #[arg(long, value_name = "N", help_heading = "Nightly")]
    pub max_failures: Option<u64>,

    /// Read settings from a TOML file; flags on the command line override it.
    #[arg(long, value_name = "PATH.toml", help_heading = "Nightly")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub worker: WorkerArgs,

    #[command(flatten)]
    pub keras: KerasArgs,
}

/// How `.keras` and `.h5` model files are exported to SavedModels before they run.
#[derive(Debug, Args, Clone, Default)]
pub struct KerasArgs {
    /// Python with Keras 3 and TensorFlow that exports Keras files (default: python3 on PATH).
    #[arg(long, value_name = "PATH", env = "ISORUN_PYTHON", help_heading = "Keras files")]
    pub python: Option<PathBuf>,

    /// A Python file defining the model's custom layers, imported before it loads (repeatable; runs sandboxed).
    #[arg(long = "keras-module", value_name = "FILE.py", help_heading = "Keras files")]
    pub keras_modules: Vec<PathBuf>,

    /// Load with safe_mode=False: runs the Python code a Lambda layer holds, inside the export sandbox.
    #[arg(long, help_heading = "Keras files")]
    pub keras_unsafe: bool,

    /// The export cache (default: ~/.cache/isorun/keras).
    #[arg(long, value_name = "DIR", env = "ISORUN_KERAS_CACHE", help_heading = "Keras files")]
    pub keras_cache: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// One line per export: key, format, size, source file.
    Ls(CacheArgs),
    /// Remove every export (they are made again when needed).
    Clear(CacheArgs),
}

#[derive(Debug, Args)]
pub struct CacheArgs {
    /// The export cache (default: ~/.cache/isorun/keras).
    #[arg(long, value_name = "DIR", env = "ISORUN_KERAS_CACHE")]
    pub keras_cache: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum SlurmCommand {
    /// Write a job-array script (one task per shard) and a merge script into DIR, and submit both.
    #[command(after_help = "Examples:
  isorun slurm submit --shards 4 --out nightly/ \\
      -- models/ --inputs inputs.npz --timeout 300
  isorun slurm submit --shards 4 --partition gpu --gpus-per-task 1 \\
      --time 04:00:00 --out nightly/ \\
      -- models/ --inputs inputs.npz --retries 2 --memory-limit 8G
  isorun slurm submit --shards 4 --out nightly/ --dry-run \\
      -- models/ --inputs inputs.npz
  isorun slurm submit --shards 2 --data-shards 8 --out eval-night/ \\
      eval models/ --data 'test/*.tfrecord' --label label \\
      --threshold 'auc>=0.9'

Everything after `--` (or from the first argument submit does not know) is `isorun run`'s,
or, when its first word is `eval`, `isorun eval`'s, checked here as that command would check
it (eval's data opened, its first example read); relative paths are made absolute. With
--data-shards D the array has N × D tasks, task T running `isorun eval --shard $((T / D))/N
--data-shard $((T % D))/D`, and the merge job merges the data shards into exact metrics.
Submit sets --shard, --data-shard, --journal, --resume, --report and --json of each task itself.
Task K writes DIR/shards/K.json (report), K.jsonl (JSON lines) and K.journal.jsonl (journal);
the merge job, started after every task has ended (afterany), writes DIR/report.json, .xml and .html, with
the models of a lost task as not_run (shard_task_lost). Submitting again with the same DIR
resumes: models a task finished before are not run again.
Exit codes: 0 submitted (or printed); 1 sbatch failed; 2 usage error (nothing written).")]
    Submit(SlurmSubmitArgs),
}

#[derive(Debug, Args)]
pub struct SlurmSubmitArgs {
    /// Model shards: task K runs `isorun run --shard K/N` (with --data-shards D, N × D tasks).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub shards: u64,

    /// With `eval`: split the data of each model shard into D shards too (`eval --data-shard`); the
    /// array has N × D tasks, task T running model shard T / D on data shard T % D, and the merge job
    /// merges each model's D metric states into exact metrics, then checks --threshold/--max-drop.
    #[arg(long, value_name = "D", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub data_shards: Option<u64>,

    /// Folder for the scripts, models.json, the shards' journals and reports, and the merged report.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,

    /// Partition of both jobs [default: the cluster's default].
    #[arg(long, value_name = "NAME", help_heading = "Slurm")]
    pub partition: Option<String>,

    /// Time limit of each array task (Slurm's formats: MINUTES, HH:MM:SS, D-HH:MM:SS).
    #[arg(long, value_name = "TIME", help_heading = "Slurm")]
    pub time: Option<String>,

    /// CPUs per array task; `isorun run -j` defaults to it.
    #[arg(long, value_name = "C", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Slurm")]
    pub cpus_per_task: Option<u32>,

    /// Memory of each array task (sbatch's --mem: 16G, 4000M).
    #[arg(long, value_name = "SIZE", help_heading = "Slurm")]
    pub mem: Option<String>,

    /// GPUs per array task.
    #[arg(long, value_name = "G", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Slurm")]
    pub gpus_per_task: Option<u32>,

    /// Name of the array job; the merge job is NAME-merge.
    #[arg(long, value_name = "NAME", default_value = "isorun", help_heading = "Slurm")]
    pub job_name: String,

    /// Another `#SBATCH` option for both jobs, e.g. --sbatch-arg=--account=ml (repeatable).
    #[arg(long, value_name = "OPTION", allow_hyphen_values = true, help_heading = "Slurm")]
    pub sbatch_arg: Vec<String>,

    /// Print the scripts and the sbatch commands instead of writing and submitting them.
    #[arg(long)]
    pub dry_run: bool,

    /// The arguments of `isorun run`: models and run options; or `eval` and the arguments of `isorun eval`.
    #[arg(value_name = "RUN ARGS", required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub run_args: Vec<std::ffi::OsString>,
}

/// `isorun eval`: `run`'s models, workers, limits and reports, fed a labelled dataset.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun eval models/ --data test.tfrecord --label label
  isorun eval models/ --data 'shards/*.tfrecord.gz' --label label \\
      --metric accuracy --metric auc --slice country
  isorun eval models/ --data test.npz --label y --threshold 'accuracy>=0.9' \\
      --report eval.json
  isorun eval models/ --data pets.parquet --label kind --label-classes cat,dog
  isorun eval models/ --data test.jsonl.gz --label label --slice country
  isorun eval models/ --data examples.txt --data-format jsonl --label label
  isorun eval models/ --data test.tfrecord --label label \\
      --baseline last-night.json --max-drop accuracy=1%
  isorun eval models/ --data test.tfrecord --label label --ci 0.95 \\
      --baseline last-night.json --max-drop accuracy=1% --gate significant

Each record is run's, plus \"examples\", \"metrics\" (and \"slices\", \"task\",
\"output\"). A metric below a --threshold bound or dropped past --max-drop ends
the model below_threshold (with --gate significant: only a significant drop;
see README \"Is the drop real?\").
Exit codes: 0 every model ok; 1 some model not ok; 2 usage error (nothing run),
or an output (--report, --junit, --html, --journal, --output-dir, --predictions)
another isorun is writing; 130/143 interrupted by Ctrl-C/SIGTERM.")]
pub struct EvalArgs {
    #[command(flatten)]
    pub eval: EvalOptions,

    // run's flags but its inputs (`RunInputArgs`) and --expect: not even parsed here.
    #[command(flatten)]
    pub run: SharedRunArgs,
}

/// What `eval` adds to `run`'s flags.
#[derive(Debug, Args)]
pub struct EvalOptions {
    /// The dataset: TFRecord files of tf.Example (.tfrecord, .tfrecords, .gz), .npz files, CSV,
    /// Parquet (.parquet), Arrow IPC (.arrow, .feather: what Hugging Face datasets writes), JSON
    /// Lines (.jsonl, .ndjson, .jsonl.gz: one object per line), folders of them or of NAME.npy
    /// arrays, or globs (repeatable; read in order).
    #[arg(long, value_name = "PATH", required = true, help_heading = "Evaluation")]
    pub data: Vec<PathBuf>,

    /// Read the --data files named (or matched by a glob) as this format whatever their names
    /// say: tfrecord, tfrecord-gzip, npz, npy-folder, csv, parquet, arrow (Arrow IPC, Feather),
    /// jsonl, jsonl-gzip (a folder's files are still chosen by their endings).
    #[arg(long, value_name = "NAME", help_heading = "Evaluation")]
    pub data_format: Option<String>,

    /// The label: a tf.Example feature, an array name (.npz, .npy), or a table column (CSV,
    /// Parquet, Arrow) or key (JSON Lines). It never goes to the model.
    #[arg(long, value_name = "KEY", required = true, help_heading = "Evaluation")]
    pub label: String,

    /// Class names of a string label, in class index order (cat,dog,bird: cat is class 0): a
    /// label that is not one of them is an error naming the file, the row and the value.
    #[arg(long, value_name = "NAME,NAME,...", value_delimiter = ',', help_heading = "Evaluation")]
    pub label_classes: Option<Vec<String>>,

    /// A per-example weight (a feature, array, column or key, as --label), as scikit-learn's
    /// sample_weight.
    #[arg(long, value_name = "KEY", help_heading = "Evaluation")]
    pub weight: Option<String>,

    /// A metric (repeatable): accuracy, top_k_accuracy, auc, pr_auc, log_loss, precision, recall,
    /// f1, ece, brier, mse, mae, rmse, r2, mean_prediction, mean_label, calibration [default:
    /// chosen from the task].
    #[arg(long = "metric", value_name = "NAME", help_heading = "Evaluation")]
    pub metrics: Vec<String>,

    /// The output to score [default: the signature's only output].
    #[arg(long, value_name = "NAME", help_heading = "Evaluation")]
    pub output: Option<String>,

    /// Metrics per value of this feature too (repeatable).
    #[arg(long = "slice", value_name = "FEATURE", help_heading = "Evaluation")]
    pub slices: Vec<String>,

    /// A feature that names each example (an id): bootstrap weights (--ci) are drawn from it and
    /// predictions are matched by it [default: the example's index in the data].
    #[arg(long, value_name = "FEATURE", help_heading = "Evaluation")]
    pub example_key: Option<String>,

    /// Write each model's per-example predictions to DIR/<model id>.parquet (one row per
    /// example: index, key, label, weight, slice:<feature>, output:<name>), written batch by
    /// batch and put in place only when the model went through every batch; `isorun rescore`
    /// recomputes metrics from them without TensorFlow.
    #[arg(long, value_name = "DIR", help_heading = "Evaluation")]
    pub predictions: Option<PathBuf>,

    /// The predictions' format: parquet, or jsonl (one object per line; its description in
    /// <file>.isorun.json beside it).
    #[arg(long, value_name = "FORMAT", default_value = "parquet", value_parser = ["parquet", "jsonl"], requires = "predictions", help_heading = "Evaluation")]
    pub predictions_format: String,

    /// Save every output in the predictions, not only the scored one.
    #[arg(long, requires = "predictions", help_heading = "Evaluation")]
    pub predictions_all: bool,

    /// Feed the signature input INPUT from the feature FEATURE (repeatable).
    #[arg(long = "feature", value_name = "INPUT=FEATURE", help_heading = "Evaluation")]
    pub features: Vec<String>,

    /// Evaluate the first N examples only.
    #[arg(long, value_name = "N", help_heading = "Evaluation")]
    pub limit: Option<u64>,

    /// Evaluate shard K of N of the data only (whole files round-robin when there are at least N,
    /// else ranges of records), for one machine of N. Each record then carries the model's
    /// metric_state and the shard's partial_metrics; --threshold and --max-drop are not checked on
    /// a shard but by `isorun report merge`, which joins the N reports into exact metrics.
    #[arg(long, value_name = "K/N", help_heading = "Evaluation")]
    pub data_shard: Option<String>,

    /// Skip corrupt TFRecord records (counted) instead of ending the model with an error.
    #[arg(long, help_heading = "Evaluation")]
    pub skip_corrupt: bool,

    /// k of top_k_accuracy.
    #[arg(long, value_name = "K", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Evaluation")]
    pub top_k: u64,

    /// Equal-width confidence bins of ece (bin b holds confidences in (b/N, (b+1)/N], the first
    /// [0, 1/N]) and of the record's reliability diagram ("calibration").
    #[arg(long, value_name = "N", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=10_000), help_heading = "Evaluation")]
    pub calibration_bins: u64,

    /// Classes up to which the record carries the full confusion matrix; past them, the top
    /// confusions ("top_confusions", from a bounded summary: "top_confusions_exact" says whether
    /// its counts are exact).
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(2..=20_000), help_heading = "Evaluation")]
    pub max_confusion_classes: u64,

    /// Outputs are logits: sigmoid (binary) or softmax (multiclass) before probabilities.
    #[arg(long, help_heading = "Evaluation")]
    pub from_logits: bool,

    /// A number: the binary decision threshold [default: 0.5]. METRIC>=X or METRIC<=X: a bound
    /// the model must meet, else it ends below_threshold (repeatable).
    #[arg(long = "threshold", value_name = "X|RULE", help_heading = "Evaluation")]
    pub thresholds: Vec<String>,

    /// An earlier eval --report: --max-drop compares each model's metrics with it.
    #[arg(long, value_name = "REPORT.json", help_heading = "Evaluation")]
    pub baseline: Option<PathBuf>,

    /// METRIC=X (absolute) or METRIC=X% (relative): how much worse than the baseline a metric
    /// may get, in its own direction (repeatable).
    #[arg(long = "max-drop", value_name = "METRIC=X", requires = "baseline", help_heading = "Evaluation")]
    pub max_drops: Vec<String>,

    /// Add a LEVEL (e.g. 0.95) confidence interval to every metric, overall and per slice: a Poisson
    /// bootstrap in the same pass (each example weighted Poisson(1) per replicate, drawn from its
    /// --example-key or index, the same in every model and run). Records get "ci", "ci_level",
    /// "bootstrap" and "bootstrap_values" (what a later --baseline pairs with).
    #[arg(long, value_name = "LEVEL", help_heading = "Evaluation")]
    pub ci: Option<f64>,

    /// Bootstrap replicates for --ci [default: 200]; each is one more metric state in memory.
    #[arg(long, value_name = "N", help_heading = "Evaluation")]
    pub bootstrap: Option<u32>,

    /// The bootstrap generator's seed: the same seed, the same weights for the same examples.
    #[arg(long, value_name = "S", default_value_t = 0, help_heading = "Evaluation")]
    pub bootstrap_seed: u64,

    /// When a --max-drop breach fails a model: always (the drop alone), or significant (the drop
    /// AND a significant change: accuracy with both nights' --predictions by McNemar's exact test,
    /// else a paired bootstrap interval that excludes 0; a change that cannot be tested stays a
    /// breach). Needs --ci and a --baseline evaluated with the same --ci replicates and seed, or
    /// with --predictions.
    #[arg(long, value_name = "always|significant", default_value = "always", help_heading = "Evaluation")]
    pub gate: String,
}

/// The message for one of `run`'s own flags given to `eval` (`--rtol`, `--inputs`), which clap
/// refuses with the tip "to pass '--rtol' as a value, use '-- --rtol'": that would make it a
/// model path. `None` for every other error, which clap renders.
pub fn run_flag_given_to_eval(error: &clap::Error, args: &[std::ffi::OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use clap::CommandFactory;
    if error.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    // The command is the first word after the program's own flags (`-v`, `-q`).
    let command = args.iter().skip(1).map(|a| a.to_string_lossy()).find(|a| !a.starts_with('-'))?;
    if command != "eval" {
        return None;
    }
    let Some(ContextValue::String(given)) = error.get(ContextKind::InvalidArg) else { return None };
    let flag = given.split('=').next().unwrap_or(given);
    let root = Cli::command();
    let longs = |name: &str| -> Vec<String> {
        let command = root.find_subcommand(name).into_iter();
        command.flat_map(|c| c.get_arguments()).filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect()
    };
    if !longs("run").iter().any(|l| l == flag) || longs("eval").iter().any(|l| l == flag) {
        return None;
    }
    let with = match flag {
        "--rtol" | "--atol" => " (with --expect)",
        "--input" | "--inputs" | "--inputs-dir" => "; eval reads its examples from --data",
        _ => "",
    };
    Some(format!("eval takes no {flag}: it is run's{with}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every command, `isorun` first, with its words (`report diff`).
    fn commands() -> Vec<(String, clap::Command)> {
        fn collect(prefix: &str, command: &clap::Command, all: &mut Vec<(String, clap::Command)>) {
            for sub in command.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
                let name = format!("{prefix} {}", sub.get_name());
                all.push((name.clone(), sub.clone()));
                collect(&name, sub, all);
            }
        }
        let mut root = Cli::command();
        root.build();
        let mut all = vec![("isorun".to_string(), root.clone())];
        collect("isorun", &root, &mut all);
        all
    }

    /// Help wraps at the terminal's width; an example as long as 80 columns would wrap inside
    /// its command on an 80-column terminal, so each is a line of fewer (continued with `\`).
    #[test]
    fn examples_fit_80_columns() {
        let mut examples = 0;
        for (name, command) in commands() {
            let Some(after) = command.get_after_help().map(ToString::to_string) else { continue };
            let Some((_, block)) = after.split_once("Examples:\n") else { continue };
            for line in block.lines().take_while(|l| !l.trim().is_empty()) {
                examples += 1;
                assert!(line.starts_with("  "), "{name}: an example not indented as one: {line:?}");
                assert!(line.chars().count() < 80, "{name}: an example wider than 79 columns: {line:?}");
            }
        }
        assert!(examples > 30, "{examples} example lines");
    }

    /// `--data-format` names every format `isorun-eval` reads.
    #[test]
    fn data_format_help_names_every_format() {
        let eval = Cli::command().find_subcommand("eval").expect("eval").clone();
        let arg = eval.get_arguments().find(|a| a.get_id() == "data_format").expect("--data-format");
        let help = arg.get_help().expect("help").to_string();
        let words: Vec<&str> = help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).collect();
        for name in isorun_eval::Format::names() {
            assert!(words.contains(&name), "--data-format's help leaves out {name}: {help}");
        }
    }

    /// `eval` parses none of `run`'s own flags: they are not in its help, and given they are
    /// clap's "unexpected argument" naming them.
    #[test]
    fn eval_takes_none_of_run_s_own_flags() {
        let run = Cli::command().find_subcommand("run").expect("run").clone();
        let eval = Cli::command().find_subcommand("eval").expect("eval").clone();
        let longs = |c: &clap::Command| -> Vec<String> {
            c.get_arguments().filter_map(|a| a.get_long()).map(str::to_string).collect()
        };
        let (run, eval) = (longs(&run), longs(&eval));
        let only_run: Vec<&String> = run.iter().filter(|l| !eval.contains(l)).collect();
        assert_eq!(
            only_run,
            [
                "input",
                "inputs",
                "inputs-dir",
                "warmup-inputs",
                "warmup-limit",
                "strict-dtypes",
                "values",
                "expect",
                "rtol",
                "atol"
            ]
        );
        let error = Cli::try_parse_from(["isorun", "eval", "m/", "--data", "d", "--label", "y", "--rtol", "1"])
            .expect_err("eval takes no --rtol");
        assert_eq!(error.kind(), clap::error::ErrorKind::UnknownArgument);
        assert!(error.to_string().contains("'--rtol'"), "{error}");
    }
}

/// `isorun map`: a user's Python function, one supervised process per call.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun map mymodule:evaluate models/a models/b   # a JSON line per call
  ls models/ | isorun map evaluate.py:evaluate --items-from - -j 2 \\
      --timeout 600 --memory-limit 8G
  isorun map jobs:score '{\"n\": 3}' --journal map.jsonl --resume

Each ITEM that starts like JSON ({, [, \", true, false, null) must be JSON (the call gets it as
Python's json reads it); one that starts with a digit or - is a number where it is one (12, -3.5,
1e999), else a string, as is any other ITEM (a path: 3d.txt, a date: 2024-01-01). A record's \"value\" is the
return value as JSON; when it is not JSON or passes 1 MiB it is left out and \"value_omitted\" says
\"not JSON\" or \"over 1 MiB\" (\"value_type\" still names its type). The function's module is
imported once by a zygote per slot (with OPENBLAS_NUM_THREADS=1 and the like, restored for each
call); each call runs in a process forked from it, confined by the sandbox (read what you can,
write beneath --writable folders only, no network unless --network).
Exit codes: 0 every call ok; 1 some call not ok; 2 usage error (nothing run),
or an output file (--report, --junit, --html, --journal) another isorun is
writing; 130/143 interrupted by Ctrl-C/SIGTERM.")]
pub struct MapArgs {
    /// The function: MODULE:FUNCTION, MODULE a dotted module importable from here or a .py file.
    #[arg(value_name = "MODULE:FUNCTION")]
    pub target: String,

    /// Items to call the function on, one call each (JSON, else a plain string).
    #[arg(value_name = "ITEM")]
    pub items: Vec<String>,

    /// Read items from FILE, one per line (- for stdin; empty lines skipped), after the ITEM arguments.
    #[arg(long, value_name = "FILE|-", help_heading = "Inputs")]
    pub items_from: Option<PathBuf>,

    /// Each --items-from line is {\"file\": PATH, \"repr\": STRING}: PATH holds the pickled item (for the Python API).
    #[arg(long, requires = "items_from", hide = true)]
    pub items_pickled: bool,

    /// The function by value: a pickle (cloudpickle) of it; MODULE:FUNCTION then only names it (for the Python API).
    #[arg(long, value_name = "FILE", hide = true)]
    pub function_pickle: Option<PathBuf>,

    /// Pickle every ok call's value (protocol 5) into DIR/<index>.pkl; records say \"value_file\" (for the Python API).
    #[arg(long, value_name = "DIR", hide = true)]
    pub values_dir: Option<PathBuf>,

    /// The Python to run the function with (default: the environment isorun is installed in, else python3 on PATH).
    #[arg(long, value_name = "PATH", env = "ISORUN_PYTHON", help_heading = "Python")]
    pub python: Option<PathBuf>,

    /// Modules the zygote imports before forking, besides the function's own module (comma-separated, repeatable).
    #[arg(long, value_name = "MOD[,MOD..]", value_delimiter = ',', help_heading = "Python")]
    pub preload: Vec<String>,

    /// Largest pickled value a call may hand back to the Python API (e.g. 512M); a larger one is the call's error (value_too_large), its writing stopped at SIZE.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = crate::size::parse_size, help_heading = "Python")]
    pub value_cap: u64,

    /// Calls running at once [default: number of CPUs].
    #[arg(short, long, value_name = "N", env = "ISORUN_JOBS", help_heading = "Workers")]
    pub jobs: Option<usize>,

    /// Items each forked process runs in turn before it exits (a module global one call changes is then seen by
    /// the next calls of that process); a call that crashes, times out or hits the limit ends the process, and
    /// the items after it go to a fresh one.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u64).range(1..),
        help_heading = "Workers"
    )]
    pub items_per_worker: u64,

    /// Processes forked ahead per slot, each waiting for the slot's next item, so that a fork is never waited
    /// for (0 turns them off; at most 1).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u64).range(0..=1),
        help_heading = "Workers"
    )]
    pub spares: u64,

    /// Limit on each call, in seconds [default: none].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "ISORUN_TIMEOUT",
        allow_negative_numbers = true,
        help_heading = "Workers"
    )]
    pub timeout: Option<f64>,

    /// Limit on a zygote's start (its imports), in seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 300.0,
        allow_negative_numbers = true,
        help_heading = "Workers"
    )]
    pub start_timeout: f64,

    /// Stop a call whose private memory (RssAnon + RssShmem) passes SIZE (e.g. 2G, 512M; a bare number is bytes, at least 16 MiB).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_memory_limit, help_heading = "Workers")]
    pub memory_limit: Option<u64>,

    /// Confine the zygote and its calls (Landlock: writes only beneath --writable, the values folder and a private
    /// temporary folder; no network; no signals out; no new UNIX sockets; no new privileges).
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        default_value = "strict",
        env = "ISORUN_SANDBOX",
        help_heading = "Workers"
    )]
    pub sandbox: SandboxMode,

    /// A folder calls may write beneath (repeatable).
    #[arg(long, value_name = "DIR", help_heading = "Workers")]
    pub writable: Vec<PathBuf>,

    /// Let calls use the network.
    #[arg(long, help_heading = "Workers")]
    pub network: bool,

    /// GPUs, comma-separated (0,1 or UUIDs): slot i's calls get CUDA_VISIBLE_DEVICES set to entry i mod n
    /// before the function runs [default: CUDA_VISIBLE_DEVICES as it is].
    #[arg(long, value_name = "LIST", value_delimiter = ',', help_heading = "GPUs")]
    pub gpus: Vec<String>,

    /// Run a call again up to N times when it crashes, times out, hits the memory limit or cannot start.
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Nightly")]
    pub retries: u32,

    /// Statuses that are retried (comma-separated).
    #[arg(
        long,
        value_name = "STATUSES",
        value_delimiter = ',',
        default_value = "crashed,timeout,memory_limit,protocol_error,spawn_failed",
        help_heading = "Nightly"
    )]
    pub retry_on: Vec<String>,

    /// Append one JSON line per finished call to PATH (fsynced), for --resume.
    #[arg(long, value_name = "PATH", help_heading = "Nightly")]
    pub journal: Option<PathBuf>,

    /// Skip calls already in the journal with the same function (name and source) and item.
    #[arg(long, requires = "journal", help_heading = "Nightly")]
    pub resume: bool,

    /// Run only shard K of N (K from 0): the items whose name (as reports show it) hashes to K, as
    /// `run --shard` shards models (FNV-1a 64 mod N). `isorun slurm submit map` sets it per task.
    #[arg(long, value_name = "K/N", value_parser = isorun_report::shard::parse_shard, help_heading = "Nightly")]
    pub shard: Option<isorun_report::shard::Shard>,

    /// Write a JSON report of the whole run (one unit per item).
    #[arg(long, value_name = "PATH.json", help_heading = "Nightly")]
    pub report: Option<PathBuf>,

    /// Write a JUnit XML report (one test case per item).
    #[arg(long, value_name = "PATH.xml", help_heading = "Nightly")]
    pub junit: Option<PathBuf>,

    /// Write a self-contained HTML report.
    #[arg(long, value_name = "PATH.html", help_heading = "Nightly")]
    pub html: Option<PathBuf>,

    /// Output format on stdout [default: table on a terminal, jsonl otherwise].
    #[arg(long, value_enum, value_name = "FORMAT", help_heading = "Outputs")]
    pub format: Option<Format>,

    /// Short for --format jsonl.
    #[arg(long, conflicts_with = "format", help_heading = "Outputs")]
    pub json: bool,
}
