//! Giving memory back to the OS after a large response. How is the process's business (glibc's
//! `malloc_trim` in the `berth` binary), so the binary installs it; without it nothing happens.

use std::sync::OnceLock;

static TRIM: OnceLock<fn()> = OnceLock::new();

/// Installs the function that returns free heap memory to the OS; the first call wins.
pub fn set_trim(trim: fn()) {
    let _ = TRIM.set(trim);
}

/// Returns free heap memory to the OS, if the process said how.
pub(crate) fn trim() {
    if let Some(trim) = TRIM.get() {
        trim();
    }
}
