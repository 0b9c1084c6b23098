//! The grammar of a JSON value that becomes a tensor, shared by `run`'s
//! JSON inputs (`json_input`) and `eval`'s JSON Lines (`isorun_eval`'s
//! `source::jsonl`), so that both read the same values the same way:
//! numbers, bools, strings (UTF-8 text, or `{"base64": "..."}` for bytes),
//! `"NaN"`, `"Infinity"` and `"-Infinity"` for floats, and nested lists
//! whose nesting is their shape.
//!
//! Why here: `isorun-eval` depends on this crate (for `.npy` and the
//! element types), never the other way, so the grammar lives in the lower
//! crate and both readers reach it without a circle.
//!
//! Hardened for untrusted text: a value is walked from its text
//! ([`serde_json::value::RawValue`]), never built into a
//! `serde_json::Value` (one costs ~70 bytes a number); lists nested deeper
//! than [`MAX_DEPTH`] are an error naming the column, not a stack
//! overflow; raggedness is found as soon as it shows.

use base64::Engine;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

/// How deep values may nest (serde_json's own limit when it builds values).
pub const MAX_DEPTH: usize = 128;

/// One leaf of a value, as parsed from its text (never a whole value: a
/// value is walked, not built, so that it costs about its own bytes).
#[derive(Debug, Clone, PartialEq)]
pub enum Leaf {
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
    pub fn parse(raw: &RawValue) -> Leaf {
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

    /// The leaf a parsed value is, by the same rules as [`Leaf::parse`].
    pub fn of_value(value: &Value) -> Leaf {
        match value {
            Value::Null => Leaf::Null,
            Value::Bool(b) => Leaf::Bool(*b),
            Value::Number(n) => Leaf::Number(n.clone()),
            Value::String(s) => Leaf::String(s.clone()),
            Value::Object(map) if map.len() == 1 => match map.get("base64") {
                Some(Value::String(text)) => {
                    base64::engine::general_purpose::STANDARD.decode(text).map_or(Leaf::Object, Leaf::Bytes)
                }
                _ => Leaf::Object,
            },
            Value::Object(_) | Value::Array(_) => Leaf::Object,
        }
    }

    pub fn is_i64(&self) -> bool {
        matches!(self, Leaf::Number(n) if n.is_i64())
    }

    pub fn is_special_float(&self) -> bool {
        matches!(self, Leaf::String(s) if matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity"))
    }

    pub fn as_f64(&self) -> Option<f64> {
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
/// recursion limit) and dropped as it goes: a text's syntax checked without
/// building it (`serde_json::from_slice::<Checked>`).
pub struct Checked;

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

/// Hands each element of a list, as its text, to a function; an error the
/// function gives stops the walk (kept in `stop`).
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalkError {
    /// The text is not read (nested too deep, or not JSON): the message,
    /// as serde_json words bad JSON (`column 7: not valid JSON: ...`).
    Syntax(String),
    /// The nested lists are not a rectangle: what is where, as `a list of
    /// 3 where 2 were expected`.
    Ragged(String),
}

/// A compact description of a value's text, for messages: its first 60
/// characters without the whitespace between tokens.
pub fn describe_raw(text: &str) -> String {
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

/// A JSON value the [`Walker`] reads: its text (`&RawValue`, walked
/// without being built: untrusted lines) or a value already parsed (`&Value`:
/// `run`'s inputs), so that both follow one grammar.
pub trait Node<'a>: Copy + 'a {
    /// Whether it is a list.
    fn is_list(self) -> bool;
    /// Hands each item of a list to `each`, stopping at its first error;
    /// the count.
    fn items(self, each: &mut dyn FnMut(Self) -> Result<(), WalkError>) -> Result<u64, WalkError>;
    /// The leaf it is (when not a list).
    fn leaf(self) -> Leaf;
    /// A compact description, for messages ([`describe_raw`]).
    fn describe(self) -> String;
    /// Its byte offset within `text`, when it is a part of it.
    fn offset_in(self, text: &str) -> Option<usize>;
}

impl<'a> Node<'a> for &'a RawValue {
    fn is_list(self) -> bool {
        self.get().starts_with('[')
    }

    fn items(self, each: &mut dyn FnMut(Self) -> Result<(), WalkError>) -> Result<u64, WalkError> {
        let mut stop = None;
        let counted =
            serde_json::Deserializer::from_str(self.get()).deserialize_seq(Elements { take: each, stop: &mut stop });
        match (stop, counted) {
            (Some(e), _) => Err(e),
            (None, Ok(count)) => Ok(count),
            // Checked as JSON before any walk (else serde_json's message).
            (None, Err(e)) => Err(WalkError::Syntax(format!("not valid JSON: {e}"))),
        }
    }

    fn leaf(self) -> Leaf {
        Leaf::parse(self)
    }

    fn describe(self) -> String {
        describe_raw(self.get())
    }

    fn offset_in(self, text: &str) -> Option<usize> {
        let offset = (self.get().as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
        (offset < text.len()).then_some(offset)
    }
}

impl<'a> Node<'a> for &'a Value {
    fn is_list(self) -> bool {
        self.is_array()
    }

    fn items(self, each: &mut dyn FnMut(Self) -> Result<(), WalkError>) -> Result<u64, WalkError> {
        let items = self.as_array().map_or(&[][..], Vec::as_slice);
        items.iter().try_for_each(each)?;
        Ok(items.len() as u64)
    }

    fn leaf(self) -> Leaf {
        Leaf::of_value(self)
    }

    fn describe(self) -> String {
        describe_raw(&self.to_string())
    }

    fn offset_in(self, _text: &str) -> Option<usize> {
        None
    }
}

/// The walk of one value: its shape found along the way (the lengths of
/// the first list at each depth, as they end), raggedness found as soon as
/// it shows, and each leaf handed to `leaf` (with its node) in row-major
/// order. Lists deeper than [`MAX_DEPTH`] are an error, not a stack
/// overflow; nothing is built but the leaves.
pub struct Walker<'a, F> {
    /// The whole text walked (a line, an input; empty for a parsed value),
    /// to say where a value is.
    line: &'a str,
    /// The length of the lists at each depth, once one has ended.
    shape: Vec<Option<u64>>,
    /// The depth of the leaves, once one is met.
    rank: Option<usize>,
    leaf: F,
}

impl<'a, F> Walker<'a, F> {
    /// A walk of values within `line` (each value walked is a part of it;
    /// `""` for parsed values).
    pub fn new(line: &'a str, leaf: F) -> Self {
        Walker { line, shape: Vec::new(), rank: None, leaf }
    }

    /// Walks `node` (within the walker's text), met at nesting `depth` (0
    /// for a whole value).
    pub fn walk<N: Node<'a>>(&mut self, node: N, depth: usize) -> Result<(), WalkError>
    where
        F: FnMut(N, Leaf),
    {
        if !node.is_list() {
            let listed = self.shape.get(depth).is_some_and(Option::is_some);
            if listed || self.rank.is_some_and(|r| r != depth) {
                return Err(WalkError::Ragged(format!("{} where a list was expected", node.describe())));
            }
            self.rank = Some(depth);
            (self.leaf)(node, node.leaf());
            return Ok(());
        }
        if self.rank.is_some_and(|r| depth >= r) {
            return Err(WalkError::Ragged("a list where a value was expected".into()));
        }
        if depth >= MAX_DEPTH {
            let at = node.offset_in(self.line).map_or(String::new(), |offset| format!("column {}: ", offset + 1));
            return Err(WalkError::Syntax(format!("{at}not valid JSON: recursion limit exceeded")));
        }
        let count = node.items(&mut |item| self.walk(item, depth + 1))?;
        if self.shape.len() <= depth {
            self.shape.resize(depth + 1, None);
        }
        match self.shape[depth] {
            None => self.shape[depth] = Some(count),
            Some(n) if n != count => {
                return Err(WalkError::Ragged(format!("a list of {count} where {n} were expected")))
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The shape walked: the lengths of the first lists, as deep as they go.
    pub fn dims(&self) -> Vec<u64> {
        self.shape.iter().map_while(|d| *d).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dims and leaves of a value's text, or why not.
    fn walk(text: &str) -> Result<(Vec<u64>, Vec<Leaf>), WalkError> {
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        let mut leaves = Vec::new();
        let mut walker = Walker::new(text, |_: &RawValue, leaf| leaves.push(leaf));
        walker.walk(raw, 0)?;
        let dims = walker.dims();
        Ok((dims, leaves))
    }

    #[test]
    fn nesting_is_the_shape_and_leaves_come_in_row_major_order() {
        let (dims, leaves) = walk(r#"[[1, "NaN"], [true, {"base64": "//4="}]]"#).unwrap();
        assert_eq!(dims, [2, 2]);
        assert_eq!(leaves[0], Leaf::Number(1.into()));
        assert!(leaves[1].as_f64().unwrap().is_nan() && leaves[1].is_special_float());
        assert_eq!(leaves[2..], [Leaf::Bool(true), Leaf::Bytes(vec![0xff, 0xfe])]);
        assert_eq!(walk("[[], []]").unwrap().0, [2, 0]);
        assert_eq!(walk("7").unwrap().0, Vec::<u64>::new());
        assert_eq!(walk(r#"{"a": 1}"#).unwrap().1, [Leaf::Object]);
    }

    #[test]
    fn a_parsed_value_walks_as_its_text_does() {
        for text in [r#"[[1, "NaN"], [true, {"base64": "//4="}]]"#, "[[], []]", "7", r#"{"a": 1}"#, "[[1, 2], [3]]"] {
            let value: Value = serde_json::from_str(text).unwrap();
            let mut leaves = Vec::new();
            let mut walker = Walker::new("", |_: &Value, leaf| leaves.push(leaf));
            let walked = walker.walk(&value, 0).map(|()| walker.dims());
            assert_eq!(walked.map(|dims| (dims, leaves)), walk(text), "{text}");
        }
    }

    #[test]
    fn ragged_and_deep_values_are_errors() {
        let ragged = |detail: &str| Err(WalkError::Ragged(detail.into()));
        assert_eq!(walk("[[1, 2], [3]]"), ragged("a list of 1 where 2 were expected"));
        assert_eq!(walk("[1, [2]]"), ragged("a list where a value was expected"));
        assert_eq!(walk("[[1], 2]"), ragged("2 where a list was expected"));
        let deep = format!("{}1{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let raw: &RawValue = serde_json::from_str(&deep).unwrap();
        let mut walker = Walker::new(&deep, |_: &RawValue, _| {});
        let error = walker.walk(raw, 0).unwrap_err();
        assert_eq!(
            error,
            WalkError::Syntax(format!("column {}: not valid JSON: recursion limit exceeded", MAX_DEPTH + 1))
        );
    }
}
