//! The sizes an Arrow IPC message's compressed buffers claim, checked
//! before arrow-ipc decompresses them. pandas' `to_feather()` and pyarrow's
//! `write_feather()` compress with lz4 by default (zstd on request), and
//! each compressed buffer starts with the length it decompresses to, which
//! arrow-ipc allocates at once (`Vec::with_capacity` for lz4, the zstd
//! decompressor's capacity) before it reads a byte of the data. A buffer of
//! a few bytes may so claim a terabyte; a real one of zeros really takes a
//! thousand times its bytes (a decompression bomb).
//!
//! So the first pass over the framing (`arrow::walk`) reads the 8-byte
//! prefix of every compressed buffer of every message (seeking past the
//! data, never reading it) and refuses a record batch whose buffers claim
//! together more than [`piece_limit`] of the file's size: the other
//! half of what a reader of untrusted bytes may hold at once (max(64 MiB,
//! 16 × the file)), the first being the piece its rows are converted into.
//! Dictionaries stay with the reader for the whole file (deltas add up), so
//! all of a file's dictionary batches share one such allowance. Every
//! buffer is counted, not only the projected columns': a column that is
//! not asked for is rarely what makes a file too large, and a simple rule
//! is easier to state in an error. arrow-ipc checks that each buffer
//! decompresses to exactly what it claims, so what is allowed here is
//! what is held.

use crate::batch::MAX_BATCH_BYTES;
use crate::error::DataError;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

/// The least a piece may materialise, whatever the file's size.
pub(crate) const PIECE_FLOOR: u64 = 32 << 20;
/// How many times its file's size a piece may materialise (above the floor).
pub(crate) const PIECE_FACTOR: u64 = 8;

/// The most bytes one piece of a file of `file_len` bytes may materialise:
/// [`PIECE_FACTOR`] times the file, at least [`PIECE_FLOOR`], at most
/// [`MAX_BATCH_BYTES`]. Rows can repeat a dictionary's value (Parquet, Arrow)
/// any number of times, so what a batch holds is not bounded by what the
/// file holds; this bound is half of what any reader of untrusted bytes may
/// take at once (max(64 MiB, 16 × its bytes)), the other half left to the
/// pages and arrays the values come from.
pub(crate) fn piece_limit(file_len: u64) -> u64 {
    file_len.saturating_mul(PIECE_FACTOR).clamp(PIECE_FLOOR, MAX_BATCH_BYTES)
}

/// A compressed buffer's first 8 bytes: its decompressed length (little
/// endian), `-1` when the data that follows is not compressed.
const PREFIX: u64 = 8;

/// What the compressed buffers of a file's messages claim, message by message.
pub(crate) struct Claims {
    limit: u64,
    file_len: u64,
    /// The dictionary batches' claims so far, all of them held at once.
    dictionaries: u64,
}

impl Claims {
    pub(crate) fn new(file_len: u64) -> Claims {
        Claims { limit: piece_limit(file_len), file_len, dictionaries: 0 }
    }

    /// Checks the message at `at`, whose body of `body_len` bytes starts at
    /// `body` (both already checked to lie within the file): a record batch
    /// may claim at most the limit, the dictionary batches together too.
    pub(crate) fn check(
        &mut self,
        reader: &mut BufReader<File>,
        path: &Path,
        at: u64,
        body: u64,
        body_len: u64,
        message: &arrow_ipc::Message<'_>,
    ) -> Result<(), DataError> {
        let (batch, dictionary) = match (message.header_as_record_batch(), message.header_as_dictionary_batch()) {
            (Some(batch), _) => (batch, false),
            (_, Some(dictionary)) => match dictionary.data() {
                Some(batch) => (batch, true),
                None => return Ok(()),
            },
            _ => return Ok(()),
        };
        if batch.compression().is_none() {
            return Ok(());
        }
        let mut claimed = if dictionary { self.dictionaries } else { 0 };
        // Where the reader is: buffers come in order, so most seeks stay
        // within the reader's buffer.
        let mut position = None;
        for buffer in batch.buffers().into_iter().flatten() {
            let (Ok(offset), Ok(length)) = (u64::try_from(buffer.offset()), u64::try_from(buffer.length())) else {
                continue; // arrow-ipc refuses it.
            };
            if length < PREFIX || offset.checked_add(PREFIX).is_none_or(|end| end > body_len) {
                continue; // Empty, or arrow-ipc refuses it.
            }
            let target = body + offset;
            match position {
                Some(now) => reader.seek_relative(target as i64 - now as i64),
                None => reader.seek(SeekFrom::Start(target)).map(drop),
            }
            .map_err(super::io_error(path))?;
            position = Some(target + PREFIX);
            let mut prefix = [0u8; PREFIX as usize];
            reader.read_exact(&mut prefix).map_err(super::io_error(path))?;
            // -1 (stored as is: a slice of the body) and 0 take nothing;
            // another negative length is arrow-ipc's error.
            let length = u64::try_from(i64::from_le_bytes(prefix)).unwrap_or(0);
            claimed = claimed.saturating_add(length);
        }
        if claimed > self.limit {
            let what = if dictionary { "the dictionary batches up to the one" } else { "a record batch" };
            return Err(DataError::Array {
                path: path.to_path_buf(),
                reason: format!(
                    "{what} at byte offset {at} claims its compressed buffers decompress to {claimed} bytes, \
                     more than the {} bytes a {}-byte Arrow file may decompress at once ({PIECE_FACTOR} times \
                     the file, at least {PIECE_FLOOR}, at most {MAX_BATCH_BYTES}); if the file is genuine, write \
                     it in smaller record batches (pyarrow: write_feather(..., chunksize=10000)) or uncompressed",
                    self.limit, self.file_len
                ),
            });
        }
        if dictionary {
            self.dictionaries = claimed;
        }
        Ok(())
    }
}
