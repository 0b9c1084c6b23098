//! `isorun slurm submit`'s flags: the job array's shape and `#SBATCH`
//! options, and the `run`, `eval` or `map` arguments each task runs.

use clap::{Args, Subcommand};
use std::path::PathBuf;

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
