//! What a Keras model config says, as JSON (a `.keras` archive's
//! `config.json`, an `.h5` file's `model_config` attribute; Keras 3 and
//! Keras 2 spellings): the model's inputs, outputs and class, the first
//! layer that holds Python code, how many layers it has.

use isorun_protocol::DType;
use serde_json::Value;

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
    /// [`architecture_digest`](super::architecture_digest). `None` where the config was not found.
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
}
