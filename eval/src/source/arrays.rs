//! `.npz` files and folders of `.npy` files as shards of examples, read a
//! range of rows at a time.
//!
//! Every array of a shard is one column: its first axis is the examples, and
//! all arrays of a shard must agree on it (an error names both). Nothing is
//! read whole: each array gets its own reader positioned at its data (its
//! own file in a folder; for an `.npz`, its own file handle seeked to the zip
//! entry's data, decompressed as a stream when the entry is deflated), and a
//! batch reads `rows × row bytes` from each into a reused buffer that grows
//! as the bytes arrive. The zip archive is only used to list the entries;
//! their CRCs are not checked (the `.npy` header and lengths are). A zip's
//! sizes are claims, checked before they are used: an entry's data must lie
//! within the file, a stored entry's sizes agree, and a deflated entry may
//! not claim more than deflate can expand (1032:1). Headers are parsed by
//! `isorun_tensors::npy::read_npy_header`, with the same checks as a whole
//! read (its data must fit in what the entry claims).
//!
//! As a source, columnar: each piece is every asked-for array's bytes for
//! the same rows. Parts: part `K` of `N` is the rows `[K*n/N, (K+1)*n/N)`
//! of the shard's `n` (the rows before it are read and dropped: a deflated
//! entry cannot be entered midway).

use super::{ColumnChunk, ColumnInfo, Compression, Look, Options, Piece, Source, Values};
use crate::error::DataError;
use isorun_tensors::npy::{read_npy_header, Element, NpyError, NpyHeader};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Buffer of each array's reader.
const ARRAY_BUFFER: usize = 64 << 10;

/// The most deflate can expand: 1032 bytes out per byte in (zlib's
/// documented limit: a 258-byte match costs at least two bits). A deflated
/// entry claiming more than this times its compressed size (plus a little,
/// for tiny streams) lies about its size.
const MAX_DEFLATE_RATIO: u64 = 1032;

/// One array of a shard, as its header describes it.
#[derive(Debug, Clone)]
pub struct ArrayInfo {
    pub name: String,
    pub element: Element,
    pub shape: Vec<u64>,
    /// Where it is, for errors: `shard.npz/NAME.npy` or `folder/NAME.npy`.
    pub path: PathBuf,
    location: Location,
}

impl ArrayInfo {
    /// Elements per example (the product of the dimensions after the first).
    pub fn row_elements(&self) -> u64 {
        self.shape[1..].iter().product()
    }

    /// A short description for messages: `int64 [100, 3]`.
    pub fn describe(&self) -> String {
        let kind = match self.element {
            Element::Dense(d, _) => d.name().to_string(),
            Element::Bytes(n) => format!("bytes{n}"),
            Element::Unicode(n, _) => format!("unicode{n}"),
        };
        format!("{kind} {:?}", self.shape)
    }
}

#[derive(Debug, Clone)]
enum Location {
    File,
    Zip { data_start: u64, compressed: u64, size: u64, deflated: bool },
}

/// A shard: its arrays and its number of examples.
#[derive(Debug, Clone)]
pub struct Shard {
    pub path: PathBuf,
    pub rows: u64,
    pub arrays: Vec<ArrayInfo>,
}

fn npy_error(e: NpyError) -> DataError {
    match e {
        NpyError::Io { path, source } => DataError::Io { path, source },
        NpyError::Format { path, reason } => DataError::Array { path, reason },
    }
}

/// Reads the headers of every array of a shard and checks their first axes agree.
pub fn open_shard(path: &Path, npz: bool) -> Result<Shard, DataError> {
    let io = |source| DataError::Io { path: path.to_path_buf(), source };
    let mut arrays = Vec::new();
    if npz {
        let file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(|e| DataError::Array {
            path: path.to_path_buf(),
            reason: format!("not a valid .npz (zip) archive: {e}"),
        })?;
        for i in 0..archive.len() {
            let entry = archive
                .by_index_raw(i)
                .map_err(|e| DataError::Array { path: path.to_path_buf(), reason: format!("entry {i}: {e}") })?;
            let name = entry.name().to_string();
            let Some(key) = name.strip_suffix(".npy") else {
                return Err(DataError::Array {
                    path: path.to_path_buf(),
                    reason: format!("entry '{name}' is not an .npy array"),
                });
            };
            let deflated = match entry.compression() {
                zip::CompressionMethod::Stored => false,
                zip::CompressionMethod::Deflated => true,
                other => {
                    return Err(DataError::Array {
                        path: path.to_path_buf(),
                        reason: format!("entry '{name}' uses compression {other}; only stored and deflated are read"),
                    })
                }
            };
            let (data_start, compressed, size) = (entry.data_start(), entry.compressed_size(), entry.size());
            let claim = |reason: String| DataError::Array { path: path.join(&name), reason };
            // A zip's sizes are claims: checked against the file (and what
            // deflate can do) before anything is read or allocated by them.
            if data_start.checked_add(compressed).is_none_or(|end| end > file_len) {
                return Err(claim(format!(
                    "the zip entry claims {compressed} bytes of data from byte offset {data_start}, but the file is \
                     {file_len} bytes long"
                )));
            }
            if !deflated && size != compressed {
                return Err(claim(format!(
                    "the stored zip entry claims {size} bytes but holds {compressed} bytes (a stored entry's sizes \
                     are equal)"
                )));
            }
            let most = compressed.saturating_mul(MAX_DEFLATE_RATIO).saturating_add(1 << 10);
            if deflated && size > most {
                return Err(claim(format!(
                    "the deflated zip entry claims {size} bytes from {compressed} compressed bytes, more than \
                     deflate can expand ({most} at most)"
                )));
            }
            let location = Location::Zip { data_start, compressed, size, deflated };
            arrays.push((key.to_string(), path.join(&name), location));
        }
    } else {
        for entry in std::fs::read_dir(path).map_err(io)? {
            let entry = entry.map_err(io)?.path();
            if entry.is_file() && entry.extension().is_some_and(|e| e == "npy") {
                let key = entry.file_stem().expect("has a name").to_string_lossy().into_owned();
                arrays.push((key, entry, Location::File));
            }
        }
    }
    arrays.sort_by(|a, b| a.0.cmp(&b.0));
    let mut infos: Vec<ArrayInfo> = Vec::with_capacity(arrays.len());
    for (name, array_path, location) in arrays {
        let (header, _) = open_array(path, &array_path, &location)?;
        if header.shape.is_empty() {
            return Err(DataError::Array {
                path: array_path,
                reason: "a 0-d array has no examples axis; arrays must be [examples, ...]".into(),
            });
        }
        // The file's size bounds the whole array, not a row: with no rows,
        // `[0, 2^32, 2^32]` is a valid header whose rows no u64 can count.
        let row_bytes = isorun_protocol::Tensor::element_count(&header.shape[1..])
            .and_then(|n| n.checked_mul(header.element.item_size() as u64));
        if row_bytes.is_none() {
            return Err(DataError::Array {
                path: array_path,
                reason: format!(
                    "shape {:?}: one example (the dimensions after the first) has too many elements to count",
                    header.shape
                ),
            });
        }
        if let Some(first) = infos.first() {
            if first.shape[0] != header.shape[0] {
                return Err(DataError::RowMismatch {
                    path: array_path,
                    rows: header.shape[0],
                    other: first.path.clone(),
                    other_rows: first.shape[0],
                });
            }
        }
        infos.push(ArrayInfo { name, element: header.element, shape: header.shape, path: array_path, location });
    }
    if infos.is_empty() {
        return Err(DataError::Array { path: path.to_path_buf(), reason: "holds no arrays".into() });
    }
    Ok(Shard { path: path.to_path_buf(), rows: infos[0].shape[0], arrays: infos })
}

/// Opens an array's reader at its data; its header.
fn open_array(
    shard: &Path,
    array_path: &Path,
    location: &Location,
) -> Result<(NpyHeader, Box<dyn Read + Send>), DataError> {
    let (file_path, start, len, deflated) = match location {
        Location::File => (array_path, 0, None, false),
        Location::Zip { data_start, compressed, size, deflated } => {
            (shard, *data_start, Some((*compressed, *size)), *deflated)
        }
    };
    let io = |source| DataError::Io { path: file_path.to_path_buf(), source };
    let mut file = File::open(file_path).map_err(io)?;
    let (mut reader, total): (Box<dyn Read + Send>, u64) = match len {
        None => {
            let size = file.metadata().map_err(io)?.len();
            (Box::new(BufReader::with_capacity(ARRAY_BUFFER, file)), size)
        }
        Some((compressed, size)) => {
            file.seek(SeekFrom::Start(start)).map_err(io)?;
            let raw = BufReader::with_capacity(ARRAY_BUFFER, file).take(compressed);
            if deflated {
                // No more than the entry claims, whatever the stream inflates to.
                let inflated = flate2::read::DeflateDecoder::new(raw).take(size);
                (Box::new(BufReader::with_capacity(ARRAY_BUFFER, inflated)), size)
            } else {
                (Box::new(raw), size)
            }
        }
    };
    let header = read_npy_header(&mut reader, total, array_path).map_err(npy_error)?;
    Ok((header, reader))
}

/// One array read a range of rows at a time.
pub struct ArrayStream {
    pub info: ArrayInfo,
    reader: Box<dyn Read + Send>,
    row_bytes: usize,
    scratch: Vec<u8>,
}

impl ArrayStream {
    /// Opens the array `info` of `shard`.
    pub fn open(shard: &Shard, info: &ArrayInfo) -> Result<ArrayStream, DataError> {
        let (_, reader) = open_array(&shard.path, &info.path, &info.location)?;
        let row_bytes = (info.row_elements() as usize).saturating_mul(info.element.item_size());
        Ok(ArrayStream { info: info.clone(), reader, row_bytes, scratch: Vec::new() })
    }

    /// Bytes of one row (elements per example × item size).
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The bytes of the next `rows` rows (reusing one buffer). The buffer
    /// grows with the bytes that arrive, never by what the header claims:
    /// an entry that ends early costs what it held.
    pub fn read_rows(&mut self, rows: usize) -> Result<&[u8], DataError> {
        let len = rows.saturating_mul(self.row_bytes) as u64;
        self.scratch.clear();
        let got = (&mut self.reader).take(len).read_to_end(&mut self.scratch).map_err(|e| DataError::Array {
            path: self.info.path.clone(),
            reason: format!("cannot read its data ({e})"),
        })?;
        if (got as u64) < len {
            return Err(DataError::Array {
                path: self.info.path.clone(),
                reason: format!("ended before its data: {rows} rows are {len} bytes, only {got} were there"),
            });
        }
        Ok(&self.scratch)
    }
}

impl ArrayInfo {
    fn column(&self) -> ColumnInfo {
        ColumnInfo {
            name: self.name.clone(),
            path: self.path.clone(),
            element: self.element,
            dims: self.shape[1..].to_vec(),
            describe: self.describe(),
        }
    }
}

/// The most bytes read at once while skipping the rows before a part.
const SKIP_BYTES: usize = 16 << 20;

pub(crate) fn probe_folder(path: &Path, _compression: Compression) -> Result<(), DataError> {
    std::fs::read_dir(path).map(drop).map_err(super::io_error(path))
}

pub(crate) fn peek_npz(path: &Path, _compression: Compression, _options: &Options) -> Result<Option<Look>, DataError> {
    peek(path, true)
}

pub(crate) fn peek_folder(
    path: &Path,
    _compression: Compression,
    _options: &Options,
) -> Result<Option<Look>, DataError> {
    peek(path, false)
}

fn peek(path: &Path, npz: bool) -> Result<Option<Look>, DataError> {
    let shard = open_shard(path, npz)?;
    Ok(Some(Look::Columns(shard.arrays.iter().map(ArrayInfo::column).collect())))
}

pub(crate) fn open_npz(
    path: &Path,
    _compression: Compression,
    options: &Options,
) -> Result<Box<dyn Source>, DataError> {
    open(path, true, options)
}

pub(crate) fn open_folder(
    path: &Path,
    _compression: Compression,
    options: &Options,
) -> Result<Box<dyn Source>, DataError> {
    open(path, false, options)
}

fn open(path: &Path, npz: bool, options: &Options) -> Result<Box<dyn Source>, DataError> {
    let shard = open_shard(path, npz)?;
    let find = |name: &str| -> Result<&ArrayInfo, DataError> {
        shard.arrays.iter().find(|a| a.name == name).ok_or_else(|| DataError::MissingInput {
            path: path.to_path_buf(),
            input: name.to_string(),
            feature: name.to_string(),
            available: shard.arrays.iter().map(|a| a.name.clone()).collect::<Vec<_>>().join(", "),
        })
    };
    let mut columns = Vec::new();
    let mut streams = Vec::new();
    for name in &options.columns {
        let info = find(name)?;
        columns.push(info.column());
        streams.push(ArrayStream::open(&shard, info)?);
    }
    let (lo, hi) = options.part.rows(shard.rows);
    Ok(Box::new(ArraySource { columns, streams, skip: lo, remaining: hi - lo }))
}

/// One shard's asked-for arrays, read a range of rows at a time.
struct ArraySource {
    columns: Vec<ColumnInfo>,
    streams: Vec<ArrayStream>,
    /// Rows still to be skipped before this part's.
    skip: u64,
    remaining: u64,
}

impl Source for ArraySource {
    fn columns(&self) -> &[ColumnInfo] {
        &self.columns
    }

    fn next_piece(&mut self, max_rows: usize) -> Result<Option<Piece<'_>>, DataError> {
        while self.skip > 0 {
            let widest = self.streams.iter().map(ArrayStream::row_bytes).max().unwrap_or(1).max(1);
            let rows = self.skip.min((SKIP_BYTES / widest).max(1) as u64);
            for stream in &mut self.streams {
                stream.read_rows(rows as usize)?;
            }
            self.skip -= rows;
        }
        let take = self.remaining.min(max_rows as u64) as usize;
        if take == 0 {
            return Ok(None);
        }
        self.remaining -= take as u64;
        let mut chunks = Vec::with_capacity(self.streams.len());
        for (stream, info) in self.streams.iter_mut().zip(&self.columns) {
            let bytes = stream.read_rows(take)?.to_vec();
            chunks.push(ColumnChunk {
                path: info.path.clone(),
                dims: info.dims.clone(),
                values: Values::Elements { element: info.element, bytes },
            });
        }
        Ok(Some(Piece::Columns { rows: take, columns: chunks }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seen reading `row_elements` while writing the `eval_npy` fuzz target,
    /// which panics on it: no rows, so the file's size bounds nothing, and a
    /// row of 2^64 elements overflowed counting it (a panic with overflow
    /// checks; without them, a row of 0 elements).
    #[test]
    fn a_row_too_large_to_count_is_an_error() {
        let mut npy =
            b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4294967296, 4294967296), }"
                .to_vec();
        npy.resize(127, b' ');
        npy.push(b'\n');
        assert_eq!(npy, include_bytes!("../../tests/fixtures/fuzz/zero_rows_huge_row.npy"));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("label.npy"), &npy).unwrap();
        let error = open_shard(dir.path(), false).unwrap_err().to_string();
        assert!(error.contains("label.npy: shape [0, 4294967296, 4294967296]: one example"), "{error}");
    }
}
