//! ONNX models in the worker: ONNX Runtime's C library, opened at run time
//! from the path the request names (`Runtime::Onnx`), through the `ort`
//! crate (`load-dynamic`: nothing is downloaded or linked at build time).
//! ONNX Runtime keeps its arenas for the life of a process, as TensorFlow
//! does, which is why a model runs here, in a worker the operating system
//! takes back whole, and not in the supervisor.
//!
//! ONNX Runtime's fork rule is TensorFlow's: its environment (thread pools,
//! allocators, logging) is created after the fork, here, on the first
//! request, never in a zygote. [`open_library`] alone (a `dlopen`) starts no
//! thread, so a zygote may call it before it forks (see the test
//! `opening_onnx_runtime_starts_no_thread`).
//!
//! The inputs and outputs a model declares are read with `isorun-onnxproto`,
//! as the supervisor reads them: ONNX Runtime's C API shows an input of
//! unknown rank as a scalar, and the error messages then match the
//! supervisor's word for word. Every tensor type isorun and ONNX Runtime
//! share is carried; a sequence or map output (scikit-learn's ZipMap) is an
//! `unsupported_dtype` that says how to convert the model without it.
//!
//! A session runs on the CUDA execution provider where the library was
//! built with it (the `onnxruntime-gpu` wheel) and the worker sees a GPU
//! (`--gpus` gives each worker one as `CUDA_VISIBLE_DEVICES`; `""` is none);
//! where CUDA fails to make the session (no device, no CUDA libraries), the
//! session is made again on the CPU and the worker says why on stderr. The
//! provider used goes back in `Loaded` / `Preloaded` and so into the record.

use isorun_onnxproto::{Dim, ValueInfo, ValueType};
use isorun_protocol::matching::match_inputs;
use isorun_protocol::{
    DType, ErrorKind, ExecutionProvider, ModelError, OnnxSession, SessionConfig, SignatureInfo, Tensor, TensorData,
    TensorSpec,
};
use isorun_transport::{dense_bytes, SharedMemory};
use ort::environment::Environment;
use ort::ep::{ExecutionProvider as _, CUDA};
use ort::memory::Allocator;
use ort::session::builder::SessionBuilder;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynTensor, DynValue, Shape, TensorElementType, TensorRef};
use ort::AsPointer;
use std::ffi::CStr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The library this process opened (`ort` opens one, for good).
static OPENED: Mutex<Option<String>> = Mutex::new(None);

/// The environment (`ort` allows one per process), made on first use.
static ENVIRONMENT: Mutex<Option<Environment>> = Mutex::new(None);

/// Opens ONNX Runtime's library at `library` for the rest of the process,
/// without creating an environment: no thread starts. Once one is open,
/// another path is an error (one ONNX Runtime per process).
pub fn open_library(library: &str) -> Result<(), ModelError> {
    let mut opened = OPENED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match opened.as_deref() {
        Some(path) if path == library => Ok(()),
        Some(path) => Err(ModelError::new(
            ErrorKind::LoadFailed,
            format!(
                "this worker runs ONNX Runtime from {path} and cannot open {library} too \
                 (one ONNX Runtime per process; an isorun bug)"
            ),
        )),
        None => {
            ort::init_from(library).map_err(|e| {
                ModelError::new(ErrorKind::LoadFailed, format!("cannot open ONNX Runtime's library {library}: {e}"))
            })?;
            *opened = Some(library.to_string());
            Ok(())
        }
    }
}

/// The environment, made on first use, with the library at `library`.
fn environment(library: &str) -> Result<Environment, ModelError> {
    open_library(library)?;
    let mut environment = ENVIRONMENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(environment) = &*environment {
        return Ok(environment.clone());
    }
    let made = ort::init().with_name("isorun").with_telemetry(false).build().map_err(|e| {
        ModelError::new(ErrorKind::LoadFailed, format!("cannot create ONNX Runtime's environment ({library}): {e}"))
    })?;
    *environment = Some(made.clone());
    Ok(made)
}

/// Whether a session should try the CUDA execution provider: the worker
/// may see a GPU (`CUDA_VISIBLE_DEVICES`, read as CUDA reads it and as the
/// sandbox does: [`isorun_sandbox::gpu_visible`]) and the library was built
/// with the provider (`onnxruntime-gpu`; the CPU wheel says no without
/// touching a device).
fn cuda_wanted() -> bool {
    isorun_sandbox::gpu_visible() && CUDA::is_available().unwrap_or(false)
}

/// A loaded `.onnx` model: its session and what it declares.
pub struct OnnxModel {
    session: Session,
    /// How the session was made (its execution provider).
    made: OnnxSession,
    path: String,
    signature: SignatureInfo,
    /// Why the model cannot run in isorun though ONNX Runtime loaded it: an
    /// input or output isorun cannot carry.
    unsupported: Option<ModelError>,
}

impl OnnxModel {
    /// Creates a session for the model file at `path` with ONNX Runtime's
    /// library at `library`: on the CUDA execution provider where
    /// [`cuda_wanted`] says so and it works, on the CPU's otherwise.
    pub fn load(library: &str, path: &str, config: &SessionConfig) -> Result<OnnxModel, ModelError> {
        environment(library)?;
        OnnxModel::load_with(library, path, config, cuda_wanted())
    }

    /// [`OnnxModel::load`], trying the CUDA provider first if `try_cuda`.
    fn load_with(library: &str, path: &str, config: &SessionConfig, try_cuda: bool) -> Result<OnnxModel, ModelError> {
        let environment = environment(library)?;
        let load_failed = |what: &str, e: &dyn std::fmt::Display| {
            ModelError::new(ErrorKind::LoadFailed, format!("cannot load the ONNX model {path}: {what}{e}"))
        };
        let builder = |cuda: bool| -> Result<SessionBuilder, ModelError> {
            let mut builder = Session::builder(&environment).map_err(|e| load_failed("session options: ", &e))?;
            if config.intra_op_threads > 0 {
                builder = builder
                    .with_intra_threads(config.intra_op_threads as usize)
                    .map_err(|e| load_failed("intra-op threads: ", &e))?;
            }
            if config.inter_op_threads > 0 {
                builder = builder
                    .with_inter_threads(config.inter_op_threads as usize)
                    .map_err(|e| load_failed("inter-op threads: ", &e))?;
            }
            // ONNX Runtime's pool threads spin between runs by default. A
            // worker told to poll for its next request (`pipe --spin-us`)
            // spends CPU for latency, so they may; any other worker's wait
            // on a futex instead, leaving its CPU share to the supervisor's
            // decoding and the next spare (40 MLPs at -j 1: 16% less wall,
            // a third less CPU; see BENCHMARKS.md "ONNX models").
            if config.spin_us == 0 {
                builder = builder.with_intra_op_spinning(false).map_err(|e| load_failed("spinning: ", &e))?;
                builder = builder.with_inter_op_spinning(false).map_err(|e| load_failed("spinning: ", &e))?;
            }
            if cuda {
                // The first device the worker sees: its slot's under `--gpus`.
                CUDA::default().with_device_id(0).register(&mut builder).map_err(|e| load_failed("", &e))?;
            }
            Ok(builder)
        };
        let commit = |mut builder: SessionBuilder| {
            builder
                .commit_from_file(path)
                .map_err(|e| ModelError { code: Some(code_name(e.code()).to_string()), ..load_failed("", &e) })
        };
        let cpu = || builder(false).and_then(commit);
        // The CUDA provider where wanted; where it cannot make the session
        // (not in this build, no device, no CUDA or cuDNN library) the
        // session is made again on the CPU, and why goes into the record.
        // A model that fails on the CPU as well is the model's error, not
        // CUDA's. A CUDA context made before the failure stays until the
        // worker exits, which ends it with the unit.
        let (session, onnx) = match try_cuda.then(|| builder(true).and_then(commit)) {
            Some(Ok(session)) => {
                (session, OnnxSession { execution_provider: ExecutionProvider::Cuda, cuda_error: None })
            }
            Some(Err(cuda)) => {
                let session = cpu()?;
                let why =
                    cuda.message.strip_prefix(&format!("cannot load the ONNX model {path}: ")).unwrap_or(&cuda.message);
                eprintln!("isorun-worker: ONNX Runtime's CUDA execution provider could not make the session for {path}, so it runs on the CPU: {why}");
                (session, OnnxSession { execution_provider: ExecutionProvider::Cpu, cuda_error: Some(why.to_string()) })
            }
            None => (cpu()?, OnnxSession { execution_provider: ExecutionProvider::Cpu, cuda_error: None }),
        };
        let declared = isorun_onnxproto::read_model(Path::new(path)).map_err(|e| load_failed("", &e))?;
        let key = Path::new(path).file_name().map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned());
        let mut unsupported = None;
        let mut spec = |info: &ValueInfo, what: &str| match tensor_spec(info) {
            Some(spec) => Some(spec),
            None => {
                unsupported.get_or_insert_with(|| unsupported_message(path, what, info));
                None
            }
        };
        let inputs = declared.inputs.iter().filter_map(|i| spec(i, "input")).collect();
        let mut outputs: Vec<TensorSpec> = declared.outputs.iter().filter_map(|o| spec(o, "output")).collect();
        outputs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(OnnxModel {
            session,
            made: onnx,
            path: path.to_string(),
            signature: SignatureInfo { key, inputs, outputs },
            unsupported,
        })
    }

    /// How the session was made: its execution provider, and why CUDA's
    /// was not used where it was tried.
    pub fn session_made(&self) -> &OnnxSession {
        &self.made
    }

    /// What the model takes and gives (outputs sorted by name), or why
    /// isorun cannot run it.
    pub fn signature(&self) -> Result<&SignatureInfo, ModelError> {
        match &self.unsupported {
            Some(e) => Err(e.clone()),
            None => Ok(&self.signature),
        }
    }

    /// Runs the model on `inputs` (matched by name, checked against what
    /// it declares); every output, sorted by name. `run_time` is set to the
    /// time ONNX Runtime's run took, when it ran.
    pub fn run(
        &mut self,
        inputs: &[(String, Tensor)],
        shared: &[SharedMemory],
        run_time: &mut Duration,
    ) -> Result<Vec<(String, Tensor)>, ModelError> {
        let signature = self.signature()?;
        let ordered = match_inputs(signature, inputs)?;
        let allocator = Allocator::default();
        let mut values: Vec<(String, SessionInputValue<'_>)> = Vec::with_capacity(ordered.len());
        for (spec, tensor) in signature.inputs.iter().zip(ordered) {
            let value = match borrowed(tensor, shared) {
                Some(value) => value,
                None => to_value(&allocator, &spec.name, tensor, shared)?.into(),
            };
            values.push((spec.name.clone(), value));
        }
        let started = Instant::now();
        // The outputs are converted (copied) below, before this returns:
        // one may point into an input's bytes (an `Identity` node over a
        // borrowed input), which live only as long as `inputs` and `shared`.
        let result = self.session.run(values);
        *run_time = started.elapsed();
        // No kind of its own in the protocol: `tensorflow` is "the runtime
        // failed while running", with ONNX Runtime's code (`ORT_FAIL`).
        let outputs = result.map_err(|e| ModelError {
            kind: ErrorKind::Onnxruntime,
            code: Some(code_name(e.code()).to_string()),
            message: format!("ONNX Runtime failed to run {}: {e}", self.path),
        })?;
        let mut converted = outputs
            .into_iter()
            .map(|(name, value)| Ok((name.to_string(), from_value(&self.path, name, &value)?)))
            .collect::<Result<Vec<_>, ModelError>>()?;
        converted.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(converted)
    }
}

/// ONNX Runtime's name for an error code (`OrtErrorCode`; `ORT_ERROR` for
/// one `ort` adds later).
fn code_name(code: ort::ErrorCode) -> &'static str {
    use ort::ErrorCode as C;
    match code {
        C::Ok => "ORT_OK",
        C::GenericFailure => "ORT_FAIL",
        C::InvalidArgument => "ORT_INVALID_ARGUMENT",
        C::NoSuchFile => "ORT_NO_SUCHFILE",
        C::NoModel => "ORT_NO_MODEL",
        C::EngineError => "ORT_ENGINE_ERROR",
        C::RuntimeException => "ORT_RUNTIME_EXCEPTION",
        C::InvalidProtobuf => "ORT_INVALID_PROTOBUF",
        C::ModelLoaded => "ORT_MODEL_LOADED",
        C::NotImplemented => "ORT_NOT_IMPLEMENTED",
        C::InvalidGraph => "ORT_INVALID_GRAPH",
        C::ExecutionProviderFailure => "ORT_EP_FAIL",
        C::ModelLoadCanceled => "ORT_MODEL_LOAD_CANCELED",
        C::CompilationRequired => "ORT_MODEL_REQUIRES_COMPILATION",
        C::NotFound => "ORT_NOT_FOUND",
        C::DeviceReset => "ORT_DEVICE_RESET",
        _ => "ORT_ERROR",
    }
}

/// The spec of a declared dense tensor of a dtype isorun carries.
fn tensor_spec(info: &ValueInfo) -> Option<TensorSpec> {
    let ValueType::Tensor { elem, shape } = &info.value_type else { return None };
    let dims = shape.as_ref().map(|dims| {
        dims.iter()
            .map(|d| match d {
                Dim::Fixed(n) => Some(*n),
                Dim::Symbolic(_) | Dim::Unknown => None,
            })
            .collect()
    });
    Some(TensorSpec { name: info.name.clone(), dtype: elem.dtype()?, shape: dims })
}

/// Why isorun cannot carry input or output `info` of the model at `path`.
fn unsupported_message(path: &str, what: &str, info: &ValueInfo) -> ModelError {
    let kind = info.value_type.kind_name();
    let hint = match &info.value_type {
        ValueType::Sequence(_) | ValueType::Map { .. } => {
            " (only tensors): a scikit-learn classifier's ZipMap gives a sequence of maps; convert it with \
             skl2onnx's `options={'zipmap': False}` to get the probabilities as a tensor"
        }
        ValueType::Tensor { .. } => "",
        _ => " (only tensors)",
    };
    ModelError::new(
        ErrorKind::UnsupportedDtype,
        format!("{path}: {what} '{}' is {kind}, which isorun cannot carry{hint}", info.name),
    )
}

/// ONNX Runtime's element type for `dtype`.
fn element_type(dtype: DType) -> TensorElementType {
    match dtype {
        DType::Float32 => TensorElementType::Float32,
        DType::Float64 => TensorElementType::Float64,
        DType::Float16 => TensorElementType::Float16,
        DType::BFloat16 => TensorElementType::Bfloat16,
        DType::Int8 => TensorElementType::Int8,
        DType::Int16 => TensorElementType::Int16,
        DType::Int32 => TensorElementType::Int32,
        DType::Int64 => TensorElementType::Int64,
        DType::UInt8 => TensorElementType::Uint8,
        DType::UInt16 => TensorElementType::Uint16,
        DType::UInt32 => TensorElementType::Uint32,
        DType::UInt64 => TensorElementType::Uint64,
        DType::Bool => TensorElementType::Bool,
        DType::String => TensorElementType::String,
    }
}

/// isorun's dtype for ONNX Runtime's element type, where it has one.
fn dtype_of(element: TensorElementType) -> Option<DType> {
    DType::ALL.into_iter().find(|d| element_type(*d) == element)
}

/// `Err(message)` for a failed ONNX Runtime status (which is released).
fn check(status: ort::sys::OrtStatusPtr) -> Result<(), String> {
    if status.0.is_null() {
        return Ok(());
    }
    let api = ort::api();
    // SAFETY: a non-null status from ONNX Runtime: its message is a
    // NUL-terminated string it owns until the status is released, once.
    unsafe {
        let message = CStr::from_ptr((api.GetErrorMessage)(status.0)).to_string_lossy().into_owned();
        (api.ReleaseStatus)(status.0);
        Err(message)
    }
}

/// The input as a tensor over its bytes where they lie (the request's
/// buffer, or the shared-memory region the supervisor mapped a large input
/// or an `.npy` file into), for the numeric dtypes whose every bit pattern
/// is a value, when the bytes fit the shape and are aligned for the type:
/// a large input is then never copied in the worker. `None` for anything
/// else, which [`to_value`] copies (and checks, with its messages).
fn borrowed<'a>(tensor: &'a Tensor, shared: &'a [SharedMemory]) -> Option<SessionInputValue<'a>> {
    let size = tensor.dtype.element_size()?;
    let bytes = dense_bytes(tensor, shared)?;
    let count = Tensor::element_count(&tensor.shape)?;
    if bytes.is_empty() || count.checked_mul(size as u64) != Some(bytes.len() as u64) {
        return None;
    }
    let dims = tensor.shape.iter().map(|&d| i64::try_from(d).ok()).collect::<Option<Vec<i64>>>()?;
    macro_rules! view {
        ($t:ty) => {{
            // SAFETY: every bit pattern of these bytes is a valid `$t`
            // (plain integers and IEEE floats); align_to only reinterprets.
            let (head, body, tail) = unsafe { bytes.align_to::<$t>() };
            if !head.is_empty() || !tail.is_empty() {
                return None;
            }
            TensorRef::from_array_view((dims, body)).ok().map(SessionInputValue::from)
        }};
    }
    match tensor.dtype {
        DType::Float32 => view!(f32),
        DType::Float64 => view!(f64),
        DType::Int8 => view!(i8),
        DType::Int16 => view!(i16),
        DType::Int32 => view!(i32),
        DType::Int64 => view!(i64),
        DType::UInt8 => view!(u8),
        DType::UInt16 => view!(u16),
        DType::UInt32 => view!(u32),
        DType::UInt64 => view!(u64),
        // A bool must be 0 or 1 (copied and made so); half floats and
        // strings have no plain Rust type here.
        DType::Float16 | DType::BFloat16 | DType::Bool | DType::String => None,
    }
}

/// An ONNX Runtime tensor holding a copy of input `name`.
fn to_value(
    allocator: &Allocator,
    name: &str,
    tensor: &Tensor,
    shared: &[SharedMemory],
) -> Result<DynValue, ModelError> {
    let mismatch = |message: String| ModelError::new(ErrorKind::InputMismatch, format!("input '{name}': {message}"));
    let dims = tensor
        .shape
        .iter()
        .map(|&d| i64::try_from(d).map_err(|_| mismatch(format!("dimension {d} is too large"))))
        .collect::<Result<Vec<i64>, _>>()?;
    let count = Tensor::element_count(&tensor.shape).ok_or_else(|| mismatch("the shape overflows".into()))?;
    let mut value = DynTensor::new(allocator, element_type(tensor.dtype), Shape::new(dims))
        .map_err(|e| mismatch(format!("ONNX Runtime cannot make the tensor: {e}")))?;
    let api = ort::api();
    match (&tensor.data, tensor.dtype.element_size()) {
        (TensorData::Strings(_), Some(_)) | (TensorData::Dense(_) | TensorData::Shared(_), None) => {
            return Err(mismatch(format!("its data does not fit dtype {}", tensor.dtype)))
        }
        (TensorData::Strings(strings), None) => {
            if strings.len() as u64 != count {
                return Err(mismatch(format!("{} strings for {count} elements", strings.len())));
            }
            for (index, s) in strings.iter().enumerate() {
                let mut buffer: *mut std::ffi::c_char = std::ptr::null_mut();
                // SAFETY: `value` is a string tensor of `count` elements and
                // index < count; ONNX Runtime resizes the element to s.len()
                // bytes and hands back its buffer (binary-safe: a NUL byte
                // is kept), which is written within that length.
                unsafe {
                    check((api.GetResizedStringTensorElementBuffer)(value.ptr_mut(), index, s.len(), &mut buffer))
                        .map_err(|e| mismatch(format!("string {index}: {e}")))?;
                    if !s.is_empty() {
                        std::ptr::copy_nonoverlapping(s.as_ptr(), buffer as *mut u8, s.len());
                    }
                }
            }
        }
        (_, Some(size)) => {
            let bytes =
                dense_bytes(tensor, shared).ok_or_else(|| mismatch("its shared-memory region is missing".into()))?;
            let expected = count.checked_mul(size as u64);
            if expected != Some(bytes.len() as u64) {
                return Err(mismatch(format!(
                    "{} bytes for {count} elements of {} ({size} bytes each)",
                    bytes.len(),
                    tensor.dtype
                )));
            }
            if !bytes.is_empty() {
                let data = value.data_ptr_mut() as *mut u8;
                // SAFETY: ONNX Runtime allocated `count` elements of `size`
                // bytes at `data`, which is bytes.len(), checked above.
                let target = unsafe { std::slice::from_raw_parts_mut(data, bytes.len()) };
                target.copy_from_slice(bytes);
                if tensor.dtype == DType::Bool {
                    // A C++ bool must be 0 or 1.
                    target.iter_mut().for_each(|b| *b = u8::from(*b != 0));
                }
            }
        }
    }
    Ok(value.into_dyn())
}

/// Output `name` of the model at `path` as an isorun tensor.
fn from_value(path: &str, name: &str, value: &DynValue) -> Result<Tensor, ModelError> {
    let unsupported = |what: String| {
        ModelError::new(
            ErrorKind::UnsupportedDtype,
            format!("{path}: output '{name}' is {what}, which isorun cannot carry"),
        )
    };
    let ort::value::ValueType::Tensor { ty, shape, .. } = value.dtype() else {
        return Err(unsupported(format!("{} (only tensors)", value.dtype())));
    };
    let dtype = dtype_of(*ty).ok_or_else(|| unsupported(format!("a tensor of {ty}")))?;
    let shape: Vec<u64> = shape.iter().map(|&d| d.max(0) as u64).collect();
    let count = Tensor::element_count(&shape).ok_or_else(|| unsupported("a tensor whose shape overflows".into()))?;
    let api = ort::api();
    let internal = |e: String| ModelError::new(ErrorKind::Onnxruntime, format!("{path}: output '{name}': {e}"));
    let Some(size) = dtype.element_size() else {
        let count = usize::try_from(count).map_err(|_| internal("too many strings".into()))?;
        let mut total = 0usize;
        // SAFETY: `value` is a live string tensor; ONNX Runtime writes its
        // total byte length, then its bytes and each element's offset into
        // buffers of the lengths passed.
        unsafe { check((api.GetStringTensorDataLength)(value.ptr(), &mut total)).map_err(internal)? };
        let mut bytes = vec![0u8; total];
        let mut offsets = vec![0usize; count];
        if count > 0 {
            unsafe {
                check((api.GetStringTensorContent)(
                    value.ptr(),
                    bytes.as_mut_ptr().cast(),
                    total,
                    offsets.as_mut_ptr(),
                    count,
                ))
                .map_err(internal)?
            };
        }
        let strings = (0..count)
            .map(|i| {
                let end = offsets.get(i + 1).copied().unwrap_or(total);
                bytes.get(offsets[i]..end).map(<[u8]>::to_vec).ok_or_else(|| internal("bad string offsets".into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Tensor::strings(shape, strings));
    };
    let length = count
        .checked_mul(size as u64)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| internal("too large".into()))?;
    let mut data: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `value` is a live CPU tensor of `count` elements of `size`
    // bytes (its dtype and shape, read above); its data stays valid while
    // `value` lives, and is only read here.
    let bytes = unsafe {
        check((api.GetTensorMutableData)(value.ptr().cast_mut(), &mut data)).map_err(internal)?;
        if length == 0 || data.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(data as *const u8, length).to_vec()
        }
    };
    Ok(Tensor::dense(dtype, shape, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ONNX Runtime's library where `scripts/fetch-onnxruntime` puts it (the CPU wheel's).
    fn library() -> String {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = std::process::Command::new(root.join("scripts/fetch-onnxruntime"))
            .arg("--print-dir")
            .output()
            .expect("scripts/fetch-onnxruntime --print-dir runs");
        let dir = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let found = std::fs::read_dir(&dir)
            .expect("run scripts/fetch-onnxruntime first")
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("libonnxruntime.so.1"));
        found.expect("libonnxruntime.so.1.* in the cache").path().to_string_lossy().into_owned()
    }

    /// The CPU wheel has no CUDA provider compiled in, so no session tries
    /// it; a session whose CUDA provider fails (here: not in this build) is
    /// made again on the CPU, runs, and says `Cpu`.
    #[test]
    fn a_cpu_build_tries_no_cuda_and_a_failed_cuda_session_is_made_again_on_the_cpu() {
        let library = library();
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx/mlp.onnx");
        let model = model.to_string_lossy();
        let config = SessionConfig::default();
        let plain = OnnxModel::load(&library, &model, &config).expect("mlp.onnx loads");
        assert_eq!(plain.session_made(), &OnnxSession { execution_provider: ExecutionProvider::Cpu, cuda_error: None });
        assert!(!cuda_wanted(), "the CPU wheel says it has no CUDA provider");
        let mut fell_back = OnnxModel::load_with(&library, &model, &config, true).expect("made again on the CPU");
        let made = fell_back.session_made();
        assert_eq!(made.execution_provider, ExecutionProvider::Cpu);
        assert_eq!(made.cuda_error.as_deref(), Some("CUDA execution provider is not enabled in this build."));
        // A broken model is its own error, not CUDA's.
        let truncated = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx/truncated.onnx");
        let error = OnnxModel::load_with(&library, &truncated.to_string_lossy(), &config, true)
            .err()
            .expect("a truncated file does not load");
        assert_eq!(error.kind, ErrorKind::LoadFailed, "{error:?}");
        assert!(!error.message.contains("CUDA"), "{}", error.message);
        let x = Tensor::dense(
            DType::Float32,
            vec![1, 4],
            [1f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        let mut run_time = Duration::ZERO;
        let outputs = fell_back.run(&[("x".to_string(), x)], &[], &mut run_time).expect("it runs");
        assert!(!outputs.is_empty(), "{outputs:?}");
    }
}
