//! How messages cross the process boundary: both ways on the one Unix
//! socket the supervisor created and the worker inherited.
//!
//! Worker to supervisor: length-prefixed frames of `bincode` 2. A worker runs
//! untrusted models and may be broken or hostile, and `ipc-channel`'s own
//! receive path believes the sizes a peer claims (an allocation of a claimed
//! terabyte aborts the process) and unwraps on malformed fragments. Here every
//! frame length is capped, memory grows only with bytes that really arrive,
//! and bincode decodes under a limit and must consume the whole frame.
//!
//! Supervisor to worker: the same frames, preceded by sealed `memfd`
//! regions passed as descriptors (`envelope.rs`, `shared.rs`), so a large
//! input tensor is written once and mapped by every worker instead of being
//! copied through the socket. Because requests go down the socket the
//! supervisor created, it never connects to anything a worker names (as it
//! once connected to the `ipc-channel` server a worker's `Hello` named), and
//! a sandboxed worker needs no new socket after it starts.

mod envelope;
mod frame;
mod inbox;
mod mailbox;
mod nonblocking;
mod shared;

pub use envelope::{dense_bytes, RequestEnvelope, RequestReader, FDS_PER_MESSAGE, SHARED_THRESHOLD};
pub use frame::{decode, encode, read_frame, write_frame, FrameError, DEFAULT_MAX_FRAME};
pub use inbox::Inbox;
pub use mailbox::{Mailbox, Relax, MAILBOX_AREA};
pub use nonblocking::{wait_readable, FrameReader, SendProgress};
pub use shared::SharedMemory;
