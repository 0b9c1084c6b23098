//! The eval readers held to the allocation bound: reading N bytes of an
//! untrusted file never holds more than max(64 MiB, 16 × N) at once. Every
//! test here measures what the whole process has allocated, so these tests
//! have a binary of their own (the tests of one binary run in parallel
//! threads) and each holds [`serial`] for its whole body: one test's set-up
//! must not count in another's measurement.
//!
//! A binary has one global allocator, and two instruments count through
//! it: `isorun-alloc-bound`'s ([`CountingAllocator`], its `bounded` and
//! `mutations`), which `alloc_bound` and `compressed_arrow` use, and the
//! plain live-bytes peak of [`peak`], which `reader_bounds` and
//! `reader_bounds_pages` use.

mod alloc_bound;
mod compressed_arrow;
mod peak;
mod reader_bounds;
mod reader_bounds_pages;
#[path = "../eval/util.rs"]
#[allow(dead_code)] // the eval binary's helpers; this binary uses some
mod util;

pub use isorun_alloc_bound::serial;
use isorun_alloc_bound::CountingAllocator;
use std::alloc::{GlobalAlloc, Layout};

/// Counts every allocation in both instruments: [`peak`]'s count first,
/// then `isorun-alloc-bound`'s (which allocates from the system). A
/// request either refuses is refused.
struct BothCounts;

static COUNTING: CountingAllocator = CountingAllocator::new();

#[global_allocator]
static ALLOCATOR: BothCounts = BothCounts;

// SAFETY: every request is forwarded unchanged to CountingAllocator, which
// forwards it to the system allocator; peak's counters only decide whether
// it is made at all (a refused one returns null, which GlobalAlloc allows).
unsafe impl GlobalAlloc for BothCounts {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !peak::reserve(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        let p = unsafe { COUNTING.alloc(layout) };
        if p.is_null() {
            peak::release(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !peak::reserve(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, as GlobalAlloc::alloc_zeroed requires.
        let p = unsafe { COUNTING.alloc_zeroed(layout) };
        if p.is_null() {
            peak::release(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr was allocated by COUNTING with this layout (above).
        unsafe { COUNTING.dealloc(ptr, layout) };
        peak::release(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old && !peak::reserve(new_size - old) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's pointer, layout and size, as GlobalAlloc::realloc requires.
        let p = unsafe { COUNTING.realloc(ptr, layout, new_size) };
        if p.is_null() {
            if new_size > old {
                peak::release(new_size - old);
            }
        } else if new_size < old {
            peak::release(old - new_size);
        }
        p
    }
}
