//! The messages between supervisor and worker. A worker's life: it says
//! `Hello` on the socket it inherited (on which it also takes requests:
//! since protocol version 5 a `Hello` names no channel), then for each
//! `Run` it answers `Loaded` and `Finished`, and it exits after `Shutdown`
//! or when the supervisor goes away.

use crate::{DType, ModelError, Tensor};
use serde::{Deserialize, Serialize};

/// The worker's first message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    pub worker_version: String,
    pub tensorflow_version: String,
    pub pid: u32,
    /// Whether it has oneDNN's matrix-product kernels from the zygote it
    /// was forked from (protocol 12).
    pub onednn_warmup: OnednnWarmup,
}

/// Whether a worker had oneDNN's generated sgemm kernels before its first
/// model: the zygote makes them once, before it forks, in the libtensorflow
/// it loaded, where it can find oneDNN's hidden sgemm there (ARCHITECTURE:
/// Zygote). Without them each worker's first matrix product makes them
/// (~40 ms of CPU).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnednnWarmup {
    /// Forked from a zygote that made them.
    InForce,
    /// Forked from a zygote that could not make them, and why.
    NotInForce(String),
    /// Exec'd, not forked: nothing was made before it started.
    NotForked,
}

/// TensorFlow session settings chosen by the supervisor. The default is
/// TensorFlow's own: every field unset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionConfig {
    /// `ConfigProto.intra_op_parallelism_threads` (0 lets TensorFlow choose).
    pub intra_op_threads: u32,
    /// `ConfigProto.inter_op_parallelism_threads` (0 lets TensorFlow choose).
    pub inter_op_threads: u32,
    /// Run each step's ops on the thread that called the session
    /// (`inter_op_parallelism_threads` = -1) instead of handing them to the
    /// inter-op pool: for small models, one thread hand-off less per run.
    /// Overrides `inter_op_threads`.
    pub ops_on_caller_thread: bool,
    /// Not a TensorFlow option: how long the worker, having answered a
    /// request, polls its socket for the next one before it sleeps, in
    /// microseconds (0: it sleeps at once). A sleeping process's wake-up is
    /// most of a tiny request's cost on a virtual machine (#25).
    pub spin_us: u32,
    /// `GPUOptions.allow_growth`: take GPU memory as needed instead of
    /// nearly all of it at the first session.
    pub gpu_allow_growth: bool,
    /// `GPUOptions.per_process_gpu_memory_fraction`: the share of each
    /// visible GPU's memory to take (`None` lets TensorFlow choose).
    pub gpu_memory_fraction: Option<f64>,
    /// `RewriterConfig.disable_meta_optimizer`: run the graph as it is,
    /// without Grappler's rewrites. Set for a frozen graph (its weights
    /// are constants) that a unit runs once: Grappler copies and scans
    /// those constants before the first run (seconds on a 100 MB graph),
    /// a cost only later runs of its fused kernels would pay back.
    pub skip_grappler: bool,
}

/// One model to run with one set of inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The supervisor's number for this unit, echoed in the answers.
    pub unit: u64,
    /// Absolute path of the SavedModel folder.
    pub model_dir: String,
    pub tags: Vec<String>,
    pub signature: String,
    pub inputs: Vec<(String, Tensor)>,
    pub config: SessionConfig,
    /// Load the model (and check the signature exists) without running it:
    /// the answer is `Loaded`, then `Finished` with no outputs.
    pub load_only: bool,
    /// Custom-op libraries (`.so`) to load into TensorFlow before the model.
    pub libraries: Vec<String>,
    /// Confine the worker before it loads anything (applied once, on the
    /// first request that carries it).
    pub sandbox: Option<SandboxSpec>,
    /// The runtime that loads `model_dir` (protocol 13).
    pub runtime: Runtime,
}

/// Which runtime a worker loads a model with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Runtime {
    /// libtensorflow, linked into the worker: `model_dir` is a SavedModel
    /// folder, `tags` and `signature` pick what runs.
    #[default]
    TensorFlow,
    /// ONNX Runtime's C library at `library` (`libonnxruntime.so.1.N`),
    /// opened by the worker after its fork (a zygote may have opened it,
    /// never created an environment or session): `model_dir` is the `.onnx`
    /// file, `tags` and `signature` are ignored, and the outputs are every
    /// graph output, sorted by name.
    Onnx { library: String },
}

/// What a spare warms up with: the unit's sandbox and session options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmRequest {
    /// Applied before the warm-up, as a `Run` would (the worker adds the
    /// folder it writes the warm-up model into to its read paths).
    pub sandbox: Option<SandboxSpec>,
    /// The session options the unit will run with: TensorFlow sizes its
    /// process-wide thread pools from the first session.
    pub config: SessionConfig,
    /// An empty private folder the worker may write the warm-up model into
    /// (removed by the supervisor at the end of the run).
    pub warm_dir: String,
    /// Hide GPUs from the warm-up session, so that a spare creates no CUDA
    /// context (and holds no device memory) before its unit runs.
    pub cpu_only: bool,
    /// The model of the spare's first unit, loaded in the warm-up instead
    /// of the built-in model: its load is the first use, and the unit's
    /// `Run` finds it loaded. `None`: warm up on the built-in model.
    pub preload: Option<Preload>,
}

/// A model a spare loads while it warms up, as its unit's `Run` will ask
/// for it (the worker keeps it only when folder and tags match).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preload {
    pub model_dir: String,
    pub tags: Vec<String>,
    pub config: SessionConfig,
    /// Custom-op libraries to load first, as the unit's requests carry them.
    pub libraries: Vec<String>,
    /// The runtime the unit's requests name (protocol 15): an ONNX model is
    /// preloaded by opening ONNX Runtime and making its environment and the
    /// session here, in the spare, after its fork.
    pub runtime: Runtime,
}

/// A spare's preload that worked: the model is held for the unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preloaded {
    /// The load's wall time (the worker's word: the supervisor caps it at
    /// the time since the spare's fork).
    pub load_ms: u64,
    /// An ONNX model's session; `None` for a SavedModel.
    pub onnx: Option<OnnxSession>,
}

/// How an ONNX model's session was made: the execution provider, and why
/// the CUDA provider was not used where it was tried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnnxSession {
    pub execution_provider: ExecutionProvider,
    /// ONNX Runtime's word when the CUDA provider was tried and could not
    /// make the session (it was then made on the CPU).
    pub cuda_error: Option<String>,
}

/// The ONNX Runtime execution provider a session was made with: the CUDA
/// provider where the library has it and the worker sees a GPU, the CPU's
/// otherwise (a closed set: isorun asks for no other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecutionProvider {
    Cpu,
    Cuda,
}

impl ExecutionProvider {
    /// The name records give it: `cpu`, `cuda`.
    pub fn name(self) -> &'static str {
        match self {
            ExecutionProvider::Cpu => "cpu",
            ExecutionProvider::Cuda => "cuda",
        }
    }
}

/// What a sandboxed worker may still do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Folders and files it may read (every model of its batch, libraries).
    pub read_paths: Vec<String>,
    /// Its own empty working folder (read only).
    pub work_dir: Option<String>,
    /// Keep core dumps (off by default).
    pub core_dumps: bool,
}

/// Supervisor to worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToWorker {
    Run(RunRequest),
    /// Become a warm spare: confine yourself now (before any thread) and
    /// do TensorFlow's first-use set-up by loading the unit's model (see
    /// [`WarmRequest::preload`]) or the built-in warm-up model,
    /// then answer `Warmed` and wait for the unit's `Run`. Only as the
    /// first request; its sandbox is the one the unit's requests carry.
    Warm(WarmRequest),
    /// No more work: exit now.
    Shutdown,
    /// Map the one region that comes with this request as the mailbox
    /// (`isorun_transport::Mailbox`): small requests may come there from now
    /// on, and their answers go there.
    Mailbox,
    /// A request waits in the mailbox (sent only to a worker that said it
    /// sleeps on the socket).
    Wake,
}

/// A signature's input or output as the model declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DType,
    /// `None` for a dimension of unknown size; the whole is `None` for unknown rank.
    pub shape: Option<Vec<Option<u64>>>,
}

impl TensorSpec {
    /// The declared shape as people read it: `[?, 3]`, or `<unknown rank>`.
    pub fn shape_text(&self) -> String {
        match &self.shape {
            None => "<unknown rank>".into(),
            Some(dims) => format!(
                "[{}]",
                dims.iter().map(|d| d.map_or("?".to_string(), |n| n.to_string())).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    /// `name (dtype, shape)`, as error messages list what a signature takes.
    pub fn describe(&self) -> String {
        format!("{} ({}, {})", self.name, self.dtype, self.shape_text())
    }
}

/// A signature as the model declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignatureInfo {
    pub key: String,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

/// The end of one unit, as the worker saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum UnitResult {
    /// Every output of the signature, sorted by name.
    Ok {
        outputs: Vec<(String, Tensor)>,
    },
    Err(ModelError),
}

/// Worker to supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerMessage {
    Hello(Hello),
    /// The model of `unit` is loaded, in `load_ms` (sent only when the
    /// request loaded it); `onnx`: how an ONNX model's session was made.
    Loaded {
        unit: u64,
        load_ms: u64,
        onnx: Option<OnnxSession>,
    },
    /// `unit` is over; `run_us` is the time of the session run alone, in
    /// microseconds (milliseconds, truncated per request, lost most of a
    /// small model's run and made it look like IPC in the phases).
    Finished {
        unit: u64,
        run_us: u64,
        result: UnitResult,
    },
    /// The worker confined itself: the protections in force (`landlock`,
    /// `no_network`, `no_new_privs`, ...) and those it could not apply.
    Sandboxed {
        protections: Vec<String>,
        missing: Vec<String>,
        /// Each step's time in microseconds (`isorun_sandbox::Applied::steps`).
        steps_us: Vec<(String, u64)>,
    },
    /// A spare's warm-up is over, in `warm_ms`; `error` says why it did not
    /// work (the spare is still usable, only colder); `preloaded`: the
    /// unit's model is loaded and held (see [`WarmRequest::preload`]).
    Warmed {
        warm_ms: u64,
        error: Option<String>,
        preloaded: Option<Preloaded>,
    },
    /// An answer waits in the mailbox (sent only to a supervisor that said
    /// it sleeps on the socket).
    Wake,
}
