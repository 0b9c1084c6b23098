//! The top confusions of a classifier with too many classes for a full
//! confusion matrix (past `--max-confusion-classes`): classes² counts are
//! 20 GB at 50,000 classes, so only the most frequent (true, predicted)
//! pairs are kept, in bounded memory.
//!
//! It is a Misra–Gries summary of the off-diagonal pairs (the mergeable
//! version of Agarwal et al. 2012): at most [`TOP_CONFUSION_ENTRIES`]
//! counters; a pair not among them when they are full takes one from every
//! counter instead (those at 0 are dropped). A kept count is never above the
//! pair's true count and at most `max_error` below it, `max_error` being
//! what was taken from every counter (≤ off-diagonal examples /
//! (entries + 1)); any pair whose true count exceeds `max_error` is kept.
//! While fewer distinct pairs than entries were ever confused,
//! `max_error` is 0 and every count is exact (`top_confusions_exact`).
//! Merging two summaries adds their counters, then, past the entries, takes
//! the (entries + 1)-th largest count from each (added to `max_error`), so
//! the same bound holds for merged shards, though which pairs survive near
//! the bound can depend on the split. Counts are examples, unweighted, as
//! the full matrix's.
//!
//! As an `Accumulator` (`crate::accumulator`): while `max_error` stays 0 (fewer distinct pairs
//! than entries), merging is exact, associative and commutative, and any
//! split gives the one-pass counts; past that, what holds of every split
//! and order is the bound above (a kept count ≤ the truth ≤ it +
//! `max_error`), not the counts themselves.

use crate::accumulator::{added, Accumulator};
use serde_json::{json, Value};
use std::collections::HashMap;

/// Counters the summary keeps (~0.5 MB in memory, ~0.4 MB in a state's JSON).
pub const TOP_CONFUSION_ENTRIES: usize = 1 << 14;
/// Pairs a record lists in `"top_confusions"`.
pub const TOP_CONFUSIONS_SHOWN: usize = 20;

/// A bounded summary of off-diagonal (true, predicted) counts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TopConfusions {
    entries: usize,
    counts: HashMap<(u32, u32), u64>,
    /// Taken from every counter so far: the most a kept count is below the truth.
    max_error: u64,
}

/// One (true, predicted) pair of the top confusions and its count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confusion {
    pub truth: usize,
    pub predicted: usize,
    pub count: u64,
}

/// The top pairs of a record: by count, then by true and predicted class.
#[derive(Debug, Clone, PartialEq)]
pub struct TopConfusionsSummary {
    pub top: Vec<Confusion>,
    /// Every count exact (nothing was ever taken from the counters).
    pub exact: bool,
    /// How far below the truth a count may be.
    pub max_error: u64,
}

impl TopConfusions {
    pub(crate) fn new(entries: usize) -> TopConfusions {
        TopConfusions { entries: entries.max(1), counts: HashMap::new(), max_error: 0 }
    }

    pub(crate) fn summary(&self, shown: usize) -> TopConfusionsSummary {
        let mut pairs: Vec<Confusion> = self
            .counts
            .iter()
            .map(|(&(t, p), &count)| Confusion { truth: t as usize, predicted: p as usize, count })
            .collect();
        pairs.sort_by(|a, b| b.count.cmp(&a.count).then(a.truth.cmp(&b.truth)).then(a.predicted.cmp(&b.predicted)));
        pairs.truncate(shown);
        TopConfusionsSummary { top: pairs, exact: self.max_error == 0, max_error: self.max_error }
    }
}

impl Accumulator for TopConfusions {
    /// (true class, predicted class) of one example.
    type Input = (usize, usize);
    /// The top [`TOP_CONFUSIONS_SHOWN`] pairs.
    type Output = TopConfusionsSummary;
    /// The classes of the state: every pair read must be of them.
    type Bounds = usize;

    /// One example: nothing when it was classified right.
    fn add(&mut self, (truth, predicted): (usize, usize)) {
        if truth == predicted {
            return;
        }
        let key = (truth as u32, predicted as u32);
        if let Some(count) = self.counts.get_mut(&key) {
            *count += 1;
        } else if self.counts.len() < self.entries {
            self.counts.insert(key, 1);
        } else {
            // Full: this example and one of each counter cancel out.
            self.counts.values_mut().for_each(|c| *c -= 1);
            self.counts.retain(|_, c| *c > 0);
            self.max_error += 1;
        }
    }

    /// Adds `other`'s counters; `Err` when a count would pass `u64::MAX`
    /// (counts come from files): nothing is then to be trusted of the result.
    fn merge(&mut self, other: &TopConfusions) -> Result<(), String> {
        for (key, count) in &other.counts {
            let mine = self.counts.entry(*key).or_insert(0);
            *mine = added("top confusion counts", *mine, *count)?;
        }
        self.max_error = added("top confusion errors", self.max_error, other.max_error)?;
        if self.counts.len() > self.entries {
            let mut values: Vec<u64> = self.counts.values().copied().collect();
            values.sort_unstable_by(|a, b| b.cmp(a));
            let cut = values[self.entries];
            self.counts.values_mut().for_each(|c| *c = c.saturating_sub(cut));
            self.counts.retain(|_, c| *c > 0);
            self.max_error = added("top confusion errors", self.max_error, cut)?;
        }
        Ok(())
    }

    fn finish(&self) -> TopConfusionsSummary {
        self.summary(TOP_CONFUSIONS_SHOWN)
    }

    /// `{"entries", "max_error", "counts": [[true, predicted, count], ..]}`, sorted.
    fn encode(&self) -> Value {
        let mut counts: Vec<[u64; 3]> =
            self.counts.iter().map(|(&(t, p), &c)| [u64::from(t), u64::from(p), c]).collect();
        counts.sort_unstable();
        json!({ "entries": self.entries, "max_error": self.max_error, "counts": counts })
    }

    fn decode(value: &Value, classes: usize) -> Result<TopConfusions, String> {
        let entries = value["entries"].as_u64().filter(|&e| e >= 1).ok_or("top_confusions: no \"entries\"")? as usize;
        let max_error = value["max_error"].as_u64().ok_or("top_confusions: no \"max_error\"")?;
        let list = value["counts"].as_array().ok_or("top_confusions: no \"counts\" list")?;
        if list.len() > entries {
            return Err(format!("top_confusions: {} counts for {entries} entries", list.len()));
        }
        let mut counts = HashMap::with_capacity(list.len());
        for item in list {
            let triple = item.as_array().and_then(|t| t.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>());
            match triple.as_deref() {
                Some(&[t, p, c]) if (t as usize) < classes && (p as usize) < classes && t != p && c > 0 => {
                    counts.insert((t as u32, p as u32), c);
                }
                _ => {
                    return Err(format!("top_confusions: {item} is not [true, predicted, count] of {classes} classes"))
                }
            }
        }
        Ok(TopConfusions { entries, counts, max_error })
    }
}

impl TopConfusionsSummary {
    /// `[{"true", "predicted", "count"}, ..]`.
    pub fn to_json(&self) -> Value {
        self.top.iter().map(|c| json!({"true": c.truth, "predicted": c.predicted, "count": c.count})).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_while_few_pairs_and_bounded_past_them() {
        let mut s = TopConfusions::new(4);
        for _ in 0..10 {
            s.add((1, 2));
        }
        s.add((3, 3));
        s.add((2, 1));
        let summary = s.summary(20);
        assert!(summary.exact);
        assert_eq!(summary.top[0], Confusion { truth: 1, predicted: 2, count: 10 });
        assert_eq!(summary.top.len(), 2);
        // 20 pairs seen once each: the counters cannot hold them, the frequent pair stays.
        for k in 0..20 {
            s.add((10 + k, 40 + k));
        }
        let summary = s.summary(1);
        assert!(!summary.exact);
        assert_eq!((summary.top[0].truth, summary.top[0].predicted), (1, 2));
        assert!(summary.top[0].count <= 10 && summary.top[0].count + summary.max_error >= 10);
        assert!(s.counts.len() <= 4);
    }

    #[test]
    fn merged_summaries_keep_the_bound() {
        let (mut a, mut b) = (TopConfusions::new(3), TopConfusions::new(3));
        for k in 0..6 {
            a.add((0, 1));
            b.add((0, 1));
            a.add((k + 2, 1));
            b.add((1, k + 2));
        }
        a.merge(&b).unwrap();
        let summary = a.summary(1);
        assert_eq!((summary.top[0].truth, summary.top[0].predicted), (0, 1));
        assert!(summary.top[0].count <= 12 && summary.top[0].count + summary.max_error >= 12);
        assert!(a.counts.len() <= 3);
        let back = TopConfusions::decode(&a.encode(), 10).unwrap();
        assert_eq!(back, a);
    }
}
