//! The eval library's tests through its public API: datasets of every
//! format, shards, metrics against scikit-learn, bootstrap intervals and
//! merged metric states. One test binary (one link, not one per file);
//! the tests that measure the whole process (the allocation bound in
//! `tests/bounds/`, peak RSS in `tests/memory.rs`) have binaries of their
//! own, since the tests of one binary run in parallel threads.

mod calibration;
mod ci;
mod confusion;
mod data;
mod metrics;
mod predictions_claims;
mod reference;
mod shards;
mod state_claims;
mod state_merge;
mod tables;
mod tfrecord_shards;
mod util;
