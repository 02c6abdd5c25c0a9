//! The `berth-monitor` binary for tests that run containers: built with cargo into the target
//! directory the test binary itself lives in, where `berth runtime` looks for it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `$BERTH_MONITOR_BIN` if set; else `<profile_dir>/berth-monitor`, built there (incrementally)
/// first. `profile_dir` is `target/<profile>`, e.g. the parent of `CARGO_BIN_EXE_berth`.
pub fn monitor_binary_in(profile_dir: &Path) -> PathBuf {
    if let Some(bin) = std::env::var_os("BERTH_MONITOR_BIN") {
        return bin.into();
    }
    let target_dir = profile_dir.parent().expect("a profile dir lives in a target dir");
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "-q", "-p", "berth-monitor", "--bin", "berth-monitor", "--target-dir"]).arg(target_dir);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cargo.arg("--release");
    }
    let status = cargo.current_dir(env!("CARGO_MANIFEST_DIR")).status().expect("running cargo");
    assert!(status.success(), "building berth-monitor failed");
    let bin = profile_dir.join("berth-monitor");
    assert!(bin.is_file(), "no berth-monitor in {}", profile_dir.display());
    bin
}

/// [`monitor_binary_in`] for the calling test binary (`target/<profile>/deps/<test>`).
pub fn monitor_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    monitor_binary_in(exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>"))
}
