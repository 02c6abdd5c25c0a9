//! Which API servers of a cluster are alive, for the endpoints of the Services they answer
//! themselves (`kubernetes`, `kube-dns`). Each server process renews a Lease in `kube-system`
//! (label `apiserver.kubernetes.io/identity: kube-apiserver`) naming, per such Service, the
//! address it serves it at; those Services' endpoints list the addresses of the Leases that have
//! not expired. This is kube-apiserver's lease endpoint reconciler, with Lease objects in place of
//! its `/masterleases/` keys: a server that dies drops out of the endpoints once its Lease
//! expires, and one that stops withdraws its Lease at once.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use berth_api::resources::LEASES;
use berth_store::{ListOptions, StoreError};
use serde_json::{Value, json};

use crate::{ApiError, ApiResult, ApiState, objects};

pub const NAMESPACE: &str = "kube-system";
/// The label kube-apiserver puts on its identity Leases.
pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
/// A server renews every ten seconds; three missed renewals and it is taken for gone.
pub const LEASE_SECONDS: i64 = 30;
const ANNOTATION_PREFIX: &str = "endpoints.berth.dev/";

/// This process's Lease: one per server process, so a restarted server takes a new one and the
/// old one simply expires.
pub fn own_lease_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| format!("berth-apiserver-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]))
}

fn annotation(namespace: &str, service: &str) -> String {
    format!("{ANNOTATION_PREFIX}{namespace}.{service}")
}

fn now_micro() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Whether `lease` was renewed within its duration.
fn alive(lease: &Value, now: jiff::Timestamp) -> bool {
    let renewed =
        lease.pointer("/spec/renewTime").and_then(Value::as_str).and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let seconds = lease.pointer("/spec/leaseDurationSeconds").and_then(Value::as_i64).unwrap_or(LEASE_SECONDS);
    renewed.is_some_and(|r| r + jiff::SignedDuration::from_secs(seconds) > now)
}

/// Renews this server's Lease, recording that it serves `namespace/service` at `address`.
pub async fn renew(state: &ApiState, namespace: &str, service: &str, address: &str) -> ApiResult<()> {
    let name = own_lease_name();
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {IDENTITY_LABEL: "kube-apiserver"},
            "annotations": {annotation(namespace, service): address},
        },
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now_micro()},
    });
    crate::services::put(state, &LEASES, lease, |want, have| {
        have["spec"] = want["spec"].clone();
        let meta = objects::meta_mut(have);
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        labels[IDENTITY_LABEL] = json!("kube-apiserver");
        let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
        if let Some(Value::Object(wanted)) = want.pointer("/metadata/annotations") {
            for (k, v) in wanted {
                annotations[k] = v.clone();
            }
        }
    })
    .await
}

/// The addresses live servers serve `namespace/service` at, sorted. Leases expired are deleted
/// on the way (a renewal in between wins: the delete compares the revision read).
pub async fn live_addresses(state: &ApiState, namespace: &str, service: &str) -> ApiResult<BTreeSet<String>> {
    let prefix = objects::prefix(&LEASES, Some(NAMESPACE));
    let listed =
        state.store.list(&prefix, &ListOptions::default()).await.map_err(|e| ApiError::from_store(e, &LEASES, ""))?;
    let key = annotation(namespace, service);
    let now = jiff::Timestamp::now();
    let mut addresses = BTreeSet::new();
    for kv in &listed.items {
        let lease = objects::decode_kv(&LEASES, kv)?;
        if lease.pointer(&format!("/metadata/labels/{}", IDENTITY_LABEL.replace('/', "~1"))).is_none()
            || !objects::name(&lease).starts_with("berth-apiserver-")
        {
            continue;
        }
        if !alive(&lease, now) {
            match state.store.delete(&kv.key, Some(kv.mod_revision)).await {
                Ok(_) | Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                Err(e) => {
                    tracing::warn!(error = %e, lease = objects::name(&lease), "deleting an expired API server lease failed")
                }
            }
            continue;
        }
        let annotations = lease.pointer("/metadata/annotations").and_then(Value::as_object);
        if let Some(address) = annotations.and_then(|a| a.get(&key)).and_then(Value::as_str) {
            addresses.insert(address.to_owned());
        }
    }
    Ok(addresses)
}

/// Deletes this server's Lease, as it stops: the other servers drop its addresses at their next
/// renewal instead of when it expires.
pub async fn withdraw(state: &ApiState) {
    let key = objects::key(&LEASES, Some(NAMESPACE), own_lease_name());
    if let Ok(Some(kv)) = state.store.get(&key).await {
        let _ = state.store.delete(&key, Some(kv.mod_revision)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_alive_for_its_duration_after_its_renewal() {
        let now: jiff::Timestamp = "2026-11-26T12:00:00Z".parse().unwrap();
        let lease = |renewed: &str| json!({"spec": {"renewTime": renewed, "leaseDurationSeconds": 30}});
        assert!(alive(&lease("2026-11-26T11:59:45.123456Z"), now));
        assert!(!alive(&lease("2026-11-26T11:59:29.999999Z"), now));
        assert!(!alive(&json!({"spec": {}}), now));
    }

    #[test]
    fn each_process_has_one_lease_name() {
        assert_eq!(own_lease_name(), own_lease_name());
        assert!(own_lease_name().starts_with("berth-apiserver-"));
    }
}
