//! The host-gw routes against the kernel, in a network namespace of the test's own (needs root):
//! a veth pair on 192.0.2.0/24 stands for the nodes' shared network.

use std::net::{IpAddr, Ipv4Addr};

use berth_agent::network::routes::{self, Netlink, ROUTE_PROTOCOL, RouteTable, Router};
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Node;
use rtnetlink::{LinkUnspec, LinkVeth};
use serde_json::json;

fn node(name: &str, cidr: &str, ip: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }))
    .unwrap()
}

/// Runs `test` on a thread of its own in a fresh network namespace (only that thread moves).
fn in_new_netns(test: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare a network namespace (needs root)");
        test();
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e));
}

async fn shared_network(handle: &rtnetlink::Handle) {
    handle.link().add(LinkVeth::new("node0", "node0-peer").build()).execute().await.unwrap();
    for name in ["node0", "node0-peer"] {
        let link = handle.link().get().match_name(name).execute().try_next().await.unwrap().unwrap();
        handle.link().set(LinkUnspec::new_with_index(link.header.index).up().build()).execute().await.unwrap();
        if name == "node0" {
            let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
            handle.address().add(link.header.index, ip, 24).execute().await.unwrap();
        }
    }
}

#[test]
fn a_route_to_another_nodes_pods_is_installed_moved_and_removed_with_berths_protocol() {
    in_new_netns(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (connection, handle, _) = rtnetlink::new_connection().unwrap();
            tokio::spawn(connection);
            shared_network(&handle).await;
            let table = Netlink::connect().unwrap();
            let mut router = Router::new(table.clone());
            let dst = routes::Ipv4Net::parse("10.244.1.0/24").unwrap();
            let ours = |routes: Vec<routes::KernelRoute>| -> Vec<routes::KernelRoute> {
                routes.into_iter().filter(|r| r.berth).collect()
            };

            router.sync([&node("b", "10.244.1.0/24", "192.0.2.2")], "me", false).await;
            let installed = ours(table.routes().await.unwrap());
            assert_eq!(installed.len(), 1, "{installed:?}");
            assert_eq!((installed[0].dst, installed[0].gateway), (dst, Some(Ipv4Addr::new(192, 0, 2, 2))));

            router.sync([&node("b", "10.244.1.0/24", "192.0.2.3")], "me", false).await;
            let moved = ours(table.routes().await.unwrap());
            assert_eq!(moved.iter().map(|r| r.gateway).collect::<Vec<_>>(), [Some(Ipv4Addr::new(192, 0, 2, 3))]);

            // A node behind a router gets no route; the one that went is removed.
            router.sync([&node("c", "10.244.2.0/24", "198.51.100.7")], "me", false).await;
            assert!(ours(table.routes().await.unwrap()).is_empty());

            router.sync([&node("b", "10.244.1.0/24", "192.0.2.2")], "me", false).await;
            assert_eq!(routes::remove_all_routes().await.unwrap(), 1);
            let left = table.routes().await.unwrap();
            assert!(left.iter().all(|r| !r.berth), "{left:?}");
            assert!(
                left.iter().any(|r| r.dst == routes::Ipv4Net::parse("192.0.2.0/24").unwrap()),
                "others' routes stay"
            );
            assert_eq!(ROUTE_PROTOCOL, 148);
        });
    });
}
