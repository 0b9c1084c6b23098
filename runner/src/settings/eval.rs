//! `isorun eval`'s flags turned into validated settings: those it shares
//! with `run` as [`RunSettings`], then the rules, the interval, the metrics,
//! the models, the data (its files and first example read), the baseline
//! and `--predictions`, each checked once and in that order. A problem here
//! is a usage error (exit 2), found before any work starts. The eval driver
//! (`commands/eval.rs`) reads these, never the flags; `rescore` parses its
//! rules, interval and baseline with the same functions ([`Rules`],
//! [`ci_spec`], [`check_gate`], [`read_baseline`]), so the two cannot differ.

use super::{report_settings, shared_settings, RunSettings};
use crate::cli::{EvalArgs, EvalOptions};
use crate::drive::discover_models;
use crate::error::CliError;
use crate::support::with_causes;
use isorun_engine::{Model, Settings};
use isorun_eval::bootstrap::{self, Bootstrap};
use isorun_eval::predictions::{Meta, PredictionsFormat};
use isorun_eval::{Bound, CiSpec, DataSpec, Dataset, KeyedBy, MaxDrop, Metric, MetricsSpec};
use isorun_report::change::{bootstrap_settings, BaselineRecord, Gate};
use isorun_report::eval_record::EvalRules;
use isorun_report::shard::Shard;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Rows per batch when `--batch-size` is not given.
const DEFAULT_BATCH_SIZE: u64 = 256;

/// An evaluation's validated settings.
pub struct EvalSettings {
    /// The flags eval shares with `run` (`--batch-size` defaulted to
    /// [`DEFAULT_BATCH_SIZE`]); its workers' private folder lives as long as it.
    pub run: RunSettings,
    /// What the engine needs: `run`'s, less the batch size (batches are the feed's).
    pub engine: Settings,
    /// The models found (`--latest-version`, `--shard`).
    pub models: Vec<Model>,
    /// `--data`, opened (`--data-format`, `--label`, `--label-classes`,
    /// `--weight`, `--slice`, `--feature`, `--limit`, `--data-shard`,
    /// `--example-key`, `--skip-corrupt`); kept decoded for more than one model.
    pub dataset: Dataset,
    /// `--metric`, `--output`, `--top-k`, `--from-logits`, `--calibration-bins`,
    /// `--max-confusion-classes` and the decision threshold.
    pub metrics: MetricsSpec,
    /// `--ci`, `--bootstrap`, `--bootstrap-seed`.
    pub ci: Option<CiSpec>,
    /// `--slice`.
    pub slices: Vec<String>,
    /// `--threshold`, `--max-drop`, `--gate`.
    pub rules: Rules,
    /// `--baseline`, read.
    pub baseline: Option<Baseline>,
    /// `--data-shard`: records carry the metric state; no rule is checked.
    pub data_shard: Option<Shard>,
    /// `--predictions`, `--predictions-format`, `--predictions-all`.
    pub predictions: Option<Predictions>,
    /// What, besides the model and the data, decides a unit's result, for journal keys.
    pub key_settings: String,
    /// The settings as reports show them (`run`'s, and eval's under `"eval"`).
    pub report_settings: Value,
}

/// `--predictions`: where and how, and eval's settings for the files' metadata.
pub struct Predictions {
    pub dir: PathBuf,
    pub format: PredictionsFormat,
    pub all: bool,
    pub meta: Meta,
}

/// Validates `eval`'s flags.
pub fn eval_settings(args: EvalArgs) -> Result<EvalSettings, CliError> {
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
    let mut report = report_settings(&run, &run_settings);
    report["eval"] = report_eval_settings(&eval, &dataset, batch_size, data_shard);
    let predictions = match &eval.predictions {
        Some(dir) => Some(Predictions {
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
        }),
        None => None,
    };
    Ok(EvalSettings {
        run: run_settings,
        engine,
        models,
        dataset,
        metrics: spec,
        ci,
        slices: eval.slices,
        rules,
        baseline,
        data_shard,
        predictions,
        key_settings,
        report_settings: report,
    })
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

/// `--label-classes`, checked (names given, none empty or twice).
pub(crate) fn label_classes(eval: &EvalOptions) -> Result<Option<isorun_eval::LabelClasses>, String> {
    eval.label_classes.clone().map(isorun_eval::LabelClasses::new).transpose().map_err(|e| e.to_string())
}

/// The evaluation's settings, as reports show them.
fn report_eval_settings(eval: &EvalOptions, dataset: &Dataset, batch_size: u64, data_shard: Option<Shard>) -> Value {
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
