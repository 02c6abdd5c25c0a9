//! The one seam between the runtime driver and process execution: a `Spawner` runs a prepared
//! command to completion and hands back its exit status and output.
//!
//! [`ProcessSpawner`] is the real one. [`RecordingSpawner`] records every command line and answers
//! with queued replies, so the driver's command lines and error mapping are tested without a
//! runtime binary. Pass the one you want to [`OciRuntime::new`](super::OciRuntime::new).

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Output};
use std::sync::Mutex;

/// Runs a command to completion.
///
/// The driver sets up the command's stdio before calling `run`: stdin is null, and stdout and
/// stderr are either left unset (the spawner captures them into the returned [`Output`]) or set to
/// files by the driver (then the corresponding `Output` field is empty). An implementation must
/// keep whatever stdio the driver set.
pub trait Spawner: Send + Sync + fmt::Debug {
    fn run(&self, command: &mut Command) -> io::Result<Output>;
}

/// The real spawner: `Command::output`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessSpawner;

impl Spawner for ProcessSpawner {
    fn run(&self, command: &mut Command) -> io::Result<Output> {
        command.output()
    }
}

/// A fake spawner for unit tests: records each command line (program first) and answers with the
/// replies queued by [`RecordingSpawner::reply`], in order; once they run out, every command
/// succeeds with empty output.
#[derive(Debug, Default)]
pub struct RecordingSpawner {
    calls: Mutex<Vec<Vec<String>>>,
    replies: Mutex<VecDeque<Output>>,
}

impl RecordingSpawner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues the answer to the next unanswered command: an exit code and its stdout and stderr.
    pub fn reply(&self, exit_code: i32, stdout: &str, stderr: &str) -> &Self {
        let output = Output {
            status: exit_status(exit_code),
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
        };
        self.replies.lock().unwrap_or_else(|e| e.into_inner()).push_back(output);
        self
    }

    /// Every command line run so far, program first, lossily converted to UTF-8.
    pub fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The last command line run, without the program.
    pub fn last_args(&self) -> Vec<String> {
        self.calls().last().map(|argv| argv[1..].to_vec()).unwrap_or_default()
    }
}

impl Spawner for RecordingSpawner {
    fn run(&self, command: &mut Command) -> io::Result<Output> {
        let mut argv = vec![command.get_program().to_string_lossy().into_owned()];
        argv.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(argv);
        let reply = self.replies.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
        Ok(reply.unwrap_or_else(|| Output { status: exit_status(0), stdout: Vec::new(), stderr: Vec::new() }))
    }
}

/// The wait status of a process that exited with `code`.
fn exit_status(code: i32) -> ExitStatus {
    ExitStatus::from_raw((code & 0xff) << 8)
}
