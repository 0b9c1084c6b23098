//! The vocabulary shared by the supervisor (`isorun`) and its workers
//! (`isorun-worker`): the messages they exchange, tensors and dtypes, model
//! errors and the outcome of a unit of work. It is serde only, with no
//! TensorFlow and no operating-system code, so that both sides, the tests and
//! the fault-injection worker agree on one definition.

mod banner;
mod causes;
mod dtype;
pub mod matching;
mod message;
mod outcome;
mod tensor;

pub use banner::is_tensorflow_banner;
pub use causes::with_causes;
pub use dtype::{tf_code_name, DType};
pub use message::{
    ExecutionProvider, Hello, OnednnWarmup, OnnxSession, Preload, Preloaded, RunRequest, Runtime, SandboxSpec,
    SessionConfig, SignatureInfo, TensorSpec, ToWorker, UnitResult, WarmRequest, WorkerMessage,
};
pub use outcome::{
    human_bytes, short_number, signal_name, Breach, ErrorKind, ModelError, NotRunReason, Outcome, Phase,
};
pub use tensor::{Tensor, TensorData, TensorError};

/// Bumped on every change of the wire types; a worker whose `Hello` carries
/// another version is a `protocol_error`.
pub const PROTOCOL_VERSION: u32 = 16;

/// Exit codes of `isorun`, documented in the README.
pub mod exit_code {
    /// Every model ended `ok`.
    pub const OK: i32 = 0;
    /// At least one model ended otherwise.
    pub const SOME_FAILED: i32 = 1;
    /// A usage problem found before any work started (bad arguments, unreadable inputs, no model).
    pub const USAGE: i32 = 2;
    /// Interrupted by SIGINT (128 + 2).
    pub const INTERRUPTED: i32 = 130;
    /// Terminated by SIGTERM (128 + 15).
    pub const TERMINATED: i32 = 143;
}

/// Environment variable through which a worker learns the file descriptor of
/// its socket to the supervisor (removed by the worker as soon as it is read).
pub const ENV_IPC_FD: &str = "ISORUN_IPC_FD";

/// Environment variable naming the folder where the zygote keeps the index
/// of oneDNN's sgemm in each libtensorflow it has loaded (set by the
/// supervisor; a worker without it uses `$XDG_CACHE_HOME/isorun/symbols`).
pub const ENV_SYMBOL_CACHE: &str = "ISORUN_SYMBOL_CACHE";
