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
//!   shards) reads the records that start in the range, found by one walk of
//!   the record headers from the file's start ([`first_record_from`]: each
//!   length checked by its CRC, the data seeked over, never read). A record
//!   belongs to the range its start is in, whatever is wrong with it; a fault
//!   that stops the walk (a bad length CRC, a truncation) starts where the
//!   unsharded reader meets it, and belongs to the range that holds that
//!   offset. So the ranges of a file together see every record once, and the
//!   same corruption as one reader of the whole file, and finding a range's
//!   start costs one read per record header before it (never a CRC of data:
//!   searching for a position whose CRCs check would both skip a damaged
//!   record and, on hostile bytes, recompute data CRCs at every offset).

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
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

    /// Opens a plain file to read the records that start in the bytes
    /// `[from, end)`: a data shard's part. The first is found by walking the
    /// headers from the file's start ([`first_record_from`]).
    pub fn open_range(path: &Path, from: u64, end: u64) -> io::Result<RecordReader> {
        let mut file = File::open(path)?;
        let size = file.metadata()?.len();
        let start = first_record_from(&mut file, size, from)?;
        file.seek(SeekFrom::Start(start))?;
        let inner = Box::new(BufReader::with_capacity(READ_BUFFER, file).take(size - start));
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
                Some(size) => {
                    RecordFault::Truncated { needed: len.saturating_add(4), available: size.saturating_sub(start + 12) }
                }
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

/// The buffer of [`first_record_from`]'s walk: small, since past a large
/// record it is refilled at the next header.
const WALK_BUFFER: usize = 8 << 10;

/// Where the records of a plain TFRecord file of `size` bytes (read through
/// `file`) that start at or after `from` begin, as [`RecordReader`] reads the
/// file from its start: the offset of the first record, or of the fault that
/// stops the reading (a bad length CRC, a truncated record), at or after
/// `from`; `size` when the records, or the reading, end before it.
///
/// One walk over the record headers: each length is believed only after its
/// CRC checks and only as far as the file goes, and the data and its CRC are
/// seeked over, not read: a bad data CRC does not move a record to another
/// range (the range's reader meets it). At most `WALK_BUFFER` bytes are
/// read per record header, and no more than the file's size plus that buffer
/// in all when records are smaller.
pub fn first_record_from<F: Read + Seek>(file: F, size: u64, from: u64) -> io::Result<u64> {
    let mut walk = BufReader::with_capacity(WALK_BUFFER, file);
    walk.seek(SeekFrom::Start(0))?;
    let mut pos = 0u64;
    loop {
        if pos >= from {
            return Ok(pos);
        }
        // A record needs its 12-byte header and 4-byte data CRC in the file.
        if size - pos < 16 {
            return Ok(size);
        }
        let mut header = [0u8; 12];
        match walk.read_exact(&mut header) {
            Ok(()) => {}
            // The file shrank since `size` was taken: the reading stops here too.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(size),
            Err(e) => return Err(e),
        }
        let len_bytes: [u8; 8] = header[..8].try_into().expect("8 bytes");
        if masked_crc32c(&len_bytes) != u32::from_le_bytes(header[8..].try_into().expect("4 bytes")) {
            return Ok(size);
        }
        let len = u64::from_le_bytes(len_bytes);
        if len > size - pos - 16 {
            return Ok(size);
        }
        // Within the file's size, so within an i64 (a file's size is one).
        let skip = i64::try_from(len + 4).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("record length {len} at byte offset {pos} is past a seek"),
            )
        })?;
        walk.seek_relative(skip)?;
        pos += 16 + len;
    }
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

    /// A reader that counts the bytes read through it.
    struct Counting<R> {
        inner: R,
        read: u64,
    }

    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n as u64;
            Ok(n)
        }
    }

    impl<R: Seek> Seek for Counting<R> {
        fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
            self.inner.seek(to)
        }
    }

    #[test]
    fn the_walk_to_a_part_reads_headers_not_data() {
        // Large records: a buffer's worth per header, none of the data.
        let mut file = Vec::new();
        for i in 0..4u8 {
            write_record(&mut file, &vec![i; 1 << 20]);
        }
        let size = file.len() as u64;
        let record = (16 + (1 << 20)) as u64;
        let mut counting = Counting { inner: io::Cursor::new(&file), read: 0 };
        assert_eq!(first_record_from(&mut counting, size, 2 * record + 1).unwrap(), 3 * record);
        assert!(counting.read <= 3 * WALK_BUFFER as u64, "{} bytes read", counting.read);
        // Small records: each byte at most once.
        let mut small = Vec::new();
        for i in 0..10_000u32 {
            write_record(&mut small, &i.to_le_bytes()[..(i % 5) as usize]);
        }
        let size = small.len() as u64;
        let mut counting = Counting { inner: io::Cursor::new(&small), read: 0 };
        assert_eq!(first_record_from(&mut counting, size, size - 1).unwrap(), size);
        assert!(counting.read <= size, "{} bytes read of {size}", counting.read);
        // A bad data CRC does not move a record; a bad length CRC ends the walk
        // where the reader stops, and belongs to the part holding its offset.
        let mut damaged = Vec::new();
        for data in [&b"abc"[..], b"defg", b"hi"] {
            write_record(&mut damaged, data);
        }
        let size = damaged.len() as u64;
        damaged[19 + 12] ^= 1;
        let walk = |bytes: &[u8], from| first_record_from(io::Cursor::new(bytes), size, from).unwrap();
        assert_eq!((walk(&damaged, 1), walk(&damaged, 20), walk(&damaged, 40)), (19, 39, size));
        damaged[19 + 8] ^= 1;
        assert_eq!((walk(&damaged, 1), walk(&damaged, 19), walk(&damaged, 20)), (19, 19, size));
    }
}
