//! Pods through the API of the `berth up` cluster: their spec (no `nodeName`: the scheduler
//! places them), the watch that sees each reach Running, one pod, a wave of pods created
//! together, a Deployment created at once, and deleting them all again.
//!
//! A pod's start is timed from just before its create call (for a Deployment's pods, the
//! Deployment's) to the watch event showing it Running — the same "Running" as the agent
//! bench's (phase Running, every container running). A start that fails (see
//! [`start_ended`]) is counted apart.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};

use crate::agent::pods::{Ended, Seen};
pub use crate::agent::pods::{StartWatch, delete_all};
use crate::startup::NAMESPACE;

/// How long one pod (or one wave) may take to be seen Running or failing.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a whole burst may take.
const BURST_TIMEOUT: Duration = Duration::from_secs(600);

/// The pod template of the bench: class `handler`, one busybox container sleeping, BestEffort,
/// a grace period of 1 s (`sleep` as pid 1 ignores SIGTERM), no `nodeName`.
fn template(handler: &str, image: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"labels": {"app": "berth-bench", "handler": handler}},
        "spec": {
            "runtimeClassName": handler,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": image,
                // Pulled before the run: a `:latest` tag would default to Always.
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
            }],
        },
    })
}

/// A bench pod named `name`.
pub fn pod(name: &str, handler: &str, image: &str) -> anyhow::Result<Pod> {
    let mut pod = template(handler, image);
    pod["metadata"]["name"] = name.into();
    Ok(serde_json::from_value(pod)?)
}

/// One pod start through the API.
#[derive(Clone, Debug)]
pub struct Start {
    /// From just before the create call (of the pod, or of its Deployment) to the watch event.
    pub took: Duration,
    /// `Running`, or why not (a timeout included).
    pub ended: Ended,
}

/// Creates `pod` and waits for its start to end.
pub async fn start_one(api: &Api<Pod>, watch: &mut StartWatch, pod: &Pod) -> anyhow::Result<Start> {
    Ok(start_many(api, watch, std::slice::from_ref(pod)).await?.remove(0))
}

/// Creates `pods` together (each timed from its own create call) and waits for every start to
/// end; one that has not ended after [`START_TIMEOUT`] counts as failed.
pub async fn start_many(api: &Api<Pod>, watch: &mut StartWatch, pods: &[Pod]) -> anyhow::Result<Vec<Start>> {
    let creates = pods.iter().map(|pod| async move {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let t0 = Instant::now();
        api.create(&PostParams::default(), pod).await.with_context(|| format!("creating pod {name}"))?;
        anyhow::Ok((name, t0))
    });
    let created: HashMap<String, Instant> =
        futures::future::join_all(creates).await.into_iter().collect::<anyhow::Result<_>>()?;
    let first = created.values().min().copied().unwrap_or_else(Instant::now);
    let seen = watch.wait(|n| created.contains_key(n), created.len(), first + START_TIMEOUT).await?;
    let mut seen: HashMap<String, Seen> = seen.into_iter().collect();
    let mut starts = Vec::new();
    for pod in pods {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let t0 = created[name];
        starts.push(match seen.remove(name) {
            Some(s) => Start { took: s.at.saturating_duration_since(t0), ended: s.ended },
            None => Start {
                took: t0.elapsed(),
                ended: Ended::Failed(format!("pod {name} not Running within {START_TIMEOUT:?}")),
            },
        });
    }
    Ok(starts)
}

/// A Deployment's pods, each timed from the Deployment's create.
pub struct Burst {
    pub starts: Vec<Start>,
    /// Of the pods that started, each from its own creation (the watch's first sight of it) to
    /// Running: the pod startup latency Kubernetes' SLO speaks of.
    pub since_created: Vec<Duration>,
    /// From the create to the last pod seen Running (or the timeout).
    pub all_running: Duration,
}

fn deployment_name(handler: &str) -> String {
    format!("burst-{handler}")
}

/// Creates a Deployment of `replicas` bench pods of class `handler` and waits until every pod
/// it makes has started (or failed, or [`BURST_TIMEOUT`] passed).
pub async fn deployment_burst(
    client: kube::Client,
    watch: &mut StartWatch,
    handler: &str,
    image: &str,
    replicas: usize,
) -> anyhow::Result<Burst> {
    let name = deployment_name(handler);
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "berth-bench", "handler": handler}},
            "template": template(handler, image),
        },
    }))?;
    let api: Api<Deployment> = Api::namespaced(client, NAMESPACE);
    let t0 = Instant::now();
    api.create(&PostParams::default(), &deployment).await.with_context(|| format!("creating Deployment {name}"))?;
    let prefix = format!("{name}-");
    let seen = watch.wait(|n| n.starts_with(&prefix), replicas, t0 + BURST_TIMEOUT).await?;
    let all_running = seen.iter().map(|(_, s)| s.at.saturating_duration_since(t0)).max().unwrap_or_default();
    let since_created = seen
        .iter()
        .filter(|(_, s)| s.ended == Ended::Running)
        .filter_map(|(name, s)| Some(s.at.saturating_duration_since(watch.appeared(name)?)))
        .collect();
    let mut starts: Vec<Start> =
        seen.into_iter().map(|(_, s)| Start { took: s.at.saturating_duration_since(t0), ended: s.ended }).collect();
    let missing = replicas.saturating_sub(starts.len());
    for _ in 0..missing {
        let ended = Ended::Failed(format!("not Running within {BURST_TIMEOUT:?} of the Deployment's create"));
        starts.push(Start { took: t0.elapsed(), ended });
    }
    let all_running = if missing > 0 { t0.elapsed() } else { all_running };
    Ok(Burst { starts, since_created, all_running })
}

/// Deletes the burst's Deployment in the foreground (its ReplicaSet and pods go first) and
/// waits until it is gone, so no ReplicaSet makes pods again while they are deleted.
pub async fn delete_deployment(client: kube::Client, handler: &str) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(client, NAMESPACE);
    let name = deployment_name(handler);
    match api.delete(&name, &DeleteParams::foreground()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("deleting Deployment {name}")),
    }
    let deadline = Instant::now() + BURST_TIMEOUT;
    while api.get_opt(&name).await?.is_some() {
        if Instant::now() > deadline {
            bail!("Deployment {name} still there {BURST_TIMEOUT:?} after its foreground deletion");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_pod_has_no_node_its_class_and_the_present_image() {
        let p = pod("runc-1", "runc", "127.0.0.1:5000/busybox:latest").unwrap();
        let spec = p.spec.unwrap();
        assert_eq!(spec.node_name, None, "the scheduler places it");
        assert_eq!(spec.runtime_class_name.as_deref(), Some("runc"));
        assert_eq!(spec.containers[0].image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(p.metadata.name.as_deref(), Some("runc-1"));
        assert_eq!(p.metadata.labels.unwrap()["app"], "berth-bench", "the watch's selector");
    }
}
