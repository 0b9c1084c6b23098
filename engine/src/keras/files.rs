//! Reading Keras model files in the supervisor, without TensorFlow or
//! Python: what `isorun inspect` shows and what discovery needs to tell a
//! model from a weights file. A `.keras` file is a zip of `metadata.json`,
//! `config.json` and `model.weights.h5`; a full-model HDF5 file keeps the
//! same JSON in its root group's `model_config` attribute.
//!
//! The `.h5` reader here is small and narrow on purpose. `hdf5`/`hdf5-metno`
//! link libhdf5; pure-Rust readers exist (`hdf5-reader`, `hdf5-pure`,
//! `rustyhdf5`) but are young, and each is a whole format parser to run on
//! untrusted files inside the supervisor, for one attribute (not tried
//! here; worth a look if more than the config is ever needed). What the
//! supervisor needs is little: h5py stores a `str` attribute as
//! a variable-length string, whose bytes live in a global heap collection
//! (`GCOL`); Keras writes `model_config` before any weight, so that
//! collection is near the start of the file. The reader walks the heap
//! collections in the first [`H5_SCAN_BYTES`] and takes the JSON object
//! with a `class_name` and a `config` (and a version-like string as the
//! Keras version). A file whose attributes it cannot find this way is still
//! run (the export process reads it with Keras); only `inspect` has less to
//! say. Whether an `.h5` file is a model at all is decided by the attribute
//! name `model_config` in those first bytes.

use isorun_protocol::DType;
use serde_json::Value;
use std::io::Read;
use std::path::Path;

/// How much of an HDF5 file is searched for the model's attributes.
pub const H5_SCAN_BYTES: u64 = 16 << 20;

/// The HDF5 file signature, at offset 0 of every file h5py writes.
const HDF5_SIGNATURE: &[u8] = b"\x89HDF\r\n\x1a\n";

/// What a Keras file says about itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KerasInfo {
    /// The model's class (`Functional`, `Sequential`, or a subclass's name).
    pub class_name: String,
    /// The Keras version that saved it, where the file says.
    pub keras_version: Option<String>,
    /// Input layers: name, dtype, shape (`None` for an unknown dimension).
    pub inputs: Vec<KerasTensor>,
    /// Output names, as Keras names them (the output layers').
    pub outputs: Vec<String>,
    /// The first layer whose config carries Python code (a `Lambda`'s
    /// bytecode), named as the error shows it; see [`code_in_config`].
    pub code: Option<String>,
    /// What decides the model's graph, as a digest: files with the same
    /// one (checkpoints of one training run) share one trace; see
    /// [`architecture_digest`]. `None` where the config was not found.
    pub architecture: Option<String>,
    /// Its layers, nested models' included ([`layer_count`]).
    pub layers: usize,
}

/// One input of a Keras model, from its `InputLayer`.
#[derive(Debug, Clone, PartialEq)]
pub struct KerasTensor {
    pub name: String,
    pub dtype: Option<DType>,
    pub shape: Option<Vec<Option<u64>>>,
}

/// Why a Keras file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KerasFileError {
    #[error("{path}: cannot read")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not a .keras archive (a zip holding config.json): {reason}")]
    NotAnArchive { path: String, reason: String },
    #[error("{path}: {member} is not valid JSON: {reason}")]
    BadJson { path: String, member: &'static str, reason: String },
    #[error("{path}: not an HDF5 file")]
    NotHdf5 { path: String },
    #[error("{path}: holds weights only (no model_config attribute); a model needs its architecture: save it with model.save(\"model.keras\")")]
    WeightsOnly { path: String },
    #[error("{path}: the model_config attribute is not where isorun looks (in a global heap in the first {} MiB); the export reads it with Keras", H5_SCAN_BYTES >> 20)]
    H5ConfigNotFound { path: String },
}

/// True for an HDF5 file whose first bytes name a `model_config`
/// attribute: a model saved whole (`model.save("m.h5")`), not weights.
pub fn h5_is_full_model(path: &Path) -> Result<bool, KerasFileError> {
    let head = read_head(path)?;
    if !head.starts_with(HDF5_SIGNATURE) {
        return Err(KerasFileError::NotHdf5 { path: path.display().to_string() });
    }
    Ok(memchr_find(&head, b"model_config").is_some())
}

/// Reads what a `.keras` archive says of itself.
pub fn read_keras(path: &Path) -> Result<KerasInfo, KerasFileError> {
    let shown = || path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| KerasFileError::Io { path: shown(), source })?;
    let mut archive = zip::ZipArchive::new(file)
        .map_err(|e| KerasFileError::NotAnArchive { path: shown(), reason: e.to_string() })?;
    let mut member = |name: &'static str| -> Result<Option<Value>, KerasFileError> {
        let mut entry = match archive.by_name(name) {
            Ok(entry) => entry,
            Err(zip::result::ZipError::FileNotFound) => return Ok(None),
            Err(e) => return Err(KerasFileError::NotAnArchive { path: shown(), reason: e.to_string() }),
        };
        let mut text = Vec::new();
        // Configs are small; a hostile archive does not get to fill memory.
        (&mut entry)
            .take(64 << 20)
            .read_to_end(&mut text)
            .map_err(|e| KerasFileError::NotAnArchive { path: shown(), reason: format!("{name}: {e}") })?;
        serde_json::from_slice(&text).map(Some).map_err(|e| KerasFileError::BadJson {
            path: shown(),
            member: name,
            reason: e.to_string(),
        })
    };
    let config = member("config.json")?
        .ok_or_else(|| KerasFileError::NotAnArchive { path: shown(), reason: "no config.json in it".into() })?;
    let metadata = member("metadata.json")?;
    let mut info = describe_config(&config);
    info.keras_version = metadata.as_ref().and_then(|m| m.get("keras_version")).and_then(Value::as_str).map(Into::into);
    info.architecture = Some(architecture_digest("keras", &config, info.keras_version.as_deref()));
    Ok(info)
}

/// Reads the `model_config` (and Keras version) of a full-model `.h5` file.
pub fn read_h5(path: &Path) -> Result<KerasInfo, KerasFileError> {
    if !h5_is_full_model(path)? {
        return Err(KerasFileError::WeightsOnly { path: path.display().to_string() });
    }
    let head = read_head(path)?;
    let strings = global_heap_strings(&head);
    let config = strings
        .iter()
        .filter(|s| s.first() == Some(&b'{'))
        .filter_map(|s| serde_json::from_slice::<Value>(s).ok())
        .find(|v| v.get("class_name").is_some() && v.get("config").is_some())
        .ok_or_else(|| KerasFileError::H5ConfigNotFound { path: path.display().to_string() })?;
    let mut info = describe_config(&config);
    info.keras_version = strings
        .iter()
        .filter_map(|s| std::str::from_utf8(s).ok())
        .find(|s| {
            s.split('.').count() >= 2 && s.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(Into::into);
    info.architecture = Some(architecture_digest("h5", &config, info.keras_version.as_deref()));
    Ok(info)
}

/// The SHA-256 (hex) of what decides the graph a Keras file loads into:
/// its format, the Keras version that saved it and its model config (the
/// `config.json` of a `.keras` archive, the `model_config` of an `.h5`),
/// written with sorted keys and each `shared_object_id` renumbered in the
/// order of first appearance (Keras writes a Python `id()` there, an address
/// that differs in every process, to mark objects the config shares), less
/// the top-level `compile_config` (the
/// optimizer and loss, which a callback may change between checkpoints and
/// the export, loading with `compile=False`, never uses). Weights are not
/// in a config; the `date_saved` of `metadata.json` is not taken. Two files
/// with the same digest build the same model, so the export traces it once
/// and writes each file's weights into a copy (`keras_export.py` checks
/// that the weights fit before it does).
pub fn architecture_digest(format: &str, config: &Value, keras_version: Option<&str>) -> String {
    use sha2::Digest;
    let mut graph = config.clone();
    if let Some(map) = graph.as_object_mut() {
        map.remove("compile_config");
    }
    renumber_shared_objects(&mut graph, &mut Vec::new());
    let mut text = String::new();
    canonical_json(&graph, &mut text);
    let mut hasher = sha2::Sha256::new();
    for part in [format, keras_version.unwrap_or("-"), &text] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    super::cache::hex(&hasher.finalize())
}

/// Replaces every `shared_object_id` by its index among the distinct ids
/// met so far, depth first in the file's key order: two configs that share
/// the same objects in the same places get the same numbers.
fn renumber_shared_objects(value: &mut Value, seen: &mut Vec<Value>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                if key == "shared_object_id" {
                    let index = seen.iter().position(|s| s == item).unwrap_or_else(|| {
                        seen.push(item.clone());
                        seen.len() - 1
                    });
                    *item = Value::from(index as u64);
                } else {
                    renumber_shared_objects(item, seen);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| renumber_shared_objects(item, seen)),
        _ => {}
    }
}

/// JSON with every object's keys sorted: one text for one value, whatever
/// order the file wrote its keys in.
fn canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical_json(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn read_head(path: &Path) -> Result<Vec<u8>, KerasFileError> {
    let file =
        std::fs::File::open(path).map_err(|source| KerasFileError::Io { path: path.display().to_string(), source })?;
    let mut head = Vec::new();
    file.take(H5_SCAN_BYTES)
        .read_to_end(&mut head)
        .map_err(|source| KerasFileError::Io { path: path.display().to_string(), source })?;
    Ok(head)
}

fn memchr_find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The objects of every global heap collection in `bytes` (HDF5 format
/// spec, "Global Heap": `GCOL`, version 1, 3 reserved bytes, an 8-byte
/// collection size, then objects of 2-byte index, 2-byte reference count,
/// 4 reserved, 8-byte size, data padded to 8; index 0 is free space).
fn global_heap_strings(bytes: &[u8]) -> Vec<&[u8]> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = memchr_find(&bytes[from..], b"GCOL").map(|i| i + from) {
        from = at + 4;
        if bytes.get(at + 4) != Some(&1) {
            continue;
        }
        let Some(size) = bytes.get(at + 8..at + 16).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))) else {
            continue;
        };
        let end = (at as u64).saturating_add(size).min(bytes.len() as u64) as usize;
        let mut object = at + 16;
        while object + 16 <= end {
            let index = u16::from_le_bytes([bytes[object], bytes[object + 1]]);
            let length = u64::from_le_bytes(bytes[object + 8..object + 16].try_into().expect("8 bytes"));
            if index == 0 {
                break; // free space: the rest of the collection
            }
            let data = object + 16;
            let Some(stop) = usize::try_from(length).ok().and_then(|l| data.checked_add(l)).filter(|&s| s <= end)
            else {
                break;
            };
            found.push(&bytes[data..stop]);
            object = data + (stop - data).div_ceil(8) * 8;
        }
    }
    found
}

/// The first place in a model config that holds Python code which runs
/// when the model is loaded, described (`layer 'NAME' (Lambda)`), or
/// `None`. Keras 3 writes a `lambda` as `{"class_name": "__lambda__",
/// "config": {"code": BASE64...}}`; Keras 2 (`tf_keras`, and `.h5` files)
/// as a Lambda config with `"function_type": "lambda"` (or
/// `"output_shape_type": "lambda"`) and the bytecode in a list. A Lambda
/// naming a registered function by name holds no code and passes. Anything
/// nested (a layer inside a `Sequential` inside a `TimeDistributed`...) is
/// searched, to a bounded depth; a config nested deeper counts as code,
/// since it cannot be checked.
pub fn code_in_config(config: &Value) -> Option<String> {
    fn search(value: &Value, layer: Option<&str>, depth: usize) -> Option<String> {
        let described = |what: &str| match layer {
            Some(name) => format!("layer '{name}' ({what})"),
            None => what.to_string(),
        };
        if depth > 64 {
            return Some(described("a config nested too deep to check"));
        }
        match value {
            Value::Object(map) => {
                let class = map.get("class_name").and_then(Value::as_str);
                let name = map
                    .get("config")
                    .and_then(|c| c.get("name"))
                    .or_else(|| map.get("name"))
                    .and_then(Value::as_str)
                    .or(layer);
                if class == Some("__lambda__") {
                    return Some(described("Lambda with Python bytecode"));
                }
                for key in ["function_type", "output_shape_type", "mask_type"] {
                    if map.get(key).and_then(Value::as_str) == Some("lambda") {
                        return Some(described("Lambda with Python bytecode"));
                    }
                }
                map.values().find_map(|v| search(v, name, depth + 1))
            }
            Value::Array(items) => items.iter().find_map(|v| search(v, layer, depth + 1)),
            _ => None,
        }
    }
    search(config, None, 0)
}

/// How many layers a model config holds, a nested model's (a layer whose
/// config has layers of its own) included: what loading and tracing a
/// file costs grows with it (`load_model` and a trace of DenseNet121's 429
/// layers take 4.8 s here, of ConvNeXtTiny's 153 layers 2.1 s). The
/// config is the file's, so the walk stops 32 models deep.
pub fn layer_count(config: &Value) -> usize {
    fn count(model: &Value, depth: usize) -> usize {
        let layers = model.get("config").and_then(|c| c.get("layers")).and_then(Value::as_array);
        match layers {
            Some(layers) if depth < 32 => layers.iter().map(|layer| 1 + count(layer, depth + 1)).sum(),
            _ => 0,
        }
    }
    count(config, 0)
}

/// Inputs, outputs and class of a Keras model config (`config.json`, or
/// the `model_config` attribute; Keras 3 and Keras 2 spellings).
pub fn describe_config(config: &Value) -> KerasInfo {
    let class_name = config.get("class_name").and_then(Value::as_str).unwrap_or("").to_string();
    let body = config.get("config").unwrap_or(&Value::Null);
    let layers: Vec<&Value> =
        body.get("layers").and_then(Value::as_array).map(|l| l.iter().collect()).unwrap_or_default();
    let layer_name = |layer: &Value| -> Option<String> {
        layer
            .get("name")
            .or_else(|| layer.get("config").and_then(|c| c.get("name")))
            .and_then(Value::as_str)
            .map(Into::into)
    };
    let input_layer = |layer: &Value| -> Option<KerasTensor> {
        (layer.get("class_name").and_then(Value::as_str) == Some("InputLayer")).then_some(())?;
        let c = layer.get("config")?;
        let shape = c
            .get("batch_shape")
            .or_else(|| c.get("batch_input_shape"))
            .and_then(Value::as_array)
            .map(|dims| dims.iter().map(Value::as_u64).collect::<Vec<_>>());
        let dtype = match c.get("dtype") {
            Some(Value::String(s)) => Some(s.as_str()),
            Some(policy) => policy.get("config").and_then(|c| c.get("name")).and_then(Value::as_str),
            None => None,
        }
        .and_then(DType::from_name);
        Some(KerasTensor { name: layer_name(layer)?, dtype, shape })
    };
    // `input_layers` / `output_layers`: `[[name, 0, 0], ...]`, one `[name, 0, 0]`, or a dict of them.
    let references = |key: &str| -> Vec<(Option<String>, String)> {
        let node_name = |v: &Value| v.as_array().and_then(|a| a.first()).and_then(Value::as_str).map(String::from);
        match body.get(key) {
            Some(Value::Object(map)) => {
                map.iter().filter_map(|(k, v)| node_name(v).map(|n| (Some(k.clone()), n))).collect()
            }
            Some(Value::Array(list)) if list.first().is_some_and(Value::is_string) => {
                node_name(&Value::Array(list.clone())).map(|n| vec![(None, n)]).unwrap_or_default()
            }
            Some(Value::Array(list)) => list.iter().filter_map(|v| node_name(v).map(|n| (None, n))).collect(),
            _ => Vec::new(),
        }
    };
    let mut info =
        KerasInfo { class_name, code: code_in_config(config), layers: layer_count(config), ..KerasInfo::default() };
    let named_inputs = references("input_layers");
    if named_inputs.is_empty() {
        info.inputs = layers.iter().filter_map(|l| input_layer(l)).take(1).collect();
        if info.inputs.is_empty() {
            // A Sequential model built from an input shape (Keras 2): its first layer's.
            if let Some(first) = layers.first().and_then(|l| l.get("config")) {
                if let Some(shape) = first.get("batch_input_shape").and_then(Value::as_array) {
                    info.inputs.push(KerasTensor {
                        name: "input".into(),
                        dtype: None,
                        shape: Some(shape.iter().map(Value::as_u64).collect()),
                    });
                }
            }
        }
        info.outputs =
            layers.iter().rev().find(|l| input_layer(l).is_none()).and_then(|l| layer_name(l)).into_iter().collect();
    } else {
        for (key, node) in named_inputs {
            let found = layers.iter().find(|l| layer_name(l).as_deref() == Some(&node)).and_then(|l| input_layer(l));
            let mut tensor = found.unwrap_or(KerasTensor { name: node.clone(), dtype: None, shape: None });
            if let Some(key) = key {
                tensor.name = key;
            }
            info.inputs.push(tensor);
        }
        info.outputs = references("output_layers").into_iter().map(|(key, node)| key.unwrap_or(node)).collect();
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_code_in_a_config_is_found_in_every_spelling() {
        let keras3 = serde_json::json!({"class_name": "Functional", "config": {"layers": [
            {"class_name": "InputLayer", "config": {"name": "x"}},
            {"class_name": "Lambda", "config": {"name": "doubled", "function":
                {"class_name": "__lambda__", "config": {"code": "4wEAAA==", "defaults": null}}}},
        ]}});
        assert_eq!(code_in_config(&keras3).as_deref(), Some("layer 'doubled' (Lambda with Python bytecode)"));
        let keras2 = serde_json::json!({"class_name": "Sequential", "config": {"layers": [
            {"class_name": "TimeDistributed", "config": {"name": "outer", "layer":
                {"class_name": "Lambda", "config": {"name": "inner", "function": ["4wEAAA==", null, null],
                    "function_type": "lambda", "output_shape_type": "raw"}}}},
        ]}});
        assert_eq!(code_in_config(&keras2).as_deref(), Some("layer 'inner' (Lambda with Python bytecode)"));
        let shape = serde_json::json!({"config": {"layers": [{"class_name": "Lambda", "config":
            {"name": "s", "function": "registered_fn", "function_type": "function", "output_shape_type": "lambda"}}]}});
        assert!(code_in_config(&shape).is_some());
        // A Lambda naming a registered function holds no code.
        let named = serde_json::json!({"config": {"layers": [{"class_name": "Lambda", "config":
            {"name": "n", "function": {"module": "builtins", "class_name": "function", "config": "my_fn"}}}]}});
        assert_eq!(code_in_config(&named), None);
        // Nesting past the bound cannot be checked: it counts as code.
        let mut deep = serde_json::json!({"class_name": "Dense"});
        for _ in 0..80 {
            deep = serde_json::json!({"config": {"layer": deep}});
        }
        assert!(code_in_config(&deep).is_some());
    }

    #[test]
    fn layers_are_counted_with_a_nested_models_and_a_deep_nest_stops() {
        let nested = serde_json::json!({"class_name": "Functional", "config": {"layers": [
            {"class_name": "InputLayer", "config": {"name": "x"}},
            {"class_name": "Sequential", "config": {"layers": [{"class_name": "Dense"}, {"class_name": "Dense"}]}},
            {"class_name": "Dense", "config": {"name": "y", "dtype": {"class_name": "DTypePolicy", "config": {}}}}
        ]}});
        assert_eq!(layer_count(&nested), 5);
        assert_eq!(layer_count(&serde_json::json!({"config": {}})), 0);
        let mut deep = serde_json::json!({"class_name": "Dense"});
        for _ in 0..100 {
            deep = serde_json::json!({"config": {"layers": [deep]}});
        }
        assert_eq!(layer_count(&deep), 32);
    }

    #[test]
    fn functional_dict_and_sequential_configs() {
        let functional: Value = serde_json::from_str(
            r#"{"class_name": "Functional", "config": {"layers": [
                {"class_name": "InputLayer", "name": "a", "config": {"batch_shape": [null, 3], "dtype": "float32", "name": "a"}},
                {"class_name": "Dense", "name": "score", "config": {"name": "score"}}],
              "input_layers": {"a": ["a", 0, 0]}, "output_layers": {"score": ["score", 0, 0]}}}"#,
        )
        .unwrap();
        let info = describe_config(&functional);
        assert_eq!(
            info.inputs,
            [KerasTensor { name: "a".into(), dtype: Some(DType::Float32), shape: Some(vec![None, Some(3)]) }]
        );
        assert_eq!(info.outputs, ["score"]);
        let sequential: Value = serde_json::from_str(
            r#"{"class_name": "Sequential", "config": {"layers": [
                {"class_name": "InputLayer", "config": {"batch_shape": [null, 4], "dtype": "float32", "name": "input_layer"}},
                {"class_name": "Dense", "config": {"name": "dense"}}]}}"#,
        )
        .unwrap();
        let info = describe_config(&sequential);
        assert_eq!(info.inputs[0].name, "input_layer");
        assert_eq!(info.outputs, ["dense"]);
    }

    #[test]
    fn the_architecture_leaves_out_compile_settings_and_key_order_but_not_a_unit() {
        let config = |units: u64, lr: f64| {
            serde_json::json!({"class_name": "Functional", "config": {"name": "run", "layers": [
                {"class_name": "Dense", "config": {"name": "hidden", "units": units}}]},
                "compile_config": {"optimizer": {"config": {"learning_rate": lr}}}})
        };
        let base = architecture_digest("keras", &config(8, 0.001), Some("3.15.1"));
        // Checkpoints of one run: a learning rate changed by a callback shares the graph.
        assert_eq!(base, architecture_digest("keras", &config(8, 0.0001), Some("3.15.1")));
        let reordered: Value = serde_json::from_str(
            r#"{"config": {"layers": [{"config": {"units": 8, "name": "hidden"}, "class_name": "Dense"}], "name": "run"},
                "class_name": "Functional"}"#,
        )
        .unwrap();
        assert_eq!(base, architecture_digest("keras", &reordered, Some("3.15.1")));
        assert_ne!(base, architecture_digest("keras", &config(9, 0.001), Some("3.15.1")), "one unit more");
        assert_ne!(base, architecture_digest("h5", &config(8, 0.001), Some("3.15.1")), "another format");
        assert_ne!(base, architecture_digest("keras", &config(8, 0.001), Some("3.16.0")), "another Keras");
    }

    #[test]
    fn shared_object_ids_count_by_first_appearance_not_by_address() {
        let config = |first: u64, second: u64| {
            serde_json::json!({"class_name": "Functional", "config": {"layers": [
                {"class_name": "Dense", "config": {"dtype": {"class_name": "DTypePolicy", "shared_object_id": first}}},
                {"class_name": "Dense", "config": {"dtype": {"class_name": "DTypePolicy", "shared_object_id": second}}}]}})
        };
        let digest = |c: Value| architecture_digest("keras", &c, Some("3.15.1"));
        // Another process saved the same model: other addresses, the same sharing.
        assert_eq!(digest(config(140090043142160, 140090043142160)), digest(config(140089953923920, 140089953923920)));
        assert_eq!(digest(config(1, 2)), digest(config(7, 5)));
        // One object shared by both layers is not two objects.
        assert_ne!(digest(config(1, 1)), digest(config(1, 2)));
    }

    #[test]
    fn heap_objects_are_bounded_by_their_collection() {
        let mut bytes = b"xxxxGCOL\x01\0\0\0".to_vec();
        bytes.extend_from_slice(&(16u64 + 16 + 8 + 16).to_le_bytes());
        bytes.extend_from_slice(&[1, 0, 1, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&5u64.to_le_bytes());
        bytes.extend_from_slice(b"3.1.0\0\0\0");
        // A lying size runs past the collection: dropped.
        bytes.extend_from_slice(&[2, 0, 1, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(global_heap_strings(&bytes), [b"3.1.0"]);
    }
}
