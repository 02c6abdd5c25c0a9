//! The EndpointSlice and Endpoints controllers: for every Service with a selector, the
//! EndpointSlices (`kubernetes.io/service-name`, managed by `endpointslice-controller.k8s.io`,
//! owned by the Service) and the Endpoints object listing the pods that match it, as
//! kube-controller-manager's `endpointslice` and `endpoint` controllers keep them.
//!
//! Both are the same shell around [`compute`]: a reflector of Services and the controllers' shared
//! pod cache feed kube's `applier`; a pod change wakes the Services its labels match now and those
//! it matched at its previous change (so a pod whose labels change leaves the old Service), a
//! change to a slice or Endpoints object wakes its Service (so a hand edit is undone). Services
//! without a selector are left alone (their endpoints are someone else's, as the `kubernetes`
//! Service's are the API server's). Slices of a deleted Service go with it through the garbage
//! collector (owner reference); its Endpoints object, which has no owner, is deleted by the
//! Endpoints controller, which also deletes at start the Endpoints of Services deleted while it was
//! not running. Endpoints hold at most 1000 addresses
//! (`endpoints.kubernetes.io/over-capacity: truncated`).

pub mod compute;
pub mod mirroring;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, ReconcileRequest, applier, trigger_self};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::CancelableJoinHandle;
use kube::runtime::{WatchStreamExt, watcher};

use crate::Context;
use crate::pod_cache::PodEvent;
use crate::workloads::{is_already_exists, is_not_found};

/// Services synced at once (`--concurrent-service-endpoint-syncs`, `--concurrent-endpoint-syncs`).
const CONCURRENCY: u16 = 5;
const BACKOFF_BASE: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(100);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {step} for service {service}")]
    Api {
        step: &'static str,
        service: String,
        #[source]
        source: kube::Error,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Slices,
    Endpoints,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Slices => "endpointslice",
            Which::Endpoints => "endpoint",
        }
    }
}

struct Shared {
    ctx: Arc<Context>,
    pods: Store<Pod>,
    which: Which,
    failures: Mutex<HashMap<String, u32>>,
}

/// Runs the EndpointSlice controller until the future is dropped.
pub async fn run_endpoint_slices(ctx: Arc<Context>) {
    run(ctx, Which::Slices).await
}

/// Runs the Endpoints controller until the future is dropped.
pub async fn run_endpoints(ctx: Arc<Context>) {
    run(ctx, Which::Endpoints).await
}

/// The selector of a Service the controllers manage.
fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec.as_ref()?.selector.as_ref().filter(|s| !s.is_empty())
}

fn matches(selector: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    selector.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

fn service_ref(namespace: Option<&str>, name: &str) -> ObjectRef<Service> {
    let r = ObjectRef::new(name);
    match namespace {
        Some(ns) => r.within(ns),
        None => r,
    }
}

async fn run(ctx: Arc<Context>, which: Which) {
    let client = ctx.client.clone();
    let (svc_reader, svc_writer) = reflector::store::<Service>();
    let pod_cache = ctx.pods();

    let deleter = client.clone();
    let svc_stream = watcher(Api::<Service>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(svc_writer)
        .inspect_ok(move |ev| {
            if which == Which::Endpoints
                && let watcher::Event::Delete(svc) = ev
                && selector(svc).is_some()
            {
                let api: Api<Endpoints> = Api::namespaced(deleter.clone(), svc.metadata.namespace.as_deref().unwrap_or(""));
                let name = svc.metadata.name.clone().unwrap_or_default();
                tokio::spawn(async move {
                    if let Err(e) = api.delete(&name, &DeleteParams::default()).await
                        && !is_not_found(&e)
                    {
                        tracing::warn!(service = name, error = %e, "endpoint: cannot delete the endpoints of a deleted service");
                    }
                });
            }
        })
        .touched_objects();

    // Pods wake the Services they match now and matched before.
    let services = svc_reader.clone();
    let pod_stream = pod_cache
        .subscribe()
        .map(move |ev| {
            let services = services.state();
            let matching = |pod: &Pod| {
                services
                    .iter()
                    .filter(|s| {
                        s.metadata.namespace == pod.metadata.namespace
                            && selector(s).is_some_and(|sel| matches(sel, pod))
                    })
                    .map(|s| ObjectRef::from_obj(s.as_ref()))
                    .collect::<HashSet<_>>()
            };
            let wake = match ev {
                PodEvent::Applied { old, new } => {
                    let mut wake = matching(&new);
                    wake.extend(old.map(|old| matching(&old)).unwrap_or_default());
                    wake
                }
                PodEvent::Deleted(pod) => matching(&pod),
                PodEvent::Synced => HashSet::new(),
            };
            futures::stream::iter(wake.into_iter().map(|r| Ok::<_, watcher::Error>(ReconcileRequest::from(r))))
        })
        .flatten();

    // Our own objects wake their Service.
    let owned = match which {
        Which::Slices => {
            let cfg =
                watcher::Config::default().labels(&format!("{}={}", compute::MANAGED_BY_LABEL, compute::MANAGED_BY));
            watcher(Api::<EndpointSlice>::all(client.clone()), cfg)
                .default_backoff()
                .touched_objects()
                .try_filter_map(|s| {
                    let name = s.metadata.labels.as_ref().and_then(|l| l.get(compute::SERVICE_NAME_LABEL)).cloned();
                    let r = name.map(|n| ReconcileRequest::from(service_ref(s.metadata.namespace.as_deref(), &n)));
                    std::future::ready(Ok(r))
                })
                .boxed()
        }
        Which::Endpoints => watcher(Api::<Endpoints>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .touched_objects()
            .map_ok(|e| {
                ReconcileRequest::from(service_ref(
                    e.metadata.namespace.as_deref(),
                    e.metadata.name.as_deref().unwrap_or(""),
                ))
            })
            .boxed(),
    };

    if which == Which::Endpoints {
        tokio::spawn(delete_leftover_endpoints(client.clone()));
    }
    let queue = futures::stream::select_all([trigger_self(svc_stream, ()).boxed(), pod_stream.boxed(), owned]);
    let shared = Arc::new(Shared { pods: pod_cache.store(), ctx, which, failures: Mutex::new(HashMap::new()) });
    let results = applier(
        |svc, shared| CancelableJoinHandle::spawn(reconcile(svc, shared), &tokio::runtime::Handle::current()),
        error_policy,
        shared,
        svc_reader,
        queue,
        ControllerConfig::default().concurrency(CONCURRENCY),
    );
    crate::log_failures(results, which.name()).await
}

/// Annotation of Endpoints used as leader-election locks, which have no Service.
const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// Deletes Endpoints whose Service was deleted while no controller ran (`checkLeftoverEndpoints`),
/// leaving leader-election locks alone. The Endpoints are listed before the Services, so one whose
/// Service is being created meanwhile is kept.
async fn delete_leftover_endpoints(client: kube::Client) {
    let Ok(all) = Api::<Endpoints>::all(client.clone()).list(&ListParams::default()).await else { return };
    let Ok(services) = Api::<Service>::all(client.clone()).list(&ListParams::default()).await else { return };
    let existing: HashSet<(String, String)> = services
        .items
        .iter()
        .map(|s| (s.metadata.namespace.clone().unwrap_or_default(), s.metadata.name.clone().unwrap_or_default()))
        .collect();
    for ep in all.items {
        let ns = ep.metadata.namespace.clone().unwrap_or_default();
        let name = ep.metadata.name.clone().unwrap_or_default();
        let lock = ep.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(LEADER_ANNOTATION));
        if lock || existing.contains(&(ns.clone(), name.clone())) {
            continue;
        }
        let namespaced: Api<Endpoints> = Api::namespaced(client.clone(), &ns);
        match namespaced.delete(&name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(
                endpoints = format!("{ns}/{name}"),
                "endpoint: deleted endpoints left by a deleted service"
            ),
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                tracing::warn!(endpoints = format!("{ns}/{name}"), error = %e, "endpoint: cannot delete leftover endpoints")
            }
        }
    }
}

fn error_policy(svc: Arc<Service>, e: &Error, shared: Arc<Shared>) -> Action {
    let key = crate::workloads::key_of(&svc.metadata);
    let mut failures = shared.failures.lock().unwrap_or_else(|p| p.into_inner());
    let n = failures.entry(key.clone()).or_insert(0);
    let delay = BACKOFF_BASE.saturating_mul(2u32.saturating_pow(*n)).min(BACKOFF_MAX);
    *n = n.saturating_add(1);
    tracing::info!(controller = shared.which.name(), service = key, error = %e, retry_in = ?delay, "sync failed");
    Action::requeue(delay)
}

async fn reconcile(svc: Arc<Service>, shared: Arc<Shared>) -> Result<Action, Error> {
    let Some(sel) = selector(&svc) else { return Ok(Action::await_change()) };
    if svc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = svc.metadata.namespace.clone().unwrap_or_default();
    let pods: Vec<Pod> = shared
        .pods
        .state()
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()) && matches(sel, p))
        .map(|p| p.as_ref().clone())
        .collect();
    match shared.which {
        Which::Slices => sync_slices(&shared.ctx.client, &svc, &pods).await?,
        Which::Endpoints => sync_endpoints(&shared.ctx.client, &svc, &pods).await?,
    }
    shared.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(&crate::workloads::key_of(&svc.metadata));
    Ok(Action::await_change())
}

async fn sync_slices(client: &kube::Client, svc: &Service, pods: &[Pod]) -> Result<(), Error> {
    let ns = svc.metadata.namespace.as_deref().unwrap_or("");
    let name = svc.metadata.name.clone().unwrap_or_default();
    let err = |step| {
        let service = format!("{ns}/{name}");
        move |source| Error::Api { step, service, source }
    };
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let selector =
        format!("{}={name},{}={}", compute::SERVICE_NAME_LABEL, compute::MANAGED_BY_LABEL, compute::MANAGED_BY);
    let existing = api.list(&ListParams::default().labels(&selector)).await.map_err(err("list endpoint slices"))?;
    let desired = compute::desired_slices(svc, pods, compute::MAX_ENDPOINTS_PER_SLICE);
    let plan = compute::plan_slices(svc, desired, &existing.items);
    for s in &plan.update {
        let slice_name = s.metadata.name.clone().unwrap_or_default();
        api.replace(&slice_name, &PostParams::default(), s).await.map_err(err("update an endpoint slice"))?;
    }
    for s in &plan.create {
        api.create(&PostParams::default(), s).await.map_err(err("create an endpoint slice"))?;
    }
    for slice_name in &plan.delete {
        match api.delete(slice_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(err("delete an endpoint slice")(e)),
        }
    }
    Ok(())
}

async fn sync_endpoints(client: &kube::Client, svc: &Service, pods: &[Pod]) -> Result<(), Error> {
    let ns = svc.metadata.namespace.as_deref().unwrap_or("");
    let name = svc.metadata.name.clone().unwrap_or_default();
    let err = |step| {
        let service = format!("{ns}/{name}");
        move |source| Error::Api { step, service, source }
    };
    let api: Api<Endpoints> = Api::namespaced(client.clone(), ns);
    let mut subsets = compute::endpoint_subsets(svc, pods);
    let truncated = compute::truncate_subsets(&mut subsets);
    let labels = compute::endpoints_labels(svc);
    let subsets = Some(subsets).filter(|s| !s.is_empty());
    let labels = Some(labels).filter(|l| !l.is_empty());
    let annotate = |current: Option<&BTreeMap<String, String>>| {
        let mut a = current.cloned().unwrap_or_default();
        if truncated {
            a.insert(compute::OVER_CAPACITY_ANNOTATION.into(), "truncated".into());
        } else {
            a.remove(compute::OVER_CAPACITY_ANNOTATION);
        }
        Some(a).filter(|a| !a.is_empty())
    };
    match api.get_opt(&name).await.map_err(err("read the endpoints"))? {
        Some(mut current) => {
            let annotations = annotate(current.metadata.annotations.as_ref());
            if current.subsets == subsets
                && current.metadata.labels == labels
                && current.metadata.annotations == annotations
            {
                return Ok(());
            }
            current.subsets = subsets;
            current.metadata.labels = labels;
            current.metadata.annotations = annotations;
            api.replace(&name, &PostParams::default(), &current).await.map_err(err("update the endpoints"))?;
        }
        None => {
            let mut ep = Endpoints { subsets, ..Default::default() };
            ep.metadata.name = Some(name.clone());
            ep.metadata.labels = labels;
            ep.metadata.annotations = annotate(None);
            match api.create(&PostParams::default(), &ep).await {
                Ok(_) => {}
                // Created meanwhile: the watch on Endpoints brings us back.
                Err(e) if is_already_exists(&e) => {}
                Err(e) => return Err(err("create the endpoints")(e)),
            }
        }
    }
    Ok(())
}
