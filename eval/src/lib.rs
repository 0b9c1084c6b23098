//! Evaluation for isorun: labelled datasets streamed in batches and the
//! metrics computed from a model's outputs, without TensorFlow, processes
//! or a command line (the engine and `isorun eval` drive it).
//!
//! - [`Dataset`] checks the data (TFRecord of `tf.Example`, plain or gzip;
//!   `.npz`; folders of `.npy`; CSV; Parquet; Arrow IPC; JSON Lines) before any work, and [`Dataset::reader`]
//!   makes a [`BatchReader`] for one model's signature: inputs for the
//!   worker, [`Targets`] (labels, weights, slices) for the supervisor.
//! - [`Evaluator`] keeps metric state (never predictions) batch by batch and
//!   gives an [`Evaluation`]; its [`MetricState`] merges with the states of
//!   other parts of the data (`--data-shard`) into the metrics of all of it.
//! - [`check`] compares an evaluation with [`Bound`]s and [`MaxDrop`]s
//!   against a baseline.
//!
//! Memory does not grow with the dataset: records and rows are streamed,
//! and ranking metrics (AUC) keep counts per distinct score, capped.

mod accumulator;
mod batch;
pub mod bootstrap;
pub mod calibration;
pub mod confusion;
mod curve;
pub mod data;
mod element;
pub mod error;
mod evaluation;
mod exact;
pub mod example;
pub mod format;
mod label_classes;
pub mod metrics;
mod paths;
pub mod predictions;
pub mod probabilities;
pub mod replicates;
pub mod shard;
mod source;
pub mod state;
mod task;
pub mod tfrecord;
pub mod thresholds;

pub use data::{
    Batch, BatchReader, DataError, DataShard, DataSpec, Dataset, Feeding, Format, Labels, Targets, MISSING_SLICE,
};
pub use label_classes::LabelClasses;
pub use metrics::{EvalError, Evaluation, Evaluator, Metric, MetricsSpec, Task};
pub use probabilities::NotProbabilities;
pub use replicates::{paired_change, CiSpec, Intervals, KeyedBy, PairedChange};
pub use state::{MergeError, MetricState, StateError};
pub use thresholds::{check, Bound, BoundOp, Breach, MaxDrop};
