//! `.onnx` models in the real worker binary with the real ONNX Runtime
//! (issue 41): each test starts `isorun-worker` as the supervisor does (its
//! socket in `ISORUN_IPC_FD`), one process per test, since a process opens
//! one ONNX Runtime library and makes one environment. Expected numbers are
//! what `onnxruntime` 1.32.0's Python API gives on the same fixtures
//! (tests/fixtures/onnx, scripts/make_onnx_fixtures.py), committed here.

mod common;

use common::fixture;

use isorun_protocol::{
    DType, ErrorKind, ModelError, RunRequest, Runtime, SandboxSpec, SessionConfig, Tensor, TensorData, ToWorker,
    UnitResult, WorkerMessage, ENV_IPC_FD,
};
use isorun_transport::{read_frame, RequestEnvelope, SharedMemory, DEFAULT_MAX_FRAME};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The worker binary on one end of a socket pair.
struct Worker {
    child: Child,
    socket: UnixStream,
}

impl Worker {
    fn start() -> Worker {
        Worker::start_with(Stdio::inherit())
    }

    /// A worker whose stderr goes to `stderr`.
    fn start_with(stderr: Stdio) -> Worker {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let fd = theirs.as_raw_fd();
        let mut command = Command::new(env!("CARGO_BIN_EXE_isorun-worker"));
        command.env(ENV_IPC_FD, fd.to_string()).stderr(stderr);
        // As isorun starts its workers: ONNX Runtime writes nothing into the home folder.
        command.env("ORT_DISABLE_TELEMETRY", "1");
        // SAFETY: fcntl only, between fork and exec: the child keeps its end.
        unsafe {
            command.pre_exec(move || match libc::fcntl(fd, libc::F_SETFD, 0) {
                -1 => Err(std::io::Error::last_os_error()),
                _ => Ok(()),
            });
        }
        let child = command.spawn().expect("isorun-worker starts");
        drop(theirs);
        let mut worker = Worker { child, socket: ours };
        assert!(matches!(worker.next(), WorkerMessage::Hello(_)));
        worker
    }

    fn next(&mut self) -> WorkerMessage {
        read_frame(&mut self.socket, DEFAULT_MAX_FRAME).expect("the worker answers")
    }

    /// Sends `request` and returns every answer up to its `Finished`.
    fn run(&mut self, request: RunRequest, shared: Vec<SharedMemory>) -> (Vec<WorkerMessage>, u64, UnitResult) {
        RequestEnvelope::new(&ToWorker::Run(request), shared).send(&self.socket).unwrap();
        let mut before = Vec::new();
        loop {
            match self.next() {
                WorkerMessage::Finished { run_us, result, .. } => return (before, run_us, result),
                other => before.push(other),
            }
        }
    }
}

impl Worker {
    /// Shuts the worker down; what it wrote on a piped stderr.
    fn stderr(mut self) -> String {
        RequestEnvelope::new(&ToWorker::Shutdown, Vec::new()).send(&self.socket).unwrap();
        let mut text = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            std::io::Read::read_to_string(&mut stderr, &mut text).unwrap();
        }
        text
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = RequestEnvelope::new(&ToWorker::Shutdown, Vec::new()).send(&self.socket);
        let _ = self.child.wait();
    }
}

fn request(library: &str, model: &str, inputs: Vec<(String, Tensor)>) -> RunRequest {
    RunRequest {
        unit: 1,
        model_dir: model.into(),
        tags: Vec::new(),
        signature: String::new(),
        inputs,
        config: SessionConfig { intra_op_threads: 1, inter_op_threads: 1, ..SessionConfig::default() },
        load_only: false,
        libraries: Vec::new(),
        sandbox: None,
        runtime: Runtime::Onnx { library: library.into() },
    }
}

fn library() -> String {
    common::library().to_string_lossy().into_owned()
}

fn f32s(shape: Vec<u64>, values: &[f32]) -> Tensor {
    Tensor::dense(DType::Float32, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
}

fn floats(tensor: &Tensor) -> Vec<f32> {
    match &tensor.data {
        TensorData::Dense(bytes) => bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        other => panic!("expected dense bytes, got {other:?}"),
    }
}

fn outputs(result: UnitResult) -> Vec<(String, Tensor)> {
    match result {
        UnitResult::Ok { outputs } => outputs,
        UnitResult::Err(e) => panic!("expected outputs, got {e:?}"),
    }
}

fn error(result: UnitResult) -> ModelError {
    match result {
        UnitResult::Err(e) => e,
        UnitResult::Ok { outputs } => panic!("expected an error, got outputs {outputs:?}"),
    }
}

fn assert_close(got: &[f32], expected: &[f32]) {
    assert_eq!(got.len(), expected.len(), "{got:?} vs {expected:?}");
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() <= 1e-6 * e.abs().max(1.0), "{got:?} vs {expected:?}");
    }
}

/// mlp.onnx (Gemm + Relu) on three rows, the input through shared memory
/// as the supervisor sends a large one: onnxruntime's numbers.
#[test]
fn mlp_outputs_are_onnxruntimes() {
    let library = library();
    let mut worker = Worker::start();
    let x = f32s(vec![3, 4], &[1., 2., 3., 4., -1., 0.5, -2., 0.25, 0.5, -1.5, 2.0, -0.75]);
    let TensorData::Dense(bytes) = &x.data else { unreachable!() };
    let region = SharedMemory::from_bytes(bytes).unwrap();
    let x = Tensor { data: TensorData::Shared(0), ..x };
    let (before, run_us, result) =
        worker.run(request(&library, &fixture("mlp.onnx"), vec![("x".into(), x)]), vec![region]);
    // The CPU wheel's session, said so in `Loaded` for the record.
    let cpu = Some(isorun_protocol::OnnxSession {
        execution_provider: isorun_protocol::ExecutionProvider::Cpu,
        cuda_error: None,
    });
    assert!(matches!(before[..], [WorkerMessage::Loaded { unit: 1, ref onnx, .. }] if *onnx == cpu), "{before:?}");
    assert!(run_us > 0);
    let outputs = outputs(result);
    assert_eq!(outputs.len(), 1);
    let (name, y) = &outputs[0];
    assert_eq!((name.as_str(), y.dtype, &y.shape[..]), ("y", DType::Float32, &[3u64, 3][..]));
    #[rustfmt::skip]
    let expected = [
        0.0, 5.3694177, 0.0,
        0.0, 0.0, 0.8519494,
        1.9221462, 3.1444278, 0.09832264,
    ];
    assert_close(&floats(y), &expected);
}

/// A Keras model converted by tf2onnx (Dense relu, Dense softmax), as
/// onnxruntime's Python API runs it.
#[test]
fn a_tf2onnx_keras_model_gives_onnxruntimes_outputs() {
    let library = library();
    let mut worker = Worker::start();
    let x = f32s(vec![2, 4], &[1., 2., 3., 4., -1., 0.5, -2., 0.25]);
    let (_, _, result) = worker.run(request(&library, &fixture("keras_tf2onnx.onnx"), vec![("x".into(), x)]), vec![]);
    let outputs = outputs(result);
    assert_eq!(outputs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["probabilities"]);
    assert_eq!(outputs[0].1.shape, [2, 3]);
    #[rustfmt::skip]
    let expected = [
        0.26497352, 0.037378997, 0.69764745,
        0.72333676, 0.112935595, 0.16372769,
    ];
    assert_close(&floats(&outputs[0].1), &expected);
}

/// dtypes.onnx: float16, bfloat16, string (not UTF-8, with a NUL byte),
/// bool (a scalar, negated by the model), int64 of unknown rank and uint8
/// come back as given, every output sorted by name.
#[test]
fn every_dtype_round_trips() {
    let library = library();
    let mut worker = Worker::start();
    let half: Vec<u8> = (0..16u16).flat_map(|i| (0x3c00 + i).to_le_bytes()).collect();
    let brain: Vec<u8> = (0..6u16).flat_map(|i| (0x3f80 + i).to_le_bytes()).collect();
    let ids: Vec<u8> = [-3i64, 0, i64::MAX, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
    let small: Vec<u8> = (0..18u8).map(|i| i * 14).collect();
    let text = vec![b"caf\xe9".to_vec(), Vec::new(), b"a\0b".to_vec()];
    let inputs = vec![
        ("half".to_string(), Tensor::dense(DType::Float16, vec![2, 8], half.clone())),
        ("brain".to_string(), Tensor::dense(DType::BFloat16, vec![2, 3], brain.clone())),
        ("text".to_string(), Tensor::strings(vec![3], text.clone())),
        ("flag".to_string(), Tensor::dense(DType::Bool, vec![], vec![1])),
        ("ids".to_string(), Tensor::dense(DType::Int64, vec![2, 2], ids.clone())),
        ("small".to_string(), Tensor::dense(DType::UInt8, vec![2, 3, 3], small.clone())),
    ];
    let (_, _, result) = worker.run(request(&library, &fixture("dtypes.onnx"), inputs), vec![]);
    let outputs = outputs(result);
    let expected = vec![
        ("brain_out".to_string(), Tensor::dense(DType::BFloat16, vec![2, 3], brain)),
        ("flag_out".to_string(), Tensor::dense(DType::Bool, vec![], vec![0])),
        ("half_out".to_string(), Tensor::dense(DType::Float16, vec![2, 8], half)),
        ("ids_out".to_string(), Tensor::dense(DType::Int64, vec![2, 2], ids)),
        ("small_out".to_string(), Tensor::dense(DType::UInt8, vec![2, 3, 3], small)),
        ("text_out".to_string(), Tensor::strings(vec![3], text)),
    ];
    assert_eq!(outputs, expected);
}

/// The model is loaded once: a second request for the same file (tags
/// differ, and mean nothing to ONNX) gets no `Loaded`; `load_only` loads
/// without running; another file replaces it.
#[test]
fn a_model_stays_loaded_between_requests() {
    let library = library();
    let mut worker = Worker::start();
    let mlp = fixture("mlp.onnx");
    let mut first = request(&library, &mlp, Vec::new());
    first.load_only = true;
    let (before, run_us, result) = worker.run(first, vec![]);
    assert!(matches!(before[..], [WorkerMessage::Loaded { unit: 1, .. }]), "{before:?}");
    assert_eq!((run_us, outputs(result)), (0, Vec::new()));
    let mut second = request(&library, &mlp, vec![("x".into(), f32s(vec![1, 4], &[1., 2., 3., 4.]))]);
    second.unit = 2;
    second.tags = vec!["serve".into()];
    let (before, _, result) = worker.run(second, vec![]);
    assert!(before.is_empty(), "no second load: {before:?}");
    assert_close(&floats(&outputs(result)[0].1), &[0.0, 5.3694177, 0.0]);
    let mut other = request(&library, &fixture("external/external.onnx"), Vec::new());
    other.unit = 3;
    other.load_only = true;
    let (before, _, result) = worker.run(other, vec![]);
    assert!(matches!(before[..], [WorkerMessage::Loaded { unit: 3, .. }]), "{before:?}");
    outputs(result);
}

/// A spare given its unit's ONNX model preloads it (ONNX Runtime opened,
/// environment and session made in the spare, no TensorFlow warm-up, no
/// warm-up model written) and the unit's `Run` finds it loaded: no
/// `Loaded`, the right outputs. A preload that fails says so and the `Run`
/// loads again and says what is wrong.
#[test]
fn a_spare_preloads_its_units_onnx_model() {
    let library = library();
    let mlp = fixture("mlp.onnx");
    let config = SessionConfig { intra_op_threads: 1, inter_op_threads: 1, ..SessionConfig::default() };
    let warm = |model: &str, warm_dir: &std::path::Path| isorun_protocol::WarmRequest {
        sandbox: None,
        config,
        warm_dir: warm_dir.to_string_lossy().into_owned(),
        cpu_only: true,
        preload: Some(isorun_protocol::Preload {
            model_dir: model.into(),
            tags: Vec::new(),
            config,
            libraries: Vec::new(),
            runtime: Runtime::Onnx { library: library.clone() },
        }),
    };
    let warm_dir = tempfile::tempdir().unwrap();
    let mut worker = Worker::start();
    RequestEnvelope::new(&ToWorker::Warm(warm(&mlp, warm_dir.path())), Vec::new()).send(&worker.socket).unwrap();
    match worker.next() {
        WorkerMessage::Warmed { error: None, preloaded: Some(preloaded), .. } => {
            let session = preloaded.onnx.expect("an ONNX preload says how its session was made");
            assert_eq!(session.execution_provider, isorun_protocol::ExecutionProvider::Cpu);
        }
        other => panic!("expected Warmed with the model preloaded, got {other:?}"),
    }
    assert_eq!(std::fs::read_dir(warm_dir.path()).unwrap().count(), 0, "no TensorFlow warm-up model written");
    let (before, _, result) =
        worker.run(request(&library, &mlp, vec![("x".into(), f32s(vec![1, 4], &[1., 2., 3., 4.]))]), vec![]);
    assert!(before.is_empty(), "the unit found its model loaded: {before:?}");
    assert_close(&floats(&outputs(result)[0].1), &[0.0, 5.3694177, 0.0]);
    drop(worker);

    let truncated = fixture("truncated.onnx");
    let mut worker = Worker::start();
    RequestEnvelope::new(&ToWorker::Warm(warm(&truncated, warm_dir.path())), Vec::new()).send(&worker.socket).unwrap();
    match worker.next() {
        WorkerMessage::Warmed { error: Some(error), preloaded: None, .. } => {
            assert!(error.starts_with("preloading the unit's model"), "{error}")
        }
        other => panic!("expected Warmed saying the preload failed, got {other:?}"),
    }
    let (_, _, result) = worker.run(request(&library, &truncated, Vec::new()), vec![]);
    assert_eq!(error(result).kind, ErrorKind::LoadFailed);
}

/// A truncated file is `load_failed` with ONNX Runtime's word, naming it.
#[test]
fn a_truncated_model_is_load_failed_naming_the_file() {
    let library = library();
    let mut worker = Worker::start();
    let path = fixture("truncated.onnx");
    let (before, _, result) = worker.run(request(&library, &path, Vec::new()), vec![]);
    assert!(before.is_empty(), "{before:?}");
    let e = error(result);
    assert_eq!(e.kind, ErrorKind::LoadFailed, "{e:?}");
    assert!(e.message.starts_with(&format!("cannot load the ONNX model {path}: ")), "{}", e.message);
    assert!(e.message.contains("Protobuf parsing failed"), "{}", e.message);
}

/// A sequence-of-maps output (ZipMap) is `unsupported_dtype` naming the
/// output and how to convert the model without it, on `load_only` too.
#[test]
fn a_sequence_of_maps_output_is_unsupported_dtype() {
    let library = library();
    let mut worker = Worker::start();
    let path = fixture("sequence_map.onnx");
    let mut load = request(&library, &path, Vec::new());
    load.load_only = true;
    let (before, _, result) = worker.run(load, vec![]);
    assert!(matches!(before[..], [WorkerMessage::Loaded { .. }]), "{before:?}");
    let e = error(result);
    assert_eq!(e.kind, ErrorKind::UnsupportedDtype, "{e:?}");
    assert!(
        e.message.starts_with(&format!(
            "{path}: output 'probabilities' is sequence<map<int64, float32[]>>, which isorun cannot carry"
        )),
        "{}",
        e.message
    );
    assert!(e.message.contains("'zipmap': False"), "{}", e.message);
    let x = f32s(vec![1, 2], &[0.25, 0.75]);
    let e = error(worker.run(request(&library, &path, vec![("x".into(), x)]), vec![]).2);
    assert_eq!(e.kind, ErrorKind::UnsupportedDtype, "{e:?}");
}

/// Inputs are checked by name, dtype and shape before ONNX Runtime sees
/// them, each error naming the input, what the model takes and what came.
#[test]
fn inputs_that_do_not_fit_are_input_mismatch() {
    let library = library();
    let mut worker = Worker::start();
    let mlp = fixture("mlp.onnx");
    let cases = vec![
        (
            vec![("x".to_string(), Tensor::dense(DType::Float64, vec![1, 4], vec![0; 32]))],
            "input 'x': expected dtype float32, given float64",
        ),
        (
            vec![("x".to_string(), f32s(vec![4], &[0.; 4]))],
            "input 'x': expected shape [?, 4] (rank 2), given [4] (rank 1)",
        ),
        (
            vec![("x".to_string(), f32s(vec![1, 3], &[0.; 3]))],
            "input 'x': expected shape [?, 4], given [1, 3] (dimension 1 is 3, expected 4)",
        ),
        (Vec::new(), "missing input 'x' (float32, [?, 4]); signature 'mlp.onnx' takes: x (float32, [?, 4])"),
        (
            vec![("x".to_string(), f32s(vec![1, 4], &[0.; 4])), ("z".to_string(), f32s(vec![1], &[0.]))],
            "unknown input 'z'; signature 'mlp.onnx' takes: x (float32, [?, 4])",
        ),
    ];
    for (inputs, message) in cases {
        let e = error(worker.run(request(&library, &mlp, inputs), vec![]).2);
        assert_eq!((e.kind, e.message.as_str()), (ErrorKind::InputMismatch, message));
    }
}

/// A library that cannot be opened is `load_failed` naming it.
#[test]
fn a_missing_library_is_load_failed_naming_it() {
    let mut worker = Worker::start();
    let missing = "/nonexistent/onnxruntime/libonnxruntime.so.1.32.0";
    let e = error(worker.run(request(missing, &fixture("mlp.onnx"), Vec::new()), vec![]).2);
    assert_eq!(e.kind, ErrorKind::LoadFailed, "{e:?}");
    assert!(e.message.starts_with(&format!("cannot open ONNX Runtime's library {missing}: ")), "{}", e.message);
}

/// Confined as the supervisor confines it (Landlock read paths: the
/// library's folder and the model's; seccomp), the worker opens ONNX
/// Runtime, starts its thread pools and runs a model whose weights are in
/// a file beside it, with nothing refused on the way: no warning or error
/// from ONNX Runtime or its CPU probe (cpuinfo) on stderr.
#[test]
fn onnx_runtime_runs_under_the_sandbox() {
    let library = library();
    let mut worker = Worker::start_with(Stdio::piped());
    let model = fixture("external/external.onnx");
    let folder = |p: &str| Path::new(p).parent().unwrap().to_string_lossy().into_owned();
    let x: Vec<f32> = (0..32).map(|i| i as f32 / 10.0).collect();
    let mut confined = request(&library, &model, vec![("x".into(), f32s(vec![2, 16], &x))]);
    confined.sandbox =
        Some(SandboxSpec { read_paths: vec![folder(&library), folder(&model)], work_dir: None, core_dumps: false });
    // ONNX Runtime's own thread pools (one thread per core), under seccomp too.
    confined.config = SessionConfig::default();
    let (before, _, result) = worker.run(confined, vec![]);
    match &before[..] {
        [WorkerMessage::Sandboxed { protections, missing, .. }, WorkerMessage::Loaded { .. }] => {
            eprintln!("sandbox: in force {protections:?}, missing {missing:?}")
        }
        other => panic!("expected Sandboxed then Loaded, got {other:?}"),
    }
    #[rustfmt::skip]
    let expected = [
        2.3241906, 0.10590401, 1.2891879, -1.3451399, 0.19383454, 3.8648427, 3.3368683, -0.627879,
        4.835697, -0.27168643, 9.273662, -4.3045163, -2.1802328, 5.98213, 9.304989, -4.1503024,
    ];
    let outputs = outputs(result);
    assert_close(&floats(&outputs[0].1), &expected);
    let stderr = worker.stderr();
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("[E:onnxruntime") || l.contains("[W:onnxruntime") || l.contains("cpuinfo"))
        .collect();
    assert!(complaints.is_empty(), "ONNX Runtime under the sandbox: {complaints:?}");
}

/// A sandboxed ONNX worker is granted the library's folder, the model file
/// and each external-data file the model declares (resolved); ONNX
/// Runtime's own reads go through that confinement. Here the weights beside
/// the model are left out of the grant, standing for any file beside a model
/// that is not its own: confined, Landlock refuses the read and the unit is
/// `load_failed` naming the file; unconfined, the same model runs. (ONNX
/// Runtime 1.32 itself refuses external data that resolves outside the
/// model's folder, and the supervisor refuses a link before any worker:
/// `onnx::an_onnx_unit_runs_sandboxed_and_a_link_to_a_secret_...`.)
#[test]
fn a_confined_worker_s_onnx_runtime_reads_only_the_files_it_was_granted() {
    let library = library();
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = tmp.path().join("model");
    std::fs::create_dir(&model_dir).unwrap();
    std::fs::copy(fixture("external/external.onnx"), model_dir.join("external.onnx")).unwrap();
    std::fs::copy(fixture("external/weights.bin"), model_dir.join("weights.bin")).unwrap();
    let model = model_dir.join("external.onnx").to_string_lossy().into_owned();
    let x: Vec<f32> = (0..32).map(|i| i as f32 / 10.0).collect();
    let inputs = || vec![("x".to_string(), f32s(vec![2, 16], &x))];

    let mut free = Worker::start();
    let outputs = outputs(free.run(request(&library, &model, inputs()), vec![]).2);
    assert_eq!(outputs[0].1.shape, vec![2, 8], "unconfined, the weights are read and the model runs");

    let mut worker = Worker::start_with(Stdio::piped());
    let folder = Path::new(&library).parent().unwrap().to_string_lossy().into_owned();
    let mut confined = request(&library, &model, inputs());
    confined.sandbox = Some(SandboxSpec { read_paths: vec![folder, model.clone()], work_dir: None, core_dumps: false });
    let (before, _, result) = worker.run(confined, vec![]);
    let [WorkerMessage::Sandboxed { protections, .. }, ..] = &before[..] else {
        panic!("expected Sandboxed first, got {before:?}")
    };
    assert!(protections.iter().any(|p| p == "landlock"), "Landlock in force here: {protections:?}");
    let e = error(result);
    assert_eq!(e.kind, ErrorKind::LoadFailed, "{e:?}");
    assert!(e.message.contains("weights.bin"), "ONNX Runtime names the file it could not read: {}", e.message);
}

/// A tensor of tests/fixtures/onnx/expected.json: `{"dtype", "shape",
/// "values"}`, values nested in the shape, each float its exact value.
fn tensor_from_json(name: &str, t: &serde_json::Value) -> Tensor {
    let dtype =
        DType::from_name(t["dtype"].as_str().unwrap()).unwrap_or_else(|| panic!("{name}: dtype {}", t["dtype"]));
    let shape: Vec<u64> = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
    fn flatten<'a>(v: &'a serde_json::Value, into: &mut Vec<&'a serde_json::Value>) {
        match v.as_array() {
            Some(items) => items.iter().for_each(|i| flatten(i, into)),
            None => into.push(v),
        }
    }
    let mut values = Vec::new();
    flatten(&t["values"], &mut values);
    let bad = |v: &serde_json::Value| -> ! { panic!("{name}: {v} is not a {dtype}") };
    let float = |v: &serde_json::Value| v.as_f64().unwrap_or_else(|| bad(v));
    let int = |v: &serde_json::Value| v.as_i64().unwrap_or_else(|| bad(v));
    let uint = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| bad(v));
    if dtype == DType::String {
        let strings = values.iter().map(|v| v.as_str().unwrap_or_else(|| bad(v)).as_bytes().to_vec()).collect();
        return Tensor::strings(shape, strings);
    }
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|&v| match dtype {
            DType::Float32 => (float(v) as f32).to_le_bytes().to_vec(),
            DType::Float64 => float(v).to_le_bytes().to_vec(),
            DType::Float16 => half::f16::from_f64(float(v)).to_le_bytes().to_vec(),
            DType::BFloat16 => half::bf16::from_f64(float(v)).to_le_bytes().to_vec(),
            DType::Int8 => (int(v) as i8).to_le_bytes().to_vec(),
            DType::Int16 => (int(v) as i16).to_le_bytes().to_vec(),
            DType::Int32 => (int(v) as i32).to_le_bytes().to_vec(),
            DType::Int64 => int(v).to_le_bytes().to_vec(),
            DType::UInt8 => (uint(v) as u8).to_le_bytes().to_vec(),
            DType::UInt16 => (uint(v) as u16).to_le_bytes().to_vec(),
            DType::UInt32 => (uint(v) as u32).to_le_bytes().to_vec(),
            DType::UInt64 => uint(v).to_le_bytes().to_vec(),
            DType::Bool => vec![u8::from(v.as_bool().unwrap_or_else(|| bad(v)))],
            DType::String => unreachable!(),
        })
        .collect();
    Tensor::dense(dtype, shape, bytes)
}

/// A float tensor's values as f64 (`None` for other dtypes).
fn as_f64s(tensor: &Tensor) -> Option<Vec<f64>> {
    let TensorData::Dense(bytes) = &tensor.data else { return None };
    Some(match tensor.dtype {
        DType::Float32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()).into()).collect(),
        DType::Float64 => bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
        DType::Float16 => bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        DType::BFloat16 => bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        _ => return None,
    })
}

/// Every model in tests/fixtures/onnx/expected.json (graphs from
/// onnx.helper, scikit-learn through skl2onnx, Keras through tf2onnx), run
/// one after another in one worker, gives what onnxruntime's Python API
/// gave there: the same outputs (floats within 1e-5 relative: thread
/// counts differ), the same load error for a model ONNX Runtime refuses
/// (an op it lacks), and `unsupported_dtype` for a sequence output (ZipMap).
#[test]
fn every_fixture_gives_onnxruntimes_outputs() {
    let library = library();
    let expected = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx/expected.json");
    let text = std::fs::read_to_string(&expected)
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/make_onnx_fixtures.py writes it)", expected.display()));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let models = json["models"].as_object().expect("expected.json has models");
    let mut worker = Worker::start();
    for (unit, (file, entry)) in models.iter().enumerate() {
        let path = fixture(file);
        let inputs = entry["inputs"].as_object().map_or_else(Vec::new, |inputs| {
            inputs.iter().map(|(name, t)| (name.clone(), tensor_from_json(&format!("{file}: {name}"), t))).collect()
        });
        let mut run = request(&library, &path, inputs);
        run.unit = unit as u64;
        let (_, _, result) = worker.run(run, vec![]);
        if let Some(load_error) = entry["load_error"].as_str() {
            let e = error(result);
            // Python's binding puts "[ONNXRuntimeError] : 1 : FAIL : " before ONNX Runtime's message.
            let message = load_error.rsplit(" : ").next().unwrap();
            assert_eq!(e.kind, ErrorKind::LoadFailed, "{file}: {e:?}");
            assert!(e.message.contains(&path) && e.message.contains(message), "{file}: {}", e.message);
            continue;
        }
        let declared = entry["outputs"].as_object().unwrap();
        if let Some((name, _)) = declared.iter().find(|(_, t)| t.get("dtype").is_none()) {
            let e = error(result);
            assert_eq!(e.kind, ErrorKind::UnsupportedDtype, "{file}: {e:?}");
            assert!(e.message.contains(&format!("output '{name}' is sequence<")), "{file}: {}", e.message);
            continue;
        }
        let mut wanted: Vec<(String, Tensor)> =
            declared.iter().map(|(name, t)| (name.clone(), tensor_from_json(&format!("{file}: {name}"), t))).collect();
        wanted.sort_by(|a, b| a.0.cmp(&b.0));
        let got = outputs(result);
        assert_eq!(
            got.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            wanted.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            "{file}: outputs, sorted by name"
        );
        eprintln!("{file}: {} outputs, compared with onnxruntime's", got.len());
        for ((name, got), (_, want)) in got.iter().zip(&wanted) {
            assert_eq!((got.dtype, &got.shape), (want.dtype, &want.shape), "{file}: output '{name}'");
            match (as_f64s(got), as_f64s(want)) {
                (Some(g), Some(w)) => {
                    let close = g.iter().zip(&w).all(|(g, w)| (g - w).abs() <= 1e-5 * w.abs().max(1.0));
                    assert!(close, "{file}: output '{name}': {g:?}, onnxruntime gave {w:?}");
                }
                _ => assert_eq!(got, want, "{file}: output '{name}'"),
            }
        }
    }
}

/// A run ONNX Runtime refuses (two_inputs.onnx's `a` and `b` share the
/// symbolic batch size, which isorun's check does not hold them to) ends
/// with ONNX Runtime's code and message, naming the file; the worker goes on.
#[test]
fn a_failed_run_says_what_onnx_runtime_said() {
    let library = library();
    let mut worker = Worker::start();
    let path = fixture("two_inputs.onnx");
    let inputs = |rows_b: u64| {
        vec![
            ("a".to_string(), f32s(vec![2, 3], &[1.; 6])),
            ("b".to_string(), f32s(vec![rows_b, 3], &vec![2.; rows_b as usize * 3])),
        ]
    };
    let e = error(worker.run(request(&library, &path, inputs(3)), vec![]).2);
    assert_eq!((e.kind, e.code.as_deref()), (ErrorKind::Onnxruntime, Some("ORT_FAIL")), "{e:?}");
    assert!(e.message.starts_with(&format!("ONNX Runtime failed to run {path}: ")), "{}", e.message);
    assert!(e.message.contains("Attempting to broadcast an axis by a dimension other than 1"), "{}", e.message);
    let outputs = outputs(worker.run(request(&library, &path, inputs(2)), vec![]).2);
    assert_eq!(outputs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["product", "sum"]);
    assert_close(&floats(&outputs[0].1), &[2.; 6]);
    assert_close(&floats(&outputs[1].1), &[3.; 6]);
}
