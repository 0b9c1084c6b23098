//! Length-prefixed frames: a 4-byte magic, a little-endian `u64` length, then
//! that many bytes of `bincode` 2 (standard configuration). See the crate
//! docs for why the receiving side is this careful.

use serde::{de::DeserializeOwned, Serialize};
use std::io::{self, Read, Write};

/// Marks the start of every frame, so that a peer speaking something else is
/// caught at once instead of being read as a length.
pub(crate) const MAGIC: [u8; 4] = *b"ISR1";

/// Frames up to this size are copied behind their header and written at once.
const ONE_WRITE: usize = 1 << 20;

/// Magic and the payload's length (u64, little-endian).
pub(crate) const FRAME_HEADER: usize = 12;

/// Default cap on one frame (2 GiB): outputs larger than this need a larger cap.
pub const DEFAULT_MAX_FRAME: u64 = 2 << 30;

/// Absolute cap on what bincode may claim while decoding one frame. Byte
/// buffers cost what they hold, so it only needs to be well above the frame cap.
const DECODE_LIMIT: usize = 8 << 30;

/// What bincode may claim per byte of frame. Its claims are sizes in memory:
/// at most 8 for one byte on the wire (a one-byte varint decoded as a `u64`),
/// and exactly one per byte for strings and byte buffers. Tying the limit to
/// the frame's length matters because bincode allocates a string or byte
/// buffer (zeroed) at its claimed length *before* reading it: with a fixed
/// 8 GiB limit, a 20-byte frame claiming a 7 GiB string made the supervisor
/// reserve 7 GiB, which aborts it wherever address space is limited.
const CLAIMS_PER_BYTE: usize = 16;

/// Why a frame could not be read or decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the peer closed the connection")]
    Closed,
    #[error("the connection closed in the middle of a frame ({received} of {expected} bytes received)")]
    Truncated { received: u64, expected: u64 },
    #[error("frame does not start with the isorun magic (got {0:02x?})")]
    BadMagic([u8; 4]),
    #[error("frame claims {claimed} bytes, more than the cap of {max}")]
    TooLarge { claimed: u64, max: u64 },
    #[error("frame could not be decoded: {0}")]
    Decode(String),
    #[error("frame has {0} bytes left over after its message")]
    TrailingBytes(usize),
    #[error("i/o error on the connection")]
    Io(#[source] io::Error),
}

/// Encodes one message with bincode 2.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(message, bincode::config::standard())
        .expect("encoding to a Vec cannot fail for protocol types")
}

/// Decodes one message, under an allocation limit, insisting that the whole
/// buffer is used.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, FrameError> {
    // bincode's limit is a type parameter: pick the smallest of a few that
    // covers what this frame can legitimately claim.
    let needed = bytes.len().saturating_mul(CLAIMS_PER_BYTE);
    let decoded = match needed {
        n if n <= 1 << 12 => decode_under::<T, { 1 << 12 }>(bytes),
        n if n <= 1 << 16 => decode_under::<T, { 1 << 16 }>(bytes),
        n if n <= 1 << 20 => decode_under::<T, { 1 << 20 }>(bytes),
        n if n <= 1 << 24 => decode_under::<T, { 1 << 24 }>(bytes),
        n if n <= 1 << 28 => decode_under::<T, { 1 << 28 }>(bytes),
        n if n <= 1 << 32 => decode_under::<T, { 1 << 32 }>(bytes),
        _ => decode_under::<T, DECODE_LIMIT>(bytes),
    };
    let (message, used) = decoded.map_err(|e| match e {
        bincode::error::DecodeError::LimitExceeded => {
            FrameError::Decode(format!("it claims more memory than a frame of {} bytes can hold", bytes.len()))
        }
        e => FrameError::Decode(e.to_string()),
    })?;
    if used != bytes.len() {
        return Err(FrameError::TrailingBytes(bytes.len() - used));
    }
    Ok(message)
}

fn decode_under<T: DeserializeOwned, const LIMIT: usize>(
    bytes: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard().with_limit::<LIMIT>())
}

/// Writes one message as a frame.
pub fn write_frame<T: Serialize>(writer: &mut impl Write, message: &T) -> io::Result<()> {
    write_frame_bytes(writer, &encode(message))
}

/// Writes an encoded message as a frame.
pub(crate) fn write_frame_bytes(writer: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let mut header = [0u8; FRAME_HEADER];
    header[..4].copy_from_slice(&MAGIC);
    header[4..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    // One write for a frame of up to a megabyte: a reader polling the socket
    // then wakes once for it, not once for the header and again for the rest.
    if payload.len() <= ONE_WRITE {
        let mut frame = Vec::with_capacity(FRAME_HEADER + payload.len());
        frame.extend_from_slice(&header);
        frame.extend_from_slice(payload);
        writer.write_all(&frame)?;
    } else {
        writer.write_all(&header)?;
        writer.write_all(payload)?;
    }
    writer.flush()
}

/// Reads one frame and decodes it. Memory grows with the bytes that arrive,
/// never with the length a peer claims.
pub fn read_frame<T: DeserializeOwned>(reader: &mut impl Read, max_frame: u64) -> Result<T, FrameError> {
    decode(&read_frame_bytes(reader, max_frame)?)
}

/// A header of which `got` bytes came: `Closed` when none did (the stream
/// ended between messages), `Truncated` when some did, `BadMagic` when it
/// does not start with `magic`.
pub(crate) fn check_header(got: usize, header: &[u8], magic: [u8; 4]) -> Result<(), FrameError> {
    if got == 0 {
        return Err(FrameError::Closed);
    }
    if got < header.len() {
        return Err(FrameError::Truncated { received: got as u64, expected: header.len() as u64 });
    }
    let start: [u8; 4] = header[..4].try_into().expect("4 bytes");
    if start != magic {
        return Err(FrameError::BadMagic(start));
    }
    Ok(())
}

/// Reads one frame's payload, not decoded; never reads past its end.
pub(crate) fn read_frame_bytes(reader: &mut impl Read, max_frame: u64) -> Result<Vec<u8>, FrameError> {
    let mut header = [0u8; FRAME_HEADER];
    let got = read_full(reader, &mut header)?;
    check_header(got, &header, MAGIC)?;
    let claimed = u64::from_le_bytes(header[4..].try_into().expect("8 bytes"));
    if claimed > max_frame {
        return Err(FrameError::TooLarge { claimed, max: max_frame });
    }
    let mut payload = Vec::with_capacity(claimed.min(1 << 20) as usize);
    let received = match reader.take(claimed).read_to_end(&mut payload) {
        Ok(n) => n as u64,
        // The peer's end (read_full): what came is kept in `payload`, so the frame is truncated.
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => payload.len() as u64,
        Err(e) => return Err(FrameError::Io(e)),
    };
    if received < claimed {
        return Err(FrameError::Truncated { received, expected: claimed });
    }
    Ok(payload)
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> Result<usize, FrameError> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            // A reset is the peer's end too: it closed with our bytes unread
            // (Linux says so once everything it sent has been read).
            Ok(0) => break,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_protocol::{DType, Tensor, UnitResult, WorkerMessage};

    fn frame_bytes(message: &WorkerMessage) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, message).unwrap();
        out
    }

    fn sample() -> WorkerMessage {
        WorkerMessage::Finished {
            unit: 7,
            run_us: 3,
            result: UnitResult::Ok {
                outputs: vec![("y".into(), Tensor::dense(DType::Float32, vec![2], vec![0, 0, 128, 63, 0, 0, 0, 64]))],
            },
        }
    }

    #[test]
    fn round_trip() {
        let bytes = frame_bytes(&sample());
        let back: WorkerMessage = read_frame(&mut bytes.as_slice(), DEFAULT_MAX_FRAME).unwrap();
        assert_eq!(back, sample());
    }

    #[test]
    fn end_of_stream_between_frames_is_closed() {
        let r: Result<WorkerMessage, _> = read_frame(&mut [].as_slice(), DEFAULT_MAX_FRAME);
        assert!(matches!(r, Err(FrameError::Closed)));
    }

    #[test]
    fn claimed_huge_size_is_refused_without_allocating() {
        let mut bytes = b"ISR1".to_vec();
        bytes.extend_from_slice(&(1u64 << 40).to_le_bytes());
        let r: Result<WorkerMessage, _> = read_frame(&mut bytes.as_slice(), DEFAULT_MAX_FRAME);
        assert!(matches!(r, Err(FrameError::TooLarge { claimed, .. }) if claimed == 1 << 40));
    }

    #[test]
    fn a_peer_that_closes_with_our_bytes_unread_ends_the_stream_for_the_blocking_reader_too() {
        use std::io::Write;
        use std::os::unix::net::UnixStream;
        let bytes = frame_bytes(&sample());
        // After a whole frame: the frame, then Closed (not an i/o error).
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        ours.write_all(&[7; 4096]).unwrap();
        theirs.write_all(&bytes).unwrap();
        drop(theirs);
        assert_eq!(read_frame::<WorkerMessage>(&mut ours, DEFAULT_MAX_FRAME).unwrap(), sample());
        assert!(matches!(read_frame::<WorkerMessage>(&mut ours, DEFAULT_MAX_FRAME), Err(FrameError::Closed)));
        // In the header and in the payload: truncated.
        for cut in [FRAME_HEADER - 2, bytes.len() - 3] {
            let (mut ours, mut theirs) = UnixStream::pair().unwrap();
            ours.write_all(&[7; 4096]).unwrap();
            theirs.write_all(&bytes[..cut]).unwrap();
            drop(theirs);
            let r = read_frame::<WorkerMessage>(&mut ours, DEFAULT_MAX_FRAME);
            assert!(matches!(r, Err(FrameError::Truncated { .. })), "cut at {cut}: {r:?}");
        }
    }

    #[test]
    fn half_sent_frame_is_truncated() {
        let bytes = frame_bytes(&sample());
        let r: Result<WorkerMessage, _> = read_frame(&mut &bytes[..bytes.len() - 3], DEFAULT_MAX_FRAME);
        assert!(matches!(r, Err(FrameError::Truncated { .. })));
        let r: Result<WorkerMessage, _> = read_frame(&mut &bytes[..5], DEFAULT_MAX_FRAME);
        assert!(matches!(r, Err(FrameError::Truncated { received: 5, expected: 12 })));
    }

    #[test]
    fn garbage_is_refused() {
        let r: Result<WorkerMessage, _> = read_frame(&mut b"GET / HTTP/1.1\r\n".as_slice(), DEFAULT_MAX_FRAME);
        assert!(matches!(r, Err(FrameError::BadMagic(_))));
        let mut bytes = b"ISR1".to_vec();
        bytes.extend_from_slice(&4u64.to_le_bytes());
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        let r: Result<WorkerMessage, _> = read_frame(&mut bytes.as_slice(), DEFAULT_MAX_FRAME);
        assert!(matches!(r, Err(FrameError::Decode(_))), "{r:?}");
    }

    #[test]
    fn claimed_vector_length_beyond_the_frame_is_refused() {
        // Finished { unit: 0, run_us: 0, result: Ok { outputs: <claims 2^60 entries> } }
        let mut payload = vec![2u8, 0, 0, 0];
        payload.push(0xff); // u64 varint marker
        payload.extend_from_slice(&(1u64 << 60).to_le_bytes());
        let r: Result<WorkerMessage, _> = decode(&payload);
        assert!(r.is_err());
    }

    /// Largest single allocation made by this test binary, to prove that a
    /// claimed size is refused before anything is allocated for it.
    struct Largest;

    static LARGEST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    // SAFETY: forwards to the system allocator, recording sizes only.
    unsafe impl std::alloc::GlobalAlloc for Largest {
        unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
            LARGEST.fetch_max(layout.size(), std::sync::atomic::Ordering::Relaxed);
            std::alloc::System.alloc(layout)
        }
        unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
            LARGEST.fetch_max(layout.size(), std::sync::atomic::Ordering::Relaxed);
            std::alloc::System.alloc_zeroed(layout)
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
            std::alloc::System.dealloc(ptr, layout)
        }
    }

    #[global_allocator]
    static ALLOCATOR: Largest = Largest;

    #[test]
    fn claimed_string_length_beyond_the_frame_allocates_nothing() {
        // Hello { protocol_version: 2, worker_version: <claims 7 GiB> }
        for claim in [7u64 << 30, 1 << 20, 100] {
            let mut payload = vec![0u8, 2];
            payload.push(0xfd); // u64 varint marker
            payload.extend_from_slice(&claim.to_le_bytes());
            payload.extend_from_slice(b"short");
            let r: Result<WorkerMessage, _> = decode(&payload);
            assert!(matches!(r, Err(FrameError::Decode(_))), "{r:?}");
        }
        let largest = LARGEST.load(std::sync::atomic::Ordering::Relaxed);
        assert!(largest < 64 << 20, "decoding allocated {largest} bytes for a claim");
        // A legitimate large buffer still decodes.
        let big = WorkerMessage::Finished {
            unit: 1,
            run_us: 0,
            result: UnitResult::Ok {
                outputs: vec![("y".into(), Tensor::dense(DType::UInt8, vec![1 << 20], vec![7; 1 << 20]))],
            },
        };
        assert_eq!(decode::<WorkerMessage>(&encode(&big)).unwrap(), big);
        // Many tiny strings claim far more memory than their bytes: still fine.
        let strings = WorkerMessage::Finished {
            unit: 1,
            run_us: 0,
            result: UnitResult::Ok {
                outputs: vec![("s".into(), Tensor::strings(vec![100_000], vec![Vec::new(); 100_000]))],
            },
        };
        assert_eq!(decode::<WorkerMessage>(&encode(&strings)).unwrap(), strings);
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut payload = encode(&sample());
        payload.push(0);
        assert!(matches!(decode::<WorkerMessage>(&payload), Err(FrameError::TrailingBytes(1))));
    }
}
