//! `isorun-deny-pidfd-group PROGRAM [ARGS...]`: runs PROGRAM as if on a
//! kernel before Linux 6.9, where `pidfd_send_signal` knows no
//! `PIDFD_SIGNAL_PROCESS_GROUP` and answers EINVAL. A seccomp filter (kept
//! by PROGRAM's children: the zygote and its workers) makes exactly those
//! calls fail that way; every other system call is untouched. Tests use it
//! to prove that workers are still killed where that flag is missing.

use std::os::unix::process::CommandExt;

/// `PIDFD_SIGNAL_PROCESS_GROUP` (linux/pidfd.h: THREAD 1, THREAD_GROUP 2, PROCESS_GROUP 4).
const PIDFD_SIGNAL_PROCESS_GROUP: u32 = 1 << 2;

/// The `AUDIT_ARCH_*` value of this build's architecture (linux/audit.h).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Offsets in `struct seccomp_data`: nr (int), arch (u32), instruction
/// pointer (u64), then args[6] (u64 each); the low half of args[3] (flags)
/// comes first on a little-endian machine.
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG3_LOW: u32 = 16 + 3 * 8;

fn statement(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt: 0, jf: 0, k }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt, jf, k }
}

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let Some((program, rest)) = args.split_first() else {
        eprintln!("usage: isorun-deny-pidfd-group PROGRAM [ARGS...]");
        std::process::exit(2);
    };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let allow = libc::SECCOMP_RET_ALLOW;
    let filter = [
        // Another architecture's calls (there is none here) pass untouched.
        statement(load, ARCH),
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, AUDIT_ARCH, 0, 4),
        statement(load, NR),
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, libc::SYS_pidfd_send_signal as u32, 0, 2),
        statement(load, ARG3_LOW),
        jump(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, PIDFD_SIGNAL_PROCESS_GROUP, 1, 0),
        statement(libc::BPF_RET | libc::BPF_K, allow),
        statement(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | libc::EINVAL as u32),
    ];
    let program_filter = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
    // SAFETY: prctl with a filter program that outlives the call.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            panic!("PR_SET_NO_NEW_PRIVS: {}", std::io::Error::last_os_error());
        }
        let program_address = &program_filter as *const libc::sock_fprog;
        if libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, program_address, 0, 0) != 0 {
            panic!("PR_SET_SECCOMP: {}", std::io::Error::last_os_error());
        }
    }
    let error = std::process::Command::new(program).args(rest).exec();
    eprintln!("isorun-deny-pidfd-group: cannot run {}: {error}", program.to_string_lossy());
    std::process::exit(127);
}
