//! `isorun run`'s flags, and the part of them `eval` takes too
//! ([`SharedRunArgs`]: models, workers, limits, outputs, reports): `eval`
//! flattens that part in, so the two commands cannot drift apart.

use super::shared::{Format, KerasArgs, SandboxMode, SpawnMode, WorkerArgs};
use clap::Args;
use std::path::PathBuf;

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
