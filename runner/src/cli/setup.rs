//! The flags of the commands about the machine and the shell rather than
//! models: `doctor`, `cache` (the Keras export cache), `completions` and
//! `man`.

use super::shared::WorkerArgs;
use clap::{Args, Subcommand};
use std::path::PathBuf;

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

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
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
