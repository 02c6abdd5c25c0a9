//! CRI RuntimeService's runtime-wide verbs: Version, Status, RuntimeConfig and
//! UpdateRuntimeConfig (sandboxes, containers and stats have their own modules), and the
//! self-check of each handler's OCI runtime binary that decides which handlers Status lists.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use serde_json::json;

use super::{Cri, Error};
use crate::config::RuntimeHandler;

/// The CRI API version berth speaks (what `VersionResponse.version` reports).
pub const CRI_VERSION: &str = "0.1.0";
pub const RUNTIME_NAME: &str = "berth";
pub const RUNTIME_API_VERSION: &str = "v1";

impl Cri {
    pub fn version(&self, _req: cri::VersionRequest) -> cri::VersionResponse {
        cri::VersionResponse {
            version: CRI_VERSION.into(),
            runtime_name: RUNTIME_NAME.into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            runtime_api_version: RUNTIME_API_VERSION.into(),
        }
    }

    pub fn status(&self, req: cri::StatusRequest) -> cri::StatusResponse {
        let network = self.cni.status();
        let conditions = vec![
            cri::RuntimeCondition {
                r#type: "RuntimeReady".into(),
                status: true,
                reason: String::new(),
                message: String::new(),
            },
            cri::RuntimeCondition {
                r#type: "NetworkReady".into(),
                status: network.ready,
                reason: network.reason,
                message: network.message,
            },
        ];
        // Features are what berth does with the handler, not what the binary could: neither
        // recursive read-only mounts nor user namespaces are wired yet.
        let features =
            || Some(cri::RuntimeHandlerFeatures { recursive_read_only_mounts: false, user_namespaces: false });
        // "" stands for the default handler, as containerd lists it, then every handler by name;
        // a handler whose binary fails its self-check is left out, so clients (the node agent,
        // and through it the scheduler) do not send pods to it.
        self.handler_checks.refresh_if_stale();
        let usable = |name: &str| self.config.handler(name).is_some_and(|h| self.handler_checks.usable(&h.name));
        let runtime_handlers = std::iter::once(String::new())
            .chain(self.config.handlers.keys().cloned())
            .filter(|name| usable(name))
            .map(|name| cri::RuntimeHandler { name, features: features() })
            .collect();
        let info = if req.verbose { self.status_info() } else { HashMap::new() };
        cri::StatusResponse {
            status: Some(cri::RuntimeStatus { conditions }),
            info,
            runtime_handlers,
            features: Some(cri::RuntimeFeatures { supplemental_groups_policy: false }),
        }
    }

    /// The cgroup driver kubelet must match: cgroupfs (berth writes cgroup paths, not systemd
    /// slices).
    pub fn runtime_config(&self) -> cri::RuntimeConfigResponse {
        cri::RuntimeConfigResponse {
            linux: Some(cri::LinuxRuntimeConfiguration { cgroup_driver: cri::CgroupDriver::Cgroupfs as i32 }),
        }
    }

    /// Records the node's pod CIDR (kubelet sends it once the node has one) and moves berth's
    /// default network to it, so the next sandbox gets an address of the node's range; a CNI
    /// config someone else wrote keeps its own range. The network config is read afresh for
    /// every sandbox, so the rewritten file is what the next one uses. The CIDR is also reported
    /// in the verbose status.
    pub fn update_runtime_config(
        &self,
        req: cri::UpdateRuntimeConfigRequest,
    ) -> Result<cri::UpdateRuntimeConfigResponse, Error> {
        let cidr = req.runtime_config.and_then(|c| c.network_config).map(|n| n.pod_cidr).unwrap_or_default();
        if cidr.is_empty() {
            return Ok(cri::UpdateRuntimeConfigResponse {});
        }
        let conf_dir = &self.config.cni.conf_dir;
        use berth_cni::PodCidrOutcome::*;
        match berth_cni::follow_pod_cidr(conf_dir, &super::default_network(&self.config.root), &cidr) {
            Ok(Moved { path, from }) => {
                tracing::info!(pod_cidr = %cidr, %from, path = %path.display(), "default pod network moved to the pod CIDR")
            }
            Ok(Written { path }) => {
                tracing::info!(pod_cidr = %cidr, path = %path.display(), "wrote the default CNI config for the pod CIDR")
            }
            Ok(Unchanged { .. }) => tracing::debug!(pod_cidr = %cidr, "default pod network already in the pod CIDR"),
            Ok(NotDefault { path }) => tracing::info!(
                pod_cidr = %cidr, path = %path.display(), "pod CIDR recorded; the CNI config in use is not berth's default and keeps its own range"
            ),
            Err(e) => return Err(Error::PodCidr { cidr, source: Box::new(e) }),
        }
        *self.pod_cidr.lock().unwrap_or_else(|e| e.into_inner()) = cidr;
        Ok(cri::UpdateRuntimeConfigResponse {})
    }

    /// The verbose `config` entry: handlers, their platforms and the default handler's name
    /// (`defaultRuntimeName`, where containerd puts it), so clients can show it.
    fn status_info(&self) -> HashMap<String, String> {
        let c = &self.config;
        let handlers: serde_json::Map<_, _> = c
            .handlers
            .values()
            .map(|h| {
                let v = json!({
                    "binary": h.binary,
                    "args": h.args,
                    "root": h.root,
                    "isolation": h.isolation,
                    "unsupportedCapabilities": h.gaps.unsupported_capabilities,
                    "platform": h.platform,
                    "allowedAnnotations": h.allowed_annotations,
                    "privileged": h.privileged,
                });
                (h.name.clone(), v)
            })
            .collect();
        let failed: BTreeMap<String, String> = self.handler_checks.failures();
        let config = json!({
            "defaultRuntimeName": c.default_handler,
            "failedRuntimes": failed,
            "runtimes": handlers,
            "root": c.root,
            "socket": c.socket,
            "cni": { "confDir": c.cni.conf_dir, "binDirs": c.cni.bin_dirs },
            "registries": c.registries,
            "podCIDR": *self.pod_cidr.lock().unwrap_or_else(|e| e.into_inner()),
            "monitor": self.monitor_binary,
        });
        HashMap::from([("config".to_string(), config.to_string())])
    }
}

/// How old a handler check may get before Status starts a new one.
const HANDLER_RECHECK: Duration = Duration::from_secs(30);
/// A binary that has not answered `--version` by then counts as broken.
const HANDLER_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether each handler's OCI runtime binary passes a cheap self-check (`<binary> --version`
/// exits 0): checked once at startup, then again in the background when Status finds the last
/// check older than [`HANDLER_RECHECK`], so Status itself never waits for a process.
pub(crate) struct HandlerChecks {
    /// Handler name → binary, from the config.
    binaries: BTreeMap<String, PathBuf>,
    state: Mutex<CheckState>,
}

#[derive(Default)]
struct CheckState {
    /// Handler name → why its binary failed; handlers absent here passed.
    failures: BTreeMap<String, String>,
    checked_at: Option<Instant>,
    running: bool,
}

impl HandlerChecks {
    /// Checks every handler's binary once (concurrently, each bounded by the timeout).
    pub(crate) async fn start(handlers: &BTreeMap<String, Arc<RuntimeHandler>>) -> Arc<HandlerChecks> {
        let binaries = handlers.iter().map(|(name, h)| (name.clone(), h.binary.clone())).collect();
        let checks = Arc::new(HandlerChecks { binaries, state: Mutex::new(CheckState::default()) });
        checks.state().running = true;
        checks.run().await;
        checks
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CheckState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `handler` (a configured name) passed its last check.
    pub(crate) fn usable(&self, handler: &str) -> bool {
        !self.state().failures.contains_key(handler)
    }

    /// Handler name → why its binary failed the last check.
    pub(crate) fn failures(&self) -> BTreeMap<String, String> {
        self.state().failures.clone()
    }

    /// Starts a background re-check when the last one is stale and none is running; outside a
    /// tokio runtime it does nothing.
    pub(crate) fn refresh_if_stale(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        {
            let mut state = self.state();
            let fresh = state.checked_at.is_some_and(|at| at.elapsed() < HANDLER_RECHECK);
            if fresh || state.running {
                return;
            }
            state.running = true;
        }
        let checks = Arc::clone(self);
        runtime.spawn(async move { checks.run().await });
    }

    async fn run(&self) {
        let checks = self.binaries.iter().map(|(name, binary)| async move { (name, check_binary(binary).await) });
        let results = futures::future::join_all(checks).await;
        let mut state = self.state();
        for (name, result) in results {
            let before = state.failures.get(name).cloned();
            match result {
                Ok(()) => {
                    if state.failures.remove(name).is_some() {
                        tracing::info!(handler = %name, "runtime handler passes its self-check again");
                    }
                }
                Err(why) => {
                    if before.as_ref() != Some(&why) {
                        tracing::warn!(handler = %name, binary = %self.binaries[name].display(), error = %why,
                            "runtime handler fails its self-check; Status leaves it out");
                    }
                    state.failures.insert(name.clone(), why);
                }
            }
        }
        state.checked_at = Some(Instant::now());
        state.running = false;
    }
}

/// `<binary> --version` exits 0 within the timeout; else why not.
async fn check_binary(binary: &std::path::Path) -> Result<(), String> {
    let mut command = tokio::process::Command::new(binary);
    command
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(HANDLER_CHECK_TIMEOUT, command.output()).await {
        Err(_) => return Err(format!("{} --version did not exit within {HANDLER_CHECK_TIMEOUT:?}", binary.display())),
        Ok(Err(e)) => return Err(format!("cannot run {}: {e}", binary.display())),
        Ok(Ok(output)) => output,
    };
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(format!("{} --version failed ({}): {}", binary.display(), output.status, stderr.trim()))
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;
    use crate::config::Config;

    fn handlers(toml: &str) -> BTreeMap<String, Arc<RuntimeHandler>> {
        Config::from_toml(toml, OsStr::new("")).unwrap().handlers
    }

    #[tokio::test]
    async fn a_handler_whose_binary_is_missing_or_fails_is_not_usable() {
        let checks = HandlerChecks::start(&handlers(
            r#"
default_handler = "good"
[handlers.good]
binary = "/bin/true"
[handlers.missing]
binary = "/nonexistent"
[handlers.failing]
binary = "/bin/false"
"#,
        ))
        .await;
        assert!(checks.usable("good"));
        assert!(!checks.usable("missing"));
        assert!(!checks.usable("failing"));
        let failures = checks.failures();
        assert!(failures["missing"].contains("/nonexistent"), "{failures:?}");
        assert!(failures["failing"].contains("--version failed"), "{failures:?}");
    }

    #[tokio::test]
    async fn a_fresh_check_is_not_repeated_but_a_stale_one_is() {
        let checks = HandlerChecks::start(&handlers("[handlers.runc]\nbinary = \"/bin/true\"\n")).await;
        let first = checks.state().checked_at.unwrap();
        checks.refresh_if_stale();
        assert!(!checks.state().running, "a fresh check starts no new one");
        checks.state().checked_at = Some(first - HANDLER_RECHECK);
        checks.refresh_if_stale();
        assert!(checks.state().running, "a stale check starts a new one");
        for _ in 0..500 {
            if !checks.state().running {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(checks.state().checked_at.unwrap() > first, "the re-check finished");
    }
}
