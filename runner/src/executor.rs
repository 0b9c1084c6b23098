//! Runs units of work in workers: `jobs` slot threads each take the next
//! batch of `models_per_worker` models, start a fresh worker for it, feed it
//! the models one by one, and watch it against deadlines, crashes, protocol
//! breaches and the user's interrupts. Every unit ends with exactly one
//! report; a worker's misbehaviour costs only the unit it was running.

use crate::batch;
use crate::cli::SpawnMode;
use crate::discover::Model;
use crate::gpu::{self, slot_device, slots_on_device, GpuReturn, GpuWatch};
use crate::inputs::Inputs;
use crate::json_input::{signature_of, tensors_for_signature};
use crate::output::write_outputs;
use crate::process::{Exit, SpawnSpec, WorkerProcess};
use crate::session::{run_request, shutdown, wait_hello, Deadlines};
use crate::values::tensor_values;
use crate::zygote::Zygote;
use ipc_channel::ipc::IpcSharedMemory;
use isorun_protocol::{
    DType, ErrorKind, ModelError, NotRunReason, Outcome, RunRequest, SandboxSpec, SessionConfig, Tensor, TensorData,
    ToWorker,
};
use isorun_transport::{RequestEnvelope, SHARED_THRESHOLD};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Everything that shapes how units run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub spawn: SpawnSpec,
    /// `--gpus`, resolved: the devices slots are bound to (slot i to device
    /// i mod n), as `CUDA_VISIBLE_DEVICES` names them; empty without `--gpus`.
    pub gpus: Vec<String>,
    pub spawn_mode: SpawnMode,
    /// Sandbox for every worker (`None`: `--sandbox off`); its read paths
    /// are completed with the models of each worker's batch.
    pub sandbox: Option<SandboxSpec>,
    pub signature: String,
    pub tags: Vec<String>,
    pub session: SessionConfig,
    pub models_per_worker: usize,
    pub jobs: usize,
    /// Limit on a unit from its start to its end.
    pub timeout: Option<Duration>,
    /// Limit on starting the worker and loading the model.
    pub load_timeout: Option<Duration>,
    /// Limit on a worker's start, up to its `Hello`.
    pub start_timeout: Duration,
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
    pub output_dir: Option<PathBuf>,
    pub values: bool,
    pub batch_size: Option<usize>,
    /// Custom-op libraries for every worker (absolute paths).
    pub libraries: Vec<String>,
    /// Limit on a worker's private memory (RssAnon + RssShmem), in bytes.
    pub memory_limit: Option<u64>,
    /// How many times a unit is run again after a retryable outcome.
    pub retries: u32,
    /// Statuses that are retried.
    pub retry_on: Vec<String>,
    /// Golden outputs and tolerances (`--expect`).
    pub expect: Option<crate::golden::Expect>,
}

/// The inputs, prepared once for every worker: large dense tensors are
/// placed in shared memory, which every worker maps instead of copying.
/// JSON inputs wait for each model's signature, which gives their dtypes.
pub struct PreparedInputs {
    tensors: Vec<(String, Tensor)>,
    json: Vec<(String, serde_json::Value)>,
    shared: Vec<IpcSharedMemory>,
    /// `--inputs-dir`: per-model input files, before the shared ones.
    per_model_dir: Option<PathBuf>,
}

impl PreparedInputs {
    pub fn new(inputs: Inputs, per_model_dir: Option<PathBuf>) -> PreparedInputs {
        let mut shared = Vec::new();
        let tensors = inputs
            .tensors
            .into_iter()
            .map(|(name, mut tensor)| {
                if let TensorData::Dense(bytes) = &tensor.data {
                    if bytes.len() >= SHARED_THRESHOLD {
                        shared.push(IpcSharedMemory::from_bytes(bytes));
                        tensor.data = TensorData::Shared(shared.len() as u32 - 1);
                    }
                }
                (name, tensor)
            })
            .collect();
        PreparedInputs { tensors, json: inputs.json, shared, per_model_dir }
    }

    /// A digest of the shared inputs, for journal keys.
    pub fn digest(&self) -> Vec<u8> {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        for (name, tensor) in &self.tensors {
            hasher.update(name.as_bytes());
            hasher.update([0]);
            hasher.update(tensor.dtype.name().as_bytes());
            hasher.update(format!("{:?}", tensor.shape).as_bytes());
            match &tensor.data {
                TensorData::Dense(bytes) => hasher.update(bytes),
                TensorData::Shared(i) => hasher.update(&self.shared[*i as usize][..]),
                TensorData::Strings(strings) => {
                    for s in strings {
                        hasher.update((s.len() as u64).to_le_bytes());
                        hasher.update(s);
                    }
                }
            }
        }
        for (name, value) in &self.json {
            hasher.update(name.as_bytes());
            hasher.update([0]);
            hasher.update(value.to_string().as_bytes());
        }
        hasher.finalize().to_vec()
    }

    /// The inputs for one model: its own files from `--inputs-dir` first,
    /// then the shared ones; JSON converted for its signature.
    fn for_model(&self, model: &Model, signature: &str, tags: &[String]) -> Result<Vec<(String, Tensor)>, ModelError> {
        let (own_tensors, own_json) = self.own_inputs(model)?;
        let own = |name: &str| own_tensors.iter().any(|(n, _)| n == name) || own_json.iter().any(|(n, _)| n == name);
        let mut tensors: Vec<(String, Tensor)> = self.tensors.iter().filter(|(name, _)| !own(name)).cloned().collect();
        tensors.extend(own_tensors.iter().cloned());
        let json: Vec<(String, serde_json::Value)> =
            self.json.iter().filter(|(name, _)| !own(name)).cloned().chain(own_json.iter().cloned()).collect();
        if !json.is_empty() {
            let info = signature_of(&model.path, tags, signature)?;
            tensors.extend(tensors_for_signature(&info, &json)?);
        }
        Ok(tensors)
    }

    /// `DIR/<model id>/<input name>.npy` (or `.json`) files, if any.
    #[expect(clippy::type_complexity, reason = "a pair of named lists, used once")]
    fn own_inputs(
        &self,
        model: &Model,
    ) -> Result<(Vec<(String, Tensor)>, Vec<(String, serde_json::Value)>), ModelError> {
        let (mut tensors, mut json) = (Vec::new(), Vec::new());
        let Some(dir) = &self.per_model_dir else { return Ok((tensors, json)) };
        let folder = dir.join(&model.id);
        let Ok(entries) = std::fs::read_dir(&folder) else { return Ok((tensors, json)) };
        let bad = |message: String| ModelError::new(ErrorKind::InputMismatch, message);
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let (Some(stem), Some(ext)) = (path.file_stem(), path.extension()) else { continue };
            let name = stem.to_string_lossy().into_owned();
            match ext.to_string_lossy().as_ref() {
                "npy" => tensors.push((name, crate::npy::read_npy_file(&path).map_err(|e| bad(e.to_string()))?)),
                "json" => {
                    let text = std::fs::read_to_string(&path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
                    let value = serde_json::from_str(&text)
                        .map_err(|e| bad(format!("{}: not valid JSON: {e}", path.display())))?;
                    json.push((name, value));
                }
                _ => {}
            }
        }
        Ok((tensors, json))
    }
}

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
    pub run_ms: Option<u64>,
    pub user: Option<Duration>,
    pub system: Option<Duration>,
    pub peak_rss_bytes: Option<u64>,
    pub worker_id: Option<u64>,
    pub worker_pid: Option<i32>,
    /// The device the unit's worker was bound to (`--gpus` only).
    pub gpu: Option<String>,
    /// The worker's highest GPU memory during the unit (NVML).
    pub gpu_peak_bytes: Option<u64>,
    /// What the device got back when the worker exited, and its used memory then (NVML).
    pub gpu_return: Option<GpuReturn>,
    pub stderr_tail: Vec<String>,
    /// Protections in force in the worker, and those it could not apply.
    pub sandbox: Option<(Vec<String>, Vec<String>)>,
    /// Every attempt, the last one included (more than one after retries
    /// or after a crash in a shared worker was run again alone).
    pub attempts: Vec<Attempt>,
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

impl UnitReport {
    /// Failed at first, then passed.
    pub fn flaky(&self) -> bool {
        self.outcome.is_ok() && self.attempts.iter().any(|a| !a.outcome.is_ok())
    }

    pub(crate) fn new(index: usize, outcome: Outcome) -> UnitReport {
        UnitReport {
            index,
            outcome,
            outputs: Vec::new(),
            wall: Duration::ZERO,
            load_ms: None,
            run_ms: None,
            user: None,
            system: None,
            peak_rss_bytes: None,
            worker_id: None,
            worker_pid: None,
            gpu: None,
            gpu_peak_bytes: None,
            gpu_return: None,
            stderr_tail: Vec::new(),
            sandbox: None,
            attempts: Vec::new(),
        }
    }
}

/// How hard the user asked isorun to stop.
#[derive(Debug, Default)]
pub struct Stop {
    level: AtomicU8,
    signal: AtomicI32,
    /// Set by `--max-failures`: start nothing new, let running units finish.
    draining: std::sync::atomic::AtomicBool,
}

impl Stop {
    /// Stop starting work and terminate the workers (first Ctrl-C).
    pub fn request(&self, signal: i32) {
        let _ = self.signal.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
        let _ = self.level.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Kill the workers at once (second Ctrl-C).
    pub fn escalate(&self) {
        self.level.store(2, Ordering::SeqCst);
    }

    pub fn requested(&self) -> bool {
        self.level.load(Ordering::SeqCst) >= 1
    }

    pub fn immediate(&self) -> bool {
        self.level.load(Ordering::SeqCst) >= 2
    }

    /// Start nothing new, but let running units finish (`--max-failures`).
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Why no new unit may start, if none may.
    pub fn not_starting(&self) -> Option<NotRunReason> {
        if self.requested() {
            Some(NotRunReason::Interrupted)
        } else if self.draining.load(Ordering::SeqCst) {
            Some(NotRunReason::MaxFailures)
        } else {
            None
        }
    }

    /// The signal that asked to stop (0 for a closed stdout).
    pub fn signal(&self) -> i32 {
        self.signal.load(Ordering::SeqCst)
    }
}

/// What the executor tells its caller, as it happens.
#[derive(Debug)]
pub enum Progress {
    /// A unit was handed to a worker.
    Started(usize),
    /// A unit ended (in any order).
    Finished(Box<UnitReport>),
}

/// Runs every model; `on_progress` sees each unit start and end. Returns
/// when every model has a report, with the TensorFlow version the workers
/// reported.
pub fn run_all(
    models: &[Model],
    inputs: &PreparedInputs,
    settings: &Settings,
    stop: &Stop,
    on_progress: &mut dyn FnMut(Progress),
) -> Option<String> {
    let tensorflow_version = &OnceLock::new();
    let per_worker = settings.models_per_worker.max(1);
    let batches: VecDeque<Vec<usize>> =
        (0..models.len()).collect::<Vec<_>>().chunks(per_worker).map(<[usize]>::to_vec).collect();
    let queue = Mutex::new(batches);
    let worker_ids = AtomicU64::new(0);
    let zygote_broken = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<Progress>();
    std::thread::scope(|scope| {
        let jobs = settings.jobs.max(1);
        for slot in 0..jobs {
            let tx = tx.clone();
            // The slot's device, in its workers' (and zygote's) environment.
            let gpu = slot_device(&settings.gpus, slot).map(str::to_string);
            let mut spawn = settings.spawn.clone();
            if gpu.is_some() {
                spawn.gpu = gpu.clone();
            }
            let slot_ctx = Slot {
                models,
                inputs,
                settings,
                spawn,
                gpu_alone: slots_on_device(&settings.gpus, jobs, slot) == 1,
                gpu,
                stop,
                worker_ids: &worker_ids,
                tensorflow_version,
                zygote_broken: &zygote_broken,
            };
            let queue = &queue;
            std::thread::Builder::new()
                .name(format!("slot-{slot}"))
                .spawn_scoped(scope, move || {
                    // This thread starts the slot's zygote and workers and lives as
                    // long as they do (PR_SET_PDEATHSIG follows the forking thread).
                    let mut zygote = None;
                    loop {
                        let Some(batch) = queue.lock().expect("queue").pop_front() else { return };
                        slot_ctx.run_batch(batch, &mut zygote, &|progress| {
                            let _ = tx.send(progress);
                        });
                    }
                })
                .expect("spawn a slot thread");
        }
        drop(tx);
        for progress in rx {
            on_progress(progress);
        }
    });
    tensorflow_version.get().cloned()
}

struct Slot<'a> {
    models: &'a [Model],
    inputs: &'a PreparedInputs,
    settings: &'a Settings,
    /// How this slot starts workers: the settings' spec, with its device.
    spawn: SpawnSpec,
    /// The slot's device (`--gpus`), and whether no other slot shares it.
    gpu: Option<String>,
    gpu_alone: bool,
    stop: &'a Stop,
    worker_ids: &'a AtomicU64,
    tensorflow_version: &'a OnceLock<String>,
    /// Set when zygotes do not work here: every slot then execs workers.
    zygote_broken: &'a AtomicBool,
}

/// How a unit in a live worker ended: the report, and whether the worker can take another.
struct UnitEnd {
    report: UnitReport,
    worker_usable: bool,
}

impl Slot<'_> {
    /// When a worker must have said hello: the start limit, or the unit's
    /// own limits if they are shorter.
    fn start_deadline(&self, started: Instant) -> Instant {
        let mut deadline = started + self.settings.start_timeout;
        for limit in [self.settings.load_timeout, self.settings.timeout].into_iter().flatten() {
            deadline = deadline.min(started + limit);
        }
        deadline
    }

    /// Starts a worker: forked from the slot's zygote (started or replaced
    /// as needed), or exec'd when asked or when zygotes do not work here.
    fn spawn_worker(&self, zygote: &mut Option<Arc<Zygote>>) -> std::io::Result<WorkerProcess> {
        if self.settings.spawn_mode == SpawnMode::Zygote && !self.zygote_broken.load(Ordering::SeqCst) {
            for _ in 0..2 {
                if !zygote.as_ref().is_some_and(|z| z.alive()) {
                    *zygote = Zygote::start(&self.spawn).ok().map(Arc::new);
                }
                if let Some(z) = zygote.as_ref() {
                    match WorkerProcess::spawn_forked(z, &self.spawn) {
                        Ok(worker) => return Ok(worker),
                        Err(e) => {
                            tracing::info!("zygote failed: {e}; starting a new one");
                            *zygote = None;
                        }
                    }
                }
            }
            if !self.zygote_broken.swap(true, Ordering::SeqCst) {
                tracing::warn!("workers cannot be forked from a zygote here; exec'ing each worker instead");
            }
        }
        WorkerProcess::spawn(&self.spawn)
    }

    /// Watches a new worker's GPU memory, where the slot has a device and NVML is present.
    fn watch_gpu(&self, worker: &mut WorkerProcess) {
        if let Some(device) = &self.gpu {
            if let Some(watch) = GpuWatch::start(gpu::nvml(), device, worker.pid as u32, self.gpu_alone) {
                worker.watch_gpu(watch);
            }
        }
    }

    fn run_batch(&self, batch: Vec<usize>, zygote: &mut Option<Arc<Zygote>>, tell: &dyn Fn(Progress)) {
        let mut pending: VecDeque<usize> = batch.into();
        let mut history: HashMap<usize, Vec<Attempt>> = HashMap::new();
        // One unit per worker once a shared worker has died (crash bisection).
        let mut solo = self.settings.models_per_worker <= 1;
        while let Some(&first) = pending.front() {
            if let Some(reason) = self.stop.not_starting() {
                for index in pending.drain(..) {
                    let mut report = UnitReport::new(index, Outcome::NotRun { reason });
                    report.attempts = history.remove(&index).unwrap_or_default();
                    tell(Progress::Finished(Box::new(report)));
                }
                return;
            }
            let retries_so_far = history.get(&first).map_or(0, |h| h.iter().filter(|a| !a.shared_worker).count());
            if retries_so_far > 0 && !self.back_off(retries_so_far as u32) {
                continue; // interrupted while waiting: the loop head reports it
            }
            let started = Instant::now();
            let worker_id = self.worker_ids.fetch_add(1, Ordering::SeqCst);
            let mut worker = match self.spawn_worker(zygote) {
                Ok(mut worker) => {
                    self.watch_gpu(&mut worker);
                    worker
                }
                Err(e) => {
                    pending.pop_front();
                    let message = format!("{}: {e}", self.settings.spawn.worker.display());
                    let mut report = UnitReport::new(first, Outcome::SpawnFailed { message });
                    report.wall = started.elapsed();
                    self.conclude(report, false, &mut history, &mut pending, tell);
                    continue;
                }
            };
            match wait_hello(&mut worker, self.stop, self.start_deadline(started)) {
                Ok(hello) => {
                    let _ = self.tensorflow_version.set(hello.tensorflow_version);
                }
                Err(outcome) => {
                    pending.pop_front();
                    let exit = worker.terminate(self.settings.grace);
                    let mut report = UnitReport::new(first, outcome);
                    finish_metrics(&mut report, &worker, Some(exit), started, (Duration::ZERO, Duration::ZERO));
                    report.worker_id = Some(worker_id);
                    self.conclude(report, false, &mut history, &mut pending, tell);
                    continue;
                }
            }
            // Units in this worker; the last report waits for the worker's
            // exit, whose rusage completes its measurements.
            let shared = !solo;
            let worker_batch: Vec<usize> = if solo { vec![first] } else { pending.iter().copied().collect() };
            let mut last: Option<(UnitReport, Instant, (Duration, Duration))> = None;
            let mut cpu_before = (Duration::ZERO, Duration::ZERO);
            while let Some(&index) = pending.front() {
                if self.stop.not_starting().is_some() {
                    break;
                }
                pending.pop_front();
                tell(Progress::Started(index));
                let unit_started = if last.is_none() { started } else { Instant::now() };
                let end = self.run_unit(&mut worker, index, &worker_batch, unit_started);
                if let Some((mut report, begun, before)) = last.take() {
                    finish_metrics(&mut report, &worker, None, begun, before);
                    self.conclude(report, shared, &mut history, &mut pending, tell);
                }
                let cpu_now = worker.cpu_now().unwrap_or(cpu_before);
                let mut report = end.report;
                report.worker_id = Some(worker_id);
                report.worker_pid = Some(worker.pid);
                last = Some((report, unit_started, cpu_before));
                cpu_before = cpu_now;
                if !end.worker_usable {
                    solo = true;
                    break;
                }
                if solo {
                    break;
                }
            }
            // No more work for this worker: ask it to leave, then make sure.
            let exit = shutdown(&mut worker, self.settings.grace);
            if let Some((mut report, begun, before)) = last.take() {
                finish_metrics(&mut report, &worker, Some(exit), begun, before);
                report.gpu_return = worker.gpu_after_exit();
                self.conclude(report, shared, &mut history, &mut pending, tell);
            }
        }
    }

    /// Ends an attempt: the unit runs again (first in line) when it may be
    /// retried, or when it failed in a shared worker (then it runs alone,
    /// so that only a model that fails on its own is blamed); otherwise its
    /// report goes out with every attempt in it.
    fn conclude(
        &self,
        mut report: UnitReport,
        shared_worker: bool,
        history: &mut HashMap<usize, Vec<Attempt>>,
        pending: &mut VecDeque<usize>,
        tell: &dyn Fn(Progress),
    ) {
        let index = report.index;
        report.gpu = self.gpu.clone();
        let attempts = history.entry(index).or_default();
        attempts.push(Attempt {
            outcome: report.outcome.clone(),
            wall: report.wall,
            peak_rss_bytes: report.peak_rss_bytes,
            worker_id: report.worker_id,
            shared_worker,
        });
        let worker_died = matches!(
            report.outcome,
            Outcome::Crashed { .. }
                | Outcome::MemoryLimit { .. }
                | Outcome::ProtocolError { .. }
                | Outcome::Timeout { .. }
        );
        let retries_used = attempts.iter().filter(|a| !a.shared_worker).count().saturating_sub(1) as u32;
        let retryable = self.settings.retry_on.iter().any(|s| s == report.outcome.status());
        let again =
            (shared_worker && worker_died) || (retryable && !shared_worker && retries_used < self.settings.retries);
        if again && self.stop.not_starting().is_none() {
            tracing::info!(unit = index, status = report.outcome.status(), "running the unit again");
            pending.push_front(index);
            return;
        }
        report.attempts = history.remove(&index).unwrap_or_default();
        tell(Progress::Finished(Box::new(report)));
    }

    /// Waits before retry number `n` (exponential, with jitter); false if
    /// interrupted meanwhile.
    fn back_off(&self, n: u32) -> bool {
        let base = Duration::from_millis(200).saturating_mul(1 << n.min(6)).min(Duration::from_secs(10));
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let jitter = 0.5 + f64::from(nanos % 1000) / 1000.0; // 0.5x to 1.5x
        let until = Instant::now() + base.mul_f64(jitter);
        while Instant::now() < until {
            if self.stop.not_starting().is_some() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    fn run_unit(&self, worker: &mut WorkerProcess, index: usize, batch: &[usize], started: Instant) -> UnitEnd {
        let model = &self.models[index];
        let mut report = UnitReport::new(index, Outcome::Ok);
        let inputs = match self.inputs.for_model(model, &self.settings.signature, &self.settings.tags) {
            Ok(inputs) => inputs,
            Err(error) => {
                report.outcome = Outcome::Error(error);
                return UnitEnd { report, worker_usable: true };
            }
        };
        let chunks = match self.settings.batch_size {
            Some(rows) => match batch::split(&inputs, &self.inputs.shared, rows) {
                Ok(chunks) => chunks,
                Err(message) => {
                    report.outcome = Outcome::Error(ModelError::new(ErrorKind::InputMismatch, message));
                    return UnitEnd { report, worker_usable: true };
                }
            },
            None => vec![inputs],
        };
        let deadlines = Deadlines {
            unit: self.settings.timeout.map(|t| started + t),
            load: self.settings.load_timeout.map(|t| started + t),
            grace: self.settings.grace,
            memory_limit: self.settings.memory_limit,
        };
        let rows: Vec<u64> = chunks.iter().map(|c| batch::rows(c)).collect();
        let mut parts = Vec::with_capacity(chunks.len());
        let mut worker_usable = true;
        for inputs in chunks {
            let request = RunRequest {
                unit: index as u64,
                model_dir: model.path.to_string_lossy().into_owned(),
                tags: self.settings.tags.clone(),
                signature: self.settings.signature.clone(),
                inputs,
                config: self.settings.session,
                load_only: false,
                libraries: self.settings.libraries.clone(),
                sandbox: self.settings.sandbox.as_ref().map(|spec| {
                    let mut spec = spec.clone();
                    spec.read_paths.extend(batch.iter().map(|&i| self.models[i].path.to_string_lossy().into_owned()));
                    spec
                }),
            };
            let envelope = RequestEnvelope::new(&ToWorker::Run(request), self.inputs.shared.clone());
            let end = run_request(worker, envelope, index as u64, self.stop, deadlines);
            report.load_ms = report.load_ms.or(end.load_ms);
            report.sandbox = worker.sandbox().cloned();
            report.run_ms = match (report.run_ms, end.run_ms) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            report.outcome = end.outcome;
            worker_usable = end.worker_usable;
            if !report.outcome.is_ok() {
                break;
            }
            parts.push(end.outputs);
        }
        // Once more after the answer: a worker holds its GPU memory until it exits.
        worker.sample_gpu();
        report.gpu_peak_bytes = worker.take_gpu_peak();
        let outputs = if report.outcome.is_ok() {
            match batch::join(parts, &rows) {
                Ok(outputs) => outputs,
                Err(message) => {
                    report.outcome = Outcome::Error(ModelError::new(ErrorKind::InputMismatch, message));
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        if report.outcome.is_ok() {
            match self.accept_outputs(model, &outputs) {
                Ok(outputs) => report.outputs = outputs,
                Err(error) => report.outcome = Outcome::Error(error),
            }
        }
        if let (true, Some(expect)) = (report.outcome.is_ok(), &self.settings.expect) {
            if let Some(mismatch) = expect.compare(&model.id, &outputs) {
                report.outcome = mismatch;
            }
        }
        UnitEnd { report, worker_usable }
    }

    /// Writes a unit's outputs and describes them for its record.
    fn accept_outputs(&self, model: &Model, outputs: &[(String, Tensor)]) -> Result<Vec<OutputInfo>, ModelError> {
        if let Some(dir) = &self.settings.output_dir {
            write_outputs(dir, &model.id, outputs)
                .map_err(|e| ModelError::new(ErrorKind::OutputWrite, e.to_string()))?;
        }
        Ok(outputs
            .iter()
            .map(|(name, tensor)| OutputInfo {
                name: name.clone(),
                dtype: tensor.dtype,
                shape: tensor.shape.clone(),
                values: self.settings.values.then(|| tensor_values(tensor)),
            })
            .collect())
    }
}

/// Wall time, CPU time and peak memory of a unit. With an `exit`, the
/// worker's totals from `wait4` complete them; otherwise `/proc` says.
fn finish_metrics(
    report: &mut UnitReport,
    worker: &WorkerProcess,
    exit: Option<Exit>,
    started: Instant,
    cpu_before: (Duration, Duration),
) {
    report.wall = started.elapsed();
    if report.stderr_tail.is_empty() && !report.outcome.is_ok() {
        report.stderr_tail = worker.stderr_tail();
    }
    let (peak, cpu) = match exit {
        Some(exit) => (Some(exit.max_rss_bytes), Some((exit.user, exit.system))),
        None => (worker.peak_rss_now(), worker.cpu_now()),
    };
    report.peak_rss_bytes = peak.or(report.peak_rss_bytes);
    if let Some((user, system)) = cpu {
        report.user = Some(user.saturating_sub(cpu_before.0));
        report.system = Some(system.saturating_sub(cpu_before.1));
    }
}
