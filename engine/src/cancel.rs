//! Cancellation, passed into the engine by its caller: the CLI's signal
//! thread (or an embedder) asks the run to stop; the slots and sessions
//! look at the token between every step. A leaf module, so the executor
//! and the sessions share it without importing each other.

use isorun_protocol::NotRunReason;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};

/// How hard the caller asked the run to stop.
///
/// Three levels, as a person at a terminal would use them: [`drain`]
/// (start nothing new, let running units finish), [`request`] (start
/// nothing new and terminate running workers: SIGTERM, a grace period,
/// SIGKILL) and [`escalate`] (kill them at once).
///
/// [`drain`]: CancelToken::drain
/// [`request`]: CancelToken::request
/// [`escalate`]: CancelToken::escalate
#[derive(Debug, Default)]
pub struct CancelToken {
    level: AtomicU8,
    signal: AtomicI32,
    /// Start nothing new, let running units finish.
    draining: AtomicBool,
}

impl CancelToken {
    /// A token nobody has used yet.
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Stop starting work and terminate the workers (a first Ctrl-C).
    /// `signal` is remembered for the caller's exit code (0 for none, e.g.
    /// a closed stdout); only the first request's signal is kept.
    pub fn request(&self, signal: i32) {
        let _ = self.signal.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
        let _ = self.level.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Kill the workers at once (a second Ctrl-C).
    pub fn escalate(&self) {
        self.level.store(2, Ordering::SeqCst);
    }

    /// Whether a stop was requested.
    pub fn requested(&self) -> bool {
        self.level.load(Ordering::SeqCst) >= 1
    }

    /// Whether workers are to be killed without a grace period.
    pub fn immediate(&self) -> bool {
        self.level.load(Ordering::SeqCst) >= 2
    }

    /// Start nothing new, but let running units finish (`--max-failures`).
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Why no new unit may start, if none may.
    pub fn not_starting(&self) -> Option<NotRunReason> {
        if self.requested() {
            Some(NotRunReason::Interrupted)
        } else if self.draining.load(Ordering::SeqCst) {
            Some(NotRunReason::MaxFailures)
        } else {
            None
        }
    }

    /// The signal of the first stop request (0 when none, or none given).
    pub fn signal(&self) -> i32 {
        self.signal.load(Ordering::SeqCst)
    }
}
