//! Watch fan-out through the router, in-process: an event reaches only the watchers its
//! namespace and indexed fields select, recent revisions replay from the hub's buffer, older and
//! compacted ones from the store, and a watcher that stops reading is cut off.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use berth_apiserver::watch_hub::{RECENT_EVENTS, WATCHER_QUEUE};
use berth_apiserver::{ApiState, lifecycle, router};
use berth_store::sqlite::SqliteStore;
use futures::StreamExt;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tower::ServiceExt;

/// The tests of this file run one at a time: one of them measures the process's CPU time.
static SERIAL: Mutex<()> = Mutex::const_new(());

struct Api {
    state: Arc<ApiState>,
    app: Router,
    _dir: tempfile::TempDir,
}

impl Api {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let state = ApiState::new(Arc::new(store), None);
        lifecycle::bootstrap(&state).await.unwrap();
        let app = router(state.clone());
        Api { state, app, _dir: dir }
    }

    async fn send(&self, method: &str, path: &str, content_type: &str, body: String) -> (StatusCode, Value) {
        let req = Request::builder().method(method).uri(path).header("content-type", content_type);
        let resp = self.app.clone().oneshot(req.body(Body::from(body)).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let (status, answer) = self.send("POST", path, "application/json", body.to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
        answer
    }

    async fn current_rv(&self) -> i64 {
        let (_, list) = self.send("GET", "/api/v1/namespaces/default/configmaps?limit=1", "", String::new()).await;
        list["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
    }

    /// Opens a watch; its body is read by [`Lines`] or left unread.
    async fn watch(&self, path: &str) -> Body {
        let req = Request::builder().uri(path).body(Body::empty()).unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body()
    }

    /// A server whose configmaps had more writes than the hub keeps, seen whole by one watch
    /// from `start`; with the revision before them and how many there were.
    async fn past_the_buffer() -> (Api, i64, usize) {
        let api = Api::new().await;
        let start = api.current_rv().await;
        let first = Lines::read(
            api.watch(&format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={start}")).await,
        );
        let count = RECENT_EVENTS + 50;
        api.create_configmaps((0..count).map(|i| format!("cm-{i}"))).await;
        first.wait_for(count).await;
        (api, start, count)
    }

    async fn create_configmaps(&self, names: impl Iterator<Item = String>) -> Vec<i64> {
        futures::stream::iter(names)
            .map(|name| async move {
                let cm = self.post("/api/v1/namespaces/default/configmaps", json!({"metadata": {"name": name}})).await;
                rv(&cm)
            })
            .buffered(64)
            .collect()
            .await
    }
}

fn rv(obj: &Value) -> i64 {
    obj["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
}

/// A watch's events, one JSON value per line, read in the background.
struct Lines {
    events: Arc<std::sync::Mutex<Vec<Value>>>,
    ended: Arc<AtomicUsize>,
}

impl Lines {
    fn read(body: Body) -> Lines {
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let ended = Arc::new(AtomicUsize::new(0));
        let (e, done) = (events.clone(), ended.clone());
        tokio::spawn(async move {
            read_lines(body, |v| e.lock().unwrap().push(v)).await;
            done.store(1, Ordering::SeqCst);
        });
        Lines { events, ended }
    }

    fn snapshot(&self) -> Vec<Value> {
        self.events.lock().unwrap().clone()
    }

    fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst) == 1
    }

    async fn wait_for(&self, count: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.events.lock().unwrap().len() < count {
            assert!(
                Instant::now() < deadline,
                "only {} of {count} events: {:?}",
                self.snapshot().len(),
                self.snapshot()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.snapshot()
    }
}

async fn read_lines(mut body: Body, mut each: impl FnMut(Value)) {
    let mut buf = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(data) = frame.into_data() else { continue };
        buf.extend_from_slice(&data);
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            each(serde_json::from_slice(&line).unwrap());
        }
    }
}

fn names(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| format!("{} {}", e["type"].as_str().unwrap(), e["object"]["metadata"]["name"].as_str().unwrap()))
        .collect()
}

/// The process's CPU time (user + system) in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command come state (field 3) ... utime (14) and stime (15).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Opens one watch per node of `nodes`, updates every pod, and returns the CPU time of the
/// updates until each watcher saw its pod's change, checking each saw it exactly once.
async fn update_pods_with_watchers(api: &Api, nodes: usize, pods: usize, round: usize) -> u64 {
    let start = api.current_rv().await;
    let seen: Arc<Vec<AtomicUsize>> = Arc::new((0..nodes).map(|_| AtomicUsize::new(0)).collect());
    let mut readers = Vec::new();
    for i in 0..nodes {
        let body = api
            .watch(&format!("/api/v1/pods?watch=1&resourceVersion={start}&fieldSelector=spec.nodeName%3Dnode-{i}"))
            .await;
        let seen = seen.clone();
        readers.push(tokio::spawn(read_lines(body, move |ev| {
            assert_eq!(ev["type"], "MODIFIED", "{ev}");
            assert_eq!(ev["object"]["metadata"]["name"], format!("pod-{i}"));
            seen[i].fetch_add(1, Ordering::SeqCst);
        })));
    }

    let before = cpu_ticks();
    futures::stream::iter(0..pods)
        .for_each_concurrent(64, |i| async move {
            let patch = json!({"metadata": {"labels": {"round": round.to_string()}}}).to_string();
            let path = format!("/api/v1/namespaces/default/pods/pod-{i}");
            let (status, answer) = api.send("PATCH", &path, "application/merge-patch+json", patch).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
        })
        .await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.iter().any(|s| s.load(Ordering::SeqCst) == 0) {
        assert!(Instant::now() < deadline, "some watchers never saw their pod's update");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let spent = cpu_ticks() - before;

    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.load(Ordering::SeqCst), 1, "the watcher of node-{i} saw its pod's update once");
    }
    for r in readers {
        r.abort();
    }
    spent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cpu_time_of_pod_updates_grows_with_the_matched_watchers_not_with_all() {
    let _serial = SERIAL.lock().await;
    let api = Api::new().await;
    const PODS: usize = 2_000;
    futures::stream::iter(0..PODS)
        .for_each_concurrent(64, |i| {
            let api = &api;
            async move {
                let pod = json!({
                    "metadata": {"name": format!("pod-{i}")},
                    "spec": {"nodeName": format!("node-{i}"), "containers": [{"name": "c", "image": "busybox"}]},
                });
                api.post("/api/v1/namespaces/default/pods", pod).await;
            }
        })
        .await;

    let few = update_pods_with_watchers(&api, 20, PODS, 1).await;
    let all = update_pods_with_watchers(&api, PODS, PODS, 2).await;
    let ratio = all as f64 / few.max(1) as f64;
    println!("CPU time of {PODS} pod updates: {few} ticks with 20 watchers, {all} with {PODS}: {ratio:.2}x");
    assert!(ratio < 3.0, "100x the watchers cost {ratio:.2}x the CPU time ({few} -> {all} ticks)");
}

#[tokio::test]
async fn a_watch_from_a_revision_inside_the_buffer_replays_exactly_the_events_after_it() {
    let _serial = SERIAL.lock().await;
    let api = Api::new().await;
    // The first watch of configmaps starts their dispatcher.
    let first = Lines::read(api.watch("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=0").await);
    let rvs = api.create_configmaps((0..10).map(|i| format!("cm-{i}"))).await;
    first.wait_for(10).await;

    // Created concurrently: resume after the median revision.
    let mut sorted = rvs.clone();
    sorted.sort();
    let after = sorted[4];
    let resumed =
        Lines::read(api.watch(&format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={after}")).await);
    let more = api.create_configmaps((10..13).map(|i| format!("cm-{i}"))).await;
    let mut want: Vec<(i64, String)> = rvs
        .iter()
        .chain(&more)
        .enumerate()
        .filter(|(_, rv)| **rv > after)
        .map(|(i, rv)| (*rv, format!("ADDED cm-{i}")))
        .collect();
    want.sort();
    let want: Vec<String> = want.into_iter().map(|(_, n)| n).collect();
    assert_eq!(want.len(), 8);
    resumed.wait_for(8).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(names(&resumed.snapshot()), want, "the events after {after}, once each, in order");
}

#[tokio::test]
async fn a_watcher_that_stops_reading_is_cut_off_while_the_others_keep_their_events() {
    let _serial = SERIAL.lock().await;
    let api = Api::new().await;
    let rv = api.current_rv().await;
    let path = format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}");
    let slow = api.watch(&path).await;
    let reader = Lines::read(api.watch(&path).await);

    let count = WATCHER_QUEUE + 200;
    api.create_configmaps((0..count).map(|i| format!("cm-{i}"))).await;
    let events = reader.wait_for(count).await;
    assert_eq!(events.len(), count);
    assert!(!reader.ended(), "the watcher that reads stays open");

    // The slow watcher's stream ends after what was queued for it.
    let mut got = 0;
    let drained = tokio::time::timeout(Duration::from_secs(10), read_lines(slow, |_| got += 1)).await;
    assert!(drained.is_ok(), "the slow watcher's stream ended");
    assert!(got < count, "the slow watcher was cut off: it got {got} of {count} events");
    assert!(got >= WATCHER_QUEUE, "it got what was queued for it: {got}");
}

#[tokio::test]
async fn a_watch_from_before_the_buffer_reads_the_store_and_a_compacted_one_gets_410() {
    let _serial = SERIAL.lock().await;
    let (api, start, count) = Api::past_the_buffer().await;

    let old =
        Lines::read(api.watch(&format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={start}")).await);
    let events = old.wait_for(count).await;
    assert_eq!(events.len(), count);
    let revisions: Vec<i64> = events.iter().map(|e| rv(&e["object"])).collect();
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "in order");
    assert!(events.iter().all(|e| e["type"] == "ADDED"));

    let current = api.current_rv().await;
    api.state.store.compact(current).await.unwrap();
    let gone =
        Lines::read(api.watch(&format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={start}")).await);
    let events = gone.wait_for(1).await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(events[0]["object"]["message"], format!("too old resource version: {start} ({current})"));
}

#[tokio::test]
async fn a_watch_from_before_the_buffer_moves_to_the_hub_once_caught_up_and_misses_nothing() {
    let _serial = SERIAL.lock().await;
    let (api, start, count) = Api::past_the_buffer().await;
    assert_eq!(api.state.watch_hub.watchers(&berth_api::resources::CONFIGMAPS).await, 1);

    let behind =
        Lines::read(api.watch(&format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={start}")).await);
    behind.wait_for(count).await;
    // Writes after it has read the store's history: the watch takes them from the hub.
    api.create_configmaps((count..count + 200).map(|i| format!("cm-{i}"))).await;
    let events = behind.wait_for(count + 200).await;
    assert_eq!(api.state.watch_hub.watchers(&berth_api::resources::CONFIGMAPS).await, 2, "both watches on the hub");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let events = if behind.snapshot().len() > events.len() { behind.snapshot() } else { events };
    let mut seen: Vec<String> =
        events.iter().map(|e| e["object"]["metadata"]["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(seen.len(), count + 200, "each write once");
    let revisions: Vec<i64> = events.iter().map(|e| rv(&e["object"])).collect();
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "in order");
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), count + 200, "no write twice");
}

#[tokio::test]
async fn a_pod_bound_to_a_node_leaves_the_unscheduled_watch_and_enters_the_nodes() {
    let _serial = SERIAL.lock().await;
    let api = Api::new().await;
    let rv = api.current_rv().await;
    let watch = |sel: &str| format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={rv}&fieldSelector={sel}");
    let unscheduled = Lines::read(api.watch(&watch("spec.nodeName%3D")).await);
    let node = Lines::read(api.watch(&watch("spec.nodeName%3Dn1")).await);
    let other = Lines::read(api.watch(&watch("spec.nodeName%3Dn2")).await);
    let by_name = Lines::read(api.watch(&watch("metadata.name%3Dp")).await);

    api.post(
        "/api/v1/namespaces/default/pods",
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    api.post(
        "/api/v1/namespaces/default/pods/p/binding",
        json!({"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}),
    )
    .await;

    assert_eq!(names(&unscheduled.wait_for(2).await), ["ADDED p", "DELETED p"]);
    assert_eq!(names(&node.wait_for(1).await), ["ADDED p"]);
    assert_eq!(names(&by_name.wait_for(2).await), ["ADDED p", "MODIFIED p"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(other.snapshot().is_empty());
    assert_eq!(node.snapshot().len(), 1);
}

#[tokio::test]
async fn a_bookmark_reports_the_revision_of_events_the_watcher_did_not_select() {
    // Mostly idle: waits for the bookmark interval, so it does not hold the others up.
    let api = Api::new().await;
    let rv = api.current_rv().await;
    let watch = Lines::read(
        api.watch(&format!(
            "/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion={rv}&fieldSelector=spec.nodeName%3Dn1"
        ))
        .await,
    );
    let other = api
        .post(
            "/api/v1/namespaces/default/pods",
            json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n2", "containers": [{"name": "c", "image": "busybox"}]}}),
        )
        .await;
    let events = watch.wait_for(1).await;
    assert_eq!(events[0]["type"], "BOOKMARK", "{events:?}");
    assert_eq!(events[0]["object"]["metadata"]["resourceVersion"], other["metadata"]["resourceVersion"]);
}

#[tokio::test]
async fn a_watch_that_times_out_ends_with_a_bookmark_of_where_the_type_is() {
    let api = Api::new().await;
    let rv = api.current_rv().await;
    let watch = Lines::read(
        api.watch(&format!(
            "/api/v1/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=1&resourceVersion={rv}&fieldSelector=spec.nodeName%3Dn1"
        ))
        .await,
    );
    let other = api
        .post(
            "/api/v1/namespaces/default/pods",
            json!({"metadata": {"name": "q"}, "spec": {"nodeName": "n2", "containers": [{"name": "c", "image": "busybox"}]}}),
        )
        .await;
    // Well before the idle bookmark interval: only the end of the watch can have sent it.
    let events = watch.wait_for(1).await;
    assert_eq!(events[0]["type"], "BOOKMARK", "{events:?}");
    assert_eq!(events[0]["object"]["metadata"]["resourceVersion"], other["metadata"]["resourceVersion"]);
}

#[tokio::test]
async fn a_quiet_types_watch_ends_with_a_bookmark_past_the_writes_of_other_types() {
    let api = Api::new().await;
    let from = api.current_rv().await;
    let watch = Lines::read(
        api.watch(&format!(
            "/api/v1/services?watch=1&allowWatchBookmarks=true&timeoutSeconds=3&resourceVersion={from}"
        ))
        .await,
    );
    let written = api.create_configmaps(std::iter::once("elsewhere".to_string())).await[0];
    // No service changed: only the store's progress can move the services' revision on, and
    // it must, or a client resuming after a compaction would be sent 410 Gone.
    let events = watch.wait_for(1).await;
    assert_eq!(events[0]["type"], "BOOKMARK", "{events:?}");
    assert!(rv(&events[0]["object"]) >= written, "bookmark {events:?} is behind the configmap at {written}");
}
