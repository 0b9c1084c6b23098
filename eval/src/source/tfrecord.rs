//! TFRecord files of `tf.Example` (plain or gzip) as a row source: one
//! record at a time through [`RecordReader`] (framing and checksums live in
//! `crate::tfrecord`), each decoded into one reused [`Example`] and handed
//! with its serialized bytes (fed as they are to a lone string input).
//!
//! Parts: a plain file's part `K` of `N` is the records that start in the
//! bytes `[K*len/N, (K+1)*len/N)`, the first found by walking the record
//! headers from the file's start (`crate::tfrecord::first_record_from`), so
//! that a damaged record is in exactly one part; a gzip file cannot be entered midway,
//! so its parts are record ranges `[K*n/N, (K+1)*n/N)` of its `n` records,
//! counted from the start (the last part reads to the end, so a fault that
//! stopped the count is still met).

use super::compression::Compression;
use super::{io_error, Look, Options, Part, Piece, Raw, Source};
use crate::error::DataError;
use crate::example::Example;
use crate::tfrecord::RecordReader;
use prost::Message;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Checks the file opens (and, compressed, that it is gzip).
pub(crate) fn probe(path: &Path, compression: Compression) -> Result<(), DataError> {
    match compression {
        Compression::None => super::probe_file(path, compression),
        Compression::Gzip => RecordReader::open(path, true).map(drop).map_err(io_error(path)),
    }
}

/// The file's first example (skipping corrupt records with `skip_corrupt`).
pub(crate) fn peek(path: &Path, compression: Compression, options: &Options) -> Result<Option<Look>, DataError> {
    let gzip = compression.is_compressed();
    let skip_corrupt = options.skip_corrupt;
    let mut data = Vec::new();
    let mut reader = RecordReader::open(path, gzip).map_err(io_error(path))?;
    loop {
        match reader.next_record(&mut data) {
            Ok(None) => return Ok(None),
            Ok(Some(offset)) => {
                let example = Example::decode(data.as_slice()).map_err(|source| DataError::NotAnExample {
                    path: path.to_path_buf(),
                    record: 0,
                    offset,
                    source,
                })?;
                return Ok(Some(Look::Example(example)));
            }
            Err((_, fault)) if skip_corrupt && fault.resumable() => {}
            Err((_, _)) if skip_corrupt => return Ok(None),
            Err((offset, fault)) => return Err(DataError::Corrupt { path: path.to_path_buf(), offset, gzip, fault }),
        }
    }
}

/// The file's records; of a compressed file, counted from its start (see the
/// module's doc on parts).
pub(crate) fn open(path: &Path, compression: Compression, options: &Options) -> Result<Box<dyn Source>, DataError> {
    if compression.is_compressed() {
        return open_stream(path, compression, options);
    }
    let reader = if options.part.is_whole() {
        RecordReader::open(path, false)
    } else {
        let size = std::fs::metadata(path).map_err(io_error(path))?.len();
        let at = |k: u64| Part { index: k, count: options.part.count }.rows(size).0;
        RecordReader::open_range(path, at(options.part.index), at(options.part.index + 1))
    }
    .map_err(io_error(path))?;
    // Records are counted from where the part starts.
    let within = match options.part.is_whole() {
        true => "this file".to_string(),
        false => format!("part {}/{} of this file", options.part.index, options.part.count),
    };
    Ok(Box::new(TfRecordSource::new(path, reader, options, (0, u64::MAX), within)))
}

/// A compressed file's records: its part is a range of records counted from
/// its start (it cannot be entered midway).
fn open_stream(path: &Path, compression: Compression, options: &Options) -> Result<Box<dyn Source>, DataError> {
    let open = || RecordReader::open(path, compression.is_compressed()).map_err(io_error(path));
    let range = if options.part.is_whole() {
        (0, u64::MAX)
    } else {
        let records = count_records(open()?, options.skip_corrupt);
        let (lo, hi) = options.part.rows(records);
        (lo, if options.part.index + 1 == options.part.count { u64::MAX } else { hi })
    };
    Ok(Box::new(TfRecordSource::new(path, open()?, options, range, "this file".into())))
}

/// The records of a file as a source counts them (each record, and each
/// corrupt record skipped), up to the end or the first fault that stops it.
fn count_records(mut reader: RecordReader, skip_corrupt: bool) -> u64 {
    let mut data = Vec::new();
    let mut records = 0;
    loop {
        match reader.next_record(&mut data) {
            Ok(Some(_)) => records += 1,
            Err((_, fault)) if skip_corrupt && fault.resumable() => records += 1,
            Ok(None) | Err(_) => return records,
        }
    }
}

/// One TFRecord file's records, as examples.
struct TfRecordSource {
    reader: RecordReader,
    path: PathBuf,
    /// The next record's index (corrupt records skipped are counted).
    record: u64,
    /// Records `[lo, hi)` are this part's.
    range: (u64, u64),
    skip_corrupt: bool,
    skipped: Arc<AtomicU64>,
    data: Vec<u8>,
    example: Example,
    within: String,
}

impl TfRecordSource {
    fn new(path: &Path, reader: RecordReader, options: &Options, range: (u64, u64), within: String) -> Self {
        TfRecordSource {
            reader,
            path: path.to_path_buf(),
            record: 0,
            range,
            skip_corrupt: options.skip_corrupt,
            skipped: Arc::clone(&options.skipped),
            data: Vec::new(),
            example: Example::default(),
            within,
        }
    }

    /// The next record's offset; `None` at the end (of the file or part).
    fn next_record(&mut self) -> Result<Option<u64>, DataError> {
        loop {
            if self.record >= self.range.1 {
                return Ok(None);
            }
            let before = self.record < self.range.0;
            match self.reader.next_record(&mut self.data) {
                Ok(None) => return Ok(None),
                Ok(Some(_)) if before => self.record += 1,
                Ok(Some(offset)) => return Ok(Some(offset)),
                Err((_, fault)) if self.skip_corrupt => {
                    if !before {
                        self.skipped.fetch_add(1, Ordering::Relaxed);
                    }
                    if !fault.resumable() {
                        return Ok(None);
                    }
                    self.record += 1;
                }
                Err((offset, fault)) => {
                    return Err(DataError::Corrupt { path: self.path.clone(), offset, gzip: self.reader.gzip(), fault })
                }
            }
        }
    }
}

impl Source for TfRecordSource {
    fn within(&self) -> &str {
        &self.within
    }

    fn next_piece(&mut self, _max_rows: usize) -> Result<Option<Piece<'_>>, DataError> {
        let Some(offset) = self.next_record()? else { return Ok(None) };
        let index = self.record;
        self.record += 1;
        self.example.clear();
        self.example.merge(self.data.as_slice()).map_err(|source| DataError::NotAnExample {
            path: self.path.clone(),
            record: index,
            offset,
            source,
        })?;
        Ok(Some(Piece::Example { example: &self.example, record: index, raw: Some(Raw { bytes: &self.data, offset }) }))
    }
}
