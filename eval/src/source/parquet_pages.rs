//! The page headers of a Parquet file's column chunks, read here before the
//! Parquet crate reads the pages: a page header claims how many bytes its
//! page decompresses to (up to 2 GiB), and the crate allocates that much and
//! fills it. A 10 KB file of zstd-compressed zeros can so claim, and really
//! take, gigabytes of the supervisor's memory per column: a decompression
//! bomb. Every page of every column chunk a read will touch is checked here
//! against a cap relative to the file ([`page_cap`]: eight times its bytes,
//! at least [`MIN_PAGE_BYTES`], at most [`MAX_PAGE_BYTES`]), and the largest
//! pages of the columns read together (one page of each is decompressed at
//! a time) against [`pages_cap`] (twelve times, [`MIN_PAGES_BYTES`] to
//! [`MAX_PAGES_BYTES`]): reading a file of N bytes holds at most
//! max(64 MiB, 16 × N), the bound every reader of untrusted bytes keeps,
//! and a 7 KB file cannot make a 200 MiB dictionary page.
//!
//! A page header is a Thrift compact-protocol struct; only its fields 2
//! (`uncompressed_page_size`) and 3 (`compressed_page_size`) are read, the
//! rest skipped without allocating, with a nesting limit and a byte budget
//! ([`MAX_HEADER_BYTES`]) so a hostile header cannot make this loop long.

use crate::error::DataError;
use parquet::file::metadata::ParquetMetaData;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;

/// The most bytes one page may decompress to, whatever the file's size.
/// Writers cut pages at about 1 MiB (pyarrow, parquet-mr, polars and
/// arrow-rs by default).
pub const MAX_PAGE_BYTES: u64 = 256 << 20;
/// The most bytes one page of any file may decompress to (a small file's
/// cap; see [`page_cap`]).
pub const MIN_PAGE_BYTES: u64 = 32 << 20;
/// The most bytes the largest pages of the columns read at once may
/// decompress to, together, whatever the file's size.
pub const MAX_PAGES_BYTES: u64 = 1 << 30;
/// The most bytes the largest pages of the columns read at once may
/// decompress to, together, in any file (see [`pages_cap`]).
pub const MIN_PAGES_BYTES: u64 = 48 << 20;

/// The most bytes one page of a file of `file_len` bytes may decompress
/// to: eight times the file, within [`MIN_PAGE_BYTES`] and [`MAX_PAGE_BYTES`].
pub fn page_cap(file_len: u64) -> u64 {
    file_len.saturating_mul(8).clamp(MIN_PAGE_BYTES, MAX_PAGE_BYTES)
}

/// The most bytes the largest pages of the columns of one row group read at
/// once may decompress to in a file of `file_len` bytes: twelve times the
/// file, within [`MIN_PAGES_BYTES`] and [`MAX_PAGES_BYTES`].
pub fn pages_cap(file_len: u64) -> u64 {
    file_len.saturating_mul(12).clamp(MIN_PAGES_BYTES, MAX_PAGES_BYTES)
}
/// The most bytes one page header may take (statistics included).
pub const MAX_HEADER_BYTES: u64 = 16 << 20;
/// How deep Thrift structs and lists may nest in a page header.
const MAX_DEPTH: u32 = 32;

/// Why a page header could not be read.
#[derive(Debug)]
enum HeaderError {
    Io(std::io::Error),
    Bad(String),
}

impl From<std::io::Error> for HeaderError {
    fn from(e: std::io::Error) -> Self {
        HeaderError::Io(e)
    }
}

/// A reader of one page header, counting what it takes.
struct Compact<'a, R> {
    input: &'a mut R,
    taken: u64,
}

impl<R: BufRead + Seek> Compact<'_, R> {
    fn byte(&mut self) -> Result<u8, HeaderError> {
        self.budget(1)?;
        let mut b = [0u8; 1];
        self.input.read_exact(&mut b)?;
        Ok(b[0])
    }

    fn budget(&mut self, n: u64) -> Result<(), HeaderError> {
        self.taken = self.taken.saturating_add(n);
        if self.taken > MAX_HEADER_BYTES {
            return Err(HeaderError::Bad(format!("a page header longer than {MAX_HEADER_BYTES} bytes")));
        }
        Ok(())
    }

    fn varint(&mut self) -> Result<u64, HeaderError> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                break;
            }
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(HeaderError::Bad("a varint longer than 64 bits".into()))
    }

    fn zigzag(&mut self) -> Result<i64, HeaderError> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    fn skip_bytes(&mut self, n: u64) -> Result<(), HeaderError> {
        self.budget(n)?;
        let n = i64::try_from(n).map_err(|_| HeaderError::Bad("a length past 2^63".into()))?;
        self.input.seek_relative(n)?;
        Ok(())
    }

    /// Skips one value of compact type `kind`.
    fn skip(&mut self, kind: u8, depth: u32) -> Result<(), HeaderError> {
        if depth > MAX_DEPTH {
            return Err(HeaderError::Bad(format!("structs nested deeper than {MAX_DEPTH}")));
        }
        match kind {
            // Booleans in a struct field live in the type; in a list, one byte each.
            1 | 2 => Ok(()),
            3 => self.byte().map(drop),
            4..=6 => self.varint().map(drop),
            7 => self.skip_bytes(8),
            8 => {
                let n = self.varint()?;
                self.skip_bytes(n)
            }
            9 | 10 => {
                let head = self.byte()?;
                let n = match head >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                let element = head & 0x0f;
                for _ in 0..n {
                    if element == 1 || element == 2 {
                        self.byte()?;
                    } else {
                        self.skip(element, depth + 1)?;
                    }
                }
                Ok(())
            }
            11 => {
                let n = self.varint()?;
                if n == 0 {
                    return Ok(());
                }
                let types = self.byte()?;
                for _ in 0..n {
                    for element in [types >> 4, types & 0x0f] {
                        if element == 1 || element == 2 {
                            self.byte()?;
                        } else {
                            self.skip(element, depth + 1)?;
                        }
                    }
                }
                Ok(())
            }
            12 => self.fields(depth + 1, |_, _, _| Ok(false)),
            other => Err(HeaderError::Bad(format!("Thrift type {other}"))),
        }
    }

    /// Reads a struct's fields up to its stop byte; `take(id, kind, self)`
    /// reads a field it wants (returning true), else it is skipped.
    fn fields(
        &mut self,
        depth: u32,
        mut take: impl FnMut(i16, u8, &mut Self) -> Result<bool, HeaderError>,
    ) -> Result<(), HeaderError> {
        let mut id: i16 = 0;
        loop {
            let head = self.byte()?;
            if head == 0 {
                return Ok(());
            }
            let kind = head & 0x0f;
            id = match head >> 4 {
                0 => i16::try_from(self.zigzag()?).map_err(|_| HeaderError::Bad("a field id past i16".into()))?,
                delta => id.wrapping_add(i16::from(delta)),
            };
            if !take(id, kind, self)? {
                self.skip(kind, depth)?;
            }
        }
    }
}

/// What a page header says of its page's sizes, and how long it is.
fn page_sizes<R: BufRead + Seek>(input: &mut R) -> Result<(u64, i64, i64), HeaderError> {
    let mut reader = Compact { input, taken: 0 };
    let (mut uncompressed, mut compressed) = (None, None);
    reader.fields(0, |id, kind, r| match (id, kind) {
        (2, 5) => {
            uncompressed = Some(r.zigzag()?);
            Ok(true)
        }
        (3, 5) => {
            compressed = Some(r.zigzag()?);
            Ok(true)
        }
        _ => Ok(false),
    })?;
    match (uncompressed, compressed) {
        (Some(u), Some(c)) => Ok((reader.taken, u, c)),
        _ => Err(HeaderError::Bad("a page header without its sizes".into())),
    }
}

fn bad(path: &Path, reason: String) -> DataError {
    DataError::Array { path: path.to_path_buf(), reason: format!("not a valid Parquet file: {reason}") }
}

/// Checks the pages of the column chunks of `groups` whose leaf columns
/// `leaf` selects: each header readable and within its chunk, each page
/// within [`page_cap`] of the file's size decompressed, and the largest
/// pages of the columns of one row group within [`pages_cap`] together.
pub(crate) fn check_pages(
    path: &Path,
    meta: &ParquetMetaData,
    groups: std::ops::Range<usize>,
    leaf: impl Fn(usize) -> bool,
) -> Result<(), DataError> {
    let io = super::io_error(path);
    let file = std::fs::File::open(path).map_err(&io)?;
    let file_len = file.metadata().map_err(&io)?.len();
    let (page_most, pages_most) = (page_cap(file_len), pages_cap(file_len));
    let mut file = BufReader::with_capacity(64 << 10, file);
    for g in groups {
        let group = meta.row_group(g);
        let mut together = 0u64;
        for (c, column) in group.columns().iter().enumerate() {
            if !leaf(c) {
                continue;
            }
            let name = column.column_path().string();
            // Checked against the file when the footer was read.
            let start = column.dictionary_page_offset().unwrap_or(column.data_page_offset()) as u64;
            let end = start + column.compressed_size() as u64;
            let mut at = start;
            let mut largest = 0u64;
            let mut page = 0u64;
            file.seek(SeekFrom::Start(at)).map_err(&io)?;
            while at < end {
                let here = |reason: String| {
                    bad(path, format!("row group {g} column '{name}' page {page} at byte offset {at}: {reason}"))
                };
                let (header, uncompressed, compressed) = page_sizes(&mut file).map_err(|e| match e {
                    HeaderError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        here("its header runs past the end of the file".into())
                    }
                    HeaderError::Io(e) => io(e),
                    HeaderError::Bad(reason) => here(format!("its header has {reason}")),
                })?;
                let (Ok(uncompressed), Ok(compressed)) = (u64::try_from(uncompressed), u64::try_from(compressed))
                else {
                    return Err(here(format!("its header claims sizes {uncompressed} and {compressed}")));
                };
                let next = at.saturating_add(header).saturating_add(compressed);
                if next > end {
                    return Err(here(format!(
                        "its {compressed} bytes run past the column chunk's end at byte offset {end}"
                    )));
                }
                if uncompressed > page_most {
                    return Err(here(format!(
                        "it claims to decompress to {uncompressed} bytes, more than the {page_most} a page of a \
                         {file_len}-byte file may take here (8 times the file, at least {MIN_PAGE_BYTES}, at most \
                         {MAX_PAGE_BYTES}: a page that much larger than its file is a decompression bomb; writers \
                         cut pages at about 1 MiB, so rewrite the file with smaller pages)"
                    )));
                }
                largest = largest.max(uncompressed);
                file.seek_relative(compressed as i64).map_err(&io)?;
                at = next;
                page += 1;
            }
            together = together.saturating_add(largest);
            if together > pages_most {
                return Err(bad(
                    path,
                    format!(
                        "row group {g}: the largest pages of the columns read, up to column '{name}' (its chunk at \
                         byte offset {start}), claim to decompress to {together} bytes together, more than the \
                         {pages_most} read at once here from a {file_len}-byte file (12 times the file, at least \
                         {MIN_PAGES_BYTES}, at most {MAX_PAGES_BYTES}: pages that much larger than their file are a \
                         decompression bomb)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn sizes(bytes: &[u8]) -> Result<(u64, i64, i64), String> {
        page_sizes(&mut Cursor::new(bytes.to_vec())).map_err(|e| match e {
            HeaderError::Io(e) => format!("io: {e}"),
            HeaderError::Bad(reason) => reason,
        })
    }

    #[test]
    fn the_sizes_are_read_and_other_fields_skipped() {
        // type=0 (i32 field 1), uncompressed=100 (field 2), compressed=7 (field 3),
        // crc (field 4), a data_page_header struct (field 5) holding an i32 and a binary, stop.
        let header = [0x15, 0x00, 0x15, 200, 1, 0x15, 14, 0x15, 2, 0x1c, 0x15, 4, 0x18, 3, b'a', b'b', b'c', 0, 0];
        assert_eq!(sizes(&header), Ok((header.len() as u64, 100, 7)));
    }

    #[test]
    fn hostile_headers_are_errors_not_allocations_or_long_loops() {
        // A binary claiming 2^40 bytes.
        let mut huge = vec![0x18];
        huge.extend([0x80, 0x80, 0x80, 0x80, 0x80, 0x20]);
        assert!(sizes(&huge).unwrap_err().contains("longer than"), "{:?}", sizes(&huge));
        // Structs nested past the limit.
        let deep = vec![0x1c; 100];
        assert!(sizes(&deep).unwrap_err().contains("nested deeper"));
        // A varint of eleven bytes.
        let long = [0x15, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert!(sizes(&long).unwrap_err().contains("varint"));
        // A list claiming 2^32 one-byte elements runs out of input, not of time.
        let list = [0x19, 0xf3, 0x80, 0x80, 0x80, 0x80, 0x10];
        assert!(sizes(&list).unwrap_err().starts_with("io:"));
        // No sizes at all; an unknown type.
        assert!(sizes(&[0]).unwrap_err().contains("without its sizes"));
        assert!(sizes(&[0x1d, 0]).unwrap_err().contains("Thrift type 13"));
    }
}
