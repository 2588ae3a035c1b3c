//! Memory hints for the large, randomly accessed arrays (the index's slot table, the
//! tokenizer's word table): huge pages, and software prefetches.
//!
//! Why: a lookup in a table of tens of MiB touches a random page, and with 4 KiB pages
//! nearly every such access also misses the TLB. Under virtualisation a TLB miss is a
//! two-dimensional page walk that can cost as much as the cache miss itself, and it
//! also stalls the software prefetches the index issues ahead of its probes. Backing
//! the array with transparent huge pages (2 MiB) removes most of those walks.
//!
//! Guarantees: these are hints only. They never change contents or layout, never fail
//! visibly (a kernel without THP, or with THP disabled, just ignores them), and are
//! no-ops off Linux.

/// Smallest allocation worth a hint: below two huge pages no aligned 2 MiB range is
/// guaranteed to lie inside it.
const MIN_BYTES: usize = 4 << 20;

const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back the capacity of `v` (not yet touched, ideally: call this
/// right after `Vec::with_capacity`, before filling it) with huge pages.
pub fn advise_huge_pages<T>(v: &mut Vec<T>) {
    let bytes = v.capacity().saturating_mul(std::mem::size_of::<T>());
    if bytes < MIN_BYTES {
        return;
    }
    let start = v.as_mut_ptr() as usize;
    let first = start.next_multiple_of(HUGE_PAGE);
    let end = (start + bytes) / HUGE_PAGE * HUGE_PAGE;
    if end <= first {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: [first, end) lies inside the allocation owned by `v` and is page
    // aligned; MADV_HUGEPAGE changes no contents and no mapping visible to Rust.
    unsafe {
        libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
    }
}

/// Asks the CPU to bring the cache line at `p` into every cache level, so that a load
/// issued later finds it there: a lookup that knows its address some work ahead of
/// the load overlaps its miss with that work. A no-op off x86-64.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
    // SAFETY: a prefetch never faults and reads nothing architecturally, whatever the
    // address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    #[test]
    fn hint_keeps_contents_and_capacity() {
        let mut v: Vec<u64> = Vec::with_capacity(1 << 20);
        super::advise_huge_pages(&mut v);
        v.resize(1 << 20, 7);
        assert!(v.iter().all(|&x| x == 7));
        assert_eq!(v.len(), 1 << 20);
        let mut small: Vec<u8> = Vec::with_capacity(10);
        super::advise_huge_pages(&mut small);
        small.push(1);
        assert_eq!(small, [1]);
    }
}
