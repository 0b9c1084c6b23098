//! NumPy `.npy` and `.npz` files, read into and written from isorun's raw
//! tensors. Written here rather than taken from a crate because isorun needs
//! the elements in TensorFlow's raw layout (no typed detour), fixed-width
//! byte strings (`|S<n>`), and a reader that checks every claim a header
//! makes against the file before it allocates anything.
//!
//! Strings are written as `|S<n>` (the longest element's length): NumPy pads
//! shorter ones with NUL bytes, so trailing NUL bytes of a string do not
//! survive the format. bfloat16 has no NumPy dtype and is written as float32.

use half::bf16;
use isorun_protocol::{DType, Tensor, TensorData};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// What one string element costs in memory besides its bytes (its vector).
const STRING_COST: u64 = std::mem::size_of::<Vec<u8>>() as u64;

/// The largest element NumPy can describe (its item sizes are C `int`s).
const MAX_ITEM_SIZE: usize = i32::MAX as usize;

/// Why an `.npy` or `.npz` file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("{path}: cannot read")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {reason}")]
    Format { path: PathBuf, reason: String },
}

fn format_error(path: &Path, reason: impl Into<String>) -> NpyError {
    NpyError::Format { path: path.to_path_buf(), reason: reason.into() }
}

/// Reads one `.npy` file.
pub fn read_npy_file(path: &Path) -> Result<Tensor, NpyError> {
    let io_error = |source| NpyError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io_error)?;
    let len = file.metadata().map_err(io_error)?.len();
    read_npy(io::BufReader::new(file), len, path)
}

/// Reads one `.npy` file whose data (at least `threshold` bytes, in a
/// byte order and dtype that need no conversion) becomes a shared region
/// without passing through this process: a view of the file itself, which
/// workers map (no copy), or where its data is not 64-byte aligned a sealed
/// copy the kernel makes. The tensor comes back as `TensorData::Shared(0)`
/// with that region, and the caller's memory does not grow with it. Other files are read as
/// [`read_npy_file`] reads them (no region).
pub fn read_npy_file_shared(
    path: &Path,
    threshold: u64,
) -> Result<(Tensor, Option<isorun_transport::SharedMemory>), NpyError> {
    let io_error = |source| NpyError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io_error)?;
    let len = file.metadata().map_err(io_error)?.len();
    let mut reader = io::BufReader::new(&file);
    let NpyHeader { element, shape, data_len } = read_npy_header(&mut reader, len, path)?;
    let data_start = io::Seek::stream_position(&mut reader).map_err(io_error)?;
    match element {
        Element::Dense(dtype, false) if dtype != DType::Bool && data_len >= threshold => {
            let region = shared_region(&file, data_start, data_len).map_err(io_error)?;
            let tensor = Tensor { dtype, shape, data: TensorData::Shared(0) };
            Ok((tensor, Some(region)))
        }
        _ => Ok((read_npy_file(path)?, None)),
    }
}

/// Reads every array of an `.npz` file, as `(key, tensor)` sorted by key.
pub fn read_npz_file(path: &Path) -> Result<Vec<(String, Tensor)>, NpyError> {
    let io_error = |source| NpyError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io_error)?;
    read_npz(io::BufReader::new(file), path)
}

/// Reads every array of an `.npz` file, as [`read_npz_file`] does, except
/// that a large array stored uncompressed (`np.savez`, not
/// `np.savez_compressed`) in a byte order and dtype that need no
/// conversion goes straight from the file into a sealed shared region, as
/// [`read_npy_file_shared`] does: its tensor is `TensorData::Shared(0)`,
/// with the region beside it.
pub fn read_npz_file_shared(
    path: &Path,
    threshold: u64,
) -> Result<Vec<(String, Tensor, Option<isorun_transport::SharedMemory>)>, NpyError> {
    let io_error = |source| NpyError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io_error)?;
    let mut archive = zip::ZipArchive::new(io::BufReader::new(&file))
        .map_err(|e| format_error(path, format!("not a valid .npz (zip) archive: {e}")))?;
    let mut arrays = Vec::new();
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(|e| format_error(path, format!("entry {i}: {e}")))?;
        let name = entry.name().to_string();
        let Some(key) = name.strip_suffix(".npy") else {
            return Err(format_error(path, format!("entry '{name}' is not an .npy array")));
        };
        let (size, entry_path) = (entry.size(), path.join(&name));
        let stored = entry.compression() == zip::CompressionMethod::Stored && entry.compressed_size() == size;
        if stored && size >= threshold {
            let data_start = entry.data_start();
            let mut counted = CountingReader { inner: &mut entry, read: 0 };
            let NpyHeader { element, shape, data_len } = read_npy_header(&mut counted, size, &entry_path)?;
            let header_len = counted.read;
            if let Element::Dense(dtype, false) = element {
                if dtype != DType::Bool && data_len >= threshold {
                    let region = shared_region(&file, data_start + header_len, data_len).map_err(io_error)?;
                    arrays.push((key.to_string(), Tensor { dtype, shape, data: TensorData::Shared(0) }, Some(region)));
                    continue;
                }
            }
            drop(entry);
            // Not one to share: read it as usual, from its start.
            let entry = archive.by_index(i).map_err(|e| format_error(path, format!("entry {i}: {e}")))?;
            arrays.push((key.to_string(), read_npy(entry, size, &entry_path)?, None));
            continue;
        }
        arrays.push((key.to_string(), read_npy(entry, size, &entry_path)?, None));
    }
    arrays.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(arrays)
}

/// The region a worker maps for `len` bytes of `file` at `offset`: the file
/// itself (no copy, its own page-cache pages) where the data starts on a
/// 64-byte boundary, as TensorFlow wants a tensor's buffer (an `.npy`
/// header is padded to one); else a sealed copy made by the kernel.
fn shared_region(file: &File, offset: u64, len: u64) -> io::Result<isorun_transport::SharedMemory> {
    if offset.is_multiple_of(64) {
        isorun_transport::SharedMemory::from_file_view(file, offset, len)
    } else {
        isorun_transport::SharedMemory::from_file(file, offset, len)
    }
}

/// Counts the bytes read through it (an `.npy` header's length in an entry).
struct CountingReader<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Reads every array of an `.npz` archive (named `path` in errors), as
/// `(key, tensor)` sorted by key.
pub fn read_npz(archive: impl Read + io::Seek, path: &Path) -> Result<Vec<(String, Tensor)>, NpyError> {
    let mut archive = zip::ZipArchive::new(archive)
        .map_err(|e| format_error(path, format!("not a valid .npz (zip) archive: {e}")))?;
    let mut arrays = Vec::new();
    for i in 0..archive.len() {
        let entry = archive.by_index(i).map_err(|e| format_error(path, format!("entry {i}: {e}")))?;
        let name = entry.name().to_string();
        let Some(key) = name.strip_suffix(".npy") else {
            return Err(format_error(path, format!("entry '{name}' is not an .npy array")));
        };
        let size = entry.size();
        let entry_path = path.join(&name);
        arrays.push((key.to_string(), read_npy(entry, size, &entry_path)?));
    }
    arrays.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(arrays)
}

/// The parsed `descr` of a header: what one element of the array is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Element {
    /// A dtype TensorFlow shares, with its byte order (true: big-endian).
    Dense(DType, bool),
    /// `|S<n>`: fixed-width bytes.
    Bytes(usize),
    /// `<U<n>`: fixed-width UTF-32 (big-endian when true).
    Unicode(usize, bool),
}

impl Element {
    /// Bytes per element in the file.
    pub fn item_size(self) -> usize {
        match self {
            Element::Dense(d, _) => d.element_size().expect("dense"),
            Element::Bytes(n) => n,
            Element::Unicode(n, _) => n * 4,
        }
    }
}

fn parse_descr(descr: &str) -> Result<Element, String> {
    let (order, rest) = match descr.as_bytes().first() {
        Some(b'<' | b'|' | b'=') => (false, &descr[1..]),
        Some(b'>') => (true, &descr[1..]),
        _ => (false, descr),
    };
    // The header is text from the file: its first character may be wider than a byte.
    let (kind, size) = rest.split_at(rest.chars().next().map_or(0, char::len_utf8));
    if kind == "O" {
        return Err(
            "object arrays (pickles) are not supported; save strings as bytes, e.g. np.array(..., dtype='S')".into()
        );
    }
    let size: usize = size.parse().map_err(|_| format!("unsupported dtype '{descr}'"))?;
    let dense = |d: DType| Ok(Element::Dense(d, order));
    match (kind, size) {
        ("f", 2) => dense(DType::Float16),
        ("f", 4) => dense(DType::Float32),
        ("f", 8) => dense(DType::Float64),
        ("i", 1) => dense(DType::Int8),
        ("i", 2) => dense(DType::Int16),
        ("i", 4) => dense(DType::Int32),
        ("i", 8) => dense(DType::Int64),
        ("u", 1) => dense(DType::UInt8),
        ("u", 2) => dense(DType::UInt16),
        ("u", 4) => dense(DType::UInt32),
        ("u", 8) => dense(DType::UInt64),
        ("b", 1) => dense(DType::Bool),
        // NumPy's item sizes fit an i32.
        ("S", n) if n <= MAX_ITEM_SIZE => Ok(Element::Bytes(n)),
        ("U", n) if n <= MAX_ITEM_SIZE / 4 => Ok(Element::Unicode(n, order)),
        ("O", _) => {
            Err("object arrays (pickles) are not supported; save strings as bytes, e.g. np.array(..., dtype='S')"
                .into())
        }
        _ => Err(format!("unsupported dtype '{descr}'")),
    }
}

/// The three keys of an `.npy` header dictionary.
fn parse_header(header: &str) -> Result<(String, bool, Vec<u64>), String> {
    let value_after = |key: &str| -> Result<&str, String> {
        let at = header.find(&format!("'{key}'")).ok_or_else(|| format!("header has no '{key}'"))?;
        let rest = &header[at + key.len() + 2..];
        let colon = rest.find(':').ok_or_else(|| format!("header '{key}' has no value"))?;
        Ok(rest[colon + 1..].trim_start())
    };
    let descr_text = value_after("descr")?;
    let descr = descr_text
        .strip_prefix('\'')
        .and_then(|s| s.split_once('\''))
        .map(|(d, _)| d.to_string())
        .ok_or_else(|| "structured dtypes are not supported (header 'descr' is not a string)".to_string())?;
    let fortran = value_after("fortran_order")?.starts_with("True");
    let shape_text = value_after("shape")?;
    let inner = shape_text
        .strip_prefix('(')
        .and_then(|s| s.split_once(')'))
        .map(|(s, _)| s)
        .ok_or_else(|| "header 'shape' is not a tuple".to_string())?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_end_matches('L').parse::<u64>().map_err(|_| format!("header 'shape' has a bad dimension '{s}'"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((descr, fortran, shape))
}

/// What an `.npy` header says, checked against the stream's length: for
/// readers that stream the data that follows themselves (row by row).
#[derive(Debug, Clone, PartialEq)]
pub struct NpyHeader {
    pub element: Element,
    pub shape: Vec<u64>,
    /// Bytes of data after the header (elements × item size), no more than the stream holds.
    pub data_len: u64,
}

/// Reads an `.npy` header from a stream of `total_len` bytes, leaving the
/// reader at the first data byte.
pub fn read_npy_header(mut reader: impl Read, total_len: u64, path: &Path) -> Result<NpyHeader, NpyError> {
    let io_error = |source| NpyError::Io { path: path.to_path_buf(), source };
    let mut prefix = [0u8; 10];
    reader.read_exact(&mut prefix).map_err(|_| format_error(path, "not an .npy file (too short)"))?;
    if &prefix[..6] != MAGIC {
        return Err(format_error(path, "not an .npy file (wrong magic number)"));
    }
    let (header_len, header_start) = match prefix[6] {
        1 => (u64::from(u16::from_le_bytes([prefix[8], prefix[9]])), 10u64),
        2 | 3 => {
            let mut more = [0u8; 2];
            reader.read_exact(&mut more).map_err(|_| format_error(path, "truncated header"))?;
            (u64::from(u32::from_le_bytes([prefix[8], prefix[9], more[0], more[1]])), 12u64)
        }
        v => return Err(format_error(path, format!("unsupported .npy format version {v}"))),
    };
    if header_start + header_len > total_len {
        return Err(format_error(
            path,
            format!("header claims {header_len} bytes but the file is {total_len} bytes long"),
        ));
    }
    // Read, not allocated up front: in an `.npz` the length a zip entry
    // claims is all `total_len` knows, and it may lie.
    let mut header = Vec::with_capacity(header_len.min(1 << 16) as usize);
    reader.by_ref().take(header_len).read_to_end(&mut header).map_err(io_error)?;
    if (header.len() as u64) < header_len {
        return Err(format_error(path, "truncated header"));
    }
    let header = String::from_utf8_lossy(&header);
    let (descr, fortran, shape) = parse_header(&header).map_err(|r| format_error(path, r))?;
    let element = parse_descr(&descr).map_err(|r| format_error(path, r))?;
    let count = Tensor::element_count(&shape)
        .ok_or_else(|| format_error(path, format!("shape {shape:?} has too many elements")))?;
    if element.item_size() == 0 && count > 0 {
        // NumPy itself writes `|S1` for empty strings; a zero width would let
        // a few bytes of header claim any number of elements.
        return Err(format_error(path, format!("zero-width dtype '{descr}' is not supported")));
    }
    if fortran && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(format_error(path, "Fortran-ordered arrays are not supported; save with np.ascontiguousarray"));
    }
    let data_len = count.checked_mul(element.item_size() as u64).filter(|&n| n <= total_len);
    let available = total_len - header_start - header_len;
    let data_len = match data_len {
        Some(n) if n <= available => n,
        _ => {
            return Err(format_error(
                path,
                format!(
                    "header claims shape {shape:?} of {descr} ({} bytes) but the file holds {available} bytes of data",
                    count.saturating_mul(element.item_size() as u64)
                ),
            ))
        }
    };
    Ok(NpyHeader { element, shape, data_len })
}

/// Reads an `.npy` stream of `total_len` bytes.
pub fn read_npy(mut reader: impl Read, total_len: u64, path: &Path) -> Result<Tensor, NpyError> {
    let io_error = |source| NpyError::Io { path: path.to_path_buf(), source };
    let NpyHeader { element, shape, data_len } = read_npy_header(&mut reader, total_len, path)?;
    let count = Tensor::element_count(&shape).expect("checked by read_npy_header");
    // Grows with the bytes that arrive (an `.npz` entry's claimed size may lie).
    let mut data = Vec::with_capacity(data_len.min(1 << 20) as usize);
    reader.take(data_len).read_to_end(&mut data).map_err(io_error)?;
    if (data.len() as u64) < data_len {
        return Err(format_error(path, "file ended before its data"));
    }
    if let Element::Bytes(_) | Element::Unicode(..) = element {
        // A string costs its vector besides its bytes: `|S1` would take 25
        // times the file, past the bound every reader is held to (the data
        // is all read: a claimed length may lie).
        let held = count.saturating_mul(STRING_COST + 2 * element.item_size() as u64);
        let most = (data.len() as u64).saturating_mul(16).max(64 << 20);
        if held > most {
            return Err(format_error(
                path,
                format!(
                    "{count} strings of {} bytes would take {held} bytes in memory, more than the {most} \
                     read from {} bytes of data; save them with a wider dtype or as uint8",
                    element.item_size(),
                    data.len()
                ),
            ));
        }
    }
    Ok(match element {
        Element::Dense(dtype, big_endian) => {
            if big_endian {
                let size = dtype.element_size().expect("dense");
                data.chunks_exact_mut(size).for_each(<[u8]>::reverse);
            }
            if dtype == DType::Bool {
                data.iter_mut().for_each(|b| *b = u8::from(*b != 0));
            }
            Tensor::dense(dtype, shape, data)
        }
        Element::Bytes(n) => {
            let strings = if n == 0 {
                vec![Vec::new(); count as usize]
            } else {
                data.chunks_exact(n).map(|c| trim_nuls(c).to_vec()).collect()
            };
            Tensor::strings(shape, strings)
        }
        Element::Unicode(n, big_endian) => {
            let mut strings = Vec::with_capacity(count as usize);
            for chunk in data.chunks_exact((n * 4).max(1)).take(count as usize) {
                let mut s = String::new();
                for unit in chunk.chunks_exact(4) {
                    let raw = [unit[0], unit[1], unit[2], unit[3]];
                    let code = if big_endian { u32::from_be_bytes(raw) } else { u32::from_le_bytes(raw) };
                    let c = char::from_u32(code)
                        .ok_or_else(|| format_error(path, format!("invalid unicode code point {code:#x}")))?;
                    s.push(c);
                }
                strings.push(s.trim_end_matches('\0').as_bytes().to_vec());
            }
            if n == 0 {
                strings = vec![Vec::new(); count as usize];
            }
            Tensor::strings(shape, strings)
        }
    })
}

fn trim_nuls(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    &bytes[..end]
}

/// The most padding a fixed-width string `.npy` (`|S<width>`, every string
/// padded to the longest) may add beyond the strings' own bytes: past it,
/// one long string among millions of short ones would cost the supervisor
/// (and the disk) width × count bytes.
pub const MAX_STRING_PADDING: u64 = 256 << 20;

/// Whether `write_npy` can write the tensor: a string tensor must not need
/// more than [`MAX_STRING_PADDING`] bytes of padding. Checked for every
/// output before any is written, so a unit's outputs are written whole or
/// not at all.
pub fn check_writable(tensor: &Tensor) -> io::Result<()> {
    let TensorData::Strings(strings) = &tensor.data else { return Ok(()) };
    let width = strings.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
    let own: u64 = strings.iter().map(|s| s.len() as u64).sum();
    let padded = (width as u64).saturating_mul(strings.len() as u64);
    if padded.saturating_sub(own) > MAX_STRING_PADDING {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} strings of up to {width} bytes ({own} bytes in all) would take {padded} bytes as a fixed-width \
                 .npy (|S{width}), more than {MAX_STRING_PADDING} bytes of padding",
                strings.len()
            ),
        ));
    }
    Ok(())
}

/// `descr` and raw bytes for writing a tensor (bfloat16 widened to float32).
pub(crate) fn npy_body(tensor: &Tensor) -> io::Result<(String, Vec<u8>)> {
    Ok(match (&tensor.data, tensor.dtype) {
        (TensorData::Strings(strings), _) => {
            let width = strings.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
            check_writable(tensor)?;
            let mut data = Vec::with_capacity(width * strings.len());
            for s in strings {
                data.extend_from_slice(s);
                data.resize(data.len() + width - s.len(), 0);
            }
            (format!("|S{width}"), data)
        }
        (TensorData::Dense(bytes), DType::BFloat16) => {
            let data =
                bytes.chunks_exact(2).flat_map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32().to_le_bytes()).collect();
            ("<f4".into(), data)
        }
        (TensorData::Dense(bytes), dtype) => {
            let descr = match dtype {
                DType::Float16 => "<f2",
                DType::Float32 => "<f4",
                DType::Float64 => "<f8",
                DType::Int8 => "|i1",
                DType::Int16 => "<i2",
                DType::Int32 => "<i4",
                DType::Int64 => "<i8",
                DType::UInt8 => "|u1",
                DType::UInt16 => "<u2",
                DType::UInt32 => "<u4",
                DType::UInt64 => "<u8",
                DType::Bool => "|b1",
                DType::BFloat16 | DType::String => unreachable!("handled above"),
            };
            (descr.into(), bytes.to_vec())
        }
        (TensorData::Shared(_), _) => unreachable!("outputs are never in shared memory"),
    })
}

/// A version 1.0 `.npy` header (magic to newline) for `descr` and `shape`,
/// padded with spaces to at least `min_len` bytes (then to a multiple of
/// 64): rewriting a header in place with another first dimension keeps the
/// data where it is. `None` when it does not fit version 1.0.
pub(crate) fn header_v1(descr: &str, shape: &[u64], min_len: usize) -> Option<Vec<u8>> {
    let shape = match shape {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        dims => format!("({})", dims.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let total = (10 + header.len() + 1).max(min_len).div_ceil(64) * 64;
    if total - 10 > u16::MAX as usize {
        return None;
    }
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&[1, 0]);
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    Some(bytes)
}

/// Writes a tensor in `.npy` format (version 1.0, or 2.0 for a huge header).
pub fn write_npy(mut writer: impl Write, tensor: &Tensor) -> io::Result<()> {
    let (descr, data) = npy_body(tensor)?;
    let shape = match tensor.shape.as_slice() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        dims => format!("({})", dims.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let prefix_len = if header.len() + 11 <= u16::MAX as usize { 10 } else { 12 };
    let padded = (prefix_len + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(padded - prefix_len - header.len() - 1));
    header.push('\n');
    writer.write_all(MAGIC)?;
    if prefix_len == 10 {
        writer.write_all(&[1, 0])?;
        writer.write_all(&(header.len() as u16).to_le_bytes())?;
    } else {
        writer.write_all(&[2, 0])?;
        writer.write_all(&(header.len() as u32).to_le_bytes())?;
    }
    writer.write_all(header.as_bytes())?;
    writer.write_all(&data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(tensor: &Tensor) -> Tensor {
        let mut bytes = Vec::new();
        write_npy(&mut bytes, tensor).unwrap();
        assert_eq!(bytes.len() % 64, (tensor_bytes(tensor)) % 64, "header is padded to 64 bytes");
        read_npy(bytes.as_slice(), bytes.len() as u64, Path::new("t.npy")).unwrap()
    }

    fn tensor_bytes(tensor: &Tensor) -> usize {
        npy_body(tensor).unwrap().1.len()
    }

    #[test]
    fn large_stored_npz_and_npy_arrays_go_straight_to_shared_memory_with_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let big = Tensor::dense(
            DType::Float32,
            vec![50_000],
            (0..50_000u32).flat_map(|i| (i as f32).to_le_bytes()).collect(),
        );
        let flags = Tensor::dense(DType::Bool, vec![100_000], vec![1; 100_000]);
        let small = Tensor::dense(DType::Int32, vec![2], vec![1, 0, 0, 0, 2, 0, 0, 0]);
        let npz = dir.path().join("inputs.npz");
        for method in [zip::CompressionMethod::Stored, zip::CompressionMethod::Deflated] {
            let mut writer = zip::ZipWriter::new(File::create(&npz).unwrap());
            let options = zip::write::SimpleFileOptions::default().compression_method(method);
            for (name, tensor) in [("big", &big), ("flags", &flags), ("small", &small)] {
                writer.start_file(format!("{name}.npy"), options).unwrap();
                write_npy(&mut writer, tensor).unwrap();
            }
            writer.finish().unwrap();
            let plain = read_npz_file(&npz).unwrap();
            let shared = read_npz_file_shared(&npz, 65_536).unwrap();
            assert_eq!(shared.len(), 3);
            for ((name, dense), (shared_name, tensor, region)) in plain.iter().zip(&shared) {
                assert_eq!(name, shared_name);
                match (name.as_str(), method, region) {
                    // Only a large, stored, conversion-free array is shared.
                    ("big", zip::CompressionMethod::Stored, Some(region)) => {
                        assert_eq!(tensor.data, TensorData::Shared(0));
                        assert_eq!((tensor.dtype, &tensor.shape), (dense.dtype, &dense.shape));
                        let TensorData::Dense(bytes) = &dense.data else { panic!() };
                        assert_eq!(&region[..], &bytes[..]);
                    }
                    (_, _, None) => assert_eq!(tensor, dense, "{name} ({method:?}) is read as usual"),
                    other => panic!("{name} ({method:?}): unexpected {:?}", other.2),
                }
            }
        }
        let npy = dir.path().join("big.npy");
        write_npy(File::create(&npy).unwrap(), &big).unwrap();
        let (tensor, region) = read_npy_file_shared(&npy, 65_536).unwrap();
        let TensorData::Dense(bytes) = &big.data else { panic!() };
        assert_eq!(&region.expect("shared")[..], &bytes[..]);
        assert_eq!(tensor.shape, big.shape);
    }

    #[test]
    fn strings_that_would_pad_to_gigabytes_are_refused() {
        // One 10 KB string among 3,000,000 empty ones: |S10000 would be 30 GB.
        let mut strings = vec![Vec::new(); 3_000_000];
        strings[0] = vec![b'x'; 10_000];
        let t = Tensor::strings(vec![3_000_000], strings);
        let error = write_npy(&mut Vec::new(), &t).unwrap_err().to_string();
        assert!(error.contains("3000000 strings of up to 10000 bytes"), "{error}");
        // Many strings of similar length are fine.
        let t = Tensor::strings(vec![1000], vec![vec![b'y'; 100]; 1000]);
        assert_eq!(round_trip(&t), t);
    }

    #[test]
    fn dense_and_string_tensors_round_trip() {
        let t = Tensor::dense(DType::Int64, vec![2, 2], (0..32).collect());
        assert_eq!(round_trip(&t), t);
        let scalar = Tensor::dense(DType::Float32, vec![], 1.5f32.to_le_bytes().to_vec());
        assert_eq!(round_trip(&scalar), scalar);
        let s = Tensor::strings(vec![3], vec![b"ab".to_vec(), b"\xff\xfe".to_vec(), Vec::new()]);
        assert_eq!(round_trip(&s), s);
    }

    #[test]
    fn bfloat16_is_written_as_float32() {
        let t = Tensor::dense(DType::BFloat16, vec![1], bf16::from_f32(1.5).to_le_bytes().to_vec());
        let back = round_trip(&t);
        assert_eq!(back.dtype, DType::Float32);
        assert_eq!(back.data, TensorData::Dense(1.5f32.to_le_bytes().to_vec().into()));
    }

    fn npy_with(header: &str, data: &[u8]) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(data);
        bytes
    }

    fn read_err(bytes: &[u8]) -> String {
        read_npy(bytes, bytes.len() as u64, Path::new("bad.npy")).unwrap_err().to_string()
    }

    #[test]
    fn big_endian_and_unicode_are_converted() {
        let bytes = npy_with("{'descr': '>i4', 'fortran_order': False, 'shape': (1,), }\n", &[0, 0, 1, 2]);
        let t = read_npy(bytes.as_slice(), bytes.len() as u64, Path::new("b.npy")).unwrap();
        assert_eq!(t.data, TensorData::Dense(vec![2, 1, 0, 0].into()));
        let bytes =
            npy_with("{'descr': '<U2', 'fortran_order': False, 'shape': (1,), }\n", &[0xe9, 0, 0, 0, 0, 0, 0, 0]);
        let t = read_npy(bytes.as_slice(), bytes.len() as u64, Path::new("u.npy")).unwrap();
        assert_eq!(t, Tensor::strings(vec![1], vec!["é".as_bytes().to_vec()]));
    }

    #[test]
    fn bad_files_are_named_with_the_reason() {
        assert_eq!(read_err(b"PK\x03\x04 not npy"), "bad.npy: not an .npy file (wrong magic number)");
        assert_eq!(read_err(b"\x93NUM"), "bad.npy: not an .npy file (too short)");
        let claims_more = npy_with("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }\n", &[0; 8]);
        assert_eq!(
            read_err(&claims_more),
            "bad.npy: header claims shape [1000000000000] of <f4 (4000000000000 bytes) but the file holds 8 bytes of data"
        );
        let object = npy_with("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }\n", &[0; 8]);
        assert!(read_err(&object).contains("object arrays (pickles) are not supported"));
        let mut long_header = MAGIC.to_vec();
        long_header.extend_from_slice(&[1, 0, 0xff, 0xff]);
        assert!(read_err(&long_header).contains("header claims 65535 bytes"));
        let structured = npy_with("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }\n", &[0; 4]);
        assert!(read_err(&structured).contains("structured dtypes are not supported"));
    }

    #[test]
    fn headers_that_would_panic_or_allocate_without_limit_are_errors() {
        // A zero width lets a few bytes claim 2^62 empty strings.
        for descr in ["|S0", "<U0"] {
            let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (4611686018427387904,), }}\n");
            assert!(read_err(&npy_with(&header, &[])).contains("zero-width dtype"), "{descr}");
        }
        let empty = npy_with("{'descr': '|S0', 'fortran_order': False, 'shape': (0,), }\n", &[]);
        assert_eq!(read_npy(empty.as_slice(), empty.len() as u64, Path::new("e.npy")).unwrap().shape, [0]);
        // A width whose size in bytes overflows.
        let wide = npy_with("{'descr': '<U4611686018427387904', 'fortran_order': False, 'shape': (0,), }\n", &[]);
        assert!(read_err(&wide).contains("unsupported dtype"));
        // A descr starting with a character wider than one byte.
        let accent = npy_with("{'descr': '\u{e9}4', 'fortran_order': False, 'shape': (1,), }\n", &[0; 4]);
        assert!(read_err(&accent).contains("unsupported dtype"));
        // Huge shapes: counted without overflow, refused before any allocation.
        let huge =
            npy_with("{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }\n", &[]);
        assert!(read_err(&huge).contains("too many elements"));
    }

    #[test]
    fn a_stream_shorter_than_its_claimed_length_allocates_by_what_arrives() {
        // In an .npz, the length comes from the zip entry and may lie: a
        // header claiming 4 GiB, and data claiming 1 TiB, of a 100-byte stream.
        let mut long_header = MAGIC.to_vec();
        long_header.extend_from_slice(&[2, 0, 0xff, 0xff, 0xff, 0xff]);
        let r = read_npy(long_header.as_slice(), 1 << 40, Path::new("lie.npy"));
        assert!(r.unwrap_err().to_string().contains("truncated header"));
        let bytes = npy_with("{'descr': '<f4', 'fortran_order': False, 'shape': (68719476736,), }\n", &[0; 8]);
        let r = read_npy(bytes.as_slice(), 1 << 40, Path::new("lie.npy"));
        assert!(r.unwrap_err().to_string().contains("file ended before its data"));
    }
}
