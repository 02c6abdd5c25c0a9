//! Writing one pod's status to the API off the worker's path, as kubelet's status manager does:
//! the worker hands over each new status and goes on (the next CRI call does not wait for an
//! API round trip); a task per pod writes the newest one, retries failures with back-off, and
//! skips statuses a newer one replaced before it was written.

use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;

/// Back-off between failed writes: doubling from this, up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(10);

/// The writer of one pod's status; its task stops when this is dropped.
pub struct StatusWriter {
    newest: watch::Sender<Option<(u64, core::PodStatus)>>,
    written: watch::Receiver<u64>,
    sequence: u64,
    task: tokio::task::JoinHandle<()>,
}

impl StatusWriter {
    /// Writes to the status of pod `name` in `namespace`; `pod_ref` names it in logs.
    pub fn spawn(client: kube::Client, namespace: &str, name: &str, pod_ref: String) -> StatusWriter {
        let (newest, mut pending) = watch::channel::<Option<(u64, core::PodStatus)>>(None);
        let (done, written) = watch::channel(0u64);
        let api: Api<core::Pod> = Api::namespaced(client, namespace);
        let name = name.to_string();
        let task = tokio::spawn(async move {
            let mut retry = FIRST_RETRY;
            loop {
                let Some((sequence, status)) = pending.borrow_and_update().clone() else {
                    if pending.changed().await.is_err() {
                        return;
                    }
                    continue;
                };
                let patch = serde_json::json!({ "status": status });
                let written = match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => true,
                    // Gone meanwhile: the watch will say so; nothing more to write.
                    Err(kube::Error::Api(s)) if s.code == 404 => true,
                    Err(e) => {
                        tracing::warn!(pod = %pod_ref, error = %e, retry_in = ?retry, "writing the pod status failed");
                        false
                    }
                };
                if written {
                    tracing::debug!(pod = %pod_ref, phase = ?status.phase, "status written");
                    retry = FIRST_RETRY;
                    let _ = done.send(sequence);
                    if pending.changed().await.is_err() {
                        return;
                    }
                } else {
                    // A newer status cuts the wait short; either way the newest is written next.
                    let _ = tokio::time::timeout(retry, pending.changed()).await;
                    retry = (retry * 2).min(MAX_RETRY);
                }
            }
        });
        StatusWriter { newest, written, sequence: 0, task }
    }

    /// Hands `status` over to be written; returns at once.
    pub fn write(&mut self, status: core::PodStatus) {
        self.sequence += 1;
        self.newest.send_replace(Some((self.sequence, status)));
    }

    /// Waits until everything handed over is written (or the pod is gone), at most `limit`.
    pub async fn flush(&mut self, limit: Duration) -> bool {
        let target = self.sequence;
        tokio::time::timeout(limit, self.written.wait_for(|w| *w >= target)).await.is_ok_and(|r| r.is_ok())
    }
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        self.task.abort();
    }
}
