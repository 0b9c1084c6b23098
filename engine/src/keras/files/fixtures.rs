//! What the readers' tests share: the test data folder and the config
//! its decoy `.h5` files hold.

use serde_json::Value;

pub(super) fn testdata(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/keras/testdata").join(name)
}

/// The config of `testdata/make_h5_decoys.py` whose output is `output`.
pub(super) fn decoy_config(output: &str) -> Value {
    serde_json::json!({"class_name": "Functional", "config": {"name": output, "layers": [
        {"class_name": "InputLayer", "name": "x",
         "config": {"batch_shape": [null, 2], "dtype": "float32", "name": "x"}},
        {"class_name": "Dense", "name": output, "config": {"name": output, "units": 3}}],
        "input_layers": [["x", 0, 0]], "output_layers": [[output, 0, 0]]}})
}
