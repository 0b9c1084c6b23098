//! `isorun pipe MODEL`: one model kept in a worker, fed JSON Lines on stdin,
//! answering one JSON line per non-blank input line on stdout, in order and
//! flushed at once. The worker is recycled after `--recycle-after` requests
//! or past `--recycle-rss`, and restarted after a crash (the request it was
//! running gets an error line); after `--max-restarts` crashes in a row
//! every remaining line gets an error line and the exit code is 1.

use crate::cli::{PipeArgs, SandboxMode, SpawnMode};
use crate::support::{private_work_dir, seconds, watch_signals, workers_libtensorflow};
use isorun_engine::locations::worker_binary;
use isorun_engine::{is_saved_model, CancelToken, SpawnSpec, WorkerSession};
use isorun_protocol::{exit_code, Outcome, RunRequest, SandboxSpec, SessionConfig, SignatureInfo, Tensor};
use isorun_tensors::json_input::{signature_of, tensors_for_signature};
use isorun_tensors::values::tensor_values;
use isorun_transport::DEFAULT_MAX_FRAME;
use serde_json::{json, Map, Value};
use std::io::{self, BufRead, Read, Write};
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// The model being served, and the worker session serving it.
struct Server<'a> {
    args: &'a PipeArgs,
    session: WorkerSession,
    model_dir: PathBuf,
    signature: SignatureInfo,
    config: SessionConfig,
    stop: &'a CancelToken,
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
                read_paths: vec![self.model_dir.to_string_lossy().into_owned()],
                work_dir: Some(work_dir.path().to_string_lossy().into_owned()),
                core_dumps: false,
            }),
        }
    }

    /// Runs one request in the worker (starting one if needed).
    fn run(&mut self, inputs: Vec<(String, Tensor)>, load_only: bool) -> (Outcome, Vec<(String, Tensor)>) {
        let request = self.request(inputs, load_only);
        let answer = self.session.run(request, self.stop, self.timeout);
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
pub fn main(args: &PipeArgs) -> Result<i32, String> {
    let model_dir = if !args.model.exists() {
        return Err(format!("{}: no such file or directory", args.model.display()));
    } else if args.model.is_file() {
        keras_saved_model(args)?
    } else if is_saved_model(&args.model) {
        std::path::absolute(&args.model).map_err(|e| format!("{}: {e}", args.model.display()))?
    } else {
        return Err(format!(
            "{}: not a SavedModel folder (no saved_model.pb in it) or a .keras / full-model .h5 file",
            args.model.display()
        ));
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
    let mut server = Server {
        args,
        // Restarts and recycled workers are forked, not exec'd (this thread serves to the end).
        session: WorkerSession::new(spawn)
            .recycle_after(args.recycle_after)
            .recycle_rss(args.recycle_rss)
            .fork_from_zygote(args.spawn != SpawnMode::Exec),
        model_dir,
        signature,
        config: SessionConfig {
            intra_op_threads: cpus,
            inter_op_threads: cpus,
            gpu_allow_growth: true,
            gpu_memory_fraction: None,
        },
        stop: &stop,
        timeout,
        sandbox: (args.sandbox == SandboxMode::Strict).then(private_work_dir).transpose()?,
    };

    // Load once before reading stdin: a model that cannot load at all is a usage error.
    match server.run(Vec::new(), true) {
        (Outcome::Ok, _) => {}
        (Outcome::Error(e), _) => return Err(format!("{}: {}", server.model_dir.display(), e.message)),
        (other, _) => {
            return Err(format!("{}: the worker could not load the model: {other}", server.model_dir.display()))
        }
    }

    let lines = read_lines_on_a_thread(io::stdin());
    let code = serve_lines(&mut server, &lines, &mut io::stdout().lock());
    server.session.close();
    signals.close();
    Ok(match stop.signal() {
        libc::SIGINT => exit_code::INTERRUPTED,
        libc::SIGTERM => exit_code::TERMINATED,
        _ => code,
    })
}

/// How often the wait for the next line looks at the user's interrupts.
const TICK: Duration = Duration::from_millis(20);

/// Reads lines of `input` on a thread of its own, one line ahead at most, so
/// that the wait for a line can also watch for Ctrl-C and SIGTERM (a read
/// of a terminal or pipe is not interrupted by them: the signal thread
/// catches them). At the end of input the channel closes; a read error is
/// its last item. The thread may still be blocked in a read when the
/// command ends; it holds nothing but stdin.
fn read_lines_on_a_thread(input: impl Read + Send + 'static) -> mpsc::Receiver<io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new().name("stdin".into()).spawn(move || {
        let mut input = io::BufReader::new(input);
        loop {
            let mut line = Vec::new();
            match input.read_until(b'\n', &mut line) {
                Ok(0) => return,
                Ok(_) => {
                    if tx.send(Ok(line)).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    });
    if let Err(e) = spawned {
        let (tx, rx) = mpsc::sync_channel(1);
        let _ = tx.send(Err(e));
        return rx;
    }
    rx
}

/// The next line, or `None` at the end of input or once the user interrupts.
fn next_line(lines: &mpsc::Receiver<io::Result<Vec<u8>>>, stop: &CancelToken) -> Option<io::Result<Vec<u8>>> {
    loop {
        if stop.requested() {
            return None;
        }
        match lines.recv_timeout(TICK) {
            Ok(line) => return Some(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Answers every non-blank line; returns the exit code.
fn serve_lines(server: &mut Server, lines: &mpsc::Receiver<io::Result<Vec<u8>>>, output: &mut impl Write) -> i32 {
    let mut crashes_in_a_row = 0u32;
    loop {
        let line = match next_line(lines, server.stop) {
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
        if server.stop.requested() {
            break;
        }
        let answer = if crashes_in_a_row >= server.args.max_restarts {
            let id =
                serde_json::from_slice::<Value>(&line).ok().and_then(|v| v.get("id").cloned()).unwrap_or(Value::Null);
            let message = format!(
                "the worker crashed {crashes_in_a_row} times in a row; no more restarts (--max-restarts {})",
                server.args.max_restarts
            );
            error_line(id, "gave_up", None, &message)
        } else {
            let (answer, crashed) = answer_line(server, &line);
            crashes_in_a_row = if crashed { crashes_in_a_row + 1 } else { 0 };
            answer
        };
        if writeln!(output, "{answer}").and_then(|_| output.flush()).is_err() {
            // Nobody reads any more: end quietly, as `rg` does.
            return exit_code::OK;
        }
    }
    if crashes_in_a_row >= server.args.max_restarts {
        exit_code::SOME_FAILED
    } else {
        exit_code::OK
    }
}

fn error_line(id: Value, kind: &str, code: Option<&str>, message: &str) -> Value {
    let mut error = Map::new();
    error.insert("kind".into(), json!(kind));
    if let Some(code) = code {
        error.insert("code".into(), json!(code));
    }
    error.insert("message".into(), json!(message));
    json!({ "id": id, "error": error })
}

/// The answer to one request line, and whether the worker failed on it.
fn answer_line(server: &mut Server, line: &[u8]) -> (Value, bool) {
    let request: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(e) => return (error_line(Value::Null, "bad_request", None, &format!("not valid JSON: {e}")), false),
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let Some(Value::Object(inputs)) = request.get("inputs") else {
        let message = "expected {\"id\": ..., \"inputs\": {NAME: nested list, ...}}";
        return (error_line(id, "bad_request", None, message), false);
    };
    let inputs: Vec<(String, Value)> = inputs.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let tensors = match tensors_for_signature(&server.signature, &inputs) {
        Ok(tensors) => tensors,
        Err(e) => return (error_line(id, e.kind.name(), None, &e.message), false),
    };
    match server.run(tensors, false) {
        (Outcome::Ok, outputs) => {
            let mut answer = Map::new();
            for (name, tensor) in &outputs {
                let values = match tensor_values(tensor) {
                    Ok(values) => values,
                    Err(message) => {
                        return (error_line(id, "output_write", None, &format!("output {name}: {message}")), false)
                    }
                };
                answer.insert(
                    name.clone(),
                    json!({ "dtype": tensor.dtype.name(), "shape": tensor.shape, "values": values }),
                );
            }
            (json!({ "id": id, "outputs": answer }), false)
        }
        (Outcome::Error(e), _) => (error_line(id, e.kind.name(), e.code.as_deref(), &e.message), false),
        (other, _) => {
            let crashed = !matches!(other, Outcome::NotRun { .. });
            (error_line(id, other.status(), None, &other.to_string()), crashed)
        }
    }
}
