//! With every controller on, 10,000 pods cost the server at most 200 MiB of RSS: the controllers
//! keep one shared, trimmed cache of pods, not one full copy each.
//!
//! The figures are printed (`--nocapture`). The bound is generous: the shared cache costs about
//! 80 MiB here, a full copy of every pod per controller over 300 MiB (20,000 pods: 162 against
//! 642 MiB). 10,000 pods keep the test to a minute or two in a debug build. Needs kubectl (for
//! the harness).

mod common;

use std::time::{Duration, Instant};

use common::Server;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, PostParams};

const PODS: usize = 10_000;
const MIB: u64 = 1024 * 1024;

fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/PID/status");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// RSS once it has stopped moving by more than 1 MiB a second (the caches have caught up).
fn settled_rss(pid: u32) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = rss(pid);
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let now = rss(pid);
        if now.abs_diff(last) <= 2 * MIB || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("p-{i:05}"), "labels": {"app": "many", "shard": (i % 10).to_string()}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"],
            "ports": [{"name": "http", "containerPort": 8080}]}]},
    }))
    .unwrap()
}

#[test]
fn ten_thousand_pods_cost_the_server_with_its_controllers_at_most_200_mib() {
    let server = Server::start_with(&["--no-scheduler", "--disable-admission-plugins=ServiceAccount"]);
    let pid = server.pid();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = rt.block_on(server.client());
    let before = settled_rss(pid);

    // Work for the controllers that read pods: a ReplicaSet that owns some, a Service that
    // selects a tenth of them.
    let rs: ReplicaSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "owner"},
        "spec": {"replicas": 200, "selector": {"matchLabels": {"app": "owned"}},
            "template": {"metadata": {"labels": {"app": "owned"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
    }))
    .unwrap();
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "shard-0"},
        "spec": {"selector": {"app": "many", "shard": "0"}, "ports": [{"port": 80, "targetPort": "http"}]},
    }))
    .unwrap();
    let started = Instant::now();
    rt.block_on(async {
        Api::<ReplicaSet>::default_namespaced(client.clone()).create(&PostParams::default(), &rs).await.unwrap();
        Api::<Service>::default_namespaced(client.clone()).create(&PostParams::default(), &svc).await.unwrap();
        let api: Api<Pod> = Api::default_namespaced(client.clone());
        futures::stream::iter((0..PODS).map(|i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &pod(i)).await.map(|_| ()) }
        }))
        .buffer_unordered(16)
        .for_each(|r| async { r.unwrap() })
        .await;
    });
    let after = settled_rss(pid);
    let owned = server.kubectl_ok(&["get", "pods", "-l", "app=owned", "-o", "name"]).lines().count();
    eprintln!(
        "created {PODS} pods in {:?}; server RSS before {} MiB, after {} MiB (+{} MiB); {owned} pods of the ReplicaSet",
        started.elapsed(),
        before / MIB,
        after / MIB,
        after.saturating_sub(before) / MIB
    );
    assert_eq!(owned, 200, "the ReplicaSet controller ran");
    assert!(after <= before + 200 * MIB, "{} MiB after {PODS} pods, {} MiB before", after / MIB, before / MIB);
}
