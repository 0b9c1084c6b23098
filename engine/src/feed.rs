//! Units fed a stream of batches instead of one set of inputs: what
//! `isorun eval` runs. The engine starts the worker, then asks the unit's
//! [`FeedStream`] for batch after batch, sends each to the same worker
//! (which keeps the model loaded), and hands every batch's checked outputs
//! back to the stream, which scores them and keeps nothing else. The engine
//! knows nothing of datasets or metrics: a feed is whatever yields input
//! tensors and consumes outputs. A retry opens a new stream, from the first
//! batch.

use crate::discover::Model;
use isorun_protocol::{Outcome, Tensor};

/// Opens one stream of batches per attempt at a unit.
pub trait Feed: Sync {
    /// The batches for `model`; an `Err` is the unit's outcome (e.g. its
    /// signature has an input the data does not have).
    fn open(&self, model: &Model) -> Result<Box<dyn FeedStream + '_>, Outcome>;

    /// Called for each SavedModel before any worker starts: an outcome (its
    /// inputs cannot fit its signature) ends the unit at once, with no
    /// worker. `None` (the default): the unit runs, and [`open`](Self::open)
    /// decides again.
    fn check(&self, _model: &Model) -> Option<Outcome> {
        None
    }

    /// [`check`](Self::check) for a Keras file (`.keras`, `.h5`), from the
    /// file alone, before it is exported: an outcome ends the unit with no
    /// export and no worker. `None` (the default): it is exported and runs.
    fn check_keras_file(&self, _model: &Model) -> Option<Outcome> {
        None
    }
}

/// One attempt's batches: called from the slot's thread only.
pub trait FeedStream: Send {
    /// The inputs of the next batch, `None` at the end; an `Err` (a corrupt
    /// record) ends the unit with that outcome.
    fn next_batch(&mut self) -> Option<Result<Vec<(String, Tensor)>, Outcome>>;
    /// The signature the batch last given runs; `None` (the default): the
    /// settings' signature. (TF Serving's warm-up requests each name theirs.)
    fn signature(&self) -> Option<&str> {
        None
    }
    /// The checked outputs of the batch last given; an `Err` (outputs that
    /// cannot be scored) ends the unit with that outcome.
    fn accept(&mut self, outputs: Vec<(String, Tensor)>) -> Result<(), Outcome>;
    /// The time the stream worked on threads of its own beside the slot
    /// (`eval`: decoding batches ahead while the worker ran the one sent):
    /// overlapped, so no part of the unit's wall time; what the slot waited
    /// for it is in [`next_batch`](Self::next_batch)'s time. Asked once,
    /// after the last batch. Zero (the default): none.
    fn background(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// What the stream made of the batches it scored, called once at the
    /// end, also after a failure (then only `examples` is reported). `ok`:
    /// every batch went through, so the stream may commit what it wrote.
    fn finish(&mut self, ok: bool) -> FeedSummary;
}

/// A stream's result, for the unit's report.
#[derive(Debug, Clone, Default)]
pub struct FeedSummary {
    /// Examples whose outputs were scored.
    pub examples: u64,
    /// Fields for the unit's record (`metrics`, `slices`, ...), when it ended `ok`.
    pub fields: serde_json::Map<String, serde_json::Value>,
    /// An outcome that replaces `ok` (a metric below its threshold).
    pub outcome: Option<Outcome>,
}

/// How a fed unit went, batch by batch.
#[derive(Debug, Clone, Default)]
pub struct StreamReport {
    /// Examples scored (also when the unit failed part-way).
    pub examples: u64,
    /// Batches sent to the worker that answered.
    pub batches: u64,
    /// Examples per second over the batches' time (load excluded).
    pub examples_per_second: Option<f64>,
    /// Per-batch latency (request sent to outputs back), in milliseconds,
    /// after the first (warm-up) batch: p50, p90, p99.
    pub latency_ms: Option<[f64; 3]>,
    /// The stream's fields for the record (empty unless `ok`).
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// p50, p90 and p99 (nearest rank) of batch latencies, the first left out
/// as warm-up when there are others.
pub(crate) fn latency_percentiles(latencies: &[f64]) -> Option<[f64; 3]> {
    let warm = if latencies.len() > 1 { &latencies[1..] } else { latencies };
    if warm.is_empty() {
        return None;
    }
    let mut sorted = warm.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = |p: f64| sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
    Some([rank(0.5), rank(0.9), rank(0.99)])
}

#[cfg(test)]
mod tests {
    use super::latency_percentiles;

    #[test]
    fn percentiles_leave_out_the_warm_up_batch() {
        assert_eq!(latency_percentiles(&[]), None);
        assert_eq!(latency_percentiles(&[500.0]), Some([500.0; 3]));
        let mut latencies = vec![900.0];
        latencies.extend((1..=100).map(f64::from));
        assert_eq!(latency_percentiles(&latencies), Some([50.0, 90.0, 99.0]));
    }
}
