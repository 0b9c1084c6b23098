//! Keras model files as a source format: before any worker starts, each
//! `.keras` or full-model `.h5` file of a run becomes a SavedModel in the
//! export cache, made by a short-lived, supervised and sandboxed Python
//! process (`keras/export.rs`), and the unit then runs that SavedModel like any
//! other. The supervisor itself never starts TensorFlow: it reads the
//! files' configs with [`files`], finds and asks Python with [`python`],
//! and keeps exports by content hash in [`cache`]. An export's failure is
//! that model's record (`error`, kind `export_failed`, with Keras's own
//! message), never the run's.

pub mod cache;
mod export;
pub mod files;
mod launch;
pub mod python;

pub use launch::{launch, LAUNCH_ARG};

use crate::cancel::CancelToken;
use crate::discover::{Model, ModelFormat};
use crate::engine::Event;
use crate::settings::Settings;
use crate::unit::UnitReport;
use export::{Exporter, Job, JobEnd};
use isorun_protocol::{ErrorKind, ModelError, Outcome};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

/// The most files one export process converts by default (memory that
/// `clear_session` does not give back grows with them).
pub const MAX_FILES_PER_PROCESS: usize = 32;

/// How Keras files are exported.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct KerasSettings {
    /// The Python to export with (`--python`, `ISORUN_PYTHON`); else `python3` on `PATH`.
    pub python: Option<PathBuf>,
    /// Python files imported before each model loads (`--keras-module`): custom layers.
    pub modules: Vec<PathBuf>,
    /// Load with `safe_mode=False` (`--keras-unsafe`): Lambda layers' code runs (in the sandbox).
    pub unsafe_code: bool,
    /// The export cache; `None` for the default ([`cache::default_cache_dir`]).
    pub cache_dir: Option<PathBuf>,
    /// A program that applies the sandbox and execs Python ([`launch`]);
    /// without one, the export process runs unsandboxed.
    pub launcher: Option<PathBuf>,
    /// Files one export process converts in a row (0: the default, the
    /// files shared out over `jobs` processes, at most [`MAX_FILES_PER_PROCESS`] each).
    pub files_per_process: usize,
}

impl KerasSettings {
    pub fn new() -> KerasSettings {
        KerasSettings::default()
    }
    pub fn python(mut self, python: Option<PathBuf>) -> Self {
        self.python = python;
        self
    }
    pub fn modules(mut self, modules: Vec<PathBuf>) -> Self {
        self.modules = modules;
        self
    }
    pub fn unsafe_code(mut self, unsafe_code: bool) -> Self {
        self.unsafe_code = unsafe_code;
        self
    }
    pub fn cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir;
        self
    }
    pub fn launcher(mut self, launcher: Option<PathBuf>) -> Self {
        self.launcher = launcher;
        self
    }
    pub fn files_per_process(mut self, n: usize) -> Self {
        self.files_per_process = n;
        self
    }
}

/// How a Keras file's unit got its SavedModel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportReport {
    pub from: ModelFormat,
    /// Found in the cache: no Python started for it.
    pub cached: bool,
    /// Time to export it (or to find it in the cache).
    pub ms: u64,
    /// What read it: `keras`, or `tf_keras` for a Keras 2 file Keras 3 cannot read.
    pub loader: Option<String>,
}

/// The models a run hands to workers, after the export stage.
pub(crate) struct Staged {
    /// Models to run, Keras files replaced by their SavedModels (ids unchanged).
    pub models: Vec<Model>,
    /// For each of them, its index among the models given.
    pub original: Vec<usize>,
    /// For each model given, how it was exported (Keras files only).
    pub exports: Vec<Option<ExportReport>>,
}

/// Exports what needs exporting; models whose export fails are reported
/// through `on_event` at once, the rest come back ready to run.
pub(crate) fn stage(
    models: &[Model],
    settings: &Settings,
    stop: &CancelToken,
    on_event: &mut dyn FnMut(Event),
) -> Staged {
    let mut staged = Staged { models: Vec::new(), original: Vec::new(), exports: vec![None; models.len()] };
    let keras: Vec<usize> = (0..models.len()).filter(|&i| models[i].format.is_keras_file()).collect();
    let ready = |staged: &mut Staged, index: usize, model: Model| {
        staged.models.push(model);
        staged.original.push(index);
    };
    if keras.is_empty() {
        for (index, model) in models.iter().enumerate() {
            ready(&mut staged, index, model.clone());
        }
        return staged;
    }
    let mut results: Prepared = HashMap::new();
    let failed_all = |message: String| Outcome::Error(ModelError::new(ErrorKind::ExportFailed, message));
    let report_of = |index: usize, cached: bool, ms: u64, loader: Option<String>| ExportReport {
        from: models[index].format,
        cached,
        ms,
        loader,
    };
    match prepare_exports(models, &keras, settings, stop) {
        Err(message) => {
            for &index in &keras {
                results.insert(index, Err((failed_all(message.clone()), Vec::new(), report_of(index, false, 0, None))));
            }
        }
        Ok(done) => results.extend(done),
    }
    for (index, model) in models.iter().enumerate() {
        match results.remove(&index) {
            None => ready(&mut staged, index, model.clone()),
            Some(Ok((path, export))) => {
                staged.exports[index] = Some(export);
                ready(&mut staged, index, Model { id: model.id.clone(), path, format: ModelFormat::SavedModel });
            }
            Some(Err((outcome, stderr, export))) => {
                let mut report = UnitReport::new(index, outcome);
                report.stderr_tail = stderr;
                report.wall = std::time::Duration::from_millis(export.ms);
                report.export = Some(export);
                on_event(Event::Finished(Box::new(report)));
            }
        }
    }
    staged
}

type Prepared = HashMap<usize, Result<(PathBuf, ExportReport), (Outcome, Vec<String>, ExportReport)>>;

/// Looks every Keras file up in the cache and exports the rest. `Err` is
/// a reason every Keras file fails for (no Python with Keras, no cache).
fn prepare_exports(
    models: &[Model],
    keras: &[usize],
    settings: &Settings,
    stop: &CancelToken,
) -> Result<Prepared, String> {
    let cache = settings
        .keras
        .cache_dir
        .clone()
        .or_else(cache::default_cache_dir)
        .ok_or("no cache folder for Keras exports (neither XDG_CACHE_HOME nor HOME is set)")?;
    std::fs::create_dir_all(&cache)
        .map_err(|e| format!("{}: cannot make the Keras export cache: {e}", cache.display()))?;
    cache::remove_stale(&cache);
    let program = python::choose(settings.keras.python.as_deref())?;
    let python = python::probe(&program, Some(&cache))?;
    let mut module_hashes = Vec::new();
    for module in &settings.keras.modules {
        module_hashes.push(cache::hash_file(module).map_err(|e| format!("--keras-module {}: {e}", module.display()))?);
    }
    let toolchain = [python.keras.as_str(), python.tensorflow.as_str(), python.tf_keras.as_deref().unwrap_or("-")];
    let mut done: Prepared = HashMap::new();
    // Which files to export, one per key (the same bytes twice export once).
    let mut to_export: Vec<(String, Vec<usize>)> = Vec::new();
    for &index in keras {
        let began = Instant::now();
        let model = &models[index];
        let report = |cached, loader| ExportReport {
            from: model.format,
            cached,
            ms: began.elapsed().as_millis() as u64,
            loader,
        };
        let hash = match cache::hash_file(&model.path) {
            Ok(hash) => hash,
            Err(e) => {
                let outcome = Outcome::Error(ModelError::new(
                    ErrorKind::ExportFailed,
                    format!("{}: cannot read: {e}", model.path.display()),
                ));
                done.insert(index, Err((outcome, Vec::new(), report(false, None))));
                continue;
            }
        };
        let key = cache::entry_key(&hash, &toolchain, &module_hashes, settings.keras.unsafe_code);
        if let Some(saved_model) = cache::lookup(&cache, &key) {
            let loader = std::fs::read(cache.join(&key).join("export.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v.get("loader").and_then(|l| l.as_str()).map(String::from));
            done.insert(index, Ok((saved_model, report(true, loader))));
            continue;
        }
        match to_export.iter_mut().find(|(k, _)| *k == key) {
            Some((_, indexes)) => indexes.push(index),
            None => to_export.push((key, vec![index])),
        }
    }
    if to_export.is_empty() {
        return Ok(done);
    }
    // Each job exports into a staging folder of its own, renamed into the cache when done.
    let mut staging = Vec::new();
    let mut jobs = Vec::new();
    for (key, indexes) in &to_export {
        let dir = cache::staging_dir(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
        jobs.push(Job { file: models[indexes[0]].path.clone(), out: dir.join("saved_model") });
        staging.push((key.clone(), dir));
    }
    let per_process = match (settings.keras.unsafe_code, settings.keras.files_per_process) {
        // Code from a file runs: it gets a process of its own, so it cannot touch another file's export.
        (true, _) => 1,
        // Python with TensorFlow takes seconds to start: one process per slot, up to 32 files each.
        (false, 0) => jobs.len().div_ceil(settings.jobs.max(1)).clamp(1, MAX_FILES_PER_PROCESS),
        (false, n) => n,
    };
    let exporter = Exporter { python: &python, settings, stop, scratch_root: cache.clone() };
    let began = Instant::now();
    // Up to `jobs` export processes at a time, each on a thread that lives as long as it does.
    let slots = settings.jobs.max(1).min(jobs.len().div_ceil(per_process));
    let mut ends: Vec<Option<(JobEnd, u64)>> = vec![None; jobs.len()];
    let chunk = jobs.len().div_ceil(slots);
    std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .chunks(chunk)
            .map(|part| {
                let exporter = &exporter;
                scope.spawn(move || {
                    let started = Instant::now();
                    let ends = exporter.export_all(part, per_process);
                    let ms = started.elapsed().as_millis() as u64 / part.len().max(1) as u64;
                    ends.into_iter().map(|e| (e, ms)).collect::<Vec<_>>()
                })
            })
            .collect();
        let mut at = 0;
        for handle in handles {
            for end in handle.join().expect("export thread") {
                ends[at] = Some(end);
                at += 1;
            }
        }
    });
    tracing::info!(files = jobs.len(), ms = began.elapsed().as_millis() as u64, "Keras files exported");
    for (((key, indexes), (_, dir)), end) in to_export.iter().zip(&staging).zip(ends) {
        let (end, ms) = end.expect("every export ends");
        for &index in indexes {
            let model = &models[index];
            let report = |loader| ExportReport { from: model.format, cached: false, ms, loader };
            let result = match &end {
                JobEnd::Exported { loader } => {
                    let about = serde_json::json!({
                        "source": model.path, "from": model.format.name(), "loader": loader,
                        "keras": python.keras, "tensorflow": python.tensorflow, "ms": ms,
                    });
                    match cache::lookup(&cache, key).map(Ok).unwrap_or_else(|| cache::commit(&cache, key, dir, &about))
                    {
                        Ok(saved_model) => Ok((saved_model, report(Some(loader.clone())))),
                        Err(e) => {
                            let message = format!(
                                "{}: cannot store the export in {}: {e}",
                                model.path.display(),
                                cache.display()
                            );
                            Err((
                                Outcome::Error(ModelError::new(ErrorKind::ExportFailed, message)),
                                Vec::new(),
                                report(None),
                            ))
                        }
                    }
                }
                JobEnd::Failed { outcome, stderr } => Err((outcome.clone(), stderr.clone(), report(None))),
            };
            done.insert(index, result);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(done)
}
