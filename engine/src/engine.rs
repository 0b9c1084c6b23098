//! The engine's front door: [`Engine::new`] checks the settings once,
//! [`Engine::run`] runs every model and reports each unit through a
//! callback as it starts and ends. The caller owns the terminal, the
//! signals and the files; the engine prints nothing.

use crate::attempt::Work;
use crate::cancel::CancelToken;
use crate::discover::{Model, ModelFormat};
use crate::dispatcher::Dispatcher;
use crate::event::Event;
use crate::executor::{run_all, Producer};
use crate::feed::Feed;
use crate::frozen_check::FrozenChecks;
use crate::inputs::PreparedInputs;
use crate::queue::UnitQueue;
use crate::settings::{Settings, STATUSES};
use crate::sink::OutputSink;
use crate::unit::UnitReport;

/// Why an [`Engine`] cannot be made from the settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    #[error("worker binary {}: not a file", path.display())]
    NoWorker { path: std::path::PathBuf },
    #[error("{what} 0: expected at least 1")]
    Zero { what: &'static str },
    #[error("GPU memory fraction {0}: expected a share above 0 and at most 1")]
    GpuMemoryFraction(f64),
    #[error("custom-op library {0}: no such file")]
    NoLibrary(String),
    #[error("retry status {0}: unknown status (one of {list})", list = STATUSES.join(", "))]
    UnknownStatus(String),
}

/// What a run as a whole gives back; each unit's report went through
/// [`Event::Finished`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RunSummary {
    /// The TensorFlow version the workers reported, if any worker started.
    pub tensorflow_version: Option<String>,
}

/// Runs units in fresh, isolated workers under one set of [`Settings`].
#[derive(Debug, Clone)]
pub struct Engine {
    settings: Settings,
}

impl Engine {
    /// Checks the settings: a worker binary that exists, at least one slot
    /// and one model per worker, a GPU memory share in (0, 1], custom-op
    /// libraries that exist, known retry statuses.
    pub fn new(settings: Settings) -> Result<Engine, SetupError> {
        if !settings.spawn.worker.is_file() {
            return Err(SetupError::NoWorker { path: settings.spawn.worker.clone() });
        }
        if settings.jobs == 0 {
            return Err(SetupError::Zero { what: "jobs" });
        }
        if settings.models_per_worker == 0 {
            return Err(SetupError::Zero { what: "models per worker" });
        }
        if let Some(f) = settings.session.gpu_memory_fraction.filter(|f| !(f.is_finite() && *f > 0.0 && *f <= 1.0)) {
            return Err(SetupError::GpuMemoryFraction(f));
        }
        if let Some(missing) = settings.libraries.iter().find(|l| !std::path::Path::new(l).is_file()) {
            return Err(SetupError::NoLibrary(missing.clone()));
        }
        if let Some(unknown) = settings.retry_on.iter().find(|s| !STATUSES.contains(&s.as_str())) {
            return Err(SetupError::UnknownStatus(unknown.clone()));
        }
        Ok(Engine { settings })
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Runs every model with the inputs, `jobs` at a time, each in a worker
    /// that has never seen another model (or `models_per_worker` of them),
    /// and returns when every unit has ended. `on_event` is called on the
    /// caller's thread; `sink` gets each `ok` unit's outputs on a slot's
    /// thread and may change its outcome. `cancel` stops the run: units not
    /// started end `not_run`, running workers are terminated.
    pub fn run(
        &self,
        models: &[Model],
        inputs: &PreparedInputs,
        cancel: &CancelToken,
        on_event: &mut dyn FnMut(Event),
        sink: &dyn OutputSink,
    ) -> RunSummary {
        self.staged(models, None, cancel, on_event, |models, on_event, producer, checks| {
            // Inputs that do not fit a signature this process can read end
            // their unit here, before any worker starts (a Keras file's too
            // when its SavedModel is in the cache already); the others run.
            // An ONNX file that cannot run at all says so before its inputs are checked.
            let mut decided = vec![false; models.len()];
            crate::onnx::decide(models, &mut decided, &mut |report| on_event(Event::Finished(Box::new(report))));
            for report in crate::inputs::decide_early(models, inputs, &self.settings).into_iter().flatten() {
                if decided[report.index] {
                    continue;
                }
                decided[report.index] = true;
                on_event(Event::Finished(Box::new(report)));
            }
            let work = Work::Inputs { inputs, sink, decided: &decided };
            run_all(models, work, &self.settings, cancel, on_event, producer, checks)
        })
    }

    /// Runs every model as [`Engine::run`] does, each unit fed batch after
    /// batch by the stream `feed` opens for it (in one worker that keeps
    /// the model loaded); the stream scores each batch's outputs and its
    /// summary goes in the unit's [`UnitReport::stream`]. Limits, retries
    /// (from the first batch), crash handling and cancellation are those of
    /// [`Engine::run`]; `batch_timeout` bounds each batch. A SavedModel
    /// whose [`Feed::check`] (a Keras file whose [`Feed::check_keras_file`],
    /// before its export) gives an outcome ends with it before any worker
    /// starts.
    pub fn run_feed(
        &self,
        models: &[Model],
        feed: &dyn Feed,
        cancel: &CancelToken,
        on_event: &mut dyn FnMut(Event),
    ) -> RunSummary {
        // A Keras file's stream is checked against the file itself (its input layers), before it is exported.
        let decide = |model: &Model| feed.check_keras_file(model);
        self.staged(models, Some(&decide), cancel, on_event, |models, on_event, producer, checks| {
            // A stream that cannot fit its model ends the unit here, before any worker starts.
            let mut decided = vec![false; models.len()];
            crate::onnx::decide(models, &mut decided, &mut |report| on_event(Event::Finished(Box::new(report))));
            for (index, model) in models.iter().enumerate() {
                let checked = matches!(model.format, ModelFormat::SavedModel | ModelFormat::Onnx);
                if !checked || decided[index] {
                    continue;
                }
                let began = std::time::Instant::now();
                if let Some(outcome) = feed.check(model) {
                    let mut report = UnitReport::new(index, outcome);
                    report.wall = began.elapsed();
                    decided[index] = true;
                    on_event(Event::Finished(Box::new(report)));
                }
            }
            run_all(models, Work::Feed { feed, decided: &decided }, &self.settings, cancel, on_event, producer, checks)
        })
    }

    /// Runs `models` with `run`, Keras files exported on the way: a Keras
    /// file's unit joins the queue as soon as its SavedModel is in the
    /// cache (or at once, when it is there already), so exports and runs
    /// overlap; one whose export fails is reported as such. Records carry
    /// how each Keras file's SavedModel was made.
    fn staged(
        &self,
        models: &[Model],
        decide: Option<crate::keras::Decide<'_>>,
        cancel: &CancelToken,
        on_event: &mut dyn FnMut(Event),
        run: impl FnOnce(&[Model], &mut dyn FnMut(Event), Option<Producer<'_>>, &dyn FrozenChecks) -> Option<String>,
    ) -> RunSummary {
        let staged = crate::keras::plan(models, &self.settings, true, decide);
        let settings = &self.settings;
        let produce = |queue: &UnitQueue, events: &std::sync::mpsc::Sender<Event>| {
            staged.produce(settings, cancel, queue, events);
        };
        let producer: Option<Producer<'_>> = staged.has_keras_files().then_some(&produce);
        // Every unit's end, wherever it ends, reaches `on_event` through this one loop.
        let mut dispatcher = Dispatcher::new(staged.models.len(), &staged.exports, on_event);
        let tensorflow_version = run(&staged.models, &mut |event| dispatcher.send(event), producer, &staged);
        dispatcher.finish();
        RunSummary { tensorflow_version }
    }
}
