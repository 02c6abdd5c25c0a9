//! Running one CNI plugin binary: finding it in the plugin directories, the process seam
//! ([`PluginRunner`]), and the error object plugins print when they fail.

use std::io::{self, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

/// What a plugin process left behind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginOutput {
    /// The exit code; `None` when the plugin was killed by a signal.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl PluginOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs a plugin binary with the CNI environment and its config on stdin.
///
/// The seam between the CNI protocol logic and processes: tests pass a fake that records calls.
pub trait PluginRunner: Send + Sync {
    /// Runs `binary` with `env` (only the `CNI_*` variables; the real runner adds the caller's
    /// other variables, as plugins such as portmap need `PATH`) and `stdin`, and waits for it.
    fn run(&self, binary: &Path, env: &[(String, String)], stdin: &[u8]) -> io::Result<PluginOutput>;
}

/// Runs plugins as child processes.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessRunner;

impl PluginRunner for ProcessRunner {
    fn run(&self, binary: &Path, env: &[(String, String)], stdin: &[u8]) -> io::Result<PluginOutput> {
        let mut command = Command::new(binary);
        // The caller's own CNI_* variables must not leak into a plugin's view of the request.
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(|k| k.starts_with("CNI_")) {
                command.env_remove(key);
            }
        }
        command.envs(env.iter().map(|(k, v)| (k, v)));
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn()?;
        if let Some(mut pipe) = child.stdin.take() {
            // Plugins read all of stdin before they write; one that exits early closes the pipe,
            // and then its exit status, not the broken pipe, is what matters.
            match pipe.write_all(stdin) {
                Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e);
                }
                _ => {}
            }
        }
        let output = child.wait_with_output()?;
        Ok(PluginOutput { code: output.status.code(), stdout: output.stdout, stderr: output.stderr })
    }
}

/// The first executable `<dir>/<plugin>` of `dirs`.
pub fn find_plugin(plugin: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .map(|dir| dir.join(plugin))
        .find(|path| std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0))
}

/// The error a failing plugin prints on stdout: `{"cniVersion", "code", "msg", "details"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PluginError {
    pub code: Option<u64>,
    #[serde(default)]
    pub msg: String,
    #[serde(default)]
    pub details: String,
}

impl PluginError {
    /// The plugin's error object, or a description of its exit when it printed none.
    pub fn from_output(output: &PluginOutput) -> Self {
        let parsed = serde_json::from_slice::<PluginError>(&output.stdout).ok();
        if let Some(error) = parsed.filter(|e| e.code.is_some() || !e.msg.is_empty()) {
            return error;
        }
        let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        let msg = match (output.code, stdout.is_empty()) {
            (_, false) => stdout,
            (Some(code), true) => format!("exit status {code}"),
            (None, true) => "killed by a signal".to_owned(),
        };
        Self { code: None, msg, details: String::new() }
    }

    /// `msg`, with `details` appended when there are any.
    pub fn message(&self) -> String {
        if self.details.is_empty() { self.msg.clone() } else { format!("{}: {}", self.msg, self.details) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(code: Option<i32>, stdout: &str) -> PluginOutput {
        PluginOutput { code, stdout: stdout.into(), stderr: Vec::new() }
    }

    #[test]
    fn a_plugin_error_object_is_read_from_stdout() {
        let out = output(Some(1), r#"{"cniVersion":"1.0.0","code":7,"msg":"bad config","details":"no bridge"}"#);
        let error = PluginError::from_output(&out);
        assert_eq!(error.code, Some(7));
        assert_eq!(error.message(), "bad config: no bridge");
    }

    #[test]
    fn a_plugin_without_an_error_object_is_described_by_its_exit() {
        assert_eq!(PluginError::from_output(&output(Some(2), "")).msg, "exit status 2");
        assert_eq!(PluginError::from_output(&output(None, "")).msg, "killed by a signal");
        assert_eq!(PluginError::from_output(&output(Some(1), "panic: boom\n")).msg, "panic: boom");
    }

    #[test]
    fn plugins_are_found_in_the_first_directory_that_has_an_executable_of_that_name() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(a.path().join("bridge"), "not executable").unwrap();
        std::fs::write(b.path().join("bridge"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(b.path().join("bridge"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dirs = [a.path().to_owned(), b.path().to_owned()];
        assert_eq!(find_plugin("bridge", &dirs), Some(b.path().join("bridge")));
        assert_eq!(find_plugin("portmap", &dirs), None);
    }

    #[test]
    fn the_process_runner_passes_env_and_stdin_and_collects_output() {
        let env = [("CNI_COMMAND".to_string(), "ADD".to_string())];
        let script = "read -r line; echo \"$CNI_COMMAND $line\"; echo oops >&2; exit 3";
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin");
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = ProcessRunner.run(&path, &env, b"{\"x\":1}\n").unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ADD {\"x\":1}\n");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
    }
}
