//! One unit's attempt in a live worker: its requests (one set of inputs,
//! in `--batch-size` chunks, or a stream's batches), its deadlines, the
//! check of a frozen Keras export before its own inputs, and what each
//! request carries (the session settings, the sandbox of the worker's
//! batch). Apart from the executor so that the slot's loop (which worker,
//! how often, in what order) reads without the per-request detail, and so
//! that spares build their warm-up from the same session and sandbox.

use crate::cancel::CancelToken;
use crate::discover::{is_frozen_graph, Model};
use crate::feed::{latency_percentiles, Feed, StreamReport};
use crate::frozen_check::FrozenChecks;
use crate::inputs::{place_shared, PreparedInputs};
use crate::process::{Exit, ExitStatus, WorkerProcess};
use crate::session::{run_request, Deadlines, RequestEnd};
use crate::settings::Settings;
use crate::sink::OutputSink;
use crate::unit::{OutputInfo, Phases, UnitReport};
use isorun_protocol::{
    ErrorKind, ModelError, Outcome, Preloaded, RunRequest, SandboxSpec, SessionConfig, Tensor, ToWorker,
};
use isorun_tensors::batch;
use isorun_tensors::values::tensor_values;
use isorun_transport::{RequestEnvelope, SharedMemory};
use std::time::{Duration, Instant};

/// What the units of a run are given: one set of inputs for every model,
/// whose outputs go to a sink, or a stream of batches per unit.
#[derive(Clone, Copy)]
pub(crate) enum Work<'a> {
    /// `decided`: units already reported (see `inputs::decide_early`), never run.
    Inputs { inputs: &'a PreparedInputs, sink: &'a dyn OutputSink, decided: &'a [bool] },
    /// `decided`: units the feed's [`Feed::check`] already ended, never run.
    Feed { feed: &'a dyn Feed, decided: &'a [bool] },
}

/// What every unit of a run is run with: the models, what they are given,
/// the settings, the user's interrupts, and the frozen Keras exports whose
/// check a unit's worker runs first.
#[derive(Clone, Copy)]
pub(crate) struct UnitRunner<'a> {
    pub models: &'a [Model],
    pub work: Work<'a>,
    pub settings: &'a Settings,
    pub stop: &'a CancelToken,
    pub checks: &'a dyn FrozenChecks,
    /// What a sandboxed worker must read beyond each model itself (an ONNX
    /// file's external data and ONNX Runtime's folder), worked out once per
    /// model for the run: every request of a unit carries its sandbox.
    pub extra_read_paths: &'a [std::sync::OnceLock<Vec<String>>],
}

/// How a unit in a live worker ended: the report, and whether the worker
/// can take another; `again`: its model was exported anew after a failed
/// check, and the unit runs again in a fresh worker (the report goes).
pub(crate) struct UnitEnd {
    pub report: UnitReport,
    pub worker_usable: bool,
    pub again: bool,
}

impl UnitEnd {
    fn new(report: UnitReport, worker_usable: bool) -> UnitEnd {
        UnitEnd { report, worker_usable, again: false }
    }
}

/// When a unit began, and what its worker did for it ahead of that.
#[derive(Debug, Clone)]
struct Begun {
    at: Instant,
    /// The worker holds the unit's model: a spare loaded it while warming up.
    preloaded: Option<Preloaded>,
}

/// What the check of a unit's frozen export came to ([`UnitRunner::check_export`]).
enum Checked {
    /// Nothing to check.
    Nothing,
    /// It passed: the worker holds the model.
    Passed,
    /// The unit ends here (its report says how), or runs `again`.
    End { again: bool },
}

impl UnitRunner<'_> {
    /// When a worker must have said hello: the start limit, or the unit's
    /// own limits if they are shorter.
    pub fn start_deadline(&self, started: Instant) -> Instant {
        let mut deadline = started + self.settings.start_timeout;
        for limit in [self.settings.load_timeout, self.settings.timeout].into_iter().flatten() {
            deadline = deadline.min(started + limit);
        }
        deadline
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
                let (end, _) = self.send(worker, self.request(index, batch, inputs), shared, deadlines, loaded, report);
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
    pub fn run_unit(
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
    pub fn session_for(&self, index: usize) -> SessionConfig {
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
            runtime: crate::onnx::runtime_for(&self.models[index]),
        }
    }

    /// The sandbox of a worker for `batch`: the settings' spec with the batch's model folders.
    pub fn sandbox_for(&self, batch: &[usize]) -> Option<SandboxSpec> {
        self.settings.sandbox.as_ref().map(|spec| {
            let mut spec = spec.clone();
            for &i in batch {
                spec.read_paths.push(self.models[i].path.to_string_lossy().into_owned());
                let extra = self.extra_read_paths[i].get_or_init(|| crate::onnx::read_paths(&self.models[i]));
                spec.read_paths.extend(extra.iter().cloned());
            }
            spec
        })
    }

    /// Sends one of the unit's requests with its `shared` buffers and
    /// follows it to its end, with when it was sent (after the envelope was
    /// built); the report takes the worker's word on the load (the first
    /// that gives one) and its sandbox. `loaded`: the worker holds the model.
    fn send(
        &self,
        worker: &mut WorkerProcess,
        request: RunRequest,
        shared: Vec<SharedMemory>,
        deadlines: Deadlines,
        loaded: bool,
        report: &mut UnitReport,
    ) -> (RequestEnd, Instant) {
        let unit = request.unit;
        let envelope = RequestEnvelope::new(&ToWorker::Run(request), shared);
        let sent = Instant::now();
        let mut end = run_request(worker, envelope, unit, self.stop, deadlines, loaded);
        report.load_ms = report.load_ms.or(end.load_ms);
        report.onnx = report.onnx.take().or(end.onnx.take());
        report.sandbox = worker.sandbox().cloned();
        (end, sent)
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
        report.load_ms = report.load_ms.or(begun.preloaded.as_ref().map(|p| p.load_ms));
        report.onnx = report.onnx.take().or_else(|| begun.preloaded.as_ref().and_then(|p| p.onnx.clone()));
        Ok(loaded)
    }

    /// The unit's deadlines, counted from its start, or from its model's
    /// load where a spare loaded it ahead (the limits are the same as a
    /// fresh worker's: the load is part of the unit).
    fn deadlines(&self, begun: &Begun) -> Deadlines {
        let load = Duration::from_millis(begun.preloaded.as_ref().map_or(0, |p| p.load_ms));
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
        let deadlines = self.deadlines(&begun);
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
            let (end, sent) = self.send(worker, request, shared, deadlines, loaded, &mut report);
            // After this unit's first request ended well, the worker holds its
            // model (whether or not it said `Loaded`: a shared worker may have
            // held the same SavedModel already).
            loaded |= end.worker_usable && end.outcome.is_ok();
            phases.requests += sent.elapsed();
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
        let deadlines = self.deadlines(&begun);
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
            let (end, sent) =
                self.send(worker, self.request(index, batch, inputs), shared, deadlines, loaded, &mut report);
            loaded |= end.worker_usable && end.outcome.is_ok();
            phases.requests += sent.elapsed();
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

/// The worker's sandbox steps, as it timed them.
fn sandbox_steps(worker: &WorkerProcess) -> Vec<(String, Duration)> {
    worker.sandbox_steps().iter().map(|(name, us)| (name.clone(), Duration::from_micros(*us))).collect()
}

/// Wall time, CPU time and peak memory of a unit. With an `exit`, the
/// worker's totals from `wait4` complete them; otherwise `/proc` says.
pub(crate) fn finish_metrics(
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
