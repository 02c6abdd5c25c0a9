//! What the bench sees of a run from outside the hollow nodes: its own cluster-wide watch of
//! the pods (first seen, bound, Running), single-object GETs of random pods, and timed lists of
//! all pods.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::calls::{ApiCalls, Call};

/// How often the sampler GETs a random pod.
pub const GET_EVERY: Duration = Duration::from_millis(100);

/// When the bench's watch first saw each pod, saw it bound, and saw it Running.
#[derive(Default)]
pub struct PodTimes {
    pub seen: HashMap<String, Instant>,
    pub bound: HashMap<String, Instant>,
    pub running: HashMap<String, Instant>,
    /// The pods' names in the order first seen, for the sampler's random picks.
    pub names: Vec<String>,
}

/// Counts of what the watch saw, for the run's progress.
#[derive(Default)]
pub struct Counts {
    ready: AtomicBool,
    seen: AtomicUsize,
    bound: AtomicUsize,
    running: AtomicUsize,
    /// Errors the watch returned (each followed by a retry after back-off).
    pub errors: AtomicU64,
}

/// The bench's watch of the pods of `namespace`, and what it saw.
pub struct PodWatch {
    pub times: Arc<Mutex<PodTimes>>,
    pub counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    pub fn start(client: kube::Client, namespace: &str) -> Self {
        let times: Arc<Mutex<PodTimes>> = Arc::default();
        let counts: Arc<Counts> = Arc::default();
        let api: Api<Pod> = Api::namespaced(client, namespace);
        let events = watcher(api, watcher::Config::default()).default_backoff();
        let (t, c) = (times.clone(), counts.clone());
        let task = tokio::spawn(async move {
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                let pod = match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
                    Ok(watcher::Event::InitDone) => {
                        c.ready.store(true, Ordering::SeqCst);
                        continue;
                    }
                    Ok(_) => continue,
                    Err(_) => {
                        c.errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                let at = Instant::now();
                let Some(name) = pod.metadata.name else { continue };
                let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
                let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                let mut times = t.lock().unwrap();
                if !times.seen.contains_key(&name) {
                    times.seen.insert(name.clone(), at);
                    times.names.push(name.clone());
                    c.seen.fetch_add(1, Ordering::SeqCst);
                }
                if bound && !times.bound.contains_key(&name) {
                    times.bound.insert(name.clone(), at);
                    c.bound.fetch_add(1, Ordering::SeqCst);
                }
                if running && !times.running.contains_key(&name) {
                    times.running.insert(name, at);
                    c.running.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        Self { times, counts, task }
    }

    /// Whether the watch has delivered its initial list.
    pub fn ready(&self) -> bool {
        self.counts.ready.load(Ordering::SeqCst)
    }

    /// Pods seen, bound and Running so far.
    pub fn counts(&self) -> (usize, usize, usize) {
        let c = &self.counts;
        (c.seen.load(Ordering::SeqCst), c.bound.load(Ordering::SeqCst), c.running.load(Ordering::SeqCst))
    }

    pub fn errors(&self) -> u64 {
        self.counts.errors.load(Ordering::Relaxed)
    }

    /// Stops the watch and hands over what it saw.
    pub fn stop(self) -> PodTimes {
        self.task.abort();
        std::mem::take(&mut *self.times.lock().unwrap())
    }
}

/// GETs a random pod the watch has seen every [`GET_EVERY`] until aborted.
pub fn sample_gets(
    client: kube::Client,
    namespace: &str,
    times: Arc<Mutex<PodTimes>>,
    calls: Arc<ApiCalls>,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(GET_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let name = {
                let times = times.lock().unwrap();
                if times.names.is_empty() {
                    continue;
                }
                times.names[fastrand::usize(..times.names.len())].clone()
            };
            let t0 = Instant::now();
            let got = api.get(&name).await;
            calls.record(Call::GetPod, t0.elapsed(), got.as_ref().err());
        }
    })
}

/// One timed list of all pods of the cluster.
#[derive(Clone, Debug)]
pub struct Listing {
    /// Since the Deployments were created.
    pub at: Duration,
    pub took: Duration,
    pub pods: Option<usize>,
    pub bytes: usize,
    pub error: Option<String>,
}

/// The number of items of a list's body, counted without building them (a list of 150,000
/// pods is hundreds of MiB of JSON; its values would be several times that).
pub fn count_items(body: &str) -> Option<usize> {
    use k8s_openapi::serde::Deserializer as _;
    use k8s_openapi::serde::de::{IgnoredAny, MapAccess, Visitor};

    struct Items;
    impl<'de> Visitor<'de> for Items {
        type Value = Option<usize>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut items = None;
            while let Some(key) = map.next_key::<String>()? {
                if key == "items" {
                    items = Some(map.next_value::<Vec<IgnoredAny>>()?.len());
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(items)
        }
    }
    serde_json::Deserializer::from_str(body).deserialize_map(Items).ok().flatten()
}

/// `GET /api/v1/pods` without a limit, timed until the whole body is in; then its items are
/// counted (not timed: the bench's decoding is not the server's cost).
pub async fn list_all_pods(client: &kube::Client, calls: &ApiCalls, origin: Instant) -> Listing {
    let at = origin.elapsed();
    let request = http::Request::get("/api/v1/pods").body(Vec::new()).expect("a valid request");
    let t0 = Instant::now();
    let body = client.request_text(request).await;
    let took = t0.elapsed();
    calls.record(Call::ListPods, took, body.as_ref().err());
    match body {
        Ok(text) => Listing { at, took, pods: count_items(&text), bytes: text.len(), error: None },
        Err(e) => Listing { at, took, pods: None, bytes: 0, error: Some(format!("{e}")) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_items_of_a_list_are_counted_without_their_values() {
        let body = r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"a"}},{"spec":{"x":[1,2]}}]}"#;
        assert_eq!(count_items(body), Some(2));
        assert_eq!(count_items(r#"{"kind":"PodList","items":[]}"#), Some(0));
        assert_eq!(count_items(r#"{"kind":"Status"}"#), None);
        assert_eq!(count_items("not json"), None);
    }
}
