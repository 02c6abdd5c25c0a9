//! CRI RuntimeService's runtime-wide verbs: Version, Status, RuntimeConfig and
//! UpdateRuntimeConfig (sandboxes, containers and stats have their own modules).

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use serde_json::json;

use super::Cri;

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
        // "" stands for the default handler, as containerd lists it, then every handler by name.
        let runtime_handlers = std::iter::once(String::new())
            .chain(self.config.handlers.keys().cloned())
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

    /// Records the node's pod CIDR (kubelet sends it once the node has one). The CNI config in use
    /// keeps its own range; the CIDR is reported in the verbose status.
    pub fn update_runtime_config(&self, req: cri::UpdateRuntimeConfigRequest) -> cri::UpdateRuntimeConfigResponse {
        let cidr = req.runtime_config.and_then(|c| c.network_config).map(|n| n.pod_cidr).unwrap_or_default();
        if !cidr.is_empty() {
            tracing::info!(pod_cidr = %cidr, "pod CIDR updated");
            *self.pod_cidr.lock().unwrap_or_else(|e| e.into_inner()) = cidr;
        }
        cri::UpdateRuntimeConfigResponse {}
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
                    "platform": h.platform,
                    "allowedAnnotations": h.allowed_annotations,
                    "privileged": h.privileged,
                });
                (h.name.clone(), v)
            })
            .collect();
        let config = json!({
            "defaultRuntimeName": c.default_handler,
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
