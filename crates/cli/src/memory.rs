//! The process-wide memory policy of `berth`: giving the heap a burst of RPCs freed back to the
//! kernel, so the idle runtime stays small (and the same, on a timer, for the node agent; and
//! after a large list, for the API server).
//!
//! glibc's malloc gives each thread that allocates its own arena (up to 8 per core) and keeps
//! freed memory there for reuse: after a burst of pods on tokio's blocking threads, the idle
//! runtime would hold several MiB it no longer uses. Fewer arenas, and a `malloc_trim` once the
//! RPCs have been quiet for a second, return it. Both are glibc calls; elsewhere they do nothing.
//!
//! The same quiet moment also unmaps the code pages the burst touched. `berth` is one binary
//! with every part in it, and the kernel maps file pages 64 KiB around each one touched, so a
//! runtime that served pods keeps 10-15 MiB of mostly unrelated code mapped. Clean, read-only
//! file pages are copies of the page cache: dropping them from the working set (as a kernel
//! under memory pressure would) loses nothing, and the next RPC maps back what it runs.

use std::time::Duration;

/// How long without a new RPC counts as quiet.
const QUIET: Duration = Duration::from_secs(1);

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

/// Unmaps the resident code and read-only data pages of this process; they stay in the page
/// cache and fault back in when used (the monitor's own trim, [`berth_monitor::trim`]).
pub fn release_clean_file_pages() {
    berth_monitor::trim::drop_file_pages();
}

/// Trims every `period`, for a process that is never quiet for long (the node agent, whose pod
/// workers and heartbeats wake it every few seconds): what it touched in between faults back.
pub fn spawn_trim_every(period: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            trim();
            release_clean_file_pages();
        }
    })
}

/// Trims once after each burst of RPCs (`rpcs` counts those started), when a tick finds no RPC
/// since the previous one; never during a burst, whose next allocations would fault the pages
/// right back in.
pub fn spawn_trim_when_quiet(rpcs: fn() -> u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(QUIET);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut seen, mut trimmed) = (rpcs(), u64::MAX);
        loop {
            tick.tick().await;
            let now = rpcs();
            if now == seen && now != trimmed {
                trim();
                release_clean_file_pages();
                trimmed = now;
            }
            seen = now;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rss_file_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("RssFile:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn releasing_the_code_pages_of_this_process_shrinks_it_and_keeps_it_running() {
        let before = rss_file_kib();
        release_clean_file_pages();
        let after = rss_file_kib();
        assert!(after < before, "RssFile {before} kB before, {after} kB after");
        // Code and constants fault back in: formatting and parsing still work.
        assert_eq!(format!("{}", "42".parse::<u32>().unwrap() + 1), "43");
    }
}
