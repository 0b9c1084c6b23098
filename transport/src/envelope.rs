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

use crate::frame::{decode, encode, read_frame_bytes, write_frame_bytes, FrameError};
use crate::shared::SharedMemory;
use isorun_protocol::{Tensor, TensorData, ToWorker};
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

    /// Reads one request from the supervisor (the worker side). `Closed`
    /// when the supervisor has gone away between requests.
    pub fn receive(socket: &UnixStream, max_frame: u64) -> Result<RequestEnvelope, FrameError> {
        let mut header = [0u8; 8];
        let mut fds = Vec::new();
        let got = receive_with_fds(socket, &mut header, &mut fds)?;
        if got == 0 {
            return Err(FrameError::Closed);
        }
        if got < header.len() {
            return Err(FrameError::Truncated { received: got as u64, expected: header.len() as u64 });
        }
        let magic: [u8; 4] = header[..4].try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let count = u32::from_le_bytes(header[4..].try_into().expect("4 bytes")) as usize;
        while fds.len() < count {
            let mut plus = [0u8; 1];
            let before = fds.len();
            if receive_with_fds(socket, &mut plus, &mut fds)? != 1 || plus != *b"+" || fds.len() == before {
                return Err(FrameError::Decode(format!("expected {count} shared regions, got {}", fds.len())));
            }
        }
        if fds.len() != count {
            return Err(FrameError::Decode(format!("expected {count} shared regions, got {}", fds.len())));
        }
        let mut reader = socket;
        let mut views = vec![0u8; count * 16];
        io::Read::read_exact(&mut reader, &mut views).map_err(FrameError::Io)?;
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
        let message = read_frame_bytes(&mut reader, max_frame)?;
        Ok(RequestEnvelope { message, shared })
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

/// `recvmsg` into all of `buf` (fewer bytes only at the end of the
/// stream), collecting the descriptors that come with them into `fds`.
fn receive_with_fds(socket: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<usize, FrameError> {
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE((FDS_PER_MESSAGE * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut filled = 0;
    while filled < buf.len() {
        let mut iov = libc::iovec { iov_base: buf[filled..].as_mut_ptr().cast(), iov_len: buf.len() - filled };
        // SAFETY: a zeroed msghdr is valid; the fields set below point at live buffers.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space as _;
        // SAFETY: message points at live buffers for the whole call.
        let got = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC) };
        if got < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(FrameError::Io(error));
        }
        // SAFETY: walking the control messages the kernel wrote.
        unsafe {
            let mut header = libc::CMSG_FIRSTHDR(&message);
            while !header.is_null() {
                if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(header).cast::<RawFd>();
                    let count = ((*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                    for i in 0..count {
                        fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                header = libc::CMSG_NXTHDR(&message, header);
            }
        }
        if message.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(FrameError::Decode("shared regions were cut off (too many open files?)".into()));
        }
        if got == 0 {
            break;
        }
        filled += got as usize;
    }
    Ok(filled)
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
        let (message, shared) = RequestEnvelope::receive(&theirs, 1 << 20).unwrap().open().unwrap();
        let ToWorker::Run(run) = message else { panic!("expected Run") };
        assert_eq!(run.unit, 7);
        assert_eq!(shared.len(), FDS_PER_MESSAGE + 3);
        for (i, region) in shared.iter().enumerate() {
            assert_eq!(&region[..], &(i as u32).to_le_bytes());
        }
        let (message, shared) = RequestEnvelope::receive(&theirs, 1 << 20).unwrap().open().unwrap();
        assert!(matches!(message, ToWorker::Shutdown) && shared.is_empty());
        sender.join().unwrap();
        assert!(matches!(RequestEnvelope::receive(&theirs, 1 << 20), Err(FrameError::Closed)));
    }
}
