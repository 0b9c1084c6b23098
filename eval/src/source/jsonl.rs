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
//! - Values are as in JSON inputs, read by the same grammar
//!   (`isorun_tensors::json_value`, shared with `run`): numbers,
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
//!
//! This file is the `Source` (opening, parts, pieces); a line's parsing is
//! `jsonl/record.rs`, the capped stream of lines `jsonl/stream.rs`.
//!
//! [`MAX_LINE_CELLS`]: super::lines::MAX_LINE_CELLS

mod record;
mod stream;

/// The capped line reader, shared with rescore's JSON Lines predictions
/// (`crate::predictions::read`): one line cap for every JSON Lines reader.
pub(crate) use super::lines::{read_line, without_line_end, LineError};
use super::{ColumnChunk, ColumnInfo, Compression, Look, Options, Piece, Source, Values};
use crate::error::DataError;
use isorun_tensors::npy::Element;
use record::{entries, key_path, keys_of, push_value, Builder, Fault, Key, Kind};
use serde_json::value::RawValue;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use stream::{open_stream, Lines, READ_BUFFER};

/// The longest line read (without its line end): the cap `source::lines`
/// holds every text format to.
pub use super::lines::MAX_LINE_BYTES;

/// The most line bytes one piece holds (it holds at least one line).
pub const PIECE_BYTES: usize = 64 << 20;

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

/// The first line's keys, as columns.
pub(crate) fn peek(path: &Path, compression: Compression, _options: &Options) -> Result<Option<Look>, DataError> {
    let mut lines = open_stream(path, compression)?;
    Ok(first_object(path, &mut lines)?
        .map(|(keys, line)| Look::Columns(keys.iter().map(|k| k.info(path, line)).collect())))
}

pub(crate) fn open(path: &Path, compression: Compression, options: &Options) -> Result<Box<dyn Source>, DataError> {
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
    } else if !compression.is_compressed() {
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
                Err(Fault::Line(reason)) => return Err(reason),
                Err(Fault::Value(reason)) => return Err(format!("key '{}' {reason}", key.name)),
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
    use isorun_protocol::{DType, SignatureInfo, Tensor, TensorData, TensorSpec};
    use std::io::Write;

    fn spec(path: &Path) -> DataSpec {
        DataSpec::new(vec![path.to_path_buf()], "y", 2)
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
