//! Which Keras files share a trace: the digest of what decides the graph
//! a file loads into (its format, Keras version and model config, less
//! what does not change the graph), the same for checkpoints of one
//! architecture.

use serde_json::Value;

/// The SHA-256 (hex) of what decides the graph a Keras file loads into:
/// its format, the Keras version that saved it and its model config (the
/// `config.json` of a `.keras` archive, the `model_config` of an `.h5`),
/// written with sorted keys and each `shared_object_id` renumbered in the
/// order of first appearance (Keras writes a Python `id()` there, an address
/// that differs in every process, to mark objects the config shares), less
/// the top-level `compile_config` (the
/// optimizer and loss, which a callback may change between checkpoints and
/// the export, loading with `compile=False`, never uses), and, in a
/// `.keras` archive, with its layers' names replaced by placeholders where
/// that provably changes nothing (`names::blind_layer_names`: Keras's
/// automatic names, `dense_2` in one model and `dense_7` in the same
/// architecture built later, do not count; the input and output names,
/// the `.h5` format's names, which bind its weights, and any name a custom
/// class could read do). Weights are not
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
    let blind = if format == "keras" { crate::keras::names::blind_layer_names(&graph) } else { None };
    let names = if blind.is_some() { "names-blind" } else { "names" };
    if let Some(blind) = blind {
        graph = blind;
    }
    renumber_shared_objects(&mut graph, &mut Vec::new());
    let mut text = String::new();
    canonical_json(&graph, &mut text);
    let mut hasher = sha2::Sha256::new();
    for part in [format, keras_version.unwrap_or("-"), names, &text] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    crate::keras::cache::hex(&hasher.finalize())
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
