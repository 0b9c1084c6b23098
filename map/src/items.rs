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
    /// A JSON item's text as given: the call parses it (`json.loads`), so
    /// that what Python reads (big integers, `1e999`, lone surrogates, any
    /// depth) arrives unchanged.
    JsonText(String),
    /// A file holding the pickled item (`--items-pickled`).
    Pickle(PathBuf),
}

impl Item {
    /// An item given as text: text that starts like a JSON object, array,
    /// string or literal (`{`, `[`, `"`, `true`, `false`, `null`) must be
    /// JSON as Python's `json` reads it (`Err`: why not); text that starts
    /// with a digit or `-` is a JSON number where it is one and otherwise a
    /// plain string (a path such as `3d.txt`, a date such as `2024-01-01`),
    /// as is any other text.
    pub fn from_text(index: usize, text: &str) -> Result<Item, String> {
        let trimmed = text.trim_matches(JSON_SPACE);
        let plain = || {
            let value = Value::String(text.to_string());
            let key = hex(&Sha256::digest(value.to_string().as_bytes()));
            Item { index, shown: value.clone(), payload: Payload::Json(value), key }
        };
        let must_be_json = trimmed.starts_with(['{', '[', '"'])
            || ["true", "false", "null"].iter().any(|word| {
                trimmed
                    .strip_prefix(word)
                    .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
            });
        let may_be_number = trimmed.starts_with('-') || trimmed.starts_with(|c: char| c.is_ascii_digit());
        if !must_be_json && !may_be_number {
            return Ok(plain());
        }
        if let Err(e) = check_json(trimmed.as_bytes()) {
            if must_be_json {
                return Err(format!("starts like JSON but is not JSON: {e}"));
            }
            return Ok(plain());
        }
        // Records show what serde_json reads of it (exact but for integers
        // past 64 bits, which show rounded; the call gets them whole).
        let (shown, key) = match serde_json::from_str::<Value>(trimmed) {
            Ok(value) if !has_long_integer(trimmed.as_bytes()) => {
                let key = hex(&Sha256::digest(canonical(&value).to_string().as_bytes()));
                (value, key)
            }
            parsed => (parsed.unwrap_or_else(|_| Value::String(trimmed.to_string())), hex(&Sha256::digest(trimmed))),
        };
        Ok(Item { index, shown, payload: Payload::JsonText(trimmed.to_string()), key })
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

/// Where `--items-from` reads: its non-empty lines, each with its 1-based
/// line number in the file.
pub fn read_lines(path: &std::path::Path) -> Result<Vec<(usize, String)>, MapError> {
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
    Ok(text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| (i + 1, line.to_string()))
        .collect())
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

/// What JSON counts as white space around a value.
const JSON_SPACE: [char; 4] = [' ', '\t', '\n', '\r'];

/// Whether the text holds an integer of 20 digits or more (past what
/// serde_json keeps exactly): such an item's key is its text's.
fn has_long_integer(text: &[u8]) -> bool {
    let mut run = 0;
    isorun_tensors::json_cost::outside_strings(text).any(|byte| {
        run = if byte.is_ascii_digit() { run + 1 } else { 0 };
        run >= 20
    })
}

/// Checks that `text` is one JSON value as Python's `json.loads` reads it:
/// any depth (no recursion here), any number (`1e999`, big integers),
/// `NaN`/`Infinity`/`-Infinity`, lone surrogate escapes; no control
/// characters inside strings, nothing after the value but white space.
fn check_json(text: &[u8]) -> Result<(), String> {
    let mut at = 0;
    let mut open: Vec<u8> = Vec::new();
    let space = |at: &mut usize| {
        while text.get(*at).is_some_and(|b| b" \t\n\r".contains(b)) {
            *at += 1;
        }
    };
    let fail = |at: usize, what: &str| Err(format!("{what} at byte {}", at + 1));
    'value: loop {
        space(&mut at);
        match text.get(at) {
            Some(b'{') | Some(b'[') => {
                let close = if text[at] == b'{' { b'}' } else { b']' };
                open.push(text[at]);
                at += 1;
                space(&mut at);
                if text.get(at) == Some(&close) {
                    open.pop();
                    at += 1;
                } else if open.last() == Some(&b'{') {
                    at = key(text, at)?;
                    continue 'value;
                } else {
                    continue 'value;
                }
            }
            Some(b'"') => at = string(text, at)?,
            Some(b'-') | Some(b'0'..=b'9') => at = number(text, at)?,
            Some(_) => {
                let word = ["true", "false", "null", "NaN", "Infinity"]
                    .iter()
                    .find(|w| text[at..].starts_with(w.as_bytes()))
                    .map(|w| w.len());
                match word {
                    Some(n) => at += n,
                    None => return fail(at, "expected a value"),
                }
            }
            None => return fail(at, "expected a value, found the end"),
        }
        // After a value: a comma (then another), a close, or the end.
        loop {
            space(&mut at);
            let Some(&inside) = open.last() else {
                return if at == text.len() { Ok(()) } else { fail(at, "unexpected text after the value") };
            };
            match (inside, text.get(at)) {
                (_, Some(b',')) => {
                    at += 1;
                    if inside == b'{' {
                        space(&mut at);
                        at = key(text, at)?;
                    }
                    continue 'value;
                }
                (b'{', Some(b'}')) | (b'[', Some(b']')) => {
                    open.pop();
                    at += 1;
                }
                (_, None) => return fail(at, "unclosed, found the end"),
                _ => return fail(at, "expected a comma or a close"),
            }
        }
    }
}

/// An object's key and its colon: where its value starts.
fn key(text: &[u8], at: usize) -> Result<usize, String> {
    if text.get(at) != Some(&b'"') {
        return Err(format!("expected a key (a string) at byte {}", at + 1));
    }
    let mut at = string(text, at)?;
    while text.get(at).is_some_and(|b| b" \t\n\r".contains(b)) {
        at += 1;
    }
    if text.get(at) != Some(&b':') {
        return Err(format!("expected a colon at byte {}", at + 1));
    }
    Ok(at + 1)
}

/// A string starting at `at` (its quote): where it ends.
fn string(text: &[u8], mut at: usize) -> Result<usize, String> {
    at += 1;
    loop {
        match text.get(at) {
            Some(b'"') => return Ok(at + 1),
            Some(b'\\') => match text.get(at + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => at += 2,
                Some(b'u') if text.get(at + 2..at + 6).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) => at += 6,
                _ => return Err(format!("bad escape at byte {}", at + 1)),
            },
            Some(&b) if b < 0x20 => return Err(format!("control character in a string at byte {}", at + 1)),
            Some(_) => at += 1,
            None => return Err(format!("unterminated string at byte {}", at + 1)),
        }
    }
}

/// A number (or `-Infinity`) starting at `at`: where it ends.
fn number(text: &[u8], mut at: usize) -> Result<usize, String> {
    let start = at;
    if text.get(at) == Some(&b'-') {
        at += 1;
        if text[at..].starts_with(b"Infinity") {
            return Ok(at + 8);
        }
    }
    let digits = |at: &mut usize| {
        let from = *at;
        while text.get(*at).is_some_and(u8::is_ascii_digit) {
            *at += 1;
        }
        *at - from
    };
    match text.get(at) {
        Some(b'0') => at += 1,
        Some(b'1'..=b'9') => {
            digits(&mut at);
        }
        _ => return Err(format!("bad number at byte {}", start + 1)),
    }
    if text.get(at) == Some(&b'.') {
        at += 1;
        if digits(&mut at) == 0 {
            return Err(format!("bad number at byte {}", start + 1));
        }
    }
    if matches!(text.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(text.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        if digits(&mut at) == 0 {
            return Err(format!("bad number at byte {}", start + 1));
        }
    }
    Ok(at)
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
        let item = |text: &str| Item::from_text(0, text).unwrap();
        assert_eq!(item("3").shown, serde_json::json!(3));
        assert_eq!(item("data/a.txt").shown, serde_json::json!("data/a.txt"));
        assert_eq!(item(r#"{"a":1,"b":2}"#).key, item(r#"{"b":2,"a":1}"#).key);
        assert_ne!(item("1").key, item("\"1\"").key);
        for good in ["1e999", "\"\\ud800\"", "12345678901234567890123", "-Infinity", "[NaN, {\"a\": []}]", " [1] "] {
            assert!(Item::from_text(0, good).is_ok(), "{good}");
        }
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(Item::from_text(0, &deep).is_ok());
        for bad in ["{\"a\": ", "[1,]", "\"a", "[1] x", "{1: 2}", "true x", "\"a\tb\""] {
            assert!(Item::from_text(0, bad).is_err(), "{bad}");
        }
        // A digit or '-' starts a number only where the text is one.
        for plain in ["01", "-", "1.", "2024-01-01", "3d.txt", "-v.txt"] {
            assert_eq!(item(plain).shown, serde_json::json!(plain), "{plain}");
        }
        assert_eq!(item("truth.txt").shown, serde_json::json!("truth.txt"));
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
