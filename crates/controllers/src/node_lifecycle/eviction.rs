//! Per-node reconcile (kube's applier, triggered by changes of the node and of pods bound to
//! it): the node's NoSchedule taints follow its conditions (upstream's
//! `doNoScheduleTaintingPass`), and pods that do not tolerate its NoExecute taints are evicted
//! when [`taints::eviction`] says (upstream's taint-eviction controller). The reconcile comes
//! back when the next tolerated pod's time is up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_events::{Event, Type};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{applier, watcher};

use super::taints::{self, Eviction, NO_EXECUTE};
use super::{Error, Stores};
use crate::Context;

/// After a failed reconcile, the node is tried again this soon.
const RETRY: Duration = Duration::from_secs(1);

/// Pods are keyed by namespace and name.
type PodKey = (String, String);

struct Evictor {
    ctx: Arc<Context>,
    stores: Stores,
    /// Pods whose eviction is set for later: their node and when.
    scheduled: Mutex<HashMap<PodKey, (String, jiff::Timestamp)>>,
    /// NoExecute taints without `timeAdded`, by node, key and value: when first seen.
    first_seen: Mutex<HashMap<(String, String, String), jiff::Timestamp>>,
}

pub async fn run(
    ctx: Arc<Context>,
    stores: Stores,
    triggers: impl Stream<Item = Result<ObjectRef<Node>, watcher::Error>> + Send + 'static,
) {
    let evictor = Arc::new(Evictor {
        ctx,
        stores: stores.clone(),
        scheduled: Mutex::new(HashMap::new()),
        first_seen: Mutex::new(HashMap::new()),
    });
    let error_policy = |_: Arc<Node>, e: &Error, _: Arc<Evictor>| {
        tracing::warn!(error = %e, error_source = ?std::error::Error::source(e), "node lifecycle: node reconcile failed");
        Action::requeue(RETRY)
    };
    applier(
        |node, evictor| Box::pin(reconcile(node, evictor)),
        error_policy,
        evictor,
        stores.nodes.clone(),
        triggers,
        controller::Config::default(),
    )
    .for_each(|result| async move {
        if let Err(e) = result {
            tracing::debug!(error = %e, "node lifecycle: applier");
        }
    })
    .await
}

fn pod_key(pod: &Pod) -> PodKey {
    (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default())
}

async fn reconcile(node: Arc<Node>, ev: Arc<Evictor>) -> Result<Action, Error> {
    let name = node.metadata.name.clone().unwrap_or_default();
    if taints::no_schedule_taints(&node).is_some() {
        super::update_taints(&ev.ctx.client, &name, taints::no_schedule_taints).await?;
    }

    let now = jiff::Timestamp::now();
    let no_execute: Vec<&Taint> = taints::taints(&node).iter().filter(|t| t.effect == NO_EXECUTE).collect();
    let added = ev.added_times(&name, &no_execute, now);
    let timed: Vec<(&Taint, jiff::Timestamp)> = no_execute.iter().copied().zip(added).collect();
    // Without a NoExecute taint no pod is evicted: skip the scan of every pod, which each pod
    // change on the node would otherwise pay for.
    let pods = if no_execute.is_empty() { Vec::new() } else { ev.stores.pods_on(&name) };
    let mut next: Option<jiff::Timestamp> = None;
    let mut later: HashMap<PodKey, jiff::Timestamp> = HashMap::new();
    let mut evicted: Vec<PodKey> = Vec::new();
    for pod in &pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or(&[]);
        match taints::eviction(&timed, tolerations, now) {
            Eviction::Now => {
                ev.evict(pod).await?;
                evicted.push(pod_key(pod));
            }
            Eviction::At(at) => {
                later.insert(pod_key(pod), at);
                next = Some(next.map_or(at, |n| n.min(at)));
            }
            Eviction::Never => {}
        }
    }
    // Evictions set before that no longer hold (taint lifted, toleration changed, pod gone).
    let cancelled: Vec<PodKey> = {
        let mut scheduled = ev.scheduled.lock().unwrap_or_else(|e| e.into_inner());
        let cancelled = scheduled
            .iter()
            .filter(|(k, (n, _))| *n == name && !later.contains_key(*k) && !evicted.contains(k))
            .map(|(k, _)| k.clone())
            .collect();
        // Entries of this node are replaced; those of nodes deleted meanwhile go.
        scheduled.retain(|_, (n, _)| *n != name && ev.stores.nodes.get(&ObjectRef::new(n)).is_some());
        scheduled.extend(later.into_iter().map(|(k, at)| (k, (name.clone(), at))));
        cancelled
    };
    for (ns, pod) in cancelled {
        let still_here =
            pods.iter().find(|p| pod_key(p) == (ns.clone(), pod.clone()) && p.metadata.deletion_timestamp.is_none());
        if let Some(p) = still_here {
            ev.ctx.recorder.emit(Event::about(
                &**p,
                Type::Normal,
                "TaintManagerEviction",
                format!("Cancelling deletion of Pod {ns}/{pod}"),
            ));
        }
    }
    Ok(match next {
        Some(at) => Action::requeue(at.duration_since(now).try_into().unwrap_or(Duration::ZERO)),
        None => Action::await_change(),
    })
}

impl Evictor {
    /// When each taint was added: its `timeAdded`, or when it was first seen without one.
    fn added_times(&self, node: &str, no_execute: &[&Taint], now: jiff::Timestamp) -> Vec<jiff::Timestamp> {
        let mut seen = self.first_seen.lock().unwrap_or_else(|e| e.into_inner());
        let key = |t: &Taint| (node.to_string(), t.key.clone(), t.value.clone().unwrap_or_default());
        let current: Vec<_> = no_execute.iter().filter(|t| t.time_added.is_none()).map(|t| key(t)).collect();
        seen.retain(|k, _| {
            if k.0 == node { current.contains(k) } else { self.stores.nodes.get(&ObjectRef::new(&k.0)).is_some() }
        });
        no_execute
            .iter()
            .map(|t| match &t.time_added {
                Some(at) => at.0,
                None => *seen.entry(key(t)).or_insert(now),
            })
            .collect()
    }

    async fn evict(&self, pod: &Pod) -> Result<(), Error> {
        let (ns, name) = pod_key(pod);
        tracing::info!(pod = name, namespace = ns, node = ?pod.spec.as_ref().and_then(|s| s.node_name.as_deref()), "node lifecycle: evicting a pod that does not tolerate its node's NoExecute taints");
        self.ctx.recorder.emit(Event::about(
            pod,
            Type::Normal,
            "TaintManagerEviction",
            format!("Marking for deletion Pod {ns}/{name}"),
        ));
        let condition =
            super::disruption_condition("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint");
        super::mark_and_delete_pod(&self.ctx.client, pod, Some(condition), false, None).await
    }
}
