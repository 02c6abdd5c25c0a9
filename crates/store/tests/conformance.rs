//! The store conformance suite: one set of checks of the `Store` contract, run against both
//! backends (`sqlite::*` and `etcd::*`), plus SQLite-only durability checks.
//!
//! The etcd tests run a real etcd (`/usr/bin/etcd`) on free loopback ports. Tests that do not
//! compact share one etcd per test binary, each under its own key prefix; tests that compact
//! (a cluster-wide operation) get their own etcd.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use berth_store::etcd::{EtcdOptions, EtcdStore};
use berth_store::sqlite::SqliteStore;
use berth_store::{Event, EventKind, ListOptions, Revision, Store, StoreError, WatchItem, WatchStream};
use futures::StreamExt;

mod support {
    use std::io::Write;
    use std::net::TcpListener;
    use std::path::Path;
    use std::process::{Child, ChildStdin, Command, Stdio};
    use std::sync::{Arc, OnceLock};
    use std::time::{Duration, Instant};

    use super::*;

    pub const ETCD_BIN: &str = "/usr/bin/etcd";

    /// A store under test and whatever must outlive it (temp dir, etcd process).
    pub struct Harness {
        pub store: Arc<dyn Store>,
        _keep: Vec<Box<dyn std::any::Any + Send + Sync>>,
    }

    pub fn sqlite() -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("store.db")).expect("open sqlite store");
        Harness { store: Arc::new(store), _keep: vec![Box::new(dir)] }
    }

    /// A store on the etcd shared by this test binary, under a key prefix of its own.
    pub async fn etcd_shared(test: &str) -> Harness {
        static SHARED: OnceLock<Arc<EtcdServer>> = OnceLock::new();
        let server = SHARED.get_or_init(|| Arc::new(EtcdServer::start())).clone();
        let store = server.connect(&format!("/conformance/{test}")).await;
        Harness { store: Arc::new(store), _keep: vec![Box::new(server)] }
    }

    /// A store on an etcd of its own, for tests that compact.
    pub async fn etcd_own() -> Harness {
        let server = Arc::new(EtcdServer::start());
        let store = server.connect("").await;
        Harness { store: Arc::new(store), _keep: vec![Box::new(server)] }
    }

    fn free_port() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        l.local_addr().expect("local addr").port()
    }

    /// A single-member etcd in a temp dir. It runs under a shell that kills it as soon as its
    /// stdin closes, so it also goes away when this process dies without running `Drop`
    /// (the shared server lives in a static, which is never dropped).
    pub struct EtcdServer {
        endpoint: String,
        child: Child,
        stdin: Option<ChildStdin>,
        dir: tempfile::TempDir,
    }

    impl EtcdServer {
        pub fn start() -> Self {
            assert!(
                Path::new(ETCD_BIN).exists(),
                "the etcd conformance tests need a real etcd at {ETCD_BIN} \
                 (Debian: apt-get install etcd-server); it is missing"
            );
            let dir = tempfile::tempdir().expect("tempdir");
            let (client, peer) = (free_port(), free_port());
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log file");
            let mut child = Command::new("sh")
                .arg("-c")
                .arg(r#""$0" "$@" & pid=$!; read _ignored; kill $pid; wait $pid; rm -rf "$ETCD_TEST_DIR""#)
                .arg(ETCD_BIN)
                .args(["--name", "conformance", "--data-dir"])
                .arg(dir.path().join("data"))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("conformance={peer_url}")])
                .args(["--logger", "zap", "--log-level", "error"])
                .args(berth_testenv::etcd::PROGRESS_NOTIFY_ARGS)
                // The shared server's `TempDir` is never dropped; the shell removes it instead.
                .env("ETCD_TEST_DIR", dir.path())
                .stdin(Stdio::piped())
                .stdout(log.try_clone().expect("log file"))
                .stderr(log)
                .spawn()
                .expect("start etcd");
            let stdin = child.stdin.take();
            Self { endpoint: client_url, child, stdin, dir }
        }

        /// Connects once etcd answers (it needs about a second to elect itself).
        pub async fn connect(&self, key_prefix: &str) -> EtcdStore {
            let deadline = Instant::now() + Duration::from_secs(30);
            let options = EtcdOptions {
                key_prefix: key_prefix.to_owned(),
                request_timeout: Duration::from_secs(2),
                ..EtcdOptions::default()
            };
            loop {
                match EtcdStore::connect_with(std::slice::from_ref(&self.endpoint), options.clone()).await {
                    Ok(store) => return store,
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => {
                        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
                        panic!("etcd at {} never became ready: {e}\n{log}", self.endpoint);
                    }
                }
            }
        }
    }

    impl Drop for EtcdServer {
        fn drop(&mut self) {
            // EOF on the shell's stdin kills etcd; then reap the shell.
            if let Some(mut stdin) = self.stdin.take() {
                let _ = stdin.flush();
            }
            let _ = self.child.wait();
        }
    }
}

/// Declares each check once per backend: `sqlite::NAME` and `etcd::NAME`. Checks under
/// `own_etcd` compact, so their etcd run gets a fresh etcd.
macro_rules! conformance {
    (shared: [$($shared:ident),* $(,)?], own_etcd: [$($own:ident),* $(,)?] $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $shared() {
                    let h = crate::support::sqlite();
                    crate::$shared(h.store.as_ref()).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $own() {
                    let h = crate::support::sqlite();
                    crate::$own(h.store.as_ref()).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $shared() {
                    let h = crate::support::etcd_shared(stringify!($shared)).await;
                    crate::$shared(h.store.as_ref()).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $own() {
                    let h = crate::support::etcd_own().await;
                    crate::$own(h.store.as_ref()).await;
                }
            )*
        }
    };
}

conformance! {
    shared: [
        create_get_update_delete_round_trip,
        creating_an_existing_key_fails_with_already_exists,
        update_with_a_stale_revision_conflicts_and_carries_the_current_value,
        writes_to_a_missing_key_are_not_found,
        delete_with_a_stale_revision_conflicts_and_keeps_the_key,
        revisions_strictly_increase_and_are_never_reused,
        current_revision_is_the_latest_write,
        list_returns_keys_in_order_without_sibling_prefixes,
        pagination_returns_every_key_once_and_more_until_the_last_page,
        list_at_an_older_revision_returns_that_snapshot,
        pages_at_an_older_revision_skip_keys_created_since_and_keep_keys_deleted_since,
        list_at_a_future_revision_is_invalid,
        watch_replays_history_then_streams_live_events_with_prev_value,
        watch_only_sees_keys_under_its_prefix,
        watch_of_a_delete_carries_the_previous_value,
        watch_from_the_current_revision_sees_only_later_writes,
        concurrent_creates_get_distinct_revisions_and_a_watcher_sees_each_once_in_order,
        a_list_and_a_watch_replay_larger_than_four_megabytes_are_read_whole,
        a_watch_with_progress_of_a_quiet_prefix_learns_the_revisions_of_other_writes,
    ],
    own_etcd: [
        compacted_revision_is_gone_for_watchers_and_lists_but_current_data_survives,
        compaction_never_goes_backwards,
    ],
}

// ---------------------------------------------------------------------------------------------
// Helpers

const WAIT: Duration = Duration::from_secs(10);

async fn next_event(w: &mut WatchStream) -> Event {
    match tokio::time::timeout(WAIT, w.next()).await {
        Ok(Some(Ok(ev))) => ev,
        Ok(Some(Err(e))) => panic!("watch failed: {e:?}"),
        Ok(None) => panic!("watch ended"),
        Err(_) => panic!("no watch event within {WAIT:?}"),
    }
}

/// Asserts that nothing arrives on the watch for a short while.
async fn assert_quiet(w: &mut WatchStream) {
    if let Ok(item) = tokio::time::timeout(Duration::from_millis(300), w.next()).await {
        panic!("expected no event, got {item:?}");
    }
}

fn keys(items: &[berth_store::KeyValue]) -> Vec<&str> {
    items.iter().map(|kv| kv.key.as_str()).collect()
}

fn at(revision: Revision) -> ListOptions {
    ListOptions { revision: Some(revision), ..Default::default() }
}

// ---------------------------------------------------------------------------------------------
// Checks

async fn create_get_update_delete_round_trip(s: &dyn Store) {
    assert_eq!(s.get("/rt/k").await.expect("get"), None);

    let created = s.create("/rt/k", b"v1".to_vec()).await.expect("create");
    assert_eq!(created.key, "/rt/k");
    assert_eq!(created.value, b"v1");
    assert_eq!(created.create_revision, created.mod_revision);
    assert_eq!(s.get("/rt/k").await.expect("get"), Some(created.clone()));

    let updated = s.update("/rt/k", b"v2".to_vec(), created.mod_revision).await.expect("update");
    assert_eq!(updated.value, b"v2");
    assert_eq!(updated.create_revision, created.create_revision);
    assert!(updated.mod_revision > created.mod_revision);
    assert_eq!(s.get("/rt/k").await.expect("get"), Some(updated.clone()));

    let deleted = s.delete("/rt/k", Some(updated.mod_revision)).await.expect("delete");
    assert_eq!(deleted.prev, updated);
    assert!(deleted.revision > updated.mod_revision);
    assert_eq!(s.get("/rt/k").await.expect("get"), None);
}

async fn creating_an_existing_key_fails_with_already_exists(s: &dyn Store) {
    let first = s.create("/dup/k", b"one".to_vec()).await.expect("create");
    let err = s.create("/dup/k", b"two".to_vec()).await.expect_err("second create");
    assert!(matches!(&err, StoreError::AlreadyExists { key } if key == "/dup/k"), "{err:?}");
    assert_eq!(s.get("/dup/k").await.expect("get"), Some(first));
}

async fn update_with_a_stale_revision_conflicts_and_carries_the_current_value(s: &dyn Store) {
    let v1 = s.create("/cas/k", b"v1".to_vec()).await.expect("create");
    let v2 = s.update("/cas/k", b"v2".to_vec(), v1.mod_revision).await.expect("update");
    let err = s.update("/cas/k", b"v3".to_vec(), v1.mod_revision).await.expect_err("stale update");
    match err {
        StoreError::Conflict { key, current } => {
            assert_eq!(key, "/cas/k");
            assert_eq!(current, Some(v2.clone()));
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(s.get("/cas/k").await.expect("get"), Some(v2));
}

async fn writes_to_a_missing_key_are_not_found(s: &dyn Store) {
    let err = s.update("/missing/k", b"v".to_vec(), 1).await.expect_err("update");
    assert!(matches!(&err, StoreError::NotFound { key } if key == "/missing/k"), "{err:?}");
    let err = s.update("/missing/k", b"v".to_vec(), 0).await.expect_err("update at 0");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    let err = s.delete("/missing/k", None).await.expect_err("delete");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    let err = s.delete("/missing/k", Some(3)).await.expect_err("delete at revision");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert_eq!(s.get("/missing/k").await.expect("get"), None);
}

async fn delete_with_a_stale_revision_conflicts_and_keeps_the_key(s: &dyn Store) {
    let v1 = s.create("/del/k", b"v1".to_vec()).await.expect("create");
    let v2 = s.update("/del/k", b"v2".to_vec(), v1.mod_revision).await.expect("update");
    let err = s.delete("/del/k", Some(v1.mod_revision)).await.expect_err("stale delete");
    match err {
        StoreError::Conflict { current, .. } => assert_eq!(current, Some(v2.clone())),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(s.get("/del/k").await.expect("get"), Some(v2.clone()));
    let deleted = s.delete("/del/k", None).await.expect("unconditional delete");
    assert_eq!(deleted.prev, v2);
}

async fn revisions_strictly_increase_and_are_never_reused(s: &dyn Store) {
    let mut seen = Vec::new();
    let a = s.create("/rev/a", b"1".to_vec()).await.expect("create a");
    seen.push(a.mod_revision);
    let a2 = s.update("/rev/a", b"2".to_vec(), a.mod_revision).await.expect("update a");
    seen.push(a2.mod_revision);
    let d = s.delete("/rev/a", None).await.expect("delete a");
    seen.push(d.revision);
    // Recreating a deleted key must not reuse its old revisions.
    let a3 = s.create("/rev/a", b"3".to_vec()).await.expect("recreate a");
    seen.push(a3.mod_revision);
    assert_eq!(a3.create_revision, a3.mod_revision);
    let b = s.create("/rev/b", b"1".to_vec()).await.expect("create b");
    seen.push(b.mod_revision);
    // A failed write consumes no revision visible as a write, but the next one still grows.
    let _ = s.create("/rev/b", b"again".to_vec()).await.expect_err("dup");
    let c = s.create("/rev/c", b"1".to_vec()).await.expect("create c");
    seen.push(c.mod_revision);
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "revisions not increasing: {seen:?}");
}

async fn current_revision_is_the_latest_write(s: &dyn Store) {
    let before = s.current_revision().await.expect("rev");
    let kv = s.create("/cur/k", b"v".to_vec()).await.expect("create");
    assert!(kv.mod_revision > before);
    let after = s.current_revision().await.expect("rev");
    assert!(after >= kv.mod_revision, "current {after} < write {}", kv.mod_revision);
    let list = s.list("/cur/", &ListOptions::default()).await.expect("list");
    assert!(list.revision >= kv.mod_revision);
}

async fn list_returns_keys_in_order_without_sibling_prefixes(s: &dyn Store) {
    for k in ["/a/b/3", "/a/b/1", "/a/bc/1", "/a/b", "/a/b/2", "/a/a/1", "/a/b/10"] {
        s.create(k, k.as_bytes().to_vec()).await.expect("create");
    }
    let list = s.list("/a/b/", &ListOptions::default()).await.expect("list");
    assert_eq!(keys(&list.items), ["/a/b/1", "/a/b/10", "/a/b/2", "/a/b/3"]);
    assert!(!list.more);
    assert!(list.items.iter().all(|kv| kv.value == kv.key.as_bytes()));
    let all = s.list("/a/", &ListOptions::default()).await.expect("list all");
    assert_eq!(all.items.len(), 7);
    assert!(keys(&all.items).windows(2).all(|w| w[0] < w[1]));
    let none = s.list("/a/zz/", &ListOptions::default()).await.expect("list empty");
    assert!(none.items.is_empty() && !none.more);
}

async fn pagination_returns_every_key_once_and_more_until_the_last_page(s: &dyn Store) {
    let expected: Vec<String> = (0..23).map(|i| format!("/page/items/{i:03}")).collect();
    for k in &expected {
        s.create(k, b"x".to_vec()).await.expect("create");
    }
    s.create("/page/itemsx", b"outside".to_vec()).await.expect("create sibling");
    let first = s.list("/page/items/", &ListOptions::default()).await.expect("snapshot");
    let mut got = Vec::new();
    let mut start_key = None;
    let mut pages = 0;
    loop {
        let opts = ListOptions {
            // All pages read the first page's snapshot, as a paginated Kubernetes list does.
            revision: Some(first.revision),
            start_key: start_key.clone(),
            limit: Some(5),
        };
        let page = s.list("/page/items/", &opts).await.expect("page");
        pages += 1;
        assert_eq!(page.revision, first.revision);
        assert!(page.items.len() <= 5);
        got.extend(page.items.iter().map(|kv| kv.key.clone()));
        if !page.more {
            break;
        }
        assert_eq!(page.items.len(), 5, "a page with more must be full");
        let last = page.items.last().expect("non-empty page").key.clone();
        start_key = Some(format!("{last}\0"));
        assert!(pages < 10, "pagination does not end");
    }
    assert_eq!(pages, 5);
    assert_eq!(got, expected);
    // A limit that exactly fits reports no more.
    let exact = ListOptions { limit: Some(23), ..Default::default() };
    let page = s.list("/page/items/", &exact).await.expect("exact page");
    assert_eq!(page.items.len(), 23);
    assert!(!page.more);
}

async fn list_at_an_older_revision_returns_that_snapshot(s: &dyn Store) {
    let a = s.create("/snap/a", b"a1".to_vec()).await.expect("a");
    let b = s.create("/snap/b", b"b1".to_vec()).await.expect("b");
    let c = s.create("/snap/c", b"c1".to_vec()).await.expect("c");
    let old = s.list("/snap/", &ListOptions::default()).await.expect("list");
    assert!(old.revision >= c.mod_revision);

    // After the snapshot: update a, delete b, create d, delete and recreate c.
    s.update("/snap/a", b"a2".to_vec(), a.mod_revision).await.expect("update a");
    s.delete("/snap/b", None).await.expect("delete b");
    s.create("/snap/d", b"d1".to_vec()).await.expect("create d");
    s.delete("/snap/c", None).await.expect("delete c");
    s.create("/snap/c", b"c2".to_vec()).await.expect("recreate c");

    let then = s.list("/snap/", &at(old.revision)).await.expect("list at old revision");
    assert_eq!(then.revision, old.revision);
    assert_eq!(then.items, vec![a.clone(), b.clone(), c.clone()]);
    assert_eq!(then.items, old.items);

    // Paginated at the old revision too.
    let page = ListOptions { revision: Some(old.revision), limit: Some(2), start_key: None };
    let p1 = s.list("/snap/", &page).await.expect("page 1");
    assert_eq!(p1.items, vec![a.clone(), b.clone()]);
    assert!(p1.more);
    let page2 = ListOptions { start_key: Some("/snap/b\0".into()), ..page };
    let p2 = s.list("/snap/", &page2).await.expect("page 2");
    assert_eq!(p2.items, vec![c]);
    assert!(!p2.more);

    let now = s.list("/snap/", &ListOptions::default()).await.expect("list now");
    assert_eq!(keys(&now.items), ["/snap/a", "/snap/c", "/snap/d"]);
    assert_eq!(now.items[0].value, b"a2");
    assert_eq!(now.items[1].value, b"c2");
    // Between: right after b's creation only a and b existed.
    let mid = s.list("/snap/", &at(b.mod_revision)).await.expect("list at b");
    assert_eq!(mid.items, vec![a, b]);
}

async fn pages_at_an_older_revision_skip_keys_created_since_and_keep_keys_deleted_since(s: &dyn Store) {
    let mut then = Vec::new();
    for i in 0..30 {
        then.push(s.create(&format!("/churn/k{i:02}"), vec![i]).await.expect("create"));
    }
    let snapshot = s.list("/churn/", &ListOptions::default()).await.expect("snapshot");
    // After it: three new keys around every old one, every third old key deleted, every fifth
    // updated, so that most pages' worth of current keys hold fewer snapshot keys.
    for (i, kv) in then.iter().enumerate() {
        for suffix in ["a", "b", "c"] {
            s.create(&format!("/churn/k{i:02}{suffix}"), b"new".to_vec()).await.expect("create since");
        }
        if i % 3 == 0 {
            s.delete(&kv.key, None).await.expect("delete since");
        } else if i % 5 == 0 {
            s.update(&kv.key, b"changed".to_vec(), kv.mod_revision).await.expect("update since");
        }
    }
    let mut got = Vec::new();
    let mut start_key = None;
    loop {
        let opts = ListOptions { revision: Some(snapshot.revision), start_key: start_key.clone(), limit: Some(4) };
        let page = s.list("/churn/", &opts).await.expect("page");
        got.extend(page.items.iter().cloned());
        if !page.more {
            break;
        }
        assert_eq!(page.items.len(), 4, "a page with more must be full");
        start_key = Some(format!("{}\0", page.items.last().expect("a full page").key));
        assert!(got.len() <= then.len(), "pagination does not end");
    }
    assert_eq!(got, then, "every key of the snapshot once, as it was");
}

async fn list_at_a_future_revision_is_invalid(s: &dyn Store) {
    s.create("/future/k", b"v".to_vec()).await.expect("create");
    let current = s.current_revision().await.expect("rev");
    let err = s.list("/future/", &at(current + 1000)).await.expect_err("future list");
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
}

async fn watch_replays_history_then_streams_live_events_with_prev_value(s: &dyn Store) {
    let start = s.current_revision().await.expect("rev");
    let k1 = s.create("/w/k1", b"a".to_vec()).await.expect("create");
    let k1b = s.update("/w/k1", b"b".to_vec(), k1.mod_revision).await.expect("update");

    let mut w = s.watch("/w/", start).await.expect("watch");
    // Replayed history.
    let e1 = next_event(&mut w).await;
    assert_eq!(
        e1,
        Event {
            kind: EventKind::Put,
            key: "/w/k1".into(),
            revision: k1.mod_revision,
            create_revision: k1.create_revision,
            value: Some(b"a".to_vec()),
            prev_value: None,
        }
    );
    let e2 = next_event(&mut w).await;
    assert_eq!(e2.revision, k1b.mod_revision);
    assert_eq!(e2.value.as_deref(), Some(&b"b"[..]));
    assert_eq!(e2.prev_value.as_deref(), Some(&b"a"[..]));
    assert_eq!(e2.create_revision, k1.create_revision);

    // Live events.
    let k1c = s.update("/w/k1", b"c".to_vec(), k1b.mod_revision).await.expect("update");
    let k2 = s.create("/w/k2", b"x".to_vec()).await.expect("create");
    let e3 = next_event(&mut w).await;
    assert_eq!((e3.kind, e3.revision), (EventKind::Put, k1c.mod_revision));
    assert_eq!(e3.prev_value.as_deref(), Some(&b"b"[..]));
    let e4 = next_event(&mut w).await;
    assert_eq!((e4.key.as_str(), e4.revision), ("/w/k2", k2.mod_revision));
    assert_eq!(e4.prev_value, None);
    assert_quiet(&mut w).await;

    // A watch from the middle of history starts right after that revision.
    let mut mid = s.watch("/w/", k1b.mod_revision).await.expect("watch from middle");
    assert_eq!(next_event(&mut mid).await.revision, k1c.mod_revision);
    assert_eq!(next_event(&mut mid).await.revision, k2.mod_revision);
}

async fn watch_only_sees_keys_under_its_prefix(s: &dyn Store) {
    let start = s.current_revision().await.expect("rev");
    s.create("/p/ab/1", b"in".to_vec()).await.expect("history in");
    s.create("/p/abc/1", b"out".to_vec()).await.expect("history out");
    let mut w = s.watch("/p/ab/", start).await.expect("watch");
    s.create("/p/abc/2", b"out".to_vec()).await.expect("live out");
    s.create("/p/a", b"out".to_vec()).await.expect("live out");
    s.create("/p/ab/2", b"in".to_vec()).await.expect("live in");
    let got = [next_event(&mut w).await, next_event(&mut w).await];
    assert_eq!(got.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["/p/ab/1", "/p/ab/2"]);
    assert_quiet(&mut w).await;
}

async fn a_watch_with_progress_of_a_quiet_prefix_learns_the_revisions_of_other_writes(s: &dyn Store) {
    let start = s.current_revision().await.expect("rev");
    let mut w = s.watch_with_progress("/quiet/", start).await.expect("watch");
    let own = s.create("/quiet/1", b"in".to_vec()).await.expect("own write");
    let other = s.create("/busy/1", b"out".to_vec()).await.expect("other write");
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut events = Vec::new();
    loop {
        let item = tokio::time::timeout_at(deadline, w.next()).await;
        match item {
            Ok(Some(Ok(WatchItem::Event(ev)))) => events.push((ev.key, ev.revision)),
            Ok(Some(Ok(WatchItem::Progress(rev)))) if rev >= other.mod_revision => break,
            Ok(Some(Ok(WatchItem::Progress(rev)))) => assert!(rev >= start, "progress {rev} went back before {start}"),
            Ok(Some(Err(e))) => panic!("watch failed: {e:?}"),
            Ok(None) => panic!("watch ended"),
            Err(_) => panic!("no progress up to {} within {WAIT:?}", other.mod_revision),
        }
    }
    assert_eq!(
        events,
        [("/quiet/1".to_string(), own.mod_revision)],
        "the prefix's event comes before the progress past it"
    );
}

async fn watch_of_a_delete_carries_the_previous_value(s: &dyn Store) {
    let kv = s.create("/wd/k", b"v1".to_vec()).await.expect("create");
    let kv = s.update("/wd/k", b"v2".to_vec(), kv.mod_revision).await.expect("update");
    let mut w = s.watch("/wd/", kv.mod_revision).await.expect("watch");
    let deleted = s.delete("/wd/k", None).await.expect("delete");
    let ev = next_event(&mut w).await;
    assert_eq!(
        ev,
        Event {
            kind: EventKind::Delete,
            key: "/wd/k".into(),
            revision: deleted.revision,
            create_revision: kv.create_revision,
            value: None,
            prev_value: Some(b"v2".to_vec()),
        }
    );
    // And replayed from history, the same.
    let mut replay = s.watch("/wd/", kv.mod_revision).await.expect("watch again");
    assert_eq!(next_event(&mut replay).await, ev);
}

async fn watch_from_the_current_revision_sees_only_later_writes(s: &dyn Store) {
    s.create("/wn/old", b"v".to_vec()).await.expect("create");
    let now = s.current_revision().await.expect("rev");
    let mut w = s.watch("/wn/", now).await.expect("watch");
    assert_quiet(&mut w).await;
    let kv = s.create("/wn/new", b"v".to_vec()).await.expect("create");
    let ev = next_event(&mut w).await;
    assert_eq!((ev.key.as_str(), ev.revision), ("/wn/new", kv.mod_revision));
}

async fn concurrent_creates_get_distinct_revisions_and_a_watcher_sees_each_once_in_order(s: &dyn Store) {
    const TASKS: usize = 16;
    const PER_TASK: usize = 25;
    let start = s.current_revision().await.expect("rev");
    let mut w = s.watch("/conc/", start).await.expect("watch");

    let results = futures::future::join_all((0..TASKS).map(|t| async move {
        let mut revs = Vec::new();
        for i in 0..PER_TASK {
            let kv = s.create(&format!("/conc/{t:02}/{i:03}"), vec![t as u8]).await;
            revs.push(kv.expect("concurrent create").mod_revision);
        }
        revs
    }))
    .await;
    let mut all: Vec<Revision> = results.into_iter().flatten().collect();
    let total = TASKS * PER_TASK;
    assert_eq!(all.len(), total);
    let distinct: HashSet<_> = all.iter().copied().collect();
    assert_eq!(distinct.len(), total, "revisions are not distinct");
    all.sort_unstable();

    let mut seen = Vec::with_capacity(total);
    let mut keys = HashSet::new();
    while seen.len() < total {
        let ev = next_event(&mut w).await;
        assert!(keys.insert(ev.key.clone()), "{} seen twice", ev.key);
        seen.push(ev.revision);
    }
    assert!(seen.windows(2).all(|p| p[0] < p[1]), "watch out of order");
    assert_eq!(seen, all);
    assert_quiet(&mut w).await;
    let list = s.list("/conc/", &ListOptions::default()).await.expect("list");
    assert_eq!(list.items.len(), total);
}

/// gRPC's default limit on a received message is 4 MiB; a cluster's lists are larger.
async fn a_list_and_a_watch_replay_larger_than_four_megabytes_are_read_whole(s: &dyn Store) {
    let start = s.current_revision().await.unwrap();
    let value = vec![b'x'; 256 * 1024];
    for i in 0..24 {
        s.create(&format!("/big/{i:02}"), value.clone()).await.unwrap();
    }
    let listed = s.list("/big/", &ListOptions::default()).await.unwrap();
    assert_eq!(listed.items.len(), 24);
    assert!(listed.items.iter().all(|kv| kv.value.len() == value.len()));
    let mut w = s.watch("/big/", start).await.unwrap();
    for i in 0..24 {
        let ev = next_event(&mut w).await;
        assert_eq!(ev.key, format!("/big/{i:02}"));
    }
}

async fn compacted_revision_is_gone_for_watchers_and_lists_but_current_data_survives(s: &dyn Store) {
    let a = s.create("/cmp/a", b"a1".to_vec()).await.expect("a");
    let a2 = s.update("/cmp/a", b"a2".to_vec(), a.mod_revision).await.expect("update a");
    let b = s.create("/cmp/b", b"b1".to_vec()).await.expect("b");
    let gone = s.create("/cmp/gone", b"g".to_vec()).await.expect("gone");
    s.delete("/cmp/gone", None).await.expect("delete gone");
    let c = s.create("/cmp/c", b"c1".to_vec()).await.expect("c");

    s.compact(b.mod_revision).await.expect("compact");
    assert_eq!(s.compacted_revision().await.expect("compacted"), b.mod_revision);

    let err = s.watch("/cmp/", a.mod_revision).await.err().expect("watch before compaction");
    assert!(matches!(err, StoreError::Compacted { compacted, .. } if compacted == b.mod_revision), "{err:?}");
    let err = s.watch("/cmp/", b.mod_revision - 1).await.err().expect("watch just before");
    assert!(matches!(err, StoreError::Compacted { .. }), "{err:?}");
    assert!(s.is_compacted(b.mod_revision - 1).await.unwrap());
    assert!(!s.is_compacted(b.mod_revision).await.unwrap());
    assert!(!s.is_compacted(c.mod_revision).await.unwrap());
    let err = s.list("/cmp/", &at(a2.mod_revision)).await.expect_err("list before compaction");
    assert!(
        matches!(err, StoreError::Compacted { requested, compacted }
            if requested == a2.mod_revision && compacted == b.mod_revision),
        "{err:?}"
    );

    // History after the compacted revision is still there.
    let mut w = s.watch("/cmp/", b.mod_revision).await.expect("watch at compacted revision");
    let ev = next_event(&mut w).await;
    assert_eq!((ev.key.as_str(), ev.revision), ("/cmp/gone", gone.mod_revision));
    let at_b = s.list("/cmp/", &at(b.mod_revision)).await.expect("list at compacted revision");
    assert_eq!(at_b.items, vec![a2.clone(), b.clone()]);

    // Current values survive, including ones last written before the compaction.
    let now = s.list("/cmp/", &ListOptions::default()).await.expect("list now");
    assert_eq!(now.items, vec![a2.clone(), b.clone(), c]);
    assert_eq!(s.get("/cmp/a").await.expect("get"), Some(a2.clone()));
    let a3 = s.update("/cmp/a", b"a3".to_vec(), a2.mod_revision).await.expect("update after");
    assert!(a3.mod_revision > now.revision);
}

async fn compaction_never_goes_backwards(s: &dyn Store) {
    let mut last = None;
    for i in 0..6 {
        last = Some(s.create(&format!("/cb/{i}"), b"v".to_vec()).await.expect("create"));
    }
    let last = last.expect("wrote something");
    s.compact(last.mod_revision - 2).await.expect("compact");
    // An older compaction request is a no-op, not an error, and does not move it back.
    s.compact(last.mod_revision - 4).await.expect("older compact");
    assert_eq!(s.compacted_revision().await.expect("compacted"), last.mod_revision - 2);
    let err = s.compact(last.mod_revision + 100).await.expect_err("future compaction");
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
    assert_eq!(s.compacted_revision().await.expect("compacted"), last.mod_revision - 2);
}

// ---------------------------------------------------------------------------------------------
// SQLite only: durability

mod sqlite_durability {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    use super::*;

    #[tokio::test]
    async fn writes_and_revisions_survive_reopening_the_database() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.db");
        let (kept, last) = {
            let s = SqliteStore::open(&path).expect("open");
            let kept = s.create("/d/kept", b"v".to_vec()).await.expect("create");
            let gone = s.create("/d/gone", b"v".to_vec()).await.expect("create");
            let del = s.delete("/d/gone", Some(gone.mod_revision)).await.expect("delete");
            s.compact(kept.mod_revision).await.expect("compact");
            (kept, del.revision)
        };
        let s = SqliteStore::open(&path).expect("reopen");
        assert_eq!(s.current_revision().await.expect("rev"), last);
        assert_eq!(s.compacted_revision().await.expect("compacted"), kept.mod_revision);
        assert_eq!(s.get("/d/kept").await.expect("get"), Some(kept.clone()));
        assert_eq!(s.get("/d/gone").await.expect("get"), None);
        // The revision of the last write (a delete) is not handed out again.
        let next = s.create("/d/new", b"v".to_vec()).await.expect("create after reopen");
        assert_eq!(next.mod_revision, last + 1);
        // History after the compaction was kept, too.
        let mut w = s.watch("/d/", kept.mod_revision).await.expect("watch");
        assert_eq!(next_event(&mut w).await.key, "/d/gone");
    }

    const CRASH_DIR_ENV: &str = "BERTH_STORE_CRASH_DIR";

    /// Writer half of the crash test, run in a child process: writes from 8 tasks and prints
    /// each acknowledged write until it is killed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "child process of acknowledged_writes_survive_kill_9"]
    async fn crash_child_writes_until_killed() {
        let dir = std::env::var(CRASH_DIR_ENV).expect("run by the crash test only");
        let s = Arc::new(SqliteStore::open(&std::path::Path::new(&dir).join("store.db")).expect("open"));
        let tasks = (0..8).map(|t| {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..100_000 {
                    let key = format!("/crash/{t}/{i}");
                    let kv = s.create(&key, vec![0; 64]).await.expect("create");
                    println!("acked {key} {}", kv.mod_revision);
                }
            })
        });
        futures::future::join_all(tasks).await;
    }

    #[tokio::test]
    async fn acknowledged_writes_survive_kill_9() {
        let dir = tempfile::tempdir().expect("tempdir");
        let exe = std::env::current_exe().expect("test binary");
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "sqlite_durability::crash_child_writes_until_killed",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_DIR_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = std::io::BufReader::new(stdout).lines();
        let mut acked = Vec::new();
        while acked.len() < 300 {
            let line = lines.next().expect("child output ended early").expect("read");
            if let Some(rest) = line.strip_prefix("acked ") {
                acked.push(rest.to_owned());
            }
        }
        child.kill().expect("kill -9"); // SIGKILL on Unix
        let _ = child.wait();
        // Acks printed before the kill but not yet read count too.
        for line in lines.map_while(|l| l.ok()) {
            if let Some(rest) = line.strip_prefix("acked ") {
                acked.push(rest.to_owned());
            }
        }

        let s = SqliteStore::open(&dir.path().join("store.db")).expect("reopen after crash");
        let mut max_rev = 0;
        for ack in &acked {
            let (key, rev) = ack.split_once(' ').expect("ack format");
            let rev: Revision = rev.parse().expect("revision");
            let kv = s.get(key).await.expect("get").unwrap_or_else(|| panic!("{key} lost"));
            assert_eq!(kv.mod_revision, rev);
            max_rev = max_rev.max(rev);
        }
        assert!(s.current_revision().await.expect("rev") >= max_rev);
        let next = s.create("/after/crash", b"v".to_vec()).await.expect("create");
        assert!(next.mod_revision > max_rev);
    }
}

// ---------------------------------------------------------------------------------------------
// etcd only: connectivity

mod etcd_connectivity {
    use std::net::TcpListener;
    use std::time::Instant;

    use super::*;

    #[tokio::test]
    async fn connecting_to_an_etcd_that_is_not_there_is_unavailable() {
        // A port that was free a moment ago: nothing listens on it.
        let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let options = EtcdOptions {
            key_prefix: String::new(),
            request_timeout: Duration::from_secs(1),
            failover_timeout: Duration::from_secs(1),
        };
        let started = Instant::now();
        let res = EtcdStore::connect_with(&[format!("http://127.0.0.1:{port}")], options).await;
        assert!(matches!(res, Err(StoreError::Unavailable(_))), "{:?}", res.err());
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    }
}
