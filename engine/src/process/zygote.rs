//! The supervisor's side of the zygote (fork server, see `isorun-zygote`):
//! one zygote per slot, started as `isorun-worker --zygote`, asked to fork a
//! worker for each unit on descriptors the supervisor made (the worker's
//! IPC socket and its own stderr pipe). A reader thread collects the
//! zygote's answers and the exit reports of its children, which the
//! supervisor cannot `wait4` itself.
//!
//! Nothing is kept for nobody: a fork reply that comes after its fork gave
//! up is dropped (and the child killed), as is the exit report of a worker
//! whose reaping gave up. The zygote's stderr is kept (its last lines), so
//! that a zygote that dies says why.

use super::spec::{worker_environment, SpawnSpec};
use super::stderr::{collect_stderr, StderrTail};
use isorun_zygote::wire::{receive, send, seqpacket_pair, ExitReport, Message};
use isorun_zygote::ENV_ZYGOTE_FD;
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a fork may take before the zygote is taken for dead.
const FORK_TIMEOUT: Duration = Duration::from_secs(10);

enum Reply {
    Forked(i32, OwnedFd),
    Refused(String),
}

#[derive(Default)]
struct State {
    replies: HashMap<u64, Reply>,
    exits: HashMap<i32, ExitReport>,
    /// Forks nobody waits for any more (they timed out).
    abandoned_forks: HashSet<u64>,
    /// Workers whose exit nobody waits for any more (their reaping timed out).
    forgotten_exits: HashSet<i32>,
    dead: bool,
}

impl State {
    /// Takes in one message from the zygote; what nobody waits for is dropped.
    fn accept(&mut self, message: Message, pidfd: Option<OwnedFd>) {
        match (message, pidfd) {
            (Message::Forked { token, pid }, Some(pidfd)) => {
                if self.abandoned_forks.remove(&token) {
                    // Too late: nobody will talk to this worker. Kill it, and expect no one to reap it.
                    kill_through_pidfd(&pidfd);
                    self.forgotten_exits.insert(pid);
                } else {
                    self.replies.insert(token, Reply::Forked(pid, pidfd));
                }
            }
            (Message::Refused { token, reason }, _) => {
                if !self.abandoned_forks.remove(&token) {
                    self.replies.insert(token, Reply::Refused(reason));
                }
            }
            (Message::Exited(report), _) => {
                if !self.forgotten_exits.remove(&report.pid) {
                    self.exits.insert(report.pid, report);
                }
            }
            _ => self.dead = true,
        }
    }
}

/// SIGKILL to the process of `pidfd` (the zygote kills the rest of its group as it reaps it).
fn kill_through_pidfd(pidfd: &OwnedFd) {
    // SAFETY: no siginfo is passed; the kernel checks the descriptor is a pidfd.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// A running zygote.
pub struct Zygote {
    process: Child,
    control: OwnedFd,
    shared: Arc<Shared>,
    tokens: AtomicU64,
    /// The zygote's last stderr lines, and whether its stderr has ended.
    stderr: Arc<Mutex<StderrTail>>,
    stderr_ended: Arc<AtomicBool>,
}

impl Zygote {
    /// Starts `WORKER --zygote`. Like a worker, it dies with the thread that
    /// started it (`PR_SET_PDEATHSIG`), and its children die with it.
    pub fn start(spec: &SpawnSpec) -> io::Result<Zygote> {
        let (ours, theirs) = seqpacket_pair()?;
        let theirs_fd = theirs.as_raw_fd();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        let mut command = Command::new(&spec.worker);
        command
            .arg("--zygote")
            .args(&spec.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0);
        worker_environment(&mut command, spec);
        command.env(ENV_ZYGOTE_FD, "3");
        // Where it finds oneDNN's sgemm in a libtensorflow that is not the
        // build the worker linked (the environment may have been cleared).
        if let Some(dir) = crate::locate::symbol_cache_dir() {
            command.env(isorun_protocol::ENV_SYMBOL_CACHE, dir);
        }
        // Resolve every symbol of libtensorflow once, in the zygote: its
        // children inherit the bound tables instead of each paying the
        // dynamic linker's lazy binding (~10% of a forked worker's CPU).
        command.env("LD_BIND_NOW", "1");
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if theirs_fd == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0);
                } else if libc::dup2(theirs_fd, 3) < 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let mut process = command.spawn()?;
        drop(theirs);
        let stderr = Arc::new(Mutex::new(StderrTail::default()));
        let stderr_ended = Arc::new(AtomicBool::new(false));
        if let Some(pipe) = process.stderr.take() {
            let (tail, ended) = (Arc::clone(&stderr), Arc::clone(&stderr_ended));
            std::thread::Builder::new().name("zygote-stderr".into()).spawn(move || {
                collect_stderr(pipe, &tail);
                ended.store(true, Ordering::SeqCst);
            })?;
        }
        let shared = Arc::new(Shared::default());
        let reader = ours.try_clone()?;
        let reader_shared = Arc::clone(&shared);
        std::thread::Builder::new().name("zygote-reader".into()).spawn(move || read_replies(reader, &reader_shared))?;
        Ok(Zygote { process, control: ours, shared, tokens: AtomicU64::new(0), stderr, stderr_ended })
    }

    /// The zygote's last stderr lines, joined (empty if it wrote none). Asked
    /// when a fork failed, so the zygote is dying: waits a little (500 ms at
    /// most) for the last of its stderr to be read, also while it is not yet
    /// reaped (a fork request can meet a closed socket before then).
    pub fn stderr_tail(&self) -> String {
        let deadline = Instant::now() + Duration::from_millis(500);
        while !self.stderr_ended.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stderr.lock().map(|t| t.lines().join(" | ")).unwrap_or_default()
    }

    /// False once the zygote has closed its side.
    pub fn alive(&self) -> bool {
        !self.shared.state.lock().map(|s| s.dead).unwrap_or(true)
    }

    /// Forks a worker on `ipc` (its socket to the supervisor) and `stderr`;
    /// returns its pid, a pidfd for it, and the fork's token (which names it to `signal_group`).
    pub fn fork(&self, ipc: OwnedFd, stderr: OwnedFd) -> io::Result<(i32, OwnedFd, u64)> {
        let token = self.tokens.fetch_add(1, Ordering::SeqCst);
        send(&self.control, &Message::Fork { token }.encode(), &[ipc.as_raw_fd(), stderr.as_raw_fd()])?;
        drop((ipc, stderr));
        let deadline = Instant::now() + FORK_TIMEOUT;
        let mut state = self.shared.state.lock().map_err(|_| io::Error::other("zygote state poisoned"))?;
        loop {
            if let Some(reply) = state.replies.remove(&token) {
                return match reply {
                    Reply::Forked(pid, pidfd) => Ok((pid, pidfd, token)),
                    Reply::Refused(reason) => Err(io::Error::other(format!("the zygote refused to fork: {reason}"))),
                };
            }
            let now = Instant::now();
            if state.dead {
                return Err(io::Error::other("the zygote is gone"));
            }
            if now >= deadline {
                // A reply may still come: it is then dropped, and its worker killed.
                state.abandoned_forks.insert(token);
                return Err(io::Error::other(format!("the zygote did not answer a fork within {FORK_TIMEOUT:?}")));
            }
            state =
                self.shared.changed.wait_timeout(state, deadline - now).map_err(|_| io::Error::other("poisoned"))?.0;
        }
    }

    /// Asks the zygote to send `signal` to the process group of the child
    /// forked for `token` (where pidfds cannot reach a group, before Linux
    /// 6.9). Race-free: the zygote signals only a child it has not reaped.
    pub fn signal_group(&self, token: u64, signal: i32) -> io::Result<()> {
        send(&self.control, &Message::Signal { token, signal }.encode(), &[])
    }

    /// Nobody will wait for the exit report of child `pid`: drop it when it comes.
    pub fn forget_exit(&self, pid: i32) {
        if let Ok(mut state) = self.shared.state.lock() {
            if state.exits.remove(&pid).is_none() {
                state.forgotten_exits.insert(pid);
            }
        }
    }

    /// The exit report of child `pid`, waiting up to `timeout`; `None` if the zygote died first.
    pub fn wait_exit(&self, pid: i32, timeout: Duration) -> Option<ExitReport> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.state.lock().ok()?;
        loop {
            if let Some(report) = state.exits.remove(&pid) {
                return Some(report);
            }
            let now = Instant::now();
            if state.dead || now >= deadline {
                return None;
            }
            state = self.shared.changed.wait_timeout(state, deadline - now).ok()?.0;
        }
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // Closing the control socket ends the zygote; make sure, and reap it.
        // SAFETY: our own child, not yet reaped.
        unsafe { libc::kill(self.process.id() as i32, libc::SIGKILL) };
        let _ = self.process.wait();
    }
}

fn read_replies(control: OwnedFd, shared: &Shared) {
    loop {
        let message = match receive(&control) {
            Ok(Some((bytes, mut fds))) => Message::decode(&bytes).map(|m| (m, fds.pop())),
            _ => None,
        };
        let Ok(mut state) = shared.state.lock() else { return };
        match message {
            Some((message, pidfd)) => state.accept(message, pidfd),
            None => state.dead = true,
        }
        let dead = state.dead;
        shared.changed.notify_all();
        if dead {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_zygote::wire::ExitReport;

    fn exit_of(pid: i32) -> Message {
        Message::Exited(ExitReport { pid, wait_status: 0, max_rss_kib: 0, user_us: 0, system_us: 0 })
    }

    fn a_pidfd() -> OwnedFd {
        // A pidfd of a short-lived child of ours, to stand for a forked worker.
        let child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        // SAFETY: pidfd_open of our own child; the descriptor is owned at once.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id() as libc::c_int, 0) };
        assert!(fd >= 0);
        std::mem::forget(child);
        // SAFETY: a new descriptor, owned here.
        unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) }
    }

    #[test]
    fn late_replies_and_exit_reports_nobody_waits_for_are_not_kept() {
        let mut state = State::default();
        // Replies someone waits for are kept.
        state.accept(Message::Refused { token: 1, reason: "no".into() }, None);
        state.accept(exit_of(100), None);
        assert_eq!((state.replies.len(), state.exits.len()), (1, 1));
        // A fork that timed out: its late answers are dropped.
        state.abandoned_forks.extend([2, 3]);
        state.accept(Message::Refused { token: 2, reason: "late".into() }, None);
        state.accept(Message::Forked { token: 3, pid: 300 }, Some(a_pidfd()));
        assert_eq!(state.replies.len(), 1, "late fork replies are dropped");
        assert!(state.abandoned_forks.is_empty());
        // The late worker's exit, and that of one whose reaping gave up, are dropped too.
        state.forgotten_exits.insert(200);
        state.accept(exit_of(300), None);
        state.accept(exit_of(200), None);
        assert_eq!(state.exits.len(), 1, "exit reports nobody waits for are dropped");
        assert!(state.forgotten_exits.is_empty());
        assert!(!state.dead);
    }
}
