//! The command line as parsed, before validation (`settings.rs` turns it
//! into settings), one file per command (`run.rs`, `eval.rs`, ...) and the
//! flags several share in `shared.rs`. Flag names are the interface users
//! and scripts rely on. Values with a closed set of spellings (`--format`,
//! `--data-format`, `--gate`, `--data-shard`, ...) are parsed into types
//! here, so a bad one is clap's usage error naming the flag.

mod eval;
mod map;
mod models;
mod pipe;
mod report;
mod rescore;
mod run;
mod setup;
mod shared;
mod slurm;

pub use eval::{run_flag_given_to_eval, EvalArgs, EvalOptions};
pub use map::MapArgs;
pub use models::{InspectArgs, LsArgs};
pub use pipe::PipeArgs;
pub use report::{ReportCommand, ReportDiffArgs, ReportMergeArgs, ReportTableArgs, TableFormatArg};
pub use rescore::RescoreArgs;
pub use run::{ExpectArgs, RunArgs, RunInputArgs, SharedRunArgs};
pub use setup::{CacheArgs, CacheCommand, CompletionsArgs, DoctorArgs, ManArgs};
pub use shared::{Format, KerasArgs, SandboxMode, SpawnMode};
pub use slurm::{SlurmCommand, SlurmSubmitArgs};

use clap::{Parser, Subcommand};

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
}
