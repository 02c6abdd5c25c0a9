//! A list of 20,000 pods, as JSON, as a Table and as protobuf, costs the server at most 64 MiB
//! above its level before at its peak, and the memory goes back to the OS within 10 s.
//!
//! Memory, unlike time, is not noisy: the figures are asserted. Needs kubectl (for the harness).

mod common;

use std::time::{Duration, Instant};

use common::Server;
use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

const PODS: usize = 20_000;
const MIB: u64 = 1024 * 1024;

/// A field of /proc/PID/status, in bytes.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

fn rss(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// Peak RSS since the last [`reset_peak`].
fn peak(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("p-{i:05}"), "labels": {"app": "many", "shard": (i % 10).to_string()}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]},
    }))
    .unwrap()
}

/// Sends `accept`'s list of every pod and reads the whole answer; returns its size in bytes.
async fn list(client: &kube::Client, accept: &str) -> usize {
    let req = http::Request::get("/api/v1/pods").header("accept", accept).body(Vec::new()).unwrap();
    let resp = client.send(req.map(kube::client::Body::from)).await.unwrap();
    assert!(resp.status().is_success(), "{accept}: {}", resp.status());
    let mut body = resp.into_body();
    let mut size = 0;
    while let Some(frame) = body.frame().await {
        size += frame.unwrap().into_data().map_or(0, |d| d.len());
    }
    size
}

#[test]
fn a_list_of_twenty_thousand_pods_costs_the_server_at_most_64_mib_and_is_given_back() {
    // Only the API: the controllers' caches of every pod are not what this measures.
    let server =
        Server::start_with(&["--no-scheduler", "--controllers=nodeipam", "--disable-admission-plugins=ServiceAccount"]);
    let pid = server.pid();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = rt.block_on(server.client());
    let api: Api<Pod> = Api::default_namespaced(client.clone());
    let started = Instant::now();
    rt.block_on(async {
        futures::stream::iter((0..PODS).map(|i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &pod(i)).await.map(|_| ()) }
        }))
        .buffer_unordered(8)
        .for_each(|r| async { r.unwrap() })
        .await;
    });
    eprintln!("created {PODS} pods in {:?}; server RSS {} MiB", started.elapsed(), rss(pid) / MIB);

    for accept in [
        "application/json",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        "application/vnd.kubernetes.protobuf",
    ] {
        std::thread::sleep(Duration::from_secs(1));
        let before = rss(pid);
        reset_peak(pid);
        let listed = Instant::now();
        let size = rt.block_on(list(&client, accept));
        let took = listed.elapsed();
        let top = peak(pid);
        std::thread::sleep(Duration::from_secs(10));
        let after = rss(pid);
        eprintln!(
            "{accept}: {} MiB answered in {took:?}; RSS before {} MiB, peak {} MiB (+{} MiB), 10 s later {} MiB",
            size as u64 / MIB,
            before / MIB,
            top / MIB,
            top.saturating_sub(before) / MIB,
            after / MIB
        );
        assert!(size as u64 > 4 * MIB, "{accept}: only {size} bytes for {PODS} pods");
        assert!(top <= before + 64 * MIB, "{accept}: peak {} MiB over {} MiB before", top / MIB, before / MIB);
        assert!(after * 10 <= before * 11, "{accept}: {} MiB 10 s later, {} MiB before", after / MIB, before / MIB);
    }
}
