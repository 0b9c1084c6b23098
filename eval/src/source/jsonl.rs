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
//!   found without holding more than that much of it; nesting deeper than
//!   serde_json's recursion limit (128) is an error, not a stack overflow;
//!   gzip is decompressed as a stream, and a truncated or corrupt stream is
//!   an error naming the file. A piece holds at most [`PIECE_BYTES`] of
//!   lines (and at least one line).
//! - Parts: of a plain file, part `K` of `N` is the lines that *start* in
//!   the bytes `[K*len/N, (K+1)*len/N)` (a part entered midway skips to the
//!   next line start: a line belongs to the part where it starts); of a
//!   gzip file, which cannot be entered midway, the lines `[K*n/N,
//!   (K+1)*n/N)` of its `n` (blank lines not counted), counted by a first
//!   pass. A part of a plain file counts the lines before it only when an
//!   error needs the line's number.

use super::{ColumnChunk, ColumnInfo, Look, Options, Piece, Source, Values};
use crate::error::DataError;
use base64::Engine;
use isorun_protocol::DType;
use isorun_tensors::npy::Element;
use serde_json::Value;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The longest line read (without its line end).
pub const MAX_LINE_BYTES: usize = 64 << 20;

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

fn describe_value(value: &Value) -> String {
    let text = value.to_string();
    if text.len() > 60 {
        let cut = (0..=60).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        format!("{}...", &text[..cut])
    } else {
        text
    }
}

/// The shape of a nested list: the lengths along its first elements.
fn shape_of(value: &Value) -> Vec<u64> {
    let mut shape = Vec::new();
    let mut probe = value;
    while let Value::Array(items) = probe {
        shape.push(items.len() as u64);
        match items.first() {
            Some(first) => probe = first,
            None => break,
        }
    }
    shape
}

/// The leaves in row-major order; an error when the nesting is ragged.
fn leaves<'a>(value: &'a Value, shape: &[u64], out: &mut Vec<&'a Value>) -> Result<(), String> {
    match (value, shape.split_first()) {
        (Value::Array(items), Some((&n, rest))) => {
            if items.len() as u64 != n {
                return Err(format!("is a ragged nested list (a list of {} where {n} were expected)", items.len()));
            }
            items.iter().try_for_each(|item| leaves(item, rest, out))
        }
        (Value::Array(_), None) => Err("is a ragged nested list (a list where a value was expected)".into()),
        (leaf, Some(_)) => Err(format!("is a ragged nested list ({} where a list was expected)", describe_value(leaf))),
        (leaf, None) => {
            out.push(leaf);
            Ok(())
        }
    }
}

fn is_special_float(value: &Value) -> bool {
    matches!(value.as_str(), Some("NaN" | "Infinity" | "-Infinity"))
}

fn base64_bytes(value: &Value) -> Option<Vec<u8>> {
    let Value::Object(map) = value else { return None };
    if map.len() != 1 {
        return None;
    }
    base64::engine::general_purpose::STANDARD.decode(map.get("base64")?.as_str()?).ok()
}

/// The kind of a first line's leaves.
fn kind_of(leaves: &[&Value]) -> Result<Kind, String> {
    let all = |f: fn(&Value) -> bool| leaves.iter().all(|v| f(v));
    if leaves.is_empty() {
        return Ok(Kind::Float);
    }
    if all(|v| v.is_i64()) {
        Ok(Kind::Int)
    } else if all(|v| v.is_number() || is_special_float(v)) {
        Ok(Kind::Float)
    } else if all(Value::is_boolean) {
        Ok(Kind::Bool)
    } else if all(|v| v.is_string() || base64_bytes(v).is_some()) {
        Ok(Kind::String)
    } else if let Some(null) = leaves.iter().find(|v| v.is_null()) {
        Err(format!("{} (null is no value)", describe_value(null)))
    } else if leaves.len() == 1 {
        Err(format!("an object or value isorun does not read ({})", describe_value(leaves[0])))
    } else {
        Err("a list mixing numbers, bools, strings or objects".into())
    }
}

/// Builds the first line's keys.
fn keys_of(object: &serde_json::Map<String, Value>) -> Vec<Key> {
    object
        .iter()
        .map(|(name, value)| {
            let dims = shape_of(value);
            let mut out = Vec::new();
            let kind = leaves(value, &dims, &mut out).map_err(|e| format!("a value that {e}")).and_then(|()| {
                if value.is_null() {
                    Err("null".to_string())
                } else {
                    kind_of(&out)
                }
            });
            Key { name: name.clone(), kind, dims }
        })
        .collect()
}

/// The values of one key for the lines of a piece being read.
enum Builder {
    Elements(Vec<u8>),
    Strings(Vec<Vec<u8>>),
}

/// Appends one line's value of `key`; the reason it does not fit, if not.
/// A key of integers that meets a number with a fraction becomes a key of
/// numbers from there on (the values already read are converted): JSON
/// writers differ on whether `0.0` is written `0`.
fn push_value(key: &mut Key, value: &Value, first_line: u64, out: &mut Builder) -> Result<(), String> {
    if value.is_null() {
        return Err(format!("is null; expected {} (as on line {first_line})", key.describe()));
    }
    let dims = shape_of(value);
    let mut found = Vec::new();
    leaves(value, &dims, &mut found)?;
    if dims != key.dims {
        let shape = |d: &[u64]| if d.is_empty() { "one value".to_string() } else { format!("a list of shape {d:?}") };
        return Err(format!(
            "is {} but {} on line {first_line}; expected {}, given {}",
            shape(&dims),
            shape(&key.dims),
            key.describe(),
            describe_value(value)
        ));
    }
    let wrong = |leaf: &Value, key: &Key| {
        let kind = key.kind().map_or("values", Kind::name);
        format!("holds {}; expected {kind} (as on line {first_line}: {})", describe_value(leaf), key.describe())
    };
    for leaf in found {
        let kind = key.kind().expect("checked when opened");
        match (kind, &mut *out) {
            (Kind::Int, Builder::Elements(bytes)) => {
                let int = leaf.as_i64().or_else(|| {
                    let f = leaf.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)?;
                    Some(f as i64)
                });
                match (int, leaf.as_f64()) {
                    (Some(i), _) => bytes.extend_from_slice(&i.to_le_bytes()),
                    (None, Some(f)) => {
                        let ints = std::mem::take(bytes);
                        bytes.extend(
                            ints.chunks_exact(8).flat_map(|c| {
                                (i64::from_le_bytes(c.try_into().expect("8 bytes")) as f64).to_le_bytes()
                            }),
                        );
                        bytes.extend_from_slice(&f.to_le_bytes());
                        key.kind = Ok(Kind::Float);
                    }
                    (None, None) => return Err(wrong(leaf, key)),
                }
            }
            (Kind::Float, Builder::Elements(bytes)) => {
                let f = match leaf {
                    Value::Number(n) => n.as_f64(),
                    Value::String(s) => match s.as_str() {
                        "NaN" => Some(f64::NAN),
                        "Infinity" => Some(f64::INFINITY),
                        "-Infinity" => Some(f64::NEG_INFINITY),
                        _ => None,
                    },
                    _ => None,
                };
                bytes.extend_from_slice(&f.ok_or_else(|| wrong(leaf, key))?.to_le_bytes());
            }
            (Kind::Bool, Builder::Elements(bytes)) => {
                bytes.push(u8::from(leaf.as_bool().ok_or_else(|| wrong(leaf, key))?))
            }
            (Kind::String, Builder::Strings(strings)) => match leaf {
                Value::String(s) => strings.push(s.as_bytes().to_vec()),
                other => strings.push(base64_bytes(other).ok_or_else(|| wrong(leaf, key))?),
            },
            _ => unreachable!("the builder is the kind's"),
        }
    }
    Ok(())
}

/// Lines of a stream, each at most [`MAX_LINE_BYTES`], blank ones skipped.
struct Lines {
    reader: Box<dyn BufRead + Send>,
    gzip: bool,
    /// Lines read (the last one's 1-based number, counted from where reading began).
    line: u64,
    /// The byte offset (in the file, or in the decompressed stream) of the next line.
    offset: u64,
    buf: Vec<u8>,
    /// The last line's text in `buf` (without its line end, or a byte order mark).
    text: std::ops::Range<usize>,
    max_line: usize,
}

/// Why a line could not be read: its number (counted as [`Lines::line`]) and why.
struct LineFault {
    line: u64,
    reason: String,
}

impl Lines {
    fn new(reader: Box<dyn BufRead + Send>, gzip: bool, offset: u64) -> Lines {
        Lines { reader, gzip, line: 0, offset, buf: Vec::new(), text: 0..0, max_line: MAX_LINE_BYTES }
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
            self.buf.clear();
            let cap = self.max_line as u64 + 2;
            let read = (&mut self.reader).take(cap).read_until(b'\n', &mut self.buf);
            let n = read.map_err(|e| LineFault {
                line: self.line + 1,
                reason: if self.gzip {
                    format!("cannot read: the gzip stream is corrupt or truncated ({e})")
                } else {
                    format!("cannot read: {e}")
                },
            })?;
            if n == 0 {
                return Ok(false);
            }
            self.line += 1;
            let start = self.offset;
            self.offset += n as u64;
            let mut text = 0..self.buf.len();
            if self.buf.ends_with(b"\n") {
                text.end -= 1;
                if self.buf[..text.end].ends_with(b"\r") {
                    text.end -= 1;
                }
            }
            if text.len() > self.max_line {
                return Err(LineFault {
                    line: self.line,
                    reason: format!(
                        "the line is longer than {} bytes, the most a line may hold (one JSON object per line)",
                        self.max_line
                    ),
                });
            }
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
        Compression::None => Lines::new(Box::new(BufReader::with_capacity(READ_BUFFER, file)), false, 0),
        Compression::Gzip => {
            let decoder = flate2::read::MultiGzDecoder::new(BufReader::with_capacity(READ_BUFFER, file));
            Lines::new(Box::new(BufReader::with_capacity(READ_BUFFER, decoder)), true, 0)
        }
    })
}

fn jsonl_error(path: &Path, line: u64, reason: String) -> DataError {
    DataError::Jsonl { path: path.to_path_buf(), line, reason }
}

/// Parses one line as a JSON object.
fn parse(text: &[u8]) -> Result<serde_json::Map<String, Value>, String> {
    match serde_json::from_slice::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!(
            "is {}, not a JSON object (one object per line, its keys the features)",
            describe_value(&other)
        )),
        Err(e) => {
            let message = e.to_string();
            let message = message.rsplit_once(" at line ").map_or(message.as_str(), |(m, _)| m).to_string();
            Err(format!("column {}: not valid JSON: {message}", e.column()))
        }
    }
}

/// The file's first object and its line; `None` for a file of blank lines.
fn first_object(path: &Path, lines: &mut Lines) -> Result<Option<(Vec<Key>, u64)>, DataError> {
    if !lines.next(u64::MAX).map_err(|f| jsonl_error(path, f.line, f.reason))? {
        return Ok(None);
    }
    let object = parse(lines.text()).map_err(|r| jsonl_error(path, lines.line, r))?;
    Ok(Some((keys_of(&object), lines.line)))
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
        (Lines::new(reader, false, start), hi, 0, u64::MAX, start)
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
            let object = match parse(lines.text()) {
                Ok(object) => object,
                Err(reason) => return Err(self.error(line, reason)),
            };
            for (key, builder) in self.keys.iter_mut().zip(builders.iter_mut()) {
                let pushed = match object.get(&key.name) {
                    None => Err(format!("is missing; expected {} (as on line {})", key.describe(), self.first_line)),
                    Some(value) => push_value(key, value, self.first_line, builder),
                };
                if let Err(reason) = pushed {
                    let name = key.name.clone();
                    return Err(self.error(line, format!("key '{name}' {reason}")));
                }
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
        // Checked before any batch: the first line's keys and values.
        let path = write(dir.path(), "first.jsonl", "{\"z\": [1, 2], \"y\": 1}\n");
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
        let mut lines = Lines::new(Box::new(BufReader::new(endless)), false, 0);
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
