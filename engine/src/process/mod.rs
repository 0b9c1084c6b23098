//! Worker processes seen from the supervisor: how they are started (exec'd,
//! or forked by a per-slot zygote), watched, signalled and reaped. Linux only.

mod connection;
mod spec;
mod stderr;
mod worker;
mod zygote;

pub use connection::WorkerEvent;
pub use spec::{library_path, onnxruntime_telemetry, worker_version, SpawnSpec};
pub use worker::{
    is_tensorflow_banner, memory_fields, pidfd_signals_process_group, set_child_safety, Exit, ExitStatus,
    WorkerProcess, DEFAULT_REAP_TIMEOUT,
};
pub use zygote::Zygote;
