//! A shared-memory mailbox beside a worker's socket, for `pipe`: one small
//! request and its answer at a time pass through memory that both processes
//! map, while each side polls for the other's (`--spin-us`). A request that
//! comes within the worker's poll, and an answer within the supervisor's,
//! then cost no system call at all: over the socket, the same crossing took
//! four (send and read each way), most of a tiny model's request.
//!
//! The socket stays the channel for everything else (requests with
//! descriptors or too large for the mailbox, `Loaded`, `Sandboxed`, a
//! worker's end) and for waking a side that stopped polling: a side that
//! goes to sleep says so in the mailbox (`*_waiting`) and then waits on the
//! socket; the other, after posting, looks at that flag and sends a `Wake`
//! on the socket. Both sides store, fence (`SeqCst`) and load in opposite
//! order, so at least one of them sees the other's store: no wake-up is lost.
//!
//! The worker is untrusted and can write anywhere in the mailbox at any
//! time. So the supervisor reads every word of it once, bounds the length
//! it claims by the area's size, copies the bytes out before decoding them
//! (under the same limits as a frame), and takes a flag the worker sets only
//! as a hint: it never waits for the worker longer than its own tick. The
//! memfd is sealed against shrinking and growing, so a worker cannot
//! truncate it and make the supervisor's next read of its mapping fault.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Room for one request's message, and for one answer's.
pub const MAILBOX_AREA: usize = 64 << 10;

/// The control words, a cache line apart, before the two areas.
const REQUEST_SEQ: usize = 0;
const REQUEST_LEN: usize = 8;
const ANSWER_SEQ: usize = 64;
const ANSWER_LEN: usize = 72;
const WORKER_WAITING: usize = 128;
const SUPERVISOR_WAITING: usize = 192;
const WORKER_ATTACHED: usize = 256;
const REQUEST_AREA: usize = 4096;
const ANSWER_AREA: usize = REQUEST_AREA + MAILBOX_AREA;
/// The whole mailbox.
pub const MAILBOX_SIZE: usize = ANSWER_AREA + MAILBOX_AREA;

/// Seals the supervisor puts on the mailbox before it is sent: no growing,
/// no shrinking (which would fault the other side's reads), no new seal.
const SEALS: libc::c_int = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// One mapping of a mailbox (each process has its own).
pub struct Mailbox {
    fd: OwnedFd,
    base: *mut u8,
}

// SAFETY: every access to the mapping goes through atomics or raw copies
// that tolerate concurrent writers (the other process); the pointer is valid
// for the mailbox's life.
unsafe impl Send for Mailbox {}

impl Drop for Mailbox {
    fn drop(&mut self) {
        // SAFETY: base and MAILBOX_SIZE are what mmap returned and mapped.
        unsafe { libc::munmap(self.base.cast(), MAILBOX_SIZE) };
    }
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox").field("fd", &self.fd.as_raw_fd()).finish()
    }
}

impl Mailbox {
    /// A new mailbox (the supervisor's side): a sealed memfd, mapped.
    pub fn create() -> io::Result<Mailbox> {
        // SAFETY: a constant name; the descriptor is owned at once.
        let fd = unsafe { libc::memfd_create(c"isorun-mailbox".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor, ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain calls on a descriptor we own.
        unsafe {
            if libc::ftruncate(fd.as_raw_fd(), MAILBOX_SIZE as libc::off_t) < 0
                || libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Mailbox::map(fd)
    }

    /// The worker's side: maps the mailbox the supervisor sent and says so.
    /// A file that is not a mailbox's size is refused.
    pub fn attach(fd: BorrowedFd<'_>) -> io::Result<Mailbox> {
        let fd = fd.try_clone_to_owned()?;
        // SAFETY: fstat writes only into stat.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above, on a descriptor we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } < 0 {
            return Err(io::Error::last_os_error());
        }
        if stat.st_size != MAILBOX_SIZE as libc::off_t {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a mailbox of {} bytes (expected {MAILBOX_SIZE})", stat.st_size),
            ));
        }
        let mailbox = Mailbox::map(fd)?;
        mailbox.word32(WORKER_ATTACHED).store(1, Ordering::Release);
        Ok(mailbox)
    }

    fn map(fd: OwnedFd) -> io::Result<Mailbox> {
        // SAFETY: a fresh shared mapping of the whole file (its size is MAILBOX_SIZE, sealed on the supervisor's side).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MAILBOX_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mailbox { fd, base: base.cast() })
    }

    /// Its descriptor, to send to the worker.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn word64(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offset is one of the aligned control words, inside the mapping.
        unsafe { &*self.base.add(offset).cast::<AtomicU64>() }
    }

    fn word32(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.base.add(offset).cast::<AtomicU32>() }
    }

    /// Whether the worker has mapped the mailbox (and reads it).
    pub fn worker_attached(&self) -> bool {
        self.word32(WORKER_ATTACHED).load(Ordering::Acquire) == 1
    }

    /// Posts request `seq`'s message (the supervisor): `None` when it does
    /// not fit, else whether the worker said it sleeps on the socket (then
    /// it needs a `Wake` there).
    pub fn post_request(&self, seq: u64, message: &[u8]) -> Option<bool> {
        self.post(REQUEST_AREA, REQUEST_LEN, REQUEST_SEQ, seq, message)?;
        Some(self.word32(WORKER_WAITING).load(Ordering::SeqCst) == 1)
    }

    /// Posts the answer to request `seq` (the worker): `None` when it does
    /// not fit, else whether the supervisor said it sleeps on the socket.
    pub fn post_answer(&self, seq: u64, message: &[u8]) -> Option<bool> {
        self.post(ANSWER_AREA, ANSWER_LEN, ANSWER_SEQ, seq, message)?;
        Some(self.word32(SUPERVISOR_WAITING).load(Ordering::SeqCst) == 1)
    }

    fn post(&self, area: usize, len: usize, seq_word: usize, seq: u64, message: &[u8]) -> Option<()> {
        if message.len() > MAILBOX_AREA {
            return None;
        }
        // SAFETY: the area holds MAILBOX_AREA bytes; the other side reads it
        // only after seeing `seq`, which is stored after these bytes (Release).
        unsafe { std::ptr::copy_nonoverlapping(message.as_ptr(), self.base.add(area), message.len()) };
        self.word64(len).store(message.len() as u64, Ordering::Relaxed);
        self.word64(seq_word).store(seq, Ordering::Release);
        // Against the other side's store of its waiting flag and load of `seq`.
        fence(Ordering::SeqCst);
        Some(())
    }

    /// The request after `last` (the worker): its number and a copy of its message.
    pub fn take_request(&self, last: u64) -> Option<(u64, Vec<u8>)> {
        let seq = self.word64(REQUEST_SEQ).load(Ordering::Acquire);
        (seq != last).then(|| (seq, self.copy_out(REQUEST_AREA, REQUEST_LEN)))
    }

    /// Whether the answer to request `seq` is there (nothing copied).
    pub fn answer_ready(&self, seq: u64) -> bool {
        self.word64(ANSWER_SEQ).load(Ordering::Acquire) == seq
    }

    /// A copy of the answer to request `seq` (the supervisor), once it is
    /// there; a length over the area is taken as the area (the decoder
    /// then refuses what it holds).
    pub fn take_answer(&self, seq: u64) -> Option<Vec<u8>> {
        self.answer_ready(seq).then(|| self.copy_out(ANSWER_AREA, ANSWER_LEN))
    }

    fn copy_out(&self, area: usize, len: usize) -> Vec<u8> {
        // Read once: the other side may change it at any time.
        let len = (self.word64(len).load(Ordering::Relaxed) as usize).min(MAILBOX_AREA);
        let mut bytes = vec![0u8; len];
        // SAFETY: at most MAILBOX_AREA bytes of the area, into our own buffer.
        // A writer in the other process may change them meanwhile: the copy
        // is then torn, which only its decoding can notice.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(area), bytes.as_mut_ptr(), len) };
        bytes
    }

    /// The worker says whether it waits on the socket (then a request
    /// posted needs a `Wake`). After saying so it must look for a request
    /// once more before it sleeps.
    pub fn set_worker_waiting(&self, waiting: bool) {
        self.word32(WORKER_WAITING).store(u32::from(waiting), Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// The supervisor says whether it waits on the socket; as above.
    pub fn set_supervisor_waiting(&self, waiting: bool) {
        self.word32(SUPERVISOR_WAITING).store(u32::from(waiting), Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }
}

/// How often a side polling the mailbox gives its CPU away. Measured with
/// `pipe` on 2 CPUs, a client reading its answers beside: every look, every
/// 0.5 µs and every 2 µs gave rates within noise of each other, 2 µs the
/// lowest; a longer stretch keeps the client off a CPU it needs.
const YIELD_EVERY: Duration = Duration::from_nanos(500);

/// The pause between two looks at the mailbox: the CPU's spin hint, and
/// every [`YIELD_EVERY`] a `sched_yield`, so that a process waiting for
/// this CPU (the client reading answers, the other side woken here) runs
/// within microseconds. Looking costs a load, not a system call: most looks
/// are free, and one finds what was posted within a fraction of a microsecond.
#[derive(Debug)]
pub struct Relax {
    last_yield: Instant,
}

impl Default for Relax {
    fn default() -> Self {
        Relax { last_yield: Instant::now() }
    }
}

impl Relax {
    /// Pauses once; `now` is the caller's clock reading.
    pub fn pause(&mut self, now: Instant) {
        std::hint::spin_loop();
        if now.duration_since(self.last_yield) >= YIELD_EVERY {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
            self.last_yield = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_and_its_answer_cross_between_two_mappings() {
        let supervisor = Mailbox::create().unwrap();
        assert!(!supervisor.worker_attached());
        let worker = Mailbox::attach(supervisor.fd()).unwrap();
        assert!(supervisor.worker_attached());
        assert_eq!(worker.take_request(0), None, "nothing posted yet");
        assert_eq!(supervisor.post_request(1, b"request"), Some(false));
        assert_eq!(worker.take_request(0), Some((1, b"request".to_vec())));
        assert_eq!(worker.take_request(1), None, "taken once");
        assert_eq!(supervisor.take_answer(1), None);
        worker.set_worker_waiting(true);
        assert_eq!(supervisor.post_request(2, b"next"), Some(true), "a sleeping worker needs a Wake");
        worker.set_worker_waiting(false);
        supervisor.set_supervisor_waiting(true);
        assert_eq!(worker.post_answer(1, b"answer"), Some(true));
        assert_eq!(supervisor.take_answer(1), Some(b"answer".to_vec()));
        assert_eq!(supervisor.post_request(3, &vec![0; MAILBOX_AREA + 1]), None, "too large for the mailbox");
    }

    /// What a hostile worker can do to the mailbox harms only itself: a
    /// length over the area is cut to it, and the memfd cannot be truncated
    /// under the supervisor's mapping (its next read would fault) or grown.
    #[test]
    fn a_worker_cannot_make_the_supervisor_read_past_the_area_or_fault() {
        let supervisor = Mailbox::create().unwrap();
        let worker = Mailbox::attach(supervisor.fd()).unwrap();
        worker.word64(ANSWER_LEN).store(u64::MAX, Ordering::Relaxed);
        worker.word64(ANSWER_SEQ).store(5, Ordering::Release);
        assert_eq!(supervisor.take_answer(5).map(|b| b.len()), Some(MAILBOX_AREA));
        // SAFETY: plain calls on a descriptor the worker holds.
        unsafe {
            assert!(libc::ftruncate(worker.fd.as_raw_fd(), 0) < 0, "shrinking is sealed");
            assert!(libc::ftruncate(worker.fd.as_raw_fd(), 2 * MAILBOX_SIZE as libc::off_t) < 0, "growing too");
            assert!(libc::fcntl(worker.fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) < 0, "and sealing");
        }
        assert_eq!(supervisor.take_answer(5).map(|b| b.len()), Some(MAILBOX_AREA));
        // A file of another size is no mailbox.
        let other = crate::SharedMemory::from_bytes(b"not a mailbox").unwrap();
        assert!(Mailbox::attach(other.fd()).is_err());
    }
}
