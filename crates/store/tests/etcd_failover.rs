//! The etcd backend on a 3-member cluster: requests keep succeeding and watches lose and repeat
//! nothing while members, the leader among them, are killed and restarted; without a quorum,
//! requests fail within seconds with etcd's reason, and succeed again once it is back.
//!
//! Needs etcd (Debian: etcd-server; scripts/install-deps.sh installs it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use berth_store::etcd::EtcdStore;
use berth_store::{EventKind, ListOptions, Store, StoreError, WatchItem};
use berth_testenv::EtcdCluster;
use futures::StreamExt;

/// Writes keys until told to stop: create, update, delete of each, every request checked.
async fn write_until(store: Arc<EtcdStore>, stop: Arc<AtomicBool>) -> (usize, Vec<String>) {
    let (mut writes, mut failures) = (0, Vec::new());
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let key = format!("/k/{i:06}");
        let created = match store.create(&key, format!("v1-{i}").into_bytes()).await {
            Ok(kv) => kv,
            Err(e) => {
                failures.push(format!("create {key}: {e:?}"));
                continue;
            }
        };
        let updated = match store.update(&key, format!("v2-{i}").into_bytes(), created.mod_revision).await {
            Ok(kv) => kv,
            Err(e) => {
                failures.push(format!("update {key}: {e:?}"));
                continue;
            }
        };
        if let Err(e) = store.get(&key).await {
            failures.push(format!("get {key}: {e:?}"));
        }
        if i % 2 == 0
            && let Err(e) = store.delete(&key, Some(updated.mod_revision)).await
        {
            failures.push(format!("delete {key}: {e:?}"));
        }
        writes += 1;
    }
    (writes, failures)
}

/// etcd sends a watch that starts far back its history 1,000 revisions per round, ten rounds a
/// second: a watch with progress 15,000 revisions behind is still catching up when it would first
/// ask for progress. Older etcd releases answer such a request at once with their current
/// revision, and a watch that believed them would skip every event still to come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_with_progress_catching_up_on_a_long_history_loses_no_event() {
    const WRITES: usize = 15_000;
    let etcd = tokio::task::spawn_blocking(|| EtcdCluster::start(1)).await.unwrap();
    let store = Arc::new(EtcdStore::connect(&etcd.endpoints()).await.expect("connect"));
    let start = store.current_revision().await.unwrap();
    let writers: Vec<_> = (0..32)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in (w..WRITES).step_by(32) {
                    store.create(&format!("/long/{i:06}"), b"v".to_vec()).await.expect("create");
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let end = store.current_revision().await.unwrap();
    let mut watch = store.watch_with_progress("/long/", start).await.unwrap();
    let mut last = start;
    let mut events = 0;
    while last < end {
        let item = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .unwrap_or_else(|_| panic!("no event after {last} within 10 s ({events} of {WRITES} seen)"))
            .expect("the watch goes on")
            .expect("no watch error");
        match item {
            WatchItem::Event(ev) => {
                assert_eq!(ev.revision, last + 1, "the event after {last}");
                last = ev.revision;
                events += 1;
            }
            WatchItem::Progress(rev) => assert!(rev <= last, "progress {rev} reported before the event after {last}"),
        }
    }
    assert_eq!(events, WRITES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_a_watch_go_on_without_a_failure_or_a_lost_event_while_members_and_the_leader_die() {
    let mut etcd = tokio::task::spawn_blocking(|| EtcdCluster::start(3)).await.unwrap();
    let store = Arc::new(EtcdStore::connect(&etcd.endpoints()).await.expect("connect"));
    let start = store.current_revision().await.unwrap();
    let mut watch = store.watch("/k/", start).await.unwrap();
    // A watch with progress, as the API server's fan-out opens: asking a member that has just
    // taken the watch over for progress must not make it skip the events it still owes.
    let mut with_progress = store.watch_with_progress("/k/", start).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write_until(store.clone(), stop.clone()));

    // The store starts on the first member: kill it, then whichever member leads.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut etcd = tokio::task::spawn_blocking(move || {
        etcd.kill(0);
        std::thread::sleep(Duration::from_secs(3));
        etcd.restart(0);
        std::thread::sleep(Duration::from_secs(2));
        let leader = etcd.wait_for_leader(Duration::from_secs(10)).expect("a leader");
        etcd.kill(leader);
        std::thread::sleep(Duration::from_secs(4));
        etcd.restart(leader);
        etcd
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let (writes, failures) = writer.await.unwrap();
    assert!(failures.is_empty(), "{} of {writes} rounds failed: {failures:#?}", failures.len());
    assert!(writes > 20, "only {writes} rounds of writes");

    // Every write once, in order: 2 or 3 events per key.
    let end = store.current_revision().await.unwrap();
    let mut last = start;
    let mut per_key = std::collections::BTreeMap::<String, Vec<EventKind>>::new();
    let mut revisions = Vec::new();
    while last < end {
        let ev = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("the watch delivers every event")
            .expect("the watch goes on")
            .expect("no watch error");
        assert!(ev.revision > last, "event at {} after {last}", ev.revision);
        last = ev.revision;
        revisions.push(ev.revision);
        per_key.entry(ev.key).or_default().push(ev.kind);
    }
    let mut seen_with_progress = Vec::new();
    while seen_with_progress.len() < revisions.len() {
        let item = tokio::time::timeout(Duration::from_secs(10), with_progress.next())
            .await
            .expect("the watch with progress delivers every event")
            .expect("the watch with progress goes on")
            .expect("no watch error");
        let next = revisions[seen_with_progress.len()];
        match item {
            WatchItem::Event(ev) => seen_with_progress.push(ev.revision),
            WatchItem::Progress(rev) => assert!(rev < next, "progress {rev} reported before the event at {next}"),
        }
    }
    assert_eq!(seen_with_progress, revisions, "the watch with progress sees the same events");
    let listed = store.list("/k/", &ListOptions::default()).await.unwrap();
    for (n, (key, kinds)) in per_key.iter().enumerate() {
        let deleted = listed.items.iter().all(|kv| kv.key != *key);
        let want: &[EventKind] = if deleted {
            &[EventKind::Put, EventKind::Put, EventKind::Delete]
        } else {
            &[EventKind::Put, EventKind::Put]
        };
        // The last key may have been written only in part when the writer stopped.
        if n + 1 < per_key.len() {
            assert_eq!(kinds, want, "events of {key}");
        }
    }

    // Without a quorum: a clear error within seconds, for reads, writes and lists alike.
    let leader = tokio::task::spawn_blocking(move || {
        let leader = etcd.wait_for_leader(Duration::from_secs(10)).expect("a leader");
        let others: Vec<usize> = (0..3).filter(|m| *m != leader).collect();
        etcd.kill(others[0]);
        etcd.kill(others[1]);
        (etcd, others)
    })
    .await
    .unwrap();
    let (mut etcd, others) = leader;
    for (what, result) in [
        ("get", store.get("/k/000001").await.map(|_| ())),
        ("create", store.create("/k/none", b"x".to_vec()).await.map(|_| ())),
        ("list", store.list("/k/", &ListOptions::default()).await.map(|_| ())),
    ] {
        let started = Instant::now();
        let message = match result {
            Err(StoreError::Unavailable(e)) => e.to_string(),
            other => panic!("{what} without quorum: {other:?}"),
        };
        eprintln!("{what} without quorum: {message} ({:?})", started.elapsed());
        assert!(message.contains("etcd"), "{what}: {message}");
    }
    let started = Instant::now();
    let err = store.current_revision().await.unwrap_err();
    let took = started.elapsed();
    eprintln!("without quorum, a read failed after {took:?}: {err:?}");
    assert!(format!("{err:?}").contains("no leader"), "{err:?}");

    // The quorum back: the same store serves again.
    etcd = tokio::task::spawn_blocking(move || {
        etcd.restart_no_wait(others[0]);
        etcd.restart(others[1]);
        etcd
    })
    .await
    .unwrap();
    let back = Instant::now();
    loop {
        match store.create("/k/after", b"x".to_vec()).await {
            Ok(_) => break,
            Err(e) => assert!(back.elapsed() < Duration::from_secs(30), "still failing: {e:?}"),
        }
    }
    eprintln!("serving again {:?} after the quorum came back", back.elapsed());
    drop(etcd);
}
