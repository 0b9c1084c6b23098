//! `isorun slurm submit`: a sharded run on a Slurm cluster, as two batch
//! scripts in one folder: a job array whose task K runs `isorun run --shard
//! K/N` with its own journal and report, and a merge job that starts when
//! every task has ended (`afterany`) and joins the reports.
//!
//! `eval` is submitted the same way (RUN ARGS begin with `eval`), and with
//! `--data-shards D` the array has N × D tasks: task T runs model shard
//! T / D and data shard T mod D (`--shard $((T / D))/N --data-shard $((T %
//! D))/D`), and the merge job merges each model's data shards into exact
//! metrics (`isorun report merge`).
//!
//! Submit checks the run arguments as `isorun run` would (clap, discovery,
//! the inputs) before writing anything, because a mistake found by a batch
//! job hours later, N times over, is expensive. It also writes the models
//! and their shards (`models.json`), computed exactly as `run` computes
//! them, so the merge can report the models of a lost task as `not_run`
//! (`shard_task_lost`) instead of leaving them out.
//!
//! `map` is submitted the same way (RUN ARGS begin with `map`): task K runs
//! `isorun map --shard K/N` on the items whose name hashes to K, and
//! `models.json` lists every item by the name its report unit has, so the
//! items of a lost task are `not_run` too.

mod run_args;
mod script;

pub use run_args::{prepare as prepare_run_args, RunArg, TaskCommand};
pub use script::{array_script, merge_script, Plan};

use crate::cli::{
    Cli, Command, EvalOptions, ExpectArgs, MapArgs, RunArgs, RunInputArgs, SharedRunArgs, SlurmCommand, SlurmSubmitArgs,
};
use crate::error::CliError;
use isorun_engine::{discover, latest_versions};
use isorun_protocol::exit_code;
use isorun_report::format_rfc3339;
use isorun_report::shard::{fnv1a64, Shard};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// `isorun slurm ...`; `Err` is a usage error (exit 2).
pub fn main(command: &SlurmCommand) -> Result<i32, CliError> {
    match command {
        SlurmCommand::Submit(args) => Ok(submit(args)?),
    }
}

/// A model and the shard that runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedModel {
    pub id: String,
    pub path: PathBuf,
    pub shard: u64,
}

fn submit(args: &SlurmSubmitArgs) -> Result<i32, String> {
    check_sbatch_options(args)?;
    let out = std::path::absolute(&args.out).map_err(|e| format!("--out {}: {e}", args.out.display()))?;
    let out_text = out.to_str().ok_or_else(|| format!("--out {}: not UTF-8", out.display()))?.to_string();
    if let Some(c) = out_text.chars().find(|&c| !(c.is_ascii_alphanumeric() || "_-./+@,:=".contains(c))) {
        return Err(format!(
            "--out {out_text}: {c:?} cannot be in the folder's path (it goes into #SBATCH lines unquoted)"
        ));
    }
    if out.exists() && !out.is_dir() {
        return Err(format!("--out {out_text}: not a folder"));
    }
    let submit_dir = std::env::current_dir().map_err(|e| format!("cannot read the current folder: {e}"))?;
    let submit_dir = submit_dir.to_str().ok_or("the current folder's path is not UTF-8")?.to_string();
    let isorun = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let isorun = isorun.to_str().ok_or("this executable's path is not UTF-8")?.to_string();

    // The run arguments: paths absolute, then checked by `isorun run`'s own parser.
    let (task, raw_args) = TaskCommand::split(&args.run_args);
    if args.data_shards.is_some() && task != TaskCommand::Eval {
        return Err("--data-shards splits the data of an eval: give `eval` and its arguments (isorun slurm submit \
                    --shards N --data-shards D --out DIR eval MODELS --data ... --label ...)"
            .into());
    }
    let run_args = prepare_run_args(raw_args, task)?;
    let task_args = match parse_task_command(&run_args, args.shards, task, args.data_shards) {
        Ok(parsed) => parsed,
        Err(Parsed::Usage(message)) => return Err(message),
        Err(Parsed::Clap(error)) => {
            let _ = error.print();
            return Ok(if error.use_stderr() { exit_code::USAGE } else { exit_code::OK });
        }
    };
    let (models, jobs_given) = match task_args {
        Task::Map(map) => (sharded_items(&map, args.shards)?, map.jobs.is_some()),
        Task::Models(task_args) => {
            let TaskArgs { shared: parsed, run_only, eval } = *task_args;
            if parsed.junit.is_some() || parsed.html.is_some() {
                return Err(
                    "--config sets junit or html: the merge job writes DIR/report.xml and DIR/report.html".into()
                );
            }
            if run_only.as_ref().is_some_and(|(given, _)| given.inputs.iter().any(|path| path.as_os_str() == "-")) {
                return Err(
                    "--config reads inputs from stdin (-): a batch job has no stdin; give the inputs as a file".into(),
                );
            }
            let models = sharded_models(&parsed, args.shards)?;
            check_files(&parsed, run_only.as_ref())?;
            if let Some(eval) = &eval {
                check_eval(eval, parsed.batch_size)?;
            }
            (models, parsed.jobs.is_some())
        }
    };
    check_earlier_submit(&out, args.shards, args.data_shards)?;

    let plan = Plan {
        isorun: &isorun,
        submit_dir: &submit_dir,
        out: &out_text,
        shards: args.shards,
        data_shards: args.data_shards,
        command: task.name(),
        job_name: &args.job_name,
        partition: args.partition.as_deref(),
        time: args.time.as_deref(),
        cpus_per_task: args.cpus_per_task,
        mem: args.mem.as_deref(),
        gpus_per_task: args.gpus_per_task,
        sbatch_args: &args.sbatch_arg,
        run_args: &run_args,
        jobs_from_slurm: args.cpus_per_task.is_some() && !jobs_given,
    };
    let (array, merge) = (array_script(&plan), merge_script(&plan));
    let listing = model_list(&models, (args.shards, args.data_shards), &isorun, task, &run_args);
    let per_shard = shard_sizes(&models, args.shards);
    let sizes: Vec<String> = per_shard.iter().map(u64::to_string).collect();
    let noun = if task == TaskCommand::Map { "items" } else { "models" };
    eprintln!("isorun: {} {noun} in {} shards ({})", models.len(), args.shards, sizes.join(", "));
    if let Some(data_shards) = args.data_shards {
        eprintln!(
            "isorun: {} array tasks: each model shard's data in {data_shards} shards (task T: model shard T / \
             {data_shards}, data shard T % {data_shards})",
            args.shards * data_shards
        );
    }
    if let Some(empty) = per_shard.iter().position(|&n| n == 0) {
        let noun = if task == TaskCommand::Map { "item" } else { "model" };
        eprintln!("isorun: warning: shard {empty} (and maybe others) has no {noun}; its task runs nothing");
    }

    let (array_path, merge_path) = (out.join("array.sbatch"), out.join("merge.sbatch"));
    if args.dry_run {
        print!(
            "==> {} <==\n{array}\n==> {} <==\n{merge}\n==> what submit would run <==\n\
             sbatch --parsable {}\nsbatch --parsable --dependency=afterany:<array job id> {}\n",
            array_path.display(),
            merge_path.display(),
            array_path.display(),
            merge_path.display()
        );
        return Ok(exit_code::OK);
    }
    let sbatch = find_in_path("sbatch").ok_or(
        "sbatch not found on PATH: submit from a machine of the Slurm cluster (or print the scripts with --dry-run)",
    )?;

    // Nothing was written before this point.
    write_folder(&out, &array, &merge, &listing)?;
    let array_job = match run_sbatch(&sbatch, &[], &array_path) {
        Ok(id) => id,
        Err(message) => {
            crate::support::print_error(message);
            return Ok(exit_code::SOME_FAILED);
        }
    };
    let dependency = format!("--dependency=afterany:{array_job}");
    let merge_job = match run_sbatch(&sbatch, &[&dependency], &merge_path) {
        Ok(id) => id,
        Err(message) => {
            crate::support::print_error(message);
            eprintln!(
                "isorun: array job {array_job} was submitted; submit the merge yourself: sbatch {dependency} {}",
                merge_path.display()
            );
            return Ok(exit_code::SOME_FAILED);
        }
    };
    println!("array job {array_job}, merge job {merge_job}");
    eprintln!("isorun: follow with: squeue -j {array_job},{merge_job}; the report will be {out_text}/report.json");
    Ok(exit_code::OK)
}

/// How parsing the task's command line failed.
enum Parsed {
    /// clap's own error (printed as clap prints it), or `--help`.
    Clap(clap::Error),
    Usage(String),
}

/// A task's command line, parsed.
enum Task {
    /// `run` or `eval`.
    Models(Box<TaskArgs>),
    Map(Box<MapArgs>),
}

/// A `run` or `eval` task's command line, parsed: the flags they share, and
/// `run`'s own or `eval`'s.
struct TaskArgs {
    shared: SharedRunArgs,
    run_only: Option<(RunInputArgs, ExpectArgs)>,
    eval: Option<EvalOptions>,
}

/// The run arguments as one task's `isorun run` command sees them (the
/// flags submit adds included, `--config` expanded), parsed by clap.
fn parse_task_command(
    run_args: &[RunArg],
    shards: u64,
    task: TaskCommand,
    data_shards: Option<u64>,
) -> Result<Task, Parsed> {
    let mut argv: Vec<OsString> = vec!["isorun".into(), task.name().into()];
    argv.extend(run_args.iter().flat_map(|item| item.words.iter().map(OsString::from)));
    // What the script adds (shard 0 stands for every K): the same flags clap will see there.
    let double_dash = run_args.iter().any(|item| item.words == ["--"]);
    let added: [&str; 7] = ["--shard", &format!("0/{shards}"), "--journal", "j", "--resume", "--report", "r"];
    let mut added: Vec<OsString> = added.iter().map(OsString::from).chain([OsString::from("--json")]).collect();
    if let Some(count) = data_shards {
        added.extend([OsString::from("--data-shard"), OsString::from(format!("0/{count}"))]);
    }
    if double_dash {
        // After `--` every word is a MODEL: the flags go before it.
        let at = argv.iter().position(|word| word == "--").expect("there is a --");
        argv.splice(at..at, added);
    } else {
        argv.extend(added);
    }
    let argv = crate::config::expand_command_line(argv).map_err(|e| Parsed::Usage(crate::support::with_causes(&e)))?;
    let cli = <Cli as clap::Parser>::try_parse_from(argv).map_err(Parsed::Clap)?;
    match cli.command {
        Command::Run(args) => {
            let RunArgs { given, shared, golden } = *args;
            Ok(Task::Models(Box::new(TaskArgs { shared, run_only: Some((given, golden)), eval: None })))
        }
        Command::Eval(args) => {
            Ok(Task::Models(Box::new(TaskArgs { shared: args.run, run_only: None, eval: Some(args.eval) })))
        }
        Command::Map(args) => Ok(Task::Map(args)),
        _ => unreachable!("the command line starts with run, eval or map"),
    }
}

/// The models `isorun run` would find, each with its shard.
fn sharded_models(args: &SharedRunArgs, shards: u64) -> Result<Vec<ShardedModel>, String> {
    let mut models = discover(&args.models, &mut |warning| crate::support::warn(warning))
        .map_err(|e| crate::support::with_causes(&e))?;
    if args.latest_version {
        models = latest_versions(models);
    }
    Ok(models
        .into_iter()
        .map(|model| {
            let shard = fnv1a64(model.id.as_bytes()) % shards;
            debug_assert!(Shard { index: shard, count: shards }.owns(&model.id));
            ShardedModel { id: model.id, path: model.path, shard }
        })
        .collect())
}

/// The items `isorun map` would read, each named as its task's report
/// names its unit (a repeated name gets ` #I`, I its index in the shard),
/// with its shard: what `map --shard` computes.
fn sharded_items(args: &MapArgs, shards: u64) -> Result<Vec<ShardedModel>, String> {
    let items = crate::commands::map::read_items(args)?;
    let mut seen: HashMap<u64, (usize, HashSet<String>)> = HashMap::new();
    let mut units = Vec::with_capacity(items.len());
    for item in &items {
        let mut name = crate::commands::map::item_name(&item.shown);
        let shard = fnv1a64(name.as_bytes()) % shards;
        let (index, names) = seen.entry(shard).or_default();
        if !names.insert(name.clone()) {
            name = format!("{name} #{index}");
            names.insert(name.clone());
        }
        *index += 1;
        units.push(ShardedModel { id: name, path: PathBuf::new(), shard });
    }
    Ok(units)
}

fn shard_sizes(models: &[ShardedModel], shards: u64) -> Vec<u64> {
    let mut sizes = vec![0; shards as usize];
    for model in models {
        sizes[model.shard as usize] += 1;
    }
    sizes
}

/// What `run` checks before any work, short of starting a worker: the
/// inputs read, the folders and files named exist, the worker is there.
fn check_files(args: &SharedRunArgs, run_only: Option<&(RunInputArgs, ExpectArgs)>) -> Result<(), String> {
    if let Some((given, golden)) = run_only {
        isorun_tensors::inputs::load_inputs(&given.input, &given.inputs)
            .map_err(|e| crate::support::with_causes(&e))?;
        for (flag, dir) in [("--inputs-dir", &given.inputs_dir), ("--expect", &golden.expect)] {
            if let Some(dir) = dir.as_ref().filter(|dir| !dir.is_dir()) {
                return Err(format!("{flag} {}: not a folder", dir.display()));
            }
        }
    }
    if let Some(library) = args.load_library.iter().find(|path| !path.is_file()) {
        return Err(format!("--load-library {}: no such file", library.display()));
    }
    isorun_engine::locations::worker_binary(args.worker.worker.as_deref())?;
    Ok(())
}

/// What `eval` checks before any work that a task would otherwise find
/// hours later, N times over: `--limit` is not given with data shards, and
/// the data opens (its files and first example, the label, weight and
/// slice features).
fn check_eval(eval: &EvalOptions, batch_size: Option<u64>) -> Result<(), String> {
    if eval.data_shard.is_some() && eval.limit.is_some() {
        return Err("--limit cannot be given with --data-shards: the first N examples of the whole dataset \
                    are not a shard's; limit the data itself"
            .into());
    }
    let spec = isorun_eval::DataSpec {
        paths: eval.data.clone(),
        label: eval.label.clone(),
        weight: eval.weight.clone(),
        slices: eval.slices.clone(),
        renames: Vec::new(),
        limit: None,
        batch_size: batch_size.unwrap_or(1) as usize,
        skip_corrupt: eval.skip_corrupt,
        shard: None,
        example_key: eval.example_key.clone(),
        format: eval.data_format,
    };
    let classes = crate::settings::eval::label_classes(eval)?;
    isorun_eval::Dataset::open_with_classes(spec, classes)
        .map_err(|e| format!("--data: {}", crate::support::with_causes(&e)))?;
    Ok(())
}

/// `--partition`, `--time`, `--mem`, `--job-name` and `--sbatch-arg` go into
/// `#SBATCH` lines, which sbatch splits at spaces.
fn check_sbatch_options(args: &SlurmSubmitArgs) -> Result<(), String> {
    let given = [
        ("--partition", args.partition.as_deref()),
        ("--time", args.time.as_deref()),
        ("--mem", args.mem.as_deref()),
        ("--job-name", Some(args.job_name.as_str())),
    ];
    for (flag, value) in given.into_iter().chain(args.sbatch_arg.iter().map(|v| ("--sbatch-arg", Some(v.as_str())))) {
        if let Some(value) = value {
            if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!("{flag} {value:?}: expected one word, without spaces"));
            }
        }
    }
    if let Some(time) = &args.time {
        let slurm_time = time.chars().all(|c| c.is_ascii_digit() || c == ':' || c == '-')
            || ["infinite", "unlimited"].contains(&time.to_ascii_lowercase().as_str());
        if !slurm_time {
            return Err(format!("--time {time}: expected MINUTES, HH:MM:SS, D-HH:MM:SS or UNLIMITED"));
        }
    }
    if let Some(option) = args.sbatch_arg.iter().find(|option| !option.starts_with('-')) {
        return Err(format!("--sbatch-arg {option}: expected an sbatch option, e.g. --sbatch-arg=--account=ml"));
    }
    Ok(())
}

/// Submitting again into a folder resumes from its journals, which hold
/// the shards of the first submit: another shard count is refused.
fn check_earlier_submit(out: &Path, shards: u64, data_shards: Option<u64>) -> Result<(), String> {
    let path = out.join("models.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(()) };
    let listing = serde_json::from_str::<Value>(&text).ok();
    let earlier = listing.as_ref().and_then(|v| v["shards"].as_u64());
    let earlier_data = listing.as_ref().and_then(|v| v["data_shards"].as_u64());
    if listing.is_some() && earlier_data != data_shards {
        let given = |d: Option<u64>| d.map_or("no --data-shards".to_string(), |d| format!("--data-shards {d}"));
        return Err(format!(
            "{} was submitted with {} ({}): submit with it again to resume, or give another --out",
            out.display(),
            given(earlier_data),
            path.display()
        ));
    }
    match earlier {
        Some(earlier) if earlier != shards => Err(format!(
            "{} was submitted with --shards {earlier} ({}): submit with --shards {earlier} to resume it, \
             or give another --out",
            out.display(),
            path.display()
        )),
        _ => Ok(()),
    }
}

/// `models.json`: the models and their shards, for `isorun report merge --models`.
fn model_list(
    models: &[ShardedModel],
    (shards, data_shards): (u64, Option<u64>),
    isorun: &str,
    task: TaskCommand,
    run_args: &[RunArg],
) -> Value {
    let mut command = vec![isorun.to_string(), task.name().to_string()];
    command.extend(run_args.iter().flat_map(|item| item.words.iter().cloned()));
    let mut listing = json!({
        "shards": shards,
        "submitted_at": format_rfc3339(isorun_report::unix_milliseconds(std::time::SystemTime::now())),
        "isorun_version": env!("CARGO_PKG_VERSION"),
        "command": command,
        "models": models
            .iter()
            .map(|m| match m.path.as_os_str().is_empty() {
                // A map item has no path.
                true => json!({"model": m.id, "shard": m.shard}),
                false => json!({"model": m.id, "path": m.path.to_string_lossy(), "shard": m.shard}),
            })
            .collect::<Vec<_>>(),
    });
    if let Some(data_shards) = data_shards {
        listing["data_shards"] = json!(data_shards);
    }
    listing
}

/// Writes the scripts and `models.json`, and clears what an earlier submit
/// into the folder left that would be mistaken for this one's: shard
/// reports and JSON lines, the merged report. Journals stay, for resuming.
fn write_folder(out: &Path, array: &str, merge: &str, listing: &Value) -> Result<(), String> {
    let failed = |path: &Path, e: std::io::Error| format!("{}: cannot write: {e}", path.display());
    // The folder may be shared (a group's): a `shards` or `logs` planted as a
    // link would have the jobs write, and this clear-out delete, elsewhere.
    for dir in [out.join("shards"), out.join("logs")] {
        if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(format!("{}: is a symbolic link; isorun does not write through one", dir.display()));
        }
        std::fs::create_dir_all(&dir).map_err(|e| failed(&dir, e))?;
    }
    let shards = out.join("shards");
    for entry in std::fs::read_dir(&shards).map_err(|e| failed(&shards, e))?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let stem = name.strip_suffix(".json").or_else(|| name.strip_suffix(".jsonl"));
        if stem.is_some_and(|stem| !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_digit())) {
            std::fs::remove_file(entry.path()).map_err(|e| failed(&entry.path(), e))?;
        }
    }
    for name in ["report.json", "report.xml", "report.html"] {
        let path = out.join(name);
        if path.exists() {
            std::fs::remove_file(&path).map_err(|e| failed(&path, e))?;
        }
    }
    let mut listing_text = serde_json::to_string_pretty(listing).expect("JSON");
    listing_text.push('\n');
    for (name, text) in [("array.sbatch", array), ("merge.sbatch", merge), ("models.json", listing_text.as_str())] {
        let path = out.join(name);
        // A fresh temporary file renamed over the name: a link planted there is replaced, not followed.
        isorun_report::write_file_atomically(&path, text.as_bytes()).map_err(|e| failed(&path, e))?;
    }
    Ok(())
}

/// `sbatch --parsable [extra] SCRIPT`: the job id it prints (`12`, or `12;cluster`).
fn run_sbatch(sbatch: &Path, extra: &[&str], script: &Path) -> Result<String, String> {
    let output = std::process::Command::new(sbatch)
        .arg("--parsable")
        .args(extra)
        .arg(script)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", sbatch.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let id = stdout.trim().split(';').next().unwrap_or("").to_string();
    if !output.status.success() || id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "sbatch {} failed ({}): {}{}",
            script.display(),
            output.status,
            stderr.trim(),
            stdout.trim()
        ));
    }
    Ok(id)
}

/// The first executable `name` in the folders of `PATH`.
fn find_in_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planted_links_in_the_output_folder_are_not_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "the user's own file").unwrap();
        let victim_folder = tmp.path().join("victim-folder");
        std::fs::create_dir(&victim_folder).unwrap();
        std::fs::write(victim_folder.join("1.json"), "kept").unwrap();
        let out = tmp.path().join("shared");
        std::fs::create_dir(&out).unwrap();
        for name in ["array.sbatch", "merge.sbatch", "models.json"] {
            std::os::unix::fs::symlink(&victim, out.join(name)).unwrap();
        }
        write_folder(&out, "#!/bin/sh\n", "#!/bin/sh\n", &json!({"models": []})).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the user's own file");
        assert_eq!(std::fs::read_to_string(out.join("array.sbatch")).unwrap(), "#!/bin/sh\n");

        // A planted `shards` link would have its digit-named files removed.
        let out = tmp.path().join("shared2");
        std::fs::create_dir(&out).unwrap();
        std::os::unix::fs::symlink(&victim_folder, out.join("shards")).unwrap();
        let error = write_folder(&out, "", "", &json!({})).unwrap_err();
        assert!(error.contains("symbolic link"), "{error}");
        assert_eq!(std::fs::read_to_string(victim_folder.join("1.json")).unwrap(), "kept");
    }
}
