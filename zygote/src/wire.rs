//! The zygote's control messages, fixed little-endian layouts, and
//! `sendmsg`/`recvmsg` with file descriptors.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Supervisor to zygote: fork a worker on these descriptors (IPC socket, stderr).
pub const FORK: u8 = 1;
/// Zygote to supervisor: forked `pid` for `token` (a pidfd attached).
pub const FORKED: u8 = 2;
/// Zygote to supervisor: did not fork for `token`; the reason follows as text.
pub const REFUSED: u8 = 3;
/// Zygote to supervisor: child `pid` exited.
pub const EXITED: u8 = 4;
/// Supervisor to zygote: send `signal` to the process group of the child
/// forked for `token`, if it is not yet reaped (kernels before 6.9, where
/// `pidfd_send_signal` cannot reach a process group).
pub const SIGNAL: u8 = 5;

/// A message of the zygote protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Fork { token: u64 },
    Forked { token: u64, pid: i32 },
    Refused { token: u64, reason: String },
    Exited(ExitReport),
    Signal { token: u64, signal: i32 },
}

/// How a child ended, from the zygote's `wait4`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitReport {
    pub pid: i32,
    /// The raw `wait` status (`WIFSIGNALED` and friends apply).
    pub wait_status: i32,
    pub max_rss_kib: u64,
    pub user_us: u64,
    pub system_us: u64,
}

impl Message {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        match self {
            Message::Fork { token } => {
                out.push(FORK);
                out.extend(token.to_le_bytes());
            }
            Message::Forked { token, pid } => {
                out.push(FORKED);
                out.extend(token.to_le_bytes());
                out.extend(pid.to_le_bytes());
            }
            Message::Refused { token, reason } => {
                out.push(REFUSED);
                out.extend(token.to_le_bytes());
                out.extend(reason.as_bytes());
            }
            Message::Exited(e) => {
                out.push(EXITED);
                out.extend(e.pid.to_le_bytes());
                out.extend(e.wait_status.to_le_bytes());
                out.extend(e.max_rss_kib.to_le_bytes());
                out.extend(e.user_us.to_le_bytes());
                out.extend(e.system_us.to_le_bytes());
            }
            Message::Signal { token, signal } => {
                out.push(SIGNAL);
                out.extend(token.to_le_bytes());
                out.extend(signal.to_le_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Message> {
        let u64_at = |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
        let i32_at = |at: usize| Some(i32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
        match *bytes.first()? {
            FORK if bytes.len() == 9 => Some(Message::Fork { token: u64_at(1)? }),
            FORKED if bytes.len() == 13 => Some(Message::Forked { token: u64_at(1)?, pid: i32_at(9)? }),
            REFUSED if bytes.len() >= 9 => {
                Some(Message::Refused { token: u64_at(1)?, reason: String::from_utf8_lossy(&bytes[9..]).into_owned() })
            }
            EXITED if bytes.len() == 33 => Some(Message::Exited(ExitReport {
                pid: i32_at(1)?,
                wait_status: i32_at(5)?,
                max_rss_kib: u64_at(9)?,
                user_us: u64_at(17)?,
                system_us: u64_at(25)?,
            })),
            SIGNAL if bytes.len() == 13 => Some(Message::Signal { token: u64_at(1)?, signal: i32_at(9)? }),
            _ => None,
        }
    }
}

/// Most descriptors one message carries.
const MAX_FDS: usize = 4;

/// Sends one packet with `fds` attached.
pub fn send(socket: &impl AsRawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS);
    // SAFETY: the iovec and control buffer outlive the call; CMSG macros
    // address only inside `control`.
    unsafe {
        let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
        let mut control = [0u8; 128];
        let mut header: libc::msghdr = std::mem::zeroed();
        header.msg_iov = &mut iov;
        header.msg_iovlen = 1;
        if !fds.is_empty() {
            let payload = std::mem::size_of_val(fds) as u32;
            header.msg_control = control.as_mut_ptr().cast();
            header.msg_controllen = libc::CMSG_SPACE(payload) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&header);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast::<RawFd>(), fds.len());
        }
        loop {
            if libc::sendmsg(socket.as_raw_fd(), &header, libc::MSG_NOSIGNAL) >= 0 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
    }
}

/// Receives one packet and the descriptors attached to it (owned, close-on-exec).
/// `Ok(None)` when the peer has closed the socket.
pub fn receive(socket: &impl AsRawFd) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    // SAFETY: buffers outlive the call; received descriptors are taken into
    // OwnedFd exactly once.
    unsafe {
        let mut buffer = [0u8; 4096];
        let mut iov = libc::iovec { iov_base: buffer.as_mut_ptr().cast(), iov_len: buffer.len() };
        let mut control = [0u8; 128];
        let mut header: libc::msghdr = std::mem::zeroed();
        header.msg_iov = &mut iov;
        header.msg_iovlen = 1;
        header.msg_control = control.as_mut_ptr().cast();
        header.msg_controllen = control.len();
        let n = loop {
            let n = libc::recvmsg(socket.as_raw_fd(), &mut header, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 {
                break n as usize;
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        };
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&header);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count = ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&header, cmsg);
        }
        if n == 0 && fds.is_empty() {
            return Ok(None);
        }
        Ok(Some((buffer[..n].to_vec(), fds)))
    }
}

/// A connected `SOCK_SEQPACKET` pair, close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into fds.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let messages = [
            Message::Fork { token: 7 },
            Message::Forked { token: 7, pid: 1234 },
            Message::Refused { token: 7, reason: "3 threads".into() },
            Message::Exited(ExitReport { pid: 1, wait_status: 9, max_rss_kib: 2, user_us: 3, system_us: 4 }),
            Message::Signal { token: 7, signal: 15 },
        ];
        for m in messages {
            assert_eq!(Message::decode(&m.encode()), Some(m));
        }
        assert_eq!(Message::decode(&[]), None);
        assert_eq!(Message::decode(&[FORKED, 1, 2]), None);
        assert_eq!(Message::decode(&[99; 9]), None);
    }

    #[test]
    fn descriptors_travel_with_the_packet() {
        let (a, b) = seqpacket_pair().unwrap();
        let (pipe_r, _pipe_w) = {
            let mut fds = [0; 2];
            unsafe { libc::pipe(fds.as_mut_ptr()) };
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
        };
        send(&a, &Message::Fork { token: 1 }.encode(), &[pipe_r.as_raw_fd()]).unwrap();
        let (bytes, fds) = receive(&b).unwrap().unwrap();
        assert_eq!(Message::decode(&bytes), Some(Message::Fork { token: 1 }));
        assert_eq!(fds.len(), 1);
        drop(a);
        assert!(receive(&b).unwrap().is_none(), "closed peer");
    }
}
