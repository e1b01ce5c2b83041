//! A software prefetch: asks the memory system for a value's cache line ahead of its use, so that
//! loads from tables larger than the caches overlap instead of waiting one miss at a time. Only a
//! hint: it changes no result and never faults.

/// Brings the cache line holding `value` towards the core (into every cache level).
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    prefetch_byte((value as *const T).cast::<u8>());
}

/// Brings the cache lines of `value`'s first and last bytes towards the core: all of it when it
/// is at most a line long.
#[inline(always)]
pub(crate) fn prefetch_whole<T>(value: &T) {
    let first = (value as *const T).cast::<u8>();
    prefetch_byte(first);
    prefetch_byte(first.wrapping_add(size_of::<T>().saturating_sub(1)));
}

#[inline(always)]
fn prefetch_byte(byte: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and cannot fault, whatever the address.
    // SSE is part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(byte.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = byte;
}
