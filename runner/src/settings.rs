//! `isorun run`'s flags turned into validated settings: the engine's
//! [`Settings`], what becomes of each unit's outputs (`--output-dir`,
//! `--expect`), and of its record (the format, the journal, the reports,
//! `--fail-on`). A problem here is a usage error (exit 2), found before any
//! work starts. Built once per run; the driver (`drive.rs`) reads these,
//! never the flags. `eval`'s settings, built on these, are in [`eval`].

use crate::cli::{ExpectArgs, Format, RunArgs, SandboxMode, SharedRunArgs, SpawnMode as SpawnFlag};
use crate::support::{private_work_dir, seconds, workers_libtensorflow};
use isorun_engine::gpus::{self, nvml};
use isorun_engine::locations::{default_libtensorflow_dir_for, libtensorflow_dir, worker_binary};
use isorun_engine::{OutputSink, Settings, Sinks, SpawnMode, SpawnSpec, WriteNpy, STATUSES};
use isorun_protocol::{SandboxSpec, SessionConfig};
use isorun_report::shard::Shard;
use isorun_tensors::golden::Expect;
use isorun_transport::DEFAULT_MAX_FRAME;
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

pub mod eval;

/// A run's validated settings.
pub struct RunSettings {
    /// What the engine needs.
    pub engine: Settings,
    /// `--output-dir`.
    pub output_dir: Option<PathBuf>,
    /// `--expect`, `--rtol`, `--atol`.
    pub expect: Option<Expect>,
    /// How records print: `--format`, `--json`, else a table on a terminal
    /// and JSON Lines otherwise.
    pub format: Format,
    /// `--summary`.
    pub summary: bool,
    /// `--report`, `--junit`, `--html`.
    pub report: Option<PathBuf>,
    pub junit: Option<PathBuf>,
    pub html: Option<PathBuf>,
    /// `--journal`, and whether to `--resume` from it.
    pub journal: Option<PathBuf>,
    pub resume: bool,
    /// `--fail-on`, checked [default: every status but ok].
    pub fail_on: Vec<String>,
    /// `--max-failures`.
    pub max_failures: Option<u64>,
    /// `--shard`: the `--output-dir` lock is the shard's.
    pub shard: Option<Shard>,
    /// The sandboxed workers' private empty working folder, removed when
    /// the run's settings are dropped (`--sandbox strict` only).
    #[expect(dead_code, reason = "held so the folder lives as long as the run")]
    pub work_dir: Option<tempfile::TempDir>,
}

impl RunSettings {
    /// What becomes of each unit's outputs: written, then compared.
    pub fn sinks(&self) -> Sinks {
        let mut sinks: Vec<Box<dyn OutputSink>> = Vec::new();
        if let Some(dir) = &self.output_dir {
            sinks.push(Box::new(WriteNpy { dir: dir.clone() }));
        }
        if let Some(expect) = &self.expect {
            sinks.push(Box::new(expect.clone()));
        }
        Sinks(sinks)
    }
}

/// Validates `run`'s flags.
pub fn run_settings(args: &RunArgs) -> Result<RunSettings, String> {
    settings(&args.shared, args.given.values, args.given.strict_dtypes, Some(&args.golden))
}

/// Validates the flags `eval` shares with `run` (it takes none of `run`'s own).
pub fn shared_settings(args: &SharedRunArgs) -> Result<RunSettings, String> {
    settings(args, false, false, None)
}

/// The settings of the shared flags, with `run`'s `--values`, `--strict-dtypes` and `--expect`.
fn settings(
    args: &SharedRunArgs,
    values: bool,
    strict_dtypes: bool,
    golden: Option<&ExpectArgs>,
) -> Result<RunSettings, String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut gpus = match &args.gpus {
        Some(list) => gpus::resolve(list, nvml())?,
        None => Vec::new(),
    };
    // No NVIDIA driver at all (no NVML, no /dev/nvidiaN): a worker bound to a
    // device would run on the CPU, so it is bound to none and its record
    // names none. ISORUN_ASSUME_GPUS=1 binds anyway (tests, or devices CUDA
    // reaches that isorun cannot see).
    if !gpus.is_empty()
        && nvml().is_none()
        && !gpus::nvidia_devices_present()
        && std::env::var_os("ISORUN_ASSUME_GPUS").is_none_or(|v| v.is_empty() || v == "0")
    {
        eprintln!(
            "isorun: warning: --gpus {}: this machine has no GPU (no NVIDIA driver: neither NVML nor a /dev/nvidiaN \
             device): the workers run on the CPU and their records name no \"gpu\"",
            gpus.join(",")
        );
        gpus.clear();
    }
    let jobs = args.jobs.unwrap_or(if gpus.is_empty() { cpus } else { gpus.len() * args.workers_per_gpu as usize });
    if jobs == 0 {
        return Err("--jobs 0: expected at least 1".into());
    }
    if let Some(f) = args.gpu_memory_fraction.filter(|f| !(f.is_finite() && *f > 0.0 && *f <= 1.0)) {
        return Err(format!("--gpu-memory-fraction {f}: expected a share above 0 and at most 1"));
    }
    let fair_share = (cpus / jobs).max(1) as u32;
    let worker = worker_binary(args.worker.worker.as_deref())?;
    let lib_dir = gpu_aware_libtensorflow_dir(args, &worker, !gpus.is_empty())?;
    if !gpus.is_empty() {
        gpu_notes(&gpus, jobs);
    }
    let spawn = SpawnSpec {
        worker,
        lib_dir,
        args: args.worker.worker_arg.clone(),
        max_frame: DEFAULT_MAX_FRAME,
        clean_env: args.sandbox == SandboxMode::Strict,
        // Without --gpus, workers see no GPU unless the user's environment names some.
        gpu: (gpus.is_empty() && std::env::var_os("CUDA_VISIBLE_DEVICES").is_none()).then(String::new),
    };
    let work_dir = (args.sandbox == SandboxMode::Strict).then(private_work_dir).transpose()?;
    let sandbox = (args.sandbox == SandboxMode::Strict).then(|| SandboxSpec {
        read_paths: args
            .load_library
            .iter()
            .filter_map(|p| std::path::absolute(p).ok())
            .chain(args.worker.libtensorflow_dir.iter().cloned())
            .map(|p| p.to_string_lossy().into_owned())
            .collect(),
        work_dir: work_dir.as_ref().map(|d| d.path().to_string_lossy().into_owned()),
        core_dumps: args.core_dumps,
    });
    let session = SessionConfig {
        intra_op_threads: args.intra_op_threads.unwrap_or(fair_share),
        inter_op_threads: args.inter_op_threads.unwrap_or(fair_share),
        ops_on_caller_thread: false,
        spin_us: 0,
        // Grow as needed unless a fixed share is asked for.
        gpu_allow_growth: args.gpu_memory_fraction.is_none(),
        gpu_memory_fraction: args.gpu_memory_fraction,
        skip_grappler: false,
    };
    let libraries = args
        .load_library
        .iter()
        .map(|path| {
            std::path::absolute(path)
                .ok()
                .filter(|p| p.is_file())
                .map(|p| p.to_string_lossy().into_owned())
                .ok_or_else(|| format!("--load-library {}: no such file", path.display()))
        })
        .collect::<Result<_, _>>()?;
    let engine = Settings::builder(spawn.worker.clone())
        .spawn(spawn)
        .gpus(gpus)
        .spawn_mode(match args.spawn {
            SpawnFlag::Auto => SpawnMode::Auto,
            SpawnFlag::Zygote => SpawnMode::Zygote,
            SpawnFlag::Exec => SpawnMode::Exec,
        })
        .sandbox(sandbox)
        .signature(args.signature.clone())
        .tags(args.tags.clone())
        .session(session)
        .models_per_worker(args.models_per_worker as usize)
        .spares(args.spares.unwrap_or(default_spares(jobs, cpus)))
        .jobs(jobs)
        .timeout(seconds("--timeout", args.timeout)?)
        .load_timeout(seconds("--load-timeout", args.load_timeout)?)
        .batch_timeout(seconds("--batch-timeout", args.batch_timeout)?)
        .start_timeout(seconds("--start-timeout", Some(args.start_timeout))?.expect("given"))
        .grace(Duration::from_secs(2))
        .values(values)
        .batch_size(args.batch_size.map(|n| n as usize))
        .strict_dtypes(strict_dtypes)
        .memory_limit(args.memory_limit)
        .retries(args.retries)
        .retry_on(statuses("--retry-on", &args.retry_on)?)
        .libraries(libraries)
        .keras(keras_settings(&args.keras)?)
        // Where each unit's time went, in its record: with --report, or -vv.
        .phases(args.report.is_some() || tracing::enabled!(tracing::Level::DEBUG))
        .build();
    let expect = match golden.and_then(|g| g.expect.as_ref().map(|dir| (dir, g))) {
        Some((dir, _)) if !dir.is_dir() => return Err(format!("--expect {}: not a folder", dir.display())),
        Some((dir, golden)) => Some(Expect { dir: dir.clone(), rtol: golden.rtol, atol: golden.atol }),
        None => None,
    };
    let fail_on = if args.fail_on.is_empty() {
        STATUSES[1..].iter().map(|s| s.to_string()).collect()
    } else {
        statuses("--fail-on", &args.fail_on)?
    };
    let format = match (args.json, args.format) {
        (true, _) => Format::Jsonl,
        (false, Some(format)) => format,
        (false, None) if std::io::stdout().is_terminal() => Format::Table,
        (false, None) => Format::Jsonl,
    };
    Ok(RunSettings {
        engine,
        output_dir: args.output_dir.clone(),
        expect,
        format,
        summary: args.summary,
        report: args.report.clone(),
        junit: args.junit.clone(),
        html: args.html.clone(),
        journal: args.journal.clone(),
        resume: args.resume,
        fail_on,
        max_failures: args.max_failures,
        shard: args.shard,
        work_dir,
    })
}

/// The libtensorflow folder for workers: the one asked for; with `--gpus`
/// and none asked for, the GPU build of `scripts/fetch-libtensorflow --gpu`
/// if it is there (else the CPU build, which cannot use a GPU: said once).
fn gpu_aware_libtensorflow_dir(
    args: &SharedRunArgs,
    worker: &std::path::Path,
    gpus: bool,
) -> Result<Option<std::path::PathBuf>, String> {
    let cpu_or_asked = || workers_libtensorflow(args.worker.libtensorflow_dir.as_deref(), worker);
    if !gpus || args.worker.libtensorflow_dir.is_some() {
        return cpu_or_asked();
    }
    let gpu_dir = default_libtensorflow_dir_for("gpu");
    match gpu_dir.as_deref().and_then(|dir| libtensorflow_dir(Some(dir))) {
        Some(dir) => Ok(Some(dir)),
        None => {
            let cpu = cpu_or_asked()?;
            if let (Some(gpu_dir), Some(cpu)) = (&gpu_dir, &cpu) {
                eprintln!(
                    "isorun: warning: --gpus: no GPU build of libtensorflow in {} (scripts/fetch-libtensorflow --gpu \
                     fetches it); workers use {}, which may run on the CPU only",
                    gpu_dir.display(),
                    cpu.display()
                );
            }
            Ok(cpu)
        }
    }
}

/// With `--gpus`: where the devices went, and what cannot be measured.
fn gpu_notes(gpus: &[String], jobs: usize) {
    match nvml() {
        Some(nvml) => {
            let names: Vec<String> = gpus.iter().map(|g| gpus::describe(nvml, g)).collect();
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

/// The statuses given for `flag` (`--retry-on`, `--fail-on`), checked.
pub fn statuses(flag: &str, given: &[String]) -> Result<Vec<String>, String> {
    for status in given {
        if !STATUSES.contains(&status.as_str()) {
            return Err(format!("{flag} {status}: unknown status (one of {})", STATUSES.join(", ")));
        }
    }
    Ok(given.to_vec())
}

/// Spares per slot when `--spares` is not given: a spare's warm-up is CPU
/// the run pays (~90 ms here) to take ~50 ms off its unit, which is worth it
/// only on a CPU the slots leave idle. Measured on 2 CPUs over 40 small
/// models: -j 1 took 5.4 s without spares, 4.5 s with one, 3.9 s with two
/// (the in-process floor: 3.1 s); -j 2 took 3.2 s without and 4.3 s with one.
fn default_spares(jobs: usize, cpus: usize) -> usize {
    if jobs < cpus {
        2
    } else {
        0
    }
}

/// The settings of a run, as reports show them.
pub fn report_settings(args: &SharedRunArgs, run: &RunSettings) -> Value {
    let settings = &run.engine;
    let mut s = serde_json::Map::new();
    s.insert("signature".into(), json!(settings.signature));
    s.insert("tags".into(), json!(settings.tags));
    s.insert("jobs".into(), json!(settings.jobs));
    s.insert("models_per_worker".into(), json!(settings.models_per_worker));
    s.insert("spares".into(), json!(settings.spares));
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
    if let Some(expect) = &run.expect {
        s.insert("expect".into(), json!(expect.dir.to_string_lossy()));
        s.insert("rtol".into(), json!(expect.rtol));
        s.insert("atol".into(), json!(expect.atol));
    }
    if let Some(n) = settings.batch_size {
        s.insert("batch_size".into(), json!(n));
    }
    if settings.strict_dtypes {
        s.insert("strict_dtypes".into(), json!(true));
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

/// `--python`, `--keras-module`, `--keras-unsafe`, `--keras-cache`; the
/// sandbox launcher is this very binary (`isorun __isorun-export-sandbox`).
pub fn keras_settings(args: &crate::cli::KerasArgs) -> Result<isorun_engine::keras::KerasSettings, String> {
    let modules = args
        .keras_modules
        .iter()
        .map(|path| {
            std::path::absolute(path)
                .ok()
                .filter(|p| p.is_file())
                .ok_or_else(|| format!("--keras-module {}: no such file", path.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(python) = args.python.as_ref().filter(|p| p.components().count() > 1 && !p.is_file()) {
        return Err(format!("--python {}: no such file", python.display()));
    }
    Ok(isorun_engine::keras::KerasSettings::new()
        .python(args.python.clone())
        .modules(modules)
        .unsafe_code(args.keras_unsafe)
        .cache_dir(args.keras_cache.as_ref().and_then(|p| std::path::absolute(p).ok()))
        .launcher(std::env::current_exe().ok()))
}
