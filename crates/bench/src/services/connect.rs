//! Part 2: Services created one after another in front of one Ready pod, each timed from its
//! create to the first TCP connect from this host to its ClusterIP that reaches the pod, next to its
//! EndpointSlice (with an endpoint) arriving through a watch.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::stats::Latencies;

const LABEL: &str = "berth-bench-services";
/// The backend pod, and what it answers `GET /hostname` with.
pub const POD: &str = "berth-bench-backend";
/// How often a new connect is started while none has succeeded.
const POLL: Duration = Duration::from_millis(2);
/// How long one connect may wait for its SYN to be answered.
const ATTEMPT: Duration = Duration::from_secs(1);

pub struct Settings {
    pub count: usize,
    pub image: String,
    pub command: Vec<String>,
    pub timeout: Duration,
}

pub struct Figures {
    pub count: usize,
    pub image: String,
    pub pod_ready: Duration,
    /// Create returned → first connect that succeeded.
    pub connect: Latencies,
    /// Create returned → the EndpointSlice seen with an endpoint.
    pub slice: Latencies,
    /// Slice seen → first connect, per Service: the proxy's own part.
    pub after_slice: Latencies,
    pub no_connect: usize,
    pub no_slice: usize,
}

pub async fn run(client: kube::Client, settings: Settings, stop: Arc<AtomicBool>) -> anyhow::Result<Figures> {
    let ns = format!("berth-bench-services-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let body = json!({"metadata": {"name": ns}});
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(body)?)
        .await
        .context("creating the namespace")?;
    let mut created = Vec::new();
    let outcome = measure(&client, &ns, &settings, &stop, &mut created).await;
    clean_up(&client, &ns, &created).await;
    outcome
}

async fn measure(
    client: &kube::Client,
    ns: &str,
    settings: &Settings,
    stop: &AtomicBool,
    created: &mut Vec<String>,
) -> anyhow::Result<Figures> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let pod = json!({
        "metadata": {"name": POD, "labels": {"app": LABEL}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "server",
                "image": settings.image,
                "command": settings.command,
                "ports": [{"containerPort": 8080}],
                // Ready only once it listens, so the first endpoint already answers.
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
            }],
        },
    });
    // Pods are admitted only once the namespace's default ServiceAccount exists.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account = kube::runtime::wait::await_condition(accounts, "default", |a: Option<&ServiceAccount>| a.is_some());
    tokio::time::timeout(Duration::from_secs(30), account)
        .await
        .context("no default ServiceAccount in the namespace within 30 s")??;
    eprintln!("backend pod ({}), waiting for Ready", settings.image);
    let began = Instant::now();
    pods.create(&PostParams::default(), &serde_json::from_value(pod)?).await.context("creating the backend pod")?;
    let ready = kube::runtime::wait::await_condition(pods.clone(), POD, |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()?.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    });
    tokio::time::timeout(Duration::from_secs(300), ready)
        .await
        .context("the backend pod was not Ready within 300 s")??;
    let pod_ready = began.elapsed();

    let slices = SliceWatch::start(Api::namespaced(client.clone(), ns)).await?;
    let mut figures = Figures {
        count: settings.count,
        image: settings.image.clone(),
        pod_ready,
        connect: Latencies::default(),
        slice: Latencies::default(),
        after_slice: Latencies::default(),
        no_connect: 0,
        no_slice: 0,
    };
    eprintln!("{} Services, one after another", settings.count);
    for i in 0..settings.count {
        if stop.load(Ordering::SeqCst) {
            bail!("interrupted");
        }
        let name = format!("svc-{i}");
        let svc = json!({
            "metadata": {"name": name},
            "spec": {"selector": {"app": LABEL}, "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]},
        });
        let svc = services.create(&PostParams::default(), &serde_json::from_value(svc)?).await?;
        let t0 = Instant::now();
        created.push(name.clone());
        let ip: IpAddr = svc
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .context("no clusterIP")?
            .parse()
            .context("the clusterIP")?;
        let connected = first_connect(SocketAddr::new(ip, 80), t0 + settings.timeout).await;
        let seen = slices.seen(&name, t0 + settings.timeout).await;
        match connected {
            Some(at) => figures.connect.record(at - t0),
            None => figures.no_connect += 1,
        }
        match seen {
            Some(at) => figures.slice.record(at.saturating_duration_since(t0)),
            None => figures.no_slice += 1,
        }
        if let (Some(c), Some(s)) = (connected, seen) {
            figures.after_slice.record(c.saturating_duration_since(s));
        }
    }
    slices.task.abort();
    Ok(figures)
}

/// Starts a connect every [`POLL`] until one succeeds (returning when) or `deadline`. Each
/// attempt is a new connection: one sent before the rules were there stays unanswered.
async fn first_connect(addr: SocketAddr, deadline: Instant) -> Option<Instant> {
    let mut attempts = FuturesUnordered::new();
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if Instant::now() >= deadline {
                    return None;
                }
                attempts.push(tokio::time::timeout(ATTEMPT, attempt(addr)));
            }
            Some(attempt) = attempts.next(), if !attempts.is_empty() => {
                if let Ok(Some(connected)) = attempt {
                    return Some(connected);
                }
            }
        }
    }
}

/// One connection: when its connect returned, if the backend (by its name) answered on it.
/// The name matters: a connect that misses the rules may still be accepted upstream (a NAT
/// gateway's proxy), by something that is not the pod.
async fn attempt(addr: SocketAddr) -> Option<Instant> {
    let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
    let connected = Instant::now();
    conn.write_all(b"GET /hostname HTTP/1.0\r\n\r\n").await.ok()?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.ok()?;
    String::from_utf8_lossy(&answer).contains(POD).then_some(connected)
}

/// When each Service's EndpointSlice was first seen with an endpoint, by one watch on the
/// namespace.
struct SliceWatch {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SliceWatch {
    /// Returns once the watch has listed, so no slice is seen late.
    async fn start(api: Api<EndpointSlice>) -> anyhow::Result<Self> {
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                let stream = watcher::watcher(api, watcher::Config::default());
                futures::pin_mut!(stream);
                let mut listed_tx = Some(listed_tx);
                while let Some(event) = stream.next().await {
                    let at = Instant::now();
                    match event {
                        Ok(Event::Apply(s) | Event::InitApply(s)) => {
                            let service = s.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name"));
                            let has_endpoint = s.endpoints.iter().any(|e| !e.addresses.is_empty());
                            if let (Some(service), true) = (service, has_endpoint) {
                                seen.lock().unwrap().entry(service.clone()).or_insert(at);
                            }
                        }
                        Ok(Event::InitDone) => {
                            if let Some(l) = listed_tx.take() {
                                let _ = l.send(());
                            }
                        }
                        Ok(_) => {}
                        Err(e) => eprintln!("EndpointSlice watch: {e}; retrying"),
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), listed)
            .await
            .context("the EndpointSlice watch did not list within 30 s")?
            .context("the EndpointSlice watch ended")?;
        Ok(Self { seen, task })
    }

    async fn seen(&self, service: &str, deadline: Instant) -> Option<Instant> {
        loop {
            if let Some(at) = self.seen.lock().unwrap().get(service) {
                return Some(*at);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Deletes what the run created, then its namespace, and waits (a while) for them to go.
async fn clean_up(client: &kube::Client, ns: &str, services: &[String]) {
    let svc_api: Api<Service> = Api::namespaced(client.clone(), ns);
    for name in services {
        if let Err(e) = svc_api.delete(name, &DeleteParams::default()).await {
            eprintln!("deleting Service {ns}/{name}: {e}");
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    match pods.delete(POD, &DeleteParams::default()).await {
        Ok(_) => {
            let gone = kube::runtime::wait::await_condition(pods, POD, |o: Option<&_>| o.is_none());
            if tokio::time::timeout(Duration::from_secs(60), gone).await.is_err() {
                eprintln!("pod {ns}/{POD} still there after 60 s");
            }
        }
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => eprintln!("deleting pod {ns}/{POD}: {e}"),
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.delete(ns, &DeleteParams::default()).await {
        Ok(_) => {
            let gone = kube::runtime::wait::await_condition(namespaces, ns, |o: Option<&_>| o.is_none());
            if tokio::time::timeout(Duration::from_secs(60), gone).await.is_err() {
                eprintln!("namespace {ns} still there after 60 s");
            }
        }
        Err(e) => eprintln!("deleting namespace {ns}: {e}"),
    }
}
