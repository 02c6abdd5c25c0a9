//! Service cluster IPs and node ports, kept in the store, and the `default/kubernetes` Service.
//!
//! ## Allocation
//!
//! Every address or node port in use is a claim, one key per value, like Kubernetes' IPAddress
//! objects (the allocator of its MultiCIDRServiceAllocator, GA in 1.33) rather than its older
//! bitmap:
//!
//! | what            | key                                        |
//! |-----------------|--------------------------------------------|
//! | cluster IP      | `/registry/berth/serviceips/<ip>`          |
//! | node port       | `/registry/berth/servicenodeports/<port>`  |
//!
//! The value names the owning Service (namespace, name, uid) and when it was claimed.
//!
//! - **Claim** = the store's `create`, which fails with `AlreadyExists` when the key is there: of
//!   two API servers on one store asking for the same address, exactly one wins, with no lock and
//!   no shared bitmap to compare-and-swap. A claim already held by the same Service uid counts as
//!   its own (retries and updates are idempotent).
//! - **Create/update** of a Service claims before the Service is written; if the write fails the
//!   claims made for it are deleted again.
//! - **Release** is driven by the Services themselves ([`run_repair`]): a watch on Services
//!   deletes the claims of a deleted Service (by uid, so a late event never frees an address that
//!   was claimed again by another Service) and those a Service no longer uses (its type changed),
//!   if the claim is older than the revision of that Service's write. A full pass at start and
//!   every minute re-creates claims missing for stored Services and deletes claims whose owner
//!   does not use them, if they are older than a minute (younger ones may belong to a write in
//!   flight). So the allocation survives restarts (it is the store) and converges after a crash
//!   between a claim and its Service's write.
//! - Dynamic allocation lists the claims, picks a random free value and claims it, retrying on a
//!   lost race. The first address of the range is never picked dynamically: it is the
//!   `kubernetes` Service's.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use berth_api::FieldError;
use berth_api::resources::{ENDPOINTS, ENDPOINTSLICES, SERVICES};
use berth_api::service;
pub use berth_api::service::{IpRange, PortRange};
use berth_store::{EventKind, ListOptions, StoreError};
use futures::StreamExt;
use k8s_openapi::api::core::v1 as core;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{ApiError, ApiResult, ApiState, objects};

pub const IP_CLAIMS: &str = "/registry/berth/serviceips/";
pub const PORT_CLAIMS: &str = "/registry/berth/servicenodeports/";
/// A claim younger than this is never taken for a leak: its Service may be being written.
const CLAIM_GRACE: Duration = Duration::from_secs(60);
const REPAIR_INTERVAL: Duration = Duration::from_secs(60);

/// The ranges Services get their addresses and node ports from
/// (`--service-cluster-ip-range`, `--service-node-port-range`).
#[derive(Clone, Copy, Debug)]
pub struct ServiceNetwork {
    pub cluster_ip_range: IpRange,
    pub node_port_range: PortRange,
}

impl Default for ServiceNetwork {
    fn default() -> Self {
        ServiceNetwork {
            cluster_ip_range: IpRange::parse("10.96.0.0/12").expect("the default range parses"),
            node_port_range: PortRange { base: 30000, last: 32767 },
        }
    }
}

impl ServiceNetwork {
    /// The `kubernetes` Service's address: the first of the range.
    pub fn kubernetes_ip(&self) -> Ipv4Addr {
        self.cluster_ip_range.nth(0)
    }
}

/// Who holds a claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    #[serde(default)]
    pub claimed_at: String,
}

impl Owner {
    fn of(obj: &Value) -> Owner {
        let m = objects::meta(obj);
        let s = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Owner {
            namespace: s("namespace"),
            name: s("name"),
            uid: s("uid"),
            claimed_at: berth_common::time::now_rfc3339(),
        }
    }
}

fn ip_key(ip: Ipv4Addr) -> String {
    format!("{IP_CLAIMS}{ip}")
}

fn port_key(port: i32) -> String {
    format!("{PORT_CLAIMS}{port}")
}

enum Claim {
    /// Made by this call: to be undone if the Service is not written.
    New(String),
    /// Already held by the same Service.
    Held,
    /// Held by another Service.
    Taken,
}

async fn claim(state: &ApiState, key: &str, owner: &Owner) -> ApiResult<Claim> {
    let value = serde_json::to_vec(owner).expect("owners serialize");
    match state.store.create(key, value).await {
        Ok(_) => Ok(Claim::New(key.to_string())),
        Err(StoreError::AlreadyExists { .. }) => {
            let held = state.store.get(key).await.map_err(store_error)?;
            let mine =
                held.and_then(|kv| serde_json::from_slice::<Owner>(&kv.value).ok()).is_some_and(|o| o.uid == owner.uid);
            Ok(if mine { Claim::Held } else { Claim::Taken })
        }
        Err(e) => Err(store_error(e)),
    }
}

fn store_error(e: StoreError) -> ApiError {
    ApiError::internal(format!("Internal error occurred: cannot reach the service allocations: {e}"))
}

/// The values claimed under `prefix`.
async fn claimed(state: &ApiState, prefix: &str) -> ApiResult<BTreeSet<String>> {
    let list = state.store.list(prefix, &ListOptions::default()).await.map_err(store_error)?;
    Ok(list.items.into_iter().map(|kv| kv.key[prefix.len()..].to_string()).collect())
}

/// A random starting point for the search of a free value.
fn random_below(n: u32) -> u32 {
    let b = uuid::Uuid::new_v4().into_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]]) % n.max(1)
}

async fn allocate_any_ip(state: &ApiState, owner: &Owner) -> ApiResult<(Ipv4Addr, String)> {
    let range = state.services.cluster_ip_range;
    for _ in 0..8 {
        let taken = claimed(state, IP_CLAIMS).await?;
        let size = range.size();
        // Offset 0 is the `kubernetes` Service's; search the rest from a random point.
        let start = 1 + random_below(size.saturating_sub(1));
        let free = (0..size.saturating_sub(1))
            .map(|i| 1 + (start - 1 + i) % (size - 1))
            .map(|off| range.nth(off))
            .find(|ip| !taken.contains(&ip.to_string()));
        let Some(ip) = free else { break };
        if let Claim::New(key) = claim(state, &ip_key(ip), owner).await? {
            return Ok((ip, key));
        }
    }
    Err(ApiError::internal("Internal error occurred: failed to allocate a serviceIP: range is full"))
}

async fn allocate_any_port(state: &ApiState, owner: &Owner, also_taken: &BTreeSet<i32>) -> ApiResult<(i32, String)> {
    let range = state.services.node_port_range;
    for _ in 0..8 {
        let taken = claimed(state, PORT_CLAIMS).await?;
        let size = range.size();
        let start = random_below(size);
        let free = (0..size)
            .map(|i| i32::from(range.base) + ((start + i) % size) as i32)
            .find(|p| !taken.contains(&p.to_string()) && !also_taken.contains(p));
        let Some(port) = free else { break };
        if let Claim::New(key) = claim(state, &port_key(port), owner).await? {
            return Ok((port, key));
        }
    }
    Err(ApiError::internal("Internal error occurred: failed to allocate a nodePort: range is full"))
}

fn go_strings(ips: &[String]) -> String {
    format!("[]string{{{}}}", ips.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", "))
}

/// Claims what `svc` needs that `old` (the stored version, on update) does not hold: its cluster
/// IP and node ports, allocated or as requested. Fills them into `obj`. Returns the claims made,
/// to release with [`undo`] if the write fails.
pub async fn allocate(state: &ApiState, obj: &mut Value, old: Option<&Value>) -> ApiResult<Vec<String>> {
    let mut made = Vec::new();
    let result = allocate_inner(state, obj, old, &mut made).await;
    if result.is_err() {
        undo(state, &made).await;
        made.clear();
    }
    result.map(|()| made)
}

async fn allocate_inner(
    state: &ApiState,
    obj: &mut Value,
    old: Option<&Value>,
    made: &mut Vec<String>,
) -> ApiResult<()> {
    let Ok(mut svc) = serde_json::from_value::<core::Service>(obj.clone()) else { return Ok(()) };
    let old_svc: Option<core::Service> = old.and_then(|o| serde_json::from_value(o.clone()).ok());
    let owner = Owner::of(obj);
    let name = owner.name.clone();
    let invalid = |e: FieldError| ApiError::invalid(&SERVICES, &name, &[e]);
    let range = state.services.cluster_ip_range;

    // Cluster IP.
    if service::needs_cluster_ip(&svc) {
        let old_ip = old_svc.as_ref().and_then(|o| service::requested_cluster_ip(o).map(str::to_string));
        let wanted = service::requested_cluster_ip(&svc).map(str::to_string);
        match wanted {
            Some(ip) if old_ip.as_deref() == Some(ip.as_str()) => {}
            Some(ip) => {
                let shown = go_strings(std::slice::from_ref(&ip));
                let addr: Ipv4Addr = ip.parse().map_err(|_| {
                    invalid(FieldError::invalid_raw(
                        "spec.clusterIPs",
                        shown.clone(),
                        format!("failed to allocate IP {ip}: only IPv4 service addresses are served"),
                    ))
                })?;
                if !range.contains(addr) {
                    return Err(invalid(FieldError::invalid_raw(
                        "spec.clusterIPs",
                        shown,
                        format!(
                            "failed to allocate IP {ip}: the provided IP ({ip}) is not in the valid range. The range of valid IPs is {range}"
                        ),
                    )));
                }
                match claim(state, &ip_key(addr), &owner).await? {
                    Claim::New(key) => made.push(key),
                    Claim::Held => {}
                    Claim::Taken => {
                        return Err(invalid(FieldError::invalid_raw(
                            "spec.clusterIPs",
                            shown,
                            format!("failed to allocate IP {ip}: provided IP is already allocated"),
                        )));
                    }
                }
                service::set_cluster_ip(&mut svc, Some(&ip));
            }
            None => {
                let (ip, key) = allocate_any_ip(state, &owner).await?;
                made.push(key);
                service::set_cluster_ip(&mut svc, Some(&ip.to_string()));
            }
        }
    } else if service::is_headless(&svc) {
        service::set_cluster_ip(&mut svc, Some(service::NONE));
    } else {
        service::set_cluster_ip(&mut svc, None);
    }

    // Node ports.
    if service::needs_node_ports(&svc) {
        let held: BTreeSet<i32> = old_svc
            .as_ref()
            .filter(|o| service::needs_node_ports(o))
            .and_then(|o| o.spec.as_ref()?.ports.clone())
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.node_port)
            .collect();
        let ports = svc.spec.as_mut().and_then(|s| s.ports.as_mut());
        let mut used: BTreeSet<i32> = BTreeSet::new();
        for (i, p) in ports.into_iter().flatten().enumerate() {
            match p.node_port.filter(|n| *n != 0) {
                Some(np) if held.contains(&np) || used.contains(&np) => {
                    used.insert(np);
                }
                Some(np) => {
                    let field = format!("spec.ports[{i}].nodePort");
                    let node_ports = state.services.node_port_range;
                    if !node_ports.contains(np) {
                        return Err(invalid(FieldError::invalid_raw(
                            field,
                            np.to_string(),
                            format!(
                                "provided port is not in the valid range. The range of valid ports is {node_ports}"
                            ),
                        )));
                    }
                    match claim(state, &port_key(np), &owner).await? {
                        Claim::New(key) => made.push(key),
                        Claim::Held => {}
                        Claim::Taken => {
                            return Err(invalid(FieldError::invalid_raw(
                                field,
                                np.to_string(),
                                "provided port is already allocated",
                            )));
                        }
                    }
                    used.insert(np);
                }
                None => {
                    let (np, key) = allocate_any_port(state, &owner, &used).await?;
                    made.push(key);
                    used.insert(np);
                    p.node_port = Some(np);
                }
            }
        }
    } else {
        for p in svc.spec.as_mut().and_then(|s| s.ports.as_mut()).into_iter().flatten() {
            p.node_port = None;
        }
    }
    if let Ok(v) = serde_json::to_value(&svc) {
        *obj = v;
    }
    Ok(())
}

/// Deletes claims made by [`allocate`] for a write that did not happen.
pub async fn undo(state: &ApiState, keys: &[String]) {
    for key in keys {
        if let Err(e) = state.store.delete(key, None).await {
            tracing::warn!(%key, error = %e, "releasing a service allocation failed; the repair pass will");
        }
    }
}

/// The claim keys a stored Service uses.
fn keys_used(svc: &core::Service) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if service::needs_cluster_ip(svc)
        && let Some(ip) = service::requested_cluster_ip(svc).and_then(|ip| ip.parse::<Ipv4Addr>().ok())
    {
        out.insert(ip_key(ip));
    }
    if service::needs_node_ports(svc) {
        for p in svc.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or_default() {
            if let Some(np) = p.node_port.filter(|n| *n != 0) {
                out.insert(port_key(np));
            }
        }
    }
    out
}

struct HeldClaim {
    key: String,
    owner: Option<Owner>,
    revision: i64,
}

async fn all_claims(state: &ApiState) -> Result<Vec<HeldClaim>, StoreError> {
    let mut out = Vec::new();
    for prefix in [IP_CLAIMS, PORT_CLAIMS] {
        for kv in state.store.list(prefix, &ListOptions::default()).await?.items {
            let owner = serde_json::from_slice::<Owner>(&kv.value).ok();
            out.push(HeldClaim { key: kv.key, owner, revision: kv.mod_revision });
        }
    }
    Ok(out)
}

fn older_than_grace(owner: &Option<Owner>) -> bool {
    let Some(at) = owner.as_ref().and_then(|o| o.claimed_at.parse::<jiff::Timestamp>().ok()) else { return true };
    jiff::Timestamp::now().duration_since(at).as_secs() >= CLAIM_GRACE.as_secs() as i64
}

/// Releases the claims of Service `uid` that it no longer uses (`used`), made before `revision`.
async fn release_unused(state: &ApiState, uid: &str, used: &BTreeSet<String>, revision: i64) -> Result<(), StoreError> {
    for c in all_claims(state).await? {
        let mine = c.owner.as_ref().is_some_and(|o| o.uid == uid);
        if mine && c.revision < revision && !used.contains(&c.key) {
            match state.store.delete(&c.key, Some(c.revision)).await {
                Ok(_) | Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// One full pass: claims for every stored Service, and no claim whose owner does not use it.
pub async fn repair(state: &ApiState) -> Result<(), StoreError> {
    let services = state.store.list(&objects::prefix(&SERVICES, None), &ListOptions::default()).await?;
    let mut users: BTreeMap<String, String> = BTreeMap::new();
    for kv in &services.items {
        let Ok(obj) = serde_json::from_slice::<Value>(&kv.value) else { continue };
        let Ok(svc) = serde_json::from_value::<core::Service>(obj.clone()) else { continue };
        let owner = Owner::of(&obj);
        for key in keys_used(&svc) {
            users.insert(key.clone(), owner.uid.clone());
            let value = serde_json::to_vec(&owner).expect("owners serialize");
            match state.store.create(&key, value).await {
                Ok(_) => tracing::info!(%key, service = %owner.name, "re-created a missing service allocation"),
                Err(StoreError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    for c in all_claims(state).await? {
        let owner_uses = c.owner.as_ref().is_some_and(|o| users.get(&c.key) == Some(&o.uid));
        if !owner_uses && c.revision < services.revision && older_than_grace(&c.owner) {
            tracing::info!(key = %c.key, "released a service allocation no Service uses");
            match state.store.delete(&c.key, Some(c.revision)).await {
                Ok(_) | Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Keeps the allocations in step with the Services until the state is dropped: releases what
/// deleted or changed Services no longer use as their writes are seen, and runs [`repair`] at
/// start and every minute.
pub async fn run_repair(state: Weak<ApiState>) {
    loop {
        let Some(s) = state.upgrade() else { return };
        if let Err(e) = repair(&s).await {
            tracing::warn!(error = %e, "repairing service allocations failed");
        }
        let from = match s.store.current_revision().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the store revision failed");
                drop(s);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let watch = s.store.watch(&objects::prefix(&SERVICES, None), from).await;
        drop(s);
        let Ok(mut events) = watch else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let deadline = tokio::time::sleep(REPAIR_INTERVAL);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                ev = events.next() => {
                    let Some(Ok(ev)) = ev else { break };
                    let Some(s) = state.upgrade() else { return };
                    let bytes = match ev.kind {
                        EventKind::Put => ev.value.as_deref(),
                        EventKind::Delete => ev.prev_value.as_deref(),
                    };
                    let Some(obj) = bytes.and_then(|b| serde_json::from_slice::<Value>(b).ok()) else { continue };
                    let uid = Owner::of(&obj).uid;
                    let used = match ev.kind {
                        EventKind::Put => serde_json::from_value::<core::Service>(obj).map(|s| keys_used(&s)).unwrap_or_default(),
                        EventKind::Delete => BTreeSet::new(),
                    };
                    let revision = if ev.kind == EventKind::Delete { i64::MAX } else { ev.revision };
                    if let Err(e) = release_unused(&s, &uid, &used, revision).await {
                        tracing::warn!(error = %e, "releasing service allocations failed");
                    }
                }
            }
        }
    }
}

/// Starts [`run_repair`] for `state` on the current runtime.
pub fn spawn_repair(state: &Arc<ApiState>) {
    tokio::spawn(run_repair(Arc::downgrade(state)));
}

/// The address other components reach this server at: the bind address, or, bound to every
/// address, the source address of the default route (no packet is sent), else loopback.
pub fn advertise_address(bind: IpAddr) -> IpAddr {
    if !bind.is_unspecified() {
        return bind;
    }
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| {
        s.connect("192.0.2.1:9")?;
        s.local_addr()
    });
    match probe {
        Ok(a) if !a.ip().is_loopback() && !a.ip().is_unspecified() => a.ip(),
        _ => IpAddr::V4(Ipv4Addr::LOCALHOST),
    }
}

pub(crate) async fn put(
    state: &ApiState,
    rt: &'static berth_api::ResourceType,
    obj: Value,
    merge: impl Fn(&Value, &mut Value),
) -> ApiResult<()> {
    let name = objects::name(&obj).to_string();
    let namespace = obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
    let key = objects::key(rt, Some(namespace), &name);
    for _ in 0..8 {
        match state.store.get(&key).await.map_err(|e| ApiError::from_store(e, rt, &name))? {
            None => {
                let mut obj = obj.clone();
                let m = objects::meta_mut(&mut obj);
                m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
                m.insert("creationTimestamp".into(), json!(berth_common::time::now_rfc3339()));
                match state.store.create(&key, objects::encode(rt, &obj)).await {
                    Ok(_) => return Ok(()),
                    Err(StoreError::AlreadyExists { .. }) => continue,
                    Err(e) => return Err(ApiError::from_store(e, rt, &name)),
                }
            }
            Some(kv) => {
                let current = objects::decode_kv(rt, &kv)?;
                let mut next = current.clone();
                merge(&obj, &mut next);
                if objects::same_content(&next, &current) {
                    return Ok(());
                }
                match state.store.update(&key, objects::encode(rt, &next), kv.mod_revision).await {
                    Ok(_) => return Ok(()),
                    Err(StoreError::Conflict { .. }) => continue,
                    Err(e) => return Err(ApiError::from_store(e, rt, &name)),
                }
            }
        }
    }
    Err(ApiError::conflict(rt, &name))
}

/// A selectorless Service whose endpoints are this API server's own address (the `kubernetes`
/// Service, the cluster DNS), as `ensure_server_service` keeps it.
struct ServerService {
    namespace: &'static str,
    name: &'static str,
    labels: Value,
    cluster_ip: String,
    /// The Service's ports, each with its `targetPort`.
    ports: Value,
    /// The same ports as the endpoints list them.
    endpoint_ports: Value,
    endpoints_labels: Value,
    slice_labels: Value,
}

/// Creates `svc` if it is missing, renews this server's Lease with `address` for it, and sets its
/// Endpoints and EndpointSlice to the addresses of every live API server on the same store.
async fn ensure_server_service(state: &ApiState, svc: ServerService, address: IpAddr) -> ApiResult<()> {
    let (ns, name) = (svc.namespace, svc.name);
    let key = objects::key(&SERVICES, Some(ns), name);
    if state.store.get(&key).await.map_err(|e| ApiError::from_store(e, &SERVICES, name))?.is_none() {
        let mut obj = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": uuid::Uuid::new_v4().to_string(),
                "creationTimestamp": berth_common::time::now_rfc3339(),
                "labels": svc.labels,
            },
            "spec": {"type": "ClusterIP", "clusterIP": svc.cluster_ip, "ports": svc.ports, "sessionAffinity": "None"},
        });
        berth_api::kinds::prepare_for_create(&SERVICES, &mut obj);
        match allocate(state, &mut obj, None).await {
            Ok(made) => {
                if let Err(e) = state.store.create(&key, objects::encode(&SERVICES, &obj)).await {
                    undo(state, &made).await;
                    if !matches!(e, StoreError::AlreadyExists { .. }) {
                        return Err(ApiError::from_store(e, &SERVICES, name));
                    }
                }
            }
            // Another API server starting at the same time claimed the address for the Service
            // it created.
            Err(e) => {
                if state.store.get(&key).await.map_err(|e| ApiError::from_store(e, &SERVICES, name))?.is_none() {
                    return Err(e);
                }
            }
        }
    }
    // Every live API server's address, this one's included even if its Lease could not be written.
    let ip = address.to_string();
    if let Err(e) = crate::server_leases::renew(state, ns, name, &ip).await {
        tracing::warn!(error = %e.message, service = name, "renewing this API server's lease failed");
    }
    let mut addresses = crate::server_leases::live_addresses(state, ns, name).await?;
    addresses.insert(ip);
    let endpoints = json!({
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": name, "namespace": ns, "labels": svc.endpoints_labels},
        "subsets": [{
            "addresses": addresses.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
            "ports": svc.endpoint_ports,
        }],
    });
    put(state, &ENDPOINTS, endpoints, |want, have| {
        if have.get("subsets") != want.get("subsets") {
            have["subsets"] = want["subsets"].clone();
        }
    })
    .await?;
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": svc.slice_labels},
        "addressType": if address.is_ipv4() { "IPv4" } else { "IPv6" },
        "endpoints": addresses.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>(),
        "ports": svc.endpoint_ports,
    });
    put(state, &ENDPOINTSLICES, slice, |want, have| {
        for field in ["ports", "addressType", "endpoints"] {
            if have.get(field) != want.get(field) {
                have[field] = want[field].clone();
            }
        }
    })
    .await
}

/// Creates the `default/kubernetes` Service (the range's first address, port 443 `https` to the
/// secure port) if it is missing, and puts this server's address into its Endpoints and
/// EndpointSlice, as kube-apiserver's kubernetes-service controller does at start.
pub async fn ensure_kubernetes_service(state: &ApiState, address: IpAddr, secure_port: u16) -> ApiResult<()> {
    let svc = ServerService {
        namespace: "default",
        name: "kubernetes",
        labels: json!({"component": "apiserver", "provider": "kubernetes"}),
        cluster_ip: state.services.kubernetes_ip().to_string(),
        ports: json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": secure_port}]),
        endpoint_ports: json!([{"name": "https", "port": secure_port, "protocol": "TCP"}]),
        endpoints_labels: json!({"endpointslice.kubernetes.io/skip-mirror": "true"}),
        slice_labels: json!({"kubernetes.io/service-name": "kubernetes"}),
    };
    ensure_server_service(state, svc, address).await
}

/// The cluster DNS Service's name in `kube-system`, as kubeadm and e2e tests know it.
pub const CLUSTER_DNS_SERVICE: &str = "kube-dns";

/// Creates `kube-system/kube-dns` (ClusterIP `ip`, port 53 over UDP and TCP, no selector) if it is
/// missing, and points its Endpoints and EndpointSlice at this server's DNS listener
/// (`address:port`), with those of the other live API servers on the same store.
pub async fn ensure_cluster_dns_service(state: &ApiState, ip: Ipv4Addr, address: IpAddr, port: u16) -> ApiResult<()> {
    let svc = ServerService {
        namespace: "kube-system",
        name: CLUSTER_DNS_SERVICE,
        labels: json!({"k8s-app": "kube-dns", "kubernetes.io/name": "berth-dns", "kubernetes.io/cluster-service": "true"}),
        cluster_ip: ip.to_string(),
        ports: json!([
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": port},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": port},
        ]),
        endpoint_ports: json!([
            {"name": "dns", "port": port, "protocol": "UDP"},
            {"name": "dns-tcp", "port": port, "protocol": "TCP"},
        ]),
        endpoints_labels: json!({"k8s-app": "kube-dns", "endpointslice.kubernetes.io/skip-mirror": "true"}),
        slice_labels: json!({
            "kubernetes.io/service-name": CLUSTER_DNS_SERVICE,
            "k8s-app": "kube-dns",
            "endpointslice.kubernetes.io/managed-by": "berth-apiserver",
        }),
    };
    ensure_server_service(state, svc, address).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_read_back_what_was_written() {
        let obj = json!({"metadata": {"name": "a", "namespace": "ns", "uid": "u1"}});
        let o = Owner::of(&obj);
        let back: Owner = serde_json::from_slice(&serde_json::to_vec(&o).unwrap()).unwrap();
        assert_eq!(back, o);
        assert_eq!((back.namespace.as_str(), back.uid.as_str()), ("ns", "u1"));
    }

    #[test]
    fn a_headless_or_external_name_service_uses_no_address() {
        let headless: core::Service =
            serde_json::from_value(json!({"spec": {"clusterIP": "None", "ports": [{"port": 80}]}})).unwrap();
        assert!(keys_used(&headless).is_empty());
        let np: core::Service = serde_json::from_value(
            json!({"spec": {"type": "NodePort", "clusterIP": "10.96.0.9", "ports": [{"port": 80, "nodePort": 30001}]}}),
        )
        .unwrap();
        assert_eq!(
            keys_used(&np).into_iter().collect::<Vec<_>>(),
            ["/registry/berth/serviceips/10.96.0.9", "/registry/berth/servicenodeports/30001"]
        );
    }

    #[test]
    fn binding_to_a_specific_address_advertises_it() {
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(advertise_address(ip), ip);
        assert!(!advertise_address("0.0.0.0".parse().unwrap()).is_unspecified());
    }
}
