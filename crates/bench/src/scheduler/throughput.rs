//! When each pod was created and when the bench's watch first saw it bound, the per-interval
//! samples of bound pods, and scheduler_perf's SchedulingThroughput computed from them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};

use super::objects::pod_index;
use crate::stats::Latencies;

/// How long the bound count may stand still, with pods still unbound, before the run fails.
const STALL: Duration = Duration::from_secs(60);
/// How often the bound count is looked at between samples.
const POLL: Duration = Duration::from_millis(5);

/// Create and bind times of pods `0..total`, filled by the creators and the watch.
pub struct Tracker {
    total: usize,
    created: Mutex<Vec<Option<Instant>>>,
    bound: Mutex<Vec<Option<Instant>>>,
    count: AtomicUsize,
}

impl Tracker {
    pub fn new(total: usize) -> Arc<Self> {
        Arc::new(Self {
            total,
            created: Mutex::new(vec![None; total]),
            bound: Mutex::new(vec![None; total]),
            count: AtomicUsize::new(0),
        })
    }

    /// Pod `i`'s create request is about to be sent.
    pub fn created(&self, i: usize) {
        self.created.lock().unwrap()[i] = Some(Instant::now());
    }

    fn bound(&self, i: usize, at: Instant) {
        let mut bound = self.bound.lock().unwrap();
        if i < self.total && bound[i].is_none() {
            bound[i] = Some(at);
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Create → bound seen, of every pod with both.
    pub fn latencies(&self) -> Latencies {
        let (created, bound) = (self.created.lock().unwrap(), self.bound.lock().unwrap());
        let mut lat = Latencies::default();
        for (c, b) in created.iter().zip(bound.iter()) {
            if let (Some(c), Some(b)) = (c, b) {
                lat.record(b.saturating_duration_since(*c));
            }
        }
        lat
    }

    /// The first and the last bind seen.
    pub fn bind_window(&self) -> Option<(Instant, Instant)> {
        let bound = self.bound.lock().unwrap();
        let times = bound.iter().flatten();
        Some((*times.clone().min()?, *times.max()?))
    }

    /// Samples the bound count every `interval` from now until all `total` pods are bound (the
    /// partial interval in which the last one is bound is not sampled, as scheduler_perf stops
    /// its collector once the pods are scheduled); fails if the count stands still for [`STALL`]
    /// or the watch fails.
    pub async fn sample(&self, watch: &mut BindWatch, interval: Duration) -> anyhow::Result<Vec<Sample>> {
        let start = Instant::now();
        let mut next = start + interval;
        let mut samples = Vec::new();
        let (mut last_count, mut last_change) = (self.count(), start);
        loop {
            tokio::time::sleep(POLL).await;
            let (now, count) = (Instant::now(), self.count());
            if count >= self.total {
                return Ok(samples);
            }
            if watch.reader.is_finished() {
                match (&mut watch.reader).await {
                    Ok(Err(e)) => return Err(e.context("the bench's watch of the pods failed")),
                    Ok(Ok(())) => bail!("the bench's watch of the pods ended early"),
                    Err(e) => bail!("the bench's watch of the pods panicked: {e}"),
                }
            }
            if now >= next {
                samples.push(Sample { at: now - start, bound: count });
                next += interval;
            }
            if count != last_count {
                (last_count, last_change) = (count, now);
            } else if now - last_change > STALL {
                bail!("{count} of {} pods bound, none more for {STALL:?}", self.total);
            }
        }
    }
}

/// Pods bound at `at` after sampling began.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub at: Duration,
    pub bound: usize,
}

/// scheduler_perf's throughput collector over samples taken every interval: the first sample
/// with pods bound only starts the count (sampling and creating began independently); an
/// interval without a new bind is not a sample of 0 pods/s but is merged into the next one that
/// has binds, whose rate is then recorded once per merged interval; the interval in which the
/// last pod is bound ends the run and is not sampled. Rates use the actual sample times.
pub fn scheduling_throughput(samples: &[Sample]) -> Vec<f64> {
    let mut out = Vec::new();
    let mut last: Option<Sample> = None;
    let mut skipped = 0;
    for s in samples.iter().filter(|s| s.bound > 0) {
        let Some(prev) = last else {
            last = Some(*s);
            continue;
        };
        let new = s.bound - prev.bound;
        if new == 0 {
            skipped += 1;
            continue;
        }
        let rate = new as f64 / (s.at - prev.at).as_secs_f64();
        out.extend(std::iter::repeat_n(rate, skipped + 1));
        skipped = 0;
        last = Some(*s);
    }
    out
}

pub fn average(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// The bench's watch of one namespace's pods, marking each pod bound when it first shows a
/// `spec.nodeName`. Restarted where it left off when the server ends it.
pub struct BindWatch {
    reader: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl BindWatch {
    pub async fn start(api: Api<Pod>, tracker: Arc<Tracker>) -> anyhow::Result<Self> {
        let mut rv = api.list(&ListParams::default().limit(1)).await?.metadata.resource_version.unwrap_or_default();
        let reader = tokio::spawn(async move {
            while tracker.count() < tracker.total {
                let events = api.watch(&WatchParams::default().timeout(290), &rv).await.context("watching pods")?;
                futures::pin_mut!(events);
                while let Some(event) = events.try_next().await? {
                    let pod = match event {
                        WatchEvent::Added(pod) | WatchEvent::Modified(pod) => pod,
                        WatchEvent::Deleted(_) => continue,
                        WatchEvent::Bookmark(b) => {
                            rv = b.metadata.resource_version;
                            continue;
                        }
                        WatchEvent::Error(e) => bail!("watch error: {} ({})", e.message, e.code),
                    };
                    let at = Instant::now();
                    if let Some(v) = &pod.metadata.resource_version {
                        rv.clone_from(v);
                    }
                    let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
                    if on_node && let Some(i) = pod.metadata.name.as_deref().and_then(pod_index) {
                        tracker.bound(i, at);
                    }
                    if tracker.count() >= tracker.total {
                        break;
                    }
                }
            }
            Ok(())
        });
        Ok(Self { reader })
    }
}

impl Drop for BindWatch {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(counts: &[(u64, usize)]) -> Vec<Sample> {
        counts.iter().map(|&(ms, bound)| Sample { at: Duration::from_millis(ms), bound }).collect()
    }

    #[test]
    fn the_first_sample_with_binds_only_starts_the_count() {
        let s = samples(&[(1000, 0), (2000, 500), (3000, 3500), (4000, 6500)]);
        assert_eq!(scheduling_throughput(&s), vec![3000.0, 3000.0]);
    }

    #[test]
    fn intervals_without_binds_are_merged_into_the_next_and_counted_once_each() {
        let s = samples(&[(1000, 10), (2000, 10), (3000, 10), (4000, 310)]);
        assert_eq!(scheduling_throughput(&s), vec![100.0, 100.0, 100.0]);
    }

    #[test]
    fn rates_use_the_actual_sample_times() {
        let s = samples(&[(1000, 100), (2500, 1600)]);
        assert_eq!(scheduling_throughput(&s), vec![1000.0]);
        assert_eq!(average(&[1.0, 3.0]), Some(2.0));
        assert_eq!(average(&[]), None);
    }
}
