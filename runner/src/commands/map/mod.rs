//! `isorun map MODULE:FUNCTION [ITEM...]`: check everything that can be
//! checked before a call (the items, the folders, the function itself,
//! which the first zygote imports: a missing module or function is a
//! usage error, exit 2), then call the function on every item in a fresh
//! process (`isorun-map`), printing a record per item in item order,
//! journaling each, and writing the reports `run` writes. Flags, exit
//! codes, signals and output locks are `run`'s.

mod print;

use crate::cli::{Format, MapArgs, SandboxMode};
use crate::error::CliError;
use crate::support::{lock_given_outputs, seconds, watch_signals, with_causes, write_run_report};
use isorun_engine::{CancelToken, STATUSES};
use isorun_map::{Item, MapError, MapSettings, Pool, SandboxSettings};
use isorun_protocol::{exit_code, NotRunReason};
use isorun_report::journal::{read_journal, Journal};
use isorun_report::shard::Shard;
use print::Printer;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// Runs the command; `Err` is a usage error (exit 2).
pub fn main(args: MapArgs, quiet: bool) -> Result<i32, CliError> {
    let started = Instant::now();
    let started_at = SystemTime::now();
    let settings = settings(&args)?;
    let items = shard_items(read_items(&args)?, args.shard);
    let _output_locks = lock_given_outputs(&[
        ("--report", args.report.as_deref()),
        ("--junit", args.junit.as_deref()),
        ("--html", args.html.as_deref()),
        ("--journal", args.journal.as_deref()),
    ])?;
    let retry_on = crate::settings::statuses("--retry-on", &args.retry_on)?;
    let settings = MapSettings { retry_on, ..settings };
    let pool_values_dir = settings.values_dir.clone();
    let report_settings = report_settings(&args, &settings);
    // Ctrl-C and SIGTERM from here on stop the run (and its imports: they
    // can take long) rather than end isorun before its temporary folder goes.
    let stop = Arc::new(CancelToken::new());
    let signals = watch_signals(Arc::clone(&stop)).map_err(|e| format!("cannot install signal handlers: {e}"))?;
    // The function is imported here, before any call: bad input is exit 2.
    let pool = match Pool::start(settings, &|| stop.requested()) {
        Ok(pool) => pool,
        Err(MapError::Stopped) => {
            signals.close();
            return Ok(match stop.signal() {
                libc::SIGTERM => exit_code::TERMINATED,
                _ => exit_code::INTERRUPTED,
            });
        }
        Err(e) => return Err(with_causes(&e).into()),
    };
    let hello = &pool.hello;
    if pool.import_failure.is_none() {
        tracing::info!(
            "zygote ready: pid {}, Python {} ({}), {} thread(s), {}",
            hello.pid,
            hello.python,
            hello.executable,
            hello.threads,
            hello.cuda.as_ref().map_or("no CUDA library mapped".to_string(), |lib| format!("{lib} mapped"))
        );
    }

    let mut resumed: BTreeMap<usize, Value> = BTreeMap::new();
    let mut journal = None;
    let keys: Vec<String> = items.iter().map(|item| pool.identity.unit_key(item)).collect();
    if let Some(path) = &args.journal {
        if args.resume {
            let done = read_journal(path)?;
            for (item, key) in items.iter().zip(&keys) {
                let values_dir = args.values_dir.as_ref().and(pool_values_dir.as_deref());
                let resumed_one = done.get(key).and_then(|r| resumed_record(r, item, &pool.identity.name, values_dir));
                if let Some(record) = resumed_one {
                    resumed.insert(item.index, record);
                }
            }
        }
        journal = Some(Journal::open(path, true)?);
    }
    let to_run: Vec<Item> = items.iter().filter(|item| !resumed.contains_key(&item.index)).cloned().collect();
    tracing::info!(items = items.len(), resumed = resumed.len(), "starting");

    let format = match (args.json, args.format) {
        (true, _) => Format::Jsonl,
        (false, Some(format)) => format,
        (false, None) if std::io::stdout().is_terminal() => Format::Table,
        (false, None) => Format::Jsonl,
    };
    let width = items.iter().map(|item| item.display().chars().count()).max().unwrap_or(4);
    let mut printer = Printer::new(format, STATUSES[1..].iter().map(|s| s.to_string()).collect(), width);
    printer.keep_records = args.report.is_some() || args.junit.is_some() || args.html.is_some();
    // Nobody reading any more (`| head -1`, a Python caller killed): stop
    // then, not at the next record, which a long call would put off.
    let stdout_closed = Arc::new(AtomicBool::new(false));
    super::pipe::watch_stdout(Arc::clone(&stop), Arc::clone(&stdout_closed))
        .map_err(|e| format!("cannot start the thread that watches stdout: {e}"))?;
    let printer_closed = AtomicBool::new(false);
    let closed = || stdout_closed.load(Ordering::SeqCst) || printer_closed.load(Ordering::SeqCst);
    for (index, record) in resumed {
        printer.accept(index, record);
    }
    let mut journal_error = None;
    let mut done: HashSet<usize> = HashSet::new();
    let stopped = || stop.requested();
    pool.run(&to_run, &stopped, &mut |index, mut record| {
        done.insert(index);
        if record["status"] == "not_run" && stop.signal() == 0 && journal_error.is_none() && closed() {
            record["reason"] = NotRunReason::StdoutClosed.name().into();
            record["error"]["message"] = "not run: stdout closed".into();
        }
        if let (Some(journal), false) = (journal.as_mut(), record["status"] == "not_run") {
            if let Err(e) = journal.append(&keys[index], &record) {
                journal_error.get_or_insert(e);
                stop.request(0);
            }
        }
        printer.accept(index, record);
        if printer.broken_pipe {
            printer_closed.store(true, Ordering::SeqCst);
            stop.request(0);
        }
    });
    // Items never started: not_run, saying why.
    let (reason, why) = match stop.signal() {
        0 if journal_error.is_some() => {
            (NotRunReason::Interrupted, "not run: interrupted: the journal could not be written".to_string())
        }
        0 => (NotRunReason::StdoutClosed, "not run: stdout closed".to_string()),
        signal => {
            (NotRunReason::Interrupted, format!("not run: interrupted by {}", isorun_protocol::signal_name(signal)))
        }
    };
    for item in to_run.iter().filter(|item| !done.contains(&item.index)) {
        let record = json!({"item": item.shown, "index": item.index, "function": pool_name(&args),
            "status": "not_run", "reason": reason.name(), "error": {"kind": "not_run", "message": why}});
        printer.accept(item.index, record);
    }
    signals.close();
    if let Some(e) = &journal_error {
        crate::support::print_error(e);
    }
    let mut report_failed = journal_error.is_some();
    if printer.keep_records {
        let records: Vec<Value> = report_units(&printer.records);
        let files = [args.report.as_deref(), args.junit.as_deref(), args.html.as_deref()];
        if !write_run_report(&records, started_at, report_settings, None, files) {
            report_failed = true;
        }
    }
    printer.finish(started.elapsed());
    let _ = quiet;
    Ok(match stop.signal() {
        libc::SIGINT => exit_code::INTERRUPTED,
        libc::SIGTERM => exit_code::TERMINATED,
        _ if printer.broken_pipe || closed() => exit_code::OK,
        _ if printer.failures > 0 || report_failed => exit_code::SOME_FAILED,
        _ => exit_code::OK,
    })
}

fn pool_name(args: &MapArgs) -> String {
    args.target.clone()
}

/// The flags as settings, checked: a problem is a usage error.
fn settings(args: &MapArgs) -> Result<MapSettings, String> {
    let Some((module, function)) = args.target.rsplit_once(':').filter(|(m, f)| !m.is_empty() && !f.is_empty()) else {
        return Err(format!(
            "{}: expected MODULE:FUNCTION (a dotted module or a .py file, a colon, a function name)",
            args.target
        ));
    };
    if args.function_pickle.as_ref().is_some_and(|p| !p.is_file()) {
        return Err(format!(
            "--function-pickle {}: not a file",
            args.function_pickle.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
        ));
    }
    let python = match &args.python {
        Some(python) => find_program(python)
            .ok_or_else(|| format!("--python {}: no such program (a path, or a name on PATH)", python.display()))?,
        None => isorun_engine::keras::python::choose(None)
            .map_err(|_| "no python3 on PATH: name the Python to use with --python or ISORUN_PYTHON".to_string())?,
    };
    let values_dir = match &args.values_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("--values-dir {}: cannot create: {e}", dir.display()))?;
            Some(absolute("--values-dir", dir)?)
        }
        None => None,
    };
    let writable = args.writable.iter().map(|dir| absolute("--writable", dir)).collect::<Result<Vec<_>, _>>()?;
    let sandbox = match args.sandbox {
        SandboxMode::Off => None,
        SandboxMode::Strict => Some(SandboxSettings {
            launcher: std::env::current_exe().map_err(|e| format!("cannot find the isorun binary: {e}"))?,
            writable,
            network: args.network,
        }),
    };
    let start_timeout = seconds("--start-timeout", Some(args.start_timeout))?.unwrap_or_default();
    Ok(MapSettings {
        python,
        module: module.to_string(),
        function: function.to_string(),
        function_pickle: args.function_pickle.clone(),
        preload: args.preload.iter().filter(|m| !m.is_empty()).cloned().collect(),
        jobs: args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1),
        items_per_worker: usize::try_from(args.items_per_worker).unwrap_or(usize::MAX),
        spares: args.spares as usize,
        timeout: seconds("--timeout", args.timeout)?,
        memory_limit: args.memory_limit,
        retries: args.retries,
        retry_on: Vec::new(),
        values_dir,
        value_cap: args.value_cap,
        start_timeout,
        gpus: args.gpus.iter().filter(|g| !g.is_empty()).cloned().collect(),
        sandbox,
    })
}

/// A program as given: a path that is a file, or a bare name found on `PATH`.
fn find_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file())
}

/// An existing folder, made absolute (the sandbox's rules and the zygote
/// both need it so).
fn absolute(flag: &str, dir: &Path) -> Result<PathBuf, String> {
    if !dir.is_dir() {
        return Err(format!("{flag} {}: not a folder", dir.display()));
    }
    std::fs::canonicalize(dir).map_err(|e| format!("{flag} {}: {e}", dir.display()))
}

/// The items: arguments, then --items-from's lines.
pub(crate) fn read_items(args: &MapArgs) -> Result<Vec<Item>, String> {
    let mut items: Vec<Item> = args
        .items
        .iter()
        .enumerate()
        .map(|(i, text)| Item::from_text(i, text).map_err(|reason| format!("item {} ({text:?}): {reason}", i + 1)))
        .collect::<Result<_, _>>()?;
    if let Some(path) = &args.items_from {
        let lines = isorun_map::items::read_lines(path).map_err(|e| with_causes(&e))?;
        let what = format!("--items-from {}", path.display());
        for (number, line) in &lines {
            let index = items.len();
            let item = if args.items_pickled {
                Item::from_pickled_line(index, line, &what, *number).map_err(|e| with_causes(&e))?
            } else {
                Item::from_text(index, line).map_err(|reason| format!("{what} line {number}: {reason}"))?
            };
            items.push(item);
        }
    }
    Ok(items)
}

/// The items of `--shard K/N`, numbered from 0 again (records, journal
/// keys and printing go by position). An item belongs to the shard its
/// name hashes to, as `run --shard` does with model ids ([`item_name`],
/// FNV-1a 64 mod N): the same item is in the same shard whatever else is
/// given, and `isorun slurm submit map` lists them the same way.
fn shard_items(items: Vec<Item>, shard: Option<Shard>) -> Vec<Item> {
    let Some(shard) = shard else { return items };
    let owned = items.into_iter().filter(|item| shard.owns(&item_name(&item.shown)));
    owned.enumerate().map(|(index, item)| Item { index, ..item }).collect()
}

/// An item's name, as report units show it (before `#index` is added to a repeated one).
pub(crate) fn item_name(shown: &Value) -> String {
    match shown {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A journal's record of `item`, as a resumed run prints it, or `None`
/// when it cannot be one (the call runs again): its item, index and
/// function are this run's, and its status must be a finished one. With
/// `--values-dir`, an ok record's value file is copied into this run's
/// folder (the Python API gives each run its own); a record whose file is
/// gone, or that has none, runs again.
fn resumed_record(record: &Value, item: &Item, function: &str, values_dir: Option<&Path>) -> Option<Value> {
    let status = record.get("status")?.as_str()?;
    if status == "not_run" || !STATUSES.contains(&status) {
        return None;
    }
    let mut record = record.clone();
    let fields = record.as_object_mut()?;
    if let (Some(dir), "ok") = (values_dir, status) {
        let from = PathBuf::from(fields.get("value_file")?.as_str()?);
        let to = dir.join(format!("{}.pkl", item.index));
        if from != to {
            let _ = std::fs::remove_file(&to);
            std::fs::copy(&from, &to).ok()?;
        }
        fields.insert("value_file".into(), to.to_string_lossy().into_owned().into());
    }
    fields.insert("item".into(), item.shown.clone());
    fields.insert("index".into(), item.index.into());
    fields.insert("function".into(), function.into());
    fields.insert("resumed".into(), true.into());
    Some(record)
}

/// Records as report units: reports name units by `"model"`; a map
/// record's unit is its item (as tables show it; `#index` added when two
/// items show alike, so that every unit has a name of its own).
fn report_units(records: &[Value]) -> Vec<Value> {
    let mut seen = HashSet::new();
    records
        .iter()
        .map(|record| {
            let mut unit = record.clone();
            let mut name = item_name(&record["item"]);
            if !seen.insert(name.clone()) {
                name = format!("{name} #{}", record["index"]);
                seen.insert(name.clone());
            }
            if let Some(fields) = unit.as_object_mut() {
                fields.insert("model".into(), name.into());
                fields.remove("value");
            }
            unit
        })
        .collect()
}

/// The settings as reports show them.
fn report_settings(args: &MapArgs, settings: &MapSettings) -> Value {
    let mut shown = json!({
        "command": "map",
        "function": args.target,
        "python": settings.python,
        "jobs": settings.jobs,
        "timeout_s": settings.timeout.map(|t| t.as_secs_f64()),
        "memory_limit_bytes": settings.memory_limit,
        "retries": settings.retries,
        "sandbox": settings.sandbox.is_some(),
        "network": args.network,
        "writable": settings.sandbox.as_ref().map(|s| s.writable.clone()).unwrap_or_default(),
    });
    if let Some(shard) = args.shard {
        // `isorun report merge` joins shard reports by it.
        shown["shard"] = shard.to_string().into();
    }
    shown
}
