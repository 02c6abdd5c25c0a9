//! The agent's Node, end to end: a real `berth server`, real `berth runtime`s (runc, crun,
//! gvisor) and the real `berth agent` binary; registration, labels, addresses, node info,
//! runtime handlers, readiness per runtime (and partial readiness), the Lease, and endpoints
//! added and removed by editing the config file of a running agent.

mod common;

use std::time::Duration;

use common::{Agent, Runtime, RuntimeBuilder, Server, agent_toml, condition, eventually, runtime_handlers};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};

fn status_of(node: &Node, kind: &str) -> String {
    condition(node, kind).map(|c| c.status.clone()).unwrap_or_default()
}

/// The node once `Ready` has `status` and `check` holds.
async fn node_when(server: &Server, name: &str, what: &str, check: impl Fn(&Node) -> bool) -> Node {
    eventually(what, || async { server.node(name).await.filter(|n| check(n)) }).await
}

#[tokio::test]
async fn the_node_registers_with_kubelets_labels_addresses_node_info_and_usable_handlers() {
    let server = Server::start();
    // `broken`'s binary does not exist: the runtime leaves it out of Status, so the node does too.
    let runtime = Runtime::builder().handler("broken", "/nonexistent/runc", &[]).start();
    let _agent = Agent::start(&server, "node-a", &agent_toml(&[("berth", &runtime)], false));

    let node = node_when(&server, "node-a", "node-a Ready", |n| {
        status_of(n, "Ready") == "True" && status_of(n, "RuntimeReady.berth.dev/berth") == "True"
    })
    .await;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["kubernetes.io/hostname"], "node-a");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["beta.kubernetes.io/os"], "linux");
    let arch = if cfg!(target_arch = "x86_64") { "amd64" } else { "arm64" };
    assert_eq!(labels["kubernetes.io/arch"], arch);
    assert_eq!(labels["beta.kubernetes.io/arch"], arch);

    let status = node.status.clone().unwrap();
    let info = status.node_info.clone().unwrap();
    assert_eq!(info.container_runtime_version, "berth://0.1.0");
    assert!(info.kubelet_version.starts_with("v1.33.0"), "{}", info.kubelet_version);
    assert_eq!((info.operating_system.as_str(), info.architecture.as_str()), ("linux", arch));
    assert!(!info.boot_id.is_empty() && !info.kernel_version.is_empty() && !info.machine_id.is_empty());

    let addresses: Vec<(String, String)> =
        status.addresses.clone().unwrap().into_iter().map(|a| (a.type_, a.address)).collect();
    let internal = addresses.iter().find(|(t, _)| t == "InternalIP").expect("an InternalIP");
    let ip: std::net::Ipv4Addr = internal.1.parse().unwrap();
    assert!(!ip.is_loopback(), "{ip}");
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    assert!(addresses.contains(&("Hostname".into(), hostname)), "{addresses:?}");

    let port = status.daemon_endpoints.clone().unwrap().kubelet_endpoint.unwrap().port;
    assert_eq!(port, i32::from(_agent.port));
    let capacity = status.capacity.clone().unwrap();
    assert_eq!(capacity["pods"].0, "110");
    for key in ["cpu", "memory", "ephemeral-storage"] {
        assert!(capacity.contains_key(key), "capacity has {key}: {capacity:?}");
        assert!(status.allocatable.as_ref().unwrap().contains_key(key));
    }

    // "" is the runtime's default handler, listed as kubelet lists what the runtime reports.
    assert_eq!(runtime_handlers(&node), ["", "crun", "gvisor", "runc"]);
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
    let rt = condition(&node, "RuntimeReady.berth.dev/berth").unwrap();
    assert_eq!(rt.reason.as_deref(), Some("RuntimeReady"));
    for kind in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(status_of(&node, kind), "False", "{kind}");
    }
}

#[tokio::test]
async fn the_lease_is_held_by_the_node_and_renewed_every_ten_seconds() {
    let server = Server::start();
    let runtime = Runtime::start();
    let _agent = Agent::start(&server, "node-a", &agent_toml(&[("berth", &runtime)], false));
    let leases: kube::Api<Lease> = kube::Api::namespaced(server.client().await, "kube-node-lease");
    let node = node_when(&server, "node-a", "node-a registered", |_| true).await;

    let lease = eventually("the lease", || async { leases.get_opt("node-a").await.unwrap() }).await;
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let first = spec.renew_time.clone().expect("renewTime");
    let owner = &lease.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owner.iter().any(|o| o.kind == "Node" && o.name == "node-a" && Some(&o.uid) == node.metadata.uid.as_ref()),
        "owned by the Node: {owner:?}"
    );

    let renewed = common::eventually_within(Duration::from_secs(30), "a renewal", || async {
        let spec = leases.get("node-a").await.unwrap().spec.unwrap();
        spec.renew_time.filter(|t| t.0 > first.0)
    })
    .await;
    let gap = renewed.0.duration_since(first.0);
    assert!(gap.as_secs_f64() >= 5.0 && gap.as_secs_f64() <= 20.0, "renewed after {gap:?}");
}

#[tokio::test]
async fn a_stopped_runtime_makes_its_condition_and_the_node_not_ready_until_it_is_back() {
    let server = Server::start();
    let mut runtime = Runtime::start();
    let _agent = Agent::start(&server, "node-a", &agent_toml(&[("berth", &runtime)], false));
    node_when(&server, "node-a", "node-a Ready", |n| status_of(n, "Ready") == "True").await;

    runtime.stop();
    let node = node_when(&server, "node-a", "node-a not Ready", |n| status_of(n, "Ready") == "False").await;
    let rt = condition(&node, "RuntimeReady.berth.dev/berth").unwrap();
    assert_eq!(rt.status, "False");
    assert_eq!(rt.reason.as_deref(), Some("RuntimeUnreachable"));
    let message = rt.message.clone().unwrap_or_default();
    assert!(message.contains(&runtime.endpoint()), "names the socket: {message}");
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
    assert!(ready.message.as_deref().unwrap_or_default().contains("berth: RuntimeUnreachable"), "{ready:?}");
    assert!(runtime_handlers(&node).is_empty(), "no handler is usable: {:?}", runtime_handlers(&node));
    assert_eq!(
        node.status.as_ref().unwrap().node_info.as_ref().unwrap().container_runtime_version,
        "berth://0.1.0",
        "a runtime that is down is still listed"
    );
    let went_down = ready.last_transition_time.clone().unwrap();

    runtime.restart();
    let node = node_when(&server, "node-a", "node-a Ready again", |n| status_of(n, "Ready") == "True").await;
    assert_eq!(status_of(&node, "RuntimeReady.berth.dev/berth"), "True");
    assert!(condition(&node, "Ready").unwrap().last_transition_time.clone().unwrap().0 > went_down.0);
    assert_eq!(runtime_handlers(&node), ["", "crun", "gvisor", "runc"]);
}

#[tokio::test]
async fn with_partial_readiness_one_runtime_down_keeps_the_node_ready_with_fewer_handlers() {
    let server = Server::start();
    let berth = Runtime::start();
    let mut second = RuntimeBuilder::empty().handler("alt", "crun", &[]).start();
    let config = agent_toml(&[("berth", &berth), ("second", &second)], true);
    let _agent = Agent::start(&server, "node-a", &config);
    let node = node_when(&server, "node-a", "both runtimes ready", |n| {
        status_of(n, "RuntimeReady.berth.dev/second") == "True"
            && status_of(n, "RuntimeReady.berth.dev/berth") == "True"
    })
    .await;
    assert_eq!(runtime_handlers(&node), ["", "crun", "gvisor", "runc", "alt"]);
    assert_eq!(
        node.status.unwrap().node_info.unwrap().container_runtime_version,
        "berth://0.1.0, berth://0.1.0",
        "every runtime in configured order"
    );

    second.stop();
    let node =
        node_when(&server, "node-a", "second down", |n| status_of(n, "RuntimeReady.berth.dev/second") == "False").await;
    assert_eq!(status_of(&node, "Ready"), "True", "partial readiness keeps the node Ready");
    let message = condition(&node, "Ready").unwrap().message.clone().unwrap_or_default();
    assert!(message.contains("second: RuntimeUnreachable"), "{message}");
    assert_eq!(runtime_handlers(&node), ["", "crun", "gvisor", "runc"]);
}

#[tokio::test]
async fn without_partial_readiness_one_runtime_down_makes_the_node_not_ready() {
    let server = Server::start();
    let berth = Runtime::start();
    let mut second = RuntimeBuilder::empty().handler("alt", "crun", &[]).start();
    let _agent = Agent::start(&server, "node-a", &agent_toml(&[("berth", &berth), ("second", &second)], false));
    node_when(&server, "node-a", "node-a Ready", |n| status_of(n, "Ready") == "True").await;
    second.stop();
    let node = node_when(&server, "node-a", "node-a not Ready", |n| status_of(n, "Ready") == "False").await;
    assert_eq!(status_of(&node, "RuntimeReady.berth.dev/berth"), "True");
    assert_eq!(runtime_handlers(&node), ["", "crun", "gvisor", "runc"]);
}

#[tokio::test]
async fn endpoints_added_to_and_removed_from_the_config_file_change_the_handlers_without_a_restart() {
    let server = Server::start();
    let berth = Runtime::start();
    let second = RuntimeBuilder::empty().handler("alt", "crun", &[]).start();
    let mut agent = Agent::start(&server, "node-a", &agent_toml(&[("berth", &berth)], false));
    let pid = agent.pid();
    let node = node_when(&server, "node-a", "node-a Ready", |n| status_of(n, "Ready") == "True").await;
    assert_eq!(runtime_handlers(&node), ["", "crun", "gvisor", "runc"]);

    agent.write_config(&agent_toml(&[("berth", &berth), ("second", &second)], false));
    let node = node_when(&server, "node-a", "the second runtime's handler", |n| {
        runtime_handlers(n).contains(&"alt".to_string())
    })
    .await;
    assert_eq!(status_of(&node, "RuntimeReady.berth.dev/second"), "True");
    assert_eq!(
        node.status.as_ref().unwrap().node_info.as_ref().unwrap().container_runtime_version,
        "berth://0.1.0, berth://0.1.0"
    );

    agent.write_config(&agent_toml(&[("berth", &berth)], false));
    let node =
        node_when(&server, "node-a", "the second runtime gone", |n| !runtime_handlers(n).contains(&"alt".to_string()))
            .await;
    assert!(condition(&node, "RuntimeReady.berth.dev/second").is_none(), "its condition goes with it");
    assert_eq!(status_of(&node, "Ready"), "True");
    agent.check_alive();
    assert_eq!(agent.pid(), pid, "the same agent process");
}

#[tokio::test]
async fn an_endpoint_removed_from_the_config_takes_its_condition_off_the_node_and_others_conditions_stay() {
    let server = Server::start();
    let berth = Runtime::start();
    let second = RuntimeBuilder::empty().handler("alt", "crun", &[]).start();
    let agent = Agent::start(&server, "node-a", &agent_toml(&[("berth", &berth), ("second", &second)], false));
    node_when(&server, "node-a", "both runtimes ready", |n| {
        status_of(n, "RuntimeReady.berth.dev/berth") == "True"
            && status_of(n, "RuntimeReady.berth.dev/second") == "True"
            && runtime_handlers(n).contains(&"alt".to_string())
    })
    .await;
    // Another writer's condition, set after the agent last read the Node (as a network plugin
    // sets NetworkUnavailable): the agent's next report must not write over it.
    let nodes: kube::Api<Node> = kube::Api::all(server.client().await);
    let theirs = serde_json::json!({"status": {"conditions": [
        {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated", "message": "set by the test"}
    ]}});
    nodes.patch_status("node-a", &PatchParams::default(), &Patch::Strategic(&theirs)).await.unwrap();

    agent.write_config(&agent_toml(&[("berth", &berth)], false));
    let node = common::eventually_within(Duration::from_secs(10), "the second runtime's condition gone", || async {
        server.node("node-a").await.filter(|n| condition(n, "RuntimeReady.berth.dev/second").is_none())
    })
    .await;
    assert_eq!(runtime_handlers(&node), ["", "crun", "gvisor", "runc"], "alt left runtimeHandlers");
    let berth_condition = condition(&node, "RuntimeReady.berth.dev/berth").expect("the remaining runtime's condition");
    assert_eq!((berth_condition.status.as_str(), berth_condition.reason.as_deref()), ("True", Some("RuntimeReady")));
    assert_eq!(status_of(&node, "Ready"), "True");
    let network = condition(&node, "NetworkUnavailable").expect("the other writer's condition stays");
    assert_eq!((network.status.as_str(), network.reason.as_deref()), ("False", Some("RouteCreated")));

    // Later reports (heartbeats every 10 s) neither bring it back nor drop the other writer's.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let node = server.node("node-a").await.unwrap();
    assert!(condition(&node, "RuntimeReady.berth.dev/second").is_none());
    assert!(condition(&node, "NetworkUnavailable").is_some());
}

#[tokio::test]
async fn an_invalid_config_file_keeps_the_running_configuration_and_sighup_rereads_it() {
    let server = Server::start();
    let berth = Runtime::start();
    let second = RuntimeBuilder::empty().handler("alt", "crun", &[]).start();
    let good = agent_toml(&[("berth", &berth), ("second", &second)], false);
    let mut agent = Agent::start(&server, "node-a", &good);
    node_when(&server, "node-a", "both runtimes", |n| runtime_handlers(n).contains(&"alt".to_string())).await;

    // `default` is reserved: the whole file is refused, nothing of it applied.
    agent.write_config(&format!(
        "{}[[endpoints]]\nname = \"default\"\nendpoint = \"unix:///run/nothing.sock\"\n",
        agent_toml(&[("berth", &berth)], false)
    ));
    eventually("the error in the agent's log", || async {
        agent.log().contains("(name \"default\"): the endpoint name \"default\" is reserved").then_some(())
    })
    .await;
    agent.write_config("this is not toml");
    eventually("the parse error in the agent's log", || async {
        agent.log().contains("cannot parse config file").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let node = server.node("node-a").await.unwrap();
    assert!(runtime_handlers(&node).contains(&"alt".to_string()), "the running endpoints stay");
    assert_eq!(status_of(&node, "RuntimeReady.berth.dev/second"), "True");

    // The good file back, then SIGHUP: re-read though unchanged.
    agent.write_config(&good);
    eventually("the good file taken again", || async { agent.log().contains("nothing changed").then_some(()) }).await;
    let before = agent.log().matches("nothing changed").count();
    agent.signal("HUP");
    eventually("SIGHUP re-reading the file", || async {
        (agent.log().matches("nothing changed").count() > before).then_some(())
    })
    .await;
    agent.check_alive();
}

#[tokio::test]
async fn the_name_default_is_refused_on_the_command_line_naming_the_item() {
    let out = std::process::Command::new(common::berth_binary())
        .args([
            "agent",
            "--container-runtime-endpoint",
            "container:berth:unix:///run/a.sock;container:default:unix:///run/b.sock",
        ])
        .args(["--kubeconfig", "/nonexistent"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "--container-runtime-endpoint item \"container:default:unix:///run/b.sock\": the endpoint name \"default\" is reserved"
        ),
        "{stderr}"
    );
}
