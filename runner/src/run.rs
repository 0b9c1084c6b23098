//! `isorun run`: validate everything that can be checked before work starts
//! (a problem there is a usage error, exit 2, and nothing is written), then
//! run every model and print one JSON line per model in the order the
//! models were found, each as soon as the ones before it are done.

use crate::cli::{Cli, Command, Format, RunArgs};
use crate::discover::{discover, latest_versions, Model};
use crate::executor::{run_all, PreparedInputs, Progress, Settings, Stop, UnitReport};
use crate::inputs::load_inputs;
use crate::locate::{libtensorflow_dir, worker_binary};
use crate::process::SpawnSpec;
use crate::record::unit_record;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use isorun_protocol::{exit_code, SessionConfig};
use isorun_transport::DEFAULT_MAX_FRAME;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs the command; `Err` is a usage error (exit 2).
pub fn main(cli: Cli) -> Result<i32, String> {
    match cli.command {
        Command::Run(args) => run(args, cli.quiet),
        Command::Inspect(args) => crate::inspect::main(&args),
        Command::Ls(args) => crate::ls::main(&args),
        Command::Pipe(args) => crate::pipe::main(&args),
        Command::Doctor(args) => crate::doctor::main(&args),
        Command::Report(command) => crate::report::main(&command),
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

fn seconds(flag: &str, value: Option<f64>) -> Result<Option<Duration>, String> {
    match value {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(format!("{flag} {s}: expected a positive number of seconds")),
    }
}

fn settings(args: &RunArgs) -> Result<Settings, String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = args.jobs.unwrap_or(cpus);
    if jobs == 0 {
        return Err("--jobs 0: expected at least 1".into());
    }
    let fair_share = (cpus / jobs).max(1) as u32;
    let worker = worker_binary(args.worker.worker.as_deref())?;
    Ok(Settings {
        spawn: SpawnSpec {
            worker,
            lib_dir: libtensorflow_dir(args.worker.libtensorflow_dir.as_deref()),
            args: args.worker.worker_arg.clone(),
            max_frame: DEFAULT_MAX_FRAME,
        },
        signature: args.signature.clone(),
        tags: args.tags.clone(),
        session: SessionConfig {
            intra_op_threads: args.intra_op_threads.unwrap_or(fair_share),
            inter_op_threads: args.inter_op_threads.unwrap_or(fair_share),
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

fn run(args: RunArgs, quiet: bool) -> Result<i32, String> {
    let started = Instant::now();
    let settings = settings(&args)?;
    let mut models =
        discover(&args.models, &mut |warning| eprintln!("isorun: warning: {warning}")).map_err(|e| with_causes(&e))?;
    if args.latest_version {
        models = latest_versions(models);
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
    tracing::info!(models = models.len(), jobs = settings.jobs, "starting");

    let stop = Arc::new(Stop::default());
    let signals = watch_signals(Arc::clone(&stop)).map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let bar = (!quiet && io::stderr().is_terminal()).then(|| progress_bar(models.len() as u64));
    let mut printer = Printer::new(&models, format, bar);
    run_all(&models, &inputs, &settings, &stop, &mut |progress| {
        match progress {
            Progress::Started(index) => printer.started(index),
            Progress::Finished(report) => printer.accept(*report),
        }
        if printer.broken_pipe {
            // Nobody reads any more (`isorun run ... | head -1`): stop the run quietly.
            stop.request(0);
        }
    });
    signals.close();
    if let Some(bar) = &printer.bar {
        bar.finish_and_clear();
    }

    let reports = printer.reports;
    if args.summary {
        print_summary(&models, &reports, started.elapsed());
    }
    Ok(match stop.signal() {
        libc::SIGINT => exit_code::INTERRUPTED,
        libc::SIGTERM => exit_code::TERMINATED,
        _ if printer.broken_pipe => exit_code::OK,
        _ if reports.iter().all(|r| r.outcome.is_ok()) => exit_code::OK,
        _ => exit_code::SOME_FAILED,
    })
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
    waiting: BTreeMap<usize, UnitReport>,
    running: BTreeSet<usize>,
    failures: usize,
    broken_pipe: bool,
    reports: Vec<UnitReport>,
    id_width: usize,
}

impl<'a> Printer<'a> {
    fn new(models: &'a [Model], format: Format, bar: Option<ProgressBar>) -> Printer<'a> {
        let id_width = models.iter().map(|m| m.id.len()).max().unwrap_or(5).clamp(5, 60);
        Printer {
            models,
            format,
            bar,
            next: 0,
            waiting: BTreeMap::new(),
            running: BTreeSet::new(),
            failures: 0,
            broken_pipe: false,
            reports: Vec::new(),
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

    fn accept(&mut self, report: UnitReport) {
        self.running.remove(&report.index);
        if !report.outcome.is_ok() {
            self.failures += 1;
        }
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
        self.update_bar();
        self.waiting.insert(report.index, report);
        while let Some(report) = self.waiting.remove(&self.next) {
            if !self.broken_pipe {
                let text = match self.format {
                    Format::Jsonl => unit_record(&self.models[report.index], &report).to_string(),
                    Format::Table => self.table_row(&report),
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
            self.reports.push(report);
            self.next += 1;
        }
    }

    fn table_row(&self, report: &UnitReport) -> String {
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
        let detail = if report.outcome.is_ok() {
            report
                .outputs
                .iter()
                .map(|o| {
                    let dims: Vec<String> = o.shape.iter().map(u64::to_string).collect();
                    format!("{} {}[{}]", o.name, o.dtype, dims.join(", "))
                })
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            let text = report.outcome.to_string();
            let first = text.lines().next().unwrap_or("");
            if first.chars().count() > 100 {
                format!("{}...", first.chars().take(100).collect::<String>())
            } else {
                first.to_string()
            }
        };
        format!(
            "{header}{:<w$}  {:<14}  {:>6.2} s  {:>9}  {detail}",
            self.models[report.index].id,
            report.outcome.status(),
            report.wall.as_secs_f64(),
            mib(report.peak_rss_bytes),
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
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("-".into(), |b| format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0)))
}

fn print_summary(models: &[Model], reports: &[UnitReport], elapsed: Duration) {
    let width = models.iter().map(|m| m.id.len()).max().unwrap_or(5).max(5);
    let mut err = io::stderr().lock();
    let _ = writeln!(err, "\n{:<width$}  {:<14}  {:>9}  {:>12}", "model", "status", "time", "worker peak");
    for report in reports {
        let _ = writeln!(
            err,
            "{:<width$}  {:<14}  {:>7.2} s  {:>12}",
            models[report.index].id,
            report.outcome.status(),
            report.wall.as_secs_f64(),
            mib(report.peak_rss_bytes)
        );
    }
    let ok = reports.iter().filter(|r| r.outcome.is_ok()).count();
    let _ = writeln!(
        err,
        "\n{} models: {ok} ok, {} not ok, in {:.2} s; supervisor peak memory {}",
        reports.len(),
        reports.len() - ok,
        elapsed.as_secs_f64(),
        mib(own_peak_rss())
    );
    for report in reports.iter().filter(|r| !r.outcome.is_ok()) {
        let _ = writeln!(err, "  {}: {}", models[report.index].id, report.outcome);
    }
}
