//! What `berth up` asks of the cluster through the Kubernetes API: is the server ready, is the
//! node Ready, which RuntimeClasses to create for the runtimes that work ([`plan_classes`], pure),
//! and the node's credentials.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::node::v1::{Overhead, RuntimeClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

use super::discovery::{Probe, default_handler};

/// The annotation that makes a RuntimeClass the cluster's default (filled into pods naming none).
pub const DEFAULT_CLASS_ANNOTATION: &str = "runtimeclass.berth.dev/is-default-class";
/// The label on the classes `berth up` creates.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "berth-up");
/// How long one API call may take before the caller tries again.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A client for a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig)
            .with_context(|| format!("cannot read kubeconfig {}", kubeconfig.display()))?,
        &Default::default(),
    )
    .await
    .with_context(|| format!("cannot use kubeconfig {}", kubeconfig.display()))?;
    config.connect_timeout = Some(CALL_TIMEOUT);
    config.read_timeout = Some(CALL_TIMEOUT);
    kube::Client::try_from(config).context("cannot build the API client")
}

/// `GET path` on a client; the body.
pub async fn get_text(client: &kube::Client, path: &str) -> anyhow::Result<String> {
    let request = http::Request::get(path).body(Vec::new()).context("building a request")?;
    tokio::time::timeout(CALL_TIMEOUT, client.request_text(request))
        .await
        .map_err(|_| anyhow::anyhow!("GET {path} timed out"))?
        .with_context(|| format!("GET {path}"))
}

/// The Node if its Ready condition is True with a heartbeat at or after `since` (whole seconds):
/// reported by the agent started then, not left by an earlier one.
pub async fn node_ready_since(client: &kube::Client, node: &str, since: jiff::Timestamp) -> Option<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = tokio::time::timeout(CALL_TIMEOUT, nodes.get_opt(node)).await.ok()?.ok()??;
    let since = since.as_second();
    let ready = ready_condition(&node).is_some_and(|c| {
        c.status == "True" && c.last_heartbeat_time.as_ref().is_some_and(|t| t.0.as_second() >= since)
    });
    ready.then_some(node)
}

pub fn ready_condition(node: &Node) -> Option<&k8s_openapi::api::core::v1::NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")
}

/// The names in `status.runtimeHandlers`.
pub fn runtime_handlers(node: &Node) -> Vec<String> {
    node.status
        .as_ref()
        .and_then(|s| s.runtime_handlers.as_ref())
        // The default handler is also listed under the empty name, as kubelet does.
        .map(|hs| hs.iter().filter_map(|h| h.name.clone()).filter(|n| !n.is_empty()).collect())
        .unwrap_or_default()
}

/// The RuntimeClasses to create: one per handler that works (named after it, gVisor's with its
/// measured overhead), except those whose name is taken. The default handler's class is marked
/// default when it is created now and no class is default yet.
pub fn plan_classes(probes: &[Probe], existing: &[RuntimeClass]) -> Vec<RuntimeClass> {
    let taken = |name: &str| existing.iter().any(|c| c.metadata.name.as_deref() == Some(name));
    let has_default = existing.iter().any(|c| {
        c.metadata.annotations.as_ref().and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION)).is_some_and(|v| v == "true")
    });
    let default = default_handler(probes);
    probes
        .iter()
        .filter(|p| p.works() && !taken(&p.handler))
        .map(|p| {
            let mut metadata = ObjectMeta {
                name: Some(p.handler.clone()),
                labels: Some([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())].into()),
                ..Default::default()
            };
            if !has_default && default == Some(p.handler.as_str()) {
                metadata.annotations = Some([(DEFAULT_CLASS_ANNOTATION.to_string(), "true".to_string())].into());
            }
            let overhead =
                p.overhead_memory().map(|m| Overhead { pod_fixed: Some([("memory".to_string(), Quantity(m))].into()) });
            RuntimeClass { metadata, handler: p.handler.clone(), overhead, scheduling: None }
        })
        .collect()
}

/// Creates the planned classes; the names created. A class created meanwhile by someone else is
/// left alone.
pub async fn ensure_classes(client: &kube::Client, probes: &[Probe]) -> anyhow::Result<Vec<String>> {
    let api: Api<RuntimeClass> = Api::all(client.clone());
    let existing = api.list(&Default::default()).await.context("listing RuntimeClasses")?.items;
    let mut created = Vec::new();
    for class in plan_classes(probes, &existing) {
        let name = class.metadata.name.clone().unwrap_or_default();
        match api.create(&PostParams::default(), &class).await {
            Ok(_) => created.push(name),
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(e) => return Err(e).with_context(|| format!("creating RuntimeClass {name}")),
        }
    }
    Ok(created)
}

/// `name (handler)` of every RuntimeClass, the default one marked, for the user.
pub async fn describe_classes(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let api: Api<RuntimeClass> = Api::all(client.clone());
    let classes = api.list(&Default::default()).await.context("listing RuntimeClasses")?.items;
    Ok(classes
        .iter()
        .map(|c| {
            let name = c.metadata.name.clone().unwrap_or_default();
            let default = c
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                .is_some_and(|v| v == "true");
            let mut text = if name == c.handler { name } else { format!("{name} (handler {})", c.handler) };
            if default {
                text.push_str(" (default)");
            }
            text
        })
        .collect())
}

/// The node a kubeconfig from `berth server token create --node NAME` is for: its user
/// `system:node:NAME`.
pub fn node_of_kubeconfig(text: &str) -> anyhow::Result<String> {
    let config: serde_json::Value = serde_yaml::from_str(text).context("not a kubeconfig")?;
    let current = config.get("current-context").and_then(|c| c.as_str()).unwrap_or_default();
    let contexts = config.get("contexts").and_then(|c| c.as_array()).cloned().unwrap_or_default();
    let context = contexts
        .iter()
        .find(|c| c.get("name").and_then(|n| n.as_str()) == Some(current))
        .or_else(|| contexts.first())
        .context("the kubeconfig has no context")?;
    let user = context.pointer("/context/user").and_then(|u| u.as_str()).unwrap_or_default();
    user.strip_prefix(berth_apiserver::authn::NODE_USER_PREFIX).map(str::to_string).with_context(|| {
        format!(
            "its user is {user:?}, not system:node:NAME: make it with `berth server token create --node NAME` on the \
             first machine"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::super::discovery::Outcome;
    use super::*;

    fn probe(handler: &str, works: bool, rss: Option<u64>) -> Probe {
        Probe {
            handler: handler.into(),
            binary: format!("/usr/bin/{handler}").into(),
            from: "PATH".into(),
            outcome: if works {
                Outcome::Works { run_ms: 1.0, sandbox_rss_bytes: rss }
            } else {
                Outcome::Fails { error: "e".into(), fix: "f".into() }
            },
        }
    }

    fn class(name: &str, default: bool) -> RuntimeClass {
        let mut c = RuntimeClass { handler: name.into(), ..Default::default() };
        c.metadata.name = Some(name.into());
        if default {
            c.metadata.annotations = Some([(DEFAULT_CLASS_ANNOTATION.to_string(), "true".to_string())].into());
        }
        c
    }

    fn names(classes: &[RuntimeClass]) -> Vec<&str> {
        classes.iter().map(|c| c.metadata.name.as_deref().unwrap()).collect()
    }

    fn is_default(c: &RuntimeClass) -> bool {
        c.metadata.annotations.as_ref().is_some_and(|a| a[DEFAULT_CLASS_ANNOTATION] == "true")
    }

    #[test]
    fn each_working_runtime_gets_a_class_runc_default_and_gvisor_with_its_overhead() {
        let probes = [probe("runc", true, None), probe("crun", false, None), probe("gvisor", true, Some(43 << 20))];
        let plan = plan_classes(&probes, &[]);
        assert_eq!(names(&plan), ["runc", "gvisor"]);
        assert!(is_default(&plan[0]) && !is_default(&plan[1]));
        assert_eq!(plan[1].handler, "gvisor");
        let overhead = plan[1].overhead.as_ref().unwrap().pod_fixed.as_ref().unwrap();
        assert_eq!(overhead["memory"].0, "48Mi");
        assert!(plan[0].overhead.is_none());
    }

    #[test]
    fn existing_classes_are_left_alone_and_an_existing_default_stays_the_only_one() {
        let probes = [probe("runc", true, None), probe("crun", true, None)];
        let plan = plan_classes(&probes, &[class("runc", false)]);
        assert_eq!(names(&plan), ["crun"]);
        assert!(!is_default(&plan[0]), "runc, the default handler, exists: nothing else becomes default");
        let plan = plan_classes(&probes, &[class("fast", true)]);
        assert_eq!(names(&plan), ["runc", "crun"]);
        assert!(plan.iter().all(|c| !is_default(c)));
    }

    #[test]
    fn without_runc_the_first_working_runtime_is_the_default() {
        let plan = plan_classes(&[probe("runc", false, None), probe("crun", true, None)], &[]);
        assert_eq!(names(&plan), ["crun"]);
        assert!(is_default(&plan[0]));
    }

    #[test]
    fn a_node_kubeconfig_names_its_node_and_an_admin_one_is_refused() {
        let node = "apiVersion: v1\nkind: Config\ncurrent-context: berth\ncontexts:\n- name: berth\n  context: {cluster: berth, user: system:node:node-b}\n";
        assert_eq!(node_of_kubeconfig(node).unwrap(), "node-b");
        let admin = node.replace("system:node:node-b", "admin");
        let err = node_of_kubeconfig(&admin).unwrap_err().to_string();
        assert!(err.contains("berth server token create --node NAME"), "{err}");
    }
}
