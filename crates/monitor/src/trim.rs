//! Gives back the resident pages of the monitor's code and read-only data when it starts to idle.
//!
//! Why: the kernel maps file pages around every page fault ("fault-around", 64 KiB windows), so
//! after start-up nearly all of libc's, ld.so's and the monitor's code counts in the monitor's
//! RSS (~2.1 MiB, like any dynamically linked process: GNU `sleep` idles at ~1.8 MiB here) though
//! its idle loop uses a few pages of it. Dropping those pages once, right before the loop,
//! leaves resident only what the loop touches again.
//!
//! Only private file mappings that are not writable and hold no anonymous (copied-on-write)
//! pages are dropped: for those MADV_DONTNEED changes nothing but residency, and the kernel
//! faults the pages back in from the page cache (where they stay, shared with every other
//! process) when they are used again. Relocated read-only data (RELRO) holds anonymous pages and
//! is left alone.

// madvise(2) is unsafe in nix because discarding arbitrary memory can change what Rust code
// reads; here it only ever touches never-written file mappings, as checked above.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::fs;
use std::ptr::NonNull;

use nix::sys::mman::{MmapAdvise, madvise};

/// Drops the resident pages of this process's read-only file mappings (best effort).
pub fn drop_file_pages() {
    let Ok(smaps) = fs::read_to_string("/proc/self/smaps") else { return };
    for (start, len) in clean_file_mappings(&smaps) {
        if let Some(addr) = NonNull::new(start as *mut c_void) {
            // SAFETY: [start, start+len) is a whole private file mapping of this process that is
            // not writable and has no anonymous pages (see `clean_file_mappings`): every page is
            // the file's own, so dropping it cannot change any byte that is read later.
            let _ = unsafe { madvise(addr, len, MmapAdvise::MADV_DONTNEED) };
        }
    }
}

/// The (start, length) of every mapping in `smaps` that is safe to drop. (Dirty counts are no
/// guide: a freshly written binary's pages are dirty in the page cache, yet the file's own.)
fn clean_file_mappings(smaps: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    let mut clean = true;
    let mut finish = |current: Option<(usize, usize)>, clean: bool| {
        if let Some(range) = current.filter(|_| clean) {
            out.push(range);
        }
    };
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16))
        {
            // A mapping header: "start-end perms offset dev inode [path]".
            finish(current.take(), clean);
            let perms = fields.next().unwrap_or("");
            let path = fields.nth(3).unwrap_or("");
            clean = true;
            let read_only_private = perms.starts_with("r-") && perms.ends_with('p');
            if read_only_private && path.starts_with('/') && end > start {
                current = Some((start, end - start));
            }
        } else if first == "Anonymous:" {
            clean &= fields.next() == Some("0");
        }
    }
    finish(current, clean);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0010000 r--p 00000000 08:01 123 /usr/bin/berth-monitor
Rss:                  64 kB
Private_Dirty:        64 kB
Anonymous:             0 kB
55d0a0010000-55d0a0080000 r-xp 00010000 08:01 123 /usr/bin/berth-monitor
Rss:                 448 kB
Anonymous:             0 kB
55d0a0080000-55d0a0081000 r--p 00080000 08:01 123 /usr/bin/berth-monitor
Anonymous:             4 kB
55d0a0081000-55d0a0090000 rw-p 00081000 08:01 123 /usr/bin/berth-monitor
Anonymous:             0 kB
7f0000000000-7f0000200000 r-xp 00028000 08:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             4 kB
7f0000200000-7f0000201000 r--s 00000000 08:01 789 /dev/shm/x
Anonymous:             0 kB
7ffc00000000-7ffc00002000 r-xp 00000000 00:00 0 [vdso]
Anonymous:             0 kB
";

    #[test]
    fn only_private_read_only_file_mappings_without_copied_pages_are_dropped() {
        assert_eq!(clean_file_mappings(SMAPS), vec![(0x55d0a0000000, 0x10000), (0x55d0a0010000, 0x70000)]);
    }

    #[test]
    fn dropping_the_pages_leaves_this_process_working() {
        drop_file_pages();
        assert_eq!(format!("{}", 6 * 7), "42");
    }
}
