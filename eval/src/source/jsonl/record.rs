//! One line of a JSON Lines file, parsed: its object's keys handed with
//! their values' text ([`entries`]), the first line's keys with their kind
//! and shape ([`keys_of`]), and a later line's value of a key appended to
//! its column ([`push_value`]), walked leaf by leaf and never built.

use crate::source::lines::MAX_LINE_CELLS;
use crate::source::ColumnInfo;
use isorun_protocol::DType;
use isorun_tensors::json_value::{describe_raw, Checked, Leaf, WalkError, Walker};
use isorun_tensors::npy::Element;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::path::{Path, PathBuf};

/// The element type of a key's values, from the first line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Int,
    Float,
    Bool,
    String,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Int => "integers",
            Kind::Float => "numbers",
            Kind::Bool => "bools",
            Kind::String => "strings",
        }
    }

    pub(super) fn element(self) -> Element {
        match self {
            Kind::Int => Element::Dense(DType::Int64, false),
            Kind::Float => Element::Dense(DType::Float64, false),
            Kind::Bool => Element::Dense(DType::Bool, false),
            // Strings are handed as `Values::Strings`; no fixed width.
            Kind::String => Element::Bytes(0),
        }
    }

    fn dtype_name(self) -> &'static str {
        match self {
            Kind::Int => "int64",
            Kind::Float => "float64",
            Kind::Bool => "bool",
            Kind::String => "string",
        }
    }
}

/// One key, as the first line shows it.
#[derive(Debug, Clone)]
pub(super) struct Key {
    pub(super) name: String,
    /// `Err(what it is)` for a value no input can take (an object, a null).
    pub(super) kind: Result<Kind, String>,
    pub(super) dims: Vec<u64>,
}

impl Key {
    pub(super) fn kind(&self) -> Option<Kind> {
        self.kind.as_ref().ok().copied()
    }

    pub(super) fn describe(&self) -> String {
        match &self.kind {
            Err(what) => what.clone(),
            Ok(kind) if self.dims.is_empty() => kind.dtype_name().to_string(),
            Ok(kind) => format!("{} {:?}", kind.dtype_name(), self.dims),
        }
    }

    pub(super) fn info(&self, path: &Path, line: u64) -> ColumnInfo {
        ColumnInfo {
            name: self.name.clone(),
            path: key_path(path, &format!("line {line}"), &self.name),
            element: self.kind().map_or(Element::Bytes(0), Kind::element),
            dims: self.dims.clone(),
            describe: self.describe(),
        }
    }
}

/// Where a key's values are, for the shared conversions' errors.
pub(super) fn key_path(path: &Path, lines: &str, key: &str) -> PathBuf {
    PathBuf::from(format!("{}: {lines}: key '{key}'", path.display()))
}

/// A key of a line's object: borrowed where the text has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = std::borrow::Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = std::borrow::Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Borrowed(v))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(v.to_string()))
    }
}

/// Hands each key of an object, with its value's text, to a function; a
/// reason the function gives stops the walk (kept in `stop`).
struct Entries<'s, F> {
    take: F,
    stop: &'s mut Option<String>,
}

impl<'de, F: FnMut(&str, &'de RawValue) -> Result<(), String>> Visitor<'de> for Entries<'_, F> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let value = map.next_value::<&'de RawValue>()?;
            if let Err(reason) = (self.take)(&key, value) {
                *self.stop = Some(reason);
                return Err(serde::de::Error::custom("stopped"));
            }
        }
        Ok(())
    }
}

/// Why a line's value was not taken.
#[derive(Debug)]
pub(super) enum Fault {
    /// The line is not read (too deep): the message, as for bad JSON.
    Line(String),
    /// The value does not fit: what follows `key 'x' ` in the message.
    Value(String),
}

impl From<WalkError> for Fault {
    fn from(e: WalkError) -> Fault {
        match e {
            WalkError::Syntax(reason) => Fault::Line(reason),
            WalkError::Ragged(detail) => Fault::Value(format!("is a ragged nested list ({detail})")),
        }
    }
}

/// What the leaves of a first line's value are, gathered as they are met.
#[derive(Default)]
struct KindScan {
    leaves: u64,
    not_i64: bool,
    not_number: bool,
    not_bool: bool,
    not_string: bool,
    first_null: Option<String>,
    first: Option<String>,
}

impl KindScan {
    fn add(&mut self, raw: &RawValue, leaf: &Leaf) {
        self.leaves += 1;
        self.not_i64 |= !leaf.is_i64();
        self.not_number |= !(matches!(leaf, Leaf::Number(_)) || leaf.is_special_float());
        self.not_bool |= !matches!(leaf, Leaf::Bool(_));
        self.not_string |= !matches!(leaf, Leaf::String(_) | Leaf::Bytes(_));
        if matches!(leaf, Leaf::Null) && self.first_null.is_none() {
            self.first_null = Some(describe_raw(raw.get()));
        }
        if self.first.is_none() {
            self.first = Some(describe_raw(raw.get()));
        }
    }

    fn kind(self) -> Result<Kind, String> {
        if self.leaves == 0 {
            Ok(Kind::Float)
        } else if !self.not_i64 {
            Ok(Kind::Int)
        } else if !self.not_number {
            Ok(Kind::Float)
        } else if !self.not_bool {
            Ok(Kind::Bool)
        } else if !self.not_string {
            Ok(Kind::String)
        } else if let Some(null) = self.first_null {
            Err(format!("{null} (null is no value)"))
        } else if self.leaves == 1 {
            Err(format!("an object or value isorun does not read ({})", self.first.unwrap_or_default()))
        } else {
            Err("a list mixing numbers, bools, strings or objects".into())
        }
    }
}

/// Parses one line as a JSON object, handing each key and its value's
/// text to `take` (a key met twice is handed twice: the last one counts).
/// Errors: bad JSON (with its column), a line that is no object.
pub(super) fn entries<'a>(
    text: &'a [u8],
    take: impl FnMut(&str, &'a RawValue) -> Result<(), String>,
) -> Result<(), String> {
    let syntax = |e: serde_json::Error| {
        let message = e.to_string();
        let message = message.rsplit_once(" at line ").map_or(message.as_str(), |(m, _)| m).to_string();
        format!("column {}: not valid JSON: {message}", e.column())
    };
    // Checked whole first (without building anything), so that bad JSON
    // anywhere on the line is the line's error, as when lines were built.
    serde_json::from_slice::<Checked>(text).map_err(syntax)?;
    let text = std::str::from_utf8(text).map_err(|e| format!("column {}: not valid UTF-8", e.valid_up_to() + 1))?;
    if !text.trim_start().starts_with('{') {
        return Err(format!(
            "is {}, not a JSON object (one object per line, its keys the features)",
            describe_raw(text)
        ));
    }
    let mut stop = None;
    let walked = serde_json::Deserializer::from_str(text).deserialize_map(Entries { take, stop: &mut stop });
    match (stop, walked) {
        (Some(reason), _) => Err(reason),
        (None, Ok(())) => Ok(()),
        (None, Err(e)) => Err(syntax(e)),
    }
}

/// The first line's keys, each with its kind and shape, in the line's
/// order (a key met twice takes its last value, in its first place).
pub(super) fn keys_of(text: &[u8]) -> Result<Vec<Key>, String> {
    let mut keys: Vec<Key> = Vec::new();
    let mut places: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut line_error = None;
    entries(text, |name, raw| {
        let mut scan = KindScan::default();
        let mut walker =
            Walker::new(std::str::from_utf8(text).unwrap_or_default(), |raw: &RawValue, leaf| scan.add(raw, &leaf));
        let walked = walker.walk(raw, 0);
        let dims = walker.dims();
        let kind = match walked.map_err(Fault::from) {
            Err(Fault::Line(reason)) => {
                line_error = Some(reason);
                return Err("stopped".into());
            }
            Err(Fault::Value(e)) => Err(format!("a value that {e}")),
            Ok(()) if raw.get() == "null" => Err("null".to_string()),
            Ok(()) => scan.kind(),
        };
        let key = Key { name: name.to_string(), kind, dims };
        match places.get(name) {
            Some(&at) => keys[at] = key,
            None if keys.len() >= MAX_LINE_CELLS => {
                return Err(format!("has more than {MAX_LINE_CELLS} keys, the most a line may hold"))
            }
            None => {
                places.insert(name.to_string(), keys.len());
                keys.push(key);
            }
        }
        Ok(())
    })
    .map_err(|reason| line_error.take().unwrap_or(reason))?;
    Ok(keys)
}

/// The values of one key for the lines of a piece being read.
pub(super) enum Builder {
    Elements(Vec<u8>),
    Strings(Vec<Vec<u8>>),
}

/// Appends one line's value of `key` (its text `raw`, on the line `line`);
/// the reason it does not fit, if not. A key of integers that meets a
/// number with a fraction becomes a key of numbers from there on (the
/// values already read are converted): JSON writers differ on whether
/// `0.0` is written `0`. Leaves are appended as they are walked, at most as
/// many as the key's shape holds.
pub(super) fn push_value(
    key: &mut Key,
    line: &str,
    raw: &RawValue,
    first_line: u64,
    out: &mut Builder,
) -> Result<(), Fault> {
    if raw.get() == "null" {
        return Err(Fault::Value(format!("is null; expected {} (as on line {first_line})", key.describe())));
    }
    let per_row: u64 = key.dims.iter().product();
    let mut pushed = 0u64;
    let mut wrong: Option<String> = None;
    let before = match out {
        Builder::Elements(bytes) => bytes.len(),
        Builder::Strings(strings) => strings.len(),
    };
    let (key_describe, key_name) = (key.describe(), key.kind().map_or("values", Kind::name));
    let kind = &mut key.kind;
    let mut walker =
        Walker::new(line, |raw: &RawValue, leaf: Leaf| {
            if wrong.is_some() || pushed >= per_row {
                return;
            }
            pushed += 1;
            let fail = || {
                Some(format!(
                    "holds {}; expected {key_name} (as on line {first_line}: {key_describe})",
                    describe_raw(raw.get())
                ))
            };
            match (kind.as_ref().ok().copied().expect("checked when opened"), &mut *out) {
                (Kind::Int, Builder::Elements(bytes)) => {
                    let int = match &leaf {
                        Leaf::Number(n) => n.as_i64().or_else(|| {
                            let f = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)?;
                            Some(f as i64)
                        }),
                        _ => None,
                    };
                    match (int, &leaf) {
                        (Some(i), _) => bytes.extend_from_slice(&i.to_le_bytes()),
                        (None, Leaf::Number(n)) if n.as_f64().is_some() => {
                            let ints = std::mem::take(bytes);
                            bytes.extend(ints.chunks_exact(8).flat_map(|c| {
                                (i64::from_le_bytes(c.try_into().expect("8 bytes")) as f64).to_le_bytes()
                            }));
                            bytes.extend_from_slice(&n.as_f64().unwrap_or_default().to_le_bytes());
                            *kind = Ok(Kind::Float);
                        }
                        _ => wrong = fail(),
                    }
                }
                (Kind::Float, Builder::Elements(bytes)) => match leaf.as_f64() {
                    Some(f) => bytes.extend_from_slice(&f.to_le_bytes()),
                    None => wrong = fail(),
                },
                (Kind::Bool, Builder::Elements(bytes)) => match leaf {
                    Leaf::Bool(b) => bytes.push(u8::from(b)),
                    _ => wrong = fail(),
                },
                (Kind::String, Builder::Strings(strings)) => match leaf {
                    Leaf::String(s) => strings.push(s.into_bytes()),
                    Leaf::Bytes(b) => strings.push(b),
                    _ => wrong = fail(),
                },
                _ => unreachable!("the builder is the kind's"),
            }
        });
    walker.walk(raw, 0)?;
    let dims = walker.dims();
    if dims != key.dims {
        match out {
            Builder::Elements(bytes) => bytes.truncate(before),
            Builder::Strings(strings) => strings.truncate(before),
        }
        let shape = |d: &[u64]| if d.is_empty() { "one value".to_string() } else { format!("a list of shape {d:?}") };
        return Err(Fault::Value(format!(
            "is {} but {} on line {first_line}; expected {}, given {}",
            shape(&dims),
            shape(&key.dims),
            key.describe(),
            describe_raw(raw.get())
        )));
    }
    wrong.map_or(Ok(()), |reason| Err(Fault::Value(reason)))
}
