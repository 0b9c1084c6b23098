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
//!
//! A curve read back (`Accumulator::decode`) is a file's claim: it holds its
//! buckets' counts only as far as the file backs them. Buckets are held one
//! by one (a map of the buckets with counts) until a quarter of them have
//! some, and only then as one array of them all, so an empty curve claiming
//! a thousand buckets costs what its few bytes do. Which way they are held
//! never changes a count, nor the order counts are added in.
//!
//! As an [`Accumulator`]: the per-score counts are plain sums, so the laws
//! hold exactly for weights whose sums do not round (unweighted examples:
//! whole counts), else to the rounding of a few terms per score; merged
//! exact curves stay exact while the distinct scores fit the cap, and a
//! curve bucketed over [0, 1] (probabilities) merges bucket by bucket.

use crate::accumulator::Accumulator;
use std::collections::{BTreeMap, HashMap};

/// Bucket counts are held as one array of every bucket once at least one
/// bucket in this many has counts; before, only the buckets that have.
const DENSE_SHARE: usize = 4;

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
    /// How many buckets span [low, high].
    count: usize,
    counts: Counts,
}

/// The (positive, negative) weights of the buckets.
#[derive(Debug, Clone)]
enum Counts {
    /// Every bucket's, by index.
    Dense(Vec<(f64, f64)>),
    /// Those of the buckets that have been given any, by index.
    Sparse(BTreeMap<usize, (f64, f64)>),
}

impl Buckets {
    /// No counts yet, held as an array when `backing` (counts about to be
    /// added, or entries read) reach a quarter of `count`, else as a map.
    fn new(low: f64, high: f64, count: usize, backing: usize) -> Buckets {
        let counts = if backing.saturating_mul(DENSE_SHARE) >= count {
            Counts::Dense(vec![(0.0, 0.0); count])
        } else {
            Counts::Sparse(BTreeMap::new())
        };
        Buckets { low, high, count, counts }
    }

    fn index(&self, score: f64) -> usize {
        let n = self.count;
        let at = ((score - self.low) / (self.high - self.low) * n as f64).floor();
        if at.is_nan() {
            0
        } else {
            (at.max(0.0) as usize).min(n - 1)
        }
    }

    /// The counts of bucket `i` (< `count`), held from now on.
    fn slot(&mut self, i: usize) -> &mut (f64, f64) {
        if let Counts::Sparse(map) = &self.counts {
            if !map.contains_key(&i) && (map.len() + 1).saturating_mul(DENSE_SHARE) >= self.count {
                let mut dense = vec![(0.0, 0.0); self.count];
                for (&at, &counts) in map {
                    dense[at] = counts;
                }
                self.counts = Counts::Dense(dense);
            }
        }
        match &mut self.counts {
            Counts::Dense(all) => &mut all[i],
            Counts::Sparse(map) => map.entry(i).or_insert((0.0, 0.0)),
        }
    }

    /// Adds weights to bucket `i` (< `count`).
    fn add(&mut self, i: usize, pos: f64, neg: f64) {
        let slot = self.slot(i);
        slot.0 += pos;
        slot.1 += neg;
    }

    /// (index, counts) of the buckets held, lowest first (every bucket when
    /// held as an array).
    fn held(&self) -> Box<dyn DoubleEndedIterator<Item = (usize, (f64, f64))> + '_> {
        match &self.counts {
            Counts::Dense(all) => Box::new(all.iter().copied().enumerate()),
            Counts::Sparse(map) => Box::new(map.iter().map(|(&i, &c)| (i, c))),
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

    fn switch_to_buckets(&mut self) {
        let scores = self.exact.keys().map(|&k| unkey(k));
        let (low, high) = scores.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), s| (l.min(s), h.max(s)));
        let (low, high) = if low >= 0.0 && high <= 1.0 { (0.0, 1.0) } else { (low, high) };
        let mut buckets = Buckets::new(low, high, self.bucket_count, self.exact.len());
        for (k, (pos, neg)) in self.exact.drain() {
            let i = buckets.index(unkey(k));
            buckets.add(i, pos, neg);
        }
        self.exact = HashMap::new();
        self.buckets = Some(buckets);
    }

    /// Adds weights of positives and negatives at one score.
    fn add_counts(&mut self, score: f64, pos: f64, neg: f64) {
        if let Some(buckets) = &mut self.buckets {
            let i = buckets.index(score);
            buckets.add(i, pos, neg);
            return;
        }
        let entry = self.exact.entry(key(score)).or_insert((0.0, 0.0));
        entry.0 += pos;
        entry.1 += neg;
        if self.exact.len() > self.cap {
            self.switch_to_buckets();
        }
    }

    /// Whether the counts are per distinct score (not bucketed).
    pub fn exact(&self) -> bool {
        self.buckets.is_none()
    }

    /// (positive, negative) weight per score, highest score first.
    fn points(&self) -> Vec<(f64, f64)> {
        match &self.buckets {
            Some(b) => b.held().rev().map(|(_, c)| c).filter(|&(p, n)| p != 0.0 || n != 0.0).collect(),
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

impl Accumulator for Curve {
    /// (score, positive, weight) of one example.
    type Input = (f64, bool, f64);
    /// (ROC AUC, average precision).
    type Output = (f64, f64);
    /// The most buckets the curve's place holds.
    type Bounds = usize;

    fn add(&mut self, (score, positive, weight): (f64, bool, f64)) {
        let (pos, neg) = if positive { (weight, 0.0) } else { (0.0, weight) };
        self.add_counts(score, pos, neg);
    }

    /// Adds the counts of `other` (another part of the same data): the
    /// curve one pass over both parts would hold. Exact maps join while the
    /// distinct scores stay within the cap (a pass would have bucketed past
    /// it too); bucketed counts of the same range add bucket by bucket
    /// (probabilities always bucket over [0, 1]); else the other's buckets
    /// are placed by their middle score, approximate as bucketing is.
    fn merge(&mut self, other: &Curve) -> Result<(), String> {
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
                let same = mine.low == theirs.low && mine.high == theirs.high && mine.count == theirs.count;
                let n = theirs.count as f64;
                for (i, (pos, neg)) in theirs.held() {
                    let at = if same {
                        i
                    } else {
                        mine.index(theirs.low + (i as f64 + 0.5) / n * (theirs.high - theirs.low))
                    };
                    mine.add(at, pos, neg);
                }
            }
        }
        Ok(())
    }

    fn finish(&self) -> (f64, f64) {
        (self.roc_auc(), self.average_precision())
    }

    /// `{"cap", "buckets", "scores": [[score, pos, neg], ...]}` (scores
    /// increasing) while exact, else `{"cap", "buckets", "low", "high",
    /// "counts": [[bucket, pos, neg], ...]}` (the non-empty buckets).
    fn encode(&self) -> serde_json::Value {
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
                let counts = b.held().filter(|&(_, (p, n))| p != 0.0 || n != 0.0);
                object.insert(
                    "counts".into(),
                    counts.map(|(i, (p, n))| serde_json::json!([i, number(p), number(n)])).collect(),
                );
            }
        }
        serde_json::Value::Object(object)
    }

    /// The curve of [`Curve::encode`]; `Err` says what is wrong. The JSON
    /// (a file's) may claim at most `max_buckets` buckets, what eval makes
    /// for its place; only those its counts name are held (see the module doc).
    fn decode(value: &serde_json::Value, max_buckets: usize) -> Result<Curve, String> {
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
            let mut buckets = Buckets::new(low, high, curve.bucket_count, counts.len());
            for entry in counts {
                let (i, pos, neg) = triple(entry)?;
                if !(i >= 0.0 && i.fract() == 0.0 && i < curve.bucket_count as f64) {
                    return Err(format!("curve: bucket {i} of {}", curve.bucket_count));
                }
                *buckets.slot(i as usize) = (pos, neg);
            }
            curve.buckets = Some(buckets);
        } else {
            return Err("curve: neither \"scores\" nor \"counts\"".into());
        }
        Ok(curve)
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

    /// How many buckets' counts `curve` holds, and whether as one array.
    fn held(curve: &Curve) -> (usize, bool) {
        match &curve.buckets.as_ref().expect("bucketed").counts {
            Counts::Dense(all) => (all.len(), true),
            Counts::Sparse(map) => (map.len(), false),
        }
    }

    /// `curve` with its buckets held one by one (those with counts).
    fn sparse(curve: &Curve) -> Curve {
        let mut sparse = curve.clone();
        let buckets = sparse.buckets.as_mut().expect("bucketed");
        let held = buckets.held().filter(|&(_, (p, n))| p != 0.0 || n != 0.0).collect();
        buckets.counts = Counts::Sparse(held);
        sparse
    }

    /// A bucketed curve (cap 50, 64 buckets) of `n` scores from `seed`, over `[low, high)`.
    fn bucketed(seed: u64, n: usize, low: f64, high: f64) -> Curve {
        let mut curve = Curve::new(50, 64);
        let mut x = seed;
        for i in 0..n {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let score = low + (x >> 11) as f64 / (1u64 << 53) as f64 * (high - low);
            curve.add((score, (x >> 7).is_multiple_of(3), 0.5 + (i % 4) as f64 * 0.25));
        }
        assert!(!curve.exact());
        curve
    }

    fn same(a: &Curve, b: &Curve) {
        assert_eq!(a.encode(), b.encode());
        assert_eq!(a.roc_auc().to_bits(), b.roc_auc().to_bits());
        assert_eq!(a.average_precision().to_bits(), b.average_precision().to_bits());
    }

    #[test]
    fn a_curve_read_holds_only_the_buckets_its_json_gives_counts_for() {
        let empty = serde_json::json!({"cap": 1, "buckets": 1024, "low": 0.0, "high": 1.0, "counts": []});
        let curve = Curve::decode(&empty, 1024).unwrap();
        assert_eq!(held(&curve), (0, false));
        assert!(curve.roc_auc().is_nan());

        let one = serde_json::json!({"cap": 1, "buckets": 1024, "low": 0.0, "high": 1.0, "counts": [[1023, 2.0, 1.0]]});
        let mut curve = Curve::decode(&one, 1024).unwrap();
        assert_eq!(held(&curve), (1, false));
        // Merged with another empty one, it holds no more.
        curve.merge(&Curve::decode(&empty, 1024).unwrap()).unwrap();
        assert_eq!(held(&curve), (1, false));
        assert_eq!(curve.encode(), one);

        // Exact curves capped at one score, merged: bucketed, holding the two buckets.
        let mut a = Curve::decode(&serde_json::json!({"cap": 1, "buckets": 1024, "scores": [[0.25, 1, 0]]}), 1024);
        let b = Curve::decode(&serde_json::json!({"cap": 1, "buckets": 1024, "scores": [[0.75, 0, 1]]}), 1024);
        let a = a.as_mut().unwrap();
        a.merge(&b.unwrap()).unwrap();
        assert_eq!(held(a), (2, false));
        assert_eq!(a.roc_auc(), 0.0);

        let past = serde_json::json!({"cap": 1, "buckets": 16, "low": 0.0, "high": 1.0, "counts": [[16, 1.0, 0.0]]});
        assert_eq!(Curve::decode(&past, 16).unwrap_err(), "curve: bucket 16 of 16");
    }

    #[test]
    fn buckets_become_one_array_once_a_quarter_of_them_hold_counts() {
        let empty = serde_json::json!({"cap": 1, "buckets": 16, "low": 0.0, "high": 1.0, "counts": []});
        let mut curve = Curve::decode(&empty, 16).unwrap();
        for (i, score) in [0.01, 0.2, 0.4].into_iter().enumerate() {
            curve.add((score, true, 1.0));
            assert_eq!(held(&curve), (i + 1, false));
        }
        curve.add((0.41, false, 1.0));
        assert_eq!(held(&curve), (3, false));
        curve.add((0.9, false, 1.0));
        assert_eq!(held(&curve), (16, true));
        // Eval's own curves past their cap: as one array from the start.
        assert_eq!(held(&bucketed(1, 200, 0.0, 1.0)), (64, true));
    }

    #[test]
    fn buckets_held_one_by_one_or_as_an_array_give_the_same_curve_to_the_bit() {
        for (low, high) in [(0.0, 1.0), (-3.0, 5.0)] {
            let (a, b) = (bucketed(1, 300, low, high), bucketed(2, 500, low, high));
            let (sparse_a, sparse_b) = (sparse(&a), sparse(&b));
            assert!(!held(&sparse_a).1);
            same(&a, &sparse_a);
            let mut dense = a.clone();
            dense.merge(&b).unwrap();
            for (mine, theirs) in [(&sparse_a, &sparse_b), (&sparse_a, &b), (&a, &sparse_b)] {
                let mut merged = mine.clone();
                merged.merge(theirs).unwrap();
                same(&dense, &merged);
            }
            // Another range: the other's buckets placed by their middle score.
            let other = bucketed(3, 400, low - 1.0, high + 2.0);
            let mut dense = a.clone();
            dense.merge(&other).unwrap();
            let mut merged = sparse_a.clone();
            merged.merge(&sparse(&other)).unwrap();
            same(&dense, &merged);
            // Read back from its JSON (only the buckets with counts).
            same(&dense, &Curve::decode(&dense.encode(), 64).unwrap());
            // More scores added after.
            let (mut dense, mut merged) = (a.clone(), sparse_a.clone());
            for i in 0..100 {
                let score = low + (high - low) * (i as f64 / 100.0);
                dense.add((score, i % 2 == 0, 1.0));
                merged.add((score, i % 2 == 0, 1.0));
            }
            same(&dense, &merged);
        }
    }

    #[test]
    fn ties_count_half() {
        let mut c = Curve::new(100, 10);
        c.add((0.5, true, 1.0));
        c.add((0.5, false, 1.0));
        assert_eq!(c.roc_auc(), 0.5);
        c.add((0.9, true, 1.0));
        c.add((0.1, false, 1.0));
        // pairs: (0.9,+) beats both negatives; (0.5,+) beats 0.1 and ties 0.5.
        assert_eq!(c.roc_auc(), (2.0 + 1.5) / 4.0);
    }
}
