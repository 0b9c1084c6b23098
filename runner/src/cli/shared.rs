//! Flags that several commands flatten in or share a type for: where the worker
//! and libtensorflow are, how Keras files are exported, how far workers are
//! confined and how they start, and how records print. One definition, so
//! `run`, `eval`, `pipe`, `map` and `doctor` spell and document them alike.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use isorun_report::change::Gate;
use std::path::PathBuf;

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

/// How `run` prints its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
    /// A readable table.
    Table,
}

/// `--gate` of `eval` and `rescore`: `always` or `significant`; another word
/// is clap's usage error listing both.
pub(super) fn gate_parser() -> impl TypedValueParser<Value = Gate> {
    PossibleValuesParser::new(["always", "significant"]).map(|name| Gate::parse(&name).expect("always or significant"))
}
