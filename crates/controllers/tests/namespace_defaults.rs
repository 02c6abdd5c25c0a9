//! The ServiceAccount controller and the root CA publisher against the real API server
//! in-process: every active namespace gets its `default` ServiceAccount and its
//! `kube-root-ca.crt` ConfigMap, and keeps them.

mod gc_common;

use std::time::Duration;

use berth_controllers::Config;
use gc_common::{Cluster, PATIENCE, eventually};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n";
/// How soon a new namespace must have both (the conformance suite waits a few seconds).
const SOON: Duration = Duration::from_secs(5);

fn with_ca() -> Config {
    Config { root_ca: Some(CA.into()), ..Config::default() }
}

async fn create_namespace(c: &Cluster, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(c.client.clone()).create(&PostParams::default(), &ns).await.unwrap();
}

fn service_accounts(c: &Cluster, ns: &str) -> Api<ServiceAccount> {
    Api::namespaced(c.client.clone(), ns)
}

fn config_maps(c: &Cluster, ns: &str) -> Api<ConfigMap> {
    Api::namespaced(c.client.clone(), ns)
}

/// Runs both controllers the way `berth server` does, minus those `--controllers` leaves out.
fn start(c: &mut Cluster, controllers: &str, config: Config) {
    let spec: Vec<String> = controllers.split(',').map(String::from).collect();
    let enabled = berth_controllers::enabled(&spec).unwrap();
    let ctx = c.context(config);
    c.spawn(async move { berth_controllers::run(ctx, &enabled).await });
}

async fn wait_for_service_account(c: &Cluster, ns: &str, limit: Duration) -> ServiceAccount {
    let api = service_accounts(c, ns);
    eventually(&format!("serviceaccount {ns}/default"), limit, || async {
        api.get_opt("default").await.map_err(|e| e.to_string())?.ok_or_else(|| "absent".to_string())
    })
    .await
}

async fn wait_for_ca(c: &Cluster, ns: &str, limit: Duration) -> ConfigMap {
    let api = config_maps(c, ns);
    eventually(&format!("configmap {ns}/kube-root-ca.crt with the CA"), limit, || async {
        let cm = api.get_opt("kube-root-ca.crt").await.map_err(|e| e.to_string())?.ok_or("absent")?;
        let ca = cm.data.as_ref().and_then(|d| d.get("ca.crt"));
        if ca.map(String::as_str) == Some(CA) { Ok(cm) } else { Err(format!("ca.crt is {ca:?}")) }
    })
    .await
}

#[tokio::test]
async fn a_new_namespace_gets_its_default_service_account_and_root_ca_config_map_at_once() {
    let mut c = Cluster::new().await;
    start(&mut c, "serviceaccount,root-ca-cert-publisher", with_ca());
    create_namespace(&c, "fresh").await;
    wait_for_service_account(&c, "fresh", SOON).await;
    let cm = wait_for_ca(&c, "fresh", SOON).await;
    let description = cm.metadata.annotations.unwrap_or_default().remove("kubernetes.io/description");
    assert!(description.is_some_and(|d| !d.is_empty()), "the ConfigMap says what it is for");
    // The namespaces that were there before the controllers started have them too.
    wait_for_service_account(&c, "kube-system", SOON).await;
    wait_for_ca(&c, "default", SOON).await;
}

#[tokio::test]
async fn a_deleted_service_account_or_config_map_comes_back() {
    let mut c = Cluster::new().await;
    start(&mut c, "serviceaccount,root-ca-cert-publisher", with_ca());
    create_namespace(&c, "x").await;
    let first = wait_for_service_account(&c, "x", PATIENCE).await;
    let first_cm = wait_for_ca(&c, "x", PATIENCE).await;

    service_accounts(&c, "x").delete("default", &DeleteParams::default()).await.unwrap();
    config_maps(&c, "x").delete("kube-root-ca.crt", &DeleteParams::default()).await.unwrap();
    let api = service_accounts(&c, "x");
    eventually("a new default serviceaccount", SOON, || async {
        let sa = api.get_opt("default").await.map_err(|e| e.to_string())?.ok_or("absent")?;
        if sa.metadata.uid != first.metadata.uid { Ok(()) } else { Err("the old one".to_string()) }
    })
    .await;
    let cm = wait_for_ca(&c, "x", SOON).await;
    assert_ne!(cm.metadata.uid, first_cm.metadata.uid, "a new ConfigMap");
}

#[tokio::test]
async fn an_edited_ca_bundle_is_restored_and_an_edited_service_account_is_left_alone() {
    let mut c = Cluster::new().await;
    start(&mut c, "serviceaccount,root-ca-cert-publisher", with_ca());
    create_namespace(&c, "x").await;
    wait_for_service_account(&c, "x", PATIENCE).await;
    wait_for_ca(&c, "x", PATIENCE).await;

    let patch = json!({"metadata": {"labels": {"mine": "yes"}}, "data": {"ca.crt": "forged", "extra": "1"}});
    config_maps(&c, "x").patch("kube-root-ca.crt", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let sa_patch = json!({"metadata": {"labels": {"mine": "yes"}}, "automountServiceAccountToken": false});
    service_accounts(&c, "x").patch("default", &PatchParams::default(), &Patch::Merge(&sa_patch)).await.unwrap();

    let api = config_maps(&c, "x");
    let cm = eventually("the CA bundle restored", SOON, || async {
        let cm = api.get("kube-root-ca.crt").await.map_err(|e| e.to_string())?;
        let data = cm.data.clone().unwrap_or_default();
        if data.len() == 1 && data.get("ca.crt").map(String::as_str) == Some(CA) {
            Ok(cm)
        } else {
            Err(format!("{data:?}"))
        }
    })
    .await;
    assert_eq!(cm.metadata.labels.unwrap_or_default().get("mine").map(String::as_str), Some("yes"));
    let sa = service_accounts(&c, "x").get("default").await.unwrap();
    assert_eq!(sa.automount_service_account_token, Some(false), "the ServiceAccount is not reset");
}

#[tokio::test]
async fn a_terminating_namespace_gets_nothing_new() {
    let mut c = Cluster::new().await;
    // Deleted with no namespace controller running, the namespace stays terminating.
    create_namespace(&c, "going").await;
    Api::<Namespace>::all(c.client.clone()).delete("going", &DeleteParams::default()).await.unwrap();
    let ns = Api::<Namespace>::all(c.client.clone()).get("going").await.unwrap();
    assert!(ns.metadata.deletion_timestamp.is_some(), "the namespace is terminating");

    start(&mut c, "serviceaccount,root-ca-cert-publisher", with_ca());
    create_namespace(&c, "control").await;
    wait_for_service_account(&c, "control", PATIENCE).await;
    wait_for_ca(&c, "control", PATIENCE).await;
    // Both controllers have looked at every namespace by now; give them a moment more anyway.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(service_accounts(&c, "going").get_opt("default").await.unwrap().is_none());
    assert!(config_maps(&c, "going").get_opt("kube-root-ca.crt").await.unwrap().is_none());
}

#[tokio::test]
async fn without_the_service_account_controller_namespaces_get_only_the_config_map() {
    let mut c = Cluster::new().await;
    start(&mut c, "*,-serviceaccount", with_ca());
    create_namespace(&c, "x").await;
    wait_for_ca(&c, "x", PATIENCE).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(service_accounts(&c, "x").get_opt("default").await.unwrap().is_none());
}

#[tokio::test]
async fn without_a_ca_bundle_the_publisher_does_not_run() {
    let mut c = Cluster::new().await;
    start(&mut c, "serviceaccount,root-ca-cert-publisher", Config::default());
    create_namespace(&c, "x").await;
    wait_for_service_account(&c, "x", PATIENCE).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(config_maps(&c, "x").get_opt("kube-root-ca.crt").await.unwrap().is_none());
}
