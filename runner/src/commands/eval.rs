//! `isorun eval`: `run`'s models, workers, limits, journal and reports, each
//! model fed a labelled dataset batch after batch instead of one set of
//! inputs. The supervisor reads the data (`isorun-eval`), keeps the labels,
//! scores each batch's outputs as they come back and keeps only metric
//! state; the worker sees inputs only. Everything that can be checked before
//! work starts (the data's files and first example, metric names, rules,
//! the baseline) is a usage error (exit 2); what goes wrong for one model
//! (its signature wants a feature the data lacks, a corrupt record
//! mid-file) is that model's outcome.

mod scorer;

use crate::cli::{EvalArgs, EvalOptions};
use crate::drive::{discover_models, execute, Plan, Work};
use crate::error::CliError;
use crate::output_lock::OutputLocks;
use crate::settings::{report_settings, shared_settings};
use crate::support::with_causes;
use isorun_engine::{Feed, FeedStream, FeedSummary, Model, ModelFormat};
use isorun_eval::bootstrap::{self, Bootstrap};
use isorun_eval::predictions::{BackgroundWriter, Meta, PredictionsFormat, PredictionsWriter};
use isorun_eval::{
    BatchReader, Bound, CiSpec, DataError, DataSpec, Dataset, Evaluator, KeyedBy, MaxDrop, Metric, MetricsSpec, Targets,
};
use isorun_protocol::{DType, ErrorKind, ModelError, Outcome, SignatureInfo, Tensor, TensorSpec};
use isorun_report::change::{bootstrap_settings, BaselineBootstrap, BaselineRecord, Discordant, Gate};
use isorun_report::eval_record::{data_shard_fields, evaluation_fields, EvalRules};
use isorun_report::shard::Shard;
use isorun_tensors::json_input::signature_of;
use isorun_tensors::output::StreamedOutputs;
use scorer::{Score, Scorer};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Rows per batch when `--batch-size` is not given.
const DEFAULT_BATCH_SIZE: u64 = 256;

/// Runs the command; `Err` is a usage error (exit 2).
pub fn main(args: EvalArgs, quiet: bool) -> Result<i32, CliError> {
    let started = Instant::now();
    let started_at = std::time::SystemTime::now();
    let EvalArgs { eval, mut run } = args;
    let batch_size = *run.batch_size.get_or_insert(DEFAULT_BATCH_SIZE);
    let run_settings = shared_settings(&run)?;
    let mut engine = run_settings.engine.clone();
    // Batches are the feed's; the engine must not split them again.
    engine.batch_size = None;
    let rules = Rules::parse(&eval.thresholds, &eval.max_drops, eval.gate)?;
    let ci = ci_spec(eval.ci, eval.bootstrap, eval.bootstrap_seed, eval.example_key.is_some())?;
    let data_shard = eval.data_shard;
    if data_shard.is_some() && eval.limit.is_some() {
        return Err("--limit cannot be given with --data-shard: the first N examples of the whole dataset \
                    are not a shard's; limit the data itself"
            .into());
    }
    let metrics = eval
        .metrics
        .iter()
        .map(|m| Metric::parse(m).map_err(|e| format!("--metric {m}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    check_drops_computed(&rules.checks.drops, &metrics, "")?;
    let spec = MetricsSpec {
        metrics,
        output: eval.output.clone(),
        top_k: eval.top_k as usize,
        threshold: rules.decision,
        from_logits: eval.from_logits,
        calibration_bins: eval.calibration_bins as usize,
        max_confusion_classes: eval.max_confusion_classes as usize,
    };
    let renames = eval
        .features
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((input, feature)) if !input.is_empty() && !feature.is_empty() => {
                Ok((input.to_string(), feature.to_string()))
            }
            _ => Err(format!("--feature {pair}: expected INPUT=FEATURE")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let models = discover_models(&run)?;
    let classes = label_classes(&eval)?;
    let dataset = Dataset::open_with_classes(
        DataSpec {
            paths: eval.data.clone(),
            label: eval.label.clone(),
            weight: eval.weight.clone(),
            slices: eval.slices.clone(),
            renames,
            limit: eval.limit,
            batch_size: batch_size as usize,
            skip_corrupt: eval.skip_corrupt,
            shard: data_shard.map(|s| isorun_eval::DataShard { index: s.index, count: s.count }),
            format: eval.data_format,
            example_key: eval.example_key.clone(),
        },
        classes,
    )
    .map_err(|e| format!("--data: {}", with_causes(&e)))?;
    // Models run one after another (or a few at a time) over the same data:
    // a small dataset is decoded once, its batches replayed for the rest.
    let dataset = if models.len() > 1 { dataset.keep_decoded(isorun_eval::data::KEEP_DECODED_BYTES) } else { dataset };
    let baseline = match &eval.baseline {
        Some(path) => Some(read_baseline(path)?),
        None => None,
    };
    if rules.checks.gate == Gate::Significant {
        // A data shard's record is paired in `report merge`, which has the replicates only.
        let through_predictions = data_shard.is_none();
        check_gate(ci.as_ref(), baseline.as_ref(), eval.baseline.as_deref(), through_predictions)?;
    }
    let key_settings = format!(
        "eval v1\0{}\0{:?}\0{batch_size}\0{:?}\0{}\0{:?}\0{:?}\0{:?}\0{:?}\0{}\0{}\0{:?}\0{:?}\0{:?}\0{:?}\0{:?}",
        engine.signature,
        engine.tags,
        engine.libraries,
        eval.label,
        eval.weight,
        eval.metrics,
        eval.output,
        eval.slices,
        eval.top_k,
        eval.from_logits,
        eval.thresholds,
        eval.max_drops,
        eval.limit,
        baseline.as_ref().map(|b| b.digest.clone()),
        data_shard.map(|s| s.to_string()),
    ) + &format!("\0{:?}", eval.example_key)
        + &format!("\0{}\0{}", eval.calibration_bins, eval.max_confusion_classes)
        + &format!("\0{:?}\0{}\0{}", eval.predictions, eval.predictions_format.extension(), eval.predictions_all)
        + &format!("\0{:?}\0{:?}\0{}\0{}", eval.ci, eval.bootstrap, eval.bootstrap_seed, eval.gate.name())
        + &eval.label_classes.as_ref().map_or(String::new(), |c| format!("\0label_classes{c:?}"));
    let mut settings = report_settings(&run, &run_settings);
    settings["eval"] = eval_settings(&eval, &dataset, batch_size, data_shard);
    if let Some(dir) = &run.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("--output-dir {}: cannot create: {e}", dir.display()))?;
    }
    // Held to the run's end: another eval writing these models' predictions would lose this one's, or this its.
    let mut predictions_lock = OutputLocks::default();
    if let Some(dir) = &eval.predictions {
        let shard = run.shard.map(|shard| (shard.index, shard.count));
        predictions_lock.lock_folder("--predictions", dir, shard).map_err(|e| with_causes(&e))?;
    }
    let predictions = match &eval.predictions {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("--predictions {}: cannot create: {e}", dir.display()))?;
            Some(Predictions {
                dir: dir.clone(),
                format: eval.predictions_format,
                all: eval.predictions_all,
                meta: Meta {
                    weight: eval.weight.clone(),
                    slices: eval.slices.clone(),
                    example_key: eval.example_key.clone(),
                    metrics: eval.metrics.clone(),
                    threshold: rules.decision,
                    top_k: eval.top_k as usize,
                    from_logits: eval.from_logits,
                    data_digest: dataset.dataset_digest(),
                    data_shard: data_shard.map(|s| s.to_string()),
                    calibration_bins: eval.calibration_bins as usize,
                    max_confusion_classes: eval.max_confusion_classes as usize,
                    ..Meta::new(eval.label.clone())
                },
            })
        }
        None => None,
    };
    let feed = EvalFeed {
        predictions,
        output_dir: run.output_dir.clone(),
        dataset,
        spec,
        ci,
        slices: eval.slices.clone(),
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
        run: &run_settings,
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
        report_settings: settings,
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

/// `--threshold` (a number, or bounds) and `--max-drop`, parsed.
pub(crate) struct Rules {
    /// The binary decision threshold, if one was given.
    pub(crate) given: Option<f64>,
    pub(crate) decision: f64,
    pub(crate) checks: EvalRules,
}

impl Rules {
    pub(crate) fn parse(thresholds: &[String], max_drops: &[String], gate: Gate) -> Result<Rules, String> {
        let mut decision = None;
        let mut bounds = Vec::new();
        for given in thresholds {
            if let Ok(x) = given.trim().parse::<f64>() {
                if !x.is_finite() {
                    return Err(format!("--threshold {given}: expected a finite number"));
                }
                if decision.replace(x).is_some() {
                    return Err(format!("--threshold {given}: a second decision threshold (give one number)"));
                }
            } else {
                bounds.push(given.parse::<Bound>().map_err(|e| format!("--threshold {given}: {e}"))?);
            }
        }
        let drops = max_drops
            .iter()
            .map(|given| given.parse::<MaxDrop>().map_err(|e| format!("--max-drop {given}: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(Rules { given: decision, decision: decision.unwrap_or(0.5), checks: EvalRules { bounds, drops, gate } })
    }
}

/// `--ci LEVEL`, `--bootstrap N`, `--bootstrap-seed S`, checked.
pub(crate) fn ci_spec(
    ci: Option<f64>,
    bootstrap: Option<u32>,
    bootstrap_seed: u64,
    keyed: bool,
) -> Result<Option<CiSpec>, String> {
    let Some(level) = ci else {
        if let Some(n) = bootstrap {
            return Err(format!("--bootstrap {n}: give --ci LEVEL too (e.g. --ci 0.95): replicates make intervals"));
        }
        if bootstrap_seed != 0 {
            return Err(format!("--bootstrap-seed {}: give --ci LEVEL too", bootstrap_seed));
        }
        return Ok(None);
    };
    if !(level > 0.0 && level < 1.0) {
        return Err(format!("--ci {level}: expected a level between 0 and 1, e.g. 0.95"));
    }
    let replicates = bootstrap.unwrap_or(bootstrap::DEFAULT_REPLICATES);
    if !(1..=bootstrap::MAX_REPLICATES).contains(&replicates) {
        return Err(format!("--bootstrap {replicates}: expected 1 to {} replicates", bootstrap::MAX_REPLICATES));
    }
    let by = if keyed { KeyedBy::Key } else { KeyedBy::Index };
    Ok(Some(CiSpec { bootstrap: Bootstrap { replicates, seed: bootstrap_seed }, level, by }))
}

/// A `--max-drop` on a metric the run does not compute can never be
/// checked (and `--gate significant` could not test it): a usage error,
/// where the metrics are known before the work (`--metric` given, or the
/// metrics a predictions file was scored with). `file` names that file.
pub(crate) fn check_drops_computed(drops: &[MaxDrop], metrics: &[Metric], file: &str) -> Result<(), String> {
    if metrics.is_empty() {
        return Ok(());
    }
    match drops.iter().find(|d| !metrics.contains(&d.metric)) {
        Some(drop) => {
            let computed: Vec<&str> = metrics.iter().map(|m| m.name()).collect();
            Err(format!(
                "--max-drop {drop}: {} is not computed{file} (the metrics are: {}); add --metric {}",
                drop.metric.name(),
                computed.join(", "),
                drop.metric.name()
            ))
        }
        None => Ok(()),
    }
}

/// `--gate significant` needs `--ci`, `--max-drop`, and a baseline whose
/// every model has replicates this run's pair with, or (`through_predictions`)
/// a predictions file its replicates can be drawn from again.
pub(crate) fn check_gate(
    ci: Option<&CiSpec>,
    baseline: Option<&Baseline>,
    baseline_path: Option<&Path>,
    through_predictions: bool,
) -> Result<(), String> {
    let Some(ci) = ci else {
        return Err("--gate significant needs --ci LEVEL: significance is that of the paired bootstrap interval".into());
    };
    let (Some(baseline), Some(path)) = (baseline, baseline_path) else {
        return Err("--gate significant needs --baseline REPORT.json and --max-drop".into());
    };
    let wanted = bootstrap_settings(ci.bootstrap.replicates, ci.bootstrap.seed, ci.by.name());
    let mut names: Vec<&String> = baseline.models.keys().collect();
    names.sort();
    for model in names {
        let record = &baseline.models[model];
        if record.bootstrap.as_ref().is_some_and(|b| b.settings == wanted) {
            continue;
        }
        if let (true, Some(predictions)) = (through_predictions, &record.predictions) {
            // Its replicates are drawn again from its predictions, keyed as this run's.
            let meta = isorun_eval::predictions::PredictionsReader::open(predictions).map_err(|e| {
                format!(
                    "--gate significant: the baseline {} names model {model}'s predictions, which cannot be read: {}",
                    path.display(),
                    with_causes(&e)
                )
            })?;
            if ci.by == KeyedBy::Key && meta.meta.example_key.is_none() {
                return Err(format!(
                    "--gate significant: the baseline {}'s predictions of model {model} ({}) have no example keys \
                     and this run's replicates are keyed by --example-key: give the baseline --example-key too",
                    path.display(),
                    predictions.display()
                ));
            }
            continue;
        }
        let shard_note = if through_predictions || record.predictions.is_none() {
            ""
        } else {
            " (a --data-shard run pairs in report merge, through replicates only)"
        };
        return Err(match &record.bootstrap {
            None => format!(
                "--gate significant: the baseline {} has no bootstrap replicates for model {model}{shard_note}: \
                 evaluate the baseline with --ci (and the same --bootstrap and --bootstrap-seed), or with \
                 --predictions so tonight can pair through them",
                path.display()
            ),
            Some(b) => format!(
                "--gate significant: the baseline {} drew model {model}'s replicates with {}, this run with {}{shard_note}: \
                 give the same --bootstrap, --bootstrap-seed and --example-key",
                path.display(),
                b.settings,
                wanted
            ),
        });
    }
    Ok(())
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

/// The metrics (and `--ci` replicates) of each model in an earlier eval report.
pub(crate) struct Baseline {
    pub(crate) models: HashMap<String, BaselineRecord>,
    digest: String,
}

pub(crate) fn read_baseline(path: &Path) -> Result<Baseline, String> {
    let report = isorun_report::read_report(path).map_err(|e| format!("--baseline: {}", with_causes(&e)))?;
    let mut models = HashMap::new();
    for unit in report["units"].as_array().into_iter().flatten() {
        let (Some(model), Some(record)) = (unit["model"].as_str(), BaselineRecord::from_unit(unit)) else { continue };
        models.insert(model.to_string(), record);
    }
    if models.is_empty() {
        return Err(format!(
            "--baseline {}: no model in it has metrics (is it a report of isorun eval?)",
            path.display()
        ));
    }
    let mut names: Vec<_> = models.iter().collect();
    names.sort_by(|a, b| a.0.cmp(b.0));
    let digest =
        format!("{:?}", names.iter().map(|(m, r)| (m, &r.metrics, &r.bootstrap, &r.predictions)).collect::<Vec<_>>());
    Ok(Baseline { models, digest })
}

/// The evaluation's settings, as reports show them.
/// `--label-classes`, checked (names given, none empty or twice).
pub(crate) fn label_classes(eval: &EvalOptions) -> Result<Option<isorun_eval::LabelClasses>, String> {
    eval.label_classes.clone().map(isorun_eval::LabelClasses::new).transpose().map_err(|e| e.to_string())
}

fn eval_settings(eval: &EvalOptions, dataset: &Dataset, batch_size: u64, data_shard: Option<Shard>) -> Value {
    // The whole dataset's files, a shard's too: every data shard of one evaluation agrees on them.
    let files: Vec<String> =
        dataset.dataset_files().iter().map(|(path, _)| path.to_string_lossy().into_owned()).collect();
    let mut s = Map::new();
    s.insert("data".into(), json!(files));
    s.insert("label".into(), json!(eval.label));
    if let Some(classes) = &eval.label_classes {
        s.insert("label_classes".into(), json!(classes));
    }
    if let Some(weight) = &eval.weight {
        s.insert("weight".into(), json!(weight));
    }
    s.insert("batch_size".into(), json!(batch_size));
    if !eval.metrics.is_empty() {
        s.insert("metrics".into(), json!(eval.metrics));
    }
    if !eval.slices.is_empty() {
        s.insert("slices".into(), json!(eval.slices));
    }
    if let Some(key) = &eval.example_key {
        s.insert("example_key".into(), json!(key));
    }
    if eval.calibration_bins != 15 {
        s.insert("calibration_bins".into(), json!(eval.calibration_bins));
    }
    if eval.max_confusion_classes != 1000 {
        s.insert("max_confusion_classes".into(), json!(eval.max_confusion_classes));
    }
    if let Some(limit) = eval.limit {
        s.insert("limit".into(), json!(limit));
    }
    if !eval.thresholds.is_empty() {
        s.insert("thresholds".into(), json!(eval.thresholds));
    }
    if let Some(baseline) = &eval.baseline {
        s.insert("baseline".into(), json!(baseline.to_string_lossy()));
        s.insert("max_drops".into(), json!(eval.max_drops));
    }
    if let Some(level) = eval.ci {
        s.insert("ci".into(), json!(level));
        s.insert("bootstrap".into(), json!(eval.bootstrap.unwrap_or(bootstrap::DEFAULT_REPLICATES)));
        s.insert("bootstrap_seed".into(), json!(eval.bootstrap_seed));
    }
    if eval.gate != Gate::Always {
        s.insert("gate".into(), json!(eval.gate.name()));
    }
    if let Some(shard) = data_shard {
        // Sizes and mtimes of the files, and how they are read: `report merge` refuses shards of other data.
        s.insert("data_digest".into(), json!(dataset.dataset_digest()));
        // `report merge` checks the thresholds and drops above once the shards are merged.
        s.insert("data_shard".into(), json!(shard.to_string()));
    }
    Value::Object(s)
}

/// `--predictions`: where and how, and eval's settings for the files' metadata.
struct Predictions {
    dir: std::path::PathBuf,
    format: PredictionsFormat,
    all: bool,
    meta: Meta,
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
