//! `isorun eval`: `run`'s models, workers, limits, journal and reports, each
//! model fed a labelled dataset batch after batch instead of one set of
//! inputs. The supervisor reads the data (`isorun-eval`), keeps the labels,
//! scores each batch's outputs as they come back and keeps only metric
//! state; the worker sees inputs only. Everything that can be checked before
//! work starts (the data's files and first example, metric names, rules,
//! the baseline) is a usage error (exit 2), found while its settings are
//! built (`crate::settings::eval`); what goes wrong for one model
//! (its signature wants a feature the data lacks, a corrupt record
//! mid-file) is that model's outcome.

mod scorer;

use crate::cli::EvalArgs;
use crate::drive::{execute, Plan, Work};
use crate::error::CliError;
use crate::output_lock::OutputLocks;
use crate::settings::eval::{eval_settings, Baseline, EvalSettings, Predictions, Rules};
use crate::support::with_causes;
use isorun_engine::{Feed, FeedStream, FeedSummary, Model, ModelFormat};
use isorun_eval::predictions::{BackgroundWriter, PredictionsWriter};
use isorun_eval::{BatchReader, CiSpec, DataError, Dataset, Evaluator, Metric, MetricsSpec, Targets};
use isorun_protocol::{DType, ErrorKind, ModelError, Outcome, SignatureInfo, Tensor, TensorSpec};
use isorun_report::change::{bootstrap_settings, BaselineBootstrap, BaselineRecord, Discordant, Gate};
use isorun_report::eval_record::{data_shard_fields, evaluation_fields, EvalRules};
use isorun_report::shard::Shard;
use isorun_tensors::json_input::signature_of;
use isorun_tensors::output::StreamedOutputs;
use scorer::{Score, Scorer};
use serde_json::json;
use std::io::Write;
use std::path::Path;
use std::time::{Instant, SystemTime};

/// Runs the command; `Err` is a usage error (exit 2).
pub fn main(args: EvalArgs, quiet: bool) -> Result<i32, CliError> {
    let started = Instant::now();
    let started_at = SystemTime::now();
    let settings = eval_settings(args)?;
    drive(settings, quiet, started, started_at)
}

/// Runs a validated evaluation: makes the `--output-dir` and `--predictions`
/// folders (the latter locked to the end), then hands the models and their
/// feed to the driver `run` shares (`crate::drive`).
fn drive(settings: EvalSettings, quiet: bool, started: Instant, started_at: SystemTime) -> Result<i32, CliError> {
    let EvalSettings {
        run,
        engine,
        models,
        dataset,
        metrics,
        ci,
        slices,
        rules,
        baseline,
        data_shard,
        predictions,
        key_settings,
        report_settings,
    } = settings;
    if let Some(dir) = &run.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("--output-dir {}: cannot create: {e}", dir.display()))?;
    }
    // Held to the run's end: another eval writing these models' predictions would lose this one's, or this its.
    let mut predictions_lock = OutputLocks::default();
    if let Some(Predictions { dir, .. }) = &predictions {
        let shard = run.shard.map(|shard| (shard.index, shard.count));
        predictions_lock.lock_folder("--predictions", dir, shard).map_err(|e| with_causes(&e))?;
        std::fs::create_dir_all(dir).map_err(|e| format!("--predictions {}: cannot create: {e}", dir.display()))?;
    }
    let feed = EvalFeed {
        predictions,
        output_dir: run.output_dir.clone(),
        dataset,
        spec: metrics,
        ci,
        slices,
        rules,
        baseline,
        data_shard,
        signature: engine.signature.clone(),
        tags: engine.tags.clone(),
    };
    if !quiet {
        say_auto_features(&models, &feed);
    }
    let key_inputs = feed.dataset.digest().into_bytes();
    let plan = Plan {
        run: &run,
        quiet,
        started,
        started_at,
        engine,
        models,
        work: Work::Feed(&feed),
        key_inputs,
        key_settings,
        inputs_dir: None,
        expect_dir: None,
        report_settings,
    };
    let ran = execute(plan);
    drop(predictions_lock);
    ran
}

/// Says on stderr, before any work, which models' one input is fed from the
/// data's one unused column ([`Dataset::auto_feature`]: a Keras
/// `Sequential` model's `input_layer` from a table's `x`), one line per
/// input and column, from the signatures this process reads (a SavedModel's,
/// a `.keras` file's input layers). Each record says it too (`auto_feature`).
fn say_auto_features(models: &[Model], feed: &EvalFeed) {
    let mut chosen: Vec<((String, String), Vec<&str>)> = Vec::new();
    for model in models {
        let Some(info) = feed.signature_here(model) else { continue };
        let Some(pair) = feed.dataset.auto_feature(&info) else { continue };
        match chosen.iter_mut().find(|(p, _)| *p == pair) {
            Some((_, ids)) => ids.push(&model.id),
            None => chosen.push((pair, vec![&model.id])),
        }
    }
    for ((input, column), ids) in chosen {
        let mut named = ids.iter().take(3).copied().collect::<Vec<_>>().join(", ");
        if ids.len() > 3 {
            named.push_str(&format!(" and {} more", ids.len() - 3));
        }
        let line = format!(
            "{named}: signature input '{input}' is fed from column '{column}', the one column nothing else uses \
             (--feature {input}={column} says so)"
        );
        let _ = writeln!(std::io::stderr(), "isorun: {}", isorun_report::text::lines(&line));
    }
}

/// Pairs `record` with this evaluation through the baseline's predictions
/// file (`--gate significant`): its replicates drawn again from the file
/// when the record has none of this run's settings, and, when this run
/// wrote predictions too (`new_predictions`), McNemar's discordant counts
/// of the two files for accuracy. What fails is the record's `unpaired`
/// reason: the gate then keeps the breach (`isorun_report::change`).
pub(crate) fn pair_through_predictions(
    record: &mut BaselineRecord,
    evaluation: &isorun_eval::Evaluation,
    new_predictions: Option<&Path>,
) {
    let Some(base) = record.predictions.clone() else { return };
    let mut failed = Vec::new();
    if let (Some(ci), false) = (&evaluation.ci, record.pairs_with(evaluation)) {
        let metrics: Vec<Metric> = evaluation.metrics.keys().filter_map(|m| Metric::parse(m).ok()).collect();
        match isorun_eval::predictions::replicate_values(&base, &metrics, ci.spec) {
            Ok(values) => {
                let settings =
                    bootstrap_settings(ci.spec.bootstrap.replicates, ci.spec.bootstrap.seed, ci.spec.by.name());
                record.bootstrap = Some(BaselineBootstrap { settings, values });
            }
            Err(e) => {
                failed.push(format!("its replicates could not be drawn from its predictions: {}", with_causes(&e)))
            }
        }
    }
    if let (Some(new), true) = (new_predictions, evaluation.metrics.contains_key("accuracy")) {
        match isorun_eval::predictions::discordant(&base, new) {
            Ok(d) => record.discordant = Some(Discordant { broke: d.broke, fixed: d.fixed, examples: d.examples }),
            Err(e) => failed.push(format!("its predictions do not pair with this run's: {}", with_causes(&e))),
        }
    }
    if !failed.is_empty() {
        record.unpaired = Some(format!("the baseline's predictions {}: {}", base.display(), failed.join("; ")));
    }
}

/// Opens each model's stream: its signature decides how the data feeds it.
struct EvalFeed {
    predictions: Option<Predictions>,
    /// `--output-dir`: every batch's outputs, appended as they come.
    output_dir: Option<std::path::PathBuf>,
    dataset: Dataset,
    spec: MetricsSpec,
    /// `--ci`: bootstrap replicates in every evaluator.
    ci: Option<CiSpec>,
    slices: Vec<String>,
    rules: Rules,
    baseline: Option<Baseline>,
    /// `--data-shard`: records carry the metric state; no rule is checked.
    data_shard: Option<Shard>,
    signature: String,
    tags: Vec<String>,
}

/// A `saved_model.pb` larger than this is not parsed here for its signature
/// alone (as `isorun_engine::signature_here`): the unit's worker says.
const SIGNATURE_READ_LIMIT: u64 = 64 << 20;

/// A dataset error as a unit's outcome.
fn dataset_error(e: &dyn std::error::Error) -> Outcome {
    Outcome::Error(ModelError::new(ErrorKind::Dataset, with_causes(e)))
}

impl EvalFeed {
    /// The model's signature as this process reads it, without TensorFlow
    /// and before any export: a SavedModel's (not too large), or a `.keras`
    /// file's input layers for `serving_default`.
    fn signature_here(&self, model: &Model) -> Option<SignatureInfo> {
        match model.format {
            ModelFormat::SavedModel => {
                let size = std::fs::metadata(model.path.join("saved_model.pb")).ok()?.len();
                if size > SIGNATURE_READ_LIMIT {
                    return None;
                }
                signature_of(&model.path, &self.tags, &self.signature).ok()
            }
            ModelFormat::Keras if self.signature == "serving_default" => {
                let keras = isorun_engine::keras::files::read_keras(&model.path).ok()?;
                Some(keras_signature(&keras, &self.signature))
            }
            _ => None,
        }
    }
}

/// A `.keras` file's input layers as the signature its export will have
/// (named as the layers; a dtype the file leaves out is float32).
fn keras_signature(keras: &isorun_engine::keras::files::KerasInfo, key: &str) -> SignatureInfo {
    let inputs = keras
        .inputs
        .iter()
        .map(|i| TensorSpec { name: i.name.clone(), dtype: i.dtype.unwrap_or(DType::Float32), shape: i.shape.clone() })
        .collect();
    SignatureInfo { key: key.to_string(), inputs, outputs: Vec::new() }
}

impl Feed for EvalFeed {
    /// Before any worker: a signature the model does not have (its
    /// `signature_not_found`, naming those it has) or a signature input the
    /// data cannot feed, read without TensorFlow from the SavedModel.
    fn check(&self, model: &Model) -> Option<Outcome> {
        match model.format {
            // Its graph is read without ONNX Runtime, however large (weights are skipped).
            ModelFormat::Onnx => {}
            ModelFormat::SavedModel => {
                let size = std::fs::metadata(model.path.join("saved_model.pb")).ok()?.len();
                if size > SIGNATURE_READ_LIMIT {
                    return None;
                }
            }
            _ => return None,
        }
        let info = match signature_of(&model.path, &self.tags, &self.signature) {
            Ok(info) => info,
            Err(missing) if missing.kind == ErrorKind::SignatureNotFound => return Some(Outcome::Error(missing)),
            Err(_) => return None,
        };
        self.dataset.reader(&info).err().map(|e| dataset_error(&e))
    }

    /// Before its export: a `.keras` file's input the data has no feature
    /// or column for. The exported signature's inputs are named after the
    /// file's input layers (a Sequential model's `input_layer`); only a
    /// missing input is decided here (the dtypes are the export's), and
    /// HDF5 files are left to [`Feed::open`].
    fn check_keras_file(&self, model: &Model) -> Option<Outcome> {
        if model.format != ModelFormat::Keras || self.signature != "serving_default" {
            return None;
        }
        let keras = isorun_engine::keras::files::read_keras(&model.path).ok()?;
        let info = keras_signature(&keras, &self.signature);
        match self.dataset.reader(&info) {
            Err(e @ (DataError::MissingInput { .. } | DataError::UnfedInput { .. })) => Some(dataset_error(&e)),
            _ => None,
        }
    }

    fn open(&self, model: &Model) -> Result<Box<dyn FeedStream + '_>, Outcome> {
        let info = signature_of(&model.path, &self.tags, &self.signature).map_err(Outcome::Error)?;
        let reader = self.dataset.reader(&info).map_err(|e| dataset_error(&e))?.prefetch(2);
        let auto_feature = self.dataset.auto_feature(&info);
        let mut evaluator = Evaluator::new(&self.spec, &info, &self.slices)
            .map_err(|e| Outcome::Error(ModelError::new(ErrorKind::Evaluation, with_causes(&e))))?;
        if let Some(ci) = self.ci {
            evaluator = evaluator.with_ci(ci);
        }
        let baseline = self.baseline.as_ref().map(|b| b.models.get(&model.id).cloned());
        let outputs = match &self.output_dir {
            Some(dir) => Some(StreamedOutputs::create(dir, &model.id).map_err(output_error)?),
            None => None,
        };
        let predictions = match &self.predictions {
            Some(p) => {
                let mut meta = p.meta.clone();
                meta.model = model.id.clone();
                meta.output = evaluator.output().to_string();
                meta.output_shape = info.outputs.iter().find(|o| o.name == meta.output).and_then(|o| o.shape.clone());
                let writer =
                    PredictionsWriter::create(&p.dir, p.format, meta, p.all).map_err(|e| predictions_error(&e))?;
                Some(BackgroundWriter::start(writer))
            }
            None => None,
        };
        let scoring = Scoring { evaluator, outputs, predictions };
        let scorer = Scorer::start(scoring).map_err(|e| {
            Outcome::Error(ModelError::new(ErrorKind::Evaluation, format!("cannot start the scoring thread: {e}")))
        })?;
        Ok(Box::new(EvalStream {
            scorer,
            reader,
            targets: None,
            rules: &self.rules.checks,
            baseline,
            data_shard: self.data_shard,
            auto_feature,
        }))
    }
}

/// What one model's batches are scored with, on its stream's scoring thread.
struct Scoring {
    evaluator: Evaluator,
    /// `--output-dir`: the outputs so far, put in place when the unit ends well.
    outputs: Option<StreamedOutputs>,
    /// `--predictions`: the rows so far, put in place when the unit ends well.
    predictions: Option<BackgroundWriter>,
}

impl Score for Scoring {
    type Batch = (Targets, Vec<(String, Tensor)>);

    fn score(&mut self, (targets, outputs): Self::Batch) -> Result<(), Outcome> {
        self.evaluator
            .update(&outputs, &targets)
            .map_err(|e| Outcome::Error(ModelError::new(ErrorKind::Evaluation, with_causes(&e))))?;
        if let Some(streamed) = &mut self.outputs {
            streamed.append(&outputs).map_err(output_error)?;
        }
        match &mut self.predictions {
            // Moved to the writer's thread, which encodes while this one scores the next batch.
            Some(writer) => writer.append(targets, outputs).map_err(|e| predictions_error(&e)),
            None => Ok(()),
        }
    }
}

/// One model's pass over the data.
struct EvalStream<'a> {
    /// Scores each batch beside the worker, which runs the next meanwhile.
    scorer: Scorer<Scoring>,
    reader: BatchReader,
    /// The labels (weights, slice values) of the batch the worker has.
    targets: Option<Targets>,
    rules: &'a EvalRules,
    /// `None`: no baseline given; `Some(None)`: the model is new.
    baseline: Option<Option<BaselineRecord>>,
    data_shard: Option<Shard>,
    /// `(input, column)`: the one input fed from the one column nothing
    /// else uses ([`Dataset::auto_feature`]), said in the record.
    auto_feature: Option<(String, String)>,
}

fn predictions_error(e: &isorun_eval::predictions::WriteError) -> Outcome {
    Outcome::Error(ModelError::new(ErrorKind::OutputWrite, format!("--predictions: {e}")))
}

fn output_error(e: std::io::Error) -> Outcome {
    Outcome::Error(ModelError::new(ErrorKind::OutputWrite, e.to_string()))
}

impl FeedStream for EvalStream<'_> {
    fn next_batch(&mut self) -> Option<Result<Vec<(String, Tensor)>, Outcome>> {
        Some(match self.reader.next_batch()? {
            Ok(batch) => {
                self.targets = Some(batch.targets);
                Ok(batch.inputs)
            }
            Err(e) => Err(Outcome::Error(ModelError::new(ErrorKind::Dataset, with_causes(&e)))),
        })
    }

    fn accept(&mut self, outputs: Vec<(String, Tensor)>) -> Result<(), Outcome> {
        let Some(targets) = self.targets.take() else {
            return Err(Outcome::ProtocolError { message: "outputs for a batch that was not sent".into() });
        };
        // Scored on the scoring thread while the worker runs the next batch;
        // this waits only while earlier batches fill its queue.
        self.scorer.send((targets, outputs))
    }

    fn background(&self) -> std::time::Duration {
        self.reader.decode_time()
    }

    fn finish(&mut self, ok: bool) -> FeedSummary {
        // Every batch accepted is scored before anything is decided.
        let (scoring, failed) = self.scorer.finish();
        let Some(mut scoring) = scoring else {
            return FeedSummary { outcome: failed, ..FeedSummary::default() };
        };
        if let (true, Some(outcome)) = (ok, failed) {
            // A batch that could not be scored ends the unit as it would
            // have on the slot: nothing put in place, no metrics.
            let examples = scoring.evaluator.finish().examples;
            return FeedSummary { examples, fields: Default::default(), outcome: Some(outcome) };
        }
        // Outputs go in place only for a unit that went through every batch.
        let written = match (ok, scoring.outputs.take()) {
            (true, Some(streamed)) => streamed.finish().map_err(output_error).err(),
            _ => None,
        };
        let predicted = match (ok && written.is_none(), scoring.predictions.take()) {
            (true, Some(writer)) => Some(
                writer
                    .finish(scoring.evaluator.task().map(|t| t.name().to_string()), self.reader.skipped())
                    .map_err(|e| predictions_error(&e)),
            ),
            _ => None,
        };
        let evaluation = scoring.evaluator.finish();
        if let (Gate::Significant, None, Some(Some(record))) = (self.rules.gate, self.data_shard, &mut self.baseline) {
            let tonight = match &predicted {
                Some(Ok(path)) => Some(path.as_path()),
                _ => None,
            };
            pair_through_predictions(record, &evaluation, tonight);
        }
        let baseline = self.baseline.as_ref().map(Option::as_ref);
        let skipped = self.reader.skipped();
        let (fields, breach) = match self.data_shard {
            Some(shard) => {
                let state = scoring.evaluator.state();
                (data_shard_fields(&evaluation, &state, &shard.to_string(), skipped, baseline), None)
            }
            None => evaluation_fields(&evaluation, skipped, baseline, self.rules),
        };
        let mut fields = fields;
        if let Some((input, column)) = &self.auto_feature {
            fields.insert("auto_feature".into(), json!({ input: column }));
        }
        let written = match predicted {
            Some(Ok(path)) => {
                fields.insert("predictions".into(), json!(path.to_string_lossy()));
                written
            }
            Some(Err(e)) => written.or(Some(e)),
            None => written,
        };
        let outcome = written.or(breach);
        FeedSummary { examples: evaluation.examples, fields, outcome }
    }
}
