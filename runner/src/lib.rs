//! `isorun`, the supervisor: it finds SavedModels, starts one short-lived
//! `isorun-worker` per model (or per N models), sends the inputs, collects
//! the outputs and reports how every unit ended. It never loads TensorFlow
//! itself, so its own memory stays small and flat however many models run.

pub mod batch;
pub mod cli;
pub mod config;
pub mod discover;
pub mod doctor;
pub mod executor;
pub mod golden;
pub mod gpu;
pub mod inputs;
pub mod inspect;
pub mod journal;
pub mod json_input;
pub mod locate;
pub mod ls;
pub mod npy;
pub mod output;
pub mod pipe;
pub mod process;
pub mod record;
pub mod report;
pub mod run;
pub mod session;
pub mod shard;
pub mod size;
pub mod slurm;
pub mod values;
pub mod zygote;
