//! Keras's automatic layer names, taken out of a `.keras` file's
//! architecture where they provably do not change the graph, so that models
//! of one architecture built separately share one trace as checkpoints of
//! one training run do (issue 44 §1). Keras numbers the names of a
//! session's layers on (`dense`, `dense_1`, then `dense_2`, `dense_3` for
//! the next model built), so the same architecture built twice has two
//! configs that differ in names only.
//!
//! Keras 3 binds a `.keras` archive's weights to its layers by position and
//! class (`model.weights.h5` says `layers/dense_1/vars/0` for the second
//! `Dense`, whatever its name), and Keras's own layers use a name for
//! naming only (variable paths, scopes), never for values. So two configs
//! that differ only in the names of Keras's own layers, renamed one for one
//! (the same name by the same placeholder wherever it names or refers to a
//! layer), build the same graph, and the weights of either fit it. What a
//! name reaches beyond that is kept as it is (see [`blind_layer_names`]).
//! The export process does the same on the config as Keras reads it
//! (`keras_export.py`, `blind_layer_names`) before it shares a trace, and
//! checks the weights' layout and the variables written as before; this
//! side only proposes.

use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// A `.keras` config with its layers' names replaced by `/0`, `/1`, ... in
/// the order the layers are listed (a nested model's layers right after
/// it), or `None` where that is not provably harmless (then the names count
/// as they are):
///
/// - the names the export's signature speaks are kept: every string in the
///   top-level `input_layers` and `output_layers` of a functional model (the
///   inputs' and outputs' names), the first and the last layer's of a
///   `Sequential` one;
/// - a name is replaced only where it names a layer (a layer's `name` and
///   its config's `name`, the model's own) or refers to one (the first item
///   of a `keras_history`, a nested model's `input_layers` and
///   `output_layers`); a replaced name met anywhere else (a wrapper's inner
///   layer, a field of a config), a reference to no listed layer, a layer
///   whose two names differ, a name with `/` (Keras refuses it in a layer's
///   name, so no file can forge a placeholder), a model that is neither
///   functional nor `Sequential`, or any class that is not Keras's own (a
///   custom layer may read its name; a `Lambda` runs the file's code)
///   leaves every name as it is.
pub fn blind_layer_names(config: &Value) -> Option<Value> {
    let top = config.get("config")?.as_object()?;
    let layers = top.get("layers")?.as_array()?;
    if !every_class_keras(config) {
        return None;
    }
    let mut kept = HashSet::new();
    if let (Some(inputs), Some(outputs)) = (top.get("input_layers"), top.get("output_layers")) {
        strings(inputs, &mut kept);
        strings(outputs, &mut kept);
    } else if config.get("class_name").and_then(Value::as_str) == Some("Sequential") {
        for entry in layers.first().into_iter().chain(layers.last()) {
            let inner = entry.get("config").filter(|c| c.is_object()).and_then(|c| c.get("name"));
            for name in [inner, entry.get("name")].into_iter().flatten().filter_map(Value::as_str) {
                kept.insert(name.to_string());
            }
        }
    } else {
        return None;
    }
    let mut blind = config.clone();
    let mut names = Names { kept, placeholders: HashMap::new() };
    let top = blind.get_mut("config")?.as_object_mut()?;
    if let Some(name) = top.get_mut("name") {
        *name = names.name_of(name)?;
    }
    names.layers(top)?;
    names.references(&mut blind, Place::Root)?;
    // A replaced name met anywhere else: the names stay as they are.
    let mut left = HashSet::new();
    strings(&blind, &mut left);
    if names.placeholders.keys().any(|name| left.contains(name)) {
        return None;
    }
    Some(blind)
}

/// The layer names a config's renaming keeps and the placeholders it gives.
struct Names {
    kept: HashSet<String>,
    placeholders: HashMap<String, String>,
}

impl Names {
    /// The placeholder of a layer's name (its next one, where it is new),
    /// or the name itself where it is kept.
    fn name_of(&mut self, name: &Value) -> Option<Value> {
        let name = name.as_str().filter(|n| !n.contains('/'))?;
        if self.kept.contains(name) {
            return Some(Value::from(name));
        }
        let next = format!("/{}", self.placeholders.len());
        Some(Value::from(self.placeholders.entry(name.to_string()).or_insert(next).clone()))
    }

    /// A reference to a listed (or kept) layer, renamed as the layer was.
    fn reference(&self, name: &Value) -> Option<Value> {
        let name = name.as_str()?;
        match self.placeholders.get(name) {
            Some(placeholder) => Some(Value::from(placeholder.clone())),
            None if self.kept.contains(name) => Some(Value::from(name)),
            None => None,
        }
    }

    /// Each layer of `model` (a model's config), in order: its names, then
    /// a nested model's layers.
    fn layers(&mut self, model: &mut Map<String, Value>) -> Option<()> {
        for entry in model.get_mut("layers")?.as_array_mut()? {
            let entry = entry.as_object_mut()?;
            let inner_name = entry.get("config")?.as_object()?.get("name").cloned();
            if entry.get("name").is_some_and(|outer| Some(outer) != inner_name.as_ref()) {
                return None;
            }
            let placeholder = self.name_of(&inner_name?)?;
            if entry.contains_key("name") {
                entry.insert("name".into(), placeholder.clone());
            }
            let inner = entry.get_mut("config")?.as_object_mut()?;
            inner.insert("name".into(), placeholder);
            if inner.contains_key("layers") {
                self.layers(inner)?;
            }
        }
        Some(())
    }

    /// Renames each `keras_history`'s layer and the layers of a nested
    /// model's `input_layers` and `output_layers` (not the top model's:
    /// its input and output names are kept).
    fn references(&self, value: &mut Value, at: Place) -> Option<()> {
        match value {
            Value::Object(map) => {
                for (key, item) in map.iter_mut() {
                    if key == "keras_history" {
                        let first = item.as_array_mut()?.first_mut()?;
                        *first = self.reference(first)?;
                    } else if (key == "input_layers" || key == "output_layers") && at != Place::Top {
                        *item = self.rename_all(item)?;
                    } else {
                        let next = if at == Place::Root && key == "config" { Place::Top } else { Place::Other };
                        self.references(item, next)?;
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.references(item, Place::Other)?;
                }
            }
            _ => {}
        }
        Some(())
    }

    /// Every string of `value` (not its keys) as a reference.
    fn rename_all(&self, value: &Value) -> Option<Value> {
        Some(match value {
            Value::String(_) => self.reference(value)?,
            Value::Array(items) => Value::Array(items.iter().map(|i| self.rename_all(i)).collect::<Option<_>>()?),
            Value::Object(map) => {
                Value::Object(map.iter().map(|(k, v)| Some((k.clone(), self.rename_all(v)?))).collect::<Option<_>>()?)
            }
            other => other.clone(),
        })
    }
}

/// Where a value is in the config [`Names::references`] walks.
#[derive(Clone, Copy, PartialEq)]
enum Place {
    /// The file's config.
    Root,
    /// The top model's config (the `config` of the root).
    Top,
    /// Anywhere else.
    Other,
}

/// Whether every object of `value` that names a class names one of
/// Keras's own (see [`keras_class`]).
fn every_class_keras(value: &Value) -> bool {
    match value {
        Value::Object(map) => {
            (!map.contains_key("class_name") || keras_class(map)) && map.values().all(every_class_keras)
        }
        Value::Array(items) => items.iter().all(every_class_keras),
        _ => true,
    }
}

/// Whether a config object with a `class_name` names one of Keras's own
/// classes: its `module` `keras` or `keras.*`, no `registered_name` but its
/// own, and not a `Lambda` (the file's code); or a Keras tensor.
fn keras_class(map: &Map<String, Value>) -> bool {
    let Some(name) = map.get("class_name").and_then(Value::as_str) else { return false };
    if name == "__keras_tensor__" {
        return true;
    }
    let module = map.get("module").and_then(Value::as_str);
    let registered = match map.get("registered_name") {
        None | Some(Value::Null) => true,
        Some(Value::String(registered)) => registered == name,
        Some(_) => false,
    };
    name != "Lambda" && module.is_some_and(|m| m == "keras" || m.starts_with("keras.")) && registered
}

/// Every string of `value`, its objects' keys included.
fn strings(value: &Value, out: &mut HashSet<String>) {
    match value {
        Value::String(s) => {
            out.insert(s.clone());
        }
        Value::Array(items) => items.iter().for_each(|item| strings(item, out)),
        Value::Object(map) => {
            for (key, item) in map {
                out.insert(key.clone());
                strings(item, out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::files::architecture_digest;
    use super::*;
    use serde_json::json;

    /// A layer of a functional model's config as Keras 3 writes it, called on `from`.
    fn layer(class: &str, name: &str, config: Value, from: Option<&str>) -> Value {
        let mut inner = json!({"name": name, "dtype": {"module": "keras", "class_name": "DTypePolicy",
            "config": {"name": "float32"}, "registered_name": null}});
        inner.as_object_mut().unwrap().extend(config.as_object().unwrap().clone());
        let nodes = match from {
            Some(from) => json!([{"args": [{"class_name": "__keras_tensor__",
                "config": {"shape": [null, 32], "dtype": "float32", "keras_history": [from, 0, 0]}}], "kwargs": {}}]),
            None => json!([]),
        };
        json!({"module": "keras.layers", "class_name": class, "config": inner, "registered_name": null,
            "name": name, "inbound_nodes": nodes})
    }

    /// x -> Dense(8, `activation`) named `hidden[0]` -> Dense(8) named
    /// `hidden[1]` -> Dense(2) named `output`, in a model named `model`.
    fn mlp(model: &str, hidden: [&str; 2], output: &str, activation: &str) -> Value {
        json!({"module": "keras.src.models.functional", "class_name": "Functional", "registered_name": "Functional",
            "config": {"name": model, "trainable": true, "layers": [
                layer("InputLayer", "x", json!({"batch_shape": [null, 32]}), None),
                layer("Dense", hidden[0], json!({"units": 8, "activation": activation}), Some("x")),
                layer("Dense", hidden[1], json!({"units": 8, "activation": "relu"}), Some(hidden[0])),
                layer("Dense", output, json!({"units": 2, "activation": "linear"}), Some(hidden[1]))],
              "input_layers": [["x", 0, 0]], "output_layers": [[output, 0, 0]]},
            "compile_config": {}})
    }

    fn digest(config: &Value) -> String {
        architecture_digest("keras", config, Some("3.15.1"))
    }

    #[test]
    fn models_of_one_architecture_built_separately_have_one_keras_architecture_whatever_their_automatic_names() {
        let first = mlp("functional", ["dense", "dense_1"], "logits", "relu");
        let second = mlp("functional_1", ["dense_2", "dense_3"], "logits", "relu");
        assert_eq!(digest(&first), digest(&second));
        // Explicit names of Keras's own layers inside the model do not reach the graph either.
        assert_eq!(digest(&first), digest(&mlp("encoder", ["a", "b"], "logits", "relu")));
        // A Sequential model: its first and last layers name its input and output.
        let sequential = |name: &str, layers: [&str; 3]| {
            json!({"module": "keras", "class_name": "Sequential", "registered_name": null, "config": {"name": name,
                "layers": layers.iter().map(|n| json!({"module": "keras.layers", "class_name": "Dense",
                    "config": {"name": n, "units": 4}, "registered_name": null})).collect::<Vec<_>>()}})
        };
        let base = digest(&sequential("sequential", ["input_layer", "dense", "dense_1"]));
        assert_eq!(base, digest(&sequential("sequential_3", ["input_layer", "dense_7", "dense_1"])));
        assert_ne!(base, digest(&sequential("sequential", ["input_layer_1", "dense", "dense_1"])), "its input's name");
        assert_ne!(base, digest(&sequential("sequential", ["input_layer", "dense", "dense_2"])), "its output's name");
        // An .h5 file's weights are bound by layer name: there names count.
        let h5 = |c: &Value| architecture_digest("h5", c, Some("3.15.1"));
        assert_ne!(h5(&first), h5(&second));
    }

    #[test]
    fn names_that_reach_the_graph_or_its_signature_still_make_another_architecture() {
        let base = digest(&mlp("functional", ["dense", "dense_1"], "logits", "relu"));
        let differs = |config: Value, why: &str| assert_ne!(base, digest(&config), "{why}");
        differs(mlp("functional", ["dense", "dense_1"], "out", "relu"), "the output's name");
        differs(mlp("functional", ["dense", "dense_1"], "logits", "tanh"), "an activation");
        let mut input = mlp("functional", ["dense", "dense_1"], "logits", "relu");
        let text = input.to_string().replace(r#""x""#, r#""features""#);
        input = serde_json::from_str(&text).unwrap();
        differs(input, "the input's name");
        // Wired otherwise: the last hidden layer fed from the input, not from the first.
        let mut rewired = mlp("functional", ["dense", "dense_1"], "logits", "relu");
        rewired["config"]["layers"][2]["inbound_nodes"][0]["args"][0]["config"]["keras_history"][0] = json!("x");
        differs(rewired, "another wiring");
        // A name a field of a config refers to, a custom class that may read
        // its name, a Lambda: every name counts, so these separately built
        // copies do not share.
        let with = |edit: &dyn Fn(&mut Value)| {
            let mut pair = [
                mlp("functional", ["dense", "dense_1"], "logits", "relu"),
                mlp("functional_1", ["dense_2", "dense_3"], "logits", "relu"),
            ];
            for config in &mut pair {
                edit(config);
            }
            assert!(blind_layer_names(&pair[1]).is_none(), "{}", pair[1]);
            (digest(&pair[0]), digest(&pair[1]))
        };
        let (a, b) = with(&|c| {
            let first = c["config"]["layers"][1]["config"]["name"].clone();
            c["config"]["layers"][3]["config"]["tied_to"] = first;
        });
        assert_ne!(a, b, "a name in a field");
        let (a, b) = with(&|c| c["config"]["layers"][2]["module"] = json!("my_layers"));
        assert_ne!(a, b, "a custom class");
        let (a, b) = with(&|c| c["config"]["layers"][2]["registered_name"] = json!("Custom>Dense"));
        assert_ne!(a, b, "a registered class");
        let (a, b) = with(&|c| c["config"]["layers"][2]["class_name"] = json!("Lambda"));
        assert_ne!(a, b, "a Lambda");
    }

    #[test]
    fn a_placeholder_cannot_be_forged_and_unknown_references_keep_the_names() {
        // A layer named like a placeholder: Keras refuses "/" in a name.
        let forged = mlp("functional", ["/1", "dense_1"], "logits", "relu");
        assert!(blind_layer_names(&forged).is_none());
        let base = mlp("functional", ["dense", "dense_1"], "logits", "relu");
        let blind = blind_layer_names(&base).unwrap();
        assert_eq!(blind["config"]["name"], "/0");
        assert_eq!(blind["config"]["layers"][1]["name"], "/1");
        assert_eq!(blind["config"]["layers"][1]["config"]["name"], "/1");
        assert_eq!(blind["config"]["layers"][2]["inbound_nodes"][0]["args"][0]["config"]["keras_history"][0], "/1");
        assert_eq!(blind["config"]["layers"][0]["name"], "x", "the input's name is kept");
        assert_eq!(blind["config"]["layers"][3]["name"], "logits", "the output's name is kept");
        // A reference to no listed layer; two names of one layer that differ.
        let mut dangling = base.clone();
        dangling["config"]["layers"][2]["inbound_nodes"][0]["args"][0]["config"]["keras_history"][0] = json!("gone");
        assert!(blind_layer_names(&dangling).is_none());
        let mut two = base.clone();
        two["config"]["layers"][1]["name"] = json!("other");
        assert!(blind_layer_names(&two).is_none());
        // Neither functional nor Sequential: a subclass's config.
        let mut subclass = base;
        subclass["config"].as_object_mut().unwrap().remove("input_layers");
        assert!(blind_layer_names(&subclass).is_none());
    }
}
