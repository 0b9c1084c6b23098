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
  isorun run models/ --inputs batch.npz            every SavedModel under models/, one JSON line each
  isorun run models/ --inputs batch.npz --output-dir out/ -j 2 --timeout 60
  isorun inspect models/resnet                     signatures, inputs and outputs of one model
  isorun ls models/ --json | jq -r .path           the SavedModels isorun finds
  echo '{\"id\": 1, \"inputs\": {\"x\": [[1, 2, 3, 4]]}}' | isorun pipe models/linear
  isorun doctor                                    what this machine offers isorun";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every model with the same inputs, one JSON line per model on stdout.
    Run(RunArgs),
    /// Show a SavedModel's meta graphs, signatures, inputs and outputs (no TensorFlow needed).
    Inspect(InspectArgs),
    /// List the SavedModels found under folders, one per line as `id<TAB>path`.
    Ls(LsArgs),
    /// Keep one model in a worker and answer JSON Lines requests from stdin.
    Pipe(PipeArgs),
    /// Say what this machine offers isorun; exit 1 if it cannot run models here.
    Doctor(DoctorArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Print the man page (roff) on stdout.
    #[command(hide = true)]
    Man,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun inspect models/resnet
  isorun inspect models/resnet --json | jq '.signatures.serving_default.inputs'")]
pub struct InspectArgs {
    /// A SavedModel folder.
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
    /// Folders to search (recursively) for SavedModels.
    #[arg(value_name = "DIR", required = true)]
    pub dirs: Vec<PathBuf>,

    /// JSON Lines (`{"id": ..., "path": ...}`) instead of `id<TAB>path`.
    #[arg(long)]
    pub json: bool,

    /// With TensorFlow Serving's layout (model/1, model/2), keep only the highest version of each model.
    #[arg(long)]
    pub latest_version: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  printf '%s\\n' '{\"id\": 1, \"inputs\": {\"x\": [[1, 2, 3, 4]]}}' | isorun pipe models/linear")]
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

    /// Limit on each request, in seconds [default: none].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub timeout: Option<f64>,

    #[command(flatten)]
    pub worker: WorkerArgs,
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
  isorun run models/ --inputs batch.npz -j 2 --timeout 60 --json | jq -r 'select(.status != \"ok\") | .model'
  isorun run models/linear --input 'x=@[[1, 2, 3, 4]]' --values

Exit codes: 0 every model ok; 1 some model not ok; 2 usage error (nothing run);
130/143 interrupted by Ctrl-C/SIGTERM. A closed stdout ends the run with 0.")]
pub struct RunArgs {
    /// SavedModel folders, or folders searched recursively for SavedModels.
    #[arg(value_name = "MODEL", required = true)]
    pub models: Vec<PathBuf>,

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

    /// Split inputs along their first dimension into runs of at most N rows; outputs are joined back.
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

    /// Include output values in the JSON lines.
    #[arg(long, help_heading = "Outputs")]
    pub values: bool,

    /// Print a summary table on stderr when done (status, time, memory per model).
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

    /// Models each worker runs before it exits and a fresh one starts.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Workers")]
    pub models_per_worker: u64,

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

    #[command(flatten)]
    pub worker: WorkerArgs,
}
