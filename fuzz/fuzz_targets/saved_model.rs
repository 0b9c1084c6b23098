//! `saved_model.pb` is read by the supervisor (`inspect`, JSON inputs'
//! dtypes) without TensorFlow: any bytes give signatures or an error.

#![no_main]

mod common;

use isorun_tfproto::{proto, signatures};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| common::bounded("saved_model", data, || run(data)));

fn run(data: &[u8]) {
    let Ok(model) = proto::SavedModel::decode(data) else { return };
    for graph in &model.meta_graphs {
        let _ = graph.signature_keys(true);
        for signature in graph.signature_def.values() {
            for info in signature.inputs.values().chain(signature.outputs.values()) {
                let _ = (info.dtype_name(), info.dims());
            }
        }
        let _ = signatures(graph);
    }
}
