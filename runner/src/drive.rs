//! What `run` and `eval` share once their own inputs are ready: the
//! journal (keys, resume), the engine's run with its printer, signals and
//! `--max-failures`, the reports and the exit code. One driver, so that
//! the two commands cannot drift apart.

use crate::cli::{Format, SharedRunArgs};
use crate::error::CliError;
use crate::printer::{print_summary, progress_bar, Printer};
use crate::settings::RunSettings;
use crate::support::{lock_given_outputs, watch_signals, with_causes, write_run_report};
use isorun_engine::{
    discover, latest_versions, worker_version, CancelToken, Engine, Event, Feed, Model, PreparedInputs, Settings, Sinks,
};
use isorun_protocol::{exit_code, signal_name, NotRunReason, Outcome};
use isorun_report::journal::{read_journal, resumed_record, runtime_identity, unit_key, Journal, KeyParts};
use isorun_report::record::unit_record;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{self, IsTerminal};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// What the units are given.
pub enum Work<'a> {
    /// One set of inputs for every model; outputs go to the sinks.
    Inputs { inputs: &'a PreparedInputs, sinks: &'a Sinks },
    /// A stream of batches per unit (`eval`).
    Feed(&'a dyn Feed),
}

/// A validated run, ready to go.
pub struct Plan<'a> {
    /// The run's settings, checked once (`crate::settings`).
    pub run: &'a RunSettings,
    pub quiet: bool,
    pub started: Instant,
    pub started_at: SystemTime,
    pub engine: Settings,
    pub models: Vec<Model>,
    pub work: Work<'a>,
    /// What, besides the model, decides a unit's result, for journal keys:
    /// a digest of the inputs (or data) and the settings that matter.
    pub key_inputs: Vec<u8>,
    pub key_settings: String,
    /// `run --inputs-dir`: each model's input files are part of its key.
    pub inputs_dir: Option<std::path::PathBuf>,
    /// `--expect`: the golden files of each model are part of its key.
    pub expect_dir: Option<std::path::PathBuf>,
    /// The settings as reports show them.
    pub report_settings: Value,
}

/// The models of a run: discovered, `--latest-version`, `--shard`.
pub fn discover_models(args: &SharedRunArgs) -> Result<Vec<Model>, String> {
    let mut models =
        discover(&args.models, &mut |warning| crate::support::warn(warning)).map_err(|e| with_causes(&e))?;
    if args.latest_version {
        models = latest_versions(models);
    }
    if let Some(shard) = args.shard {
        models.retain(|m| shard.owns(&m.id));
    }
    Ok(models)
}

/// Whether a journaled record has an output whose values were not kept
/// (its line was written by a run without `--values`).
fn lacks_values(record: &Value) -> bool {
    record
        .get("outputs")
        .and_then(Value::as_object)
        .is_some_and(|outputs| outputs.values().any(|output| output.get("values").is_none()))
}

/// Runs the plan: resumes from the journal, runs the rest, prints a record
/// per model in model order, writes the reports; the exit code.
pub fn execute(plan: Plan) -> Result<i32, CliError> {
    let Plan {
        run,
        quiet,
        started,
        started_at,
        engine: settings,
        models,
        work,
        key_inputs,
        key_settings,
        inputs_dir,
        expect_dir,
        report_settings,
    } = plan;
    // Before any work: another run writing one of these files would lose
    // this run's models, or this run its.
    let mut output_locks = lock_given_outputs(&[
        ("--report", run.report.as_deref()),
        ("--junit", run.junit.as_deref()),
        ("--html", run.html.as_deref()),
        ("--journal", run.journal.as_deref()),
    ])?;
    if let Some(folder) = &run.output_dir {
        let shard = run.shard.map(|shard| (shard.index, shard.count));
        output_locks.lock_folder("--output-dir", folder, shard).map_err(|e| with_causes(&e))?;
    }
    let settings = &settings;
    let (format, fail_on) = (run.format, run.fail_on.clone());

    // The journal: keys for every model, and the units already done.
    let mut keys: Vec<Option<String>> = vec![None; models.len()];
    let mut resumed: BTreeMap<usize, Value> = BTreeMap::new();
    let mut journal = None;
    if let Some(path) = &run.journal {
        // The worker and TensorFlow that will compute: asked once, before any key.
        let version = worker_version(&settings.spawn, Duration::from_secs(60));
        if let Err(e) = &version {
            tracing::warn!("cannot ask the worker its version for the journal's keys: {e}");
        }
        let runtime = runtime_identity(&settings.spawn.worker, &version)?;
        let parts = KeyParts {
            inputs: &key_inputs,
            settings: &key_settings,
            inputs_dir: inputs_dir.as_deref(),
            expect_dir: expect_dir.as_deref(),
            runtime: &runtime,
        };
        for (model, key) in models.iter().zip(keys.iter_mut()) {
            *key = Some(
                unit_key(model, &parts).map_err(|e| format!("{}: cannot read the model: {e}", model.path.display()))?,
            );
        }
        if run.resume {
            let done = read_journal(path)?;
            let mut without_values = 0;
            for (index, key) in keys.iter().enumerate() {
                let record = key.as_ref().and_then(|k| done.get(k)).cloned();
                if let Some(record) = record.and_then(|record| resumed_record(record, &models[index])) {
                    // A line written without --values cannot give the values
                    // this run asks for: the unit runs again.
                    if settings.values && lacks_values(&record) {
                        without_values += 1;
                        continue;
                    }
                    resumed.insert(index, record);
                }
            }
            if without_values > 0 {
                eprintln!(
                    "isorun: warning: {without_values} unit(s) in the journal were written without --values; \
                     running them again for their values"
                );
            }
        }
        journal = Some(Journal::open(path, settings.values)?);
    }
    let to_run: Vec<usize> = (0..models.len()).filter(|i| !resumed.contains_key(i)).collect();
    let run_models: Vec<Model> = to_run.iter().map(|&i| models[i].clone()).collect();
    tracing::info!(models = models.len(), resumed = resumed.len(), jobs = settings.jobs, "starting");

    let engine = Engine::new(settings.clone()).map_err(|e| with_causes(&e))?;
    let stop = Arc::new(CancelToken::new());
    let signals = watch_signals(Arc::clone(&stop)).map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let bar = (!quiet && io::stderr().is_terminal()).then(|| progress_bar(models.len() as u64));
    let mut printer = Printer::new(&models, format, bar, fail_on);
    printer.keep_records =
        (run.summary && format == Format::Jsonl) || run.report.is_some() || run.junit.is_some() || run.html.is_some();
    for (index, record) in resumed {
        printer.accept(index, record);
    }
    let mut journal_error = None;
    let mut stopped = None;
    let mut sandbox_warned = false;
    let on_event = &mut |event| {
        match event {
            Event::Started(i) => printer.started(to_run[i]),
            Event::Finished(report) => {
                let index = to_run[report.index];
                let mut record = unit_record(&models[index], &report);
                name_the_limit(&mut record, settings);
                if matches!(report.outcome, Outcome::NotRun { reason: NotRunReason::Interrupted }) {
                    // The stop came from outside if this run did not ask for it.
                    let why = *stopped.get_or_insert(Stopped::Signal(stop.signal()));
                    say_why_not_run(&mut record, why);
                }
                if let (Some(journal), Some(key)) = (journal.as_mut(), &keys[index]) {
                    // Done means journaled: a unit not run to its end is not.
                    if !matches!(report.outcome, Outcome::NotRun { .. }) {
                        if let Err(e) = journal.append(key, &record) {
                            journal_error.get_or_insert(e);
                            if !stop.requested() {
                                stopped = Some(Stopped::JournalFailed);
                            }
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
            _ => {}
        }
        if printer.broken_pipe {
            // Nobody reads any more (`isorun run ... | head -1`): stop the run quietly.
            if !stop.requested() {
                stopped = Some(Stopped::StdoutClosed);
            }
            stop.request(0);
        }
        if run.max_failures.is_some_and(|n| printer.failures as u64 >= n) {
            stop.drain();
        }
    };
    let tensorflow_version = match work {
        Work::Inputs { inputs, sinks } => engine.run(&run_models, inputs, &stop, on_event, sinks),
        Work::Feed(feed) => engine.run_feed(&run_models, feed, &stop, on_event),
    }
    .tensorflow_version;
    signals.close();
    if let Some(bar) = &printer.bar {
        bar.finish_and_clear();
    }
    if let Some(e) = &journal_error {
        crate::support::print_error(e);
    }

    let records = std::mem::take(&mut printer.records);
    let mut report_failed = journal_error.is_some();
    if run.report.is_some() || run.junit.is_some() || run.html.is_some() {
        let files = [run.report.as_deref(), run.junit.as_deref(), run.html.as_deref()];
        if !write_run_report(&records, started_at, report_settings, tensorflow_version, files) {
            report_failed = true;
        }
    }
    // A table ends with its totals line; JSON Lines get the table and totals on stderr with --summary.
    printer.finish(started.elapsed());
    if run.summary && format == Format::Jsonl {
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

/// Why a run stopped before its end, as the records of the units it did
/// not run to their end say: the engine says only `interrupted`.
#[derive(Debug, Clone, Copy)]
enum Stopped {
    /// Nobody reads stdout any more (`isorun run ... | head -1`).
    StdoutClosed,
    /// The journal could not be written.
    JournalFailed,
    /// A signal (Ctrl-C, SIGTERM); 0 when the caller gave none.
    Signal(i32),
}

/// Rewrites an `interrupted` record (and its attempts) to say why the run
/// stopped: a closed stdout is `stdout_closed`, not an interruption nobody
/// made; a signal or a journal that failed is named in the message.
fn say_why_not_run(record: &mut Value, why: Stopped) {
    let (reason, message) = match why {
        Stopped::StdoutClosed => (
            NotRunReason::StdoutClosed.name(),
            "not run: stdout closed: nobody read isorun's output any more (as after `| head -1`), so the run stopped"
                .to_string(),
        ),
        Stopped::JournalFailed => {
            (NotRunReason::Interrupted.name(), "not run: interrupted: the journal could not be written".to_string())
        }
        Stopped::Signal(0) => return,
        Stopped::Signal(signal) => {
            let key = if signal == libc::SIGINT { " (Ctrl-C)" } else { "" };
            (NotRunReason::Interrupted.name(), format!("not run: interrupted by {}{key}", signal_name(signal)))
        }
    };
    let attempts = record.get_mut("attempts").and_then(Value::as_array_mut).map(|a| a.iter_mut().collect::<Vec<_>>());
    let rewrite = |r: &mut Value| {
        if r["reason"] == NotRunReason::Interrupted.name() {
            r["reason"] = reason.into();
            if let Some(error) = r.get_mut("error").and_then(Value::as_object_mut) {
                error.insert("message".into(), message.clone().into());
            }
        }
    };
    for attempt in attempts.into_iter().flatten() {
        rewrite(attempt);
    }
    rewrite(record);
}

/// A timeout or memory-limit record's message names the limit that was hit
/// (`timeout while in phase start (limit: --timeout 0.05 s)`), which the
/// engine's outcome does not carry.
fn name_the_limit(record: &mut Value, settings: &Settings) {
    let limit = match (record["status"].as_str(), record["phase"].as_str()) {
        (Some("timeout"), Some(phase)) => {
            let mut limits: Vec<(&str, Duration)> = Vec::new();
            if phase == "start" {
                limits.push(("--start-timeout", settings.start_timeout));
            }
            if matches!(phase, "start" | "load") {
                limits.extend(settings.load_timeout.map(|t| ("--load-timeout", t)));
            }
            if phase == "run" {
                limits.extend(settings.batch_timeout.map(|t| ("--batch-timeout", t)));
            }
            limits.extend(settings.timeout.map(|t| ("--timeout", t)));
            let Some((flag, limit)) = limits.into_iter().min_by_key(|(_, t)| *t) else { return };
            format!("limit: {flag} {} s", limit.as_secs_f64())
        }
        (Some("memory_limit"), _) => match settings.memory_limit {
            Some(limit) => format!("limit: --memory-limit {}", isorun_protocol::human_bytes(limit)),
            None => return,
        },
        _ => return,
    };
    if let Some(Value::String(message)) = record.get_mut("error").and_then(|e| e.get_mut("message")) {
        *message = format!("{message} ({limit})");
    }
}
