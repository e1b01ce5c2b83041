//! A software prefetch: asks the memory system for a value's cache line ahead of its use, so that
//! loads from tables larger than the caches overlap instead of waiting one miss at a time. Only a
//! hint: it changes no result and never faults.

/// Brings the cache line holding `value` towards the core (into every cache level).
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and cannot fault; `value` is a valid
    // reference anyway. SSE is part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
