//! No new UNIX socket: a seccomp filter that makes `socket(AF_UNIX, ...)`
//! and `socketpair(AF_UNIX, ...)` fail with `EACCES`. A pathname UNIX socket
//! (the user's D-Bus, `docker.sock`, an ssh agent) is reached by creating a
//! socket and connecting it; Landlock's file rules do not cover that connect
//! before ABI 9 and the network namespace does not cover UNIX sockets at
//! all, so the socket is refused at birth. The worker's one channel to the
//! supervisor is the socket it inherited, and TensorFlow (CPU or CUDA)
//! creates no UNIX socket to run a model, so nothing legitimate needs one.
//!
//! Where Landlock has no signal scope (before ABI 6, Linux 6.12: every
//! kernel isorun's users run), a second filter (`signal_filter`) lets the
//! worker signal only itself: without it, `kill(-1, SIGKILL)` ends every
//! process of the user, the supervisor included.
//!
//! The same filter refuses `setpgid` and `setsid` (`EPERM`): a worker
//! starts in a session of its own, and without this it could join the
//! supervisor's (or the user's shell's) process group, still in the
//! session it was started in before isorun gave it its own, and signal it
//! with `kill(0, ...)`, which `signal_filter` allows; or leave its group
//! and so escape the group kill.
//!
//! Also refused, as a kernel without them would (`ENOSYS`): `io_uring_setup`
//! (io_uring's `IORING_OP_SOCKET` makes sockets without the `socket` system
//! call, so without seccomp seeing it) and every system call of another
//! architecture's table (32-bit calls on x86-64 and the x32 table, whose
//! `socketcall` would dodge the rule). Written as a few lines of classic BPF,
//! as `tests/src/bin/deny_pidfd_group.rs` is, rather than through a seccomp
//! library: each rule fits on a screen, jump targets are named, and the
//! tests run the programs through a small interpreter.

use std::io;

/// The `AUDIT_ARCH_*` value of this build's architecture (linux/audit.h).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// System call numbers at or above this are x32's (x86-64 only; on aarch64
/// no call is numbered this high either, so the same test is harmless).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Offsets in `struct seccomp_data`: nr (int), arch (u32), instruction
/// pointer (u64), then args[6] (u64 each); the low half of each argument
/// comes first on a little-endian machine (pids, families, commands are ints).
const NR: u32 = 0;
const ARCH: u32 = 4;
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i
}

/// `fcntl` commands and `ioctl` requests that name a process to receive
/// `SIGIO` (or any signal, with `F_SETSIG`) (asm-generic/fcntl.h, sockios.h).
const F_SETOWN: u32 = 8;
const F_SETOWN_EX: u32 = 15;
const FIOSETOWN: u32 = 0x8901;
const SIOCSPGRP: u32 = 0x8902;

/// A few lines of classic BPF with named jump targets, so that no offset
/// is counted by hand. Every jump is forward, as the kernel requires.
struct Program {
    code: Vec<libc::sock_filter>,
    jumps: Vec<(usize, &'static str)>,
    labels: Vec<(&'static str, usize)>,
}

impl Program {
    fn new() -> Program {
        Program { code: Vec::new(), jumps: Vec::new(), labels: Vec::new() }
    }

    fn load(&mut self, offset: u32) {
        self.code.push(libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: offset,
        });
    }

    /// Jumps to `target` if the loaded word `op` k (`BPF_JEQ`, `BPF_JGE`), else goes on.
    fn jump_if(&mut self, op: u32, k: u32, target: &'static str) {
        self.jumps.push((self.code.len(), target));
        self.code.push(libc::sock_filter { code: (libc::BPF_JMP | op | libc::BPF_K) as u16, jt: 0, jf: 0, k });
    }

    fn ret(&mut self, value: u32) {
        self.code.push(libc::sock_filter { code: (libc::BPF_RET | libc::BPF_K) as u16, jt: 0, jf: 0, k: value });
    }

    fn label(&mut self, name: &'static str) {
        self.labels.push((name, self.code.len()));
    }

    fn finish(mut self) -> Vec<libc::sock_filter> {
        for (at, target) in &self.jumps {
            let to = self.labels.iter().find(|(name, _)| name == target).expect("a known label").1;
            let offset = to.checked_sub(at + 1).expect("jumps go forward");
            self.code[*at].jt = u8::try_from(offset).expect("a short jump");
        }
        self.code
    }

    /// Another architecture's calls, and x32's, fail as unknown.
    fn native_only(&mut self) {
        self.load(ARCH);
        self.jump_if(libc::BPF_JEQ, AUDIT_ARCH, "native");
        self.ret(errno(libc::ENOSYS));
        self.label("native");
        self.load(NR);
        self.jump_if(libc::BPF_JGE, X32_SYSCALL_BIT, "enosys");
    }
}

fn errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | e as u32
}

/// No new UNIX socket; no io_uring; nothing but this architecture's calls;
/// no `setpgid` or `setsid` (`EPERM`): the process stays in the session and
/// group it was started in (its own, see `own_session`), so it can neither
/// move into another group and signal it with `kill(0, ...)` nor leave the
/// group the supervisor kills.
fn unix_socket_program() -> Vec<libc::sock_filter> {
    let mut p = Program::new();
    p.native_only();
    p.jump_if(libc::BPF_JEQ, libc::SYS_setpgid as u32, "eperm");
    p.jump_if(libc::BPF_JEQ, libc::SYS_setsid as u32, "eperm");
    p.jump_if(libc::BPF_JEQ, libc::SYS_io_uring_setup as u32, "enosys");
    p.jump_if(libc::BPF_JEQ, libc::SYS_socket as u32, "family");
    p.jump_if(libc::BPF_JEQ, libc::SYS_socketpair as u32, "family");
    p.ret(libc::SECCOMP_RET_ALLOW);
    p.label("family");
    p.load(arg_low(0));
    p.jump_if(libc::BPF_JEQ, libc::AF_UNIX as u32, "eacces");
    p.ret(libc::SECCOMP_RET_ALLOW);
    p.label("enosys");
    p.ret(errno(libc::ENOSYS));
    p.label("eacces");
    p.ret(errno(libc::EACCES));
    p.label("eperm");
    p.ret(errno(libc::EPERM));
    p.finish()
}

/// Signals only to `pid` itself (its threads, its own process group, which
/// it leads): `kill`, `tgkill`, `rt_sigqueueinfo`, `rt_tgsigqueueinfo` and
/// `SIGIO` owners; `tkill` and `pidfd_send_signal`, which name a target
/// this cannot check cheaply, and `F_SETOWN_EX`, refused.
fn signal_program(pid: u32) -> Vec<libc::sock_filter> {
    let group = (pid as i32).wrapping_neg() as u32;
    let mut p = Program::new();
    p.native_only();
    p.jump_if(libc::BPF_JEQ, libc::SYS_kill as u32, "kill");
    p.jump_if(libc::BPF_JEQ, libc::SYS_tgkill as u32, "process");
    p.jump_if(libc::BPF_JEQ, libc::SYS_rt_sigqueueinfo as u32, "process");
    p.jump_if(libc::BPF_JEQ, libc::SYS_rt_tgsigqueueinfo as u32, "process");
    p.jump_if(libc::BPF_JEQ, libc::SYS_tkill as u32, "eperm");
    p.jump_if(libc::BPF_JEQ, libc::SYS_pidfd_send_signal as u32, "eperm");
    p.jump_if(libc::BPF_JEQ, libc::SYS_fcntl as u32, "fcntl");
    p.jump_if(libc::BPF_JEQ, libc::SYS_ioctl as u32, "ioctl");
    p.ret(libc::SECCOMP_RET_ALLOW);
    // kill(pid | -pid | 0): itself or its own group.
    p.label("kill");
    p.load(arg_low(0));
    p.jump_if(libc::BPF_JEQ, pid, "allow");
    p.jump_if(libc::BPF_JEQ, group, "allow");
    p.jump_if(libc::BPF_JEQ, 0, "allow");
    p.ret(errno(libc::EPERM));
    // The first argument is a thread group: this process only.
    p.label("process");
    p.load(arg_low(0));
    p.jump_if(libc::BPF_JEQ, pid, "allow");
    p.ret(errno(libc::EPERM));
    p.label("fcntl");
    p.load(arg_low(1));
    p.jump_if(libc::BPF_JEQ, F_SETOWN, "owner");
    p.jump_if(libc::BPF_JEQ, F_SETOWN_EX, "eperm");
    p.ret(libc::SECCOMP_RET_ALLOW);
    p.label("owner");
    p.load(arg_low(2));
    p.jump_if(libc::BPF_JEQ, pid, "allow");
    p.jump_if(libc::BPF_JEQ, 0, "allow");
    p.ret(errno(libc::EPERM));
    p.label("ioctl");
    p.load(arg_low(1));
    p.jump_if(libc::BPF_JEQ, FIOSETOWN, "eperm");
    p.jump_if(libc::BPF_JEQ, SIOCSPGRP, "eperm");
    p.label("allow");
    p.ret(libc::SECCOMP_RET_ALLOW);
    p.label("enosys");
    p.ret(errno(libc::ENOSYS));
    p.label("eperm");
    p.ret(errno(libc::EPERM));
    p.finish()
}

/// Installs `filter` on this thread and every thread it starts later.
/// Needs `PR_SET_NO_NEW_PRIVS` (set by the caller) unless privileged.
fn install(filter: &[libc::sock_filter]) -> io::Result<()> {
    let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
    let address = &program as *const libc::sock_fprog;
    // SAFETY: prctl with a filter program that outlives the call.
    if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, address, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `no_unix_sockets`.
pub fn deny_unix_sockets() -> io::Result<()> {
    install(&unix_socket_program())
}

/// `signal_filter`: where Landlock has no signal scope (before ABI 6,
/// Linux 6.12), signals from this process reach only itself.
pub fn deny_foreign_signals() -> io::Result<()> {
    install(&signal_program(std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `filter` answers for one system call: a small interpreter of
    /// the few instructions these programs use.
    fn answer(filter: &[libc::sock_filter], arch: u32, nr: i64, args: [i64; 3]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, arg) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_le_bytes());
        }
        let (mut pc, mut accumulator) = (0, 0u32);
        loop {
            let instruction = filter[pc];
            let code = u32::from(instruction.code);
            pc += 1;
            match code & 0x07 {
                libc::BPF_LD => {
                    let at = instruction.k as usize;
                    accumulator = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                }
                libc::BPF_RET => return instruction.k,
                libc::BPF_JMP => {
                    let taken = match code & 0xf0 {
                        libc::BPF_JEQ => accumulator == instruction.k,
                        libc::BPF_JGE => accumulator >= instruction.k,
                        other => panic!("jump {other:#x}"),
                    };
                    pc += usize::from(if taken { instruction.jt } else { instruction.jf });
                }
                other => panic!("class {other:#x}"),
            }
        }
    }

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

    #[test]
    fn unix_sockets_io_uring_and_foreign_calls_are_refused_the_rest_allowed() {
        let filter = unix_socket_program();
        let call = |nr, args| answer(&filter, AUDIT_ARCH, nr, args);
        assert_eq!(call(libc::SYS_socket, [libc::AF_UNIX.into(), 1, 0]), errno(libc::EACCES));
        assert_eq!(call(libc::SYS_socketpair, [libc::AF_UNIX.into(), 5, 0]), errno(libc::EACCES));
        assert_eq!(call(libc::SYS_socket, [libc::AF_INET.into(), 2, 0]), ALLOW);
        assert_eq!(call(libc::SYS_socket, [libc::AF_NETLINK.into(), 2, 0]), ALLOW);
        assert_eq!(call(libc::SYS_io_uring_setup, [8, 0, 0]), errno(libc::ENOSYS));
        assert_eq!(call(libc::SYS_setpgid, [0, 1, 0]), errno(libc::EPERM), "no joining another group");
        assert_eq!(call(libc::SYS_setsid, [0, 0, 0]), errno(libc::EPERM), "no leaving the session");
        assert_eq!(call(libc::SYS_getpgid, [0, 0, 0]), ALLOW);
        assert_eq!(call(libc::SYS_read, [0, 0, 0]), ALLOW);
        assert_eq!(call(libc::SYS_socket | i64::from(X32_SYSCALL_BIT), [1, 1, 0]), errno(libc::ENOSYS));
        assert_eq!(answer(&filter, 0x4000_0003, 102, [1, 0, 0]), errno(libc::ENOSYS), "i386 socketcall");
    }

    #[test]
    fn signals_reach_only_the_process_itself() {
        let pid = 4242;
        let filter = signal_program(pid);
        let call = |nr, args| answer(&filter, AUDIT_ARCH, nr, args);
        let me = i64::from(pid);
        for target in [me, -me, 0] {
            assert_eq!(call(libc::SYS_kill, [target, 9, 0]), ALLOW, "kill({target})");
        }
        for target in [-1, 1, me + 1, -(me + 1)] {
            assert_eq!(call(libc::SYS_kill, [target, 9, 0]), errno(libc::EPERM), "kill({target})");
        }
        assert_eq!(call(libc::SYS_tgkill, [me, 4243, 6]), ALLOW, "abort() in a thread");
        assert_eq!(call(libc::SYS_tgkill, [1, 1, 9]), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_rt_sigqueueinfo, [1, 9, 0]), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_tkill, [me, 9, 0]), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_pidfd_send_signal, [3, 9, 0]), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_fcntl, [3, F_SETOWN.into(), 1]), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_fcntl, [3, F_SETOWN.into(), me]), ALLOW);
        assert_eq!(call(libc::SYS_fcntl, [3, F_SETOWN_EX.into(), 0]), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_fcntl, [3, libc::F_GETFL.into(), 0]), ALLOW);
        assert_eq!(call(libc::SYS_ioctl, [3, FIOSETOWN.into(), 0]), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_ioctl, [3, libc::FIONREAD as i64, 0]), ALLOW);
        assert_eq!(call(libc::SYS_write, [1, 0, 0]), ALLOW);
    }

    /// In a child process (a filter cannot be taken back): UNIX sockets are
    /// refused, an inet socket and a pipe still work; the signal filter lets
    /// it signal itself and not its parent.
    #[test]
    fn a_filtered_process_makes_no_unix_socket_and_signals_nobody_else() {
        // SAFETY: the child only makes system calls and exits with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: system calls on values owned here, then _exit.
            unsafe {
                let code = (|| {
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                        || deny_unix_sockets().is_err()
                        || deny_foreign_signals().is_err()
                    {
                        return 10;
                    }
                    let unix = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                    if unix >= 0 || *libc::__errno_location() != libc::EACCES {
                        return 11;
                    }
                    let mut pair = [0; 2];
                    if libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, pair.as_mut_ptr()) == 0 {
                        return 12;
                    }
                    if libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) < 0 {
                        return 13;
                    }
                    if libc::pipe(pair.as_mut_ptr()) != 0 {
                        return 14;
                    }
                    // Signal 0 checks without sending: the parent is refused, itself allowed.
                    if libc::kill(libc::getppid(), 0) == 0 || *libc::__errno_location() != libc::EPERM {
                        return 15;
                    }
                    if libc::kill(libc::getpid(), 0) != 0 {
                        return 16;
                    }
                    // No moving into the parent's group (so no kill(0, ...) reaching it), no new session.
                    if libc::setpgid(0, libc::getpgid(libc::getppid())) == 0 || *libc::__errno_location() != libc::EPERM
                    {
                        return 17;
                    }
                    if libc::setsid() >= 0 || *libc::__errno_location() != libc::EPERM {
                        return 18;
                    }
                    0
                })();
                libc::_exit(code);
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "{status}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "step that failed (see the test)");
    }
}
