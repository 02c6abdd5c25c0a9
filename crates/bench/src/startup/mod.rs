//! `berth-bench startup`: how fast a pod starts on the cluster a user gets from `berth up`, per
//! handler (runc, crun, gVisor), next to the floor and to containerd 1.6's CRI path, all in the
//! same run; and the memory of the whole `berth up` tree.
//!
//! The bench starts everything it measures: a loopback registry with busybox and pause, its own
//! `berth up` cluster (data dir, ports, runtime socket, bridge and pod range of this run, no
//! `nodeName` in any pod: the scheduler places them) and containerd with its own bridge. Per
//! handler it runs three shapes, each through the API and through containerd's CRI:
//!
//! - **one at a time**: pod by pod, one floor sample (`runc run` / `crun run` / `runsc run` of
//!   the same busybox rootfs, plus one CNI ADD of the same plugins), one pod through the API
//!   (create → Running seen by a watch) and one containerd pod (RunPodSandbox + CreateContainer +
//!   StartContainer), the last two swapping places every other time so both see the same load;
//! - **10 at a time**: waves of 10 pods created together, each pod timed from its own create;
//! - **a burst**: a Deployment of 100 replicas created at once (each pod timed from the
//!   Deployment's create, and from its own creation as the watch first sees it), 100 floor
//!   samples 10 at a time (the most starts per second the raw runtime and CNI give here, which
//!   bounds how soon the last of 100 pods created together can run), and 100 containerd pods
//!   started at once.
//!
//! Pods of a shape keep running until it ends, then all are deleted before the next. The memory
//! of the tree (supervisor, server, runtime, agent; container monitors and infra processes
//! listed apart) is read idle before any pod and with the one-at-a-time runc pods running, as
//! VmRSS and as PSS: every berth process maps the one `berth` binary, whose shared pages VmRSS
//! counts again in each process, so the tree's own footprint is its processes' PSS summed.
//!
//! Figures are printed (and written as JSON with `--json`), never asserted. Everything started is
//! stopped and removed again, also when a step fails.

mod api_pods;
mod cluster;
mod containerd_pods;
mod report;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use berth_testenv::Containerd;
use berth_testenv::containerd::SANDBOX_IMAGE;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use self::api_pods::StartWatch;
use self::cluster::UpCluster;
use self::report::{FloorBurst, HandlerResult, Report, Shape};
use crate::cri::client::{self, CriClient, PodSpec};
use crate::cri::daemons::{self, CONTAINERD_NETWORK};
use crate::cri::floor;
use crate::cri::net::{self, CniFloor, HostState, Netns, Network};
use crate::stats::Latencies;

/// The bridge and pod range of the bench's `berth up` cluster, apart from a user's (`berth0`,
/// `10.88.0.0/16`) and from the other benches'.
const UP_NETWORK: Network = Network { name: "berth-bench-up", bridge: "benchup0", subnet: "10.199.0.0/22" };
/// The floor's own bridge: its addresses never collide with the cluster's.
const FLOOR_NETWORK: Network = Network { name: "berth-bench-floor", bridge: "benchflr0", subnet: "10.198.0.0/24" };
/// The namespace of the bench's pods.
const NAMESPACE: &str = "berth-bench";

#[derive(clap::Args)]
pub struct StartupArgs {
    /// Pods per handler in the one-at-a-time and the 10-at-a-time shapes (and floor samples).
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Pods started together in the second shape.
    #[arg(long, default_value_t = 10)]
    wave: usize,
    /// Replicas of the burst's Deployment (and containerd pods started at once).
    #[arg(long, default_value_t = 100)]
    burst: usize,
    /// Handlers to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "runc,crun,gvisor")]
    handlers: Vec<String>,
    /// Unrecorded pods of each kind per handler before the measured ones.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Seconds the tree is left alone before its memory is read; the last 6 s are sampled.
    #[arg(long, default_value_t = 12)]
    settle: u64,
    /// Skip containerd (the peer): only berth and the floor.
    #[arg(long)]
    no_containerd: bool,
    /// Keep the run directory (the cluster's logs) instead of removing it.
    #[arg(long)]
    keep_dir: bool,
    /// The `berth` binary (with `berth-monitor` next to it); default: next to this binary.
    #[arg(long)]
    berth_binary: Option<PathBuf>,
    #[arg(long, default_value = "/usr/bin/containerd")]
    containerd: PathBuf,
    /// Also write the figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// What the run set up, torn down in reverse whatever happened in between.
struct Session {
    dir: tempfile::TempDir,
    cluster: Option<UpCluster>,
    containerd: Option<(Containerd, CriClient)>,
}

impl Session {
    async fn tear_down(mut self, keep_dir: bool) {
        if let Some(cluster) = self.cluster.take() {
            cluster.tear_down().await;
        }
        if let Some((mut ctd, mut client)) = self.containerd.take() {
            match client.remove_all().await {
                Ok(0) => {}
                Ok(n) => eprintln!("removed {n} pod(s) left in containerd"),
                Err(e) => eprintln!("removing the pods left in containerd failed: {e:#}"),
            }
            ctd.stop();
        }
        daemons::unmount_under(self.dir.path());
        if keep_dir {
            let kept = self.dir.keep();
            eprintln!("run directory kept: {}", kept.display());
        }
    }
}

pub async fn run(args: StartupArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    ensure!(args.pods > 0 && args.wave > 0 && args.burst > 0, "--pods, --wave and --burst must be positive");
    ensure!(!args.handlers.is_empty(), "--handlers names none");
    crate::cri::check_handlers(&args.handlers)?;
    ensure!(args.pods.max(args.burst) + args.warmup < 250, "the containerd network is a /24: at most 249 pods at once");
    let berth_binary = match &args.berth_binary {
        Some(p) => p.clone(),
        None => crate::cri::default_berth_binary()?,
    };
    let mut networks = vec![&UP_NETWORK, &FLOOR_NETWORK];
    if !args.no_containerd {
        networks.push(&CONTAINERD_NETWORK);
    }
    let host = HostState::take(&networks)?;
    let dir = tempfile::Builder::new().prefix("berth-bench-startup.").tempdir()?;
    eprintln!("run directory {}", dir.path().display());
    let mut session = Session { dir, cluster: None, containerd: None };
    let result = measure(&args, &berth_binary, &mut session).await;
    session.tear_down(args.keep_dir).await;
    drop(host);
    let report = result?;
    report.print();
    crate::finish_run(args.json.as_deref(), || report.to_json(), started)
}

async fn measure(args: &StartupArgs, berth_binary: &Path, session: &mut Session) -> anyhow::Result<Report> {
    let root = session.dir.path().to_owned();
    let (registry, image) = crate::cri::registry_with_busybox_and_pause().await?;

    // The floor first: its helpers fail on a broken host before anything holds pods.
    let floor_dir = root.join("floor");
    let bundle = floor::write_bundle(&floor_dir)?;

    eprintln!("berth up ({})", berth_binary.display());
    let up_started = Instant::now();
    let cluster = session.cluster.insert(UpCluster::start(berth_binary, &root.join("up"), &UP_NETWORK).await?);
    let up_took = up_started.elapsed();
    eprintln!("  node Ready {:.1} s after `berth up` began", up_took.as_secs_f64());
    let classes = cluster.runtime_classes().await?;
    for h in &args.handlers {
        ensure!(
            classes.iter().any(|c| c == h),
            "berth up created no RuntimeClass {h:?} on this machine (it has {classes:?}); see {}",
            cluster.log("up").display()
        );
    }
    // The same plugins as the cluster's pods get, on the floor's own bridge and addresses.
    let cluster_conflist = cluster.conflist()?;
    let floor_conflist = floor_conflist(&cluster_conflist, &floor_dir.join("ipam"))?;
    let cni = CniFloor::new(&floor_conflist)?;
    let floor = Floor { dir: floor_dir, bundle, cni };

    let mut berth_cri = CriClient::wait_ready(&cluster.runtime_socket(), Duration::from_secs(30)).await?;
    let berth_version = berth_cri.version().await?;
    for handler in &args.handlers {
        berth_cri.pull(&image, handler).await?;
    }
    cluster.create_namespace(NAMESPACE).await?;

    if !args.no_containerd {
        eprintln!("starting containerd ({})", args.containerd.display());
        let (binary, host) = (args.containerd.clone(), registry.host().to_owned());
        let ctd = tokio::task::spawn_blocking(move || {
            Containerd::builder().binary(binary).registry(&host).network(CONTAINERD_NETWORK.bridge_network()).start()
        })
        .await
        .context("starting containerd")?;
        let mut client = CriClient::wait_ready(&ctd.socket(), Duration::from_secs(30)).await?;
        client.pull(SANDBOX_IMAGE, "").await?;
        client.pull(&image, "").await?;
        session.containerd = Some((ctd, client));
    }
    let mut containerd = session.containerd.as_mut().map(|(_, client)| client);
    let containerd_version = match containerd.as_deref_mut() {
        Some(c) => Some(c.version().await?),
        None => None,
    };

    eprintln!("memory of the idle tree (settling {} s)", args.settle);
    let idle_memory = cluster.memory(&mut berth_cri, args.settle).await?;

    let api: Api<Pod> = Api::namespaced(cluster.admin(), NAMESPACE);
    let mut watch = StartWatch::start(api.clone()).await?;
    let mut results = Vec::new();
    let mut busy_memory = None;
    for handler in &args.handlers {
        let mut run = HandlerRun {
            args,
            handler,
            image: &image,
            api: &api,
            floor: &floor,
            logs: client::log_dir(&root, "containerd", handler)?,
            containerd: containerd.as_deref_mut(),
            cluster: &*cluster,
        };
        let mut result = HandlerResult::new(handler);
        run.one_at_a_time(&mut watch, &mut result).await?;
        if handler == "runc" || (busy_memory.is_none() && handler == args.handlers.last().expect("handlers")) {
            eprintln!("  memory of the tree with {} {handler} pods running (settling {} s)", args.pods, args.settle);
            busy_memory = Some((handler.clone(), args.pods, cluster.memory(&mut berth_cri, args.settle).await?));
        }
        run.clear().await?;
        run.waves(&mut watch, &mut result).await?;
        run.clear().await?;
        run.burst(&mut watch, &mut result).await?;
        run.clear().await?;
        results.push(result);
    }
    drop(watch);
    drop(floor);
    drop(registry);
    Ok(Report {
        pods: args.pods,
        wave: args.wave,
        burst: args.burst,
        warmup: args.warmup,
        image,
        up_took,
        berth_version,
        containerd_version,
        floor_plugins: net::plugin_types(&floor_conflist),
        idle_memory,
        busy_memory,
        handlers: results,
    })
}

/// The cluster's conflist moved onto the floor's bridge, range and IPAM dir, plugins unchanged.
fn floor_conflist(cluster: &serde_json::Value, ipam_dir: &Path) -> anyhow::Result<serde_json::Value> {
    let mut list = cluster.clone();
    list["name"] = FLOOR_NETWORK.name.into();
    let plugins = list["plugins"].as_array_mut().context("the cluster's conflist has no plugins")?;
    for plugin in plugins {
        if plugin["type"] == "bridge" {
            plugin["bridge"] = FLOOR_NETWORK.bridge.into();
            plugin["ipam"]["dataDir"] = ipam_dir.to_string_lossy().into_owned().into();
            plugin["ipam"]["ranges"] = serde_json::json!([[{"subnet": FLOOR_NETWORK.subnet}]]);
        }
    }
    Ok(list)
}

/// The floor's bundle and CNI plugins.
struct Floor {
    dir: PathBuf,
    bundle: PathBuf,
    cni: CniFloor,
}

impl Floor {
    /// `X run` of the bundle to its exit, then one CNI ADD (timed), then its DEL (not timed).
    fn sample(&self, handler: &str, id: &str) -> anyhow::Result<(Duration, Duration)> {
        tokio::task::block_in_place(|| {
            let run = floor::run(handler, &self.dir, &self.bundle, id)?;
            let started = Instant::now();
            self.cni.add(id)?;
            let add = started.elapsed();
            self.cni.del(id)?;
            Ok((run, add))
        })
    }

    /// `n` samples, `parallel` at a time, each into a network namespace of its own made
    /// beforehand; only `X run` and the ADD are inside the timed part (the DELs come after).
    fn burst(&self, handler: &str, n: usize, parallel: usize) -> anyhow::Result<FloorBurst> {
        let namespaces = (0..n).map(|i| Netns::new(&format!("fb{i}"))).collect::<anyhow::Result<Vec<_>>>()?;
        let id = |i: usize| format!("bench-floor-{handler}-b{i}");
        let next = AtomicUsize::new(0);
        let started = Instant::now();
        let done: Vec<anyhow::Result<Vec<Duration>>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..parallel)
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= n {
                                return Ok(done);
                            }
                            floor::run(handler, &self.dir, &self.bundle, &id(i))?;
                            self.cni.add_in(&namespaces[i].path, &id(i))?;
                            done.push(started.elapsed());
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a floor worker panicked"))))
                .collect()
        });
        let wall = started.elapsed();
        for (i, netns) in namespaces.iter().enumerate() {
            let _ = self.cni.del_in(&netns.path, &id(i));
        }
        let mut burst = FloorBurst { parallel, done: Latencies::default(), wall };
        for took in done {
            for d in took? {
                burst.done.record(d);
            }
        }
        Ok(burst)
    }
}

/// One handler's shapes, through the API and through containerd.
struct HandlerRun<'a> {
    args: &'a StartupArgs,
    handler: &'a str,
    image: &'a str,
    api: &'a Api<Pod>,
    floor: &'a Floor,
    logs: PathBuf,
    containerd: Option<&'a mut CriClient>,
    cluster: &'a UpCluster,
}

impl HandlerRun<'_> {
    /// Pod by pod: a floor sample, one pod through the API and one containerd pod, those two in
    /// turns first; all kept running.
    async fn one_at_a_time(&mut self, watch: &mut StartWatch, result: &mut HandlerResult) -> anyhow::Result<()> {
        let (handler, n) = (self.handler, self.args.pods);
        eprintln!(
            "{handler}: one at a time, {} warm-up + {n} pods each for floor, berth and containerd",
            self.args.warmup
        );
        let mut shape = Shape::default();
        for i in 0..self.args.warmup + n {
            let record = i >= self.args.warmup;
            let tag = if record { format!("s{}", i - self.args.warmup) } else { format!("w{i}") };
            let (run, add) = self.floor.sample(handler, &format!("bench-floor-{handler}-{tag}"))?;
            let pod = api_pods::pod(&format!("{handler}-{tag}"), handler, self.image)?;
            let berth_first = i % 2 == 0;
            let mut berth = None;
            if berth_first {
                berth = Some(api_pods::start_one(self.api, watch, &pod).await?);
            }
            let ctd = match self.containerd.as_deref_mut() {
                Some(c) => {
                    let spec = PodSpec::sleeping(format!("ctd-{handler}-{tag}"), handler, &self.logs, self.image);
                    Some(containerd_pods::start_one(c, &spec).await?)
                }
                None => None,
            };
            let berth = match berth {
                Some(b) => b,
                None => api_pods::start_one(self.api, watch, &pod).await?,
            };
            self.cluster.ensure_alive()?;
            if record {
                result.floor_run.record(run);
                result.floor_cni_add.record(add);
                result.floor.record(run + add);
                shape.record_berth(&berth);
                if let Some(c) = ctd {
                    shape.containerd.record(c);
                }
            }
        }
        shape.wall = None;
        result.one_at_a_time = shape;
        Ok(())
    }

    /// Waves of `--wave` pods started together, through the API, then through containerd.
    async fn waves(&mut self, watch: &mut StartWatch, result: &mut HandlerResult) -> anyhow::Result<()> {
        let (handler, wave) = (self.handler, self.args.wave);
        let waves = self.args.pods.div_ceil(wave);
        eprintln!("{handler}: {waves} waves of {wave} pods, berth and containerd in turns");
        let mut shape = Shape::default();
        let started = Instant::now();
        for w in 0..waves {
            let names: Vec<String> = (0..wave).map(|i| format!("{handler}-v{w}-{i}")).collect();
            let pods =
                names.iter().map(|n| api_pods::pod(n, handler, self.image)).collect::<anyhow::Result<Vec<_>>>()?;
            let specs: Vec<PodSpec<'_>> = (0..wave)
                .map(|i| PodSpec::sleeping(format!("ctd-{handler}-v{w}-{i}"), handler, &self.logs, self.image))
                .collect();
            let berth_first = w % 2 == 0;
            if berth_first {
                for s in api_pods::start_many(self.api, watch, &pods).await? {
                    shape.record_berth(&s);
                }
            }
            if let Some(c) = self.containerd.as_deref_mut() {
                for took in containerd_pods::start_many(c, &specs).await? {
                    shape.containerd.record(took);
                }
            }
            if !berth_first {
                for s in api_pods::start_many(self.api, watch, &pods).await? {
                    shape.record_berth(&s);
                }
            }
            self.cluster.ensure_alive()?;
        }
        shape.wall = Some(started.elapsed());
        result.waves = shape;
        Ok(())
    }

    /// A Deployment of `--burst` replicas created at once; then as many containerd pods at once.
    async fn burst(&mut self, watch: &mut StartWatch, result: &mut HandlerResult) -> anyhow::Result<()> {
        let (handler, n) = (self.handler, self.args.burst);
        eprintln!("{handler}: a burst of {n} pods: a Deployment, then containerd");
        let burst = api_pods::deployment_burst(self.cluster.admin(), watch, handler, self.image, n).await?;
        self.cluster.ensure_alive()?;
        let mut shape = Shape::default();
        for s in &burst.starts {
            shape.record_berth(s);
        }
        for took in &burst.since_created {
            shape.berth_since_created.record(*took);
        }
        shape.wall = Some(burst.all_running);
        result.burst = shape;
        api_pods::delete_deployment(self.cluster.admin(), handler).await?;
        self.clear().await?;
        let parallel = self.args.wave;
        eprintln!("{handler}: the floor as a burst of {n}, {parallel} at a time");
        result.floor_burst = Some(tokio::task::block_in_place(|| self.floor.burst(handler, n, parallel))?);
        if let Some(c) = self.containerd.as_deref_mut() {
            let specs: Vec<PodSpec<'_>> = (0..n)
                .map(|i| PodSpec::sleeping(format!("ctd-{handler}-b{i}"), handler, &self.logs, self.image))
                .collect();
            let started = Instant::now();
            let took = containerd_pods::start_many(c, &specs).await?;
            result.containerd_burst_wall = Some(started.elapsed());
            for t in took {
                result.burst.containerd.record(t);
            }
        }
        Ok(())
    }

    /// Deletes every bench pod through the API (waiting until they are gone) and every containerd pod.
    async fn clear(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let deleted = api_pods::delete_all(self.api).await?;
        let removed = match self.containerd.as_deref_mut() {
            Some(c) => c.remove_all().await?,
            None => 0,
        };
        if deleted + removed > 0 {
            eprintln!(
                "  deleted {deleted} pod(s) through the API and {removed} containerd pod(s) in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_runs_the_clusters_plugins_on_its_own_bridge_and_range() {
        let cluster = serde_json::json!({"cniVersion": "1.0.0", "name": "berth", "plugins": [
            {"type": "bridge", "bridge": "berth0", "isGateway": true,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]], "dataDir": "/var/lib/x"}},
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ]});
        let floor = floor_conflist(&cluster, Path::new("/tmp/floor-ipam")).unwrap();
        assert_eq!(net::plugin_types(&floor), net::plugin_types(&cluster));
        assert_eq!(floor["plugins"][0]["bridge"], FLOOR_NETWORK.bridge);
        assert_eq!(floor["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], FLOOR_NETWORK.subnet);
        assert_eq!(floor["plugins"][0]["ipam"]["dataDir"], "/tmp/floor-ipam");
        assert_eq!(floor["plugins"][0]["isGateway"], true, "the other settings stay the cluster's");
        assert_eq!(floor["plugins"][1], cluster["plugins"][1]);
    }
}
