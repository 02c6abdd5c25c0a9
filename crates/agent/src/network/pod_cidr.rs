//! Telling the CRI runtimes this node's pod CIDR, as kubelet does: `UpdateRuntimeConfig` with
//! the Node's `spec.podCIDRs` (comma-separated, or `spec.podCIDR`), once per endpoint and
//! change; an endpoint that failed (down, restarting) is told on the next sync.

use std::collections::BTreeMap;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Node;

use crate::runtimes::RuntimeManager;

/// The pod CIDR the runtimes are told: `spec.podCIDRs` joined with commas as kubelet sends
/// them, else `spec.podCIDR`; `None` while the node has none.
pub fn pod_cidr_of(node: &Node) -> Option<String> {
    let spec = node.spec.as_ref()?;
    let listed = spec.pod_cidrs.as_ref().filter(|c| !c.is_empty()).map(|c| c.join(","));
    listed.or_else(|| spec.pod_cidr.clone()).filter(|c| !c.is_empty())
}

/// Which endpoints still need telling `cidr`, given what each was last told successfully.
pub fn to_tell<'a>(told: &BTreeMap<String, String>, cidr: &str, endpoints: &[&'a str]) -> Vec<&'a str> {
    endpoints.iter().copied().filter(|name| told.get(*name).map(String::as_str) != Some(cidr)).collect()
}

/// What each endpoint was last told.
#[derive(Debug, Default)]
pub struct PodCidrSync {
    told: BTreeMap<String, String>,
}

impl PodCidrSync {
    /// Tells every endpoint that has not yet been told `cidr`; nothing while the node has none
    /// (a runtime keeps the range it has).
    pub async fn sync(&mut self, cidr: Option<&str>, runtimes: &RuntimeManager) {
        let Some(cidr) = cidr else { return };
        let endpoints = runtimes.endpoints();
        let names: Vec<&str> = endpoints.iter().map(|(e, _)| e.name.as_str()).collect();
        let due: Vec<String> = to_tell(&self.told, cidr, &names).into_iter().map(String::from).collect();
        for (endpoint, _) in endpoints.iter().filter(|(e, _)| due.contains(&e.name)) {
            let request = cri::UpdateRuntimeConfigRequest {
                runtime_config: Some(cri::RuntimeConfig {
                    network_config: Some(cri::NetworkConfig { pod_cidr: cidr.to_string() }),
                }),
            };
            match endpoint.runtime.clone().update_runtime_config(request).await {
                Ok(_) => {
                    tracing::info!(endpoint = %endpoint.name, pod_cidr = cidr, "told the runtime the node's pod CIDR");
                    self.told.insert(endpoint.name.clone(), cidr.to_string());
                }
                Err(status) => tracing::warn!(
                    endpoint = %endpoint.name, pod_cidr = cidr, code = ?status.code(), message = status.message(),
                    "telling the runtime the node's pod CIDR failed; tried again later"
                ),
            }
        }
        // Endpoints removed from the configuration are forgotten, so one added back is told again.
        self.told.retain(|name, _| names.contains(&name.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(spec: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n1"}, "spec": spec})).unwrap()
    }

    #[test]
    fn the_pod_cidr_is_pod_cidrs_joined_else_pod_cidr_else_none() {
        let dual = node(json!({"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:1::/64"]}));
        assert_eq!(pod_cidr_of(&dual).as_deref(), Some("10.244.1.0/24,fd00:1::/64"));
        assert_eq!(pod_cidr_of(&node(json!({"podCIDR": "10.244.2.0/24"}))).as_deref(), Some("10.244.2.0/24"));
        assert_eq!(pod_cidr_of(&node(json!({"podCIDR": ""}))), None);
        assert_eq!(pod_cidr_of(&node(json!({}))), None);
    }

    #[test]
    fn only_endpoints_not_yet_told_this_cidr_are_told() {
        let told = BTreeMap::from([
            ("berth".to_string(), "10.244.1.0/24".to_string()),
            ("containerd".to_string(), "10.244.9.0/24".to_string()),
        ]);
        assert_eq!(to_tell(&told, "10.244.1.0/24", &["berth", "containerd", "new"]), ["containerd", "new"]);
        assert_eq!(to_tell(&told, "10.244.3.0/24", &["berth"]), ["berth"], "a changed CIDR is told again");
    }
}
