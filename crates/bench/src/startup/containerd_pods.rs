//! Pods through containerd's CRI, the path a kubelet on containerd takes: RunPodSandbox,
//! CreateContainer and StartContainer of the same busybox `sleep`, timed on the client from the
//! first call to StartContainer's return (containerd 1.6 has no container events to wait for).

use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::cri::client::{CriClient, PodSpec};

/// One pod started; how long it took.
pub async fn start_one(client: &mut CriClient, pod: &PodSpec<'_>) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    client.start_long_running(pod).await.with_context(|| format!("containerd pod {}", pod.name))?;
    Ok(t0.elapsed())
}

/// `pods` started together, each on a connection's clone of its own; how long each took from
/// the common start.
pub async fn start_many(client: &CriClient, pods: &[PodSpec<'_>]) -> anyhow::Result<Vec<Duration>> {
    let t0 = Instant::now();
    let starts = pods.iter().map(|pod| {
        let mut client = client.clone();
        async move {
            client.start_long_running(pod).await.with_context(|| format!("containerd pod {}", pod.name))?;
            anyhow::Ok(t0.elapsed())
        }
    });
    futures::future::join_all(starts).await.into_iter().collect()
}
