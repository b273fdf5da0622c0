//! How ingest asks the C allocator for memory. In: nothing. Out: glibc's
//! mmap threshold fixed at 128 KiB, set once at the start of `main`.
//!
//! Ingest churns through large, short-lived blocks: librdkafka's fetch
//! responses (up to `fetch.max.bytes`), a batch's row buffers, its
//! request-id set. glibc serves a block over its mmap threshold with a
//! mapping of its own, returned to the kernel when freed, but every such
//! free raises the threshold to the block's size (up to 32 MiB). After the
//! first few batches the large blocks therefore come from glibc's heaps,
//! one per thread, where freed memory stays resident and fragmented.
//! Setting the threshold explicitly turns that raising off: on the
//! benchmark's 1,000,000 events the peak RSS went from 209–239 MB to
//! 135–146 MB, and to 163–169 MB once the written row buffers were kept
//! for reuse ([`crate::batch::BufferPool`], which saves the page faults of
//! fresh memory for every batch; `docs/performance.md`). An operator who sets
//! `MALLOC_MMAP_THRESHOLD_` keeps their value; other allocators (musl) are
//! left alone.

/// The threshold: glibc's own starting value, kept instead of raised.
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD`] unless the
/// environment sets one.
pub fn fix_mmap_threshold() {
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        set_threshold();
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn set_threshold() -> bool {
    // SAFETY: mallopt only updates glibc's malloc parameters (under its own
    // lock); it takes no pointers and may be called at any time.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_threshold() -> bool {
    false
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_threshold() {
        assert!(super::set_threshold(), "mallopt refused M_MMAP_THRESHOLD = {}", super::MMAP_THRESHOLD);
    }
}
