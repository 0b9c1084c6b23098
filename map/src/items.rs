//! What the function is called on: items from arguments, from a file or
//! stdin (one per line), each a JSON value when it parses as one and a
//! plain string (a path) otherwise; or, for the Python API
//! (`--items-pickled`), lines naming a pickled item's file and how records
//! show it (its repr, or its JSON when it is plain JSON data). Each item gets its journal key here: the SHA-256 of its
//! canonical JSON text, or of its pickle's bytes.

use crate::MapError;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::PathBuf;

/// One call's argument.
#[derive(Debug, Clone)]
pub struct Item {
    /// 0-based, in the order given.
    pub index: usize,
    /// What records show as `"item"`: the JSON item, or the pickled item's repr.
    pub shown: Value,
    pub payload: Payload,
    /// SHA-256 (hex) of what the call receives, for journal keys.
    pub key: String,
}

/// How the item reaches the call.
#[derive(Debug, Clone)]
pub enum Payload {
    Json(Value),
    /// A file holding the pickled item (`--items-pickled`).
    Pickle(PathBuf),
}

impl Item {
    /// An item given as text: JSON if it parses, else the string itself.
    pub fn from_text(index: usize, text: &str) -> Item {
        let value = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()));
        let key = hex(&Sha256::digest(canonical(&value).to_string().as_bytes()));
        Item { index, shown: value.clone(), payload: Payload::Json(value), key }
    }

    /// A line of `--items-pickled`: `{"file": PATH, "repr": STRING}`, with
    /// an optional `"json": VALUE` that records then show instead of the
    /// repr (an int item as `1`, not `"1"`); the key is the pickle's still.
    pub fn from_pickled_line(index: usize, line: &str, what: &str, number: usize) -> Result<Item, MapError> {
        let bad = |reason: String| MapError::BadItemLine { what: what.to_string(), line: number, reason };
        let value: Value = serde_json::from_str(line).map_err(|e| {
            bad(format!("expected {{\"file\": PATH, \"repr\": STRING}}, given text that is not JSON ({e})"))
        })?;
        let (Some(file), Some(repr)) = (value["file"].as_str(), value["repr"].as_str()) else {
            return Err(bad(format!("expected {{\"file\": PATH, \"repr\": STRING}}, given {}", short(line))));
        };
        let path = PathBuf::from(file);
        let bytes = std::fs::read(&path).map_err(|source| MapError::ReadPickle { path: path.clone(), source })?;
        Ok(Item {
            index,
            shown: value.get("json").cloned().unwrap_or_else(|| Value::String(repr.to_string())),
            payload: Payload::Pickle(path),
            key: hex(&Sha256::digest(&bytes)),
        })
    }

    /// How tables and report units name the item: a string as it is, any
    /// other JSON as its text.
    pub fn display(&self) -> String {
        match &self.shown {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        }
    }
}

/// Where `--items-from` reads.
pub fn read_lines(path: &std::path::Path) -> Result<Vec<String>, MapError> {
    let mut text = String::new();
    let what = if path.as_os_str() == "-" {
        "--items-from - (stdin)".to_string()
    } else {
        format!("--items-from {}", path.display())
    };
    let read = if path.as_os_str() == "-" {
        std::io::stdin().lock().read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_string(&mut text))
    };
    read.map_err(|source| MapError::ReadItems { what, source })?;
    Ok(text.lines().filter(|line| !line.trim().is_empty()).map(str::to_string).collect())
}

/// The value with object keys sorted at every level (serde_json keeps the
/// order given), so that `{"a":1,"b":2}` and `{"b":2,"a":1}` are one item.
fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(keys.into_iter().map(|k| (k.clone(), canonical(&map[k]))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn short(text: &str) -> String {
    if text.chars().count() > 80 {
        format!("{}...", text.chars().take(80).collect::<String>())
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_json_when_it_parses_else_a_string() {
        assert_eq!(Item::from_text(0, "3").shown, serde_json::json!(3));
        assert_eq!(Item::from_text(0, "data/a.txt").shown, serde_json::json!("data/a.txt"));
        assert_eq!(Item::from_text(0, r#"{"a":1,"b":2}"#).key, Item::from_text(1, r#"{"b":2,"a":1}"#).key);
        assert_ne!(Item::from_text(0, "1").key, Item::from_text(0, "\"1\"").key);
    }

    #[test]
    fn a_pickled_line_s_json_is_what_records_show_else_its_repr() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("0.pkl");
        std::fs::write(&file, b"pickle").unwrap();
        let line = |extra: &str| format!("{{\"file\": {:?}, \"repr\": \"1\"{extra}}}", file.to_str().unwrap());
        let with_json = Item::from_pickled_line(0, &line(", \"json\": 1"), "x", 1).unwrap();
        let without = Item::from_pickled_line(0, &line(""), "x", 1).unwrap();
        assert_eq!(with_json.shown, serde_json::json!(1));
        assert_eq!(without.shown, serde_json::json!("1"));
        assert_eq!(with_json.key, without.key, "the key is the pickle's either way");
    }

    #[test]
    fn a_malformed_pickled_line_names_the_file_and_line() {
        let error = Item::from_pickled_line(0, "{\"file\": 3}", "--items-from x.jsonl", 4).unwrap_err().to_string();
        assert!(error.starts_with("--items-from x.jsonl line 4: expected"), "{error}");
    }
}
