//! The zygote's side: wait for fork requests and child exits, on one
//! thread, forever. Nothing here may start a thread, or forking stops
//! being safe; every fork is preceded by a check of `/proc/self/task`.
//!
//! Where the kernel cannot signal a process group through a pidfd (before
//! Linux 6.9), the supervisor asks the zygote to (`Signal`): the zygote has
//! not reaped the child, so neither its pid nor its group id can have been
//! reused, and it knows children by fork token, never by a pid it was told.

use crate::wire::{receive, send, ExitReport, Message};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Number of threads of this process.
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Serves fork requests on `control` until the supervisor closes it. Each
/// child runs `child_main` on its IPC socket and `_exit`s with its result.
/// Returns the zygote's exit code.
pub fn run(control: OwnedFd, child_main: fn(UnixStream) -> i32) -> i32 {
    run_preparing(control, child_main, || {})
}

/// [`run`], calling `before_fork` on the zygote's one thread before each
/// fork (the worker's zygote makes oneDNN's kernels there once the index
/// it waited for is ready). It must not start a thread.
pub fn run_preparing(control: OwnedFd, child_main: fn(UnixStream) -> i32, before_fork: fn()) -> i32 {
    match serve(&control, child_main, before_fork) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("isorun zygote: {e}");
            1
        }
    }
}

fn serve(control: &OwnedFd, child_main: fn(UnixStream) -> i32, before_fork: fn()) -> io::Result<()> {
    // SIGCHLD arrives through a signalfd, so one poll waits for both.
    // SAFETY: plain signal-mask and signalfd calls on this single thread.
    let (signals, old_mask) = unsafe {
        let mut mask: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut mask);
        libc::sigaddset(&mut mask, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &mask, &mut old);
        let fd = libc::signalfd(-1, &mask, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        (OwnedFd::from_raw_fd(fd), old)
    };
    // SAFETY: getpid has no preconditions.
    let zygote_pid = unsafe { libc::getpid() };
    // Children not yet reaped, by the token of the fork that made them.
    let mut children: HashMap<u64, libc::pid_t> = HashMap::new();
    loop {
        let mut polls = [
            libc::pollfd { fd: control.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: signals.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: polls is a valid array of two pollfd.
        if unsafe { libc::poll(polls.as_mut_ptr(), 2, -1) } < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if polls[1].revents != 0 {
            drain_signals(&signals);
            reap_children(control, &mut children)?;
        }
        if polls[0].revents != 0 {
            let Some((bytes, fds)) = receive(control)? else {
                return Ok(()); // the supervisor is gone; children die with us (PDEATHSIG)
            };
            match (Message::decode(&bytes), <[OwnedFd; 2]>::try_from(fds)) {
                (Some(Message::Fork { token }), Ok([ipc, stderr])) => {
                    before_fork();
                    fork_worker(
                        control,
                        &signals,
                        &old_mask,
                        zygote_pid,
                        &mut children,
                        token,
                        ipc,
                        stderr,
                        child_main,
                    )?
                }
                (Some(Message::Fork { token }), Err(_)) => {
                    let refused = Message::Refused { token, reason: "a fork request needs two descriptors".into() };
                    send(control, &refused.encode(), &[])?;
                }
                (Some(Message::Signal { token, signal }), _) => {
                    // A child already reaped has had its group killed; nothing is left to signal.
                    if let Some(&pid) = children.get(&token) {
                        signal_group(pid, signal);
                    }
                }
                _ => return Err(io::Error::other("unexpected message on the control socket")),
            }
        }
    }
}

fn drain_signals(signals: &OwnedFd) {
    let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    // SAFETY: reads into a buffer of the right size; non-blocking.
    while unsafe { libc::read(signals.as_raw_fd(), info.as_mut_ptr().cast(), info.len()) } > 0 {}
}

/// Sends `signal` to the process group of `pid`, an unreaped child, and to
/// the child itself should it have moved to another group.
fn signal_group(pid: libc::pid_t, signal: i32) {
    // SAFETY: `pid` is our child and not yet reaped, so neither it nor its
    // group id can have been reused.
    unsafe {
        libc::kill(-pid, signal);
        if libc::getpgid(pid) != pid {
            libc::kill(pid, signal);
        }
    }
}

/// Reaps every exited child: first kills what is left of its process group
/// (the pid is not reusable until reaped), then reports its exit.
fn reap_children(control: &OwnedFd, children: &mut HashMap<u64, libc::pid_t>) -> io::Result<()> {
    loop {
        // SAFETY: waitid/kill/wait4 write only into the given structures.
        let report = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT);
            if r != 0 || info.si_pid() == 0 {
                return Ok(());
            }
            let pid = info.si_pid();
            libc::kill(-pid, libc::SIGKILL);
            let mut status = 0;
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::wait4(pid, &mut status, 0, &mut usage);
            children.retain(|_, child| *child != pid);
            let micros = |t: libc::timeval| (t.tv_sec as u64) * 1_000_000 + t.tv_usec as u64;
            ExitReport {
                pid,
                wait_status: status,
                max_rss_kib: usage.ru_maxrss as u64,
                user_us: micros(usage.ru_utime),
                system_us: micros(usage.ru_stime),
            }
        };
        send(control, &Message::Exited(report).encode(), &[])?;
    }
}

#[expect(clippy::too_many_arguments, reason = "the state a fork needs, passed once")]
fn fork_worker(
    control: &OwnedFd,
    signals: &OwnedFd,
    old_mask: &libc::sigset_t,
    zygote_pid: libc::pid_t,
    children: &mut HashMap<u64, libc::pid_t>,
    token: u64,
    ipc: OwnedFd,
    stderr: OwnedFd,
    child_main: fn(UnixStream) -> i32,
) -> io::Result<()> {
    let threads = thread_count();
    if threads != 1 {
        let reason = format!("the zygote has {threads} threads; forking it is not safe");
        return send(control, &Message::Refused { token, reason }.encode(), &[]);
    }
    // SAFETY: this process is single-threaded (checked above), so the child
    // may run any code. The child never returns from this block.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let reason = format!("fork failed: {}", io::Error::last_os_error());
        return send(control, &Message::Refused { token, reason }.encode(), &[]);
    }
    if pid == 0 {
        // SAFETY: the child sets itself up and never returns.
        unsafe { become_worker(control, signals, old_mask, zygote_pid, ipc, stderr, child_main) }
    }
    // Parent: the child makes a session of its own (`setsid`, its first
    // step); nobody hears of it until it has, so that no signal to "its"
    // group (a pidfd's `PIDFD_SIGNAL_PROCESS_GROUP` names the group it is in
    // at the time) can reach the zygote's. `setpgid` from this side would
    // make the child a group leader, which `setsid` refuses.
    // SAFETY: pidfd_open on our own, unreaped child.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) as RawFd };
    drop((ipc, stderr));
    if !wait_for_own_session(pid) {
        // SAFETY: our child, not reaped yet (reaping happens in our loop); the pidfd, if any, is ours.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            if pidfd >= 0 {
                libc::close(pidfd);
            }
        }
        let reason = "the forked worker did not start a session of its own".to_string();
        return send(control, &Message::Refused { token, reason }.encode(), &[]);
    }
    if pidfd < 0 {
        // SAFETY: our child; it is reaped and reported through SIGCHLD.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let reason = format!("pidfd_open failed: {}", io::Error::last_os_error());
        return send(control, &Message::Refused { token, reason }.encode(), &[]);
    }
    // SAFETY: pidfd is a new descriptor owned here.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    children.insert(token, pid);
    send(control, &Message::Forked { token, pid }.encode(), &[pidfd.as_raw_fd()])
}

/// Whether `pid` (our child) leads a session (so a group) of its own
/// within a second: it does so first thing after the fork.
fn wait_for_own_session(pid: libc::pid_t) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        // SAFETY: getsid on our own, unreaped child.
        if unsafe { libc::getsid(pid) } == pid {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::yield_now();
    }
}

/// In the child: its own session, death with the zygote, first in line for
/// the OOM killer, stderr to its own pipe, then the worker's work.
unsafe fn become_worker(
    control: &OwnedFd,
    signals: &OwnedFd,
    old_mask: &libc::sigset_t,
    zygote_pid: libc::pid_t,
    ipc: OwnedFd,
    stderr: OwnedFd,
    child_main: fn(UnixStream) -> i32,
) -> ! {
    libc::close(control.as_raw_fd());
    libc::close(signals.as_raw_fd());
    libc::sigprocmask(libc::SIG_SETMASK, old_mask, std::ptr::null_mut());
    // A session of its own, so a process group of its own that it cannot
    // trade for the supervisor's or the user's shell's (the sandbox then
    // refuses `setpgid` and `setsid`); the parent waits for this.
    if libc::setsid() < 0 {
        libc::_exit(1);
    }
    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    if libc::getppid() != zygote_pid {
        libc::_exit(1);
    }
    let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd >= 0 {
        libc::write(fd, b"1000".as_ptr().cast(), 4);
        libc::close(fd);
    }
    libc::dup2(stderr.as_raw_fd(), 2);
    drop(stderr);
    let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
    if null >= 0 {
        libc::dup2(null, 0);
        libc::dup2(null, 1);
        libc::close(null);
    }
    let code = child_main(UnixStream::from(ipc));
    libc::_exit(code)
}
