//! The caps that bound a metric state: how many distinct slice values,
//! scores and classes it keeps, and so its memory and the size of its JSON.
//! A leaf: the accumulators obey these caps when they fill the state, and
//! the codec holds a file to them when it reads one; both import them from
//! here, so the two cannot disagree.

/// The slice value that collects values past [`MAX_SLICE_VALUES`].
pub const OTHER_SLICE: &str = "__other__";
/// Distinct values kept per slice feature.
pub const MAX_SLICE_VALUES: usize = 1000;
/// Distinct scores kept exactly, over all classes, before AUC is bucketed.
pub const AUC_EXACT_CAP: usize = 1 << 18;
/// Buckets of a bucketed AUC.
pub const AUC_BUCKETS: usize = 1 << 16;
/// Distinct scores (and then buckets) per slice value.
pub const SLICE_AUC_CAP: usize = 1 << 10;
/// The most classes a confusion matrix is kept for (classes² counts) when
/// `--max-confusion-classes` is not given; past them, the top confusions.
pub const MAX_CONFUSION_CLASSES: usize = 1000;
/// The most classes a state read from JSON may have. A state's JSON is
/// untrusted (a shard report), and what is allocated for it grows with its
/// classes (three sums per class per bootstrap replicate): the class count
/// must be backed by that many per-class sums in the JSON itself, and may
/// never pass this bound, far past any classifier eval has met.
pub const MAX_CLASSES: usize = 1 << 20;

/// The exact-score cap and bucket count of the overall state's AUC curves
/// (one per class, or one): `AUC_EXACT_CAP` distinct scores and
/// `AUC_BUCKETS × 16` buckets shared out over the curves, within bounds.
pub(crate) fn overall_curve_sizes(curve_count: usize) -> (usize, usize) {
    let curve_count = curve_count.max(1);
    let cap = (AUC_EXACT_CAP / curve_count).max(1 << 12);
    let buckets = (AUC_BUCKETS * 16 / curve_count).clamp(1 << 10, AUC_BUCKETS);
    (cap, buckets)
}
