//! ROC AUC and average precision in bounded memory.
//!
//! A [`Curve`] keeps, per distinct score, the weight of positives and of
//! negatives seen with it; never the predictions. Sorting the distinct
//! scores at the end gives exactly scikit-learn's `roc_auc_score`
//! (trapezoids, so tied scores count half) and `average_precision_score`
//! (Σ (Rₙ − Rₙ₋₁) Pₙ over distinct thresholds). When the distinct scores
//! pass the curve's cap, the counts move into fixed buckets (over [0, 1]
//! when every score so far was a probability, else over the range seen so
//! far, later scores clamped into it) and the result is approximate: scores
//! in one bucket count as tied. `exact()` says which.

use std::collections::HashMap;

/// Counts of positive and negative weight per score.
#[derive(Debug, Clone)]
pub struct Curve {
    exact: HashMap<u64, (f64, f64)>,
    cap: usize,
    bucket_count: usize,
    buckets: Option<Buckets>,
}

#[derive(Debug, Clone)]
struct Buckets {
    low: f64,
    high: f64,
    counts: Vec<(f64, f64)>,
}

impl Buckets {
    fn index(&self, score: f64) -> usize {
        let n = self.counts.len();
        let at = ((score - self.low) / (self.high - self.low) * n as f64).floor();
        if at.is_nan() {
            0
        } else {
            (at.max(0.0) as usize).min(n - 1)
        }
    }
}

/// An order-preserving key for a finite score (`-0.0` is `0.0`).
fn key(score: f64) -> u64 {
    let bits = (score + 0.0).to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

fn unkey(key: u64) -> f64 {
    if key >> 63 == 1 {
        f64::from_bits(key & !(1 << 63))
    } else {
        f64::from_bits(!key)
    }
}

impl Curve {
    /// A curve exact up to `cap` distinct scores, then `buckets` buckets.
    pub fn new(cap: usize, buckets: usize) -> Curve {
        Curve { exact: HashMap::new(), cap, bucket_count: buckets.max(2), buckets: None }
    }

    /// Adds one example's score.
    pub fn add(&mut self, score: f64, positive: bool, weight: f64) {
        let (pos, neg) = if positive { (weight, 0.0) } else { (0.0, weight) };
        self.add_counts(score, pos, neg);
    }

    fn switch_to_buckets(&mut self) {
        let scores = self.exact.keys().map(|&k| unkey(k));
        let (low, high) = scores.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), s| (l.min(s), h.max(s)));
        let (low, high) = if low >= 0.0 && high <= 1.0 { (0.0, 1.0) } else { (low, high) };
        let mut buckets = Buckets { low, high, counts: vec![(0.0, 0.0); self.bucket_count] };
        for (k, (pos, neg)) in self.exact.drain() {
            let i = buckets.index(unkey(k));
            buckets.counts[i].0 += pos;
            buckets.counts[i].1 += neg;
        }
        self.exact = HashMap::new();
        self.buckets = Some(buckets);
    }

    /// Adds the counts of `other` (another part of the same data): the
    /// curve one pass over both parts would hold. Exact maps join while the
    /// distinct scores stay within the cap (a pass would have bucketed past
    /// it too); bucketed counts of the same range add bucket by bucket
    /// (probabilities always bucket over [0, 1]); else the other's buckets
    /// are placed by their middle score, approximate as bucketing is.
    pub fn merge(&mut self, other: &Curve) {
        match (&mut self.buckets, &other.buckets) {
            (_, None) => {
                for (&k, &(pos, neg)) in &other.exact {
                    self.add_counts(unkey(k), pos, neg);
                }
            }
            (None, Some(_)) => {
                let mut merged = other.clone();
                for (&k, &(pos, neg)) in &self.exact {
                    merged.add_counts(unkey(k), pos, neg);
                }
                *self = merged;
            }
            (Some(mine), Some(theirs)) => {
                let same =
                    mine.low == theirs.low && mine.high == theirs.high && mine.counts.len() == theirs.counts.len();
                let n = theirs.counts.len() as f64;
                for (i, &(pos, neg)) in theirs.counts.iter().enumerate() {
                    let at = if same {
                        i
                    } else {
                        mine.index(theirs.low + (i as f64 + 0.5) / n * (theirs.high - theirs.low))
                    };
                    mine.counts[at].0 += pos;
                    mine.counts[at].1 += neg;
                }
            }
        }
    }

    /// Adds weights of positives and negatives at one score.
    fn add_counts(&mut self, score: f64, pos: f64, neg: f64) {
        if let Some(buckets) = &mut self.buckets {
            let i = buckets.index(score);
            buckets.counts[i].0 += pos;
            buckets.counts[i].1 += neg;
            return;
        }
        let entry = self.exact.entry(key(score)).or_insert((0.0, 0.0));
        entry.0 += pos;
        entry.1 += neg;
        if self.exact.len() > self.cap {
            self.switch_to_buckets();
        }
    }

    /// `{"cap", "buckets", "scores": [[score, pos, neg], ...]}` (scores
    /// increasing) while exact, else `{"cap", "buckets", "low", "high",
    /// "counts": [[bucket, pos, neg], ...]}` (the non-empty buckets).
    pub fn to_json(&self) -> serde_json::Value {
        let number = |v: f64| serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into);
        let mut object = serde_json::Map::new();
        object.insert("cap".into(), self.cap.into());
        object.insert("buckets".into(), self.bucket_count.into());
        match &self.buckets {
            None => {
                let mut keys: Vec<(&u64, &(f64, f64))> = self.exact.iter().collect();
                keys.sort_unstable_by_key(|(k, _)| **k);
                let scores =
                    keys.into_iter().map(|(&k, &(p, n))| serde_json::json!([number(unkey(k)), number(p), number(n)]));
                object.insert("scores".into(), scores.collect());
            }
            Some(b) => {
                object.insert("low".into(), number(b.low));
                object.insert("high".into(), number(b.high));
                let counts = b.counts.iter().enumerate().filter(|(_, &(p, n))| p != 0.0 || n != 0.0);
                object.insert(
                    "counts".into(),
                    counts.map(|(i, &(p, n))| serde_json::json!([i, number(p), number(n)])).collect(),
                );
            }
        }
        serde_json::Value::Object(object)
    }

    /// The curve of [`Curve::to_json`]; `Err` says what is wrong. Its
    /// buckets are allocated in full when it is bucketed, so the JSON (a
    /// file's) may claim at most `max_buckets`: what eval makes for its place.
    pub fn from_json(value: &serde_json::Value, max_buckets: usize) -> Result<Curve, String> {
        let count = |key: &str| {
            value[key]
                .as_u64()
                .filter(|n| (1..=1 << 24).contains(n))
                .ok_or_else(|| format!("curve: no \"{key}\" count"))
        };
        let buckets = count("buckets")?;
        if buckets > max_buckets as u64 {
            return Err(format!("curve: {buckets} buckets, more than the {max_buckets} of its place"));
        }
        let mut curve = Curve::new(count("cap")? as usize, buckets as usize);
        let float = |v: &serde_json::Value| if v.is_null() { Some(f64::NAN) } else { v.as_f64() };
        let triple = |entry: &serde_json::Value| -> Result<(f64, f64, f64), String> {
            match entry.as_array().map(Vec::as_slice) {
                Some([a, b, c]) => match (float(a), float(b), float(c)) {
                    (Some(a), Some(b), Some(c)) => Ok((a, b, c)),
                    _ => Err(format!("curve: {entry} is not three numbers")),
                },
                _ => Err(format!("curve: {entry} is not [score, positives, negatives]")),
            }
        };
        if let Some(scores) = value["scores"].as_array() {
            if scores.len() > curve.cap {
                return Err(format!("curve: {} scores, past its cap of {}", scores.len(), curve.cap));
            }
            for entry in scores {
                let (score, pos, neg) = triple(entry)?;
                if !score.is_finite() {
                    return Err(format!("curve: score {entry} is not finite"));
                }
                curve.exact.insert(key(score), (pos, neg));
            }
        } else if let Some(counts) = value["counts"].as_array() {
            let (Some(low), Some(high)) = (value["low"].as_f64(), value["high"].as_f64()) else {
                return Err("curve: bucketed without \"low\" and \"high\"".into());
            };
            let mut buckets = Buckets { low, high, counts: vec![(0.0, 0.0); curve.bucket_count] };
            for entry in counts {
                let (i, pos, neg) = triple(entry)?;
                let slot = buckets
                    .counts
                    .get_mut(i as usize)
                    .filter(|_| i >= 0.0 && i.fract() == 0.0)
                    .ok_or_else(|| format!("curve: bucket {i} of {}", curve.bucket_count))?;
                *slot = (pos, neg);
            }
            curve.buckets = Some(buckets);
        } else {
            return Err("curve: neither \"scores\" nor \"counts\"".into());
        }
        Ok(curve)
    }

    /// Whether the counts are per distinct score (not bucketed).
    pub fn exact(&self) -> bool {
        self.buckets.is_none()
    }

    /// (positive, negative) weight per score, highest score first.
    fn points(&self) -> Vec<(f64, f64)> {
        match &self.buckets {
            Some(b) => b.counts.iter().rev().copied().filter(|&(p, n)| p != 0.0 || n != 0.0).collect(),
            None => {
                let mut keys: Vec<(&u64, &(f64, f64))> = self.exact.iter().collect();
                keys.sort_unstable_by(|a, b| b.0.cmp(a.0));
                keys.into_iter().map(|(_, &c)| c).collect()
            }
        }
    }

    /// ROC AUC; NaN without positives or without negatives.
    pub fn roc_auc(&self) -> f64 {
        let points = self.points();
        let total_pos: f64 = points.iter().map(|p| p.0).sum();
        let total_neg: f64 = points.iter().map(|p| p.1).sum();
        if total_pos <= 0.0 || total_neg <= 0.0 {
            return f64::NAN;
        }
        let mut area = 0.0;
        let mut tp = 0.0;
        for (pos, neg) in points {
            area += neg * (tp + pos / 2.0);
            tp += pos;
        }
        area / (total_pos * total_neg)
    }

    /// Average precision; NaN without positives.
    pub fn average_precision(&self) -> f64 {
        let points = self.points();
        let total_pos: f64 = points.iter().map(|p| p.0).sum();
        if total_pos <= 0.0 {
            return f64::NAN;
        }
        let (mut tp, mut fp, mut ap, mut last_recall) = (0.0, 0.0, 0.0, 0.0);
        for (pos, neg) in points {
            tp += pos;
            fp += neg;
            let recall = tp / total_pos;
            if tp + fp > 0.0 {
                ap += (recall - last_recall) * (tp / (tp + fp));
            }
            last_recall = recall;
        }
        ap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_order() {
        let scores = [-3.5, -1e-300, 0.0, 1e-300, 0.25, 7.0];
        for w in scores.windows(2) {
            assert!(key(w[0]) < key(w[1]), "{} < {}", w[0], w[1]);
            assert_eq!(unkey(key(w[0])), w[0]);
        }
        assert_eq!(key(-0.0), key(0.0));
    }

    #[test]
    fn ties_count_half() {
        let mut c = Curve::new(100, 10);
        c.add(0.5, true, 1.0);
        c.add(0.5, false, 1.0);
        assert_eq!(c.roc_auc(), 0.5);
        c.add(0.9, true, 1.0);
        c.add(0.1, false, 1.0);
        // pairs: (0.9,+) beats both negatives; (0.5,+) beats 0.1 and ties 0.5.
        assert_eq!(c.roc_auc(), (2.0 + 1.5) / 4.0);
    }
}
