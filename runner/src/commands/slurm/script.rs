//! The two batch scripts `isorun slurm submit` writes. They are meant to be
//! read (and kept in a repository, as `examples/slurm/` does): each says
//! what it does, what it writes where, and how to submit it by hand, and
//! names every path absolutely, so it means the same from any folder.

use super::run_args::RunArg;

/// Everything the scripts say.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    /// The `isorun` binary, absolute.
    pub isorun: &'a str,
    /// The folder `isorun slurm submit` ran in; the jobs start there.
    pub submit_dir: &'a str,
    /// `--out`, absolute.
    pub out: &'a str,
    pub shards: u64,
    /// `--data-shards D` (with `eval`): every model shard's data in D shards.
    pub data_shards: Option<u64>,
    /// What the tasks run: `run` or `eval`.
    pub command: &'a str,
    pub job_name: &'a str,
    pub partition: Option<&'a str>,
    pub time: Option<&'a str>,
    pub cpus_per_task: Option<u32>,
    pub mem: Option<&'a str>,
    pub gpus_per_task: Option<u32>,
    pub sbatch_args: &'a [String],
    /// The run arguments, paths absolute.
    pub run_args: &'a [RunArg],
    /// Add `--jobs "$SLURM_CPUS_PER_TASK"` (asked for CPUs, and no -j given).
    pub jobs_from_slurm: bool,
}

/// A word for bash: as it is when it is plainly safe, else in single quotes.
pub fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%^".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The `#SBATCH` lines both jobs share.
fn shared_options(plan: &Plan<'_>) -> String {
    let mut lines = String::new();
    if let Some(partition) = plan.partition {
        lines.push_str(&format!("#SBATCH --partition={partition}\n"));
    }
    for option in plan.sbatch_args {
        lines.push_str(&format!("#SBATCH {option}\n"));
    }
    lines
}

/// The job array: task K runs `isorun run --shard K/N` (or `isorun eval`);
/// with data shards, task T runs model shard T / D on data shard T mod D.
pub fn array_script(plan: &Plan<'_>) -> String {
    let Plan { out, shards, command, .. } = *plan;
    let tasks = shards * plan.data_shards.unwrap_or(1);
    let last = tasks - 1;
    let what = match plan.data_shards {
        None => format!(
            "task K of this job array runs shard K of {shards} of `isorun {command}` (the
# models whose id hashes to K), with its own journal and report."
        ),
        Some(data_shards) => format!(
            "task T of this job array ({shards} model shards × {data_shards} data
# shards) runs `isorun eval` on model shard T / {data_shards} of {shards} (the models whose id hashes
# to it) and data shard T % {data_shards} of {data_shards} of the data (`--data-shard`), with its own
# journal and report, which holds each model's metric state. The merge job merges each model's
# {data_shards} data shards into exact metrics, and checks --threshold and --max-drop on them."
        ),
    };
    let task = if plan.data_shards.is_some() { "T" } else { "K" };
    let mut s = String::new();
    s.push_str(&format!(
        "#!/bin/bash
# isorun on Slurm: {what} Written by `isorun slurm
# submit` (isorun {version}) into OUT={out}, and submitted with the
# merge job that joins the reports:
#
#   sbatch --parsable $OUT/array.sbatch
#   sbatch --parsable --dependency=afterany:<array job id> $OUT/merge.sbatch
#
# $OUT/models.json lists every model with its shard. Task {task} writes, in $OUT/shards/:
#   {task}.json           its report
#   {task}.jsonl          one JSON line per model
#   {task}.journal.jsonl  its journal: run again, the task skips the models it finished (--resume)
# and logs to $OUT/logs/array-<array job id>_{task}.out.
#
# To run one task again: sbatch --array={task} $OUT/array.sbatch, then the merge job as above
# (N is written below rather than read from SLURM_ARRAY_TASK_COUNT, so one task alone works).
# `isorun {command}` exits 1 when some model is not ok, and Slurm then says the task FAILED; its
# report is complete all the same. A task that ends before writing its report leaves its models
# to the merge job, which reports them as not_run (shard_task_lost).
# The tasks get the environment sbatch was called in (--export=ALL, Slurm's default):
# ISORUN_WORKER, ISORUN_LIBTENSORFLOW_DIR and the like reach isorun from there.
#SBATCH --job-name={job_name}
#SBATCH --array=0-{last}
#SBATCH --output={out}/logs/array-%A_%a.out
",
        version = env!("CARGO_PKG_VERSION"),
        job_name = plan.job_name,
    ));
    if let Some(time) = plan.time {
        s.push_str(&format!("#SBATCH --time={time}\n"));
    }
    if let Some(cpus) = plan.cpus_per_task {
        s.push_str(&format!("#SBATCH --cpus-per-task={cpus}\n"));
    }
    if let Some(mem) = plan.mem {
        s.push_str(&format!("#SBATCH --mem={mem}\n"));
    }
    if let Some(gpus) = plan.gpus_per_task {
        s.push_str(&format!("#SBATCH --gpus-per-task={gpus}\n"));
    }
    s.push_str(&shared_options(plan));
    let counts = match plan.data_shards {
        None => {
            format!("K=${{SLURM_ARRAY_TASK_ID:?not a Slurm array task: submit this script with sbatch}}\nN={shards}\n")
        }
        Some(data_shards) => format!(
            "T=${{SLURM_ARRAY_TASK_ID:?not a Slurm array task: submit this script with sbatch}}\n\
             N={shards}\nD={data_shards}\nK=$((T / D))\n"
        ),
    };
    s.push_str(&format!(
        "set -euo pipefail
cd {submit_dir}

{counts}OUT={out_quoted}
exec {isorun} {command} \\\n",
        submit_dir = shell_quote(plan.submit_dir),
        out_quoted = shell_quote(out),
        isorun = shell_quote(plan.isorun),
    ));
    for item in plan.run_args {
        let words: Vec<String> = item.words.iter().map(|word| shell_quote(word)).collect();
        s.push_str(&format!("  {} \\\n", words.join(" ")));
    }
    if plan.jobs_from_slurm {
        s.push_str("  --jobs \"$SLURM_CPUS_PER_TASK\" \\\n");
    }
    s.push_str("  --shard \"$K/$N\" \\\n");
    if plan.data_shards.is_some() {
        s.push_str("  --data-shard \"$((T % D))/$D\" \\\n");
    }
    s.push_str(&format!(
        "  --journal \"$OUT/shards/${task}.journal.jsonl\" --resume \\
  --report \"$OUT/shards/${task}.json\" \\
  --json >\"$OUT/shards/${task}.jsonl\"
"
    ));
    s
}

/// The merge job, submitted with `--dependency=afterany:<array job id>`.
pub fn merge_script(plan: &Plan<'_>) -> String {
    let Plan { out, .. } = *plan;
    let mut s = format!(
        "#!/bin/bash
# Joins the reports of the tasks of $OUT/array.sbatch into one report, once every task
# has ended, however it ended. Written by `isorun slurm submit` (isorun {version}) into
# OUT={out}, and submitted after the array:
#
#   sbatch --parsable --dependency=afterany:<array job id> $OUT/merge.sbatch
#
# It writes $OUT/report.json, report.xml (JUnit) and report.html, and logs to
# $OUT/logs/merge-<job id>.out. Every model $OUT/models.json lists is in the report:
# the models of a task that failed or was cancelled before writing its report are not_run,
# with reason shard_task_lost.{data}
#SBATCH --job-name={job_name}-merge
#SBATCH --output={out}/logs/merge-%j.out
#SBATCH --time=00:10:00
",
        version = env!("CARGO_PKG_VERSION"),
        job_name = plan.job_name,
        data = match plan.data_shards {
            None => String::new(),
            Some(data_shards) => format!(
                "\n# The tasks are data shards too: each model's {data_shards} metric states are merged into the
# metrics of one pass over all the data, then --threshold and --max-drop are checked; a model
# missing a data shard is not_run (shard_task_lost), never the metrics of part of the data.
# The merge exits 1 (and Slurm says FAILED) when some model is not ok, as `isorun eval` does."
            ),
        },
    );
    s.push_str(&shared_options(plan));
    s.push_str(&format!(
        "set -euo pipefail
cd {submit_dir}

OUT={out_quoted}
shopt -s nullglob
reports=(\"$OUT\"/shards/*.json) # none at all when every task was lost
# ${{reports[@]+...}}: the list, empty too, also under set -u in bash before 4.4.
exec {isorun} report merge ${{reports[@]+\"${{reports[@]}}\"}} \\
  --models \"$OUT/models.json\" \\
  -o \"$OUT/report.json\" --junit \"$OUT/report.xml\" --html \"$OUT/report.html\"
",
        submit_dir = shell_quote(plan.submit_dir),
        out_quoted = shell_quote(out),
        isorun = shell_quote(plan.isorun),
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(data_shards: Option<u64>, command: &'static str) -> Plan<'static> {
        Plan {
            isorun: "/opt/isorun",
            submit_dir: "/srv",
            out: "/srv/night",
            shards: 2,
            data_shards,
            command,
            job_name: "isorun",
            partition: None,
            time: None,
            cpus_per_task: None,
            mem: None,
            gpus_per_task: None,
            sbatch_args: &[],
            run_args: &[],
            jobs_from_slurm: false,
        }
    }

    #[test]
    fn data_shards_make_an_array_of_model_shards_times_data_shards() {
        let script = array_script(&plan(Some(3), "eval"));
        assert!(script.contains("#SBATCH --array=0-5\n"), "{script}");
        assert!(script.contains("N=2\nD=3\nK=$((T / D))\n"), "{script}");
        assert!(script.contains("exec /opt/isorun eval \\\n"), "{script}");
        assert!(script.contains("  --shard \"$K/$N\" \\\n  --data-shard \"$((T % D))/$D\" \\\n"), "{script}");
        assert!(script.contains("--report \"$OUT/shards/$T.json\""), "{script}");
        assert!(merge_script(&plan(Some(3), "eval")).contains("each model's 3 metric states are merged"));
        // Without data shards: task K runs model shard K, as before.
        let script = array_script(&plan(None, "run"));
        assert!(script.contains("#SBATCH --array=0-1\n") && script.contains("exec /opt/isorun run \\\n"), "{script}");
        assert!(!script.contains("data-shard") && script.contains("--report \"$OUT/shards/$K.json\""), "{script}");
    }

    #[test]
    fn words_are_quoted_only_when_needed() {
        assert_eq!(shell_quote("/srv/models"), "/srv/models");
        assert_eq!(shell_quote("--input=x=@[1, 2]"), "'--input=x=@[1, 2]'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
    }
}
