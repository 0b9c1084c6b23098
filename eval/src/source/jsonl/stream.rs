//! The lines of a JSON Lines file as a stream ([`Lines`]): each read with
//! the text formats' line cap (a gzip file's following its compressed
//! size), blank lines skipped, a byte order mark dropped, a line's number
//! kept for errors; a compressed file decompressed as it is read.

use crate::error::DataError;
use crate::source::io_error;
use crate::source::lines::{
    compressed_line_cap, read_line, without_line_end, LineError, MAX_LINE_BYTES, MIN_COMPRESSED_LINE_BYTES,
};
use crate::source::Compression;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// Buffer of the file (and of the decompressed stream).
pub(super) const READ_BUFFER: usize = 256 << 10;

/// Lines of a stream, each at most [`MAX_LINE_BYTES`], blank ones skipped.
pub(super) struct Lines {
    reader: Box<dyn BufRead + Send>,
    /// Lines read (the last one's 1-based number, counted from where reading began).
    pub(super) line: u64,
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
pub(super) struct LineFault {
    pub(super) line: u64,
    pub(super) reason: String,
}

impl Lines {
    /// Lines of a plain file's `reader` (`compressed_len` `None`), or of a
    /// gzip file of `compressed_len` bytes.
    pub(super) fn new(reader: Box<dyn BufRead + Send>, compressed_len: Option<u64>, offset: u64) -> Lines {
        let max_line = compressed_len.map_or(MAX_LINE_BYTES, compressed_line_cap);
        Lines { reader, line: 0, offset, buf: Vec::new(), text: 0..0, max_line, compressed_len }
    }

    /// The last line read by [`Lines::next`].
    pub(super) fn text(&self) -> &[u8] {
        &self.buf[self.text.clone()]
    }

    /// Reads the next non-blank line that starts before byte `end` (see
    /// [`Lines::text`]); false at the end (of the stream, or before `end`).
    pub(super) fn next(&mut self, end: u64) -> Result<bool, LineFault> {
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

/// The lines of a file, decompressed as a stream where it is compressed
/// (whose line cap then follows its compressed size).
pub(super) fn open_stream(path: &Path, compression: Compression) -> Result<Lines, DataError> {
    let file = File::open(path).map_err(io_error(path))?;
    let compressed_len = match compression.is_compressed() {
        true => Some(file.metadata().map_err(io_error(path))?.len()),
        false => None,
    };
    let stream = compression.decoder(BufReader::with_capacity(READ_BUFFER, file));
    Ok(Lines::new(Box::new(BufReader::with_capacity(READ_BUFFER, stream)), compressed_len, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

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
        let path = dir.path().join("long.jsonl");
        std::fs::write(&path, format!("{{\"y\": 1}}\n{{\"y\": \"{}\"}}\n", "a".repeat(100))).unwrap();
        let mut lines = open_stream(&path, Compression::None).unwrap();
        lines.max_line = 50;
        assert!(lines.next(u64::MAX).is_ok());
        let Err(fault) = lines.next(u64::MAX) else { panic!("too long") };
        assert_eq!(fault.line, 2);
    }
}
