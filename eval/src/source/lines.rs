//! Lines of a text format (CSV, JSON Lines), read with a cap: a line is
//! untrusted input, and a reader that reads "up to the next newline" reads
//! a file without one whole. One reader for both formats, so that the cap,
//! and what is held while finding that a line passes it, are decided once.

use std::io::BufRead;

/// The longest line read (without its line end).
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// The longest line read from a compressed file, whatever its size (see
/// [`compressed_line_cap`]).
pub const MIN_COMPRESSED_LINE_BYTES: usize = 8 << 20;

/// The longest line read from a compressed file of `compressed_len` bytes:
/// twice its compressed bytes, at least [`MIN_COMPRESSED_LINE_BYTES`], at
/// most [`MAX_LINE_BYTES`]. A plain file's line is at most its file, so the
/// reader's bound (max(64 MiB, 16 × the file)) holds at [`MAX_LINE_BYTES`];
/// a few KB of gzip can decompress to a 60 MiB line, which then costs a
/// few times that in the supervisor (the line, the values it makes).
pub fn compressed_line_cap(compressed_len: u64) -> usize {
    let twice = usize::try_from(compressed_len.saturating_mul(2)).unwrap_or(usize::MAX);
    twice.clamp(MIN_COMPRESSED_LINE_BYTES, MAX_LINE_BYTES)
}

/// The most cells (CSV) or keys (JSON Lines) one line may hold: each costs
/// an allocation of its own in the supervisor, far more than its bytes.
pub const MAX_LINE_CELLS: usize = 1 << 20;

/// Why a line could not be read.
#[derive(Debug)]
pub(crate) enum LineError {
    Io(std::io::Error),
    /// The line (without its line end) is longer than the cap; at most the
    /// cap and two bytes of it were read.
    TooLong {
        max: usize,
    },
}

/// Reads the next line, its line end included, into `buf` (cleared first):
/// the bytes consumed, 0 at the end of the input. A line longer than `max`
/// bytes (without its `\n` or `\r\n`) is [`LineError::TooLong`], found
/// without holding more than `max + 2` bytes of it.
pub(crate) fn read_line<R: BufRead + ?Sized>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<usize, LineError> {
    buf.clear();
    // The most bytes held: the cap and a line end. The buffer grows by
    // doubling up to it, never past it (a line near the cap would otherwise
    // take twice its bytes).
    let most = max.saturating_add(2);
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(LineError::Io(e)),
        };
        if available.is_empty() {
            break;
        }
        let end = available.iter().position(|&b| b == b'\n').map(|i| i + 1);
        let chunk = &available[..end.unwrap_or(available.len())];
        let take = chunk.len().min(most - buf.len());
        if buf.capacity() - buf.len() < take {
            let grown = buf.capacity().saturating_mul(2).max(buf.len() + take).max(8 << 10).min(most);
            buf.reserve_exact(grown - buf.len());
        }
        buf.extend_from_slice(&chunk[..take]);
        let complete = end.is_some() && take == chunk.len();
        reader.consume(take);
        if complete || buf.len() >= most {
            break;
        }
    }
    let mut text = buf.len();
    if buf.ends_with(b"\n") {
        text -= 1;
        if buf[..text].ends_with(b"\r") {
            text -= 1;
        }
    }
    if text > max {
        return Err(LineError::TooLong { max });
    }
    Ok(buf.len())
}

/// The text of a line read by [`read_line`], without its line end.
pub(crate) fn without_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufReader, Read};

    #[test]
    fn a_compressed_file_s_line_cap_is_twice_its_bytes_within_the_limits() {
        assert_eq!(compressed_line_cap(0), MIN_COMPRESSED_LINE_BYTES);
        assert_eq!(compressed_line_cap(10 << 20), 20 << 20);
        assert_eq!(compressed_line_cap(1 << 40), MAX_LINE_BYTES);
        assert_eq!(compressed_line_cap(u64::MAX), MAX_LINE_BYTES);
    }

    #[test]
    fn a_line_past_the_cap_is_found_without_holding_more_than_it() {
        let endless = std::io::repeat(b'a').take(u64::MAX);
        let mut reader = BufReader::new(endless);
        let mut buf = Vec::new();
        assert!(matches!(read_line(&mut reader, &mut buf, 1000), Err(LineError::TooLong { max: 1000 })));
        assert!(buf.len() <= 1002 && buf.capacity() <= 8 << 10);
        // A long line: the buffer never grows past the cap and its line end.
        let mut reader = BufReader::new(std::io::repeat(b'a').take(u64::MAX));
        assert!(matches!(read_line(&mut reader, &mut buf, 100_000), Err(LineError::TooLong { .. })));
        assert_eq!(buf.capacity(), 100_002);
        // At the cap, with either line end, the line is read.
        for text in [&b"abcd\n"[..], b"abcd\r\n", b"abcd"] {
            let mut reader = BufReader::new(text);
            assert_eq!(read_line(&mut reader, &mut buf, 4).unwrap(), text.len());
            assert_eq!(without_line_end(&buf), b"abcd");
            assert_eq!(read_line(&mut reader, &mut buf, 4).unwrap(), 0);
        }
        let mut reader = BufReader::new(&b"abcde\n"[..]);
        assert!(matches!(read_line(&mut reader, &mut buf, 4), Err(LineError::TooLong { max: 4 })));
    }
}
