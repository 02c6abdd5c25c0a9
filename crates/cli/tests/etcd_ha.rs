//! Two `berth server`s on a 3-member etcd cluster under a steady load of creates, updates,
//! deletes, GETs, LISTs and three watches: a member killed, the etcd leader killed, an API server
//! killed, each restarted — no request fails while the quorum holds, every acknowledged write is
//! readable from both servers, and every watch sees every event exactly once, in order. With the
//! quorum lost, requests and `/readyz` answer 503 with etcd's reason, and serving resumes by
//! itself when the quorum is back.
//!
//! Needs etcd (scripts/install-deps.sh) and kubectl.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_testenv::EtcdCluster;
use common::Server;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};

const NAMESPACE: &str = "load";

/// An acknowledged write: `Some((resourceVersion, value))` for a create or update, `None` for a
/// delete.
type Write = Option<(String, String)>;

/// What the load saw.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    failures: Mutex<Vec<String>>,
    slowest: Mutex<(Duration, String)>,
    /// Per object, the acknowledged writes in order.
    acked: Mutex<BTreeMap<String, Vec<Write>>>,
    /// Objects a write of which failed because its server was killed: it may or may not have
    /// been applied, so their final state is not checked.
    uncertain: Mutex<std::collections::BTreeSet<String>>,
}

impl Tally {
    fn timed(&self, what: &str, took: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut slowest = self.slowest.lock().unwrap();
        if took > slowest.0 {
            *slowest = (took, what.to_owned());
        }
    }
    fn failed(&self, what: String) {
        eprintln!("FAILED: {what}");
        self.failures.lock().unwrap().push(what);
    }
    fn ack(&self, name: &str, write: Write) {
        self.acked.lock().unwrap().entry(name.to_owned()).or_default().push(write);
    }
}

fn config_map(name: &str, value: &str, rv: Option<String>) -> ConfigMap {
    let mut cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "data": {"v": value},
    }))
    .unwrap();
    cm.metadata.resource_version = rv;
    cm
}

/// Runs one request, times it, and records a failure unless its server is known to be down.
async fn request<T>(
    tally: &Tally,
    server_down: &AtomicBool,
    what: String,
    fut: impl std::future::Future<Output = kube::Result<T>>,
) -> Option<T> {
    let started = Instant::now();
    let result = fut.await;
    let took = started.elapsed();
    match result {
        Ok(v) => {
            tally.timed(&what, took);
            Some(v)
        }
        Err(_) if server_down.load(Ordering::SeqCst) => None,
        Err(e) => {
            tally.failed(format!("{what} after {took:?}: {e}"));
            None
        }
    }
}

/// Creates, updates twice and deletes every third object, one request at a time.
async fn writer(api: Api<ConfigMap>, id: String, tally: Arc<Tally>, down: Arc<AtomicBool>, stop: Arc<AtomicBool>) {
    let pp = PostParams::default();
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let name = format!("{id}-{i}");
        let Some(created) =
            request(&tally, &down, format!("create {name}"), api.create(&pp, &config_map(&name, "0", None))).await
        else {
            tally.uncertain.lock().unwrap().insert(name);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut rv = created.metadata.resource_version.clone().unwrap();
        tally.ack(&name, Some((rv.clone(), "0".into())));
        for value in ["1", "2"] {
            let next = config_map(&name, value, Some(rv.clone()));
            let update = api.replace(&name, &pp, &next);
            let Some(updated) = request(&tally, &down, format!("update {name}"), update).await else {
                tally.uncertain.lock().unwrap().insert(name.clone());
                break;
            };
            rv = updated.metadata.resource_version.clone().unwrap();
            tally.ack(&name, Some((rv.clone(), value.into())));
        }
        if i % 3 == 0 {
            match request(&tally, &down, format!("delete {name}"), api.delete(&name, &DeleteParams::default())).await {
                Some(_) => tally.ack(&name, None),
                None => {
                    tally.uncertain.lock().unwrap().insert(name);
                }
            }
        }
    }
}

/// GETs the objects of one writer and LISTs the namespace.
async fn reader(api: Api<ConfigMap>, of: String, tally: Arc<Tally>, down: Arc<AtomicBool>, stop: Arc<AtomicBool>) {
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let name = format!("{of}-{}", i % 20 + 1);
        // A 404 is an answer: the object may be deleted or not yet created.
        let get = async {
            match api.get(&name).await {
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                other => other.map(|_| ()),
            }
        };
        request(&tally, &down, format!("get {name}"), get).await;
        if i % 5 == 0 {
            request(&tally, &down, "list".into(), api.list(&ListParams::default())).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One watch's view: every event as (type, name, resourceVersion), and how often it had to be
/// opened again.
#[derive(Default)]
struct Seen {
    events: Vec<(String, String, u64)>,
    reopened: Vec<String>,
}

/// Watches the namespace from `from`, opening the watch again from the last event after any
/// break (only expected while its server is down).
async fn watcher(api: Api<ConfigMap>, from: String, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) {
    let mut last = from;
    while !stop.load(Ordering::SeqCst) {
        let stream = match api.watch(&WatchParams::default().timeout(290), &last).await {
            Ok(s) => s,
            Err(e) => {
                seen.lock().unwrap().reopened.push(format!("open: {e}"));
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        };
        futures::pin_mut!(stream);
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                () = tokio::time::sleep(Duration::from_millis(200)) => {
                    if stop.load(Ordering::SeqCst) { return } else { continue }
                }
            };
            let (kind, cm) = match next {
                Some(Ok(WatchEvent::Added(cm))) => ("ADDED", cm),
                Some(Ok(WatchEvent::Modified(cm))) => ("MODIFIED", cm),
                Some(Ok(WatchEvent::Deleted(cm))) => ("DELETED", cm),
                Some(Ok(WatchEvent::Bookmark(_))) => continue,
                Some(Ok(WatchEvent::Error(e))) => {
                    seen.lock().unwrap().reopened.push(format!("error event: {e:?}"));
                    break;
                }
                Some(Err(e)) => {
                    seen.lock().unwrap().reopened.push(format!("stream: {e}"));
                    break;
                }
                None => {
                    seen.lock().unwrap().reopened.push("stream ended".into());
                    break;
                }
            };
            let rv = cm.metadata.resource_version.clone().unwrap();
            last = rv.clone();
            seen.lock().unwrap().events.push((kind.into(), cm.metadata.name.unwrap(), rv.parse().unwrap()));
        }
    }
}

fn elapsed_secs(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64()
}

#[test]
fn two_servers_on_three_etcd_members_serve_without_a_failed_request_through_member_leader_and_server_crashes() {
    let mut etcd = EtcdCluster::start(3);
    let endpoints = etcd.endpoints().join(",");
    let a = Server::start_with(&["--etcd-servers", &endpoints]);
    let mut b = Server::start_sharing(&a, &["--etcd-servers", &endpoints]);
    a.kubectl_ok(&["create", "namespace", NAMESPACE]);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (client_a, client_b) = rt.block_on(async { (a.client().await, b.client().await) });
    let api_a: Api<ConfigMap> = Api::namespaced(client_a, NAMESPACE);
    let api_b: Api<ConfigMap> = Api::namespaced(client_b, NAMESPACE);
    let start_rv = rt.block_on(api_a.list(&ListParams::default())).unwrap().metadata.resource_version.unwrap();

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let a_down = Arc::new(AtomicBool::new(false));
    let b_down = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (api, down, tag) in [(&api_a, &a_down, "a"), (&api_b, &b_down, "b")] {
        for w in 0..2 {
            let id = format!("{tag}{w}");
            tasks.push(rt.spawn(writer(api.clone(), id.clone(), tally.clone(), down.clone(), stop.clone())));
            tasks.push(rt.spawn(reader(api.clone(), id, tally.clone(), down.clone(), stop.clone())));
        }
    }
    let watches: Vec<(&str, Arc<Mutex<Seen>>)> =
        ["a", "a", "b"].into_iter().map(|s| (s, Arc::new(Mutex::new(Seen::default())))).collect();
    for (server, seen) in &watches {
        let api = if *server == "a" { api_a.clone() } else { api_b.clone() };
        tasks.push(rt.spawn(watcher(api, start_rv.clone(), seen.clone(), stop.clone())));
    }

    // The failures, while the load runs.
    let t0 = Instant::now();
    let sleep_until = |at: u64| {
        let target = t0 + Duration::from_secs(at);
        std::thread::sleep(target.saturating_duration_since(Instant::now()));
    };
    let leader = etcd.wait_for_leader(Duration::from_secs(10)).expect("an etcd leader");
    let follower = (leader + 1) % 3;
    sleep_until(5);
    eprintln!("{:.1}s: kill -9 etcd member {follower} (a follower)", elapsed_secs(t0));
    etcd.kill(follower);
    sleep_until(13);
    eprintln!("{:.1}s: restart etcd member {follower}", elapsed_secs(t0));
    etcd.restart(follower);
    sleep_until(21);
    let leader = etcd.wait_for_leader(Duration::from_secs(10)).expect("an etcd leader");
    eprintln!("{:.1}s: kill -9 etcd member {leader} (the leader)", elapsed_secs(t0));
    etcd.kill(leader);
    sleep_until(30);
    eprintln!("{:.1}s: restart etcd member {leader}", elapsed_secs(t0));
    etcd.restart(leader);
    sleep_until(38);
    eprintln!("{:.1}s: kill -9 API server b", elapsed_secs(t0));
    b_down.store(true, Ordering::SeqCst);
    b.kill9();
    sleep_until(44);
    b.restart();
    eprintln!("{:.1}s: API server b restarted and ready", elapsed_secs(t0));
    // Requests sent before b was ready again may still fail; from now on none may.
    std::thread::sleep(Duration::from_secs(1));
    b_down.store(false, Ordering::SeqCst);
    sleep_until(60);
    stop.store(true, Ordering::SeqCst);
    rt.block_on(async {
        for t in tasks {
            t.await.unwrap();
        }
    });

    let failures = tally.failures.lock().unwrap().clone();
    let slowest = tally.slowest.lock().unwrap().clone();
    let acked = tally.acked.lock().unwrap().clone();
    let uncertain = tally.uncertain.lock().unwrap().clone();
    eprintln!(
        "{} requests answered, {} failed; slowest {:?} ({}); {} objects written, {} left uncertain by the killed server",
        tally.requests.load(Ordering::Relaxed),
        failures.len(),
        slowest.0,
        slowest.1,
        acked.len(),
        uncertain.len()
    );
    assert!(failures.is_empty(), "requests failed while the quorum held: {failures:#?}");
    assert!(acked.len() > 50, "the load wrote only {} objects", acked.len());

    // Every acknowledged write is what both servers read.
    rt.block_on(async {
        for (name, writes) in acked.iter().filter(|(name, _)| !uncertain.contains(*name)) {
            let last = writes.last().unwrap();
            for (server, api) in [("a", &api_a), ("b", &api_b)] {
                match (last, api.get_opt(name).await.unwrap()) {
                    (None, None) => {}
                    (Some((rv, value)), Some(cm)) => {
                        assert_eq!(cm.metadata.resource_version.as_ref(), Some(rv), "{name} through {server}");
                        assert_eq!(cm.data.unwrap()["v"], *value, "{name} through {server}");
                    }
                    (want, got) => panic!("{name} through {server}: wanted {want:?}, read {got:?}"),
                }
            }
        }
    });

    // Every watch saw every acknowledged write once, in revision order.
    let writes: Vec<(String, Option<u64>)> = acked
        .iter()
        .flat_map(|(name, ws)| ws.iter().map(move |w| (name.clone(), w.as_ref().map(|(rv, _)| rv.parse().unwrap()))))
        .collect();
    for (i, (server, seen)) in watches.iter().enumerate() {
        let seen = seen.lock().unwrap();
        let revisions: Vec<u64> = seen.events.iter().map(|e| e.2).collect();
        assert!(
            revisions.windows(2).all(|w| w[0] < w[1]),
            "watch {i} (through {server}) saw events out of order or twice"
        );
        for (name, rv) in &writes {
            let count = match rv {
                Some(rv) => seen.events.iter().filter(|e| e.2 == *rv).count(),
                // A delete sent as its server died may also have been applied.
                None if uncertain.contains(name) => continue,
                None => seen.events.iter().filter(|e| e.0 == "DELETED" && e.1 == *name).count(),
            };
            assert_eq!(count, 1, "watch {i} (through {server}): the write {rv:?} of {name} seen {count} times");
        }
        eprintln!("watch {i} through {server}: {} events; opened again: {:?}", seen.events.len(), seen.reopened);
        if *server == "a" {
            assert!(seen.reopened.is_empty(), "watch {i} through a broke: {:?}", seen.reopened);
        }
    }

    // The quorum lost: a clear 503, fast, and /readyz says why.
    let (m1, m2) = ((leader + 1) % 3, (leader + 2) % 3);
    etcd.kill(m1);
    etcd.kill(m2);
    let started = Instant::now();
    let out = a.kubectl(&["get", "configmaps", "-n", NAMESPACE, "-o", "name"]);
    let took = started.elapsed();
    let err = common::stderr(&out);
    eprintln!("without quorum, kubectl get answered after {took:?}: {err}");
    assert!(!out.status.success());
    assert!(err.contains("etcd") && err.contains("no leader"), "{err}");
    let started = Instant::now();
    let readyz = a.kubectl(&["get", "--raw", "/readyz"]);
    eprintln!("without quorum, /readyz answered after {:?}: {}", started.elapsed(), common::stderr(&readyz));
    assert!(!readyz.status.success());
    assert!(common::stderr(&readyz).contains("ServiceUnavailable") || common::stderr(&readyz).contains("503"));
    assert!(took < Duration::from_secs(20), "a request without quorum took {took:?}");

    // The quorum back: serving again without a restart.
    etcd.restart_no_wait(m1);
    etcd.restart(m2);
    let back = Instant::now();
    loop {
        if a.kubectl(&["create", "configmap", "after-quorum", "-n", NAMESPACE]).status.success() {
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(60), "server a did not serve again after the quorum came back");
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("quorum back: serving again after {:?}", back.elapsed());
    b.kubectl_ok(&["get", "configmap", "after-quorum", "-n", NAMESPACE]);
    a.kubectl_ok(&["get", "--raw", "/readyz"]);
}
