//! `isorun pipe MODEL`: one model kept in a worker, fed JSON Lines on stdin,
//! answering one JSON line per non-blank input line on stdout, in order and
//! flushed at once. The worker is recycled after `--recycle-after` requests
//! or past `--recycle-rss`, and restarted after a crash (the request it was
//! running gets an error line); after `--max-restarts` crashes in a row
//! every remaining line gets an error line and the exit code is 1.

use crate::cli::PipeArgs;
use crate::discover::is_saved_model;
use crate::executor::Stop;
use crate::json_input::{signature_of, tensors_for_signature};
use crate::locate::{libtensorflow_dir, worker_binary};
use crate::process::{SpawnSpec, WorkerProcess};
use crate::run::watch_signals;
use crate::session::{run_request, shutdown, wait_hello, Deadlines};
use crate::values::tensor_values;
use isorun_protocol::{exit_code, Outcome, RunRequest, SandboxSpec, SessionConfig, SignatureInfo, Tensor, ToWorker};
use isorun_transport::{RequestEnvelope, DEFAULT_MAX_FRAME};
use serde_json::{json, Map, Value};
use std::io::{self, BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const GRACE: Duration = Duration::from_secs(2);
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The worker serving the model, started on demand.
struct Server<'a> {
    args: &'a PipeArgs,
    spawn: SpawnSpec,
    model_dir: PathBuf,
    signature: SignatureInfo,
    config: SessionConfig,
    stop: &'a Stop,
    /// Limit on each request.
    timeout: Option<Duration>,
    /// Confine the worker (`--sandbox strict`).
    sandbox: bool,
    worker: Option<WorkerProcess>,
    served_by_worker: u64,
    next_unit: u64,
}

impl Server<'_> {
    fn request(&self, unit: u64, inputs: Vec<(String, Tensor)>, load_only: bool) -> RunRequest {
        RunRequest {
            unit,
            model_dir: self.model_dir.to_string_lossy().into_owned(),
            tags: self.args.tags.clone(),
            signature: self.args.signature.clone(),
            inputs,
            config: self.config,
            load_only,
            libraries: Vec::new(),
            sandbox: self.sandbox.then(|| SandboxSpec {
                read_paths: vec![self.model_dir.to_string_lossy().into_owned()],
                work_dir: None,
                core_dumps: false,
            }),
        }
    }

    /// Runs one request in the worker (starting one if needed).
    fn run(&mut self, inputs: Vec<(String, Tensor)>, load_only: bool) -> (Outcome, Vec<(String, Tensor)>) {
        let started = Instant::now();
        let mut worker = match self.worker.take() {
            Some(worker) => worker,
            None => match WorkerProcess::spawn(&self.spawn) {
                Ok(mut worker) => {
                    if let Err(outcome) = wait_hello(&mut worker, self.stop, started + START_TIMEOUT) {
                        worker.terminate(GRACE);
                        return (outcome, Vec::new());
                    }
                    self.served_by_worker = 0;
                    worker
                }
                Err(e) => {
                    let message = format!("{}: {e}", self.spawn.worker.display());
                    return (Outcome::SpawnFailed { message }, Vec::new());
                }
            },
        };
        let unit = self.next_unit;
        self.next_unit += 1;
        let envelope = RequestEnvelope::new(&ToWorker::Run(self.request(unit, inputs, load_only)), Vec::new());
        let deadlines =
            Deadlines { unit: self.timeout.map(|t| started + t), load: None, grace: GRACE, memory_limit: None };
        let end = run_request(&mut worker, envelope, unit, self.stop, deadlines);
        if end.worker_usable {
            self.served_by_worker += 1;
            let recycle_count = self.args.recycle_after.is_some_and(|n| self.served_by_worker >= n);
            let recycle_rss =
                self.args.recycle_rss.is_some_and(|limit| worker.rss_now().is_some_and(|rss| rss > limit));
            if recycle_count || recycle_rss {
                tracing::info!(requests = self.served_by_worker, "recycling the worker");
                shutdown(&mut worker, GRACE);
            } else {
                self.worker = Some(worker);
            }
        }
        (end.outcome, end.outputs)
    }
}

/// Runs the command; `Err` is a usage error (exit 2).
pub fn main(args: &PipeArgs) -> Result<i32, String> {
    if !is_saved_model(&args.model) {
        return Err(format!("{}: not a SavedModel folder (no saved_model.pb in it)", args.model.display()));
    }
    let model_dir = std::path::absolute(&args.model).map_err(|e| format!("{}: {e}", args.model.display()))?;
    let signature = signature_of(&model_dir, &args.tags, &args.signature)
        .map_err(|e| format!("{}: {}", model_dir.display(), e.message))?;
    let timeout = crate::run::seconds("--timeout", args.timeout)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let spawn = SpawnSpec {
        worker: worker_binary(args.worker.worker.as_deref())?,
        lib_dir: libtensorflow_dir(args.worker.libtensorflow_dir.as_deref()),
        args: args.worker.worker_arg.clone(),
        max_frame: DEFAULT_MAX_FRAME,
        clean_env: args.sandbox == crate::cli::SandboxMode::Strict,
        // The GPUs of the environment, as it has them.
        gpu: None,
    };
    let stop = Arc::new(Stop::default());
    let signals = watch_signals(Arc::clone(&stop)).map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let mut server = Server {
        args,
        spawn,
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
        sandbox: args.sandbox == crate::cli::SandboxMode::Strict,
        worker: None,
        served_by_worker: 0,
        next_unit: 0,
    };

    // Load once before reading stdin: a model that cannot load at all is a usage error.
    match server.run(Vec::new(), true) {
        (Outcome::Ok, _) => {}
        (Outcome::Error(e), _) => return Err(format!("{}: {}", server.model_dir.display(), e.message)),
        (other, _) => {
            return Err(format!("{}: the worker could not load the model: {other}", server.model_dir.display()))
        }
    }

    let code = serve_lines(&mut server, &mut io::stdin().lock(), &mut io::stdout().lock());
    if let Some(mut worker) = server.worker.take() {
        shutdown(&mut worker, GRACE);
    }
    signals.close();
    Ok(match stop.signal() {
        libc::SIGINT => exit_code::INTERRUPTED,
        libc::SIGTERM => exit_code::TERMINATED,
        _ => code,
    })
}

/// Answers every non-blank line; returns the exit code.
fn serve_lines(server: &mut Server, input: &mut impl BufRead, output: &mut impl Write) -> i32 {
    let mut crashes_in_a_row = 0u32;
    let mut line = Vec::new();
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                eprintln!("isorun: error: cannot read stdin: {e}");
                return exit_code::SOME_FAILED;
            }
        }
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
                answer.insert(
                    name.clone(),
                    json!({ "dtype": tensor.dtype.name(), "shape": tensor.shape, "values": tensor_values(tensor) }),
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
