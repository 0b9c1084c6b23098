//! Pairing a run with a baseline through the baseline's predictions file
//! (`--gate significant` against a report whose record names one): the
//! baseline's bootstrap replicates drawn again from its rows, with this
//! run's replicates, seed and keying, so a baseline evaluated without `--ci`
//! (or with other bootstrap settings) still pairs; and McNemar's discordant
//! counts of two predictions files, examples matched by key (or index) as
//! `rescore --diff` matches them, for the exact test of accuracy. Here, not
//! in the runner, because both are a pass of [`PredictionsReader`] rows
//! through this crate's [`Evaluator`] and [`Differ`].

use super::diff::{DiffError, DiffOptions, DiffSummary, Differ};
use super::read::{PredictionsReader, ReadError};
use crate::metrics::{Evaluator, Metric, MetricsSpec, MAX_CONFUSION_CLASSES};
use crate::replicates::{CiSpec, KeyedBy};
use std::collections::BTreeMap;
use std::path::Path;

/// Every replicate's value of each of `metrics` over the rows of the
/// predictions file at `path`, drawn with `ci` (its replicates, seed and
/// keying) and scored with the file's own settings (output, threshold,
/// logits, k, calibration bins): the `bootstrap_values` its eval would have
/// written with that `--ci`. NaN where a replicate cannot compute a metric.
pub fn replicate_values(path: &Path, metrics: &[Metric], ci: CiSpec) -> Result<BTreeMap<String, Vec<f64>>, ReadError> {
    let bad = |reason: String| ReadError { path: path.to_path_buf(), reason };
    let mut reader = PredictionsReader::open(path)?;
    if ci.by == KeyedBy::Key && reader.meta.example_key.is_none() {
        return Err(bad("has no example keys (eval --example-key), and this run's replicates are keyed by key".into()));
    }
    let meta = &reader.meta;
    let spec = MetricsSpec {
        metrics: metrics.to_vec(),
        output: Some(meta.output.clone()),
        top_k: meta.top_k,
        threshold: meta.threshold,
        from_logits: meta.from_logits,
        calibration_bins: meta.calibration_bins,
        // Replicates never read the confusion matrix: the file's claim sizes nothing here.
        max_confusion_classes: meta.max_confusion_classes.min(MAX_CONFUSION_CLASSES),
    };
    let output = meta.output.clone();
    reader.start(&output, &[])?;
    let mut evaluator = Evaluator::new(&spec, &reader.signature(), &[]).map_err(|e| bad(e.to_string()))?.with_ci(ci);
    while let Some(batch) = reader.next_batch() {
        let batch = batch?;
        evaluator.update(std::slice::from_ref(&batch.output), &batch.targets).map_err(|e| bad(e.to_string()))?;
    }
    Ok(evaluator.finish().ci.map(|intervals| intervals.values).unwrap_or_default())
}

/// The two files compared example by example ([`Differ`]): `broke` and
/// `fixed` are McNemar's discordant counts of accuracy.
pub fn discordant(baseline: &Path, new: &Path) -> Result<DiffSummary, DiffError> {
    let (b, n) = (PredictionsReader::open(baseline)?, PredictionsReader::open(new)?);
    Differ::run(b, n, DiffOptions::default(), &mut |_| Ok(()))
}
