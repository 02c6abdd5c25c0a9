//! The scheduler shell against the real API server in-process: binding, events and conditions,
//! RuntimeClass handlers, overhead and scheduling, taints, host ports, inter-pod anti-affinity,
//! topology spreading, scheduling gates, the failure message, and a restart.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{Cluster, NodeDef, PATIENCE, PodDef, create_class, create_standard_classes, eventually, node_name};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::PostParams;
use serde_json::json;

/// How long the acceptance allows between a node reporting a handler and the pod waiting for
/// it being bound.
const HANDLER_APPEARS_LIMIT: Duration = Duration::from_secs(2);

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_pod_is_bound_with_a_scheduled_condition_and_event() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("node-1").create(&cluster.client).await;
    cluster.start_scheduler();

    cluster.create_pod(PodDef::new("web")).await;
    let node = cluster.wait_bound("web").await;
    assert_eq!(node, "node-1");

    let pod = cluster.pods().get("web").await.unwrap();
    let condition = common::scheduled_condition(&pod).expect("a PodScheduled condition");
    assert_eq!(condition.status, "True");
    let event = cluster.wait_event("web", "Scheduled", "Successfully assigned default/web to node-1").await;
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert_eq!(event.source.as_ref().and_then(|s| s.component.as_deref()), Some("default-scheduler"));
    assert_eq!(event.involved_object.uid, pod.metadata.uid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_for_another_scheduler_is_left_alone() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("node-1").create(&cluster.client).await;
    cluster.start_scheduler();

    cluster.create_pod(PodDef::new("theirs").spec("schedulerName", json!("other"))).await;
    // A pod of ours created after it: once it is bound, the scheduler has seen both.
    cluster.create_pod(PodDef::new("ours")).await;
    cluster.wait_bound("ours").await;
    cluster.assert_stays_unbound("theirs", Duration::from_millis(500)).await;

    let pod = cluster.pods().get("theirs").await.unwrap();
    assert_eq!(common::scheduled_condition(&pod), None, "{}", common::describe(&pod));
    assert!(cluster.events("theirs").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_runtime_class_was_deleted_waits_for_the_class_to_return() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("node-1").create(&cluster.client).await;
    create_standard_classes(&cluster.client).await;
    // Admitted while the class exists, then the class goes before any scheduler sees the pod.
    cluster.create_pod(PodDef::new("sandboxed").class("gvisor")).await;
    cluster.classes().delete("gvisor", &Default::default()).await.unwrap();
    cluster.start_scheduler();

    cluster.wait_unschedulable("sandboxed", "RuntimeClass \"gvisor\" not found").await;
    cluster.wait_event("sandboxed", "FailedScheduling", "RuntimeClass \"gvisor\" not found").await;

    create_class(&cluster.client, json!({"metadata": {"name": "gvisor"}, "handler": "runsc"})).await;
    assert_eq!(cluster.wait_bound("sandboxed").await, "node-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_a_node_that_runs_its_handler_and_is_bound_within_two_seconds_of_it() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("node-1").handlers(&["runc"]).create(&cluster.client).await;
    NodeDef::new("node-2").handlers(&["runc"]).create(&cluster.client).await;
    create_standard_classes(&cluster.client).await;
    cluster.start_scheduler();

    cluster.create_pod(PodDef::new("sandboxed").class("gvisor")).await;
    let message = "0/2 nodes are available: 2 node(s) didn't support RuntimeClass \"gvisor\".";
    let event = cluster.wait_event("sandboxed", "FailedScheduling", message).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.source.as_ref().and_then(|s| s.component.as_deref()), Some("default-scheduler"));
    cluster.wait_unschedulable("sandboxed", message).await;

    cluster.set_runtime_handlers("node-2", &["runc", "runsc"]).await;
    let node = eventually("the pod to be bound", HANDLER_APPEARS_LIMIT, || async {
        let pod = cluster.pods().get("sandboxed").await.unwrap();
        node_name(&pod).map(str::to_string).ok_or_else(|| common::describe(&pod))
    })
    .await;
    assert_eq!(node, "node-2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_drops_runsc_takes_no_new_gvisor_pods_but_still_takes_runc_pods() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("node-a").create(&cluster.client).await;
    NodeDef::new("node-b").create(&cluster.client).await;
    create_standard_classes(&cluster.client).await;
    cluster.start_scheduler();

    // Before: gVisor pods may go to either node.
    cluster.create_pod(PodDef::new("before").class("gvisor").node_selector("kubernetes.io/hostname", "node-b")).await;
    assert_eq!(cluster.wait_bound("before").await, "node-b");

    cluster.set_runtime_handlers("node-b", &["runc"]).await;
    // A gVisor pod that may only go to node-b shows when the scheduler has seen the change.
    cluster.create_pod(PodDef::new("probe").class("gvisor").node_selector("kubernetes.io/hostname", "node-b")).await;
    cluster
        .wait_unschedulable(
            "probe",
            "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
             1 node(s) didn't support RuntimeClass \"gvisor\".",
        )
        .await;

    let sandboxed = names("gvisor", 6);
    for name in &sandboxed {
        cluster.create_pod(PodDef::new(name).class("gvisor")).await;
    }
    for (pod, node) in cluster.wait_all_bound(&sandboxed).await {
        assert_eq!(node, "node-a", "{pod} must avoid the node without runsc");
    }
    cluster.create_pod(PodDef::new("runc").class("runc").node_selector("kubernetes.io/hostname", "node-b")).await;
    cluster.create_pod(PodDef::new("classless").node_selector("kubernetes.io/hostname", "node-b")).await;
    assert_eq!(cluster.wait_bound("runc").await, "node-b");
    assert_eq!(cluster.wait_bound("classless").await, "node-b");
    // The gVisor pod placed before the change stays where it is; the probe still waits.
    assert_eq!(node_name(&cluster.pods().get("before").await.unwrap()), Some("node-b"));
    assert_eq!(node_name(&cluster.pods().get("probe").await.unwrap()), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_class_overhead_counts_against_the_nodes_resources() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("node-1").cpu("1").create(&cluster.client).await;
    create_class(&cluster.client, json!({"metadata": {"name": "runc"}, "handler": "runc"})).await;
    create_class(
        &cluster.client,
        json!({"metadata": {"name": "gvisor"}, "handler": "runsc", "overhead": {"podFixed": {"cpu": "250m"}}}),
    )
    .await;
    cluster.start_scheduler();

    // 900m fits into 1 cpu, 900m + 250m does not.
    let pod = cluster.create_pod(PodDef::new("sandboxed").class("gvisor").requests("900m", "64Mi")).await;
    let overhead = pod.spec.as_ref().and_then(|s| s.overhead.clone()).expect("admission sets the overhead");
    assert_eq!(overhead.get("cpu"), Some(&Quantity("250m".into())));
    let pod = cluster.wait_unschedulable_where("sandboxed", |m| m.contains("Insufficient cpu")).await;
    let message = common::scheduled_condition(&pod).unwrap().message.clone().unwrap();
    assert_eq!(message, "0/1 nodes are available: 1 Insufficient cpu.");

    cluster.create_pod(PodDef::new("plain").class("runc").requests("900m", "64Mi")).await;
    assert_eq!(cluster.wait_bound("plain").await, "node-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_tolerating_a_tainted_node_sends_its_pods_there_and_only_them() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("sandbox-node")
        .label("sandbox", "true")
        .taint("sandbox", "true", "NoSchedule")
        .create(&cluster.client)
        .await;
    NodeDef::new("general").create(&cluster.client).await;
    create_class(&cluster.client, json!({"metadata": {"name": "runc"}, "handler": "runc"})).await;
    create_class(
        &cluster.client,
        json!({"metadata": {"name": "gvisor"}, "handler": "runsc", "scheduling": {
            "nodeSelector": {"sandbox": "true"},
            "tolerations": [{"key": "sandbox", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        }}),
    )
    .await;
    cluster.start_scheduler();

    let sandboxed = names("gvisor", 4);
    let plain = names("plain", 4);
    for name in &sandboxed {
        cluster.create_pod(PodDef::new(name).class("gvisor")).await;
    }
    for name in &plain {
        cluster.create_pod(PodDef::new(name)).await;
    }
    for (pod, node) in cluster.wait_all_bound(&sandboxed).await {
        assert_eq!(node, "sandbox-node", "{pod}");
    }
    for (pod, node) in cluster.wait_all_bound(&plain).await {
        assert_eq!(node, "general", "{pod}");
    }

    // Without the class's toleration the tainted node refuses a pod that asks for it.
    cluster.create_pod(PodDef::new("intruder").node_selector("sandbox", "true")).await;
    let pod = cluster.wait_unschedulable_where("intruder", |m| m.contains("node(s) had untolerated taint")).await;
    assert_eq!(
        common::scheduled_condition(&pod).unwrap().message.as_deref(),
        Some(
            "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
             1 node(s) had untolerated taint {sandbox: true}."
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_pod_on_the_same_host_port_waits_until_the_first_is_deleted() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("node-1").create(&cluster.client).await;
    cluster.start_scheduler();

    cluster.create_pod(PodDef::new("first").host_port(8080)).await;
    assert_eq!(cluster.wait_bound("first").await, "node-1");
    cluster.create_pod(PodDef::new("second").host_port(8080)).await;
    let message = "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports.";
    cluster.wait_unschedulable("second", message).await;
    cluster.wait_event("second", "FailedScheduling", message).await;

    cluster.delete_pod_now("first").await;
    assert_eq!(cluster.wait_bound("second").await, "node-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_anti_affinity_spreads_replicas_over_nodes_and_refuses_a_fourth() {
    let mut cluster = Cluster::new().await;
    for name in ["node-1", "node-2", "node-3"] {
        NodeDef::new(name).create(&cluster.client).await;
    }
    cluster.start_scheduler();

    let anti_affinity = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"app": "web"}},
        "topologyKey": "kubernetes.io/hostname",
    }]}});
    let replica = |name: &str| PodDef::new(name).label("app", "web").spec("affinity", anti_affinity.clone());
    let replicas = names("web", 3);
    for name in &replicas {
        cluster.create_pod(replica(name)).await;
    }
    let placed: BTreeSet<String> = cluster.wait_all_bound(&replicas).await.into_values().collect();
    assert_eq!(placed.len(), 3, "three replicas on three distinct nodes: {placed:?}");

    cluster.create_pod(replica("web-3")).await;
    let pod = cluster.wait_unschedulable_where("web-3", |m| m.contains("didn't match pod anti-affinity rules")).await;
    assert_eq!(
        common::scheduled_condition(&pod).unwrap().message.as_deref(),
        Some("0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_spread_puts_two_pods_in_each_zone_even_when_one_zone_is_much_bigger() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("big-a").zone("zone-a").cpu("64").memory("256Gi").create(&cluster.client).await;
    NodeDef::new("small-b").zone("zone-b").cpu("2").memory("4Gi").create(&cluster.client).await;
    cluster.start_scheduler();

    let spread = json!([{
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "spread"}},
    }]);
    let pods = names("spread", 4);
    for name in &pods {
        let pod = PodDef::new(name)
            .label("app", "spread")
            .requests("250m", "256Mi")
            .spec("topologySpreadConstraints", spread.clone());
        cluster.create_pod(pod).await;
    }
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for node in cluster.wait_all_bound(&pods).await.into_values() {
        *per_node.entry(node).or_default() += 1;
    }
    assert_eq!(per_node, BTreeMap::from([("big-a".to_string(), 2), ("small-b".to_string(), 2)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_pod_is_not_scheduled_until_its_gates_are_removed() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("node-1").create(&cluster.client).await;
    cluster.start_scheduler();

    cluster.create_pod(PodDef::new("gated").spec("schedulingGates", json!([{"name": "example.com/wait"}]))).await;
    // A pod created after it is bound, so the scheduler has seen the gated one.
    cluster.create_pod(PodDef::new("ungated")).await;
    cluster.wait_bound("ungated").await;
    cluster.assert_stays_unbound("gated", Duration::from_millis(1500)).await;
    let mut pod = cluster.pods().get("gated").await.unwrap();
    let condition = common::scheduled_condition(&pod).expect("a PodScheduled condition");
    assert_eq!((condition.status.as_str(), condition.reason.as_deref()), ("False", Some("SchedulingGated")));
    assert!(cluster.events("gated").await.is_empty(), "a gated pod is never tried");

    pod.spec.as_mut().unwrap().scheduling_gates = None;
    cluster.pods().replace("gated", &PostParams::default(), &pod).await.unwrap();
    assert_eq!(cluster.wait_bound("gated").await, "node-1");
    let pod = cluster.pods().get("gated").await.unwrap();
    assert_eq!(common::scheduled_condition(&pod).map(|c| c.status.as_str()), Some("True"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failure_message_counts_nodes_per_reason_in_kubernetes_order() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("small-gvisor").memory("1Gi").create(&cluster.client).await;
    NodeDef::new("runc-1").handlers(&["runc"]).create(&cluster.client).await;
    NodeDef::new("runc-2").handlers(&["runc"]).create(&cluster.client).await;
    create_standard_classes(&cluster.client).await;
    cluster.start_scheduler();

    cluster.create_pod(PodDef::new("sandboxed").class("gvisor").requests("100m", "2Gi")).await;
    let message = "0/3 nodes are available: 1 Insufficient memory, 2 node(s) didn't support RuntimeClass \"gvisor\".";
    cluster.wait_unschedulable("sandboxed", message).await;
    cluster.wait_event("sandboxed", "FailedScheduling", message).await;

    // Nothing changed in the cluster, so the pod is not tried again (its own status write and
    // event do not count as a change).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failures: Vec<_> = cluster
        .events("sandboxed")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
        .map(|e| e.count)
        .collect();
    assert_eq!(failures, vec![Some(1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_scheduler_does_not_write_again_the_unschedulable_condition_a_pod_has() {
    let mut cluster = Cluster::new().await;
    NodeDef::new("node-1").cpu("1").create(&cluster.client).await;
    cluster.start_scheduler();
    cluster.create_pod(PodDef::new("too-big").requests("4", "64Mi")).await;
    let message = "0/1 nodes are available: 1 Insufficient cpu.";
    cluster.wait_unschedulable("too-big", message).await;
    let written = cluster.pods().get("too-big").await.unwrap().metadata.resource_version;

    cluster.stop_scheduler().await;
    cluster.start_scheduler();
    // The new scheduler tries the pod (its event says so) and finds the same reason.
    eventually("a FailedScheduling event from the new scheduler", PATIENCE, || async {
        let count: i32 = cluster
            .events("too-big")
            .await
            .iter()
            .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
            .filter_map(|e| e.count)
            .sum();
        if count >= 2 { Ok(()) } else { Err(format!("{count} FailedScheduling events")) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pod = cluster.pods().get("too-big").await.unwrap();
    assert_eq!(pod.metadata.resource_version, written, "the pod was written again");
    assert_eq!(common::scheduled_condition(&pod).and_then(|c| c.message.clone()).as_deref(), Some(message));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_scheduler_counts_the_pods_already_bound() {
    let mut cluster = Cluster::new().await;
    // Room for two pods of 400m.
    NodeDef::new("node-1").cpu("1").create(&cluster.client).await;
    cluster.start_scheduler();
    cluster.create_pod(PodDef::new("before").requests("400m", "64Mi")).await;
    assert_eq!(cluster.wait_bound("before").await, "node-1");

    cluster.stop_scheduler().await;
    // Both wait while no scheduler runs; the new one must see "before" before deciding.
    cluster.create_pod(PodDef::new("after-1").requests("400m", "64Mi")).await;
    cluster.create_pod(PodDef::new("after-2").requests("400m", "64Mi")).await;
    cluster.assert_stays_unbound("after-1", Duration::from_millis(200)).await;
    cluster.start_scheduler();

    let outcome = eventually("one pod bound and the other refused", PATIENCE, || async {
        let mut bound = Vec::new();
        let mut refused = Vec::new();
        for name in ["after-1", "after-2"] {
            let pod = cluster.pods().get(name).await.unwrap();
            let condition = common::scheduled_condition(&pod);
            if node_name(&pod).is_some() {
                bound.push(name);
            } else if condition.is_some_and(|c| c.reason.as_deref() == Some("Unschedulable")) {
                refused.push((name, condition.unwrap().message.clone().unwrap_or_default()));
            }
        }
        match (bound.len(), refused.len()) {
            (2, _) => panic!("both pods were bound: the node is overfilled"),
            (1, 1) => Ok((bound, refused)),
            _ => Err(format!("bound {bound:?}, refused {refused:?}")),
        }
    })
    .await;
    let (_, refused) = outcome;
    assert_eq!(refused[0].1, "0/1 nodes are available: 1 Insufficient cpu.");
    // And it stays that way: the node is not overfilled later either.
    cluster.assert_stays_unbound(refused[0].0, Duration::from_millis(1500)).await;
}
