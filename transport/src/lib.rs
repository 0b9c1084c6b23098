//! How messages cross the process boundary, and why in two different ways.
//!
//! Worker to supervisor: length-prefixed frames of `bincode` 2 over a Unix
//! socket the supervisor created and the worker inherited. A worker runs
//! untrusted models and may be broken or hostile, and `ipc-channel`'s own
//! receive path believes the sizes a peer claims (an allocation of a claimed
//! terabyte aborts the process) and unwraps on malformed fragments. Here every
//! frame length is capped, memory grows only with bytes that really arrive,
//! and bincode decodes under a limit and must consume the whole frame.
//!
//! Supervisor to worker: `ipc-channel`, whose messages can carry
//! `IpcSharedMemory` regions, so a large input tensor is written once and
//! mapped by every worker instead of being copied through a socket. The
//! worker trusts its supervisor, so nothing is lost by its looser checks.

mod envelope;
mod frame;

pub use envelope::{dense_bytes, RequestEnvelope, SHARED_THRESHOLD};
pub use frame::{decode, encode, read_frame, write_frame, FrameError, DEFAULT_MAX_FRAME};
