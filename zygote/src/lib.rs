//! The zygote (fork server). Exec'ing a TensorFlow worker costs ~0.2 s and
//! ~290 MB of page faults for the 790 MB libtensorflow every time; a
//! process that has only *loaded* libtensorflow is still single-threaded,
//! so it can fork cheap children that share those pages copy-on-write.
//! TensorFlow is not fork-safe once a session has started threads, so the
//! zygote itself never runs anything: it checks it is single-threaded
//! before every fork, and each child becomes a worker for one unit.
//!
//! The supervisor cannot `wait4` its grandchildren, so the zygote reaps
//! them (after killing what is left of their process group, while the pid
//! cannot yet be reused) and reports each exit with its rusage. It hands
//! the supervisor a pidfd of each child, opened before the child can be
//! reaped, so the supervisor signals processes, never bare pids.
//!
//! Control messages travel on a `SOCK_SEQPACKET` socket (one message per
//! packet), with file descriptors as `SCM_RIGHTS`. Linux only.

pub mod server;
pub mod wire;

/// Environment variable through which the zygote learns its control socket's descriptor.
pub const ENV_ZYGOTE_FD: &str = "ISORUN_ZYGOTE_FD";
