//! Reliability bins: what `ece` (expected calibration error) and the
//! record's `"calibration"` (the reliability diagram) are computed from.
//! A leaf of the metric state, kept apart so the binning convention lives
//! in one place.
//!
//! The definition is Guo et al. 2017 ("On Calibration of Modern Neural
//! Networks"): N equal-width bins of confidence over [0, 1], bin b holding
//! the confidences in (b/N, (b+1)/N], the first bin [0, 1/N] (0 included);
//! a confidence outside [0, 1] (outputs that are not probabilities) counts
//! in the end bin on its side. ECE = Σ_b (W_b / W)·|acc_b − conf_b| with
//! W_b the bin's weight (its examples' sample weights; 1 each without
//! `--weight`), acc_b and conf_b its weighted accuracy and mean confidence:
//! Σ_b |A_b − C_b| / W, A_b = Σ w·correct, C_b = Σ w·confidence. The
//! confidence is the probability the model gives its predicted class (the
//! top class; binary: p when p > threshold, else 1 − p, which at the 0.5
//! threshold is max(p, 1 − p)), and correct is whether that class is the
//! label: the top-label ECE of the literature, the same for binary and
//! multiclass. Every sum is an `ExactSum`, so merged shards give the
//! one-pass value to the last bit.
//!
//! As an `Accumulator` (`crate::accumulator`), its laws hold exactly: per-bin counts are
//! integers and every sum an `ExactSum`.

use crate::accumulator::{added, Accumulator};
use crate::exact::ExactSum;
use serde_json::{json, Value};

/// Bins of `ece` when `--calibration-bins` is not given.
pub const DEFAULT_CALIBRATION_BINS: usize = 15;
/// The most bins `--calibration-bins` takes.
pub const MAX_CALIBRATION_BINS: usize = 10_000;

/// Per bin: examples, weight, Σ w·confidence and Σ w·correct.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Calibration {
    count: Vec<u64>,
    weight: Vec<ExactSum>,
    confidence: Vec<ExactSum>,
    correct: Vec<ExactSum>,
}

/// The upper edge of bin `k - 1` (lower edge of bin `k`): k/N, as the
/// record's `"edges"` carry it.
fn edge(k: usize, bins: usize) -> f64 {
    k as f64 / bins as f64
}

/// The bin of a confidence: the number of inner edges k/N (k = 1..N−1)
/// strictly below it, so a confidence on an edge belongs to the bin below.
pub fn bin_of(confidence: f64, bins: usize) -> usize {
    let last = bins - 1;
    let guess = (confidence * bins as f64).ceil();
    let mut b = if guess.is_nan() || guess < 1.0 { 0 } else { (guess as usize - 1).min(last) };
    // The product rounds: settle the guess against the edges themselves.
    while b > 0 && confidence <= edge(b, bins) {
        b -= 1;
    }
    while b < last && confidence > edge(b + 1, bins) {
        b += 1;
    }
    b
}

impl Calibration {
    pub(crate) fn new(bins: usize) -> Calibration {
        Calibration {
            count: vec![0; bins],
            weight: vec![ExactSum::default(); bins],
            confidence: vec![ExactSum::default(); bins],
            correct: vec![ExactSum::default(); bins],
        }
    }

    pub(crate) fn bins(&self) -> usize {
        self.count.len()
    }

    /// The reliability diagram.
    pub(crate) fn diagram(&self) -> ReliabilityDiagram {
        let bins = self.bins();
        let per_bin = |sums: &[ExactSum]| -> Vec<Option<f64>> {
            sums.iter()
                .zip(&self.weight)
                .map(|(s, w)| {
                    let w = w.value();
                    (w != 0.0).then(|| s.value() / w)
                })
                .collect()
        };
        ReliabilityDiagram {
            bins,
            edges: (0..=bins).map(|k| edge(k, bins)).collect(),
            count: self.count.clone(),
            weight: self.weight.iter().map(ExactSum::value).collect(),
            confidence: per_bin(&self.confidence),
            accuracy: per_bin(&self.correct),
        }
    }
}

impl Accumulator for Calibration {
    /// (confidence, correct, weight) of one example.
    type Input = (f64, bool, f64);
    /// ece.
    type Output = f64;
    /// The bins are checked against `MAX_CALIBRATION_BINS` only.
    type Bounds = ();

    fn add(&mut self, (confidence, correct, weight): (f64, bool, f64)) {
        let b = bin_of(confidence, self.bins());
        self.count[b] += 1;
        self.weight[b].add(weight);
        self.confidence[b].add(weight * confidence);
        if correct {
            self.correct[b].add(weight);
        }
    }

    fn merge(&mut self, other: &Calibration) -> Result<(), String> {
        if self.bins() != other.bins() {
            return Err(format!("{} calibration bins against {}", self.bins(), other.bins()));
        }
        for b in 0..self.bins() {
            self.count[b] = added("calibration counts", self.count[b], other.count[b])?;
            self.weight[b].merge(&other.weight[b]);
            self.confidence[b].merge(&other.confidence[b]);
            self.correct[b].merge(&other.correct[b]);
        }
        Ok(())
    }

    /// ece: Σ_b |A_b − C_b| / W; NaN when the weight is 0.
    fn finish(&self) -> f64 {
        let mut total = ExactSum::default();
        self.weight.iter().for_each(|w| total.merge(w));
        let total = total.value();
        if total == 0.0 {
            return f64::NAN;
        }
        let mut gap = ExactSum::default();
        for b in 0..self.bins() {
            gap.add((self.correct[b].value() - self.confidence[b].value()).abs());
        }
        gap.value() / total
    }

    /// `{"count": [..], "weight": [..], "confidence": [..], "correct": [..]}`, sums as `ExactSum` encodes them.
    fn encode(&self) -> Value {
        json!({
            "count": self.count,
            "weight": self.weight.iter().map(ExactSum::encode).collect::<Vec<_>>(),
            "confidence": self.confidence.iter().map(ExactSum::encode).collect::<Vec<_>>(),
            "correct": self.correct.iter().map(ExactSum::encode).collect::<Vec<_>>(),
        })
    }

    fn decode(value: &Value, _: ()) -> Result<Calibration, String> {
        let count: Vec<u64> = value["count"]
            .as_array()
            .and_then(|l| l.iter().map(Value::as_u64).collect())
            .filter(|l: &Vec<u64>| !l.is_empty() && l.len() <= MAX_CALIBRATION_BINS)
            .ok_or("calibration: \"count\" is not a list of counts")?;
        let sums = |key: &str| -> Result<Vec<ExactSum>, String> {
            let list = value[key].as_array().filter(|l| l.len() == count.len());
            let list = list.ok_or_else(|| format!("calibration: \"{key}\" is not {} sums", count.len()))?;
            list.iter().map(|sum| ExactSum::decode(sum, ())).collect()
        };
        Ok(Calibration { weight: sums("weight")?, confidence: sums("confidence")?, correct: sums("correct")?, count })
    }
}

/// The reliability diagram of the whole data: per bin, its edges, examples,
/// weight, mean confidence and accuracy (`None`, `null` in JSON, for a bin of no weight).
#[derive(Debug, Clone, PartialEq)]
pub struct ReliabilityDiagram {
    pub bins: usize,
    /// bins + 1 edges, 0 to 1.
    pub edges: Vec<f64>,
    pub count: Vec<u64>,
    pub weight: Vec<f64>,
    pub confidence: Vec<Option<f64>>,
    pub accuracy: Vec<Option<f64>>,
}

impl ReliabilityDiagram {
    /// `{"bins", "edges", "count", "weight", "confidence", "accuracy"}`.
    pub fn to_json(&self) -> Value {
        let numbers = |v: &[f64]| -> Value {
            v.iter()
                .map(|x| serde_json::Number::from_f64(*x).map_or(Value::Null, Value::Number))
                .collect::<Vec<_>>()
                .into()
        };
        json!({
            "bins": self.bins,
            "edges": numbers(&self.edges),
            "count": self.count,
            "weight": numbers(&self.weight),
            "confidence": numbers(&self.confidence.iter().map(|x| x.unwrap_or(f64::NAN)).collect::<Vec<_>>()),
            "accuracy": numbers(&self.accuracy.iter().map(|x| x.unwrap_or(f64::NAN)).collect::<Vec<_>>()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confidence_on_an_edge_belongs_to_the_bin_below() {
        assert_eq!(bin_of(0.0, 15), 0);
        assert_eq!(bin_of(-0.5, 15), 0);
        assert_eq!(bin_of(1.0, 15), 14);
        assert_eq!(bin_of(7.0, 15), 14);
        for bins in [1, 2, 10, 15, 20, 100] {
            for k in 1..bins {
                let e = edge(k, bins);
                assert_eq!(bin_of(e, bins), k - 1, "edge {k}/{bins}");
                assert_eq!(bin_of(f64::from_bits(e.to_bits() + 1), bins), k, "above edge {k}/{bins}");
            }
        }
        assert_eq!(bin_of(0.5, 10), 4);
        assert_eq!(bin_of(0.51, 10), 5);
    }

    #[test]
    fn ece_is_the_weighted_gap_per_bin() {
        let mut c = Calibration::new(2);
        // Bin 0: confidence 0.4 and 0.2 (weights 1 and 3), one right: A=1, C=1.0.
        c.add((0.4, true, 1.0));
        c.add((0.2, false, 3.0));
        // Bin 1: confidence 0.9 (weight 4), wrong: A=0, C=3.6.
        c.add((0.9, false, 4.0));
        assert!((c.finish() - (0.0 + 3.6) / 8.0).abs() < 1e-15);
        let d = c.diagram();
        assert_eq!(d.count, [2, 1]);
        assert_eq!(d.edges, [0.0, 0.5, 1.0]);
        assert!((d.confidence[0].unwrap() - 0.25).abs() < 1e-15);
        assert_eq!(d.accuracy, [Some(0.25), Some(0.0)]);
        assert_eq!(Calibration::new(3).diagram().accuracy, [None, None, None]);
        assert!(Calibration::new(3).finish().is_nan());
    }
}
