//! Integration tests: every test drives the real `isorun` binary, with the
//! real worker on models made by Python TensorFlow, or with the
//! fault-injection worker for the failures a real worker can have.

mod bad_input;
mod commands;
mod config;
mod data_formats;
mod data_jsonl;
mod data_shards;
mod eval;
mod eval_ci;
mod faults;
mod fixtures;
mod gate;
mod gpu;
mod help;
mod hostile;
mod input_checks;
mod keras;
mod lifecycle;
mod map;
mod messages;
mod nightly;
mod nightly_surprises;
mod old_kernels;
mod onednn_warmup;
mod onnx;
mod output_files;
mod outputs;
mod phases;
mod pipe;
mod predictions;
mod readme;
mod report_table;
mod reports;
mod run_cli;
mod sandbox;
mod slurm;
mod slurm_data_shards;
mod soak;
mod spares;
mod tf1;
mod usage;
mod util;
mod warmup;
