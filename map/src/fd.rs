//! The few descriptor operations the supervisor needs that std lacks:
//! socket pairs, messages carrying descriptors (`SCM_RIGHTS`, how a socket
//! end goes to the zygote and a child's pidfd comes back), pidfds, and
//! `poll`. Kept here so that the rest of the crate holds no `unsafe`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A connected pair of UNIX sockets (close-on-exec): `SOCK_SEQPACKET` keeps
/// message boundaries (the zygote's control channel), `SOCK_STREAM` carries
/// one call's item and result.
pub fn socket_pair(kind: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    if unsafe { libc::socketpair(libc::AF_UNIX, kind | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends one message with descriptors attached.
pub fn send_with_fds(socket: &OwnedFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let space = cmsg_space(fds.len());
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    if !fds.is_empty() {
        header.msg_control = control.as_mut_ptr().cast();
        header.msg_controllen = space as _;
        // SAFETY: the control buffer is CMSG_SPACE for `fds.len()` descriptors.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&header);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast::<RawFd>(), fds.len());
        }
    }
    // SAFETY: a valid socket and header.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &header, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn cmsg_space(count: usize) -> usize {
    // SAFETY: CMSG_SPACE is arithmetic.
    unsafe { libc::CMSG_SPACE((count * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// Receives one message (at most `max` bytes) and the descriptors sent
/// with it (close-on-exec). An empty message is the peer's end.
pub fn recv_with_fds(socket: &OwnedFd, max: usize) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    const MAX_FDS: usize = 4;
    let mut data = vec![0u8; max];
    let space = cmsg_space(MAX_FDS);
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    // SAFETY: as in send_with_fds.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr().cast();
    header.msg_controllen = space as _;
    // SAFETY: a valid socket, header and buffers.
    let received = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut header, libc::MSG_CMSG_CLOEXEC) };
    if received < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `control`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&header);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&header, cmsg);
        }
    }
    if header.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a message longer than {max} bytes")));
    }
    data.truncate(received as usize);
    Ok((data, fds))
}

/// Waits until `socket` has something to read (or its peer is gone), at
/// most `timeout`; true when it has.
pub fn readable(fd: &OwnedFd, timeout: Duration) -> io::Result<bool> {
    let ready = poll(&[fd.as_raw_fd()], timeout)?;
    Ok(ready[0])
}

/// `poll` for input on each descriptor; which ones are ready (or hung up).
pub fn poll(fds: &[RawFd], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut polled: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `polled` is a valid array of pollfd.
    let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as _, millis) };
    if n < 0 {
        let error = io::Error::last_os_error();
        if error.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(error);
    }
    Ok(polled.iter().map(|p| p.revents != 0).collect())
}

/// A pidfd for a child of this process.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: a plain system call.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// SIGKILL through a pidfd: reaches the process the pidfd was opened for,
/// or nobody (never a process that reused its pid).
pub fn kill_pidfd(pidfd: &OwnedFd) {
    // SAFETY: a plain system call on a descriptor we own.
    unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), libc::SIGKILL, std::ptr::null::<u8>(), 0);
    }
}

/// Reaps a child of this process: its wait status and peak resident
/// memory in bytes.
pub fn wait4(pid: u32) -> io::Result<(i32, u64)> {
    let mut status = 0;
    // SAFETY: rusage is plain data, written by wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid pointers to our locals.
        let reaped = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
        if reaped >= 0 {
            return Ok((status, (usage.ru_maxrss.max(0) as u64) * 1024));
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Waits until a child of this process has exited, without reaping it
/// (its pid, and the process group it leads, stay its own until then).
pub fn wait_exited(pid: u32) -> io::Result<()> {
    loop {
        // SAFETY: waitid writes only into info.
        let waited = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT)
        };
        if waited == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// SIGKILL to the process group `leader` leads. Only for a leader that is
/// a child of ours not yet reaped, so the group id cannot name another.
pub fn kill_group(leader: u32) {
    // SAFETY: a plain system call; see above for why the id is still ours.
    unsafe { libc::kill(-(leader as libc::pid_t), libc::SIGKILL) };
}

/// Shuts down the writing half of a stream socket (the peer reads its end).
pub fn shutdown_write(socket: &impl AsRawFd) {
    // SAFETY: a plain system call on a descriptor we own.
    unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_WR) };
}
