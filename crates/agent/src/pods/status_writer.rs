//! Writing one pod's status to the API off the worker's path, as kubelet's status manager does:
//! the worker hands over each new status and goes on (the next CRI call does not wait for an
//! API round trip); a task per pod writes the newest one, retries failures with back-off, and
//! skips statuses a newer one replaced before it was written. A status that only shows the
//! containers about to start waits a moment for the one that shows them started: one write
//! instead of two while the node is busiest.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::{Semaphore, watch};

/// Back-off between failed writes: doubling from this, up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(10);

/// How long a deferred status waits for a newer one before it is written anyway.
pub const DEFER: Duration = Duration::from_millis(200);

/// A status handed over, numbered in order.
#[derive(Clone)]
struct Handed {
    sequence: u64,
    status: core::PodStatus,
    deferred: bool,
}

/// The writer of one pod's status; its task stops when this is dropped.
pub struct StatusWriter {
    newest: watch::Sender<Option<Handed>>,
    written: watch::Receiver<u64>,
    sequence: u64,
    task: tokio::task::JoinHandle<()>,
}

impl StatusWriter {
    /// Writes to the status of pod `name` in `namespace`, one write at a time and while holding
    /// a permit of `limit`; `pod_ref` names it in logs.
    pub fn spawn(
        client: kube::Client,
        limit: Arc<Semaphore>,
        namespace: &str,
        name: &str,
        pod_ref: String,
    ) -> StatusWriter {
        let (newest, mut pending) = watch::channel::<Option<Handed>>(None);
        let (done, written) = watch::channel(0u64);
        let api: Api<core::Pod> = Api::namespaced(client, namespace);
        let name = name.to_string();
        let fut = async move {
            let mut retry = FIRST_RETRY;
            loop {
                let Some(Handed { sequence, status, deferred }) = pending.borrow_and_update().clone() else {
                    if pending.changed().await.is_err() {
                        return;
                    }
                    continue;
                };
                if deferred {
                    match tokio::time::timeout(DEFER, pending.changed()).await {
                        // Replaced (or made urgent) meanwhile: take the newest.
                        Ok(Ok(())) => continue,
                        Ok(Err(_)) => return,
                        Err(_) => {}
                    }
                }
                let patch = serde_json::json!({ "status": status });
                let permit = limit.acquire().await;
                let started = tokio::time::Instant::now();
                // Boxed: the request's future is large, and the task rests most of the time.
                let written = match Box::pin(api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)))
                    .await
                {
                    Ok(_) => true,
                    // Gone meanwhile: the watch will say so; nothing more to write.
                    Err(kube::Error::Api(s)) if s.code == 404 => true,
                    Err(e) => {
                        tracing::warn!(pod = %pod_ref, error = %e, retry_in = ?retry, "writing the pod status failed");
                        false
                    }
                };
                drop(permit);
                if written {
                    tracing::debug!(pod = %pod_ref, phase = ?status.phase, took = ?started.elapsed(), "status written");
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
        };
        let task = tokio::spawn(fut);
        StatusWriter { newest, written, sequence: 0, task }
    }

    /// Hands `status` over to be written; returns at once. A `deferred` status is one the
    /// worker expects to replace soon (the pod's containers are being started): it is written
    /// only if nothing newer comes within [`DEFER`].
    pub fn write(&mut self, status: core::PodStatus, deferred: bool) {
        self.sequence += 1;
        self.newest.send_replace(Some(Handed { sequence: self.sequence, status, deferred }));
    }

    /// Waits until everything handed over is written (or the pod is gone), at most `limit`.
    pub async fn flush(&mut self, limit: Duration) -> bool {
        self.newest.send_if_modified(|h| match h {
            Some(h) if h.deferred => {
                h.deferred = false;
                true
            }
            _ => false,
        });
        let target = self.sequence;
        tokio::time::timeout(limit, self.written.wait_for(|w| *w >= target)).await.is_ok_and(|r| r.is_ok())
    }
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use http_body_util::BodyExt;
    use kube::client::Body;

    use super::*;

    /// A client whose API server records the phase of every status patch and answers with an
    /// empty pod.
    fn recording_client() -> (kube::Client, Arc<Mutex<Vec<String>>>) {
        let phases = Arc::new(Mutex::new(Vec::new()));
        let seen = phases.clone();
        let service = tower::service_fn(move |req: http::Request<Body>| {
            let seen = seen.clone();
            async move {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let patch: serde_json::Value = serde_json::from_slice(&body).unwrap();
                seen.lock().unwrap().push(patch["status"]["phase"].as_str().unwrap_or_default().to_string());
                let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::from(serde_json::to_vec(&pod).unwrap())))
            }
        });
        (kube::Client::new(service, "default"), phases)
    }

    fn phase(p: &str) -> core::PodStatus {
        core::PodStatus { phase: Some(p.into()), ..Default::default() }
    }

    fn writer(client: kube::Client) -> StatusWriter {
        StatusWriter::spawn(client, Arc::new(Semaphore::new(1)), "default", "p", "p_default(u)".into())
    }

    #[tokio::test(start_paused = true)]
    async fn a_deferred_status_replaced_in_time_is_never_written() {
        let (client, phases) = recording_client();
        let mut w = writer(client);
        w.write(phase("Pending"), true);
        tokio::time::sleep(DEFER / 2).await;
        w.write(phase("Running"), false);
        assert!(w.flush(Duration::from_secs(1)).await);
        tokio::time::sleep(DEFER * 2).await;
        assert_eq!(*phases.lock().unwrap(), ["Running"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deferred_status_not_replaced_is_written_after_the_delay() {
        let (client, phases) = recording_client();
        let mut w = writer(client);
        w.write(phase("Pending"), true);
        tokio::time::sleep(DEFER / 2).await;
        assert!(phases.lock().unwrap().is_empty(), "written before the delay");
        tokio::time::sleep(DEFER).await;
        assert_eq!(*phases.lock().unwrap(), ["Pending"]);
    }

    #[tokio::test(start_paused = true)]
    async fn flushing_writes_a_deferred_status_at_once() {
        let (client, phases) = recording_client();
        let mut w = writer(client);
        w.write(phase("Pending"), true);
        let start = tokio::time::Instant::now();
        assert!(w.flush(Duration::from_secs(1)).await);
        assert!(start.elapsed() < DEFER, "flush waited {:?}", start.elapsed());
        assert_eq!(*phases.lock().unwrap(), ["Pending"]);
    }
}
