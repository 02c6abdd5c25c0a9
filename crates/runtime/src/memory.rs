//! Giving the heap a burst of RPCs freed back to the kernel, so the idle runtime stays small.
//!
//! glibc's malloc gives each thread that allocates its own arena (up to 8 per core) and keeps
//! freed memory there for reuse: after a burst of pods on tokio's blocking threads, the idle
//! runtime would hold several MiB it no longer uses. Fewer arenas, and a `malloc_trim` once the
//! RPCs have been quiet for a second, return it. Both are glibc calls; elsewhere they do nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long without a new RPC counts as quiet.
const QUIET: Duration = Duration::from_secs(1);

/// RPCs started so far; the trimmer compares it between ticks.
static RPCS: AtomicU64 = AtomicU64::new(0);

/// Counts one RPC (the server's request layer calls it).
pub fn note_rpc() {
    RPCS.fetch_add(1, Ordering::Relaxed);
}

/// Caps malloc's arenas at two; call before the async runtime starts its threads.
pub fn limit_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a malloc tunable; M_ARENA_MAX takes any positive count.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Returns free heap pages of every arena to the kernel.
pub fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory; it is thread-safe.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Trims once after each burst of RPCs, when a tick finds no RPC since the previous one; never
/// during a burst, whose next allocations would fault the pages right back in.
pub fn spawn_trim_when_quiet() -> tokio::task::JoinHandle<()> {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(QUIET);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut seen, mut trimmed) = (RPCS.load(Ordering::Relaxed), u64::MAX);
        loop {
            tick.tick().await;
            let now = RPCS.load(Ordering::Relaxed);
            if now == seen && now != trimmed {
                trim();
                trimmed = now;
            }
            seen = now;
        }
    })
}
