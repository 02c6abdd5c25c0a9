//! The ReplicationController controller against the real API server in-process, with the
//! garbage collector where deletion is tested: what the conformance suite's garbage-collector
//! specs ask of it (pods created and counted, scaled, adopted, released, orphaned, deleted).

mod workloads_common;

use std::time::Duration;

use berth_controllers::{garbage_collector, replication};
use k8s_openapi::api::core::v1::{Pod, ReplicationController, ReplicationControllerStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use workloads_common::*;

/// An API server with the ReplicaSet, Deployment and ReplicationController controllers.
async fn cluster() -> Cluster {
    let mut c = Cluster::start().await;
    c.spawn(replication::run);
    c
}

fn rcs(c: &Cluster) -> Api<ReplicationController> {
    Api::default_namespaced(c.client.clone())
}

/// A ReplicationController of `replicas` pods labelled `app: <name>`; its selector is left for
/// the API server to default from the template's labels.
fn rc(name: &str, replicas: i32, template_spec: Value) -> ReplicationController {
    let mut spec = json!({"containers": [{"name": "app", "image": "registry.example/app:1"}]});
    if let (Value::Object(base), Value::Object(extra)) = (&mut spec, template_spec) {
        base.extend(extra);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": {"metadata": {"labels": {"app": name}}, "spec": spec}},
    }))
    .unwrap()
}

async fn create(c: &Cluster, rc: &ReplicationController) -> String {
    rcs(c).create(&PostParams::default(), rc).await.unwrap().metadata.uid.unwrap()
}

async fn rc_status(c: &Cluster, name: &str) -> ReplicationControllerStatus {
    rcs(c).get(name).await.unwrap().status.unwrap_or_default()
}

async fn wait_for_pods(c: &Cluster, selector: &str, n: usize) -> Vec<Pod> {
    eventually(&format!("{n} pods {selector}"), PATIENCE, || async {
        let pods = c.live_pods(selector).await;
        if pods.len() == n { Ok(pods) } else { Err(format!("{} pods", pods.len())) }
    })
    .await
}

async fn wait_for_replicas(c: &Cluster, name: &str, n: i32) -> ReplicationControllerStatus {
    eventually(&format!("status.replicas {n}"), PATIENCE, || async {
        let s = rc_status(c, name).await;
        if s.replicas == n { Ok(s) } else { Err(format!("{s:?}")) }
    })
    .await
}

fn controller_uid(pod: &Pod) -> Option<String> {
    pod.metadata.owner_references.as_ref()?.iter().find(|r| r.controller == Some(true)).map(|r| r.uid.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replication_controller_creates_its_pods_owned_by_it_and_counts_them() {
    let c = cluster().await;
    let uid = create(&c, &rc("web", 3, json!({}))).await;
    let stored = rcs(&c).get("web").await.unwrap();
    assert_eq!(stored.spec.unwrap().selector, Some([("app".to_string(), "web".to_string())].into()));

    let pods = wait_for_pods(&c, "app=web", 3).await;
    for p in &pods {
        let name = p.metadata.name.clone().unwrap();
        assert!(name.starts_with("web-") && name.len() == "web-".len() + 5, "{name}");
        let owners = p.metadata.owner_references.as_ref().unwrap();
        assert_eq!(owners.len(), 1);
        let o = &owners[0];
        assert_eq!((o.api_version.as_str(), o.kind.as_str(), o.name.as_str()), ("v1", "ReplicationController", "web"));
        assert_eq!((o.uid.as_str(), o.controller, o.block_owner_deletion), (uid.as_str(), Some(true), Some(true)));
    }
    let s = eventually("status.replicas 3 at generation 1", PATIENCE, || async {
        let s = rc_status(&c, "web").await;
        if s.replicas == 3 && s.observed_generation == Some(1) { Ok(s) } else { Err(format!("{s:?}")) }
    })
    .await;
    assert_eq!((s.fully_labeled_replicas, s.ready_replicas, s.available_replicas), (Some(3), None, None));

    for p in &pods {
        c.make_ready(p.metadata.name.as_deref().unwrap(), None).await;
    }
    eventually("3 ready and available", PATIENCE, || async {
        let s = rc_status(&c, "web").await;
        if s.ready_replicas == Some(3) && s.available_replicas == Some(3) { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    let first = pods[0].metadata.name.clone().unwrap();
    c.expect_event("web", &format!("SuccessfulCreate: Created pod: {first}")).await;
    // The ReplicaSet controller leaves them alone: nothing else claims or adds pods.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let now = c.live_pods("app=web").await;
    assert_eq!(now.len(), 3);
    assert!(now.iter().all(|p| controller_uid(p).as_deref() == Some(uid.as_str())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_a_replication_controller_down_deletes_pods_and_up_creates_them() {
    let c = cluster().await;
    create(&c, &rc("web", 3, json!({}))).await;
    let pods = wait_for_pods(&c, "app=web", 3).await;
    let names: Vec<String> = pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    c.make_ready(&names[0], None).await;
    eventually("1 ready", PATIENCE, || async {
        let s = rc_status(&c, "web").await;
        if s.ready_replicas == Some(1) { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;

    // Through the scale subresource, as `kubectl scale rc` does.
    let scale = json!({"spec": {"replicas": 1}});
    rcs(&c).patch_scale("web", &PatchParams::default(), &Patch::Merge(&scale)).await.unwrap();
    let left = wait_for_pods(&c, "app=web", 1).await;
    assert_eq!(left[0].metadata.name.as_deref(), Some(names[0].as_str()), "the ready pod is kept");
    wait_for_replicas(&c, "web", 1).await;
    c.expect_event("web", &format!("SuccessfulDelete: Deleted pod: {}", names[1])).await;
    c.expect_event("web", &format!("SuccessfulDelete: Deleted pod: {}", names[2])).await;

    let up = json!({"spec": {"replicas": 2}});
    rcs(&c).patch("web", &PatchParams::default(), &Patch::Merge(&up)).await.unwrap();
    wait_for_pods(&c, "app=web", 2).await;
    eventually("status of 2 at generation 3", PATIENCE, || async {
        let s = rc_status(&c, "web").await;
        if s.replicas == 2 && s.observed_generation == Some(3) { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matching_orphan_is_adopted_by_a_replication_controller() {
    let c = cluster().await;
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stray", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
    }))
    .unwrap();
    c.pods().create(&PostParams::default(), &orphan).await.unwrap();
    let uid = create(&c, &rc("web", 2, json!({}))).await;
    eventually("the orphan adopted", PATIENCE, || async {
        let p = c.pods().get("stray").await.unwrap();
        match p.metadata.owner_references.as_ref().and_then(|r| r.first()) {
            Some(o) if o.uid == uid => {
                assert_eq!(
                    (o.api_version.as_str(), o.kind.as_str(), o.controller, o.block_owner_deletion),
                    ("v1", "ReplicationController", Some(true), Some(true))
                );
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let pods = wait_for_pods(&c, "app=web", 2).await;
    assert!(pods.iter().all(|p| controller_uid(p).as_deref() == Some(uid.as_str())));
    // It stays at two: the adopted pod counted.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.live_pods("app=web").await.len(), 2);
    wait_for_replicas(&c, "web", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_labels_stop_matching_is_released_by_its_replication_controller_and_replaced() {
    let c = cluster().await;
    let uid = create(&c, &rc("web", 2, json!({}))).await;
    let pods = wait_for_pods(&c, "app=web", 2).await;
    let moved = pods[0].metadata.name.clone().unwrap();
    let relabel = json!({"metadata": {"labels": {"app": "debug"}}});
    c.pods().patch(&moved, &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    eventually("the pod released", PATIENCE, || async {
        let p = c.pods().get(&moved).await.unwrap();
        let refs = p.metadata.owner_references.clone().unwrap_or_default();
        if refs.iter().all(|r| r.uid != uid) { Ok(()) } else { Err(format!("{refs:?}")) }
    })
    .await;
    let pods = wait_for_pods(&c, "app=web", 2).await;
    assert!(pods.iter().all(|p| p.metadata.name.as_deref() != Some(moved.as_str())));
    assert!(pods.iter().all(|p| controller_uid(p).as_deref() == Some(uid.as_str())));
    assert_eq!(c.live_pods("app=debug").await.len(), 1, "the released pod is left alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_create_sets_replica_failure_on_a_replication_controller_until_it_succeeds() {
    let c = cluster().await;
    create(&c, &rc("web", 2, json!({"runtimeClassName": "sandboxed"}))).await;
    let cond = eventually("ReplicaFailure", PATIENCE, || async {
        let s = rc_status(&c, "web").await;
        let cond = s.conditions.unwrap_or_default().into_iter().find(|c| c.type_ == "ReplicaFailure");
        cond.ok_or_else(|| "no condition".to_string())
    })
    .await;
    assert_eq!((cond.status.as_str(), cond.reason.as_deref()), ("True", Some("FailedCreate")));
    assert!(cond.message.unwrap_or_default().contains("RuntimeClass \"sandboxed\" not found"));
    c.expect_event("web", "FailedCreate: Error creating: pods ").await;

    let class: k8s_openapi::api::node::v1::RuntimeClass =
        serde_json::from_value(json!({"metadata": {"name": "sandboxed"}, "handler": "runsc"})).unwrap();
    Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(c.client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    wait_for_pods(&c, "app=web", 2).await;
    eventually("ReplicaFailure cleared", PATIENCE, || async {
        let s = rc_status(&c, "web").await;
        let conds = s.conditions.unwrap_or_default();
        if conds.is_empty() && s.replicas == 2 { Ok(()) } else { Err(format!("{conds:?}")) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_replication_controller_with_orphan_propagation_leaves_its_pods() {
    let mut c = cluster().await;
    c.spawn(garbage_collector::run);
    let uid = create(&c, &rc("web", 2, json!({}))).await;
    wait_for_pods(&c, "app=web", 2).await;
    wait_for_replicas(&c, "web", 2).await;

    rcs(&c).delete("web", &DeleteParams::orphan()).await.unwrap();
    eventually("the replication controller gone", PATIENCE, || async {
        match rcs(&c).get_opt("web").await.unwrap() {
            None => Ok(()),
            Some(rc) => Err(format!("{:?}", rc.metadata.finalizers)),
        }
    })
    .await;
    // Still two a while later, and no longer owned by it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pods = c.live_pods("app=web").await;
    assert_eq!(pods.len(), 2);
    for p in &pods {
        let refs = p.metadata.owner_references.clone().unwrap_or_default();
        assert!(refs.iter().all(|r| r.uid != uid), "{refs:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_replication_controller_in_the_background_deletes_its_pods() {
    let mut c = cluster().await;
    c.spawn(garbage_collector::run);
    create(&c, &rc("web", 2, json!({}))).await;
    wait_for_pods(&c, "app=web", 2).await;

    rcs(&c).delete("web", &DeleteParams::background()).await.unwrap();
    wait_for_pods(&c, "app=web", 0).await;
    assert!(rcs(&c).get_opt("web").await.unwrap().is_none());
}
