//! One conversation with one worker, shared by the executor and
//! [`WorkerSession`](crate::WorkerSession): wait for
//! its `Hello` (under a start deadline), deliver a request and follow it
//! through `Loaded` and `Finished` (under load and run deadlines, and the
//! user's interrupts), and end the worker. Everything a worker can do wrong
//! becomes an `Outcome` here; nothing it does can stop the supervisor.

use crate::cancel::CancelToken;
use crate::process::{Exit, ExitStatus, WorkerEvent, WorkerProcess};
use isorun_protocol::{
    Hello, NotRunReason, OnednnWarmup, Outcome, Phase, Tensor, ToWorker, UnitResult, WorkerMessage, PROTOCOL_VERSION,
};
use isorun_transport::RequestEnvelope;
use std::time::{Duration, Instant};

/// How often a waiting loop looks at deadlines, interrupts and the worker's exit.
const TICK: Duration = Duration::from_millis(20);

/// Waits for the worker's `Hello` until `deadline`. Requests go down the
/// socket the supervisor made, so nothing in a `Hello` says where to send.
pub fn wait_hello(worker: &mut WorkerProcess, stop: &CancelToken, deadline: Instant) -> Result<Hello, Outcome> {
    loop {
        if stop.requested() {
            return Err(Outcome::NotRun { reason: NotRunReason::Interrupted });
        }
        if Instant::now() >= deadline {
            return Err(Outcome::Timeout { phase: Phase::Start });
        }
        match worker.next_event(TICK) {
            Some(WorkerEvent::Message(WorkerMessage::Hello(hello))) => {
                if hello.protocol_version != PROTOCOL_VERSION {
                    return Err(Outcome::ProtocolError {
                        message: format!(
                            "worker speaks protocol version {}, this isorun speaks {}",
                            hello.protocol_version, PROTOCOL_VERSION
                        ),
                    });
                }
                tracing::debug!(pid = hello.pid, tensorflow = %hello.tensorflow_version, "worker ready");
                say_onednn_warmup(&hello.onednn_warmup);
                return Ok(hello);
            }
            Some(WorkerEvent::Message(other)) => {
                return Err(Outcome::ProtocolError { message: format!("expected Hello, got {}", message_name(&other)) })
            }
            Some(WorkerEvent::Broken(reason)) => return Err(broken_outcome(worker, reason, true)),
            Some(WorkerEvent::SendFailed(reason)) => {
                tracing::debug!("{reason}");
                return Err(death_outcome(worker, true));
            }
            Some(WorkerEvent::Closed) => return Err(death_outcome(worker, true)),
            None => {
                if worker.try_exit().is_some() {
                    return Err(death_outcome(worker, true));
                }
            }
        }
    }
}

/// The oneDNN warm-up a forked worker last reported, so that `-v` says it
/// once, and again when it changes (a zygote whose scan of its library
/// finished warms up before its next fork).
static ONEDNN_WARMUP_SAID: std::sync::Mutex<Option<OnednnWarmup>> = std::sync::Mutex::new(None);

/// Says at `-v` whether forked workers have oneDNN's sgemm kernels from
/// their zygote, and why not (exec'd workers say nothing).
fn say_onednn_warmup(warmup: &OnednnWarmup) {
    if *warmup == OnednnWarmup::NotForked {
        return;
    }
    let mut said = ONEDNN_WARMUP_SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said.as_ref() == Some(warmup) {
        return;
    }
    match warmup {
        OnednnWarmup::InForce => {
            tracing::info!("oneDNN warm-up in force: forked workers have oneDNN's sgemm kernels from their zygote")
        }
        OnednnWarmup::NotInForce(why) => tracing::info!(
            "oneDNN warm-up not in force: {why}; each forked worker makes oneDNN's sgemm kernels itself (~40 ms of CPU)"
        ),
        OnednnWarmup::NotForked => {}
    }
    *said = Some(warmup.clone());
}

/// Deadlines of one request.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// End of the whole unit.
    pub unit: Option<Instant>,
    /// End of loading (start included).
    pub load: Option<Instant>,
    /// Time the run may take once the model is loaded (`--batch-timeout`).
    pub run: Option<Duration>,
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Limit on the worker's private memory, checked every tick.
    pub memory_limit: Option<u64>,
}

/// How a request ended.
#[derive(Debug)]
pub struct RequestEnd {
    /// `Ok`, `Error` from the model, or what went wrong with the worker.
    pub outcome: Outcome,
    /// The outputs, checked (safe unique names, data that fits each shape).
    pub outputs: Vec<(String, Tensor)>,
    pub load_ms: Option<u64>,
    /// How an ONNX model's session was made, as the worker's `Loaded` said.
    pub onnx: Option<isorun_protocol::OnnxSession>,
    /// The session run's time as the worker measured it, in microseconds.
    pub run_us: Option<u64>,
    /// False when the worker was killed or is not to be trusted again.
    pub worker_usable: bool,
}

/// Sends one request for `unit` and follows it to its end. `loaded`: the
/// worker already holds the request's model (an earlier request of the same
/// model ended well in it), so it answers with `Finished` alone and the
/// request starts in the run phase, under the run deadline from now; a
/// worker that loads anyway still says `Loaded` first. Sparing that message
/// spares the supervisor a wake-up per request.
pub fn run_request(
    worker: &mut WorkerProcess,
    envelope: RequestEnvelope,
    unit: u64,
    stop: &CancelToken,
    deadlines: Deadlines,
    loaded: bool,
) -> RequestEnd {
    let mut end = RequestEnd {
        outcome: Outcome::Ok,
        outputs: Vec::new(),
        load_ms: None,
        onnx: None,
        run_us: None,
        worker_usable: false,
    };
    let fail = |mut end: RequestEnd, outcome: Outcome| {
        end.outcome = outcome;
        end.worker_usable = false;
        end
    };
    if let Err(message) = worker.send(envelope) {
        // As a sender thread's failure always was: the worker is gone or
        // going (EPIPE); how it exited is the outcome.
        tracing::debug!("{message}");
        let outcome = death_outcome(worker, false);
        return fail(end, outcome);
    }
    let mut phase = if loaded { Phase::Run } else { Phase::Load };
    let mut run_deadline = if loaded { deadlines.run.map(|d| Instant::now() + d) } else { None };
    let mut peak_private = 0;
    loop {
        // GPU memory, where watched (`--gpus` with NVML): sampled like the memory limit.
        worker.sample_gpu();
        if let Some(limit) = deadlines.memory_limit {
            // Sampled every tick (tens of milliseconds): no kernel limit is
            // delegated to isorun here, so the supervisor enforces it.
            peak_private = peak_private.max(worker.private_memory_now().unwrap_or(0));
            if peak_private > limit {
                worker.kill();
                return fail(end, Outcome::MemoryLimit { peak_bytes: peak_private });
            }
        }
        if stop.immediate() {
            worker.kill();
            return fail(end, Outcome::NotRun { reason: NotRunReason::Interrupted });
        }
        if stop.requested() {
            terminate(worker, deadlines.grace, stop);
            return fail(end, Outcome::NotRun { reason: NotRunReason::Interrupted });
        }
        let deadline = match phase {
            Phase::Load => [deadlines.unit, deadlines.load].into_iter().flatten().min(),
            _ => [deadlines.unit, run_deadline].into_iter().flatten().min(),
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            terminate(worker, deadlines.grace, stop);
            return fail(end, Outcome::Timeout { phase });
        }
        match worker.next_event(TICK) {
            Some(WorkerEvent::Message(WorkerMessage::Sandboxed { protections, missing, steps_us }))
                if phase == Phase::Load =>
            {
                worker.set_sandbox(protections, missing, steps_us);
            }
            Some(WorkerEvent::Message(WorkerMessage::Loaded { unit: u, load_ms, onnx }))
                if u == unit && (phase == Phase::Load || loaded && end.load_ms.is_none()) =>
            {
                end.load_ms = Some(load_ms);
                end.onnx = onnx;
                phase = Phase::Run;
                run_deadline = deadlines.run.map(|d| Instant::now() + d);
            }
            Some(WorkerEvent::Message(WorkerMessage::Finished { unit: u, run_us, result })) if u == unit => {
                // A worker that reused its model without saying `Loaded` ran it too.
                if phase == Phase::Run || matches!(result, UnitResult::Ok { .. }) {
                    end.run_us = Some(run_us);
                }
                match result {
                    UnitResult::Err(error) => end.outcome = Outcome::Error(error),
                    UnitResult::Ok { outputs } => {
                        if let Err(outcome) = check_outputs(&outputs) {
                            worker.kill();
                            return fail(end, outcome);
                        }
                        end.outputs = outputs;
                    }
                }
                end.worker_usable = true;
                return end;
            }
            Some(WorkerEvent::Message(other)) => {
                worker.kill();
                let message =
                    format!("unexpected {} while unit {unit} was in phase {}", message_name(&other), phase.name());
                return fail(end, Outcome::ProtocolError { message });
            }
            Some(WorkerEvent::Broken(message)) => {
                let outcome = broken_outcome(worker, message, false);
                return fail(end, outcome);
            }
            Some(WorkerEvent::SendFailed(reason)) => {
                tracing::debug!("{reason}");
                let outcome = death_outcome(worker, false);
                return fail(end, outcome);
            }
            Some(WorkerEvent::Closed) => {
                let outcome = death_outcome(worker, false);
                return fail(end, outcome);
            }
            None => {
                if worker.try_exit().is_some() {
                    let outcome = death_outcome(worker, false);
                    return fail(end, outcome);
                }
            }
        }
    }
}

/// SIGTERM to the worker's group, `grace` to exit, then SIGKILL; reaps it.
/// A second Ctrl-C (`stop.immediate()`) during the grace kills it at once.
pub fn terminate(worker: &mut WorkerProcess, grace: Duration, stop: &CancelToken) -> Exit {
    worker.ask_to_stop();
    let deadline = Instant::now() + grace;
    loop {
        let now = Instant::now();
        if now >= deadline || stop.immediate() {
            return worker.kill();
        }
        if let Some(exit) = worker.wait_exit(TICK.min(deadline - now)) {
            return exit;
        }
    }
}

/// Asks the worker to leave, and makes sure it does.
pub fn shutdown(worker: &mut WorkerProcess, grace: Duration) -> Exit {
    let _ = worker.send(RequestEnvelope::new(&ToWorker::Shutdown, Vec::new()));
    match worker.wait_exit(grace) {
        Some(exit) => exit,
        None => worker.terminate(grace),
    }
}

/// The highest rank TensorFlow allows (`TensorShape`'s limit); deeper shapes
/// come only from a lying worker, and would recurse through every reader.
pub const MAX_RANK: usize = 254;

/// The gate for everything a worker returns: output names must be safe file
/// names and unique, ranks at most TensorFlow's, data must fit shapes.
/// Linear in the number of outputs and their sizes.
pub fn check_outputs(outputs: &[(String, Tensor)]) -> Result<(), Outcome> {
    let mut seen = std::collections::HashSet::with_capacity(outputs.len());
    for (name, tensor) in outputs {
        if name.is_empty() || name.contains('/') || name.contains('\0') || name == "." || name == ".." {
            return Err(Outcome::ProtocolError { message: format!("output name {name:?} is not a safe file name") });
        }
        if !seen.insert(name.as_str()) {
            return Err(Outcome::ProtocolError { message: format!("output {name} is sent twice") });
        }
        if tensor.shape.len() > MAX_RANK {
            return Err(Outcome::ProtocolError {
                message: format!("output {name} has rank {}, more than TensorFlow's {MAX_RANK}", tensor.shape.len()),
            });
        }
        tensor.validate(|_| None).map_err(|e| Outcome::ProtocolError { message: format!("output {name}: {e}") })?;
    }
    Ok(())
}

/// The outcome of a worker that stopped talking: how it exited, or a
/// protocol error if it is still alive (then it is killed).
fn death_outcome(worker: &mut WorkerProcess, before_hello: bool) -> Outcome {
    match worker.wait_exit(Duration::from_secs(2)) {
        Some(exit) => crash_outcome(exit, before_hello, &worker.stderr_tail()),
        None => {
            worker.kill();
            Outcome::ProtocolError { message: "the worker closed its connection but did not exit".into() }
        }
    }
}

/// The outcome of a connection that broke (a frame cut short, an i/o
/// error, bytes that are no frame): a worker that a signal ended meanwhile
/// (killed from outside, or crashed while writing) crashed, and says so;
/// one still running, or one that exited by itself, broke the protocol and
/// is killed. The short wait lets the exit of a worker killed mid-frame
/// arrive, which would otherwise race the reader's error.
fn broken_outcome(worker: &mut WorkerProcess, message: String, before_hello: bool) -> Outcome {
    match worker.wait_exit(BROKEN_EXIT_GRACE) {
        Some(exit) if matches!(exit.status, ExitStatus::Signal { .. }) => {
            crash_outcome(exit, before_hello, &worker.stderr_tail())
        }
        _ => {
            worker.kill();
            Outcome::ProtocolError { message }
        }
    }
}

/// How long a broken connection waits for its worker's exit.
const BROKEN_EXIT_GRACE: Duration = Duration::from_millis(200);

fn crash_outcome(exit: Exit, before_hello: bool, stderr: &[String]) -> Outcome {
    match exit.status {
        ExitStatus::Signal { signal, core_dumped } => {
            Outcome::Crashed { signal: Some(signal), core_dumped, exit_code: None }
        }
        // 127 before Hello: the loader could not start the worker (libtensorflow missing).
        ExitStatus::Code(127) if before_hello => Outcome::SpawnFailed {
            message: stderr
                .last()
                .cloned()
                .unwrap_or_else(|| "the worker exited with code 127 before it started".into()),
        },
        ExitStatus::Code(code) => Outcome::Crashed { signal: None, core_dumped: false, exit_code: Some(code) },
        // Only a killed worker can be left unreaped; one that exited by itself never is.
        ExitStatus::Unreaped => Outcome::Crashed { signal: Some(libc::SIGKILL), core_dumped: false, exit_code: None },
    }
}

pub(crate) fn message_name(message: &WorkerMessage) -> &'static str {
    match message {
        WorkerMessage::Hello(_) => "Hello",
        WorkerMessage::Loaded { .. } => "Loaded",
        WorkerMessage::Finished { .. } => "Finished",
        WorkerMessage::Sandboxed { .. } => "Sandboxed",
        WorkerMessage::Warmed { .. } => "Warmed",
        WorkerMessage::Wake => "Wake",
    }
}
