//! All of isorun's TensorFlow FFI: a SavedModel session through TensorFlow's
//! C API (`tensorflow-sys`). (Other unsafe code is system calls: the
//! sandbox, the zygote's fork and fd passing, process signalling and reaping
//! in `isorun-engine`, the frame reader's buffer.) The `tensorflow` crate's safe API cannot carry
//! byte strings that are not UTF-8 and hides the raw pointers, so isorun
//! talks to the C API directly and keeps every pointer inside this module.
//! Nothing here panics on TensorFlow's behalf: a failed status becomes a
//! `ModelError` with TensorFlow's code name and message.

use isorun_protocol::{tf_code_name, DType, ErrorKind, ModelError, SessionConfig, SignatureInfo, Tensor, TensorData};
use isorun_tfproto::{decode_meta_graph, proto, SignatureTensors};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::ptr;
use tensorflow_sys as tf;

/// Declarations of the C API functions that take or return enums as plain
/// integers: a value TensorFlow adds after the bindings were written (a new
/// dtype, say) must not be read into a Rust enum that lacks it.
mod raw {
    use std::ffi::c_int;
    use tensorflow_sys::{TF_OperationDescription, TF_Status, TF_Tensor};
    extern "C" {
        pub fn TF_SetAttrType(desc: *mut TF_OperationDescription, attr_name: *const std::ffi::c_char, value: c_int);
        pub fn TF_GetCode(s: *const TF_Status) -> c_int;
        pub fn TF_OpIsStateful(op_type: *const std::ffi::c_char, status: *mut TF_Status) -> c_int;
        pub fn TF_TensorType(t: *const TF_Tensor) -> c_int;
        pub fn TF_AllocateTensor(dtype: c_int, dims: *const i64, num_dims: c_int, len: usize) -> *mut TF_Tensor;
        pub fn TF_NewTensor(
            dtype: c_int,
            dims: *const i64,
            num_dims: c_int,
            data: *mut std::ffi::c_void,
            len: usize,
            deallocator: unsafe extern "C" fn(*mut std::ffi::c_void, usize, *mut std::ffi::c_void),
            deallocator_arg: *mut std::ffi::c_void,
        ) -> *mut TF_Tensor;
    }
}

/// TensorFlow's version string, e.g. `2.21.0`.
pub fn tensorflow_version() -> String {
    // SAFETY: TF_Version returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(tf::TF_Version()) }.to_string_lossy().into_owned()
}

/// Loads each of `paths` not in `loaded` (the libraries this process has
/// loaded), noting it there.
pub fn load_libraries(paths: &[String], loaded: &mut std::collections::HashSet<String>) -> Result<(), ModelError> {
    for path in paths {
        if !loaded.contains(path) {
            load_library(path)?;
            loaded.insert(path.clone());
        }
    }
    Ok(())
}

/// Loads a custom-op library into TensorFlow for the rest of the process.
pub fn load_library(path: &str) -> Result<(), ModelError> {
    let c_path = CString::new(path)
        .map_err(|_| ModelError::new(ErrorKind::LoadFailed, format!("library path {path:?} holds a NUL byte")))?;
    let status = Status::new();
    // SAFETY: the path is NUL-terminated; the returned handle is kept (leaked)
    // on purpose, since the ops it registers live as long as the process.
    unsafe { tf::TF_LoadLibrary(c_path.as_ptr(), status.0) };
    status.error(ErrorKind::LoadFailed).map_err(|mut e| {
        e.message = format!("cannot load library {path}: {}", e.message);
        e
    })
}

/// The name of a TensorFlow status code (`INVALID_ARGUMENT`, ...).
pub fn code_name(code: c_int) -> String {
    let name = match code {
        0 => "OK",
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => return format!("CODE_{code}"),
    };
    name.to_string()
}

/// An owned `TF_Status`.
struct Status(*mut tf::TF_Status);

impl Status {
    fn new() -> Status {
        // SAFETY: TF_NewStatus has no preconditions.
        Status(unsafe { tf::TF_NewStatus() })
    }

    /// `Err((code name, message))` when the status is not OK.
    fn check(&self) -> Result<(), (String, String)> {
        // SAFETY: self.0 is a live status.
        let code = unsafe { raw::TF_GetCode(self.0) };
        if code == 0 {
            return Ok(());
        }
        // SAFETY: TF_Message returns a NUL-terminated string owned by the status.
        let message = unsafe { CStr::from_ptr(tf::TF_Message(self.0)) }.to_string_lossy().into_owned();
        Err((code_name(code), message))
    }

    fn error(&self, kind: ErrorKind) -> Result<(), ModelError> {
        self.check().map_err(|(code, message)| ModelError { kind, code: Some(code), message })
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        // SAFETY: created by TF_NewStatus, deleted once.
        unsafe { tf::TF_DeleteStatus(self.0) }
    }
}

/// Owns the tensors handed to or received from `TF_SessionRun`.
struct Tensors(Vec<*mut tf::TF_Tensor>);

impl Drop for Tensors {
    fn drop(&mut self) {
        for &t in &self.0 {
            if !t.is_null() {
                // SAFETY: each pointer is an owned tensor, deleted once.
                unsafe { tf::TF_DeleteTensor(t) }
            }
        }
    }
}

/// A loaded SavedModel: its graph, its session and its meta graph, whose
/// signatures are read one at a time, as requests name them (a model runs a
/// signature isorun can carry even when another of its signatures has a
/// dtype isorun cannot).
pub struct SavedModel {
    graph: *mut tf::TF_Graph,
    session: *mut tf::TF_Session,
    meta_graph: proto::MetaGraphDef,
}

impl SavedModel {
    /// Loads the SavedModel in `dir` with the meta graph tagged `tags`.
    pub fn load(dir: &Path, tags: &[String], config: &SessionConfig) -> Result<SavedModel, ModelError> {
        Self::load_with_config(dir, tags, &isorun_tfproto::session_config_proto(config))
    }

    /// Loads as [`SavedModel::load`] does, with a serialized `ConfigProto`.
    pub fn load_with_config(dir: &Path, tags: &[String], config_bytes: &[u8]) -> Result<SavedModel, ModelError> {
        let load_failed = |message: String| ModelError::new(ErrorKind::LoadFailed, message);
        let c_dir = CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|_| load_failed(format!("{}: path holds a NUL byte", dir.display())))?;
        let c_tags: Vec<CString> = tags
            .iter()
            .map(|t| CString::new(t.as_bytes()).map_err(|_| load_failed(format!("tag {t:?} holds a NUL byte"))))
            .collect::<Result<_, _>>()?;
        let tag_ptrs: Vec<*const c_char> = c_tags.iter().map(|t| t.as_ptr()).collect();
        let status = Status::new();
        // SAFETY: every pointer passed below is live for the call; the options,
        // buffer and (on failure) graph are deleted exactly once.
        unsafe {
            let options = tf::TF_NewSessionOptions();
            tf::TF_SetConfig(options, config_bytes.as_ptr() as *const c_void, config_bytes.len(), status.0);
            if let Err(e) = status.error(ErrorKind::LoadFailed) {
                tf::TF_DeleteSessionOptions(options);
                return Err(e);
            }
            let graph = tf::TF_NewGraph();
            let meta = tf::TF_NewBuffer();
            let session = tf::TF_LoadSessionFromSavedModel(
                options,
                ptr::null(),
                c_dir.as_ptr(),
                tag_ptrs.as_ptr(),
                tag_ptrs.len() as c_int,
                graph,
                meta,
                status.0,
            );
            tf::TF_DeleteSessionOptions(options);
            if let Err(mut e) = status.error(ErrorKind::LoadFailed) {
                e.message = format!("cannot load the SavedModel in {}: {}", dir.display(), e.message);
                tf::TF_DeleteBuffer(meta);
                tf::TF_DeleteGraph(graph);
                return Err(e);
            }
            let bytes = if (*meta).data.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts((*meta).data as *const u8, (*meta).length)
            };
            let decoded = decode_meta_graph(bytes);
            tf::TF_DeleteBuffer(meta);
            // Owned from here on: an early return below closes the session.
            let mut model = SavedModel { graph, session, meta_graph: proto::MetaGraphDef::default() };
            model.meta_graph = decoded.map_err(|e| load_failed(format!("cannot decode the MetaGraphDef: {e}")))?;
            // TensorFlow loads a model whose variables/ is missing (it skips the
            // restore) and fails only when a run reads a variable: say so now.
            let index = dir.join("variables").join("variables.index");
            if !index.exists() && model.has_variables() {
                return Err(load_failed(format!(
                    "{}: missing, but the graph has variables (the model's variables were not saved with it)",
                    index.display()
                )));
            }
            Ok(model)
        }
    }

    /// True if the graph holds variable ops, whose values come from `variables/`.
    fn has_variables(&self) -> bool {
        let mut position = 0usize;
        loop {
            // SAFETY: the graph is live; TF_GraphNextOperation advances `position`
            // and returns null at the end; op type strings are owned by the graph.
            let op = unsafe { tf::TF_GraphNextOperation(self.graph, &mut position) };
            if op.is_null() {
                return false;
            }
            let kind = unsafe { CStr::from_ptr(tf::TF_OperationOpType(op)) };
            if matches!(kind.to_bytes(), b"VarHandleOp" | b"VariableV2" | b"Variable") {
                return true;
            }
        }
    }

    /// The signature with `key`, or an error listing the keys there are, or
    /// naming its tensor whose dtype isorun cannot carry.
    pub fn signature(&self, key: &str) -> Result<(SignatureInfo, SignatureTensors), ModelError> {
        isorun_tfproto::signature(&self.meta_graph, key).map_err(|e| ModelError::new(e.kind(), e.to_string()))
    }

    /// Runs signature `key`. `inputs` must already be validated against it
    /// and given in the signature's input order; each is `(tensor, dense bytes)`.
    pub fn run(&self, key: &str, inputs: &[(&Tensor, Option<&[u8]>)]) -> Result<Vec<(String, Tensor)>, ModelError> {
        let (info, tensors) = self.signature(key)?;
        let input_ops = tensors.inputs.iter().map(|n| self.output(n)).collect::<Result<Vec<_>, _>>()?;
        let output_ops = tensors.outputs.iter().map(|n| self.output(n)).collect::<Result<Vec<_>, _>>()?;
        let input_values = Tensors(inputs.iter().map(|(t, bytes)| to_tf_tensor(t, *bytes)).collect());
        let mut output_values = Tensors(vec![ptr::null_mut(); output_ops.len()]);
        let status = Status::new();
        // SAFETY: the operation and tensor arrays have the lengths passed, and
        // outlive the call; TF_SessionRun fills output_values with owned tensors.
        unsafe {
            tf::TF_SessionRun(
                self.session,
                ptr::null(),
                input_ops.as_ptr(),
                input_values.0.as_ptr(),
                input_ops.len() as c_int,
                output_ops.as_ptr(),
                output_values.0.as_mut_ptr(),
                output_ops.len() as c_int,
                ptr::null(),
                0,
                ptr::null_mut(),
                status.0,
            );
        }
        status.error(ErrorKind::Tensorflow)?;
        info.outputs
            .iter()
            .zip(&output_values.0)
            .map(|(spec, &t)| Ok((spec.name.clone(), from_tf_tensor(t, &spec.name)?)))
            .collect()
    }

    /// The graph output named `op:index` (a bare `op` means index 0).
    fn output(&self, tensor_name: &str) -> Result<tf::TF_Output, ModelError> {
        let (op, index) = match tensor_name.rsplit_once(':') {
            Some((op, index)) => (op, index.parse::<c_int>().unwrap_or(0)),
            None => (tensor_name, 0),
        };
        let c_op =
            CString::new(op).map_err(|_| ModelError::new(ErrorKind::LoadFailed, "tensor name holds a NUL byte"))?;
        // SAFETY: the graph is live; the name is NUL-terminated.
        let oper = unsafe { tf::TF_GraphOperationByName(self.graph, c_op.as_ptr()) };
        if oper.is_null() {
            return Err(ModelError::new(
                ErrorKind::LoadFailed,
                format!("the signature names tensor '{tensor_name}', which is not in the graph"),
            ));
        }
        Ok(tf::TF_Output { oper, index })
    }
}

impl Drop for SavedModel {
    fn drop(&mut self) {
        let status = Status::new();
        // SAFETY: session and graph are owned by self and deleted once.
        unsafe {
            tf::TF_CloseSession(self.session, status.0);
            tf::TF_DeleteSession(self.session, status.0);
            tf::TF_DeleteGraph(self.graph);
        }
    }
}

/// Runs a graph of its own, `relu(x · w + b)` on float32, once, in a
/// session with `config_bytes`: the first matrix product of a process
/// generates oneDNN's JIT gemm kernels (`get_xbyak_gemm`, once per
/// process: ~25 ms here, most of a small model's first run), which a spare
/// that preloaded its unit's model thus pays before the unit starts (only
/// where the zygote could not make the kernels itself, `onednn.rs`),
/// without running any of the model. `x` is fed, so that Grappler cannot
/// fold the product away.
pub fn warm_gemm(config_bytes: &[u8]) -> Result<(), String> {
    const FLOAT: c_int = 1;
    let status = Status::new();
    let check = |what: &str| status.check().map_err(|(code, message)| format!("{what}: {code}: {message}"));
    // SAFETY: every pointer passed is live for its call; each object made
    // here is deleted once, on every path (the session before the graph,
    // tensors by `Tensors`).
    unsafe {
        let graph = tf::TF_NewGraph();
        let result = (|| {
            let constant = |name: &CStr, dims: &[i64]| -> Result<*mut tf::TF_Operation, String> {
                let bytes = dims.iter().product::<i64>() as usize * 4;
                let tensor = Tensors(vec![raw::TF_AllocateTensor(FLOAT, dims.as_ptr(), dims.len() as c_int, bytes)]);
                ptr::write_bytes(tf::TF_TensorData(tensor.0[0]) as *mut u8, 0, bytes);
                let desc = tf::TF_NewOperation(graph, c"Const".as_ptr(), name.as_ptr());
                raw::TF_SetAttrType(desc, c"dtype".as_ptr(), FLOAT);
                tf::TF_SetAttrTensor(desc, c"value".as_ptr(), tensor.0[0], status.0);
                let op = tf::TF_FinishOperation(desc, status.0);
                check("Const").map(|_| op)
            };
            let op = |kind: &CStr, name: &CStr, inputs: &[*mut tf::TF_Operation]| {
                let desc = tf::TF_NewOperation(graph, kind.as_ptr(), name.as_ptr());
                if inputs.is_empty() {
                    raw::TF_SetAttrType(desc, c"dtype".as_ptr(), FLOAT);
                }
                for &input in inputs {
                    tf::TF_AddInput(desc, tf::TF_Output { oper: input, index: 0 });
                }
                let op = tf::TF_FinishOperation(desc, status.0);
                check(&kind.to_string_lossy()).map(|_| op)
            };
            let x = op(c"Placeholder", c"x", &[])?;
            let (w, b) = (constant(c"w", &[32, 32])?, constant(c"b", &[32])?);
            let product = op(c"MatMul", c"product", &[x, w])?;
            let biased = op(c"BiasAdd", c"biased", &[product, b])?;
            let relu = op(c"Relu", c"relu", &[biased])?;
            let options = tf::TF_NewSessionOptions();
            tf::TF_SetConfig(options, config_bytes.as_ptr() as *const c_void, config_bytes.len(), status.0);
            let configured = check("the session's options");
            let session = match configured {
                Ok(()) => tf::TF_NewSession(graph, options, status.0),
                Err(_) => ptr::null_mut(),
            };
            tf::TF_DeleteSessionOptions(options);
            configured?;
            check("a session")?;
            let dims = [8i64, 32];
            let input = Tensors(vec![raw::TF_AllocateTensor(FLOAT, dims.as_ptr(), 2, 8 * 32 * 4)]);
            ptr::write_bytes(tf::TF_TensorData(input.0[0]) as *mut u8, 0, 8 * 32 * 4);
            let mut output = Tensors(vec![ptr::null_mut()]);
            tf::TF_SessionRun(
                session,
                ptr::null(),
                [tf::TF_Output { oper: x, index: 0 }].as_ptr(),
                input.0.as_ptr(),
                1,
                [tf::TF_Output { oper: relu, index: 0 }].as_ptr(),
                output.0.as_mut_ptr(),
                1,
                ptr::null(),
                0,
                ptr::null_mut(),
                status.0,
            );
            let ran = check("the run");
            let closing = Status::new();
            tf::TF_CloseSession(session, closing.0);
            tf::TF_DeleteSession(session, closing.0);
            ran
        })();
        tf::TF_DeleteGraph(graph);
        result
    }
}

/// The deallocator of tensors that borrow their bytes: nothing to free.
unsafe extern "C" fn borrowed_bytes(_data: *mut c_void, _len: usize, _arg: *mut c_void) {}

/// Copies a protocol tensor into a new `TF_Tensor` (or borrows its shared memory).
fn to_tf_tensor(tensor: &Tensor, dense: Option<&[u8]>) -> *mut tf::TF_Tensor {
    let dims: Vec<i64> = tensor.shape.iter().map(|&d| d as i64).collect();
    // SAFETY: TF_AllocateTensor returns a buffer of exactly `len` bytes, which
    // is filled below within bounds (lengths were validated against the shape).
    unsafe {
        match (dense, &tensor.data) {
            // Large inputs arrive in shared memory, mapped page-aligned: the
            // TF_Tensor borrows those bytes instead of copying them (TensorFlow
            // copies by itself if they are not aligned enough). The request,
            // and with it the mapping, outlives the run, and `run` deletes
            // every tensor before it returns; the deallocator has nothing to free.
            (Some(bytes), TensorData::Shared(_)) if !bytes.is_empty() => raw::TF_NewTensor(
                tensor.dtype.tf_code(),
                dims.as_ptr(),
                dims.len() as c_int,
                bytes.as_ptr() as *mut c_void,
                bytes.len(),
                borrowed_bytes,
                ptr::null_mut(),
            ),
            (Some(bytes), _) => {
                let t = raw::TF_AllocateTensor(tensor.dtype.tf_code(), dims.as_ptr(), dims.len() as c_int, bytes.len());
                if !bytes.is_empty() {
                    ptr::copy_nonoverlapping(bytes.as_ptr(), tf::TF_TensorData(t) as *mut u8, bytes.len());
                }
                t
            }
            (None, TensorData::Strings(strings)) => {
                let size = std::mem::size_of::<tf::TF_TString>();
                let t = raw::TF_AllocateTensor(
                    DType::String.tf_code(),
                    dims.as_ptr(),
                    dims.len() as c_int,
                    strings.len() * size,
                );
                let base = tf::TF_TensorData(t) as *mut tf::TF_TString;
                for (i, s) in strings.iter().enumerate() {
                    tf::TF_StringInit(base.add(i));
                    tf::TF_StringCopy(base.add(i), s.as_ptr() as *const c_char, s.len());
                }
                t
            }
            (None, _) => unreachable!("validated: a dense tensor always comes with its bytes"),
        }
    }
}

/// Copies a `TF_Tensor` returned by a run into a protocol tensor.
fn from_tf_tensor(t: *mut tf::TF_Tensor, name: &str) -> Result<Tensor, ModelError> {
    if t.is_null() {
        return Err(ModelError::new(ErrorKind::Tensorflow, format!("output {name}: TensorFlow returned no tensor")));
    }
    // SAFETY: t is a live tensor returned by TF_SessionRun; its data holds
    // TF_TensorByteSize bytes (or one TF_TString per element for strings).
    unsafe {
        let code = raw::TF_TensorType(t);
        let dtype = DType::from_tf_code(code).ok_or_else(|| {
            ModelError::new(
                ErrorKind::UnsupportedDtype,
                format!("output {name} has dtype {}, which isorun cannot carry", tf_code_name(code)),
            )
        })?;
        let shape: Vec<u64> = (0..tf::TF_NumDims(t)).map(|i| tf::TF_Dim(t, i).max(0) as u64).collect();
        let count = Tensor::element_count(&shape).unwrap_or(0) as usize;
        let data = tf::TF_TensorData(t);
        if dtype == DType::String {
            let base = data as *const tf::TF_TString;
            let strings = (0..count)
                .map(|i| {
                    let p = tf::TF_StringGetDataPointer(base.add(i)) as *const u8;
                    let len = tf::TF_StringGetSize(base.add(i));
                    if len == 0 {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(p, len).to_vec()
                    }
                })
                .collect();
            Ok(Tensor::strings(shape, strings))
        } else {
            let len = tf::TF_TensorByteSize(t);
            let bytes = if len == 0 { Vec::new() } else { std::slice::from_raw_parts(data as *const u8, len).to_vec() };
            Ok(Tensor::dense(dtype, shape, bytes))
        }
    }
}

/// The TensorFlow set-up a zygote does before it forks, so that each forked
/// worker inherits it instead of paying it. Only what keeps the process
/// single-threaded and touches neither a device nor TensorFlow's random
/// seed (`tsl::random::New64` seeds itself once per process, on first use:
/// made here, every worker would draw the same "random" numbers). Measured
/// in a `perf` profile of forked workers against one process loading the
/// same models (the zoo, -j 1 with spares), each is a first use that every
/// worker paid again:
/// - `TF_GetAllOpList` walks (and faults in) the whole op registry, which
///   every model load then consults (forked workers ~10% faster for it);
/// - the kernel registry's set-up (a `call_once` on first kernel lookup that
///   registers XLA's JIT kernels), through `TF_GetRegisteredKernelsForOp`:
///   ~2 ms a worker;
/// - the op registry's first lookup of a name that is not an op (every
///   model's function library makes one) exports the whole op list once, for
///   a log line: `TF_OpIsStateful` on a name that is no op, ~5 ms;
/// - XLA's compilation kernels, registered by the first graph optimisation
///   (`XlaOpRegistry::RegisterCompilationKernels`, idempotent, `void()`,
///   looked up by name and skipped where a TensorFlow lacks it): ~2 ms;
/// - oneDNN's generated sgemm kernels, which a worker's first `MatMul` made:
///   ~40 ms, the largest (`onednn.rs`: how the zygote calls oneDNN itself).
///
/// Not here: `TF_NewGraph` starts a thread (`/proc/self/task` goes from 1 to
/// 2), and anything that makes a session or a device both starts threads and
/// seeds the random numbers. Returns the thread count after.
pub fn warm_before_fork() -> usize {
    // SAFETY: plain C API calls on constant, NUL-terminated names; buffers
    // and statuses are freed. The looked-up symbol is called only if found,
    // and it is `static void XlaOpRegistry::RegisterCompilationKernels()`:
    // no arguments, no result, safe to call more than once.
    unsafe {
        let ops = tf::TF_GetAllOpList();
        tf::TF_DeleteBuffer(ops);
        let status = tf::TF_NewStatus();
        let kernels = tf::TF_GetRegisteredKernelsForOp(c"MatMul".as_ptr(), status);
        if !kernels.is_null() {
            tf::TF_DeleteBuffer(kernels);
        }
        raw::TF_OpIsStateful(c"isorun: not an op".as_ptr(), status);
        tf::TF_DeleteStatus(status);
        let register =
            libc::dlsym(libc::RTLD_DEFAULT, c"_ZN10tensorflow13XlaOpRegistry26RegisterCompilationKernelsEv".as_ptr());
        if !register.is_null() {
            let register: unsafe extern "C-unwind" fn() = std::mem::transmute(register);
            register();
        }
    }
    crate::onednn::warm_sgemm();
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}
