//! `isorun-engine` runs TensorFlow SavedModels in short-lived worker
//! processes, so that the operating system, not TensorFlow, gives the
//! memory back, and so that nothing a model does — crash, hang, memory
//! blow-up, absurd output — can stop the caller or cost another model's
//! result.
//!
//! It is the library under the `isorun` command line, for any Rust program
//! that runs many models. It never loads TensorFlow itself: each unit (one
//! model run with the inputs) runs in an `isorun-worker` process, forked
//! from a per-slot zygote that has loaded libtensorflow once (or exec'd),
//! sandboxed, watched against deadlines and a memory limit, and reaped.
//! The engine prints nothing and installs no signal handlers: it reports
//! through an [`Event`] callback, takes cancellation as a [`CancelToken`],
//! and hands each unit's outputs to an [`OutputSink`] of the caller's.
//!
//! - [`discover`] finds SavedModels and Keras files in folders (Keras
//!   files are exported to SavedModels in a sandboxed Python process first,
//!   and cached: [`keras`]); [`Settings::builder`]
//!   says how to run them; [`Engine::new`] checks the settings;
//!   [`Engine::run`] runs every model, [`Event::Finished`] carrying each
//!   unit's [`UnitReport`] (its closed [`Outcome`], timings, peak memory,
//!   attempts).
//! - [`Engine::run_feed`] runs every model on a stream of batches from a
//!   [`Feed`] (what `isorun eval` uses): one worker per unit serves batch
//!   after batch, and the feed scores each batch's outputs.
//! - [`WorkerSession`] keeps one worker serving request after request
//!   (what `isorun pipe` uses).
//! - Tensor files and values are `isorun-tensors`; records and reports
//!   `isorun-report`; the messages and the [`Outcome`] enum
//!   `isorun-protocol`.
//!
//! The API is not covered by semver: it changes with the CLI's needs.
//!
//! # Example
//!
//! Run every model under a folder on one input file and print how each
//! ended (`cargo run -p isorun-engine --example embed -- MODELS INPUTS.npz`):
//!
//! ```no_run
#![doc = include_str!("../examples/embed.rs")]
//! ```

mod attempt;
mod cancel;
mod discover;
mod dispatcher;
mod engine;
mod event;
mod executor;
mod feed;
mod frozen_check;
mod gpu;
mod inputs;
pub mod keras;
mod locate;
mod onnx;
mod process;
mod queue;
mod reaper;
mod session;
mod settings;
mod sink;
mod spare;
mod unit;
mod worker_session;

pub use cancel::CancelToken;
pub use discover::{discover, is_saved_model, latest_versions, DiscoverError, Model, ModelFormat};
pub use engine::{Engine, RunSummary, SetupError};
pub use event::Event;
pub use feed::{Feed, FeedStream, FeedSummary, StreamReport};
pub use inputs::{signature_here, PreparedInputs};
pub use isorun_protocol::Outcome;
pub use onnx::{external_data_files, onnx_not_runnable, onnx_read_paths, onnxruntime, runtime_for_path};
pub use process::{
    library_path, memory_fields, onnxruntime_telemetry, pidfd_signals_process_group, worker_version, SpawnSpec,
};
pub use session::{check_outputs, MAX_RANK};
pub use settings::{Settings, SettingsBuilder, SpawnMode, STATUSES};
pub use sink::{Discard, OutputSink, Sinks, WriteNpy};
pub use unit::{Attempt, OutputInfo, Phases, SpareReport, UnitReport};
pub use worker_session::{Answer, WorkerSession};

/// GPU devices: `--gpus` lists, NVML, per-unit GPU memory.
pub mod gpus {
    pub use crate::gpu::{describe, nvidia_devices_present, nvml, parse_gpus, resolve, GpuList, GpuReturn};
}

/// Where the worker binary, libtensorflow and ONNX Runtime are.
pub mod locations {
    pub use crate::locate::{
        default_libtensorflow_dir, default_libtensorflow_dir_for, default_onnxruntime_dir, find_libtensorflow,
        find_onnxruntime, libtensorflow_dir, onnxruntime_api_version, onnxruntime_library, python_prefixes,
        site_packages_folders, symbol_cache_dir, tensorflow_package, worker_binary, FoundLibtensorflow,
        FoundOnnxruntime, LibtensorflowNotFound, LibtensorflowOrigin, OnnxruntimeNotFound, OnnxruntimeOrigin,
        OnnxruntimePackage, TensorflowPackage, ENV_ONNXRUNTIME_DIR, ONNXRUNTIME_VERSION, TENSORFLOW_VERSION,
    };
}
