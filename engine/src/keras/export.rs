//! The export process, supervised as a worker is: its own process group,
//! killed with the supervisor (`PR_SET_PDEATHSIG`), first for the OOM
//! killer, watched against the run's load timeout, its memory limit and
//! the user's interrupts, and, where the run is sandboxed, started through
//! the sandbox launcher ([`super::launch`]) so that Landlock, the network
//! namespace and seccomp bind Python before it reads a model file. One
//! process exports several files in a row (Python with TensorFlow takes
//! seconds to start); when it dies, hangs or overflows during a file in a
//! shared process, that file is exported again alone before it is blamed,
//! and the files after it go to a new process (the executor's crash bisection).

use super::launch::{LaunchSpec, LAUNCH_ARG};
use super::python::Python;
use crate::cancel::CancelToken;
use crate::process::{is_tensorflow_banner, memory_fields, set_child_safety};
use crate::settings::Settings;
use isorun_protocol::{ErrorKind, ModelError, NotRunReason, Outcome, Phase};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The script the export process runs (`python -c`).
const SCRIPT: &str = include_str!("keras_export.py");

/// The SHA-256 (hex) of the export script, part of every cache key: what
/// the export writes depends on it, so an entry written by another script
/// (one that shared traces on the supervisor's grouping alone, say) is not
/// taken for this one's.
pub(super) fn script_sha256() -> String {
    use sha2::Digest;
    super::cache::hex(&sha2::Sha256::digest(SCRIPT.as_bytes()))
}

/// How often the supervising loop looks at deadlines, memory and interrupts.
const TICK: Duration = Duration::from_millis(20);

/// The longest line the export process may send.
const MAX_LINE: u64 = 1 << 20;

/// One file to export, into `out` (which must not exist yet); `id` is the
/// caller's, handed back with its end. Jobs with the same `graph` (the
/// key of their architecture, [`super::files::architecture_digest`] with
/// the toolchain) that one process exports in a row share one trace.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: usize,
    pub file: PathBuf,
    pub out: PathBuf,
    pub graph: Option<String>,
    /// May be frozen (false: the archive's way, after a frozen graph failed its check).
    pub freeze: bool,
    /// A frozen graph's check may be left to the unit's worker (see `frozen_check`).
    pub check_in_worker: bool,
}

/// How one job ended.
#[derive(Debug, Clone)]
pub enum JobEnd {
    /// `check_in_worker`: a frozen graph whose check the export process left to the worker.
    /// `phases`: where the export process says the job's time went, in
    /// order (`keras_export.py`'s laps, from its start to its done); `before`:
    /// what it spent before the job's start (for the first job of a process,
    /// `process_start` from the spawn to its hello, `imports` within that,
    /// `turn` from the hello to the start; for a later one, `cleanup` after
    /// the job before it).
    Exported {
        loader: String,
        ms: u64,
        graph: GraphSource,
        check_in_worker: bool,
        phases: Vec<(String, u64)>,
        before: Vec<(String, u64)>,
    },
    Failed {
        outcome: Outcome,
        stderr: Vec<String>,
    },
}

/// Where an export's graph came from: traced from the file (`Traced`, with
/// Keras's `ExportArchive`; `Frozen`, traced once with the variables folded
/// into constants, for a file no later file shares a graph with: a fraction
/// of the archive's time on a big model, and nothing to restore at load), or
/// the trace of an earlier file of the same architecture with this file's
/// weights written into a copy (`export.graph` of the record and of
/// `export.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphSource {
    Traced,
    Frozen,
    Shared,
}

impl GraphSource {
    pub fn name(self) -> &'static str {
        match self {
            GraphSource::Traced => "traced",
            GraphSource::Frozen => "frozen",
            GraphSource::Shared => "shared",
        }
    }

    pub fn from_name(name: &str) -> Option<GraphSource> {
        [GraphSource::Traced, GraphSource::Frozen, GraphSource::Shared].into_iter().find(|g| g.name() == name)
    }
}

/// How much less a file that shares an earlier file's trace costs than a
/// traced one, in the planning of processes (measured: ~55 ms for
/// `load_weights` and the variables against ~700 ms for a trace and save).
pub const SHARED_PER_TRACE: usize = 8;

/// How many of `jobs`, from the first, one process takes: at most
/// `per_process` traced (a job whose graph is not the one before it), and
/// at most [`SHARED_PER_TRACE`] times that in all.
fn batch_len(jobs: &[&Job], per_process: usize) -> usize {
    let mut traced = 0;
    for (n, job) in jobs.iter().enumerate() {
        let shares = n > 0 && job.graph.is_some() && job.graph == jobs[n - 1].graph;
        if !shares {
            traced += 1;
        }
        if traced > per_process || n >= per_process * SHARED_PER_TRACE {
            return n.max(1);
        }
    }
    jobs.len()
}

/// Takes the next process's jobs from the front of `pending`: as many as
/// [`batch_len`] allows with `per_process`, or one alone when it is 0 (bisection).
fn take_batch(pending: &mut VecDeque<usize>, jobs: &[Job], per_process: usize) -> Vec<usize> {
    let take = match per_process {
        0 => 1,
        n => batch_len(&pending.iter().map(|&i| &jobs[i]).collect::<Vec<_>>(), n),
    };
    pending.drain(..take.min(pending.len())).collect()
}

/// What every export process of a stage shares.
pub struct Exporter<'a> {
    pub python: &'a Python,
    pub settings: &'a Settings,
    pub stop: &'a CancelToken,
    /// Where each process gets its own scratch folder (home, temporary files).
    pub scratch_root: PathBuf,
    /// Told of each job's end as soon as it is known (a file exported early
    /// in a process runs while the process goes on with the next).
    pub on_end: &'a (dyn Fn(&Job, JobEnd) + Sync),
}

impl Exporter<'_> {
    /// Exports every job, `per_process` at a time, running a job that was
    /// in progress when a shared process failed again alone; each end goes
    /// to `on_end`, once.
    pub fn export_all(&self, jobs: &[Job], per_process: usize) {
        let mut pending: VecDeque<usize> = (0..jobs.len()).collect();
        // One at a time (`per_process` 1 and no graph shared, as with
        // --keras-unsafe) follows from `batch_len`; `solo` is for bisection.
        let mut solo = false;
        // The next process, started while the one before it works: it has
        // its own sandbox and its own files, and waits after its
        // `import tensorflow` until it is told to go (its stdin closed).
        let mut next: Option<(Vec<usize>, Result<Started, ProcessFailure>)> = None;
        // The files whose early process ended before it started them: run once more.
        let mut rerun = vec![false; jobs.len()];
        loop {
            if let Some(reason) = self.stop.not_starting() {
                let waiting = next.take().map(|(batch, _)| batch).unwrap_or_default();
                for index in waiting.into_iter().chain(pending.drain(..)) {
                    (self.on_end)(
                        &jobs[index],
                        JobEnd::Failed { outcome: Outcome::NotRun { reason }, stderr: Vec::new() },
                    );
                }
                break;
            }
            let (batch, started) = match next.take() {
                Some(next) => next,
                None if pending.is_empty() => break,
                None => {
                    let batch = take_batch(&mut pending, jobs, if solo { 0 } else { per_process });
                    let started = self.start(&batch.iter().map(|&i| &jobs[i]).collect::<Vec<_>>(), false);
                    (batch, started)
                }
            };
            // The process after this one starts once this one has imported
            // TensorFlow (so that the two imports do not share the cores).
            let mut start_next = || {
                if pending.is_empty() || solo || self.stop.not_starting().is_some() {
                    return;
                }
                let following = take_batch(&mut pending, jobs, per_process);
                let started = self.start(&following.iter().map(|&i| &jobs[i]).collect::<Vec<_>>(), true);
                next = Some((following, started));
            };
            let run = self.run_process(&batch.iter().map(|&i| &jobs[i]).collect::<Vec<_>>(), started, &mut start_next);
            for (position, (end, reported)) in run.ends.into_iter().zip(run.reported).enumerate() {
                let index = batch[position];
                match end {
                    Some(_) if run.ended_unstarted && !rerun[index] => {
                        rerun[index] = true;
                        pending.push_back(index);
                    }
                    Some(end) if !reported => (self.on_end)(&jobs[index], end),
                    Some(_) => {}
                    None => pending.push_back(index),
                }
            }
            if run.shared_failure {
                solo = true;
                // The process started after this one holds a full batch: it
                // goes, and its files wait their turn behind the ones this
                // failure sends to run alone.
                if let Some((following, _)) = next.take() {
                    pending.extend(following);
                }
            }
            // Keep the order: what was not reached goes first next time.
            let mut order: Vec<usize> = pending.drain(..).collect();
            order.sort_unstable();
            pending.extend(order);
        }
    }

    fn command(&self, jobs: &[&Job], scratch: &std::path::Path) -> Result<Command, String> {
        let python = &self.python.program;
        let home = scratch.join("home");
        let tmp = scratch.join("tmp");
        for dir in [&home, &tmp] {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let mut env: Vec<(String, String)> = vec![
            ("HOME".into(), home.display().to_string()),
            ("KERAS_HOME".into(), home.join(".keras").display().to_string()),
            ("TMPDIR".into(), tmp.display().to_string()),
            ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
            ("PYTHONUNBUFFERED".into(), "1".into()),
            // A trace needs no GPU; a SavedModel runs on whatever the worker has.
            ("CUDA_VISIBLE_DEVICES".into(), "".into()),
            ("TF_CPP_MIN_LOG_LEVEL".into(), std::env::var("TF_CPP_MIN_LOG_LEVEL").unwrap_or_else(|_| "2".into())),
        ];
        for name in ["PATH", "PYTHONPATH", "LANG", "LC_ALL", "TF_ENABLE_ONEDNN_OPTS", "ISORUN_EXPORT_HANG"] {
            if let Ok(value) = std::env::var(name) {
                env.push((name.into(), value));
            }
        }
        let args = vec!["-c".to_string(), SCRIPT.to_string()];
        let launcher = self.settings.keras.launcher.as_ref().filter(|_| self.settings.sandbox.is_some());
        let mut command = match (launcher, &self.settings.sandbox) {
            (Some(launcher), Some(sandbox)) => {
                let mut read_paths: Vec<String> = sandbox.read_paths.clone();
                read_paths.extend(self.python.read_paths.iter().map(|p| p.display().to_string()));
                read_paths.push(python.display().to_string());
                read_paths.extend(["/usr/bin", "/bin", "/etc/ssl"].map(String::from));
                read_paths.extend(jobs.iter().map(|j| j.file.display().to_string()));
                read_paths.extend(self.settings.keras.modules.iter().map(|m| m.display().to_string()));
                let spec = LaunchSpec {
                    read_paths,
                    writable: std::iter::once(scratch)
                        .chain(jobs.iter().filter_map(|j| j.out.parent()))
                        .map(|p| p.display().to_string())
                        .collect(),
                    work_dir: scratch.display().to_string(),
                    core_dumps: sandbox.core_dumps,
                    env,
                    program: python.display().to_string(),
                    args,
                };
                let mut command = Command::new(launcher);
                command.arg(LAUNCH_ARG).arg(serde_json::to_string(&spec).map_err(|e| e.to_string())?);
                command.env_clear();
                command
            }
            _ => {
                let mut command = Command::new(python);
                command.args(&args).envs(env).current_dir(scratch);
                command
            }
        };
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // Its own session (set_child_safety): see `process::set_child_safety`.
        set_child_safety(&mut command);
        Ok(command)
    }

    /// Starts one export process over `jobs`: its scratch folder, the
    /// process (sandboxed through the launcher where the run is), its
    /// request, and the threads that read its stdout and stderr. It reads
    /// the request, imports TensorFlow, says hello and then waits for its
    /// stdin to close before it opens a model file. `early`: started while
    /// the process before it still works.
    fn start(&self, jobs: &[&Job], early: bool) -> Result<Started, ProcessFailure> {
        let scratch = super::cache::staging_dir(&self.scratch_root).map_err(|e| {
            let message = format!("{}: cannot make a folder for the export: {e}", self.scratch_root.display());
            Box::new((Outcome::Error(ModelError::new(ErrorKind::ExportFailed, message)), Vec::new()))
        })?;
        let spawn_failed = |message: String| Box::new((Outcome::SpawnFailed { message }, Vec::new()));
        let mut command = match self.command(jobs, &scratch) {
            Ok(command) => command,
            Err(message) => {
                remove_scratch(&scratch);
                return Err(spawn_failed(message));
            }
        };
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                remove_scratch(&scratch);
                return Err(spawn_failed(format!("{}: {e}", self.python.program.display())));
            }
        };
        let request = json!({
            "modules": self.settings.keras.modules,
            "unsafe": self.settings.keras.unsafe_code,
            "jobs": jobs.iter().map(|j| json!({
                "file": j.file, "out": j.out, "graph": j.graph, "freeze": j.freeze,
                "check": if j.check_in_worker { "worker" } else { "here" },
            })).collect::<Vec<_>>(),
        });
        // The request is written, and stdin later closed, on a thread of its
        // own: a request bigger than the pipe blocks until Python reads it,
        // and the supervising loop of the process before must not wait on
        // that. Dropping `go` lets the thread close stdin (this process's turn).
        let (go, turn) = mpsc::channel::<()>();
        if let Some(mut pipe) = child.stdin.take() {
            let line = format!("{request}\n");
            std::thread::spawn(move || {
                if pipe.write_all(line.as_bytes()).is_ok() {
                    let _ = turn.recv();
                }
            });
        }
        let spawned = Instant::now();
        let (lines_tx, lines) = mpsc::channel::<Option<(Instant, String)>>();
        let stdout = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match (&mut reader).take(MAX_LINE).read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if lines_tx.send(Some((Instant::now(), line))).is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = lines_tx.send(None);
        });
        let stderr_tail = std::sync::Arc::new(std::sync::Mutex::new(VecDeque::<String>::new()));
        let stderr = child.stderr.take().expect("piped");
        let tail = std::sync::Arc::clone(&stderr_tail);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).split(b'\n').map_while(Result::ok) {
                if is_tensorflow_banner(&String::from_utf8_lossy(&line[..line.len().min(2000)])) {
                    continue;
                }
                let mut tail = tail.lock().expect("stderr tail");
                if tail.len() == 20 {
                    tail.pop_front();
                }
                tail.push_back(String::from_utf8_lossy(&line[..line.len().min(2000)]).trim_end().to_string());
            }
        });
        Ok(Started { child, go: Some(go), lines, stderr_tail, scratch, early, spawned })
    }

    /// Runs one started export process over `jobs` to its end; `on_hello`
    /// is called once, when it has imported TensorFlow.
    fn run_process(
        &self,
        jobs: &[&Job],
        started: Result<Started, ProcessFailure>,
        on_hello: &mut dyn FnMut(),
    ) -> ProcessRun {
        let mut run = ProcessRun {
            ends: vec![None; jobs.len()],
            reported: vec![false; jobs.len()],
            shared_failure: false,
            ended_unstarted: false,
        };
        let result = started.and_then(|mut started| self.supervise(jobs, &mut started, &mut run, on_hello));
        if let Err(failure) = result {
            let (outcome, stderr) = *failure;
            for end in run.ends.iter_mut().filter(|e| e.is_none()) {
                *end = Some(JobEnd::Failed { outcome: outcome.clone(), stderr: stderr.clone() });
            }
        }
        run
    }

    fn supervise(
        &self,
        jobs: &[&Job],
        started: &mut Started,
        run: &mut ProcessRun,
        on_hello: &mut dyn FnMut(),
    ) -> Result<(), ProcessFailure> {
        // Its stdin closes: go.
        started.go.take();
        let early = started.early;
        let spawned = started.spawned;
        let pid = started.child.id() as i32;
        let stderr_tail = std::sync::Arc::clone(&started.stderr_tail);
        let lines = &started.lines;
        let child = &mut started.child;
        let stderr_lines = || stderr_tail.lock().map(|t| t.iter().cloned().collect::<Vec<_>>()).unwrap_or_default();

        let shared = jobs.len() > 1;
        let began = Instant::now();
        let start_deadline = began + self.settings.start_timeout.max(Duration::from_secs(120));
        let job_limit = self.settings.load_timeout.or(self.settings.timeout);
        let mut current: Option<(usize, Instant)> = None;
        let mut said_hello = false;
        // The jobs start in order, each once: the index the next `start` must name.
        let mut next_start = 0usize;
        let mut last_progress = Instant::now();
        let mut peak = 0u64;
        // The graphs this process exported a file of: only a later file of one may share it.
        let mut graphs_done: Vec<&str> = Vec::new();
        // What the process spent before the current job's start (see `JobEnd::Exported`).
        let mut hello: Option<(Instant, Vec<(String, u64)>)> = None;
        let mut before: Vec<(String, u64)> = Vec::new();
        loop {
            if self.stop.requested() {
                kill_group(child);
                let outcome = Outcome::NotRun { reason: NotRunReason::Interrupted };
                return Err(Box::new((outcome, Vec::new())));
            }
            // A failure during a job: blamed on it when alone, else it runs again alone.
            let job_failed = |child: &mut std::process::Child,
                              run: &mut ProcessRun,
                              current: Option<(usize, Instant)>,
                              said_hello: bool,
                              outcome: Outcome|
             -> Result<(), ProcessFailure> {
                kill_group(child);
                let Some((index, _)) = current else {
                    if shared && said_hello {
                        // Between two files: the files not done run again, singly.
                        run.shared_failure = true;
                        return Ok(());
                    }
                    return Err(Box::new((outcome, stderr_lines())));
                };
                if shared {
                    run.shared_failure = true;
                } else {
                    run.ends[index] = Some(JobEnd::Failed { outcome, stderr: stderr_lines() });
                }
                Ok(())
            };
            if let Some(limit) = self.settings.memory_limit {
                peak = peak.max(memory_fields(&pid.to_string(), &["RssAnon:", "RssShmem:"]).unwrap_or(0));
                if peak > limit {
                    return job_failed(child, run, current, said_hello, Outcome::MemoryLimit { peak_bytes: peak });
                }
            }
            // Before Hello: the start limit. After it, each file (and the
            // modules imported before the first) has the load limit.
            let deadline = match (current, said_hello) {
                (Some((_, since)), _) => job_limit.map(|l| since + l),
                (None, true) => job_limit.map(|l| last_progress + l),
                (None, false) => Some(start_deadline),
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let phase = if said_hello { Phase::Load } else { Phase::Start };
                return job_failed(child, run, current, said_hello, Outcome::Timeout { phase });
            }
            match lines.recv_timeout(TICK) {
                Ok(Some((read_at, line))) => {
                    let message: Value = match serde_json::from_str(&line) {
                        Ok(message) => message,
                        Err(e) => {
                            let outcome =
                                Outcome::ProtocolError { message: format!("export process sent a bad line: {e}") };
                            return job_failed(child, run, current, said_hello, outcome);
                        }
                    };
                    last_progress = Instant::now();
                    let answer = match Answer::parse(&message, said_hello, current.map(|c| c.0), next_start, jobs.len())
                        .and_then(|answer| Ok((answer, milliseconds(&message)?)))
                    {
                        Ok(answer) => answer,
                        Err(message) => {
                            let outcome = Outcome::ProtocolError { message: format!("export process: {message}") };
                            return job_failed(child, run, current, said_hello, outcome);
                        }
                    };
                    let (answer, laps) = answer;
                    if let Answer::Hello = answer {
                        said_hello = true;
                        let start_ms = read_at.saturating_duration_since(spawned).as_millis() as u64;
                        hello = Some((
                            read_at,
                            [("process_start".to_string(), start_ms)].into_iter().chain(laps).collect(),
                        ));
                        on_hello();
                    } else if let Answer::Start(index) = answer {
                        before = match hello.take() {
                            Some((at, mut first)) => {
                                first.push(("turn".into(), read_at.saturating_duration_since(at).as_millis() as u64));
                                first
                            }
                            None => laps,
                        };
                        // Timed from when the lines were read, not from when this loop got to them.
                        current = Some((index, read_at));
                        next_start = index + 1;
                    } else if let Answer::Done { index, loader, graph, check_in_worker } = answer {
                        let job = jobs[index];
                        let ms =
                            current.map_or(0, |(_, since)| read_at.saturating_duration_since(since).as_millis() as u64);
                        let end = if let Some(loader) = loader {
                            let known = job.graph.as_deref().filter(|g| graphs_done.contains(g));
                            if graph == GraphSource::Shared && known.is_none() {
                                let outcome = Outcome::ProtocolError {
                                    message: format!("export process: job {index} shared a graph it was not given"),
                                };
                                return job_failed(child, run, current, said_hello, outcome);
                            }
                            if (graph == GraphSource::Frozen && !job.freeze)
                                || (check_in_worker && !job.check_in_worker)
                            {
                                let outcome = Outcome::ProtocolError {
                                    message: format!(
                                        "export process: job {index} froze or left its check where it was told not to"
                                    ),
                                };
                                return job_failed(child, run, current, said_hello, outcome);
                            }
                            graphs_done.extend(job.graph.as_deref());
                            JobEnd::Exported {
                                loader: loader.to_string(),
                                ms,
                                graph,
                                check_in_worker,
                                phases: laps,
                                before: std::mem::take(&mut before),
                            }
                        } else {
                            let text = message.get("error").and_then(Value::as_str).unwrap_or("unknown error");
                            let error =
                                ModelError::new(ErrorKind::ExportFailed, explain(&job.file, text, self.settings));
                            JobEnd::Failed { outcome: Outcome::Error(error), stderr: stderr_lines() }
                        };
                        (self.on_end)(job, end.clone());
                        run.reported[index] = true;
                        run.ends[index] = Some(end);
                        current = None;
                    }
                }
                Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Stdout closed: the process is ending.
                    let status = match wait_for(child, Duration::from_secs(5)) {
                        Some(status) => status,
                        None => kill_group(child).unwrap_or_else(|| std::process::ExitStatus::from_raw(9)),
                    };
                    if run.ends.iter().all(Option::is_some) {
                        return Ok(());
                    }
                    // Started early and gone before its first file (the OOM
                    // killer's first pick while it waited): none of its files'
                    // doing, so they run again, once, before anything is blamed.
                    run.ended_unstarted = early && next_start == 0;
                    let outcome = match status.signal() {
                        Some(signal) => Outcome::Crashed {
                            signal: Some(signal),
                            core_dumped: status.core_dumped(),
                            exit_code: None,
                        },
                        None => Outcome::Crashed { signal: None, core_dumped: false, exit_code: status.code() },
                    };
                    if !said_hello {
                        // Python itself failed (a broken environment, or the sandbox refused it): every file's error.
                        let stderr = stderr_lines();
                        let last = stderr.iter().rev().find(|l| !l.trim().is_empty()).cloned().unwrap_or_default();
                        let message = format!(
                            "the Keras export process ({}) exited before it started ({status}): {last}",
                            self.python.program.display()
                        );
                        return Err(Box::new((
                            Outcome::Error(ModelError::new(ErrorKind::ExportFailed, message)),
                            stderr,
                        )));
                    }
                    return job_failed(child, run, current, said_hello, outcome);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

/// One line of the export process, checked against where it is: nothing
/// it says is taken on trust, since model code may have written it.
#[derive(Debug, PartialEq)]
enum Answer {
    Hello,
    Start(usize),
    /// `loader` is `Some` (one of [`LOADERS`]) when the file was exported;
    /// `graph` says whether it was traced (also when not said);
    /// `check_in_worker`, a frozen graph's check left to the worker.
    Done {
        index: usize,
        loader: Option<&'static str>,
        graph: GraphSource,
        check_in_worker: bool,
    },
}

/// The loaders an export may name (the `loader` of a record and of `export.json`).
const LOADERS: [&str; 2] = ["keras", "tf_keras"];

impl Answer {
    /// `current`: the job started and not done; `next`: the index the next
    /// `start` must carry; `jobs`: how many the process was given.
    fn parse(
        message: &Value,
        said_hello: bool,
        current: Option<usize>,
        next: usize,
        jobs: usize,
    ) -> Result<Answer, String> {
        let Some(object) = message.as_object() else { return Err("a line that is not a JSON object".into()) };
        let index = |key: &str| object.get(key).and_then(Value::as_u64).and_then(|i| usize::try_from(i).ok());
        if object.contains_key("hello") {
            if said_hello {
                return Err("a second hello".into());
            }
            return Ok(Answer::Hello);
        }
        if !said_hello {
            return Err("an answer before its hello".into());
        }
        if object.contains_key("start") {
            let Some(i) = index("start") else { return Err("a start without a job number".into()) };
            if current.is_some() || i != next || i >= jobs {
                return Err(format!(
                    "started job {i}, expected {}",
                    if next < jobs { next.to_string() } else { "none".into() }
                ));
            }
            return Ok(Answer::Start(i));
        }
        if object.contains_key("done") {
            let Some(i) = index("done") else { return Err("a done without a job number".into()) };
            if current != Some(i) {
                return Err(match current {
                    Some(c) => format!("finished job {i} while job {c} was running"),
                    None => format!("finished job {i}, which was not running"),
                });
            }
            if object.get("ok").and_then(Value::as_bool) != Some(true) {
                return Ok(Answer::Done { index: i, loader: None, graph: GraphSource::Traced, check_in_worker: false });
            }
            let graph = match object.get("graph") {
                None => GraphSource::Traced,
                Some(named) => named.as_str().and_then(GraphSource::from_name).ok_or_else(|| {
                    format!(
                        "finished job {i} with an unknown graph {:?}",
                        named.to_string().chars().take(40).collect::<String>()
                    )
                })?,
            };
            let named = object.get("loader").and_then(Value::as_str).unwrap_or_default();
            let Some(loader) = LOADERS.iter().find(|l| **l == named) else {
                return Err(format!(
                    "finished job {i} with an unknown loader {:?}",
                    named.chars().take(40).collect::<String>()
                ));
            };
            let check_in_worker = match object.get("check") {
                None => false,
                Some(Value::String(way)) if way == "worker" && graph == GraphSource::Frozen => true,
                Some(other) => {
                    return Err(format!(
                        "finished job {i} ({}) with a check {:?}",
                        graph.name(),
                        other.to_string().chars().take(40).collect::<String>()
                    ))
                }
            };
            return Ok(Answer::Done { index: i, loader: Some(loader), graph, check_in_worker });
        }
        Err("a line that is none of hello, start, done".into())
    }
}

/// The most phases one answer's `"ms"` may name, and the longest name.
const MAX_PHASES: usize = 32;
const MAX_PHASE_NAME: usize = 32;

/// An answer's `"ms"`: where the export process says its time went, phase
/// by phase (`keras_export.py`'s `Laps`), in the order it names them; none
/// when it says nothing. Refused unless it is an object of at most
/// [`MAX_PHASES`] names of lower-case letters and `_` (at most
/// [`MAX_PHASE_NAME`] long), each a whole number of milliseconds.
fn milliseconds(message: &Value) -> Result<Vec<(String, u64)>, String> {
    let Some(ms) = message.get("ms") else { return Ok(Vec::new()) };
    let Some(phases) = ms.as_object().filter(|o| o.len() <= MAX_PHASES) else {
        return Err(format!("\"ms\" is not an object of at most {MAX_PHASES} phases"));
    };
    phases
        .iter()
        .map(|(name, value)| {
            let named = !name.is_empty()
                && name.len() <= MAX_PHASE_NAME
                && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
            match value.as_u64() {
                Some(ms) if named => Ok((name.clone(), ms)),
                _ => Err(format!(
                    "a phase {:?} of {} that is not a name and a number of milliseconds",
                    name.chars().take(40).collect::<String>(),
                    value.to_string().chars().take(40).collect::<String>()
                )),
            }
        })
        .collect()
}

/// The export process's stdout as the supervisor takes it, without a
/// process: `stdout` read line by line (each at most `MAX_LINE` bytes, as
/// the reading thread does), each line parsed and held to the protocol for
/// `jobs` files, with the state the supervising loop keeps. What each line
/// came to, in order, ending with the first line refused (then the process
/// would be killed). For the fuzz target `export_answer`; not an API.
pub fn answer_lines(stdout: &[u8], jobs: usize) -> Vec<Result<String, String>> {
    let settings = Settings::builder("worker").build();
    let files: Vec<PathBuf> = (0..jobs).map(|i| PathBuf::from(format!("model{i}.keras"))).collect();
    let mut reader = BufReader::new(stdout);
    let (mut said_hello, mut current, mut next_start) = (false, None::<usize>, 0usize);
    let mut seen = Vec::new();
    loop {
        let mut line = String::new();
        match (&mut reader).take(MAX_LINE).read_line(&mut line) {
            Ok(0) | Err(_) => return seen,
            Ok(_) => {}
        }
        let message: Value = match serde_json::from_str(&line) {
            Ok(message) => message,
            Err(e) => {
                seen.push(Err(format!("export process sent a bad line: {e}")));
                return seen;
            }
        };
        match Answer::parse(&message, said_hello, current, next_start, jobs).and_then(|a| {
            milliseconds(&message)?;
            Ok(a)
        }) {
            Ok(Answer::Hello) => {
                said_hello = true;
                seen.push(Ok("hello".into()));
            }
            Ok(Answer::Start(index)) => {
                current = Some(index);
                next_start = index + 1;
                seen.push(Ok(format!("start {}", files[index].display())));
            }
            Ok(Answer::Done { index, loader, .. }) => {
                let file = &files[index];
                seen.push(Ok(match loader {
                    Some(loader) => format!("{}: exported with {loader}", file.display()),
                    None => {
                        let text = message.get("error").and_then(Value::as_str).unwrap_or("unknown error");
                        explain(file, text, &settings)
                    }
                }));
                current = None;
            }
            Err(message) => {
                seen.push(Err(format!("export process: {message}")));
                return seen;
            }
        }
    }
}

/// A process that failed for every file it had left: the outcome, its stderr.
type ProcessFailure = Box<(Outcome, Vec<String>)>;

/// An export process started and not yet supervised to its end: dropped
/// before then (an interrupt while it waited its turn), it is killed with
/// its group and reaped; its scratch folder goes with it either way.
struct Started {
    child: std::process::Child,
    /// Held while the process waits its turn; dropped to let it go on (the
    /// request's writer closes its stdin).
    go: Option<mpsc::Sender<()>>,
    /// Started before its turn, while the process before it worked.
    early: bool,
    /// Each line with when it was read (a process started early says hello before its turn).
    lines: mpsc::Receiver<Option<(Instant, String)>>,
    /// When it was spawned: the start of its `process_start`.
    spawned: Instant,
    stderr_tail: std::sync::Arc<std::sync::Mutex<VecDeque<String>>>,
    scratch: PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        kill_group(&mut self.child);
        remove_scratch(&self.scratch);
    }
}

/// Kills an export process with its group (it leads one of its own) and
/// reaps it. A child already reaped is not signalled: `try_wait` answers
/// from its kept status, and its group id may be another process's by now.
fn kill_group(child: &mut std::process::Child) -> Option<std::process::ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    // SAFETY: the child is not reaped yet, so its group id is still ours to signal.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    child.wait().ok()
}

/// Removes a process's scratch folder (its home and temporary files).
fn remove_scratch(scratch: &std::path::Path) {
    let _ = std::fs::remove_dir_all(scratch.join("home"));
    let _ = std::fs::remove_dir_all(scratch.join("tmp"));
    let _ = std::fs::remove_dir(scratch);
}

struct ProcessRun {
    /// Per job: how it ended, or `None` to run it again.
    ends: Vec<Option<JobEnd>>,
    /// Per job: its end already went to `on_end`.
    reported: Vec<bool>,
    /// The process failed during a job while holding several: run singly from now on.
    shared_failure: bool,
    /// The process was started early and ended before it started a file.
    ended_unstarted: bool,
}

fn wait_for(child: &mut std::process::Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Keras's own message, with the file, and what to do where isorun knows.
fn explain(file: &std::path::Path, error: &str, settings: &Settings) -> String {
    let mut message = format!("{}: {error}", file.display());
    if let Some(class) = error.split("Could not locate class '").nth(1).and_then(|rest| rest.split('\'').next()) {
        message.push_str(&format!(
            " (custom class {class}: pass the Python file that defines and registers it with --keras-module FILE.py)"
        ));
    } else if error.contains("`Lambda` layer") && !settings.keras.unsafe_code {
        message.push_str(
            " (a Lambda layer holds Python code; --keras-unsafe runs it, inside the export sandbox, if you trust the file)",
        );
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str, said_hello: bool, current: Option<usize>, next: usize) -> Result<Answer, String> {
        Answer::parse(&serde_json::from_str(line).unwrap(), said_hello, current, next, 2)
    }

    #[test]
    fn answer_lines_end_at_the_first_refused_line() {
        let stdout = b"{\"hello\": {}}\n{\"start\": 0}\n{\"done\": 0, \"ok\": true, \"loader\": \"keras\"}\n{\"start\": 3}\n{\"start\": 1}\n";
        let answers = answer_lines(stdout, 2);
        assert_eq!(answers.len(), 4, "{answers:?}");
        assert_eq!(answers[2], Ok("model0.keras: exported with keras".into()));
        assert_eq!(answers[3], Err("export process: started job 3, expected 1".into()));
        let bad = answer_lines(b"{\"hello\": {}}\nnot json\n{\"start\": 0}\n", 1);
        assert!(
            matches!(bad.as_slice(), [Ok(_), Err(e)] if e.starts_with("export process sent a bad line")),
            "{bad:?}"
        );
    }

    #[test]
    fn an_answer_s_phases_are_read_in_order_and_held_to_names_and_numbers() {
        let ms = |line: &str| milliseconds(&serde_json::from_str(line).unwrap());
        assert_eq!(ms(r#"{"start": 0}"#), Ok(Vec::new()));
        assert_eq!(
            ms(r#"{"done": 0, "ms": {"load_model": 7, "archive": 3, "keep": 0}}"#),
            Ok(vec![("load_model".into(), 7), ("archive".into(), 3), ("keep".into(), 0)])
        );
        for bad in [
            r#"{"ms": [1]}"#,
            r#"{"ms": {"load": -1}}"#,
            r#"{"ms": {"load": 1.5}}"#,
            r#"{"ms": {"Load": 1}}"#,
            r#"{"ms": {"": 1}}"#,
            r#"{"ms": {"\u001b[2J": 1}}"#,
        ] {
            assert!(ms(bad).is_err(), "{bad}");
        }
        let many: serde_json::Map<String, Value> =
            (0..=MAX_PHASES).map(|i| (format!("p{}", "a".repeat(i % 20)) + &"_".repeat(i / 20), json!(1))).collect();
        assert!(milliseconds(&json!({ "ms": many })).is_err());
        let long = "a".repeat(MAX_PHASE_NAME + 1);
        assert!(milliseconds(&json!({ "ms": { long: 1 } })).is_err());
        // A line the supervisor refuses for its phases ends the process's answers.
        let answers = answer_lines(b"{\"hello\": {}, \"ms\": {\"imports\": \"soon\"}}\n", 1);
        assert!(matches!(answers.as_slice(), [Err(e)] if e.contains("imports")), "{answers:?}");
    }

    #[test]
    fn the_export_process_is_held_to_its_protocol() {
        assert_eq!(parse(r#"{"hello": {}}"#, false, None, 0), Ok(Answer::Hello));
        assert_eq!(parse(r#"{"start": 0}"#, true, None, 0), Ok(Answer::Start(0)));
        let ok = r#"{"done": 0, "ok": true, "loader": "tf_keras"}"#;
        assert_eq!(
            parse(ok, true, Some(0), 1),
            Ok(Answer::Done { index: 0, loader: Some("tf_keras"), graph: GraphSource::Traced, check_in_worker: false })
        );
        let deferred = r#"{"done": 0, "ok": true, "loader": "keras", "graph": "frozen", "check": "worker"}"#;
        assert_eq!(
            parse(deferred, true, Some(0), 1),
            Ok(Answer::Done { index: 0, loader: Some("keras"), graph: GraphSource::Frozen, check_in_worker: true })
        );
        let failed = r#"{"done": 1, "ok": false, "error": "x"}"#;
        assert_eq!(
            parse(failed, true, Some(1), 2),
            Ok(Answer::Done { index: 1, loader: None, graph: GraphSource::Traced, check_in_worker: false })
        );
        let refused = [
            (r#"{"done": 0, "ok": true, "loader": "keras"}"#, true, None, 1, "not running"),
            (r#"{"done": 1, "ok": true, "loader": "keras"}"#, true, Some(0), 1, "while job 0"),
            (r#"{"done": 7, "ok": true, "loader": "keras"}"#, true, Some(0), 1, "while job 0"),
            (r#"{"start": 0}"#, true, None, 1, "expected 1"),
            (r#"{"start": 1}"#, true, Some(0), 1, "started job 1"),
            (r#"{"start": 2}"#, true, None, 2, "expected none"),
            (r#"{"done": 0, "ok": true, "loader": "keras\n\u001b[2J"}"#, true, Some(0), 1, "unknown loader"),
            (r#"{"done": 0, "ok": true, "loader": "keras", "graph": "borrowed"}"#, true, Some(0), 1, "unknown graph"),
            (
                r#"{"done": 0, "ok": true, "loader": "keras", "check": "worker"}"#,
                true,
                Some(0),
                1,
                "(traced) with a check",
            ),
            (
                r#"{"done": 0, "ok": true, "loader": "keras", "graph": "frozen", "check": "skipped"}"#,
                true,
                Some(0),
                1,
                "with a check \"\\\"skipped",
            ),
            (r#"{"hello": {}}"#, true, None, 0, "second hello"),
            (r#"{"start": 0}"#, false, None, 0, "before its hello"),
            (r#"{"queued": 0}"#, true, None, 0, "none of"),
            (r#"[1]"#, true, None, 0, "not a JSON object"),
        ];
        for (line, hello, current, next, expected) in refused {
            let error = parse(line, hello, current, next).unwrap_err();
            assert!(error.contains(expected), "{line}: {error}");
        }
    }
}
