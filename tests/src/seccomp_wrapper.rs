//! What the `isorun-deny-*` helpers share: they run a program under a
//! seccomp filter that makes one system call fail the way an older kernel
//! does (the filter is kept by the program's children: the zygote and its
//! workers). Each helper builds its filter from these pieces and hands it to
//! [`exec_under`].

use std::os::unix::process::CommandExt;

/// The `AUDIT_ARCH_*` value of this build's architecture (linux/audit.h).
#[cfg(target_arch = "x86_64")]
pub const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
pub const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Offsets in `struct seccomp_data`: nr (int), arch (u32), instruction
/// pointer (u64), then args[6] (u64 each); the low half of an argument comes
/// first on a little-endian machine.
pub const NR: u32 = 0;
pub const ARCH: u32 = 4;
pub const fn arg_low(index: u32) -> u32 {
    16 + index * 8
}

/// Load a 32-bit word of `seccomp_data`.
pub const LOAD: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;

pub fn statement(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt: 0, jf: 0, k }
}

pub fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt, jf, k }
}

/// `RET errno` and `RET allow`.
pub fn fail_with(errno: i32) -> libc::sock_filter {
    statement(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | errno as u32)
}

pub fn allow() -> libc::sock_filter {
    statement(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW)
}

/// Installs `filter` and execs the program named by this helper's
/// arguments (`name PROGRAM [ARGS...]`); never returns.
pub fn exec_under(name: &str, filter: &[libc::sock_filter]) -> ! {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let Some((program, rest)) = args.split_first() else {
        eprintln!("usage: {name} PROGRAM [ARGS...]");
        std::process::exit(2);
    };
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
    eprintln!("{name}: cannot run {}: {error}", program.to_string_lossy());
    std::process::exit(127);
}
