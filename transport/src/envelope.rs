//! A request on its way to a worker: the `ToWorker` message as one frame,
//! preceded by the shared-memory regions its large tensors live in, passed
//! as file descriptors (`SCM_RIGHTS`). It travels on the very socket the
//! supervisor created and the worker inherited, the other way from the
//! worker's frames, so the supervisor sends only on a channel it owns:
//! nothing a worker says can point it elsewhere.
//!
//! On the wire: `ISQ2`, a little-endian `u32` count of regions, sent with
//! the first (at most [`FDS_PER_MESSAGE`]) descriptors attached; one byte
//! `+` for each further batch of descriptors; for each region, where it
//! lies in its descriptor's file (`u64` offset, `u64` length: a sealed
//! memfd whole, or a view of an input file itself); then the frame
//! (`frame.rs`). The reader takes exactly these bytes, never more, so
//! descriptors attached to the next request are never read (and dropped)
//! by a plain read.

use crate::frame::{check_header, decode, encode, write_frame_bytes, FrameError, FRAME_HEADER};
use crate::shared::SharedMemory;
use isorun_protocol::{Tensor, TensorData, ToWorker};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Dense tensors at least this large travel in shared memory.
pub const SHARED_THRESHOLD: usize = 64 * 1024;

/// Descriptors attached to one `sendmsg` (the kernel allows 253).
pub const FDS_PER_MESSAGE: usize = 250;

/// Marks a request, so that a confused stream is caught at once.
const MAGIC: [u8; 4] = *b"ISQ2";

/// A `ToWorker` message and the shared memory its tensors refer to.
pub struct RequestEnvelope {
    message: Vec<u8>,
    shared: Vec<SharedMemory>,
}

impl RequestEnvelope {
    /// Packs a message whose `TensorData::Shared(i)` refer to `shared[i]`.
    pub fn new(message: &ToWorker, shared: Vec<SharedMemory>) -> RequestEnvelope {
        RequestEnvelope { message: encode(message), shared }
    }

    /// A request that came as its message alone (through the `Mailbox`).
    pub fn from_message(message: Vec<u8>) -> RequestEnvelope {
        RequestEnvelope { message, shared: Vec::new() }
    }

    /// The encoded message, when no region comes with it (then it can
    /// travel without the socket: `Mailbox`).
    pub fn message_alone(&self) -> Option<&[u8]> {
        self.shared.is_empty().then_some(&self.message[..])
    }

    /// Writes the request to the worker's socket.
    pub fn send(&self, socket: &UnixStream) -> io::Result<()> {
        self.send_rest(socket, &mut crate::SendProgress::default())
    }

    /// The first part: magic and the number of shared regions.
    pub(crate) fn header(&self) -> [u8; 8] {
        let mut header = [0u8; 8];
        header[..4].copy_from_slice(&MAGIC);
        header[4..].copy_from_slice(&(self.shared.len() as u32).to_le_bytes());
        header
    }

    /// The regions' descriptors, in order.
    pub(crate) fn shared_fds(&self) -> Vec<RawFd> {
        self.shared.iter().map(|s| s.fd().as_raw_fd()).collect()
    }

    /// The last part: each region's view (offset, length), then the frame.
    pub(crate) fn tail(&self) -> Vec<u8> {
        let mut tail = Vec::with_capacity(self.shared.len() * 16 + crate::frame::FRAME_HEADER + self.message.len());
        for region in &self.shared {
            let (offset, len) = region.view();
            tail.extend_from_slice(&offset.to_le_bytes());
            tail.extend_from_slice(&len.to_le_bytes());
        }
        write_frame_bytes(&mut tail, &self.message).expect("writing to a Vec cannot fail");
        tail
    }

    /// Unpacks the message, checking every tensor against its data.
    pub fn open(self) -> Result<(ToWorker, Vec<SharedMemory>), FrameError> {
        let message: ToWorker = decode(&self.message)?;
        if let ToWorker::Run(request) = &message {
            for (name, tensor) in &request.inputs {
                tensor
                    .validate(|i| self.shared.get(i as usize).map(|s| s.len() as u64))
                    .map_err(|e| FrameError::Decode(format!("input {name}: {e}")))?;
            }
        }
        Ok((message, self.shared))
    }
}

/// One `sendmsg` of `bytes` with `fds` attached (and `flags`, e.g.
/// `MSG_DONTWAIT`): how many bytes went. The descriptors go with the first
/// byte, so a caller sends the rest without them.
pub(crate) fn send_with_fds(socket: &UnixStream, bytes: &[u8], fds: &[RawFd], flags: libc::c_int) -> io::Result<usize> {
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = if fds.is_empty() { 0 } else { (unsafe { libc::CMSG_SPACE(fd_bytes as u32) }) as usize };
    // u64 elements: cmsghdr needs 8-byte alignment.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: a zeroed msghdr is valid; the fields set below point at live buffers.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    if !fds.is_empty() {
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space as _;
        // SAFETY: the control buffer has room for one header and the descriptors.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(header).cast::<RawFd>(), fds.len());
        }
    }
    loop {
        // SAFETY: message points at live buffers for the whole call.
        let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &message, libc::MSG_NOSIGNAL | flags) };
        if sent >= 0 {
            return Ok(sent as usize);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// One `recvmsg` into `buf` (with `flags`, e.g. `MSG_DONTWAIT`): how many
/// bytes came (0 at the end of the stream; `WouldBlock` as an error). The
/// descriptors that come with them are appended to `fds`, in the order they
/// were sent.
fn receive_with_fds(
    socket: &UnixStream,
    buf: &mut [u8],
    fds: &mut VecDeque<OwnedFd>,
    flags: libc::c_int,
) -> Result<usize, FrameError> {
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE((FDS_PER_MESSAGE * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    loop {
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: a zeroed msghdr is valid; the fields set below point at live buffers.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space as _;
        // SAFETY: message points at live buffers for the whole call.
        let got = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC | flags) };
        if got < 0 {
            let error = io::Error::last_os_error();
            match error.kind() {
                io::ErrorKind::Interrupted => continue,
                // The peer closed with our bytes unread: Linux says so once,
                // after everything it sent has been read: its end.
                io::ErrorKind::ConnectionReset => return Ok(0),
                _ => return Err(FrameError::Io(error)),
            }
        }
        // SAFETY: walking the control messages the kernel wrote.
        unsafe {
            let mut header = libc::CMSG_FIRSTHDR(&message);
            while !header.is_null() {
                if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(header).cast::<RawFd>();
                    let count = ((*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                    for i in 0..count {
                        fds.push_back(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                header = libc::CMSG_NXTHDR(&message, header);
            }
        }
        if message.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(FrameError::Decode("shared regions were cut off (too many open files?)".into()));
        }
        return Ok(got as usize);
    }
}

/// What a read takes ahead: a small request (header, views and frame, with
/// inline tensors under [`SHARED_THRESHOLD`]) comes in one `recvmsg`.
const STAGE: usize = SHARED_THRESHOLD + 4096;

/// The worker's side of the socket: requests read through a small buffer,
/// so that a small request costs one system call, not one for each of its
/// parts. Descriptors come with the first byte they were sent with, and a
/// read through the buffer may take the start of the next request: they
/// wait here, in order, for the request whose header claims them. (The
/// kernel ends a `recvmsg` after the first byte that carried descriptors,
/// so one read never brings more than one batch.) A payload still missing
/// at least the buffer's size is read straight into place, exactly, so it
/// never reaches into the next request.
pub struct RequestReader {
    max_frame: u64,
    stage: Vec<u8>,
    /// The staged bytes not yet taken.
    staged: std::ops::Range<usize>,
    fds: VecDeque<OwnedFd>,
}

impl RequestReader {
    /// A reader refusing frames that claim more than `max_frame` bytes.
    pub fn new(max_frame: u64) -> RequestReader {
        RequestReader { max_frame, stage: Vec::new(), staged: 0..0, fds: VecDeque::new() }
    }

    /// Whether bytes of a next request have already been read: then a wait
    /// on the socket before [`RequestReader::receive`] would wait for the
    /// request after it.
    pub fn has_buffered(&self) -> bool {
        !self.staged.is_empty()
    }

    /// [`RequestReader::receive`], but a request that comes within `budget`
    /// is read without sleeping: the socket is read without waiting, with a
    /// `sched_yield` between tries (a supervisor woken on this CPU then runs
    /// at once), and only then with a read that sleeps. The try that finds
    /// the request is its read: polling costs no extra call.
    pub fn receive_spinning(
        &mut self,
        socket: &UnixStream,
        budget: std::time::Duration,
    ) -> Result<RequestEnvelope, FrameError> {
        if !budget.is_zero() {
            let until = std::time::Instant::now() + budget;
            while !self.poll(socket)? && std::time::Instant::now() < until {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
        self.receive(socket)
    }

    /// Whether a request's first bytes (or the stream's end) are here,
    /// reading the socket without waiting if need be.
    pub fn poll(&mut self, socket: &UnixStream) -> Result<bool, FrameError> {
        if !self.staged.is_empty() {
            return Ok(true);
        }
        if self.stage.is_empty() {
            self.stage = vec![0; STAGE];
        }
        match receive_with_fds(socket, &mut self.stage, &mut self.fds, libc::MSG_DONTWAIT) {
            // 0 is the end of the stream: the read that follows says so.
            Ok(got) => {
                self.staged = 0..got;
                Ok(true)
            }
            Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Reads one request from the supervisor, waiting for it. `Closed` when
    /// the supervisor has gone away between requests.
    pub fn receive(&mut self, socket: &UnixStream) -> Result<RequestEnvelope, FrameError> {
        let mut header = [0u8; 8];
        let got = self.take_exactly(socket, &mut header)?;
        check_header(got, &header, MAGIC)?;
        let count = u32::from_le_bytes(header[4..].try_into().expect("4 bytes")) as usize;
        let wrong_count = |got: usize| FrameError::Decode(format!("expected {count} shared regions, got {got}"));
        // One "+" for each batch of descriptors after the first.
        for _ in 1..count.div_ceil(FDS_PER_MESSAGE) {
            let mut plus = [0u8; 1];
            if self.take_exactly(socket, &mut plus)? != 1 || plus != *b"+" {
                return Err(wrong_count(self.fds.len()));
            }
        }
        if self.fds.len() < count {
            return Err(wrong_count(self.fds.len()));
        }
        let fds: Vec<OwnedFd> = self.fds.drain(..count).collect();
        // Counted before the views are allocated: `count` is bounded by descriptors that came.
        let mut views = vec![0u8; count * 16];
        if self.take_exactly(socket, &mut views)? < views.len() {
            return Err(FrameError::Truncated { received: 0, expected: views.len() as u64 });
        }
        let shared = fds
            .into_iter()
            .zip(views.chunks_exact(16))
            .map(|(fd, view)| {
                let offset = u64::from_le_bytes(view[..8].try_into().expect("8 bytes"));
                let len = u64::from_le_bytes(view[8..].try_into().expect("8 bytes"));
                SharedMemory::from_fd_view(fd, offset, len)
            })
            .collect::<io::Result<Vec<_>>>()
            .map_err(FrameError::Io)?;
        let message = self.frame(socket)?;
        if self.staged.is_empty() && !self.fds.is_empty() {
            // Nothing of a next request has been read, so nothing can have come for it.
            return Err(FrameError::Decode(format!("{} descriptors came that no request claims", self.fds.len())));
        }
        Ok(RequestEnvelope { message, shared })
    }

    /// The frame's payload, never read past its end.
    fn frame(&mut self, socket: &UnixStream) -> Result<Vec<u8>, FrameError> {
        let mut header = [0u8; FRAME_HEADER];
        let got = self.take_exactly(socket, &mut header)?;
        // Inside a request, no frame at all is a request cut short.
        check_header(got, &header, crate::frame::MAGIC).map_err(|e| match e {
            FrameError::Closed => FrameError::Truncated { received: 0, expected: FRAME_HEADER as u64 },
            e => e,
        })?;
        let claimed = u64::from_le_bytes(header[4..].try_into().expect("8 bytes"));
        if claimed > self.max_frame {
            return Err(FrameError::TooLarge { claimed, max: self.max_frame });
        }
        let mut payload = Vec::with_capacity(claimed.min(1 << 20) as usize);
        loop {
            let missing = claimed - payload.len() as u64;
            if missing == 0 {
                return Ok(payload);
            }
            if !self.staged.is_empty() {
                let n = self.staged.len().min(missing.min(usize::MAX as u64) as usize);
                payload.extend_from_slice(&self.stage[self.staged.start..self.staged.start + n]);
                self.staged.start += n;
                continue;
            }
            if missing >= STAGE as u64 {
                // Exactly the rest, straight into place: the bytes of this
                // request only, which carry no descriptors.
                let before = payload.len() as u64;
                let mut reader = socket;
                let received = match io::Read::read_to_end(&mut io::Read::take(&mut reader, missing), &mut payload) {
                    Ok(n) => n as u64,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => payload.len() as u64 - before,
                    Err(e) => return Err(FrameError::Io(e)),
                };
                if received < missing {
                    return Err(FrameError::Truncated { received: payload.len() as u64, expected: claimed });
                }
                continue;
            }
            if self.fill(socket)? == 0 {
                return Err(FrameError::Truncated { received: payload.len() as u64, expected: claimed });
            }
        }
    }

    /// Fills `buf` from the stage, reading more as needed: how many bytes it
    /// holds (fewer only at the end of the stream).
    fn take_exactly(&mut self, socket: &UnixStream, buf: &mut [u8]) -> Result<usize, FrameError> {
        let mut filled = 0;
        while filled < buf.len() {
            if self.staged.is_empty() && self.fill(socket)? == 0 {
                break;
            }
            let n = self.staged.len().min(buf.len() - filled);
            buf[filled..filled + n].copy_from_slice(&self.stage[self.staged.start..self.staged.start + n]);
            self.staged.start += n;
            filled += n;
        }
        Ok(filled)
    }

    /// One read into the (empty) stage: how many bytes came, 0 at the end.
    fn fill(&mut self, socket: &UnixStream) -> Result<usize, FrameError> {
        if self.stage.is_empty() {
            self.stage = vec![0; STAGE];
        }
        let got = receive_with_fds(socket, &mut self.stage, &mut self.fds, 0)?;
        self.staged = 0..got;
        Ok(got)
    }
}

/// The bytes of a dense tensor, wherever they are.
pub fn dense_bytes<'a>(tensor: &'a Tensor, shared: &'a [SharedMemory]) -> Option<&'a [u8]> {
    match &tensor.data {
        TensorData::Dense(bytes) => Some(bytes),
        TensorData::Shared(i) => shared.get(*i as usize).map(|s| &s[..]),
        TensorData::Strings(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_protocol::{DType, RunRequest, SessionConfig};

    fn request(inputs: Vec<(String, Tensor)>) -> ToWorker {
        ToWorker::Run(RunRequest {
            unit: 7,
            model_dir: "/m".into(),
            tags: vec!["serve".into()],
            signature: "serving_default".into(),
            inputs,
            config: SessionConfig::default(),
            load_only: false,
            libraries: Vec::new(),
            sandbox: None,
            runtime: isorun_protocol::Runtime::TensorFlow,
        })
    }

    #[test]
    fn requests_with_and_without_regions_arrive_whole_and_in_order() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        // More regions than one sendmsg carries, to cross a batch boundary.
        let regions: Vec<SharedMemory> =
            (0..FDS_PER_MESSAGE + 3).map(|i| SharedMemory::from_bytes(&(i as u32).to_le_bytes()).unwrap()).collect();
        let inputs = (0..regions.len())
            .map(|i| {
                (format!("x{i}"), Tensor { dtype: DType::Float32, shape: vec![1], data: TensorData::Shared(i as u32) })
            })
            .collect();
        let sender = std::thread::spawn(move || {
            RequestEnvelope::new(&request(inputs), regions).send(&ours).unwrap();
            RequestEnvelope::new(&ToWorker::Shutdown, Vec::new()).send(&ours).unwrap();
        });
        let mut reader = RequestReader::new(1 << 20);
        let (message, shared) = reader.receive(&theirs).unwrap().open().unwrap();
        let ToWorker::Run(run) = message else { panic!("expected Run") };
        assert_eq!(run.unit, 7);
        assert_eq!(shared.len(), FDS_PER_MESSAGE + 3);
        for (i, region) in shared.iter().enumerate() {
            assert_eq!(&region[..], &(i as u32).to_le_bytes());
        }
        let (message, shared) = reader.receive(&theirs).unwrap().open().unwrap();
        assert!(matches!(message, ToWorker::Shutdown) && shared.is_empty());
        sender.join().unwrap();
        assert!(matches!(reader.receive(&theirs), Err(FrameError::Closed)));
    }

    /// `n` regions holding `base + i`, and inputs referring to them, plus
    /// one inline input of `inline` bytes.
    fn with_regions(n: usize, base: u32, inline: usize) -> (ToWorker, Vec<SharedMemory>) {
        let regions: Vec<SharedMemory> =
            (0..n).map(|i| SharedMemory::from_bytes(&(base + i as u32).to_le_bytes()).unwrap()).collect();
        let mut inputs: Vec<(String, Tensor)> = (0..n)
            .map(|i| {
                (format!("x{i}"), Tensor { dtype: DType::Float32, shape: vec![1], data: TensorData::Shared(i as u32) })
            })
            .collect();
        inputs.push(("inline".into(), Tensor::dense(DType::UInt8, vec![inline as u64], vec![5; inline])));
        (request(inputs), regions)
    }

    fn values(shared: &[SharedMemory]) -> Vec<u32> {
        shared.iter().map(|s| u32::from_le_bytes(s[..].try_into().unwrap())).collect()
    }

    /// Every request is in the socket before the first read, so reads through
    /// the buffer take the start of the next request and the descriptors
    /// sent with it: each request still gets exactly its own regions.
    #[test]
    fn requests_queued_back_to_back_each_get_their_own_regions() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let sent = vec![
            with_regions(2, 100, 10),
            with_regions(0, 0, 3),
            // Larger than the buffer: read straight into place.
            with_regions(1, 200, STAGE * 2),
            with_regions(FDS_PER_MESSAGE + 3, 1000, 40),
            with_regions(3, 300, 0),
        ];
        let expected: Vec<(ToWorker, Vec<u32>)> = sent.iter().map(|(m, r)| (m.clone(), values(r))).collect();
        let sender = std::thread::spawn(move || {
            for (message, regions) in sent {
                RequestEnvelope::new(&message, regions).send(&ours).unwrap();
            }
            RequestEnvelope::new(&ToWorker::Shutdown, Vec::new()).send(&ours).unwrap();
        });
        // Let all of it queue (the large one blocks the sender until read).
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut reader = RequestReader::new(1 << 20);
        for (message, regions) in &expected {
            let (got, shared) = reader.receive(&theirs).unwrap().open().unwrap();
            assert_eq!(&got, message);
            assert_eq!(&values(&shared), regions);
        }
        let (got, shared) = reader.receive(&theirs).unwrap().open().unwrap();
        assert!(matches!(got, ToWorker::Shutdown) && shared.is_empty());
        assert!(!reader.has_buffered());
        sender.join().unwrap();
        assert!(matches!(reader.receive(&theirs), Err(FrameError::Closed)));
    }

    /// Descriptors that came with a request claiming none are refused, not
    /// kept for a later request.
    #[test]
    fn descriptors_no_request_claims_are_refused() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let region = SharedMemory::from_bytes(b"abcd").unwrap();
        let envelope = RequestEnvelope::new(&ToWorker::Shutdown, Vec::new());
        let mut whole = envelope.header().to_vec();
        whole.extend_from_slice(&envelope.tail());
        send_with_fds(&ours, &whole, &[region.fd().as_raw_fd()], 0).unwrap();
        let error = RequestReader::new(1 << 20).receive(&theirs).err().expect("refused");
        assert!(error.to_string().contains("no request claims"), "{error}");
        // A request claiming more regions than came is refused too.
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (message, regions) = with_regions(2, 0, 1);
        let envelope = RequestEnvelope::new(&message, regions);
        let mut whole = envelope.header().to_vec();
        whole.extend_from_slice(&envelope.tail());
        send_with_fds(&ours, &whole, &[region.fd().as_raw_fd()], 0).unwrap();
        let error = RequestReader::new(1 << 20).receive(&theirs).err().expect("refused");
        assert!(error.to_string().contains("expected 2 shared regions, got 1"), "{error}");
    }
}
