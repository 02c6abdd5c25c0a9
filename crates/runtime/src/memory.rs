//! Giving the heap a burst of RPCs freed back to the kernel, so the idle runtime stays small
//! (and the same, on a timer, for the node agent, which `berth` also is).
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

/// Unmaps the resident pages of every read-only private file mapping that holds no page of its
/// own (code and constants of the binary and its libraries; never relocated data, which
/// `Anonymous` pages show, nor anything writable). They stay in the page cache.
pub fn release_clean_file_pages() {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return };
    for range in clean_file_ranges(&smaps) {
        // SAFETY: the range is a whole mapping of this process, read-only, backed by an
        // unmodified file (the kernel refuses writes to a running binary, ETXTBSY) and without
        // private copies: MADV_DONTNEED only unmaps pages that fault back identical.
        #[allow(unsafe_code)]
        unsafe {
            libc::madvise(range.start as *mut libc::c_void, range.end - range.start, libc::MADV_DONTNEED);
        }
    }
}

/// The address ranges of `/proc/self/smaps` mappings that [`release_clean_file_pages`] may drop:
/// private, not writable, backed by a file (inode ≠ 0), resident, with no anonymous (copied)
/// and no locked pages.
fn clean_file_ranges(smaps: &str) -> Vec<std::ops::Range<usize>> {
    struct Mapping {
        range: std::ops::Range<usize>,
        candidate: bool,
        rss: u64,
        anonymous: u64,
        locked: u64,
    }
    let mut done = Vec::new();
    let mut current: Option<Mapping> = None;
    let finish = |m: Option<Mapping>, done: &mut Vec<std::ops::Range<usize>>| {
        if let Some(m) = m.filter(|m| m.candidate && m.rss > 0 && m.anonymous == 0 && m.locked == 0) {
            done.push(m.range);
        }
    };
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16))
        {
            finish(current.take(), &mut done);
            let perms = fields.next().unwrap_or("");
            let inode = fields.nth(2).unwrap_or("0");
            let candidate = perms.len() == 4 && !perms.contains('w') && perms.ends_with('p') && inode != "0";
            current = Some(Mapping { range: start..end, candidate, rss: 0, anonymous: 0, locked: 0 });
            continue;
        }
        let Some(m) = current.as_mut() else { continue };
        let kib = || fields.clone().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(u64::MAX);
        match first {
            "Rss:" => m.rss = kib(),
            "Anonymous:" => m.anonymous = kib(),
            "Locked:" => m.locked = kib(),
            _ => {}
        }
    }
    finish(current, &mut done);
    done
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

    const SMAPS: &str = "\
55d0c4a00000-55d0c4c00000 r--p 00000000 fe:00 42 /usr/bin/berth
Rss:                2048 kB
Anonymous:             0 kB
Locked:                0 kB
55d0c4c00000-55d0c6000000 r-xp 00200000 fe:00 42 /usr/bin/berth
Rss:                9000 kB
Anonymous:             0 kB
Locked:                0 kB
55d0c6000000-55d0c6100000 r--p 01600000 fe:00 42 /usr/bin/berth
Rss:                 980 kB
Anonymous:           980 kB
Locked:                0 kB
55d0c6100000-55d0c6110000 rw-p 01700000 fe:00 42 /usr/bin/berth
Rss:                  40 kB
Anonymous:            40 kB
Locked:                0 kB
7f0000000000-7f0000100000 rw-p 00000000 00:00 0 [heap]
Rss:                 164 kB
Anonymous:           164 kB
Locked:                0 kB
7f0000200000-7f0000300000 r-xp 00000000 fe:00 77 /usr/lib/libc.so.6
Rss:                   0 kB
Anonymous:             0 kB
Locked:                0 kB
7f0000400000-7f0000500000 r-xp 00000000 fe:00 78 /usr/lib/libm.so.6
Rss:                 344 kB
Anonymous:             0 kB
Locked:                4 kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
Rss:                   8 kB
Anonymous:             0 kB
Locked:                0 kB
";

    #[test]
    fn only_resident_clean_read_only_file_mappings_are_released() {
        let ranges = clean_file_ranges(SMAPS);
        assert_eq!(ranges, [0x55d0c4a00000..0x55d0c4c00000, 0x55d0c4c00000..0x55d0c6000000]);
    }

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
