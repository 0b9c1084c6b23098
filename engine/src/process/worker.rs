//! A worker process, seen from the supervisor: how it is started (its own
//! process group, killed with the supervisor, first in line for the OOM
//! killer), how its messages, stderr and exit are collected without ever
//! blocking the supervisor on it, and how it is stopped (SIGTERM to the
//! group, a grace period, SIGKILL). Linux only.
//!
//! A forked worker is signalled through its pidfd with
//! `PIDFD_SIGNAL_PROCESS_GROUP` where the kernel has it (Linux 6.9); older
//! kernels refuse the flag (EINVAL) and would signal nothing, so there the
//! zygote, which has not reaped the worker, kills its group on request.

use super::connection::{Connection, WorkerEvent};
use super::spec::{worker_environment, SpawnSpec};
use super::stderr::{collect_stderr, StderrTail};
use super::zygote::Zygote;
use crate::gpu::{GpuReturn, GpuWatch};
use isorun_protocol::ENV_IPC_FD;
use isorun_transport::RequestEnvelope;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// How a worker process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal {
        signal: i32,
        core_dumped: bool,
    },
    /// Not reaped within the reap timeout after SIGKILL (a process in
    /// uninterruptible sleep: a GPU driver, NFS); a background thread (or
    /// the zygote) reaps it whenever it dies, and nobody waits for that.
    Unreaped,
}

impl Exit {
    /// The exit of a worker that was not reaped in time: nothing measured.
    fn unreaped() -> Exit {
        Exit { status: ExitStatus::Unreaped, max_rss_bytes: 0, user: Duration::ZERO, system: Duration::ZERO }
    }
}

/// How long a killed worker may take to be reaped, unless the settings say otherwise.
pub const DEFAULT_REAP_TIMEOUT: Duration = Duration::from_secs(10);

/// A reaped worker: its status and resource usage.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    pub status: ExitStatus,
    pub max_rss_bytes: u64,
    pub user: Duration,
    pub system: Duration,
}

pub use isorun_protocol::is_tensorflow_banner;

/// A running (or finished) worker.
pub struct WorkerProcess {
    pub pid: i32,
    connection: Connection,
    stderr: Arc<Mutex<StderrTail>>,
    exit: Option<Exit>,
    kind: Kind,
    /// What the worker said of its sandbox (`Sandboxed`), if anything.
    sandbox: Option<(Vec<String>, Vec<String>)>,
    /// How long its sandbox's steps took, as it said (microseconds).
    sandbox_steps: Vec<(String, u64)>,
    /// Its GPU memory, watched through NVML (`--gpus`, where NVML is present).
    gpu: Option<GpuWatch>,
    /// How long reaping may wait after SIGKILL.
    reap_timeout: Duration,
}

/// How a worker was started, which decides how it is signalled and reaped.
enum Kind {
    /// Exec'd by the supervisor: its child, signalled by process group, reaped with `wait4`.
    Exec(#[expect(dead_code, reason = "held so the handle lives as long as the worker")] Child),
    /// Forked by a zygote: signalled through a pidfd (or, before Linux 6.9,
    /// through the zygote, by the fork's `token`), reaped by the zygote.
    Forked { pidfd: OwnedFd, zygote: Arc<Zygote>, token: u64 },
}

/// Between fork and exec of a supervised child: killed when the
/// supervisor's forking thread exits (`PR_SET_PDEATHSIG`), gone at once if
/// the supervisor already died, first in line for the OOM killer.
///
/// # Safety
/// Only between fork and exec: makes async-signal-safe system calls only.
unsafe fn arm_child(parent: libc::pid_t) -> io::Result<()> {
    // SAFETY: async-signal-safe calls with valid arguments.
    unsafe {
        // A session of its own (which also leads a process group of its
        // own and drops the controlling terminal): a child in the
        // supervisor's session could move into the supervisor's group, or
        // the user's shell's, with `setpgid` and signal it with
        // `kill(0, ...)`, which the seccomp signal filter must allow (a
        // worker signals its own group). The sandbox then refuses
        // `setpgid` and `setsid`, so it cannot leave this session either.
        if libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::getppid() != parent {
            // The supervisor died before the death signal was armed.
            libc::_exit(1);
        }
        let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, b"1000".as_ptr().cast(), 4);
            libc::close(fd);
        }
    }
    Ok(())
}

/// Arms a command for another supervised child (the Keras export process)
/// as workers are: see [`arm_child`] (which puts it in a session of its
/// own: the caller must not also set a process group); it must be spawned
/// from a thread that outlives it.
pub fn set_child_safety(command: &mut Command) {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe system calls.
    unsafe {
        command.pre_exec(move || arm_child(parent));
    }
}

impl WorkerProcess {
    /// Starts a worker. Must be called from a thread that outlives the
    /// worker: `PR_SET_PDEATHSIG` fires when the thread that forked exits.
    pub fn spawn(spec: &SpawnSpec) -> io::Result<WorkerProcess> {
        let (ours, theirs) = UnixStream::pair()?;
        let theirs_fd = theirs.as_raw_fd();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        let mut command = Command::new(&spec.worker);
        command.args(&spec.args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        worker_environment(&mut command, spec);
        command.env(ENV_IPC_FD, "3");
        // SAFETY: the closure runs between fork and exec and only makes
        // async-signal-safe system calls.
        unsafe {
            command.pre_exec(move || {
                if theirs_fd == 3 {
                    if libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(theirs_fd, 3) < 0 {
                    return Err(io::Error::last_os_error());
                }
                arm_child(parent)
            });
        }
        let mut child = command.spawn()?;
        drop(theirs);
        let pid = child.id() as i32;
        WorkerProcess::watch(pid, ours, child.stderr.take().map(Into::into), spec.max_frame, Kind::Exec(child))
    }

    /// Forks a worker from `zygote` (which must have been started from a
    /// thread that outlives it, as `spawn` requires).
    pub fn spawn_forked(zygote: &Arc<Zygote>, spec: &SpawnSpec) -> io::Result<WorkerProcess> {
        let (ours, theirs) = UnixStream::pair()?;
        let mut pipe = [0; 2];
        // SAFETY: pipe2 writes two new descriptors.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both are new descriptors owned here.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
        let (pid, pidfd, token) = zygote.fork(theirs.into(), write)?;
        let kind = Kind::Forked { pidfd, zygote: Arc::clone(zygote), token };
        WorkerProcess::watch(pid, ours, Some(read), spec.max_frame, kind)
    }

    /// Starts the threads that watch a started worker.
    fn watch(
        pid: i32,
        socket: UnixStream,
        stderr_pipe: Option<OwnedFd>,
        max_frame: u64,
        kind: Kind,
    ) -> io::Result<WorkerProcess> {
        let stderr = Arc::new(Mutex::new(StderrTail::default()));
        if let Some(pipe) = stderr_pipe {
            let tail = Arc::clone(&stderr);
            let pipe = std::fs::File::from(pipe);
            thread::Builder::new().name(format!("stderr-{pid}")).spawn(move || collect_stderr(pipe, &tail))?;
        }
        // Requests go down the same socket, the other way: the supervisor
        // made it, so it sends only where it chose to.
        let connection = Connection::new(pid, socket, max_frame);
        Ok(WorkerProcess {
            pid,
            connection,
            stderr,
            exit: None,
            kind,
            sandbox: None,
            sandbox_steps: Vec::new(),
            gpu: None,
            reap_timeout: DEFAULT_REAP_TIMEOUT,
        })
    }

    /// How long reaping may wait after SIGKILL before the worker is
    /// reported unreaped and left to a background reaper.
    pub fn set_reap_timeout(&mut self, timeout: Duration) {
        self.reap_timeout = timeout;
    }

    /// Forked from a zygote (rather than exec'd).
    pub fn forked(&self) -> bool {
        matches!(self.kind, Kind::Forked { .. })
    }

    /// Sends a request (from this thread, unless the socket is full).
    pub fn send(&mut self, envelope: RequestEnvelope) -> Result<(), String> {
        self.connection.send(envelope)
    }

    /// Waits for events by polling for up to `spin` before sleeping (see `WorkerSession::spin`).
    pub fn set_spin(&mut self, spin: Duration) {
        self.connection.set_spin(spin);
    }

    /// Shares a mailbox with the worker (see `isorun_transport::Mailbox`):
    /// small requests allowed there go without the socket once it is mapped.
    pub fn share_mailbox(&mut self) -> Result<(), String> {
        let mailbox = isorun_transport::Mailbox::create().map_err(|e| format!("cannot create a mailbox: {e}"))?;
        self.connection.set_mailbox(mailbox)
    }

    /// The next request sent may go through the mailbox: the caller knows
    /// the worker has answered every request before it.
    pub fn allow_mailbox_once(&mut self) {
        self.connection.allow_mailbox_once();
    }

    /// The next event, waiting at most `timeout`.
    pub fn next_event(&mut self, timeout: Duration) -> Option<WorkerEvent> {
        self.connection.next_event(timeout)
    }

    /// Protections in force in the worker, and those it could not apply.
    pub fn sandbox(&self) -> Option<&(Vec<String>, Vec<String>)> {
        self.sandbox.as_ref()
    }

    /// How long each step of its sandbox took, as it said (microseconds).
    pub fn sandbox_steps(&self) -> &[(String, u64)] {
        &self.sandbox_steps
    }

    /// Records what the worker said of its sandbox.
    pub fn set_sandbox(&mut self, protections: Vec<String>, missing: Vec<String>, steps_us: Vec<(String, u64)>) {
        self.sandbox = Some((protections, missing));
        self.sandbox_steps = steps_us;
    }

    /// Watches the worker's GPU memory from now on.
    pub fn watch_gpu(&mut self, watch: GpuWatch) {
        self.gpu = Some(watch);
    }

    /// True while its GPU memory is watched.
    pub fn watches_gpu(&self) -> bool {
        self.gpu.is_some()
    }

    /// Samples the worker's GPU memory while it lives (each tick of a request).
    pub fn sample_gpu(&mut self) {
        if let (None, Some(watch)) = (self.exit, self.gpu.as_mut()) {
            watch.sample();
        }
    }

    /// The worker's highest GPU memory since the last call, if watched.
    pub fn take_gpu_peak(&mut self) -> Option<u64> {
        self.gpu.as_mut().and_then(GpuWatch::take_peak)
    }

    /// Once the worker has exited: what its device got back.
    pub fn gpu_after_exit(&self) -> Option<GpuReturn> {
        self.exit?;
        self.gpu.as_ref().and_then(GpuWatch::after_exit)
    }

    /// The worker's last stderr lines.
    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr.lock().map(|t| t.lines()).unwrap_or_default()
    }

    /// The exit, if the worker has exited (reaping it, and killing what is
    /// left of its process group first).
    pub fn try_exit(&mut self) -> Option<Exit> {
        if self.exit.is_none() && self.has_exited() {
            self.reap();
        }
        self.exit
    }

    /// Waits up to `timeout` for the worker to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<Exit> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(exit) = self.try_exit() {
                return Some(exit);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            match &self.kind {
                // A pidfd polls readable when its process exits: no sleeping past it.
                Kind::Forked { pidfd, .. } => {
                    let mut poll = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                    let wait = (deadline - now).min(Duration::from_millis(50)).as_millis().max(1) as libc::c_int;
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut poll, 1, wait) };
                }
                Kind::Exec(_) => thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// SIGTERM to the worker's group, `grace` to exit, then SIGKILL; reaps it.
    pub fn terminate(&mut self, grace: Duration) -> Exit {
        if let Some(exit) = self.try_exit() {
            return exit;
        }
        self.signal_group(libc::SIGTERM);
        if let Some(exit) = self.wait_exit(grace) {
            return exit;
        }
        self.kill()
    }

    /// SIGTERM to the worker's group, unless it has exited; does not wait.
    pub fn ask_to_stop(&mut self) {
        if self.try_exit().is_none() {
            self.signal_group(libc::SIGTERM);
        }
    }

    /// SIGKILL to the worker's group; reaps it.
    pub fn kill(&mut self) -> Exit {
        if let Some(exit) = self.try_exit() {
            return exit;
        }
        self.signal_group(libc::SIGKILL);
        self.reap();
        self.exit.expect("reaped")
    }

    /// The worker's current memory high-water mark (`VmHWM`), while it runs.
    pub fn peak_rss_now(&self) -> Option<u64> {
        memory_fields(&self.pid.to_string(), &["VmHWM:"])
    }

    /// The worker's resident memory now (`VmRSS`), while it runs.
    pub fn rss_now(&self) -> Option<u64> {
        memory_fields(&self.pid.to_string(), &["VmRSS:"])
    }

    /// The worker's private memory now: `RssAnon + RssShmem`, so that the
    /// libtensorflow pages every worker shares with the page cache do not
    /// count against a model.
    pub fn private_memory_now(&self) -> Option<u64> {
        memory_fields(&self.pid.to_string(), &["RssAnon:", "RssShmem:"])
    }

    /// The worker's CPU time so far (user, system), while it runs.
    pub fn cpu_now(&self) -> Option<(Duration, Duration)> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let utime: f64 = fields.get(11)?.parse().ok()?;
        let stime: f64 = fields.get(12)?.parse().ok()?;
        Some((Duration::from_secs_f64(utime / ticks), Duration::from_secs_f64(stime / ticks)))
    }

    fn signal_group(&self, signal: i32) {
        match &self.kind {
            // SAFETY: the worker is not yet reaped, so its pid (and group id)
            // cannot have been reused.
            Kind::Exec(_) => unsafe {
                libc::kill(-self.pid, signal);
            },
            Kind::Forked { pidfd, zygote, token } => {
                if pidfd_signals_process_group() {
                    // The pidfd names this very process, whatever its pid
                    // becomes; the flag reaches its group.
                    let sent = pidfd_send_signal(pidfd, signal, PIDFD_SIGNAL_PROCESS_GROUP);
                    if sent == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                        return;
                    }
                }
                // Before Linux 6.9: the zygote kills the group. If it is
                // gone, so is the worker (PR_SET_PDEATHSIG).
                let _ = zygote.signal_group(*token, signal);
            }
        }
    }

    /// True once the worker has exited; does not reap it.
    fn has_exited(&self) -> bool {
        if let Kind::Forked { pidfd, .. } = &self.kind {
            // A pidfd polls readable once its process has exited.
            let mut poll = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd, no wait.
            return unsafe { libc::poll(&mut poll, 1, 0) } > 0;
        }
        // SAFETY: waitid writes only into info.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                self.pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            r == 0 && info.si_pid() != 0
        }
    }

    /// Kills what is left of the group (grandchildren), then reaps the
    /// worker with its resource usage. Waits at most the reap timeout: a
    /// worker still there then (it was sent SIGKILL before any caller
    /// reaps; only uninterruptible sleep outlasts that) is reported
    /// `Unreaped` and left to a background reaper, so its slot moves on.
    fn reap(&mut self) {
        if self.exit.is_some() {
            return;
        }
        if let Kind::Forked { zygote, .. } = &self.kind {
            // The zygote reaps its children (killing their group first) and reports.
            let report = zygote.wait_exit(self.pid, self.reap_timeout);
            let duration = |us: u64| Duration::from_micros(us);
            self.exit = Some(match report {
                Some(r) => Exit {
                    status: wait_status(r.wait_status),
                    max_rss_bytes: r.max_rss_kib * 1024,
                    user: duration(r.user_us),
                    system: duration(r.system_us),
                },
                None if zygote.alive() => {
                    tracing::warn!(
                        pid = self.pid,
                        "worker not reaped {:?} after SIGKILL (uninterruptible sleep?); its zygote reaps it later",
                        self.reap_timeout
                    );
                    zygote.forget_exit(self.pid);
                    Exit::unreaped()
                }
                // The zygote died, and its children with it (PR_SET_PDEATHSIG).
                None => Exit {
                    status: ExitStatus::Signal { signal: libc::SIGKILL, core_dumped: false },
                    max_rss_bytes: 0,
                    user: Duration::ZERO,
                    system: Duration::ZERO,
                },
            });
            return;
        }
        if self.has_exited() {
            self.signal_group(libc::SIGKILL);
        }
        self.exit = Some(match wait_within(self.pid, self.reap_timeout) {
            Some((status, usage)) => {
                let duration = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
                Exit {
                    status: wait_status(status),
                    max_rss_bytes: (usage.ru_maxrss as u64) * 1024,
                    user: duration(usage.ru_utime),
                    system: duration(usage.ru_stime),
                }
            }
            None => {
                tracing::warn!(
                    pid = self.pid,
                    "worker not reaped {:?} after SIGKILL (uninterruptible sleep?); reaping it in the background",
                    self.reap_timeout
                );
                reap_in_background(self.pid);
                Exit::unreaped()
            }
        });
    }
}

/// `wait4` on child `pid` without blocking past `timeout`: its raw status
/// and usage, or `None` if it is still there then. A child that is gone
/// already (ECHILD) counts as exited with status 0.
fn wait_within(pid: i32, timeout: Duration) -> Option<(i32, libc::rusage)> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(200);
    loop {
        // SAFETY: wait4 writes only into status and usage.
        let (r, status, usage) = unsafe {
            let mut status = 0;
            let mut usage: libc::rusage = std::mem::zeroed();
            let r = libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage);
            (r, status, usage)
        };
        if r == pid {
            return Some((status, usage));
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Some((0, usage));
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// Reaps child `pid` on a thread of its own, whenever it exits, so that no
/// zombie is left and no slot waits for it.
fn reap_in_background(pid: i32) {
    let spawned = thread::Builder::new().name(format!("reaper-{pid}")).spawn(move || loop {
        let mut status = 0;
        // SAFETY: wait4 writes only into status; no usage asked.
        let r = unsafe { libc::wait4(pid, &mut status, 0, std::ptr::null_mut()) };
        if r == pid || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(pid, "cannot start a reaper thread ({e}); the worker stays a zombie until isorun exits");
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if self.exit.is_none() {
            self.kill();
        }
    }
}

/// `pidfd_send_signal`'s flag for the process group of the pidfd's process (Linux 6.9).
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 1 << 2;

/// `pidfd_send_signal(pidfd, signal, NULL, flags)`: 0, or -1 with errno set.
fn pidfd_send_signal(pidfd: &OwnedFd, signal: i32, flags: libc::c_uint) -> libc::c_long {
    // SAFETY: no siginfo is passed; the kernel checks the descriptor is a pidfd.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            flags,
        )
    }
}

/// Whether the kernel signals a process group through a pidfd
/// (`PIDFD_SIGNAL_PROCESS_GROUP`, Linux 6.9; older kernels answer EINVAL).
/// Asked once, with signal 0 (a permission check only) through a pidfd of
/// this process: success, or ESRCH where it leads no group, means the flag
/// is known.
pub fn pidfd_signals_process_group() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        // SAFETY: pidfd_open of ourselves; the descriptor is owned at once.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
        if pidfd < 0 {
            return false;
        }
        // SAFETY: a new descriptor, owned here.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
        // Signal 0 sends nothing.
        let sent = pidfd_send_signal(&pidfd, 0, PIDFD_SIGNAL_PROCESS_GROUP);
        sent == 0 || !matches!(io::Error::last_os_error().raw_os_error(), Some(libc::EINVAL | libc::ENOSYS))
    })
}

/// The sum, in bytes, of memory fields (in KiB) of `/proc/<pid>/status`
/// (`pid` may be `self`); `None` if the process or the first field is gone.
pub fn memory_fields(pid: &str, names: &[&str]) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    };
    let (first, rest) = names.split_first()?;
    Some((field(first)? + rest.iter().filter_map(|n| field(n)).sum::<u64>()) * 1024)
}

/// A raw `wait` status as an `ExitStatus`.
fn wait_status(status: i32) -> ExitStatus {
    if libc::WIFSIGNALED(status) {
        ExitStatus::Signal { signal: libc::WTERMSIG(status), core_dumped: libc::WCOREDUMP(status) }
    } else {
        ExitStatus::Code(libc::WEXITSTATUS(status))
    }
}

#[cfg(test)]
mod tests {
    use super::super::spec::library_path;
    use super::*;
    use std::path::PathBuf;

    fn spec(gpu: Option<&str>, lib_dir: Option<PathBuf>) -> SpawnSpec {
        SpawnSpec {
            worker: PathBuf::from("/bin/true"),
            lib_dir,
            args: Vec::new(),
            max_frame: 1 << 20,
            clean_env: true,
            gpu: gpu.map(str::to_string),
        }
    }

    fn env_of(spec: &SpawnSpec, name: &str) -> Option<Option<std::ffi::OsString>> {
        let mut command = Command::new("/bin/true");
        worker_environment(&mut command, spec);
        command.get_envs().find(|(n, _)| *n == name).map(|(_, v)| v.map(ToOwned::to_owned))
    }

    /// State letter of a process in `/proc/PID/stat`, `None` once it is gone (reaped).
    fn process_state(pid: i32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    }

    /// Starts a child that the code under test, not `Child::wait`, reaps.
    fn spawn_unwaited(command: &mut Command) -> i32 {
        #[expect(clippy::zombie_processes, reason = "wait_within and the background reaper reap it")]
        let child = command.spawn().unwrap();
        child.id() as i32
    }

    #[test]
    fn reaping_waits_no_longer_than_its_bound_and_the_background_reaper_finishes() {
        // A child that outlives the bound (as one in uninterruptible sleep
        // would outlive SIGKILL): the wait gives up on time...
        let pid = spawn_unwaited(Command::new("sleep").arg("30"));
        let started = Instant::now();
        assert!(wait_within(pid, Duration::from_millis(300)).is_none());
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(3), "waited {waited:?}");
        // ...and once it dies, the background reaper leaves no zombie.
        reap_in_background(pid);
        // SAFETY: our own child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while process_state(pid).is_some() {
            assert!(Instant::now() < deadline, "pid {pid} left as {:?}", process_state(pid));
            thread::sleep(Duration::from_millis(10));
        }
        // A child that exits within the bound is reaped with its status.
        let pid = spawn_unwaited(Command::new("sh").args(["-c", "exit 7"]));
        let (status, _) = wait_within(pid, Duration::from_secs(5)).expect("reaped");
        assert_eq!(wait_status(status), ExitStatus::Code(7));
    }

    #[test]
    fn a_slot_device_is_the_only_visible_one_in_bus_order() {
        let bound = spec(Some("GPU-1234"), None);
        assert_eq!(env_of(&bound, "CUDA_VISIBLE_DEVICES"), Some(Some("GPU-1234".into())));
        assert_eq!(env_of(&bound, "CUDA_DEVICE_ORDER"), Some(Some("PCI_BUS_ID".into())));
        // No --gpus: no device, and no order to set.
        let hidden = spec(Some(""), None);
        assert_eq!(env_of(&hidden, "CUDA_VISIBLE_DEVICES"), Some(Some("".into())));
        assert_eq!(env_of(&hidden, "CUDA_DEVICE_ORDER"), None);
    }

    #[test]
    fn the_cuda_folder_of_a_gpu_build_is_on_the_library_path() {
        let dir = tempfile::tempdir().unwrap();
        let plain = library_path(dir.path());
        assert!(plain.to_string_lossy().starts_with(&*dir.path().to_string_lossy()));
        assert!(!plain.to_string_lossy().contains("/cuda"));
        std::fs::create_dir(dir.path().join("cuda")).unwrap();
        let with_cuda = library_path(dir.path()).to_string_lossy().into_owned();
        let expected = format!("{0}:{0}/cuda", dir.path().display());
        assert!(with_cuda == expected || with_cuda.starts_with(&format!("{expected}:")), "{with_cuda}");
    }
}
