//! What becomes of a unit's outputs: the engine checks them (names, shapes,
//! sizes) and hands them to an [`OutputSink`] on the slot's thread, which
//! may keep them (write `.npy` files), compare them (golden outputs) or
//! score them, and may turn the unit's outcome into another (an output that
//! cannot be written is the unit's `error`, a golden difference its
//! `mismatch`). Sinks compose: [`Sinks`] runs several in order and stops at
//! the first that changes the outcome.

use crate::discover::Model;
use isorun_protocol::{ErrorKind, ModelError, Outcome, Tensor};
use std::path::PathBuf;

/// Receives each `ok` unit's outputs. Called from slot threads, so it must
/// be `Sync`; called once per unit, with the outputs joined across
/// `batch_size` chunks.
pub trait OutputSink: Sync {
    /// Takes the outputs of `model`; an `Err` becomes the unit's outcome.
    fn accept(&self, model: &Model, outputs: &[(String, Tensor)]) -> Result<(), Outcome>;
}

/// Keeps nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Discard;

impl OutputSink for Discard {
    fn accept(&self, _model: &Model, _outputs: &[(String, Tensor)]) -> Result<(), Outcome> {
        Ok(())
    }
}

/// Writes `DIR/<model id>/<output>.npy` for each output (`--output-dir`).
#[derive(Debug, Clone)]
pub struct WriteNpy {
    pub dir: PathBuf,
}

impl OutputSink for WriteNpy {
    fn accept(&self, model: &Model, outputs: &[(String, Tensor)]) -> Result<(), Outcome> {
        isorun_tensors::output::write_outputs(&self.dir, &model.id, outputs)
            .map_err(|e| Outcome::Error(ModelError::new(ErrorKind::OutputWrite, e.to_string())))
    }
}

/// Compares outputs with golden files (`--expect DIR`, `--rtol`, `--atol`).
impl OutputSink for isorun_tensors::golden::Expect {
    fn accept(&self, model: &Model, outputs: &[(String, Tensor)]) -> Result<(), Outcome> {
        match self.compare(&model.id, outputs) {
            Some(mismatch) => Err(mismatch),
            None => Ok(()),
        }
    }
}

/// Several sinks, in order; the first `Err` ends the unit's handling.
#[derive(Default)]
pub struct Sinks(pub Vec<Box<dyn OutputSink>>);

impl OutputSink for Sinks {
    fn accept(&self, model: &Model, outputs: &[(String, Tensor)]) -> Result<(), Outcome> {
        self.0.iter().try_for_each(|sink| sink.accept(model, outputs))
    }
}
