//! The worker's life: say `Hello` on the socket it inherited, take requests
//! from the supervisor on the same socket, answer each with `Loaded` and
//! `Finished`, and exit. A spare first gets `Warm` (see `warm.rs`), answered
//! with `Warmed`; it may load its unit's model then (a preload). A model
//! loaded once stays loaded for the next request for the same folder and
//! tags (the same `.onnx` file, for ONNX Runtime); a different model
//! replaces it. Each request names its runtime: TensorFlow (`tf.rs`) or
//! ONNX Runtime (`onnx.rs`).

use crate::onnx::OnnxModel;
use crate::tf::{load_libraries, tensorflow_version, SavedModel};
use crate::warm;
use isorun_protocol::matching::match_inputs;
use isorun_protocol::{
    ErrorKind, Hello, ModelError, RunRequest, Runtime, SandboxSpec, ToWorker, UnitResult, WorkerMessage,
    PROTOCOL_VERSION,
};
use isorun_transport::{dense_bytes, write_frame, FrameError, Inbox, SharedMemory, DEFAULT_MAX_FRAME};
use std::collections::HashSet;
use std::io;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Instant;

/// What a spare warms up on: its unit's model, or the built-in model it
/// wrote (or why it could not).
enum WarmUp<'a> {
    Preload(&'a isorun_protocol::Preload),
    BuiltIn(Result<std::path::PathBuf, String>),
}

/// The model kept between requests.
struct Loaded {
    dir: String,
    tags: Vec<String>,
    model: Model,
}

/// A loaded model, with the runtime that loaded it.
enum Model {
    TensorFlow(SavedModel),
    Onnx { library: String, model: OnnxModel },
}

impl Loaded {
    /// True if it is the model `request` asks for: the same SavedModel
    /// folder and tags, or the same `.onnx` file with the same library
    /// (whose tags mean nothing).
    fn serves(&self, request: &RunRequest) -> bool {
        self.dir == request.model_dir
            && match (&self.model, &request.runtime) {
                (Model::TensorFlow(_), Runtime::TensorFlow) => self.tags == request.tags,
                (Model::Onnx { library, .. }, Runtime::Onnx { library: asked }) => library == asked,
                _ => false,
            }
    }
}

/// Serves the supervisor until it says `Shutdown` or goes away.
pub fn serve(mut socket: UnixStream) -> io::Result<()> {
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        worker_version: env!("CARGO_PKG_VERSION").to_string(),
        tensorflow_version: tensorflow_version(),
        pid: std::process::id(),
        onednn_warmup: crate::onednn::state(),
    };
    write_frame(&mut socket, &WorkerMessage::Hello(hello))?;
    let mut loaded: Option<Loaded> = None;
    let mut sandboxed = false;
    // A spare's sandbox, as its Warm gave it: its unit's requests must carry the same.
    let mut spare_sandbox: Option<Option<SandboxSpec>> = None;
    let mut requests = 0u64;
    let mut libraries: HashSet<String> = HashSet::new();
    // How long to poll for the next request before sleeping: the last
    // request's `spin_us`, while requests keep coming within it. When the
    // last one came later (a client that waits for each answer), polling
    // would only take a CPU from the client and the supervisor: sleep.
    let mut spin = std::time::Duration::ZERO;
    let mut last_gap = std::time::Duration::ZERO;
    let mut inbox = Inbox::new(DEFAULT_MAX_FRAME);
    loop {
        let waiting = Instant::now();
        let budget = if last_gap <= spin { spin } else { std::time::Duration::ZERO };
        let envelope = match inbox.next(&socket, budget) {
            Ok(envelope) => envelope,
            // The supervisor is gone: nothing is left to do.
            Err(FrameError::Closed) => return Ok(()),
            Err(e) => return Err(io::Error::other(e.to_string())),
        };
        last_gap = waiting.elapsed();
        let (message, shared) = envelope.open().map_err(|e| io::Error::other(e.to_string()))?;
        // Mailbox set-up and wake-ups are not requests.
        requests += u64::from(!matches!(message, ToWorker::Mailbox | ToWorker::Wake));
        match message {
            ToWorker::Mailbox => {
                if let Err(e) = inbox.attach(&shared) {
                    // The supervisor goes on through the socket.
                    eprintln!("isorun-worker: cannot map the mailbox: {e}");
                }
            }
            // The request is in the mailbox: the loop takes it.
            ToWorker::Wake => {}
            ToWorker::Shutdown => return Ok(()),
            ToWorker::Warm(warm) => {
                if requests != 1 {
                    return Err(io::Error::other("Warm must be the first request"));
                }
                let started = Instant::now();
                // Written before the sandbox forbids writing; read after it.
                // Not needed when the unit's own model is the warm-up.
                let warm_up = match &warm.preload {
                    Some(preload) => WarmUp::Preload(preload),
                    None => WarmUp::BuiltIn(
                        warm::write_model(&warm.warm_dir)
                            .map_err(|e| format!("cannot write the warm-up model into {}: {e}", warm.warm_dir)),
                    ),
                };
                if let Some(spec) = &warm.sandbox {
                    let mut spec = spec.clone();
                    if let WarmUp::BuiltIn(Ok(dir)) = &warm_up {
                        spec.read_paths.push(dir.to_string_lossy().into_owned());
                    }
                    // Before TensorFlow starts a thread: every thread it starts is confined.
                    let applied = isorun_sandbox::apply(&spec);
                    sandboxed = true;
                    let message = WorkerMessage::Sandboxed {
                        protections: applied.protections,
                        missing: applied.missing,
                        steps_us: applied.steps.iter().map(|(n, d)| (n.to_string(), d.as_micros() as u64)).collect(),
                    };
                    write_frame(&mut socket, &message)?;
                }
                spare_sandbox = Some(warm.sandbox.clone());
                let (error, preloaded) = match warm_up {
                    // An ONNX model: ONNX Runtime opened, its environment and the
                    // session made here, after the fork, and held for the unit's `Run`
                    // (no TensorFlow warm-up: the unit runs no TensorFlow).
                    WarmUp::Preload(preload) if matches!(preload.runtime, Runtime::Onnx { .. }) => {
                        let Runtime::Onnx { library } = &preload.runtime else { unreachable!("matched above") };
                        let started = Instant::now();
                        let load = || OnnxModel::load(library, &preload.model_dir, &preload.config);
                        match catch_unwind(AssertUnwindSafe(load)) {
                            Ok(Ok(model)) => {
                                let (dir, tags) = (preload.model_dir.clone(), preload.tags.clone());
                                let onnx = Some(model.session_made().clone());
                                let model = Model::Onnx { library: library.clone(), model };
                                loaded = Some(Loaded { dir, tags, model });
                                let load_ms = started.elapsed().as_millis() as u64;
                                (None, Some(isorun_protocol::Preloaded { load_ms, onnx }))
                            }
                            Ok(Err(e)) => (Some(format!("preloading the unit's model: {e}")), None),
                            Err(panic) => (Some(panic_message(&panic)), None),
                        }
                    }
                    // The unit's own model is the warm-up: loaded once, held for its `Run`.
                    WarmUp::Preload(preload) => {
                        match catch_unwind(AssertUnwindSafe(|| warm::preload(preload, &mut libraries))) {
                            Ok(Ok((model, preloaded))) => {
                                let (dir, tags) = (preload.model_dir.clone(), preload.tags.clone());
                                loaded = Some(Loaded { dir, tags, model: Model::TensorFlow(model) });
                                // The first run's process-wide set-up (oneDNN's kernels), on a
                                // graph of our own, unless the zygote made the kernels.
                                let gemm = match crate::onednn::warmed() {
                                    true => None,
                                    false => match catch_unwind(AssertUnwindSafe(|| warm::gemm(&preload.config))) {
                                        Ok(result) => result.err(),
                                        Err(panic) => Some(panic_message(&panic)),
                                    },
                                };
                                (gemm.map(|e| format!("warming the matrix product: {e}")), Some(preloaded))
                            }
                            // The unit's `Run` loads it again and says what is wrong.
                            Ok(Err(e)) => (Some(format!("preloading the unit's model: {e}")), None),
                            Err(panic) => (Some(panic_message(&panic)), None),
                        }
                    }
                    WarmUp::BuiltIn(Ok(dir)) => {
                        match catch_unwind(AssertUnwindSafe(|| warm::warm_up(&dir, &warm.config, warm.cpu_only))) {
                            Ok(result) => (result.err(), None),
                            Err(panic) => (Some(panic_message(&panic)), None),
                        }
                    }
                    WarmUp::BuiltIn(Err(message)) => (Some(message), None),
                };
                let warm_ms = started.elapsed().as_millis() as u64;
                write_frame(&mut socket, &WorkerMessage::Warmed { warm_ms, error, preloaded })?;
            }
            ToWorker::Run(request) => {
                let unit = request.unit;
                spin = std::time::Duration::from_micros(request.config.spin_us.into());
                if spare_sandbox.as_ref().is_some_and(|spec| *spec != request.sandbox) {
                    let error = ModelError::new(
                        ErrorKind::LoadFailed,
                        "this spare worker was confined for other models than the request's (an isorun bug)",
                    );
                    write_frame(
                        &mut socket,
                        &WorkerMessage::Finished { unit, run_us: 0, result: UnitResult::Err(error) },
                    )?;
                    continue;
                }
                if let (false, Some(spec)) = (sandboxed, &request.sandbox) {
                    // Before any model is loaded and before TensorFlow starts a thread.
                    let applied = isorun_sandbox::apply(spec);
                    sandboxed = true;
                    let message = WorkerMessage::Sandboxed {
                        protections: applied.protections,
                        missing: applied.missing,
                        steps_us: applied.steps.iter().map(|(n, d)| (n.to_string(), d.as_micros() as u64)).collect(),
                    };
                    write_frame(&mut socket, &message)?;
                }
                let answer = catch_unwind(AssertUnwindSafe(|| {
                    // Custom-op libraries are TensorFlow's.
                    if request.runtime == Runtime::TensorFlow {
                        if let Err(e) = load_libraries(&request.libraries, &mut libraries) {
                            return Ok((0, UnitResult::Err(e)));
                        }
                    }
                    run_unit(&mut socket, &mut loaded, &request, &shared)
                }));
                let (run_us, result) = match answer {
                    Ok(answer) => answer?,
                    Err(panic) => (0, UnitResult::Err(ModelError::new(ErrorKind::WorkerPanic, panic_message(&panic)))),
                };
                inbox.send(&mut socket, &WorkerMessage::Finished { unit, run_us, result })?;
            }
        }
    }
}

fn run_unit(
    socket: &mut UnixStream,
    loaded: &mut Option<Loaded>,
    request: &RunRequest,
    shared: &[SharedMemory],
) -> io::Result<(u64, UnitResult)> {
    let started = Instant::now();
    let reuse = loaded.as_ref().is_some_and(|l| l.serves(request));
    if !reuse {
        // Drop the old model first, so that two are never held at once.
        *loaded = None;
        let model = match &request.runtime {
            Runtime::TensorFlow => {
                SavedModel::load(Path::new(&request.model_dir), &request.tags, &request.config).map(Model::TensorFlow)
            }
            Runtime::Onnx { library } => OnnxModel::load(library, &request.model_dir, &request.config)
                .map(|model| Model::Onnx { library: library.clone(), model }),
        };
        match model {
            Ok(model) => *loaded = Some(Loaded { dir: request.model_dir.clone(), tags: request.tags.clone(), model }),
            Err(e) => return Ok((0, UnitResult::Err(e))),
        }
    }
    let model = &mut loaded.as_mut().expect("loaded above").model;
    // `Loaded` only when this request loaded the model: the supervisor knows
    // when it sends a model's next request to the worker that holds it, and
    // one message less is one wake-up less for it per request.
    if !reuse {
        write_frame(
            socket,
            &WorkerMessage::Loaded {
                unit: request.unit,
                load_ms: started.elapsed().as_millis() as u64,
                onnx: match model {
                    Model::TensorFlow(_) => None,
                    Model::Onnx { model, .. } => Some(model.session_made().clone()),
                },
            },
        )?;
    }
    let model = match model {
        Model::TensorFlow(model) => model,
        Model::Onnx { model, .. } => return Ok(run_onnx(model, request, shared)),
    };
    if request.load_only {
        return Ok((
            0,
            match model.signature(&request.signature) {
                Ok(_) => UnitResult::Ok { outputs: Vec::new() },
                Err(e) => UnitResult::Err(e),
            },
        ));
    }
    let run_started = Instant::now();
    let result = run_signature(model, request, shared);
    let run_us = run_started.elapsed().as_micros() as u64;
    Ok((
        run_us,
        match result {
            Ok(outputs) => UnitResult::Ok { outputs },
            Err(e) => UnitResult::Err(e),
        },
    ))
}

/// Runs a loaded `.onnx` model (or, for `load_only`, checks that isorun
/// can carry what it takes and gives); `run_us` is ONNX Runtime's run alone.
fn run_onnx(model: &mut OnnxModel, request: &RunRequest, shared: &[SharedMemory]) -> (u64, UnitResult) {
    if request.load_only {
        return match model.signature() {
            Ok(_) => (0, UnitResult::Ok { outputs: Vec::new() }),
            Err(e) => (0, UnitResult::Err(e)),
        };
    }
    let mut run_time = std::time::Duration::ZERO;
    let result = model.run(&request.inputs, shared, &mut run_time);
    let run_us = run_time.as_micros() as u64;
    match result {
        Ok(outputs) => (run_us, UnitResult::Ok { outputs }),
        Err(e) => (run_us, UnitResult::Err(e)),
    }
}

fn run_signature(
    model: &SavedModel,
    request: &RunRequest,
    shared: &[SharedMemory],
) -> Result<Vec<(String, isorun_protocol::Tensor)>, ModelError> {
    let (info, _) = model.signature(&request.signature)?;
    let ordered = match_inputs(&info, &request.inputs)?;
    let with_bytes: Vec<_> = ordered.into_iter().map(|t| (t, dense_bytes(t, shared))).collect();
    model.run(&request.signature, &with_bytes)
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("worker panicked: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("worker panicked: {s}")
    } else {
        "worker panicked".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_protocol::{Preload, SessionConfig, WarmRequest};
    use isorun_transport::{read_frame, RequestEnvelope};

    fn next(socket: &mut UnixStream) -> WorkerMessage {
        read_frame(socket, DEFAULT_MAX_FRAME).unwrap()
    }

    /// A spare warms up on the built-in model (real TensorFlow), then
    /// refuses a request whose sandbox is not the one it warmed up under:
    /// it runs only the units it was forked and confined for.
    #[test]
    fn a_spare_warms_up_and_refuses_a_request_confined_for_other_models() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || serve(theirs));
        let mut reader = ours.try_clone().unwrap();
        assert!(matches!(next(&mut reader), WorkerMessage::Hello(_)));
        let warm_dir = tempfile::tempdir().unwrap();
        let config = SessionConfig { intra_op_threads: 1, inter_op_threads: 1, ..SessionConfig::default() };
        let warm = WarmRequest {
            sandbox: None,
            config,
            warm_dir: warm_dir.path().to_string_lossy().into_owned(),
            cpu_only: true,
            preload: None,
        };
        RequestEnvelope::new(&ToWorker::Warm(warm), Vec::new()).send(&ours).unwrap();
        match next(&mut reader) {
            WorkerMessage::Warmed { error, .. } => assert_eq!(error, None, "the built-in model loads and runs"),
            other => panic!("expected Warmed, got {other:?}"),
        }
        let written = warm_dir.path().join(format!("spare-{}", std::process::id()));
        assert!(written.join("saved_model.pb").is_file() && written.join("variables/variables.index").is_file());
        let elsewhere = SandboxSpec { read_paths: vec!["/elsewhere".into()], work_dir: None, core_dumps: false };
        let request = RunRequest {
            unit: 7,
            model_dir: "/elsewhere/model".into(),
            tags: vec!["serve".into()],
            signature: "serving_default".into(),
            inputs: Vec::new(),
            config,
            load_only: false,
            libraries: Vec::new(),
            sandbox: Some(elsewhere),
            runtime: isorun_protocol::Runtime::TensorFlow,
        };
        RequestEnvelope::new(&ToWorker::Run(request), Vec::new()).send(&ours).unwrap();
        match next(&mut reader) {
            WorkerMessage::Finished { unit: 7, result: UnitResult::Err(error), .. } => {
                assert!(error.message.contains("confined for other models"), "{}", error.message)
            }
            other => panic!("expected the request refused, got {other:?}"),
        }
        RequestEnvelope::new(&ToWorker::Shutdown, Vec::new()).send(&ours).unwrap();
        server.join().unwrap().unwrap();
    }

    /// A spare given its unit's model loads it as its warm-up (real
    /// TensorFlow; no built-in model written) and holds it: the unit's
    /// `Run` of that model is answered without loading it again (no
    /// `Loaded`), and a `Run` of another model loads that one. A preload
    /// that fails says so in `Warmed`, holds nothing, and the unit's `Run`
    /// then fails on its own load, as in a fresh worker.
    #[test]
    fn a_spare_preloads_its_units_model_and_the_unit_finds_it_loaded() {
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("warmup/model");
        let model = model.to_string_lossy().into_owned();
        let other = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/models/linear_regressor");
        let config = SessionConfig { intra_op_threads: 1, inter_op_threads: 1, ..SessionConfig::default() };
        let run = |dir: &str, unit: u64| RunRequest {
            unit,
            model_dir: dir.into(),
            tags: vec!["serve".into()],
            signature: "serving_default".into(),
            inputs: Vec::new(),
            config,
            load_only: true,
            libraries: Vec::new(),
            sandbox: None,
            runtime: isorun_protocol::Runtime::TensorFlow,
        };
        let spare = |dir: &str| {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let server = std::thread::spawn(move || serve(theirs));
            let mut reader = ours.try_clone().unwrap();
            assert!(matches!(next(&mut reader), WorkerMessage::Hello(_)));
            let warm_dir = tempfile::tempdir().unwrap();
            let preload = Preload {
                model_dir: dir.into(),
                tags: vec!["serve".into()],
                config,
                libraries: Vec::new(),
                runtime: Runtime::TensorFlow,
            };
            let warm = WarmRequest {
                sandbox: None,
                config,
                warm_dir: warm_dir.path().to_string_lossy().into_owned(),
                cpu_only: true,
                preload: Some(preload),
            };
            RequestEnvelope::new(&ToWorker::Warm(warm), Vec::new()).send(&ours).unwrap();
            let warmed = next(&mut reader);
            assert_eq!(std::fs::read_dir(warm_dir.path()).unwrap().count(), 0, "no built-in model written");
            (ours, reader, server, warmed)
        };

        let (ours, mut reader, server, warmed) = spare(&model);
        match warmed {
            WorkerMessage::Warmed { error: None, preloaded: Some(_), .. } => {}
            other => panic!("expected Warmed with the model preloaded, got {other:?}"),
        }
        RequestEnvelope::new(&ToWorker::Run(run(&model, 1)), Vec::new()).send(&ours).unwrap();
        match next(&mut reader) {
            WorkerMessage::Finished { unit: 1, result: UnitResult::Ok { .. }, .. } => {}
            other => panic!("expected Finished without a load first, got {other:?}"),
        }
        RequestEnvelope::new(&ToWorker::Run(run(&other.to_string_lossy(), 2)), Vec::new()).send(&ours).unwrap();
        assert!(matches!(next(&mut reader), WorkerMessage::Loaded { unit: 2, .. }), "another model is loaded");
        assert!(matches!(next(&mut reader), WorkerMessage::Finished { unit: 2, result: UnitResult::Ok { .. }, .. }));
        RequestEnvelope::new(&ToWorker::Shutdown, Vec::new()).send(&ours).unwrap();
        server.join().unwrap().unwrap();

        let missing = tempfile::tempdir().unwrap().path().join("gone");
        let missing = missing.to_string_lossy().into_owned();
        let (ours, mut reader, server, warmed) = spare(&missing);
        match warmed {
            WorkerMessage::Warmed { error: Some(error), preloaded: None, .. } => {
                assert!(error.starts_with("preloading the unit's model"), "{error}")
            }
            other => panic!("expected Warmed saying the preload failed, got {other:?}"),
        }
        RequestEnvelope::new(&ToWorker::Run(run(&missing, 3)), Vec::new()).send(&ours).unwrap();
        match next(&mut reader) {
            WorkerMessage::Finished { unit: 3, result: UnitResult::Err(e), .. } => {
                assert_eq!(e.kind, ErrorKind::LoadFailed, "{e:?}")
            }
            other => panic!("expected the unit's own load to fail, got {other:?}"),
        }
        RequestEnvelope::new(&ToWorker::Shutdown, Vec::new()).send(&ours).unwrap();
        server.join().unwrap().unwrap();
    }
}
