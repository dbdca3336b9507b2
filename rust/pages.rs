//! Fresh memory for large outputs in transparent huge pages.
//!
//! A request's bytes (megabytes) are written into memory the allocator has
//! just taken from the kernel (what tinker's encoder freed before has gone
//! back to it): every 4 KiB page of it faults on first write. Where the
//! kernel's transparent huge pages setting is `madvise`, asking for huge
//! pages on the 2 MiB-aligned inside of the buffer before writing it makes
//! that one fault per 2 MiB. Memory already faulted in is unaffected, and
//! the advice is only a hint: nothing computed depends on it.
//! `TINKER_RL_DATA_HUGEPAGES=0` turns it off (to compare).

use std::sync::OnceLock;

/// Huge pages are asked for only from this size on (one 2 MiB page at least
/// fits inside, and the faults are worth a system call).
pub const ADVISE_AT: usize = 4 << 20;

const HUGE_PAGE: usize = 2 << 20;

fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("TINKER_RL_DATA_HUGEPAGES").is_none_or(|v| v != "0"))
}

/// The 2 MiB-aligned range inside `[start, start + len)`, if any.
fn aligned_inside(start: usize, len: usize) -> Option<(usize, usize)> {
    let first = start.checked_add(HUGE_PAGE - 1)? & !(HUGE_PAGE - 1);
    let end = start.checked_add(len)? & !(HUGE_PAGE - 1);
    (end > first).then(|| (first, end - first))
}

/// Ask for huge pages for the buffer at `start` of `len` bytes (nothing
/// below [`ADVISE_AT`], off Linux, or when turned off).
pub fn advise_huge_pages(start: *const u8, len: usize) {
    if len < ADVISE_AT || !enabled() {
        return;
    }
    if let Some((first, size)) = aligned_inside(start as usize, len) {
        advise(first, size);
    }
}

#[cfg(target_os = "linux")]
fn advise(first: usize, size: usize) {
    const MADV_HUGEPAGE: i32 = 14;
    extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, length: usize, advice: i32) -> i32;
    }
    // SAFETY: `first..first + size` lies inside one live buffer the caller
    // owns (page-aligned, as madvise requires); MADV_HUGEPAGE changes how
    // the kernel backs it, never its contents. A failure (EINVAL where THP
    // is off) is ignored: the advice is a hint.
    unsafe {
        madvise(first as *mut std::ffi::c_void, size, MADV_HUGEPAGE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise(_first: usize, _size: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_aligned_inside() {
        assert_eq!(aligned_inside(0, HUGE_PAGE), Some((0, HUGE_PAGE)));
        assert_eq!(aligned_inside(1, HUGE_PAGE), None);
        assert_eq!(aligned_inside(1, 3 * HUGE_PAGE), Some((HUGE_PAGE, 2 * HUGE_PAGE)));
        assert_eq!(
            aligned_inside(HUGE_PAGE - 16, HUGE_PAGE + 32),
            Some((HUGE_PAGE, HUGE_PAGE))
        );
        assert_eq!(aligned_inside(usize::MAX - 8, 4), None);
    }

    #[test]
    fn advising_a_buffer_leaves_its_contents() {
        let mut buffer = vec![7u8; 3 * ADVISE_AT];
        advise_huge_pages(buffer.as_ptr(), buffer.len());
        buffer[ADVISE_AT] = 9;
        assert!(buffer
            .iter()
            .enumerate()
            .all(|(i, &b)| b == if i == ADVISE_AT { 9 } else { 7 }));
    }
}
