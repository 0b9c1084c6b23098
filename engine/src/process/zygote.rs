//! The supervisor's side of the zygote (fork server, see `isorun-zygote`):
//! one zygote per slot, started as `isorun-worker --zygote`, asked to fork a
//! worker for each unit on descriptors the supervisor made (the worker's
//! IPC socket and its own stderr pipe). A reader thread collects the
//! zygote's answers and the exit reports of its children, which the
//! supervisor cannot `wait4` itself.

use super::spec::{worker_environment, SpawnSpec};
use isorun_zygote::wire::{receive, send, seqpacket_pair, ExitReport, Message};
use isorun_zygote::ENV_ZYGOTE_FD;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
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
    dead: bool,
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
            .stderr(Stdio::null())
            .process_group(0);
        worker_environment(&mut command, spec);
        command.env(ENV_ZYGOTE_FD, "3");
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
        let process = command.spawn()?;
        drop(theirs);
        let shared = Arc::new(Shared::default());
        let reader = ours.try_clone()?;
        let reader_shared = Arc::clone(&shared);
        std::thread::Builder::new().name("zygote-reader".into()).spawn(move || read_replies(reader, &reader_shared))?;
        Ok(Zygote { process, control: ours, shared, tokens: AtomicU64::new(0) })
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
            if state.dead || now >= deadline {
                return Err(io::Error::other("the zygote is gone"));
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
            Some((Message::Forked { token, pid }, Some(pidfd))) => {
                state.replies.insert(token, Reply::Forked(pid, pidfd));
            }
            Some((Message::Refused { token, reason }, _)) => {
                state.replies.insert(token, Reply::Refused(reason));
            }
            Some((Message::Exited(report), _)) => {
                state.exits.insert(report.pid, report);
            }
            _ => {
                state.dead = true;
                shared.changed.notify_all();
                return;
            }
        }
        shared.changed.notify_all();
    }
}
