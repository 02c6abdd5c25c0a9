//! Services through the `kube` crate, in-process: defaulting, cluster IP and node port
//! allocation from the store, release on delete and type change, restarts, two API servers on
//! one store, the `default/kubernetes` Service, and the Endpoints and EndpointSlice kinds.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use berth_apiserver::admission::Admission;
use berth_apiserver::services::{self, IpRange, PortRange, ServiceNetwork};
use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::Store;
use berth_store::sqlite::SqliteStore;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn network(cidr: &str) -> ServiceNetwork {
    ServiceNetwork {
        cluster_ip_range: IpRange::parse(cidr).unwrap(),
        node_port_range: PortRange::parse("30000-30004").unwrap(),
    }
}

async fn state_on(store: Arc<dyn Store>, net: ServiceNetwork) -> Arc<ApiState> {
    let state = ApiState::with_services(store, None, Admission::default(), net);
    lifecycle::bootstrap(&state).await.unwrap();
    services::ensure_kubernetes_service(&state, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10)), 6443).await.unwrap();
    services::spawn_repair(&state);
    state
}

async fn setup_with(cidr: &str) -> (Api<Service>, Arc<ApiState>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("state.db")).unwrap());
    let state = state_on(store, network(cidr)).await;
    let client = kube::Client::new(router(state.clone()), "default");
    (Api::default_namespaced(client), state, dir)
}

async fn setup() -> (Api<Service>, Arc<ApiState>, tempfile::TempDir) {
    setup_with("10.96.0.0/12").await
}

fn svc(v: serde_json::Value) -> Service {
    serde_json::from_value(v).unwrap()
}

fn cluster_ip_service(name: &str, ip: Option<&str>) -> Service {
    let mut spec = json!({"selector": {"app": name}, "ports": [{"port": 80}]});
    if let Some(ip) = ip {
        spec["clusterIP"] = json!(ip);
    }
    svc(json!({"metadata": {"name": name}, "spec": spec}))
}

fn message(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("expected an API error, got {other}"),
    }
}

/// Creates `s`, retrying until it succeeds or five seconds pass (release happens on a watch).
async fn create_eventually(services: &Api<Service>, s: &Service) -> Service {
    let mut last = None;
    for _ in 0..100 {
        match services.create(&PostParams::default(), s).await {
            Ok(v) => return v,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never created: {:?}", last.unwrap());
}

#[tokio::test]
async fn a_service_gets_a_cluster_ip_from_the_range_and_kube_apiserver_defaults() {
    let (services, _s, _d) = setup().await;
    let s = services.create(&PostParams::default(), &cluster_ip_service("web", None)).await.unwrap();
    let spec = s.spec.unwrap();
    let ip: Ipv4Addr = spec.cluster_ip.as_deref().unwrap().parse().unwrap();
    assert!(IpRange::parse("10.96.0.0/12").unwrap().contains(ip), "{ip}");
    assert_ne!(ip, Ipv4Addr::new(10, 96, 0, 1), "the first address is the kubernetes Service's");
    assert_eq!(spec.cluster_ips, Some(vec![ip.to_string()]));
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(spec.session_affinity.as_deref(), Some("None"));
    assert_eq!(spec.ip_families, Some(vec!["IPv4".to_string()]));
    assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
    assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Cluster"));
    let port = &spec.ports.unwrap()[0];
    assert_eq!(port.protocol.as_deref(), Some("TCP"));
    assert_eq!(port.target_port, Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(80)));
    let listed = services.list(&Default::default()).await.unwrap();
    assert!(listed.items.iter().any(|s| s.metadata.name.as_deref() == Some("web")));
}

#[tokio::test]
async fn a_requested_cluster_ip_is_honoured_once_and_then_refused_as_already_allocated() {
    let (services, _s, _d) = setup().await;
    let a = services.create(&PostParams::default(), &cluster_ip_service("a", Some("10.96.0.10"))).await.unwrap();
    assert_eq!(a.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.10"));
    let err = services.create(&PostParams::default(), &cluster_ip_service("b", Some("10.96.0.10"))).await.unwrap_err();
    assert_eq!(
        message(err),
        (
            422,
            "Service \"b\" is invalid: spec.clusterIPs: Invalid value: []string{\"10.96.0.10\"}: failed to allocate IP 10.96.0.10: provided IP is already allocated".to_string()
        )
    );
}

#[tokio::test]
async fn an_address_outside_the_range_is_refused_naming_the_range() {
    let (services, _s, _d) = setup().await;
    let err = services.create(&PostParams::default(), &cluster_ip_service("a", Some("10.0.0.1"))).await.unwrap_err();
    let (code, msg) = message(err);
    assert_eq!(code, 422);
    assert!(
        msg.ends_with("failed to allocate IP 10.0.0.1: the provided IP (10.0.0.1) is not in the valid range. The range of valid IPs is 10.96.0.0/12"),
        "{msg}"
    );
}

#[tokio::test]
async fn invalid_services_are_refused_with_kubernetes_messages() {
    let (services, _s, _d) = setup().await;
    let no_ports = svc(json!({"metadata": {"name": "a"}, "spec": {"selector": {"app": "a"}}}));
    let err = services.create(&PostParams::default(), &no_ports).await.unwrap_err();
    assert_eq!(message(err), (422, "Service \"a\" is invalid: spec.ports: Required value".to_string()));
    let external = svc(json!({"metadata": {"name": "e"}, "spec": {"type": "ExternalName"}}));
    let err = services.create(&PostParams::default(), &external).await.unwrap_err();
    assert_eq!(message(err).1, "Service \"e\" is invalid: spec.externalName: Required value");
}

#[tokio::test]
async fn headless_and_external_name_services_get_no_address() {
    let (services, _s, _d) = setup().await;
    let h = services.create(&PostParams::default(), &cluster_ip_service("h", Some("None"))).await.unwrap();
    assert_eq!(h.spec.unwrap().cluster_ip.as_deref(), Some("None"));
    let e = svc(json!({"metadata": {"name": "e"}, "spec": {"type": "ExternalName", "externalName": "example.com"}}));
    let e = services.create(&PostParams::default(), &e).await.unwrap();
    let spec = e.spec.unwrap();
    assert_eq!((spec.cluster_ip, spec.ip_families), (None, None));
}

#[tokio::test]
async fn deleting_a_service_releases_its_address_for_another() {
    let (services, _s, _d) = setup().await;
    services.create(&PostParams::default(), &cluster_ip_service("a", Some("10.96.0.20"))).await.unwrap();
    services.delete("a", &DeleteParams::default()).await.unwrap();
    let b = create_eventually(&services, &cluster_ip_service("b", Some("10.96.0.20"))).await;
    assert_eq!(b.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.20"));
}

#[tokio::test]
async fn the_cluster_ip_may_not_change_and_an_update_that_omits_it_keeps_it() {
    let (services, _s, _d) = setup().await;
    let created = services.create(&PostParams::default(), &cluster_ip_service("a", Some("10.96.0.30"))).await.unwrap();
    let mut changed = created.clone();
    changed.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.31".into());
    changed.spec.as_mut().unwrap().cluster_ips = Some(vec!["10.96.0.31".into()]);
    let err = services.replace("a", &PostParams::default(), &changed).await.unwrap_err();
    assert_eq!(
        message(err).1,
        "Service \"a\" is invalid: spec.clusterIPs[0]: Invalid value: []string{\"10.96.0.31\"}: may not change once set"
    );
    let mut omitted = cluster_ip_service("a", None);
    omitted.metadata.resource_version = created.metadata.resource_version.clone();
    let replaced = services.replace("a", &PostParams::default(), &omitted).await.unwrap();
    assert_eq!(replaced.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.30"));
}

#[tokio::test]
async fn node_ports_are_allocated_in_range_and_a_taken_one_is_refused() {
    let (services, _s, _d) = setup().await;
    let np = |name: &str, port: Option<i32>| {
        let mut p = json!({"port": 80});
        if let Some(port) = port {
            p["nodePort"] = json!(port);
        }
        svc(json!({"metadata": {"name": name}, "spec": {"type": "NodePort", "ports": [p]}}))
    };
    let a = services.create(&PostParams::default(), &np("a", None)).await.unwrap();
    let spec = a.spec.unwrap();
    let port = spec.ports.unwrap()[0].node_port.unwrap();
    assert!((30000..=30004).contains(&port), "{port}");
    assert_eq!(spec.external_traffic_policy.as_deref(), Some("Cluster"));
    let err = services.create(&PostParams::default(), &np("b", Some(port))).await.unwrap_err();
    assert_eq!(
        message(err).1,
        format!(
            "Service \"b\" is invalid: spec.ports[0].nodePort: Invalid value: {port}: provided port is already allocated"
        )
    );
    let err = services.create(&PostParams::default(), &np("c", Some(80))).await.unwrap_err();
    assert_eq!(
        message(err).1,
        "Service \"c\" is invalid: spec.ports[0].nodePort: Invalid value: 80: provided port is not in the valid range. The range of valid ports is 30000-30004"
    );
}

#[tokio::test]
async fn changing_the_type_to_cluster_ip_releases_the_node_port() {
    let (services, _s, _d) = setup().await;
    let a = svc(
        json!({"metadata": {"name": "a"}, "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30002}]}}),
    );
    services.create(&PostParams::default(), &a).await.unwrap();
    let patch = json!({"spec": {"type": "ClusterIP"}});
    let patched = services.patch("a", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let spec = patched.spec.unwrap();
    assert_eq!(spec.ports.unwrap()[0].node_port, None);
    assert_eq!(spec.external_traffic_policy, None);
    let b = svc(
        json!({"metadata": {"name": "b"}, "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30002}]}}),
    );
    create_eventually(&services, &b).await;
}

#[tokio::test]
async fn an_exhausted_range_answers_range_is_full_and_a_release_frees_an_address() {
    // A /29 has six usable addresses; the first is the kubernetes Service's.
    let (services, _s, _d) = setup_with("10.0.0.0/29").await;
    for i in 0..5 {
        services.create(&PostParams::default(), &cluster_ip_service(&format!("s{i}"), None)).await.unwrap();
    }
    let err = services.create(&PostParams::default(), &cluster_ip_service("full", None)).await.unwrap_err();
    assert_eq!(
        message(err),
        (500, "Internal error occurred: failed to allocate a serviceIP: range is full".to_string())
    );
    services.delete("s3", &DeleteParams::default()).await.unwrap();
    create_eventually(&services, &cluster_ip_service("again", None)).await;
}

#[tokio::test]
async fn allocations_survive_a_restart_of_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let state = state_on(store, network("10.96.0.0/12")).await;
        let services: Api<Service> = Api::default_namespaced(kube::Client::new(router(state), "default"));
        services.create(&PostParams::default(), &cluster_ip_service("a", Some("10.96.0.40"))).await.unwrap();
    }
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let state = state_on(store, network("10.96.0.0/12")).await;
    let services: Api<Service> = Api::default_namespaced(kube::Client::new(router(state), "default"));
    let err = services.create(&PostParams::default(), &cluster_ip_service("b", Some("10.96.0.40"))).await.unwrap_err();
    assert!(message(err).1.ends_with("provided IP is already allocated"));
}

#[tokio::test]
async fn two_api_servers_on_one_store_never_hand_out_one_address_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("state.db")).unwrap());
    let one = state_on(store.clone(), network("10.0.0.0/28")).await;
    let two = state_on(store, network("10.0.0.0/28")).await;
    let a: Api<Service> = Api::default_namespaced(kube::Client::new(router(one), "default"));
    let b: Api<Service> = Api::default_namespaced(kube::Client::new(router(two), "default"));
    let mut tasks = Vec::new();
    for i in 0..12 {
        let api = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            api.create(&PostParams::default(), &cluster_ip_service(&format!("s{i}"), None)).await
        }));
    }
    let mut ips = std::collections::BTreeSet::new();
    for t in tasks {
        let s = t.await.unwrap().unwrap();
        assert!(ips.insert(s.spec.unwrap().cluster_ip.unwrap()), "an address was handed out twice");
    }
    assert_eq!(ips.len(), 12);
}

#[tokio::test]
async fn the_kubernetes_service_and_its_endpoints_point_at_the_server() {
    let (services, state, _d) = setup().await;
    let k = services.get("kubernetes").await.unwrap();
    let spec = k.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.1"));
    let port = &spec.ports.unwrap()[0];
    assert_eq!((port.name.as_deref(), port.port), (Some("https"), 443));
    let client = kube::Client::new(router(state.clone()), "default");
    let ep = Api::<Endpoints>::default_namespaced(client.clone()).get("kubernetes").await.unwrap();
    let subset = &ep.subsets.unwrap()[0];
    assert_eq!(subset.addresses.as_ref().unwrap()[0].ip, "192.0.2.10");
    assert_eq!(subset.ports.as_ref().unwrap()[0].port, 6443);
    let slice = Api::<EndpointSlice>::default_namespaced(client).get("kubernetes").await.unwrap();
    assert_eq!(slice.address_type, "IPv4");
    assert_eq!(slice.endpoints[0].addresses, ["192.0.2.10"]);
    assert_eq!(slice.metadata.labels.unwrap()["kubernetes.io/service-name"], "kubernetes");
    // A second start changes nothing.
    let before = services.get("kubernetes").await.unwrap().metadata.resource_version;
    services::ensure_kubernetes_service(&state, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10)), 6443).await.unwrap();
    assert_eq!(services.get("kubernetes").await.unwrap().metadata.resource_version, before);
}

#[tokio::test]
async fn endpoints_and_endpoint_slices_are_served_with_kubectl_tables() {
    let (_services, state, _d) = setup().await;
    let client = kube::Client::new(router(state), "default");
    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    let bad: EndpointSlice =
        serde_json::from_value(json!({"metadata": {"name": "x"}, "addressType": "IPX", "endpoints": []})).unwrap();
    let err = slices.create(&PostParams::default(), &bad).await.unwrap_err();
    assert!(message(err).1.contains("addressType: Unsupported value: \"IPX\""));
    let req = http::Request::get("/api/v1/namespaces/default/services")
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let table: serde_json::Value = client.request(req).await.unwrap();
    let names: Vec<&str> =
        table["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Name", "Type", "Cluster-IP", "External-IP", "Port(s)", "Age", "Selector"]);
    let cells = &table["rows"][0]["cells"];
    assert_eq!(cells[0], "kubernetes");
    assert_eq!(cells[2], "10.96.0.1");
    assert_eq!(cells[4], "443/TCP");
    let req = http::Request::get("/api/v1/namespaces/default/endpoints")
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let table: serde_json::Value = client.request(req).await.unwrap();
    assert_eq!(table["rows"][0]["cells"][1], "192.0.2.10:6443");
}

#[tokio::test]
async fn the_repair_pass_frees_leaked_claims_and_restores_missing_ones() {
    let (services, state, _d) = setup().await;
    services.create(&PostParams::default(), &cluster_ip_service("a", Some("10.96.0.60"))).await.unwrap();
    // A claim left by a server that died before writing its Service, two minutes ago.
    let leaked = json!({"namespace": "default", "name": "ghost", "uid": "gone", "claimedAt": "2020-01-01T00:00:00Z"});
    state.store.create("/registry/berth/serviceips/10.96.0.61", serde_json::to_vec(&leaked).unwrap()).await.unwrap();
    // A claim lost while its Service stayed.
    state.store.delete("/registry/berth/serviceips/10.96.0.60", None).await.unwrap();

    services::repair(&state).await.unwrap();

    assert!(state.store.get("/registry/berth/serviceips/10.96.0.61").await.unwrap().is_none());
    let restored = state.store.get("/registry/berth/serviceips/10.96.0.60").await.unwrap().expect("claim restored");
    let owner: services::Owner = serde_json::from_slice(&restored.value).unwrap();
    assert_eq!(owner.name, "a");
    let err = services.create(&PostParams::default(), &cluster_ip_service("b", Some("10.96.0.60"))).await.unwrap_err();
    assert!(message(err).1.ends_with("provided IP is already allocated"));
    services.create(&PostParams::default(), &cluster_ip_service("c", Some("10.96.0.61"))).await.unwrap();
}

#[tokio::test]
async fn a_fresh_claim_without_its_service_yet_is_not_taken_for_a_leak() {
    let (_services, state, _d) = setup().await;
    let owner =
        json!({"namespace": "default", "name": "soon", "uid": "u", "claimedAt": jiff::Timestamp::now().to_string()});
    state.store.create("/registry/berth/serviceips/10.96.0.62", serde_json::to_vec(&owner).unwrap()).await.unwrap();
    services::repair(&state).await.unwrap();
    assert!(state.store.get("/registry/berth/serviceips/10.96.0.62").await.unwrap().is_some());
}

#[tokio::test]
async fn the_kubernetes_endpoints_list_every_api_server_with_a_live_lease_and_drop_one_whose_lease_expired() {
    use k8s_openapi::api::coordination::v1::Lease;
    let (_services, state, _d) = setup().await;
    let client = kube::Client::new(router(state.clone()), "default");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let own = berth_apiserver::server_leases::own_lease_name();
    assert_eq!(
        leases.get(own).await.unwrap().metadata.labels.unwrap()["apiserver.kubernetes.io/identity"],
        "kube-apiserver"
    );
    // Another server of the cluster, as its renewals leave its Lease.
    let other = |renewed: &str| -> Lease {
        serde_json::from_value(json!({
            "metadata": {
                "name": "berth-apiserver-0123456789ab",
                "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver"},
                "annotations": {"endpoints.berth.dev/default.kubernetes": "192.0.2.11"},
            },
            "spec": {"holderIdentity": "berth-apiserver-0123456789ab", "leaseDurationSeconds": 30, "renewTime": renewed},
        }))
        .unwrap()
    };
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    leases.create(&PostParams::default(), &other(&now)).await.unwrap();
    services::ensure_kubernetes_service(&state, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10)), 6443).await.unwrap();
    let endpoints: Api<Endpoints> = Api::default_namespaced(client.clone());
    let ips = |ep: Endpoints| -> Vec<String> {
        ep.subsets.unwrap()[0].addresses.as_ref().unwrap().iter().map(|a| a.ip.clone()).collect()
    };
    assert_eq!(ips(endpoints.get("kubernetes").await.unwrap()), ["192.0.2.10", "192.0.2.11"]);
    let slice = Api::<EndpointSlice>::default_namespaced(client.clone()).get("kubernetes").await.unwrap();
    assert_eq!(slice.endpoints.len(), 2);

    // It stops renewing: once the Lease is older than its duration, it is gone from both.
    let mut stale = leases.get("berth-apiserver-0123456789ab").await.unwrap();
    stale.spec = other("2026-01-01T00:00:00.000000Z").spec;
    leases.replace("berth-apiserver-0123456789ab", &PostParams::default(), &stale).await.unwrap();
    services::ensure_kubernetes_service(&state, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10)), 6443).await.unwrap();
    assert_eq!(ips(endpoints.get("kubernetes").await.unwrap()), ["192.0.2.10"]);
    assert!(leases.get_opt("berth-apiserver-0123456789ab").await.unwrap().is_none(), "the expired Lease is deleted");
}
