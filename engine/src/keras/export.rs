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
//!
//! Here: which files each process takes and the supervising loop. Its
//! parts: `job` (a file to export and how it ended), `command` (the
//! script, environment and sandbox spec it starts with), `protocol` (what
//! it may say on its stdout) and `child` (its handle, killed and cleaned
//! up when dropped).

mod child;
mod command;
mod job;
mod protocol;

use super::python::Python;
use crate::cancel::CancelToken;
use crate::process::{is_tensorflow_banner, memory_fields};
use crate::settings::Settings;
use child::{kill_group, remove_scratch, wait_for, Started};
use command::command;
use isorun_protocol::{ErrorKind, ModelError, NotRunReason, Outcome, Phase};
use protocol::{explain, milliseconds, Answer, MAX_LINE};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub(super) use command::script_sha256;
pub use job::{GraphSource, Job, JobEnd};
pub use protocol::answer_lines;

/// How often the supervising loop looks at deadlines, memory and interrupts.
const TICK: Duration = Duration::from_millis(20);

/// How much less a file that shares an earlier file's trace costs than a
/// traced one, in the planning of processes (measured: ~55 ms for
/// `load_weights` and the variables against ~700 ms for a trace and save).
pub const SHARED_PER_TRACE: usize = 8;

/// How many of `jobs`, from the first, one process takes: at most
/// `per_process` traced (a job whose graph is not the one before it), and
/// at most [`SHARED_PER_TRACE`] times that in all.
pub(super) fn batch_len(jobs: &[&Job], per_process: usize) -> usize {
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
        let mut command = match command(self.python, self.settings, jobs, &scratch) {
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

/// A process that failed for every file it had left: the outcome, its stderr.
type ProcessFailure = Box<(Outcome, Vec<String>)>;

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
