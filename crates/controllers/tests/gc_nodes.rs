//! The garbage collector, node lifecycle and namespace controllers against the real API server
//! in-process: owners and dependents (background, orphan, foreground, cycles), silent and
//! not-ready nodes with their taints and evictions, orphaned pods, and namespace deletion.

mod gc_common;

use std::time::Duration;

use berth_controllers::node_lifecycle::Tuning;
use gc_common::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod, Secret, Taint};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

// ---------------------------------------------------------------------------------------------
// Garbage collector

#[tokio::test]
async fn dependents_of_a_deleted_owner_are_deleted_and_objects_without_owners_are_left_alone() {
    let mut c = Cluster::new().await;
    c.start_gc();
    let owner = c.cm("owner", &[], &[]).await;
    c.cm("dep-a", &[cm_ref(&owner, true)], &[]).await;
    c.cm("dep-b", &[cm_ref(&owner, false)], &[]).await;
    let secrets: Api<Secret> = Api::default_namespaced(c.client.clone());
    let s: Secret =
        serde_json::from_value(json!({"metadata": {"name": "dep-s", "ownerReferences": [cm_ref(&owner, false)]}}))
            .unwrap();
    secrets.create(&PostParams::default(), &s).await.unwrap();
    c.cm("loner", &[], &[]).await;

    // Owners that exist keep their dependents.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(c.cms().get_opt("dep-a").await.unwrap().is_some());

    c.cms().delete("owner", &DeleteParams::default()).await.unwrap();
    let cms = c.cms();
    gone("dep-a", || cms.get_opt("dep-a")).await;
    gone("dep-b", || cms.get_opt("dep-b")).await;
    gone("dep-s", || secrets.get_opt("dep-s")).await;
    assert!(c.cms().get_opt("loner").await.unwrap().is_some());
}

#[tokio::test]
async fn deleting_a_deployment_removes_its_replicasets_and_their_pods() {
    let mut c = Cluster::new().await;
    c.start_gc();
    let deps: Api<Deployment> = Api::default_namespaced(c.client.clone());
    let rss: Api<ReplicaSet> = Api::default_namespaced(c.client.clone());
    let template =
        json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template},
    }))
    .unwrap();
    let d = deps.create(&PostParams::default(), &d).await.unwrap();
    let d_ref = owned_by("apps/v1", "Deployment", "web", d.metadata.uid.as_deref().unwrap(), true);
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "web-1", "labels": {"app": "web"}, "ownerReferences": [d_ref]},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": template},
    }))
    .unwrap();
    let rs = rss.create(&PostParams::default(), &rs).await.unwrap();
    let rs_ref = owned_by("apps/v1", "ReplicaSet", "web-1", rs.metadata.uid.as_deref().unwrap(), true);
    for i in 0..2 {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("web-1-{i}"), "labels": {"app": "web"}, "ownerReferences": [rs_ref]},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]},
        }))
        .unwrap();
        c.pods().create(&PostParams::default(), &p).await.unwrap();
    }

    deps.delete("web", &DeleteParams::default()).await.unwrap();
    gone("the ReplicaSet", || rss.get_opt("web-1")).await;
    let pods = c.pods();
    gone("web-1-0", || pods.get_opt("web-1-0")).await;
    gone("web-1-1", || pods.get_opt("web-1-1")).await;
}

#[tokio::test]
async fn a_reference_to_an_owner_with_another_uid_or_none_at_all_is_dangling() {
    let mut c = Cluster::new().await;
    c.start_gc();
    let live = c.cm("live", &[], &[]).await;
    let impostor = owned_by("v1", "ConfigMap", "live", "00000000-0000-0000-0000-000000000000", false);
    let never = owned_by("v1", "ConfigMap", "never", "11111111-1111-1111-1111-111111111111", false);
    c.cm("wrong-uid", std::slice::from_ref(&impostor), &[]).await;
    c.cm("never-owned", &[never], &[]).await;
    // One live owner keeps it; only the dangling reference goes.
    c.cm("two-owners", &[cm_ref(&live, false), impostor], &[]).await;

    let cms = c.cms();
    gone("wrong-uid", || cms.get_opt("wrong-uid")).await;
    gone("never-owned", || cms.get_opt("never-owned")).await;
    let kept = eventually("two-owners to lose its dangling reference", PATIENCE, || async {
        let cm = c.cms().get("two-owners").await.map_err(|e| e.to_string())?;
        let owners = cm.metadata.owner_references.clone().unwrap_or_default();
        if owners.len() == 1 { Ok(owners) } else { Err(format!("{owners:?}")) }
    })
    .await;
    assert_eq!(kept[0].uid, live.metadata.uid.unwrap());
}

#[tokio::test]
async fn an_owner_with_the_orphan_finalizer_frees_its_dependents_then_goes() {
    let mut c = Cluster::new().await;
    c.start_gc();
    let owner = c.cm("owner", &[], &["orphan"]).await;
    let other = c.cm("other", &[], &[]).await;
    c.cm("dep", &[cm_ref(&owner, true), cm_ref(&other, false)], &[]).await;
    c.cm("only-child", &[cm_ref(&owner, true)], &[]).await;

    c.cms().delete("owner", &DeleteParams::default()).await.unwrap();
    let cms = c.cms();
    gone("the orphaning owner", || cms.get_opt("owner")).await;
    let dep = c.cms().get("dep").await.unwrap();
    let owners = dep.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].name, "other");
    let child = c.cms().get("only-child").await.unwrap();
    assert!(child.metadata.owner_references.unwrap_or_default().is_empty());
    // Still there a while later: orphans are not garbage.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(c.cms().get_opt("only-child").await.unwrap().is_some());
}

#[tokio::test]
async fn a_cascade_orphan_delete_leaves_the_dependents_without_the_reference() {
    let mut c = Cluster::new().await;
    c.start_gc();
    let owner = c.cm("owner", &[], &[]).await;
    c.cm("dep", &[cm_ref(&owner, true)], &[]).await;
    // What `kubectl delete --cascade=orphan` sends.
    c.cms().delete("owner", &DeleteParams::orphan()).await.unwrap();
    let cms = c.cms();
    gone("the owner", || cms.get_opt("owner")).await;
    let dep = c.cms().get("dep").await.unwrap();
    assert!(dep.metadata.owner_references.unwrap_or_default().is_empty());
}

#[tokio::test]
async fn a_foreground_owner_waits_for_its_blocking_dependents_even_while_they_terminate() {
    let mut c = Cluster::new().await;
    c.start_gc();
    let owner = c.cm("owner", &[], &["foregroundDeletion"]).await;
    c.cm("held", &[cm_ref(&owner, true)], &["test.berth.dev/hold"]).await;
    c.cm("blocking", &[cm_ref(&owner, true)], &[]).await;
    c.cm("loose", &[cm_ref(&owner, false)], &[]).await;

    c.cms().delete("owner", &DeleteParams::default()).await.unwrap();
    let cms = c.cms();
    gone("the blocking dependent", || cms.get_opt("blocking")).await;
    gone("the non-blocking dependent", || cms.get_opt("loose")).await;
    let held = eventually("the held dependent to terminate", PATIENCE, || async {
        let cm = c.cms().get("held").await.map_err(|e| e.to_string())?;
        if cm.metadata.deletion_timestamp.is_some() { Ok(cm) } else { Err("not deleting".into()) }
    })
    .await;
    assert!(held.metadata.deletion_timestamp.is_some());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let o = c.cms().get("owner").await.unwrap();
    assert_eq!(o.metadata.finalizers.as_deref(), Some(&["foregroundDeletion".to_string()][..]));

    let release = json!({"metadata": {"finalizers": null}});
    c.cms().patch("held", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    gone("the foreground owner", || cms.get_opt("owner")).await;
}

#[tokio::test]
async fn a_foreground_delete_takes_dependents_with_dependents_in_the_foreground_too() {
    let mut c = Cluster::new().await;
    c.start_gc();
    let top = c.cm("top", &[], &[]).await;
    let mid = c.cm("mid", &[cm_ref(&top, true)], &[]).await;
    c.cm("leaf", &[cm_ref(&mid, true)], &["test.berth.dev/hold"]).await;
    c.cms().delete("top", &DeleteParams::foreground()).await.unwrap();
    // The leaf's finalizer holds mid (deleting in the foreground), which holds top.
    let leaf = eventually("the leaf to terminate", PATIENCE, || async {
        let cm = c.cms().get("leaf").await.map_err(|e| e.to_string())?;
        if cm.metadata.deletion_timestamp.is_some() { Ok(cm) } else { Err("not deleting".into()) }
    })
    .await;
    assert!(leaf.metadata.deletion_timestamp.is_some());
    let mid = c.cms().get("mid").await.unwrap();
    assert!(mid.metadata.finalizers.unwrap_or_default().contains(&"foregroundDeletion".to_string()));
    assert!(c.cms().get_opt("top").await.unwrap().is_some());
    let release = json!({"metadata": {"finalizers": null}});
    c.cms().patch("leaf", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    let cms = c.cms();
    gone("mid", || cms.get_opt("mid")).await;
    gone("top", || cms.get_opt("top")).await;
}

#[tokio::test]
async fn objects_owning_themselves_or_each_other_are_kept_and_a_cycle_goes_once_broken() {
    let mut c = Cluster::new().await;
    c.start_gc();
    let a = c.cm("a", &[], &[]).await;
    let b = c.cm("b", &[cm_ref(&a, true)], &[]).await;
    let patch = json!({"metadata": {"ownerReferences": [cm_ref(&b, true)]}});
    c.cms().patch("a", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let me = c.cm("me", &[], &[]).await;
    let patch = json!({"metadata": {"ownerReferences": [cm_ref(&me, true)]}});
    c.cms().patch("me", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();

    tokio::time::sleep(Duration::from_secs(1)).await;
    for name in ["a", "b", "me"] {
        assert!(c.cms().get_opt(name).await.unwrap().is_some(), "{name} was collected");
    }
    c.cms().delete("a", &DeleteParams::foreground()).await.unwrap();
    let cms = c.cms();
    gone("a", || cms.get_opt("a")).await;
    gone("b", || cms.get_opt("b")).await;
    c.cms().delete("me", &DeleteParams::foreground()).await.unwrap();
    gone("me", || cms.get_opt("me")).await;
}

// ---------------------------------------------------------------------------------------------
// Node lifecycle

fn tuning() -> Tuning {
    Tuning {
        node_startup_grace_period: Duration::from_secs(2),
        pod_gc_period: Duration::from_millis(100),
        pod_gc_quarantine: Duration::from_millis(500),
        ..Tuning::default()
    }
}

fn has_taint(node: &Node, key: &str, effect: &str) -> Option<Taint> {
    node.spec.as_ref()?.taints.as_ref()?.iter().find(|t| t.key == key && t.effect == effect).cloned()
}

fn ready(node: &Node) -> Option<String> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready").map(|c| c.status.clone())
}

/// Tolerations the DefaultTolerationSeconds admission counts as present but that tolerate
/// nothing: such a pod has no toleration that matches the node controller's taints.
fn matching_nothing() -> serde_json::Value {
    json!([
        {"key": "node.kubernetes.io/unreachable", "operator": "Equal", "value": "never", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Equal", "value": "never", "effect": "NoExecute"},
    ])
}

fn tolerating(seconds: Option<i64>) -> serde_json::Value {
    let mut t = json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"});
    if let Some(s) = seconds {
        t["tolerationSeconds"] = json!(s);
    }
    let not_ready = json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"});
    json!([t, not_ready])
}

async fn deleting(c: &Cluster, pod: &str) -> Option<jiff::Timestamp> {
    let p = c.pods().get_opt(pod).await.ok()??;
    let at = p.metadata.deletion_timestamp?.0;
    let grace = p.metadata.deletion_grace_period_seconds.unwrap_or(0);
    Some(at - jiff::SignedDuration::from_secs(grace))
}

#[tokio::test]
async fn a_silent_node_turns_unknown_is_tainted_and_its_pods_leave_as_their_tolerations_say() {
    let mut c = Cluster::new().await;
    c.node("alive", "True", Duration::ZERO).await;
    c.node("silent", "True", Duration::ZERO).await;
    c.keep_alive("alive");
    c.bound_pod("intolerant", "silent", matching_nothing()).await;
    c.bound_pod("two-seconds", "silent", tolerating(Some(2))).await;
    c.bound_pod("forever", "silent", tolerating(None)).await;
    c.bound_pod("elsewhere", "alive", matching_nothing()).await;
    let started = tokio::time::Instant::now();
    c.start_node_lifecycle(fast_config(), tuning());

    let node = eventually("the silent node to turn Unknown and get its NoExecute taint", PATIENCE, || async {
        let n = c.nodes().get("silent").await.map_err(|e| e.to_string())?;
        match (ready(&n).as_deref(), has_taint(&n, "node.kubernetes.io/unreachable", "NoExecute")) {
            (Some("Unknown"), Some(_)) => Ok(n),
            _ => Err(format!("{:?} {:?}", n.status, n.spec)),
        }
    })
    .await;
    assert!(started.elapsed() >= Duration::from_secs(2), "marked before its grace period: {:?}", started.elapsed());
    let conditions = node.status.unwrap().conditions.unwrap();
    for cond in &conditions {
        assert_eq!(cond.status, "Unknown", "{cond:?}");
        let posted = cond.type_ == "Ready" || cond.type_ == "MemoryPressure";
        let (reason, message) = if posted {
            ("NodeStatusUnknown", "Kubelet stopped posting node status.")
        } else {
            ("NodeStatusNeverUpdated", "Kubelet never posted node status.")
        };
        assert_eq!((cond.reason.as_deref(), cond.message.as_deref()), (Some(reason), Some(message)), "{cond:?}");
    }
    assert_eq!(conditions.len(), 4, "Ready, MemoryPressure, and DiskPressure and PIDPressure added");
    assert!(
        has_taint(&c.nodes().get("silent").await.unwrap(), "node.kubernetes.io/unreachable", "NoSchedule").is_some()
    );
    let taint =
        has_taint(&c.nodes().get("silent").await.unwrap(), "node.kubernetes.io/unreachable", "NoExecute").unwrap();
    let added = taint.time_added.expect("a NoExecute taint carries timeAdded").0;
    let alive = c.nodes().get("alive").await.unwrap();
    assert_eq!(ready(&alive).as_deref(), Some("True"));
    assert!(alive.spec.and_then(|s| s.taints).unwrap_or_default().is_empty());

    let evicted = eventually("the intolerant pod to be evicted", PATIENCE, || async {
        deleting(&c, "intolerant").await.ok_or_else(|| "not deleting".to_string())
    })
    .await;
    assert!(evicted >= added - jiff::SignedDuration::from_secs(1));
    let p = c.pods().get("intolerant").await.unwrap();
    let disruption = p.status.unwrap().conditions.unwrap().into_iter().find(|c| c.type_ == "DisruptionTarget").unwrap();
    assert_eq!(disruption.reason.as_deref(), Some("DeletionByTaintManager"));
    let two = eventually("the pod tolerating 2 s to be evicted", PATIENCE, || async {
        deleting(&c, "two-seconds").await.ok_or_else(|| "not deleting".to_string())
    })
    .await;
    let waited = two.duration_since(added);
    assert!(waited >= jiff::SignedDuration::from_secs(1), "evicted {waited} after the taint");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(deleting(&c, "forever").await.is_none(), "a pod tolerating for ever was evicted");
    assert!(deleting(&c, "elsewhere").await.is_none(), "a pod on the live node was evicted");

    let events: Api<Event> = Api::default_namespaced(c.client.clone());
    eventually("the eviction and node events", PATIENCE, || async {
        let list = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        let has = |reason: &str, message: &str| {
            list.items.iter().any(|e| e.reason.as_deref() == Some(reason) && e.message.as_deref() == Some(message))
        };
        if has("TaintManagerEviction", "Marking for deletion Pod default/intolerant")
            && has("NodeNotReady", "Node silent status is now: NodeNotReady")
        {
            Ok(())
        } else {
            Err(format!("{:?}", list.items.iter().map(|e| (&e.reason, &e.message)).collect::<Vec<_>>()))
        }
    })
    .await;

    // The agent is back: it reports Ready and renews its Lease; the taints go.
    c.keep_alive("silent");
    c.report("silent", "True", jiff::Timestamp::now()).await;
    eventually("the returning node to lose its taints", PATIENCE, || async {
        let n = c.nodes().get("silent").await.map_err(|e| e.to_string())?;
        let taints = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        if taints.is_empty() { Ok(()) } else { Err(format!("{taints:?}")) }
    })
    .await;
}

#[tokio::test]
async fn a_node_reporting_not_ready_is_tainted_not_ready() {
    let mut c = Cluster::new().await;
    c.node("alive", "True", Duration::ZERO).await;
    c.node("sick", "False", Duration::ZERO).await;
    c.keep_alive("alive");
    c.keep_alive("sick");
    c.start_node_lifecycle(fast_config(), tuning());
    eventually("the not-ready taints", PATIENCE, || async {
        let n = c.nodes().get("sick").await.map_err(|e| e.to_string())?;
        let no_schedule = has_taint(&n, "node.kubernetes.io/not-ready", "NoSchedule");
        let no_execute = has_taint(&n, "node.kubernetes.io/not-ready", "NoExecute");
        match (no_schedule, no_execute) {
            (Some(_), Some(t)) if t.time_added.is_some() => Ok(()),
            _ => Err(format!("{:?}", n.spec)),
        }
    })
    .await;
    // Its agent still reports: it is not marked Unknown.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let n = c.nodes().get("sick").await.unwrap();
    assert_eq!(ready(&n).as_deref(), Some("False"));
}

#[tokio::test]
async fn a_fresh_controller_gives_every_node_a_whole_grace_period() {
    let mut c = Cluster::new().await;
    // Its last heartbeat and renewal were an hour ago, and no controller was watching.
    c.node("old", "True", Duration::from_secs(3600)).await;
    let started = tokio::time::Instant::now();
    c.start_node_lifecycle(fast_config(), tuning());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(ready(&c.nodes().get("old").await.unwrap()).as_deref(), Some("True"));
    eventually("the node to turn Unknown after its grace period", PATIENCE, || async {
        let n = c.nodes().get("old").await.map_err(|e| e.to_string())?;
        if ready(&n).as_deref() == Some("Unknown") { Ok(()) } else { Err(format!("{:?}", n.status)) }
    })
    .await;
    assert!(started.elapsed() >= Duration::from_secs(2));
}

#[tokio::test]
async fn when_every_node_is_silent_none_is_tainted_no_execute_and_no_pod_is_evicted() {
    let mut c = Cluster::new().await;
    c.node("only", "True", Duration::ZERO).await;
    c.bound_pod("intolerant", "only", matching_nothing()).await;
    c.start_node_lifecycle(fast_config(), tuning());
    eventually("the node to turn Unknown", PATIENCE, || async {
        let n = c.nodes().get("only").await.map_err(|e| e.to_string())?;
        let unschedulable = has_taint(&n, "node.kubernetes.io/unreachable", "NoSchedule").is_some();
        if ready(&n).as_deref() == Some("Unknown") && unschedulable { Ok(()) } else { Err(format!("{n:?}")) }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let n = c.nodes().get("only").await.unwrap();
    assert!(has_taint(&n, "node.kubernetes.io/unreachable", "NoExecute").is_none());
    assert!(deleting(&c, "intolerant").await.is_none());
}

#[tokio::test]
async fn a_pod_bound_to_a_node_that_does_not_exist_is_deleted() {
    let mut c = Cluster::new().await;
    c.node("real", "True", Duration::ZERO).await;
    c.keep_alive("real");
    c.bound_pod("stranded", "ghost", tolerating(None)).await;
    c.bound_pod("fine", "real", tolerating(None)).await;
    c.start_node_lifecycle(fast_config(), tuning());
    let pods = c.pods();
    gone("the pod on the missing node", || pods.get_opt("stranded")).await;
    assert!(c.pods().get_opt("fine").await.unwrap().is_some());
}

// ---------------------------------------------------------------------------------------------
// Namespaces

#[tokio::test]
async fn a_deleted_namespace_is_emptied_then_removed() {
    let mut c = Cluster::new().await;
    c.start_namespace();
    let nss: Api<Namespace> = Api::all(c.client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "doomed");
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), "doomed");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "doomed");
    for i in 0..3 {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let s: Secret = serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap();
    secrets.create(&PostParams::default(), &s).await.unwrap();
    let p: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let keep: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "elsewhere"}})).unwrap();
    c.cms().create(&PostParams::default(), &keep).await.unwrap();

    nss.delete("doomed", &DeleteParams::default()).await.unwrap();
    gone("the namespace", || nss.get_opt("doomed")).await;
    assert!(cms.list(&ListParams::default()).await.unwrap().items.is_empty());
    assert!(secrets.list(&ListParams::default()).await.unwrap().items.is_empty());
    assert!(pods.list(&ListParams::default()).await.unwrap().items.is_empty());
    assert!(c.cms().get_opt("elsewhere").await.unwrap().is_some());
}

#[tokio::test]
async fn a_namespace_held_by_a_finalizer_says_so_and_goes_once_it_is_released() {
    let mut c = Cluster::new().await;
    c.start_namespace();
    let nss: Api<Namespace> = Api::all(c.client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "held"}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "held");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c", "finalizers": ["test.berth.dev/hold"]}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();

    nss.delete("held", &DeleteParams::default()).await.unwrap();
    let conditions = eventually("the namespace's deletion conditions", PATIENCE, || async {
        let n = nss.get("held").await.map_err(|e| e.to_string())?;
        let conditions = n.status.and_then(|s| s.conditions).unwrap_or_default();
        let remaining = conditions.iter().find(|c| c.type_ == "NamespaceFinalizersRemaining" && c.status == "True");
        if remaining.is_some() { Ok(conditions) } else { Err(format!("{conditions:?}")) }
    })
    .await;
    let by_type = |t: &str| conditions.iter().find(|c| c.type_ == t).unwrap();
    assert_eq!(
        by_type("NamespaceFinalizersRemaining").message.as_deref(),
        Some("Some content in the namespace has finalizers remaining: test.berth.dev/hold in 1 resource instances")
    );
    assert_eq!(
        by_type("NamespaceContentRemaining").message.as_deref(),
        Some("Some resources are remaining: configmaps. has 1 resource instances")
    );
    assert_eq!(by_type("NamespaceDeletionDiscoveryFailure").status, "False");

    let release = json!({"metadata": {"finalizers": null}});
    cms.patch("c", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    // Content held by finalizers is looked at again after upstream's 15 s estimate (halved).
    eventually("the namespace to go", Duration::from_secs(30), || async {
        match nss.get_opt("held").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}
