//! CSV files as examples: a header row of feature names, then one example
//! per row, each cell a one-value feature, so that CSV rows go through the
//! same conversions as `tf.Example`s.
//!
//! Decisions: RFC 4180 quoting (`"a, b"`, `""` inside quotes, newlines
//! inside quotes), `\r\n` or `\n` line ends, a UTF-8 byte order mark
//! ignored. A column's kind is decided from the first
//! [`KIND_SAMPLE_ROWS`] rows of the file: `int64_list` when every non-empty
//! cell is an integer, `float_list` when every one is a number (`nan`,
//! `inf` included), `bytes_list` otherwise; a later cell that does not fit
//! is an error naming the row and column. An empty cell is a missing
//! feature. A row with another number of cells than the header is an error.
//! Untrusted input: lines are read through `source::lines`, capped at
//! [`MAX_LINE_BYTES`] (a row over several lines too) and
//! [`MAX_LINE_CELLS`] cells, so a file without a newline is an error, not
//! read whole.
//!
//! Parts: part `K` of `N` is the data rows `[K*n/N, (K+1)*n/N)` of the
//! file's `n`, counted by a first pass (the last part reads to the end, so
//! a row that stopped the count is still met).

use super::lines::{read_line, without_line_end, LineError, MAX_LINE_BYTES, MAX_LINE_CELLS};
use super::{Compression, Look, Options, Piece, Source};
use crate::error::DataError;
use crate::example::{Example, Feature, Features};
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

/// Rows read to decide each column's kind.
pub const KIND_SAMPLE_ROWS: usize = 1000;

/// The kind of one column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ColumnKind {
    Int,
    Float,
    Bytes,
}

/// Why a CSV file could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvFault {
    /// 1-based line where the row starts.
    pub line: u64,
    pub reason: String,
}

/// Reads the rows of one CSV file as examples.
pub struct CsvReader {
    inner: BufReader<File>,
    header: Vec<String>,
    kinds: Vec<ColumnKind>,
    line: u64,
    buf: Vec<u8>,
    fields: Vec<Vec<u8>>,
}

fn io_fault(line: u64, e: std::io::Error) -> CsvFault {
    CsvFault { line, reason: format!("cannot read: {e}") }
}

/// Reads one row's fields into `fields`; false at the end of the file. A
/// line longer than [`MAX_LINE_BYTES`], a row (its lines together) longer
/// than that, or a row of more than [`MAX_LINE_CELLS`] cells is an error
/// naming its line and the cap, found without holding more than the cap.
fn read_row(
    reader: &mut BufReader<File>,
    buf: &mut Vec<u8>,
    fields: &mut Vec<Vec<u8>>,
    line: &mut u64,
) -> Result<bool, CsvFault> {
    fields.clear();
    let start = *line + 1;
    let mut field = Vec::new();
    let mut quoted = false;
    let mut at_field_start = true;
    // The row's bytes so far (its lines together).
    let mut row_bytes = 0usize;
    loop {
        let n = match read_line(reader, buf, MAX_LINE_BYTES) {
            Ok(n) => n,
            Err(LineError::Io(e)) => return Err(io_fault(start, e)),
            Err(LineError::TooLong { max }) => {
                return Err(CsvFault {
                    line: *line + 1,
                    reason: format!("the line is longer than {max} bytes, the most a line may hold"),
                })
            }
        };
        if n == 0 {
            if quoted {
                return Err(CsvFault { line: start, reason: "the file ends inside a quoted cell".into() });
            }
            return Ok(false);
        }
        *line += 1;
        let bytes = without_line_end(buf);
        if !quoted && fields.is_empty() && bytes.is_empty() {
            // A blank line between rows.
            continue;
        }
        row_bytes += n;
        if row_bytes > MAX_LINE_BYTES {
            return Err(CsvFault {
                line: start,
                reason: format!(
                    "the row (a quoted cell over several lines) is longer than {MAX_LINE_BYTES} bytes, the most a \
                     row may hold"
                ),
            });
        }
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if quoted {
                if b == b'"' {
                    if bytes.get(i + 1) == Some(&b'"') {
                        field.push(b'"');
                        i += 1;
                    } else {
                        quoted = false;
                    }
                } else {
                    field.push(b);
                }
            } else if b == b'"' && at_field_start {
                quoted = true;
                at_field_start = false;
            } else if b == b',' {
                if fields.len() + 1 >= MAX_LINE_CELLS {
                    return Err(CsvFault {
                        line: start,
                        reason: format!("the row has more than {MAX_LINE_CELLS} cells, the most a row may hold"),
                    });
                }
                fields.push(std::mem::take(&mut field));
                at_field_start = true;
            } else {
                field.push(b);
                at_field_start = false;
            }
            i += 1;
        }
        if quoted {
            // The line end is inside the quoted cell.
            field.push(b'\n');
            continue;
        }
        fields.push(std::mem::take(&mut field));
        return Ok(true);
    }
}

fn kind_of(cell: &[u8]) -> ColumnKind {
    let Ok(text) = std::str::from_utf8(cell) else { return ColumnKind::Bytes };
    let text = text.trim();
    if text.parse::<i64>().is_ok() {
        ColumnKind::Int
    } else if text.parse::<f64>().is_ok() {
        ColumnKind::Float
    } else {
        ColumnKind::Bytes
    }
}

impl CsvReader {
    /// Opens a file: reads its header and decides its columns' kinds.
    pub fn open(path: &Path) -> Result<CsvReader, (PathBuf, CsvFault)> {
        let fail = |fault| (path.to_path_buf(), fault);
        let open = || File::open(path).map(BufReader::new).map_err(|e| fail(io_fault(0, e)));
        let (mut buf, mut fields, mut line) = (Vec::new(), Vec::new(), 0);
        let mut sample = open()?;
        if !read_row(&mut sample, &mut buf, &mut fields, &mut line).map_err(fail)? {
            return Err(fail(CsvFault { line: 1, reason: "no header row".into() }));
        }
        let mut header: Vec<String> = fields.iter().map(|f| String::from_utf8_lossy(f).trim().to_string()).collect();
        if let Some(first) = header.first_mut() {
            *first = first.trim_start_matches('\u{feff}').to_string();
        }
        let mut kinds: Vec<Option<ColumnKind>> = vec![None; header.len()];
        for _ in 0..KIND_SAMPLE_ROWS {
            if !read_row(&mut sample, &mut buf, &mut fields, &mut line).map_err(fail)? {
                break;
            }
            for (kind, cell) in kinds.iter_mut().zip(&fields) {
                if cell.is_empty() {
                    continue;
                }
                let here = kind_of(cell);
                *kind = Some(match (*kind, here) {
                    (None, k) => k,
                    (Some(ColumnKind::Bytes), _) | (_, ColumnKind::Bytes) => ColumnKind::Bytes,
                    (Some(ColumnKind::Float), _) | (_, ColumnKind::Float) => ColumnKind::Float,
                    _ => ColumnKind::Int,
                });
            }
        }
        let kinds = kinds.into_iter().map(|k| k.unwrap_or(ColumnKind::Bytes)).collect();
        let mut inner = open()?;
        let mut skip_line = 0;
        read_row(&mut inner, &mut buf, &mut fields, &mut skip_line).map_err(fail)?;
        Ok(CsvReader { inner, header, kinds, line: skip_line, buf, fields })
    }

    /// Reads the next row into `example`; `Ok(None)` at the end, else the
    /// row's 1-based line.
    pub fn next_row(&mut self, example: &mut Example) -> Result<Option<u64>, CsvFault> {
        if !read_row(&mut self.inner, &mut self.buf, &mut self.fields, &mut self.line)? {
            return Ok(None);
        }
        let start = self.line;
        if self.fields.len() != self.header.len() {
            return Err(CsvFault {
                line: start,
                reason: format!("row has {} cells but the header has {}", self.fields.len(), self.header.len()),
            });
        }
        let features = example.features.get_or_insert_with(Features::default);
        features.feature.clear();
        for ((name, kind), cell) in self.header.iter().zip(&self.kinds).zip(&self.fields) {
            if cell.is_empty() {
                continue;
            }
            let text = std::str::from_utf8(cell).map(str::trim);
            let feature = match kind {
                ColumnKind::Int => match text.ok().and_then(|t| t.parse::<i64>().ok()) {
                    Some(v) => Feature::ints(vec![v]),
                    None => return Err(bad_cell(start, name, cell, "an integer")),
                },
                ColumnKind::Float => match text.ok().and_then(|t| t.parse::<f32>().ok()) {
                    Some(v) => Feature::floats(vec![v]),
                    None => return Err(bad_cell(start, name, cell, "a number")),
                },
                ColumnKind::Bytes => Feature::bytes(vec![cell.clone()]),
            };
            features.feature.insert(name.clone(), feature);
        }
        Ok(Some(start))
    }
}

fn bad_cell(line: u64, column: &str, cell: &[u8], expected: &str) -> CsvFault {
    CsvFault {
        line,
        reason: format!("column '{column}' is '{}' but earlier rows made it {expected}", String::from_utf8_lossy(cell)),
    }
}

fn csv_error(path: &Path) -> impl Fn(CsvFault) -> DataError + '_ {
    move |fault| DataError::Csv { path: path.to_path_buf(), line: fault.line, reason: fault.reason }
}

fn open_reader(path: &Path) -> Result<CsvReader, DataError> {
    CsvReader::open(path).map_err(|(path, fault)| csv_error(&path)(fault))
}

/// The first row, as an example.
pub(crate) fn peek(path: &Path, _compression: Compression, _options: &Options) -> Result<Option<Look>, DataError> {
    let mut reader = open_reader(path)?;
    let mut example = Example::default();
    Ok(reader.next_row(&mut example).map_err(csv_error(path))?.map(|_| Look::Example(example)))
}

pub(crate) fn open(path: &Path, _compression: Compression, options: &Options) -> Result<Box<dyn Source>, DataError> {
    let range = if options.part.is_whole() {
        (0, u64::MAX)
    } else {
        let mut counter = open_reader(path)?;
        let mut example = Example::default();
        let mut rows = 0;
        while let Ok(Some(_)) = counter.next_row(&mut example) {
            rows += 1;
        }
        let (lo, hi) = options.part.rows(rows);
        (lo, if options.part.index + 1 == options.part.count { u64::MAX } else { hi })
    };
    let reader = open_reader(path)?;
    Ok(Box::new(CsvSource { reader, path: path.to_path_buf(), row: 0, range, example: Example::default() }))
}

/// One CSV file's rows, as examples.
struct CsvSource {
    reader: CsvReader,
    path: PathBuf,
    /// The next data row's 0-based index.
    row: u64,
    /// Rows `[lo, hi)` are this part's.
    range: (u64, u64),
    example: Example,
}

impl Source for CsvSource {
    fn next_piece(&mut self, _max_rows: usize) -> Result<Option<Piece<'_>>, DataError> {
        loop {
            if self.row >= self.range.1 {
                return Ok(None);
            }
            if self.reader.next_row(&mut self.example).map_err(csv_error(&self.path))?.is_none() {
                return Ok(None);
            }
            self.row += 1;
            if self.row > self.range.0 {
                return Ok(Some(Piece::Example { example: &self.example, record: self.row - 1, raw: None }));
            }
        }
    }
}
