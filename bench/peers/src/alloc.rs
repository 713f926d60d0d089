//! Counting global allocator: live heap bytes, process-wide (all threads, so an index's
//! background writer threads are counted too).
//!
//! Harness-owned storage (recorded answers) is allocated inside [`untracked`] so it does not
//! pollute an index's footprint. The rule that keeps the books straight: memory allocated
//! untracked is only ever grown / freed untracked.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

pub struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    static UNTRACKED: Cell<bool> = const { Cell::new(false) };
}

#[inline]
fn tracked() -> bool {
    !UNTRACKED.try_with(|u| u.get()).unwrap_or(false)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && tracked() {
            LIVE.fetch_add(layout.size() as isize, Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() && tracked() {
            LIVE.fetch_add(layout.size() as isize, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        if tracked() {
            LIVE.fetch_sub(layout.size() as isize, Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() && tracked() {
            LIVE.fetch_add(new_size as isize - layout.size() as isize, Relaxed);
        }
        p
    }
}

/// Requested bytes currently live (allocator overhead and fragmentation not included).
pub fn live_bytes() -> isize {
    LIVE.load(Relaxed)
}

/// Runs `f` with this thread's allocations not counted.
pub fn untracked<R>(f: impl FnOnce() -> R) -> R {
    UNTRACKED.with(|u| u.set(true));
    let r = f();
    UNTRACKED.with(|u| u.set(false));
    r
}
