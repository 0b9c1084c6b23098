//! How one unit ended, with its measurements: what the engine hands its
//! caller for every unit, exactly once. Records and reports
//! (`isorun-report`) are built from these.

use crate::feed::StreamReport;
use crate::gpu::GpuReturn;
use isorun_protocol::{DType, Outcome};
use std::time::Duration;

/// One output of a unit: its name, dtype and shape, and its values if asked.
#[derive(Debug, Clone)]
pub struct OutputInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub values: Option<serde_json::Value>,
}

/// How one unit ended, with its measurements.
#[derive(Debug, Clone)]
pub struct UnitReport {
    pub index: usize,
    pub outcome: Outcome,
    pub outputs: Vec<OutputInfo>,
    pub wall: Duration,
    pub load_ms: Option<u64>,
    /// How an ONNX model's session was made, as its worker said.
    pub onnx: Option<isorun_protocol::OnnxSession>,
    pub run_ms: Option<u64>,
    pub user: Option<Duration>,
    pub system: Option<Duration>,
    pub peak_rss_bytes: Option<u64>,
    pub worker_id: Option<u64>,
    pub worker_pid: Option<i32>,
    /// The worker was forked from a zygote (`false`: exec'd).
    pub worker_forked: Option<bool>,
    /// The worker was a warm spare, forked and warmed up before the unit
    /// started (`--spares`); `None` for a worker started for the unit.
    pub spare: Option<SpareReport>,
    /// The device the unit's worker was bound to (`--gpus` only).
    pub gpu: Option<String>,
    /// The worker's highest GPU memory during the unit (NVML).
    pub gpu_peak_bytes: Option<u64>,
    /// What the device got back when the worker exited, and its used memory then (NVML).
    pub gpu_return: Option<GpuReturn>,
    pub stderr_tail: Vec<String>,
    /// The worker was not reaped within the reap timeout after SIGKILL
    /// (uninterruptible sleep); its slot moved on and it is reaped later.
    pub worker_unreaped: bool,
    /// Protections in force in the worker, and those it could not apply.
    pub sandbox: Option<(Vec<String>, Vec<String>)>,
    /// Every attempt, the last one included (more than one after retries
    /// or after a crash in a shared worker was run again alone).
    pub attempts: Vec<Attempt>,
    /// A unit fed batch after batch ([`Engine::run_feed`](crate::Engine::run_feed)): examples, speed, the feed's fields.
    pub stream: Option<StreamReport>,
    /// How a Keras file's SavedModel was made (exported now, or found in the cache).
    pub export: Option<crate::keras::report::ExportReport>,
    /// Inputs cast to the signature's dtypes: name and `from→to` (`float64→float32`).
    pub casts: Vec<(String, String)>,
    /// Where the unit's wall time went (with `Settings::phases`).
    pub phases: Option<Phases>,
}

/// Where a unit's wall time went, phase by phase, as the supervisor (and,
/// for the sandbox, the worker) measured it. What no phase names (the
/// slot's own work, waiting for a spare) is the wall time's rest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Phases {
    /// Starting the worker: the fork request answered, or the exec done
    /// (`None` for a spare, started before the unit, or a later unit of a
    /// shared worker).
    pub spawn: Option<Duration>,
    /// From the worker started to its `Hello` (its own start: loading
    /// libtensorflow when exec'd; little when forked).
    pub hello: Option<Duration>,
    /// The sandbox's steps as the worker timed them (`limits_env`,
    /// `network`, `landlock`, `seccomp`).
    pub sandbox: Vec<(String, Duration)>,
    /// Every request's round trip as the supervisor saw it (sent to
    /// answered): the sandbox, loading and running are in it, the rest is
    /// IPC (framing, shared memory, outputs read back).
    pub requests: Duration,
    /// The session runs' time as the worker measured each (microseconds, summed).
    pub run: Duration,
    /// A fed unit's time waiting for its next batch (`eval`: for the
    /// prefetch thread's decoded batch, or decoding it when none is ready).
    pub feed_next: Duration,
    /// A fed unit's stream's work beside the slot ([`FeedStream::background`](crate::FeedStream::background):
    /// `eval`'s decoding ahead), overlapped: not one of the wall time's parts.
    pub feed_background: Duration,
    /// A fed unit's time taking a batch's outputs (`eval`: scoring).
    pub feed_accept: Duration,
    /// From asking the worker to leave to its exit reaped (`None` for a
    /// unit of a shared worker that another unit followed).
    pub exit: Option<Duration>,
}

/// How a unit's spare worker was readied (see `--spares`).
#[derive(Debug, Clone, PartialEq)]
pub struct SpareReport {
    /// The warm-up's time in the spare (before the unit started).
    pub warm_ms: u64,
    /// How long the unit waited for the spare to finish warming up.
    pub waited_ms: u64,
    /// Why the warm-up did not work, if it did not (the spare ran the unit anyway, colder).
    pub warm_error: Option<String>,
    /// The unit's model, loaded in the warm-up (a preload): its load's time
    /// and CPU are the unit's, spent before the unit started.
    pub preloaded: Option<isorun_protocol::Preloaded>,
}

/// One attempt at a unit, as kept in its record.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub outcome: Outcome,
    pub wall: Duration,
    pub peak_rss_bytes: Option<u64>,
    pub worker_id: Option<u64>,
    /// The worker also ran other models (`--models-per-worker`): a failure
    /// here is run again alone before anyone is blamed, and is no retry.
    pub shared_worker: bool,
}

impl Attempt {
    /// The attempt a report ends (`shared_worker`: its worker also ran other models).
    pub fn of(report: &UnitReport, shared_worker: bool) -> Attempt {
        Attempt {
            outcome: report.outcome.clone(),
            wall: report.wall,
            peak_rss_bytes: report.peak_rss_bytes,
            worker_id: report.worker_id,
            shared_worker,
        }
    }
}

impl UnitReport {
    /// Failed at first, then passed.
    pub fn flaky(&self) -> bool {
        self.outcome.is_ok() && self.attempts.iter().any(|a| !a.outcome.is_ok())
    }

    /// A report of `outcome` with no measurements yet.
    pub fn new(index: usize, outcome: Outcome) -> UnitReport {
        UnitReport {
            index,
            outcome,
            outputs: Vec::new(),
            wall: Duration::ZERO,
            load_ms: None,
            onnx: None,
            run_ms: None,
            user: None,
            system: None,
            peak_rss_bytes: None,
            worker_id: None,
            worker_pid: None,
            worker_forked: None,
            spare: None,
            gpu: None,
            gpu_peak_bytes: None,
            gpu_return: None,
            worker_unreaped: false,
            stderr_tail: Vec::new(),
            sandbox: None,
            attempts: Vec::new(),
            stream: None,
            export: None,
            casts: Vec::new(),
            phases: None,
        }
    }
}
