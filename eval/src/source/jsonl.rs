//! JSON Lines files (`.jsonl`, `.ndjson`, and their `.gz`) as columns: one
//! JSON object per line, one example per object, its keys the columns.
//!
//! Why columnar and not rows: a value may be a nested list (`[[1, 2], [3,
//! 4]]`) that feeds a `[N, 2, 2]` input, or a string that feeds a string
//! tensor. A `tf.Example` (the row sources' type) flattens lists and keeps
//! floats as `float32`, so the shape of a value and the precision of a
//! `float64` would be lost; as columns, each key hands its values with the
//! first line's dimensions and element type, and the shared conversions in
//! `batch` shape and convert them as for `.npz` arrays. A piece is up to a
//! batch of lines, parsed one at a time.
//!
//! Decisions:
//! - Values are as in JSON inputs (`isorun_tensors::json_input`): numbers,
//!   bools, strings (UTF-8 text, or `{"base64": "..."}` for bytes), nested
//!   lists whose nesting is their shape. A key's element type and shape are
//!   its value's on the file's first line: integers (`int64`; a later
//!   `1.5` makes the key's values `float64` from there on, as JSON writers
//!   differ on writing `0.0` as `0`), floats (`float64`; integers and
//!   `"NaN"`, `"Infinity"`, `"-Infinity"` are taken), bools, strings. A later
//!   line's value of another type or shape, missing or `null`, is an error
//!   naming the file, the line (1-based) and the key, expected vs given.
//! - Blank lines are skipped (and counted in line numbers); a UTF-8 byte
//!   order mark on the first line is ignored; every other line must be one
//!   JSON object. Bad JSON names the line and the column.
//! - Untrusted input: a line longer than [`MAX_LINE_BYTES`] is an error,
//!   found without holding more than that much of it (a gzip file's line:
//!   longer than twice the compressed file, at least 8 MiB: a few KB must
//!   not decompress to a 60 MiB line, see `lines::compressed_line_cap`); nesting deeper than
//!   serde_json's recursion limit (128) is an error, not a stack overflow;
//!   gzip is decompressed as a stream, and a truncated or corrupt stream is
//!   an error naming the file. A piece holds at most [`PIECE_BYTES`] of
//!   lines (and at least one line). A line is walked, never built: each
//!   key's value is read element by element (serde_json's `RawValue`)
//!   straight into its column, so a line costs about its bytes and the
//!   values it makes (a `serde_json::Value` a number cost ~70 bytes: a
//!   60 MiB line of zeros took 2.5 GiB). The first line holds at most
//!   [`MAX_LINE_CELLS`] keys; a key met twice on a line takes its last value.
//! - Parts: of a plain file, part `K` of `N` is the lines that *start* in
//!   the bytes `[K*len/N, (K+1)*len/N)` (a part entered midway skips to the
//!   next line start: a line belongs to the part where it starts); of a
//!   gzip file, which cannot be entered midway, the lines `[K*n/N,
//!   (K+1)*n/N)` of its `n` (blank lines not counted), counted by a first
//!   pass. A part of a plain file counts the lines before it only when an
//!   error needs the line's number.

use super::lines::{compressed_line_cap, MAX_LINE_CELLS, MIN_COMPRESSED_LINE_BYTES};
/// The capped line reader, shared with rescore's JSON Lines predictions
/// (`crate::predictions::read`): one line cap for every JSON Lines reader.
pub(crate) use super::lines::{read_line, without_line_end, LineError};
use super::{ColumnChunk, ColumnInfo, Look, Options, Piece, Source, Values};
use crate::error::DataError;
use base64::Engine;
use isorun_protocol::DType;
use isorun_tensors::npy::Element;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The longest line read (without its line end): the cap `source::lines`
/// holds every text format to.
pub use super::lines::MAX_LINE_BYTES;

/// The most line bytes one piece holds (it holds at least one line).
pub const PIECE_BYTES: usize = 64 << 20;

/// Buffer of the file (and of the decompressed stream).
const READ_BUFFER: usize = 256 << 10;

/// The element type of a key's values, from the first line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
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

    fn element(self) -> Element {
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
struct Key {
    name: String,
    /// `Err(what it is)` for a value no input can take (an object, a null).
    kind: Result<Kind, String>,
    dims: Vec<u64>,
}

impl Key {
    fn kind(&self) -> Option<Kind> {
        self.kind.as_ref().ok().copied()
    }

    fn describe(&self) -> String {
        match &self.kind {
            Err(what) => what.clone(),
            Ok(kind) if self.dims.is_empty() => kind.dtype_name().to_string(),
            Ok(kind) => format!("{} {:?}", kind.dtype_name(), self.dims),
        }
    }

    fn info(&self, path: &Path, line: u64) -> ColumnInfo {
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
fn key_path(path: &Path, lines: &str, key: &str) -> PathBuf {
    PathBuf::from(format!("{}: {lines}: key '{key}'", path.display()))
}

/// How deep values may nest (serde_json's own limit when it builds values).
const MAX_DEPTH: usize = 128;

/// One leaf of a value, as parsed from its text (never a whole value: a
/// line is walked, not built, so that it costs about its own bytes).
enum Leaf {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    /// `{"base64": "..."}`, decoded.
    Bytes(Vec<u8>),
    /// Any other object.
    Object,
}

impl Leaf {
    fn parse(raw: &RawValue) -> Leaf {
        let text = raw.get();
        match text.as_bytes().first() {
            Some(b'n') => Leaf::Null,
            Some(b't') => Leaf::Bool(true),
            Some(b'f') => Leaf::Bool(false),
            Some(b'"') => serde_json::from_str(text).map_or(Leaf::Object, Leaf::String),
            Some(b'{') => serde_json::Deserializer::from_str(text)
                .deserialize_map(Base64Visitor)
                .ok()
                .flatten()
                .map_or(Leaf::Object, Leaf::Bytes),
            _ => serde_json::from_str(text).map_or(Leaf::Object, Leaf::Number),
        }
    }

    fn is_i64(&self) -> bool {
        matches!(self, Leaf::Number(n) if n.is_i64())
    }

    fn is_special_float(&self) -> bool {
        matches!(self, Leaf::String(s) if matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity"))
    }

    fn as_f64(&self) -> Option<f64> {
        match self {
            Leaf::Number(n) => n.as_f64(),
            Leaf::String(s) => match s.as_str() {
                "NaN" => Some(f64::NAN),
                "Infinity" => Some(f64::INFINITY),
                "-Infinity" => Some(f64::NEG_INFINITY),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Reads `{"base64": "..."}` (exactly that one key) as its decoded bytes.
struct Base64Visitor;

impl<'de> Visitor<'de> for Base64Visitor {
    type Value = Option<Vec<u8>>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object of one key, base64")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? else { return Ok(None) };
        if key != "base64" {
            return Ok(None);
        }
        let Ok(text) = map.next_value::<String>() else { return Ok(None) };
        if map.next_key::<IgnoredAny>()?.is_some() {
            return Ok(None);
        }
        Ok(base64::engine::general_purpose::STANDARD.decode(text).ok())
    }
}

/// Any JSON value, parsed as serde_json parses values (its messages, its
/// recursion limit) and dropped as it goes: a line's syntax checked without
/// building it.
struct Checked;

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Checked)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value::<Checked>()?;
        }
        Ok(Checked)
    }
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

/// Hands each element of a list, as its text, to a function (as [`Entries`]).
struct Elements<'s, F> {
    take: F,
    stop: &'s mut Option<WalkError>,
}

impl<'de, F: FnMut(&'de RawValue) -> Result<(), WalkError>> Visitor<'de> for Elements<'_, F> {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<u64, A::Error> {
        let mut count = 0u64;
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            count += 1;
            if let Err(e) = (self.take)(item) {
                *self.stop = Some(e);
                return Err(serde::de::Error::custom("stopped"));
            }
        }
        Ok(count)
    }
}

/// Why walking a value stopped.
#[derive(Debug)]
enum WalkError {
    /// The line is not read (too deep): the message, as for bad JSON.
    Line(String),
    /// The value does not fit: what follows `key 'x' ` in the message.
    Value(String),
}

/// A compact description of a value's text, for messages: its first 60
/// characters without the whitespace between tokens.
fn describe_raw(text: &str) -> String {
    let mut out = String::new();
    let (mut in_string, mut escaped) = (false, false);
    for c in text.trim().chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c.is_whitespace() {
            continue;
        } else if c == '"' {
            in_string = true;
        }
        if out.len() >= 60 {
            out.push_str("...");
            return out;
        }
        out.push(c);
    }
    out
}

/// The walk of one value: its shape found along the way (the lengths of
/// the first list at each depth, as they end), raggedness found as soon as
/// it shows, and each leaf handed to `leaf` with its depth.
struct Walker<'a, F> {
    /// The line's text, to say where a value is.
    line: &'a str,
    /// The length of the lists at each depth, once one has ended.
    shape: Vec<Option<u64>>,
    /// The depth of the leaves, once one is met.
    rank: Option<usize>,
    leaf: F,
}

impl<'a, F: FnMut(&'a RawValue, Leaf) -> Result<(), WalkError>> Walker<'a, F> {
    fn new(line: &'a str, leaf: F) -> Self {
        Walker { line, shape: Vec::new(), rank: None, leaf }
    }

    fn walk(&mut self, raw: &'a RawValue, depth: usize) -> Result<(), WalkError> {
        let text = raw.get();
        if !text.starts_with('[') {
            let listed = self.shape.get(depth).is_some_and(Option::is_some);
            if listed || self.rank.is_some_and(|r| r != depth) {
                return Err(WalkError::Value(format!(
                    "is a ragged nested list ({} where a list was expected)",
                    describe_raw(text)
                )));
            }
            self.rank = Some(depth);
            return (self.leaf)(raw, Leaf::parse(raw));
        }
        if self.rank.is_some_and(|r| depth >= r) {
            return Err(WalkError::Value("is a ragged nested list (a list where a value was expected)".into()));
        }
        if depth >= MAX_DEPTH {
            let column = text.as_ptr() as usize - self.line.as_ptr() as usize + 1;
            return Err(WalkError::Line(format!("column {column}: not valid JSON: recursion limit exceeded")));
        }
        let mut stop = None;
        let counted = serde_json::Deserializer::from_str(text)
            .deserialize_seq(Elements { take: |item| self.walk(item, depth + 1), stop: &mut stop });
        let count = match (stop, counted) {
            (Some(e), _) => return Err(e),
            (None, Ok(count)) => count,
            // Checked as JSON before any walk.
            (None, Err(e)) => return Err(WalkError::Line(format!("not valid JSON: {e}"))),
        };
        if self.shape.len() <= depth {
            self.shape.resize(depth + 1, None);
        }
        match self.shape[depth] {
            None => self.shape[depth] = Some(count),
            Some(n) if n != count => {
                return Err(WalkError::Value(format!(
                    "is a ragged nested list (a list of {count} where {n} were expected)"
                )))
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The shape walked: the lengths of the first lists, as deep as they go.
    fn dims(&self) -> Vec<u64> {
        self.shape.iter().map_while(|d| *d).collect()
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
fn entries<'a>(text: &'a [u8], take: impl FnMut(&str, &'a RawValue) -> Result<(), String>) -> Result<(), String> {
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
fn keys_of(text: &[u8]) -> Result<Vec<Key>, String> {
    let mut keys: Vec<Key> = Vec::new();
    let mut places: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut line_error = None;
    entries(text, |name, raw| {
        let mut scan = KindScan::default();
        let mut walker = Walker::new(std::str::from_utf8(text).unwrap_or_default(), |raw, leaf: Leaf| {
            scan.add(raw, &leaf);
            Ok(())
        });
        let walked = walker.walk(raw, 0);
        let dims = walker.dims();
        let kind = match walked {
            Err(WalkError::Line(reason)) => {
                line_error = Some(reason);
                return Err("stopped".into());
            }
            Err(WalkError::Value(e)) => Err(format!("a value that {e}")),
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
enum Builder {
    Elements(Vec<u8>),
    Strings(Vec<Vec<u8>>),
}

/// Appends one line's value of `key` (its text `raw`, on the line `line`);
/// the reason it does not fit, if not. A key of integers that meets a
/// number with a fraction becomes a key of numbers from there on (the
/// values already read are converted): JSON writers differ on whether
/// `0.0` is written `0`. Leaves are appended as they are walked, at most as
/// many as the key's shape holds.
fn push_value(key: &mut Key, line: &str, raw: &RawValue, first_line: u64, out: &mut Builder) -> Result<(), WalkError> {
    if raw.get() == "null" {
        return Err(WalkError::Value(format!("is null; expected {} (as on line {first_line})", key.describe())));
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
        Walker::new(line, |raw, leaf: Leaf| {
            if wrong.is_some() || pushed >= per_row {
                return Ok(());
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
            Ok(())
        });
    walker.walk(raw, 0)?;
    let dims = walker.dims();
    if dims != key.dims {
        match out {
            Builder::Elements(bytes) => bytes.truncate(before),
            Builder::Strings(strings) => strings.truncate(before),
        }
        let shape = |d: &[u64]| if d.is_empty() { "one value".to_string() } else { format!("a list of shape {d:?}") };
        return Err(WalkError::Value(format!(
            "is {} but {} on line {first_line}; expected {}, given {}",
            shape(&dims),
            shape(&key.dims),
            key.describe(),
            describe_raw(raw.get())
        )));
    }
    wrong.map_or(Ok(()), |reason| Err(WalkError::Value(reason)))
}

/// Lines of a stream, each at most [`MAX_LINE_BYTES`], blank ones skipped.
struct Lines {
    reader: Box<dyn BufRead + Send>,
    /// Lines read (the last one's 1-based number, counted from where reading began).
    line: u64,
    /// The byte offset (in the file, or in the decompressed stream) of the next line.
    offset: u64,
    buf: Vec<u8>,
    /// The last line's text in `buf` (without its line end, or a byte order mark).
    text: std::ops::Range<usize>,
    max_line: usize,
    /// The compressed file's bytes (gzip), which cap a line ([`compressed_line_cap`]).
    compressed_len: Option<u64>,
}

/// Why a line could not be read: its number (counted as [`Lines::line`]) and why.
struct LineFault {
    line: u64,
    reason: String,
}

impl Lines {
    /// Lines of a plain file's `reader` (`compressed_len` `None`), or of a
    /// gzip file of `compressed_len` bytes.
    fn new(reader: Box<dyn BufRead + Send>, compressed_len: Option<u64>, offset: u64) -> Lines {
        let max_line = compressed_len.map_or(MAX_LINE_BYTES, compressed_line_cap);
        Lines { reader, line: 0, offset, buf: Vec::new(), text: 0..0, max_line, compressed_len }
    }

    /// The last line read by [`Lines::next`].
    fn text(&self) -> &[u8] {
        &self.buf[self.text.clone()]
    }

    /// Reads the next non-blank line that starts before byte `end` (see
    /// [`Lines::text`]); false at the end (of the stream, or before `end`).
    fn next(&mut self, end: u64) -> Result<bool, LineFault> {
        loop {
            if self.offset >= end {
                return Ok(false);
            }
            let n = match read_line(&mut self.reader, &mut self.buf, self.max_line) {
                Ok(n) => n,
                Err(LineError::Io(e)) => {
                    return Err(LineFault {
                        line: self.line + 1,
                        reason: if self.compressed_len.is_some() {
                            format!("cannot read: the gzip stream is corrupt or truncated ({e})")
                        } else {
                            format!("cannot read: {e}")
                        },
                    })
                }
                Err(LineError::TooLong { max }) => {
                    let reason = match self.compressed_len {
                        None => format!(
                            "the line is longer than {max} bytes, the most a line may hold (one JSON object per line)"
                        ),
                        Some(len) => format!(
                            "the line is longer than {max} bytes, the most a line of this {len}-byte gzip file may \
                             hold (twice the compressed file, at least {MIN_COMPRESSED_LINE_BYTES}, at most \
                             {MAX_LINE_BYTES}: a line that much larger than its compressed file is a decompression \
                             bomb; split the line, or store the file uncompressed)"
                        ),
                    };
                    return Err(LineFault { line: self.line + 1, reason });
                }
            };
            if n == 0 {
                return Ok(false);
            }
            self.line += 1;
            let start = self.offset;
            self.offset += n as u64;
            let mut text = 0..without_line_end(&self.buf).len();
            if start == 0 && self.buf.starts_with("\u{feff}".as_bytes()) {
                text.start = 3.min(text.end);
            }
            if self.buf[text.clone()].iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            self.text = text;
            return Ok(true);
        }
    }
}

/// How a file is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
}

fn open_stream(path: &Path, compression: Compression) -> Result<Lines, DataError> {
    let file = File::open(path).map_err(super::io_error(path))?;
    Ok(match compression {
        Compression::None => Lines::new(Box::new(BufReader::with_capacity(READ_BUFFER, file)), None, 0),
        Compression::Gzip => {
            let len = file.metadata().map_err(super::io_error(path))?.len();
            let decoder = flate2::read::MultiGzDecoder::new(BufReader::with_capacity(READ_BUFFER, file));
            Lines::new(Box::new(BufReader::with_capacity(READ_BUFFER, decoder)), Some(len), 0)
        }
    })
}

fn jsonl_error(path: &Path, line: u64, reason: String) -> DataError {
    DataError::Jsonl { path: path.to_path_buf(), line, reason }
}

/// The file's first object and its line; `None` for a file of blank lines.
fn first_object(path: &Path, lines: &mut Lines) -> Result<Option<(Vec<Key>, u64)>, DataError> {
    if !lines.next(u64::MAX).map_err(|f| jsonl_error(path, f.line, f.reason))? {
        return Ok(None);
    }
    let keys = keys_of(lines.text()).map_err(|r| jsonl_error(path, lines.line, r))?;
    Ok(Some((keys, lines.line)))
}

fn peek(path: &Path, compression: Compression) -> Result<Option<Look>, DataError> {
    let mut lines = open_stream(path, compression)?;
    Ok(first_object(path, &mut lines)?
        .map(|(keys, line)| Look::Columns(keys.iter().map(|k| k.info(path, line)).collect())))
}

pub(crate) fn peek_plain(path: &Path, _options: &Options) -> Result<Option<Look>, DataError> {
    peek(path, Compression::None)
}

pub(crate) fn peek_gzip(path: &Path, _options: &Options) -> Result<Option<Look>, DataError> {
    peek(path, Compression::Gzip)
}

pub(crate) fn open_plain(path: &Path, options: &Options) -> Result<Box<dyn Source>, DataError> {
    open(path, Compression::None, options)
}

pub(crate) fn open_gzip(path: &Path, options: &Options) -> Result<Box<dyn Source>, DataError> {
    open(path, Compression::Gzip, options)
}

fn open(path: &Path, compression: Compression, options: &Options) -> Result<Box<dyn Source>, DataError> {
    let mut lines = open_stream(path, compression)?;
    let Some((keys, first_line)) = first_object(path, &mut lines)? else {
        return Ok(Box::new(JsonlSource::empty(path)));
    };
    let mut wanted = Vec::with_capacity(options.columns.len());
    for name in &options.columns {
        let Some(key) = keys.iter().find(|k| &k.name == name) else {
            let has: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
            return Err(jsonl_error(
                path,
                first_line,
                format!("has no key '{name}'; the first line's keys are: {}", has.join(", ")),
            ));
        };
        if let Err(what) = &key.kind {
            return Err(jsonl_error(
                path,
                first_line,
                format!("key '{name}' is {what}; expected a value isorun reads"),
            ));
        }
        wanted.push(key.clone());
    }
    let columns = wanted.iter().map(|k| k.info(path, first_line)).collect();
    // Where this part's lines are: byte offsets (plain) or line numbers (gzip).
    let (lines, end, skip, rows, part_start) = if options.part.is_whole() {
        (open_stream(path, compression)?, u64::MAX, 0, u64::MAX, 0)
    } else if compression == Compression::None {
        let len = std::fs::metadata(path).map_err(super::io_error(path))?.len();
        let (lo, hi) = options.part.rows(len);
        let mut file = File::open(path).map_err(super::io_error(path))?;
        let start = if lo == 0 {
            0
        } else {
            // Resynchronise: the next line start at or after `lo`.
            file.seek(SeekFrom::Start(lo - 1)).map_err(super::io_error(path))?;
            let mut reader = BufReader::with_capacity(READ_BUFFER, file.try_clone().map_err(super::io_error(path))?);
            let mut skipped = 0u64;
            loop {
                let buf = reader.fill_buf().map_err(super::io_error(path))?;
                if buf.is_empty() {
                    break;
                }
                if let Some(i) = buf.iter().position(|&b| b == b'\n') {
                    skipped += i as u64 + 1;
                    break;
                }
                let n = buf.len();
                skipped += n as u64;
                reader.consume(n);
            }
            lo - 1 + skipped
        };
        file.seek(SeekFrom::Start(start)).map_err(super::io_error(path))?;
        let reader = Box::new(BufReader::with_capacity(READ_BUFFER, file));
        (Lines::new(reader, None, start), hi, 0, u64::MAX, start)
    } else {
        let mut counter = open_stream(path, compression)?;
        let mut n = 0u64;
        while counter.next(u64::MAX).map_err(|f| jsonl_error(path, f.line, f.reason))? {
            n += 1;
        }
        let (lo, hi) = options.part.rows(n);
        let last = options.part.index + 1 == options.part.count;
        (open_stream(path, compression)?, u64::MAX, lo, if last { u64::MAX } else { hi - lo }, 0)
    };
    Ok(Box::new(JsonlSource {
        path: path.to_path_buf(),
        lines: Some(lines),
        columns,
        keys: wanted,
        first_line,
        end,
        skip,
        rows,
        lines_before: (part_start == 0).then_some(0),
        part_start,
    }))
}

/// One JSON Lines file's asked-for keys, read a batch of lines at a time.
struct JsonlSource {
    path: PathBuf,
    lines: Option<Lines>,
    columns: Vec<ColumnInfo>,
    keys: Vec<Key>,
    first_line: u64,
    /// Lines that start at or past this byte offset are another part's.
    end: u64,
    /// Non-blank lines still to be skipped before this part's (gzip).
    skip: u64,
    /// Non-blank lines still to be read in this part.
    rows: u64,
    /// Lines before where reading began, when known (else counted on an error).
    lines_before: Option<u64>,
    /// The byte offset where reading began (a part of a plain file; else 0).
    part_start: u64,
}

impl JsonlSource {
    fn empty(path: &Path) -> JsonlSource {
        JsonlSource {
            path: path.to_path_buf(),
            lines: None,
            columns: Vec::new(),
            keys: Vec::new(),
            first_line: 0,
            end: 0,
            skip: 0,
            rows: 0,
            lines_before: Some(0),
            part_start: 0,
        }
    }

    /// The 1-based line number in the file of `line`, counted from where
    /// reading began: counts the lines before a part's start when needed.
    fn file_line(&mut self, line: u64) -> u64 {
        if self.lines_before.is_none() {
            self.lines_before = Some(count_newlines(&self.path, self.part_start).unwrap_or(0));
        }
        self.lines_before.unwrap_or(0) + line
    }

    fn error(&mut self, line: u64, reason: String) -> DataError {
        let line = self.file_line(line);
        jsonl_error(&self.path, line, reason)
    }
}

/// Newlines in the first `len` bytes of a file.
fn count_newlines(path: &Path, len: u64) -> std::io::Result<u64> {
    let mut reader = BufReader::with_capacity(READ_BUFFER, File::open(path)?).take(len);
    let mut count = 0u64;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(count);
        }
        count += buf.iter().filter(|&&b| b == b'\n').count() as u64;
        let n = buf.len();
        reader.consume(n);
    }
}

impl Source for JsonlSource {
    fn columns(&self) -> &[ColumnInfo] {
        &self.columns
    }

    fn next_piece(&mut self, max_rows: usize) -> Result<Option<Piece<'_>>, DataError> {
        let Some(mut lines) = self.lines.take() else { return Ok(None) };
        let result = self.read_piece(&mut lines, max_rows);
        if matches!(result, Ok(Some(_))) {
            self.lines = Some(lines);
        }
        result.map(|piece| piece.map(|(rows, columns)| Piece::Columns { rows, columns }))
    }
}

impl JsonlSource {
    /// Appends one line's values of the keys read to their builders: the
    /// line is walked, never built, so it costs about its bytes (a
    /// `serde_json::Value` per element would cost ~70 bytes a number).
    fn push_line(&mut self, text: &[u8], builders: &mut [Builder]) -> Result<(), String> {
        let mut values: Vec<Option<&RawValue>> = vec![None; self.keys.len()];
        entries(text, |name, raw| {
            // A key may be asked for twice (an input that is also the label).
            for (key, value) in self.keys.iter().zip(values.iter_mut()) {
                if key.name == name {
                    *value = Some(raw);
                }
            }
            Ok(())
        })?;
        // Checked as UTF-8 by `entries`.
        let line = std::str::from_utf8(text).unwrap_or_default();
        for ((key, builder), value) in self.keys.iter_mut().zip(builders.iter_mut()).zip(values) {
            let Some(raw) = value else {
                return Err(format!(
                    "key '{}' is missing; expected {} (as on line {})",
                    key.name,
                    key.describe(),
                    self.first_line
                ));
            };
            match push_value(key, line, raw, self.first_line, builder) {
                Ok(()) => {}
                Err(WalkError::Line(reason)) => return Err(reason),
                Err(WalkError::Value(reason)) => return Err(format!("key '{}' {reason}", key.name)),
            }
        }
        Ok(())
    }

    fn read_piece(
        &mut self,
        lines: &mut Lines,
        max_rows: usize,
    ) -> Result<Option<(usize, Vec<ColumnChunk>)>, DataError> {
        if self.rows == 0 {
            return Ok(None);
        }
        while self.skip > 0 {
            match lines.next(u64::MAX) {
                Ok(true) => self.skip -= 1,
                Ok(false) => return Ok(None),
                Err(f) => return Err(self.error(f.line, f.reason)),
            }
        }
        let mut builders: Vec<Builder> = self
            .keys
            .iter()
            .map(|k| match k.kind {
                Ok(Kind::String) => Builder::Strings(Vec::new()),
                _ => Builder::Elements(Vec::new()),
            })
            .collect();
        let (mut rows, mut bytes) = (0usize, 0usize);
        let (mut first, mut last) = (0u64, 0u64);
        while rows < max_rows && (rows as u64) < self.rows && (rows == 0 || bytes < PIECE_BYTES) {
            match lines.next(self.end) {
                Ok(true) => {}
                Ok(false) => break,
                Err(f) => return Err(self.error(f.line, f.reason)),
            }
            bytes += lines.text().len();
            let line = lines.line;
            if let Err(reason) = self.push_line(lines.text(), &mut builders) {
                return Err(self.error(line, reason));
            }
            if rows == 0 {
                first = line;
            }
            last = line;
            rows += 1;
        }
        if rows == 0 {
            return Ok(None);
        }
        self.rows -= rows as u64;
        // Only an error counts the lines before a part (see `file_line`).
        let span = match self.lines_before {
            Some(before) if first == last => format!("line {}", before + first),
            Some(before) => format!("lines {}-{}", before + first, before + last),
            None => format!("lines {first}-{last} of the part from byte offset {}", self.part_start),
        };
        let chunks = self
            .keys
            .iter()
            .zip(builders)
            .map(|(key, builder)| ColumnChunk {
                path: key_path(&self.path, &span, &key.name),
                dims: key.dims.clone(),
                values: match builder {
                    Builder::Elements(bytes) => {
                        Values::Elements { element: key.kind().map_or(Element::Bytes(0), Kind::element), bytes }
                    }
                    Builder::Strings(strings) => Values::Strings(strings),
                },
            })
            .collect();
        Ok(Some((rows, chunks)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DataSpec, Dataset, Labels};
    use isorun_protocol::{SignatureInfo, Tensor, TensorData, TensorSpec};
    use std::io::Write;

    fn spec(path: &Path) -> DataSpec {
        DataSpec {
            paths: vec![path.to_path_buf()],
            label: "y".into(),
            weight: None,
            slices: vec![],
            renames: vec![],
            limit: None,
            batch_size: 2,
            skip_corrupt: false,
            shard: None,
            format: None,
            example_key: None,
        }
    }

    fn signature(inputs: &[(&str, DType, Vec<Option<u64>>)]) -> SignatureInfo {
        SignatureInfo {
            key: "serving_default".into(),
            inputs: inputs
                .iter()
                .map(|(name, dtype, shape)| TensorSpec {
                    name: name.to_string(),
                    dtype: *dtype,
                    shape: Some(shape.clone()),
                })
                .collect(),
            outputs: vec![],
        }
    }

    /// Every batch's inputs and labels, or the first error's message.
    fn read(
        path: &Path,
        inputs: &[(&str, DType, Vec<Option<u64>>)],
    ) -> Result<(Vec<Vec<Tensor>>, Vec<Labels>), String> {
        let dataset = Dataset::open(spec(path)).map_err(|e| e.to_string())?;
        let mut reader = dataset.reader(&signature(inputs)).map_err(|e| e.to_string())?;
        let (mut tensors, mut labels) = (Vec::new(), Vec::new());
        while let Some(batch) = reader.next_batch() {
            let batch = batch.map_err(|e| e.to_string())?;
            tensors.push(batch.inputs.into_iter().map(|(_, t)| t).collect());
            labels.push(batch.targets.labels);
        }
        Ok((tensors, labels))
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn floats(t: &Tensor) -> Vec<f32> {
        let TensorData::Dense(bytes) = &t.data else { panic!("dense") };
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn nested_lists_strings_and_numbers_become_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "d.jsonl",
            "\u{feff}{\"m\": [[1, 2], [3, 4]], \"s\": \"a\", \"y\": 1}\n\n{\"m\": [[5, 6.5], [7, 8]], \"s\": {\"base64\": \"//4=\"}, \"y\": 0}\r\n{\"m\": [[\"NaN\", 0], [0, 0]], \"s\": \"c\", \"y\": 1}",
        );
        // A key of integers meeting 6.5 becomes a key of numbers (a float
        // input takes both), which then takes "NaN" too.
        let m = [("m", DType::Float32, vec![None, Some(2), Some(2)])];
        let (tensors, _) = read(&path, &m).unwrap();
        assert_eq!(floats(&tensors[0][0]), [1.0, 2.0, 3.0, 4.0, 5.0, 6.5, 7.0, 8.0]);
        assert!(floats(&tensors[1][0])[0].is_nan());
        let path = write(
            dir.path(),
            "w.jsonl",
            "{\"m\": [[1, 2], [3, 4]], \"y\": 1}\n{\"m\": [[5, 6.5], [7, 8]], \"y\": 0}\n",
        );
        let (tensors, _) = read(&path, &m).unwrap();
        assert_eq!(floats(&tensors[0][0]), [1.0, 2.0, 3.0, 4.0, 5.0, 6.5, 7.0, 8.0]);
        // An integer input refuses the widened key, naming it.
        let error = read(&path, &[("m", DType::Int64, vec![None, Some(2), Some(2)])]).unwrap_err();
        assert!(error.contains("w.jsonl: lines 1-2: key 'm': cannot feed input 'm' (int64)"), "{error}");
        let path = write(
            dir.path(),
            "e.jsonl",
            "{\"m\": [[1.0, 2], [3, 4]], \"s\": \"a\", \"y\": 1}\n\n{\"m\": [[5, 6.5], [7, 8]], \"s\": {\"base64\": \"//4=\"}, \"y\": 0}\n{\"m\": [[\"NaN\", 0], [0, 0]], \"s\": \"c\", \"y\": 1}\n",
        );
        let inputs = [("m", DType::Float32, vec![None, Some(2), Some(2)]), ("s", DType::String, vec![None])];
        let (tensors, labels) = read(&path, &inputs).unwrap();
        assert_eq!(tensors[0][0].shape, vec![2, 2, 2]);
        assert_eq!(floats(&tensors[0][0]), [1.0, 2.0, 3.0, 4.0, 5.0, 6.5, 7.0, 8.0]);
        assert!(floats(&tensors[1][0])[0].is_nan());
        let TensorData::Strings(strings) = &tensors[0][1].data else { panic!("strings") };
        assert_eq!(strings.iter().map(|s| s.to_vec()).collect::<Vec<_>>(), [b"a".to_vec(), vec![0xff, 0xfe]]);
        assert_eq!(labels, [Labels::Int(vec![1, 0]), Labels::Int(vec![1])]);
    }

    #[test]
    fn a_value_that_does_not_fit_names_the_file_line_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let x = [("x", DType::Float32, vec![None, Some(2)])];
        let cases = [
            (
                "{\"x\": [1.5, 2], \"y\": 1}\n{\"x\": [1, 2, 3], \"y\": 0}\n",
                "line 2: key 'x' is a list of shape [3] but a list of shape [2] on line 1",
            ),
            ("{\"x\": [1.5, 2], \"y\": 1}\n{\"y\": 0}\n", "line 2: key 'x' is missing; expected float64 [2]"),
            (
                "{\"x\": [1.5, 2], \"y\": 1}\n\n{\"x\": null, \"y\": 0}\n",
                "line 3: key 'x' is null; expected float64 [2]",
            ),
            (
                "{\"x\": [1.5, 2], \"y\": 1}\n{\"x\": [1, \"a\"], \"y\": 0}\n",
                "line 2: key 'x' holds \"a\"; expected numbers",
            ),
            ("{\"x\": [1.5, 2], \"y\": 1}\n{\"x\": [[1], 2], \"y\": 0}\n", "line 2: key 'x' is a ragged nested list"),
            (
                "{\"x\": [1.5, 2], \"y\": 1}\n{\"x\": [1, 2], \"y\": 0.5}\n",
                "lines 1-2: key 'y': label 0.5 is not an integer",
            ),
            (
                "{\"x\": [1.5, 2], \"y\": 1}\n{\"x\": [1, 2], \"y\": 0,}\n",
                "line 2: column 22: not valid JSON: trailing comma",
            ),
            ("{\"x\": [1.5, 2], \"y\": 1}\n[1, 2]\n", "line 2: is [1,2], not a JSON object"),
        ];
        for (i, (text, want)) in cases.iter().enumerate() {
            let path = write(dir.path(), &format!("case{i}.jsonl"), text);
            let error = read(&path, &x).unwrap_err();
            assert!(error.contains(&format!("case{i}.jsonl: {want}")), "case {i}: {error}");
        }
        // Checked before any batch: the first line's keys and values (two
        // keys could feed x: neither is chosen for it, see Dataset::auto_feature).
        let path = write(dir.path(), "first.jsonl", "{\"z\": [1, 2], \"w\": [3, 4], \"y\": 1}\n");
        let error = Dataset::open(spec(&path)).unwrap().reader(&signature(&x)).unwrap_err().to_string();
        assert!(error.contains("first.jsonl") && error.contains("'x'") && error.contains("z (int64 [2])"), "{error}");
        let path = write(dir.path(), "label.jsonl", "{\"x\": [1, 2], \"y\": \"cat\"}\n");
        let error = Dataset::open(spec(&path)).unwrap_err().to_string();
        assert!(error.contains("label.jsonl: line 1: key 'y': labels are numbers, not string"), "{error}");
        let path = write(dir.path(), "object.jsonl", "{\"x\": {\"a\": 1}, \"y\": 1}\n");
        let error = read(&path, &x).unwrap_err();
        assert!(error.contains("object.jsonl: line 1: key 'x': an object or value isorun does not read ({\"a\":1}) cannot feed input x"), "{error}");
        // The signature's dtype: checked by the shared conversions, naming the key and lines.
        let path = write(dir.path(), "dtype.jsonl", "{\"x\": [1.5, 2], \"y\": 1}\n{\"x\": [1.5, 2], \"y\": 1}\n");
        let error = read(&path, &[("x", DType::Int32, vec![None, Some(2)])]).unwrap_err();
        assert!(error.contains("dtype.jsonl: lines 1-2: key 'x': cannot feed input 'x' (int32)"), "{error}");
    }

    #[test]
    fn a_line_longer_than_the_cap_is_an_error_without_holding_it() {
        // An endless line: found after MAX_LINE_BYTES (+2) bytes, never more held.
        let endless = std::io::repeat(b' ').take(u64::MAX);
        let mut lines = Lines::new(Box::new(BufReader::new(endless)), None, 0);
        let Err(fault) = lines.next(u64::MAX) else { panic!("a line past the cap") };
        assert_eq!(fault.line, 1);
        assert!(fault.reason.contains(&format!("longer than {MAX_LINE_BYTES} bytes")), "{}", fault.reason);
        assert!(lines.buf.len() <= MAX_LINE_BYTES + 2);
        // Through a file, with a small cap: the line is named.
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "long.jsonl", &format!("{{\"y\": 1}}\n{{\"y\": \"{}\"}}\n", "a".repeat(100)));
        let mut lines = open_stream(&path, Compression::None).unwrap();
        lines.max_line = 50;
        assert!(lines.next(u64::MAX).is_ok());
        let Err(fault) = lines.next(u64::MAX) else { panic!("too long") };
        assert_eq!(fault.line, 2);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let dir = tempfile::tempdir().unwrap();
        let deep = format!("{{\"y\": 1, \"x\": {}1{}}}\n", "[".repeat(100_000), "]".repeat(100_000));
        let path = write(dir.path(), "deep.jsonl", &deep);
        let error = Dataset::open(spec(&path)).unwrap_err().to_string();
        assert!(error.contains("deep.jsonl: line 1: column") && error.contains("recursion limit"), "{error}");
    }

    #[test]
    fn gzip_is_streamed_and_a_truncated_stream_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let text: String = (0..2000).map(|i| format!("{{\"x\": [{i}, 1], \"y\": {}}}\n", i % 2)).collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(text.as_bytes()).unwrap();
        let bytes = gz.finish().unwrap();
        let path = dir.path().join("d.jsonl.gz");
        std::fs::write(&path, &bytes).unwrap();
        let x = [("x", DType::Float32, vec![None, Some(2)])];
        let (tensors, _) = read(&path, &x).unwrap();
        assert_eq!(tensors.len(), 1000);
        let cut = dir.path().join("cut.jsonl.gz");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let error = read(&cut, &x).unwrap_err();
        assert!(
            error.contains("cut.jsonl.gz: line") && error.contains("gzip stream is corrupt or truncated"),
            "{error}"
        );
    }

    #[test]
    fn an_error_in_a_part_names_the_file_s_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut text: String = (0..50).map(|i| format!("{{\"x\": [{i}, 1], \"y\": 1}}\n")).collect();
        text.push_str("{\"x\": [1], \"y\": 1}\n");
        let path = write(dir.path(), "p.jsonl", &text);
        let mut spec = spec(&path);
        spec.shard = Some(crate::DataShard { index: 1, count: 2 });
        let dataset = Dataset::open(spec).unwrap();
        let mut reader = dataset.reader(&signature(&[("x", DType::Float32, vec![None, Some(2)])])).unwrap();
        let error = std::iter::from_fn(|| reader.next_batch()).find_map(Result::err).unwrap().to_string();
        assert!(error.contains("p.jsonl: line 51: key 'x' is a list of shape [1]"), "{error}");
    }
}
