//! `isorun map MODULE:FUNCTION`: each call of a user's Python function in a
//! fresh process, supervised as `run` supervises models. The user's loop
//! body is Python code that leaks, crashes and hangs like the models it
//! loads; isorun's answer to that is ending the process, and a fork from a
//! warm interpreter that has imported the function's module (but run
//! nothing) makes a process per call cheap.
//!
//! The supervisor (this crate, in the `isorun` binary) owns every process:
//! per slot it starts a Python zygote ([`process`], the script
//! `zygote.py` embedded here) that imports the function once; per item it
//! hands the zygote one end of a fresh socket pair, the zygote forks and
//! returns the child's pidfd before it ever reaps it, and the supervisor
//! feeds the item, enforces the deadline and the memory limit, kills
//! through the pidfd and reads the result ([`call`]). [`pool`] runs the
//! slots, retries and stops; [`items`] reads what to call the function
//! on; [`launch`] confines the zygote (hence its children) with
//! `isorun-sandbox`. No TensorFlow and no command-line parsing here: the
//! command (`runner/src/commands/map.rs`) wires flags, printing and
//! reports to [`pool::Pool`].

pub mod call;
mod fd;
pub mod items;
pub mod launch;
pub mod memory;
pub mod pool;
pub mod process;

use std::path::PathBuf;
use std::time::Duration;

pub use items::{Item, Payload};
pub use pool::{Identity, Pool};

/// The zygote's Python source, run with `python -c`.
pub const ZYGOTE_SCRIPT: &str = include_str!("zygote.py");

/// Environment variables that make numerical libraries start threads at
/// import, each with the value that keeps them from it; the zygote gets
/// them (a zygote with threads cannot fork safely), and each child gets the
/// caller's values back before the function runs. pyarrow's jemalloc (which
/// `import tensorflow` reaches through pandas where pyarrow is installed)
/// starts a background thread unless told not to.
pub const THREAD_VARS: &[(&str, &str)] = &[
    ("OPENBLAS_NUM_THREADS", "1"),
    ("OMP_NUM_THREADS", "1"),
    ("MKL_NUM_THREADS", "1"),
    ("NUMEXPR_NUM_THREADS", "1"),
    ("VECLIB_MAXIMUM_THREADS", "1"),
    ("BLIS_NUM_THREADS", "1"),
    ("TF_NUM_INTRAOP_THREADS", "1"),
    ("TF_NUM_INTEROP_THREADS", "1"),
    ("JE_ARROW_MALLOC_CONF", "background_thread:false"),
];

/// The largest JSON value a record carries (a larger one is left out; its
/// type is still said).
pub const VALUE_JSON_MAX: usize = 1 << 20;

/// Everything a map run needs, validated by the command.
#[derive(Debug, Clone)]
pub struct MapSettings {
    /// The interpreter (`--python`, `ISORUN_PYTHON`, else python3 on PATH).
    pub python: PathBuf,
    /// MODULE of MODULE:FUNCTION: a dotted module or a `.py` file.
    pub module: String,
    /// FUNCTION: a qualified name in the module.
    pub function: String,
    /// `--function-pickle`: the function by value.
    pub function_pickle: Option<PathBuf>,
    /// `--preload`: modules the zygote imports besides the function's.
    pub preload: Vec<String>,
    /// Slots: calls running at once.
    pub jobs: usize,
    /// Items each forked process runs in turn (`--items-per-worker`, at least 1).
    pub items_per_worker: usize,
    /// Processes forked ahead per slot, waiting for the next item (0 or 1).
    pub spares: usize,
    pub timeout: Option<Duration>,
    /// Limit on a call's private memory (its own, not what it shares with the zygote: [`memory`]), bytes.
    pub memory_limit: Option<u64>,
    pub retries: u32,
    /// Statuses run again while retries are left.
    pub retry_on: Vec<String>,
    /// `--values-dir`: ok values pickled to DIR/<index>.pkl.
    pub values_dir: Option<PathBuf>,
    /// Largest value file kept, bytes.
    pub value_cap: u64,
    /// Limit on a zygote's start, until its hello.
    pub start_timeout: Duration,
    /// `CUDA_VISIBLE_DEVICES` per slot (slot i gets entry i mod n); empty: untouched.
    pub gpus: Vec<String>,
    /// The sandbox; `None` with `--sandbox off`.
    pub sandbox: Option<SandboxSettings>,
}

/// How far the zygote (and every call it forks) is confined.
#[derive(Debug, Clone)]
pub struct SandboxSettings {
    /// The program that confines itself and execs Python (the `isorun`
    /// binary, started as `isorun __isorun-map-sandbox SPEC`).
    pub launcher: PathBuf,
    /// Folders calls may write beneath (`--writable`), besides the values
    /// folder and a private temporary folder.
    pub writable: Vec<PathBuf>,
    /// Keep the network (`--network`).
    pub network: bool,
}

/// Why a map run cannot start: bad input, said before any call runs.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("{function}: {message}")]
    Function { function: String, message: String },
    #[error("--python {}: cannot start: {source}", python.display())]
    Python {
        python: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: cannot read: {source}")]
    ReadItems {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} line {line}: {reason}")]
    BadItemLine { what: String, line: usize, reason: String },
    #[error("{}: cannot read the pickled item: {source}", path.display())]
    ReadPickle {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--function-pickle {}: cannot read: {source}", path.display())]
    ReadFunction {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("stopped while the zygote imported the function")]
    Stopped,
    #[error("the zygote did not start: {0}")]
    Start(String),
    #[error("cannot make the private temporary folder: {0}")]
    TempDir(#[source] std::io::Error),
}
