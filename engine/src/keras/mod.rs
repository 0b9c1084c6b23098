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
mod names;
pub mod python;
pub(crate) mod report;
pub(crate) mod settings;

#[doc(hidden)]
pub use export::answer_lines as fuzz_export_answer;
pub use export::GraphSource;
pub use launch::{launch, LAUNCH_ARG};
pub use report::{ExportCheck, ExportReport};
pub use settings::{KerasSettings, MAX_FILES_PER_PROCESS};

use crate::cancel::CancelToken;
use crate::discover::{Model, ModelFormat};
use crate::event::Event;
use crate::frozen_check::{FrozenChecks, Probe};
use crate::queue::UnitQueue;
use crate::settings::Settings;
use crate::unit::UnitReport;
use export::{Exporter, Job, JobEnd, SHARED_PER_TRACE};
use isorun_protocol::{ErrorKind, ModelError, Outcome};
use std::path::PathBuf;
use std::sync::{mpsc, Mutex};
use std::time::Instant;

/// A run's models after planning the export stage: the same models, in
/// the same order, a Keras file's path replaced by its SavedModel in the
/// cache (where it is, or will be once exported).
pub(crate) struct Staged {
    pub models: Vec<Model>,
    /// How each Keras file's unit got its SavedModel (filled as exports end).
    pub exports: Mutex<Vec<Option<ExportReport>>>,
    fates: Vec<Fate>,
    work: Option<ExportWork>,
    /// Each model's own file and format (before its path was replaced).
    sources: Vec<(PathBuf, ModelFormat)>,
    /// Frozen graphs' checks go to the units' workers (`run`, `eval`); else
    /// (`pipe`) the export process checks, and a cached entry still
    /// waiting for its check is exported again.
    check_in_worker: bool,
    /// The units whose file was exported again after a failed check (a
    /// second failure ends the unit).
    exported_again: Mutex<Vec<bool>>,
}

/// What a unit waits for before it can run.
enum Fate {
    Ready,
    Failed(Box<(Outcome, Vec<String>)>),
    /// Exported as part of `ExportWork::keys[k]`.
    Export,
}

/// What made an entry's key beside the file and the versions, for its
/// `export.json` (`isorun cache ls` shows them): the `--keras-module`
/// files with their SHA-256, and `--keras-unsafe`.
fn key_parts(keras: &KerasSettings, module_hashes: &[String]) -> serde_json::Map<String, serde_json::Value> {
    let modules: Vec<serde_json::Value> = keras
        .modules
        .iter()
        .zip(module_hashes)
        .map(|(path, sha256)| serde_json::json!({"path": path, "sha256": sha256}))
        .collect();
    let mut parts = serde_json::Map::new();
    parts.insert("keras_modules".into(), serde_json::Value::Array(modules));
    parts.insert("keras_unsafe".into(), serde_json::Value::Bool(keras.unsafe_code));
    parts
}

/// One export a run needs: a cache entry's key, the models it serves (the
/// same bytes twice export once), and the key of the file's architecture
/// (its graph), where files of one architecture may share a trace.
struct KeyWork {
    key: String,
    indexes: Vec<usize>,
    graph: Option<String>,
    /// What exporting the file in full is guessed to cost ([`export_cost`]).
    cost: u64,
}

/// The exports a run needs: one per distinct key.
struct ExportWork {
    cache: PathBuf,
    python: python::Python,
    keys: Vec<KeyWork>,
    /// The `--keras-module` files' SHA-256, in the key and in `export.json`.
    module_hashes: Vec<String>,
}

impl Staged {
    /// True when some unit waits for an export or a report (a producer is needed).
    pub(crate) fn has_keras_files(&self) -> bool {
        self.fates.iter().any(|f| !matches!(f, Fate::Ready))
    }

    /// The producer of a run: ready units go to the queue at once, failed
    /// ones are reported, and each exported file's units join the queue as
    /// soon as its SavedModel is in the cache, while later files export.
    pub(crate) fn produce(
        &self,
        settings: &Settings,
        stop: &CancelToken,
        queue: &UnitQueue,
        events: &mpsc::Sender<Event>,
    ) {
        let report_failure = |index: usize, outcome: Outcome, stderr: Vec<String>| {
            let mut report = UnitReport::new(index, outcome);
            report.stderr_tail = stderr;
            report.export = self.exports.lock().expect("exports")[index].take();
            if let Some(export) = &report.export {
                report.wall = std::time::Duration::from_millis(export.ms);
            }
            let _ = events.send(Event::Finished(Box::new(report)));
        };
        for (index, fate) in self.fates.iter().enumerate() {
            match fate {
                Fate::Ready => queue.push(index),
                Fate::Failed(failure) => report_failure(index, failure.0.clone(), failure.1.clone()),
                Fate::Export => {}
            }
        }
        let Some(work) = &self.work else { return };
        let mut jobs = Vec::new();
        let mut staging = Vec::new();
        for (id, KeyWork { indexes, graph, .. }) in work.keys.iter().enumerate() {
            let dir = match cache::staging_dir(&work.cache) {
                Ok(dir) => dir,
                Err(e) => {
                    let message = format!("{}: cannot make a folder for the export: {e}", work.cache.display());
                    for &index in indexes {
                        report_failure(index, export_error(message.clone()), Vec::new());
                    }
                    continue;
                }
            };
            jobs.push(Job {
                id,
                file: self.models_source(indexes[0]),
                out: dir.join("saved_model"),
                graph: graph.clone(),
                freeze: true,
                check_in_worker: self.check_in_worker,
            });
            staging.push(dir);
        }
        let mut groups = by_graph(&jobs);
        let cost = |job: usize| work.keys[jobs[job].id].cost;
        costliest_first(&mut groups, &cost);
        let on_end = |job: &Job, end: JobEnd| {
            let result = self.store(work, settings, job, end);
            for &index in &work.keys[job.id].indexes {
                let format = self.source_format(index);
                match &result {
                    Ok(stored) => {
                        self.exports.lock().expect("exports")[index] = Some(stored.report(format));
                        queue.push(index);
                    }
                    Err(failure) => {
                        let (outcome, stderr, ms) = &**failure;
                        self.exports.lock().expect("exports")[index] = Some(ExportReport {
                            from: format,
                            cached: false,
                            ms: *ms,
                            loader: None,
                            graph: None,
                            check: None,
                            phases_ms: Vec::new(),
                            before_ms: Vec::new(),
                        });
                        report_failure(index, outcome.clone(), stderr.clone());
                    }
                }
            }
        };
        let exporter =
            Exporter { python: &work.python, settings, stop, scratch_root: work.cache.clone(), on_end: &on_end };
        let began = Instant::now();
        // Up to `jobs` export threads, each starting its processes one after
        // another; the files of one architecture go to one of them, in a
        // row, so they share its trace.
        let plan = plan_exports(&jobs, &groups, settings, &cost);
        std::thread::scope(|scope| {
            for (part, per_process) in &plan {
                let exporter = &exporter;
                scope.spawn(move || exporter.export_all(part, *per_process));
            }
        });
        for dir in staging {
            let _ = std::fs::remove_dir_all(dir);
        }
        tracing::info!(files = jobs.len(), ms = began.elapsed().as_millis() as u64, "Keras files exported");
    }

    /// Stores an ended job's export in the cache (unless an entry is
    /// there already: another run's, which wins) and removes its staging
    /// folder; `Err` is the failure of every unit of its key, with the
    /// export's stderr and time.
    fn store(&self, work: &ExportWork, settings: &Settings, job: &Job, end: JobEnd) -> Result<Stored, StoreFailure> {
        let KeyWork { key, indexes, graph: architecture, .. } = &work.keys[job.id];
        let staging = job.out.parent().expect("a staging folder").to_path_buf();
        let result = match end {
            JobEnd::Exported { loader, ms, graph, check_in_worker, phases, before } => {
                let check = (graph == GraphSource::Frozen).then_some(if check_in_worker {
                    ExportCheck::Pending
                } else {
                    ExportCheck::Export
                });
                let mut about = serde_json::json!({
                    "source": job.file, "from": self.source_format(indexes[0]).name(), "loader": loader,
                    "keras": work.python.keras, "tensorflow": work.python.tensorflow,
                    "tf_keras": work.python.tf_keras, "ms": ms, "graph": graph.name(),
                    "architecture": architecture,
                });
                if let Some(about) = about.as_object_mut() {
                    about.extend(key_parts(&settings.keras, &work.module_hashes));
                    if let Some(check) = &check {
                        about.insert("check".into(), check.name().into());
                    }
                }
                // A job whose check is not a worker's (`pipe`, an export made
                // again) does not take another run's entry still waiting for one.
                if !job.check_in_worker && cache::check_pending(&work.cache.join(key)) {
                    cache::remove_pending(&work.cache, key);
                }
                match cache::lookup(&work.cache, key)
                    .map(Ok)
                    .unwrap_or_else(|| cache::commit(&work.cache, key, &staging, &about))
                {
                    Ok(_) => {
                        Ok(Stored { loader, ms, graph, check, phases_ms: with_other(phases, ms), before_ms: before })
                    }
                    Err(e) => Err(Box::new((
                        export_error(format!(
                            "{}: cannot store the export in {}: {e}",
                            job.file.display(),
                            work.cache.display()
                        )),
                        Vec::new(),
                        ms,
                    ))),
                }
            }
            JobEnd::Failed { outcome, stderr } => Err(Box::new((outcome, stderr, 0))),
        };
        let _ = std::fs::remove_dir_all(&staging);
        result
    }

    /// Unit `index`'s export report brought up to date with its entry's
    /// `export.json` (another run checked it, or exported it again, since
    /// this one planned).
    fn refresh(&self, index: usize, about: &serde_json::Value) {
        if let Some(report) = self.exports.lock().expect("exports")[index].as_mut() {
            report.graph = about.get("graph").and_then(serde_json::Value::as_str).and_then(GraphSource::from_name);
            // This run's own failed check stays said.
            if !matches!(report.check, Some(ExportCheck::Failed { .. })) {
                report.check = ExportCheck::of_entry(about);
            }
        }
    }

    fn models_source(&self, index: usize) -> PathBuf {
        self.sources[index].0.clone()
    }

    fn source_format(&self, index: usize) -> ModelFormat {
        self.sources[index].1
    }
}

impl FrozenChecks for Staged {
    fn probe(&self, index: usize) -> Option<Result<Probe, String>> {
        if !self.source_format(index).is_keras_file() {
            return None;
        }
        let entry = self.models[index].path.parent()?;
        let Some(about) = cache::about(entry) else {
            // Removed by another run since this one planned: exported again below.
            return Some(Err(format!("{}: the cache entry is gone", entry.display())));
        };
        if !cache::is_pending(&about) {
            self.refresh(index, &about);
            return None;
        }
        match cache::read_check(entry).and_then(Probe::from_arrays) {
            Ok(probe) => Some(Ok(probe)),
            Err(why) => match cache::about(entry) {
                // Checked meanwhile by another run's worker (which removes the file).
                Some(about) if !cache::is_pending(&about) => {
                    self.refresh(index, &about);
                    None
                }
                _ => Some(Err(why)),
            },
        }
    }

    fn passed(&self, index: usize, ms: u64) {
        if let Some(entry) = self.models[index].path.parent() {
            if let Err(e) = cache::mark_checked(entry) {
                tracing::warn!(entry = %entry.display(), "cannot record the frozen graph's check: {e}");
            }
        }
        if let Some(report) = self.exports.lock().expect("exports")[index].as_mut() {
            report.check = Some(ExportCheck::Worker { ms: Some(ms) });
        }
    }

    fn export_again(&self, index: usize, why: &str, settings: &Settings, stop: &CancelToken) -> Result<(), Outcome> {
        let file = self.models_source(index);
        if std::mem::replace(&mut self.exported_again.lock().expect("exported again")[index], true) {
            return Err(export_error(format!(
                "{}: exported again after its frozen graph failed its check, the export failed it too: {why}",
                file.display()
            )));
        }
        let began = Instant::now();
        tracing::warn!(file = %file.display(), %why, "the frozen graph failed its check; exporting again");
        let entry = self.models[index].path.parent().map(PathBuf::from).unwrap_or_default();
        let key = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let (cache, python, module_hashes) = match &self.work {
            Some(work) => (work.cache.clone(), work.python.clone(), work.module_hashes.clone()),
            None => toolchain(settings).map_err(export_error)?,
        };
        if !cache::remove_pending(&cache, &key) && cache::lookup(&cache, &key).is_some() {
            // Checked or exported again by another run meanwhile: the unit runs on that.
            if let Some(about) = cache::about(&entry) {
                self.refresh(index, &about);
            }
            return Ok(());
        }
        let dir = cache::staging_dir(&cache)
            .map_err(|e| export_error(format!("{}: cannot make a folder for the export: {e}", cache.display())))?;
        let work = ExportWork {
            cache,
            python,
            keys: vec![KeyWork { key, indexes: vec![index], graph: None, cost: 0 }],
            module_hashes,
        };
        let job = Job { id: 0, file, out: dir.join("saved_model"), graph: None, freeze: false, check_in_worker: false };
        let result = Mutex::new(None);
        let on_end = |job: &Job, end: JobEnd| {
            *result.lock().expect("result") = Some(self.store(&work, settings, job, end));
        };
        Exporter { python: &work.python, settings, stop, scratch_root: work.cache.clone(), on_end: &on_end }
            .export_all(std::slice::from_ref(&job), 1);
        let _ = std::fs::remove_dir_all(&dir);
        let stored = result.into_inner().expect("result").unwrap_or_else(|| {
            Err(Box::new((
                export_error(format!("{}: the export ended without an answer", job.file.display())),
                Vec::new(),
                0,
            )))
        });
        let mut exports = self.exports.lock().expect("exports");
        let before = exports[index].as_ref().map_or(0, |r| r.ms);
        match stored {
            Ok(stored) => {
                let mut report = stored.report(self.source_format(index));
                report.ms = before + began.elapsed().as_millis() as u64;
                report.check = Some(ExportCheck::Failed { why: why.to_string() });
                exports[index] = Some(report);
                Ok(())
            }
            Err(failure) => {
                let (outcome, _, _) = *failure;
                if let Some(report) = exports[index].as_mut() {
                    report.check = Some(ExportCheck::Failed { why: why.to_string() });
                }
                Err(outcome)
            }
        }
    }
}

/// A job's export, stored in the cache.
struct Stored {
    loader: String,
    ms: u64,
    graph: GraphSource,
    check: Option<ExportCheck>,
    phases_ms: Vec<(String, u64)>,
    before_ms: Vec<(String, u64)>,
}

/// The export process's `phases` of a job that took `ms` as the supervisor
/// timed it, and `other`, the rest (never below 0: the process's clock and
/// the supervisor's start at different instants), so that they add up to
/// `ms` unless the process's own sum is more. None when it named none.
fn with_other(mut phases: Vec<(String, u64)>, ms: u64) -> Vec<(String, u64)> {
    if !phases.is_empty() {
        let said: u64 = phases.iter().map(|(_, ms)| ms).fold(0, |a, b| a.saturating_add(*b));
        phases.push(("other".into(), ms.saturating_sub(said)));
    }
    phases
}

impl Stored {
    fn report(&self, from: ModelFormat) -> ExportReport {
        ExportReport {
            from,
            cached: false,
            ms: self.ms,
            loader: Some(self.loader.clone()),
            graph: Some(self.graph),
            check: self.check.clone(),
            phases_ms: self.phases_ms.clone(),
            before_ms: self.before_ms.clone(),
        }
    }
}

/// Why a job's units fail: the outcome, the export's stderr, its time.
type StoreFailure = Box<(Outcome, Vec<String>, u64)>;

/// The jobs in groups of one architecture (in the order each first
/// appears); a job without a graph is a group of its own.
fn by_graph(jobs: &[Job]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (index, job) in jobs.iter().enumerate() {
        let same =
            job.graph.as_ref().and_then(|g| groups.iter_mut().find(|group| jobs[group[0]].graph.as_ref() == Some(g)));
        match same {
            Some(group) => group.push(index),
            None => groups.push(vec![index]),
        }
    }
    groups
}

/// The export threads and each one's part: whole groups dealt out to at
/// most `jobs` threads, and how many traced files each of a thread's
/// processes takes. Code from a file (`--keras-unsafe`) gets a process of
/// its own, so it cannot touch another file's export; a number set in
/// `KerasSettings::files_per_process` is each process's. Left open (0),
/// there is a thread per group up to `jobs`, and a thread's part is one
/// process (up to [`MAX_FILES_PER_PROCESS`] traced files, a file that
/// shares a trace counting 1/[`SHARED_PER_TRACE`] of one): Python with
/// TensorFlow takes seconds to start, and a group split over two processes
/// would import and trace twice in series (40 checkpoints' first run took
/// 6.2 s at `-j 2` so, against 4.3 s at `-j 1`).
fn plan_exports(
    jobs: &[Job],
    groups: &[Vec<usize>],
    settings: &Settings,
    cost: &dyn Fn(usize) -> u64,
) -> Vec<(Vec<Job>, usize)> {
    let set = match (settings.keras.unsafe_code, settings.keras.files_per_process) {
        (true, _) => Some(1),
        (false, 0) => None,
        (false, n) => Some(n),
    };
    let threads = match set {
        Some(n) => groups.len().div_ceil(n),
        None => groups.len(),
    };
    let slots = settings.jobs.max(1).min(threads).max(1);
    share_out(jobs, groups, slots, cost)
        .into_iter()
        .map(|part| {
            let per_process = set.unwrap_or_else(|| one_process_for(&part));
            (part, per_process)
        })
        .collect()
}

/// The files per process that make `part` one process where
/// [`MAX_FILES_PER_PROCESS`] allows: its traced files (a file whose graph
/// is not the one before it), and a traced file per [`SHARED_PER_TRACE`]
/// files in all, as `export::batch_len` counts them.
fn one_process_for(part: &[Job]) -> usize {
    let traced =
        (0..part.len()).filter(|&n| n == 0 || part[n].graph.is_none() || part[n].graph != part[n - 1].graph).count();
    traced.max(part.len().div_ceil(SHARED_PER_TRACE)).clamp(1, MAX_FILES_PER_PROCESS)
}

/// What exporting a file in full is guessed to cost, in milliseconds:
/// `load_model` and the trace grow with its layers, freezing, the probe and
/// writing with its bytes (fitted on five `keras.applications` files here:
/// within ~30% of each one's steps, 1.6–5.9 s). Only the order and the
/// sharing out of exports use it.
fn export_cost(layers: usize, bytes: u64) -> u64 {
    300 + 10 * layers as u64 + 15 * (bytes >> 20)
}

/// What a group of one architecture costs to export: its traced file's
/// cost, and each file that shares the trace 1/[`SHARED_PER_TRACE`] of it.
fn group_cost(group: &[usize], cost: &dyn Fn(usize) -> u64) -> u64 {
    let traced = group.iter().map(|&job| cost(job)).max().unwrap_or(0);
    traced * (SHARED_PER_TRACE + group.len().saturating_sub(1)) as u64 / SHARED_PER_TRACE as u64
}

/// The groups in the order their exports start: the costliest first (ties
/// keep their order). Dealt out so, the export processes of `-j N` end
/// close together (the longest-first rule), and the last file exported,
/// whose unit a run waits for at its end, is a cheap one, whose run is
/// short too (five `keras.applications` files, `-j 1`: ResNet50's 1.3 s
/// unit after the last export became MobileNetV3Small's 0.2 s).
fn costliest_first(groups: &mut [Vec<usize>], cost: &dyn Fn(usize) -> u64) {
    groups.sort_by_cached_key(|group| std::cmp::Reverse(group_cost(group, cost)));
}

/// The groups dealt to `slots` export threads, whole, each to the one with
/// the least work so far (a traced file counts [`SHARED_PER_TRACE`], a
/// file sharing its trace one); empty parts dropped.
fn share_out(jobs: &[Job], groups: &[Vec<usize>], slots: usize, cost: &dyn Fn(usize) -> u64) -> Vec<Vec<Job>> {
    let mut parts: Vec<(u64, Vec<Job>)> = (0..slots.max(1)).map(|_| (0, Vec::new())).collect();
    for group in groups {
        let (load, part) = parts.iter_mut().min_by_key(|(load, _)| *load).expect("one slot at least");
        *load += group_cost(group, cost).max(1);
        part.extend(group.iter().map(|&i| jobs[i].clone()));
    }
    parts.into_iter().map(|(_, part)| part).filter(|part| !part.is_empty()).collect()
}

/// Why a file holding Python code is not exported without `--keras-unsafe`.
pub(crate) fn unsafe_code_refused(path: &std::path::Path, code: &str) -> String {
    format!(
        "{}: {code} holds Python code, which would run when the file is loaded; refused without --keras-unsafe \
         (pass it to run that code, inside the export sandbox, if you trust the file)",
        path.display()
    )
}

fn export_error(message: String) -> Outcome {
    Outcome::Error(ModelError::new(ErrorKind::ExportFailed, message))
}

/// What a run decides of a Keras file from the file alone, before any
/// export or worker (`eval`: a model input the data cannot feed); `Some`
/// ends the unit with that outcome and the file is not exported.
pub(crate) type Decide<'a> = &'a dyn Fn(&Model) -> Option<Outcome>;

/// Plans the export stage: hashes every Keras file, finds Python (asked
/// once, or remembered), looks each file up in the cache. Fast: no export
/// runs here ([`Staged::produce`] runs them, during the run).
/// `check_in_worker`: frozen graphs' checks go to the units' workers
/// (see [`Staged::check_in_worker`]). `decide`: units ended from the file
/// alone, never exported.
pub(crate) fn plan(models: &[Model], settings: &Settings, check_in_worker: bool, decide: Option<Decide<'_>>) -> Staged {
    let mut staged = Staged {
        models: models.to_vec(),
        exports: Mutex::new(vec![None; models.len()]),
        fates: models.iter().map(|_| Fate::Ready).collect(),
        work: None,
        sources: models.iter().map(|m| (m.path.clone(), m.format)).collect(),
        check_in_worker,
        exported_again: Mutex::new(vec![false; models.len()]),
    };
    let mut keras: Vec<usize> = (0..models.len()).filter(|&i| models[i].format.is_keras_file()).collect();
    // Decided from the file alone: not exported (whether or not Python is there).
    keras.retain(|&index| match decide.and_then(|decide| decide(&models[index])) {
        Some(outcome) => {
            staged.fates[index] = Fate::Failed(Box::new((outcome, Vec::new())));
            false
        }
        None => true,
    });
    if keras.is_empty() {
        return staged;
    }
    let fail = |staged: &mut Staged, index: usize, message: String| {
        staged.fates[index] = Fate::Failed(Box::new((export_error(message), Vec::new())));
        staged.exports.get_mut().expect("exports")[index] = Some(ExportReport {
            from: models[index].format,
            cached: false,
            ms: 0,
            loader: None,
            graph: None,
            check: None,
            phases_ms: Vec::new(),
            before_ms: Vec::new(),
        });
    };
    let (cache, python, module_hashes) = match toolchain(settings) {
        Ok(found) => found,
        Err(message) => {
            for &index in &keras {
                fail(&mut staged, index, message.clone());
            }
            return staged;
        }
    };
    let script = export::script_sha256();
    let versions =
        [python.keras.as_str(), python.tensorflow.as_str(), python.tf_keras.as_deref().unwrap_or("-"), script.as_str()];
    let mut keys: Vec<KeyWork> = Vec::new();
    for &index in &keras {
        let began = Instant::now();
        let model = &models[index];
        // A broken archive is said in isorun's words (Keras calls a truncated zip "File not found").
        let info = match model.format {
            ModelFormat::Keras => match files::read_keras(&model.path) {
                Ok(info) => Some(info),
                Err(e) => {
                    fail(&mut staged, index, e.to_string());
                    continue;
                }
            },
            // Where isorun cannot find the config, the export process checks it (keras_export.py).
            _ => files::read_h5(&model.path).ok(),
        };
        // Python code in the file runs only with --keras-unsafe: refused
        // here, before any Python starts (tf_keras ignores safe_mode for
        // HDF5 files and would run a Lambda's bytecode while loading).
        if let Some(code) = info.as_ref().and_then(|i| i.code.as_ref()).filter(|_| !settings.keras.unsafe_code) {
            fail(&mut staged, index, unsafe_code_refused(&model.path, code));
            continue;
        }
        // Files of one architecture share a trace, unless a file's code runs
        // (--keras-unsafe: each file a process of its own) or its config was not found.
        let layers = info.as_ref().map_or(0, |i| i.layers);
        let graph = info
            .and_then(|i| i.architecture)
            .filter(|_| !settings.keras.unsafe_code)
            .map(|architecture| cache::entry_key(&architecture, &versions, &module_hashes, false));
        let hash = match cache::hash_file(&model.path) {
            Ok(hash) => hash,
            Err(e) => {
                fail(&mut staged, index, format!("{}: cannot read: {e}", model.path.display()));
                continue;
            }
        };
        let key = cache::entry_key(&hash, &versions, &module_hashes, settings.keras.unsafe_code);
        staged.models[index] =
            Model { id: model.id.clone(), path: cache.join(&key).join("saved_model"), format: ModelFormat::SavedModel };
        let entry = cache.join(&key);
        if !check_in_worker && cache::check_pending(&entry) {
            // A frozen graph that waits for a worker's check, for a caller
            // that has none to give (`pipe`): exported again, checked there.
            cache::remove_pending(&cache, &key);
        }
        if cache::lookup(&cache, &key).is_some() {
            let about = cache::about(&entry);
            let text = |name: &str| about.as_ref().and_then(|v| v.get(name)?.as_str().map(String::from));
            let ms = began.elapsed().as_millis() as u64;
            staged.exports.get_mut().expect("exports")[index] = Some(ExportReport {
                from: model.format,
                cached: true,
                ms,
                loader: text("loader"),
                graph: text("graph").as_deref().and_then(GraphSource::from_name),
                check: about.as_ref().and_then(ExportCheck::of_entry),
                phases_ms: Vec::new(),
                before_ms: Vec::new(),
            });
            continue;
        }
        staged.fates[index] = Fate::Export;
        match keys.iter_mut().find(|k| k.key == key) {
            Some(work) => work.indexes.push(index),
            None => {
                let bytes = std::fs::metadata(&model.path).map_or(0, |m| m.len());
                keys.push(KeyWork { key, indexes: vec![index], graph, cost: export_cost(layers, bytes) })
            }
        }
    }
    if !keys.is_empty() {
        staged.work = Some(ExportWork { cache, python, keys, module_hashes });
    }
    staged
}

/// The cache folder (made, stale staging removed), the Python and the
/// `--keras-module` files' hashes; `Err` fails every Keras file of the run.
fn toolchain(settings: &Settings) -> Result<(PathBuf, python::Python, Vec<String>), String> {
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
    Ok((cache, python, module_hashes))
}

/// The SavedModel of one model for a caller that runs it outside
/// [`Engine::run`](crate::Engine::run) (`isorun pipe`): a SavedModel as it
/// is, a Keras file exported (or found in the cache) under the settings'
/// sandbox and limits; `Err` is the outcome that says why not.
pub fn saved_model_for(
    model: &Model,
    settings: &Settings,
    stop: &CancelToken,
) -> Result<(PathBuf, Option<ExportReport>), Outcome> {
    let staged = plan(std::slice::from_ref(model), settings, false, None);
    if staged.has_keras_files() {
        let queue = UnitQueue::new(1);
        let (events, reports) = mpsc::channel();
        staged.produce(settings, stop, &queue, &events);
        drop(events);
        if let Ok(Event::Finished(report)) = reports.try_recv() {
            return Err(report.outcome);
        }
    }
    let export = staged.exports.lock().expect("exports")[0].take();
    Ok((staged.models[0].path.clone(), export))
}

#[cfg(test)]
mod key_parts_tests {
    use super::*;

    #[test]
    fn an_export_s_phases_end_with_the_rest_of_its_time() {
        let phases = |v: &[(&str, u64)]| v.iter().map(|(n, ms)| (n.to_string(), *ms)).collect::<Vec<_>>();
        assert_eq!(
            with_other(phases(&[("load_weights", 20), ("write", 5)]), 30),
            phases(&[("load_weights", 20), ("write", 5), ("other", 5)])
        );
        // The process's clock saw more than the supervisor's: nothing is left, nothing negative.
        assert_eq!(with_other(phases(&[("load_model", 40)]), 38), phases(&[("load_model", 40), ("other", 0)]));
        assert_eq!(with_other(Vec::new(), 30), Vec::new());
    }

    /// The processes `plan_exports` leads to: each thread's part taken
    /// batch after batch as `export_all` takes them; the files of each.
    fn processes(jobs: &[Job], groups: &[Vec<usize>], settings: &Settings) -> Vec<Vec<Vec<usize>>> {
        plan_exports(jobs, groups, settings, &|_| 1)
            .into_iter()
            .map(|(part, per_process)| {
                let mut left: Vec<&Job> = part.iter().collect();
                let mut batches = Vec::new();
                while !left.is_empty() {
                    let n = export::batch_len(&left, per_process);
                    batches.push(left.drain(..n).map(|job| job.id).collect());
                }
                batches
            })
            .collect()
    }

    /// Jobs of the given architectures in a row (`None`: none shared), and their groups.
    fn jobs_of(graphs: &[(Option<&str>, usize)]) -> (Vec<Job>, Vec<Vec<usize>>) {
        let mut jobs = Vec::new();
        for &(graph, count) in graphs {
            for _ in 0..count {
                let id = jobs.len();
                jobs.push(Job {
                    id,
                    file: PathBuf::from(format!("{id}.keras")),
                    out: PathBuf::new(),
                    graph: graph.map(String::from),
                    freeze: true,
                    check_in_worker: true,
                });
            }
        }
        let groups = by_graph(&jobs);
        (jobs, groups)
    }

    /// One architecture's files go to one export process at any `-j` (a
    /// second would import and trace again), beside other architectures
    /// too; many architectures are shared out over `-j` threads, a process
    /// each, and a number of files per process set is kept.
    #[test]
    fn each_thread_exports_its_part_in_one_process_and_an_architecture_is_never_split() {
        let settings = |jobs: usize| {
            let mut settings = Settings::builder("isorun-worker").build();
            settings.jobs = jobs;
            settings
        };
        let ids = |range: std::ops::Range<usize>| range.collect::<Vec<usize>>();
        let (jobs, groups) = jobs_of(&[(Some("mlp"), 40)]);
        for j in [1, 2, 4] {
            assert_eq!(processes(&jobs, &groups, &settings(j)), vec![vec![ids(0..40)]], "-j {j}");
        }
        // 40 checkpoints and 2 other files at -j 4: three threads, the checkpoints whole on one.
        let (jobs, groups) = jobs_of(&[(Some("mlp"), 40), (Some("cnn"), 1), (None, 1)]);
        let plan = processes(&jobs, &groups, &settings(4));
        assert_eq!(plan.len(), 3, "{plan:?}");
        assert!(plan.contains(&vec![ids(0..40)]), "{plan:?}");
        // Two checkpoint folders at -j 2: a thread and a process each.
        let (jobs, groups) = jobs_of(&[(Some("a"), 40), (Some("b"), 40)]);
        let mut plan = processes(&jobs, &groups, &settings(2));
        plan.sort();
        assert_eq!(plan, vec![vec![ids(0..40)], vec![ids(40..80)]]);
        // 40 distinct architectures: 20 a process at -j 2; at -j 1, 32 then 8 (the most a process takes).
        let (jobs, groups) = jobs_of(&[(None, 40)]);
        let sizes = |plan: Vec<Vec<Vec<usize>>>| -> Vec<Vec<usize>> {
            plan.iter().map(|batches| batches.iter().map(Vec::len).collect()).collect()
        };
        assert_eq!(sizes(processes(&jobs, &groups, &settings(2))), vec![vec![20], vec![20]]);
        assert_eq!(sizes(processes(&jobs, &groups, &settings(1))), vec![vec![MAX_FILES_PER_PROCESS, 8]]);
        // A number set is each process's; --keras-unsafe is a process per file.
        let mut set = settings(1);
        set.keras = set.keras.files_per_process(5);
        assert_eq!(sizes(processes(&jobs, &groups, &set)), vec![vec![5; 8]]);
        let mut unsafe_code = settings(2);
        unsafe_code.keras = unsafe_code.keras.unsafe_code(true);
        assert!(sizes(processes(&jobs, &groups, &unsafe_code)).iter().flatten().all(|&n| n == 1));
    }

    #[test]
    fn exports_start_with_the_costliest_and_end_together_across_processes() {
        // The five keras.applications files here: ConvNeXtTiny, DenseNet121,
        // EfficientNetB0, MobileNetV3Small, ResNet50 (layers, MiB).
        let files = [(153, 109), (429, 32), (240, 21), (182, 10), (177, 98)];
        let costs: Vec<u64> = files.iter().map(|&(layers, mib)| export_cost(layers, mib << 20)).collect();
        let cost = |job: usize| costs[job];
        let mut groups: Vec<Vec<usize>> = (0..5).map(|job| vec![job]).collect();
        costliest_first(&mut groups, &cost);
        assert_eq!(groups.concat(), [1, 4, 0, 2, 3], "DenseNet first, MobileNet last");
        let jobs: Vec<Job> = (0..5)
            .map(|id| Job {
                id,
                file: PathBuf::from(format!("{id}.keras")),
                out: PathBuf::new(),
                graph: None,
                freeze: true,
                check_in_worker: true,
            })
            .collect();
        let parts = share_out(&jobs, &groups, 2, &cost);
        let ids: Vec<Vec<usize>> = parts.iter().map(|p| p.iter().map(|j| j.id).collect()).collect();
        // Measured export steps (s): DenseNet 5.9 + EfficientNet 3.1 against
        // ResNet 3.6 + ConvNeXt 3.5 + MobileNet 1.6; shared out by count it was 11.0 against 6.7.
        assert_eq!(ids, vec![vec![1, 2], vec![4, 0, 3]]);
        // A group that shares one trace costs its traced file and 1/8 of it per further file.
        assert_eq!(group_cost(&[0, 2, 3], &|_| 800), 1000);
        // Ties keep their order.
        let mut tied = vec![vec![3], vec![1], vec![2]];
        costliest_first(&mut tied, &|_| 5);
        assert_eq!(tied, vec![vec![3], vec![1], vec![2]]);
    }

    #[test]
    fn export_json_records_the_modules_and_unsafe_that_made_the_key() {
        let keras = KerasSettings::default().modules(vec![PathBuf::from("/src/layers.py")]).unsafe_code(true);
        let parts = key_parts(&keras, &["ab".repeat(32)]);
        assert_eq!(parts["keras_modules"], serde_json::json!([{"path": "/src/layers.py", "sha256": "ab".repeat(32)}]));
        assert_eq!(parts["keras_unsafe"], true);
        let plain = key_parts(&KerasSettings::default(), &[]);
        assert_eq!(serde_json::Value::Object(plain), serde_json::json!({"keras_modules": [], "keras_unsafe": false}));
    }
}
