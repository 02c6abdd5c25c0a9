//! The per-container monitor: a small process that holds a container's stdio, writes its CRI log
//! and records its exit, so that containers outlive the runtime that started them.
//!
//! The runtime calls [`launch`] (blocking; run it in `spawn_blocking`) with the argv of the OCI
//! runtime's `create`. The `berth-monitor` binary detaches from the caller, becomes the child
//! subreaper, runs `create` with pipes as the container's stdout and stderr, and answers through a
//! sync pipe whether `create` worked. Then it copies the pipes into the CRI log at `--log-path`,
//! reopens that file on SIGUSR1 ([`reopen_log`]), and when the container's init exits it writes
//! `exit.json` ([`read_exit`]) into its state dir and exits.
//!
//! Files in the state dir: `monitor.pid` (the monitor's pid while it runs) and `exit.json`. After
//! a runtime restart: `exit.json` present → exited; else `monitor.pid` names a live monitor
//! ([`is_alive`]) → still running; else the monitor died and the exit is unknown.
//!
//! Frugal by design: one thread, no async runtime, std + nix + serde_json, buffers bounded to a
//! few tens of KiB, and the code pages that start-up faulted in are dropped before the idle loop
//! (`trim`), so an idle monitor stays around 1 MiB of RSS (release build: ~0.9 MiB; ~1.1 MiB
//! with `--stdin`, `--attach-socket` and one attached client).
//!
//! Attach: with `--attach-socket` the monitor also sends the container's output, then its exit
//! code, to the clients of a unix socket, and with `--stdin` writes their input to the container's
//! stdin pipe; the protocol and the client helpers are in [`attach`].
//!
//! Terminal: with `--console-socket` the container's stdio is a pty whose master the OCI runtime
//! sends the monitor ([`console`]); the master's output is the container's stdout, attach input
//! goes to it, and [`resize`] sets its window size.
//!
//! Not yet: a synchronous acknowledgement of [`reopen_log`].

pub mod args;
pub mod attach;
pub mod console;
pub mod control;
pub mod cri_log;
pub mod daemon;
pub mod launch;
mod oom;
pub mod pause;
pub mod report;
pub mod status;
pub mod time;
pub mod trim;

pub use control::{ControlError, is_alive, read_monitor_pid, reopen_log, resize};
pub use launch::{LaunchOptions, MonitorError, MonitorHandle, launch};
pub use status::{ContainerExit, StatusError, read_exit};

/// The name of the monitor binary, and the `comm` it gives itself.
pub const MONITOR_NAME: &str = "berth-monitor";
/// The file in the state dir that holds the monitor's pid while it runs.
pub const MONITOR_PID_FILE: &str = "monitor.pid";
/// The file in the state dir that records the container's exit.
pub const EXIT_FILE: &str = "exit.json";
