//! `isorun-worker`: started by `isorun`, one process for one model (or a few),
//! so that the operating system takes back everything TensorFlow allocated
//! when the process exits. It finds its socket to the supervisor through
//! `ISORUN_IPC_FD`, which it removes from its environment at once.

mod serve;
mod tf;
mod validate;

use isorun_protocol::ENV_IPC_FD;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("isorun-worker {} (TensorFlow {})", env!("CARGO_PKG_VERSION"), tf::tensorflow_version());
        return;
    }
    let Some(fd) = std::env::var(ENV_IPC_FD).ok().and_then(|v| v.parse::<RawFd>().ok()) else {
        eprintln!("isorun-worker: started without {ENV_IPC_FD}; it is started by `isorun run`, not by hand");
        std::process::exit(2);
    };
    // SAFETY: single-threaded at this point; nothing else reads the environment.
    unsafe { std::env::remove_var(ENV_IPC_FD) };
    // SAFETY: the supervisor passed this descriptor open, and nothing else owns it.
    let socket = unsafe { UnixStream::from_raw_fd(fd) };
    // SAFETY: fcntl on a descriptor this process owns.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let code = match serve::serve(socket) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("isorun-worker: {e}");
            1
        }
    };
    // TensorFlow's teardown (thread pools, allocators) is work the operating
    // system does better: leave at once.
    // SAFETY: _exit ends the process without running destructors, on purpose.
    unsafe { libc::_exit(code) }
}
