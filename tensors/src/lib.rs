//! Tensor I/O for isorun, apart from any command line: reading `.npy` and
//! `.npz` files (hardened and fuzzed: sizes in a file are never believed
//! before the bytes are there), JSON inputs converted for a signature, JSON
//! values of outputs, splitting inputs into `--batch-size` chunks and joining
//! the outputs back, comparing outputs with golden files, and writing a
//! unit's outputs as `.npy` files.
//!
//! The engine (`isorun-engine`) uses these to feed workers and to handle what
//! they send back; the CLI uses them to read the user's inputs. Nothing here
//! starts a process or prints.

pub mod batch;
pub mod cast;
pub mod golden;
pub mod inputs;
pub mod json_cost;
pub mod json_input;
pub mod json_value;
pub mod npy;
pub mod output;
pub mod pipe;
pub mod values;
