//! TFRecord files, read record by record with both checksums verified.
//!
//! A record is `u64` little-endian length, `u32` masked CRC32C of those 8
//! bytes, the data, `u32` masked CRC32C of the data (TensorFlow's
//! `tensorflow/core/lib/io/record_reader.cc`; mask:
//! `((crc >> 15) | (crc << 17)).wrapping_add(0xa282ead8)`). Decisions:
//!
//! - A length is never believed before it is checked: its own CRC first, then
//!   against what is left of a plain file (a hostile length of 2^63 is an
//!   error, not an allocation), and for gzip files, whose decompressed size is
//!   unknown, against [`MAX_GZIP_RECORD`]. The data buffer is reused from one
//!   record to the next, so reading allocates nothing per record.
//! - A plain file is read up to the size it had when opened: one that grows
//!   meanwhile (a writer still appending) is read as it was, and one that
//!   shrinks ends in a truncated record.
//! - Byte offsets in errors are the record's start: in the file for plain
//!   files, in the decompressed stream for gzip files (said in the message).
//! - What can be skipped (`--skip-corrupt`) depends on what is still known:
//!   after a data CRC mismatch the next record's position is known, so only
//!   that record is skipped; after a bad length CRC or a truncation nothing
//!   further in the file can be trusted, so the rest of the file is skipped.
//! - A byte range of a plain file ([`RecordReader::open_range`], for data
//!   shards) reads the records that start in the range; a range that starts
//!   inside a record begins at the next record boundary ([`next_boundary`]:
//!   the first position whose length CRC and data CRC both check).

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The largest record a gzip-compressed file may hold: its decompressed size
/// is not known up front, so a length field is believed up to this much.
pub const MAX_GZIP_RECORD: u64 = 256 << 20;

/// The size of the read buffer over each file.
const READ_BUFFER: usize = 256 << 10;

/// TensorFlow's masked CRC32C.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends one record in TFRecord framing to `out` (for tests and tools that
/// write datasets).
pub fn write_record(out: &mut Vec<u8>, data: &[u8]) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
}

/// Why a record could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordFault {
    /// The data's CRC does not match: the record is bad, the framing is not.
    DataCrc,
    /// The length's CRC does not match: nothing after it can be located.
    LengthCrc,
    /// The file ends inside the record (`needed` more bytes than were there).
    Truncated { needed: u64, available: u64 },
    /// The length field claims more than the file (or, gzip, the cap) allows.
    Length { claimed: u64, limit: u64 },
    /// The file could not be read.
    Io(String),
}

impl RecordFault {
    /// Whether the record after this one can still be found.
    pub fn resumable(&self) -> bool {
        matches!(self, RecordFault::DataCrc)
    }
}

impl std::fmt::Display for RecordFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordFault::DataCrc => f.write_str("data CRC32C mismatch (corrupt record)"),
            RecordFault::LengthCrc => f.write_str("length CRC32C mismatch (corrupt record header)"),
            RecordFault::Truncated { needed, available } => {
                write!(f, "truncated record: needs {needed} more bytes, the file has {available}")
            }
            RecordFault::Length { claimed, limit } => {
                write!(f, "record length {claimed} exceeds what the file can hold ({limit} bytes)")
            }
            RecordFault::Io(e) => write!(f, "cannot read: {e}"),
        }
    }
}

/// Reads the records of one TFRecord file (plain or gzip).
pub struct RecordReader {
    inner: Box<dyn Read + Send>,
    path: PathBuf,
    gzip: bool,
    /// Bytes of the (decompressed) stream consumed so far.
    offset: u64,
    /// The plain file's size; `None` for gzip.
    size: Option<u64>,
    /// Set after a fault that is not resumable: the reader returns nothing more.
    dead: bool,
    /// Records starting at or after this offset are not read.
    end: u64,
}

impl RecordReader {
    /// Opens a file; `gzip` says whether it is gzip-compressed (its magic is checked).
    pub fn open(path: &Path, gzip: bool) -> io::Result<RecordReader> {
        let file = File::open(path)?;
        let size = file.metadata()?.len();
        let mut buffered = BufReader::with_capacity(READ_BUFFER, file);
        let inner: Box<dyn Read + Send> = if gzip {
            let mut magic = [0u8; 2];
            let head = io::BufRead::fill_buf(&mut buffered)?;
            let n = head.len().min(2);
            magic[..n].copy_from_slice(&head[..n]);
            if size > 0 && magic != [0x1f, 0x8b] {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "not a gzip file (wrong magic number)"));
            }
            Box::new(BufReader::with_capacity(READ_BUFFER, flate2::read::MultiGzDecoder::new(buffered)))
        } else {
            // Read as it was when opened: bytes appended later are not seen
            // (the dataset's digest has the size at open), and every offset
            // stays within `size`.
            Box::new(buffered.take(size))
        };
        Ok(RecordReader {
            inner,
            path: path.to_path_buf(),
            gzip,
            offset: 0,
            size: (!gzip).then_some(size),
            dead: false,
            end: u64::MAX,
        })
    }

    /// Opens a plain file to read the records that start in `[start, end)`;
    /// `start` must be a record boundary (see [`next_boundary`]).
    pub fn open_range(path: &Path, start: u64, end: u64) -> io::Result<RecordReader> {
        let mut file = File::open(path)?;
        let size = file.metadata()?.len();
        file.seek(SeekFrom::Start(start.min(size)))?;
        let inner = Box::new(BufReader::with_capacity(READ_BUFFER, file).take(size.saturating_sub(start)));
        Ok(RecordReader {
            inner,
            path: path.to_path_buf(),
            gzip: false,
            offset: start,
            size: Some(size),
            dead: false,
            end,
        })
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether offsets are in the decompressed stream.
    pub fn gzip(&self) -> bool {
        self.gzip
    }

    /// Reads the next record into `data` (replacing its contents). `Ok(None)`
    /// at the end; `Ok(Some(offset))` with the record's start; `Err((offset,
    /// fault))` for a bad record, after which only a resumable fault lets
    /// reading go on.
    pub fn next_record(&mut self, data: &mut Vec<u8>) -> Result<Option<u64>, (u64, RecordFault)> {
        if self.dead || self.offset >= self.end {
            return Ok(None);
        }
        let start = self.offset;
        let result = self.read_one(data, start);
        if let Err(fault) = &result {
            if !fault.resumable() {
                self.dead = true;
            }
        }
        result.map(|read| read.then_some(start)).map_err(|fault| (start, fault))
    }

    fn read_one(&mut self, data: &mut Vec<u8>, start: u64) -> Result<bool, RecordFault> {
        let mut header = [0u8; 12];
        let got = read_full(&mut self.inner, &mut header).map_err(|e| RecordFault::Io(e.to_string()))?;
        self.offset += got as u64;
        if got == 0 {
            return Ok(false);
        }
        if got < header.len() {
            return Err(RecordFault::Truncated { needed: 12, available: got as u64 });
        }
        let len_bytes: [u8; 8] = header[..8].try_into().expect("8 bytes");
        let len_crc = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
        if masked_crc32c(&len_bytes) != len_crc {
            return Err(RecordFault::LengthCrc);
        }
        let len = u64::from_le_bytes(len_bytes);
        let limit = match self.size {
            Some(size) => size.saturating_sub(start + 12 + 4),
            None => MAX_GZIP_RECORD,
        };
        if len > limit {
            return Err(match self.size {
                // A plain file: the length is right (its CRC says so) but the bytes are not there.
                Some(size) => RecordFault::Truncated { needed: len + 4, available: size.saturating_sub(start + 12) },
                None => RecordFault::Length { claimed: len, limit },
            });
        }
        let len = len as usize;
        data.clear();
        if self.gzip {
            // Grows with what arrives: the stream may end before `len`.
            data.reserve(len.min(1 << 20));
            (&mut self.inner).take(len as u64).read_to_end(data).map_err(|e| RecordFault::Io(e.to_string()))?;
        } else {
            data.resize(len, 0);
            let got = read_full(&mut self.inner, data).map_err(|e| RecordFault::Io(e.to_string()))?;
            data.truncate(got);
        }
        self.offset += data.len() as u64;
        if data.len() < len {
            return Err(RecordFault::Truncated { needed: len as u64 + 4, available: data.len() as u64 });
        }
        let mut crc = [0u8; 4];
        let got = read_full(&mut self.inner, &mut crc).map_err(|e| RecordFault::Io(e.to_string()))?;
        self.offset += got as u64;
        if got < 4 {
            return Err(RecordFault::Truncated { needed: 4, available: got as u64 });
        }
        if masked_crc32c(data) != u32::from_le_bytes(crc) {
            return Err(RecordFault::DataCrc);
        }
        Ok(true)
    }
}

/// The first record boundary at or after `from` in a plain TFRecord file
/// of `size` bytes: the first position where a whole record (its length
/// within the file, its length CRC and its data CRC) checks; `size` when
/// there is none. A false boundary needs both CRCs of random bytes to match
/// (a chance of 2^-64 per position), the data CRC read only where the length
/// CRC matched.
pub fn next_boundary(path: &Path, from: u64) -> io::Result<u64> {
    const WINDOW: usize = 1 << 20;
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    let mut window = Vec::new();
    let mut base = from;
    let mut pos = from;
    while pos.saturating_add(16) <= size {
        if pos + 12 > base + window.len() as u64 {
            base = pos;
            let len = (WINDOW as u64).min(size - pos) as usize;
            window.resize(len, 0);
            file.read_exact_at(&mut window, pos)?;
        }
        let at = (pos - base) as usize;
        let header = &window[at..at + 12];
        let len_bytes: [u8; 8] = header[..8].try_into().expect("8 bytes");
        if masked_crc32c(&len_bytes) == u32::from_le_bytes(header[8..].try_into().expect("4 bytes")) {
            let len = u64::from_le_bytes(len_bytes);
            if len <= size - pos - 16 && data_crc_matches(&file, pos + 12, len)? {
                return Ok(pos);
            }
        }
        pos += 1;
    }
    Ok(size)
}

/// Whether the `len` bytes at `start` are followed by their masked CRC32C.
fn data_crc_matches(file: &File, start: u64, len: u64) -> io::Result<bool> {
    let mut chunk = vec![0u8; (len as usize).min(64 << 10)];
    let mut crc = 0;
    let mut done = 0;
    while done < len {
        let n = ((len - done) as usize).min(chunk.len());
        file.read_exact_at(&mut chunk[..n], start + done)?;
        crc = crc32c::crc32c_append(crc, &chunk[..n]);
        done += n as u64;
    }
    let mut stored = [0u8; 4];
    file.read_exact_at(&mut stored, start + len)?;
    Ok(crc.rotate_right(15).wrapping_add(0xa282_ead8) == u32::from_le_bytes(stored))
}

/// Reads until `buf` is full or the stream ends; the number of bytes read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_matches_tensorflow() {
        // The framing of an empty record as TensorFlow's TFRecordWriter writes it.
        let mut out = Vec::new();
        write_record(&mut out, b"");
        assert_eq!(out, [0, 0, 0, 0, 0, 0, 0, 0, 41, 3, 152, 7, 216, 234, 130, 162]);
    }
}
