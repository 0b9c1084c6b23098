//! An export process's handle: killed with its group and reaped when
//! dropped, its scratch folder removed with it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// An export process started and not yet supervised to its end: dropped
/// before then (an interrupt while it waited its turn), it is killed with
/// its group and reaped; its scratch folder goes with it either way.
pub(super) struct Started {
    pub(super) child: std::process::Child,
    /// Held while the process waits its turn; dropped to let it go on (the
    /// request's writer closes its stdin).
    pub(super) go: Option<mpsc::Sender<()>>,
    /// Started before its turn, while the process before it worked.
    pub(super) early: bool,
    /// Each line with when it was read (a process started early says hello before its turn).
    pub(super) lines: mpsc::Receiver<Option<(Instant, String)>>,
    /// When it was spawned: the start of its `process_start`.
    pub(super) spawned: Instant,
    pub(super) stderr_tail: std::sync::Arc<std::sync::Mutex<VecDeque<String>>>,
    pub(super) scratch: PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        kill_group(&mut self.child);
        remove_scratch(&self.scratch);
    }
}

/// Kills an export process with its group (it leads one of its own) and
/// reaps it. A child already reaped is not signalled: `try_wait` answers
/// from its kept status, and its group id may be another process's by now.
pub(super) fn kill_group(child: &mut std::process::Child) -> Option<std::process::ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    // SAFETY: the child is not reaped yet, so its group id is still ours to signal.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    child.wait().ok()
}

/// Removes a process's scratch folder (its home and temporary files).
pub(super) fn remove_scratch(scratch: &std::path::Path) {
    let _ = std::fs::remove_dir_all(scratch.join("home"));
    let _ = std::fs::remove_dir_all(scratch.join("tmp"));
    let _ = std::fs::remove_dir(scratch);
}

pub(super) fn wait_for(child: &mut std::process::Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
