//! A shard report's `metric_state` is anyone's to edit who can write the
//! report: any JSON text gives a state (merged with itself and turned into
//! metrics as `isorun report merge` does) or an error; never a panic or an
//! allocation the bytes do not pay for (counts, classes or curve buckets a
//! state claims included).

#![no_main]

mod common;

use isorun_eval::{Evaluation, MetricState};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| common::bounded("metric_state", data, || run(data)));

fn run(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else { return };
    // The state itself, or a shard unit holding it.
    let state = match value.get("metric_state") {
        Some(inner) => inner,
        None => &value,
    };
    let Ok(mut state) = MetricState::from_json(state) else { return };
    state.set_source("fuzz (model m, data shard 1/2)");
    let other = state.clone();
    let _ = state.merge(&other);
    let _ = Evaluation::from_state(&state);
    // What it writes, it reads back.
    let written = state.to_json();
    MetricState::from_json(&written).unwrap_or_else(|e| panic!("its own JSON read back: {e}"));
}
