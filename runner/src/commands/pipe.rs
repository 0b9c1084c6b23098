//! `isorun pipe MODEL`: one model kept in a worker, fed JSON Lines on stdin,
//! answering one JSON line per non-blank input line on stdout, in order and
//! flushed at once. The worker is recycled after `--recycle-after` requests
//! or past `--recycle-rss`, and restarted after a crash (the request it was
//! running gets an error line); after `--max-restarts` crashes in a row
//! every remaining line gets an error line and the exit code is 1.
//!
//! When the reader of stdout leaves (`isorun pipe m | head -1`), pipe stops
//! at once, the request running included (a thread watches stdout: no line
//! is waited for, no request run, whose answer nobody can read), exits 0 as
//! a tool in a pipeline does, and says on stderr that stdout closed and
//! what was left unanswered: not an interruption nobody made.

use crate::cli::{PipeArgs, SandboxMode, SpawnMode};
use crate::error::CliError;
use crate::support::{private_work_dir, seconds, watch_signals, workers_libtensorflow};
use isorun_engine::locations::worker_binary;
use isorun_engine::{is_saved_model, CancelToken, SpawnSpec, WorkerSession};
use isorun_protocol::{exit_code, Outcome, RunRequest, SandboxSpec, SessionConfig, SignatureInfo, Tensor};
use isorun_tensors::batch::{join, split};
use isorun_tensors::json_input::signature_of;
use isorun_tensors::pipe;
use isorun_transport::DEFAULT_MAX_FRAME;
use serde_json::Value;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The model being served, and the worker session serving it.
struct Server<'a> {
    args: &'a PipeArgs,
    session: WorkerSession,
    model_dir: PathBuf,
    signature: SignatureInfo,
    config: SessionConfig,
    stop: &'a CancelToken,
    /// Stdout's reader left: what stopped the command, if `stop` was asked.
    stdout_closed: Arc<AtomicBool>,
    /// Limit on each request.
    timeout: Option<Duration>,
    /// Confine the worker (`--sandbox strict`) to this private empty
    /// working folder (removed when the server is dropped).
    sandbox: Option<tempfile::TempDir>,
}

impl Server<'_> {
    fn request(&self, inputs: Vec<(String, Tensor)>, load_only: bool) -> RunRequest {
        RunRequest {
            unit: 0,
            model_dir: self.model_dir.to_string_lossy().into_owned(),
            tags: self.args.tags.clone(),
            signature: self.args.signature.clone(),
            inputs,
            config: self.config,
            load_only,
            libraries: Vec::new(),
            sandbox: self.sandbox.as_ref().map(|work_dir| SandboxSpec {
                read_paths: std::iter::once(self.model_dir.to_string_lossy().into_owned())
                    .chain(isorun_engine::onnx_read_paths(&self.model_dir))
                    .collect(),
                work_dir: Some(work_dir.path().to_string_lossy().into_owned()),
                core_dumps: false,
            }),
            runtime: isorun_engine::runtime_for_path(&self.model_dir),
        }
    }

    /// Why a request the stop came before or during was not run.
    fn not_run_reason(&self) -> isorun_protocol::NotRunReason {
        match self.stdout_closed.load(Ordering::SeqCst) {
            true => isorun_protocol::NotRunReason::StdoutClosed,
            false => isorun_protocol::NotRunReason::Interrupted,
        }
    }

    /// Runs one request in the worker (starting one if needed).
    fn run(&mut self, inputs: Vec<(String, Tensor)>, load_only: bool) -> (Outcome, Vec<(String, Tensor)>) {
        self.run_for(inputs, load_only, 1)
    }

    /// Runs `requests` requests joined into one, under `--timeout` for each of them.
    fn run_for(
        &mut self,
        inputs: Vec<(String, Tensor)>,
        load_only: bool,
        requests: u32,
    ) -> (Outcome, Vec<(String, Tensor)>) {
        let request = self.request(inputs, load_only);
        let timeout = self.timeout.map(|t| t.saturating_mul(requests.max(1)));
        let answer = self.session.run(request, self.stop, timeout);
        (answer.outcome, answer.outputs)
    }
}

/// A Keras file given to `pipe`: exported (or found in the cache) first, in
/// the sandbox the worker would have; a file that cannot be is a usage error.
fn keras_saved_model(args: &PipeArgs) -> Result<PathBuf, String> {
    let model = isorun_engine::discover(std::slice::from_ref(&args.model), &mut |_| {})
        .map_err(|e| crate::support::with_causes(&e))?
        .remove(0);
    let settings = isorun_engine::Settings::builder(worker_binary(args.worker.worker.as_deref())?)
        .sandbox((args.sandbox == SandboxMode::Strict).then(|| isorun_protocol::SandboxSpec {
            read_paths: Vec::new(),
            work_dir: None,
            core_dumps: false,
        }))
        .load_timeout(seconds("--timeout", args.timeout)?)
        .keras(crate::settings::keras_settings(&args.keras)?)
        .build();
    let stop = CancelToken::new();
    match isorun_engine::keras::saved_model_for(&model, &settings, &stop) {
        Ok((path, _)) => Ok(path),
        // An export's error says its own kind once: not `error: export_failed: ...` after this prefix.
        Err(isorun_protocol::Outcome::Error(error)) => {
            Err(format!("{}: cannot export the Keras file: {}", args.model.display(), error.message))
        }
        Err(outcome) => Err(format!("{}: cannot export the Keras file: {outcome}", args.model.display())),
    }
}

/// Runs the command; `Err` is a usage error (exit 2).
pub fn main(args: &PipeArgs) -> Result<i32, CliError> {
    let model_dir = if !args.model.exists() {
        return Err(format!("{}: no such file or directory", args.model.display()).into());
    } else if isorun_tensors::json_input::is_onnx_file(&args.model) {
        // An ONNX file runs as it is; one that cannot is a usage error.
        if let Some(error) = isorun_engine::onnx_not_runnable(&args.model) {
            return Err(error.message.into());
        }
        std::path::absolute(&args.model).map_err(|e| format!("{}: {e}", args.model.display()))?
    } else if args.model.is_file() {
        keras_saved_model(args)?
    } else if is_saved_model(&args.model) {
        std::path::absolute(&args.model).map_err(|e| format!("{}: {e}", args.model.display()))?
    } else {
        return Err(format!(
            "{}: not a SavedModel folder (no saved_model.pb in it) or a .keras / full-model .h5 file",
            args.model.display()
        )
        .into());
    };
    let signature = signature_of(&model_dir, &args.tags, &args.signature)
        .map_err(|e| format!("{}: {}", model_dir.display(), e.message))?;
    let timeout = seconds("--timeout", args.timeout)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let worker = worker_binary(args.worker.worker.as_deref())?;
    let spawn = SpawnSpec {
        lib_dir: workers_libtensorflow(args.worker.libtensorflow_dir.as_deref(), &worker)?,
        worker,
        args: args.worker.worker_arg.clone(),
        max_frame: DEFAULT_MAX_FRAME,
        clean_env: args.sandbox == SandboxMode::Strict,
        // The GPUs of the environment, as it has them.
        gpu: None,
    };
    let stop = Arc::new(CancelToken::new());
    let signals = watch_signals(Arc::clone(&stop)).map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let stdout_closed = Arc::new(AtomicBool::new(false));
    watch_stdout(Arc::clone(&stop), Arc::clone(&stdout_closed))
        .map_err(|e| format!("cannot start the thread that watches stdout: {e}"))?;
    let mut server = Server {
        args,
        // Restarts and recycled workers are forked, not exec'd (this thread serves to the end).
        session: WorkerSession::new(spawn)
            .spin(Duration::from_micros(args.spin_us.into()))
            .recycle_after(args.recycle_after)
            .recycle_rss(args.recycle_rss)
            .fork_from_zygote(args.spawn != SpawnMode::Exec),
        model_dir,
        signature,
        config: SessionConfig {
            intra_op_threads: cpus,
            inter_op_threads: cpus,
            ops_on_caller_thread: args.ops_on_caller_thread,
            spin_us: args.spin_us,
            gpu_allow_growth: true,
            gpu_memory_fraction: None,
            skip_grappler: false,
        },
        stop: &stop,
        stdout_closed,
        timeout,
        sandbox: (args.sandbox == SandboxMode::Strict).then(private_work_dir).transpose()?,
    };

    // Load once before reading stdin: a model that cannot load at all is a usage error.
    match server.run(Vec::new(), true) {
        (Outcome::Ok, _) => {}
        // Stdout closed while the model loaded: no worse than after any answer.
        (Outcome::NotRun { .. }, _) if server.stdout_closed.load(Ordering::SeqCst) => {
            say_stdout_closed(0);
            server.session.close();
            signals.close();
            return Ok(exit_code::OK);
        }
        (Outcome::Error(e), _) => return Err(format!("{}: {}", server.model_dir.display(), e.message).into()),
        (other, _) => {
            return Err(format!("{}: the worker could not load the model: {other}", server.model_dir.display()).into())
        }
    }

    let mut lines = Lines::stdin();
    let code = serve_lines(&mut server, &mut lines, &mut io::stdout().lock());
    server.session.close();
    signals.close();
    Ok(match stop.signal() {
        libc::SIGINT => exit_code::INTERRUPTED,
        libc::SIGTERM => exit_code::TERMINATED,
        _ => code,
    })
}

/// Watches stdout for its reader leaving: `poll` reports `POLLERR` on a
/// pipe whose read end is closed (`POLLHUP` on a hung-up terminal or a
/// socket) with nothing written to it, so the command stops then, not at
/// its next answer (which could wait for a line that never comes, and a
/// request run for nobody). A file or `/dev/null` reports neither: the
/// thread waits to the end of the command.
pub(crate) fn watch_stdout(stop: Arc<CancelToken>, closed: Arc<AtomicBool>) -> io::Result<()> {
    std::thread::Builder::new().name("stdout".into()).spawn(move || loop {
        let mut stdout = libc::pollfd { fd: libc::STDOUT_FILENO, events: 0, revents: 0 };
        // SAFETY: one pollfd, alive through the call.
        let ready = unsafe { libc::poll(&mut stdout, 1, -1) };
        if ready < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if ready > 0 && stdout.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            // Said before the stop, so whoever sees the stop knows why.
            closed.store(true, Ordering::SeqCst);
            stop.request(0);
        }
        return;
    })?;
    Ok(())
}

/// How often the wait for the next line looks at the user's interrupts.
const TICK: Duration = Duration::from_millis(20);

/// How much one read of stdin asks for.
const READ_CHUNK: usize = 64 * 1024;

/// Lines of stdin, read on the serving thread itself: a `poll` with a short
/// timeout lets the wait also watch for Ctrl-C and SIGTERM (a read of a
/// terminal or pipe is not interrupted by them: the signal thread catches
/// them), and the lines already read but not answered are what `--max-batch`
/// batches. No thread stands between stdin and the worker, so a request costs
/// no hand-off on its way in.
struct Lines {
    /// stdin by its descriptor, past std's own buffer (which `poll` cannot
    /// see); never closed (fd 0 stays open for the whole command).
    stdin: std::mem::ManuallyDrop<std::fs::File>,
    buffer: Vec<u8>,
    /// Where the unread part of `buffer` starts.
    start: usize,
    /// How much of the unread part holds no newline (searched already).
    searched: usize,
    ended: bool,
    error: Option<io::Error>,
}

impl Lines {
    /// Lines of this process's stdin.
    fn stdin() -> Lines {
        // SAFETY: fd 0 is open for the whole command, and ManuallyDrop never closes it.
        let stdin = std::mem::ManuallyDrop::new(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(0) });
        Lines { stdin, buffer: Vec::new(), start: 0, searched: 0, ended: false, error: None }
    }

    /// A whole line already read (the last one may lack its newline).
    fn buffered_line(&mut self) -> Option<Vec<u8>> {
        let unread = &self.buffer[self.start..];
        // Only the bytes that came since the last search: a long line read
        // 64 KiB at a time is searched once, not once per read.
        let end = match unread[self.searched..].iter().position(|&b| b == b'\n') {
            Some(i) => self.searched + i + 1,
            None if self.ended && !unread.is_empty() => unread.len(),
            None => {
                self.searched = unread.len();
                return None;
            }
        };
        self.searched = 0;
        let line = unread[..end].to_vec();
        self.start += end;
        if self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
        }
        Some(line)
    }

    /// Waits up to `timeout` for stdin, then reads what it has.
    fn fill(&mut self, timeout: Duration) {
        if self.ended {
            return;
        }
        if !isorun_transport::wait_readable(std::os::fd::AsRawFd::as_raw_fd(&*self.stdin), timeout) {
            return;
        }
        if self.start > 0 {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        let len = self.buffer.len();
        self.buffer.resize(len + READ_CHUNK, 0);
        match (&*self.stdin).read(&mut self.buffer[len..]) {
            Ok(0) => {
                self.buffer.truncate(len);
                self.ended = true;
            }
            Ok(n) => self.buffer.truncate(len + n),
            Err(e) => {
                self.buffer.truncate(len);
                if e.kind() != io::ErrorKind::Interrupted && e.kind() != io::ErrorKind::WouldBlock {
                    self.ended = true;
                    self.error = Some(e);
                }
            }
        }
    }

    /// Whether stdin is known to hold no more lines: what it has now is
    /// read (without waiting) until its end or a line that is not blank.
    /// Blanks, never answered, are dropped as they come, so no more than a
    /// read's worth is held.
    fn at_end(&mut self) -> bool {
        loop {
            if !self.buffer[self.start..].iter().all(u8::is_ascii_whitespace) {
                return false;
            }
            self.buffer.clear();
            self.start = 0;
            self.searched = 0;
            if self.ended {
                return true;
            }
            self.fill(Duration::ZERO);
            if !self.ended && self.buffer.is_empty() {
                // Nothing to read now: stdin is still open.
                return false;
            }
        }
    }

    /// The next line, or `None` at the end of input or once the user interrupts.
    fn next_line(&mut self, stop: &CancelToken) -> Option<io::Result<Vec<u8>>> {
        loop {
            if stop.requested() {
                return None;
            }
            if let Some(line) = self.buffered_line() {
                return Some(Ok(line));
            }
            if self.ended {
                return self.error.take().map(Err);
            }
            self.fill(TICK);
        }
    }

    /// A further line for the batch: one already read, else one that
    /// arrives within `wait` (none once input has ended or failed; the
    /// error is kept for `next_line`).
    fn line_within(&mut self, wait: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(line) = self.buffered_line() {
                return Some(line);
            }
            let now = Instant::now();
            if self.ended || now >= deadline {
                return None;
            }
            self.fill(deadline - now);
        }
    }
}

/// Answers every non-blank line; returns the exit code.
fn serve_lines(server: &mut Server, lines: &mut Lines, output: &mut impl Write) -> i32 {
    let mut crashes_in_a_row = 0u32;
    let max_batch = server.args.max_batch.max(1) as usize;
    let batch_wait = Duration::from_micros(server.args.batch_wait);
    // Answers written, and whether a request's answer was lost to a closed stdout.
    let mut answered = 0u64;
    let mut lost = false;
    loop {
        let line = match lines.next_line(server.stop) {
            None => break,
            Some(Ok(line)) => line,
            Some(Err(e)) => {
                eprintln!("isorun: error: cannot read stdin: {e}");
                return exit_code::SOME_FAILED;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let mut batch = vec![line];
        while batch.len() < max_batch {
            match lines.line_within(batch_wait) {
                Some(line) if line.iter().all(u8::is_ascii_whitespace) => {}
                Some(line) => batch.push(line),
                None => break,
            }
        }
        if server.stop.requested() {
            lost = true;
            break;
        }
        let answers = answer_lines(server, &batch, &mut crashes_in_a_row);
        let mut text = String::new();
        for answer in &answers {
            text.push_str(&answer.to_string());
            text.push('\n');
        }
        if output.write_all(text.as_bytes()).and_then(|_| output.flush()).is_err() {
            // Nobody reads any more: exit 0, as a tool in a pipeline does, saying why.
            server.stdout_closed.store(true, Ordering::SeqCst);
            lost = true;
            break;
        }
        answered += answers.len() as u64;
    }
    if server.stdout_closed.load(Ordering::SeqCst) {
        // Stopped as the input ended anyway (`echo LINE | isorun pipe m | head -1`): nothing to say.
        if lost || !lines.at_end() {
            say_stdout_closed(answered);
        }
        return exit_code::OK;
    }
    if crashes_in_a_row >= server.args.max_restarts {
        exit_code::SOME_FAILED
    } else {
        exit_code::OK
    }
}

/// Says on stderr that stdout's reader left after `answered` answers, and
/// that pipe stopped for it: not an interruption nobody made.
fn say_stdout_closed(answered: u64) {
    let (after, rest) = match answered {
        0 => ("before any answer".to_string(), "no line was answered"),
        1 => ("after 1 answer".to_string(), "the lines after it were not answered"),
        n => (format!("after {n} answers"), "the lines after them were not answered"),
    };
    let _ = writeln!(
        io::stderr(),
        "isorun: stdout closed {after}: nobody reads isorun's output any more (as after `| head -1`), so pipe \
         stopped; {rest}"
    );
}

/// The answers to a batch of request lines, in order. Requests that can run
/// together run as one batch; when that batch fails in any way (a model
/// error, a crash, an output that cannot be split by rows), each runs alone,
/// so every answer and every crash is that request's own.
fn answer_lines(server: &mut Server, lines: &[Vec<u8>], crashes_in_a_row: &mut u32) -> Vec<Value> {
    let requests: Vec<pipe::Request> = lines.iter().map(|line| pipe::parse_request(&server.signature, line)).collect();
    let ready: Vec<&[(String, Tensor)]> =
        requests.iter().filter_map(|r| r.as_ref().ok()).map(|(_, t)| t.as_slice()).collect();
    let mut together = None;
    if ready.len() > 1 && *crashes_in_a_row < server.args.max_restarts {
        if let Some(rows) = pipe::batchable(&server.signature, &ready) {
            let parts = ready.iter().map(|t| t.to_vec()).collect();
            if let Ok(joined) = join(parts, &rows) {
                if let (Outcome::Ok, outputs) = server.run_for(joined, false, rows.len() as u32) {
                    together = split(outputs, &rows).ok();
                }
            }
        }
    }
    let mut together = together.map(Vec::into_iter);
    requests
        .into_iter()
        .map(|request| match request {
            Err(error_line) => error_line,
            Ok((id, tensors)) => match together.as_mut().and_then(Iterator::next) {
                Some(outputs) => {
                    *crashes_in_a_row = 0;
                    pipe::answer_line(id, &outputs)
                }
                None => answer_alone(server, id, tensors, crashes_in_a_row),
            },
        })
        .collect()
}

/// The answer to one request run alone.
fn answer_alone(server: &mut Server, id: Value, tensors: Vec<(String, Tensor)>, crashes_in_a_row: &mut u32) -> Value {
    if server.stop.requested() {
        // The rest of a batch after Ctrl-C: answered, not run (no worker is started for it).
        let outcome = Outcome::NotRun { reason: server.not_run_reason() };
        return pipe::error_line(id, outcome.status(), None, &outcome.to_string());
    }
    if *crashes_in_a_row >= server.args.max_restarts {
        let message = format!(
            "the worker crashed {crashes_in_a_row} times in a row; no more restarts (--max-restarts {})",
            server.args.max_restarts
        );
        return pipe::error_line(id, "gave_up", None, &message);
    }
    let (outcome, outputs) = match server.run(tensors, false) {
        // The engine knows no stdout: a stop it was asked for is `interrupted` to it.
        (Outcome::NotRun { .. }, outputs) => (Outcome::NotRun { reason: server.not_run_reason() }, outputs),
        answer => answer,
    };
    let crashed = !matches!(outcome, Outcome::Ok | Outcome::Error(_) | Outcome::NotRun { .. });
    *crashes_in_a_row = if crashed { *crashes_in_a_row + 1 } else { 0 };
    match outcome {
        Outcome::Ok => pipe::answer_line(id, &outputs),
        Outcome::Error(e) => pipe::error_line(id, e.kind.name(), e.code.as_deref(), &e.message),
        other => pipe::error_line(id, other.status(), None, &other.to_string()),
    }
}
