//! Crash safety end to end: SIGKILL of `berth server` in the middle of a burst of creates, then a
//! restart on the same data dir must keep every acknowledged write, keep revisions growing and let
//! watches resume from an acknowledged resourceVersion.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Server;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};

const WRITERS: usize = 16;
/// Creates that must be acknowledged before the kill, so it lands in the middle of the burst.
const ACKED_BEFORE_KILL: usize = 300;

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"test": "crash"}},
        "data": {"payload": name},
    }))
    .unwrap()
}

fn rv_of(obj: &ConfigMap) -> i64 {
    let rv = obj.metadata.resource_version.as_deref().expect("a resourceVersion");
    rv.parse().unwrap_or_else(|_| panic!("resourceVersion {rv:?} is not an integer"))
}

/// An acknowledged create: which writer made it, its name and the resourceVersion the 201 carried.
struct Ack {
    writer: usize,
    name: String,
    rv: i64,
}

#[tokio::test(flavor = "multi_thread")]
async fn every_acknowledged_create_survives_kill_9_and_revisions_keep_growing() {
    let mut server = tokio::task::spawn_blocking(Server::start).await.unwrap();
    let client = server.client().await;

    let acks = Arc::new(Mutex::new(Vec::<Ack>::new()));
    let acked = Arc::new(AtomicUsize::new(0));
    let killed = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
        let (acks, acked, killed) = (acks.clone(), acked.clone(), killed.clone());
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("burst-{writer}-{i}");
                match api.create(&PostParams::default(), &cm(&name)).await {
                    Ok(obj) => {
                        acks.lock().unwrap().push(Ack { writer, name, rv: rv_of(&obj) });
                        acked.fetch_add(1, Ordering::SeqCst);
                    }
                    // Failures are expected only once the server is gone.
                    Err(_) if killed.load(Ordering::SeqCst) => return,
                    Err(e) => panic!("create {name} failed before the crash: {e}"),
                }
            }
        }));
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.load(Ordering::SeqCst) < ACKED_BEFORE_KILL {
        assert!(Instant::now() < deadline, "only {} creates succeeded in 60 s", acked.load(Ordering::SeqCst));
        assert!(!writers.iter().any(|w| w.is_finished()), "a writer stopped before the crash");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The flag goes up first so that a writer never mistakes the crash for a server bug.
    killed.store(true, Ordering::SeqCst);
    server.kill9();
    for w in writers {
        tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("a writer still hangs 30 s after the crash")
            .expect("a writer panicked");
    }
    let acks = std::mem::take(&mut *acks.lock().unwrap());
    assert!(acks.len() >= ACKED_BEFORE_KILL);

    // One writer's creates are sequential, so their revisions must already grow.
    let mut last_per_writer = HashMap::new();
    for a in &acks {
        let last = last_per_writer.insert(a.writer, a.rv).unwrap_or(0);
        assert!(a.rv > last, "writer {} got resourceVersion {} after {}", a.writer, a.rv, last);
    }
    let max_acked = acks.iter().map(|a| a.rv).max().unwrap();

    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    // A fresh client: the old one's pooled connections died with the server.
    let api: Api<ConfigMap> = Api::default_namespaced(server.client().await);

    let listed = api.list(&ListParams::default().labels("test=crash")).await.unwrap();
    let after: HashMap<String, i64> =
        listed.items.iter().map(|o| (o.metadata.name.clone().unwrap(), rv_of(o))).collect();
    let lost: Vec<&str> = acks.iter().filter(|a| !after.contains_key(&a.name)).map(|a| a.name.as_str()).collect();
    assert!(lost.is_empty(), "{} of {} acknowledged creates are gone after kill -9: {lost:?}", lost.len(), acks.len());
    for a in &acks {
        assert!(after[&a.name] >= a.rv, "{} went back from resourceVersion {} to {}", a.name, a.rv, after[&a.name]);
    }
    eprintln!(
        "{} creates acknowledged before kill -9, {} objects after restart (the rest committed without a 201)",
        acks.len(),
        after.len()
    );
    let list_rv: i64 = listed.metadata.resource_version.as_deref().unwrap().parse().unwrap();
    assert!(list_rv >= max_acked, "the list after restart is at revision {list_rv}, before {max_acked}");

    let first = api.create(&PostParams::default(), &cm("after-restart-1")).await.unwrap();
    assert!(rv_of(&first) > max_acked, "a create after restart got {} ≤ acknowledged {max_acked}", rv_of(&first));

    // A watch from the last acknowledged revision replays what followed it (including creates
    // that were committed but whose 201 was lost) and then delivers new events live. The cli
    // crate has no Stream combinators, so the watch runs with a server-side timeout and its
    // whole body is read once the server closes it.
    let watch = kube::core::Request::new("/api/v1/namespaces/default/configmaps")
        .watch(&WatchParams::default().labels("test=crash").timeout(3), &max_acked.to_string())
        .unwrap();
    let watcher = tokio::spawn({
        let client = api.clone().into_client();
        async move { client.request_text(watch).await }
    });
    // Let the watch reach its live phase, so the next create is delivered live, not replayed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = api.create(&PostParams::default(), &cm("after-restart-2")).await.unwrap();
    let body = tokio::time::timeout(Duration::from_secs(20), watcher)
        .await
        .expect("the watch did not end after its 3 s timeout")
        .unwrap()
        .expect("the watch after restart failed");

    let mut seen = Vec::new();
    let mut last_rv = max_acked;
    for line in body.lines().filter(|l| !l.trim().is_empty()) {
        let ev: WatchEvent<ConfigMap> =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad watch event {line:?}: {e}"));
        match ev {
            WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                let rv = rv_of(&obj);
                assert!(rv > last_rv, "the watch delivered resourceVersion {rv} after {last_rv}");
                last_rv = rv;
                seen.push(obj.metadata.name.unwrap());
            }
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected watch event {other:?}"),
        }
    }
    let seen_first = seen.iter().position(|n| n == "after-restart-1");
    let seen_second = seen.iter().position(|n| n == "after-restart-2");
    assert!(seen_first.is_some(), "the resumed watch missed after-restart-1: {seen:?}");
    assert!(seen_second > seen_first, "the resumed watch missed after-restart-2: {seen:?}");
    assert_eq!(last_rv, rv_of(&second));
}
