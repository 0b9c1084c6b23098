//! `isorun rescore`: eval's records recomputed from the predictions files
//! `eval --predictions` wrote, in this process alone: no worker starts, no
//! model is read and TensorFlow is never loaded (the supervisor binary does
//! not link it). Each file's rows are rebuilt into the batches eval scored
//! (labels of the kind read, the output in its dtype, eval's first batch
//! first) and fed to the same `isorun_eval::Evaluator`, whose evaluation
//! becomes the record through `evaluation_fields`, as in eval: the same
//! options give the same numbers, bit for bit. Settings not given are eval's,
//! from each file's description. Everything checkable before the work (the
//! files, their descriptions, the output and slice columns asked for, metric
//! names, rules, the baseline) is a usage error (exit 2); a file that goes
//! bad part-way is its record's `error` (exit 1).
//!
//! `--diff BASELINE NEW` compares two runs example by example
//! (`isorun_eval::predictions::Differ`).

use super::eval::pair_through_predictions;
use crate::cli::{Format, RescoreArgs};
use crate::error::CliError;
use crate::printer::{progress_bar, Printer};
use crate::settings::eval::{check_drops_computed, check_gate, ci_spec, read_baseline, Baseline, Rules};
use crate::support::{lock_given_outputs, with_causes, write_run_report};
use isorun_engine::{Model, STATUSES};
use isorun_eval::predictions::{list_files, ChangedWriter, DiffOptions, Differ, PredictionsReader};
use isorun_eval::{Evaluator, Metric, MetricsSpec};
use isorun_protocol::{exit_code, ErrorKind, ModelError, Outcome};
use isorun_report::eval_record::evaluation_fields;
use isorun_report::record::outcome_fields;
use serde_json::{json, Map, Value};
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Runs the command; `Err` is a usage error (exit 2).
pub fn main(args: RescoreArgs, quiet: bool) -> Result<i32, CliError> {
    // Held to the end, before any file is read: another rescore (or run)
    // writing one of these files would lose this one's models, or this its.
    let _locks = lock_given_outputs(&[
        ("--report", args.report.as_deref()),
        ("--junit", args.junit.as_deref()),
        ("--html", args.html.as_deref()),
        ("--output-changed", args.output_changed.as_deref()),
    ])?;
    if args.diff {
        return Ok(diff(&args, quiet)?);
    }
    let started = Instant::now();
    let started_at = std::time::SystemTime::now();
    let rules = Rules::parse(&args.thresholds, &args.max_drops, args.gate)?;
    // Checked once here; each file's replicates are keyed as its eval was (by key or index).
    ci_spec(args.ci, args.bootstrap, args.bootstrap_seed, false)?;
    let metrics = parse_metrics(&args.metrics, "--metric")?;
    let baseline = args.baseline.as_deref().map(read_baseline).transpose()?;
    let files = list_files(&args.paths).map_err(|e| with_causes(&e))?;
    // Every file is opened and checked before any is scored.
    let mut units = Vec::with_capacity(files.len());
    for path in &files {
        units.push(prepare(path, &args, &rules, &metrics)?);
    }
    if rules.checks.gate == isorun_report::change::Gate::Significant {
        for unit in &units {
            check_gate(unit.ci.as_ref(), baseline.as_ref(), args.baseline.as_deref(), true)?;
        }
    }
    let models: Vec<Model> =
        units.iter().map(|u| Model::saved_model(u.reader.meta.model.clone(), u.path.clone())).collect();
    let format = match (args.json, args.format) {
        (true, _) => Format::Jsonl,
        (false, Some(format)) => format,
        (false, None) if io::stdout().is_terminal() => Format::Table,
        (false, None) => Format::Jsonl,
    };
    let bar = (!quiet && io::stderr().is_terminal()).then(|| progress_bar(models.len() as u64));
    let fail_on = STATUSES[1..].iter().map(|s| s.to_string()).collect();
    let mut printer = Printer::new(&models, format, bar, fail_on);
    printer.keep_records = args.report.is_some() || args.junit.is_some() || args.html.is_some();
    for (index, unit) in units.into_iter().enumerate() {
        printer.started(index);
        let record = score(unit, &rules, baseline.as_ref());
        printer.accept(index, record);
        if printer.broken_pipe {
            break;
        }
    }
    if let Some(bar) = &printer.bar {
        bar.finish_and_clear();
    }
    let records = std::mem::take(&mut printer.records);
    let mut report_failed = false;
    if args.report.is_some() || args.junit.is_some() || args.html.is_some() {
        let settings = json!({ "rescore": rescore_settings(&args, &files) });
        let files = [args.report.as_deref(), args.junit.as_deref(), args.html.as_deref()];
        if !write_run_report(&records, started_at, settings, None, files) {
            report_failed = true;
        }
    }
    printer.finish(started.elapsed());
    Ok(match () {
        _ if printer.broken_pipe => exit_code::OK,
        _ if printer.failures > 0 || report_failed => exit_code::SOME_FAILED,
        _ => exit_code::OK,
    })
}

fn parse_metrics(names: &[String], flag: &str) -> Result<Vec<Metric>, String> {
    names.iter().map(|m| Metric::parse(m).map_err(|e| format!("{flag} {m}: {e}"))).collect()
}

/// The settings as reports show them.
fn rescore_settings(args: &RescoreArgs, files: &[PathBuf]) -> Value {
    let mut s = Map::new();
    s.insert("predictions".into(), json!(files.iter().map(|f| f.to_string_lossy()).collect::<Vec<_>>()));
    if !args.metrics.is_empty() {
        s.insert("metrics".into(), json!(args.metrics));
    }
    if !args.slices.is_empty() {
        s.insert("slices".into(), json!(args.slices));
    }
    if !args.thresholds.is_empty() {
        s.insert("thresholds".into(), json!(args.thresholds));
    }
    if let Some(baseline) = &args.baseline {
        s.insert("baseline".into(), json!(baseline.to_string_lossy()));
        s.insert("max_drops".into(), json!(args.max_drops));
    }
    Value::Object(s)
}

/// One file, checked and ready to score.
struct Unit {
    path: PathBuf,
    reader: PredictionsReader,
    evaluator: Evaluator,
    /// `--ci`, keyed as the file's eval was.
    ci: Option<isorun_eval::CiSpec>,
}

/// What eval computed, with the options given instead where they are: the
/// one place `rescore` builds its spec, so that every option eval's spec
/// takes (and `--ci` once it exists) reads the file's settings the same way.
fn spec_for(
    reader: &PredictionsReader,
    args: &RescoreArgs,
    rules: &Rules,
    metrics: &[Metric],
) -> Result<(MetricsSpec, Vec<String>), String> {
    let meta = &reader.meta;
    let file = reader.path().display();
    let metrics = if metrics.is_empty() {
        parse_metrics(&meta.metrics, &format!("{file}: eval's metric"))?
    } else {
        metrics.to_vec()
    };
    let spec = MetricsSpec {
        metrics,
        output: Some(args.output.clone().unwrap_or_else(|| meta.output.clone())),
        top_k: args.top_k.map_or(meta.top_k, |k| k as usize),
        threshold: rules.given.unwrap_or(meta.threshold),
        from_logits: args.from_logits || meta.from_logits,
        calibration_bins: args.calibration_bins.map_or(meta.calibration_bins, |n| n as usize),
        // A classes² matrix: never sized by what a file claims, only by the flag.
        max_confusion_classes: args
            .max_confusion_classes
            .map_or(meta.max_confusion_classes.min(isorun_eval::metrics::MAX_CONFUSION_CLASSES), |n| n as usize),
    };
    let slices = if args.slices.is_empty() { meta.slices.clone() } else { args.slices.clone() };
    Ok((spec, slices))
}

fn prepare(path: &Path, args: &RescoreArgs, rules: &Rules, metrics: &[Metric]) -> Result<Unit, String> {
    let mut reader = PredictionsReader::open(path).map_err(|e| with_causes(&e))?;
    let (spec, slices) = spec_for(&reader, args, rules, metrics)?;
    check_drops_computed(&rules.checks.drops, &spec.metrics, &format!(" for {}", path.display()))?;
    let output = spec.output.clone().expect("always named");
    reader.start(&output, &slices).map_err(|e| with_causes(&e))?;
    let mut evaluator = Evaluator::new(&spec, &reader.signature(), &slices)
        .map_err(|e| format!("{}: {}", path.display(), with_causes(&e)))?;
    let ci = ci_spec(args.ci, args.bootstrap, args.bootstrap_seed, reader.meta.example_key.is_some())?;
    if let Some(ci) = ci {
        evaluator = evaluator.with_ci(ci);
    }
    Ok(Unit { path: path.to_path_buf(), reader, evaluator, ci })
}

/// Scores one file: its record, as eval's (`model`, `path`, `status`,
/// `examples`, the evaluation's fields, `predictions`).
fn score(unit: Unit, rules: &Rules, baseline: Option<&Baseline>) -> Value {
    let Unit { path, mut reader, mut evaluator, .. } = unit;
    let started = Instant::now();
    let mut failure = None;
    while let Some(batch) = reader.next_batch() {
        let result = batch.map_err(|e| ModelError::new(ErrorKind::Dataset, with_causes(&e))).and_then(|batch| {
            evaluator
                .update(std::slice::from_ref(&batch.output), &batch.targets)
                .map_err(|e| ModelError::new(ErrorKind::Evaluation, with_causes(&e)))
        });
        if let Err(e) = result {
            failure = Some(Outcome::Error(e));
            break;
        }
    }
    let model = reader.meta.model.clone();
    let data_shard = reader.meta.data_shard.clone();
    let skipped_corrupt = reader.meta.skipped_corrupt;
    let mut record = Map::new();
    record.insert("model".into(), json!(model));
    record.insert("path".into(), json!(path.to_string_lossy()));
    let evaluation = evaluator.finish();
    let mut record_of = baseline.and_then(|b| b.models.get(&model)).cloned();
    if let (isorun_report::change::Gate::Significant, Some(base)) = (rules.checks.gate, &mut record_of) {
        // This file is tonight's predictions: the exact test pairs it with the baseline's.
        pair_through_predictions(base, &evaluation, Some(&path));
    }
    let baseline = baseline.map(|_| record_of.as_ref());
    let (fields, breach) = evaluation_fields(&evaluation, skipped_corrupt, baseline, &rules.checks);
    let outcome = failure.or(breach);
    let outcome = outcome.unwrap_or(Outcome::Ok);
    record.insert("status".into(), json!(outcome.status()));
    outcome_fields(&mut record, &outcome);
    record.insert("examples".into(), json!(evaluation.examples));
    record.extend(fields);
    if let Some(shard) = data_shard {
        // The file holds one data shard's examples: these metrics are that shard's.
        record.insert("data_shard".into(), json!(shard));
    }
    record.insert("predictions".into(), json!(path.to_string_lossy()));
    record.insert("wall_ms".into(), json!(started.elapsed().as_millis() as u64));
    Value::Object(record)
}

/// `--diff BASELINE NEW`: files paired by model id; each changed example a
/// JSON line on stdout, then one summary line per pair.
fn diff(args: &RescoreArgs, quiet: bool) -> Result<i32, String> {
    let [baseline, new] = args.paths.as_slice() else {
        return Err(format!(
            "--diff takes two paths, BASELINE then NEW (files or folders of eval --predictions); {} given",
            args.paths.len()
        ));
    };
    if args.tolerance.is_some_and(|t| t.is_nan() || t < 0.0) {
        return Err("--tolerance: expected a number >= 0".into());
    }
    let pairs = pair_files(baseline, new)?;
    let mut changed_out = match &args.output_changed {
        Some(path) => Some(ChangedWriter::create(path).map_err(|e| with_causes(&e))?),
        None => None,
    };
    let mut readers = Vec::new();
    for (b, n) in &pairs {
        let b = PredictionsReader::open(b).map_err(|e| with_causes(&e))?;
        let n = PredictionsReader::open(n).map_err(|e| with_causes(&e))?;
        readers.push((b, n));
    }
    let options = DiffOptions { tolerance: args.tolerance };
    let mut out = io::BufWriter::new(io::stdout().lock());
    for (b, n) in readers {
        let model = n.meta.model.clone();
        let (base_path, new_path) = (b.path().to_path_buf(), n.path().to_path_buf());
        // Class labels (integers, a one-hot's argmax) print as integers.
        let float_labels = n.meta.label_kind.as_deref() == Some("float");
        let summary = Differ::run(b, n, options, &mut |changed| {
            let line = json!({
                "model": model,
                "index": changed.index,
                "key": changed.key,
                "label": if float_labels { json!(changed.label) } else { json!(changed.label as i64) },
                "baseline": { "class": changed.baseline.class, "score": changed.baseline.score },
                "new": { "class": changed.new.class, "score": changed.new.score },
                "change": changed.kind,
            });
            // A reader gone (`| head`) ends the listing, not the summary's count.
            let _ = writeln!(out, "{line}");
            if let Some(writer) = changed_out.as_mut() {
                writer.push(&model, changed).map_err(|e| with_causes(&e))?;
            }
            Ok(())
        })
        .map_err(|e| with_causes(&e))?;
        let line = json!({
            "model": model,
            "summary": {
                "baseline": base_path.to_string_lossy(),
                "predictions": new_path.to_string_lossy(),
                "matched_by": summary.matched_by,
                "examples": summary.examples,
                "changed": summary.changed,
                "fixed": summary.fixed,
                "broke": summary.broke,
                "both_right": summary.both_right,
                "both_wrong": summary.both_wrong,
                "mcnemar_p": summary.mcnemar_p,
            }
        });
        let _ = writeln!(out, "{line}");
        if !quiet {
            let p = summary.mcnemar_p.map_or(String::new(), |p| match p {
                p if p < 1e-3 => format!(", McNemar exact p = {p:.2e}"),
                p => format!(", McNemar exact p = {p:.4}"),
            });
            eprintln!(
                "isorun: {model}: {} of {} examples changed ({} fixed, {} broke; matched by {}){p}",
                summary.changed, summary.examples, summary.fixed, summary.broke, summary.matched_by
            );
        }
    }
    let _ = out.flush();
    if let Some(writer) = changed_out {
        writer.finish().map_err(|e| with_causes(&e))?;
    }
    Ok(exit_code::OK)
}

/// Two files as they are; two folders' files by their path below each
/// (the model id); a file on one side only is an error naming it.
fn pair_files(baseline: &Path, new: &Path) -> Result<Vec<(PathBuf, PathBuf)>, String> {
    match (baseline.is_dir(), new.is_dir()) {
        (false, false) => Ok(vec![(baseline.to_path_buf(), new.to_path_buf())]),
        (true, true) => {
            let relative = |dir: &Path| -> Result<Vec<PathBuf>, String> {
                let files = list_files(&[dir.to_path_buf()]).map_err(|e| with_causes(&e))?;
                Ok(files.iter().map(|f| f.strip_prefix(dir).unwrap_or(f).to_path_buf()).collect())
            };
            let (b, n) = (relative(baseline)?, relative(new)?);
            if let Some(only) = b.iter().find(|f| !n.contains(f)) {
                return Err(format!(
                    "--diff: {} has no {} (the baseline {} has it)",
                    new.display(),
                    only.display(),
                    baseline.display()
                ));
            }
            if let Some(only) = n.iter().find(|f| !b.contains(f)) {
                return Err(format!("--diff: the baseline {} has no {}", baseline.display(), only.display()));
            }
            Ok(b.iter().map(|f| (baseline.join(f), new.join(f))).collect())
        }
        _ => Err(format!(
            "--diff: give two files or two folders; {} and {} are one of each",
            baseline.display(),
            new.display()
        )),
    }
}
