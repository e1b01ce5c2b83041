//! How the dpcurve processes ask the C allocator to keep the memory they free.
//!
//! A grouped private aggregate holds one exact statistic per group and partition (100 declared
//! groups of a 1 024-point KDE: ≈ 15 MB of zeroed i128 sums and buffers, and their Arrow states)
//! and frees it when the query ends. glibc's allocator returns such memory to the kernel at every
//! free — chunks above its (dynamic) mmap threshold are unmapped, and an arena's free top above
//! 128 KiB is trimmed — so the next query faults every page in again: ≈ 20 % of a grouped KDE over
//! 10³ rows went to page faults (`docs/performance.md`). [`keep_freed_memory`] fixes the mmap
//! threshold at 32 MiB (glibc's largest) and lets each arena keep up to 128 MiB of free memory at
//! its top, so a query reuses the pages the last one freed.
//!
//! It is a process-wide choice, so the library never makes it: the `dpcurve` binary (CLI, server,
//! cluster processes) and the benchmarks call it first thing, and an embedding program may. What
//! is kept depends only on the sizes allocated — for private aggregates, functions of public
//! parameters — never on the data. Other allocators than glibc's are left alone.

/// Keeps freed memory in the process (module docs). Returns whether the allocator took the
/// settings (false off glibc).
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets the allocator's global parameters (under its own lock).
        let mmap = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        let trim = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) };
        mmap == 1 && trim == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Allocations from this size on are mapped on their own (glibc's largest accepted value on 64-bit).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;

/// Free memory an arena keeps at its top before returning it to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 128 << 20;

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_settings() {
        assert!(super::keep_freed_memory(), "mallopt refused a value (the mmap threshold above 32 MiB?)");
    }
}
