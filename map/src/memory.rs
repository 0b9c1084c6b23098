//! A call's own memory, without what it shares with the zygote. A forked
//! call starts with every page of the zygote mapped copy-on-write, and
//! `RssAnon` counts those pages in the call too: a zygote that imported
//! TensorFlow would put its hundreds of MiB into every call's limit and
//! peak. `Private_Dirty` of `/proc/PID/smaps_rollup` counts only the pages
//! this process alone maps and has written (its allocations, the zygote
//! pages it copied by writing them, its own shared memory); file pages it
//! only reads (a library it imported itself) are page cache, left out as
//! `run` leaves them out of a worker's figure.
//!
//! Reading `smaps_rollup` walks the page tables (tens of ms for a GiB
//! here), too dear for every 10 ms poll, while `/proc/PID/status` costs
//! microseconds. So [`PrivateMemory`] reads the rollup at most every ten
//! times its own cost, and between reads adds what `RssAnon + RssShmem`
//! grew by since the last one (new allocations show at once; a
//! copy-on-write copy only at the next rollup), and [`PrivateMemory::exact`]
//! reads it afresh before a limit kills.

use std::time::{Duration, Instant};

/// Polls one process's private memory.
pub struct PrivateMemory {
    pid: u32,
    /// `RssAnon + RssShmem` less the private memory, at the last rollup.
    shared: u64,
    last: Option<Instant>,
    every: Duration,
}

impl PrivateMemory {
    pub fn new(pid: u32) -> PrivateMemory {
        PrivateMemory { pid, shared: 0, last: None, every: Duration::ZERO }
    }

    /// The private memory now, bytes: exact when a rollup is due, else the
    /// last rollup plus the growth since; `None` once the process is gone.
    pub fn now(&mut self) -> Option<u64> {
        if self.last.is_none_or(|last| last.elapsed() >= self.every) {
            return self.exact();
        }
        Some(resident(self.pid)?.saturating_sub(self.shared))
    }

    /// The private memory now, read from `smaps_rollup`.
    pub fn exact(&mut self) -> Option<u64> {
        let started = Instant::now();
        let resident = resident(self.pid)?;
        let private = private_dirty(self.pid)?;
        self.shared = resident.saturating_sub(private);
        self.every = started.elapsed() * 10;
        self.last = Some(Instant::now());
        Some(private)
    }
}

/// `RssAnon + RssShmem` of `/proc/PID/status`, bytes.
fn resident(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    sum_kib(&status, &["RssAnon:", "RssShmem:"])
}

/// `Private_Dirty` of `/proc/PID/smaps_rollup`, bytes.
fn private_dirty(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    sum_kib(&rollup, &["Private_Dirty:"])
}

/// The sum of `NAME: N kB` lines, in bytes; `None` when one is missing.
fn sum_kib(text: &str, names: &[&str]) -> Option<u64> {
    names.iter().try_fold(0u64, |total, name| {
        let line = text.lines().find_map(|line| line.strip_prefix(name))?;
        let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(total + kib * 1024)
    })
}

/// Resident memory (`VmRSS`) of a process, bytes.
pub fn vm_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    sum_kib(&status, &["VmRSS:"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kib_fields_are_summed_in_bytes_and_a_missing_one_is_none() {
        let text = "Rss:  10 kB\nPrivate_Dirty:     3 kB\nRssShmem:\t2 kB\n";
        assert_eq!(sum_kib(text, &["Private_Dirty:", "RssShmem:"]), Some(5 * 1024));
        assert_eq!(sum_kib(text, &["Swap:"]), None);
    }

    #[test]
    fn memory_written_after_a_fork_is_private_and_the_parent_s_is_not() {
        // 64 MiB written by this process, then a child that writes 16 MiB
        // of its own: the child's private memory is about its own 16 MiB.
        let parent = vec![1u8; 64 << 20];
        // SAFETY: the child only touches memory and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // Only async-signal-safe calls here: the test harness has threads.
            let size = 16 << 20;
            // SAFETY: a fresh anonymous mapping, written within its bounds.
            unsafe {
                let own = libc::mmap(
                    std::ptr::null_mut(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                ) as *mut u8;
                if !own.is_null() && own as isize != -1 {
                    for offset in (0..size).step_by(4096) {
                        own.add(offset).write_volatile(2);
                    }
                }
                libc::sleep(2);
                libc::_exit(0);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        let private = PrivateMemory::new(pid as u32).exact().unwrap();
        // SAFETY: our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        std::hint::black_box(&parent);
        assert!((16 << 20..40 << 20).contains(&private), "{private}");
    }
}
