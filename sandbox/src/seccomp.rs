//! No new UNIX socket: a seccomp filter that makes `socket(AF_UNIX, ...)`
//! and `socketpair(AF_UNIX, ...)` fail with `EACCES`. A pathname UNIX socket
//! (the user's D-Bus, `docker.sock`, an ssh agent) is reached by creating a
//! socket and connecting it; Landlock's file rules do not cover that connect
//! before ABI 9 and the network namespace does not cover UNIX sockets at
//! all, so the socket is refused at birth. The worker's one channel to the
//! supervisor is the socket it inherited, and TensorFlow (CPU or CUDA)
//! creates no UNIX socket to run a model, so nothing legitimate needs one.
//!
//! Also refused, as a kernel without them would (`ENOSYS`): `io_uring_setup`
//! (io_uring's `IORING_OP_SOCKET` makes sockets without the `socket` system
//! call, so without seccomp seeing it) and every system call of another
//! architecture's table (32-bit calls on x86-64 and the x32 table, whose
//! `socketcall` would dodge the rule). Written as a few lines of classic BPF,
//! as `tests/src/bin/deny_pidfd_group.rs` is, rather than through a seccomp
//! library: the whole rule fits on a screen.

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
/// pointer (u64), then args[6] (u64 each); the low half of args[0] comes
/// first on a little-endian machine (`family` is an int).
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0_LOW: u32 = 16;

fn statement(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt: 0, jf: 0, k }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt, jf, k }
}

/// The filter program, in order.
fn program() -> Vec<libc::sock_filter> {
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let equal = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let at_least = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    let errno = |e: i32| libc::SECCOMP_RET_ERRNO | e as u32;
    vec![
        /* 0 */ statement(load, ARCH),
        /* 1 */ jump(equal, AUDIT_ARCH, 1, 0),
        /* 2 */ statement(ret, errno(libc::ENOSYS)),
        /* 3 */ statement(load, NR),
        /* 4 */ jump(at_least, X32_SYSCALL_BIT, 6, 0), // -> 11 (ENOSYS)
        /* 5 */ jump(equal, libc::SYS_io_uring_setup as u32, 5, 0), // -> 11 (ENOSYS)
        /* 6 */ jump(equal, libc::SYS_socket as u32, 1, 0), // -> 8
        /* 7 */ jump(equal, libc::SYS_socketpair as u32, 0, 2), // -> 8, else 10
        /* 8 */ statement(load, ARG0_LOW),
        /* 9 */ jump(equal, libc::AF_UNIX as u32, 2, 0), // -> 12 (EACCES)
        /* 10 */ statement(ret, libc::SECCOMP_RET_ALLOW),
        /* 11 */ statement(ret, errno(libc::ENOSYS)),
        /* 12 */ statement(ret, errno(libc::EACCES)),
    ]
}

/// Installs the filter on this thread and every thread it starts later.
/// Needs `PR_SET_NO_NEW_PRIVS` (set by the caller) unless privileged.
pub fn deny_unix_sockets() -> io::Result<()> {
    let filter = program();
    let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
    let address = &program as *const libc::sock_fprog;
    // SAFETY: prctl with a filter program that outlives the call.
    if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, address, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every jump lands inside the program, and every path ends in a return.
    #[test]
    fn every_jump_lands_on_an_instruction() {
        let filter = program();
        for (i, instruction) in filter.iter().enumerate() {
            if u32::from(instruction.code) & 0x07 == libc::BPF_JMP {
                assert!(i + 1 + (instruction.jt as usize) < filter.len(), "jt of {i}");
                assert!(i + 1 + (instruction.jf as usize) < filter.len(), "jf of {i}");
            }
        }
        assert_eq!(u32::from(filter.last().unwrap().code), libc::BPF_RET | libc::BPF_K);
    }

    /// In a child process (the filter cannot be taken back): UNIX sockets
    /// are refused, an inet socket and a pipe still work.
    #[test]
    fn a_filtered_process_makes_no_unix_socket_but_other_sockets() {
        // SAFETY: the child only makes system calls and exits with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: system calls on values owned here, then _exit.
            unsafe {
                let code = (|| {
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || deny_unix_sockets().is_err() {
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
