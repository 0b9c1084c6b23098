//! `isorun-worker`: started by `isorun`, one process for one model (or a few),
//! so that the operating system takes back everything TensorFlow allocated
//! when the process exits. It finds its socket to the supervisor through
//! `ISORUN_IPC_FD`, which it removes from its environment at once. With
//! `--zygote` it is a fork server instead (`isorun-zygote`), with
//! `--in-process` the benchmark floor (`in_process.rs`), with
//! `--index-symbols LIB DIR` the scan a zygote starts to find oneDNN's
//! sgemm in another libtensorflow build (`symbol_index.rs`), and with
//! `--onednn-warmup` the line `isorun doctor` prints about it.

// `index_of` is for build.rs (and the tests).
#[allow(dead_code)]
mod elf_symbol;
mod in_process;
mod onednn;
mod onnx;
mod serve;
mod symbol_index;
mod tf;
mod warm;

use isorun_protocol::ENV_IPC_FD;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("isorun-worker {} (TensorFlow {})", env!("CARGO_PKG_VERSION"), tf::tensorflow_version());
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("--in-process") {
        let args: Vec<String> = std::env::args().skip(2).collect();
        std::process::exit(in_process::main(&args));
    }
    if std::env::args().nth(1).as_deref() == Some("--index-symbols") {
        let args: Vec<String> = std::env::args().skip(2).collect();
        std::process::exit(symbol_index::main(&args));
    }
    if std::env::args().nth(1).as_deref() == Some("--onednn-warmup") {
        println!("{}", onednn::probe());
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("--zygote") {
        // A fork server: libtensorflow is loaded (linked), nothing else runs.
        // Warm what TensorFlow lets a process warm without starting a thread
        // (the fork server refuses to fork a process with more than one).
        let threads = tf::warm_before_fork();
        if threads != 1 {
            eprintln!("isorun-worker: the zygote has {threads} threads after warming up; it will not fork");
        }
        let code = match take_fd(isorun_zygote::ENV_ZYGOTE_FD) {
            Some(control) => isorun_zygote::server::run_preparing(control, serve_socket, onednn::warm_if_indexed),
            None => {
                eprintln!("isorun-worker: --zygote needs {}", isorun_zygote::ENV_ZYGOTE_FD);
                2
            }
        };
        // SAFETY: _exit ends the process without running destructors, on purpose.
        unsafe { libc::_exit(code) }
    }
    let Some(socket) = take_fd(ENV_IPC_FD) else {
        eprintln!("isorun-worker: started without {ENV_IPC_FD}; it is started by `isorun run`, not by hand");
        std::process::exit(2);
    };
    let code = serve_socket(UnixStream::from(socket));
    // TensorFlow's teardown (thread pools, allocators) is work the operating
    // system does better: leave at once.
    // SAFETY: _exit ends the process without running destructors, on purpose.
    unsafe { libc::_exit(code) }
}

/// The worker's life on its socket to the supervisor; the exit code.
fn serve_socket(socket: UnixStream) -> i32 {
    match serve::serve(socket) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("isorun-worker: {e}");
            1
        }
    }
}

/// The descriptor named by environment variable `name`, which is removed at
/// once; close-on-exec from here on.
fn take_fd(name: &str) -> Option<OwnedFd> {
    let fd = std::env::var(name).ok().and_then(|v| v.parse::<RawFd>().ok())?;
    // SAFETY: single-threaded at this point; nothing else reads the environment.
    unsafe { std::env::remove_var(name) };
    // SAFETY: the supervisor passed this descriptor open, and nothing else owns it.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: as above: ours alone.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}
