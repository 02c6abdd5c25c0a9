//! Several `berth server`s on one etcd: exactly one runs the controllers at a time (the Lease
//! kube-system/kube-controller-manager), so a Deployment scaled through either gets exactly its
//! replicas, also when the server holding the Lease is killed.
//!
//! Needs etcd (scripts/install-deps.sh) and kubectl.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Etcd, Server};

/// Whether this server's log says it took the controllers' Lease.
fn leads_controllers(server: &Server) -> bool {
    server.log().lines().any(|l| l.contains("acquired leadership") && l.contains("kube-system/kube-controller-manager"))
}

fn live_pods(server: &Server) -> Option<usize> {
    let out = server.kubectl(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={range .items[*]}{.metadata.deletionTimestamp}.{\"\\n\"}{end}",
    ]);
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).lines().filter(|l| *l == ".").count())
}

#[test]
fn two_servers_on_one_etcd_scale_a_deployment_to_exactly_twenty_pods_even_when_the_leader_dies() {
    let etcd = Etcd::start();
    let mut servers = [
        Server::start_with(&["--etcd-servers", &etcd.endpoint]),
        Server::start_with(&["--etcd-servers", &etcd.endpoint]),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        let leading: Vec<usize> = (0..2).filter(|&i| leads_controllers(&servers[i])).collect();
        if leading.len() == 1 {
            break leading[0];
        }
        assert!(leading.len() < 2, "both servers run the controllers");
        assert!(Instant::now() < deadline, "no server took the controllers' Lease");
        std::thread::sleep(Duration::from_millis(200));
    };
    let other = 1 - leader;
    let deployment = r#"{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}"#;
    let out = servers[other].apply(deployment);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Count the pods through the surviving server every 100 ms, across the kill.
    let most = Arc::new(Mutex::new(0usize));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (most, stop) = (most.clone(), stop.clone());
        let kubeconfig = servers[other].kubeconfig();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let out = std::process::Command::new("kubectl")
                    .env("KUBECONFIG", &kubeconfig)
                    .args([
                        "get",
                        "pods",
                        "-l",
                        "app=web",
                        "-o",
                        "jsonpath={range .items[*]}{.metadata.deletionTimestamp}.{\"\\n\"}{end}",
                    ])
                    .output();
                if let Some(out) = out.ok().filter(|o| o.status.success()) {
                    let live = String::from_utf8_lossy(&out.stdout).lines().filter(|l| *l == ".").count();
                    let mut m = most.lock().unwrap();
                    *m = (*m).max(live);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    servers[other].kubectl_ok(&["scale", "deployment", "web", "--replicas=20"]);
    std::thread::sleep(Duration::from_millis(300));
    servers[leader].kill9();

    let deadline = Instant::now() + Duration::from_secs(60);
    while live_pods(&servers[other]) != Some(20) {
        assert!(Instant::now() < deadline, "the deployment did not reach 20 pods:\n{}", servers[other].log());
        std::thread::sleep(Duration::from_millis(200));
    }
    // The survivor leads within the lease duration, and nothing more is made once it does.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !leads_controllers(&servers[other]) {
        assert!(Instant::now() < deadline, "the survivor did not take the controllers' Lease");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(5));
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    assert_eq!(live_pods(&servers[other]), Some(20), "exactly 20 pods");
    assert_eq!(*most.lock().unwrap(), 20, "never more than 20 pods at once");
    let ready =
        servers[other].kubectl_ok(&["get", "rs", "-l", "app=web", "-o", "jsonpath={.items[*].status.replicas}"]);
    assert_eq!(ready.trim(), "20", "one ReplicaSet with all 20");
}
