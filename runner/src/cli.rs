//! The command line as parsed, before validation (`run.rs` turns it into
//! settings). Flag names are the interface users and scripts rely on.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Run TensorFlow SavedModels in short-lived worker processes, so that the
/// operating system, not TensorFlow, gives the memory back.
#[derive(Debug, Parser)]
#[command(name = "isorun", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every model with the same inputs, one JSON line per model on stdout.
    Run(RunArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// SavedModel folders, or folders searched recursively for SavedModels.
    #[arg(value_name = "MODEL", required = true)]
    pub models: Vec<PathBuf>,

    /// An input tensor from an .npy file (repeatable).
    #[arg(long = "input", value_name = "NAME=PATH", help_heading = "Inputs")]
    pub input: Vec<String>,

    /// Input tensors from an .npz file, keyed by input name (repeatable).
    #[arg(long = "inputs", value_name = "PATH.npz", help_heading = "Inputs")]
    pub inputs: Vec<PathBuf>,

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
