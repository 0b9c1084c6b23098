//! Two predictions files of the same examples compared example by example
//! (`isorun rescore --diff`): which predictions changed class (or moved by
//! more than a tolerance), which of them were fixed or broken, and
//! McNemar's exact test on the discordant pairs for accuracy.
//!
//! Matching: by key when both files have one (`--example-key`), else by
//! index. By index the two files are read in lockstep, a batch of each at a
//! time. By key the baseline is held as a map key → compact prediction:
//! about `key length + 80` bytes an example (a million examples with
//! 16-byte keys: ~100 MB); the other file streams past it.

use super::read::{PredictionsReader, ReadError};
use crate::data::Labels;
use crate::metrics::{argmax, sigmoid};
use std::collections::HashMap;
use std::path::PathBuf;

/// Why two files cannot be compared.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{baseline} and {new} are not predictions of the same examples: {reason}")]
    Mismatch { baseline: PathBuf, new: PathBuf, reason: String },
}

/// How predictions are compared.
#[derive(Debug, Clone, Copy, Default)]
pub struct DiffOptions {
    /// A score (regression value, binary probability, the predicted class's
    /// probability) that moves by more than this counts as changed too.
    /// Regression: `None` counts any move.
    pub tolerance: Option<f64>,
}

/// One example's prediction, as compared.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Binary: the probability of class 1; multiclass: the predicted
    /// class's probability; regression: the value.
    pub score: f64,
    /// The predicted class (`None` for regression).
    pub class: Option<i64>,
}

/// An example whose prediction changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Changed {
    pub index: u64,
    pub key: Option<String>,
    /// The label (a multi-value label's argmax).
    pub label: f64,
    pub baseline: Prediction,
    pub new: Prediction,
    /// `fixed` (wrong before, right now), `broke`, or `changed`.
    pub kind: &'static str,
}

/// What changed, in counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiffSummary {
    pub examples: u64,
    pub changed: u64,
    /// Wrong in the baseline, right now (McNemar's c).
    pub fixed: u64,
    /// Right in the baseline, wrong now (McNemar's b).
    pub broke: u64,
    pub both_right: u64,
    pub both_wrong: u64,
    /// `key` or `index`.
    pub matched_by: &'static str,
    /// Two-sided exact McNemar p for accuracy (classification only).
    pub mcnemar_p: Option<f64>,
}

/// Two-sided exact McNemar test: the binomial(b + c, 1/2) probability of a
/// split at least as uneven as (b, c), doubled, at most 1.
pub fn mcnemar_exact_p(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // log pmf(i) = log C(n, i) - n log 2, summed in log space.
    let mut log_pmf = -(n as f64) * std::f64::consts::LN_2;
    let mut terms = Vec::with_capacity(k as usize + 1);
    for i in 0..=k {
        terms.push(log_pmf);
        log_pmf += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
    }
    let max = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let tail = max.exp() * terms.iter().map(|t| (t - max).exp()).sum::<f64>();
    (2.0 * tail).min(1.0)
}

#[derive(Debug, Clone)]
struct Row {
    index: u64,
    label: f64,
    prediction: Prediction,
}

/// How rows become predictions: the task and settings eval had.
#[derive(Debug, Clone, Copy)]
struct Decide {
    task: Kind,
    threshold: f64,
    from_logits: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Binary,
    Multiclass,
    Regression,
}

impl Decide {
    fn of(reader: &PredictionsReader) -> Result<Decide, ReadError> {
        let task = match reader.meta.task.as_deref() {
            Some("binary") => Kind::Binary,
            Some("multiclass") => Kind::Multiclass,
            Some("regression") => Kind::Regression,
            other => {
                return Err(ReadError {
                    path: reader.path().into(),
                    reason: format!("its task is {other:?}: no batch was scored"),
                })
            }
        };
        Ok(Decide { task, threshold: reader.meta.threshold, from_logits: reader.meta.from_logits })
    }

    fn predict(&self, scores: &[f64]) -> Prediction {
        match self.task {
            Kind::Binary => {
                let p = if self.from_logits { sigmoid(scores[0]) } else { scores[0] };
                Prediction { score: p, class: Some(i64::from(p > self.threshold)) }
            }
            Kind::Multiclass => {
                let mut row = scores.to_vec();
                if self.from_logits {
                    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = row
                        .iter_mut()
                        .map(|v| {
                            *v = (*v - max).exp();
                            *v
                        })
                        .sum();
                    row.iter_mut().for_each(|v| *v /= sum);
                }
                let class = argmax(&row);
                Prediction { score: row[class], class: Some(class as i64) }
            }
            Kind::Regression => Prediction { score: scores[0], class: None },
        }
    }
}

/// A file's rows, one at a time, a batch read at a time.
struct Cursor {
    reader: PredictionsReader,
    decide: Decide,
    rows: std::vec::IntoIter<(Row, Option<String>)>,
}

impl Cursor {
    fn new(mut reader: PredictionsReader) -> Result<Cursor, ReadError> {
        let decide = Decide::of(&reader)?;
        let output = reader.meta.output.clone();
        reader.start(&output, &[])?;
        Ok(Cursor { reader, decide, rows: Vec::new().into_iter() })
    }

    fn next(&mut self) -> Result<Option<(Row, Option<String>)>, ReadError> {
        loop {
            if let Some(row) = self.rows.next() {
                return Ok(Some(row));
            }
            let Some(batch) = self.reader.next_batch() else { return Ok(None) };
            let batch = batch?;
            let tensor = &batch.output.1;
            let mut values = Vec::new();
            super::read::values_f64(tensor, &mut values)
                .map_err(|reason| ReadError { path: self.reader.path().into(), reason })?;
            let targets = &batch.targets;
            let width = values.len() / targets.rows.max(1);
            let mut rows = Vec::with_capacity(targets.rows);
            for r in 0..targets.rows {
                let label = match &targets.labels {
                    Labels::Int(v) => v[r] as f64,
                    Labels::Float(v) => v[r],
                    Labels::Matrix { columns, values } => argmax(&values[r * columns..(r + 1) * columns]) as f64,
                };
                let prediction = self.decide.predict(&values[r * width..(r + 1) * width]);
                let key = targets.keys.as_ref().map(|k| k[r].clone());
                rows.push((Row { index: targets.first_index + r as u64, label, prediction }, key));
            }
            // A file's index column is its rows' order: each batch's first
            // index and its row count give every row's index.
            self.rows = rows.into_iter();
        }
    }
}

/// Compares two files; `on_changed` gets each changed example in the new
/// file's order.
pub struct Differ;

impl Differ {
    pub fn run(
        baseline: PredictionsReader,
        new: PredictionsReader,
        options: DiffOptions,
        on_changed: &mut dyn FnMut(&Changed) -> Result<(), String>,
    ) -> Result<DiffSummary, DiffError> {
        let (base_path, new_path) = (baseline.path().to_path_buf(), new.path().to_path_buf());
        let mismatch =
            |reason: String| DiffError::Mismatch { baseline: base_path.clone(), new: new_path.clone(), reason };
        let by_key = match (&baseline.meta.example_key, &new.meta.example_key) {
            (Some(_), Some(_)) => true,
            (None, None) => false,
            (Some(k), None) => {
                return Err(mismatch(format!("the baseline has keys (--example-key {k}), the other has none")))
            }
            (None, Some(k)) => {
                return Err(mismatch(format!("the baseline has no keys, the other has (--example-key {k})")))
            }
        };
        if baseline.meta.examples != new.meta.examples {
            return Err(mismatch(format!(
                "the baseline has {} examples, the other {}",
                baseline.meta.examples, new.meta.examples
            )));
        }
        if baseline.meta.label_kind != new.meta.label_kind {
            return Err(mismatch(format!(
                "labels are {:?} in the baseline, {:?} in the other",
                baseline.meta.label_kind, new.meta.label_kind
            )));
        }
        let mut base = Cursor::new(baseline)?;
        let mut newer = Cursor::new(new)?;
        if (base.decide.task == Kind::Regression) != (newer.decide.task == Kind::Regression) {
            return Err(mismatch("one is a regression task, the other is not".into()));
        }
        let mut summary = DiffSummary { matched_by: if by_key { "key" } else { "index" }, ..DiffSummary::default() };
        let mut compare = |b: &Row, n: &Row, key: Option<String>, summary: &mut DiffSummary| -> Result<(), DiffError> {
            let id = || key.clone().map_or(format!("index {}", n.index), |k| format!("key '{k}'"));
            if b.label != n.label && !(b.label.is_nan() && n.label.is_nan()) {
                return Err(mismatch(format!(
                    "the example with {} has label {} in the baseline, {} in the other",
                    id(),
                    b.label,
                    n.label
                )));
            }
            summary.examples += 1;
            let right = |p: &Prediction| p.class.map(|c| c as f64 == n.label);
            let moved = (b.prediction.score - n.prediction.score).abs();
            let changed = b.prediction.class != n.prediction.class
                || match (b.prediction.class, options.tolerance) {
                    (_, Some(tolerance)) => moved > tolerance,
                    (None, None) => moved > 0.0,
                    (Some(_), None) => false,
                };
            let kind = match (right(&b.prediction), right(&n.prediction)) {
                (Some(true), Some(true)) => {
                    summary.both_right += 1;
                    "changed"
                }
                (Some(false), Some(false)) => {
                    summary.both_wrong += 1;
                    "changed"
                }
                (Some(false), Some(true)) => {
                    summary.fixed += 1;
                    "fixed"
                }
                (Some(true), Some(false)) => {
                    summary.broke += 1;
                    "broke"
                }
                _ => "changed",
            };
            if changed {
                summary.changed += 1;
                let changed = Changed {
                    index: n.index,
                    key,
                    label: n.label,
                    baseline: b.prediction.clone(),
                    new: n.prediction.clone(),
                    kind,
                };
                on_changed(&changed).map_err(|reason| mismatch(format!("writing the changes: {reason}")))?;
            }
            Ok(())
        };
        if by_key {
            let mut held: HashMap<String, Row> = HashMap::new();
            while let Some((row, key)) = base.next()? {
                let key = key.unwrap_or_default();
                if let Some(earlier) = held.insert(key.clone(), row) {
                    return Err(mismatch(format!(
                        "key '{key}' is in the baseline twice (index {} and another); keys must name one example",
                        earlier.index
                    )));
                }
            }
            while let Some((row, key)) = newer.next()? {
                let key = key.unwrap_or_default();
                let Some(b) = held.remove(&key) else {
                    return Err(mismatch(format!("key '{key}' (index {}) is not in the baseline", row.index)));
                };
                compare(&b, &row, Some(key), &mut summary)?;
            }
            if let Some(key) = held.keys().next() {
                return Err(mismatch(format!("{} baseline key(s) are not in the other, e.g. '{key}'", held.len())));
            }
        } else {
            loop {
                match (base.next()?, newer.next()?) {
                    (None, None) => break,
                    (Some((b, _)), Some((n, _))) => {
                        if b.index != n.index {
                            return Err(mismatch(format!(
                                "row {} is example {} in the baseline, {} in the other",
                                summary.examples, b.index, n.index
                            )));
                        }
                        compare(&b, &n, None, &mut summary)?;
                    }
                    (Some(_), None) | (None, Some(_)) => {
                        return Err(mismatch(format!(
                            "one file ends after {} examples, the other goes on",
                            summary.examples
                        )))
                    }
                }
            }
        }
        if newer.decide.task != Kind::Regression {
            summary.mcnemar_p = Some(mcnemar_exact_p(summary.broke, summary.fixed));
        }
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcnemar_matches_the_binomial_by_hand() {
        // b = 1, c = 5: 2 * (1 + 6) / 64.
        assert!((mcnemar_exact_p(1, 5) - 14.0 / 64.0).abs() < 1e-15);
        assert!((mcnemar_exact_p(5, 1) - 14.0 / 64.0).abs() < 1e-15);
        assert_eq!(mcnemar_exact_p(0, 0), 1.0);
        assert_eq!(mcnemar_exact_p(3, 3), 1.0);
        // b = 0, c = 10: 2 / 1024.
        assert!((mcnemar_exact_p(0, 10) - 2.0 / 1024.0).abs() < 1e-15);
        // Large counts stay finite: scipy.stats.binomtest(4800, 10000).pvalue = 6.56e-05.
        let p = mcnemar_exact_p(4800, 5200);
        assert!(p > 6.0e-5 && p < 7.1e-5, "{p}");
    }
}
