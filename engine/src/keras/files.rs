//! Reading Keras model files in the supervisor, without TensorFlow or
//! Python: what `isorun inspect` shows and what discovery needs to tell a
//! model from a weights file. A `.keras` file is a zip of `metadata.json`,
//! `config.json` and `model.weights.h5`; a full-model HDF5 file keeps the
//! same JSON in its root group's `model_config` attribute.
//!
//! Each part in a file of its own: [`read_keras`] reads a `.keras` zip
//! (`archive`: its entries, refused where their names could be read two
//! ways, and the bounds on what they inflate to); [`read_h5`] and
//! [`h5_is_full_model`] a full-model HDF5 file (`h5`: its root group's
//! attributes, found as h5py finds them); both describe the JSON config
//! they find with [`describe_config`] (`model_config`) and key its
//! architecture with [`architecture_digest`] (`architecture`); both fail
//! with a [`KerasFileError`] (`error`).

mod architecture;
mod archive;
mod error;
mod h5;
mod model_config;

pub use architecture::architecture_digest;
pub use archive::read_keras;
pub use error::{KerasFileError, H5_SCAN_BYTES};
pub use h5::{h5_is_full_model, read_h5};
pub use model_config::{code_in_config, describe_config, layer_count, KerasInfo, KerasTensor};

#[cfg(test)]
mod fixtures;
