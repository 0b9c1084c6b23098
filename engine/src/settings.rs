//! Everything that shapes how units run, validated once: the CLI builds a
//! [`Settings`] from its flags, an embedder from its own configuration.
//! Built with [`SettingsBuilder`] so that new settings can be added without
//! breaking callers.

use crate::process::SpawnSpec;
use isorun_protocol::{SandboxSpec, SessionConfig};
use isorun_transport::DEFAULT_MAX_FRAME;
use std::path::PathBuf;
use std::time::Duration;

/// How workers are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpawnMode {
    /// The first result as fast as exec, the rest as fast as a fork: a run
    /// with no more units than slots execs its workers (a zygote would only
    /// add its start to the first result); otherwise each slot execs its
    /// first worker while its zygote starts, and forks the rest from it.
    #[default]
    Auto,
    /// Fork each worker from a per-slot zygote that has loaded libtensorflow
    /// once (fast); falls back to exec where forking does not work.
    Zygote,
    /// Exec each worker.
    Exec,
}

/// The statuses a unit can end with, for retries and failure policies.
pub const STATUSES: [&str; 10] = [
    "ok",
    "error",
    "crashed",
    "timeout",
    "memory_limit",
    "protocol_error",
    "spawn_failed",
    "mismatch",
    "below_threshold",
    "not_run",
];

/// Everything that shapes how units run. Read its fields; build it with
/// [`Settings::builder`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Settings {
    /// How to start a worker: binary, libtensorflow folder, environment.
    pub spawn: SpawnSpec,
    /// The devices slots are bound to (slot i to device i mod n), as
    /// `CUDA_VISIBLE_DEVICES` names them; empty for none.
    pub gpus: Vec<String>,
    pub spawn_mode: SpawnMode,
    /// Sandbox for every worker (`None`: no sandbox); its read paths are
    /// completed with the models of each worker's batch.
    pub sandbox: Option<SandboxSpec>,
    /// The signature to run (`serving_default` by default).
    pub signature: String,
    /// The meta graph's tags (`serve` by default).
    pub tags: Vec<String>,
    /// TensorFlow session options (threads, GPU memory).
    pub session: SessionConfig,
    /// Units per worker; a shared worker's crash is bisected.
    pub models_per_worker: usize,
    /// Slots: workers running at once.
    pub jobs: usize,
    /// Warm spare workers each slot keeps, forked from its zygote for the
    /// next units in line and warmed up before they are needed (0: none).
    pub spares: usize,
    /// Limit on a unit from its start to its end.
    pub timeout: Option<Duration>,
    /// Limit on starting the worker and loading the model.
    pub load_timeout: Option<Duration>,
    /// Limit on each request once the model is loaded (each batch of a
    /// fed unit, each `batch_size` chunk).
    pub batch_timeout: Option<Duration>,
    /// Limit on a worker's start, up to its `Hello`.
    pub start_timeout: Duration,
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// How long a worker may take to be reaped after SIGKILL before it is
    /// reported (`worker_unreaped`) and left to a background reaper, so a
    /// process stuck in uninterruptible sleep (a GPU driver, NFS) cannot
    /// hold its slot.
    pub reap_timeout: Duration,
    /// Put each output's values (JSON) in the unit's report.
    pub values: bool,
    /// Feed the inputs in chunks of this many rows and join the outputs.
    pub batch_size: Option<usize>,
    /// Refuse an input whose dtype is not the signature's, rather than
    /// cast it (`isorun_tensors::cast`: float64 to float32 and the like).
    pub strict_dtypes: bool,
    /// Custom-op libraries for every worker (absolute paths).
    pub libraries: Vec<String>,
    /// Limit on a worker's private memory (RssAnon + RssShmem), in bytes.
    pub memory_limit: Option<u64>,
    /// How many times a unit is run again after a retryable outcome.
    pub retries: u32,
    /// Statuses that are retried (from [`STATUSES`]).
    pub retry_on: Vec<String>,
    /// How Keras model files are exported to SavedModels before they run.
    pub keras: crate::keras::settings::KerasSettings,
    /// Time each unit's phases ([`crate::Phases`]) for its record.
    pub phases: bool,
}

impl Settings {
    /// Settings for workers started from `worker` (an `isorun-worker`
    /// binary), with every other setting at its default: one slot, one
    /// model per worker, `serving_default` of the `serve` meta graph, no
    /// limits, no sandbox.
    pub fn builder(worker: impl Into<PathBuf>) -> SettingsBuilder {
        SettingsBuilder {
            settings: Settings {
                spawn: SpawnSpec {
                    worker: worker.into(),
                    lib_dir: None,
                    args: Vec::new(),
                    max_frame: DEFAULT_MAX_FRAME,
                    clean_env: false,
                    gpu: None,
                },
                gpus: Vec::new(),
                spawn_mode: SpawnMode::Auto,
                sandbox: None,
                signature: "serving_default".into(),
                tags: vec!["serve".into()],
                session: SessionConfig {
                    intra_op_threads: 1,
                    inter_op_threads: 1,
                    ops_on_caller_thread: false,
                    spin_us: 0,
                    gpu_allow_growth: true,
                    gpu_memory_fraction: None,
                    skip_grappler: false,
                },
                models_per_worker: 1,
                jobs: 1,
                spares: 1,
                timeout: None,
                load_timeout: None,
                batch_timeout: None,
                start_timeout: Duration::from_secs(60),
                grace: Duration::from_secs(2),
                reap_timeout: crate::process::DEFAULT_REAP_TIMEOUT,
                values: false,
                batch_size: None,
                strict_dtypes: false,
                libraries: Vec::new(),
                memory_limit: None,
                retries: 0,
                retry_on: Vec::new(),
                keras: crate::keras::settings::KerasSettings::default(),
                phases: false,
            },
        }
    }
}

/// Builds [`Settings`]; every setter replaces one setting.
#[derive(Debug, Clone)]
pub struct SettingsBuilder {
    settings: Settings,
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $type:ty),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $type) -> Self {
                self.settings.$name = value;
                self
            }
        )*
    };
}

impl SettingsBuilder {
    setters! {
        /// How workers are started (see [`SpawnSpec`]).
        spawn: SpawnSpec,
        /// Devices for the slots (`CUDA_VISIBLE_DEVICES` names).
        gpus: Vec<String>,
        /// Forked from a zygote, or exec'd.
        spawn_mode: SpawnMode,
        /// The sandbox every worker applies before loading anything.
        sandbox: Option<SandboxSpec>,
        /// The signature to run.
        signature: String,
        /// The meta graph's tags.
        tags: Vec<String>,
        /// Session options.
        session: SessionConfig,
        /// Units per worker.
        models_per_worker: usize,
        /// Workers at once.
        jobs: usize,
        /// Warm spares per slot.
        spares: usize,
        /// Limit on a unit.
        timeout: Option<Duration>,
        /// Limit on start and load.
        load_timeout: Option<Duration>,
        /// Limit on each request after loading.
        batch_timeout: Option<Duration>,
        /// Limit on a worker's start.
        start_timeout: Duration,
        /// SIGTERM to SIGKILL.
        grace: Duration,
        /// SIGKILL to reaped, at most.
        reap_timeout: Duration,
        /// Values in reports.
        values: bool,
        /// Rows per request.
        batch_size: Option<usize>,
        /// No dtype casts.
        strict_dtypes: bool,
        /// Custom-op libraries (absolute paths).
        libraries: Vec<String>,
        /// Limit on a worker's private memory, in bytes.
        memory_limit: Option<u64>,
        /// Retries after a retryable outcome.
        retries: u32,
        /// Statuses that are retried.
        retry_on: Vec<String>,
        keras: crate::keras::settings::KerasSettings,
        /// Per-phase times in each unit's report.
        phases: bool,
    }

    /// The folder holding libtensorflow for the workers (first on their
    /// library path); `None` leaves the worker's own RUNPATH to find it.
    pub fn libtensorflow_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.settings.spawn.lib_dir = dir;
        self
    }

    /// The settings.
    pub fn build(self) -> Settings {
        self.settings
    }
}
