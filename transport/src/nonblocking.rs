//! The supervisor's side of the socket without threads in between: a request
//! written from the caller's own thread as far as the socket takes it, and
//! frames read as their bytes arrive, a call at a time. Every request used to
//! cross two thread hand-offs on the supervisor's side (slot → sender thread,
//! reader thread → slot), each a futex wake-up that costs tens to hundreds of
//! microseconds on a loaded machine: as much as a small model's whole run.
//!
//! Neither side ever blocks: [`FrameReader::read_available`] takes what the
//! socket has (`MSG_DONTWAIT`) and keeps a partial frame for the next call, so
//! the caller still checks its deadlines between reads; [`SendProgress`]
//! remembers how far a request got when the socket was full, so the rest can
//! go from a thread that may block (a worker that stops reading stalls only
//! that thread). The socket itself stays in blocking mode: its file
//! description is shared with such a thread.
//!
//! The caps are those of [`read_frame`](crate::read_frame): a claimed length
//! over the cap is refused before any allocation, and memory grows only with
//! bytes that really arrive.

use crate::envelope::{send_with_fds, RequestEnvelope, FDS_PER_MESSAGE};
use crate::frame::{FrameError, FRAME_HEADER, MAGIC};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

/// How much a read asks the kernel for at once while a payload is incomplete.
const READ_CHUNK: usize = 4 << 20;

/// What a read takes ahead of a frame's end. A worker's answers are mostly
/// small: with this, its header and payload cost one system call, not two.
/// A payload still missing at least this much is read straight into place.
const STAGE: usize = 16 << 10;

/// A frame being read, possibly over many calls.
#[derive(Debug)]
pub struct FrameReader {
    max_frame: u64,
    header: [u8; FRAME_HEADER],
    header_filled: usize,
    /// The claimed payload length, once the header is whole.
    claimed: Option<u64>,
    payload: Vec<u8>,
    /// Bytes read ahead of the frame being assembled: a small frame and its
    /// header come in one `recv`, not one for each. A fixed [`STAGE`] bytes,
    /// allocated on first use; `staged` is the range not yet taken.
    stage: Vec<u8>,
    staged: std::ops::Range<usize>,
}

impl FrameReader {
    /// A reader refusing frames that claim more than `max_frame` bytes.
    pub fn new(max_frame: u64) -> FrameReader {
        FrameReader {
            max_frame,
            header: [0; FRAME_HEADER],
            header_filled: 0,
            claimed: None,
            payload: Vec::new(),
            stage: Vec::new(),
            staged: 0..0,
        }
    }

    /// Reads into the stage (empty when this is called): how many bytes came.
    fn fill_stage(&mut self, fd: RawFd) -> Result<Received, FrameError> {
        if self.stage.is_empty() {
            self.stage = vec![0; STAGE];
        }
        let got = receive(fd, &mut self.stage)?;
        if let Received::Bytes(n) = got {
            self.staged = 0..n;
        }
        Ok(got)
    }

    /// Takes up to `at_most` of the staged bytes: where they lie in the stage.
    fn take_staged(&mut self, at_most: usize) -> std::ops::Range<usize> {
        let n = at_most.min(self.staged.len());
        self.staged.start += n;
        self.staged.start - n..self.staged.start
    }

    /// Reads what `socket` has without waiting: `Ok(Some(payload))` once a
    /// whole frame has arrived (the next one starts afresh), `Ok(None)` when
    /// the socket has no more bytes yet, `Err(Closed)` at the end of the
    /// stream between frames, `Err(Truncated)` when it ends inside one.
    pub fn read_available(&mut self, socket: &UnixStream) -> Result<Option<Vec<u8>>, FrameError> {
        let fd = socket.as_raw_fd();
        loop {
            let Some(claimed) = self.claimed else {
                if self.staged.is_empty() {
                    match self.fill_stage(fd)? {
                        Received::Bytes(_) => {}
                        Received::WouldBlock => return Ok(None),
                        Received::End if self.header_filled == 0 => return Err(FrameError::Closed),
                        Received::End => {
                            return Err(FrameError::Truncated {
                                received: self.header_filled as u64,
                                expected: FRAME_HEADER as u64,
                            })
                        }
                    }
                }
                let taken = self.take_staged(FRAME_HEADER - self.header_filled);
                let filled = self.header_filled + taken.len();
                self.header[self.header_filled..filled].copy_from_slice(&self.stage[taken]);
                self.header_filled = filled;
                if self.header_filled < FRAME_HEADER {
                    continue;
                }
                let magic: [u8; 4] = self.header[..4].try_into().expect("4 bytes");
                if magic != MAGIC {
                    return Err(FrameError::BadMagic(magic));
                }
                let claimed = u64::from_le_bytes(self.header[4..].try_into().expect("8 bytes"));
                if claimed > self.max_frame {
                    return Err(FrameError::TooLarge { claimed, max: self.max_frame });
                }
                self.claimed = Some(claimed);
                continue;
            };
            let have = self.payload.len() as u64;
            if have == claimed {
                self.header_filled = 0;
                self.claimed = None;
                return Ok(Some(std::mem::take(&mut self.payload)));
            }
            // Room for at most what is still missing, a chunk at a time: a
            // claimed length is only a bound, never an allocation.
            // A full buffer grows as a Vec does, so what it holds is at most
            // twice the bytes that came, or one chunk more.
            let missing = claimed - have;
            if self.payload.spare_capacity_mut().is_empty() {
                self.payload.reserve(missing.min(READ_CHUNK as u64) as usize);
            }
            if !self.staged.is_empty() {
                let taken = self.take_staged(missing.min(usize::MAX as u64) as usize);
                self.payload.extend_from_slice(&self.stage[taken]);
                continue;
            }
            if missing < STAGE as u64 {
                match self.fill_stage(fd)? {
                    Received::Bytes(_) => continue,
                    Received::WouldBlock => return Ok(None),
                    Received::End => return Err(FrameError::Truncated { received: have, expected: claimed }),
                }
            }
            let spare = self.payload.spare_capacity_mut();
            let want = spare.len().min(missing.min(usize::MAX as u64) as usize);
            let spare = &mut spare[..want];
            // SAFETY: `spare` is `want` bytes of the Vec's own capacity; recv
            // writes at most that many and says how many it wrote.
            let got = unsafe { recv_into(fd, spare.as_mut_ptr().cast(), want) };
            match got? {
                Received::Bytes(n) => {
                    // SAFETY: recv initialised the first `n` bytes of the spare capacity.
                    unsafe { self.payload.set_len(self.payload.len() + n) };
                }
                Received::WouldBlock => return Ok(None),
                Received::End => return Err(FrameError::Truncated { received: have, expected: claimed }),
            }
        }
    }
}

enum Received {
    Bytes(usize),
    WouldBlock,
    End,
}

fn receive(fd: RawFd, buf: &mut [u8]) -> Result<Received, FrameError> {
    // SAFETY: `buf` is a valid, writable slice of `buf.len()` bytes.
    unsafe { recv_into(fd, buf.as_mut_ptr(), buf.len()) }
}

/// # Safety
/// `ptr` must be valid for writes of `len` bytes.
unsafe fn recv_into(fd: RawFd, ptr: *mut u8, len: usize) -> Result<Received, FrameError> {
    loop {
        // SAFETY: the caller guarantees `ptr` is writable for `len` bytes.
        let got = unsafe { libc::recv(fd, ptr.cast(), len, libc::MSG_DONTWAIT) };
        if got > 0 {
            return Ok(Received::Bytes(got as usize));
        }
        if got == 0 {
            return Ok(Received::End);
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(Received::WouldBlock),
            // The peer closed with some of our bytes unread (a worker that
            // died while a request was on its way): Linux says so once, after
            // everything it sent has been read, so it is the stream's end.
            io::ErrorKind::ConnectionReset => return Ok(Received::End),
            _ => return Err(FrameError::Io(error)),
        }
    }
}

/// Waits until `fd` has bytes to read (or its end, or an error) or `timeout`
/// passes: whether it is readable. An interrupted wait says no; callers look
/// again. (`ppoll`, for a timeout finer than `poll`'s milliseconds.)
pub fn wait_readable(fd: RawFd, timeout: std::time::Duration) -> bool {
    let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: one valid pollfd, a valid timespec and no signal mask.
    unsafe { libc::ppoll(&mut poll, 1, &timeout, std::ptr::null()) > 0 }
}

/// How far a request has gone down the socket: which part (the header with
/// the first descriptors, each further batch of descriptors, then the views
/// and the frame) and how many of its bytes. Descriptors go with a part's
/// first byte, so a part resumed past its start sends none again.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SendProgress {
    part: usize,
    offset: usize,
}

impl RequestEnvelope {
    /// Sends as much of the request as the socket takes now: `Ok(true)` when
    /// all of it went, `Ok(false)` when the socket is full (`progress` says
    /// where to go on, with [`RequestEnvelope::send_rest`]).
    pub fn send_without_blocking(&self, socket: &UnixStream, progress: &mut SendProgress) -> io::Result<bool> {
        self.send_parts(socket, progress, libc::MSG_DONTWAIT)
    }

    /// Sends the rest of a request that [`send_without_blocking`] left,
    /// waiting for the socket as long as it takes.
    ///
    /// [`send_without_blocking`]: RequestEnvelope::send_without_blocking
    pub fn send_rest(&self, socket: &UnixStream, progress: &mut SendProgress) -> io::Result<()> {
        while !self.send_parts(socket, progress, 0)? {}
        Ok(())
    }

    fn send_parts(&self, socket: &UnixStream, progress: &mut SendProgress, flags: libc::c_int) -> io::Result<bool> {
        let fds = self.shared_fds();
        let batches: Vec<&[RawFd]> = fds.chunks(FDS_PER_MESSAGE).collect();
        // Parts: the header with the first batch of descriptors (none
        // without regions), "+" with each further batch, then the views and
        // the frame. With at most one batch, the header and the rest go in
        // one `sendmsg`: the worker then wakes once for the whole request,
        // not for the header and again for the frame (the descriptors are
        // taken by the read of the header, the first bytes they came with).
        let mut parts: Vec<(Vec<u8>, &[RawFd])> = Vec::with_capacity(batches.len() + 1);
        if batches.len() <= 1 {
            let mut whole = self.header().to_vec();
            whole.extend_from_slice(&self.tail());
            parts.push((whole, batches.first().copied().unwrap_or(&[])));
        } else {
            parts.push((self.header().to_vec(), batches[0]));
            parts.extend(batches[1..].iter().map(|batch| (b"+".to_vec(), *batch)));
            parts.push((self.tail(), &[]));
        }
        while let Some((bytes, fds)) = parts.get(progress.part) {
            let batch: &[RawFd] = if progress.offset > 0 { &[] } else { fds };
            match send_with_fds(socket, &bytes[progress.offset..], batch, flags) {
                Ok(sent) => progress.offset += sent,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
            if progress.offset == bytes.len() {
                progress.part += 1;
                progress.offset = 0;
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::write_frame;
    use crate::{RequestReader, SharedMemory};
    use isorun_protocol::{DType, Tensor, TensorData, ToWorker, UnitResult, WorkerMessage};
    use std::io::Write;

    fn finished(bytes: usize) -> WorkerMessage {
        WorkerMessage::Finished {
            unit: 1,
            run_us: 2,
            result: UnitResult::Ok {
                outputs: vec![("y".into(), Tensor::dense(DType::UInt8, vec![bytes as u64], vec![7; bytes]))],
            },
        }
    }

    #[test]
    fn frames_arriving_a_byte_at_a_time_are_read_whole_and_in_order() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut bytes = Vec::new();
        write_frame(&mut bytes, &finished(300)).unwrap();
        write_frame(&mut bytes, &finished(5)).unwrap();
        let mut reader = FrameReader::new(1 << 20);
        let mut frames = Vec::new();
        for byte in &bytes {
            assert!(matches!(reader.read_available(&ours), Ok(None)), "nothing whole yet");
            theirs.write_all(std::slice::from_ref(byte)).unwrap();
            if let Some(payload) = reader.read_available(&ours).unwrap() {
                frames.push(crate::decode::<WorkerMessage>(&payload).unwrap());
            }
        }
        assert_eq!(frames, vec![finished(300), finished(5)]);
        drop(theirs);
        assert!(matches!(reader.read_available(&ours), Err(FrameError::Closed)));
    }

    #[test]
    fn frames_that_came_in_one_read_come_out_one_per_call_even_after_the_peer_closed() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut bytes = Vec::new();
        for size in [3, STAGE + 10, 0, 7] {
            write_frame(&mut bytes, &finished(size)).unwrap();
        }
        theirs.write_all(&bytes).unwrap();
        drop(theirs);
        let mut reader = FrameReader::new(1 << 20);
        for size in [3, STAGE + 10, 0, 7] {
            let payload = reader.read_available(&ours).unwrap().expect("a whole frame");
            assert_eq!(crate::decode::<WorkerMessage>(&payload).unwrap(), finished(size));
        }
        assert!(matches!(reader.read_available(&ours), Err(FrameError::Closed)));
    }

    #[test]
    fn a_peer_that_closes_with_our_bytes_unread_ends_the_stream_after_its_last_frame() {
        // Linux reports such a close as ECONNRESET: a worker that died while
        // a request was on its way has ended, it did not send garbage.
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        ours.write_all(&[7; 4096]).unwrap();
        let mut bytes = Vec::new();
        write_frame(&mut bytes, &finished(5)).unwrap();
        theirs.write_all(&bytes).unwrap();
        drop(theirs);
        let mut reader = FrameReader::new(1 << 20);
        let payload = reader.read_available(&ours).unwrap().expect("the frame sent before the close");
        assert_eq!(crate::decode::<WorkerMessage>(&payload).unwrap(), finished(5));
        assert!(matches!(reader.read_available(&ours), Err(FrameError::Closed)));
        // Mid-frame, the same close is a truncated frame.
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        ours.write_all(&[7; 4096]).unwrap();
        theirs.write_all(&bytes[..bytes.len() - 2]).unwrap();
        drop(theirs);
        let mut reader = FrameReader::new(1 << 20);
        assert!(matches!(reader.read_available(&ours), Err(FrameError::Truncated { .. })));
    }

    #[test]
    fn a_frame_cut_short_is_truncated_and_a_huge_claim_is_refused_before_allocating() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut bytes = Vec::new();
        write_frame(&mut bytes, &finished(100)).unwrap();
        theirs.write_all(&bytes[..bytes.len() - 3]).unwrap();
        drop(theirs);
        let mut reader = FrameReader::new(1 << 20);
        assert!(matches!(reader.read_available(&ours), Err(FrameError::Truncated { .. })));

        let (ours, mut theirs) = UnixStream::pair().unwrap();
        theirs.write_all(b"ISR1").unwrap();
        theirs.write_all(&(1u64 << 40).to_le_bytes()).unwrap();
        let mut reader = FrameReader::new(1 << 20);
        assert!(
            matches!(reader.read_available(&ours), Err(FrameError::TooLarge { claimed, .. }) if claimed == 1 << 40)
        );
        assert_eq!(reader.payload.capacity(), 0);

        let (ours, mut theirs) = UnixStream::pair().unwrap();
        theirs.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let mut reader = FrameReader::new(1 << 20);
        assert!(matches!(reader.read_available(&ours), Err(FrameError::BadMagic(_))));
    }

    #[test]
    fn a_claimed_length_grows_the_buffer_only_with_bytes_that_arrive() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        theirs.write_all(b"ISR1").unwrap();
        theirs.write_all(&(1u64 << 30).to_le_bytes()).unwrap();
        theirs.write_all(&[1; 1000]).unwrap();
        let mut reader = FrameReader::new(2 << 30);
        assert!(matches!(reader.read_available(&ours), Ok(None)));
        assert_eq!(reader.payload.len(), 1000);
        assert!(reader.payload.capacity() <= READ_CHUNK, "capacity {}", reader.payload.capacity());
    }

    fn run_request(regions: usize, inline: usize) -> (ToWorker, Vec<SharedMemory>) {
        let shared: Vec<SharedMemory> =
            (0..regions).map(|i| SharedMemory::from_bytes(&(i as u32).to_le_bytes()).unwrap()).collect();
        let mut inputs: Vec<(String, Tensor)> = (0..regions)
            .map(|i| {
                (format!("x{i}"), Tensor { dtype: DType::Float32, shape: vec![1], data: TensorData::Shared(i as u32) })
            })
            .collect();
        inputs.push(("big".into(), Tensor::dense(DType::UInt8, vec![inline as u64], vec![3; inline])));
        let request = isorun_protocol::RunRequest {
            unit: 9,
            model_dir: "/m".into(),
            tags: vec!["serve".into()],
            signature: "serving_default".into(),
            inputs,
            config: isorun_protocol::SessionConfig::default(),
            load_only: false,
            libraries: Vec::new(),
            sandbox: None,
            runtime: isorun_protocol::Runtime::TensorFlow,
        };
        (ToWorker::Run(request), shared)
    }

    #[test]
    fn a_request_the_socket_cannot_take_at_once_is_finished_by_send_rest_and_arrives_whole() {
        // More regions than one sendmsg carries and a frame larger than the
        // socket's buffer: the first call stops part-way with nobody reading.
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (message, shared) = run_request(FDS_PER_MESSAGE + 3, 4 << 20);
        let envelope = RequestEnvelope::new(&message, shared);
        let mut progress = SendProgress::default();
        assert!(!envelope.send_without_blocking(&ours, &mut progress).unwrap(), "a full socket takes no more");
        assert_ne!(progress, SendProgress::default());
        let receiver =
            std::thread::spawn(move || RequestReader::new(64 << 20).receive(&theirs).unwrap().open().unwrap());
        envelope.send_rest(&ours, &mut progress).unwrap();
        let (back, regions) = receiver.join().unwrap();
        assert_eq!(back, message);
        assert_eq!(regions.len(), FDS_PER_MESSAGE + 3);
        for (i, region) in regions.iter().enumerate() {
            assert_eq!(&region[..], &(i as u32).to_le_bytes());
        }
    }

    #[test]
    fn a_small_request_goes_at_once() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (message, shared) = run_request(2, 10);
        let mut progress = SendProgress::default();
        assert!(RequestEnvelope::new(&message, shared).send_without_blocking(&ours, &mut progress).unwrap());
        let (back, regions) = RequestReader::new(1 << 20).receive(&theirs).unwrap().open().unwrap();
        assert_eq!((back, regions.len()), (message, 2));
    }
}
