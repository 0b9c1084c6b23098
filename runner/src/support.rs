//! Helpers every command shares, in one place so that no command calls
//! into another's module: errors as one line with their causes, seconds
//! from flags, the signal thread, the supervisor's own memory.

use crate::output_lock::{lock_outputs, OutputLocks};
use isorun_engine::CancelToken;
use isorun_report::text::lines;
use isorun_report::{build as build_report, write_files as write_report_files, RunInfo};
use serde_json::Value;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// `isorun: warning: MESSAGE` on stderr. Warnings quote folder names and
/// workers' stderr: the message passes `text::lines`, so an escape sequence
/// or carriage return in it reaches the terminal as visible text.
pub fn warn(message: impl std::fmt::Display) {
    let _ = writeln!(io::stderr(), "isorun: warning: {}", lines(&message.to_string()));
}

/// `isorun: error: MESSAGE` on stderr, escaped as [`warn`]'s message is
/// (errors name models, paths and what workers said).
pub fn print_error(message: impl std::fmt::Display) {
    let _ = writeln!(io::stderr(), "isorun: error: {}", lines(&message.to_string()));
}

/// Writes a command's whole output on stdout; a reader that went away
/// (`isorun man | head -1`) is a normal end, exit 0 and no message, as
/// for `run`, `ls` and `inspect`.
pub fn print_stdout(bytes: &[u8]) -> Result<i32, String> {
    let mut out = io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(isorun_protocol::exit_code::OK),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(isorun_protocol::exit_code::OK),
        Err(e) => Err(format!("cannot write to stdout: {e}")),
    }
}

pub use isorun_protocol::with_causes;

/// Locks the output files given, as `(flag, path)` with the paths not
/// given left out, until the locks returned drop; an error is the usage
/// message. `run`, `map`, `rescore` and `report merge` take them before
/// any work, so that two commands never write one file.
pub fn lock_given_outputs(outputs: &[(&'static str, Option<&Path>)]) -> Result<OutputLocks, String> {
    let outputs: Vec<(&'static str, &Path)> = outputs.iter().filter_map(|&(flag, path)| Some((flag, path?))).collect();
    lock_outputs(&outputs).map_err(|e| with_causes(&e))
}

/// Builds the report of a run started at `started_at` and ending now from
/// its records and writes it to the files asked for, `[report, junit,
/// html]`. A failure is said on stderr and `false` returned: the work is
/// done and its records printed, so a lost report fails the run, not its usage.
pub fn write_run_report(
    records: &[Value],
    started_at: SystemTime,
    settings: Value,
    tensorflow_version: Option<String>,
    [json, junit, html]: [Option<&Path>; 3],
) -> bool {
    let info = RunInfo {
        started_at,
        finished_at: SystemTime::now(),
        command: std::env::args().collect(),
        settings,
        tensorflow_version,
    };
    let report = build_report(records, &info);
    match write_report_files(&report, json, junit, html) {
        Ok(()) => true,
        Err(e) => {
            print_error(with_causes(&e));
            false
        }
    }
}

/// A positive number of seconds given for `flag`, or a usage error.
pub fn seconds(flag: &str, value: Option<f64>) -> Result<Option<Duration>, String> {
    match value {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(format!("{flag} {s}: expected a positive number of seconds")),
    }
}

/// First SIGINT/SIGTERM: stop starting work and terminate the workers.
/// Second: kill them at once.
pub fn watch_signals(stop: Arc<CancelToken>) -> io::Result<signal_hook::iterator::backend::Handle> {
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])?;
    let handle = signals.handle();
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        // Stop first, then say so, and never with eprintln!: it panics when
        // stderr is closed (a parent that died), which would end this thread
        // and leave the run unstoppable.
        for signal in signals.forever() {
            let said = if stop.requested() {
                stop.escalate();
                "isorun: killing workers"
            } else {
                stop.request(signal);
                "isorun: interrupted; stopping workers (again to kill them at once)"
            };
            let _ = writeln!(io::stderr(), "{said}");
        }
    })?;
    Ok(handle)
}

/// Whether `-v`'s log lines on stderr get ANSI colours: only on a terminal
/// (`-v 2>v.log` is a plain file), and never with `NO_COLOR` set and not
/// empty; `CLICOLOR_FORCE` (not empty, not `0`) colours a pipe or a file
/// too, `CLICOLOR=0` and `TERM=dumb` turn colours off. `var` reads the
/// environment (a parameter, for tests).
pub fn stderr_colours(stderr_is_terminal: bool, var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| var(name).is_some_and(|v| !v.is_empty());
    if set("NO_COLOR") {
        return false;
    }
    if set("CLICOLOR_FORCE") && var("CLICOLOR_FORCE").as_deref() != Some("0") {
        return true;
    }
    if var("CLICOLOR").as_deref() == Some("0") || var("TERM").as_deref() == Some("dumb") {
        return false;
    }
    stderr_is_terminal
}

/// This process's peak resident memory so far.
pub fn own_peak_rss() -> Option<u64> {
    isorun_engine::memory_fields("self", &["VmHWM:"])
}

/// A fresh, private (mode 0700, `mkdtemp`) empty folder in the temporary
/// folder for sandboxed workers to stand in, removed when dropped. Never a
/// name chosen in advance: another user could create that first, own it,
/// and fill it.
pub fn private_work_dir() -> Result<tempfile::TempDir, String> {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix("isorun-empty-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .map_err(|e| {
            format!(
                "cannot make a private working folder for sandboxed workers in {}: {e}",
                std::env::temp_dir().display()
            )
        })
}

/// The libtensorflow folder for workers: `--libtensorflow-dir`, else the
/// Python environment's TensorFlow, else the cache. Where none is found,
/// `None` if the worker loads one by itself (its build-time RUNPATH, or a
/// `--worker` that needs none), which one `--version` run tells; else the
/// not-found error, which says how to get one (a usage error).
pub fn workers_libtensorflow(
    asked: Option<&std::path::Path>,
    worker: &std::path::Path,
) -> Result<Option<std::path::PathBuf>, String> {
    use isorun_engine::locations::find_libtensorflow;
    match find_libtensorflow(asked) {
        Ok(found) => Ok(Some(found.dir)),
        Err(e) if asked.is_some() => Err(e.to_string()),
        Err(e) => {
            let spec = isorun_engine::SpawnSpec {
                worker: worker.to_path_buf(),
                lib_dir: None,
                args: Vec::new(),
                max_frame: isorun_transport::DEFAULT_MAX_FRAME,
                clean_env: false,
                gpu: None,
            };
            match isorun_engine::worker_version(&spec, std::time::Duration::from_secs(30)) {
                Ok(_) => Ok(None),
                Err(_) => Err(e.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stderr_colours;

    fn colours(terminal: bool, env: &[(&str, &str)]) -> bool {
        stderr_colours(terminal, |name| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn colours_only_on_a_terminal_unless_the_environment_says_otherwise() {
        assert!(colours(true, &[]));
        assert!(!colours(false, &[]), "a file or a pipe gets no colours");
        assert!(!colours(true, &[("NO_COLOR", "1")]));
        assert!(colours(true, &[("NO_COLOR", "")]), "an empty NO_COLOR is unset");
        assert!(colours(false, &[("CLICOLOR_FORCE", "1")]));
        assert!(!colours(false, &[("CLICOLOR_FORCE", "0")]));
        assert!(!colours(false, &[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")]), "NO_COLOR wins");
        assert!(!colours(true, &[("CLICOLOR", "0")]));
        assert!(!colours(true, &[("TERM", "dumb")]));
    }
}
