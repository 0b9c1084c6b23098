//! `isorun-deny-pidfd-group PROGRAM [ARGS...]`: runs PROGRAM as if on a
//! kernel before Linux 6.9, where `pidfd_send_signal` knows no
//! `PIDFD_SIGNAL_PROCESS_GROUP` and answers EINVAL. A seccomp filter (kept
//! by PROGRAM's children: the zygote and its workers) makes exactly those
//! calls fail that way; every other system call is untouched. Tests use it
//! to prove that workers are still killed where that flag is missing.

#[path = "../seccomp_wrapper.rs"]
mod seccomp_wrapper;

use seccomp_wrapper::{allow, arg_low, exec_under, fail_with, jump, statement, ARCH, AUDIT_ARCH, LOAD, NR};

/// `PIDFD_SIGNAL_PROCESS_GROUP` (linux/pidfd.h: THREAD 1, THREAD_GROUP 2, PROCESS_GROUP 4).
const PIDFD_SIGNAL_PROCESS_GROUP: u32 = 1 << 2;

fn main() {
    let filter = [
        // Another architecture's calls (there is none here) pass untouched.
        statement(LOAD, ARCH),
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, AUDIT_ARCH, 0, 4),
        statement(LOAD, NR),
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, libc::SYS_pidfd_send_signal as u32, 0, 2),
        // flags, the low half of args[3]
        statement(LOAD, arg_low(3)),
        jump(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, PIDFD_SIGNAL_PROCESS_GROUP, 1, 0),
        allow(),
        fail_with(libc::EINVAL),
    ];
    exec_under("isorun-deny-pidfd-group", &filter)
}
