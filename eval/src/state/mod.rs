//! The metric state of one model over some examples: everything the
//! metrics are computed from (counts, sums, confusion counts, per-score
//! positive and negative weights for AUC, per-slice states), and nothing
//! else. It is what `isorun eval --data-shard K/N` writes into a record and
//! what `isorun report merge` joins: [`MetricState::merge`] of the states of
//! any split of the data, finished with `Evaluation::from_state`, gives the
//! metrics of one pass over all of it.
//!
//! Exactness: counts are integers; every sum of weights, losses and errors
//! is an `ExactSum` (exact whatever the order of its terms; the terms are
//! per-example values, computed the same way on any machine), so those
//! metrics are the same to the last bit. AUC and average precision keep the
//! weight of positives and negatives per distinct score: unweighted, those
//! are exact integer counts and the merged AUC is the one-pass AUC exactly;
//! with `--weight`, a score's weights are plain sums (each score's few
//! examples, rounded in another order: ~1e-16 relative). A curve past its
//! cap is bucketed, here as in one pass (`auc_exact: false`, and `exact` in
//! the state's JSON). Slices past [`MAX_SLICE_VALUES`] values: which values
//! get their own state depends on the order the values came in, and merged
//! shards see them in shard order.
//!
//! The files: `task` holds one task's state and the layout of its sums (a
//! leaf the bootstrap replicates share), `metric_state` the aggregate and
//! its merge, `codec` the JSON, `limits` the caps they all obey; every part
//! keeps the contract of `crate::accumulator`, whose laws `laws` tests.

mod codec;
#[cfg(test)]
mod laws;
mod limits;
mod metric_state;
pub(crate) mod task;

pub use codec::{StateError, STATE_VERSION};
pub(crate) use limits::overall_curve_sizes;
pub use limits::{
    AUC_BUCKETS, AUC_EXACT_CAP, MAX_CLASSES, MAX_CONFUSION_CLASSES, MAX_SLICE_VALUES, OTHER_SLICE, SLICE_AUC_CAP,
};
pub use metric_state::{MergeError, MetricState};
