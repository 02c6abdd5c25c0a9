//! The EndpointSlice and Endpoints controllers against the real API server in-process. There is
//! no node: pods get their IP and Ready condition from the test, as a kubelet would report them.

use std::sync::Arc;
use std::time::Duration;

use berth_apiserver::{ApiState, lifecycle, router};
use berth_controllers::{Config, Context, endpoints, garbage_collector};
use berth_store::sqlite::SqliteStore;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::task::JoinHandle;

const PATIENCE: Duration = Duration::from_secs(30);

struct Cluster {
    client: kube::Client,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Cluster {
    /// The API server alone.
    async fn server() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), None);
        lifecycle::bootstrap(&state).await.unwrap();
        let client = kube::Client::new(router(state), "default");
        Cluster { client, tasks: Vec::new(), _dir: dir }
    }

    /// The EndpointSlice, Endpoints and garbage collector controllers, from now on.
    fn run_controllers(&mut self) {
        let ctx = Context::new(self.client.clone(), Config::default());
        self.tasks.push(tokio::spawn(endpoints::run_endpoint_slices(ctx.clone())));
        self.tasks.push(tokio::spawn(endpoints::run_endpoints(ctx.clone())));
        self.tasks.push(tokio::spawn(garbage_collector::run(ctx)));
    }

    async fn start() -> Cluster {
        let mut c = Cluster::server().await;
        c.run_controllers();
        c
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::default_namespaced(self.client.clone())
    }

    async fn pod(&self, name: &str) {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox",
                "ports": [{"name": "http", "containerPort": 8080}]}]}
        }))
        .unwrap();
        self.api::<Pod>().create(&PostParams::default(), &pod).await.unwrap();
    }

    async fn set_ready(&self, name: &str, ip: &str, ready: bool) {
        let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        self.api::<Pod>().patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    }
}

/// Polls `check` until it returns `Some`; panics with the last state after [`PATIENCE`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if tokio::time::Instant::now() >= deadline => panic!("waiting for {what}; last: {last}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

/// (ip, ready, serving, terminating) of every endpoint in the Service's slices, sorted.
async fn slice_endpoints(c: &Cluster, service: &str) -> Vec<(String, bool, bool, bool)> {
    let slices = c
        .api::<EndpointSlice>()
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .unwrap();
    let mut out: Vec<_> = slices
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .map(|e| {
            let c = e.conditions.clone().unwrap_or_default();
            (e.addresses[0].clone(), c.ready == Some(true), c.serving == Some(true), c.terminating == Some(true))
        })
        .collect();
    out.sort();
    out
}

/// (ready addresses, not-ready addresses, ports) of the Service's Endpoints.
async fn endpoint_addresses(c: &Cluster, service: &str) -> Option<(Vec<String>, Vec<String>, Vec<i32>)> {
    let ep = c.api::<Endpoints>().get_opt(service).await.unwrap()?;
    let mut ready = Vec::new();
    let mut not_ready = Vec::new();
    let mut ports = Vec::new();
    for s in ep.subsets.unwrap_or_default() {
        ready.extend(s.addresses.unwrap_or_default().into_iter().map(|a| a.ip));
        not_ready.extend(s.not_ready_addresses.unwrap_or_default().into_iter().map(|a| a.ip));
        ports.extend(s.ports.unwrap_or_default().into_iter().map(|p| p.port));
    }
    ready.sort();
    not_ready.sort();
    Some((ready, not_ready, ports))
}

fn web_service() -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    }))
    .unwrap()
}

fn s(v: &str) -> String {
    v.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_and_endpoints_follow_pods_becoming_ready_unready_and_deleted() {
    let c = Cluster::start().await;
    let svc = c.api::<Service>().create(&PostParams::default(), &web_service()).await.unwrap();
    c.pod("a").await;
    c.pod("b").await;
    c.set_ready("a", "10.1.0.1", true).await;
    c.set_ready("b", "10.1.0.2", false).await;

    let want = vec![(s("10.1.0.1"), true, true, false), (s("10.1.0.2"), false, false, false)];
    eventually("slices with a ready and b not ready", || async {
        let got = slice_endpoints(&c, "web").await;
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;
    let want = Some((vec![s("10.1.0.1")], vec![s("10.1.0.2")], vec![8080]));
    eventually("endpoints with a ready and b not ready", || async {
        let got = endpoint_addresses(&c, "web").await;
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;

    // The slice is the controller's, owned by the Service, with the named port resolved.
    let slices =
        c.api::<EndpointSlice>().list(&ListParams::default().labels("kubernetes.io/service-name=web")).await.unwrap();
    assert_eq!(slices.items.len(), 1);
    let slice = &slices.items[0];
    assert_eq!(slice.address_type, "IPv4");
    let labels = slice.metadata.labels.clone().unwrap();
    assert_eq!(labels["endpointslice.kubernetes.io/managed-by"], "endpointslice-controller.k8s.io");
    assert_eq!(slice.metadata.owner_references.as_ref().unwrap()[0].uid, svc.metadata.uid.unwrap());
    assert_eq!(slice.ports.as_ref().unwrap()[0].port, Some(8080));
    let a = slice.endpoints.iter().find(|e| e.addresses[0] == "10.1.0.1").unwrap();
    assert_eq!(a.node_name.as_deref(), Some("n1"));
    assert_eq!(a.target_ref.as_ref().unwrap().name.as_deref(), Some("a"));

    // b becomes ready.
    c.set_ready("b", "10.1.0.2", true).await;
    let want = Some((vec![s("10.1.0.1"), s("10.1.0.2")], vec![], vec![8080]));
    eventually("endpoints with both ready", || async {
        let got = endpoint_addresses(&c, "web").await;
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;

    // a is deleted gracefully: terminating in the slice (still serving), gone from Endpoints.
    c.api::<Pod>().delete("a", &DeleteParams::default()).await.unwrap();
    let want = vec![(s("10.1.0.1"), false, true, true), (s("10.1.0.2"), true, true, false)];
    eventually("a terminating in the slice", || async {
        let got = slice_endpoints(&c, "web").await;
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;
    let want = Some((vec![s("10.1.0.2")], vec![], vec![8080]));
    eventually("endpoints without a", || async {
        let got = endpoint_addresses(&c, "web").await;
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;

    // a is gone for good.
    c.api::<Pod>().delete("a", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    let want = vec![(s("10.1.0.2"), true, true, false)];
    eventually("slices without a", || async {
        let got = slice_endpoints(&c, "web").await;
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_relabelled_away_leaves_and_a_deleted_service_takes_its_endpoints() {
    let c = Cluster::start().await;
    c.api::<Service>().create(&PostParams::default(), &web_service()).await.unwrap();
    c.pod("a").await;
    c.set_ready("a", "10.1.0.1", true).await;
    eventually("a in the endpoints", || async {
        let got = endpoint_addresses(&c, "web").await;
        if got.as_ref().is_some_and(|g| g.0 == [s("10.1.0.1")]) { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;

    let relabel = json!({"metadata": {"labels": {"app": "other"}}});
    c.api::<Pod>().patch("a", &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    eventually("no endpoints and an empty slice", || async {
        let ep = endpoint_addresses(&c, "web").await;
        let slices = slice_endpoints(&c, "web").await;
        if ep == Some((vec![], vec![], vec![])) && slices.is_empty() {
            Ok(())
        } else {
            Err(format!("{ep:?} {slices:?}"))
        }
    })
    .await;

    c.api::<Service>().delete("web", &DeleteParams::default()).await.unwrap();
    eventually("the endpoints and slices deleted with the service", || async {
        let slices = c
            .api::<EndpointSlice>()
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await
            .unwrap();
        match c.api::<Endpoints>().get_opt("web").await.unwrap() {
            None if slices.items.is_empty() => Ok(()),
            e => Err(format!("{e:?} and {} slices", slices.items.len())),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_without_a_selector_is_left_alone() {
    let c = Cluster::start().await;
    let manual: Service =
        serde_json::from_value(json!({"metadata": {"name": "manual"}, "spec": {"ports": [{"port": 80}]}})).unwrap();
    c.api::<Service>().create(&PostParams::default(), &manual).await.unwrap();
    let mine: Endpoints = serde_json::from_value(json!({"metadata": {"name": "manual"},
        "subsets": [{"addresses": [{"ip": "192.0.2.5"}], "ports": [{"port": 80}]}]}))
    .unwrap();
    c.api::<Endpoints>().create(&PostParams::default(), &mine).await.unwrap();
    // A selected Service made after it proves the controllers have looked.
    c.api::<Service>().create(&PostParams::default(), &web_service()).await.unwrap();
    eventually("the web endpoints", || async {
        match c.api::<Endpoints>().get_opt("web").await.unwrap() {
            Some(_) => Ok(()),
            None => Err("none".into()),
        }
    })
    .await;
    let got = endpoint_addresses(&c, "manual").await;
    assert_eq!(got, Some((vec![s("192.0.2.5")], vec![], vec![80])));
    let slices = slice_endpoints(&c, "manual").await;
    assert!(slices.is_empty(), "{slices:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_left_by_a_service_deleted_while_no_controller_ran_are_deleted_at_start() {
    let mut c = Cluster::server().await;
    let leftover: Endpoints = serde_json::from_value(json!({"metadata": {"name": "gone"},
        "subsets": [{"addresses": [{"ip": "10.1.0.9"}], "ports": [{"port": 80}]}]}))
    .unwrap();
    c.api::<Endpoints>().create(&PostParams::default(), &leftover).await.unwrap();
    let lock: Endpoints = serde_json::from_value(json!({"metadata": {"name": "lock",
        "annotations": {"control-plane.alpha.kubernetes.io/leader": "{}"}}}))
    .unwrap();
    c.api::<Endpoints>().create(&PostParams::default(), &lock).await.unwrap();
    c.run_controllers();
    eventually("the leftover endpoints deleted", || async {
        match c.api::<Endpoints>().get_opt("gone").await.unwrap() {
            None => Ok(()),
            Some(e) => Err(format!("{e:?}")),
        }
    })
    .await;
    assert!(c.api::<Endpoints>().get_opt("lock").await.unwrap().is_some(), "a leader-election lock is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_of_a_selectorless_service_are_mirrored_into_slices_that_follow_them() {
    let c = Cluster::start().await;
    let ctx = Context::new(c.client.clone(), Config::default());
    let mirroring = tokio::spawn(endpoints::mirroring::run(ctx));
    let svc: Service =
        serde_json::from_value(json!({"metadata": {"name": "ext"}, "spec": {"ports": [{"name": "http", "port": 80}]}}))
            .unwrap();
    c.api::<Service>().create(&PostParams::default(), &svc).await.unwrap();
    let ep = |ip: &str| -> Endpoints {
        serde_json::from_value(json!({"metadata": {"name": "ext"},
            "subsets": [{"addresses": [{"ip": ip}], "ports": [{"name": "http", "port": 8080}]}]}))
        .unwrap()
    };
    c.api::<Endpoints>().create(&PostParams::default(), &ep("10.9.0.1")).await.unwrap();
    let mirrored = |ip: &'static str| {
        let api = c.api::<EndpointSlice>();
        async move {
            let lp = ListParams::default().labels(&format!(
                "kubernetes.io/service-name=ext,endpointslice.kubernetes.io/managed-by={}",
                endpoints::mirroring::MIRRORING_MANAGED_BY
            ));
            let slices = api.list(&lp).await.unwrap().items;
            let addresses: Vec<String> =
                slices.iter().flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone())).collect();
            let port = slices.first().and_then(|s| s.ports.as_ref()?.first()?.port);
            if addresses == [ip] && port == Some(8080) { Ok(()) } else { Err(format!("{addresses:?} port {port:?}")) }
        }
    };
    eventually("the Endpoints mirrored", || mirrored("10.9.0.1")).await;
    let mut changed = c.api::<Endpoints>().get("ext").await.unwrap();
    changed.subsets = ep("10.9.0.2").subsets;
    c.api::<Endpoints>().replace("ext", &PostParams::default(), &changed).await.unwrap();
    eventually("the change mirrored", || mirrored("10.9.0.2")).await;
    c.api::<Endpoints>().delete("ext", &DeleteParams::default()).await.unwrap();
    eventually("the mirrored slices gone with their Endpoints", || async {
        let slices =
            c.api::<EndpointSlice>().list(&ListParams::default().labels("kubernetes.io/service-name=ext")).await;
        let left = slices.unwrap().items.len();
        if left == 0 { Ok(()) } else { Err(format!("{left} slices left")) }
    })
    .await;
    mirroring.abort();
}
