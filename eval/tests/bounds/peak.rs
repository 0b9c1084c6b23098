//! The plain count `reader_bounds` and `reader_bounds_pages` measure with:
//! live bytes and their peak, a reallocation counted by its growth only,
//! and any request that would take live bytes past 8 GiB refused (a null
//! pointer: the process aborts), so a reader that amplifies aborts this
//! binary instead of exhausting the machine. Counted by the binary's
//! allocator (`main.rs`); tests hold `serial()` while they measure.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Live bytes past which an allocation is refused, well under the
/// machine's memory.
const REFUSE_PAST: usize = 8 << 30;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Counts `n` more live bytes, or refuses them (false) past [`REFUSE_PAST`].
pub fn reserve(n: usize) -> bool {
    let now = LIVE.fetch_add(n, Ordering::SeqCst) + n;
    if now > REFUSE_PAST {
        LIVE.fetch_sub(n, Ordering::SeqCst);
        return false;
    }
    PEAK.fetch_max(now, Ordering::SeqCst);
    true
}

pub fn release(n: usize) {
    LIVE.fetch_sub(n, Ordering::SeqCst);
}

/// Runs `f`; its result and the most bytes it held at once beyond what was live before.
pub fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = LIVE.load(Ordering::SeqCst);
    PEAK.store(start, Ordering::SeqCst);
    let out = f();
    (out, PEAK.load(Ordering::SeqCst).saturating_sub(start))
}

/// The bound every reader is held to for a file of `n` bytes.
pub fn bound(n: u64) -> usize {
    (64usize << 20).max(16 * n as usize)
}

/// Runs `read` on a file of `n` bytes; its result and peak, checked against the bound.
pub fn bounded<T>(path: &Path, read: impl FnOnce() -> T) -> (T, usize) {
    let n = std::fs::metadata(path).unwrap().len();
    let (result, peak) = peak_of(read);
    eprintln!("{}: {n} bytes read, peak {peak} bytes held, bound {}", path.display(), bound(n));
    assert!(peak <= bound(n), "{}: {peak} bytes held reading {n} bytes, more than {}", path.display(), bound(n));
    (result, peak)
}
