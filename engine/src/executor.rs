//! Runs units of work in workers: `jobs` slot threads each take the next
//! batch of `models_per_worker` models, start a fresh worker for it, feed it
//! the models one by one, and watch it against deadlines, crashes, protocol
//! breaches and the user's interrupts. Every unit ends with exactly one
//! report; a worker's misbehaviour costs only the unit it was running.
//!
//! This file is the slots' loop: which worker (a warm spare, a fork of the
//! slot's zygote, an exec'd one), retries and crash bisection, and where
//! each report goes. The roles around it have files of their own, as
//! nextest's runner splits its dispatcher from its executor: the units
//! waiting ([`crate::queue`]), forking spares ([`crate::spare`]), one
//! unit's requests in a live worker ([`crate::attempt`]), and the reaper
//! that ends a passed unit's worker off the slot's path ([`crate::reaper`]).

use crate::attempt::{finish_metrics, UnitRunner, Work};
use crate::cancel::CancelToken;
use crate::discover::Model;
use crate::event::Event;
use crate::frozen_check::FrozenChecks;
use crate::gpu::{self, slot_device, slots_on_device, GpuWatch};
use crate::process::{SpawnSpec, WorkerProcess, Zygote};
use crate::queue::UnitQueue;
use crate::reaper::{start_reaper, Reap};
use crate::session::{shutdown, terminate, wait_hello};
use crate::settings::{Settings, SpawnMode};
use crate::spare::{self, Forking, Spare};
use crate::unit::{Attempt, UnitReport};
use isorun_protocol::Outcome;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

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
    let queue = UnitQueue::new(settings.models_per_worker).with_decided(decided);
    if producer.is_none() {
        for index in 0..models.len() {
            queue.push(index);
        }
        queue.close();
    }
    let worker_ids = AtomicU64::new(0);
    let extra_read_paths: Vec<std::sync::OnceLock<Vec<String>>> = models.iter().map(|_| Default::default()).collect();
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
                runner: UnitRunner { models, work, settings, stop, checks, extra_read_paths: &extra_read_paths },
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

/// One of the run's `jobs` slots: what its thread runs units with, and how
/// it starts their workers.
struct Slot<'a> {
    /// What each unit's attempt runs with (the models, their work, the
    /// settings, the interrupts, the frozen checks).
    runner: UnitRunner<'a>,
    /// The same as `runner`'s, for the slot's own decisions.
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
}

/// What a slot thread keeps between batches: its zygote (started on first
/// use), its spares (in the order of their reservations), its reaper.
struct SlotState {
    zygote: Option<Arc<Zygote>>,
    spares: VecDeque<Spare>,
    reaper: mpsc::Sender<Reap>,
}

impl Slot<'_> {
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
        if self.forks() && zygote.is_none() && !self.zygote_broken.load(Ordering::SeqCst) {
            self.start_zygote(zygote);
        }
    }

    /// Whether this slot forks its workers from a zygote (where zygotes
    /// work): asked to, or by default unless each slot starts at most one
    /// worker (see `SpawnMode::Auto`).
    fn forks(&self) -> bool {
        match self.settings.spawn_mode {
            SpawnMode::Exec => false,
            SpawnMode::Zygote => true,
            SpawnMode::Auto => !self.few_units,
        }
    }

    /// Starts the slot's zygote in `zygote`; on failure `zygote` is `None`,
    /// and why is logged and returned.
    fn start_zygote(&self, zygote: &mut Option<Arc<Zygote>>) -> Option<String> {
        match Zygote::start(&self.spawn) {
            Ok(z) => {
                *zygote = Some(Arc::new(z));
                None
            }
            Err(e) => {
                let reason = format!("cannot start the zygote: {e}");
                tracing::info!("{reason}");
                *zygote = None;
                Some(reason)
            }
        }
    }

    fn spawn_worker_process(&self, zygote: &mut Option<Arc<Zygote>>) -> std::io::Result<WorkerProcess> {
        if !self.forks() {
            return WorkerProcess::spawn(&self.spawn);
        }
        if self.settings.spawn_mode == SpawnMode::Auto && zygote.is_none() && !self.zygote_broken.load(Ordering::SeqCst)
        {
            // The zygote loads libtensorflow while this first worker, exec'd, runs.
            self.start_zygote(zygote);
            return WorkerProcess::spawn(&self.spawn);
        }
        if !self.zygote_broken.load(Ordering::SeqCst) {
            let mut reason = String::new();
            for _ in 0..2 {
                if !zygote.as_ref().is_some_and(|z| z.alive()) {
                    if let Some(why) = self.start_zygote(zygote) {
                        reason = why;
                    }
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
                    match wait_hello(&mut worker, self.stop, self.runner.start_deadline(started)) {
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
                self.spares().refill(spares, queue, zygote);
                None
            } else {
                self.spares().fork_early(spares, queue, zygote)
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
                    None => spare_report.as_ref().and_then(|s| s.preloaded.clone()),
                    Some(_) => None,
                };
                let end = self.runner.run_unit(&mut worker, index, &worker_batch, unit_started, preloaded);
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
                self.spares().collect_early(early, spares, queue);
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

    /// How this slot forks its spares.
    fn spares(&self) -> Forking<'_> {
        Forking {
            runner: &self.runner,
            spawn: &self.spawn,
            warm_dir: self.warm_dir,
            preload: self.preload,
            worker_ids: self.worker_ids,
        }
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
}
