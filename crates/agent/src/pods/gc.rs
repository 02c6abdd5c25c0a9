//! Garbage collection across the node: sandboxes and containers of pods that have no worker
//! (deleted while nobody looked) are handed to an orphan worker, and images are removed by disk
//! thresholds — unused `(image, handler)` tuples, oldest use first, through `RemoveImage` with
//! the handler (seed `003_…`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::mpsc;

use super::cri;
use super::images::{self, StoredImage, UsageRecord};
use super::labels;
use super::mount;
use super::worker::Context;
use crate::endpoint::Endpoint;

/// How often containers and sandboxes are checked (kubelet: every minute).
pub const CONTAINER_GC_PERIOD: Duration = Duration::from_secs(60);
/// How often image usage is checked (kubelet: every five minutes).
pub const IMAGE_GC_PERIOD: Duration = Duration::from_secs(300);
/// An image unused for less than this is kept (kubelet's `--minimum-image-ttl-duration`).
pub const MIN_IMAGE_AGE: jiff::SignedDuration = jiff::SignedDuration::from_secs(120);

/// A pod found in a runtime: its UID and, from the labels, its name and namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub endpoint: String,
}

/// Every pod of this node with a sandbox or container in any endpoint, by the standard labels
/// (and berth's node label: another agent's pods in a shared runtime are not ours). Each endpoint
/// listed counts as inventoried; one that cannot be listed is skipped (see [`inventory_late`]).
pub async fn pods_in_runtimes(ctx: &Context) -> HashMap<String, Found> {
    let mut found = HashMap::new();
    for (ep, _) in ctx.runtimes.endpoints() {
        match pods_in(ctx, &ep).await {
            Ok(pods) => {
                ctx.runtimes.mark_inventoried(&ep);
                for f in pods {
                    found.entry(f.uid.clone()).or_insert(f);
                }
            }
            Err(e) => {
                tracing::warn!(endpoint = %ep.name, error = %berth_common::error::error_chain(&e), "cannot list the endpoint's pods")
            }
        }
    }
    found
}

/// The pods of this node with a sandbox or container on `ep`.
async fn pods_in(ctx: &Context, ep: &Endpoint) -> Result<Vec<Found>, cri::CriError> {
    let sandboxes = cri::node_sandboxes(ep, &ctx.node_name).await?;
    let containers = cri::node_containers(ep, &ctx.node_name).await?;
    let labelled = sandboxes.iter().map(|s| &s.labels).chain(containers.iter().map(|c| &c.labels));
    let mut found: Vec<Found> = Vec::new();
    for l in labelled {
        let Some(uid) = labels::pod_uid(l) else { continue };
        if !found.iter().any(|f| f.uid == uid) {
            found.push(Found {
                uid: uid.to_string(),
                name: l.get(labels::POD_NAME).cloned().unwrap_or_default(),
                namespace: l.get(labels::POD_NAMESPACE).cloned().unwrap_or_default(),
                endpoint: ep.name.clone(),
            });
        }
    }
    Ok(found)
}

/// Lists the pods of endpoints that could not be listed before (unreachable when the agent
/// started, or configured since) as soon as they answer: their pods go into the pod cache, so
/// that workers waiting for them adopt their sandboxes instead of starting the pods elsewhere,
/// and to `orphans`, so those the API no longer has are torn down.
pub async fn inventory_late(ctx: Arc<Context>, orphans: mpsc::Sender<Vec<Found>>) {
    let mut changes = ctx.runtimes.changes();
    loop {
        let statuses = ctx.runtimes.endpoints();
        for ep in ctx.runtimes.uninventoried() {
            let ready = statuses.iter().any(|(e, s)| e.same_runtime(&ep) && s.ready);
            if !ready {
                continue;
            }
            let pods = match pods_in(&ctx, &ep).await {
                Ok(pods) => pods,
                Err(e) => {
                    tracing::warn!(endpoint = %ep.name, error = %berth_common::error::error_chain(&e), "cannot list the endpoint's pods");
                    continue;
                }
            };
            for f in &pods {
                match ctx.runtimes.endpoint_name_of(&f.uid) {
                    None => ctx.runtimes.remember(&f.uid, &f.endpoint),
                    Some(other) if other != f.endpoint => {
                        tracing::warn!(pod = %f.name, namespace = %f.namespace, uid = %f.uid, endpoint = %f.endpoint, other, "pod found on two runtimes")
                    }
                    Some(_) => {}
                }
            }
            tracing::info!(endpoint = %ep.name, pods = pods.len(), "listed the pods of a runtime that answered late");
            ctx.runtimes.mark_inventoried(&ep);
            if orphans.send(pods).await.is_err() {
                return;
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// Every [`CONTAINER_GC_PERIOD`], sends the pods found in runtimes to `orphans`; the supervisor
/// starts a teardown for those it has no worker for.
pub async fn find_orphans(ctx: Arc<Context>, orphans: mpsc::Sender<Vec<Found>>) {
    loop {
        tokio::time::sleep(CONTAINER_GC_PERIOD).await;
        let found: Vec<Found> = pods_in_runtimes(&ctx).await.into_values().collect();
        if orphans.send(found).await.is_err() {
            return;
        }
    }
}

/// Image GC for every endpoint, every [`IMAGE_GC_PERIOD`], with the thresholds `thresholds()`
/// gives at that moment (they follow the agent's configuration).
pub async fn collect_images(ctx: Arc<Context>, thresholds: impl Fn() -> (u8, u8) + Send) {
    let mut records: HashMap<String, UsageRecord> = HashMap::new();
    loop {
        let (high, low) = thresholds();
        for (ep, status) in ctx.runtimes.endpoints() {
            if !status.ready {
                continue;
            }
            let record = records.entry(ep.name.clone()).or_default();
            if let Err(e) = collect_endpoint_images(&ep, record, high, low).await {
                tracing::warn!(endpoint = %ep.name, error = %berth_common::error::error_chain(&e), "image garbage collection failed");
            }
        }
        let names: HashSet<String> = ctx.runtimes.endpoints().into_iter().map(|(e, _)| e.name.clone()).collect();
        records.retain(|name, _| names.contains(name));
        tokio::time::sleep(IMAGE_GC_PERIOD).await;
    }
}

async fn collect_endpoint_images(
    ep: &crate::endpoint::Endpoint,
    record: &mut UsageRecord,
    high: u8,
    low: u8,
) -> Result<(), cri::CriError> {
    let stored: Vec<StoredImage> = cri::list_images(ep)
        .await?
        .into_iter()
        .map(|i| StoredImage {
            handler: i.spec.as_ref().map(|s| s.runtime_handler.clone()).unwrap_or_default(),
            id: i.id,
            size: i.size,
            pinned: i.pinned,
        })
        .collect();
    let in_use: Vec<(String, String)> = cri::list_containers(ep, None)
        .await?
        .into_iter()
        .map(|c| {
            let id = if c.image_id.is_empty() { c.image_ref.clone() } else { c.image_id.clone() };
            (id, c.image.map(|i| i.runtime_handler).unwrap_or_default())
        })
        .collect();
    let now = Timestamp::now();
    record.observe(&stored, &in_use, now);
    let info = cri::image_fs_info(ep).await?;
    let Some(mountpoint) = info.image_filesystems.first().and_then(|f| f.fs_id.as_ref()).map(|f| f.mountpoint.clone())
    else {
        return Ok(());
    };
    let fs = match mount::filesystem_usage(std::path::Path::new(&mountpoint)) {
        Ok(fs) => fs,
        Err(e) => {
            // A runtime on another machine, or a path we cannot see: nothing to measure.
            tracing::debug!(endpoint = %ep.name, mountpoint, error = %e, "image filesystem not measurable");
            return Ok(());
        }
    };
    let thresholds = images::Thresholds { high, low, min_age: MIN_IMAGE_AGE };
    let doomed = images::to_collect(&stored, &in_use, record, fs, thresholds, now);
    if doomed.is_empty() {
        return Ok(());
    }
    tracing::info!(endpoint = %ep.name, usage = fs.used_percent(), high, low, images = doomed.len(), "image garbage collection");
    for image in doomed {
        match cri::remove_image(ep, &image.id, &image.handler).await {
            Ok(()) => {
                tracing::info!(endpoint = %ep.name, image = %image.id, handler = %image.handler, size = image.size, "image removed")
            }
            Err(e) => {
                tracing::warn!(endpoint = %ep.name, image = %image.id, handler = %image.handler, error = %berth_common::error::error_chain(&e), "image not removed")
            }
        }
    }
    Ok(())
}
