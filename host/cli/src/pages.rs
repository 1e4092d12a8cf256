//! The host process's memory pages: the kernel's 4 KiB pages, not
//! transparent huge pages.
//!
//! mimalloc asks for transparent huge pages on the memory it maps for its
//! heap (`madvise(MADV_HUGEPAGE)`), so where the kernel gives them on
//! request (`madvise`, the common default) the first write to each 2 MiB
//! of a growing heap makes the kernel zero the whole 2 MiB at once. The
//! host's heap grows with every job that starts in job isolation (the
//! instance's store and records, tens of KiB each), in small pieces spread
//! over many mimalloc pages, so a start could pay for zeroing 2 MiB of
//! which it used a few KiB. With 4 KiB pages a start zeroes about what it
//! uses. Measured (BENCHMARKS.md "The host's heap in
//! 4 KiB pages"): starts in job isolation one at a time 16 % faster at a
//! sixth less host CPU each; an idle host 55 MiB smaller.
//!
//! `MIMALLOC_ALLOW_THP` in the environment decides instead: mimalloc reads
//! it when the process starts (`0` turns huge pages off, `1` keeps them).

/// Turns transparent huge pages off for this process's later page faults
/// (`prctl(PR_SET_THP_DISABLE)`), unless `MIMALLOC_ALLOW_THP` says how.
/// Pages already in place stay as they are.
pub(crate) fn prefer_small_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Err(error) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!(%error, "transparent huge pages stay as the kernel gives them");
    }
}
