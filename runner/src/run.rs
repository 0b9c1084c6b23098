//! `isorun run`: validate everything that can be checked before work starts
//! (a problem there is a usage error, exit 2, and nothing is written), then
//! run every model and print one JSON line per model in the order the
//! models were found, each as soon as the ones before it are done.

use crate::cli::{Cli, Command, Format, RunArgs, SandboxMode};
use crate::discover::{discover, latest_versions, Model};
use crate::executor::{run_all, PreparedInputs, Progress, Settings, Stop};
use crate::golden::Expect;
use crate::inputs::load_inputs;
use crate::journal::{read_journal, unit_key, Journal, KeyParts};
use crate::locate::{libtensorflow_dir, worker_binary};
use crate::process::SpawnSpec;
use crate::record::unit_record;
use crate::report::{build as build_report, write_files as write_report_files, RunInfo};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use isorun_protocol::{exit_code, Outcome, SandboxSpec, SessionConfig};
use isorun_transport::DEFAULT_MAX_FRAME;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs the command; `Err` is a usage error (exit 2).
pub fn main(cli: Cli) -> Result<i32, String> {
    match cli.command {
        Command::Run(args) => run(*args, cli.quiet),
        Command::Inspect(args) => crate::inspect::main(&args),
        Command::Ls(args) => crate::ls::main(&args),
        Command::Pipe(args) => crate::pipe::main(&args),
        Command::Doctor(args) => crate::doctor::main(&args),
        Command::Report(command) => crate::report::main(&command),
        Command::Slurm(command) => crate::slurm::main(&command),
        Command::Completions(args) => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(args.shell, &mut command, "isorun", &mut std::io::stdout());
            Ok(exit_code::OK)
        }
        Command::Man => {
            let command = <Cli as clap::CommandFactory>::command();
            clap_mangen::Man::new(command).render(&mut std::io::stdout()).map_err(|e| e.to_string())?;
            Ok(exit_code::OK)
        }
    }
}

/// An empty folder for sandboxed workers to stand in (read only for them),
/// shared by the workers of every isorun run of this user.
fn empty_work_dir() -> Option<String> {
    // SAFETY: getuid has no preconditions.
    let dir = std::env::temp_dir().join(format!("isorun-empty-{}", unsafe { libc::getuid() }));
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir.to_string_lossy().into_owned())
}

/// A positive number of seconds given for `flag`, or a usage error.
pub fn seconds(flag: &str, value: Option<f64>) -> Result<Option<Duration>, String> {
    match value {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(format!("{flag} {s}: expected a positive number of seconds")),
    }
}

fn settings(args: &RunArgs) -> Result<Settings, String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let gpus = match &args.gpus {
        Some(list) => crate::gpu::resolve(list, crate::gpu::nvml())?,
        None => Vec::new(),
    };
    let jobs = args.jobs.unwrap_or(if gpus.is_empty() { cpus } else { gpus.len() * args.workers_per_gpu as usize });
    if jobs == 0 {
        return Err("--jobs 0: expected at least 1".into());
    }
    if let Some(f) = args.gpu_memory_fraction.filter(|f| !(f.is_finite() && *f > 0.0 && *f <= 1.0)) {
        return Err(format!("--gpu-memory-fraction {f}: expected a share above 0 and at most 1"));
    }
    let fair_share = (cpus / jobs).max(1) as u32;
    let worker = worker_binary(args.worker.worker.as_deref())?;
    let lib_dir = gpu_aware_libtensorflow_dir(args, !gpus.is_empty());
    if !gpus.is_empty() {
        gpu_notes(&gpus, jobs);
    }
    Ok(Settings {
        spawn: SpawnSpec {
            worker,
            lib_dir,
            args: args.worker.worker_arg.clone(),
            max_frame: DEFAULT_MAX_FRAME,
            clean_env: args.sandbox == SandboxMode::Strict,
            // Without --gpus, workers see no GPU unless the user's environment names some.
            gpu: (gpus.is_empty() && std::env::var_os("CUDA_VISIBLE_DEVICES").is_none()).then(String::new),
        },
        gpus,
        spawn_mode: args.spawn,
        sandbox: (args.sandbox == SandboxMode::Strict).then(|| SandboxSpec {
            read_paths: args
                .load_library
                .iter()
                .filter_map(|p| std::path::absolute(p).ok())
                .chain(args.worker.libtensorflow_dir.iter().cloned())
                .map(|p| p.to_string_lossy().into_owned())
                .collect(),
            work_dir: empty_work_dir(),
            core_dumps: args.core_dumps,
        }),
        signature: args.signature.clone(),
        tags: args.tags.clone(),
        session: SessionConfig {
            intra_op_threads: args.intra_op_threads.unwrap_or(fair_share),
            inter_op_threads: args.inter_op_threads.unwrap_or(fair_share),
            // Grow as needed unless a fixed share is asked for.
            gpu_allow_growth: args.gpu_memory_fraction.is_none(),
            gpu_memory_fraction: args.gpu_memory_fraction,
        },
        models_per_worker: args.models_per_worker as usize,
        jobs,
        timeout: seconds("--timeout", args.timeout)?,
        load_timeout: seconds("--load-timeout", args.load_timeout)?,
        start_timeout: seconds("--start-timeout", Some(args.start_timeout))?.expect("given"),
        grace: Duration::from_secs(2),
        output_dir: args.output_dir.clone(),
        values: args.values,
        batch_size: args.batch_size.map(|n| n as usize),
        memory_limit: args.memory_limit,
        retries: args.retries,
        retry_on: statuses("--retry-on", &args.retry_on)?,
        expect: match &args.expect {
            Some(dir) if !dir.is_dir() => return Err(format!("--expect {}: not a folder", dir.display())),
            Some(dir) => Some(Expect { dir: dir.clone(), rtol: args.rtol, atol: args.atol }),
            None => None,
        },
        libraries: args
            .load_library
            .iter()
            .map(|path| {
                std::path::absolute(path)
                    .ok()
                    .filter(|p| p.is_file())
                    .map(|p| p.to_string_lossy().into_owned())
                    .ok_or_else(|| format!("--load-library {}: no such file", path.display()))
            })
            .collect::<Result<_, _>>()?,
    })
}

/// The libtensorflow folder for workers: the one asked for; with `--gpus`
/// and none asked for, the GPU build of `scripts/fetch-libtensorflow --gpu`
/// if it is there (else the CPU build, which cannot use a GPU: said once).
fn gpu_aware_libtensorflow_dir(args: &RunArgs, gpus: bool) -> Option<std::path::PathBuf> {
    if !gpus || args.worker.libtensorflow_dir.is_some() {
        return libtensorflow_dir(args.worker.libtensorflow_dir.as_deref());
    }
    let gpu_dir = crate::locate::default_libtensorflow_dir_for("gpu");
    match gpu_dir.as_deref().and_then(|dir| libtensorflow_dir(Some(dir))) {
        Some(dir) => Some(dir),
        None => {
            let cpu = libtensorflow_dir(None);
            if let (Some(gpu_dir), Some(cpu)) = (&gpu_dir, &cpu) {
                eprintln!(
                    "isorun: warning: --gpus: no GPU build of libtensorflow in {} (scripts/fetch-libtensorflow --gpu \
                     fetches it); workers use {}, which runs on the CPU only",
                    gpu_dir.display(),
                    cpu.display()
                );
            }
            cpu
        }
    }
}

/// With `--gpus`: where the devices went, and what cannot be measured.
fn gpu_notes(gpus: &[String], jobs: usize) {
    match crate::gpu::nvml() {
        Some(nvml) => {
            let names: Vec<String> = gpus.iter().map(|g| crate::gpu::describe(nvml, g)).collect();
            tracing::info!("GPUs for the workers: {}", names.join(", "));
        }
        None => eprintln!(
            "isorun: warning: --gpus: NVML (libnvidia-ml.so.1, from the NVIDIA driver) is not available here: the \
             devices are handed to CUDA unchecked and the workers' GPU memory is not measured"
        ),
    }
    if jobs < gpus.len() {
        eprintln!(
            "isorun: warning: --gpus names {} devices but -j is {jobs}: only the first {jobs} are used",
            gpus.len()
        );
    }
}

/// The statuses a unit can end with, for `--retry-on` and `--fail-on`.
const STATUSES: [&str; 9] =
    ["ok", "error", "crashed", "timeout", "memory_limit", "protocol_error", "spawn_failed", "mismatch", "not_run"];

fn statuses(flag: &str, given: &[String]) -> Result<Vec<String>, String> {
    for status in given {
        if !STATUSES.contains(&status.as_str()) {
            return Err(format!("{flag} {status}: unknown status (one of {})", STATUSES.join(", ")));
        }
    }
    Ok(given.to_vec())
}

fn run(args: RunArgs, quiet: bool) -> Result<i32, String> {
    let started = Instant::now();
    let started_at = std::time::SystemTime::now();
    let settings = settings(&args)?;
    let fail_on = if args.fail_on.is_empty() {
        STATUSES[1..].iter().map(|s| s.to_string()).collect()
    } else {
        statuses("--fail-on", &args.fail_on)?
    };
    let mut models =
        discover(&args.models, &mut |warning| eprintln!("isorun: warning: {warning}")).map_err(|e| with_causes(&e))?;
    if args.latest_version {
        models = latest_versions(models);
    }
    if let Some(shard) = args.shard {
        models.retain(|m| shard.owns(&m.id));
    }
    let inputs = load_inputs(&args.input, &args.inputs).map_err(|e| with_causes(&e))?;
    if let Some(dir) = &settings.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("--output-dir {}: cannot create: {e}", dir.display()))?;
    }
    if let Some(dir) = args.inputs_dir.as_ref().filter(|d| !d.is_dir()) {
        return Err(format!("--inputs-dir {}: not a folder", dir.display()));
    }
    let inputs = PreparedInputs::new(inputs, args.inputs_dir.clone());
    let format = match (args.json, args.format) {
        (true, _) => Format::Jsonl,
        (false, Some(format)) => format,
        (false, None) if io::stdout().is_terminal() => Format::Table,
        (false, None) => Format::Jsonl,
    };

    // The journal: keys for every model, and the units already done.
    let mut keys: Vec<Option<String>> = vec![None; models.len()];
    let mut resumed: BTreeMap<usize, Value> = BTreeMap::new();
    let mut journal = None;
    if let Some(path) = &args.journal {
        let settings_text =
            format!("{}\0{:?}\0{:?}\0{:?}", settings.signature, settings.tags, settings.batch_size, settings.libraries);
        let digest = inputs.digest();
        let parts = KeyParts { inputs: &digest, settings: &settings_text, inputs_dir: args.inputs_dir.as_deref() };
        for (model, key) in models.iter().zip(keys.iter_mut()) {
            *key = Some(
                unit_key(model, &parts).map_err(|e| format!("{}: cannot read the model: {e}", model.path.display()))?,
            );
        }
        if args.resume {
            let done = read_journal(path)?;
            for (index, key) in keys.iter().enumerate() {
                if let Some(mut record) = key.as_ref().and_then(|k| done.get(k)).cloned() {
                    record["resumed"] = Value::Bool(true);
                    resumed.insert(index, record);
                }
            }
        }
        journal = Some(Journal::open(path)?);
    }
    let to_run: Vec<usize> = (0..models.len()).filter(|i| !resumed.contains_key(i)).collect();
    let run_models: Vec<Model> = to_run.iter().map(|&i| models[i].clone()).collect();
    tracing::info!(models = models.len(), resumed = resumed.len(), jobs = settings.jobs, "starting");

    let stop = Arc::new(Stop::default());
    let signals = watch_signals(Arc::clone(&stop)).map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let bar = (!quiet && io::stderr().is_terminal()).then(|| progress_bar(models.len() as u64));
    let mut printer = Printer::new(&models, format, bar, fail_on);
    printer.keep_records = args.summary || args.report.is_some() || args.junit.is_some() || args.html.is_some();
    for (index, record) in resumed {
        printer.accept(index, record);
    }
    let mut journal_error = None;
    let mut sandbox_warned = false;
    let tensorflow_version = run_all(&run_models, &inputs, &settings, &stop, &mut |progress| {
        match progress {
            Progress::Started(i) => printer.started(to_run[i]),
            Progress::Finished(report) => {
                let index = to_run[report.index];
                let record = unit_record(&models[index], &report);
                if let (Some(journal), Some(key)) = (journal.as_mut(), &keys[index]) {
                    // Done means journaled: a unit not run to its end is not.
                    if !matches!(report.outcome, Outcome::NotRun { .. }) {
                        if let Err(e) = journal.append(key, &record) {
                            journal_error.get_or_insert(e);
                            stop.request(0);
                        }
                    }
                }
                if let (false, Some(missing)) = (sandbox_warned, record.get("sandbox_missing")) {
                    sandbox_warned = true;
                    eprintln!("isorun: warning: the worker sandbox is incomplete here; not in force: {missing}");
                }
                printer.accept(index, record);
            }
        }
        if printer.broken_pipe {
            // Nobody reads any more (`isorun run ... | head -1`): stop the run quietly.
            stop.request(0);
        }
        if args.max_failures.is_some_and(|n| printer.failures as u64 >= n) {
            stop.drain();
        }
    });
    signals.close();
    if let Some(bar) = &printer.bar {
        bar.finish_and_clear();
    }
    if let Some(e) = &journal_error {
        eprintln!("isorun: error: {e}");
    }

    let records = printer.records;
    let mut report_failed = journal_error.is_some();
    if args.report.is_some() || args.junit.is_some() || args.html.is_some() {
        let info = RunInfo {
            started_at,
            finished_at: std::time::SystemTime::now(),
            command: std::env::args().collect(),
            settings: report_settings(&args, &settings),
            tensorflow_version,
        };
        let report = build_report(&records, &info);
        if let Err(e) = write_report_files(&report, args.report.as_deref(), args.junit.as_deref(), args.html.as_deref())
        {
            // The work is done and its records printed: a lost report fails the run, not its usage.
            eprintln!("isorun: error: {e}");
            report_failed = true;
        }
    }
    if args.summary {
        print_summary(&records, started.elapsed());
    }
    let failed = printer.failures > 0;
    Ok(match stop.signal() {
        libc::SIGINT => exit_code::INTERRUPTED,
        libc::SIGTERM => exit_code::TERMINATED,
        _ if printer.broken_pipe => exit_code::OK,
        _ if failed || report_failed => exit_code::SOME_FAILED,
        _ => exit_code::OK,
    })
}

/// The settings of a run, as reports show them.
fn report_settings(args: &RunArgs, settings: &Settings) -> Value {
    let mut s = serde_json::Map::new();
    s.insert("signature".into(), json!(settings.signature));
    s.insert("tags".into(), json!(settings.tags));
    s.insert("jobs".into(), json!(settings.jobs));
    s.insert("models_per_worker".into(), json!(settings.models_per_worker));
    if let Some(t) = settings.timeout {
        s.insert("timeout_s".into(), json!(t.as_secs_f64()));
    }
    if let Some(t) = settings.load_timeout {
        s.insert("load_timeout_s".into(), json!(t.as_secs_f64()));
    }
    if let Some(limit) = settings.memory_limit {
        s.insert("memory_limit_bytes".into(), json!(limit));
        s.insert("memory_limit_mechanism".into(), json!("supervisor polling of RssAnon+RssShmem every 20 ms"));
    }
    s.insert("retries".into(), json!(settings.retries));
    if settings.retries > 0 {
        s.insert("retry_on".into(), json!(settings.retry_on));
    }
    if let Some(shard) = args.shard {
        s.insert("shard".into(), json!(shard.to_string()));
    }
    if let Some(expect) = &settings.expect {
        s.insert("expect".into(), json!(expect.dir.to_string_lossy()));
        s.insert("rtol".into(), json!(expect.rtol));
        s.insert("atol".into(), json!(expect.atol));
    }
    if let Some(n) = settings.batch_size {
        s.insert("batch_size".into(), json!(n));
    }
    if !settings.gpus.is_empty() {
        s.insert("gpus".into(), json!(settings.gpus));
        s.insert("workers_per_gpu".into(), json!(args.workers_per_gpu));
    }
    if let Some(fraction) = settings.session.gpu_memory_fraction {
        s.insert("gpu_memory_fraction".into(), json!(fraction));
    }
    Value::Object(s)
}

fn progress_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style =
        ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:25}] {pos}/{len} models  {msg}  (ETA {eta})")
            .expect("valid template")
            .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// An error and its causes, as one line: `file.npy: cannot read: No such file or directory`.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Prints records in model order, as soon as the ones before are done,
/// as JSON Lines or table rows, under a progress bar when there is one.
struct Printer<'a> {
    models: &'a [Model],
    format: Format,
    bar: Option<ProgressBar>,
    next: usize,
    waiting: BTreeMap<usize, Value>,
    running: BTreeSet<usize>,
    /// Statuses that count as failures.
    fail_on: Vec<String>,
    failures: usize,
    broken_pipe: bool,
    /// Every record, kept only when a report or summary needs them, so the
    /// supervisor's memory does not grow with the number of units otherwise.
    records: Vec<Value>,
    keep_records: bool,
    id_width: usize,
}

impl<'a> Printer<'a> {
    fn new(models: &'a [Model], format: Format, bar: Option<ProgressBar>, fail_on: Vec<String>) -> Printer<'a> {
        let id_width = models.iter().map(|m| m.id.len()).max().unwrap_or(5).clamp(5, 60);
        Printer {
            models,
            format,
            bar,
            next: 0,
            waiting: BTreeMap::new(),
            running: BTreeSet::new(),
            fail_on,
            failures: 0,
            broken_pipe: false,
            records: Vec::new(),
            keep_records: false,
            id_width,
        }
    }

    fn started(&mut self, index: usize) {
        self.running.insert(index);
        self.update_bar();
    }

    fn update_bar(&self) {
        if let Some(bar) = &self.bar {
            let running: Vec<&str> = self.running.iter().take(3).map(|&i| self.models[i].id.as_str()).collect();
            let more = self.running.len().saturating_sub(running.len());
            let more = if more > 0 { format!(" +{more}") } else { String::new() };
            bar.set_message(format!("{} failed · running: {}{more}", self.failures, running.join(", ")));
        }
    }

    fn accept(&mut self, index: usize, record: Value) {
        self.running.remove(&index);
        if self.fail_on.iter().any(|s| record["status"] == s.as_str()) {
            self.failures += 1;
        }
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
        self.update_bar();
        self.waiting.insert(index, record);
        while let Some(record) = self.waiting.remove(&self.next) {
            if !self.broken_pipe {
                let text = match self.format {
                    Format::Jsonl => record.to_string(),
                    Format::Table => self.table_row(&record),
                };
                let write = || -> io::Result<()> {
                    let mut out = io::stdout().lock();
                    writeln!(out, "{text}")?;
                    out.flush()
                };
                let written = match &self.bar {
                    Some(bar) => bar.suspend(write),
                    None => write(),
                };
                if written.is_err() {
                    self.broken_pipe = true;
                }
            }
            // Values live in the output files and JSON lines, not in reports.
            let mut kept = record;
            if let Some(Value::Object(outputs)) = kept.get_mut("outputs") {
                for output in outputs.values_mut() {
                    if let Value::Object(o) = output {
                        o.remove("values");
                    }
                }
            }
            if self.keep_records {
                self.records.push(kept);
            }
            self.next += 1;
        }
    }

    fn table_row(&self, record: &Value) -> String {
        let header = if self.next == 0 {
            format!(
                "{:<w$}  {:<14}  {:>8}  {:>9}  {}\n",
                "model",
                "status",
                "time",
                "peak mem",
                "outputs / error",
                w = self.id_width
            )
        } else {
            String::new()
        };
        let detail = match record.get("outputs").and_then(Value::as_object) {
            Some(outputs) => outputs
                .iter()
                .map(|(name, o)| {
                    let dims: Vec<String> =
                        o["shape"].as_array().into_iter().flatten().map(|d| d.to_string()).collect();
                    format!("{name} {}[{}]", o["dtype"].as_str().unwrap_or("?"), dims.join(", "))
                })
                .collect::<Vec<_>>()
                .join(", "),
            None => {
                let text = record["error"]["message"].as_str().unwrap_or("");
                let first = text.lines().next().unwrap_or("");
                if first.chars().count() > 100 {
                    format!("{}...", first.chars().take(100).collect::<String>())
                } else {
                    first.to_string()
                }
            }
        };
        let resumed = if record["resumed"] == true { " (resumed)" } else { "" };
        format!(
            "{header}{:<w$}  {:<14}  {:>6.2} s  {:>9}  {detail}{resumed}",
            record["model"].as_str().unwrap_or("?"),
            record["status"].as_str().unwrap_or("?"),
            record["wall_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
            mib(record["peak_rss_bytes"].as_u64()),
            w = self.id_width
        )
    }
}

/// First SIGINT/SIGTERM: stop starting work and terminate the workers.
/// Second: kill them at once.
pub fn watch_signals(stop: Arc<Stop>) -> io::Result<signal_hook::iterator::backend::Handle> {
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])?;
    let handle = signals.handle();
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        for signal in signals.forever() {
            if stop.requested() {
                eprintln!("isorun: killing workers");
                stop.escalate();
            } else {
                eprintln!("isorun: interrupted; stopping workers (again to kill them at once)");
                stop.request(signal);
            }
        }
    })?;
    Ok(handle)
}

/// This process's peak resident memory so far.
pub fn own_peak_rss() -> Option<u64> {
    crate::process::memory_fields("self", &["VmHWM:"])
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("-".into(), |b| format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0)))
}

fn print_summary(records: &[Value], elapsed: Duration) {
    let width = records.iter().filter_map(|r| r["model"].as_str()).map(str::len).max().unwrap_or(5).max(5);
    let mut err = io::stderr().lock();
    let _ = writeln!(err, "\n{:<width$}  {:<14}  {:>9}  {:>12}", "model", "status", "time", "worker peak");
    for r in records {
        let _ = writeln!(
            err,
            "{:<width$}  {:<14}  {:>7.2} s  {:>12}",
            r["model"].as_str().unwrap_or("?"),
            r["status"].as_str().unwrap_or("?"),
            r["wall_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
            mib(r["peak_rss_bytes"].as_u64())
        );
    }
    let ok = records.iter().filter(|r| r["status"] == "ok").count();
    let _ = writeln!(
        err,
        "\n{} models: {ok} ok, {} not ok, in {:.2} s; supervisor peak memory {}",
        records.len(),
        records.len() - ok,
        elapsed.as_secs_f64(),
        mib(own_peak_rss())
    );
    for r in records.iter().filter(|r| r["status"] != "ok") {
        let _ =
            writeln!(err, "  {}: {}", r["model"].as_str().unwrap_or("?"), r["error"]["message"].as_str().unwrap_or(""));
    }
}
