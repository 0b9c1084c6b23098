//! Runs units of work in workers: `jobs` slot threads each take the next
//! batch of `models_per_worker` models, start a fresh worker for it, feed it
//! the models one by one, and watch it against deadlines, crashes, protocol
//! breaches and the user's interrupts. Every unit ends with exactly one
//! report; a worker's misbehaviour costs only the unit it was running.

use crate::cancel::CancelToken;
use crate::discover::{is_frozen_graph, Model};
use crate::event::Event;
use crate::feed::{latency_percentiles, Feed, StreamReport};
use crate::frozen_check::FrozenChecks;
use crate::gpu::{self, slot_device, slots_on_device, GpuWatch};
use crate::inputs::{place_shared, PreparedInputs};
use crate::process::{Exit, ExitStatus, SpawnSpec, WorkerProcess, Zygote};
use crate::session::{run_request, shutdown, terminate, wait_hello, Deadlines};
use crate::settings::{Settings, SpawnMode};
use crate::sink::OutputSink;
use crate::spare::{self, Reservation, Spare};
use crate::unit::{Attempt, OutputInfo, Phases, UnitReport};
use isorun_protocol::{
    ErrorKind, ModelError, Outcome, Preload, Preloaded, RunRequest, SandboxSpec, SessionConfig, Tensor, ToWorker,
    WarmRequest,
};
use isorun_tensors::batch;
use isorun_tensors::values::tensor_values;
use isorun_transport::RequestEnvelope;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The units waiting for a slot, in order. Units may arrive while the run
/// goes on (a Keras file's unit once its export is in the cache); slots wait
/// for more until the queue is closed. A slot may reserve the next batch
/// for a spare ([`UnitQueue::reserve`]); a slot with nothing else to do
/// takes a reserved batch before it waits.
pub(crate) struct UnitQueue {
    state: Mutex<QueueState>,
    arrived: Condvar,
    per_worker: usize,
    /// Units already decided before the run (their inputs do not fit their
    /// signature, see `inputs::decide_early`): never queued.
    decided: Vec<bool>,
}

#[derive(Default)]
struct QueueState {
    ready: VecDeque<usize>,
    closed: bool,
    /// Batches reserved for spares, not yet claimed by anyone.
    reserved: Vec<Arc<Reservation>>,
}

impl UnitQueue {
    pub(crate) fn new(per_worker: usize) -> UnitQueue {
        UnitQueue {
            state: Mutex::new(QueueState::default()),
            arrived: Condvar::new(),
            per_worker: per_worker.max(1),
            decided: Vec::new(),
        }
    }

    /// A unit ready to run (unless it was decided before the run).
    pub(crate) fn push(&self, index: usize) {
        if self.decided.get(index).copied().unwrap_or(false) {
            return;
        }
        self.state.lock().expect("queue").ready.push_back(index);
        self.arrived.notify_one();
    }

    /// No unit comes any more.
    pub(crate) fn close(&self) {
        self.state.lock().expect("queue").closed = true;
        self.arrived.notify_all();
    }

    /// The next batch (up to `models_per_worker` units there are now), or
    /// else a batch reserved for another slot's spare (whose slot is busy,
    /// while this one would wait); `None` once the queue is closed and
    /// nothing is left.
    fn next_batch(&self) -> Option<Vec<usize>> {
        let mut state = self.state.lock().expect("queue");
        loop {
            if !state.ready.is_empty() {
                let take = self.per_worker.min(state.ready.len());
                return Some(state.ready.drain(..take).collect());
            }
            state.reserved.retain(|r| !r.claimed());
            if let Some(position) = state.reserved.iter().position(|r| r.claim()) {
                return Some(state.reserved.remove(position).units.clone());
            }
            if state.closed {
                return None;
            }
            state = self.arrived.wait(state).expect("queue");
        }
    }

    /// True when [`next_batch`](Self::next_batch) would wait now: nothing
    /// ready, nothing reserved to take, and more units may come (a Keras
    /// file's unit, while it exports).
    fn would_wait(&self) -> bool {
        let state = self.state.lock().expect("queue");
        state.ready.is_empty() && !state.closed && state.reserved.iter().all(|r| r.claimed())
    }

    /// Takes the next batch for a spare, if units are ready now.
    fn reserve(&self) -> Option<Arc<Reservation>> {
        let mut state = self.state.lock().expect("queue");
        if state.ready.is_empty() {
            return None;
        }
        let take = self.per_worker.min(state.ready.len());
        let reservation = Reservation::new(state.ready.drain(..take).collect());
        state.reserved.retain(|r| !r.claimed());
        state.reserved.push(Arc::clone(&reservation));
        Some(reservation)
    }

    /// Gives back a reservation whose spare could not be forked: its units
    /// go first in line again, unless another slot claimed them meanwhile.
    fn release(&self, reservation: &Reservation) {
        if reservation.claim() {
            let mut state = self.state.lock().expect("queue");
            for &index in reservation.units.iter().rev() {
                state.ready.push_front(index);
            }
            drop(state);
            self.arrived.notify_one();
        }
    }
}

/// What feeds units to a run while it goes on: called on a thread of its
/// own with the queue (push units as they become ready) and the events
/// channel (report units that will never be ready); the queue closes when
/// it returns.
pub(crate) type Producer<'p> = &'p (dyn Fn(&UnitQueue, &mpsc::Sender<Event>) + Sync);

/// Runs every model; `on_event` sees each unit start and end. Returns
/// when every model has a report, with the TensorFlow version the workers
/// reported. Without a `producer` every model is ready at once; with one,
/// only the units it pushes run (it reports the others).
pub(crate) fn run_all(
    models: &[Model],
    work: Work<'_>,
    settings: &Settings,
    stop: &CancelToken,
    on_event: &mut dyn FnMut(Event),
    producer: Option<Producer<'_>>,
    checks: &dyn FrozenChecks,
) -> Option<String> {
    let tensorflow_version = &OnceLock::new();
    // Each slot starts at most one worker when the units fit the slots (see SpawnMode::Auto).
    let decided = match work {
        Work::Inputs { decided, .. } | Work::Feed { decided, .. } => decided.to_vec(),
    };
    let units = models.len() - decided.iter().filter(|&&d| d).count();
    let few_units = units.div_ceil(settings.models_per_worker.max(1)) <= settings.jobs.max(1);
    let mut queue = UnitQueue::new(settings.models_per_worker);
    queue.decided = decided;
    if producer.is_none() {
        for index in 0..models.len() {
            queue.push(index);
        }
        queue.close();
    }
    let worker_ids = AtomicU64::new(0);
    let zygote_broken = AtomicBool::new(false);
    // Where spares write the warm-up model (each in a folder of its own); removed at the end.
    let warm_dir = match (settings.spares, settings.spawn_mode) {
        (0, _) | (_, SpawnMode::Exec) => None,
        _ => tempfile::Builder::new()
            .prefix("isorun-spares-")
            .tempdir()
            .inspect_err(|e| tracing::warn!("no spare workers: cannot make their folder: {e}"))
            .ok(),
    };
    let warm_dir = warm_dir.as_ref().map(|d| d.path().to_string_lossy().into_owned());
    let preload = spare::may_preload(settings.memory_limit, &settings.gpus);
    let (tx, rx) = mpsc::channel::<Event>();
    std::thread::scope(|scope| {
        if let Some(producer) = producer {
            let (tx, queue) = (tx.clone(), &queue);
            std::thread::Builder::new()
                .name("producer".into())
                .spawn_scoped(scope, move || {
                    // Closed however the producer ends, so that slots never wait forever.
                    struct CloseOnDrop<'q>(&'q UnitQueue);
                    impl Drop for CloseOnDrop<'_> {
                        fn drop(&mut self) {
                            self.0.close();
                        }
                    }
                    let _close = CloseOnDrop(queue);
                    producer(queue, &tx);
                })
                .expect("spawn the producer thread");
        }
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
                work,
                settings,
                spawn,
                gpu_alone: slots_on_device(&settings.gpus, jobs, slot) == 1,
                gpu,
                stop,
                worker_ids: &worker_ids,
                tensorflow_version,
                zygote_broken: &zygote_broken,
                few_units,
                warm_dir: warm_dir.as_deref(),
                preload,
                checks,
            };
            let queue = &queue;
            std::thread::Builder::new()
                .name(format!("slot-{slot}"))
                .spawn_scoped(scope, move || {
                    // This thread starts the slot's zygote and workers and lives as
                    // long as they do (PR_SET_PDEATHSIG follows the forking thread).
                    let (reaper, reaper_thread) = start_reaper(scope, tx.clone());
                    let mut state = SlotState { zygote: None, spares: VecDeque::new(), reaper };
                    let tell = |progress| {
                        let _ = tx.send(progress);
                    };
                    loop {
                        // This slot's spares first, in the order their units were reserved.
                        let (batch, spare) = match state.spares.pop_front() {
                            Some(spare) if spare.reservation.claim() => (spare.reservation.units.clone(), Some(spare)),
                            Some(spare) => {
                                spare.discard("an idle slot took its units");
                                continue;
                            }
                            None => {
                                if queue.would_wait() {
                                    // Units are still coming (exports): the zygote
                                    // loads libtensorflow meanwhile, not on the first
                                    // unit's path.
                                    slot_ctx.start_zygote_early(&mut state.zygote);
                                }
                                match queue.next_batch() {
                                    Some(batch) => (batch, None),
                                    None => break,
                                }
                            }
                        };
                        slot_ctx.run_batch(batch, spare, &mut state, queue, &tell);
                    }
                    // The reaper's workers die with this thread (PR_SET_PDEATHSIG
                    // follows the thread, through the zygote for forked ones): it
                    // finishes before the thread ends.
                    let SlotState { zygote, spares, reaper } = state;
                    drop((spares, reaper));
                    let _ = reaper_thread.join();
                    drop(zygote);
                })
                .expect("spawn a slot thread");
        }
        drop(tx);
        for event in rx {
            on_event(event);
        }
    });
    tensorflow_version.get().cloned()
}

/// What the units of a run are given: one set of inputs for every model,
/// whose outputs go to a sink, or a stream of batches per unit.
#[derive(Clone, Copy)]
pub(crate) enum Work<'a> {
    /// `decided`: units already reported (see `inputs::decide_early`), never run.
    Inputs { inputs: &'a PreparedInputs, sink: &'a dyn OutputSink, decided: &'a [bool] },
    /// `decided`: units the feed's [`Feed::check`] already ended, never run.
    Feed { feed: &'a dyn Feed, decided: &'a [bool] },
}

struct Slot<'a> {
    models: &'a [Model],
    work: Work<'a>,
    settings: &'a Settings,
    /// How this slot starts workers: the settings' spec, with its device.
    spawn: SpawnSpec,
    /// The slot's device (`--gpus`), and whether no other slot shares it.
    gpu: Option<String>,
    gpu_alone: bool,
    stop: &'a CancelToken,
    worker_ids: &'a AtomicU64,
    tensorflow_version: &'a OnceLock<String>,
    /// Set when zygotes do not work here: every slot then execs workers.
    zygote_broken: &'a AtomicBool,
    /// No more worker batches than slots: each slot starts at most one
    /// worker (retries aside), so `SpawnMode::Auto` execs it.
    few_units: bool,
    /// Where spares write the warm-up model; `None`: no spares.
    warm_dir: Option<&'a str>,
    /// Spares may load their unit's model as their warm-up ([`spare::may_preload`]).
    preload: bool,
    /// Frozen Keras exports whose check a unit's worker runs first.
    checks: &'a dyn FrozenChecks,
}

/// What a slot thread keeps between batches: its zygote (started on first
/// use), its spares (in the order of their reservations), its reaper.
struct SlotState {
    zygote: Option<Arc<Zygote>>,
    spares: VecDeque<Spare>,
    reaper: mpsc::Sender<Reap>,
}

/// A spare just forked: its worker, when it was forked (its start limit
/// and warm-up time count from there), and whether it preloads its unit's model.
type Forked = (WorkerProcess, Instant, bool);

/// Forks a spare from `zygote` and asks it to warm up.
fn fork_spare(
    zygote: &Arc<Zygote>,
    spawn: &SpawnSpec,
    reap_timeout: Duration,
    warm: WarmRequest,
) -> std::io::Result<Forked> {
    let mut worker = WorkerProcess::spawn_forked(zygote, spawn)?;
    let forked = Instant::now();
    worker.set_reap_timeout(reap_timeout);
    let preloading = warm.preload.is_some();
    worker.send(RequestEnvelope::new(&ToWorker::Warm(warm), Vec::new())).map_err(std::io::Error::other)?;
    Ok((worker, forked, preloading))
}

/// Spares being forked on a helper thread ([`Slot::fork_spares_early`]):
/// their reservations, in order, and the forks' results as they come.
struct EarlySpares {
    reservations: Vec<Arc<Reservation>>,
    results: mpsc::Receiver<std::io::Result<Forked>>,
}

/// How a unit in a live worker ended: the report, and whether the worker
/// can take another; `again`: its model was exported anew after a failed
/// check, and the unit runs again in a fresh worker (the report goes).
struct UnitEnd {
    report: UnitReport,
    worker_usable: bool,
    again: bool,
}

impl UnitEnd {
    fn new(report: UnitReport, worker_usable: bool) -> UnitEnd {
        UnitEnd { report, worker_usable, again: false }
    }
}

/// When a unit began, and what its worker did for it ahead of that.
#[derive(Debug, Clone, Copy)]
struct Begun {
    at: Instant,
    /// The worker holds the unit's model: a spare loaded it while warming up.
    preloaded: Option<Preloaded>,
}

/// What the check of a unit's frozen export came to ([`Slot::check_export`]).
enum Checked {
    /// Nothing to check.
    Nothing,
    /// It passed: the worker holds the model.
    Passed,
    /// The unit ends here (its report says how), or runs `again`.
    End { again: bool },
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
        let mut worker = self.spawn_worker_process(zygote)?;
        worker.set_reap_timeout(self.settings.reap_timeout);
        Ok(worker)
    }

    /// Starts the slot's zygote before its first unit, where workers will
    /// be forked: called while the slot waits for units that are still
    /// being made (a Keras run's exports take seconds, the zygote's load of
    /// libtensorflow a fraction of one), so the first unit forks too.
    fn start_zygote_early(&self, zygote: &mut Option<Arc<Zygote>>) {
        let forking = match self.settings.spawn_mode {
            SpawnMode::Exec => false,
            SpawnMode::Zygote => true,
            SpawnMode::Auto => !self.few_units,
        };
        if forking && zygote.is_none() && !self.zygote_broken.load(Ordering::SeqCst) {
            match Zygote::start(&self.spawn) {
                Ok(z) => *zygote = Some(Arc::new(z)),
                Err(e) => tracing::info!("cannot start the zygote: {e}"),
            }
        }
    }

    fn spawn_worker_process(&self, zygote: &mut Option<Arc<Zygote>>) -> std::io::Result<WorkerProcess> {
        let forking = match self.settings.spawn_mode {
            SpawnMode::Exec => false,
            SpawnMode::Zygote => true,
            SpawnMode::Auto if self.few_units => false,
            SpawnMode::Auto => {
                if zygote.is_none() && !self.zygote_broken.load(Ordering::SeqCst) {
                    // The zygote loads libtensorflow while this first worker, exec'd, runs.
                    match Zygote::start(&self.spawn) {
                        Ok(z) => *zygote = Some(Arc::new(z)),
                        Err(e) => tracing::info!("cannot start the zygote: {e}"),
                    }
                    return WorkerProcess::spawn(&self.spawn);
                }
                true
            }
        };
        if forking && !self.zygote_broken.load(Ordering::SeqCst) {
            let mut reason = String::new();
            for _ in 0..2 {
                if !zygote.as_ref().is_some_and(|z| z.alive()) {
                    *zygote = match Zygote::start(&self.spawn) {
                        Ok(z) => Some(Arc::new(z)),
                        Err(e) => {
                            reason = format!("cannot start the zygote: {e}");
                            tracing::info!("{reason}");
                            None
                        }
                    };
                }
                if let Some(z) = zygote.as_ref() {
                    match WorkerProcess::spawn_forked(z, &self.spawn) {
                        Ok(worker) => return Ok(worker),
                        Err(e) => {
                            reason = match z.stderr_tail() {
                                tail if tail.is_empty() => format!("{e}"),
                                tail => format!("{e}; its stderr: {tail}"),
                            };
                            tracing::info!("zygote failed: {reason}; starting a new one");
                            *zygote = None;
                        }
                    }
                }
            }
            if !self.zygote_broken.swap(true, Ordering::SeqCst) {
                tracing::warn!("workers cannot be forked from a zygote here ({reason}); exec'ing each worker instead");
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

    /// Runs a batch of units, in `spare` (warm, reserved for them) if there
    /// is one, else in fresh workers; keeps the slot's spares topped up.
    fn run_batch(
        &self,
        batch: Vec<usize>,
        mut spare: Option<Spare>,
        state: &mut SlotState,
        queue: &UnitQueue,
        tell: &dyn Fn(Event),
    ) {
        let SlotState { zygote, spares, reaper } = state;
        let mut pending: VecDeque<usize> = batch.into();
        let mut history: HashMap<usize, Vec<Attempt>> = HashMap::new();
        // One unit per worker once a shared worker has died (crash bisection).
        let mut solo = self.settings.models_per_worker <= 1;
        while let Some(&first) = pending.front() {
            if let Some(reason) = self.stop.not_starting() {
                for index in pending.drain(..) {
                    let mut report = UnitReport::new(index, Outcome::NotRun { reason });
                    report.attempts = history.remove(&index).unwrap_or_default();
                    tell(Event::Finished(Box::new(report)));
                }
                return;
            }
            let retries_so_far = history.get(&first).map_or(0, |h| h.iter().filter(|a| !a.shared_worker).count());
            if retries_so_far > 0 && !self.back_off(retries_so_far as u32) {
                continue; // interrupted while waiting: the loop head reports it
            }
            // The batch's spare, if it has one and it warmed up: the unit starts now.
            let load_limit = [self.settings.load_timeout, self.settings.timeout].into_iter().flatten().min();
            let warm = spare.take().and_then(|spare| {
                spare.ready(self.settings.start_timeout, self.settings.memory_limit, load_limit, self.stop)
            });
            let started = Instant::now();
            // The worker's spawn and its wait for Hello, when it was started for this unit.
            let mut start_phases: Option<(Duration, Duration)> = None;
            let (mut worker, worker_id, spare_report, mut cpu_before) = match warm {
                Some((mut worker, worker_id, report)) => {
                    self.watch_gpu(&mut worker);
                    // What the built-in warm-up used is not the unit's. A spare
                    // that preloaded the unit's model did nothing but prepare
                    // for this unit: all its CPU is the unit's, as a fresh
                    // worker's is (read from the kernel, not the worker's word).
                    let cpu = match report.preloaded {
                        Some(_) => (Duration::ZERO, Duration::ZERO),
                        None => worker.cpu_now().unwrap_or_default(),
                    };
                    (worker, worker_id, Some(report), cpu)
                }
                None => {
                    let worker_id = self.worker_ids.fetch_add(1, Ordering::SeqCst);
                    let spawning = Instant::now();
                    let spawned = self.spawn_worker(zygote);
                    let spawn_time = spawning.elapsed();
                    let mut worker = match spawned {
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
                    let waiting = Instant::now();
                    match wait_hello(&mut worker, self.stop, self.start_deadline(started)) {
                        Ok(hello) => {
                            let _ = self.tensorflow_version.set(hello.tensorflow_version);
                            start_phases = Some((spawn_time, waiting.elapsed()));
                        }
                        Err(outcome) => {
                            pending.pop_front();
                            let exit = terminate(&mut worker, self.settings.grace, self.stop);
                            let mut report = UnitReport::new(first, outcome);
                            finish_metrics(&mut report, &worker, Some(exit), started, (Duration::ZERO, Duration::ZERO));
                            report.worker_id = Some(worker_id);
                            self.conclude(report, false, &mut history, &mut pending, tell);
                            continue;
                        }
                    }
                    (worker, worker_id, None, (Duration::ZERO, Duration::ZERO))
                }
            };
            // While this worker runs, the next units' spares fork and warm up:
            // at once from a ready zygote, or, beside a first worker exec'd
            // while the zygote still loads libtensorflow, from a helper
            // thread that waits for the zygote (collected after this worker's units).
            let early = if worker.forked() {
                self.refill_spares(spares, queue, zygote);
                None
            } else {
                self.fork_spares_early(spares, queue, zygote)
            };
            // Units in this worker; the last report waits for the worker's
            // exit, whose rusage completes its measurements.
            let shared = !solo;
            let worker_batch: Vec<usize> = if solo { vec![first] } else { pending.iter().copied().collect() };
            let mut last: Option<(UnitReport, Instant, (Duration, Duration))> = None;
            while let Some(&index) = pending.front() {
                if self.stop.not_starting().is_some() {
                    break;
                }
                pending.pop_front();
                tell(Event::Started(index));
                let unit_started = if last.is_none() { started } else { Instant::now() };
                // The spare's preload is its first unit's load, done ahead.
                let preloaded = match last {
                    None => spare_report.as_ref().and_then(|s| s.preloaded),
                    Some(_) => None,
                };
                let end = self.run_unit(&mut worker, index, &worker_batch, unit_started, preloaded);
                if end.again {
                    // Exported anew: the unit runs again, first, in a fresh worker.
                    pending.push_front(index);
                    solo = true;
                    break;
                }
                if let Some((mut report, begun, before)) = last.take() {
                    finish_metrics(&mut report, &worker, None, begun, before);
                    self.conclude(report, shared, &mut history, &mut pending, tell);
                }
                let cpu_now = worker.cpu_now().unwrap_or(cpu_before);
                let mut report = end.report;
                if let Some(phases) = report.phases.as_mut() {
                    match start_phases.take() {
                        Some((spawn, hello)) => {
                            phases.spawn = Some(spawn);
                            phases.hello = Some(hello);
                        }
                        // A spare applied its sandbox while warming up; a later unit
                        // of a shared worker found it applied.
                        None => phases.sandbox.clear(),
                    }
                }
                report.worker_id = Some(worker_id);
                report.worker_pid = Some(worker.pid);
                report.worker_forked = Some(worker.forked());
                if last.is_none() {
                    report.spare = spare_report.clone();
                }
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
            if let Some(early) = early {
                self.collect_early_spares(early, spares, queue);
            }
            // No more work for this worker: ask it to leave, then make sure.
            // A unit that is over either way (it passed) is reaped by the
            // slot's reaper while the next unit starts: a worker's exit
            // (unmapping TensorFlow) takes ~10 ms.
            let last = match last.take() {
                Some((report, begun, before)) if self.settles_on_exit(&report, &worker) => {
                    let attempts = history.remove(&report.index).unwrap_or_default();
                    let (gpu, grace) = (self.gpu.clone(), self.settings.grace);
                    let reap = Reap { worker, report, begun, before, attempts, shared, gpu, grace };
                    match reaper.send(reap) {
                        Ok(()) => continue,
                        Err(mpsc::SendError(reap)) => {
                            // No reaper (it cannot be gone while the slot runs): as below.
                            worker = reap.worker;
                            history.insert(reap.report.index, reap.attempts);
                            Some((reap.report, reap.begun, reap.before))
                        }
                    }
                }
                last => last,
            };
            let leaving = Instant::now();
            let exit = shutdown(&mut worker, self.settings.grace);
            let exit_time = leaving.elapsed();
            if let Some((mut report, begun, before)) = last {
                if let Some(phases) = report.phases.as_mut() {
                    phases.exit = Some(exit_time);
                }
                finish_metrics(&mut report, &worker, Some(exit), begun, before);
                report.gpu_return = worker.gpu_after_exit();
                self.conclude(report, shared, &mut history, &mut pending, tell);
            }
        }
    }

    /// True when a unit's report is final whatever its worker's exit says
    /// (it passed and passing is not retried), and nothing but the exit's
    /// measurements is missing (no GPU to watch give its memory back).
    fn settles_on_exit(&self, report: &UnitReport, worker: &WorkerProcess) -> bool {
        report.outcome.is_ok() && !self.settings.retry_on.iter().any(|s| s == "ok") && !worker.watches_gpu()
    }

    /// Forks spares for the next units in line until the slot has
    /// `--spares` of them, while units are ready, the zygote lives and
    /// memory is not short (then its spares go). Called once a forked
    /// worker is up: the slot forks (an exec'd worker means it does not, or
    /// not yet), and its zygote is ready.
    fn refill_spares(&self, spares: &mut VecDeque<Spare>, queue: &UnitQueue, zygote: &Option<Arc<Zygote>>) {
        let Some(warm_dir) = self.warm_dir else { return };
        let Some(zygote) = zygote.as_ref().filter(|z| z.alive()) else { return };
        if spare::memory_short(self.settings.memory_limit) {
            for spare in spares.drain(..) {
                let reservation = Arc::clone(&spare.reservation);
                spare.discard("memory is short");
                queue.release(&reservation);
            }
            return;
        }
        while spares.len() < self.settings.spares && self.stop.not_starting().is_none() {
            let Some(reservation) = queue.reserve() else { return };
            let warm = self.warm_request(&reservation, warm_dir);
            match fork_spare(zygote, &self.spawn, self.settings.reap_timeout, warm) {
                Ok((worker, forked, preloading)) => {
                    let worker_id = self.worker_ids.fetch_add(1, Ordering::SeqCst);
                    spares.push_back(Spare { worker, reservation, worker_id, forked, preloading });
                }
                Err(e) => {
                    tracing::info!("cannot fork a spare worker: {e}");
                    queue.release(&reservation);
                    return;
                }
            }
        }
    }

    /// Reserves the next units for spares and forks them on a helper
    /// thread, beside a first worker that was exec'd because the slot's
    /// zygote was still loading libtensorflow: the fork waits for the
    /// zygote there, not on this slot's path, so the unit after the first
    /// starts in a warm spare too. `None` when the slot has no spares to make.
    fn fork_spares_early(
        &self,
        spares: &VecDeque<Spare>,
        queue: &UnitQueue,
        zygote: &Option<Arc<Zygote>>,
    ) -> Option<EarlySpares> {
        let warm_dir = self.warm_dir?;
        let zygote = Arc::clone(zygote.as_ref().filter(|z| z.alive())?);
        if spare::memory_short(self.settings.memory_limit) {
            return None;
        }
        let mut reservations = Vec::new();
        while spares.len() + reservations.len() < self.settings.spares && self.stop.not_starting().is_none() {
            let Some(reservation) = queue.reserve() else { break };
            reservations.push(reservation);
        }
        if reservations.is_empty() {
            return None;
        }
        let requests: Vec<WarmRequest> = reservations.iter().map(|r| self.warm_request(r, warm_dir)).collect();
        let (spawn, reap_timeout) = (self.spawn.clone(), self.settings.reap_timeout);
        let (tx, results) = mpsc::channel();
        let forking = std::thread::Builder::new().name("early-spares".into()).spawn(move || {
            for warm in requests {
                let started = fork_spare(&zygote, &spawn, reap_timeout, warm);
                let failed = started.is_err();
                // Nobody waits any more (the unit ended, the run stops): the
                // worker is dropped with the message, which kills it.
                if tx.send(started).is_err() || failed {
                    return;
                }
            }
        });
        match forking {
            Ok(_) => Some(EarlySpares { reservations, results }),
            Err(e) => {
                tracing::info!("cannot start a thread to fork spares: {e}");
                for reservation in &reservations {
                    queue.release(reservation);
                }
                None
            }
        }
    }

    /// Takes in the spares [`Slot::fork_spares_early`] forked, in the order
    /// of their reservations, waiting for the zygote if the first unit was
    /// quicker; gives back the units of those that could not be forked, and
    /// of all of them when the run stops meanwhile.
    fn collect_early_spares(&self, early: EarlySpares, spares: &mut VecDeque<Spare>, queue: &UnitQueue) {
        let EarlySpares { reservations, results } = early;
        for reservation in reservations {
            let forked = loop {
                if self.stop.not_starting().is_some() {
                    break None;
                }
                match results.recv_timeout(Duration::from_millis(20)) {
                    Ok(forked) => break Some(forked),
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break None,
                }
            };
            match forked {
                Some(Ok((worker, forked, preloading))) => {
                    let worker_id = self.worker_ids.fetch_add(1, Ordering::SeqCst);
                    spares.push_back(Spare { worker, reservation, worker_id, forked, preloading });
                }
                Some(Err(e)) => {
                    tracing::info!("cannot fork a spare worker: {e}");
                    queue.release(&reservation);
                }
                None => queue.release(&reservation),
            }
        }
    }

    /// A spare's warm-up request for its reserved units: their sandbox, the
    /// run's session, and the first unit's model to load where spares may.
    fn warm_request(&self, reservation: &Reservation, warm_dir: &str) -> WarmRequest {
        let first = reservation.units.first().filter(|_| self.preload);
        let preload =
            first.filter(|&&index| spare::fits_beside(&self.models[index].path, self.settings.spares)).map(|&index| {
                Preload {
                    model_dir: self.models[index].path.to_string_lossy().into_owned(),
                    tags: self.settings.tags.clone(),
                    config: self.session_for(index),
                    libraries: self.settings.libraries.clone(),
                }
            });
        WarmRequest {
            sandbox: self.sandbox_for(&reservation.units),
            config: self.settings.session,
            warm_dir: warm_dir.to_string(),
            cpu_only: true,
            preload,
        }
    }

    /// The sandbox of a worker for `batch`: the settings' spec with the batch's model folders.
    fn sandbox_for(&self, batch: &[usize]) -> Option<SandboxSpec> {
        self.settings.sandbox.as_ref().map(|spec| {
            let mut spec = spec.clone();
            spec.read_paths.extend(batch.iter().map(|&i| self.models[i].path.to_string_lossy().into_owned()));
            spec
        })
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
        tell: &dyn Fn(Event),
    ) {
        let index = report.index;
        report.gpu = self.gpu.clone();
        let attempts = history.entry(index).or_default();
        attempts.push(Attempt::of(&report, shared_worker));
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
        tell(Event::Finished(Box::new(report)));
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

    /// The check of unit `index`'s frozen Keras export, when it waits for
    /// one (see `frozen_check`): the probe runs in the unit's worker before
    /// the unit's own inputs, under the unit's limits. A worker that
    /// crashes, hangs or overflows on it ends the unit so, as on any
    /// request; a graph that fails it (or a check file that cannot be
    /// read) is exported again the archive's way, and the unit runs again
    /// in a fresh worker (this one holds the frozen graph).
    fn check_export(
        &self,
        worker: &mut WorkerProcess,
        index: usize,
        batch: &[usize],
        deadlines: Deadlines,
        loaded: bool,
        report: &mut UnitReport,
    ) -> Checked {
        let Some(probe) = self.checks.probe(index) else { return Checked::Nothing };
        let began = Instant::now();
        let why = match probe {
            Err(why) => why,
            Ok(probe) => {
                let mut shared = Vec::new();
                let inputs = place_shared(probe.inputs.clone(), &mut shared);
                let envelope = RequestEnvelope::new(&ToWorker::Run(self.request(index, batch, inputs)), shared);
                let end = run_request(worker, envelope, index as u64, self.stop, deadlines, loaded);
                report.load_ms = end.load_ms;
                report.sandbox = worker.sandbox().cloned();
                if !end.worker_usable {
                    report.outcome = end.outcome;
                    return Checked::End { again: false };
                }
                match (&end.outcome, probe.differs(&end.outputs)) {
                    (Outcome::Ok, None) => {
                        self.checks.passed(index, began.elapsed().as_millis() as u64);
                        return Checked::Passed;
                    }
                    (Outcome::Ok, Some(why)) => why,
                    // The graph itself failed to import or to run, as the export
                    // process's own check would have found.
                    (Outcome::Error(e), _) if matches!(e.kind, ErrorKind::LoadFailed | ErrorKind::Tensorflow) => {
                        format!("the frozen graph failed on the probe: {}", end.outcome)
                    }
                    // Anything else is the unit's (a signature it lacks, a panic):
                    // the entry waits for the next unit's check.
                    _ => {
                        report.outcome = end.outcome;
                        return Checked::End { again: false };
                    }
                }
            }
        };
        match self.checks.export_again(index, &why, self.settings, self.stop) {
            Ok(()) => Checked::End { again: true },
            Err(outcome) => {
                report.outcome = outcome;
                Checked::End { again: false }
            }
        }
    }

    /// Runs unit `index` in `worker`; `preloaded`: the worker holds the
    /// unit's model already (a spare's preload).
    fn run_unit(
        &self,
        worker: &mut WorkerProcess,
        index: usize,
        batch: &[usize],
        started: Instant,
        preloaded: Option<Preloaded>,
    ) -> UnitEnd {
        let begun = Begun { at: started, preloaded };
        match self.work {
            Work::Inputs { inputs, sink, .. } => self.run_with_inputs(worker, index, batch, begun, inputs, sink),
            Work::Feed { feed, .. } => self.run_fed(worker, index, batch, begun, feed),
        }
    }

    /// The session settings of unit `index`: the run's, and Grappler off
    /// where a unit runs a frozen graph once (one set of inputs, as `run`
    /// gives): Grappler copies and scans the graph's constant weights before
    /// the first run (ResNet50: ~1 s of a 1.9 s first run), which only many
    /// runs of its fused kernels pay back (an `eval` unit's batches keep it).
    fn session_for(&self, index: usize) -> SessionConfig {
        let mut config = self.settings.session;
        if matches!(self.work, Work::Inputs { .. }) && is_frozen_graph(&self.models[index].path) {
            config.skip_grappler = true;
        }
        config
    }

    /// The request for one of the unit's batches.
    fn request(&self, index: usize, batch: &[usize], inputs: Vec<(String, Tensor)>) -> RunRequest {
        RunRequest {
            unit: index as u64,
            model_dir: self.models[index].path.to_string_lossy().into_owned(),
            tags: self.settings.tags.clone(),
            signature: self.settings.signature.clone(),
            inputs,
            config: self.session_for(index),
            load_only: false,
            libraries: self.settings.libraries.clone(),
            sandbox: self.sandbox_for(batch),
        }
    }

    /// Before a unit's first request: its frozen export's check, if it has
    /// one, and its spare's preload. `Ok(loaded)`: the worker holds the
    /// model (it passed the check, or was preloaded), and the report has
    /// its `load_ms`; `Err(again)`: the unit ended at the check (its report
    /// says how), or runs again.
    fn check_or_preloaded(
        &self,
        worker: &mut WorkerProcess,
        index: usize,
        batch: &[usize],
        deadlines: Deadlines,
        begun: Begun,
        report: &mut UnitReport,
    ) -> Result<bool, bool> {
        let preloaded = begun.preloaded.is_some();
        let loaded = match self.check_export(worker, index, batch, deadlines, preloaded, report) {
            Checked::Nothing => preloaded,
            Checked::Passed => true,
            Checked::End { again } => return Err(again),
        };
        report.load_ms = report.load_ms.or(begun.preloaded.map(|p| p.load_ms));
        Ok(loaded)
    }

    /// The unit's deadlines, counted from its start, or from its model's
    /// load where a spare loaded it ahead (the limits are the same as a
    /// fresh worker's: the load is part of the unit).
    fn deadlines(&self, begun: Begun) -> Deadlines {
        let load = Duration::from_millis(begun.preloaded.map_or(0, |p| p.load_ms));
        let started = begun.at.checked_sub(load).unwrap_or(begun.at);
        Deadlines {
            unit: self.settings.timeout.map(|t| started + t),
            load: self.settings.load_timeout.map(|t| started + t),
            run: self.settings.batch_timeout,
            grace: self.settings.grace,
            memory_limit: self.settings.memory_limit,
        }
    }

    /// A unit fed batch after batch by its stream, in one worker that keeps
    /// the model loaded; the outputs of each batch go back to the stream.
    fn run_fed(
        &self,
        worker: &mut WorkerProcess,
        index: usize,
        batch: &[usize],
        begun: Begun,
        feed: &dyn Feed,
    ) -> UnitEnd {
        let mut report = UnitReport::new(index, Outcome::Ok);
        let mut stream = match feed.open(&self.models[index]) {
            Ok(stream) => stream,
            Err(outcome) => {
                report.outcome = outcome;
                return UnitEnd::new(report, true);
            }
        };
        // After the stream opened: a dataset that does not fit costs no probe.
        let deadlines = self.deadlines(begun);
        let mut loaded = match self.check_or_preloaded(worker, index, batch, deadlines, begun, &mut report) {
            Ok(loaded) => loaded,
            Err(again) => return UnitEnd { report, worker_usable: false, again },
        };
        let mut phases = Phases::default();
        let mut worker_usable = true;
        let mut latencies: Vec<f64> = Vec::new();
        let mut batches_time = Duration::ZERO;
        loop {
            let reading = Instant::now();
            let next = stream.next_batch();
            phases.feed_next += reading.elapsed();
            let inputs = match next {
                None => break,
                Some(Err(outcome)) => {
                    report.outcome = outcome;
                    break;
                }
                Some(Ok(inputs)) => inputs,
            };
            let mut shared = Vec::new();
            let inputs = place_shared(inputs, &mut shared);
            let mut request = self.request(index, batch, inputs);
            if let Some(signature) = stream.signature() {
                request.signature = signature.to_string();
            }
            let envelope = RequestEnvelope::new(&ToWorker::Run(request), shared);
            let sent = Instant::now();
            // After this unit's first request ended well, the worker holds its
            // model (whether or not it said `Loaded`: a shared worker may have
            // held the same SavedModel already).
            let end = run_request(worker, envelope, index as u64, self.stop, deadlines, loaded);
            loaded |= end.worker_usable && end.outcome.is_ok();
            phases.requests += sent.elapsed();
            report.load_ms = report.load_ms.or(end.load_ms);
            report.sandbox = worker.sandbox().cloned();
            worker_usable = end.worker_usable;
            if !end.outcome.is_ok() {
                report.outcome = end.outcome;
                break;
            }
            // The first batch's time includes loading; its latency is the warm-up.
            let latency = sent.elapsed().saturating_sub(Duration::from_millis(end.load_ms.unwrap_or(0)));
            phases.run += Duration::from_micros(end.run_us.unwrap_or(0));
            report.run_ms = Some(phases.run.as_millis() as u64);
            latencies.push(latency.as_secs_f64() * 1000.0);
            batches_time += latency;
            let scoring = Instant::now();
            let accepted = stream.accept(end.outputs);
            phases.feed_accept += scoring.elapsed();
            if let Err(outcome) = accepted {
                report.outcome = outcome;
                break;
            }
        }
        worker.sample_gpu();
        report.gpu_peak_bytes = worker.take_gpu_peak();
        let ok = report.outcome.is_ok();
        let finishing = Instant::now();
        let summary = stream.finish(ok);
        phases.feed_accept += finishing.elapsed();
        phases.feed_background = stream.background();
        phases.sandbox = sandbox_steps(worker);
        report.phases = self.settings.phases.then_some(phases);
        if let (true, Some(outcome)) = (ok, summary.outcome) {
            report.outcome = outcome;
        }
        let seconds = batches_time.as_secs_f64();
        report.stream = Some(StreamReport {
            examples: summary.examples,
            batches: latencies.len() as u64,
            examples_per_second: (seconds > 0.0).then(|| summary.examples as f64 / seconds),
            latency_ms: latency_percentiles(&latencies),
            fields: if ok { summary.fields } else { Default::default() },
        });
        UnitEnd::new(report, worker_usable)
    }

    fn run_with_inputs(
        &self,
        worker: &mut WorkerProcess,
        index: usize,
        batch: &[usize],
        begun: Begun,
        prepared: &PreparedInputs,
        sink: &dyn OutputSink,
    ) -> UnitEnd {
        let model = &self.models[index];
        let mut report = UnitReport::new(index, Outcome::Ok);
        let (inputs, shared) = match prepared.for_unit(model, self.settings) {
            Ok(prepared) => {
                report.casts = prepared.casts;
                (prepared.tensors, prepared.shared)
            }
            Err(error) => {
                report.outcome = Outcome::Error(error);
                return UnitEnd::new(report, true);
            }
        };
        // `--batch-size`: the row ranges now, each chunk when its turn comes
        // (views of the shared inputs, see `isorun_tensors::batch`).
        let ranges = match self.settings.batch_size {
            Some(rows) => match batch::ranges(&inputs, rows) {
                Ok(ranges) if ranges.len() > 1 => ranges,
                Ok(_) => Vec::new(),
                Err(message) => {
                    report.outcome = Outcome::Error(ModelError::new(ErrorKind::InputMismatch, message));
                    return UnitEnd::new(report, true);
                }
            },
            None => Vec::new(),
        };
        let deadlines = self.deadlines(begun);
        let mut loaded = match self.check_or_preloaded(worker, index, batch, deadlines, begun, &mut report) {
            Ok(loaded) => loaded,
            Err(again) => return UnitEnd { report, worker_usable: false, again },
        };
        let mut phases = Phases::default();
        let rows: Vec<u64> = ranges.iter().map(|(a, b)| b - a).collect();
        let mut parts = Vec::with_capacity(ranges.len().max(1));
        let mut worker_usable = true;
        let mut whole = Some(inputs);
        for step in 0..ranges.len().max(1) {
            let (inputs, shared) = match ranges.get(step) {
                None => (whole.take().unwrap_or_default(), shared.clone()),
                Some(&(start, end)) => {
                    match batch::chunk(whole.as_deref().unwrap_or_default(), &shared, start, end) {
                        Ok(chunk) => chunk,
                        Err(message) => {
                            // The input file changed under the run (truncated): this unit's error.
                            report.outcome = Outcome::Error(ModelError::new(ErrorKind::InputMismatch, message));
                            break;
                        }
                    }
                }
            };
            let envelope = RequestEnvelope::new(&ToWorker::Run(self.request(index, batch, inputs)), shared);
            let sent = Instant::now();
            let end = run_request(worker, envelope, index as u64, self.stop, deadlines, loaded);
            loaded |= end.worker_usable && end.outcome.is_ok();
            phases.requests += sent.elapsed();
            report.load_ms = report.load_ms.or(end.load_ms);
            report.sandbox = worker.sandbox().cloned();
            if let Some(us) = end.run_us {
                phases.run += Duration::from_micros(us);
                report.run_ms = Some(phases.run.as_millis() as u64);
            }
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
            match sink.accept(model, &outputs).and_then(|()| self.describe_outputs(&outputs)) {
                Ok(described) => report.outputs = described,
                Err(outcome) => report.outcome = outcome,
            }
        }
        phases.sandbox = sandbox_steps(worker);
        report.phases = self.settings.phases.then_some(phases);
        UnitEnd::new(report, worker_usable)
    }

    /// Describes a unit's outputs for its report, with their values if asked.
    /// An output whose values are too many to give as JSON is the unit's error.
    fn describe_outputs(&self, outputs: &[(String, Tensor)]) -> Result<Vec<OutputInfo>, Outcome> {
        outputs
            .iter()
            .map(|(name, tensor)| {
                let values = match self.settings.values {
                    true => Some(tensor_values(tensor).map_err(|message| {
                        Outcome::Error(ModelError::new(ErrorKind::OutputWrite, format!("output {name}: {message}")))
                    })?),
                    false => None,
                };
                Ok(OutputInfo { name: name.clone(), dtype: tensor.dtype, shape: tensor.shape.clone(), values })
            })
            .collect()
    }
}

/// A passed unit's worker, to be told to exit, and its report, which the
/// worker's exit completes (wall time, CPU time, peak memory).
struct Reap {
    worker: WorkerProcess,
    report: UnitReport,
    begun: Instant,
    before: (Duration, Duration),
    /// The unit's earlier attempts.
    attempts: Vec<Attempt>,
    shared: bool,
    gpu: Option<String>,
    /// How long it may take to exit before it is killed.
    grace: Duration,
}

/// A slot's reaper: ends each worker it is given as the slot would
/// (`shutdown`: `Shutdown`, the grace, SIGTERM, SIGKILL), then sends its unit's report.
fn start_reaper<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    events: mpsc::Sender<Event>,
) -> (mpsc::Sender<Reap>, std::thread::ScopedJoinHandle<'scope, ()>) {
    let (tx, rx) = mpsc::channel::<Reap>();
    let thread = std::thread::Builder::new()
        .name("reaper".into())
        .spawn_scoped(scope, move || {
            for mut reap in rx {
                let leaving = Instant::now();
                let exit = shutdown(&mut reap.worker, reap.grace);
                let mut report = reap.report;
                if let Some(phases) = report.phases.as_mut() {
                    phases.exit = Some(leaving.elapsed());
                }
                finish_metrics(&mut report, &reap.worker, Some(exit), reap.begun, reap.before);
                report.gpu = reap.gpu;
                reap.attempts.push(Attempt::of(&report, reap.shared));
                report.attempts = reap.attempts;
                let _ = events.send(Event::Finished(Box::new(report)));
            }
        })
        .expect("spawn a reaper thread");
    (tx, thread)
}

/// The worker's sandbox steps, as it timed them.
fn sandbox_steps(worker: &WorkerProcess) -> Vec<(String, Duration)> {
    worker.sandbox_steps().iter().map(|(name, us)| (name.clone(), Duration::from_micros(*us))).collect()
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
    if exit.is_some_and(|e| e.status == ExitStatus::Unreaped) {
        report.worker_unreaped = true;
    }
    let (peak, cpu) = match exit.filter(|e| e.status != ExitStatus::Unreaped) {
        Some(exit) => (Some(exit.max_rss_bytes), Some((exit.user, exit.system))),
        None => (worker.peak_rss_now(), worker.cpu_now()),
    };
    report.peak_rss_bytes = peak.or(report.peak_rss_bytes);
    if let Some((user, system)) = cpu {
        report.user = Some(user.saturating_sub(cpu_before.0));
        report.system = Some(system.saturating_sub(cpu_before.1));
    }
}

#[cfg(test)]
mod tests {
    use super::UnitQueue;

    #[test]
    fn the_queue_hands_out_batches_as_units_arrive_and_ends_when_closed() {
        let queue = UnitQueue::new(2);
        for index in [0, 1, 2] {
            queue.push(index);
        }
        assert_eq!(queue.next_batch(), Some(vec![0, 1]));
        assert_eq!(queue.next_batch(), Some(vec![2]));
        std::thread::scope(|scope| {
            // A slot waits for the next unit rather than ending.
            let waiting = scope.spawn(|| (queue.next_batch(), queue.next_batch()));
            std::thread::sleep(std::time::Duration::from_millis(50));
            queue.push(7);
            queue.close();
            assert_eq!(waiting.join().unwrap(), (Some(vec![7]), None));
        });
    }

    #[test]
    fn an_idle_slot_takes_units_reserved_for_a_busy_slots_spare_and_the_spare_loses_them() {
        let queue = UnitQueue::new(1);
        for index in [0, 1, 2] {
            queue.push(index);
        }
        assert_eq!(queue.next_batch(), Some(vec![0]));
        let first = queue.reserve().unwrap();
        let second = queue.reserve().unwrap();
        assert_eq!((first.units.clone(), second.units.clone()), (vec![1], vec![2]));
        assert!(queue.reserve().is_none(), "nothing is left to reserve");
        // The spare's own slot gets to its first reservation...
        assert!(first.claim());
        queue.close();
        // ...while an idle slot takes the second, and its spare's slot finds it gone.
        assert_eq!(queue.next_batch(), Some(vec![2]));
        assert!(!second.claim());
        assert_eq!(queue.next_batch(), None, "every unit was handed out once");
    }

    #[test]
    fn a_released_reservation_goes_first_in_line_again_unless_it_was_taken() {
        let queue = UnitQueue::new(2);
        for index in [0, 1, 2] {
            queue.push(index);
        }
        let reserved = queue.reserve().unwrap();
        assert_eq!(reserved.units, vec![0, 1]);
        queue.release(&reserved);
        assert_eq!(queue.next_batch(), Some(vec![0, 1]));
        let taken = queue.reserve().unwrap();
        assert!(taken.claim());
        queue.release(&taken);
        queue.close();
        assert_eq!(queue.next_batch(), None, "a claimed reservation is not given back");
    }
}
