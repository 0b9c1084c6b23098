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

use std::os::unix::process::CommandExt;

/// The `AUDIT_ARCH_*` value of this build's architecture (linux/audit.h).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Offsets in `struct seccomp_data`: nr (int), then arch (u32).
const NR: u32 = 0;
const ARCH: u32 = 4;

fn statement(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt: 0, jf: 0, k }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt, jf, k }
}

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let Some((program, rest)) = args.split_first() else {
        eprintln!("usage: isorun-deny-landlock PROGRAM [ARGS...]");
        std::process::exit(2);
    };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let filter = [
        // Another architecture's calls (there is none here) pass untouched.
        statement(load, ARCH),
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, AUDIT_ARCH, 0, 3),
        statement(load, NR),
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, libc::SYS_landlock_create_ruleset as u32, 0, 1),
        statement(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        statement(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
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
    eprintln!("isorun-deny-landlock: cannot run {}: {error}", program.to_string_lossy());
    std::process::exit(127);
}
