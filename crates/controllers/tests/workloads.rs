//! The ReplicaSet and Deployment controllers against the real API server in-process. There is
//! no scheduler or node: pods "run" when the test (or its stand-in kubelet) sets their status.

mod workloads_common;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use workloads_common::*;

fn merge(v: &serde_json::Value) -> Patch<&serde_json::Value> {
    Patch::Merge(v)
}

fn owner_uid(pod: &Pod) -> Option<String> {
    pod.metadata.owner_references.as_ref()?.iter().find(|r| r.controller == Some(true)).map(|r| r.uid.clone())
}

async fn rs_status(c: &Cluster, name: &str) -> k8s_openapi::api::apps::v1::ReplicaSetStatus {
    c.replica_sets().get(name).await.unwrap().status.unwrap_or_default()
}

async fn wait_for_pods(c: &Cluster, selector: &str, n: usize) -> Vec<Pod> {
    eventually(&format!("{n} pods {selector}"), PATIENCE, || async {
        let pods = c.live_pods(selector).await;
        if pods.len() == n { Ok(pods) } else { Err(format!("{} pods", pods.len())) }
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// ReplicaSet

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_set_creates_its_pods_and_counts_them_ready() {
    let c = Cluster::start().await;
    let rs = c.replica_sets().create(&PostParams::default(), &replica_set("web", 3, json!({}))).await.unwrap();
    let uid = rs.metadata.uid.clone().unwrap();
    let pods = wait_for_pods(&c, "app=web", 3).await;
    for p in &pods {
        let name = p.metadata.name.clone().unwrap();
        assert!(name.starts_with("web-") && name.len() == "web-".len() + 5, "{name}");
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("ReplicaSet", uid.as_str()));
        assert_eq!((owner.controller, owner.block_owner_deletion), (Some(true), Some(true)));
    }
    let s = eventually("status.replicas 3", PATIENCE, || async {
        let s = rs_status(&c, "web").await;
        if s.replicas == 3 && s.observed_generation == Some(1) { Ok(s) } else { Err(format!("{s:?}")) }
    })
    .await;
    assert_eq!((s.ready_replicas, s.fully_labeled_replicas), (None, Some(3)));
    for p in &pods {
        c.make_ready(p.metadata.name.as_deref().unwrap(), None).await;
    }
    eventually("3 ready and available", PATIENCE, || async {
        let s = rs_status(&c, "web").await;
        if s.ready_replicas == Some(3) && s.available_replicas == Some(3) { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    let first = pods[0].metadata.name.clone().unwrap();
    c.expect_event("web", &format!("SuccessfulCreate: Created pod: {first}")).await;

    // A pod deleted by someone else is replaced.
    c.pods().delete(&first, &Default::default()).await.unwrap();
    eventually("a replacement", PATIENCE, || async {
        let pods = c.live_pods("app=web").await;
        let names: Vec<_> = pods.iter().filter_map(|p| p.metadata.name.clone()).collect();
        if pods.len() == 3 && !names.contains(&first) { Ok(()) } else { Err(format!("{names:?}")) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_down_deletes_the_least_valuable_pods_and_scaling_up_adds_more() {
    let c = Cluster::start().await;
    c.replica_sets().create(&PostParams::default(), &replica_set("web", 3, json!({}))).await.unwrap();
    let pods = wait_for_pods(&c, "app=web", 3).await;
    let names: Vec<String> = pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    let now = jiff::Timestamp::now();
    // Ready for long, ready for a short while, not ready at all.
    c.make_ready(&names[0], Some(now - jiff::SignedDuration::from_secs(600))).await;
    c.make_ready(&names[1], Some(now - jiff::SignedDuration::from_secs(10))).await;
    eventually("2 ready", PATIENCE, || async {
        let s = rs_status(&c, "web").await;
        if s.ready_replicas == Some(2) { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;

    c.replica_sets().patch("web", &PatchParams::default(), &merge(&json!({"spec": {"replicas": 2}}))).await.unwrap();
    let left = wait_for_pods(&c, "app=web", 2).await;
    let left: Vec<String> = left.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    assert_eq!(left, vec![names[0].clone(), names[1].clone()], "the pod that is not ready goes first");

    c.replica_sets().patch("web", &PatchParams::default(), &merge(&json!({"spec": {"replicas": 1}}))).await.unwrap();
    let left = wait_for_pods(&c, "app=web", 1).await;
    assert_eq!(left[0].metadata.name.as_deref(), Some(names[0].as_str()), "the pod ready for less time goes next");
    c.expect_event("web", &format!("SuccessfulDelete: Deleted pod: {}", names[2])).await;
    c.expect_event("web", &format!("SuccessfulDelete: Deleted pod: {}", names[1])).await;

    c.replica_sets().patch("web", &PatchParams::default(), &merge(&json!({"spec": {"replicas": 4}}))).await.unwrap();
    wait_for_pods(&c, "app=web", 4).await;
    eventually("status of 4 at generation 4", PATIENCE, || async {
        let s = rs_status(&c, "web").await;
        if s.replicas == 4 && s.observed_generation == Some(4) { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matching_orphan_is_adopted_instead_of_creating_a_pod() {
    let c = Cluster::start().await;
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stray", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
    }))
    .unwrap();
    c.pods().create(&PostParams::default(), &orphan).await.unwrap();
    let rs = c.replica_sets().create(&PostParams::default(), &replica_set("web", 2, json!({}))).await.unwrap();
    let uid = rs.metadata.uid.unwrap();
    eventually("the orphan adopted", PATIENCE, || async {
        let p = c.pods().get("stray").await.unwrap();
        match p.metadata.owner_references.as_ref().and_then(|r| r.first()) {
            Some(o) if o.uid == uid => {
                assert_eq!(
                    (o.controller, o.block_owner_deletion, o.kind.as_str()),
                    (Some(true), Some(true), "ReplicaSet")
                );
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let pods = wait_for_pods(&c, "app=web", 2).await;
    assert!(pods.iter().all(|p| owner_uid(p).as_deref() == Some(uid.as_str())));
    // It stays at two: the adopted pod counted.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.live_pods("app=web").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_labels_stop_matching_is_released_and_replaced() {
    let c = Cluster::start().await;
    let rs = c.replica_sets().create(&PostParams::default(), &replica_set("web", 2, json!({}))).await.unwrap();
    let uid = rs.metadata.uid.unwrap();
    let pods = wait_for_pods(&c, "app=web", 2).await;
    let moved = pods[0].metadata.name.clone().unwrap();
    c.pods()
        .patch(&moved, &PatchParams::default(), &merge(&json!({"metadata": {"labels": {"app": "debug"}}})))
        .await
        .unwrap();
    eventually("the pod released", PATIENCE, || async {
        let p = c.pods().get(&moved).await.unwrap();
        let refs = p.metadata.owner_references.clone().unwrap_or_default();
        if refs.iter().all(|r| r.uid != uid) { Ok(()) } else { Err(format!("{refs:?}")) }
    })
    .await;
    let pods = wait_for_pods(&c, "app=web", 2).await;
    assert!(pods.iter().all(|p| p.metadata.name.as_deref() != Some(moved.as_str())));
    assert!(pods.iter().all(|p| owner_uid(p).as_deref() == Some(uid.as_str())));
    assert_eq!(c.live_pods("app=debug").await.len(), 1, "the released pod is left alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_runtime_class_sets_replica_failure_until_the_class_exists() {
    let c = Cluster::start().await;
    let spec = json!({"template": {"spec": {"runtimeClassName": "sandboxed"}}});
    c.replica_sets().create(&PostParams::default(), &replica_set("web", 2, spec)).await.unwrap();
    let cond = eventually("ReplicaFailure", PATIENCE, || async {
        let s = rs_status(&c, "web").await;
        let cond = s.conditions.unwrap_or_default().into_iter().find(|c| c.type_ == "ReplicaFailure");
        cond.ok_or_else(|| "no condition".to_string())
    })
    .await;
    assert_eq!((cond.status.as_str(), cond.reason.as_deref()), ("True", Some("FailedCreate")));
    let message = cond.message.unwrap_or_default();
    assert!(message.contains("is forbidden: pod rejected: RuntimeClass \"sandboxed\" not found"), "{message}");
    c.expect_event("web", "FailedCreate: Error creating: pods ").await;
    c.expect_event("web", "pod rejected: RuntimeClass \"sandboxed\" not found").await;
    assert!(c.live_pods("app=web").await.is_empty());

    let class: k8s_openapi::api::node::v1::RuntimeClass =
        serde_json::from_value(json!({"metadata": {"name": "sandboxed"}, "handler": "runsc"})).unwrap();
    kube::Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(c.client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let pods = wait_for_pods(&c, "app=web", 2).await;
    assert!(pods.iter().all(|p| p.spec.as_ref().unwrap().runtime_class_name.as_deref() == Some("sandboxed")));
    eventually("ReplicaFailure cleared", PATIENCE, || async {
        let s = rs_status(&c, "web").await;
        let conds = s.conditions.unwrap_or_default();
        if conds.is_empty() && s.replicas == 2 { Ok(()) } else { Err(format!("{conds:?}")) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_count_as_available_only_after_min_ready_seconds() {
    let c = Cluster::start().await;
    c.replica_sets()
        .create(&PostParams::default(), &replica_set("web", 2, json!({"minReadySeconds": 2})))
        .await
        .unwrap();
    let pods = wait_for_pods(&c, "app=web", 2).await;
    for p in &pods {
        c.make_ready(p.metadata.name.as_deref().unwrap(), None).await;
    }
    let s = eventually("2 ready", PATIENCE, || async {
        let s = rs_status(&c, "web").await;
        if s.ready_replicas == Some(2) { Ok(s) } else { Err(format!("{s:?}")) }
    })
    .await;
    assert_eq!(s.available_replicas, None, "not yet available: {s:?}");
    // Nothing changes when they become available: the controller looks again by itself.
    eventually("2 available", PATIENCE, || async {
        let s = rs_status(&c, "web").await;
        if s.available_replicas == Some(2) { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Deployment

async fn wait_complete(c: &Cluster, name: &str) -> Deployment {
    eventually(&format!("deployment {name} complete"), PATIENCE, || async {
        let d = c.deployments().get(name).await.unwrap();
        let want = d.spec.as_ref().unwrap().replicas.unwrap_or(1);
        let s = d.status.clone().unwrap_or_default();
        let progressed = s
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Progressing" && c.reason.as_deref() == Some("NewReplicaSetAvailable"));
        let done = s.observed_generation >= d.metadata.generation
            && s.updated_replicas == Some(want)
            && s.replicas == Some(want)
            && s.available_replicas == Some(want)
            && progressed;
        if done { Ok(d) } else { Err(format!("generation {:?}, {s:#?}", d.metadata.generation)) }
    })
    .await
}

async fn set_image(c: &Cluster, name: &str, image: &str) {
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}});
    c.deployments().patch(name, &PatchParams::default(), &merge(&patch)).await.unwrap();
}

fn condition(d: &Deployment, type_: &str) -> Option<k8s_openapi::api::apps::v1::DeploymentCondition> {
    d.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_runs_its_pods_through_a_replica_set_named_by_the_template_hash() {
    let c = Cluster::start().await;
    let _kubelet = c.kubelet("app=web", Duration::from_millis(50));
    c.deployments().create(&PostParams::default(), &deployment("web", 3, "nginx:1", json!({}))).await.unwrap();
    let d = wait_complete(&c, "web").await;
    let rss = c.replica_sets_of("app=web").await;
    assert_eq!(rss.len(), 1);
    let rs = &rss[0];
    let hash = rs.metadata.labels.as_ref().unwrap()["pod-template-hash"].clone();
    assert_eq!(rs.metadata.name.as_deref(), Some(format!("web-{hash}").as_str()));
    assert_eq!(rs.spec.as_ref().unwrap().selector.match_labels.as_ref().unwrap()["pod-template-hash"], hash);
    let template_labels =
        rs.spec.as_ref().unwrap().template.as_ref().unwrap().metadata.as_ref().unwrap().labels.clone();
    assert_eq!(template_labels.unwrap()["pod-template-hash"], hash);
    assert_eq!(annotation(&rs.metadata.annotations, "deployment.kubernetes.io/revision"), "1");
    assert_eq!(annotation(&rs.metadata.annotations, "deployment.kubernetes.io/desired-replicas"), "3");
    assert_eq!(annotation(&rs.metadata.annotations, "deployment.kubernetes.io/max-replicas"), "4");
    let owner = &rs.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Deployment", d.metadata.uid.as_deref().unwrap()));
    let pods = c.live_pods("app=web").await;
    assert_eq!(pods.len(), 3);
    assert!(
        pods.iter()
            .all(|p| hash_of(p) == hash && p.metadata.name.as_ref().unwrap().starts_with(&format!("web-{hash}-")))
    );
    assert_eq!(annotation(&d.metadata.annotations, "deployment.kubernetes.io/revision"), "1");
    let s = d.status.clone().unwrap();
    assert_eq!((s.ready_replicas, s.unavailable_replicas), (Some(3), None));
    let available = condition(&d, "Available").unwrap();
    assert_eq!((available.status.as_str(), available.reason.as_deref()), ("True", Some("MinimumReplicasAvailable")));
    let progressing = condition(&d, "Progressing").unwrap();
    assert_eq!(progressing.message, Some(format!("ReplicaSet \"web-{hash}\" has successfully progressed.")));
    c.expect_event("web", &format!("ScalingReplicaSet: Scaled up replica set web-{hash} from 0 to 3")).await;

    // `kubectl scale` goes through the scale subresource.
    c.deployments()
        .patch_scale("web", &PatchParams::default(), &merge(&json!({"spec": {"replicas": 5}})))
        .await
        .unwrap();
    wait_complete(&c, "web").await;
    assert_eq!(c.replica_sets_of("app=web").await.len(), 1);
    c.expect_event("web", &format!("ScalingReplicaSet: Scaled up replica set web-{hash} from 3 to 5")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_updates_never_exceed_the_surge_nor_the_unavailability() {
    let c = Cluster::start().await;
    let _kubelet = c.kubelet("app=web", Duration::from_millis(150));
    let (census, _watch) = c.census("app=web");
    // 4 replicas, 25% each way: one extra pod, one unavailable.
    c.deployments().create(&PostParams::default(), &deployment("web", 4, "nginx:1", json!({}))).await.unwrap();
    wait_complete(&c, "web").await;
    eventually("the census to see 4 ready", PATIENCE, || async {
        let n = census.lock().unwrap().live();
        if n == 4 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await;
    census.lock().unwrap().arm();
    set_image(&c, "web", "nginx:2").await;
    let d = wait_complete(&c, "web").await;
    {
        let census = census.lock().unwrap();
        assert!(census.changes > 8, "the watch saw the rollout: {census:?}");
        assert!(census.max_live <= 5, "more than replicas + maxSurge pods: {census:?}");
        assert!(census.min_ready >= 3, "fewer than replicas - maxUnavailable ready: {census:?}");
    }
    let rss = c.replica_sets_of("app=web").await;
    assert_eq!(rss.len(), 2);
    assert_eq!((revision(&rss[0]), rss[0].spec.as_ref().unwrap().replicas), (1, Some(0)));
    assert_eq!((revision(&rss[1]), rss[1].spec.as_ref().unwrap().replicas), (2, Some(4)));
    assert_eq!(annotation(&d.metadata.annotations, "deployment.kubernetes.io/revision"), "2");
    let old = rss[0].metadata.name.clone().unwrap();
    c.expect_event("web", &format!("ScalingReplicaSet: Scaled down replica set {old} from 4 to 3")).await;

    // Integers now, surge only: never a pod less, at most two more. The change is a runtime
    // class, which rolls out like any other template change.
    let class: k8s_openapi::api::node::v1::RuntimeClass =
        serde_json::from_value(json!({"metadata": {"name": "gvisor"}, "handler": "runsc"})).unwrap();
    kube::Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(c.client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    census.lock().unwrap().arm();
    let patch = json!({"spec": {
        "strategy": {"rollingUpdate": {"maxSurge": 2, "maxUnavailable": 0}},
        "template": {"spec": {"runtimeClassName": "gvisor"}},
    }});
    c.deployments().patch("web", &PatchParams::default(), &merge(&patch)).await.unwrap();
    wait_complete(&c, "web").await;
    {
        let census = census.lock().unwrap();
        assert!(census.max_live <= 6, "more than replicas + maxSurge pods: {census:?}");
        assert!(census.min_ready >= 4, "a pod was unavailable: {census:?}");
    }
    let pods = c.live_pods("app=web").await;
    assert!(pods.iter().all(|p| p.spec.as_ref().unwrap().runtime_class_name.as_deref() == Some("gvisor")));
    assert_eq!(c.replica_sets_of("app=web").await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resizing_a_deployment_mid_rollout_scales_its_replica_sets_in_proportion() {
    let c = Cluster::start().await;
    // Only the first version's pods ever become ready, so the rollout stalls half way.
    let _kubelet = c.kubelet("app=web,version=1", Duration::from_millis(30));
    let spec = json!({
        "strategy": {"rollingUpdate": {"maxSurge": 3, "maxUnavailable": 2}},
        "template": {"metadata": {"labels": {"version": "1"}}},
    });
    c.deployments().create(&PostParams::default(), &deployment("web", 10, "nginx:1", spec)).await.unwrap();
    wait_complete(&c, "web").await;
    let patch = json!({"spec": {"template": {"metadata": {"labels": {"version": "2"}}}}});
    c.deployments().patch("web", &PatchParams::default(), &merge(&patch)).await.unwrap();
    // 10 available old pods, 2 may go; 3 more may be made: the new pods, never ready, stop it
    // at 8 old and 5 new.
    let sizes = || async {
        let rss = c.replica_sets_of("app=web").await;
        let sizes: Vec<Option<i32>> = rss.iter().map(|r| r.spec.as_ref().unwrap().replicas).collect();
        (rss, sizes)
    };
    let rss = eventually("the rollout to stall at 8 + 5", PATIENCE, || async {
        let (rss, s) = sizes().await;
        if s == vec![Some(8), Some(5)] { Ok(rss) } else { Err(format!("{s:?}")) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sizes().await.1, vec![Some(8), Some(5)], "stalled");

    // 20 replicas + 3 surge = 23 for 13: old 8·23/13 = 14.2 → 14, new 5·23/13 = 8.8 → 9.
    c.deployments()
        .patch_scale("web", &PatchParams::default(), &merge(&json!({"spec": {"replicas": 20}})))
        .await
        .unwrap();
    eventually("proportional sizes", PATIENCE, || async {
        let (_, s) = sizes().await;
        if s == vec![Some(14), Some(9)] { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    let (old, new) = (rss[0].metadata.name.clone().unwrap(), rss[1].metadata.name.clone().unwrap());
    c.expect_event("web", &format!("Scaled up replica set {old} from 8 to 14")).await;
    c.expect_event("web", &format!("Scaled up replica set {new} from 5 to 9")).await;
    let rss = c.replica_sets_of("app=web").await;
    for rs in &rss {
        assert_eq!(annotation(&rs.metadata.annotations, "deployment.kubernetes.io/desired-replicas"), "20");
        assert_eq!(annotation(&rs.metadata.annotations, "deployment.kubernetes.io/max-replicas"), "23");
    }
    wait_for_pods(&c, "app=web", 23).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_by_copying_an_old_template_reuses_its_replica_set_and_raises_its_revision() {
    let c = Cluster::start().await;
    let _kubelet = c.kubelet("app=web", Duration::from_millis(50));
    c.deployments().create(&PostParams::default(), &deployment("web", 2, "nginx:1", json!({}))).await.unwrap();
    wait_complete(&c, "web").await;
    let patch = json!({
        "metadata": {"annotations": {"kubernetes.io/change-cause": "upgrade to nginx:2"}},
        "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "nginx:2"}]}}},
    });
    c.deployments().patch("web", &PatchParams::default(), &merge(&patch)).await.unwrap();
    wait_complete(&c, "web").await;
    let rss = c.replica_sets_of("app=web").await;
    assert_eq!(rss.iter().map(revision).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(annotation(&rss[1].metadata.annotations, "kubernetes.io/change-cause"), "upgrade to nginx:2");

    // What `kubectl rollout undo` does: the previous revision's template (without its hash
    // label) patched into the Deployment.
    let mut template = rss[0].spec.as_ref().unwrap().template.clone().unwrap();
    template.metadata.as_mut().unwrap().labels.as_mut().unwrap().remove("pod-template-hash");
    c.deployments()
        .patch("web", &PatchParams::default(), &merge(&json!({"spec": {"template": template}})))
        .await
        .unwrap();
    let d = wait_complete(&c, "web").await;
    let rss = c.replica_sets_of("app=web").await;
    assert_eq!(rss.len(), 2, "no new ReplicaSet: {:?}", rss.iter().map(|r| &r.metadata.name).collect::<Vec<_>>());
    let back = rss.iter().find(|r| r.metadata.uid == rss[1].metadata.uid).unwrap();
    let images: Vec<_> = back
        .spec
        .as_ref()
        .unwrap()
        .template
        .as_ref()
        .unwrap()
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(|c| c.image.clone())
        .collect();
    assert_eq!(images, vec![Some("nginx:1".to_string())], "the reused ReplicaSet is the first one");
    assert_eq!(revision(back), 3);
    assert_eq!(annotation(&back.metadata.annotations, "deployment.kubernetes.io/revision-history"), "1");
    assert_eq!(back.spec.as_ref().unwrap().replicas, Some(2));
    assert_eq!(rss[0].spec.as_ref().unwrap().replicas, Some(0));
    assert_eq!(annotation(&d.metadata.annotations, "deployment.kubernetes.io/revision"), "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_deployment_scales_but_does_not_roll_out_until_resumed() {
    let c = Cluster::start().await;
    let _kubelet = c.kubelet("app=web", Duration::from_millis(50));
    c.deployments().create(&PostParams::default(), &deployment("web", 2, "nginx:1", json!({}))).await.unwrap();
    wait_complete(&c, "web").await;
    c.deployments().patch("web", &PatchParams::default(), &merge(&json!({"spec": {"paused": true}}))).await.unwrap();
    eventually("DeploymentPaused", PATIENCE, || async {
        let d = c.deployments().get("web").await.unwrap();
        match condition(&d, "Progressing") {
            Some(p) if p.reason.as_deref() == Some("DeploymentPaused") && p.status == "Unknown" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    set_image(&c, "web", "nginx:2").await;
    c.deployments().patch("web", &PatchParams::default(), &merge(&json!({"spec": {"replicas": 3}}))).await.unwrap();
    eventually("scaled to 3 while paused", PATIENCE, || async {
        let rss = c.replica_sets_of("app=web").await;
        let sizes: Vec<_> = rss.iter().map(|r| r.spec.as_ref().unwrap().replicas).collect();
        if sizes == vec![Some(3)] { Ok(()) } else { Err(format!("{sizes:?}")) }
    })
    .await;
    wait_for_pods(&c, "app=web", 3).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.replica_sets_of("app=web").await.len(), 1, "no rollout while paused");

    c.deployments().patch("web", &PatchParams::default(), &merge(&json!({"spec": {"paused": false}}))).await.unwrap();
    wait_complete(&c, "web").await;
    let rss = c.replica_sets_of("app=web").await;
    assert_eq!(rss.iter().map(|r| r.spec.as_ref().unwrap().replicas).collect::<Vec<_>>(), vec![Some(0), Some(3)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreate_removes_every_old_pod_before_creating_new_ones() {
    let c = Cluster::start().await;
    let _kubelet = c.kubelet("app=web", Duration::from_millis(50));
    let (census, _watch) = c.census("app=web");
    let recreate = json!({"strategy": {"type": "Recreate", "rollingUpdate": null}});
    c.deployments().create(&PostParams::default(), &deployment("web", 3, "nginx:1", recreate)).await.unwrap();
    wait_complete(&c, "web").await;
    census.lock().unwrap().arm();
    set_image(&c, "web", "nginx:2").await;
    wait_complete(&c, "web").await;
    {
        let census = census.lock().unwrap();
        assert!(census.changes > 6, "the watch saw the rollout: {census:?}");
        assert_eq!(census.max_hashes_all, 1, "old and new pods at once: {census:?}");
        assert!(census.max_live <= 3, "{census:?}");
    }
    let rss = c.replica_sets_of("app=web").await;
    assert_eq!(rss.iter().map(|r| r.spec.as_ref().unwrap().replicas).collect::<Vec<_>>(), vec![Some(0), Some(3)]);
    c.expect_event("web", &format!("Scaled down replica set {} from 3 to 0", rss[0].metadata.name.as_deref().unwrap()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_without_progress_exceeds_its_deadline() {
    let c = Cluster::start().await;
    // No kubelet: the pods never become ready.
    c.deployments()
        .create(&PostParams::default(), &deployment("web", 2, "nginx:1", json!({"progressDeadlineSeconds": 2})))
        .await
        .unwrap();
    let d = eventually("ProgressDeadlineExceeded", PATIENCE, || async {
        let d = c.deployments().get("web").await.unwrap();
        match condition(&d, "Progressing") {
            Some(p) if p.reason.as_deref() == Some("ProgressDeadlineExceeded") => Ok(d),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let p = condition(&d, "Progressing").unwrap();
    let rs = &c.replica_sets_of("app=web").await[0];
    assert_eq!(p.status, "False");
    assert_eq!(
        p.message,
        Some(format!("ReplicaSet {:?} has timed out progressing.", rs.metadata.name.as_deref().unwrap()))
    );
    let available = condition(&d, "Available").unwrap();
    assert_eq!((available.status.as_str(), available.reason.as_deref()), ("False", Some("MinimumReplicasUnavailable")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_replica_sets_beyond_the_history_limit_are_deleted() {
    let c = Cluster::start().await;
    let _kubelet = c.kubelet("app=web", Duration::from_millis(30));
    c.deployments()
        .create(&PostParams::default(), &deployment("web", 1, "nginx:1", json!({"revisionHistoryLimit": 1})))
        .await
        .unwrap();
    wait_complete(&c, "web").await;
    for image in ["nginx:2", "nginx:3", "nginx:4"] {
        set_image(&c, "web", image).await;
        wait_complete(&c, "web").await;
    }
    let rss = eventually("two replica sets left", PATIENCE, || async {
        let rss = c.replica_sets_of("app=web").await;
        if rss.len() == 2 { Ok(rss) } else { Err(format!("{:?}", rss.iter().map(revision).collect::<Vec<_>>())) }
    })
    .await;
    assert_eq!(rss.iter().map(revision).collect::<Vec<_>>(), vec![3, 4]);
}
