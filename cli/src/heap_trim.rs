//! The agent gives the memory a burst freed back to the system, on glibc.
//!
//! glibc keeps what is freed in its arenas and returns only the top of each heap, so a
//! burst stays resident after it is freed: a restart's load (the replica, the records, the
//! copy of each entry a snapshot shared), a bulk load decoded and joined. An owner of
//! 100,000 registrations held 252 MiB after a restart where it held 173 MiB before, and a
//! peer that received them 72 MiB for 30 MiB of live heap. `malloc_trim(0)` hands back
//! every whole free page of every arena. Other C libraries (musl) give memory back as it
//! is freed: there this does nothing.

use std::time::Duration;

/// How often the heap is trimmed: soon enough after a burst that its pages are not kept
/// for long, seldom enough that an idle agent spends nothing measurable on it (each trim
/// walks the free lists: about a millisecond for a heap of 200 MiB).
pub const EVERY: Duration = Duration::from_secs(10);

/// Trims the heap every [`EVERY`] until the runtime ends (on glibc; elsewhere nothing).
pub fn spawn() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::spawn(async {
        let mut every = tokio::time::interval(EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await; // the first tick is at once
        loop {
            every.tick().await;
            trim();
        }
    });
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // a C library call
fn trim() {
    // SAFETY: `malloc_trim` takes no pointer and touches only glibc's own free lists,
    // under each arena's lock, so it is safe from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
