//! `isorun-deny-landlock PROGRAM [ARGS...]`: runs PROGRAM as if on a kernel
//! built without Landlock (before Linux 5.13, or with it left out): a
//! seccomp filter (kept by PROGRAM's children: the zygote and its workers)
//! makes `landlock_create_ruleset` fail with ENOSYS, which is how the
//! kernel says so; every other system call is untouched. Tests use it to
//! prove that the sandbox's fallback works and is reported: `landlock`,
//! `signal_scope` and `abstract_unix_scope` missing, the rest in force.
//! (A kernel with Landlock before ABI 6 lacks only the two scopes; seccomp
//! cannot fake an ABI number, so that case is covered by the same code path
//! that reports an ABI below 6, `isorun_sandbox::apply`.)

#[path = "../seccomp_wrapper.rs"]
#[expect(dead_code, reason = "argument offsets serve only the filters that look at arguments")]
mod seccomp_wrapper;

use seccomp_wrapper::{allow, exec_under, fail_with, jump, statement, ARCH, AUDIT_ARCH, LOAD, NR};

fn main() {
    let filter = [
        // Another architecture's calls (there is none here) pass untouched.
        statement(LOAD, ARCH),
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, AUDIT_ARCH, 0, 3),
        statement(LOAD, NR),
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, libc::SYS_landlock_create_ruleset as u32, 0, 1),
        fail_with(libc::ENOSYS),
        allow(),
    ];
    exec_under("isorun-deny-landlock", &filter)
}
