//! TensorFlow's protobuf messages, reduced to the fields isorun needs and
//! decoded with `prost` derives over hand-written structs (protobuf skips the
//! fields a reader does not know, so this stays compatible with any
//! TensorFlow version). The supervisor reads signatures from `saved_model.pb`
//! without libtensorflow; the worker decodes the `MetaGraphDef` TensorFlow
//! hands back at load time; both encode the session `ConfigProto` here.
//! `serving` decodes TF Serving's warm-up requests (`PredictionLog`).

mod config;
mod saved_model;
pub mod serving;

pub use config::{cpu_only_config_proto, session_config_proto};
pub use saved_model::{
    decode_meta_graph, find_meta_graph, read_saved_model, signature, signatures, MetaGraph, SavedModelError,
    SignatureTensors,
};

/// TensorFlow's own protobuf messages (the subset isorun reads).
pub mod proto {
    pub use crate::saved_model::proto::*;
}
